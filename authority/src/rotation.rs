//! The rotation driver: runs the CA schedule ([`podca_signer::rotation`]) while podca serves, and
//! swaps the CA and trust anchors in the shared [`CaHandle`] whenever they change — after a step
//! it took itself, or after someone changed the CA data directory (`podca ca rotate`, a new
//! import), so no restart and no SIGHUP is needed.
//!
//! One [`Rotator::tick`] is synchronous and reads its time from the [`Clock`], so tests drive a
//! CA's whole life in simulated time; [`Rotator::run`] calls it when the schedule has something to
//! do, and at least every `poll` to notice outside changes.

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use podca_signer::rotation::{Phase, Schedule, Step};
use podca_signer::{FileStore, StoreError};
use prometheus_client::encoding::EncodeLabelSet;
use time::{Duration, OffsetDateTime};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::ca::OpenError;
use crate::intermediate::Intermediate;
use crate::metrics::Metrics;
use crate::trust::{CaHandle, Clock};

pub use crate::ca::{Opener, file_opener, load};

/// Why a rotation check failed; the current CA stays in place and the next check tries again.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error("running the rotation schedule: {0}")]
    Schedule(#[source] StoreError),
    #[error("reading the CA state: {0}")]
    State(#[source] std::io::Error),
    #[error(transparent)]
    Open(#[from] OpenError),
}

/// Labels of the per-generation CA gauges.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CaLabels {
    pub generation: String,
    pub state: String,
    /// The CA's name in the configuration (`default`: `[ca]`).
    pub ca: String,
}

/// Labels of the rotation-step counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub step: &'static str,
    pub ca: String,
}

/// What the driver needs.
#[derive(Clone)]
pub struct RotatorOptions {
    /// The CA's name in the configuration (`default`: `[ca]`): labels its metrics.
    pub name: String,
    pub store: FileStore,
    pub schedule: Schedule,
    /// Take scheduled steps (prepare, activate, retire, drop); false: only follow changes made
    /// by others (e.g. a read-only CA directory, or a standby replica).
    pub automatic: bool,
    /// Bounds the life of a retired CA's leaves (the largest policy maximum lifetime).
    pub max_leaf_lifetime: Duration,
    /// Longest sleep between checks for outside changes.
    pub poll: StdDuration,
    pub open: Opener,
    /// Intermediate mode: reopen the active CA (which issues a new in-memory intermediate)
    /// when [`Intermediate::needs_renewal`] says so, even if the store did not change.
    pub refresh_when: Option<Intermediate>,
}

impl std::fmt::Debug for RotatorOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatorOptions")
            .field("name", &self.name)
            .field("name", &self.name)
            .field("dir", &self.store.dir())
            .field("schedule", &self.schedule)
            .field("automatic", &self.automatic)
            .field("max_leaf_lifetime", &self.max_leaf_lifetime)
            .field("poll", &self.poll)
            .field("refresh_when", &self.refresh_when)
            .finish_non_exhaustive()
    }
}

/// The result of one [`Rotator::tick`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tick {
    /// Steps taken by this tick.
    pub steps: Vec<Step>,
    /// Whether a new CA or anchor set was swapped into the handle.
    pub swapped: bool,
    /// When the schedule next has something to do.
    pub next: Option<OffsetDateTime>,
}

/// Runs the schedule and keeps the [`CaHandle`] on the store's active CA and published anchors.
pub struct Rotator {
    options: RotatorOptions,
    ca: CaHandle,
    clock: Clock,
    metrics: Arc<Metrics>,
    /// What the handle was last loaded from: state.json and root.pem as read then.
    seen: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    /// Wakes [`Rotator::run`] for an immediate check (e.g. on SIGHUP).
    wake: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for Rotator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rotator")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Rotator {
    /// `ca` must already hold the store's active CA (see [`load`]).
    pub fn new(options: RotatorOptions, ca: CaHandle, clock: Clock, metrics: Arc<Metrics>) -> Self {
        let seen = fingerprint(&options.store).ok();
        let rotator = Rotator {
            options,
            ca,
            clock,
            metrics,
            seen: Mutex::new(seen),
            wake: Arc::new(tokio::sync::Notify::new()),
        };
        rotator.set_generation_gauges();
        rotator.set_next_rotation((rotator.clock)());
        rotator
    }

    pub fn handle(&self) -> &CaHandle {
        &self.ca
    }

