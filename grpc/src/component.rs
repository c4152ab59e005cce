//! The gRPC API and OIDC discovery as components of the runtime (`podca_authority::Runtime`).
//!
//! [`Settings::from_config`] reads `[grpc]` once: the API's options and limits, the TLS mode,
//! the Istio alias, the token audiences. [`serving_keys`] runs the serving certificate (TLS
//! only) that the gRPC listener and OIDC discovery share. [`start`] builds the one [`Api`] for
//! its callers ([`Callers`]: Kubernetes tokens in `podca serve`, uids in `podca dev`) and binds
//! its listeners ([`Listeners`]); [`Oidc`] binds and serves discovery. Every listener registers
//! in `/readyz` while it listens and stops with the serving stage.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use podca_authority::config::{Config, DevIdentity, GrpcTls, SelfIssuedTls};
use podca_authority::jwt::{JwtConfig, JwtHandle, OidcTls, oidc_tls};
use podca_authority::ledger::LedgerHandle;
use podca_authority::oidc::{self, DISCOVERY_PATH, Discovery, OidcLimits};
use podca_authority::serving_cert::{self, ServingIdentity};
use podca_authority::{CaHandle, CaSet, Runtime, Stage};
use podca_signer::jwt::JwtAlgorithm;
use podca_signer::rules::NamespaceLabels;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::auth::{
    Authenticator, DevAuthenticator, PodDirectory, TokenReviewAuthenticator, TokenReviewLimits,
    TokenReviewer,
};
use crate::connections::ConnectionLimits;
use crate::core::IstioOptions;
use crate::federation::FederatedBundles;
use crate::jwt::JwtService;
use crate::peer_identity::{CertificateAuthenticator, ClientTrust};
use crate::renewal::{Denylist, RenewalRules};
use crate::sds::{SdsNames, SdsService};
use crate::tls::{self, ServingFiles, ServingKeys};
use crate::{Api, ApiOptions, server};

/// The gRPC API or OIDC discovery could not start. Each message carries its cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration asks for something this command cannot serve.
    #[error("{0}")]
    Refused(String),
    /// A listener could not be bound.
    #[error("{what}: listening on {addr}: {error}")]
    Listen {
        what: &'static str,
        addr: SocketAddr,
        error: std::io::Error,
    },
    /// The Workload API socket could not be bound.
    #[error("{0}")]
    Socket(String),
    #[error("{context}")]
    Failed {
        context: &'static str,
        #[source]
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StartError {
    fn failed(
        context: &'static str,
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StartError::Failed {
            context,
            error: error.into(),
        }
    }
}

/// `[grpc]`, read once.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub api: ApiOptions,
    /// `[grpc] token_audience`.
    pub audience: String,
    /// `[grpc] max_token_reviews`, `token_cache_seconds`.
    pub token_reviews: TokenReviewLimits,
    pub tls: GrpcTls,
    /// The trust domain of the gRPC signer's policy: podca's own SPIFFE ID is in it.
    pub trust_domain: String,
    /// Caps on connections before any TLS or authentication.
    pub limits: ConnectionLimits,
    /// With TLS: accept podca client certificates for renewal without a token.
    pub mtls_renewal: bool,
    /// `[grpc] max_renewal_seconds`.
    pub max_renewal: Duration,
    /// `[grpc] renewal_denylist` (`None` when empty).
    pub renewal_denylist: Option<std::path::PathBuf>,
    /// `[grpc] istio`: serve the Istio CA API.
    pub istio: bool,
    /// `[grpc] istio_token_audience`.
    pub istio_audience: String,
    /// `[grpc] istio_trust_domain_alias` (`None` when empty).
    pub istio_trust_domain_alias: Option<String>,
    /// `[workload_api] sds`, `sds_*_name`: Envoy SDS on the Workload API socket (`None`: off).
    pub sds: Option<SdsNames>,
    /// The foreign bundles in force (set by the caller that runs the federation fetchers): the
    /// Workload API's `federated_bundles`, its bundle streams and ValidateJWTSVID, and SDS's
    /// federated validation contexts.
    pub federated: Option<FederatedBundles>,
}

