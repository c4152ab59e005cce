//! Who is calling: an [`Authenticator`] turns a peer and its credentials into an [`Identity`].
//! The services do not know which one is in use: [`DevAuthenticator`] for `podca dev`,
//! [`TokenReviewAuthenticator`] in a cluster.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock (std's outside tests): the cache lifetimes are testable on paused time.
use tokio::time::Instant;

use base64::Engine;

use podca_authority::Clock;
use podca_authority::config::DevIdentity;
use podca_authority::metrics::{GrpcMetrics, ResultLabels};
use podca_signer::names::ObjectName;
use podca_signer::{PodMetadata, PodRead, SignerPolicy};

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
    /// How the caller proved it (the ledger records it; certificates carry its chain).
    pub authentication: Authentication,
}

/// How a caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AuthMethod {
    /// A service-account token (TokenReview).
    #[default]
    Token,
    /// A podca client certificate alone (mTLS renewal).
    Certificate,
    /// A token and a client certificate naming the same identity.
    TokenAndCertificate,
    /// `podca dev`'s mapping of uids (or loopback metadata) to identities.
    Dev,
}

impl AuthMethod {
    /// The ledger's name of the method.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::Token => "token",
            AuthMethod::Certificate => "certificate",
            AuthMethod::TokenAndCertificate => "token+certificate",
            AuthMethod::Dev => "dev",
        }
    }
}

/// The facts of an authentication that outlive it: what the ledger records and where the
/// renewal chain of a certificate issued to the caller begins ([`crate::renewal`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Authentication {
    pub method: AuthMethod,
    /// The serial (lowercase hex) of the client certificate presented, if any.
    pub presented_serial: Option<String>,
    /// The service account's UID (the TokenReview's `user.uid`, or the certificate's chain).
    pub service_account_uid: Option<String>,
    /// Certificate-only callers: the presented certificate's renewal chain, with its cap.
    pub renewal: Option<podca_signer::renewal::RenewalChain>,
}

impl Authentication {
    /// What a subject a caller vouches for (IssueForPod, the Istio API's impersonation) is
    /// authenticated by: the caller's method and chain, not its service account's UID.
    pub fn on_behalf(&self) -> Authentication {
        Authentication {
            method: self.method,
            presented_serial: self.presented_serial.clone(),
            service_account_uid: None,
            renewal: self
                .renewal
                .clone()
                .map(|chain| podca_signer::renewal::RenewalChain {
                    service_account_uid: None,
                    ..chain
                }),
        }
    }

    /// The renewal chain a certificate issued at `now` to this caller belongs to: the
    /// presented certificate's (a renewal), else one that starts now.
    pub fn chain_at(&self, now: time::OffsetDateTime) -> podca_signer::renewal::RenewalChain {
        self.renewal.clone().unwrap_or_else(|| {
            podca_signer::renewal::RenewalChain::starting(now, self.service_account_uid.clone())
        })
    }
}

impl Identity {
    pub fn service_account(namespace: &str, service_account: &str) -> Self {
        Identity {
            namespace: namespace.into(),
            service_account: service_account.into(),
            pod_name: None,
            pod_uid: None,
            node_name: None,
            authentication: Authentication::default(),
        }
    }

    /// A `podca dev` caller: mapped, not proven.
    pub fn dev(namespace: &str, service_account: &str) -> Self {
        let mut identity = Self::service_account(namespace, service_account);
        identity.authentication.method = AuthMethod::Dev;
        identity
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
    /// Every TokenReview slot stayed busy for the whole queue wait.
    #[error("too many credential checks in flight (at most {0} TokenReviews at once); retry later")]
    Busy(usize),
    /// This source address already has its share of uncached TokenReviews under way: refused
    /// at once, so that one peer cannot hold every slot (issue #40).
    #[error(
        "too many credential checks in flight from this address (at most {0} uncached \
         TokenReviews at once per source); retry later"
    )]
    SourceBusy(usize),
    /// A client certificate that may not renew (chain too old, account gone or re-created,
    /// denylisted: [`crate::renewal`]); a token still works.
    #[error("{0}")]
    RenewalRefused(crate::renewal::RenewalRefusal),
    /// The service account of a renewing certificate could not be read.
    #[error("cannot check the client certificate's service account now: {0}")]
    AccountUnavailable(LookupError),
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
            .map(|i| (i.uid, Identity::dev(&i.namespace, &i.service_account)))
            .collect();
        let default = identities
            .first()
            .map(|i| Identity::dev(&i.namespace, &i.service_account));
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
                        for (header, value) in
                            [("x-podca-namespace", ns), ("x-podca-service-account", sa)]
                        {
                            if let Err(e) = value.parse::<ObjectName>() {
                                return Err(AuthError::Invalid(format!(
                                    "{header} {value:?} is not a Kubernetes name: it {e}"
                                )));
                            }
                        }
                        Ok(Identity::dev(ns, sa))
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

