//! The gRPC servers: `podca.v1` on TCP (TLS, see [`crate::tls`], whose connections go through
//! [`crate::cork::Corked`] so that an answer leaves in one TLS record; or plaintext on
//! loopback), and the Workload API (plus `podca.v1`) on a Unix socket whose connections go
//! through [`AuthorityFix`] and [`Coalesced`] (one write per HTTP/2 flush).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use podca_proto::envoy_api::envoy::service::secret::v3::secret_discovery_service_server::SecretDiscoveryServiceServer;
use podca_proto::istio::v1::auth::istio_certificate_service_server::IstioCertificateServiceServer;
use podca_proto::podca::v1::pod_ca_server::PodCaServer;
use podca_proto::workload::spiffe_workload_api_server::SpiffeWorkloadApiServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;

use super::coalesce::Coalesced;
use super::connections::{Admitted, ConnectionCounter, ConnectionLimits};
use super::core::{Api, MAX_MESSAGE_BYTES};
use super::federation::FederatedBundles;
use super::istio::IstioService;
use super::jwt::MaybeJwt;
use super::observe;
use super::podca_service::PodCaService;
use super::preauth::PreAuthLayer;
use super::sds::SdsService;
use super::tls;
use super::uds_authority::AuthorityFix;
use super::workload::WorkloadService;
use podca_authority::traces::TraceContextLayer;

/// HTTP/2 streams one connection may have open at once: a node proxy multiplexes the
/// renewals of every pod on its node over one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// Largest header block (HPACK-decoded) a request may send: a bearer token is 1–2 KiB; hyper's
/// default (16 MiB) would let one request hold megabytes before authentication.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// An HTTP/2 PING after this long without frames from the peer…
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// …which must be answered within this, or the connection is closed (dead peers).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// After this a connection gets a GOAWAY: no new streams, the open ones finish, then it
/// closes. This bounds how long an idle connection holds a slot of [`crate::connections`];
/// clients reconnect transparently.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(3600);

fn podca(api: &Arc<Api>) -> PodCaServer<PodCaService> {
    PodCaServer::new(PodCaService::new(Arc::clone(api)))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
}

/// The Istio CA API, on the TCP listeners beside `podca.v1`.
fn istio(api: &Arc<Api>) -> IstioCertificateServiceServer<IstioService> {
    IstioCertificateServiceServer::new(IstioService::new(Arc::clone(api)))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
}

fn workload(
    api: &Arc<Api>,
    jwt: MaybeJwt,
    federated: Option<FederatedBundles>,
) -> SpiffeWorkloadApiServer<WorkloadService> {
    let service = WorkloadService::new(Arc::clone(api));
    let service = match federated {
        Some(federated) => service.with_federated(federated),
        None => service,
    };
    let service = match jwt {
        Some(jwt) => service.with_jwt(jwt),
        None => service,
    };
    SpiffeWorkloadApiServer::new(service).max_decoding_message_size(MAX_MESSAGE_BYTES)
}

/// The HTTP/2 settings of every listener (documented in docs/grpc-api.md, "Connection limits
/// and HTTP/2 settings").
fn builder() -> Server {
    Server::builder()
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_BYTES))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// [`builder`] for TCP listeners, whose connections also age out.
fn tcp_builder() -> Server {
    builder().max_connection_age(MAX_CONNECTION_AGE)
}

/// Serves `podca.v1` and the Istio CA API over TLS on `listener` until `shutdown` resolves: connections over
/// `limits` are closed at accept; every other one is handshaken in its own task (at most
/// [`tls::HANDSHAKE_TIMEOUT`]) with the certificate `config` resolves at that moment.
pub async fn serve_tls(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    api: Arc<Api>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = tls::incoming(
        listener,
        config,
        tls::HANDSHAKE_TIMEOUT,
        ConnectionCounter::with_pre_auth(limits, api.metrics().clone(), api.pre_auth()),
    );
    tcp_builder()
        .layer(PreAuthLayer(api.pre_auth()))
        .layer(TraceContextLayer)
        .add_routes(observe::edge_routes(&api).await)
        .add_service(podca(&api))
        .add_service(istio(&api))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves `podca.v1` and the Istio CA API in plaintext on `listener` until `shutdown` resolves; connections over
/// `limits` are closed at accept.
pub async fn serve_tcp(
    listener: TcpListener,
    api: Arc<Api>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let counter = ConnectionCounter::with_pre_auth(limits, api.metrics().clone(), api.pre_auth());
    let incoming = TcpListenerStream::new(listener).filter_map(move |conn| {
        let stream = match conn {
            Ok(stream) => stream,
            Err(e) => return Some(Err(e)),
        };
        let peer = match stream.peer_addr() {
            Ok(peer) => peer,
            Err(e) => return Some(Err(e)),
        };
        let slot = match counter.admit_connection(peer) {
            Ok(slot) => slot,
            Err(refused) => {
                tracing::debug!(%peer, reason = %refused, "gRPC: connection closed at accept");
                return None;
            }
        };
        // Without TCP_NODELAY, small unary answers wait on delayed ACKs (~40 ms each).
        Some(
            stream
                .set_nodelay(true)
                .map(|()| Admitted::new(stream, slot)),
        )
    });
    tcp_builder()
        .layer(PreAuthLayer(api.pre_auth()))
        .layer(TraceContextLayer)
        .add_routes(observe::edge_routes(&api).await)
        .add_service(podca(&api))
        .add_service(istio(&api))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves the SPIFFE Workload API and `podca.v1` on a Unix socket until `shutdown` resolves.
pub async fn serve_unix(
    listener: UnixListener,
    api: Arc<Api>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_unix_with_jwt(listener, api, None, None, None, shutdown).await
}

/// [`serve_unix`] whose Workload API also serves JWT-SVIDs with `jwt` (None: UNIMPLEMENTED),
/// and Envoy SDS beside it with `sds` ([`crate::sds`]; None: not served).
pub async fn serve_unix_with_jwt(
    listener: UnixListener,
    api: Arc<Api>,
    jwt: MaybeJwt,
    sds: Option<SdsService>,
    federated: Option<FederatedBundles>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = UnixListenerStream::new(listener)
        .map(|conn| conn.map(|stream| AuthorityFix::new(Coalesced::new(stream))));
    builder()
        .layer(TraceContextLayer)
        .add_routes(observe::edge_routes(&api).await)
        .add_service(workload(&api, jwt, federated))
        .add_optional_service(sds.map(|sds| {
            SecretDiscoveryServiceServer::new(sds).max_decoding_message_size(MAX_MESSAGE_BYTES)
        }))
        .add_service(podca(&api))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
