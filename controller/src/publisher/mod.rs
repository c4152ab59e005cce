//! The ClusterTrustBundle publisher (KEP-3257): one bundle per signer name, holding every trust
//! anchor of the current [`CaSnapshot`], kept correct through rotations, repaired when someone
//! else edits or deletes it, and garbage-collected when podca no longer needs it.
//!
//! Ownership is by label: a bundle is podca's when it carries both
//! `app.kubernetes.io/managed-by=podca` and `podca.dev/instance=<instance>`. The one exception is
//! a bundle this process itself created or updated (remembered by UID): it stays podca's even
//! after someone strips its labels, so that the labels can be restored. Nothing else is ever
//! written or deleted, whatever its name or signer.
//!
//! One pass is: read the desired bundles and the owned ones → decide (pure, [`decide`] and
//! [`garbage`]) → at most one write per bundle. A pass runs at start, on every CA swap, on every
//! watch event of a configured signer's bundles, on the periodic resync, and after a failure
//! (with backoff).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions, TypeMeta,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use podca_signer::CaCertificate;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::decide;
use crate::discovery::{self, Resource};
use crate::request::ApiVersion;
use podca_authority::metrics::{Metrics, OpLabels};
use podca_authority::trust::{CaHandle, CaSnapshot};

/// The label every podca-managed bundle carries (value [`MANAGED_BY_VALUE`]).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "podca";
/// The label that keeps two podca installations out of each other's bundles.
pub const INSTANCE_LABEL: &str = "podca.dev/instance";
pub use podca_authority::config::{
    DEFAULT_BUNDLE_INSTANCE as DEFAULT_INSTANCE, DEFAULT_BUNDLE_RESYNC as DEFAULT_RESYNC,
    DEFAULT_BUNDLE_SUFFIX as DEFAULT_SUFFIX,
};
/// `MaxTrustBundleSize` (spec rule 24).
pub const MAX_TRUST_BUNDLE_SIZE: usize = 1024 * 1024;
/// The longest object name kube-apiserver accepts for a ClusterTrustBundle.
const MAX_NAME_LEN: usize = 253;

/// How the publisher names, labels and refreshes bundles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherOptions {
    /// The part of the bundle name after `<signer with / → :>:`; a DNS-1123 subdomain.
    pub suffix: String,
    /// The value of the `podca.dev/instance` label; a Kubernetes label value.
    pub instance: String,
    /// How often everything is re-read and compared, on top of the watches.
    pub resync: Duration,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            suffix: DEFAULT_SUFFIX.into(),
            instance: DEFAULT_INSTANCE.into(),
            resync: DEFAULT_RESYNC,
        }
    }
}

/// A configuration the publisher cannot work with, or anchors it cannot publish.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublisherError {
    #[error("signer name {signer:?}: {reason}")]
    InvalidSignerName { signer: String, reason: String },
    #[error("ClusterTrustBundle suffix {suffix:?}: {reason}")]
    InvalidSuffix { suffix: String, reason: String },
    #[error(
        "ClusterTrustBundle name {name:?} for signer {signer:?} is {len} characters; \
         at most {MAX_NAME_LEN} are allowed (use a shorter suffix)"
    )]
    NameTooLong {
        signer: String,
        name: String,
        len: usize,
    },
    #[error("instance {instance:?}: {reason}")]
    InvalidInstance { instance: String, reason: String },
    #[error("the CA snapshot holds no CA certificate to publish")]
    NoAnchors,
    #[error(
        "the trust bundle is {size} bytes; ClusterTrustBundles hold at most {MAX_TRUST_BUNDLE_SIZE}"
    )]
    BundleTooLarge { size: usize },
}

/// One bundle the publisher keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredBundle {
    pub name: String,
    pub signer_name: String,
}

/// The `spec.trustBundle` of every desired bundle, built from the anchors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBundle {
    /// PEM CERTIFICATE blocks, no headers, no duplicates, CA certificates only.
    pub pem: String,
    /// How many certificates `pem` holds.
    pub anchors: usize,
    /// Subjects of anchors left out because they are not CA certificates (rule 25.4).
    pub skipped: Vec<String>,
}

