//! A full CA rotation under continuous mTLS, in simulated time, against the API emulator.
//!
//! One clock drives everything: the rotation driver (prepare → activate → retire → drop), the
//! PCR controller (notBefore, beginRefreshAt), the emulator (creation times, its status-write
//! time checks) and the TLS stacks (certificate validity). Two simulated pods run as kubelet
//! does: each holds a credential from a PodCertificateRequest and files a new one at
//! beginRefreshAt; each sees the signer's ClusterTrustBundles through a cache that is refreshed
//! only every five minutes (kubelet's bundle cache), the two caches out of phase. Every simulated
//! second the pods handshake both ways (real rustls mTLS, each side verifying the peer against
//! its cached bundle). From before the next CA is prepared until the old one is dropped, not one
//! handshake may fail.

#[path = "support/rotating_ca.rs"]
mod rotating_ca;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use podca_authority::CaHandle;
use podca_authority::metrics::Metrics;
use podca_authority::rotation::{Rotator, file_opener, load};
use podca_controller::Options;
use podca_controller::publisher::PublisherOptions;
use podca_signer::rotation::{Phase, Schedule, Step};
use podca_signer::{FileStore, InitOptions, SignerPolicy};
use podca_tests::EmulatorConfig;
use podca_tests::client::KubeClient;
use podca_tests::cluster::{Cluster, ClusterConfig, add_pod};
use podca_tests::emulator::ClockMode;
use podca_tests::kubelet::{
    Credential, KeyType, KubeletSim, Outcome, PodRef, RequestOptions, trust_anchors_for_signer,
};
use podca_tests::sim::{SimClock, provider};
use rotating_ca::Lifetimes;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use time::{Duration, OffsetDateTime, macros::datetime};
use tokio::sync::oneshot;

const SIGNER: &str = "example.com/mesh";
const NS: &str = "shop";
const T0: OffsetDateTime = datetime!(2027-03-01 00:00 UTC);
/// CA lifetime 6 h: the next CA is prepared at half of it and activated as soon as the schedule
/// allows — exactly one propagation window (15 min) later — so the test leaves the pods' bundle
/// caches no slack beyond what podca promises. The old anchor is dropped an hour (the leaf
/// lifetime) after that.
const CA_LIFETIME: i64 = 6 * 3600;
const PROPAGATION: i64 = 15 * 60;
const LEAF_LIFETIME: i64 = 3600;
const LIFETIMES: Lifetimes = Lifetimes {
    ca_lifetime: CA_LIFETIME,
    propagation: PROPAGATION,
    leaf_lifetime: LEAF_LIFETIME,
};
/// kubelet's trust-bundle cache.
const BUNDLE_CACHE: i64 = 300;

/// A pod as kubelet keeps it: its credential and its cached view of the trust bundle.
struct Pod {
    name: &'static str,
    dns: String,
    pod: PodRef,
    credential: Credential,
    bundle: String,
    bundle_fetched: OffsetDateTime,
    /// The first second at which this pod's cache refreshes (offsets the two pods' caches).
    cache_phase: i64,
    refreshes: usize,
}

fn ders(pem_text: &str) -> Vec<CertificateDer<'static>> {
    pem::parse_many(pem_text)
        .expect("PEM")
        .into_iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| CertificateDer::from(b.into_contents()))
        .collect()
}

fn roots(pem_text: &str) -> Arc<rustls::RootCertStore> {
    let mut store = rustls::RootCertStore::empty();
    for d in ders(pem_text) {
        store.add(d).expect("anchor");
    }
    Arc::new(store)
}

fn key_der(credential: &Credential) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(credential.key.pkcs8_der().to_vec().into())
}

