//! What CEL policy rules cost: issuance throughput with the allow-lists only and with ten
//! realistic rules added, in the same run, on one core; and the latency the rules add to one
//! request (`SignerPolicy::apply_rules_with_outputs`, i.e. `RuleSet::decide`, alone).
//!
//! The requests are a cluster's, not one request repeated: 1,024 pods (16 namespaces, each
//! with its own labels, × 4 workloads with their own DNS-name annotation × 16 replicas, on 8
//! nodes), every one with its own name and UID, taken in a shuffled order.
//!
//! `cargo bench -p podca-signer --bench rules` prints, each against the allow-lists alone,
//! the two taking turns every 20 ms: the ten rules (the target), the ten rules with remembered decisions
//! turned off (every condition evaluated), and the ten rules with a `dns_names` output in
//! place of the DNS-name template (the output is evaluated for every request: it reads the
//! pod's name). Then the p50, p99 and max of the rules' own time. Targets (issue #19): at most
//! 10 % of issuance throughput and at most 50 µs p99.

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

/// The CEL form of `dns_name_templates = ["{pod}.{ns}.svc"]` plus the annotation's names
/// (which `allowed_dns_names = ["*.{ns}.svc"]` admits).
const DNS_OUTPUT: &str = "[request.pod.name + '.' + request.namespace + '.svc'] + \
    ('podca.dev/dns-names' in request.annotations \
      ? request.annotations['podca.dev/dns-names'].split(',') \
          .map(n, n.trim().lowerAscii()).filter(n, n != '') \
      : [])";

const NAMESPACES: usize = 16;
const WORKLOADS: usize = 4;
const REPLICAS: usize = 16;
const NODES: usize = 8;

/// One pod of the simulated cluster.
struct Pod {
    namespace: String,
    service_account: String,
    name: String,
    uid: String,
    node: String,
    annotations: BTreeMap<String, String>,
    labels: Arc<BTreeMap<String, String>>,
    /// The DNS names its certificate must carry.
    want: Vec<String>,
}

