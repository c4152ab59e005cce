//! CA rotation, as pure functions: given the CA generations and the clock, what must happen
//! next, and which trust anchors must be published now.
//!
//! Every generation is a CA of its own (its own root, like SPIRE's self-signed CAs): rotating it
//! changes the trust anchors, so it is done with overlap:
//!
//! 1. **Prepared** at `prepare_at` of the active CA's life (default ½). Its anchor is published
//!    from then on; it signs nothing yet.
//! 2. **Active** once the active CA reaches `activate_at` of its life (default ⅚) *and* the
//!    prepared anchor has been published for at least `propagation` (default 15 min: kubelet
//!    caches trust bundles about 5 minutes, plus pod sync). The previous CA is retired.
//! 3. **Retired** CAs sign nothing; their anchor stays published until the last certificate they
//!    signed has expired (leaves never outlive their CA, so at the latest the CA's notAfter).
//! 4. **Dropped** afterwards: the anchor leaves the bundle.
//!
//! So at every instant the published anchors cover every certificate that may still be valid, and
//! no certificate is signed by a CA whose anchor was not published a propagation window earlier.

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

/// Where a CA generation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Prepared,
    Active,
    Retired,
    Dropped,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Prepared => "prepared",
            Phase::Active => "active",
            Phase::Retired => "retired",
            Phase::Dropped => "dropped",
        })
    }
}

/// What the rotation logic knows about one CA generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    pub id: u32,
    pub phase: Phase,
    #[serde(with = "time::serde::rfc3339")]
    pub ca_not_before: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub ca_not_after: OffsetDateTime,
    /// When its anchor was first published.
    #[serde(with = "time::serde::rfc3339")]
    pub prepared_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub activated_at: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub retired_at: Option<OffsetDateTime>,
    /// Prepared on demand (`podca ca rotate`): take over as soon as the propagation window is
    /// over instead of at the scheduled point.
    #[serde(default)]
    pub activate_asap: bool,
    /// The latest notAfter of any certificate this CA signed (None: it signed nothing yet).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub last_leaf_not_after: Option<OffsetDateTime>,
}

impl Generation {
    /// When the anchor may leave the bundle: after its last leaf expired, or (not knowing) at the
    /// CA's own notAfter. A CA retired without signing anything may go at once.
    pub fn anchor_needed_until(&self) -> OffsetDateTime {
        match (self.activated_at, self.last_leaf_not_after) {
            (_, Some(t)) => t.min(self.ca_not_after),
            (None, None) => self.retired_at.unwrap_or(self.prepared_at),
            // It may have signed: keep it as long as any of its leaves could be valid.
            (Some(_), None) => self.ca_not_after,
        }
    }

    /// Makes this generation the signing CA.
    pub fn activate(&mut self, now: OffsetDateTime) {
        self.phase = Phase::Active;
        self.activated_at = Some(now);
    }

    /// Stops signing with this generation, and records how long its anchor is needed: a CA that
    /// was active may have signed until now, so its last leaf can live until now + the longest
    /// leaf lifetime (never past the CA's notAfter, nor earlier than a leaf already known). A CA
    /// that was never active signed nothing: its anchor may go at once (see
    /// [`Generation::anchor_needed_until`]).
    pub fn retire(&mut self, max_leaf_lifetime: Duration, now: OffsetDateTime) {
        self.phase = Phase::Retired;
        self.retired_at = Some(now);
        if self.activated_at.is_some() {
            let bound = (now + max_leaf_lifetime).min(self.ca_not_after);
            self.last_leaf_not_after =
                Some(self.last_leaf_not_after.map_or(bound, |t| t.max(bound)));
        }
    }

    fn life_point(&self, fraction: f64) -> OffsetDateTime {
        let life = (self.ca_not_after - self.ca_not_before).as_seconds_f64();
        self.ca_not_before + Duration::seconds_f64(life * fraction)
    }
}

/// The rotation schedule, from the config file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Lifetime of each new CA, in seconds.
    #[serde(default = "default_ca_lifetime")]
    pub ca_lifetime_seconds: i64,
    /// Fraction of the active CA's life at which the next CA is prepared.
    #[serde(default = "default_prepare_at")]
    pub prepare_at: f64,
    /// Fraction of the active CA's life at which the prepared CA takes over.
    #[serde(default = "default_activate_at")]
    pub activate_at: f64,
    /// Minimum time a prepared anchor is published before its CA signs anything, in seconds.
    #[serde(default = "default_propagation")]
    pub propagation_seconds: i64,
}

