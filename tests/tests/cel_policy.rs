//! Declarative issuance policy in CEL (issue #19), end to end: one rule set applied to
//! PodCertificateRequests (the in-process controller against the emulator), to podca.v1 and the
//! Istio CA API (`podca dev`), and to JWT-SVIDs; CEL outputs (DNS names, a lifetime cap) visible
//! in the certificates of each path; a namespace-label rule that follows a label edit without a
//! restart; and a config whose rule does not compile refused at start-up.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_controller::Options;
use podca_proto::podca::v1::IssueCertificateRequest;
use podca_signer::rules::NamespaceLabels;
use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey, SignerPolicy};
use podca_tests::Emulator;
use podca_tests::cluster::{Cluster, NewPcr, PODCA_USER};
use podca_tests::emulator::{ApiMode, FaultScope, PodFixture, PolicyRule, Res, Subject};
use podca_tests::process::{DevOptions, DevProcess, csr_for, podca_binary};
use podca_tests::sim::install_crypto;
use tokio::sync::oneshot;
use tonic::{Code, Request};

const SIGNER: &str = "example.com/workload";

/// The rules every path shares. The message names verified facts, so that the test sees
/// they reached the rule.
const RULES: &str = r#"
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

/// Outputs every path shares: the namespace's service name plus the annotation's names (the
/// CEL form of `allowed_dns_names`), and a two-hour lifetime cap.
const OUTPUTS: &str = r#"
[outputs]
dns_names = "[request.namespace + '.svc'] + ('podca.dev/dns-names' in request.annotations ? request.annotations['podca.dev/dns-names'].split(',').map(n, n.trim().lowerAscii()).filter(n, n != '') : [])"
max_lifetime_seconds = "request.namespace == 'quarantine' ? 0 : 7200"
"#;

/// The config of `podca dev` with `rules` (and `outputs`) for [`SIGNER`].
fn dev_config(rules: &str) -> String {
    format!(
        "[grpc]\nistio = true\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"podca.dev.local\"\n{}",
        rules
            .replace("[[rules]]", &format!("[[signers.\"{SIGNER}\".rules]]"))
            .replace("[outputs]", &format!("[signers.\"{SIGNER}\".outputs]"))
    )
}

/// The leaf's DNS names and lifetime in seconds.
fn leaf_dns_and_lifetime(chain_pem: &str) -> (Vec<String>, i64) {
    let blocks = pem::parse_many(chain_pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(blocks[0].contents()).unwrap();
    let dns = cert
        .subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let v = cert.validity();
    (dns, v.not_after.timestamp() - v.not_before.timestamp())
}

/// A rule on namespace labels, for PCRs only.
const LABEL_RULE: &str = r#"
[[rules]]
name = "production_only"
require = "request.source != 'pcr' || (has(namespaceObject.metadata.labels.tier) && namespaceObject.metadata.labels.tier == 'prod')"
reason = "NamespaceNotProduction"
message = "'namespace ' + request.namespace + ' is not labelled tier=prod'"
"#;

fn policy(rules: &str) -> SignerPolicy {
    let policy: SignerPolicy =
        toml::from_str(&format!("trust_domain = \"cluster.local\"\n{rules}")).unwrap();
    policy.validate().unwrap();
    policy
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

struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), podca_controller::Error>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("controller stops in time")
            .expect("join")
            .expect("controller ran without error");
    }
}

