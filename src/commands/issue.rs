//! `podca issue`: issue from a CSR file, or for a generated key, with the local CA — or, with
//! `--server`, by asking a running podca (`podca serve`, `podca dev`) over gRPC
//! (`podca.v1.PodCA/IssueCertificate`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podca_authority::config::Config;
use podca_authority::ledger::{LedgerBackend, Store};
use podca_grpc::client::{Server, Token, caller_metadata};
use podca_proto::podca::v1::{IssueCertificateRequest, IssueJwtSvidRequest};
use podca_signer::issue::OperatorRequest;
use podca_signer::keys::GeneratedKey;
use podca_signer::policy::DNS_NAMES_ANNOTATION;
use podca_signer::{FileStore, KeyType, LedgerRecord, SubjectKey};
use time::{Duration, OffsetDateTime};

#[derive(Debug, Args)]
pub struct IssueArgs {
    /// CA data directory (local issuance; ignored with --server).
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// Local issuance: record to this configuration's `[ledger]` (redb, PostgreSQL or none)
    /// instead of the data directory's ledger.redb; its `[ca] dir` is the CA when --dir is not
    /// given. Ignored with --server (the server records).
    #[arg(long, env = "PODCA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Ask a running podca instead of the local CA: `https://HOST:PORT` (podca serve's gRPC
    /// API, verified against --ca-file), `http://HOST:PORT` (a plaintext listener, e.g. podca
    /// dev's loopback one) or `unix:///path/to/socket` (podca dev's socket). The identity is the
    /// caller's: the token's service account, or podca dev's mapping.
    #[arg(long, value_name = "URL", conflicts_with = "trust_domain")]
    pub server: Option<String>,
    /// With an https:// --server: the trust anchors (PEM) the server's certificate must chain
    /// to (`podca bundle`, or the signer's ClusterTrustBundle). Required: podca never trusts a
    /// server by default.
    #[arg(long, value_name = "ROOTS.pem", requires = "server")]
    pub ca_file: Option<PathBuf>,
    /// With an https:// --server: the name the server's certificate must carry (default: the
    /// URL's host), e.g. `podca.podca-system.svc` when connecting through a port-forward.
    #[arg(long, value_name = "NAME", requires = "server")]
    pub server_name: Option<String>,
    /// File holding the bearer token sent to --server (a service-account token for the
    /// audience `podca`). Tokens are never command-line values.
    #[arg(long, value_name = "FILE", requires = "server")]
    pub token_file: Option<PathBuf>,
    /// Signer to ask for (--server only); default: the server's `grpc.signer`.
    #[arg(long, requires = "server")]
    pub signer: Option<String>,
    /// Ask --server for a JWT-SVID (`podca.v1.PodCA/IssueJwtSvid`) instead of a certificate;
    /// the token is printed (or written to --out, mode 0600). Needs at least one --audience.
    #[arg(long, requires = "server", requires = "audiences", conflicts_with_all = ["csr", "dns_names", "trust_bundle"])]
    pub jwt: bool,
    /// With --jwt: an `aud` of the token (repeatable).
    #[arg(long = "audience", value_name = "AUD", requires = "jwt")]
    pub audiences: Vec<String>,
    /// Certify the key of this PKCS#10 CSR (PEM or DER); its signature is verified.
    #[arg(long, conflicts_with = "key_type")]
    pub csr: Option<PathBuf>,
    /// Generate a key of this kubelet key type (RSA3072, RSA4096, ECDSAP256, ECDSAP384,
    /// ECDSAP521, ED25519, or post-quantum MLDSA44, MLDSA65, MLDSA87) and write a credential
    /// bundle (PRIVATE KEY, then the chain).
    #[arg(long, default_value = "ECDSAP256")]
    pub key_type: Option<KeyType>,
    /// Namespace of the workload. With --server it is only a request to podca dev (sent as
    /// `x-podca-namespace`); podca serve takes the identity from the token.
    #[arg(long, short, required_unless_present = "server")]
    pub namespace: Option<String>,
    /// Service account of the workload (with --server: as --namespace).
    #[arg(long, required_unless_present = "server")]
    pub service_account: Option<String>,
    /// SPIFFE trust domain (local issuance; the server's policy decides with --server).
    #[arg(long, default_value = "cluster.local")]
    pub trust_domain: String,
    /// Extra DNS SAN (repeatable).
    #[arg(long = "dns")]
    pub dns_names: Vec<String>,
    /// Lifetime in seconds (at least 3600; default 86400). With --jwt: the token's lifetime
    /// (default and maximum: the server's `[jwt]` settings).
    #[arg(long)]
    pub lifetime_seconds: Option<i64>,
    /// Write the result here (mode 0600 when it holds a private key) instead of stdout.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Also write the trust anchors that verify the chain (PEM) here.
    #[arg(long, value_name = "FILE")]
    pub trust_bundle: Option<PathBuf>,
    #[command(flatten)]
    pub hsm: super::HsmArgs,
}

