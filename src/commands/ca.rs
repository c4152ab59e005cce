//! `podca ca init|show`.
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create a root and an issuing CA, or import an existing CA.
    Init,
    /// Show the CA.
    Show,
}

impl CaCommand {
    pub fn run(self) -> anyhow::Result<()> {
        anyhow::bail!("not implemented yet")
    }
}