/// Which listeners serve the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `podca serve`: one TCP listener, TLS as `[grpc] tls` says.
    Serve,
    /// `podca dev`: plaintext TCP on loopback only, and the Workload API's Unix socket.
    Dev,
}

impl Settings {
    /// `[grpc]` with `listen` (a flag) over `[grpc] listen`.
    pub fn from_config(
        config: &Config,
        listen: Option<SocketAddr>,
        mode: Mode,
    ) -> Result<Self, StartError> {
        let refused = |e: &dyn std::fmt::Display| StartError::Refused(e.to_string());
        let (signer_name, policy) = config.grpc_signer().map_err(|e| refused(&e))?;
        let listen = listen.unwrap_or(config.grpc.listen);
        let tls = match mode {
            Mode::Serve => config.grpc.tls(listen).map_err(|e| refused(&e))?,
            Mode::Dev if listen.ip().is_loopback() => GrpcTls::Off { insecure: false },
            Mode::Dev => {
                return Err(StartError::Refused(format!(
                    "podca dev serves gRPC on loopback only; {listen} is not a loopback address"
                )));
            }
        };
        let grpc = &config.grpc;
        Ok(Settings {
            listen,
            tls,
            trust_domain: policy.trust_domain.clone(),
            api: ApiOptions {
                signers: config.signers.clone(),
                default_signer: signer_name.to_owned(),
                allowed_signers: config.grpc_allowed_signers().map_err(|e| refused(&e))?,
                max_dns_names: grpc.max_dns_names,
                node_proxy_service_accounts: grpc.node_proxy_service_accounts.clone(),
                rate_limit_per_identity: grpc.rate_limit_per_identity,
                max_open_streams: grpc.max_open_streams,
            },
            audience: grpc.token_audience.clone(),
            limits: ConnectionLimits {
                per_peer: grpc.max_connections_per_peer.get(),
                total: grpc.max_connections.get(),
            },
            mtls_renewal: grpc.mtls_renewal,
            max_renewal: Duration::from_secs(grpc.max_renewal_seconds),
            renewal_denylist: Some(&grpc.renewal_denylist)
                .filter(|path| !path.is_empty())
                .map(std::path::PathBuf::from),
            istio: grpc.istio,
            istio_audience: grpc.istio_token_audience.clone(),
            istio_trust_domain_alias: Some(grpc.istio_trust_domain_alias.clone())
                .filter(|alias| !alias.is_empty()),
            sds: SdsNames::from_config(&config.workload_api).map_err(|e| refused(&e))?,
            federated: None,
            token_reviews: TokenReviewLimits {
                max_concurrent: grpc.max_token_reviews,
                cache_ttl: Duration::from_secs(grpc.token_cache_seconds),
                ..TokenReviewLimits::default()
            },
        })
    }
}

/// Who the API's callers are.
pub enum Callers {
    /// `podca serve`: service-account tokens checked with TokenReviews (and, with mTLS
    /// renewal, podca client certificates); pods read through the Kubernetes API.
    Kubernetes {
        reviewer: Arc<dyn TokenReviewer>,
        pods: Arc<dyn PodDirectory>,
        /// Namespace labels for policy rules (the controller's namespace watch fills them).
        namespace_labels: Option<NamespaceLabels>,
    },
    /// `podca dev`: callers identified by their uid; no pods to check.
    Dev { identities: Vec<DevIdentity> },
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Callers::Kubernetes { .. } => f.write_str("Callers::Kubernetes"),
            Callers::Dev { identities } => f
                .debug_struct("Callers::Dev")
                .field("identities", &identities.len())
                .finish(),
        }
    }
}

/// The running API: what other components (bundle keepers, the banner) need of it.
#[derive(Debug, Clone)]
pub struct Running {
    pub api: Arc<Api>,
    /// The TCP listener's address.
    pub addr: SocketAddr,
}

