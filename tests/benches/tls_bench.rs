//! gRPC over TLS: what podca serve's listener costs (run: `cargo bench -p podca-tests --bench
//! tls_bench`; issue #12's performance targets).
//!
//! Against a release `podca serve` on the API emulator (the emulator runs in this process and is
//! only asked for one TokenReview), P-256 CSRs, TLS verified against the CA's anchors, all on the
//! same machine as the clients:
//!
//! 1. **persistent**: 64 clients, one TLS connection each, `IssueCertificate` in a loop;
//! 2. **handshake**: 64 clients, each call on a new TCP connection with a full TLS handshake (no
//!    session resumption) and a new HTTP/2 connection, then one `IssueCertificate`;
//! 3. the server's CPU time (user + system, `/proc/<pid>/stat`) per certificate over each
//!    measuring window, against the cost of one P-256 CSR-signature verification plus one P-256
//!    signature, both measured with aws-lc-rs on one thread in the same run.
//!
//! `PODCA_BENCH_PERF=1` also samples the server with `perf record` during the persistent window
//! and prints where its CPU time went, by component. `PODCA_BENCH_SECONDS` sets each window
//! (default 10 s). `PODCA_BENCH_LEDGER=none` runs serve with `[ledger] backend = "none"` instead
//! of the default redb ledger, whose durable group commit every answer waits for.
//!
//! `PODCA_BENCH_AB=<another podca binary>` compares two builds instead: it starts a serve of
//! each (`PODCA_BIN`, "A", and that one, "B"; `PODCA_BENCH_AB_ENV="K=V …"` adds to B's
//! environment) and measures persistent windows of A and B in turn for `PODCA_BENCH_ROUNDS`
//! rounds (default 6, alternating which goes first). This machine's speed drifts by ±15 % over
//! minutes, more than most changes are worth; alternating windows put the drift on both sides.
//! `PODCA_BENCH_BARE=1` does the same against the bare server (see [`bare`]): the floor that
//! TLS, HTTP/2, tonic and the two P-256 operations set before podca does anything of its own.
//! `PODCA_BENCH_AB_TRACES=1` compares the same build with traces off (A) and on (B: every trace
//! sampled, exported over OTLP/gRPC to a collector in this process that accepts and counts).

#![allow(clippy::unwrap_used)] // a benchmark: any failure should stop it loudly

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, UnparsedPublicKey,
};
use podca_proto::podca::v1::IssueCertificateRequest;
use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_tests::bench::{TlsServe, process_cpu};
use podca_tests::process::csr_for;
use podca_tests::tls::{SERVER_NAME, TlsChannel};
use tonic::metadata::AsciiMetadataValue;
use x509_parser::prelude::FromDer;

const CLIENTS: usize = 64;

fn main() {
    if std::env::var_os(bare::SERVER_ENV).is_some() {
        bare::serve();
        return;
    }
    let window = Duration::from_secs(env_number("PODCA_BENCH_SECONDS", 10));
    let perf = std::env::var_os("PODCA_BENCH_PERF").is_some_and(|v| v == "1");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if std::env::var_os("PODCA_BENCH_AB_TRACES").is_some_and(|v| v == "1") {
        let same = podca_tests::process::podca_binary_release();
        runtime.block_on(ab(window, Some(same)));
        return;
    }
    if let Some(binary_b) = std::env::var_os("PODCA_BENCH_AB") {
        runtime.block_on(ab(window, Some(binary_b.into())));
        return;
    }
    if std::env::var_os("PODCA_BENCH_BARE").is_some_and(|v| v == "1") {
        runtime.block_on(ab(window, None));
        return;
    }
    runtime.block_on(async {
        println!(
            "ledger: {}",
            if ledger_table().is_empty() {
                "redb (default)"
            } else {
                "none"
            }
        );
        let serve = TlsServe::start(ledger_table()).await;
        let auth: AsciiMetadataValue = format!("Bearer {}", serve.token).parse().unwrap();
        // One call first, so the TokenReview and the first connection are not in the window.
        let target = Target::of(&serve);
        issue(&mut connect(&target).await, &auth).await.unwrap();

        let profile = perf.then(|| Profile::start(target.pid, window));
        let persistent = persistent(&target, &auth, window).await;
        let breakdown = profile.map(Profile::finish);
        let handshake = handshake(&target, &auth, window).await;
        let reference = reference_costs();

        persistent.print("persistent connections");
        handshake.print("new connection + TLS handshake + one issuance");
        println!(
            "aws-lc-rs on one thread: P-256 CSR-signature verification {:.1} µs + P-256 \
             signature {:.1} µs = {:.1} µs",
            reference.verify_us,
            reference.sign_us,
            reference.total_us()
        );
        println!(
            "server CPU per certificate / (verification + signature): persistent {:.2}x, \
             handshake {:.2}x (target for persistent: <= 2.0x)",
            persistent.cpu_us_per_cert() / reference.total_us(),
            handshake.cpu_us_per_cert() / reference.total_us()
        );
        if let Some(breakdown) = breakdown {
            breakdown.print(persistent.cpu_us_per_cert());
        }
    });
}

