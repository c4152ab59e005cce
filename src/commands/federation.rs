//! `podca federation status`: each foreign trust domain of a config file
//! (`podca_grpc::federation_status` reads and judges the kept bundles).

use std::path::PathBuf;

use podca_authority::config::Config;
use podca_grpc::federation_status::status;
use time::OffsetDateTime;

use crate::commands::default_data_dir;

#[derive(clap::Subcommand, Debug)]
pub enum FederationCommand {
    /// Each foreign trust domain: source, sequence, anchors, last refresh, first expiry. Exits
    /// 1 when one is stale (not refreshed for twice its max_refresh_seconds), expired or never
    /// fetched.
    Status(StatusArgs),
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The podca config file with the [[federation]] tables.
    #[arg(long, env = "PODCA_CONFIG")]
    config: PathBuf,
    /// `podca dev`'s data directory, where entries without last_good_file are kept.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

impl FederationCommand {
    pub fn run(self) -> anyhow::Result<()> {
        let FederationCommand::Status(args) = self;
        args.run()
    }
}

impl StatusArgs {
    fn run(self) -> anyhow::Result<()> {
        let config = Config::load(&self.config)?;
        if config.federation.is_empty() {
            anyhow::bail!("{} has no [[federation]] table", self.config.display());
        }
        let data_dir = self.data_dir.unwrap_or_else(default_data_dir);
        let (text, unhealthy) = status(&config.federation, &data_dir, OffsetDateTime::now_utc())?;
        print!("{text}");
        if unhealthy > 0 {
            anyhow::bail!(
                "{unhealthy} of {} foreign trust domains are stale, expired or never fetched",
                config.federation.len()
            );
        }
        Ok(())
    }
}
