//! The HTTP layer of the emulator: one module per subject.
//!
//! * [`server`]: the accept loop, request parsing, faults, counters.
//! * [`routing`]: paths to resources, verbs, authorization, dispatch.
//! * [`discovery`]: `/version`, `/api`, `/apis` and the resource lists.
//! * [`read`] and [`watch`]: get, list (selectors, pagination) and watch streams.
//! * [`create`], [`update`] and [`delete`]: the generic write paths.
//! * [`podcertificaterequests`] and [`clustertrustbundles`]: their admission and strategies.
//! * [`authn`]: bearer tokens and the TokenReview endpoint.
//! * [`token_request`]: the TokenRequest endpoint, minting service-account tokens.
//! * [`selfsubjectaccessreview`]: SelfSubjectAccessReview, answered by the authorizer.
//! * [`date`]: the `Date` header, from the emulator's clock.
//! * [`outage`]: a black-hole outage (requests and open watches stall), toggled by tests.

mod authn;
mod clustertrustbundles;
mod create;
mod date;
mod delete;
mod discovery;
mod outage;
mod podcertificaterequests;
mod read;
mod routing;
mod selfsubjectaccessreview;
mod server;
mod token_request;
mod update;
mod watch;

pub(crate) use outage::{Outage, Throttle, ThrottleLimit};
pub(crate) use server::spawn_server;

use super::Shared;
use super::errors::ApiError;
use super::resources::ApiMode;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Response, StatusCode};
use serde_json::Value;
use std::convert::Infallible;

pub(crate) type RespBody = BoxBody<Bytes, Infallible>;

fn json_response(code: u16, v: &Value) -> Response<RespBody> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response<RespBody> {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = hyper::header::HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(hyper::header::RETRY_AFTER, v);
    }
    r
}

fn mode(shared: &Shared) -> ApiMode {
    shared.config.api_mode
}
