//! `podca bundle`.
use clap::Args;

#[derive(Debug, Args)]
pub struct BundleArgs {}

impl BundleArgs {
    pub fn run(self) -> anyhow::Result<()> {
        anyhow::bail!("not implemented yet")
    }
}
