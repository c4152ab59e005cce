//! The Kubernetes Secret CA backend: the issuing CA and its key come from a Secret of type
//! `kubernetes.io/tls` (`tls.crt`: the issuing certificate, optionally followed by
//! intermediates; `tls.key`: its private key, PKCS#8, SEC1 or PKCS#1 PEM; optional `ca.crt`: the
//! trust anchor(s), else the top of `tls.crt` must be a self-signed root). The Secret is watched,
//! and a new CA in it is taken over as a rotation with overlap, never as an abrupt switch, using
//! the rules of [`podca_signer::rotation`]:
//!
//! 1. **Prepared** as soon as it is seen (and validated): its anchors are published at once
//!    (the [`CaHandle`] anchors become old + new) while the *old* CA, whose key stays in memory,
//!    keeps signing.
//! 2. **Active** once its anchors have been published for the propagation window
//!    ([`Schedule::propagation`], default 15 min): it signs from then on, and the old CA is
//!    **Retired**: it signs nothing, but its anchor stays published until its last certificate
//!    can have expired (retired_at + the largest leaf lifetime, capped at its notAfter).
//! 3. **Dropped** afterwards: its anchor leaves the bundle.
//!
//! Same anchor: when every anchor of the new CA is already published (for example cert-manager
//! re-issued the intermediate under the same root), the new CA is recorded as prepared at the
//! time that anchor was first published, so it takes over at once when that was a propagation
//! window ago — relying parties already trust it, and no certificate can be signed by a CA whose
//! anchor was published less than the window earlier.
//!
//! The first CA ever seen (no history) is active at once: nobody can trust anything before it
//! is published, as with the first CA of the file store.
//!
//! ## Restart safety: the history ConfigMap
//!
//! The generations (public certificates, phases and timestamps; never keys) are kept in a
//! ConfigMap, `<secret-name>-podca-history` in the Secret's namespace by default, labelled
//! `app.kubernetes.io/managed-by=podca`, key `history.json`, written only by the leader (or by
//! the only replica). A ConfigMap rather than an annotation on the Secret because podca needs no
//! write access to the Secret that holds the CA key (least privilege), and because that Secret
//! is often owned by another tool (cert-manager, external-secrets, GitOps) that rewrites or
//! reports drift on its metadata. A ConfigMap that exists without podca's label is never
//! overwritten.
//!
//! After a restart during the propagation window the old CA's key is gone (it lived only in
//! the previous Secret contents). Then the new CA is installed with a **gated key**: the anchors
//! are published as recorded, but the key refuses to sign (a transient backend error: PCRs stay
//! pending and are retried, gRPC answers UNAVAILABLE) until the window recorded in the history
//! has passed. The same holds when the Secret changed while podca was not running. A warning
//! says until when. So no certificate is ever signed by a CA whose anchor was published less
//! than the propagation window ago; the price is a delay of at most the window after such a
//! restart.
//!
//! A bad Secret (unparsable, key and certificate that do not match, not a CA, expired, broken
//! chain) is refused: at start [`SecretCa::start`] fails; later the CA in force stays, the
//! problem is logged and counted once per Secret resourceVersion (`podca_ca_rotation_errors`),
//! and the next change is tried again.
//!
//! RBAC (in the Secret's namespace): `secrets` `get`, `list`, `watch` with `resourceNames:
//! [<secret>]` (list and watch use the field selector `metadata.name=<secret>`, which
//! kube-apiserver authorizes against resourceNames); `configmaps` `get`, `update` with
//! `resourceNames: [<history>]`, and `configmaps` `create` (create cannot be limited by name in
//! RBAC).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration as StdDuration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use podca_signer::rotation::{self, Generation, Phase, Schedule, Step};
use podca_signer::{BackendError, CaAlgorithm, CaCertificate, CaKey, IssuingCa, MemoryKey};
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::publisher::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::secret_history::{self, Checked, owned, secret_ref};
use crate::secret_rotation::{self, Gate as GateState};
use podca_authority::metrics::Metrics;
use podca_authority::rotation::{CaLabels, StepLabels, Tick};
use podca_authority::trust::{CaHandle, Clock};

/// The Secret type podca reads.
pub const SECRET_TYPE: &str = "kubernetes.io/tls";
/// The ConfigMap key that holds the history.
pub const HISTORY_KEY: &str = "history.json";
/// Appended to the Secret's name for the default history ConfigMap name.
pub const HISTORY_SUFFIX: &str = "-podca-history";
/// The shortest propagation window accepted (kubelet caches trust bundles for about 5 minutes).
pub const MIN_PROPAGATION_SECONDS: i64 = 600;

