//! An in-process emulator of the parts of the Kubernetes API that a
//! PodCertificateRequest signer uses. See the crate docs for an overview.

pub mod auth;
pub mod configmaps;
pub mod errors;
mod http;
pub mod keys;
pub mod latency;
mod managed;
pub mod mldsa;
pub mod names;
mod patch;
pub mod pcr;
pub mod pem;
pub mod pod_state;
pub mod podca_rbac;
pub mod resources;
mod selectors;
pub mod services;
pub mod store;

pub use auth::{PolicyRule, ServiceAccountToken, Subject, UserInfo};
pub use errors::{ApiError, FieldError};
pub use latency::{LatencyModel, RequestClass, ServiceTime};
pub use resources::{ApiMode, Res};

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;
use store::Store;
use time::OffsetDateTime;
use tokio::sync::{Notify, watch};

/// Lock a mutex, ignoring poisoning (a panicked test thread must not wedge
/// the emulator).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// PCR cleaner settings (kube-controller-manager's `pcrcleaner`).
#[derive(Debug, Clone)]
pub struct CleanerConfig {
    pub enabled: bool,
    /// PCRs whose creationTimestamp is older than this are deleted. Default 15 min.
    pub max_age: Duration,
    /// How often the cleaner runs (real time). Default 5 min.
    pub period: Duration,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_age: Duration::from_secs(15 * 60),
            period: Duration::from_secs(5 * 60),
        }
    }
}

/// Emulator settings.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// Which certificates.k8s.io versions are served.
    pub api_mode: ApiMode,
    /// The first resourceVersion is `initial_resource_version + 1`; anything
    /// at or below it is "too old" for a watch.
    pub initial_resource_version: u64,
    /// Number of events kept for watch resumption (bounded memory).
    pub watch_history_limit: usize,
    /// Capacity of the fan-out channel; a watcher that falls this far behind
    /// is disconnected (as a slow watcher is by kube-apiserver).
    pub broadcast_capacity: usize,
    /// Interval between BOOKMARK events when a watch asks for them.
    pub bookmark_interval: Duration,
    pub cleaner: CleanerConfig,
    /// Audiences that TokenReview assumes when a review names none, and that
    /// a service-account bearer token must carry to call the emulator.
    pub api_audiences: Vec<String>,
    /// Create the namespace of a namespaced create automatically instead of
    /// answering 404 (NamespaceLifecycle). Default false.
    pub auto_create_namespaces: bool,
    /// The minor version `/version` reports; `None`: the release `api_mode` models (1.35 for
    /// `V1Beta1Legacy`, 1.36 for `V1Beta1`, else 1.37). Set it to model a cluster that serves
    /// other versions than its release does by default.
    pub kubernetes_minor: Option<u32>,
    /// The `PodCertificateMLDSA` feature gate (kubernetes#142108, after 1.37; default off):
    /// stub CSRs may carry ML-DSA keys (spec rules 8.8–8.11).
    pub pod_certificate_mldsa: bool,
    /// Service times and concurrency per class of request, and a watch event delay ([`latency`]);
    /// off by default.
    pub latency: LatencyModel,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            api_mode: ApiMode::default(),
            initial_resource_version: 1000,
            watch_history_limit: 20_000,
            broadcast_capacity: 65_536,
            bookmark_interval: Duration::from_secs(5),
            cleaner: CleanerConfig::default(),
            api_audiences: vec!["https://kubernetes.default.svc.cluster.local".into()],
            auto_create_namespaces: false,
            kubernetes_minor: None,
            pod_certificate_mldsa: false,
            latency: LatencyModel::default(),
        }
    }
}

/// The emulator's clock: system time, system time plus an offset, or a fixed
/// instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockMode {
    System,
    Offset(time::Duration),
    Fixed(OffsetDateTime),
}

/// Which requests a fault applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultScope {
    Any,
    /// POST, PUT, PATCH, DELETE.
    Writes,
    /// PUT/PATCH of a `/status` subresource.
    StatusWrites,
    /// GET (get, list and watch).
    Reads,
    /// Watch requests only.
    Watches,
    /// Requests whose path contains this text.
    PathContains(String),
    /// Requests with this HTTP method.
    Method(String),
    /// Requests with this HTTP method whose path contains this text (e.g. the PUTs of one
    /// object: `("PUT", "/secrets/name")`).
    MethodPath(String, String),
}

