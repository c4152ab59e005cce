//! The runtime components that need the Kubernetes API: a CA held in a Secret, its JWT keys
//! (in a Secret beside it), the JWKS ConfigMap, and the PCR controller's options from the
//! configuration, and the PCR controller itself ([`controller`]).
//!
//! Each follows the runtime's leadership: only the leader writes; standbys follow what the
//! leader wrote.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use podca_authority::components::ca::{CaPlan, CaPlans};
use podca_authority::config::{Config, SecretCa as SecretCaConfig};
use podca_authority::jwt::JwtHandle;
use podca_authority::ledger::LedgerHandle;
use podca_authority::oidc::Discovery;
use podca_authority::{CaHandle, CaSet, Runtime, Stage};
use podca_signer::rules::NamespaceLabels;
use tracing::{info, warn};

use crate::jwks::JwksPublisher;
use crate::jwt_secret::{JwtSecretError, JwtSecretRotator, JwtSecretStore};
use crate::publisher::{DesiredBundle, Publisher, PublisherError, PublisherOptions};
use crate::secret_ca::{SecretCa, SecretCaError, SecretCaOptions};
use crate::{LeaderElection, Options};

/// How often the JWT key Secret driver re-reads the Secret (other replicas' writes).
const JWT_POLL: Duration = Duration::from_secs(5);

