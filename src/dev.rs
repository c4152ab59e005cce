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
use podca_signer::keys::GeneratedKey;
use podca_signer::{FileStore, InitOptions, KeyType, SignerPolicy};
use time::OffsetDateTime;
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::commands::default_data_dir;
use podca_authority::ca;
use podca_authority::config::{CaConfig, FileCa, Pkcs11Ca};
use podca_authority::config::{Config, DevBundle, DevIdentity};
use podca_authority::jwt::JwtRotator;
use podca_authority::ledger::{self, LedgerHandle, LedgerMetrics, Store};
use podca_authority::metrics::Metrics;
use podca_authority::oidc::{self, DISCOVERY_PATH, Discovery};
use podca_authority::rotation::{Rotator, RotatorOptions};
use podca_authority::shutdown::Shutdown;
use podca_grpc::auth::{DevAuthenticator, Identity};
use podca_grpc::core::{IssuedVia, IstioOptions};
use podca_grpc::jwt::JwtService;
use podca_grpc::{Api, ApiOptions, CaHandle, server};
use podca_signer::jwt::store::JwtStore;

/// The signer `podca dev` uses when the config names none.
pub const DEFAULT_SIGNER: &str = "podca.dev/default";
/// Its trust domain.
pub const DEFAULT_TRUST_DOMAIN: &str = "podca.dev.local";

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
    /// Keep a credential bundle for this identity (`namespace/service-account`); repeatable.
    #[arg(long = "bundle", value_name = "NS/SA")]
    pub bundles: Vec<String>,
}

