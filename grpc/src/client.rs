//! A client of podca.v1, as `podca issue --server` uses it: the server URL (`https://`,
//! `http://` or `unix:///path`), TLS that trusts only the anchors given and verifies one name,
//! the caller's credentials, and one-line answers for refusals and TLS failures. Messages name
//! the `podca issue` flags a user would change.
//!
//! The name is a DNS name or IP address (webpki's own check), or podca's SPIFFE ID: with
//! `--server-name spiffe://…` the client pins it, and the server's leaf must carry exactly that
//! URI SAN ([`PinnedSpiffeId`]). A DNS name says only that some holder of the name answered;
//! the SPIFFE ID says it is podca's service account, whatever DNS or a port-forward says.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::{
    IssueCertificateRequest, IssueCertificateResponse, IssueJwtSvidRequest, JwtSvid,
};
use tonic::metadata::MetadataMap;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Uri};

use crate::observe::code_name;

/// Why a request could not be made or was refused; one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(String);

fn fail(message: impl Into<String>) -> ClientError {
    ClientError(message.into())
}

/// The scheme of a `--server` URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Https,
    Http,
    Unix,
}

impl Scheme {
    pub fn of(server: &str) -> Result<Self, ClientError> {
        if let Some(path) = server.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(fail(format!(
                    "--server {server:?}: a socket URL is unix:///absolute/path"
                )));
            }
            return Ok(Scheme::Unix);
        }
        if server.starts_with("https://") {
            return Ok(Scheme::Https);
        }
        if !server.starts_with("http://") {
            return Err(fail(format!(
                "--server {server:?}: use https://HOST:PORT, http://HOST:PORT or \
                 unix:///path/to/socket"
            )));
        }
        Ok(Scheme::Http)
    }
}

/// A podca server and how it is reached.
#[derive(Debug)]
pub struct Server {
    url: String,
    tls: Option<ClientTls>,
}

/// How an https:// server is verified.
#[derive(Debug)]
struct ClientTls {
    config: ClientTlsConfig,
    /// The name its certificate must carry.
    name: String,
    /// When `name` is a SPIFFE ID: the verifier that pins it (tonic's default verifier checks
    /// DNS names and IP addresses only).
    pinned: Option<Arc<PinnedSpiffeId>>,
}

