//! `podca ledger`: query the ledger (redb or PostgreSQL) and its Merkle log
//! (docs/ledger-log.md). The work is `podca_authority::ledger::query`'s; this is its flags.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use podca_authority::ledger::PostgresTls;
use podca_authority::ledger::query::{self, LogCommand, Selection, StoreChoice};
use podca_signer::RecordOutcome;

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
    /// Sign a checkpoint of the Merkle log now (with the log key; made if missing).
    Checkpoint(LogArgs),
    /// Inclusion proof of a record (serial or id) against the latest checkpoint, JSON.
    Prove(ProveArgs),
    /// Consistency proof from the tree of --from leaves to the latest checkpoint, JSON.
    Consistency(ConsistencyArgs),
    /// Check every leaf, the root and every checkpoint; name the first mismatch.
    Verify(LogArgs),
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
    /// TLS to the PostgreSQL server (default: verify-full).
    #[arg(long, requires = "postgres_url_file", value_parser = crate::cli::spelled::<PostgresTls>(), ignore_case = true)]
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
    /// Only records of this outcome.
    #[arg(long, value_parser = crate::cli::spelled::<RecordOutcome>(), ignore_case = true)]
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

/// The log key (or only its public half) for checkpoints.
#[derive(Debug, Args)]
pub struct LogArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The log's Ed25519 key (default: [ledger.log] key_file, else <data dir>/log.key).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The log's origin (default: [ledger.log] origin, else podca).
    #[arg(long)]
    pub origin: Option<String>,
    /// Verify with this note verifier key (<name>+<key ID>+<key>) instead of the key file.
    #[arg(long, conflicts_with = "key_file")]
    pub verifier: Option<String>,
}

#[derive(Debug, Args)]
pub struct ProveArgs {
    #[command(flatten)]
    pub log: LogArgs,
    /// Serial number (hex) or record id.
    #[arg(long)]
    pub serial: String,
}

#[derive(Debug, Args)]
pub struct ConsistencyArgs {
    #[command(flatten)]
    pub log: LogArgs,
    /// The earlier tree size.
    #[arg(long)]
    pub from: u64,
}

impl LedgerCommand {
    pub fn run(self) -> anyhow::Result<()> {
        let runtime = super::block_on_runtime()?;
        let lines = runtime.block_on(async move {
            match self {
                LedgerCommand::List(a) => {
                    let filter = a.filter.selection().filter(a.limit)?;
                    query::list(&a.store.choice(), &filter, a.json).await
                }
                LedgerCommand::Show(a) => query::show(&a.store.choice(), &a.serial).await,
                LedgerCommand::Export(a) => {
                    let filter = a.filter.selection().filter(0)?;
                    query::export(&a.store.choice(), &filter).await
                }
                LedgerCommand::Prune(a) => query::prune(&a.store.choice(), &a.before).await,
                LedgerCommand::Checkpoint(a) => a.run(LogCommand::Checkpoint).await,
                LedgerCommand::Prove(a) => a.log.run(LogCommand::Prove(a.serial)).await,
                LedgerCommand::Consistency(a) => a.log.run(LogCommand::Consistency(a.from)).await,
                LedgerCommand::Verify(a) => a.run(LogCommand::Verify).await,
            }
        })?;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for line in lines {
            use std::io::Write;
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

impl StoreArgs {
    fn choice(self) -> StoreChoice {
        let Self {
            dir,
            postgres_url_file,
            postgres_ca_file,
            postgres_tls,
            config,
        } = self;
        StoreChoice {
            postgres_url_file,
            postgres_ca_file,
            postgres_tls,
            config,
            dir: dir.unwrap_or_else(super::default_data_dir),
        }
    }
}

impl LogArgs {
    async fn run(self, command: LogCommand) -> Result<Vec<String>, query::QueryError> {
        let Self {
            store,
            key_file,
            origin,
            verifier,
        } = self;
        let key = query::KeyChoice {
            key_file,
            origin,
            verifier,
        };
        query::log(&store.choice(), &key, command).await
    }
}

impl FilterArgs {
    fn selection(self) -> Selection {
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
        Selection {
            identity,
            namespace,
            node,
            serial,
            fingerprint,
            since,
            until,
            outcome,
        }
    }
}
