//! gRPC benchmarks against a release `podca dev` (run: `cargo bench -p podca-tests --bench
//! grpc_bench`):
//!
//! 1. IssueCertificate throughput: 64 concurrent clients, one TCP connection each, P-256 CSRs,
//!    identity from dev metadata (a map lookup: the equivalent of a cached TokenReview).
//! 2. Workload API fan-out: 1,000 open FetchX509Bundles streams on the Unix socket; time from the
//!    CA reload (SIGHUP) until every stream has received the rotated bundle.
//!
//! Measured on the 2-core dev machine (release, client and server on the same cores):
//! 5,018–5,161 certificates/s with every certificate in the ledger, p50 ~12 ms, p99 ~24 ms;
//! 1,000 streams all had the rotated bundle 25–36 ms after SIGHUP. Before TCP_NODELAY on accepted
//! connections: 1,445/s, p50 44 ms.

#![allow(clippy::unwrap_used)] // a benchmark: any failure should stop it loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use podca_proto::podca::v1::IssueCertificateRequest;
use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::workload::X509BundlesRequest;
use podca_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use podca_tests::process::{DevOptions, DevProcess, csr_for};
use tonic::transport::Endpoint;

const CLIENTS: usize = 64;
const ISSUE_SECONDS: u64 = 10;
const STREAMS: usize = 1000;
const STREAMS_PER_CONNECTION: usize = 100;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dev = DevProcess::start_with(DevOptions {
        release: true,
        ..Default::default()
    });
    runtime.block_on(issue_throughput(&dev));
    runtime.block_on(fan_out(&dev));
}

async fn issue_throughput(dev: &DevProcess) {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(ISSUE_SECONDS);
    let mut latencies = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let channel = Endpoint::from_shared(format!("http://{}", dev.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = PodCaClient::new(channel);
        let csr = csr_for(&rcgen::KeyPair::generate().unwrap());
        let (done, failed) = (Arc::clone(&done), Arc::clone(&failed));
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let mut request = tonic::Request::new(IssueCertificateRequest {
                    csr: csr.clone(),
                    ..Default::default()
                });
                request
                    .metadata_mut()
                    .insert("x-podca-namespace", "default".parse().unwrap());
                request
                    .metadata_mut()
                    .insert("x-podca-service-account", "default".parse().unwrap());
                let start = Instant::now();
                match client.issue_certificate(request).await {
                    Ok(_) => {
                        done.fetch_add(1, Ordering::Relaxed);
                        lat.push(start.elapsed());
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            lat
        }));
    }
    let start = Instant::now();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let n = done.load(Ordering::Relaxed);
    println!(
        "IssueCertificate, {CLIENTS} clients, P-256, {ISSUE_SECONDS} s: {n} issued ({:.0}/s), {} failed, \
         latency p50 {:?} p99 {:?}",
        n as f64 / elapsed,
        failed.load(Ordering::Relaxed),
        pct(0.5),
        pct(0.99)
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0);
}

async fn fan_out(dev: &DevProcess) {
    let mut streams = Vec::new();
    for _ in 0..STREAMS / STREAMS_PER_CONNECTION {
        let channel = dev.unix_channel().await;
        for _ in 0..STREAMS_PER_CONNECTION {
            let mut client = SpiffeWorkloadApiClient::new(channel.clone());
            let mut request = tonic::Request::new(X509BundlesRequest {});
            request
                .metadata_mut()
                .insert("workload.spiffe.io", "true".parse().unwrap());
            let mut stream = client
                .fetch_x509_bundles(request)
                .await
                .unwrap()
                .into_inner();
            let first = stream.message().await.unwrap().unwrap();
            streams.push((stream, first));
        }
    }
    println!("Workload API: {} streams open", streams.len());
    let (tx, mut rx) = tokio::sync::mpsc::channel(STREAMS);
    for (mut stream, first) in streams {
        let tx = tx.clone();
        tokio::spawn(async move {
            let next = stream.message().await.unwrap().unwrap();
            assert_ne!(next.bundles, first.bundles);
            let _ = tx.send(Instant::now()).await;
        });
    }
    let start = Instant::now();
    // replace_ca_and_reload blocks until podca dev has printed the reload line.
    tokio::task::block_in_place(|| dev.replace_ca_and_reload());
    let mut last = start;
    for _ in 0..STREAMS {
        let at = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("every stream gets the rotated bundle within 60 s")
            .unwrap();
        last = last.max(at);
    }
    println!(
        "Workload API fan-out: {STREAMS} streams received the rotated bundle {:?} after the CA \
         files were replaced and SIGHUP sent (includes writing a new CA to disk)",
        last - start
    );
}
