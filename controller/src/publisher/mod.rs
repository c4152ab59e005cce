//! The ClusterTrustBundle publisher (KEP-3257): one bundle per signer name, holding every trust
//! anchor of the current [`CaSnapshot`] of that signer's CA (and no other CA's), kept correct through rotations, repaired when someone
//! else edits or deletes it, and garbage-collected when podca no longer needs it.
//!
//! Ownership is by label: a bundle is podca's when it carries both
//! `app.kubernetes.io/managed-by=podca` and `podca.dev/instance=<instance>`. The one exception is
//! a bundle this process itself created or updated (remembered by UID): it stays podca's even
//! after someone strips its labels, so that the labels can be restored. Nothing else is ever
//! written or deleted, whatever its name or signer.
//!
//! One pass is: read the desired bundles and the owned ones → decide (pure, [`plan`]) → at most
//! one write per bundle ([`ctb`]), then garbage collection ([`gc`]). A pass runs at start, when
//! this replica becomes the leader, on every CA swap, on every watch event of a configured
//! signer's bundles, on the periodic resync, and after a failure (with backoff). Names and labels are validated once, by
//! [`Publisher::new`] ([`names`]).

mod ctb;
mod gc;
mod names;
mod plan;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::decide::backoff;
use crate::discovery::{self, Resource};
use crate::request::ApiVersion;
use ctb::Ctbs;
use names::{MAX_NAME_LEN, bundle_name, label_value_problem};
use plan::{Action, decide, owner_labels, trust_bundle};
use podca_authority::metrics::{Metrics, OpLabels};
use podca_authority::trust::{CaSet, CaSnapshot};

pub use plan::{DesiredBundle, TrustBundle};

/// The label every podca-managed bundle carries (value [`MANAGED_BY_VALUE`]).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "podca";
/// The label that keeps two podca installations out of each other's bundles.
pub const INSTANCE_LABEL: &str = "podca.dev/instance";
/// The label of a tenant's bundle (value: the tenant's name): a pod of the tenant selects it
/// with its `clusterTrustBundle` projection's `labelSelector`.
pub const TENANT_LABEL: &str = "podca.dev/tenant";
/// The label of a federated trust domain's bundle (value: the foreign trust domain): a pod of a
/// signer that federates with it selects it with its projection's `labelSelector`.
pub const FEDERATED_LABEL: &str = "podca.dev/federated-trust-domain";

/// The bundles of the federated trust domains in force, by trust domain (no `spiffe://`), from
/// [`podca_grpc::federation::FederatedBundles::subscribe`]; every change wakes a publishing
/// pass.
pub type ForeignAnchors = watch::Receiver<Arc<podca_grpc::federation::BundleMap>>;
pub use podca_authority::config::{
    DEFAULT_BUNDLE_INSTANCE as DEFAULT_INSTANCE, DEFAULT_BUNDLE_RESYNC as DEFAULT_RESYNC,
    DEFAULT_BUNDLE_SUFFIX as DEFAULT_SUFFIX,
};
/// `MaxTrustBundleSize` (spec rule 24).
pub const MAX_TRUST_BUNDLE_SIZE: usize = 1024 * 1024;

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
    #[error("federated trust domain {trust_domain:?} of signer {signer:?}: {reason}")]
    InvalidFederatedTrustDomain {
        signer: String,
        trust_domain: String,
        reason: String,
    },
    #[error("the CA snapshot holds no CA certificate to publish")]
    NoAnchors,
    #[error(
        "the trust bundle is {size} bytes; ClusterTrustBundles hold at most {MAX_TRUST_BUNDLE_SIZE}"
    )]
    BundleTooLarge { size: usize },
}

