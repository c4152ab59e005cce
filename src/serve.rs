//! `podca serve`: the in-cluster signer: the PodCertificateRequest controller, the gRPC API
//! (TokenReview-authenticated), the CA rotation driver and the admin server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use podca_authority::admin::Readiness;
use podca_authority::ca::{self, HsmKeySlot};
use podca_authority::config::{CaConfig, Config, GrpcTls, SelfIssuedTls};
use podca_authority::hsm_metrics::HsmMetrics;
use podca_authority::jwt::{JwtConfig, JwtHandle, JwtRotation, JwtRotator, OidcTls, oidc_tls};
use podca_authority::ledger::{self, LedgerHandle, LedgerMetrics, Store};
use podca_authority::metrics::Metrics;
use podca_authority::oidc::{self, Discovery, OidcLimits};
use podca_authority::rotation::{Rotator, RotatorOptions};
use podca_authority::serving_cert::{self, ServingIdentity};
use podca_authority::shutdown::{self, Shutdown};
use podca_authority::{CaHandle, Clock};
use podca_controller::grpc_auth::{KubePodDirectory, KubeTokenReviewer};
use podca_controller::jwks::JwksPublisher;
use podca_controller::jwt_secret::{JwtSecretRotator, JwtSecretStore};
use podca_controller::publisher::{Publisher, PublisherOptions};
use podca_controller::secret_ca::{SecretCa, SecretCaOptions};
use podca_controller::{LeaderElection, Options};
use podca_grpc::auth::{
    Authenticator, PodDirectory, TokenReviewAuthenticator, TokenReviewLimits, TokenReviewer,
};
use podca_grpc::connections::ConnectionLimits;
use podca_grpc::core::IstioOptions;
use podca_grpc::jwt::JwtService;
use podca_grpc::peer_identity::{CertificateAuthenticator, ClientTrust};
use podca_grpc::tls::{self, ServingFiles, ServingKeys};
use podca_grpc::{Api, ApiOptions, server};
use podca_signer::jwt::JwtAlgorithm;
use podca_signer::rules::NamespaceLabels;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kubeconfig file; default: KUBECONFIG, ~/.kube/config, then the in-cluster service account.
    #[arg(long, env = "PODCA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Admin listener (/metrics, /livez, /readyz); overrides `[admin] listen`.
    #[arg(long, env = "PODCA_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Concurrent PCR workers; overrides `[controller] workers`.
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
    /// How long shutdown waits for in-flight status writes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// gRPC listener (podca.v1, TokenReview-authenticated); overrides `[grpc] listen`.
    #[arg(long, env = "PODCA_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// Do not serve the gRPC API (PodCertificateRequests only).
    #[arg(long)]
    pub no_grpc: bool,
}

/// `15s`, `2m`, `500ms` or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 15s, 2m or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{text:?}: unknown unit {unit:?} (use ms, s or m)")),
    }
}

/// How long the background tasks (CA driver, HSM metrics, gRPC server) get, all together, to
/// stop once the controller has returned.
const TASK_DRAIN_DEADLINE: Duration = Duration::from_secs(5);

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        config,
        kubeconfig,
        admin_listen,
        workers,
        queue_capacity,
        leader_elect,
        lease,
        drain_timeout,
        grpc_listen,
        no_grpc,
    } = args;
    let config = load_config(config)?;
    if config.jwt.enabled {
        config.jwt.check_for_serve()?;
    }
    if lease.lease_renew_deadline >= lease.lease_duration {
        bail!("--lease-renew-deadline must be shorter than --lease-duration");
    }
    let mut metrics = Metrics::new();
    let backend = open_backend(&config, leader_elect, &mut metrics)?;
    let ledger_metrics = LedgerMetrics::register(&mut metrics.registry);
    let grpc = if no_grpc {
        None
    } else {
        Some(grpc_settings(&config, grpc_listen)?)
    };
    let oidc = oidc_settings(&config.jwt, grpc.as_ref())?;
    let controller = ControllerFlags {
        workers,
        queue_capacity,
        admin_listen,
        drain_timeout,
        leader_election: leader_elect.then(|| leader_election_options(lease)),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(Prepared {
        kubeconfig,
        config,
        backend,
        grpc,
        oidc,
        controller,
        clock: podca_authority::system_clock(),
        metrics: Arc::new(metrics),
        ledger_metrics,
    }))
}

/// The configuration file `--config` names, with at least one signer.
fn load_config(path: Option<PathBuf>) -> anyhow::Result<Config> {
    let path = path.context("--config is required for `podca serve`")?;
    let config = Config::load(&path)?;
    if config.signers.is_empty() {
        bail!(
            "{}: no [signers.\"<name>\"] table configured",
            path.display()
        );
    }
    Ok(config)
}

/// Everything [`run`] checked and opened before the async runtime starts.
struct Prepared {
    kubeconfig: Option<PathBuf>,
    config: Config,
    backend: Backend,
    grpc: Option<GrpcSettings>,
    /// OIDC discovery (`[jwt] oidc_listen`), checked against the gRPC listener's TLS.
    oidc: Option<OidcSettings>,
    controller: ControllerFlags,
    clock: Clock,
    metrics: Arc<Metrics>,
    ledger_metrics: LedgerMetrics,
}

