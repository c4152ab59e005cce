//! `podca token-signer`: kube-apiserver's external service-account token signer (KEP-740,
//! `--service-account-signing-endpoint`), the `v1.ExternalJWTSigner` service on a Unix socket.
//!
//! kube-apiserver builds the claims, base64url-encodes them and sends them to [`Sign`]; podca
//! checks them, signs `header "." claims` with the active key of its JWT key set (the `[jwt]`
//! keys of a data directory: files or the PKCS#11 token), and returns the header and the
//! signature. [`FetchKeys`] publishes every key of the set (prepared, active and retired), so a
//! prepared key reaches kube-apiserver's verifier and OIDC JWKS a propagation window before it
//! signs, and a retired one stays until every token it signed has expired. [`Metadata`] tells
//! kube-apiserver the longest token lifetime: `[jwt] max_lifetime_seconds`, the lifetime the
//! rotation schedule keeps retired keys published for, so the two cannot disagree.
//!
//! It is a mode of its own, not a component of `podca serve`: it runs on each control-plane
//! node beside kube-apiserver (which must reach it before it can serve, and so before any
//! in-cluster podca exists), with its own data directory and no Kubernetes client.
//!
//! The socket is 0600, owned by the configured user; a caller of another uid (root passes any
//! file mode) is refused with `PERMISSION_DENIED` and one log line.
//!
//! [`Sign`]: ExternalJwtSigner::sign
//! [`FetchKeys`]: ExternalJwtSigner::fetch_keys
//! [`Metadata`]: ExternalJwtSigner::metadata

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use podca_authority::components::jwt::{self as jwt_component, JwtStartError};
use podca_authority::config::Config;
use podca_authority::jwt::{JwtConfig, JwtHandle};
use podca_authority::runtime::RuntimeError;
use podca_authority::{Clock, Runtime, RuntimeOptions, Stage};
use podca_proto::externaljwt::v1::external_jwt_signer_server::{
    ExternalJwtSigner, ExternalJwtSignerServer,
};
use podca_proto::externaljwt::v1::{
    FetchKeysRequest, FetchKeysResponse, Key, MetadataRequest, MetadataResponse, SignJwtRequest,
    SignJwtResponse,
};
use podca_signer::CaAlgorithm;
use podca_signer::jwt::{Header, JwtAlgorithm, JwtError, sign_input};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use time::{Duration, OffsetDateTime};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::component::{StartError, bind_socket};
use crate::uds_authority::AuthorityFix;

/// The longest claims segment `Sign` accepts, as sent (base64url). kube-apiserver's claims are
/// well under 2 KiB; anything near this is not a service-account token.
pub const MAX_CLAIMS_BYTES: usize = 16 * 1024;

/// The shortest maximum token lifetime kube-apiserver accepts from a signer.
pub const MIN_MAX_TOKEN_EXPIRATION_SECONDS: u32 = 600;

/// Why `Sign` signed nothing. Each maps to its gRPC status in [`SignRefusal::status`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignRefusal {
    #[error("the claims are {len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("the claims are not base64url (URL-safe alphabet, no padding)")]
    NotBase64,
    #[error("the claims are not a JSON object")]
    NotJsonObject,
    #[error("claim {0:?} is missing or not of its type")]
    MissingClaim(&'static str),
    #[error("exp {exp} is {} s from now ({now}), over the maximum of {max} s", exp - now)]
    TooLong { exp: i64, now: i64, max: i64 },
    #[error(
        "exp {exp} is after {until}, when the signing key {kid} leaves the published keys \
         (its successor is not yet propagated)"
    )]
    OutlivesKey { exp: i64, until: i64, kid: String },
    #[error("no active signing key")]
    NoSigningKey,
    #[error("signing failed: {0}")]
    Signing(JwtError),
}

