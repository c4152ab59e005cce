//! A token bucket per identity: `rate` requests per second, bursts of up to `rate`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
