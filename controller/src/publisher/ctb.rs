//! ClusterTrustBundle I/O in the discovered version (certificates.k8s.io/v1 or /v1beta1; both
//! have the same shape, so one dynamic API serves either): read, create, replace, list, delete,
//! watch. The objects written are built by pure functions, tested below.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams, Preconditions, TypeMeta};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tracing::{debug, error, warn};

use super::plan::{DesiredBundle, Observed};
use crate::bounded;
use crate::discovery::Resource;
use crate::request::ApiVersion;
use podca_authority::metrics::Metrics;

/// The ClusterTrustBundles of one version.
#[derive(Debug, Clone)]
pub struct Ctbs {
    api: Api<DynamicObject>,
    api_version: &'static str,
    /// Where timed-out calls are counted.
    metrics: Arc<Metrics>,
}

impl Ctbs {
    pub fn new(client: Client, version: ApiVersion, metrics: Arc<Metrics>) -> Self {
        Ctbs {
            api: Api::all_with(client, &Resource::ClusterTrustBundles.api_resource(version)),
            api_version: version.as_str(),
            metrics,
        }
    }

    pub async fn get(&self, name: &str) -> Result<Option<DynamicObject>, kube::Error> {
        bounded::call("get_ctb", &self.metrics, self.api.get_opt(name)).await
    }

    pub async fn create(
        &self,
        desired: &DesiredBundle,
        labels: &BTreeMap<String, String>,
        trust_bundle: &str,
    ) -> Result<DynamicObject, kube::Error> {
        let object = new_object(self.api_version, desired, labels, trust_bundle);
        bounded::call(
            "create_ctb",
            &self.metrics,
            self.api.create(&PostParams::default(), &object),
        )
        .await
    }

    /// PUT `current` (as just read) with the labels and trustBundle set: a concurrent change
    /// gives 409 and a retry instead of a lost update.
    pub async fn replace(
        &self,
        name: &str,
        current: DynamicObject,
        labels: &BTreeMap<String, String>,
        trust_bundle: &str,
    ) -> Result<DynamicObject, kube::Error> {
        let object = updated_object(current, labels, trust_bundle);
        bounded::call(
            "replace_ctb",
            &self.metrics,
            self.api.replace(name, &PostParams::default(), &object),
        )
        .await
    }

    /// The bundles that carry `selector`'s labels.
    pub async fn list(&self, selector: &str) -> Result<Vec<Observed>, kube::Error> {
        let list = bounded::call(
            "list_ctb",
            &self.metrics,
            self.api.list(&ListParams::default().labels(selector)),
        )
        .await?;
        Ok(list.items.iter().map(observed).collect())
    }

    /// Deletes exactly what was judged, not a bundle recreated or relabelled since.
    pub async fn delete(&self, victim: &Observed) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(victim.uid.clone()),
                resource_version: victim.resource_version.clone(),
            }),
            ..Default::default()
        };
        bounded::call(
            "delete_ctb",
            &self.metrics,
            self.api.delete(&victim.name, &params),
        )
        .await
        .map(|_| ())
    }

    /// Pokes on every change of `signer`'s bundles, until aborted.
    pub async fn watch_signer(self, signer: String, poke: Arc<Notify>) {
        let config = bounded::watcher_config(
            watcher::Config::default().fields(&format!("spec.signerName={signer}")),
        );
        let mut stream = std::pin::pin!(watcher(self.api, config).default_backoff());
        while let Some(event) = stream.next().await {
            match event {
                // A relist ends with InitDone: one pass covers whatever the gap hid.
                Ok(
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
                ) => poke.notify_one(),
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Err(e) => warn!(signer, error = %e, "ClusterTrustBundle watch"),
            }
        }
    }
}

/// Counts and logs a failed API call; always false (the pass needs a retry).
pub fn api_failure(metrics: &Metrics, bundle: &str, op: &str, e: &kube::Error) -> bool {
    metrics.ctb_publish_errors.inc();
    match e {
        kube::Error::Api(s) if s.code == 409 => {
            debug!(bundle, op, error = %e, "ClusterTrustBundle changed meanwhile; retrying")
        }
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => {
            error!(bundle, op, error = %e, "the API server refused a ClusterTrustBundle request")
        }
        _ => warn!(bundle, op, error = %e, "ClusterTrustBundle request failed; retrying"),
    }
    false
}

