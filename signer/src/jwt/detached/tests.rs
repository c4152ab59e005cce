//! The detached JWKS signature: what podca signs verifies for every CA key algorithm (with
//! podca's verifier, and with the `openssl` CLI where it knows the algorithm); each refusal
//! trips only its own rule; a JWKS with one key added does not verify.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::Arc;

use time::macros::datetime;

use super::*;
use crate::backend::MemoryKey;

const JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"a","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0","use":"sig","alg":"ES256"}]}"#;

fn now() -> OffsetDateTime {
    datetime!(2026-06-01 12:00 UTC)
}

fn key(algorithm: CaAlgorithm) -> Arc<dyn CaKey> {
    Arc::new(MemoryKey::generate(algorithm).unwrap())
}

/// A root and an issuing intermediate, both with `algorithm` keys.
fn ca(algorithm: CaAlgorithm) -> (IssuingCa, IssuingCa) {
    let root = IssuingCa::self_signed_root(
        key(algorithm),
        "root",
        now() - time::Duration::days(1),
        time::Duration::days(365),
    )
    .unwrap();
    let issuing = root
        .sign_intermediate(
            key(algorithm),
            "issuing",
            now() - time::Duration::days(1),
            time::Duration::days(30),
        )
        .unwrap();
    (root, issuing)
}

fn anchors(root: &IssuingCa) -> Vec<CaCertificate> {
    root.roots().to_vec()
}

/// A JWS over `payload` with `header` (any JSON) signed by `key`, ES signatures as `r || s`.
fn signed_header(key: &dyn CaKey, header: &serde_json::Value, payload: &[u8]) -> String {
    let header = URL_SAFE_NO_PAD.encode(serde_json::to_vec(header).unwrap());
    let sig = key
        .sign(signing_input(&header, payload).as_bytes())
        .unwrap();
    let sig = match JwsAlgorithm::for_key(key.algorithm()).ecdsa_scalar_len() {
        Some(len) => ecdsa_der_to_fixed(&sig, len).unwrap(),
        None => sig,
    };
    format!("{header}..{}", URL_SAFE_NO_PAD.encode(sig))
}

fn header_of(jws: &str) -> serde_json::Value {
    let b64 = jws.split('.').next().unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(b64).unwrap()).unwrap()
}

#[test]
fn what_podca_signs_verifies_under_the_root_for_every_ca_algorithm() {
    for algorithm in CaAlgorithm::ALL {
        let (root, issuing) = ca(algorithm);
        let jws = sign(&issuing, JWKS.as_bytes(), now()).unwrap();
        let header = header_of(&jws);
        assert_eq!(header["alg"], JwsAlgorithm::for_key(algorithm).name());
        assert_eq!(header["typ"], JWS_TYPE);
        assert_eq!(header["cty"], PAYLOAD_TYPE);
        assert_eq!(header["iat"], now().unix_timestamp());
        // The issuing certificate only: the root is the relying party's, not the JWS's.
        assert_eq!(
            header["x5c"],
            serde_json::json!([STANDARD.encode(issuing.certificate().der())]),
            "{algorithm:?}"
        );
        let verified = verify(&jws, JWKS.as_bytes(), &anchors(&root), now()).unwrap();
        assert_eq!(verified.alg, JwsAlgorithm::for_key(algorithm));
        assert_eq!(verified.issued_at, now());
        assert_eq!(&verified.signer, issuing.certificate());
    }
}

#[test]
fn the_names_of_the_algorithms_round_trip() {
    for alg in JwsAlgorithm::ALL {
        assert_eq!(JwsAlgorithm::from_name(alg.name()), Ok(alg));
        assert_eq!(JwsAlgorithm::for_key(alg.key_algorithm()), alg);
    }
    assert_eq!(JwsAlgorithm::MlDsa65.name(), "ML-DSA-65");
    assert_eq!(JwsAlgorithm::EdDSA.name(), "EdDSA");
}

#[test]
fn a_self_signed_issuing_root_is_its_own_x5c() {
    let root = IssuingCa::self_signed_root(
        key(CaAlgorithm::EcdsaP256),
        "root",
        now() - time::Duration::days(1),
        time::Duration::days(365),
    )
    .unwrap();
    let jws = sign(&root, JWKS.as_bytes(), now()).unwrap();
    assert_eq!(header_of(&jws)["x5c"].as_array().unwrap().len(), 1);
    verify(&jws, JWKS.as_bytes(), &anchors(&root), now()).unwrap();
}