impl SignRefusal {
    /// Its `reason` label in `podca_token_signer_requests_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            SignRefusal::TooLarge { .. } => "too_large",
            SignRefusal::NotBase64 => "not_base64",
            SignRefusal::NotJsonObject => "not_json_object",
            SignRefusal::MissingClaim(_) => "missing_claim",
            SignRefusal::TooLong { .. } => "too_long",
            SignRefusal::OutlivesKey { .. } => "outlives_key",
            SignRefusal::NoSigningKey => "no_signing_key",
            SignRefusal::Signing(_) => "signing_failed",
        }
    }

    /// The status kube-apiserver gets: the claims' faults are the caller's, the keys' are ours.
    pub fn status(&self) -> Status {
        let message = self.to_string();
        match self {
            SignRefusal::TooLarge { .. }
            | SignRefusal::NotBase64
            | SignRefusal::NotJsonObject
            | SignRefusal::MissingClaim(_)
            | SignRefusal::TooLong { .. } => Status::invalid_argument(message),
            SignRefusal::OutlivesKey { .. } | SignRefusal::NoSigningKey => {
                Status::unavailable(message)
            }
            SignRefusal::Signing(e) => match e {
                // The device (a PKCS#11 token) is unreachable or busy: try again.
                JwtError::Backend(b) if b.is_transient() => Status::unavailable(message),
                _ => Status::internal(message),
            },
        }
    }
}

/// Checks the claims kube-apiserver sent, as sent: size, encoding, `exp`, `iat`, `iss` and
/// `sub`, and `exp` at most `max_expiration` after `now`. Returns `exp`.
pub fn check_claims(
    claims: &str,
    now: OffsetDateTime,
    max_expiration: Duration,
) -> Result<i64, SignRefusal> {
    if claims.len() > MAX_CLAIMS_BYTES {
        return Err(SignRefusal::TooLarge {
            len: claims.len(),
            max: MAX_CLAIMS_BYTES,
        });
    }
    let json = URL_SAFE_NO_PAD
        .decode(claims)
        .map_err(|_| SignRefusal::NotBase64)?;
    let value: serde_json::Value =
        serde_json::from_slice(&json).map_err(|_| SignRefusal::NotJsonObject)?;
    let object = value.as_object().ok_or(SignRefusal::NotJsonObject)?;
    let exp = object
        .get("exp")
        .and_then(serde_json::Value::as_i64)
        .ok_or(SignRefusal::MissingClaim("exp"))?;
    if !object.get("iat").is_some_and(serde_json::Value::is_i64) {
        return Err(SignRefusal::MissingClaim("iat"));
    }
    for text in ["iss", "sub"] {
        if !object.get(text).is_some_and(serde_json::Value::is_string) {
            return Err(SignRefusal::MissingClaim(text));
        }
    }
    let (now, max) = (now.unix_timestamp(), max_expiration.whole_seconds());
    if exp - now > max {
        return Err(SignRefusal::TooLong { exp, now, max });
    }
    Ok(exp)
}

/// Whether the Unix-socket peer `peer_uid` may call: only `allowed` (root passes any file mode,
/// so the mode alone is not enough).
pub fn admit(peer_uid: Option<u32>, allowed: u32) -> Result<(), Status> {
    match peer_uid {
        Some(uid) if uid == allowed => Ok(()),
        Some(uid) => Err(Status::permission_denied(format!(
            "uid {uid} may not use the token signer (only uid {allowed})"
        ))),
        None => Err(Status::permission_denied(
            "the caller's uid is unknown (no peer credentials)",
        )),
    }
}

/// The token signer's settings, checked once from `[jwt]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `Metadata`'s maximum token lifetime: `[jwt] max_lifetime_seconds`.
    pub max_expiration: Duration,
    /// `FetchKeys`' refresh hint: a third of the propagation window ([`crate::jwt::refresh_hint`]).
    pub refresh_hint: Duration,
}

