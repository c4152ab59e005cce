//! An API outage as the nasty case looks from a client: a black hole. Connections are still
//! accepted (the load balancer in front of kube-apiserver answers the TCP handshake), but no
//! request is answered while it lasts, and every watch stream open when the outage began falls
//! silent for good (the server behind it is gone, so no event, bookmark or end of stream
//! follows). When it ends, requests held meanwhile are served (a healed partition delivers them)
//! and new ones as usual; a client notices the dead streams only by its own timeouts, and a
//! client without them waits on them forever. Tests toggle it with `Emulator::set_outage` while clients run.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::watch;

use super::RespBody;

/// Whether the API is out, and how many outages have begun.
#[derive(Debug)]
pub(crate) struct Outage {
    state: watch::Sender<(bool, u64)>,
}

impl Default for Outage {
    fn default() -> Self {
        Outage {
            state: watch::Sender::new((false, 0)),
        }
    }
}

impl Outage {
    /// Begins (`true`) or ends (`false`) an outage.
    pub(crate) fn set(&self, out: bool) {
        self.state.send_if_modified(|(on, begun)| {
            if *on == out {
                return false;
            }
            *on = out;
            if out {
                *begun += 1;
            }
            true
        });
    }

    pub(crate) fn is_out(&self) -> bool {
        self.state.borrow().0
    }

    /// Returns once no outage lasts. A request caught in one is answered only after it, as the
    /// network delivers it when a partition heals — if the client has not given up by then.
    pub(crate) async fn stall_if_out(&self) {
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|(out, _)| !out).await;
    }

    /// A watch stream's body that falls silent for good once an outage begins.
    pub(crate) fn watch_body(&self, inner: RespBody) -> RespBody {
        let opened_after = self.state.borrow().1;
        http_body_util::BodyExt::boxed(Silenced {
            inner,
            state: self.state.subscribe(),
            opened_after,
        })
    }
}

struct Silenced {
    inner: RespBody,
    state: watch::Receiver<(bool, u64)>,
    opened_after: u64,
}

impl Body for Silenced {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let me = self.get_mut();
        let (_, begun) = *me.state.borrow();
        if begun != me.opened_after {
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
