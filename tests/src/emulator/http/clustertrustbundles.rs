//! ClusterTrustBundle admission: spec decoding, validation, the `attest` check, create and
//! the update strategy.

use super::RespBody;
use super::create::{decode_err, generated_name, new_metadata, store_new, validate_meta_labels};
use super::routing::Target;
use super::server::Req;
use crate::emulator::auth::UserInfo;
use crate::emulator::errors::{ApiError, FieldError};
use crate::emulator::managed;
use crate::emulator::pcr;
use crate::emulator::resources::Res;
use crate::emulator::store::meta_str;
use crate::emulator::{Shared, read};
use hyper::Response;
use serde_json::{Map, Value, json};
use std::sync::Arc;

fn ctb_spec(v: &Value, version: &str) -> Result<(String, String), ApiError> {
    let s = v.get("spec").cloned().unwrap_or(Value::Null);
    let get = |k: &str| -> Result<String, ApiError> {
        match s.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(x)) => Ok(x.clone()),
            Some(_) => Err(decode_err(
                Res::Ctb,
                version,
                &format!(
                    "json: cannot unmarshal into Go struct field ClusterTrustBundleSpec.spec.{k} of type string"
                ),
            )),
        }
    };
    Ok((get("signerName")?, get("trustBundle")?))
}

fn ctb_spec_json(signer: &str, bundle: &str) -> Value {
    let mut m = Map::new();
    if !signer.is_empty() {
        m.insert("signerName".into(), json!(signer));
    }
    m.insert("trustBundle".into(), json!(bundle));
    Value::Object(m)
}

fn validate_ctb(
    name: &str,
    meta: &Value,
    signer: &str,
    bundle: &str,
    parse_bundle: bool,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        for m in crate::emulator::names::validate_ctb_name(signer, name) {
            errs.push(FieldError::invalid_str("metadata.name", name, m));
        }
    }
    if !meta_str(meta, "namespace").is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    if let Some(Value::Object(m)) = meta.get("metadata") {
        errs.extend(validate_meta_labels(m));
    }
    if !signer.is_empty() {
        errs.extend(crate::emulator::names::validate_signer_name(
            "spec.signerName",
            signer,
        ));
    }
    if parse_bundle {
        errs.extend(pcr::validate_trust_bundle(bundle));
    }
    errs
}

fn attest(shared: &Shared, user: &UserInfo, name: &str, signer: &str) -> Result<(), ApiError> {
    if signer.is_empty() || read(&shared.auth).authorized_for_signer(user, "attest", signer) {
        return Ok(());
    }
    Err(ApiError::forbidden(
        Res::Ctb.plural(),
        Res::Ctb.group(),
        name,
        &format!(
            "user not permitted to attest for signerName {}",
            crate::emulator::errors::go_quote(signer)
        ),
    ))
}

pub(super) fn create_ctb(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
    body: &Value,
    mut name: String,
) -> Result<Response<RespBody>, ApiError> {
    let (signer, bundle) = ctb_spec(body, &t.version)?;
    let generate = meta_str(body, "generateName").to_string();
    if name.is_empty() && !generate.is_empty() {
        name = generated_name(shared, Res::Ctb, "", &generate);
    }
    let errs = validate_ctb(&name, body, &signer, &bundle, true);
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "ClusterTrustBundle",
            Res::Ctb.group(),
            &name,
            errs,
        ));
    }
    attest(shared, user, &name, &signer)?;
    let mut meta = new_metadata(shared, body.get("metadata"), "", &name);
    meta.insert("managedFields".into(), json!([]));
    let spec = ctb_spec_json(&signer, &bundle);
    let mut obj = json!({"metadata": Value::Object(meta), "spec": spec});
    let set = managed::changed_fields(None, &json!({"spec": obj["spec"].clone()}));
    managed::record(
        &mut obj,
        &r.manager(),
        "Update",
        &Res::Ctb.api_version(&t.version),
        None,
        &set,
        &pcr::fmt_time(shared.now()),
        false,
    );
    let resp = store_new(shared, r, t, "", &name, obj)?;
    shared.count(|c| c.ctb_writes_accepted += 1);
    Ok(resp)
}

fn only_gc_fields_changed(old: &Value, new: &Value) -> bool {
    let norm = |v: &Value| {
        let mut v = v.clone();
        if let Some(Value::Object(m)) = v.get_mut("metadata") {
            for k in [
                "ownerReferences",
                "finalizers",
                "managedFields",
                "resourceVersion",
            ] {
                m.remove(k);
            }
        }
        v
    };
    norm(old) == norm(new)
}

/// The update strategy: the signer name is immutable, a changed bundle is parsed again, and
/// anything beyond garbage-collection fields needs `attest`.
pub(super) fn ctb_update_strategy(
    shared: &Shared,
    user: &UserInfo,
    t: &Target,
    name: &str,
    old: &Value,
    new_obj: &mut Value,
) -> Result<(), ApiError> {
    let (signer, bundle) = ctb_spec(new_obj, &t.version)?;
    let (old_signer, old_bundle) = ctb_spec(old, &t.version)?;
    let mut errs = validate_ctb(name, new_obj, &signer, &bundle, bundle != old_bundle);
    if signer != old_signer {
        errs.push(FieldError::invalid_str(
            "spec.signerName",
            &signer,
            "field is immutable",
        ));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "ClusterTrustBundle",
            Res::Ctb.group(),
            name,
            errs,
        ));
    }
    new_obj["spec"] = ctb_spec_json(&signer, &bundle);
    if !only_gc_fields_changed(old, new_obj) {
        attest(shared, user, name, &signer)?;
    }
    Ok(())
}