#[test]
fn a_jwks_with_one_key_added_does_not_verify() {
    let (root, issuing) = ca(CaAlgorithm::EcdsaP256);
    let jws = sign(&issuing, JWKS.as_bytes(), now()).unwrap();
    let mut forged: serde_json::Value = serde_json::from_str(JWKS).unwrap();
    let mut extra = forged["keys"][0].clone();
    extra["kid"] = "forged".into();
    forged["keys"].as_array_mut().unwrap().push(extra);
    let forged = serde_json::to_vec(&forged).unwrap();
    assert_eq!(
        verify(&jws, &forged, &anchors(&root), now()),
        Err(DetachedJwsError::BadSignature)
    );
    // One byte of whitespace is a different JWKS too: the signature is over the exact bytes.
    let spaced = format!("{JWKS} ");
    assert_eq!(
        verify(&jws, spaced.as_bytes(), &anchors(&root), now()),
        Err(DetachedJwsError::BadSignature)
    );
}

#[test]
fn a_forger_signing_with_its_own_key_is_refused() {
    let (root, issuing) = ca(CaAlgorithm::EcdsaP256);
    let (other_root, other) = ca(CaAlgorithm::EcdsaP256);
    // Its own CA: no anchor of podca's.
    let own = sign(&other, JWKS.as_bytes(), now()).unwrap();
    assert_eq!(
        verify(&own, JWKS.as_bytes(), &anchors(&root), now()),
        Err(DetachedJwsError::NoAnchor {
            subject: other.certificate().subject().to_owned()
        })
    );
    verify(&own, JWKS.as_bytes(), &anchors(&other_root), now()).unwrap();
    // podca's certificate in x5c, the forger's key signing.
    let borrowed = sign_with(
        other.key().as_ref(),
        &[issuing.certificate()],
        JWKS.as_bytes(),
        now(),
    )
    .unwrap();
    assert_eq!(
        verify(&borrowed, JWKS.as_bytes(), &anchors(&root), now()),
        Err(DetachedJwsError::BadSignature)
    );
    // An Ed25519 key behind a P-256 certificate.
    let ed = sign_with(
        key(CaAlgorithm::Ed25519).as_ref(),
        &[issuing.certificate()],
        JWKS.as_bytes(),
        now(),
    )
    .unwrap();
    assert_eq!(
        verify(&ed, JWKS.as_bytes(), &anchors(&root), now()),
        Err(DetachedJwsError::AlgorithmMismatch {
            alg: JwsAlgorithm::EdDSA,
            subject: issuing.certificate().subject().to_owned()
        })
    );
}

#[test]
fn an_expired_chain_is_refused() {
    let (root, issuing) = ca(CaAlgorithm::EcdsaP256);
    let jws = sign(&issuing, JWKS.as_bytes(), now()).unwrap();
    let later = now() + time::Duration::days(31);
    assert_eq!(
        verify(&jws, JWKS.as_bytes(), &anchors(&root), later),
        Err(DetachedJwsError::NotValidNow {
            subject: issuing.certificate().subject().to_owned()
        })
    );
}

#[test]
fn each_bad_header_trips_its_own_rule() {
    let (root, issuing) = ca(CaAlgorithm::EcdsaP256);
    let k = issuing.key().as_ref();
    let x5c = serde_json::json!([STANDARD.encode(issuing.certificate().der())]);
    let good = serde_json::json!({"alg": "ES256", "typ": JWS_TYPE, "iat": 1, "x5c": x5c});
    let check = |header: serde_json::Value| {
        verify(
            &signed_header(k, &header, JWKS.as_bytes()),
            JWKS.as_bytes(),
            &anchors(&root),
            now(),
        )
    };
    assert!(check(good.clone()).is_ok());
    let mut none = good.clone();
    none["alg"] = "none".into();
    assert_eq!(
        check(none),
        Err(DetachedJwsError::UnsupportedAlgorithm("none".into()))
    );
    let mut typ = good.clone();
    typ["typ"] = "JWT".into();
    assert_eq!(check(typ), Err(DetachedJwsError::BadType("JWT".into())));
    let mut crit = good.clone();
    crit["crit"] = serde_json::json!(["b64"]);
    assert_eq!(check(crit), Err(DetachedJwsError::Critical("b64".into())));
    let mut empty = good.clone();
    empty["x5c"] = serde_json::json!([]);
    assert!(matches!(check(empty), Err(DetachedJwsError::Malformed(_))));
    let mut garbage = good.clone();
    garbage["x5c"] = serde_json::json!(["bm90IGEgY2VydA=="]);
    assert_eq!(
        check(garbage),
        Err(DetachedJwsError::BadCertificate { index: 0 })
    );
    // The root in x5c after the issuing certificate still ends at the anchor.
    let mut with_root = good.clone();
    with_root["x5c"] = serde_json::json!([
        STANDARD.encode(issuing.certificate().der()),
        STANDARD.encode(root.certificate().der())
    ]);
    assert!(check(with_root).is_ok());
    // x5c out of order: the issuing certificate does not sign the root.
    let mut reversed = good;
    reversed["x5c"] = serde_json::json!([
        STANDARD.encode(root.certificate().der()),
        STANDARD.encode(issuing.certificate().der())
    ]);
    assert!(matches!(
        check(reversed),
        Err(DetachedJwsError::BrokenChain(_))
    ));
}