impl IssueArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let Self {
            dir,
            config,
            server,
            ca_file,
            server_name,
            token_file,
            signer,
            jwt,
            audiences,
            csr,
            key_type,
            namespace,
            service_account,
            trust_domain,
            dns_names,
            lifetime_seconds,
            out,
            trust_bundle,
            hsm,
        } = self;
        if let (Some(server), true) = (&server, jwt) {
            return run_remote_jwt(RemoteJwt {
                server: server.clone(),
                ca_file,
                server_name,
                token_file,
                signer,
                audiences,
                namespace,
                service_account,
                lifetime_seconds,
                out,
            });
        }
        if let Some(server) = server {
            return run_remote(Remote {
                server,
                ca_file,
                server_name,
                token_file,
                signer,
                csr,
                key_type,
                namespace,
                service_account,
                dns_names,
                lifetime_seconds,
                out,
                trust_bundle,
            });
        }
        // clap requires both without --server.
        let (Some(namespace), Some(service_account)) = (namespace, service_account) else {
            anyhow::bail!("give -n NAMESPACE and --service-account NAME (or --server URL)");
        };
        let config = config
            .map(|path| Config::load(&path).map(|c| (path, c)))
            .transpose()?;
        let dir = dir
            .or_else(|| {
                config
                    .as_ref()
                    .and_then(|(_, c)| c.ca.dir().map(Into::into))
            })
            .unwrap_or_else(super::default_data_dir);
        let store = FileStore::new(dir);
        let ca = super::open_active_ca(&store, &hsm)?;
        // Opened before issuing: a ledger that cannot record refuses the issuance up front.
        let ledger = IssueLedger::open(config.as_ref(), &store)?;
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
        let (cert, record) = podca_signer::issue::for_operator(
            &ca,
            &OperatorRequest {
                trust_domain: &trust_domain,
                namespace: &namespace,
                service_account: &service_account,
                key: subject,
                lifetime: lifetime_seconds.map(Duration::seconds),
                dns_names: &dns_names,
            },
            OffsetDateTime::now_utc(),
        )?;
        // Recorded durably before the certificate is written anywhere.
        ledger.record(record)?;
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
        if let Some(path) = trust_bundle {
            let anchors = std::fs::read_to_string(store.root_cert_path())
                .with_context(|| format!("cannot read {}", store.root_cert_path().display()))?;
            write_output(&path, &anchors, false)?;
        }
        Ok(())
    }
}

/// Where local issuance records its certificate: the `[ledger]` of --config (a redb file with
/// no path is the data directory's ledger.redb, as in `podca serve`), else the data
/// directory's ledger.redb.
struct IssueLedger {
    runtime: tokio::runtime::Runtime,
    /// `None`: `backend = "none"`, nothing is recorded.
    store: Option<Store>,
}

impl IssueLedger {
    fn open(config: Option<&(PathBuf, Config)>, data: &FileStore) -> anyhow::Result<Self> {
        let backend = match config {
            Some((_, c)) => c.ledger.backend.clone(),
            None => LedgerBackend::Redb { path: None },
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let default_redb = data.ledger_path();
        let store = runtime
            .block_on(Store::open(&backend, Some(&default_redb)))
            .context("opening the ledger")?;
        if store.is_none()
            && let Some((path, _)) = config
        {
            eprintln!(
                "podca issue: {} sets [ledger] backend = \"none\": this certificate is not \
                 recorded in any ledger",
                path.display()
            );
        }
        Ok(IssueLedger { runtime, store })
    }

    fn record(&self, record: LedgerRecord) -> anyhow::Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        self.runtime
            .block_on(store.append(vec![record]))
            .context("recording the certificate in the ledger (it was not written out)")?;
        Ok(())
    }
}

/// `podca issue --server`: what the remote path needs of the arguments.
struct Remote {
    server: String,
    ca_file: Option<PathBuf>,
    server_name: Option<String>,
    token_file: Option<PathBuf>,
    signer: Option<String>,
    csr: Option<PathBuf>,
    key_type: Option<KeyType>,
    namespace: Option<String>,
    service_account: Option<String>,
    dns_names: Vec<String>,
    lifetime_seconds: Option<i64>,
    out: Option<PathBuf>,
    trust_bundle: Option<PathBuf>,
}

