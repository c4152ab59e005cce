//! TLS on the gRPC TCP listener (rustls, aws-lc-rs): the serving certificate behind a swappable
//! resolver, the per-connection handshake, and the drivers that keep the certificate current
//! (the self-issued one from `podca_authority::serving_cert`, or files an operator provides).
//!
//! * A new certificate is swapped into [`ServingKeys`]; established connections keep the one
//!   they were handshaken with, new handshakes get the new one. Nothing is dropped.
//! * Each handshake runs in its own task with [`HANDSHAKE_TIMEOUT`], so a peer that stalls (or
//!   speaks plaintext) never holds up the accept loop; a failed handshake is logged at debug
//!   with the peer address.
//! * The accepted connection is a `tokio_rustls::server::TlsStream`, whose tonic connect info
//!   (`tonic::transport::server::TlsConnectInfo`) carries the peer address and the client's
//!   certificate chain (for mTLS renewal: [`crate::peer_identity`]). It is wrapped in
//!   [`Corked`], which passes that connect info through and sends each HTTP/2 answer (HEADERS,
//!   DATA, trailers) in one TLS record.
//! * Connections over the caps of [`crate::connections`] are closed at accept, before the
//!   handshake.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use podca_authority::metrics::{GrpcMetrics, ReasonLabels};
use podca_authority::serving_cert::ServingCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, error, info};

use crate::connections::{Admitted, ConnectionCounter};
use crate::cork::Corked;
use crate::peer_identity::ClientTrust;

/// How long a peer has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often `tls = "files"` looks at the certificate and key files.
pub const FILES_POLL: Duration = Duration::from_secs(5);
/// Handshaken connections waiting for the HTTP/2 server to take them.
const ACCEPTED_BACKLOG: usize = 256;

/// Why a certificate and key cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("cannot read {path}: {error}")]
    Read { path: PathBuf, error: String },
    #[error("{what}: no PEM CERTIFICATE block")]
    NoCertificate { what: String },
    #[error("{what}: {error}")]
    Certificate { what: String, error: String },
    /// The key's bytes are never part of the message.
    #[error("{what}: not a usable private key ({error})")]
    Key { what: String, error: String },
    #[error("the private key does not match the certificate ({0})")]
    Mismatch(String),
    #[error("building the TLS configuration: {0}")]
    Config(String),
}

/// The crypto provider every TLS endpoint of podca uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The serving certificate in force, swapped atomically; every handshake reads it once.
#[derive(Debug)]
pub struct ServingKeys {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingKeys {
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(ServingKeys {
            current: RwLock::new(Arc::new(key)),
        })
    }

    /// Puts `key` in force for every handshake from now on.
    pub fn swap(&self, key: CertifiedKey) {
        let key = Arc::new(key);
        match self.current.write() {
            Ok(mut current) => *current = key,
            // A writer panicked mid-assignment of an `Arc`: the value is still whole.
            Err(poisoned) => *poisoned.into_inner() = key,
        }
    }

    /// The certificate in force.
    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(current) => Arc::clone(&current),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }
}

impl ResolvesServerCert for ServingKeys {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A rustls certificate for `chain` (leaf first, DER) and its PKCS#8 `key`, checked to match.
pub fn certified_key(chain: &[Vec<u8>], key_pkcs8_der: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = chain
        .iter()
        .map(|der| CertificateDer::from(der.clone()))
        .collect();
    let key = PrivateKeyDer::Pkcs8(key_pkcs8_der.to_vec().into());
    from_der(chain, key)
}

/// A rustls certificate for the PEM `chain` (leaf first) and PEM `key` (PKCS#8, SEC1 or
/// PKCS#1), checked to match; `what` names the source in errors.
pub fn certified_key_from_pem(
    chain: &[u8],
    key: &[u8],
    what: &str,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(chain)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate {
            what: what.to_owned(),
            error: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            what: what.to_owned(),
        });
    }
    // The pem error may quote a line of the key file: keep only its kind.
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Key {
        what: what.to_owned(),
        error: pem_error_kind(&e),
    })?;
    from_der(chain, key)
}

