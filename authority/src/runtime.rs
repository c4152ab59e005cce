//! The one runtime every serving command composes (`podca serve`, `podca dev`).
//!
//! A [`Runtime`] owns, once: the metrics registry (a sub-registry per component), readiness (a
//! component holds an init handle, [`Runtime::init_handle`], until it is ready), the admin
//! listener, the clock and the one stop signal with its drain. Everything else is a component:
//! a function that takes `&mut Runtime`, decides its own mode once, registers what it needs and
//! spawns its tasks here. `serve` and `dev` only choose which components to compose, then call
//! [`Runtime::run`].
//!
//! Stopping happens in two stages within one deadline (`--drain-timeout`): first the
//! [`Stage::Serve`] tasks (listeners, the PCR controller, bundle keepers), which finish the
//! requests they hold; then the [`Stage::Support`] tasks those requests rely on until their
//! last answer (the ledger writer, CA and key drivers, the admin listener, which answers 503 on
//! `/readyz` from the first moment of shutdown).

use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use crate::admin::{self, Readiness, ReadyFlag};
use crate::metrics::Metrics;
use crate::metrics_auth::MetricsAuth;
use crate::shutdown::Shutdown;
use crate::trust::Clock;

/// When a task is told to stop (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Answers requests: stopped first, and waited for before [`Stage::Support`] stops.
    Serve,
    /// Serves the serving tasks (ledger writer, CA and key drivers, admin): stopped last.
    Support,
}

/// What the runtime is built with.
#[derive(Clone)]
pub struct RuntimeOptions {
    /// `/metrics`, `/livez`, `/readyz`; `None`: no admin listener.
    pub admin_listen: Option<SocketAddr>,
    /// How long stopping may take, both stages together.
    pub drain_timeout: Duration,
    pub clock: Clock,
}

/// The runtime could not start, or a component it runs failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error(transparent)]
    Admin(#[from] admin::BindError),
    /// A component without which the command cannot go on failed or ended.
    #[error("{component}: {message}")]
    Component { component: String, message: String },
}

/// See the module docs.
pub struct Runtime {
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    clock: Clock,
    serve: Shutdown,
    support: Shutdown,
    /// Bound by [`Runtime::run`], the last listener to open: once it answers, every other
    /// listener of the command is up.
    admin_listen: Option<SocketAddr>,
    /// Who may read `/metrics` ([`Runtime::protect_metrics`]); `None`: everyone who connects.
    metrics_auth: Option<Arc<dyn MetricsAuth>>,
    /// The ledger's Merkle log, served under `/log/` ([`Runtime::serve_log`]).
    log_tiles: Option<Arc<crate::ledger::tiles::LogTiles>>,
    drain_timeout: Duration,
    /// Whether this replica leads (true unless a leader election says otherwise): the
    /// components that act only as leader follow it, the leader election sets it.
    leadership: watch::Sender<bool>,
    /// Where decisions are recorded ([`crate::components::ledger::start`] sets it); until
    /// then, nowhere but the audit log.
    ledger: crate::ledger::LedgerHandle,
    /// Failures of critical components ([`Runtime::spawn_critical`]).
    failed_tx: mpsc::UnboundedSender<RuntimeError>,
    failed: mpsc::UnboundedReceiver<RuntimeError>,
}

