//! Opening the CA a [`CaConfig`] names, in one place for `podca serve`, `podca dev` and the
//! command line: a CA data directory with file keys, or one whose keys are held in an HSM over
//! PKCS#11 (in either mode: the HSM key signs every leaf, or it signs a short-lived in-memory
//! intermediate, see [`crate::intermediate`]). A Secret-held CA is read through the Kubernetes
//! API by `podca_controller`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use podca_signer::backend::{
    BackendError, CaAlgorithm, PinSource, Pkcs11Config, Pkcs11Key, Pkcs11Uri,
};
use podca_signer::{CaCertificate, CaError, CaKey, FileStore, IssuingCa, StoreError};
use time::{Duration, OffsetDateTime};

use crate::config::{CaConfig, FileCa, Pkcs11Ca, Pkcs11Mode};
use crate::intermediate::Intermediate;

/// Where the command line keeps the CA unless `--dir` (or `PODCA_DATA_DIR`, clap's default of
/// it) says otherwise: `$XDG_DATA_HOME/podca`, else `~/.local/share/podca`, else `./.podca`.
/// `crate::cli_pages` documents this rule: change both.
pub fn default_data_dir() -> PathBuf {
    data_dir_from(std::env::var_os("XDG_DATA_HOME"), std::env::var_os("HOME"))
}

fn data_dir_from(xdg_data_home: Option<OsString>, home: Option<OsString>) -> PathBuf {
    match (
        xdg_data_home.filter(|d| !d.is_empty()),
        home.filter(|d| !d.is_empty()),
    ) {
        (Some(dir), _) => PathBuf::from(dir).join("podca"),
        (None, Some(home)) => PathBuf::from(home).join(".local/share/podca"),
        (None, None) => PathBuf::from(".podca"),
    }
}

/// Opens the active CA of a store (file key, or a key held in an HSM).
pub type Opener = Arc<dyn Fn(&FileStore) -> Result<IssuingCa, OpenError> + Send + Sync>;

/// The HSM key most recently opened by the opener (its statistics feed the `podca_hsm_*`
/// metrics); empty until the first open.
pub type HsmKeySlot = Arc<Mutex<Option<Arc<Pkcs11Key>>>>;