fn pem_error_kind(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::NoItemsFound => "no PEM PRIVATE KEY block".into(),
        Error::MissingSectionEnd { .. } | Error::IllegalSectionStart { .. } => "broken PEM".into(),
        Error::Base64Decode(_) => "bad base64 in PEM".into(),
        _ => "unreadable PEM".into(),
    }
}

fn from_der(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, TlsError> {
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::Mismatch(e.to_string()),
        other => TlsError::Key {
            what: "the private key".into(),
            error: other.to_string(),
        },
    })
}

/// The listener's rustls configuration: TLS 1.2 and 1.3 (rustls defaults), ALPN `h2`, the
/// certificate from `keys`; with `clients`, optional client certificates verified by it (mTLS
/// renewal, see [`crate::peer_identity`]), else none asked for.
pub fn server_config(
    keys: Arc<ServingKeys>,
    clients: Option<Arc<ClientTrust>>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match clients {
        Some(clients) => builder.with_client_cert_verifier(clients),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(keys);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The OIDC discovery listener's rustls configuration (`podca_authority::oidc`): the same
/// `keys` as the gRPC listener, so the certificate is renewed and reloaded with it; TLS 1.2 and
/// 1.3, ALPN `http/1.1`, no client certificates.
pub fn http1_server_config(keys: Arc<ServingKeys>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(keys);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts TCP connections on `listener`, closes at once those over the caps of `counter`, and
/// handshakes the others each in its own task (at most `timeout`); yields the connections whose
/// handshake succeeded. Ends when the returned stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    timeout: Duration,
    counter: Arc<ConnectionCounter>,
) -> ReceiverStream<io::Result<Admitted<Corked<TlsStream<TcpStream>>>>> {
    let (tx, rx) = mpsc::channel(ACCEPTED_BACKLOG);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: the listener itself is fine.
                    debug!(error = %e, "gRPC: accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let slot = match counter.admit_connection(peer) {
                Ok(slot) => slot,
                Err(refused) => {
                    debug!(%peer, reason = %refused, "gRPC: connection closed before TLS");
                    drop(stream);
                    continue;
                }
            };
            let (acceptor, tx, failures) =
                (acceptor.clone(), tx.clone(), counter.metrics().clone());
            tokio::spawn(async move {
                if let Some(tls) = handshake(&acceptor, stream, peer, timeout, &failures).await {
                    let _ = tx.send(Ok(Admitted::new(Corked::new(tls), slot))).await;
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    timeout: Duration,
    metrics: &GrpcMetrics,
) -> Option<TlsStream<TcpStream>> {
    let failures = &metrics.tls_handshake_failures;
    // Without TCP_NODELAY, small unary answers wait on delayed ACKs (~40 ms each).
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, error = %e, "gRPC: setting TCP_NODELAY failed");
    }
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "gRPC: TLS handshake failed");
            failures
                .get_or_create(&ReasonLabels { reason: "error" })
                .inc();
            None
        }
        Err(_) => {
            debug!(%peer, timeout_seconds = timeout.as_secs(), "gRPC: TLS handshake timed out");
            failures
                .get_or_create(&ReasonLabels { reason: "timeout" })
                .inc();
            None
        }
    }
}

/// Serves every certificate `certs` receives (the self-issued serving certificate, see
/// `podca_authority::serving_cert::run`) until its sender is gone.
pub async fn follow_serving_cert(
    mut certs: watch::Receiver<Arc<ServingCert>>,
    keys: Arc<ServingKeys>,
) {
    while certs.changed().await.is_ok() {
        let cert = Arc::clone(&certs.borrow_and_update());
        match certified_key(&cert.chain_der, &cert.key_pkcs8_der) {
            Ok(key) => keys.swap(key),
            Err(e) => error!(error = %e, "the renewed gRPC serving certificate cannot be served"),
        }
    }
}

/// The certificate and key files of `tls = "files"`, and what was last read from them.
#[derive(Debug)]
pub struct ServingFiles {
    cert: PathBuf,
    key: PathBuf,
    /// The bytes last tried (served or refused), so a bad pair is reported once.
    last: Option<(Vec<u8>, Vec<u8>)>,
}

