//! The ClusterTrustBundle publisher (`podca_controller::publisher`), run by
//! `podca_controller::run`, against the API emulator, which enforces spec rules 20–30 on every
//! CTB write and is the referee: every test asserts it rejected nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_authority::CaHandle;
use podca_authority::config::Sharding;
use podca_controller::publisher::{INSTANCE_LABEL, MANAGED_BY_LABEL, PublisherOptions};
use podca_controller::{LeaderElection, Options};
use podca_signer::{CaAlgorithm, CaCertificate, IssuingCa, MemoryKey, SignerPolicy};
use podca_tests::Emulator;
use podca_tests::cluster::Cluster;
use podca_tests::emulator::{ApiMode, Res};
use podca_tests::sim::install_crypto;
use podca_tests::testca::TestCa;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WORKLOAD: &str = "example.com/workload";
const STRICT: &str = "example.com/strict";
const WORKLOAD_CTB: &str = "example.com:workload:podca";
const STRICT_CTB: &str = "example.com:strict:podca";

/// The emulated cluster plus the CA handle the in-process controller publishes.
struct Env {
    cluster: Cluster,
    ca: CaHandle,
    /// The certificates.k8s.io version the emulator serves CTBs through (preferred first).
    version: &'static str,
}

// The tests reach the emulator, the admin client and the kubeconfig as `c.emu`, `c.admin`, ….
impl std::ops::Deref for Env {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl Env {
    fn path(&self, name: &str) -> String {
        format!(
            "/apis/certificates.k8s.io/{}/clustertrustbundles/{name}",
            self.version
        )
    }

    fn collection(&self) -> String {
        format!(
            "/apis/certificates.k8s.io/{}/clustertrustbundles",
            self.version
        )
    }

    fn ctb(&self, name: &str) -> Option<Value> {
        self.emu.get_object(Res::Ctb, "", name)
    }

    fn anchors_pem(&self) -> String {
        self.ca.current().anchors_pem.clone()
    }
}

fn new_ca(name: &str) -> IssuingCa {
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("CA key");
    IssuingCa::self_signed_root(
        Arc::new(key),
        name,
        time::OffsetDateTime::now_utc(),
        time::Duration::days(365),
    )
    .expect("CA")
}

/// An emulator with an identity that has exactly the spec §3 RBAC for both signers.
async fn cluster(mode: ApiMode) -> Env {
    install_crypto();
    Env {
        cluster: Cluster::start(mode, &[WORKLOAD, STRICT]).await,
        ca: CaHandle::new(new_ca("podca test CA"), vec![]),
        version: mode.cert_versions()[0],
    }
}

fn signers(names: &[&str]) -> BTreeMap<String, SignerPolicy> {
    names
        .iter()
        .map(|n| (n.to_string(), SignerPolicy::permissive("cluster.local")))
        .collect()
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), podca_controller::Error>>,
    metrics: Arc<podca_authority::metrics::Metrics>,
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

