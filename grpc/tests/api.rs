//! Calls on [`Api`](podca_grpc::Api) itself, below the tonic layer: the typed refusal behind a
//! status code, and the API's own clock. The API is `support::api`, as in `refusals.rs`.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use podca_grpc::auth::Identity;
use podca_grpc::core::IssueInput;
use podca_grpc::errors::ApiError;
use podca_signer::BackendError;
use tonic::Code;

use support::{FlakyKey, Setup, api, p256_csr};

#[tokio::test]
async fn backend_unavailable_is_unavailable() {
    let key = Arc::new(FlakyKey::p256());
    let api = api(Setup {
        key: key.clone(),
        ..Setup::default()
    });
    let who = Identity::service_account("default", "default");
    let input = || IssueInput {
        csr: p256_csr(),
        ..Default::default()
    };
    assert!(api.issue(&who, input()).await.is_ok());
    key.remove();
    let err = api.issue(&who, input()).await.unwrap_err();
    assert_eq!(
        err,
        ApiError::Unavailable(BackendError::Unavailable("HSM token removed".into()))
    );
    assert_eq!(tonic::Status::from(err).code(), Code::Unavailable);
}

#[tokio::test]
async fn issues_at_the_api_clock() {
    // Far from the system clock, with sub-second digits that notBefore must drop.
    let now = time::macros::datetime!(2031-03-04 05:06:07.891 UTC);
    let api = api(Setup {
        now: Some(now),
        ..Setup::default()
    });
    let who = Identity::service_account("default", "default");
    let issued = api
        .issue(
            &who,
            IssueInput {
                csr: p256_csr(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let want = time::macros::datetime!(2031-03-04 05:05:07 UTC);
    assert_eq!(issued.certificate.validity.not_before, want);
    // The certificate itself says so, not only the summary.
    let (_, cert) = x509_parser::parse_x509_certificate(&issued.certificate.leaf_der).unwrap();
    assert_eq!(
        cert.validity().not_before.timestamp(),
        want.unix_timestamp()
    );
    assert!(cert.validity().not_after.timestamp() > want.unix_timestamp());
}
