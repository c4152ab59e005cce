//! A CA key held in a PKCS#11 token (an HSM, or SoftHSM2 in tests).
//!
//! [`Pkcs11Key`] finds (or generates, inside the token) a key pair named by a PKCS#11 URI
//! ([`Pkcs11Uri`], RFC 7512) and signs through a small pool of sessions. The private key never
//! leaves the token; the PIN is read once from a file or an environment variable
//! ([`PinSource`]), kept in a zeroizing buffer, and never printed.
//!
//! # Algorithms
//!
//! * ECDSA P-256 / P-384: the digest (SHA-256 / SHA-384) is computed on the host and signed
//!   with raw `CKM_ECDSA` (all SoftHSM2 2.6 offers); the token's `r‖s` is converted to the
//!   DER `ECDSA-Sig-Value` X.509 wants.
//! * RSA (keys already in the token, or generated as RSA-3072): `CKM_SHA256_RSA_PKCS` when the
//!   token offers it, else `CKM_RSA_PKCS` over a host-built SHA-256 `DigestInfo`.
//! * Ed25519 (`CKM_EDDSA`, the message itself): the ledger log's checkpoint key only
//!   ([`Pkcs11Key::open_or_generate_ed25519`]); CA keys stay ECDSA or RSA ([`Pkcs11Key::supports`]).
//!
//! # Errors and recovery
//!
//! At start-up ([`Pkcs11Key::open`], [`Pkcs11Key::generate`]) every problem is a clear
//! [`BackendError::InvalidKey`]: module missing, **token missing**, wrong PIN
//! (`CKR_PIN_INCORRECT`), locked PIN, key missing or ambiguous, unsupported key type. A process
//! must not start serving with a CA key it cannot reach.
//!
//! While running, token and library failures (`CKR_DEVICE_REMOVED`, `CKR_TOKEN_NOT_PRESENT`,
//! `CKR_SESSION_HANDLE_INVALID`, `CKR_DEVICE_ERROR`, the token vanishing from the slot list,
//! …) are [`BackendError::Unavailable`]: the pool is dropped and a later `sign` reconnects
//! (find the token by label, open sessions, log in, find the key again, check it is the *same*
//! public key) at most every [`Pkcs11Config::retry_interval`]. When reconnecting fails in a
//! way that suggests a stale library state (the token is not listed, `CKR_GENERAL_ERROR`,
//! `CKR_CRYPTOKI_NOT_INITIALIZED`), the module is finalised and initialised again (at most
//! once per [`REINIT_INTERVAL`] per module, process-wide; other keys on the same module then
//! reconnect too). Two conditions stop recovery and turn into a permanent `InvalidKey`:
//! the token rejecting the PIN (retrying would lock the PIN) and the key found under the URI
//! having a different public key than the one this CA started with.
//!
//! # Two ways to use an HSM CA key
//!
//! * **HSM signs every leaf** (an [`IssuingCa`](crate::IssuingCa) whose key is the
//!   `Pkcs11Key`): no CA private key ever exists outside the token. Every issuance costs one
//!   token operation, so throughput is bounded by the token (SoftHSM2 here: ~10k P-256
//!   signatures/s; network HSMs are often 100–2,000/s with milliseconds of latency), and an
//!   HSM outage stops issuance at once (requests stay pending and are retried).
//! * **Intermediate mode**: the HSM key only signs a short-lived intermediate whose key lives in
//!   process memory ([`MemoryKey`](crate::MemoryKey)), and the intermediate signs leaves.
//!   Issuance runs at software speed and survives HSM outages shorter than the intermediate's
//!   remaining life. The price: a CA private key sits in process memory for the intermediate's
//!   lifetime; someone who can read that memory can mint certificates until it expires (there
//!   is no revocation in this design). Keep the intermediate short (hours), re-issue it early
//!   ([`intermediate_renewal_time`]: at 2/3 of its life), and give it at least 3× the longest
//!   leaf lifetime so that a leaf issued just before renewal still gets its full lifetime.

use std::path::PathBuf;
use std::time::Duration;

use super::BackendError;

mod connect;
mod der;
mod fault;
mod generate;
mod key;
mod module;
mod pool;
mod renewal;
mod sign;
mod uri;

pub use key::Pkcs11Key;
pub use module::REINIT_INTERVAL;
pub use renewal::{intermediate_needs_renewal, intermediate_renewal_time};
pub use uri::{PinSource, Pkcs11Uri};

/// The SoftHSM2 module path on Debian, for defaults in tests and docs.
pub const SOFTHSM2_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

/// How to reach a token key.
#[derive(Clone, Debug)]
pub struct Pkcs11Config {
    /// Which token and key.
    pub uri: Pkcs11Uri,
    /// Where the user PIN comes from.
    pub pin: PinSource,
    /// The PKCS#11 library; overrides the URI's `module-path`. One of the two is required.
    pub module_path: Option<PathBuf>,
    /// Session pool size; `None` means min(token max sessions, 2 × CPU cores).
    pub pool_size: Option<usize>,
    /// Minimum time between two reconnection attempts while the token is unavailable.
    pub retry_interval: Duration,
}

impl Pkcs11Config {
    /// A configuration with the default pool size and a 250 ms retry interval.
    pub fn new(uri: Pkcs11Uri, pin: PinSource) -> Self {
        Pkcs11Config {
            uri,
            pin,
            module_path: None,
            pool_size: None,
            retry_interval: Duration::from_millis(250),
        }
    }

    fn module(&self) -> Result<PathBuf, BackendError> {
        self.module_path
            .clone()
            .or_else(|| self.uri.module_path.clone())
            .ok_or_else(|| {
                BackendError::InvalidKey(format!(
                    "{}: no PKCS#11 module: add ?module-path=<library.so> to the URI",
                    self.uri
                ))
            })
    }
}

/// Counters for metrics. Latency covers the whole `sign` call (pool wait, recovery, token).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pkcs11Stats {
    /// Successful signatures.
    pub signs: u64,
    /// `sign` calls that returned an error.
    pub errors: u64,
    /// Sum of the latencies of successful signatures.
    pub total_latency: Duration,
    /// Largest latency of a successful signature.
    pub max_latency: Duration,
    /// Successful reconnections after a failure.
    pub recoveries: u64,
    /// The session pool size.
    pub pool_size: usize,
    /// How many times this key's PKCS#11 module was re-initialised in this process (by any
    /// key using it).
    pub library_reinits: u64,
}

/// Protection attributes of the private key object, read back from the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyProtection {
    pub sensitive: bool,
    pub extractable: bool,
    pub always_sensitive: bool,
    pub never_extractable: bool,
    pub token: bool,
    pub private: bool,
}
