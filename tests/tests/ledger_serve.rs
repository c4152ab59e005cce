//! The ledger through the real `podca serve` binary against the API emulator and a real
//! PostgreSQL server: the Must-show's 10,000-PCR burst (plain, with the server restarted
//! midway, and with `podca serve` killed with SIGKILL midway and restarted), two replicas
//! sharing one ledger (the standby's gRPC issuance recorded too), the audit question answered
//! by `podca ledger list` on both backends, and refusals in the audit log (podca.v1 and, with
//! `podca dev`, the SPIFFE Workload API). `podca issue --config` records to the configured
//! `[ledger]`.
//!
//! Each burst takes about a minute in a debug build on a loaded 2-core machine; `--nocapture`
//! shows where it went (`burst_report`). Timing the burst is the controller bench's job.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use podca_proto::podca::v1::IssueCertificateRequest;
use podca_tests::cluster::{Cluster, PODCA_USER};
use podca_tests::emulator::{PolicyRule, Res, ServiceAccountToken, Subject};
use podca_tests::postgres::Postgres;
use podca_tests::process::{csr_for, free_port, podca_binary, podca_bundle};
use serde_json::json;

const SIGNER: &str = "example.com/workload";
const NAMESPACE: &str = "payments";

/// The emulator, a CA directory, a config, and (optionally) PostgreSQL.
struct Setup {
    cluster: Cluster,
    ca_dir: PathBuf,
    config: PathBuf,
    pg: Option<Postgres>,
    url_file: PathBuf,
    stubs: Vec<String>,
}

async fn setup(postgres: bool) -> Setup {
    let (cluster, ca_dir) = Cluster::for_serve(SIGNER, NAMESPACE).await;
    cluster.emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
    );
    let dir = cluster.dir.path().to_owned();
    let pg = postgres.then(Postgres::start);
    let url_file = dir.join("ledger-url");
    let ledger = match &pg {
        Some(pg) => {
            std::fs::write(&url_file, pg.unix_url()).unwrap();
            format!(
                "[ledger]\nbackend = \"postgres\"\nurl_file = {:?}\ntls = \"disable\"\n",
                url_file.display().to_string()
            )
        }
        // The default: redb in the CA data directory.
        None => String::new(),
    };
    let config = dir.join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
             [grpc]\n{}\n{ledger}",
            ca_dir.display().to_string(),
            podca_tests::tls::GRPC_TLS_CONFIG,
        ),
    )
    .unwrap();
    let stubs = (0..8)
        .map(|_| {
            let key = rcgen::KeyPair::generate().unwrap();
            base64::engine::general_purpose::STANDARD.encode(csr_for(&key))
        })
        .collect();
    Setup {
        cluster,
        ca_dir,
        config,
        pg,
        url_file,
        stubs,
    }
}

/// A `podca serve` process logging to a file; killed when dropped.
struct Serve {
    child: Child,
    admin: u16,
    grpc: u16,
    log: PathBuf,
}

impl Serve {
    fn start(s: &Setup, name: &str, extra: &[&str]) -> Serve {
        let admin = free_port();
        let grpc = free_port();
        let log = s.cluster.dir.path().join(format!("{name}.log"));
        let child = Command::new(podca_binary())
            .args(["serve", "--config"])
            .arg(&s.config)
            .arg("--kubeconfig")
            .arg(&s.cluster.kubeconfig)
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(extra)
            .env("POD_NAME", name)
            .env("PODCA_LOG", "warn,podca::audit=info")
            .env_remove("POD_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        let mut serve = Serve {
            child,
            admin,
            grpc,
            log,
        };
        podca_tests::process::wait_listening(&mut serve.child, grpc, &serve.log);
        serve
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn metrics(&self) -> String {
        podca_tests::process::http_get(self.admin, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(&mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "podca serve did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.log_text());
        }
    }
}

fn pcr(name: &str, csr: &str, node: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "signerName": SIGNER, "podName": format!("pod-{name}"),
            "podUID": podca_tests::emulator::new_uid(),
            "serviceAccountName": "api", "serviceAccountUID": "sa-uid",
            "nodeName": node, "nodeUID": "node-uid", "maxExpirationSeconds": 86400,
            "stubPKCS10Request": csr,
        },
        "status": {},
    })
}

