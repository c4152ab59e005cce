//! The redb ledger's page cache is bounded: redb keeps every page it writes in its read cache up
//! to the cache size, and with its 1 GiB default podca's memory grew with the ledger file (about
//! 1.7 KB per JWT-SVID under issue #17's benchmark). The heap of this test binary is counted by
//! `cap`, so the growth is measured, not guessed.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;

use cap::Cap;
use podca_signer::{Ledger, LedgerRecord, RecordContext, RecordOutcome, Source};

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

/// The bytes allocated and not yet freed.
fn live() -> isize {
    isize::try_from(HEAP.allocated()).unwrap_or(isize::MAX)
}

const MIB: usize = 1024 * 1024;

/// Appends 10,000 refusal records in batches of 100; says how far the heap grew and how large the
/// file became.
fn fill(path: &std::path::Path, cache_bytes: usize) -> (isize, u64) {
    let context = RecordContext {
        source: Source::Grpc,
        signer: "example.com/workload".into(),
        identity: "spiffe://cluster.local/ns/web/sa/api".into(),
        requester: Some("web/api".into()),
        namespace: "web".into(),
        service_account: "api".into(),
        pod_name: None,
        pod_uid: None,
        node_name: None,
        request_uid: None,
        request_name: None,
        ca_generation: Some(1),
        issuer_fingerprint: Some("ab".repeat(32)),
        auth: None,
        replica: "test".into(),
        time: time::OffsetDateTime::now_utc(),
    };
    let base = LedgerRecord::refused(&context, RecordOutcome::Denied, "PolicyDenied", "m");
    let before = live();
    let ledger = Ledger::open_with_cache(path, cache_bytes).unwrap();
    for batch in 0..100 {
        let records: Vec<LedgerRecord> = (0..100)
            .map(|i| {
                let mut r = base.clone();
                r.id = format!("grpc:{batch:04}{i:04}");
                r
            })
            .collect();
        assert!(ledger.append(&records).unwrap().iter().all(|new| *new));
    }
    let grew = live() - before;
    assert_eq!(ledger.by_identity(&context.identity).unwrap().len(), 10_000);
    drop(ledger);
    (grew, std::fs::metadata(path).unwrap().len())
}

#[test]
fn the_page_cache_stays_within_its_bound_and_the_records_read_back() {
    let dir = tempfile::tempdir().unwrap();
    // A 1 MiB cache under a file several times larger: the heap grows by about the cache.
    let (bounded, file) = fill(&dir.path().join("bounded.redb"), MIB);
    assert!(
        file > 4 * MIB as u64,
        "the file ({file} bytes) should outgrow the cache"
    );
    assert!(
        bounded < isize::try_from(2 * MIB).unwrap(),
        "the heap grew by {bounded} bytes with a 1 MiB cache and a {file}-byte file"
    );
    // redb's own default (1 GiB): the cache keeps what the commits wrote.
    let (unbounded, file) = fill(&dir.path().join("default.redb"), 1024 * MIB);
    assert!(
        unbounded > isize::try_from(file / 2).unwrap(),
        "the heap grew by {unbounded} bytes with a 1 GiB cache and a {file}-byte file"
    );
}