/// Why a CA could not be opened. Messages name the input and what to change; never a PIN.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error(
        "[ca] dir is required for the {backend} backend (the CA data directory made by `podca ca \
         init`)"
    )]
    NoDir { backend: &'static str },
    #[error("{} holds no CA yet; run `podca ca init --dir {}` first", .dir.display(), .dir.display())]
    NotInitialised { dir: PathBuf },
    #[error(
        "the active CA key in {} is held in an HSM ({location}); set [ca] backend = \"pkcs11\" and \
         pkcs11_pin_file (or pkcs11_pin_env)",
        .dir.display()
    )]
    KeyInHsm { dir: PathBuf, location: String },
    #[error(
        "[ca] backend = \"pkcs11\", but the active CA key in {} is a file; set backend = \"file\" \
         or pkcs11_uri",
        .dir.display()
    )]
    KeyIsFile { dir: PathBuf },
    #[error(
        "the CA key is in an HSM ({location}): give --pkcs11-pin-file FILE or --pkcs11-pin-env VAR"
    )]
    NoPin { location: String },
    #[error(
        "[ca] intermediate_lifetime_seconds ({lifetime_seconds}) must be at least three times the \
         largest max_lifetime_seconds ({max_leaf_seconds}): the intermediate is re-issued at two \
         thirds of its life and must still outlive every leaf"
    )]
    IntermediateTooShort {
        lifetime_seconds: i64,
        max_leaf_seconds: i64,
    },
    #[error(
        "[ca] backend = \"secret\" ({namespace}/{name}) is read through the Kubernetes API: only \
         `podca serve` opens it"
    )]
    HeldInSecret { namespace: String, name: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading the trust anchors: {0}")]
    Anchors(#[source] StoreError),
    #[error("{location}: {source}")]
    Uri {
        location: String,
        #[source]
        source: BackendError,
    },
    #[error("opening {location}: {source}")]
    Hsm {
        location: String,
        #[source]
        source: BackendError,
    },
    /// The active CA certificate's key is of an algorithm the PKCS#11 backend cannot sign
    /// with (ML-DSA, Ed25519): said before the token is touched (issue #18).
    #[error("[ca] backend = \"pkcs11\", but {} certifies an {algorithm} key: {detail}", .path.display())]
    AlgorithmNotInHsm {
        path: PathBuf,
        algorithm: CaAlgorithm,
        /// The backend's refusal, naming the algorithms it supports.
        detail: String,
    },
    #[error("generating the in-memory intermediate key: {0}")]
    IntermediateKey(#[source] BackendError),
    #[error("the HSM could not sign the in-memory intermediate: {0}")]
    IntermediateSignature(#[source] CaError),
}

/// An opened CA source: the store, how to open its active CA, and (HSM) the key's statistics.
pub struct CaSource {
    pub store: FileStore,
    pub open: Opener,
    /// The HSM key most recently opened (for its metrics), if any.
    pub hsm: Option<HsmKeySlot>,
    /// Intermediate mode: the in-memory intermediate's lifetime and renewal rule (the rotation
    /// driver's [`crate::rotation::RotatorOptions::refresh_when`]).
    pub intermediate: Option<Intermediate>,
    /// Whether the configuration asks podca to run the rotation schedule itself.
    pub automatic_rotation: bool,
}

impl std::fmt::Debug for CaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaSource")
            .field("dir", &self.store.dir())
            .field("hsm", &self.hsm.is_some())
            .field("intermediate", &self.intermediate)
            .field("automatic_rotation", &self.automatic_rotation)
            .finish_non_exhaustive()
    }
}

impl CaSource {
    /// Opens the active CA and reads the anchors to publish now.
    pub fn load(&self) -> Result<(IssuingCa, Vec<CaCertificate>), OpenError> {
        load(&self.store, &self.open)
    }
}

/// The store's active CA and the anchors to publish now.
pub fn load(
    store: &FileStore,
    open: &Opener,
) -> Result<(IssuingCa, Vec<CaCertificate>), OpenError> {
    let ca = open(store)?;
    let anchors = store.roots().map_err(OpenError::Anchors)?;
    Ok((ca, anchors))
}

/// The file opener: every generation's key is a file in the store.
pub fn file_opener() -> Opener {
    Arc::new(|store: &FileStore| Ok(store.load()?))
}

/// The configuration for a data directory as the command line names it (`--dir` plus the
/// PKCS#11 flags): a PKCS#11 CA when the directory records that its active key is in an HSM,
/// else a file CA. `pin` is needed only in the first case.
pub fn directory_config(
    dir: &Path,
    pin: Option<PinSource>,
    module: Option<PathBuf>,
) -> Result<CaConfig, OpenError> {
    let store = FileStore::new(dir);
    Ok(match store.external_key_location()? {
        Some(location) => CaConfig::Pkcs11(Pkcs11Ca {
            dir: Some(dir.to_owned()),
            uri: None,
            module,
            pin: pin.ok_or(OpenError::NoPin { location })?,
            mode: Pkcs11Mode::HsmSignsLeaves,
            automatic_rotation: false,
        }),
        None => CaConfig::File(FileCa {
            dir: Some(dir.to_owned()),
            automatic_rotation: false,
            split_from: None,
        }),
    })
}

/// Opens the CA `config` names. `max_leaf_lifetime` sizes the intermediate in intermediate mode.
/// Nothing is signed yet: [`CaSource::load`] opens the key.
pub fn open(config: &CaConfig, max_leaf_lifetime: Duration) -> Result<CaSource, OpenError> {
    let (dir, automatic_rotation) = match config {
        CaConfig::Secret(s) => {
            return Err(OpenError::HeldInSecret {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
            });
        }
        CaConfig::File(f) => (f.dir.clone(), f.automatic_rotation),
        CaConfig::Pkcs11(p) => (p.dir.clone(), p.automatic_rotation),
    };
    let dir = dir.ok_or(OpenError::NoDir {
        backend: config.backend_name(),
    })?;
    let store = FileStore::new(&dir);
    if !store.is_initialised() {
        return Err(OpenError::NotInitialised { dir });
    }
    let external = store.external_key_location()?;
    match config {
        CaConfig::Secret(_) => unreachable!("answered above"),
        CaConfig::File(_) => {
            if let Some(location) = external {
                return Err(OpenError::KeyInHsm { dir, location });
            }
            Ok(CaSource {
                store,
                open: file_opener(),
                hsm: None,
                intermediate: None,
                automatic_rotation,
            })
        }
        CaConfig::Pkcs11(p) => open_pkcs11(p, store, max_leaf_lifetime, automatic_rotation),
    }
}

/// The active issuing certificate names the algorithm its key must have: one the PKCS#11
/// backend cannot sign with is refused here, by name, rather than as a key that "does not match"
/// after the token was searched. A certificate that cannot be read is left to the usual load.
fn refuse_algorithm_not_in_hsm(store: &FileStore) -> Result<(), OpenError> {
    let path = store.issuing_cert_path();
    let algorithm = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| CaCertificate::all_from_pem(&text).ok())
        .and_then(|certs| {
            certs
                .first()
                .and_then(|c| CaAlgorithm::of_spki(c.spki_der()))
        });
    match algorithm.map(|a| (a, Pkcs11Key::supports(a))) {
        Some((algorithm, Err(BackendError::InvalidKey(detail)))) => {
            Err(OpenError::AlgorithmNotInHsm {
                path,
                algorithm,
                detail,
            })
        }
        _ => Ok(()),
    }
}

