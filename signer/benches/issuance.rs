//! Issuance throughput against the crypto provider's raw signing rate, on one core.
//!
//! `cargo bench -p podca-signer --bench issuance` prints both rates and their ratio. Full
//! issuance = stub CSR DER → subject key (no signature re-check) → policy → validity →
//! signed leaf → PEM chain: exactly the PodCertificateRequest path.

// A benchmark binary: a failed setup step should abort it loudly.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair};
use podca_signer::keys::GeneratedKey;
use podca_signer::{
    CaAlgorithm, CertificateRequest, IssuingCa, KeyType, MemoryKey, Outcome, SignerPolicy,
    SubjectKey,
};
use time::OffsetDateTime;

mod common;

fn main() {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let raw_key =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
    // About the size of a leaf's TBSCertificate.
    let message = vec![0x5au8; 420];
    let raw = || {
        std::hint::black_box(raw_key.sign(&rng, &message).unwrap());
    };

    let now = OffsetDateTime::now_utc();
    let root = IssuingCa::self_signed_root(
        Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap()),
        "bench root",
        now,
        time::Duration::days(30),
    )
    .unwrap();
    let ca = root
        .sign_intermediate(
            Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap()),
            "bench issuing",
            now,
            time::Duration::days(10),
        )
        .unwrap();
    let policy = SignerPolicy::permissive("cluster.local");
    let stub = GeneratedKey::generate(KeyType::EcdsaP256)
        .unwrap()
        .stub_csr_der()
        .unwrap();
    let issue = || {
        let request = CertificateRequest {
            key: SubjectKey::from_stub_csr(&stub),
            namespace: "prod".into(),
            service_account: "web".into(),
            pod_name: Some("web-0".into()),
            max_expiration: Some(time::Duration::seconds(86400)),
            requested_lifetime: None,
            user_annotations: Default::default(),
        };
        match podca_signer::sign_request(&policy, &ca, &request, now) {
            Outcome::Issued(cert) => {
                std::hint::black_box(cert);
            }
            other => panic!("{other:?}"),
        }
    };
    let measured = common::paired_rates(64, raw, issue);
    let (low, high) = measured.range();
    println!("{}", common::method());
    println!(
        "raw ECDSA P-256 signatures/s (aws-lc-rs): {:>10.0}",
        measured.a
    );
    println!(
        "leaf issuance/s (stub CSR → PEM chain):   {:>10.0}",
        measured.b
    );
    println!(
        "issuance / raw signing:                   {:>10.1} % [{:.1}–{:.1} %]",
        100.0 * measured.ratio(),
        100.0 * low,
        100.0 * high
    );
}
