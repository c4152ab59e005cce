//! Caps on the gRPC listener's TCP connections, applied at accept, before any TLS handshake or
//! authentication: so one peer cannot hold every file descriptor, handshake slot or HTTP/2
//! connection, nor turn podca into a TokenReview flood, and everyone else keeps being served.
//!
//! A connection over a cap is closed at once (the peer sees the TCP connection closed before
//! any TLS byte: no alert, no HTTP/2 GOAWAY). A slot is held from accept until the connection
//! is gone, handshake included.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use podca_authority::metrics::{GrpcMetrics, ReasonLabels};

use crate::preauth::PreAuth;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Connections from one IP address at once (handshakes included).
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 64;
/// Connections at once, from everyone.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// The caps (`[grpc] max_connections_per_peer`, `[grpc] max_connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub per_peer: usize,
    pub total: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            total: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Why a connection was closed at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{0} connections from this address are open (max_connections_per_peer)")]
    PerPeer(usize),
    #[error("{0} connections are open (max_connections)")]
    Total(usize),
}

impl Refused {
    /// The `reason` label of `podca_grpc_connections_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::PerPeer(_) => "per_peer",
            Refused::Total(_) => "total",
        }
    }
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// The connections open now, by peer address.
#[derive(Debug)]
pub struct ConnectionCounter {
    limits: ConnectionLimits,
    open: Mutex<Open>,
    metrics: GrpcMetrics,
    /// The listener's pre-authentication gates: a closed connection's is forgotten.
    pre_auth: Option<Arc<PreAuth>>,
}

impl ConnectionCounter {
    /// A counter that also keeps `podca_grpc_connections_open` and
    /// `podca_grpc_connections_refused_total` in `metrics`.
    pub fn new(limits: ConnectionLimits, metrics: GrpcMetrics) -> Arc<Self> {
        Arc::new(ConnectionCounter {
            limits,
            open: Mutex::new(Open::default()),
            metrics,
            pre_auth: None,
        })
    }

    /// [`ConnectionCounter::new`] whose slots also forget their connection's
    /// pre-authentication gate ([`crate::preauth`]) when it closes.
    pub fn with_pre_auth(
        limits: ConnectionLimits,
        metrics: GrpcMetrics,
        pre_auth: Arc<PreAuth>,
    ) -> Arc<Self> {
        Arc::new(ConnectionCounter {
            limits,
            open: Mutex::new(Open::default()),
            metrics,
            pre_auth: Some(pre_auth),
        })
    }

    /// [`ConnectionCounter::admit`] for the connection from `conn`.
    pub fn admit_connection(self: &Arc<Self>, conn: SocketAddr) -> Result<ConnectionSlot, Refused> {
        let mut slot = self.admit(conn.ip())?;
        slot.conn = Some(conn);
        Ok(slot)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // Plain counters: a panic elsewhere leaves them consistent.
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot for one more connection from `peer`, or why there is none.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<ConnectionSlot, Refused> {
        let admitted = self.try_admit(peer);
        if let Err(refused) = admitted {
            self.metrics
                .connections_refused
                .get_or_create(&ReasonLabels {
                    reason: refused.reason(),
                })
                .inc();
        }
        admitted
    }

    fn try_admit(self: &Arc<Self>, peer: IpAddr) -> Result<ConnectionSlot, Refused> {
        let mut open = self.lock();
        if open.total >= self.limits.total {
            return Err(Refused::Total(open.total));
        }
        let from_peer = open.by_peer.entry(peer).or_insert(0);
        if *from_peer >= self.limits.per_peer {
            return Err(Refused::PerPeer(*from_peer));
        }
        *from_peer += 1;
        open.total += 1;
        self.metrics.connections_open.set(gauge_value(open.total));
        Ok(ConnectionSlot {
            counter: Arc::clone(self),
            peer,
            conn: None,
        })
    }

    /// The metrics this counter keeps (the listener counts its TLS handshake failures there too).
    pub fn metrics(&self) -> &GrpcMetrics {
        &self.metrics
    }

    /// Connections open now (all peers).
    pub fn open(&self) -> usize {
        self.lock().total
    }

    fn release(&self, peer: IpAddr) {
        let mut open = self.lock();
        open.total = open.total.saturating_sub(1);
        self.metrics.connections_open.set(gauge_value(open.total));
        if let Some(n) = open.by_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                open.by_peer.remove(&peer);
            }
        }
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One admitted connection; dropping it frees the slot.
#[derive(Debug)]
pub struct ConnectionSlot {
    counter: Arc<ConnectionCounter>,
    peer: IpAddr,
    /// The connection's full remote address, when known ([`ConnectionCounter::admit_connection`]).
    conn: Option<SocketAddr>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.counter.release(self.peer);
        if let (Some(gates), Some(conn)) = (&self.counter.pre_auth, self.conn) {
            gates.closed(conn);
        }
    }
}

