//! The Secret CA backend against the API emulator, in simulated time: a CA read from a
//! `kubernetes.io/tls` Secret signs PCRs and is published as a ClusterTrustBundle; a new CA put
//! into the Secret is picked up without restart and taken over with overlap (published at once,
//! signing only after the propagation window, the old anchor kept until its last certificate
//! expired); a malformed Secret leaves the CA in force; a restart during the overlap changes
//! nothing about when the old anchor goes; a forged history changes nothing and is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use podca_authority::CaHandle;
use podca_authority::metrics::Metrics;
use podca_controller::Options;
use podca_controller::publisher::{Publisher, PublisherOptions};
use podca_controller::secret_ca::{SecretCa, SecretCaDriver, SecretCaOptions};
use podca_signer::SignerPolicy;
use podca_signer::rotation::Phase;
use podca_tests::client::KubeClient;
use podca_tests::cluster::{Cluster, ClusterConfig, SERVICE_ACCOUNT_GROUPS, add_pod};
use podca_tests::emulator::{ClockMode, PolicyRule, Res, Subject};
use podca_tests::kubelet::{
    Credential, KeyType, KubeletSim, Outcome, PodRef, RequestOptions, trust_anchors_for_signer,
};
use podca_tests::sim::SimClock;
use podca_tests::{Emulator, EmulatorConfig};
use time::{Duration, OffsetDateTime, macros::datetime};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

const SIGNER: &str = "example.com/mesh";
const NS: &str = "shop";
const CA_NS: &str = "podca";
const SECRET: &str = "podca-ca";
const HISTORY: &str = "podca-ca-podca-history";
const CA_USER: &str = "system:serviceaccount:podca:podca-ca";
const VERSION: &str = "v1beta1";
const T0: OffsetDateTime = datetime!(2027-05-01 00:00 UTC);
const LEAF_LIFETIME: i64 = 3600;
const WINDOW: i64 = 15 * 60;

/// A client of the emulator as the `podca` identity (kube is not a dependency of this crate,
/// so its type is not named here).
macro_rules! client {
    ($world:expr) => {
        podca_controller::connect(Some(&$world.kubeconfig))
            .await
            .expect("client")
    };
}

/// A client as the Secret backend's identity.
macro_rules! ca_client {
    ($world:expr) => {
        podca_controller::connect(Some(&$world.ca_kubeconfig))
            .await
            .expect("client")
    };
}

/// A CA for the Secret: certificate PEM (issuing first), key PEM, and the root PEM.
struct TestCa {
    cert_pem: String,
    key_pem: String,
    root_pem: String,
}

fn ca_params(cn: &str, path_len: Option<u8>) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.is_ca = rcgen::IsCa::Ca(match path_len {
        Some(n) => rcgen::BasicConstraints::Constrained(n),
        None => rcgen::BasicConstraints::Unconstrained,
    });
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = T0 - Duration::days(1);
    params.not_after = T0 + Duration::days(30);
    params
}

/// A self-signed root that signs leaves itself.
fn root_ca(cn: &str) -> TestCa {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let cert = ca_params(cn, None).self_signed(&key).expect("root");
    TestCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        root_pem: cert.pem(),
    }
}

/// A root, and a function making intermediates under it.
struct TestRoot {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

fn test_root(cn: &str) -> TestRoot {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let params = ca_params(cn, None);
    let cert = params.self_signed(&key).expect("root");
    TestRoot {
        pem: cert.pem(),
        issuer: rcgen::Issuer::new(params, key),
    }
}

fn intermediate(root: &TestRoot, cn: &str) -> TestCa {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let cert = ca_params(cn, Some(0))
        .signed_by(&key, &root.issuer)
        .expect("intermediate");
    TestCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        root_pem: root.pem.clone(),
    }
}

fn ders(pem_text: &str) -> BTreeSet<Vec<u8>> {
    pem::parse_many(pem_text)
        .expect("PEM")
        .into_iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| b.into_contents())
        .collect()
}

/// Everything one test needs: the emulator, the clock, a pod and its kubelet.
struct World {
    emu: Emulator,
    sim: SimClock,
    admin: KubeClient,
    kubelet: KubeletSim,
    pod: PodRef,
    kubeconfig: std::path::PathBuf,
    /// The Secret backend's identity.
    ca_kubeconfig: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl World {
    async fn new() -> World {
        let sim = SimClock::at(T0);
        let cluster = Cluster::start_with(ClusterConfig {
            emulator: EmulatorConfig {
                bookmark_interval: StdDuration::from_millis(200),
                ..Default::default()
            },
            signers: &[SIGNER],
            ..Default::default()
        })
        .await;
        let emu = &cluster.emu;
        emu.set_clock(ClockMode::Fixed(T0));
        emu.add_namespace(NS);
        emu.add_namespace(CA_NS);
        let node_uid = emu.add_node("node-1");
        let node_token = emu.add_node_identity("node-1");
        let kubelet = KubeletSim::new(emu.base_url(), &node_token, VERSION);
        let pod = add_pod(
            emu,
            NS,
            "frontend-0",
            "frontend",
            ("node-1", &node_uid),
            &[(SIGNER, KeyType::EcdsaP256)],
        );
        // The Secret backend runs as an identity of its own here, with exactly the rules it
        // documents (in the Secret's namespace), so that a request outside them fails the test.
        emu.add_identity("podca-ca", CA_USER, SERVICE_ACCOUNT_GROUPS);
        let user = || Subject::User(CA_USER.into());
        emu.grant(
            user(),
            PolicyRule::new(&[""], &["secrets"], &["get", "list", "watch"])
                .with_names(&[SECRET])
                .in_namespaces(&[CA_NS]),
        );
        emu.grant(
            user(),
            PolicyRule::new(&[""], &["configmaps"], &["get", "update"])
                .with_names(&[HISTORY])
                .in_namespaces(&[CA_NS]),
        );
        emu.grant(
            user(),
            PolicyRule::new(&[""], &["configmaps"], &["create"]).in_namespaces(&[CA_NS]),
        );
        // podca's copy of the history on its ClusterTrustBundle (podca's ClusterRole grants
        // these for the publisher).
        emu.grant(
            user(),
            PolicyRule::new(
                &["certificates.k8s.io"],
                &["clustertrustbundles"],
                &["get", "update"],
            ),
        );
        emu.grant_signer(CA_USER, &["attest"], &[SIGNER]);
        // Warning Events on a rejected history (podca's ClusterRole grants these).
        emu.grant(
            user(),
            PolicyRule::new(&["events.k8s.io"], &["events"], &["create", "patch"])
                .in_namespaces(&[CA_NS]),
        );
        let ca_kubeconfig = cluster.write_kubeconfig("podca-ca");
        let Cluster {
            emu,
            admin,
            dir,
            kubeconfig,
        } = cluster;
        World {
            emu,
            sim,
            admin,
            kubelet,
            pod,
            kubeconfig,
            ca_kubeconfig,
            _dir: dir,
        }
    }

    fn set_time(&self, t: OffsetDateTime) {
        self.sim.set(t);
        self.emu.set_clock(ClockMode::Fixed(t));
    }

    fn put_secret(&self, ca: &TestCa, with_ca_crt: bool) {
        let mut data: Vec<(&str, &[u8])> = vec![
            ("tls.crt", ca.cert_pem.as_bytes()),
            ("tls.key", ca.key_pem.as_bytes()),
        ];
        if with_ca_crt {
            data.push(("ca.crt", ca.root_pem.as_bytes()));
        }
        self.emu
            .add_secret(CA_NS, SECRET, "kubernetes.io/tls", &data);
    }

    fn put_raw_secret(&self, cert: &str, key: &str) {
        self.emu.add_secret(
            CA_NS,
            SECRET,
            "kubernetes.io/tls",
            &[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())],
        );
    }