    /// Notifying this makes [`Rotator::run`] check at once instead of at its next wake-up.
    pub fn waker(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.wake)
    }

    /// Takes the steps that are due (when automatic), then reloads the handle if the store
    /// changed. An error leaves the current CA in place; the next tick tries again.
    #[tracing::instrument(name = "rotation_tick", skip_all, fields(dir = %self.options.store.dir().display()))]
    pub fn tick(&self) -> Result<Tick, RotationError> {
        let now = (self.clock)();
        let store = &self.options.store;
        let mut out = Tick::default();
        // A failed schedule run still reloads below: outside changes and a due intermediate
        // must not wait for the schedule to be fixed.
        let mut failed = None;
        if self.options.automatic {
            match store.rotate(
                &self.options.schedule,
                self.options.max_leaf_lifetime,
                false,
                now,
            ) {
                Ok(steps) => out.steps = steps,
                Err(e) => failed = Some(RotationError::Schedule(e)),
            }
            for step in &out.steps {
                let (name, generation) = (step.as_str(), step.generation());
                self.metrics.count_rotation_step(&self.options.name, name);
                info!(step = name, generation, ca = %self.options.name, dir = %store.dir().display(), "CA rotation step");
            }
        }
        let current = fingerprint(store).map_err(RotationError::State)?;
        let changed = self.seen.lock().map(|s| s.as_ref() != Some(&current));
        let due = self
            .options
            .refresh_when
            .as_ref()
            .is_some_and(|i| i.needs_renewal(&self.ca.current().ca, now));
        if changed.unwrap_or(true) || due {
            self.install(current)?;
            out.swapped = true;
        }
        out.next = self.set_next_rotation(now);
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// [`Self::reload_now`], described in one line for a person: whether it worked, and what
    /// was reloaded or why it failed (the current CA then stays).
    pub fn reload_described(&self) -> (bool, String) {
        let dir = self.dir().display();
        match self.reload_now() {
            // The generation `podca ca show` lists, not the count of reloads.
            Ok(_) => (
                true,
                match self.ca.current().ca_generation {
                    Some(generation) => {
                        format!("reloaded the CA from {dir} (generation {generation} signs)")
                    }
                    None => format!("reloaded the CA from {dir}"),
                },
            ),
            Err(e) => (
                false,
                format!(
                    "reloading the CA in {dir} failed, keeping the current one: {}",
                    podca_signer::report::error_chain(&e)
                ),
            ),
        }
    }

    /// The CA data directory this driver follows.
    pub fn dir(&self) -> &std::path::Path {
        self.options.store.dir()
    }

    /// Loads the store's active CA and anchors into the handle now, changed or not (SIGHUP in
    /// `podca dev`). Returns the handle's new generation.
    pub fn reload_now(&self) -> Result<u64, RotationError> {
        let current = fingerprint(&self.options.store).map_err(RotationError::State)?;
        let generation = self.install(current)?;
        self.set_next_rotation((self.clock)());
        Ok(generation)
    }

    /// Opens the store's active CA, swaps it and the anchors into the handle, and remembers
    /// `current` (what state.json and root.pem held) as loaded.
    fn install(&self, current: (Vec<u8>, Vec<u8>)) -> Result<u64, RotationError> {
        let (ca, anchors) = load(&self.options.store, &self.options.open)?;
        let subject = ca.certificate().subject().to_string();
        let generation = self.ca.replace(ca, anchors);
        info!(
            issuing = %subject,
            anchors = self.ca.current().anchors.len(),
            generation,
            "CA reloaded"
        );
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(current);
        }
        self.set_generation_gauges();
        Ok(generation)
    }

    /// Ticks until `shutdown` turns true: when the schedule is due, and at least every `poll`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            let ticked = self.tick();
            self.metrics.rotation_checks.inc();
            let wait = match ticked {
                Ok(t) => wait_for_next(t.next, (self.clock)(), self.options.poll),
                Err(e) => {
                    self.metrics.rotation_errors.inc();
                    warn!(error = %e, "CA rotation check failed; keeping the current CA");
                    self.options.poll.min(StdDuration::from_secs(30))
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified() => {}
                r = shutdown.wait_for(|s| *s) => { let _ = r; return; }
            }
        }
    }

    /// One `podca_ca_generation_not_after_timestamp_seconds` per generation still in use. They
    /// change only with the store, so they are set when it is (re)loaded.
    fn set_generation_gauges(&self) {
        let Ok(generations) = self.options.store.generations() else {
            return;
        };
        let series = generations
            .iter()
            .filter(|info| info.generation.phase != Phase::Dropped)
            .map(|info| {
                (
                    info.generation.id.to_string(),
                    info.generation.phase.to_string(),
                    info.issuing.not_after().unix_timestamp(),
                )
            })
            .collect();
        self.metrics.set_ca_generations(&self.options.name, series);
    }

    /// When the schedule next has something to do, also as `podca_ca_next_rotation_…`.
    fn set_next_rotation(&self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        let next = self
            .options
            .store
            .next_rotation_event(&self.options.schedule, now)
            .ok()
            .flatten();
        self.metrics.set_ca_next_rotation(&self.options.name, next);
        next
    }
}

/// How long a rotation driver sleeps before its next check: until a second past the next due
/// step (so the planner sees it as due), and never longer than `poll`.
pub fn wait_for_next(
    next: Option<OffsetDateTime>,
    now: OffsetDateTime,
    poll: StdDuration,
) -> StdDuration {
    match next {
        Some(next) => {
            let until = (next - now).max(Duration::ZERO);
            StdDuration::try_from(until + Duration::SECOND)
                .unwrap_or(poll)
                .min(poll)
        }
        None => poll,
    }
}

fn fingerprint(store: &FileStore) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    Ok((
        std::fs::read(store.state_path())?,
        std::fs::read(store.root_cert_path())?,
    ))
}
