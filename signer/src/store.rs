//! The file CA store: a data directory that holds a root CA and an issuing intermediate.
//!
//! ```text
//! <dir>/root.pem      root certificate (trust anchor)
//! <dir>/root.key      root private key, PKCS#8 PEM, mode 0600 (absent for an imported CA
//!                     whose root key stays elsewhere)
//! <dir>/issuing.pem   issuing certificate, then any intermediates up to the root
//! <dir>/issuing.key   issuing private key, PKCS#8 PEM, mode 0600
//! <dir>/ledger.redb   the issuance ledger
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use time::{Duration, OffsetDateTime};

use crate::backend::{BackendError, CaAlgorithm, CaKey, FileKey, MemoryKey};
use crate::ca::{CaCertificate, CaError, IssuingCa};

/// Why the store could not be created or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
}

/// Options for a new CA.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub algorithm: CaAlgorithm,
    /// Common name prefix; the root gets "<name> root", the issuing CA "<name> issuing".
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
    pub fn root_cert_path(&self) -> PathBuf {
        self.dir.join("root.pem")
    }
    pub fn root_key_path(&self) -> PathBuf {
        self.dir.join("root.key")
    }
    pub fn issuing_cert_path(&self) -> PathBuf {
        self.dir.join("issuing.pem")
    }
    pub fn issuing_key_path(&self) -> PathBuf {
        self.dir.join("issuing.key")
    }
    pub fn ledger_path(&self) -> PathBuf {
        self.dir.join("ledger.redb")
    }

    /// Whether a CA exists here.
    pub fn is_initialised(&self) -> bool {
        self.issuing_cert_path().exists()
    }

    /// Creates a root and an issuing intermediate with fresh keys.
    pub fn init(&self, options: &InitOptions, now: OffsetDateTime) -> Result<IssuingCa, StoreError> {
        self.prepare_dir()?;
        let root_key = FileKey::create(&self.root_key_path(), options.algorithm)
            .map_err(|e| self.backend_error(e))?;
        let root = IssuingCa::self_signed_root(
            Arc::new(root_key),
            &format!("{} root", options.name),
            now,
            options.root_validity,
        )
        .map_err(|e| self.ca_error(&self.root_cert_path(), e))?;
        let issuing_key = FileKey::create(&self.issuing_key_path(), options.algorithm)
            .map_err(|e| self.backend_error(e))?;
        let issuing = root
            .sign_intermediate(
                Arc::new(issuing_key),
                &format!("{} issuing", options.name),
                now,
                options.issuing_validity,
            )
            .map_err(|e| self.ca_error(&self.issuing_cert_path(), e))?;
        write_public(&self.root_cert_path(), &root.certificate().pem())?;
        // The issuing file is written last: its presence marks a complete CA.
        write_public(&self.issuing_cert_path(), &issuing.chain_pem())?;
        Ok(issuing)
    }

    /// Imports an existing CA (made by openssl, cfssl, …): `cert_pem` is the CA certificate
    /// that will sign leaves, optionally followed by intermediates and the root; `key_pem` is
    /// its private key; `roots_pem` names the trust anchors when `cert_pem` does not end in one.
    pub fn import(
        &self,
        cert_pem: &str,
        key_pem: &str,
        roots_pem: Option<&str>,
    ) -> Result<IssuingCa, StoreError> {
        let key = MemoryKey::from_pem(key_pem).map_err(|e| self.backend_error(e))?;
        // Validate everything before writing anything.
        let probe = IssuingCa::from_pem(Arc::new(
            MemoryKey::from_pem(key_pem).map_err(|e| self.backend_error(e))?,
        ), cert_pem, roots_pem)
        .map_err(|e| self.ca_error(Path::new("<imported certificate>"), e))?;
        self.prepare_dir()?;
        let key = FileKey::store(&self.issuing_key_path(), key).map_err(|e| self.backend_error(e))?;
        let roots = probe.roots_pem();
        write_public(&self.root_cert_path(), &roots)?;
        let mut chain = probe.chain_pem();
        if chain.is_empty() {
            // The imported certificate is itself the root.
            chain = probe.certificate().pem();
        }
        write_public(&self.issuing_cert_path(), &chain)?;
        IssuingCa::from_pem(Arc::new(key), &chain, Some(&roots))
            .map_err(|e| self.ca_error(&self.issuing_cert_path(), e))
    }

    /// Loads the issuing CA with its file key.
    pub fn load(&self) -> Result<IssuingCa, StoreError> {
        let key = self.load_issuing_key()?;
        self.load_with_key(Arc::new(key))
    }

    /// Loads the issuing CA's certificates with a key held elsewhere (e.g. an HSM).
    pub fn load_with_key(&self, key: Arc<dyn CaKey>) -> Result<IssuingCa, StoreError> {
        if !self.is_initialised() {
            return Err(StoreError::NotInitialised {
                dir: self.dir.display().to_string(),
            });
        }
        let chain = read(&self.issuing_cert_path())?;
        let roots = read(&self.root_cert_path())?;
        IssuingCa::from_pem(key, &chain, Some(&roots))
            .map_err(|e| self.ca_error(&self.issuing_cert_path(), e))
    }

    /// The trust anchors, without touching any key.
    pub fn roots(&self) -> Result<Vec<CaCertificate>, StoreError> {
        let path = self.root_cert_path();
        let text = read(&path)?;
        CaCertificate::all_from_pem(&text).map_err(|e| self.ca_error(&path, e.into()))
    }

    fn load_issuing_key(&self) -> Result<FileKey, StoreError> {
        if !self.is_initialised() {
            return Err(StoreError::NotInitialised {
                dir: self.dir.display().to_string(),
            });
        }
        FileKey::load(&self.issuing_key_path()).map_err(|e| self.backend_error(e))
    }

    fn prepare_dir(&self) -> Result<(), StoreError> {
        for path in [
            self.issuing_cert_path(),
            self.issuing_key_path(),
            self.root_key_path(),
            self.root_cert_path(),
        ] {
            if path.exists() {
                return Err(StoreError::AlreadyInitialised {
                    dir: self.dir.display().to_string(),
                    file: path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
                });
            }
        }
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
                path: self.issuing_key_path().display().to_string(),
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