fn open_pkcs11(
    p: &Pkcs11Ca,
    store: FileStore,
    max_leaf_lifetime: Duration,
    automatic_rotation: bool,
) -> Result<CaSource, OpenError> {
    let intermediate = Intermediate::configured(&p.mode, max_leaf_lifetime)?;
    let uri_override = p.uri.clone();
    let module = p.module.clone();
    let pin = p.pin.clone();
    let last_key: HsmKeySlot = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&last_key);
    let open: Opener = Arc::new(move |store: &FileStore| {
        let location = match (&uri_override, store.external_key_location()?) {
            (Some(uri), _) => uri.clone(),
            (None, Some(location)) => location,
            (None, None) => {
                return Err(OpenError::KeyIsFile {
                    dir: store.dir().to_owned(),
                });
            }
        };
        refuse_algorithm_not_in_hsm(store)?;
        let uri = Pkcs11Uri::parse(&location).map_err(|source| OpenError::Uri {
            location: location.clone(),
            source,
        })?;
        let mut config = Pkcs11Config::new(uri, pin.clone());
        if let Some(module) = &module {
            config.module_path = Some(module.clone());
        }
        let key = Arc::new(Pkcs11Key::open(&config).map_err(|source| OpenError::Hsm {
            location: location.clone(),
            source,
        })?);
        if let Ok(mut last) = keep.lock() {
            *last = Some(Arc::clone(&key));
        }
        let hsm_ca = store.load_with_key(Arc::clone(&key) as Arc<dyn CaKey>)?;
        match intermediate {
            None => Ok(hsm_ca),
            Some(intermediate) => intermediate.issue(&hsm_ca, OffsetDateTime::now_utc()),
        }
    });
    Ok(CaSource {
        store,
        open,
        hsm: Some(last_key),
        intermediate,
        automatic_rotation,
    })
}

/// The label of the ledger log's checkpoint key in a PKCS#11 CA's token.
pub const LOG_KEY_LABEL: &str = "podca-log";

/// The ledger log's checkpoint key beside a PKCS#11 CA whose data directory is `dir`: the
/// Ed25519 key labelled [`LOG_KEY_LABEL`] in the CA key's token (reached with the CA's PIN and
/// module), made there on first use with the CA keys' protections (sensitive, never
/// extractable, sign only) when `generate`. `origin` names it in the checkpoints.
pub fn pkcs11_log_key(
    p: &Pkcs11Ca,
    dir: &Path,
    origin: &str,
    generate: bool,
) -> Result<podca_signer::merkle_note::LogKey, OpenError> {
    let store = FileStore::new(dir);
    let location = match (&p.uri, store.external_key_location()?) {
        (Some(uri), _) => uri.clone(),
        (None, Some(location)) => location,
        (None, None) => {
            return Err(OpenError::KeyIsFile {
                dir: dir.to_owned(),
            });
        }
    };
    let mut uri = Pkcs11Uri::parse(&location).map_err(|source| OpenError::Uri {
        location: location.clone(),
        source,
    })?;
    uri.object = Some(LOG_KEY_LABEL.to_owned());
    uri.id = None;
    let shown = uri.to_string();
    let mut config = Pkcs11Config::new(uri, p.pin.clone());
    config.module_path = p.module.clone();
    config.pool_size = Some(1);
    let hsm = |source| OpenError::Hsm {
        location: shown.clone(),
        source,
    };
    let (key, made) = match generate {
        true => Pkcs11Key::open_or_generate_ed25519(&config).map_err(hsm)?,
        false => (Pkcs11Key::open(&config).map_err(hsm)?, false),
    };
    if made {
        tracing::info!(key = %shown, "ledger log: made the checkpoint key in the CA's token");
    }
    podca_signer::merkle_note::LogKey::from_token(Arc::new(key), origin, &shown).map_err(|e| {
        OpenError::Hsm {
            location: shown,
            source: BackendError::InvalidKey(e.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_data_dir_is_xdg_then_home_then_here() {
        let some = |s: &str| Some(OsString::from(s));
        let cases = [
            (some("/x"), some("/h"), "/x/podca"),
            (some(""), some("/h"), "/h/.local/share/podca"),
            (None, some("/h"), "/h/.local/share/podca"),
            (None, some(""), ".podca"),
            (None, None, ".podca"),
        ];
        for (xdg, home, want) in cases {
            let got = data_dir_from(xdg.clone(), home.clone());
            assert_eq!(got, PathBuf::from(want), "{xdg:?} {home:?}");
        }
    }
}
