//! Issue #48: `podca serve` (the debug binary, redb ledger on) settles a burst of 20,000
//! PodCertificateRequests and keeps no per-PCR state once they are answered.
//!
//! Read from `/proc/<pid>/status` of the child once its memory has settled (two readings 2 s
//! apart within 1 %), after a first burst of [`WARM_UP`] (20,000) requests and again after the
//! second, of [`BURST`]. The first burst pays for what a burst leaves behind whatever its size
//! (connections, the CA's first use, the ledger's 4 MiB page cache, the work queue's tables at
//! its capacity, the allocator's high-water pages): measured 17 MiB of anonymous memory after
//! 10,000 PCRs in the release build, not yet given back (docs/benchmarks.md). So the second
//! figure minus the first is what the 20,000 left:
//!
//! * `RssAnon` (heap, stacks, allocator arenas; not the binary's pages) may grow by at most
//!   [`RETAINED_PER_PCR`] bytes per PCR of the burst: 20,000 × 800 B = 15.3 MiB. Clean runs left
//!   130–390 B per PCR (2.6–7.6 MiB), of which the work queue's settled-uid memory, kept 25
//!   minutes by design, is about 70 B (its hash table doubles between the bursts); the rest is the
//!   allocator's. A `Pcr` kept after its answer (its strings and stub CSR, 600 B and more) or its
//!   certificate chain (about 1.5 KB) breaks the bound: 600 B leaked per settled PCR (a test of
//!   the test) read 1,167 B per PCR. Smaller per-PCR leftovers go unseen.
//! * `VmRSS` after both stays under [`SETTLED_BOUND_KIB`] (80 MiB) and the peak (`VmHWM`) under
//!   [`PEAK_BOUND_KIB`] (120 MiB): loose bounds for a debug build that still catch what issue
//!   #48 measured before (a blocking thread per request in flight, each with its own allocator
//!   heap, and transparent huge pages: 180–260 MiB peak).
//!
//! The "back within 20 % of the pre-burst figure within a minute" is not asserted: it is
//! not met yet (docs/benchmarks.md). The figures are what the kernel counts, so the test is not a
//! timing one: the bursts may take as long as the machine needs (up to [`SETTLE_TIMEOUT`]).

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::path::Path;
use std::time::{Duration, Instant};

use podca_tests::bench::{BENCH_NAMESPACE, BENCH_SIGNER, bench_pcr, stubs};
use podca_tests::cluster::Cluster;
use podca_tests::emulator::Res;
use podca_tests::process::{ServeProcess, http_get};

/// The burst issue #48's Must-show names.
const BURST: usize = 20_000;
/// The first burst, whose leftovers are the "before": as large as the second, so that the second
/// reaches no new high-water mark (with 5,000 first, the second left 2.8 and 7.4 MiB in two runs).
const WARM_UP: usize = BURST;
/// Anonymous memory a settled burst may leave behind, per PCR: twice the most a clean run left
/// (390 B), so that a loaded CI machine's allocator noise does not fail it, and still under the
/// 1,167 B a deliberate 600 B leak per PCR read.
const RETAINED_PER_PCR: u64 = 800;
/// The peak RSS bound (KiB) for the debug build over the whole run.
const PEAK_BOUND_KIB: u64 = 120 * 1024;
/// The settled RSS bound (KiB) for the debug build.
const SETTLED_BOUND_KIB: u64 = 80 * 1024;
/// How long a burst may take to be answered.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest wait for the memory to settle.
const SETTLING: Duration = Duration::from_secs(60);

/// One `/proc/<pid>/status` reading, KiB.
#[derive(Debug, Clone, Copy)]
struct Memory {
    rss: u64,
    anon: u64,
    peak: u64,
}

fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("podca serve (pid {pid}) has gone: {e}"));
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    Memory {
        rss: field("VmRSS:"),
        anon: field("RssAnon:"),
        peak: field("VmHWM:"),
    }
}

