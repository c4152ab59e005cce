//! `podca policy test` and `podca policy lint` (issue #19 item 4): the offline answer to a
//! PodCertificateRequest is the controller's (the in-process controller against the emulator,
//! then the same object through `podca policy test`), request descriptions go through the gRPC
//! path's rules, and every bad input gets a precise error and exit code 2.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use podca_controller::Options;
use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey, SignerPolicy};
use podca_tests::Emulator;
use podca_tests::cluster::{Cluster, NewPcr};
use podca_tests::emulator::{ApiMode, Res};
use podca_tests::process::podca_binary;
use podca_tests::sim::install_crypto;
use serde_json::Value;
use tokio::sync::oneshot;

const SIGNER: &str = "example.com/workload";

/// The signer's policy: an allow-list (an excluded namespace) and two rules.
const POLICY: &str = r#"trust_domain = "cluster.local"
excluded_namespaces = ["restricted"]

[[rules]]
name = "quarantine"
deny = "request.namespace == 'quarantine'"
reason = "NamespaceQuarantined"
message = "'namespace ' + request.namespace + ' is quarantined (' + request.source + ', pod ' + request.pod.name + ', node ' + request.node.name + ')'"

[[rules]]
name = "retired_accounts"
deny = "request.service_account == 'legacy'"
reason = "ServiceAccountRetired"
message = "'service account ' + request.namespace + '/' + request.service_account + ' is retired'"
"#;

/// The same policy as a config file for `signer`.
fn config_text(signer: &str, policy: &str) -> String {
    format!(
        "[signers.\"{signer}\"]\n{}",
        policy.replace("[[rules]]", &format!("[[signers.\"{signer}\".rules]]"))
    )
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\nstderr: {}", self.stdout, self.stderr))
    }
}

