//! The running controller: discovery, leadership, watches, workers, writes.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::certificates::{v1, v1beta1};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use podca_authority::ledger::{LedgerHandle, LedgerUnavailable};
use podca_grpc::auth::{PodFactsError, read_pod_facts};
use podca_signer::ledger::{RecordContext, Source};
use podca_signer::names::service_ca::Sans;
use podca_signer::names::spiffe_id;
use podca_signer::rules::NamespaceLabels;
use podca_signer::{DenyReason, LedgerRecord, Outcome, SignerPolicy};
use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::bounded;
use crate::concurrency::{Aimd, ConcurrencyMetrics, Gate, Permit, WriteOutcome};
use crate::decide::{self, ErrorClass, Settlement};
use crate::discovery::{self, Resource, Served};
use crate::membership::{self, MemberConfig, Members};
use crate::plan::{self, Facts, Plan, Read, SkipReason, Write};
use crate::publisher::Publisher;
use crate::queue::{Item, WorkQueue};
use crate::request::{self, ApiVersion, Pcr};
use crate::service_ca::{self, Entitlement};
use crate::sharding::{self, Shard, ShardMetrics};
use crate::watched::{WatchedPcr, Written};
use crate::{Error, Options, lease};
use podca_authority::admin::{Readiness, ReadyFlag};
use podca_authority::config::Sharding;
use podca_authority::metrics::{
    LateCause, LateLabels, Metrics, RetryCause, RetryLabels, SettleLabels, SignerLabels,
};
use podca_authority::trust::{CaSet, CaSnapshot, Clock};

struct Ctx {
    client: Client,
    served: Served,
    version: ApiVersion,
    signers: BTreeMap<String, SignerPolicy>,
    ca: CaSet,
    clock: Clock,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    leading: watch::Receiver<bool>,
    ledger: Option<LedgerHandle>,
    /// This process in ledger records.
    replica: String,
    /// Namespace labels for the rules, when some rule reads them.
    namespace_labels: Option<NamespaceLabels>,
    /// Rendezvous sharding: this replica works only on its share; `None`: on every request
    /// while it leads.
    shard: Option<Arc<Shard>>,
}