impl FaultScope {
    /// Whether a request is in this scope.
    pub(crate) fn matches(&self, method: &str, path: &str, is_watch: bool) -> bool {
        match self {
            FaultScope::Any => true,
            FaultScope::Writes => matches!(method, "POST" | "PUT" | "PATCH" | "DELETE"),
            FaultScope::StatusWrites => {
                matches!(method, "PUT" | "PATCH") && path.ends_with("/status")
            }
            FaultScope::Reads => method == "GET",
            FaultScope::Watches => is_watch,
            FaultScope::PathContains(p) => path.contains(p.as_str()),
            FaultScope::Method(m) => m.eq_ignore_ascii_case(method),
            FaultScope::MethodPath(m, p) => {
                m.eq_ignore_ascii_case(method) && path.contains(p.as_str())
            }
        }
    }
}

#[derive(Debug, Clone)]
struct ErrorFault {
    code: u16,
    remaining: u64,
    scope: FaultScope,
}

#[derive(Debug, Clone)]
struct HangFault {
    duration: Duration,
    remaining: u64,
    scope: FaultScope,
}

#[derive(Debug, Default)]
struct Faults {
    errors: Vec<ErrorFault>,
    hangs: Vec<HangFault>,
    latency: Duration,
}

/// Counters readable from tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    /// Writes rejected by validation (HTTP 422 from a strategy, including the
    /// `sign` check and PUTs without resourceVersion).
    pub validation_rejections: u64,
    /// The same, by `"<Kind> <field> <cause reason>"`.
    pub rejections_by_cause: BTreeMap<String, u64>,
    pub forbidden: u64,
    pub conflicts: u64,
    pub not_found: u64,
    /// Other error answers (400, 404 excluded, 500...).
    pub other_errors: u64,
    pub pcr_created: u64,
    /// Accepted PCR status writes that changed the status.
    pub status_writes_accepted: u64,
    /// PCR status writes that were no-ops.
    pub status_writes_noop: u64,
    pub issued: u64,
    pub denied: u64,
    pub failed: u64,
    pub ctb_writes_accepted: u64,
    pub injected_faults: u64,
    /// Requests held back by [`Emulator::hang_requests`] (counted when the hold begins).
    pub held_requests: u64,
    pub watches_opened: u64,
    pub cleaner_deleted: u64,
    pub token_reviews: u64,
    /// Requests that arrived during an outage ([`Emulator::set_outage`]) and were never answered.
    pub stalled_requests: u64,
    /// The most TokenReviews ever answered at once (see [`pod_state`]).
    pub token_reviews_max_in_flight: u64,
    /// Lists and watches that asked for PartialObjectMetadata (metadata-only) answers.
    pub metadata_only_requests: u64,
    /// Requests refused with 429 by [`Emulator::throttle`] (injected errors not included).
    pub throttled_requests: u64,
}

pub(crate) struct Shared {
    pub(crate) config: EmulatorConfig,
    pub(crate) store: Mutex<Store>,
    pub(crate) auth: RwLock<auth::AuthState>,
    clock: Mutex<ClockMode>,
    faults: Mutex<Faults>,
    pub(crate) counters: Mutex<Counters>,
    pub(crate) kill_watches: watch::Sender<u64>,
    pub(crate) addr: Mutex<Option<SocketAddr>>,
    shutdown: Notify,
    pub(crate) outage: http::Outage,
    pub(crate) throttle: http::Throttle,
    pub(crate) token_review: pod_state::TokenReviewState,
    /// The latency model at work; `None` when it is off.
    pub(crate) latency: Option<latency::Latency>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn now(&self) -> OffsetDateTime {
        match *lock(&self.clock) {
            ClockMode::System => OffsetDateTime::now_utc(),
            ClockMode::Offset(d) => OffsetDateTime::now_utc() + d,
            ClockMode::Fixed(t) => t,
        }
    }

