//! PodCertificateRequest admission: create (defaults, validation, NodeRestriction) and the
//! update strategies of the resource and its `/status`.

use super::create::{
    decode_err, ensure_namespace, generated_name, new_metadata, store_new, validate_meta_labels,
};
use super::routing::Target;
use super::server::Req;
use super::{RespBody, mode};
use crate::emulator::auth::UserInfo;
use crate::emulator::errors::{ApiError, FieldError};
use crate::emulator::managed;
use crate::emulator::pcr::{self, KeyRules, PcrSpec, PcrStatus};
use crate::emulator::resources::{self, ApiMode, Res};
use crate::emulator::store::meta_str;
use crate::emulator::{Shared, lock, read};
use hyper::Response;
use serde_json::{Value, json};
use std::sync::Arc;
use time::OffsetDateTime;

fn key_rules(mode: ApiMode, version: &str) -> KeyRules {
    match (mode, version) {
        (_, "v1") => KeyRules::StubOnly,
        (ApiMode::V1Beta1Legacy, _) => KeyRules::LegacyOnly,
        _ => KeyRules::StubOrLegacy,
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn create_pcr(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
    body: &Value,
    ns: &str,
    mut name: String,
    generate: &str,
) -> Result<Response<RespBody>, ApiError> {
    let md = mode(shared);
    let mut spec_json = body.get("spec").cloned().unwrap_or(Value::Null);
    resources::pcr_spec_from_version(&mut spec_json, &t.version, md, None);
    let mut spec =
        PcrSpec::from_json(Some(&spec_json)).map_err(|e| decode_err(Res::Pcr, &t.version, &e))?;
    if spec.max_expiration_seconds.is_none() {
        spec.max_expiration_seconds = Some(pcr::DEFAULT_MAX_EXPIRATION);
    }
    if name.is_empty() && !generate.is_empty() {
        name = generated_name(shared, Res::Pcr, ns, generate);
    }
    // Mutating admission: NodeRestriction.
    if let Some(node) = user.node_name() {
        node_restriction(shared, user, node, ns, &name, &spec, md)?;
    }
    ensure_namespace(shared, ns)?;
    let errs = pcr::validate_create(
        &name,
        generate,
        &spec,
        key_rules(md, &t.version),
        shared.config.pod_certificate_mldsa,
    );
    let mut meta = new_metadata(shared, body.get("metadata"), ns, &name);
    let mut errs = errs;
    errs.extend(validate_meta_labels(&meta));
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "PodCertificateRequest",
            Res::Pcr.group(),
            &name,
            errs,
        ));
    }
    meta.insert("managedFields".into(), json!([]));
    let mut obj = json!({"metadata": Value::Object(meta), "spec": spec.to_json(), "status": {}});
    let set = managed::changed_fields(None, &json!({"spec": spec_json_for_fields(&spec)}));
    managed::record(
        &mut obj,
        &r.manager(),
        "Update",
        &Res::Pcr.api_version(&t.version),
        None,
        &set,
        &pcr::fmt_time(shared.now()),
        false,
    );
    let resp = store_new(shared, r, t, ns, &name, obj)?;
    shared.count(|c| c.pcr_created += 1);
    Ok(resp)
}

fn spec_json_for_fields(spec: &PcrSpec) -> Value {
    let mut v = spec.to_json();
    if let Value::Object(m) = &mut v {
        m.retain(|_, x| !x.is_null());
    }
    v
}