/// The validated publisher: which bundles to keep and how to label them. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Publisher {
    bundles: Vec<DesiredBundle>,
    labels: BTreeMap<String, String>,
    resync: Duration,
}

impl Publisher {
    /// Validates the names every signer's bundle will get (rule 20) and the labels.
    pub fn new<S: AsRef<str>>(
        signers: impl IntoIterator<Item = S>,
        options: &PublisherOptions,
    ) -> Result<Self, PublisherError> {
        let PublisherOptions {
            suffix,
            instance,
            resync,
        } = options;
        if let Some(reason) = label_value_problem(instance) {
            return Err(PublisherError::InvalidInstance {
                instance: instance.clone(),
                reason,
            });
        }
        let signers: BTreeSet<String> =
            signers.into_iter().map(|s| s.as_ref().to_owned()).collect();
        let bundles = signers
            .into_iter()
            .map(|signer| {
                Ok(DesiredBundle {
                    name: bundle_name(&signer, suffix)?,
                    signer_name: signer,
                })
            })
            .collect::<Result<Vec<_>, PublisherError>>()?;
        Ok(Publisher {
            bundles,
            labels: owner_labels(instance),
            resync: (*resync).max(Duration::from_millis(100)),
        })
    }

    /// The bundles this publisher keeps, one per signer name, sorted by signer name.
    pub fn bundles(&self) -> &[DesiredBundle] {
        &self.bundles
    }

    /// The labels on every bundle (and the mark of ownership).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The labels as a label selector (`key=value,key=value`).
    pub fn label_selector(&self) -> String {
        self.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Publishes until the future is dropped (or the CA handle is gone). Writes only while
    /// `leading` is true; transient API errors are retried with backoff, never returned.
    pub async fn run(
        self,
        client: Client,
        ca: CaHandle,
        metrics: Arc<Metrics>,
        leading: watch::Receiver<bool>,
    ) {
        let version = discover_until_served(&client, &metrics).await;
        let resource = api_resource(version);
        info!(
            version = version.as_str(),
            bundles = ?self.bundles.iter().map(|b| &b.name).collect::<Vec<_>>(),
            "publishing ClusterTrustBundles"
        );
        let api: Api<DynamicObject> = Api::all_with(client, &resource);
        let ctbs = Ctbs {
            api: api.clone(),
            api_version: version.as_str(),
        };
        let poke = Arc::new(Notify::new());
        // One watch per signer with `spec.signerName=<name>` rather than one label-selected
        // watch: it also shows a bundle of ours whose labels someone removed (to a
        // label-selected watch that object merely stops matching) and a foreign bundle that
        // sits on our name. It cannot show owned bundles of signers that are no longer
        // configured; those are found by the label-selected list of every pass.
        let _watches: Vec<AbortOnDrop> = self
            .bundles
            .iter()
            .map(|b| {
                AbortOnDrop(tokio::spawn(watch_signer(
                    api.clone(),
                    b.signer_name.clone(),
                    Arc::clone(&poke),
                )))
            })
            .collect();
        let mut ca_rx = ca.subscribe();
        drop(ca);
        let mut state = State::default();
        let mut resync = tokio::time::interval(self.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut attempt = 0u32;
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = resync.tick() => debug!("ClusterTrustBundle resync"),
                changed = ca_rx.changed() => {
                    if changed.is_err() {
                        info!("the CA handle is gone: ClusterTrustBundle publisher stops");
                        return;
                    }
                    debug!("CA snapshot changed");
                }
                () = poke.notified() => {}
                () = sleep_until(retry_at) => {}
            }
            let snapshot = Arc::clone(&ca_rx.borrow_and_update());
            let ok = self
                .pass(&ctbs, &snapshot, &mut state, &metrics, &leading)
                .await;
            if ok {
                attempt = 0;
                retry_at = None;
            } else {
                let delay = decide::backoff(attempt, rand::random::<f64>());
                attempt = attempt.saturating_add(1);
                debug!(?delay, "ClusterTrustBundle pass failed; retrying");
                retry_at = Some(tokio::time::Instant::now() + delay);
            }
        }
    }