    /// Waits until the publisher has completed `n` more passes (`podca_ctb_passes_total`):
    /// whatever those passes would write, they have written. Two passes or more include
    /// one that began after the call.
    async fn passes(&self, n: u64) {
        let start = self.metrics.ctb_passes.get();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.metrics.ctb_passes.get() < start + n {
            assert!(
                Instant::now() < deadline,
                "the publisher completed {} of {n} passes",
                self.metrics.ctb_passes.get() - start
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn writes(&self, op: &'static str) -> u64 {
        self.metrics
            .ctb_writes
            .get_or_create(&podca_authority::metrics::OpLabels { op })
            .get()
    }
}

async fn start(
    c: &Env,
    names: &[&str],
    publisher: PublisherOptions,
    tweak: impl FnOnce(&mut Options),
) -> Running {
    let client = podca_controller::connect(Some(&c.kubeconfig))
        .await
        .expect("client");
    let mut options = Options::new(signers(names), c.ca.clone());
    options.publisher = Some(publisher);
    tweak(&mut options);
    let metrics = Arc::clone(&options.metrics);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(podca_controller::run(client, options, async move {
        let _ = rx.await;
    }));
    Running {
        stop: Some(tx),
        task,
        metrics,
    }
}

fn fast() -> PublisherOptions {
    PublisherOptions {
        resync: Duration::from_millis(200),
        ..Default::default()
    }
}

async fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until `name` exists with exactly `pem` and the labels of `instance`.
async fn wait_published(c: &Env, name: &str, pem: &str, instance: &str) -> Value {
    wait_for(
        &format!("{name} published"),
        Duration::from_secs(10),
        || {
            c.ctb(name).is_some_and(|o| {
                o["spec"]["trustBundle"] == pem
                    && o["metadata"]["labels"][MANAGED_BY_LABEL] == "podca"
                    && o["metadata"]["labels"][INSTANCE_LABEL] == instance
            })
        },
    )
    .await;
    c.ctb(name).expect("published")
}

fn rv(o: &Value) -> String {
    o["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn assert_no_rejections(emu: &Emulator) {
    let c = emu.counters();
    assert_eq!(
        (c.validation_rejections, c.forbidden),
        (0, 0),
        "the emulator rejected publisher writes: {:?}",
        c.rejections_by_cause
    );
}

/// A bundle created by someone else (the admin), with `labels`.
async fn create_by_hand(c: &Env, name: &str, signer: &str, labels: Value) -> Value {
    let pem = TestCa::new(name).expect("test CA").cert_pem;
    let r = c
        .admin
        .post(
            &c.collection(),
            &json!({
                "apiVersion": format!("certificates.k8s.io/{}", c.version),
                "kind": "ClusterTrustBundle",
                "metadata": {"name": name, "labels": labels},
                "spec": {"signerName": signer, "trustBundle": pem},
            }),
        )
        .await
        .expect("request");
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    c.ctb(name).expect("created")
}

async fn each_signer_gets_its_bundle(mode: ApiMode) {
    let c = cluster(mode).await;
    let run = start(&c, &[WORKLOAD, STRICT], fast(), |_| {}).await;
    let pem = c.anchors_pem();
    for (name, signer) in [(WORKLOAD_CTB, WORKLOAD), (STRICT_CTB, STRICT)] {
        let o = wait_published(&c, name, &pem, "podca").await;
        assert_eq!(o["spec"]["signerName"], signer);
        // Served through the discovered version, readable as kubelet reads it.
        let r = c.admin.get(&c.path(name)).await.expect("get");
        assert_eq!(r.status, 200);
        assert_eq!(
            r.json()["apiVersion"],
            format!("certificates.k8s.io/{}", c.version)
        );
        let certs = CaCertificate::all_from_pem(o["spec"]["trustBundle"].as_str().unwrap_or(""))
            .expect("PEM");
        assert_eq!(certs, c.ca.current().anchors);
    }
    // The projection's view: signerName + labelSelector finds exactly one bundle per signer.
    let selected = c
        .admin
        .get(&format!(
            "{}?fieldSelector=spec.signerName%3D{}&labelSelector={}%3Dpodca,{}%3Dpodca",
            c.collection(),
            WORKLOAD.replace('/', "%2F"),
            MANAGED_BY_LABEL.replace('/', "%2F"),
            INSTANCE_LABEL.replace('/', "%2F"),
        ))
        .await
        .expect("list");
    assert_eq!(selected.status, 200);
    let items = selected.json()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["metadata"]["name"], WORKLOAD_CTB);
    // Two creates, nothing else, even after several resyncs.
    run.passes(5).await;
    assert_eq!(c.emu.counters().ctb_writes_accepted, 2);
    assert_eq!(run.writes("create"), 2);
    assert_eq!(run.writes("update") + run.writes("delete"), 0);
    assert_no_rejections(&c.emu);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_signer_gets_its_bundle_v1_only() {
    each_signer_gets_its_bundle(ApiMode::V1Only).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_signer_gets_its_bundle_v1beta1_only() {
    each_signer_gets_its_bundle(ApiMode::V1Beta1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_is_preferred_when_both_are_served() {
    let c = cluster(ApiMode::V1AndV1Beta1).await;
    let run = start(&c, &[WORKLOAD], fast(), |_| {}).await;
    let o = wait_published(&c, WORKLOAD_CTB, &c.anchors_pem(), "podca").await;
    let managers = o["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !managers.is_empty()
            && managers
                .iter()
                .all(|m| m["apiVersion"] == "certificates.k8s.io/v1"),
        "written through v1: {managers:?}"
    );
    assert_no_rejections(&c.emu);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_updates_the_bundle_and_a_quiet_resync_writes_nothing() {
    let c = cluster(ApiMode::V1Only).await;
    let run = start(&c, &[WORKLOAD, STRICT], fast(), |_| {}).await;
    let first = wait_published(&c, WORKLOAD_CTB, &c.anchors_pem(), "podca").await;
    wait_published(&c, STRICT_CTB, &c.anchors_pem(), "podca").await;
    let writes = c.emu.counters().ctb_writes_accepted;
    // Five resyncs: no request that writes, not even a no-op one.
    run.passes(5).await;
    assert_eq!(c.emu.counters().ctb_writes_accepted, writes);
    assert_eq!(rv(&c.ctb(WORKLOAD_CTB).expect("bundle")), rv(&first));

    // A rotation: old and new root both trusted.
    let old_root = c.ca.current().anchors.clone();
    let next = new_ca("podca next CA");
    let mut both = old_root.clone();
    both.extend(next.roots().iter().cloned());
    c.ca.replace(next, both.clone());
    let pem = c.anchors_pem();
    assert_eq!(
        CaCertificate::all_from_pem(&pem).expect("PEM").len(),
        2,
        "old and new anchors"
    );
    let started = Instant::now();
    wait_published(&c, WORKLOAD_CTB, &pem, "podca").await;
    wait_published(&c, STRICT_CTB, &pem, "podca").await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "published promptly"
    );
    // The old root retired.
    let new_only = vec![both[1].clone()];
    let current = Arc::clone(&c.ca.current().ca);
    c.ca.replace_arc(current, new_only);
    let pem = c.anchors_pem();
    wait_published(&c, WORKLOAD_CTB, &pem, "podca").await;
    wait_published(&c, STRICT_CTB, &pem, "podca").await;
    run.passes(3).await;
    assert_eq!(c.emu.counters().ctb_writes_accepted, writes + 4);
    assert_eq!(run.writes("update"), 4);
    assert_eq!(run.metrics.ctb_drift_repairs.get(), 0);
    assert_no_rejections(&c.emu);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_repaired_through_the_watch() {
    let c = cluster(ApiMode::V1Beta1).await;
    // A resync far away: the repairs below come from the watch.
    let run = start(&c, &[WORKLOAD], PublisherOptions::default(), |_| {}).await;
    let pem = c.anchors_pem();
    wait_published(&c, WORKLOAD_CTB, &pem, "podca").await;

    // Someone swaps the anchors for their own.
    let mut edited = c.ctb(WORKLOAD_CTB).expect("bundle");
    edited["apiVersion"] = json!("certificates.k8s.io/v1beta1");
    edited["kind"] = json!("ClusterTrustBundle");
    edited["spec"]["trustBundle"] = json!(TestCa::new("intruder").expect("CA").cert_pem);
    let r = c
        .admin
        .put(&c.path(WORKLOAD_CTB), &edited)
        .await
        .expect("put");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    wait_published(&c, WORKLOAD_CTB, &pem, "podca").await;

    // Someone strips a label (a projection selecting it would find nothing).
    let r = c
        .admin
        .merge_patch(
            &c.path(WORKLOAD_CTB),
            &json!({"metadata": {"labels": {MANAGED_BY_LABEL: null}}}),
        )
        .await
        .expect("patch");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    wait_published(&c, WORKLOAD_CTB, &pem, "podca").await;

    // Someone deletes it.
    let r = c.admin.delete(&c.path(WORKLOAD_CTB)).await.expect("delete");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    wait_published(&c, WORKLOAD_CTB, &pem, "podca").await;

    // The publisher counts a repair once the API has answered its write, a moment after the
    // emulator holds the result (CI once read 2 here): wait for the count, then check that
    // the passes after it repaired nothing more.
    wait_for(
        "three drift repairs counted",
        Duration::from_secs(10),
        || run.metrics.ctb_drift_repairs.get() >= 3,
    )
    .await;
    // A pass that begins after now: the CA handle changes (same anchors, next generation),
    // and that pass must find nothing to repair.
    let current = c.ca.current();
    let next =
        c.ca.replace_arc(Arc::clone(&current.ca), current.anchors.clone());
    wait_for(
        "a pass over the next generation",
        Duration::from_secs(10),
        || run.metrics.ctb_pass_generation.get() == i64::try_from(next).unwrap_or(i64::MAX),
    )
    .await;
    assert_eq!(run.metrics.ctb_drift_repairs.get(), 3);
    assert_eq!(run.writes("update"), 2);
    assert_eq!(run.writes("create"), 2);
    assert_no_rejections(&c.emu);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_deletes_only_owned_bundles_no_longer_configured() {
    let c = cluster(ApiMode::V1Only).await;
    // Bundles podca must never touch: no labels, another instance, only one of the two labels.
    let foreign = create_by_hand(&c, "example.com:workload:manual", WORKLOAD, json!({})).await;
    let other_instance = create_by_hand(
        &c,
        "example.com:workload:blue",
        WORKLOAD,
        json!({MANAGED_BY_LABEL: "podca", INSTANCE_LABEL: "blue"}),
    )
    .await;
    let half = create_by_hand(
        &c,
        "example.com:strict:half",
        STRICT,
        json!({MANAGED_BY_LABEL: "podca"}),
    )
    .await;

    let first = start(&c, &[WORKLOAD, STRICT], fast(), |_| {}).await;
    let pem = c.anchors_pem();
    wait_published(&c, WORKLOAD_CTB, &pem, "podca").await;
    wait_published(&c, STRICT_CTB, &pem, "podca").await;
    first.stop().await;

    // Reconfigured: the strict signer is gone and the suffix changed.
    let second = start(
        &c,
        &[WORKLOAD],
        PublisherOptions {
            suffix: "live".into(),
            ..fast()
        },
        |_| {},
    )
    .await;
    wait_published(&c, "example.com:workload:live", &pem, "podca").await;
    wait_for("old bundles deleted", Duration::from_secs(10), || {
        c.ctb(WORKLOAD_CTB).is_none() && c.ctb(STRICT_CTB).is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    for kept in [&foreign, &other_instance, &half] {
        let name = kept["metadata"]["name"].as_str().unwrap_or_default();
        let now = c.ctb(name).unwrap_or_else(|| panic!("{name} deleted"));
        assert_eq!(rv(&now), rv(kept), "{name} was written");
    }
    assert_eq!(second.writes("delete"), 2);
    assert_eq!(second.writes("create"), 1);
    assert_eq!(c.emu.count_objects(Res::Ctb), 4);
    assert_no_rejections(&c.emu);
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_bundle_on_podcas_name_is_left_alone() {
    let c = cluster(ApiMode::V1Only).await;
    let squatter = create_by_hand(&c, WORKLOAD_CTB, WORKLOAD, json!({"team": "a"})).await;
    let run = start(&c, &[WORKLOAD, STRICT], fast(), |_| {}).await;
    wait_published(&c, STRICT_CTB, &c.anchors_pem(), "podca").await;
    wait_for("the conflict reported", Duration::from_secs(5), || {
        run.metrics.ctb_publish_errors.get() >= 1
    })
    .await;
    run.passes(3).await;
    assert_eq!(
        rv(&c.ctb(WORKLOAD_CTB).expect("still there")),
        rv(&squatter)
    );
    assert_eq!(run.writes("create"), 1);
    assert_eq!(run.writes("update") + run.writes("delete"), 0);
    // Reported once, not once per resync.
    assert_eq!(run.metrics.ctb_publish_errors.get(), 1);
    assert_no_rejections(&c.emu);

    // Once the owner removes it, podca publishes under the name.
    let r = c.admin.delete(&c.path(WORKLOAD_CTB)).await.expect("delete");
    assert_eq!(r.status, 200);
    wait_published(&c, WORKLOAD_CTB, &c.anchors_pem(), "podca").await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_keep_to_their_own_bundles() {
    let c = cluster(ApiMode::V1Only).await;
    let blue_opts = PublisherOptions {
        suffix: "blue".into(),
        instance: "blue".into(),
        ..fast()
    };
    let green_opts = PublisherOptions {
        suffix: "green".into(),
        instance: "green".into(),
        ..fast()
    };
    let blue = start(&c, &[WORKLOAD], blue_opts, |_| {}).await;
    let green = start(&c, &[WORKLOAD], green_opts, |_| {}).await;
    let pem = c.anchors_pem();
    let b = wait_published(&c, "example.com:workload:blue", &pem, "blue").await;
    let g = wait_published(&c, "example.com:workload:green", &pem, "green").await;
    // Each has since seen the other's bundle and left it alone.
    blue.passes(3).await;
    green.passes(3).await;
    assert_eq!(
        rv(&c.ctb("example.com:workload:blue").expect("blue")),
        rv(&b)
    );
    assert_eq!(
        rv(&c.ctb("example.com:workload:green").expect("green")),
        rv(&g)
    );
    assert_eq!(blue.writes("delete") + green.writes("delete"), 0);
    assert_no_rejections(&c.emu);
    blue.stop().await;
    green.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_writes_nothing() {
    // Both ways of running replicas. The default resync (5 minutes): the takeover must
    // publish at once, not at the next resync (a sharded replica runs its publisher before
    // it leads, and its first pass, as a standby, wrote nothing).
    for sharding in [Sharding::Leader, Sharding::Rendezvous] {
        let c = cluster(ApiMode::V1Only).await;
        let rfc3339 = |t: time::OffsetDateTime| {
            t.format(&time::format_description::well_known::Rfc3339)
                .expect("time")
        };
        let now = rfc3339(time::OffsetDateTime::now_utc());
        c.emu.seed_object(
            Res::Lease,
            json!({
                "metadata": {"name": "podca-controller", "namespace": "default"},
                "spec": {
                    "holderIdentity": "other",
                    "leaseDurationSeconds": 2,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }),
        );
        // Another replica holds the Lease and keeps renewing it.
        let (stop_renewing, mut stopped) = oneshot::channel::<()>();
        let renewals = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let renewer = {
            let admin = c.admin.clone();
            let renewals = Arc::clone(&renewals);
            tokio::spawn(async move {
                loop {
                    let now = rfc3339(time::OffsetDateTime::now_utc());
                    let renewed = admin
                        .merge_patch(
                            "/apis/coordination.k8s.io/v1/namespaces/default/leases/podca-controller",
                            &json!({"spec": {"renewTime": now}}),
                        )
                        .await;
                    if renewed.is_ok_and(|r| r.status == 200) {
                        renewals.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    tokio::select! {
                        _ = &mut stopped => return,
                        () = tokio::time::sleep(Duration::from_millis(300)) => {}
                    }
                }
            })
        };
        let le = LeaderElection {
            lease_name: "podca-controller".into(),
            lease_namespace: "default".into(),
            identity: "standby".into(),
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(1),
            retry_period: Duration::from_millis(500),
        };
        let run = start(&c, &[WORKLOAD], PublisherOptions::default(), |o| {
            o.leader_election = Some(le);
            o.sharding = sharding;
        })
        .await;
        // Past the lease duration (2 s) by far: ten renewals 300 ms apart, while the standby
        // retried every 500 ms. It never led, so it never published.
        wait_for(
            "ten renewals by the holder",
            Duration::from_secs(15),
            || renewals.load(std::sync::atomic::Ordering::SeqCst) >= 10,
        )
        .await;
        assert_eq!(
            run.metrics.leader.get(),
            0,
            "{sharding:?}: the standby took the lease"
        );
        let holder = c
            .emu
            .get_object(Res::Lease, "default", "podca-controller")
            .map(|l| l["spec"]["holderIdentity"].clone());
        assert_eq!(holder, Some(json!("other")));
        assert_eq!(c.emu.count_objects(Res::Ctb), 0);
        assert_eq!(c.emu.counters().ctb_writes_accepted, 0);
        assert_eq!(run.writes("create"), 0);
        // The holder stops renewing: the standby takes over and publishes.
        let _ = stop_renewing.send(());
        renewer.await.expect("renewer");
        let pem = c.anchors_pem();
        let what = format!("{sharding:?}: takeover and publish");
        wait_for(&what, Duration::from_secs(15), || {
            c.ctb(WORKLOAD_CTB)
                .is_some_and(|o| o["spec"]["trustBundle"] == pem.as_str())
        })
        .await;
        assert_no_rejections(&c.emu);
        run.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_suffix_is_refused_at_start() {
    let c = cluster(ApiMode::V1Only).await;
    let run = start(
        &c,
        &[WORKLOAD],
        PublisherOptions {
            suffix: "Live_1".into(),
            ..Default::default()
        },
        |_| {},
    )
    .await;
    let err = tokio::time::timeout(Duration::from_secs(10), run.task)
        .await
        .expect("returns at once")
        .expect("join")
        .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("Live_1"), "{text}");
    assert_eq!(c.emu.count_objects(Res::Ctb), 0);
}
