//! TokenRequest: `POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token`, as
//! kube-apiserver's `TokenREST.Create` answers it. The minted token is a JWT with the claims
//! kube-apiserver puts in one (podca reads `exp`); its signature is random bytes that nothing
//! verifies, because TokenReview and the bearer-token check look the token up instead.

use super::create::parse_body;
use super::routing::authorize_create;
use super::server::Req;
use super::{RespBody, json_response};
use crate::emulator::auth::{Attrs, ServiceAccountToken, UserInfo};
use crate::emulator::errors::{ApiError, FieldError, go_quote};
use crate::emulator::resources::Res;
use crate::emulator::store::meta_str;
use crate::emulator::{Shared, lock, new_uid, pcr, write};
use base64::Engine as _;
use hyper::Response;
use serde_json::{Value, json};

const GROUP: &str = "authentication.k8s.io";
/// `SetDefaults_TokenRequestSpec`.
const DEFAULT_EXPIRATION_SECONDS: i64 = 60 * 60;
/// `ValidateTokenRequest`'s bounds.
const MIN_EXPIRATION_SECONDS: i64 = 10 * 60;
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// The `iss` claim: kube-apiserver's usual `--service-account-issuer`.
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The object a token is bound to, resolved from `spec.boundObjectRef`.
#[derive(Debug, Default)]
struct Binding {
    pod: Option<(String, String)>,
    node: Option<(String, String)>,
}

pub(super) fn token_request(
    shared: &Shared,
    r: &Req,
    user: &UserInfo,
    namespace: &str,
    name: &str,
) -> Result<Response<RespBody>, ApiError> {
    authorize_create(
        shared,
        r,
        user,
        Attrs {
            verb: "create",
            group: "",
            resource: "serviceaccounts",
            subresource: "token",
            namespace,
            name,
        },
    )?;
    let body = parse_body(r)?;
    check_kind(&body)?;
    let body_name = meta_str(&body, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(invalid(
            name,
            FieldError::invalid_str(
                "metadata.name",
                body_name,
                "must match the service account name if specified",
            ),
        ));
    }
    let body_namespace = meta_str(&body, "namespace");
    if !body_namespace.is_empty() && body_namespace != namespace {
        return Err(invalid(
            name,
            FieldError::invalid_str(
                "metadata.namespace",
                body_namespace,
                "must match the service account namespace if specified",
            ),
        ));
    }
    let sa_uid = lock(&shared.store)
        .get(Res::ServiceAccount, namespace, name)
        .map(|sa| meta_str(&sa, "uid").to_string())
        .ok_or_else(|| ApiError::not_found("serviceaccounts", "", name))?;
    let spec = &body["spec"];
    let mut audiences = string_list(&spec["audiences"])?;
    if audiences.is_empty() {
        audiences = shared.config.api_audiences.clone();
    }
    let expiration_seconds = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION_SECONDS,
        v => v.as_i64().ok_or_else(|| {
            decode_error(&format!(
                "json: cannot unmarshal {} into Go struct field TokenRequestSpec.spec.expirationSeconds of type int64",
                json_type(v)
            ))
        })?,
    };
    if expiration_seconds < MIN_EXPIRATION_SECONDS {
        return Err(invalid(
            "",
            FieldError::invalid_raw(
                "spec.expirationSeconds",
                expiration_seconds.to_string(),
                "may not specify a duration less than 10 minutes",
            ),
        ));
    }
    if expiration_seconds > MAX_EXPIRATION_SECONDS {
        return Err(invalid(
            "",
            FieldError::invalid_raw(
                "spec.expirationSeconds",
                expiration_seconds.to_string(),
                "may not specify a duration larger than 2^32 seconds",
            ),
        ));
    }
    let bound_ref = &spec["boundObjectRef"];
    let binding = if bound_ref.is_null() {
        Binding::default()
    } else {
        bind(shared, namespace, name, bound_ref)?
    };

    let now = shared.now();
    let expires = now + time::Duration::seconds(expiration_seconds);
    let jti = new_uid();
    let sa = ServiceAccountToken {
        namespace: namespace.to_string(),
        service_account: name.to_string(),
        service_account_uid: sa_uid,
        audiences: audiences.clone(),
        expires,
        pod_name: binding.pod.as_ref().map(|(n, _)| n.clone()),
        pod_uid: binding.pod.as_ref().map(|(_, u)| u.clone()),
        node_name: binding.node.as_ref().map(|(n, _)| n.clone()),
        node_uid: binding.node.as_ref().map(|(_, u)| u.clone()),
        credential_id: jti,
    };
    let token = jwt(&sa, now);
    write(&shared.auth).sa_tokens.insert(token.clone(), sa);
    Ok(json_response(
        201,
        &json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": pcr::fmt_time(now)},
            "spec": {
                "audiences": audiences,
                "expirationSeconds": expiration_seconds,
                "boundObjectRef": bound_ref,
            },
            "status": {"token": token, "expirationTimestamp": pcr::fmt_time(expires)},
        }),
    ))
}

