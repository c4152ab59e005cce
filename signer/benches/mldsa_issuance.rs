//! ML-DSA issuance throughput against raw signing, on one core (issue #18's targets: ≥ 0.80).
//!
//! `cargo bench -p podca-signer --bench mldsa_issuance` prints two comparisons:
//! * leaf issuance with an ML-DSA-65 issuing CA (ECDSA P-256 subject) against raw ML-DSA-65
//!   signatures of a TBSCertificate-sized message;
//! * leaf issuance for an ML-DSA-65 subject under a P-256 issuing CA against raw P-256 signing.
//!
//! Issuance is the PodCertificateRequest path: stub CSR DER → subject key (no signature
//! re-check) → policy → validity → signed leaf → PEM chain.
//!
//! Raw signing and issuance take turns every 20 ms (see `common::paired_rates`), so that other
//! work on the machine weighs on both sides of a ratio alike. Run it
//! pinned to one core: `taskset -c 1 cargo bench -p podca-signer --bench mldsa_issuance`.

// A benchmark binary: a failed setup step should abort it loudly.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, ML_DSA_65_SIGNING, PqdsaKeyPair,
};
use podca_signer::keys::GeneratedKey;
use podca_signer::{
    CaAlgorithm, CertificateRequest, IssuingCa, KeyType, MemoryKey, Outcome, SignerPolicy,
    SubjectKey,
};
use time::OffsetDateTime;

mod common;

/// Raw signing and issuance per second, measured in turns.
fn rates(raw: impl FnMut(), issue: impl FnMut()) -> common::Paired {
    common::paired_rates(16, raw, issue)
}

fn two_level_ca(algorithm: CaAlgorithm, now: OffsetDateTime) -> IssuingCa {
    IssuingCa::self_signed_root(
        Arc::new(MemoryKey::generate(algorithm).unwrap()),
        "bench root",
        now,
        time::Duration::days(30),
    )
    .unwrap()
    .sign_intermediate(
        Arc::new(MemoryKey::generate(algorithm).unwrap()),
        "bench issuing",
        now,
        time::Duration::days(10),
    )
    .unwrap()
}

/// One issuance of a leaf for the `stub` CSR's key under `ca`.
fn issue_one<'a>(ca: &'a IssuingCa, stub: &'a [u8], now: OffsetDateTime) -> impl FnMut() + 'a {
    let mut policy = SignerPolicy::permissive("cluster.local");
    policy.key_types = KeyType::EVERY.to_vec();
    move || {
        let request = CertificateRequest {
            key: SubjectKey::from_stub_csr(stub),
            namespace: "prod".into(),
            service_account: "web".into(),
            pod_name: Some("web-0".into()),
            max_expiration: Some(time::Duration::seconds(86400)),
            requested_lifetime: None,
            user_annotations: Default::default(),
        };
        match podca_signer::sign_request(&policy, ca, &request, now) {
            Outcome::Issued(cert) => {
                std::hint::black_box(cert);
            }
            other => panic!("{other:?}"),
        }
    }
}

fn stub(subject: KeyType) -> Vec<u8> {
    GeneratedKey::generate(subject)
        .unwrap()
        .stub_csr_der()
        .unwrap()
}

fn report(what: &str, raw_name: &str, measured: &common::Paired) {
    let (low, high) = measured.range();
    println!("{what}");
    println!(
        "  raw {raw_name} signatures/s (aws-lc-rs): {:>10.0}",
        measured.a
    );
    println!(
        "  leaf issuance/s (stub CSR → PEM chain): {:>10.0}",
        measured.b
    );
    println!(
        "  issuance / raw signing:                 {:>10.1} % (target ≥ 80 %) [{:.1}–{:.1} %]",
        100.0 * measured.ratio(),
        100.0 * low,
        100.0 * high
    );
}

fn main() {
    let now = OffsetDateTime::now_utc();
    // About the size of a leaf's TBSCertificate with a P-256 subject key; an ML-DSA-65 subject
    // key makes it ~2.3 KB.
    let small = vec![0x5au8; 420];
    let large = vec![0x5au8; 2400];

    // 1. ML-DSA-65 issuing CA, P-256 subject, against raw ML-DSA-65.
    let ml_dsa = PqdsaKeyPair::generate(&ML_DSA_65_SIGNING).unwrap();
    let mut signature = vec![0u8; ML_DSA_65_SIGNING.signature_len()];
    let ca = two_level_ca(CaAlgorithm::MlDsa65, now);
    let p256_stub = stub(KeyType::EcdsaP256);
    let ml_dsa_ca = rates(
        || {
            std::hint::black_box(ml_dsa.sign(&small, &mut signature).unwrap());
        },
        issue_one(&ca, &p256_stub, now),
    );

    // 2. ML-DSA-65 subject under a P-256 issuing CA, against raw P-256.
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let p256 = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
    let ca = two_level_ca(CaAlgorithm::EcdsaP256, now);
    let ml_dsa_stub = stub(KeyType::MlDsa65);
    let ml_dsa_subject = rates(
        || {
            std::hint::black_box(p256.sign(&rng, &large).unwrap());
        },
        issue_one(&ca, &ml_dsa_stub, now),
    );

    println!("{}", common::method());
    report(
        "ML-DSA-65 issuing CA, ECDSA P-256 subject:",
        "ML-DSA-65",
        &ml_dsa_ca,
    );
    report(
        "ML-DSA-65 subject, ECDSA P-256 issuing CA:",
        "ECDSA P-256",
        &ml_dsa_subject,
    );
}
