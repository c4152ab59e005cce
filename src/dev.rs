//! `podca dev`: the same CA on a laptop with no cluster.
//!
//! Creates (first run) or reuses a local CA in the data directory, serves the `podca.v1` gRPC
//! API on loopback and the SPIFFE Workload API on a Unix socket, keeps kubelet-layout credential
//! bundles for chosen identities, runs the CA rotation schedule and follows changes to the data
//! directory within seconds, and reloads the CA from it at once on SIGHUP (so a
//! rotation done by another command reaches every open stream).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use podca_authority::components::ca;
use podca_authority::components::{jwt, ledger};
use podca_authority::config::{Config, DevBundle};
use podca_authority::rotation::Rotator;
use podca_authority::{Runtime, RuntimeOptions, Stage, shutdown};
use podca_grpc::component::{self as grpc, Callers, Mode, Oidc, Settings};
use podca_grpc::dev_banner::{Serving, banner};
use podca_grpc::jwt::JwtService;
use podca_grpc::keeper;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::commands::default_data_dir;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Data directory for the CA, the Workload API socket and credential bundles.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Config file (TOML); without one: a permissive signer for `podca.dev.local` and the
    /// current user as default/default.
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the podca.v1 gRPC API; loopback only (port 0 picks a free port).
    #[arg(long)]
    pub grpc_listen: Option<SocketAddr>,
    /// Path of the SPIFFE Workload API socket [default: <data-dir>/workload.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Keep a credential bundle for this identity (`namespace/service-account`, optionally
    /// `:KEY_TYPE` such as `:MLDSA65`; default ECDSAP256); repeatable.
    #[arg(long = "bundle", value_name = "NS/SA[:KEY_TYPE]")]
    pub bundles: Vec<String>,
}

pub fn run(args: DevArgs) -> anyhow::Result<()> {
    podca_authority::runtime::tokio_runtime()
        .context("starting the async runtime")?
        .block_on(run_async(args))
}

