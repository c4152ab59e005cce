//! OIDC discovery for JWT-SVID relying parties (AWS IAM OIDC providers, Vault's JWT auth,
//! anything that reads `/.well-known/openid-configuration`):
//!
//! * `GET /.well-known/openid-configuration`: `issuer`, `jwks_uri`,
//!   `id_token_signing_alg_values_supported`, `response_types_supported` (`id_token`),
//!   `subject_types_supported` (`public`);
//! * `GET /keys`: the JWKS, every published key (prepared, active, retired), with `use: sig`
//!   where the SPIFFE bundle says `jwt-svid` (OIDC consumers know only `sig`).
//!
//! Both answer `Cache-Control: public, max-age=<N>` with N the bundle refresh hint (a third of
//! the propagation window), so a cached JWKS always learns a prepared key before it signs.
//!
//! Its own listener (`[jwt] oidc_listen`), HTTP/1.1 only, over TLS when a rustls configuration
//! is given: in `podca serve` the gRPC listener's serving certificate, through the same
//! resolver, so it is renewed and reloaded with it (`podca_grpc::tls::http1_server_config`);
//! `podca dev` serves it in plaintext on loopback, as it serves its gRPC API.
//!
//! What it answers ([`Discovery::respond`]):
//!
//! | request | status |
//! |---|---|
//! | `GET`/`HEAD` of the two paths | 200 (`HEAD`: the headers only) |
//! | any other path | 404 `not found` |
//! | any other method | 405 `GET or HEAD only`, with `Allow: GET, HEAD` |
//! | a request with a body (`Content-Length` > 0 or `Transfer-Encoding`) | 413 |
//! | a request head over 16 KiB | 431 (hyper), connection closed |
//!
//! Its limits ([`OidcLimits`]): at most 64 connections at once, 16 of them from one source
//! address (more are closed at accept; no reserve as on the admin listener: nothing probes
//! this one, and relying parties cache its answers for `max-age`), a TLS handshake within
//! 10 s, a whole request head within 10 s (also the longest a kept-alive connection waits for
//! its next request), and a connection is closed after 30 s without a byte either way.
//! Requests are counted in `podca_oidc_requests_total{path,status}`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use podca_signer::jwt::{JwtAlgorithm, JwtKeySet};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::debug;

use crate::admin::IdleTimeout;
use crate::jwt::JwtHandle;
use crate::metrics::{OidcMetrics, OidcRequestLabels};

/// The path of the JWKS.
pub const JWKS_PATH: &str = "/keys";
/// The discovery document's path.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// The largest request head read (hyper answers 431 past it).
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;

/// What the discovery endpoint publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// The issuer, exactly as tokens carry it in `iss`.
    pub issuer: String,
    /// `Cache-Control: max-age`.
    pub max_age: Duration,
    /// The signing algorithm of the keys.
    pub algorithm: JwtAlgorithm,
}

impl Discovery {
    /// The discovery document.
    pub fn document(&self) -> String {
        serde_json::json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}{JWKS_PATH}", self.issuer),
            "id_token_signing_alg_values_supported": [self.algorithm.name()],
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "claims_supported": ["sub", "aud", "exp", "iat", "iss"],
        })
        .to_string()
    }

    /// The JWKS for OIDC consumers: the SPIFFE bundle's keys with `use: sig` (AWS and Vault
    /// expect `sig` or nothing; `jwt-svid` is SPIFFE's own).
    pub fn jwks(&self, keys: &JwtKeySet) -> String {
        jwks(keys)
    }

    /// The answer to one request (see the module docs' table), and the `path` label it is
    /// counted under.
    pub fn respond(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        keys: &JwtKeySet,
    ) -> (&'static str, Response<Full<Bytes>>) {
        let label = match path {
            DISCOVERY_PATH => "discovery",
            JWKS_PATH => "jwks",
            _ => "other",
        };
        let text = |code: StatusCode, body: &'static str| {
            answer(code, body.to_owned(), "text/plain; charset=utf-8")
        };
        if method != Method::GET && method != Method::HEAD {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only\n");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return (label, r);
        }
        if has_body(headers) {
            let r = text(
                StatusCode::PAYLOAD_TOO_LARGE,
                "a request body is not accepted\n",
            );
            return (label, r);
        }
        let mut response = match path {
            DISCOVERY_PATH => answer(StatusCode::OK, self.document(), "application/json"),
            JWKS_PATH => answer(StatusCode::OK, self.jwks(keys), "application/jwk-set+json"),
            _ => return (label, text(StatusCode::NOT_FOUND, "not found\n")),
        };
        if let Ok(value) =
            HeaderValue::from_str(&format!("public, max-age={}", self.max_age.as_secs()))
        {
            response.headers_mut().insert(header::CACHE_CONTROL, value);
        }
        (label, response)
    }
}

