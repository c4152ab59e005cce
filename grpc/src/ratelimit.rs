//! Fair sharing at the gRPC edge:
//!
//! * [`RateLimiter`]: a token bucket per identity, `rate` requests per second, bursts of up to
//!   `rate` (`[grpc] rate_limit_per_identity`, default 100).
//! * [`SigningShare`]: how many gRPC issuances may verify and sign at once. PodCertificateRequest
//!   signing (the controller, on tokio's blocking pool) never takes from it, so however many
//!   gRPC callers there are, they hold at most this many cores and the rest stays for PCRs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{Semaphore, SemaphorePermit};

#[derive(Debug)]
pub struct RateLimiter {
    /// Requests per second; 0 = unlimited.
    rate: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Buckets kept before idle ones are dropped.
const MAX_BUCKETS: usize = 100_000;

impl RateLimiter {
    pub fn new(rate: u32) -> Self {
        RateLimiter {
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Takes one token for `key`; false when the bucket is empty.
    pub fn try_acquire(&self, key: &str) -> bool {
        self.try_acquire_at(key, Instant::now())
    }

    fn try_acquire_at(&self, key: &str, now: Instant) -> bool {
        if self.rate == 0 {
            return true;
        }
        let capacity = f64::from(self.rate);
        // A poisoned lock only means another request panicked mid-update; the map is still
        // a valid map of buckets.
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            buckets
                .retain(|_, b| now.duration_since(b.updated).as_secs_f64() * capacity < capacity);
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: capacity,
            updated: now,
        });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * capacity).min(capacity);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The concurrent gRPC signings allowed (see the module docs).
#[derive(Debug, Clone)]
pub struct SigningShare {
    permits: Arc<Semaphore>,
    size: usize,
}

impl SigningShare {
    /// At most `concurrent` (at least 1) gRPC signings at once.
    pub fn new(concurrent: usize) -> Self {
        let size = concurrent.max(1);
        SigningShare {
            permits: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// One core fewer than the machine has (at least one): the remaining core is the
    /// controller's reserved share.
    pub fn for_this_machine() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Self::new(reserved_share(cores))
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Waits for a turn to sign; the turn ends when the permit is dropped. `None` never happens
    /// in practice (the semaphore is never closed); a caller then signs without a turn.
    pub async fn turn(&self) -> Option<SemaphorePermit<'_>> {
        self.permits.acquire().await.ok()
    }
}

/// gRPC signings allowed on a machine with `cores` cores.
fn reserved_share(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn grpc_leaves_one_core_to_the_controller() {
        assert_eq!(
            [1, 2, 4, 16].map(reserved_share),
            [1, 1, 3, 15],
            "cores → concurrent gRPC signings"
        );
    }

    /// Paused time: the 50 ms wait elapses at once, and only if nothing can run.
    #[tokio::test(start_paused = true)]
    async fn a_share_admits_its_size_then_waits() {
        let share = SigningShare::new(2);
        let first = share.turn().await.unwrap();
        let _second = share.turn().await.unwrap();
        let third = tokio::time::timeout(Duration::from_millis(50), share.turn()).await;
        assert!(
            third.is_err(),
            "a third turn must wait (the timeout elapsed)"
        );
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), share.turn()).await;
        assert!(third.unwrap().is_some());
    }

    #[test]
    fn bucket_refills_per_identity() {
        let limiter = RateLimiter::new(2);
        let t0 = Instant::now();
        assert!(limiter.try_acquire_at("a/b", t0));
        assert!(limiter.try_acquire_at("a/b", t0));
        assert!(!limiter.try_acquire_at("a/b", t0));
        assert!(
            limiter.try_acquire_at("c/d", t0),
            "another identity has its own bucket"
        );
        assert!(limiter.try_acquire_at("a/b", t0 + Duration::from_millis(500)));
        assert!(!limiter.try_acquire_at("a/b", t0 + Duration::from_millis(500)));
    }

    #[test]
    fn zero_is_unlimited() {
        let limiter = RateLimiter::new(0);
        assert!((0..10_000).all(|_| limiter.try_acquire("a/b")));
    }
}
