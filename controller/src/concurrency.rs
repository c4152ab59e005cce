//! How many PodCertificateRequest decisions podca has in flight: a limit that follows what the
//! API server answers, additive increase and multiplicative decrease (AIMD) as in TCP.
//!
//! Why: a decision spends most of its time waiting on its `/status` write, which a real
//! kube-apiserver answers in ~6 ms alone and in ~50 ms once 32 clients share it. By Little's
//! law a controller settles at most `in flight / write latency` PCRs a second, so a fixed 8
//! workers left the real server idle (0.40–0.46 of its raw PATCH rate), while a fixed large
//! number would keep pushing when the server's priority and fairness answers 429. The limit `L`
//! therefore grows while writes succeed with every permit in use, and shrinks when the server
//! pushes back:
//!
//! | event | effect on `L` |
//! | --- | --- |
//! | a write succeeds, `L` in use, `L < ssthresh` (slow start) | `L += 1` (doubles each round) |
//! | a write succeeds, `L` in use, `L ≥ ssthresh` | `L += 1/L` (one more each round) |
//! | a write succeeds with permits to spare | nothing: more would not have helped |
//! | a write answered 429 or 5xx, timed out, failed to connect, or took over [`SLOW_WRITE`] | `L = max(β·L, 1)`, `ssthresh = max(L, initial)`, `β =` [`DECREASE`] |
//! | a 429 with `Retry-After: s` | the decrease, and no increase for `s` |
//!
//! A round is one write's time: a decrease happens at most once per round, for the first
//! congestion signal of a write that began after the previous decrease (writes already in
//! flight then were sent under the old limit and say nothing new). `L` never exceeds `max`
//! (`[controller] max_in_flight`) and starts at `initial` (`[controller] workers`); `ssthresh`
//! starts at `max`, so a burst reaches `max` within a few rounds unless the server objects,
//! and after a collapse (an outage halving `L` down to 1) slow start brings it back to `initial`
//! in a few rounds. Other answers (404, 409, 422, 403) say nothing about load and change
//! nothing.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The multiplicative decrease: the limit after a congestion signal is this share of before.
pub const DECREASE: f64 = 0.5;

/// A status write that takes longer than this is a congestion signal even when it succeeds:
/// the server is queueing a second of work for podca, and more in flight only lengthens the
/// queue (and the wait of the pods whose certificates are in it).
pub const SLOW_WRITE: Duration = Duration::from_secs(1);

/// What became of one status write, as far as load is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Answered 2xx.
    Done,
    /// Answered 429 (API priority and fairness, or max-in-flight), with its `Retry-After`.
    Throttled { retry_after: Duration },
    /// Answered 5xx, timed out, or the connection failed.
    Overloaded,
    /// Any other answer (404, 409, 422, 403): nothing about load.
    Neutral,
}

/// Why the limit was lowered (`podca_controller_concurrency_decreases_total{cause}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DecreaseCause {
    Throttled,
    Overloaded,
    Slow,
}

impl DecreaseCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Throttled => "throttled",
            Self::Overloaded => "overloaded",
            Self::Slow => "slow",
        }
    }
}

/// One finished status write.
#[derive(Debug, Clone, Copy)]
pub struct Observation {
    pub started: Instant,
    pub ended: Instant,
    /// Whether every permit was in use when it began.
    pub saturated: bool,
    pub outcome: WriteOutcome,
}

/// The pure AIMD state (see the module docs for the rules).
#[derive(Debug, Clone)]
pub struct Aimd {
    limit: f64,
    ssthresh: f64,
    initial: f64,
    max: f64,
    /// When the last decrease happened: writes begun before it cannot decrease again.
    decreased_at: Option<Instant>,
    /// No increase before this instant (a 429's `Retry-After`).
    hold_until: Option<Instant>,
}

impl Aimd {
    /// A limit starting at `initial`, never above `max` (both at least 1; an `initial` above
    /// `max` starts at `max`).
    pub fn new(initial: usize, max: usize) -> Self {
        let max = max.max(1) as f64;
        let initial = (initial.max(1) as f64).min(max);
        Aimd {
            limit: initial,
            ssthresh: max,
            initial,
            max,
            decreased_at: None,
            hold_until: None,
        }
    }

    /// Decisions that may be in flight now: at least 1, at most `max`.
    pub fn limit(&self) -> usize {
        self.limit.floor() as usize
    }

