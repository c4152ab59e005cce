//! `podca ledger list|show`: query the issuance ledger.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use podca_signer::{FileStore, Ledger, LedgerRecord};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// List issued certificates, newest first (or filtered by identity or time).
    List(ListArgs),
    /// Show one certificate's record by serial number (hex).
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// Only this SPIFFE ID.
    #[arg(long)]
    pub identity: Option<String>,
    /// Only records issued at or after this RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// Only records issued before this RFC 3339 time.
    #[arg(long)]
    pub until: Option<String>,
    /// At most this many records.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// Serial number, hex (colons allowed).
    pub serial: String,
}

impl LedgerCommand {
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            LedgerCommand::List(a) => a.run(),
            LedgerCommand::Show(a) => a.run(),
        }
    }
}

fn open(dir: Option<PathBuf>) -> anyhow::Result<Ledger> {
    let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
    let path = store.ledger_path();
    anyhow::ensure!(
        path.exists(),
        "no ledger at {}: nothing has been issued from this CA yet",
        path.display()
    );
    Ok(Ledger::open(&path)?)
}

fn parse_time(flag: &str, value: &str) -> anyhow::Result<OffsetDateTime> {
    OffsetDateTime::parse(value, &Rfc3339)
        .with_context(|| format!("{flag} {value:?} is not an RFC 3339 time (2026-11-29T12:00:00Z)"))
}

impl ListArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self {
            dir,
            identity,
            since,
            until,
            limit,
            json,
        } = self;
        let ledger = open(dir)?;
        let since = since
            .as_deref()
            .map(|s| parse_time("--since", s))
            .transpose()?;
        let until = until
            .as_deref()
            .map(|s| parse_time("--until", s))
            .transpose()?;
        let mut records = match (&identity, since, until) {
            (Some(id), _, _) => ledger.by_identity(id)?,
            (None, None, None) => ledger.latest(limit)?,
            (None, from, to) => ledger.issued_between(
                from.unwrap_or(OffsetDateTime::UNIX_EPOCH),
                to.unwrap_or_else(|| OffsetDateTime::now_utc() + time::Duration::days(1)),
                limit,
            )?,
        };
        records.retain(|r| {
            since.is_none_or(|s| r.issued_at >= s) && until.is_none_or(|u| r.issued_at < u)
        });
        records.truncate(limit);
        if json {
            for r in &records {
                println!("{}", serde_json::to_string(r)?);
            }
        } else {
            println!(
                "{:<34} {:<20} {:<20} IDENTITY",
                "SERIAL", "ISSUED", "NOT AFTER"
            );
            for r in &records {
                println!(
                    "{:<34} {:<20} {:<20} {}",
                    r.serial,
                    short(r.issued_at),
                    short(r.not_after),
                    r.identity
                );
            }
        }
        Ok(())
    }
}

impl ShowArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self { dir, serial } = self;
        let ledger = open(dir)?;
        let record: LedgerRecord = ledger
            .by_serial(&serial)?
            .with_context(|| format!("no certificate with serial {serial} in the ledger"))?;
        println!("{}", serde_json::to_string_pretty(&record)?);
        Ok(())
    }
}

fn short(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}
