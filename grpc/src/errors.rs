//! Why a gRPC request was refused, and the one place where that becomes a `tonic::Status`. The
//! table of every refusal is `docs/grpc-api.md` ("Refusals"), and of every policy reason's code
//! `docs/troubleshooting.md`; `docs_table` fails when they and this mapping disagree.

use podca_signer::jwt::JwtError;
use podca_signer::{BackendError, DenyReason, FailReason, KeyError};
use tonic::{Code, Status};

use super::auth::{AuthError, LookupError};

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
    /// A configured signer that is not in `[grpc] signers`.
    #[error("signer {0:?} is not offered over gRPC (it is not in grpc.signers)")]
    SignerNotAllowed(String),
    #[error(
        "too many DNS names: the certificate would carry {requested}, at most {max} are \
         allowed (grpc.max_dns_names)"
    )]
    TooManyDnsNames { requested: usize, max: usize },
    #[error("{0}")]
    Auth(#[from] AuthError),
    /// The policy said no; the code depends on the reason ([`deny_code`]).
    #[error("{reason}: {message}")]
    Denied { reason: DenyReason, message: String },
    /// The policy could not issue whatever the request (CA too close to expiry, …).
    #[error("{reason}: {message}")]
    Failed { reason: FailReason, message: String },
    #[error("requested_lifetime_seconds must be positive, got {0}")]
    BadLifetime(i64),
    #[error("{0}; retry later")]
    Unavailable(BackendError),
    /// The certificate was issued but could not be recorded in the ledger: not handed out.
    #[error("{0}; retry later")]
    LedgerUnavailable(String),
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
    #[error("cannot check the pod now: reading pod {pod}: {error}; retry later")]
    PodLookupUnavailable {
        /// `namespace/name`.
        pod: String,
        error: LookupError,
    },
    #[error("{0}")]
    PodOnOtherNode(String),
    /// Istio CA API: listing the pods on the caller's node failed or took too long.
    #[error("cannot check the pods now: listing {what}: {error}; retry later")]
    PodListUnavailable {
        /// Which pods, in words.
        what: String,
        error: LookupError,
    },
    /// IssueForPod: the caller's own pod (the one its token is bound to) is gone or another pod.
    #[error("{0}")]
    CallerPodGone(String),
    /// IssueForPod: the pod is terminating or has finished.
    #[error("{0}")]
    PodNotRunning(String),
    /// IssueForPod: a static pod's mirror, which no service account vouches for.
    #[error("{0}")]
    MirrorPod(String),
    #[error("IssueForPod needs the Kubernetes API to check the pod's node; `podca dev` has none")]
    NoPodDirectory,
    #[error("missing the `workload.spiffe.io: true` metadata required by the SPIFFE Workload API")]
    MissingWorkloadHeader,
    /// Istio CA API: `csr` is not a PEM PKCS#10 request, or names no readable SPIFFE ID.
    #[error("{0}")]
    BadIstioCsr(String),
    /// Istio CA API: the CSR asks for a name podca does not derive from the identity.
    #[error("{0}")]
    CsrNameNotAllowed(String),
    /// Istio CA API: `validity_duration` is zero or negative.
    #[error("validity_duration must be a positive number of seconds, got {0}")]
    BadValidity(i64),
    /// Istio CA API: the `ImpersonatedIdentity` metadata is not a podca SPIFFE ID of this
    /// signer's trust domain (or its Istio alias).
    #[error("{0}")]
    BadImpersonation(String),
    /// Istio CA API: no running pod with the impersonated service account on the caller's node.
    #[error("{0}")]
    NoPodOnNode(String),
    /// Istio CA API: `ImpersonatedIdentity` in `podca dev` (no Kubernetes API to check pods).
    #[error(
        "ImpersonatedIdentity needs the Kubernetes API to check the pods on the caller's node; \
         `podca dev` has none"
    )]
    ImpersonationWithoutPods,
    #[error("{0}")]
    Unimplemented(&'static str),
    /// A JWT-SVID request or token refused; the code depends on the error ([`jwt_code`]).
    #[error("{0}")]
    Jwt(JwtError),
    /// A JWT-SVID for a signer of another trust domain than the JWT keys': signers in different
    /// trust domains never share signing keys (a token of one would verify with the other's
    /// JWKS).
    #[error(
        "JWT-SVIDs are signed here for trust domain {served:?} only (the [grpc] signer's); signer \
         {signer:?} is in {trust_domain:?} and would need keys of its own"
    )]
    JwtTrustDomain {
        signer: String,
        trust_domain: String,
        served: String,
    },
    /// FetchJWTSVID: `spiffe_id` is not the caller's.
    #[error("spiffe_id {requested:?} is not this caller's identity ({own})")]
    UnknownSpiffeId { requested: String, own: String },
    /// ValidateJWTSVID: a required field is empty.
    #[error("{0} is empty")]
    EmptyField(&'static str),
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
            ApiError::BadIstioCsr(_) | ApiError::BadValidity(_) | ApiError::BadImpersonation(_) => {
                Code::InvalidArgument
            }
            ApiError::CsrNameNotAllowed(_) | ApiError::NoPodOnNode(_) => Code::PermissionDenied,
            ApiError::ImpersonationWithoutPods | ApiError::JwtTrustDomain { .. } => {
                Code::FailedPrecondition
            }
            ApiError::TooManyDnsNames { .. } => Code::InvalidArgument,
            ApiError::UnknownSigner(_) | ApiError::PodNotFound(_) => Code::NotFound,
            ApiError::SignerNotAllowed(_) | ApiError::CallerPodGone(_) => Code::PermissionDenied,
            ApiError::PodNotRunning(_) | ApiError::MirrorPod(_) => Code::FailedPrecondition,
            ApiError::Auth(a) => a.code(),
            ApiError::Denied { reason, .. } => deny_code(*reason),
            ApiError::Failed { reason, .. } => fail_code(*reason),
            ApiError::NotNodeProxy(_) | ApiError::PodOnOtherNode(_) => Code::PermissionDenied,
            ApiError::NoPodDirectory => Code::FailedPrecondition,
            ApiError::Unavailable(_)
            | ApiError::LedgerUnavailable(_)
            | ApiError::PodLookupUnavailable { .. }
            | ApiError::PodListUnavailable { .. } => Code::Unavailable,
            ApiError::RateLimited(_) | ApiError::TooManyStreams(_) => Code::ResourceExhausted,
            ApiError::Unimplemented(_) => Code::Unimplemented,
            ApiError::Jwt(e) => jwt_code(e),
            ApiError::UnknownSpiffeId { .. } => Code::PermissionDenied,
            ApiError::EmptyField(_) => Code::InvalidArgument,
            ApiError::Internal(_) => Code::Internal,
        }
    }
}

