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
use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey, Outcome, PodMetadata, SignerPolicy};
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
            // As the controller: the policy of the namespace's tenant, if any.
            Plan::Sign(policy, pcr) => Ok(match policy.resolve(&pcr.namespace) {
                Ok((policy, _)) => request::sign_pcr(
                    &policy,
                    ca,
                    pcr,
                    request::Facts {
                        namespace_labels,
                        pod,
                        service_sans: None,
                    },
                    now,
                ),
                Err(refusal) => Outcome::of_refusal(refusal),
            }),
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
/// A Pod read from a file (`kubectl get pod NAME -o yaml`): what podca's read of the request's
/// pod would give.
#[derive(Debug, Clone)]
pub struct PodSample {
    pub name: String,
    pub uid: Option<String>,
    pub metadata: PodMetadata,
}

impl PodSample {
    /// Reads a Pod object; the error names the field.
    pub fn from_json(doc: &Value) -> Result<Self, SampleError> {
        let bad = |why: String| SampleError(why);
        if doc.get("kind").and_then(Value::as_str) != Some("Pod") {
            return Err(bad(
                "not a Pod (kind: Pod; `kubectl get pod NAME -o yaml` prints one)".into(),
            ));
        }
        let meta = &doc["metadata"];
        let name = meta["name"]
            .as_str()
            .ok_or_else(|| bad("metadata.name is missing".into()))?
            .to_owned();
        let map = |field: &str| -> Result<BTreeMap<String, String>, SampleError> {
            match meta.get(field) {
                None | Some(Value::Null) => Ok(BTreeMap::new()),
                Some(m) => serde_json::from_value(m.clone())
                    .map_err(|e| bad(format!("metadata.{field}: {e}"))),
            }
        };
        Ok(PodSample {
            name,
            uid: meta["uid"].as_str().map(str::to_owned),
            metadata: PodMetadata {
                labels: map("labels")?,
                annotations: map("annotations")?,
            },
        })
    }
}

/// The `--pod` file shows another pod than the request's: podca would find no such pod. Its
/// Display is the message of the PolicyPodNotFound denial podca would answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--pod is pod {file_pod} (UID {file_uid}), not the request's pod {name} (UID {uid}): podca \
     would find no such pod"
)]
pub struct OtherPod {
    file_pod: String,
    file_uid: String,
    name: String,
    uid: String,
}

/// Why the rules could not see the request's pod: podca would deny `PolicyPodNotFound` with
/// this as the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodRefusal {
    #[error(transparent)]
    Other(#[from] OtherPod),
    /// The request names no pod (a token bound to none, …): the rules fail closed.
    #[error("{}", podca_signer::rules::NO_POD)]
    NoPod,
}

/// What the rules would see of the request's pod.
pub fn pod_for<'a>(
    pod: Option<&'a PodSample>,
    (name, uid): (Option<&str>, Option<&str>),
    policy: Option<&SignerPolicy>,
    notes: &mut Vec<String>,
) -> Result<Option<&'a PodMetadata>, PodRefusal> {
    if !policy.is_some_and(SignerPolicy::rules_use_pod_facts) {
        if pod.is_some() {
            notes.push(
                "--pod was not used: no rule of this signer reads pod (or pod_facts is off)".into(),
            );
        }
        return Ok(None);
    }
    let (Some(name), Some(uid)) = (name, uid) else {
        return Err(PodRefusal::NoPod);
    };
    let Some(file) = pod else {
        notes.push(
            "no --pod: the rules that read pod.labels and pod.annotations saw empty maps \
             (podca reads the pod)"
                .into(),
        );
        return Ok(None);
    };
    if file.name != name || file.uid.as_deref().is_some_and(|u| u != uid) {
        return Err(PodRefusal::Other(OtherPod {
            file_pod: file.name.clone(),
            file_uid: file.uid.clone().unwrap_or_else(|| "not given".into()),
            name: name.to_owned(),
            uid: uid.to_owned(),
        }));
    }
    if file.uid.is_none() {
        notes.push("--pod has no metadata.uid: its UID was not compared with the request's".into());
    }
    Ok(Some(&file.metadata))
}

/// Namespace → labels, from a map, a Namespace or a list of Namespaces.
pub type LabelsSample = BTreeMap<String, BTreeMap<String, String>>;

