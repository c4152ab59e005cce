//! `podca inspect`.
use clap::Args;

#[derive(Debug, Args)]
pub struct InspectArgs {}

impl InspectArgs {
    pub fn run(self) -> anyhow::Result<()> {
        anyhow::bail!("not implemented yet")
    }
}
