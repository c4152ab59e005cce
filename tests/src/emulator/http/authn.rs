//! Authentication: bearer tokens (identities and service-account tokens) and TokenReview.

use super::create::parse_body;
use super::routing::authorize_create;
use super::server::Req;
use super::{RespBody, json_response};
use crate::emulator::auth::{Attrs, UserInfo};
use crate::emulator::errors::ApiError;
use crate::emulator::{Shared, pod_state, read};
use hyper::Response;
use serde_json::json;

pub(super) fn authenticate(shared: &Shared, header: &str) -> Option<UserInfo> {
    let token = header.strip_prefix("Bearer ")?.trim();
    let a = read(&shared.auth);
    if let Some((_, u)) = a.tokens.get(token) {
        return Some(u.clone());
    }
    let t = a.sa_tokens.get(token)?;
    let now = shared.now();
    if now >= t.expires {
        return None;
    }
    if !t
        .audiences
        .iter()
        .any(|x| shared.config.api_audiences.contains(x))
    {
        return None;
    }
    Some(t.user())
}

pub(super) async fn token_review(
    shared: &Shared,
    r: &Req,
    user: &UserInfo,
) -> Result<Response<RespBody>, ApiError> {
    authorize_create(
        shared,
        r,
        user,
        Attrs {
            verb: "create",
            group: "authentication.k8s.io",
            resource: "tokenreviews",
            subresource: "",
            namespace: "",
            name: "",
        },
    )?;
    let body = parse_body(r)?;
    let token = body["spec"]["token"].as_str().unwrap_or("").to_string();
    let req_aud: Vec<String> = body["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let wanted = if req_aud.is_empty() {
        shared.config.api_audiences.clone()
    } else {
        req_aud.clone()
    };
    let _in_flight = pod_state::begin_token_review(shared).await;
    let a = read(&shared.auth);
    let status = if let Some((_, u)) = a.tokens.get(&token) {
        json!({"authenticated": true, "user": u.to_json(), "audiences": wanted})
    } else if let Some(t) = a.sa_tokens.get(&token) {
        let now = shared.now();
        let inter: Vec<String> = wanted
            .iter()
            .filter(|w| t.audiences.contains(w))
            .cloned()
            .collect();
        if now >= t.expires {
            json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, service account token has expired]"})
        } else if inter.is_empty() {
            json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, token audiences ... is invalid for the target audiences]"})
        } else if let Some(problem) = pod_state::bound_pod_problem(shared, t, now) {
            json!({"authenticated": false, "user": {}, "error": format!("[invalid bearer token, {problem}]")})
        } else {
            json!({"authenticated": true, "user": t.user().to_json(), "audiences": inter})
        }
    } else {
        json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, token lookup failed]"})
    };
    let mut spec = json!({"token": token});
    if !req_aud.is_empty() {
        spec["audiences"] = json!(req_aud);
    }
    Ok(json_response(
        201,
        &json!({
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status,
        }),
    ))
}