/// Runs the controller until `shutdown` resolves.
///
/// Shutdown order: readiness turns false, the queue stops handing out work, in-flight writes
/// finish (up to `drain_timeout`), watches stop, the Lease is released, the admin listener stops.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let Options {
        signers,
        ca,
        clock,
        metrics,
        workers,
        max_in_flight,
        queue_capacity,
        leader_election,
        sharding,
        takeover_after,
        drain_timeout,
        reporting_controller,
        reporting_instance,
        publisher,
        leadership,
        ledger,
        ready,
        namespace_labels,
        foreign_anchors,
    } = options;
    if signers.is_empty() {
        return Err(Error::NoSigners);
    }
    // Every replica watches namespaces (the gRPC API reads the same labels), leader or not.
    let namespace_watch = namespace_labels.clone().map(|store| {
        TaskGuard::new(tokio::spawn(crate::namespaces::watch(
            client.clone(),
            store,
            Arc::clone(&metrics),
        )))
    });
    // A bad bundle name or instance label is a configuration error: refuse to start.
    let publisher = publisher
        .map(|o| {
            Publisher::for_policies(&signers, &o).map(|p| p.with_foreign(foreign_anchors.clone()))
        })
        .transpose()
        .map_err(|e| Error::Config(e.to_string()))?;
    // The issuing CA's notAfter follows every swap (rotation, reload).
    let ca_gauges: Vec<TaskGuard> = ca
        .iter()
        .map(|(name, handle)| {
            TaskGuard::new(tokio::spawn(track_ca_not_after(
                name.to_owned(),
                handle.subscribe(),
                Arc::clone(&metrics),
            )))
        })
        .collect();
    let ready = ready.unwrap_or_else(|| Readiness::new().component("controller"));
    let (concurrency, shard_metrics) = concurrency_metrics(&metrics);

    let served = bounded::retrying("discover", &metrics, || discovery::certificates(&client))
        .await?
        .served(Resource::PodCertificateRequests);
    let version = served.watch_version()?;
    info!(
        v1 = served.v1,
        v1beta1 = served.v1beta1,
        watch = version.as_str(),
        signers = ?signers.keys().collect::<Vec<_>>(),
        "certificates.k8s.io discovered"
    );

    let (leading_tx, leading) = match leadership {
        // The caller follows leadership too (e.g. the Secret CA backend writes only as leader).
        Some(tx) => {
            tx.send_replace(leader_election.is_none());
            let rx = tx.subscribe();
            (tx, rx)
        }
        None => watch::channel(leader_election.is_none()),
    };
    let (lease_stop, lease_stop_rx) = watch::channel(false);
    // Rendezvous: every member works on its share while its own Lease is fresh.
    let members = leader_election
        .as_ref()
        .filter(|_| sharding == Sharding::Rendezvous)
        .map(|le| {
            let settled = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let config = MemberConfig {
                group: le.lease_name.clone(),
                namespace: le.lease_namespace.clone(),
                identity: le.identity.clone(),
                lease_duration: le.lease_duration,
                period: le.retry_period.min(le.lease_duration / 3),
                settled: Arc::clone(&settled),
            };
            let (tx, rx) = watch::channel(Members::default());
            let task = membership::start(
                client.clone(),
                config,
                tx,
                lease_stop_rx.clone(),
                Arc::clone(&metrics),
            );
            let shard = Shard::new(
                rx,
                takeover_after.unwrap_or_else(|| sharding::takeover_after(le.lease_duration)),
                shard_metrics.clone(),
                settled,
            );
            (TaskGuard::new(task), Arc::new(shard))
        });
    let lease_task = match leader_election {
        Some(le) => Some(TaskGuard::new(
            lease::start(
                client.clone(),
                le,
                leading_tx,
                lease_stop_rx,
                Arc::clone(&metrics),
            )
            .await?,
        )),
        None => {
            drop(lease_stop_rx);
            None
        }
    };

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: reporting_controller,
            instance: reporting_instance,
        },
    );
    let ctx = Arc::new(Ctx {
        client,
        served,
        version,
        signers,
        ca,
        clock,
        metrics: Arc::clone(&metrics),
        recorder,
        leading: leading.clone(),
        ledger,
        replica: podca_signer::ledger::replica_identity(),
        namespace_labels,
        shard: members.as_ref().map(|(_, shard)| Arc::clone(shard)),
    });
    let mut shutdown = std::pin::pin!(shutdown);
    // Who works: the leader, or (sharded) every member; the publisher follows leadership
    // itself, so a sharded replica runs it throughout.
    let (mut working, _follow, _publishing) = match &members {
        None => (leading, None, None),
        Some((_, shard)) => {
            let publishing = publisher.clone().map(|p| {
                let leading = leading.clone();
                let run = p.run(
                    ctx.client.clone(),
                    ctx.ca.clone(),
                    Arc::clone(&metrics),
                    leading,
                );
                TaskGuard::new(tokio::spawn(run))
            });
            let (working, follow) = follow_members(shard, leading, Arc::clone(&metrics));
            (working, Some(follow), publishing)
        }
    };
    let sharded = members.is_some();
    'outer: loop {
        // Standby: wait to lead. A standby has nothing to sync: ready (it serves gRPC); a leader
        // only once its watches have synced (never in between, not even for a moment).
        if !sharded {
            metrics.leader.set(0);
        }
        if !*working.borrow() {
            ready.set(true);
        }
        tokio::select! {
            _ = &mut shutdown => break 'outer,
            ok = async { working.wait_for(|l| *l).await.is_ok() } => if !ok { break 'outer },
        }
        if !sharded {
            metrics.leader.set(1);
        }
        info!(sharded, "working: starting watches and workers");
        ready.set(false);
        // Each term starts afresh at `workers`: the server may have changed meanwhile.
        let gate = Gate::new(Aimd::new(workers, max_in_flight), concurrency.clone());
        let session = Session::start(&ctx, gate, queue_capacity, &ready);
        // Dropped (aborted) with this term, like the session.
        let _publishing = publisher.clone().filter(|_| members.is_none()).map(|p| {
            TaskGuard::new(tokio::spawn(p.run(
                ctx.client.clone(),
                ctx.ca.clone(),
                Arc::clone(&metrics),
                ctx.leading.clone(),
            )))
        });
        tokio::select! {
            _ = &mut shutdown => {
                ready.set(false);
                info!("shutting down: draining in-flight work");
                session.drain(drain_timeout).await;
                break 'outer;
            }
            _ = async { let _ = working.wait_for(|l| !*l).await; } => {
                warn!(sharded, "lost the Lease: stopping all work");
                session.abort();
            }
        }
    }
    ready.set(false);
    metrics.leader.set(0);
    let _ = lease_stop.send(true);
    if let Some(task) = lease_task {
        task.join().await;
    }
    if let Some((task, _)) = members {
        task.join().await;
    }
    // Nothing of the controller outlives it.
    if let Some(task) = namespace_watch {
        task.abort_and_wait().await;
    }
    for gauge in ca_gauges {
        gauge.abort_and_wait().await;
    }
    info!("stopped");
    Ok(())
}

/// Whether this replica is a member (it works on its share), from the member set; keeps the
/// sharding metrics and `podca_leader` (which follows `leading` alone here) up to date.
fn follow_members(
    shard: &Shard,
    mut leading: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) -> (watch::Receiver<bool>, TaskGuard) {
    let mut members = shard.members.clone();
    let shard_metrics = shard.metrics.clone();
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        loop {
            let current = members.borrow_and_update().clone();
            shard_metrics.show(&current);
            tx.send_if_modified(|working| {
                let changed = *working != current.includes_me();
                *working = current.includes_me();
                changed
            });
            metrics.leader.set(i64::from(*leading.borrow_and_update()));
            tokio::select! {
                r = members.changed() => if r.is_err() { return },
                r = leading.changed() => if r.is_err() { return },
            }
        }
    });
    (rx, TaskGuard::new(task))
}

/// Aborts a task when dropped, so that a cancelled [`run`] (a "killed" controller in tests, or a
/// caller dropping the future) leaves no watch, worker or Lease renewal behind.
struct TaskGuard(Option<JoinHandle<()>>);

impl TaskGuard {
    fn new(handle: JoinHandle<()>) -> Self {
        TaskGuard(Some(handle))
    }

