//! The Kubernetes Secret CA backend: the issuing CA and its key come from a Secret of type
//! `kubernetes.io/tls` (`tls.crt`: the issuing certificate, optionally followed by
//! intermediates; `tls.key`: its private key, PKCS#8, SEC1 or PKCS#1 PEM; optional `ca.crt`: the
//! trust anchor(s), else the top of `tls.crt` must be a self-signed root). The Secret is watched,
//! and a new CA in it is taken over as a rotation with overlap, never as an abrupt switch: the
//! pure state machine that decides each step, what signs and what is published is
//! [`podca_authority::secret_rotation`] (its module documentation tells the phases, the same-
//! anchor shortcut and the gated key after a restart). This module does its Kubernetes I/O:
//! read the Secret and the history, apply the state machine, write the history and swap the
//! [`CaHandle`].
//!
//! ## Restart safety: the history ConfigMap
//!
//! The generations (public certificates, phases and timestamps; never keys) are kept in a
//! ConfigMap, `<secret-name>-podca-history` in the Secret's namespace by default, labelled
//! `app.kubernetes.io/managed-by=podca`, key `history.json`, written only by the leader (or by
//! the only replica); a replica that does not lead follows it. A ConfigMap rather than an
//! annotation on the Secret because podca needs no write access to the Secret that holds the CA
//! key (least privilege), and because that Secret is often owned by another tool (cert-manager,
//! external-secrets, GitOps) that rewrites or reports drift on its metadata. A ConfigMap that
//! exists without podca's label is never used nor overwritten: it is reported like a forged
//! history.
//!
//! The leader also keeps a copy of the last history it wrote on podca's ClusterTrustBundles,
//! out of a ConfigMap writer's reach (`copy`: why there, and how); a replica starting beside a
//! rejected, foreign or deleted ConfigMap starts from that copy when it verifies, exactly as from
//! the genuine history.
//!
//! The history is sealed with the Secret's key (`history.seal`) and verified on every read
//! ([`podca_authority::secret_rotation::seal`] tells why and how); a history that fails is never
//! used, and is reported once per ConfigMap resourceVersion as a Warning Event
//! (`CAHistoryRejected`) and in `podca_ca_history_rejected_total{reason}`.
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

mod copy;
mod error;
mod secret;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use podca_signer::CaCertificate;
use podca_signer::rotation::Schedule;
use time::{Duration, OffsetDateTime};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::bounded;
use crate::publisher::{DesiredBundle, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::secret_history::{owned, secret_ref};
use copy::Copies;
use podca_authority::metrics::{Metrics, ReasonLabels};
use podca_authority::secret_rotation::start::{self as starting, Source};
use podca_authority::secret_rotation::{
    Install, Observation, Rejection, Sealed, SecretRotation, Settings, Stepped,
};
use podca_authority::trust::{CaHandle, Clock};

pub use copy::{HISTORY_ANNOTATION, MAX_COPY_BYTES, SEAL_ANNOTATION};
pub use error::{ConfigError, HistoryError, SecretCaError};
pub use podca_authority::rotation::Tick;
pub use podca_authority::secret_rotation::{
    History, Record, SECRET_TYPE, SecretCaContents, SecretError, SecretField,
};
pub use secret::parse_secret;

/// The ConfigMap key that holds the history.
pub const HISTORY_KEY: &str = "history.json";
/// The ConfigMap key that holds the history's seal (a signature by the Secret's key).
pub const SEAL_KEY: &str = "history.seal";
/// Appended to the Secret's name for the default history ConfigMap name.
pub const HISTORY_SUFFIX: &str = "-podca-history";
/// The shortest propagation window accepted (kubelet caches trust bundles for about 5 minutes).
pub const MIN_PROPAGATION_SECONDS: i64 = 600;

/// What the Secret backend needs.
#[derive(Clone)]
pub struct SecretCaOptions {
    /// The CA's name in the configuration (`default`: `[ca]`): labels its metrics.
    pub ca_name: String,
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
    /// podca's own ClusterTrustBundles, which keep a copy of the last sealed history where a
    /// ConfigMap writer cannot reach ([`HISTORY_ANNOTATION`]); empty: no copy is kept.
    pub history_copies: Vec<DesiredBundle>,
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
            .field("history_copies", &self.history_copies)
            .finish()
    }
}

