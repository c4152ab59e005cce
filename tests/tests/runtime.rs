//! The runtime with the real `podca serve` binary on the API emulator (issue #38): `/readyz`
//! answers 503 until the CA is loaded and the controller's watches have synced (the first list
//! is held back on purpose), 200 after, and 503 again from the moment shutdown begins; one
//! SIGTERM drains the gRPC API, OIDC discovery and the controller (with a status write in
//! flight) within `--drain-timeout`, with no tokio task left alive and every listener closed.

#![allow(clippy::unwrap_used)]

use std::net::TcpStream;
use std::time::{Duration, Instant};

use podca_tests::EmulatorConfig;
use podca_tests::cluster::{Cluster, ClusterConfig};
use podca_tests::emulator::{ApiMode, FaultScope, Res};
use podca_tests::process::{ServeProcess, free_port, http_get, podca_ca_init};

const SIGNER: &str = "example.com/workload";

/// Polls `/readyz` until `want(code, body)` holds; returns the first answer seen and the one
/// that held. Panics after `timeout`.
fn wait_readyz(
    port: u16,
    timeout: Duration,
    want: impl Fn(u16, &str) -> bool,
) -> ((u16, String), (u16, String)) {
    let deadline = Instant::now() + timeout;
    let mut first = None;
    loop {
        if let Some((code, body)) = http_get(port, "/readyz") {
            first.get_or_insert_with(|| (code, body.clone()));
            if want(code, &body) {
                return (first.unwrap(), (code, body));
            }
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never matched; first answer {first:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_watches_and_sigterm_drains_every_component() {
    let c = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            ..Default::default()
        },
        podca_groups: &["system:authenticated"],
        signers: &[SIGNER],
    })
    .await;
    let ca_dir = c.dir.path().join("ca");
    podca_ca_init(&ca_dir);
    let oidc = free_port();
    let config = c.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
             [ledger]\nbackend = \"none\"\n\n[jwt]\nenabled = true\n\
             issuer = \"https://podca.example\"\noidc_listen = \"127.0.0.1:{oidc}\"\n",
            ca_dir.display().to_string()
        ),
    )
    .unwrap();
    // The controller's first list of PodCertificateRequests takes 3 s.
    c.emu.hang_requests(
        Duration::from_secs(3),
        1,
        FaultScope::MethodPath("GET".into(), "/podcertificaterequests".into()),
    );
    let log = c.dir.path().join("serve.log");
    let started = Instant::now();
    let mut serve =
        ServeProcess::start_logged(&config, &c.kubeconfig, &["--drain-timeout", "8s"], &log);

    // The admin listener opens last: the CA is loaded and gRPC and OIDC listen by then, but the
    // watches have not synced.
    let (first, ready) = wait_readyz(serve.admin, Duration::from_secs(30), |code, _| code == 200);
    assert_eq!(
        first,
        (503, "not ready: waiting for controller\n".to_owned()),
        "the first answer, {:?} after start",
        started.elapsed()
    );
    assert_eq!(ready, (200, "ok\n".to_owned()));
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "ready before the held list returned: {:?}",
        started.elapsed()
    );
    assert!(TcpStream::connect(("127.0.0.1", serve.grpc)).is_ok());
    assert!(TcpStream::connect(("127.0.0.1", oidc)).is_ok());

    // A status write held for 2 s is in flight when SIGTERM arrives.
    c.emu
        .hang_requests(Duration::from_secs(2), 1, FaultScope::StatusWrites);
    let held = c.emu.counters().held_requests;
    c.file_pcr("in-flight", SIGNER).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.emu.counters().held_requests == held {
        assert!(Instant::now() < deadline, "the status write never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    serve.signal("TERM");
    let stopping = Instant::now();
    let (_, shutting_down) =
        wait_readyz(serve.admin, Duration::from_secs(5), |code, _| code != 200);
    assert_eq!(
        shutting_down,
        (503, "not ready: shutting down\n".to_owned())
    );
    let status = serve.wait_exit(Duration::from_secs(20));
    let took = stopping.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(8), "drained in {took:?}");
    // The write in flight was finished, not dropped.
    let pcr = c.emu.get_object(Res::Pcr, "apps", "in-flight").unwrap();
    assert!(
        pcr["status"]["certificateChain"].is_string(),
        "the in-flight PCR was not issued: {pcr}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    let stopped = log
        .lines()
        .find(|l| l.contains("stopped: every task drained"))
        .unwrap_or_else(|| panic!("no drain line in the log:\n{log}"));
    assert!(stopped.contains("alive_tasks=0"), "{stopped}");
    for port in [serve.admin, serve.grpc, oidc] {
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} still accepts"
        );
    }
}