/// Files `count` PCRs `<prefix>-<i>` into the emulator's store at once.
fn file(cluster: &Cluster, prefix: &str, count: usize) {
    let stubs = stubs();
    for i in 0..count {
        cluster.emu.seed_object(
            Res::Pcr,
            bench_pcr(&format!("{prefix}-{i}"), &stubs[i % stubs.len()].csr),
        );
    }
}

/// Waits until `total` PCRs have been Issued, none refused.
async fn wait_issued(cluster: &Cluster, total: usize, serve: &ServeProcess) {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let c = cluster.emu.counters();
        assert_eq!(c.denied + c.failed, 0, "PCRs were refused: {c:?}");
        if c.issued as usize >= total {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {total} Issued after {SETTLE_TIMEOUT:?} (podca serve at {:?})",
            c.issued,
            memory(serve.pid()),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_burst_of_20000_leaves_no_per_pcr_memory() {
    let (cluster, ca_dir) = Cluster::for_serve(BENCH_SIGNER, BENCH_NAMESPACE).await;
    let config = cluster.dir.path().join("podca.toml");
    // The ledger is the default one: redb in the CA data directory.
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{BENCH_SIGNER}\"]\ntrust_domain = \"cluster.local\"\n",
            ca_dir.display().to_string()
        ),
    )
    .unwrap();
    let serve = ServeProcess::start(
        &config,
        &cluster.kubeconfig,
        &["--no-grpc"],
        // A log line per PCR would be most of the test's output (and of podca's work).
        &[("PODCA_LOG", Path::new("warn"))],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(serve.admin, "/readyz").map(|(code, _)| code) != Some(200) {
        assert!(Instant::now() < deadline, "podca serve never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    file(&cluster, "warm", WARM_UP);
    wait_issued(&cluster, WARM_UP, &serve).await;
    let before = settled(serve.pid()).await;

    let started = Instant::now();
    file(&cluster, "burst", BURST);
    wait_issued(&cluster, WARM_UP + BURST, &serve).await;
    let took = started.elapsed();
    let records = ledger_records(&serve);
    assert!(
        records >= (WARM_UP + BURST) as f64,
        "every certificate is in the ledger before its status shows it: {records} records"
    );
    let after = settled(serve.pid()).await;
    println!(
        "{BURST} PCRs Issued in {took:.1?}; podca serve after {WARM_UP}: {before:?}, after \
         {BURST} more: {after:?} (KiB)"
    );

    let retained = after.anon.saturating_sub(before.anon) * 1024;
    assert!(
        retained <= RETAINED_PER_PCR * BURST as u64,
        "{retained} bytes of anonymous memory stayed after the burst: {} per PCR, more than \
         {RETAINED_PER_PCR} (is per-request state kept after its answer?)",
        retained / BURST as u64
    );
    assert!(
        after.rss <= SETTLED_BOUND_KIB,
        "VmRSS {} KiB once settled, over {SETTLED_BOUND_KIB} KiB",
        after.rss
    );
    assert!(
        after.peak <= PEAK_BOUND_KIB,
        "peak RSS {} KiB over {PEAK_BOUND_KIB} KiB during the bursts",
        after.peak
    );
}

/// The memory once it has settled: two readings 2 s apart within 1 % (or the last reading after
/// [`SETTLING`]).
async fn settled(pid: u32) -> Memory {
    let deadline = Instant::now() + SETTLING;
    let mut last = memory(pid);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = memory(pid);
        let steady = now.rss.abs_diff(last.rss) * 100 <= last.rss;
        last = now;
        if steady || Instant::now() >= deadline {
            return last;
        }
    }
}

/// `podca_ledger_records_total`, summed over its labels.
fn ledger_records(serve: &ServeProcess) -> f64 {
    serve
        .metrics()
        .lines()
        .filter(|l| l.starts_with("podca_ledger_records_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
