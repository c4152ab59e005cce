//! Watch streams: initial events, resumption from a resourceVersion (or `410 Gone`),
//! bookmarks, timeouts, and the end of a stream on a kill or a lagging reader.

use super::read::selectors;
use super::routing::Target;
use super::server::Req;
use super::{RespBody, mode};
use crate::emulator::errors::ApiError;
use crate::emulator::resources::{self, Res};
use crate::emulator::store::{Event, Rendering, meta_str};
use crate::emulator::{Shared, lock};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::Response;
use hyper::body::{Body, Frame};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// A streaming body fed by a channel (watch responses). A line due later (the latency model's
/// watch event delay) is held until then, and the lines after it with it: order is kept.
struct ChannelBody {
    rx: mpsc::Receiver<Line>,
    held: Option<(Pin<Box<tokio::time::Sleep>>, Bytes)>,
}

/// One line of a watch stream, and when it may leave (`None`: at once).
struct Line {
    due: Option<tokio::time::Instant>,
    bytes: Bytes,
}

impl From<Bytes> for Line {
    fn from(bytes: Bytes) -> Line {
        Line { due: None, bytes }
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let me = self.get_mut();
        loop {
            if let Some((sleep, _)) = &mut me.held {
                ready!(sleep.as_mut().poll(cx));
                if let Some((_, bytes)) = me.held.take() {
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
            }
            match ready!(me.rx.poll_recv(cx)) {
                Some(Line {
                    due: Some(due),
                    bytes,
                }) if due > tokio::time::Instant::now() => {
                    me.held = Some((Box::pin(tokio::time::sleep_until(due)), bytes));
                }
                Some(line) => return Poll::Ready(Some(Ok(Frame::data(line.bytes)))),
                None => return Poll::Ready(None),
            }
        }
    }
}

/// One line of a watch stream, in kube-apiserver's order: `type` before `object` (Go's
/// `metav1.WatchEvent`; the recorded watch vector shows it). The order matters to clients:
/// serde's adjacently tagged enums (kube's `WatchEvent`) decode the object straight into its
/// type when the tag comes first, and buffer the whole object in a generic tree when it does
/// not, so a `{"object":…,"type":…}` line costs a client CPU a real server never does.
fn line(typ: &str, obj: &Value) -> Bytes {
    let mut v = Vec::with_capacity(1024);
    v.extend_from_slice(b"{\"type\":\"");
    v.extend_from_slice(typ.as_bytes());
    v.extend_from_slice(b"\",\"object\":");
    if serde_json::to_writer(&mut v, obj).is_err() {
        v.extend_from_slice(b"null");
    }
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

pub(super) fn watch(
    shared: &Arc<Shared>,
    r: &Req,
    t: &Target,
) -> Result<Response<RespBody>, ApiError> {
    let (fsel, lsel) = selectors(r, t.res)?;
    let version = t.version.clone();
    let res = t.res;
    let md = mode(shared);
    let ns = t.namespace.clone();
    let rv_param = r.q("resourceVersion").unwrap_or("").to_string();
    let send_initial = r.flag("sendInitialEvents");
    let bookmarks = r.flag("allowWatchBookmarks");
    let timeout = r
        .q("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let matches = move |e_res: Res, obj: &Value| {
        e_res == res
            && ns
                .as_deref()
                .is_none_or(|n| meta_str(obj, "namespace") == n)
            && fsel.matches(obj)
            && lsel.matches(obj)
    };
    let metadata_only = r.metadata_only();
    if metadata_only {
        shared.count(|c| c.metadata_only_requests += 1);
    }
    let render = move |obj: &Value| {
        if metadata_only {
            super::read::partial_metadata(obj)
        } else {
            resources::to_version(res, obj, &version, md)
        }
    };
    let rendering = Rendering {
        version: t.version.clone(),
        metadata_only,
    };
    let kind_av = (t.res.kind().to_string(), t.res.api_version(&t.version));

    let (tx, rx) = mpsc::channel::<Line>(1024);
    let resp = {
        let mut resp = Response::new(BoxBody::new(ChannelBody { rx, held: None }));
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        resp
    };
    let mut kill = shared.kill_watches.subscribe();
    kill.mark_unchanged();

    let st = lock(&shared.store);
    let mut initial: Vec<Arc<Value>> = Vec::new();
    let mut backlog: Vec<Arc<Event>> = Vec::new();
    let start_rv;
    if rv_param.is_empty() || rv_param == "0" || send_initial {
        initial = st
            .list(t.res, t.namespace.as_deref())
            .into_iter()
            .filter(|o| matches(res, o))
            .collect();
        start_rv = st.current_rv();
    } else {
        let Ok(rv) = rv_param.parse::<u64>() else {
            return Err(ApiError::bad_request(format!(
                "invalid resource version: {rv_param}"
            )));
        };
        match st.events_since(rv) {
            Some(evs) => backlog = evs,
            None => {
                let e = ApiError::expired(format!(
                    "too old resource version: {rv} ({})",
                    st.compacted_rv()
                ));
                let _ = tx.try_send(line("ERROR", &e.to_status()).into());
                return Ok(resp);
            }
        }
        start_rv = rv.max(backlog.last().map_or(rv, |e| e.rv));
    }
    let mut events = st.subscribe();
    drop(st);
    shared.count(|c| c.watches_opened += 1);
    let bookmark_every = shared.config.bookmark_interval;
    // The latency model's delay of a live event: from when the write was broadcast.
    let event_delay = shared.latency.as_ref().and_then(|l| l.watch_event);
    let shared_weak = Arc::downgrade(shared);

    tokio::spawn(async move {
        let mut last = start_rv;
        for o in &initial {
            if tx.send(line("ADDED", &render(o)).into()).await.is_err() {
                return;
            }
        }
        let bookmark = |rv: u64, initial_end: bool| {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if initial_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            line(
                "BOOKMARK",
                &json!({"kind": kind_av.0, "apiVersion": kind_av.1, "metadata": meta}),
            )
        };
        if send_initial && bookmarks && tx.send(bookmark(last, true).into()).await.is_err() {
            return;
        }
        let event_line =
            |e: &Event| e.line(&rendering, || line(e.typ.as_str(), &render(&e.object)));
        for e in &backlog {
            if matches(e.res, &e.object) && tx.send(event_line(e).into()).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval(bookmark_every.max(Duration::from_millis(10)));
        tick.tick().await;
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Ok(e) => {
                        if e.rv <= last {
                            continue;
                        }
                        last = e.rv;
                        if matches(e.res, &e.object)
                            && tx
                                .send(Line {
                                    due: event_delay.map(|d| tokio::time::Instant::now() + d),
                                    bytes: event_line(&e),
                                })
                                .await
                                .is_err()
                        {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = kill.changed() => return,
                () = tokio::time::sleep_until(deadline) => return,
                _ = tick.tick(), if bookmarks => {
                    if tx.send(bookmark(last, false).into()).await.is_err() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
            if shared_weak.strong_count() == 0 {
                return;
            }
        }
    });
    Ok(resp)
}
