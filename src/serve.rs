//! `podca serve`: the in-cluster signer: the PodCertificateRequest controller, the gRPC API
//! (TokenReview-authenticated), the CA rotation driver and the admin server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use podca_authority::CaHandle;
use podca_authority::admin::Readiness;
use podca_authority::metrics::Metrics;
use podca_authority::rotation::{Rotator, RotatorOptions};
use podca_controller::publisher::PublisherOptions;
use podca_controller::secret_ca::{SecretCa, SecretCaOptions};
use podca_controller::{LeaderElection, Options};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::info;

use podca_authority::ca;
use podca_authority::config::{CaConfig, Config};
use podca_authority::hsm_metrics::HsmMetrics;
use podca_controller::grpc_auth::{KubePodDirectory, KubeTokenReviewer};
use podca_grpc::auth::TokenReviewAuthenticator;
use podca_grpc::{Api, ApiOptions, server};

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
    /// gRPC listener (podca.v1, TokenReview-authenticated); overrides `[grpc] listen`.
    #[arg(long, env = "PODCA_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// Do not serve the gRPC API (PodCertificateRequests only).
    #[arg(long)]
    pub no_grpc: bool,
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
        grpc_listen,
        no_grpc,
    } = args;
    let config_path = config.context("--config is required for `podca serve`")?;
    let config = Config::load(&config_path)?;
    if config.signers.is_empty() {
        bail!(
            "{}: no [signers.\"<name>\"] table configured",
            config_path.display()
        );
    }
    if lease_renew_deadline >= lease_duration {
        bail!("--lease-renew-deadline must be shorter than --lease-duration");
    }
    let max_leaf_lifetime = config.max_leaf_lifetime();
    let mut metrics = Metrics::new();
    let clock = podca_authority::system_clock();
    let backend = match &config.ca {
        CaConfig::Secret(secret) => {
            config.rotation.validate()?;
            let mut o = SecretCaOptions::new(&secret.namespace, &secret.name);
            o.schedule = config.rotation;
            o.max_leaf_lifetime = max_leaf_lifetime;
            Backend::Secret(o)
        }
        CaConfig::File(_) | CaConfig::Pkcs11(_) => {
            let source = ca::open(&config.ca, max_leaf_lifetime)?;
            // Opening the CA here makes a wrong PIN, a missing token or a broken data directory
            // a start-up error rather than a stream of pending requests.
            let (ca, anchors) = source.load().context("opening the CA")?;
            let handle = CaHandle::new(ca, anchors);
            let hsm_metrics = source
                .hsm
                .as_ref()
                .map(|_| HsmMetrics::register(&mut metrics.registry));
            let mut automatic = source.automatic_rotation;
            if automatic && leader_elect {
                // Replicas do not share a writable data directory: each would make its own CA.
                info!(
                    "automatic CA rotation is off with --leader-elect; rotate with `podca ca \
                     rotate` on the CA data directory (every replica follows the change without \
                     a restart)"
                );
                automatic = false;
            }
            if automatic && !dir_writable(source.store.dir()) {
                info!(
                    dir = %source.store.dir().display(),
                    "the CA data directory is read-only: automatic CA rotation is off (changes \
                     to it are still followed)"
                );
                automatic = false;
            }
            if automatic {
                config.rotation.validate()?;
            }
            let options = RotatorOptions {
                store: source.store.clone(),
                schedule: config.rotation,
                automatic,
                max_leaf_lifetime,
                poll: Duration::from_secs(5),
                open: Arc::clone(&source.open),
                refresh_when: source.intermediate,
            };
            Backend::Files {
                handle,
                rotator: options,
                hsm: source.hsm.clone().zip(hsm_metrics),
            }
        }
    };
    let metrics = Arc::new(metrics);

    let (leadership, _) = watch::channel(!leader_elect);
    let grpc = if no_grpc {
        None
    } else {
        let (signer_name, _) = config.grpc_signer()?;
        Some((
            grpc_listen.unwrap_or(config.grpc.listen),
            ApiOptions {
                signers: config.signers.clone(),
                default_signer: signer_name.to_owned(),
                node_proxy_service_accounts: config.grpc.node_proxy_service_accounts.clone(),
                rate_limit_per_identity: config.grpc.rate_limit_per_identity,
                max_open_streams: config.grpc.max_open_streams,
            },
            config.grpc.token_audience.clone(),
        ))
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let client = podca_controller::connect(kubeconfig.as_deref()).await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let handle = match backend {
            Backend::Files {
                handle,
                rotator,
                hsm,
            } => {
                let rotator = Rotator::new(
                    rotator,
                    handle.clone(),
                    Arc::clone(&clock),
                    Arc::clone(&metrics),
                );
                tasks.push(tokio::spawn(Arc::new(rotator).run(stop_rx.clone())));
                if let Some((slot, hsm_metrics)) = hsm {
                    tasks.push(tokio::spawn(hsm_metrics.export(slot, stop_rx.clone())));
                }
                handle
            }
            Backend::Secret(mut o) => {
                o.leading = Some(leadership.subscribe());
                let (handle, driver) =
                    SecretCa::start(client.clone(), o, Arc::clone(&clock), Arc::clone(&metrics))
                        .await
                        .context("opening the CA Secret")?;
                tasks.push(tokio::spawn(driver.run(stop_rx.clone())));
                handle
            }
        };
        // /readyz: the controller (watches synced, or standby) and the gRPC API (listening).
        let readiness = Readiness::new();
        let mut options = Options::new(config.signers.clone(), handle.clone());
        options.readiness = Some(Arc::clone(&readiness));
        options.leadership = Some(leadership.clone());
        options.clock = Arc::clone(&clock);
        options.metrics = Arc::clone(&metrics);
        options.workers = workers.unwrap_or(config.controller.workers).max(1);
        options.queue_capacity = queue_capacity.max(1);
        options.admin_listen = Some(admin_listen.unwrap_or(config.admin.listen));
        options.drain_timeout = drain_timeout;
        options.reporting_instance = std::env::var("POD_NAME").ok();
        if config.trust_bundles.publish {
            options.publisher = Some(PublisherOptions {
                suffix: config.trust_bundles.suffix.clone(),
                instance: config.trust_bundles.instance.clone(),
                resync: Duration::from_secs(config.trust_bundles.resync_seconds.max(1)),
            });
        }
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
        if let Some((listen, api_options, audience)) = grpc {
            let tcp = TcpListener::bind(listen)
                .await
                .with_context(|| format!("gRPC: listening on {listen}"))?;
            info!(addr = %tcp.local_addr()?, audience, "gRPC API (podca.v1) listening");
            let grpc_ready = readiness.component("grpc");
            grpc_ready.set(true);
            let api = Arc::new(
                Api::new(
                    api_options,
                    handle.clone(),
                    Arc::new(
                        TokenReviewAuthenticator::new(
                            Arc::new(KubeTokenReviewer::new(client.clone())),
                            audience,
                        )
                        .with_clock(Arc::clone(&clock)),
                    ),
                    Some(Arc::new(KubePodDirectory::new(client.clone()))),
                    stop_rx.clone(),
                )?
                .with_clock(Arc::clone(&clock)),
            );
            let mut stop = stop_rx.clone();
            tasks.push(tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) = server::serve_tcp(tcp, api, shutdown).await {
                    tracing::error!(error = %e, "gRPC server failed");
                }
                grpc_ready.set(false);
            }));
        }
        let result =
            podca_controller::run(client, options, podca_authority::shutdown::signal()).await;
        let _ = stop_tx.send(true);
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        result?;
        Ok(())
    })
}

/// Whether podca may write the CA state in `dir` (a Secret mount is read-only).
fn dir_writable(dir: &std::path::Path) -> bool {
    let probe = dir.join(format!(".podca-write-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            true
        }
        Err(_) => false,
    }
}

/// Where the CA comes from, as set up before the runtime starts.
enum Backend {
    /// A data directory (file or PKCS#11 keys), followed and rotated by the rotation driver.
    Files {
        handle: CaHandle,
        rotator: RotatorOptions,
        hsm: Option<(podca_authority::ca::HsmKeySlot, HsmMetrics)>,
    },
    /// A kubernetes.io/tls Secret, read and watched through the API.
    Secret(SecretCaOptions),
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
