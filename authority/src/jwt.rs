//! JWT-SVIDs at run time: the `[jwt]` configuration section, the [`JwtHandle`] every reader of
//! the JWT keys shares (the Workload API, its bundle streams, the OIDC JWKS), where the keys
//! live per CA backend ([`open_store`]), and the driver that runs the key rotation schedule.
//!
//! ```toml
//! [jwt]
//! enabled = true                      # serve JWT-SVIDs (default true)
//! issuer = "https://podca.example"    # `iss` claim and OIDC issuer (default: none)
//! default_lifetime_seconds = 300      # a token's lifetime unless the caller asks for less
//! max_lifetime_seconds = 3600         # the policy maximum
//! key_rotation_seconds = 86400        # how long a key signs
//! propagation_seconds = 900           # how long a new key is published before it signs
//! max_audiences = 8                   # audiences per token
//! key_algorithm = "ecdsa-p256"        # ecdsa-p256 (ES256), ecdsa-p384 (ES384), rsa-sha256 (RS256)
//! oidc_listen = "127.0.0.1:8444"      # OIDC discovery listener (default: none; `crate::oidc`)
//! jwks_configmap = "podca-jwks"       # serve: the ConfigMap the leader publishes the JWKS in
//!                                     # ("" = none; `podca_controller::jwks`)
//! jwks_configmap_namespace = "podca-system"  # its namespace (default: podca's own)
//! keys_secret = "podca-ca-jwt"        # [ca] backend = "secret": the Secret holding the JWT keys,
//!                                     # beside the CA Secret (default "<CA Secret name>-jwt";
//!                                     # `podca_controller::jwt_secret`)
//! ```
//!
//! In `podca serve`, `oidc_listen` needs `issuer` (an `https://` URL: what relying parties
//! fetch), and serves HTTPS with the gRPC listener's certificate; plaintext only where the gRPC
//! listener may be plaintext ([`oidc_tls`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use podca_signer::backend::{Pkcs11Config, Pkcs11Uri};
use podca_signer::jwt::pkcs11::Pkcs11JwtKeys;
use podca_signer::jwt::store::JwtStore;
use podca_signer::jwt::{IssueLimits, JwtKeySchedule, JwtKeySet, keyset};
use podca_signer::names::ObjectName;
use podca_signer::{CaAlgorithm, FileStore, StoreError};
use prometheus_client::encoding::EncodeLabelSet;
use serde::Deserialize;
use time::Duration;
use tokio::sync::watch;

use crate::config::{CaConfig, ConfigError};
use crate::metrics::Metrics;
use crate::trust::Clock;

/// The `[jwt]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// The `iss` claim and the OIDC discovery issuer; an `https://` URL.
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default = "default_lifetime")]
    pub default_lifetime_seconds: u32,
    #[serde(default = "default_max_lifetime")]
    pub max_lifetime_seconds: u32,
    #[serde(default = "default_rotation")]
    pub key_rotation_seconds: u32,
    #[serde(default = "default_propagation")]
    pub propagation_seconds: u32,
    #[serde(default = "default_max_audiences")]
    pub max_audiences: usize,
    #[serde(default = "default_algorithm")]
    pub key_algorithm: CaAlgorithm,
    /// Where OIDC discovery listens (None: not served).
    #[serde(default)]
    pub oidc_listen: Option<std::net::SocketAddr>,
    /// `podca serve`: the ConfigMap the leader writes the JWKS (and the discovery document) to
    /// on every key change; `""`: none.
    #[serde(default = "default_jwks_configmap")]
    pub jwks_configmap: String,
    /// The JWKS ConfigMap's namespace; default: podca's own (`POD_NAMESPACE`).
    #[serde(default)]
    pub jwks_configmap_namespace: Option<String>,
    /// `[ca] backend = "secret"`: the Secret, in the CA Secret's namespace, that holds the JWT
    /// keys; default `<CA Secret name>-jwt` ([`Self::keys_secret_for`]).
    #[serde(default)]
    pub keys_secret: Option<String>,
}

/// The default `[jwt] jwks_configmap`.
pub const DEFAULT_JWKS_CONFIGMAP: &str = "podca-jwks";

fn default_jwks_configmap() -> String {
    DEFAULT_JWKS_CONFIGMAP.into()
}

/// How the OIDC listener of `podca serve` speaks, given the gRPC listener's TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OidcTls {
    /// HTTPS with the gRPC listener's serving certificate.
    Tls,
    /// Plaintext; `insecure`: on an address other than loopback (`[grpc] insecure_plaintext`).
    Plaintext { insecure: bool },
}

