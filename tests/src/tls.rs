//! TLS clients of podca serve's gRPC listener: a rustls client (aws-lc-rs) that trusts only the
//! anchors a test gives it and verifies the name it is told, as tonic channels and as raw
//! handshakes (to look at the served chain).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint};

/// The namespace `podca serve` runs in, in the tests that look at its serving certificate
/// (`[grpc] tls_namespace`).
pub const NAMESPACE: &str = "podca-system";
/// The name clients verify: the Service `podca` in [`NAMESPACE`].
pub const SERVER_NAME: &str = "podca.podca-system.svc";
/// The `[grpc]` lines that give `podca serve` the serving certificate tests verify.
pub const GRPC_TLS_CONFIG: &str = "tls_namespace = \"podca-system\"\n";

/// A rustls client configuration trusting exactly the certificates in `anchors_pem`, ALPN `h2`.
pub fn client_config(anchors_pem: &str) -> Arc<rustls::ClientConfig> {
    client_config_with(anchors_pem, None)
}

/// [`client_config`] presenting `credential` (chain PEM, key PEM) as the client certificate,
/// if any (mTLS renewal).
pub fn client_config_with(
    anchors_pem: &str,
    credential: Option<(&str, &str)>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(anchors_pem.as_bytes()) {
        roots
            .add(cert.expect("the anchors are PEM certificates"))
            .expect("the anchor is a usable root");
    }
    assert!(!roots.is_empty(), "no anchors in:\n{anchors_pem}");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("rustls' default protocol versions")
        .with_root_certificates(roots);
    let mut config = match credential {
        Some((chain, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(chain.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("the client chain is PEM"),
                rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .expect("the client key is PEM"),
            )
            .expect("a usable client certificate"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A gRPC client of `addr` over TLS verified for [`SERVER_NAME`] against `anchors_pem`,
/// presenting `credential` (chain PEM, key PEM) if any.
pub async fn mtls_client(
    addr: SocketAddr,
    anchors_pem: &str,
    credential: Option<(&str, &str)>,
) -> PodCaClient<Channel> {
    let config = client_config_with(anchors_pem, credential);
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let config = Arc::clone(&config);
        async move {
            let tcp = TcpStream::connect(addr).await?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(ServerName::try_from(SERVER_NAME).expect("a DNS name"), tcp)
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid endpoint")
        .connect_with_connector(connector)
        .await
        .expect("the TLS channel connects");
    PodCaClient::new(channel)
}

/// One TLS handshake with `addr`, verifying the server for `name` against `anchors_pem`.
pub async fn handshake(
    addr: SocketAddr,
    anchors_pem: &str,
    name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from(name.to_owned()).expect("a valid server name");
    let tcp = TcpStream::connect(addr).await?;
    // As tonic's own connector does: without it, a request's HEADERS and DATA frames, written
    // separately, wait ~40 ms on the server's delayed ACK (Nagle).
    tcp.set_nodelay(true)?;
    tokio_rustls::TlsConnector::from(client_config(anchors_pem))
        .connect(name, tcp)
        .await
}

/// The certificate chain `addr` serves (leaf first), after verifying it as [`handshake`] does.
pub async fn served_chain(
    addr: SocketAddr,
    anchors_pem: &str,
    name: &str,
) -> std::io::Result<Vec<CertificateDer<'static>>> {
    let tls = handshake(addr, anchors_pem, name).await?;
    let (_, session) = tls.get_ref();
    Ok(session
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default())
}

/// A gRPC channel over TLS to `addr` (see [`handshake`]), and how many TCP connections it has
/// made so far: a channel reconnects only when its connection breaks.
#[derive(Debug, Clone)]
pub struct TlsChannel {
    pub channel: Channel,
    pub connections: Arc<AtomicUsize>,
    /// The chain the server presented on each connection, in order.
    pub chains: Arc<Mutex<Vec<Vec<CertificateDer<'static>>>>>,
}

impl TlsChannel {
    pub async fn connect(
        addr: SocketAddr,
        anchors_pem: &str,
        name: &str,
    ) -> Result<TlsChannel, tonic::transport::Error> {
        let connections = Arc::new(AtomicUsize::new(0));
        let chains = Arc::new(Mutex::new(vec![]));
        let anchors = anchors_pem.to_owned();
        let name = name.to_owned();
        let (count, seen) = (Arc::clone(&connections), Arc::clone(&chains));
        let connector = tower::service_fn(move |_: tonic::transport::Uri| {
            let (anchors, name) = (anchors.clone(), name.clone());
            let (count, seen) = (Arc::clone(&count), Arc::clone(&seen));
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                let tls = handshake(addr, &anchors, &name).await?;
                let chain = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default();
                seen.lock().expect("not poisoned").push(chain);
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        });
        // The scheme only names the request's :scheme; the connector does the TLS.
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("a valid endpoint")
            .connect_with_connector(connector)
            .await?;
        Ok(TlsChannel {
            channel,
            connections,
            chains,
        })
    }

    pub fn client(&self) -> PodCaClient<Channel> {
        PodCaClient::new(self.channel.clone())
    }

    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A `podca.v1` client over TLS to 127.0.0.1:`port`, verifying [`SERVER_NAME`] against
/// `anchors_pem`.
pub async fn client(port: u16, anchors_pem: &str) -> PodCaClient<Channel> {
    TlsChannel::connect(
        SocketAddr::from(([127, 0, 0, 1], port)),
        anchors_pem,
        SERVER_NAME,
    )
    .await
    .expect("podca serve's gRPC listener accepts a verified TLS connection")
    .client()
}

/// Drives a TLS handshake between `c` and `s` in memory (no sockets), so it runs at the
/// simulated time their configurations were built with. The error names the side that refused.
pub fn handshake_in_memory(
    c: &mut rustls::ClientConnection,
    s: &mut rustls::ServerConnection,
) -> Result<(), String> {
    for _ in 0..20 {
        if !c.is_handshaking() && !s.is_handshaking() {
            break;
        }
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).map_err(|e| e.to_string())?;
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).map_err(|e| e.to_string())?;
        }
        s.process_new_packets()
            .map_err(|e| format!("server side: {e}"))?;
        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).map_err(|e| e.to_string())?;
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).map_err(|e| e.to_string())?;
        }
        c.process_new_packets()
            .map_err(|e| format!("client side: {e}"))?;
    }
    if c.is_handshaking() || s.is_handshaking() {
        return Err("handshake did not complete".into());
    }
    Ok(())
}

/// Why a handshake's client refused the server's certificate: the rustls certificate error
/// inside `result`'s I/O error. Panics when the handshake succeeded or failed otherwise (a
/// refused connection is not a refused certificate).
pub fn refused_certificate<T: std::fmt::Debug>(
    result: std::io::Result<T>,
) -> rustls::CertificateError {
    let error = result.expect_err("the client must refuse the server's certificate");
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(why)) => why.clone(),
        _ => panic!("not a certificate refusal: {error:?}"),
    }
}
