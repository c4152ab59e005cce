//! The file CA key: a PKCS#8 PEM file, written with mode 0600.

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{BackendError, CaAlgorithm, CaKey, MemoryKey};

/// A CA key loaded from a PEM file on disk.
pub struct FileKey {
    path: PathBuf,
    key: MemoryKey,
}

impl fmt::Debug for FileKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileKey")
            .field("path", &self.path)
            .field("algorithm", &self.key.algorithm())
            .field("private_key", &"<redacted>")
            .finish()
    }
}

impl FileKey {
    /// Loads the key at `path` (PKCS#8, SEC1 or PKCS#1 PEM). A file others may read or write
    /// (any of the mode's "other" bits) is refused: podca writes 0600, so such a key has been
    /// exposed or tampered with. Group bits are allowed: Kubernetes volumes with an `fsGroup`
    /// (podca's manifests set one) give every file group read and write.
    pub fn load(path: &Path) -> Result<Self, BackendError> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(path)
                .map_err(|e| io_error(path, &e))?
                .permissions()
                .mode();
            if mode & 0o007 != 0 {
                return Err(BackendError::Io {
                    path: path.display().to_string(),
                    detail: format!(
                        "mode {:o} lets other users read or write the private key; refusing it \
                         (chmod o-rwx, and consider the key exposed)",
                        mode & 0o777
                    ),
                });
            }
        }
        let pem =
            zeroize::Zeroizing::new(fs::read_to_string(path).map_err(|e| io_error(path, &e))?);
        let pair = super::key_pair_from_pem(&pem, &path.display().to_string())?;
        Ok(FileKey {
            path: path.to_owned(),
            key: MemoryKey::from_pair(pair)?,
        })
    }

    /// Generates a key and writes it to `path` as PKCS#8 PEM with mode 0600. Refuses to
    /// overwrite an existing file.
    pub fn create(path: &Path, algorithm: CaAlgorithm) -> Result<Self, BackendError> {
        let key = MemoryKey::generate(algorithm)?;
        write_private(path, key.pkcs8_pem()?.as_bytes())?;
        Ok(FileKey {
            path: path.to_owned(),
            key,
        })
    }

    /// Writes an existing key (for example an imported one) to `path` with mode 0600.
    pub fn store(path: &Path, key: MemoryKey) -> Result<Self, BackendError> {
        write_private(path, key.pkcs8_pem()?.as_bytes())?;
        Ok(FileKey {
            path: path.to_owned(),
            key,
        })
    }

    /// The key file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl CaKey for FileKey {
    fn algorithm(&self) -> CaAlgorithm {
        self.key.algorithm()
    }

    fn public_key_raw(&self) -> &[u8] {
        self.key.public_key_raw()
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        self.key.sign(message)
    }

    fn location(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn signs_quickly_in_process(&self) -> bool {
        self.key.signs_quickly_in_process()
    }
}

/// Creates `path` with mode 0600 from the start (never world-readable, not even briefly) and
/// syncs it, so a crash cannot leave a half-written key behind a success.
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> Result<(), BackendError> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(|e| io_error(path, &e))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(path, &e))
}

fn io_error(path: &Path, e: &std::io::Error) -> BackendError {
    BackendError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}
