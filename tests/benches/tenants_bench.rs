//! Tenants (issue #39) benchmarks (run: `cargo bench -p podca-tests --bench tenants_bench`).
//!
//! The issue's targets: "Issuance with 2 signers × 10 tenants stays within 5 % of one CA (leaf
//! issuance / raw signing in the same run); memory for 100 tenants ≤ 10 MB over one." This
//! reports both; it asserts neither (a request that fails stops it).
//!
//! 1. **Throughput**: two release `podca dev`s at once, each called by 64 plaintext podca.v1
//!    `IssueCertificate` clients on loopback (one connection each, P-256 CSRs made ahead of time,
//!    the identity in dev metadata, no per-identity rate limit). A: one signer, no tenants (one
//!    CA). B: 2 signers × 10 tenants (20 tenant CAs, each signer a CA of its own besides),
//!    `[grpc] signers` listing both; its clients are spread over both signers and over the
//!    tenants' namespaces, and each client's first certificate is checked to be in its tenant's
//!    trust domain and from its tenant's CA (20 distinct anchor sets), so every request lands on
//!    a tenant CA. A's clients use the same namespaces, all for its one signer. Windows alternate
//!    A, B, A, B, … (`PODCA_BENCH_ROUNDS` rounds, default 5, of `PODCA_BENCH_SECONDS` s each,
//!    default 5) so that the machine's drift falls on both sides; reported: each side's median
//!    rate and B/A (min–max of the rounds' B/A), the server's CPU time per certificate (from
//!    `/proc/<pid>/stat`) on each side, and that as a multiple of the raw work (one P-256
//!    CSR-signature verification plus one P-256 signature, aws-lc-rs on one thread) measured in
//!    the same run.
//! 2. **Memory**: VmRSS (`/proc/<pid>/status`) of an idle release `podca dev` with one signer and
//!    no tenants, and of one with 1 signer × 100 tenants (100 tenant CAs made on the first
//!    start), each measured after `ready` and a settle of a few seconds, then again after a
//!    warm-up of a few issuances from each of the 100 namespaces (the same calls for both).
//!
//! `PODCA_BENCH_ONLY=throughput` or `=memory` runs one part alone.

#![allow(clippy::unwrap_used)] // a benchmark: any failure should stop it loudly

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, UnparsedPublicKey,
};
use podca_proto::podca::v1::IssueCertificateRequest;
use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_tests::bench::process_cpu;
use podca_tests::process::{DevOptions, DevProcess, csr_for, podca_binary_release};
use podca_tests::verify::leaf_uris;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use x509_parser::prelude::FromDer;

const CLIENTS: usize = 64;
/// The signers (name, trust domain); A has the first alone.
const SIGNERS: [(&str, &str); 2] = [
    ("example.com/mesh-a", "a.mesh.test"),
    ("example.com/mesh-b", "b.mesh.test"),
];
/// Tenants of each of B's signers.
const TENANTS_PER_SIGNER: usize = 10;
/// Tenants of the memory measurement's signer.
const MEMORY_TENANTS: usize = 100;
/// Warm-up issuances from each namespace before the second memory reading.
const WARM_UP_PER_NAMESPACE: usize = 3;
/// From `ready` (or the warm-up's end) to a memory reading.
const SETTLE: Duration = Duration::from_secs(3);
/// The caller's service account (every namespace).
const SERVICE_ACCOUNT: &str = "web";

fn main() {
    let only = std::env::var("PODCA_BENCH_ONLY").unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // Built (or found) before any start-up is timed.
    podca_binary_release();
    if only.is_empty() || only == "throughput" {
        runtime.block_on(throughput());
    }
    if only.is_empty() || only == "memory" {
        runtime.block_on(memory());
    }
}

/// The number in the environment variable `name`, or `default`.
fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The name (and only namespace) of tenant `i` of signer `s` (0: a, 1: b); A's clients and the
/// memory baseline call from the same namespaces with no tenants configured.
fn tenant(s: usize, i: usize) -> String {
    format!("{}-t{i}", ["a", "b"][s])
}

