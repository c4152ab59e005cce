//! `podca serve`: the in-cluster signer, composed on the runtime: the CA (a data directory or a
//! Secret), the ledger, the JWT keys, the gRPC API (TokenReview-authenticated, TLS), OIDC
//! discovery and the PodCertificateRequest controller, behind one admin listener and one drain.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use podca_authority::components::ca;
use podca_authority::components::ledger;
use podca_authority::config::{Config, Sharding};
use podca_authority::{Runtime, RuntimeOptions, shutdown};
use podca_controller::LeaderElection;
use podca_controller::component::{self as kube_component, ControllerFlags};
use podca_controller::grpc_auth::{KubePodDirectory, KubeTokenReviewer};
use podca_grpc::component::{self as grpc, Callers, Mode, Oidc, PodEnvironment, Settings};
use podca_grpc::jwt::JwtService;
use podca_signer::rules::NamespaceLabels;
use tracing::warn;

use podca_authority::duration::parse_duration;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: PathBuf,
    /// Kubeconfig file; default: KUBECONFIG, ~/.kube/config, then the in-cluster service account.
    #[arg(long, env = "PODCA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Admin listener (/metrics, /livez, /readyz); overrides `[admin] listen`.
    #[arg(long, env = "PODCA_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Where the adaptive PCR concurrency starts (raises a lower max_in_flight); overrides `[controller] workers`.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Bound of the PCR work queue.
    #[arg(long, default_value_t = 4096)]
    pub queue_capacity: usize,
    /// Take a coordination.k8s.io/v1 Lease; only the holder writes.
    #[arg(long)]
    pub leader_elect: bool,
    #[command(flatten)]
    pub lease: LeaseFlags,
    /// With --leader-elect, who signs PodCertificateRequests: `leader` or `rendezvous` (every
    /// replica its share); overrides `[controller] sharding`.
    #[arg(long, value_parser = crate::cli::spelled::<Sharding>(), ignore_case = true)]
    pub sharding: Option<Sharding>,
    /// With rendezvous sharding: how long a pending PodCertificateRequest waits for a member
    /// that renews its Lease but settles nothing before the next member signs it (a member
    /// seen settling others is waited for ten times as long). Default: four Lease durations,
    /// at least 60s.
    #[arg(long, value_parser = parse_duration)]
    pub takeover_after: Option<Duration>,
    /// How long shutdown may take, all of it: in-flight status writes and gRPC calls, then the
    /// ledger's last commit and the Lease's release.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// gRPC listener (podca.v1, TokenReview-authenticated); overrides `[grpc] listen`.
    #[arg(long, env = "PODCA_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// Do not serve the gRPC API (PodCertificateRequests only).
    #[arg(long)]
    pub no_grpc: bool,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    podca_authority::runtime::tokio_runtime()
        .context("starting the async runtime")?
        .block_on(serve(args))
}