    async fn join(mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.await;
        }
    }

    /// Aborts the task and waits until it is gone.
    async fn abort_and_wait(mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
            let _ = handle.await;
        }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// The controller's concurrency metrics in `metrics`'s registry, registered once however many
/// times [`run`] is given the same registry (tests run the controller again with it).
fn concurrency_metrics(metrics: &Arc<Metrics>) -> (ConcurrencyMetrics, ShardMetrics) {
    type Registered = Vec<(std::sync::Weak<Metrics>, (ConcurrencyMetrics, ShardMetrics))>;
    static REGISTERED: std::sync::Mutex<Registered> = std::sync::Mutex::new(Vec::new());
    let mut registered = REGISTERED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    registered.retain(|(m, _)| m.strong_count() > 0);
    if let Some((_, found)) = registered
        .iter()
        .find(|(m, _)| std::ptr::eq(m.as_ptr(), Arc::as_ptr(metrics)))
    {
        return found.clone();
    }
    let found = metrics.register_component("controller", |registry| {
        (
            ConcurrencyMetrics::register(registry),
            ShardMetrics::register(registry),
        )
    });
    registered.push((Arc::downgrade(metrics), found.clone()));
    found
}

/// Watches and the dispatcher of one leadership term.
struct Session {
    queue: Arc<WorkQueue>,
    watches: Vec<JoinHandle<()>>,
    /// Takes work from the queue as the concurrency limit allows; owns the decisions in flight
    /// (aborted with it).
    dispatcher: JoinHandle<()>,
    gauge: JoinHandle<()>,
    /// Sharded: queues the parked requests that become this replica's.
    hand_over: Option<JoinHandle<()>>,
}