fn check_kind(body: &Value) -> Result<(), ApiError> {
    let want = "authentication.k8s.io/v1";
    if let Some(av) = body.get("apiVersion").and_then(Value::as_str)
        && av != want
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({want})"
        )));
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str)
        && k != "TokenRequest"
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind (TokenRequest)"
        )));
    }
    Ok(())
}

fn invalid(name: &str, e: FieldError) -> ApiError {
    ApiError::invalid("TokenRequest", GROUP, name, vec![e])
}

fn decode_error(e: &str) -> ApiError {
    ApiError::bad_request(format!(
        "TokenRequest in version \"v1\" cannot be handled as a TokenRequest: {e}"
    ))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Null => "null",
    }
}

fn string_list(v: &Value) -> Result<Vec<String>, ApiError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str().map(String::from).ok_or_else(|| {
                    decode_error(&format!(
                        "json: cannot unmarshal {} into Go struct field TokenRequestSpec.spec.audiences of type string",
                        json_type(x)
                    ))
                })
            })
            .collect(),
        other => Err(decode_error(&format!(
            "json: cannot unmarshal {} into Go struct field TokenRequestSpec.spec.audiences of type []string",
            json_type(other)
        ))),
    }
}

/// Resolve `spec.boundObjectRef` (a Pod, a Node or a Secret) like `TokenREST.Create`.
fn bind(
    shared: &Shared,
    namespace: &str,
    service_account: &str,
    r: &Value,
) -> Result<Binding, ApiError> {
    let api_version = r["apiVersion"].as_str().unwrap_or("");
    let kind = r["kind"].as_str().unwrap_or("");
    let name = r["name"].as_str().unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let st = lock(&shared.store);
    let node_of = |node_name: &str| {
        st.get(Res::Node, "", node_name)
            .map(|n| (node_name.to_string(), meta_str(&n, "uid").to_string()))
    };
    let (uid, binding) = match (group, kind) {
        ("", "Pod") => {
            let pod = st
                .get(Res::Pod, namespace, name)
                .ok_or_else(|| ApiError::not_found("pods", "", name))?;
            if pod["spec"]["serviceAccountName"].as_str().unwrap_or("") != service_account {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {} to pod running with different serviceaccount name.",
                    go_quote(service_account)
                )));
            }
            let uid = meta_str(&pod, "uid").to_string();
            // A pod whose node is gone still gets a token, without the node's claims.
            let node = match pod["spec"]["nodeName"].as_str() {
                Some(n) if !n.is_empty() => node_of(n),
                _ => None,
            };
            let pod = Some((name.to_string(), uid.clone()));
            (uid, Binding { pod, node })
        }
        ("", "Node") => {
            let node = node_of(name).ok_or_else(|| ApiError::not_found("nodes", "", name))?;
            (
                node.1.clone(),
                Binding {
                    pod: None,
                    node: Some(node),
                },
            )
        }
        ("", "Secret") => {
            let secret = st
                .get(Res::Secret, namespace, name)
                .ok_or_else(|| ApiError::not_found("secrets", "", name))?;
            (meta_str(&secret, "uid").to_string(), Binding::default())
        }
        _ => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {group}/{version}, Kind={kind}"
            )));
        }
    };
    if let Some(want) = r["uid"].as_str().filter(|u| !u.is_empty())
        && want != uid
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {kind} {}: the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated",
                go_quote(name)
            ),
        ));
    }
    Ok(binding)
}

/// A JWT with kube-apiserver's claims for this token, and a random signature.
fn jwt(t: &ServiceAccountToken, now: time::OffsetDateTime) -> String {
    let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let mut k8s = json!({
        "namespace": t.namespace,
        "serviceaccount": {"name": t.service_account, "uid": t.service_account_uid},
    });
    if let (Some(name), Some(uid)) = (&t.pod_name, &t.pod_uid) {
        k8s["pod"] = json!({"name": name, "uid": uid});
    }
    if let (Some(name), Some(uid)) = (&t.node_name, &t.node_uid) {
        k8s["node"] = json!({"name": name, "uid": uid});
    }
    let claims = json!({
        "aud": t.audiences,
        "exp": t.expires.unix_timestamp(),
        "iat": now.unix_timestamp(),
        "iss": ISSUER,
        "jti": t.credential_id,
        "kubernetes.io": k8s,
        "nbf": now.unix_timestamp(),
        "sub": format!("system:serviceaccount:{}:{}", t.namespace, t.service_account),
    });
    let mut signature = [0u8; 64];
    // Nothing verifies the signature; a failed fill leaves zeros, and the token stays unique
    // through its jti.
    let _ = aws_lc_rs::rand::fill(&mut signature);
    format!(
        "{}.{}.{}",
        b64(br#"{"alg":"RS256","kid":"podca-kube-emulator"}"#),
        b64(claims.to_string().as_bytes()),
        b64(&signature)
    )
}