/// Connects to the API, starts the CA driver and the gRPC API, runs the controller until
/// SIGTERM or SIGINT, then drains the other tasks.
async fn serve(prepared: Prepared) -> anyhow::Result<()> {
    let Prepared {
        kubeconfig,
        config,
        backend,
        grpc,
        oidc,
        controller,
        clock,
        metrics,
        ledger_metrics,
    } = prepared;
    let client = podca_controller::connect(kubeconfig.as_deref()).await?;
    let mut tasks = Shutdown::new();
    let (leadership, _) = watch::channel(controller.leader_election.is_none());
    let default_redb = match &backend {
        Backend::Files(files) => Some(files.rotator.store.ledger_path()),
        Backend::Secret(_) => None,
    };
    let ledger = start_ledger(
        &config.ledger,
        default_redb.as_deref(),
        ledger_metrics,
        &leadership,
        &mut tasks,
    )
    .await?;
    // The JWT-SVID RPCs' keys; OIDC discovery and the JWKS ConfigMap read them too.
    let jwt = match &config.ca {
        CaConfig::Secret(ca) if config.jwt.enabled => Some(
            start_secret_jwt(
                &config.jwt,
                JwtSecretStore::new(
                    client.clone(),
                    &ca.namespace,
                    &config.jwt.keys_secret_for(&ca.name),
                    Arc::clone(&metrics),
                ),
                &metrics,
                &leadership,
                &clock,
                &mut tasks,
            )
            .await?,
        ),
        _ => start_jwt(
            &config.jwt,
            &config.ca,
            &backend,
            &metrics,
            controller.leader_election.is_some(),
            &leadership,
            &clock,
            &mut tasks,
        )?,
    };
    let handle = match backend {
        Backend::Files(files) => files.start(&clock, &metrics, &mut tasks),
        Backend::Secret(mut options) => {
            options.leading = Some(leadership.subscribe());
            let (handle, driver) = SecretCa::start(
                client.clone(),
                options,
                Arc::clone(&clock),
                Arc::clone(&metrics),
            )
            .await
            .context("opening the CA Secret")?;
            tasks.spawn("secret CA driver", driver.run(tasks.receiver()));
            handle
        }
    };
    // The serving certificate of the gRPC listener, which OIDC discovery shares.
    let serving_keys = match &grpc {
        Some(grpc) => start_serving_keys(
            grpc.tls.clone(),
            &grpc.trust_domain,
            &handle,
            &clock,
            &metrics,
            &mut tasks,
        )?,
        None => None,
    };
    // /readyz: the controller (watches synced, or standby), the gRPC API and OIDC discovery
    // (each while listening).
    let readiness = Readiness::new();
    if let Some(jwt) = &jwt {
        if let Some(oidc) = oidc {
            start_oidc(
                oidc,
                jwt,
                serving_keys.clone(),
                &metrics,
                &readiness,
                &mut tasks,
            )
            .await?;
        }
        if !config.jwt.jwks_configmap.is_empty() {
            let namespace = jwks_configmap_namespace(&config, &PodEnvironment::read());
            let publisher = JwksPublisher::new(
                client.clone(),
                &namespace,
                &config.jwt.jwks_configmap,
                discovery(&config.jwt)?,
                jwt.clone(),
                Arc::clone(&metrics),
            );
            info!(
                configmap = %format!("{namespace}/{}", config.jwt.jwks_configmap),
                "the leader publishes the JWKS in a ConfigMap"
            );
            tasks.spawn(
                "JWKS ConfigMap",
                publisher.run(leadership.subscribe(), tasks.receiver()),
            );
        }
    } else if let Some(oidc) = oidc {
        warn!(
            listen = %oidc.listen,
            "[jwt] oidc_listen is set but this podca serve has no JWT signing keys: OIDC \
             discovery is not served"
        );
    }
    // Only when a rule reads `namespaceObject.metadata.labels`: otherwise podca needs no namespace access.
    let namespace_labels = config
        .signers
        .values()
        .any(|policy| policy.rules_use_namespace_labels())
        .then(NamespaceLabels::default);
    if let Some(grpc) = grpc {
        let kube = GrpcKube {
            reviewer: Arc::new(KubeTokenReviewer::new(client.clone())),
            pods: Arc::new(KubePodDirectory::new(client.clone())),
            namespace_labels: namespace_labels.clone(),
        };
        let grpc = GrpcSettings {
            ledger: ledger.clone(),
            jwt: jwt
                .clone()
                .map(|keys| Arc::new(JwtService::new(keys, &config.jwt))),
            ..grpc
        };
        start_grpc(
            grpc,
            kube,
            serving_keys,
            &handle,
            &clock,
            &metrics,
            &readiness,
            &mut tasks,
        )
        .await?;
    }
    let mut options = controller_options(&config, controller, handle, clock, metrics, readiness);
    options.ledger = Some(ledger);
    options.namespace_labels = namespace_labels;
    // The controller says here whether this replica leads; the Secret CA driver follows it.
    options.leadership = Some(leadership);
    let result = podca_controller::run(client, options, shutdown::signal()).await;
    tasks.drain(TASK_DRAIN_DEADLINE).await;
    result?;
    Ok(())
}

