//! The gRPC servers: `podca.v1` on TCP (TLS, see [`crate::tls`], or plaintext on loopback),
//! and the Workload API (plus `podca.v1`) on a Unix socket whose connections go through
//! [`AuthorityFix`].

use std::future::Future;
use std::sync::Arc;

use podca_proto::podca::v1::pod_ca_server::PodCaServer;
use podca_proto::workload::spiffe_workload_api_server::SpiffeWorkloadApiServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;

use super::core::{Api, MAX_MESSAGE_BYTES};
use super::observe;
use super::podca_service::PodCaService;
use super::tls;
use super::uds_authority::AuthorityFix;
use super::workload::WorkloadService;

/// HTTP/2 streams one connection may have open at once.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

fn podca(api: &Arc<Api>) -> PodCaServer<PodCaService> {
    PodCaServer::new(PodCaService::new(Arc::clone(api)))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
}

fn workload(api: &Arc<Api>) -> SpiffeWorkloadApiServer<WorkloadService> {
    SpiffeWorkloadApiServer::new(WorkloadService::new(Arc::clone(api)))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
}

fn builder() -> Server {
    Server::builder()
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(60)))
}

/// Serves `podca.v1` over TLS on `listener` until `shutdown` resolves: every connection is
/// handshaken in its own task (at most [`tls::HANDSHAKE_TIMEOUT`]) with the certificate
/// `config` resolves at that moment.
pub async fn serve_tls(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    api: Arc<Api>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = tls::incoming(listener, config, tls::HANDSHAKE_TIMEOUT);
    builder()
        .add_routes(observe::edge_routes(&api).await)
        .add_service(podca(&api))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves `podca.v1` in plaintext on `listener` until `shutdown` resolves.
pub async fn serve_tcp(
    listener: TcpListener,
    api: Arc<Api>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    // Without TCP_NODELAY, small unary answers wait on delayed ACKs (~40 ms each).
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        conn.and_then(|stream| {
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    });
    builder()
        .add_routes(observe::edge_routes(&api).await)
        .add_service(podca(&api))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves the SPIFFE Workload API and `podca.v1` on a Unix socket until `shutdown` resolves.
pub async fn serve_unix(
    listener: UnixListener,
    api: Arc<Api>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new));
    builder()
        .add_routes(observe::edge_routes(&api).await)
        .add_service(workload(&api))
        .add_service(podca(&api))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