#[test]
fn an_attached_or_mangled_serialisation_is_malformed() {
    let (root, issuing) = ca(CaAlgorithm::EcdsaP256);
    let jws = sign(&issuing, JWKS.as_bytes(), now()).unwrap();
    let (header, signature) = jws.split_once("..").unwrap();
    let payload = URL_SAFE_NO_PAD.encode(JWKS);
    for bad in [
        format!("{header}.{payload}.{signature}"),
        format!("{header}.{signature}"),
        format!("{header}..{signature}.x"),
        format!("!{header}..{signature}"),
    ] {
        assert!(
            matches!(
                verify(&bad, JWKS.as_bytes(), &anchors(&root), now()),
                Err(DetachedJwsError::Malformed(_))
            ),
            "{bad}"
        );
    }
    let huge = "a".repeat(MAX_JWS_BYTES + 1);
    assert_eq!(
        verify(&huge, JWKS.as_bytes(), &anchors(&root), now()),
        Err(DetachedJwsError::TooLarge {
            len: MAX_JWS_BYTES + 1,
            max: MAX_JWS_BYTES
        })
    );
}

/// `r || s` to DER `SEQUENCE { INTEGER r, INTEGER s }`, written here rather than taken from
/// aws-lc, for openssl.
fn fixed_to_der(fixed: &[u8]) -> Vec<u8> {
    let int = |bytes: &[u8]| {
        let digits = &bytes[bytes.iter().take_while(|b| **b == 0).count()..];
        let mut content = Vec::new();
        if digits.first().is_none_or(|b| *b >= 0x80) {
            content.push(0);
        }
        content.extend_from_slice(digits);
        let mut out = vec![0x02, u8::try_from(content.len()).unwrap()];
        out.extend(content);
        out
    };
    let (r, s) = fixed.split_at(fixed.len() / 2);
    let body = [int(r), int(s)].concat();
    let mut out = vec![0x30];
    let len = u8::try_from(body.len()).unwrap();
    if len >= 0x80 {
        out.push(0x81);
    }
    out.push(len);
    out.extend(body);
    out
}

/// The classical algorithms (OpenSSL 3.0 has no ML-DSA) verified by the `openssl` CLI: the
/// x5c chain against the root, the signature with the certificate's key.
#[test]
fn openssl_verifies_the_chain_and_the_signature() {
    for algorithm in [
        CaAlgorithm::EcdsaP256,
        CaAlgorithm::EcdsaP384,
        CaAlgorithm::RsaSha256,
        CaAlgorithm::Ed25519,
    ] {
        let (root, issuing) = ca(algorithm);
        let jws = sign(&issuing, JWKS.as_bytes(), now()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("root.pem"), root.certificate().pem()).unwrap();
        std::fs::write(path("issuing.pem"), issuing.certificate().pem()).unwrap();
        let (header, signature) = jws.split_once("..").unwrap();
        std::fs::write(path("input"), signing_input(header, JWKS.as_bytes())).unwrap();
        let signature = URL_SAFE_NO_PAD.decode(signature).unwrap();
        let signature = match algorithm {
            CaAlgorithm::EcdsaP256 | CaAlgorithm::EcdsaP384 => fixed_to_der(&signature),
            _ => signature,
        };
        std::fs::write(path("sig"), signature).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            )
        };
        let (ok, out) = run(&[
            "verify",
            "-attime",
            &now().unix_timestamp().to_string(),
            "-CAfile",
            "root.pem",
            "issuing.pem",
        ]);
        assert!(ok, "{algorithm:?}: {out}");
        assert!(
            run(&[
                "x509",
                "-in",
                "issuing.pem",
                "-pubkey",
                "-noout",
                "-out",
                "pub.pem"
            ])
            .0
        );
        let verify_args: Vec<&str> = match algorithm {
            CaAlgorithm::Ed25519 => vec![
                "pkeyutl", "-verify", "-pubin", "-inkey", "pub.pem", "-rawin", "-in", "input",
                "-sigfile", "sig",
            ],
            CaAlgorithm::EcdsaP384 => vec![
                "dgst",
                "-sha384",
                "-verify",
                "pub.pem",
                "-signature",
                "sig",
                "input",
            ],
            _ => vec![
                "dgst",
                "-sha256",
                "-verify",
                "pub.pem",
                "-signature",
                "sig",
                "input",
            ],
        };
        let (ok, out) = run(&verify_args);
        assert!(ok && out.contains("Verified"), "{algorithm:?}: {out}");
        // The same command refuses the input with one key added.
        let mut forged: serde_json::Value = serde_json::from_str(JWKS).unwrap();
        forged["keys"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"kid": "forged"}));
        std::fs::write(
            path("input"),
            signing_input(header, &serde_json::to_vec(&forged).unwrap()),
        )
        .unwrap();
        let (ok, out) = run(&verify_args);
        assert!(!ok && !out.contains("Verified OK"), "{algorithm:?}: {out}");
    }
}
