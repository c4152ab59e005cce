//! `podca ca init|show`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use podca_authority::ca_report;
use podca_signer::{CaAlgorithm, FileStore, InitOptions, NameConstraints};
use time::{Duration, OffsetDateTime};

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create a root and an issuing CA in the data directory, or import an existing CA.
    Init(InitArgs),
    /// Show every CA generation: phase, subject, validity, fingerprint.
    Show(ShowArgs),
    /// Rotate: prepare the next CA now (published at once, signing after the propagation
    /// window), and apply any step the schedule has due (activate, retire, drop).
    Rotate(RotateArgs),
}

#[derive(Debug, Args)]
pub struct RotateArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub select: super::CaSelect,
    /// Only apply what the schedule has due; do not start a rotation.
    #[arg(long)]
    pub scheduled_only: bool,
    /// Lifetime of the new CA, in days.
    #[arg(long, default_value_t = 365)]
    pub ca_lifetime_days: i64,
    /// Minimum time the new anchor is published before it signs, in seconds (≥ 600).
    #[arg(long, default_value_t = 900)]
    pub propagation_seconds: i64,
    /// Longest leaf lifetime issued (bounds how long the old anchor must stay), in seconds.
    #[arg(long, default_value_t = 7 * 86400)]
    pub max_leaf_lifetime_seconds: i64,
    /// Key algorithm of the new CA and of every later one (e.g. ml-dsa-65 to migrate to a
    /// post-quantum CA); default: the algorithm the last one was made with.
    #[arg(long, value_parser = crate::cli::spelled::<CaAlgorithm>(), ignore_case = true)]
    pub algorithm: Option<CaAlgorithm>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub select: super::CaSelect,
    /// CA key algorithm (any case).
    #[arg(long, default_value = "ecdsa-p256", value_parser = crate::cli::spelled::<CaAlgorithm>(), ignore_case = true)]
    pub algorithm: CaAlgorithm,
    /// Common-name prefix of the CA certificates.
    #[arg(long, default_value = "podca")]
    pub name: String,
    /// Root CA lifetime in days.
    #[arg(long, default_value_t = 3650)]
    pub root_days: i64,
    /// Issuing CA lifetime in days.
    #[arg(long, default_value_t = 365)]
    pub issuing_days: i64,
    /// Name constraints: permit only URIs of this SPIFFE trust domain (`cluster.local` or
    /// `spiffe://cluster.local`) below the CA. Repeatable. Rotated generations keep them.
    /// Caution: rustls refuses every leaf under URI constraints (docs/trust-domains.md, "Tenants").
    #[arg(
        long = "permitted-trust-domain",
        value_name = "TRUST_DOMAIN",
        conflicts_with = "import_cert"
    )]
    pub permitted_trust_domains: Vec<String>,
    /// Name constraints: permit only DNS names in this subtree (`example.com` permits it and
    /// every name below it). Repeatable.
    #[arg(
        long = "permitted-dns",
        value_name = "DOMAIN",
        conflicts_with = "import_cert"
    )]
    pub permitted_dns: Vec<String>,
    /// Import this CA certificate (PEM; may be followed by intermediates and the root)
    /// instead of creating a CA.
    #[arg(long, requires = "import_key")]
    pub import_cert: Option<PathBuf>,
    /// The imported CA's private key (PEM: PKCS#8, SEC1 or PKCS#1).
    #[arg(long, requires = "import_cert")]
    pub import_key: Option<PathBuf>,
    /// Trust anchors of the imported CA (PEM), when --import-cert does not end in a root.
    #[arg(long, requires = "import_cert")]
    pub import_roots: Option<PathBuf>,
    /// Keep the CA key in an HSM: the RFC 7512 URI of the key, e.g.
    /// `pkcs11:token=podca;object=podca-ca?module-path=/usr/lib/softhsm/libsofthsm2.so`.
    /// The CA is then a self-signed root whose key, inside the token, signs every leaf.
    #[arg(long, conflicts_with_all = ["import_cert", "import_key"])]
    pub pkcs11_uri: Option<String>,
    /// With --pkcs11-uri: generate the key pair inside the token (sensitive, non-extractable)
    /// instead of using an existing one.
    #[arg(long, requires = "pkcs11_uri")]
    pub pkcs11_generate: bool,
    #[command(flatten)]
    pub hsm: super::HsmArgs,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR", conflicts_with = "secret")]
    pub dir: Option<PathBuf>,
    /// Without --ca: every CA of --config, with the signers that sign with it.
    #[command(flatten)]
    pub select: super::CaSelect,
    /// A Secret-held CA (`[ca] backend = "secret"`): show the generations podca serve recorded
    /// for the Secret `namespace/name` (its history ConfigMap; read access is enough).
    #[arg(long)]
    pub secret: Option<String>,
    /// Kubeconfig for --secret; default: KUBECONFIG, ~/.kube/config, in-cluster.
    #[arg(long, requires = "secret")]
    pub kubeconfig: Option<PathBuf>,
    /// With --secret: exit with status 1 unless the history is sealed and its seal verifies
    /// against the Secret's certificates (for scripts and monitoring).
    #[arg(long, requires = "secret")]
    pub check: bool,
    /// With --secret: the Secret holding the JWT-SVID signing keys (`[jwt] keys_secret`);
    /// default `<name>-jwt`. Listing them needs `get` on it; without, a line says so.
    #[arg(long, requires = "secret", value_name = "NAME")]
    pub jwt_keys_secret: Option<String>,
    #[command(flatten)]
    pub hsm: super::HsmArgs,
}

