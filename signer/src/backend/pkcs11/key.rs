//! [`Pkcs11Key`]: opening a token key, its counters and protection attributes, and the
//! [`CaKey`] implementation.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cryptoki::object::{Attribute, AttributeType};
use cryptoki::types::AuthPin;

use super::connect::{KeyFacts, connect};
use super::fault::describe;
use super::module::{Module, TaggedSession};
use super::pool::{Conn, PoolState};
use super::{KeyProtection, Pkcs11Config, Pkcs11Stats, Pkcs11Uri};
use crate::backend::{BackendError, CaAlgorithm, CaKey};

/// A CA key in a PKCS#11 token. Cheap to share (`Arc<dyn CaKey>`); `sign` is thread-safe.
pub struct Pkcs11Key {
    pub(super) uri: Pkcs11Uri,
    pub(super) module: Arc<Module>,
    pub(super) pin: AuthPin,
    pub(super) facts: KeyFacts,
    pub(super) pool_size: usize,
    pub(super) retry_interval: Duration,
    pub(super) state: Mutex<PoolState>,
    pub(super) available: Condvar,
    pub(super) signs: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) total_nanos: AtomicU64,
    pub(super) max_nanos: AtomicU64,
    pub(super) recoveries: AtomicU64,
}

impl fmt::Debug for Pkcs11Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pkcs11Key")
            .field("uri", &self.uri.to_string())
            .field("algorithm", &self.facts.algorithm)
            .field("pool_size", &self.pool_size)
            .field("pin", &"<redacted>")
            .finish()
    }
}

impl Pkcs11Key {
    /// Opens an existing key pair named by `config.uri`. Every failure is a start-up error
    /// ([`BackendError::InvalidKey`], or `Io` for an unreadable PIN file), including a missing
    /// token and a wrong PIN.
    pub fn open(config: &Pkcs11Config) -> Result<Pkcs11Key, BackendError> {
        let module = Module::get(&config.module()?)?;
        let pin = config.pin.read()?;
        let ctx = module.read();
        let epoch = module.epoch();
        let found = connect(&ctx, &config.uri, &pin, true).map_err(|e| e.startup(&config.uri))?;
        drop(ctx);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let pool_size = config
            .pool_size
            .unwrap_or_else(|| {
                let max = found
                    .max_sessions
                    .map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
                max.min(2 * cores)
            })
            .max(1);
        let key = Pkcs11Key {
            uri: config.uri.clone(),
            module: Arc::clone(&module),
            pin,
            facts: found.facts,
            pool_size,
            retry_interval: config.retry_interval,
            state: Mutex::new(PoolState {
                idle: vec![TaggedSession {
                    session: Some(found.session),
                    epoch,
                    module,
                }],
                open: 1,
                conn: Some(Conn {
                    slot: found.slot,
                    key: found.key,
                }),
                generation: 0,
                retry_at: None,
                last_error: String::new(),
                fatal: None,
            }),
            available: Condvar::new(),
            signs: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            total_nanos: AtomicU64::new(0),
            max_nanos: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
        };
        // Prove the private key matches the public key we will put in certificates.
        let probe = b"podca PKCS#11 key self-test";
        let signature = key.sign_inner(probe).map_err(|e| {
            BackendError::InvalidKey(format!("{}: test signature failed: {e}", key.uri))
        })?;
        aws_lc_rs::signature::UnparsedPublicKey::new(
            key.facts.algorithm.verification(),
            &key.facts.public_raw,
        )
        .verify(probe, &signature)
        .map_err(|_| {
            BackendError::InvalidKey(format!(
                "{}: the private key does not match the public key object found with it",
                key.uri
            ))
        })?;
        Ok(key)
    }

    /// Signing counters, for metrics.
    pub fn stats(&self) -> Pkcs11Stats {
        Pkcs11Stats {
            signs: self.signs.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            total_latency: Duration::from_nanos(self.total_nanos.load(Ordering::Relaxed)),
            max_latency: Duration::from_nanos(self.max_nanos.load(Ordering::Relaxed)),
            recoveries: self.recoveries.load(Ordering::Relaxed),
            pool_size: self.pool_size,
            library_reinits: self.module.epoch(),
        }
    }

    /// The URI this key was opened with (with the `id` filled in after [`Self::generate`]).
    pub fn uri(&self) -> &Pkcs11Uri {
        &self.uri
    }

    /// Reads the private key's protection attributes back from the token.
    pub fn protection(&self) -> Result<KeyProtection, BackendError> {
        let lease = self.acquire()?;
        let attrs = {
            let _ctx = self.module.read();
            lease.session.session.as_ref().map(|s| {
                s.get_attributes(
                    lease.key,
                    &[
                        AttributeType::Sensitive,
                        AttributeType::Extractable,
                        AttributeType::AlwaysSensitive,
                        AttributeType::NeverExtractable,
                        AttributeType::Token,
                        AttributeType::Private,
                    ],
                )
            })
        };
        let attrs = match attrs {
            Some(Ok(a)) => {
                self.release(lease, true);
                a
            }
            Some(Err(e)) => {
                self.release(lease, false);
                return Err(BackendError::Unavailable(format!(
                    "{}: {}",
                    self.uri,
                    describe(&e)
                )));
            }
            None => {
                self.release(lease, false);
                return Err(BackendError::Unavailable(format!(
                    "{}: no session",
                    self.uri
                )));
            }
        };
        let mut p = KeyProtection {
            sensitive: false,
            extractable: true,
            always_sensitive: false,
            never_extractable: false,
            token: false,
            private: false,
        };
        for a in attrs {
            match a {
                Attribute::Sensitive(v) => p.sensitive = v,
                Attribute::Extractable(v) => p.extractable = v,
                Attribute::AlwaysSensitive(v) => p.always_sensitive = v,
                Attribute::NeverExtractable(v) => p.never_extractable = v,
                Attribute::Token(v) => p.token = v,
                Attribute::Private(v) => p.private = v,
                _ => {}
            }
        }
        Ok(p)
    }
}

impl CaKey for Pkcs11Key {
    fn algorithm(&self) -> CaAlgorithm {
        self.facts.algorithm
    }

    fn public_key_raw(&self) -> &[u8] {
        &self.facts.public_raw
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        let start = Instant::now();
        let result = self.sign_inner(message);
        match &result {
            Ok(_) => {
                let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.signs.fetch_add(1, Ordering::Relaxed);
                self.total_nanos.fetch_add(nanos, Ordering::Relaxed);
                self.max_nanos.fetch_max(nanos, Ordering::Relaxed);
            }
            Err(_) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    fn location(&self) -> String {
        self.uri.to_string()
    }
}
