//! `podca serve`: the in-cluster signer (controller, gRPC API, admin server).

use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: Option<std::path::PathBuf>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs { config: _ } = args;
    anyhow::bail!("`podca serve` is not implemented yet")
}