impl SecretCaOptions {
    /// Defaults (15-minute propagation window, 24-hour leaf bound, 60-second poll, single
    /// replica) for the Secret `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        SecretCaOptions {
            ca_name: podca_authority::config::DEFAULT_CA_NAME.into(),
            namespace: namespace.into(),
            name: name.into(),
            schedule: Schedule::default(),
            max_leaf_lifetime: Duration::hours(24),
            history_configmap: None,
            poll: StdDuration::from_secs(60),
            leading: None,
            history_copies: vec![],
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
            return Err(SecretCaError::Config(ConfigError::NoSecretName));
        }
        if self.schedule.propagation_seconds < MIN_PROPAGATION_SECONDS {
            return Err(SecretCaError::Config(ConfigError::PropagationTooShort {
                seconds: self.schedule.propagation_seconds,
            }));
        }
        if self.max_leaf_lifetime <= Duration::ZERO {
            return Err(SecretCaError::Config(
                ConfigError::MaxLeafLifetimeNotPositive,
            ));
        }
        Ok(())
    }
}

/// Starts the Secret backend.
#[derive(Debug)]
pub struct SecretCa;

impl SecretCa {
    /// Reads the Secret and the history, takes the steps that are due, and returns the handle
    /// (the CA that may sign now, and every anchor to publish) and the driver that keeps it
    /// current. Fails on a missing or bad Secret, or (as leader) a history that cannot be
    /// written. A history that does not verify, or a ConfigMap of that name without podca's
    /// label, is reported and replaced by podca's copy of its last history when one verifies
    /// ([`podca_authority::secret_rotation::start`]).
    pub async fn start(
        client: Client,
        options: SecretCaOptions,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Result<(CaHandle, SecretCaDriver), SecretCaError> {
        options.validate()?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &options.namespace);
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &options.namespace);
        let client_for_copies = client.clone();
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "podca.dev/secret-ca".into(),
                instance: None,
            },
        );
        // The Secret first: the history is verified against its CA.
        let now = clock();
        let secret = read_secret(&secrets, &options, &metrics).await?;
        let contents = parse_secret(&secret, now, clock.clone()).map_err(|reason| {
            SecretCaError::InvalidSecret {
                namespace: options.namespace.clone(),
                name: options.name.clone(),
                reason,
            }
        })?;
        info!(
            secret = %secret_ref(&options),
            issuing = %contents.ca().certificate().subject(),
            fingerprint = %contents.ca().fingerprint(),
            "CA loaded from Secret"
        );
        let settings = Settings {
            secret: secret_ref(&options),
            schedule: options.schedule,
            max_leaf_lifetime: options.max_leaf_lifetime,
        };
        let stored = read_stored(&configmaps, &options, &metrics).await?;
        let copies = Copies::discover(
            client_for_copies,
            options.history_copies.clone(),
            Arc::clone(&metrics),
        )
        .await?;
        let found = match &copies {
            Some(c) => c.read().await,
            None => vec![],
        };
        let starting::Start {
            state,
            source,
            rejected,
            copies_rejected,
        } = starting::choose(
            settings,
            contents,
            stored
                .as_ref()
                .map_or(starting::Stored::Missing, Stored::at_start),
            &found,
            now,
        );
        for rejection in &copies_rejected {
            warn!(
                secret = %secret_ref(&options),
                reason = rejection.reason(),
                %rejection,
                "podca's copy of the CA history on its ClusterTrustBundle does not verify; not used"
            );
        }
        let mut driver = SecretCaDriver {
            state,
            options,
            secrets,
            configmaps,
            clock,
            metrics,
            recorder,
            handle: None,
            reported_version: None,
            last_written: None,
            copies,
            copy_checked: None,
        };
        if let Some(rejection) = rejected {
            let action = match source {
                Source::Copy => {
                    "ignored at start: podca's copy of its last history (on its ClusterTrustBundle) \
                     is used instead"
                }
                _ => "ignored at start: the Secret's CA alone, held for one propagation window",
            };
            let stored = stored.unwrap_or_default();
            driver.report_rejected(&stored, &rejection, action).await;
        }
        if source == Source::Copy {
            info!(
                secret = %driver.secret_ref(),
                "CA history recovered from podca's copy on its ClusterTrustBundle"
            );
        }
        let stepped = driver.state.step(now);
        driver.apply(stepped);
        if driver.leading() {
            driver.write_history().await?;
            driver.write_copy().await;
        }
        driver.update_metrics(now);
        let handle = driver
            .handle
            .clone()
            .ok_or(SecretCaError::NothingInstalled)?;
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
    recorder: Recorder,
    state: SecretRotation,
    handle: Option<CaHandle>,
    /// The resourceVersion of the history ConfigMap last reported as rejected (once each).
    reported_version: Option<String>,
    /// What this replica last wrote, to tell someone else's change from its own.
    last_written: Option<Sealed>,
    /// Where podca keeps its copy of the history (`None`: nowhere).
    copies: Option<Copies>,
    /// When every bundle was last seen holding `last_written` (`None`: not since it changed).
    copy_checked: Option<tokio::time::Instant>,
}