/// JWT-SVID signing keys (`[jwt] enabled`) of a Secret-held CA: in the Secret `[jwt]
/// keys_secret` (default `<CA Secret>-jwt`) beside the CA Secret, written by the leader (the one
/// process without `--leader-elect`) and followed by standbys (`podca_controller::jwt_secret`).
async fn start_secret_jwt(
    config: &JwtConfig,
    store: JwtSecretStore,
    metrics: &Arc<Metrics>,
    leadership: &watch::Sender<bool>,
    clock: &Clock,
    tasks: &mut Shutdown,
) -> anyhow::Result<JwtHandle> {
    info!(
        secret = %store.secret(),
        "the JWT signing keys are kept in a Secret; the leader rotates them, standbys follow"
    );
    let rotator = Arc::new(
        JwtSecretRotator::start(
            store,
            config,
            Arc::clone(clock),
            JWT_POLL,
            leadership.subscribe(),
            Arc::clone(metrics),
        )
        .await
        .context("the JWT signing keys ([jwt])")?,
    );
    if rotator.handle().current().infos().next().is_none() {
        warn!(
            "no JWT signing key in the Secret yet: no JWT-SVID is signed until the leader makes one"
        );
    }
    tasks.spawn(
        "JWT key Secret driver",
        Arc::clone(&rotator).run(tasks.receiver()),
    );
    Ok(rotator.handle().clone())
}

/// JWT-SVID signing keys (`[jwt] enabled`) of a data-directory CA, in `<dir>/jwt/` as in `podca
/// dev`: rotated on `[jwt]`'s schedule by this process, by the leader only with
/// `--leader-elect` (standbys follow the directory), or only followed when the directory is
/// read-only. A Secret-held CA's keys are [`start_secret_jwt`]'s.
#[allow(clippy::too_many_arguments)]
fn start_jwt(
    config: &JwtConfig,
    ca: &CaConfig,
    backend: &Backend,
    metrics: &Arc<Metrics>,
    leader_elect: bool,
    leadership: &watch::Sender<bool>,
    clock: &Clock,
    tasks: &mut Shutdown,
) -> anyhow::Result<Option<JwtHandle>> {
    if !config.enabled {
        return Ok(None);
    }
    let store = match backend {
        Backend::Files(files) => files.rotator.store.clone(),
        // Its keys are start_secret_jwt's.
        Backend::Secret(_) => return Ok(None),
    };
    let rotation = if !dir_writable(store.dir()) {
        info!(
            dir = %store.dir().display(),
            "the CA data directory is read-only: JWT keys are followed, not rotated"
        );
        JwtRotation::Follow
    } else if leader_elect {
        info!("JWT key rotation runs on the leader only (--leader-elect); standbys follow");
        JwtRotation::WhileLeading(leadership.subscribe())
    } else {
        JwtRotation::Automatic
    };
    let rotator = Arc::new(
        JwtRotator::start_with(
            // File keys in `<dir>/jwt/`, or keys in the CA's token with `[ca] pkcs11`.
            podca_authority::jwt::open_store(ca)?.with_lock_wait(ROTATOR_LOCK_WAIT),
            config,
            Arc::clone(clock),
            JWT_POLL,
            rotation,
        )
        .context("the JWT signing keys ([jwt])")?
        .with_metrics(Arc::clone(metrics)),
    );
    if rotator.handle().current().infos().next().is_none() {
        warn!("no JWT signing key in the data directory yet: no JWT-SVID is signed until one is");
    }
    tasks.spawn(
        "JWT key rotation driver",
        Arc::clone(&rotator).run(tasks.receiver()),
    );
    Ok(Some(rotator.handle().clone()))
}

/// How often the JWT key driver looks at the data directory (other writers' changes).
const JWT_POLL: Duration = Duration::from_secs(5);

/// How long the rotation driver waits for another writer of the data directory per tick.
const ROTATOR_LOCK_WAIT: Duration = Duration::from_secs(2);
/// Opens the `[ledger]` store (a one-line error when it cannot be: unreachable, credentials,
/// TLS, a newer schema, a redb file in use) and spawns its writer and, for the leader, its
/// retention. Every replica records into it, leader or standby.
async fn start_ledger(
    config: &ledger::LedgerConfig,
    default_redb: Option<&Path>,
    metrics: LedgerMetrics,
    leadership: &watch::Sender<bool>,
    tasks: &mut Shutdown,
) -> anyhow::Result<LedgerHandle> {
    let Some(store) = Store::open(&config.backend, default_redb).await? else {
        warn!("[ledger] backend = \"none\": decisions are written to the audit log only");
        return Ok(LedgerHandle::none());
    };
    info!(backend = store.label(), on_unavailable = ?config.on_unavailable, "ledger open");
    if let Some(retention) = config.retention {
        tasks.spawn(
            "ledger retention",
            ledger::apply_retention(
                store.clone(),
                retention,
                leadership.subscribe(),
                tasks.receiver(),
            ),
        );
    }
    let (handle, writer) = ledger::start(store, config, metrics);
    tasks.spawn("ledger writer", writer.run(tasks.receiver()));
    Ok(handle)
}

