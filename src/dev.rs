//! `podca dev`: the same CA on a laptop with no cluster.

use clap::Args;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Data directory for the CA and ledger.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub data_dir: Option<std::path::PathBuf>,
}

pub fn run(args: DevArgs) -> anyhow::Result<()> {
    let DevArgs { data_dir: _ } = args;
    anyhow::bail!("`podca dev` is not implemented yet")
}