/// A `podca dev` config: the first `signers` of [`SIGNERS`], each with `tenants` tenants (each
/// tenant's CA a `[cas.<tenant>]` of its own, made by podca dev on its first start); a second
/// signer signs with a CA of its own too. No per-identity rate limit: 64 clients of few
/// identities measure podca, not its limit.
fn config(signers: usize, tenants: usize) -> String {
    let mut out = String::new();
    for s in 0..signers {
        if s > 0 {
            out += &format!("[cas.own-{}]\n", ["a", "b"][s]);
        }
        for i in 0..tenants {
            out += &format!("[cas.{}]\n", tenant(s, i));
        }
    }
    for (s, (signer, trust_domain)) in SIGNERS.iter().enumerate().take(signers) {
        out += &format!("\n[signers.\"{signer}\"]\ntrust_domain = \"{trust_domain}\"\n");
        if s > 0 {
            out += &format!("ca = \"own-{}\"\n", ["a", "b"][s]);
        }
        if tenants > 0 {
            out += "untenanted = \"signer\"\n";
        }
        for i in 0..tenants {
            let name = tenant(s, i);
            out += &format!("[signers.\"{signer}\".tenants.{name}]\nnamespaces = [\"{name}\"]\n");
        }
    }
    out += &format!(
        "\n[grpc]\nsigner = \"{}\"\nrate_limit_per_identity = 0\nmax_connections_per_peer = 4096\n",
        SIGNERS[0].0
    );
    if signers > 1 {
        let names: Vec<String> = SIGNERS[..signers]
            .iter()
            .map(|(name, _)| format!("\"{name}\""))
            .collect();
        out += &format!("signers = [{}]\n", names.join(", "));
    }
    out
}

/// A release `podca dev` with `config`, and how long it took to print `ready`.
fn start_dev(config: &str) -> (DevProcess, Duration) {
    let started = Instant::now();
    let dev = DevProcess::start_with(DevOptions {
        release: true,
        config: Some(config),
        ..Default::default()
    });
    (dev, started.elapsed())
}

/// One caller: its connection, its CSR, whom it asks and as whom.
#[derive(Clone)]
struct Caller {
    client: PodCaClient<Channel>,
    csr: Vec<u8>,
    signer: &'static str,
    namespace: String,
    namespace_value: AsciiMetadataValue,
}

