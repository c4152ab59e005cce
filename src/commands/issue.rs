//! `podca issue`.
use clap::Args;

#[derive(Debug, Args)]
pub struct IssueArgs {}

impl IssueArgs {
    pub fn run(self) -> anyhow::Result<()> {
        anyhow::bail!("not implemented yet")
    }
}