/// The number in the environment variable `name`, or `default`.
fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The `[ledger]` table's body: `PODCA_BENCH_LEDGER=none` or the default redb file.
fn ledger_table() -> &'static str {
    if std::env::var_os("PODCA_BENCH_LEDGER").is_some_and(|v| v == "none") {
        "backend = \"none\""
    } else {
        ""
    }
}

/// `PODCA_BENCH_AB`: persistent windows of two builds in turn; without a binary
/// (`PODCA_BENCH_BARE`), of podca serve and the bare server.
async fn ab(window: Duration, binary_b: Option<std::path::PathBuf>) {
    let binary_b_label = binary_b.as_ref().map(|b| b.display().to_string());
    let rounds = env_number("PODCA_BENCH_ROUNDS", 6);
    let env_b = std::env::var("PODCA_BENCH_AB_ENV").unwrap_or_default();
    let env_b: Vec<(&str, &std::path::Path)> = env_b
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("PODCA_BENCH_AB_ENV: K=V pairs");
            (k, std::path::Path::new(v))
        })
        .collect();
    let traces = std::env::var_os("PODCA_BENCH_AB_TRACES").is_some_and(|v| v == "1");
    let (spans, extra_b) = match traces {
        true => {
            let (spans, port) = sink::start().await;
            let table = format!(
                "\n[tracing]\notlp_endpoint = \"http://127.0.0.1:{port}\"\nsampling_ratio = 1.0\n"
            );
            (Some(spans), table)
        }
        false => (None, String::new()),
    };
    let a = TlsServe::start(ledger_table()).await;
    let b = match binary_b {
        Some(binary) => {
            B::Serve(TlsServe::start_configured(ledger_table(), &extra_b, &binary, &env_b).await)
        }
        None => B::Bare(bare::Child::start()),
    };
    let auth: AsciiMetadataValue = format!("Bearer {}", a.token).parse().unwrap();
    let auth_b: AsciiMetadataValue = match &b {
        B::Serve(serve) => format!("Bearer {}", serve.token).parse().unwrap(),
        // The bare server reads no credentials.
        B::Bare(_) => auth.clone(),
    };
    let mut serves = Vec::new();
    for (target, auth) in [(Target::of(&a), auth), (b.target(), auth_b)] {
        issue(&mut connect(&target).await, &auth).await.unwrap();
        serves.push((target, auth));
    }
    println!(
        "A: {}, B: {}",
        std::env::var("PODCA_BIN").unwrap_or_else(|_| "podca (release build)".into()),
        match binary_b_label {
            Some(label) => label,
            None => "the bare server (TLS, tonic, verification and signature only)".into(),
        }
    );
    let mut cpu: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (serve, auth) = &serves[i];
            let run = persistent(serve, auth, window).await;
            assert_eq!(run.failed, 0, "calls failed");
            println!(
                "round {round} {}: {:.0}/s, {:.1} µs per certificate",
                ["A", "B"][i],
                run.rate(),
                run.cpu_us_per_cert()
            );
            cpu[i].push(run.cpu_us_per_cert());
        }
    }
    let reference = reference_costs();
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let pairs: Vec<f64> = cpu[1].iter().zip(&cpu[0]).map(|(b, a)| b / a).collect();
    println!(
        "server CPU per certificate, medians of {rounds}: A {:.1} µs ({:.2}x), B {:.1} µs \
         ({:.2}x); B/A per round {:?}, median {:.3}; reference {:.1} µs",
        median(&cpu[0]),
        median(&cpu[0]) / reference.total_us(),
        median(&cpu[1]),
        median(&cpu[1]) / reference.total_us(),
        pairs
            .iter()
            .map(|r| (r * 1000.0).round() / 1000.0)
            .collect::<Vec<_>>(),
        median(&pairs),
        reference.total_us()
    );
    if let Some(spans) = spans {
        println!(
            "B exported {} spans to the collector",
            spans.load(Ordering::Relaxed)
        );
    }
}

