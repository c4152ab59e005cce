//! Property tests of the parsers of untrusted input outside the signer — the config file, a CA
//! Secret's contents, the CA history object, the gRPC request decoders and their conversion into
//! signer requests — on stable with a fixed budget (256 cases per property, a fixed seed). The
//! bodies are the cargo-fuzz targets' (`fuzz/src/edge_targets.rs`, included here).

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../fuzz/src/signer_targets.rs"]
// Not every shared target is called here.
#[allow(dead_code)]
mod signer_targets;
#[path = "../../fuzz/src/edge_targets.rs"]
mod targets;

use std::collections::HashMap;
use std::sync::Arc;

use podca_authority::config::Config as PodcaConfig;
use podca_authority::secret_rotation::{History, Record};
use podca_proto::podca::v1::{IssueCertificateRequest, IssueForPodRequest};
use podca_signer::keys::GeneratedKey;
use podca_signer::rotation::{Generation, Phase};
use podca_signer::{IssuingCa, KeyType, MemoryKey};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use prost::Message;
use time::{Duration, OffsetDateTime};

use signer_targets::seeds::mutate;

const CASES: u32 = 256;
const SEED: [u8; 32] = *b"podca edge property tests, seed!";

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

fn mutations() -> impl Strategy<Value = Vec<(u8, usize, u8)>> {
    prop::collection::vec(any::<(u8, usize, u8)>(), 0..8)
}

fn mutated_text(seed: &str, ops: &[(u8, usize, u8)]) -> String {
    String::from_utf8_lossy(&mutate(seed.as_bytes(), ops)).into_owned()
}

/// A self-signed CA with its key PEM.
fn ca() -> (IssuingCa, String) {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let key_pem = pair.serialize_pem();
    let ca = IssuingCa::self_signed_root(
        Arc::new(MemoryKey::from_pem(&key_pem).unwrap()),
        "property root",
        OffsetDateTime::now_utc(),
        Duration::days(30),
    )
    .unwrap();
    (ca, key_pem)
}

const CONFIG: &str = r#"
[ca]
backend = "file"
dir = "/var/lib/podca"

[signers."example.com/workload"]
trust_domain = "cluster.local"
namespaces = ["*"]
max_lifetime_seconds = 86400

[rotation]
propagation_seconds = 900
"#;

#[test]
fn the_config_parser_never_panics() {
    PodcaConfig::parse(CONFIG).unwrap();
    let mut runner = runner();
    runner
        .run(&mutations(), |ops| {
            targets::config(&mutated_text(CONFIG, &ops));
            Ok(())
        })
        .unwrap();
    // TOML-shaped lines with keys podca knows and values of every type.
    let line = prop_oneof![
        Just("[ca]".to_owned()),
        Just("[grpc]".to_owned()),
        Just("[rotation]".to_owned()),
        Just("[signers.\"a/b\"]".to_owned()),
        "(backend|dir|trust_domain|tls|listen|propagation_seconds|ca_lifetime_seconds|prepare_at|max_lifetime_seconds) = (\"[a-z0-9/.:]{0,12}\"|-?[0-9]{1,20}|[0-9]\\.[0-9]{1,3}|true|\\[\\])",
    ];
    runner
        .run(&prop::collection::vec(line, 0..10), |lines| {
            targets::config(&lines.join("\n"));
            Ok(())
        })
        .unwrap();
}