/// Reads namespace labels: a map namespace → labels, a Namespace, or a list of Namespaces
/// (`kubectl get ns -o yaml`); the error names the field.
pub fn labels_from_json(doc: Value) -> Result<LabelsSample, SampleError> {
    let bad = |why: String| SampleError(why);
    let from_namespace =
        |item: &Value, at: &str| -> Result<(String, BTreeMap<String, String>), SampleError> {
            let name = item["metadata"]["name"]
                .as_str()
                .ok_or_else(|| bad(format!("{at}metadata.name is missing")))?;
            let labels = match item["metadata"].get("labels") {
                None | Some(Value::Null) => BTreeMap::new(),
                Some(l) => serde_json::from_value(l.clone())
                    .map_err(|e| bad(format!("{at}metadata.labels: {e}")))?,
            };
            Ok((name.to_owned(), labels))
        };
    match doc.get("kind").and_then(Value::as_str) {
        Some("Namespace") => Ok(LabelsSample::from([from_namespace(&doc, "")?])),
        Some("List" | "NamespaceList") => {
            let items = doc["items"]
                .as_array()
                .ok_or_else(|| bad("items is missing".into()))?;
            items
                .iter()
                .enumerate()
                .map(|(i, item)| from_namespace(item, &format!("items[{i}].")))
                .collect()
        }
        Some(other) => Err(bad(format!(
            "kind {other:?}: give a map namespace → labels, a Namespace or a NamespaceList"
        ))),
        None => serde_json::from_value(doc).map_err(|e| {
            bad(format!(
                "{e} (expected a map namespace → labels, e.g. {{\"shop\": {{\"tier\": \"prod\"}}}})"
            ))
        }),
    }
}

/// What the rules would see as the namespace's labels, and a note when it is not from the file.
pub fn labels_for<'a>(
    labels: Option<&'a LabelsSample>,
    namespace: &str,
    policy: Option<&SignerPolicy>,
    notes: &mut Vec<String>,
) -> Option<&'a BTreeMap<String, String>> {
    let read = policy.is_some_and(SignerPolicy::rules_use_namespace_labels);
    let found = labels.and_then(|l| l.get(namespace));
    if read && found.is_none() {
        notes.push(match labels {
            None => "no --namespace-labels: the rules that read namespaceObject.metadata.labels \
                     saw an empty map"
                .into(),
            Some(_) => format!(
                "namespace {namespace:?} is not in --namespace-labels: the rules that read \
                 namespaceObject.metadata.labels saw an empty map"
            ),
        });
    }
    found
}

/// A CA that never limits the answer: valid from a year before `now` for 200 years.
pub fn throwaway_ca(now: OffsetDateTime) -> Result<IssuingCa, SampleError> {
    let key =
        MemoryKey::generate(CaAlgorithm::EcdsaP256).map_err(|e| SampleError(e.to_string()))?;
    IssuingCa::self_signed_root(
        std::sync::Arc::new(key),
        "podca policy test (throwaway)",
        now - time::Duration::days(365),
        time::Duration::days(200 * 365),
    )
    .map_err(|e| {
        SampleError(format!(
            "cannot make the throwaway CA for --now (is it a time X.509 can hold?): {e}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules that read the pod and a request that names none: the same denial as the servers'
    /// (`podca_signer::rules::NO_POD`), not a verdict over empty maps.
    #[test]
    fn a_request_without_a_pod_fails_closed_under_pod_rules() {
        let config = podca_authority::config::Config::parse(
            "[signers.\"example.com/a\"]\ntrust_domain = \"a.test\"\npod_facts = true\n\
             [[signers.\"example.com/a\".rules]]\nname = \"canary\"\n\
             require = \"pod.labels['track'] == 'canary'\"\nreason = \"NotCanary\"",
        )
        .unwrap();
        let policy = &config.signers["example.com/a"];
        let mut notes = Vec::new();
        let refused = pod_for(None, (None, None), Some(policy), &mut notes).unwrap_err();
        assert_eq!(refused, PodRefusal::NoPod);
        assert_eq!(refused.to_string(), podca_signer::rules::NO_POD);
        // A signer whose rules read no pod: nothing to refuse.
        let plain = SignerPolicy::permissive("a.test");
        assert_eq!(
            pod_for(None, (None, None), Some(&plain), &mut notes),
            Ok(None)
        );
    }
}