pub fn run(args: DevArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: DevArgs) -> anyhow::Result<()> {
    let DevArgs {
        data_dir,
        config,
        grpc_listen,
        socket,
        bundles,
    } = args;
    let data_dir = data_dir.unwrap_or_else(default_data_dir);
    let mut config = match &config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if config.signers.is_empty() {
        config.signers.insert(
            DEFAULT_SIGNER.into(),
            SignerPolicy::permissive(DEFAULT_TRUST_DOMAIN),
        );
    }
    let (signer_name, _) = config.grpc_signer()?;
    let signer_name = signer_name.to_owned();

    let ca_config = dev_ca_config(&config.ca, &data_dir)?;
    let store = FileStore::new(&data_dir);
    // A first run makes a file CA; a CA whose key is in an HSM is made with `podca ca init
    // --pkcs11-uri` first.
    let created = !store.is_initialised() && matches!(ca_config, CaConfig::File(_));
    if created {
        let options = InitOptions {
            name: "podca dev".into(),
            ..InitOptions::default()
        };
        store
            .init(&options, OffsetDateTime::now_utc())
            .with_context(|| format!("creating a CA in {}", data_dir.display()))?;
    }
    // A writer killed mid-change left the directory half-way: finish or roll back first.
    store
        .recover()
        .with_context(|| format!("repairing the CA data directory {}", data_dir.display()))?;
    let max_leaf_lifetime = config.max_leaf_lifetime();
    let source = ca::open(&ca_config, max_leaf_lifetime)?;
    let (active, anchors) = source.load().context("opening the CA")?;
    let ca = CaHandle::new(active, anchors);
    // The rotation driver: runs the [rotation] schedule (unless [ca] automatic_rotation = false)
    // and follows changes to the data directory (`podca ca rotate`) within 5 s.
    if source.automatic_rotation {
        config
            .rotation
            .validate()
            .context("[rotation] in the config file")?;
    }
    let clock = podca_authority::system_clock();
    let rotator = Arc::new(Rotator::new(
        RotatorOptions {
            // The driver runs on the async runtime: wait briefly for a CLI writer, and retry at
            // the next tick rather than block.
            store: store.clone().with_lock_wait(Duration::from_secs(2)),
            schedule: config.rotation,
            automatic: source.automatic_rotation,
            max_leaf_lifetime,
            poll: Duration::from_secs(5),
            open: Arc::clone(&source.open),
            refresh_when: None,
        },
        ca.clone(),
        Arc::clone(&clock),
        Arc::new(Metrics::new()),
    ));

    let identities = if config.dev.identities.is_empty() {
        vec![DevIdentity {
            uid: current_uid(&data_dir)?,
            namespace: "default".into(),
            service_account: "default".into(),
        }]
    } else {
        config.dev.identities.clone()
    };
    let mut bundle_specs = config.dev.bundles.clone();
    for spec in &bundles {
        let (namespace, service_account) = spec
            .split_once('/')
            .filter(|(ns, sa)| !ns.is_empty() && !sa.is_empty())
            .with_context(|| format!("--bundle {spec:?}: expected namespace/service-account"))?;
        bundle_specs.push(DevBundle {
            namespace: namespace.into(),
            service_account: service_account.into(),
            key_type: KeyType::EcdsaP256,
        });
    }

    let listen = grpc_listen.unwrap_or(config.grpc.listen);
    anyhow::ensure!(
        listen.ip().is_loopback(),
        "podca dev serves gRPC on loopback only; {listen} is not a loopback address"
    );
    let tcp = TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let listen = tcp.local_addr()?;
    let socket = socket
        .or_else(|| config.workload_api.socket.clone())
        .unwrap_or_else(|| data_dir.join("workload.sock"));
    let unix = bind_socket(&socket)?;

    // Every decision made here goes into the data directory's ledger (unless `[ledger]` says
    // otherwise), as `podca issue`'s do, before the answer leaves; `podca ledger list` reads a
    // redb ledger once podca dev has stopped (redb allows one process).
    let mut tasks = Shutdown::new();
    let ledger_sink = match Store::open(&config.ledger.backend, Some(store.ledger_path().as_path()))
        .await
        .context("opening the ledger")?
    {
        Some(ledger_store) => {
            let (handle, writer) =
                ledger::start(ledger_store, &config.ledger, LedgerMetrics::default());
            tasks.spawn("ledger writer", writer.run(tasks.receiver()));
            handle
        }
        None => LedgerHandle::none(),
    };

    // JWT-SVIDs: keys in `<data dir>/jwt/`, made on the first start, rotated on `[jwt]`'s
    // schedule; other processes' changes are picked up within 5 s.
    // OIDC discovery on loopback, in plaintext like the gRPC API; without `[jwt] issuer` the
    // issuer is this listener's URL, so tokens and the document agree.
    let mut jwt_config = config.jwt.clone();
    let oidc = match jwt_config.oidc_listen.filter(|_| jwt_config.enabled) {
        Some(addr) => {
            anyhow::ensure!(
                addr.ip().is_loopback(),
                "podca dev serves OIDC discovery on loopback only; {addr} is not a loopback address"
            );
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("[jwt] oidc_listen: listening on {addr}"))?;
            let bound = listener.local_addr()?;
            if jwt_config.issuer.is_none() {
                jwt_config.issuer = Some(format!("http://{bound}"));
            }
            Some((listener, bound))
        }
        None => None,
    };
    let jwt = if jwt_config.enabled {
        let rotator = Arc::new(
            JwtRotator::start(
                JwtStore::new(store.clone().with_lock_wait(Duration::from_secs(2))),
                &config.jwt,
                Arc::clone(&clock),
                Duration::from_secs(5),
            )
            .context("the JWT signing keys ([jwt])")?,
        );
        tasks.spawn(
            "JWT key rotation driver",
            Arc::clone(&rotator).run(tasks.receiver()),
        );
        if let Some((listener, bound)) = oidc {
            let discovery = Discovery {
                issuer: jwt_config.issuer.clone().unwrap_or_default(),
                max_age: podca_grpc::jwt::refresh_hint(&jwt_config)
                    .try_into()
                    .unwrap_or(Duration::from_secs(60)),
                algorithm: podca_signer::jwt::JwtAlgorithm::for_key(jwt_config.key_algorithm)?,
            };
            println!("podca dev: OIDC discovery on http://{bound}{DISCOVERY_PATH}");
            tasks.spawn(
                "OIDC discovery",
                oidc::serve(
                    listener,
                    None,
                    discovery,
                    rotator.handle().clone(),
                    tasks.receiver(),
                ),
            );
        }
        Some(Arc::new(JwtService::new(
            rotator.handle().clone(),
            &jwt_config,
        )))
    } else {
        None
    };

    let api = Api::new(
        ApiOptions {
            signers: config.signers.clone(),
            default_signer: signer_name.clone(),
            allowed_signers: config.grpc_allowed_signers()?,
            max_dns_names: config.grpc.max_dns_names,
            node_proxy_service_accounts: config.grpc.node_proxy_service_accounts.clone(),
            rate_limit_per_identity: config.grpc.rate_limit_per_identity,
            max_open_streams: config.grpc.max_open_streams,
        },
        ca.clone(),
        Arc::new(DevAuthenticator::new(&identities)),
        None,
        tasks.receiver(),
    )?
    .with_ledger(ledger_sink)
    .with_clock(Arc::clone(&clock))
    // The Istio CA API on the loopback listener: callers are dev identities, as for
    // podca.v1 (no tokens, no ImpersonatedIdentity: there are no pods to check).
    .with_istio(IstioOptions {
        authenticator: None,
        trust_domain_alias: Some(config.grpc.istio_trust_domain_alias.clone())
            .filter(|alias| !alias.is_empty()),
    });
    // podca.v1 IssueJwtSvid / GetJwtBundle on both listeners, beside the Workload API's RPCs.
    let api = Arc::new(match &jwt {
        Some(jwt) => api.with_jwt(Arc::clone(jwt)),
        None => api,
    });

    tasks.spawn(
        "CA rotation driver",
        Arc::clone(&rotator).run(tasks.receiver()),
    );
    let limits = podca_grpc::connections::ConnectionLimits {
        per_peer: config.grpc.max_connections_per_peer.get(),
        total: config.grpc.max_connections.get(),
    };
    let tcp_server = server::serve_tcp(tcp, Arc::clone(&api), limits, tasks.stopped());
    tasks.spawn("gRPC server", async move {
        let _ = tcp_server.await;
    });
    let unix_server =
        server::serve_unix_with_jwt(unix, Arc::clone(&api), jwt.clone(), tasks.stopped());
    tasks.spawn("Workload API server", async move {
        let _ = unix_server.await;
    });

    let bundle_dir = data_dir.join("bundles");
    let mut bundle_paths = Vec::new();
    for spec in bundle_specs {
        let dir = bundle_dir.join(&spec.namespace).join(&spec.service_account);
        bundle_paths.push((
            format!("{}/{}", spec.namespace, spec.service_account),
            dir.clone(),
        ));
        let name = format!(
            "credential bundle {}/{}",
            spec.namespace, spec.service_account
        );
        let keeper = keep_bundle(Arc::clone(&api), spec, dir, tasks.receiver());
        tasks.spawn(name, keeper);
    }

    // Handlers first: the banner says "ready", and a signal right after it must stop us cleanly
    // rather than kill the process with the socket left behind.
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    print_banner(&Banner {
        data_dir: &data_dir,
        created,
        signer: &signer_name,
        trust_domain: &config.signers[&signer_name].trust_domain,
        listen,
        socket: &socket,
        identities: &identities,
        bundles: &bundle_paths,
    });

    loop {
        tokio::select! {
            _ = int.recv() => break,
            _ = term.recv() => break,
            _ = hup.recv() => match rotator.reload_now() {
                Ok(generation) => println!("podca dev: reloaded the CA from {} (generation {generation})", data_dir.display()),
                Err(e) => eprintln!("podca dev: reloading the CA failed, keeping the current one: {e:#}"),
            },
        }
    }
    println!("podca dev: stopping");
    let unfinished = tasks.drain(Duration::from_secs(5)).await;
    if unfinished.iter().any(|name| name == "ledger writer") {
        eprintln!("podca dev: the ledger writer did not finish within 5 s");
    }
    if !unfinished.is_empty() {
        eprintln!("podca dev: connections still open after 5 s; exiting anyway");
    }
    let _ = std::fs::remove_file(&socket);
    Ok(())
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

