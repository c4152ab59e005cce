//! What `podca ledger` does beyond parsing its flags: which store a command means (a data
//! directory's redb file, a PostgreSQL URL file, or a configuration's `[ledger]`), the log key
//! it uses, and how records are printed.

use std::path::{Path, PathBuf};

use podca_signer::merkle_note::{LogKey, LogVerifier, NoteError};
use podca_signer::{FileStore, Filter, LedgerRecord, RecordOutcome};

use super::log::{DEFAULT_ORIGIN, LogConfig, LogError};
use super::{
    BadTime, LedgerBackend, PostgresSettings, PostgresTls, Store, StoreError, format_time,
    parse_time,
};
use crate::config::{Config, ConfigError};

/// Which ledger a command reads: the flags of `podca ledger`, in their order of precedence.
#[derive(Debug, Clone, Default)]
pub struct StoreChoice {
    /// A file holding a PostgreSQL URL (over `config` and `dir`).
    pub postgres_url_file: Option<PathBuf>,
    pub postgres_ca_file: Option<PathBuf>,
    pub postgres_tls: Option<PostgresTls>,
    /// A configuration file whose `[ledger]` and `[ca] dir` to read (over `dir`).
    pub config: Option<PathBuf>,
    /// The CA data directory (its `ledger.redb` and `log.key`).
    pub dir: PathBuf,
}

/// Why a command could not open its ledger or key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    #[error("no ledger at {0}: nothing has been recorded there yet")]
    NoLedger(String),
    #[error("[ledger] backend = \"none\" keeps no records to query (see the audit log)")]
    NoneBackend,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Key(#[from] NoteError),
    #[error(transparent)]
    Time(#[from] BadTime),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("no certificate with serial {0} in the ledger")]
    NotFound(String),
    #[error(transparent)]
    Ca(#[from] crate::ca::OpenError),
    #[error(
        "the log key of a Secret-held CA is in the Secret {namespace}/{name}-log (or [ledger.log] \
         key_secret): give --key-file with a copy of its log.key, or --verifier"
    )]
    KeyInSecret { namespace: String, name: String },
    #[error("{0}")]
    Json(String),
}

impl StoreChoice {
    /// The configuration's `[ledger.log]`, if any was given and enabled.
    fn log_config(&self) -> Result<Option<LogConfig>, QueryError> {
        match &self.config {
            Some(path) => Ok(Config::load(path)?.ledger.log),
            None => Ok(None),
        }
    }

    /// Opens the store the flags name.
    pub async fn open(&self) -> Result<Store, QueryError> {
        if let Some(url_file) = &self.postgres_url_file {
            let backend = LedgerBackend::Postgres(PostgresSettings {
                url_file: url_file.clone(),
                tls: self.postgres_tls.unwrap_or_default(),
                ca_file: self.postgres_ca_file.clone(),
                // One query at a time.
                pool_size: 1,
                statement_timeout: std::time::Duration::from_secs(
                    super::DEFAULT_STATEMENT_TIMEOUT_SECONDS.into(),
                ),
            });
            return open_backend(&backend, None).await;
        }
        if let Some(path) = &self.config {
            let config = Config::load(path)?;
            let default_redb = config.ca.dir().map(|d| FileStore::new(d).ledger_path());
            return open_backend(&config.ledger.backend, default_redb).await;
        }
        let path = FileStore::new(&self.dir).ledger_path();
        open_backend(&LedgerBackend::Redb { path: Some(path) }, None).await
    }

    /// The log key: `key_file`, else `[ledger.log] key_file`, else `log.key` in the data
    /// directory (the configuration's, else `dir`); the origin: `origin`, else the
    /// configuration's, else `podca`. `generate`: make the key if it is missing.
    pub fn log_key(
        &self,
        key_file: Option<&Path>,
        origin: Option<&str>,
        generate: bool,
    ) -> Result<LogKey, QueryError> {
        let log = self.log_config()?;
        let config = match &self.config {
            Some(path) => Some(Config::load(path)?),
            None => None,
        };
        let config_dir = config
            .as_ref()
            .and_then(|c| c.ca.dir().map(Path::to_path_buf));
        let in_file = key_file.is_some() || log.as_ref().is_some_and(|l| l.key_file.is_some());
        if !in_file && let Some(config) = &config {
            // Where podca serve keeps it: in the CA's token, or in a Secret.
            let origin = origin
                .map(str::to_owned)
                .or_else(|| log.as_ref().map(|l| l.origin.clone()))
                .unwrap_or_else(|| DEFAULT_ORIGIN.to_owned());
            match &config.ca {
                crate::config::CaConfig::Pkcs11(p) => {
                    if let Some(dir) = p.dir.as_deref() {
                        return Ok(crate::ca::pkcs11_log_key(p, dir, &origin, generate)?);
                    }
                }
                crate::config::CaConfig::Secret(s) => {
                    return Err(QueryError::KeyInSecret {
                        namespace: s.namespace.clone(),
                        name: s.name.clone(),
                    });
                }
                _ => {}
            }
        }
        let path = key_file
            .map(Path::to_path_buf)
            .or_else(|| log.as_ref().and_then(|l| l.key_file.clone()))
            .unwrap_or_else(|| {
                config_dir
                    .unwrap_or_else(|| self.dir.clone())
                    .join("log.key")
            });
        let origin = origin
            .map(str::to_owned)
            .or_else(|| log.map(|l| l.origin))
            .unwrap_or_else(|| DEFAULT_ORIGIN.to_owned());
        Ok(if generate {
            LogKey::load_or_generate(&path, &origin)?
        } else {
            LogKey::load(&path, &origin)?
        })
    }

