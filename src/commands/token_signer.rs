//! `podca token-signer` (`podca_grpc::token_signer`): a mode of its own, on each control-plane
//! node beside kube-apiserver, which needs it before the cluster (and any podca in it) serves.

use std::net::SocketAddr;
use std::path::PathBuf;

use podca_grpc::token_signer::{self, Options};

#[derive(Debug, clap::Args)]
pub struct TokenSignerArgs {
    /// Config file: `[ca] dir` (keys in its jwt/, files or PKCS#11) and `[jwt]` (schedule).
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: PathBuf,
    /// The socket kube-apiserver's --service-account-signing-endpoint names (created 0600).
    #[arg(long)]
    pub socket: PathBuf,
    /// The uid that owns the socket and alone may call [default: this process's].
    #[arg(long)]
    pub socket_owner: Option<u32>,
    /// Admin listener (/livez, /readyz, /metrics).
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
}

impl TokenSignerArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let Self {
            config,
            socket,
            socket_owner,
            admin_listen,
        } = self;
        let config = podca_authority::config::Config::load(&config)?;
        let options = Options {
            socket,
            socket_owner,
            admin_listen,
        };
        tokio::runtime::Runtime::new()?.block_on(async {
            let signals = podca_authority::shutdown::signals()?;
            Ok(token_signer::run(&config, options, signals).await?)
        })
    }
}