/// Binds the Workload API socket, replacing a stale one left by a crash.
fn bind_socket(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        anyhow::ensure!(
            meta.file_type().is_socket(),
            "{} exists and is not a socket; refusing to replace it",
            path.display()
        );
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("{} is in use by another process", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

struct Banner<'a> {
    data_dir: &'a Path,
    created: bool,
    signer: &'a str,
    trust_domain: &'a str,
    listen: SocketAddr,
    socket: &'a Path,
    identities: &'a [DevIdentity],
    bundles: &'a [(String, PathBuf)],
}

fn print_banner(b: &Banner<'_>) {
    let Banner {
        data_dir,
        created,
        signer,
        trust_domain,
        listen,
        socket,
        identities,
        bundles,
    } = b;
    let verb = if *created { "created" } else { "reusing" };
    println!("podca dev: {verb} the CA in {}", data_dir.display());
    println!(
        "podca dev: trust anchors: {}",
        data_dir.join("root.pem").display()
    );
    println!("podca dev: signer {signer} (trust domain {trust_domain})");
    for i in *identities {
        println!(
            "podca dev: uid {} is {}/{} (spiffe://{trust_domain}/ns/{}/sa/{})",
            i.uid, i.namespace, i.service_account, i.namespace, i.service_account
        );
    }
    println!("podca dev: gRPC API (podca.v1) on {listen}");
    println!(
        "podca dev: SPIFFE Workload API on unix://{}",
        socket.display()
    );
    println!(
        "  export SPIFFE_ENDPOINT_SOCKET=unix://{}",
        socket.display()
    );
    println!(
        "  grpcurl -plaintext -import-path proto/proto -proto podca/v1/podca.proto \
         -H 'x-podca-namespace: default' -H 'x-podca-service-account: default' \
         {listen} podca.v1.PodCA/GetTrustBundle"
    );
    for (identity, dir) in *bundles {
        println!(
            "podca dev: credential bundle for {identity}: {} (trust bundle {})",
            dir.join("credentialbundle.pem").display(),
            dir.join("trust-bundle.pem").display()
        );
    }
    println!(
        "podca dev: CA rotation runs on its schedule; `podca ca rotate` is picked up within 5 s \
         (SIGHUP: at once); Ctrl-C stops"
    );
    println!("podca dev: ready");
}

/// Keeps `<dir>/credentialbundle.pem` (PKCS#8 key, then the chain) and `<dir>/trust-bundle.pem`
/// fresh: renewed at beginRefreshAt and whenever the CA changes.
async fn keep_bundle(
    api: Arc<Api>,
    spec: DevBundle,
    dir: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    let identity = Identity::service_account(&spec.namespace, &spec.service_account);
    let mut ca = api.ca().subscribe();
    loop {
        let snapshot = Arc::clone(&ca.borrow_and_update());
        let wait = match write_bundle(&api, &identity, spec.key_type, snapshot, &dir).await {
            Ok(refresh_at) => (refresh_at - OffsetDateTime::now_utc())
                .try_into()
                .unwrap_or_default(),
            Err(e) => {
                eprintln!(
                    "podca dev: credential bundle for {}: {e:#}; retrying in 30 s",
                    identity.key()
                );
                Duration::from_secs(30)
            }
        };
        tokio::select! {
            changed = ca.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(wait) => {},
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

async fn write_bundle(
    api: &Api,
    identity: &Identity,
    key_type: KeyType,
    snapshot: Arc<podca_authority::CaSnapshot>,
    dir: &Path,
) -> anyhow::Result<OffsetDateTime> {
    // The signer's key generator writes PKCS#8 v1, which every TLS stack reads (Ed25519 too).
    let key = tokio::task::spawn_blocking(move || GeneratedKey::generate(key_type))
        .await?
        .with_context(|| format!("generating a {key_type} key"))?;
    let issued = api
        .issue_for_key(identity, key.public.clone(), snapshot, IssuedVia::DevBundle)
        .await?;
    std::fs::create_dir_all(dir)?;
    let mut credential = key.private_key_pem();
    credential.push_str(&issued.certificate.chain_pem);
    write_atomic(&dir.join("credentialbundle.pem"), &credential, 0o600)?;
    write_atomic(&dir.join("trust-bundle.pem"), &issued.anchors_pem, 0o644)?;
    Ok(issued.certificate.validity.begin_refresh_at)
}

fn write_atomic(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// The `[ca]` table as `podca dev` uses it: the CA always lives in the data directory (file
/// keys, or an HSM key recorded there); a Secret-held CA needs the Kubernetes API.
fn dev_ca_config(ca: &CaConfig, data_dir: &Path) -> anyhow::Result<CaConfig> {
    let dir = |configured: &Option<PathBuf>| match configured {
        Some(d) if d != data_dir => anyhow::bail!(
            "[ca] dir = {} but podca dev keeps its CA in the data directory {}; drop [ca] dir or \
             pass --data-dir {}",
            d.display(),
            data_dir.display(),
            d.display()
        ),
        _ => Ok(Some(data_dir.to_owned())),
    };
    Ok(match ca {
        CaConfig::Secret(s) => anyhow::bail!(
            "[ca] backend = \"secret\" ({}/{}) is read through the Kubernetes API, which podca \
             dev does not use; use backend = \"file\" (the default) or \"pkcs11\"",
            s.namespace,
            s.name
        ),
        CaConfig::File(f) => CaConfig::File(FileCa {
            dir: dir(&f.dir)?,
            automatic_rotation: f.automatic_rotation,
        }),
        CaConfig::Pkcs11(p) => CaConfig::Pkcs11(Pkcs11Ca {
            dir: dir(&p.dir)?,
            ..p.clone()
        }),
    })
}
