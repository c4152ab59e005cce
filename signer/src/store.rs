//! The file CA store: a data directory that holds CA generations (see [`crate::rotation`]).
//!
//! ```text
//! <dir>/state.json                 the generations and their phases (written atomically)
//! <dir>/root.pem                   the published trust anchors: every prepared, active and
//!                                  still-needed retired root
//! <dir>/generations/<n>/root.pem   generation n's root certificate
//! <dir>/generations/<n>/root.key   its key, PKCS#8 PEM, mode 0600 (absent for imported CAs)
//! <dir>/generations/<n>/issuing.pem  issuing certificate, then intermediates up to the root
//! <dir>/generations/<n>/issuing.key  issuing key, PKCS#8 PEM, mode 0600
//! <dir>/ledger.redb                the issuance ledger
//! <dir>/lock                       the writers' lock (flock), holding the last holder's PID
//! ```
//!
//! Crash safety: every writer ([`FileStore::init`], [`FileStore::import`],
//! [`FileStore::rotate`], [`FileStore::recover`]) holds the directory's exclusive lock for the
//! length of its change, so `podca serve`, `podca dev` and the command line interleave their
//! changes and never mix them; a second writer waits up to [`FileStore::with_lock_wait`] (10 s by
//! default) and then fails naming the holder's PID. Every file is written to a unique temporary
//! file beside it, fsynced, renamed into place and its directory fsynced. A new generation is
//! built in full in a staging directory (`generations/.new-*`) and renamed to
//! `generations/<n>` before any `state.json` names it; `root.pem` is written with every anchor
//! of both the old and the new state before `state.json` changes, and trimmed after. So a writer
//! killed at any point leaves either the old or the new state, plus leftovers that the next
//! writer removes first ([`FileStore::recover`]): staging and unreferenced generation
//! directories, temporary files, keys of dropped generations, and a `root.pem` that does not
//! match the state.
//!
//! Rotation levels: a podca-made generation is a root plus an issuing intermediate of the same
//! lifetime, so a rotation replaces both and always changes the trust anchors; it therefore
//! always goes through the prepared → active overlap. An imported CA becomes a generation as is.

use std::fs;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::backend::{BackendError, CaAlgorithm, CaKey, FileKey, MemoryKey};
use crate::ca::{CaCertificate, CaError, IssuingCa, NameConstraints};
use crate::rotation::{self, Advanced, Generation, Phase, Schedule, ScheduleError, Step};

/// Why the store could not be created or read.
// Not `Eq`: a `ScheduleError` carries the schedule's fractions (`f64`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{path}: {detail}")]
    Io { path: String, detail: String },
    #[error("{dir} already holds a CA (found {file}); refusing to overwrite it")]
    AlreadyInitialised { dir: String, file: String },
    #[error(
        "{dir} holds no CA yet; run `podca ca init --dir {}` first",
        shell_word(dir)
    )]
    NotInitialised { dir: String },
    /// Another process holds the data directory's writer lock.
    #[error(
        "{dir} is being changed by another podca process ({holder}); waited {waited_seconds} s \
         for it to finish: try again once it has"
    )]
    Locked {
        dir: String,
        /// `pid N` as the holder recorded it, or `pid unknown`.
        holder: String,
        waited_seconds: u64,
    },
    #[error("{path}: {source}")]
    Ca { path: String, source: CaError },
    #[error("{path}: corrupt CA state: {detail}")]
    State { path: String, detail: String },
    /// The active generation's key is not a file here (an HSM): it cannot be loaded from the
    /// directory, only opened where it is held.
    #[error(
        "the active CA key is held at {location}; open it with its PIN (e.g. \
         --pkcs11-pin-file) instead of loading it from {dir}"
    )]
    KeyHeldElsewhere { location: String, dir: String },
    /// A JWT key's backend (an HSM) failed.
    #[error("JWT signing keys in {location}: {detail}")]
    JwtKey { location: String, detail: String },
    /// The rotation schedule cannot work.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A rotation was forced, but this CA's successor is the operator's to bring.
    #[error(
        "{ca}: podca cannot make its successor; import the next CA with `podca ca init \
         --import-cert … --import-key …` and it will be prepared and activated with overlap"
    )]
    CannotMakeSuccessor { ca: ForeignCa },
    /// `podca ca rotate --algorithm` for a CA whose successors podca does not make: the
    /// setting would apply to nothing, so it is refused before anything is written.
    #[error(
        "{ca}: podca makes none of its successors, so --algorithm {algorithm} would apply to \
         nothing (nothing was changed); bring a next CA with that algorithm yourself (docs/\
         ca.md, \"HSM-held and imported CAs\")"
    )]
    AlgorithmNotApplicable {
        ca: ForeignCa,
        algorithm: CaAlgorithm,
    },
}