/// Builds the [`Api`] and binds its listeners (`socket`: the Workload API's, [`Mode::Dev`]).
/// `keys`: the serving certificate ([`serving_keys`]; `None`: plaintext).
#[allow(clippy::too_many_arguments)]
pub async fn start(
    rt: &mut Runtime,
    settings: Settings,
    callers: Callers,
    keys: Option<Arc<ServingKeys>>,
    ca: &CaSet,
    ledger: LedgerHandle,
    jwt: Option<Arc<JwtService>>,
    socket: Option<&Path>,
) -> Result<Running, StartError> {
    let Settings {
        listen,
        api,
        audience,
        token_reviews,
        tls,
        // Already in the serving certificate (`keys`).
        trust_domain: _,
        limits,
        mtls_renewal,
        max_renewal,
        renewal_denylist,
        istio,
        istio_audience,
        istio_trust_domain_alias,
        sds,
        federated,
    } = settings;
    // The uids the socket must let in: podca dev's identities (the owner's alone by default).
    let socket_uids: Vec<u32> = match &callers {
        Callers::Dev { identities } => identities.iter().map(|i| i.uid).collect(),
        Callers::Kubernetes { .. } => vec![],
    };
    let client_trust = match (&tls, mtls_renewal, &callers) {
        (GrpcTls::Off { .. }, _, _) | (_, false, _) | (_, _, Callers::Dev { .. }) => None,
        _ => Some(start_client_trust(rt, &api, ca)?),
    };
    let tls = keys
        .map(|keys| tls::server_config(keys, client_trust.clone()))
        .transpose()
        .map_err(|e| StartError::failed("gRPC: TLS", e))?;
    let clock = Arc::clone(rt.clock());
    let metrics = rt.metrics().grpc.clone();
    let (authenticator, istio_authenticator, pods, namespace_labels): (
        Arc<dyn Authenticator>,
        _,
        _,
        _,
    ) = match callers {
        Callers::Kubernetes {
            reviewer,
            pods,
            namespace_labels,
        } => {
            let reviewer_for = |audience: String| {
                TokenReviewAuthenticator::with_limits(
                    Arc::clone(&reviewer),
                    audience,
                    token_reviews,
                )
                .with_clock(Arc::clone(&clock))
                .with_metrics(metrics.clone())
            };
            let podca_tokens = reviewer_for(audience.clone());
            // One pool of TokenReview slots for both audiences: max_token_reviews bounds them all.
            let istio_tokens =
                reviewer_for(istio_audience.clone()).sharing_slots_with(&podca_tokens);
            // What a certificate must pass to renew: one set for both APIs.
            let renewal = match &client_trust {
                Some(_) => Some(renewal_rules(
                    rt,
                    max_renewal,
                    renewal_denylist.as_deref(),
                    Arc::clone(&pods),
                )?),
                None => None,
            };
            // podca.v1 and the Istio CA API: the same checks, each its own token audience.
            let with_certificates = |tokens: Arc<dyn Authenticator>| -> Arc<dyn Authenticator> {
                match (&client_trust, &renewal) {
                    (Some(trust), Some(renewal)) => Arc::new(
                        CertificateAuthenticator::new(
                            tokens,
                            Arc::clone(trust),
                            Arc::clone(&clock),
                        )
                        .with_renewal(Arc::clone(renewal)),
                    ),
                    _ => tokens,
                }
            };
            (
                with_certificates(Arc::new(podca_tokens)),
                Some(with_certificates(Arc::new(istio_tokens))),
                Some(pods),
                namespace_labels,
            )
        }
        // The Istio CA API on dev's loopback listener: callers are dev identities, as for
        // podca.v1 (no tokens, no ImpersonatedIdentity: there are no pods to check).
        Callers::Dev { identities } => (
            Arc::new(DevAuthenticator::new(&identities)),
            None,
            None,
            None,
        ),
    };
    let mut built = Api::new(
        api,
        ca.clone(),
        authenticator,
        pods.clone(),
        rt.stop_receiver(Stage::Serve),
    )
    .map_err(|e| StartError::Refused(e.to_string()))?
    .with_clock(Arc::clone(&clock))
    .with_ledger(ledger)
    .with_metrics(metrics)
    .with_istio(IstioOptions {
        off: !istio,
        authenticator: istio_authenticator,
        trust_domain_alias: istio_trust_domain_alias,
    });
    if let Some(pods) = pods {
        // Read only for signers whose rules read `pod` (pod_facts).
        built = built.with_pod_facts(pods);
    }
    if let Some(labels) = namespace_labels {
        built = built.with_namespace_labels(labels);
    }
    if let Some(jwt) = &jwt {
        built = built.with_jwt(Arc::clone(jwt));
    }
    let api = Arc::new(built);

    let tcp = TcpListener::bind(listen)
        .await
        .map_err(|error| StartError::Listen {
            what: "gRPC",
            addr: listen,
            error,
        })?;
    let addr = tcp
        .local_addr()
        .map_err(|e| StartError::failed("gRPC: the listener's address", e))?;
    info!(
        %addr,
        audience,
        istio_audience,
        tls = tls.is_some(),
        "gRPC API (podca.v1, Istio CA API) listening"
    );
    let unix = socket
        .map(|path| bind_socket(path, &socket_uids))
        .transpose()?;
    let ready = rt.init_handle("grpc");
    ready.set(true);
    let served = Arc::clone(&api);
    rt.spawn(Stage::Serve, "gRPC server", move |mut stop| async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let result = match tls {
            Some(config) => server::serve_tls(tcp, config, served, limits, stopped).await,
            None => server::serve_tcp(tcp, served, limits, stopped).await,
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "gRPC server failed");
        }
        ready.set(false);
    });
    if let Some((unix, path)) = unix {
        let served = Arc::clone(&api);
        let sds = sds.map(|names| match &federated {
            Some(bundles) => {
                SdsService::new(Arc::clone(&api), names).with_federated(bundles.clone())
            }
            None => SdsService::new(Arc::clone(&api), names),
        });
        rt.spawn(
            Stage::Serve,
            "Workload API server",
            move |mut stop| async move {
                let stopped = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) =
                    server::serve_unix_with_jwt(unix, served, jwt, sds, federated, stopped).await
                {
                    tracing::error!(error = %e, "Workload API server failed");
                }
                // The socket file goes with the server.
                let _ = std::fs::remove_file(&path);
            },
        );
    }
    Ok(Running { api, addr })
}

