//! Who is calling: an [`Authenticator`] turns a peer and its credentials into an [`Identity`].
//! The services do not know which one is in use: [`DevAuthenticator`] for `podca dev`,
//! [`TokenReviewAuthenticator`] in a cluster.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;

use podca_authority::Clock;
use podca_authority::config::DevIdentity;

/// The caller's Kubernetes identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub namespace: String,
    pub service_account: String,
    /// From a bound service-account token: the pod the token was issued for.
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    /// From a bound service-account token: the node the pod runs on.
    pub node_name: Option<String>,
}

impl Identity {
    pub fn service_account(namespace: &str, service_account: &str) -> Self {
        Identity {
            namespace: namespace.into(),
            service_account: service_account.into(),
            pod_name: None,
            pod_uid: None,
            node_name: None,
        }
    }

    /// `namespace/service-account`, the key of rate limits and `node_proxy_service_accounts`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.service_account)
    }
}

/// Where a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Tcp(SocketAddr),
    /// A Unix-socket peer; `uid` from SO_PEERCRED.
    Unix {
        uid: Option<u32>,
    },
    Unknown,
}

/// A bearer token. Its `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    pub fn new(token: impl Into<String>) -> Self {
        BearerToken(token.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// What the request carried to say who it is.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub bearer: Option<BearerToken>,
    /// Dev mode only (`x-podca-namespace`, `x-podca-service-account`).
    pub dev_namespace: Option<String>,
    pub dev_service_account: Option<String>,
    /// The TLS client certificate of the connection, verified at the handshake; only
    /// [`crate::peer_identity`] reads an identity from it (mTLS renewal).
    pub client_certificate: Option<crate::peer_identity::ClientCertificate>,
}

/// Why the caller could not be identified. Never contains a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("no credentials: send `authorization: Bearer <service-account token>`")]
    Missing,
    #[error("invalid credentials: {0}")]
    Invalid(String),
    #[error("{0}")]
    UnknownCaller(String),
    #[error("{0}")]
    NotLoopback(String),
    #[error("cannot check credentials now: {}", review_problem(.0))]
    Unavailable(LookupError),
    /// The token and the client certificate name different identities.
    #[error("{0}")]
    Mismatch(String),
}

/// Why a question to the Kubernetes API (a TokenReview, a pod read) got no answer. The edge
/// says which question it was; this never contains a token or a request body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// No answer within the deadline (see [`KUBE_API_TIMEOUT`]).
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The API answered with an error, or the call failed.
    #[error("{0}")]
    Failed(String),
}

fn review_problem(e: &LookupError) -> String {
    match e {
        LookupError::Timeout(after) => format!("TokenReview did not answer within {after:?}"),
        LookupError::Failed(detail) => format!("TokenReview failed: {detail}"),
    }
}

/// Turns a peer and its credentials into an identity.
#[tonic::async_trait]
pub trait Authenticator: Send + Sync + fmt::Debug {
    async fn authenticate(
        &self,
        peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, AuthError>;
}

/// `podca dev`: Unix-socket callers by uid, loopback TCP callers by metadata.
#[derive(Debug, Clone)]
pub struct DevAuthenticator {
    by_uid: HashMap<u32, Identity>,
    /// The identity of a loopback TCP caller that names none.
    default: Option<Identity>,
}

impl DevAuthenticator {
    pub fn new(identities: &[DevIdentity]) -> Self {
        let by_uid = identities
            .iter()
            .map(|i| {
                (
                    i.uid,
                    Identity::service_account(&i.namespace, &i.service_account),
                )
            })
            .collect();
        let default = identities
            .first()
            .map(|i| Identity::service_account(&i.namespace, &i.service_account));
        DevAuthenticator { by_uid, default }
    }
}

#[tonic::async_trait]
impl Authenticator for DevAuthenticator {
    async fn authenticate(
        &self,
        peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, AuthError> {
        match peer {
            Peer::Unix { uid: Some(uid) } => self.by_uid.get(uid).cloned().ok_or_else(|| {
                AuthError::UnknownCaller(format!(
                    "uid {uid} is not mapped to an identity; add it to [dev] identities"
                ))
            }),
            Peer::Unix { uid: None } => Err(AuthError::UnknownCaller(
                "the caller's uid is unknown (no peer credentials)".into(),
            )),
            Peer::Tcp(addr) if addr.ip().is_loopback() => {
                match (&credentials.dev_namespace, &credentials.dev_service_account) {
                    (Some(ns), Some(sa)) => {
                        if !is_name(ns) || !is_name(sa) {
                            return Err(AuthError::Invalid(
                                "x-podca-namespace and x-podca-service-account must be \
                                 Kubernetes names"
                                    .into(),
                            ));
                        }
                        Ok(Identity::service_account(ns, sa))
                    }
                    (None, None) => self.default.clone().ok_or(AuthError::Missing),
                    _ => Err(AuthError::Invalid(
                        "send both x-podca-namespace and x-podca-service-account".into(),
                    )),
                }
            }
            Peer::Tcp(addr) => Err(AuthError::NotLoopback(format!(
                "dev identities are accepted from loopback only, not from {}",
                addr.ip()
            ))),
            Peer::Unknown => Err(AuthError::UnknownCaller("unknown peer".into())),
        }
    }
}

/// A DNS-1123 label, as namespaces and service-account names are.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
}

/// What a TokenReview said (`status` of authentication.k8s.io/v1 TokenReview).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReviewStatus {
    pub authenticated: bool,
    pub username: String,
    pub audiences: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    /// Why the token was not authenticated (from the API server; contains no token).
    pub error: Option<String>,
}