/// `word` as one shell word: as it is when that is safe, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-~+:@%=,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// A CA podca did not make itself, so it cannot make its successor either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForeignCa {
    /// Brought by the operator (`podca ca init --import-cert … --import-key …`).
    Imported,
    /// Its key is held outside the data directory (an HSM).
    ExternalKey,
}

impl std::fmt::Display for ForeignCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ForeignCa::Imported => "this CA was imported",
            ForeignCa::ExternalKey => "this CA's key is held outside the data directory (HSM)",
        })
    }
}

/// Options for a new CA generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitOptions {
    pub algorithm: CaAlgorithm,
    /// Common name prefix; the root gets "`<name> root`", the issuing CA "`<name> issuing`".
    pub name: String,
    pub root_validity: Duration,
    pub issuing_validity: Duration,
    /// Name constraints written into every root and issuing certificate of this CA (and of
    /// the generations rotation makes later); empty: none.
    #[serde(default, skip_serializing_if = "NameConstraints::is_empty")]
    pub name_constraints: NameConstraints,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            algorithm: CaAlgorithm::EcdsaP256,
            name: "podca".into(),
            root_validity: Duration::days(3650),
            issuing_validity: Duration::days(365),
            name_constraints: NameConstraints::default(),
        }
    }
}

/// What [`FileStore::recover`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovered {
    /// Leftovers removed: staging and unreferenced generation directories, temporary files,
    /// keys of dropped generations.
    pub removed: Vec<PathBuf>,
    /// `root.pem` did not hold exactly the anchors the state publishes, and was rewritten.
    pub anchors_rewritten: bool,
}

impl Recovered {
    /// Whether the directory was already consistent.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && !self.anchors_rewritten
    }
}

/// The data directory's writer lock, released when dropped (see [`FileStore::lock`]).
#[derive(Debug)]
pub struct DirLock {
    // Closing the file releases the flock.
    _file: fs::File,
}

/// How long a writer waits for another one by default.
const DEFAULT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(25);
/// Prefix of a generation being built (`generations/.new-*`).
const STAGING_PREFIX: &str = ".new-";
/// Prefix of a file being written (`.tmp-*` beside its final name).
const TEMP_PREFIX: &str = ".tmp-";

/// What `state.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct State {
    generations: Vec<Generation>,
    /// How new generations are made (the options of the first `ca init`).
    options: InitOptions,
    /// Whether podca may create generations itself (false for imported and HSM-held CAs).
    #[serde(default = "yes")]
    self_managed: bool,
    /// Generations whose key is not a file here: id → key location (a PKCS#11 URI; no PIN).
    #[serde(default)]
    external_keys: std::collections::BTreeMap<u32, String>,
}

fn yes() -> bool {
    true
}

impl State {
    /// Why podca does not make this CA's successors (meaningful when not `self_managed`).
    fn foreign_ca(&self) -> ForeignCa {
        if self.external_keys.is_empty() {
            ForeignCa::Imported
        } else {
            ForeignCa::ExternalKey
        }
    }
}

/// One CA generation with its certificates (keys are loaded only for the active one).
#[derive(Debug, Clone)]
pub struct GenerationInfo {
    pub generation: Generation,
    pub roots: Vec<CaCertificate>,
    pub issuing: CaCertificate,
}

/// A CA data directory.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    lock_wait: std::time::Duration,
}

