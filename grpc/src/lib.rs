//! podca's gRPC edge: the `podca.v1` API (TCP, and the Unix socket in dev mode), the SPIFFE
//! Workload API (Unix socket) and the Istio CA API (TCP, beside `podca.v1`; [`istio`]).
//!
//! # Status codes
//!
//! Every refusal is a precise gRPC status; the message says what to change. Nothing here ever
//! puts a token or a private key into a status message or a log line. The mapping is
//! [`errors`]; the table of every refusal, its code and its `podca_grpc_refusals_total` reason is
//! `docs/grpc-api.md` ("Refusals"), checked against the mapping by a unit test in `errors`.
//! `tests/refusals.rs` checks the refusals through a tonic client.
//!
//! # Who the caller is
//!
//! * In a cluster (`podca serve`): `authorization: Bearer <service-account token>`, checked with
//!   a TokenReview for the audience `grpc.token_audience` ([`auth::TokenReviewAuthenticator`]).
//!   podca needs `tokenreviews create` and, for IssueForPod, `pods get`: nothing else.
//! * mTLS renewal (`podca serve` with TLS): a valid podca client certificate stands for its
//!   SPIFFE ID's identity without a token; with a token, both must agree
//!   ([`peer_identity::CertificateAuthenticator`]).
//! * In `podca dev` ([`auth::DevAuthenticator`]): Unix-socket callers by their uid
//!   (SO_PEERCRED), mapped through `[dev] identities`; TCP callers on loopback name their
//!   identity with the metadata `x-podca-namespace` and `x-podca-service-account` (defaulting
//!   to the first `[dev] identities` entry). Anything that can reach a loopback port can claim
//!   any identity that way: this is a development convenience, refused from other addresses.

pub mod admission;
pub mod auth;
pub mod bundle_endpoint;
pub mod client;
pub mod coalesce;
pub mod component;
pub mod connections;
pub mod core;
pub mod cork;
pub mod dev_banner;
pub mod errors;
pub mod federation;
pub mod federation_fetch;
pub mod federation_status;
pub mod istio;
pub mod jwt;
pub mod keeper;
pub mod ledger;
pub mod observe;
pub mod otlp;
pub mod peer_identity;
pub mod podca_service;
pub mod preauth;
pub mod ratelimit;
pub mod renewal;
pub mod sds;
pub mod server;
pub mod tls;
pub mod token_signer;
pub mod uds_authority;
pub mod workload;

pub use self::core::{Api, ApiOptions};
pub use podca_authority::CaHandle;