impl std::fmt::Debug for RuntimeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeOptions")
            .field("admin_listen", &self.admin_listen)
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("admin_listen", &self.admin_listen)
            .field("drain_timeout", &self.drain_timeout)
            .field("readiness", &self.readiness)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A runtime with nothing registered yet.
    pub fn new(options: RuntimeOptions) -> Self {
        let RuntimeOptions {
            admin_listen,
            drain_timeout,
            clock,
        } = options;
        let (failed_tx, failed) = mpsc::unbounded_channel();
        Runtime {
            metrics: Arc::new(Metrics::new()),
            readiness: Readiness::new(),
            clock,
            serve: Shutdown::new(),
            support: Shutdown::new(),
            admin_listen,
            metrics_auth: None,
            log_tiles: None,
            drain_timeout,
            leadership: watch::Sender::new(true),
            ledger: crate::ledger::LedgerHandle::none(),
            failed_tx,
            failed,
        }
    }

    /// The shared metrics; a component with metrics of its own registers them with
    /// [`Metrics::register_component`].
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The ledger components record into (none until the ledger component started).
    pub fn ledger(&self) -> crate::ledger::LedgerHandle {
        self.ledger.clone()
    }

    /// Makes `ledger` the one [`Runtime::ledger`] hands out.
    pub fn use_ledger(&mut self, ledger: crate::ledger::LedgerHandle) {
        self.ledger = ledger;
    }

    /// What `/readyz` answers.
    pub fn readiness(&self) -> &Arc<Readiness> {
        &self.readiness
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The drain deadline (`--drain-timeout`), for components that bound their own last work
    /// by it (the PCR controller's in-flight writes).
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout
    }

    /// Whether this replica leads: components that act only as leader subscribe; the leader
    /// election (the PCR controller's Lease) sends. True until someone says otherwise.
    pub fn leadership(&self) -> &watch::Sender<bool> {
        &self.leadership
    }

    /// `component`'s say in `/readyz`: not ready until the component sets it.
    pub fn init_handle(&self, component: &str) -> ReadyFlag {
        self.readiness.component(component)
    }

    /// A receiver that turns true when `stage` is told to stop.
    pub fn stop_receiver(&self, stage: Stage) -> watch::Receiver<bool> {
        self.stage(stage).receiver()
    }

    /// Resolves when `stage` is told to stop: the shutdown future a server takes.
    pub fn stopped(&self, stage: Stage) -> impl Future<Output = ()> + Send + 'static {
        self.stage(stage).stopped()
    }

    /// Runs `task(stop)` until it ends; `stop` turns true when `stage` stops, and the task must
    /// end soon after.
    pub fn spawn<F>(
        &mut self,
        stage: Stage,
        name: impl Into<String>,
        task: impl FnOnce(watch::Receiver<bool>) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let shutdown = self.stage_mut(stage);
        let task = task(shutdown.receiver());
        shutdown.spawn(name, task);
    }

    /// As [`Runtime::spawn`], for a component the command cannot go on without: its error, or
    /// its end before stop, stops everything and becomes [`Runtime::run`]'s error.
    pub fn spawn_critical<F, E>(
        &mut self,
        stage: Stage,
        name: impl Into<String>,
        task: impl FnOnce(watch::Receiver<bool>) -> F,
    ) where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let name = name.into();
        let stop = self.stop_receiver(stage);
        let failed = self.failed_tx.clone();
        let component = name.clone();
        self.spawn(stage, name, move |rx| {
            let task = task(rx);
            async move {
                let message = match task.await {
                    Err(e) => e.to_string(),
                    Ok(()) if *stop.borrow() => return,
                    Ok(()) => "ended before shutdown".to_owned(),
                };
                let _ = failed.send(RuntimeError::Component { component, message });
            }
        });
    }

    /// From now on the admin listener's `/metrics` answers only the tokens `auth` allows
    /// (`/livez` and `/readyz` stay open); call before [`Runtime::run`].
    pub fn protect_metrics(&mut self, auth: Arc<dyn MetricsAuth>) {
        self.metrics_auth = Some(auth);
    }

    /// From now on the admin listener serves the ledger's Merkle log under `/log/` (C2SP
    /// tlog-tiles); call before [`Runtime::run`].
    pub fn serve_log(&mut self, tiles: Arc<crate::ledger::tiles::LogTiles>) {
        self.log_tiles = Some(tiles);
    }

    /// Binds and serves the admin listener, then waits for `signal` (or a critical
    /// component's failure), and stops: readiness turns false at once, the [`Stage::Serve`]
    /// tasks drain, then the [`Stage::Support`] tasks, all within the drain deadline.
    pub async fn run(mut self, signal: impl Future<Output = ()>) -> Result<(), RuntimeError> {
        let failure = match self.serve_admin().await {
            Err(e) => Some(e),
            Ok(()) => tokio::select! {
                () = signal => None,
                failure = self.failed.recv() => failure,
            },
        };
        match &failure {
            None => info!("stopping: draining"),
            Some(e) => error!(error = %e, "stopping: a component failed"),
        }
        self.readiness.shut_down();
        let started = tokio::time::Instant::now();
        let mut late = self.serve.drain(self.drain_timeout).await;
        let left = self.drain_timeout.saturating_sub(started.elapsed());
        late.extend(self.support.drain(left).await);
        let alive = alive_tasks().await;
        if late.is_empty() {
            info!(
                took_ms = started.elapsed().as_millis() as u64,
                alive_tasks = alive,
                "stopped: every task drained"
            );
        } else {
            warn!(late = ?late, alive_tasks = alive, "stopped: some tasks did not drain in time");
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn serve_admin(&mut self) -> Result<(), RuntimeError> {
        let Some(addr) = self.admin_listen else {
            return Ok(());
        };
        let listener = admin::bind(addr).await?;
        let protected = self.metrics_auth.is_some();
        let log = self.log_tiles.clone();
        let paths = if log.is_some() {
            "/metrics /livez /readyz /log/"
        } else {
            "/metrics /livez /readyz"
        };
        info!(%addr, metrics_auth = protected, "admin listener: {paths}");
        let (metrics, readiness) = (Arc::clone(&self.metrics), Arc::clone(&self.readiness));
        let auth = self.metrics_auth.clone();
        self.spawn(Stage::Support, "admin listener", |stop| {
            admin::serve(listener, metrics, readiness, auth, log, stop)
        });
        Ok(())
    }

    fn stage(&self, stage: Stage) -> &Shutdown {
        match stage {
            Stage::Serve => &self.serve,
            Stage::Support => &self.support,
        }
    }

    fn stage_mut(&mut self, stage: Stage) -> &mut Shutdown {
        match stage {
            Stage::Serve => &mut self.serve,
            Stage::Support => &mut self.support,
        }
    }
}

/// The tasks still alive on this tokio runtime after the drain: per-connection tasks that the
/// drained servers closed get a moment to notice, then the count is what it is.
async fn alive_tasks() -> usize {
    let handle = tokio::runtime::Handle::current();
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    loop {
        let alive = handle.metrics().num_alive_tasks();
        if alive == 0 || tokio::time::Instant::now() >= until {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The tokio runtime a serving command runs on (`podca serve`, `podca dev`), its blocking pool
/// bounded by [`blocking_threads`] of the machine's cores.
pub fn tokio_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(blocking_threads(cores))
        .enable_all()
        .build()
}

/// The most threads for blocking work (signing, ledger commits, key generation, file and DNS
/// calls) on a machine of `cores`: twice the cores, at least 8. tokio's default, 512, let a PCR
/// burst start one thread per decision in flight (up to 64), each with its own allocator heap:
/// 88 MiB peak RSS at 10,000 PCRs against 63 MiB with 8 (issue #48, docs/benchmarks.md).
/// CPU work gains nothing past the cores; the rest leaves room for calls that wait (an HSM over
/// the network, a DNS lookup).
pub fn blocking_threads(cores: usize) -> usize {
    cores.saturating_mul(2).max(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_threads_are_twice_the_cores_and_at_least_eight() {
        for (cores, threads) in [(0, 8), (1, 8), (2, 8), (4, 8), (5, 10), (16, 32)] {
            assert_eq!(blocking_threads(cores), threads, "{cores} cores");
        }
    }

    fn options() -> RuntimeOptions {
        RuntimeOptions {
            admin_listen: None,
            drain_timeout: Duration::from_secs(5),
            clock: crate::system_clock(),
        }
    }

    #[tokio::test]
    async fn serving_tasks_end_before_support_tasks_are_told_to_stop() {
        let mut rt = Runtime::new(options());
        let support_stop = rt.stop_receiver(Stage::Support);
        let (saw_tx, saw) = tokio::sync::oneshot::channel();
        rt.spawn(Stage::Serve, "server", move |mut stop| async move {
            let _ = stop.wait_for(|s| *s).await;
            // The support stage is still running while a serving task finishes its work.
            let _ = saw_tx.send(*support_stop.borrow());
        });
        rt.spawn(Stage::Support, "ledger", |mut stop| async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        let readiness = Arc::clone(rt.readiness());
        let ready = rt.init_handle("server");
        ready.set(true);
        assert!(readiness.is_ready());
        rt.run(async {}).await.unwrap();
        assert_eq!(saw.await, Ok(false), "support stopped before serving ended");
        assert!(!readiness.is_ready(), "not ready once stopped");
    }

    #[tokio::test]
    async fn a_failing_critical_component_stops_the_runtime_with_its_error() {
        let mut rt = Runtime::new(options());
        rt.spawn_critical(Stage::Serve, "controller", |_stop| async {
            Err::<(), _>("watch failed")
        });
        let (other_tx, other) = tokio::sync::oneshot::channel();
        rt.spawn(Stage::Serve, "grpc", |mut stop| async move {
            let _ = stop.wait_for(|s| *s).await;
            let _ = other_tx.send(());
        });
        let error = rt.run(std::future::pending()).await.unwrap_err();
        assert_eq!(error.to_string(), "controller: watch failed");
        assert_eq!(other.await, Ok(()), "the other components were stopped");
    }

    #[tokio::test]
    async fn a_critical_component_ending_early_is_a_failure() {
        let mut rt = Runtime::new(options());
        rt.spawn_critical(Stage::Serve, "controller", |_stop| async {
            Ok::<(), String>(())
        });
        let error = rt.run(std::future::pending()).await.unwrap_err();
        assert_eq!(error.to_string(), "controller: ended before shutdown");
    }

    #[tokio::test]
    async fn a_critical_component_ending_on_stop_is_no_failure() {
        let mut rt = Runtime::new(options());
        rt.spawn_critical(Stage::Serve, "controller", |mut stop| async move {
            let _ = stop.wait_for(|s| *s).await;
            Ok::<(), String>(())
        });
        rt.run(async {}).await.unwrap();
    }
}
