//! Create (and server-side apply of a missing object): body decoding, server-side metadata,
//! `generateName`, NamespaceLifecycle, and the store write.

use super::clustertrustbundles::create_ctb;
use super::podcertificaterequests::create_pcr;
use super::routing::Target;
use super::server::Req;
use super::{RespBody, json_response, mode};
use crate::emulator::auth::UserInfo;
use crate::emulator::errors::{ApiError, FieldError};
use crate::emulator::managed;
use crate::emulator::patch;
use crate::emulator::pcr;
use crate::emulator::resources::{self, Res};
use crate::emulator::store::meta_str;
use crate::emulator::{Shared, lock, new_uid};
use hyper::Response;
use serde_json::{Map, Value, json};
use std::sync::Arc;

pub(super) fn parse_body(r: &Req) -> Result<Value, ApiError> {
    let ct = r.content_type.split(';').next().unwrap_or("").trim();
    if ct.contains("yaml") {
        return patch::parse_apply_yaml(&r.body).map_err(ApiError::bad_request);
    }
    serde_json::from_slice(&r.body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })
}

pub(super) fn check_api_version(body: &Value, res: Res, version: &str) -> Result<(), ApiError> {
    let want = res.api_version(version);
    if let Some(av) = body.get("apiVersion").and_then(Value::as_str)
        && av != want
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({want})"
        )));
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str)
        && k != res.kind()
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            res.kind()
        )));
    }
    Ok(())
}

pub(super) fn decode_err(res: Res, version: &str, e: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{} in version \"{version}\" cannot be handled as a {}: {e}",
        res.kind(),
        res.kind()
    ))
}

fn generate_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    let _ = aws_lc_rs::rand::fill(&mut b);
    b.iter()
        .map(|x| ALPHA[*x as usize % ALPHA.len()] as char)
        .collect()
}

/// A free name for `generateName`: kube-apiserver retries a generated name that collides
/// (RetryGenerateName, GA since 1.32), so a random clash never fails a create.
pub(super) fn generated_name(shared: &Shared, res: Res, ns: &str, prefix: &str) -> String {
    let st = lock(&shared.store);
    let mut name = format!("{prefix}{}", generate_suffix());
    for _ in 0..8 {
        if st.get(res, ns, &name).is_none() {
            break;
        }
        name = format!("{prefix}{}", generate_suffix());
    }
    name
}

/// Build the server-side metadata of a new object.
pub(super) fn new_metadata(
    shared: &Shared,
    body_meta: Option<&Value>,
    ns: &str,
    name: &str,
) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("name".into(), json!(name));
    if !ns.is_empty() {
        m.insert("namespace".into(), json!(ns));
    }
    m.insert("uid".into(), json!(new_uid()));
    m.insert(
        "creationTimestamp".into(),
        json!(pcr::fmt_time(shared.now())),
    );
    if let Some(Value::Object(bm)) = body_meta {
        for k in [
            "labels",
            "annotations",
            "ownerReferences",
            "finalizers",
            "generateName",
        ] {
            if let Some(v) = bm.get(k).filter(|v| !v.is_null()) {
                m.insert(k.into(), v.clone());
            }
        }
    }
    m
}

pub(super) fn validate_meta_labels(meta: &Map<String, Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(Value::Object(labels)) = meta.get("labels") {
        for (k, v) in labels {
            for m in crate::emulator::names::is_qualified_name(k) {
                errs.push(FieldError::invalid_str("metadata.labels", k, m));
            }
            let vs = v.as_str().unwrap_or("");
            for m in crate::emulator::names::is_valid_label_value(vs) {
                errs.push(FieldError::invalid_str("metadata.labels", vs, m));
            }
        }
    }
    errs
}

pub(super) fn ensure_namespace(shared: &Shared, ns: &str) -> Result<(), ApiError> {
    if ns.is_empty() {
        return Ok(());
    }
    let exists = lock(&shared.store).get(Res::Namespace, "", ns).is_some();
    if exists {
        return Ok(());
    }
    if shared.config.auto_create_namespaces {
        let meta =
            json!({"name": ns, "uid": new_uid(), "creationTimestamp": pcr::fmt_time(shared.now())});
        lock(&shared.store).put(Res::Namespace, "", ns, json!({"metadata": meta, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}));
        return Ok(());
    }
    Err(ApiError::not_found("namespaces", "", ns))
}