/// The OIDC listener's TLS at `listen` when the gRPC listener's is `grpc`: TLS whenever gRPC
/// has it; with `[grpc] tls = "off"` plaintext on loopback, or elsewhere only when
/// `insecure_plaintext` allowed it for gRPC too.
pub fn oidc_tls(
    listen: std::net::SocketAddr,
    grpc: &crate::config::GrpcTls,
) -> Result<OidcTls, ConfigError> {
    match grpc {
        crate::config::GrpcTls::Off { insecure } => {
            let loopback = listen.ip().is_loopback();
            if !loopback && !insecure {
                return Err(ConfigError::Invalid(format!(
                    "[jwt] oidc_listen = {listen} is not a loopback address and [grpc] tls = \
                     \"off\": OIDC discovery is plaintext only on loopback or with [grpc] \
                     insecure_plaintext = true; use [grpc] tls = \"self-issued\" or \"files\""
                )));
            }
            Ok(OidcTls::Plaintext {
                insecure: !loopback,
            })
        }
        _ => Ok(OidcTls::Tls),
    }
}

/// The longest JWT-SVID lifetime the configuration accepts (a day; SPIFFE recommends minutes).
pub const MAX_JWT_LIFETIME_SECONDS: u32 = 86_400;
/// The most audiences `max_audiences` may allow.
pub const MAX_AUDIENCES_LIMIT: usize = 64;

fn default_enabled() -> bool {
    true
}
fn default_lifetime() -> u32 {
    300
}
fn default_max_lifetime() -> u32 {
    3600
}
fn default_rotation() -> u32 {
    86_400
}
fn default_propagation() -> u32 {
    900
}
fn default_max_audiences() -> usize {
    8
}
fn default_algorithm() -> CaAlgorithm {
    CaAlgorithm::EcdsaP256
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            enabled: default_enabled(),
            issuer: None,
            default_lifetime_seconds: default_lifetime(),
            max_lifetime_seconds: default_max_lifetime(),
            key_rotation_seconds: default_rotation(),
            propagation_seconds: default_propagation(),
            max_audiences: default_max_audiences(),
            key_algorithm: default_algorithm(),
            oidc_listen: None,
            jwks_configmap: default_jwks_configmap(),
            jwks_configmap_namespace: None,
            keys_secret: None,
        }
    }
}

impl JwtConfig {
    /// Refuses values that cannot work, naming the key.
    pub fn check(&self) -> Result<(), ConfigError> {
        if let Some(issuer) = &self.issuer {
            let host = issuer.strip_prefix("https://").unwrap_or_default();
            if host.is_empty()
                || host.starts_with('/')
                || issuer.contains(['?', '#'])
                || issuer.ends_with('/')
            {
                return Err(ConfigError::Invalid(format!(
                    "[jwt] issuer {issuer:?} must be an https:// URL without a query, fragment or \
                     trailing slash (OIDC relying parties compare it exactly)"
                )));
            }
        }
        if self.max_lifetime_seconds == 0 || self.max_lifetime_seconds > MAX_JWT_LIFETIME_SECONDS {
            return Err(ConfigError::Invalid(format!(
                "[jwt] max_lifetime_seconds = {} must be between 1 and {MAX_JWT_LIFETIME_SECONDS}",
                self.max_lifetime_seconds
            )));
        }
        if self.default_lifetime_seconds == 0
            || self.default_lifetime_seconds > self.max_lifetime_seconds
        {
            return Err(ConfigError::Invalid(format!(
                "[jwt] default_lifetime_seconds = {} must be between 1 and max_lifetime_seconds \
                 ({})",
                self.default_lifetime_seconds, self.max_lifetime_seconds
            )));
        }
        if self.max_audiences == 0 || self.max_audiences > MAX_AUDIENCES_LIMIT {
            return Err(ConfigError::Invalid(format!(
                "[jwt] max_audiences = {} must be between 1 and {MAX_AUDIENCES_LIMIT}",
                self.max_audiences
            )));
        }
        if self.key_algorithm == CaAlgorithm::Ed25519 {
            return Err(ConfigError::Invalid(
                "[jwt] key_algorithm = \"ed25519\": EdDSA is not a JWT-SVID algorithm; use \
                 ecdsa-p256, ecdsa-p384 or rsa-sha256"
                    .into(),
            ));
        }
        for (key, name) in [
            (
                "jwks_configmap",
                Some(&self.jwks_configmap).filter(|n| !n.is_empty()),
            ),
            (
                "jwks_configmap_namespace",
                self.jwks_configmap_namespace.as_ref(),
            ),
            ("keys_secret", self.keys_secret.as_ref()),
        ] {
            if let Some(name) = name
                && let Err(e) = name.parse::<ObjectName>()
            {
                return Err(ConfigError::Invalid(format!(
                    "[jwt] {key} = {name:?} is not a valid Kubernetes name: it {e} (lowercase \
                     letters, digits, '-' and '.', at most 253 characters)"
                )));
            }
        }
        self.schedule().check().map_err(|e| {
            ConfigError::Invalid(format!(
                "[jwt] {e} (key_rotation_seconds, propagation_seconds)"
            ))
        })
    }

