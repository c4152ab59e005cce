//! A client of podca.v1, as `podca issue --server` uses it: the server URL (`https://`,
//! `http://` or `unix:///path`), TLS that trusts only the anchors given and verifies one name,
//! the caller's credentials, and one-line answers for refusals and TLS failures. Messages name
//! the `podca issue` flags a user would change.

use std::path::Path;
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
            endpoint = endpoint.tls_config(tls.config.clone()).map_err(|e| {
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
            .map_err(|status| fail(format!("{}: {}", self.url, refusal(&status))))
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
            .map_err(|status| fail(format!("{}: {}", self.url, refusal(&status))))
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
    {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let count = CertificateDer::pem_slice_iter(&roots)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(format!("--ca-file {}: {e}", ca_file.display())))?
            .len();
        if count == 0 {
            return Err(fail(format!(
                "--ca-file {}: no PEM CERTIFICATE block",
                ca_file.display()
            )));
        }
    }
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
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(roots))
        .domain_name(name.clone());
    Ok(Some(ClientTls { config, name }))
}

/// A connection failure, saying in one line what was wrong with TLS when it was TLS.
pub fn tls_failure(error: &(dyn std::error::Error + 'static), name: &str) -> String {
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
                Error::InvalidCertificate(CertificateError::NotValidForName)
                | Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
                    format!(
                        "TLS: the server's certificate is not valid for {name:?} (set \
                         --server-name to a name it carries)"
                    )
                }
                Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                    "TLS: the server's certificate does not chain to an anchor in --ca-file"
                        .to_string()
                }
                Error::InvalidCertificate(CertificateError::Expired)
                | Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
                    "TLS: the server's certificate has expired".to_string()
                }
                other => format!("TLS: {other}"),
            };
        }
        last = e.to_string();
        cause = e.source();
    }
    last
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
    }

    #[test]
    fn token_debug_is_redacted() {
        assert!(!format!("{:?}", Token("secret-value".into())).contains("secret-value"));
    }
}
