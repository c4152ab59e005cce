//! Controller throughput and latency against the in-process API emulator.
//!
//! By default the controller is the real `podca serve` binary (release build, its own process, so
//! its peak RSS is its own); `PODCA_BENCH_IN_PROCESS=1` runs `podca_controller::run` inside the
//! bench process instead (for profiling; the RSS then includes the emulator).
//!
//! `cargo bench -p podca-tests --bench controller_bench -- burst [count]`
//!   files `count` (default 10,000) PCRs at once, reports the time until all are Issued (PCR/s),
//!   the controller's peak RSS, and its RSS up to a minute later against the figure before
//!   filing (issue #48: back within 20 %). Then, podca stopped, the emulator's ceiling in the same run:
//!   `count` more PCRs settled by the bench itself with raw `/status` PATCHes of pre-built
//!   certificate chains ([`podca_tests::bench::raw_patch_ceiling`]) at `PODCA_BENCH_CEILING`
//!   in flight (default 32, as the real server's raw rate was measured), and podca's rate as a
//!   share of it.
//!   `PODCA_EMULATOR_LATENCY=real-apiserver` (or any spec of `podca_tests::emulator::latency`)
//!   gives the emulator the real server's service times and concurrency.
//!   `PODCA_BENCH_CREATE=http` creates the PCRs over HTTP (32 kept-alive connections, as an
//!   admin; `rate` mode: each at its time) instead of straight into the emulator's store, so that
//!   under a latency model the creates compete with podca's writes for the server, as on a real
//!   one; the burst then also reports p50/p99 creation-to-Issued. The ceiling's PCRs are always
//!   filed into the store: it measures PATCHes alone, as the real server's raw rate was.
//!   `PODCA_BENCH_WORKERS=N` passes `--workers N` to podca (default: its configuration's).
//!   `PODCA_BENCH_LEDGER=postgres` records into a throwaway PostgreSQL server (tests/src/postgres.rs)
//!   instead of the default redb file; `none` records nothing durable.
//! `cargo bench -p podca-tests --bench controller_bench -- linearity [small] [large] [rounds]`
//!   issue #41 item 6: bursts of `small` (default 10,000) and `large` (100,000) PCRs, each against
//!   a fresh emulator and `podca serve`, `rounds` (1) times in turn; reports the ratio of the
//!   median times against 1.1 × linear. No ceiling: both bursts run under the same emulator
//!   settings, so the ratio is podca's (and the emulator's) scaling.
//! `cargo bench -p podca-tests --bench controller_bench -- rate [per_second] [seconds]`
//!   offers PCRs at a steady rate (default 1,000/s for 30 s) and reports p50/p99/max
//!   creation-to-Issued latency, observed through a watch.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey, SignerPolicy};
use podca_tests::bench::{
    BENCH_NAMESPACE, BENCH_SIGNER as SIGNER, bench_pcr as pcr, stubs, watch_issued,
};
use podca_tests::client::KubeClient;
use podca_tests::cluster::{Cluster, ClusterConfig};
use podca_tests::emulator::{ApiMode, LatencyModel, Res};
use podca_tests::process::{free_port, http_get, podca_binary_release};
use podca_tests::{Emulator, EmulatorConfig};

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
        "linearity" => {
            let arg =
                |i: usize, default| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
            runtime.block_on(linearity(arg(1, 10_000), arg(2, 100_000), arg(3, 1)));
        }
        other => panic!(
            "unknown mode {other:?}: burst [count] | rate [per_second] [seconds] | \
             linearity [small] [large] [rounds]"
        ),
    }
}

/// The controller under test: a `podca serve` process, or a task in this process.
enum Controller {
    /// The process, the PostgreSQL server its ledger is in (if it is), its admin port.
    Process(
        std::process::Child,
        Option<podca_tests::postgres::Postgres>,
        u16,
    ),
    Task(tokio::sync::oneshot::Sender<()>),
}

