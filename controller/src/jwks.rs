//! The JWKS ConfigMap: the OIDC JWKS (and the discovery document, when `[jwt] issuer` is set)
//! published in-cluster for consumers that mount or read a ConfigMap rather than fetch
//! discovery over the network (an in-cluster Vault, a sidecar verifier, a gateway's JWT
//! filter).
//!
//! * Name and namespace from `[jwt] jwks_configmap` (default `podca-jwks`) and
//!   `jwks_configmap_namespace` (default: podca's own namespace).
//! * Keys: [`JWKS_KEY`] (`jwks.json`, exactly what `GET /keys` answers), [`SIGNATURE_KEY`]
//!   (`jwks.json.jws`, a detached JWS over those bytes by the issuing key of the CA that holds
//!   the JWT keys, chained to the anchors in its signer's ClusterTrustBundle:
//!   [`podca_signer::jwt::detached`]) and [`DISCOVERY_KEY`] (`openid-configuration.json`,
//!   not signed). The JWS is made again when the key set changes and when the CA's issuing
//!   certificate does (a rotation), so it always verifies under the current bundle.
//! * Labelled `app.kubernetes.io/managed-by: podca`. The name is podca's: relying parties
//!   trust the keys in it, so podca never stands down on it (issue #40). A ConfigMap of that
//!   name without the label (put there first, or with the label stripped) or with other data
//!   (a forged key) is foreign: from the moment it is seen until podca's data is back in it,
//!   `/readyz` fails (component `jwks-configmap`), so a take-back that keeps failing (RBAC, a
//!   webhook) keeps podca unready; a Warning Event `JwksConfigMapTakenBack` is raised on it
//!   (once per resourceVersion); it is overwritten with podca's data and label, logged, and
//!   counted in `podca_jwks_configmap_writes_total{op="take_back"}`. After a restart podca
//!   has written nothing yet: then data whose JWS does not verify is foreign too.
//! * Written by the leader only (a standby waits until it leads and has no say in
//!   readiness), at once on every change of the key set (a key prepared, activated, retired or
//!   dropped) or of the CA, and checked again every [`RESYNC`] so a deleted or edited
//!   ConfigMap is restored within seconds. A failed write is retried with backoff (1 s
//!   doubling to 30 s). Writes are get → create, or replace with the resourceVersion read
//!   (optimistic concurrency): the RBAC is `get`/`update` on that one name and `create` in its
//!   namespace (Kubernetes cannot limit `create` by name). No watch: that would need
//!   `list`/`watch` too, and the poll bounds the window at [`RESYNC`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Api, Client};
use podca_authority::admin::ReadyFlag;
use podca_authority::jwt::JwtHandle;
use podca_authority::metrics::{Metrics, OpLabels};
use podca_authority::oidc::{self, Discovery};
use podca_authority::{CaHandle, CaSnapshot, Clock};
use podca_signer::jwt::JwtKeySet;
use podca_signer::jwt::detached;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::bounded;
use crate::publisher::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// The ConfigMap key of the JWKS.
pub const JWKS_KEY: &str = "jwks.json";
/// The ConfigMap key of the detached JWS over [`JWKS_KEY`].
pub const SIGNATURE_KEY: &str = "jwks.json.jws";
/// The ConfigMap key of the discovery document.
pub const DISCOVERY_KEY: &str = "openid-configuration.json";
/// The `/readyz` component that fails while the ConfigMap is foreign.
pub const READINESS_COMPONENT: &str = "jwks-configmap";
/// How often the ConfigMap is checked without a key change: bounds how long a forged key can
/// stay in it (one GET each time).
pub const RESYNC: Duration = Duration::from_secs(5);
/// The longest pause between two attempts after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest wait for the API server to record an Event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a ConfigMap on podca's name is not podca's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// Without podca's label: someone else's object, or the label stripped.
    Unlabelled,
    /// podca's label, but data podca did not write (a forged key, a forged signature).
    Edited,
}