    /// One reconcile of every desired bundle, then garbage collection. True when nothing needs
    /// a retry.
    async fn pass(
        &self,
        ctbs: &Ctbs,
        snapshot: &CaSnapshot,
        state: &mut State,
        metrics: &Metrics,
        leading: &watch::Receiver<bool>,
    ) -> bool {
        let mut ok = true;
        // Publish first, collect garbage second: when the suffix changes, the new bundle exists
        // before the old one goes, so a label-selecting projection never finds nothing.
        match trust_bundle(&snapshot.anchors) {
            Ok(bundle) => {
                if state.generation != Some(snapshot.generation) {
                    state.generation = Some(snapshot.generation);
                    for subject in &bundle.skipped {
                        metrics.ctb_publish_errors.inc();
                        error!(%subject, "not publishing a trust anchor that is not a CA certificate");
                    }
                }
                for desired in &self.bundles {
                    ok &= self
                        .reconcile(ctbs, desired, &bundle, state, metrics, leading)
                        .await;
                }
            }
            Err(e) => {
                // Nothing is written: the bundles keep the last good anchors.
                metrics.ctb_publish_errors.inc();
                error!(error = %e, "cannot build the trust bundle");
            }
        }
        ok &= self.collect_garbage(ctbs, metrics, leading).await;
        ok
    }

    async fn reconcile(
        &self,
        ctbs: &Ctbs,
        desired: &DesiredBundle,
        bundle: &TrustBundle,
        state: &mut State,
        metrics: &Metrics,
        leading: &watch::Receiver<bool>,
    ) -> bool {
        let name = desired.name.as_str();
        let current = match ctbs.api.get_opt(name).await {
            Ok(current) => current,
            Err(e) => return api_failure(metrics, name, "read", &e),
        };
        let observed = current.as_ref().map(Observed::from_object);
        let adopted = observed
            .as_ref()
            .is_some_and(|o| state.adopted.get(name) == Some(&o.uid));
        let action = decide(
            desired,
            &bundle.pem,
            &self.labels,
            observed.as_ref(),
            adopted,
        );
        if let (Some(o), Action::Nothing | Action::Update) = (&observed, &action) {
            state.adopted.insert(name.to_owned(), o.uid.clone());
        }
        if !matches!(action, Action::Foreign(_)) {
            state.blocked.remove(name);
        }
        let op = match action {
            Action::Nothing => {
                state.published.insert(name.to_owned(), bundle.pem.clone());
                return true;
            }
            Action::Foreign(why) => {
                if state.blocked.insert(name.to_owned()) {
                    metrics.ctb_publish_errors.inc();
                    error!(
                        bundle = name,
                        signer = %desired.signer_name,
                        why,
                        "a ClusterTrustBundle that podca does not own has the name podca would \
                         publish under; leaving it alone (delete it, or change the suffix)"
                    );
                }
                return true;
            }
            Action::Create => "create",
            Action::Update => "update",
        };
        if !*leading.borrow() {
            return true;
        }
        // Drift: the bundle differs from (or lacks) exactly what we published last, so someone
        // else changed it.
        let drift = state.published.get(name) == Some(&bundle.pem);
        let result = match current {
            None => {
                let object = DynamicObject {
                    types: Some(TypeMeta {
                        api_version: ctbs.api_version.into(),
                        kind: "ClusterTrustBundle".into(),
                    }),
                    metadata: ObjectMeta {
                        name: Some(name.to_owned()),
                        labels: Some(self.labels.clone()),
                        ..Default::default()
                    },
                    data: json!({"spec": {
                        "signerName": desired.signer_name,
                        "trustBundle": bundle.pem,
                    }}),
                };
                ctbs.api.create(&PostParams::default(), &object).await
            }
            Some(mut object) => {
                let labels = object.metadata.labels.get_or_insert_with(BTreeMap::new);
                labels.extend(self.labels.clone());
                if !object.data.get("spec").is_some_and(Value::is_object) {
                    object.data["spec"] = json!({});
                }
                object.data["spec"]["trustBundle"] = json!(bundle.pem);
                // PUT with the resourceVersion just read: a concurrent change gives 409 and a
                // retry instead of a lost update.
                ctbs.api
                    .replace(name, &PostParams::default(), &object)
                    .await
            }
        };
        match result {
            Ok(written) => {
                if let Some(uid) = written.metadata.uid {
                    state.adopted.insert(name.to_owned(), uid);
                }
                state.published.insert(name.to_owned(), bundle.pem.clone());
                metrics.ctb_writes.get_or_create(&OpLabels { op }).inc();
                if drift {
                    metrics.ctb_drift_repairs.inc();
                }
                info!(
                    bundle = name,
                    signer = %desired.signer_name,
                    anchors = bundle.anchors,
                    op,
                    drift,
                    "ClusterTrustBundle written"
                );
                true
            }
            Err(e) => api_failure(metrics, name, op, &e),
        }
    }

