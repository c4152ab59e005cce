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
//! ```
//!
//! Rotation levels: a podca-made generation is a root plus an issuing intermediate of the same
//! lifetime, so a rotation replaces both and always changes the trust anchors; it therefore
//! always goes through the prepared → active overlap. An imported CA becomes a generation as is.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::backend::{BackendError, CaAlgorithm, CaKey, FileKey, MemoryKey};
use crate::ca::{CaCertificate, CaError, IssuingCa};
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
    #[error("{dir} holds no CA yet; run `podca ca init` first")]
    NotInitialised { dir: String },
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
    /// The rotation schedule cannot work.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A rotation was forced, but this CA's successor is the operator's to bring.
    #[error(
        "{ca}: podca cannot make its successor; import the next CA with `podca ca init \
         --import-cert … --import-key …` and it will be prepared and activated with overlap"
    )]
    CannotMakeSuccessor { ca: ForeignCa },
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
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            algorithm: CaAlgorithm::EcdsaP256,
            name: "podca".into(),
            root_validity: Duration::days(3650),
            issuing_validity: Duration::days(365),
        }
    }
}

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
}

impl FileStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileStore { dir: dir.into() }
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
        self.refuse_existing()?;
        self.prepare_dir()?;
        let (mut generation, ca) = self.create_generation(1, options, now)?;
        generation.activate(now);
        let state = State {
            generations: vec![generation],
            options: options.clone(),
            self_managed: true,
            external_keys: Default::default(),
        };
        self.write_state(&state, now)?;
        Ok(ca)
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
        let key = MemoryKey::from_pem(key_pem).map_err(|e| self.backend_error(e))?;
        // Validate everything before writing anything.
        let probe = IssuingCa::from_pem(
            Arc::new(MemoryKey::from_pem(key_pem).map_err(|e| self.backend_error(e))?),
            cert_pem,
            roots_pem,
        )
        .map_err(|e| self.ca_error(Path::new("<imported certificate>"), e))?;
        let now = OffsetDateTime::now_utc();
        let existing = if self.is_initialised() {
            Some(self.read_state()?)
        } else {
            self.prepare_dir()?;
            None
        };
        let id = existing
            .as_ref()
            .and_then(|s| s.generations.iter().map(|g| g.id).max())
            .unwrap_or(0)
            + 1;
        let gdir = self.generation_dir(id);
        fs::create_dir_all(&gdir).map_err(|e| io(&gdir, &e))?;
        let key =
            FileKey::store(&gdir.join("issuing.key"), key).map_err(|e| self.backend_error(e))?;
        let roots = probe.roots_pem();
        write_public(&gdir.join("root.pem"), &roots)?;
        let mut chain = probe.chain_pem();
        if chain.is_empty() {
            // The imported certificate is itself the root.
            chain = probe.certificate().pem();
        }
        write_public(&gdir.join("issuing.pem"), &chain)?;
        let ca = IssuingCa::from_pem(Arc::new(key), &chain, Some(&roots))
            .map_err(|e| self.ca_error(&gdir.join("issuing.pem"), e))?;
        let generation = prepared_generation(id, &ca, now);
        let state = match existing {
            Some(mut state) => {
                // The operator brought the next CA: it takes over once its anchor propagated.
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
        self.write_state(&state, now)?;
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
        self.refuse_existing()?;
        self.prepare_dir()?;
        let gdir = self.generation_dir(1);
        fs::create_dir_all(&gdir).map_err(|e| io(&gdir, &e))?;
        let location = key.location();
        let ca = IssuingCa::self_signed_root(
            key,
            &format!("{} root 1", options.name),
            now,
            options.root_validity,
        )
        .map_err(|e| self.ca_error(&gdir.join("root.pem"), e))?;
        write_public(&gdir.join("root.pem"), &ca.certificate().pem())?;
        write_public(&gdir.join("issuing.pem"), &ca.certificate().pem())?;
        let mut generation = prepared_generation(1, &ca, now);
        generation.activate(now);
        let state = State {
            generations: vec![generation],
            options: options.clone(),
            self_managed: false,
            external_keys: [(1, location)].into(),
        };
        self.write_state(&state, now)?;
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
        let mut state = self.read_state()?;
        let force = force_prepare && !state.generations.iter().any(|g| g.phase == Phase::Prepared);
        if force && !state.self_managed {
            let ca = if state.external_keys.is_empty() {
                ForeignCa::Imported
            } else {
                ForeignCa::ExternalKey
            };
            return Err(StoreError::CannotMakeSuccessor { ca });
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
            let (mut generation, _) = self.create_generation(id, &options, now)?;
            generation.activate_asap = force_prepare;
            state.generations.push(generation);
            steps.push(Step::Prepare);
            let after = rotation::advance(&state.generations, schedule, max_leaf_lifetime, now);
            state.generations = after.generations;
            steps.extend(after.steps);
        }
        let taken = steps;
        if !taken.is_empty() {
            self.write_state(&state, now)?;
            if taken.iter().any(|s| matches!(s, Step::Drop(_))) {
                // A dropped generation signs nothing and is trusted by nobody: remove its keys.
                for g in state
                    .generations
                    .iter()
                    .filter(|g| g.phase == Phase::Dropped)
                {
                    for file in ["root.key", "issuing.key"] {
                        let _ = fs::remove_file(self.generation_dir(g.id).join(file));
                    }
                }
            }
        }
        Ok(taken)
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

    fn create_generation(
        &self,
        id: u32,
        options: &InitOptions,
        now: OffsetDateTime,
    ) -> Result<(Generation, IssuingCa), StoreError> {
        let gdir = self.generation_dir(id);
        fs::create_dir_all(&gdir).map_err(|e| io(&gdir, &e))?;
        let root_key = FileKey::create(&gdir.join("root.key"), options.algorithm)
            .map_err(|e| self.backend_error(e))?;
        let root = IssuingCa::self_signed_root(
            Arc::new(root_key),
            &format!("{} root {id}", options.name),
            now,
            options.root_validity,
        )
        .map_err(|e| self.ca_error(&gdir.join("root.pem"), e))?;
        let issuing_key = FileKey::create(&gdir.join("issuing.key"), options.algorithm)
            .map_err(|e| self.backend_error(e))?;
        let issuing = root
            .sign_intermediate(
                Arc::new(issuing_key),
                &format!("{} issuing {id}", options.name),
                now,
                options.issuing_validity,
            )
            .map_err(|e| self.ca_error(&gdir.join("issuing.pem"), e))?;
        write_public(&gdir.join("root.pem"), &root.certificate().pem())?;
        write_public(&gdir.join("issuing.pem"), &issuing.chain_pem())?;
        let generation = prepared_generation(id, &issuing, now);
        Ok((generation, issuing))
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

    /// Writes the state, then the published bundle. state.json is replaced atomically (write to
    /// a temporary file, fsync, rename), so a crash leaves the old or the new state, never half.
    fn write_state(&self, state: &State, now: OffsetDateTime) -> Result<(), StoreError> {
        let json = serde_json::to_string_pretty(state).map_err(|e| StoreError::State {
            path: self.state_path().display().to_string(),
            detail: e.to_string(),
        })?;
        write_public(&self.state_path(), &json)?;
        let mut bundle = String::new();
        for id in rotation::published(&state.generations, now) {
            bundle.push_str(&read(&self.generation_dir(id).join("root.pem"))?);
        }
        write_public(&self.root_cert_path(), &bundle)
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

fn write_public(path: &Path, contents: &str) -> Result<(), StoreError> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, contents)
        .and_then(|()| fs::File::open(&tmp).and_then(|f| f.sync_all()))
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| io(path, &e))
}

fn io(path: &Path, e: &std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}
