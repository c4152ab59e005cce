//! The PodCertificateRequest as the v1 watch decodes it: the spec, and of the rest only what
//! placing it needs (uid, name, namespace, resourceVersion, creation time, whether it is
//! settled). `metadata.managedFields`, labels, annotations, and the conditions' texts and the
//! issued chain in `status` are skipped unread: with rendezvous sharding every replica watches
//! every request of its signers and owns a share, and the requests it parks for later are kept
//! without their spec (issue #45: ~30 µs a PCR per extra replica went to decoding events only to
//! park them). The spec cannot stay as raw JSON text: kube decodes watch events through serde's
//! buffered enum content, which `serde_json::value::RawValue` does not accept.

use std::borrow::Cow;

use k8s_openapi::api::certificates::v1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Deserialize;

use crate::request::ApiVersion;
use crate::request::Pcr;

/// A v1 PodCertificateRequest, decoded only as far as placing it needs.
#[derive(Debug, Clone)]
pub(crate) struct WatchedPcr {
    /// uid, name, namespace, resourceVersion and creationTimestamp only.
    metadata: ObjectMeta,
    spec: v1::PodCertificateRequestSpec,
    /// `Issued`, `Denied` or `Failed` when settled.
    terminal: Option<String>,
}

/// The wire form: serde skips every field not named here without building it.
#[derive(Deserialize)]
struct Wire {
    metadata: Meta,
    spec: v1::PodCertificateRequestSpec,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    conditions: Vec<Condition>,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

impl<'de> Deserialize<'de> for WatchedPcr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Wire {
            metadata,
            spec,
            status,
        } = Wire::deserialize(deserializer)?;
        let terminal = status.and_then(|s| {
            crate::decide::terminal_condition(
                s.conditions
                    .iter()
                    .filter(|c| c.status == "True")
                    .map(|c| c.type_.as_str()),
            )
            .map(str::to_owned)
        });
        Ok(WatchedPcr {
            metadata: ObjectMeta {
                name: metadata.name,
                namespace: metadata.namespace,
                uid: metadata.uid,
                resource_version: metadata.resource_version,
                creation_timestamp: metadata.creation_timestamp,
                ..ObjectMeta::default()
            },
            spec,
            terminal,
        })
    }
}

impl kube::Resource for WatchedPcr {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "PodCertificateRequest".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "certificates.k8s.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "podcertificaterequests".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl WatchedPcr {
    pub(crate) fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    pub(crate) fn is_settled(&self) -> bool {
        self.terminal.is_some()
    }

    /// What sharding places it by, without its spec: a lean [`Pcr`] (see [`Pcr::lean`]),
    /// which the worker re-reads before it decides anything.
    pub(crate) fn placed(&self, signer: &str) -> Option<Pcr> {
        let meta = &self.metadata;
        Some(Pcr::lean(
            ApiVersion::V1,
            (
                meta.uid.clone()?,
                meta.namespace.clone()?,
                meta.name.clone()?,
            ),
            signer,
            meta.creation_timestamp.as_ref(),
        ))
    }

    /// The whole request; `None` when the metadata lacks a uid, name or namespace.
    pub(crate) fn decode(self) -> Option<Pcr> {
        let mut pcr = Pcr::from_v1(v1::PodCertificateRequest {
            metadata: self.metadata,
            spec: self.spec,
            status: None,
        })?;
        pcr.terminal = self.terminal;
        Some(pcr)
    }
}

/// The API server's answer to a status write, read as nothing: the request comes back whole
/// (managedFields, the issued chain), and the controller needs only the status code. Decoding
/// it as a `DynamicObject` buffered the whole object through `#[serde(flatten)]` into a JSON
/// tree for every PCR; serde skips every field of this type unbuilt.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Written {
    #[serde(skip)]
    metadata: ObjectMeta,
}

impl kube::Resource for Written {
    type DynamicType = kube::discovery::ApiResource;
    type Scope = kube::core::DynamicResourceScope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(conditions: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "PodCertificateRequest",
            "metadata": {
                "name": "r", "namespace": "apps", "uid": "u-1", "resourceVersion": "7",
                "creationTimestamp": "2026-12-07T10:00:00Z",
                "labels": {"a": "b"},
                "managedFields": [{"manager": "kubelet", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {
                "signerName": "example.com/s", "podName": "p", "podUID": "pu",
                "serviceAccountName": "sa", "serviceAccountUID": "sau",
                "nodeName": "n", "nodeUID": "nu", "maxExpirationSeconds": 86400,
                "stubPKCS10Request": "AQID",
                "unverifiedUserAnnotations": {"podca.dev/dns-names": "a.b"}
            },
            "status": {"conditions": conditions, "certificateChain": "x"}
        })
    }

    /// The lean decode and then the spec's give exactly what a whole decode gives.
    #[test]
    fn decoding_in_two_steps_gives_the_whole_request() {
        for conditions in [
            json!([]),
            json!([{"type": "Issued", "status": "True", "reason": "Issued", "message": "",
                    "lastTransitionTime": "2026-12-07T10:00:01Z"}]),
        ] {
            let value = object(conditions);
            let whole: v1::PodCertificateRequest =
                serde_json::from_value(value.clone()).expect("a v1 PCR");
            let watched: WatchedPcr = serde_json::from_value(value).expect("the lean form");
            assert_eq!(watched.uid(), Some("u-1"));
            let settled = watched.is_settled();
            let placed = watched.placed("example.com/s").expect("placed");
            assert!(placed.lean && placed.stub_csr.is_empty());
            assert_eq!(
                (placed.uid.as_str(), placed.name.as_str(), placed.created),
                ("u-1", "r", Pcr::from_v1(whole.clone()).unwrap().created)
            );
            let two_steps = watched.decode().expect("decodes");
            let one_step = Pcr::from_v1(whole).expect("converts");
            assert_eq!(settled, one_step.terminal.is_some());
            assert_eq!(two_steps, one_step);
            assert!(!two_steps.lean);
        }
    }

    /// A status write's answer reads as nothing, and its URL is the request's, per version.
    #[test]
    fn a_status_write_answer_decodes_as_nothing_at_the_request_url() {
        use crate::discovery::Resource;
        use kube::Resource as _;
        let answer = object(json!([{"type": "Issued", "status": "True"}])).to_string();
        let _: Written = serde_json::from_str(&answer).expect("any object reads");
        for (version, path) in [
            (ApiVersion::V1, "certificates.k8s.io/v1"),
            (ApiVersion::V1Beta1, "certificates.k8s.io/v1beta1"),
        ] {
            let dt = Resource::PodCertificateRequests.api_resource(version);
            assert_eq!(
                Written::url_path(&dt, Some("apps")),
                format!("/apis/{path}/namespaces/apps/podcertificaterequests")
            );
        }
    }

    #[test]
    fn the_watch_asks_for_v1_podcertificaterequests() {
        use kube::Resource as _;
        assert_eq!(
            WatchedPcr::url_path(&(), Some("apps")),
            "/apis/certificates.k8s.io/v1/namespaces/apps/podcertificaterequests"
        );
    }
}