impl Settings {
    /// Refuses a `[jwt]` kube-apiserver or the rotation schedule could not work with: keys
    /// other than ES256 (P-256) and RS256, a maximum lifetime under 600 s, JWT keys disabled.
    pub fn from_config(config: &JwtConfig) -> Result<Self, TokenSignerError> {
        let refused = |m: String| Err(TokenSignerError::Config(m));
        if !config.enabled {
            return refused(
                "[jwt] enabled = false: the token signer signs with the [jwt] keys".into(),
            );
        }
        match config.key_algorithm {
            CaAlgorithm::EcdsaP256 | CaAlgorithm::RsaSha256 => {}
            other => {
                return refused(format!(
                    "[jwt] key_algorithm = {other:?}: kube-apiserver's token signer takes \
                     ecdsa-p256 (ES256) or rsa-sha256 (RS256)"
                ));
            }
        }
        if config.max_lifetime_seconds < MIN_MAX_TOKEN_EXPIRATION_SECONDS {
            return refused(format!(
                "[jwt] max_lifetime_seconds = {} is the longest service-account token; \
                 kube-apiserver needs at least {MIN_MAX_TOKEN_EXPIRATION_SECONDS}",
                config.max_lifetime_seconds
            ));
        }
        let schedule = config.schedule();
        let max_expiration = Duration::seconds(i64::from(config.max_lifetime_seconds));
        // A retired key stays published for the schedule's max_lifetime: every token it may
        // have signed must expire before it goes.
        if schedule.max_lifetime < max_expiration {
            return refused(format!(
                "the key schedule keeps retired keys {} s, less than the maximum token \
                 lifetime {} s",
                schedule.max_lifetime.whole_seconds(),
                max_expiration.whole_seconds()
            ));
        }
        Ok(Settings {
            max_expiration,
            refresh_hint: crate::jwt::refresh_hint(config),
        })
    }
}

/// `podca_token_signer_requests_total{method,outcome}` labels: `outcome` is `ok`,
/// `permission_denied` (another uid) or a [`SignRefusal::reason`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: &'static str,
    pub outcome: &'static str,
}

/// The token signer's metrics (`podca_token_signer_*`).
#[derive(Clone, Debug, Default)]
pub struct TokenSignerMetrics {
    /// `podca_token_signer_requests_total{method,outcome}`.
    pub requests: Family<RequestLabels, Counter>,
}

impl TokenSignerMetrics {
    /// Registers them in `registry` (the runtime's `token_signer` sub-registry).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "requests",
            "ExternalJWTSigner calls answered, by method (Sign, FetchKeys, Metadata) and outcome \
             (ok, permission_denied, or the Sign refusal's reason)",
            metrics.requests.clone(),
        );
        metrics
    }

    fn count(&self, method: &'static str, outcome: &'static str) {
        self.requests
            .get_or_create(&RequestLabels { method, outcome })
            .inc();
    }
}

/// The `v1.ExternalJWTSigner` service over a JWT key set.
#[derive(Clone)]
pub struct TokenSigner {
    keys: JwtHandle,
    settings: Settings,
    clock: Clock,
    allowed_uid: u32,
    metrics: TokenSignerMetrics,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("settings", &self.settings)
            .field("allowed_uid", &self.allowed_uid)
            .finish_non_exhaustive()
    }
}

impl TokenSigner {
    pub fn new(keys: JwtHandle, settings: Settings, clock: Clock, allowed_uid: u32) -> Self {
        TokenSigner {
            keys,
            settings,
            clock,
            allowed_uid,
            metrics: TokenSignerMetrics::default(),
        }
    }

    /// Counts its calls into `metrics` (else into a family nobody exports).
    pub fn with_metrics(self, metrics: TokenSignerMetrics) -> Self {
        TokenSigner { metrics, ..self }
    }

