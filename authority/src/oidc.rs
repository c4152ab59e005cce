//! OIDC discovery for JWT-SVID relying parties (AWS IAM OIDC providers, Vault's JWT auth,
//! anything that reads `/.well-known/openid-configuration`):
//!
//! * `GET /.well-known/openid-configuration`: `issuer`, `jwks_uri`,
//!   `id_token_signing_alg_values_supported`, `response_types_supported` (`id_token`),
//!   `subject_types_supported` (`public`);
//! * `GET /keys`: the JWKS, every published key (prepared, active, retired), with `use: sig`
//!   where the SPIFFE bundle says `jwt-svid` (OIDC consumers know only `sig`).
//!
//! Both answer `Cache-Control: public, max-age=<N>` with N a third of the propagation window, so
//! a cached JWKS always learns a prepared key before it signs.
//!
//! Its own listener (`[jwt] oidc_listen`), HTTP/1.1, over TLS when a rustls config is given (in
//! `podca serve`, the gRPC listener's); `podca dev` serves it in plaintext on loopback, as it
//! serves its gRPC API. Limits as the admin listener's: a request head within 10 s, 64
//! connections at most.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use podca_signer::jwt::{JwtAlgorithm, JwtKeySet};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::jwt::JwtHandle;

/// The path of the JWKS.
pub const JWKS_PATH: &str = "/keys";
/// The discovery document's path.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";

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
        let mut bundle = keys.bundle(None);
        for key in &mut bundle.keys {
            key.key_use = Some("sig".into());
        }
        bundle.spiffe_sequence = None;
        String::from_utf8(bundle.to_json()).unwrap_or_default()
    }

    /// The answer to one request.
    pub fn respond(&self, method: &Method, path: &str, keys: &JwtKeySet) -> Response<Full<Bytes>> {
        let answer = |code: StatusCode, body: String, content_type: &'static str| {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = code;
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(content_type),
            );
            r
        };
        if method != Method::GET && method != Method::HEAD {
            return answer(
                StatusCode::METHOD_NOT_ALLOWED,
                "GET only\n".into(),
                "text/plain",
            );
        }
        let mut response = match path {
            DISCOVERY_PATH => answer(StatusCode::OK, self.document(), "application/json"),
            JWKS_PATH => answer(StatusCode::OK, self.jwks(keys), "application/jwk-set+json"),
            _ => return answer(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
        };
        if let Ok(value) =
            http::HeaderValue::from_str(&format!("public, max-age={}", self.max_age.as_secs()))
        {
            response
                .headers_mut()
                .insert(http::header::CACHE_CONTROL, value);
        }
        response
    }
}

/// Serves discovery on `listener` until `stop` turns true; over TLS with `tls`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    discovery: Discovery,
    keys: JwtHandle,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(64));
    let discovery = Arc::new(discovery);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
        };
        let Ok((stream, _peer)) = accepted else {
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        let discovery = Arc::clone(&discovery);
        let keys = keys.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req: Request<Incoming>| {
                let response = discovery.respond(req.method(), req.uri().path(), &keys.current());
                async move { Ok::<_, Infallible>(response) }
            });
            let builder = {
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10));
                b
            };
            match acceptor {
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
                    if let Ok(Ok(tls)) = handshake.await {
                        let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                    }
                }
                None => {
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discovery() -> Discovery {
        Discovery {
            issuer: "https://podca.example".into(),
            max_age: Duration::from_secs(300),
            algorithm: JwtAlgorithm::ES256,
        }
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
    fn answers_are_cacheable_and_only_get() {
        let keys = JwtKeySet::default();
        let r = discovery().respond(&Method::GET, DISCOVERY_PATH, &keys);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[http::header::CACHE_CONTROL],
            "public, max-age=300"
        );
        let r = discovery().respond(&Method::GET, JWKS_PATH, &keys);
        assert_eq!(
            r.headers()[http::header::CONTENT_TYPE],
            "application/jwk-set+json"
        );
        assert_eq!(
            r.headers()[http::header::CACHE_CONTROL],
            "public, max-age=300"
        );
        let r = discovery().respond(&Method::POST, JWKS_PATH, &keys);
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        let r = discovery().respond(&Method::GET, "/other", &keys);
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(!r.headers().contains_key(http::header::CACHE_CONTROL));
    }
}