/// Binds the Workload API socket, replacing a stale one left by a crash. Its mode is 0600 when
/// every identity in `uids` is the owner's (the default: the socket is the user's alone), 0666
/// when `[dev] identities` maps other users, who must be able to connect; callers are then
/// told apart by their uid (peer credentials) as before.
pub(crate) fn bind_socket(
    path: &Path,
    uids: &[u32],
) -> Result<(UnixListener, PathBuf), StartError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let refused = |message: String| StartError::Socket(message);
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(refused(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(refused(format!(
                "{} is in use by another process",
                path.display()
            )));
        }
        std::fs::remove_file(path)
            .map_err(|e| refused(format!("removing the stale socket {}: {e}", path.display())))?;
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| refused(format!("creating {}: {e}", parent.display())))?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| refused(format!("binding {}: {e}", path.display())))?;
    let owner = std::fs::metadata(path)
        .map_err(|e| refused(format!("reading {}: {e}", path.display())))?
        .uid();
    let mode = if uids.iter().all(|uid| *uid == owner) {
        0o600
    } else {
        0o666
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| refused(format!("setting the mode of {}: {e}", path.display())))?;
    Ok((listener, path.to_owned()))
}

/// The rules a renewing certificate must pass, with the task that follows the denylist file
/// spawned ([`crate::renewal`]).
fn renewal_rules(
    rt: &mut Runtime,
    max_renewal: Duration,
    denylist: Option<&Path>,
    accounts: Arc<dyn PodDirectory>,
) -> Result<Arc<RenewalRules>, StartError> {
    let denylist = match denylist {
        Some(path) => {
            let list = Denylist::load(path)
                .map_err(|e| StartError::Refused(format!("[grpc] renewal_denylist: {e}")))?;
            let follower = Arc::clone(&list);
            rt.spawn(Stage::Support, "gRPC renewal denylist", move |stop| {
                follower.follow(stop)
            });
            list
        }
        None => Denylist::empty(),
    };
    Ok(Arc::new(RenewalRules::new(
        max_renewal,
        denylist,
        Some(accounts),
    )))
}

