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

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Function, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::{Mechanism, MechanismType};
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::{Limit, Slot};
use cryptoki::types::AuthPin;

use super::{BackendError, CaAlgorithm, CaKey};

mod der;
mod uri;

pub use uri::{PinSource, Pkcs11Uri};

/// The SoftHSM2 module path on Debian, for defaults in tests and docs.
pub const SOFTHSM2_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

/// Minimum time between two re-initialisations of one PKCS#11 module (process-wide).
pub const REINIT_INTERVAL: Duration = Duration::from_secs(1);

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

// ---------------------------------------------------------------------------------------------
// Process-wide module registry: C_Initialize/C_Finalize act on the whole process.

struct Module {
    path: PathBuf,
    /// Read-locked around every PKCS#11 call; write-locked to re-initialise.
    ctx: RwLock<Pkcs11>,
    /// Bumped by each re-initialisation; sessions of an older epoch are dead.
    epoch: AtomicU64,
    last_reinit: Mutex<Option<Instant>>,
}

static MODULES: Mutex<Vec<Arc<Module>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep going with it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn init_args() -> CInitializeArgs {
    CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)
}

impl Module {
    fn get(path: &PathBuf) -> Result<Arc<Module>, BackendError> {
        let mut modules = lock(&MODULES);
        if let Some(m) = modules.iter().find(|m| &m.path == path) {
            return Ok(Arc::clone(m));
        }
        if !path.exists() {
            return Err(BackendError::InvalidKey(format!(
                "PKCS#11 module {} not found (for SoftHSM2: apt-get install -y -t bookworm \
                 softhsm2)",
                path.display()
            )));
        }
        let ctx = Pkcs11::new(path).map_err(|e| {
            BackendError::InvalidKey(format!("loading PKCS#11 module {}: {e}", path.display()))
        })?;
        match ctx.initialize(init_args()) {
            Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
            Err(e) => {
                return Err(BackendError::InvalidKey(format!(
                    "initialising PKCS#11 module {}: {}",
                    path.display(),
                    describe(&e)
                )));
            }
        }
        let module = Arc::new(Module {
            path: path.clone(),
            ctx: RwLock::new(ctx),
            epoch: AtomicU64::new(0),
            last_reinit: Mutex::new(None),
        });
        modules.push(Arc::clone(&module));
        Ok(module)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Pkcs11> {
        self.ctx.read().unwrap_or_else(|p| p.into_inner())
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Finalises and initialises the library again, unless someone did since `seen_epoch` or
    /// it was done less than [`REINIT_INTERVAL`] ago. Returns whether it re-initialised.
    fn reinitialize(&self, seen_epoch: u64) -> bool {
        let ctx = self.ctx.write().unwrap_or_else(|p| p.into_inner());
        if self.epoch() != seen_epoch {
            return false;
        }
        let mut last = lock(&self.last_reinit);
        if last.is_some_and(|t| t.elapsed() < REINIT_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        if let Err(e) = ctx.clone().finalize() {
            tracing::debug!(module = %self.path.display(), error = %describe(&e), "C_Finalize failed");
        }
        // Sessions from before are dead whatever happens next.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        match ctx.initialize(init_args()) {
            Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {
                tracing::warn!(module = %self.path.display(), "PKCS#11 module re-initialised");
                true
            }
            Err(e) => {
                tracing::warn!(module = %self.path.display(), error = %describe(&e),
                    "PKCS#11 module re-initialisation failed");
                true
            }
        }
    }
}

/// A session and the module epoch it was opened in. Dropping it closes the session, unless the
/// module was re-initialised since: then its handle may already name someone else's new
/// session, so it is forgotten instead.
struct TaggedSession {
    session: Option<Session>,
    epoch: u64,
    module: Arc<Module>,
}

impl Drop for TaggedSession {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ctx = self.module.read();
            if self.module.epoch() == self.epoch {
                drop(session);
            } else {
                std::mem::forget(session);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

/// How a PKCS#11 failure should be handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Retrying will not help (PIN, mechanism, key usage).
    Permanent,
    /// This session or handle is stale: reconnect and retry at once.
    Stale,
    /// The token or library is in trouble: reconnect later.
    Device,
}

fn classify(e: &CkError) -> Fault {
    match e {
        CkError::Pkcs11(rv, _) => match rv {
            RvError::PinIncorrect
            | RvError::PinLocked
            | RvError::PinExpired
            | RvError::PinInvalid
            | RvError::PinLenRange
            | RvError::KeyFunctionNotPermitted
            | RvError::KeyTypeInconsistent
            | RvError::MechanismInvalid
            | RvError::MechanismParamInvalid => Fault::Permanent,
            RvError::SessionHandleInvalid
            | RvError::SessionClosed
            | RvError::ObjectHandleInvalid
            | RvError::KeyHandleInvalid
            | RvError::UserNotLoggedIn
            | RvError::OperationActive
            | RvError::CryptokiNotInitialized => Fault::Stale,
            _ => Fault::Device,
        },
        CkError::LibraryLoading(_) | CkError::NullFunctionPointer | CkError::MissingSymbol(_) => {
            Fault::Permanent
        }
        _ => Fault::Device,
    }
}

/// A short description: `C_Sign: CKR DeviceRemoved`. Never contains a PIN (cryptoki errors
/// carry none).
fn describe(e: &CkError) -> String {
    match e {
        CkError::Pkcs11(rv, f) => format!("C_{f:?} returned {}", rv_name(*rv)),
        other => other.to_string(),
    }
}

fn rv_name(rv: RvError) -> String {
    // `PinIncorrect` → `CKR_PIN_INCORRECT`.
    let debug = format!("{rv:?}");
    let mut out = String::from("CKR_");
    for (i, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

fn is_rv(e: &CkError, wanted: RvError) -> bool {
    matches!(e, CkError::Pkcs11(rv, _) if *rv == wanted)
}

// ---------------------------------------------------------------------------------------------
// The key.

/// Everything about the key that does not change while running.
#[derive(Clone)]
struct KeyFacts {
    algorithm: CaAlgorithm,
    public_raw: Vec<u8>,
    /// ECDSA coordinate length, or 0 for RSA.
    coordinate_len: usize,
    /// RSA: whether the token hashes (`CKM_SHA256_RSA_PKCS`).
    rsa_token_hashes: bool,
}

struct Conn {
    slot: Slot,
    key: ObjectHandle,
}

struct PoolState {
    idle: Vec<TaggedSession>,
    /// Sessions of the current generation, idle or lent out.
    open: usize,
    conn: Option<Conn>,
    /// Bumped whenever the pool is thrown away; lent sessions of older generations are closed
    /// on return instead of being pooled.
    generation: u64,
    retry_at: Option<Instant>,
    last_error: String,
    /// Set when recovery must stop (wrong PIN, different key): every sign returns it.
    fatal: Option<BackendError>,
}

struct Lease {
    session: TaggedSession,
    key: ObjectHandle,
    generation: u64,
}

/// A CA key in a PKCS#11 token. Cheap to share (`Arc<dyn CaKey>`); `sign` is thread-safe.
pub struct Pkcs11Key {
    uri: Pkcs11Uri,
    module: Arc<Module>,
    pin: AuthPin,
    facts: KeyFacts,
    pool_size: usize,
    retry_interval: Duration,
    state: Mutex<PoolState>,
    available: Condvar,
    signs: AtomicU64,
    errors: AtomicU64,
    total_nanos: AtomicU64,
    max_nanos: AtomicU64,
    recoveries: AtomicU64,
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

/// Token properties found while connecting.
struct Found {
    slot: Slot,
    session: Session,
    key: ObjectHandle,
    facts: KeyFacts,
    max_sessions: Option<u64>,
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

    /// Generates a key pair inside the token (`CKA_TOKEN`, `CKA_PRIVATE`, `CKA_SENSITIVE`,
    /// not `CKA_EXTRACTABLE`, `CKA_SIGN` only), labelled with the URI's `object` and `id` (a
    /// random 8-byte id when the URI has none), then opens it. Refuses when a private key
    /// matching the URI already exists. RSA keys are 3072 bits.
    pub fn generate(
        config: &Pkcs11Config,
        algorithm: CaAlgorithm,
    ) -> Result<Pkcs11Key, BackendError> {
        let module = Module::get(&config.module()?)?;
        let pin = config.pin.read()?;
        let mut uri = config.uri.clone();
        let id = match &uri.id {
            Some(id) => id.clone(),
            None => {
                let mut id = vec![0u8; 8];
                aws_lc_rs::rand::fill(&mut id).map_err(|_| {
                    BackendError::Unavailable("the system random number generator failed".into())
                })?;
                uri.id = Some(id.clone());
                id
            }
        };
        {
            let ctx = module.read();
            let start = |e: ConnectError| e.startup(&uri);
            let slot = find_slot(&ctx, &uri).map_err(start)?;
            let session = ctx
                .open_rw_session(slot)
                .map_err(|e| start(ConnectError::Ck("opening a read-write session", e)))?;
            login(&session, &pin).map_err(start)?;
            // Check with the URI as given: a generated id must not hide an existing label.
            if !find_private_keys(&session, &config.uri)
                .map_err(start)?
                .is_empty()
            {
                return Err(BackendError::InvalidKey(format!(
                    "{uri}: a private key with this label/id already exists in the token; \
                     open it instead of generating a new one"
                )));
            }
            let mut public = vec![
                Attribute::Token(true),
                Attribute::Private(false),
                Attribute::Verify(true),
                Attribute::Id(id.clone()),
            ];
            let mut private = vec![
                Attribute::Token(true),
                Attribute::Private(true),
                Attribute::Sensitive(true),
                Attribute::Extractable(false),
                Attribute::Sign(true),
                Attribute::Decrypt(false),
                Attribute::Derive(false),
                Attribute::Id(id),
            ];
            if let Some(label) = &uri.object {
                public.push(Attribute::Label(label.as_bytes().to_vec()));
                private.push(Attribute::Label(label.as_bytes().to_vec()));
            }
            let mechanism = match algorithm {
                CaAlgorithm::EcdsaP256 => {
                    public.push(Attribute::EcParams(der::P256_PARAMS.to_vec()));
                    Mechanism::EccKeyPairGen
                }
                CaAlgorithm::EcdsaP384 => {
                    public.push(Attribute::EcParams(der::P384_PARAMS.to_vec()));
                    Mechanism::EccKeyPairGen
                }
                CaAlgorithm::RsaSha256 => {
                    public.push(Attribute::ModulusBits(3072.into()));
                    public.push(Attribute::PublicExponent(vec![0x01, 0x00, 0x01]));
                    Mechanism::RsaPkcsKeyPairGen
                }
                CaAlgorithm::Ed25519 => {
                    return Err(BackendError::InvalidKey(
                        "the PKCS#11 backend supports ecdsa-p256, ecdsa-p384 and rsa-sha256 \
                         CA keys, not ed25519"
                            .into(),
                    ));
                }
            };
            session
                .generate_key_pair(&mechanism, &public, &private)
                .map_err(|e| start(ConnectError::Ck("generating the key pair", e)))?;
        }
        let mut config = config.clone();
        config.uri = uri;
        Self::open(&config)
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

    /// The bytes handed to the token: a digest, a DigestInfo, or the message itself.
    fn token_input(&self, message: &[u8]) -> Vec<u8> {
        use aws_lc_rs::digest;
        match self.facts.algorithm {
            CaAlgorithm::EcdsaP384 => digest::digest(&digest::SHA384, message).as_ref().to_vec(),
            CaAlgorithm::RsaSha256 if self.facts.rsa_token_hashes => message.to_vec(),
            CaAlgorithm::RsaSha256 => {
                let mut input = der::SHA256_DIGEST_INFO_PREFIX.to_vec();
                input.extend_from_slice(digest::digest(&digest::SHA256, message).as_ref());
                input
            }
            // P-256 (Ed25519 keys are never built by this backend).
            _ => digest::digest(&digest::SHA256, message).as_ref().to_vec(),
        }
    }

    fn mechanism(&self) -> Mechanism<'static> {
        match self.facts.algorithm {
            CaAlgorithm::RsaSha256 if self.facts.rsa_token_hashes => Mechanism::Sha256RsaPkcs,
            CaAlgorithm::RsaSha256 => Mechanism::RsaPkcs,
            _ => Mechanism::Ecdsa,
        }
    }

    fn sign_inner(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        let input = self.token_input(message);
        let mechanism = self.mechanism();
        for attempt in 0..2 {
            let lease = self.acquire()?;
            let result = {
                let _ctx = self.module.read();
                if self.module.epoch() != lease.session.epoch {
                    // The module was re-initialised while this session sat in the pool.
                    Err(CkError::Pkcs11(
                        RvError::SessionHandleInvalid,
                        Function::Sign,
                    ))
                } else {
                    match lease.session.session.as_ref() {
                        Some(s) => s.sign(&mechanism, lease.key, &input),
                        None => Err(CkError::Pkcs11(
                            RvError::SessionHandleInvalid,
                            Function::Sign,
                        )),
                    }
                }
            };
            let generation = lease.generation;
            match result {
                Ok(raw) => {
                    self.release(lease, true);
                    return self.to_x509(raw);
                }
                Err(e) => {
                    self.release(lease, false);
                    let fault = classify(&e);
                    let detail = format!("{}: {}", self.uri, describe(&e));
                    match fault {
                        Fault::Permanent => return Err(BackendError::InvalidKey(detail)),
                        Fault::Stale if attempt == 0 => {
                            self.invalidate(generation, &detail, false);
                        }
                        _ => {
                            self.invalidate(generation, &detail, true);
                            return Err(BackendError::Unavailable(detail));
                        }
                    }
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "{}: the token keeps failing",
            self.uri
        )))
    }

    fn to_x509(&self, raw: Vec<u8>) -> Result<Vec<u8>, BackendError> {
        if self.facts.coordinate_len == 0 {
            return Ok(raw);
        }
        der::ecdsa_raw_to_der(&raw, self.facts.coordinate_len).ok_or_else(|| {
            BackendError::Unavailable(format!(
                "{}: the token returned a {}-byte ECDSA signature",
                self.uri,
                raw.len()
            ))
        })
    }

    /// Lends a session, reconnecting first when the pool was thrown away.
    fn acquire(&self) -> Result<Lease, BackendError> {
        let mut st = lock(&self.state);
        loop {
            if let Some(fatal) = &st.fatal {
                return Err(fatal.clone());
            }
            if st.conn.is_none() {
                if let Some(at) = st.retry_at
                    && Instant::now() < at
                {
                    return Err(BackendError::Unavailable(format!(
                        "{} (reconnecting)",
                        st.last_error
                    )));
                }
                self.reconnect(&mut st)?;
            }
            let Some(conn) = st.conn.as_ref() else {
                continue;
            };
            let (key, slot) = (conn.key, conn.slot);
            if let Some(session) = st.idle.pop() {
                return Ok(Lease {
                    session,
                    key,
                    generation: st.generation,
                });
            }
            if st.open < self.pool_size {
                let epoch = self.module.epoch();
                let opened = {
                    let ctx = self.module.read();
                    ctx.open_ro_session(slot)
                        .map_err(|e| ConnectError::Ck("opening a session", e))
                        .and_then(|s| login(&s, &self.pin).map(|()| s))
                };
                match opened {
                    Ok(session) => {
                        st.open += 1;
                        return Ok(Lease {
                            session: TaggedSession {
                                session: Some(session),
                                epoch,
                                module: Arc::clone(&self.module),
                            },
                            key,
                            generation: st.generation,
                        });
                    }
                    Err(e) => {
                        let err = e.running(&self.uri);
                        drop_pool(&mut st, &inner_message(&err), self.retry_interval);
                        if !err.is_transient() {
                            st.fatal = Some(err.clone());
                        }
                        self.available.notify_all();
                        return Err(err);
                    }
                }
            }
            st = self.available.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn release(&self, lease: Lease, healthy: bool) {
        let mut st = lock(&self.state);
        if lease.generation == st.generation {
            if healthy {
                st.idle.push(lease.session);
            } else {
                st.open = st.open.saturating_sub(1);
            }
        }
        // Otherwise (or when unhealthy) the session is dropped here: closed, or forgotten if
        // the module was re-initialised.
        drop(st);
        self.available.notify_one();
    }

    /// Throws the pool away after a failure in `generation` (unless that was done already).
    fn invalidate(&self, generation: u64, detail: &str, backoff: bool) {
        let mut st = lock(&self.state);
        if st.generation == generation {
            tracing::warn!(key = %self.uri, error = detail, "PKCS#11 CA key failed; reconnecting");
            drop_pool(
                &mut st,
                detail,
                if backoff {
                    self.retry_interval
                } else {
                    Duration::ZERO
                },
            );
        }
        drop(st);
        self.available.notify_all();
    }

    /// Reconnects (called with the state locked and no connection). Re-initialises the module
    /// when the library state looks stale.
    fn reconnect(&self, st: &mut PoolState) -> Result<(), BackendError> {
        let mut result = self.try_connect();
        if let Err(e) = &result
            && e.suggests_reinit()
            && self.module.reinitialize(e.epoch)
        {
            result = self.try_connect();
        }
        match result {
            Ok((found, epoch)) => {
                st.generation += 1;
                st.idle = vec![TaggedSession {
                    session: Some(found.session),
                    epoch,
                    module: Arc::clone(&self.module),
                }];
                st.open = 1;
                st.conn = Some(Conn {
                    slot: found.slot,
                    key: found.key,
                });
                st.retry_at = None;
                self.recoveries.fetch_add(1, Ordering::Relaxed);
                tracing::info!(key = %self.uri, "PKCS#11 CA key reconnected");
                Ok(())
            }
            Err(e) => {
                let err = e.error.running(&self.uri);
                st.retry_at = Some(Instant::now() + self.retry_interval);
                st.last_error = inner_message(&err);
                if !err.is_transient() {
                    st.fatal = Some(err.clone());
                }
                Err(err)
            }
        }
    }

    fn try_connect(&self) -> Result<(Found, u64), ReconnectError> {
        let ctx = self.module.read();
        let epoch = self.module.epoch();
        let found = connect(&ctx, &self.uri, &self.pin, false)
            .map_err(|error| ReconnectError { error, epoch })?;
        if found.facts.public_raw != self.facts.public_raw {
            return Err(ReconnectError {
                error: ConnectError::Replaced,
                epoch,
            });
        }
        Ok((found, epoch))
    }
}

/// The message of an error without its `CA key backend unavailable:` prefix.
fn inner_message(err: &BackendError) -> String {
    match err {
        BackendError::Unavailable(m) | BackendError::InvalidKey(m) => m.clone(),
        other => other.to_string(),
    }
}

fn drop_pool(st: &mut PoolState, detail: &str, backoff: Duration) {
    st.conn = None;
    st.generation += 1;
    st.open = 0;
    st.idle.clear();
    st.last_error = detail.to_owned();
    st.retry_at = (!backoff.is_zero()).then(|| Instant::now() + backoff);
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

// ---------------------------------------------------------------------------------------------
// Connecting: slot → session → login → key → public key.

#[derive(Debug)]
enum ConnectError {
    /// No token with the URI's label (and manufacturer/model/serial) is present.
    NoToken { available: Vec<String> },
    /// A PKCS#11 call failed.
    Ck(&'static str, CkError),
    /// The token rejected the PIN.
    Pin(CkError),
    /// No private key, or several, match the URI.
    Key(String),
    /// The key found has another public key than the one this process started with.
    Replaced,
}

struct ReconnectError {
    error: ConnectError,
    epoch: u64,
}

impl ReconnectError {
    fn suggests_reinit(&self) -> bool {
        match &self.error {
            ConnectError::NoToken { .. } => true,
            ConnectError::Ck(_, e) => matches!(
                e,
                CkError::Pkcs11(
                    RvError::CryptokiNotInitialized
                        | RvError::GeneralError
                        | RvError::DeviceError
                        | RvError::DeviceRemoved
                        | RvError::TokenNotPresent
                        | RvError::TokenNotRecognized
                        | RvError::SlotIdInvalid,
                    _
                )
            ),
            _ => false,
        }
    }
}

impl ConnectError {
    fn pin_message(uri: &Pkcs11Uri, e: &CkError) -> String {
        let what = if is_rv(e, RvError::PinIncorrect) {
            "the user PIN is incorrect"
        } else if is_rv(e, RvError::PinLocked) {
            "the user PIN is locked"
        } else {
            "the token refused the user PIN"
        };
        format!(
            "{uri}: login to token {:?} failed: {what} ({})",
            uri.token,
            describe(e)
        )
    }

    /// The error at start-up: everything is permanent, so the process refuses to start.
    fn startup(self, uri: &Pkcs11Uri) -> BackendError {
        let msg = match self {
            ConnectError::NoToken { available } => format!(
                "{uri}: no token labelled {:?} is present (tokens found: {})",
                uri.token,
                if available.is_empty() {
                    "none".to_owned()
                } else {
                    available.join(", ")
                }
            ),
            ConnectError::Ck(what, e) => format!("{uri}: {what}: {}", describe(&e)),
            ConnectError::Pin(e) => Self::pin_message(uri, &e),
            ConnectError::Key(m) => format!("{uri}: {m}"),
            ConnectError::Replaced => format!("{uri}: the key changed"),
        };
        BackendError::InvalidKey(msg)
    }

    /// The error while running: transient, except a rejected PIN and a replaced key.
    fn running(self, uri: &Pkcs11Uri) -> BackendError {
        match self {
            ConnectError::Pin(e) => BackendError::InvalidKey(format!(
                "{}; not retrying, to avoid locking the PIN",
                Self::pin_message(uri, &e)
            )),
            ConnectError::Replaced => BackendError::InvalidKey(format!(
                "{uri}: the key now found under this URI has a different public key than the \
                 CA certificate's; refusing to sign with it"
            )),
            ConnectError::Ck(_, ref e) if classify(e) == Fault::Permanent => self.startup(uri),
            other => match other.startup(uri) {
                BackendError::InvalidKey(m) => BackendError::Unavailable(m),
                e => e,
            },
        }
    }
}

fn find_slot(ctx: &Pkcs11, uri: &Pkcs11Uri) -> Result<Slot, ConnectError> {
    let slots = ctx
        .get_slots_with_token()
        .map_err(|e| ConnectError::Ck("listing slots", e))?;
    let mut available = vec![];
    for slot in slots {
        let info = match ctx.get_token_info(slot) {
            Ok(info) => info,
            // A token can disappear between the two calls.
            Err(_) => continue,
        };
        let matches = info.label() == uri.token
            && uri
                .manufacturer
                .as_deref()
                .is_none_or(|m| info.manufacturer_id() == m)
            && uri.model.as_deref().is_none_or(|m| info.model() == m)
            && uri
                .serial
                .as_deref()
                .is_none_or(|s| info.serial_number() == s);
        if matches && info.token_initialized() {
            return Ok(slot);
        }
        if info.token_initialized() {
            available.push(format!("{:?}", info.label()));
        }
    }
    Err(ConnectError::NoToken { available })
}

fn login(session: &Session, pin: &AuthPin) -> Result<(), ConnectError> {
    match session.login(UserType::User, Some(pin)) {
        Ok(()) => Ok(()),
        // Login state is per application and token: another session logged in already.
        Err(e) if is_rv(&e, RvError::UserAlreadyLoggedIn) => Ok(()),
        Err(e)
            if is_rv(&e, RvError::PinIncorrect)
                || is_rv(&e, RvError::PinLocked)
                || is_rv(&e, RvError::PinExpired)
                || is_rv(&e, RvError::PinInvalid)
                || is_rv(&e, RvError::PinLenRange) =>
        {
            Err(ConnectError::Pin(e))
        }
        Err(e) => Err(ConnectError::Ck("logging in", e)),
    }
}

fn key_template(uri: &Pkcs11Uri, class: ObjectClass) -> Vec<Attribute> {
    let mut template = vec![Attribute::Class(class)];
    if let Some(label) = &uri.object {
        template.push(Attribute::Label(label.as_bytes().to_vec()));
    }
    if let Some(id) = &uri.id {
        template.push(Attribute::Id(id.clone()));
    }
    template
}

fn find_private_keys(
    session: &Session,
    uri: &Pkcs11Uri,
) -> Result<Vec<ObjectHandle>, ConnectError> {
    session
        .find_objects(&key_template(uri, ObjectClass::PRIVATE_KEY))
        .map_err(|e| ConnectError::Ck("finding the private key", e))
}

fn connect(
    ctx: &Pkcs11,
    uri: &Pkcs11Uri,
    pin: &AuthPin,
    startup: bool,
) -> Result<Found, ConnectError> {
    let slot = find_slot(ctx, uri)?;
    let token = ctx
        .get_token_info(slot)
        .map_err(|e| ConnectError::Ck("reading token information", e))?;
    let max_sessions = match token.max_session_count() {
        Limit::Max(n) if n > 0 => Some(n),
        _ => None,
    };
    let session = ctx
        .open_ro_session(slot)
        .map_err(|e| ConnectError::Ck("opening a session", e))?;
    login(&session, pin)?;
    let keys = find_private_keys(&session, uri)?;
    let key = match keys.as_slice() {
        [key] => *key,
        [] => {
            return Err(ConnectError::Key(
                "no private key with this label/id in the token".into(),
            ));
        }
        many => {
            return Err(ConnectError::Key(format!(
                "{} private keys match; add id= or object= to the URI to name one",
                many.len()
            )));
        }
    };
    let attrs = session
        .get_attributes(
            key,
            &[
                AttributeType::KeyType,
                AttributeType::Sign,
                AttributeType::Id,
            ],
        )
        .map_err(|e| ConnectError::Ck("reading the private key attributes", e))?;
    let mut key_type = None;
    let mut can_sign = false;
    let mut id = None;
    for a in attrs {
        match a {
            Attribute::KeyType(t) => key_type = Some(t),
            Attribute::Sign(s) => can_sign = s,
            Attribute::Id(i) => id = Some(i),
            _ => {}
        }
    }
    if !can_sign {
        return Err(ConnectError::Key(
            "the private key does not allow signing (CKA_SIGN)".into(),
        ));
    }
    // The public half: the public key object with the same id (or label), which carries
    // CKA_EC_POINT; RSA moduli are readable on the private key too.
    let mut public_uri = uri.clone();
    if let Some(id) = id.filter(|i| !i.is_empty()) {
        public_uri.id = Some(id);
    }
    let facts = if key_type == Some(KeyType::EC) {
        let publics = session
            .find_objects(&key_template(&public_uri, ObjectClass::PUBLIC_KEY))
            .map_err(|e| ConnectError::Ck("finding the public key", e))?;
        let [public] = publics.as_slice() else {
            return Err(ConnectError::Key(format!(
                "expected one public key object next to the EC private key, found {}",
                publics.len()
            )));
        };
        let attrs = session
            .get_attributes(*public, &[AttributeType::EcParams, AttributeType::EcPoint])
            .map_err(|e| ConnectError::Ck("reading the public key", e))?;
        let (mut params, mut point) = (None, None);
        for a in attrs {
            match a {
                Attribute::EcParams(p) => params = Some(p),
                Attribute::EcPoint(p) => point = Some(p),
                _ => {}
            }
        }
        let (algorithm, coordinate_len) = match params.as_deref() {
            Some(p) if p == der::P256_PARAMS => (CaAlgorithm::EcdsaP256, 32),
            Some(p) if p == der::P384_PARAMS => (CaAlgorithm::EcdsaP384, 48),
            _ => {
                return Err(ConnectError::Key(
                    "unsupported EC curve (podca signs with P-256 or P-384)".into(),
                ));
            }
        };
        let public_raw = point
            .as_deref()
            .and_then(|p| der::ec_point_from_attribute(p, 1 + 2 * coordinate_len))
            .ok_or_else(|| ConnectError::Key("CKA_EC_POINT is not an uncompressed point".into()))?;
        KeyFacts {
            algorithm,
            public_raw,
            coordinate_len,
            rsa_token_hashes: false,
        }
    } else if key_type == Some(KeyType::RSA) {
        let attrs = session
            .get_attributes(
                key,
                &[AttributeType::Modulus, AttributeType::PublicExponent],
            )
            .map_err(|e| ConnectError::Ck("reading the RSA public key", e))?;
        let (mut modulus, mut exponent) = (None, None);
        for a in attrs {
            match a {
                Attribute::Modulus(m) => modulus = Some(m),
                Attribute::PublicExponent(e) => exponent = Some(e),
                _ => {}
            }
        }
        let (Some(modulus), Some(exponent)) = (modulus, exponent) else {
            return Err(ConnectError::Key(
                "the RSA key hides its modulus or exponent".into(),
            ));
        };
        let bits = modulus.iter().skip_while(|b| **b == 0).count() * 8;
        if bits < 2048 {
            return Err(ConnectError::Key(format!(
                "RSA key of about {bits} bits: at least 2048 required"
            )));
        }
        let mechanisms = ctx
            .get_mechanism_list(slot)
            .map_err(|e| ConnectError::Ck("listing mechanisms", e))?;
        KeyFacts {
            algorithm: CaAlgorithm::RsaSha256,
            public_raw: der::rsa_public_key(&modulus, &exponent),
            coordinate_len: 0,
            rsa_token_hashes: mechanisms.contains(&MechanismType::SHA256_RSA_PKCS),
        }
    } else {
        return Err(ConnectError::Key(
            "unsupported key type (podca signs with EC P-256/P-384 or RSA keys)".into(),
        ));
    };
    if startup {
        tracing::info!(key = %uri, algorithm = %facts.algorithm, "PKCS#11 CA key found");
    }
    Ok(Found {
        slot,
        session,
        key,
        facts,
        max_sessions,
    })
}

// ---------------------------------------------------------------------------------------------
// Intermediate mode.

/// When an intermediate valid from `not_before` to `not_after` should be replaced: at 2/3 of
/// its lifetime (so the remaining third covers an HSM outage and leaves issued just before).
pub fn intermediate_renewal_time(
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> time::OffsetDateTime {
    let life = not_after - not_before;
    if life <= time::Duration::ZERO {
        return not_before;
    }
    not_before + life * 2 / 3
}

/// Whether `intermediate` is due for re-issuance at `now` (or has expired).
pub fn intermediate_needs_renewal(
    intermediate: &crate::CaCertificate,
    now: time::OffsetDateTime,
) -> bool {
    now >= intermediate_renewal_time(intermediate.not_before(), intermediate.not_after())
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn renewal_at_two_thirds() {
        let nb = datetime!(2030-01-01 00:00 UTC);
        let na = datetime!(2030-01-01 03:00 UTC);
        assert_eq!(
            intermediate_renewal_time(nb, na),
            datetime!(2030-01-01 02:00 UTC)
        );
        // Degenerate certificates are due at once.
        assert_eq!(intermediate_renewal_time(na, nb), na);
        assert_eq!(intermediate_renewal_time(nb, nb), nb);
    }

    #[test]
    fn rv_names_are_pkcs11_constants() {
        assert_eq!(rv_name(RvError::PinIncorrect), "CKR_PIN_INCORRECT");
        assert_eq!(rv_name(RvError::DeviceRemoved), "CKR_DEVICE_REMOVED");
    }

    #[test]
    fn faults() {
        let f = |rv| classify(&CkError::Pkcs11(rv, Function::Sign));
        assert_eq!(f(RvError::DeviceRemoved), Fault::Device);
        assert_eq!(f(RvError::TokenNotPresent), Fault::Device);
        assert_eq!(f(RvError::DeviceError), Fault::Device);
        assert_eq!(f(RvError::SessionHandleInvalid), Fault::Stale);
        assert_eq!(f(RvError::PinIncorrect), Fault::Permanent);
    }
}
