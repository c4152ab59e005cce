//! The Helm chart deploy/helm/podca: `helm lint --strict`, each example values file rendered
//! with the real helm and held to the same checks as the kustomize overlays (typed parsing,
//! RBAC, pod security, NetworkPolicy, config), goldens in deploy/helm/golden/, and the values
//! schema refusing unknown and ill-typed values.
//!
//! helm: `PODCA_HELM`, else the cache of deploy/tools/install-helm.sh. Missing helm is a
//! failure, never a skip.

use std::ffi::OsStr;
use std::process::Command;

use podca_authority::config::Config;

use crate::config::{check_config, config, config_text};
use crate::network::check_network;
use crate::objects::{pod_spec, the_deployment};
use crate::rbac::{
    ca_secrets, check_rbac, check_rbac_signers, check_tenants, check_two_signers, expected_for,
    jwt_keys_secret,
};
use crate::render::{
    CHART, documents, helm, helm_example, helm_template, kind_of, name_of, render_helm, repo_root,
};
use crate::strict::{Rendered, parse_all, parse_overlay};
use crate::workload::{check_pod_locked_down, check_replicas};
use crate::{
    HELM_EXAMPLES, NAMESPACE, OVERLAYS, SIGNER, TENANT_SIGNERS, TENANTS, TWO_SIGNERS, signers_of,
};

const HELM_UPDATE_HINT: &str =
    "PODCA_UPDATE_GOLDEN=1 cargo test -p podca-tests --test deploy_manifests helm";

/// Every object of a Helm rendering, parsed strictly into its Kubernetes type.
pub fn parse_helm_yaml(what: &str, yaml: &str) -> Rendered {
    let docs = documents(yaml);
    for doc in &docs {
        let cluster_scoped = matches!(kind_of(doc).1, "ClusterRole" | "ClusterRoleBinding");
        let ns = doc["metadata"]["namespace"].as_str();
        let expected = (!cluster_scoped).then_some(NAMESPACE);
        assert_eq!(ns, expected, "{what}: {}", name_of(doc));
    }
    parse_all(&docs).unwrap_or_else(|errors| {
        panic!(
            "{what}: objects that do not match their Kubernetes 1.37 schema:\n  {}",
            errors.join("\n  ")
        )
    })
}

pub fn parse_helm(example: &str) -> Rendered {
    parse_helm_yaml(&format!("helm {example}"), &render_helm(example))
}

/// `helm template` with extra values given as YAML text (written to a values file).
pub fn helm_with_values(values: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    helm_template(&["--values".as_ref(), file.as_os_str()])
}

