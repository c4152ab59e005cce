//! The JWT keys' state in the data directory, beside the CA generations, and where their
//! private keys live ([`JwtKeyBackend`]):
//!
//! ```text
//! <dir>/jwt/state.json     the keys, their phases and (HSM keys) their locations
//! <dir>/jwt/<kid>.key      each file-held key, PKCS#8 PEM, mode 0600
//! ```
//!
//! The schedule ([`super::keyset::plan`] / [`super::keyset::apply`]) is the same for every
//! backend; only the key material moves. [`FileJwtKeys`] keeps each key in a file beside the
//! state; the PKCS#11 backend ([`super::pkcs11::Pkcs11JwtKeys`]) generates each key inside the
//! CA's token (non-extractable) and records its URI in `state.json`. A key's recorded location
//! decides where it is loaded from and destroyed, so a data directory that moves from file keys
//! to an HSM keeps publishing (and then drops) its file keys while new keys are made in the token.
//!
//! Crash safety follows the CA store's (see [`crate::store`]): every change holds the data
//! directory's writer lock; a new key is made (a file: mode 0600 from the start, fsynced) before
//! any state names it; `state.json` is replaced atomically with the CA store's helper; a dropped
//! key is deleted only after the state no longer names it. So a writer killed anywhere leaves the
//! old or the new state, plus at most a key no state names. A leftover key *file* is removed by
//! the next change (it never signed anything); a leftover *token object* (label `podca-jwt-…`)
//! is left alone, because a token may be shared and podca cannot prove the object is its own
//! (see docs/jwt.md, "Where the JWT keys live").

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::keyset::{self, JwtKeyInfo, JwtKeySchedule, JwtKeySet, JwtKeyStep, kid_of};
use super::{JwtAlgorithm, JwtError};
use crate::backend::{CaAlgorithm, CaKey, FileKey, MemoryKey};
use crate::store::{FileStore, StoreError};

/// Where JWT private keys are made, opened and destroyed. The schedule and the state stay in
/// [`JwtStore`]; a backend only holds key material.
pub trait JwtKeyBackend: Send + Sync + std::fmt::Debug {
    /// `file` or `pkcs11`, for `podca ca show` and logs.
    fn kind(&self) -> &'static str;
    /// Refuses, before anything changes, an algorithm this backend cannot make keys of.
    fn check(&self, algorithm: CaAlgorithm) -> Result<(), StoreError>;
    /// Makes a new key.
    fn generate(&self, algorithm: CaAlgorithm) -> Result<GeneratedJwtKey, StoreError>;
    /// Opens the key `kid` at `location` (as [`GeneratedJwtKey::location`] recorded it).
    fn load(&self, kid: &str, location: Option<&str>) -> Result<Arc<dyn CaKey>, StoreError>;
    /// Destroys the key `kid` at `location`; a key already gone is not an error.
    fn delete(&self, kid: &str, location: Option<&str>) -> Result<(), StoreError>;
}

/// A key a backend just made.
#[derive(Debug)]
pub struct GeneratedJwtKey {
    pub kid: String,
    /// Recorded in `state.json` when the kid alone does not say where the key is (None: a file
    /// in the data directory).
    pub location: Option<String>,
    pub key: Arc<dyn CaKey>,
}

/// One key as `state.json` records it, without opening it (`podca ca show`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredJwtKey {
    pub info: JwtKeyInfo,
    /// `file:<path>` or the key's PKCS#11 URI.
    pub location: String,
}

/// `jwt/state.json` (also the `state.json` of the Secret backend's JWT Secret,
/// [`super::secret`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct State {
    /// Bumped on every change: the bundle's `spiffe_sequence`.
    pub(crate) sequence: u64,
    pub(crate) keys: Vec<JwtKeyInfo>,
    /// kid → location, for keys that are not files in the data directory.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) locations: BTreeMap<String, String>,
}