fn default_ca_lifetime() -> i64 {
    365 * 86_400
}
fn default_prepare_at() -> f64 {
    0.5
}
fn default_activate_at() -> f64 {
    5.0 / 6.0
}
fn default_propagation() -> i64 {
    15 * 60
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            ca_lifetime_seconds: default_ca_lifetime(),
            prepare_at: default_prepare_at(),
            activate_at: default_activate_at(),
            propagation_seconds: default_propagation(),
        }
    }
}

/// A schedule that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    #[error(
        "invalid rotation schedule: need 0 < prepare_at ({prepare_at}) < activate_at \
         ({activate_at}) < 1"
    )]
    PhaseFractions { prepare_at: f64, activate_at: f64 },
    #[error(
        "invalid rotation schedule: propagation_seconds {0} is below 600: kubelet caches trust \
         bundles for about 5 minutes, so a shorter window risks pods that do not yet trust the \
         new CA"
    )]
    PropagationTooShort(i64),
    #[error(
        "invalid rotation schedule: the CA lifetime ({ca_lifetime_seconds} s) leaves {window:.0} \
         s between prepare and activate, less than the propagation window \
         ({propagation_seconds} s)"
    )]
    WindowShorterThanPropagation {
        ca_lifetime_seconds: i64,
        /// Seconds between prepare and activate.
        window: f64,
        propagation_seconds: i64,
    },
}

impl Schedule {
    pub fn propagation(&self) -> Duration {
        Duration::seconds(self.propagation_seconds)
    }

    pub fn ca_lifetime(&self) -> Duration {
        Duration::seconds(self.ca_lifetime_seconds)
    }

    pub fn validate(&self) -> Result<(), ScheduleError> {
        if !(0.0 < self.prepare_at && self.prepare_at < self.activate_at && self.activate_at < 1.0)
        {
            return Err(ScheduleError::PhaseFractions {
                prepare_at: self.prepare_at,
                activate_at: self.activate_at,
            });
        }
        if self.propagation_seconds < 600 {
            return Err(ScheduleError::PropagationTooShort(self.propagation_seconds));
        }
        let window = self.ca_lifetime_seconds as f64 * (self.activate_at - self.prepare_at);
        if window < self.propagation_seconds as f64 {
            return Err(ScheduleError::WindowShorterThanPropagation {
                ca_lifetime_seconds: self.ca_lifetime_seconds,
                window,
                propagation_seconds: self.propagation_seconds,
            });
        }
        Ok(())
    }
}

/// One thing to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Create a new CA generation and publish its anchor.
    Prepare,
    /// Make this prepared generation the signing CA (and retire the current one).
    Activate(u32),
    /// Stop signing with this generation.
    Retire(u32),
    /// Remove this generation's anchor from the bundle.
    Drop(u32),
}

impl Step {
    /// The step's name: the `step` label of `podca_ca_rotation_steps_total`, the data
    /// directory's crash points, the logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Prepare => "prepare",
            Step::Activate(_) => "activate",
            Step::Retire(_) => "retire",
            Step::Drop(_) => "drop",
        }
    }

    /// The generation the step acts on; `None` for a generation not made yet.
    pub fn generation(self) -> Option<u32> {
        match self {
            Step::Prepare => None,
            Step::Activate(id) | Step::Retire(id) | Step::Drop(id) => Some(id),
        }
    }
}

