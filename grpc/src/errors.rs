//! Why a gRPC request was refused, and the one place where that becomes a `tonic::Status` (the
//! table in the module docs of [`crate`]).

use podca_signer::policy::reason;
use podca_signer::{BackendError, KeyError};
use tonic::{Code, Status};

use super::auth::AuthError;

/// Every refusal of the gRPC API. Messages carry no tokens and no key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    #[error("csr is empty; send a DER PKCS#10 certificate signing request")]
    EmptyCsr,
    #[error("{0}")]
    Key(KeyError),
    #[error("unknown signer {0:?}")]
    UnknownSigner(String),
    #[error("{0}")]
    Auth(#[from] AuthError),
    /// The policy said no (except key types, see `KeyTypeNotAllowed`).
    #[error("{reason}: {message}")]
    Denied {
        reason: &'static str,
        message: String,
    },
    /// The policy does not allow this (supported) key type.
    #[error("{reason}: {message}")]
    KeyTypeNotAllowed {
        reason: &'static str,
        message: String,
    },
    /// The policy could not issue whatever the request (CA too close to expiry, …).
    #[error("{reason}: {message}")]
    Failed {
        reason: &'static str,
        message: String,
    },
    #[error("requested_lifetime_seconds must be positive, got {0}")]
    BadLifetime(i64),
    #[error("{0}; retry later")]
    Unavailable(BackendError),
    #[error("rate limit of {0} requests per second for this identity exceeded; retry later")]
    RateLimited(u32),
    #[error("too many open streams ({0}); retry later")]
    TooManyStreams(usize),
    #[error("{0}")]
    NotNodeProxy(String),
    #[error("{0}")]
    PodNotFound(String),
    #[error("{0}")]
    BadPodName(String),
    #[error("cannot check the pod now: {0}; retry later")]
    PodLookupUnavailable(String),
    #[error("{0}")]
    PodOnOtherNode(String),
    #[error("IssueForPod needs the Kubernetes API to check the pod's node; `podca dev` has none")]
    NoPodDirectory,
    #[error("missing the `workload.spiffe.io: true` metadata required by the SPIFFE Workload API")]
    MissingWorkloadHeader,
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> Code {
        match self {
            ApiError::EmptyCsr
            | ApiError::Key(_)
            | ApiError::BadLifetime(_)
            | ApiError::BadPodName(_) => Code::InvalidArgument,
            ApiError::MissingWorkloadHeader => Code::InvalidArgument,
            ApiError::UnknownSigner(_) | ApiError::PodNotFound(_) => Code::NotFound,
            ApiError::Auth(a) => a.code(),
            ApiError::Denied { reason, .. } if *reason == reason::MALFORMED_PUBLIC_KEY => {
                Code::InvalidArgument
            }
            ApiError::Denied { .. } | ApiError::NotNodeProxy(_) | ApiError::PodOnOtherNode(_) => {
                Code::PermissionDenied
            }
            ApiError::KeyTypeNotAllowed { .. }
            | ApiError::Failed { .. }
            | ApiError::NoPodDirectory => Code::FailedPrecondition,
            ApiError::Unavailable(_) | ApiError::PodLookupUnavailable(_) => Code::Unavailable,
            ApiError::RateLimited(_) | ApiError::TooManyStreams(_) => Code::ResourceExhausted,
            ApiError::Internal(_) => Code::Internal,
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

impl AuthError {
    fn code(&self) -> Code {
        match self {
            AuthError::Missing | AuthError::Invalid(_) => Code::Unauthenticated,
            AuthError::UnknownCaller(_) | AuthError::NotLoopback(_) => Code::PermissionDenied,
            AuthError::Unavailable(_) => Code::Unavailable,
        }
    }
}