impl Session {
    fn start(ctx: &Arc<Ctx>, gate: Arc<Gate>, capacity: usize, ready: &ReadyFlag) -> Session {
        let queue = Arc::new(WorkQueue::new(capacity));
        let synced = Arc::new(Synced {
            waiting: AtomicUsize::new(ctx.signers.len()),
            ready: ready.clone(),
        });
        let watches = ctx
            .signers
            .keys()
            .map(|signer| {
                tokio::spawn(watch_signer(
                    Arc::clone(ctx),
                    Arc::clone(&queue),
                    signer.clone(),
                    Arc::clone(&synced),
                ))
            })
            .collect();
        let dispatcher = tokio::spawn(dispatch(Arc::clone(ctx), Arc::clone(&queue), gate));
        let gauge = {
            let queue = Arc::clone(&queue);
            let metrics = Arc::clone(&ctx.metrics);
            let shard = ctx.shard.clone();
            tokio::spawn(async move {
                loop {
                    metrics.queue_depth.set(queue.len() as i64);
                    metrics.in_flight.set(queue.in_flight() as i64);
                    if let Some(shard) = &shard {
                        shard.metrics.parked.set(shard.parked() as i64);
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
        };
        let hand_over = ctx.shard.as_ref().map(|shard| {
            tokio::spawn(hand_over(
                Arc::clone(ctx),
                Arc::clone(shard),
                Arc::clone(&queue),
            ))
        });
        Session {
            queue,
            watches,
            dispatcher,
            gauge,
            hand_over,
        }
    }

    async fn drain(mut self, timeout: Duration) {
        self.queue.close();
        for w in &self.watches {
            w.abort();
        }
        if tokio::time::timeout(timeout, &mut self.dispatcher)
            .await
            .is_err()
        {
            warn!("in-flight work did not finish within {timeout:?}");
        }
        // Drop aborts whatever is left.
    }

    fn abort(self) {
        // Drop does it.
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.queue.close();
        for h in self.watches.iter().chain([&self.dispatcher]) {
            h.abort();
        }
        self.gauge.abort();
        if let Some(h) = &self.hand_over {
            h.abort();
        }
    }
}

/// Queues the parked requests that become this replica's: at once when the members change (one
/// left, or this one joined), and every quarter of the takeover bound (a stuck owner's).
async fn hand_over(ctx: Arc<Ctx>, shard: Arc<Shard>, queue: Arc<WorkQueue>) {
    let mut members = shard.members.clone();
    let tick = (shard.takeover_after / 4).max(Duration::from_secs(1));
    // The set is re-sent on every renewal; only a different set (or the tick) moves shares.
    let mut seen: Option<Arc<Vec<String>>> = None;
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut ticked = true;
    loop {
        let live = Arc::clone(&members.borrow_and_update().live);
        let moved = seen.as_ref() != Some(&live);
        seen = Some(live);
        let claimed = if moved || ticked {
            shard.claim((ctx.clock)())
        } else {
            Vec::new()
        };
        if !claimed.is_empty() {
            info!(requests = claimed.len(), members = ?members.borrow().live, "taking over pending requests");
        }
        for pcr in claimed {
            // Ignored: in flight here already, or settled.
            queue.push_retry(Item {
                pcr,
                attempt: 0,
                signed: None,
            });
        }
        ticked = tokio::select! {
            r = members.changed() => if r.is_err() { return } else { false },
            _ = ticks.tick() => true,
        };
    }
}

/// Counts the signer watches still to finish their first list; the last one makes the
/// controller ready.
struct Synced {
    waiting: AtomicUsize,
    ready: ReadyFlag,
}

impl Synced {
    fn one_synced(&self) {
        if self.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.ready.set(true);
        }
    }
}

async fn watch_signer(ctx: Arc<Ctx>, queue: Arc<WorkQueue>, signer: String, synced: Arc<Synced>) {
    let config = bounded::watcher_config(
        watcher::Config::default().fields(&format!("spec.signerName={signer}")),
    );
    match ctx.version {
        ApiVersion::V1 => {
            // Decoded lean (`crate::watched`): no managedFields, no issued chain.
            let api: Api<WatchedPcr> = Api::all(ctx.client.clone());
            let stream = watcher(api, config).default_backoff();
            feed(stream, Watched::Lean, &queue, &ctx, &signer, &synced).await;
        }
        ApiVersion::V1Beta1 => {
            let api: Api<v1beta1::PodCertificateRequest> = Api::all(ctx.client.clone());
            let stream = watcher(api, config).default_backoff();
            feed(
                stream,
                Watched::Whole(Pcr::from_v1beta1),
                &queue,
                &ctx,
                &signer,
                &synced,
            )
            .await;
        }
    }
}

/// How a watch's objects become requests: decoded whole (v1beta1), or lean first and whole
/// only when this replica works on them (v1, [`WatchedPcr`]).
enum Watched<K> {
    Whole(fn(K) -> Option<Pcr>),
    Lean,
}

/// What an event's object says, as far as `feed` needs it.
trait Placeable: Sized {
    fn uid(&self) -> Option<&str>;
    /// Settled, or (decoded whole) for another signer.
    fn done(&self, signer: &str) -> bool;
    /// The request without its spec, to park (lean), or whole.
    fn placed(&self, signer: &str, whole: Option<fn(Self) -> Option<Pcr>>) -> Option<Pcr>;
    fn decode(self, whole: Option<fn(Self) -> Option<Pcr>>) -> Option<Pcr>;
}

impl Placeable for WatchedPcr {
    fn uid(&self) -> Option<&str> {
        WatchedPcr::uid(self)
    }
    fn done(&self, _: &str) -> bool {
        // The field selector filters by signer; a whole decode checks it again (`plan`).
        self.is_settled()
    }
    fn placed(&self, signer: &str, _: Option<fn(Self) -> Option<Pcr>>) -> Option<Pcr> {
        WatchedPcr::placed(self, signer)
    }
    fn decode(self, _: Option<fn(Self) -> Option<Pcr>>) -> Option<Pcr> {
        WatchedPcr::decode(self)
    }
}

impl Placeable for v1beta1::PodCertificateRequest {
    fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }
    fn done(&self, signer: &str) -> bool {
        self.spec.signer_name != signer
            || self
                .status
                .as_ref()
                .and_then(|s| request::terminal(s.conditions.as_deref()))
                .is_some()
    }
    fn placed(&self, _: &str, whole: Option<fn(Self) -> Option<Pcr>>) -> Option<Pcr> {
        whole.and_then(|convert| convert(self.clone()))
    }
    fn decode(self, whole: Option<fn(Self) -> Option<Pcr>>) -> Option<Pcr> {
        whole.and_then(|convert| convert(self))
    }
}

async fn feed<K: Placeable>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    watched: Watched<K>,
    queue: &WorkQueue,
    ctx: &Ctx,
    signer: &str,
    synced: &Synced,
) {
    let whole = match watched {
        Watched::Whole(convert) => Some(convert),
        Watched::Lean => None,
    };
    let metrics = &ctx.metrics;
    let mut first_sync = true;
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                let Some(uid) = obj.uid().map(str::to_owned) else {
                    continue;
                };
                if obj.done(signer) {
                    if let Some(shard) = &ctx.shard {
                        shard.unpark(&uid);
                    }
                    continue;
                }
                if let Some(shard) = &ctx.shard {
                    // Placed from its metadata: another replica's request is parked without
                    // its spec, re-read if it ever comes to this replica.
                    let Some(placed) = obj.placed(signer, whole) else {
                        continue;
                    };
                    if !shard.take_or_park(&Arc::new(placed), (ctx.clock)()) {
                        continue;
                    }
                }
                let Some(pcr) = obj.decode(whole) else {
                    continue;
                };
                // The field selector already filters; a wrong signer here would be an API bug.
                if pcr.terminal.is_some() || pcr.signer_name != signer {
                    continue;
                }
                queue.push(Item::new(pcr)).await;
            }
            Ok(watcher::Event::Delete(obj)) => {
                if let Some(uid) = obj.uid() {
                    queue.forget(uid);
                    if let Some(shard) = &ctx.shard {
                        shard.unpark(uid);
                    }
                }
            }
            Ok(watcher::Event::Init) => debug!(signer, "watch (re)listing"),
            Ok(watcher::Event::InitDone) => {
                info!(signer, "watch synced");
                if std::mem::take(&mut first_sync) {
                    synced.one_synced();
                }
            }
            Err(e) => {
                metrics.watch_errors.inc();
                warn!(signer, error = %e, "PodCertificateRequest watch");
            }
        }
    }
}

/// What became of one attempt.
enum Step {
    /// Answered, by us or by someone else, or gone: never look at it again.
    Settled,
    /// Given up without an answer (a later relist may try again).
    Dropped,
    /// Try again after a backoff, and not before the duration given (a 429's `Retry-After`).
    Retry(Item, RetryCause, Duration),
}