/// Where the CA comes from, as set up before the runtime starts.
enum Backend {
    /// A data directory (file or PKCS#11 keys), followed and rotated by the rotation driver.
    Files(FilesBackend),
    /// A kubernetes.io/tls Secret, read and watched through the API.
    Secret(SecretCaOptions),
}

/// A CA data directory, opened: the handle serving its active CA and what its drivers need.
struct FilesBackend {
    handle: CaHandle,
    rotator: RotatorOptions,
    hsm: Option<(HsmKeySlot, HsmMetrics)>,
}

/// Opens the CA `[ca]` names. A data directory is opened here, so a wrong PIN, a missing token
/// or a broken directory is a start-up error; a Secret is opened once the API is reachable.
fn open_backend(
    config: &Config,
    leader_elect: bool,
    metrics: &mut Metrics,
) -> anyhow::Result<Backend> {
    let max_leaf_lifetime = config.max_leaf_lifetime();
    match &config.ca {
        CaConfig::Secret(secret) => {
            config.rotation.validate()?;
            let mut o = SecretCaOptions::new(&secret.namespace, &secret.name);
            o.schedule = config.rotation;
            o.max_leaf_lifetime = max_leaf_lifetime;
            // podca's own bundles keep a copy of the sealed history (see secret_ca).
            if let Some(publisher) = publisher_options(config) {
                o.history_copies = Publisher::new(config.signers.keys(), &publisher)
                    .context("[trust_bundles]")?
                    .bundles()
                    .to_vec();
            }
            Ok(Backend::Secret(o))
        }
        CaConfig::File(_) | CaConfig::Pkcs11(_) => {
            let source = ca::open(&config.ca, max_leaf_lifetime)?;
            if dir_writable(source.store.dir()) {
                // A writer killed mid-change left the directory half-way: finish or roll back
                // first (under the directory's lock, which every writer shares).
                source
                    .store
                    .recover()
                    .context("repairing the CA data directory")?;
            }
            // Opening the CA here makes a wrong PIN, a missing token or a broken data directory
            // a start-up error rather than a stream of pending requests.
            let (ca, anchors) = source.load().context("opening the CA")?;
            let hsm_metrics = source
                .hsm
                .as_ref()
                .map(|_| HsmMetrics::register(&mut metrics.registry));
            let automatic = automatic_rotation(&source, leader_elect);
            if automatic {
                config.rotation.validate()?;
            }
            let rotator = RotatorOptions {
                // The driver runs on the async runtime: wait briefly for a CLI writer, and
                // retry at the next tick rather than block.
                store: source.store.clone().with_lock_wait(ROTATOR_LOCK_WAIT),
                schedule: config.rotation,
                automatic,
                max_leaf_lifetime,
                poll: Duration::from_secs(5),
                open: Arc::clone(&source.open),
                refresh_when: source.intermediate,
            };
            Ok(Backend::Files(FilesBackend {
                handle: CaHandle::new(ca, anchors),
                rotator,
                hsm: source.hsm.zip(hsm_metrics),
            }))
        }
    }
}

/// Whether the rotation driver takes scheduled steps: when the configuration asks for it,
/// unless replicas share the directory (`--leader-elect`) or it is read-only; either is logged.
fn automatic_rotation(source: &ca::CaSource, leader_elect: bool) -> bool {
    let configured = source.automatic_rotation;
    if configured && leader_elect {
        // Replicas do not share a writable data directory: each would make its own CA.
        info!(
            "automatic CA rotation is off with --leader-elect; rotate with `podca ca \
             rotate` on the CA data directory (every replica follows the change without \
             a restart)"
        );
        return false;
    }
    if configured && !dir_writable(source.store.dir()) {
        info!(
            dir = %source.store.dir().display(),
            "the CA data directory is read-only: automatic CA rotation is off (changes \
             to it are still followed)"
        );
        return false;
    }
    configured
}

/// Whether podca may write the CA state in `dir` (a Secret mount is read-only).
fn dir_writable(dir: &Path) -> bool {
    let probe = dir.join(format!(".podca-write-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            true
        }
        Err(_) => false,
    }
}

impl FilesBackend {
    /// Spawns the rotation driver and (HSM) the metrics exporter; returns the CA handle.
    fn start(self, clock: &Clock, metrics: &Arc<Metrics>, tasks: &mut Shutdown) -> CaHandle {
        let FilesBackend {
            handle,
            rotator,
            hsm,
        } = self;
        let rotator = Rotator::new(
            rotator,
            handle.clone(),
            Arc::clone(clock),
            Arc::clone(metrics),
        );
        tasks.spawn(
            "CA rotation driver",
            Arc::new(rotator).run(tasks.receiver()),
        );
        if let Some((slot, hsm_metrics)) = hsm {
            tasks.spawn("HSM metrics", hsm_metrics.export(slot, tasks.receiver()));
        }
        handle
    }
}

