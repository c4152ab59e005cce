//! `podca ca init|show`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use podca_signer::{CaAlgorithm, CaCertificate, FileStore, InitOptions};
use time::{Duration, OffsetDateTime};

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create a root and an issuing CA in the data directory, or import an existing CA.
    Init(InitArgs),
    /// Show every CA certificate in the data directory: role, subject, validity, fingerprint.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// CA key algorithm: ecdsa-p256, ecdsa-p384 or ed25519.
    #[arg(long, default_value = "ecdsa-p256")]
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
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
}

impl CaCommand {
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            CaCommand::Init(a) => a.run(),
            CaCommand::Show(a) => a.run(),
        }
    }
}

impl InitArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self {
            dir,
            algorithm,
            name,
            root_days,
            issuing_days,
            import_cert,
            import_key,
            import_roots,
        } = self;
        let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
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
                store.init(
                    &InitOptions {
                        algorithm,
                        name,
                        root_validity: Duration::days(root_days),
                        issuing_validity: Duration::days(issuing_days),
                    },
                    OffsetDateTime::now_utc(),
                )?
            }
        };
        println!("CA ready in {}", store.dir().display());
        println!(
            "  issuing: {} (expires {})",
            ca.certificate().subject(),
            ca.not_after()
        );
        for root in ca.roots() {
            println!("  root:    {} (expires {})", root.subject(), root.not_after());
        }
        println!("  trust anchors: {}", store.root_cert_path().display());
        Ok(())
    }
}

impl ShowArgs {
    fn run(self) -> anyhow::Result<()> {
        let Self { dir } = self;
        let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
        let ca = store.load()?;
        let now = OffsetDateTime::now_utc();
        println!("CA data directory: {}", store.dir().display());
        println!("key: {} ({})", ca.key().location(), ca.key().algorithm());
        print_cert("issuing (active)", ca.certificate(), now);
        for c in ca.chain().iter().filter(|c| *c != ca.certificate()) {
            print_cert("intermediate", c, now);
        }
        for r in ca.roots() {
            print_cert("root (trust anchor)", r, now);
        }
        Ok(())
    }
}

fn print_cert(role: &str, c: &CaCertificate, now: OffsetDateTime) {
    let left = c.not_after() - now;
    let state = if left.is_negative() {
        "EXPIRED".to_string()
    } else {
        format!("{} days left", left.whole_days())
    };
    println!("{role}:");
    println!("  subject:    {}", c.subject());
    println!("  issuer:     {}", c.issuer());
    println!("  not before: {}", c.not_before());
    println!("  not after:  {} ({state})", c.not_after());
    println!("  sha256:     {}", c.fingerprint());
}

fn read(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}