impl ServingFiles {
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        ServingFiles {
            cert: cert.into(),
            key: key.into(),
            last: None,
        }
    }

    /// Reads both files; `Ok(None)` when they hold what was read last time.
    pub fn load_if_changed(&mut self) -> Result<Option<CertifiedKey>, TlsError> {
        let cert = read(&self.cert)?;
        let key = read(&self.key)?;
        if self.last.as_ref() == Some(&(cert.clone(), key.clone())) {
            return Ok(None);
        }
        let loaded = certified_key_from_pem(&cert, &key, &self.cert.display().to_string());
        self.last = Some((cert, key));
        loaded.map(Some)
    }

    /// Polls the files every `poll` until `stop` turns true, swapping each new good pair into
    /// `keys`; a bad pair is logged once and the certificate in force stays.
    pub async fn watch(
        mut self,
        keys: Arc<ServingKeys>,
        poll: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => return,
                () = tokio::time::sleep(poll) => {}
            }
            match self.load_if_changed() {
                Ok(Some(key)) => {
                    keys.swap(key);
                    info!(cert = %self.cert.display(), "gRPC serving certificate reloaded");
                }
                Ok(None) => {}
                Err(e) => error!(
                    error = %e,
                    "the gRPC serving certificate files changed but cannot be used; the \
                     current certificate stays"
                ),
            }
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        path: path.to_owned(),
        error: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn self_signed(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_matching_pem_pair_loads() {
        let (cert, key) = self_signed("podca.test");
        let loaded = certified_key_from_pem(cert.as_bytes(), key.as_bytes(), "test").unwrap();
        assert_eq!(loaded.cert.len(), 1);
    }

    #[test]
    fn a_mismatched_pair_is_refused() {
        let (cert, _) = self_signed("a.test");
        let (_, other_key) = self_signed("b.test");
        let error =
            certified_key_from_pem(cert.as_bytes(), other_key.as_bytes(), "test").unwrap_err();
        assert!(matches!(error, TlsError::Mismatch(_)), "{error:?}");
    }

    #[test]
    fn missing_blocks_are_named_and_key_bytes_never_shown() {
        let (cert, key) = self_signed("a.test");
        assert_eq!(
            certified_key_from_pem(b"", key.as_bytes(), "c.pem").unwrap_err(),
            TlsError::NoCertificate {
                what: "c.pem".into()
            }
        );
        // A key file whose base64 is broken: the message must not quote it.
        let broken = key.replace('A', "!");
        let error = certified_key_from_pem(cert.as_bytes(), broken.as_bytes(), "c.pem")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("c.pem: not a usable private key"),
            "{error}"
        );
        let body_line = key.lines().nth(1).unwrap();
        assert!(!error.contains(&body_line[..16]), "{error}");
    }

    #[test]
    fn files_reload_only_on_change_and_keep_reporting_bad_pairs_once() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (cert, key) = self_signed("a.test");
        std::fs::write(&cert_path, &cert).unwrap();
        std::fs::write(&key_path, &key).unwrap();
        let mut files = ServingFiles::new(&cert_path, &key_path);
        assert!(files.load_if_changed().unwrap().is_some());
        assert!(files.load_if_changed().unwrap().is_none());
        let (_, other_key) = self_signed("b.test");
        std::fs::write(&key_path, &other_key).unwrap();
        assert!(matches!(
            files.load_if_changed(),
            Err(TlsError::Mismatch(_))
        ));
        // The same bad pair again is not news.
        assert!(files.load_if_changed().unwrap().is_none());
        let (cert2, key2) = self_signed("c.test");
        std::fs::write(&cert_path, &cert2).unwrap();
        std::fs::write(&key_path, &key2).unwrap();
        assert!(files.load_if_changed().unwrap().is_some());
        std::fs::remove_file(&key_path).unwrap();
        assert!(matches!(
            files.load_if_changed(),
            Err(TlsError::Read { .. })
        ));
    }

    #[test]
    fn a_swap_is_seen_by_the_next_resolution() {
        let (cert, key) = self_signed("a.test");
        let first = certified_key_from_pem(cert.as_bytes(), key.as_bytes(), "t").unwrap();
        let keys = ServingKeys::new(first.clone());
        assert_eq!(keys.current().cert, first.cert);
        let (cert, key) = self_signed("b.test");
        let second = certified_key_from_pem(cert.as_bytes(), key.as_bytes(), "t").unwrap();
        keys.swap(second.clone());
        assert_eq!(keys.current().cert, second.cert);
    }
}