/// One mutual-TLS handshake in memory, at the simulated time: `client` connects to `server`'s
/// DNS name; each verifies the other against its own cached bundle.
fn handshake(clock: &SimClock, client: &Pod, server: &Pod) -> Result<(), String> {
    let time: Arc<dyn rustls::time_provider::TimeProvider> = Arc::new(clock.clone());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots(&server.bundle),
        provider(),
    )
    .build()
    .map_err(|e| format!("server verifier: {e}"))?;
    let server_config = rustls::ServerConfig::builder_with_details(provider(), Arc::clone(&time))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            ders(&server.credential.chain_pem),
            key_der(&server.credential),
        )
        .map_err(|e| format!("server config: {e}"))?;
    let client_config = rustls::ClientConfig::builder_with_details(provider(), time)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(&client.bundle))
        .with_client_auth_cert(
            ders(&client.credential.chain_pem),
            key_der(&client.credential),
        )
        .map_err(|e| format!("client config: {e}"))?;
    let name = ServerName::try_from(server.dns.clone()).map_err(|e| e.to_string())?;
    let mut c =
        rustls::ClientConnection::new(Arc::new(client_config), name).map_err(|e| e.to_string())?;
    let mut s =
        rustls::ServerConnection::new(Arc::new(server_config)).map_err(|e| e.to_string())?;
    podca_tests::tls::handshake_in_memory(&mut c, &mut s)?;
    // Both sides authenticated the peer with a certificate.
    if s.peer_certificates().is_none_or(|c| c.is_empty()) {
        return Err("the server saw no client certificate".into());
    }
    Ok(())
}

async fn obtain(kubelet: &KubeletSim, pod: &PodRef) -> Credential {
    obtain_from(kubelet, pod, SIGNER).await
}

async fn obtain_from(kubelet: &KubeletSim, pod: &PodRef, signer: &str) -> Credential {
    let mut opts = RequestOptions::new(signer, KeyType::EcdsaP256);
    opts.max_expiration_seconds = Some(LEAF_LIFETIME);
    match kubelet
        .obtain(pod, &opts, StdDuration::from_secs(20))
        .await
        .expect("the PCR is answered")
    {
        Outcome::Issued(c) => *c,
        other => panic!("PCR not issued: {other:?}"),
    }
}

/// Waits (real time) until the CTBs in the emulator carry exactly `want` (as a set of DER).
async fn wait_published(admin: &KubeClient, version: &str, want: &str) {
    wait_published_for(admin, version, SIGNER, want).await;
}