impl fmt::Debug for SecretCaDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretCaDriver")
            .field("options", &self.options)
            .field("state", &self.state)
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
        self.state.history()
    }

    /// One check: reads the Secret and prepares a new CA found there, verifies the history
    /// (a follower adopts the leader's; a forged one is reported and ignored, and the leader
    /// writes its own over it), takes the time-based steps that are due, swaps the handle if
    /// the signer or the anchors changed, and writes the history (when leading). An API error
    /// leaves the CA in force; the next tick tries again.
    pub async fn tick(&mut self) -> Result<Tick, SecretCaError> {
        let leading = self.leading();
        let now = (self.clock)();
        let mut error = None;
        // The Secret first: the history is verified against its CA.
        match read_secret(&self.secrets, &self.options, &self.metrics).await {
            Ok(secret) => self.observe(&secret, now),
            Err(e) => error = Some(e),
        }
        if let Err(e) = self.check_history(leading, now).await {
            error.get_or_insert(e);
        }
        let stepped = self.state.step(now);
        let mut tick = self.apply(stepped);
        if leading
            && self.state.needs_writing()
            && let Err(e) = self.write_history().await
        {
            error.get_or_insert(e);
        }
        if leading {
            self.write_copy().await;
        }
        self.update_metrics(now);
        tick.next = self.state.next_event(now);
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
            bounded::watcher_config(watcher::Config::default().fields(&fields)),
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
            let ticked = self.tick().await;
            self.metrics.rotation_checks.inc();
            let wait = match ticked {
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

    /// Reads the history ConfigMap and verifies it (when it is not what this replica wrote). A
    /// follower adopts a history that verifies; a rejected one is reported and left unused (the
    /// replica keeps what it had), and the leader writes its own over it.
    async fn check_history(
        &mut self,
        leading: bool,
        now: OffsetDateTime,
    ) -> Result<(), SecretCaError> {
        let Some(stored) = read_stored(&self.configmaps, &self.options, &self.metrics).await?
        else {
            return Ok(());
        };
        if !stored.owned {
            self.report_rejected(
                &stored,
                &Rejection::NotOwned,
                "ignored: the CA and anchors in force stay; podca does not overwrite it, so the \
                 history is not recorded until it is deleted (podca's copy on its \
                 ClusterTrustBundle keeps the last one)",
            )
            .await;
            return Ok(());
        }
        let Some((history_json, seal_json)) = stored.text() else {
            return Ok(());
        };
        if let Some(ours) = &self.last_written
            && ours.history_json == history_json
            && Some(ours.seal_json.as_str()) == seal_json
        {
            return Ok(());
        }
        match self.state.open(history_json, seal_json, now) {
            Ok(opened) if !leading => self.state.adopt_opened(opened),
            Ok(_) => {}
            Err(rejection) => {
                let action = if leading {
                    self.state.rewrite();
                    "ignored: the CA and anchors in force stay, and the leader writes its history over it"
                } else {
                    "ignored: the CA and anchors in force stay"
                };
                self.report_rejected(&stored, &rejection, action).await;
            }
        }
        Ok(())
    }

    /// Logs, counts and records as a Warning Event a rejected history, once per resourceVersion
    /// of its ConfigMap. The Event is best effort.
    async fn report_rejected(&mut self, stored: &Stored, rejection: &Rejection, action: &str) {
        if stored.resource_version.is_some() && stored.resource_version == self.reported_version {
            return;
        }
        self.reported_version.clone_from(&stored.resource_version);
        self.metrics
            .ca_history_rejected
            .get_or_create(&ReasonLabels {
                reason: rejection.reason(),
            })
            .inc();
        let name = self.options.history_name();
        warn!(
            configmap = %name,
            namespace = %self.options.namespace,
            resource_version = stored.resource_version.as_deref().unwrap_or(""),
            reason = rejection.reason(),
            %rejection,
            "the CA history does not verify; {action}"
        );
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: "CAHistoryRejected".into(),
            note: Some(
                format!("{rejection}; {action}")
                    .chars()
                    .take(1000)
                    .collect(),
            ),
            action: "VerifyHistory".into(),
            secondary: None,
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some(name),
            namespace: Some(self.options.namespace.clone()),
            uid: stored.uid.clone(),
            resource_version: stored.resource_version.clone(),
            ..Default::default()
        };
        match tokio::time::timeout(
            StdDuration::from_secs(5),
            self.recorder.publish(&event, &reference),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "could not record the CA history Event"),
            Err(_) => warn!("recording the CA history Event timed out"),
        }
    }

    /// Hands the Secret to the state machine; a bad one is logged and counted once.
    fn observe(&mut self, secret: &Secret, now: OffsetDateTime) {
        let version = secret.metadata.resource_version.as_deref();
        let clock = self.clock.clone();
        if let Observation::Rejected(reason) = self
            .state
            .observe(version, || parse_secret(secret, now, clock))
        {
            self.metrics.rotation_errors.inc();
            warn!(
                secret = %self.secret_ref(),
                resource_version = version.unwrap_or(""),
                %reason,
                "the CA Secret holds no usable CA; keeping the CA in force until it changes"
            );
        }
    }

    /// Counts the steps and swaps the handle when the state machine says so.
    fn apply(&mut self, stepped: Stepped) -> Tick {
        let Stepped { steps, install } = stepped;
        for step in &steps {
            self.metrics
                .count_rotation_step(&self.options.ca_name, step.as_str());
        }
        let swapped = install.is_some();
        if let Some(install) = install {
            self.install(install);
        }
        Tick {
            steps,
            swapped,
            next: None,
        }
    }

    fn install(&mut self, install: Install) {
        let Install {
            generation,
            ca,
            anchors,
            gated_until,
        } = install;
        if let Some(signs_from) = gated_until {
            warn!(
                generation,
                secret = %self.secret_ref(),
                %signs_from,
                "the previous CA's key is not available (podca restarted during the propagation \
                 window, or the Secret changed while it was down): certificate requests stay \
                 pending until the new CA's anchor has been published for the window"
            );
        }
        let fingerprints: Vec<String> = anchors.iter().map(CaCertificate::fingerprint).collect();
        let snapshot = match &self.handle {
            Some(h) => h.replace_numbered(ca, anchors, Some(generation)),
            None => {
                self.handle = Some(CaHandle::numbered(ca, anchors, Some(generation)));
                1
            }
        };
        info!(
            signing_generation = generation,
            anchors = ?fingerprints,
            snapshot,
            "CA handle updated"
        );
    }

    fn update_metrics(&self, now: OffsetDateTime) {
        let values = self.state.metric_values(now);
        let series = values
            .generations
            .into_iter()
            .map(|g| {
                (
                    g.generation.to_string(),
                    g.phase.to_string(),
                    g.not_after.unix_timestamp(),
                )
            })
            .collect();
        self.metrics
            .set_ca_generations(&self.options.ca_name, series);
        self.metrics
            .set_ca_next_rotation(&self.options.ca_name, values.next_rotation);
    }

    fn history_error(&self, reason: HistoryError) -> SecretCaError {
        history_error(&self.options, reason)
    }

    async fn write_history(&mut self) -> Result<(), SecretCaError> {
        let name = self.options.history_name();
        let sealed = self.state.seal((self.clock)()).map_err(|e| {
            self.history_error(HistoryError::Encode {
                detail: e.to_string(),
            })
        })?;
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
            data: Some(BTreeMap::from([
                (HISTORY_KEY.to_string(), sealed.history_json.clone()),
                (SEAL_KEY.to_string(), sealed.seal_json.clone()),
            ])),
            ..ConfigMap::default()
        };
        let pp = PostParams {
            field_manager: Some("podca".into()),
            ..PostParams::default()
        };
        let existing = bounded::call(
            "get_ca_history",
            &self.metrics,
            self.configmaps.get_opt(&name),
        )
        .await?;
        match existing {
            None => {
                bounded::call(
                    "create_ca_history",
                    &self.metrics,
                    self.configmaps.create(&pp, &cm),
                )
                .await?;
            }
            Some(existing) => {
                if !owned(&existing) {
                    // Reported by the read (once per resourceVersion); never overwritten.
                    debug!(configmap = %name, "the history ConfigMap is someone else's; not written");
                    return Ok(());
                }
                cm.metadata.resource_version = existing.metadata.resource_version;
                bounded::call(
                    "replace_ca_history",
                    &self.metrics,
                    self.configmaps.replace(&name, &pp, &cm),
                )
                .await?;
            }
        }
        debug!(configmap = %name, "CA history written");
        self.state.written();
        self.last_written = Some(sealed);
        self.copy_checked = None;
        Ok(())
    }

    /// Puts the history last written on podca's ClusterTrustBundles, when it changed since or
    /// was last seen there [`COPY_RECHECK`] ago (a bundle re-created without it gets it back).
    async fn write_copy(&mut self) {
        let (Some(copies), Some(sealed)) = (&self.copies, &self.last_written) else {
            return;
        };
        if self
            .copy_checked
            .is_some_and(|t| t.elapsed() < COPY_RECHECK)
        {
            return;
        }
        if copies.write(sealed).await {
            self.copy_checked = Some(tokio::time::Instant::now());
        }
    }
}

