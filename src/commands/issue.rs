//! `podca issue`: issue from a CSR file, or for a generated key, with the local CA.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podca_signer::keys::GeneratedKey;
use podca_signer::policy::DNS_NAMES_ANNOTATION;
use podca_signer::{
    CertificateRequest, FileStore, KeyType, Ledger, LedgerRecord, Outcome, SignerPolicy, SubjectKey,
};
use time::{Duration, OffsetDateTime};

#[derive(Debug, Args)]
pub struct IssueArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// Certify the key of this PKCS#10 CSR (PEM or DER); its signature is verified.
    #[arg(long, conflicts_with = "key_type")]
    pub csr: Option<PathBuf>,
    /// Generate a key of this kubelet key type (RSA3072, RSA4096, ECDSAP256, ECDSAP384,
    /// ECDSAP521, ED25519) and write a credential bundle (PRIVATE KEY, then the chain).
    #[arg(long, default_value = "ECDSAP256")]
    pub key_type: Option<KeyType>,
    /// Namespace of the workload.
    #[arg(long, short)]
    pub namespace: String,
    /// Service account of the workload.
    #[arg(long)]
    pub service_account: String,
    /// SPIFFE trust domain.
    #[arg(long, default_value = "cluster.local")]
    pub trust_domain: String,
    /// Extra DNS SAN (repeatable).
    #[arg(long = "dns")]
    pub dns_names: Vec<String>,
    /// Lifetime in seconds (at least 3600; default 86400).
    #[arg(long)]
    pub lifetime_seconds: Option<i64>,
    /// Write the result here (mode 0600 when it holds a private key) instead of stdout.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub hsm: super::HsmArgs,
}

impl IssueArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let Self {
            dir,
            csr,
            key_type,
            namespace,
            service_account,
            trust_domain,
            dns_names,
            lifetime_seconds,
            out,
            hsm,
        } = self;
        let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
        let ca = super::open_active_ca(&store, &hsm)?;
        let (subject, private_pem) = match (&csr, key_type) {
            (Some(path), _) => {
                let bytes = std::fs::read(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let der = csr_der(&bytes)
                    .with_context(|| format!("{}: not a PEM or DER CSR", path.display()))?;
                let key = SubjectKey::from_csr_verified(&der)
                    .with_context(|| format!("CSR {}", path.display()))?;
                (key, None)
            }
            (None, Some(kt)) => {
                let generated = GeneratedKey::generate(kt)?;
                (generated.public.clone(), Some(generated.private_key_pem()))
            }
            (None, None) => anyhow::bail!("give --csr FILE or --key-type TYPE"),
        };
        let mut policy = SignerPolicy::permissive(&trust_domain);
        policy.allowed_dns_names = vec!["*".into()];
        policy.max_lifetime_seconds = policy.max_lifetime_seconds.max(365 * 86400);
        policy
            .validate()
            .with_context(|| format!("--trust-domain {trust_domain:?}"))?;
        let mut annotations = BTreeMap::new();
        if !dns_names.is_empty() {
            annotations.insert(DNS_NAMES_ANNOTATION.to_string(), dns_names.join(","));
        }
        let request = CertificateRequest {
            key: Ok(subject),
            namespace,
            service_account,
            pod_name: None,
            max_expiration: None,
            requested_lifetime: lifetime_seconds.map(Duration::seconds),
            user_annotations: annotations,
        };
        let now = OffsetDateTime::now_utc();
        let cert = match podca_signer::sign_request(&policy, &ca, &request, now) {
            Outcome::Issued(cert) => cert,
            Outcome::Denied { reason, message } => anyhow::bail!("denied ({reason}): {message}"),
            Outcome::Failed { reason, message } => anyhow::bail!("failed ({reason}): {message}"),
            Outcome::Retry(e) => anyhow::bail!("CA unavailable, try again: {e}"),
        };
        let ledger = Ledger::open(&store.ledger_path())?;
        ledger.append(&[LedgerRecord::of(&cert, "cli", None, None, now)])?;
        let output = match &private_pem {
            Some(key) => format!("{key}{}", cert.chain_pem),
            None => cert.chain_pem.clone(),
        };
        match out {
            Some(path) => {
                write_output(&path, &output, private_pem.is_some())?;
                eprintln!(
                    "issued {} (serial {}, expires {}) → {}",
                    cert.spiffe_id,
                    cert.serial,
                    cert.validity.not_after,
                    path.display()
                );
            }
            None => print!("{output}"),
        }
        Ok(())
    }
}

fn csr_der(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    if bytes.starts_with(b"-----") || bytes.iter().take(64).all(u8::is_ascii) {
        let text = std::str::from_utf8(bytes).context("not UTF-8 PEM")?;
        let block = pem::parse(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(
            block.tag() == "CERTIFICATE REQUEST" || block.tag() == "NEW CERTIFICATE REQUEST",
            "PEM block is {:?}, expected CERTIFICATE REQUEST",
            block.tag()
        );
        Ok(block.into_contents())
    } else {
        Ok(bytes.to_vec())
    }
}

fn write_output(path: &std::path::Path, text: &str, secret: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}
