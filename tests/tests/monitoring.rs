//! deploy/monitoring/: the Grafana dashboard, the alerting rules (a plain rules file and the
//! same groups as a PrometheusRule) and their promtool unit tests.
//!
//! * Every metric named in a PromQL expression of the dashboard or the alerts is exported by a
//!   running `podca serve` (with a SoftHSM2-held CA key, so that the HSM families are there
//!   too, and one issued request): a renamed metric fails here. The few families that stay
//!   empty until their event (a denial, a retry, …) are checked against their registration in
//!   authority/src/metrics.rs instead ([`EVENT_FAMILIES`]).
//! * `promtool check rules` and `promtool test rules deploy/monitoring/tests/*.yaml` pass; every
//!   alert has a test that fires it and one where it stays silent, a runbook section in
//!   docs/monitoring.md and a runbook_url pointing at it.
//!
//! promtool comes from Debian's `prometheus` package (.ci/run installs it); without it these
//! tests fail, never skip.

// Test code: a panic with a message is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use podca_tests::EmulatorConfig;
use podca_tests::cluster::{Cluster, ClusterConfig};
use podca_tests::emulator::ApiMode;
use podca_tests::process::ServeProcess;
use podca_tests::softhsm::HsmCa;
use serde::Deserialize as _;
use serde_json::Value;

const SIGNER: &str = "example.com/workload";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn monitoring(file: &str) -> PathBuf {
    repo_root().join("deploy/monitoring").join(file)
}

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v = serde_yaml::Value::deserialize(serde_yaml::Deserializer::from_str(&text))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::to_value(v).unwrap()
}

