//! From a request path to a resource [`Target`], the verb, the authorization check and the
//! handler.

use super::authn::token_review;
use super::create::create;
use super::delete::{delete, delete_collection};
use super::discovery::{api_group, api_group_list, group_has_version, resource_list, version_info};
use super::read::{get, list};
use super::selfsubjectaccessreview::{
    self_subject_access_review, self_subject_review, subject_access_review,
};
use super::server::Req;
use super::token_request::token_request;
use super::update::update;
use super::watch::watch;
use super::{RespBody, json_response};
use crate::emulator::Shared;
use crate::emulator::auth::{Attrs, Decision, UserInfo, forbidden_message};
use crate::emulator::errors::ApiError;
use crate::emulator::latency::RequestClass;
use crate::emulator::read;
use crate::emulator::resources::{ApiMode, Res};
use crate::emulator::selectors::FieldSelector;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Response};
use serde_json::json;
use std::sync::Arc;

/// A parsed resource path.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) res: Res,
    pub(super) version: String,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

pub(super) async fn route(shared: &Arc<Shared>, r: &Req) -> Result<Response<RespBody>, ApiError> {
    let segs: Vec<&str> = r
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let mode = shared.config.api_mode;
    match segs.as_slice() {
        ["version"] => {
            let v = version_info(mode, shared.config.kubernetes_minor);
            return Ok(json_response(200, &v));
        }
        ["healthz"] | ["livez"] | ["readyz"] => {
            let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")).boxed());
            resp.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain"),
            );
            return Ok(resp);
        }
        _ => {}
    }
    let Some(user) = r.user.clone() else {
        return Err(ApiError::new(401, "Unauthorized", "Unauthorized"));
    };
    match segs.as_slice() {
        ["api"] => {
            return Ok(json_response(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
            ));
        }
        ["apis"] => return Ok(json_response(200, &api_group_list(mode))),
        ["api", "v1"] => return Ok(json_response(200, &resource_list("", "v1", mode))),
        ["apis", g] => {
            return api_group(g, mode)
                .map(|v| json_response(200, &v))
                .ok_or_else(|| not_found_path(&r.path));
        }
        ["apis", g, v] => {
            if api_group(g, mode).is_some_and(|gv| group_has_version(&gv, v)) {
                return Ok(json_response(200, &resource_list(g, v, mode)));
            }
            return Err(not_found_path(&r.path));
        }
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] => {
            return token_review(shared, r, &user).await;
        }
        ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"] => {
            return self_subject_review(r, &user);
        }
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
        ] => {
            return self_subject_access_review(shared, r, &user);
        }
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] => {
            return subject_access_review(shared, r, &user);
        }
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "serviceaccounts",
            name,
            "token",
        ] => {
            return token_request(shared, r, &user, ns, name);
        }
        _ => {}
    }
    let target = parse_target(&segs, mode).ok_or_else(|| not_found_path(&r.path))?;
    dispatch(shared, r, &user, &target).await
}

fn not_found_path(path: &str) -> ApiError {
    let _ = path;
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn parse_target(segs: &[&str], mode: ApiMode) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest): (Option<String>, &[&str]) = match rest {
        ["namespaces", ns, r, tail @ ..] => {
            let _ = r;
            (Some((*ns).to_string()), &rest[2..tail.len() + 3])
        }
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some((*n).to_string()), None),
        [p, n, s] => (*p, Some((*n).to_string()), Some((*s).to_string())),
        _ => return None,
    };
    // `/api/v1/namespaces/<name>` is the namespace object itself.
    let (res, namespace, name) =
        if group.is_empty() && namespace.is_none() && plural == "namespaces" {
            (Res::Namespace, None, name)
        } else if group.is_empty() && plural == "namespaces" {
            return None;
        } else {
            (Res::lookup(group, plural)?, namespace, name)
        };
    if group.is_empty() && segs.len() == 4 && segs[2] == "namespaces" {
        // /api/v1/namespaces/<ns>: handled above via (namespaces, name)
    }
    if !res.versions(mode).contains(&version) {
        return None;
    }
    if res.namespaced() != namespace.is_some()
        && !(res.namespaced() && name.is_none() && namespace.is_none())
    {
        return None;
    }
    if let Some(s) = &sub
        && (s != "status" || !res.has_status())
    {
        return None;
    }
    Some(Target {
        res,
        version: version.to_string(),
        namespace,
        name,
        sub,
    })
}

/// Create-only endpoints (TokenReview, TokenRequest): anything but POST is refused as
/// kube-apiserver refuses it, then `a` (a create) is authorized.
pub(super) fn authorize_create(
    shared: &Shared,
    r: &Req,
    user: &UserInfo,
    a: Attrs<'_>,
) -> Result<(), ApiError> {
    if r.method != Method::POST {
        return Err(not_allowed());
    }
    authorize(shared, user, a)
}

fn not_allowed() -> ApiError {
    ApiError::method_not_allowed("the server does not allow this method on the requested resource")
}

pub(super) fn authorize(shared: &Shared, user: &UserInfo, a: Attrs<'_>) -> Result<(), ApiError> {
    match read(&shared.auth).authorize(user, &a) {
        Decision::Allow => Ok(()),
        Decision::Deny(reason) => Err(ApiError::forbidden(
            a.resource,
            a.group,
            a.name,
            &forbidden_message(user, &a, &reason),
        )),
    }
}

async fn dispatch(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
) -> Result<Response<RespBody>, ApiError> {
    let verb = match (&r.method, t.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if r.flag("watch") => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => return Err(not_allowed()),
    };
    let ns = t.namespace.clone().unwrap_or_default();
    let mut name = t.name.clone().unwrap_or_default();
    // kube-apiserver's RequestInfoFactory: a list or watch with the field selector
    // `metadata.name=<name>` is authorized as a request for that name (resourceNames apply).
    if name.is_empty()
        && matches!(verb, "list" | "watch")
        && let Ok(fsel) = FieldSelector::parse(r.q("fieldSelector").unwrap_or(""), t.res)
        && let Some(n) = fsel.required("metadata.name")
    {
        name = n.to_string();
    }
    if t.res.namespaced() && ns.is_empty() && !matches!(verb, "list" | "watch") {
        return Err(not_found_path(&r.path));
    }
    let handle = || {
        authorize(
            shared,
            user,
            Attrs {
                verb,
                group: t.res.group(),
                resource: t.res.plural(),
                subresource: t.sub.as_deref().unwrap_or(""),
                namespace: &ns,
                name: &name,
            },
        )?;
        match verb {
            "get" => get(shared, t),
            "list" => list(shared, r, t),
            "watch" => watch(shared, r, t),
            "create" => create(shared, r, user, t),
            "update" | "patch" => update(shared, r, user, t, verb),
            "delete" => delete(shared, r, t),
            _ => delete_collection(shared, r, t),
        }
    };
    // The latency model times the request around its authorization and handler: when the
    // answer leaves changes, never what it is. A watch's live events are delayed in the stream.
    let class = match verb {
        "get" => Some(RequestClass::Get),
        "list" => Some(RequestClass::List),
        "create" => Some(RequestClass::Create),
        "update" | "patch" | "delete" | "deletecollection" => Some(RequestClass::Update),
        _ => None,
    };
    match (&shared.latency, class) {
        (Some(latency), Some(class)) => latency.serve(class, handle).await,
        _ => handle(),
    }
}