/// What [`JwtStore::advance`] did.
#[derive(Debug)]
pub struct Advanced {
    pub keys: JwtKeySet,
    pub steps: Vec<JwtKeyStep>,
}

/// JWT keys as files in `<dir>/jwt/`.
#[derive(Debug, Clone)]
pub struct FileJwtKeys {
    dir: PathBuf,
}

impl FileJwtKeys {
    /// The keys in `<store>/jwt/`.
    pub fn new(store: &FileStore) -> Self {
        FileJwtKeys {
            dir: store.dir().join("jwt"),
        }
    }

    fn key_path(&self, kid: &str) -> PathBuf {
        self.dir.join(format!("{kid}.key"))
    }

    /// Removes key files no state names: a crash between writing a key and the state.
    fn remove_unnamed(&self, state: &State) -> Result<(), StoreError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| io(&self.dir, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io(&self.dir, &e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let named = name.strip_suffix(".key").is_some_and(|kid| {
                state
                    .keys
                    .iter()
                    .any(|k| k.kid == kid && !state.locations.contains_key(kid))
            });
            let leftover = (name.ends_with(".key") && !named) || name.starts_with(".tmp-");
            if leftover {
                remove_if_present(&entry.path())?;
                tracing::warn!(file = %entry.path().display(), "removed a JWT key file no state names");
            }
        }
        Ok(())
    }

    fn elsewhere(&self, kid: &str, location: &str) -> StoreError {
        StoreError::State {
            path: self.dir.join("state.json").display().to_string(),
            detail: format!(
                "JWT key {kid} is held at {location}, not in a file: configure the backend that \
                 holds it ([ca] backend = \"pkcs11\")"
            ),
        }
    }
}

impl JwtKeyBackend for FileJwtKeys {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn check(&self, _algorithm: CaAlgorithm) -> Result<(), StoreError> {
        Ok(())
    }

    fn generate(&self, algorithm: CaAlgorithm) -> Result<GeneratedJwtKey, StoreError> {
        let key = MemoryKey::generate(algorithm).map_err(|e| io_text(&self.dir, &e.to_string()))?;
        let kid = kid_of(&key);
        let path = self.key_path(&kid);
        let key = FileKey::store(&path, key).map_err(|e| io_text(&path, &e.to_string()))?;
        Ok(GeneratedJwtKey {
            kid,
            location: None,
            key: Arc::new(key),
        })
    }

    fn load(&self, kid: &str, location: Option<&str>) -> Result<Arc<dyn CaKey>, StoreError> {
        if let Some(location) = location {
            return Err(self.elsewhere(kid, location));
        }
        let path = self.key_path(kid);
        let key = FileKey::load(&path).map_err(|e| io_text(&path, &e.to_string()))?;
        Ok(Arc::new(key))
    }

    fn delete(&self, kid: &str, location: Option<&str>) -> Result<(), StoreError> {
        if let Some(location) = location {
            return Err(self.elsewhere(kid, location));
        }
        remove_if_present(&self.key_path(kid))
    }
}

/// The JWT keys of one data directory.
#[derive(Debug, Clone)]
pub struct JwtStore {
    store: FileStore,
    files: FileJwtKeys,
    /// Where new keys are made (and keys with a recorded location live).
    backend: Arc<dyn JwtKeyBackend>,
    /// Opened keys by kid: an HSM key is opened (sessions, login, self-test) once, not on every
    /// check.
    opened: Arc<Mutex<HashMap<String, Arc<dyn CaKey>>>>,
}

impl JwtStore {
    /// Keys as files in the data directory.
    pub fn new(store: FileStore) -> Self {
        let files = FileJwtKeys::new(&store);
        Self::with_backend(store, Arc::new(files))
    }

    /// New keys made by `backend`; the state stays in the data directory.
    pub fn with_backend(store: FileStore, backend: Arc<dyn JwtKeyBackend>) -> Self {
        JwtStore {
            files: FileJwtKeys::new(&store),
            store,
            backend,
            opened: Arc::default(),
        }
    }