    async fn collect_garbage(
        &self,
        ctbs: &Ctbs,
        metrics: &Metrics,
        leading: &watch::Receiver<bool>,
    ) -> bool {
        let list = match ctbs
            .api
            .list(&ListParams::default().labels(&self.label_selector()))
            .await
        {
            Ok(list) => list,
            Err(e) => return api_failure(metrics, "(list)", "list", &e),
        };
        let owned: Vec<Observed> = list.items.iter().map(Observed::from_object).collect();
        let desired: BTreeSet<&str> = self.bundles.iter().map(|b| b.name.as_str()).collect();
        let mut ok = true;
        for victim in garbage(&owned, &desired, &self.labels) {
            if !*leading.borrow() {
                return true;
            }
            let params = DeleteParams {
                // Delete exactly what was judged, not a bundle recreated or relabelled since.
                preconditions: Some(Preconditions {
                    uid: Some(victim.uid.clone()),
                    resource_version: victim.resource_version.clone(),
                }),
                ..Default::default()
            };
            match ctbs.api.delete(&victim.name, &params).await {
                Ok(_) => {
                    metrics
                        .ctb_writes
                        .get_or_create(&OpLabels { op: "delete" })
                        .inc();
                    info!(
                        bundle = %victim.name,
                        signer = %victim.signer_name,
                        anchors = count_pem_blocks(&victim.trust_bundle),
                        op = "delete",
                        "ClusterTrustBundle no longer configured: deleted"
                    );
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => ok &= api_failure(metrics, &victim.name, "delete", &e),
            }
        }
        ok
    }
}

/// What the publisher remembers between passes (within one leadership term).
#[derive(Debug, Default)]
struct State {
    /// Bundle name → UID of the object this process wrote or found carrying its labels.
    adopted: HashMap<String, String>,
    /// Bundle name → the trustBundle last written or confirmed.
    published: HashMap<String, String>,
    /// Names held by a foreign bundle (reported once).
    blocked: HashSet<String>,
    /// The CA generation whose anchors were last checked.
    generation: Option<u64>,
}

/// The fields of a ClusterTrustBundle the publisher judges by.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    pub name: String,
    pub uid: String,
    pub resource_version: Option<String>,
    pub signer_name: String,
    pub trust_bundle: String,
    pub labels: BTreeMap<String, String>,
}

impl Observed {
    fn from_object(object: &DynamicObject) -> Self {
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
}

/// What to do about one desired bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Content and labels are as desired: no request.
    Nothing,
    Create,
    /// Rewrite the trustBundle and/or restore the labels.
    Update,
    /// Someone else's bundle holds the name: never touched.
    Foreign(&'static str),
}

/// Decides one desired bundle. `adopted`: the observed object is one this process wrote, so
/// it is podca's even without its labels.
pub fn decide(
    desired: &DesiredBundle,
    trust_bundle: &str,
    labels: &BTreeMap<String, String>,
    observed: Option<&Observed>,
    adopted: bool,
) -> Action {
    let Some(observed) = observed else {
        return Action::Create;
    };
    let labelled = has_labels(&observed.labels, labels);
    if !labelled && !adopted {
        return Action::Foreign("it does not carry this instance's podca labels");
    }
    if observed.signer_name != desired.signer_name {
        // Cannot happen while rule 20 ties the name to the signer; never rewrite it anyway.
        return Action::Foreign("its spec.signerName differs (and is immutable)");
    }
    if labelled && observed.trust_bundle == trust_bundle {
        Action::Nothing
    } else {
        Action::Update
    }
}

/// The owned bundles (both labels) whose names are not desired any more.
pub fn garbage<'a>(
    owned: &'a [Observed],
    desired: &BTreeSet<&str>,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a Observed> {
    owned
        .iter()
        // The list was label-selected; checking again keeps a selector bug from deleting
        // someone else's bundle.
        .filter(|o| has_labels(&o.labels, labels) && !desired.contains(o.name.as_str()))
        .collect()
}

fn has_labels(present: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| present.get(k) == Some(v))
}