impl Controller {
    /// Peak RSS of the controller (KiB): the serve process's, or this whole process's.
    fn peak_rss_kib(&self) -> u64 {
        match self {
            Controller::Process(child, ..) => peak_rss_of(&format!("/proc/{}/status", child.id())),
            Controller::Task(_) => peak_rss_of("/proc/self/status"),
        }
    }

    /// Current RSS of the controller (KiB), as [`Controller::peak_rss_kib`].
    fn rss_kib(&self) -> u64 {
        match self {
            Controller::Process(child, ..) => {
                status_kib(&format!("/proc/{}/status", child.id()), "VmRSS:")
            }
            Controller::Task(_) => status_kib("/proc/self/status", "VmRSS:"),
        }
    }

    /// CPU time (user + system) the serve process has used so far (`None` in process).
    fn cpu(&self) -> Option<Duration> {
        match self {
            Controller::Process(child, ..) => Some(podca_tests::bench::process_cpu(child.id())),
            Controller::Task(_) => None,
        }
    }

    /// The serve process's `/metrics` page (`None` in process).
    fn scrape(&self) -> Option<String> {
        match self {
            Controller::Process(_, _, admin) => http_get(*admin, "/metrics").map(|(_, page)| page),
            Controller::Task(_) => None,
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
            Controller::Process(mut child, pg, _) => {
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

/// `PODCA_BENCH_WORKERS`: podca's `--workers`, when set.
fn workers() -> Option<usize> {
    std::env::var("PODCA_BENCH_WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
}

/// `PODCA_BENCH_CEILING`: the raw client's PATCHes in flight (default 32).
fn ceiling_concurrency() -> usize {
    std::env::var("PODCA_BENCH_CEILING")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(32)
}

/// `PODCA_BENCH_CREATE=http`: PCRs are created over HTTP rather than filed into the store.
fn create_over_http() -> bool {
    match std::env::var("PODCA_BENCH_CREATE").as_deref() {
        Ok("http") => true,
        Ok("store") | Err(_) => false,
        Ok(other) => panic!("PODCA_BENCH_CREATE={other:?}: expected http or store"),
    }
}

/// Creates the PCR `body` over HTTP on `conn`; panics unless the API server created it.
async fn create(conn: &mut podca_tests::client::KeepAliveClient, body: &serde_json::Value) {
    let path =
        format!("/apis/certificates.k8s.io/v1/namespaces/{BENCH_NAMESPACE}/podcertificaterequests");
    let answer = conn
        .request(
            "POST",
            &path,
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await
        .expect("POST a PCR");
    assert_eq!(
        answer.status,
        201,
        "create: {}",
        String::from_utf8_lossy(&answer.body)
    );
}

/// Creates `pcrs` over HTTP from 32 kept-alive connections at once (as the real server's
/// figures were measured), and returns when each was created (sent).
async fn create_all(emu: &Emulator, pcrs: Vec<serde_json::Value>) -> HashMap<String, Instant> {
    let admin = KubeClient::new(emu.base_url(), &emu.admin_token());
    let queue = Arc::new(std::sync::Mutex::new(pcrs));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let mut conn = admin.keep_alive();
            let queue = Arc::clone(&queue);
            tokio::spawn(async move {
                let mut sent = Vec::new();
                loop {
                    let Some(body) = queue.lock().expect("lock").pop() else {
                        return sent;
                    };
                    let name = body["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    sent.push((name, Instant::now()));
                    create(&mut conn, &body).await;
                }
            })
        })
        .collect();
    let mut created = HashMap::new();
    for t in tasks {
        created.extend(t.await.expect("creator"));
    }
    created
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
            // The history a watch resumes from and a list's continue token stays valid in:
            // kube-apiserver keeps both for etcd's 5-minute compaction window, which holds a
            // whole 100,000 burst (a create and a status write each). With the default 20,000
            // events a watch that fell behind the filing relisted, and each relist's pages
            // expired under the status writes ("continue parameter is too old").
            watch_history_limit: 250_000,
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
    if let Some(workers) = workers() {
        options.workers = workers;
    }
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
    let mut command = std::process::Command::new(&bin);
    command
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--admin-listen", &format!("127.0.0.1:{admin}"), "--no-grpc"]);
    if let Some(workers) = workers() {
        command.args(["--workers", &workers.to_string()]);
    }
    let child = command
        .env("PODCA_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("podca serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(admin, "/readyz").map(|(c, _)| c) != Some(200) {
        assert!(Instant::now() < deadline, "podca serve never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Controller::Process(child, pg, admin)
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

fn peak_rss_of(status: &str) -> u64 {
    status_kib(status, "VmHWM:")
}

/// The `field` (KiB) of a `/proc/<pid>/status` file; 0 when it cannot be read.
fn status_kib(status: &str, field: &str) -> u64 {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Issue #48's settle target: reads the controller's RSS every second for up to a minute after
/// the burst, until it is within 20 % of `before` (KiB); prints the last reading.
async fn give_back(controller: &Controller, before: u64) {
    let start = Instant::now();
    let at_end = controller.rss_kib();
    let mut now = at_end;
    while now > before + before / 5 && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        now = controller.rss_kib();
    }
    println!(
        "after the burst: RSS {:.1} MiB when the last PCR was Issued, {:.1} MiB {:.0?} later \
         (before filing {:.1} MiB: {:+.0} %; target within 20 % within a minute)",
        at_end as f64 / 1024.0,
        now as f64 / 1024.0,
        start.elapsed(),
        before as f64 / 1024.0,
        100.0 * (now as f64 - before as f64) / before as f64,
    );
}

async fn burst(count: usize) {
    let (emu, _dir, controller) = setup().await;
    let http = create_over_http();
    let stubs = stubs();
    let metrics_before = controller.scrape();
    let rss_before = controller.peak_rss_kib();
    let rss_now_before = controller.rss_kib();
    // Issued times, observed through a watch from before the first create.
    let issued_at = watch_issued(&emu, "b-", count, Duration::from_secs(60)).await;
    let cpu_before = controller.cpu();
    let Settled {
        created,
        filed,
        took,
    } = file_and_settle(&emu, &stubs, count, http).await;
    let c = emu.counters();
    let podca_rate = count as f64 / took.as_secs_f64();
    let filed_how = if http {
        "created over HTTP"
    } else {
        "filed into the store"
    };
    println!(
        "burst: {count} PCRs {filed_how} in {filed:.2?} ({:.0}/s), all Issued after {took:.2?} => \
         {podca_rate:.0} PCR/s; validation rejections {}; peak RSS ({}) {} MiB (before filing {} MiB)",
        count as f64 / filed.as_secs_f64(),
        c.validation_rejections,
        controller.what(),
        controller.peak_rss_kib() / 1024,
        rss_before / 1024,
    );
    if let (Some(before), Some(after)) = (cpu_before, controller.cpu()) {
        println!(
            "burst: podca serve used {:.2?} of CPU, {:.0} µs a PCR",
            after - before,
            (after - before).as_secs_f64() * 1e6 / count as f64,
        );
    }
    let latencies = creation_to_issued(&created, issued_at.await.expect("watcher"));
    println!(
        "burst: creation-to-Issued ({} observed) p50 {:.2?} p99 {:.2?} max {:.2?}",
        latencies.len(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
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
        "emulator during podca's burst: {} requests, {} watches opened, {} status writes, \
         at most {} status writes inside the server at once, {} refused 429",
        c.requests,
        c.watches_opened,
        c.status_writes_accepted + c.status_writes_noop,
        emu.status_writes_max_in_flight(),
        c.throttled_requests,
    );
    if let (Some(before), Some(after)) = (metrics_before, controller.scrape()) {
        println!(
            "podca: concurrency limit {} before, {} after; decreases {}",
            metric(&before, "podca_controller_concurrency_limit "),
            metric(&after, "podca_controller_concurrency_limit "),
            metric(&after, "podca_controller_concurrency_decreases_total"),
        );
        let sum = |page: &str, name: &str| -> f64 {
            page.lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let commits = sum(&after, "podca_ledger_commit_seconds_count")
            - sum(&before, "podca_ledger_commit_seconds_count");
        let records =
            sum(&after, "podca_ledger_records_total") - sum(&before, "podca_ledger_records_total");
        if commits > 0.0 {
            println!(
                "podca ledger: {records} records in {commits} commits ({:.1} a commit), \
                 {:.2} ms a commit",
                records / commits,
                1e3 * (sum(&after, "podca_ledger_commit_seconds_sum")
                    - sum(&before, "podca_ledger_commit_seconds_sum"))
                    / commits,
            );
        }
    }
    give_back(&controller, rss_now_before).await;
    controller.stop();

    let concurrency = ceiling_concurrency();
    let ceiling =
        podca_tests::bench::raw_patch_ceiling(&emu, &stubs, "c", count, concurrency).await;
    println!(
        "ceiling: {count} PCRs filed into the store in {:.2?}, all Issued by {} raw /status \
         PATCHes after {:.2?} => {:.0} PCR/s; rejected PATCHes {} (emulator validation \
         rejections {})",
        ceiling.filed,
        ceiling.concurrency,
        ceiling.took,
        ceiling.rate(),
        ceiling.rejected,
        ceiling.validation_rejections,
    );
    println!(
        "ratio: podca {podca_rate:.0} PCR/s / ceiling {:.0} PCR/s = {:.1} %",
        ceiling.rate(),
        100.0 * podca_rate / ceiling.rate(),
    );
    if http {
        // podca's burst made the server do `count` creates and `count` PATCHes; where they share
        // its servers, the least time for both is the creates' time alone plus the PATCHes'.
        let more: Vec<_> = (0..count)
            .map(|i| pcr(&format!("d-{i}"), &stubs[i % stubs.len()].csr))
            .collect();
        let t = Instant::now();
        create_all(&emu, more).await;
        let creates_alone = t.elapsed();
        let patches_alone = ceiling.took - ceiling.filed;
        let least = creates_alone + patches_alone;
        println!(
            "same work: {count} creates alone {creates_alone:.2?} + {count} raw PATCHes alone \
             {patches_alone:.2?} = {least:.2?}; podca's burst took {took:.2?} => {:.1} %",
            100.0 * least.as_secs_f64() / took.as_secs_f64(),
        );
    }
}

/// When a burst's PCRs were created, how long filing them took, and how long until all were
/// Issued (from the first filing).
struct Settled {
    created: HashMap<String, Instant>,
    filed: Duration,
    took: Duration,
}

/// Files `count` PCRs named `b-<i>` (over HTTP if `http`, else straight into the store) and
/// waits until the emulator has seen `count` of them Issued.
async fn file_and_settle(
    emu: &Emulator,
    stubs: &[podca_tests::bench::Stub],
    count: usize,
    http: bool,
) -> Settled {
    let pcrs: Vec<_> = (0..count)
        .map(|i| pcr(&format!("b-{i}"), &stubs[i % stubs.len()].csr))
        .collect();
    let start = Instant::now();
    let created = if http {
        create_all(emu, pcrs).await
    } else {
        let mut created = HashMap::new();
        for object in pcrs {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            created.insert(name, Instant::now());
            emu.seed_object(Res::Pcr, object);
        }
        created
    };
    let filed = start.elapsed();
    loop {
        let c = emu.counters();
        if c.issued as usize >= count {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(1800),
            "stuck at {}",
            c.issued
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Settled {
        created,
        filed,
        took: start.elapsed(),
    }
}

/// Issue #41 item 6: a `small` burst and a `large` one in one run, each against a fresh
/// emulator and a fresh `podca serve`, `rounds` times alternating; the large one's time must
/// stay within 1.1 × the linear extrapolation of the small one's (100k ≤ 11 × 10k). Medians.
async fn linearity(small: usize, large: usize, rounds: usize) {
    let http = create_over_http();
    let stubs = stubs();
    let mut times: BTreeMap<usize, Vec<Duration>> = BTreeMap::new();
    for round in 1..=rounds {
        for count in [small, large] {
            let (emu, _dir, controller) = setup().await;
            let cpu_before = controller.cpu();
            let settled = file_and_settle(&emu, &stubs, count, http).await;
            let cpu = controller.cpu().zip(cpu_before).map(|(a, b)| a - b);
            let c = emu.counters();
            controller.stop();
            println!(
                "round {round}: {count} PCRs all Issued after {:.2?} ({:.0} PCR/s; filed in \
                 {:.2?}); podca CPU {:.0} µs a PCR; validation rejections {}",
                settled.took,
                count as f64 / settled.took.as_secs_f64(),
                settled.filed,
                cpu.map_or(f64::NAN, |d| d.as_secs_f64() * 1e6 / count as f64),
                c.validation_rejections,
            );
            times.entry(count).or_default().push(settled.took);
        }
    }
    let median = |count: usize| {
        let mut v = times[&count].clone();
        v.sort();
        v[v.len() / 2]
    };
    let (t_small, t_large) = (median(small), median(large));
    let ratio = t_large.as_secs_f64() / t_small.as_secs_f64();
    let bound = 1.1 * large as f64 / small as f64;
    println!(
        "linearity: median {large} {t_large:.2?} / median {small} {t_small:.2?} = {ratio:.2} × \
         (linear {:.1} ×; target <= {bound:.1} ×: {})",
        large as f64 / small as f64,
        if ratio <= bound { "met" } else { "NOT met" },
    );
}

/// The lines of `page` that start with `name`, values only, joined.
fn metric(page: &str, name: &str) -> String {
    let values: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next())
        .collect();
    if values.is_empty() {
        "-".into()
    } else {
        values.join(" ")
    }
}

/// Sorted creation-to-Issued times of the PCRs seen both created and Issued.
fn creation_to_issued(
    created: &HashMap<String, Instant>,
    issued: HashMap<String, Instant>,
) -> Vec<Duration> {
    let mut latencies: Vec<Duration> = issued
        .iter()
        .filter_map(|(name, at)| created.get(name).map(|c| at.saturating_duration_since(*c)))
        .collect();
    latencies.sort();
    latencies
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
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
    // Over HTTP: 32 creators, each on its kept-alive connection, take the PCRs as they are
    // offered; a PCR's creation time is when its POST is sent.
    let (offer, offered) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    let offered = Arc::new(tokio::sync::Mutex::new(offered));
    let creators: Vec<_> = if create_over_http() {
        (0..32)
            .map(|_| {
                let mut conn = admin.keep_alive();
                let (offered, created) = (Arc::clone(&offered), Arc::clone(&created));
                tokio::spawn(async move {
                    loop {
                        let Some(body) = offered.lock().await.recv().await else {
                            return;
                        };
                        let name = body["metadata"]["name"].as_str().unwrap_or_default();
                        created
                            .lock()
                            .expect("lock")
                            .insert(name.to_owned(), Instant::now());
                        create(&mut conn, &body).await;
                    }
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let filer = async {
        let created = filer_created;
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
                let name = format!("r-{i}");
                let object = pcr(&name, csrs[(i as usize) % csrs.len()]);
                if creators.is_empty() {
                    created.lock().expect("lock").insert(name, Instant::now());
                    emu.seed_object(Res::Pcr, object);
                } else {
                    offer.send(object).expect("the creators run");
                }
                i += 1;
            }
        }
        drop(offer);
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
    for creator in creators {
        creator.await.expect("creator");
    }
    latencies.sort();
    let pct = |p: f64| percentile(&latencies, p);
    let filed_how = if create_over_http() {
        "created over HTTP"
    } else {
        "filed into the store"
    };
    println!(
        "rate: offered {per_second}/s for {seconds} s ({total} PCRs, {filed_how}); observed {} Issued; \
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