fn run_remote(remote: Remote) -> anyhow::Result<()> {
    let Remote {
        server,
        ca_file,
        server_name,
        token_file,
        signer,
        csr,
        key_type,
        namespace,
        service_account,
        dns_names,
        lifetime_seconds,
        out,
        trust_bundle,
    } = remote;
    let server = Server::new(&server, ca_file.as_deref(), server_name.as_deref())?;
    let token = token_file.as_deref().map(Token::read).transpose()?;
    let (csr_der, private_pem) = match (&csr, key_type) {
        (Some(path), _) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let der = csr_der(&bytes)
                .with_context(|| format!("{}: not a PEM or DER CSR", path.display()))?;
            (der, None)
        }
        (None, Some(kt)) => {
            let generated = GeneratedKey::generate(kt)?;
            (generated.stub_csr_der()?, Some(generated.private_key_pem()))
        }
        (None, None) => anyhow::bail!("give --csr FILE or --key-type TYPE"),
    };
    let mut user_annotations = std::collections::HashMap::new();
    if !dns_names.is_empty() {
        user_annotations.insert(DNS_NAMES_ANNOTATION.to_string(), dns_names.join(","));
    }
    let mut request = tonic::Request::new(IssueCertificateRequest {
        csr: csr_der,
        requested_lifetime_seconds: lifetime_seconds,
        user_annotations,
        signer_name: signer.unwrap_or_default(),
    });
    caller_metadata(
        request.metadata_mut(),
        token.as_ref(),
        namespace.as_deref(),
        service_account.as_deref(),
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let answer = runtime.block_on(server.issue_certificate(request))?;
    finish(answer, private_pem, out, trust_bundle, server.url())
}

/// `podca issue --jwt --server`: what the JWT-SVID path needs of the arguments.
struct RemoteJwt {
    server: String,
    ca_file: Option<PathBuf>,
    server_name: Option<String>,
    token_file: Option<PathBuf>,
    signer: Option<String>,
    audiences: Vec<String>,
    namespace: Option<String>,
    service_account: Option<String>,
    lifetime_seconds: Option<i64>,
    out: Option<PathBuf>,
}

/// Asks `server` for a JWT-SVID and prints it (stdout: the token and a newline, nothing else)
/// or writes it to `out` (mode 0600: a bearer credential).
fn run_remote_jwt(remote: RemoteJwt) -> anyhow::Result<()> {
    let RemoteJwt {
        server,
        ca_file,
        server_name,
        token_file,
        signer,
        audiences,
        namespace,
        service_account,
        lifetime_seconds,
        out,
    } = remote;
    let server = Server::new(&server, ca_file.as_deref(), server_name.as_deref())?;
    let token = token_file.as_deref().map(Token::read).transpose()?;
    let mut request = tonic::Request::new(IssueJwtSvidRequest {
        audiences,
        requested_lifetime_seconds: lifetime_seconds,
        signer_name: signer.unwrap_or_default(),
        pod_namespace: String::new(),
        pod_name: String::new(),
    });
    caller_metadata(
        request.metadata_mut(),
        token.as_ref(),
        namespace.as_deref(),
        service_account.as_deref(),
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let svid = runtime.block_on(server.issue_jwt_svid(request))?;
    let expires = svid
        .expires_at
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.seconds).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "?".to_string());
    let destination = match &out {
        Some(path) => {
            write_output(path, &format!("{}\n", svid.token), true)?;
            path.display().to_string()
        }
        None => {
            println!("{}", svid.token);
            "stdout".to_string()
        }
    };
    eprintln!(
        "issued a JWT-SVID for {} (kid {}, audiences {}, expires {expires}) by {} → \
         {destination}",
        svid.spiffe_id,
        svid.kid,
        svid.audiences.join(","),
        server.url()
    );
    Ok(())
}

fn finish(
    answer: podca_proto::podca::v1::IssueCertificateResponse,
    private_pem: Option<String>,
    out: Option<PathBuf>,
    trust_bundle: Option<PathBuf>,
    server: &str,
) -> anyhow::Result<()> {
    let output = match &private_pem {
        Some(key) => format!("{key}{}", answer.certificate_chain_pem),
        None => answer.certificate_chain_pem.clone(),
    };
    match &out {
        Some(path) => write_output(path, &output, private_pem.is_some())?,
        None => print!("{output}"),
    }
    if let Some(path) = &trust_bundle {
        write_output(path, &answer.trust_anchors_pem, false)?;
    }
    let expires = answer
        .not_after
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.seconds).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "?".to_string());
    let destination = out
        .as_ref()
        .map_or_else(|| "stdout".to_string(), |p| p.display().to_string());
    eprintln!(
        "issued {} (serial {}, expires {expires}) by {server} → {destination}",
        answer.spiffe_id, answer.serial
    );
    Ok(())
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
