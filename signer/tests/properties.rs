//! Property tests of the signer's parsers of untrusted input, on stable with a fixed budget
//! (256 cases per property, a fixed seed: every run tries the same inputs). The bodies are the
//! cargo-fuzz targets' (`fuzz/src/signer_targets.rs`, included here): never panic, roundtrip
//! what they accept, and refuse with the parser's typed error.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../fuzz/src/signer_targets.rs"]
// Not every shared target is called here.
#[allow(dead_code)]
mod targets;

use podca_signer::backend::Pkcs11Uri;
use podca_signer::keys::{KeyError, SubjectKey};
use podca_signer::x509::CertError;
use podca_signer::{BackendError, CaCertificate};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use targets::seeds;

const CASES: u32 = 256;
const SEED: [u8; 32] = *b"podca property tests, fixed seed";

fn runner() -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &SEED),
    )
}

/// Up to 8 byte-level mutations (see [`seeds::mutate`]).
fn mutations() -> impl Strategy<Value = Vec<(u8, usize, u8)>> {
    prop::collection::vec(any::<(u8, usize, u8)>(), 0..8)
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..300)
}

#[test]
fn spki_and_csr_parsers_never_panic_and_keep_what_they_accept() {
    let keys = seeds::keys();
    for (spki, csr) in &keys {
        // The seeds are valid: the mutations start from real shapes.
        SubjectKey::from_spki_der(spki).unwrap();
        SubjectKey::from_csr_verified(csr).unwrap();
    }
    let mut runner = runner();
    runner
        .run(&(0..keys.len(), mutations()), |(i, ops)| {
            targets::spki(&seeds::mutate(&keys[i].0, &ops));
            targets::csr(&seeds::mutate(&keys[i].1, &ops));
            Ok(())
        })
        .unwrap();
    runner
        .run(&bytes(), |data| {
            targets::spki(&data);
            targets::csr(&data);
            Ok(())
        })
        .unwrap();
    // A truncated SPKI or CSR is malformed, never another error and never accepted.
    runner
        .run(&(0..keys.len(), any::<usize>()), |(i, cut)| {
            let (spki, csr) = &keys[i];
            let spki_cut = &spki[..cut % spki.len()];
            let csr_cut = &csr[..cut % csr.len()];
            let spki_err = SubjectKey::from_spki_der(spki_cut);
            prop_assert!(
                matches!(spki_err, Err(KeyError::Malformed { .. })),
                "truncated SPKI: {:?}",
                spki_err
            );
            let csr_err = SubjectKey::from_stub_csr(csr_cut);
            prop_assert!(
                matches!(csr_err, Err(KeyError::Malformed { .. })),
                "truncated CSR: {:?}",
                csr_err
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn certificate_parsers_never_panic_and_roundtrip() {
    let pem = seeds::ca_pem();
    let certs = CaCertificate::all_from_pem(&pem).unwrap();
    assert_eq!(certs.len(), 2);
    let mut runner = runner();
    runner
        .run(&mutations(), |ops| {
            let text = String::from_utf8_lossy(&seeds::mutate(pem.as_bytes(), &ops)).into_owned();
            targets::pem_certificates(&text);
            targets::certificate_der(&seeds::mutate(certs[0].der(), &ops));
            Ok(())
        })
        .unwrap();
    runner
        .run(&(bytes(), ".{0,200}"), |(data, text)| {
            targets::certificate_der(&data);
            targets::pem_certificates(&text);
            Ok(())
        })
        .unwrap();
    // Text without a PEM block is refused as such.
    runner
        .run(&"[a-zA-Z0-9 ]{0,100}", |text| {
            let result = CaCertificate::all_from_pem(&text);
            prop_assert!(
                matches!(result, Err(CertError::Empty | CertError::Pem(_))),
                "{:?}: {:?}",
                text,
                result
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn pkcs11_uris_never_panic_and_roundtrip() {
    for uri in seeds::PKCS11_URIS {
        Pkcs11Uri::parse(uri).unwrap();
    }
    let mut runner = runner();
    runner
        .run(&(0..seeds::PKCS11_URIS.len(), mutations()), |(i, ops)| {
            let seed = seeds::PKCS11_URIS[i].as_bytes();
            targets::pkcs11_uri(&String::from_utf8_lossy(&seeds::mutate(seed, &ops)));
            Ok(())
        })
        .unwrap();
    // URI-shaped text: attributes and values from the URI alphabet, percent escapes included.
    runner
        .run(&"pkcs11:[a-z=;%0-9A-F?/:-]{0,80}", |text| {
            targets::pkcs11_uri(&text);
            Ok(())
        })
        .unwrap();
    // Whatever does not start with the scheme is an invalid key reference, never a panic.
    runner
        .run(&"[a-oq-z][a-z:;=]{0,40}", |text| {
            let result = Pkcs11Uri::parse(&text);
            prop_assert!(
                matches!(result, Err(BackendError::InvalidKey(_))),
                "{:?}: {:?}",
                text,
                result
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn private_key_pem_never_panics() {
    let key = podca_signer::keys::GeneratedKey::generate(podca_signer::KeyType::EcdsaP256)
        .unwrap()
        .private_key_pem();
    let mut runner = runner();
    runner
        .run(&mutations(), |ops| {
            targets::private_key_pem(&String::from_utf8_lossy(&seeds::mutate(
                key.as_bytes(),
                &ops,
            )));
            Ok(())
        })
        .unwrap();
}
