//! The contract every [`CaKey`] backend must pass. Backend tests call [`check`].
//!
//! Kept in the library (not `#[cfg(test)]`) so that backends living elsewhere — the PKCS#11
//! backend, the Secret backend in the controller crate — run the very same suite.

use std::sync::Arc;

use aws_lc_rs::encoding::AsBigEndian;
use aws_lc_rs::signature::{self, EcdsaKeyPair, Ed25519KeyPair, UnparsedPublicKey};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::{CaAlgorithm, CaKey};
use crate::ca::IssuingCa;

/// What must never show in a key's `Debug` output.
#[derive(Debug, Clone, Copy)]
pub enum Secret<'a> {
    /// The private key as PKCS#8 DER (keys held in this process): looked for as hex, base64 and
    /// a byte list, and so is its raw private scalar (ECDSA, Ed25519).
    Pkcs8Der(&'a [u8]),
    /// Text that unlocks a key that never leaves its device (a PKCS#11 PIN).
    Text(&'a str),
}

/// Runs every contract check against `key`. Panics with a precise message on the first
/// violation.
pub fn check(key: Arc<dyn CaKey>, secret: Secret<'_>) {
    signatures_verify(key.as_ref());
    public_key_is_consistent(key.as_ref());
    concurrent_signing(&key);
    assert_debug_hides(&format!("{key:?}"), secret);
    signs_a_ca_that_issues(key);
}

/// Panics if `debug` shows `secret` in any of the forms a careless `Debug` would print it.
pub fn assert_debug_hides(debug: &str, secret: Secret<'_>) {
    assert!(
        !debug.contains("PRIVATE KEY"),
        "Debug output holds a PEM key: {debug}"
    );
    match secret {
        Secret::Text(text) => {
            assert!(!text.is_empty(), "an empty secret proves nothing");
            assert!(
                !debug.contains(text),
                "Debug output reveals the secret text: {debug}"
            );
        }
        Secret::Pkcs8Der(der) => {
            assert!(!der.is_empty(), "an empty key proves nothing");
            for (form, needle) in whole_encodings(der) {
                assert!(
                    !debug.contains(&needle),
                    "Debug output reveals the private key DER ({form}): {debug}"
                );
            }
            // RSA has no single secret scalar; its DER forms above are checked.
            if let Some(scalar) = private_scalar(der) {
                for (form, needle) in whole_encodings(&scalar)
                    .into_iter()
                    .chain(window_encodings(&scalar))
                {
                    assert!(
                        !debug.contains(&needle),
                        "Debug output reveals the raw private scalar ({form}): {debug}"
                    );
                }
            }
        }
    }
}

/// `bytes` as a derived `Debug`, `hex` or a PEM body would print it whole.
fn whole_encodings(bytes: &[u8]) -> Vec<(&'static str, String)> {
    let mut forms = vec![
        ("hex", hex::encode(bytes)),
        ("HEX", hex::encode_upper(bytes)),
        ("byte list", byte_list(bytes)),
    ];
    let body = pem::encode(&pem::Pem::new("K", bytes));
    // Whole 32-character pieces of each base64 line: long enough never to occur by chance.
    for line in body.lines().filter(|l| !l.starts_with("-----")) {
        let mut rest = line;
        while rest.len() >= 32 {
            forms.push(("base64", rest[..32].to_owned()));
            rest = &rest[32..];
        }
    }
    forms
}

/// Every 8-byte run of `bytes` as hex and as a byte list: a partial print still leaks.
fn window_encodings(bytes: &[u8]) -> Vec<(&'static str, String)> {
    bytes
        .windows(8)
        .flat_map(|w| {
            [
                ("hex run", hex::encode(w)),
                ("HEX run", hex::encode_upper(w)),
                ("byte-list run", byte_list(w)),
            ]
        })
        .collect()
}

fn byte_list(bytes: &[u8]) -> String {
    let list = format!("{bytes:?}");
    list.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

/// The raw private scalar of an ECDSA or Ed25519 PKCS#8 key.
fn private_scalar(der: &[u8]) -> Option<Vec<u8>> {
    for alg in [
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
    ] {
        if let Ok(pair) = EcdsaKeyPair::from_pkcs8(alg, der) {
            return pair
                .private_key()
                .as_be_bytes()
                .ok()
                .map(|b| b.as_ref().to_vec());
        }
    }
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).ok()?;
    let seed = pair.seed().ok()?;
    let bytes = seed.as_be_bytes().ok()?;
    Some(bytes.as_ref().to_vec())
}

fn verify(key: &dyn CaKey, message: &[u8], sig: &[u8]) -> bool {
    UnparsedPublicKey::new(key.algorithm().verification(), key.public_key_raw())
        .verify(message, sig)
        .is_ok()
}

fn signatures_verify(key: &dyn CaKey) {
    for len in [0usize, 1, 32, 1000, 70_000] {
        let message: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let sig = key
            .sign(&message)
            .unwrap_or_else(|e| panic!("{}: sign({len} bytes) failed: {e}", key.location()));
        assert!(
            verify(key, &message, &sig),
            "{}: signature over {len} bytes does not verify with the public key",
            key.location()
        );
        let mut tampered = message.clone();
        tampered.push(1);
        assert!(
            !verify(key, &tampered, &sig),
            "{}: signature verifies over a different message",
            key.location()
        );
    }
}

/// The SPKI (what certificates carry) holds the very key that signs: its algorithm and curve
/// are the key's, its bits are `public_key_raw`, and they verify a fresh signature.
fn public_key_is_consistent(key: &dyn CaKey) {
    let alg = key.algorithm();
    let der = key.public_key_spki();
    let (rest, spki) = SubjectPublicKeyInfo::from_der(&der).unwrap_or_else(|e| {
        panic!(
            "{}: {alg} public key SPKI does not parse: {e}",
            key.location()
        )
    });
    assert!(rest.is_empty(), "{}: bytes after the SPKI", key.location());
    let (want_alg, want_curve) = match alg {
        CaAlgorithm::EcdsaP256 => ("1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7")),
        CaAlgorithm::EcdsaP384 => ("1.2.840.10045.2.1", Some("1.3.132.0.34")),
        CaAlgorithm::Ed25519 => ("1.3.101.112", None),
        CaAlgorithm::RsaSha256 => ("1.2.840.113549.1.1.1", None),
        ml_dsa => (ml_dsa.signature_oid(), None),
    };
    assert_eq!(
        spki.algorithm.algorithm.to_id_string(),
        want_alg,
        "{}: {alg} SPKI algorithm",
        key.location()
    );
    if let Some(curve) = want_curve {
        let found = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .map(|oid| oid.to_id_string());
        assert_eq!(
            found.as_deref(),
            Some(curve),
            "{}: {alg} SPKI curve",
            key.location()
        );
    }
    assert_eq!(
        spki.subject_public_key.data.as_ref(),
        key.public_key_raw(),
        "{}: the SPKI holds another key than public_key_raw",
        key.location()
    );
    let message = b"contract: the SPKI's key verifies this";
    let sig = key
        .sign(message)
        .unwrap_or_else(|e| panic!("{}: sign failed: {e}", key.location()));
    assert!(
        UnparsedPublicKey::new(alg.verification(), spki.subject_public_key.data.as_ref())
            .verify(message, &sig)
            .is_ok(),
        "{}: the key in the SPKI does not verify the key's signature",
        key.location()
    );
    assert!(!key.location().is_empty(), "location must describe the key");
}

fn concurrent_signing(key: &Arc<dyn CaKey>) {
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let key = Arc::clone(key);
            std::thread::spawn(move || {
                for i in 0..25 {
                    let message = format!("thread {t} message {i}");
                    let sig = key.sign(message.as_bytes()).expect("concurrent sign");
                    assert!(
                        verify(key.as_ref(), message.as_bytes(), &sig),
                        "concurrent signature does not verify"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a concurrent signing thread panicked");
    }
}

fn signs_a_ca_that_issues(key: Arc<dyn CaKey>) {
    let now = time::OffsetDateTime::now_utc();
    let root = IssuingCa::self_signed_root(key, "contract test root", now, time::Duration::days(1))
        .unwrap_or_else(|e| panic!("building a self-signed root failed: {e}"));
    root.certificate()
        .verify_signed_by(root.certificate())
        .unwrap_or_else(|e| panic!("self-signed root does not verify: {e}"));
}
