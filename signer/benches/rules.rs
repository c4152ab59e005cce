//! What CEL policy rules cost: issuance throughput without rules and with ten realistic rules
//! and one output, in the same run, on one core; and the latency the rules and the output add
//! to one request (`SignerPolicy::apply_rules_with_outputs`, i.e. `RuleSet::decide`, alone).
//!
//! `cargo bench -p podca-signer --bench rules` prints both rates, their ratio, and the p50,
//! p99 and max of the rules' own time over many requests. Targets (issue #19): at most 10 %
//! of issuance throughput and at most 50 µs p99.

// A benchmark binary: a failed setup step should abort it loudly.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_signer::keys::GeneratedKey;
use podca_signer::rules::{OutputSpec, RuleSpec};
use podca_signer::{
    CaAlgorithm, CertificateRequest, IssuingCa, KeyType, MemoryKey, Outcome, RequestContext,
    RequestSource, RuleFacts, SignerPolicy, SubjectKey,
};
use time::OffsetDateTime;

mod common;

const SIGNER: &str = "example.com/workload";

fn rule(name: &str, deny: Option<&str>, require: Option<&str>, message: Option<&str>) -> RuleSpec {
    RuleSpec {
        name: name.into(),
        deny: deny.map(Into::into),
        require: require.map(Into::into),
        reason: "PolicyDenied".into(),
        message: message.map(Into::into),
    }
}

/// Ten rules of the kinds platform teams write: namespaces, service accounts, namespace
/// labels, key types, lifetimes, annotations and their DNS names, source-specific facts; two
/// with a message expression. None denies the benchmark's request, so all ten run.
fn ten_rules() -> Vec<RuleSpec> {
    vec![
        rule(
            "system_namespaces",
            Some("request.namespace in ['kube-system', 'kube-public', 'quarantine']"),
            None,
            None,
        ),
        rule(
            "no_default_account",
            Some("request.service_account == 'default'"),
            None,
            Some("'namespace ' + request.namespace + ' must not use the default service account'"),
        ),
        rule(
            "tiered_namespaces",
            None,
            Some(
                "'tier' in namespaceObject.metadata.labels && \
                 namespaceObject.metadata.labels['tier'] in ['prod', 'staging']",
            ),
            Some("'namespace ' + request.namespace + ' has no tier=prod|staging label'"),
        ),
        rule(
            "team_prefix",
            None,
            Some(
                "!('team' in namespaceObject.metadata.labels) || \
                 request.namespace.startsWith(namespaceObject.metadata.labels['team'])",
            ),
            None,
        ),
        rule(
            "key_types",
            None,
            Some("request.key_type in ['ECDSAP256', 'ECDSAP384', 'ED25519']"),
            None,
        ),
        rule(
            "two_days_at_most",
            Some("request.requested_lifetime_seconds > 172800"),
            None,
            None,
        ),
        rule(
            "known_annotations",
            None,
            Some("request.annotations.all(k, k == 'podca.dev/dns-names')"),
            None,
        ),
        rule(
            "names_in_namespace",
            None,
            Some(
                "!('podca.dev/dns-names' in request.annotations) || \
                 request.annotations['podca.dev/dns-names'].split(',')\
                 .all(n, n.trim().endsWith('.' + request.namespace + '.svc'))",
            ),
            None,
        ),
        rule(
            "pcrs_name_a_node",
            Some("request.source == 'pcr' && request.node.name == ''"),
            None,
            None,
        ),
        rule(
            "bound_tokens_only",
            Some("request.source in ['grpc', 'istio'] && request.pod.uid == ''"),
            None,
            None,
        ),
    ]
}

/// The CEL form of `dns_name_templates = ["{pod}.{ns}.svc"]` plus the annotation's names.
const DNS_OUTPUT: &str = "[request.pod.name + '.' + request.namespace + '.svc'] + \
    ('podca.dev/dns-names' in request.annotations \
      ? request.annotations['podca.dev/dns-names'].split(',') \
          .map(n, n.trim().lowerAscii()).filter(n, n != '') \
      : [])";