fn cluster() -> Vec<Pod> {
    let mut pods = Vec::new();
    for n in 0..NAMESPACES {
        let namespace = format!("shop-{n}");
        let labels: Arc<BTreeMap<String, String>> = Arc::new(
            [
                ("tier", if n % 2 == 0 { "prod" } else { "staging" }),
                ("team", "shop"),
                ("kubernetes.io/metadata.name", namespace.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        for w in 0..WORKLOADS {
            let service_account = format!("svc{w}");
            let annotations: BTreeMap<String, String> = [(
                "podca.dev/dns-names".to_string(),
                format!(
                    "{service_account}.{namespace}.svc, {service_account}-admin.{namespace}.svc"
                ),
            )]
            .into();
            for r in 0..REPLICAS {
                let i = pods.len();
                let name = format!("{service_account}-{r:02}-{i:04x}");
                pods.push(Pod {
                    want: vec![
                        format!("{name}.{namespace}.svc"),
                        format!("{service_account}.{namespace}.svc"),
                        format!("{service_account}-admin.{namespace}.svc"),
                    ],
                    namespace: namespace.clone(),
                    service_account: service_account.clone(),
                    uid: format!("0b4c1f52-8c2e-4a55-9d62-{i:012x}"),
                    node: format!("node-{}", i % NODES),
                    annotations: annotations.clone(),
                    labels: Arc::clone(&labels),
                    name,
                });
            }
        }
    }
    // A fixed shuffle (an LCG), so that consecutive requests come from different workloads.
    let mut order: Vec<usize> = (0..pods.len()).collect();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..order.len()).rev() {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    let mut slots: Vec<Option<Pod>> = pods.into_iter().map(Some).collect();
    order
        .into_iter()
        .map(|i| slots[i].take().unwrap())
        .collect()
}

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

    // The allow-lists alone; the same with ten rules; the ten rules with the output giving
    // the names instead of the template. All three give the same certificates.
    let mut plain = SignerPolicy::permissive("cluster.local");
    plain.dns_name_templates = vec!["{pod}.{ns}.svc".into()];
    plain.allowed_dns_names = vec!["*.{ns}.svc".into()];
    plain.validate().unwrap();
    let mut ruled = plain.clone();
    ruled.rules = ten_rules();
    ruled.validate().unwrap();
    let plain: &'static SignerPolicy = Box::leak(Box::new(plain));
    let ruled: &'static SignerPolicy = Box::leak(Box::new(ruled));
    let mut output = SignerPolicy::permissive("cluster.local");
    output.rules = ten_rules();
    output.outputs = OutputSpec {
        dns_names: Some(DNS_OUTPUT.into()),
        max_lifetime_seconds: None,
    };
    output.validate().unwrap();
    let output: &'static SignerPolicy = Box::leak(Box::new(output));

    let stub = GeneratedKey::generate(KeyType::EcdsaP256)
        .unwrap()
        .stub_csr_der()
        .unwrap();
    let pods = cluster();
    let issue = |policy: &SignerPolicy, pod: &Pod| {
        let request = CertificateRequest {
            key: SubjectKey::from_stub_csr(&stub),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
            pod_name: Some(pod.name.clone()),
            max_expiration: Some(time::Duration::seconds(86400)),
            requested_lifetime: None,
            user_annotations: pod.annotations.clone(),
        };
        let context = RequestContext {
            source: RequestSource::Pcr,
            signer_name: SIGNER,
            pod_uid: Some(&pod.uid),
            node_name: Some(&pod.node),
            namespace_labels: Some(&pod.labels),
            pod: None,
            renewal: None,
            service_sans: None,
        };
        match podca_signer::sign_request_with(policy, &ca, &request, &context, now) {
            Outcome::Issued(cert) => cert,
            other => panic!("{other:?}"),
        }
    };
    // Every policy gives every pod the certificate it should have.
    for pod in &pods {
        for policy in [plain, ruled, output] {
            assert_eq!(issue(policy, pod).dns_names, pod.want);
        }
    }
    let pods = &pods;
    let issue = &issue;
    let cycling = |policy: &'static SignerPolicy| {
        let mut next = 0usize;
        move || {
            std::hint::black_box(issue(policy, &pods[next % pods.len()]));
            next += 1;
        }
    };

    // Taking turns, so that drift (other load, frequency) hits both alike.
    let ruled_pair = common::paired_rates(64, cycling(plain), cycling(ruled));
    podca_signer::rules::remember_decisions(false);
    let unremembered_pair = common::paired_rates(64, cycling(plain), cycling(ruled));
    podca_signer::rules::remember_decisions(true);
    let output_pair = common::paired_rates(64, cycling(plain), cycling(output));

    // The rules alone, per request.
    let facts: Vec<RuleFacts<'_>> = pods
        .iter()
        .map(|pod| RuleFacts {
            source: RequestSource::Pcr,
            signer_name: SIGNER,
            namespace: &pod.namespace,
            service_account: &pod.service_account,
            pod_name: Some(&pod.name),
            pod_uid: Some(&pod.uid),
            node_name: Some(&pod.node),
            key_type: Some("ECDSAP256"),
            requested_lifetime_seconds: Some(86400),
            annotations: &pod.annotations,
            audiences: &[],
            namespace_labels: Some(&pod.labels),
            pod: None,
            now: now.unix_timestamp(),
        })
        .collect();
    let latencies = |policy: &SignerPolicy| {
        let decide = |f: &RuleFacts<'_>| {
            std::hint::black_box(policy.apply_rules_with_outputs(f).unwrap());
        };
        let warm = Instant::now();
        let mut i = 0;
        while warm.elapsed() < Duration::from_millis(300) {
            decide(&facts[i % facts.len()]);
            i += 1;
        }
        let mut times: Vec<Duration> = (0..SAMPLES)
            .map(|i| {
                let start = Instant::now();
                decide(&facts[i % facts.len()]);
                start.elapsed()
            })
            .collect();
        times.sort();
        times
    };
    let rules_times = latencies(ruled);
    podca_signer::rules::remember_decisions(false);
    let unremembered_times = latencies(ruled);
    podca_signer::rules::remember_decisions(true);
    let output_times = latencies(output);

    // The throughput lost, from the median of the rounds' ratios.
    let cost = |pair: &common::Paired| 100.0 * (1.0 - pair.ratio());
    println!("{} pods; {}", pods.len(), common::method());
    println!(
        "issuance/s, allow-lists only:                     {:>10.0}",
        ruled_pair.a
    );
    println!(
        "issuance/s, + 10 rules:                           {:>10.0}",
        ruled_pair.b
    );
    let (low, high) = ruled_pair.range();
    println!(
        "throughput cost of the 10 rules:                  {:>10.1} %  (target <= 10 %) \
         [{:.1}–{:.1} %]",
        cost(&ruled_pair),
        100.0 * (1.0 - high),
        100.0 * (1.0 - low)
    );
    println!(
        "  the same, decisions not remembered:             {:>10.1} %  ({:.0}/s against {:.0}/s)",
        cost(&unremembered_pair),
        unremembered_pair.b,
        unremembered_pair.a
    );
    println!(
        "  10 rules + dns_names output (no template):      {:>10.1} %  ({:.0}/s against {:.0}/s)",
        cost(&output_pair),
        output_pair.b,
        output_pair.a
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (what, times) in [
        ("10 rules", &rules_times),
        ("10 rules, not remembered", &unremembered_times),
        ("10 rules + output", &output_times),
    ] {
        let pick = |q: f64| times[((SAMPLES as f64 * q) as usize).min(SAMPLES - 1)];
        println!(
            "{what:<26} per request ({SAMPLES} requests): p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            us(pick(0.50)),
            us(pick(0.99)),
            us(times[SAMPLES - 1])
        );
    }
}

const SAMPLES: usize = 50_000;
