//! The JWT keys in the data directory, beside the CA generations:
//!
//! ```text
//! <dir>/jwt/state.json     the keys and their phases (written atomically)
//! <dir>/jwt/<kid>.key      each key, PKCS#8 PEM, mode 0600
//! ```
//!
//! Crash safety follows the CA store's (see [`crate::store`]): every change holds the data
//! directory's writer lock; a new key file is written (mode 0600 from the start, fsynced) before
//! any state names it; `state.json` is replaced atomically with the CA store's helper; a dropped
//! key's file is removed only after the state no longer names it. So a writer killed anywhere
//! leaves the old or the new state, plus at most a key file no state names, which the next
//! change removes (it never signed anything).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::keyset::{self, JwtKeyInfo, JwtKeySchedule, JwtKeySet, JwtKeyStep, kid_of};
use super::{JwtAlgorithm, JwtError};
use crate::backend::{CaAlgorithm, CaKey, FileKey, MemoryKey};
use crate::store::{FileStore, StoreError};

/// `jwt/state.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct State {
    /// Bumped on every change: the bundle's `spiffe_sequence`.
    sequence: u64,
    keys: Vec<JwtKeyInfo>,
}

/// What [`JwtStore::advance`] did.
#[derive(Debug)]
pub struct Advanced {
    pub keys: JwtKeySet,
    pub steps: Vec<JwtKeyStep>,
}

/// The JWT keys of one data directory.
#[derive(Debug, Clone)]
pub struct JwtStore {
    store: FileStore,
}

impl JwtStore {
    pub fn new(store: FileStore) -> Self {
        JwtStore { store }
    }

    pub fn dir(&self) -> PathBuf {
        self.store.dir().join("jwt")
    }

    fn state_path(&self) -> PathBuf {
        self.dir().join("state.json")
    }

    fn key_path(&self, kid: &str) -> PathBuf {
        self.dir().join(format!("{kid}.key"))
    }

    /// The keys as they are on disk (empty before the first [`Self::advance`]).
    pub fn load(&self) -> Result<JwtKeySet, StoreError> {
        let state = self.read_state()?;
        self.key_set(&state)
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
            .map_err(|detail| self.state_error(&detail))?;
        let _lock = self.store.lock()?;
        let dir = self.dir();
        if !dir.is_dir() {
            fs::create_dir_all(&dir).map_err(|e| io(&dir, &e))?;
            crate::store::sync_dir(self.store.dir())?;
        }
        let mut state = self.read_state()?;
        self.remove_unnamed_keys(&state)?;
        let mut steps = Vec::new();
        while let Some(step) = keyset::plan(&state.keys, now, schedule) {
            let new_key = match step {
                JwtKeyStep::Generate { .. } => Some((self.generate(algorithm)?, algorithm)),
                _ => None,
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
            for step in &steps {
                if let JwtKeyStep::Drop(kid) = step {
                    remove_if_present(&self.key_path(kid))?;
                }
            }
            crate::store::sync_dir(&dir)?;
            tracing::info!(steps = ?steps, "JWT signing keys changed");
        }
        Ok(Advanced {
            keys: self.key_set(&state)?,
            steps,
        })
    }

    /// Writes a new key file and returns its kid.
    fn generate(&self, algorithm: CaAlgorithm) -> Result<String, StoreError> {
        let key = MemoryKey::generate(algorithm).map_err(|e| self.state_error(&e.to_string()))?;
        let kid = kid_of(&key);
        let path = self.key_path(&kid);
        FileKey::store(&path, key).map_err(|e| io_text(&path, &e.to_string()))?;
        Ok(kid)
    }

    fn key_set(&self, state: &State) -> Result<JwtKeySet, StoreError> {
        let mut keys = Vec::with_capacity(state.keys.len());
        for info in &state.keys {
            let path = self.key_path(&info.kid);
            let key = FileKey::load(&path).map_err(|e| io_text(&path, &e.to_string()))?;
            keys.push((info.clone(), Arc::new(key) as Arc<dyn CaKey>));
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

    /// Removes key files no state names: a crash between writing a key and the state.
    fn remove_unnamed_keys(&self, state: &State) -> Result<(), StoreError> {
        let dir = self.dir();
        let entries = fs::read_dir(&dir).map_err(|e| io(&dir, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io(&dir, &e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let named = name
                .strip_suffix(".key")
                .is_some_and(|kid| state.keys.iter().any(|k| k.kid == kid));
            let leftover = (name.ends_with(".key") && !named) || name.starts_with(".tmp-");
            if leftover {
                remove_if_present(&entry.path())?;
                tracing::warn!(file = %entry.path().display(), "removed a JWT key file no state names");
            }
        }
        Ok(())
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
        let orphan = store.generate(CaAlgorithm::EcdsaP256).expect("orphan key");
        assert!(store.key_path(&orphan).exists());
        store
            .advance(t0, &schedule(), CaAlgorithm::EcdsaP256)
            .expect("restart");
        assert!(!store.key_path(&orphan).exists());
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