async fn start(c: &Cluster, policy: SignerPolicy, labels: Option<NamespaceLabels>) -> Running {
    let client = podca_controller::connect(Some(&c.kubeconfig))
        .await
        .unwrap();
    let mut options = Options::new(BTreeMap::from([(SIGNER.to_string(), policy)]), ca());
    options.namespace_labels = labels;
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(podca_controller::run(client, options, async move {
        let _ = rx.await;
    }));
    Running { stop, task }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcr_denied_with_the_rules_reason_and_message() {
    install_crypto();
    let c = Cluster::start(ApiMode::V1Only, &[SIGNER]).await;
    let ctl = start(&c, policy(RULES), None).await;
    let mut denied = NewPcr::p256("req-quarantined", SIGNER);
    denied.namespace = "quarantine";
    denied.file(&c.admin).await;
    NewPcr::p256("req-ok", SIGNER).file(&c.admin).await;

    let (ty, reason, message) = settled(&c.emu, "quarantine", "req-quarantined").await;
    assert_eq!(
        (ty.as_str(), reason.as_str()),
        ("Denied", "NamespaceQuarantined")
    );
    assert_eq!(
        message,
        "namespace quarantine is quarantined (pcr, pod pod-req-quarantined, node node-1)"
    );
    let (ty, reason, _) = settled(&c.emu, "apps", "req-ok").await;
    assert_eq!((ty.as_str(), reason.as_str()), ("Issued", "Issued"));
    assert_eq!(c.emu.counters().validation_rejections, 0);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_label_rule_follows_a_label_edit_without_a_restart() {
    install_crypto();
    let c = Cluster::start(ApiMode::V1Only, &[SIGNER]).await;
    // podca's namespace permission: only deployments whose rules read namespace labels get it.
    c.emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&[""], &["namespaces"], &["list", "watch"]),
    );
    c.emu.set_namespace_labels("apps", &[("tier", "prod")]);
    let labels = NamespaceLabels::default();
    let ctl = start(&c, policy(LABEL_RULE), Some(labels.clone())).await;

    NewPcr::p256("req-prod", SIGNER).file(&c.admin).await;
    let (ty, _, _) = settled(&c.emu, "apps", "req-prod").await;
    assert_eq!(ty, "Issued");

    c.emu.set_namespace_labels("apps", &[("tier", "dev")]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while labels.get("apps").unwrap().get("tier").map(String::as_str) != Some("dev") {
        assert!(Instant::now() < deadline, "the label edit did not arrive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    NewPcr::p256("req-dev", SIGNER).file(&c.admin).await;
    let (ty, reason, message) = settled(&c.emu, "apps", "req-dev").await;
    assert_eq!(
        (ty.as_str(), reason.as_str()),
        ("Denied", "NamespaceNotProduction")
    );
    assert_eq!(message, "namespace apps is not labelled tier=prod");
    // The watch asked for metadata only (list and watch), never whole namespaces.
    assert!(c.emu.counters().metadata_only_requests >= 2);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podca_v1_answers_permission_denied_with_the_rules_message() {
    let config = format!(
        "[signers.\"{SIGNER}\"]\ntrust_domain = \"podca.dev.local\"\n{}",
        RULES.replace("[[rules]]", &format!("[[signers.\"{SIGNER}\".rules]]"))
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    let ask = |namespace: &str, service_account: &str| {
        let mut request = Request::new(IssueCertificateRequest {
            csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
            ..Default::default()
        });
        let md = request.metadata_mut();
        md.insert("x-podca-namespace", namespace.parse().unwrap());
        md.insert("x-podca-service-account", service_account.parse().unwrap());
        request
    };
    let status = client
        .issue_certificate(ask("shop", "legacy"))
        .await
        .expect_err("the rule denies");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        status.message(),
        "ServiceAccountRetired: service account shop/legacy is retired"
    );
    let status = client
        .issue_certificate(ask("quarantine", "app"))
        .await
        .expect_err("the rule denies");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        status.message(),
        "NamespaceQuarantined: namespace quarantine is quarantined (grpc, pod , node )"
    );
    let issued = client
        .issue_certificate(ask("shop", "cart"))
        .await
        .expect("no rule denies")
        .into_inner();
    assert_eq!(issued.spiffe_id, "spiffe://podca.dev.local/ns/shop/sa/cart");
}

#[test]
fn a_rule_that_does_not_compile_stops_podca_dev() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[signers.\"{SIGNER}\"]\ntrust_domain = \"podca.dev.local\"\n\
             [[signers.\"{SIGNER}\".rules]]\nname = \"typo\"\n\
             deny = \"request.namespace == 'a' && request.servce_account == 'b'\"\n\
             reason = \"Typo\"\n"
        ),
    )
    .unwrap();
    let out = Command::new(podca_binary())
        .arg("dev")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--grpc-listen")
        .arg("127.0.0.1:0")
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--config")
        .arg(&config)
        .env_remove("PODCA_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success(), "podca dev must refuse to start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("signer \"{SIGNER}\""))
            && stderr
                .contains("rule \"typo\" at deny 1:36: request has no field \"servce_account\""),
        "{stderr}"
    );
    assert!(!dir.path().join("s.sock").exists());
}

