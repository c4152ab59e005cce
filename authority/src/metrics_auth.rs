//! Who may read `/metrics` on the admin listener (`[admin] metrics_auth`), with no Kubernetes
//! in it: the admin listener asks a [`MetricsAuth`] about the request's bearer token; podca
//! serve's is the controller's TokenReview + SubjectAccessReview authorizer, wrapped in a
//! [`CachedMetricsAuth`]. `/livez` and `/readyz` never ask: the kubelet sends no token.
//!
//! What the listener answers ([`Verdict`], mapped in `admin.rs` with an exhaustive `match`):
//!
//! | the request | status |
//! |---|---|
//! | no `Authorization: Bearer` header | 401, `WWW-Authenticate: Bearer` |
//! | a token the API server does not authenticate | 401 |
//! | an authenticated user that may not `get` the non-resource URL `/metrics` | 403 |
//! | the API server could not be asked (error, timeout, too many reviews at once) | 503 |
//! | allowed | 200, the metrics |
//!
//! The token is never logged, never a span field and never kept: the cache is keyed by its
//! SHA-256.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// A scraper's bearer token. Its `Debug` prints a placeholder.
#[derive(Clone, PartialEq, Eq)]
pub struct ScrapeToken(String);

impl ScrapeToken {
    /// The token of an `Authorization` header value: `Bearer <token>`, the scheme in any case.
    /// `None` for another scheme or an empty token.
    pub fn from_authorization(value: &str) -> Option<Self> {
        let (scheme, token) = value.trim().split_once(' ')?;
        let token = token.trim();
        (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty())
            .then(|| ScrapeToken(token.to_owned()))
    }

    /// The token itself, for the request to the API server only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn digest(&self) -> String {
        podca_signer::x509::sha256_hex(self.0.as_bytes())
    }
}

impl fmt::Debug for ScrapeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScrapeToken(<redacted>)")
    }
}

/// What the authorizer decided about one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// May `get` `/metrics`.
    Allowed,
    /// Not a token the API server authenticates (401).
    Unauthenticated,
    /// Authenticated, but the SubjectAccessReview says no (403).
    Forbidden,
    /// The API server could not be asked: fail closed (503), and ask again next time.
    Unavailable,
}

/// Decides whether a token may read `/metrics`.
pub trait MetricsAuth: Send + Sync + fmt::Debug {
    fn authorize<'a>(
        &'a self,
        token: &'a ScrapeToken,
    ) -> Pin<Box<dyn Future<Output = Verdict> + Send + 'a>>;
}

/// How long decisions are remembered, how many, and how many reviews run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    pub allowed_ttl: Duration,
    pub refused_ttl: Duration,
    /// Entries of each kind (allowed, refused): a flood of bad tokens fills only the refused
    /// side, never pushes out a scraper's allowed entry.
    pub max_entries: usize,
    /// Uncached decisions under way at once; one more waits up to `queue_wait`, then is
    /// [`Verdict::Unavailable`].
    pub max_concurrent: usize,
    pub queue_wait: Duration,
}

impl Default for CacheLimits {
    /// 60 s for an allowed token (a revoked grant keeps scraping at most that long), 10 s for a
    /// refused one, 1024 of each, 4 reviews at once, 2 s of waiting: Prometheus scrapes every
    /// 15–60 s with one token per replica.
    fn default() -> Self {
        CacheLimits {
            allowed_ttl: Duration::from_secs(60),
            refused_ttl: Duration::from_secs(10),
            max_entries: 1024,
            max_concurrent: 4,
            queue_wait: Duration::from_secs(2),
        }
    }
}

/// A [`MetricsAuth`] that remembers its inner authorizer's decisions (see [`CacheLimits`]).
/// [`Verdict::Unavailable`] is never remembered.
pub struct CachedMetricsAuth {
    inner: Arc<dyn MetricsAuth>,
    limits: CacheLimits,
    reviews: Semaphore,
    remembered: Mutex<Remembered>,
}