/// [`wait_published`] for the bundles of `signer`.
async fn wait_published_for(admin: &KubeClient, version: &str, signer: &str, want: &str) {
    let want: std::collections::BTreeSet<_> = ders(want).into_iter().map(|d| d.to_vec()).collect();
    for _ in 0..400 {
        let got = trust_anchors_for_signer(admin, version, signer)
            .await
            .expect("CTB list");
        let got: std::collections::BTreeSet<_> =
            ders(&got).into_iter().map(|d| d.to_vec()).collect();
        if got == want {
            return;
        }
        tokio::time::sleep(StdDuration::from_millis(25)).await;
    }
    panic!("the ClusterTrustBundle did not follow the CA handle within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_rotation_under_continuous_mtls() {
    provider();
    let sim = SimClock::at(T0);
    let Cluster {
        emu,
        admin,
        dir,
        kubeconfig,
    } = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            bookmark_interval: StdDuration::from_millis(200),
            ..Default::default()
        },
        signers: &[SIGNER],
        ..Default::default()
    })
    .await;
    emu.set_clock(ClockMode::Fixed(T0));
    let version = "v1beta1";
    emu.add_namespace(NS);
    let node_uid = emu.add_node("node-1");
    let node_token = emu.add_node_identity("node-1");
    let kubelet = KubeletSim::new(emu.base_url(), &node_token, version);
    let pods: Vec<_> = [("frontend-0", "frontend"), ("backend-0", "backend")]
        .into_iter()
        .map(|(name, sa)| {
            let pod = add_pod(
                &emu,
                NS,
                name,
                sa,
                ("node-1", &node_uid),
                &[(SIGNER, KeyType::EcdsaP256)],
            );
            (name, pod)
        })
        .collect();

    // The CA: a file store, rotated by the driver on a 6-hour schedule.
    let metrics = Arc::new(Metrics::new());
    let (store, handle, rotator) = rotating_ca::start(
        &dir.path().join("ca"),
        LIFETIMES,
        T0,
        sim.clock(),
        Arc::clone(&metrics),
        |_| {},
    );

    // The controller and publisher, on the simulated clock.
    let mut policy = SignerPolicy::permissive("cluster.local");
    policy.dns_name_templates = vec!["{sa}.{ns}.svc".into()];
    policy.default_lifetime_seconds = LEAF_LIFETIME as u32;
    policy.max_lifetime_seconds = LEAF_LIFETIME as u32;
    let mut options = Options::new(
        BTreeMap::from([(SIGNER.to_string(), policy)]),
        handle.clone(),
    );
    options.clock = sim.clock();
    options.metrics = Arc::clone(&metrics);
    options.publisher = Some(PublisherOptions::default());
    let client = podca_controller::connect(Some(&kubeconfig))
        .await
        .expect("client");
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(podca_controller::run(client, options, async move {
        let _ = stopped.await;
    }));
    wait_published(&admin, version, &handle.current().anchors_pem).await;

    // Both pods start with a credential and a fresh bundle.
    let mut state = Vec::new();
    for (i, (name, pod)) in pods.into_iter().enumerate() {
        let credential = obtain(&kubelet, &pod).await;
        let bundle = trust_anchors_for_signer(&admin, version, SIGNER)
            .await
            .expect("CTB");
        state.push(Pod {
            name,
            dns: format!("{}.{NS}.svc", pod.service_account),
            pod,
            credential,
            bundle,
            bundle_fetched: T0,
            cache_phase: i as i64 * (BUNDLE_CACHE / 2),
            refreshes: 0,
        });
    }

    // Simulate 4 h 30 min, one second at a time: prepare at ~3 h, activate ~15 min later, drop
    // the old anchor an hour after that.
    let mut failures: Vec<String> = Vec::new();
    let mut handshakes = 0u64;
    let mut steps_seen: Vec<(i64, Step)> = Vec::new();
    let end = T0 + Duration::minutes(270);
    let mut now = T0;
    while now < end {
        now += Duration::SECOND;
        sim.set(now);
        emu.set_clock(ClockMode::Fixed(now));

        let tick = rotator.tick().expect("rotation tick");
        for step in &tick.steps {
            steps_seen.push(((now - T0).whole_seconds(), *step));
        }
        if tick.swapped {
            wait_published(&admin, version, &handle.current().anchors_pem).await;
        }
        for p in &mut state {
            let since = (now - T0).whole_seconds() - p.cache_phase;
            if since >= 0 && since % BUNDLE_CACHE == 0 {
                p.bundle = trust_anchors_for_signer(&admin, version, SIGNER)
                    .await
                    .expect("CTB");
                p.bundle_fetched = now;
            }
            if p.credential.refresh_due(now) {
                p.credential = obtain(&kubelet, &p.pod).await;
                p.refreshes += 1;
            }
        }
        for (c, s) in [(0, 1), (1, 0)] {
            handshakes += 1;
            if let Err(e) = handshake(&sim, &state[c], &state[s]) {
                failures.push(format!(
                    "t+{}s {} → {}: {e} (client bundle from t+{}s, server bundle from t+{}s)",
                    (now - T0).whole_seconds(),
                    state[c].name,
                    state[s].name,
                    (state[c].bundle_fetched - T0).whole_seconds(),
                    (state[s].bundle_fetched - T0).whole_seconds(),
                ));
            }
        }
    }
    let _ = stop.send(());
    let _ = tokio::time::timeout(StdDuration::from_secs(20), controller).await;

    // The rotation happened, in order, with exactly the overlap the schedule promises.
    let first = |want: fn(&Step) -> bool| {
        steps_seen
            .iter()
            .find(|(_, s)| want(s))
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("missing step; steps: {steps_seen:?}"))
    };
    let prepared = first(|s| *s == Step::Prepare);
    let activated = first(|s| *s == Step::Activate(2));
    let retired = first(|s| *s == Step::Retire(1));
    let dropped = first(|s| *s == Step::Drop(1));
    assert!(
        prepared < activated && activated == retired && retired < dropped,
        "{steps_seen:?}"
    );
    assert!(
        (PROPAGATION..PROPAGATION + 5).contains(&(activated - prepared)),
        "{steps_seen:?}"
    );
    assert!(dropped - retired >= LEAF_LIFETIME, "{steps_seen:?}");
    let generations = store.generations().expect("generations");
    let phases: Vec<Phase> = generations.iter().map(|g| g.generation.phase).collect();
    assert_eq!(phases, [Phase::Dropped, Phase::Active], "{phases:?}");
    // The pods now hold certificates of the new CA and trust only its anchor.
    let new_root = &generations[1].roots[0];
    for p in &state {
        p.credential
            .verify_chain(&new_root.pem(), now)
            .unwrap_or_else(|e| panic!("{} holds no certificate of the new CA: {e}", p.name));
        assert!(
            p.refreshes >= 6,
            "{} refreshed {} times",
            p.name,
            p.refreshes
        );
    }
    // The old anchor is gone from the published bundle; the new one is there.
    let published = trust_anchors_for_signer(&admin, version, SIGNER)
        .await
        .expect("CTB");
    let published: Vec<Vec<u8>> = ders(&published).into_iter().map(|d| d.to_vec()).collect();
    assert!(published.contains(&new_root.der().to_vec()));
    assert!(!published.contains(&generations[0].roots[0].der().to_vec()));
    let counters = emu.counters();
    assert_eq!(
        (counters.validation_rejections, counters.forbidden),
        (0, 0),
        "the emulator refused a write: {:?}",
        counters.rejections_by_cause
    );
    // Created, then the next anchor added, then the old one removed.
    assert!(counters.ctb_writes_accepted >= 3, "{counters:?}");
    assert!(handshakes > 30_000, "{handshakes} handshakes");
    assert!(
        failures.is_empty(),
        "{} of {handshakes} handshakes failed; first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

const PAYMENTS: &str = "example.com/payments";
const BATCH: &str = "example.com/batch";

/// A policy issuing one-hour leaves with a DNS name the peers verify, in `trust_domain`.
fn hour_policy(trust_domain: &str) -> SignerPolicy {
    let mut policy = SignerPolicy::permissive(trust_domain);
    policy.dns_name_templates = vec!["{sa}.{ns}.svc".into()];
    policy.default_lifetime_seconds = LEAF_LIFETIME as u32;
    policy.max_lifetime_seconds = LEAF_LIFETIME as u32;
    policy
}

/// The PCR controller and publisher for both signers, signing with `cas`, on the simulated
/// clock; stopped by the returned sender.
async fn start_controller(
    kubeconfig: &std::path::Path,
    cas: podca_authority::CaSet,
    sim: &SimClock,
    metrics: &Arc<Metrics>,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), podca_controller::Error>>,
) {
    let signers = BTreeMap::from([
        (PAYMENTS.to_string(), hour_policy("payments.test")),
        (BATCH.to_string(), hour_policy("batch.test")),
    ]);
    let mut options = Options::new(signers, cas);
    options.clock = sim.clock();
    options.metrics = Arc::clone(metrics);
    options.publisher = Some(PublisherOptions::default());
    let client = podca_controller::connect(Some(kubeconfig))
        .await
        .expect("client");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(podca_controller::run(client, options, async move {
        let _ = stopped.await;
    }));
    (stop, task)
}

