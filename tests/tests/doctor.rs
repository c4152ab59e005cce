//! `podca doctor` against the API emulator, as an operator runs it: the real binary with podca's
//! kubeconfig and the shipped `deploy/base/config.toml`. A cluster set up as `deploy/` sets it
//! up is all green (exit 0); each broken case fails its own check, and only it, with exit 1.
//! And the doctor's list of permissions is the manifests' RBAC, so the two cannot drift.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Output;

use podca_authority::config::Config;
use podca_controller::doctor::{LeaseRef, Needs, Permission};
use podca_tests::emulator::podca_rbac::PodcaRbac;
use podca_tests::emulator::{ApiMode, ClockMode, PolicyRule, Res, Subject};
use podca_tests::process::podca_binary;
use podca_tests::{Emulator, EmulatorConfig};
use serde::Deserialize as _;
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};

const SIGNER: &str = "example.com/workload";
const NAMESPACE: &str = "podca-system";
const SECRET: &str = "podca-ca";
const BUNDLE: &str = "example.com:workload:podca";
const USER: &str = "system:serviceaccount:podca-system:podca";
const CHECKS: [&str; 8] = [
    "certificates-api",
    "rbac",
    "rbac-least-privilege",
    "ca-secret",
    "trust-bundle",
    "shared-ca",
    "pending-requests",
    "clock-skew",
];

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

/// A self-signed CA valid from a day ago for `days`: (certificate PEM, key PEM).
fn ca(days: i64) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "podca doctor test");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(days);
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

/// What to set up, and what to leave out or break.
struct Setup {
    mode: ApiMode,
    minor: Option<u32>,
    ca_days: i64,
    /// Leave this rule (by its verbs) out of podca's RBAC.
    drop_rule: Option<&'static [&'static str]>,
    extra_rule: Option<PolicyRule>,
    /// The bundle's content: `None` no bundle; `Some(false)` another CA's root.
    bundle: Option<bool>,
    /// podca's config.toml; `None`: deploy/base/config.toml.
    config: Option<String>,
    /// The rule of deploy/components/pod-facts (`pods get`) in podca's RBAC.
    pod_facts: bool,
    /// The rule of deploy/components/namespace-labels (`namespaces list, watch`).
    namespace_labels: bool,
    /// The rule of deploy/components/service-ca (`pods, services get`).
    service_ca: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mode: ApiMode::V1Only,
            minor: None,
            ca_days: 365,
            drop_rule: None,
            extra_rule: None,
            bundle: Some(true),
            config: None,
            pod_facts: false,
            namespace_labels: false,
            service_ca: false,
        }
    }
}

struct World {
    emu: Emulator,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    /// The config.toml the doctor is given.
    config: PathBuf,
}

/// A cluster set up as `deploy/` (base) sets it up, with `setup`'s changes.
async fn world(setup: Setup) -> World {
    let emu = Emulator::start(EmulatorConfig {
        api_mode: setup.mode,
        kubernetes_minor: setup.minor,
        auto_create_namespaces: true,
        ..Default::default()
    })
    .await
    .unwrap();
    emu.add_identity(
        "podca",
        USER,
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:podca-system",
        ],
    );
    let rbac = PodcaRbac {
        signer_names: vec![SIGNER.into()],
        ca_secret: Some((NAMESPACE.into(), SECRET.into())),
        lease_name: None,
        issue_for_pod: false,
        // deploy/base's JWKS ConfigMap Role.
        jwks_configmap: Some((NAMESPACE.into(), "podca-jwks".into())),
        namespace_labels: setup.namespace_labels,
        pod_facts: setup.pod_facts,
        service_ca: setup.service_ca,
    };
    for rule in rbac.rules() {
        if setup.drop_rule.is_some_and(|verbs| rule.verbs == verbs) {
            continue;
        }
        emu.grant(Subject::User(USER.into()), rule);
    }
    if let Some(rule) = setup.extra_rule {
        emu.grant(Subject::User(USER.into()), rule);
    }
    let (cert, key) = ca(setup.ca_days);
    emu.add_secret(
        NAMESPACE,
        SECRET,
        "kubernetes.io/tls",
        &[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())],
    );
    if let Some(ours) = setup.bundle {
        let pem = if ours { cert } else { ca(365).0 };
        emu.seed_object(
            Res::Ctb,
            json!({
                "metadata": {"name": BUNDLE, "labels": {
                    "app.kubernetes.io/managed-by": "podca", "podca.dev/instance": "podca"}},
                "spec": {"signerName": SIGNER, "trustBundle": pem},
            }),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("podca.kubeconfig");
    emu.write_kubeconfig(&kubeconfig, "podca").unwrap();
    let config = match &setup.config {
        None => repo("deploy/base/config.toml"),
        Some(text) => {
            let path = dir.path().join("config.toml");
            std::fs::write(&path, text).unwrap();
            path
        }
    };
    World {
        emu,
        dir,
        kubeconfig,
        config,
    }
}

/// Runs `podca doctor` with the world's kubeconfig and config (deploy/base/config.toml unless
/// the setup gave one), off the runtime that serves the emulator.
async fn doctor(w: &World, extra: &[&str]) -> Output {
    let mut args = vec![
        "--kubeconfig".to_owned(),
        w.kubeconfig.display().to_string(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    doctor_with(&w.config, args).await
}

/// The report's lines as (status, name, detail).
fn lines(out: &Output) -> Vec<(String, String, String)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let mut parts = l.split_whitespace();
            let status = parts.next().unwrap_or("").to_owned();
            let name = parts.next().unwrap_or("").to_owned();
            let detail = parts.collect::<Vec<_>>().join(" ");
            (status, name, detail)
        })
        .collect()
}