    /// Signs `claims` (base64url, as sent) with the key active now: the header and signature,
    /// base64url.
    pub async fn sign(&self, claims: String) -> Result<(String, String), SignRefusal> {
        let now = (self.clock)();
        let exp = check_claims(&claims, now, self.settings.max_expiration)?;
        let keys = self.keys.current();
        let (info, key) = keys.signing(now).ok_or(SignRefusal::NoSigningKey)?;
        // Never a token that outlives its key's place in FetchKeys.
        if let Some(until) = info.not_after
            && exp > until.unix_timestamp()
        {
            return Err(SignRefusal::OutlivesKey {
                exp,
                until: until.unix_timestamp(),
                kid: info.kid.clone(),
            });
        }
        let alg = JwtAlgorithm::for_key(key.algorithm()).map_err(SignRefusal::Signing)?;
        let header = Header {
            alg: alg.name().to_owned(),
            kid: Some(info.kid.clone()),
            typ: Some("JWT".to_owned()),
        };
        let header = serde_json::to_vec(&header)
            .map_err(|_| SignRefusal::Signing(JwtError::Malformed("header")))?;
        let header = URL_SAFE_NO_PAD.encode(header);
        let input = format!("{header}.{claims}");
        let key = Arc::clone(key);
        let signature = if key.signs_quickly_in_process() {
            sign_input(key.as_ref(), alg, input.as_bytes())
        } else {
            // HSM keys wait on the device: keep that off the async workers.
            tokio::task::spawn_blocking(move || sign_input(key.as_ref(), alg, input.as_bytes()))
                .await
                .map_err(|_| {
                    SignRefusal::Signing(JwtError::UnusableKey("the signing task failed".into()))
                })?
        }
        .map_err(SignRefusal::Signing)?;
        Ok((header, URL_SAFE_NO_PAD.encode(signature)))
    }

    /// Every published key, PKIX DER, with the refresh hint.
    pub fn keys(&self) -> FetchKeysResponse {
        let now = (self.clock)();
        let keys = self.keys.current();
        FetchKeysResponse {
            keys: keys
                .published()
                .map(|(info, key)| Key {
                    key_id: info.kid.clone(),
                    key: key.public_key_spki(),
                    // Every podca key signs bound tokens and belongs in OIDC discovery.
                    exclude_from_oidc_discovery: false,
                })
                .collect(),
            data_timestamp: Some(prost_types::Timestamp {
                seconds: now.unix_timestamp(),
                nanos: 0,
            }),
            refresh_hint_seconds: self.settings.refresh_hint.whole_seconds().max(1),
        }
    }

    /// The peer check, with its one log line on a refusal.
    fn admit<T>(&self, request: &Request<T>, method: &'static str) -> Result<(), Status> {
        let uid = request
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        admit(uid, self.allowed_uid).inspect_err(|_| {
            self.metrics.count(method, "permission_denied");
            warn!(
                method,
                uid,
                allowed_uid = self.allowed_uid,
                "token signer: refused a caller that is not the configured user"
            );
        })
    }
}

#[tonic::async_trait]
impl ExternalJwtSigner for TokenSigner {
    async fn sign(
        &self,
        request: Request<SignJwtRequest>,
    ) -> Result<Response<SignJwtResponse>, Status> {
        self.admit(&request, "Sign")?;
        let claims = request.into_inner().claims;
        match TokenSigner::sign(self, claims).await {
            Ok((header, signature)) => {
                self.metrics.count("Sign", "ok");
                Ok(Response::new(SignJwtResponse { header, signature }))
            }
            Err(refusal) => {
                self.metrics.count("Sign", refusal.reason());
                warn!(error = %refusal, reason = refusal.reason(), "token signer: Sign refused");
                Err(refusal.status())
            }
        }
    }

    async fn fetch_keys(
        &self,
        request: Request<FetchKeysRequest>,
    ) -> Result<Response<FetchKeysResponse>, Status> {
        self.admit(&request, "FetchKeys")?;
        self.metrics.count("FetchKeys", "ok");
        Ok(Response::new(self.keys()))
    }

