//! What the controller would answer to one PodCertificateRequest, without a cluster: the
//! offline half of `podca policy test`.
//!
//! A sample goes through the same steps as a reconcile: the same conversion
//! (`Pcr::from_v1`/`Pcr::from_v1beta1`), the same plan (`plan::plan`: unknown signer, legacy
//! key hidden by v1) and the same signing call (`request::sign_pcr`). What the cluster alone
//! knows is left out: the sample's `status` is ignored (the spec is decided anew), and a v1
//! object that hides a legacy key cannot be re-read through v1beta1 here.

use std::collections::BTreeMap;

use k8s_openapi::api::certificates::{v1, v1beta1};
use podca_signer::{IssuingCa, Outcome, PodMetadata, SignerPolicy};
use serde_json::Value;
use time::OffsetDateTime;

use crate::decide;
use crate::plan::{self, Facts, Plan, Read};
use crate::request::{self, Pcr};

/// A sample that cannot be decided; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SampleError(pub String);

/// A PodCertificateRequest read from a file (`kubectl get pcr NAME -o yaml`, or a recorded
/// object).
#[derive(Debug, Clone)]
pub struct PcrSample(Pcr);

/// The `metadata.uid` a sample without one gets: the decision never reads it.
const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

impl PcrSample {
    /// Reads a PodCertificateRequest object (`certificates.k8s.io/v1` or `v1beta1`).
    pub fn from_json(mut value: Value) -> Result<Self, SampleError> {
        let api_version = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        // The decision never reads the uid; a hand-written sample need not invent one.
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut)
            && !meta.contains_key("uid")
        {
            meta.insert("uid".into(), Value::from(PLACEHOLDER_UID));
        }
        let invalid = |e: serde_json::Error| {
            SampleError(format!(
                "not a valid {api_version} PodCertificateRequest: {e}"
            ))
        };
        let pcr = match api_version.as_str() {
            "certificates.k8s.io/v1" => Pcr::from_v1(
                serde_json::from_value::<v1::PodCertificateRequest>(value).map_err(invalid)?,
            ),
            "certificates.k8s.io/v1beta1" => Pcr::from_v1beta1(
                serde_json::from_value::<v1beta1::PodCertificateRequest>(value).map_err(invalid)?,
            ),
            other => {
                return Err(SampleError(format!(
                    "apiVersion {other:?}: a PodCertificateRequest is certificates.k8s.io/v1 or \
                     certificates.k8s.io/v1beta1"
                )));
            }
        };
        pcr.map(PcrSample)
            .ok_or_else(|| SampleError("metadata.namespace and metadata.name are required".into()))
    }

    pub fn signer_name(&self) -> &str {
        &self.0.signer_name
    }

    /// Decides the request under another signer's name (`--signer`).
    pub fn set_signer_name(&mut self, name: &str) {
        name.clone_into(&mut self.0.signer_name);
    }

    pub fn namespace(&self) -> &str {
        &self.0.namespace
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn service_account(&self) -> &str {
        &self.0.service_account
    }

    pub fn pod_name(&self) -> &str {
        &self.0.pod_name
    }

    pub fn pod_uid(&self) -> &str {
        &self.0.pod_uid
    }

    pub fn node_name(&self) -> &str {
        &self.0.node_name
    }

    /// `certificates.k8s.io/v1` or `certificates.k8s.io/v1beta1`.
    pub fn api_version(&self) -> &'static str {
        self.0.version.as_str()
    }

    /// `Issued`, `Denied` or `Failed` when the object was already settled.
    pub fn terminal(&self) -> Option<&str> {
        self.0.terminal.as_deref()
    }

    /// The controller's answer under `signers`, signed by `ca` at `now`. `namespace_labels` are
    /// what the namespace watch would give for the PCR's namespace, `pod` what the controller's
    /// read of the pod would give (signers with `pod_facts`).
    pub fn decide(
        &self,
        signers: &BTreeMap<String, SignerPolicy>,
        ca: &IssuingCa,
        namespace_labels: Option<&BTreeMap<String, String>>,
        pod: Option<&PodMetadata>,
        now: OffsetDateTime,
    ) -> Result<Outcome, SampleError> {
        let mut pcr = self.0.clone();
        pcr.terminal = None;
        match plan::plan(Facts {
            read: Read::Found(&pcr),
            policies: signers,
            cached: None,
            legacy_readable: true,
            now,
        }) {
            Plan::Write(write) => Ok(write.outcome),
            Plan::Sign(policy, pcr) => Ok(request::sign_pcr(
                policy,
                ca,
                pcr,
                namespace_labels,
                pod,
                now,
            )),
            Plan::ReadThroughV1beta1(_) => Err(SampleError(format!(
                "spec.stubPKCS10Request is empty, and a {} object shows no other key: a \
                 legacy pkixPublicKey/proofOfPossession shows only through v1beta1 (`kubectl \
                 get podcertificaterequests.v1beta1.certificates.k8s.io {} -n {} -o yaml`)",
                pcr.version.as_str(),
                pcr.name,
                pcr.namespace
            ))),
            // Not reachable for a pending read with nothing cached; answered anyway.
            Plan::Skip(_) | Plan::Retry(_) | Plan::ResendCached(_) => Err(SampleError(
                "the controller would not sign this object".into(),
            )),
        }
    }
}

/// The condition (type, reason, message) the controller would write for `outcome`: the same
/// status patch, so reasons and messages are sanitized and truncated as in the cluster. `None`
/// for a transient outcome (the PCR would stay pending).
pub fn condition(outcome: &Outcome, now: OffsetDateTime) -> Option<(String, String, String)> {
    let (_, patch) = decide::status_patch(outcome, now)?;
    let c = &patch["status"]["conditions"][0];
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Some((s("type"), s("reason"), s("message")))
}
