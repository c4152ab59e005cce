//! End-to-end with the real `podca serve` binary: two processes with leader election against the
//! API emulator. The binary is built by the test (or taken from PODCA_BIN).

use std::time::{Duration, Instant};

use podca_tests::cluster::Cluster;
use podca_tests::emulator::{ApiMode, Res};
use podca_tests::process::{ServeProcess, http_get, leader_elect_flags};

const SIGNER: &str = "example.com/workload";

/// `podca serve` with leader election on short Lease timings, as `identity`.
fn start_serve(
    config: &std::path::Path,
    kubeconfig: &std::path::Path,
    identity: &str,
) -> ServeProcess {
    ServeProcess::start(
        config,
        kubeconfig,
        &leader_elect_flags(identity, ["4s", "3s", "1s"]),
        &[],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_binaries_fail_over_and_release_the_lease_on_sigterm() {
    // podca authenticated, but not in `system:serviceaccounts`: it reads bundles only through
    // its signer role.
    let (c, ca_dir) = Cluster::for_serve(SIGNER, "default").await;
    let (emu, kubeconfig) = (&c.emu, &c.kubeconfig);
    let config = c.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            // Three replicas on one data directory: its redb ledger admits one process, so none
            // here (tests/tests/ledger_serve.rs runs replicas on a shared PostgreSQL ledger).
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
             [ledger]\nbackend = \"none\"\n",
            ca_dir.display().to_string()
        ),
    )
    .expect("config");
    let holder = || {
        emu.get_object(Res::Lease, "default", "podca-controller")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
            .filter(|h| !h.is_empty())
    };

    let mut a = start_serve(&config, kubeconfig, "a");
    let deadline = Instant::now() + Duration::from_secs(30);
    while holder().as_deref() != Some("a") {
        assert!(Instant::now() < deadline, "a never took the Lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut b = start_serve(&config, kubeconfig, "b");
    c.file_pcr("one", SIGNER).await;
    c.wait_issued("one", Duration::from_secs(30)).await;
    assert_eq!(holder().as_deref(), Some("a"));

    // The admin listener of the leader.
    let (code, _) = http_get(a.admin, "/livez").expect("livez");
    assert_eq!(code, 200);
    let (code, _) = http_get(a.admin, "/readyz").expect("readyz");
    assert_eq!(code, 200);
    // The counter moves just after the status write the emulator saw: give it a moment.
    let issued = "podca_pcr_issued_total{signer=\"example.com/workload\",reason=\"Issued\"} 1";
    let deadline = Instant::now() + Duration::from_secs(5);
    let metrics = loop {
        let (code, metrics) = http_get(a.admin, "/metrics").expect("metrics");
        assert_eq!(code, 200);
        if metrics.contains(issued) || Instant::now() > deadline {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(metrics.contains(issued), "{metrics}");
    assert!(
        metrics.contains("podca_ca_not_after_timestamp_seconds"),
        "{metrics}"
    );
    assert!(metrics.contains("podca_leader 1"), "{metrics}");
    // One signer: its CA is its own.
    assert!(
        metrics.contains("podca_ca_signers{ca=\"default\"} 1"),
        "{metrics}"
    );
    let (_, standby) = http_get(b.admin, "/metrics").expect("standby metrics");
    assert!(standby.contains("podca_leader 0"), "{standby}");
    // A standby has no watches to sync and serves gRPC: it is ready too.
    let (code, body) = http_get(b.admin, "/readyz").expect("standby readyz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));

    // SIGTERM: a drains, releases the Lease and exits 0; b takes over well within the lease.
    a.signal("TERM");
    let status = a.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let stopped = Instant::now();
    c.file_pcr("two", SIGNER).await;
    c.wait_issued("two", Duration::from_secs(20)).await;
    let took = stopped.elapsed();
    assert_eq!(holder().as_deref(), Some("b"));
    eprintln!("standby issued {took:?} after the leader stopped");

    // A crash (SIGKILL, no release): a new process takes over after the lease expires.
    b.signal("KILL");
    b.wait_exit(Duration::from_secs(10));
    let _c = start_serve(&config, kubeconfig, "c");
    let killed = Instant::now();
    c.file_pcr("three", SIGNER).await;
    c.wait_issued("three", Duration::from_secs(30)).await;
    assert!(
        killed.elapsed() < Duration::from_secs(4 + 15),
        "{:?}",
        killed.elapsed()
    );
    assert_eq!(holder().as_deref(), Some("c"));
    assert_eq!(
        emu.counters().validation_rejections,
        0,
        "{:?}",
        emu.counters().rejections_by_cause
    );
}

/// `GET path` on the admin port with `Authorization: Bearer token`: the status and body.
fn get_with_token(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the admin port");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .expect("the request is sent");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("an answer");
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {out}"));
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (code, body.to_owned())
}

/// Issue #40 item 6, as a scraper without the grant would try it: with `[admin] metrics_auth =
/// "kubernetes"`, `/metrics` answers 401 without a token and with a forged one, 403 for a
/// service account that may not `get` `/metrics`, the metrics for one that may (the emulator
/// answers podca's TokenReview and SubjectAccessReview as kube-apiserver does), and 503 while
/// podca may not ask (fail closed); `/livez` and `/readyz` stay open throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_token_whose_user_may_get_metrics() {
    use podca_tests::cluster::PODCA_USER;
    use podca_tests::emulator::{PolicyRule, ServiceAccountToken, Subject};
    let c = Cluster::start(ApiMode::V1Only, &[SIGNER]).await;
    let emu = &c.emu;
    // The scraper's ClusterRole, bound to Prometheus' service account (docs/reference.md, "Authenticated /metrics").
    emu.grant(
        Subject::User("system:serviceaccount:monitoring:prometheus".into()),
        PolicyRule::non_resource(&["/metrics"], &["get"]),
    );
    let token_of = |namespace: &str, service_account: &str| {
        let uid = emu.add_service_account(namespace, service_account);
        emu.add_service_account_token(ServiceAccountToken {
            namespace: namespace.into(),
            service_account: service_account.into(),
            service_account_uid: uid,
            // The API server's own audience, as a pod's automounted token carries it.
            audiences: emu.config().api_audiences.clone(),
            expires: time::OffsetDateTime::now_utc() + time::Duration::hours(1),
            pod_name: None,
            pod_uid: None,
            node_name: None,
            node_uid: None,
            credential_id: format!("{namespace}-{service_account}"),
        })
    };
    let prometheus = token_of("monitoring", "prometheus");
    let curious = token_of("apps", "curious");
    let ca_dir = c.dir.path().join("ca");
    podca_tests::process::podca_ca_init(&ca_dir);
    let config = c.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
             [ledger]\nbackend = \"none\"\n\n[admin]\nmetrics_auth = \"kubernetes\"\n",
            ca_dir.display().to_string()
        ),
    )
    .expect("config");
    let serve = ServeProcess::start(&config, &c.kubeconfig, &["--no-grpc"], &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while get_with_token(serve.admin, "/readyz", None).0 != 200 {
        assert!(Instant::now() < deadline, "podca serve never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // podca may not ask the SubjectAccessReview yet: fail closed, and no verdict is kept.
    let (code, body) = get_with_token(serve.admin, "/metrics", Some(&prometheus));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("could not be asked"), "{body}");
    // podca's ClusterRole with deploy/components/metrics-auth.
    emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
            &["create"],
        ),
    );
    let cases: [(Option<&str>, u16, &str); 4] = [
        (None, 401, "Unauthorized"),
        (Some("forged.token"), 401, "Unauthorized"),
        (
            Some(&curious),
            403,
            "may not get the non-resource URL /metrics",
        ),
        (
            Some(&prometheus),
            200,
            "podca_ca_not_after_timestamp_seconds",
        ),
    ];
    for (token, status, says) in cases {
        let (code, body) = get_with_token(serve.admin, "/metrics", token);
        assert_eq!(code, status, "{body}");
        assert!(body.contains(says), "{status}: {body}");
        for probe in ["/livez", "/readyz"] {
            assert_eq!(get_with_token(serve.admin, probe, None).0, 200, "{probe}");
        }
    }
    // Answered again from the cache: the same verdicts.
    assert_eq!(
        get_with_token(serve.admin, "/metrics", Some(&curious)).0,
        403
    );
    assert_eq!(
        get_with_token(serve.admin, "/metrics", Some(&prometheus)).0,
        200
    );
}
