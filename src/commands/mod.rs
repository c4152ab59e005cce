//! The offline commands: everything that works on a CA data directory or on files.

pub mod bundle;
pub mod ca;
pub mod completions;
pub mod doctor;
pub mod federation;
pub mod inspect;
pub mod inspect_jwt;
pub mod issue;
pub mod ledger;
pub mod policy;
pub mod renewal;
pub mod token_signer;

use std::path::PathBuf;

use podca_authority::ca as authority_ca;
use podca_authority::config::Config;
use podca_signer::backend::{PinSource, Pkcs11Config, Pkcs11Uri};
use podca_signer::{FileStore, IssuingCa};

pub use podca_authority::ca::default_data_dir;

/// Which CA data directory a `podca ca` command works on: `--dir`, or the CA `--ca` names in
/// `--config`, else the default data directory.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CaSelect {
    /// The configuration file whose CA `--ca` names (and, for `show`, whose CAs to list).
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: Option<PathBuf>,
    /// A CA of --config by name: `default` ([ca]) or a [cas.<name>] table (with --dir: that
    /// directory, e.g. podca dev's, for the CA's settings such as a tenant's constraints).
    #[arg(long, requires = "config")]
    pub ca: Option<String>,
}

impl CaSelect {
    /// The directory: `dir`, the named CA's, or the default data directory.
    pub fn dir(&self, dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
        match (dir, &self.ca, &self.config) {
            (None, Some(name), Some(path)) => Ok(Config::load(path)?.ca_dir(name)?.to_owned()),
            (dir, _, _) => Ok(dir.unwrap_or_else(default_data_dir)),
        }
    }

    /// The nameConstraints of the CA `--ca` names when it is a tenant's.
    pub fn tenant_constraints(&self) -> anyhow::Result<Option<podca_signer::NameConstraints>> {
        let (Some(name), Some(path)) = (&self.ca, &self.config) else {
            return Ok(None);
        };
        Ok(Config::load(path)?.init_constraints(name).transpose()?)
    }
}

/// How to unlock a CA key held in an HSM. The PIN itself is never a command-line value.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HsmArgs {
    /// File holding the PKCS#11 user PIN.
    #[arg(long, env = "PODCA_PKCS11_PIN_FILE", conflicts_with = "pkcs11_pin_env")]
    pub pkcs11_pin_file: Option<PathBuf>,
    /// Name of an environment variable holding the PKCS#11 user PIN.
    #[arg(long)]
    pub pkcs11_pin_env: Option<String>,
    /// PKCS#11 module (overrides the URI's module-path), e.g. /usr/lib/softhsm/libsofthsm2.so.
    #[arg(long, env = "PODCA_PKCS11_MODULE")]
    pub pkcs11_module: Option<PathBuf>,
}

impl HsmArgs {
    /// Where the PIN comes from, if a source was given.
    pub fn pin(&self) -> Option<PinSource> {
        match (&self.pkcs11_pin_file, &self.pkcs11_pin_env) {
            (Some(file), _) => Some(PinSource::File(file.clone())),
            (None, Some(var)) => Some(PinSource::Env(var.clone())),
            (None, None) => None,
        }
    }

    /// The PKCS#11 configuration for `uri`, or a clear error when no PIN source was given.
    pub fn config(&self, uri: &str) -> anyhow::Result<Pkcs11Config> {
        let uri = Pkcs11Uri::parse(uri)?;
        let Some(pin) = self.pin() else {
            anyhow::bail!(
                "the CA key is in an HSM ({uri}): give --pkcs11-pin-file FILE or \
                 --pkcs11-pin-env VAR"
            )
        };
        let mut config = Pkcs11Config::new(uri, pin);
        if self.pkcs11_module.is_some() {
            config.module_path = self.pkcs11_module.clone();
        }
        Ok(config)
    }
}

/// Opens the active CA of a data directory, with its file key or its HSM key, through the same
/// [`authority_ca::open`] as `podca serve` and `podca dev`.
pub fn open_active_ca(store: &FileStore, hsm: &HsmArgs) -> anyhow::Result<IssuingCa> {
    let config = authority_ca::directory_config(store.dir(), hsm.pin(), hsm.pkcs11_module.clone())?;
    // The command line issues one certificate at a time: the longest leaf lifetime only sizes
    // an intermediate-mode CA, which the command line never makes.
    let source = authority_ca::open(&config, time::Duration::days(1))?;
    Ok(source.load()?.0)
}

/// The single-threaded async runtime an offline command's network or ledger calls run on.
pub fn block_on_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