/// What `PODCA_BENCH_AB` compares podca serve with.
enum B {
    Serve(TlsServe),
    Bare(bare::Child),
}

impl B {
    fn target(&self) -> Target<'_> {
        match self {
            B::Serve(serve) => Target::of(serve),
            B::Bare(bare) => Target {
                addr: bare.addr,
                anchors: &bare.anchors,
                pid: bare.child.id(),
            },
        }
    }
}

/// A window's outcome.
struct Run {
    issued: u64,
    failed: u64,
    elapsed: Duration,
    server_cpu: Duration,
    latencies: Vec<Duration>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.issued as f64 / self.elapsed.as_secs_f64()
    }

    fn cpu_us_per_cert(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e6 / self.issued.max(1) as f64
    }

    fn print(&self, what: &str) {
        let pct = |p: f64| {
            self.latencies
                .get(
                    ((self.latencies.len() as f64 * p) as usize)
                        .min(self.latencies.len().max(1) - 1),
                )
                .copied()
                .unwrap_or_default()
        };
        println!(
            "IssueCertificate over TLS, {what}, {CLIENTS} clients, P-256, {:.1} s: {} issued \
             ({:.0}/s), {} failed, latency p50 {:?} p99 {:?}; server CPU {:.2} s = {:.0} µs per \
             certificate ({:.2} cores)",
            self.elapsed.as_secs_f64(),
            self.issued,
            self.rate(),
            self.failed,
            pct(0.5),
            pct(0.99),
            self.server_cpu.as_secs_f64(),
            self.cpu_us_per_cert(),
            self.server_cpu.as_secs_f64() / self.elapsed.as_secs_f64()
        );
        assert_eq!(self.failed, 0, "{what}: calls failed");
    }
}

/// A server the clients call: where, what to trust, and whose CPU time to count.
#[derive(Clone, Copy)]
struct Target<'a> {
    addr: std::net::SocketAddr,
    anchors: &'a str,
    pid: u32,
}

impl<'a> Target<'a> {
    fn of(serve: &'a TlsServe) -> Self {
        Target {
            addr: serve.addr,
            anchors: &serve.anchors,
            pid: serve.serve.child.id(),
        }
    }
}

async fn connect(target: &Target<'_>) -> PodCaClient<tonic::transport::Channel> {
    TlsChannel::connect(target.addr, target.anchors, SERVER_NAME)
        .await
        .unwrap()
        .client()
}

async fn issue(
    client: &mut PodCaClient<tonic::transport::Channel>,
    auth: &AsciiMetadataValue,
) -> Result<(), tonic::Status> {
    thread_local! {
        static CSR: Vec<u8> = csr_for(&rcgen::KeyPair::generate().unwrap());
    }
    let mut request = tonic::Request::new(IssueCertificateRequest {
        csr: CSR.with(Clone::clone),
        ..Default::default()
    });
    request.metadata_mut().insert("authorization", auth.clone());
    client.issue_certificate(request).await.map(drop)
}

