//! Bad input gets a typed error, never a panic: unsupported key types, broken signatures,
//! truncated and random DER, and the legacy proof of possession.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use podca_signer::keys::GeneratedKey;
use podca_signer::{KeyError, KeyType, SubjectKey};

// Minimal DER writers to build the odd keys no library will generate for us.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 128 {
        out.push(len as u8);
    } else if len < 256 {
        out.extend([0x81, len as u8]);
    } else {
        out.extend([0x82, (len >> 8) as u8, len as u8]);
    }
    out.extend_from_slice(content);
    out
}
fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
    tlv(0x30, &parts.concat())
}
fn oid(dotted: &str) -> Vec<u8> {
    let arcs: Vec<u64> = dotted.split('.').map(|a| a.parse().unwrap()).collect();
    let mut body = vec![(arcs[0] * 40 + arcs[1]) as u8];
    for &arc in &arcs[2..] {
        let mut stack = vec![(arc & 0x7f) as u8];
        let mut rest = arc >> 7;
        while rest > 0 {
            stack.push((rest & 0x7f) as u8 | 0x80);
            rest >>= 7;
        }
        body.extend(stack.iter().rev());
    }
    tlv(0x06, &body)
}
fn bit_string(bytes: &[u8]) -> Vec<u8> {
    let mut body = vec![0u8];
    body.extend_from_slice(bytes);
    tlv(0x03, &body)
}
fn ec_spki(curve_oid: &str, point_len: usize) -> Vec<u8> {
    let mut point = vec![4u8];
    point.extend((0..point_len).map(|i| i as u8));
    seq(&[
        seq(&[oid("1.2.840.10045.2.1"), oid(curve_oid)]),
        bit_string(&point),
    ])
}
/// A CSR around `spki` with a junk signature (the stub path does not check it).
fn csr_around(spki: &[u8]) -> Vec<u8> {
    let info = seq(&[tlv(0x02, &[0]), seq(&[]), spki.to_vec(), tlv(0xa0, &[])]);
    seq(&[
        info,
        seq(&[oid("1.2.840.10045.4.3.2")]),
        bit_string(&[1, 2, 3]),
    ])
}

fn unsupported_spkis() -> Vec<(&'static str, Vec<u8>)> {
    let rsa2048 = RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap();
    vec![
        (
            "RSA-2048",
            rsa2048.public_key().as_der().unwrap().as_ref().to_vec(),
        ),
        ("secp256k1", ec_spki("1.3.132.0.10", 64)),
        ("P-192", ec_spki("1.2.840.10045.3.1.1", 48)),
        ("P-224", ec_spki("1.3.132.0.33", 56)),
        (
            "DSA",
            seq(&[
                seq(&[
                    oid("1.2.840.10040.4.1"),
                    seq(&[tlv(0x02, &[5]), tlv(0x02, &[7]), tlv(0x02, &[9])]),
                ]),
                bit_string(&tlv(0x02, &[3])),
            ]),
        ),
        // ML-DSA is a supported type since issue #18 (off by policy, see tests/mldsa.rs);
        // SLH-DSA stays unknown.
        (
            "SLH-DSA-SHA2-128s",
            seq(&[
                seq(&[oid("2.16.840.1.101.3.4.3.20")]),
                bit_string(&[7u8; 32]),
            ]),
        ),
        (
            "unknown OID",
            seq(&[seq(&[oid("1.2.3.4.5.6")]), bit_string(&[1, 2, 3])]),
        ),
        (
            "Ed448",
            seq(&[seq(&[oid("1.3.101.113")]), bit_string(&[9u8; 57])]),
        ),
    ]
}

#[test]
fn unsupported_key_types_are_typed_errors_listing_the_supported_ones() {
    for (name, spki) in unsupported_spkis() {
        for result in [
            SubjectKey::from_spki_der(&spki),
            SubjectKey::from_stub_csr(&csr_around(&spki)),
        ] {
            match result {
                Err(e @ KeyError::UnsupportedKeyType { .. }) => {
                    let text = e.to_string();
                    assert!(
                        text.contains("RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519"),
                        "{name}: {text}"
                    );
                }
                other => panic!("{name}: expected UnsupportedKeyType, got {other:?}"),
            }
        }
    }
}