/// A Kubernetes-backed component could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("[trust_bundles]")]
    Bundles(#[source] PublisherError),
    #[error("opening the CA Secret")]
    SecretCa(#[source] SecretCaError),
    #[error("the JWT signing keys ([jwt])")]
    JwtKeys(#[source] JwtSecretError),
    #[error("starting the CAs")]
    Cas(#[source] podca_authority::components::ca::CaStartError),
    #[error("the CA Secret")]
    SignerOutsideCa(#[source] podca_authority::components::ca::CaStartError),
}

/// The PCR controller ([`crate::run`]) as a component of the [`Runtime`]: its `/readyz` say is registered now
/// (not ready until its watches have synced), it reports and follows the runtime's leadership,
/// shares its metrics and clock, drains its in-flight writes within the drain deadline when the
/// serving stage stops, and a failure of it (discovery, the Lease) stops the command.
pub fn controller(rt: &mut Runtime, client: kube::Client, options: Options) {
    let options = Options {
        ready: Some(rt.init_handle("controller")),
        leadership: Some(rt.leadership().clone()),
        metrics: Arc::clone(rt.metrics()),
        clock: Arc::clone(rt.clock()),
        // In-flight writes get three quarters of the deadline: the rest releases the Lease.
        drain_timeout: rt.drain_timeout() * 3 / 4,
        ..options
    };
    rt.spawn_critical(Stage::Serve, "PCR controller", |mut stop| {
        crate::run(client, options, async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        })
    });
}

/// Opens the CA `secret` names (the configuration's CA `name`) once the API is reachable and
/// spawns its driver (it reloads on change and, as leader, takes the rotation's steps).
pub async fn secret_ca(
    rt: &mut Runtime,
    client: &Client,
    config: &Config,
    name: &str,
    secret: &SecretCaConfig,
) -> Result<CaHandle, StartError> {
    let mut options = SecretCaOptions::new(&secret.namespace, &secret.name);
    options.ca_name = name.to_owned();
    options.schedule = config.rotation;
    options.max_leaf_lifetime = config.max_leaf_lifetime();
    options.leading = Some(rt.leadership().subscribe());
    let policies = config.policies_of_ca(name);
    let signers: Vec<(&String, &podca_signer::SignerPolicy)> = policies
        .iter()
        .map(|(what, policy)| (what, policy))
        .collect();
    // The bundles this CA's anchors go into keep a copy of its sealed history (see secret_ca).
    if let Some(publisher) = publisher_options(config) {
        options.history_copies = Publisher::for_policies(&config.signers, &publisher)
            .map_err(StartError::Bundles)?
            .bundles()
            .iter()
            .filter(|b| bundle_ca(config, b) == Some(name))
            .cloned()
            .collect();
    }
    let (handle, driver) = SecretCa::start(
        client.clone(),
        options,
        Arc::clone(rt.clock()),
        Arc::clone(rt.metrics()),
    )
    .await
    .map_err(StartError::SecretCa)?;
    podca_authority::components::ca::check_signers(&handle.current().ca, signers)
        .map_err(StartError::SignerOutsideCa)?;
    rt.spawn(Stage::Support, "secret CA driver", |stop| driver.run(stop));
    Ok(handle)
}

/// Starts every planned CA (data directories and Secrets) and gives the set every component
/// reads.
pub async fn start_cas(
    rt: &mut Runtime,
    client: &Client,
    config: &Config,
    plans: CaPlans,
) -> Result<CaSet, StartError> {
    let CaPlans {
        cas,
        signers,
        tenants,
        sharing,
        primary: _,
    } = plans;
    let mut handles = std::collections::BTreeMap::new();
    for (name, plan) in cas {
        let handle = match plan {
            CaPlan::Directory(dir) => dir.start(rt).handle,
            CaPlan::Secret(secret) => secret_ca(rt, client, config, &name, &secret).await?,
        };
        handles.insert(name, handle);
    }
    sharing.report(rt);
    CaSet::new(handles, signers)
        .and_then(|set| set.with_tenants(tenants))
        .map_err(|e| StartError::Cas(e.into()))
}

/// The JWT-SVID signing keys (`[jwt] enabled`) of the primary CA (the `[grpc] signer`'s): in
/// its data directory, or in a Secret beside its CA Secret. `None` when disabled.
pub async fn primary_jwt(
    rt: &mut Runtime,
    client: &Client,
    config: &Config,
    plans: &CaPlans,
    leader_elect: bool,
) -> Result<Option<JwtHandle>, PrimaryJwtError> {
    Ok(match (plans.primary_dir(), plans.primary_secret()) {
        (Some(dir), _) => {
            let primary = plans.primary_config(config);
            podca_authority::components::jwt::start(
                rt,
                &config.jwt,
                primary,
                dir.dir(),
                leader_elect,
            )?
        }
        (None, Some(secret)) => secret_jwt(rt, client, config, secret).await?,
        (None, None) => None,
    })
}

/// The ledger log's checkpoint key when it does not live in a file: `[ledger.log]` on, no
/// `key_file`, and the primary CA in a Secret (the key in `<CA Secret>-log`, or `key_secret`,
/// beside it) or in a PKCS#11 token (the Ed25519 key `podca-log` in that token). `None`: the
/// ledger component reads or makes `key_file` (or `<data dir>/log.key`).
pub async fn ledger_log_key(
    client: &Client,
    config: &Config,
    plans: &CaPlans,
) -> Result<Option<podca_signer::merkle_note::LogKey>, LogKeyError> {
    let Some(log) = config.ledger.log.as_ref().filter(|l| l.key_file.is_none()) else {
        return Ok(None);
    };
    if let (Some(dir), podca_authority::config::CaConfig::Pkcs11(p)) =
        (plans.primary_dir(), plans.primary_config(config))
    {
        let (p, dir, origin) = (p.clone(), dir.dir().to_owned(), log.origin.clone());
        let key = tokio::task::spawn_blocking(move || {
            podca_authority::ca::pkcs11_log_key(&p, &dir, &origin, true)
        })
        .await
        .map_err(|e| LogKeyError::Token(e.to_string()))?
        .map_err(|e| LogKeyError::Token(e.to_string()))?;
        info!("ledger log: the checkpoint key is in the CA's PKCS#11 token");
        return Ok(Some(key));
    }
    let Some(ca) = plans.primary_secret() else {
        return Ok(None);
    };
    let name = log
        .key_secret
        .clone()
        .unwrap_or_else(|| format!("{}-log", ca.name));
    let key =
        crate::log_key_secret::log_key(client.clone(), &ca.namespace, &name, &log.origin).await?;
    info!(secret = %format!("{}/{name}", ca.namespace), "ledger log: the checkpoint key is in a Secret");
    Ok(Some(key))
}

/// [`ledger_log_key`] could not open or make the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogKeyError {
    #[error(transparent)]
    Secret(#[from] crate::log_key_secret::LogKeySecretError),
    #[error("the ledger log's checkpoint key in the CA's token: {0}")]
    Token(String),
}

/// [`primary_jwt`] could not open the keys.
#[derive(Debug, thiserror::Error)]
pub enum PrimaryJwtError {
    #[error(transparent)]
    Directory(#[from] podca_authority::components::jwt::JwtStartError),
    #[error(transparent)]
    Secret(#[from] StartError),
}

/// The CA whose anchors `bundle` publishes: its tenant's, else its signer's.
fn bundle_ca<'c>(config: &'c Config, bundle: &DesiredBundle) -> Option<&'c str> {
    let policy = config.signers.get(&bundle.signer_name)?;
    match &bundle.tenant {
        Some(name) => policy.tenants().find(|t| t.name == name).map(|t| t.ca()),
        None => Some(podca_authority::config::ca_name_of(policy)),
    }
}

/// JWT-SVID signing keys (`[jwt] enabled`) of a Secret-held CA: in the Secret `[jwt]
/// keys_secret` (default `<CA Secret>-jwt`) beside the CA Secret, written by the leader and
/// followed by standbys. `None` when `[jwt] enabled = false`.
pub async fn secret_jwt(
    rt: &mut Runtime,
    client: &Client,
    config: &Config,
    ca: &SecretCaConfig,
) -> Result<Option<JwtHandle>, StartError> {
    if !config.jwt.enabled {
        return Ok(None);
    }
    let store = JwtSecretStore::new(
        client.clone(),
        &ca.namespace,
        &config.jwt.keys_secret_for(&ca.name),
        Arc::clone(rt.metrics()),
    );
    info!(
        secret = %store.secret(),
        "the JWT signing keys are kept in a Secret; the leader rotates them, standbys follow"
    );
    let rotator = Arc::new(
        JwtSecretRotator::start(
            store,
            &config.jwt,
            Arc::clone(rt.clock()),
            JWT_POLL,
            rt.leadership().subscribe(),
            Arc::clone(rt.metrics()),
        )
        .await
        .map_err(StartError::JwtKeys)?,
    );
    if rotator.handle().current().infos().next().is_none() {
        warn!(
            "no JWT signing key in the Secret yet: no JWT-SVID is signed until the leader makes one"
        );
    }
    let handle = rotator.handle().clone();
    rt.spawn(Stage::Support, "JWT key Secret driver", |stop| {
        rotator.run(stop)
    });
    Ok(Some(handle))
}

/// Publishes `keys` as a JWKS in the ConfigMap `[jwt] jwks_configmap` (in `namespace`) while
/// this replica leads, with a detached JWS by the issuing key of the primary CA (the one that
/// holds the JWT keys) in `ca`; nothing when no ConfigMap is configured. Its `/readyz` say
/// (`jwks-configmap`) fails while the ConfigMap is foreign.
pub fn jwks(
    rt: &mut Runtime,
    client: &Client,
    config: &Config,
    namespace: &str,
    discovery: Option<Discovery>,
    keys: &JwtHandle,
    ca: &CaSet,
) {
    if config.jwt.jwks_configmap.is_empty() {
        return;
    }
    let mut publisher = JwksPublisher::new(
        client.clone(),
        namespace,
        &config.jwt.jwks_configmap,
        discovery,
        keys.clone(),
        Arc::clone(rt.metrics()),
    )
    .readiness(rt.init_handle(crate::jwks::READINESS_COMPONENT));
    let primary = podca_authority::components::ca::primary_ca(config);
    match ca.iter().find(|(name, _)| *name == primary) {
        Some((_, handle)) => {
            publisher = publisher.signed_by(handle.clone(), Arc::clone(rt.clock()));
        }
        None => warn!(
            ca = primary,
            "the CA of the JWT keys is not running: the JWKS ConfigMap has no signature"
        ),
    }
    info!(
        configmap = %format!("{namespace}/{}", config.jwt.jwks_configmap),
        "the leader publishes the JWKS, signed by the CA, in a ConfigMap"
    );
    let leading = rt.leadership().subscribe();
    rt.spawn(Stage::Support, "JWKS ConfigMap", |stop| {
        publisher.run(leading, stop)
    });
}

/// The controller's flags (`podca serve`), over the configuration file.
#[derive(Debug, Clone)]
pub struct ControllerFlags {
    /// `--workers`, over `[controller] workers` (where the adaptive concurrency starts).
    pub workers: Option<usize>,
    pub queue_capacity: usize,
    pub leader_election: Option<LeaderElection>,
}

/// The controller's options: flags over the configuration file; every answer recorded in
/// `ledger`, rules reading namespace labels from `namespace_labels` (which it keeps filled).
pub fn options(
    config: &Config,
    flags: ControllerFlags,
    ca: CaSet,
    ledger: LedgerHandle,
    namespace_labels: Option<NamespaceLabels>,
) -> Options {
    let ControllerFlags {
        workers,
        queue_capacity,
        leader_election,
    } = flags;
    let mut options = Options::new(config.signers.clone(), ca);
    options.ledger = Some(ledger);
    options.namespace_labels = namespace_labels;
    options.workers = workers.unwrap_or(config.controller.workers).max(1);
    // `--workers` above the bound raises it: a flag is never silently lowered.
    options.max_in_flight = config.controller.max_in_flight.max(options.workers);
    options.queue_capacity = queue_capacity.max(1);
    options.reporting_instance = std::env::var("POD_NAME").ok();
    options.publisher = publisher_options(config);
    options.leader_election = leader_election;
    options.sharding = config.controller.sharding;
    options
}

/// The ClusterTrustBundle publisher's options; `None` when `[trust_bundles] publish = false`.
pub fn publisher_options(config: &Config) -> Option<PublisherOptions> {
    config.trust_bundles.publish.then(|| PublisherOptions {
        suffix: config.trust_bundles.suffix.clone(),
        instance: config.trust_bundles.instance.clone(),
        resync: Duration::from_secs(config.trust_bundles.resync_seconds.max(1)),
    })
}