    /// [`Self::check`], and what `podca serve` needs more: OIDC discovery needs the `https://`
    /// issuer relying parties fetch it from.
    pub fn check_for_serve(&self) -> Result<(), ConfigError> {
        self.check()?;
        if let (Some(listen), None) = (self.oidc_listen, &self.issuer) {
            return Err(ConfigError::Invalid(format!(
                "[jwt] oidc_listen = {listen} needs [jwt] issuer: the https:// URL relying \
                 parties fetch <issuer>{} from (tokens carry it as iss)",
                crate::oidc::DISCOVERY_PATH
            )));
        }
        Ok(())
    }

    /// The name of the Secret that holds the JWT keys beside the CA Secret `ca_secret` (the
    /// Secret backend): `[jwt] keys_secret`, else `<ca_secret>-jwt`.
    pub fn keys_secret_for(&self, ca_secret: &str) -> String {
        self.keys_secret
            .clone()
            .unwrap_or_else(|| format!("{ca_secret}-jwt"))
    }

    pub fn schedule(&self) -> JwtKeySchedule {
        JwtKeySchedule {
            rotation_period: Duration::seconds(i64::from(self.key_rotation_seconds)),
            propagation: Duration::seconds(i64::from(self.propagation_seconds)),
            max_lifetime: Duration::seconds(i64::from(self.max_lifetime_seconds)),
        }
    }

    pub fn limits(&self) -> IssueLimits {
        IssueLimits {
            default_lifetime: Duration::seconds(i64::from(self.default_lifetime_seconds)),
            max_lifetime: Duration::seconds(i64::from(self.max_lifetime_seconds)),
            max_audiences: self.max_audiences,
            issuer: self.issuer.clone(),
        }
    }
}

/// The JWT key store for the CA `ca` names: its state in the CA data directory, and new keys
/// made where the CA key lives. `podca serve` and `podca dev` call this and hand the store to
/// [`JwtRotator::start`].
///
/// * `backend = "file"`: files in `<dir>/jwt/`.
/// * `backend = "pkcs11"`: key pairs generated inside the CA key's token (label
///   `podca-jwt-…`, non-extractable), reached with the CA's PIN and module; their URIs in
///   `<dir>/jwt/state.json`. The token comes from `pkcs11_uri`, else from the location the data
///   directory records for the active CA key.
/// * `backend = "secret"`: an error: the keys are in a Secret of their own
///   ([`JwtConfig::keys_secret_for`]), which `podca serve` opens with
///   `podca_controller::jwt_secret` (this crate links no Kubernetes client).
pub fn open_store(ca: &CaConfig) -> Result<JwtStore, JwtStoreError> {
    let (dir, pkcs11) = match ca {
        CaConfig::File(f) => (f.dir.as_ref(), None),
        CaConfig::Pkcs11(p) => (p.dir.as_ref(), Some(p)),
        CaConfig::Secret(s) => {
            return Err(JwtStoreError::SecretBackend {
                secret: format!("{}/{}", s.namespace, s.name),
                name: s.name.clone(),
            });
        }
    };
    let Some(dir) = dir else {
        return Err(JwtStoreError::NoDir {
            backend: ca.backend_name(),
        });
    };
    let store = FileStore::new(dir);
    let Some(p) = pkcs11 else {
        return Ok(JwtStore::new(store));
    };
    let location = match &p.uri {
        Some(uri) => uri.clone(),
        None => store
            .external_key_location()?
            .ok_or_else(|| JwtStoreError::NoHsmKey { dir: dir.clone() })?,
    };
    let uri = Pkcs11Uri::parse(&location).map_err(|source| JwtStoreError::Uri {
        location: location.clone(),
        source,
    })?;
    let mut config = Pkcs11Config::new(uri, p.pin.clone());
    config.module_path = p.module.clone();
    Ok(JwtStore::with_backend(
        store,
        Arc::new(Pkcs11JwtKeys::new(&config)),
    ))
}