impl Server {
    /// `url`, verified (https) against only the anchors in `ca_file`, for `server_name` or the
    /// URL's host.
    pub fn new(
        url: &str,
        ca_file: Option<&Path>,
        server_name: Option<&str>,
    ) -> Result<Self, ClientError> {
        Ok(Server {
            url: url.to_owned(),
            tls: client_tls(url, ca_file, server_name)?,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Refuses to send a bearer token in the clear anywhere but to this host: a plaintext
    /// `http://` server off loopback would let anyone on the path read the token and use it.
    pub fn may_send_token(&self, token: Option<&Token>) -> Result<(), ClientError> {
        if token.is_none() || self.tls.is_some() || Scheme::of(&self.url)? != Scheme::Http {
            return Ok(());
        }
        let authority = self.url["http://".len()..]
            .split(['/', '?', '#'])
            .next()
            .unwrap_or_default();
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if loopback {
            return Ok(());
        }
        Err(fail(format!(
            "--server {}: --token-file would send the token unencrypted to {host}; a plaintext \
             http:// server may only be on loopback (use https:// and --ca-file)",
            self.url
        )))
    }

    /// A channel to the server, over TLS when it is https.
    pub async fn connect(&self) -> Result<Channel, ClientError> {
        let server = &self.url;
        let mut endpoint = Endpoint::from_shared(server.clone())
            .map_err(|e| fail(format!("--server {server:?} is not a URL: {e}")))?
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60));
        if let Some(tls) = &self.tls {
            endpoint = match &tls.pinned {
                None => endpoint.tls_config(tls.config.clone()),
                Some(pinned) => {
                    endpoint.tls_config_with_verifier(tls.config.clone(), Arc::clone(pinned) as _)
                }
            }
            .map_err(|e| {
                fail(format!(
                    "--server: the TLS settings: {}",
                    podca_signer::report::error_chain(&e)
                ))
            })?;
            return endpoint.connect().await.map_err(|e| {
                fail(format!(
                    "cannot connect to {server}: {}",
                    tls_failure(&e, &tls.name)
                ))
            });
        }
        endpoint.connect().await.map_err(|e| {
            fail(format!(
                "cannot connect to {server}: {}",
                podca_signer::report::error_chain(&e)
            ))
        })
    }

    /// `IssueCertificate`; a refusal is one line naming the server.
    pub async fn issue_certificate(
        &self,
        request: tonic::Request<IssueCertificateRequest>,
    ) -> Result<IssueCertificateResponse, ClientError> {
        PodCaClient::new(self.connect().await?)
            .issue_certificate(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.refused(&status))
    }

    /// `IssueJwtSvid`; a refusal is one line naming the server.
    pub async fn issue_jwt_svid(
        &self,
        request: tonic::Request<IssueJwtSvidRequest>,
    ) -> Result<JwtSvid, ClientError> {
        PodCaClient::new(self.connect().await?)
            .issue_jwt_svid(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.refused(&status))
    }

    /// A refusal in one line naming the server; a plaintext (`http://`) connection that broke
    /// before any gRPC answer adds the likely cause: a TLS listener, such as `podca serve`'s.
    fn refused(&self, status: &tonic::Status) -> ClientError {
        // A status the client made from a broken connection carries its cause; a server's
        // answer does not.
        let broke = std::error::Error::source(status).is_some()
            && matches!(
                status.code(),
                tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Unavailable
            );
        let hint = if broke && self.url.starts_with("http://") {
            let https = self.url.replacen("http://", "https://", 1);
            format!(
                "; the connection broke before any gRPC answer, as a TLS listener (podca serve's \
                 gRPC API) does to plaintext: use --server {https} with --ca-file (`podca \
                 bundle`, or the signer's ClusterTrustBundle); http:// is for podca dev's \
                 loopback listener"
            )
        } else {
            String::new()
        };
        fail(format!("{}: {}{hint}", self.url, refusal(status)))
    }
}

/// The TLS client settings for `server` (`None`: plaintext or a Unix socket): only the anchors
/// in `ca_file`, and `server_name` or the URL's host as the name to verify.
fn client_tls(
    server: &str,
    ca_file: Option<&Path>,
    server_name: Option<&str>,
) -> Result<Option<ClientTls>, ClientError> {
    if Scheme::of(server)? != Scheme::Https {
        if ca_file.is_some() || server_name.is_some() {
            return Err(fail(
                "--ca-file and --server-name apply only to an https:// --server",
            ));
        }
        return Ok(None);
    }
    let ca_file = ca_file.ok_or_else(|| {
        fail(format!(
            "--server {server}: give --ca-file ROOTS.pem, the trust anchors the server's \
             certificate must chain to (`podca bundle`, or the signer's ClusterTrustBundle)"
        ))
    })?;
    let roots = std::fs::read(ca_file)
        .map_err(|e| fail(format!("cannot read --ca-file {}: {e}", ca_file.display())))?;
    let anchors = {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let anchors = CertificateDer::pem_slice_iter(&roots)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(format!("--ca-file {}: {e}", ca_file.display())))?;
        if anchors.is_empty() {
            return Err(fail(format!(
                "--ca-file {}: no PEM CERTIFICATE block",
                ca_file.display()
            )));
        }
        anchors
    };
    let uri: Uri = server
        .parse()
        .map_err(|e| fail(format!("--server {server:?} is not a URL: {e}")))?;
    let name = match server_name {
        Some(name) => name.to_owned(),
        None => uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
            .ok_or_else(|| fail(format!("--server {server:?} names no host")))?,
    };
    if name.starts_with("spiffe://") {
        let pinned = PinnedSpiffeId::new(&name, anchors)?;
        // The anchors are the verifier's; the URL's host is only the SNI.
        return Ok(Some(ClientTls {
            config: ClientTlsConfig::new(),
            name,
            pinned: Some(Arc::new(pinned)),
        }));
    }
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(roots))
        .domain_name(name.clone());
    Ok(Some(ClientTls {
        config,
        name,
        pinned: None,
    }))
}