/// The gRPC API as configured, before its listener is bound.
struct GrpcSettings {
    listen: SocketAddr,
    api: ApiOptions,
    audience: String,
    /// `[grpc] max_token_reviews`, `token_cache_seconds`.
    token_reviews: TokenReviewLimits,
    tls: GrpcTls,
    /// The trust domain of the gRPC signer's policy: podca's own SPIFFE ID is in it.
    trust_domain: String,
    /// Caps on connections before any TLS or authentication.
    limits: ConnectionLimits,
    /// With TLS: accept podca client certificates for renewal without a token.
    mtls_renewal: bool,
    /// Where the API records its decisions (set once the ledger is open).
    ledger: LedgerHandle,
    /// JWT-SVIDs (`IssueJwtSvid`, `GetJwtBundle`; set once the keys are open); None: off.
    jwt: Option<Arc<JwtService>>,
    /// `[grpc] istio_token_audience`: the audience of the Istio CA API's tokens.
    istio_audience: String,
    /// `[grpc] istio_trust_domain_alias` (`None` when empty).
    istio_trust_domain_alias: Option<String>,
}

/// The gRPC API's settings: `--grpc-listen` over `[grpc] listen`, the signer it issues for.
fn grpc_settings(config: &Config, listen: Option<SocketAddr>) -> anyhow::Result<GrpcSettings> {
    let (signer_name, policy) = config.grpc_signer()?;
    let listen = listen.unwrap_or(config.grpc.listen);
    let tls = config.grpc.tls(listen)?;
    Ok(GrpcSettings {
        listen,
        tls,
        trust_domain: policy.trust_domain.clone(),
        api: ApiOptions {
            signers: config.signers.clone(),
            default_signer: signer_name.to_owned(),
            allowed_signers: config.grpc_allowed_signers()?,
            max_dns_names: config.grpc.max_dns_names,
            node_proxy_service_accounts: config.grpc.node_proxy_service_accounts.clone(),
            rate_limit_per_identity: config.grpc.rate_limit_per_identity,
            max_open_streams: config.grpc.max_open_streams,
        },
        audience: config.grpc.token_audience.clone(),
        limits: ConnectionLimits {
            per_peer: config.grpc.max_connections_per_peer.get(),
            total: config.grpc.max_connections.get(),
        },
        mtls_renewal: config.grpc.mtls_renewal,
        ledger: LedgerHandle::none(),
        jwt: None,
        istio_audience: config.grpc.istio_token_audience.clone(),
        istio_trust_domain_alias: Some(config.grpc.istio_trust_domain_alias.clone())
            .filter(|alias| !alias.is_empty()),
        token_reviews: TokenReviewLimits {
            max_concurrent: config.grpc.max_token_reviews,
            cache_ttl: std::time::Duration::from_secs(config.grpc.token_cache_seconds),
            ..TokenReviewLimits::default()
        },
    })
}

/// What the gRPC API asks the Kubernetes API: TokenReviews, and the Pods tokens are bound to.
struct GrpcKube {
    reviewer: Arc<dyn TokenReviewer>,
    pods: Arc<dyn PodDirectory>,
    /// Namespace labels for policy rules (the controller's namespace watch fills them).
    namespace_labels: Option<NamespaceLabels>,
}

/// Binds the gRPC listener and spawns the server; `/readyz` covers it from now until it stops.
/// `keys`: the serving certificate ([`start_serving_keys`]; `None`: plaintext).
#[allow(clippy::too_many_arguments)]
async fn start_grpc(
    settings: GrpcSettings,
    kube: GrpcKube,
    keys: Option<Arc<ServingKeys>>,
    handle: &CaHandle,
    clock: &Clock,
    metrics: &Metrics,
    readiness: &Arc<Readiness>,
    tasks: &mut Shutdown,
) -> anyhow::Result<()> {
    let GrpcSettings {
        listen,
        api,
        audience,
        token_reviews,
        tls,
        // Already in the serving certificate (`keys`).
        trust_domain: _,
        limits,
        mtls_renewal,
        ledger,
        jwt,
        istio_audience,
        istio_trust_domain_alias,
    } = settings;
    let client_trust = match (&tls, mtls_renewal) {
        (GrpcTls::Off { .. }, _) | (_, false) => None,
        _ => Some(start_client_trust(&api, handle, tasks)?),
    };
    let tls = keys
        .map(|keys| tls::server_config(keys, client_trust.clone()))
        .transpose()?;
    let tcp = TcpListener::bind(listen)
        .await
        .with_context(|| format!("gRPC: listening on {listen}"))?;
    info!(
        addr = %tcp.local_addr()?,
        audience,
        istio_audience,
        tls = tls.is_some(),
        "gRPC API (podca.v1, Istio CA API) listening"
    );
    let grpc_ready = readiness.component("grpc");
    grpc_ready.set(true);
    let reviewer_for = |audience: String| {
        TokenReviewAuthenticator::with_limits(Arc::clone(&kube.reviewer), audience, token_reviews)
            .with_clock(Arc::clone(clock))
            .with_metrics(metrics.grpc.clone())
    };
    let podca_tokens = reviewer_for(audience);
    // One pool of TokenReview slots for both audiences: max_token_reviews bounds them all.
    let istio_tokens = reviewer_for(istio_audience).sharing_slots_with(&podca_tokens);
    // podca.v1 and the Istio CA API: the same checks, each its own token audience.
    let with_certificates = |tokens: Arc<dyn Authenticator>| -> Arc<dyn Authenticator> {
        match &client_trust {
            Some(trust) => Arc::new(CertificateAuthenticator::new(
                tokens,
                Arc::clone(trust),
                Arc::clone(clock),
            )),
            None => tokens,
        }
    };
    let authenticator = with_certificates(Arc::new(podca_tokens));
    let istio = IstioOptions {
        authenticator: Some(with_certificates(Arc::new(istio_tokens))),
        trust_domain_alias: istio_trust_domain_alias,
    };
    let mut api = Api::new(
        api,
        handle.clone(),
        authenticator,
        Some(Arc::clone(&kube.pods)),
        tasks.receiver(),
    )?
    // Read only for signers whose rules read `pod` (pod_facts).
    .with_pod_facts(kube.pods)
    .with_clock(Arc::clone(clock))
    .with_ledger(ledger)
    .with_metrics(metrics.grpc.clone())
    .with_istio(istio);
    if let Some(labels) = kube.namespace_labels {
        api = api.with_namespace_labels(labels);
    }
    if let Some(jwt) = jwt {
        api = api.with_jwt(jwt);
    }
    let api = Arc::new(api);
    let stopped = tasks.stopped();
    tasks.spawn("gRPC server", async move {
        let served = match tls {
            Some(config) => server::serve_tls(tcp, config, api, limits, stopped).await,
            None => server::serve_tcp(tcp, api, limits, stopped).await,
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "gRPC server failed");
        }
        grpc_ready.set(false);
    });
    Ok(())
}