/// What the Secret backend needs.
#[derive(Clone)]
pub struct SecretCaOptions {
    /// The Secret's namespace (also the history ConfigMap's).
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// Only `propagation_seconds` is used: podca never makes CAs in this backend.
    pub schedule: Schedule,
    /// Bounds the life of a retired CA's leaves (the largest policy maximum lifetime).
    pub max_leaf_lifetime: Duration,
    /// The history ConfigMap's name; `None`: `<secret-name>-podca-history`.
    pub history_configmap: Option<String>,
    /// Longest sleep between checks (time-based steps are also woken for exactly; this bounds
    /// how late a standby follows the leader's history, and retries after API errors).
    pub poll: StdDuration,
    /// Whether this replica leads (writes the history). `None`: always (a single replica).
    /// A replica that does not lead follows the history the leader wrote.
    pub leading: Option<watch::Receiver<bool>>,
}

impl fmt::Debug for SecretCaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretCaOptions")
            .field("secret", &format!("{}/{}", self.namespace, self.name))
            .field("propagation_seconds", &self.schedule.propagation_seconds)
            .field("max_leaf_lifetime", &self.max_leaf_lifetime)
            .field("history_configmap", &self.history_name())
            .field("poll", &self.poll)
            .field("leader_elected", &self.leading.is_some())
            .finish()
    }
}

impl SecretCaOptions {
    /// Defaults (15-minute propagation window, 24-hour leaf bound, 60-second poll, single
    /// replica) for the Secret `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        SecretCaOptions {
            namespace: namespace.into(),
            name: name.into(),
            schedule: Schedule::default(),
            max_leaf_lifetime: Duration::hours(24),
            history_configmap: None,
            poll: StdDuration::from_secs(60),
            leading: None,
        }
    }

    /// The history ConfigMap's name.
    pub fn history_name(&self) -> String {
        self.history_configmap
            .clone()
            .unwrap_or_else(|| format!("{}{HISTORY_SUFFIX}", self.name))
    }

    fn validate(&self) -> Result<(), SecretCaError> {
        if self.namespace.is_empty() || self.name.is_empty() {
            return Err(SecretCaError::Config(
                "the CA Secret needs a namespace and a name (`namespace/name`)".into(),
            ));
        }
        if self.schedule.propagation_seconds < MIN_PROPAGATION_SECONDS {
            return Err(SecretCaError::Config(format!(
                "propagation_seconds {} is below {MIN_PROPAGATION_SECONDS}: kubelet caches trust \
                 bundles for about 5 minutes, so a shorter window risks pods that do not yet \
                 trust the new CA",
                self.schedule.propagation_seconds
            )));
        }
        if self.max_leaf_lifetime <= Duration::ZERO {
            return Err(SecretCaError::Config(
                "max_leaf_lifetime must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Why the Secret backend could not start or take a step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretCaError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("CA Secret {namespace}/{name} not found")]
    SecretNotFound { namespace: String, name: String },
    #[error("CA Secret {namespace}/{name}: {reason}")]
    InvalidSecret {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("CA history ConfigMap {namespace}/{name}: {reason}")]
    History {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("Secret CA configuration: {0}")]
    Config(String),
}

/// One CA generation as the history keeps it: public certificates only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub generation: Generation,
    /// SHA-256 of the issuing certificate.
    pub fingerprint: String,
    pub subject: String,
    /// The issuing certificate and its intermediates (never the root), PEM.
    pub chain_pem: String,
    /// The trust anchors, PEM.
    pub anchors_pem: String,
}

/// The history ConfigMap's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// `namespace/name` of the Secret this history belongs to.
    pub secret: String,
    pub generations: Vec<Record>,
}

/// Parses the CA in a Secret and checks everything: the type, the key (PKCS#8, SEC1 or PKCS#1
/// PEM) matching the issuing certificate, every certificate a CA, the chain verifying up to an
/// anchor (`ca.crt`, or the self-signed top of `tls.crt`), and nothing expired at `now`. The
/// key is wrapped in a gate that is closed until the caller opens it. Error texts never hold key
/// material.
pub fn parse_secret(
    secret: &Secret,
    now: OffsetDateTime,
    clock: Clock,
) -> Result<SecretCaContents, String> {
    if let Some(t) = secret.type_.as_deref()
        && t != SECRET_TYPE
    {
        return Err(format!(
            "type is {t:?}; podca reads {SECRET_TYPE:?} Secrets"
        ));
    }
    let data = secret.data.as_ref();
    let text = |key: &str| -> Result<Option<String>, String> {
        match data.and_then(|d| d.get(key)) {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes.0.clone())
                .map(Some)
                .map_err(|_| format!("{key} is not PEM text")),
        }
    };
    let cert_pem = text("tls.crt")?.ok_or("tls.crt is missing")?;
    let key_pem = text("tls.key")?.ok_or("tls.key is missing")?;
    let roots_pem = text("ca.crt")?;
    let key = MemoryKey::from_pem(&key_pem).map_err(|e| format!("tls.key: {e}"))?;
    drop(key_pem);
    let location = format!(
        "kubernetes-secret:{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or(""),
        secret.metadata.name.as_deref().unwrap_or("")
    );
    let gate = Arc::new(Gate::closed());
    let gated = GatedKey {
        inner: key,
        gate: Arc::clone(&gate),
        clock,
        location,
    };
    let ca = IssuingCa::from_pem(Arc::new(gated), &cert_pem, roots_pem.as_deref())
        .map_err(|e| format!("tls.crt/ca.crt: {e}"))?;
    for c in ca
        .chain()
        .iter()
        .chain([ca.certificate()])
        .chain(ca.roots())
    {
        if c.not_after() <= now {
            return Err(format!(
                "certificate {:?} has expired (notAfter {})",
                c.subject(),
                c.not_after()
            ));
        }
    }
    let chain_pem = chain_pem(&ca);
    let anchors_pem = ca.roots_pem();
    Ok(SecretCaContents {
        ca: Arc::new(ca),
        gate,
        chain_pem,
        anchors_pem,
    })
}

