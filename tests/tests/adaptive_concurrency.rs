//! The controller's adaptive concurrency (`controller/src/concurrency.rs`) against the API
//! emulator: it never has more `/status` writes in flight than `max_in_flight`, and when the
//! server answers 429 with `Retry-After` (the emulator's priority-and-fairness throttle) it backs
//! off, causing fewer 429s than a raw client at the same bound.
//!
//! Writes are given a 10 ms service time with no limit on how many are served at once, so that
//! what is in flight is podca's choice alone; the throttle admits requests before that time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_controller::Options;
use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey, SignerPolicy};
use podca_tests::bench::{BENCH_SIGNER, bench_pcr, raw_patch_ceiling, stubs};
use podca_tests::cluster::{Cluster, ClusterConfig};
use podca_tests::emulator::{ApiMode, FaultScope, Res};
use podca_tests::sim::install_crypto;
use podca_tests::{Emulator, EmulatorConfig};
use tokio::sync::oneshot;

/// The emulator with writes taking 10 ms each, any number at once.
async fn cluster() -> Cluster {
    install_crypto();
    let cluster = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            latency: "update=10ms".parse().expect("a valid spec"),
            ..Default::default()
        },
        podca_groups: &["system:authenticated"],
        signers: &[BENCH_SIGNER],
    })
    .await;
    cluster.emu.add_namespace("bench");
    cluster
}

/// Files `count` PCRs named `<prefix>-<i>` into the store at once.
fn file(emu: &Emulator, prefix: &str, count: usize) {
    let stubs = stubs();
    for i in 0..count {
        emu.seed_object(
            Res::Pcr,
            bench_pcr(&format!("{prefix}-{i}"), &stubs[i % stubs.len()].csr),
        );
    }
}

/// Runs the in-process controller (`workers` where its limit starts, `max_in_flight` its bound)
/// until `count` PCRs are Issued; returns its metrics page.
async fn settle(cluster: &Cluster, workers: usize, max_in_flight: usize, count: u64) -> String {
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("CA key");
    let ca = IssuingCa::self_signed_root(
        Arc::new(key),
        "adaptive test CA",
        time::OffsetDateTime::now_utc(),
        time::Duration::days(30),
    )
    .expect("CA");
    let client = podca_controller::connect(Some(&cluster.kubeconfig))
        .await
        .expect("client");
    let mut options = Options::new(
        BTreeMap::from([(
            BENCH_SIGNER.to_string(),
            SignerPolicy::permissive("cluster.local"),
        )]),
        Arc::new(ca),
    );
    options.workers = workers;
    options.max_in_flight = max_in_flight;
    let metrics = Arc::clone(&options.metrics);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(podca_controller::run(client, options, async move {
        let _ = stopped.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(120);
    while cluster.emu.counters().issued < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} Issued",
            cluster.emu.counters().issued
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let page = metrics.encode();
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the controller stops")
        .expect("join")
        .expect("the controller ran without error");
    page
}

/// The value of the series `series` (name and labels) on a metrics page.
fn value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// 300 PCRs pending at once and a limit starting at 2: it grows (more than 2 writes were in
/// the server at once), and never past its bound of 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_status_writes_in_flight_than_the_bound() {
    let cluster = cluster().await;
    file(&cluster.emu, "b", 300);
    let page = settle(&cluster, 2, 6, 300).await;
    let most = cluster.emu.status_writes_max_in_flight();
    assert!(
        most <= 6,
        "{most} status writes at once, above the bound of 6"
    );
    assert!(
        most > 2,
        "the limit never grew past where it started: at most {most} writes at once"
    );
    // A write slower than 1 s (a starved test machine) is push-back too; without any, the
    // limit ends at the bound.
    if !page.contains("podca_controller_concurrency_decreases_total{") {
        assert_eq!(
            value(&page, "podca_controller_concurrency_limit"),
            Some(6.0),
            "a burst with no push-back ends at the bound:\n{page}"
        );
    }
    let c = cluster.emu.counters();
    assert_eq!((c.validation_rejections, c.throttled_requests), (0, 0));
}

/// The server admits 3 status writes at once and answers 429 `Retry-After: 1` beyond; podca
/// starts at 16 in flight (its bound). It lowers its limit on the 429s, settles everything, and
/// causes fewer 429s than the raw client does settling as many at the same 16 in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backs_off_on_429_with_retry_after() {
    const COUNT: usize = 200;
    let cluster = cluster().await;
    let emu = &cluster.emu;
    emu.throttle(Some((3, 1, FaultScope::StatusWrites)));
    file(emu, "b", COUNT);
    let page = settle(&cluster, 16, 16, COUNT as u64).await;
    let podca_429s = emu.counters().throttled_requests;
    let decreases = value(
        &page,
        "podca_controller_concurrency_decreases_total{cause=\"throttled\"}",
    )
    .unwrap_or(0.0);
    assert!(podca_429s > 0, "the throttle never refused podca");
    assert!(
        decreases >= 1.0,
        "{podca_429s} 429s and the limit never lowered:\n{page}"
    );
    let limit = value(&page, "podca_controller_concurrency_limit").expect("the limit gauge");
    assert!(limit <= 16.0, "limit {limit} above the bound");
    assert!(emu.status_writes_max_in_flight() <= 16);
    assert_eq!(emu.counters().validation_rejections, 0);

    // The raw client at the same 16 in flight, as many PCRs, the same throttle.
    emu.reset_counters();
    let raw = raw_patch_ceiling(emu, &stubs(), "raw", COUNT, 16).await;
    let raw_429s = emu.counters().throttled_requests;
    assert_eq!(raw.rejected, raw_429s, "the raw client met only 429s");
    eprintln!("429s settling {COUNT} PCRs: podca {podca_429s}, the raw client {raw_429s}");
    assert!(
        podca_429s < raw_429s,
        "podca caused {podca_429s} 429s settling {COUNT} PCRs, the raw client {raw_429s}"
    );
}

/// `[controller] workers` is where the limit starts and `max_in_flight` its bound: both at
/// least 1, the start not above the bound; left out, 8 and 64.
#[test]
fn the_controller_table_is_checked() {
    use podca_authority::config::Config;
    let parse = |table: &str| Config::parse(&format!("[controller]\n{table}"));
    let defaults = parse("").expect("defaults");
    assert_eq!(
        (
            defaults.controller.workers,
            defaults.controller.max_in_flight
        ),
        (8, 64)
    );
    let pinned = parse("workers = 16\nmax_in_flight = 16").expect("workers = bound");
    assert_eq!(
        (pinned.controller.workers, pinned.controller.max_in_flight),
        (16, 16)
    );
    for (table, error) in [
        (
            "workers = 65",
            "[controller] workers = 65 is above max_in_flight = 64",
        ),
        (
            "max_in_flight = 0",
            "[controller] workers and max_in_flight must be at least 1",
        ),
        (
            "workers = 0",
            "[controller] workers and max_in_flight must be at least 1",
        ),
    ] {
        let refused = parse(table).expect_err(table);
        assert!(refused.to_string().contains(error), "{table}: {refused}");
    }
}