/// The verifier of client certificates (mTLS renewal), with the task that rebuilds it on every
/// CA change spawned. Certificates of every configured signer's trust domain are accepted.
fn start_client_trust(
    api: &ApiOptions,
    handle: &CaHandle,
    tasks: &mut Shutdown,
) -> anyhow::Result<Arc<ClientTrust>> {
    let mut trust_domains: Vec<String> = api
        .signers
        .values()
        .map(|policy| policy.trust_domain.clone())
        .collect();
    trust_domains.sort();
    trust_domains.dedup();
    let trust = ClientTrust::new(&handle.current(), trust_domains)
        .map_err(|e| anyhow::anyhow!("gRPC: verifying client certificates: {e}"))?;
    tasks.spawn(
        "gRPC client certificate anchors",
        Arc::clone(&trust).follow(handle.subscribe(), tasks.receiver()),
    );
    Ok(trust)
}

/// The gRPC listener's serving certificate (`None`: plaintext), with the task that keeps it
/// current spawned; OIDC discovery serves the same one.
fn start_serving_keys(
    tls: GrpcTls,
    trust_domain: &str,
    handle: &CaHandle,
    clock: &Clock,
    metrics: &Metrics,
    tasks: &mut Shutdown,
) -> anyhow::Result<Option<Arc<ServingKeys>>> {
    let keys = match tls {
        GrpcTls::SelfIssued(settings) => {
            let identity = serving_identity(&settings, trust_domain, &PodEnvironment::read());
            let cert = identity
                .issue(&handle.current().ca, clock())
                .context("gRPC: issuing the serving certificate")?;
            info!(
                spiffe_id = identity.spiffe_id,
                dns_names = ?identity.dns_names,
                not_after = %cert.validity.not_after,
                "gRPC: serving a self-issued TLS certificate"
            );
            let keys = ServingKeys::new(
                tls::certified_key(&cert.chain_der, &cert.key_pkcs8_der)
                    .context("gRPC: the serving certificate")?,
            );
            let (current, follow) = watch::channel(Arc::new(cert));
            tasks.spawn(
                "gRPC serving certificate",
                serving_cert::run(
                    identity,
                    handle.clone(),
                    Arc::clone(clock),
                    current,
                    tasks.receiver(),
                ),
            );
            // Ends with the renewal task (its sender).
            tasks.spawn(
                "gRPC serving certificate swap",
                tls::follow_serving_cert(follow, Arc::clone(&keys)),
            );
            keys
        }
        GrpcTls::Files { cert, key } => {
            let mut files = ServingFiles::new(&cert, &key);
            let first = files
                .load_if_changed()
                .context("gRPC: [grpc] tls_cert_file / tls_key_file")?
                .context("gRPC: the certificate files were read twice")?;
            info!(cert = %cert.display(), key = %key.display(), "gRPC: serving TLS from files");
            let keys = ServingKeys::new(first);
            tasks.spawn(
                "gRPC certificate files",
                files.watch(Arc::clone(&keys), tls::FILES_POLL, tasks.receiver()),
            );
            keys
        }
        GrpcTls::Off { insecure } => {
            if insecure {
                warn!(
                    "gRPC: serving PLAINTEXT on a non-loopback address ([grpc] insecure_plaintext \
                     = true): bearer tokens and trust anchors cross the network unprotected"
                );
                metrics.grpc_insecure_plaintext.set(1);
            }
            return Ok(None);
        }
    };
    Ok(Some(keys))
}

/// OIDC discovery as configured, before its listener is bound.
#[derive(Debug)]
struct OidcSettings {
    listen: SocketAddr,
    tls: OidcTls,
    discovery: Discovery,
}