/// NodeRestriction admission for PCR creates by nodes (rule 9).
fn node_restriction(
    shared: &Shared,
    user: &UserInfo,
    node: &str,
    ns: &str,
    name: &str,
    spec: &PcrSpec,
    md: ApiMode,
) -> Result<(), ApiError> {
    let forbid = |msg: String| ApiError::forbidden(Res::Pcr.plural(), Res::Pcr.group(), name, &msg);
    let pod_ref = format!("{ns}/{}", spec.pod_name);
    let q = crate::emulator::errors::go_quote;
    if spec.node_name != node {
        return Err(forbid(format!(
            "PodCertificateRequest.Spec.NodeName={}, which is not the requesting node {}",
            q(&spec.node_name),
            q(node)
        )));
    }
    let st = lock(&shared.store);
    let Some(node_obj) = st.get(Res::Node, "", &spec.node_name) else {
        return Err(ApiError::plain(format!(
            "while retrieving node {} named in the PodCertificateRequest: nodes {} not found",
            q(&spec.node_name),
            q(&spec.node_name)
        )));
    };
    if meta_str(&node_obj, "uid") != spec.node_uid {
        return Err(ApiError::plain(format!(
            "PodCertificateRequest for pod {} names node UID {}, inconsistent with the running node ({})",
            q(&pod_ref),
            q(&spec.node_uid),
            q(meta_str(&node_obj, "uid"))
        )));
    }
    let Some(pod) = st.get(Res::Pod, ns, &spec.pod_name) else {
        return Err(ApiError::plain(format!(
            "while retrieving pod {} named in the PodCertificateRequest: pods {} not found",
            q(&pod_ref),
            q(&spec.pod_name)
        )));
    };
    if meta_str(&pod, "uid") != spec.pod_uid {
        return Err(ApiError::plain(format!(
            "PodCertificateRequest for pod {} contains pod UID ({}) which differs from running pod {}",
            q(&pod_ref),
            q(&spec.pod_uid),
            q(meta_str(&pod, "uid"))
        )));
    }
    let pod_node = pod["spec"]["nodeName"].as_str().unwrap_or("");
    if pod_node != node {
        return Err(forbid(format!(
            "pod {} is not running on node {}",
            q(&pod_ref),
            q(node)
        )));
    }
    if pod["metadata"]["annotations"]
        .get("kubernetes.io/config.mirror")
        .is_some()
    {
        return Err(forbid(format!("pod {} is a mirror pod", q(&pod_ref))));
    }
    let pod_sa = pod["spec"]["serviceAccountName"].as_str().unwrap_or("");
    if spec.service_account_name != pod_sa {
        return Err(forbid(format!(
            "PodCertificateRequest for pod {} contains serviceAccountName ({}) that differs from running pod ({})",
            q(&pod_ref),
            q(&spec.service_account_name),
            q(pod_sa)
        )));
    }
    let sa_ref = format!("{ns}/{}", spec.service_account_name);
    let Some(sa) = st.get(Res::ServiceAccount, ns, &spec.service_account_name) else {
        return Err(ApiError::plain(format!(
            "while retrieving service account {} named in the PodCertificateRequest: serviceaccounts {} not found",
            q(&sa_ref),
            q(&spec.service_account_name)
        )));
    };
    if meta_str(&sa, "uid") != spec.service_account_uid {
        return Err(ApiError::plain(format!(
            "PodCertificateRequest for pod {} names service account UID {}, which differs from the running service account ({})",
            q(&pod_ref),
            q(&spec.service_account_uid),
            q(meta_str(&sa, "uid"))
        )));
    }
    drop(st);
    // 1.37 (PR #140006): the pod must mount a podCertificate projection for
    // the signer, or the node needs `request-podcertificate-signer`.
    if matches!(md, ApiMode::V1Only | ApiMode::V1AndV1Beta1) {
        let mounts = pod["spec"]["volumes"].as_array().is_some_and(|vols| {
            vols.iter().any(|v| {
                v["projected"]["sources"].as_array().is_some_and(|srcs| {
                    srcs.iter()
                        .any(|s| s["podCertificate"]["signerName"] == spec.signer_name.as_str())
                })
            })
        });
        if !mounts
            && !read(&shared.auth).authorized_for_signer(
                user,
                "request-podcertificate-signer",
                &spec.signer_name,
            )
        {
            return Err(forbid(format!(
                "pod {} does not have a podCertificate projected volume source for signer {}",
                q(&pod_ref),
                q(&spec.signer_name)
            )));
        }
    }
    Ok(())
}

/// The `/status` strategy: the spec is kept, the new status validated, and a change needs
/// `sign` on the signer name. Returns the new status when it changed.
pub(super) fn pcr_status_strategy(
    shared: &Shared,
    user: &UserInfo,
    t: &Target,
    name: &str,
    old: &Value,
    new_obj: &mut Value,
    now: OffsetDateTime,
) -> Result<Option<PcrStatus>, ApiError> {
    new_obj["spec"] = old.get("spec").cloned().unwrap_or(Value::Null);
    let spec = PcrSpec::from_json(old.get("spec")).map_err(ApiError::internal)?;
    let old_status = PcrStatus::from_json(old.get("status")).map_err(ApiError::internal)?;
    let new_status = PcrStatus::from_json(new_obj.get("status"))
        .map_err(|e| decode_err(Res::Pcr, &t.version, &e))?;
    let errs = pcr::validate_status_update(&new_status, &old_status, &spec, now);
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "PodCertificateRequest",
            Res::Pcr.group(),
            name,
            errs,
        ));
    }
    if new_status != old_status {
        if !read(&shared.auth).authorized_for_signer(user, "sign", &spec.signer_name) {
            return Err(ApiError::invalid(
                "PodCertificateRequest",
                Res::Pcr.group(),
                name,
                vec![FieldError::forbidden(
                    "spec.signerName",
                    format!(
                        "User {} is not permitted to \"sign\" for signer {}",
                        crate::emulator::errors::go_quote(&user.name),
                        crate::emulator::errors::go_quote(&spec.signer_name)
                    ),
                )],
            ));
        }
        new_obj["status"] = new_status.to_json();
        Ok(Some(new_status))
    } else {
        new_obj["status"] = old.get("status").cloned().unwrap_or_else(|| json!({}));
        Ok(None)
    }
}

/// The main-resource strategy: nodes may not update, the status is kept, the spec is
/// immutable (metadata may change).
pub(super) fn pcr_update_strategy(
    user: &UserInfo,
    t: &Target,
    name: &str,
    old: &Value,
    new_obj: &mut Value,
) -> Result<(), ApiError> {
    if user.node_name().is_some() {
        return Err(ApiError::forbidden(
            Res::Pcr.plural(),
            Res::Pcr.group(),
            name,
            "unexpected operation UPDATE",
        ));
    }
    new_obj["status"] = old.get("status").cloned().unwrap_or_else(|| json!({}));
    let old_spec = PcrSpec::from_json(old.get("spec")).map_err(ApiError::internal)?;
    let new_spec = PcrSpec::from_json(new_obj.get("spec"))
        .map_err(|e| decode_err(Res::Pcr, &t.version, &e))?;
    let mut errs = Vec::new();
    if let Some(Value::Object(m)) = new_obj.get("metadata") {
        errs.extend(validate_meta_labels(m));
    }
    errs.extend(pcr::validate_update(&new_spec, &old_spec));
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "PodCertificateRequest",
            Res::Pcr.group(),
            name,
            errs,
        ));
    }
    new_obj["spec"] = old.get("spec").cloned().unwrap_or(Value::Null);
    Ok(())
}