    pub(crate) fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut lock(&self.counters));
    }

    /// Latency, hangs and injected errors that apply to a request.
    pub(crate) fn faults_for(
        &self,
        method: &str,
        path: &str,
        is_watch: bool,
    ) -> (Duration, Option<u16>) {
        let mut f = lock(&self.faults);
        let matches = |s: &FaultScope| s.matches(method, path, is_watch);
        let mut delay = f.latency;
        if let Some(h) = f
            .hangs
            .iter_mut()
            .find(|h| h.remaining > 0 && matches(&h.scope))
        {
            h.remaining -= 1;
            delay += h.duration;
            self.count(|c| c.held_requests += 1);
        }
        f.hangs.retain(|h| h.remaining > 0);
        let mut code = None;
        if let Some(e) = f
            .errors
            .iter_mut()
            .find(|e| e.remaining > 0 && matches(&e.scope))
        {
            e.remaining -= 1;
            code = Some(e.code);
        }
        f.errors.retain(|e| e.remaining > 0);
        (delay, code)
    }

    /// Delete PCRs older than the cleaner's max age; returns how many.
    pub(crate) fn clean_pcrs(&self) -> usize {
        let cutoff = self.now()
            - time::Duration::try_from(self.config.cleaner.max_age).unwrap_or(time::Duration::ZERO);
        let mut st = lock(&self.store);
        let victims: Vec<(String, String)> = st
            .list(Res::Pcr, None)
            .iter()
            .filter(|o| {
                pcr::parse_time(o.get("metadata").and_then(|m| m.get("creationTimestamp")))
                    .ok()
                    .flatten()
                    .is_some_and(|t| t < cutoff)
            })
            .map(|o| {
                (
                    store::meta_str(o, "namespace").to_string(),
                    store::meta_str(o, "name").to_string(),
                )
            })
            .collect();
        for (ns, name) in &victims {
            st.delete(Res::Pcr, ns, name);
        }
        drop(st);
        let n = victims.len();
        self.count(|c| c.cleaner_deleted += n as u64);
        n
    }
}

/// A pod fixture (see [`Emulator::add_pod`]).
#[derive(Debug, Clone, Default)]
pub struct PodFixture {
    pub namespace: String,
    pub name: String,
    pub node_name: String,
    pub service_account: String,
    /// `podCertificate` projections: (signerName, keyType).
    pub pod_certificates: Vec<(String, String)>,
    /// Fixed UID; random when `None`.
    pub uid: Option<String>,
    /// Mark as a mirror pod.
    pub mirror: bool,
}

/// A running emulator. Dropping it stops the server.
#[derive(Debug)]
pub struct Emulator {
    shared: Arc<Shared>,
    base_url: String,
}

