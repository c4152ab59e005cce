//! Opening the CA that `podca serve` (and `podca dev`) sign with, from the `[ca]` config table:
//! a file CA data directory, or one whose keys are held in an HSM over PKCS#11 (in either mode:
//! the HSM key signs every leaf, or it signs a short-lived in-memory intermediate).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::rotation::{Opener, file_opener};
use anyhow::Context;
use podca_signer::backend::{PinSource, Pkcs11Config, Pkcs11Key, Pkcs11Uri};
use podca_signer::{CaKey, FileStore, IssuingCa, MemoryKey};
use time::{Duration, OffsetDateTime};

use crate::config::{CaBackend, CaConfig, Pkcs11Mode};

/// The HSM key most recently opened by the opener (its statistics feed the `podca_hsm_*`
/// metrics); empty until the first open.
pub type HsmKeySlot = Arc<Mutex<Option<Arc<Pkcs11Key>>>>;

/// The opened CA source: the store, how to open its active CA, and (HSM) the key's statistics.
pub struct CaSource {
    pub store: FileStore,
    pub open: Opener,
    /// The HSM key most recently opened (for its metrics), if any.
    pub hsm: Option<HsmKeySlot>,
    /// In intermediate mode, the lifetime of the in-memory intermediate.
    pub intermediate_lifetime: Option<Duration>,
}

impl std::fmt::Debug for CaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaSource")
            .field("dir", &self.store.dir())
            .field("hsm", &self.hsm.is_some())
            .field("intermediate_lifetime", &self.intermediate_lifetime)
            .finish_non_exhaustive()
    }
}

impl CaSource {
    /// Reads the `[ca]` table. `max_leaf_lifetime` sizes the intermediate in intermediate mode.
    pub fn from_config(ca: &CaConfig, max_leaf_lifetime: Duration) -> anyhow::Result<CaSource> {
        if ca.backend == CaBackend::Secret {
            anyhow::bail!(
                "[ca] backend = \"secret\" (secret = {:?}) is not available in this version; use \
                 \"file\" (a CA data directory, e.g. mounted from a Secret) or \"pkcs11\"",
                ca.secret.as_deref().unwrap_or("")
            );
        }
        let dir: PathBuf = ca.dir.clone().with_context(|| {
            format!(
                "[ca] dir is required for the {} backend (the CA data directory made by `podca ca \
                 init`)",
                backend_name(ca.backend)
            )
        })?;
        let store = FileStore::new(&dir);
        if !store.is_initialised() {
            anyhow::bail!(
                "{} holds no CA; create one with `podca ca init --dir {}`",
                dir.display(),
                dir.display()
            );
        }
        let external = store.external_key_location()?;
        match ca.backend {
            CaBackend::File => {
                if let Some(location) = external {
                    anyhow::bail!(
                        "the active CA key in {} is held in an HSM ({location}); set [ca] backend = \
                         \"pkcs11\" and pkcs11_pin_file (or pkcs11_pin_env)",
                        dir.display()
                    );
                }
                Ok(CaSource {
                    store,
                    open: file_opener(),
                    hsm: None,
                    intermediate_lifetime: None,
                })
            }
            CaBackend::Pkcs11 => {
                let pin = match (&ca.pkcs11_pin_file, &ca.pkcs11_pin_env) {
                    (Some(file), None) => PinSource::File(file.clone()),
                    (None, Some(var)) => PinSource::Env(var.clone()),
                    (Some(_), Some(_)) => anyhow::bail!(
                        "[ca] pkcs11_pin_file and pkcs11_pin_env are both set; choose one"
                    ),
                    (None, None) => anyhow::bail!(
                        "[ca] backend = \"pkcs11\" needs pkcs11_pin_file or pkcs11_pin_env (the \
                         PIN is never read from the config file itself)"
                    ),
                };
                let uri_override = ca.pkcs11_uri.clone();
                let module = ca.pkcs11_module.clone();
                let intermediate_lifetime = match ca.pkcs11_mode {
                    Pkcs11Mode::HsmSignsLeaves => None,
                    Pkcs11Mode::Intermediate => Some(
                        ca.intermediate_lifetime_seconds
                            .map(|s| Duration::seconds(i64::from(s)))
                            .unwrap_or_else(|| {
                                Ord::max(max_leaf_lifetime * 3i32, Duration::days(1))
                            }),
                    ),
                };
                if let Some(life) = intermediate_lifetime {
                    // Renewed at ⅔ of its life, so ⅓ must still cover the longest leaf.
                    anyhow::ensure!(
                        life >= max_leaf_lifetime * 3i32,
                        "[ca] intermediate_lifetime_seconds ({}) must be at least three times the \
                         largest max_lifetime_seconds ({}): the intermediate is re-issued at two \
                         thirds of its life and must still outlive every leaf",
                        life.whole_seconds(),
                        max_leaf_lifetime.whole_seconds()
                    );
                }
                let last_key: HsmKeySlot = Arc::new(Mutex::new(None));
                let keep = Arc::clone(&last_key);
                let open: Opener = Arc::new(move |store: &FileStore| {
                    let location = match (&uri_override, store.external_key_location()) {
                        (Some(uri), _) => uri.clone(),
                        (None, Ok(Some(location))) => location,
                        (None, Ok(None)) => {
                            return Err(format!(
                                "[ca] backend = \"pkcs11\", but the active CA key in {} is a \
                                 file; set backend = \"file\" or pkcs11_uri",
                                store.dir().display()
                            ));
                        }
                        (None, Err(e)) => return Err(e.to_string()),
                    };
                    let uri = Pkcs11Uri::parse(&location).map_err(|e| e.to_string())?;
                    let mut config = Pkcs11Config::new(uri, pin.clone());
                    if let Some(module) = &module {
                        config.module_path = Some(module.clone());
                    }
                    let key = Arc::new(
                        Pkcs11Key::open(&config).map_err(|e| format!("opening {location}: {e}"))?,
                    );
                    if let Ok(mut last) = keep.lock() {
                        *last = Some(Arc::clone(&key));
                    }
                    let hsm_ca = store
                        .load_with_key(Arc::clone(&key) as Arc<dyn CaKey>)
                        .map_err(|e| e.to_string())?;
                    match intermediate_lifetime {
                        None => Ok(hsm_ca),
                        Some(life) => in_memory_intermediate(&hsm_ca, life),
                    }
                });
                Ok(CaSource {
                    store,
                    open,
                    hsm: Some(last_key),
                    intermediate_lifetime,
                })
            }
            CaBackend::Secret => {
                anyhow::bail!("[ca] backend = \"secret\" is not available in this version")
            }
        }
    }
}

/// A fresh in-memory key and an intermediate for it, signed by the HSM-held CA.
fn in_memory_intermediate(hsm_ca: &IssuingCa, life: Duration) -> Result<IssuingCa, String> {
    let key = MemoryKey::generate(hsm_ca.key().algorithm())
        .map_err(|e| format!("generating the in-memory intermediate key: {e}"))?;
    let now = OffsetDateTime::now_utc();
    hsm_ca
        .sign_intermediate(
            Arc::new(key),
            "podca in-memory intermediate",
            now - Duration::minutes(1),
            life,
        )
        .map_err(|e| format!("the HSM could not sign the in-memory intermediate: {e}"))
}

fn backend_name(backend: CaBackend) -> &'static str {
    match backend {
        CaBackend::File => "file",
        CaBackend::Secret => "secret",
        CaBackend::Pkcs11 => "pkcs11",
    }
}
