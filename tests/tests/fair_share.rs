//! Fair sharing (issue #12, item 4): a gRPC flood from one identity does not stop
//! PodCertificateRequests from being issued within their usual latency.
//!
//! The real `podca serve` against the API emulator, with the per-identity rate limit switched
//! off (`rate_limit_per_identity = 0`), so that the flood really signs as fast as podca lets it
//! and only the signing share (`grpc/src/ratelimit.rs` `SigningShare`: gRPC signs on at most
//! one core fewer than the machine has; PCR signing never waits for it) protects the
//! controller. PCR settle latency (filed → Issued) is measured without and with the flood in
//! the same test; the flood's PCRs must settle within 3 × the quiet maximum + 1 s.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use podca_proto::podca::v1::IssueCertificateRequest;
use podca_tests::EmulatorConfig;
use podca_tests::cluster::{Cluster, ClusterConfig, PODCA_USER};
use podca_tests::emulator::{ApiMode, PolicyRule, ServiceAccountToken, Subject, new_uid};
use podca_tests::process::{ServeProcess, csr_for, podca_binary, podca_bundle};
use tonic::Request;

const SIGNER: &str = "example.com/workload";
/// PCRs filed one after the other in each phase.
const PCRS: usize = 8;
/// Concurrent gRPC callers in the flood (one identity).
const FLOODERS: usize = 32;

/// Files `PCRS` requests one by one, each waited for; their settle latencies.
async fn settle_latencies(cluster: &Cluster, phase: &str) -> Vec<Duration> {
    let mut latencies = Vec::new();
    for i in 0..PCRS {
        let name = format!("{phase}-{i}");
        let filed = Instant::now();
        cluster.file_pcr(&name, SIGNER).await;
        cluster.wait_issued(&name, Duration::from_secs(30)).await;
        latencies.push(filed.elapsed());
    }
    latencies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_flood_from_one_identity_does_not_hold_up_pcr_signing() {
    let cluster = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            ..Default::default()
        },
        podca_groups: &["system:serviceaccounts"],
        signers: &[SIGNER],
    })
    .await;
    cluster.emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
    );
    let ca_dir = cluster.dir.path().join("ca");
    let init = Command::new(podca_binary())
        .args(["ca", "init", "--dir"])
        .arg(&ca_dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(init.success());
    let config = cluster.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
             [grpc]\n{}rate_limit_per_identity = 0\n",
            ca_dir.display().to_string(),
            podca_tests::tls::GRPC_TLS_CONFIG
        ),
    )
    .unwrap();
    let serve = ServeProcess::start(&config, &cluster.kubeconfig, &[], &[]);
    let anchors = podca_bundle(&ca_dir);
    let token = cluster.emu.add_service_account_token(ServiceAccountToken {
        namespace: "default".into(),
        service_account: "flood".into(),
        service_account_uid: new_uid(),
        audiences: vec!["podca".into()],
        expires: cluster.emu.now() + time::Duration::hours(1),
        pod_name: None,
        pod_uid: None,
        node_name: None,
        node_uid: None,
        credential_id: new_uid(),
    });

    // Warm up (first watch events, TLS, TokenReview cache), then the quiet baseline.
    settle_latencies(&cluster, "warmup").await;
    let quiet = settle_latencies(&cluster, "quiet").await;

    // The flood: its own thread and runtime, so that it competes with podca for the CPU, not
    // with the emulator for this test's runtime.
    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicUsize::new(0));
    let flood = {
        let (stop, issued, grpc) = (Arc::clone(&stop), Arc::clone(&issued), serve.grpc);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let csr = csr_for(&rcgen::KeyPair::generate().unwrap());
                let client = podca_tests::tls::client(grpc, &anchors).await;
                let mut callers = Vec::new();
                for _ in 0..FLOODERS {
                    let (mut client, csr, token) = (client.clone(), csr.clone(), token.clone());
                    let (stop, issued) = (Arc::clone(&stop), Arc::clone(&issued));
                    callers.push(tokio::spawn(async move {
                        while !stop.load(Ordering::Relaxed) {
                            let mut request = Request::new(IssueCertificateRequest {
                                csr: csr.clone(),
                                ..Default::default()
                            });
                            request.metadata_mut().insert(
                                "authorization",
                                format!("Bearer {token}").parse().unwrap(),
                            );
                            if client.issue_certificate(request).await.is_ok() {
                                issued.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                }
                for caller in callers {
                    caller.await.unwrap();
                }
            });
        })
    };
    // Let the flood reach its pace before measuring.
    let ramp = Instant::now();
    while issued.load(Ordering::Relaxed) < 200 {
        assert!(
            ramp.elapsed() < Duration::from_secs(30),
            "the flood never got going ({} issued)",
            issued.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during_flood_started = (Instant::now(), issued.load(Ordering::Relaxed));
    let flooded = settle_latencies(&cluster, "flooded").await;
    let flood_rate = (issued.load(Ordering::Relaxed) - during_flood_started.1) as f64
        / during_flood_started.0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();

    let quiet_max = quiet.iter().max().copied().unwrap();
    let bound = quiet_max * 3 + Duration::from_secs(1);
    eprintln!(
        "PCR settle latency: quiet {quiet:?}; during a flood of {flood_rate:.0} gRPC \
         certificates/s: {flooded:?}; bound {bound:?}"
    );
    assert!(
        flood_rate > 50.0,
        "the flood must really issue to mean anything ({flood_rate:.0}/s)"
    );
    for (i, latency) in flooded.iter().enumerate() {
        assert!(
            *latency <= bound,
            "PCR flooded-{i} took {latency:?} during the flood, over 3 × {quiet_max:?} + 1 s"
        );
    }
    drop(serve);
}
