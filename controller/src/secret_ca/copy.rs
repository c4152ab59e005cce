//! podca's copy of the last sealed history, kept as two annotations on its ClusterTrustBundles
//! (one per signer name), where a ConfigMap writer in podca's namespace cannot reach: a
//! ClusterTrustBundle is cluster-scoped, and writing one linked to a signer name needs the
//! `attest` verb on that signer (the ClusterTrustBundleAttest admission plugin) besides `update`
//! on clustertrustbundles — rights only podca and cluster administrators hold, and whoever holds
//! them can already put any root into the bundle directly. The copy is sealed like the ConfigMap
//! and verified alike at start
//! ([`podca_authority::secret_rotation::start`]), so it adds a witness, not a new authority.
//!
//! The leader writes the copy after each history write and checks it on every tick (a bundle
//! the publisher has not created yet, or re-created without annotations, gets it on a later
//! tick). Only bundles that carry podca's `app.kubernetes.io/managed-by` label and the expected
//! `spec.signerName` are read or written; the publisher's own writes keep foreign annotations,
//! so the two writers never undo each other (a conflict is a 409 and a retry).

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::Value;
use tracing::{debug, warn};

use crate::bounded;
use crate::discovery::{self, Resource};
use crate::publisher::{DesiredBundle, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use podca_authority::metrics::Metrics;
use podca_authority::secret_rotation::Sealed;

/// The annotation holding the exact `history.json` text.
pub const HISTORY_ANNOTATION: &str = "podca.dev/ca-history";
/// The annotation holding its seal (`history.seal`).
pub const SEAL_ANNOTATION: &str = "podca.dev/ca-history-seal";
/// The largest copy written: Kubernetes limits all annotations of an object to 256 KiB together;
/// this leaves room for everyone else's.
pub const MAX_COPY_BYTES: usize = 192 * 1024;

/// The ClusterTrustBundles that carry the copy.
#[derive(Clone)]
pub struct Copies {
    api: Api<DynamicObject>,
    bundles: Vec<DesiredBundle>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Copies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copies")
            .field("bundles", &self.bundles)
            .finish_non_exhaustive()
    }
}

impl Copies {
    /// The copies on `bundles`, in the ClusterTrustBundle version the API server prefers;
    /// `None` when it serves no ClusterTrustBundles (then there is no copy).
    pub async fn discover(
        client: Client,
        bundles: Vec<DesiredBundle>,
        metrics: Arc<Metrics>,
    ) -> Result<Option<Self>, kube::Error> {
        if bundles.is_empty() {
            return Ok(None);
        }
        let served = bounded::retrying("discover", &metrics, || discovery::certificates(&client))
            .await?
            .served(Resource::ClusterTrustBundles);
        let Some(version) = served.preferred() else {
            warn!(
                "the API server serves no ClusterTrustBundles: podca keeps no copy of the CA \
                 history, so a forged history at start costs the anchors it kept"
            );
            return Ok(None);
        };
        Ok(Some(Copies {
            api: Api::all_with(client, &Resource::ClusterTrustBundles.api_resource(version)),
            bundles,
            metrics,
        }))
    }

    /// Every copy found on podca's bundles (not yet verified). A bundle that cannot be read is
    /// skipped with a warning: the ConfigMap may still do.
    pub async fn read(&self) -> Vec<Sealed> {
        let mut found = vec![];
        for bundle in &self.bundles {
            match bounded::call(
                "get_ca_history_copy",
                &self.metrics,
                self.api.get_opt(&bundle.name),
            )
            .await
            {
                Ok(Some(object)) if ours(&object, bundle) => found.extend(copy_in(&object)),
                Ok(_) => {}
                Err(e) => {
                    warn!(bundle = %bundle.name, error = %e, "reading the CA history copy")
                }
            }
        }
        found
    }

    /// Puts `sealed` on every bundle that does not hold it yet. True when every bundle holds it
    /// now; false when one is missing (not created yet), foreign, or a write failed (the next
    /// tick tries again).
    pub async fn write(&self, sealed: &Sealed) -> bool {
        if sealed.history_json.len() + sealed.seal_json.len() > MAX_COPY_BYTES {
            warn!(
                bytes = sealed.history_json.len() + sealed.seal_json.len(),
                limit = MAX_COPY_BYTES,
                "the CA history is too large for a ClusterTrustBundle annotation; no copy kept"
            );
            return true;
        }
        let mut all = true;
        for bundle in &self.bundles {
            all &= self.write_one(bundle, sealed).await;
        }
        all
    }