/// A server certificate verifier that pins a SPIFFE ID: webpki verifies the chain to the
/// anchors (signatures, validity, serverAuth) as for a DNS name, then the leaf must carry
/// exactly one URI SAN, the pinned ID. The DNS names and IP addresses it carries are not
/// looked at.
///
/// The chain check is rustls' `verify_server_cert_signed_by_trust_anchor`, the one
/// `WebPkiServerVerifier` runs before its name check, called directly: no error of a fuller
/// verifier is excused here, so a reordering in rustls cannot turn a name failure we would
/// excuse into a skipped chain check.
#[derive(Debug)]
pub struct PinnedSpiffeId {
    pinned: String,
    roots: Arc<rustls::RootCertStore>,
    /// podca's crypto provider's ([`crate::tls::provider`]).
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl PinnedSpiffeId {
    /// Pins `spiffe_id` for chains to `anchors` (DER).
    pub fn new(
        spiffe_id: &str,
        anchors: Vec<rustls::pki_types::CertificateDer<'static>>,
    ) -> Result<Self, ClientError> {
        if podca_signer::names::trust_domain_of(spiffe_id).is_none() {
            return Err(fail(format!(
                "--server-name {spiffe_id}: not a SPIFFE ID (spiffe://<trust domain>/<path>, \
                 e.g. spiffe://cluster.local/ns/podca-system/sa/podca)"
            )));
        }
        let mut roots = rustls::RootCertStore::empty();
        let (_, unusable) = roots.add_parsable_certificates(anchors);
        if roots.is_empty() {
            return Err(fail(format!(
                "--ca-file: none of its {unusable} certificates is a usable trust anchor"
            )));
        }
        Ok(PinnedSpiffeId {
            pinned: spiffe_id.to_owned(),
            roots: Arc::new(roots),
            algorithms: crate::tls::provider().signature_verification_algorithms,
        })
    }
}

impl rustls::client::danger::ServerCertVerifier for PinnedSpiffeId {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::{CertificateError, OtherError};
        let leaf = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &leaf,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        let uris = uri_sans(end_entity).ok_or(CertificateError::BadEncoding)?;
        check_pin(&self.pinned, &uris)
            .map_err(|refusal| CertificateError::Other(OtherError(Arc::new(refusal) as Arc<_>)))?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Why a server's certificate, chained to the anchors, is not the pinned SPIFFE ID's. Its
/// names are the server's, escaped: a terminal shows them, not runs them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PinRefusal {
    #[error("the server's certificate is for {presented}, not the pinned {pinned}")]
    Other { presented: String, pinned: String },
    #[error("the server's certificate carries no URI SAN, not the pinned {pinned}")]
    NoUri { pinned: String },
    #[error(
        "the server's certificate carries {} URI SANs ({}), not one: the pinned {pinned}",
        presented.len(),
        presented.join(", ")
    )]
    SeveralUris {
        presented: Vec<String>,
        pinned: String,
    },
}

/// The leaf must carry exactly one URI SAN, and it must be `pinned`, byte for byte.
fn check_pin(pinned: &str, uris: &[&str]) -> Result<(), PinRefusal> {
    let shown = |uri: &&str| uri.escape_debug().to_string();
    match uris {
        [uri] if *uri == pinned => Ok(()),
        [uri] => Err(PinRefusal::Other {
            presented: shown(uri),
            pinned: pinned.to_owned(),
        }),
        [] => Err(PinRefusal::NoUri {
            pinned: pinned.to_owned(),
        }),
        several => Err(PinRefusal::SeveralUris {
            presented: several.iter().map(shown).collect(),
            pinned: pinned.to_owned(),
        }),
    }
}

/// The URI SANs of a DER certificate (none without a SAN extension); `None` when it does not
/// parse.
fn uri_sans(der: &[u8]) -> Option<Vec<&str>> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let Some(sans) = cert.subject_alternative_name().ok()? else {
        return Some(vec![]);
    };
    Some(
        sans.value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::URI(uri) => Some(*uri),
                _ => None,
            })
            .collect(),
    )
}