impl Step {
    fn retry(item: Item, cause: RetryCause) -> Step {
        Step::Retry(item, cause, Duration::ZERO)
    }
}

/// Starts a decision for each queued item as the concurrency limit allows, until the queue
/// closes; then waits for the decisions in flight (aborting this task aborts them).
///
/// Finished decisions are joined while waiting for the next item too: a finished task keeps its
/// memory until it is joined, and after a burst the last `max_in_flight` of them (about 5 KB
/// each) stayed until the next request came, pinning the allocator pages around them (issue #48).
async fn dispatch(ctx: Arc<Ctx>, queue: Arc<WorkQueue>, gate: Arc<Gate>) {
    let mut decisions = tokio::task::JoinSet::new();
    loop {
        while decisions.try_join_next().is_some() {}
        gate.room().await;
        // `pop` is cancel-safe: an item leaves the queue only in the poll that returns it.
        let next = tokio::select! {
            next = queue.pop() => next,
            Some(_) = decisions.join_next() => continue,
        };
        let Some(item) = next else { break };
        // The only place permits are taken: the room found above is still there.
        let permit = gate.start();
        decisions.spawn(decision(Arc::clone(&ctx), Arc::clone(&queue), item, permit));
    }
    while decisions.join_next().await.is_some() {}
}

/// One decision on `item` under `permit`, and what follows it: settled, dropped, or retried
/// after a backoff.
async fn decision(ctx: Arc<Ctx>, queue: Arc<WorkQueue>, item: Item, permit: Permit) {
    let uid = item.pcr.uid.clone();
    let span = info_span!(
        "pcr",
        namespace = %item.pcr.namespace,
        name = %item.pcr.name,
        uid = %uid,
        signer = %item.pcr.signer_name,
        service_account = %item.pcr.service_account,
        attempt = item.attempt,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
    );
    let step = reconcile(&ctx, item, &permit).instrument(span).await;
    drop(permit);
    match step {
        Step::Settled => queue.done(&uid, true),
        Step::Dropped => queue.done(&uid, false),
        Step::Retry(mut item, cause, not_before) => {
            ctx.metrics
                .retries
                .get_or_create(&RetryLabels { cause })
                .inc();
            queue.done(&uid, false);
            // A 429's Retry-After is a floor under the backoff.
            let delay = decide::backoff(item.attempt, rand::random::<f64>()).max(not_before);
            debug!(uid, cause = cause.as_str(), ?delay, "retrying");
            item.attempt = item.attempt.saturating_add(1);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                queue.push_retry(item);
            });
        }
    }
}

/// One attempt: fetch → [`plan::plan`] → the one action it names → at most one `/status` write.
async fn reconcile(ctx: &Ctx, mut item: Item, permit: &Permit) -> Step {
    // Sharded: the members may have changed while it was queued.
    if let Some(shard) = &ctx.shard
        && !shard.take_or_park(&item.pcr, (ctx.clock)())
    {
        return Step::Dropped;
    }
    // Fetch: the watched copy on the first try; a fresh read on retries, and for a request
    // parked lean (its spec was never decoded here).
    let watched = Arc::clone(&item.pcr);
    let fresh = if item.attempt > 0 || watched.lean {
        let fresh = fetch(ctx, ctx.version, &watched.namespace, &watched.name).await;
        if let Err(e) = &fresh {
            debug!(error = %e, "re-reading");
        }
        Some(fresh)
    } else {
        None
    };
    let read = match &fresh {
        Some(fresh) => Read::of(fresh, &watched.uid),
        None => Read::Found(&watched),
    };

    // Decide, then do the one thing decided.
    let now = (ctx.clock)();
    let plan = plan::plan(Facts {
        read,
        policies: &ctx.signers,
        cached: item.signed.as_deref(),
        legacy_readable: ctx.served.legacy_readable(),
        now,
    });
    let signed = match plan {
        Plan::Skip(SkipReason::Terminal) => return Step::Settled,
        Plan::Skip(SkipReason::Gone) => {
            debug!("gone before it was answered");
            return Step::Settled;
        }
        Plan::Retry(cause) => return Step::retry(item, cause),
        Plan::ResendCached(write) => Ok(write),
        Plan::Write(write) => Ok(write),
        Plan::ReadThroughV1beta1(policy) => {
            // A legacy request read through v1 shows an empty stub: read it through v1beta1 (§1.6).
            let beta = fetch(ctx, ApiVersion::V1Beta1, &watched.namespace, &watched.name).await;
            match Read::of(&beta, &watched.uid) {
                Read::Found(beta) => sign(ctx, policy, beta, now).await,
                Read::Gone | Read::Failed => Err(RetryCause::Read),
            }
        }
        Plan::Sign(policy, source) => sign(ctx, policy, source, now).await,
    };
    let write = match signed {
        Ok(write) => write,
        Err(cause) => {
            // Whatever was cached is stale by now, or it would have been resent.
            item.signed = None;
            return Step::retry(item, cause);
        }
    };
    item.signed = match &write.outcome {
        Outcome::Issued(cert) => Some(Arc::new((**cert).clone())),
        _ => None,
    };
    // Written back through the version it was read with.
    if let Some(Ok(Some(fresh))) = fresh {
        item.pcr = Arc::new(fresh);
    }
    let pcr = Arc::clone(&item.pcr);

    // Write, only while leading, or (sharded) while it is this replica's.
    let ours = match &ctx.shard {
        Some(shard) => shard.take_or_park(&pcr, (ctx.clock)()),
        None => *ctx.leading.borrow(),
    };
    if !ours {
        return Step::Dropped;
    }
    let Write {
        settlement,
        patch,
        outcome,
    } = write;
    // The durability contract: the answer is in the ledger before the status shows it.
    let recorded = record_decision(ctx, &pcr, &outcome, now)
        .instrument(info_span!("ledger_commit"))
        .await;
    if let Err(e) = recorded {
        warn!(error = %e, "the ledger cannot record the answer; leaving the request pending");
        item.signed = None;
        return Step::retry(item, RetryCause::Ledger);
    }
    let write = permit.begin_write();
    let written = write_status(ctx, &pcr, &patch)
        .instrument(info_span!("status_write"))
        .await;
    let load = write_outcome(&written);
    permit.end_write(write, load);
    match written {
        Ok(()) => {
            if let Some(shard) = &ctx.shard {
                shard.count_settled();
            }
            record_settled(ctx, &pcr, settlement, &outcome, now).await;
            Step::Settled
        }
        Err(e) => match decide::classify(&e) {
            ErrorClass::Gone => {
                late(ctx, LateCause::Gone);
                Step::Settled
            }
            ErrorClass::SettledElsewhere => {
                late(ctx, LateCause::SettledElsewhere);
                Step::Settled
            }
            ErrorClass::Conflict => {
                match fetch(ctx, ctx.version, &pcr.namespace, &pcr.name).await {
                    Ok(Some(fresh)) if fresh.uid == pcr.uid && fresh.terminal.is_none() => {
                        Step::retry(item, RetryCause::Conflict)
                    }
                    Ok(_) => {
                        late(ctx, LateCause::Conflict);
                        Step::Settled
                    }
                    Err(_) => Step::retry(item, RetryCause::Conflict),
                }
            }
            ErrorClass::Transient => {
                debug!(error = %e, "status write failed; will retry");
                let not_before = match load {
                    WriteOutcome::Throttled { retry_after } => retry_after,
                    _ => Duration::ZERO,
                };
                Step::Retry(item, RetryCause::Write, not_before)
            }
            ErrorClass::Rejected => {
                ctx.metrics.writes_rejected.inc();
                error!(error = %e, "the API server refused the status write");
                Step::Dropped
            }
        },
    }
}