    /// How long a change waits for another writer of the data directory (see
    /// [`FileStore::with_lock_wait`]).
    pub fn with_lock_wait(mut self, wait: std::time::Duration) -> Self {
        self.store = self.store.with_lock_wait(wait);
        self
    }

    /// Where new keys are made: `file` or `pkcs11`.
    pub fn backend_kind(&self) -> &'static str {
        self.backend.kind()
    }

    pub fn dir(&self) -> PathBuf {
        self.store.dir().join("jwt")
    }

    fn state_path(&self) -> PathBuf {
        self.dir().join("state.json")
    }

    #[cfg(test)]
    fn key_path(&self, kid: &str) -> PathBuf {
        self.files.key_path(kid)
    }

    /// The keys as they are on disk (empty before the first [`Self::advance`]).
    pub fn load(&self) -> Result<JwtKeySet, StoreError> {
        let state = self.read_state()?;
        self.key_set(&state)
    }

    /// The keys `state.json` records and where each is, without opening any (no PIN needed).
    pub fn stored(&self) -> Result<(u64, Vec<StoredJwtKey>), StoreError> {
        let state = self.read_state()?;
        let keys = state
            .keys
            .iter()
            .map(|info| StoredJwtKey {
                info: info.clone(),
                location: match state.locations.get(&info.kid) {
                    Some(location) => location.clone(),
                    None => format!("file:{}", self.files.key_path(&info.kid).display()),
                },
            })
            .collect();
        Ok((state.sequence, keys))
    }

    /// Brings the keys up to date at `now` under the directory's lock: makes the first key,
    /// prepares, activates and drops per `schedule`, and returns the resulting set.
    pub fn advance(
        &self,
        now: OffsetDateTime,
        schedule: &JwtKeySchedule,
        algorithm: CaAlgorithm,
    ) -> Result<Advanced, StoreError> {
        JwtAlgorithm::for_key(algorithm).map_err(|e| self.state_error(&e.to_string()))?;
        schedule
            .check()
            .map_err(|e| self.state_error(&e.to_string()))?;
        let _lock = self.store.lock()?;
        let dir = self.dir();
        if !dir.is_dir() {
            fs::create_dir_all(&dir).map_err(|e| io(&dir, &e))?;
            crate::store::sync_dir(self.store.dir())?;
        }
        let mut state = self.read_state()?;
        self.files.remove_unnamed(&state)?;
        let mut steps = Vec::new();
        let mut dropped = Vec::new();
        while let Some(step) = keyset::plan(&state.keys, now, schedule) {
            let new_key = match step {
                JwtKeyStep::Generate { .. } => {
                    self.backend.check(algorithm)?;
                    let made = self.backend.generate(algorithm)?;
                    if let Some(location) = &made.location {
                        state.locations.insert(made.kid.clone(), location.clone());
                    }
                    self.remember(&made.kid, made.key);
                    Some((made.kid, algorithm))
                }
                JwtKeyStep::Drop(ref kid) => {
                    dropped.push((kid.clone(), state.locations.remove(kid)));
                    None
                }
                JwtKeyStep::Activate(_) => None,
            };
            keyset::apply(&mut state.keys, &step, now, schedule, new_key);
            steps.push(step);
            // Each step changes one key; a handful settle any state.
            if steps.len() > 8 {
                return Err(self.state_error("the JWT key plan does not settle"));
            }
        }
        if !steps.is_empty() {
            state.sequence += 1;
            self.write_state(&state)?;
            for (kid, location) in &dropped {
                self.forget(kid);
                self.backend_for(location.as_deref())
                    .delete(kid, location.as_deref())?;
            }
            crate::store::sync_dir(&dir)?;
            tracing::info!(steps = ?steps, backend = self.backend.kind(), "JWT signing keys changed");
        }
        Ok(Advanced {
            keys: self.key_set(&state)?,
            steps,
        })
    }

    /// File keys (no recorded location) are always files; others belong to the backend.
    fn backend_for(&self, location: Option<&str>) -> &dyn JwtKeyBackend {
        match location {
            None => &self.files,
            Some(_) => self.backend.as_ref(),
        }
    }

    fn remember(&self, kid: &str, key: Arc<dyn CaKey>) {
        if let Ok(mut opened) = self.opened.lock() {
            opened.insert(kid.to_owned(), key);
        }
    }

    fn forget(&self, kid: &str) {
        if let Ok(mut opened) = self.opened.lock() {
            opened.remove(kid);
        }
    }

    fn open(&self, kid: &str, location: Option<&str>) -> Result<Arc<dyn CaKey>, StoreError> {
        if let Some(key) = self.opened.lock().ok().and_then(|o| o.get(kid).cloned()) {
            return Ok(key);
        }
        let key = self.backend_for(location).load(kid, location)?;
        self.remember(kid, Arc::clone(&key));
        Ok(key)
    }

    fn key_set(&self, state: &State) -> Result<JwtKeySet, StoreError> {
        let mut keys = Vec::with_capacity(state.keys.len());
        for info in &state.keys {
            let location = state.locations.get(&info.kid).map(String::as_str);
            keys.push((info.clone(), self.open(&info.kid, location)?));
        }
        if let Ok(mut opened) = self.opened.lock() {
            opened.retain(|kid, _| state.keys.iter().any(|k| &k.kid == kid));
        }
        JwtKeySet::new(keys, state.sequence).map_err(|e: JwtError| self.state_error(&e.to_string()))
    }

    fn read_state(&self) -> Result<State, StoreError> {
        let path = self.state_path();
        match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| StoreError::State {
                path: path.display().to_string(),
                detail: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(io(&path, &e)),
        }
    }

    fn write_state(&self, state: &State) -> Result<(), StoreError> {
        let text = serde_json::to_string_pretty(state)
            .map_err(|e| self.state_error(&format!("serialising: {e}")))?;
        crate::store::write_public(&self.state_path(), &text)
    }

    fn state_error(&self, detail: &str) -> StoreError {
        StoreError::State {
            path: self.state_path().display().to_string(),
            detail: detail.to_owned(),
        }
    }
}