    async fn write_one(&self, bundle: &DesiredBundle, sealed: &Sealed) -> bool {
        let current = match bounded::call(
            "get_ca_history_copy",
            &self.metrics,
            self.api.get_opt(&bundle.name),
        )
        .await
        {
            Ok(Some(object)) if ours(&object, bundle) => object,
            Ok(_) => {
                debug!(bundle = %bundle.name, "no ClusterTrustBundle of podca's to hold the CA history copy yet");
                return false;
            }
            Err(e) => {
                warn!(bundle = %bundle.name, error = %e, "reading the CA history copy");
                return false;
            }
        };
        if copy_in(&current).as_ref() == Some(sealed) {
            return true;
        }
        let updated = with_copy(current, sealed);
        match bounded::call(
            "replace_ca_history_copy",
            &self.metrics,
            self.api
                .replace(&bundle.name, &PostParams::default(), &updated),
        )
        .await
        {
            Ok(_) => {
                debug!(bundle = %bundle.name, "CA history copy written");
                true
            }
            Err(e) => {
                // 409: the publisher wrote meanwhile; the next tick reads again.
                debug!(bundle = %bundle.name, error = %e, "writing the CA history copy");
                false
            }
        }
    }
}

/// Whether `object` is podca's bundle for `bundle`'s signer.
fn ours(object: &DynamicObject, bundle: &DesiredBundle) -> bool {
    let labelled = object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY_VALUE);
    let signer = object
        .data
        .get("spec")
        .and_then(|s| s.get("signerName"))
        .and_then(Value::as_str);
    labelled && signer == Some(bundle.signer_name.as_str())
}

/// The copy `object` carries, if both annotations are there.
fn copy_in(object: &DynamicObject) -> Option<Sealed> {
    let annotations = object.metadata.annotations.as_ref()?;
    Some(Sealed {
        history_json: annotations.get(HISTORY_ANNOTATION)?.clone(),
        seal_json: annotations.get(SEAL_ANNOTATION)?.clone(),
    })
}

/// `object` with the copy's annotations set, everything else (the resourceVersion too) as read.
fn with_copy(mut object: DynamicObject, sealed: &Sealed) -> DynamicObject {
    let annotations = object
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    annotations.insert(HISTORY_ANNOTATION.into(), sealed.history_json.clone());
    annotations.insert(SEAL_ANNOTATION.into(), sealed.seal_json.clone());
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    fn bundle() -> DesiredBundle {
        DesiredBundle {
            name: "example.com:mesh:podca".into(),
            signer_name: "example.com/mesh".into(),
            tenant: None,
            federated: None,
        }
    }

    fn object(labels: &[(&str, &str)], signer: &str) -> DynamicObject {
        DynamicObject {
            types: None,
            metadata: ObjectMeta {
                name: Some("example.com:mesh:podca".into()),
                resource_version: Some("7".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                annotations: Some(BTreeMap::from([("team".to_owned(), "x".to_owned())])),
                ..Default::default()
            },
            data: json!({"spec": {"signerName": signer, "trustBundle": "PEM"}}),
        }
    }

    #[test]
    fn only_podcas_bundle_of_the_signer_holds_the_copy() {
        let ours_label = [(MANAGED_BY_LABEL, MANAGED_BY_VALUE)];
        assert!(ours(&object(&ours_label, "example.com/mesh"), &bundle()));
        assert!(!ours(&object(&[], "example.com/mesh"), &bundle()));
        assert!(!ours(
            &object(&[(MANAGED_BY_LABEL, "helm")], "example.com/mesh"),
            &bundle()
        ));
        assert!(!ours(&object(&ours_label, "example.com/other"), &bundle()));
    }

    #[test]
    fn a_copy_written_reads_back_and_keeps_the_rest_of_the_object() {
        let sealed = Sealed {
            history_json: "{\"secret\":\"podca/ca\",\"generations\":[]}".into(),
            seal_json: "{\"version\":1}".into(),
        };
        let before = object(&[(MANAGED_BY_LABEL, MANAGED_BY_VALUE)], "example.com/mesh");
        assert_eq!(copy_in(&before), None);
        let after = with_copy(before, &sealed);
        assert_eq!(copy_in(&after), Some(sealed));
        assert_eq!(after.metadata.resource_version.as_deref(), Some("7"));
        let annotations = after.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.get("team").map(String::as_str), Some("x"));
        assert_eq!(after.data["spec"]["trustBundle"], "PEM");
        // Half a copy is none.
        let mut half = after.clone();
        half.metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .remove(SEAL_ANNOTATION);
        assert_eq!(copy_in(&half), None);
    }
}
