//! The credential-bundle keeper (`podca dev --bundle NS/SA[:KEY_TYPE]`, `[dev] bundles`): keeps
//! a kubelet-layout credential bundle on disk for chosen identities, the way kubelet keeps a
//! pod's: `<dir>/credentialbundle.pem` (the PKCS#8 key, then the chain) and
//! `<dir>/trust-bundle.pem`, renewed at beginRefreshAt and whenever the CA changes. Every
//! certificate goes through the same [`Api::issue_for_key`] as the gRPC API's, so it is
//! decided by the same policy and recorded in the same ledger.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use podca_authority::config::DevBundle;
use podca_authority::{CaSnapshot, Runtime, Stage};
use podca_signer::KeyType;
use podca_signer::keys::GeneratedKey;
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::Api;
use crate::auth::Identity;
use crate::core::IssuedVia;
use crate::errors::ApiError;

/// A bundle could not be written this time (retried in [`RETRY`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeepError {
    #[error("generating a {key_type} key: {message}")]
    Key { key_type: KeyType, message: String },
    #[error(transparent)]
    Refused(#[from] ApiError),
    #[error("creating {}: {error}", .path.display())]
    Dir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] podca_signer::StoreError),
}

/// How long a failed bundle waits before the next try.
pub const RETRY: Duration = Duration::from_secs(30);

/// Where a kept bundle lives.
#[derive(Debug, Clone)]
pub struct KeptBundle {
    /// `namespace/service-account`.
    pub identity: String,
    pub dir: PathBuf,
}

/// Keeps a bundle for each of `bundles` under `<root>/<namespace>/<service-account>/`.
pub fn start(
    rt: &mut Runtime,
    api: &Arc<Api>,
    bundles: Vec<DevBundle>,
    root: &Path,
) -> Vec<KeptBundle> {
    bundles
        .into_iter()
        .map(|spec| {
            let dir = root.join(&spec.namespace).join(&spec.service_account);
            let identity = format!("{}/{}", spec.namespace, spec.service_account);
            let (api, kept) = (Arc::clone(api), dir.clone());
            rt.spawn(
                Stage::Serve,
                format!("credential bundle {identity}"),
                |stop| keep(api, spec, kept, stop),
            );
            KeptBundle { identity, dir }
        })
        .collect()
}

/// Keeps one bundle fresh until `stop`.
async fn keep(api: Arc<Api>, spec: DevBundle, dir: PathBuf, mut stop: watch::Receiver<bool>) {
    let identity = Identity::service_account(&spec.namespace, &spec.service_account);
    let mut ca = api.ca_for("", &spec.namespace).subscribe();
    loop {
        let snapshot = Arc::clone(&ca.borrow_and_update());
        let wait = match write(&api, &identity, spec.key_type, snapshot, &dir).await {
            Ok(refresh_at) => (refresh_at - OffsetDateTime::now_utc())
                .try_into()
                .unwrap_or_default(),
            Err(e) => {
                eprintln!(
                    "podca dev: credential bundle for {}: {e}; retrying in {} s",
                    identity.key(),
                    RETRY.as_secs()
                );
                RETRY
            }
        };
        tokio::select! {
            changed = ca.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(wait) => {},
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Issues and writes one bundle; returns its beginRefreshAt.
async fn write(
    api: &Api,
    identity: &Identity,
    key_type: KeyType,
    snapshot: Arc<CaSnapshot>,
    dir: &Path,
) -> Result<OffsetDateTime, KeepError> {
    // The signer's key generator writes PKCS#8 v1, which every TLS stack reads (Ed25519 too).
    let key = tokio::task::spawn_blocking(move || GeneratedKey::generate(key_type))
        .await
        .map_err(|e| KeepError::Key {
            key_type,
            message: e.to_string(),
        })?
        .map_err(|e| KeepError::Key {
            key_type,
            message: e.to_string(),
        })?;
    let issued = api
        .issue_for_key(identity, key.public.clone(), snapshot, IssuedVia::DevBundle)
        .await?;
    std::fs::create_dir_all(dir).map_err(|error| KeepError::Dir {
        path: dir.to_owned(),
        error,
    })?;
    let mut credential = key.private_key_pem();
    credential.push_str(&issued.certificate.chain_pem);
    write_atomic(&dir.join("credentialbundle.pem"), &credential, 0o600)?;
    write_atomic(&dir.join("trust-bundle.pem"), &issued.anchors_pem, 0o644)?;
    Ok(issued.certificate.validity.begin_refresh_at)
}

/// Writes `path` whole or not at all (a temporary file, synced, then renamed over it).
fn write_atomic(path: &Path, contents: &str, mode: u32) -> Result<(), KeepError> {
    Ok(podca_signer::store::write_atomic(
        path,
        contents.as_bytes(),
        mode,
    )?)
}