/// The validated publisher: which bundles to keep and how to label them. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Publisher {
    bundles: Vec<DesiredBundle>,
    labels: BTreeMap<String, String>,
    resync: Duration,
    foreign: Option<ForeignAnchors>,
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
                    tenant: None,
                    federated: None,
                })
            })
            .collect::<Result<Vec<_>, PublisherError>>()?;
        Ok(Publisher {
            bundles,
            labels: owner_labels(instance),
            resync: (*resync).max(Duration::from_millis(100)),
            foreign: None,
        })
    }

    /// Every signer's bundle, one per tenant of a signer (`<signer with / → :>:<suffix>.<tenant>`,
    /// labelled [`TENANT_LABEL`]) and one per trust domain a signer federates with
    /// (`<signer with / → :>:<suffix>.federated.<trust domain>`, labelled [`FEDERATED_LABEL`]).
    pub fn for_policies(
        signers: &BTreeMap<String, podca_signer::SignerPolicy>,
        options: &PublisherOptions,
    ) -> Result<Self, PublisherError> {
        let mut publisher = Self::new(signers.keys(), options)?;
        for (signer, policy) in signers {
            for tenant in policy.tenants() {
                publisher.bundles.push(DesiredBundle {
                    name: bundle_name(signer, &format!("{}.{}", options.suffix, tenant.name))?,
                    signer_name: signer.clone(),
                    tenant: Some(tenant.name.to_owned()),
                    federated: None,
                });
            }
            for td in &policy.federates_with {
                if let Some(reason) = label_value_problem(td) {
                    return Err(PublisherError::InvalidFederatedTrustDomain {
                        signer: signer.clone(),
                        trust_domain: td.clone(),
                        reason,
                    });
                }
                publisher.bundles.push(DesiredBundle {
                    name: bundle_name(signer, &format!("{}.federated.{td}", options.suffix))?,
                    signer_name: signer.clone(),
                    tenant: None,
                    federated: Some(td.clone()),
                });
            }
        }
        Ok(publisher)
    }

    /// Publishes the federated trust domains' bundles from `foreign` (without it, or until a
    /// trust domain's first bundle is in force, its ClusterTrustBundle is left as it is).
    pub fn with_foreign(self, foreign: Option<ForeignAnchors>) -> Self {
        Publisher { foreign, ..self }
    }

    /// The labels a bundle carries: the owner labels, and a tenant's name.
    fn labels_of(&self, desired: &DesiredBundle) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        if let Some(tenant) = &desired.tenant {
            labels.insert(TENANT_LABEL.into(), tenant.clone());
        }
        if let Some(td) = &desired.federated {
            labels.insert(FEDERATED_LABEL.into(), td.clone());
        }
        labels
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
        plan::label_selector(&self.labels)
    }

    /// Publishes until the future is dropped (or every CA handle is gone). Writes only while
    /// `leading` is true; transient API errors are retried with backoff, never returned.
    pub async fn run(
        self,
        client: Client,
        cas: CaSet,
        metrics: Arc<Metrics>,
        leading: watch::Receiver<bool>,
    ) {
        let version = discover_until_served(&client, &metrics).await;
        info!(
            version = version.as_str(),
            bundles = ?self.bundles.iter().map(|b| &b.name).collect::<Vec<_>>(),
            "publishing ClusterTrustBundles"
        );
        let ctbs = Ctbs::new(client, version, Arc::clone(&metrics));
        let poke = Arc::new(Notify::new());
        // One watch per signer with `spec.signerName=<name>` rather than one label-selected
        // watch: it also shows a bundle of ours whose labels someone removed (to a
        // label-selected watch that object merely stops matching) and a foreign bundle that
        // sits on our name. It cannot show owned bundles of signers that are no longer
        // configured; those are found by the label-selected list of every pass.
        let signers: BTreeSet<&String> = self.bundles.iter().map(|b| &b.signer_name).collect();
        let _watches: Vec<AbortOnDrop> = signers
            .into_iter()
            .map(|signer| {
                AbortOnDrop(tokio::spawn(
                    ctbs.clone().watch_signer(signer.clone(), Arc::clone(&poke)),
                ))
            })
            .collect();
        // Every CA swap (rotation, reload) of any CA wakes a pass.
        let mut ca_changes = futures::stream::select_all(cas.iter().map(|(_, handle)| {
            Box::pin(futures::stream::unfold(
                handle.subscribe(),
                |mut rx| async { rx.changed().await.ok().map(|()| ((), rx)) },
            ))
        }));
        // Every change of a federated trust domain's bundle wakes a pass too.
        let mut foreign = self.foreign.clone();
        // A sharded replica runs the publisher before it leads: the pass that finds it
        // leading must not wait for the resync. (The first pass, below, sees the value now.)
        let mut term = Some(leading.clone());
        if let Some(rx) = &mut term {
            rx.borrow_and_update();
        }
        let mut state = State::default();
        let mut resync = tokio::time::interval(self.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut attempt = 0u32;
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = resync.tick() => debug!("ClusterTrustBundle resync"),
                changed = futures::StreamExt::next(&mut ca_changes) => {
                    if changed.is_none() {
                        info!("the CA handles are gone: ClusterTrustBundle publisher stops");
                        return;
                    }
                    debug!("CA snapshot changed");
                }
                () = poke.notified() => {}
                () = sleep_until(retry_at) => {}
                rose = became_leader(&mut term) => match rose {
                    Some(()) => {
                        debug!("leading: a pass writes what the last ones skipped");
                        state = State::default();
                    }
                    None => term = None,
                },
                changed = foreign_changed(&mut foreign) => {
                    if !changed {
                        foreign = None;
                    }
                    debug!("a federated bundle changed");
                }
            }
            let snapshots: BTreeMap<String, Arc<CaSnapshot>> = cas
                .iter()
                .map(|(name, handle)| (name.to_owned(), handle.current()))
                .collect();
            let ok = self
                .pass(&ctbs, &cas, &snapshots, &mut state, &metrics, &leading)
                .await;
            metrics.ctb_passes.inc();
            let generations: u64 = snapshots.values().map(|s| s.generation).sum();
            metrics
                .ctb_pass_generation
                .set(i64::try_from(generations).unwrap_or(i64::MAX));
            if ok {
                attempt = 0;
                retry_at = None;
            } else {
                let delay = backoff(attempt, rand::random::<f64>());
                attempt = attempt.saturating_add(1);
                debug!(?delay, "ClusterTrustBundle pass failed; retrying");
                retry_at = Some(tokio::time::Instant::now() + delay);
            }
        }
    }

    /// One reconcile of every desired bundle, each from its signer's CA, then garbage
    /// collection. True when nothing needs a retry.
    #[tracing::instrument(name = "ctb_pass", skip_all)]
    async fn pass(
        &self,
        ctbs: &Ctbs,
        cas: &CaSet,
        snapshots: &BTreeMap<String, Arc<CaSnapshot>>,
        state: &mut State,
        metrics: &Metrics,
        leading: &watch::Receiver<bool>,
    ) -> bool {
        let mut ok = true;
        // Each CA's bundle content, built once per pass.
        let mut bundles: BTreeMap<&str, Option<TrustBundle>> = BTreeMap::new();
        for (name, snapshot) in snapshots {
            let built = match trust_bundle(&snapshot.anchors) {
                Ok(bundle) => {
                    if state.generations.get(name) != Some(&snapshot.generation) {
                        state.generations.insert(name.clone(), snapshot.generation);
                        for subject in &bundle.skipped {
                            metrics.ctb_publish_errors.inc();
                            error!(ca = %name, %subject, "not publishing a trust anchor that is not a CA certificate");
                        }
                    }
                    Some(bundle)
                }
                Err(e) => {
                    // Nothing is written for this CA's signers: their bundles keep the last
                    // good anchors.
                    metrics.ctb_publish_errors.inc();
                    error!(ca = %name, error = %e, "cannot build the trust bundle");
                    None
                }
            };
            bundles.insert(name.as_str(), built);
        }
        // Publish first, collect garbage second: when the suffix changes, the new bundle exists
        // before the old one goes, so a label-selecting projection never finds nothing.
        let foreign = self.foreign.as_ref().map(|f| Arc::clone(&f.borrow()));
        for desired in &self.bundles {
            if let Some(td) = &desired.federated {
                // A trust domain without a bundle in force yet keeps what was published.
                let Some(foreign) = foreign.as_ref().and_then(|f| f.get(td)) else {
                    continue;
                };
                let bundle = match trust_bundle(&foreign.bundle.x509_authorities) {
                    Ok(bundle) => bundle,
                    Err(e) => {
                        metrics.ctb_publish_errors.inc();
                        error!(trust_domain = %td, error = %e, "cannot build the federated trust bundle");
                        continue;
                    }
                };
                // The configured initial bundle creates a missing one but never replaces a
                // published one: after a restart it may be older than what was fetched before.
                if foreign.from_initial_bundle {
                    match ctbs.get(&desired.name).await {
                        Ok(None) => {}
                        Ok(Some(_)) => continue,
                        Err(e) => {
                            ok &= ctb::api_failure(metrics, &desired.name, "read", &e);
                            continue;
                        }
                    }
                }
                ok &= self
                    .reconcile(ctbs, desired, &bundle, state, metrics, leading)
                    .await;
                continue;
            }
            let ca = cas.ca_name_for(&desired.signer_name, desired.tenant.as_deref());
            if let Some(Some(bundle)) = bundles.get(ca) {
                ok &= self
                    .reconcile(ctbs, desired, bundle, state, metrics, leading)
                    .await;
            }
        }
        ok &= gc::collect(ctbs, &self.bundles, &self.labels, metrics, leading).await;
        ok
    }

    /// Brings one bundle to `bundle` with at most one write. True when nothing needs a retry.
    #[tracing::instrument(
        name = "ctb_bundle",
        skip_all,
        fields(bundle = %desired.name, signer = %desired.signer_name)
    )]
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
        let labels = self.labels_of(desired);
        let current = match ctbs.get(name).await {
            Ok(current) => current,
            Err(e) => return ctb::api_failure(metrics, name, "read", &e),
        };
        let observed = current.as_ref().map(ctb::observed);
        let adopted = observed
            .as_ref()
            .is_some_and(|o| state.adopted.get(name) == Some(&o.uid));
        let action = decide(desired, &bundle.pem, &labels, observed.as_ref(), adopted);
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
            None => ctbs.create(desired, &labels, &bundle.pem).await,
            Some(object) => ctbs.replace(name, object, &labels, &bundle.pem).await,
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
            Err(e) => ctb::api_failure(metrics, name, op, &e),
        }
    }
}