/// The JWKS for OIDC consumers (see [`Discovery::jwks`]); also what the JWKS ConfigMap holds.
pub fn jwks(keys: &JwtKeySet) -> String {
    let mut bundle = keys.bundle(None);
    for key in &mut bundle.keys {
        key.key_use = Some("sig".into());
    }
    bundle.spiffe_sequence = None;
    String::from_utf8(bundle.to_json()).unwrap_or_default()
}

fn answer(code: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Whether the request announces a body: `Transfer-Encoding`, or a `Content-Length` other than
/// 0 (an unparsable one included).
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) != Some(0))
}

/// The listener's limits (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OidcLimits {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for OidcLimits {
    /// 64 connections, 10 s for a handshake and for a request head, 30 s without traffic:
    /// relying parties fetch two small documents now and then, and cache them.
    fn default() -> Self {
        OidcLimits {
            max_connections: 64,
            max_connections_per_peer: 16,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves discovery on `listener` until `stop` turns true; over TLS with `tls`. Default limits,
/// metrics counted into nothing (`podca dev`).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    discovery: Discovery,
    keys: JwtHandle,
    stop: watch::Receiver<bool>,
) {
    serve_with(
        listener,
        tls,
        discovery,
        keys,
        OidcMetrics::default(),
        OidcLimits::default(),
        stop,
    )
    .await;
}

/// [`serve`] within `limits`, counting into `metrics`.
pub async fn serve_with(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    discovery: Discovery,
    keys: JwtHandle,
    metrics: OidcMetrics,
    limits: OidcLimits,
    mut stop: watch::Receiver<bool>,
) {
    let slots = crate::slots::Slots::new(limits.max_connections, limits.max_connections_per_peer);
    let discovery = Arc::new(discovery);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                debug!(error = %e, "OIDC: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match slots.try_acquire(peer.ip()) {
            Ok(slot) => slot,
            Err(full) => {
                debug!(%peer, ?full, "OIDC: connection closed at accept (no slot)");
                metrics.connections_refused.inc();
                drop(stream);
                continue;
            }
        };
        let discovery = Arc::clone(&discovery);
        let keys = keys.clone();
        let acceptor = acceptor.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let failures = metrics.tls_handshake_failures.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let (path, response) = discovery.respond(
                    req.method(),
                    req.uri().path(),
                    req.headers(),
                    &keys.current(),
                );
                metrics
                    .requests
                    .get_or_create(&OidcRequestLabels {
                        path,
                        status: response.status().as_u16(),
                    })
                    .inc();
                async move { Ok::<_, Infallible>(response) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(MAX_REQUEST_HEAD);
            let io = IdleTimeout::new(stream, limits.idle_timeout);
            match acceptor {
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(limits.handshake_timeout, acceptor.accept(io));
                    match handshake.await {
                        Ok(Ok(tls)) => {
                            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                        }
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "OIDC: TLS handshake failed");
                            failures.inc();
                        }
                        Err(_) => {
                            debug!(%peer, "OIDC: TLS handshake timed out");
                            failures.inc();
                        }
                    }
                }
                None => {
                    let _ = builder.serve_connection(TokioIo::new(io), service).await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    fn discovery() -> Discovery {
        Discovery {
            issuer: "https://podca.example".into(),
            max_age: Duration::from_secs(300),
            algorithm: JwtAlgorithm::ES256,
        }
    }

    fn respond(method: Method, path: &str, headers: &[(&str, &str)]) -> Response<Full<Bytes>> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        discovery()
            .respond(&method, path, &map, &JwtKeySet::default())
            .1
    }

    #[test]
    fn the_document_names_the_issuer_and_its_jwks() {
        let doc: serde_json::Value = serde_json::from_str(&discovery().document()).expect("json");
        assert_eq!(doc["issuer"], "https://podca.example");
        assert_eq!(doc["jwks_uri"], "https://podca.example/keys");
        assert_eq!(doc["id_token_signing_alg_values_supported"][0], "ES256");
        assert_eq!(doc["response_types_supported"][0], "id_token");
        assert_eq!(doc["subject_types_supported"][0], "public");
    }

    #[test]
    fn answers_are_cacheable_get_or_head_only_and_bodiless() {
        let r = respond(Method::GET, DISCOVERY_PATH, &[]);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CACHE_CONTROL], "public, max-age=300");
        let r = respond(Method::HEAD, JWKS_PATH, &[]);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "application/jwk-set+json"
        );
        assert_eq!(r.headers()[header::CACHE_CONTROL], "public, max-age=300");
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
            let r = respond(method.clone(), JWKS_PATH, &[]);
            assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED, "{method}");
            assert_eq!(r.headers()[header::ALLOW], "GET, HEAD");
            assert!(!r.headers().contains_key(header::CACHE_CONTROL));
        }
        let r = respond(Method::GET, "/other", &[]);
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(!r.headers().contains_key(header::CACHE_CONTROL));
        // A trailing slash or another case is another path.
        for path in ["/keys/", "/.well-known/openid-configuration/", "/KEYS"] {
            assert_eq!(
                respond(Method::GET, path, &[]).status(),
                StatusCode::NOT_FOUND
            );
        }
        for headers in [
            &[("content-length", "5")][..],
            &[("content-length", "x")][..],
            &[("transfer-encoding", "chunked")][..],
        ] {
            let r = respond(Method::GET, JWKS_PATH, headers);
            assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE, "{headers:?}");
        }
        assert_eq!(
            respond(Method::GET, JWKS_PATH, &[("content-length", "0")]).status(),
            StatusCode::OK
        );
    }

    #[test]
    fn the_jwks_says_sig_and_carries_no_spiffe_sequence() {
        let keys = JwtKeySet::default();
        let jwks: serde_json::Value = serde_json::from_str(&discovery().jwks(&keys)).unwrap();
        assert!(jwks["keys"].as_array().unwrap().is_empty(), "{jwks}");
        assert!(jwks.get("spiffe_sequence").is_none(), "{jwks}");
    }

    fn limits() -> OidcLimits {
        OidcLimits {
            max_connections: 2,
            max_connections_per_peer: 2,
            handshake_timeout: Duration::from_millis(500),
            header_read_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_millis(800),
        }
    }

    async fn server(
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> (std::net::SocketAddr, OidcMetrics, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let metrics = OidcMetrics::default();
        tokio::spawn(serve_with(
            listener,
            tls,
            discovery(),
            JwtHandle::new(JwtKeySet::default()),
            metrics.clone(),
            limits(),
            stopped,
        ));
        (addr, metrics, stop)
    }

    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        // A connection closed unread may end in a reset rather than an EOF: what came is kept.
        let read = async {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = tcp.read(&mut buf).await {
                answer.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the server closes");
        String::from_utf8_lossy(&answer).into_owned()
    }

    fn count(metrics: &OidcMetrics, path: &'static str, status: u16) -> u64 {
        metrics
            .requests
            .get_or_create(&OidcRequestLabels { path, status })
            .get()
    }

    #[tokio::test]
    async fn statuses_over_the_wire_are_counted_by_path() {
        let (addr, metrics, _stop) = server(None).await;
        let close = "Host: x\r\nConnection: close\r\n\r\n";
        let head = exchange(addr, format!("HEAD /keys HTTP/1.1\r\n{close}").as_bytes()).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.ends_with("\r\n\r\n"),
            "HEAD answered with a body: {head}"
        );
        let post = exchange(
            addr,
            format!("POST /keys HTTP/1.1\r\nContent-Length: 0\r\n{close}").as_bytes(),
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        assert!(
            post.to_ascii_lowercase().contains("allow: get, head"),
            "{post}"
        );
        let missing = exchange(addr, format!("GET /admin HTTP/1.1\r\n{close}").as_bytes()).await;
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
        let body = exchange(
            addr,
            format!("GET /keys HTTP/1.1\r\nContent-Length: 3\r\n{close}abc").as_bytes(),
        )
        .await;
        assert!(body.starts_with("HTTP/1.1 413 "), "{body}");
        let huge = format!(
            "GET /keys HTTP/1.1\r\nX-Pad: {}\r\n{close}",
            "a".repeat(MAX_REQUEST_HEAD * 2)
        );
        let huge = exchange(addr, huge.as_bytes()).await;
        assert!(huge.starts_with("HTTP/1.1 431 "), "{huge}");
        assert_eq!(count(&metrics, "jwks", 200), 1);
        assert_eq!(count(&metrics, "jwks", 405), 1);
        assert_eq!(count(&metrics, "other", 404), 1);
        assert_eq!(count(&metrics, "jwks", 413), 1);
    }

    #[tokio::test]
    async fn a_slowloris_is_closed_and_connections_over_the_cap_at_accept() {
        let (addr, metrics, _stop) = server(None).await;
        let started = tokio::time::Instant::now();
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /keys HTTP/1.1\r\n").await.unwrap();
        // A byte every 100 ms: never idle, but the head never completes.
        let trickle = async {
            loop {
                if slow.write_all(b"X").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(3), trickle).await;
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(2),
            "the slow head must be cut at the header timeout ({elapsed:?})"
        );
        // Two kept-alive connections, answered (so accepted), fill the cap; a third is closed
        // at once, unanswered.
        let mut held = Vec::new();
        for _ in 0..2 {
            let request = b"GET /keys HTTP/1.1\r\nHost: x\r\n\r\n";
            held.push(crate::test_support::answered(addr, request).await);
        }
        let refused = exchange(addr, b"GET /keys HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(refused, "");
        assert_eq!(metrics.connections_refused.get(), 1);
        // The idle ones are closed by the timeouts, and the slots come back.
        for tcp in &mut held {
            let mut rest = Vec::new();
            tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut rest))
                .await
                .expect("closed at the idle timeout")
                .ok();
        }
        // The server frees a slot just after the close we saw: the next attempts get one.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let ok = exchange(
                addr,
                b"GET /keys HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            .await;
            if ok.starts_with("HTTP/1.1 200 ") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no slot came back: {ok:?}"
            );
        }
    }

    #[tokio::test]
    async fn over_tls_a_plaintext_request_gets_nothing_and_a_stalled_handshake_is_cut() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["podca.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let (addr, metrics, _stop) = server(Some(Arc::new(config))).await;
        let plain = exchange(addr, b"GET /keys HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(!plain.contains("HTTP/1.1 200"), "{plain}");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut tls = connector
            .connect("podca.test".try_into().unwrap(), tcp)
            .await
            .unwrap();
        tls.write_all(b"GET /.well-known/openid-configuration HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tls.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert!(
            answer.contains("\"issuer\":\"https://podca.example\""),
            "{answer}"
        );
        // A peer that opens and says nothing: cut at the handshake timeout.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(3), silent.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        assert_eq!(metrics.tls_handshake_failures.get(), 2);
    }
}