/// JWT-SVIDs go through the same rules, with `request.source == "jwt"` and the requested
/// audiences, and the `max_lifetime_seconds` output caps their lifetime: podca.v1
/// `IssueJwtSvid` and the Workload API's `FetchJWTSVID` path share them.
#[tokio::test(flavor = "multi_thread")]
async fn jwt_svids_are_decided_by_the_rules_with_their_audiences() {
    use podca_proto::podca::v1::IssueJwtSvidRequest;
    let config = format!(
        "[signers.\"{SIGNER}\"]\ntrust_domain = \"podca.dev.local\"\n\
         [[signers.\"{SIGNER}\".rules]]\nname = \"no_cloud_iam_for_shop\"\n\
         deny = \"request.source == 'jwt' && request.namespace == 'shop' && \
         request.audiences.exists(a, a.startsWith('sts.'))\"\n\
         reason = \"AudienceNotAllowed\"\n\
         message = \"'namespace ' + request.namespace + ' may not ask for ' + \
         string(size(request.audiences)) + ' audiences with a cloud STS'\"\n\
         [signers.\"{SIGNER}\".outputs]\n\
         max_lifetime_seconds = \"request.source == 'jwt' && request.namespace == 'payments' \
         ? 60 : 7200\"\n"
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    let ask = |namespace: &str, audience: &str| {
        let mut request = Request::new(IssueJwtSvidRequest {
            audiences: vec![audience.into(), "vault".into()],
            ..Default::default()
        });
        let md = request.metadata_mut();
        md.insert("x-podca-namespace", namespace.parse().unwrap());
        md.insert("x-podca-service-account", "web".parse().unwrap());
        request
    };
    let status = client
        .issue_jwt_svid(ask("shop", "sts.amazonaws.com"))
        .await
        .expect_err("the rule denies");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        status.message(),
        "AudienceNotAllowed: namespace shop may not ask for 2 audiences with a cloud STS"
    );
    // Another audience, or another namespace: the rule does not match.
    for (namespace, audience) in [("shop", "api.example"), ("payments", "sts.amazonaws.com")] {
        let svid = client
            .issue_jwt_svid(ask(namespace, audience))
            .await
            .unwrap_or_else(|s| panic!("{namespace} {audience}: {s:?}"))
            .into_inner();
        assert_eq!(
            svid.spiffe_id,
            format!("spiffe://podca.dev.local/ns/{namespace}/sa/web")
        );
        // The output caps the token's lifetime for payments; shop keeps the [jwt] default
        // (five minutes), under the 7200 s cap.
        let lifetime = svid.expires_at.unwrap().seconds - svid.issued_at.unwrap().seconds;
        let want = if namespace == "payments" { 60 } else { 300 };
        assert_eq!(lifetime, want, "{namespace}");
    }
    // The certificate path is not source jwt: the same identity still gets a certificate.
    let mut request = Request::new(IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-podca-namespace", "shop".parse().unwrap());
    request
        .metadata_mut()
        .insert("x-podca-service-account", "web".parse().unwrap());
    client
        .issue_certificate(request)
        .await
        .expect("rules see source grpc");
    drop(client);
    assert!(dev.stop().success());
}

/// CEL outputs on the PCR path: the issued certificate carries the computed DNS names and the
/// capped lifetime (not the 24 h the PCR asks for); a wildcard from the annotation denies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcr_certificates_carry_the_outputs_dns_names_and_lifetime_cap() {
    install_crypto();
    let c = Cluster::start(ApiMode::V1Only, &[SIGNER]).await;
    let ctl = start(&c, policy(&format!("{RULES}{OUTPUTS}")), None).await;
    let mut named = NewPcr::p256("req-named", SIGNER);
    named.annotations = Some(serde_json::json!({
        "podca.dev/dns-names": "API.apps.svc, db.apps.svc,,api.apps.svc"
    }));
    named.file(&c.admin).await;
    let mut wildcard = NewPcr::p256("req-wildcard", SIGNER);
    wildcard.annotations = Some(serde_json::json!({ "podca.dev/dns-names": "*.apps.svc" }));
    wildcard.file(&c.admin).await;

    let (ty, _, message) = settled(&c.emu, "apps", "req-named").await;
    assert_eq!(ty, "Issued", "{message}");
    let pcr = c.emu.get_object(Res::Pcr, "apps", "req-named").unwrap();
    let chain = pcr["status"]["certificateChain"].as_str().expect("chain");
    assert_eq!(
        leaf_dns_and_lifetime(chain),
        (
            vec![
                "apps.svc".to_string(),
                "api.apps.svc".to_string(),
                "db.apps.svc".to_string()
            ],
            7200
        )
    );
    let (ty, reason, message) = settled(&c.emu, "apps", "req-wildcard").await;
    assert_eq!(
        (ty.as_str(), reason.as_str()),
        ("Denied", "PolicyOutputInvalid:dns_names")
    );
    assert!(
        message.starts_with("output dns_names gave \"*.apps.svc\", which is not a DNS name"),
        "{message}"
    );
    assert_eq!(c.emu.counters().validation_rejections, 0);
    ctl.stop().await;
}

