//! Delete (with UID and resourceVersion preconditions) and deletecollection.

use super::read::selectors;
use super::routing::Target;
use super::server::Req;
use super::{RespBody, json_response, mode};
use crate::emulator::errors::ApiError;
use crate::emulator::resources;
use crate::emulator::store::meta_str;
use crate::emulator::{Shared, lock};
use hyper::Response;
use serde_json::{Value, json};
use std::sync::Arc;

pub(super) fn delete(
    shared: &Arc<Shared>,
    r: &Req,
    t: &Target,
) -> Result<Response<RespBody>, ApiError> {
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let opts: Value = if r.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&r.body).unwrap_or(Value::Null)
    };
    let mut st = lock(&shared.store);
    let Some(old) = st.get(t.res, &ns, &name) else {
        return Err(ApiError::not_found(t.res.plural(), t.res.group(), &name));
    };
    let pre = &opts["preconditions"];
    if let Some(uid) = pre["uid"].as_str()
        && uid != meta_str(&old, "uid")
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {}: Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                crate::emulator::errors::qualified(t.res.plural(), t.res.group()),
                crate::emulator::errors::go_quote(&name),
                meta_str(&old, "uid")
            ),
        ));
    }
    if let Some(rv) = pre["resourceVersion"].as_str()
        && rv != meta_str(&old, "resourceVersion")
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {}: Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in meta: {}",
                crate::emulator::errors::qualified(t.res.plural(), t.res.group()),
                crate::emulator::errors::go_quote(&name),
                meta_str(&old, "resourceVersion")
            ),
        ));
    }
    let uid = meta_str(&old, "uid").to_string();
    if !r.dry_run() {
        st.delete(t.res, &ns, &name);
    }
    drop(st);
    Ok(json_response(
        200,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "group": t.res.group(), "kind": t.res.plural(), "uid": uid},
        }),
    ))
}

pub(super) fn delete_collection(
    shared: &Arc<Shared>,
    r: &Req,
    t: &Target,
) -> Result<Response<RespBody>, ApiError> {
    let (fsel, lsel) = selectors(r, t.res)?;
    let mut st = lock(&shared.store);
    let victims: Vec<(String, String)> = st
        .list(t.res, t.namespace.as_deref())
        .iter()
        .filter(|o| fsel.matches(o) && lsel.matches(o))
        .map(|o| {
            (
                meta_str(o, "namespace").to_string(),
                meta_str(o, "name").to_string(),
            )
        })
        .collect();
    let mut items = Vec::new();
    for (ns, name) in victims {
        if let Some(o) = st.delete(t.res, &ns, &name) {
            items.push(resources::to_version(t.res, &o, &t.version, mode(shared)));
        }
    }
    let rv = st.current_rv();
    drop(st);
    Ok(json_response(
        200,
        &json!({"kind": format!("{}List", t.res.kind()), "apiVersion": t.res.api_version(&t.version), "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    ))
}