/// What a TokenReview said (`status` of authentication.k8s.io/v1 TokenReview).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReviewStatus {
    pub authenticated: bool,
    pub username: String,
    pub audiences: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    /// Why the token was not authenticated (from the API server; contains no token).
    pub error: Option<String>,
    /// The user's UID: for a service account, the ServiceAccount object's UID.
    pub uid: Option<String>,
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
/// Entries each cache holds at most (SHA-256 keys, so ~100 bytes an entry).
const MAX_CACHE_ENTRIES: usize = 100_000;
const MAX_NEGATIVE_ENTRIES: usize = 10_000;
/// Reviews in flight (or abandoned by callers that went away) tracked for coalescing.
const MAX_IN_FLIGHT_ENTRIES: usize = 10_000;

/// How much of the Kubernetes API a flood of bearer tokens can use, and how long answers are
/// trusted. Every field is documented in `docs/grpc-api.md` ("Authorization").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenReviewLimits {
    /// TokenReviews in flight at once, across all callers (`[grpc] max_token_reviews`).
    pub max_concurrent: usize,
    /// How long a caller waits for a free TokenReview slot before it is refused with
    /// `RESOURCE_EXHAUSTED`.
    pub queue_wait: Duration,
    /// The longest a successful review is trusted (`[grpc] token_cache_seconds`): the longest
    /// a revoked token, or one whose pod has gone, keeps working. Never past the token's `exp`.
    pub cache_ttl: Duration,
    /// How long a refused token is refused without asking again.
    pub negative_ttl: Duration,
}

impl TokenReviewLimits {
    pub const DEFAULT_MAX_CONCURRENT: usize = 8;
    pub const DEFAULT_QUEUE_WAIT: Duration = Duration::from_secs(1);
    pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(60);
    pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);
}

impl Default for TokenReviewLimits {
    fn default() -> Self {
        TokenReviewLimits {
            max_concurrent: Self::DEFAULT_MAX_CONCURRENT,
            queue_wait: Self::DEFAULT_QUEUE_WAIT,
            cache_ttl: Self::DEFAULT_CACHE_TTL,
            negative_ttl: Self::NEGATIVE_TTL,
        }
    }
}

/// One uncached review of a source address under way; gives the address its turn back when
/// dropped.
struct SourceTurn {
    counts: Arc<Mutex<HashMap<std::net::IpAddr, usize>>>,
    ip: std::net::IpAddr,
}

