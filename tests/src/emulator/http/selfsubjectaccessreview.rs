//! Access reviews of authorization.k8s.io/v1, answered by the same authorizer chain as every
//! other request (admin group, Node authorizer, the RBAC rules with their `nonResourceURLs`,
//! the built-in ClusterTrustBundle readers), as kube-apiserver's come from its union
//! authorizer:
//!
//! * `POST …/selfsubjectaccessreviews`: may the caller do this? Any authenticated user may ask
//!   (the `system:basic-user` ClusterRole).
//! * `POST /apis/authentication.k8s.io/v1/selfsubjectreviews`: who is the caller?
//! * `POST …/subjectaccessreviews`: may this user (`spec.user`, `groups`, `uid`, `extra`, taken
//!   as given, as kube-rbac-proxy and podca's `/metrics` send them after a TokenReview) do
//!   this? The caller needs `create` on `subjectaccessreviews`; `spec.user` or `spec.groups`
//!   must be given (422 otherwise).
//!
//! As kube-apiserver: exactly one of `resourceAttributes` and `nonResourceAttributes` must be
//! given (422 otherwise); the answer is `201 Created` with the spec as sent and
//! `status.allowed`. One simplification: `status.reason` is given only for a denial with a
//! reason (the emulator's rules carry no binding names to quote in an RBAC "allowed by"
//! reason).

use super::create::parse_body;
use super::routing::authorize_create;
use super::server::Req;
use super::{RespBody, json_response};
use crate::emulator::auth::{Attrs, Decision, UserInfo};
use crate::emulator::errors::{ApiError, FieldError};
use crate::emulator::{Shared, read};
use hyper::Response;
use serde_json::{Value, json};

const GROUP: &str = "authorization.k8s.io";

pub(super) fn self_subject_access_review(
    shared: &Shared,
    r: &Req,
    user: &UserInfo,
) -> Result<Response<RespBody>, ApiError> {
    let ask = Attrs {
        verb: "create",
        group: GROUP,
        resource: "selfsubjectaccessreviews",
        subresource: "",
        namespace: "",
        name: "",
    };
    // system:basic-user, bound to system:authenticated, allows every user to ask.
    if !user.groups.iter().any(|g| g == "system:authenticated") {
        authorize_create(shared, r, user, ask)?;
    } else if r.method != hyper::Method::POST {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    let body = parse_body(r)?;
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    review(shared, "SelfSubjectAccessReview", user, spec)
}

pub(super) fn subject_access_review(
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
            group: GROUP,
            resource: "subjectaccessreviews",
            subresource: "",
            namespace: "",
            name: "",
        },
    )?;
    let body = parse_body(r)?;
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Taken as given: no group is added, as kube-apiserver adds none to a review's subject.
    let subject = UserInfo {
        name: spec["user"].as_str().unwrap_or("").to_owned(),
        uid: spec["uid"].as_str().unwrap_or("").to_owned(),
        groups: strings(spec.get("groups")),
        extra: spec["extra"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), strings(Some(v))))
                    .collect()
            })
            .unwrap_or_default(),
    };
    if subject.name.is_empty() && subject.groups.is_empty() {
        return Err(ApiError::invalid(
            "SubjectAccessReview",
            GROUP,
            "",
            vec![FieldError::invalid_str(
                "spec.user",
                "",
                "at least one of user or group must be specified",
            )],
        ));
    }
    review(shared, "SubjectAccessReview", &subject, spec)
}

/// The answer to one access review of `subject`: 201 with `status.allowed`, or 422.
fn review(
    shared: &Shared,
    kind: &str,
    subject: &UserInfo,
    spec: Value,
) -> Result<Response<RespBody>, ApiError> {
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let decision = match (resource, non_resource) {
        (Some(a), None) => {
            let s = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or("");
            read(&shared.auth).authorize(
                subject,
                &Attrs {
                    verb: s("verb"),
                    group: s("group"),
                    resource: s("resource"),
                    subresource: s("subresource"),
                    namespace: s("namespace"),
                    name: s("name"),
                },
            )
        }
        (None, Some(a)) => {
            let s = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or("");
            read(&shared.auth).authorize_non_resource(subject, s("verb"), s("path"))
        }
        (Some(_), Some(_)) | (None, None) => {
            let shown = if resource.is_some() {
                "{...}".to_owned()
            } else {
                "null".to_owned()
            };
            return Err(ApiError::invalid(
                kind,
                GROUP,
                "",
                vec![FieldError::invalid_str(
                    "spec.resourceAttributes",
                    &shown,
                    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                )],
            ));
        }
    };
    let status = match decision {
        Decision::Allow => json!({"allowed": true}),
        Decision::Deny(reason) if reason.is_empty() => json!({"allowed": false}),
        Decision::Deny(reason) => json!({"allowed": false, "reason": reason}),
    };
    Ok(json_response(
        201,
        &json!({
            "kind": kind,
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status,
        }),
    ))
}

/// `POST /apis/authentication.k8s.io/v1/selfsubjectreviews` (`kubectl auth whoami`): who the
/// caller is, as the authenticator (and impersonation) made it. Any authenticated user may ask
/// (`system:basic-user`); the answer is `201 Created` with `status.userInfo`.
pub(super) fn self_subject_review(
    r: &Req,
    user: &UserInfo,
) -> Result<Response<RespBody>, ApiError> {
    if r.method != hyper::Method::POST {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    let mut info = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    Ok(json_response(
        201,
        &json!({
            "kind": "SelfSubjectReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "status": {"userInfo": info},
        }),
    ))
}