/// The labels on every bundle of `instance`.
pub fn owner_labels(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (INSTANCE_LABEL.to_owned(), instance.to_owned()),
    ])
}

/// `<signerName with every / replaced by :>:<suffix>`, checked against rules 20, 22 and 23.
pub fn bundle_name(signer: &str, suffix: &str) -> Result<String, PublisherError> {
    if let Some(reason) = signer_name_problem(signer) {
        return Err(PublisherError::InvalidSignerName {
            signer: signer.to_owned(),
            reason,
        });
    }
    if let Some(reason) = subdomain_problem(suffix) {
        return Err(PublisherError::InvalidSuffix {
            suffix: suffix.to_owned(),
            reason,
        });
    }
    let name = format!("{}:{suffix}", signer.replace('/', ":"));
    if name.len() > MAX_NAME_LEN {
        return Err(PublisherError::NameTooLong {
            signer: signer.to_owned(),
            len: name.len(),
            name,
        });
    }
    Ok(name)
}

/// The bundle of `anchors` that rules 24–27 accept: CA certificates only (others are left out
/// and reported), each DER once, in the snapshot's order, as header-less PEM.
pub fn trust_bundle(anchors: &[CaCertificate]) -> Result<TrustBundle, PublisherError> {
    let mut seen: HashSet<&[u8]> = HashSet::new();
    let mut pem = String::new();
    let mut count = 0;
    let mut skipped = Vec::new();
    for anchor in anchors {
        if !anchor.is_ca() {
            skipped.push(anchor.subject().to_owned());
            continue;
        }
        if seen.insert(anchor.der()) {
            pem.push_str(&anchor.pem());
            count += 1;
        }
    }
    if count == 0 {
        return Err(PublisherError::NoAnchors);
    }
    if pem.len() > MAX_TRUST_BUNDLE_SIZE {
        return Err(PublisherError::BundleTooLarge { size: pem.len() });
    }
    Ok(TrustBundle {
        pem,
        anchors: count,
        skipped,
    })
}

fn count_pem_blocks(pem: &str) -> usize {
    pem.matches("-----BEGIN CERTIFICATE-----").count()
}

async fn discover_until_served(client: &Client, metrics: &Metrics) -> ApiVersion {
    let mut attempt = 0u32;
    loop {
        match discovery::certificates(client).await {
            Ok(found) => match found.served(Resource::ClusterTrustBundles).preferred() {
                Some(version) => return version,
                None => {
                    metrics.ctb_publish_errors.inc();
                    error!(
                        "certificates.k8s.io serves no clustertrustbundles in v1 or v1beta1 \
                     (is the ClusterTrustBundle feature gate and runtime-config on?); asking again"
                    );
                    // Waiting for an operator: no point in asking fast.
                    attempt = attempt.max(6);
                }
            },
            Err(e) => {
                metrics.ctb_publish_errors.inc();
                warn!(error = %e, "discovering the ClusterTrustBundle version");
            }
        }
        tokio::time::sleep(decide::backoff(attempt, rand::random::<f64>())).await;
        attempt = attempt.saturating_add(1);
    }
}

fn api_resource(version: ApiVersion) -> ApiResource {
    let v = match version {
        ApiVersion::V1 => "v1",
        ApiVersion::V1Beta1 => "v1beta1",
    };
    ApiResource {
        group: "certificates.k8s.io".into(),
        version: v.into(),
        api_version: version.as_str().into(),
        kind: "ClusterTrustBundle".into(),
        plural: "clustertrustbundles".into(),
    }
}

/// The ClusterTrustBundles of the discovered version.
#[derive(Debug)]
struct Ctbs {
    api: Api<DynamicObject>,
    api_version: &'static str,
}