/// The verifier of client certificates (mTLS renewal), with the tasks that rebuild it on every
/// CA change spawned. Certificates of every configured signer's trust domain are accepted, each
/// only under the CA of the signers of that trust domain.
fn start_client_trust(
    rt: &mut Runtime,
    api: &ApiOptions,
    cas: &CaSet,
) -> Result<Arc<ClientTrust>, StartError> {
    let mut by_ca: BTreeMap<&str, (CaHandle, Vec<String>)> = BTreeMap::new();
    for (signer, policy) in &api.signers {
        let (_, domains) = by_ca
            .entry(cas.ca_name_of(signer))
            .or_insert_with(|| (cas.for_signer(signer).clone(), vec![]));
        if !domains.contains(&policy.trust_domain) {
            domains.push(policy.trust_domain.clone());
        }
    }
    let handles: Vec<(CaHandle, Vec<String>)> = by_ca.into_values().collect();
    let snapshots: Vec<_> = handles.iter().map(|(h, _)| h.current()).collect();
    let trust = ClientTrust::for_cas(
        snapshots
            .iter()
            .zip(&handles)
            .map(|(snapshot, (_, domains))| (snapshot.as_ref(), domains.clone())),
    )
    .map_err(|e| StartError::Refused(format!("gRPC: verifying client certificates: {e}")))?;
    for (index, (handle, _)) in handles.iter().enumerate() {
        let (follower, updates) = (Arc::clone(&trust), handle.subscribe());
        rt.spawn(
            Stage::Support,
            "gRPC client certificate anchors",
            move |stop| follower.follow_ca(index, updates, stop),
        );
    }
    Ok(trust)
}

/// The gRPC listener's serving certificate (`None`: plaintext), with the task that keeps it
/// current spawned; OIDC discovery serves the same one.
pub fn serving_keys(
    rt: &mut Runtime,
    settings: &Settings,
    ca: &CaHandle,
) -> Result<Option<Arc<ServingKeys>>, StartError> {
    let keys = match &settings.tls {
        GrpcTls::SelfIssued(self_issued) => {
            let identity =
                serving_identity(self_issued, &settings.trust_domain, &PodEnvironment::read());
            let clock = Arc::clone(rt.clock());
            let cert = identity
                .issue(&ca.current().ca, clock())
                .map_err(|e| StartError::failed("gRPC: issuing the serving certificate", e))?;
            info!(
                spiffe_id = identity.spiffe_id,
                dns_names = ?identity.dns_names,
                not_after = %cert.validity.not_after,
                "gRPC: serving a self-issued TLS certificate"
            );
            let keys = ServingKeys::new(
                tls::certified_key(&cert.chain_der, &cert.key_pkcs8_der)
                    .map_err(|e| StartError::failed("gRPC: the serving certificate", e))?,
            );
            let (current, follow) = watch::channel(Arc::new(cert));
            let ca = ca.clone();
            // Recorded in the ledger like every certificate podca signs (issue #40).
            let ledger = Some(serving_cert::ServingLedger {
                ledger: rt.ledger(),
                signer: settings.api.default_signer.clone(),
            });
            rt.spawn(Stage::Support, "gRPC serving certificate", |stop| {
                serving_cert::run(identity, ca, clock, current, ledger, stop)
            });
            // Ends with the renewal task (its sender).
            let swapped = Arc::clone(&keys);
            rt.spawn(Stage::Support, "gRPC serving certificate swap", |_stop| {
                tls::follow_serving_cert(follow, swapped)
            });
            keys
        }
        GrpcTls::Files { cert, key } => serving_files(rt, cert, key)?,
        GrpcTls::Off { insecure } => {
            if *insecure {
                warn!(
                    "gRPC: serving PLAINTEXT on a non-loopback address ([grpc] insecure_plaintext \
                     = true): bearer tokens and trust anchors cross the network unprotected"
                );
                rt.metrics().grpc_insecure_plaintext.set(1);
            }
            return Ok(None);
        }
    };
    Ok(Some(keys))
}