/// Why the JWT key store of a CA could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwtStoreError {
    #[error(
        "[ca] backend = \"secret\" ({secret}): the JWT-SVID signing keys are in a Secret of \
         their own ([jwt] keys_secret, default {name}-jwt), which only `podca serve` opens"
    )]
    SecretBackend { secret: String, name: String },
    #[error("[ca] dir is required for JWT-SVID signing keys with the {backend} backend")]
    NoDir { backend: &'static str },
    #[error(
        "[ca] backend = \"pkcs11\", but {} records no HSM key: set pkcs11_uri to name the \
         token for the JWT signing keys",
        dir.display()
    )]
    NoHsmKey { dir: PathBuf },
    #[error("[ca] {location}")]
    Uri {
        location: String,
        #[source]
        source: podca_signer::backend::BackendError,
    },
    #[error("[jwt]")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A cheap-to-clone handle on the current JWT key set.
#[derive(Debug, Clone)]
pub struct JwtHandle {
    tx: Arc<watch::Sender<Arc<JwtKeySet>>>,
}

impl JwtHandle {
    pub fn new(keys: JwtKeySet) -> Self {
        let (tx, _) = watch::channel(Arc::new(keys));
        JwtHandle { tx: Arc::new(tx) }
    }

    pub fn current(&self) -> Arc<JwtKeySet> {
        Arc::clone(&self.tx.borrow())
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<JwtKeySet>> {
        self.tx.subscribe()
    }

    /// Installs a new key set; every subscriber sees it. Unchanged sets are not re-sent.
    pub fn replace(&self, keys: JwtKeySet) {
        self.tx.send_if_modified(|current| {
            let changed = current.sequence() != keys.sequence() || current.infos().ne(keys.infos());
            if changed {
                *current = Arc::new(keys);
            }
            changed
        });
    }
}

/// Labels of the per-key JWT gauges (`podca_jwt_key_*`), like the CA's per-generation ones.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JwtKeyLabels {
    pub kid: String,
    /// `prepared`, `active` or `retired`.
    pub state: String,
}

/// Sets the `podca_jwt_key_*` gauges to `keys`: keys no longer published disappear.
pub fn export_metrics(metrics: &Metrics, keys: &JwtKeySet, schedule: &JwtKeySchedule) {
    metrics.jwt_key_not_after.clear();
    metrics.jwt_key_published.clear();
    metrics
        .jwt_key_propagation
        .set(schedule.propagation.whole_seconds());
    for info in keys.infos() {
        let labels = JwtKeyLabels {
            kid: info.kid.clone(),
            state: info.phase.to_string(),
        };
        metrics
            .jwt_key_published
            .get_or_create(&labels)
            .set(info.published_at.unix_timestamp());
        if let Some(t) = info.not_after {
            metrics
                .jwt_key_not_after
                .get_or_create(&labels)
                .set(t.unix_timestamp());
        }
    }
}

/// Whether a [`JwtRotator`] takes the schedule's steps itself or only follows the keys on disk.
#[derive(Debug, Clone)]
pub enum JwtRotation {
    /// Makes the first key and takes every due step (one process owns the directory).
    Automatic,
    /// Takes steps only while the receiver says this replica leads (`podca serve
    /// --leader-elect`); otherwise follows the keys another replica writes.
    WhileLeading(watch::Receiver<bool>),
    /// Never writes: follows the keys on disk (a read-only data directory).
    Follow,
}

/// Runs the key schedule of a data directory's JWT keys.
pub struct JwtRotator {
    store: JwtStore,
    schedule: JwtKeySchedule,
    algorithm: CaAlgorithm,
    handle: JwtHandle,
    clock: Clock,
    poll: StdDuration,
    metrics: Option<Arc<Metrics>>,
    rotation: JwtRotation,
}

impl std::fmt::Debug for JwtRotator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtRotator")
            .field("store", &self.store)
            .field("schedule", &self.schedule)
            .field("algorithm", &self.algorithm)
            .field("rotation", &self.rotation)
            .finish_non_exhaustive()
    }
}

impl JwtRotator {
    /// Brings the keys up to date once (making the first key on a first start) and returns the
    /// driver with its handle.
    pub fn start(
        store: JwtStore,
        config: &JwtConfig,
        clock: Clock,
        poll: StdDuration,
    ) -> Result<Self, JwtStoreError> {
        Self::start_with(store, config, clock, poll, JwtRotation::Automatic)
    }

    /// [`Self::start`] with the given [`JwtRotation`]. A rotator that does not take steps now
    /// (a standby, a read-only directory) starts with the keys on disk, possibly none: no
    /// token is signed until a key is there.
    pub fn start_with(
        store: JwtStore,
        config: &JwtConfig,
        clock: Clock,
        poll: StdDuration,
        rotation: JwtRotation,
    ) -> Result<Self, JwtStoreError> {
        config.check()?;
        let schedule = config.schedule();
        let keys = if rotation_steps(&rotation) {
            store
                .advance(clock(), &schedule, config.key_algorithm)?
                .keys
        } else {
            store.load()?
        };
        Ok(JwtRotator {
            store,
            schedule,
            algorithm: config.key_algorithm,
            handle: JwtHandle::new(keys),
            clock,
            poll,
            metrics: None,
            rotation,
        })
    }