impl Foreign {
    pub fn label(self) -> &'static str {
        match self {
            Foreign::Unlabelled => "unlabelled",
            Foreign::Edited => "edited",
        }
    }
}

/// What one round does, from what it read ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Create,
    /// The ConfigMap already holds exactly podca's data.
    Unchanged,
    /// Overwrite it; `foreign` when it was not podca's (take it back).
    Replace {
        foreign: Option<Foreign>,
    },
}

/// What one round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Updated,
    /// The ConfigMap already held exactly this.
    Unchanged,
    /// A foreign ConfigMap on podca's name, overwritten with podca's.
    TakenBack {
        why: Foreign,
    },
}

/// Decides a round: `want` is podca's data now; `podcas(data)` says whether data that differs
/// from it is still podca's own (an older key set it wrote), rather than someone else's.
pub fn plan(
    existing: Option<&ConfigMap>,
    want: &BTreeMap<String, String>,
    podcas: impl FnOnce(&BTreeMap<String, String>) -> bool,
) -> Plan {
    let Some(existing) = existing else {
        return Plan::Create;
    };
    if !owned(existing) {
        return Plan::Replace {
            foreign: Some(Foreign::Unlabelled),
        };
    }
    let data = existing.data.clone().unwrap_or_default();
    if existing.binary_data.is_some() {
        return Plan::Replace {
            foreign: Some(Foreign::Edited),
        };
    }
    if data == *want {
        return Plan::Unchanged;
    }
    Plan::Replace {
        foreign: (!podcas(&data)).then_some(Foreign::Edited),
    }
}

/// The last JWS made, reused while neither the JWKS nor the CA's chain changed (a JWS per
/// round would rewrite the ConfigMap every round: ECDSA signatures are randomised).
struct Signed {
    jwks: String,
    chain_pem: String,
    jws: String,
}

/// Writes the JWKS ConfigMap (see the module docs).
pub struct JwksPublisher {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    discovery: Option<Discovery>,
    keys: JwtHandle,
    metrics: Arc<Metrics>,
    /// The CA whose issuing key signs the JWKS (`None`: no signature published).
    ca: Option<(CaHandle, Clock)>,
    ready: Option<ReadyFlag>,
    recorder: Recorder,
    /// The data this process last wrote or confirmed (other data is an edit to take back).
    written: Option<BTreeMap<String, String>>,
    signed: Option<Signed>,
    /// The resourceVersion of the foreign object last reported by an Event.
    reported: Option<String>,
}

impl std::fmt::Debug for JwksPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksPublisher")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The ConfigMap's data for `keys`, without the signature.
pub fn data(keys: &JwtKeySet, discovery: Option<&Discovery>) -> BTreeMap<String, String> {
    let mut data = BTreeMap::from([(JWKS_KEY.to_owned(), oidc::jwks(keys))]);
    if let Some(discovery) = discovery {
        data.insert(DISCOVERY_KEY.to_owned(), discovery.document());
    }
    data
}

