//! Update and patch (merge, strategic, JSON patch, server-side apply): optimistic
//! concurrency, managed fields, each resource's strategy, no-op detection.

use super::clustertrustbundles::ctb_update_strategy;
use super::create::{apply_create, check_api_version, parse_body, validate_meta_labels};
use super::podcertificaterequests::{pcr_status_strategy, pcr_update_strategy};
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
use crate::emulator::{Shared, lock};
use hyper::Response;
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// How an update computes the new object.
enum Op {
    Put(Value),
    Merge(Value),
    Strategic(Value),
    JsonPatch(Value),
    Apply(Value),
}

fn parse_op(r: &Req, verb: &str) -> Result<Op, ApiError> {
    let ct = r
        .content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if verb == "update" {
        return Ok(Op::Put(parse_body(r)?));
    }
    let json_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(&r.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
    };
    match ct.as_str() {
        "application/merge-patch+json" => Ok(Op::Merge(json_body()?)),
        "application/strategic-merge-patch+json" => Ok(Op::Strategic(json_body()?)),
        "application/json-patch+json" => Ok(Op::JsonPatch(json_body()?)),
        "application/apply-patch+yaml" | "application/apply-patch+json" => {
            if r.q("fieldManager").unwrap_or("").is_empty() {
                return Err(ApiError::invalid(
                    "PatchOptions",
                    "meta.k8s.io",
                    "",
                    vec![FieldError::required(
                        "fieldManager",
                        "is required for apply patch",
                    )],
                ));
            }
            Ok(Op::Apply(patch::parse_apply_yaml(&r.body).map_err(
                |e| ApiError::bad_request(format!("error decoding YAML: {e}")),
            )?))
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn strip_meta_server_fields(v: &mut Value) {
    if let Some(Value::Object(m)) = v.get_mut("metadata") {
        m.remove("managedFields");
    }
}

pub(super) fn update(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
    verb: &str,
) -> Result<Response<RespBody>, ApiError> {
    let op = parse_op(r, verb)?;
    let md = mode(shared);
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let res = t.res;
    let is_status = t.sub.as_deref() == Some("status");
    let manager = r.manager();
    let now = shared.now();
    let now_s = pcr::fmt_time(now);

    let mut st = lock(&shared.store);
    let Some(old) = st.get(res, &ns, &name) else {
        drop(st);
        if let (Op::Apply(cfg), false) = (&op, is_status) {
            // Server-side apply creates a missing object.
            return apply_create(shared, r, user, t, cfg.clone());
        }
        return Err(ApiError::not_found(res.plural(), res.group(), &name));
    };
    let old_v = resources::to_version(res, &old, &t.version, md);
    let mut apply_set: Option<Map<String, Value>> = None;
    let mut new_v = match &op {
        Op::Put(body) => {
            check_api_version(body, res, &t.version)?;
            let body_name = meta_str(body, "name");
            if body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            let brv = meta_str(body, "resourceVersion");
            if brv.is_empty() {
                return Err(ApiError::invalid(
                    res.plural(),
                    res.group(),
                    &name,
                    vec![FieldError::invalid_raw(
                        "metadata.resourceVersion",
                        "0",
                        "must be specified for an update",
                    )],
                ));
            }
            body.clone()
        }
        Op::Merge(p) => {
            let mut v = old_v.clone();
            patch::merge_patch(&mut v, p);
            v
        }
        Op::Strategic(p) => {
            let mut v = old_v.clone();
            patch::strategic_merge(&mut v, p);
            v
        }
        Op::JsonPatch(p) => {
            let mut v = old_v.clone();
            patch::json_patch(&mut v, p).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
            v
        }
        Op::Apply(cfg) => {
            check_api_version(cfg, res, &t.version)?;
            let mut v = old_v.clone();
            let mut c = cfg.clone();
            if let Value::Object(m) = &mut c {
                m.remove("apiVersion");
                m.remove("kind");
            }
            patch::strategic_merge(&mut v, &c);
            let mut set = managed::changed_fields(None, &c);
            if is_status {
                set.retain(|k, _| k == "f:status");
            }
            apply_set = Some(set);
            v
        }
    };
    // Optimistic concurrency.
    let new_rv = meta_str(&new_v, "resourceVersion").to_string();
    if !new_rv.is_empty() && new_rv != meta_str(&old, "resourceVersion") {
        return Err(ApiError::conflict(res.plural(), res.group(), &name));
    }
    if !new_v.is_object() {
        return Err(ApiError::bad_request("the object must be a JSON object"));
    }
    // Convert to hub form.
    if let Value::Object(m) = &mut new_v {
        m.remove("apiVersion");
        m.remove("kind");
        if res == Res::Pcr
            && let Some(spec) = m.get_mut("spec")
        {
            resources::pcr_spec_from_version(spec, &t.version, md, old.get("spec"));
        }
    }
    // Managed fields (computed before the strategy resets anything).
    let mut old_cmp = (*old).clone();
    strip_meta_server_fields(&mut old_cmp);
    let mut new_cmp = new_v.clone();
    strip_meta_server_fields(&mut new_cmp);
    let (set, operation) = match apply_set {
        Some(s) => (s, "Apply"),
        None => {
            let mut s = managed::changed_fields(Some(&old_cmp), &new_cmp);
            if is_status {
                s.retain(|k, _| k == "f:status");
            }
            (s, "Update")
        }
    };
    // Server-managed metadata is kept from the stored object.
    let mut new_obj = new_v;
    {
        let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let new_meta = new_obj
            .get("metadata")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let mut meta = if is_status {
            old_meta.clone()
        } else {
            new_meta
        };
        if let Value::Object(m) = &mut meta {
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "resourceVersion",
                "generation",
                "managedFields",
                "deletionTimestamp",
            ] {
                match old_meta.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
        }
        new_obj["metadata"] = meta;
    }
    let mf_changed = managed::record(
        &mut new_obj,
        &manager,
        operation,
        &res.api_version(&t.version),
        t.sub.as_deref(),
        &set,
        &now_s,
        operation == "Apply",
    );
    let _ = mf_changed;

    // Strategy.
    let mut status_outcome = None;
    match (res, is_status) {
        (Res::Pcr, true) => {
            status_outcome = pcr_status_strategy(shared, user, t, &name, &old, &mut new_obj, now)?;
        }
        (Res::Pcr, false) => pcr_update_strategy(user, t, &name, &old, &mut new_obj)?,
        (Res::Ctb, _) => ctb_update_strategy(shared, user, t, &name, &old, &mut new_obj)?,
        _ => {
            if let Some(Value::Object(m)) = new_obj.get("metadata") {
                let mut errs = validate_meta_labels(m);
                if res == Res::ConfigMap {
                    errs.extend(crate::emulator::configmaps::validate(
                        &name,
                        &new_obj,
                        Some(&*old),
                    ));
                }
                if !errs.is_empty() {
                    return Err(ApiError::invalid(res.kind(), res.group(), &name, errs));
                }
            }
            if is_status {
                let status = new_obj.get("status").cloned();
                new_obj = (*old).clone();
                if let Some(s) = status {
                    new_obj["status"] = s;
                }
            } else if res.has_status() {
                new_obj["status"] = old.get("status").cloned().unwrap_or(Value::Null);
            }
        }
    }

    // No-op?
    let mut old_nometa = (*old).clone();
    let mut new_nometa = new_obj.clone();
    for v in [&mut old_nometa, &mut new_nometa] {
        if let Some(Value::Object(m)) = v.get_mut("metadata") {
            m.remove("resourceVersion");
        }
    }
    let stored = if old_nometa == new_nometa || r.dry_run() {
        if res == Res::Pcr && is_status {
            shared.count(|c| c.status_writes_noop += 1);
        }
        if r.dry_run() {
            Arc::new(new_obj)
        } else {
            old.clone()
        }
    } else {
        st.put(res, &ns, &name, new_obj)
    };
    // Counted before the store lock goes: a reader that sees the settled object also sees it
    // counted (tests poll the objects, then read the counters).
    if let Some(s) = status_outcome {
        shared.count(|c| {
            c.status_writes_accepted += 1;
            if s.is_issued() {
                c.issued += 1;
            } else if s.is_denied() {
                c.denied += 1;
            } else if s.is_failed() {
                c.failed += 1;
            }
        });
    }
    drop(st);
    if res == Res::Ctb {
        shared.count(|c| c.ctb_writes_accepted += 1);
    }
    Ok(json_response(
        200,
        &resources::to_version(res, &stored, &t.version, md),
    ))
}