fn main() {
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

    // The same certificate both ways: the allow-lists' names, or the output's.
    let mut plain = SignerPolicy::permissive("cluster.local");
    plain.dns_name_templates = vec!["{pod}.{ns}.svc".into()];
    plain.allowed_dns_names = vec!["*.{ns}.svc".into()];
    plain.validate_for(SIGNER).unwrap();
    let mut ruled = SignerPolicy::permissive("cluster.local");
    ruled.rules = ten_rules();
    ruled.outputs = OutputSpec {
        dns_names: Some(DNS_OUTPUT.into()),
        max_lifetime_seconds: None,
    };
    ruled.validate_for(SIGNER).unwrap();

    let stub = GeneratedKey::generate(KeyType::EcdsaP256)
        .unwrap()
        .stub_csr_der()
        .unwrap();
    let annotations: BTreeMap<String, String> = [(
        "podca.dev/dns-names".to_string(),
        "api.prod.svc, web.prod.svc".to_string(),
    )]
    .into();
    let labels: BTreeMap<String, String> = [
        ("tier".to_string(), "prod".to_string()),
        ("team".to_string(), "prod".to_string()),
        (
            "kubernetes.io/metadata.name".to_string(),
            "prod".to_string(),
        ),
    ]
    .into();
    let context = RequestContext {
        source: RequestSource::Pcr,
        signer_name: SIGNER,
        pod_uid: Some("0b4c1f52-8c2e-4a55-9d62-5a1e1f3c7d10"),
        node_name: Some("node-1"),
        namespace_labels: Some(&labels),
    };
    let want = ["web-0.prod.svc", "api.prod.svc", "web.prod.svc"];
    let issue = |policy: &SignerPolicy| {
        let request = CertificateRequest {
            key: SubjectKey::from_stub_csr(&stub),
            namespace: "prod".into(),
            service_account: "web".into(),
            pod_name: Some("web-0".into()),
            max_expiration: Some(time::Duration::seconds(86400)),
            requested_lifetime: None,
            user_annotations: annotations.clone(),
        };
        match podca_signer::sign_request_with(policy, &ca, &request, &context, now) {
            Outcome::Issued(cert) => {
                assert_eq!(cert.dns_names, want);
                std::hint::black_box(cert);
            }
            other => panic!("{other:?}"),
        }
    };

    // Alternating windows, so that drift (other load, frequency) hits both alike.
    let (without, with) = common::paired_rates(64, || issue(&plain), || issue(&ruled));

    // The rules and the output alone, per request.
    let facts = RuleFacts {
        source: RequestSource::Pcr,
        signer_name: SIGNER,
        namespace: "prod",
        service_account: "web",
        pod_name: Some("web-0"),
        pod_uid: context.pod_uid,
        node_name: context.node_name,
        key_type: Some("ECDSAP256"),
        requested_lifetime_seconds: Some(86400),
        annotations: &annotations,
        audiences: &[],
        namespace_labels: Some(&labels),
        now: now.unix_timestamp(),
    };
    let decide = || {
        let outputs = ruled.apply_rules_with_outputs(&facts).unwrap();
        std::hint::black_box(outputs);
    };
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        decide();
    }
    const SAMPLES: usize = 50_000;
    let mut times: Vec<Duration> = (0..SAMPLES)
        .map(|_| {
            let start = Instant::now();
            decide();
            start.elapsed()
        })
        .collect();
    times.sort();
    let pick = |q: f64| times[((SAMPLES as f64 * q) as usize).min(SAMPLES - 1)];
    let us = |d: Duration| d.as_secs_f64() * 1e6;

    println!(
        "one core, release build, median of 3 × {}s windows, alternating",
        common::RUN.as_secs()
    );
    println!("issuance/s, allow-lists only:            {without:>10.0}");
    println!("issuance/s, 10 rules + 1 output:         {with:>10.0}");
    println!(
        "throughput cost of the rules:            {:>10.1} %",
        100.0 * (1.0 - with / without)
    );
    println!(
        "rules + output per request ({SAMPLES} requests): p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        us(pick(0.50)),
        us(pick(0.99)),
        us(times[SAMPLES - 1])
    );
}