/// The Istio leg of "identically through every API": the rules that deny PCRs and podca.v1
/// deny the Istio CA API with PERMISSION_DENIED and the rule's reason and message, and the
/// outputs shape the certificates of both gRPC APIs (DNS names, the two-hour cap); an output
/// that gives an invalid cap denies on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_and_podca_v1_follow_the_same_rules_and_outputs() {
    use podca_proto::istio::v1::auth::IstioCertificateRequest;
    use podca_tests::istio::{Ztunnel, ztunnel_csr};
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&dev_config(&format!("{RULES}{OUTPUTS}"))),
        ..Default::default()
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", dev.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut ztunnel = Ztunnel::new(channel, None, "podca.dev.local");
    let headers = ztunnel.clone();
    let istio = |ns: &str, sa: &str| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let id = format!("spiffe://podca.dev.local/ns/{ns}/sa/{sa}");
        let mut request = headers.request(IstioCertificateRequest {
            csr: ztunnel_csr(&key, &[&id]),
            validity_duration: 86_400,
            metadata: None,
        });
        let md = request.metadata_mut();
        md.insert("x-podca-namespace", ns.parse().unwrap());
        md.insert("x-podca-service-account", sa.parse().unwrap());
        request
    };
    for (ns, sa, want) in [
        (
            "shop",
            "legacy",
            "ServiceAccountRetired: service account shop/legacy is retired",
        ),
        (
            "quarantine",
            "app",
            "NamespaceQuarantined: namespace quarantine is quarantined (istio, pod , node )",
        ),
    ] {
        let status = ztunnel
            .client
            .create_certificate(istio(ns, sa))
            .await
            .expect_err("the rule denies");
        assert_eq!(
            (status.code(), status.message()),
            (Code::PermissionDenied, want),
            "{status:?}"
        );
    }
    let answer = ztunnel
        .client
        .create_certificate(istio("shop", "cart"))
        .await
        .expect("no rule denies")
        .into_inner();
    let chain = answer.cert_chain[..answer.cert_chain.len() - 1].concat();
    assert_eq!(
        leaf_dns_and_lifetime(&chain),
        (vec!["shop.svc".to_string()], 7200)
    );

    // podca.v1 on the same listener: the annotation's names and the cap.
    let mut client = dev.tcp_client().await;
    let mut request = Request::new(IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        requested_lifetime_seconds: Some(86_400),
        user_annotations: [(
            "podca.dev/dns-names".to_string(),
            "cart.shop.svc".to_string(),
        )]
        .into(),
        ..Default::default()
    });
    let md = request.metadata_mut();
    md.insert("x-podca-namespace", "shop".parse().unwrap());
    md.insert("x-podca-service-account", "cart".parse().unwrap());
    let issued = client
        .issue_certificate(request)
        .await
        .expect("no rule denies")
        .into_inner();
    assert_eq!(
        leaf_dns_and_lifetime(&issued.certificate_chain_pem),
        (
            vec!["shop.svc".to_string(), "cart.shop.svc".to_string()],
            7200
        )
    );
    drop(client);
    assert!(dev.stop().success());
}