fn file_burst(s: &Setup, prefix: &str, count: usize) {
    for i in 0..count {
        let node = if i % 2 == 0 { "node-a" } else { "node-b" };
        s.cluster.emu.seed_object(
            Res::Pcr,
            pcr(&format!("{prefix}-{i}"), &s.stubs[i % s.stubs.len()], node),
        );
    }
}

/// Per PCR `prefix-i`: its condition type and, if Issued, the leaf's serial (hex).
fn settled(s: &Setup, prefix: &str, count: usize) -> Vec<(Option<String>, Option<String>)> {
    scan(s, prefix, count, |o| {
        o["status"]["certificateChain"].as_str().map(leaf_serial)
    })
}

/// Per PCR `prefix-i`: its condition type (no certificate parsing: the quick scan).
fn conditions(s: &Setup, prefix: &str, count: usize) -> Vec<(Option<String>, ())> {
    scan(s, prefix, count, |_| ())
}

fn scan<T>(
    s: &Setup,
    prefix: &str,
    count: usize,
    mut also: impl FnMut(&serde_json::Value) -> T,
) -> Vec<(Option<String>, T)> {
    (0..count)
        .map(|i| {
            let o = s
                .cluster
                .emu
                .get_object(Res::Pcr, NAMESPACE, &format!("{prefix}-{i}"))
                .unwrap();
            let condition = o["status"]["conditions"][0]["type"]
                .as_str()
                .map(str::to_owned);
            (condition, also(&o))
        })
        .collect()
}

fn leaf_serial(chain: &str) -> String {
    let block = pem::parse_many(chain).unwrap().remove(0);
    let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).unwrap();
    cert.raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Waits until at least `at_least` of the PCRs `prefix-0..count` are Issued and none is
