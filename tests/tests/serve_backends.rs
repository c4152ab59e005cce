//! The real `podca serve` binary against the API emulator, with each CA backend it runs on:
//! a file CA (ClusterTrustBundles published, `podca ca rotate` followed without a restart, the
//! gRPC API up) and a CA key in SoftHSM2 (both PKCS#11 modes, HSM metrics, a wrong PIN refused at
//! start-up). Every issued chain is checked with `openssl verify` against the published bundle.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use podca_tests::EmulatorConfig;
use podca_tests::client::KubeClient;
use podca_tests::cluster::{Cluster, ClusterConfig, PODCA_USER, add_pod};
use podca_tests::emulator::{ApiMode, Res};
use podca_tests::kubelet::{trust_anchors_for_signer, wait_anchors_for_signer};
use podca_tests::process::{ServeProcess, podca_binary};
use podca_tests::softhsm::{SOFTHSM2_MODULE, softhsm_token};
use podca_tests::verify::assert_verifies;
use rcgen::{CertificateParams, KeyPair};

const SIGNER: &str = "example.com/workload";

/// The emulator with podca's identity (authenticated, but not in `system:serviceaccounts`, so
/// that it reads the published bundles only through its signer role).
async fn cluster(emulator: EmulatorConfig) -> Cluster {
    Cluster::start_with(ClusterConfig {
        emulator,
        podca_groups: &["system:authenticated"],
        signers: &[SIGNER],
    })
    .await
}

fn v1_cluster() -> EmulatorConfig {
    EmulatorConfig {
        api_mode: ApiMode::V1Only,
        auto_create_namespaces: true,
        ..Default::default()
    }
}

fn podca(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(podca_binary());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run podca")
}

/// Waits until the published bundle for SIGNER holds `n` anchors and returns it.
async fn published(admin: &KubeClient, n: usize, within: Duration) -> String {
    wait_anchors_for_signer(admin, SIGNER, n, within).await
}