/// A validated CA from the Secret, with its (gated) key.
pub struct SecretCaContents {
    ca: Arc<IssuingCa>,
    gate: Arc<Gate>,
    chain_pem: String,
    anchors_pem: String,
}

impl fmt::Debug for SecretCaContents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretCaContents")
            .field("issuing", &self.ca.certificate())
            .field("anchors", &self.ca.roots())
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

impl SecretCaContents {
    pub fn ca(&self) -> &Arc<IssuingCa> {
        &self.ca
    }

    fn same_ca(&self, record: &Record) -> bool {
        self.chain_pem == record.chain_pem && self.anchors_pem == record.anchors_pem
    }
}

/// The issuing certificate and its intermediates, never the root, as PEM.
fn chain_pem(ca: &IssuingCa) -> String {
    let mut pem = ca.certificate().pem();
    for c in ca.chain() {
        if c != ca.certificate() && !ca.roots().contains(c) {
            pem.push_str(&c.pem());
        }
    }
    pem
}

/// When a CA read from the Secret may sign: not before its anchor propagated, never after it
/// was retired (even through a snapshot someone still holds).
#[derive(Debug)]
struct Gate {
    /// Unix seconds; `i64::MAX`: closed.
    open_at: AtomicI64,
    retired: AtomicBool,
}

impl Gate {
    fn closed() -> Self {
        Gate {
            open_at: AtomicI64::new(i64::MAX),
            retired: AtomicBool::new(false),
        }
    }

    fn open_from(&self, t: OffsetDateTime) {
        self.open_at.store(t.unix_timestamp(), Ordering::SeqCst);
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }
}

/// The Secret's key behind a [`Gate`].
struct GatedKey {
    inner: MemoryKey,
    gate: Arc<Gate>,
    clock: Clock,
    location: String,
}

impl fmt::Debug for GatedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedKey")
            .field("location", &self.location)
            .field("key", &self.inner)
            .field("gate", &self.gate)
            .finish()
    }
}

impl CaKey for GatedKey {
    fn algorithm(&self) -> CaAlgorithm {
        self.inner.algorithm()
    }

    fn public_key_raw(&self) -> &[u8] {
        self.inner.public_key_raw()
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        if self.gate.retired.load(Ordering::SeqCst) {
            return Err(BackendError::Unavailable(
                "this CA was retired; its successor signs".into(),
            ));
        }
        let open_at = self.gate.open_at.load(Ordering::SeqCst);
        if (self.clock)().unix_timestamp() < open_at {
            let when = OffsetDateTime::from_unix_timestamp(open_at)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| "a later rotation step".into());
            return Err(BackendError::Unavailable(format!(
                "the CA from {} signs from {when}, once its trust anchor has been published for \
                 the propagation window",
                self.location
            )));
        }
        self.inner.sign(message)
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}

/// A generation and what this process knows about it.
struct Entry {
    record: Record,
    anchors: Vec<CaCertificate>,
    /// The CA with its key: only for CAs this process read from the Secret, until retired.
    keyed: Option<Arc<SecretCaContents>>,
}

impl Entry {
    /// A generation read from the history: no key.
    fn recorded(checked: Checked) -> Self {
        let Checked { record, anchors } = checked;
        Entry {
            record,
            anchors,
            keyed: None,
        }
    }
}

/// Starts the Secret backend.
#[derive(Debug)]
pub struct SecretCa;

