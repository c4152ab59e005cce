//! The JWT-SVID signing keys of the Secret CA backend (`[ca] backend = "secret"`), in a
//! Kubernetes Secret of their own.
//!
//! # Design
//!
//! * **Where.** One Secret beside the CA Secret, in its namespace: `[jwt] keys_secret`, default
//!   `<CA Secret name>-jwt` (`podca-ca-jwt` in deploy/). Type `Opaque`, labelled
//!   `app.kubernetes.io/managed-by: podca`. Its data ([`podca_signer::jwt::secret`]):
//!   `state.json` (the keys, their phases and times: the same JSON as a data directory's
//!   `jwt/state.json`) and `<kid>.key`, each key's private key as PKCS#8 PEM. The JWT keys are
//!   distinct from the CA key (which stays in the CA Secret, written by the operator or
//!   cert-manager, never by podca) and rotate on their own schedule (`[jwt]`).
//! * **Who writes.** Only the leader (`podca serve --leader-elect`; without it, the one
//!   process). It takes the schedule's steps with `keyset::plan`/`keyset::apply` (through
//!   [`JwtSecretKeys::advance`]), exactly as the data-directory store does, and writes the
//!   result in one request: `create` when the Secret is absent, else `replace` carrying the
//!   resourceVersion it read (optimistic concurrency). A 409 (another writer, or an edit, came
//!   between) discards the step — the new key was never published nor used — and re-reads, at
//!   most [`ATTEMPTS`] times per check. A Secret of that name without podca's label is someone
//!   else's: it is never overwritten, and every check fails with [`JwtSecretError::Foreign`],
//!   which names it (at start, `podca serve` refuses to start).
//! * **Who follows.** Every other replica (a standby) re-reads the Secret every poll (5 s in
//!   `podca serve`) and when its leadership changes, and installs what it finds; it never
//!   writes. So every replica signs with the key the Secret marks active and publishes the same
//!   JWKS (its gRPC `GetJwtBundle`, Workload API bundle streams and OIDC `/keys`), at most one
//!   poll behind the leader.
//! * **Crash safety.** The state and the keys it names change in one Secret update, which the
//!   API server applies atomically, and the in-memory key set is replaced only after the write
//!   succeeded: no key signs, and none is published, before the Secret holds it. A leader killed
//!   anywhere leaves the old or the new Secret, never a half; a new leader continues from it.
//!   The schedule's rules hold across replicas: a key is published for the propagation window
//!   (`published_at`, recorded in the Secret) before it signs, and a retired key stays until
//!   its `not_after`, fixed at activation, after which no token it signed is valid (tokens are
//!   capped at their key's `not_after`, so a standby one poll behind cannot sign past it). A
//!   standby that sees a prepared key one poll late publishes it one poll later than the
//!   leader; keep `propagation_seconds` well above the poll.
//! * **A deleted Secret.** The leader re-creates it from the keys it holds in memory (no key
//!   changes, nothing re-published); a standby keeps the keys it has. Only a leader that never
//!   saw the keys (a restart after the deletion) starts over with a new key, active at once.
//! * **RBAC.** `get` and `update` on that Secret by name, `create` in its namespace (Kubernetes
//!   cannot limit `create` by name), as for the JWKS ConfigMap.
//!
//! Errors and logs name the Secret and the data key, never key material.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};
use podca_authority::jwt::{JwtConfig, JwtHandle, export_metrics};
use podca_authority::metrics::{Metrics, OpLabels};
use podca_authority::trust::Clock;
use podca_signer::CaAlgorithm;
use podca_signer::jwt::secret::JwtSecretKeys;
use podca_signer::jwt::{JwtKeySchedule, JwtKeyStep, keyset};
use podca_signer::store::StoreError;
use time::OffsetDateTime;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::bounded;
use crate::publisher::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// Writes per check before a run of 409 conflicts is reported.
pub const ATTEMPTS: usize = 3;

/// Why the JWT key Secret could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JwtSecretError {
    #[error(
        "the Secret {secret} exists but is not podca's (no label \
         {MANAGED_BY_LABEL}={MANAGED_BY_VALUE}): podca never overwrites it; delete or rename it, \
         or set [jwt] keys_secret to another name"
    )]
    Foreign { secret: String },
    #[error("the JWT key Secret {secret}: {source}")]
    Kube {
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the Secret {secret} changed {ATTEMPTS} times while podca wrote it (409 Conflict); the \
         next check tries again"
    )]
    Conflicts { secret: String },
    #[error(transparent)]
    Keys(#[from] StoreError),
}

/// The JWT key Secret: reads and writes (see the module docs).
#[derive(Clone)]
pub struct JwtSecretStore {
    api: Api<Secret>,
    namespace: String,
    name: String,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for JwtSecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSecretStore")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn owned(secret: &Secret) -> bool {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY_VALUE)
}