impl FileStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileStore {
            dir: dir.into(),
            lock_wait: DEFAULT_LOCK_WAIT,
        }
    }

    /// How long a writer waits for the directory's lock before it fails with
    /// [`StoreError::Locked`].
    pub fn with_lock_wait(mut self, wait: std::time::Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// The writers' lock file.
    pub fn lock_path(&self) -> PathBuf {
        self.dir.join("lock")
    }

    /// Takes the directory's exclusive writer lock (an flock on `<dir>/lock`), waiting up to the
    /// lock wait for another holder to finish. The store's writing methods take it themselves;
    /// this is for callers that must keep others out across several calls.
    pub fn lock(&self) -> Result<DirLock, StoreError> {
        if !self.dir.is_dir() {
            return Err(StoreError::NotInitialised {
                dir: self.dir.display().to_string(),
            });
        }
        let path = self.lock_path();
        let mut options = fs::OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(&path).map_err(|e| io(&path, &e))?;
        let start = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) if start.elapsed() < self.lock_wait => {
                    std::thread::sleep(LOCK_POLL)
                }
                Err(fs::TryLockError::WouldBlock) => {
                    let holder = fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| t.trim().parse::<u32>().ok())
                        .map_or_else(|| "pid unknown".to_owned(), |pid| format!("pid {pid}"));
                    return Err(StoreError::Locked {
                        dir: self.dir.display().to_string(),
                        holder,
                        waited_seconds: self.lock_wait.as_secs(),
                    });
                }
                Err(fs::TryLockError::Error(e)) => return Err(io(&path, &e)),
            }
        }
        // Best effort: the PID only makes another writer's message more useful.
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(DirLock { _file: file })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The published trust anchors (PEM), kept current on every rotation step.
    pub fn root_cert_path(&self) -> PathBuf {
        self.dir.join("root.pem")
    }
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }
    pub fn ledger_path(&self) -> PathBuf {
        self.dir.join("ledger.redb")
    }
    pub fn generation_dir(&self, id: u32) -> PathBuf {
        self.dir.join("generations").join(id.to_string())
    }
    /// The active generation's issuing certificate chain.
    pub fn issuing_cert_path(&self) -> PathBuf {
        self.active_dir().join("issuing.pem")
    }
    /// The active generation's issuing key.
    pub fn issuing_key_path(&self) -> PathBuf {
        self.active_dir().join("issuing.key")
    }
    /// The active generation's root key (absent for imported CAs).
    pub fn root_key_path(&self) -> PathBuf {
        self.active_dir().join("root.key")
    }

    fn active_dir(&self) -> PathBuf {
        let id = self
            .read_state()
            .ok()
            .and_then(|s| {
                s.generations
                    .iter()
                    .find(|g| g.phase == Phase::Active)
                    .map(|g| g.id)
            })
            .unwrap_or(1);
        self.generation_dir(id)
    }

    /// Whether a CA exists here.
    pub fn is_initialised(&self) -> bool {
        self.state_path().exists()
    }

    /// Creates the first generation (a root and an issuing intermediate) and activates it.
    pub fn init(
        &self,
        options: &InitOptions,
        now: OffsetDateTime,
    ) -> Result<IssuingCa, StoreError> {
        self.prepare_dir()?;
        let _lock = self.lock()?;
        self.clear_interrupted_init()?;
        self.refuse_existing()?;
        let mut generation = self.create_generation(1, options, now)?;
        generation.activate(now);
        let state = State {
            generations: vec![generation],
            options: options.clone(),
            self_managed: true,
            external_keys: Default::default(),
        };
        self.commit(None, &state, &["init"], now)?;
        self.load()
    }

    /// Makes this (empty) directory a CA of its own, split off the CA in `source`: a copy of
    /// `source`'s generations that are still in use (certificates, keys, phases), named `name`
    /// from now on, then a rotation started at once. The copy signs exactly as `source` did
    /// and its anchors stay published; the new generation's anchor is published beside them,
    /// signs after the propagation window, and the copied ones leave once their last
    /// certificate has expired: giving signers a CA of their own is a rotation with overlap,
    /// never a swap. Only a CA podca makes its successors for (not imported, not HSM-held) can
    /// be split this way. Returns the rotation's steps.
    pub fn split_from(
        &self,
        source: &FileStore,
        name: &str,
        schedule: &Schedule,
        max_leaf_lifetime: Duration,
        now: OffsetDateTime,
    ) -> Result<Vec<Step>, StoreError> {
        schedule.validate()?;
        {
            self.prepare_dir()?;
            let _lock = self.lock()?;
            self.clear_interrupted_init()?;
            self.refuse_existing()?;
            let _source_lock = source.lock()?;
            let mut state = source.read_state()?;
            if !state.self_managed {
                return Err(StoreError::CannotMakeSuccessor {
                    ca: state.foreign_ca(),
                });
            }
            state.generations.retain(|g| g.phase != Phase::Dropped);
            for generation in &state.generations {
                let staging = self.staging_dir()?;
                let from = source.generation_dir(generation.id);
                for file in read_dir_names(&from)? {
                    if file.starts_with(TEMP_PREFIX) {
                        continue;
                    }
                    let path = from.join(&file);
                    let bytes = fs::read(&path).map_err(|e| io(&path, &e))?;
                    // Keys stay owner-only; certificates are public.
                    let mode = match file.ends_with(".key") {
                        true => 0o600,
                        false => 0o644,
                    };
                    write_atomic(&staging.join(&file), &bytes, mode)?;
                }
                self.install_generation(&staging, generation.id)?;
            }
            state.options.name = name.to_owned();
            self.commit(None, &state, &["split"], now)?;
        }
        self.rotate(schedule, max_leaf_lifetime, true, now)
    }

    /// Imports an existing CA (made by openssl, cfssl, …) as a new generation: `cert_pem` is the
    /// CA certificate that will sign leaves, optionally followed by intermediates and the root;
    /// `key_pem` is its private key; `roots_pem` names the trust anchors when `cert_pem` does
    /// not end in one. Into an empty directory it becomes the active CA; into an existing one it
    /// is prepared, and takes over after the propagation window (`podca ca rotate`).
    pub fn import(
        &self,
        cert_pem: &str,
        key_pem: &str,
        roots_pem: Option<&str>,
    ) -> Result<IssuingCa, StoreError> {
        let now = OffsetDateTime::now_utc();
        let key = MemoryKey::from_pem(key_pem).map_err(|e| self.backend_error(e))?;
        // Validate everything before writing anything.
        let probe = IssuingCa::from_pem(
            Arc::new(MemoryKey::from_pem(key_pem).map_err(|e| self.backend_error(e))?),
            cert_pem,
            roots_pem,
        )
        .and_then(|probe| probe.check_importable(now).map(|()| probe))
        .map_err(|e| self.ca_error(Path::new("<imported certificate>"), e))?;
        if !self.is_initialised() {
            self.prepare_dir()?;
        }
        let _lock = self.lock()?;
        self.clear_interrupted_init()?;
        self.recover_locked(now)?;
        let existing = if self.is_initialised() {
            Some(self.read_state()?)
        } else {
            None
        };
        let id = existing
            .as_ref()
            .and_then(|s| s.generations.iter().map(|g| g.id).max())
            .unwrap_or(0)
            + 1;
        let staging = self.staging_dir()?;
        FileKey::store(&staging.join("issuing.key"), key).map_err(|e| self.backend_error(e))?;
        let roots = probe.roots_pem();
        write_public(&staging.join("root.pem"), &roots)?;
        let mut chain = probe.chain_pem();
        if chain.is_empty() {
            // The imported certificate is itself the root.
            chain = probe.certificate().pem();
        }
        write_public(&staging.join("issuing.pem"), &chain)?;
        self.install_generation(&staging, id)?;
        let gdir = self.generation_dir(id);
        let key = FileKey::load(&gdir.join("issuing.key")).map_err(|e| self.backend_error(e))?;
        let ca = self.load_generation(id, Arc::new(key))?;
        let generation = prepared_generation(id, &ca, now);
        let state = match &existing {
            Some(state) => {
                // The operator brought the next CA: it takes over once its anchor propagated.
                let mut state = state.clone();
                state.generations.push(Generation {
                    activate_asap: true,
                    ..generation
                });
                state
            }
            None => {
                let mut generation = generation;
                generation.activate(now);
                State {
                    generations: vec![generation],
                    options: InitOptions::default(),
                    self_managed: false,
                    external_keys: Default::default(),
                }
            }
        };
        self.commit(existing.as_ref(), &state, &["prepare"], now)?;
        Ok(ca)
    }

    /// Creates the first generation around a key held elsewhere (an HSM): a self-signed root
    /// whose key signs leaves directly. Only the certificate and the key's location are stored.
    pub fn init_with_key(
        &self,
        key: Arc<dyn CaKey>,
        options: &InitOptions,
        now: OffsetDateTime,
    ) -> Result<IssuingCa, StoreError> {
        self.prepare_dir()?;
        let _lock = self.lock()?;
        self.clear_interrupted_init()?;
        self.refuse_existing()?;
        let location = key.location();
        let ca = IssuingCa::self_signed_root_constrained(
            key,
            &format!("{} root 1", options.name),
            now,
            options.root_validity,
            &options.name_constraints,
        )
        .map_err(|e| self.ca_error(&self.generation_dir(1).join("root.pem"), e))?;
        let staging = self.staging_dir()?;
        write_public(&staging.join("root.pem"), &ca.certificate().pem())?;
        write_public(&staging.join("issuing.pem"), &ca.certificate().pem())?;
        self.install_generation(&staging, 1)?;
        let mut generation = prepared_generation(1, &ca, now);
        generation.activate(now);
        let state = State {
            generations: vec![generation],
            options: options.clone(),
            self_managed: false,
            external_keys: [(1, location)].into(),
        };
        self.commit(None, &state, &["init"], now)?;
        Ok(ca)
    }

    /// Where the active generation's key lives when it is not a file here (a PKCS#11 URI).
    pub fn external_key_location(&self) -> Result<Option<String>, StoreError> {
        let state = self.read_state()?;
        let id = active_id(&state, &self.state_path())?;
        Ok(state.external_keys.get(&id).cloned())
    }

    /// Loads the active issuing CA with its file key.
    pub fn load(&self) -> Result<IssuingCa, StoreError> {
        let state = self.read_state()?;
        let id = active_id(&state, &self.state_path())?;
        if let Some(location) = state.external_keys.get(&id) {
            return Err(StoreError::KeyHeldElsewhere {
                location: location.clone(),
                dir: self.dir.display().to_string(),
            });
        }
        let gdir = self.generation_dir(id);
        let key = FileKey::load(&gdir.join("issuing.key")).map_err(|e| self.backend_error(e))?;
        self.load_generation(id, Arc::new(key))
    }

    /// Loads the active issuing CA's certificates with a key held elsewhere (e.g. an HSM).
    pub fn load_with_key(&self, key: Arc<dyn CaKey>) -> Result<IssuingCa, StoreError> {
        let state = self.read_state()?;
        let id = active_id(&state, &self.state_path())?;
        self.load_generation(id, key)
    }

    fn load_generation(&self, id: u32, key: Arc<dyn CaKey>) -> Result<IssuingCa, StoreError> {
        let gdir = self.generation_dir(id);
        let chain = read(&gdir.join("issuing.pem"))?;
        let roots = read(&gdir.join("root.pem"))?;
        IssuingCa::from_pem(key, &chain, Some(&roots))
            .map(|ca| ca.with_generation(id))
            .map_err(|e| self.ca_error(&gdir.join("issuing.pem"), e))
    }

    /// The trust anchors to publish now: every prepared, active and still-needed retired root.
    pub fn roots(&self) -> Result<Vec<CaCertificate>, StoreError> {
        let path = self.root_cert_path();
        if !self.is_initialised() {
            return Err(StoreError::NotInitialised {
                dir: self.dir.display().to_string(),
            });
        }
        let text = read(&path)?;
        CaCertificate::all_from_pem(&text).map_err(|e| self.ca_error(&path, e.into()))
    }

    /// Every generation with its certificates, oldest first.
    pub fn generations(&self) -> Result<Vec<GenerationInfo>, StoreError> {
        let state = self.read_state()?;
        state
            .generations
            .iter()
            .map(|g| {
                let gdir = self.generation_dir(g.id);
                let roots_path = gdir.join("root.pem");
                let roots = CaCertificate::all_from_pem(&read(&roots_path)?)
                    .map_err(|e| self.ca_error(&roots_path, e.into()))?;
                let issuing_path = gdir.join("issuing.pem");
                let issuing = CaCertificate::all_from_pem(&read(&issuing_path)?)
                    .map_err(|e| self.ca_error(&issuing_path, e.into()))?
                    .into_iter()
                    .next()
                    .ok_or_else(|| StoreError::State {
                        path: issuing_path.display().to_string(),
                        detail: "no certificate".into(),
                    })?;
                Ok(GenerationInfo {
                    generation: g.clone(),
                    roots,
                    issuing,
                })
            })
            .collect()
    }

    /// Runs the rotation schedule once: prepares, activates, retires and drops generations as
    /// due (see [`crate::rotation`]). `force_prepare` starts a rotation now (`podca ca rotate`);
    /// the new CA still waits out the propagation window before it signs. `max_leaf_lifetime`
    /// bounds how long leaves of a retired CA can live. Returns the steps taken.
    pub fn rotate(
        &self,
        schedule: &Schedule,
        max_leaf_lifetime: Duration,
        force_prepare: bool,
        now: OffsetDateTime,
    ) -> Result<Vec<Step>, StoreError> {
        schedule.validate()?;
        if !self.is_initialised() {
            return Err(StoreError::NotInitialised {
                dir: self.dir.display().to_string(),
            });
        }
        let _lock = self.lock()?;
        self.recover_locked(now)?;
        let before = self.read_state()?;
        let mut state = before.clone();
        let force = force_prepare && !state.generations.iter().any(|g| g.phase == Phase::Prepared);
        if force && !state.self_managed {
            return Err(StoreError::CannotMakeSuccessor {
                ca: state.foreign_ca(),
            });
        }
        let Advanced {
            generations,
            mut steps,
            prepare_due,
        } = rotation::advance(&state.generations, schedule, max_leaf_lifetime, now);
        state.generations = generations;
        // A successor the schedule wants but podca cannot make (imported or HSM-held CA) is the
        // operator's to bring: nothing to do here.
        if force || (prepare_due && state.self_managed) {
            let id = state.generations.iter().map(|g| g.id).max().unwrap_or(0) + 1;
            let options = InitOptions {
                root_validity: schedule.ca_lifetime(),
                issuing_validity: schedule.ca_lifetime(),
                ..state.options.clone()
            };
            let mut generation = self.create_generation(id, &options, now)?;
            generation.activate_asap = force_prepare;
            state.generations.push(generation);
            steps.push(Step::Prepare);
            let after = rotation::advance(&state.generations, schedule, max_leaf_lifetime, now);
            state.generations = after.generations;
            steps.extend(after.steps);
        }
        let taken = steps;
        if !taken.is_empty() {
            let names: Vec<&str> = taken.iter().map(|s| s.as_str()).collect();
            self.commit(Some(&before), &state, &names, now)?;
            if taken.iter().any(|s| matches!(s, Step::Drop(_))) {
                // A dropped generation signs nothing and is trusted by nobody: remove its keys
                // (what a crash leaves here, the next writer's recovery removes).
                self.remove_dropped_keys(&state)?;
            }
        }
        Ok(taken)
    }

    /// Makes the generations rotation creates from now on use `algorithm`: migrating to (or
    /// from) an ML-DSA CA is an ordinary rotation to a CA of another algorithm. Generations
    /// already made keep their keys. Returns the algorithm new generations used before.
    pub fn set_algorithm(
        &self,
        algorithm: CaAlgorithm,
        now: OffsetDateTime,
    ) -> Result<CaAlgorithm, StoreError> {
        let _lock = self.lock()?;
        self.recover_locked(now)?;
        let before = self.read_state()?;
        let previous = before.options.algorithm;
        if !before.self_managed {
            return Err(StoreError::AlgorithmNotApplicable {
                ca: before.foreign_ca(),
                algorithm,
            });
        }
        if previous != algorithm {
            let mut state = before.clone();
            state.options.algorithm = algorithm;
            self.commit(Some(&before), &state, &["algorithm"], now)?;
        }
        Ok(previous)
    }

    /// When the schedule next has something to do.
    pub fn next_rotation_event(
        &self,
        schedule: &Schedule,
        now: OffsetDateTime,
    ) -> Result<Option<OffsetDateTime>, StoreError> {
        let state = self.read_state()?;
        Ok(rotation::next_event(&state.generations, schedule, now))
    }

    /// Builds generation `id` (root and issuing CA with their keys) in a staging directory and
    /// moves it to `generations/<id>` once complete; nothing refers to it yet.
    fn create_generation(
        &self,
        id: u32,
        options: &InitOptions,
        now: OffsetDateTime,
    ) -> Result<Generation, StoreError> {
        let staging = self.staging_dir()?;
        let gdir = self.generation_dir(id);
        let root_key = FileKey::create(&staging.join("root.key"), options.algorithm)
            .map_err(|e| self.backend_error(e))?;
        crash_point("prepare:after-key");
        let root = IssuingCa::self_signed_root_constrained(
            Arc::new(root_key),
            &format!("{} root {id}", options.name),
            now,
            options.root_validity,
            &options.name_constraints,
        )
        .map_err(|e| self.ca_error(&gdir.join("root.pem"), e))?;
        let issuing_key = FileKey::create(&staging.join("issuing.key"), options.algorithm)
            .map_err(|e| self.backend_error(e))?;
        let issuing = root
            .sign_intermediate_constrained(
                Arc::new(issuing_key),
                &format!("{} issuing {id}", options.name),
                now,
                options.issuing_validity,
                &options.name_constraints,
            )
            .map_err(|e| self.ca_error(&gdir.join("issuing.pem"), e))?;
        write_public(&staging.join("root.pem"), &root.certificate().pem())?;
        write_public(&staging.join("issuing.pem"), &issuing.chain_pem())?;
        self.install_generation(&staging, id)?;
        crash_point("prepare:after-generation");
        Ok(prepared_generation(id, &issuing, now))
    }

    /// A fresh staging directory under `generations/`, kept until installed or recovered.
    fn staging_dir(&self) -> Result<PathBuf, StoreError> {
        let parent = self.dir.join("generations");
        fs::create_dir_all(&parent).map_err(|e| io(&parent, &e))?;
        tempfile::Builder::new()
            .prefix(STAGING_PREFIX)
            .tempdir_in(&parent)
            .map(|d| d.keep())
            .map_err(|e| io(&parent, &e))
    }

    /// Moves a complete staging directory to `generations/<id>`, durably.
    fn install_generation(&self, staging: &Path, id: u32) -> Result<(), StoreError> {
        sync_dir(staging)?;
        let target = self.generation_dir(id);
        fs::rename(staging, &target).map_err(|e| io(&target, &e))?;
        sync_dir(&self.dir.join("generations"))
    }

    /// Completes or rolls back what an interrupted writer left behind, under the directory's
    /// lock (every writer does this first; `podca serve` and `podca dev` also at start):
    /// staging directories and generation directories no state names are removed (they never
    /// signed anything), as are temporary files and the keys of dropped generations; `root.pem`
    /// is rewritten from the state when it differs.
    pub fn recover(&self) -> Result<Recovered, StoreError> {
        if !self.is_initialised() {
            return Ok(Recovered::default());
        }
        let _lock = self.lock()?;
        self.recover_locked(OffsetDateTime::now_utc())
    }

    fn recover_locked(&self, now: OffsetDateTime) -> Result<Recovered, StoreError> {
        let mut done = Recovered::default();
        for entry in read_dir_names(&self.dir)? {
            if entry.starts_with(TEMP_PREFIX) {
                let path = self.dir.join(&entry);
                fs::remove_file(&path).map_err(|e| io(&path, &e))?;
                done.removed.push(path);
            }
        }
        if !self.is_initialised() {
            return Ok(done);
        }
        let state = self.read_state()?;
        let generations = self.dir.join("generations");
        if generations.is_dir() {
            for name in read_dir_names(&generations)? {
                let known = name
                    .parse::<u32>()
                    .is_ok_and(|id| state.generations.iter().any(|g| g.id == id));
                let leftover =
                    name.starts_with(STAGING_PREFIX) || (name.parse::<u32>().is_ok() && !known);
                if leftover {
                    let path = generations.join(&name);
                    fs::remove_dir_all(&path).map_err(|e| io(&path, &e))?;
                    done.removed.push(path);
                }
            }
        }
        done.removed.extend(self.remove_dropped_keys(&state)?);
        let published = rotation::published(&state.generations, now);
        let bundle = self.bundle(&published)?;
        if fs::read_to_string(self.root_cert_path()).ok().as_deref() != Some(bundle.as_str()) {
            write_public(&self.root_cert_path(), &bundle)?;
            done.anchors_rewritten = true;
        }
        if !done.is_empty() {
            if generations.is_dir() {
                sync_dir(&generations)?;
            }
            sync_dir(&self.dir)?;
            tracing::warn!(
                dir = %self.dir.display(),
                removed = ?done.removed,
                anchors_rewritten = done.anchors_rewritten,
                "repaired the CA data directory after an interrupted change"
            );
        }
        Ok(done)
    }

    /// Removes the key files of dropped generations; returns the files removed.
    fn remove_dropped_keys(&self, state: &State) -> Result<Vec<PathBuf>, StoreError> {
        let mut removed = vec![];
        for g in state
            .generations
            .iter()
            .filter(|g| g.phase == Phase::Dropped)
        {
            for file in ["root.key", "issuing.key"] {
                let path = self.generation_dir(g.id).join(file);
                match fs::remove_file(&path) {
                    Ok(()) => removed.push(path),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(&path, &e)),
                }
            }
        }
        Ok(removed)
    }

    /// A directory with generations but no state.json and no ledger is what an interrupted
    /// first `ca init` (or first import) leaves: nothing was ever issued from it, so it is
    /// cleared. With a ledger it may be a CA that signed, and [`Self::refuse_existing`] refuses.
    fn clear_interrupted_init(&self) -> Result<(), StoreError> {
        let generations = self.dir.join("generations");
        if self.is_initialised() || !generations.is_dir() || self.ledger_path().exists() {
            return Ok(());
        }
        let only_first = read_dir_names(&generations)?
            .iter()
            .all(|n| n == "1" || n.starts_with(STAGING_PREFIX));
        if only_first {
            fs::remove_dir_all(&generations).map_err(|e| io(&generations, &e))?;
            sync_dir(&self.dir)?;
            tracing::warn!(
                dir = %self.dir.display(),
                "removed the leftovers of an interrupted `podca ca init`"
            );
        }
        Ok(())
    }

    fn read_state(&self) -> Result<State, StoreError> {
        let path = self.state_path();
        if !path.exists() {
            return Err(StoreError::NotInitialised {
                dir: self.dir.display().to_string(),
            });
        }
        let text = read(&path)?;
        serde_json::from_str(&text).map_err(|e| StoreError::State {
            path: path.display().to_string(),
            detail: e.to_string(),
        })
    }

    /// Replaces the state, keeping `root.pem` ahead of it: first every anchor either state
    /// publishes, then the new state, then only the new state's anchors. So no state ever says
    /// a CA is prepared or active whose root is not in `root.pem`, whatever point a crash hits.
    /// `steps` name the change for the test-only crash points.
    fn commit(
        &self,
        before: Option<&State>,
        state: &State,
        steps: &[&str],
        now: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string_pretty(state).map_err(|e| StoreError::State {
            path: self.state_path().display().to_string(),
            detail: e.to_string(),
        })?;
        let after = rotation::published(&state.generations, now);
        let mut both = before
            .map(|b| rotation::published(&b.generations, now))
            .unwrap_or_default();
        both.extend(after.iter().copied());
        both.sort_unstable();
        both.dedup();
        write_public(&self.root_cert_path(), &self.bundle(&both)?)?;
        crash_points(steps, "before-state");
        write_public(&self.state_path(), &json)?;
        crash_points(steps, "after-state");
        if both != after {
            write_public(&self.root_cert_path(), &self.bundle(&after)?)?;
        }
        crash_points(steps, "after-anchors");
        Ok(())
    }

    /// The roots of generations `ids`, concatenated.
    fn bundle(&self, ids: &[u32]) -> Result<String, StoreError> {
        let mut bundle = String::new();
        for id in ids {
            bundle.push_str(&read(&self.generation_dir(*id).join("root.pem"))?);
        }
        Ok(bundle)
    }

    fn refuse_existing(&self) -> Result<(), StoreError> {
        for path in [self.state_path(), self.dir.join("generations")] {
            if path.exists() {
                return Err(StoreError::AlreadyInitialised {
                    dir: self.dir.display().to_string(),
                    file: path
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                });
            }
        }
        Ok(())
    }

    fn prepare_dir(&self) -> Result<(), StoreError> {
        fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, &e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| io(&self.dir, &e))?;
        }
        Ok(())
    }

    fn backend_error(&self, e: BackendError) -> StoreError {
        match e {
            BackendError::Io { path, detail } => StoreError::Io { path, detail },
            other => StoreError::Ca {
                path: self.dir.display().to_string(),
                source: CaError::Backend(other),
            },
        }
    }

    fn ca_error(&self, path: &Path, source: CaError) -> StoreError {
        StoreError::Ca {
            path: path.display().to_string(),
            source,
        }
    }
}