/// The fields of `object` the publisher judges by.
pub fn observed(object: &DynamicObject) -> Observed {
    let spec = |key: &str| {
        object
            .data
            .get("spec")
            .and_then(|s| s.get(key))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Observed {
        name: object.metadata.name.clone().unwrap_or_default(),
        uid: object.metadata.uid.clone().unwrap_or_default(),
        resource_version: object.metadata.resource_version.clone(),
        signer_name: spec("signerName"),
        trust_bundle: spec("trustBundle"),
        labels: object.metadata.labels.clone().unwrap_or_default(),
    }
}

fn new_object(
    api_version: &str,
    desired: &DesiredBundle,
    labels: &BTreeMap<String, String>,
    trust_bundle: &str,
) -> DynamicObject {
    DynamicObject {
        types: Some(TypeMeta {
            api_version: api_version.into(),
            kind: Resource::ClusterTrustBundles.kind().into(),
        }),
        metadata: ObjectMeta {
            name: Some(desired.name.clone()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        data: json!({"spec": {
            "signerName": desired.signer_name,
            "trustBundle": trust_bundle,
        }}),
    }
}

/// `current` with our labels added (others kept) and the trustBundle replaced; everything else,
/// including the resourceVersion, as read.
fn updated_object(
    mut current: DynamicObject,
    labels: &BTreeMap<String, String>,
    trust_bundle: &str,
) -> DynamicObject {
    current
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels.clone());
    if !current.data.get("spec").is_some_and(Value::is_object) {
        current.data["spec"] = json!({});
    }
    current.data["spec"]["trustBundle"] = json!(trust_bundle);
    current
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publisher::plan::owner_labels;

    fn desired() -> DesiredBundle {
        DesiredBundle {
            name: "example.com:s:podca".into(),
            signer_name: "example.com/s".into(),
            tenant: None,
            federated: None,
        }
    }

    #[test]
    fn each_version_has_its_resource() {
        let v1 = Resource::ClusterTrustBundles.api_resource(ApiVersion::V1);
        assert_eq!(
            (v1.version.as_str(), v1.api_version.as_str()),
            ("v1", "certificates.k8s.io/v1")
        );
        let beta = Resource::ClusterTrustBundles.api_resource(ApiVersion::V1Beta1);
        assert_eq!(
            (beta.version.as_str(), beta.api_version.as_str()),
            ("v1beta1", "certificates.k8s.io/v1beta1")
        );
        assert_eq!(beta.plural, "clustertrustbundles");
    }

    #[test]
    fn a_created_bundle_reads_back_as_desired() {
        let labels = owner_labels("podca");
        let object = new_object("certificates.k8s.io/v1beta1", &desired(), &labels, "PEM");
        assert_eq!(
            object.types.as_ref().map(|t| t.api_version.as_str()),
            Some("certificates.k8s.io/v1beta1")
        );
        let o = observed(&object);
        assert_eq!(
            (
                o.name.as_str(),
                o.signer_name.as_str(),
                o.trust_bundle.as_str()
            ),
            ("example.com:s:podca", "example.com/s", "PEM")
        );
        assert_eq!(o.labels, labels);
    }

    #[test]
    fn an_update_keeps_foreign_labels_and_the_resource_version() {
        let mut current = new_object(
            "certificates.k8s.io/v1",
            &desired(),
            &BTreeMap::from([("team".to_owned(), "x".to_owned())]),
            "OLD",
        );
        current.metadata.resource_version = Some("7".into());
        let updated = updated_object(current, &owner_labels("podca"), "NEW");
        let o = observed(&updated);
        assert_eq!(o.trust_bundle, "NEW");
        assert_eq!(o.signer_name, "example.com/s");
        assert_eq!(o.resource_version.as_deref(), Some("7"));
        assert_eq!(o.labels.len(), 3);
        assert_eq!(o.labels.get("team").map(String::as_str), Some("x"));

        // A bundle without a spec object gets one.
        let bare = DynamicObject {
            types: None,
            metadata: ObjectMeta::default(),
            data: json!({"spec": "nonsense"}),
        };
        assert_eq!(
            observed(&updated_object(bare, &BTreeMap::new(), "PEM")).trust_bundle,
            "PEM"
        );
    }
}