    /// Starts the Secret backend (its driver running) and the controller with the publisher.
    async fn start(&self) -> Running {
        self.start_with(options()).await
    }

    async fn start_with(&self, options: SecretCaOptions) -> Running {
        let metrics = Arc::new(Metrics::new());
        let (handle, driver) = SecretCa::start(
            ca_client!(self),
            options,
            self.sim.clock(),
            Arc::clone(&metrics),
        )
        .await
        .expect("the Secret CA starts");
        self.run(handle, driver, metrics).await
    }

    async fn run(
        &self,
        handle: CaHandle,
        driver: SecretCaDriver,
        metrics: Arc<Metrics>,
    ) -> Running {
        let (driver_stop, driver_stopped) = watch::channel(false);
        let driver_task = tokio::spawn(driver.run(driver_stopped));
        let mut policy = SignerPolicy::permissive("cluster.local");
        policy.default_lifetime_seconds = LEAF_LIFETIME as u32;
        policy.max_lifetime_seconds = LEAF_LIFETIME as u32;
        let mut options = Options::new(
            BTreeMap::from([(SIGNER.to_string(), policy)]),
            handle.clone(),
        );
        options.clock = self.sim.clock();
        options.metrics = Arc::clone(&metrics);
        options.publisher = Some(PublisherOptions::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let controller = tokio::spawn(podca_controller::run(client!(self), options, async move {
            let _ = stopped.await;
        }));
        Running {
            handle,
            metrics,
            driver_stop,
            driver_task,
            stop,
            controller,
        }
    }

    /// The anchors in the signer's ClusterTrustBundles.
    async fn published(&self) -> BTreeSet<Vec<u8>> {
        ders(
            &trust_anchors_for_signer(&self.admin, VERSION, SIGNER)
                .await
                .expect("CTB list"),
        )
    }

    /// Waits (real time) until the bundles hold exactly the anchors of `cas`.
    /// At `at`, the Secret gets `new` (with `ca.crt` as `with_ca_crt` says); waits until both
    /// roots are published and the history shows `old` active and `new` prepared.
    async fn prepare_next(
        &self,
        old: &TestCa,
        new: &TestCa,
        at: OffsetDateTime,
        with_ca_crt: bool,
    ) -> podca_controller::secret_ca::History {
        self.set_time(at);
        self.put_secret(new, with_ca_crt);
        self.wait_published(&[old, new]).await;
        wait_history(&self.emu, |h| phases(h) == [Phase::Active, Phase::Prepared]).await
    }

    async fn wait_published(&self, cas: &[&TestCa]) {
        let want: BTreeSet<Vec<u8>> = cas.iter().flat_map(|c| ders(&c.root_pem)).collect();
        for _ in 0..400 {
            if self.published().await == want {
                return;
            }
            tokio::time::sleep(StdDuration::from_millis(25)).await;
        }
        panic!(
            "the ClusterTrustBundle did not come to hold {} anchor(s) within 10 s",
            want.len()
        );
    }

    async fn obtain(&self) -> Credential {
        match self
            .kubelet
            .obtain(&self.pod, &request(), StdDuration::from_secs(20))
            .await
            .expect("the PCR is answered")
        {
            Outcome::Issued(c) => *c,
            other => panic!("PCR not issued: {other:?}"),
        }
    }
}

fn request() -> RequestOptions {
    let mut opts = RequestOptions::new(SIGNER, KeyType::EcdsaP256);
    opts.max_expiration_seconds = Some(LEAF_LIFETIME);
    opts
}

fn options() -> SecretCaOptions {
    let mut o = SecretCaOptions::new(CA_NS, SECRET);
    o.schedule.propagation_seconds = WINDOW;
    o.max_leaf_lifetime = Duration::seconds(LEAF_LIFETIME);
    o.poll = StdDuration::from_millis(100);
    o
}

/// [`options`] with podca's copy of the history on the signer's ClusterTrustBundle.
fn options_with_copy() -> SecretCaOptions {
    let mut o = options();
    o.history_copies = Publisher::new([SIGNER], &PublisherOptions::default())
        .expect("valid signer")
        .bundles()
        .to_vec();
    o
}

/// A running driver and controller.
struct Running {
    handle: CaHandle,
    metrics: Arc<Metrics>,
    driver_stop: watch::Sender<bool>,
    driver_task: JoinHandle<()>,
    stop: oneshot::Sender<()>,
    controller: JoinHandle<Result<(), podca_controller::Error>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.driver_stop.send(true);
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(StdDuration::from_secs(20), self.driver_task).await;
        let _ = tokio::time::timeout(StdDuration::from_secs(20), self.controller).await;
    }