/// The history ConfigMap of `options` refused for `reason`.
pub(crate) fn history_error(options: &SecretCaOptions, reason: HistoryError) -> SecretCaError {
    SecretCaError::History {
        namespace: options.namespace.clone(),
        name: options.history_name(),
        reason,
    }
}

async fn read_secret(
    secrets: &Api<Secret>,
    options: &SecretCaOptions,
    metrics: &Metrics,
) -> Result<Secret, SecretCaError> {
    bounded::call("get_ca_secret", metrics, secrets.get_opt(&options.name))
        .await?
        .ok_or_else(|| SecretCaError::SecretNotFound {
            namespace: options.namespace.clone(),
            name: options.name.clone(),
        })
}

/// How often the leader checks that its copy is still on its ClusterTrustBundles when nothing
/// changed.
const COPY_RECHECK: StdDuration = StdDuration::from_secs(300);

/// The history ConfigMap as stored, not yet verified.
#[derive(Debug, Clone, Default)]
struct Stored {
    resource_version: Option<String>,
    uid: Option<String>,
    /// It carries podca's label; otherwise nothing of it is read.
    owned: bool,
    history_json: Option<String>,
    seal_json: Option<String>,
}

impl Stored {
    /// The history text and its seal; `None` without a history.
    fn text(&self) -> Option<(&str, Option<&str>)> {
        let history = self.history_json.as_deref()?;
        Some((history, self.seal_json.as_deref()))
    }

