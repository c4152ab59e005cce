//! Streams before authentication (issue #40): a TCP connection on which no request has yet
//! authenticated may have at most [`MAX_STREAMS_BEFORE_AUTH`] requests past this gate at once;
//! the others wait (their bodies unread, so HTTP/2 flow control holds the peer's data) for up
//! to [`PRE_AUTH_WAIT`], then get `RESOURCE_EXHAUSTED`. The first request that authenticates
//! (a token, a client certificate, a dev identity) lifts the gate for the connection's life, so
//! a node proxy multiplexing many renewals is bounded by HTTP/2's 1,024 streams only.
//!
//! Without it, a peer with 64 connections × 1,024 streams of random tokens holds 65,536
//! requests' headers, decoded messages and tasks before podca has learnt that none of them is
//! anyone; with it, 64 × 16.
//!
//! A connection none of whose requests has authenticated within [`DEFAULT_PRE_AUTH_DEADLINE`]
//! of its accept is closed ([`crate::connections::Admitted`]): holding connections, or filling
//! them with junk tokens, buys a peer 30 s at a time.
//!
//! Connections are keyed by their remote address (IP and port, unique while the connection
//! lives); the listener's connection slot forgets the key when the connection ends. Unix-socket
//! requests (podca dev) carry no TCP address and pass.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

/// Requests one connection may have in flight before any of its requests has authenticated.
pub const MAX_STREAMS_BEFORE_AUTH: usize = 16;
/// How long a request beyond that waits for a turn before `RESOURCE_EXHAUSTED`.
pub const PRE_AUTH_WAIT: Duration = Duration::from_secs(5);
/// How long a TCP connection may stay open without any of its requests authenticating; then it
/// is closed (a peer that only holds connections, or only sends junk).
pub const DEFAULT_PRE_AUTH_DEADLINE: Duration = Duration::from_secs(30);

/// The gates of the listener's connections (see the module docs).
#[derive(Debug)]
pub struct PreAuth {
    /// A closed semaphore: the connection has authenticated (no limit).
    gates: Mutex<HashMap<SocketAddr, Arc<Semaphore>>>,
    /// [`DEFAULT_PRE_AUTH_DEADLINE`] unless set.
    deadline: Duration,
}

impl Default for PreAuth {
    fn default() -> Self {
        PreAuth {
            gates: Mutex::default(),
            deadline: DEFAULT_PRE_AUTH_DEADLINE,
        }
    }
}

/// A request that may not go on: the connection's pre-authentication turns stayed taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "this connection already has {MAX_STREAMS_BEFORE_AUTH} requests in flight and none has \
     authenticated yet; retry after one completes"
)]
pub struct NotYet;

impl PreAuth {
    pub fn new() -> Arc<Self> {
        Arc::new(PreAuth::default())
    }

    /// Gates whose connections are closed `deadline` after accept unless one of their requests
    /// authenticated by then.
    pub fn with_deadline(deadline: Duration) -> Arc<Self> {
        Arc::new(PreAuth {
            deadline,
            ..PreAuth::default()
        })
    }

    /// How long a connection may stay unauthenticated.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Whether a request on `conn` has authenticated.
    pub fn is_authenticated(&self, conn: SocketAddr) -> bool {
        self.lock().get(&conn).is_some_and(|gate| gate.is_closed())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Arc<Semaphore>>> {
        self.gates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn gate(&self, conn: SocketAddr) -> Arc<Semaphore> {
        Arc::clone(
            self.lock()
                .entry(conn)
                .or_insert_with(|| Arc::new(Semaphore::new(MAX_STREAMS_BEFORE_AUTH))),
        )
    }

    /// A turn for a request on `conn`: `None` once the connection has authenticated (no turn
    /// needed), else a permit to hold until the request is answered.
    pub async fn admit(&self, conn: SocketAddr) -> Result<Option<OwnedSemaphorePermit>, NotYet> {
        let gate = self.gate(conn);
        match tokio::time::timeout(PRE_AUTH_WAIT, gate.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            // Closed: authenticated.
            Ok(Err(_)) => Ok(None),
            Err(_) => Err(NotYet),
        }
    }

    /// A request on `conn` authenticated: the gate opens for the connection's life (waiting
    /// requests go on at once).
    pub fn authenticated(&self, conn: SocketAddr) {
        self.gate(conn).close();
    }

    /// `conn` is gone.
    pub fn closed(&self, conn: SocketAddr) {
        self.lock().remove(&conn);
    }

    /// Connections known now (tests and metrics).
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }
}

/// The remote TCP address of a request's connection, if it came over TCP (with or without TLS).
pub fn remote_of<B>(request: &http::Request<B>) -> Option<SocketAddr> {
    let extensions = request.extensions();
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|tls| tls.get_ref().remote_addr())
        .or_else(|| {
            extensions
                .get::<TcpConnectInfo>()
                .and_then(TcpConnectInfo::remote_addr)
        })
}

/// The tower layer that puts the gate in front of the routes (`Server::layer`).
#[derive(Debug, Clone)]
pub struct PreAuthLayer(pub Arc<PreAuth>);

impl<S> tower_layer::Layer<S> for PreAuthLayer {
    type Service = PreAuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PreAuthService {
            inner,
            gates: Arc::clone(&self.0),
        }
    }
}

/// See [`PreAuthLayer`].
#[derive(Debug, Clone)]
pub struct PreAuthService<S> {
    inner: S,
    gates: Arc<PreAuth>,
}

impl<S> Service<http::Request<Body>> for PreAuthService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone is the one that is not ready yet; the ready one serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gates = Arc::clone(&self.gates);
        Box::pin(async move {
            let _turn = match remote_of(&request) {
                Some(conn) => match gates.admit(conn).await {
                    Ok(turn) => turn,
                    Err(not_yet) => {
                        return Ok(
                            tonic::Status::resource_exhausted(not_yet.to_string()).into_http()
                        );
                    }
                },
                None => None,
            };
            inner.call(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_waits_beyond_its_turns_until_one_authenticates() {
        let gates = PreAuth::new();
        let mut turns = vec![];
        for _ in 0..MAX_STREAMS_BEFORE_AUTH {
            turns.push(gates.admit(addr(1)).await.unwrap().expect("a turn"));
        }
        // Another connection, even from the same address, has its own turns.
        assert!(gates.admit(addr(2)).await.unwrap().is_some());
        // The 17th waits, and after PRE_AUTH_WAIT is refused.
        assert_eq!(gates.admit(addr(1)).await.unwrap_err(), NotYet);
        // A turn given back lets one more in.
        turns.pop();
        turns.push(
            gates
                .admit(addr(1))
                .await
                .unwrap()
                .expect("the turn given back"),
        );
        // One waiting when a request authenticates goes on at once, and so do all later ones.
        let waiting = {
            let gates = Arc::clone(&gates);
            tokio::spawn(async move { gates.admit(addr(1)).await })
        };
        tokio::task::yield_now().await;
        gates.authenticated(addr(1));
        assert_eq!(waiting.await.unwrap().unwrap().map(|_| ()), None);
        for _ in 0..100 {
            assert!(gates.admit(addr(1)).await.unwrap().is_none());
        }
        // A closed connection is forgotten.
        assert_eq!(gates.tracked(), 2);
        gates.closed(addr(1));
        gates.closed(addr(2));
        assert_eq!(gates.tracked(), 0);
    }
}
