//! Limits before authentication on the gRPC TLS listener (issue #12, item 3, connection level),
//! in process with small caps:
//!
//! * a flood of connections from one peer: those over `max_connections_per_peer` are closed at
//!   accept, before any TLS byte, while another peer address (127.0.0.2 is loopback too) is
//!   served; slots come back when connections close;
//! * over `max_connections` in total, every peer's new connection is closed the same way;
//! * a request whose headers exceed the header-list limit is refused, the connection's others
//!   are not;
//! * a connection on which nothing has authenticated gets 16 requests in flight at once, not
//!   1,024 (issue #40); once one authenticates, the connection is not held back;
//! * a connection on which nothing authenticates (idle, or only junk tokens) is closed at the
//!   pre-authentication deadline; an authenticated one outlives it.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_authority::CaHandle;
use podca_authority::config::DevIdentity;
use podca_authority::metrics::{GrpcMetrics, ReasonLabels};
use podca_authority::serving_cert::{self, ServingIdentity};
use podca_grpc::auth::{AuthError, Authenticator, Credentials, DevAuthenticator, Identity, Peer};
use podca_grpc::connections::ConnectionLimits;
use podca_grpc::preauth::MAX_STREAMS_BEFORE_AUTH;
use podca_grpc::tls::{ServingKeys, certified_key, server_config};
use podca_grpc::{Api, ApiOptions, server};
use podca_proto::podca::v1::IssueCertificateRequest;
use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey, SignerPolicy};
use podca_tests::process::csr_for;
use podca_tests::tls::{SERVER_NAME, client_config};
use rustls::pki_types::ServerName;
use time::OffsetDateTime;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tonic::Request;
use tonic::transport::{Channel, Endpoint};

const LIMITS: ConnectionLimits = ConnectionLimits {
    per_peer: 4,
    total: 6,
};

struct Listener {
    addr: SocketAddr,
    anchors: String,
    metrics: GrpcMetrics,
    _stop: watch::Sender<bool>,
}

impl Listener {
    /// `podca_grpc_connections_refused_total{reason}` now.
    fn refused(&self, reason: &'static str) -> u64 {
        self.metrics
            .connections_refused
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// `podca_grpc_tls_handshake_failures_total{reason}` now.
    fn handshake_failures(&self, reason: &'static str) -> u64 {
        self.metrics
            .tls_handshake_failures
            .get_or_create(&ReasonLabels { reason })
            .get()
    }
}

async fn serve() -> Listener {
    serve_with(Arc::new(DevAuthenticator::new(&[DevIdentity {
        uid: 0,
        namespace: "default".into(),
        service_account: "app".into(),
    }])))
    .await
}

async fn serve_with(auth: Arc<dyn Authenticator>) -> Listener {
    serve_full(auth, podca_grpc::preauth::DEFAULT_PRE_AUTH_DEADLINE).await
}

/// With connections closed `deadline` after accept unless a request on them authenticated.
async fn serve_full(auth: Arc<dyn Authenticator>, deadline: Duration) -> Listener {
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap();
    let ca = IssuingCa::self_signed_root(
        Arc::new(key),
        "limits root",
        OffsetDateTime::now_utc(),
        time::Duration::days(30),
    )
    .unwrap();
    let anchors = ca.roots_pem();
    let handle = CaHandle::new(ca, vec![]);
    let identity = ServingIdentity {
        spiffe_id: podca_signer::names::spiffe_id("cluster.local", "podca-system", "podca"),
        dns_names: serving_cert::service_dns_names("podca", "podca-system"),
        lifetime: serving_cert::DEFAULT_LIFETIME,
    };
    let cert = identity
        .issue(&handle.current().ca, OffsetDateTime::now_utc())
        .unwrap();
    let keys = ServingKeys::new(certified_key(&cert.chain_der, &cert.key_pkcs8_der).unwrap());
    let (stop, stopped) = watch::channel(false);
    let metrics = GrpcMetrics::default();
    let api = Api::new(
        ApiOptions {
            signers: BTreeMap::from([(
                "default".into(),
                SignerPolicy::permissive("cluster.local"),
            )]),
            default_signer: "default".into(),
            node_proxy_service_accounts: vec![],
            rate_limit_per_identity: 0,
            max_open_streams: 100,
            allowed_signers: vec![],
            max_dns_names: podca_grpc::core::DEFAULT_MAX_DNS_NAMES,
        },
        handle,
        auth,
        None,
        stopped.clone(),
    )
    .unwrap()
    .with_metrics(metrics.clone())
    .with_pre_auth_deadline(deadline);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut shutdown = stopped;
    tokio::spawn(server::serve_tls(
        listener,
        server_config(keys, None).unwrap(),
        Arc::new(api),
        LIMITS,
        async move {
            let _ = shutdown.wait_for(|s| *s).await;
        },
    ));
    Listener {
        addr,
        anchors,
        metrics,
        _stop: stop,
    }
}

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))
        .unwrap();
    socket.connect(to).await.unwrap()
}