    /// Waits (real time) until the handle's signing CA is `ca`'s issuing certificate.
    async fn wait_signer(&self, ca: &TestCa) {
        let want = ders(&ca.cert_pem)
            .into_iter()
            .next()
            .expect("a certificate");
        for _ in 0..400 {
            if self.handle.current().ca.certificate().der() == want.as_slice() {
                return;
            }
            tokio::time::sleep(StdDuration::from_millis(25)).await;
        }
        panic!("the handle did not switch to the new CA within 10 s");
    }

    /// Waits until the driver has made `n` more checks (`podca_ca_rotation_checks_total`):
    /// two or more include one that began, and read the clock, after the call.
    async fn checks(&self, n: u64) {
        let start = self.metrics.rotation_checks.get();
        for _ in 0..800 {
            if self.metrics.rotation_checks.get() >= start + n {
                return;
            }
            tokio::time::sleep(StdDuration::from_millis(25)).await;
        }
        panic!("the driver made fewer than {n} checks in 20 s");
    }

    fn steps(&self, step: &'static str) -> u64 {
        self.metrics
            .rotation_steps
            .get_or_create(&podca_authority::rotation::StepLabels {
                step,
                ca: "default".into(),
            })
            .get()
    }
}

/// Signed by `ca` (verifies against its anchor) and by no other of `others`.
fn assert_signed_by(credential: &Credential, ca: &TestCa, others: &[&TestCa], at: OffsetDateTime) {
    credential
        .verify_chain(&ca.root_pem, at)
        .unwrap_or_else(|e| panic!("not signed by the expected CA: {e}"));
    let issuer = ders(&ca.cert_pem).into_iter().next().expect("cert");
    if credential.chain_der.len() > 1 {
        assert_eq!(credential.chain_der[1], issuer, "chain names another CA");
    }
    for o in others {
        let refused = credential
            .verify_chain(&o.root_pem, at)
            .expect_err("a leaf verified against the wrong anchor");
        assert!(
            refused
                .0
                .ends_with("is signed by neither the next certificate nor a trust anchor"),
            "{refused}"
        );
    }
}

/// The history as the ConfigMap holds it.
fn history(emu: &Emulator) -> podca_controller::secret_ca::History {
    let cm = emu
        .get_object(Res::ConfigMap, CA_NS, HISTORY)
        .expect("the history ConfigMap exists");
    assert_eq!(
        cm["metadata"]["labels"]["app.kubernetes.io/managed-by"], "podca",
        "{cm}"
    );
    let text = cm["data"]["history.json"].as_str().expect("history.json");
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    serde_json::from_str(text).expect("history JSON")
}

/// Waits (real time) until the recorded history satisfies `f`.
async fn wait_history(
    emu: &Emulator,
    f: impl Fn(&podca_controller::secret_ca::History) -> bool,
) -> podca_controller::secret_ca::History {
    for _ in 0..400 {
        if emu.get_object(Res::ConfigMap, CA_NS, HISTORY).is_some() {
            let h = history(emu);
            if f(&h) {
                return h;
            }
        }
        tokio::time::sleep(StdDuration::from_millis(25)).await;
    }
    panic!(
        "the history did not reach the expected state: {:?}",
        history(emu)
    );
}

