//! The controller's error type.

/// Why the controller could not start or keep running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The cluster serves no version of PodCertificateRequest that podca can use.
    #[error(
        "certificates.k8s.io serves no PodCertificateRequest resource in v1 or v1beta1 \
         (is the PodCertificateRequest feature gate and runtime-config on?)"
    )]
    PodCertificateRequestsNotServed,
    /// No signer names were configured.
    #[error("no signer names configured")]
    NoSigners,
    /// Leader election failed.
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    /// The client configuration could not be loaded.
    #[error("Kubernetes client configuration: {0}")]
    Config(String),
    /// A task of the controller ended abnormally.
    #[error("internal task failed: {0}")]
    Task(String),
}