/// The alerting rules of podca-rules.yaml.
fn rules() -> Vec<Value> {
    let file = yaml_file(&monitoring("podca-rules.yaml"));
    let rules: Vec<Value> = file["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .collect();
    assert!(rules.len() >= 8, "only {} rules", rules.len());
    rules
}

fn dashboard() -> Value {
    let path = monitoring("grafana-dashboard.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every PromQL expression of the dashboard: the panels' `expr` and the template variables'
/// queries, wherever they are nested.
fn dashboard_expressions(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, item) in map {
                match (k.as_str(), item) {
                    ("expr" | "definition", Value::String(e)) => out.push(e.clone()),
                    _ => dashboard_expressions(item, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| dashboard_expressions(i, out)),
        _ => {}
    }
}

/// Every expression of the alerts and the dashboard, named by where it comes from.
fn all_expressions() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = rules()
        .iter()
        .map(|r| {
            (
                format!("alert {}", r["alert"].as_str().unwrap()),
                r["expr"].as_str().expect("expr").to_string(),
            )
        })
        .collect();
    let mut exprs = Vec::new();
    dashboard_expressions(&dashboard(), &mut exprs);
    assert!(
        exprs.len() >= 20,
        "only {} dashboard expressions",
        exprs.len()
    );
    out.extend(exprs.into_iter().map(|e| ("dashboard".to_string(), e)));
    out
}

/// The metric names (`podca_…`) an expression refers to.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while i < bytes.len() {
        let starts = (i == 0 || !ident(bytes[i - 1])) && expr[i..].starts_with("podca_");
        if starts {
            let end = (i..bytes.len())
                .find(|&j| !ident(bytes[j]))
                .unwrap_or(bytes.len());
            names.insert(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

/// The series names a `/metrics` page exports, from its `# TYPE` lines (families without a
/// sample yet are there too): counters as `<name>_total`, histograms as `_bucket`, `_sum` and
/// `_count`, everything else by its name.
fn exported_names(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            panic!("bad TYPE line {line:?}")
        };
        match kind {
            "counter" => {
                names.insert(format!("{}_total", name.trim_end_matches("_total")));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// Every (where, metric) an expression names that `exported` does not hold.
fn unknown_metrics(expressions: &[(String, String)], exported: &BTreeSet<String>) -> Vec<String> {
    let mut unknown = Vec::new();
    for (origin, expr) in expressions {
        let names = metric_names(expr);
        if names.is_empty() {
            unknown.push(format!("{origin}: names no podca metric: {expr}"));
        }
        for name in names.difference(exported) {
            unknown.push(format!("{origin}: {name} (in {expr:?})"));
        }
    }
    unknown
}

/// `/metrics` of a running `podca serve` whose CA key is in SoftHSM2 (the core registry and
/// the HSM families), read once the HSM figures are exported.
async fn serve_metrics() -> String {
    let c = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            ..Default::default()
        },
        podca_groups: &["system:authenticated"],
        signers: &[SIGNER],
    })
    .await;
    let t = c.dir.path();
    let HsmCa { conf, pin, dir: ca } = HsmCa::init(t, "metrics");
    let config = t.join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\nbackend = \"pkcs11\"\ndir = {:?}\npkcs11_pin_file = {:?}\n\n\
             [signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n",
            ca.to_str().unwrap(),
            pin.to_str().unwrap()
        ),
    )
    .unwrap();
    let serve = ServeProcess::start(&config, &c.kubeconfig, &[], &[("SOFTHSM2_CONF", &conf)]);
    // One issued request, so that the HSM has signed and every family is in use.
    c.file_pcr("metrics", SIGNER).await;
    c.wait_issued("metrics", Duration::from_secs(30)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = serve.metrics();
        // The leaf, and the gRPC listener's self-issued serving certificate.
        let signatures = metrics
            .lines()
            .find_map(|l| l.strip_prefix("podca_hsm_signatures_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        // The ClusterTrustBundle publisher runs beside the controller: under load the PCR can
        // be issued before its first write, whose counter only then has a series.
        let published = metrics
            .lines()
            .any(|l| l.starts_with("podca_ctb_writes_total{"));
        // The controller counts the request once its status write has returned, a moment
        // after the emulator took the write that `wait_issued` saw.
        let counted = metrics
            .lines()
            .any(|l| l.starts_with("podca_pcr_issued_total{"));
        if signatures >= 1.0 && published && counted {
            return metrics;
        }
        assert!(
            Instant::now() < deadline,
            "podca serve never exported the HSM signature, a trust bundle write and the issued \
             request:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Families that have no series until their event happens (a denial, a failure, a retry, a
/// late write, a rotation step, a gRPC call, a TokenReview, a ledger error, a rejected CA
/// history, a Kubernetes timeout): prometheus-client leaves an empty family out of `/metrics`.
/// For these the registration in the source (name, kind, the file that registers it) stands in
/// for the scrape, so a rename still fails.
const EVENT_FAMILIES: &[(&str, &str, &str)] = &[
    ("pcr_denied", "counter", METRICS_RS),
    ("pcr_failed", "counter", METRICS_RS),
    ("retries", "counter", METRICS_RS),
    ("late_writes", "counter", METRICS_RS),
    ("ca_rotation_steps", "counter", METRICS_RS),
    ("grpc_requests", "counter", METRICS_RS),
    ("grpc_request_duration_seconds", "histogram", METRICS_RS),
    ("grpc_refusals", "counter", METRICS_RS),
    ("grpc_connections_refused", "counter", METRICS_RS),
    ("grpc_tls_handshake_failures", "counter", METRICS_RS),
    ("tokenreview_requests", "counter", METRICS_RS),
    ("tokenreview_duration_seconds", "histogram", METRICS_RS),
    ("tokenreview_cache", "counter", METRICS_RS),
    ("ca_history_rejected", "counter", METRICS_RS),
    ("kube_request_timeouts", "counter", METRICS_RS),
    ("ledger_write_errors", "counter", LEDGER_RS),
    // Per-key JWT gauges: series once a JWT key rotator runs with the registry
    // (`JwtRotator::with_metrics`).
    ("jwt_key_not_after_timestamp_seconds", "gauge", METRICS_RS),
    ("jwt_key_published_timestamp_seconds", "gauge", METRICS_RS),
    // By path and status: series once OIDC discovery (`[jwt] oidc_listen`) answers a request.
    ("oidc_requests", "counter", METRICS_RS),
    // By signer and result: series once a signer with `pod_facts = true` reads a request's pod.
    // Written at each scrape by the policy rule collector (`encode_descriptor`), not registered.
    ("policy_pod_reads", "counter", METRICS_RS),
    // By cause: series once a rendezvous member takes a request over (`cause="takeover"`) or
    // is handed one by a membership change.
    ("controller_handovers", "counter", SHARDING_RS),
    // Per foreign trust domain: series once a `[[federation]]` bundle is in force.
    (
        "federation_last_refresh_timestamp_seconds",
        "gauge",
        FEDERATION_RS,
    ),
];

const METRICS_RS: &str = "authority/src/metrics.rs";
const LEDGER_RS: &str = "authority/src/ledger/mod.rs";
const FEDERATION_RS: &str = "grpc/src/federation_fetch.rs";
const SHARDING_RS: &str = "controller/src/sharding.rs";

/// The files whose metrics are registered in a component's sub-registry (the runtime's
/// `Metrics::register_component`), with that sub-registry's prefix.
const COMPONENT_PREFIXES: &[(&str, &str)] = &[
    (LEDGER_RS, "ledger_"),
    (FEDERATION_RS, "federation_"),
    (SHARDING_RS, "controller_"),
];

/// `# TYPE` lines for [`EVENT_FAMILIES`], each checked to be registered under that name in
/// its file (one registry, prefix `podca_`): `registry.register(`, or a collector's
/// `encode_descriptor(` for the families it writes at each scrape.
fn event_families() -> String {
    let mut page = String::new();
    for (name, kind, file) in EVENT_FAMILIES {
        let source = std::fs::read_to_string(repo_root().join(file)).unwrap();
        // The name the file registers: without its component's prefix, when it has one.
        let local =
            COMPONENT_PREFIXES
                .iter()
                .find(|(f, _)| f == file)
                .map_or(*name, |(_, prefix)| {
                    name.strip_prefix(prefix)
                        .unwrap_or_else(|| panic!("{name:?} lacks its component prefix {prefix:?}"))
                });
        let registered = ["registry.register(", "encoder.encode_descriptor("]
            .iter()
            .flat_map(|call| source.split(call).skip(1))
            .any(|call| call.trim_start().starts_with(&format!("\"{local}\",")));
        assert!(
            registered,
            "{file} registers no metric {name:?} (renamed? update the dashboard, the alerts \
             and EVENT_FAMILIES)"
        );
        page.push_str(&format!("# TYPE podca_{name} {kind}\n"));
    }
    page
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_the_dashboard_and_alerts_is_exported_by_podca_serve() {
    let metrics = serve_metrics().await;
    let mut exported = exported_names(&metrics);
    exported.extend(exported_names(&event_families()));
    // The parse of the page is the check: known families are there under their series names.
    for name in [
        "podca_pcr_issued_total",
        "podca_pcr_settle_seconds_bucket",
        "podca_queue_depth",
        "podca_hsm_signatures_total",
    ] {
        assert!(exported.contains(name), "{name} not read from:\n{metrics}");
    }
    let expressions = all_expressions();
    let unknown = unknown_metrics(&expressions, &exported);
    assert!(
        unknown.is_empty(),
        "metrics that podca serve does not export (renamed? not on main yet?):\n  {}\n\
         exported: {exported:?}",
        unknown.join("\n  ")
    );
    // And the check can fail: a renamed metric is caught.
    let renamed = vec![(
        "renamed".to_string(),
        "rate(podca_pcr_issud_total[5m])".to_string(),
    )];
    assert_eq!(
        unknown_metrics(&renamed, &exported),
        ["renamed: podca_pcr_issud_total (in \"rate(podca_pcr_issud_total[5m])\")"]
    );
}

#[test]
fn metric_names_are_read_from_promql() {
    assert_eq!(
        metric_names(
            "sum by (le) (rate(podca_pcr_settle_seconds_bucket{job=~\"$job\"}[5m])) / \
             x_podca_not(podca_queue_depth)"
        ),
        BTreeSet::from([
            "podca_pcr_settle_seconds_bucket".to_string(),
            "podca_queue_depth".to_string()
        ])
    );
    let page = "# HELP podca_pcr_issued PodCertificateRequests issued.\n\
                # TYPE podca_pcr_issued counter\n\
                # TYPE podca_pcr_settle_seconds histogram\n\
                # TYPE podca_leader gauge\n";
    assert_eq!(
        exported_names(page),
        BTreeSet::from(
            [
                "podca_pcr_issued_total",
                "podca_pcr_settle_seconds_bucket",
                "podca_pcr_settle_seconds_sum",
                "podca_pcr_settle_seconds_count",
                "podca_leader"
            ]
            .map(String::from)
        )
    );
}

/// promtool, or a failure that says how to get it.
fn promtool(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool is required ({e}): apt-get install -y prometheus (Debian's package \
                 ships promtool; .ci/run installs it)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn promtool_checks_the_rules_and_passes_their_unit_tests() {
    let rules_file = monitoring("podca-rules.yaml");
    let text = promtool(&["check".as_ref(), "rules".as_ref(), rules_file.as_os_str()]);
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", rules().len())),
        "{text}"
    );
    let mut tests: Vec<PathBuf> = std::fs::read_dir(monitoring("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    tests.sort();
    assert!(
        !tests.is_empty(),
        "no promtool tests in deploy/monitoring/tests"
    );
    let mut args: Vec<&std::ffi::OsStr> = vec!["test".as_ref(), "rules".as_ref()];
    args.extend(tests.iter().map(|p| p.as_os_str()));
    let text = promtool(&args);
    assert!(text.contains("SUCCESS"), "{text}");
    assert!(!text.contains("FAILED"), "{text}");
}

#[test]
fn every_alert_has_a_firing_and_a_silent_test() {
    // alertname -> (some test expects it to fire, some test expects silence)
    let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for entry in std::fs::read_dir(monitoring("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "yaml") {
            continue;
        }
        let file = yaml_file(&path);
        for test in file["tests"].as_array().expect("tests") {
            for art in test["alert_rule_test"].as_array().into_iter().flatten() {
                let name = art["alertname"].as_str().unwrap().to_string();
                let fires = art["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
                let e = seen.entry(name).or_default();
                if fires {
                    e.0 = true;
                } else {
                    e.1 = true;
                }
            }
        }
    }
    for rule in rules() {
        let name = rule["alert"].as_str().expect("only alerting rules");
        let (fires, silent) = seen.get(name).copied().unwrap_or_default();
        assert!(fires, "{name}: no promtool test fires it");
        assert!(
            silent,
            "{name}: no promtool test checks that it stays silent"
        );
    }
}

/// GitHub's anchor for a Markdown heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_runbook_section_and_labels() {
    let guide = std::fs::read_to_string(repo_root().join("docs/monitoring.md")).unwrap();
    let anchors: BTreeSet<String> = guide
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    for rule in rules() {
        let name = rule["alert"].as_str().unwrap();
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        let ann = &rule["annotations"];
        for key in ["summary", "description"] {
            assert!(
                ann[key].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: no {key}"
            );
        }
        let url = ann["runbook_url"].as_str().unwrap_or_default();
        let section = url
            .strip_prefix("docs/monitoring.md#")
            .unwrap_or_else(|| panic!("{name}: runbook_url {url:?} is not in docs/monitoring.md"));
        assert_eq!(
            section,
            name.to_lowercase(),
            "{name}: the section is named after the alert"
        );
        assert!(
            anchors.contains(section),
            "{name}: docs/monitoring.md has no section #{section}"
        );
    }
}

#[test]
fn the_prometheus_rule_carries_exactly_the_rules_file() {
    let plain = yaml_file(&monitoring("podca-rules.yaml"));
    let cr = yaml_file(&monitoring("prometheusrule.yaml"));
    assert_eq!(cr["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(cr["kind"], "PrometheusRule");
    assert_eq!(cr["metadata"]["namespace"], "podca-system");
    assert_eq!(
        cr["spec"]["groups"], plain["groups"],
        "deploy/monitoring/prometheusrule.yaml differs from podca-rules.yaml: copy the groups over"
    );
}

#[test]
fn the_dashboard_expressions_are_valid_promql() {
    // promtool parses each one as a recording rule (Grafana's variables replaced by values).
    let mut exprs = Vec::new();
    dashboard_expressions(&dashboard(), &mut exprs);
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        if e.starts_with("label_values(") {
            continue;
        }
        let e = e.replace("$__rate_interval", "5m").replace("$job", ".*");
        file.push_str(&format!(
            "      - record: dashboard:expr_{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&path, file).unwrap();
    let text = promtool(&["check".as_ref(), "rules".as_ref(), path.as_os_str()]);
    assert!(text.contains("SUCCESS"), "{text}");
    // The dashboard's own shape: unique panel ids, a data source variable.
    let d = dashboard();
    assert_eq!(d["uid"], "podca-overview");
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "duplicate panel id {}",
            p["id"]
        );
    }
}
