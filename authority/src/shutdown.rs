//! How podca stops: [`signal`] says when (SIGTERM or SIGINT), and [`Shutdown`] owns the one
//! stop signal every background task of a command watches and drains them all within one
//! deadline.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

/// Installs the SIGTERM and SIGINT handlers now (so a signal that arrives before the returned
/// future is first polled still stops the command cleanly) and resolves when either arrives.
#[cfg(unix)]
pub fn signals() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Resolves when SIGTERM or SIGINT arrives.
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The stop signal of a command's background tasks, and the tasks themselves.
///
/// Tasks watch a receiver (it turns true on stop; it also ends when the `Shutdown` is dropped,
/// e.g. on a start-up error). [`Shutdown::drain`] signals stop and waits for every spawned task
/// within one overall deadline, naming each one that did not finish in time.
#[derive(Debug)]
pub struct Shutdown {
    stop: watch::Sender<bool>,
    tasks: Vec<(String, JoinHandle<()>)>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Shutdown {
            stop: watch::Sender::new(false),
            tasks: Vec::new(),
        }
    }

    /// A receiver that turns true on stop (already true once stop was signalled).
    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Resolves on stop: the shutdown future a server takes.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = self.receiver();
        async move {
            // An error means the Shutdown is gone: stop as well.
            let _ = stop.wait_for(|stopped| *stopped).await;
        }
    }

    /// Runs `task` on the runtime until it ends; [`Shutdown::drain`] waits for it and names it
    /// if it does not end in time. `task` must end soon after [`Shutdown::receiver`] turns true.
    pub fn spawn(
        &mut self,
        name: impl Into<String>,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.tasks.push((name.into(), tokio::spawn(task)));
    }

    /// Signals stop; the tasks keep running until they notice (see [`Shutdown::drain`]).
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Signals stop and waits for every spawned task, all within `deadline`. Returns the names
    /// of the tasks that did not end in time (each logged, then aborted).
    pub async fn drain(self, deadline: Duration) -> Vec<String> {
        self.stop();
        let until = tokio::time::Instant::now() + deadline;
        let mut late = Vec::new();
        for (name, mut task) in self.tasks {
            // `timeout_at` polls the task before looking at the clock, so a task that ended
            // while an earlier one was awaited counts as ended even past the deadline.
            match tokio::time::timeout_at(until, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(task = %name, error = %e, "task failed while stopping"),
                Err(_) => {
                    warn!(
                        task = %name,
                        deadline_ms = deadline.as_millis(),
                        "task did not stop within the drain deadline; abandoning it"
                    );
                    task.abort();
                    late.push(name);
                }
            }
        }
        late
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// A task that ends when stop is signalled.
    fn until_stopped(shutdown: &Shutdown) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = shutdown.receiver();
        async move {
            let _ = stop.wait_for(|s| *s).await;
        }
    }

    #[tokio::test]
    async fn tasks_that_end_on_stop_are_drained() {
        let mut shutdown = Shutdown::new();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let task = until_stopped(&shutdown);
        shutdown.spawn("follower", async move {
            task.await;
            let _ = done_tx.send(());
        });
        shutdown.spawn("server", shutdown.stopped());
        let late = shutdown.drain(Duration::from_secs(5)).await;
        assert_eq!(late, Vec::<String>::new());
        assert_eq!(done_rx.await, Ok(()), "the follower ran to its end");
    }

    #[tokio::test]
    async fn hanging_tasks_are_named_within_one_overall_deadline() {
        let mut shutdown = Shutdown::new();
        shutdown.spawn("hangs-1", std::future::pending());
        shutdown.spawn("ends", until_stopped(&shutdown));
        shutdown.spawn("hangs-2", std::future::pending());
        shutdown.spawn("hangs-3", std::future::pending());
        let deadline = Duration::from_millis(200);
        let started = Instant::now();
        let late = shutdown.drain(deadline).await;
        let took = started.elapsed();
        assert_eq!(late, ["hangs-1", "hangs-2", "hangs-3"]);
        assert!(took >= deadline, "waited the deadline: {took:?}");
        // One deadline for all, not one per task (which would be 600 ms).
        assert!(took < deadline * 2, "one overall deadline: {took:?}");
    }

    #[tokio::test]
    async fn abandoned_tasks_are_aborted() {
        let mut shutdown = Shutdown::new();
        let (mut keep, dropped) = tokio::sync::oneshot::channel::<()>();
        shutdown.spawn("hangs", async move {
            // Holds the receiver until the task is dropped.
            let _ = dropped.await;
        });
        let late = shutdown.drain(Duration::from_millis(50)).await;
        assert_eq!(late, ["hangs"]);
        // The abort drops the task's future and with it the receiver.
        tokio::time::timeout(Duration::from_secs(5), keep.closed())
            .await
            .expect("the abandoned task was aborted");
    }

    #[tokio::test]
    async fn a_task_spawned_after_stop_sees_it() {
        let mut shutdown = Shutdown::new();
        shutdown.stop();
        assert!(*shutdown.receiver().borrow());
        shutdown.spawn("late-starter", until_stopped(&shutdown));
        shutdown.spawn("late-server", shutdown.stopped());
        let late = shutdown.drain(Duration::from_secs(5)).await;
        assert_eq!(late, Vec::<String>::new());
    }

    #[tokio::test]
    async fn draining_nothing_returns_at_once() {
        let started = Instant::now();
        let late = Shutdown::new().drain(Duration::from_secs(5)).await;
        assert_eq!(late, Vec::<String>::new());
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn dropping_the_shutdown_ends_its_receivers() {
        let shutdown = Shutdown::new();
        let mut stop = shutdown.receiver();
        drop(shutdown);
        let waited = tokio::time::timeout(Duration::from_secs(5), stop.wait_for(|s| *s)).await;
        assert!(matches!(waited, Ok(Err(_))), "{waited:?}");
    }
}