/// What to do now. Applying the steps and calling again reaches a fixed point (an empty list).
pub fn plan(generations: &[Generation], schedule: &Schedule, now: OffsetDateTime) -> Vec<Step> {
    let mut steps = vec![];
    let active = generations.iter().find(|g| g.phase == Phase::Active);
    let prepared = generations
        .iter()
        .filter(|g| g.phase == Phase::Prepared)
        .max_by_key(|g| g.id);
    let ready = |p: &Generation| now >= p.prepared_at + schedule.propagation();
    match (active, prepared) {
        // Bootstrap: nothing signs yet and nobody trusts anything yet.
        (None, None) => steps.push(Step::Prepare),
        (None, Some(p)) => steps.push(Step::Activate(p.id)),
        (Some(a), None) => {
            if now >= a.life_point(schedule.prepare_at) || now >= a.ca_not_after {
                steps.push(Step::Prepare);
            }
        }
        (Some(a), Some(p)) => {
            let due = now >= a.life_point(schedule.activate_at);
            // Never let the active CA run out while the prepared one waits: past its notAfter it
            // cannot sign at all, so an expired active CA is replaced as soon as the window allows.
            if ready(p) && (due || p.activate_asap || now >= a.ca_not_after) {
                steps.push(Step::Activate(p.id));
                steps.push(Step::Retire(a.id));
            }
        }
    }
    for g in generations.iter().filter(|g| g.phase == Phase::Retired) {
        if now >= g.anchor_needed_until() {
            steps.push(Step::Drop(g.id));
        }
    }
    steps
}

/// The generations whose anchors must be in the trust bundle now.
pub fn published(generations: &[Generation], now: OffsetDateTime) -> Vec<u32> {
    generations
        .iter()
        .filter(|g| match g.phase {
            Phase::Prepared | Phase::Active => true,
            Phase::Retired => now < g.anchor_needed_until(),
            Phase::Dropped => false,
        })
        .map(|g| g.id)
        .collect()
}

/// When `plan` will next have something to do (for sleeping until then), if ever.
pub fn next_event(
    generations: &[Generation],
    schedule: &Schedule,
    now: OffsetDateTime,
) -> Option<OffsetDateTime> {
    let mut times = vec![];
    let active = generations.iter().find(|g| g.phase == Phase::Active);
    let prepared = generations
        .iter()
        .filter(|g| g.phase == Phase::Prepared)
        .max_by_key(|g| g.id);
    if let Some(a) = active {
        match prepared {
            None => times.push(a.life_point(schedule.prepare_at)),
            Some(p) => {
                let due = if p.activate_asap {
                    p.prepared_at
                } else {
                    a.life_point(schedule.activate_at).min(a.ca_not_after)
                };
                times.push(due.max(p.prepared_at + schedule.propagation()));
            }
        }
    }
    for g in generations.iter().filter(|g| g.phase == Phase::Retired) {
        times.push(g.anchor_needed_until());
    }
    times.into_iter().map(|t| t.max(now)).min()
}

/// What [`advance`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advanced {
    /// The generations afterwards, in the order given.
    pub generations: Vec<Generation>,
    /// The steps taken, in order: activations, retirements and drops (never `Prepare`).
    pub steps: Vec<Step>,
    /// The schedule wants a new generation. Only the caller can make one (keys, certificates):
    /// if it does, it pushes it as `Prepared` and calls [`advance`] again.
    pub prepare_due: bool,
}

/// Runs the schedule to its fixed point: plans, applies the steps (retirement with
/// [`Generation::retire`]), and plans again until nothing but a `Prepare` is due. The one place
/// both drivers (the file store and the Secret backend) take rotation steps.
pub fn advance(
    generations: &[Generation],
    schedule: &Schedule,
    max_leaf_lifetime: Duration,
    now: OffsetDateTime,
) -> Advanced {
    let mut generations = generations.to_vec();
    let mut steps = vec![];
    let mut prepare_due = false;
    // Every step moves one generation forward (prepared → active → retired → dropped), so three
    // rounds per generation reach the fixed point; the bound only guards against a planner bug.
    for _ in 0..=3 * generations.len() {
        let mut due = plan(&generations, schedule, now);
        prepare_due = due.contains(&Step::Prepare);
        due.retain(|s| *s != Step::Prepare);
        if due.is_empty() {
            break;
        }
        for step in due {
            apply(&mut generations, step, max_leaf_lifetime, now);
            steps.push(step);
        }
    }
    Advanced {
        generations,
        steps,
        prepare_due,
    }
}

