//! The JWKS ConfigMap: the OIDC JWKS (and the discovery document, when `[jwt] issuer` is set)
//! published in-cluster for consumers that mount or read a ConfigMap rather than fetch
//! discovery over the network (an in-cluster Vault, a sidecar verifier, a gateway's JWT
//! filter).
//!
//! * Name and namespace from `[jwt] jwks_configmap` (default `podca-jwks`) and
//!   `jwks_configmap_namespace` (default: podca's own namespace).
//! * Keys: [`JWKS_KEY`] (`jwks.json`, exactly what `GET /keys` answers) and
//!   [`DISCOVERY_KEY`] (`openid-configuration.json`).
//! * Labelled `app.kubernetes.io/managed-by: podca`. The name is podca's: relying parties
//!   trust the keys in it, so podca never stands down on it (issue #40). A ConfigMap of that
//!   name without the label (put there first, or with the label stripped) or with other data
//!   (a forged key) is taken back: overwritten with podca's JWKS and label, logged, and
//!   counted in `podca_jwks_configmap_writes_total{op="take_back"}`.
//! * Written by the leader only (a standby waits until it leads), at once on every change of
//!   the key set (a key prepared, activated, retired or dropped), and checked again every
//!   [`RESYNC`] so a deleted or edited ConfigMap is restored within seconds. A failed write is retried with
//!   backoff (1 s doubling to 30 s). Writes are get → create, or replace with the
//!   resourceVersion read (optimistic concurrency): the RBAC is `get`/`update` on that one
//!   name and `create` in its namespace (Kubernetes cannot limit `create` by name).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};
use podca_authority::jwt::JwtHandle;
use podca_authority::metrics::{Metrics, OpLabels};
use podca_authority::oidc::{self, Discovery};
use podca_signer::jwt::JwtKeySet;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::bounded;
use crate::publisher::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// The ConfigMap key of the JWKS.
pub const JWKS_KEY: &str = "jwks.json";
/// The ConfigMap key of the discovery document.
pub const DISCOVERY_KEY: &str = "openid-configuration.json";
/// How often the ConfigMap is checked without a key change: bounds how long a forged key can
/// stay in it (one GET each time).
pub const RESYNC: Duration = Duration::from_secs(5);
/// The longest pause between two attempts after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What one round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Updated,
    /// The ConfigMap already held exactly this.
    Unchanged,
    /// A ConfigMap of that name without podca's label (someone else's, or stripped), or with
    /// data podca did not write (a forged key): overwritten with podca's.
    TakenBack {
        /// Why: `unlabelled` or `edited`.
        why: &'static str,
    },
}

/// Writes the JWKS ConfigMap (see the module docs).
pub struct JwksPublisher {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    discovery: Option<Discovery>,
    keys: JwtHandle,
    metrics: Arc<Metrics>,
    /// The data this process last wrote or confirmed (other data is an edit to take back).
    written: Option<BTreeMap<String, String>>,
}

impl std::fmt::Debug for JwksPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksPublisher")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The ConfigMap's data for `keys`.
pub fn data(keys: &JwtKeySet, discovery: Option<&Discovery>) -> BTreeMap<String, String> {
    let mut data = BTreeMap::from([(JWKS_KEY.to_owned(), oidc::jwks(keys))]);
    if let Some(discovery) = discovery {
        data.insert(DISCOVERY_KEY.to_owned(), discovery.document());
    }
    data
}

fn owned(cm: &ConfigMap) -> bool {
    cm.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY_VALUE)
}