    /// What the start-up choice sees of it.
    fn at_start(&self) -> starting::Stored<'_> {
        match (self.owned, self.text()) {
            (false, _) => starting::Stored::NotOwned,
            (true, None) => starting::Stored::Missing,
            (true, Some((history_json, seal_json))) => starting::Stored::Text {
                history_json,
                seal_json,
            },
        }
    }
}

/// The history ConfigMap; `None` when there is none yet. One that podca does not own is
/// returned without its data (podca neither uses nor overwrites it; the caller reports it).
async fn read_stored(
    configmaps: &Api<ConfigMap>,
    options: &SecretCaOptions,
    metrics: &Metrics,
) -> Result<Option<Stored>, SecretCaError> {
    let name = options.history_name();
    let Some(cm) = bounded::call("get_ca_history", metrics, configmaps.get_opt(&name)).await?
    else {
        return Ok(None);
    };
    let owned = owned(&cm);
    let mut data = if owned {
        cm.data.unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    Ok(Some(Stored {
        resource_version: cm.metadata.resource_version,
        uid: cm.metadata.uid,
        owned,
        history_json: data.remove(HISTORY_KEY),
        seal_json: data.remove(SEAL_KEY),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_and_their_debug_names_the_history() {
        let mut o = SecretCaOptions::new("podca", "ca");
        assert!(o.validate().is_ok());
        assert_eq!(o.history_name(), "ca-podca-history");
        assert!(format!("{o:?}").contains("ca-podca-history"));
        o.schedule.propagation_seconds = 60;
        assert!(matches!(
            o.validate(),
            Err(SecretCaError::Config(ConfigError::PropagationTooShort {
                seconds: 60
            }))
        ));
        o.schedule.propagation_seconds = MIN_PROPAGATION_SECONDS;
        assert!(o.validate().is_ok());
        o.max_leaf_lifetime = Duration::ZERO;
        assert!(matches!(
            o.validate(),
            Err(SecretCaError::Config(
                ConfigError::MaxLeafLifetimeNotPositive
            ))
        ));
        let nameless = SecretCaOptions::new("podca", "");
        assert!(matches!(
            nameless.validate(),
            Err(SecretCaError::Config(ConfigError::NoSecretName))
        ));
    }
}