fn podca(args: &[&str]) -> Run {
    let out = Command::new(podca_binary())
        .args(args)
        .env_remove("PODCA_CONFIG")
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `podca policy test -o json`, its exit code and parsed answer.
fn policy_test(config: &Path, request: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec![
        "policy",
        "test",
        "--config",
        s(config),
        "--request",
        s(request),
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let run = podca(&args);
    assert!(
        run.code == 0 || run.code == 1,
        "exit {}: {}",
        run.code,
        run.stderr
    );
    (run.code, run.json())
}

fn ca() -> Arc<IssuingCa> {
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap();
    Arc::new(
        IssuingCa::self_signed_root(
            Arc::new(key),
            "podca test CA",
            time::OffsetDateTime::now_utc(),
            time::Duration::days(365),
        )
        .unwrap(),
    )
}

/// (type, reason, message) of a PCR's terminal condition, once it has one.
async fn settled(emu: &Emulator, namespace: &str, name: &str) -> (String, String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(o) = emu.get_object(Res::Pcr, namespace, name)
            && let Some(c) = o["status"]["conditions"].as_array().and_then(|c| c.first())
        {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            return (s("type"), s("reason"), s("message"));
        }
        assert!(
            Instant::now() < deadline,
            "{namespace}/{name} did not settle"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The recorded vector `id`'s PodCertificateRequest, as the real kube-apiserver returned it.
fn recorded_pcr(id: &str) -> (Value, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors/apiserver-1.36.2.json");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vector = all["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == id)
        .unwrap_or_else(|| panic!("no vector {id}"));
    (
        vector["setup"]["pcr"].clone(),
        vector["server_time"].as_str().unwrap().to_owned(),
    )
}

/// Files three PCRs of `version` (one issued with a recorded kubelet stub, one denied by a
/// rule, one by the allow-list), lets the controller settle them, then decides each settled
/// object again with `podca policy test` and the same policy: same decision, reason, message.
async fn same_answer_as_the_controller(mode: ApiMode, version: &'static str) {
    install_crypto();
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "podca.toml", &config_text(SIGNER, POLICY));
    let policy: SignerPolicy = toml::from_str(POLICY).unwrap();
    policy.validate().unwrap();

    let c = Cluster::start(mode, &[SIGNER]).await;
    let client = podca_controller::connect(Some(&c.kubeconfig))
        .await
        .unwrap();
    let options = Options::new(BTreeMap::from([(SIGNER.to_string(), policy)]), ca());
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(podca_controller::run(client, options, async move {
        let _ = rx.await;
    }));

    // The kubelet's stub CSR recorded from the real apiserver.
    let (recorded, _) = recorded_pcr("pcr-status-issued-ecdsap256");
    let stub = base64::engine::general_purpose::STANDARD
        .decode(recorded["spec"]["stubPKCS10Request"].as_str().unwrap())
        .unwrap();
    let cases = [
        ("apps", "req-issued", Some(stub)),
        ("quarantine", "req-rule", None),
        ("restricted", "req-allow-list", None),
    ];
    for (namespace, name, stub) in &cases {
        let mut pcr = NewPcr::p256(name, SIGNER);
        pcr.version = version;
        pcr.namespace = namespace;
        if let Some(stub) = stub {
            pcr.stub = Some(stub.clone());
        }
        pcr.file(&c.admin).await;
    }
    let mut answers = Vec::new();
    for (namespace, name, _) in &cases {
        let controller = settled(&c.emu, namespace, name).await;
        // The emulator stores objects as list items (no kind, no apiVersion); a GET of one
        // object, as `kubectl get pcr NAME -o yaml` does, carries both.
        let mut object = c.emu.get_object(Res::Pcr, namespace, name).unwrap();
        object["apiVersion"] = Value::from(format!("certificates.k8s.io/{version}"));
        object["kind"] = Value::from("PodCertificateRequest");
        // One as JSON, the others as YAML, as `kubectl get pcr -o yaml` prints them.
        let request = if *name == "req-issued" {
            write(dir.path(), &format!("{name}.json"), &object.to_string())
        } else {
            write(
                dir.path(),
                &format!("{name}.yaml"),
                &serde_yaml::to_string(&object).unwrap(),
            )
        };
        let (code, offline) = policy_test(&config, &request, &[]);
        // An issued certificate's message names its serial: another certificate, another one.
        let unserial = |m: &str| m.split(" (serial ").next().unwrap().to_owned();
        assert_eq!(
            (
                offline["decision"].as_str().unwrap(),
                offline["reason"].as_str().unwrap(),
                unserial(offline["message"].as_str().unwrap()).as_str()
            ),
            (
                controller.0.as_str(),
                controller.1.as_str(),
                unserial(&controller.2).as_str()
            ),
            "{namespace}/{name}: {offline:#}"
        );
        assert_eq!(code, if controller.0 == "Issued" { 0 } else { 1 });
        answers.push((object, offline));
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // What decided, and what the certificate would be.
    let (object, issued) = &answers[0];
    assert_eq!(
        issued["decided_by"],
        "the allow-lists and all 2 rules passed"
    );
    assert_eq!(
        issued["issued"]["spiffe_id"],
        "spiffe://cluster.local/ns/apps/sa/app"
    );
    assert_eq!(issued["issued"]["dns_names"], serde_json::json!([]));
    let lifetime = |o: &Value| {
        let t = |k: &str| {
            time::OffsetDateTime::parse(
                o["status"][k].as_str().unwrap(),
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap()
        };
        (t("notAfter") - t("notBefore")).whole_seconds()
    };
    assert_eq!(issued["issued"]["lifetime_seconds"], lifetime(object));
    assert!(
        issued["notes"][0]
            .as_str()
            .unwrap()
            .contains("already Issued: its spec was decided anew"),
        "{issued:#}"
    );
    let (_, rule) = &answers[1];
    assert_eq!(
        rule["message"],
        "namespace quarantine is quarantined (pcr, pod pod-req-rule, node node-1)"
    );
    assert_eq!(rule["decided_by"], "rule \"quarantine\" (1 of 2, deny)");
    let (_, allow_list) = &answers[2];
    assert_eq!(allow_list["reason"], "NamespaceNotAllowed");
    assert_eq!(
        allow_list["decided_by"],
        "allow-list namespaces / excluded_namespaces"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_test_gives_the_controllers_answer_for_v1beta1_pcrs() {
    same_answer_as_the_controller(ApiMode::V1Beta1, "v1beta1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_test_gives_the_controllers_answer_for_v1_pcrs() {
    same_answer_as_the_controller(ApiMode::V1Only, "v1").await;
}

#[test]
fn recorded_apiserver_pcrs_are_decided_offline() {
    let dir = tempfile::tempdir().unwrap();
    let signer = "example.com/my-signer";
    let config = write(
        dir.path(),
        "podca.toml",
        &config_text(
            signer,
            "trust_domain = \"cluster.local\"\n\
             [[rules]]\nname = \"pod_bound\"\n\
             require = \"request.pod.uid == '0433cb85-8601-43b7-a21b-cfb3100911a4' && \
             request.node.name == 'vec-node-1' && request.key_type == 'ECDSAP256' && \
             request.requested_lifetime_seconds == 86400\"\n\
             reason = \"NotTheRecordedPod\"\n",
        ),
    );
    for id in [
        "pcr-status-issued-ecdsap256",
        "pcr-status-issued-legacy-pkix",
    ] {
        let (pcr, server_time) = recorded_pcr(id);
        let request = write(dir.path(), &format!("{id}.json"), &pcr.to_string());
        let (code, answer) = policy_test(&config, &request, &["--now", &server_time]);
        assert_eq!(code, 0, "{id}: {answer:#}");
        assert_eq!(answer["decision"], "Issued", "{id}");
        assert_eq!(
            answer["issued"]["spiffe_id"],
            "spiffe://cluster.local/ns/vec-pcr/sa/vec-app"
        );
        assert_eq!(answer["issued"]["lifetime_seconds"], 86400);
        assert_eq!(answer["issued"]["not_after"], {
            let now = time::OffsetDateTime::parse(
                &server_time,
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap();
            let after = podca_signer::plan_validity(&podca_signer::schedule::ValidityInput {
                now,
                requested: None,
                policy_default: time::Duration::days(1),
                policy_max: time::Duration::days(7),
                max_expiration: Some(time::Duration::days(1)),
                ca_not_before: now - time::Duration::days(365),
                ca_not_after: now + time::Duration::days(365),
            })
            .unwrap()
            .not_after;
            after
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap()
        });
    }
    // The PCR names a signer this config does not serve: the controller's answer.
    let other = write(
        dir.path(),
        "other.toml",
        &config_text(SIGNER, "trust_domain = \"cluster.local\"\n"),
    );
    let (pcr, _) = recorded_pcr("pcr-status-issued-ecdsap256");
    let request = write(dir.path(), "unserved.json", &pcr.to_string());
    let (code, answer) = policy_test(&other, &request, &[]);
    assert_eq!(code, 1);
    assert_eq!(
        (answer["decision"].as_str(), answer["reason"].as_str()),
        (Some("Failed"), Some("UnknownSigner"))
    );
    assert_eq!(
        answer["message"],
        "podca does not serve signer \"example.com/my-signer\""
    );
    // --signer decides it under a configured signer instead.
    let (code, answer) = policy_test(&other, &request, &["--signer", SIGNER]);
    assert_eq!((code, answer["decision"].as_str()), (0, Some("Issued")));
}

#[test]
fn descriptions_go_through_the_grpc_istio_and_jwt_rules() {
    let dir = tempfile::tempdir().unwrap();
    let policy = format!(
        "{POLICY}\n[[rules]]\nname = \"no_sts_for_shop\"\n\
         deny = \"request.source == 'jwt' && request.namespace == 'shop' && \
         request.audiences.exists(a, a.startsWith('sts.'))\"\nreason = \"AudienceNotAllowed\"\n\
         message = \"'namespace ' + request.namespace + ' may not ask for ' + \
         string(size(request.audiences)) + ' audiences with a cloud STS'\"\n"
    );
    let config = write(dir.path(), "podca.toml", &config_text(SIGNER, &policy));
    let case = |name: &str, yaml: &str| write(dir.path(), name, yaml);

    // podca.v1: the same message `podca dev` answers (cel_policy.rs).
    let grpc = case(
        "grpc.yaml",
        "source: grpc\nnamespace: shop\nservice_account: legacy\n",
    );
    let (code, a) = policy_test(&config, &grpc, &[]);
    assert_eq!(code, 1);
    assert_eq!(
        (&a["decision"], &a["reason"], &a["message"]),
        (
            &Value::from("Denied"),
            &Value::from("ServiceAccountRetired"),
            &Value::from("service account shop/legacy is retired")
        )
    );
    assert_eq!(a["decided_by"], "rule \"retired_accounts\" (2 of 3, deny)");

    let grpc = case(
        "grpc-ok.yaml",
        "source: grpc\nnamespace: shop\nservice_account: cart\npod: {name: cart-1, uid: u-1}\n\
         node: {name: node-a}\nkey_type: ED25519\nrequested_lifetime_seconds: 7200\n",
    );
    let (code, a) = policy_test(&config, &grpc, &[]);
    assert_eq!((code, a["decision"].as_str()), (0, Some("Issued")), "{a:#}");
    assert_eq!(
        a["issued"]["spiffe_id"],
        "spiffe://cluster.local/ns/shop/sa/cart"
    );
    assert_eq!(a["issued"]["lifetime_seconds"], 7200);

    let istio = case(
        "istio.yaml",
        "source: istio\nnamespace: quarantine\nservice_account: web\n\
         requested_lifetime_seconds: 3600\n",
    );
    let (code, a) = policy_test(&config, &istio, &[]);
    assert_eq!(code, 1);
    assert_eq!(
        a["message"],
        "namespace quarantine is quarantined (istio, pod , node )"
    );

    let jwt = case(
        "jwt.json",
        r#"{"source": "jwt", "namespace": "shop", "service_account": "web",
            "audiences": ["sts.amazonaws.com", "vault"]}"#,
    );
    let (code, a) = policy_test(&config, &jwt, &[]);
    assert_eq!(code, 1);
    assert_eq!(
        (&a["reason"], &a["message"]),
        (
            &Value::from("AudienceNotAllowed"),
            &Value::from("namespace shop may not ask for 2 audiences with a cloud STS")
        )
    );
    let jwt = case(
        "jwt-ok.yaml",
        "source: jwt\nnamespace: shop\nservice_account: web\naudiences: [vault]\n",
    );
    let (code, a) = policy_test(&config, &jwt, &[]);
    assert_eq!((code, a["decision"].as_str()), (0, Some("Issued")), "{a:#}");
    // [jwt] default_lifetime_seconds.
    assert_eq!(a["issued"]["lifetime_seconds"], 300);

    // The allow-list, before any rule; the text output names it too.
    let restricted = case(
        "restricted.yaml",
        "source: grpc\nnamespace: restricted\nservice_account: web\n",
    );
    let run = podca(&[
        "policy",
        "test",
        "--config",
        s(&config),
        "--request",
        s(&restricted),
    ]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stdout.contains("decision:   Denied\n")
            && run.stdout.contains("reason:     NamespaceNotAllowed\n")
            && run
                .stdout
                .contains("decided by: allow-list namespaces / excluded_namespaces\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn namespace_labels_come_from_the_file_or_are_empty() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "podca.toml",
        &config_text(
            SIGNER,
            "trust_domain = \"cluster.local\"\n[[rules]]\nname = \"production_only\"\n\
             require = \"has(namespaceObject.metadata.labels.tier) && \
             namespaceObject.metadata.labels.tier == 'prod'\"\n\
             reason = \"NamespaceNotProduction\"\n",
        ),
    );
    let request = write(
        dir.path(),
        "r.yaml",
        "source: grpc\nnamespace: shop\nservice_account: cart\n",
    );
    let (code, a) = policy_test(&config, &request, &[]);
    assert_eq!(
        (code, a["reason"].as_str()),
        (1, Some("NamespaceNotProduction"))
    );
    assert_eq!(
        a["notes"][0],
        "no --namespace-labels: the rules that read namespaceObject.metadata.labels saw an \
         empty map"
    );
    // A map namespace → labels.
    let map = write(dir.path(), "labels.yaml", "shop:\n  tier: prod\n");
    let (code, a) = policy_test(&config, &request, &["--namespace-labels", s(&map)]);
    assert_eq!((code, a["decision"].as_str()), (0, Some("Issued")), "{a:#}");
    // `kubectl get ns -o yaml`: a List of Namespaces; another namespace's labels do not count.
    let list = write(
        dir.path(),
        "ns.yaml",
        "apiVersion: v1\nkind: List\nitems:\n\
         - apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: shop\n    labels: {tier: dev}\n\
         - apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: prod\n    labels: {tier: prod}\n",
    );
    let (code, a) = policy_test(&config, &request, &["--namespace-labels", s(&list)]);
    assert_eq!(
        (code, a["reason"].as_str()),
        (1, Some("NamespaceNotProduction"))
    );
    assert_eq!(a["notes"], serde_json::json!([]));
    let other = write(
        dir.path(),
        "other.yaml",
        "source: grpc\nnamespace: billing\nservice_account: cart\n",
    );
    let (code, a) = policy_test(&config, &other, &["--namespace-labels", s(&list)]);
    assert_eq!(code, 1);
    assert_eq!(
        a["notes"][0],
        "namespace \"billing\" is not in --namespace-labels: the rules that read \
         namespaceObject.metadata.labels saw an empty map"
    );
}

/// Runs `podca policy <args>` expecting exit code `code`; its stderr (test) or stdout (lint).
fn fails_with(args: &[&str], code: i32) -> String {
    let run = podca(args);
    assert_eq!(
        run.code, code,
        "podca {args:?}: stdout {} stderr {}",
        run.stdout, run.stderr
    );
    format!("{}{}", run.stdout, run.stderr)
}

#[test]
fn bad_input_is_exit_code_2_and_names_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "podca.toml", &config_text(SIGNER, POLICY));
    let ok = write(
        dir.path(),
        "ok.yaml",
        "source: grpc\nnamespace: shop\nservice_account: cart\n",
    );
    let missing = dir.path().join("missing.yaml");
    let test = |config: &Path, request: &Path, extra: &[&str], want: &[&str]| {
        let mut args = vec![
            "policy",
            "test",
            "--config",
            s(config),
            "--request",
            s(request),
        ];
        args.extend_from_slice(extra);
        let out = fails_with(&args, 2);
        for w in want {
            assert!(out.contains(w), "{args:?}: {out:?} should contain {w:?}");
        }
        assert!(!out.contains("panicked"), "{out}");
    };
    test(
        &missing,
        &ok,
        &[],
        &["cannot read config file", "missing.yaml"],
    );
    test(
        &config,
        &missing,
        &[],
        &["cannot read request file", "missing.yaml"],
    );
    let bad_yaml = write(
        dir.path(),
        "bad.yaml",
        "source: grpc\nnamespace: [shop\nservice_account: cart\n",
    );
    test(
        &config,
        &bad_yaml,
        &[],
        &["request file", "bad.yaml", "not valid YAML", "line 3"],
    );
    let bad_json = write(
        dir.path(),
        "bad.json",
        "{\"source\": \"grpc\",\n  \"namespace\": }",
    );
    test(
        &config,
        &bad_json,
        &[],
        &["bad.json: not valid JSON", "line 2 column 16"],
    );
    let pod = write(
        dir.path(),
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\n",
    );
    test(
        &config,
        &pod,
        &[],
        &[
            "neither a PodCertificateRequest",
            "nor a request description",
            "this is kind \"Pod\"",
        ],
    );
    let typo = write(
        dir.path(),
        "typo.yaml",
        "source: grpc\nnamespace: shop\nserviceaccount: cart\n",
    );
    test(
        &config,
        &typo,
        &[],
        &["request description", "unknown field `serviceaccount`"],
    );
    let source = write(
        dir.path(),
        "source.yaml",
        "source: http\nnamespace: shop\nservice_account: cart\n",
    );
    test(
        &config,
        &source,
        &[],
        &["request description", "unknown variant `http`"],
    );
    let key = write(
        dir.path(),
        "key.yaml",
        "source: grpc\nnamespace: shop\nservice_account: cart\nkey_type: DSA\n",
    );
    test(&config, &key, &[], &["unknown variant `DSA`"]);
    let lifetime = write(
        dir.path(),
        "lifetime.yaml",
        "source: grpc\nnamespace: shop\nservice_account: cart\nrequested_lifetime_seconds: 0\n",
    );
    test(
        &config,
        &lifetime,
        &[],
        &["requested_lifetime_seconds must be positive, not 0"],
    );
    let pcr_field = write(
        dir.path(),
        "pcr.yaml",
        "apiVersion: certificates.k8s.io/v1\nkind: PodCertificateRequest\n\
         metadata: {name: r, namespace: shop}\n\
         spec: {signerName: example.com/workload, maxExpirationSeconds: long}\n",
    );
    test(
        &config,
        &pcr_field,
        &[],
        &[
            "request file",
            "not a valid certificates.k8s.io/v1 PodCertificateRequest",
            "invalid type",
        ],
    );
    let no_stub = write(
        dir.path(),
        "no-stub.yaml",
        "apiVersion: certificates.k8s.io/v1\nkind: PodCertificateRequest\n\
         metadata: {name: r, namespace: shop}\nspec: {signerName: example.com/workload}\n",
    );
    test(
        &config,
        &no_stub,
        &[],
        &["spec.stubPKCS10Request is empty", "only through v1beta1"],
    );
    let beta = write(
        dir.path(),
        "beta.yaml",
        "apiVersion: certificates.k8s.io/v2\nkind: PodCertificateRequest\n\
         metadata: {name: r, namespace: shop}\nspec: {}\n",
    );
    test(
        &config,
        &beta,
        &[],
        &["apiVersion \"certificates.k8s.io/v2\": a PodCertificateRequest is"],
    );
    test(
        &config,
        &ok,
        &["--signer", "example.com/nope"],
        &[
            "--signer \"example.com/nope\" is not a configured signer",
            "configured: \"example.com/workload\"",
        ],
    );
    test(
        &config,
        &ok,
        &["--now", "yesterday"],
        &["\"yesterday\" is not an RFC 3339 time"],
    );
    let labels = write(dir.path(), "labels.yaml", "shop: prod\n");
    test(
        &config,
        &ok,
        &["--namespace-labels", s(&labels)],
        &[
            "namespace labels file",
            "labels.yaml",
            "expected a map namespace → labels",
        ],
    );
}

#[test]
fn a_rule_that_does_not_compile_is_reported_with_its_position_by_test_and_lint() {
    let dir = tempfile::tempdir().unwrap();
    let broken = format!(
        "{POLICY}\n[[rules]]\nname = \"typo\"\n\
         deny = \"request.namespace == 'a' && request.servce_account == 'b'\"\nreason = \"Typo\"\n\
         [[rules]]\nname = \"multiline\"\nrequire = \"true &&\\n  request.nope\"\n\
         reason = \"NotBool\"\n"
    );
    let config = write(dir.path(), "podca.toml", &config_text(SIGNER, &broken));
    let request = write(
        dir.path(),
        "r.yaml",
        "source: grpc\nnamespace: shop\nservice_account: cart\n",
    );
    let typo = "rule \"typo\" at deny 1:36: request has no field \"servce_account\"";
    let out = fails_with(
        &[
            "policy",
            "test",
            "--config",
            s(&config),
            "--request",
            s(&request),
        ],
        2,
    );
    assert!(
        out.contains(&format!("signer \"{SIGNER}\"")) && out.contains(typo),
        "{out}"
    );
    // lint: every broken rule, each with signer, rule, field and line:column; exit 1.
    let out = fails_with(&["policy", "lint", "--config", s(&config)], 1);
    assert!(
        out.contains(&format!("error: signer \"{SIGNER}\": {typo} (fields: ")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "error: signer \"{SIGNER}\": rule \"multiline\" at require 2:10: request has no field \"nope\""
        )),
        "{out}"
    );
    assert!(
        out.contains(": 2 errors, 0 warnings (1 signer, 4 rules)"),
        "{out}"
    );
}

#[test]
fn lint_passes_a_clean_config_and_warns_about_unverified_and_constant_rules() {
    let dir = tempfile::tempdir().unwrap();
    let clean = write(dir.path(), "clean.toml", &config_text(SIGNER, POLICY));
    let run = podca(&["policy", "lint", "--config", s(&clean)]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(
        run.stdout,
        format!(
            "{}: 0 errors, 0 warnings (1 signer, 2 rules)\n",
            clean.display()
        )
    );
    let warned = format!(
        "{POLICY}\n[[rules]]\nname = \"team_annotation\"\n\
         require = \"request.namespace == 'shop' || request.annotations['team'] == 'x'\"\n\
         reason = \"NoTeam\"\n\
         [[rules]]\nname = \"always\"\ndeny = \"1 == 1\"\nreason = \"Always\"\n\
         [[rules]]\nname = \"never\"\nrequire = \"true\"\nreason = \"Never\"\n"
    );
    let config = write(dir.path(), "warned.toml", &config_text(SIGNER, &warned));
    let run = podca(&["policy", "lint", "--config", s(&config)]);
    assert_eq!(
        run.code, 0,
        "warnings do not fail: {}{}",
        run.stdout, run.stderr
    );
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{}", run.stdout);
    assert!(
        lines[0].starts_with(&format!(
            "warning: signer \"{SIGNER}\": rule \"team_annotation\" at require 1:39: reads \
             request.annotations, which the workload writes"
        )),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[1],
        format!(
            "warning: signer \"{SIGNER}\": rule \"always\" (deny): reads no request fact \
             (request, namespaceObject, pod, now): it is constant and denies every request"
        )
    );
    assert!(
        lines[2].ends_with("it is constant and never denies"),
        "{}",
        lines[2]
    );
    // Issue #42: the key "team" is not declared (`annotations`), so the rule can never see it.
    assert_eq!(
        lines[3],
        format!(
            "warning: signer \"{SIGNER}\": \"team_annotation\" reads the annotation \"team\", \
             which this signer does not declare (`annotations`): a request carrying it is denied \
             before the rules run"
        )
    );
    assert!(lines[4].ends_with(": 0 errors, 4 warnings (1 signer, 5 rules)"));
    // The same as one JSON object, for CI tooling.
    let run = podca(&["policy", "lint", "--config", s(&config), "-o", "json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let answer = run.json();
    assert_eq!(answer["config"], s(&config));
    assert_eq!(answer["errors"], serde_json::json!([]));
    assert_eq!(
        answer["warnings"].as_array().unwrap().len(),
        4,
        "{answer:#}"
    );
    assert_eq!(
        answer["warnings"][1],
        lines[1].trim_start_matches("warning: ")
    );
    assert_eq!(
        (answer["signers"].as_u64(), answer["rules"].as_u64()),
        (Some(1), Some(5))
    );

    // Not a signer's error: the loader's message; a TOML error with its position.
    let grpc = write(
        dir.path(),
        "grpc.toml",
        &format!(
            "{}\n[grpc]\nmax_dns_names = 0\n",
            config_text(SIGNER, POLICY)
        ),
    );
    let out = fails_with(&["policy", "lint", "--config", s(&grpc)], 1);
    assert!(
        out.contains("error: config file")
            && out.contains("[grpc] max_dns_names must be at least 1"),
        "{out}"
    );
    let toml_error = write(
        dir.path(),
        "bad.toml",
        "[signers.\"a.example/x\"]\ntrust_domain = \n",
    );
    let out = fails_with(&["policy", "lint", "--config", s(&toml_error)], 1);
    assert!(
        out.contains("bad.toml: TOML parse error at line 2, column"),
        "{out}"
    );
    let out = fails_with(
        &[
            "policy",
            "lint",
            "--config",
            s(&dir.path().join("none.toml")),
        ],
        2,
    );
    assert!(out.contains("cannot read config file"), "{out}");
}

#[test]
fn pod_facts_come_from_the_pod_file_and_a_foreign_pod_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let rule = "[[rules]]\nname = \"canary_only\"\n\
                require = \"'track' in pod.labels && pod.labels['track'] == 'canary'\"\n\
                reason = \"NotCanary\"\n";
    let config = write(
        dir.path(),
        "podca.toml",
        &config_text(
            SIGNER,
            &format!("trust_domain = \"cluster.local\"\npod_facts = true\n{rule}"),
        ),
    );
    let request = write(
        dir.path(),
        "r.yaml",
        "source: grpc\nnamespace: shop\nservice_account: cart\npod: {name: cart-1, uid: u-1}\n",
    );
    let pod = |name: &str, uid: &str, track: &str| {
        write(
            dir.path(),
            &format!("{name}-{uid}-{track}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: shop\n  \
                 uid: {uid}\n  labels: {{track: {track}}}\n"
            ),
        )
    };

    // Without --pod the rules see empty maps, and the output says so.
    let (code, a) = policy_test(&config, &request, &[]);
    assert_eq!(
        (code, a["reason"].as_str()),
        (1, Some("NotCanary")),
        "{a:#}"
    );
    assert_eq!(
        a["notes"][0],
        "no --pod: the rules that read pod.labels and pod.annotations saw empty maps (podca \
         reads the pod)"
    );
    // The request's pod, labelled: issued.
    let canary = pod("cart-1", "u-1", "canary");
    let (code, a) = policy_test(&config, &request, &["--pod", s(&canary)]);
    assert_eq!((code, a["decision"].as_str()), (0, Some("Issued")), "{a:#}");
    assert_eq!(a["notes"], serde_json::json!([]));
    let stable = pod("cart-1", "u-1", "stable");
    let (code, a) = policy_test(&config, &request, &["--pod", s(&stable)]);
    assert_eq!(
        (code, a["reason"].as_str()),
        (1, Some("NotCanary")),
        "{a:#}"
    );
    // Another pod of that name (recreated): podca would not find the request's pod.
    let replaced = pod("cart-1", "u-2", "canary");
    let (code, a) = policy_test(&config, &request, &["--pod", s(&replaced)]);
    assert_eq!(
        (code, a["reason"].as_str()),
        (1, Some("PolicyPodNotFound")),
        "{a:#}"
    );
    assert_eq!(
        a["message"],
        "--pod is pod cart-1 (UID u-2), not the request's pod cart-1 (UID u-1): podca would \
         find no such pod"
    );

    // Not a Pod, and a rule reading pod without pod_facts: input and config errors.
    let namespace = write(
        dir.path(),
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n",
    );
    let out = fails_with(
        &[
            "policy",
            "test",
            "--config",
            s(&config),
            "--request",
            s(&request),
            "--pod",
            s(&namespace),
        ],
        2,
    );
    assert!(
        out.contains("not a Pod (kind: Pod; `kubectl get pod NAME -o yaml` prints one)"),
        "{out}"
    );
    let off = write(
        dir.path(),
        "off.toml",
        &config_text(SIGNER, &format!("trust_domain = \"cluster.local\"\n{rule}")),
    );
    let out = fails_with(&["policy", "lint", "--config", s(&off)], 1);
    assert!(
        out.contains(
            "rule \"canary_only\" reads the pod (pod.labels, pod.annotations), which needs \
             pod_facts = true for this signer"
        ),
        "{out}"
    );
}