/// Counts and logs a failed API call; always false (the pass needs a retry).
fn api_failure(metrics: &Metrics, bundle: &str, op: &str, e: &kube::Error) -> bool {
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

async fn watch_signer(api: Api<DynamicObject>, signer: String, poke: Arc<Notify>) {
    let config = watcher::Config::default().fields(&format!("spec.signerName={signer}"));
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = stream.next().await {
        match event {
            // A relist ends with InitDone: one pass covers whatever the gap hid.
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                poke.notify_one()
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(e) => warn!(signer, error = %e, "ClusterTrustBundle watch"),
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Aborts the watch tasks when the publisher stops (a lost Lease drops `run`).
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a label value is not one (`IsValidLabelValue`), or `None`. Empty is refused too: an
/// empty instance would not tell installations apart.
fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".into());
    }
    if value.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    let b = value.as_bytes();
    let inner_ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if !inner_ok || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Some(
            "must consist of alphanumeric characters, '-', '_' or '.', and start and end with \
             an alphanumeric character"
                .into(),
        );
    }
    None
}

fn dns_label_ok(label: &str) -> bool {
    let b = label.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Why `s` is not a DNS-1123 subdomain, or `None`.
fn subdomain_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".into());
    }
    if s.len() > MAX_NAME_LEN {
        return Some(format!("must be no more than {MAX_NAME_LEN} characters"));
    }
    if !s.split('.').all(dns_label_ok) {
        return Some(
            "must be a lowercase RFC 1123 subdomain: lowercase alphanumerics, '-' and '.', \
             starting and ending with an alphanumeric character"
                .into(),
        );
    }
    None
}