impl CaCommand {
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            CaCommand::Init(a) => a.run(),
            CaCommand::Show(a) => a.run(),
            CaCommand::Rotate(a) => a.run(),
        }
    }
}

impl InitArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self {
            dir,
            select,
            algorithm,
            name,
            root_days,
            issuing_days,
            permitted_trust_domains,
            permitted_dns,
            import_cert,
            import_key,
            import_roots,
            pkcs11_uri,
            pkcs11_generate,
            hsm,
        } = self;
        let store = FileStore::new(select.dir(dir)?);
        let mut name_constraints = NameConstraints::new(&permitted_trust_domains, &permitted_dns)
            .context("--permitted-trust-domain/--permitted-dns")?;
        // A tenant's CA (--ca): constrained to the tenant's names unless given explicitly.
        if let (true, Some(tenant)) = (name_constraints.is_empty(), select.tenant_constraints()?) {
            name_constraints = tenant;
        }
        let options = InitOptions {
            algorithm,
            name,
            root_validity: Duration::days(root_days),
            issuing_validity: Duration::days(issuing_days),
            name_constraints,
        };
        if let Some(uri) = pkcs11_uri {
            if algorithm.is_ml_dsa() {
                podca_signer::backend::Pkcs11Key::supports(algorithm)
                    .with_context(|| format!("--algorithm {algorithm} with --pkcs11-uri"))?;
            }
            let config = hsm.config(&uri)?;
            let key = if pkcs11_generate {
                podca_signer::backend::Pkcs11Key::generate(&config, algorithm)
                    .with_context(|| format!("generating the CA key in {uri}"))?
            } else {
                podca_signer::backend::Pkcs11Key::open(&config)
                    .with_context(|| format!("opening the CA key {uri}"))?
            };
            let ca = store.init_with_key(
                std::sync::Arc::new(key),
                &options,
                OffsetDateTime::now_utc(),
            )?;
            print!("{}", ca_report::initialised(&store, &ca, Some(&uri)));
            return Ok(());
        }
        let ca = match (import_cert, import_key) {
            (Some(cert), Some(key)) => {
                let cert_pem = read(&cert)?;
                let key_pem = read(&key)?;
                let roots = import_roots.as_deref().map(read).transpose()?;
                store
                    .import(&cert_pem, &key_pem, roots.as_deref())
                    .with_context(|| format!("importing {}", cert.display()))?
            }
            _ => {
                if root_days < 1 || issuing_days < 1 || issuing_days > root_days {
                    anyhow::bail!(
                        "--issuing-days ({issuing_days}) must be between 1 and --root-days ({root_days})"
                    );
                }
                store.init(&options, OffsetDateTime::now_utc())?
            }
        };
        print!("{}", ca_report::initialised(&store, &ca, None));
        Ok(())
    }
}

impl ShowArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self {
            dir,
            select,
            secret,
            kubeconfig,
            check,
            jwt_keys_secret,
            hsm,
        } = self;
        if let Some(secret) = secret {
            return show_secret_history(
                &secret,
                kubeconfig.as_deref(),
                check,
                jwt_keys_secret.as_deref(),
            );
        }
        let now = OffsetDateTime::now_utc();
        if let (None, None, Some(config)) = (&dir, &select.ca, &select.config) {
            let config = podca_authority::config::Config::load(config)?;
            print!("{}", ca_report::configuration(&config, now));
            return Ok(());
        }
        let store = FileStore::new(select.dir(dir)?);
        let ca = super::open_active_ca(&store, &hsm)?;
        let key = (ca.key().location(), ca.key().algorithm().to_string());
        print!("{}", ca_report::directory(&store, Some(key), now)?);
        Ok(())
    }
}

/// `podca ca show --secret ns/name`: the Secret CA's history and JWT keys
/// (`podca_controller::secret_history::show`); with `check`, an error unless the seal verifies.
fn show_secret_history(
    secret: &str,
    kubeconfig: Option<&std::path::Path>,
    check: bool,
    jwt_keys_secret: Option<&str>,
) -> anyhow::Result<()> {
    let runtime = super::block_on_runtime()?;
    let shown = runtime.block_on(podca_controller::secret_history::show(
        secret,
        kubeconfig,
        jwt_keys_secret,
        OffsetDateTime::now_utc(),
    ))?;
    print!("{}", shown.text);
    match shown.problem {
        Some(problem) if check => anyhow::bail!("ConfigMap {}: {problem}", shown.configmap),
        _ => Ok(()),
    }
}

fn read(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

impl RotateArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self {
            dir,
            select,
            scheduled_only,
            ca_lifetime_days,
            propagation_seconds,
            max_leaf_lifetime_seconds,
            algorithm,
        } = self;
        let store = FileStore::new(select.dir(dir)?);
        if let Some(algorithm) = algorithm {
            let previous = store.set_algorithm(algorithm, OffsetDateTime::now_utc())?;
            if previous != algorithm {
                eprintln!("new CA generations use {algorithm} (was {previous})");
            }
        }
        let schedule = podca_signer::rotation::Schedule {
            ca_lifetime_seconds: ca_lifetime_days * 86400,
            propagation_seconds,
            ..Default::default()
        };
        let max_leaf = Duration::seconds(max_leaf_lifetime_seconds);
        let now = OffsetDateTime::now_utc();
        print!(
            "{}",
            ca_report::rotate(&store, &schedule, max_leaf, !scheduled_only, now)?
        );
        Ok(())
    }
}