/// The record of a CA generation that was just created: prepared, nothing signed yet.
fn prepared_generation(id: u32, ca: &IssuingCa, now: OffsetDateTime) -> Generation {
    Generation {
        id,
        phase: Phase::Prepared,
        ca_not_before: ca.certificate().not_before(),
        ca_not_after: ca.not_after(),
        prepared_at: now,
        activated_at: None,
        retired_at: None,
        activate_asap: false,
        last_leaf_not_after: None,
    }
}

fn active_id(state: &State, path: &Path) -> Result<u32, StoreError> {
    state
        .generations
        .iter()
        .find(|g| g.phase == Phase::Active)
        .map(|g| g.id)
        .ok_or_else(|| StoreError::State {
            path: path.display().to_string(),
            detail: "no active CA generation".into(),
        })
}

fn read(path: &Path) -> Result<String, StoreError> {
    fs::read_to_string(path).map_err(|e| io(path, &e))
}

/// Replaces `path` atomically and durably: a unique temporary file beside it (mode 0644),
/// fsynced, renamed over it, and the directory fsynced.
pub(crate) fn write_public(path: &Path, contents: &str) -> Result<(), StoreError> {
    write_atomic(path, contents.as_bytes(), 0o644)
}

/// Replaces `path` with `contents` atomically: a new file of its own (`create_new`, never
/// one an attacker or an earlier run left there) is made in the same directory with `mode`
/// from the start, written, synced, renamed over `path`, and the directory synced. So a
/// private key is never readable by others, not even briefly, and not through an existing
/// file's wider mode, and a crash leaves the old contents or the new, never half.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(TEMP_PREFIX);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(mode));
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut tmp = builder.tempfile_in(dir).map_err(|e| io(path, &e))?;
    tmp.write_all(contents)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| io(path, &e))?;
    tmp.persist(path).map_err(|e| io(path, &e.error))?;
    sync_dir(dir)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(dir, &e))
}

fn read_dir_names(dir: &Path) -> Result<Vec<String>, StoreError> {
    fs::read_dir(dir)
        .and_then(|entries| {
            entries
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .map_err(|e| io(dir, &e))
}

fn crash_points(steps: &[&str], point: &str) {
    for step in steps {
        crash_point(&format!("{step}:{point}"));
    }
}

/// Test-only fault injection, compiled into debug builds only: with
/// `PODCA_TEST_CRASH_AT=<step>:<point>` (e.g. `prepare:after-key`, `activate:before-state`) the
/// process SIGKILLs itself on reaching that point, so tests can show that every step resumes.
#[cfg(debug_assertions)]
fn crash_point(point: &str) {
    if std::env::var("PODCA_TEST_CRASH_AT").is_ok_and(|p| p == point) {
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        // SIGKILL is delivered before kill(1) returns; never go on past the point.
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

#[cfg(not(debug_assertions))]
fn crash_point(_point: &str) {}

fn io(path: &Path, e: &std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}