impl JwtSecretStore {
    pub fn new(client: Client, namespace: &str, name: &str, metrics: Arc<Metrics>) -> Self {
        JwtSecretStore {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            metrics,
        }
    }

    /// `<namespace>/<name>`.
    pub fn secret(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `kubernetes-secret:<namespace>/<name>`: where `podca ca show` says the keys are.
    pub fn location(&self) -> String {
        format!("kubernetes-secret:{}", self.secret())
    }

    fn kube(&self, source: kube::Error) -> JwtSecretError {
        JwtSecretError::Kube {
            secret: self.secret(),
            source,
        }
    }

    /// The Secret and the keys in it; None: there is no Secret of that name.
    async fn get(&self) -> Result<Option<(Secret, JwtSecretKeys)>, JwtSecretError> {
        let secret = bounded::call(
            "get_jwt_secret",
            &self.metrics,
            self.api.get_opt(&self.name),
        )
        .await
        .map_err(|e| self.kube(e))?;
        let Some(secret) = secret else {
            return Ok(None);
        };
        if !owned(&secret) {
            return Err(JwtSecretError::Foreign {
                secret: self.secret(),
            });
        }
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        let keys = JwtSecretKeys::parse(&self.location(), &data)?;
        Ok(Some((secret, keys)))
    }

    /// The keys in the Secret, without writing anything; None: no Secret yet.
    pub async fn read(&self) -> Result<Option<JwtSecretKeys>, JwtSecretError> {
        Ok(self.get().await?.map(|(_, keys)| keys))
    }

    /// Takes the schedule's due steps at `now` and writes them (create, or replace with the
    /// resourceVersion read). `held`: the keys this process already has, used when the Secret
    /// is gone (it is re-created from them). Returns the keys now in the Secret and the steps.
    pub async fn advance(
        &self,
        now: OffsetDateTime,
        schedule: &JwtKeySchedule,
        algorithm: CaAlgorithm,
        held: Option<&JwtSecretKeys>,
    ) -> Result<(JwtSecretKeys, Vec<JwtKeyStep>), JwtSecretError> {
        let pp = PostParams {
            field_manager: Some("podca".into()),
            ..PostParams::default()
        };
        for _ in 0..ATTEMPTS {
            let existing = self.get().await?;
            let recreate = existing.is_none() && held.is_some_and(|k| k.sequence() > 0);
            let (base, mut keys) = match existing {
                Some((secret, keys)) => (Some(secret), keys),
                None => (
                    None,
                    held.cloned()
                        .unwrap_or_else(|| JwtSecretKeys::empty(&self.location())),
                ),
            };
            let steps = keys.advance(now, schedule, algorithm)?;
            if steps.is_empty() && !recreate {
                return Ok((keys, steps));
            }
            let data = keys
                .data()?
                .into_iter()
                .map(|(k, v)| (k, ByteString(v)))
                .collect();
            let labels =
                BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned())]);
            let (op, result) = match base {
                None => {
                    let secret = Secret {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            namespace: Some(self.namespace.clone()),
                            labels: Some(labels),
                            ..ObjectMeta::default()
                        },
                        type_: Some("Opaque".into()),
                        data: Some(data),
                        ..Secret::default()
                    };
                    let result = bounded::call(
                        "create_jwt_secret",
                        &self.metrics,
                        self.api.create(&pp, &secret),
                    )
                    .await;
                    ("create", result)
                }
                Some(existing) => {
                    // Keep what others put in the metadata (annotations, more labels) and the
                    // resourceVersion read: a change in between is a 409.
                    let mut metadata = existing.metadata;
                    metadata.managed_fields = None;
                    metadata
                        .labels
                        .get_or_insert_with(BTreeMap::new)
                        .extend(labels);
                    let secret = Secret {
                        metadata,
                        type_: existing.type_,
                        data: Some(data),
                        ..Secret::default()
                    };
                    let result = bounded::call(
                        "replace_jwt_secret",
                        &self.metrics,
                        self.api.replace(&self.name, &pp, &secret),
                    )
                    .await;
                    ("update", result)
                }
            };
            match result {
                Ok(_) => {
                    self.metrics
                        .jwt_key_secret_writes
                        .get_or_create(&OpLabels { op })
                        .inc();
                    if recreate && steps.is_empty() {
                        warn!(secret = %self.secret(), "the JWT key Secret was gone: re-created it from the keys in memory");
                    } else {
                        info!(secret = %self.secret(), steps = ?steps, "JWT signing keys changed in the Secret");
                    }
                    return Ok((keys, steps));
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    debug!(secret = %self.secret(), "the JWT key Secret changed meanwhile; reading it again");
                }
                Err(e) => return Err(self.kube(e)),
            }
        }
        Err(JwtSecretError::Conflicts {
            secret: self.secret(),
        })
    }
}

