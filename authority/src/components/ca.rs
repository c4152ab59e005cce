//! The CA component: where the CA comes from and how it is driven, decided once.
//!
//! [`plan`] reads `[ca]`: a data directory (file or PKCS#11 keys) is opened here, so a wrong
//! PIN, a missing token or a broken directory is a start-up error rather than a stream of
//! pending requests; a Secret is left to `podca_controller::secret_ca::component`, which opens
//! it once the Kubernetes API is reachable. [`DirectoryCa::start`] spawns the rotation driver:
//! it runs the `[rotation]` schedule itself only when the configuration asks for it, the
//! directory is writable, and replicas do not share it (`--leader-elect`); it always follows
//! other writers' changes (`podca ca rotate`) within [`POLL`].

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use podca_signer::StoreError;
use podca_signer::rotation::ScheduleError;
use tracing::info;

use crate::ca::{self, CaSource, OpenError};
use crate::config::{CaConfig, Config, SecretCa};
use crate::hsm_metrics::HsmMetrics;
use crate::rotation::{Rotator, RotatorOptions};
use crate::runtime::{Runtime, Stage};
use crate::trust::CaHandle;

/// How often the rotation driver looks at the data directory (other writers' changes).
pub const POLL: Duration = Duration::from_secs(5);

/// How long a driver on the async runtime waits for another writer of the data directory per
/// tick (a CLI command holding its lock); it retries at the next tick rather than block.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The CA could not be opened. Each message carries its cause (one line, as printed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaStartError {
    #[error("repairing the CA data directory {}: {error}", .dir.display())]
    Repair {
        dir: std::path::PathBuf,
        error: StoreError,
    },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("opening the CA: {0}")]
    Load(OpenError),
    #[error("[rotation] in the config file: {0}")]
    Schedule(ScheduleError),
}

impl From<ScheduleError> for CaStartError {
    fn from(error: ScheduleError) -> Self {
        CaStartError::Schedule(error)
    }
}

/// Where the CA comes from, decided by [`plan`].
#[derive(Debug)]
pub enum CaPlan {
    /// A data directory, opened.
    Directory(DirectoryCa),
    /// A `kubernetes.io/tls` Secret, opened through the API by the controller crate.
    Secret(SecretCa),
}

/// A CA data directory, opened: its active CA and how its driver runs.
pub struct DirectoryCa {
    handle: CaHandle,
    rotator: RotatorOptions,
    hsm: Option<crate::ca::HsmKeySlot>,
}

impl std::fmt::Debug for DirectoryCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectoryCa")
            .field("dir", &self.rotator.store.dir())
            .field("automatic", &self.rotator.automatic)
            .field("hsm", &self.hsm.is_some())
            .finish_non_exhaustive()
    }
}

/// A running directory CA: the handle every component reads, and the driver (`podca dev`
/// reloads through it on SIGHUP).
#[derive(Debug, Clone)]
pub struct RunningCa {
    pub handle: CaHandle,
    pub rotator: Arc<Rotator>,
}

/// Decides where `config`'s CA comes from and opens a data directory. `leader_elect`: replicas
/// share the CA, so this process never rotates it on its own.
pub fn plan(config: &Config, leader_elect: bool) -> Result<CaPlan, CaStartError> {
    if let CaConfig::Secret(secret) = &config.ca {
        config.rotation.validate()?;
        return Ok(CaPlan::Secret(secret.clone()));
    }
    let max_leaf_lifetime = config.max_leaf_lifetime();
    let source = ca::open(&config.ca, max_leaf_lifetime)?;
    let writable = dir_writable(source.store.dir());
    if writable {
        // A writer killed mid-change left the directory half-way: finish or roll back first
        // (under the directory's lock, which every writer shares).
        source
            .store
            .recover()
            .map_err(|error| CaStartError::Repair {
                dir: source.store.dir().to_owned(),
                error,
            })?;
    }
    let (active, anchors) = source.load().map_err(CaStartError::Load)?;
    let automatic = automatic_rotation(&source, leader_elect, writable);
    if automatic {
        config.rotation.validate()?;
    }
    let CaSource {
        store,
        open,
        hsm,
        intermediate,
        automatic_rotation: _,
    } = source;
    Ok(CaPlan::Directory(DirectoryCa {
        handle: CaHandle::new(active, anchors),
        rotator: RotatorOptions {
            store: store.with_lock_wait(LOCK_WAIT),
            schedule: config.rotation,
            automatic,
            max_leaf_lifetime,
            poll: POLL,
            open,
            refresh_when: intermediate,
        },
        hsm,
    }))
}

impl DirectoryCa {
    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.rotator.store.dir()
    }

    /// The data directory's redb ledger, for a `[ledger]` that names no path.
    pub fn ledger_path(&self) -> std::path::PathBuf {
        self.rotator.store.ledger_path()
    }

    /// The CA as opened, before its driver runs.
    pub fn handle(&self) -> &CaHandle {
        &self.handle
    }

    /// Spawns the rotation driver and (HSM) the `podca_hsm_*` exporter.
    pub fn start(self, rt: &mut Runtime) -> RunningCa {
        let DirectoryCa {
            handle,
            rotator,
            hsm,
        } = self;
        let rotator = Arc::new(Rotator::new(
            rotator,
            handle.clone(),
            Arc::clone(rt.clock()),
            Arc::clone(rt.metrics()),
        ));
        let driver = Arc::clone(&rotator);
        rt.spawn(Stage::Support, "CA rotation driver", |stop| {
            driver.run(stop)
        });
        if let Some(slot) = hsm {
            let metrics = rt.metrics().register_component("hsm", HsmMetrics::register);
            rt.spawn(Stage::Support, "HSM metrics", |stop| {
                metrics.export(slot, stop)
            });
        }
        RunningCa { handle, rotator }
    }
}

/// Whether the rotation driver takes scheduled steps: when the configuration asks for it,
/// unless replicas share the directory (`--leader-elect`) or it is read-only; either is logged.
fn automatic_rotation(source: &CaSource, leader_elect: bool, writable: bool) -> bool {
    let configured = source.automatic_rotation;
    if configured && leader_elect {
        // Replicas do not share a writable data directory: each would make its own CA.
        info!(
            "automatic CA rotation is off with --leader-elect; rotate with `podca ca \
             rotate` on the CA data directory (every replica follows the change without \
             a restart)"
        );
        return false;
    }
    if configured && !writable {
        info!(
            dir = %source.store.dir().display(),
            "the CA data directory is read-only: automatic CA rotation is off (changes \
             to it are still followed)"
        );
        return false;
    }
    configured
}

/// Whether podca may write the CA state in `dir` (a Secret mount is read-only).
pub fn dir_writable(dir: &Path) -> bool {
    let probe = dir.join(format!(".podca-write-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            true
        }
        Err(_) => false,
    }
}
