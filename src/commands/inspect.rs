//! `podca inspect`: decode a certificate, chain or credential bundle and check it; or a
//! JWT-SVID (`super::inspect_jwt`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podca_signer::{CaCertificate, FileStore, SubjectKey};
use time::OffsetDateTime;
use x509_parser::extensions::{GeneralName, ParsedExtension};
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
            describe(i, &cert, der, now);
            parsed.push(
                CaCertificate::from_der(der)
                    .with_context(|| format!("{}: certificate {i}", file.display()))?,
            );
        }
        if let Some(key) = private_key {
            check_private_key(&key, &certs)?;
        }
        // Chain check: every certificate signed by the next, the last by a trust anchor.
        let mut ok = true;
        for (i, pair) in parsed.windows(2).enumerate() {
            match pair[0].verify_signed_by(&pair[1]) {
                Ok(()) => println!("chain: certificate {i} is signed by certificate {}", i + 1),
                Err(e) => {
                    ok = false;
                    println!("chain: BROKEN at certificate {i}: {e}");
                }
            }
        }
        let anchors = match (&ca_file, dir) {
            (Some(path), _) => Some(CaCertificate::all_from_pem(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?,
            )?),
            (None, dir) => {
                let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
                store.roots().ok()
            }
        };
        if let (Some(anchors), Some(last)) = (anchors, parsed.last()) {
            match anchors
                .iter()
                .find(|a| *a == last || last.verify_signed_by(a).is_ok())
            {
                Some(a) => println!("chain: anchored in {} ({})", a.subject(), a.fingerprint()),
                None => {
                    ok = false;
                    println!(
                        "chain: NOT anchored in any of the {} trust anchors",
                        anchors.len()
                    );
                }
            }
        }
        anyhow::ensure!(ok, "{}: the chain does not verify", file.display());
        Ok(())
    }
}

fn describe(i: usize, cert: &X509Certificate<'_>, der: &[u8], now: OffsetDateTime) {
    let not_after = cert.validity().not_after.to_datetime();
    let left = not_after - now;
    let state = if left.is_negative() {
        "EXPIRED".to_string()
    } else if cert.validity().not_before.to_datetime() > now {
        "NOT YET VALID".to_string()
    } else {
        format!("{}h{}m left", left.whole_hours(), left.whole_minutes() % 60)
    };
    println!("certificate {i}:");
    println!("  subject:    {}", cert.subject());
    println!("  issuer:     {}", cert.issuer());
    println!(
        "  serial:     {}",
        cert.raw_serial_as_string().replace(':', "")
    );
    println!("  not before: {}", cert.validity().not_before.to_datetime());
    println!("  not after:  {not_after} ({state})");
    let key = SubjectKey::from_spki_der(cert.public_key().raw)
        .map(|k| k.key_type().to_string())
        .unwrap_or_else(|e| e.to_string());
    println!("  key:        {key}");
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    let shown = match name {
                        GeneralName::URI(u) => format!("URI:{u}"),
                        GeneralName::DNSName(d) => format!("DNS:{d}"),
                        GeneralName::RFC822Name(e) => format!("email:{e}"),
                        GeneralName::IPAddress(ip) => format!("IP:{}", hex::encode(ip)),
                        other => format!("{other:?}"),
                    };
                    println!("  SAN:        {shown}");
                }
            }
            ParsedExtension::BasicConstraints(bc) => {
                println!("  CA:         {}", bc.ca);
            }
            _ => {}
        }
    }
    println!("  sha256:     {}", podca_signer::x509::sha256_hex(der));
    println!(
        "  spki sha256: {}",
        podca_signer::x509::sha256_hex(cert.public_key().raw)
    );
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
