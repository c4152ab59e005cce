//! The process-wide PKCS#11 module registry and epoch-tagged sessions.
//!
//! `C_Initialize`/`C_Finalize` act on the whole process, so each library is loaded once and
//! shared by every key that uses it; re-initialising it bumps an epoch that retires every
//! session opened before.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::session::Session;

use super::fault::describe;
use crate::backend::BackendError;

/// Minimum time between two re-initialisations of one PKCS#11 module (process-wide).
pub const REINIT_INTERVAL: Duration = Duration::from_secs(1);

pub(super) struct Module {
    path: PathBuf,
    /// Read-locked around every PKCS#11 call; write-locked to re-initialise.
    ctx: RwLock<Pkcs11>,
    /// Bumped by each re-initialisation; sessions of an older epoch are dead.
    epoch: AtomicU64,
    last_reinit: Mutex<Option<Instant>>,
}

static MODULES: Mutex<Vec<Arc<Module>>> = Mutex::new(Vec::new());

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep going with it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn init_args() -> CInitializeArgs {
    CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)
}

impl Module {
    pub(super) fn get(path: &PathBuf) -> Result<Arc<Module>, BackendError> {
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

    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, Pkcs11> {
        self.ctx.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Finalises and initialises the library again, unless someone did since `seen_epoch` or
    /// it was done less than [`REINIT_INTERVAL`] ago. Returns whether it re-initialised.
    pub(super) fn reinitialize(&self, seen_epoch: u64) -> bool {
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
pub(super) struct TaggedSession {
    pub(super) session: Option<Session>,
    pub(super) epoch: u64,
    pub(super) module: Arc<Module>,
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