/// An output that gives an invalid cap denies (fail closed) with its reason, on podca.v1 and
/// the Istio API alike, and no rule is needed for that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_output_denies_on_every_grpc_api() {
    use podca_proto::istio::v1::auth::IstioCertificateRequest;
    use podca_tests::istio::{Ztunnel, ztunnel_csr};
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&dev_config(OUTPUTS)),
        ..Default::default()
    });
    let want = "PolicyOutputInvalid:max_lifetime_seconds: output max_lifetime_seconds gave 0; \
                a certificate's lifetime cap must be at least 3600 seconds";
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", dev.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut ztunnel = Ztunnel::new(channel, None, "podca.dev.local");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut request = ztunnel.request(IstioCertificateRequest {
        csr: ztunnel_csr(&key, &["spiffe://podca.dev.local/ns/quarantine/sa/app"]),
        validity_duration: 3600,
        metadata: None,
    });
    let md = request.metadata_mut();
    md.insert("x-podca-namespace", "quarantine".parse().unwrap());
    md.insert("x-podca-service-account", "app".parse().unwrap());
    let status = ztunnel
        .client
        .create_certificate(request)
        .await
        .expect_err("the output denies");
    assert_eq!(
        (status.code(), status.message()),
        (Code::PermissionDenied, want)
    );
    let mut client = dev.tcp_client().await;
    let mut request = Request::new(IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        ..Default::default()
    });
    let md = request.metadata_mut();
    md.insert("x-podca-namespace", "quarantine".parse().unwrap());
    md.insert("x-podca-service-account", "app".parse().unwrap());
    let status = client
        .issue_certificate(request)
        .await
        .expect_err("the output denies");
    assert_eq!(
        (status.code(), status.message()),
        (Code::PermissionDenied, want)
    );
    drop(client);
    assert!(dev.stop().success());
}

/// A rule on the pod's labels and annotations (`pod_facts`), for PCRs.
const POD_RULE: &str = r#"
pod_facts = true
excluded_namespaces = ["blocked"]

[[rules]]
name = "labelled_pods_only"
require = "'certs.example.com/allowed' in pod.labels && pod.labels['certs.example.com/allowed'] == 'true'"
reason = "PodNotLabelled"
message = "'pod ' + request.pod.name + ' (team ' + ('team' in pod.annotations ? pod.annotations['team'] : 'none') + ') lacks certs.example.com/allowed=true'"
"#;

/// The pod a [`NewPcr`] names (`pod-<name>` in `apps`, service account `app`, `node-1`), with
/// `uid` and `labels`.
fn add_request_pod(c: &Cluster, pcr: &NewPcr<'_>, uid: &str, labels: &[(&str, &str)]) {
    let name = format!("pod-{}", pcr.name);
    c.emu.add_pod(&PodFixture {
        namespace: pcr.namespace.into(),
        name: name.clone(),
        node_name: "node-1".into(),
        service_account: "app".into(),
        pod_certificates: vec![],
        uid: Some(uid.into()),
        mirror: false,
    });
    assert!(
        c.emu
            .set_pod_metadata(pcr.namespace, &name, labels, &[("team", "payments")])
    );
}

