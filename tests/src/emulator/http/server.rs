//! The accept loop and one request's way through: parse, fault injection, authentication,
//! routing, and the error counters.

use super::authn::authenticate;
use super::routing::route;
use super::{RespBody, error_response};
use crate::emulator::auth::UserInfo;
use crate::emulator::errors::ApiError;
use crate::emulator::{Shared, lock};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

const MAX_BODY: usize = 16 * 1024 * 1024;

pub(crate) fn spawn_server(shared: Arc<Shared>, listener: tokio::net::TcpListener) {
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = shared.shutdown.notified() => break,
            };
            if lock(&shared.addr).is_none() {
                break;
            }
            let Ok((stream, _)) = accepted else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let s = shared.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let s = s.clone();
                    async move { Ok::<_, Infallible>(handle(s, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

/// One parsed request.
pub(super) struct Req {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) query: HashMap<String, String>,
    pub(super) content_type: String,
    /// The `Accept` header (`as=PartialObjectMetadata…` asks for metadata only).
    pub(super) accept: String,
    pub(super) user_agent: String,
    pub(super) body: Bytes,
    pub(super) user: Option<UserInfo>,
}

impl Req {
    /// Whether the client asked for `meta.k8s.io/v1` PartialObjectMetadata(List): kube-apiserver
    /// then answers with the objects' metadata only (and the client never sees spec or status).
    pub(super) fn metadata_only(&self) -> bool {
        self.accept.split(',').any(|media| {
            let params: Vec<&str> = media.split(';').map(str::trim).collect();
            params
                .iter()
                .any(|p| p.starts_with("as=PartialObjectMetadata"))
                && params.contains(&"g=meta.k8s.io")
                && params.contains(&"v=v1")
        })
    }

    pub(super) fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }
    pub(super) fn flag(&self, k: &str) -> bool {
        matches!(self.q(k), Some("true" | "1"))
    }
    pub(super) fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager").filter(|m| !m.is_empty()) {
            return m.to_string();
        }
        let ua = self.user_agent.split('/').next().unwrap_or("").trim();
        if ua.is_empty() {
            "unknown".to_string()
        } else {
            ua.chars().take(128).collect()
        }
    }
    pub(super) fn dry_run(&self) -> bool {
        self.q("dryRun") == Some("All")
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<RespBody> {
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if shared.outage.is_out_for(&authorization) {
        shared.count(|c| c.stalled_requests += 1);
    }
    shared.outage.stall_if_out(&authorization).await;
    shared.count(|c| c.requests += 1);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let header = |n: hyper::header::HeaderName| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let content_type = header(hyper::header::CONTENT_TYPE);
    let accept = header(hyper::header::ACCEPT);
    let user_agent = header(hyper::header::USER_AGENT);
    let authz = header(hyper::header::AUTHORIZATION);
    let imp_user = req
        .headers()
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let imp_groups: Vec<String> = req
        .headers()
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(String::from))
        .collect();
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));

    let (delay, fault) = shared.faults_for(method.as_str(), &path, is_watch);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let _seat = match shared.throttle.admit(method.as_str(), &path, is_watch) {
        Ok(seat) => seat,
        Err(retry_after) => {
            shared.count(|c| c.throttled_requests += 1);
            let mut response = error_response(&too_many_requests(retry_after));
            super::date::stamp(&mut response, shared.now());
            return response;
        }
    };

    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                "the request body is too large",
            ));
        }
    };

    // Authentication.
    let user = authenticate(&shared, &authz).map(|u| match (&imp_user, u.is_admin()) {
        (Some(name), true) => {
            let g: Vec<&str> = imp_groups.iter().map(String::as_str).collect();
            UserInfo::new(name, &g)
        }
        _ => u,
    });
    let r = Req {
        method,
        path,
        query,
        content_type,
        accept,
        user_agent,
        body,
        user,
    };

    let mut response = answer(&shared, &r, fault, &authorization).await;
    super::date::stamp(&mut response, shared.now());
    response
}

async fn answer(
    shared: &Arc<Shared>,
    r: &Req,
    fault: Option<u16>,
    authorization: &str,
) -> Response<RespBody> {
    if let Some(code) = fault {
        shared.count(|c| c.injected_faults += 1);
        return error_response(&injected(code, &r.path));
    }

    let is_watch = matches!(r.query.get("watch").map(String::as_str), Some("true" | "1"));
    match route(shared, r).await {
        Ok(resp) if is_watch => resp.map(|body| shared.outage.watch_body(body, authorization)),
        Ok(resp) => resp,
        Err(e) => {
            shared.count(|c| match e.code {
                422 => {
                    c.validation_rejections += 1;
                    let kind = e
                        .details
                        .as_ref()
                        .map(|d| d.kind.clone())
                        .unwrap_or_default();
                    for cause in e.details.iter().flat_map(|d| d.causes.iter()) {
                        *c.rejections_by_cause
                            .entry(format!(
                                "{kind} {} {}",
                                cause.field,
                                cause.kind.cause_reason()
                            ))
                            .or_default() += 1;
                    }
                }
                403 => c.forbidden += 1,
                409 => c.conflicts += 1,
                404 => c.not_found += 1,
                _ => c.other_errors += 1,
            });
            error_response(&e)
        }
    }
}

/// kube-apiserver's answer when priority and fairness has no room for a request.
fn too_many_requests(retry_after: u64) -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
    );
    e.retry_after = Some(retry_after);
    e
}

fn injected(code: u16, path: &str) -> ApiError {
    match code {
        409 => ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {path}: the object has been modified; please apply your changes to the latest version and try again"
            ),
        ),
        429 => {
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "too many requests, please try again later (injected)",
            );
            e.retry_after = Some(1);
            e
        }
        500 => ApiError::internal("Internal error occurred: injected fault"),
        503 => ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request (injected)",
        ),
        504 => ApiError::new(
            504,
            "Timeout",
            "the server was unable to return a response in the time allotted (injected)",
        ),
        c => ApiError::new(c, "", format!("injected fault {c}")),
    }
}
