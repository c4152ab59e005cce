//! An API outage as the nasty case looks from a client: a black hole. Connections are still
//! accepted (the load balancer in front of kube-apiserver answers the TCP handshake), but no
//! request is answered while it lasts, and every watch stream open when the outage began falls
//! silent for good (the server behind it is gone, so no event, bookmark or end of stream
//! follows). When it ends, requests held meanwhile are served (a healed partition delivers them)
//! and new ones as usual; a client notices the dead streams only by its own timeouts, and a
//! client without them waits on them forever. Tests toggle it with `Emulator::set_outage` while clients run,
//! or for one client's bearer token with `Emulator::partition` (a network partition between
//! that client and the API).

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::watch;

use super::RespBody;

/// Whether the API is out (for everyone, or for the clients of some bearer tokens), and how
/// many outages have begun.
#[derive(Debug)]
pub(crate) struct Outage {
    state: watch::Sender<State>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct State {
    out: bool,
    begun: u64,
    /// `Authorization` header values cut off now (a partition between one client and the API).
    cut: HashSet<String>,
    /// How many partitions each header value has been through.
    cuts: HashMap<String, u64>,
}

impl Default for Outage {
    fn default() -> Self {
        Outage {
            state: watch::Sender::new(State::default()),
        }
    }
}

impl Outage {
    /// Begins (`true`) or ends (`false`) an outage.
    pub(crate) fn set(&self, out: bool) {
        self.state.send_if_modified(|s| {
            if s.out == out {
                return false;
            }
            s.out = out;
            if out {
                s.begun += 1;
            }
            true
        });
    }

    /// Cuts off (`true`) or reconnects (`false`) the clients that send `authorization`: for
    /// them alone it is an outage.
    pub(crate) fn set_cut(&self, authorization: &str, cut: bool) {
        self.state.send_if_modified(|s| {
            if s.cut.contains(authorization) == cut {
                return false;
            }
            if cut {
                s.cut.insert(authorization.to_owned());
                *s.cuts.entry(authorization.to_owned()).or_default() += 1;
            } else {
                s.cut.remove(authorization);
            }
            true
        });
    }

    /// Whether a request with this `Authorization` header finds the API out.
    pub(crate) fn is_out_for(&self, authorization: &str) -> bool {
        let s = self.state.borrow();
        s.out || s.cut.contains(authorization)
    }

    /// Returns once no outage lasts for a client sending `authorization`. A request caught in
    /// one is answered only after it, as the network delivers it when a partition heals — if
    /// the client has not given up by then.
    pub(crate) async fn stall_if_out(&self, authorization: &str) {
        let mut state = self.state.subscribe();
        let _ = state
            .wait_for(|s| !s.out && !s.cut.contains(authorization))
            .await;
    }

    /// A watch stream's body that falls silent for good once an outage begins, for everyone or
    /// for the client sending `authorization`.
    pub(crate) fn watch_body(&self, inner: RespBody, authorization: &str) -> RespBody {
        let opened_after = generation(&self.state.borrow(), authorization);
        http_body_util::BodyExt::boxed(Silenced {
            inner,
            state: self.state.subscribe(),
            authorization: authorization.to_owned(),
            opened_after,
        })
    }
}

/// The outages a client sending `authorization` has been through: everyone's, and its own.
fn generation(s: &State, authorization: &str) -> (u64, u64) {
    (s.begun, s.cuts.get(authorization).copied().unwrap_or(0))
}

struct Silenced {
    inner: RespBody,
    state: watch::Receiver<State>,
    authorization: String,
    opened_after: (u64, u64),
}

impl Body for Silenced {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let me = self.get_mut();
        if generation(&me.state.borrow(), &me.authorization) != me.opened_after {
            // Dead: never woken again, as a connection whose far end vanished.
            return Poll::Pending;
        }
        Pin::new(&mut me.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// API priority and fairness as a client meets it when its priority level is full: at most
/// `seats` requests of a scope inside the server at once (served or waiting in the latency
/// model's queue); one more is refused at once with 429 and `Retry-After`, as kube-apiserver
/// refuses a request its queues have no room for. It also tracks how many PCR `/status` writes
/// are inside the server at once, and the most ever, so tests can see a client's concurrency
/// with or without a limit set. Tests set it with `Emulator::throttle`.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: std::sync::Mutex<ThrottleState>,
}

#[derive(Debug, Default)]
struct ThrottleState {
    limit: Option<ThrottleLimit>,
    /// Requests in the limit's scope inside the server now.
    seated: usize,
    status_writes: u64,
    status_writes_max: u64,
}

/// The limit of a [`Throttle`].
#[derive(Debug, Clone)]
pub(crate) struct ThrottleLimit {
    pub(crate) seats: usize,
    /// Seconds, in the `Retry-After` header and the Status's `details.retryAfterSeconds`.
    pub(crate) retry_after: u64,
    pub(crate) scope: crate::emulator::FaultScope,
}

/// A request admitted by [`Throttle::admit`]; its seat is free again when this drops.
#[derive(Debug)]
pub(crate) struct Seat<'a> {
    throttle: &'a Throttle,
    seated: bool,
    status_write: bool,
}

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, ThrottleState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets (or with `None` lifts) the limit.
    pub(crate) fn set(&self, limit: Option<ThrottleLimit>) {
        self.lock().limit = limit;
    }

    /// The most PCR `/status` writes ever inside the server at once.
    pub(crate) fn status_writes_max(&self) -> u64 {
        self.lock().status_writes_max
    }

    /// Admits a request, or refuses it with the `Retry-After` seconds to answer.
    pub(crate) fn admit(&self, method: &str, path: &str, is_watch: bool) -> Result<Seat<'_>, u64> {
        let mut s = self.lock();
        let seated = match &s.limit {
            Some(limit) if limit.scope.matches(method, path, is_watch) => {
                if s.seated >= limit.seats {
                    return Err(limit.retry_after);
                }
                true
            }
            _ => false,
        };
        if seated {
            s.seated += 1;
        }
        let status_write = matches!(method, "PUT" | "PATCH")
            && path.contains("/podcertificaterequests/")
            && path.ends_with("/status");
        if status_write {
            s.status_writes += 1;
            s.status_writes_max = s.status_writes_max.max(s.status_writes);
        }
        Ok(Seat {
            throttle: self,
            seated,
            status_write,
        })
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let mut s = self.throttle.lock();
        if self.seated {
            s.seated = s.seated.saturating_sub(1);
        }
        if self.status_write {
            s.status_writes = s.status_writes.saturating_sub(1);
        }
    }
}
