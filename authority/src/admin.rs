//! The admin listener: `/metrics`, `/livez`, `/readyz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;

/// Health flags shared with the controller.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
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
    health: Arc<Health>,
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

fn respond(req: &Request<Incoming>, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
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
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready\n".into(),
            "text/plain",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
    }
}
