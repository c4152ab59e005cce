//! Shared test set-up: the process-wide rustls crypto provider and a simulated clock that podca's
//! authority and rustls both read, so a test can move time without sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use rustls::pki_types::UnixTime;
use time::OffsetDateTime;

/// Installs aws-lc-rs as rustls' process default, once. podca's code builds its TLS configs from
/// the default provider (as `podca`'s `main` installs it), so every test that reaches that code
/// calls this first.
pub fn install_crypto() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Another test in the same process may have installed it first; either way aws-lc-rs is
        // the default afterwards, which is all this promises.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    });
}

/// The aws-lc-rs provider for an explicitly built rustls config, after [`install_crypto`].
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    install_crypto();
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A simulated clock in Unix seconds, shared by clones: the authority's `Clock` and rustls'
/// `TimeProvider` read the same instant.
#[derive(Clone)]
pub struct SimClock(Arc<AtomicI64>);

impl SimClock {
    /// A clock standing at `t`.
    pub fn at(t: OffsetDateTime) -> Self {
        Self(Arc::new(AtomicI64::new(t.unix_timestamp())))
    }

    pub fn now(&self) -> OffsetDateTime {
        // Only `at` and `set` store, both from an `OffsetDateTime`, so the value is in range.
        OffsetDateTime::from_unix_timestamp(self.0.load(Ordering::SeqCst)).expect("valid time")
    }

    pub fn set(&self, t: OffsetDateTime) {
        self.0.store(t.unix_timestamp(), Ordering::SeqCst);
    }

    /// This clock as `podca_authority::Clock` (the same type; podca-tests does not depend on
    /// the authority crate, so the alias is spelled out).
    pub fn clock(&self) -> Arc<dyn Fn() -> OffsetDateTime + Send + Sync> {
        let me = self.clone();
        Arc::new(move || me.now())
    }
}

impl std::fmt::Debug for SimClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimClock({})", self.now())
    }
}

impl rustls::time_provider::TimeProvider for SimClock {
    fn current_time(&self) -> Option<UnixTime> {
        // Simulated time starts after 1970 in every test; a negative instant is a test bug.
        let secs = u64::try_from(self.0.load(Ordering::SeqCst)).expect("time after 1970");
        Some(UnixTime::since_unix_epoch(Duration::from_secs(secs)))
    }
}
