//! Why the Secret backend could not start or take a step. The inner errors are part of each
//! message, so they are not also given as `source` (a chain would print them twice).

use podca_authority::secret_rotation::SecretError;
use podca_signer::x509::CertError;

use super::{HISTORY_KEY, MIN_PROPAGATION_SECONDS};
use crate::publisher::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// Why the Secret backend could not start or take a step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretCaError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("CA Secret {namespace}/{name} not found")]
    SecretNotFound { namespace: String, name: String },
    #[error("CA Secret {namespace}/{name}: {reason}")]
    InvalidSecret {
        namespace: String,
        name: String,
        reason: SecretError,
    },
    #[error("CA history ConfigMap {namespace}/{name}: {reason}")]
    History {
        namespace: String,
        name: String,
        reason: HistoryError,
    },
    #[error("Secret CA configuration: {0}")]
    Config(ConfigError),
    /// The first step installed nothing: a bug, since the Secret's CA always signs or is gated.
    #[error("no CA to install (internal error)")]
    NothingInstalled,
}

/// Why the history ConfigMap cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// Someone else's ConfigMap: podca neither reads nor overwrites it.
    #[error(
        "exists without the label {MANAGED_BY_LABEL}={MANAGED_BY_VALUE}; podca does not use or \
         overwrite it (delete it, or name another with history_configmap)"
    )]
    NotOwned,
    #[error("{HISTORY_KEY} is not readable: {detail}")]
    Unreadable { detail: String },
    #[error("records the CA of Secret {recorded}, not {configured}")]
    OtherSecret {
        recorded: String,
        configured: String,
    },
    #[error("generation {generation}: {error}")]
    Anchors { generation: u32, error: CertError },
    #[error("{HISTORY_KEY} cannot be encoded: {detail}")]
    Encode { detail: String },
}

/// A Secret backend setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("the CA Secret needs a namespace and a name (`namespace/name`)")]
    NoSecretName,
    #[error(
        "propagation_seconds {seconds} is below {MIN_PROPAGATION_SECONDS}: kubelet caches trust \
         bundles for about 5 minutes, so a shorter window risks pods that do not yet trust the \
         new CA"
    )]
    PropagationTooShort { seconds: i64 },
    #[error("max_leaf_lifetime must be positive")]
    MaxLeafLifetimeNotPositive,
}