/// Asks the Kubernetes API about a token.
#[tonic::async_trait]
pub trait TokenReviewer: Send + Sync + fmt::Debug {
    async fn review(
        &self,
        token: &BearerToken,
        audience: &str,
    ) -> Result<ReviewStatus, LookupError>;
}

const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
/// Longest a review is trusted when the token names no expiry.
const MAX_CACHE: Duration = Duration::from_secs(600);
const MAX_CACHE_ENTRIES: usize = 100_000;

/// In-cluster: bearer service-account tokens checked with TokenReview, cached until the token's
/// `exp` (at most [`MAX_CACHE`]).
pub struct TokenReviewAuthenticator {
    reviewer: Arc<dyn TokenReviewer>,
    audience: String,
    /// SHA-256 of the token → identity and how long the review holds.
    cache: Mutex<HashMap<[u8; 32], (Identity, Instant)>>,
    /// The time a token's `exp` is compared with.
    clock: Clock,
}

impl fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenReviewAuthenticator")
            .field("reviewer", &self.reviewer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl TokenReviewAuthenticator {
    pub fn new(reviewer: Arc<dyn TokenReviewer>, audience: impl Into<String>) -> Self {
        TokenReviewAuthenticator {
            reviewer,
            audience: audience.into(),
            cache: Mutex::new(HashMap::new()),
            clock: podca_authority::system_clock(),
        }
    }

    /// Compares tokens' `exp` with `clock` instead of the system clock (the process clock,
    /// like every other time-dependent part).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    fn cached(&self, key: &[u8; 32], now: Instant) -> Option<Identity> {
        let cache = self.cache.lock().ok()?;
        cache
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(id, _)| id.clone())
    }

    fn remember(&self, key: [u8; 32], identity: Identity, until: Instant) {
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= MAX_CACHE_ENTRIES {
                let now = Instant::now();
                cache.retain(|_, (_, u)| *u > now);
                if cache.len() >= MAX_CACHE_ENTRIES {
                    cache.clear();
                }
            }
            cache.insert(key, (identity, until));
        }
    }
}

#[tonic::async_trait]
impl Authenticator for TokenReviewAuthenticator {
    async fn authenticate(
        &self,
        _peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, AuthError> {
        let token = credentials.bearer.as_ref().ok_or(AuthError::Missing)?;
        let key: [u8; 32] = {
            let digest =
                aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.expose().as_bytes());
            let mut key = [0u8; 32];
            key.copy_from_slice(digest.as_ref());
            key
        };
        let now = Instant::now();
        if let Some(identity) = self.cached(&key, now) {
            return Ok(identity);
        }
        // Expired tokens are refused here too, so a cached review never outlives the token.
        let remaining = match token_expiry(token) {
            Some(exp) => {
                let unix_now = u64::try_from((self.clock)().unix_timestamp()).unwrap_or(0);
                if exp <= unix_now {
                    return Err(AuthError::Invalid("the token has expired".into()));
                }
                Duration::from_secs(exp - unix_now).min(MAX_CACHE)
            }
            None => MAX_CACHE,
        };
        let status = self
            .reviewer
            .review(token, &self.audience)
            .await
            .map_err(AuthError::Unavailable)?;
        let identity = identity_from_review(&status, &self.audience)?;
        self.remember(key, identity.clone(), now + remaining);
        Ok(identity)
    }
}