/// A connection that holds its slot for as long as it lives; otherwise the stream it wraps
/// (tonic's connect info included, so the peer address and TLS certificates are unchanged).
/// With the listener's pre-authentication gates ([`crate::preauth`]), reading fails with
/// `TimedOut` (and the connection closes) once their deadline has passed since accept while no
/// request of the connection has authenticated.
#[derive(Debug)]
pub struct Admitted<S> {
    stream: S,
    _slot: ConnectionSlot,
    unauthenticated: Option<Unauthenticated>,
}

/// The deadline of a connection that has not authenticated yet.
#[derive(Debug)]
struct Unauthenticated {
    gates: Arc<PreAuth>,
    conn: SocketAddr,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl<S> Admitted<S> {
    pub fn new(stream: S, slot: ConnectionSlot) -> Self {
        let unauthenticated = match (&slot.counter.pre_auth, slot.conn) {
            (Some(gates), Some(conn)) => Some(Unauthenticated {
                gates: Arc::clone(gates),
                conn,
                deadline: Box::pin(tokio::time::sleep(gates.deadline())),
            }),
            _ => None,
        };
        Admitted {
            stream,
            _slot: slot,
            unauthenticated,
        }
    }
}

impl<S: Connected> Connected for Admitted<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Admitted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(pending) = &mut self.unauthenticated
            && pending.deadline.as_mut().poll(cx).is_ready()
        {
            if !pending.gates.is_authenticated(pending.conn) {
                tracing::debug!(peer = %pending.conn, "gRPC: connection closed: nothing authenticated on it in time");
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no request on this connection authenticated in time",
                )));
            }
            self.unauthenticated = None;
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Admitted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn caps_per_peer_and_in_total_and_slots_come_back() {
        let metrics = GrpcMetrics::default();
        let counter = ConnectionCounter::new(
            ConnectionLimits {
                per_peer: 2,
                total: 3,
            },
            metrics.clone(),
        );
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let a1 = counter.admit(a).unwrap();
        let _a2 = counter.admit(a).unwrap();
        assert_eq!(counter.admit(a).unwrap_err(), Refused::PerPeer(2));
        let _b1 = counter.admit(b).unwrap();
        assert_eq!(counter.admit(c).unwrap_err(), Refused::Total(3));
        assert_eq!(counter.open(), 3);
        drop(a1);
        assert_eq!(counter.open(), 2);
        let _c1 = counter.admit(c).unwrap();
        assert_eq!(counter.admit(a).unwrap_err(), Refused::Total(3));

        // The gauge follows the slots; each refusal is counted under its reason.
        assert_eq!(metrics.connections_open.get(), 3);
        let refused = |reason| {
            metrics
                .connections_refused
                .get_or_create(&ReasonLabels { reason })
                .get()
        };
        assert_eq!((refused("per_peer"), refused("total")), (1, 2));
    }
}
