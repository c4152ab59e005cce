//! podca's runtime, shared by `podca serve`, `podca dev` and the command line, with no
//! Kubernetes in it:
//!
//! * [`trust`]: the [`CaHandle`] every component reads the CA and trust anchors from, and the
//!   [`Clock`] every time-dependent part reads;
//! * [`config`]: the one configuration schema (TOML, flags and environment fill it in);
//! * [`ca`]: opening the CA a configuration names (file, PKCS#11), once, for every command;
//! * [`intermediate`]: intermediate mode — the in-memory intermediate an HSM key signs, its
//!   lifetime and its renewal rule;
//! * [`rotation`]: the rotation driver of a CA held in a data directory;
//! * [`jwt`]: the `[jwt]` section, the JWT key handle and the JWT key rotation driver;
//! * [`oidc`]: OIDC discovery (`/.well-known/openid-configuration` and the JWKS);
//! * [`secret_rotation`]: the pure state machine of a CA held in a Kubernetes Secret (the
//!   controller does its Kubernetes I/O);
//! * [`metrics`], [`hsm_metrics`] and [`admin`]: the Prometheus registry and the
//!   `/metrics` `/livez` `/readyz` listener; [`metrics_auth`]: who may read `/metrics`;
//! * [`serving_cert`]: the gRPC listener's self-issued TLS certificate, its renewal rule and
//!   the task that renews it;
//! * [`ledger`]: the ledger service (redb, PostgreSQL or none): group commit, the durability
//!   contract, the audit log line, retention;
//! * [`shutdown`]: the signals that stop podca, and the one stop signal and drain deadline
//!   every task of a command shares;
//! * [`runtime`]: the [`Runtime`] every serving command composes: registry, readiness, admin
//!   listener, clock and the one two-stage drain; components register on it.
//!
//! The PKI itself (keys, policy, issuance, the ledger) is `podca_signer`; Kubernetes I/O is
//! `podca_controller`; the gRPC edge is `podca_grpc`.

pub mod admin;
pub mod bundle_endpoint;
pub mod ca;
pub mod ca_report;
pub mod cli_pages;
pub mod closed_pipe;
pub mod components;
pub mod config;
pub mod config_lint;
pub mod duration;
pub mod hsm_metrics;
pub mod intermediate;
pub mod jwt;
pub mod key_driver;
pub mod ledger;
pub mod log_format;
pub mod metrics;
pub mod metrics_auth;
pub mod oidc;
pub mod rotation;
pub mod runtime;
pub mod secret_rotation;
pub mod serving_cert;
pub mod shutdown;
pub mod slots;
#[cfg(test)]
mod test_support;
pub mod traces;
pub mod trust;

pub use runtime::{Runtime, RuntimeOptions, Stage};
pub use trust::{CaHandle, CaSet, CaSnapshot, Clock, system_clock};