fn report(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}stderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts a healthy run: exit 0, every check `ok`.
fn assert_all_green(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{}", report(out));
    let got = lines(out);
    let names: Vec<&str> = got.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(names, CHECKS, "{}", report(out));
    assert!(got.iter().all(|(s, _, _)| s == "ok"), "{}", report(out));
}

/// Asserts that exactly `check` failed, with a detail containing each of `texts`, that every
/// other check is `ok`, and that the run ended with status 1 and one error line.
fn assert_only_failure(out: &Output, check: &str, texts: &[&str]) {
    assert_eq!(out.status.code(), Some(1), "{}", report(out));
    let got = lines(out);
    assert_eq!(got.len(), CHECKS.len(), "{}", report(out));
    for (status, name, detail) in &got {
        if name == check {
            assert_eq!(status, "FAIL", "{}", report(out));
            for t in texts {
                assert!(detail.contains(t), "{check} lacks {t:?}:\n{}", report(out));
            }
        } else {
            assert_eq!(status, "ok", "{name}:\n{}", report(out));
        }
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "podca: 1 of 8 checks failed",
        "{}",
        report(out)
    );
}

#[tokio::test]
async fn a_cluster_set_up_as_deploy_says_is_all_green() {
    let w = world(Setup::default()).await;
    let out = doctor(&w, &[]).await;
    assert_all_green(&out);
    let got = lines(&out);
    assert_eq!(
        got[0].2,
        "podcertificaterequests served in v1; clustertrustbundles served in v1"
    );
    assert_eq!(
        got[1].2,
        "all 27 permissions podca needs are granted",
        "{}",
        report(&out)
    );
    assert!(
        got[3]
            .2
            .starts_with("Secret podca-system/podca-ca: issuing CA"),
        "{}",
        report(&out)
    );
    assert!(got[3].2.ends_with("(364 days left)"), "{}", report(&out));
    assert_eq!(
        got[4].2,
        "example.com/workload: example.com:workload:podca holds the CA's 1 anchor(s) (1 \
         certificate(s) in all)"
    );
    assert_eq!(got[5].2, "every signer has a CA of its own");
    assert_eq!(got[6].2, "example.com/workload: no request waiting");
    assert_eq!(
        got[7].2,
        "the API server's clock is in step with the local clock"
    );
}