/// Whether the server closed `tcp` within `within` without sending a byte.
async fn closed_silently(tcp: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 16];
    match tokio::time::timeout(within, tcp.read(&mut buf)).await {
        Ok(Ok(0)) => true,
        // A reset is a close too.
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// A gRPC client over TLS whose connections come from `from`.
async fn client_from(from: &'static str, listener: &Listener) -> PodCaClient<Channel> {
    let (addr, config) = (listener.addr, client_config(&listener.anchors));
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let config = Arc::clone(&config);
        async move {
            let tcp = connect_from(from, addr).await;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(connector)
        .await
        .unwrap();
    PodCaClient::new(channel)
}

fn request() -> Request<IssueCertificateRequest> {
    Request::new(IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        ..Default::default()
    })
}

/// Waits until the server has accepted `n` connections (their slots are taken at accept).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_from_one_peer_is_cut_at_accept_and_others_are_served() {
    let listener = serve().await;
    // The flooding peer holds its cap with connections that never handshake.
    let mut held = Vec::new();
    for _ in 0..LIMITS.per_peer {
        held.push(connect_from("127.0.0.1", listener.addr).await);
    }
    settle().await;
    // Every further connection from it is closed at once, without a TLS byte: 200 of them.
    let started = Instant::now();
    for i in 0..200 {
        let mut extra = connect_from("127.0.0.1", listener.addr).await;
        assert!(
            closed_silently(&mut extra, Duration::from_secs(2)).await,
            "extra connection {i} from the flooding peer was not closed at accept"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "closing 200 connections took {:?}",
        started.elapsed()
    );
    assert_eq!(
        listener.refused("per_peer"),
        200,
        "each closed connection is counted"
    );
    assert_eq!(listener.refused("total"), 0);
    assert_eq!(listener.metrics.connections_open.get(), 4);
    // Another peer is served meanwhile.
    let mut other = client_from("127.0.0.2", &listener).await;
    other
        .issue_certificate(request())
        .await
        .expect("another peer issues during the flood");
    // Slots come back: once the flood's connections close, the peer is served again. The held
    // connections ended mid-handshake: failed handshakes.
    drop(held);
    settle().await;
    assert_eq!(listener.handshake_failures("error"), 4);
    assert_eq!(listener.handshake_failures("timeout"), 0);
    client_from("127.0.0.1", &listener)
        .await
        .issue_certificate(request())
        .await
        .expect("the peer issues once its connections are gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_total_cap_every_peer_is_cut_at_accept() {
    let listener = serve().await;
    let mut held = Vec::new();
    for from in ["127.0.0.1", "127.0.0.2", "127.0.0.3"] {
        for _ in 0..LIMITS.total / 3 {
            held.push(connect_from(from, listener.addr).await);
        }
    }
    settle().await;
    let mut extra = connect_from("127.0.0.4", listener.addr).await;
    assert!(
        closed_silently(&mut extra, Duration::from_secs(2)).await,
        "a new peer over the total cap was not closed at accept"
    );
    assert_eq!(
        (listener.refused("total"), listener.refused("per_peer")),
        (1, 0)
    );
    held.truncate(LIMITS.total - 1);
    settle().await;
    client_from("127.0.0.4", &listener)
        .await
        .issue_certificate(request())
        .await
        .expect("a free slot serves the next peer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_over_the_list_limit_are_refused_and_the_connection_serves_on() {
    let listener = serve().await;
    let mut client = client_from("127.0.0.1", &listener).await;
    let mut big = request();
    big.metadata_mut()
        .insert("x-padding", "a".repeat(32 * 1024).parse().unwrap());
    let refused = client.issue_certificate(big).await;
    // hyper answers 431 Request Header Fields Too Large before the service sees the call.
    let refused = refused.expect_err("a 32 KiB header was accepted");
    assert_eq!(
        (refused.code(), refused.message()),
        (
            tonic::Code::Unknown,
            "grpc-status header missing, mapped from HTTP status code 431"
        )
    );
    client
        .issue_certificate(request())
        .await
        .expect("a normal request after the refused one");
}

/// An authenticator that holds every call until `open` is true, and counts each
/// connection's calls in flight (now, and the most at once). The token `good` is
/// `default/app`; every other token is refused.
#[derive(Debug)]
struct HeldAuthenticator {
    open: watch::Sender<bool>,
    in_flight: std::sync::Mutex<BTreeMap<SocketAddr, (usize, usize)>>,
}

impl HeldAuthenticator {
    fn new() -> Arc<Self> {
        Arc::new(HeldAuthenticator {
            open: watch::channel(false).0,
            in_flight: std::sync::Mutex::new(BTreeMap::new()),
        })
    }

    fn count(&self, peer: &Peer, delta: isize) {
        let Peer::Tcp(conn) = peer else { return };
        let mut all = self.in_flight.lock().unwrap();
        let (now, most) = all.entry(*conn).or_default();
        *now = now.checked_add_signed(delta).unwrap();
        *most = (*most).max(*now);
    }

    /// (in flight now, most at once) of every connection with a call, by connection.
    fn connections(&self) -> Vec<(usize, usize)> {
        self.in_flight.lock().unwrap().values().copied().collect()
    }
}

#[tonic::async_trait]
impl Authenticator for HeldAuthenticator {
    async fn authenticate(
        &self,
        peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, AuthError> {
        self.count(peer, 1);
        let _ = self.open.subscribe().wait_for(|open| *open).await;
        self.count(peer, -1);
        match credentials.bearer.as_ref().map(|t| t.expose()) {
            Some("good") => Ok(Identity::service_account("default", "app")),
            _ => Err(AuthError::Invalid("unknown token".into())),
        }
    }
}

fn with_token(token: &str) -> Request<IssueCertificateRequest> {
    let mut request = request();
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// Polls `check` every 20 ms for up to 10 s.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_connection_gets_sixteen_streams_not_a_thousand() {
    let auth = HeldAuthenticator::new();
    let listener = serve_with(Arc::clone(&auth) as Arc<dyn Authenticator>).await;

    // The attacker: one connection, 40 streams of junk tokens, none of which authenticates.
    let junk = client_from("127.0.0.1", &listener).await;
    let flood: Vec<_> = (0..40)
        .map(|_| {
            let mut junk = junk.clone();
            tokio::spawn(async move { junk.issue_certificate(with_token("junk")).await })
        })
        .collect();
    until("16 junk calls reach authentication", || {
        auth.connections()
            .iter()
            .any(|(now, _)| *now == MAX_STREAMS_BEFORE_AUTH)
    })
    .await;

    // Another client is not held behind them: its call reaches authentication at once.
    let mut other = client_from("127.0.0.2", &listener).await;
    let good = tokio::spawn(async move { other.issue_certificate(with_token("good")).await });
    until("the other connection's call is in authentication", || {
        auth.connections().len() == 2
    })
    .await;
    auth.open.send_replace(true);
    good.await.unwrap().expect("the other client is served");
    for call in flood {
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    }
    let most: Vec<usize> = auth.connections().iter().map(|(_, most)| *most).collect();
    assert!(
        most.contains(&MAX_STREAMS_BEFORE_AUTH)
            && most.iter().all(|m| *m <= MAX_STREAMS_BEFORE_AUTH),
        "junk streams in authentication at once, by connection: {most:?}"
    );

    // A connection whose first call authenticated is not held back: 40 calls at once.
    auth.open.send_replace(false);
    let mut proxy = client_from("127.0.0.3", &listener).await;
    auth.open.send_replace(true);
    proxy.issue_certificate(with_token("good")).await.unwrap();
    auth.open.send_replace(false);
    let renewals: Vec<_> = (0..40)
        .map(|_| {
            let mut proxy = proxy.clone();
            tokio::spawn(async move { proxy.issue_certificate(with_token("good")).await })
        })
        .collect();
    until(
        "all 40 of the authenticated connection's calls are in authentication",
        || auth.connections().iter().any(|(now, _)| *now == 40),
    )
    .await;
    auth.open.send_replace(true);
    for call in renewals {
        call.await.unwrap().expect("issued");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_on_which_nothing_authenticates_is_closed_at_the_deadline() {
    let auth = HeldAuthenticator::new();
    auth.open.send_replace(true);
    let deadline = Duration::from_secs(1);
    let listener = serve_full(Arc::clone(&auth) as Arc<dyn Authenticator>, deadline).await;

    // Held after the TLS handshake without a request: closed at the deadline.
    let started = Instant::now();
    let tcp = connect_from("127.0.0.1", listener.addr).await;
    let mut tls = tokio_rustls::TlsConnector::from(client_config(&listener.anchors))
        .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            // The server's HTTP/2 preface arrives first; then the close.
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "an idle unauthenticated connection is closed"
    );
    assert!(
        started.elapsed() >= deadline,
        "closed after the deadline, not before: {:?}",
        started.elapsed()
    );

    // Only junk tokens: every call refused, and the connection closed at the deadline (the
    // channel has to connect again).
    let junk = podca_tests::tls::TlsChannel::connect(listener.addr, &listener.anchors, SERVER_NAME)
        .await
        .unwrap();
    let until_closed = Instant::now() + Duration::from_secs(10);
    while junk.connection_count() < 2 {
        assert!(
            Instant::now() < until_closed,
            "the junk connection is closed within 10 s"
        );
        let status = junk
            .client()
            .issue_certificate(with_token("junk"))
            .await
            .unwrap_err();
        assert!(
            matches!(
                status.code(),
                tonic::Code::Unauthenticated | tonic::Code::Unavailable
            ),
            "{status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Authenticated on its first request: the same connection serves past the deadline.
    let good = podca_tests::tls::TlsChannel::connect(listener.addr, &listener.anchors, SERVER_NAME)
        .await
        .unwrap();
    good.client()
        .issue_certificate(with_token("good"))
        .await
        .unwrap();
    tokio::time::sleep(deadline + Duration::from_millis(500)).await;
    good.client()
        .issue_certificate(with_token("good"))
        .await
        .unwrap();
    assert_eq!(good.connection_count(), 1, "one connection throughout");
}
