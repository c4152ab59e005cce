//! The one loop that drives JWT signing keys, wherever they are kept: a data directory
//! ([`crate::jwt::JwtRotator`]) or a Kubernetes Secret (`podca_controller::jwt_secret`). Each
//! keeper says how to take one look ([`KeyKeeper::check`]: take the due steps, or read another
//! writer's); the loop says when: at the next due step, at least every poll, at once when
//! leadership changes, sooner again after an error, never after stop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::watch;
use tracing::warn;

use crate::rotation::wait_for_next;
use crate::trust::Clock;

/// The longest wait after a failed check.
pub const RETRY_AFTER_ERROR: Duration = Duration::from_secs(30);

/// One place JWT keys are kept.
pub trait KeyKeeper: Send + Sync + 'static {
    type Error: std::fmt::Display + Send;

    /// Where the keys are, for the log line of a failed check (`JWT key rotation`, `JWT key
    /// Secret`).
    const WHAT: &'static str;

    /// One look: takes the due steps (or reads another writer's) and installs the keys;
    /// returns when the next step is due.
    fn check(&self) -> impl Future<Output = Result<Option<OffsetDateTime>, Self::Error>> + Send;

    /// Whether this process takes the schedule's steps now; a standby or a follower has
    /// nothing due of its own and only polls.
    fn takes_steps(&self) -> bool;

    /// Changes of leadership, for a keeper that steps only while leading.
    fn leadership(&self) -> Option<watch::Receiver<bool>>;

    fn clock(&self) -> &Clock;

    /// The longest wait between two looks.
    fn poll(&self) -> Duration;
}

/// Checks `keeper` until `stop` turns true (see the module docs).
pub async fn drive<K: KeyKeeper>(keeper: Arc<K>, mut stop: watch::Receiver<bool>) {
    let mut leading = keeper.leadership();
    loop {
        let wait = match keeper.check().await {
            Ok(next) if keeper.takes_steps() => {
                wait_for_next(next, (keeper.clock())(), keeper.poll())
            }
            Ok(_) => keeper.poll(),
            Err(e) => {
                warn!(error = %e, "{} check failed; keeping the current keys", K::WHAT);
                keeper.poll().min(RETRY_AFTER_ERROR)
            }
        };
        let leadership_change = async {
            match leading.as_mut() {
                Some(leading) => {
                    if leading.changed().await.is_err() {
                        // Whoever elected has gone: keep the poll.
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = leadership_change => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A keeper that records when it was looked at and answers from a script.
    struct Scripted {
        answers: Mutex<Vec<Result<Option<OffsetDateTime>, &'static str>>>,
        looks: tokio::sync::mpsc::UnboundedSender<tokio::time::Instant>,
        steps: bool,
        leading: Option<watch::Receiver<bool>>,
        clock: Clock,
    }

    impl KeyKeeper for Scripted {
        type Error = &'static str;
        const WHAT: &'static str = "test keys";

        fn check(
            &self,
        ) -> impl Future<Output = Result<Option<OffsetDateTime>, Self::Error>> + Send {
            let _ = self.looks.send(tokio::time::Instant::now());
            let answer = self.answers.lock().unwrap().pop().unwrap_or(Ok(None));
            std::future::ready(answer)
        }

        fn takes_steps(&self) -> bool {
            self.steps
        }

        fn leadership(&self) -> Option<watch::Receiver<bool>> {
            self.leading.clone()
        }

        fn clock(&self) -> &Clock {
            &self.clock
        }

        fn poll(&self) -> Duration {
            Duration::from_secs(60)
        }
    }

    fn keeper(
        answers: Vec<Result<Option<OffsetDateTime>, &'static str>>,
        steps: bool,
        leading: Option<watch::Receiver<bool>>,
    ) -> (
        Arc<Scripted>,
        tokio::sync::mpsc::UnboundedReceiver<tokio::time::Instant>,
    ) {
        let (looks, seen) = tokio::sync::mpsc::unbounded_channel();
        let now = OffsetDateTime::now_utc();
        let keeper = Scripted {
            answers: Mutex::new(answers),
            looks,
            steps,
            leading,
            clock: Arc::new(move || now),
        };
        (Arc::new(keeper), seen)
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_step_an_error_and_a_poll_set_the_next_look() {
        let now = OffsetDateTime::now_utc();
        // Popped from the end: a step due in 10 s, then an error, then nothing due.
        let (keeper, mut seen) = keeper(
            vec![
                Ok(None),
                Err("unreachable"),
                Ok(Some(now + time::Duration::seconds(10))),
            ],
            true,
            None,
        );
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(drive(Arc::clone(&keeper), stop));
        let first = seen.recv().await.unwrap();
        let second = seen.recv().await.unwrap();
        let third = seen.recv().await.unwrap();
        let fourth = seen.recv().await.unwrap();
        // 10 s to the step (+1 s of margin), 30 s after the error, then the 60 s poll. The
        // step's time is wall-clock: the wall time spent before the driver looks (a loaded
        // machine) comes off the wait.
        let to_step = second - first;
        assert!(
            to_step <= Duration::from_secs(11) && to_step > Duration::from_millis(10_500),
            "{to_step:?}"
        );
        assert_eq!(third - second, RETRY_AFTER_ERROR);
        assert_eq!(fourth - third, Duration::from_secs(60));
        stop_tx.send_replace(true);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_polls_and_looks_at_once_when_leadership_changes() {
        let now = OffsetDateTime::now_utc();
        let (leader_tx, leading) = watch::channel(false);
        let (keeper, mut seen) = keeper(
            vec![Ok(Some(now + time::Duration::seconds(5)))],
            false,
            Some(leading),
        );
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(drive(Arc::clone(&keeper), stop));
        let first = seen.recv().await.unwrap();
        // Nothing of its own is due for a standby, whatever the keys say: it polls.
        let second = seen.recv().await.unwrap();
        assert_eq!(second - first, Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(1)).await;
        leader_tx.send_replace(true);
        let third = seen.recv().await.unwrap();
        assert_eq!(
            third - second,
            Duration::from_secs(1),
            "looked at once on leading"
        );
        stop_tx.send_replace(true);
        task.await.unwrap();
    }
}