/// `[jwt] oidc_listen`, checked: TLS with the gRPC listener's certificate, plaintext only where
/// the gRPC rules allow it (`[grpc] tls = "off"` on loopback, or `insecure_plaintext`).
fn oidc_settings(
    config: &JwtConfig,
    grpc: Option<&GrpcSettings>,
) -> anyhow::Result<Option<OidcSettings>> {
    let Some(listen) = config.oidc_listen.filter(|_| config.enabled) else {
        return Ok(None);
    };
    let Some(grpc) = grpc else {
        bail!(
            "[jwt] oidc_listen = {listen}: OIDC discovery serves the gRPC listener's TLS \
             certificate, so it cannot run with --no-grpc"
        );
    };
    let tls = oidc_tls(listen, &grpc.tls)?;
    let discovery = discovery(config)?.context("[jwt] oidc_listen needs [jwt] issuer")?;
    Ok(Some(OidcSettings {
        listen,
        tls,
        discovery,
    }))
}

/// The discovery document's settings; `None` without `[jwt] issuer`.
fn discovery(config: &JwtConfig) -> anyhow::Result<Option<Discovery>> {
    let Some(issuer) = config.issuer.clone() else {
        return Ok(None);
    };
    Ok(Some(Discovery {
        issuer,
        max_age: podca_grpc::jwt::refresh_hint(config)
            .try_into()
            .unwrap_or(Duration::from_secs(60)),
        algorithm: JwtAlgorithm::for_key(config.key_algorithm)?,
    }))
}

/// Binds the OIDC discovery listener and spawns its server.
async fn start_oidc(
    settings: OidcSettings,
    keys: &JwtHandle,
    serving: Option<Arc<ServingKeys>>,
    metrics: &Metrics,
    readiness: &Arc<Readiness>,
    tasks: &mut Shutdown,
) -> anyhow::Result<()> {
    let OidcSettings {
        listen,
        tls,
        discovery,
    } = settings;
    let config = match (tls, serving) {
        (OidcTls::Tls, Some(serving)) => Some(tls::http1_server_config(serving)?),
        (OidcTls::Tls, None) => bail!("[jwt] oidc_listen: no serving certificate to serve"),
        (OidcTls::Plaintext { insecure }, _) => {
            if insecure {
                warn!(
                    %listen,
                    "OIDC discovery: serving PLAINTEXT on a non-loopback address ([grpc] \
                     insecure_plaintext = true)"
                );
            }
            None
        }
    };
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("[jwt] oidc_listen: listening on {listen}"))?;
    info!(
        addr = %listener.local_addr()?,
        issuer = discovery.issuer,
        tls = config.is_some(),
        "OIDC discovery listening"
    );
    let ready = readiness.component("oidc");
    ready.set(true);
    let served = oidc::serve_with(
        listener,
        config,
        discovery,
        keys.clone(),
        metrics.oidc.clone(),
        OidcLimits::default(),
        tasks.receiver(),
    );
    tasks.spawn("OIDC discovery", async move {
        served.await;
        ready.set(false);
    });
    Ok(())
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

/// What podca's pod says of itself (downward API and service-account mount).
#[derive(Debug, Default)]
struct PodEnvironment {
    /// `POD_NAMESPACE`, else the service-account namespace file.
    namespace: Option<String>,
    /// `PODCA_SERVICE_ACCOUNT` (downward API `spec.serviceAccountName`).
    service_account: Option<String>,
}

/// Where Kubernetes mounts the pod's namespace.
const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl PodEnvironment {
    fn read() -> Self {
        let nonempty = |s: String| {
            let s = s.trim().to_owned();
            (!s.is_empty()).then_some(s)
        };
        PodEnvironment {
            namespace: std::env::var("POD_NAMESPACE")
                .ok()
                .and_then(nonempty)
                .or_else(|| {
                    std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE)
                        .ok()
                        .and_then(nonempty)
                }),
            service_account: std::env::var("PODCA_SERVICE_ACCOUNT")
                .ok()
                .and_then(nonempty),
        }
    }
}

/// The serving certificate's names: the configuration, else the pod's environment, else
/// namespace `default` and service account `podca`.
fn serving_identity(
    settings: &SelfIssuedTls,
    trust_domain: &str,
    pod: &PodEnvironment,
) -> ServingIdentity {
    let namespace = settings
        .namespace
        .clone()
        .or_else(|| pod.namespace.clone())
        .unwrap_or_else(|| "default".into());
    let service_account = settings
        .service_account
        .clone()
        .or_else(|| pod.service_account.clone())
        .unwrap_or_else(|| "podca".into());
    ServingIdentity {
        spiffe_id: serving_cert::spiffe_id(trust_domain, &namespace, &service_account),
        dns_names: settings
            .dns_names
            .clone()
            .unwrap_or_else(|| serving_cert::service_dns_names(&settings.service, &namespace)),
        lifetime: settings.lifetime,
    }
}

/// The controller's flags, as [`run`] read them.
struct ControllerFlags {
    workers: Option<usize>,
    queue_capacity: usize,
    admin_listen: Option<SocketAddr>,
    drain_timeout: Duration,
    leader_election: Option<LeaderElection>,
}