impl SecretCa {
    /// Reads the Secret and the history, takes the steps that are due, and returns the handle
    /// (the CA that may sign now, and every anchor to publish) and the driver that keeps it
    /// current. Fails on a missing or bad Secret, an unreadable history, or (as leader) a
    /// history that cannot be written.
    pub async fn start(
        client: Client,
        options: SecretCaOptions,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Result<(CaHandle, SecretCaDriver), SecretCaError> {
        options.validate()?;
        let mut driver = SecretCaDriver {
            secrets: Api::namespaced(client.clone(), &options.namespace),
            configmaps: Api::namespaced(client, &options.namespace),
            options,
            clock,
            metrics,
            entries: vec![],
            latest: None,
            rejected_version: None,
            handle: None,
            installed: None,
            dirty: false,
        };
        driver.entries = driver.read_history().await?.unwrap_or_default();
        let now = (driver.clock)();
        let secret = driver.read_secret().await?;
        let contents = parse_secret(&secret, now, driver.clock.clone()).map_err(|reason| {
            SecretCaError::InvalidSecret {
                namespace: driver.options.namespace.clone(),
                name: driver.options.name.clone(),
                reason,
            }
        })?;
        info!(
            secret = %driver.secret_ref(),
            issuing = %contents.ca.certificate().subject(),
            fingerprint = %contents.ca.fingerprint(),
            "CA loaded from Secret"
        );
        driver.latest = Some(Arc::new(contents));
        driver.step(now);
        if driver.leading() {
            driver.write_history().await?;
        }
        driver.update_metrics(now);
        let handle = driver
            .handle
            .clone()
            .ok_or_else(|| SecretCaError::Config("no CA to install (internal error)".into()))?;
        Ok((handle, driver))
    }
}

/// Keeps the [`CaHandle`] on the Secret's CA through changes, with overlap.
pub struct SecretCaDriver {
    options: SecretCaOptions,
    secrets: Api<Secret>,
    configmaps: Api<ConfigMap>,
    clock: Clock,
    metrics: Arc<Metrics>,
    entries: Vec<Entry>,
    /// The last valid CA read from the Secret.
    latest: Option<Arc<SecretCaContents>>,
    /// The resourceVersion of a Secret refused already (logged and counted once).
    rejected_version: Option<String>,
    handle: Option<CaHandle>,
    /// What the handle holds: the signing generation and the anchors' fingerprints.
    installed: Option<(u32, Vec<String>)>,
    /// The history changed since it was last written.
    dirty: bool,
}

impl fmt::Debug for SecretCaDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretCaDriver")
            .field("options", &self.options)
            .field(
                "generations",
                &self
                    .entries
                    .iter()
                    .map(|e| {
                        format!(
                            "{} {} {}",
                            e.record.generation.id, e.record.generation.phase, e.record.fingerprint
                        )
                    })
                    .collect::<Vec<_>>(),
            )
            .field("installed", &self.installed)
            .finish_non_exhaustive()
    }
}

impl SecretCaDriver {
    /// The handle the PCR controller, the publisher and gRPC read.
    pub fn handle(&self) -> Option<&CaHandle> {
        self.handle.as_ref()
    }

    /// The generations as recorded (public data only).
    pub fn history(&self) -> History {
        History {
            secret: self.secret_ref(),
            generations: self.entries.iter().map(|e| e.record.clone()).collect(),
        }
    }

    /// One check: follows the leader's history (when not leading), takes the time-based steps
    /// that are due, reads the Secret and prepares a new CA found there, swaps the handle if
    /// the signer or the anchors changed, and writes the history (when leading). An API error
    /// leaves the CA in force; the next tick tries again.
    pub async fn tick(&mut self) -> Result<Tick, SecretCaError> {
        let leading = self.leading();
        if !leading && let Some(entries) = self.read_history().await? {
            self.adopt(entries);
        }
        let now = (self.clock)();
        let read = self.read_secret().await;
        let mut error = None;
        match read {
            Ok(secret) => self.observe(&secret, now),
            Err(e) => error = Some(e),
        }
        let mut tick = self.step(now);
        if leading
            && self.dirty
            && let Err(e) = self.write_history().await
        {
            error.get_or_insert(e);
        }
        self.update_metrics(now);
        tick.next = self.next_event(now);
        match error {
            Some(e) => Err(e),
            None => Ok(tick),
        }
    }

