//! The admin listener: `/metrics`, `/livez`, `/readyz`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;

/// What `/readyz` answers: ready once every registered component says so (the controller's
/// watches have synced, the gRPC API listens, …); until then 503 naming the ones still waited
/// for. With nothing registered, nothing is ready.
#[derive(Debug, Default)]
pub struct Readiness {
    components: Mutex<BTreeMap<String, bool>>,
}

impl Readiness {
    pub fn new() -> Arc<Self> {
        Arc::new(Readiness::default())
    }

    /// Registers a component, not ready yet; its flag reports for it.
    pub fn component(self: &Arc<Self>, name: impl Into<String>) -> ReadyFlag {
        let name = name.into();
        self.lock().insert(name.clone(), false);
        ReadyFlag {
            readiness: Arc::clone(self),
            name,
        }
    }

    pub fn is_ready(&self) -> bool {
        let components = self.lock();
        !components.is_empty() && components.values().all(|ready| *ready)
    }

    /// The components that are not ready, by name.
    pub fn waiting_for(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, ready)| !**ready)
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, bool>> {
        // A panic while holding the lock leaves plain booleans behind: still usable.
        self.components
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One component's say in [`Readiness`].
#[derive(Debug, Clone)]
pub struct ReadyFlag {
    readiness: Arc<Readiness>,
    name: String,
}

impl ReadyFlag {
    pub fn set(&self, ready: bool) {
        self.readiness.lock().insert(self.name.clone(), ready);
    }
}

/// The admin listener could not listen.
#[derive(Debug, thiserror::Error)]
#[error("admin server on {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds the admin listener; serving starts with [`serve`].
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Serves until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Readiness>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let metrics = Arc::clone(&metrics);
        let health = Arc::clone(&health);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&req, &metrics, &health);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn respond(
    req: &Request<Incoming>,
    metrics: &Metrics,
    health: &Readiness,
) -> Response<Full<Bytes>> {
    let text = |code: StatusCode, body: String, content_type: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        r
    };
    if req.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET only\n".into(),
            "text/plain",
        );
    }
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            metrics.encode(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        "/livez" => text(StatusCode::OK, "ok\n".into(), "text/plain"),
        "/readyz" if health.is_ready() => text(StatusCode::OK, "ok\n".into(), "text/plain"),
        "/readyz" => {
            let waiting = health.waiting_for();
            let body = if waiting.is_empty() {
                "not ready: nothing has started\n".to_owned()
            } else {
                format!("not ready: waiting for {}\n", waiting.join(", "))
            };
            text(StatusCode::SERVICE_UNAVAILABLE, body, "text/plain")
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_component_is() {
        let readiness = Readiness::new();
        assert!(!readiness.is_ready(), "nothing registered is not ready");
        let watches = readiness.component("pcr watches");
        let grpc = readiness.component("grpc");
        assert_eq!(readiness.waiting_for(), ["grpc", "pcr watches"]);
        grpc.set(true);
        assert!(!readiness.is_ready());
        assert_eq!(readiness.waiting_for(), ["pcr watches"]);
        watches.set(true);
        assert!(readiness.is_ready());
        watches.set(false);
        assert!(!readiness.is_ready());
        assert_eq!(readiness.waiting_for(), ["pcr watches"]);
    }
}