impl JwksPublisher {
    /// `discovery`: the document to publish beside the JWKS (`None` without an issuer).
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        discovery: Option<Discovery>,
        keys: JwtHandle,
        metrics: Arc<Metrics>,
    ) -> Self {
        JwksPublisher {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            discovery,
            keys,
            metrics,
            written: None,
        }
    }

    /// One round: makes the ConfigMap hold the current keys.
    pub async fn publish(&mut self) -> Result<Outcome, kube::Error> {
        let data = data(&self.keys.current(), self.discovery.as_ref());
        let pp = PostParams {
            field_manager: Some("podca".into()),
            ..PostParams::default()
        };
        let existing = bounded::call(
            "get_jwks_configmap",
            &self.metrics,
            self.api.get_opt(&self.name),
        )
        .await?;
        let mut cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_owned(),
                    MANAGED_BY_VALUE.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        let op = match existing {
            None => {
                bounded::call(
                    "create_jwks_configmap",
                    &self.metrics,
                    self.api.create(&pp, &cm),
                )
                .await?;
                Outcome::Created
            }
            Some(existing)
                if owned(&existing)
                    && existing.data == cm.data
                    && existing.binary_data.is_none() =>
            {
                return Ok(Outcome::Unchanged);
            }
            Some(existing) => {
                // Not what podca wrote: edited by someone (a forged key), or someone else's
                // object on podca's name. Relying parties trust what is here: take it back.
                let taken_back = match (owned(&existing), self.written.as_ref()) {
                    (false, _) => Some("unlabelled"),
                    (true, Some(written)) if existing.data.as_ref() != Some(written) => {
                        Some("edited")
                    }
                    _ => None,
                };
                // Keep what others put in the metadata (annotations, more labels).
                let mut metadata = existing.metadata;
                metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
                metadata.managed_fields = None;
                cm.metadata = metadata;
                // Only podca's data: another writer's keys (binaryData too) do not stay.
                cm.binary_data = None;
                bounded::call(
                    "replace_jwks_configmap",
                    &self.metrics,
                    self.api.replace(&self.name, &pp, &cm),
                )
                .await?;
                match taken_back {
                    Some(why) => Outcome::TakenBack { why },
                    None => Outcome::Updated,
                }
            }
        };
        self.written = cm.data.clone();
        let label = match op {
            Outcome::Created => "create",
            Outcome::TakenBack { .. } => "take_back",
            _ => "update",
        };
        self.metrics
            .oidc
            .configmap_writes
            .get_or_create(&OpLabels { op: label })
            .inc();
        Ok(op)
    }

    /// Publishes while `leading` says this replica leads, on every key change and every
    /// [`RESYNC`], until `stop` turns true.
    pub async fn run(
        mut self,
        mut leading: watch::Receiver<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut keys = self.keys.subscribe();
        let mut backoff = Duration::from_secs(1);
        loop {
            let wait = if *leading.borrow_and_update() {
                keys.borrow_and_update();
                match self.publish().await {
                    Ok(outcome) => {
                        backoff = Duration::from_secs(1);
                        self.report(outcome);
                        RESYNC
                    }
                    Err(e) => {
                        self.metrics.oidc.configmap_errors.inc();
                        warn!(
                            configmap = %format!("{}/{}", self.namespace, self.name),
                            error = %e,
                            retry_in = ?backoff,
                            "writing the JWKS ConfigMap failed"
                        );
                        let wait = backoff;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        wait
                    }
                }
            } else {
                // A standby: nothing to do until it leads.
                Duration::MAX
            };
            tokio::select! {
                () = sleep_for(wait) => {}
                r = keys.changed() => { if r.is_err() { return; } }
                r = leading.changed() => { if r.is_err() { return; } }
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    fn report(&mut self, outcome: Outcome) {
        let at = format!("{}/{}", self.namespace, self.name);
        match outcome {
            Outcome::Created => info!(configmap = %at, "JWKS ConfigMap created"),
            Outcome::Updated => info!(configmap = %at, "JWKS ConfigMap updated"),
            Outcome::Unchanged => debug!(configmap = %at, "JWKS ConfigMap up to date"),
            Outcome::TakenBack { why } => warn!(
                configmap = %at,
                why,
                "the JWKS ConfigMap held what podca did not write (another writer's object on \
                 its name, or an edit: possibly a forged key); overwritten with podca's JWKS. \
                 Find who writes ConfigMaps in this namespace"
            ),
        }
    }
}

async fn sleep_for(wait: Duration) {
    if wait == Duration::MAX {
        std::future::pending::<()>().await;
    } else {
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use podca_signer::jwt::JwtAlgorithm;

    #[test]
    fn the_data_is_the_served_jwks_and_the_document_with_an_issuer() {
        let keys = JwtKeySet::default();
        let without = data(&keys, None);
        assert_eq!(without.keys().collect::<Vec<_>>(), [JWKS_KEY]);
        assert_eq!(without[JWKS_KEY], oidc::jwks(&keys));
        let discovery = Discovery {
            issuer: "https://oidc.example".into(),
            max_age: Duration::from_secs(300),
            algorithm: JwtAlgorithm::ES256,
        };
        let with = data(&keys, Some(&discovery));
        let doc: serde_json::Value = serde_json::from_str(&with[DISCOVERY_KEY]).unwrap();
        assert_eq!(doc["jwks_uri"], "https://oidc.example/keys");
    }

    #[test]
    fn only_a_labelled_configmap_is_podcas() {
        let mut cm = ConfigMap::default();
        assert!(!owned(&cm));
        cm.metadata.labels = Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_owned(),
            "helm".to_owned(),
        )]));
        assert!(!owned(&cm));
        cm.metadata.labels = Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_owned(),
            MANAGED_BY_VALUE.to_owned(),
        )]));
        assert!(owned(&cm));
    }
}