    /// Ticks until `shutdown` turns true: on every change of the Secret (a watch on that one
    /// object), when a rotation step is due, and at least every `poll`.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let fields = format!("metadata.name={}", self.options.name);
        let stream = watcher(
            self.secrets.clone(),
            watcher::Config::default().fields(&fields),
        )
        .default_backoff();
        let mut stream = std::pin::pin!(stream);
        // A deadline, not a duration: watch events that do not lead to a tick (errors during
        // backoff, the start of a relist) must not push a due step further out.
        let mut deadline = tokio::time::Instant::now();
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(watcher::Event::Apply(_) | watcher::Event::InitDone)) => {
                        debug!(secret = %self.secret_ref(), "CA Secret changed");
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        warn!(secret = %self.secret_ref(), "the CA Secret was deleted; keeping the CA in force");
                        continue;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        warn!(secret = %self.secret_ref(), error = %e, "watching the CA Secret");
                        continue;
                    }
                    None => {
                        warn!("the CA Secret watch ended");
                        return;
                    }
                },
                _ = tokio::time::sleep_until(deadline) => {}
                r = shutdown.wait_for(|s| *s) => { let _ = r; return; }
            }
            let wait = match self.tick().await {
                Ok(t) => podca_authority::rotation::wait_for_next(
                    t.next,
                    (self.clock)(),
                    self.options.poll,
                ),
                Err(e) => {
                    self.metrics.rotation_errors.inc();
                    warn!(secret = %self.secret_ref(), error = %e, "CA Secret check failed; keeping the CA in force");
                    self.options.poll.min(StdDuration::from_secs(30))
                }
            };
            deadline = tokio::time::Instant::now() + wait;
        }
    }

    fn leading(&self) -> bool {
        self.options.leading.as_ref().is_none_or(|r| *r.borrow())
    }

    fn secret_ref(&self) -> String {
        secret_ref(&self.options)
    }

    async fn read_secret(&self) -> Result<Secret, SecretCaError> {
        self.secrets
            .get_opt(&self.options.name)
            .await?
            .ok_or_else(|| SecretCaError::SecretNotFound {
                namespace: self.options.namespace.clone(),
                name: self.options.name.clone(),
            })
    }

    fn history_error(&self, reason: String) -> SecretCaError {
        SecretCaError::History {
            namespace: self.options.namespace.clone(),
            name: self.options.history_name(),
            reason,
        }
    }

    /// The recorded generations; `None` when there is no history yet.
    async fn read_history(&self) -> Result<Option<Vec<Entry>>, SecretCaError> {
        let Some(cm) = self
            .configmaps
            .get_opt(&self.options.history_name())
            .await?
        else {
            return Ok(None);
        };
        let generations = secret_history::parse_generations(&cm, &self.options)?;
        Ok(Some(
            generations
                .unwrap_or_default()
                .into_iter()
                .map(Entry::recorded)
                .collect(),
        ))
    }

    async fn write_history(&mut self) -> Result<(), SecretCaError> {
        let name = self.options.history_name();
        let text = serde_json::to_string_pretty(&self.history())
            .map_err(|e| self.history_error(e.to_string()))?;
        let mut cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.options.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_string(),
                    MANAGED_BY_VALUE.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(HISTORY_KEY.to_string(), text)])),
            ..ConfigMap::default()
        };
        let pp = PostParams {
            field_manager: Some("podca".into()),
            ..PostParams::default()
        };
        match self.configmaps.get_opt(&name).await? {
            None => {
                self.configmaps.create(&pp, &cm).await?;
            }
            Some(existing) => {
                if !owned(&existing) {
                    return Err(self.history_error(format!(
                        "exists without the label {MANAGED_BY_LABEL}={MANAGED_BY_VALUE}; podca \
                         does not overwrite it"
                    )));
                }
                if existing.data == cm.data {
                    self.dirty = false;
                    return Ok(());
                }
                cm.metadata.resource_version = existing.metadata.resource_version;
                self.configmaps.replace(&name, &pp, &cm).await?;
            }
        }
        debug!(configmap = %name, "CA history written");
        self.dirty = false;
        Ok(())
    }

    /// Takes over the leader's history, keeping the keys this process holds.
    fn adopt(&mut self, mut entries: Vec<Entry>) {
        let mut keys: Vec<Arc<SecretCaContents>> =
            self.entries.drain(..).filter_map(|e| e.keyed).collect();
        if let Some(latest) = &self.latest {
            keys.push(Arc::clone(latest));
        }
        for e in &mut entries {
            if matches!(e.record.generation.phase, Phase::Prepared | Phase::Active) {
                e.keyed = keys.iter().find(|k| k.same_ca(&e.record)).cloned();
            }
        }
        self.entries = entries;
    }

    /// Looks at the Secret: a valid new CA becomes `latest`; a bad one is reported once.
    fn observe(&mut self, secret: &Secret, now: OffsetDateTime) {
        let version = secret.metadata.resource_version.clone();
        if version.is_some() && version == self.rejected_version {
            return;
        }
        match parse_secret(secret, now, self.clock.clone()) {
            Ok(contents) => {
                self.rejected_version = None;
                let known = self.latest.as_ref().is_some_and(|l| {
                    l.chain_pem == contents.chain_pem && l.anchors_pem == contents.anchors_pem
                });
                if !known {
                    info!(
                        secret = %self.secret_ref(),
                        issuing = %contents.ca.certificate().subject(),
                        fingerprint = %contents.ca.fingerprint(),
                        anchors = ?contents.ca.roots().iter().map(|r| r.fingerprint()).collect::<Vec<_>>(),
                        "new CA seen in Secret"
                    );
                    self.latest = Some(Arc::new(contents));
                }
            }
            Err(reason) => {
                self.metrics.rotation_errors.inc();
                warn!(
                    secret = %self.secret_ref(),
                    resource_version = version.as_deref().unwrap_or(""),
                    %reason,
                    "the CA Secret holds no usable CA; keeping the CA in force until it changes"
                );
                self.rejected_version = version;
            }
        }
    }

    /// Records the latest Secret CA (prepared, or found in the history), runs the planner to a
    /// fixed point and installs the result in the handle. Pure bookkeeping; no API calls.
    fn step(&mut self, now: OffsetDateTime) -> Tick {
        let mut tick = Tick::default();
        // Time-based steps first: a prepared CA whose gate opened is activated before a newer
        // one could supersede it.
        self.plan_to_fixed_point(now, &mut tick.steps);
        self.record_latest(now, &mut tick.steps);
        self.plan_to_fixed_point(now, &mut tick.steps);
        tick.swapped = self.install(now);
        tick
    }

    fn record_latest(&mut self, now: OffsetDateTime, steps: &mut Vec<Step>) {
        let Some(latest) = self.latest.clone() else {
            return;
        };
        let live = |e: &Entry| matches!(e.record.generation.phase, Phase::Prepared | Phase::Active);
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| live(e) && latest.same_ca(&e.record))
        {
            if e.keyed.is_none() {
                e.keyed = Some(Arc::clone(&latest));
            }
            let id = e.record.generation.id;
            self.supersede_prepared(id, now, steps);
            return;
        }
        let id = secret_rotation::next_id(self.entries.iter().map(|e| &e.record.generation));
        let prepared_at = self.anchors_published_since(&latest, now);
        let ca = &latest.ca;
        let ca_not_after = ca
            .roots()
            .iter()
            .map(CaCertificate::not_after)
            .fold(ca.not_after(), OffsetDateTime::min);
        let record = Record {
            generation: Generation {
                id,
                phase: Phase::Prepared,
                ca_not_before: ca.certificate().not_before(),
                ca_not_after,
                prepared_at,
                activated_at: None,
                retired_at: None,
                activate_asap: true,
                last_leaf_not_after: None,
            },
            fingerprint: ca.fingerprint().to_string(),
            subject: ca.certificate().subject().to_string(),
            chain_pem: latest.chain_pem.clone(),
            anchors_pem: latest.anchors_pem.clone(),
        };
        info!(
            generation = id,
            secret = %self.secret_ref(),
            issuing = %record.subject,
            fingerprint = %record.fingerprint,
            anchors_published_since = %prepared_at,
            signs_from = %(prepared_at + self.options.schedule.propagation()),
            "prepared: the new CA's anchors are published; it signs once they have propagated"
        );
        self.count("prepare");
        steps.push(Step::Prepare);
        self.entries.push(Entry {
            anchors: ca.roots().to_vec(),
            record,
            keyed: Some(latest),
        });
        self.dirty = true;
        self.supersede_prepared(id, now, steps);
    }

    /// Prepared generations other than `keep` signed nothing: they are retired (and dropped as
    /// soon as the planner runs).
    fn supersede_prepared(&mut self, keep: u32, now: OffsetDateTime, steps: &mut Vec<Step>) {
        let superseded: Vec<u32> = self
            .entries
            .iter()
            .filter(|e| {
                e.record.generation.phase == Phase::Prepared && e.record.generation.id != keep
            })
            .map(|e| e.record.generation.id)
            .collect();
        let max_leaf = self.options.max_leaf_lifetime;
        for id in superseded {
            if let Some(e) = self
                .entries
                .iter_mut()
                .find(|e| e.record.generation.id == id)
            {
                e.record.generation.retire(max_leaf, now);
            }
            self.took(Step::Retire(id), steps);
        }
    }

    /// When every anchor of `ca` has been published without a gap (the earliest preparation of
    /// a still-published generation holding it); `now` for an anchor not published yet.
    fn anchors_published_since(
        &self,
        ca: &SecretCaContents,
        now: OffsetDateTime,
    ) -> OffsetDateTime {
        let generations = self.generations();
        let published: HashSet<u32> = rotation::published(&generations, now).into_iter().collect();
        ca.ca
            .roots()
            .iter()
            .map(|anchor| {
                self.entries
                    .iter()
                    .filter(|e| {
                        published.contains(&e.record.generation.id) && e.anchors.contains(anchor)
                    })
                    .map(|e| e.record.generation.prepared_at)
                    .min()
                    .unwrap_or(now)
            })
            .max()
            .unwrap_or(now)
    }

    fn generations(&self) -> Vec<Generation> {
        self.entries
            .iter()
            .map(|e| e.record.generation.clone())
            .collect()
    }

    fn plan_to_fixed_point(&mut self, now: OffsetDateTime, steps: &mut Vec<Step>) {
        let advanced = rotation::advance(
            &self.generations(),
            &self.options.schedule,
            self.options.max_leaf_lifetime,
            now,
        );
        // `prepare_due` is not for this backend: podca makes no CAs here, a new one comes from
        // the Secret.
        for (e, g) in self.entries.iter_mut().zip(advanced.generations) {
            e.record.generation = g;
        }
        for step in advanced.steps {
            self.took(step, steps);
        }
    }

    /// Logs, counts and records a step whose bookkeeping is done; a retired CA's key is let go.
    fn took(&mut self, step: Step, steps: &mut Vec<Step>) {
        let secret = self.secret_ref();
        let (name, id) = match step {
            Step::Activate(id) => ("activate", id),
            Step::Retire(id) => ("retire", id),
            Step::Drop(id) => ("drop", id),
            Step::Prepare => return,
        };
        let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.record.generation.id == id)
        else {
            return;
        };
        let g = &e.record.generation;
        match step {
            Step::Activate(_) => info!(
                generation = id,
                secret,
                issuing = %e.record.subject,
                fingerprint = %e.record.fingerprint,
                "activated: this CA signs from now on"
            ),
            Step::Retire(_) => {
                if let Some(k) = e.keyed.take() {
                    k.gate.retire();
                }
                info!(
                    generation = id,
                    secret,
                    fingerprint = %e.record.fingerprint,
                    anchor_published_until = %g.anchor_needed_until(),
                    "retired: this CA signs nothing; its anchor stays until its last certificate expired"
                );
            }
            Step::Drop(_) => info!(
                generation = id,
                secret,
                fingerprint = %e.record.fingerprint,
                "dropped: this CA's anchor leaves the trust bundle"
            ),
            Step::Prepare => {}
        }
        self.count(name);
        self.dirty = true;
        steps.push(step);
    }

    fn count(&self, step: &'static str) {
        self.metrics
            .rotation_steps
            .get_or_create(&StepLabels { step })
            .inc();
    }

    /// Opens the gates as the phases say, and swaps the handle when the signing CA or the
    /// anchors changed. Returns whether it swapped.
    fn install(&mut self, now: OffsetDateTime) -> bool {
        let propagation = self.options.schedule.propagation();
        for e in &self.entries {
            if let Some(k) = &e.keyed {
                match secret_rotation::gate(&e.record.generation, propagation) {
                    GateState::OpenFrom(t) => k.gate.open_from(t),
                    GateState::Retired => k.gate.retire(),
                }
            }
        }
        let signer = secret_rotation::signer(
            self.entries
                .iter()
                .map(|e| (&e.record.generation, e.keyed.is_some())),
        );
        let Some(signer) = signer.and_then(|i| self.entries.get(i)) else {
            return false;
        };
        let generations = self.generations();
        let published: HashSet<u32> = rotation::published(&generations, now).into_iter().collect();
        let mut anchors: Vec<CaCertificate> = vec![];
        for e in self
            .entries
            .iter()
            .filter(|e| published.contains(&e.record.generation.id))
        {
            for a in &e.anchors {
                if !anchors.contains(a) {
                    anchors.push(a.clone());
                }
            }
        }
        let id = signer.record.generation.id;
        let state = (id, anchors.iter().map(CaCertificate::fingerprint).collect());
        if self.installed.as_ref() == Some(&state) {
            return false;
        }
        let Some(keyed) = &signer.keyed else {
            return false;
        };
        let ca = Arc::clone(&keyed.ca);
        if signer.record.generation.phase == Phase::Prepared {
            warn!(
                generation = id,
                secret = %self.secret_ref(),
                signs_from = %(signer.record.generation.prepared_at + propagation),
                "the previous CA's key is not available (podca restarted during the propagation \
                 window, or the Secret changed while it was down): certificate requests stay \
                 pending until the new CA's anchor has been published for the window"
            );
        }
        let generation = match &self.handle {
            Some(h) => h.replace_arc(ca, anchors),
            None => {
                self.handle = Some(CaHandle::from_arc(ca, anchors));
                1
            }
        };
        info!(
            signing_generation = id,
            anchors = ?state.1,
            snapshot = generation,
            "CA handle updated"
        );
        self.installed = Some(state);
        true
    }

    /// When a step is next due: a prepared CA's window ends, or a retired anchor may go.
    fn next_event(&self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        secret_rotation::next_event(
            self.entries.iter().map(|e| &e.record.generation),
            self.options.schedule.propagation(),
            now,
        )
    }

    fn update_metrics(&self, now: OffsetDateTime) {
        self.metrics.ca_generation_not_after.clear();
        for e in &self.entries {
            let g = &e.record.generation;
            if g.phase == Phase::Dropped {
                continue;
            }
            self.metrics
                .ca_generation_not_after
                .get_or_create(&CaLabels {
                    generation: g.id.to_string(),
                    state: g.phase.to_string(),
                })
                .set(g.ca_not_after.unix_timestamp());
        }
        self.metrics.ca_next_rotation.set(
            self.next_event(now)
                .map(|t| t.unix_timestamp())
                .unwrap_or(0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use podca_signer::FileKey;
    use time::macros::datetime;

    const T0: OffsetDateTime = datetime!(2027-01-01 0:00 UTC);

    fn clock() -> Clock {
        Arc::new(|| T0)
    }

    /// A self-signed root valid for 30 days from T0: (certificate PEM, key PEM).
    fn root(cn: &str) -> (String, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key.pem");
        let key = FileKey::create(&path, CaAlgorithm::EcdsaP256).expect("key");
        let key_pem = std::fs::read_to_string(&path).expect("key file");
        let ca =
            IssuingCa::self_signed_root(Arc::new(key), cn, T0, Duration::days(30)).expect("root");
        (ca.certificate().pem(), key_pem)
    }

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("ca".into()),
                namespace: Some("podca".into()),
                ..ObjectMeta::default()
            },
            type_: Some(SECRET_TYPE.into()),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn a_valid_secret_parses_and_its_debug_holds_no_key() {
        let (cert, key) = root("a");
        let contents = parse_secret(
            &secret(&[("tls.crt", &cert), ("tls.key", &key)]),
            T0,
            clock(),
        )
        .expect("valid");
        assert_eq!(contents.ca().roots().len(), 1);
        assert!(contents.ca().roots()[0].is_self_signed());
        let debug = format!("{contents:?} {:?}", contents.ca());
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
        assert!(
            !debug.contains(key.lines().nth(1).expect("key body")),
            "{debug}"
        );
    }

    #[test]
    fn bad_secrets_are_refused_with_a_reason_and_no_key_material() {
        let (cert, key) = root("a");
        let (_, other_key) = root("b");
        let cases: Vec<(Secret, &str)> = vec![
            (secret(&[("tls.key", &key)]), "tls.crt is missing"),
            (secret(&[("tls.crt", &cert)]), "tls.key is missing"),
            (
                secret(&[
                    ("tls.crt", &cert),
                    (
                        "tls.key",
                        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
                    ),
                ]),
                "tls.key",
            ),
            (
                secret(&[("tls.crt", &cert), ("tls.key", &other_key)]),
                "does not match",
            ),
            (
                Secret {
                    type_: Some("Opaque".into()),
                    ..secret(&[("tls.crt", &cert), ("tls.key", &key)])
                },
                "kubernetes.io/tls",
            ),
        ];
        for (s, want) in cases {
            let e = parse_secret(&s, T0, clock()).expect_err(want);
            assert!(e.contains(want), "{e:?} should mention {want:?}");
            assert!(!e.contains("PRIVATE KEY"), "{e}");
        }
        let late = T0 + Duration::days(31);
        let e = parse_secret(
            &secret(&[("tls.crt", &cert), ("tls.key", &key)]),
            late,
            clock(),
        )
        .expect_err("expired");
        assert!(e.contains("expired"), "{e}");
    }

    #[test]
    fn the_gate_holds_signing_until_open_and_forever_after_retirement() {
        let (cert, key) = root("a");
        let contents = parse_secret(
            &secret(&[("tls.crt", &cert), ("tls.key", &key)]),
            T0,
            clock(),
        )
        .expect("valid");
        let k = contents.ca().key();
        let closed = k.sign(b"x").expect_err("closed at first");
        assert!(closed.is_transient());
        contents.gate.open_from(T0 + Duration::minutes(15));
        assert!(k.sign(b"x").expect_err("not yet").is_transient());
        contents.gate.open_from(T0);
        assert!(k.sign(b"x").is_ok());
        contents.gate.retire();
        assert!(k.sign(b"x").expect_err("retired").is_transient());
    }

    #[test]
    fn options_are_checked_and_their_debug_names_the_history() {
        let mut o = SecretCaOptions::new("podca", "ca");
        assert!(o.validate().is_ok());
        assert_eq!(o.history_name(), "ca-podca-history");
        assert!(format!("{o:?}").contains("ca-podca-history"));
        o.schedule.propagation_seconds = 60;
        assert!(o.validate().is_err());
    }
}