/// Runs `CLIENTS` loops of `call` until the window closes, counting the server's CPU time.
async fn measure<F, Fut>(pid: u32, window: Duration, call: F) -> Run
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), tonic::Status>> + Send,
{
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let cpu_before = process_cpu(pid);
    let start = Instant::now();
    let deadline = start + window;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (done, failed, call) = (Arc::clone(&done), Arc::clone(&failed), call.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let at = Instant::now();
                    match call().await {
                        Ok(()) => {
                            done.fetch_add(1, Ordering::Relaxed);
                            latencies.push(at.elapsed());
                        }
                        Err(status) => {
                            if failed.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!("first failure: {status}");
                            }
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = start.elapsed();
    let server_cpu = process_cpu(pid) - cpu_before;
    latencies.sort();
    Run {
        issued: done.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        elapsed,
        server_cpu,
        latencies,
    }
}

async fn persistent(target: &Target<'_>, auth: &AsciiMetadataValue, window: Duration) -> Run {
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(connect(target).await);
    }
    let pool = Arc::new(std::sync::Mutex::new(clients));
    let auth = auth.clone();
    // Each loop takes a client of its own on its first call and keeps it.
    measure(target.pid, window, move || {
        let (pool, auth) = (Arc::clone(&pool), auth.clone());
        async move {
            let mut client = pool.lock().unwrap().pop().unwrap();
            let result = issue(&mut client, &auth).await;
            pool.lock().unwrap().push(client);
            result
        }
    })
    .await
}

async fn handshake(target: &Target<'_>, auth: &AsciiMetadataValue, window: Duration) -> Run {
    let (addr, anchors, auth) = (target.addr, target.anchors.to_owned(), auth.clone());
    measure(target.pid, window, move || {
        let (anchors, auth) = (anchors.clone(), auth.clone());
        async move {
            let channel = TlsChannel::connect(addr, &anchors, SERVER_NAME)
                .await
                .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
            issue(&mut channel.client(), &auth).await
        }
    })
    .await
}

/// The two operations issuance cannot avoid, timed alone.
struct Reference {
    verify_us: f64,
    sign_us: f64,
}

impl Reference {
    fn total_us(&self) -> f64 {
        self.verify_us + self.sign_us
    }
}

fn per_op_us(mut op: impl FnMut()) -> f64 {
    for _ in 0..1000 {
        op();
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(2) {
        for _ in 0..100 {
            op();
        }
        n += 100;
    }
    start.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn reference_costs() -> Reference {
    let csr = csr_for(&rcgen::KeyPair::generate().unwrap());
    let (_, parsed) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&csr).unwrap();
    let info = parsed.certification_request_info.raw.to_vec();
    let signature = parsed.signature_value.data.to_vec();
    let public_key = parsed
        .certification_request_info
        .subject_pki
        .subject_public_key
        .data
        .to_vec();
    let key = UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, public_key);
    key.verify(&info, &signature).unwrap();
    let verify_us = per_op_us(|| key.verify(&info, &signature).unwrap());

    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let ca = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
    // About the size of a leaf's TBSCertificate.
    let tbs = vec![0x5au8; 420];
    let sign_us = per_op_us(|| {
        std::hint::black_box(ca.sign(&rng, &tbs).unwrap());
    });
    Reference { verify_us, sign_us }
}

/// `perf record` of the server over one window.
struct Profile {
    child: std::process::Child,
    data: tempfile::NamedTempFile,
}

impl Profile {
    fn start(pid: u32, window: Duration) -> Profile {
        let data = tempfile::NamedTempFile::new().unwrap();
        let child = std::process::Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F", "2000", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(data.path())
            .args(["--", "sleep"])
            .arg(window.as_secs().to_string())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("run perf (PODCA_BENCH_PERF=1 needs the perf tool)");
        Profile { child, data }
    }

    fn finish(mut self) -> Breakdown {
        assert!(self.child.wait().unwrap().success(), "perf record failed");
        let report = std::process::Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "--sort",
                "dso,sym",
                "-i",
            ])
            .arg(self.data.path())
            .output()
            .unwrap();
        assert!(report.status.success(), "perf report failed");
        Breakdown::parse(&String::from_utf8_lossy(&report.stdout))
    }
}