pub(super) fn create(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
) -> Result<Response<RespBody>, ApiError> {
    let body = parse_body(r)?;
    if !body.is_object() {
        return Err(decode_err(t.res, &t.version, "expected an object"));
    }
    check_api_version(&body, t.res, &t.version)?;
    let ns = t.namespace.clone().unwrap_or_default();
    let body_ns = meta_str(&body, "namespace");
    if !body_ns.is_empty() && body_ns != ns && t.res.namespaced() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let mut name = meta_str(&body, "name").to_string();
    let generate = meta_str(&body, "generateName").to_string();
    match t.res {
        Res::Pcr => create_pcr(shared, r, user, t, &body, &ns, name, &generate),
        Res::Ctb => create_ctb(shared, r, user, t, &body, name),
        _ => {
            if name.is_empty() && generate.is_empty() {
                return Err(ApiError::invalid(
                    t.res.kind(),
                    t.res.group(),
                    "",
                    vec![FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
            if name.is_empty() {
                name = generated_name(shared, t.res, &ns, &generate);
            }
            ensure_namespace(shared, &ns)?;
            let mut meta = new_metadata(shared, body.get("metadata"), &ns, &name);
            let mut lerrs = validate_meta_labels(&meta);
            if t.res == Res::ConfigMap {
                lerrs.extend(crate::emulator::configmaps::validate(&name, &body, None));
            }
            if !lerrs.is_empty() {
                return Err(ApiError::invalid(t.res.kind(), t.res.group(), &name, lerrs));
            }
            let mut obj = body.clone();
            if let Value::Object(m) = &mut obj {
                m.remove("apiVersion");
                m.remove("kind");
                if t.res == Res::Lease || t.res == Res::Namespace {
                    // nothing special
                }
                let set = managed::changed_fields(None, &Value::Object(m.clone()));
                meta.insert("managedFields".into(), json!([]));
                m.insert("metadata".into(), Value::Object(meta));
                managed::record(
                    &mut obj,
                    &r.manager(),
                    "Update",
                    &t.res.api_version(&t.version),
                    None,
                    &set,
                    &pcr::fmt_time(shared.now()),
                    false,
                );
            }
            if t.res == Res::Namespace {
                obj["status"] = json!({"phase": "Active"});
            }
            store_new(shared, r, t, &ns, &name, obj)
        }
    }
}

pub(super) fn store_new(
    shared: &Shared,
    r: &Req,
    t: &Target,
    ns: &str,
    name: &str,
    obj: Value,
) -> Result<Response<RespBody>, ApiError> {
    let mut st = lock(&shared.store);
    if st.get(t.res, ns, name).is_some() {
        return Err(ApiError::already_exists(
            t.res.plural(),
            t.res.group(),
            name,
        ));
    }
    let stored = if r.dry_run() {
        Arc::new(obj)
    } else {
        st.put(t.res, ns, name, obj)
    };
    drop(st);
    Ok(json_response(
        201,
        &resources::to_version(t.res, &stored, &t.version, mode(shared)),
    ))
}

pub(super) fn apply_create(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
    cfg: Value,
) -> Result<Response<RespBody>, ApiError> {
    check_api_version(&cfg, t.res, &t.version)?;
    if !cfg.is_object() {
        return Err(ApiError::bad_request(
            "the apply configuration must be an object",
        ));
    }
    let name = t.name.clone().unwrap_or_default();
    let mut body = cfg;
    if let Some(Value::Object(m)) = body.get_mut("metadata") {
        m.insert("name".into(), json!(name));
    }
    let ns = t.namespace.clone().unwrap_or_default();
    match t.res {
        Res::Pcr => create_pcr(shared, r, user, t, &body, &ns, name, ""),
        Res::Ctb => create_ctb(shared, r, user, t, &body, name),
        _ => {
            ensure_namespace(shared, &ns)?;
            let mut meta = new_metadata(shared, body.get("metadata"), &ns, &name);
            meta.insert("managedFields".into(), json!([]));
            let mut obj = body.clone();
            if let Value::Object(m) = &mut obj {
                m.remove("apiVersion");
                m.remove("kind");
            }
            if t.res == Res::ConfigMap {
                let errs = crate::emulator::configmaps::validate(&name, &obj, None);
                if !errs.is_empty() {
                    return Err(ApiError::invalid(t.res.kind(), t.res.group(), &name, errs));
                }
            }
            let set = managed::changed_fields(None, &obj);
            obj["metadata"] = Value::Object(meta);
            managed::record(
                &mut obj,
                &r.manager(),
                "Apply",
                &t.res.api_version(&t.version),
                None,
                &set,
                &pcr::fmt_time(shared.now()),
                true,
            );
            store_new(shared, r, t, &ns, &name, obj)
        }
    }
}
