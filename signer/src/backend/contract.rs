//! The contract every [`CaKey`] backend must pass. Backend tests call [`check`].
//!
//! Kept in the library (not `#[cfg(test)]`) so that backends living elsewhere — the PKCS#11
//! backend, the Secret backend in the controller crate — run the very same suite.

use std::sync::Arc;

use aws_lc_rs::signature::UnparsedPublicKey;

use super::{CaAlgorithm, CaKey};
use crate::ca::IssuingCa;

/// Runs every contract check against `key`. `secret_marker` is a byte string that occurs in
/// the private key material (for example a slice of its PEM or PIN) and must never appear in
/// `Debug` output. Panics with a precise message on the first violation.
pub fn check(key: Arc<dyn CaKey>, secret_marker: &str) {
    signatures_verify(key.as_ref());
    public_key_is_consistent(key.as_ref());
    concurrent_signing(&key);
    debug_is_redacted(key.as_ref(), secret_marker);
    signs_a_ca_that_issues(key);
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

fn public_key_is_consistent(key: &dyn CaKey) {
    let spki = key.public_key_spki();
    let parsed = crate::keys::SubjectKey::from_spki_der(&spki);
    match (key.algorithm(), parsed) {
        (CaAlgorithm::RsaSha256, Ok(_)) | (CaAlgorithm::RsaSha256, Err(_)) => {}
        (_, Ok(_)) => {}
        (alg, Err(e)) => panic!(
            "{}: {alg} public key SPKI does not parse: {e}",
            key.location()
        ),
    }
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

fn debug_is_redacted(key: &dyn CaKey, secret_marker: &str) {
    let debug = format!("{key:?}");
    assert!(
        !secret_marker.is_empty() && !debug.contains(secret_marker),
        "{}: Debug output reveals private key material: {debug}",
        key.location()
    );
    assert!(
        !debug.contains("PRIVATE KEY"),
        "Debug output holds a PEM key"
    );
}

fn signs_a_ca_that_issues(key: Arc<dyn CaKey>) {
    let now = time::OffsetDateTime::now_utc();
    let root = IssuingCa::self_signed_root(key, "contract test root", now, time::Duration::days(1))
        .unwrap_or_else(|e| panic!("building a self-signed root failed: {e}"));
    root.certificate()
        .verify_signed_by(root.certificate())
        .unwrap_or_else(|e| panic!("self-signed root does not verify: {e}"));
}