/// Runs the JWT key schedule over the Secret: the leader takes the steps, the others follow.
pub struct JwtSecretRotator {
    store: JwtSecretStore,
    schedule: JwtKeySchedule,
    algorithm: CaAlgorithm,
    handle: JwtHandle,
    /// The keys last read or written (what a deleted Secret is re-created from).
    held: Mutex<Option<JwtSecretKeys>>,
    clock: Clock,
    poll: StdDuration,
    metrics: Arc<Metrics>,
    leading: watch::Receiver<bool>,
}

impl std::fmt::Debug for JwtSecretRotator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSecretRotator")
            .field("store", &self.store)
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}

impl JwtSecretRotator {
    /// Reads the Secret (and, when `leading` says this replica leads, takes the due steps: the
    /// first key on a first start) and returns the driver. A standby starts with the keys in the
    /// Secret, possibly none: no token is signed until the leader made one. A Secret that cannot
    /// be used (foreign, unparsable, forbidden, the API unreachable) does not stop the start —
    /// certificates do not depend on it — but is logged with its reason, counted in
    /// `podca_jwt_key_rotation_errors_total`, and checked again every poll; until then no JWT-SVID
    /// is signed. Fails only on an unusable `[jwt]` configuration.
    pub async fn start(
        store: JwtSecretStore,
        config: &JwtConfig,
        clock: Clock,
        poll: StdDuration,
        leading: watch::Receiver<bool>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, JwtSecretError> {
        config.check().map_err(|e| StoreError::JwtKey {
            location: store.location(),
            detail: e.to_string(),
        })?;
        let rotator = JwtSecretRotator {
            store,
            schedule: config.schedule(),
            algorithm: config.key_algorithm,
            handle: JwtHandle::new(podca_signer::jwt::JwtKeySet::default()),
            held: Mutex::new(None),
            clock,
            poll,
            metrics,
            leading,
        };
        if let Err(e) = rotator.tick().await {
            warn!(error = %e, "JWT signing keys unusable at start; no JWT-SVID is signed until they are");
        }
        Ok(rotator)
    }

    pub fn handle(&self) -> &JwtHandle {
        &self.handle
    }

    /// One check: the leader takes due steps, a standby re-reads; the result is installed.
    /// Returns when the next step is due.
    pub async fn tick(&self) -> Result<Option<OffsetDateTime>, JwtSecretError> {
        let held = self.held.lock().ok().and_then(|h| h.clone());
        let result = if *self.leading.borrow() {
            self.store
                .advance(
                    (self.clock)(),
                    &self.schedule,
                    self.algorithm,
                    held.as_ref(),
                )
                .await
                .map(|(keys, _)| Some(keys))
        } else {
            self.store.read().await
        };
        let keys = match result {
            Ok(Some(keys)) => keys,
            Ok(None) => match held {
                // A standby keeps what it has while the Secret is gone.
                Some(keys) => {
                    warn!(secret = %self.store.secret(), "the JWT key Secret is gone; keeping the keys in memory");
                    keys
                }
                None => JwtSecretKeys::empty(&self.store.location()),
            },
            Err(e) => {
                self.metrics.jwt_key_rotation_errors.inc();
                return Err(e);
            }
        };
        let set = keys.key_set().inspect_err(|_| {
            self.metrics.jwt_key_rotation_errors.inc();
        })?;
        let infos: Vec<_> = set.infos().cloned().collect();
        self.handle.replace(set);
        export_metrics(&self.metrics, &self.handle.current(), &self.schedule);
        if let Ok(mut h) = self.held.lock() {
            *h = Some(keys);
        }
        Ok(keyset::next_event(&infos, &self.schedule))
    }

    /// Ticks until `shutdown` turns true, in the one key loop
    /// ([`podca_authority::key_driver::drive`]): when a step is due, at least every poll, and
    /// at once when leadership changes.
    pub async fn run(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        podca_authority::key_driver::drive(self, shutdown).await;
    }
}

impl podca_authority::key_driver::KeyKeeper for JwtSecretRotator {
    type Error = JwtSecretError;
    const WHAT: &'static str = "JWT key Secret";

    fn check(
        &self,
    ) -> impl std::future::Future<Output = Result<Option<OffsetDateTime>, JwtSecretError>> + Send
    {
        self.tick()
    }

    fn takes_steps(&self) -> bool {
        *self.leading.borrow()
    }

    fn leadership(&self) -> Option<watch::Receiver<bool>> {
        Some(self.leading.clone())
    }

    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn poll(&self) -> StdDuration {
        self.poll
    }
}