impl Drop for SourceTurn {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// SHA-256 of a token: the only form in which a token is remembered.
type TokenKey = [u8; 32];

/// One review's outcome, shared by every request that carried the same token meanwhile.
type SharedReview = Arc<tokio::sync::OnceCell<Result<Identity, AuthError>>>;

#[derive(Debug, Default)]
struct Caches {
    /// Token hash → why it was refused, and until when that holds.
    negative: HashMap<TokenKey, (String, Instant)>,
    /// Reviews under way: requests with the same token wait for the same answer.
    in_flight: HashMap<TokenKey, SharedReview>,
}

/// In-cluster: bearer service-account tokens checked with TokenReview.
///
/// Bounded on every side ([`TokenReviewLimits`]): at most `max_concurrent` reviews at once;
/// requests carrying the same token share one review; a refused token is refused from memory
/// for `negative_ttl`; a success is cached until the token's `exp`, at most `cache_ttl`.
/// Tokens are remembered only as SHA-256 hashes.
pub struct TokenReviewAuthenticator {
    reviewer: Arc<dyn TokenReviewer>,
    audience: String,
    limits: TokenReviewLimits,
    slots: Arc<tokio::sync::Semaphore>,
    /// Token hash → identity, and until when it holds: a lock of its own, so that a flood of
    /// new tokens (negative cache, reviews under way) never delays an authenticated caller.
    positive: std::sync::RwLock<HashMap<TokenKey, (Identity, Instant)>>,
    caches: Mutex<Caches>,
    /// Uncached reviews each source address has under way (waiting for a slot, or asking).
    per_source: Arc<Mutex<HashMap<std::net::IpAddr, usize>>>,
    metrics: GrpcMetrics,
    /// The time a token's `exp` is compared with.
    clock: Clock,
}

impl fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenReviewAuthenticator")
            .field("reviewer", &self.reviewer)
            .field("audience", &self.audience)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn token_key(token: &BearerToken) -> TokenKey {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.expose().as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

impl TokenReviewAuthenticator {
    pub fn new(reviewer: Arc<dyn TokenReviewer>, audience: impl Into<String>) -> Self {
        Self::with_limits(reviewer, audience, TokenReviewLimits::default())
    }

    pub fn with_limits(
        reviewer: Arc<dyn TokenReviewer>,
        audience: impl Into<String>,
        limits: TokenReviewLimits,
    ) -> Self {
        TokenReviewAuthenticator {
            reviewer,
            audience: audience.into(),
            slots: Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent.max(1))),
            limits,
            positive: std::sync::RwLock::default(),
            caches: Mutex::new(Caches::default()),
            per_source: Arc::default(),
            metrics: GrpcMetrics::default(),
            clock: podca_authority::system_clock(),
        }
    }

    /// Takes its TokenReview slots from `other`'s (same `max_concurrent` bound, shared), so
    /// that two authenticators for different audiences (podca.v1 and the Istio CA API) keep
    /// `max_token_reviews` a bound across all callers. Caches stay separate: a verdict is for
    /// one audience.
    pub fn sharing_slots_with(mut self, other: &TokenReviewAuthenticator) -> Self {
        self.slots = Arc::clone(&other.slots);
        self.per_source = Arc::clone(&other.per_source);
        self.limits.max_concurrent = other.limits.max_concurrent;
        self
    }