impl Caller {
    async fn new(dev: &DevProcess, signer: &'static str, namespace: String) -> Caller {
        let channel = Endpoint::from_shared(format!("http://{}", dev.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Caller {
            client: PodCaClient::new(channel),
            csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
            signer,
            namespace_value: namespace.parse().unwrap(),
            namespace,
        }
    }

    /// One `IssueCertificate`; panics, naming the caller, if it fails.
    async fn issue(&mut self) -> podca_proto::podca::v1::IssueCertificateResponse {
        let mut request = tonic::Request::new(IssueCertificateRequest {
            csr: self.csr.clone(),
            signer_name: self.signer.into(),
            ..Default::default()
        });
        let metadata = request.metadata_mut();
        metadata.insert("x-podca-namespace", self.namespace_value.clone());
        metadata.insert(
            "x-podca-service-account",
            AsciiMetadataValue::from_static(SERVICE_ACCOUNT),
        );
        match self.client.issue_certificate(request).await {
            Ok(answer) => answer.into_inner(),
            Err(status) => panic!(
                "IssueCertificate for {} as {}/{SERVICE_ACCOUNT} failed: {status:?}",
                self.signer, self.namespace
            ),
        }
    }
}

/// A process under measurement and its 64 callers.
struct Side {
    label: &'static str,
    dev: DevProcess,
    callers: Vec<Caller>,
}

/// A measuring window's outcome.
struct Window {
    rate: f64,
    cpu_us_per_cert: f64,
    p50: Duration,
    p99: Duration,
}

/// The callers of `side` issuing in a loop for `seconds`; a failed call panics.
async fn window(side: &Side, seconds: u64) -> Window {
    let cpu_before = process_cpu(side.dev.pid());
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = side
        .callers
        .iter()
        .cloned()
        .map(|mut caller| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let at = Instant::now();
                    caller.issue().await;
                    latencies.push(at.elapsed());
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
    let cpu = process_cpu(side.dev.pid()) - cpu_before;
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    Window {
        rate: latencies.len() as f64 / elapsed.as_secs_f64(),
        cpu_us_per_cert: cpu.as_secs_f64() * 1e6 / latencies.len().max(1) as f64,
        p50: pct(0.5),
        p99: pct(0.99),
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// Part 1: A (one CA) against B (2 signers × 10 tenants) in alternating windows.
async fn throughput() {
    let seconds = env_number("PODCA_BENCH_SECONDS", 5u64);
    let rounds = env_number("PODCA_BENCH_ROUNDS", 5usize).max(1);
    let (a, a_startup) = start_dev(&config(1, 0));
    let (b, b_startup) = start_dev(&config(2, TENANTS_PER_SIGNER));
    // Caller i: signer i % 2, tenant (i / 2) % 10 of it, in B; the same namespace, of A's one
    // signer, in A.
    let mut sides = Vec::new();
    for (label, dev, signers) in [("A", a, 1), ("B", b, 2)] {
        let mut callers = Vec::with_capacity(CLIENTS);
        for i in 0..CLIENTS {
            let (s, t) = (i % 2, (i / 2) % TENANTS_PER_SIGNER);
            callers.push(Caller::new(&dev, SIGNERS[s % signers].0, tenant(s, t)).await);
        }
        sides.push(Side {
            label,
            dev,
            callers,
        });
    }
    // One call per caller, outside the windows: each certificate is in the trust domain the
    // side should sign in, from the CA it should sign with (B: the caller's tenant's, so 20
    // CAs' anchors; A: one CA's).
    for side in &mut sides {
        let mut anchors = BTreeSet::new();
        for (i, caller) in side.callers.iter_mut().enumerate() {
            let issued = caller.issue().await;
            let (s, t) = (i % 2, (i / 2) % TENANTS_PER_SIGNER);
            let want = match side.label {
                "A" => format!(
                    "spiffe://{}/ns/{}/sa/{SERVICE_ACCOUNT}",
                    SIGNERS[0].1,
                    tenant(s, t)
                ),
                _ => format!(
                    "spiffe://{}.{}/ns/{}/sa/{SERVICE_ACCOUNT}",
                    tenant(s, t),
                    SIGNERS[s].1,
                    tenant(s, t)
                ),
            };
            assert_eq!(
                leaf_uris(&issued.certificate_chain_pem),
                [want],
                "{}",
                side.label
            );
            anchors.insert(issued.trust_anchors_pem);
        }
        let cas = match side.label {
            "A" => 1,
            _ => 2 * TENANTS_PER_SIGNER,
        };
        assert_eq!(anchors.len(), cas, "{}: distinct CAs answering", side.label);
    }

    println!(
        "tenants throughput: plaintext podca.v1 IssueCertificate to release podca dev, \
         {CLIENTS} clients each, P-256 CSRs, {rounds} rounds of {seconds} s windows (A then B)"
    );
    println!(
        "A: 1 signer, no tenants (one CA; ready in {:.2} s); B: 2 signers x {TENANTS_PER_SIGNER} \
         tenants ({} tenant CAs + 2 signer CAs; ready in {:.2} s), every request signed by a \
         tenant's CA",
        a_startup.as_secs_f64(),
        2 * TENANTS_PER_SIGNER,
        b_startup.as_secs_f64()
    );
    let (mut rates, mut cpu) = ([vec![], vec![]], [vec![], vec![]]);
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let mut line = format!("round {round}:");
        for (i, side) in sides.iter().enumerate() {
            let w = window(side, seconds).await;
            line += &format!(
                " {} {:.0}/s (p50 {}, p99 {}, {:.0} us CPU/cert){}",
                side.label,
                w.rate,
                ms(w.p50),
                ms(w.p99),
                w.cpu_us_per_cert,
                if i == 0 { "," } else { ";" }
            );
            rates[i].push(w.rate);
            cpu[i].push(w.cpu_us_per_cert);
        }
        let ratio = rates[1][round - 1] / rates[0][round - 1];
        ratios.push(ratio);
        println!("{line} B/A {ratio:.3}");
    }
    let (rate_a, rate_b) = (median(&rates[0]), median(&rates[1]));
    let (min, max) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    println!(
        "throughput medians of {rounds}: A {rate_a:.0}/s, B {rate_b:.0}/s, B/A = {:.3} (rounds \
         {min:.3}-{max:.3}; target: B within 5 % of A)",
        rate_b / rate_a
    );
    let reference = reference_us();
    let (cpu_a, cpu_b) = (median(&cpu[0]), median(&cpu[1]));
    println!(
        "server CPU per certificate, medians: A {cpu_a:.0} us ({:.2}x raw), B {cpu_b:.0} us \
         ({:.2}x raw), B/A = {:.3}; raw = P-256 CSR verification + P-256 signature, aws-lc-rs on \
         one thread, this run: {reference:.1} us",
        cpu_a / reference,
        cpu_b / reference,
        cpu_b / cpu_a
    );
    for side in sides {
        let status = side.dev.stop();
        assert!(
            status.success(),
            "{}: podca dev exited {status}",
            side.label
        );
    }
}

/// VmRSS of process `pid`, in kB.
fn vm_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Part 2: an idle `podca dev` with one CA against one with 100 tenant CAs.
async fn memory() {
    let mut readings = Vec::new();
    for tenants in [0, MEMORY_TENANTS] {
        let (dev, startup) = start_dev(&config(1, tenants));
        tokio::time::sleep(SETTLE).await;
        let idle = vm_rss_kb(dev.pid());
        // The same calls on both: WARM_UP_PER_NAMESPACE from each of the 100 namespaces, to
        // the tenants' CAs or (no tenants) the signer's one.
        let mut anchors = BTreeSet::new();
        for i in 0..MEMORY_TENANTS {
            let mut caller = Caller::new(&dev, SIGNERS[0].0, tenant(0, i)).await;
            for _ in 0..WARM_UP_PER_NAMESPACE {
                anchors.insert(caller.issue().await.trust_anchors_pem);
            }
        }
        assert_eq!(anchors.len(), tenants.max(1), "distinct CAs answering");
        tokio::time::sleep(SETTLE).await;
        let warm = vm_rss_kb(dev.pid());
        let status = dev.stop();
        assert!(status.success(), "podca dev exited {status}");
        readings.push((tenants, startup, idle, warm));
    }
    println!(
        "tenants memory: VmRSS of release podca dev, 1 signer; idle = {} s after ready, warm = \
         {} s after {WARM_UP_PER_NAMESPACE} IssueCertificate from each of {MEMORY_TENANTS} \
         namespaces",
        SETTLE.as_secs(),
        SETTLE.as_secs()
    );
    for (tenants, startup, idle, warm) in &readings {
        println!(
            "{tenants} tenants ({} CA(s)): ready in {:.2} s, idle {:.1} MiB, warm {:.1} MiB",
            tenants + 1,
            startup.as_secs_f64(),
            mib(*idle),
            mib(*warm)
        );
    }
    let (base, many) = (&readings[0], &readings[1]);
    println!(
        "memory for {MEMORY_TENANTS} tenants over none: idle {:+.1} MiB, warm {:+.1} MiB \
         (target: <= 10 MB)",
        mib(many.2) - mib(base.2),
        mib(many.3) - mib(base.3)
    );
}

/// One P-256 CSR-signature verification plus one P-256 signature (aws-lc-rs, one thread), in
/// µs: the work issuance cannot avoid.
fn reference_us() -> f64 {
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
    let verify_us = per_op_us(|| key.verify(&info, &signature).unwrap());
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let ca = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
    // About the size of a leaf's TBSCertificate.
    let tbs = vec![0x5au8; 420];
    let sign_us = per_op_us(|| {
        std::hint::black_box(ca.sign(&rng, &tbs).unwrap());
    });
    verify_us + sign_us
}

/// µs per call of `op`, over 2 s after 1,000 calls of warm-up.
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