#[test]
fn unsupported_key_messages_name_what_was_found() {
    let found: Vec<String> = unsupported_spkis()
        .into_iter()
        .map(|(_, spki)| SubjectKey::from_spki_der(&spki).unwrap_err().to_string())
        .collect();
    assert!(found[0].contains("RSA-2048"), "{}", found[0]);
    assert!(found[1].contains("secp256k1"), "{}", found[1]);
    assert!(found[5].contains("SLH-DSA-SHA2-128s"), "{}", found[5]);
}

#[test]
fn every_supported_type_parses_from_a_stub_and_a_verified_csr() {
    for key_type in KeyType::ALL {
        let key = GeneratedKey::generate(key_type).unwrap();
        let csr = key.stub_csr_der().unwrap();
        assert_eq!(
            SubjectKey::from_stub_csr(&csr).unwrap().key_type(),
            key_type
        );
        let verified = SubjectKey::from_csr_verified(&csr).unwrap();
        assert_eq!(verified.spki_der(), key.public.spki_der());
    }
}

#[test]
fn broken_csr_signature_is_refused_in_verify_mode_only() {
    for key_type in [
        KeyType::EcdsaP256,
        KeyType::Ed25519,
        KeyType::Rsa3072,
        KeyType::EcdsaP521,
    ] {
        let key = GeneratedKey::generate(key_type).unwrap();
        let mut csr = key.stub_csr_der().unwrap();
        let last = csr.len() - 2;
        csr[last] ^= 0x55;
        assert_eq!(
            SubjectKey::from_csr_verified(&csr).unwrap_err(),
            KeyError::BadSignature {
                what: "CSR self-signature"
            },
            "{key_type}"
        );
        // The PodCertificateRequest path trusts kube-apiserver's check and does not re-verify.
        assert!(SubjectKey::from_stub_csr(&csr).is_ok());
    }
}

#[test]
fn garbage_and_truncated_der_are_malformed_errors() {
    let csr = GeneratedKey::generate(KeyType::EcdsaP256)
        .unwrap()
        .stub_csr_der()
        .unwrap();
    for cut in 0..csr.len() {
        for result in [
            SubjectKey::from_stub_csr(&csr[..cut]),
            SubjectKey::from_csr_verified(&csr[..cut]),
            SubjectKey::from_spki_der(&csr[..cut]),
        ] {
            assert!(
                matches!(
                    result,
                    Err(KeyError::Malformed { .. } | KeyError::UnsupportedKeyType { .. })
                ),
                "prefix of {cut} bytes: {result:?}"
            );
        }
    }
    let mut trailing = csr.clone();
    trailing.push(0);
    assert!(matches!(
        SubjectKey::from_stub_csr(&trailing),
        Err(KeyError::Malformed { .. })
    ));
    for garbage in [&b""[..], b"\x30", b"not der at all", &[0xff; 64]] {
        for result in [
            SubjectKey::from_stub_csr(garbage),
            SubjectKey::from_spki_der(garbage),
        ] {
            assert!(
                matches!(result, Err(KeyError::Malformed { .. })),
                "{garbage:?}: {result:?}"
            );
        }
    }
}

/// A small deterministic generator so a failure is reproducible.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_and_mutated_inputs_never_panic() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let seeds: Vec<Vec<u8>> = [KeyType::EcdsaP256, KeyType::Ed25519, KeyType::Rsa3072]
        .into_iter()
        .map(|k| GeneratedKey::generate(k).unwrap().stub_csr_der().unwrap())
        .collect();
    for round in 0..20_000 {
        let input: Vec<u8> = if round % 2 == 0 {
            let len = (rng.next() % 600) as usize;
            (0..len).map(|_| rng.next() as u8).collect()
        } else {
            let mut m = seeds[round % seeds.len()].clone();
            for _ in 0..=(rng.next() % 4) {
                let i = (rng.next() as usize) % m.len();
                m[i] ^= 1 << (rng.next() % 8);
            }
            m
        };
        let _ = SubjectKey::from_stub_csr(&input);
        let _ = SubjectKey::from_csr_verified(&input);
        let _ = SubjectKey::from_spki_der(&input);
        let _ = SubjectKey::from_pkix_with_proof(&input, &input, "uid");
    }
}

