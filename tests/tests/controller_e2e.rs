//! End-to-end: the podca controller (in-process, `podca_controller::run`) against the Kubernetes
//! API emulator, which enforces the spec's status-write rules. Every test asserts that the
//! emulator rejected none of the controller's writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_controller::{LeaderElection, Options};
use podca_signer::{CaAlgorithm, IssuingCa, KeyType, MemoryKey, SignerPolicy};
use podca_tests::Emulator;
use podca_tests::client::KubeClient;
use podca_tests::cluster::{Cluster, NewPcr, stub_csr};
use podca_tests::emulator::{ApiMode, FaultScope, Res};
use podca_tests::sim::install_crypto;
use rcgen::{KeyPair, RsaKeySize};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const ALL: &str = "example.com/workload";
const STRICT: &str = "example.com/strict";
const KEY_TYPES: [&str; 6] = [
    "RSA3072",
    "RSA4096",
    "ECDSAP256",
    "ECDSAP384",
    "ECDSAP521",
    "ED25519",
];

/// The emulated cluster plus the CA the in-process controller signs with.
struct Env {
    cluster: Cluster,
    ca: Arc<IssuingCa>,
}

// The tests reach the emulator, the admin client and the kubeconfig as `c.emu`, `c.admin`, ….
impl std::ops::Deref for Env {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

async fn cluster(mode: ApiMode) -> Env {
    install_crypto();
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("CA key");
    let ca = IssuingCa::self_signed_root(
        Arc::new(key),
        "podca test CA",
        time::OffsetDateTime::now_utc(),
        time::Duration::days(365),
    )
    .expect("CA");
    Env {
        cluster: Cluster::start(mode, &[ALL, STRICT]).await,
        ca: Arc::new(ca),
    }
}

fn signers() -> BTreeMap<String, SignerPolicy> {
    let mut strict = SignerPolicy::permissive("cluster.local");
    strict.key_types = vec![KeyType::EcdsaP256];
    strict.excluded_namespaces = vec!["blocked".into()];
    BTreeMap::from([
        (ALL.to_string(), SignerPolicy::permissive("cluster.local")),
        (STRICT.to_string(), strict),
    ])
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), podca_controller::Error>>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let r = tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("controller stops in time")
            .expect("join");
        r.expect("controller ran without error");
    }
    fn kill(self) {
        self.task.abort();
    }
}

async fn start(c: &Env, tweak: impl FnOnce(&mut Options)) -> Running {
    let client = podca_controller::connect(Some(&c.kubeconfig))
        .await
        .expect("client");
    let mut options = Options::new(signers(), Arc::clone(&c.ca));
    options.workers = 16;
    tweak(&mut options);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(podca_controller::run(client, options, async move {
        let _ = rx.await;
    }));
    Running {
        stop: Some(tx),
        task,
    }
}

fn key_pair(kind: &str) -> KeyPair {
    match kind {
        "RSA3072" => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_3072),
        "RSA4096" => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_4096),
        "ECDSAP256" => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        "ECDSAP384" => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        "ECDSAP521" => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P521_SHA512),
        "ED25519" => KeyPair::generate_for(&rcgen::PKCS_ED25519),
        other => panic!("unknown key type {other}"),
    }
    .expect("key generation")
}

/// (type, reason) of every PCR's terminal condition; `None` when pending.
fn states(emu: &Emulator) -> BTreeMap<String, Option<(String, String)>> {
    emu.list_objects(Res::Pcr, None)
        .into_iter()
        .map(|o| {
            let key = format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            );
            let cond = o["status"]["conditions"]
                .as_array()
                .and_then(|c| c.first())
                .map(|c| {
                    (
                        c["type"].as_str().unwrap_or_default().to_string(),
                        c["reason"].as_str().unwrap_or_default().to_string(),
                    )
                });
            (key, cond)
        })
        .collect()
}