    /// Exports the keys as `podca_jwt_key_*` gauges now and on every change (`podca serve`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        export_metrics(&metrics, &self.handle.current(), &self.schedule);
        self.metrics = Some(metrics);
        self
    }

    pub fn handle(&self) -> &JwtHandle {
        &self.handle
    }

    /// One check: applies due steps (or another process's changes) and publishes the set.
    /// Returns when the next step is due.
    pub fn tick(&self) -> Result<Option<time::OffsetDateTime>, StoreError> {
        let keys = if rotation_steps(&self.rotation) {
            self.store
                .advance((self.clock)(), &self.schedule, self.algorithm)
                .map(|advanced| advanced.keys)
        } else {
            self.store.load()
        }
        .inspect_err(|_| {
            if let Some(metrics) = &self.metrics {
                metrics.jwt_key_rotation_errors.inc();
            }
        })?;
        let infos: Vec<_> = keys.infos().cloned().collect();
        self.handle.replace(keys);
        if let Some(metrics) = &self.metrics {
            export_metrics(metrics, &self.handle.current(), &self.schedule);
        }
        Ok(keyset::next_event(&infos, &self.schedule))
    }

    /// Ticks until `shutdown` turns true, in the one key loop ([`crate::key_driver::drive`]):
    /// when a step is due, at least every `poll`, at once when a standby becomes the leader.
    pub async fn run(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        crate::key_driver::drive(self, shutdown).await;
    }
}

impl crate::key_driver::KeyKeeper for JwtRotator {
    type Error = String;
    const WHAT: &'static str = "JWT key rotation";

    fn check(
        &self,
    ) -> impl std::future::Future<Output = Result<Option<time::OffsetDateTime>, String>> + Send
    {
        std::future::ready(self.tick().map_err(|e| e.to_string()))
    }

    fn takes_steps(&self) -> bool {
        rotation_steps(&self.rotation)
    }

    fn leadership(&self) -> Option<watch::Receiver<bool>> {
        match &self.rotation {
            JwtRotation::WhileLeading(leading) => Some(leading.clone()),
            JwtRotation::Automatic | JwtRotation::Follow => None,
        }
    }

    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn poll(&self) -> StdDuration {
        self.poll
    }
}