/// refused or failed. Polls the emulator's counters (cheap: a 10,000-PCR scan every 100 ms
/// would take the emulator's CPU); each verdict is then confirmed PCR by PCR.
async fn wait_issued(s: &Setup, prefix: &str, at_least: usize, count: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let c = s.cluster.emu.counters();
        let refused = c.denied + c.failed > 0;
        if refused || c.issued as usize >= at_least {
            let states = conditions(s, prefix, count);
            let failed: Vec<_> = states
                .iter()
                .enumerate()
                .filter(|(_, (c, _))| c.as_deref().is_some_and(|c| c != "Issued"))
                .collect();
            assert!(failed.is_empty(), "PCRs were refused or failed: {failed:?}");
            let issued = states.iter().filter(|(c, _)| c.is_some()).count();
            if issued >= at_least {
                return;
            }
        }
        if Instant::now() >= deadline {
            // Which ones wait, and since which resourceVersions: a contiguous block of pending
            // requests that podca never saw points at the watch (or the emulator), not podca.
            let pending: Vec<String> = (0..count)
                .filter_map(|i| {
                    let name = format!("{prefix}-{i}");
                    let o = s.cluster.emu.get_object(Res::Pcr, NAMESPACE, &name)?;
                    o["status"]["conditions"][0]["type"].is_null().then(|| {
                        format!(
                            "{name}@{}",
                            o["metadata"]["resourceVersion"].as_str().unwrap_or("?")
                        )
                    })
                })
                .collect();
            panic!(
                "{}/{at_least} of {prefix}-* issued within {timeout:?}; {} pending, the first: \
                 {:?}; emulator: {} requests, {} watches opened, {} status writes",
                c.issued,
                pending.len(),
                &pending[..pending.len().min(8)],
                c.requests,
                c.watches_opened,
                c.status_writes_accepted,
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where a burst's time went (shown with `--nocapture`): the ledger's commits, podca's
/// requests to the API server.
fn burst_report(what: &str, s: &Setup, serve: &Serve, count: usize, started: Instant) {
    let metrics = serve.metrics();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let commits = value("podca_ledger_commit_seconds_count");
    let commit_seconds = value("podca_ledger_commit_seconds_sum");
    let c = s.cluster.emu.counters();
    eprintln!(
        "{what}: {count} PCRs issued after {:.1?}; {commits} ledger commits ({:.1} records, \
         {:.1} ms each on average, {commit_seconds:.1} s in all); emulator: {} requests, {} \
         watches opened, {} status writes, {} conflicts",
        started.elapsed(),
        count as f64 / commits,
        1000.0 * commit_seconds / commits,
        c.requests,
        c.watches_opened,
        c.status_writes_accepted + c.status_writes_noop,
        c.conflicts,
    );
}

/// Every Issued PCR's serial is in the ledger exactly once.
fn assert_every_serial_recorded_once(s: &Setup, prefix: &str, count: usize) {
    let pg = s.pg.as_ref().unwrap();
    let rows =
        pg.psql("select serial from podca_ledger where source = 'pcr' and outcome = 'issued'");
    let mut in_ledger: HashMap<&str, usize> = HashMap::new();
    for serial in rows.lines() {
        *in_ledger.entry(serial).or_default() += 1;
    }
    for (i, (_, serial)) in settled(s, prefix, count).iter().enumerate() {
        let serial = serial
            .as_deref()
            .unwrap_or_else(|| panic!("{prefix}-{i} has no certificate"));
        assert_eq!(
            in_ledger.get(serial),
            Some(&1),
            "{prefix}-{i}: serial {serial}"
        );
    }
}

/// The Must-show's burst size.
const BURST: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_with_postgres_records_every_serial_once() {
    const COUNT: usize = BURST;
    let s = setup(true).await;
    let started = Instant::now();
    let serve = Serve::start(&s, "podca-0", &[]);
    file_burst(&s, "p", COUNT);
    wait_issued(&s, "p", COUNT, COUNT, Duration::from_secs(300)).await;
    burst_report("plain burst", &s, &serve, COUNT, started);
    assert_every_serial_recorded_once(&s, "p", COUNT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_with_postgres_restarted_midway_records_every_serial_once() {
    const COUNT: usize = BURST;
    let s = setup(true).await;
    let started = Instant::now();
    let serve = Serve::start(&s, "podca-0", &[]);
    file_burst(&s, "b", COUNT);
    wait_issued(&s, "b", COUNT / 8, COUNT, Duration::from_secs(300)).await;
    let pg = s.pg.as_ref().unwrap();
    pg.stop();
    // While the ledger is down nothing more is answered: PCRs wait (pending, never Failed).
    let issued =
        |states: &[(Option<String>, ())]| states.iter().filter(|(c, _)| c.is_some()).count();
    // Requests that found the ledger down go back to the queue (`podca_retries_total{cause=
    // "ledger"}`): once they have, nothing settles until it is back, however often they retry.
    let ledger_retries = || {
        podca_tests::process::metric_value(
            &serve.metrics(),
            "podca_retries_total{cause=\"ledger\"}",
        )
    };
    let wait_retries = |at_least: f64| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        while ledger_retries() < at_least {
            assert!(Instant::now() < deadline, "no retry for the ledger");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // Five retries in: the status writes of records committed before the stop have landed.
    wait_retries(ledger_retries() + 5.0).await;
    let settled_early = issued(&conditions(&s, "b", COUNT));
    wait_retries(ledger_retries() + 20.0).await;
    let settled_late = issued(&conditions(&s, "b", COUNT));
    assert_eq!(
        settled_early, settled_late,
        "PCRs settled while the ledger was down"
    );
    assert!(
        settled_late < COUNT,
        "the burst ended before the ledger stopped"
    );
    pg.start_again();
    wait_issued(&s, "b", COUNT, COUNT, Duration::from_secs(300)).await;
    burst_report("burst, PostgreSQL restarted", &s, &serve, COUNT, started);
    assert_every_serial_recorded_once(&s, "b", COUNT);
    let metrics = serve.metrics();
    assert!(
        metrics.contains("podca_ledger_write_errors_total{backend=\"postgres\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podca_ledger_records_total{backend=\"postgres\",outcome=\"issued\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_killed_mid_burst_and_restarted_leaves_every_visible_certificate_recorded() {
    const COUNT: usize = BURST;
    let s = setup(true).await;
    let started = Instant::now();
    let mut first = Serve::start(&s, "podca-0", &[]);
    file_burst(&s, "k", COUNT);
    wait_issued(&s, "k", COUNT / 3, COUNT, Duration::from_secs(300)).await;
    first.kill9();
    let second = Serve::start(&s, "podca-0", &[]);
    wait_issued(&s, "k", COUNT, COUNT, Duration::from_secs(300)).await;
    burst_report(
        "burst, serve killed (the second's commits)",
        &s,
        &second,
        COUNT,
        started,
    );
    // Recorded before the status write: every certificate in a status is in the ledger. (A
    // certificate recorded just before the kill but never written is in the ledger too: it was
    // never handed out, and its PCR got another.)
    assert_every_serial_recorded_once(&s, "k", COUNT);
}

fn token(s: &Setup, namespace: &str, service_account: &str) -> String {
    s.cluster
        .emu
        .add_service_account_token(ServiceAccountToken {
            namespace: namespace.into(),
            service_account: service_account.into(),
            service_account_uid: podca_tests::emulator::new_uid(),
            audiences: vec!["podca".into()],
            expires: s.cluster.emu.now() + time::Duration::hours(1),
            pod_name: None,
            pod_uid: None,
            node_name: None,
            node_uid: None,
            credential_id: podca_tests::emulator::new_uid(),
        })
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_ledger_and_the_standby_records_grpc_issuance() {
    let s = setup(true).await;
    let lease = [
        "--leader-elect",
        "--lease-namespace",
        "default",
        "--lease-duration",
        "4s",
        "--lease-renew-deadline",
        "3s",
        "--lease-retry-period",
        "1s",
    ];
    let holder = || {
        s.cluster
            .emu
            .get_object(Res::Lease, "default", "podca-controller")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    let a = Serve::start(
        &s,
        "replica-a",
        &[&lease[..], &["--lease-identity", "a"]].concat(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while holder().as_deref() != Some("a") {
        assert!(Instant::now() < deadline, "a never took the Lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = Serve::start(
        &s,
        "replica-b",
        &[&lease[..], &["--lease-identity", "b"]].concat(),
    );
    file_burst(&s, "ha", 20);
    wait_issued(&s, "ha", 20, 20, Duration::from_secs(30)).await;
    assert_eq!(holder().as_deref(), Some("a"));

    // gRPC on the standby.
    let anchors = podca_bundle(&s.ca_dir);
    let mut client = podca_tests::tls::client(b.grpc, &anchors).await;
    let answer = client
        .issue_certificate(with_token(
            IssueCertificateRequest {
                csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
                ..Default::default()
            },
            &token(&s, NAMESPACE, "api"),
        ))
        .await
        .unwrap()
        .into_inner();
    let pg = s.pg.as_ref().unwrap();
    let row = pg.psql(&format!(
        "select replica, source, record->>'requester', identity from podca_ledger where serial = '{}'",
        answer.serial
    ));
    assert_eq!(
        row,
        "replica-b|grpc|payments/api|spiffe://cluster.local/ns/payments/sa/api"
    );
    assert_eq!(
        pg.psql("select replica, count(*) from podca_ledger where source = 'pcr' group by replica"),
        "replica-a|20"
    );
    assert_every_serial_recorded_once(&s, "ha", 20);
    drop(a);
}

/// `podca ledger list --json` with `args`, as records.
fn ledger_list(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(podca_binary())
        .args(["ledger", "list", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Files PCRs from two nodes, refuses a caller with a bad token, stops serve; then answers
/// "what did we issue to payments/api in this window, from which node, under which CA
/// generation" with `podca ledger list` over `store_args`.
async fn audit_question(s: &Setup, store_args: &[&str]) {
    let started = time::OffsetDateTime::now_utc() - time::Duration::seconds(2);
    let mut serve = Serve::start(s, "podca-0", &[]);
    file_burst(s, "q", 6);
    wait_issued(s, "q", 6, 6, Duration::from_secs(30)).await;
    // A caller with a token TokenReview does not know: refused, and in the audit log.
    let anchors = podca_bundle(&s.ca_dir);
    let mut client = podca_tests::tls::client(serve.grpc, &anchors).await;
    let refused = client
        .issue_certificate(with_token(
            IssueCertificateRequest {
                csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
                ..Default::default()
            },
            "not-a-known-token-7f3a",
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    serve.stop();
    let log = serve.log_text();
    let audit = audit_lines(&log);
    let refusal = audit
        .iter()
        .find(|a| a["event"] == "refusal")
        .unwrap_or_else(|| panic!("no refusal in the audit log: {log}"));
    assert_eq!(refusal["code"], "UNAUTHENTICATED", "{refusal}");
    assert_eq!(
        refusal["method"], "podca.v1.PodCA/IssueCertificate",
        "{refusal}"
    );
    assert!(
        !log.contains("not-a-known-token-7f3a"),
        "the token is in the log"
    );
    // The PCRs' decisions; podca's own serving certificate (source `serving`) is one too.
    let decisions = audit
        .iter()
        .filter(|a| a["event"] == "decision" && a["source"] != "serving")
        .count();
    assert_eq!(decisions, 6, "{log}");

    let since = started
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let until = (time::OffsetDateTime::now_utc() + time::Duration::seconds(2))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let identity = format!("spiffe://cluster.local/ns/{NAMESPACE}/sa/api");
    let window = [
        "--identity",
        identity.as_str(),
        "--since",
        since.as_str(),
        "--until",
        until.as_str(),
    ];
    let records = ledger_list(&[store_args, &window].concat());
    assert_eq!(records.len(), 6, "{records:?}");
    for r in &records {
        assert_eq!(r["outcome"], "issued", "{r}");
        assert_eq!(r["namespace"], NAMESPACE, "{r}");
        assert!(
            r["node_name"] == "node-a" || r["node_name"] == "node-b",
            "{r}"
        );
        assert_eq!(
            r["requester"],
            format!("system:node:{}", r["node_name"].as_str().unwrap())
        );
        assert!(r["ca_generation"].as_u64().is_some(), "{r}");
        assert_eq!(r["issuer_fingerprint"].as_str().unwrap().len(), 64, "{r}");
        assert_eq!(r["replica"], "podca-0", "{r}");
    }
    let on_a = ledger_list(&[store_args, &window, &["--node", "node-a"]].concat());
    assert_eq!(on_a.len(), 3, "{on_a:?}");
    // An earlier window holds nothing.
    let earlier = ledger_list(&[store_args, &["--until", since.as_str()]].concat());
    assert!(earlier.is_empty(), "{earlier:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_question_on_redb_and_refusals_in_the_audit_log() {
    let s = setup(false).await;
    let dir = s.ca_dir.display().to_string();
    audit_question(&s, &["--dir", dir.as_str()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_question_on_postgres() {
    let s = setup(true).await;
    let url = s.url_file.display().to_string();
    audit_question(
        &s,
        &[
            "--postgres-url-file",
            url.as_str(),
            "--postgres-tls",
            "disable",
        ],
    )
    .await;
}

/// A `podca dev` process with its Workload API socket, logging the audit target to a file.
struct Dev {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Dev {
    /// `podca dev` in `dir` (its data directory is `dir/data`) with `config` (TOML text);
    /// ready once it prints `podca dev: ready`.
    fn start(dir: &std::path::Path, config: &str) -> Dev {
        use std::io::BufRead;
        let socket = dir.join("workload.sock");
        let log = dir.join("dev.log");
        let config_path = dir.join("podca.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut child = Command::new(podca_binary())
            .arg("dev")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--grpc-listen", "127.0.0.1:0", "--socket"])
            .arg(&socket)
            .arg("--config")
            .arg(&config_path)
            .env("PODCA_LOG", "warn,podca::audit=info")
            .env_remove("PODCA_CONFIG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line == "podca dev: ready" => break,
                Some(Ok(_)) => {}
                _ => panic!(
                    "podca dev exited before it was ready: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        }
        // Keep draining stdout so podca dev never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Dev { child, socket, log }
    }

    async fn workload_client(
        &self,
    ) -> podca_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient<
        tonic::transport::Channel,
    > {
        podca_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient::new(
            podca_tests::process::unix_channel(&self.socket).await,
        )
    }

    /// SIGTERM, wait, and the audit lines it wrote.
    fn stop(mut self) -> (Vec<serde_json::Value>, String) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let _ = self.child.wait();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        (audit_lines(&log), log)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The audit JSON objects in a log.
fn audit_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| l.find("{\"audit\":").map(|i| &l[i..]))
        .map(|json| serde_json::from_str(json).unwrap())
        .collect()
}

fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid()
}

fn with_workload_header<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    request
}

/// The one refusal line of `method`.
fn refusal_of<'a>(
    audit: &'a [serde_json::Value],
    method: &str,
    log: &str,
) -> &'a serde_json::Value {
    let found: Vec<_> = audit
        .iter()
        .filter(|a| a["event"] == "refusal" && a["method"] == method)
        .collect();
    assert_eq!(found.len(), 1, "refusals of {method}: {found:?}\n{log}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_api_refusals_are_audited_like_podca_v1_refusals() {
    use podca_proto::workload::{X509BundlesRequest, X509svidRequest};
    // This process's uid is payments/api; the policy allows only the namespace `allowed`.
    let uid = my_uid();
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(
        dir.path(),
        &format!(
            "[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\nnamespaces = [\"allowed\"]\n\
         service_accounts = [\"*/*\"]\n\n\
         [[dev.identities]]\nuid = {uid}\nnamespace = \"{NAMESPACE}\"\nservice_account = \"api\"\n"
        ),
    );
    let mut client = dev.workload_client().await;
    // No `workload.spiffe.io` header: refused before the caller is identified.
    let missing = client
        .fetch_x509_bundles(X509BundlesRequest {})
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::InvalidArgument, "{missing:?}");
    // Identified, then denied by the policy: a decision, recorded in the ledger.
    let denied = client
        .fetch_x509svid(with_workload_header(X509svidRequest {}))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let data = dir.path().join("data");
    let (audit, log) = dev.stop();
    let refusal = refusal_of(&audit, "SpiffeWorkloadAPI/FetchX509Bundles", &log);
    assert_eq!(refusal["code"], "INVALID_ARGUMENT", "{refusal}");
    assert_eq!(refusal["peer"], format!("unix:uid={uid}"), "{refusal}");
    assert!(
        refusal["reason"]
            .as_str()
            .unwrap()
            .contains("workload.spiffe.io"),
        "{refusal}"
    );
    let decisions: Vec<_> = audit.iter().filter(|a| a["event"] == "decision").collect();
    assert_eq!(decisions.len(), 1, "{decisions:?}\n{log}");
    assert_eq!(decisions[0]["outcome"], "denied", "{}", decisions[0]);
    assert_eq!(decisions[0]["source"], "workload-api", "{}", decisions[0]);
    let dir = data.display().to_string();
    let records = ledger_list(&["--dir", dir.as_str()]);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["outcome"], "denied", "{records:?}");
    assert_eq!(
        records[0]["identity"],
        format!("spiffe://cluster.local/ns/{NAMESPACE}/sa/api"),
        "{records:?}"
    );

    // A caller whose uid podca dev does not know: refused before it is identified.
    let stranger = uid.wrapping_add(4242);
    let other = tempfile::tempdir().unwrap();
    let dev = Dev::start(
        other.path(),
        &format!(
            "[[dev.identities]]\nuid = {stranger}\nnamespace = \"{NAMESPACE}\"\n\
         service_account = \"api\"\n"
        ),
    );
    let mut client = dev.workload_client().await;
    let unknown = client
        .fetch_x509svid(with_workload_header(X509svidRequest {}))
        .await
        .unwrap_err();
    let (audit, log) = dev.stop();
    let refusal = refusal_of(&audit, "SpiffeWorkloadAPI/FetchX509SVID", &log);
    assert_eq!(
        refusal["code"],
        podca_grpc::observe::code_name(unknown.code()),
        "{refusal}"
    );
    assert!(
        refusal["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("uid {uid} is not mapped")),
        "{refusal}"
    );
    assert!(
        !audit.iter().any(|a| a["event"] == "decision"),
        "an unidentified caller is no decision: {audit:?}"
    );
}

/// `podca issue --config F -n payments --service-account api`: its exit status, stdout and
/// stderr.
fn podca_issue(config: &std::path::Path) -> (bool, String, String) {
    let out = Command::new(podca_binary())
        .args(["issue", "--config"])
        .arg(config)
        .args(["-n", NAMESPACE, "--service-account", "api"])
        .env_remove("PODCA_DATA_DIR")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The serial of the leaf in a credential bundle (a key, then the chain).
fn bundle_serial(bundle: &str) -> String {
    let chain = pem::parse_many(bundle)
        .unwrap()
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| pem::encode(&p))
        .collect::<String>();
    leaf_serial(&chain)
}

#[test]
fn podca_issue_records_to_the_configured_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let init = Command::new(podca_binary())
        .args(["ca", "init", "--dir"])
        .arg(&ca_dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(init.success());
    let data_dir_ledger = ca_dir.join("ledger.redb");
    let write_config = |name: &str, ledger: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "[ca]\ndir = {:?}\n\n[ledger]\n{ledger}",
                ca_dir.display().to_string()
            ),
        )
        .unwrap();
        path
    };

    // redb at the configured path, not the data directory's ledger.redb.
    let redb = dir.path().join("elsewhere.redb");
    let config = write_config(
        "redb.toml",
        &format!(
            "backend = \"redb\"\npath = {:?}\n",
            redb.display().to_string()
        ),
    );
    let (ok, bundle, stderr) = podca_issue(&config);
    assert!(ok, "{stderr}");
    let serial = bundle_serial(&bundle);
    assert!(redb.exists(), "nothing at the configured path");
    assert!(!data_dir_ledger.exists(), "recorded in the data directory");
    let config_arg = config.display().to_string();
    let records = ledger_list(&["--config", config_arg.as_str()]);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["serial"], serial, "{records:?}");
    assert_eq!(records[0]["source"], "cli", "{records:?}");

    // PostgreSQL.
    let pg = Postgres::start();
    let url_file = dir.path().join("ledger-url");
    std::fs::write(&url_file, pg.unix_url()).unwrap();
    let config = write_config(
        "postgres.toml",
        &format!(
            "backend = \"postgres\"\nurl_file = {:?}\ntls = \"disable\"\n",
            url_file.display().to_string()
        ),
    );
    let (ok, bundle, stderr) = podca_issue(&config);
    assert!(ok, "{stderr}");
    assert_eq!(
        pg.psql("select serial, source, identity from podca_ledger"),
        format!(
            "{}|cli|spiffe://cluster.local/ns/{NAMESPACE}/sa/api",
            bundle_serial(&bundle)
        )
    );
    // The ledger down: nothing is issued unrecorded.
    pg.stop();
    let (ok, bundle, stderr) = podca_issue(&config);
    assert!(!ok, "issued with the ledger down");
    assert!(bundle.is_empty(), "a certificate was written: {bundle}");
    assert!(stderr.contains("ledger"), "{stderr}");
    pg.start_again();
    assert_eq!(pg.psql("select count(*) from podca_ledger"), "1");
    assert!(!data_dir_ledger.exists(), "recorded in the data directory");

    // none: issued, recorded nowhere, and stderr says so once.
    let config = write_config("none.toml", "backend = \"none\"\n");
    let (ok, bundle, stderr) = podca_issue(&config);
    assert!(ok, "{stderr}");
    assert!(bundle.contains("BEGIN CERTIFICATE"), "{bundle}");
    assert_eq!(
        stderr.matches("not recorded").count(),
        1,
        "stderr: {stderr}"
    );
    assert!(!data_dir_ledger.exists(), "recorded in the data directory");
    assert_eq!(pg.psql("select count(*) from podca_ledger"), "1");
}