/// What a status write's answer says about the API server's load ([`crate::concurrency`]).
fn write_outcome(written: &Result<(), kube::Error>) -> WriteOutcome {
    match written {
        Ok(()) => WriteOutcome::Done,
        Err(kube::Error::Api(status)) => match status.code {
            429 => WriteOutcome::Throttled {
                retry_after: Duration::from_secs(u64::from(retry_after_seconds(status))),
            },
            500..=599 => WriteOutcome::Overloaded,
            _ => WriteOutcome::Neutral,
        },
        // A timeout (bounded::call), a refused or broken connection.
        Err(_) => WriteOutcome::Overloaded,
    }
}

/// A 429's `Retry-After`, from the Status's `details.retryAfterSeconds`; 1 s when it has none:
/// kube-apiserver's priority and fairness answers 429 with `Retry-After: 1` in a header that
/// kube's client does not pass on, and a plain-text body.
fn retry_after_seconds(status: &kube::core::Status) -> u32 {
    status
        .details
        .as_ref()
        .map(|d| d.retry_after_seconds)
        .filter(|&s| s > 0)
        .unwrap_or(1)
        .min(60)
}

/// Signs `source` (inline with a quick in-process CA key, else off the async threads) and maps
/// the answer to a write, or to the cause of a retry.
async fn sign(
    ctx: &Ctx,
    policy: &SignerPolicy,
    source: &Pcr,
    now: OffsetDateTime,
) -> Result<Write, RetryCause> {
    // The tenant the namespace belongs to (its trust domain), and the CA of the signer or
    // tenant that decides: each is a trust domain of its own.
    let (policy, tenant) = match policy.resolve(&source.namespace) {
        Ok(resolved) => resolved,
        Err(decision) => return plan::after_signing(Outcome::of_refusal(decision), now),
    };
    let ca = Arc::clone(
        &ctx.ca
            .for_request(&source.signer_name, tenant.as_deref())
            .current()
            .ca,
    );
    let labels = match (&ctx.namespace_labels, policy.rules_use_namespace_labels()) {
        (Some(store), true) => match store.get(&source.namespace) {
            Ok(labels) => Some(labels),
            // Deciding without them could deny for good: wait for the namespace watch.
            Err(_) => return Err(RetryCause::NamespaceLabels),
        },
        _ => None,
    };
    let pod = if policy.reads_pod_for(&source.namespace, &source.service_account) {
        let pods = crate::grpc_auth::KubePodDirectory::new(ctx.client.clone());
        match read_pod_facts(
            &pods,
            (&source.signer_name, &policy),
            &source.namespace,
            (&source.pod_name, &source.pod_uid),
            &source.service_account,
        )
        .await
        {
            Ok(pod) => Some(pod),
            // kube-apiserver checked the pod when the request was created (spec §1.5); it has
            // gone since, or was replaced: the request speaks for no pod now.
            Err(PodFactsError::Gone(message)) => {
                return plan::after_signing(
                    Outcome::Denied {
                        reason: DenyReason::PodNotFound,
                        message,
                    },
                    now,
                );
            }
            // Deciding without the pod could deny for good: wait (RBAC, API trouble).
            Err(e @ PodFactsError::Unavailable { .. }) => {
                warn!(error = %e, "leaving the request pending");
                return Err(RetryCause::PodFacts);
            }
        }
    } else {
        None
    };
    let service_sans = match service_ca_sans(ctx, &policy, source).await {
        Ok(sans) => sans,
        Err(Refusal::Answer(outcome)) => return plan::after_signing(outcome, now),
        Err(Refusal::Retry) => return Err(RetryCause::ServiceCa),
    };
    // An in-memory ECDSA/Ed25519 CA key signs in tens of microseconds, with the stub CSR's
    // verification (RSA included: verifying is cheap) about as much again: inline costs less
    // than a hand-off to the blocking pool and back (issue #41). An HSM or an RSA CA key waits
    // or works for milliseconds: the blocking pool.
    let inline = ca.key().signs_quickly_in_process();
    let source = source.clone();
    let work = move || {
        let facts = request::Facts {
            namespace_labels: labels.as_deref(),
            pod: pod.as_ref(),
            service_sans: service_sans.as_ref(),
        };
        request::sign_pcr(&policy, &ca, &source, facts, now)
    };
    let outcome = if inline {
        work()
    } else {
        let span = tracing::Span::current();
        match tokio::task::spawn_blocking(move || span.in_scope(work)).await {
            Ok(o) => o,
            Err(e) => {
                error!(error = %e, "signing task failed");
                return Err(RetryCause::Sign);
            }
        }
    };
    if let Outcome::Retry(e) = &outcome {
        warn!(error = %e, "CA backend unavailable; leaving the request pending");
    }
    plan::after_signing(outcome, now)
}