fn write_config(path: &Path, ca_table: &str) {
    std::fs::write(
        path,
        format!("{ca_table}\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n"),
    )
    .expect("config");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_publishes_bundles_follows_ca_rotate_and_serves_grpc() {
    let c = cluster(v1_cluster()).await;
    let ca_dir = c.dir.path().join("ca");
    let ca = ca_dir.to_str().expect("utf-8");
    let o = podca(&["ca", "init", "--dir", ca], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let config = c.dir.path().join("podca.toml");
    write_config(&config, &format!("[ca]\ndir = {ca:?}\n"));
    let serve = ServeProcess::start(&config, &c.kubeconfig, &[], &[]);

    // The anchor is published under the documented name and labels.
    let bundle = published(&c.admin, 1, Duration::from_secs(30)).await;
    assert_eq!(
        bundle.trim(),
        std::fs::read_to_string(ca_dir.join("root.pem"))
            .expect("root.pem")
            .trim()
    );
    let ctb = c
        .emu
        .get_object(Res::Ctb, "", "example.com:workload:podca")
        .expect("the bundle has the documented name");
    assert_eq!(
        ctb["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "podca"
    );
    c.file_pcr("one", SIGNER).await;
    let chain = c.wait_issued("one", Duration::from_secs(30)).await;
    assert_verifies(&chain, &bundle);

    // `podca ca rotate` on the data directory: the next root is published without a restart,
    // and the current CA keeps signing until the propagation window is over.
    let o = podca(&["ca", "rotate", "--dir", ca], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let both = published(&c.admin, 2, Duration::from_secs(30)).await;
    c.file_pcr("two", SIGNER).await;
    let chain = c.wait_issued("two", Duration::from_secs(30)).await;
    assert_verifies(&chain, &bundle);
    assert_verifies(&chain, &both);
    let metrics = serve.metrics();
    assert!(
        metrics.contains(
            "podca_ca_generation_not_after_timestamp_seconds{generation=\"2\",state=\"prepared\",ca=\"default\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("podca_ctb_writes_total{op=\"update\"} 1"),
        "{metrics}"
    );

    // The gRPC API is up (TLS, verified against the published bundle for the Service's name in
    // the default namespace) and asks for a service-account token.
    let mut client = podca_tests::tls::TlsChannel::connect(
        std::net::SocketAddr::from(([127, 0, 0, 1], serve.grpc)),
        &both,
        "podca.default.svc",
    )
    .await
    .expect("gRPC connects over TLS")
    .client();
    let err = client
        .get_trust_bundle(podca_proto::podca::v1::GetTrustBundleRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert_eq!(c.emu.counters().validation_rejections, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_signs_with_a_ca_key_in_softhsm2_in_both_modes() {
    let c = cluster(v1_cluster()).await;
    let t = c.dir.path();
    let conf = softhsm_token(t, "serve", "87654321", "123456");
    std::fs::write(t.join("pin"), "123456\n").expect("pin");
    std::fs::write(t.join("bad-pin"), "999999\n").expect("pin");
    let ca = t.join("ca");
    let ca = ca.to_str().expect("utf-8");
    let uri = format!("pkcs11:token=serve;object=podca-ca?module-path={SOFTHSM2_MODULE}");
    let env = [("SOFTHSM2_CONF", conf.as_path())];
    let pin = t.join("pin");
    let o = podca(
        &[
            "ca",
            "init",
            "--dir",
            ca,
            "--pkcs11-uri",
            &uri,
            "--pkcs11-generate",
            "--pkcs11-pin-file",
            pin.to_str().expect("utf-8"),
        ],
        &env,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Checking the token's mechanisms logs nothing: asked for its whole list, cryptoki wrote an
    // ERROR line for each one it has no name for (30 with SoftHSM2).
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("ERROR"), "{stderr}");

    for (mode, expected_chain_len) in [("hsm-signs-leaves", 2), ("intermediate", 3)] {
        let config = t.join(format!("{mode}.toml"));
        write_config(
            &config,
            &format!(
                "[ca]\nbackend = \"pkcs11\"\ndir = {ca:?}\npkcs11_pin_file = {:?}\npkcs11_mode = \"{mode}\"\n",
                pin.to_str().expect("utf-8")
            ),
        );
        let serve = ServeProcess::start(&config, &c.kubeconfig, &[], &env);
        let bundle = published(&c.admin, 1, Duration::from_secs(30)).await;
        let name = format!("hsm-{mode}");
        c.file_pcr(&name, SIGNER).await;
        let chain = c.wait_issued(&name, Duration::from_secs(30)).await;
        assert_eq!(
            chain.matches("BEGIN CERTIFICATE").count(),
            expected_chain_len,
            "{mode}: {chain}"
        );
        assert_verifies(&chain, &bundle);
        // The HSM statistics reach /metrics (exported every 5 s).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let metrics = serve.metrics();
            let signs = metrics
                .lines()
                .find_map(|l| l.strip_prefix("podca_hsm_signatures_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            // Per-leaf mode signs the leaf in the HSM; intermediate mode signs the intermediate.
            if signs >= 1 && metrics.contains("podca_hsm_session_pool_size") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{mode}: no HSM metrics:\n{metrics}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        drop(serve);
        if mode == "intermediate" {
            // The in-memory intermediate is a certificate podca signed: a ledger record
            // (issue #40), the one in the chain.
            let intermediate = pem::parse_many(&chain).expect("PEM")[1].contents().to_vec();
            let (_, parsed) = x509_parser::parse_x509_certificate(&intermediate).expect("DER");
            let serial = podca_signer::x509::hex_lower(parsed.raw_serial());
            let out = podca(&["ledger", "list", "--json", "--dir", ca], &env);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let records: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| serde_json::from_str(l).expect("JSON"))
                .collect();
            let record = records
                .iter()
                .find(|r| r["source"] == "intermediate")
                .unwrap_or_else(|| panic!("no intermediate record in {records:?}"));
            assert_eq!(
                record["serial"].as_str().map(|s| s.trim_start_matches('0')),
                Some(serial.trim_start_matches('0')),
                "{record}"
            );
        }
    }

    // A wrong PIN is a start-up error that names the problem and not the PIN.
    let config = t.join("bad.toml");
    write_config(
        &config,
        &format!(
            "[ca]\nbackend = \"pkcs11\"\ndir = {ca:?}\npkcs11_pin_file = {:?}\n",
            t.join("bad-pin").to_str().expect("utf-8")
        ),
    );
    let out = Command::new(podca_binary())
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .env("SOFTHSM2_CONF", &conf)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the user PIN is incorrect"), "{stderr}");
    assert!(
        !stderr.contains("999999"),
        "the PIN never appears: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_signs_with_a_ca_from_a_kubernetes_secret() {
    use podca_tests::emulator::Subject;
    use podca_tests::emulator::podca_rbac::PodcaRbac;
    let c = cluster(v1_cluster()).await;
    // A CA made elsewhere (e.g. by cert-manager), stored as a kubernetes.io/tls Secret.
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "secret-held root");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let cert = params.self_signed(&key).expect("CA cert");
    c.emu.add_secret(
        "podca-system",
        "podca-ca",
        "kubernetes.io/tls",
        &[
            ("tls.crt", cert.pem().as_bytes()),
            ("tls.key", key.serialize_pem().as_bytes()),
        ],
    );
    // Exactly the rules the Secret backend documents, in the Secret's namespace (the CA Secret,
    // its history ConfigMap, the JWT key Secret), and the JWKS ConfigMap's (in `default`: this config names no namespace).
    let rules = PodcaRbac::secret_backend_rules("podca-system", "podca-ca")
        .into_iter()
        .chain(PodcaRbac::jwks_configmap_rules("default", "podca-jwks"));
    for rule in rules {
        c.emu.grant(Subject::User(PODCA_USER.into()), rule);
    }
    let config = c.dir.path().join("podca.toml");
    // The Secret backend has no data directory for the default redb ledger: name a file.
    let ledger = c.dir.path().join("ledger.redb");
    write_config(
        &config,
        &format!(
            "[ca]\nbackend = \"secret\"\nsecret = \"podca-system/podca-ca\"\n\n[ledger]\npath = {:?}\n",
            ledger.display().to_string()
        ),
    );
    let _serve = ServeProcess::start(&config, &c.kubeconfig, &[], &[]);
    let bundle = published(&c.admin, 1, Duration::from_secs(30)).await;
    assert_eq!(bundle.trim(), cert.pem().trim());
    c.file_pcr("from-secret", SIGNER).await;
    let chain = c.wait_issued("from-secret", Duration::from_secs(30)).await;
    assert_verifies(&chain, &bundle);
    let counters = c.emu.counters();
    assert_eq!((counters.validation_rejections, counters.forbidden), (0, 0));

    // `podca ca show --secret` reads the state podca serve recorded for the Secret.
    let deadline = Instant::now() + Duration::from_secs(20);
    let shown = loop {
        let out = podca(
            &[
                "ca",
                "show",
                "--secret",
                "podca-system/podca-ca",
                "--kubeconfig",
                c.kubeconfig.to_str().expect("utf-8"),
            ],
            &[],
        );
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "ca show --secret: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(shown.contains("generation 1 — active"), "{shown}");
    assert!(shown.contains("CN=secret-held root"), "{shown}");

    // A malformed secret setting is a one-line start-up error.
    write_config(
        &config,
        "[ca]\nbackend = \"secret\"\nsecret = \"no-namespace\"\n",
    );
    let out = podca(
        &[
            "serve",
            "--config",
            config.to_str().expect("utf-8"),
            "--kubeconfig",
            c.kubeconfig.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected \"<namespace>/<name>\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `podca ca show --secret` reads the history ConfigMap with the Secret backend's own checks: a
/// ConfigMap of that name that podca does not own is refused with one line, not shown; the same
/// content under podca's label is shown (so the refusal is the label's doing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_show_secret_refuses_a_history_configmap_podca_does_not_own() {
    use podca_tests::emulator::{PolicyRule, Subject};
    use serde_json::json;
    let c = cluster(v1_cluster()).await;
    c.emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&[""], &["configmaps"], &["get"]).in_namespaces(&["podca-system"]),
    );
    let seed = |secret: &str, managed_by: &str| {
        let history = json!({"secret": format!("podca-system/{secret}"), "generations": []});
        c.emu.seed_object(
            Res::ConfigMap,
            json!({
                "metadata": {
                    "name": format!("{secret}-podca-history"),
                    "namespace": "podca-system",
                    "labels": {"app.kubernetes.io/managed-by": managed_by},
                },
                "data": {"history.json": history.to_string()},
            }),
        );
    };
    seed("foreign-ca", "helm");
    seed("owned-ca", "podca");
    let show = |secret: &str| {
        podca(
            &[
                "ca",
                "show",
                "--secret",
                secret,
                "--kubeconfig",
                c.kubeconfig.to_str().expect("utf-8"),
            ],
            &[],
        )
    };

    let out = show("podca-system/foreign-ca");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "podca: CA history ConfigMap podca-system/foreign-ca-podca-history: exists without the \
         label app.kubernetes.io/managed-by=podca; podca does not use or overwrite it (delete it, \
         or name another with history_configmap)\n"
    );
    assert!(out.stdout.is_empty(), "nothing of it is shown");

    let out = show("podca-system/owned-ca");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (history, jwt) = stdout
        .split_once("\nJWT signing keys: ")
        .expect("a JWT key line");
    assert_eq!(
        history,
        "CA Secret: podca-system/owned-ca (history in ConfigMap \
         podca-system/owned-ca-podca-history)\n\
         history seal: NOT VALID (unsigned): history.json carries no seal (written by someone \
         else, or by podca before 0.x); podca serve would not use this history\n"
    );
    // No JWT key Secret: one line says so, and nothing else fails.
    assert_eq!(
        jwt,
        "none (no Secret podca-system/owned-ca-jwt; the podca serve leader makes it with [jwt] \
         enabled)\n",
        "{stdout}"
    );
}

/// Every key type through the real binary, filed by the kubelet simulator, checked as a pod
/// would: the leaf is for the pod's key, carries its SPIFFE ID, and verifies against the
/// published bundle. v1 only (1.37), v1beta1 with stubs (1.36, plus a legacy pkix + proof of
/// possession request from an older kubelet) and v1beta1 without stubs (1.35, legacy only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_issues_every_key_type_to_kubelet_in_each_api_mode() {
    use podca_tests::kubelet::{KeyType, KubeletSim, Outcome, RequestOptions};
    for (mode, version, stub_types, legacy_types) in [
        (ApiMode::V1Only, "v1", &KeyType::ALL[..], &[][..]),
        (
            ApiMode::V1Beta1,
            "v1beta1",
            &KeyType::ALL[..],
            &[KeyType::EcdsaP256][..],
        ),
        // (The simulator cannot make a P-384 proof: aws-lc-rs has no P-384/SHA-256 signer.)
        (
            ApiMode::V1Beta1Legacy,
            "v1beta1",
            &[][..],
            &[
                KeyType::Rsa3072,
                KeyType::Rsa4096,
                KeyType::EcdsaP256,
                KeyType::EcdsaP521,
                KeyType::Ed25519,
            ][..],
        ),
    ] {
        let c = cluster(EmulatorConfig {
            api_mode: mode,
            ..Default::default()
        })
        .await;
        let emu = &c.emu;
        emu.add_namespace("apps");
        let node_uid = emu.add_node("node-1");
        let certificates: Vec<_> = KeyType::ALL.iter().map(|k| (SIGNER, *k)).collect();
        let pod = add_pod(
            emu,
            "apps",
            "web-0",
            "web",
            ("node-1", &node_uid),
            &certificates,
        );
        let kubelet = KubeletSim::new(emu.base_url(), &emu.add_node_identity("node-1"), version);
        let ca = c.dir.path().join("ca");
        let o = podca(&["ca", "init", "--dir", ca.to_str().expect("utf-8")], &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let config = c.dir.path().join("podca.toml");
        write_config(
            &config,
            &format!("[ca]\ndir = {:?}\n", ca.display().to_string()),
        );
        let _serve = ServeProcess::start(&config, &c.kubeconfig, &[], &[]);
        let deadline = Instant::now() + Duration::from_secs(30);
        let anchors = loop {
            let a = trust_anchors_for_signer(&c.admin, version, SIGNER)
                .await
                .unwrap_or_default();
            if !a.is_empty() {
                break a;
            }
            assert!(Instant::now() < deadline, "{mode:?}: no bundle published");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let requests = stub_types
            .iter()
            .map(|k| (*k, false))
            .chain(legacy_types.iter().map(|k| (*k, true)));
        for (key_type, legacy) in requests {
            let mut opts = RequestOptions::new(SIGNER, key_type);
            opts.legacy = legacy;
            let outcome = kubelet
                .obtain(&pod, &opts, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("{mode:?} {key_type:?} legacy={legacy}: {e}"));
            let Outcome::Issued(credential) = outcome else {
                panic!("{mode:?} {key_type:?} legacy={legacy}: {outcome:?}");
            };
            credential
                .verify_chain(&anchors, time::OffsetDateTime::now_utc())
                .unwrap_or_else(|e| panic!("{mode:?} {key_type:?}: {e}"));
            assert_eq!(
                credential.leaf_uris(),
                ["spiffe://cluster.local/ns/apps/sa/web"],
                "{mode:?} {key_type:?}"
            );
        }
        let counters = emu.counters();
        assert_eq!(
            counters.validation_rejections, 0,
            "{mode:?}: {:?}",
            counters.rejections_by_cause
        );
    }
}
