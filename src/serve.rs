//! `podca serve`: the in-cluster signer (controller, admin server).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use podca_controller::{LeaderElection, Options};
use podca_signer::FileStore;

use crate::config::{CaBackend, Config};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML).
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kubeconfig file; default: KUBECONFIG, ~/.kube/config, then the in-cluster service account.
    #[arg(long, env = "PODCA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Admin listener (/metrics, /livez, /readyz); overrides `[admin] listen`.
    #[arg(long, env = "PODCA_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Concurrent PCR workers; overrides `[controller] workers`.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Bound of the PCR work queue.
    #[arg(long, default_value_t = 4096)]
    pub queue_capacity: usize,
    /// Take a coordination.k8s.io/v1 Lease; only the holder writes.
    #[arg(long)]
    pub leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = "podca-controller")]
    pub lease_name: String,
    /// Namespace of the leader Lease (default: POD_NAMESPACE, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Identity in the Lease (default: POD_NAME or the host name, plus a random suffix).
    #[arg(long)]
    pub lease_identity: Option<String>,
    /// How long a Lease is valid after its last renewal (e.g. `15s`).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// The holder renews this long after its last renewal at the latest (e.g. `10s`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lease_renew_deadline: Duration,
    /// Wait between attempts after a leader-election error (e.g. `2s`).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub lease_retry_period: Duration,
    /// How long shutdown waits for in-flight status writes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
}

/// `15s`, `2m`, `500ms` or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 15s, 2m or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{text:?}: unknown unit {unit:?} (use ms, s or m)")),
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        config,
        kubeconfig,
        admin_listen,
        workers,
        queue_capacity,
        leader_elect,
        lease_name,
        lease_namespace,
        lease_identity,
        lease_duration,
        lease_renew_deadline,
        lease_retry_period,
        drain_timeout,
    } = args;
    let config_path = config.context("--config is required for `podca serve`")?;
    let config = Config::load(&config_path)?;
    if config.signers.is_empty() {
        bail!(
            "{}: no [signers.\"<name>\"] table configured",
            config_path.display()
        );
    }
    let ca = match config.ca.backend {
        CaBackend::File => {
            let dir = config
                .ca
                .dir
                .clone()
                .context("[ca] dir is required for the file backend")?;
            FileStore::new(&dir)
                .load()
                .with_context(|| format!("loading the CA from {}", dir.display()))?
        }
        CaBackend::Secret => {
            bail!("[ca] backend = \"secret\" is not supported by `podca serve` yet; use \"file\"")
        }
        CaBackend::Pkcs11 => {
            bail!("[ca] backend = \"pkcs11\" is not supported by `podca serve` yet; use \"file\"")
        }
    };
    if lease_renew_deadline >= lease_duration {
        bail!("--lease-renew-deadline must be shorter than --lease-duration");
    }
    let mut options = Options::new(config.signers.clone(), Arc::new(ca));
    options.workers = workers.unwrap_or(config.controller.workers).max(1);
    options.queue_capacity = queue_capacity.max(1);
    options.admin_listen = Some(admin_listen.unwrap_or(config.admin.listen));
    options.drain_timeout = drain_timeout;
    options.reporting_instance = std::env::var("POD_NAME").ok();
    if leader_elect {
        let base = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "podca".into());
        options.leader_election = Some(LeaderElection {
            lease_name,
            lease_namespace: lease_namespace.unwrap_or_else(|| "default".into()),
            identity: lease_identity.unwrap_or_else(|| format!("{base}-{:08x}", rand_suffix())),
            lease_duration,
            renew_deadline: lease_renew_deadline,
            retry_period: lease_retry_period,
        });
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let client = podca_controller::connect(kubeconfig.as_deref()).await?;
        podca_controller::run(client, options, podca_controller::shutdown_signal()).await?;
        Ok(())
    })
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5h").is_err());
    }
}