/// The controller's options: flags over the configuration file.
fn controller_options(
    config: &Config,
    flags: ControllerFlags,
    handle: CaHandle,
    clock: Clock,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
) -> Options {
    let ControllerFlags {
        workers,
        queue_capacity,
        admin_listen,
        drain_timeout,
        leader_election,
    } = flags;
    let mut options = Options::new(config.signers.clone(), handle);
    options.readiness = Some(readiness);
    options.clock = clock;
    options.metrics = metrics;
    options.workers = workers.unwrap_or(config.controller.workers).max(1);
    options.queue_capacity = queue_capacity.max(1);
    options.admin_listen = Some(admin_listen.unwrap_or(config.admin.listen));
    options.drain_timeout = drain_timeout;
    options.reporting_instance = std::env::var("POD_NAME").ok();
    options.publisher = publisher_options(config);
    options.leader_election = leader_election;
    options
}

/// The ClusterTrustBundle publisher's options; `None` when `[trust_bundles] publish = false`.
fn publisher_options(config: &Config) -> Option<PublisherOptions> {
    config.trust_bundles.publish.then(|| PublisherOptions {
        suffix: config.trust_bundles.suffix.clone(),
        instance: config.trust_bundles.instance.clone(),
        resync: Duration::from_secs(config.trust_bundles.resync_seconds.max(1)),
    })
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

/// The Lease to take: namespace `default` and identity `<POD_NAME or HOSTNAME>-<random>`
/// unless given.
fn leader_election_options(flags: LeaseFlags) -> LeaderElection {
    let LeaseFlags {
        lease_name,
        lease_namespace,
        lease_identity,
        lease_duration,
        lease_renew_deadline,
        lease_retry_period,
    } = flags;
    let base = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "podca".into());
    LeaderElection {
        lease_name,
        lease_namespace: lease_namespace.unwrap_or_else(|| "default".into()),
        identity: lease_identity.unwrap_or_else(|| format!("{base}-{:08x}", rand_suffix())),
        lease_duration,
        renew_deadline: lease_renew_deadline,
        retry_period: lease_retry_period,
    }
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5h").is_err());
    }

    fn lease(namespace: Option<&str>, identity: Option<&str>) -> LeaseFlags {
        LeaseFlags {
            lease_name: "podca-controller".into(),
            lease_namespace: namespace.map(Into::into),
            lease_identity: identity.map(Into::into),
            lease_duration: Duration::from_secs(15),
            lease_renew_deadline: Duration::from_secs(10),
            lease_retry_period: Duration::from_secs(2),
        }
    }

    #[test]
    fn lease_flags_given_are_used() {
        let election = leader_election_options(lease(Some("podca-system"), Some("replica-a")));
        assert_eq!(election.lease_name, "podca-controller");
        assert_eq!(election.lease_namespace, "podca-system");
        assert_eq!(election.identity, "replica-a");
        assert_eq!(election.lease_duration, Duration::from_secs(15));
        assert_eq!(election.renew_deadline, Duration::from_secs(10));
        assert_eq!(election.retry_period, Duration::from_secs(2));
    }

    #[test]
    fn lease_defaults_are_namespace_default_and_a_suffixed_identity() {
        let election = leader_election_options(lease(None, None));
        assert_eq!(election.lease_namespace, "default");
        let (base, suffix) = election
            .identity
            .rsplit_once('-')
            .unwrap_or_else(|| panic!("no suffix in {:?}", election.identity));
        assert!(!base.is_empty(), "{:?}", election.identity);
        assert_eq!(suffix.len(), 8, "{:?}", election.identity);
        assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()));
    }

    fn self_issued(namespace: Option<&str>, dns: Option<&[&str]>) -> SelfIssuedTls {
        SelfIssuedTls {
            dns_names: dns.map(|d| d.iter().map(|s| s.to_string()).collect()),
            service: "podca".into(),
            namespace: namespace.map(Into::into),
            service_account: None,
            lifetime: time::Duration::hours(24),
        }
    }

    #[test]
    fn serving_identity_prefers_config_then_pod_then_defaults() {
        let pod = PodEnvironment {
            namespace: Some("podca-system".into()),
            service_account: Some("signer".into()),
        };
        let id = serving_identity(&self_issued(None, None), "cluster.local", &pod);
        assert_eq!(
            id.spiffe_id,
            "spiffe://cluster.local/ns/podca-system/sa/signer"
        );
        assert_eq!(id.dns_names[3], "podca.podca-system.svc.cluster.local");
        let id = serving_identity(
            &self_issued(Some("sec"), Some(&["ca.example.com"])),
            "example.org",
            &pod,
        );
        assert_eq!(id.spiffe_id, "spiffe://example.org/ns/sec/sa/signer");
        assert_eq!(id.dns_names, ["ca.example.com"]);
        let id = serving_identity(&self_issued(None, None), "td", &PodEnvironment::default());
        assert_eq!(id.spiffe_id, "spiffe://td/ns/default/sa/podca");
        assert_eq!(id.dns_names[0], "podca");
        assert_eq!(id.dns_names[1], "podca.default");
    }

    #[test]
    fn a_config_file_is_required() {
        let error = load_config(None).map(|_| ()).unwrap_err();
        assert_eq!(error.to_string(), "--config is required for `podca serve`");
    }
}