/// Why a request gets no certificate now: the answer, or a retry.
enum Refusal {
    Answer(Outcome),
    Retry,
}

/// The SANs the `kubernetes.io/service-ca` vocabulary entitles `source`'s pod to, for a signer
/// with `service_ca` whose allow-lists admit the request (they deny first, so a refused request
/// costs no read); `None` when the request uses none of its annotations.
async fn service_ca_sans(
    ctx: &Ctx,
    policy: &SignerPolicy,
    source: &Pcr,
) -> Result<Option<Sans>, Refusal> {
    let Some(profile) = &policy.service_ca else {
        return Ok(None);
    };
    if policy
        .admits(&source.namespace, &source.service_account)
        .is_err()
    {
        return Ok(None);
    }
    let request = service_ca::ForRequest {
        namespace: &source.namespace,
        pod_name: &source.pod_name,
        pod_uid: &source.pod_uid,
        service_account: &source.service_account,
    };
    match service_ca::entitlement(&ctx.client, profile, request, &source.user_annotations).await {
        Entitlement::NotAsked => Ok(None),
        Entitlement::Sans(sans) => Ok(Some(sans)),
        Entitlement::Refused { reason, message } => {
            Err(Refusal::Answer(Outcome::Denied { reason, message }))
        }
        Entitlement::Unavailable(e) => {
            warn!(error = %e, "leaving the request pending");
            Err(Refusal::Retry)
        }
    }
}

fn late(ctx: &Ctx, cause: LateCause) {
    debug!(
        cause = cause.as_str(),
        "late status write: someone else settled or deleted the request"
    );
    ctx.metrics
        .late_writes
        .get_or_create(&LateLabels { cause })
        .inc();
}

/// Records the answer to `pcr` and waits until it is durable.
async fn record_decision(
    ctx: &Ctx,
    pcr: &Pcr,
    outcome: &Outcome,
    now: OffsetDateTime,
) -> Result<(), LedgerUnavailable> {
    let Some(ledger) = &ctx.ledger else {
        return Ok(());
    };
    let (trust_domain, tenant) = match ctx.signers.get(&pcr.signer_name) {
        Some(policy) => match policy.tenant_of(&pcr.namespace) {
            Ok(Some(tenant)) => (
                tenant.trust_domain(&policy.trust_domain),
                Some(tenant.name.to_owned()),
            ),
            _ => (policy.trust_domain.clone(), None),
        },
        None => (String::new(), None),
    };
    let snapshot = ctx
        .ca
        .for_request(&pcr.signer_name, tenant.as_deref())
        .current();
    let context = RecordContext {
        source: Source::Pcr,
        signer: pcr.signer_name.clone(),
        identity: spiffe_id(&trust_domain, &pcr.namespace, &pcr.service_account),
        requester: Some(format!("system:node:{}", pcr.node_name)),
        namespace: pcr.namespace.clone(),
        service_account: pcr.service_account.clone(),
        pod_name: Some(pcr.pod_name.clone()),
        pod_uid: Some(pcr.pod_uid.clone()),
        node_name: Some(pcr.node_name.clone()),
        request_uid: Some(pcr.uid.clone()),
        request_name: Some(format!("{}/{}", pcr.namespace, pcr.name)),
        ca_generation: snapshot.ca_generation.map(u64::from),
        issuer_fingerprint: Some(snapshot.ca.fingerprint().to_owned()),
        auth: Some(podca_signer::ledger::AuthFacts::kubelet()),
        replica: ctx.replica.clone(),
        time: now,
    };
    match LedgerRecord::of_outcome(&context, outcome) {
        Some(record) => ledger.record_patiently(record).await,
        None => Ok(()),
    }
}

