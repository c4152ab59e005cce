//! `podca ledger list|show`.
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// List issued certificates.
    List,
}

impl LedgerCommand {
    pub fn run(self) -> anyhow::Result<()> {
        anyhow::bail!("not implemented yet")
    }
}