/// Whether a rotator with `rotation` takes the schedule's steps now.
fn rotation_steps(rotation: &JwtRotation) -> bool {
    match rotation {
        JwtRotation::Automatic => true,
        JwtRotation::WhileLeading(leading) => *leading.borrow(),
        JwtRotation::Follow => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(table: &str) -> Result<JwtConfig, ConfigError> {
        let config: JwtConfig = toml::from_str(table)?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn defaults_and_every_key_parse() {
        assert_eq!(parse("").expect("defaults"), JwtConfig::default());
        let c = parse(
            "enabled = false\nissuer = \"https://podca.example.com\"\n\
             default_lifetime_seconds = 60\nmax_lifetime_seconds = 600\n\
             key_rotation_seconds = 3600\npropagation_seconds = 60\nmax_audiences = 2\n\
             key_algorithm = \"ecdsa-p384\"\noidc_listen = \"127.0.0.1:8444\"",
        )
        .expect("valid");
        assert!(!c.enabled);
        assert_eq!(c.limits().max_audiences, 2);
        assert_eq!(
            c.limits().issuer.as_deref(),
            Some("https://podca.example.com")
        );
        assert_eq!(c.schedule().propagation, Duration::seconds(60));
        assert_eq!(c.key_algorithm, CaAlgorithm::EcdsaP384);
        assert_eq!(c.oidc_listen, Some(([127, 0, 0, 1], 8444).into()));
    }

    /// The whole life of two keys in simulated time, as a subscriber of the handle (an open
    /// FetchJWTBundles stream) sees it.
    #[test]
    fn subscribers_see_a_new_key_before_it_signs_and_the_old_one_until_its_tokens_expired() {
        use std::sync::Mutex;

        use podca_signer::jwt::{Expectations, SvidRequest, validate};

        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = time::macros::datetime!(2026-01-01 00:00 UTC);
        let now = Arc::new(Mutex::new(t0));
        let clock: Clock = {
            let now = Arc::clone(&now);
            Arc::new(move || *now.lock().expect("clock"))
        };
        let set = |t| *now.lock().expect("clock") = t;
        let config = JwtConfig {
            key_rotation_seconds: 3600,
            propagation_seconds: 600,
            max_lifetime_seconds: 300,
            default_lifetime_seconds: 300,
            ..JwtConfig::default()
        };
        let rotator = JwtRotator::start(
            JwtStore::new(FileStore::new(dir.path())),
            &config,
            Arc::clone(&clock),
            StdDuration::from_secs(5),
        )
        .expect("first start");
        let mut stream = rotator.handle().subscribe();
        let kids = |set: &JwtKeySet| set.infos().map(|k| k.kid.clone()).collect::<Vec<_>>();
        let first = kids(&stream.borrow_and_update());
        assert_eq!(first.len(), 1);
        let sign = |at| {
            rotator
                .handle()
                .current()
                .sign(
                    &SvidRequest {
                        spiffe_id: "spiffe://td/ns/a/sa/b",
                        audiences: &["x".to_owned()],
                        lifetime: None,
                    },
                    &config.limits(),
                    at,
                )
                .expect("signs")
        };
        let valid_at = |token: &str, at| {
            validate(
                token,
                &rotator.handle().current().bundle(None),
                &Expectations {
                    audience: "x",
                    trust_domain: Some("td"),
                    max_audiences: 8,
                },
                at,
            )
        };

        // 50 min: the next key is prepared; the stream sees it, the old key still signs.
        let prepare = t0 + Duration::minutes(50);
        set(prepare);
        assert_eq!(rotator.tick().expect("tick"), Some(t0 + Duration::hours(1)));
        assert!(stream.has_changed().expect("open"));
        let published = kids(&stream.borrow_and_update());
        assert_eq!(published.len(), 2);
        assert_eq!(published[0], first[0]);
        let old_token = sign(prepare + Duration::minutes(9));
        assert_eq!(
            old_token.kid, first[0],
            "the prepared key must not sign yet"
        );

        // 60 min: the new key signs; the old key's token still validates until its exp.
        let rotate = t0 + Duration::hours(1);
        set(rotate);
        rotator.tick().expect("tick");
        assert_eq!(sign(rotate).kid, published[1]);
        assert!(valid_at(&old_token.token, rotate).is_ok());

        // The old key's not_after (rotation + max lifetime = 65 min): gone from the stream.
        let drop = t0 + Duration::hours(1) + Duration::minutes(5);
        set(drop - Duration::seconds(1));
        rotator.tick().expect("tick");
        assert_eq!(kids(&rotator.handle().current()).len(), 2);
        set(drop);
        rotator.tick().expect("tick");
        assert!(stream.has_changed().expect("open"));
        assert_eq!(
            kids(&stream.borrow_and_update()),
            vec![published[1].clone()]
        );
        assert!(matches!(
            valid_at(&old_token.token, drop - Duration::seconds(1)),
            Err(podca_signer::jwt::JwtError::UnknownKeyId(_))
        ));
    }

    /// A standby follows the directory and never writes it; once it leads, it takes the steps.
    #[test]
    fn a_standby_takes_no_steps_until_it_leads() {
        use podca_signer::FileStore;

        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = time::macros::datetime!(2026-01-01 00:00 UTC);
        let clock: Clock = Arc::new(move || t0);
        let (leading, rx) = watch::channel(false);
        let store = JwtStore::new(FileStore::new(dir.path()));
        let rotator = JwtRotator::start_with(
            store.clone(),
            &JwtConfig::default(),
            clock,
            StdDuration::from_secs(5),
            JwtRotation::WhileLeading(rx),
        )
        .expect("a standby starts without keys");
        assert_eq!(rotator.handle().current().infos().count(), 0);
        rotator.tick().expect("tick");
        assert_eq!(rotator.handle().current().infos().count(), 0);
        assert!(
            !dir.path().join("jwt").exists(),
            "a standby wrote the directory"
        );
        leading.send_replace(true);
        rotator.tick().expect("tick");
        let kids: Vec<_> = rotator
            .handle()
            .current()
            .infos()
            .map(|k| k.kid.clone())
            .collect();
        assert_eq!(kids.len(), 1);
        // Another process (a follower) reads the same key from the directory.
        let follower = JwtRotator::start_with(
            store,
            &JwtConfig::default(),
            Arc::new(move || t0),
            StdDuration::from_secs(5),
            JwtRotation::Follow,
        )
        .expect("follower");
        let followed: Vec<_> = follower
            .handle()
            .current()
            .infos()
            .map(|k| k.kid.clone())
            .collect();
        assert_eq!(followed, kids);
    }

    #[test]
    fn the_store_follows_the_ca_backend() {
        use crate::config::{FileCa, SecretCa};
        let dir = tempfile::tempdir().expect("tempdir");
        let file = CaConfig::File(FileCa {
            dir: Some(dir.path().to_owned()),
            automatic_rotation: false,
            split_from: None,
        });
        assert_eq!(open_store(&file).expect("file").backend_kind(), "file");
        let no_dir = CaConfig::File(FileCa {
            dir: None,
            automatic_rotation: false,
            split_from: None,
        });
        let err = open_store(&no_dir).expect_err("no dir");
        assert_eq!(
            err.to_string(),
            "[ca] dir is required for JWT-SVID signing keys with the file backend"
        );
        let secret = CaConfig::Secret(SecretCa {
            namespace: "podca-system".into(),
            name: "podca-ca".into(),
        });
        let err = open_store(&secret).expect_err("not a data directory");
        assert!(
            err.to_string().contains(
                "(podca-system/podca-ca): the JWT-SVID signing keys are in a Secret of their own \
                 ([jwt] keys_secret, default podca-ca-jwt), which only `podca serve` opens"
            ),
            "{err}"
        );
        assert_eq!(
            JwtConfig::default().keys_secret_for("podca-ca"),
            "podca-ca-jwt"
        );
        // PKCS#11 without a recorded HSM key or pkcs11_uri: which token is unknown.
        let pkcs11 = CaConfig::Pkcs11(crate::config::Pkcs11Ca {
            dir: Some(dir.path().to_owned()),
            uri: None,
            module: None,
            pin: podca_signer::backend::PinSource::Env("PIN".into()),
            mode: crate::config::Pkcs11Mode::HsmSignsLeaves,
            automatic_rotation: false,
        });
        // Here the directory holds no CA at all, so it cannot name the key's token either.
        let err = open_store(&pkcs11).expect_err("no token named");
        assert!(
            matches!(err, JwtStoreError::Store(StoreError::NotInitialised { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn every_key_change_reaches_the_gauges() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = time::macros::datetime!(2026-01-01 00:00 UTC);
        let now = Arc::new(std::sync::Mutex::new(t0));
        let clock: Clock = {
            let now = Arc::clone(&now);
            Arc::new(move || *now.lock().expect("clock"))
        };
        let config = JwtConfig {
            key_rotation_seconds: 3600,
            propagation_seconds: 600,
            max_lifetime_seconds: 300,
            default_lifetime_seconds: 300,
            ..JwtConfig::default()
        };
        let metrics = Arc::new(Metrics::new());
        let rotator = JwtRotator::start(
            JwtStore::new(FileStore::new(dir.path())),
            &config,
            clock,
            StdDuration::from_secs(5),
        )
        .expect("start")
        .with_metrics(Arc::clone(&metrics));
        let kids: Vec<String> = rotator
            .handle()
            .current()
            .infos()
            .map(|k| k.kid.clone())
            .collect();
        let first = &kids[0];
        let text = metrics.encode();
        let line = |name: &str, kid: &str, state: &str, value: i64| {
            format!("podca_{name}{{kid=\"{kid}\",state=\"{state}\"}} {value}")
        };
        let not_after = (t0 + Duration::minutes(65)).unix_timestamp();
        assert!(
            text.contains(&line(
                "jwt_key_not_after_timestamp_seconds",
                first,
                "active",
                not_after
            )),
            "{text}"
        );
        assert!(
            text.contains("podca_jwt_key_propagation_seconds 600"),
            "{text}"
        );
        // Prepared: published, no not_after yet.
        *now.lock().expect("clock") = t0 + Duration::minutes(50);
        rotator.tick().expect("tick");
        let text = metrics.encode();
        let second = rotator
            .handle()
            .current()
            .infos()
            .find(|k| k.phase == podca_signer::jwt::JwtKeyPhase::Prepared)
            .expect("prepared")
            .kid
            .clone();
        let published = (t0 + Duration::minutes(50)).unix_timestamp();
        assert!(
            text.contains(&line(
                "jwt_key_published_timestamp_seconds",
                &second,
                "prepared",
                published
            )),
            "{text}"
        );
        assert!(!text.contains(&format!(
            "jwt_key_not_after_timestamp_seconds{{kid=\"{second}\""
        )));
        // Activated, then dropped: the old key's series go.
        *now.lock().expect("clock") = t0 + Duration::minutes(60);
        rotator.tick().expect("tick");
        assert!(metrics.encode().contains(&line(
            "jwt_key_not_after_timestamp_seconds",
            first,
            "retired",
            not_after
        )));
        *now.lock().expect("clock") = t0 + Duration::minutes(65);
        rotator.tick().expect("tick");
        let text = metrics.encode();
        assert!(!text.contains(first.as_str()), "{text}");
        assert!(
            text.contains(&line(
                "jwt_key_not_after_timestamp_seconds",
                &second,
                "active",
                (t0 + Duration::minutes(125)).unix_timestamp()
            )),
            "{text}"
        );
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn serve_needs_an_https_issuer_for_discovery_and_tls_off_the_loopback() {
        use crate::config::GrpcTls;

        let c = parse("oidc_listen = \"0.0.0.0:8444\"").expect("dev accepts it");
        assert_eq!(c.jwks_configmap, "podca-jwks");
        assert_eq!(
            c.check_for_serve().unwrap_err().to_string(),
            "[jwt] oidc_listen = 0.0.0.0:8444 needs [jwt] issuer: the https:// URL relying \
             parties fetch <issuer>/.well-known/openid-configuration from (tokens carry it as iss)"
        );
        let c = parse("oidc_listen = \"0.0.0.0:8444\"\nissuer = \"https://oidc.example\"")
            .expect("valid");
        c.check_for_serve().expect("serve accepts it");
        assert_eq!(
            parse("issuer = \"http://oidc.example\"")
                .unwrap_err()
                .to_string(),
            "[jwt] issuer \"http://oidc.example\" must be an https:// URL without a query, \
             fragment or trailing slash (OIDC relying parties compare it exactly)"
        );
        assert!(
            parse("jwks_configmap = \"\"").is_ok(),
            "empty: no ConfigMap"
        );

        let any: std::net::SocketAddr = ([0, 0, 0, 0], 8444).into();
        let loopback: std::net::SocketAddr = ([127, 0, 0, 1], 8444).into();
        let selfissued = GrpcTls::Files {
            cert: "c".into(),
            key: "k".into(),
        };
        assert_eq!(oidc_tls(any, &selfissued).unwrap(), OidcTls::Tls);
        let off = GrpcTls::Off { insecure: false };
        assert_eq!(
            oidc_tls(loopback, &off).unwrap(),
            OidcTls::Plaintext { insecure: false }
        );
        let err = oidc_tls(any, &off).unwrap_err().to_string();
        assert!(
            err.starts_with("[jwt] oidc_listen = 0.0.0.0:8444 is not a loopback address"),
            "{err}"
        );
        assert_eq!(
            oidc_tls(any, &GrpcTls::Off { insecure: true }).unwrap(),
            OidcTls::Plaintext { insecure: true }
        );
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        for (table, needle) in [
            (
                "issuer = \"http://podca.example\"",
                "must be an https:// URL",
            ),
            ("issuer = \"https://\"", "must be an https:// URL"),
            ("issuer = \"https://a.example/\"", "trailing slash"),
            ("issuer = \"https://a.example?x=1\"", "without a query"),
            (
                "max_lifetime_seconds = 0",
                "max_lifetime_seconds = 0 must be between",
            ),
            (
                "max_lifetime_seconds = 86401",
                "max_lifetime_seconds = 86401 must be between",
            ),
            (
                "default_lifetime_seconds = 0",
                "default_lifetime_seconds = 0 must be",
            ),
            (
                "default_lifetime_seconds = 4000",
                "default_lifetime_seconds = 4000 must be between 1 and max_lifetime_seconds",
            ),
            (
                "max_audiences = 0",
                "max_audiences = 0 must be between 1 and 64",
            ),
            (
                "max_audiences = 65",
                "max_audiences = 65 must be between 1 and 64",
            ),
            (
                "key_algorithm = \"ed25519\"",
                "EdDSA is not a JWT-SVID algorithm",
            ),
            (
                "key_rotation_seconds = 600\npropagation_seconds = 600",
                "must be shorter than the rotation period",
            ),
            ("key_rotation_seconds = 0", "must be positive"),
            ("lifetime = 5", "unknown field `lifetime`"),
            ("oidc_listen = \"localhost\"", "invalid socket address"),
            (
                "jwks_configmap = \"Podca_JWKS\"",
                "[jwt] jwks_configmap = \"Podca_JWKS\" is not a valid Kubernetes name",
            ),
            (
                "jwks_configmap_namespace = \"-ns\"",
                "[jwt] jwks_configmap_namespace = \"-ns\" is not a valid Kubernetes name",
            ),
            (
                "keys_secret = \"JWT keys\"",
                "[jwt] keys_secret = \"JWT keys\" is not a valid Kubernetes name",
            ),
        ] {
            let err = parse(table).expect_err(table);
            assert!(format!("{err:#}").contains(needle), "{table}: {err:#}");
        }
    }
}
