//! The durability contract at the API: a certificate is returned only once its record is
//! committed; when the ledger cannot record it the caller gets UNAVAILABLE instead; refusals
//! are recorded and answered whatever the ledger says.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)] // shared with api.rs and refusals.rs; this file uses part of it
mod support;

use podca_authority::ledger::{self, LedgerBackend, LedgerConfig, LedgerMetrics, Store};
use podca_grpc::auth::Identity;
use podca_grpc::core::IssueInput;
use podca_grpc::errors::ApiError;
use podca_signer::{Filter, RecordOutcome, Source};
use tonic::Code;

use support::{Setup, api, p256_csr};

async fn redb(dir: &std::path::Path) -> Store {
    Store::open(
        &LedgerBackend::Redb {
            path: Some(dir.join("ledger.redb")),
        },
        None,
    )
    .await
    .unwrap()
    .unwrap()
}

fn input() -> IssueInput {
    IssueInput {
        csr: p256_csr(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_recorded_before_the_answer_and_none_without_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let store = redb(dir.path()).await;
    let (handle, writer) = ledger::start(
        store.clone(),
        &LedgerConfig::default(),
        LedgerMetrics::default(),
    );
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(writer.run(stop));
    let api = api(Setup {
        ledger: Some(handle),
        ..Setup::default()
    });

    let who = Identity::service_account("payments", "api");
    let issued = api.issue(&who, input()).await.unwrap();
    // Answered, so recorded: read right away.
    let records = store
        .query(&Filter {
            serial: Some(issued.certificate.serial.clone()),
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.source, Source::Grpc);
    assert_eq!(r.outcome, RecordOutcome::Issued);
    assert_eq!(r.signer, "default");
    assert_eq!(r.identity, "spiffe://example.org/ns/payments/sa/api");
    assert_eq!(r.requester.as_deref(), Some("payments/api"));
    assert_eq!(r.key_type.as_deref(), Some("ECDSAP256"));
    // A CA made in code has no numbered generation.
    assert_eq!(r.ca_generation, issued.ca_generation.map(u64::from));
    assert_eq!(r.ca_generation, None);
    assert_eq!(
        r.issuer_fingerprint.as_deref(),
        Some(issued.certificate.issuer_fingerprint.as_str())
    );
    assert_eq!(r.cert_sha256.as_ref().map(String::len), Some(64));

    // A policy denial is recorded with its reason, and answered as before.
    let outsider = Identity::service_account("forbidden", "x");
    let denied = api.issue(&outsider, input()).await.unwrap_err();
    assert!(matches!(denied, ApiError::Denied { .. }), "{denied:?}");
    let refusals = store
        .query(&Filter {
            outcome: Some(RecordOutcome::Denied),
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(refusals.len(), 1);
    assert_eq!(refusals[0].reason, "NamespaceNotAllowed");
    assert_eq!(refusals[0].namespace, "forbidden");
    assert!(refusals[0].serial.is_none());

    // The ledger gone: the certificate is not handed out, the caller is told to retry.
    stop_tx.send_replace(true);
    task.await.unwrap();
    let error = api.issue(&who, input()).await.unwrap_err();
    assert_eq!(
        error,
        ApiError::LedgerUnavailable(
            "the issuance ledger is unavailable: the ledger writer has stopped".into()
        )
    );
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        "the issuance ledger is unavailable: the ledger writer has stopped; retry later"
    );
    // A refusal still gets its own answer.
    let denied = api.issue(&outsider, input()).await.unwrap_err();
    assert!(matches!(denied, ApiError::Denied { .. }), "{denied:?}");
    assert_eq!(store.query(&Filter::default()).await.unwrap().len(), 2);
}
