//! `podca inspect`: decode a certificate, chain or credential bundle and check it; or a
//! JWT-SVID (`super::inspect_jwt`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podca_signer::{CaCertificate, FileStore, report};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// PEM file: a certificate, a chain, or a credential bundle (PRIVATE KEY + chain); or a
    /// file holding a JWT-SVID.
    pub file: PathBuf,
    /// Trust anchors (PEM) to check the chain against; defaults to the local CA's, if any.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// CA data directory whose roots are used when --ca-file is not given.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// JWT-SVIDs: the JWKS (SPIFFE bundle or OIDC) to validate against; defaults to the data
    /// directory's JWT keys.
    #[arg(long)]
    pub jwks: Option<PathBuf>,
    /// JWT-SVIDs: the audience to validate for; defaults to the token's first.
    #[arg(long)]
    pub audience: Option<String>,
}

impl InspectArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let Self {
            file,
            ca_file,
            dir,
            jwks,
            audience,
        } = self;
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        if super::inspect_jwt::looks_like_jwt(&text) {
            return super::inspect_jwt::inspect(
                &file,
                &text,
                jwks.as_ref(),
                audience.as_deref(),
                dir,
            );
        }
        let blocks = pem::parse_many(&text)
            .map_err(|e| anyhow::anyhow!("{}: not PEM: {e}", file.display()))?;
        anyhow::ensure!(!blocks.is_empty(), "{}: no PEM blocks", file.display());
        let mut certs = vec![];
        let mut private_key = None;
        for (i, block) in blocks.iter().enumerate() {
            match block.tag() {
                "CERTIFICATE" => certs.push(block.contents().to_vec()),
                "PRIVATE KEY" | "EC PRIVATE KEY" | "RSA PRIVATE KEY" => {
                    private_key = Some(block.contents().to_vec());
                }
                other => anyhow::bail!("{}: PEM block {i} is {other:?}", file.display()),
            }
        }
        let now = OffsetDateTime::now_utc();
        let mut parsed = vec![];
        for (i, der) in certs.iter().enumerate() {
            let (_, cert) = X509Certificate::from_der(der)
                .map_err(|e| anyhow::anyhow!("{}: certificate {i}: {e}", file.display()))?;
            print!("{}", report::certificate_details(i, &cert, der, now));
            parsed.push(
                CaCertificate::from_der(der)
                    .with_context(|| format!("{}: certificate {i}", file.display()))?,
            );
        }
        if let Some(key) = private_key {
            check_private_key(&key, &certs)?;
        }
        let anchors = match (&ca_file, dir) {
            (Some(path), _) => Ok(CaCertificate::all_from_pem(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?,
            )?),
            (None, dir) => {
                let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
                let dir = store.dir().display();
                (store.roots()).map_err(|_| format!("no --ca-file and no local CA in {dir}"))
            }
        };
        let anchors = anchors.as_deref().map_err(String::as_str);
        let (lines, ok) = report::chain(&parsed, anchors);
        print!("{lines}");
        anyhow::ensure!(ok, "{}: the chain does not verify", file.display());
        Ok(())
    }
}

fn check_private_key(key_der: &[u8], certs: &[Vec<u8>]) -> anyhow::Result<()> {
    let Some(leaf) = certs.first() else {
        anyhow::bail!("the bundle holds a private key but no certificate");
    };
    let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", key_der.to_vec()));
    let pair = rcgen::KeyPair::from_pem(&pem).context("the private key does not parse")?;
    let (_, cert) = X509Certificate::from_der(leaf).map_err(|e| anyhow::anyhow!("{e}"))?;
    if rcgen::PublicKeyData::subject_public_key_info(&pair) == cert.public_key().raw {
        println!("private key: matches certificate 0");
        Ok(())
    } else {
        anyhow::bail!("the private key does not match certificate 0")
    }
}