/// Issue #39: moving from one CA shared by two signers to a CA per signer is a rotation. The
/// payments signer gets a CA split off the shared one (`[cas.payments] split_from`, what podca
/// does at start): a copy that signs as before, with a new key whose anchor is published at
/// once and signs after the propagation window; the shared anchor leaves payments' bundles
/// once the last certificate it signed has expired. Pods of each signer handshake (real rustls
/// mTLS, bundles cached five minutes) every simulated second throughout: not one fails, and at
/// the end each signer's bundle holds only its own CA's anchors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_to_a_ca_per_signer_under_continuous_mtls() {
    provider();
    let sim = SimClock::at(T0);
    let Cluster {
        emu,
        admin,
        dir,
        kubeconfig,
    } = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            bookmark_interval: StdDuration::from_millis(200),
            ..Default::default()
        },
        signers: &[PAYMENTS, BATCH],
        ..Default::default()
    })
    .await;
    emu.set_clock(ClockMode::Fixed(T0));
    let version = "v1beta1";
    emu.add_namespace(NS);
    let node_uid = emu.add_node("node-1");
    let node_token = emu.add_node_identity("node-1");
    let kubelet = KubeletSim::new(emu.base_url(), &node_token, version);

    // The shared CA: long-lived, so only the split rotates during the test.
    let schedule = Schedule {
        ca_lifetime_seconds: 30 * 86_400,
        propagation_seconds: PROPAGATION,
        ..Schedule::default()
    };
    let shared = FileStore::new(dir.path().join("shared"));
    shared
        .init(&InitOptions::default(), T0)
        .expect("the shared CA");
    let shared_roots = shared.roots().expect("roots");
    let rotator = |name: &str, store: &FileStore, handle: &CaHandle, metrics: &Arc<Metrics>| {
        rotating_ca::rotator(
            name,
            store,
            handle,
            schedule,
            LEAF_LIFETIME,
            sim.clock(),
            Arc::clone(metrics),
        )
    };
    let (ca, anchors) = load(&shared, &file_opener()).expect("CA loads");
    let shared_handle = CaHandle::new(ca, anchors);
    let metrics = Arc::new(Metrics::new());
    let shared_rotator = rotator("default", &shared, &shared_handle, &metrics);

    // Before: both signers sign with the shared CA.
    let (stop, controller) =
        start_controller(&kubeconfig, shared_handle.clone().into(), &sim, &metrics).await;
    for signer in [PAYMENTS, BATCH] {
        wait_published_for(
            &admin,
            version,
            signer,
            &shared_handle.current().anchors_pem,
        )
        .await;
    }
    let mut pods = Vec::new();
    for (i, (name, sa, signer)) in [
        ("pay-0", "pay-a", PAYMENTS),
        ("pay-1", "pay-b", PAYMENTS),
        ("batch-0", "batch-a", BATCH),
        ("batch-1", "batch-b", BATCH),
    ]
    .into_iter()
    .enumerate()
    {
        let pod = add_pod(
            &emu,
            NS,
            name,
            sa,
            ("node-1", &node_uid),
            &[(signer, KeyType::EcdsaP256)],
        );
        let credential = obtain_from(&kubelet, &pod, signer).await;
        let bundle = trust_anchors_for_signer(&admin, version, signer)
            .await
            .expect("CTB");
        pods.push((
            signer,
            Pod {
                name,
                dns: format!("{sa}.{NS}.svc"),
                pod,
                credential,
                bundle,
                bundle_fetched: T0,
                cache_phase: i as i64 * (BUNDLE_CACHE / 4),
                refreshes: 0,
            },
        ));
    }

    let mut failures: Vec<String> = Vec::new();
    let mut handshakes = 0u64;
    let split_at = T0 + Duration::minutes(10);
    let end = split_at + Duration::seconds(PROPAGATION + LEAF_LIFETIME) + Duration::minutes(20);
    let mut now = T0;
    let mut after: Option<(FileStore, CaHandle, Rotator)> = None;
    let mut controller = Some((stop, controller));
    let mut steps_seen: Vec<(i64, Step)> = Vec::new();
    while now < end {
        now += Duration::SECOND;
        sim.set(now);
        emu.set_clock(ClockMode::Fixed(now));
        if now == split_at {
            // podca restarts with `[cas.payments] split_from = "default"` and payments'
            // `ca = "payments"`: at start it splits the CA off, then signs per signer.
            if let Some((stop, task)) = controller.take() {
                let _ = stop.send(());
                let _ = tokio::time::timeout(StdDuration::from_secs(20), task).await;
            }
            let store = FileStore::new(dir.path().join("payments"));
            let steps = store
                .split_from(
                    &shared,
                    "payments",
                    &schedule,
                    Duration::seconds(LEAF_LIFETIME),
                    now,
                )
                .expect("the split");
            assert_eq!(steps, [Step::Prepare]);
            let (ca, anchors) = load(&store, &file_opener()).expect("the split CA loads");
            let handle = CaHandle::new(ca, anchors);
            let cas = podca_authority::CaSet::new(
                BTreeMap::from([
                    ("default".to_string(), shared_handle.clone()),
                    ("payments".to_string(), handle.clone()),
                ]),
                BTreeMap::from([
                    (PAYMENTS.to_string(), "payments".to_string()),
                    (BATCH.to_string(), "default".to_string()),
                ]),
            )
            .expect("the CA set");
            controller = Some(start_controller(&kubeconfig, cas, &sim, &metrics).await);
            wait_published_for(&admin, version, PAYMENTS, &handle.current().anchors_pem).await;
            let driver = rotator("payments", &store, &handle, &metrics);
            after = Some((store, handle, driver));
        }
        if shared_rotator.tick().expect("rotation tick").swapped {
            wait_published_for(&admin, version, BATCH, &shared_handle.current().anchors_pem).await;
        }
        if let Some((_, handle, driver)) = &after {
            let tick = driver.tick().expect("rotation tick");
            for step in &tick.steps {
                steps_seen.push(((now - split_at).whole_seconds(), *step));
            }
            if tick.swapped {
                wait_published_for(&admin, version, PAYMENTS, &handle.current().anchors_pem).await;
            }
        }
        for (signer, p) in &mut pods {
            let since = (now - T0).whole_seconds() - p.cache_phase;
            if since >= 0 && since % BUNDLE_CACHE == 0 {
                p.bundle = trust_anchors_for_signer(&admin, version, signer)
                    .await
                    .expect("CTB");
                p.bundle_fetched = now;
            }
            if p.credential.refresh_due(now) {
                p.credential = obtain_from(&kubelet, &p.pod, signer).await;
                p.refreshes += 1;
            }
        }
        for (c, s) in [(0, 1), (1, 0), (2, 3), (3, 2)] {
            handshakes += 1;
            let (client, server) = (&pods[c].1, &pods[s].1);
            if let Err(e) = handshake(&sim, client, server) {
                failures.push(format!(
                    "t+{}s {} → {}: {e} (client bundle from t+{}s, server bundle from t+{}s)",
                    (now - T0).whole_seconds(),
                    client.name,
                    server.name,
                    (client.bundle_fetched - T0).whole_seconds(),
                    (server.bundle_fetched - T0).whole_seconds(),
                ));
            }
        }
    }
    if let Some((stop, task)) = controller.take() {
        let _ = stop.send(());
        let _ = tokio::time::timeout(StdDuration::from_secs(20), task).await;
    }
    let (payments, _, _) = after.expect("the split happened");

    // The split CA's own key took over after the window; the shared generation left once its
    // last leaf could no longer live.
    assert_eq!(
        steps_seen.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        [Step::Activate(2), Step::Retire(1), Step::Drop(1)],
        "{steps_seen:?}"
    );
    assert!(
        (PROPAGATION..PROPAGATION + 5).contains(&steps_seen[0].0),
        "{steps_seen:?}"
    );
    assert!(
        steps_seen[2].0 - steps_seen[1].0 >= LEAF_LIFETIME,
        "{steps_seen:?}"
    );
    // Each signer's bundle now holds exactly its own CA's anchors.
    let own_roots = payments.roots().expect("roots");
    let pem = |certs: &[podca_signer::CaCertificate]| {
        certs
            .iter()
            .map(podca_signer::CaCertificate::pem)
            .collect::<String>()
    };
    let published_payments = trust_anchors_for_signer(&admin, version, PAYMENTS)
        .await
        .expect("CTB");
    let published_batch = trust_anchors_for_signer(&admin, version, BATCH)
        .await
        .expect("CTB");
    assert_eq!(published_payments, pem(&own_roots));
    assert_eq!(published_batch, pem(&shared_roots));
    assert_eq!(own_roots.len(), 1);
    assert!(!shared_roots.contains(&own_roots[0]));
    // And the pods' certificates are apart: each verifies only under its own signer's bundle.
    for (signer, p) in &pods {
        let (own, foreign) = match *signer {
            PAYMENTS => (&published_payments, &published_batch),
            _ => (&published_batch, &published_payments),
        };
        podca_tests::verify::assert_verifies_only_under_at(
            &p.credential.chain_pem,
            own,
            foreign,
            Some(now.unix_timestamp()),
        );
    }
    let counters = emu.counters();
    assert_eq!(
        (counters.validation_rejections, counters.forbidden),
        (0, 0),
        "the emulator refused a write: {:?}",
        counters.rejections_by_cause
    );
    assert!(handshakes > 20_000, "{handshakes} handshakes");
    assert!(
        failures.is_empty(),
        "{} of {handshakes} handshakes failed; first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
