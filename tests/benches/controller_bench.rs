//! Controller throughput and latency against the in-process API emulator.
//!
//! By default the controller is the real `podca serve` binary (release build, its own process, so
//! its peak RSS is its own); `PODCA_BENCH_IN_PROCESS=1` runs `podca_controller::run` inside the
//! bench process instead (for profiling; the RSS then includes the emulator).
//!
//! `cargo bench -p podca-tests --bench controller_bench -- burst [count]`
//!   files `count` (default 10,000) PCRs at once, reports the time until all are Issued (PCR/s)
//!   and the controller's peak RSS. Then, podca stopped, the emulator's ceiling in the same run:
//!   `count` more PCRs settled by the bench itself with raw `/status` PATCHes of pre-built
//!   certificate chains, at the same concurrency as podca's workers (`PODCA_BENCH_WORKERS`,
//!   default 32), and podca's rate as a share of it.
//!   `PODCA_EMULATOR_LATENCY=real-apiserver` (or any spec of `podca_tests::emulator::latency`)
//!   gives the emulator the real server's service times and concurrency.
//!   `PODCA_BENCH_LEDGER=postgres` records into a throwaway PostgreSQL server (tests/src/postgres.rs)
//!   instead of the default redb file; `none` records nothing durable.
//! `cargo bench -p podca-tests --bench controller_bench -- rate [per_second] [seconds]`
//!   offers PCRs at a steady rate (default 1,000/s for 30 s) and reports p50/p99/max
//!   creation-to-Issued latency, observed through a watch.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use podca_signer::{
    CaAlgorithm, CertificateRequest, IssuingCa, MemoryKey, Outcome, SignerPolicy, SubjectKey,
    sign_request,
};
use podca_tests::client::KubeClient;
use podca_tests::cluster::{Cluster, ClusterConfig, PODCA_IDENTITY};
use podca_tests::emulator::{ApiMode, LatencyModel, Res};
use podca_tests::process::{free_port, http_get, podca_binary_release};
use podca_tests::{Emulator, EmulatorConfig};
use rcgen::{CertificateParams, DistinguishedName, KeyPair};
use serde_json::json;

const SIGNER: &str = "example.com/workload";

fn main() {
    podca_tests::sim::install_crypto();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mode = args.first().map(String::as_str).unwrap_or("burst");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match mode {
        "burst" => {
            let count = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
            runtime.block_on(burst(count));
        }
        "rate" => {
            let per_second = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1_000);
            let seconds = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(30);
            runtime.block_on(rate(per_second, seconds));
        }
        other => panic!("unknown mode {other:?}: burst [count] | rate [per_second] [seconds]"),
    }
}

/// The controller under test: a `podca serve` process, or a task in this process.
enum Controller {
    /// The process, and the PostgreSQL server its ledger is in (if it is).
    Process(std::process::Child, Option<podca_tests::postgres::Postgres>),
    Task(tokio::sync::oneshot::Sender<()>),
}

impl Controller {
    /// Peak RSS of the controller (KiB): the serve process's, or this whole process's.
    fn peak_rss_kib(&self) -> u64 {
        match self {
            Controller::Process(child, _) => peak_rss_of(&format!("/proc/{}/status", child.id())),
            Controller::Task(_) => peak_rss_of("/proc/self/status"),
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Controller::Process(..) => "podca serve process",
            Controller::Task(_) => "bench process: emulator + controller",
        }
    }

