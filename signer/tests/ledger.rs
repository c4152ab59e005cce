//! The ledger: queries by serial, identity and time; and crash safety under `kill -9`.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration as StdDuration, Instant};

use podca_signer::{Filter, Ledger, LedgerError, LedgerRecord, RecordOutcome, Source};
use time::{Duration, OffsetDateTime};

fn record(i: u64, identity: &str, issued_at: OffsetDateTime) -> LedgerRecord {
    let serial = format!("{:032x}", 0x4000_0000_0000_0000_u128 + u128::from(i));
    LedgerRecord {
        schema: podca_signer::ledger::SCHEMA_VERSION,
        id: serial.clone(),
        time: issued_at,
        source: Source::Cli,
        signer: "test".into(),
        outcome: RecordOutcome::Issued,
        reason: "Issued".into(),
        message: None,
        identity: identity.into(),
        requester: None,
        namespace: "ns".into(),
        service_account: "sa".into(),
        pod_name: None,
        pod_uid: None,
        node_name: Some(format!("node-{}", i % 2)),
        request_uid: Some(format!("uid-{i}")),
        request_name: Some(format!("ns/req-{i}")),
        serial: Some(serial),
        cert_sha256: Some(format!("{:064x}", i + 1_000_000)),
        spki_sha256: Some(format!("{i:064x}")),
        key_type: Some("ECDSAP256".into()),
        dns_names: vec![],
        ip_addresses: vec![],
        not_before: Some(issued_at),
        not_after: Some(issued_at + Duration::hours(24)),
        ca_generation: Some(1),
        issuer_fingerprint: Some("ab".repeat(32)),
        replica: "test".into(),
        jwt: None,
        auth: None,
    }
}