    async fn metadata(
        &self,
        request: Request<MetadataRequest>,
    ) -> Result<Response<MetadataResponse>, Status> {
        self.admit(&request, "Metadata")?;
        self.metrics.count("Metadata", "ok");
        Ok(Response::new(MetadataResponse {
            max_token_expiration_seconds: self.settings.max_expiration.whole_seconds(),
        }))
    }
}

/// Why `podca token-signer` could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenSignerError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Keys(#[from] JwtStartError),
    #[error(transparent)]
    Socket(#[from] StartError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// What `podca token-signer` runs with besides the configuration file.
#[derive(Debug, Clone)]
pub struct Options {
    /// The Unix socket kube-apiserver's `--service-account-signing-endpoint` names.
    pub socket: PathBuf,
    /// The uid that may call and owns the socket; None: this process's (the socket's owner).
    pub socket_owner: Option<u32>,
    /// `/livez`, `/readyz` and `/metrics`; None: no admin listener.
    pub admin_listen: Option<SocketAddr>,
}

/// How long stopping may take.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the token signer until `shutdown`: the `[jwt]` keys of `[ca] dir` with their rotation
/// driver, the socket, and the admin listener.
pub async fn run(
    config: &Config,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> Result<(), TokenSignerError> {
    let Options {
        socket,
        socket_owner,
        admin_listen,
    } = options;
    let clock = podca_authority::system_clock();
    let settings = Settings::from_config(&config.jwt)?;
    let Some(dir) = config.ca.dir() else {
        return Err(TokenSignerError::Config(format!(
            "[ca] backend = {:?} has no dir: the token signer keeps its keys in <dir>/jwt/ \
             (backend \"file\" or \"pkcs11\" with dir)",
            config.ca.backend_name()
        )));
    };
    // The keys' directory is made on a first start, private (a file key is a secret); a
    // directory that cannot be written is followed, not rotated (authority's JWT component).
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| TokenSignerError::Config(format!("creating {}: {e}", dir.display())))?;
    }
    let mut rt = Runtime::new(RuntimeOptions {
        admin_listen,
        drain_timeout: DRAIN_TIMEOUT,
        clock: Arc::clone(&clock),
    });
    let Some(keys) = jwt_component::start(&mut rt, &config.jwt, &config.ca, dir, false)? else {
        return Err(TokenSignerError::Config("[jwt] enabled = false".into()));
    };
    let oidc = TokenSignerOidc::bind(config).await?;
    let (listener, path) = bind_owned_socket(&socket, socket_owner)?;
    let allowed_uid = socket_owner.map_or_else(|| owner_of(&path), Ok)?;
    let metrics = rt
        .metrics()
        .register_component("token_signer", TokenSignerMetrics::register);
    if let Some(oidc) = oidc {
        oidc.serve(&mut rt, &keys)?;
    }
    let signer = TokenSigner::new(keys, settings, clock, allowed_uid).with_metrics(metrics);
    info!(
        socket = %path.display(),
        allowed_uid,
        max_token_expiration_seconds = settings.max_expiration.whole_seconds(),
        "token signer (v1.ExternalJWTSigner) listening"
    );
    let ready = rt.init_handle("token-signer");
    ready.set(true);
    rt.spawn(Stage::Serve, "token signer", move |mut stop| async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new));
        let served = tonic::transport::Server::builder()
            .add_service(ExternalJwtSignerServer::new(signer))
            .serve_with_incoming_shutdown(incoming, stopped)
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "token signer failed");
        }
        ready.set(false);
        // The socket file goes with the server.
        let _ = std::fs::remove_file(&path);
    });
    rt.run(shutdown).await?;
    Ok(())
}