/// An operator's certificate and key files (`[grpc] tls = "files"`), reloaded when they change.
pub fn serving_files(
    rt: &mut Runtime,
    cert: &Path,
    key: &Path,
) -> Result<Arc<ServingKeys>, StartError> {
    let mut files = ServingFiles::new(cert, key);
    let first = files
        .load_if_changed()
        .map_err(|e| StartError::failed("gRPC: [grpc] tls_cert_file / tls_key_file", e))?
        .ok_or_else(|| StartError::Refused("gRPC: the certificate files were read twice".into()))?;
    info!(cert = %cert.display(), key = %key.display(), "gRPC: serving TLS from files");
    let keys = ServingKeys::new(first);
    let watched = Arc::clone(&keys);
    rt.spawn(Stage::Support, "gRPC certificate files", |stop| {
        files.watch(watched, tls::FILES_POLL, stop)
    });
    Ok(keys)
}

/// OIDC discovery (`[jwt] oidc_listen`), bound: [`Oidc::bind`], then [`Oidc::serve`].
#[derive(Debug)]
pub struct Oidc {
    listener: TcpListener,
    addr: SocketAddr,
    tls: OidcTls,
    discovery: Discovery,
}

impl Oidc {
    /// Checks and binds `[jwt] oidc_listen` (`None`: not configured, or JWTs off). In
    /// [`Mode::Serve`] it serves the gRPC listener's TLS certificate (plaintext only where the
    /// gRPC rules allow it) and needs `[jwt] issuer`; in [`Mode::Dev`] it is plaintext on
    /// loopback, and without an issuer the issuer is the listener's URL, so tokens and the
    /// document agree. Returns the issuer tokens must carry.
    pub async fn bind(
        config: &JwtConfig,
        grpc: Option<&Settings>,
        mode: Mode,
    ) -> Result<Option<(Oidc, String)>, StartError> {
        let Some(listen) = config.oidc_listen.filter(|_| config.enabled) else {
            return Ok(None);
        };
        let tls = match (mode, grpc) {
            (Mode::Serve, None) => {
                return Err(StartError::Refused(format!(
                    "[jwt] oidc_listen = {listen}: OIDC discovery serves the gRPC listener's TLS \
                     certificate, so it cannot run with --no-grpc"
                )));
            }
            (Mode::Serve, Some(grpc)) => {
                oidc_tls(listen, &grpc.tls).map_err(|e| StartError::Refused(e.to_string()))?
            }
            (Mode::Dev, _) if listen.ip().is_loopback() => OidcTls::Plaintext { insecure: false },
            (Mode::Dev, _) => {
                return Err(StartError::Refused(format!(
                    "podca dev serves OIDC discovery on loopback only; {listen} is not a \
                     loopback address"
                )));
            }
        };
        if mode == Mode::Serve && config.issuer.is_none() {
            return Err(StartError::Refused(
                "[jwt] oidc_listen needs [jwt] issuer".into(),
            ));
        }
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|error| StartError::Listen {
                what: "[jwt] oidc_listen",
                addr: listen,
                error,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::failed("[jwt] oidc_listen: the listener's address", e))?;
        let issuer = config
            .issuer
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"));
        let discovery = discovery(config, issuer.clone())?;
        Ok(Some((
            Oidc {
                listener,
                addr,
                tls,
                discovery,
            },
            issuer,
        )))
    }