async fn write_status(ctx: &Ctx, pcr: &Pcr, patch: &Value) -> Result<(), kube::Error> {
    // The answer is the whole request; only whether the write was taken matters (`Written`).
    let api: Api<Written> = Api::namespaced_with(
        ctx.client.clone(),
        &pcr.namespace,
        &Resource::PodCertificateRequests.api_resource(pcr.version),
    );
    bounded::call(
        "patch_pcr_status",
        &ctx.metrics,
        api.patch_status(&pcr.name, &PatchParams::default(), &Patch::Merge(patch)),
    )
    .await
    .map(|_| ())
}

async fn fetch(
    ctx: &Ctx,
    version: ApiVersion,
    namespace: &str,
    name: &str,
) -> Result<Option<Pcr>, kube::Error> {
    match version {
        ApiVersion::V1 => {
            let api: Api<v1::PodCertificateRequest> =
                Api::namespaced(ctx.client.clone(), namespace);
            Ok(bounded::call("get_pcr", &ctx.metrics, api.get_opt(name))
                .await?
                .and_then(Pcr::from_v1))
        }
        ApiVersion::V1Beta1 => {
            let api: Api<v1beta1::PodCertificateRequest> =
                Api::namespaced(ctx.client.clone(), namespace);
            Ok(bounded::call("get_pcr", &ctx.metrics, api.get_opt(name))
                .await?
                .and_then(Pcr::from_v1beta1))
        }
    }
}

/// The decision span's `outcome` (traces).
fn settled_as(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Issued(_) => "issued",
        Outcome::Denied { .. } => "denied",
        Outcome::Failed { .. } | Outcome::Retry(_) => "failed",
    }
}

async fn record_settled(
    ctx: &Ctx,
    pcr: &Pcr,
    settlement: Settlement,
    outcome: &Outcome,
    now: OffsetDateTime,
) {
    let (family, reason, message) = match outcome {
        Outcome::Issued(cert) => {
            info!(serial = %cert.serial, spiffe_id = %cert.spiffe_id, "issued");
            (&ctx.metrics.issued, podca_signer::reason::ISSUED, None)
        }
        Outcome::Denied { reason, message } => {
            info!(%reason, message, "denied");
            (
                &ctx.metrics.denied,
                reason.condition_reason(),
                Some(message.as_str()),
            )
        }
        Outcome::Failed { reason, message } => {
            warn!(%reason, message, "failed");
            (
                &ctx.metrics.failed,
                reason.condition_reason(),
                Some(message.as_str()),
            )
        }
        Outcome::Retry(_) => return,
    };
    let span = tracing::Span::current();
    span.record("outcome", settled_as(outcome));
    span.record("reason", reason);
    family
        .get_or_create(&SettleLabels {
            signer: pcr.signer_name.clone(),
            reason: reason.to_owned(),
        })
        .inc();
    if let Some(created) = pcr.created {
        let seconds = (now - created).as_seconds_f64().max(0.0);
        ctx.metrics
            .settle_seconds
            .get_or_create(&SignerLabels {
                signer: pcr.signer_name.clone(),
            })
            .observe(seconds);
    }
    if let Some(message) = message {
        debug_assert!(settlement != Settlement::Issued);
        publish_event(ctx, pcr, settlement, reason, message).await;
    }
}

/// A Warning Event regarding the PCR (events.k8s.io/v1). Best effort: an Event that cannot be
/// written never holds up or undoes the answer.
async fn publish_event(ctx: &Ctx, pcr: &Pcr, settlement: Settlement, reason: &str, message: &str) {
    let note: String = message.chars().take(1000).collect();
    let event = KubeEvent {
        type_: EventType::Warning,
        reason: decide::sanitize_reason(reason),
        note: Some(note),
        action: settlement.condition_type().into(),
        secondary: None,
    };
    let reference = ObjectReference {
        api_version: Some(pcr.version.as_str().into()),
        kind: Some("PodCertificateRequest".into()),
        name: Some(pcr.name.clone()),
        namespace: Some(pcr.namespace.clone()),
        uid: Some(pcr.uid.clone()),
        ..Default::default()
    };
    match tokio::time::timeout(
        Duration::from_secs(5),
        ctx.recorder.publish(&event, &reference),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "could not record an Event"),
        Err(_) => warn!("recording an Event timed out"),
    }
}

/// Keeps `podca_ca_not_after_timestamp_seconds` on the CA in force.
async fn track_ca_not_after(
    ca: String,
    mut rx: watch::Receiver<Arc<CaSnapshot>>,
    metrics: Arc<Metrics>,
) {
    let gauge = metrics
        .ca_not_after
        .get_or_create(&podca_authority::metrics::CaNameLabels { ca })
        .clone();
    loop {
        let not_after = rx.borrow_and_update().ca.not_after().unix_timestamp();
        gauge.set(not_after);
        if rx.changed().await.is_err() {
            return;
        }
    }
}