/// Composes the components; runs until SIGTERM or SIGINT (or a component's failure), then
/// drains everything within `--drain-timeout`.
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        config,
        kubeconfig,
        admin_listen,
        workers,
        queue_capacity,
        leader_elect,
        lease,
        sharding,
        takeover_after,
        drain_timeout,
        grpc_listen,
        no_grpc,
    } = args;
    // Everything the configuration can get wrong is said before anything starts.
    let mut config = load_config(config)?;
    // No workload certificate may carry the names of podca's own gRPC API.
    config.reserve_serving_names(PodEnvironment::read().namespace.as_deref());
    if config.jwt.enabled {
        config.jwt.check_for_serve()?;
    }
    config.controller.sharding = sharding.unwrap_or(config.controller.sharding);
    if config.controller.sharding == Sharding::Rendezvous && !leader_elect {
        bail!("rendezvous sharding needs --leader-elect: the member Leases sit beside its Lease");
    }
    if lease.lease_renew_deadline >= lease.lease_duration {
        bail!("--lease-renew-deadline must be shorter than --lease-duration");
    }
    if let Some(after) = takeover_after {
        if config.controller.sharding != Sharding::Rendezvous {
            bail!("--takeover-after applies to rendezvous sharding only (--sharding rendezvous)");
        }
        // A member that stops renewing leaves the set after one Lease duration; taking its
        // requests over sooner would only sign them twice.
        if after < lease.lease_duration {
            bail!(
                "--takeover-after ({after:?}) must be at least --lease-duration ({:?})",
                lease.lease_duration
            );
        }
    }
    let ca_plans = ca::plan(&config, leader_elect)?;
    let grpc_settings = match no_grpc {
        true => None,
        false => Some(Settings::from_config(&config, grpc_listen, Mode::Serve)?),
    };
    let oidc = Oidc::bind(&config.jwt, grpc_settings.as_ref(), Mode::Serve).await?;
    let signals = shutdown::signals().context("installing the signal handlers")?;
    let mut rt = Runtime::new(RuntimeOptions {
        admin_listen: Some(admin_listen.unwrap_or(config.admin.listen)),
        drain_timeout,
        clock: podca_authority::system_clock(),
    });
    // The rule counters are the compiled policies' own; every component serves clones of them.
    rt.metrics().export_policies(&config.signers);
    podca_authority::traces::start(&mut rt, &config.tracing, podca_grpc::otlp::exporter)?;
    rt.leadership().send_replace(!leader_elect);

    let client = podca_controller::connect(kubeconfig.as_deref()).await?;
    podca_controller::metrics_auth::protect_metrics(&mut rt, &client, &config.admin);
    // The JWT keys and the default ledger live with the primary CA (the gRPC signer's).
    let jwt_keys =
        kube_component::primary_jwt(&mut rt, &client, &config, &ca_plans, leader_elect).await?;
    let redb = ca_plans.primary_dir().map(|dir| dir.ledger_path());
    let log_key = kube_component::ledger_log_key(&client, &config, &ca_plans).await?;
    let ledger = ledger::start(&mut rt, &config.ledger, redb.as_deref(), log_key).await?;
    let ca = kube_component::start_cas(&mut rt, &client, &config, ca_plans).await?;
    // Only when a rule reads `namespaceObject.metadata.labels`: otherwise podca needs no
    // namespace access.
    let namespace_labels = config
        .signers
        .values()
        .any(|policy| policy.rules_use_namespace_labels())
        .then(NamespaceLabels::default);
    if let Some(settings) = grpc_settings {
        // The serving certificate comes from the gRPC signer's own CA.
        let serving = grpc::serving_keys(
            &mut rt,
            &settings,
            ca.for_signer(&settings.api.default_signer),
        )?;
        match (&jwt_keys, oidc) {
            (Some(keys), Some((oidc, _issuer))) => oidc.serve(&mut rt, keys, serving.clone())?,
            (None, Some((oidc, _))) => warn!(
                url = oidc.url(),
                "[jwt] oidc_listen is set but this podca serve has no JWT signing keys: OIDC \
                 discovery is not served"
            ),
            (_, None) => {}
        }
        let callers = Callers::Kubernetes {
            reviewer: Arc::new(KubeTokenReviewer::new(client.clone())),
            pods: Arc::new(KubePodDirectory::new(client.clone())),
            namespace_labels: namespace_labels.clone(),
        };
        let jwt = jwt_keys
            .clone()
            .map(|keys| Arc::new(JwtService::new(keys, &config.jwt)));
        grpc::start(
            &mut rt,
            settings,
            callers,
            serving,
            &ca,
            ledger.clone(),
            jwt,
            None,
        )
        .await?;
    }
    if let Some(keys) = &jwt_keys {
        let namespace = jwks_configmap_namespace(&config, &PodEnvironment::read());
        let discovery = match config.jwt.issuer.clone() {
            Some(issuer) => Some(grpc::discovery(&config.jwt, issuer)?),
            None => None,
        };
        kube_component::jwks(&mut rt, &client, &config, &namespace, discovery, keys, &ca);
    }
    podca_grpc::bundle_endpoint::start(&mut rt, &config, &ca, jwt_keys.as_ref()).await?;
    let own = config.signers.values().map(|p| p.trust_domain.clone());
    let federated = podca_grpc::federation::FederatedBundles::new(own);
    podca_grpc::federation_fetch::start(&mut rt, &config.federation, &federated, None)?;
    let flags = ControllerFlags {
        workers,
        queue_capacity,
        leader_election: leader_elect.then(|| {
            let LeaseFlags {
                lease_name,
                lease_namespace,
                lease_identity,
                lease_duration,
                lease_renew_deadline,
                lease_retry_period,
            } = lease;
            LeaderElection::new(lease_name, lease_namespace, lease_identity).with_timings(
                lease_duration,
                lease_renew_deadline,
                lease_retry_period,
            )
        }),
    };
    let mut options = kube_component::options(&config, flags, ca, ledger, namespace_labels);
    options.takeover_after = takeover_after;
    // Each federated trust domain's bundle, as a ClusterTrustBundle for its signers' pods.
    options.foreign_anchors = (!config.federation.is_empty()).then(|| federated.subscribe());
    kube_component::controller(&mut rt, client, options);
    rt.run(signals).await?;
    Ok(())
}

/// The configuration file `--config` names, with at least one signer.
fn load_config(path: PathBuf) -> anyhow::Result<Config> {
    let config = Config::load(&path)?;
    if config.signers.is_empty() {
        bail!(
            "{}: no [signers.\"<name>\"] table configured",
            path.display()
        );
    }
    Ok(config)
}

/// The JWKS ConfigMap's namespace: `[jwt] jwks_configmap_namespace`, else `[grpc]
/// tls_namespace`, else the pod's namespace, else `default`.
fn jwks_configmap_namespace(config: &Config, pod: &PodEnvironment) -> String {
    config
        .jwt
        .jwks_configmap_namespace
        .clone()
        .or_else(|| config.grpc.tls_namespace.clone())
        .or_else(|| pod.namespace.clone())
        .unwrap_or_else(|| "default".into())
}

/// The `--lease-*` flags (used with `--leader-elect`).
#[derive(Debug, Args)]
pub struct LeaseFlags {
    /// Name of the leader Lease.
    #[arg(long, default_value = "podca-controller")]
    pub lease_name: String,
    /// Namespace of the leader Lease (default: POD_NAMESPACE, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Identity in the Lease (default: POD_NAME or the host name, plus a random suffix).
    #[arg(long)]
    pub lease_identity: Option<String>,
    /// How long a Lease is valid after its last renewal (e.g. `15s`).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// The holder renews this long after its last renewal at the latest (e.g. `10s`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lease_renew_deadline: Duration,
    /// Wait between attempts after a leader-election error (e.g. `2s`).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub lease_retry_period: Duration,
}