/// `podca_policy_pod_reads_total{result}` of `policy`'s rules (shared with the clone the
/// controller serves).
fn pod_reads(policy: &SignerPolicy, result: &str) -> u64 {
    let counts = policy.compiled_rules().expect("rules").counts();
    counts
        .pod_reads
        .iter()
        .find(|(r, _)| *r == result)
        .map_or(0, |(_, n)| *n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_label_rules_read_each_requests_pod_and_check_its_uid() {
    install_crypto();
    // The signer's RBAC here includes `pods get` (deploy/components/pod-facts).
    let c = Cluster::start(ApiMode::V1Only, &[SIGNER]).await;
    let allowed = NewPcr::p256("req-allowed", SIGNER);
    add_request_pod(
        &c,
        &allowed,
        &allowed.pod_uid,
        &[("certs.example.com/allowed", "true")],
    );
    let unlabelled = NewPcr::p256("req-unlabelled", SIGNER);
    add_request_pod(&c, &unlabelled, &unlabelled.pod_uid, &[("app", "web")]);
    // Labelled after it was created and before its request: the read is per request.
    let relabelled = NewPcr::p256("req-relabelled", SIGNER);
    add_request_pod(&c, &relabelled, &relabelled.pod_uid, &[]);
    assert!(c.emu.set_pod_metadata(
        "apps",
        "pod-req-relabelled",
        &[("certs.example.com/allowed", "true")],
        &[],
    ));
    // A pod of that name, but another pod (recreated): its labels are not the request's.
    let replaced = NewPcr::p256("req-replaced", SIGNER);
    add_request_pod(
        &c,
        &replaced,
        "0e0e0e0e-0000-4000-8000-00000000beef",
        &[("certs.example.com/allowed", "true")],
    );
    let gone = NewPcr::p256("req-gone", SIGNER);
    // Its pod runs as another service account than the request names: a creator that is not a
    // node is not cross-checked by the API server (spec §2.1.9), so podca checks (issue #40).
    let other_account = NewPcr::p256("req-other-account", SIGNER);
    c.emu.add_pod(&PodFixture {
        namespace: "apps".into(),
        name: "pod-req-other-account".into(),
        node_name: "node-1".into(),
        service_account: "db".into(),
        pod_certificates: vec![],
        uid: Some(other_account.pod_uid.clone()),
        mirror: false,
    });
    assert!(c.emu.set_pod_metadata(
        "apps",
        "pod-req-other-account",
        &[("certs.example.com/allowed", "true")],
        &[],
    ));
    // An excluded namespace: the allow-list denies it, and its pod (there is none) is never read.
    c.emu.add_namespace("blocked");
    let blocked = NewPcr {
        namespace: "blocked",
        ..NewPcr::p256("req-blocked", SIGNER)
    };

    let watched = policy(POD_RULE);
    let ctl = start(&c, watched.clone(), None).await;
    for pcr in [
        &allowed,
        &unlabelled,
        &relabelled,
        &replaced,
        &gone,
        &other_account,
        &blocked,
    ] {
        pcr.file(&c.admin).await;
    }
    let (ty, reason, _) = settled(&c.emu, "blocked", "req-blocked").await;
    assert_eq!(
        (ty.as_str(), reason.as_str()),
        ("Denied", "NamespaceNotAllowed")
    );
    let (ty, _, _) = settled(&c.emu, "apps", "req-allowed").await;
    assert_eq!(ty, "Issued");
    let (ty, _, _) = settled(&c.emu, "apps", "req-relabelled").await;
    assert_eq!(ty, "Issued");
    let (ty, reason, message) = settled(&c.emu, "apps", "req-unlabelled").await;
    assert_eq!((ty.as_str(), reason.as_str()), ("Denied", "PodNotLabelled"));
    assert_eq!(
        message,
        "pod pod-req-unlabelled (team payments) lacks certs.example.com/allowed=true"
    );
    let (ty, reason, message) = settled(&c.emu, "apps", "req-replaced").await;
    assert_eq!(
        (ty.as_str(), reason.as_str()),
        ("Denied", "PolicyPodNotFound")
    );
    assert!(
        message.contains(&format!(
            "pod apps/pod-req-replaced is not the pod of this request (UID \
             0e0e0e0e-0000-4000-8000-00000000beef, the request names {})",
            replaced.pod_uid
        )),
        "{message}"
    );
    let (ty, reason, message) = settled(&c.emu, "apps", "req-gone").await;
    assert_eq!(
        (ty.as_str(), reason.as_str()),
        ("Denied", "PolicyPodNotFound")
    );
    assert!(
        message.starts_with("pod apps/pod-req-gone does not exist"),
        "{message}"
    );
    let (ty, reason, message) = settled(&c.emu, "apps", "req-other-account").await;
    assert_eq!(
        (ty.as_str(), reason.as_str()),
        ("Denied", "PolicyPodNotFound")
    );
    assert!(
        message.contains(
            "pod apps/pod-req-other-account runs as service account \"db\", but the request \
             names \"app\""
        ),
        "{message}"
    );
    let reads: Vec<u64> = ["found", "not_found", "uid_mismatch"]
        .iter()
        .map(|r| pod_reads(&watched, r))
        .collect();
    // One GET per admitted request: three found, one missing, one replaced, one of another
    // account; none for blocked.
    assert_eq!(reads, [3, 1, 2]);
    assert_eq!(c.emu.counters().validation_rejections, 0);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_rule_request_waits_while_its_pod_cannot_be_read() {
    install_crypto();
    let c = Cluster::start(ApiMode::V1Only, &[SIGNER]).await;
    let pcr = NewPcr::p256("req-waits", SIGNER);
    add_request_pod(
        &c,
        &pcr,
        &pcr.pod_uid,
        &[("certs.example.com/allowed", "true")],
    );
    // The API refuses the first three reads of the pod (as with the RBAC rule missing).
    c.emu.inject_errors(
        403,
        3,
        FaultScope::PathContains("/namespaces/apps/pods/pod-req-waits".into()),
    );
    let watched = policy(POD_RULE);
    let ctl = start(&c, watched.clone(), None).await;
    pcr.file(&c.admin).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while pod_reads(&watched, "error") < 2 {
        assert!(
            Instant::now() < deadline,
            "the controller did not try the pod"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Two refused reads, a third to come: the request is pending, neither denied nor issued.
    let o = c.emu.get_object(Res::Pcr, "apps", "req-waits").unwrap();
    assert!(
        o["status"]["conditions"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{o:#}"
    );
    // Once the pod can be read, the next retry decides.
    let (ty, _, _) = settled(&c.emu, "apps", "req-waits").await;
    assert_eq!(ty, "Issued");
    assert_eq!(pod_reads(&watched, "error"), 3);
    ctl.stop().await;
}

/// Issue #42: a signer's declared annotation reaches its rules on the PCR path, and the
/// controller against the emulator decides each PCR exactly as `podca policy test` does for the
/// same object (the PCR as the API server holds it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_annotations_decide_on_the_emulator_as_policy_test_does() {
    install_crypto();
    const DECLARED: &str = r#"
[[annotations]]
key = "example.com/ticket"
pattern = "T-*"
max_length = 8

[[rules]]
name = "closed_ticket"
deny = "'example.com/ticket' in request.annotations && request.annotations['example.com/ticket'] == 'T-0'"
reason = "TicketClosed"
message = "'ticket ' + request.annotations['example.com/ticket'] + ' is closed'"
"#;
    let c = Cluster::start(ApiMode::V1Only, &[SIGNER]).await;
    let cases = [
        ("req-open", "example.com/ticket", "T-42"),
        ("req-closed", "example.com/ticket", "T-0"),
        ("req-pattern", "example.com/ticket", "X-1"),
        ("req-long", "example.com/ticket", "T-123456789"),
        ("req-undeclared", "example.com/flavour", "x"),
    ];
    let ctl = start(&c, policy(DECLARED), None).await;
    for (name, key, value) in cases {
        NewPcr {
            annotations: Some(serde_json::json!({ key: value })),
            ..NewPcr::p256(name, SIGNER)
        }
        .file(&c.admin)
        .await;
    }
    let scratch = tempfile::tempdir().unwrap();
    let config = scratch.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n{}",
            DECLARED
                .replace(
                    "[[annotations]]",
                    &format!("[[signers.\"{SIGNER}\".annotations]]")
                )
                .replace("[[rules]]", &format!("[[signers.\"{SIGNER}\".rules]]"))
        ),
    )
    .unwrap();
    let mut seen = vec![];
    for (name, _, _) in cases {
        let (ty, reason, message) = settled(&c.emu, "apps", name).await;
        // The same object, offline.
        let mut object = c.emu.get_object(Res::Pcr, "apps", name).unwrap();
        object["status"] = serde_json::json!({});
        // As `kubectl get pcr -o json` prints it (the store keeps neither).
        object["kind"] = "PodCertificateRequest".into();
        object["apiVersion"] = "certificates.k8s.io/v1".into();
        let file = scratch.path().join(format!("{name}.json"));
        std::fs::write(&file, object.to_string()).unwrap();
        let out = Command::new(podca_binary())
            .args(["policy", "test", "-o", "json", "--config"])
            .arg(&config)
            .arg("--request")
            .arg(&file)
            .output()
            .unwrap();
        let offline: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{name}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(offline["decision"], ty, "{name}: {offline:#}");
        if ty != "Issued" {
            assert_eq!(offline["reason"], reason, "{name}: {offline:#}");
            assert_eq!(offline["message"], message, "{name}: {offline:#}");
        }
        seen.push((ty, reason));
    }
    let expected: Vec<(String, String)> = [
        ("Issued", ""),
        ("Denied", "TicketClosed"),
        ("Denied", "InvalidUnverifiedUserAnnotations"),
        ("Denied", "InvalidUnverifiedUserAnnotations"),
        ("Denied", "InvalidUnverifiedUserAnnotations"),
    ]
    .iter()
    .map(|(t, r)| ((*t).to_owned(), (*r).to_owned()))
    .collect();
    let got: Vec<(String, String)> = seen
        .into_iter()
        .map(|(t, r)| {
            if t == "Issued" {
                (t, String::new())
            } else {
                (t, r)
            }
        })
        .collect();
    assert_eq!(got, expected);
    ctl.stop().await;
}
