//! podca's PKI core: subject keys, CA key backends, CAs, issuance policy, validity math and the
//! issuance ledger. No Kubernetes and no gRPC here: both edges call [`sign_request`].

pub mod backend;
pub mod ca;
pub mod constraints;
mod der;
pub mod issue;
pub mod jwt;
pub mod keys;
mod leaf;
pub mod ledger;
pub mod merkle;
pub mod merkle_note;
pub mod merkle_tiles;
pub mod merkle_verify;
pub mod names;
pub mod policy;
mod random;
pub mod reason;
pub mod renewal;
pub mod report;
pub mod rotation;
pub mod rules;
pub mod schedule;
pub mod spelling;
pub mod spiffe_bundle;
pub mod store;
pub mod tenants;
pub mod verdict;
pub mod x509;

pub use backend::{BackendError, CaAlgorithm, CaKey, FileKey, MemoryKey};
pub use ca::{CaCertificate, CaError, IssuingCa, NameConstraints};
pub use issue::{
    CertificateRequest, IssueError, IssuedCertificate, Outcome, RequestContext, sign_request,
    sign_request_with,
};
pub use keys::{KeyError, KeyType, SubjectKey};
pub use ledger::{Filter, Ledger, LedgerError, LedgerRecord, RecordContext, RecordOutcome, Source};
pub use policy::{Decision, SignerPolicy};
pub use reason::{DenyReason, FailReason};
pub use rules::{PodMetadata, PodRead, RequestSource, RuleFacts};
pub use schedule::{Validity, ValidityError, plan_validity};
pub use store::{DirLock, FileStore, InitOptions, Recovered, StoreError};
