//! `podca ledger list|show|export|prune`: query the ledger, redb or PostgreSQL.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use podca_authority::config::Config;
use podca_authority::ledger::{
    LedgerBackend, PostgresSettings, PostgresTls, Store, format_time, parse_time,
};
use podca_signer::{FileStore, Filter, LedgerRecord, RecordOutcome};

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// List decisions, newest first, filtered.
    List(ListArgs),
    /// Show one certificate's record by serial number (hex), or any record by id.
    Show(ShowArgs),
    /// Every matching record, one JSON object per line (for a SIEM or a spreadsheet).
    Export(ExportArgs),
    /// Delete the records made before a time.
    Prune(PruneArgs),
}

/// Which ledger: a data directory's redb file, a PostgreSQL database, or a config's `[ledger]`.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// CA data directory (its ledger.redb).
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// A file holding the PostgreSQL connection URL (over --config and --dir).
    #[arg(long)]
    pub postgres_url_file: Option<PathBuf>,
    /// PEM CA bundle that verifies the PostgreSQL server (with --postgres-url-file).
    #[arg(long, requires = "postgres_url_file")]
    pub postgres_ca_file: Option<PathBuf>,
    /// `verify-full` (default) or `disable` (Unix sockets and loopback only).
    #[arg(long, requires = "postgres_url_file")]
    pub postgres_tls: Option<PostgresTls>,
    /// The configuration file whose `[ledger]` (and `[ca] dir`) to read (over --dir).
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: Option<PathBuf>,
}

/// What to select.
#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Only this SPIFFE ID.
    #[arg(long)]
    pub identity: Option<String>,
    /// Only this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only requests from pods on this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Only this serial (hex, colons allowed).
    #[arg(long)]
    pub serial: Option<String>,
    /// Only this certificate, subject key or issuing CA SHA-256 fingerprint, or a JWT-SVID's
    /// SHA-256 (hex; `sha256sum` of the token without its newline).
    #[arg(long)]
    pub fingerprint: Option<String>,
    /// Only records made at or after this RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// Only records made before this RFC 3339 time.
    #[arg(long)]
    pub until: Option<String>,
    /// Only `issued`, `denied` or `failed`.
    #[arg(long)]
    pub outcome: Option<RecordOutcome>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// At most this many records.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Serial number, hex (colons allowed), or a record id.
    pub serial: String,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Delete the records made before this RFC 3339 time.
    #[arg(long)]
    pub before: String,
}

impl LedgerCommand {
    pub fn run(self) -> anyhow::Result<()> {
        let runtime = super::block_on_runtime()?;
        runtime.block_on(async move {
            match self {
                LedgerCommand::List(a) => a.run().await,
                LedgerCommand::Show(a) => a.run().await,
                LedgerCommand::Export(a) => a.run().await,
                LedgerCommand::Prune(a) => a.run().await,
            }
        })
    }
}

impl StoreArgs {
    async fn open(self) -> anyhow::Result<Store> {
        let Self {
            dir,
            postgres_url_file,
            postgres_ca_file,
            postgres_tls,
            config,
        } = self;
        if let Some(url_file) = postgres_url_file {
            let backend = LedgerBackend::Postgres(PostgresSettings {
                url_file,
                tls: postgres_tls.unwrap_or_default(),
                ca_file: postgres_ca_file,
                // One query at a time.
                pool_size: 1,
                statement_timeout: std::time::Duration::from_secs(
                    podca_authority::ledger::DEFAULT_STATEMENT_TIMEOUT_SECONDS.into(),
                ),
            });
            return open_backend(&backend, None).await;
        }
        if let Some(path) = config {
            let config = Config::load(&path)?;
            let default_redb = config.ca.dir().map(|d| FileStore::new(d).ledger_path());
            return open_backend(&config.ledger.backend, default_redb).await;
        }
        let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
        let path = store.ledger_path();
        anyhow::ensure!(
            path.exists(),
            "no ledger at {}: nothing has been issued from this CA yet",
            path.display()
        );
        open_backend(&LedgerBackend::Redb { path: Some(path) }, None).await
    }
}

async fn open_backend(
    backend: &LedgerBackend,
    default_redb: Option<PathBuf>,
) -> anyhow::Result<Store> {
    if let LedgerBackend::Redb { path } = backend
        && let Some(path) = path.as_ref().or(default_redb.as_ref())
    {
        anyhow::ensure!(
            path.exists(),
            "no ledger at {}: nothing has been recorded there yet",
            path.display()
        );
    }
    Store::open(backend, default_redb.as_deref())
        .await?
        .context("[ledger] backend = \"none\" keeps no records to query (see the audit log)")
}

impl FilterArgs {
    fn filter(self, limit: usize) -> anyhow::Result<Filter> {
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
        Ok(Filter {
            identity,
            namespace,
            node,
            serial,
            fingerprint,
            since: since
                .as_deref()
                .map(|s| parse_time("--since", s))
                .transpose()?,
            until: until
                .as_deref()
                .map(|s| parse_time("--until", s))
                .transpose()?,
            outcome,
            limit,
        })
    }
}

impl ListArgs {
    async fn run(self) -> anyhow::Result<()> {
        let Self {
            store,
            filter,
            limit,
            json,
        } = self;
        let filter = filter.filter(limit)?;
        let records = store.open().await?.query(&filter).await?;
        if json {
            for r in &records {
                println!("{}", r.to_json());
            }
            return Ok(());
        }
        for line in podca_authority::ledger::table(&records) {
            println!("{line}");
        }
        Ok(())
    }
}

impl ShowArgs {
    async fn run(self) -> anyhow::Result<()> {
        let Self { store, serial } = self;
        let record: LedgerRecord = store
            .open()
            .await?
            .find(&serial)
            .await?
            .with_context(|| format!("no certificate with serial {serial} in the ledger"))?;
        println!("{}", serde_json::to_string_pretty(&record)?);
        Ok(())
    }
}

impl ExportArgs {
    async fn run(self) -> anyhow::Result<()> {
        let Self { store, filter } = self;
        let filter = filter.filter(0)?;
        let records = store.open().await?.query(&filter).await?;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for r in records.iter().rev() {
            use std::io::Write;
            writeln!(out, "{}", r.to_json())?;
        }
        Ok(())
    }
}

impl PruneArgs {
    async fn run(self) -> anyhow::Result<()> {
        let Self { store, before } = self;
        let before = parse_time("--before", &before)?;
        let pruned = store.open().await?.prune(before).await?;
        println!(
            "pruned {pruned} records made before {}",
            format_time(before)
        );
        Ok(())
    }
}