#[derive(Default)]
struct Remembered {
    allowed: HashMap<String, Instant>,
    refused: HashMap<String, (Verdict, Instant)>,
}

impl fmt::Debug for CachedMetricsAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedMetricsAuth")
            .field("inner", &self.inner)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl CachedMetricsAuth {
    pub fn new(inner: Arc<dyn MetricsAuth>, limits: CacheLimits) -> Self {
        CachedMetricsAuth {
            inner,
            reviews: Semaphore::new(limits.max_concurrent.max(1)),
            limits,
            remembered: Mutex::new(Remembered::default()),
        }
    }

    fn lookup(&self, digest: &str, now: Instant) -> Option<Verdict> {
        let remembered = self.lock();
        if remembered
            .allowed
            .get(digest)
            .is_some_and(|until| now < *until)
        {
            return Some(Verdict::Allowed);
        }
        match remembered.refused.get(digest) {
            Some((verdict, until)) if now < *until => Some(*verdict),
            _ => None,
        }
    }

    fn remember(&self, digest: String, verdict: Verdict, now: Instant) {
        let max = self.limits.max_entries;
        let mut remembered = self.lock();
        match verdict {
            Verdict::Allowed => {
                remembered.refused.remove(&digest);
                let map = &mut remembered.allowed;
                if map.len() >= max && !map.contains_key(&digest) {
                    map.retain(|_, until| now < *until);
                }
                if map.len() < max || map.contains_key(&digest) {
                    map.insert(digest, now + self.limits.allowed_ttl);
                }
            }
            Verdict::Unauthenticated | Verdict::Forbidden => {
                let map = &mut remembered.refused;
                if map.len() >= max && !map.contains_key(&digest) {
                    map.retain(|_, (_, until)| now < *until);
                }
                if map.len() < max || map.contains_key(&digest) {
                    map.insert(digest, (verdict, now + self.limits.refused_ttl));
                }
            }
            Verdict::Unavailable => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Remembered> {
        // Plain maps of deadlines: still usable after a panic elsewhere.
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl MetricsAuth for CachedMetricsAuth {
    fn authorize<'a>(
        &'a self,
        token: &'a ScrapeToken,
    ) -> Pin<Box<dyn Future<Output = Verdict> + Send + 'a>> {
        Box::pin(async move {
            let digest = token.digest();
            if let Some(verdict) = self.lookup(&digest, Instant::now()) {
                return verdict;
            }
            let Ok(Ok(_turn)) =
                tokio::time::timeout(self.limits.queue_wait, self.reviews.acquire()).await
            else {
                return Verdict::Unavailable;
            };
            // Decided while this one waited for its turn?
            if let Some(verdict) = self.lookup(&digest, Instant::now()) {
                return verdict;
            }
            let verdict = self.inner.authorize(token).await;
            self.remember(digest, verdict, Instant::now());
            verdict
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers by the token's text; counts the questions.
    #[derive(Debug, Default)]
    struct ByName {
        asked: AtomicUsize,
    }

    impl MetricsAuth for ByName {
        fn authorize<'a>(
            &'a self,
            token: &'a ScrapeToken,
        ) -> Pin<Box<dyn Future<Output = Verdict> + Send + 'a>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let verdict = match token.expose() {
                "granted" => Verdict::Allowed,
                "denied" => Verdict::Forbidden,
                "down" => Verdict::Unavailable,
                _ => Verdict::Unauthenticated,
            };
            Box::pin(async move { verdict })
        }
    }

    fn token(text: &str) -> ScrapeToken {
        ScrapeToken(text.to_owned())
    }

    #[test]
    fn only_a_bearer_token_is_a_token_and_it_never_prints() {
        let t = ScrapeToken::from_authorization("Bearer s3cr3t-t0ken").unwrap();
        assert_eq!(t.expose(), "s3cr3t-t0ken");
        assert_eq!(
            ScrapeToken::from_authorization("bearer  x ").map(|t| t.0),
            Some("x".into())
        );
        assert_eq!(ScrapeToken::from_authorization("Basic dXNlcjpw"), None);
        assert_eq!(ScrapeToken::from_authorization("Bearer "), None);
        assert_eq!(ScrapeToken::from_authorization("Bearer"), None);
        let shown = format!("{t:?} {:?}", Some(&t));
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[tokio::test(start_paused = true)]
    async fn decisions_are_remembered_for_their_time_and_outages_not_at_all() {
        let inner = Arc::new(ByName::default());
        let cached = CachedMetricsAuth::new(inner.clone(), CacheLimits::default());
        let asked = || inner.asked.load(Ordering::SeqCst);
        let cases = [
            ("granted", Verdict::Allowed),
            ("denied", Verdict::Forbidden),
            ("forged", Verdict::Unauthenticated),
        ];
        for (text, verdict) in cases {
            assert_eq!(cached.authorize(&token(text)).await, verdict, "{text}");
        }
        assert_eq!(asked(), 3);
        for (text, verdict) in cases {
            assert_eq!(cached.authorize(&token(text)).await, verdict, "{text}");
        }
        assert_eq!(asked(), 3, "each answered from the cache");
        tokio::time::advance(Duration::from_secs(11)).await;
        cached.authorize(&token("granted")).await;
        assert_eq!(asked(), 3, "an allowed token is remembered for 60 s");
        cached.authorize(&token("denied")).await;
        cached.authorize(&token("forged")).await;
        assert_eq!(asked(), 5, "refusals are remembered for 10 s only");
        tokio::time::advance(Duration::from_secs(50)).await;
        cached.authorize(&token("granted")).await;
        assert_eq!(asked(), 6, "and allowed ones for no more than 60 s");
        for _ in 0..2 {
            assert_eq!(cached.authorize(&token("down")).await, Verdict::Unavailable);
        }
        assert_eq!(asked(), 8, "an outage is asked about again each time");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_bad_tokens_never_evicts_an_allowed_one_and_stays_bounded() {
        let inner = Arc::new(ByName::default());
        let limits = CacheLimits {
            max_entries: 8,
            ..CacheLimits::default()
        };
        let cached = CachedMetricsAuth::new(inner.clone(), limits);
        cached.authorize(&token("granted")).await;
        for n in 0..100 {
            cached.authorize(&token(&format!("random-{n}"))).await;
        }
        {
            let remembered = cached.lock();
            assert_eq!(remembered.refused.len(), 8, "the refused side is bounded");
            assert_eq!(remembered.allowed.len(), 1);
        }
        let before = inner.asked.load(Ordering::SeqCst);
        assert_eq!(cached.authorize(&token("granted")).await, Verdict::Allowed);
        assert_eq!(inner.asked.load(Ordering::SeqCst), before, "still cached");
    }

    /// Never answers: every question is a review that hangs.
    #[derive(Debug)]
    struct Hangs;

    impl MetricsAuth for Hangs {
        fn authorize<'a>(
            &'a self,
            _: &'a ScrapeToken,
        ) -> Pin<Box<dyn Future<Output = Verdict> + Send + 'a>> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn beyond_the_concurrent_reviews_a_caller_waits_briefly_then_is_unavailable() {
        let cached = Arc::new(CachedMetricsAuth::new(
            Arc::new(Hangs),
            CacheLimits::default(),
        ));
        for n in 0..4 {
            let cached = Arc::clone(&cached);
            tokio::spawn(async move { cached.authorize(&token(&format!("hang-{n}"))).await });
        }
        tokio::task::yield_now().await;
        let started = Instant::now();
        assert_eq!(
            cached.authorize(&token("fifth")).await,
            Verdict::Unavailable
        );
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }
}