/// Sampled CPU time by component, in percent of the server's samples, and the symbols no
/// component claimed ("other"), largest first.
struct Breakdown(BTreeMap<&'static str, f64>, Vec<(f64, String)>);

/// Components by symbol name, first match wins (kernel samples and libc are told apart by their
/// DSO first). Inlining moves some work into its caller's crate, so the split is approximate at
/// the edges.
const COMPONENTS: &[(&str, &[&str])] = &[
    (
        "aws-lc: AES-GCM record encryption",
        &["aes_", "aesni", "gcm_", "_gcm", "ghash", "clmul"],
    ),
    ("aws-lc: SHA-2", &["sha256", "sha512", "SHA256", "SHA512"]),
    (
        "aws-lc: P-256 sign and verify (EC, bignum)",
        &[
            "p256",
            "nistz256",
            "ec_GFp",
            "EC_",
            "ec_point",
            "ec_scalar",
            "ec_simple",
            "ec_wNAF",
            "ec_get",
            "ecdsa",
            "ECDSA",
            "bn_",
            "BN_",
            "beeu",
        ],
    ),
    ("aws-lc: other", &["aws_lc", "OPENSSL", "CRYPTO_"]),
    ("rustls (TLS framing)", &["rustls"]),
    (
        "h2, hyper, http (HTTP/2)",
        &["h2::", "hyper", "http::", "http_body", "httparse"],
    ),
    (
        "tonic, prost, tower (gRPC, protobuf)",
        &["tonic", "prost", "tower", "podca_proto"],
    ),
    ("redb (ledger)", &["redb"]),
    ("podca ledger", &["ledger"]),
    (
        "tokio (tasks, wakeups, I/O driver)",
        &["tokio", "mio::", "parking_lot", "crossbeam"],
    ),
    ("tracing, prometheus metrics", &["tracing", "prometheus"]),
    (
        "podca issuance (CSR parse, policy, leaf DER, PEM)",
        &[
            "podca",
            "x509_parser",
            "der_parser",
            "asn1_rs",
            "pem::",
            "base64",
            "time::",
        ],
    ),
    (
        "allocation, copies (Rust std)",
        &["alloc::", "core::ptr", "__rust_", "memcpy", "memmove"],
    ),
];

impl Breakdown {
    fn parse(report: &str) -> Breakdown {
        let mut out = BTreeMap::new();
        let mut unclaimed = Vec::new();
        for line in report.lines() {
            let line = line.trim();
            let Some((pct, rest)) = line.split_once('%') else {
                continue;
            };
            let Ok(pct) = pct.trim().parse::<f64>() else {
                continue;
            };
            let component = if rest.contains("[k]") || rest.contains("[kernel") {
                "kernel: syscalls, loopback TCP, scheduling"
            } else if let Some((dso, symbol)) = rest.split_once("[.]") {
                if dso.contains("libc") {
                    "libc: malloc, free, memcpy"
                } else {
                    let found = COMPONENTS
                        .iter()
                        .find(|(_, needles)| needles.iter().any(|n| symbol.contains(n)))
                        .map(|(name, _)| *name);
                    if found.is_none() {
                        unclaimed.push((pct, format!("{} [{}]", symbol.trim(), dso.trim())));
                    }
                    found.unwrap_or("other")
                }
            } else {
                continue;
            };
            *out.entry(component).or_insert(0.0) += pct;
        }
        unclaimed.sort_by(|a, b| b.0.total_cmp(&a.0));
        unclaimed.truncate(12);
        Breakdown(out, unclaimed)
    }

    fn print(&self, cpu_us_per_cert: f64) {
        println!("where the server's CPU went (perf, persistent window):");
        let mut rows: Vec<_> = self.0.iter().collect();
        rows.sort_by(|a, b| b.1.total_cmp(a.1));
        for (component, pct) in rows {
            println!(
                "  {pct:5.1} %  {:6.1} µs/cert  {component}",
                cpu_us_per_cert * pct / 100.0
            );
        }
        println!("the largest symbols in \"other\":");
        for (pct, symbol) in &self.1 {
            println!(
                "  {pct:5.1} %  {:6.1} µs/cert  {symbol}",
                cpu_us_per_cert * pct / 100.0
            );
        }
    }
}

/// The floor: a gRPC server with podca's TLS accept path (`podca_grpc::tls::incoming`, so the
/// same rustls, `Corked` and connection admission), tonic's defaults, and per call exactly one
/// P-256 CSR-signature verification and one P-256 signature (over a TBSCertificate-sized
/// buffer), answering a response of the same size as podca's. Nothing else of podca runs: no
/// authentication, policy, ledger, audit line or metrics. `PODCA_BENCH_BARE=1` measures it
/// against podca serve, windows in turn as with `PODCA_BENCH_AB`; it runs in a child process
/// (this binary again, with [`bare::SERVER_ENV`]) so that its CPU time is its own.
mod bare {
    use std::io::{BufRead, Write};
    use std::net::SocketAddr;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::time::Duration;

    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::signature::{
        ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, UnparsedPublicKey,
    };
    use base64::Engine;
    use podca_proto::podca::v1::pod_ca_server::{PodCa, PodCaServer};
    use podca_proto::podca::v1::{
        GetJwtBundleRequest, GetTrustBundleRequest, IssueCertificateRequest,
        IssueCertificateResponse, IssueForPodRequest, IssueJwtSvidRequest, JwtBundle, JwtSvid,
        TrustBundle,
    };
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use tonic::{Request, Response, Status};
    use x509_parser::prelude::FromDer;

    /// Set in the child process: it serves and prints `<port> <anchors PEM, base64>`.
    pub const SERVER_ENV: &str = "PODCA_BENCH_BARE_SERVER";

    /// The child: serves until killed.
    pub fn serve() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            ca.distinguished_name
                .push(rcgen::DnType::CommonName, "bare bench CA");
            let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
            let issuer = rcgen::Issuer::new(ca, ca_key);
            let key = rcgen::KeyPair::generate().unwrap();
            let leaf = rcgen::CertificateParams::new(vec![podca_tests::tls::SERVER_NAME.into()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let mut config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![CertificateDer::from(leaf.der().to_vec())],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
                )
                .unwrap();
            config.alpn_protocols = vec![b"h2".to_vec()];
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let counter = podca_grpc::connections::ConnectionCounter::new(
                podca_grpc::connections::ConnectionLimits {
                    per_peer: 4096,
                    total: 100_000,
                },
                podca_authority::metrics::GrpcMetrics::default(),
            );
            let incoming = podca_grpc::tls::incoming(
                listener,
                Arc::new(config),
                Duration::from_secs(10),
                counter,
            );
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
            let service = Bare {
                key: EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref())
                    .unwrap(),
                rng,
                anchors_pem: ca_pem.clone(),
            };
            let mut out = std::io::stdout();
            writeln!(
                out,
                "{port} {}",
                base64::engine::general_purpose::STANDARD.encode(&ca_pem)
            )
            .unwrap();
            out.flush().unwrap();
            tonic::transport::Server::builder()
                .add_service(PodCaServer::new(service))
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
    }

    /// A bare server in a child process.
    pub struct Child {
        pub child: std::process::Child,
        pub addr: SocketAddr,
        pub anchors: String,
    }

    impl Child {
        pub fn start() -> Child {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .env(SERVER_ENV, "1")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let (port, anchors) = line.trim().split_once(' ').expect("<port> <anchors>");
            let anchors = base64::engine::general_purpose::STANDARD
                .decode(anchors)
                .unwrap();
            Child {
                child,
                addr: SocketAddr::from(([127, 0, 0, 1], port.parse().unwrap())),
                anchors: String::from_utf8(anchors).unwrap(),
            }
        }
    }

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    struct Bare {
        key: EcdsaKeyPair,
        rng: SystemRandom,
        anchors_pem: String,
    }

    #[tonic::async_trait]
    impl PodCa for Bare {
        async fn issue_certificate(
            &self,
            request: Request<IssueCertificateRequest>,
        ) -> Result<Response<IssueCertificateResponse>, Status> {
            let csr = request.into_inner().csr;
            let (_, parsed) =
                x509_parser::certification_request::X509CertificationRequest::from_der(&csr)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let info = parsed.certification_request_info.raw;
            let spki = &parsed
                .certification_request_info
                .subject_pki
                .subject_public_key
                .data;
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, spki)
                .verify(info, &parsed.signature_value.data)
                .map_err(|_| Status::invalid_argument("bad CSR signature"))?;
            // A TBSCertificate's size, then the signature: a certificate's bytes.
            let mut der = vec![0x5au8; 420];
            let signature = self
                .key
                .sign(&self.rng, &der)
                .map_err(|_| Status::internal("signing failed"))?;
            der.extend_from_slice(signature.as_ref());
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            let at = |seconds| Some(prost_types::Timestamp { seconds, nanos: 0 });
            Ok(Response::new(IssueCertificateResponse {
                certificate_chain_pem: podca_signer::x509::certificates_to_pem([der.as_slice()])
                    + &self.anchors_pem,
                not_before: at(now),
                not_after: at(now + 86_400),
                begin_refresh_at: at(now + 43_200),
                trust_anchors_pem: self.anchors_pem.clone(),
                spiffe_id: "spiffe://cluster.local/ns/default/sa/default".into(),
                serial: format!(
                    "{:032x}",
                    u128::from_be_bytes(signature.as_ref()[..16].try_into().unwrap())
                ),
            }))
        }

        async fn issue_for_pod(
            &self,
            _: Request<IssueForPodRequest>,
        ) -> Result<Response<IssueCertificateResponse>, Status> {
            Err(Status::unimplemented("bare"))
        }

        async fn get_trust_bundle(
            &self,
            _: Request<GetTrustBundleRequest>,
        ) -> Result<Response<TrustBundle>, Status> {
            Err(Status::unimplemented("bare"))
        }

        type WatchTrustBundleStream =
            Pin<Box<dyn tokio_stream::Stream<Item = Result<TrustBundle, Status>> + Send>>;

        async fn watch_trust_bundle(
            &self,
            _: Request<GetTrustBundleRequest>,
        ) -> Result<Response<Self::WatchTrustBundleStream>, Status> {
            Err(Status::unimplemented("bare"))
        }

        async fn issue_jwt_svid(
            &self,
            _: Request<IssueJwtSvidRequest>,
        ) -> Result<Response<JwtSvid>, Status> {
            Err(Status::unimplemented("bare"))
        }

        async fn get_jwt_bundle(
            &self,
            _: Request<GetJwtBundleRequest>,
        ) -> Result<Response<JwtBundle>, Status> {
            Err(Status::unimplemented("bare"))
        }
    }
}

/// A collector for `PODCA_BENCH_AB_TRACES`: takes every export, counts its spans, keeps nothing.
mod sink {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use podca_tests::otlp::opentelemetry::proto::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use podca_tests::otlp::opentelemetry::proto::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };

    #[derive(Debug, Clone, Default)]
    struct Sink(Arc<AtomicU64>);

    #[tonic::async_trait]
    impl TraceService for Sink {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let spans: usize = request
                .into_inner()
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            self.0.fetch_add(spans as u64, Ordering::Relaxed);
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// Serves on a loopback port; the span count and the port.
    pub async fn start() -> (Arc<AtomicU64>, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sink = Sink::default();
        let count = Arc::clone(&sink.0);
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        (count, port)
    }
}