/// A random RFC 4122 v4 UUID.
pub fn new_uid() -> String {
    let mut b = [0u8; 16];
    if aws_lc_rs::rand::fill(&mut b).is_err() {
        // Fall back to time-derived bytes; uniqueness only matters per process.
        let n = OffsetDateTime::now_utc()
            .unix_timestamp_nanos()
            .to_le_bytes();
        b.copy_from_slice(&n[..16]);
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    let _ = aws_lc_rs::rand::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Emulator {
    /// Start an emulator on 127.0.0.1 with an ephemeral port. It has an
    /// `admin` identity (group `system:masters`) and the namespaces
    /// `default`, `kube-system`, `kube-public` and `kube-node-lease`.
    pub async fn start(config: EmulatorConfig) -> std::io::Result<Emulator> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), config).await
    }

    /// [`Emulator::start`] on a given address (port 0: a free one). On an unspecified address
    /// (`0.0.0.0`, `[::]`) the base URL names the loopback address of that family.
    pub async fn start_on(listen: SocketAddr, config: EmulatorConfig) -> std::io::Result<Emulator> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let mut url_addr = addr;
        if addr.ip().is_unspecified() {
            url_addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let (kill_tx, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(
                config.initial_resource_version,
                config.watch_history_limit,
                config.broadcast_capacity,
            )),
            config: config.clone(),
            auth: RwLock::new(auth::AuthState::default()),
            clock: Mutex::new(ClockMode::System),
            faults: Mutex::new(Faults::default()),
            counters: Mutex::new(Counters::default()),
            kill_watches: kill_tx,
            addr: Mutex::new(Some(addr)),
            shutdown: Notify::new(),
            outage: http::Outage::default(),
            throttle: http::Throttle::default(),
            token_review: pod_state::TokenReviewState::default(),
            latency: latency::Latency::new(&config.latency),
        });
        let emu = Emulator {
            shared: shared.clone(),
            base_url: format!("http://{url_addr}"),
        };
        emu.add_identity("admin", "admin", &["system:masters"]);
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            emu.add_namespace(ns);
        }
        http::spawn_server(shared.clone(), listener);
        if config.cleaner.enabled {
            let s = Arc::downgrade(&shared);
            let period = config.cleaner.period.max(Duration::from_millis(10));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let Some(s) = s.upgrade() else { break };
                    s.clean_pcrs();
                }
            });
        }
        Ok(emu)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The emulator's configuration.
    pub fn config(&self) -> &EmulatorConfig {
        &self.shared.config
    }

    // ----- identities and RBAC -----

    /// Add (or replace) an identity; returns its bearer token.
    pub fn add_identity(&self, identity: &str, user: &str, groups: &[&str]) -> String {
        self.add_identity_user(identity, UserInfo::new(user, groups))
    }

    /// Add an identity with a full [`UserInfo`]; returns its bearer token.
    pub fn add_identity_user(&self, identity: &str, user: UserInfo) -> String {
        let token = random_token();
        let mut a = write(&self.shared.auth);
        if let Some(old) = a.identities.insert(identity.to_string(), token.clone()) {
            a.tokens.remove(&old);
        }
        a.tokens.insert(token.clone(), (identity.to_string(), user));
        token
    }

    /// A node identity `system:node:<node>` (groups `system:nodes`,
    /// `system:authenticated`) named `node:<node>`; returns its token.
    pub fn add_node_identity(&self, node: &str) -> String {
        self.add_identity(
            &format!("node:{node}"),
            &format!("system:node:{node}"),
            &["system:nodes"],
        )
    }

    /// The bearer token of an identity.
    pub fn token_for(&self, identity: &str) -> Option<String> {
        read(&self.shared.auth).identities.get(identity).cloned()
    }

    /// The token of the built-in `admin` identity.
    pub fn admin_token(&self) -> String {
        self.token_for("admin").unwrap_or_default()
    }

    /// Bind an RBAC rule to a user or group.
    pub fn grant(&self, subject: Subject, rule: PolicyRule) {
        write(&self.shared.auth).rules.push((subject, rule));
    }

    /// Grant a user `verbs` (e.g. `sign`, `attest`) on `signers` with these
    /// names (`example.com/my-signer` or `example.com/*`).
    pub fn grant_signer(&self, user: &str, verbs: &[&str], signer_names: &[&str]) {
        self.grant(
            Subject::User(user.to_string()),
            PolicyRule::new(&["certificates.k8s.io"], &["signers"], verbs).with_names(signer_names),
        );
    }

    /// Grant a user the RBAC a signer needs (spec §3) for `signer_name`:
    /// PCR read + status update/patch, sign, CTB CRUD, attest, events,
    /// leases, and reads of pods/serviceaccounts/nodes/namespaces/secrets.
    pub fn grant_signer_role(&self, user: &str, signer_name: &str) {
        let u = || Subject::User(user.to_string());
        let cert = "certificates.k8s.io";
        self.grant(
            u(),
            PolicyRule::new(
                &[cert],
                &["podcertificaterequests"],
                &["get", "list", "watch"],
            ),
        );
        self.grant(
            u(),
            PolicyRule::new(&[cert], &["podcertificaterequests/status"], &["patch"]),
        );
        self.grant(
            u(),
            PolicyRule::new(
                &[cert],
                &["clustertrustbundles"],
                &["get", "list", "watch", "create", "update", "delete"],
            ),
        );
        self.grant_signer(user, &["sign", "attest"], &[signer_name]);
        self.grant(
            u(),
            PolicyRule::new(
                &["events.k8s.io", ""],
                &["events"],
                &["create", "patch", "update", "get", "list"],
            ),
        );
        self.grant(
            u(),
            PolicyRule::new(&["coordination.k8s.io"], &["leases"], &["*"]),
        );
        self.grant(
            u(),
            PolicyRule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
        );
        self.grant(
            u(),
            PolicyRule::new(
                &[""],
                &[
                    "pods",
                    "serviceaccounts",
                    "nodes",
                    "namespaces",
                    "secrets",
                    "configmaps",
                ],
                &["get", "list", "watch"],
            ),
        );
    }

    /// Register a service-account token for TokenReview (and as a bearer
    /// token); returns the token string.
    pub fn add_service_account_token(&self, t: ServiceAccountToken) -> String {
        let token = format!("sa.{}", random_token());
        write(&self.shared.auth).sa_tokens.insert(token.clone(), t);
        token
    }

    /// Write a kubeconfig file (server = base URL, bearer token of `identity`).
    pub fn write_kubeconfig(&self, path: &Path, identity: &str) -> std::io::Result<()> {
        self.write_kubeconfig_with_namespace(path, identity, "default")
    }

    /// [`Emulator::write_kubeconfig`] with `namespace` as the context's namespace. The file
    /// is replaced atomically (a reader never sees half of it) and, as it holds a bearer
    /// token, is readable by its owner only.
    pub fn write_kubeconfig_with_namespace(
        &self,
        path: &Path,
        identity: &str,
        namespace: &str,
    ) -> std::io::Result<()> {
        let token = self.token_for(identity).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("unknown identity {identity:?}"),
            )
        })?;
        let cfg = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: {identity}\n    namespace: {namespace}\ncurrent-context: emulator\nusers:\n- name: {identity}\n  user:\n    token: {token}\n",
            self.base_url
        );
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = std::path::PathBuf::from(partial);
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&partial)?;
            f.write_all(cfg.as_bytes())?;
        }
        std::fs::rename(&partial, path)
    }

    // ----- clock -----

    pub fn set_clock(&self, mode: ClockMode) {
        *lock(&self.shared.clock) = mode;
    }
    /// Fix the clock at `t`.
    pub fn set_time(&self, t: OffsetDateTime) {
        self.set_clock(ClockMode::Fixed(t));
    }
    /// Move the clock forward (works for fixed and offset clocks).
    pub fn advance_clock(&self, d: Duration) {
        let d = time::Duration::try_from(d).unwrap_or(time::Duration::ZERO);
        let mut c = lock(&self.shared.clock);
        *c = match *c {
            ClockMode::System => ClockMode::Offset(d),
            ClockMode::Offset(o) => ClockMode::Offset(o + d),
            ClockMode::Fixed(t) => ClockMode::Fixed(t + d),
        };
    }
    pub fn now(&self) -> OffsetDateTime {
        self.shared.now()
    }

    // ----- faults -----

    /// Answer the next `count` matching requests with HTTP `code` (409, 429,
    /// 500, 503, ...).
    pub fn inject_errors(&self, code: u16, count: u64, scope: FaultScope) {
        lock(&self.shared.faults).errors.push(ErrorFault {
            code,
            remaining: count,
            scope,
        });
    }
    /// Delay every request by `d`.
    pub fn set_latency(&self, d: Duration) {
        lock(&self.shared.faults).latency = d;
    }
    /// Hold the next `count` matching requests for `d` before serving them.
    pub fn hang_requests(&self, d: Duration, count: u64, scope: FaultScope) {
        lock(&self.shared.faults).hangs.push(HangFault {
            duration: d,
            remaining: count,
            scope,
        });
    }
    /// Remove all injected errors, hangs and latency.
    pub fn clear_faults(&self) {
        *lock(&self.shared.faults) = Faults::default();
    }
    /// Begins or ends a black-hole outage: while it lasts connections are accepted but no
    /// request is answered, and every watch stream open when it began stays silent for good.
    /// The store stays reachable through the methods of this type (e.g. [`Self::seed_object`]).
    pub fn set_outage(&self, out: bool) {
        self.shared.outage.set(out);
    }
    /// A network partition between the API and the clients presenting bearer `token` (`true`
    /// cuts, `false` heals): for them alone it is a [`Self::set_outage`] outage; every other
    /// client is served as usual.
    pub fn partition(&self, token: &str, cut: bool) {
        self.shared.outage.set_cut(&format!("Bearer {token}"), cut);
    }
    /// API priority and fairness with a full priority level: at most `seats` requests in
    /// `scope` inside the server at once; one more is answered 429 with `Retry-After:
    /// retry_after_seconds` (also in the Status's `details.retryAfterSeconds`) and counted in
    /// [`Counters::throttled_requests`]. `None` lifts it.
    pub fn throttle(&self, limit: Option<(usize, u64, FaultScope)>) {
        self.shared.throttle.set(
            limit.map(|(seats, retry_after, scope)| http::ThrottleLimit {
                seats,
                retry_after,
                scope,
            }),
        );
    }
    /// The most PodCertificateRequest `/status` writes that were ever inside the server at
    /// once (being served or queued in the latency model), throttled or not.
    pub fn status_writes_max_in_flight(&self) -> u64 {
        self.shared.throttle.status_writes_max()
    }
    /// End every open watch stream.
    pub fn drop_watches(&self) {
        self.shared.kill_watches.send_modify(|g| *g += 1);
    }
    /// Simulate an apiserver restart: drop all watches and forget the event
    /// history, so a watch from any earlier resourceVersion gets 410.
    pub fn restart(&self) {
        lock(&self.shared.store).compact_all();
        self.drop_watches();
    }

    // ----- counters -----

    pub fn counters(&self) -> Counters {
        lock(&self.shared.counters).clone()
    }
    pub fn reset_counters(&self) {
        *lock(&self.shared.counters) = Counters::default();
    }

    // ----- cleaner -----

    /// Run the PCR cleaner once now; returns the number of PCRs deleted.
    pub fn run_cleaner_now(&self) -> usize {
        self.shared.clean_pcrs()
    }

    // ----- store access -----

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).current_rv()
    }

    /// An object as stored (hub form: all PCR fields, no apiVersion/kind).
    pub fn get_object(&self, res: Res, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.shared.store)
            .get(res, namespace, name)
            .map(|v| (*v).clone())
    }

    /// All stored objects of a type (hub form).
    pub fn list_objects(&self, res: Res, namespace: Option<&str>) -> Vec<Value> {
        lock(&self.shared.store)
            .list(res, namespace)
            .into_iter()
            .map(|v| (*v).clone())
            .collect()
    }

    /// Number of stored objects of a type.
    pub fn count_objects(&self, res: Res) -> usize {
        lock(&self.shared.store).count(res)
    }

    /// Insert an object verbatim (bypassing validation), e.g. a replay
    /// setup. `apiVersion`/`kind` are stripped; a `metadata.resourceVersion`
    /// is kept if it is above the current counter (the counter moves to it),
    /// otherwise a new one is assigned. Missing uid/creationTimestamp are
    /// filled in. Returns the stored object.
    pub fn seed_object(&self, res: Res, obj: Value) -> Value {
        let mut obj = obj;
        let now = pcr::fmt_time(self.now());
        if let Value::Object(m) = &mut obj {
            m.remove("apiVersion");
            m.remove("kind");
            let meta = m.entry("metadata").or_insert_with(|| json!({}));
            if let Value::Object(meta) = meta {
                meta.entry("uid").or_insert_with(|| json!(new_uid()));
                meta.entry("creationTimestamp")
                    .or_insert_with(|| json!(now));
            }
        }
        let ns = store::meta_str(&obj, "namespace").to_string();
        let name = store::meta_str(&obj, "name").to_string();
        let rv = store::meta_str(&obj, "resourceVersion").parse::<u64>().ok();
        let stored = lock(&self.shared.store).seed(res, &ns, &name, obj, rv);
        (*stored).clone()
    }

    /// Delete an object directly (emits DELETED).
    pub fn delete_object(&self, res: Res, namespace: &str, name: &str) -> bool {
        lock(&self.shared.store)
            .delete(res, namespace, name)
            .is_some()
    }

    // ----- fixtures -----

    /// Create a namespace (if missing); returns its UID.
    pub fn add_namespace(&self, name: &str) -> String {
        if let Some(o) = self.get_object(Res::Namespace, "", name) {
            return store::meta_str(&o, "uid").to_string();
        }
        let o = self.seed_object(
            Res::Namespace,
            json!({"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
        );
        store::meta_str(&o, "uid").to_string()
    }

    /// Sets a namespace's labels (creating it if missing): a MODIFIED event, as a label edit.
    pub fn set_namespace_labels(&self, name: &str, labels: &[(&str, &str)]) {
        self.add_namespace(name);
        let Some(mut o) = self.get_object(Res::Namespace, "", name) else {
            return;
        };
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), json!(v)))
            .collect();
        o["metadata"]["labels"] = Value::Object(labels);
        if let Value::Object(meta) = &mut o["metadata"] {
            meta.remove("resourceVersion");
        }
        self.seed_object(Res::Namespace, o);
    }

    /// Sets an existing pod's labels and annotations (a MODIFIED event, as `kubectl label`);
    /// false when there is no such pod.
    pub fn set_pod_metadata(
        &self,
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> bool {
        let Some(mut o) = self.get_object(Res::Pod, namespace, name) else {
            return false;
        };
        let map = |pairs: &[(&str, &str)]| -> Value {
            Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), json!(v)))
                    .collect(),
            )
        };
        o["metadata"]["labels"] = map(labels);
        o["metadata"]["annotations"] = map(annotations);
        if let Value::Object(meta) = &mut o["metadata"] {
            meta.remove("resourceVersion");
        }
        self.seed_object(Res::Pod, o);
        true
    }

    /// Create a node; returns its UID.
    pub fn add_node(&self, name: &str) -> String {
        self.add_node_with_uid(name, &new_uid())
    }

    pub fn add_node_with_uid(&self, name: &str, uid: &str) -> String {
        self.seed_object(
            Res::Node,
            json!({"metadata": {"name": name, "uid": uid}, "spec": {}, "status": {}}),
        );
        uid.to_string()
    }

    /// Create a service account (and its namespace); returns its UID.
    pub fn add_service_account(&self, namespace: &str, name: &str) -> String {
        self.add_service_account_with_uid(namespace, name, &new_uid())
    }

    pub fn add_service_account_with_uid(&self, namespace: &str, name: &str, uid: &str) -> String {
        self.add_namespace(namespace);
        self.seed_object(
            Res::ServiceAccount,
            json!({"metadata": {"name": name, "namespace": namespace, "uid": uid}}),
        );
        uid.to_string()
    }

    /// Create a pod (and its namespace) bound to a node, using a service
    /// account, with `podCertificate` projections; returns its UID.
    pub fn add_pod(&self, p: &PodFixture) -> String {
        self.add_namespace(&p.namespace);
        let uid = p.uid.clone().unwrap_or_else(new_uid);
        let sources: Vec<Value> = p
            .pod_certificates
            .iter()
            .map(|(signer, key_type)| {
                json!({"podCertificate": {"signerName": signer, "keyType": key_type, "credentialBundlePath": "credentialbundle.pem"}})
            })
            .collect();
        let mut meta = json!({"name": p.name, "namespace": p.namespace, "uid": uid});
        if p.mirror {
            meta["annotations"] = json!({"kubernetes.io/config.mirror": "mirror"});
        }
        let mut spec = json!({
            "nodeName": p.node_name,
            "serviceAccountName": p.service_account,
            "containers": [{"name": "app", "image": "example.invalid/app"}],
        });
        if !sources.is_empty() {
            spec["volumes"] = json!([{"name": "pod-certs", "projected": {"sources": sources}}]);
        }
        self.seed_object(
            Res::Pod,
            json!({"metadata": meta, "spec": spec, "status": {"phase": "Running"}}),
        );
        uid
    }

    /// A new P-256 CA (self-signed, `common_name`) in the `kubernetes.io/tls` Secret
    /// `namespace/name`, as cert-manager would make it for the Secret backend; its certificate
    /// (PEM).
    pub fn add_ca_secret(&self, namespace: &str, name: &str, common_name: &str) -> String {
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a P-256 key");
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).expect("a self-signed CA");
        self.add_secret(
            namespace,
            name,
            "kubernetes.io/tls",
            &[
                ("tls.crt", cert.pem().as_bytes()),
                ("tls.key", key.serialize_pem().as_bytes()),
            ],
        );
        cert.pem()
    }

    /// Create a Secret of type `kubernetes.io/tls` or Opaque from string data.
    pub fn add_secret(
        &self,
        namespace: &str,
        name: &str,
        typ: &str,
        data: &[(&str, &[u8])],
    ) -> String {
        use base64::Engine as _;
        self.add_namespace(namespace);
        let d: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_string(),
                    json!(base64::engine::general_purpose::STANDARD.encode(v)),
                )
            })
            .collect();
        let o = self.seed_object(
            Res::Secret,
            json!({"metadata": {"name": name, "namespace": namespace}, "type": typ, "data": d}),
        );
        store::meta_str(&o, "uid").to_string()
    }

    /// Stop the server and end all watches.
    pub fn shutdown(&self) {
        self.drop_watches();
        self.shared.shutdown.notify_waiters();
        *lock(&self.shared.addr) = None;
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shutdown();
    }
}