#[test]
fn the_secret_contents_parser_never_panics() {
    let (ca, key_pem) = ca();
    let cert = ca.certificate().pem();
    // The seed is a valid CA Secret.
    let now = OffsetDateTime::now_utc();
    podca_authority::secret_rotation::SecretCaContents::parse(
        podca_authority::secret_rotation::SecretData {
            type_: None,
            tls_crt: Some(cert.as_bytes()),
            tls_key: Some(key_pem.as_bytes()),
            ca_crt: None,
            location: "test".into(),
        },
        now,
        Arc::new(move || now),
    )
    .unwrap();
    let mut runner = runner();
    runner
        .run(
            &(mutations(), mutations(), any::<bool>()),
            |(a, b, ca_crt)| {
                let tls_crt = mutate(cert.as_bytes(), &a);
                let tls_key = mutate(key_pem.as_bytes(), &b);
                let roots = ca_crt.then(|| mutate(cert.as_bytes(), &b));
                targets::secret_contents(&tls_crt, &tls_key, roots.as_deref());
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn the_history_parser_never_panics_and_roundtrips() {
    let (ca, _) = ca();
    let now = OffsetDateTime::now_utc();
    let history = History {
        secret: "podca-system/podca-ca".into(),
        generations: vec![Record {
            generation: Generation {
                id: 1,
                phase: Phase::Active,
                ca_not_before: now,
                ca_not_after: now + Duration::days(30),
                prepared_at: now,
                activated_at: Some(now),
                retired_at: None,
                activate_asap: false,
                last_leaf_not_after: None,
            },
            fingerprint: ca.fingerprint().to_owned(),
            subject: ca.certificate().subject().to_owned(),
            chain_pem: ca.certificate().pem(),
            anchors_pem: ca.roots_pem(),
        }],
    };
    let json = serde_json::to_string(&history).unwrap();
    let mut runner = runner();
    runner
        .run(&mutations(), |ops| {
            targets::history(&mutate(json.as_bytes(), &ops));
            Ok(())
        })
        .unwrap();
    // Far-future, far-past and out-of-range times and ids parse or are refused, never panic.
    runner
        .run(
            &(any::<i64>(), any::<u32>(), "[a-z]{0,8}"),
            |(seconds, id, phase)| {
                let text = json
                    .replace("\"id\":1", &format!("\"id\":{id}"))
                    .replace("\"active\"", &format!("\"{phase}\""));
                let time = OffsetDateTime::from_unix_timestamp(seconds % 253_402_300_799)
                    .ok()
                    .and_then(|t| {
                        t.format(&time::format_description::well_known::Rfc3339)
                            .ok()
                    });
                let text = match time {
                    Some(t) => text.replacen(
                        &now.format(&time::format_description::well_known::Rfc3339)
                            .unwrap(),
                        &t,
                        1,
                    ),
                    None => text,
                };
                targets::history(text.as_bytes());
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn grpc_request_decoders_never_panic_and_roundtrip() {
    let (ca, _) = ca();
    let csr = GeneratedKey::generate(KeyType::EcdsaP256)
        .unwrap()
        .stub_csr_der()
        .unwrap();
    let request = IssueCertificateRequest {
        csr,
        requested_lifetime_seconds: Some(3600),
        user_annotations: HashMap::from([(
            "podca.dev/dns-names".to_owned(),
            "web.example".to_owned(),
        )]),
        signer_name: String::new(),
    };
    let for_pod = IssueForPodRequest {
        pod_namespace: "default".into(),
        pod_name: "web-0".into(),
        request: Some(request.clone()),
    };
    let seeds = [request.encode_to_vec(), for_pod.encode_to_vec()];
    let mut runner = runner();
    runner
        .run(&(0..2usize, mutations()), |(i, ops)| {
            let data = mutate(&seeds[i], &ops);
            targets::grpc_issue(&data, Some(&ca));
            targets::grpc_issue_for_pod(&data, Some(&ca));
            Ok(())
        })
        .unwrap();
    // Any lifetime and any annotations reach the signer without a panic.
    runner
        .run(
            &(
                any::<Option<i64>>(),
                prop::collection::hash_map(".{0,20}", ".{0,40}", 0..4),
            ),
            |(lifetime, annotations)| {
                let mut r = request.clone();
                r.requested_lifetime_seconds = lifetime;
                r.user_annotations = annotations;
                targets::grpc_issue(&r.encode_to_vec(), Some(&ca));
                Ok(())
            },
        )
        .unwrap();
    runner
        .run(&prop::collection::vec(any::<u8>(), 0..300), |data| {
            targets::grpc_issue(&data, None);
            targets::grpc_issue_for_pod(&data, None);
            Ok(())
        })
        .unwrap();
}