/// Checks a review's answer and reads the identity out of it.
pub fn identity_from_review(status: &ReviewStatus, audience: &str) -> Result<Identity, AuthError> {
    if !status.authenticated {
        return Err(AuthError::Invalid(
            status
                .error
                .clone()
                .unwrap_or_else(|| "the token was not authenticated".into()),
        ));
    }
    if !status.audiences.iter().any(|a| a == audience) {
        return Err(AuthError::Invalid(format!(
            "the token is not valid for the audience {audience:?}"
        )));
    }
    let rest = status
        .username
        .strip_prefix("system:serviceaccount:")
        .ok_or_else(|| {
            AuthError::Invalid(format!(
                "{:?} is not a service account; use a service-account token",
                status.username
            ))
        })?;
    let (namespace, service_account) = rest
        .split_once(':')
        .filter(|(ns, sa)| !ns.is_empty() && !sa.is_empty())
        .ok_or_else(|| AuthError::Invalid(format!("malformed username {:?}", status.username)))?;
    let first = |k: &str| status.extra.get(k).and_then(|v| v.first()).cloned();
    Ok(Identity {
        namespace: namespace.into(),
        service_account: service_account.into(),
        pod_name: first(EXTRA_POD_NAME),
        pod_uid: first(EXTRA_POD_UID),
        node_name: first(EXTRA_NODE_NAME),
    })
}

/// The `exp` claim of a JWT, read without verifying anything: it only bounds how long a review
/// is cached and refuses obviously expired tokens early; TokenReview does the checking.
fn token_expiry(token: &BearerToken) -> Option<u64> {
    let payload = token.expose().split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_u64()
}

/// How long a gRPC call waits for the Kubernetes API (a TokenReview, a pod lookup). The kube
/// client retries 429/503 answers with exponential backoff for minutes; a caller is better
/// served by a prompt UNAVAILABLE it can retry than by a hung call.
pub const KUBE_API_TIMEOUT: Duration = Duration::from_secs(5);

/// A pod, as IssueForPod needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub service_account: String,
    pub node_name: Option<String>,
    pub uid: Option<String>,
}

/// Looks pods up (IssueForPod).
#[tonic::async_trait]
pub trait PodDirectory: Send + Sync + fmt::Debug {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodInfo>, LookupError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A TokenReview stand-in: knows some tokens, counts calls.
    #[derive(Debug, Default)]
    struct MockReviewer {
        calls: AtomicUsize,
    }