#[test]
fn helm_lint_strict_passes_for_the_chart_and_every_example() {
    let out = Command::new(helm()).arg("version").output().unwrap();
    assert!(out.status.success(), "helm version failed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Version:\"v"), "unexpected: {text}");
    let chart = repo_root().join(CHART);
    let mut runs: Vec<Vec<&OsStr>> = vec![vec![]];
    let examples: Vec<_> = HELM_EXAMPLES.iter().map(|e| helm_example(e)).collect();
    for e in &examples {
        runs.push(vec!["--values".as_ref(), e.as_os_str()]);
    }
    for extra in runs {
        let out = Command::new(helm())
            .args(["lint", "--strict"])
            .arg(&chart)
            .args(&extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm lint --strict {extra:?}:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_helm_example_passes_the_kustomize_checks() {
    for example in HELM_EXAMPLES {
        let what = format!("helm {example}");
        let r = parse_helm(example);
        assert!(
            r.namespaces.is_empty(),
            "{what}: the release namespace is not the chart's"
        );
        assert!(r.custom.is_empty(), "{what}: CRD objects by default");
        assert_eq!(r.service_accounts.len(), 1, "{what}: one ServiceAccount");
        assert_eq!(r.services.len(), 1, "{what}: one Service");
        assert_eq!(r.network_policies.len(), 1, "{what}: one NetworkPolicy");
        check_config(&what, example, &r);
        check_network(&what, &r);
        check_pod_locked_down(&what, &r);
        check_replicas(&what, example, &r);
        check_rbac_signers(&what, &r, &signers_of(example));
        if *example == "two-signers" {
            check_two_signers(&what, &r);
        }
        if *example == "tenants" {
            check_tenants(&what, &r);
        }
    }
}

#[test]
fn helm_and_kustomize_grant_exactly_the_same_permissions() {
    for flavour in OVERLAYS {
        // check_rbac holds each rendering to exactly its expected grants; equal expectations
        // make the two exactly as tight.
        let kustomize = expected_for(&parse_overlay(flavour));
        let chart = expected_for(&parse_helm(flavour));
        assert_eq!(
            kustomize, chart,
            "{flavour}: helm and kustomize RBAC differ"
        );
    }
}

#[test]
fn helm_config_matches_the_kustomize_config() {
    // The same settings, whatever the order of keys and comments: the kustomize config parsed
    // as TOML equals the chart's, apart from what only one of them writes.
    for flavour in OVERLAYS {
        let k: toml::Table = toml::from_str(&config_text(&parse_overlay(flavour))).unwrap();
        let mut h: toml::Table = toml::from_str(&config_text(&parse_helm(flavour))).unwrap();
        // The chart writes IssueForPod's (empty) list explicitly.
        let grpc = h["grpc"].as_table_mut().unwrap();
        assert_eq!(
            grpc.remove("node_proxy_service_accounts"),
            Some(toml::Value::Array(vec![]))
        );
        assert_eq!(k, h, "{flavour}: the rendered configs differ");
    }
}

#[test]
fn helm_renderings_match_the_golden_files() {
    let update = std::env::var_os("PODCA_UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for example in HELM_EXAMPLES {
        let rendered = render_helm(example);
        let path = repo_root()
            .join("deploy/helm/golden")
            .join(format!("{example}.yaml"));
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &rendered).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        if golden != rendered {
            let first = golden
                .lines()
                .zip(rendered.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| golden.lines().count().min(rendered.lines().count()));
            stale.push(format!(
                "{}: differs from `helm template podca {CHART} -n {NAMESPACE} -f \
                 {CHART}/examples/{example}.yaml` from line {} (golden: {:?}, rendered: {:?})",
                path.display(),
                first + 1,
                golden.lines().nth(first).unwrap_or("<end>"),
                rendered.lines().nth(first).unwrap_or("<end>")
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nIf the change is intended, update the golden files with:\n  {HELM_UPDATE_HINT}",
        stale.join("\n")
    );
}

#[test]
fn the_values_schema_refuses_unknown_and_ill_typed_values() {
    let schema_error = "values don't meet the specifications of the schema(s)";
    let cases: &[(&str, &str, &str)] = &[
        (
            "unknown top-level key",
            "replicas: 2\n",
            "at '': additional properties 'replicas' not allowed",
        ),
        (
            "unknown config key (a typo podca would refuse at start)",
            "config:\n  grpc:\n    token_audiense: podca\n",
            "at '/config/grpc': additional properties 'token_audiense' not allowed",
        ),
        (
            "unknown signer policy key",
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      max_lifetime: 3600\n",
            "additional properties 'max_lifetime' not allowed",
        ),
        (
            "[ca] comes from the chart, not from config",
            "config:\n  ca:\n    backend: file\n",
            "at '/config': additional properties 'ca' not allowed",
        ),
        (
            "[cas] come from the chart's cas, not from config",
            "config:\n  cas:\n    payments:\n      backend: secret\n",
            "at '/config': additional properties 'cas' not allowed",
        ),
        (
            "a CA named default (that is `ca`)",
            "cas:\n  default:\n    secretName: ca-default\n",
            "invalid propertyName 'default'",
        ),
        (
            "a CA name podca refuses",
            "cas:\n  Payments:\n    secretName: ca-payments\n",
            "invalid propertyName 'Payments'",
        ),
        (
            "a CA without its Secret",
            "cas:\n  payments: {}\n",
            "at '/cas/payments': missing property 'secretName'",
        ),
        (
            "a CA with another backend's key",
            "cas:\n  payments:\n    secretName: ca-payments\n    dir: /var/lib/podca\n",
            "at '/cas/payments': additional properties 'dir' not allowed",
        ),
        (
            "a signer naming a CA by a name podca refuses",
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      \
             ca: Payments\n",
            "at '/config/signers/example.com~1workload/ca': 'Payments' does not match pattern",
        ),
        (
            "wrong type",
            "replicaCount: two\n",
            "at '/replicaCount': got string, want integer",
        ),
        (
            "wrong type in the config",
            "config:\n  controller:\n    workers: \"8\"\n",
            "at '/config/controller/workers': got string, want integer",
        ),
        (
            "a fractional number where podca wants an integer",
            "config:\n  controller:\n    workers: 1.5\n",
            "at '/config/controller/workers': got number, want integer",
        ),
        (
            "wrong type in a [grpc] key of this release",
            "config:\n  grpc:\n    token_cache_seconds: \"60\"\n",
            "at '/config/grpc/token_cache_seconds': got string, want integer",
        ),
        (
            "a [grpc] key above the bound podca enforces",
            "config:\n  grpc:\n    token_cache_seconds: 601\n",
            "at '/config/grpc/token_cache_seconds': maximum",
        ),
        (
            "unknown key type",
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      key_types: [ECDSA]\n",
            "key_types/0': value must be one of",
        ),
        (
            "unknown CA backend",
            "ca:\n  backend: file\n",
            "at '/ca/backend': value must be one of 'secret', 'pkcs11'",
        ),
        (
            "a module path that is not absolute",
            "ca:\n  pkcs11:\n    module: lib/libpkcs11.so\n",
            "at '/ca/pkcs11/module'",
        ),
    ];
    for (what, values, expected) in cases {
        let err = helm_with_values(values)
            .map(|_| ())
            .expect_err(&format!("{what}: the schema must refuse:\n{values}"));
        assert!(
            err.contains(schema_error) && err.contains(expected),
            "{what}: expected {expected:?} in helm's error:\n{err}"
        );
    }
    // The cases are refusals of the values, not of the YAML: without the bad key, it renders.
    helm_with_values("replicaCount: 1\n").expect("a valid values file renders");
}

#[test]
fn the_chart_refuses_two_replicas_without_leader_election() {
    let err = helm_with_values("replicaCount: 2\n").expect_err("two writers");
    assert!(
        err.contains("replicaCount > 1 needs leaderElection.enabled=true"),
        "{err}"
    );
}

#[test]
fn the_chart_refuses_a_ledger_podca_could_not_open() {
    let postgres = "config:\n  ledger:\n    backend: postgres\n";
    let url = "ledger:\n  postgresUrlSecret:\n    name: pg\n";
    let cases = [
        (
            "config:\n  ledger:\n    backend: redb\n".to_string(),
            "config.ledger.backend=redb needs a persistent volume",
        ),
        (
            postgres.to_string(),
            "config.ledger.backend=postgres needs ledger.postgresUrlSecret.name",
        ),
        (
            format!("{postgres}{url}"),
            "config.ledger.tls=verify-full needs the CA that verifies the server",
        ),
        (
            format!("{postgres}    tls: disable\n    url_file: /u\n{url}"),
            "config.ledger.url_file is set by the chart",
        ),
    ];
    for (values, expected) in &cases {
        let err = helm_with_values(values).expect_err(&format!("must refuse:\n{values}"));
        assert!(err.contains(expected), "expected {expected:?}:\n{err}");
    }
    // Without a CA Secret, tls = disable (a Unix socket or loopback) renders: the URL file only.
    let yaml = helm_with_values(&format!("{postgres}    tls: disable\n{url}")).expect("renders");
    let r = parse_helm_yaml("helm postgres tls disable", &yaml);
    check_config("helm postgres tls disable", "ha", &r);
    assert!(
        !yaml.contains("ledger-ca"),
        "no CA volume without postgresCaSecret"
    );
}

#[test]
fn a_value_the_schema_accepts_but_podca_refuses_fails_podcas_parser() {
    // The schema checks types; podca's own parser checks the rest (here a default lifetime
    // above the maximum): the pod would not start, with this error.
    let yaml = helm_with_values(
        "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      \
         default_lifetime_seconds: 90000\n      max_lifetime_seconds: 86400\n",
    )
    .expect("the schema accepts it");
    let r = parse_helm_yaml("helm lifetimes", &yaml);
    let err = format!(
        "{:#}",
        Config::parse(&config_text(&r)).expect_err("podca refuses it")
    );
    assert!(err.contains("signer \"example.com/workload\""), "{err}");
}

#[test]
fn the_toml_writer_keeps_every_value_kind() {
    // Helm hands numbers to templates as floats; the chart writes whole numbers as integers,
    // the rest as floats, and strings escaped.
    let yaml = helm_with_values(
        "config:\n  grpc:\n    token_audience: \"a \\\"quoted\\\" \\\\ <é> aud\"\n    \
         rate_limit_per_identity: 4294967295\n  rotation:\n    prepare_at: 0.4\n    \
         activate_at: 0.75\n    ca_lifetime_seconds: 31536000\n  trust_bundles:\n    \
         publish: false\n    suffix: live\n",
    )
    .expect("renders");
    let r = parse_helm_yaml("helm value kinds", &yaml);
    let cfg = config(&r);
    assert_eq!(cfg.grpc.token_audience, "a \"quoted\" \\ <é> aud");
    assert_eq!(cfg.grpc.rate_limit_per_identity, u32::MAX);
    assert_eq!(cfg.rotation.prepare_at, 0.4);
    assert_eq!(cfg.rotation.activate_at, 0.75);
    assert_eq!(cfg.rotation.ca_lifetime_seconds, 31_536_000);
    assert!(!cfg.trust_bundles.publish);
    assert_eq!(cfg.trust_bundles.suffix, "live");
}

#[test]
fn the_grpc_limits_and_authorization_keys_reach_podca() {
    let yaml = helm_with_values(
        "config:\n  grpc:\n    signers: [example.com/workload]\n    max_token_reviews: 16\n    \
         token_cache_seconds: 600\n    max_dns_names: 4\n    max_connections_per_peer: 8\n    \
         max_connections: 512\n    mtls_renewal: false\n",
    )
    .expect("the schema accepts every [grpc] key");
    let grpc = config(&parse_helm_yaml("helm grpc keys", &yaml)).grpc;
    assert_eq!(grpc.signers.as_deref(), Some(&[SIGNER.to_string()][..]));
    assert_eq!(grpc.max_token_reviews, 16);
    assert_eq!(grpc.token_cache_seconds, 600);
    assert_eq!(grpc.max_dns_names, 4);
    assert_eq!(grpc.max_connections_per_peer.get(), 8);
    assert_eq!(grpc.max_connections.get(), 512);
    assert!(!grpc.mtls_renewal);
}

/// `leaderElection.sharding: rendezvous`: three replicas, `--sharding=rendezvous`, and the
/// member Leases' grants, the same as kustomize's ha overlay with deploy/components/sharding;
/// `leader` (the default) renders neither, and other values are refused.
#[test]
fn helm_sharding_renders_the_flag_and_the_member_lease_grants() {
    let values = "replicaCount: 3\nleaderElection:\n  enabled: true\n  sharding: rendezvous\n";
    let r = check_helm_values("helm sharding", "ha", values);
    check_replicas("helm sharding", "ha-sharded", &r);
    check_rbac("helm sharding", &r);
    let kustomize = parse_all(&documents(&crate::render::render_overlay_with(
        "ha",
        &["deploy/components/sharding"],
        None,
    )))
    .expect("ha + sharding parses");
    assert_eq!(expected_for(&r), expected_for(&kustomize));
    let ha = render_helm("ha");
    assert!(
        !ha.contains("--sharding") && !ha.contains(r#"verbs: ["list", "patch", "delete"]"#),
        "{ha}"
    );
    let err = helm_with_values("leaderElection:\n  enabled: true\n  sharding: all\n")
        .expect_err("not a mode");
    assert!(err.contains("sharding"), "{err}");
}

#[test]
fn helm_grants_subjectaccessreviews_only_with_metrics_auth_kubernetes() {
    let yaml = helm_with_values("config:\n  admin:\n    metrics_auth: kubernetes\n")
        .expect("the schema accepts config.admin.metrics_auth");
    let r = parse_helm_yaml("helm metrics_auth", &yaml);
    assert_eq!(
        config(&r).admin.metrics_auth,
        podca_authority::config::MetricsAuthMode::Kubernetes
    );
    // Exactly the expected grants: the base ones plus `create` on subjectaccessreviews.
    check_rbac("helm metrics_auth", &r);
    assert!(
        yaml.contains("resources: [\"subjectaccessreviews\"]"),
        "{yaml}"
    );
    for example in OVERLAYS {
        assert!(
            !render_helm(example).contains("subjectaccessreviews"),
            "helm {example}"
        );
    }
    let err =
        helm_with_values("config:\n  admin:\n    metrics_auth: token\n").expect_err("not a mode");
    assert!(err.contains("metrics_auth"), "{err}");
    let err = helm_with_values("config:\n  admin:\n    listen: 0.0.0.0:1\n")
        .expect_err("the chart sets listen from its port");
    assert!(err.contains("listen"), "{err}");
}

#[test]
fn the_admin_and_oidc_ports_admit_the_peers_the_values_name() {
    let yaml = helm_with_values(
        "networkPolicy:\n  metricsFrom:\n    - namespaceSelector:\n        matchLabels:\n          \
         team: observability\n      podSelector:\n        matchLabels:\n          \
         app: prometheus\n  oidcFrom: []\n",
    )
    .expect("the schema accepts NetworkPolicy peers");
    let r = parse_helm_yaml("helm peers", &yaml);
    let ingress = r.network_policies[0]
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .expect("ingress rules");
    let from_of = |port: i32| {
        let rule = ingress
            .iter()
            .find(|r| {
                r.ports.iter().flatten().any(|p| {
                    p.port
                        == Some(
                            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port),
                        )
                })
            })
            .unwrap_or_else(|| panic!("a rule for port {port}"));
        serde_json::to_value(&rule.from).expect("peers serialize")
    };
    assert_eq!(
        from_of(crate::ADMIN_PORT),
        serde_json::json!([{
            "namespaceSelector": {"matchLabels": {"team": "observability"}},
            "podSelector": {"matchLabels": {"app": "prometheus"}},
        }])
    );
    assert_eq!(
        from_of(crate::OIDC_PORT),
        serde_json::Value::Null,
        "an empty oidcFrom admits every pod: no `from`"
    );
    let refused = helm_with_values("networkPolicy:\n  metricsFrom:\n    - {}\n")
        .expect_err("an empty peer would admit everyone");
    assert!(refused.contains("metricsFrom"), "{refused}");
}

#[test]
fn helm_grants_pods_get_only_with_issue_for_pod_callers() {
    let grants_pods = |r: &Rendered| {
        expected_for(r)
            .iter()
            .any(|(_, group, res, verb, _)| group.is_empty() && res == "pods" && verb == "get")
    };
    for example in OVERLAYS {
        assert!(!grants_pods(&parse_helm(example)), "helm {example}");
    }
    let yaml = helm_with_values(
        "config:\n  grpc:\n    node_proxy_service_accounts: [kube-system/node-proxy]\n",
    )
    .expect("renders");
    let r = parse_helm_yaml("helm issue-for-pod", &yaml);
    check_rbac("helm issue-for-pod", &r);
    assert!(grants_pods(&r), "pods get with IssueForPod callers");
    assert_eq!(
        config(&r).grpc.node_proxy_service_accounts,
        ["kube-system/node-proxy"]
    );
    let rendered = r.cluster_roles[0].rules.as_ref().unwrap();
    assert!(
        rendered
            .iter()
            .any(|rule| rule.resources.as_deref() == Some(&["pods".to_string()][..])),
        "the ClusterRole has the pods rule"
    );
}

#[test]
fn helm_renders_rules_and_grants_namespaces_only_when_a_rule_reads_their_labels() {
    let rules = |expr: &str| {
        format!(
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      \
             rules:\n        - name: gate\n          require: \"{expr}\"\n          \
             reason: Gated\n          message: \"'no'\"\n"
        )
    };
    let yaml = helm_with_values(&rules("request.namespace != 'x'")).expect("renders");
    let r = parse_helm_yaml("helm rules", &yaml);
    check_rbac("helm rules", &r);
    let policy = &config(&r).signers[SIGNER];
    assert_eq!(policy.rules.len(), 1);
    assert_eq!(
        policy.rules[0].require.as_deref(),
        Some("request.namespace != 'x'")
    );
    assert_eq!(policy.rules[0].message.as_deref(), Some("'no'"));
    assert!(!policy.rules_use_namespace_labels());
    let yaml = helm_with_values(&rules("namespaceObject.metadata.labels.tier == 'prod'"))
        .expect("renders");
    let r = parse_helm_yaml("helm namespace-label rule", &yaml);
    check_rbac("helm namespace-label rule", &r);
    assert!(config(&r).signers[SIGNER].rules_use_namespace_labels());
    let rendered = r.cluster_roles[0].rules.as_ref().unwrap();
    assert!(
        rendered
            .iter()
            .any(|rule| rule.resources.as_deref() == Some(&["namespaces".to_string()][..])),
        "the ClusterRole has the namespaces rule"
    );
    // The schema refuses a reason Kubernetes would refuse.
    let refused = helm_with_values(&rules("true").replace("reason: Gated", "reason: not-a-reason"))
        .expect_err("a reason Kubernetes refuses");
    assert!(
        refused.contains(
            "at '/config/signers/example.com~1workload/rules/0/reason': 'not-a-reason' does not \
             match pattern"
        ),
        "{refused}"
    );
    // CEL outputs render as the signer's `outputs` table; the schema knows only their two keys.
    let outputs = |extra: &str| {
        format!(
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      \
             dns_name_templates: []\n      allowed_dns_names: []\n      \
             outputs:\n        dns_names: \"[request.service_account + '.svc']\"\n        \
             max_lifetime_seconds: \"7200\"\n{extra}"
        )
    };
    let yaml = helm_with_values(&outputs("")).expect("renders");
    let r = parse_helm_yaml("helm outputs", &yaml);
    let policy = &config(&r).signers[SIGNER];
    assert_eq!(
        policy.outputs.dns_names.as_deref(),
        Some("[request.service_account + '.svc']")
    );
    assert_eq!(policy.outputs.max_lifetime_seconds.as_deref(), Some("7200"));
    let refused =
        helm_with_values(&outputs("        lifetime: \"1\"\n")).expect_err("an unknown key");
    assert!(
        refused.contains(
            "at '/config/signers/example.com~1workload/outputs': additional properties \
             'lifetime' not allowed"
        ),
        "{refused}"
    );
}

/// The NOTES of `helm install --dry-run` with the values file `values`.
fn helm_notes(values: &std::path::Path) -> String {
    let out = Command::new(helm())
        .current_dir(repo_root())
        .args([
            "install",
            crate::render::RELEASE,
            CHART,
            "--namespace",
            NAMESPACE,
        ])
        .args(["--dry-run=client", "--values"])
        .arg(values)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helm install --dry-run {}: {}",
        values.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    text.split_once("NOTES:\n")
        .map(|(_, n)| n.to_string())
        .unwrap_or_default()
}

#[test]
fn the_notes_say_what_to_do_next() {
    for example in HELM_EXAMPLES {
        let notes = helm_notes(&helm_example(example));
        let secrets: Vec<String> = match *example {
            "hsm" => vec!["create secret generic podca-ca".into()],
            "two-signers" => TWO_SIGNERS
                .iter()
                .map(|(_, _, secret)| {
                    format!("create secret generic {secret} --type=kubernetes.io/tls")
                })
                .collect(),
            "tenants" => TENANT_SIGNERS
                .iter()
                .map(|(_, _, secret)| *secret)
                .chain(TENANTS.iter().map(|t| t.secret))
                .map(|secret| format!("create secret generic {secret} --type=kubernetes.io/tls"))
                .collect(),
            _ => vec!["create secret generic podca-ca --type=kubernetes.io/tls".into()],
        };
        // The bundle a pod projects is its signer's: the first signer name.
        let signer = format!(
            "- podCertificate:\n                 signerName: {}",
            signers_of(example)[0]
        );
        for expected in secrets.iter().map(String::as_str).chain([
            "pod-security.kubernetes.io/enforce=restricted",
            signer.as_str(),
            "podca.dev/instance: podca",
            "rollout status deployment/podca",
        ]) {
            assert!(
                notes.contains(expected),
                "helm {example}: NOTES lack {expected:?}:\n{notes}"
            );
        }
        if matches!(*example, "two-signers" | "tenants") {
            // No Secret for `ca`, which no signer uses.
            assert!(
                !notes.contains("podca-ca"),
                "{example}: NOTES name podca-ca:\n{notes}"
            );
        }
        // With tenants: a tenant's pod selects its tenant's bundle; without, no word of it.
        let tenant_selector = format!(
            "signerName: {}\n                 labelSelector:\n                   \
             matchLabels:\n                     app.kubernetes.io/managed-by: podca\n                     \
             podca.dev/instance: podca\n                     podca.dev/tenant: {}\n",
            TENANTS[0].signer, TENANTS[0].name
        );
        assert_eq!(
            notes.contains(&tenant_selector),
            *example == "tenants",
            "helm {example}: the tenant's selector in the NOTES:\n{notes}"
        );
        let ledger = if *example == "ha-postgres" {
            "create secret generic podca-ledger-postgres \\\n       \
             --from-literal=url='postgres://podca:PASSWORD@HOST:5432/podca' \\\n       \
             --from-file=ca.crt=<CA bundle>"
        } else {
            "config.ledger.backend: none): decisions go to the logs only"
        };
        assert!(
            notes.contains(ledger),
            "helm {example}: NOTES lack {ledger:?}:\n{notes}"
        );
        if *example == "hsm" {
            assert!(
                notes.contains("create secret generic podca-pkcs11-pin"),
                "{notes}"
            );
            assert!(
                !notes.contains("tls.key"),
                "hsm: no key file in a Secret:\n{notes}"
            );
        }
    }
}

#[test]
fn helm_grants_pods_get_when_a_signer_sets_pod_facts_by_the_flag_alone() {
    // The ClusterRole's rules on core pods, as (verbs) in order.
    let pod_rules = |r: &Rendered| -> Vec<Vec<String>> {
        r.cluster_roles[0]
            .rules
            .as_ref()
            .unwrap()
            .iter()
            .filter(|rule| {
                rule.api_groups.as_deref() == Some(&[String::new()][..])
                    && rule.resources.as_deref() == Some(&["pods".to_string()][..])
            })
            .map(|rule| {
                assert_eq!(rule.resource_names, None, "pods by any name");
                rule.verbs.clone()
            })
            .collect()
    };
    let signer = |extra: &str| {
        format!(
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n{extra}"
        )
    };
    let reads_the_pod = "      rules:\n        - name: labelled\n          \
         require: \"pod.labels['certs.example.com/allowed'] == 'true'\"\n          \
         reason: PodNotLabelled\n";
    for example in OVERLAYS {
        assert_eq!(
            pod_rules(&parse_helm(example)),
            [] as [Vec<String>; 0],
            "helm {example}"
        );
    }
    // pod_facts: true, with a rule that reads the pod: `pods get`, nothing more.
    let yaml = helm_with_values(&signer(&format!("      pod_facts: true\n{reads_the_pod}")))
        .expect("renders");
    let r = parse_helm_yaml("helm pod_facts", &yaml);
    check_rbac("helm pod_facts", &r);
    assert_eq!(pod_rules(&r), [["get"]]);
    let policy = &config(&r).signers[SIGNER];
    assert!(policy.pod_facts && policy.rules_use_pod_facts());
    // By the flag, not the rules' text: the flag without a rule that reads the pod still grants
    // (podca reads no pod then, but the grant follows the setting the operator wrote) ...
    let r = parse_helm_yaml(
        "helm pod_facts, no pod rule",
        &helm_with_values(&signer("      pod_facts: true\n")).expect("renders"),
    );
    check_rbac("helm pod_facts, no pod rule", &r);
    assert_eq!(pod_rules(&r), [["get"]]);
    // ... and the words in a rule without the flag grant nothing.
    let words = "      pod_facts: false\n      rules:\n        - name: words\n          \
         require: \"request.namespace != 'pod_facts: true pod.labels'\"\n          \
         reason: Words\n";
    let r = parse_helm_yaml(
        "helm pod_facts false",
        &helm_with_values(&signer(words)).expect("renders"),
    );
    check_rbac("helm pod_facts false", &r);
    assert_eq!(pod_rules(&r), [] as [Vec<String>; 0]);
    assert!(!config(&r).signers[SIGNER].pod_facts);
    // With IssueForPod callers as well: one rule, IssueForPod's `get, list`, which covers it.
    let both = format!(
        "{}  grpc:\n    node_proxy_service_accounts: [kube-system/node-proxy]\n",
        signer(&format!("      pod_facts: true\n{reads_the_pod}"))
    );
    let r = parse_helm_yaml(
        "helm pod_facts + issue-for-pod",
        &helm_with_values(&both).expect("renders"),
    );
    check_rbac("helm pod_facts + issue-for-pod", &r);
    assert_eq!(pod_rules(&r), [["get", "list"]], "no duplicate pods rule");
    // The schema: a boolean, nothing else.
    let err = helm_with_values(&signer("      pod_facts: \"yes\"\n")).expect_err("a string");
    assert!(
        err.contains("pod_facts': got string, want boolean"),
        "{err}"
    );
}

#[test]
fn helm_grants_pods_and_services_get_when_a_signer_has_service_ca() {
    // The ClusterRole's rules on core pods and services, as (resource, verbs) in order.
    let reads = |r: &Rendered| -> Vec<(String, Vec<String>)> {
        r.cluster_roles[0]
            .rules
            .as_ref()
            .unwrap()
            .iter()
            .filter(|rule| rule.api_groups.as_deref() == Some(&[String::new()][..]))
            .flat_map(|rule| {
                rule.resources
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|res| res == "pods" || res == "services")
                    .map(|res| (res, rule.verbs.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let get = |res: &str| (res.to_string(), vec!["get".to_string()]);
    let signer = |extra: &str| {
        format!(
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n{extra}"
        )
    };
    let r = parse_helm_yaml(
        "helm service_ca",
        &helm_with_values(&signer(
            "      service_ca:\n        cluster_domain: corp.example\n",
        ))
        .expect("renders"),
    );
    check_rbac("helm service_ca", &r);
    assert_eq!(reads(&r), [get("pods"), get("services")]);
    let domain = config(&r).signers[SIGNER]
        .service_ca
        .as_ref()
        .map(|p| p.cluster_domain.clone());
    assert_eq!(domain.as_deref(), Some("corp.example"));
    // An empty table turns it on with the default domain.
    let r = parse_helm_yaml(
        "helm service_ca {}",
        &helm_with_values(&signer("      service_ca: {}\n")).expect("renders"),
    );
    check_rbac("helm service_ca {}", &r);
    assert_eq!(reads(&r), [get("pods"), get("services")]);
    // With pod_facts too: one pods rule.
    let r = parse_helm_yaml(
        "helm service_ca + pod_facts",
        &helm_with_values(&signer("      pod_facts: true\n      service_ca: {}\n"))
            .expect("renders"),
    );
    check_rbac("helm service_ca + pod_facts", &r);
    assert_eq!(reads(&r), [get("pods"), get("services")]);
    // The schema: a table with cluster_domain only.
    let err = helm_with_values(&signer("      service_ca:\n        clusterDomain: x\n"))
        .expect_err("an unknown key");
    assert!(err.contains("clusterDomain"), "{err}");
}

/// The chart with `values`, parsed; its config, RBAC and pod checked as every example's.
pub fn check_helm_values(what: &str, flavour: &str, values: &str) -> Rendered {
    let yaml = helm_with_values(values).unwrap_or_else(|e| panic!("{what}: {e}"));
    let r = parse_helm_yaml(what, &yaml);
    check_config(what, flavour, &r);
    check_pod_locked_down(what, &r);
    r
}

/// The Secret names of a rendering's CA Role rules on `secrets` with resourceNames, and of its
/// rules on `configmaps` with resourceNames (the history ConfigMaps and the JWKS ConfigMap).
fn named_in_roles(r: &Rendered, resource: &str) -> Vec<String> {
    let mut names: Vec<String> = r
        .roles
        .iter()
        .flat_map(|role| role.rules.iter().flatten())
        .filter(|rule| rule.resources.as_deref() == Some(&[resource.to_string()][..]))
        .flat_map(|rule| rule.resource_names.clone().unwrap_or_default())
        .collect();
    names.sort();
    names
}

#[test]
fn helm_gives_a_signer_its_named_ca_beside_the_default_one() {
    // example.com/workload signs with `ca` (podca-ca), example.com/payments with cas.payments.
    // Since issue #47 a values file's signers replace the placeholder: both are given.
    let both = "cas:\n  payments:\n    secretName: ca-payments\n  unused:\n    secretName: ca-unused\n\
                config:\n  signers:\n    example.com/payments:\n      ca: payments\n      \
                trust_domain: payments.example.com\n    example.com/workload:\n      \
                trust_domain: cluster.local\n  grpc:\n    signer: example.com/workload\n";
    let r = check_helm_values("helm default + payments", "default", both);
    let signers = ["example.com/payments", SIGNER];
    check_rbac_signers("helm default + payments", &r, &signers);
    let cfg = config(&r);
    assert_eq!(cfg.ca_of_signer(SIGNER), Some("default"));
    assert_eq!(cfg.ca_of_signer("example.com/payments"), Some("payments"));
    // Both CAs in use are read and granted; cas.unused is written but neither opened nor granted.
    assert_eq!(
        ca_secrets(&cfg),
        [
            (NAMESPACE.to_string(), "podca-ca".to_string()),
            (NAMESPACE.to_string(), "ca-payments".to_string()),
        ]
    );
    assert!(cfg.cas.contains_key("unused"));
    assert_eq!(
        named_in_roles(&r, "secrets"),
        ["ca-payments", "podca-ca", "podca-ca-jwt"],
        "the JWT keys beside the primary CA's Secret only (the [grpc] signer's: podca-ca)"
    );
    assert_eq!(
        named_in_roles(&r, "configmaps"),
        [
            "ca-payments-podca-history",
            "podca-ca-podca-history",
            "podca-jwks"
        ]
    );
    // The [grpc] signer decides the primary CA, and so where the JWT keys are.
    let payments_primary = format!("{both}  grpc:\n    signer: example.com/payments\n");
    let r = check_helm_values("helm payments primary", "default", &payments_primary);
    check_rbac_signers("helm payments primary", &r, &signers);
    assert_eq!(
        jwt_keys_secret(&config(&r)),
        Some((NAMESPACE.to_string(), "ca-payments-jwt".to_string()))
    );
    assert_eq!(
        named_in_roles(&r, "secrets"),
        ["ca-payments", "ca-payments-jwt", "podca-ca"]
    );
    // With the HSM as `ca`: its volumes stay, and the named CA is read through the API.
    let hsm = std::fs::read_to_string(helm_example("hsm")).unwrap();
    let r = check_helm_values(
        "helm hsm + payments",
        "hsm",
        &format!(
            "{hsm}\n{}",
            both.replace("  unused:\n    secretName: ca-unused\n", "")
        ),
    );
    check_rbac_signers("helm hsm + payments", &r, &signers);
    assert_eq!(named_in_roles(&r, "secrets"), ["ca-payments"]);
    assert!(matches!(
        config(&r).ca,
        podca_authority::config::CaConfig::Pkcs11(_)
    ));
}

#[test]
fn helm_leaves_out_the_default_ca_when_no_signer_uses_it() {
    // The two-signers example moved to the HSM backend for `ca`: nothing of the HSM is mounted,
    // written or granted, as no signer signs with `ca`.
    let two = std::fs::read_to_string(helm_example("two-signers")).unwrap();
    let values = format!("{two}\nca:\n  backend: pkcs11\n  secretName: podca-ca\n");
    let r = check_helm_values("helm two-signers, ca pkcs11", "two-signers", &values);
    check_two_signers("helm two-signers, ca pkcs11", &r);
    let volumes: Vec<&str> = pod_spec(the_deployment(&r))
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(volumes, ["config", "tmp"], "no HSM volume");
}

#[test]
fn the_chart_refuses_cas_podca_would_refuse() {
    let cases = [
        (
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      \
             ca: payments\n",
            "config.signers.example.com/workload.ca = payments: no such CA; declare it under cas",
        ),
        (
            "cas:\n  payments:\n    secretName: podca-ca\nconfig:\n  signers:\n    \
             example.com/payments:\n      ca: payments\n      trust_domain: payments.example.com\n    \
             example.com/workload:\n      trust_domain: cluster.local\n  grpc:\n    \
             signer: example.com/workload\n",
            "CAs default and payments are both the Secret podca-ca",
        ),
    ];
    for (values, expected) in cases {
        let err = helm_with_values(values).expect_err(&format!("must refuse:\n{values}"));
        assert!(err.contains(expected), "expected {expected:?}:\n{err}");
    }
    // podca refuses both as well (the chart only says so before the pod starts).
    for text in [
        "[signers.\"a.example/x\"]\ntrust_domain = \"a.example\"\nca = \"payments\"\n",
        "[ca]\nbackend = \"secret\"\nsecret = \"ns/podca-ca\"\n\
         [cas.payments]\nbackend = \"secret\"\nsecret = \"ns/podca-ca\"\n\
         [signers.\"a.example/x\"]\ntrust_domain = \"a.example\"\n\
         [signers.\"b.example/y\"]\ntrust_domain = \"b.example\"\nca = \"payments\"\n",
    ] {
        assert!(Config::parse(text).is_err(), "{text}");
    }
}

/// The shell commands in `text` that start with `prefix` (after indentation, or after `#` in a
/// config file's comment), each with its `\` continuation lines joined, as words.
fn commands(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim_start().trim_start_matches('#').trim();
        let cmd = match current.as_mut() {
            Some(cmd) => {
                cmd.push_str(line);
                cmd
            }
            None if line.starts_with(prefix) => current.insert(line.to_string()),
            None => continue,
        };
        if let Some(rest) = cmd.strip_suffix('\\') {
            *cmd = format!("{rest} ");
        } else {
            out.push(cmd.split_whitespace().map(String::from).collect());
            current = None;
        }
    }
    out
}

/// The value after `flag` in `words`.
fn value_of(words: &[String], flag: &str) -> String {
    let i = words
        .iter()
        .position(|w| w == flag)
        .unwrap_or_else(|| panic!("{flag} missing from {words:?}"));
    words[i + 1].clone()
}

/// The nameConstraints subtrees of the certificate in the PEM file `path`.
fn subtrees_of(path: &std::path::Path) -> podca_signer::constraints::Subtrees {
    let text = std::fs::read(path).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&text).unwrap();
    let cert = pem.parse_x509().unwrap();
    cert.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            x509_parser::extensions::ParsedExtension::NameConstraints(nc) => {
                Some(podca_signer::constraints::Subtrees::from_extension(nc))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{}: no nameConstraints", path.display()))
}

/// Runs every `podca ca init` of the NOTES `notes` with the real podca, in a fresh directory,
/// and checks each CA it makes: it is a tenant CA of `cfg`, its root and issuing certificates
/// carry exactly the nameConstraints podca gives that tenant's CA (`Config::init_constraints`),
/// podca signs the tenant's names with it and refuses every other tenant's, and the files the
/// NOTES then put into the CA's Secret exist. The CA names, in NOTES order.
fn run_tenant_ca_inits(what: &str, notes: &str, cfg: &Config) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let tenants: Vec<(String, String, Vec<String>)> = cfg
        .signers
        .values()
        .flat_map(|policy| {
            policy.tenants().map(|t| {
                (
                    t.ca().to_string(),
                    t.trust_domain(&policy.trust_domain),
                    t.spec.namespaces.clone(),
                )
            })
        })
        .collect();
    let secrets = commands(notes, "kubectl");
    let mut made = Vec::new();
    for words in commands(notes, "podca ca init") {
        let out = Command::new(podca_tests::process::podca_binary())
            .args(&words[1..])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}: {}: {}",
            words.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        let ca = value_of(&words, "--name");
        let ca_dir = dir.path().join(value_of(&words, "--dir"));
        let (_, td, namespaces) = tenants
            .iter()
            .find(|(name, _, _)| *name == ca)
            .unwrap_or_else(|| panic!("{what}: the NOTES constrain {ca}, no tenant's CA"));
        let want = cfg.init_constraints(&ca).unwrap().unwrap();
        let want_uris = Some(want.permitted_uri_hosts.clone()).filter(|u| !u.is_empty());
        for pem in ["generations/1/root.pem", "generations/1/issuing.pem"] {
            let got = subtrees_of(&ca_dir.join(pem));
            assert_eq!(
                got.permitted_dns,
                Some(want.permitted_dns.clone()),
                "{what}: {ca} {pem}"
            );
            assert_eq!(got.permitted_uri_hosts, want_uris, "{what}: {ca} {pem}");
        }
        let issuing = podca_signer::FileStore::new(&ca_dir).load().unwrap();
        assert!(issuing.is_name_constrained(), "{what}: {ca}");
        for ns in namespaces {
            let id = format!("spiffe://{td}/ns/{ns}/sa/web");
            let names = [
                format!("web.{ns}.svc"),
                format!("web.{ns}.svc.cluster.local"),
            ];
            let names = if want
                .permitted_dns
                .iter()
                .any(|d| d.ends_with(".cluster.local"))
            {
                names.to_vec()
            } else {
                names[..1].to_vec()
            };
            issuing
                .check_names(&id, &names)
                .unwrap_or_else(|e| panic!("{what}: {ca} refuses its own tenant's names: {e}"));
        }
        for (other, other_td, other_namespaces) in &tenants {
            if *other == ca {
                continue;
            }
            let own_id = format!("spiffe://{td}/ns/{}/sa/web", namespaces[0]);
            for ns in other_namespaces {
                let name = [format!("web.{ns}.svc")];
                assert!(
                    issuing.check_names(&own_id, &name).is_err(),
                    "{what}: {ca} signs {ns}'s name (of {other})"
                );
            }
            if !want.permitted_uri_hosts.is_empty() {
                let id = format!("spiffe://{other_td}/ns/{}/sa/web", other_namespaces[0]);
                assert!(issuing.check_names(&id, &[]).is_err(), "{what}: {ca} {id}");
            }
        }
        // The Secret of that CA, from the files the init made.
        let secret = cfg.ca_named(&ca).map(|c| match c {
            podca_authority::config::CaConfig::Secret(s) => s.name.clone(),
            other => panic!("{what}: {ca} is not Secret-held: {other:?}"),
        });
        let secret = secret.unwrap();
        let create = secrets
            .iter()
            .find(|w| w.contains(&secret) && w.iter().any(|x| x == "create"))
            .unwrap_or_else(|| panic!("{what}: no command creates the Secret {secret}"));
        let files: Vec<&str> = create
            .iter()
            .filter_map(|w| w.strip_prefix("--from-file="))
            .map(|kv| kv.split_once('=').unwrap().1)
            .collect();
        assert_eq!(files.len(), 3, "{what}: {create:?}");
        for file in files {
            assert!(dir.path().join(file).is_file(), "{what}: {file} missing");
        }
        made.push(ca);
    }
    made
}

#[test]
fn the_notes_make_each_tenant_ca_with_its_tenants_name_constraints() {
    let notes = helm_notes(&helm_example("tenants"));
    let cfg = config(&parse_helm("tenants"));
    let made = run_tenant_ca_inits("helm tenants", &notes, &cfg);
    let tenant_cas: Vec<&str> = TENANTS.iter().map(|t| t.ca).collect();
    assert_eq!(made, tenant_cas, "one constrained CA per tenant");
    // The signers' own CAs carry no constraints: made without them.
    for (_, ca, secret) in TENANT_SIGNERS {
        let line = format!("from `podca ca init --name {ca} --dir ./{secret}`:");
        assert!(notes.contains(&line), "{line}\n{notes}");
    }
    // The overlay's config.toml shows the same command for team-a.
    let overlay =
        std::fs::read_to_string(repo_root().join("deploy/overlays/tenants/config.toml")).unwrap();
    let team_a: Vec<Vec<String>> = commands(&notes, "podca ca init")
        .into_iter()
        .filter(|w| value_of(w, "--name") == TENANTS[0].ca)
        .collect();
    assert_eq!(commands(&overlay, "podca ca init"), team_a);
    // The command parser sees what a shell sees.
    assert_eq!(
        commands("  a b \\\n    c\n# a d\nx\n", "a"),
        [vec!["a", "b", "c"], vec!["a", "d"]]
    );
}

/// Tenants with every key, and `untenanted = "signer"`, on the chart's placeholder signer.
const TENANT_KEYS: &str = "cas:\n  team-x:\n    secretName: ca-team-x\n  ca-y:\n    \
    secretName: ca-y\nconfig:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      untenanted: signer\n      \
    tenants:\n        team-x:\n          namespaces: [x1, x2]\n        team-y:\n          \
    namespaces: [y1]\n          ca: ca-y\n          trust_domain: y.example\n          \
    cluster_domain: c.example\n          uri_constraints: true\n          rules:\n          \
    - name: web_only\n            require: \"request.service_account == 'web'\"\n            \
    reason: WebOnly\n";

#[test]
fn helm_renders_tenants_and_untenanted_as_podca_reads_them() {
    use podca_signer::tenants::{TenantSpec, Untenanted};
    let r = check_helm_values("helm tenant keys", "default", TENANT_KEYS);
    check_rbac_signers("helm tenant keys", &r, &[SIGNER]);
    let cfg = config(&r);
    let policy = &cfg.signers[SIGNER];
    assert_eq!(policy.untenanted, Untenanted::Signer);
    assert_eq!(
        policy.tenants["team-x"],
        TenantSpec {
            namespaces: vec!["x1".into(), "x2".into()],
            trust_domain: None,
            ca: None,
            cluster_domain: None,
            uri_constraints: false,
            rules: vec![],
        }
    );
    assert_eq!(
        policy.tenants["team-y"],
        TenantSpec {
            namespaces: vec!["y1".into()],
            trust_domain: Some("y.example".into()),
            ca: Some("ca-y".into()),
            cluster_domain: Some("c.example".into()),
            uri_constraints: true,
            rules: vec![podca_signer::rules::RuleSpec {
                name: "web_only".into(),
                require: Some("request.service_account == 'web'".into()),
                reason: "WebOnly".into(),
                deny: None,
                message: None,
            }],
        }
    );
    // untenanted = "signer": a namespace in no tenant gets the signer's own CA.
    assert_eq!(policy.tenant_of("default").map(|t| t.is_none()), Ok(true));
    assert_eq!(
        cfg.tenant_cas(),
        [(SIGNER, "team-x", "team-x"), (SIGNER, "team-y", "ca-y")]
    );
    // Each tenant CA is opened and granted beside `ca`, whose Secret keeps the JWT keys.
    assert_eq!(
        ca_secrets(&cfg),
        [
            (NAMESPACE.to_string(), "ca-y".to_string()),
            (NAMESPACE.to_string(), "podca-ca".to_string()),
            (NAMESPACE.to_string(), "ca-team-x".to_string()),
        ]
    );
    assert_eq!(
        named_in_roles(&r, "secrets"),
        ["ca-team-x", "ca-y", "podca-ca", "podca-ca-jwt"]
    );
    assert_eq!(
        named_in_roles(&r, "configmaps"),
        [
            "ca-team-x-podca-history",
            "ca-y-podca-history",
            "podca-ca-podca-history",
            "podca-jwks"
        ]
    );
    // The NOTES' init commands make both tenant CAs with their constraints (team-y's with its
    // cluster domain and its trust domain as a URI constraint).
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, TENANT_KEYS).unwrap();
    let notes = helm_notes(&values);
    assert!(
        notes.contains(
            "--permitted-dns y1.svc --permitted-dns y1.svc.c.example \\\n       \
                        --permitted-trust-domain y.example\n"
        ),
        "{notes}"
    );
    // The first signer has tenants: its generic example selects its own bundle only.
    assert!(
        notes.contains("- {key: podca.dev/tenant, operator: DoesNotExist}"),
        "{notes}"
    );
    assert_eq!(
        run_tenant_ca_inits("helm tenant keys", &notes, &cfg),
        ["ca-y", "team-x"]
    );
}

#[test]
fn the_values_schema_refuses_tenants_podca_would_refuse() {
    let tenant = |body: &str| {
        format!(
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      tenants:\n        team-a:\n{body}"
        )
    };
    let cases = [
        (
            "a namespace glob (the CA's constraints are fixed when it is made)",
            tenant("          namespaces: [\"team-*\"]\n"),
            "at '/config/signers/example.com~1workload/tenants/team-a/namespaces/0': 'team-*' \
             does not match pattern",
        ),
        (
            "a tenant without namespaces",
            tenant("          trust_domain: a.example\n"),
            "at '/config/signers/example.com~1workload/tenants/team-a': missing property \
             'namespaces'",
        ),
        (
            "an unknown tenant key",
            tenant("          namespaces: [a]\n          namespace_selector: {}\n"),
            "at '/config/signers/example.com~1workload/tenants/team-a': additional properties \
             'namespace_selector' not allowed",
        ),
        (
            "uri_constraints not a boolean",
            tenant("          namespaces: [a]\n          uri_constraints: \"yes\"\n"),
            "uri_constraints': got string, want boolean",
        ),
        (
            "a tenant on the CA named default (`ca`)",
            tenant("          namespaces: [a]\n          ca: default\n"),
            "at '/config/signers/example.com~1workload/tenants/team-a/ca'",
        ),
        (
            "a tenant name podca refuses",
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      tenants:\n        Team-A:\n          \
             namespaces: [a]\n"
                .to_string(),
            "invalid propertyName 'Team-A'",
        ),
        (
            "an untenanted value podca does not know",
            "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      untenanted: allow\n"
                .to_string(),
            "at '/config/signers/example.com~1workload/untenanted': value must be one of \
             'deny', 'signer'",
        ),
    ];
    for (what, values, expected) in &cases {
        let err = helm_with_values(values)
            .map(|_| ())
            .expect_err(&format!("{what}: the schema must refuse:\n{values}"));
        assert!(
            err.contains("values don't meet the specifications of the schema(s)")
                && err.contains(expected),
            "{what}: expected {expected:?} in helm's error:\n{err}"
        );
    }
}

#[test]
fn the_chart_refuses_tenant_cas_podca_would_refuse() {
    let tenants = "config:\n  signers:\n    example.com/workload:\n      trust_domain: cluster.local\n      tenants:\n        \
                   team-a:\n          namespaces: [a]\n";
    let cases = [
        (
            tenants.to_string(),
            "config.signers.example.com/workload.tenants.team-a signs with CA team-a: no such CA; \
             declare it under cas (cas.team-a.secretName)",
        ),
        (
            format!(
                "cas:\n  payments:\n    secretName: ca-payments\n{tenants}          ca: payments\n    \
                 example.com/payments:\n      trust_domain: payments.example\n      ca: payments\n  \
                 grpc:\n    signer: example.com/workload\n"
            ),
            "config.signers.example.com/workload.tenants.team-a signs with CA payments, which is \
             also the CA of signer example.com/payments",
        ),
        (
            format!(
                "cas:\n  shared:\n    secretName: ca-shared\n{tenants}          ca: shared\n        \
                 team-b:\n          namespaces: [b]\n          ca: shared\n"
            ),
            "config.signers.example.com/workload.tenants.team-b signs with CA shared, as \
             config.signers.example.com/workload.tenants.team-a does: each tenant needs its own CA",
        ),
    ];
    for (values, expected) in &cases {
        let err = helm_with_values(values).expect_err(&format!("must refuse:\n{values}"));
        assert!(err.contains(expected), "expected {expected:?}:\n{err}");
    }
    // podca refuses each as well (the chart only says so before the pod starts).
    let signer = "[signers.\"a.example/x\"]\ntrust_domain = \"a.example\"\n";
    let secret =
        |name: &str| format!("[cas.{name}]\nbackend = \"secret\"\nsecret = \"ns/ca-{name}\"\n");
    for text in [
        format!("{signer}[signers.\"a.example/x\".tenants.team-a]\nnamespaces = [\"a\"]\n"),
        format!(
            "{}{signer}ca = \"payments\"\n[signers.\"a.example/x\".tenants.team-a]\n\
             namespaces = [\"a\"]\nca = \"payments\"\n",
            secret("payments")
        ),
        format!(
            "{}{signer}[signers.\"a.example/x\".tenants.team-a]\nnamespaces = [\"a\"]\n\
             ca = \"shared\"\n[signers.\"a.example/x\".tenants.team-b]\nnamespaces = [\"b\"]\n\
             ca = \"shared\"\n",
            secret("shared")
        ),
    ] {
        assert!(Config::parse(&text).is_err(), "{text}");
    }
    // And accepts the tenant with its CA declared.
    let ok = format!(
        "[ca]\nbackend = \"secret\"\nsecret = \"ns/podca-ca\"\n{}{signer}\
         [signers.\"a.example/x\".tenants.team-a]\nnamespaces = [\"a\"]\n",
        secret("team-a")
    );
    Config::parse(&ok).unwrap_or_else(|e| panic!("{e:#}\n{ok}"));
}

/// Issue #47 item 8: a values file with its own `config.signers` gets exactly those signers:
/// the placeholder `example.com/workload` is neither configured nor granted `sign`/`attest`
/// (Helm merges maps, so a placeholder among the defaults stayed beside them). The only signer
/// is the gRPC signer; several need `config.grpc.signer`, said before anything is installed.
#[test]
fn a_values_files_signers_replace_the_placeholder() {
    let mine =
        "config:\n  signers:\n    mycorp.example/web:\n      trust_domain: web.mycorp.example\n";
    let r = check_helm_values("helm own signer", "default", mine);
    check_rbac_signers("helm own signer", &r, &["mycorp.example/web"]);
    assert_eq!(
        config(&r).grpc.signer.as_deref(),
        Some("mycorp.example/web")
    );
    // A first install with no values still works, with the documented placeholder.
    let r = parse_helm_yaml("helm no values", &helm_with_values("").expect("renders"));
    check_rbac_signers("helm no values", &r, &[SIGNER]);
    let two = "config:\n  signers:\n    a.example/x:\n      trust_domain: a.example\n    \
               b.example/y:\n      trust_domain: b.example\n";
    let err = helm_with_values(two).expect_err("two signers without grpc.signer");
    assert!(
        err.contains("config.grpc.signer: with several signers, name the one gRPC requests get"),
        "{err}"
    );
}

/// Every `helm install` line of the README and the install guide works as written: rendered
/// with `helm template` and the same arguments from the repository's root (issue #47 item 8).
#[test]
fn the_documented_helm_install_lines_render() {
    let mut found = 0;
    for doc in ["README.md", "docs/install.md"] {
        let text = std::fs::read_to_string(repo_root().join(doc)).unwrap();
        // Shell continuation lines joined.
        let joined = text.replace("\\\n", " ");
        for line in joined.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("helm install ") else {
                continue;
            };
            // A shell comment after the command is not an argument.
            let rest = rest.split(" #").next().unwrap_or(rest);
            found += 1;
            // A values file of the reader's own (`-f my-values.yaml`) stands in as an empty one;
            // every file the repository holds is used as written.
            let placeholder = std::env::temp_dir().join("podca-docs-empty-values.yaml");
            std::fs::write(&placeholder, "{}\n").unwrap();
            let mut args: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
            for i in 1..args.len() {
                if matches!(args[i - 1].as_str(), "-f" | "--values")
                    && !repo_root().join(&args[i]).exists()
                {
                    args[i] = placeholder.display().to_string();
                }
            }
            let out = Command::new(helm())
                .current_dir(repo_root())
                .arg("template")
                .args(&args)
                .output()
                .expect("running helm");
            assert!(
                out.status.success(),
                "{doc}: `helm install {rest}` does not render:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(
        found >= 2,
        "the README and the install guide each show a helm install"
    );
}

/// What the migration from the kustomize manifests to the chart (docs/install.md) relies on:
/// with the release named `podca`, the chart renders the very objects of the default overlay
/// (kind, namespace, name), so Helm can adopt each, except the Namespace (not the chart's) and
/// the config ConfigMap (kustomize adds a content hash to its name). The Deployment's selector
/// differs (the chart's has `app.kubernetes.io/instance`) and is immutable: the guide deletes
/// the Deployment first.
#[test]
fn the_chart_renders_the_default_overlays_objects_under_the_same_names() {
    let identities = |yaml: &str| -> std::collections::BTreeSet<String> {
        documents(yaml)
            .iter()
            .map(|d| {
                let (_, kind) = kind_of(d);
                format!(
                    "{kind} {} {}",
                    d["metadata"]["namespace"].as_str().unwrap_or("-"),
                    d["metadata"]["name"].as_str().unwrap_or("")
                )
            })
            .collect()
    };
    let kustomize = identities(&crate::render::render_overlay("default"));
    let chart = identities(&render_helm("default"));
    let only_kustomize: Vec<&String> = kustomize.difference(&chart).collect();
    let only_chart: Vec<&String> = chart.difference(&kustomize).collect();
    assert_eq!(only_chart, ["ConfigMap podca-system podca-config"]);
    assert_eq!(only_kustomize.len(), 2, "{only_kustomize:?}");
    assert!(only_kustomize[0].starts_with("ConfigMap podca-system podca-config-"));
    assert_eq!(only_kustomize[1], "Namespace - podca-system");
    let selector = |yaml: &str| {
        documents(yaml)
            .into_iter()
            .find(|d| kind_of(d).1 == "Deployment")
            .map(|d| d["spec"]["selector"]["matchLabels"].clone())
            .unwrap()
    };
    assert_eq!(
        selector(&crate::render::render_overlay("default")),
        serde_json::json!({"app.kubernetes.io/name": "podca"})
    );
    assert_eq!(
        selector(&render_helm("default")),
        serde_json::json!({"app.kubernetes.io/name": "podca", "app.kubernetes.io/instance": "podca"})
    );
}