/// Whether `data`'s JWS verifies over its JWKS under `ca`'s anchors; data without a JWS (from
/// a podca before signatures) counts as podca's.
pub fn signature_verifies(
    data: &BTreeMap<String, String>,
    ca: &CaSnapshot,
    now: time::OffsetDateTime,
) -> bool {
    let (Some(jwks), Some(jws)) = (data.get(JWKS_KEY), data.get(SIGNATURE_KEY)) else {
        return !data.contains_key(SIGNATURE_KEY);
    };
    detached::verify(jws, jwks.as_bytes(), &ca.anchors, now).is_ok()
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
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "podca.dev/jwks".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        JwksPublisher {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            discovery,
            keys,
            metrics,
            ca: None,
            ready: None,
            recorder,
            written: None,
            signed: None,
            reported: None,
        }
    }

    /// Publishes a detached JWS over the JWKS, signed by `ca`'s issuing key, dated by `clock`.
    pub fn signed_by(mut self, ca: CaHandle, clock: Clock) -> Self {
        self.ca = Some((ca, clock));
        self
    }

    /// `ready` turns false while the ConfigMap is foreign.
    pub fn readiness(mut self, ready: ReadyFlag) -> Self {
        ready.set(true);
        self.ready = Some(ready);
        self
    }

    /// One round: makes the ConfigMap hold the current keys.
    pub async fn publish(&mut self) -> Result<Outcome, kube::Error> {
        let existing = bounded::call(
            "get_jwks_configmap",
            &self.metrics,
            self.api.get_opt(&self.name),
        )
        .await?;
        self.adopt(existing.as_ref());
        let want = self.want().await;
        let verified_by = self.ca.as_ref().map(|(ca, clock)| (ca.current(), clock()));
        let plan = plan(existing.as_ref(), &want, |data| match &self.written {
            Some(written) => data == written,
            None => verified_by
                .as_ref()
                .is_none_or(|(ca, now)| signature_verifies(data, ca, *now)),
        });
        let pp = PostParams {
            field_manager: Some("podca".into()),
            ..PostParams::default()
        };
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
            data: Some(want),
            ..ConfigMap::default()
        };
        let outcome = match (plan, existing) {
            (Plan::Unchanged, _) => Outcome::Unchanged,
            (Plan::Create, _) | (Plan::Replace { .. }, None) => {
                bounded::call(
                    "create_jwks_configmap",
                    &self.metrics,
                    self.api.create(&pp, &cm),
                )
                .await?;
                Outcome::Created
            }
            (Plan::Replace { foreign }, Some(existing)) => {
                if let Some(why) = foreign {
                    // Relying parties trust what is here: not ready until it is podca's again.
                    self.set_ready(false);
                    self.report_foreign(why, &existing).await;
                }
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
                match foreign {
                    Some(why) => Outcome::TakenBack { why },
                    None => Outcome::Updated,
                }
            }
        };
        self.written = cm.data;
        self.set_ready(true);
        let label = match outcome {
            Outcome::Unchanged => return Ok(outcome),
            Outcome::Created => "create",
            Outcome::TakenBack { .. } => "take_back",
            Outcome::Updated => "update",
        };
        self.metrics
            .oidc
            .configmap_writes
            .get_or_create(&OpLabels { op: label })
            .inc();
        Ok(outcome)
    }

    /// podca's data now: the JWKS, the discovery document, and the JWS over the JWKS (left out
    /// when signing fails: a verifier then refuses the set, and the next round signs again).
    async fn want(&mut self) -> BTreeMap<String, String> {
        let mut data = data(&self.keys.current(), self.discovery.as_ref());
        let Some((ca, clock)) = &self.ca else {
            return data;
        };
        let snapshot = ca.current();
        let jwks = data[JWKS_KEY].clone();
        let chain_pem = snapshot.ca.chain_pem();
        if let Some(signed) = &self.signed
            && signed.jwks == jwks
            && signed.chain_pem == chain_pem
        {
            data.insert(SIGNATURE_KEY.to_owned(), signed.jws.clone());
            return data;
        }
        let issuing = Arc::clone(&snapshot.ca);
        let now = clock();
        let payload = jwks.clone();
        // An HSM key waits on the device: off the async threads.
        let signed =
            tokio::task::spawn_blocking(move || detached::sign(&issuing, payload.as_bytes(), now))
                .await;
        match signed {
            Ok(Ok(jws)) => {
                data.insert(SIGNATURE_KEY.to_owned(), jws.clone());
                self.signed = Some(Signed {
                    jwks,
                    chain_pem,
                    jws,
                });
            }
            Ok(Err(e)) => {
                self.metrics.oidc.configmap_errors.inc();
                warn!(error = %e, "signing the JWKS failed; published without its JWS for now");
            }
            Err(e) => {
                self.metrics.oidc.configmap_errors.inc();
                warn!(error = %e, "signing the JWKS did not finish");
            }
        }
        data
    }

    /// After a restart: the JWS already published, when it is podca's over the same JWKS by
    /// the current issuing certificate (no rewrite just because this process is new).
    fn adopt(&mut self, existing: Option<&ConfigMap>) {
        let (None, Some((ca, clock))) = (&self.signed, &self.ca) else {
            return;
        };
        let Some(data) = existing
            .filter(|cm| owned(cm))
            .and_then(|cm| cm.data.as_ref())
        else {
            return;
        };
        let (Some(jwks), Some(jws)) = (data.get(JWKS_KEY), data.get(SIGNATURE_KEY)) else {
            return;
        };
        let snapshot = ca.current();
        if detached::verify(jws, jwks.as_bytes(), &snapshot.anchors, clock())
            .is_ok_and(|v| v.signer == *snapshot.ca.certificate())
        {
            self.signed = Some(Signed {
                jwks: jwks.clone(),
                chain_pem: snapshot.ca.chain_pem(),
                jws: jws.clone(),
            });
        }
    }

    fn set_ready(&self, ready: bool) {
        if let Some(flag) = &self.ready {
            flag.set(ready);
        }
    }

    /// A Warning Event on the foreign object, once per resourceVersion (a take-back that keeps
    /// failing is retried every few seconds).
    async fn report_foreign(&mut self, why: Foreign, existing: &ConfigMap) {
        let version = existing.metadata.resource_version.clone();
        if version.is_some() && self.reported == version {
            return;
        }
        self.reported = version;
        let what = match why {
            Foreign::Unlabelled => "another writer's object (no managed-by: podca label)",
            Foreign::Edited => "data podca did not write (possibly a forged key)",
        };
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: "JwksConfigMapTakenBack".into(),
            note: Some(format!(
                "podca's JWKS ConfigMap held {what}; podca overwrites it with its JWKS and is not \
                 ready until that is done. Find who writes ConfigMaps in this namespace"
            )),
            action: "TakeBack".into(),
            secondary: None,
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: existing.metadata.uid.clone(),
            resource_version: existing.metadata.resource_version.clone(),
            ..Default::default()
        };
        match tokio::time::timeout(EVENT_TIMEOUT, self.recorder.publish(&event, &reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "could not record the JWKS ConfigMap Event"),
            Err(_) => warn!("recording the JWKS ConfigMap Event timed out"),
        }
    }

    /// Publishes while `leading` says this replica leads, on every key or CA change and every
    /// [`RESYNC`], until `stop` turns true.
    pub async fn run(
        mut self,
        mut leading: watch::Receiver<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut keys = self.keys.subscribe();
        let mut ca = self.ca.as_ref().map(|(ca, _)| ca.subscribe());
        let mut backoff = Duration::from_secs(1);
        loop {
            let wait = if *leading.borrow_and_update() {
                keys.borrow_and_update();
                if let Some(ca) = &mut ca {
                    ca.borrow_and_update();
                }
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
                // A standby: the leader answers for the ConfigMap; nothing to do until it leads.
                self.set_ready(true);
                Duration::MAX
            };
            let ca_changed = async {
                match &mut ca {
                    Some(ca) => ca.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = sleep_for(wait) => {}
                r = keys.changed() => { if r.is_err() { return; } }
                open = ca_changed => { if !open { return; } }
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
                why = why.label(),
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

    fn configmap(labelled: bool, data: &[(&str, &str)]) -> ConfigMap {
        let mut cm = ConfigMap::default();
        if labelled {
            cm.metadata.labels = Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGED_BY_VALUE.to_owned(),
            )]));
        }
        cm.data = Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        cm
    }

    /// Each row trips one rule: missing, up to date, someone else's, edited by someone (the
    /// `podcas` answer false), or an older set podca itself wrote.
    #[test]
    fn a_round_creates_keeps_takes_back_or_updates() {
        let want = BTreeMap::from([(JWKS_KEY.to_owned(), "new".to_owned())]);
        let current = configmap(true, &[(JWKS_KEY, "new")]);
        let older = configmap(true, &[(JWKS_KEY, "old")]);
        let unlabelled = configmap(false, &[(JWKS_KEY, "new")]);
        let mut binary = current.clone();
        binary.binary_data = Some(BTreeMap::new());
        let replace = |foreign| Plan::Replace { foreign };
        for (name, existing, podcas, expected) in [
            ("missing", None, true, Plan::Create),
            ("up to date", Some(&current), false, Plan::Unchanged),
            (
                "unlabelled, same data",
                Some(&unlabelled),
                true,
                replace(Some(Foreign::Unlabelled)),
            ),
            (
                "binaryData added",
                Some(&binary),
                true,
                replace(Some(Foreign::Edited)),
            ),
            (
                "edited",
                Some(&older),
                false,
                replace(Some(Foreign::Edited)),
            ),
            ("podca's older set", Some(&older), true, replace(None)),
        ] {
            assert_eq!(plan(existing, &want, |_| podcas), expected, "{name}");
        }
    }

    #[test]
    fn after_a_restart_only_a_verifying_signature_is_podcas() {
        use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey};
        let now = time::OffsetDateTime::now_utc();
        let key = || Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap());
        let root =
            IssuingCa::self_signed_root(key(), "root", now, time::Duration::days(1)).unwrap();
        let snapshot = CaHandle::new(root, vec![]).current();
        let jwks = r#"{"keys":[]}"#;
        let jws = detached::sign(&snapshot.ca, jwks.as_bytes(), now).unwrap();
        let signed = |jwks: &str, jws: &str| {
            BTreeMap::from([
                (JWKS_KEY.to_owned(), jwks.to_owned()),
                (SIGNATURE_KEY.to_owned(), jws.to_owned()),
            ])
        };
        assert!(signature_verifies(&signed(jwks, &jws), &snapshot, now));
        // A key added under podca's signature, or a signature by another CA.
        let forged = r#"{"keys":[{"kid":"forged"}]}"#;
        assert!(!signature_verifies(&signed(forged, &jws), &snapshot, now));
        let other =
            IssuingCa::self_signed_root(key(), "other", now, time::Duration::days(1)).unwrap();
        let theirs = detached::sign(&other, forged.as_bytes(), now).unwrap();
        assert!(!signature_verifies(
            &signed(forged, &theirs),
            &snapshot,
            now
        ));
        // A JWS without a JWKS is not podca's; no JWS at all is an older podca's.
        let only_jws = BTreeMap::from([(SIGNATURE_KEY.to_owned(), jws.clone())]);
        assert!(!signature_verifies(&only_jws, &snapshot, now));
        let unsigned = BTreeMap::from([(JWKS_KEY.to_owned(), jwks.to_owned())]);
        assert!(signature_verifies(&unsigned, &snapshot, now));
    }

    /// The JWS is made again when the CA's issuing certificate changes (a rotation's
    /// activation) so it verifies under the new anchors, and reused while nothing changed.
    #[tokio::test]
    async fn the_jwks_is_signed_again_when_the_issuing_ca_changes() {
        use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey};
        let now = time::OffsetDateTime::now_utc();
        let root = |name: &str| {
            let key = Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap());
            IssuingCa::self_signed_root(key, name, now, time::Duration::days(1)).unwrap()
        };
        // No API server is contacted: `want` only signs.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let ca = CaHandle::new(root("first"), vec![]);
        let mut publisher = JwksPublisher::new(
            client,
            "podca-system",
            "podca-jwks",
            None,
            JwtHandle::new(JwtKeySet::default()),
            Arc::new(Metrics::default()),
        )
        .signed_by(ca.clone(), Arc::new(move || now));
        let first = publisher.want().await;
        let verifies = |data: &BTreeMap<String, String>| {
            signature_verifies(data, &ca.current(), now) && data.contains_key(SIGNATURE_KEY)
        };
        assert!(verifies(&first));
        assert_eq!(publisher.want().await, first, "reused, not signed again");
        ca.replace(root("second"), vec![]);
        let second = publisher.want().await;
        assert_ne!(second[SIGNATURE_KEY], first[SIGNATURE_KEY]);
        assert!(verifies(&second));
        assert!(
            !verifies(&first),
            "the old JWS does not verify under the new anchors"
        );
    }
}