    /// Compares tokens' `exp` with `clock` instead of the system clock (the process clock,
    /// like every other time-dependent part).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Counts reviews, their latency and cache use in `metrics`.
    pub fn with_metrics(mut self, metrics: GrpcMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    fn caches(&self) -> std::sync::MutexGuard<'_, Caches> {
        // A poisoned lock only means a request panicked mid-update; the maps are still maps.
        self.caches.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count_cache(&self, result: &'static str) {
        self.metrics
            .token_cache
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// The share of the TokenReview slots one source address may hold or wait for.
    pub fn per_source_cap(&self) -> usize {
        (self.limits.max_concurrent / 4).max(1)
    }

    /// A turn for one uncached review from `peer`'s address, or `SourceBusy` at once when the
    /// address has its share under way. Peers without an address (tests) are not capped.
    fn source_turn(&self, peer: &Peer) -> Result<Option<SourceTurn>, AuthError> {
        let Peer::Tcp(addr) = peer else {
            return Ok(None);
        };
        let ip = addr.ip();
        let cap = self.per_source_cap();
        let mut counts = self.per_source.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(ip).or_default();
        if *count >= cap {
            return Err(AuthError::SourceBusy(cap));
        }
        *count += 1;
        Ok(Some(SourceTurn {
            counts: Arc::clone(&self.per_source),
            ip,
        }))
    }

    /// What the caches already say of a token.
    fn remembered(&self, key: &TokenKey, now: Instant) -> Option<Result<Identity, AuthError>> {
        let positive = self.positive.read().unwrap_or_else(|p| p.into_inner());
        if let Some((identity, until)) = positive.get(key)
            && *until > now
        {
            return Some(Ok(identity.clone()));
        }
        drop(positive);
        let caches = self.caches();
        if let Some((why, until)) = caches.negative.get(key)
            && *until > now
        {
            return Some(Err(AuthError::Invalid(why.clone())));
        }
        None
    }

    /// The review every request with this token waits for.
    fn shared_review(&self, key: TokenKey) -> SharedReview {
        let mut caches = self.caches();
        if caches.in_flight.len() >= MAX_IN_FLIGHT_ENTRIES && !caches.in_flight.contains_key(&key) {
            // Entries whose every waiter went away before an answer.
            caches.in_flight.retain(|_, c| Arc::strong_count(c) > 1);
        }
        Arc::clone(caches.in_flight.entry(key).or_default())
    }

    /// Asks the Kubernetes API once (within a slot) and remembers the verdict.
    async fn review(
        &self,
        token: &BearerToken,
        key: TokenKey,
        lifetime: Duration,
    ) -> Result<Identity, AuthError> {
        let slot = tokio::time::timeout(
            self.limits.queue_wait,
            Arc::clone(&self.slots).acquire_owned(),
        )
        .await;
        let _slot = match slot {
            Ok(Ok(slot)) => slot,
            // Timed out waiting (or, never, the semaphore closed).
            _ => return Err(AuthError::Busy(self.limits.max_concurrent)),
        };
        let started = Instant::now();
        let answer = tracing::Instrument::instrument(
            self.reviewer.review(token, &self.audience),
            tracing::info_span!("token_review"),
        )
        .await;
        self.metrics
            .token_review_seconds
            .observe(started.elapsed().as_secs_f64());
        let (result, verdict) = match answer {
            Err(e) => ("error", Err(AuthError::Unavailable(e))),
            Ok(status) => match identity_from_review(&status, &self.audience) {
                Ok(identity) => ("authenticated", Ok(identity)),
                Err(e) => ("refused", Err(e)),
            },
        };
        self.metrics
            .token_reviews
            .get_or_create(&ResultLabels { result })
            .inc();
        let now = Instant::now();
        if let Ok(identity) = &verdict {
            let ttl = lifetime.min(self.limits.cache_ttl);
            if !ttl.is_zero() {
                let mut positive = self.positive.write().unwrap_or_else(|p| p.into_inner());
                if positive.len() >= MAX_CACHE_ENTRIES {
                    positive.retain(|_, (_, until)| *until > now);
                }
                if positive.len() < MAX_CACHE_ENTRIES {
                    positive.insert(key, (identity.clone(), now + ttl));
                }
            }
            return verdict;
        }
        let mut caches = self.caches();
        match &verdict {
            Err(AuthError::Invalid(why)) if !self.limits.negative_ttl.is_zero() => {
                if caches.negative.len() >= MAX_NEGATIVE_ENTRIES {
                    caches.negative.retain(|_, (_, until)| *until > now);
                }
                if caches.negative.len() < MAX_NEGATIVE_ENTRIES {
                    caches
                        .negative
                        .insert(key, (why.clone(), now + self.limits.negative_ttl));
                }
            }
            // Outages are never remembered: the next request asks again.
            _ => {}
        }
        verdict
    }
}

#[tonic::async_trait]
impl Authenticator for TokenReviewAuthenticator {
    async fn authenticate(
        &self,
        peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, AuthError> {
        let token = credentials.bearer.as_ref().ok_or(AuthError::Missing)?;
        let key = token_key(token);
        if let Some(known) = self.remembered(&key, Instant::now()) {
            self.count_cache(if known.is_ok() { "hit" } else { "negative_hit" });
            return known;
        }

        // Expired tokens are refused here too, so a cached review never outlives the token.
        let lifetime = match token_expiry(token) {
            Some(exp) => {
                let unix_now = u64::try_from((self.clock)().unix_timestamp()).unwrap_or(0);
                if exp <= unix_now {
                    return Err(AuthError::Invalid("the token has expired".into()));
                }
                Duration::from_secs(exp - unix_now)
            }
            None => self.limits.cache_ttl,
        };
        // One address may start only its share of the reviews: beyond it, refused at once. A
        // request whose token is already being reviewed joins that review instead.
        let joining = self.caches().in_flight.contains_key(&key);
        let turn = match joining {
            true => Ok(None),
            false => self.source_turn(peer),
        };
        // A review that ended since the first look has put its verdict in the caches before
        // leaving `in_flight`: read it rather than refusing (its turn may still be held) or
        // asking again.
        if !joining && let Some(known) = self.remembered(&key, Instant::now()) {
            self.count_cache(if known.is_ok() { "hit" } else { "negative_hit" });
            return known;
        }
        let _turn = turn?;
        self.count_cache("miss");
        let shared = self.shared_review(key);
        let verdict = shared
            .get_or_init(|| self.review(token, key, lifetime))
            .await
            .clone();
        // The verdict is in the caches (or deliberately not): the next request reads them.
        let mut caches = self.caches();
        if caches
            .in_flight
            .get(&key)
            .is_some_and(|c| Arc::ptr_eq(c, &shared))
        {
            caches.in_flight.remove(&key);
        }
        verdict
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
        authentication: Authentication {
            method: AuthMethod::Token,
            service_account_uid: status.uid.clone(),
            ..Authentication::default()
        },
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub service_account: String,
    pub node_name: Option<String>,
    pub uid: Option<String>,
    /// `metadata.deletionTimestamp` is set: the pod is being deleted.
    pub terminating: bool,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    pub phase: Option<String>,
    /// A static pod's mirror (annotation `kubernetes.io/config.mirror`, or no
    /// `serviceAccountName`): the node's files made it, not the API server, so no service
    /// account vouches for it.
    pub mirror: bool,
    /// `metadata.labels` and `metadata.annotations`: what policy rules see as `pod.labels` and
    /// `pod.annotations` (`pod_facts`).
    pub metadata: PodMetadata,
}

impl PodInfo {
    /// Whether the pod has finished for good (`Succeeded` or `Failed`).
    pub fn finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// A pod found by [`PodDirectory::pods_on_node`]: its name and what IssueForPod knows of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedPod {
    pub name: String,
    pub info: PodInfo,
}

/// Why the pod behind a request could not give the rules its facts ([`read_pod_facts`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodFactsError {
    /// No pod of that name, or one with another UID: the identity's pod is gone. Deny
    /// (`PolicyPodNotFound`).
    #[error("{0}")]
    Gone(String),
    /// The API did not answer: decide nothing now (retry).
    #[error("cannot read pod {pod} for the policy rules: {error}")]
    Unavailable { pod: String, error: LookupError },
}

/// Reads the pod `namespace/name` for `signer`'s rules (one GET) and checks that it is the pod
/// `uid` names: a pod replaced under the same name never lends its labels to the old one's
/// request. Each read is counted (`podca_policy_pod_reads_total`).
pub async fn read_pod_facts(
    pods: &dyn PodDirectory,
    (signer, policy): (&str, &SignerPolicy),
    namespace: &str,
    (name, uid): (&str, &str),
    service_account: &str,
) -> Result<PodMetadata, PodFactsError> {
    let (result, answer) = match pods.pod(namespace, name).await {
        Err(error) => (
            PodRead::Error,
            Err(PodFactsError::Unavailable {
                pod: format!("{namespace}/{name}"),
                error,
            }),
        ),
        Ok(None) => (
            PodRead::NotFound,
            Err(PodFactsError::Gone(format!(
                "pod {namespace}/{name} does not exist: the policy rules of signer {signer} read \
                 the pod's labels and annotations (pod_facts)"
            ))),
        ),
        Ok(Some(pod)) if pod.uid.as_deref() != Some(uid) => (
            PodRead::UidMismatch,
            Err(PodFactsError::Gone(format!(
                "pod {namespace}/{name} is not the pod of this request (UID {}, the request \
                 names {uid}): the policy rules of signer {signer} read the pod (pod_facts)",
                pod.uid.as_deref().unwrap_or("none")
            ))),
        ),
        // A PodCertificateRequest from a creator that is not a node is not cross-checked by the
        // API server (spec §2.1.9): its serviceAccountName must be the pod's too (issue #40).
        Ok(Some(pod)) if pod.service_account != service_account => (
            PodRead::UidMismatch,
            Err(PodFactsError::Gone(format!(
                "pod {namespace}/{name} runs as service account {:?}, but the request names \
                 {service_account:?}: it speaks for no pod of that identity",
                pod.service_account
            ))),
        ),
        Ok(Some(pod)) => (PodRead::Found, Ok(pod.metadata)),
    };
    policy.count_pod_read(result);
    answer
}

/// Looks pods up (IssueForPod, and the Istio CA API's `ImpersonatedIdentity`).
#[tonic::async_trait]
pub trait PodDirectory: Send + Sync + fmt::Debug {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodInfo>, LookupError>;

    /// The pods in `namespace` scheduled on `node` whose `spec.serviceAccountName` is
    /// `service_account` (any phase; the caller filters). Bounded by [`KUBE_API_TIMEOUT`].
    async fn pods_on_node(
        &self,
        namespace: &str,
        node: &str,
        service_account: &str,
    ) -> Result<Vec<NamedPod>, LookupError>;

    /// The UID of the service account `namespace/name`; `None` when it does not exist
    /// (mTLS renewal, [`crate::renewal`]). Bounded by [`KUBE_API_TIMEOUT`].
    async fn service_account_uid(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, LookupError>;
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
                    uid: Some("uid-of-shop-web".into()),
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
    async fn two_audiences_share_one_pool_of_review_slots() {
        let reviewer = Arc::new(MockReviewer::default());
        let limits = TokenReviewLimits {
            max_concurrent: 1,
            queue_wait: Duration::from_millis(50),
            ..TokenReviewLimits::default()
        };
        let podca = TokenReviewAuthenticator::with_limits(reviewer.clone(), "podca", limits);
        let istio = TokenReviewAuthenticator::with_limits(reviewer.clone(), "istio-ca", limits)
            .sharing_slots_with(&podca);
        assert!(Arc::ptr_eq(&podca.slots, &istio.slots));
        // The one slot held for podca.v1: the Istio audience finds none and is refused as busy.
        let _held = Arc::clone(&podca.slots).acquire_owned().await.unwrap();
        let busy = istio
            .authenticate(&Peer::Unknown, &creds(jwt("good", now() + 3600)))
            .await;
        assert_eq!(busy, Err(AuthError::Busy(1)));
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 0);
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
        // A refused token is remembered (negative cache): asked once, refused again from
        // memory with the same message. An outage is never remembered.
        let calls = reviewer.calls.load(Ordering::SeqCst);
        let unknown = creds(jwt("stranger", now() + 3600));
        let first = auth.authenticate(&Peer::Unknown, &unknown).await;
        let again = auth.authenticate(&Peer::Unknown, &unknown).await;
        assert_eq!(first, again);
        assert_eq!(
            first,
            Err(AuthError::Invalid("invalid bearer token".into()))
        );
        let _ = auth
            .authenticate(&Peer::Unknown, &creds(jwt("down", now() + 60)))
            .await;
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), calls + 2);
    }

    /// A reviewer that takes `delay` per review, counting reviews and the most in flight.
    #[derive(Debug)]
    struct SlowReviewer {
        delay: Duration,
        calls: AtomicUsize,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
    }

    impl SlowReviewer {
        fn new(delay: Duration) -> Arc<Self> {
            Arc::new(SlowReviewer {
                delay,
                calls: AtomicUsize::new(0),
                in_flight: AtomicUsize::new(0),
                max_in_flight: AtomicUsize::new(0),
            })
        }
    }

    #[tonic::async_trait]
    impl TokenReviewer for SlowReviewer {
        async fn review(
            &self,
            token: &BearerToken,
            audience: &str,
        ) -> Result<ReviewStatus, LookupError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(if token.expose().starts_with("good") {
                ReviewStatus {
                    authenticated: true,
                    username: "system:serviceaccount:shop:web".into(),
                    audiences: vec![audience.into()],
                    ..Default::default()
                }
            } else {
                ReviewStatus {
                    error: Some("invalid bearer token".into()),
                    ..Default::default()
                }
            })
        }
    }