/// How long stopping may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Composes the components: the data directory's CA, ledger and JWT keys, the gRPC API on
/// loopback and the Workload API socket, OIDC discovery and the credential-bundle keeper.
async fn run_async(args: DevArgs) -> anyhow::Result<()> {
    let DevArgs {
        data_dir,
        config,
        grpc_listen,
        socket,
        bundles,
    } = args;
    let data_dir = data_dir.unwrap_or_else(default_data_dir);
    let bundles = bundles
        .iter()
        .map(|spec| {
            spec.parse::<DevBundle>()
                .map_err(|e| anyhow::anyhow!("--bundle {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let configured = config.is_some();
    let mut config = match &config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let plan = config.plan_dev(configured, bundles, current_uid(&data_dir)?)?;
    let created = ca::place_in_data_dir(&mut config, &data_dir)?;
    // The dev signer's CA: its anchors are the ones the banner points at.
    let signer_ca_dir = config
        .ca_dir_of_signer(&plan.signer)
        .unwrap_or(&data_dir)
        .to_owned();
    let mut settings = Settings::from_config(&config, grpc_listen, Mode::Dev)?;
    let socket = socket
        .or_else(|| config.workload_api.socket.clone())
        .unwrap_or_else(|| data_dir.join("workload.sock"));
    // Handlers first: the banner says "ready", and a signal right after it must stop us cleanly
    // rather than kill the process with the socket left behind.
    let signals = shutdown::signals().context("installing the SIGTERM and SIGINT handlers")?;
    let hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;

    let mut rt = Runtime::new(RuntimeOptions {
        admin_listen: None,
        drain_timeout: DRAIN_TIMEOUT,
        clock: podca_authority::system_clock(),
    });
    // The rule counters are the compiled policies' own; every component serves clones of them.
    rt.metrics().export_policies(&config.signers);
    podca_authority::traces::start(&mut rt, &config.tracing, podca_grpc::otlp::exporter)?;
    let cas = ca::plan(&config, false)?;
    // Every decision made here goes into the data directory's ledger (unless `[ledger]` says
    // otherwise), as `podca issue`'s do, before the answer leaves; `podca ledger list` reads a
    // redb ledger once podca dev has stopped (redb allows one process).
    let redb = podca_signer::FileStore::new(&data_dir).ledger_path();
    let ledger = ledger::start(&mut rt, &config.ledger, Some(&redb), None)
        .await
        .context("opening the ledger")?;
    // JWT-SVIDs: keys in `<data dir>/jwt/`, made on the first start, rotated on `[jwt]`'s
    // schedule; other processes' changes are picked up within 5 s.
    let keys = jwt::start(&mut rt, &config.jwt, &config.ca, &data_dir, false)?;
    let oidc = Oidc::bind(&config.jwt, None, Mode::Dev).await?;
    let (cas, running) = cas.start_directories(&mut rt)?;
    let jwt = keys.as_ref().map(|keys| {
        let mut jwt_config = config.jwt.clone();
        if let Some((_, issuer)) = &oidc {
            jwt_config.issuer = Some(issuer.clone());
        }
        Arc::new(JwtService::new(keys.clone(), &jwt_config))
    });
    if let (Some(keys), Some((oidc, _))) = (&keys, oidc) {
        println!("podca dev: OIDC discovery on {}", oidc.url());
        oidc.serve(&mut rt, keys, None)?;
    }
    let callers = Callers::Dev {
        identities: plan.identities.clone(),
    };
    let own = config.signers.values().map(|p| p.trust_domain.clone());
    let federated = podca_grpc::federation::FederatedBundles::new(own);
    settings.federated = Some(federated.clone());
    let grpc = grpc::start(
        &mut rt,
        settings,
        callers,
        None,
        &cas,
        ledger,
        jwt,
        Some(&socket),
    )
    .await?;
    let endpoint = podca_grpc::bundle_endpoint::start(&mut rt, &config, &cas, keys.as_ref());
    if let Some(endpoint) = endpoint.await? {
        let (td, addr) = (endpoint.trust_domain, endpoint.addr);
        println!("podca dev: SPIFFE bundle endpoint for {td} on https://{addr}/");
    }
    let kept_at = Some(data_dir.join("federation"));
    podca_grpc::federation_fetch::start(&mut rt, &config.federation, &federated, kept_at)?;
    let kept = keeper::start(
        &mut rt,
        &grpc.api,
        plan.bundles.clone(),
        &data_dir.join("bundles"),
    );
    let rotators = running.into_values().map(|ca| ca.rotator).collect();
    reload_on_sighup(&mut rt, hup, rotators);

    let made = !created.is_empty();
    let serving = Serving {
        data_dir: &signer_ca_dir,
        created: made,
        listen: grpc.addr,
        socket: &socket,
        bundles: &kept,
    };
    print!("{}", banner(&plan, &serving));
    rt.run(async {
        signals.await;
        println!("podca dev: stopping");
    })
    .await?;
    Ok(())
}

/// SIGHUP reloads every CA from the data directory at once (after `podca ca rotate`), so the
/// new bundle reaches every open stream without waiting for the driver's next look.
fn reload_on_sighup(rt: &mut Runtime, mut hup: Signal, rotators: Vec<Arc<Rotator>>) {
    rt.spawn(Stage::Serve, "SIGHUP reload", move |mut stop| async move {
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = hup.recv() => for rotator in &rotators {
                    match rotator.reload_described() {
                        (true, line) => println!("podca dev: {line}"),
                        (false, line) => eprintln!("podca dev: {line}"),
                    }
                },
            }
        }
    });
}

/// The uid this process runs as, without libc: the owner of `/proc/self`, or of a file we create.
fn current_uid(data_dir: &Path) -> anyhow::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(meta) = std::fs::metadata("/proc/self") {
        return Ok(meta.uid());
    }
    let probe = data_dir.join(".uid-probe");
    std::fs::write(&probe, b"")?;
    let uid = std::fs::metadata(&probe)?.uid();
    let _ = std::fs::remove_file(&probe);
    Ok(uid)
}