/// OIDC discovery of the token signer's keys (`[jwt] oidc_listen`), for relying parties
/// outside the cluster that verify service-account tokens (an AWS IAM OIDC provider, Vault)
/// without asking kube-apiserver: the same keys as `FetchKeys`, the issuer `[jwt] issuer`
/// (kube-apiserver's `--service-account-issuer`, which tokens carry). HTTPS with the
/// operator's certificate files (`[grpc] tls = "files"`); plaintext only on loopback
/// (`[grpc] tls = "off"`). The token signer has no CA to issue its own certificate from.
#[derive(Debug)]
struct TokenSignerOidc {
    listener: tokio::net::TcpListener,
    tls: Option<(PathBuf, PathBuf)>,
    discovery: podca_authority::oidc::Discovery,
}

impl TokenSignerOidc {
    async fn bind(config: &Config) -> Result<Option<Self>, TokenSignerError> {
        use podca_authority::config::GrpcTls;
        let Some(listen) = config.jwt.oidc_listen else {
            return Ok(None);
        };
        let Some(issuer) = config.jwt.issuer.clone() else {
            return Err(TokenSignerError::Config(
                "[jwt] oidc_listen needs [jwt] issuer: kube-apiserver's \
                 --service-account-issuer, which every token it signs carries"
                    .into(),
            ));
        };
        let tls = match config.grpc.tls(listen) {
            Ok(GrpcTls::Files { cert, key }) => Some((cert, key)),
            Ok(GrpcTls::Off { insecure: false }) => None,
            Ok(GrpcTls::SelfIssued(_)) | Ok(GrpcTls::Off { insecure: true }) => {
                return Err(TokenSignerError::Config(format!(
                    "[jwt] oidc_listen = {listen}: podca token-signer serves OIDC discovery over \
                     HTTPS with [grpc] tls = \"files\" (tls_cert_file, tls_key_file), or in \
                     plaintext on a loopback address with [grpc] tls = \"off\"; it has no CA to \
                     issue its own certificate from"
                )));
            }
            Err(e) => return Err(TokenSignerError::Config(format!("[jwt] oidc_listen: {e}"))),
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|error| StartError::Listen {
                what: "[jwt] oidc_listen",
                addr: listen,
                error,
            })?;
        let discovery = crate::component::discovery(&config.jwt, issuer)?;
        Ok(Some(TokenSignerOidc {
            listener,
            tls,
            discovery,
        }))
    }

    fn serve(self, rt: &mut Runtime, keys: &JwtHandle) -> Result<(), TokenSignerError> {
        let TokenSignerOidc {
            listener,
            tls,
            discovery,
        } = self;
        let config = match tls {
            Some((cert, key)) => {
                let serving = crate::component::serving_files(rt, &cert, &key)?;
                Some(crate::tls::http1_server_config(serving).map_err(|e| {
                    TokenSignerError::Config(format!("[jwt] oidc_listen: TLS: {e}"))
                })?)
            }
            None => None,
        };
        info!(
            addr = ?listener.local_addr().ok(),
            issuer = discovery.issuer,
            tls = config.is_some(),
            "token signer: OIDC discovery listening"
        );
        crate::component::spawn_discovery(rt, listener, config, discovery, keys);
        Ok(())
    }
}

/// Binds the socket 0600 as `podca dev` binds its own (a stale one replaced, a live one or a
/// non-socket refused), then hands it to `owner` when given (root only can).
fn bind_owned_socket(
    path: &Path,
    owner: Option<u32>,
) -> Result<(tokio::net::UnixListener, PathBuf), TokenSignerError> {
    // No identities but the owner's: bind_socket makes it 0600.
    let (listener, path) = bind_socket(path, &[])?;
    if let Some(uid) = owner {
        std::os::unix::fs::chown(&path, Some(uid), None).map_err(|e| {
            TokenSignerError::Config(format!(
                "handing the socket {} to uid {uid}: {e}",
                path.display()
            ))
        })?;
    }
    Ok((listener, path))
}