#[tokio::test]
async fn json_parses_and_names_every_check() {
    let w = world(Setup::default()).await;
    let out = doctor(&w, &["--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", report(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("the output is JSON");
    assert_eq!(v["healthy"], true);
    let checks = v["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, CHECKS);
    for c in checks {
        assert_eq!(c["status"], "ok", "{c}");
        assert!(!c["detail"].as_str().unwrap().is_empty(), "{c}");
    }

    // A broken cluster: the same shape, `healthy` false, the failed check `fail`.
    let w = world(Setup {
        bundle: None,
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &["--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", report(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("the output is JSON");
    assert_eq!(v["healthy"], false);
    let failed: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["trust-bundle"]);
}

#[tokio::test]
async fn a_missing_permission_is_named() {
    let w = world(Setup {
        drop_rule: Some(&["sign"]),
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "rbac",
        &[
            "1 of 27 permissions missing (see deploy/base/rbac.yaml): sign \
           signers.certificates.k8s.io example.com/workload cluster-wide",
        ],
    );
}

#[tokio::test]
async fn a_permission_beyond_what_podca_needs_is_named() {
    let w = world(Setup {
        extra_rule: Some(PolicyRule::new(
            &[""],
            &["secrets"],
            &["get", "list", "watch"],
        )),
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "rbac-least-privilege",
        &[
            "granted beyond what podca needs (remove the binding that grants it): list secrets \
           cluster-wide, get secrets in podca-system",
        ],
    );
}

#[tokio::test]
async fn v1_not_served_on_a_1_37_cluster_fails_and_v1beta1_on_1_36_passes() {
    let w = world(Setup {
        mode: ApiMode::V1Beta1,
        minor: Some(37),
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "certificates-api",
        &[
            "podcertificaterequests served only in v1beta1, deprecated since 1.37, but not in \
             v1, GA and on by default in Kubernetes 1.37",
            "clustertrustbundles served only in v1beta1",
        ],
    );

    // The same on 1.36 is as it should be: the beta gates and runtime-config are on.
    let w = world(Setup {
        mode: ApiMode::V1Beta1,
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &[]).await;
    assert_all_green(&out);
    assert!(
        lines(&out)[0]
            .2
            .starts_with("podcertificaterequests served in v1beta1 (Kubernetes 1.36:"),
        "{}",
        report(&out)
    );
}

#[tokio::test]
async fn a_ca_about_to_expire_fails() {
    let w = world(Setup {
        ca_days: 3,
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "ca-secret",
        &[
            "Secret podca-system/podca-ca: issuing CA",
            "(2 days left): less than 7 days; put the next CA into the Secret now",
        ],
    );
}

#[tokio::test]
async fn a_missing_or_foreign_bundle_fails() {
    let w = world(Setup {
        bundle: None,
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "trust-bundle",
        &[
            "example.com/workload: ClusterTrustBundle example.com:workload:podca (labels \
           app.kubernetes.io/managed-by=podca,podca.dev/instance=podca) is missing",
        ],
    );

    let w = world(Setup {
        bundle: Some(false),
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "trust-bundle",
        &["example.com:workload:podca lacks the CA's anchor \"CN=podca doctor test\""],
    );
}

/// A signer that federates with b.test: its federated ClusterTrustBundle is reported (anchors,
/// first expiry); a missing one warns (serve writes it once a bundle is in force); one holding
/// podca's own anchor fails.
#[tokio::test]
async fn a_federated_trust_domains_bundle_is_reported_and_checked() {
    let base = std::fs::read_to_string(repo("deploy/base/config.toml")).unwrap();
    let header = format!("[signers.\"{SIGNER}\"]\n");
    let config = base.replace(&header, &format!("{header}federates_with = [\"b.test\"]\n"))
        + "\n[[federation]]\ntrust_domain = \"b.test\"\n\
           bundle_endpoint_url = \"https://bundles.b.test/\"\nprofile = \"https_spiffe\"\n\
           endpoint_spiffe_id = \"spiffe://b.test/podca/bundle-endpoint\"\n\
           initial_bundle = \"/etc/podca/b.test.json\"\n";
    const FEDERATED: &str = "example.com:workload:podca.federated.b.test";
    let w = world(Setup {
        config: Some(config),
        ..Setup::default()
    })
    .await;
    let trust_bundle = |out: &Output| {
        lines(out)
            .into_iter()
            .find(|(_, name, _)| name == "trust-bundle")
            .unwrap_or_else(|| panic!("no trust-bundle line:\n{}", report(out)))
    };
    let (status, _, detail) = trust_bundle(&doctor(&w, &[]).await);
    assert_eq!(status, "warn", "{detail}");
    assert!(
        detail.contains(&format!(
            "example.com/workload (federated b.test): ClusterTrustBundle {FEDERATED} is not \
             published yet"
        )),
        "{detail}"
    );
    let seed = |pem: &str| {
        w.emu.seed_object(
            Res::Ctb,
            json!({
                "metadata": {"name": FEDERATED, "labels": {
                    "app.kubernetes.io/managed-by": "podca", "podca.dev/instance": "podca",
                    "podca.dev/federated-trust-domain": "b.test"}},
                "spec": {"signerName": SIGNER, "trustBundle": pem},
            }),
        );
    };
    // b.test's root, a year to go.
    seed(&ca(365).0);
    let out = doctor(&w, &[]).await;
    let (status, _, detail) = trust_bundle(&out);
    assert_eq!(status, "ok", "{}", report(&out));
    let year = (time::OffsetDateTime::now_utc() + time::Duration::days(365)).date();
    assert!(
        detail.contains(&format!(
            "{FEDERATED} holds 1 anchor(s); the first expires {year}"
        )),
        "{detail}"
    );
    // podca's own CA in the federated bundle: refused.
    let own = w
        .emu
        .get_object(Res::Ctb, "", BUNDLE)
        .expect("the signer's own bundle")["spec"]["trustBundle"]
        .as_str()
        .unwrap()
        .to_owned();
    seed(&own);
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "trust-bundle",
        &[&format!("{FEDERATED} holds podca's own anchor")],
    );
}

#[tokio::test]
async fn an_api_server_clock_five_minutes_ahead_fails() {
    let w = world(Setup::default()).await;
    w.emu.set_clock(ClockMode::Offset(Duration::minutes(5)));
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "clock-skew",
        &[
            "s ahead of the local clock: kube-apiserver refuses a notBefore more than 5 \
             minutes off its clock",
        ],
    );
    let detail = &lines(&out)[7].2;
    assert!(
        ["299s", "300s", "301s"].iter().any(|s| detail.contains(s)),
        "{detail}"
    );
}

#[tokio::test]
async fn a_request_pending_past_ten_minutes_fails() {
    let w = world(Setup::default()).await;
    let created = w.emu.now() - Duration::minutes(11);
    w.emu.seed_object(
        Res::Pcr,
        json!({
            "metadata": {"name": "stuck", "namespace": "apps",
                "creationTimestamp": podca_tests::emulator::pcr::fmt_time(created)},
            "spec": {"signerName": SIGNER, "podName": "p", "nodeName": "n"},
            "status": {},
        }),
    );
    let out = doctor(&w, &[]).await;
    assert_only_failure(
        &out,
        "pending-requests",
        &["example.com/workload: 1 request(s) waiting, the oldest apps/stuck for 66"],
    );
}

/// Every permission of the (Cluster)Roles in a manifest, one per verb and name.
fn manifest_permissions(relative: &str) -> Vec<Permission> {
    yaml_permissions(&std::fs::read_to_string(repo(relative)).unwrap())
}

/// [`manifest_permissions`] of YAML text.
fn yaml_permissions(text: &str) -> Vec<Permission> {
    let mut all = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).unwrap();
        let namespace = match v["kind"].as_str() {
            Some("ClusterRole") => None,
            Some("Role") => Some(v["metadata"]["namespace"].as_str().unwrap().to_owned()),
            _ => continue,
        };
        let list = |r: &Value, k: &str| -> Vec<String> {
            r[k].as_array()
                .map(|a| a.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default()
        };
        for rule in v["rules"].as_array().unwrap() {
            let names = list(rule, "resourceNames");
            let names: Vec<Option<String>> = if names.is_empty() {
                vec![None]
            } else {
                names.into_iter().map(Some).collect()
            };
            for group in list(rule, "apiGroups") {
                for resource in list(rule, "resources") {
                    for verb in list(rule, "verbs") {
                        for name in &names {
                            all.push(Permission {
                                verb: verb.clone(),
                                group: group.clone(),
                                resource: resource.clone(),
                                namespace: namespace.clone(),
                                name: name.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    all
}

#[test]
fn the_doctor_checks_exactly_the_permissions_of_the_manifests() {
    let config = Config::load(&repo("deploy/base/config.toml")).unwrap();
    let lease = LeaseRef {
        namespace: NAMESPACE.into(),
        name: "podca-controller".into(),
        sharded: false,
    };
    let mut doctor = Needs::from_config(&config, Some(lease.clone())).required();
    let mut manifests = manifest_permissions("deploy/base/rbac.yaml");
    manifests.extend(manifest_permissions(
        "deploy/overlays/ha/leader-election-rbac.yaml",
    ));
    doctor.sort();
    manifests.sort();
    // Two Roles grant `create configmaps` in podca's namespace (history and JWKS ConfigMaps).
    manifests.dedup();
    let before = doctor.len();
    doctor.dedup();
    assert_eq!(doctor.len(), before, "the doctor lists a permission twice");
    assert_eq!(doctor, manifests);
    // Rendezvous sharding: exactly the Role of deploy/components/sharding on top.
    let mut sharded = Needs::from_config(
        &config,
        Some(LeaseRef {
            sharded: true,
            ..lease.clone()
        }),
    )
    .required();
    manifests.extend(manifest_permissions(
        "deploy/components/sharding/member-leases-rbac.yaml",
    ));
    sharded.sort();
    manifests.sort();
    assert_eq!(sharded, manifests);
    // Without --leader-elect the Lease Role is not needed.
    let without = Needs::from_config(&config, None).required();
    assert_eq!(without.len(), doctor.len() - 4);
    // With IssueForPod on, exactly the rule of deploy/components/issue-for-pod is added.
    let mut config = config;
    config.grpc.node_proxy_service_accounts = vec!["kube-system/ztunnel".into()];
    let with_pods = Needs::from_config(&config, None).required();
    let added: Vec<String> = with_pods
        .iter()
        .filter(|p| !without.contains(p))
        .map(ToString::to_string)
        .collect();
    assert_eq!(added, ["get pods cluster-wide", "list pods cluster-wide"]);
    let component =
        std::fs::read_to_string(repo("deploy/components/issue-for-pod/kustomization.yaml"))
            .unwrap();
    assert!(
        component.contains("resources: [\"pods\"]")
            && component.contains("verbs: [\"get\", \"list\"]"),
        "the issue-for-pod component no longer grants pods get and list"
    );
}

/// deploy/base/config.toml with `pod_facts = true` for its signer and a rule on the pod's labels.
fn config_with_pod_facts() -> String {
    let base = std::fs::read_to_string(repo("deploy/base/config.toml")).unwrap();
    let header = format!("[signers.\"{SIGNER}\"]\n");
    let with = base.replace(&header, &format!("{header}pod_facts = true\n"));
    assert_ne!(with, base, "the base config has the signer's table");
    format!(
        "{with}\n[[signers.\"{SIGNER}\".rules]]\nname = \"labelled\"\n\
         require = \"pod.labels['certs.example.com/allowed'] == 'true'\"\nreason = \"PodNotLabelled\"\n"
    )
}

/// deploy/base/config.toml with the signer answering the service-ca vocabulary.
fn config_with_service_ca() -> String {
    let base = std::fs::read_to_string(repo("deploy/base/config.toml")).unwrap();
    format!("{base}\n[signers.\"{SIGNER}\".service_ca]\ncluster_domain = \"cluster.local\"\n")
}

/// `config` needs a component's grants: without them the rbac check alone fails, naming each
/// missing permission (`missing`, of `total`); with them (`with`'s RBAC) all is green.
async fn a_component_is_named_until_granted(
    config: String,
    with: impl Fn(Setup) -> Setup,
    missing: &str,
    total: usize,
) {
    let without = world(Setup {
        config: Some(config.clone()),
        ..Setup::default()
    })
    .await;
    let out = doctor(&without, &[]).await;
    assert_only_failure(&out, "rbac", &[missing]);
    let granted = world(with(Setup {
        config: Some(config),
        ..Setup::default()
    }))
    .await;
    let out = doctor(&granted, &[]).await;
    assert_all_green(&out);
    assert_eq!(
        lines(&out)[1].2,
        format!("all {total} permissions podca needs are granted"),
        "{}",
        report(&out)
    );
}

#[tokio::test]
async fn service_ca_without_its_reads_is_named_and_with_them_all_is_green() {
    let why = "(a signer has a service_ca table: deploy/components/service-ca)";
    a_component_is_named_until_granted(
        config_with_service_ca(),
        |s| Setup {
            service_ca: true,
            ..s
        },
        &format!(
            "2 of 29 permissions missing (see deploy/base/rbac.yaml): get pods cluster-wide \
             {why}, get services cluster-wide {why}"
        ),
        29,
    )
    .await;
}

/// deploy/base/config.toml with a rule on `namespaceObject.metadata.labels`.
fn config_with_namespace_label_rule() -> String {
    let base = std::fs::read_to_string(repo("deploy/base/config.toml")).unwrap();
    format!(
        "{base}\n[[signers.\"{SIGNER}\".rules]]\nname = \"production_only\"\n\
         require = \"namespaceObject.metadata.labels.tier == 'prod'\"\nreason = \"NamespaceNotProduction\"\n"
    )
}

#[tokio::test]
async fn pod_facts_without_pods_get_is_named_and_with_it_all_is_green() {
    a_component_is_named_until_granted(
        config_with_pod_facts(),
        |s| Setup {
            pod_facts: true,
            ..s
        },
        "1 of 28 permissions missing (see deploy/base/rbac.yaml): get pods cluster-wide (a \
         signer sets pod_facts = true: deploy/components/pod-facts)",
        28,
    )
    .await;
    // The grant without the flag is not asked for (and not beyond: only secrets and `*` are).
    let out = doctor(
        &world(Setup {
            pod_facts: true,
            ..Setup::default()
        })
        .await,
        &[],
    )
    .await;
    assert_all_green(&out);
    assert_eq!(
        lines(&out)[1].2,
        "all 27 permissions podca needs are granted"
    );
}

#[tokio::test]
async fn a_namespace_label_rule_without_the_namespace_watch_is_named() {
    let why = "(a rule reads namespaceObject.metadata.labels: deploy/components/namespace-labels)";
    a_component_is_named_until_granted(
        config_with_namespace_label_rule(),
        |s| Setup {
            namespace_labels: true,
            ..s
        },
        &format!(
            "2 of 29 permissions missing (see deploy/base/rbac.yaml): list namespaces \
             cluster-wide {why}, watch namespaces cluster-wide {why}"
        ),
        29,
    )
    .await;
}

/// The permissions a component adds to the ClusterRole (its JSON patch's `add` values).
fn component_permissions(relative: &str) -> Vec<Permission> {
    let text = std::fs::read_to_string(repo(relative)).unwrap();
    let v: Value = serde_yaml::from_str(&text).unwrap();
    let mut rules = Vec::new();
    for patch in v["patches"].as_array().unwrap() {
        assert_eq!(patch["target"]["kind"], "ClusterRole");
        let ops: Value = serde_yaml::from_str(patch["patch"].as_str().unwrap()).unwrap();
        for op in ops.as_array().unwrap() {
            assert_eq!(op["op"], "add");
            rules.push(op["value"].clone());
        }
    }
    let role = json!({"kind": "ClusterRole", "rules": rules});
    yaml_permissions(&serde_yaml::to_string(&role).unwrap())
}

#[test]
fn the_doctor_asks_for_exactly_the_rules_of_the_pod_facts_and_namespace_labels_components() {
    let base = Config::load(&repo("deploy/base/config.toml")).unwrap();
    let plain = Needs::from_config(&base, None).required();
    let added = |text: &str| -> Vec<Permission> {
        let config = Config::parse(text).unwrap();
        let mut added: Vec<Permission> = Needs::from_config(&config, None)
            .required()
            .into_iter()
            .filter(|p| !plain.contains(p))
            .collect();
        added.sort();
        added
    };
    let mut want = component_permissions("deploy/components/pod-facts/kustomization.yaml");
    want.sort();
    assert_eq!(added(&config_with_pod_facts()), want);
    assert_eq!(
        want.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["get pods cluster-wide"]
    );
    let mut want = component_permissions("deploy/components/namespace-labels/kustomization.yaml");
    want.sort();
    assert_eq!(added(&config_with_namespace_label_rule()), want);
    assert_eq!(want.len(), 2);
}

#[tokio::test]
async fn an_admin_asks_as_podca_with_impersonation() {
    let w = world(Setup {
        drop_rule: Some(&["sign"]),
        ..Setup::default()
    })
    .await;
    let admin = w.dir.path().join("admin.kubeconfig");
    w.emu.write_kubeconfig(&admin, "admin").unwrap();
    let as_podca = [
        "--as",
        USER,
        "--as-group",
        "system:serviceaccounts",
        "--as-group",
        "system:serviceaccounts:podca-system",
    ];
    let run = |extra: &[&str]| {
        let mut args = vec!["--kubeconfig", admin.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.iter()
            .map(|a| (*a).to_owned())
            .collect::<Vec<String>>()
    };
    // The admin itself may do anything: its answers are the admin's, not podca's. The doctor
    // says whose they are and how to ask as podca, and never tells it to remove its grants
    // (issue #47 item 6).
    let out = doctor_with(&w.config, run(&[])).await;
    let got = lines(&out);
    let hint = "ask as podca with `podca doctor --as \
                system:serviceaccount:podca-system:podca --as-group system:serviceaccounts \
                --as-group system:serviceaccounts:podca-system`";
    for (line, check) in [(1, "rbac"), (2, "rbac-least-privilege")] {
        assert_eq!(got[line].1, check, "{}", report(&out));
        assert_eq!(got[line].0, "warn", "{}", report(&out));
        assert!(
            got[line].2.contains(
                "these answers are for \"admin\", who is not podca's service \
                                  account"
            ) && got[line].2.contains(hint),
            "{}",
            report(&out)
        );
        assert!(!got[line].2.contains("remove"), "{}", report(&out));
    }
    assert!(
        got[2].2.starts_with("granted to the asker: list secrets"),
        "{}",
        report(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", report(&out));
    // As podca, the answers are podca's: its missing `sign` permission.
    let out = doctor_with(&w.config, run(&as_podca)).await;
    assert_only_failure(
        &out,
        "rbac",
        &["sign signers.certificates.k8s.io example.com/workload cluster-wide"],
    );
}

/// `podca doctor` with `config` and `args` (the kubeconfig included).
async fn doctor_with(config: &Path, args: Vec<String>) -> Output {
    let mut all: Vec<String> = vec![
        "doctor".into(),
        "--config".into(),
        config.display().to_string(),
    ];
    all.extend(args);
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(podca_binary())
            .args(&all)
            .env("PODCA_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Issue #47 item 6: an API server that does not answer is one line naming the address tried,
/// with nothing on standard output.
#[tokio::test]
async fn an_unreachable_api_server_is_one_line_with_its_address() {
    let w = world(Setup::default()).await;
    // The same kubeconfig, pointing at a port nobody listens on.
    let text = std::fs::read_to_string(&w.kubeconfig).unwrap();
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .map(|s| s.trim().trim_matches('"').to_owned())
        .unwrap();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let gone = format!("https://127.0.0.1:{closed}");
    let kubeconfig = w.dir.path().join("gone.kubeconfig");
    std::fs::write(&kubeconfig, text.replace(&server, &gone)).unwrap();
    let out = doctor_with(
        &w.config,
        vec!["--kubeconfig".into(), kubeconfig.display().to_string()],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", report(&out));
    assert!(out.stdout.is_empty(), "{}", report(&out));
    assert_eq!(stderr.lines().count(), 1, "{}", report(&out));
    assert!(
        stderr.starts_with(&format!("podca: cannot reach the API server at {gone}/: "))
            && stderr.contains("Connection refused"),
        "{}",
        report(&out)
    );
}

/// Issue #47 item 6: a 403 is the API server's one line (verb, resource, user), never kube's
/// `Status { … }` dump.
#[tokio::test]
async fn a_forbidden_read_is_the_api_servers_one_line() {
    let w = world(Setup {
        drop_rule: Some(&["get", "list", "watch"]),
        ..Setup::default()
    })
    .await;
    let out = doctor(&w, &[]).await;
    let got = lines(&out);
    let pending = got
        .iter()
        .find(|(_, name, _)| name == "pending-requests")
        .unwrap_or_else(|| panic!("{}", report(&out)));
    assert_eq!(pending.0, "FAIL", "{}", report(&out));
    assert!(
        pending.2.contains("cannot list PodCertificateRequests:")
            && pending
                .2
                .contains("cannot list resource \"podcertificaterequests\"")
            && pending.2.contains(USER)
            && pending.2.ends_with("(403)"),
        "{}",
        report(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("Status {"), "{stdout}");
    assert!(!stdout.contains("ApiError"), "{stdout}");
}