fn apply(
    generations: &mut [Generation],
    step: Step,
    max_leaf_lifetime: Duration,
    now: OffsetDateTime,
) {
    let id = match step {
        Step::Activate(id) | Step::Retire(id) | Step::Drop(id) => id,
        Step::Prepare => return,
    };
    for g in generations.iter_mut().filter(|g| g.id == id) {
        match step {
            Step::Activate(_) => g.activate(now),
            Step::Retire(_) => g.retire(max_leaf_lifetime, now),
            Step::Drop(_) => g.phase = Phase::Dropped,
            Step::Prepare => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const T0: OffsetDateTime = datetime!(2026-01-01 0:00 UTC);

    fn schedule() -> Schedule {
        Schedule {
            ca_lifetime_seconds: 600 * 60, // 10 h
            prepare_at: 0.5,
            activate_at: 5.0 / 6.0,
            propagation_seconds: 15 * 60,
        }
    }

    fn generation(id: u32, phase: Phase, start: OffsetDateTime) -> Generation {
        Generation {
            id,
            phase,
            ca_not_before: start,
            ca_not_after: start + schedule().ca_lifetime(),
            prepared_at: start,
            activated_at: (phase != Phase::Prepared).then_some(start),
            retired_at: None,
            activate_asap: false,
            last_leaf_not_after: None,
        }
    }

    #[test]
    fn bootstrap_prepares_then_activates_at_once() {
        assert_eq!(plan(&[], &schedule(), T0), [Step::Prepare]);
        let g = [generation(1, Phase::Prepared, T0)];
        assert_eq!(plan(&g, &schedule(), T0), [Step::Activate(1)]);
    }

    #[test]
    fn prepares_at_half_life_and_not_before() {
        let g = [generation(1, Phase::Active, T0)];
        assert!(plan(&g, &schedule(), T0 + Duration::minutes(299)).is_empty());
        assert_eq!(
            plan(&g, &schedule(), T0 + Duration::minutes(300)),
            [Step::Prepare]
        );
    }

    #[test]
    fn activates_at_five_sixths_only_after_the_propagation_window() {
        let mut g = vec![generation(1, Phase::Active, T0)];
        // Prepared late (e.g. after an outage), 5 minutes before the activation point.
        let late = T0 + Duration::minutes(495);
        g.push(generation(2, Phase::Prepared, late));
        let at = T0 + Duration::minutes(500);
        assert!(plan(&g, &schedule(), at).is_empty(), "window not yet over");
        assert!(plan(&g, &schedule(), late + Duration::minutes(14)).is_empty());
        assert_eq!(
            plan(&g, &schedule(), late + Duration::minutes(15)),
            [Step::Activate(2), Step::Retire(1)]
        );
        assert_eq!(
            next_event(&g, &schedule(), at),
            Some(late + Duration::minutes(15))
        );
    }

    #[test]
    fn retired_anchor_stays_until_its_last_leaf_expires() {
        let mut g = vec![
            generation(1, Phase::Retired, T0),
            generation(2, Phase::Active, T0 + Duration::minutes(500)),
        ];
        g[0].retired_at = Some(T0 + Duration::minutes(500));
        g[0].last_leaf_not_after = Some(T0 + Duration::minutes(560));
        let before = T0 + Duration::minutes(559);
        assert_eq!(published(&g, before), [1, 2]);
        assert!(!plan(&g, &schedule(), before).contains(&Step::Drop(1)));
        let after = T0 + Duration::minutes(560);
        assert_eq!(published(&g, after), [2]);
        assert!(plan(&g, &schedule(), after).contains(&Step::Drop(1)));
    }

    fn retired(mut g: Generation, at: OffsetDateTime) -> Generation {
        g.retire(MAX_LEAF, at);
        g
    }

    const MAX_LEAF: Duration = Duration::hours(2);

    /// `advance` runs the planner to its fixed point, one row per situation.
    #[test]
    fn advance_table() {
        let half = T0 + Duration::minutes(300);
        let five_sixths = T0 + Duration::minutes(500);
        let prepared_at_half = generation(2, Phase::Prepared, half);
        // Early enough that the last leaf ends before the CA does.
        let handed_over = T0 + Duration::minutes(400);
        let prepared_late = generation(2, Phase::Prepared, T0 + Duration::minutes(400));
        let early = T0 + Duration::minutes(100);
        let mut never_active = generation(2, Phase::Prepared, early);
        never_active.retire(MAX_LEAF, early + Duration::minutes(1));
        // Name, generations, now, the steps taken, whether a Prepare is due.
        type Row = (
            &'static str,
            Vec<Generation>,
            OffsetDateTime,
            Vec<Step>,
            bool,
        );
        let cases: Vec<Row> = vec![
            ("empty: bootstrap wants a CA", vec![], T0, vec![], true),
            (
                "young active CA: nothing",
                vec![generation(1, Phase::Active, T0)],
                half - Duration::minutes(1),
                vec![],
                false,
            ),
            (
                "half-life: only the caller can prepare",
                vec![generation(1, Phase::Active, T0)],
                half,
                vec![],
                true,
            ),
            (
                "prepared and propagated: nothing before 5/6",
                vec![generation(1, Phase::Active, T0), prepared_at_half.clone()],
                five_sixths - Duration::minutes(1),
                vec![],
                false,
            ),
            (
                "5/6: activate the new one, retire the old one",
                vec![generation(1, Phase::Active, T0), prepared_at_half],
                five_sixths,
                vec![Step::Activate(2), Step::Retire(1)],
                false,
            ),
            (
                "an expired active CA is replaced and, its leaves gone, dropped in the same run",
                vec![generation(1, Phase::Active, T0), prepared_late],
                T0 + Duration::minutes(601),
                vec![Step::Activate(2), Step::Retire(1), Step::Drop(1)],
                false,
            ),
            (
                "retired: kept while its last leaf may live",
                vec![
                    retired(generation(1, Phase::Active, T0), handed_over),
                    generation(2, Phase::Active, handed_over),
                ],
                handed_over + MAX_LEAF - Duration::seconds(1),
                vec![],
                false,
            ),
            (
                "retired: dropped once its last leaf expired",
                vec![
                    retired(generation(1, Phase::Active, T0), handed_over),
                    generation(2, Phase::Active, handed_over),
                ],
                handed_over + MAX_LEAF,
                vec![Step::Drop(1)],
                false,
            ),
            (
                // The case the two drivers disagreed on: the file store kept such an anchor for
                // the longest leaf lifetime, the Secret backend dropped it at once.
                "superseded before it was active: signed nothing, dropped at once",
                vec![generation(1, Phase::Active, T0), never_active],
                early + Duration::minutes(1),
                vec![Step::Drop(2)],
                false,
            ),
        ];
        for (name, generations, now, steps, prepare_due) in cases {
            let advanced = advance(&generations, &schedule(), MAX_LEAF, now);
            assert_eq!(advanced.steps, steps, "{name}");
            assert_eq!(advanced.prepare_due, prepare_due, "{name}");
            let again = advance(&advanced.generations, &schedule(), MAX_LEAF, now);
            assert!(again.steps.is_empty(), "{name}: not a fixed point");
            assert_eq!(
                advanced
                    .generations
                    .iter()
                    .map(|g| g.id)
                    .collect::<Vec<_>>(),
                generations.iter().map(|g| g.id).collect::<Vec<_>>(),
                "{name}: order kept"
            );
        }
    }

    /// The retire rule: until the last leaf can have expired, and not a moment longer.
    #[test]
    fn retire_table() {
        // The CA ends at T0 + 600 min: later than at + MAX_LEAF.
        let at = T0 + Duration::minutes(300);
        let active = generation(1, Phase::Active, T0);
        let mut known_later_leaf = active.clone();
        known_later_leaf.last_leaf_not_after = Some(at + Duration::hours(3));
        let mut near_its_end = active.clone();
        near_its_end.ca_not_after = at + Duration::minutes(30);
        let cases = [
            ("was active: now + the longest leaf", active, at + MAX_LEAF),
            (
                "a longer-lived leaf is known: kept until it expires",
                known_later_leaf,
                at + Duration::hours(3),
            ),
            (
                "never past the CA's own notAfter",
                near_its_end,
                at + Duration::minutes(30),
            ),
            (
                "never active: signed nothing, needed no longer",
                generation(2, Phase::Prepared, T0),
                at,
            ),
        ];
        for (name, mut g, until) in cases {
            g.retire(MAX_LEAF, at);
            assert_eq!(g.phase, Phase::Retired, "{name}");
            assert_eq!(g.retired_at, Some(at), "{name}");
            assert_eq!(g.anchor_needed_until(), until, "{name}");
        }
    }

    #[test]
    fn retired_without_known_leaves_waits_for_the_ca_not_after() {
        let mut g = generation(1, Phase::Retired, T0);
        g.retired_at = Some(T0 + Duration::minutes(500));
        assert_eq!(g.anchor_needed_until(), g.ca_not_after);
    }

    /// Simulate a year minute by minute-ish: at every instant the signing CA's anchor has been
    /// published for at least the propagation window (or it is the bootstrap CA), and every leaf
    /// ever signed is covered by a published anchor until it expires.
    #[test]
    fn simulated_year_never_signs_with_an_unpublished_anchor_nor_drops_a_live_one() {
        let s = schedule();
        let leaf_life = Duration::hours(2);
        let mut gens: Vec<Generation> = vec![];
        let mut leaves: Vec<(u32, OffsetDateTime)> = vec![];
        let mut now = T0;
        let mut next_id = 1;
        let mut first_activation = true;
        while now < T0 + Duration::days(40) {
            loop {
                let advanced = advance(&gens, &s, leaf_life, now);
                gens = advanced.generations;
                for step in advanced.steps {
                    if let Step::Activate(id) = step {
                        let g = gens.iter().find(|g| g.id == id).unwrap();
                        assert!(
                            first_activation || now >= g.prepared_at + s.propagation(),
                            "generation {id} activated before its anchor propagated"
                        );
                        first_activation = false;
                    }
                }
                if !advanced.prepare_due {
                    break;
                }
                gens.push(Generation {
                    id: next_id,
                    phase: Phase::Prepared,
                    ca_not_before: now,
                    ca_not_after: now + s.ca_lifetime(),
                    prepared_at: now,
                    activated_at: None,
                    retired_at: None,
                    activate_asap: false,
                    last_leaf_not_after: None,
                });
                next_id += 1;
            }
            let active = gens.iter_mut().find(|g| g.phase == Phase::Active).unwrap();
            assert!(now < active.ca_not_after, "active CA expired at {now}");
            let not_after = (now + leaf_life).min(active.ca_not_after);
            active.last_leaf_not_after = Some(
                active
                    .last_leaf_not_after
                    .map_or(not_after, |t| t.max(not_after)),
            );
            leaves.push((active.id, not_after));
            leaves.retain(|(_, expires)| *expires > now);
            let anchors = published(&gens, now);
            for (issuer, expires) in &leaves {
                if *expires > now {
                    assert!(
                        anchors.contains(issuer),
                        "live leaf of {issuer} unanchored at {now}"
                    );
                }
            }
            now += Duration::minutes(7);
        }
        assert!(next_id > 4, "several rotations happened ({next_id})");
    }

    /// Each case breaks one rule of the default schedule.
    #[test]
    fn schedule_validation() {
        assert_eq!(Schedule::default().validate(), Ok(()));
        let cases = [
            (
                Schedule {
                    propagation_seconds: 60,
                    ..Schedule::default()
                },
                ScheduleError::PropagationTooShort(60),
                "invalid rotation schedule: propagation_seconds 60 is below 600: kubelet caches \
                 trust bundles for about 5 minutes, so a shorter window risks pods that do not \
                 yet trust the new CA",
            ),
            (
                Schedule {
                    prepare_at: 0.9,
                    ..Schedule::default()
                },
                ScheduleError::PhaseFractions {
                    prepare_at: 0.9,
                    activate_at: 5.0 / 6.0,
                },
                "invalid rotation schedule: need 0 < prepare_at (0.9) < activate_at \
                 (0.8333333333333334) < 1",
            ),
            (
                Schedule {
                    ca_lifetime_seconds: 1800,
                    ..Schedule::default()
                },
                ScheduleError::WindowShorterThanPropagation {
                    ca_lifetime_seconds: 1800,
                    window: 1800.0 * (5.0 / 6.0 - 0.5),
                    propagation_seconds: 900,
                },
                "invalid rotation schedule: the CA lifetime (1800 s) leaves 600 s between \
                 prepare and activate, less than the propagation window (900 s)",
            ),
        ];
        for (broken, error, text) in cases {
            let got = broken.validate().unwrap_err();
            assert_eq!(got, error, "{broken:?}");
            assert_eq!(got.to_string(), text);
        }
    }

    #[test]
    fn each_step_has_its_own_name_and_generation() {
        let steps = [
            Step::Prepare,
            Step::Activate(2),
            Step::Retire(1),
            Step::Drop(3),
        ];
        assert_eq!(
            steps.map(Step::as_str),
            ["prepare", "activate", "retire", "drop"]
        );
        assert_eq!(
            steps.map(Step::generation),
            [None, Some(2), Some(1), Some(3)]
        );
    }
}
