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
use podca_signer::keys::{self, GeneratedKey};
use podca_signer::policy::DNS_NAMES_ANNOTATION;
use podca_signer::{FileStore, KeyType, SubjectKey};
use time::format_description::well_known::Rfc3339;
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
    /// With an https:// --server: the DNS name its certificate must carry (default: the URL's
    /// host), e.g. `podca.podca-system.svc`, or a `spiffe://` ID pinned as its only URI SAN.
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
    /// Generate a key of this kubelet key type (any case) and write a credential bundle
    /// (PRIVATE KEY, then the chain).
    #[arg(long, default_value = "ECDSAP256", value_parser = crate::cli::spelled::<KeyType>(), ignore_case = true)]
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

/// The key to certify: a CSR file's, or one generated here (whose PEM goes out with the chain).
enum Key {
    Csr(Vec<u8>),
    Generated(GeneratedKey),
}

impl Key {
    fn private_pem(&self) -> Option<String> {
        match self {
            Key::Csr(_) => None,
            Key::Generated(key) => Some(key.private_key_pem()),
        }
    }
}

impl IssueArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let runtime = super::block_on_runtime()?;
        match &self.server {
            Some(server) if self.jwt => runtime.block_on(self.remote_jwt(server)),
            Some(server) => runtime.block_on(self.remote(server)),
            None => runtime.block_on(self.local()),
        }
    }

    fn key(&self) -> anyhow::Result<Key> {
        match (&self.csr, self.key_type) {
            (Some(path), _) => {
                let bytes = std::fs::read(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let der = keys::csr_der(&bytes).with_context(|| path.display().to_string())?;
                Ok(Key::Csr(der))
            }
            (None, Some(kt)) => Ok(Key::Generated(GeneratedKey::generate(kt)?)),
            (None, None) => anyhow::bail!("give --csr FILE or --key-type TYPE"),
        }
    }

    /// Local issuance: the data directory's CA, recorded in the ledger before it is written.
    async fn local(&self) -> anyhow::Result<()> {
        // clap requires both without --server.
        let (Some(namespace), Some(service_account)) = (&self.namespace, &self.service_account)
        else {
            anyhow::bail!("give -n NAMESPACE and --service-account NAME (or --server URL)");
        };
        let config = self.config.as_deref().map(Config::load).transpose()?;
        let dir = self.dir.clone().or_else(|| {
            let config = config.as_ref()?;
            config.ca.dir().map(Into::into)
        });
        let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
        let ca = super::open_active_ca(&store, &self.hsm)?;
        // Opened before issuing: a ledger that cannot record refuses the issuance up front. With
        // no --config: the data directory's ledger.redb; a redb `[ledger]` with no path too.
        let backend = config
            .as_ref()
            .map_or(LedgerBackend::Redb { path: None }, |c| {
                c.ledger.backend.clone()
            });
        let ledger = Store::open(&backend, Some(&store.ledger_path()))
            .await
            .context("opening the ledger")?;
        if let (None, Some(path)) = (&ledger, &self.config) {
            eprintln!(
                "podca issue: {} sets [ledger] backend = \"none\": this certificate is not \
                 recorded in any ledger",
                path.display()
            );
        }
        let key = self.key()?;
        let subject = match (&key, &self.csr) {
            (Key::Csr(der), Some(path)) => SubjectKey::from_csr_verified(der)
                .with_context(|| format!("CSR {}", path.display()))?,
            (Key::Csr(der), None) => SubjectKey::from_csr_verified(der)?,
            (Key::Generated(generated), _) => generated.public.clone(),
        };
        let (cert, record) = podca_signer::issue::for_operator(
            &ca,
            &OperatorRequest {
                trust_domain: &self.trust_domain,
                namespace,
                service_account,
                key: subject,
                lifetime: self.lifetime_seconds.map(Duration::seconds),
                dns_names: &self.dns_names,
            },
            OffsetDateTime::now_utc(),
        )?;
        if let Some(ledger) = &ledger {
            // Recorded durably before the certificate is written anywhere.
            ledger
                .append(vec![record])
                .await
                .context("recording the certificate in the ledger (it was not written out)")?;
        }
        let expires = cert.validity.not_after.format(&Rfc3339)?;
        self.write(&key, &cert.chain_pem, || {
            std::fs::read_to_string(store.root_cert_path())
                .with_context(|| format!("cannot read {}", store.root_cert_path().display()))
        })?;
        self.report(&format!(
            "issued {} (serial {}, expires {expires})",
            cert.spiffe_id, cert.serial
        ));
        Ok(())
    }

    /// The caller's request, sent to --server with its token or podca dev identity.
    fn request<T>(&self, message: T) -> anyhow::Result<(tonic::Request<T>, Server)> {
        let server = Server::new(
            self.server.as_deref().unwrap_or_default(),
            self.ca_file.as_deref(),
            self.server_name.as_deref(),
        )?;
        let token = self.token_file.as_deref().map(Token::read).transpose()?;
        server.may_send_token(token.as_ref())?;
        let mut request = tonic::Request::new(message);
        caller_metadata(
            request.metadata_mut(),
            token.as_ref(),
            self.namespace.as_deref(),
            self.service_account.as_deref(),
        )?;
        Ok((request, server))
    }

    async fn remote(&self, url: &str) -> anyhow::Result<()> {
        let key = self.key()?;
        let csr = match &key {
            Key::Csr(der) => der.clone(),
            Key::Generated(generated) => generated.stub_csr_der()?,
        };
        podca_signer::issue::check_dns_flags(&self.dns_names)?;
        let mut user_annotations = std::collections::HashMap::new();
        if !self.dns_names.is_empty() {
            user_annotations.insert(DNS_NAMES_ANNOTATION.to_string(), self.dns_names.join(","));
        }
        let (request, server) = self.request(IssueCertificateRequest {
            csr,
            requested_lifetime_seconds: self.lifetime_seconds,
            user_annotations,
            signer_name: self.signer.clone().unwrap_or_default(),
        })?;
        let answer = server.issue_certificate(request).await?;
        self.write(&key, &answer.certificate_chain_pem, || {
            Ok(answer.trust_anchors_pem.clone())
        })?;
        self.report(&format!(
            "issued {} (serial {}, expires {}) by {url}",
            answer.spiffe_id,
            answer.serial,
            rfc3339(answer.not_after.map(|t| t.seconds))
        ));
        Ok(())
    }

    /// A JWT-SVID: printed (stdout: the token and a newline, nothing else) or written to --out
    /// (mode 0600: a bearer credential).
    async fn remote_jwt(&self, url: &str) -> anyhow::Result<()> {
        let (request, server) = self.request(IssueJwtSvidRequest {
            audiences: self.audiences.clone(),
            requested_lifetime_seconds: self.lifetime_seconds,
            signer_name: self.signer.clone().unwrap_or_default(),
            pod_namespace: String::new(),
            pod_name: String::new(),
        })?;
        let svid = server.issue_jwt_svid(request).await?;
        match &self.out {
            Some(path) => write_output(path, &format!("{}\n", svid.token), true)?,
            None => println!("{}", svid.token),
        }
        self.report(&format!(
            "issued a JWT-SVID for {} (kid {}, audiences {}, expires {}) by {url}",
            svid.spiffe_id,
            svid.kid,
            svid.audiences.join(","),
            rfc3339(svid.expires_at.map(|t| t.seconds))
        ));
        Ok(())
    }

    /// Writes the credential (a generated key, then the chain) to --out or stdout, and the
    /// trust anchors to --trust-bundle.
    fn write(
        &self,
        key: &Key,
        chain_pem: &str,
        anchors: impl FnOnce() -> anyhow::Result<String>,
    ) -> anyhow::Result<()> {
        let private = key.private_pem();
        let output = format!("{}{chain_pem}", private.as_deref().unwrap_or_default());
        match &self.out {
            Some(path) => write_output(path, &output, private.is_some())?,
            None => print!("{output}"),
        }
        if let Some(path) = &self.trust_bundle {
            write_output(path, &anchors()?, false)?;
        }
        Ok(())
    }

    /// What was issued, and where it went, on stderr.
    fn report(&self, what: &str) {
        let destination = self
            .out
            .as_ref()
            .map_or_else(|| "stdout".to_string(), |p| p.display().to_string());
        eprintln!("{what} → {destination}");
    }
}

/// A protobuf timestamp's seconds as RFC 3339 ("?" when absent or out of range).
fn rfc3339(seconds: Option<i64>) -> String {
    let time = seconds.and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok());
    time.map_or_else(|| "?".into(), podca_authority::ledger::format_time)
}

/// Replaces `path` atomically with a file of its own: 0600 when it holds a secret (a key, a
/// JWT-SVID), whatever mode an existing file had; 0644 otherwise.
fn write_output(path: &std::path::Path, text: &str, secret: bool) -> anyhow::Result<()> {
    let mode = if secret { 0o600 } else { 0o644 };
    podca_signer::store::write_atomic(path, text.as_bytes(), mode)
        .with_context(|| format!("cannot write {}", path.display()))
}