    /// Applies one finished write; returns the cause when it lowered the limit.
    pub fn observe(&mut self, o: Observation) -> Option<DecreaseCause> {
        let cause = match o.outcome {
            WriteOutcome::Throttled { retry_after } => {
                let until = o.ended + retry_after;
                self.hold_until = Some(self.hold_until.map_or(until, |h| h.max(until)));
                Some(DecreaseCause::Throttled)
            }
            WriteOutcome::Overloaded => Some(DecreaseCause::Overloaded),
            WriteOutcome::Done if o.ended.duration_since(o.started) > SLOW_WRITE => {
                Some(DecreaseCause::Slow)
            }
            WriteOutcome::Done => None,
            WriteOutcome::Neutral => return None,
        };
        match cause {
            Some(cause) => {
                if self.decreased_at.is_some_and(|at| o.started < at) {
                    // Sent under the limit already lowered for this round.
                    return None;
                }
                self.limit = (self.limit * DECREASE).max(1.0);
                self.ssthresh = self.limit.max(self.initial);
                self.decreased_at = Some(o.ended);
                Some(cause)
            }
            None => {
                let held = self.hold_until.is_some_and(|h| o.ended < h);
                if o.saturated && !held {
                    let step = if self.limit < self.ssthresh {
                        1.0
                    } else {
                        1.0 / self.limit
                    };
                    self.limit = (self.limit + step).min(self.max);
                }
                None
            }
        }
    }
}

/// The controller's concurrency metrics (prefix `podca_controller_`).
#[derive(Debug, Clone, Default)]
pub struct ConcurrencyMetrics {
    /// `podca_controller_concurrency_limit`: decisions that may be in flight now.
    pub limit: Gauge,
    /// `podca_controller_status_writes_in_flight`: `/status` writes sent and not yet answered.
    pub writes_in_flight: Gauge,
    /// `podca_controller_concurrency_decreases_total{cause}`.
    pub decreases: Family<CauseLabels, Counter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

impl ConcurrencyMetrics {
    /// Registers the metrics in the controller's sub-registry.
    pub fn register(registry: &mut Registry) -> Self {
        let m = ConcurrencyMetrics::default();
        registry.register(
            "concurrency_limit",
            "PodCertificateRequest decisions that may be in flight now (AIMD on status writes)",
            m.limit.clone(),
        );
        registry.register(
            "status_writes_in_flight",
            "PodCertificateRequest /status writes sent and not yet answered",
            m.writes_in_flight.clone(),
        );
        registry.register(
            "concurrency_decreases",
            "Times the concurrency limit was lowered, by cause (throttled, overloaded, slow)",
            m.decreases.clone(),
        );
        m
    }
}

/// The limit at work: the dispatcher waits for [`Gate::room`] and takes a [`Permit`] per
/// decision; the decision reports its status write through the permit.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
    room: Notify,
    metrics: ConcurrencyMetrics,
}

#[derive(Debug)]
struct State {
    aimd: Aimd,
    in_flight: usize,
    writes: usize,
}