/// The code of a JWT-SVID refusal. A token that does not validate is the caller's input, so
/// `INVALID_ARGUMENT` (as SPIRE answers); a missing signing key or a backend outage is
/// `UNAVAILABLE`. The match is exhaustive, so a new error cannot reach a status by default.
fn jwt_code(e: &JwtError) -> Code {
    match e {
        JwtError::TooLarge { .. }
        | JwtError::Malformed(_)
        | JwtError::UnsupportedAlgorithm(_)
        | JwtError::BadType(_)
        | JwtError::MissingKeyId
        | JwtError::UnknownKeyId(_)
        | JwtError::AlgorithmMismatch { .. }
        | JwtError::BadSignature
        | JwtError::MissingClaim(_)
        | JwtError::BadSubject(_)
        | JwtError::NoAudience
        | JwtError::TooManyAudiences { .. }
        | JwtError::BadAudience(_)
        | JwtError::WrongAudience { .. }
        | JwtError::Expired { .. }
        | JwtError::NotYetValid { .. } => Code::InvalidArgument,
        JwtError::NoSigningKey => Code::Unavailable,
        JwtError::Backend(b) if b.is_transient() => Code::Unavailable,
        JwtError::Backend(_) | JwtError::UnusableKey(_) => Code::FailedPrecondition,
    }
}