fn phases(h: &podca_controller::secret_ca::History) -> Vec<Phase> {
    h.generations.iter().map(|r| r.generation.phase).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_secret_ca_rotates_with_overlap_without_restart() {
    let w = World::new().await;
    let a = root_ca("podca secret CA A");
    let b = root_ca("podca secret CA B");
    w.put_secret(&a, false);
    let run = w.start().await;

    // Start: the Secret's CA signs and its anchor is published.
    w.wait_published(&[&a]).await;
    let first = w.obtain().await;
    assert_signed_by(&first, &a, &[&b], T0);
    let h = wait_history(&w.emu, |h| phases(h) == [Phase::Active]).await;
    assert_eq!(h.secret, format!("{CA_NS}/{SECRET}"));

    // The Secret now holds another CA (a different root): picked up by the watch, its anchor
    // published at once, next to the old one.
    let changed = T0 + Duration::minutes(1);
    w.prepare_next(&a, &b, changed, true).await;

    // During the window the old CA still signs, up to its last second.
    let last_second = changed + Duration::seconds(WINDOW - 1);
    w.set_time(last_second);
    let during = w.obtain().await;
    assert_signed_by(&during, &a, &[&b], last_second);
    let last_old_leaf = during.not_after;
    assert_eq!(
        w.published().await,
        ders(&format!("{}{}", a.root_pem, b.root_pem))
    );

    // After the window the new CA signs; the old anchor stays.
    let activated = changed + Duration::seconds(WINDOW + 1);
    w.set_time(activated);
    run.wait_signer(&b).await;
    let after = w.obtain().await;
    assert_signed_by(&after, &b, &[&a], activated);
    let h = wait_history(&w.emu, |h| phases(h) == [Phase::Retired, Phase::Active]).await;
    let retired = &h.generations[0].generation;
    let drop_at = retired.anchor_needed_until();
    assert!(drop_at >= last_old_leaf, "{drop_at} < {last_old_leaf}");
    assert_eq!(drop_at, activated + Duration::seconds(LEAF_LIFETIME));

    // The old anchor stays published until the old CA's last leaf expired …
    w.set_time(last_old_leaf);
    run.checks(2).await;
    assert_eq!(run.handle.current().anchors.len(), 2);
    assert_eq!(
        w.published().await,
        ders(&format!("{}{}", a.root_pem, b.root_pem)),
        "the old anchor left before the last old leaf expired"
    );
    w.set_time(drop_at - Duration::SECOND);
    run.checks(2).await;
    assert_eq!(run.handle.current().anchors.len(), 2);
    assert_eq!(w.published().await.len(), 2);
    // … and goes after it.
    w.set_time(drop_at + Duration::SECOND);
    w.wait_published(&[&b]).await;
    // The dropped generation is no longer recorded, nor vouched for by the seal.
    let h = wait_history(&w.emu, |h| phases(h) == [Phase::Active]).await;
    assert_eq!(h.generations[0].chain_pem, b.cert_pem);
    for (step, want) in [("prepare", 2), ("activate", 2), ("retire", 1), ("drop", 1)] {
        assert_eq!(run.steps(step), want, "{step} steps");
    }
    assert_eq!(run.metrics.rotation_errors.get(), 0);
    run.stop().await;
    let counters = w.emu.counters();
    assert_eq!(
        (counters.validation_rejections, counters.forbidden),
        (0, 0),
        "the emulator refused a request: {:?}",
        counters.rejections_by_cause
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_secret_leaves_the_ca_in_force() {
    let w = World::new().await;
    let a = root_ca("podca secret CA A");
    let b = root_ca("podca secret CA B");
    w.put_secret(&a, false);
    let run = w.start().await;
    w.wait_published(&[&a]).await;

    // A key that does not match the certificate, then a key that is no key at all.
    w.put_raw_secret(&a.cert_pem, &b.key_pem);
    tokio::time::sleep(StdDuration::from_millis(500)).await;
    w.put_raw_secret(
        &b.cert_pem,
        "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n",
    );
    tokio::time::sleep(StdDuration::from_millis(500)).await;
    w.put_raw_secret("not a certificate", &a.key_pem);
    for _ in 0..400 {
        if run.metrics.rotation_errors.get() >= 3 {
            break;
        }
        tokio::time::sleep(StdDuration::from_millis(25)).await;
    }
    assert_eq!(
        run.metrics.rotation_errors.get(),
        3,
        "one error per bad version"
    );
    assert_eq!(w.published().await, ders(&a.root_pem));
    let still = w.obtain().await;
    assert_signed_by(&still, &a, &[&b], T0);
    assert_eq!(phases(&history(&w.emu)), [Phase::Active]);

    // The next good change is taken (with overlap).
    w.put_secret(&b, false);
    w.wait_published(&[&a, &b]).await;
    let during = w.obtain().await;
    assert_signed_by(&during, &a, &[&b], T0);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_the_overlap_keeps_the_old_anchor_until_the_same_time() {
    let w = World::new().await;
    let a = root_ca("podca secret CA A");
    let b = root_ca("podca secret CA B");
    w.put_secret(&a, false);
    let run = w.start().await;
    w.wait_published(&[&a]).await;
    let changed = T0 + Duration::minutes(1);
    let before = w.prepare_next(&a, &b, changed, false).await;
    let old_leaf = w.obtain().await;
    assert_signed_by(&old_leaf, &a, &[&b], changed);

    // podca restarts five minutes into the window: the old CA's key is gone with the old
    // Secret contents.
    run.stop().await;
    let restarted = changed + Duration::minutes(5);
    w.set_time(restarted);
    let run = w.start().await;
    assert_eq!(
        run.handle
            .current()
            .anchors
            .iter()
            .map(|c| c.der().to_vec())
            .collect::<BTreeSet<_>>(),
        ders(&format!("{}{}", a.root_pem, b.root_pem)),
        "both anchors are published after the restart"
    );
    let b_issuing = ders(&b.cert_pem).into_iter().next().expect("cert");
    assert_eq!(
        run.handle.current().ca.certificate().der(),
        b_issuing.as_slice(),
        "the new CA is installed, gated until its window is over"
    );
    let gated = run
        .handle
        .current()
        .ca
        .key()
        .sign(b"probe")
        .expect_err("the new CA signs nothing before its window is over");
    assert!(
        gated
            .to_string()
            .contains("once its trust anchor has been published for the propagation window"),
        "{gated}"
    );
    w.wait_published(&[&a, &b]).await;
    let after_restart = history(&w.emu);
    assert_eq!(
        after_restart.generations[1].generation.prepared_at,
        before.generations[1].generation.prepared_at,
        "the restart keeps the recorded propagation start"
    );

    // A request filed now waits: the new CA may not sign before its window is over.
    let pending = w
        .kubelet
        .request(&w.pod, &request(), None)
        .await
        .expect("PCR filed");
    let early = w
        .kubelet
        .wait(&pending, StdDuration::from_secs(2))
        .await
        .expect_err("answered inside the window");
    assert_eq!(
        early.0,
        format!("PCR {} not answered within 2s", pending.name)
    );

    // After the window the new CA signs it.
    let activated = changed + Duration::seconds(WINDOW + 1);
    w.set_time(activated);
    match w
        .kubelet
        .wait(&pending, StdDuration::from_secs(60))
        .await
        .expect("answered after the window")
    {
        Outcome::Issued(c) => assert_signed_by(&c, &b, &[&a], activated),
        other => panic!("not issued: {other:?}"),
    }
    let h = wait_history(&w.emu, |h| phases(h) == [Phase::Retired, Phase::Active]).await;
    // The same drop time as without the restart: retirement when the window ended, plus the
    // longest leaf lifetime.
    let drop_at = h.generations[0].generation.anchor_needed_until();
    assert_eq!(drop_at, activated + Duration::seconds(LEAF_LIFETIME));
    assert!(drop_at >= old_leaf.not_after);
    w.set_time(drop_at - Duration::SECOND);
    run.checks(2).await;
    assert_eq!(
        run.handle.current().anchors.len(),
        2,
        "the old anchor left early"
    );
    assert_eq!(w.published().await.len(), 2, "the old anchor left early");
    w.set_time(drop_at + Duration::SECOND);
    w.wait_published(&[&b]).await;
    run.stop().await;
}

/// The attack on the seal's past: the genuine history sealed in B's window (A active, B
/// prepared) is put back into the ConfigMap after A was dropped, and podca restarts with no
/// newer witness (no copy on a ClusterTrustBundle). It verifies, but A's root stays out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_replayed_after_a_drop_does_not_bring_the_dropped_root_back() {
    let w = World::new().await;
    let a = root_ca("podca secret CA A");
    let b = root_ca("podca secret CA B");
    w.put_secret(&a, false);
    let run = w.start().await;
    w.wait_published(&[&a]).await;
    let changed = T0 + Duration::minutes(1);
    w.prepare_next(&a, &b, changed, false).await;
    let cm = w
        .emu
        .get_object(Res::ConfigMap, CA_NS, HISTORY)
        .expect("the history ConfigMap exists");
    let old_json = cm["data"]["history.json"]
        .as_str()
        .expect("json")
        .to_owned();
    let old_seal = cm["data"]["history.seal"]
        .as_str()
        .expect("seal")
        .to_owned();

    let activated = changed + Duration::seconds(WINDOW + 1);
    w.set_time(activated);
    run.wait_signer(&b).await;
    let h = wait_history(&w.emu, |h| phases(h) == [Phase::Retired, Phase::Active]).await;
    let drop_at = h.generations[0].generation.anchor_needed_until();
    w.set_time(drop_at + Duration::SECOND);
    w.wait_published(&[&b]).await;
    wait_history(&w.emu, |h| phases(h) == [Phase::Active]).await;
    run.stop().await;

    forge_history(&w.emu, &old_json, Some(&old_seal));
    let restarted = drop_at + Duration::hours(1);
    w.set_time(restarted);
    let run = w.start().await;
    assert_eq!(
        run.handle
            .current()
            .anchors
            .iter()
            .map(|c| c.der().to_vec())
            .collect::<BTreeSet<_>>(),
        ders(&b.root_pem),
        "the dropped root is published again"
    );
    run.checks(2).await;
    assert_eq!(w.published().await, ders(&b.root_pem));
    let h = wait_history(&w.emu, |h| phases(h) == [Phase::Active]).await;
    assert_eq!(h.generations[0].chain_pem, b.cert_pem, "{h:?}");
    assert_eq!(
        rejected_total(&run.metrics),
        0,
        "a genuine seal: nothing rejected"
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reissued_intermediate_under_the_same_root_takes_over_at_once() {
    let w = World::new().await;
    let root = test_root("podca secret root");
    let first = intermediate(&root, "podca intermediate 1");
    let second = intermediate(&root, "podca intermediate 2");
    w.put_secret(&first, true);
    let run = w.start().await;
    w.wait_published(&[&first]).await;
    let leaf = w.obtain().await;
    assert_signed_by(&leaf, &first, &[], T0);

    // The root has been published for longer than the window: the new intermediate signs at
    // once, and the bundle does not change.
    let later = T0 + Duration::seconds(WINDOW + 60);
    w.set_time(later);
    w.put_secret(&second, true);
    run.wait_signer(&second).await;
    let leaf = w.obtain().await;
    assert_signed_by(&leaf, &second, &[], later);
    assert_eq!(w.published().await, ders(&root.pem));
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_output_holds_no_key() {
    let w = World::new().await;
    let a = root_ca("podca secret CA A");
    w.put_secret(&a, false);
    let (handle, driver) = SecretCa::start(
        ca_client!(w),
        options(),
        w.sim.clock(),
        Arc::new(Metrics::new()),
    )
    .await
    .expect("start");
    let key_body = a.key_pem.lines().nth(1).expect("a key line").to_string();
    for text in [
        format!("{:?}", options()),
        format!("{driver:?}"),
        format!("{handle:?}"),
        format!("{:?}", handle.current()),
    ] {
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        assert!(!text.contains(&key_body), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_missing_secret_refuses_to_start() {
    let w = World::new().await;
    let start = || async {
        SecretCa::start(
            ca_client!(w),
            options(),
            w.sim.clock(),
            Arc::new(Metrics::new()),
        )
        .await
    };
    let e = start().await.expect_err("no Secret");
    assert!(e.to_string().contains("not found"), "{e}");
    let a = root_ca("A");
    let b = root_ca("B");
    w.put_raw_secret(&a.cert_pem, &b.key_pem);
    let e = start().await.expect_err("mismatched key");
    let text = e.to_string();
    assert!(text.contains("does not match"), "{text}");
    assert!(!text.contains("PRIVATE KEY"), "{text}");
}

/// The history ConfigMap's data as stored: `history.json` and `history.seal`.
fn stored_history(emu: &Emulator) -> (String, Option<String>) {
    let cm = emu
        .get_object(Res::ConfigMap, CA_NS, HISTORY)
        .expect("the history ConfigMap exists");
    (
        cm["data"]["history.json"]
            .as_str()
            .expect("history.json")
            .to_owned(),
        cm["data"]["history.seal"].as_str().map(str::to_owned),
    )
}

/// Overwrites the history ConfigMap as someone with ConfigMap write access in podca's namespace
/// could (podca's label included).
fn forge_history(emu: &Emulator, history_json: &str, seal: Option<&str>) {
    let mut data = serde_json::json!({ "history.json": history_json });
    if let Some(seal) = seal {
        data["history.seal"] = serde_json::json!(seal);
    }
    let uid = emu
        .get_object(Res::ConfigMap, CA_NS, HISTORY)
        .and_then(|c| c["metadata"]["uid"].as_str().map(str::to_owned));
    let mut metadata = serde_json::json!({
        "name": HISTORY,
        "namespace": CA_NS,
        "labels": { "app.kubernetes.io/managed-by": "podca" },
    });
    if let Some(uid) = uid {
        metadata["uid"] = serde_json::json!(uid);
    }
    emu.seed_object(
        Res::ConfigMap,
        serde_json::json!({ "metadata": metadata, "data": data }),
    );
}

/// `history_json` changed by `edit` (on its JSON form).
fn edit_history(history_json: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(history_json).expect("history JSON");
    edit(&mut v);
    serde_json::to_string_pretty(&v).expect("encodes")
}

fn rejected(metrics: &Metrics, reason: &'static str) -> u64 {
    metrics
        .ca_history_rejected
        .get_or_create(&podca_authority::metrics::ReasonLabels { reason })
        .get()
}

fn rejected_total(metrics: &Metrics) -> u64 {
    [
        "unsigned",
        "seal_unreadable",
        "unknown_signer",
        "bad_signature",
        "unreadable",
        "other_secret",
        "impossible_values",
        "replayed",
        "not_owned",
        "missing",
    ]
    .into_iter()
    .map(|r| rejected(metrics, r))
    .sum()
}

/// The Warning Events regarding the history ConfigMap.
fn history_events(emu: &Emulator) -> Vec<serde_json::Value> {
    emu.list_objects(Res::Event, Some(CA_NS))
        .into_iter()
        .filter(|e| {
            e["regarding"]["kind"] == "ConfigMap"
                && e["regarding"]["name"] == HISTORY
                && e["reason"] == "CAHistoryRejected"
                && e["type"] == "Warning"
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_history_changes_nothing_is_reported_and_podca_starts() {
    let w = World::new().await;
    let a = root_ca("podca secret CA A");
    let b = root_ca("podca secret CA B");
    let mallory = root_ca("mallory");
    w.put_secret(&a, false);
    let run = w.start().await;
    w.wait_published(&[&a]).await;
    wait_history(&w.emu, |h| phases(h) == [Phase::Active]).await;
    let (first_json, first_seal) = stored_history(&w.emu);
    let changed = T0 + Duration::minutes(1);
    let genuine = w.prepare_next(&a, &b, changed, false).await;
    let (genuine_json, genuine_seal) = stored_history(&w.emu);
    let genuine_seal = genuine_seal.expect("podca seals its history");
    run.wait_signer(&a).await;

    let with_mallory = edit_history(&genuine_json, |h| {
        let mut extra = h["generations"][0].clone();
        extra["generation"]["id"] = 9.into();
        extra["chain_pem"] = mallory.cert_pem.clone().into();
        extra["anchors_pem"] = mallory.root_pem.clone().into();
        h["generations"]
            .as_array_mut()
            .expect("generations")
            .push(extra);
    });
    #[rustfmt::skip]
    let forgeries: Vec<(&str, String, Option<String>, &'static str)> = vec![
        ("extra root", with_mallory.clone(), Some(genuine_seal.clone()), "bad_signature"),
        ("extra root, seal removed", with_mallory, None, "unsigned"),
        ("skipped window", edit_history(&genuine_json, |h| {
            h["generations"][1]["generation"]["prepared_at"] = "2027-04-01T00:00:00Z".into();
        }), Some(genuine_seal.clone()), "bad_signature"),
        ("dropped live root", edit_history(&genuine_json, |h| {
            h["generations"].as_array_mut().expect("generations").remove(0);
        }), Some(genuine_seal.clone()), "bad_signature"),
        ("far-future times", edit_history(&genuine_json, |h| {
            h["generations"][1]["generation"]["prepared_at"] = "9999-12-31T00:00:00Z".into();
        }), Some(genuine_seal.clone()), "bad_signature"),
        ("replayed older genuine history", first_json, first_seal, "replayed"),
    ];
    let both = ders(&format!("{}{}", a.root_pem, b.root_pem));
    let a_issuing = ders(&a.cert_pem).into_iter().next().expect("cert");
    for (i, (name, history_json, seal, reason)) in forgeries.into_iter().enumerate() {
        let before = rejected(&run.metrics, reason);
        forge_history(&w.emu, &history_json, seal.as_deref());
        // Reported: counted under its reason …
        for _ in 0..400 {
            if rejected(&run.metrics, reason) > before {
                break;
            }
            tokio::time::sleep(StdDuration::from_millis(25)).await;
        }
        assert_eq!(
            rejected(&run.metrics, reason),
            before + 1,
            "{name}: not counted"
        );
        // … and the leader writes the genuine history back over it.
        let restored = wait_history(&w.emu, |h| *h == genuine).await;
        assert_eq!(restored, genuine, "{name}");
        // Nothing changed: the same anchors and the same signing CA.
        assert_eq!(w.published().await, both, "{name}");
        assert_eq!(
            run.handle.current().ca.certificate().der(),
            a_issuing.as_slice(),
            "{name}: the signing CA changed"
        );
        assert_eq!(
            rejected_total(&run.metrics),
            i as u64 + 1,
            "{name}: counted once"
        );
    }
    let leaf = w.obtain().await;
    assert_signed_by(&leaf, &a, &[&b, &mallory], changed);
    // Once per ConfigMap version: more checks of the restored history report nothing.
    run.checks(3).await;
    assert_eq!(rejected_total(&run.metrics), 6);
    for _ in 0..400 {
        if history_events(&w.emu).len() >= 6 {
            break;
        }
        tokio::time::sleep(StdDuration::from_millis(25)).await;
    }
    let events = history_events(&w.emu);
    assert!(
        events.iter().any(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("the seal's signature does not verify"))),
        "{events:#?}"
    );

    // A restart with a forged history (the far-future time that used to crash podca, and an
    // anchor of its own): podca starts, reports it, publishes no forged anchor, and the
    // Secret's CA signs nothing for a whole window from now.
    run.stop().await;
    let forged = edit_history(&genuine_json, |h| {
        h["generations"][1]["generation"]["prepared_at"] = "9999-12-31T00:00:00Z".into();
        h["generations"][0]["anchors_pem"] = mallory.root_pem.clone().into();
    });
    forge_history(&w.emu, &forged, Some(&genuine_seal));
    let restarted = changed + Duration::minutes(5);
    w.set_time(restarted);
    let run = w.start().await;
    assert_eq!(rejected(&run.metrics, "bad_signature"), 1);
    let b_issuing = ders(&b.cert_pem).into_iter().next().expect("cert");
    assert_eq!(
        run.handle.current().ca.certificate().der(),
        b_issuing.as_slice()
    );
    let held = run
        .handle
        .current()
        .ca
        .key()
        .sign(b"probe")
        .expect_err("held for a window after a rejected history");
    assert!(held.to_string().contains("propagation window"), "{held}");
    w.wait_published(&[&b]).await;
    let rewritten = wait_history(&w.emu, |h| phases(h) == [Phase::Active]).await;
    assert_eq!(rewritten.generations.len(), 1);
    // The hold is sealed into the history: a restart within it keeps it.
    run.stop().await;
    w.set_time(restarted + Duration::minutes(1));
    let run = w.start().await;
    assert_eq!(
        rejected_total(&run.metrics),
        0,
        "podca's own history verifies"
    );
    assert!(
        run.handle.current().ca.key().sign(b"probe").is_err(),
        "still held"
    );
    let after = restarted + Duration::seconds(WINDOW + 1);
    w.set_time(after);
    let leaf = w.obtain().await;
    assert_signed_by(&leaf, &b, &[&a, &mallory], after);
    run.stop().await;
    let counters = w.emu.counters();
    assert_eq!(
        (counters.validation_rejections, counters.forbidden),
        (0, 0),
        "the emulator refused a request: {:?}",
        counters.rejections_by_cause
    );
}

/// podca's copy of the history on the signer's ClusterTrustBundle: `history.json` and its seal.
fn copy_on_bundle(emu: &Emulator) -> Option<(String, String)> {
    let name = &options_with_copy().history_copies[0].name;
    let ctb = emu.get_object(Res::Ctb, "", name)?;
    let annotations = &ctb["metadata"]["annotations"];
    Some((
        annotations["podca.dev/ca-history"].as_str()?.to_owned(),
        annotations["podca.dev/ca-history-seal"]
            .as_str()?
            .to_owned(),
    ))
}

/// Waits (real time) until the copy on the bundle is the history the ConfigMap holds.
async fn wait_copy_current(emu: &Emulator) -> (String, String) {
    for _ in 0..400 {
        if let (Some(copy), Some(cm)) = (
            copy_on_bundle(emu),
            emu.get_object(Res::ConfigMap, CA_NS, HISTORY),
        ) && cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "podca"
            && Some(copy.0.as_str()) == cm["data"]["history.json"].as_str()
            && Some(copy.1.as_str()) == cm["data"]["history.seal"].as_str()
        {
            return copy;
        }
        tokio::time::sleep(StdDuration::from_millis(25)).await;
    }
    panic!("the ClusterTrustBundle did not come to hold the ConfigMap's history within 10 s");
}

/// What a start gives: the handle's anchors, its signing CA, whether it signs now, and the
/// published anchors once they settled.
async fn started_state(
    w: &World,
    run: &Running,
    want: &[&TestCa],
) -> (BTreeSet<Vec<u8>>, Vec<u8>, bool, BTreeSet<Vec<u8>>) {
    let current = run.handle.current();
    let anchors = current.anchors.iter().map(|c| c.der().to_vec()).collect();
    let signer = current.ca.certificate().der().to_vec();
    let signs = current.ca.key().sign(b"probe").is_ok();
    w.wait_published(want).await;
    (anchors, signer, signs, w.published().await)
}

/// A forged history ConfigMap: `history.json` and, when given, `history.seal`.
type Forged = (String, Option<String>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_start_a_forged_history_gives_what_the_genuine_one_gives() {
    let w = World::new().await;
    let a = root_ca("podca secret CA A");
    let b = root_ca("podca secret CA B");
    let mallory = root_ca("mallory");
    w.put_secret(&a, false);
    let run = w.start_with(options_with_copy()).await;
    w.wait_published(&[&a]).await;
    wait_history(&w.emu, |h| phases(h) == [Phase::Active]).await;
    let changed = T0 + Duration::minutes(1);
    w.prepare_next(&a, &b, changed, false).await;
    let (older_json, older_seal) = wait_copy_current(&w.emu).await;
    run.stop().await;

    // The genuine restart, five minutes into the window: both anchors, B gated until the window
    // recorded at `changed` is over.
    let restarted = changed + Duration::minutes(5);
    w.set_time(restarted);
    let run = w.start_with(options_with_copy()).await;
    let genuine = started_state(&w, &run, &[&a, &b]).await;
    assert_eq!(rejected_total(&run.metrics), 0);
    assert_eq!(genuine.0, ders(&format!("{}{}", a.root_pem, b.root_pem)));
    assert_eq!(Some(&genuine.1), ders(&b.cert_pem).iter().next());
    assert!(!genuine.2, "B signs nothing before its window is over");
    let (genuine_json, genuine_seal) = wait_copy_current(&w.emu).await;
    let genuine_history = history(&w.emu);
    run.stop().await;

    let with_mallory = edit_history(&genuine_json, |h| {
        let mut extra = h["generations"][0].clone();
        extra["generation"]["id"] = 9.into();
        extra["chain_pem"] = mallory.cert_pem.clone().into();
        extra["anchors_pem"] = mallory.root_pem.clone().into();
        h["generations"]
            .as_array_mut()
            .expect("generations")
            .push(extra);
    });
    let seal = Some(genuine_seal.clone());
    #[rustfmt::skip]
    let forgeries: Vec<(&str, Option<Forged>, &'static str)> = vec![
        ("extra root", Some((with_mallory.clone(), seal.clone())), "bad_signature"),
        ("extra root, seal removed", Some((with_mallory, None)), "unsigned"),
        ("skipped window", Some((edit_history(&genuine_json, |h| {
            h["generations"][1]["generation"]["prepared_at"] = "2027-04-01T00:00:00Z".into();
        }), seal.clone())), "bad_signature"),
        ("dropped live root", Some((edit_history(&genuine_json, |h| {
            h["generations"].as_array_mut().expect("generations").remove(0);
        }), seal.clone())), "bad_signature"),
        ("far-future times", Some((edit_history(&genuine_json, |h| {
            h["generations"][1]["generation"]["prepared_at"] = "9999-12-31T00:00:00Z".into();
        }), seal.clone())), "bad_signature"),
        ("replayed older genuine history", Some((older_json, Some(older_seal))), "replayed"),
        // Issue #13's item 2: a ConfigMap without podca's label does not stop podca.
        ("a ConfigMap without podca's label", None, "not_owned"),
        ("a deleted ConfigMap", None, "missing"),
    ];
    for (name, forged, reason) in forgeries {
        match (forged, reason) {
            (Some((history_json, seal)), _) => {
                forge_history(&w.emu, &history_json, seal.as_deref())
            }
            (None, "not_owned") => {
                w.emu.delete_object(Res::ConfigMap, CA_NS, HISTORY);
                w.emu.seed_object(
                    Res::ConfigMap,
                    serde_json::json!({
                        "metadata": { "name": HISTORY, "namespace": CA_NS },
                        "data": { "history.json": genuine_json.clone() },
                    }),
                );
            }
            (None, _) => {
                w.emu.delete_object(Res::ConfigMap, CA_NS, HISTORY);
            }
        }
        let events_before = history_events(&w.emu).len();
        let run = w.start_with(options_with_copy()).await;
        assert_eq!(rejected(&run.metrics, reason), 1, "{name}: not counted");
        assert_eq!(rejected_total(&run.metrics), 1, "{name}: counted once");
        let got = started_state(&w, &run, &[&a, &b]).await;
        assert_eq!(got, genuine, "{name}: not what the genuine history gives");
        assert!(
            !got.3
                .contains(&ders(&mallory.root_pem).into_iter().next().expect("cert"))
        );
        for _ in 0..400 {
            if history_events(&w.emu).len() > events_before {
                break;
            }
            tokio::time::sleep(StdDuration::from_millis(25)).await;
        }
        assert_eq!(
            history_events(&w.emu).len(),
            events_before + 1,
            "{name}: no Warning Event"
        );
        if reason == "not_owned" {
            // Never overwritten: it stays someone else's, and podca keeps running.
            tokio::time::sleep(StdDuration::from_millis(300)).await;
            let cm = w
                .emu
                .get_object(Res::ConfigMap, CA_NS, HISTORY)
                .expect("kept");
            assert!(
                cm["metadata"]["labels"]["app.kubernetes.io/managed-by"].is_null(),
                "{cm}"
            );
            assert!(cm["data"]["history.seal"].is_null(), "{cm}");
            assert!(!run.controller.is_finished() && !run.driver_task.is_finished());
        } else {
            // The leader writes the genuine history back.
            let restored =
                wait_history(&w.emu, |h| h.generations == genuine_history.generations).await;
            assert_eq!(
                phases(&restored),
                [Phase::Active, Phase::Prepared],
                "{name}"
            );
            wait_copy_current(&w.emu).await;
        }
        run.stop().await;
    }

    // After the window B signs, and the old anchor goes when it would have.
    let run = w.start_with(options_with_copy()).await;
    let activated = changed + Duration::seconds(WINDOW + 1);
    w.set_time(activated);
    let leaf = w.obtain().await;
    assert_signed_by(&leaf, &b, &[&a, &mallory], activated);
    run.stop().await;
    let counters = w.emu.counters();
    assert_eq!(
        (counters.validation_rejections, counters.forbidden),
        (0, 0),
        "the emulator refused a request: {:?}",
        counters.rejections_by_cause
    );
}

/// `podca ca show --secret` with the Secret backend's kubeconfig (it may read the Secret and the
/// history ConfigMap).
fn ca_show(w: &World, extra: &[&str]) -> std::process::Output {
    let secret = format!("{CA_NS}/{SECRET}");
    let mut args = vec![
        "ca",
        "show",
        "--secret",
        secret.as_str(),
        "--kubeconfig",
        w.ca_kubeconfig.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    std::process::Command::new(podca_tests::process::podca_binary())
        .args(&args)
        .output()
        .expect("run podca")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_show_secret_says_whether_the_seal_verifies_and_check_fails_when_not() {
    // The command reads the real clock: the history is written at the real time, by a CA valid
    // around it.
    let w = World::new().await;
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("valid");
    w.set_time(now);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = ca_params("podca secret CA A", None);
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(30);
    let cert = params.self_signed(&key).expect("root");
    let a = TestCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        root_pem: cert.pem(),
    };
    w.put_secret(&a, false);
    let run = w.start().await;
    wait_history(&w.emu, |h| phases(h) == [Phase::Active]).await;
    let (genuine_json, genuine_seal) = stored_history(&w.emu);
    run.stop().await;
    let sequence =
        serde_json::from_str::<serde_json::Value>(genuine_seal.as_deref().expect("sealed"))
            .expect("seal JSON")["sequence"]
            .as_u64()
            .expect("a sequence");

    let out = ca_show(&w, &["--check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "\nhistory seal: valid (sequence {sequence}, sealed by CN=podca secret CA A)\n"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("generation 1 — active"), "{stdout}");

    let dropped = edit_history(&genuine_json, |h| {
        h["generations"]
            .as_array_mut()
            .expect("generations")
            .clear();
    });
    #[rustfmt::skip]
    let rows: [(&str, Option<&str>, &str, &str); 2] = [
        ("bad_signature", genuine_seal.as_deref(),
            "NOT VALID (bad_signature): the seal's signature does not verify over this history",
            "the seal's signature does not verify over this history"),
        ("unsigned", None, "NOT VALID (unsigned): history.json carries no seal",
            "history.json carries no seal"),
    ];
    for (reason, seal, line, error) in rows {
        forge_history(&w.emu, &dropped, seal);
        // Informational without --check: exit 0, the verdict on stdout.
        let out = ca_show(&w, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{reason}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("history seal: {line}")),
            "{reason}: {stdout}"
        );
        let out = ca_show(&w, &["--check"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{reason}: {stderr}");
        assert!(
            stderr.starts_with(&format!("podca: ConfigMap {CA_NS}/{HISTORY}: {error}")),
            "{reason}: {stderr}"
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(line),
            "{reason}: printed first"
        );
    }
    // The seal is checked against the Secret's certificates: one that cannot be read is said.
    forge_history(&w.emu, &genuine_json, genuine_seal.as_deref());
    w.emu.delete_object(Res::Secret, CA_NS, SECRET);
    let out = ca_show(&w, &["--check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "history seal: not verified: Secret {CA_NS}/{SECRET} not found\n"
        )),
        "{stdout}"
    );
}