    /// The discovery document's URL.
    pub fn url(&self) -> String {
        let scheme = match self.tls {
            OidcTls::Tls => "https",
            OidcTls::Plaintext { .. } => "http",
        };
        format!("{scheme}://{}{DISCOVERY_PATH}", self.addr)
    }

    /// Serves discovery for `keys` until the serving stage stops; `/readyz` covers it.
    pub fn serve(
        self,
        rt: &mut Runtime,
        keys: &JwtHandle,
        serving: Option<Arc<ServingKeys>>,
    ) -> Result<(), StartError> {
        let Oidc {
            listener,
            addr,
            tls,
            discovery,
        } = self;
        let config = match (tls, serving) {
            (OidcTls::Tls, Some(serving)) => Some(
                tls::http1_server_config(serving)
                    .map_err(|e| StartError::failed("[jwt] oidc_listen: TLS", e))?,
            ),
            (OidcTls::Tls, None) => {
                return Err(StartError::Refused(
                    "[jwt] oidc_listen: no serving certificate to serve".into(),
                ));
            }
            (OidcTls::Plaintext { insecure }, _) => {
                if insecure {
                    warn!(
                        listen = %addr,
                        "OIDC discovery: serving PLAINTEXT on a non-loopback address ([grpc] \
                         insecure_plaintext = true)"
                    );
                }
                None
            }
        };
        info!(
            %addr,
            issuer = discovery.issuer,
            tls = config.is_some(),
            "OIDC discovery listening"
        );
        spawn_discovery(rt, listener, config, discovery, keys);
        Ok(())
    }
}

/// Serves discovery of `keys` on `listener` (over TLS with `tls`) until the serving stage
/// stops, behind the `oidc` readiness handle: podca serve's and dev's listener, and the token
/// signer's.
pub fn spawn_discovery(
    rt: &mut Runtime,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    discovery: Discovery,
    keys: &JwtHandle,
) {
    let ready = rt.init_handle("oidc");
    ready.set(true);
    let (keys, metrics) = (keys.clone(), rt.metrics().oidc.clone());
    rt.spawn(Stage::Serve, "OIDC discovery", move |stop| async move {
        oidc::serve_with(
            listener,
            tls,
            discovery,
            keys,
            metrics,
            OidcLimits::default(),
            stop,
        )
        .await;
        ready.set(false);
    });
}

/// The discovery document's settings for `issuer`.
pub fn discovery(config: &JwtConfig, issuer: String) -> Result<Discovery, StartError> {
    Ok(Discovery {
        issuer,
        max_age: crate::jwt::refresh_hint(config)
            .try_into()
            .unwrap_or(Duration::from_secs(60)),
        algorithm: JwtAlgorithm::for_key(config.key_algorithm)
            .map_err(|e| StartError::Refused(format!("[jwt] key_algorithm: {e}")))?,
    })
}

/// What podca's pod says of itself (downward API and service-account mount).
#[derive(Debug, Default)]
pub struct PodEnvironment {
    /// `POD_NAMESPACE`, else the service-account namespace file.
    pub namespace: Option<String>,
    /// `PODCA_SERVICE_ACCOUNT` (downward API `spec.serviceAccountName`).
    pub service_account: Option<String>,
}

/// Where Kubernetes mounts the pod's namespace.
const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl PodEnvironment {
    pub fn read() -> Self {
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
        spiffe_id: podca_signer::names::spiffe_id(trust_domain, &namespace, &service_account),
        dns_names: settings
            .dns_names
            .clone()
            .unwrap_or_else(|| serving_cert::service_dns_names(&settings.service, &namespace)),
        lifetime: settings.lifetime,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