    fn stop(self) {
        match self {
            Controller::Process(mut child, pg) => {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                let _ = child.wait();
                if let Some(pg) = &pg {
                    let recorded = pg.psql("select count(*) from podca_ledger");
                    // Each PCR's serial once: a record per certificate a PCR status shows
                    // (more only if a certificate was recorded but its status write lost).
                    let serials = pg.psql(
                        "select count(distinct serial) from podca_ledger \
                         where source = 'pcr' and outcome = 'issued'",
                    );
                    println!(
                        "ledger: {recorded} records in PostgreSQL, {serials} distinct issued \
                         PCR serials"
                    );
                }
            }
            Controller::Task(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

fn workers() -> usize {
    std::env::var("PODCA_BENCH_WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(32)
}

async fn setup() -> (Emulator, tempfile::TempDir, Controller) {
    // PODCA_EMULATOR_LATENCY=real-apiserver: the emulator answers as the real server's figures.
    let latency = LatencyModel::from_env().unwrap_or_else(|e| panic!("{e}"));
    println!("emulator latency model: {latency}");
    let Cluster {
        emu,
        dir,
        kubeconfig,
        ..
    } = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            latency,
            ..Default::default()
        },
        podca_groups: &["system:authenticated"],
        signers: &[SIGNER],
    })
    .await;
    emu.add_namespace("bench");
    if std::env::var_os("PODCA_BENCH_IN_PROCESS").is_none() {
        let controller = start_serve(&emu, dir.path(), &kubeconfig).await;
        return (emu, dir, controller);
    }
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("key");
    let ca = IssuingCa::self_signed_root(
        Arc::new(key),
        "bench CA",
        time::OffsetDateTime::now_utc(),
        time::Duration::days(30),
    )
    .expect("CA");
    let client = podca_controller::connect(Some(&kubeconfig))
        .await
        .expect("client");
    let mut options = podca_controller::Options::new(
        BTreeMap::from([(
            SIGNER.to_string(),
            SignerPolicy::permissive("cluster.local"),
        )]),
        Arc::new(ca),
    );
    options.workers = workers();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(podca_controller::run(client, options, async move {
        let _ = rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    (emu, dir, Controller::Task(tx))
}

/// `podca ca init` + `podca serve` (release), ready when /readyz answers 200.
async fn start_serve(
    _emu: &Emulator,
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
) -> Controller {
    let bin = podca_binary_release();
    let ca = dir.join("ca");
    let init = std::process::Command::new(&bin)
        .args(["ca", "init", "--dir"])
        .arg(&ca)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("podca ca init");
    assert!(init.success());
    let config = dir.join("podca.toml");
    let (ledger, pg) = bench_ledger(dir);
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n{ledger}",
            ca.display().to_string()
        ),
    )
    .expect("config");
    let admin = free_port();
    let child = std::process::Command::new(&bin)
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--admin-listen", &format!("127.0.0.1:{admin}"), "--no-grpc"])
        .args(["--workers", &workers().to_string()])
        .env("PODCA_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("podca serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(admin, "/readyz").map(|(c, _)| c) != Some(200) {
        assert!(Instant::now() < deadline, "podca serve never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Controller::Process(child, pg)
}

/// The `[ledger]` table `PODCA_BENCH_LEDGER` asks for (redb by default), and the PostgreSQL
/// server it names.
fn bench_ledger(dir: &std::path::Path) -> (String, Option<podca_tests::postgres::Postgres>) {
    match std::env::var("PODCA_BENCH_LEDGER").as_deref() {
        Ok("postgres") => {
            let pg = podca_tests::postgres::Postgres::start();
            let url = dir.join("ledger-url");
            std::fs::write(&url, pg.unix_url()).expect("url file");
            println!("ledger: PostgreSQL (Unix socket)");
            (
                format!(
                    "[ledger]\nbackend = \"postgres\"\nurl_file = {:?}\ntls = \"disable\"\n",
                    url.display().to_string()
                ),
                Some(pg),
            )
        }
        Ok("none") => ("[ledger]\nbackend = \"none\"\n".into(), None),
        _ => {
            println!("ledger: redb (the CA data directory)");
            (String::new(), None)
        }
    }
}

/// A subject key's stub CSR, as DER and as the base64 of `spec.stubPKCS10Request`.
struct Stub {
    der: Vec<u8>,
    csr: String,
}

fn stubs() -> Vec<Stub> {
    (0..16)
        .map(|_| {
            let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
            let mut p = CertificateParams::default();
            p.distinguished_name = DistinguishedName::new();
            let der = p.serialize_request(&key).expect("csr").der().to_vec();
            let csr = base64::engine::general_purpose::STANDARD.encode(&der);
            Stub { der, csr }
        })
        .collect()
}

fn pcr(name: &str, csr: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {
            "signerName": SIGNER, "podName": format!("pod-{name}"),
            "podUID": podca_tests::emulator::new_uid(),
            "serviceAccountName": "app", "serviceAccountUID": "sa-uid",
            "nodeName": "node-1", "nodeUID": "node-uid", "maxExpirationSeconds": 86400,
            "stubPKCS10Request": csr,
        },
        "status": {},
    })
}

fn peak_rss_of(status: &str) -> u64 {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

async fn burst(count: usize) {
    let (emu, _dir, controller) = setup().await;
    let stubs = stubs();
    let csrs: Vec<&str> = stubs.iter().map(|s| s.csr.as_str()).collect();
    let rss_before = controller.peak_rss_kib();
    let start = Instant::now();
    for i in 0..count {
        emu.seed_object(Res::Pcr, pcr(&format!("b-{i}"), csrs[i % csrs.len()]));
    }
    let filed = start.elapsed();
    loop {
        let c = emu.counters();
        if c.issued as usize >= count {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "stuck at {}",
            c.issued
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = start.elapsed();
    let c = emu.counters();
    let podca_rate = count as f64 / took.as_secs_f64();
    println!(
        "burst: {count} PCRs filed in {filed:.2?}, all Issued after {took:.2?} => {podca_rate:.0} PCR/s; \
         validation rejections {}; peak RSS ({}) {} MiB (before filing {} MiB)",
        c.validation_rejections,
        controller.what(),
        controller.peak_rss_kib() / 1024,
        rss_before / 1024,
    );
    if std::env::var("PODCA_BENCH_LEDGER").as_deref() == Ok("postgres") {
        // Issue #14's performance target for the PostgreSQL ledger.
        let met = count >= 10_000 && took <= Duration::from_secs(5);
        println!(
            "target (PostgreSQL ledger): 10,000 PCRs settled in <= 5 s: {} ({count} in {took:.2?})",
            if met { "met" } else { "NOT met" }
        );
    }
    println!(
        "emulator during podca's burst: {} requests, {} watches opened, {} status writes",
        c.requests,
        c.watches_opened,
        c.status_writes_accepted + c.status_writes_noop,
    );
    controller.stop();

    let ceiling = ceiling(&emu, &stubs, count, workers()).await;
    println!(
        "ceiling: {count} PCRs filed in {:.2?}, all Issued by {} raw /status PATCHes after {:.2?} \
         => {:.0} PCR/s; rejected PATCHes {} (emulator validation rejections {})",
        ceiling.filed,
        ceiling.concurrency,
        ceiling.took,
        ceiling.rate(count),
        ceiling.rejected,
        ceiling.validation_rejections,
    );
    println!(
        "ratio: podca {podca_rate:.0} PCR/s / ceiling {:.0} PCR/s = {:.1} %",
        ceiling.rate(count),
        100.0 * podca_rate / ceiling.rate(count),
    );
}

/// The emulator's own ceiling, measured in the same run once podca is stopped.
struct Ceiling {
    concurrency: usize,
    filed: Duration,
    took: Duration,
    /// PATCHes answered with anything but 200.
    rejected: u64,
    /// The emulator's count of writes its validation rejected during the run.
    validation_rejections: u64,
}

impl Ceiling {
    fn rate(&self, count: usize) -> f64 {
        count as f64 / self.took.as_secs_f64()
    }
}

/// Files `count` more PCRs and settles each with one merge PATCH of `/status` carrying a
/// certificate chain built before the clock starts: what a signer that costs nothing could do.
/// Timed like podca's burst, from the first filing to the last Issued; `concurrency` workers each
/// send on one kept-alive HTTP/1.1 connection (like kube-rs's pool) with podca's identity.
async fn ceiling(emu: &Emulator, stubs: &[Stub], count: usize, concurrency: usize) -> Ceiling {
    let patches = Arc::new(issued_patches(stubs));
    let token = emu.token_for(PODCA_IDENTITY).expect("podca's token");
    let client = KubeClient::new(emu.base_url(), &token);
    let rejections_before = emu.counters().validation_rejections;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rejected = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    for i in 0..count {
        emu.seed_object(
            Res::Pcr,
            pcr(&format!("c-{i}"), &stubs[i % stubs.len()].csr),
        );
    }
    let filed = start.elapsed();
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let mut conn = client.keep_alive();
            let (patches, next, rejected) =
                (Arc::clone(&patches), Arc::clone(&next), Arc::clone(&rejected));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    let path = format!(
                        "/apis/certificates.k8s.io/v1/namespaces/bench/podcertificaterequests/c-{i}/status"
                    );
                    let answer = conn
                        .merge_patch(&path, &patches[i % patches.len()])
                        .await
                        .expect("PATCH /status");
                    if answer.status != 200
                        && rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0
                    {
                        eprintln!(
                            "ceiling: c-{i} rejected: {} {}",
                            answer.status,
                            String::from_utf8_lossy(&answer.body)
                        );
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("ceiling worker");
    }
    let took = start.elapsed();
    Ceiling {
        concurrency,
        filed,
        took,
        rejected: rejected.load(std::sync::atomic::Ordering::Relaxed),
        validation_rejections: emu.counters().validation_rejections - rejections_before,
    }
}

/// One Issued `/status` merge patch per stub key, as podca writes it (chain, notBefore,
/// notAfter, beginRefreshAt, one Issued condition), signed by one issuing CA.
fn issued_patches(stubs: &[Stub]) -> Vec<serde_json::Value> {
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("key");
    let now = time::OffsetDateTime::now_utc();
    let ca =
        IssuingCa::self_signed_root(Arc::new(key), "ceiling CA", now, time::Duration::days(30))
            .expect("CA");
    let policy = SignerPolicy::permissive("cluster.local");
    let rfc3339 = |t: time::OffsetDateTime| {
        t.replace_nanosecond(0)
            .expect("0 is a valid nanosecond")
            .format(&time::format_description::well_known::Rfc3339)
            .expect("a time in 0..=9999")
    };
    stubs
        .iter()
        .map(|stub| {
            let request = CertificateRequest {
                key: SubjectKey::from_stub_csr(&stub.der),
                namespace: "bench".into(),
                service_account: "app".into(),
                pod_name: Some("pod".into()),
                max_expiration: Some(time::Duration::seconds(86400)),
                requested_lifetime: None,
                user_annotations: BTreeMap::new(),
            };
            let Outcome::Issued(cert) = sign_request(&policy, &ca, &request, now) else {
                panic!("the ceiling's certificate is not issued");
            };
            json!({"status": {
                "certificateChain": cert.chain_pem,
                "notBefore": rfc3339(cert.validity.not_before),
                "notAfter": rfc3339(cert.validity.not_after),
                "beginRefreshAt": rfc3339(cert.validity.begin_refresh_at),
                "conditions": [{
                    "type": "Issued", "status": "True", "reason": "Issued",
                    "message": format!("issued {} (serial {})", cert.spiffe_id, cert.serial),
                    "lastTransitionTime": rfc3339(now),
                }],
            }})
        })
        .collect()
}

async fn rate(per_second: u64, seconds: u64) {
    let (emu, _dir, controller) = setup().await;
    let stubs = stubs();
    let csrs: Vec<&str> = stubs.iter().map(|s| s.csr.as_str()).collect();
    let admin = KubeClient::new(emu.base_url(), &emu.admin_token());
    let rv = emu.resource_version();
    let mut watch = admin
        .watch(&format!(
            "/apis/certificates.k8s.io/v1/podcertificaterequests?watch=true&resourceVersion={rv}"
        ))
        .await
        .expect("watch");
    let total = per_second * seconds;
    let created: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Arc::default();
    let filer_created = Arc::clone(&created);
    let filer = async {
        let created = filer_created;
        let emu_seed = move |name: String, csr: &str| {
            created
                .lock()
                .expect("lock")
                .insert(name.clone(), Instant::now());
            pcr(&name, csr)
        };
        let tick = Duration::from_millis(10);
        let per_tick = (per_second / 100).max(1);
        let mut interval = tokio::time::interval(tick);
        let mut i = 0u64;
        while i < total {
            interval.tick().await;
            for _ in 0..per_tick {
                if i >= total {
                    break;
                }
                let object = emu_seed(format!("r-{i}"), csrs[(i as usize) % csrs.len()]);
                emu.seed_object(Res::Pcr, object);
                i += 1;
            }
        }
    };
    let mut latencies = Vec::with_capacity(total as usize);
    let watcher = async {
        while (latencies.len() as u64) < total {
            let Ok(Some(ev)) = watch.next_event(Duration::from_secs(60)).await else {
                break;
            };
            let o = &ev["object"];
            if o["status"]["conditions"][0]["type"] == "Issued" {
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                if let Some(t) = created.lock().expect("lock").remove(name) {
                    latencies.push(t.elapsed());
                }
            }
        }
    };
    tokio::join!(filer, watcher);
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "rate: offered {per_second}/s for {seconds} s ({total} PCRs); observed {} Issued; \
         creation-to-Issued p50 {:.1?} p99 {:.1?} max {:.1?}; validation rejections {}; peak RSS ({}) {} MiB",
        latencies.len(),
        pct(0.50),
        pct(0.99),
        latencies.last().copied().unwrap_or_default(),
        emu.counters().validation_rejections,
        controller.what(),
        controller.peak_rss_kib() / 1024,
    );
    controller.stop();
}