/// A connection failure, saying in one line what was wrong with TLS when it was TLS (for the
/// command line: the fixes name `--server-name` and `--ca-file`).
pub fn tls_failure(error: &(dyn std::error::Error + 'static), name: &str) -> String {
    tls_failure_in(
        error,
        name,
        " (set --server-name to a name it carries)",
        "in --ca-file",
    )
}

/// [`tls_failure`] for another caller: `fix_name` follows a name mismatch, `anchors` says
/// where the anchors a chain must reach come from (`"in the foreign trust domain's bundle"`).
pub fn tls_failure_in(
    error: &(dyn std::error::Error + 'static),
    name: &str,
    fix_name: &str,
    anchors: &str,
) -> String {
    use rustls::{CertificateError, Error};
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut last = error.to_string();
    while let Some(e) = cause {
        let tls = e.downcast_ref::<Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<Error>())
        });
        if let Some(tls) = tls {
            return match tls {
                Error::InvalidCertificate(CertificateError::NotValidForName) => {
                    format!("TLS: the server's certificate is not valid for {name:?}{fix_name}")
                }
                Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                    presented,
                    ..
                }) => format!(
                    "TLS: the server's certificate is not valid for {name:?}; it carries {}{fix_name}",
                    presented_names(presented)
                ),
                Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                    format!("TLS: the server's certificate does not chain to an anchor {anchors}")
                }
                Error::InvalidCertificate(CertificateError::Expired)
                | Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
                    "TLS: the server's certificate has expired".to_string()
                }
                Error::InvalidCertificate(CertificateError::Other(other)) => {
                    match other.0.downcast_ref::<PinRefusal>() {
                        Some(refusal) => format!("TLS: {refusal}"),
                        None => format!("TLS: {tls}"),
                    }
                }
                other => format!("TLS: {other}"),
            };
        }
        last = e.to_string();
        cause = e.source();
    }
    last
}