impl Gate {
    pub fn new(aimd: Aimd, metrics: ConcurrencyMetrics) -> Arc<Gate> {
        metrics.limit.set(aimd.limit() as i64);
        metrics.writes_in_flight.set(0);
        Arc::new(Gate {
            state: Mutex::new(State {
                aimd,
                in_flight: 0,
                writes: 0,
            }),
            room: Notify::new(),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code path panics while holding the lock; recover the data if one ever does.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once fewer decisions than the limit are in flight.
    pub async fn room(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.lock();
                if s.in_flight < s.aimd.limit() {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Counts one more decision in flight (after [`Gate::room`]; one caller takes permits, so
    /// none can be taken in between).
    pub fn start(self: &Arc<Self>) -> Permit {
        self.lock().in_flight += 1;
        Permit {
            gate: Arc::clone(self),
        }
    }

    /// The limit now.
    pub fn limit(&self) -> usize {
        self.lock().aimd.limit()
    }

    /// Decisions in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight
    }
}

/// One decision in flight; dropping it frees its place.
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
}

/// A status write begun under a [`Permit`].
#[derive(Debug, Clone, Copy)]
pub struct WriteStarted {
    started: Instant,
    saturated: bool,
}

impl Permit {
    /// Marks the start of the decision's status write.
    pub fn begin_write(&self) -> WriteStarted {
        let mut s = self.gate.lock();
        s.writes += 1;
        self.gate.metrics.writes_in_flight.set(s.writes as i64);
        WriteStarted {
            started: Instant::now(),
            saturated: s.in_flight >= s.aimd.limit(),
        }
    }

    /// Reports how the write begun at `write` ended.
    pub fn end_write(&self, write: WriteStarted, outcome: WriteOutcome) {
        let mut s = self.gate.lock();
        s.writes = s.writes.saturating_sub(1);
        let before = s.aimd.limit();
        let decreased = s.aimd.observe(Observation {
            started: write.started,
            ended: Instant::now(),
            saturated: write.saturated,
            outcome,
        });
        let after = s.aimd.limit();
        let metrics = &self.gate.metrics;
        metrics.writes_in_flight.set(s.writes as i64);
        metrics.limit.set(after as i64);
        drop(s);
        if let Some(cause) = decreased {
            metrics
                .decreases
                .get_or_create(&CauseLabels {
                    cause: cause.as_str(),
                })
                .inc();
        }
        if after > before {
            self.gate.room.notify_one();
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        drop(s);
        self.gate.room.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn write(at: Instant, took: Duration, saturated: bool, outcome: WriteOutcome) -> Observation {
        Observation {
            started: at,
            ended: at + took,
            saturated,
            outcome,
        }
    }

    /// `n` saturated successful writes of 10 ms, one after the other from `at`.
    fn successes(aimd: &mut Aimd, at: &mut Instant, n: usize) {
        for _ in 0..n {
            assert_eq!(
                aimd.observe(write(*at, 10 * MS, true, WriteOutcome::Done)),
                None
            );
            *at += 10 * MS;
        }
    }

    #[test]
    fn starts_at_initial_and_never_leaves_one_to_max() {
        assert_eq!(Aimd::new(8, 64).limit(), 8);
        assert_eq!(Aimd::new(0, 64).limit(), 1, "at least one");
        assert_eq!(Aimd::new(100, 64).limit(), 64, "initial above max is max");
        assert_eq!(Aimd::new(8, 0).limit(), 1);
        let mut aimd = Aimd::new(8, 64);
        let mut at = Instant::now();
        successes(&mut aimd, &mut at, 10_000);
        assert_eq!(aimd.limit(), 64, "grows to max and stops there");
        for i in 0..20 {
            at += 100 * MS;
            aimd.observe(write(at, MS, true, WriteOutcome::Overloaded));
            assert!(aimd.limit() >= 1, "round {i}");
        }
        assert_eq!(aimd.limit(), 1, "halved down to one, not below");
    }

    #[test]
    fn slow_start_doubles_each_round_until_the_first_decrease() {
        let mut aimd = Aimd::new(8, 64);
        let mut at = Instant::now();
        // A round is `limit` writes: 8 writes → 16, 16 more → 32.
        successes(&mut aimd, &mut at, 8);
        assert_eq!(aimd.limit(), 16);
        successes(&mut aimd, &mut at, 16);
        assert_eq!(aimd.limit(), 32);
    }

    #[test]
    fn after_a_decrease_it_grows_by_one_per_round() {
        let mut aimd = Aimd::new(8, 64);
        let mut at = Instant::now();
        successes(&mut aimd, &mut at, 24);
        assert_eq!(aimd.limit(), 32, "slow start: 8 → 16 → 32");
        let throttled = WriteOutcome::Throttled {
            retry_after: Duration::ZERO,
        };
        assert_eq!(
            aimd.observe(write(at, MS, true, throttled)),
            Some(DecreaseCause::Throttled)
        );
        assert_eq!(aimd.limit(), 16, "32 · 1/2, above `initial`: no slow start");
        at += MS;
        // Congestion avoidance: 16 writes of a round add one.
        successes(&mut aimd, &mut at, 15);
        assert_eq!(aimd.limit(), 16);
        successes(&mut aimd, &mut at, 2);
        assert_eq!(aimd.limit(), 17);
    }

    #[test]
    fn one_decrease_per_round() {
        let mut aimd = Aimd::new(40, 64);
        let t0 = Instant::now();
        // 40 writes sent together, all answered 503 at t0 + 50 ms: one decrease.
        let mut decreases = 0;
        for _ in 0..40 {
            if aimd
                .observe(write(t0, 50 * MS, true, WriteOutcome::Overloaded))
                .is_some()
            {
                decreases += 1;
            }
        }
        assert_eq!((decreases, aimd.limit()), (1, 20));
        // A write sent after that decrease and refused decreases again.
        assert_eq!(
            aimd.observe(write(t0 + 60 * MS, 5 * MS, true, WriteOutcome::Overloaded)),
            Some(DecreaseCause::Overloaded)
        );
        assert_eq!(aimd.limit(), 10);
    }

    #[test]
    fn a_slow_success_is_congestion_and_a_neutral_answer_is_nothing() {
        let mut aimd = Aimd::new(16, 64);
        let at = Instant::now();
        assert_eq!(
            aimd.observe(write(at, SLOW_WRITE, true, WriteOutcome::Done)),
            None,
            "exactly the bound is not slow"
        );
        assert_eq!(aimd.limit(), 17);
        assert_eq!(
            aimd.observe(write(at, SLOW_WRITE + MS, true, WriteOutcome::Done)),
            Some(DecreaseCause::Slow)
        );
        assert_eq!(aimd.limit(), 8);
        let before = aimd.clone();
        aimd.observe(write(at + SLOW_WRITE * 2, MS, true, WriteOutcome::Neutral));
        assert_eq!((aimd.limit, aimd.ssthresh), (before.limit, before.ssthresh));
    }

    #[test]
    fn no_growth_with_permits_to_spare_or_during_retry_after() {
        let mut aimd = Aimd::new(8, 64);
        let at = Instant::now();
        for _ in 0..100 {
            aimd.observe(write(at, MS, false, WriteOutcome::Done));
        }
        assert_eq!(aimd.limit(), 8, "not saturated: no growth");
        aimd.observe(write(
            at,
            MS,
            true,
            WriteOutcome::Throttled {
                retry_after: Duration::from_secs(2),
            },
        ));
        assert_eq!(aimd.limit(), 4);
        // Within the 2 s after the 429 was answered: held.
        for i in 0..50 {
            aimd.observe(write(at + 10 * MS * i, MS, true, WriteOutcome::Done));
        }
        assert_eq!(aimd.limit(), 4, "held during Retry-After");
        // After it: slow start back up to `initial` (8), then one per round.
        let mut later = at + Duration::from_secs(3);
        successes(&mut aimd, &mut later, 4);
        assert_eq!(aimd.limit(), 8);
        // 1/8 + 1/8.125 + … passes 1 at the ninth write.
        successes(&mut aimd, &mut later, 8);
        assert_eq!(aimd.limit(), 8);
        successes(&mut aimd, &mut later, 1);
        assert_eq!(aimd.limit(), 9);
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_never_admits_more_than_the_limit_and_reports_it() {
        let metrics = ConcurrencyMetrics::default();
        let gate = Gate::new(Aimd::new(2, 4), metrics.clone());
        gate.room().await;
        let a = gate.start();
        gate.room().await;
        let b = gate.start();
        assert_eq!(gate.in_flight(), 2);
        let g = Arc::clone(&gate);
        let waiter = tokio::spawn(async move { g.room().await });
        tokio::time::sleep(10 * MS).await;
        assert!(!waiter.is_finished(), "a third must wait at limit 2");
        // A saturated success raises the limit to 3 (slow start): room for one more.
        let w = a.begin_write();
        assert_eq!(metrics.writes_in_flight.get(), 1);
        a.end_write(w, WriteOutcome::Done);
        assert_eq!((gate.limit(), metrics.limit.get()), (3, 3));
        assert_eq!(metrics.writes_in_flight.get(), 0);
        waiter.await.expect("room at limit 3");
        let c = gate.start();
        // A 429 halves it (3 · 1/2 → 1): nobody else gets in until two leave.
        let w = b.begin_write();
        b.end_write(
            w,
            WriteOutcome::Throttled {
                retry_after: Duration::from_secs(1),
            },
        );
        assert_eq!((gate.limit(), metrics.limit.get()), (1, 1));
        let throttled = metrics
            .decreases
            .get_or_create(&CauseLabels { cause: "throttled" })
            .get();
        assert_eq!(throttled, 1);
        drop(a);
        let g = Arc::clone(&gate);
        let waiter = tokio::spawn(async move { g.room().await });
        tokio::time::sleep(10 * MS).await;
        assert!(!waiter.is_finished(), "2 in flight at limit 1");
        drop(b);
        tokio::time::sleep(10 * MS).await;
        assert!(!waiter.is_finished(), "1 in flight at limit 1");
        drop(c);
        waiter.await.expect("room once none is in flight");
        assert_eq!(gate.in_flight(), 0);
    }
}