/// Waits for a change of the federated bundles: true on a change, false once the sender is
/// gone; forever without a receiver.
async fn foreign_changed(foreign: &mut Option<ForeignAnchors>) -> bool {
    match foreign {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Resolves when `term` turns true (a leadership term starts); `None` once its sender is gone,
/// never after that.
async fn became_leader(term: &mut Option<watch::Receiver<bool>>) -> Option<()> {
    let Some(rx) = term else {
        return std::future::pending().await;
    };
    loop {
        rx.changed().await.ok()?;
        if *rx.borrow_and_update() {
            return Some(());
        }
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
    /// CA name → the generation whose anchors were last checked.
    generations: BTreeMap<String, u64>,
}

async fn discover_until_served(client: &Client, metrics: &Metrics) -> ApiVersion {
    let mut attempt = 0u32;
    loop {
        match crate::bounded::call("discover", metrics, discovery::certificates(client)).await {
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
        tokio::time::sleep(backoff(attempt, rand::random::<f64>())).await;
        attempt = attempt.saturating_add(1);
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A signer that federates gets one bundle per foreign trust domain, named after the
    /// suffix and labelled with the trust domain; a trust domain that cannot be a label value
    /// is refused with the signer's and the trust domain's names.
    #[test]
    fn federated_trust_domains_get_labelled_bundles_of_their_signer() {
        let mut policy = podca_signer::SignerPolicy::permissive("cluster.local");
        policy.federates_with = vec!["b.test".into(), "c.example".into()];
        let signers = BTreeMap::from([("example.com/mesh".to_string(), policy.clone())]);
        let p = Publisher::for_policies(&signers, &PublisherOptions::default()).unwrap();
        let federated: Vec<(&str, Option<&str>)> = p
            .bundles()
            .iter()
            .map(|b| (b.name.as_str(), b.federated.as_deref()))
            .collect();
        assert_eq!(
            federated,
            [
                ("example.com:mesh:podca", None),
                ("example.com:mesh:podca.federated.b.test", Some("b.test")),
                (
                    "example.com:mesh:podca.federated.c.example",
                    Some("c.example")
                ),
            ]
        );
        let labels = p.labels_of(&p.bundles()[1]);
        assert_eq!(
            labels.get(FEDERATED_LABEL).map(String::as_str),
            Some("b.test")
        );
        assert!(!p.labels_of(&p.bundles()[0]).contains_key(FEDERATED_LABEL));
        let long = format!("{}.example", "x".repeat(60));
        policy.federates_with = vec![long.clone()];
        let signers = BTreeMap::from([("example.com/mesh".to_string(), policy)]);
        let e = Publisher::for_policies(&signers, &PublisherOptions::default()).unwrap_err();
        assert!(
            matches!(&e, PublisherError::InvalidFederatedTrustDomain { trust_domain, .. } if *trust_domain == long),
            "{e}"
        );
    }
}
