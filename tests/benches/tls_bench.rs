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
    let seconds: u64 = std::env::var("PODCA_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let window = Duration::from_secs(seconds);
    let perf = std::env::var_os("PODCA_BENCH_PERF").is_some_and(|v| v == "1");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let no_ledger = std::env::var_os("PODCA_BENCH_LEDGER").is_some_and(|v| v == "none");
        println!(
            "ledger: {}",
            if no_ledger { "none" } else { "redb (default)" }
        );
        let serve = TlsServe::start(if no_ledger { "backend = \"none\"" } else { "" }).await;
        let pid = serve.serve.child.id();
        let auth: AsciiMetadataValue = format!("Bearer {}", serve.token).parse().unwrap();
        // One call first, so the TokenReview and the first connection are not in the window.
        issue(&mut connect(&serve).await, &auth).await.unwrap();

        let profile = perf.then(|| Profile::start(pid, window));
        let persistent = persistent(&serve, &auth, window).await;
        let breakdown = profile.map(Profile::finish);
        let handshake = handshake(&serve, &auth, window).await;
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

async fn connect(serve: &TlsServe) -> PodCaClient<tonic::transport::Channel> {
    TlsChannel::connect(serve.addr, &serve.anchors, SERVER_NAME)
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

async fn persistent(serve: &TlsServe, auth: &AsciiMetadataValue, window: Duration) -> Run {
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(connect(serve).await);
    }
    let pool = Arc::new(std::sync::Mutex::new(clients));
    let auth = auth.clone();
    // Each loop takes a client of its own on its first call and keeps it.
    measure(serve.serve.child.id(), window, move || {
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

async fn handshake(serve: &TlsServe, auth: &AsciiMetadataValue, window: Duration) -> Run {
    let (addr, anchors, auth) = (serve.addr, serve.anchors.clone(), auth.clone());
    measure(serve.serve.child.id(), window, move || {
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

/// Sampled CPU time by component, in percent of the server's samples.
struct Breakdown(BTreeMap<&'static str, f64>);

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
                    COMPONENTS
                        .iter()
                        .find(|(_, needles)| needles.iter().any(|n| symbol.contains(n)))
                        .map_or("other", |(name, _)| *name)
                }
            } else {
                continue;
            };
            *out.entry(component).or_insert(0.0) += pct;
        }
        Breakdown(out)
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
    }
}