/// The `reason` label of a JWT refusal.
fn jwt_reason(e: &JwtError) -> &'static str {
    match e {
        JwtError::TooLarge { .. } => "jwt_too_large",
        JwtError::Malformed(_) => "jwt_malformed",
        JwtError::UnsupportedAlgorithm(_) => "jwt_bad_alg",
        JwtError::BadType(_) => "jwt_bad_typ",
        JwtError::MissingKeyId | JwtError::UnknownKeyId(_) => "jwt_unknown_kid",
        JwtError::AlgorithmMismatch { .. } => "jwt_alg_mismatch",
        JwtError::BadSignature => "jwt_bad_signature",
        JwtError::MissingClaim(_) | JwtError::BadSubject(_) => "jwt_bad_claims",
        JwtError::NoAudience | JwtError::BadAudience(_) => "jwt_bad_audience",
        JwtError::TooManyAudiences { .. } => "jwt_too_many_audiences",
        JwtError::WrongAudience { .. } => "jwt_wrong_audience",
        JwtError::Expired { .. } => "jwt_expired",
        JwtError::NotYetValid { .. } => "jwt_not_yet_valid",
        JwtError::NoSigningKey => "jwt_no_key",
        JwtError::Backend(_) | JwtError::UnusableKey(_) => "jwt_key_unavailable",
    }
}

/// The code of a policy refusal. No wildcard arm: a new reason must be given its code here.
fn deny_code(reason: DenyReason) -> Code {
    match reason {
        DenyReason::MalformedPublicKey => Code::InvalidArgument,
        // A type podca certifies but this signer's `key_types` does not allow; types podca never
        // certifies are refused as `ApiError::Key` before the policy runs.
        DenyReason::UnsupportedKeyType => Code::FailedPrecondition,
        DenyReason::NamespaceNotAllowed
        | DenyReason::ServiceAccountNotAllowed
        | DenyReason::InvalidUserAnnotations
        // The pod the token names is gone (or was replaced): that identity may not be certified.
        | DenyReason::PodNotFound
        // A DNS name the CA may not certify: the caller may not have it.
        | DenyReason::NameNotPermittedByCa
        // podca's own serving name: the caller may not have it.
        | DenyReason::ReservedDnsName
        // A kubernetes.io/service-ca name the pod is not entitled to (PodCertificateRequests
        // only: gRPC callers are refused the vocabulary as InvalidUserAnnotations).
        | DenyReason::NotEntitledToName => Code::PermissionDenied,
        // A signer's CEL rule: the caller's identity or request is not allowed.
        DenyReason::Rule(_) => Code::PermissionDenied,
    }
}

/// The code of a policy failure. No wildcard arm: a new reason must be given its code here.
fn fail_code(reason: FailReason) -> Code {
    match reason {
        FailReason::CaExpiresTooSoon
        | FailReason::LifetimeNotSatisfiable
        | FailReason::InvalidDnsNameTemplate
        | FailReason::CaKeyUnusable
        | FailReason::LegacyRequestUnreadable
        | FailReason::IdentityNotPermittedByCa => Code::FailedPrecondition,
        // A bug, not something the caller can change.
        FailReason::CertificateBuildFailed => Code::Internal,
        // As `ApiError::UnknownSigner` (the API checks the signer before the policy runs).
        FailReason::UnknownSigner => Code::NotFound,
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
            AuthError::Missing | AuthError::Invalid(_) | AuthError::RenewalRefused(_) => {
                Code::Unauthenticated
            }
            AuthError::UnknownCaller(_) | AuthError::NotLoopback(_) | AuthError::Mismatch(_) => {
                Code::PermissionDenied
            }
            AuthError::Unavailable(_) | AuthError::AccountUnavailable(_) => Code::Unavailable,
            AuthError::Busy(_) | AuthError::SourceBusy(_) => Code::ResourceExhausted,
        }
    }

    /// The `reason` label of `podca_grpc_refusals_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "no_credentials",
            AuthError::Invalid(_) => "invalid_credentials",
            AuthError::UnknownCaller(_) => "unknown_caller",
            AuthError::NotLoopback(_) => "not_loopback",
            AuthError::Unavailable(_) => "tokenreview_unavailable",
            AuthError::Busy(_) => "tokenreview_busy",
            AuthError::SourceBusy(_) => "tokenreview_source_busy",
            AuthError::Mismatch(_) => "token_certificate_mismatch",
            AuthError::RenewalRefused(_) => "renewal_refused",
            AuthError::AccountUnavailable(_) => "service_account_unavailable",
        }
    }
}