    /// The key checkpoints must verify with: `verifier` (a note verifier key) if given, else
    /// the public half of [`log_key`](Self::log_key).
    pub fn log_verifier(
        &self,
        verifier: Option<&str>,
        key_file: Option<&Path>,
        origin: Option<&str>,
    ) -> Result<LogVerifier, QueryError> {
        match verifier {
            Some(text) => Ok(LogVerifier::parse(text)?),
            None => Ok(self.log_key(key_file, origin, false)?.verifier().clone()),
        }
    }
}

async fn open_backend(
    backend: &LedgerBackend,
    default_redb: Option<PathBuf>,
) -> Result<Store, QueryError> {
    if let LedgerBackend::Redb { path } = backend
        && let Some(path) = path.as_ref().or(default_redb.as_ref())
        && !path.exists()
    {
        return Err(QueryError::NoLedger(path.display().to_string()));
    }
    Store::open(backend, default_redb.as_deref())
        .await?
        .ok_or(QueryError::NoneBackend)
}

/// What `podca ledger list` and `export` select; times are RFC 3339 text as given.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub identity: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
    pub serial: Option<String>,
    pub fingerprint: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub outcome: Option<RecordOutcome>,
}

impl Selection {
    /// The filter, at most `limit` records (0: all).
    pub fn filter(self, limit: usize) -> Result<Filter, QueryError> {
        let Self {
            identity,
            namespace,
            node,
            serial,
            fingerprint,
            since,
            until,
            outcome,
        } = self;
        let time = |flag, t: Option<String>| t.map(|t| parse_time(flag, &t)).transpose();
        Ok(Filter {
            identity,
            namespace,
            node,
            serial,
            fingerprint,
            since: time("--since", since)?,
            until: time("--until", until)?,
            outcome,
            limit,
        })
    }
}

/// `podca ledger list`'s lines: the table, or one JSON object per record.
pub async fn list(
    choice: &StoreChoice,
    filter: &Filter,
    json: bool,
) -> Result<Vec<String>, QueryError> {
    let records = choice.open().await?.query(filter).await?;
    if json {
        return Ok(records.iter().map(LedgerRecord::to_json).collect());
    }
    Ok(super::table(&records))
}

/// `podca ledger show`: one record, pretty JSON.
pub async fn show(choice: &StoreChoice, serial: &str) -> Result<Vec<String>, QueryError> {
    let record = choice
        .open()
        .await?
        .find(serial)
        .await?
        .ok_or_else(|| QueryError::NotFound(serial.to_owned()))?;
    Ok(vec![json(&record)?])
}

/// `podca ledger export`: the records, oldest first, one JSON object per line.
pub async fn export(choice: &StoreChoice, filter: &Filter) -> Result<Vec<String>, QueryError> {
    let records = choice.open().await?.query(filter).await?;
    Ok(records.iter().rev().map(LedgerRecord::to_json).collect())
}

/// `podca ledger prune --before`.
pub async fn prune(choice: &StoreChoice, before: &str) -> Result<Vec<String>, QueryError> {
    let before = parse_time("--before", before)?;
    let pruned = choice.open().await?.prune(before).await?;
    Ok(vec![format!(
        "pruned {pruned} records made before {}",
        format_time(before)
    )])
}

/// Which log key: `--key-file`, `--origin`, `--verifier`.
#[derive(Debug, Clone, Default)]
pub struct KeyChoice {
    pub key_file: Option<PathBuf>,
    pub origin: Option<String>,
    pub verifier: Option<String>,
}

/// The log subcommands of `podca ledger`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogCommand {
    /// Sign a checkpoint now (the key is made if missing).
    Checkpoint,
    /// The inclusion proof of a serial or id.
    Prove(String),
    /// The consistency proof from a tree size.
    Consistency(u64),
    /// The whole log.
    Verify,
}

/// Runs a log subcommand; its output lines.
pub async fn log(
    choice: &StoreChoice,
    key: &KeyChoice,
    command: LogCommand,
) -> Result<Vec<String>, QueryError> {
    let (key_file, origin) = (key.key_file.as_deref(), key.origin.as_deref());
    if command == LogCommand::Checkpoint {
        let key = choice.log_key(key_file, origin, true)?;
        let (_, note) = super::log::publish_checkpoint(&choice.open().await?, &key).await?;
        return Ok(vec![
            note.trim_end().to_owned(),
            String::new(),
            format!("verifier key: {}", key.verifier().to_text()),
        ]);
    }
    let verifier = choice.log_verifier(key.verifier.as_deref(), key_file, origin)?;
    let store = choice.open().await?;
    Ok(match command {
        LogCommand::Prove(serial) => {
            vec![json(
                &super::log::prove(&store, &serial, Some(&verifier)).await?,
            )?]
        }
        LogCommand::Consistency(from) => {
            vec![json(
                &super::log::consistency(&store, from, Some(&verifier)).await?,
            )?]
        }
        LogCommand::Verify | LogCommand::Checkpoint => {
            let s = super::log::verify(&store, &verifier).await?;
            vec![format!(
                "ok: {} leaves ({} records, {} pruned), {} checkpoints, root {}",
                s.leaves,
                s.records,
                s.pruned,
                s.checkpoints,
                hex::encode(s.root)
            )]
        }
    })
}

fn json(value: &impl serde::Serialize) -> Result<String, QueryError> {
    serde_json::to_string_pretty(value).map_err(|e| QueryError::Json(e.to_string()))
}
