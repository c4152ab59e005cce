//! The PostgreSQL ledger against a real PostgreSQL server (tests/src/postgres.rs): migrations,
//! a newer schema refused, group commit with unique serials, queries and pruning, TLS with
//! certificate verification, and the one-line errors at start.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use podca_authority::ledger::{
    self, LedgerBackend, LedgerConfig, LedgerMetrics, OnUnavailable, PostgresSettings, PostgresTls,
    Store, StoreError,
};
use podca_signer::ledger::{RecordContext, RecordOutcome, Source};
use podca_signer::{Filter, LedgerRecord};
use podca_tests::postgres::{PASSWORD, Postgres, ServerTls};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn settings(
    dir: &std::path::Path,
    url: &str,
    tls: PostgresTls,
    ca: Option<PathBuf>,
) -> LedgerBackend {
    let url_file = dir.join(format!("url-{}", rand_suffix()));
    std::fs::write(&url_file, url).unwrap();
    LedgerBackend::Postgres(PostgresSettings {
        url_file,
        tls,
        ca_file: ca,
        pool_size: 2,
        statement_timeout: Duration::from_secs(30),
    })
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn record(i: u32, namespace: &str, node: &str, time: OffsetDateTime) -> LedgerRecord {
    let context = RecordContext {
        source: Source::Pcr,
        signer: "example.com/workload".into(),
        identity: format!("spiffe://cluster.local/ns/{namespace}/sa/api"),
        requester: Some(format!("system:node:{node}")),
        namespace: namespace.into(),
        service_account: "api".into(),
        pod_name: Some(format!("api-{i}")),
        pod_uid: Some(format!("pod-uid-{i}")),
        node_name: Some(node.into()),
        request_uid: Some(format!("pcr-uid-{i}")),
        request_name: Some(format!("{namespace}/pcr-{i}")),
        ca_generation: Some(2),
        issuer_fingerprint: Some("ab".repeat(32)),
        auth: None,
        replica: "podca-0".into(),
        time,
    };
    let mut r = LedgerRecord::refused(&context, RecordOutcome::Issued, "Issued", "");
    r.message = None;
    r.id = format!("{i:032x}");
    r.serial = Some(r.id.clone());
    r.cert_sha256 = Some(format!("{i:064x}"));
    r
}

async fn open(backend: &LedgerBackend) -> Result<Store, StoreError> {
    Store::open(backend, None)
        .await
        .map(|s| s.expect("a store"))
}

/// A JWT-SVID's record (source `jwt`, no serial) goes into the same table and is found by the
/// token's SHA-256, as in redb.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_record_is_found_by_its_token_digest() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let backend = settings(dir.path(), &pg.unix_url(), PostgresTls::Disable, None);
    let store = open(&backend).await.unwrap();
    let t0 = time::macros::datetime!(2026-11-24 09:00 UTC);
    let mut jwt = record(1, "web", "node-b", t0);
    jwt.source = Source::Jwt;
    jwt.id = format!("jwt:{:064x}", 77);
    jwt.serial = None;
    jwt.cert_sha256 = None;
    jwt.jwt = Some(podca_signer::ledger::JwtFacts {
        kid: "kid-1".into(),
        audiences: vec!["vault".into()],
        token_sha256: format!("{:064x}", 77),
    });
    store
        .append(vec![jwt.clone(), record(2, "web", "node-b", t0)])
        .await
        .unwrap();
    assert_eq!(
        pg.psql("select source, serial is null from podca_ledger order by seq"),
        "jwt|t\npcr|f"
    );
    let found = store
        .query(&Filter {
            fingerprint: Some(format!("{:064X}", 77)),
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(found, [jwt]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_once_group_commit_unique_serials_queries_and_prune() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let backend = settings(dir.path(), &pg.unix_url(), PostgresTls::Disable, None);
    // Two replicas starting: the schema is applied once.
    let (a, b) = tokio::join!(open(&backend), open(&backend));
    let (store, _other) = (a.unwrap(), b.unwrap());
    assert_eq!(
        pg.psql("select version from podca_schema_migrations order by 1"),
        "1\n2"
    );

    let (handle, writer) = ledger::start(
        store.clone(),
        &LedgerConfig::default(),
        LedgerMetrics::default(),
    );
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(writer.run(stop));
    let t0 = time::macros::datetime!(2026-11-24 09:00 UTC);
    let mut callers = tokio::task::JoinSet::new();
    for i in 0..1000u32 {
        let h = handle.clone();
        let (ns, node) = if i % 4 == 0 {
            ("payments", "node-a")
        } else {
            ("web", "node-b")
        };
        let r = record(i, ns, node, t0 + time::Duration::minutes(i64::from(i)));
        callers.spawn(async move { h.record(r).await });
    }
    while let Some(answer) = callers.join_next().await {
        answer.unwrap().unwrap();
    }
    // Answered means committed.
    assert_eq!(pg.psql("select count(*) from podca_ledger"), "1000");
    // Fewer commits than records: the batches grew while a commit ran.
    // A retry of a committed record adds nothing.
    handle
        .record(record(4, "payments", "node-a", t0))
        .await
        .unwrap();
    assert_eq!(
        pg.psql("select count(*), count(distinct serial) from podca_ledger"),
        "1000|1000"
    );

    // The audit question: payments, one day, which node, which CA generation.
    let found = store
        .query(&Filter {
            namespace: Some("payments".into()),
            since: Some(t0 + time::Duration::minutes(100)),
            until: Some(t0 + time::Duration::minutes(120)),
            ..Filter::default()
        })
        .await
        .unwrap();
    let pods: Vec<_> = found.iter().map(|r| r.pod_name.clone().unwrap()).collect();
    assert_eq!(
        pods,
        ["api-116", "api-112", "api-108", "api-104", "api-100"]
    );
    assert!(
        found
            .iter()
            .all(|r| r.node_name.as_deref() == Some("node-a") && r.ca_generation == Some(2))
    );
    let by_serial = store
        .query(&Filter {
            serial: Some(format!("{:032X}", 7)),
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(by_serial.len(), 1);
    assert_eq!(
        by_serial[0],
        record(7, "web", "node-b", t0 + time::Duration::minutes(7))
    );
    let by_fingerprint = store
        .query(&Filter {
            fingerprint: Some(format!("{:064x}", 9)),
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(by_fingerprint.len(), 1);
    let denied = store
        .query(&Filter {
            outcome: Some(RecordOutcome::Denied),
            ..Filter::default()
        })
        .await
        .unwrap();
    assert!(denied.is_empty());
    let limited = store
        .query(&Filter {
            node: Some("node-b".into()),
            limit: 3,
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        limited
            .iter()
            .map(|r| r.pod_name.clone().unwrap())
            .collect::<Vec<_>>(),
        ["api-999", "api-998", "api-997"]
    );

    assert_eq!(
        store
            .prune(t0 + time::Duration::minutes(500))
            .await
            .unwrap(),
        500
    );
    assert_eq!(pg.psql("select count(*) from podca_ledger"), "500");
    stop_tx.send_replace(true);
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_from_a_newer_podca_is_refused_in_one_line() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let backend = settings(dir.path(), &pg.unix_url(), PostgresTls::Disable, None);
    drop(open(&backend).await.unwrap());
    pg.psql("insert into podca_schema_migrations (version) values (7)");
    let error = open(&backend).await.unwrap_err().to_string();
    assert_eq!(
        error,
        "ledger: the PostgreSQL schema is version 7, newer than this podca knows (2); run the \
         newer podca (or restore the database)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_makes_decisions_wait_not_vanish() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let backend = settings(dir.path(), &pg.unix_url(), PostgresTls::Disable, None);
    let store = open(&backend).await.unwrap();
    let t0 = OffsetDateTime::now_utc();

    // retry (the default): refused while the server is down, recorded once it is back.
    let (handle, writer) = ledger::start(
        store.clone(),
        &LedgerConfig::default(),
        LedgerMetrics::default(),
    );
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(writer.run(stop));
    handle.record(record(1, "web", "n", t0)).await.unwrap();
    pg.stop();
    let error = handle.record(record(2, "web", "n", t0)).await.unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("the issuance ledger is unavailable: ledger: PostgreSQL: "),
        "{error}"
    );
    assert!(!error.to_string().contains('\n'), "{error}");
    pg.start_again();
    // The pool replaces the broken connections; the retried record goes in once.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match handle.record(record(2, "web", "n", t0)).await {
            Ok(()) => break,
            Err(e) => assert!(std::time::Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(pg.psql("select count(*) from podca_ledger"), "2");
    stop_tx.send_replace(true);
    task.await.unwrap();

    // continue: answered at once, held in memory, written when the server is back.
    let config = LedgerConfig {
        on_unavailable: OnUnavailable::Continue,
        queue_limit: 2,
        ..LedgerConfig::default()
    };
    let (handle, writer) = ledger::start(store.clone(), &config, LedgerMetrics::default());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(writer.run(stop));
    pg.stop();
    handle.record(record(3, "web", "n", t0)).await.unwrap();
    handle.record(record(4, "web", "n", t0)).await.unwrap();
    // Beyond the bound: refused, not dropped silently.
    let full = handle.record(record(5, "web", "n", t0)).await.unwrap_err();
    assert!(
        full.to_string().contains("the in-memory queue is full (2)"),
        "{full}"
    );
    pg.start_again();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while pg.psql("select count(*) from podca_ledger") != "4" {
        assert!(
            std::time::Instant::now() < deadline,
            "the held records never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_tx.send_replace(true);
    task.await.unwrap();
}

/// Why appending `r` alone failed.
async fn refusal(store: &Store, r: LedgerRecord) -> String {
    store.append(vec![r]).await.unwrap_err().to_string()
}

fn with_statement_timeout(backend: LedgerBackend, timeout: Duration) -> LedgerBackend {
    match backend {
        LedgerBackend::Postgres(settings) => LedgerBackend::Postgres(PostgresSettings {
            statement_timeout: timeout,
            ..settings
        }),
        other => other,
    }
}

/// A statement stuck behind a lock is cancelled by the server after `statement_timeout_seconds`
/// (podca sets it on every connection), so the batch fails instead of holding the ledger writer,
/// and nothing lands later behind podca's back; the same record goes in once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_stuck_on_a_lock_is_cancelled_by_the_server() {
    let pg = Arc::new(Postgres::start());
    let dir = tempfile::tempdir().unwrap();
    let backend = with_statement_timeout(
        settings(dir.path(), &pg.unix_url(), PostgresTls::Disable, None),
        Duration::from_secs(1),
    );
    let store = open(&backend).await.unwrap();
    let t0 = OffsetDateTime::now_utc();
    store.append(vec![record(1, "web", "n", t0)]).await.unwrap();
    let holder = tokio::task::spawn_blocking({
        let pg = Arc::clone(&pg);
        move || {
            pg.psql(
                "begin; lock table podca_ledger in access exclusive mode; \
                 select pg_sleep(4); commit;",
            )
        }
    });
    let held = "select count(*) from pg_locks \
                where relation = 'podca_ledger'::regclass and mode = 'AccessExclusiveLock'";
    while pg.psql(held) != "1" {
        assert!(!holder.is_finished(), "the lock holder ended early");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        refusal(&store, record(2, "web", "n", t0)).await,
        "ledger: PostgreSQL: ERROR: canceling statement due to statement timeout"
    );
    // Still held: the statement was given up, not waited out.
    assert!(
        !holder.is_finished(),
        "the lock was released before the refusal"
    );
    holder.await.unwrap();
    assert_eq!(pg.psql("select count(*) from podca_ledger"), "1");
    assert_eq!(
        store.append(vec![record(2, "web", "n", t0)]).await.unwrap(),
        [true]
    );
    assert_eq!(pg.psql("select count(*) from podca_ledger"), "2");
}

/// A TCP relay to `port` that counts its connections and, while `dropping` is set, reads and
/// throws away what the client sends, keeping the connection open: a network partition that
/// drops packets rather than refusing them.
async fn relay(port: u16, dropping: Arc<AtomicBool>, accepted: Arc<AtomicUsize>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let own = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (client, _) = listener.accept().await.unwrap();
            accepted.fetch_add(1, Ordering::SeqCst);
            let server = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let dropping = Arc::clone(&dropping);
            tokio::spawn(async move {
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let up = async {
                    let mut buf = vec![0; 16 * 1024];
                    loop {
                        let n = from_client.read(&mut buf).await?;
                        if n == 0 {
                            return to_server.shutdown().await;
                        }
                        if !dropping.load(Ordering::SeqCst) {
                            to_server.write_all(&buf[..n]).await?;
                        }
                    }
                };
                let down = tokio::io::copy(&mut from_server, &mut to_client);
                let _: (std::io::Result<()>, _) = tokio::join!(up, down);
            });
        }
    });
    own
}

/// A server that stops answering without closing the connection: the statement fails after
/// `statement_timeout_seconds` plus the grace, its connection is dropped rather than pooled
/// again, and the next statement gets a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_fails_the_statement_and_loses_its_connection() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let dropping = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let port = relay(pg.port, Arc::clone(&dropping), Arc::clone(&accepted)).await;
    let backend = match with_statement_timeout(
        settings(
            dir.path(),
            &format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/postgres"),
            PostgresTls::Disable,
            None,
        ),
        Duration::from_secs(1),
    ) {
        // One connection: a kept one would serve the next statement.
        LedgerBackend::Postgres(s) => {
            LedgerBackend::Postgres(PostgresSettings { pool_size: 1, ..s })
        }
        other => other,
    };
    let store = open(&backend).await.unwrap();
    let t0 = OffsetDateTime::now_utc();
    store.append(vec![record(1, "web", "n", t0)]).await.unwrap();
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    dropping.store(true, Ordering::SeqCst);
    assert_eq!(
        refusal(&store, record(2, "web", "n", t0)).await,
        "ledger: PostgreSQL: no answer within 1 s (statement_timeout_seconds, and 2 s of \
         grace); the connection was dropped"
    );
    dropping.store(false, Ordering::SeqCst);
    assert_eq!(
        store.append(vec![record(2, "web", "n", t0)]).await.unwrap(),
        [true]
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "the dead connection was used again"
    );
    assert_eq!(pg.psql("select count(*) from podca_ledger"), "2");
}

/// A CA named `ca_name` and a server certificate from it for `localhost` and 127.0.0.1.
fn server_tls(ca_name: &str) -> (String, ServerTls) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut server = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server
        .subject_alt_names
        .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    let cert = server.signed_by(&key, &issuer).unwrap();
    (
        ca_cert.pem(),
        ServerTls {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verify_full_and_the_one_line_errors_at_start() {
    let (ca_pem, tls) = server_tls("ledger test CA");
    let pg = Postgres::start_with(Some(tls));
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let url = pg.tcp_url("localhost", PASSWORD);

    // verify-full with the right CA: connects over TLS.
    let store = open(&settings(
        dir.path(),
        &url,
        PostgresTls::VerifyFull,
        Some(ca_file.clone()),
    ))
    .await
    .unwrap();
    let ssl = pg.psql("select count(*) from pg_stat_ssl where ssl");
    assert_ne!(ssl, "0", "podca's pooled connection is TLS");
    drop(store);

    // A CA that did not sign the server's certificate.
    let (other_ca, _) = server_tls("some other CA");
    let wrong = dir.path().join("wrong.pem");
    std::fs::write(&wrong, other_ca).unwrap();
    let error = open(&settings(
        dir.path(),
        &url,
        PostgresTls::VerifyFull,
        Some(wrong),
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(error.starts_with("ledger: PostgreSQL: "), "{error}");
    assert!(error.contains("UnknownIssuer"), "{error}");
    assert!(!error.contains('\n'), "{error}");

    // The certificate names localhost and 127.0.0.1, not 127.0.0.2.
    let error = open(&settings(
        dir.path(),
        &format!("host=127.0.0.2 hostaddr=127.0.0.1 port={} user=postgres password={PASSWORD} dbname=postgres", pg.port),
        PostgresTls::VerifyFull,
        Some(ca_file.clone()),
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("NotValidForName") || error.contains("not valid for name"),
        "{error}"
    );

    // Wrong password: the server's own words, and never the password.
    let error = open(&settings(
        dir.path(),
        &pg.tcp_url("localhost", "not-the-password"),
        PostgresTls::VerifyFull,
        Some(ca_file.clone()),
    ))
    .await
    .unwrap_err()
    .to_string();
    assert_eq!(
        error,
        "ledger: PostgreSQL: FATAL: password authentication failed for user \"postgres\""
    );

    // Nothing listening.
    let closed = podca_tests::process::free_port();
    let error = open(&settings(
        dir.path(),
        &format!("postgres://postgres:{PASSWORD}@localhost:{closed}/postgres"),
        PostgresTls::VerifyFull,
        Some(ca_file.clone()),
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("ledger: PostgreSQL: error connecting to server"),
        "{error}"
    );
    assert!(!error.contains(PASSWORD), "{error}");

    // Plaintext to a host that is not local is refused before connecting.
    let error = open(&settings(
        dir.path(),
        &format!("postgres://postgres:{PASSWORD}@db.example:5432/postgres"),
        PostgresTls::Disable,
        None,
    ))
    .await
    .unwrap_err()
    .to_string();
    assert_eq!(
        error,
        "[ledger] tls = \"disable\" is allowed for Unix sockets and loopback only, not for host \
         db.example: use tls = \"verify-full\" with ca_file"
    );
}