impl ApiError {
    /// The `reason` label of `podca_grpc_refusals_total`: one per kind of refusal, never
    /// anything the caller sent.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::EmptyCsr => "empty_csr",
            ApiError::Key(_) => "bad_key",
            ApiError::UnknownSigner(_) => "unknown_signer",
            ApiError::SignerNotAllowed(_) => "signer_not_allowed",
            ApiError::TooManyDnsNames { .. } => "too_many_dns_names",
            ApiError::Auth(a) => a.reason(),
            ApiError::Denied { .. } => "policy_denied",
            ApiError::Failed { .. } => "policy_failed",
            ApiError::BadLifetime(_) => "bad_lifetime",
            ApiError::Unavailable(_) => "ca_unavailable",
            ApiError::RateLimited(_) => "rate_limited",
            ApiError::TooManyStreams(_) => "too_many_streams",
            ApiError::NotNodeProxy(_) => "not_node_proxy",
            ApiError::PodNotFound(_) => "pod_not_found",
            ApiError::BadPodName(_) => "bad_pod_name",
            ApiError::PodLookupUnavailable { .. } | ApiError::PodListUnavailable { .. } => {
                "pod_lookup_unavailable"
            }
            ApiError::PodOnOtherNode(_) => "pod_on_other_node",
            ApiError::CallerPodGone(_) => "caller_pod_gone",
            ApiError::PodNotRunning(_) => "pod_not_running",
            ApiError::MirrorPod(_) => "mirror_pod",
            ApiError::NoPodDirectory => "no_pod_directory",
            ApiError::MissingWorkloadHeader => "missing_workload_header",
            ApiError::BadIstioCsr(_) => "bad_csr",
            ApiError::CsrNameNotAllowed(_) => "csr_name_not_allowed",
            ApiError::BadValidity(_) => "bad_lifetime",
            ApiError::BadImpersonation(_) => "bad_impersonation",
            ApiError::NoPodOnNode(_) => "no_pod_on_node",
            ApiError::ImpersonationWithoutPods => "no_pod_directory",
            ApiError::Unimplemented(_) => "unimplemented",
            ApiError::LedgerUnavailable(_) => "ledger_unavailable",
            ApiError::Jwt(e) => jwt_reason(e),
            ApiError::UnknownSpiffeId { .. } => "unknown_spiffe_id",
            ApiError::JwtTrustDomain { .. } => "jwt_trust_domain",
            ApiError::EmptyField(_) => "empty_field",
            ApiError::Internal(_) => "internal",
        }
    }
}

#[cfg(test)]
mod docs_table;

#[cfg(test)]
mod tests {
    use super::*;

    /// Today's code for every reason (the table in `docs/troubleshooting.md`).
    #[test]
    fn every_reason_has_its_code() {
        for reason in DenyReason::ALL {
            let want = match reason {
                DenyReason::MalformedPublicKey => Code::InvalidArgument,
                DenyReason::UnsupportedKeyType => Code::FailedPrecondition,
                _ => Code::PermissionDenied,
            };
            let e = ApiError::Denied {
                reason: *reason,
                message: "m".into(),
            };
            assert_eq!(e.code(), want, "{reason}");
            assert_eq!(e.to_string(), format!("{}: m", reason.condition_reason()));
        }
        for reason in FailReason::ALL {
            let want = match reason {
                FailReason::CertificateBuildFailed => Code::Internal,
                FailReason::UnknownSigner => Code::NotFound,
                _ => Code::FailedPrecondition,
            };
            let e = ApiError::Failed {
                reason: *reason,
                message: "m".into(),
            };
            assert_eq!(e.code(), want, "{reason}");
        }
    }

    /// The texts `String` errors used to carry, kept word for word.
    #[test]
    fn lookup_failures_read_as_before() {
        let pod = |error| ApiError::PodLookupUnavailable {
            pod: "shop/web-0".into(),
            error,
        };
        let timeout = pod(LookupError::Timeout(std::time::Duration::from_secs(5)));
        assert_eq!(
            timeout.to_string(),
            "cannot check the pod now: reading pod shop/web-0: no answer within 5s; retry later"
        );
        assert_eq!(timeout.code(), Code::Unavailable);
        let failed = pod(LookupError::Failed("ApiError: 500".into()));
        assert_eq!(
            failed.to_string(),
            "cannot check the pod now: reading pod shop/web-0: ApiError: 500; retry later"
        );
    }
}