const POD_UID: &str = "0d5b9a4e-7b1f-4f64-9a8e-2f6d7f2f8a11";

#[test]
fn legacy_proof_of_possession_verifies_for_every_key_type() {
    let rng = SystemRandom::new();
    let mut cases: Vec<(KeyType, Vec<u8>, Vec<u8>)> = vec![];
    // ECDSA: a DER signature over SHA-256(podUID), whatever the curve (spec §5.3).
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, POD_UID.as_bytes());
    for (kt, alg) in [
        (
            KeyType::EcdsaP256,
            &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        ),
        (
            KeyType::EcdsaP521,
            &signature::ECDSA_P521_SHA256_ASN1_SIGNING,
        ),
    ] {
        let pair = EcdsaKeyPair::generate(alg).unwrap();
        let sig = pair.sign_digest(&digest).unwrap();
        let spki = pair.public_key().as_der().unwrap().as_ref().to_vec();
        cases.push((kt, spki, sig.as_ref().to_vec()));
    }
    cases.push(openssl_p384_proof());
    let ed = Ed25519KeyPair::generate().unwrap();
    cases.push((
        KeyType::Ed25519,
        ed.public_key().as_der().unwrap().as_ref().to_vec(),
        ed.sign(POD_UID.as_bytes()).as_ref().to_vec(),
    ));
    // Go's SignPSS with nil options uses the largest salt; others use the digest length.
    for (kt, size, encoding) in [
        (
            KeyType::Rsa3072,
            aws_lc_rs::rsa::KeySize::Rsa3072,
            &signature::RSA_PSS_SHA256,
        ),
        (
            KeyType::Rsa4096,
            aws_lc_rs::rsa::KeySize::Rsa4096,
            &const { signature::RSA_PSS_SHA256.with_pss_salt_length(signature::RsaPssSaltLength::Max) },
        ),
    ] {
        let pair = RsaKeyPair::generate(size).unwrap();
        let mut sig = vec![0u8; pair.public_modulus_len()];
        pair.sign(encoding, &rng, POD_UID.as_bytes(), &mut sig)
            .unwrap();
        cases.push((
            kt,
            pair.public_key().as_der().unwrap().as_ref().to_vec(),
            sig,
        ));
    }
    for (kt, spki, sig) in cases {
        let key = SubjectKey::from_pkix_with_proof(&spki, &sig, POD_UID)
            .unwrap_or_else(|e| panic!("{kt}: {e}"));
        assert_eq!(key.key_type(), kt);
        assert_eq!(
            SubjectKey::from_pkix_with_proof(&spki, &sig, "another-pod-uid").unwrap_err(),
            KeyError::BadSignature {
                what: "proof of possession"
            },
            "{kt}: a proof over another pod UID must fail"
        );
    }
}

/// aws-lc-rs cannot sign a SHA-256 digest with a P-384 key; openssl (as Go does) can.
fn openssl_p384_proof() -> (KeyType, Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(d)
            .output()
            .expect("the `openssl` binary is required: apt-get install -y openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(d.join("uid"), POD_UID).unwrap();
    run(&[
        "ecparam",
        "-name",
        "secp384r1",
        "-genkey",
        "-noout",
        "-out",
        "k.pem",
    ]);
    run(&[
        "pkey", "-in", "k.pem", "-pubout", "-outform", "DER", "-out", "spki.der",
    ]);
    run(&[
        "dgst", "-sha256", "-sign", "k.pem", "-out", "sig.der", "uid",
    ]);
    (
        KeyType::EcdsaP384,
        std::fs::read(d.join("spki.der")).unwrap(),
        std::fs::read(d.join("sig.der")).unwrap(),
    )
}