/// The names a certificate presented, as webpki lists them (`DnsName("podca")`,
/// `UniformResourceIdentifier("spiffe://…")`, `IpAddress(10.0.0.1)`), for a person: each value,
/// escaped (the server chose them), in the certificate's order.
fn presented_names(presented: &[String]) -> String {
    if presented.is_empty() {
        return "no subjectAltName a name could match".to_owned();
    }
    presented
        .iter()
        .map(|p| {
            let value = ["DnsName(", "UniformResourceIdentifier(", "IpAddress("]
                .iter()
                .find_map(|kind| p.strip_prefix(kind)?.strip_suffix(')'));
            match value {
                Some(v) => v.trim_matches('"').escape_debug().to_string(),
                None => format!("a {}", p.escape_debug()),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A bearer token read from a file. Its `Debug` never shows it.
pub struct Token(String);

impl Token {
    /// Reads the token file (surrounding whitespace dropped); an empty file is an error.
    pub fn read(path: &Path) -> Result<Self, ClientError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            fail(format!(
                "cannot read the token file {}: {e}",
                path.display()
            ))
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(fail(format!("the token file {} is empty", path.display())));
        }
        Ok(Token(token.to_owned()))
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The caller's credentials on a request: the bearer token, and podca dev's identity names.
pub fn caller_metadata(
    metadata: &mut MetadataMap,
    token: Option<&Token>,
    namespace: Option<&str>,
    service_account: Option<&str>,
) -> Result<(), ClientError> {
    if let Some(token) = token {
        // The error names no token: the value is exactly what is not to be shown.
        let value = format!("Bearer {}", token.expose())
            .parse()
            .map_err(|_| fail("the token file holds characters a header cannot"))?;
        metadata.insert("authorization", value);
    }
    for (key, value, flag) in [
        ("x-podca-namespace", namespace, "--namespace"),
        (
            "x-podca-service-account",
            service_account,
            "--service-account",
        ),
    ] {
        if let Some(value) = value {
            let value = value
                .parse()
                .map_err(|_| fail(format!("{flag} {value:?} is not a valid name")))?;
            metadata.insert(key, value);
        }
    }
    Ok(())
}

/// One line for a refusal: what happened, the gRPC code by its canonical name, the server's
/// message.
pub fn refusal(status: &tonic::Status) -> String {
    let message = status.message().replace(['\n', '\r'], " ");
    let what = match status.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => "the server is unavailable",
        tonic::Code::Internal | tonic::Code::Unknown => "the server failed",
        _ => "the server refused the request",
    };
    format!("{what} ({}): {message}", code_name(status.code()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{CertificateDer, UnixTime};

    #[test]
    fn refusals_are_one_line_with_the_code_name() {
        let status = tonic::Status::permission_denied("NamespaceNotAllowed: no\nmore");
        assert_eq!(
            refusal(&status),
            "the server refused the request (PERMISSION_DENIED): NamespaceNotAllowed: no more"
        );
        assert!(
            refusal(&tonic::Status::unavailable("down"))
                .starts_with("the server is unavailable (UNAVAILABLE)")
        );
    }

    #[test]
    fn server_urls() {
        assert_eq!(Scheme::of("http://127.0.0.1:8443"), Ok(Scheme::Http));
        assert_eq!(Scheme::of("unix:///run/podca.sock"), Ok(Scheme::Unix));
        assert_eq!(
            Scheme::of("unix://relative.sock"),
            Err(fail(
                "--server \"unix://relative.sock\": a socket URL is unix:///absolute/path"
            ))
        );
        assert_eq!(Scheme::of("https://podca:8443"), Ok(Scheme::Https));
        assert_eq!(
            Scheme::of("127.0.0.1:8443"),
            Err(fail(
                "--server \"127.0.0.1:8443\": use https://HOST:PORT, http://HOST:PORT or \
                 unix:///path/to/socket"
            ))
        );
    }

    #[test]
    fn a_token_goes_in_the_clear_to_loopback_only() {
        let token = Token("t".into());
        for url in [
            "http://127.0.0.1:8443",
            "http://localhost:1",
            "http://[::1]:2",
        ] {
            let server = Server::new(url, None, None).unwrap();
            assert!(server.may_send_token(Some(&token)).is_ok(), "{url}");
        }
        let remote = Server::new("http://10.0.0.5:8443", None, None).unwrap();
        assert!(
            remote.may_send_token(None).is_ok(),
            "no token, nothing to leak"
        );
        assert_eq!(
            remote.may_send_token(Some(&token)).unwrap_err().to_string(),
            "--server http://10.0.0.5:8443: --token-file would send the token unencrypted to \
             10.0.0.5; a plaintext http:// server may only be on loopback (use https:// and \
             --ca-file)"
        );
        let unix = Server::new("unix:///run/podca.sock", None, None).unwrap();
        assert!(unix.may_send_token(Some(&token)).is_ok());
    }

    #[test]
    fn https_needs_anchors_and_plaintext_takes_no_tls_flags() {
        let error = client_tls("https://podca:8443", None, None).unwrap_err();
        assert!(
            error.to_string().contains("give --ca-file ROOTS.pem"),
            "{error}"
        );
        let error = client_tls("http://127.0.0.1:1", Some(Path::new("/r.pem")), None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--ca-file and --server-name apply only to an https:// --server"
        );
        let dir = std::env::temp_dir().join(format!("podca-client-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let error = client_tls("https://podca:8443", Some(&empty), None).unwrap_err();
        assert!(
            error.to_string().ends_with("no PEM CERTIFICATE block"),
            "{error}"
        );
    }

    #[test]
    fn tls_failures_are_named() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(
            tls_failure(&io, "podca"),
            "TLS: the server's certificate does not chain to an anchor in --ca-file"
        );
        let direct = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        assert!(tls_failure(&direct, "wrong.name").contains("not valid for \"wrong.name\""));
        // With webpki's context: the names the certificate carries, as values.
        let context =
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
                expected: rustls::pki_types::ServerName::try_from("wrong.name")
                    .unwrap()
                    .to_owned(),
                presented: vec![
                    "UniformResourceIdentifier(\"spiffe://td/ns/a/sa/b\")".into(),
                    "DnsName(\"podca.podca-system.svc\")".into(),
                    "IpAddress(10.0.0.1)".into(),
                    "DirectoryName".into(),
                ],
            });
        assert_eq!(
            tls_failure(&context, "wrong.name"),
            "TLS: the server's certificate is not valid for \"wrong.name\"; it carries \
             spiffe://td/ns/a/sa/b, podca.podca-system.svc, 10.0.0.1, a DirectoryName (set \
             --server-name to a name it carries)"
        );
    }

    const PODCA_ID: &str = "spiffe://cluster.local/ns/podca-system/sa/podca";

    /// A podca CA (`podca_signer`), as `podca ca init` makes one.
    fn podca_ca(name: &str) -> podca_signer::IssuingCa {
        let key = podca_signer::MemoryKey::generate(podca_signer::CaAlgorithm::EcdsaP256).unwrap();
        podca_signer::IssuingCa::self_signed_root(
            Arc::new(key),
            name,
            time::OffsetDateTime::now_utc() - time::Duration::hours(1),
            time::Duration::days(30),
        )
        .unwrap()
    }

    fn anchors_of(ca: &podca_signer::IssuingCa) -> Vec<CertificateDer<'static>> {
        ca.roots()
            .iter()
            .map(|root| CertificateDer::from(root.der().to_vec()))
            .collect()
    }

    /// A leaf `ca` issues for `spiffe_id` with podca's serving DNS names, valid from
    /// `not_before` for an hour.
    fn podca_leaf(
        ca: &podca_signer::IssuingCa,
        spiffe_id: &str,
        not_before: time::OffsetDateTime,
    ) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let subject = podca_signer::SubjectKey::from_spki_der(
            &rcgen::PublicKeyData::subject_public_key_info(&key),
        )
        .unwrap();
        let validity = podca_signer::Validity {
            not_before,
            not_after: not_before + time::Duration::hours(1),
            begin_refresh_at: not_before + time::Duration::minutes(30),
        };
        let issued = ca
            .issue(
                &subject,
                spiffe_id,
                &["podca.podca-system.svc".to_owned()],
                &validity,
            )
            .unwrap();
        CertificateDer::from(issued.leaf_der)
    }

    /// What `PinnedSpiffeId` says of `leaf` (no intermediates: the CAs here are roots), as
    /// rustls would ask it for a connection to 127.0.0.1.
    fn verify(verifier: &PinnedSpiffeId, leaf: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        use rustls::client::danger::ServerCertVerifier;
        let server_name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        verifier
            .verify_server_cert(leaf, &[], &server_name, &[], UnixTime::now())
            .map(|_| ())
    }

    /// The pin refusal inside a verifier error, and the line the CLI prints for it.
    fn pin_refusal(error: &rustls::Error) -> (PinRefusal, String) {
        let rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) = error
        else {
            panic!("not a pin refusal: {error:?}");
        };
        let refusal = other.0.downcast_ref::<PinRefusal>().unwrap().clone();
        (refusal, tls_failure(error, PODCA_ID))
    }

    /// Issue #40 (Low): a client pins podca's SPIFFE ID. With podca's own certificates: the
    /// leaf for the pinned ID passes (its DNS names and the connection's IP address play no
    /// part); a leaf of the same CA for another service account, one of another CA for the
    /// pinned ID, and an expired one are refused, each for its own reason.
    #[test]
    fn a_pinned_spiffe_id_accepts_only_that_leaf_of_the_anchors() {
        let ca = podca_ca("podca");
        let verifier = PinnedSpiffeId::new(PODCA_ID, anchors_of(&ca)).unwrap();
        let now = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);

        verify(&verifier, &podca_leaf(&ca, PODCA_ID, now)).expect("the pinned ID's leaf");

        let impostor = "spiffe://cluster.local/ns/podca-system/sa/impostor";
        let error = verify(&verifier, &podca_leaf(&ca, impostor, now)).unwrap_err();
        assert_eq!(
            pin_refusal(&error),
            (
                PinRefusal::Other {
                    presented: impostor.to_owned(),
                    pinned: PODCA_ID.to_owned(),
                },
                format!(
                    "TLS: the server's certificate is for {impostor}, not the pinned {PODCA_ID}"
                )
            )
        );
        // A prefix or a case change is another ID.
        for near in [
            "spiffe://cluster.local/ns/podca-system/sa/podca2",
            "spiffe://Cluster.local/ns/podca-system/sa/podca",
        ] {
            let error = verify(&verifier, &podca_leaf(&ca, near, now)).unwrap_err();
            assert!(
                matches!(pin_refusal(&error).0, PinRefusal::Other { .. }),
                "{near}: {error:?}"
            );
        }

        // Another CA (another installation's default name) vouches for the same ID in vain.
        let other_ca = podca_ca("podca");
        let error = verify(&verifier, &podca_leaf(&other_ca, PODCA_ID, now)).unwrap_err();
        assert_eq!(
            error,
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature)
        );
        let foreign = podca_ca("foreign");
        let error = verify(&verifier, &podca_leaf(&foreign, PODCA_ID, now)).unwrap_err();
        assert_eq!(
            error,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
        );

        let expired = podca_leaf(&ca, PODCA_ID, now - time::Duration::hours(2));
        let error = verify(&verifier, &expired).unwrap_err();
        assert!(
            matches!(
                error,
                rustls::Error::InvalidCertificate(rustls::CertificateError::ExpiredContext { .. })
            ),
            "{error:?}"
        );
    }

    /// An rcgen CA with a leaf of its own making: podca never issues a leaf without its one
    /// URI SAN, or without serverAuth, but a server might present one.
    struct RcgenCa {
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
        anchor: CertificateDer<'static>,
    }

    impl RcgenCa {
        fn new() -> Self {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
            let anchor = params.self_signed(&key).unwrap().der().clone();
            RcgenCa {
                issuer: rcgen::Issuer::new(params, key),
                anchor,
            }
        }

        fn leaf(
            &self,
            uris: &[&str],
            purpose: rcgen::ExtendedKeyUsagePurpose,
        ) -> CertificateDer<'static> {
            let mut params = rcgen::CertificateParams::new(vec!["podca".to_owned()]).unwrap();
            for uri in uris {
                params
                    .subject_alt_names
                    .push(rcgen::SanType::URI((*uri).try_into().unwrap()));
            }
            params.extended_key_usages = vec![purpose];
            let key = rcgen::KeyPair::generate().unwrap();
            params.signed_by(&key, &self.issuer).unwrap().der().clone()
        }
    }

    /// The leaf must carry exactly one URI SAN: none, or the pinned ID beside another, is
    /// refused; and the chain is checked for serverAuth as for a DNS name.
    #[test]
    fn a_pinned_spiffe_id_is_the_one_uri_san_of_a_server_leaf() {
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let ca = RcgenCa::new();
        let verifier = PinnedSpiffeId::new(PODCA_ID, vec![ca.anchor.clone()]).unwrap();
        verify(&verifier, &ca.leaf(&[PODCA_ID], ServerAuth)).expect("the fixture is sound");

        let error = verify(&verifier, &ca.leaf(&[], ServerAuth)).unwrap_err();
        assert_eq!(
            pin_refusal(&error),
            (
                PinRefusal::NoUri {
                    pinned: PODCA_ID.to_owned()
                },
                format!(
                    "TLS: the server's certificate carries no URI SAN, not the pinned {PODCA_ID}"
                )
            )
        );
        let other = "spiffe://cluster.local/ns/podca-system/sa/impostor";
        for uris in [[PODCA_ID, other], [other, PODCA_ID]] {
            let error = verify(&verifier, &ca.leaf(&uris, ServerAuth)).unwrap_err();
            assert_eq!(
                pin_refusal(&error).1,
                format!(
                    "TLS: the server's certificate carries 2 URI SANs ({}, {}), not one: the \
                     pinned {PODCA_ID}",
                    uris[0], uris[1]
                )
            );
        }
        // A server's URI is the server's text: control characters are shown escaped.
        let error = verify(&verifier, &ca.leaf(&["spiffe://x/\u{1b}[2J"], ServerAuth)).unwrap_err();
        assert!(
            pin_refusal(&error).1.contains("spiffe://x/\\u{1b}[2J,"),
            "{error:?}"
        );

        let error = verify(&verifier, &ca.leaf(&[PODCA_ID], ClientAuth)).unwrap_err();
        assert!(
            matches!(
                error,
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::InvalidPurpose
                        | rustls::CertificateError::InvalidPurposeContext { .. }
                )
            ),
            "{error:?}"
        );
    }

    #[test]
    fn a_pin_is_a_spiffe_id_and_is_used_for_an_https_server() {
        let ca = podca_ca("podca");
        for bad in [
            "spiffe://",
            "spiffe://Cluster.local/x",
            "spiffe://cluster.local/a//b",
        ] {
            let error = PinnedSpiffeId::new(bad, anchors_of(&ca)).unwrap_err();
            assert!(
                error
                    .to_string()
                    .starts_with(&format!("--server-name {bad}: not a SPIFFE ID")),
                "{bad}: {error}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let roots = dir.path().join("roots.pem");
        std::fs::write(&roots, ca.roots_pem()).unwrap();
        let tls = client_tls("https://127.0.0.1:8443", Some(&roots), Some(PODCA_ID))
            .unwrap()
            .unwrap();
        assert_eq!(
            tls.pinned.as_ref().map(|p| p.pinned.as_str()),
            Some(PODCA_ID)
        );
        let tls = client_tls("https://127.0.0.1:8443", Some(&roots), Some("podca"))
            .unwrap()
            .unwrap();
        assert!(tls.pinned.is_none(), "a DNS name is webpki's own check");
        let error = client_tls(
            "https://127.0.0.1:8443",
            Some(&roots),
            Some("spiffe://bad//id"),
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("--server-name spiffe://bad//id: not a SPIFFE ID"),
            "{error}"
        );
    }

    #[test]
    fn token_debug_is_redacted() {
        assert!(!format!("{:?}", Token("secret-value".into())).contains("secret-value"));
    }
}