fn remove_if_present(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(path, &e)),
    }
}

fn io(path: &Path, e: &std::io::Error) -> StoreError {
    io_text(path, &e.to_string())
}

fn io_text(path: &Path, detail: &str) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        detail: detail.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use time::Duration;

    use super::*;
    use crate::jwt::JwtKeyPhase;

    fn schedule() -> JwtKeySchedule {
        JwtKeySchedule {
            rotation_period: Duration::hours(24),
            propagation: Duration::hours(1),
            max_lifetime: Duration::hours(1),
        }
    }

    fn store() -> (tempfile::TempDir, JwtStore) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = JwtStore::new(FileStore::new(dir.path()));
        (dir, store)
    }

    #[test]
    fn keys_are_made_once_kept_and_rotated_on_disk() {
        let (_dir, store) = store();
        let t0 = time::macros::datetime!(2026-01-01 00:00 UTC);
        let first = store
            .advance(t0, &schedule(), CaAlgorithm::EcdsaP256)
            .expect("first start");
        assert_eq!(first.steps, vec![JwtKeyStep::Generate { activate: true }]);
        let kid = first.keys.infos().next().expect("one key").kid.clone();
        let key_file = store.key_path(&kid);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&key_file)
                .expect("key file")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // A restart finds the same key.
        let again = store
            .advance(
                t0 + Duration::minutes(1),
                &schedule(),
                CaAlgorithm::EcdsaP256,
            )
            .expect("restart");
        assert!(again.steps.is_empty());
        assert_eq!(again.keys.infos().next().map(|k| &k.kid), Some(&kid));
        assert_eq!(store.load().expect("load").sequence(), 1);
        // Through a rotation: the old key file goes only when it is dropped.
        store
            .advance(
                t0 + Duration::hours(23),
                &schedule(),
                CaAlgorithm::EcdsaP256,
            )
            .expect("prepare");
        let rotated = store
            .advance(
                t0 + Duration::hours(24),
                &schedule(),
                CaAlgorithm::EcdsaP256,
            )
            .expect("activate");
        let phases: Vec<_> = rotated.keys.infos().map(|k| k.phase).collect();
        assert_eq!(phases, vec![JwtKeyPhase::Retired, JwtKeyPhase::Active]);
        assert!(key_file.exists());
        store
            .advance(
                t0 + Duration::hours(25),
                &schedule(),
                CaAlgorithm::EcdsaP256,
            )
            .expect("drop");
        assert!(!key_file.exists());
        assert_eq!(store.load().expect("load").infos().count(), 1);
    }

    #[test]
    fn a_key_file_no_state_names_is_removed() {
        let (_dir, store) = store();
        let t0 = time::macros::datetime!(2026-01-01 00:00 UTC);
        store
            .advance(t0, &schedule(), CaAlgorithm::EcdsaP256)
            .expect("first start");
        // What a crash between the key file and the state leaves.
        let orphan = store
            .files
            .generate(CaAlgorithm::EcdsaP256)
            .expect("orphan key")
            .kid;
        assert!(store.key_path(&orphan).exists());
        store
            .advance(t0, &schedule(), CaAlgorithm::EcdsaP256)
            .expect("restart");
        assert!(!store.key_path(&orphan).exists());
    }

    /// A backend that keeps keys in memory and records what it was asked.
    #[derive(Debug, Default)]
    struct Recording {
        keys: Mutex<HashMap<String, Arc<dyn CaKey>>>,
        deleted: Mutex<Vec<(String, Option<String>)>>,
    }

    impl JwtKeyBackend for Recording {
        fn kind(&self) -> &'static str {
            "recording"
        }
        fn check(&self, algorithm: CaAlgorithm) -> Result<(), StoreError> {
            match algorithm {
                CaAlgorithm::EcdsaP256 => Ok(()),
                other => Err(StoreError::JwtKey {
                    location: "memory".into(),
                    detail: format!("no {other} here"),
                }),
            }
        }
        fn generate(&self, algorithm: CaAlgorithm) -> Result<GeneratedJwtKey, StoreError> {
            let key: Arc<dyn CaKey> = Arc::new(MemoryKey::generate(algorithm).expect("key"));
            let kid = kid_of(key.as_ref());
            self.keys
                .lock()
                .expect("lock")
                .insert(kid.clone(), Arc::clone(&key));
            Ok(GeneratedJwtKey {
                location: Some(format!("memory:{kid}")),
                kid,
                key,
            })
        }
        fn load(&self, kid: &str, _: Option<&str>) -> Result<Arc<dyn CaKey>, StoreError> {
            self.keys
                .lock()
                .expect("lock")
                .get(kid)
                .cloned()
                .ok_or_else(|| StoreError::JwtKey {
                    location: "memory".into(),
                    detail: format!("no key {kid}"),
                })
        }
        fn delete(&self, kid: &str, location: Option<&str>) -> Result<(), StoreError> {
            self.keys.lock().expect("lock").remove(kid);
            self.deleted
                .lock()
                .expect("lock")
                .push((kid.to_owned(), location.map(str::to_owned)));
            Ok(())
        }
    }

    #[test]
    fn another_backend_holds_the_keys_and_the_state_records_where() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let t0 = time::macros::datetime!(2026-01-01 00:00 UTC);
        // A file key from before the backend changed: still loaded and dropped as a file.
        let legacy = JwtStore::new(FileStore::new(dir.path()))
            .advance(t0, &schedule(), CaAlgorithm::EcdsaP256)
            .expect("file key");
        let file_kid = legacy.keys.infos().next().expect("key").kid.clone();
        let backend = Arc::new(Recording::default());
        let store = JwtStore::with_backend(FileStore::new(dir.path()), backend.clone());
        assert_eq!(store.backend_kind(), "recording");
        store
            .advance(
                t0 + Duration::hours(23),
                &schedule(),
                CaAlgorithm::EcdsaP256,
            )
            .expect("prepare in the backend");
        let (_, stored) = store.stored().expect("stored");
        assert_eq!(stored.len(), 2);
        assert_eq!(
            stored[0].location,
            format!("file:{}", store.key_path(&file_kid).display())
        );
        let new_kid = stored[1].info.kid.clone();
        assert_eq!(stored[1].location, format!("memory:{new_kid}"));
        assert!(
            !store.key_path(&new_kid).exists(),
            "no file for a backend key"
        );
        // Activate, then drop the file key: the file goes, the backend is not asked.
        store
            .advance(
                t0 + Duration::hours(24),
                &schedule(),
                CaAlgorithm::EcdsaP256,
            )
            .expect("activate");
        store
            .advance(
                t0 + Duration::hours(25),
                &schedule(),
                CaAlgorithm::EcdsaP256,
            )
            .expect("drop the file key");
        assert!(!store.key_path(&file_kid).exists());
        assert!(backend.deleted.lock().expect("lock").is_empty());
        // Next rotation: the backend key is dropped through the backend, with its location.
        for hours in [47, 48, 49] {
            store
                .advance(
                    t0 + Duration::hours(hours),
                    &schedule(),
                    CaAlgorithm::EcdsaP256,
                )
                .expect("rotate");
        }
        assert_eq!(
            *backend.deleted.lock().expect("lock"),
            vec![(new_kid.clone(), Some(format!("memory:{new_kid}")))]
        );
        let text = fs::read_to_string(store.state_path()).expect("state");
        assert!(
            !text.contains(&new_kid),
            "a dropped key leaves the state: {text}"
        );
        // The backend refuses an algorithm before anything changes.
        let fresh = tempfile::tempdir().expect("a temporary directory");
        let err = JwtStore::with_backend(FileStore::new(fresh.path()), backend)
            .advance(t0, &schedule(), CaAlgorithm::EcdsaP384)
            .expect_err("refused");
        assert_eq!(
            err.to_string(),
            "JWT signing keys in memory: no ecdsa-p384 here"
        );
    }

    /// The store, its key set and the files backend print no JWT private key, in any encoding
    /// of the key file's DER.
    #[test]
    fn debug_shows_no_jwt_private_key() {
        let (_dir, store) = store();
        let advanced = store
            .advance(
                OffsetDateTime::now_utc(),
                &schedule(),
                CaAlgorithm::EcdsaP256,
            )
            .expect("the first key");
        let kid = advanced.keys.infos().next().expect("a key").kid.clone();
        let pem = fs::read_to_string(store.key_path(&kid)).expect("the key file");
        let der = pem::parse(&pem).expect("PEM").into_contents();
        let loaded = store.load().expect("load");
        crate::backend::contract::assert_debug_hides(
            &format!("{store:?} {advanced:?} {loaded:?}"),
            crate::backend::contract::Secret::Pkcs8Der(&der),
        );
    }

    #[test]
    fn an_ed25519_jwt_key_is_refused() {
        let (_dir, store) = store();
        let err = store
            .advance(OffsetDateTime::now_utc(), &schedule(), CaAlgorithm::Ed25519)
            .expect_err("EdDSA is not a JWT-SVID algorithm");
        assert!(
            err.to_string()
                .contains("Ed25519 (EdDSA) is not a JWT-SVID algorithm"),
            "{err}"
        );
    }
}
