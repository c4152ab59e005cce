//! podca and the Kubernetes API: the PodCertificateRequest signer.
//!
//! [`run`] discovers the served `certificates.k8s.io` versions, optionally takes a leader Lease,
//! watches PCRs of the configured signer names, and answers each with exactly one `/status`
//! write: fetch → decide (pure, via `podca_signer::sign_request`) → write.

pub mod bounded;
pub mod component;
pub mod concurrency;
mod controller;
mod decide;
mod discovery;
pub mod doctor;
mod error;
pub mod grpc_auth;
pub mod jwks;
pub mod jwt_secret;
mod lease;
pub mod log_key_secret;
mod membership;
pub mod metrics_auth;
pub mod namespaces;
mod plan;
pub mod policy_test;
pub mod publisher;
mod queue;
mod request;
pub mod sample;
pub mod secret_ca;
pub mod secret_history;
pub mod service_ca;
mod sharding;
mod watched;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use podca_signer::SignerPolicy;

use podca_authority::metrics;
use podca_authority::{CaSet, Clock, system_clock};

pub use controller::run;
pub use error::Error;
pub use lease::LeaderElection;

/// Everything [`run`] needs.
#[derive(Clone)]
pub struct Options {
    /// Signer name → policy; one watch per name.
    pub signers: BTreeMap<String, SignerPolicy>,
    /// The signing CAs, and which signer signs with which; swapped by rotations and reloads.
    pub ca: CaSet,
    /// The time used for certificates and latency figures.
    pub clock: Clock,
    /// Where the controller's metrics go (shared with the publisher and the rotation driver).
    pub metrics: Arc<metrics::Metrics>,
    /// Where the adaptive limit on PCR decisions in flight starts ([`concurrency`]).
    pub workers: usize,
    /// The most PCR decisions in flight at once, whatever the limit.
    pub max_in_flight: usize,
    /// Bound of the work queue.
    pub queue_capacity: usize,
    pub leader_election: Option<LeaderElection>,
    /// With leader election: the holder signs every PCR, or every member its share.
    pub sharding: podca_authority::config::Sharding,
    /// Rendezvous: how long a pending request waits for a member that renews its Lease but
    /// settles nothing before the next member takes it; `None`: four Lease durations, at least
    /// a minute (`sharding::takeover_after`).
    pub takeover_after: Option<Duration>,
    /// How long shutdown waits for in-flight writes.
    pub drain_timeout: Duration,
    /// The controller name in Events.
    pub reporting_controller: String,
    /// The instance name in Events (pod name).
    pub reporting_instance: Option<String>,
    /// Publish a ClusterTrustBundle per signer name while leading; `None`: no publishing.
    pub publisher: Option<publisher::PublisherOptions>,
    /// Where [`run`] reports whether this process leads (true without leader election), for
    /// callers that must act only as leader; `None`: not reported.
    pub leadership: Option<tokio::sync::watch::Sender<bool>>,
    /// Where every answer is recorded, durably before its status write; `None`: not recorded.
    pub ledger: Option<podca_authority::ledger::LedgerHandle>,
    /// The controller's say in `/readyz` (ready once its watches have synced, or as a standby);
    /// `None`: reported nowhere.
    pub ready: Option<podca_authority::admin::ReadyFlag>,
    /// The namespace labels the signers' rules read; [`run`] watches namespaces into it.
    /// `None`: no rule reads `namespaceObject.metadata.labels` (podca then needs no namespace permission).
    pub namespace_labels: Option<podca_signer::rules::NamespaceLabels>,
    /// The X.509 authorities of the federated trust domains in force (`[[federation]]`): the
    /// publisher keeps a ClusterTrustBundle of each for every signer that federates with it.
    /// `None`: no federation.
    pub foreign_anchors: Option<publisher::ForeignAnchors>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("signers", &self.signers.keys().collect::<Vec<_>>())
            .field(
                "cas",
                &self.ca.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field("workers", &self.workers)
            .field("max_in_flight", &self.max_in_flight)
            .field("queue_capacity", &self.queue_capacity)
            .field("leader_election", &self.leader_election)
            .field("publisher", &self.publisher)
            .finish_non_exhaustive()
    }
}

impl Options {
    /// Defaults for everything but the signers and the CA.
    pub fn new(signers: BTreeMap<String, SignerPolicy>, ca: impl Into<CaSet>) -> Self {
        Options {
            signers,
            ca: ca.into(),
            clock: system_clock(),
            metrics: Arc::new(metrics::Metrics::new()),
            workers: 8,
            max_in_flight: 64,
            queue_capacity: 4096,
            leader_election: None,
            sharding: Default::default(),
            takeover_after: None,
            drain_timeout: Duration::from_secs(10),
            reporting_controller: "podca.dev/signer".into(),
            reporting_instance: None,
            publisher: None,
            leadership: None,
            ledger: None,
            ready: None,
            namespace_labels: None,
            foreign_anchors: None,
        }
    }
}

/// A client from a kubeconfig file, or else the usual inference (`KUBECONFIG`,
/// `~/.kube/config`, in-cluster service account), with podca's timeouts and retry budget
/// ([`bounded`]).
pub async fn connect(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
    };
    bounded::configure(&mut config);
    Ok(kube::Client::try_from(config)?)
}

/// Runs until `shutdown` resolves (see [`run`]); a convenience for tests and the binary.
pub async fn run_until(
    client: kube::Client,
    options: Options,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    run(client, options, shutdown).await
}