#[test]
fn queries_by_serial_identity_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("l.redb")).unwrap();
    assert!(ledger.is_empty().unwrap());
    let t0 = time::macros::datetime!(2026-11-29 10:00 UTC);
    let records: Vec<_> = (0..30)
        .map(|i| {
            let who = if i % 3 == 0 {
                "spiffe://t/ns/a/sa/x"
            } else {
                "spiffe://t/ns/b/sa/y"
            };
            record(i, who, t0 + Duration::minutes(i as i64))
        })
        .collect();
    ledger.append(&records[..10]).unwrap();
    ledger.append(&records[10..]).unwrap();
    assert_eq!(ledger.len().unwrap(), 30);

    let r7 = ledger
        .by_serial(&records[7].id.to_uppercase())
        .unwrap()
        .unwrap();
    assert_eq!(r7, records[7]);
    assert!(ledger.by_serial("00").unwrap().is_none());

    let a = ledger.by_identity("spiffe://t/ns/a/sa/x").unwrap();
    assert_eq!(a.len(), 10);
    assert!(a.iter().all(|r| r.identity == "spiffe://t/ns/a/sa/x"));

    let window = ledger
        .issued_between(t0 + Duration::minutes(5), t0 + Duration::minutes(8), 100)
        .unwrap();
    assert_eq!(
        window
            .iter()
            .map(|r| r.request_uid.clone().unwrap())
            .collect::<Vec<_>>(),
        ["uid-5", "uid-6", "uid-7"]
    );
    let latest = ledger.latest(2).unwrap();
    assert_eq!(latest[0], records[29]);
    assert_eq!(latest[1], records[28]);

    // A retried append adds nothing: the id (the serial) is unique.
    assert_eq!(ledger.append(&records[5..7]).unwrap(), [false, false]);
    assert_eq!(ledger.len().unwrap(), 30);

    // Filtered queries, newest first: node and time window together.
    let on_node_1 = ledger
        .query(&Filter {
            node: Some("node-1".into()),
            since: Some(t0 + Duration::minutes(10)),
            until: Some(t0 + Duration::minutes(16)),
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(
        on_node_1
            .iter()
            .map(|r| r.request_uid.clone().unwrap())
            .collect::<Vec<_>>(),
        ["uid-15", "uid-13", "uid-11"]
    );
    let by_fingerprint = ledger
        .query(&Filter {
            fingerprint: Some(format!("{:064X}", 12 + 1_000_000)),
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(by_fingerprint, [records[12].clone()]);

    // Pruning drops the old records from every index.
    assert_eq!(ledger.prune(t0 + Duration::minutes(20)).unwrap(), 20);
    assert_eq!(ledger.len().unwrap(), 10);
    assert!(ledger.by_serial(&records[3].id).unwrap().is_none());
    assert_eq!(ledger.by_identity("spiffe://t/ns/a/sa/x").unwrap().len(), 3);
    assert_eq!(ledger.query(&Filter::default()).unwrap().len(), 10);
    // A pruned id may be written again (it is gone, not remembered).
    assert_eq!(ledger.append(&records[3..4]).unwrap(), [true]);
}

/// A JWT-SVID record's id grows with its decision time, so the store's id index appends
/// instead of touching a random leaf page per token; it still names the token's digest, and a
/// retried append of the same record is still skipped.
#[test]
fn jwt_ids_grow_with_time_and_retries_are_skipped() {
    let t = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
    let late_digest = "0".repeat(64);
    let early = podca_signer::ledger::jwt_id(t, &"f".repeat(64));
    let late = podca_signer::ledger::jwt_id(t + Duration::milliseconds(1), &late_digest);
    assert_eq!(early, format!("jwt:1800000000000-{}", "f".repeat(64)));
    assert!(early < late, "{early} must sort before {late}");
    // Zero-padded to 13 digits, so earlier times sort first.
    let y2001 = OffsetDateTime::from_unix_timestamp(1_000_000_000).unwrap();
    assert!(podca_signer::ledger::jwt_id(y2001, &late_digest) < early);

    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("l.redb")).unwrap();
    let mut jwt = record(1, "spiffe://t/ns/a/sa/x", t);
    jwt.source = Source::Jwt;
    jwt.id = late;
    jwt.serial = None;
    assert_eq!(ledger.append(std::slice::from_ref(&jwt)).unwrap(), [true]);
    assert_eq!(ledger.append(std::slice::from_ref(&jwt)).unwrap(), [false]);
    assert_eq!(ledger.len().unwrap(), 1);
    assert_eq!(ledger.by_id(&jwt.id).unwrap(), Some(jwt));
}

#[test]
fn a_second_writer_gets_a_clear_in_use_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.redb");
    let _first = Ledger::open(&path).unwrap();
    // Within one process redb refuses a second handle the same way another process would.
    match Ledger::open(&path) {
        Err(e @ LedgerError::InUse { .. }) => assert!(e.to_string().contains("another podca")),
        other => panic!("expected InUse, got {other:?}"),
    }
}

const CHILD_ENV: &str = "PODCA_LEDGER_CRASH_CHILD";

/// The child process that `survives_kill_9_mid_write` kills: appends batches forever and
/// reports each durable one. The test binary runs it when [`CHILD_ENV`] names a ledger; it is
/// no `#[test]` of its own, so it can never pass vacuously.
fn crash_child_writer(path: &str) -> ! {
    let ledger = Ledger::open(std::path::Path::new(path)).unwrap();
    let start = OffsetDateTime::now_utc();
    let mut i = 0u64;
    loop {
        let batch: Vec<_> = (0..50)
            .map(|j| record(i * 50 + j, "spiffe://t/ns/crash/sa/w", start))
            .collect();
        ledger.append(&batch).unwrap();
        i += 1;
        // Tell the parent how many batches are durable.
        println!("committed {i}");
    }
}

#[test]
fn survives_kill_9_mid_write() {
    // Re-run by itself as the child (see crash_child_writer).
    if let Ok(path) = std::env::var(CHILD_ENV) {
        crash_child_writer(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let exe = std::env::current_exe().unwrap();
    for round in 0..3 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "survives_kill_9_mid_write",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Let it commit for a while, then kill it without warning.
        let deadline = Instant::now() + StdDuration::from_millis(700 + 300 * round);
        while Instant::now() < deadline {
            std::thread::sleep(StdDuration::from_millis(50));
        }
        child.kill().unwrap(); // SIGKILL
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let acknowledged = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("committed "))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        assert!(
            acknowledged > 0,
            "round {round}: the child committed nothing: {stdout}"
        );

        let ledger = Ledger::open(&path).expect("the ledger reopens after kill -9");
        let n = ledger.len().unwrap();
        // Every batch the child reported is there; batches are whole (all 50 or none).
        assert_eq!(n % 50, 0, "round {round}: a torn batch ({n} records)");
        let records = ledger.by_identity("spiffe://t/ns/crash/sa/w").unwrap();
        assert_eq!(
            records.len() as u64,
            n,
            "indexes agree with the records table"
        );
        let per_round_floor = acknowledged * 50;
        assert!(
            n >= per_round_floor,
            "round {round}: {n} records, acknowledged {per_round_floor}+"
        );
        drop(ledger);
    }
}