/// Why `signer` is not a signer name a bundle can name (`ValidateSignerName`, rule 3/22, and
/// the reserved `kubernetes.io` domain, rule 23), or `None`.
fn signer_name_problem(signer: &str) -> Option<String> {
    let Some((domain, path)) = signer.split_once('/') else {
        return Some("must be of the form 'example.com/signer-name'".into());
    };
    if path.contains('/') {
        return Some("must contain exactly one '/'".into());
    }
    if domain.len() > 253 || !domain.split('.').all(dns_label_ok) || domain.split('.').count() < 2 {
        return Some("the domain must be a DNS name with at least two labels".into());
    }
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Some("the kubernetes.io domain is reserved".into());
    }
    if let Some(reason) = subdomain_problem(path) {
        return Some(format!("the path {reason}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey};

    fn root(name: &str) -> CaCertificate {
        let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("test key");
        IssuingCa::self_signed_root(
            Arc::new(key),
            name,
            time::OffsetDateTime::now_utc(),
            time::Duration::days(30),
        )
        .expect("test CA")
        .certificate()
        .clone()
    }

    #[test]
    fn names() {
        assert_eq!(
            bundle_name("example.com/workload", "podca").as_deref(),
            Ok("example.com:workload:podca")
        );
        assert_eq!(
            bundle_name("ca.example.com/a.b", "live-1.x").as_deref(),
            Ok("ca.example.com:a.b:live-1.x")
        );
        for bad_suffix in ["", "Live", "a_b", "a:b", "-a", "a.", "a..b"] {
            assert!(
                matches!(
                    bundle_name("example.com/s", bad_suffix),
                    Err(PublisherError::InvalidSuffix { .. })
                ),
                "{bad_suffix:?}"
            );
        }
        for bad_signer in [
            "example.com",
            "example/s",
            "example.com/a/b",
            "Example.com/s",
            "kubernetes.io/s",
            "foo.kubernetes.io/s",
            "example.com/S",
            "example.com/",
        ] {
            assert!(
                matches!(
                    bundle_name(bad_signer, "podca"),
                    Err(PublisherError::InvalidSignerName { .. })
                ),
                "{bad_signer:?}"
            );
        }
        let long = format!("example.com/{}", vec!["a".repeat(60); 4].join("."));
        assert!(matches!(
            bundle_name(&long, "podca"),
            Err(PublisherError::NameTooLong { .. })
        ));
    }

    #[test]
    fn instances_must_be_label_values() {
        let opts = |instance: &str| PublisherOptions {
            instance: instance.into(),
            ..Default::default()
        };
        assert!(Publisher::new(["example.com/s"], &opts("podca")).is_ok());
        assert!(Publisher::new(["example.com/s"], &opts("Team_A.prod-1")).is_ok());
        for bad in ["", "-a", "a/b", "a b", &"x".repeat(64)] {
            assert!(
                matches!(
                    Publisher::new(["example.com/s"], &opts(bad)),
                    Err(PublisherError::InvalidInstance { .. })
                ),
                "{bad:?}"
            );
        }
        let p = Publisher::new(["example.com/b", "example.com/a"], &opts("blue"))
            .expect("valid publisher");
        assert_eq!(
            p.label_selector(),
            "app.kubernetes.io/managed-by=podca,podca.dev/instance=blue"
        );
        assert_eq!(p.bundles()[0].name, "example.com:a:podca");
        assert_eq!(p.bundles()[1].signer_name, "example.com/b");
    }

    #[test]
    fn bundle_content() {
        let (a, b) = (root("a"), root("b"));
        let bundle = trust_bundle(&[a.clone(), b.clone(), a.clone()]).expect("bundle");
        assert_eq!(bundle.anchors, 2);
        assert_eq!(bundle.pem, format!("{}{}", a.pem(), b.pem()));
        assert!(!bundle.pem.contains(':'), "no PEM headers");
        assert_eq!(trust_bundle(&[]), Err(PublisherError::NoAnchors));
    }

    fn observed(name: &str, bundle: &str, labels: BTreeMap<String, String>) -> Observed {
        Observed {
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: Some("7".into()),
            signer_name: "example.com/s".into(),
            trust_bundle: bundle.into(),
            labels,
        }
    }

    #[test]
    fn decisions() {
        let desired = DesiredBundle {
            name: "example.com:s:podca".into(),
            signer_name: "example.com/s".into(),
        };
        let ours = owner_labels("podca");
        let mut extra = ours.clone();
        extra.insert("team".into(), "x".into());
        let name = desired.name.as_str();
        let table: Vec<(Option<Observed>, bool, Action)> = vec![
            (None, false, Action::Create),
            (
                Some(observed(name, "PEM", ours.clone())),
                false,
                Action::Nothing,
            ),
            (Some(observed(name, "PEM", extra)), false, Action::Nothing),
            (
                Some(observed(name, "OLD", ours.clone())),
                false,
                Action::Update,
            ),
            // Labels stripped: ours only if this process wrote it.
            (
                Some(observed(name, "PEM", BTreeMap::new())),
                true,
                Action::Update,
            ),
            (
                Some(observed(name, "PEM", BTreeMap::new())),
                false,
                Action::Foreign("it does not carry this instance's podca labels"),
            ),
            (
                Some(observed(name, "PEM", owner_labels("other"))),
                false,
                Action::Foreign("it does not carry this instance's podca labels"),
            ),
        ];
        for (i, (obs, adopted, want)) in table.into_iter().enumerate() {
            assert_eq!(
                decide(&desired, "PEM", &ours, obs.as_ref(), adopted),
                want,
                "row {i}"
            );
        }
        let mut other_signer = observed(name, "PEM", ours.clone());
        other_signer.signer_name = "example.com/t".into();
        assert!(matches!(
            decide(&desired, "PEM", &ours, Some(&other_signer), true),
            Action::Foreign(_)
        ));
    }

    #[test]
    fn garbage_is_only_owned_and_undesired() {
        let ours = owner_labels("podca");
        let mut only_managed = ours.clone();
        only_managed.remove(INSTANCE_LABEL);
        let owned = vec![
            observed("example.com:s:podca", "", ours.clone()),
            observed("example.com:old:podca", "", ours.clone()),
            observed("example.com:s:other", "", owner_labels("blue")),
            observed("example.com:s:manual", "", only_managed),
            observed("example.com:s:foreign", "", BTreeMap::new()),
        ];
        let desired = BTreeSet::from(["example.com:s:podca"]);
        let names: Vec<&str> = garbage(&owned, &desired, &ours)
            .into_iter()
            .map(|o| o.name.as_str())
            .collect();
        assert_eq!(names, ["example.com:old:podca"]);
    }
}