async fn wait_settled(emu: &Emulator, expected: usize, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let s = states(emu);
        let settled = s.values().filter(|v| v.is_some()).count();
        if s.len() >= expected && settled == s.len() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "{settled}/{} settled after {timeout:?} (expected {expected})",
            s.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn assert_no_rejections(emu: &Emulator) {
    let c = emu.counters();
    assert_eq!(
        c.validation_rejections, 0,
        "the emulator rejected controller writes: {:?}",
        c.rejections_by_cause
    );
}

async fn all_key_types_issued(mode: ApiMode, version: &str) {
    let c = cluster(mode).await;
    let ctl = start(&c, |_| {}).await;
    for kind in KEY_TYPES {
        let csr = stub_csr(&key_pair(kind));
        NewPcr::stub(
            version,
            "apps",
            format!("req-{}", kind.to_lowercase()),
            ALL,
            csr,
        )
        .file(&c.admin)
        .await;
    }
    wait_settled(&c.emu, KEY_TYPES.len(), Duration::from_secs(30)).await;
    for (name, state) in states(&c.emu) {
        assert_eq!(state, Some(("Issued".into(), "Issued".into())), "{name}");
    }
    // The chain is leaf + CA, and the emulator checked the leaf key against the stub (rule 16.5).
    for o in c.emu.list_objects(Res::Pcr, None) {
        let chain = o["status"]["certificateChain"].as_str().expect("chain");
        assert!(chain.starts_with("-----BEGIN CERTIFICATE-----"), "{chain}");
        assert!(o["status"]["beginRefreshAt"].is_string());
    }
    assert_eq!(c.emu.counters().issued, KEY_TYPES.len() as u64);
    assert_no_rejections(&c.emu);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_key_types_issued_v1_only() {
    all_key_types_issued(ApiMode::V1Only, "v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_key_types_issued_v1beta1_only() {
    all_key_types_issued(ApiMode::V1Beta1, "v1beta1").await;
}

fn legacy_request(pod_uid: &str) -> (Vec<u8>, Vec<u8>) {
    let key = key_pair("ED25519");
    let pkcs8 = key.serialize_der();
    let signer = aws_lc_rs::signature::Ed25519KeyPair::from_pkcs8(&pkcs8).expect("ed25519");
    let pop = signer.sign(pod_uid.as_bytes()).as_ref().to_vec();
    (rcgen::PublicKeyData::subject_public_key_info(&key), pop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_pkix_request_is_read_through_v1beta1() {
    let c = cluster(ApiMode::V1AndV1Beta1).await;
    let ctl = start(&c, |_| {}).await;
    let pod_uid = podca_tests::emulator::new_uid();
    let mut p = NewPcr::stub("v1beta1", "apps", "req-legacy".into(), ALL, vec![]);
    p.stub = None;
    p.legacy = Some(legacy_request(&pod_uid));
    p.pod_uid = pod_uid;
    p.file(&c.admin).await;
    wait_settled(&c.emu, 1, Duration::from_secs(20)).await;
    assert_eq!(
        states(&c.emu).get("apps/req-legacy").cloned().flatten(),
        Some(("Issued".into(), "Issued".into()))
    );
    assert_no_rejections(&c.emu);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_request_on_v1beta1_legacy_server() {
    let c = cluster(ApiMode::V1Beta1Legacy).await;
    let ctl = start(&c, |_| {}).await;
    let pod_uid = podca_tests::emulator::new_uid();
    let mut p = NewPcr::stub("v1beta1", "apps", "req-legacy".into(), ALL, vec![]);
    p.stub = None;
    p.legacy = Some(legacy_request(&pod_uid));
    p.pod_uid = pod_uid;
    p.file(&c.admin).await;
    wait_settled(&c.emu, 1, Duration::from_secs(20)).await;
    assert_eq!(
        states(&c.emu).get("apps/req-legacy").cloned().flatten(),
        Some(("Issued".into(), "Issued".into()))
    );
    assert_no_rejections(&c.emu);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_carry_the_reason_and_an_event() {
    let c = cluster(ApiMode::V1Only).await;
    let ctl = start(&c, |_| {}).await;
    let p256 = || stub_csr(&key_pair("ECDSAP256"));
    // The strict policy allows only ECDSAP256.
    NewPcr::stub(
        "v1",
        "apps",
        "req-keytype".into(),
        STRICT,
        stub_csr(&key_pair("ED25519")),
    )
    .file(&c.admin)
    .await;
    // An annotation nobody documented.
    let mut p = NewPcr::stub("v1", "apps", "req-annotation".into(), ALL, p256());
    p.annotations = Some(json!({"unknown.example.com/thing": "x"}));
    p.file(&c.admin).await;
    // A namespace the strict policy excludes.
    NewPcr::stub("v1", "blocked", "req-namespace".into(), STRICT, p256())
        .file(&c.admin)
        .await;
    // And one that passes the strict policy.
    NewPcr::stub("v1", "apps", "req-ok".into(), STRICT, p256())
        .file(&c.admin)
        .await;

    wait_settled(&c.emu, 4, Duration::from_secs(20)).await;
    let s = states(&c.emu);
    let want = [
        ("apps/req-keytype", "Denied", "UnsupportedKeyType"),
        (
            "apps/req-annotation",
            "Denied",
            "InvalidUnverifiedUserAnnotations",
        ),
        ("blocked/req-namespace", "Denied", "NamespaceNotAllowed"),
        ("apps/req-ok", "Issued", "Issued"),
    ];
    for (key, ty, reason) in want {
        assert_eq!(
            s.get(key).cloned().flatten(),
            Some((ty.into(), reason.into())),
            "{key}"
        );
    }
    // One Warning Event per denial, regarding the PCR, reason = condition reason.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events: Vec<Value> = ["apps", "blocked"]
            .iter()
            .flat_map(|ns| c.emu.list_objects(Res::Event, Some(ns)))
            .collect();
        let found = want[..3].iter().all(|(key, _, reason)| {
            let name = key.split('/').nth(1).unwrap_or_default();
            events.iter().any(|e| {
                e["regarding"]["name"] == name
                    && e["regarding"]["kind"] == "PodCertificateRequest"
                    && e["reason"] == *reason
                    && e["type"] == "Warning"
            })
        });
        if found {
            assert!(
                !events.iter().any(|e| e["regarding"]["name"] == "req-ok"),
                "no event for an issued request"
            );
            break;
        }
        assert!(Instant::now() < deadline, "events missing: {events:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_no_rejections(&c.emu);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_only_legacy_request_fails_clearly() {
    // A v1-only server never stores a legacy request, so seed one as a conversion would show it.
    let c = cluster(ApiMode::V1Only).await;
    let ctl = start(&c, |_| {}).await;
    c.emu.seed_object(
        Res::Pcr,
        json!({
            "metadata": {"name": "req-empty", "namespace": "apps"},
            "spec": {
                "signerName": ALL, "podName": "p", "podUID": "u1", "serviceAccountName": "app",
                "serviceAccountUID": "u2", "nodeName": "node-1", "nodeUID": "u3",
                "maxExpirationSeconds": 86400,
            },
            "status": {},
        }),
    );
    wait_settled(&c.emu, 1, Duration::from_secs(20)).await;
    assert_eq!(
        states(&c.emu).get("apps/req-empty").cloned().flatten(),
        Some(("Failed".into(), "LegacyRequestUnreadable".into()))
    );
    assert_no_rejections(&c.emu);
    ctl.stop().await;
}

async fn burst(c: &Env, version: &'static str, count: usize, prefix: &str) {
    // Key generation is the slow part of filing; a handful of keys is enough for the signer.
    let csrs: Arc<Vec<Vec<u8>>> =
        Arc::new((0..8).map(|_| stub_csr(&key_pair("ECDSAP256"))).collect());
    let mut set = tokio::task::JoinSet::new();
    let admin = Arc::new(KubeClient::new(c.emu.base_url(), &c.emu.admin_token()));
    for chunk in 0..8 {
        let admin = Arc::clone(&admin);
        let csrs = Arc::clone(&csrs);
        let prefix = prefix.to_string();
        set.spawn(async move {
            for i in (chunk..count).step_by(8) {
                let p = NewPcr::stub(
                    version,
                    "burst",
                    format!("{prefix}-{i}"),
                    ALL,
                    csrs[i % csrs.len()].clone(),
                );
                p.file(&admin).await;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("filing task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_1000_settles_without_rejections() {
    let c = cluster(ApiMode::V1Only).await;
    let ctl = start(&c, |_| {}).await;
    burst(&c, "v1", 1000, "b").await;
    let took = wait_settled(&c.emu, 1000, Duration::from_secs(120)).await;
    eprintln!("1000 PCRs settled {took:?} after the last was filed");
    let s = states(&c.emu);
    assert!(
        s.values()
            .all(|v| v.as_ref().is_some_and(|(t, _)| t == "Issued"))
    );
    assert_eq!(c.emu.counters().issued, 1000);
    assert_no_rejections(&c.emu);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_leave_nothing_pending() {
    let c = cluster(ApiMode::V1Only).await;
    let ctl = start(&c, |_| {}).await;
    c.emu.inject_errors(409, 40, FaultScope::StatusWrites);
    c.emu.inject_errors(429, 40, FaultScope::StatusWrites);
    c.emu.inject_errors(500, 40, FaultScope::StatusWrites);
    c.emu.inject_errors(500, 3, FaultScope::Watches);
    let filing = burst(&c, "v1", 400, "f");
    let dropper = async {
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.emu.drop_watches();
        }
    };
    tokio::join!(filing, dropper);
    wait_settled(&c.emu, 400, Duration::from_secs(120)).await;
    let s = states(&c.emu);
    assert!(
        s.values()
            .all(|v| v.as_ref().is_some_and(|(t, _)| t == "Issued")),
        "all issued"
    );
    assert!(c.emu.counters().injected_faults > 0, "faults were injected");
    assert_no_rejections(&c.emu);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_burst_and_restarted_finishes() {
    let c = cluster(ApiMode::V1Only).await;
    c.emu.set_latency(Duration::from_millis(5));
    // Two in flight, pinned: the adaptive limit would settle the burst before the kill.
    let first = start(&c, |o| {
        o.workers = 2;
        o.max_in_flight = 2;
    })
    .await;
    burst(&c, "v1", 600, "k").await;
    // Kill once some, but not all, are settled.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = states(&c.emu).values().filter(|v| v.is_some()).count();
        if done >= 50 {
            break;
        }
        assert!(Instant::now() < deadline, "no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    let pending = states(&c.emu).values().filter(|v| v.is_none()).count();
    assert!(pending > 0, "the kill came too late to prove anything");
    c.emu.set_latency(Duration::ZERO);
    let second = start(&c, |_| {}).await;
    wait_settled(&c.emu, 600, Duration::from_secs(120)).await;
    assert!(
        states(&c.emu)
            .values()
            .all(|v| v.as_ref().is_some_and(|(t, _)| t == "Issued"))
    );
    assert_no_rejections(&c.emu);
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_between_two_controllers() {
    let c = cluster(ApiMode::V1Only).await;
    let le = |id: &str| LeaderElection {
        lease_name: "podca-controller".into(),
        lease_namespace: "default".into(),
        identity: id.into(),
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
    };
    let a = start(&c, |o| o.leader_election = Some(le("a"))).await;
    // Let a take the Lease before b starts.
    let deadline = Instant::now() + Duration::from_secs(15);
    let holder = || {
        c.emu
            .get_object(Res::Lease, "default", "podca-controller")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    while holder().as_deref() != Some("a") {
        assert!(
            Instant::now() < deadline,
            "a never took the Lease: {:?}",
            holder()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = start(&c, |o| o.leader_election = Some(le("b"))).await;
    burst(&c, "v1", 50, "before").await;
    wait_settled(&c.emu, 50, Duration::from_secs(30)).await;
    assert_eq!(holder().as_deref(), Some("a"));
    // Crash a (no release): b must take over after the lease expires.
    a.kill();
    let killed = Instant::now();
    burst(&c, "v1", 50, "after").await;
    wait_settled(&c.emu, 100, Duration::from_secs(30)).await;
    let took = killed.elapsed();
    assert_eq!(holder().as_deref(), Some("b"));
    assert!(took < Duration::from_secs(4 + 10), "takeover took {took:?}");
    assert_no_rejections(&c.emu);
    // Graceful stop releases the Lease.
    b.stop().await;
    let released = holder();
    assert!(
        released.is_none() || released.as_deref() == Some(""),
        "Lease not released: {released:?}"
    );
}