    #[tonic::async_trait]
    impl TokenReviewer for MockReviewer {
        async fn review(
            &self,
            token: &BearerToken,
            audience: &str,
        ) -> Result<ReviewStatus, LookupError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let body = token.expose().split('.').next().unwrap_or("");
            let mut extra = BTreeMap::new();
            extra.insert(EXTRA_NODE_NAME.to_string(), vec!["node-a".to_string()]);
            extra.insert(EXTRA_POD_NAME.to_string(), vec!["web-0".to_string()]);
            match body {
                "good" => Ok(ReviewStatus {
                    authenticated: true,
                    username: "system:serviceaccount:shop:web".into(),
                    audiences: vec![audience.into()],
                    extra,
                    error: None,
                }),
                "otheraud" => Ok(ReviewStatus {
                    authenticated: true,
                    username: "system:serviceaccount:shop:web".into(),
                    audiences: vec!["api".into()],
                    ..Default::default()
                }),
                "user" => Ok(ReviewStatus {
                    authenticated: true,
                    username: "alice".into(),
                    audiences: vec![audience.into()],
                    ..Default::default()
                }),
                "down" => Err(LookupError::Failed("connection refused".into())),
                _ => Ok(ReviewStatus {
                    error: Some("invalid bearer token".into()),
                    ..Default::default()
                }),
            }
        }
    }

    fn jwt(head: &str, exp: u64) -> BearerToken {
        let payload =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!(r#"{{"exp":{exp}}}"#));
        BearerToken::new(format!("{head}.{payload}.sig"))
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn creds(token: BearerToken) -> Credentials {
        Credentials {
            bearer: Some(token),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn token_review_identity_and_cache() {
        let reviewer = Arc::new(MockReviewer::default());
        let auth = TokenReviewAuthenticator::new(reviewer.clone(), "podca");
        let token = jwt("good", now() + 3600);
        let id = auth
            .authenticate(&Peer::Unknown, &creds(token.clone()))
            .await
            .unwrap();
        assert_eq!(id.namespace, "shop");
        assert_eq!(id.service_account, "web");
        assert_eq!(id.node_name.as_deref(), Some("node-a"));
        assert_eq!(id.pod_name.as_deref(), Some("web-0"));
        auth.authenticate(&Peer::Unknown, &creds(token))
            .await
            .unwrap();
        assert_eq!(
            reviewer.calls.load(Ordering::SeqCst),
            1,
            "second call is cached"
        );
    }

    #[tokio::test]
    async fn token_review_refusals() {
        let reviewer = Arc::new(MockReviewer::default());
        let auth = TokenReviewAuthenticator::new(reviewer.clone(), "podca");
        let missing = auth
            .authenticate(&Peer::Unknown, &Credentials::default())
            .await;
        assert_eq!(missing, Err(AuthError::Missing));
        for head in ["unknown", "otheraud", "user"] {
            let r = auth
                .authenticate(&Peer::Unknown, &creds(jwt(head, now() + 3600)))
                .await;
            assert!(matches!(r, Err(AuthError::Invalid(_))), "{head}: {r:?}");
        }
        let expired = auth
            .authenticate(&Peer::Unknown, &creds(jwt("good", now() - 10)))
            .await;
        assert!(matches!(expired, Err(AuthError::Invalid(ref m)) if m.contains("expired")));
        // Expiry follows the authenticator's clock: an hour ahead, a token with 30 min left has
        // expired, and the reviewer is not even asked.
        let calls = reviewer.calls.load(Ordering::SeqCst);
        let later =
            TokenReviewAuthenticator::new(reviewer.clone(), "podca").with_clock(Arc::new(|| {
                time::OffsetDateTime::now_utc() + time::Duration::hours(1)
            }));
        let r = later
            .authenticate(&Peer::Unknown, &creds(jwt("good", now() + 1800)))
            .await;
        assert_eq!(r, Err(AuthError::Invalid("the token has expired".into())));
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), calls);
        let down = auth
            .authenticate(&Peer::Unknown, &creds(jwt("down", now() + 60)))
            .await;
        assert_eq!(
            down.map_err(|e| e.to_string()),
            Err("cannot check credentials now: TokenReview failed: connection refused".into())
        );
        assert_eq!(
            AuthError::Unavailable(LookupError::Timeout(KUBE_API_TIMEOUT)).to_string(),
            "cannot check credentials now: TokenReview did not answer within 5s"
        );
        // Failed reviews are never cached.
        let calls = reviewer.calls.load(Ordering::SeqCst);
        let _ = auth
            .authenticate(&Peer::Unknown, &creds(jwt("unknown", now() + 3600)))
            .await;
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), calls + 1);
    }

    #[test]
    fn token_debug_is_redacted() {
        let t = BearerToken::new("secret-token-value");
        assert!(!format!("{t:?}").contains("secret-token-value"));
        let c = creds(t);
        assert!(!format!("{c:?}").contains("secret-token-value"));
    }

    #[tokio::test]
    async fn dev_identities() {
        let auth = DevAuthenticator::new(&[DevIdentity {
            uid: 1000,
            namespace: "default".into(),
            service_account: "default".into(),
        }]);
        let id = auth
            .authenticate(&Peer::Unix { uid: Some(1000) }, &Credentials::default())
            .await
            .unwrap();
        assert_eq!(id.key(), "default/default");
        let unknown = auth
            .authenticate(&Peer::Unix { uid: Some(4242) }, &Credentials::default())
            .await;
        assert!(matches!(unknown, Err(AuthError::UnknownCaller(_))));
        let named = Credentials {
            dev_namespace: Some("shop".into()),
            dev_service_account: Some("web".into()),
            ..Default::default()
        };
        let loopback: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let id = auth
            .authenticate(&Peer::Tcp(loopback), &named)
            .await
            .unwrap();
        assert_eq!(id.key(), "shop/web");
        let remote: SocketAddr = "10.0.0.5:5000".parse().unwrap();
        let r = auth.authenticate(&Peer::Tcp(remote), &named).await;
        assert!(matches!(r, Err(AuthError::NotLoopback(_))));
    }
}
