//! The JWT-key component of a data-directory CA (`[jwt] enabled`): keys in `<dir>/jwt/`, or in
//! the CA's token with `[ca] pkcs11`. Its rotation mode is decided here, once: the keys are only
//! followed when the directory is read-only, rotated by the leader only when replicas share the
//! directory (`--leader-elect`; standbys follow), and rotated by this process otherwise. A
//! Secret-held CA's keys are `podca_controller::jwt_secret::component`'s.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::components::ca::{LOCK_WAIT, dir_writable};
use crate::config::CaConfig;
use crate::jwt::{self, JwtConfig, JwtHandle, JwtRotation, JwtRotator};
use crate::runtime::{Runtime, Stage};

/// How often the JWT key driver looks at the data directory (other writers' changes).
pub const POLL: Duration = Duration::from_secs(5);

/// The JWT signing keys could not be opened or brought up to date.
#[derive(Debug, thiserror::Error)]
#[error("the JWT signing keys ([jwt])")]
pub struct JwtStartError(#[source] jwt::JwtStoreError);

/// Opens the keys of the CA data directory `ca` names (`ca_dir`), brings them up to date once (making the
/// first key on a first start, unless only followed) and spawns their driver. `None` when
/// `[jwt] enabled = false`.
pub fn start(
    rt: &mut Runtime,
    config: &JwtConfig,
    ca: &CaConfig,
    ca_dir: &Path,
    leader_elect: bool,
) -> Result<Option<JwtHandle>, JwtStartError> {
    if !config.enabled {
        return Ok(None);
    }
    let store = jwt::open_store(ca)
        .map_err(JwtStartError)?
        .with_lock_wait(LOCK_WAIT);
    let rotation = if !dir_writable(ca_dir) {
        info!(
            dir = %ca_dir.display(),
            "the CA data directory is read-only: JWT keys are followed, not rotated"
        );
        JwtRotation::Follow
    } else if leader_elect {
        info!("JWT key rotation runs on the leader only (--leader-elect); standbys follow");
        JwtRotation::WhileLeading(rt.leadership().subscribe())
    } else {
        JwtRotation::Automatic
    };
    let rotator = JwtRotator::start_with(store, config, Arc::clone(rt.clock()), POLL, rotation)
        .map_err(JwtStartError)?
        .with_metrics(Arc::clone(rt.metrics()));
    if rotator.handle().current().infos().next().is_none() {
        warn!("no JWT signing key in the data directory yet: no JWT-SVID is signed until one is");
    }
    let rotator = Arc::new(rotator);
    let handle = rotator.handle().clone();
    rt.spawn(Stage::Support, "JWT key rotation driver", |stop| {
        rotator.run(stop)
    });
    Ok(Some(handle))
}