    fn limits(max_concurrent: usize, queue_wait: Duration) -> TokenReviewLimits {
        TokenReviewLimits {
            max_concurrent,
            queue_wait,
            ..TokenReviewLimits::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_one_bad_token_makes_one_review() {
        let reviewer = SlowReviewer::new(Duration::from_millis(200));
        let auth = Arc::new(TokenReviewAuthenticator::with_limits(
            reviewer.clone(),
            "podca",
            limits(4, Duration::from_secs(5)),
        ));
        let flood = (0..200).map(|_| {
            let auth = Arc::clone(&auth);
            tokio::spawn(async move {
                auth.authenticate(&Peer::Unknown, &creds(BearerToken::new("bad-token")))
                    .await
            })
        });
        for call in flood.collect::<Vec<_>>() {
            assert_eq!(
                call.await.unwrap(),
                Err(AuthError::Invalid("invalid bearer token".into()))
            );
        }
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_distinct_bad_tokens_stays_within_the_cap() {
        let reviewer = SlowReviewer::new(Duration::from_millis(100));
        let auth = Arc::new(TokenReviewAuthenticator::with_limits(
            reviewer.clone(),
            "podca",
            limits(3, Duration::from_millis(250)),
        ));
        let flood = (0..100).map(|i| {
            let auth = Arc::clone(&auth);
            tokio::spawn(async move {
                auth.authenticate(&Peer::Unknown, &creds(BearerToken::new(format!("bad-{i}"))))
                    .await
            })
        });
        let mut busy = 0;
        for call in flood.collect::<Vec<_>>() {
            match call.await.unwrap() {
                Err(AuthError::Invalid(_)) => {}
                Err(AuthError::Busy(3)) => busy += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(reviewer.max_in_flight.load(Ordering::SeqCst), 3);
        // 100 ms a review, 3 at a time, 250 ms of queueing: about 9 reviews, never 100.
        let calls = reviewer.calls.load(Ordering::SeqCst);
        assert!(calls <= 12, "{calls} reviews");
        assert_eq!(busy, 100 - calls);
        assert_eq!(
            AuthError::Busy(3).to_string(),
            "too many credential checks in flight (at most 3 TokenReviews at once); retry later"
        );
    }

    /// Issue #40: one pod floods podca with random tokens over many connections while another
    /// pod authenticates. The flooder gets its share of the TokenReview slots and is refused at
    /// once beyond it (`SourceBusy`); the other caller's review gets a slot at once and answers
    /// within its normal latency.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_from_one_address_leaves_the_others_their_reviews() {
        let review = Duration::from_millis(100);
        let reviewer = SlowReviewer::new(review);
        let auth = Arc::new(TokenReviewAuthenticator::with_limits(
            reviewer.clone(),
            "podca",
            limits(8, Duration::from_secs(1)),
        ));
        assert_eq!(auth.per_source_cap(), 2);
        let attacker = Peer::Tcp("10.0.0.66:40000".parse().unwrap());
        let flood: Vec<_> = (0..2000)
            .map(|i| {
                let (auth, attacker) = (Arc::clone(&auth), attacker);
                tokio::spawn(async move {
                    auth.authenticate(&attacker, &creds(BearerToken::new(format!("rnd-{i}"))))
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let legit = auth
            .authenticate(
                &Peer::Tcp("10.0.0.7:50000".parse().unwrap()),
                &creds(jwt("good", now() + 3600)),
            )
            .await;
        let took = started.elapsed();
        assert_eq!(legit.map(|i| i.key()), Ok("shop/web".to_owned()));
        assert!(took < review * 3, "the other caller waited {took:?}");
        let mut source_busy = 0;
        for call in flood {
            match call.await.unwrap() {
                Err(AuthError::SourceBusy(2)) => source_busy += 1,
                Err(AuthError::Invalid(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        // The flooder never held more than its share: 2 reviews at once, plus the other caller.
        assert!(reviewer.max_in_flight.load(Ordering::SeqCst) <= 3);
        assert!(source_busy >= 1900, "{source_busy} refused at once");
        assert_eq!(
            AuthError::SourceBusy(2).to_string(),
            "too many credential checks in flight from this address (at most 2 uncached \
             TokenReviews at once per source); retry later"
        );
    }

    /// Paused time: the cache entries age by exactly what the test advances.
    #[tokio::test(start_paused = true)]
    async fn cache_lifetimes_are_bounded() {
        let reviewer = SlowReviewer::new(Duration::ZERO);
        let auth = TokenReviewAuthenticator::with_limits(
            reviewer.clone(),
            "podca",
            TokenReviewLimits {
                cache_ttl: Duration::from_millis(100),
                negative_ttl: Duration::from_millis(100),
                ..TokenReviewLimits::default()
            },
        );
        // A token valid for an hour is trusted for cache_ttl only, then asked about again.
        let good = creds(jwt("good", now() + 3600));
        let bad = creds(BearerToken::new("bad"));
        for _ in 0..3 {
            auth.authenticate(&Peer::Unknown, &good).await.unwrap();
            let _ = auth.authenticate(&Peer::Unknown, &bad).await;
        }
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 2);
        tokio::time::advance(Duration::from_millis(99)).await;
        auth.authenticate(&Peer::Unknown, &good).await.unwrap();
        let _ = auth.authenticate(&Peer::Unknown, &bad).await;
        assert_eq!(
            reviewer.calls.load(Ordering::SeqCst),
            2,
            "still cached at 99 ms"
        );
        tokio::time::advance(Duration::from_millis(51)).await;
        auth.authenticate(&Peer::Unknown, &good).await.unwrap();
        let _ = auth.authenticate(&Peer::Unknown, &bad).await;
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 4);
        // token_cache_seconds = 0: every request asks.
        let uncached = TokenReviewAuthenticator::with_limits(
            reviewer.clone(),
            "podca",
            TokenReviewLimits {
                cache_ttl: Duration::ZERO,
                ..TokenReviewLimits::default()
            },
        );
        uncached.authenticate(&Peer::Unknown, &good).await.unwrap();
        uncached.authenticate(&Peer::Unknown, &good).await.unwrap();
        assert_eq!(reviewer.calls.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn reviews_are_counted() {
        let metrics = GrpcMetrics::default();
        let auth = TokenReviewAuthenticator::new(SlowReviewer::new(Duration::ZERO), "podca")
            .with_metrics(metrics.clone());
        let good = creds(jwt("good", now() + 3600));
        auth.authenticate(&Peer::Unknown, &good).await.unwrap();
        auth.authenticate(&Peer::Unknown, &good).await.unwrap();
        let bad = creds(BearerToken::new("bad"));
        let _ = auth.authenticate(&Peer::Unknown, &bad).await;
        let _ = auth.authenticate(&Peer::Unknown, &bad).await;
        let cache = |result| {
            metrics
                .token_cache
                .get_or_create(&ResultLabels { result })
                .get()
        };
        let reviews = |result| {
            metrics
                .token_reviews
                .get_or_create(&ResultLabels { result })
                .get()
        };
        assert_eq!(
            (cache("miss"), cache("hit"), cache("negative_hit")),
            (2, 1, 1)
        );
        assert_eq!((reviews("authenticated"), reviews("refused")), (1, 1));
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
        // The headers are parsed as names (signer::names): "a..b" has an empty label, which
        // the old copy of the rule here let through.
        for (namespace, refusal) in [
            (
                "a..b",
                "x-podca-namespace \"a..b\" is not a Kubernetes name: it must not contain an \
                 empty label (no leading, trailing or doubled '.')",
            ),
            (
                "Shop",
                "x-podca-namespace \"Shop\" is not a Kubernetes name: it must not contain 'S'",
            ),
        ] {
            let odd = Credentials {
                dev_namespace: Some(namespace.into()),
                ..named.clone()
            };
            match auth.authenticate(&Peer::Tcp(loopback), &odd).await {
                Err(AuthError::Invalid(message)) => assert_eq!(message, refusal),
                other => panic!("{namespace}: {other:?}"),
            }
        }
    }
}
