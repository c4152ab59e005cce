//! Get and list (selectors, `resourceVersionMatch=Exact`, pagination with `continue`).

use super::routing::Target;
use super::server::Req;
use super::{RespBody, json_response, mode};
use crate::emulator::errors::ApiError;
use crate::emulator::resources::{self, Res};
use crate::emulator::selectors::{FieldSelector, LabelSelector};
use crate::emulator::store::meta_str;
use crate::emulator::{Shared, lock};
use hyper::Response;
use serde_json::{Value, json};
use std::sync::Arc;

pub(super) fn get(shared: &Shared, t: &Target) -> Result<Response<RespBody>, ApiError> {
    let ns = t.namespace.as_deref().unwrap_or("");
    let name = t.name.as_deref().unwrap_or("");
    let obj = lock(&shared.store)
        .get(t.res, ns, name)
        .ok_or_else(|| ApiError::not_found(t.res.plural(), t.res.group(), name))?;
    Ok(json_response(
        200,
        &resources::to_version(t.res, &obj, &t.version, mode(shared)),
    ))
}

pub(super) fn selectors(r: &Req, res: Res) -> Result<(FieldSelector, LabelSelector), ApiError> {
    let f = FieldSelector::parse(r.q("fieldSelector").unwrap_or(""), res)
        .map_err(ApiError::bad_request)?;
    let l =
        LabelSelector::parse(r.q("labelSelector").unwrap_or("")).map_err(ApiError::bad_request)?;
    Ok((f, l))
}

/// An object as `meta.k8s.io/v1` PartialObjectMetadata: its metadata, nothing else.
pub(super) fn partial_metadata(obj: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": obj["metadata"],
    })
}

/// kube-apiserver's answer (410 Expired) to a continue token whose revision was compacted.
const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a \
    consistent list result. You can start a new list without the continue parameter.";

pub(super) fn list(shared: &Shared, r: &Req, t: &Target) -> Result<Response<RespBody>, ApiError> {
    use base64::Engine as _;
    let metadata_only = r.metadata_only();
    if metadata_only {
        shared.count(|c| c.metadata_only_requests += 1);
    }
    let (fsel, lsel) = selectors(r, t.res)?;
    let st = lock(&shared.store);
    let current = st.current_rv();
    if let (Some(rv), Some("Exact")) = (r.q("resourceVersion"), r.q("resourceVersionMatch")) {
        let rv: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
        if rv < st.compacted_rv() {
            return Err(ApiError::expired(
                "The resourceVersion for the provided list is too old.",
            ));
        }
    }
    let ns_filter = t
        .namespace
        .as_deref()
        .or_else(|| fsel.required("metadata.namespace"));
    // A continue token carries the first page's resourceVersion: every later page is read as
    // the store was then (kube-apiserver reads them from etcd at that revision), and the list
    // reports that resourceVersion, so a watch started from it misses nothing created meanwhile.
    let (start_after, snapshot) = match r.q("continue").filter(|c| !c.is_empty()) {
        Some(c) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(c)
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            let v: Value = serde_json::from_slice(&raw)
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            let start = v["start"].as_str().unwrap_or("");
            let (ns, name) = start.split_once('/').unwrap_or((start, ""));
            let at = v["rv"]
                .as_u64()
                .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
            (Some((ns.to_string(), name.to_string())), Some(at))
        }
        None => (None, None),
    };
    let list_rv = snapshot.unwrap_or(current);
    let limit: usize = r.q("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    // kube-apiserver only counts the rest when no selector filters it.
    let counts_rest = r.q("fieldSelector").unwrap_or("").is_empty()
        && r.q("labelSelector").unwrap_or("").is_empty();
    // One page is read from the continue key on, not the whole type: a paginated list of n
    // objects costs O(n), not O(n) per page.
    let objects: Box<dyn Iterator<Item = Arc<Value>> + '_> = match snapshot {
        None => Box::new(
            st.list_after(t.res, ns_filter, start_after.as_ref())
                .cloned(),
        ),
        Some(at) => Box::new(
            st.list_at(t.res, ns_filter, start_after.as_ref(), at)
                .ok_or_else(|| ApiError::expired(CONTINUE_EXPIRED))?,
        ),
    };
    let mut page = Vec::new();
    let mut more = false;
    let mut remaining = 0u64;
    for o in objects {
        if !fsel.matches(&o) || !lsel.matches(&o) {
            continue;
        }
        if limit > 0 && page.len() >= limit {
            more = true;
            remaining += 1;
            if !counts_rest {
                break;
            }
            continue;
        }
        page.push(o);
    }
    drop(st);
    let key_of = |o: &Value| format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name"));
    let next_key = page.last().filter(|_| more).map(|o| key_of(o));
    let items: Vec<Value> = page
        .iter()
        .map(|o| {
            if metadata_only {
                return partial_metadata(o);
            }
            let mut v = resources::to_version(t.res, o, &t.version, mode(shared));
            if let Value::Object(m) = &mut v {
                m.remove("apiVersion");
                m.remove("kind");
            }
            v
        })
        .collect();
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if let Some(k) = next_key {
        let token = json!({"v": "meta.k8s.io/v1", "rv": list_rv, "start": k});
        meta["continue"] =
            json!(base64::engine::general_purpose::STANDARD.encode(token.to_string()));
        if counts_rest {
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    let (kind, api_version) = if metadata_only {
        (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        )
    } else {
        (
            format!("{}List", t.res.kind()),
            t.res.api_version(&t.version),
        )
    };
    Ok(json_response(
        200,
        &json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": meta,
            "items": items,
        }),
    ))
}
