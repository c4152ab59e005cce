//! `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`: may the caller do this? The
//! answer comes from the same authorizer chain as every other request (admin group, Node
//! authorizer, the RBAC rules, the built-in ClusterTrustBundle readers), as kube-apiserver's
//! comes from its union authorizer.
//!
//! As kube-apiserver: any authenticated user may ask (the `system:basic-user` ClusterRole);
//! exactly one of `resourceAttributes` and `nonResourceAttributes` must be given (422
//! otherwise); the answer is `201 Created` with the spec as sent and `status.allowed`. Two
//! simplifications: no non-resource rules are modelled (only `system:masters` is allowed a
//! non-resource URL), and `status.reason` is given only for a denial with a reason (the
//! emulator's rules carry no binding names to quote in an RBAC "allowed by" reason).

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
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let decision = match (resource, non_resource) {
        (Some(a), None) => {
            let s = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or("");
            read(&shared.auth).authorize(
                user,
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
        (None, Some(_)) if user.is_admin() => Decision::Allow,
        (None, Some(_)) => Decision::Deny(String::new()),
        (Some(_), Some(_)) | (None, None) => {
            let shown = if resource.is_some() {
                "{...}".to_owned()
            } else {
                "null".to_owned()
            };
            return Err(ApiError::invalid(
                "SelfSubjectAccessReview",
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
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status,
        }),
    ))
}