fn owner_of(path: &Path) -> Result<u32, TokenSignerError> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.uid())
        .map_err(|e| TokenSignerError::Config(format!("reading {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> OffsetDateTime {
        time::macros::datetime!(2026-12-01 00:00 UTC)
    }

    fn encode(claims: &serde_json::Value) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("JSON"))
    }

    fn kube_claims(exp_in: i64) -> serde_json::Value {
        let now = now().unix_timestamp();
        serde_json::json!({
            "aud": ["https://kubernetes.default.svc"],
            "exp": now + exp_in,
            "iat": now,
            "nbf": now,
            "iss": "https://kubernetes.default.svc",
            "sub": "system:serviceaccount:default:default",
            "kubernetes.io": {"namespace": "default", "serviceaccount": {"name": "default"}},
        })
    }

    #[test]
    fn claims_kube_apiserver_sends_pass_and_each_fault_is_named() {
        let max = Duration::hours(1);
        let good = kube_claims(3600);
        assert_eq!(
            check_claims(&encode(&good), now(), max),
            Ok(now().unix_timestamp() + 3600)
        );
        for claim in ["exp", "iat", "iss", "sub"] {
            let mut bad = good.clone();
            bad.as_object_mut().expect("an object").remove(claim);
            assert_eq!(
                check_claims(&encode(&bad), now(), max),
                Err(SignRefusal::MissingClaim(claim)),
                "{claim}"
            );
            // Of the wrong type: as absent.
            let mut bad = good.clone();
            bad[claim] = serde_json::json!([1]);
            assert_eq!(
                check_claims(&encode(&bad), now(), max),
                Err(SignRefusal::MissingClaim(claim)),
                "{claim}"
            );
        }
        let long = kube_claims(3601);
        assert_eq!(
            check_claims(&encode(&long), now(), max),
            Err(SignRefusal::TooLong {
                exp: now().unix_timestamp() + 3601,
                now: now().unix_timestamp(),
                max: 3600
            })
        );
        assert_eq!(
            check_claims("!!not base64!!", now(), max),
            Err(SignRefusal::NotBase64)
        );
        // Padded base64url is not what kube-apiserver sends.
        assert_eq!(
            check_claims(&format!("{}=", &encode(&good)[..4]), now(), max),
            Err(SignRefusal::NotBase64)
        );
        assert_eq!(
            check_claims(&URL_SAFE_NO_PAD.encode("[1,2]"), now(), max),
            Err(SignRefusal::NotJsonObject)
        );
        let oversized = "A".repeat(MAX_CLAIMS_BYTES + 1);
        assert_eq!(
            check_claims(&oversized, now(), max),
            Err(SignRefusal::TooLarge {
                len: MAX_CLAIMS_BYTES + 1,
                max: MAX_CLAIMS_BYTES
            })
        );
    }

    #[test]
    fn refusals_map_to_their_statuses() {
        use tonic::Code;
        let cases = [
            (SignRefusal::NotBase64, Code::InvalidArgument),
            (SignRefusal::MissingClaim("exp"), Code::InvalidArgument),
            (SignRefusal::NoSigningKey, Code::Unavailable),
            (
                SignRefusal::Signing(JwtError::Backend(
                    podca_signer::backend::BackendError::Unavailable("token removed".into()),
                )),
                Code::Unavailable,
            ),
            (
                SignRefusal::Signing(JwtError::UnusableKey("x".into())),
                Code::Internal,
            ),
        ];
        for (refusal, code) in cases {
            let status = refusal.status();
            assert_eq!(status.code(), code, "{refusal}");
            assert_eq!(status.message(), refusal.to_string());
        }
    }

    #[test]
    fn only_the_configured_uid_is_admitted() {
        assert!(admit(Some(1000), 1000).is_ok());
        let other = admit(Some(0), 1000).expect_err("root is not the configured user");
        assert_eq!(other.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            other.message(),
            "uid 0 may not use the token signer (only uid 1000)"
        );
        let unknown = admit(None, 1000).expect_err("no credentials");
        assert_eq!(unknown.code(), tonic::Code::PermissionDenied);
    }

    /// A signer over one active in-memory key whose `not_after` is `published_for` from now.
    fn signer_with_key(published_for: Duration) -> (TokenSigner, String) {
        use podca_signer::jwt::keyset::kid_of;
        use podca_signer::jwt::{JwtKeyInfo, JwtKeyPhase, JwtKeySet};
        let key: Arc<dyn podca_signer::CaKey> = Arc::new(
            podca_signer::MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("a P-256 key"),
        );
        let kid = kid_of(key.as_ref());
        let info = JwtKeyInfo {
            kid: kid.clone(),
            algorithm: CaAlgorithm::EcdsaP256,
            phase: JwtKeyPhase::Active,
            published_at: now() - Duration::hours(1),
            activated_at: Some(now() - Duration::hours(1)),
            retired_at: None,
            not_after: Some(now() + published_for),
        };
        let keys = JwtKeySet::new(vec![(info, key)], 1).expect("a key set");
        let settings = Settings::from_config(&JwtConfig::default()).expect("defaults");
        let clock: Clock = Arc::new(now);
        (
            TokenSigner::new(JwtHandle::new(keys), settings, clock, 0),
            kid,
        )
    }

    #[tokio::test]
    async fn signs_with_the_active_key_but_never_past_its_publication() {
        let (signer, kid) = signer_with_key(Duration::hours(2));
        let (header, signature) = signer
            .sign(encode(&kube_claims(3600)))
            .await
            .expect("signed");
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64url"))
                .expect("JSON");
        assert_eq!(
            header,
            serde_json::json!({"alg": "ES256", "kid": kid, "typ": "JWT"})
        );
        let signature = URL_SAFE_NO_PAD.decode(signature).expect("base64url");
        assert_eq!(signature.len(), 64, "JOSE r || s, not DER");
        let keys = signer.keys();
        assert_eq!(keys.keys.len(), 1);
        assert_eq!(keys.keys[0].key_id, kid);
        assert_eq!(keys.refresh_hint_seconds, 300);

        // The key leaves FetchKeys in 30 min: a 1 h token would outlive it.
        let (signer, kid) = signer_with_key(Duration::minutes(30));
        let refused = signer
            .sign(encode(&kube_claims(3600)))
            .await
            .expect_err("outlives its key");
        let until = (now() + Duration::minutes(30)).unix_timestamp();
        assert_eq!(
            refused,
            SignRefusal::OutlivesKey {
                exp: now().unix_timestamp() + 3600,
                until,
                kid
            }
        );
        assert_eq!(refused.status().code(), tonic::Code::Unavailable);
        assert!(signer.sign(encode(&kube_claims(1800))).await.is_ok());
    }

    #[test]
    fn settings_refuse_what_kube_apiserver_cannot_use() {
        let ok = JwtConfig::default();
        let settings = Settings::from_config(&ok).expect("the defaults work");
        assert_eq!(settings.max_expiration, Duration::seconds(3600));
        assert_eq!(settings.refresh_hint, Duration::seconds(300));
        let short = JwtConfig {
            max_lifetime_seconds: 599,
            default_lifetime_seconds: 300,
            ..JwtConfig::default()
        };
        let e = Settings::from_config(&short).expect_err("under 600 s");
        assert!(e.to_string().contains("at least 600"), "{e}");
        let p384 = JwtConfig {
            key_algorithm: CaAlgorithm::EcdsaP384,
            ..JwtConfig::default()
        };
        let e = Settings::from_config(&p384).expect_err("ES384");
        assert!(
            e.to_string().contains("ecdsa-p256 (ES256) or rsa-sha256"),
            "{e}"
        );
        let off = JwtConfig {
            enabled: false,
            ..JwtConfig::default()
        };
        assert!(Settings::from_config(&off).is_err());
    }
}
