//! [`SecretRotation`]: the recorded generations and the CAs this process holds, moved forward
//! by pure methods. Each returns what the caller must write; nothing here does I/O.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use podca_signer::rotation::{self, Generation, Phase, Schedule, Step};
use podca_signer::{CaCertificate, IssuingCa};
use time::{Duration, OffsetDateTime};
use tracing::info;

use super::contents::{SecretCaContents, SecretError};
use super::rules::{self, Gate as Opening};
use super::seal::{self, Opened, Rejection, SealError, Sealed};
use super::{Checked, History, Record};

/// What the state machine needs to know besides the Secret and the history.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `namespace/name` of the Secret, as the history records it.
    pub secret: String,
    /// Only `propagation_seconds` is used: podca never makes CAs in this backend.
    pub schedule: Schedule,
    /// Bounds the life of a retired CA's leaves (the largest policy maximum lifetime).
    pub max_leaf_lifetime: Duration,
}

/// What [`SecretRotation::observe`] made of the Secret.
#[derive(Debug)]
#[non_exhaustive]
pub enum Observation {
    /// The CA already seen last.
    Unchanged,
    /// A new valid CA: the next [`SecretRotation::step`] records it.
    New,
    /// No usable CA (reported once per Secret version); the CA in force stays.
    Rejected(SecretError),
    /// The version refused last time: not parsed again.
    AlreadyRejected,
}

/// What [`SecretRotation::step`] did and what the caller must install.
#[derive(Debug, Default)]
pub struct Stepped {
    /// The steps taken, in order.
    pub steps: Vec<Step>,
    /// Swap the handle to this; `None`: the handle already holds the right CA and anchors.
    pub install: Option<Install>,
}

/// The CA that signs from now on and every anchor to publish.
#[derive(Debug, Clone)]
pub struct Install {
    /// The signing generation.
    pub generation: u32,
    /// The signing CA; its key is gated as the phases say.
    pub ca: Arc<IssuingCa>,
    /// The anchors of every published generation, without duplicates.
    pub anchors: Vec<CaCertificate>,
    /// Set when the signer is a prepared CA whose predecessor's key this process does not hold
    /// (a restart during the window, or a Secret changed while podca was down), or while a
    /// hold after a distrusted history lasts: it signs nothing before this instant.
    pub gated_until: Option<OffsetDateTime>,
}

/// Values for the rotation gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricValues {
    /// Every generation still in use (not dropped).
    pub generations: Vec<GenerationGauge>,
    /// When a step is next due.
    pub next_rotation: Option<OffsetDateTime>,
}

/// One generation's `podca_ca_generation_not_after_timestamp_seconds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationGauge {
    pub generation: u32,
    pub phase: Phase,
    pub not_after: OffsetDateTime,
}

/// A generation and what this process knows about it.
struct Entry {
    record: Record,
    anchors: Vec<CaCertificate>,
    /// The CA with its key: only for CAs this process read from the Secret, until retired.
    keyed: Option<Arc<SecretCaContents>>,
}

impl Entry {
    /// A generation read from the history: no key.
    fn recorded(checked: Checked) -> Self {
        let Checked { record, anchors } = checked;
        Entry {
            record,
            anchors,
            keyed: None,
        }
    }

    fn is_live(&self) -> bool {
        matches!(
            self.record.generation.phase,
            Phase::Prepared | Phase::Active
        )
    }

    /// Its anchor left the bundle for good: it is not kept, nor sealed.
    fn is_dropped(&self) -> bool {
        self.record.generation.phase == Phase::Dropped
    }
}

/// The Secret CA's generations and keys.
pub struct SecretRotation {
    settings: Settings,
    entries: Vec<Entry>,
    /// The last valid CA read from the Secret.
    latest: Arc<SecretCaContents>,
    /// The resourceVersion of a Secret refused already (reported once).
    rejected_version: Option<String>,
    /// What the handle holds: the signing generation and the anchors' fingerprints.
    installed: Option<(u32, Vec<String>)>,
    /// The history changed since it was last written.
    dirty: bool,
    /// The sequence number of the newest history verified or written.
    sequence: Option<u64>,
    /// Nothing signs before this instant: set when podca started without a history it could
    /// trust ([`SecretRotation::distrust_history`]).
    hold_until: Option<OffsetDateTime>,
}

impl fmt::Debug for SecretRotation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretRotation")
            .field("secret", &self.settings.secret)
            .field(
                "generations",
                &self
                    .entries
                    .iter()
                    .map(|e| {
                        format!(
                            "{} {} {}",
                            e.record.generation.id, e.record.generation.phase, e.record.fingerprint
                        )
                    })
                    .collect::<Vec<_>>(),
            )
            .field("installed", &self.installed)
            .finish_non_exhaustive()
    }
}

impl SecretRotation {
    /// The state at start: the generations recorded in the history (none without one) and the
    /// CA the Secret holds now. Nothing is installed before the first [`SecretRotation::step`].
    /// Dropped generations, which histories of earlier versions kept, are left out.
    pub fn new(settings: Settings, recorded: Vec<Checked>, contents: SecretCaContents) -> Self {
        SecretRotation {
            settings,
            entries: recorded
                .into_iter()
                .map(Entry::recorded)
                .filter(|e| !e.is_dropped())
                .collect(),
            latest: Arc::new(contents),
            rejected_version: None,
            installed: None,
            dirty: false,
            sequence: None,
            hold_until: None,
        }
    }

    /// [`SecretRotation::new`] from a history that verified: its sequence is the floor for
    /// replays, and its hold stays in force.
    pub fn from_opened(settings: Settings, opened: Opened, contents: SecretCaContents) -> Self {
        let Opened {
            recorded,
            sequence,
            hold_until,
            signer: _,
        } = opened;
        let mut state = SecretRotation::new(settings, recorded, contents);
        state.sequence = Some(sequence);
        state.hold_until = hold_until;
        state
    }

    /// Starts without the history, which was there but could not be trusted: the Secret's CA
    /// is taken as new, its anchors published at once, and nothing signs for one propagation
    /// window from `now` — whether relying parties trust it yet is unknown, so the forged (or
    /// damaged) history can neither skip the window nor add an anchor. The anchors a genuine
    /// history held of earlier CAs are lost with it. The hold is recorded in the seal.
    pub fn distrust_history(&mut self, now: OffsetDateTime) {
        let until = now.saturating_add(self.settings.schedule.propagation());
        self.hold_until = Some(self.hold_until.map_or(until, |h| h.max(until)));
        self.dirty = true;
    }

    /// Verifies a stored history against the Secret's CA and the live generations this
    /// replica trusts already (see [`seal::open`]).
    pub fn open(
        &self,
        history_json: &str,
        seal_json: Option<&str>,
        now: OffsetDateTime,
    ) -> Result<Opened, Rejection> {
        let mut known = seal::vouching(self.latest.ca());
        for e in self.entries.iter().filter(|e| e.is_live()) {
            known.extend(CaCertificate::all_from_pem(&e.record.chain_pem).unwrap_or_default());
            known.extend(e.anchors.iter().cloned());
        }
        seal::open_with(
            history_json,
            seal_json,
            &self.settings.secret,
            &known,
            self.sequence,
            self.settings.schedule.propagation(),
            now,
        )
    }

    /// Takes over a verified history of the leader ([`SecretRotation::adopt`]).
    pub fn adopt_opened(&mut self, opened: Opened) {
        let Opened {
            recorded,
            sequence,
            hold_until,
            signer: _,
        } = opened;
        self.adopt(recorded);
        self.sequence = Some(sequence);
        self.hold_until = hold_until;
    }

    /// The history, sealed with the Secret's key, to write; the sequence grows by one.
    pub fn seal(&self, now: OffsetDateTime) -> Result<Sealed, SealError> {
        let sequence = self.sequence.map_or(1, |s| s.saturating_add(1));
        let hold = self.hold_until.filter(|h| *h > now);
        seal::seal(&self.history(), sequence, hold, &self.latest)
    }

    /// Takes over the leader's history (a standby follows it), keeping the keys this process
    /// holds for the prepared and active generations.
    pub fn adopt(&mut self, recorded: Vec<Checked>) {
        let mut keys: Vec<Arc<SecretCaContents>> =
            self.entries.drain(..).filter_map(|e| e.keyed).collect();
        keys.push(Arc::clone(&self.latest));
        self.entries = recorded
            .into_iter()
            .map(|checked| {
                let mut e = Entry::recorded(checked);
                let held = keys.iter().find(|k| k.same_ca(&e.record));
                if e.is_live() {
                    e.keyed = held.cloned();
                } else if let Some(k) = held {
                    // Retired by the leader: a snapshot still in flight must not sign with it.
                    k.gate.retire();
                }
                e
            })
            .filter(|e| !e.is_dropped())
            .collect();
    }

    /// Looks at the Secret of resourceVersion `version`: `parse` (not called again for a
    /// version refused already) gives its CA, which becomes the latest when it is new.
    pub fn observe(
        &mut self,
        version: Option<&str>,
        parse: impl FnOnce() -> Result<SecretCaContents, SecretError>,
    ) -> Observation {
        if version.is_some() && version == self.rejected_version.as_deref() {
            return Observation::AlreadyRejected;
        }
        match parse() {
            Ok(contents) => {
                self.rejected_version = None;
                if self.latest.same_as(&contents) {
                    return Observation::Unchanged;
                }
                info!(
                    secret = %self.settings.secret,
                    issuing = %contents.ca().certificate().subject(),
                    fingerprint = %contents.ca().fingerprint(),
                    anchors = ?contents.ca().roots().iter().map(|r| r.fingerprint()).collect::<Vec<_>>(),
                    "new CA seen in Secret"
                );
                self.latest = Arc::new(contents);
                Observation::New
            }
            Err(reason) => {
                self.rejected_version = version.map(str::to_owned);
                Observation::Rejected(reason)
            }
        }
    }

    /// Records the latest Secret CA (prepared, or found in the history), runs the planner to a
    /// fixed point, opens and closes the keys' gates as the phases say, and tells what to
    /// install when the signing CA or the anchors changed.
    pub fn step(&mut self, now: OffsetDateTime) -> Stepped {
        let mut steps = vec![];
        // Time-based steps first: a prepared CA whose gate opened is activated before a newer
        // one could supersede it.
        self.plan_to_fixed_point(now, &mut steps);
        self.record_latest(now, &mut steps);
        self.plan_to_fixed_point(now, &mut steps);
        let install = self.install(now);
        Stepped { steps, install }
    }

    /// The generations as recorded (public data only), to persist: the live ones (prepared,
    /// active, retired), never a dropped one, so the sealed history stays as small as the
    /// rotations a leaf lifetime spans, and vouches for no generation that may not sign or be
    /// published again.
    pub fn history(&self) -> History {
        History {
            secret: self.settings.secret.clone(),
            generations: self
                .entries
                .iter()
                .filter(|e| !e.is_dropped())
                .map(|e| e.record.clone())
                .collect(),
        }
    }

    /// Whether the history changed since [`SecretRotation::written`].
    pub fn needs_writing(&self) -> bool {
        self.dirty
    }

    /// The history as [`SecretRotation::seal`] sealed it has been persisted.
    pub fn written(&mut self) {
        self.dirty = false;
        self.sequence = Some(self.sequence.map_or(1, |s| s.saturating_add(1)));
    }

    /// The stored history is not what this replica wrote (someone changed it): write it again.
    pub fn rewrite(&mut self) {
        self.dirty = true;
    }

    /// When a step is next due: a prepared CA's window ends, or a retired anchor may go.
    pub fn next_event(&self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        rules::next_event(
            self.entries.iter().map(|e| &e.record.generation),
            self.settings.schedule.propagation(),
            now,
        )
    }

    /// The gauges' values at `now`.
    pub fn metric_values(&self, now: OffsetDateTime) -> MetricValues {
        MetricValues {
            generations: self
                .entries
                .iter()
                .map(|e| &e.record.generation)
                .filter(|g| g.phase != Phase::Dropped)
                .map(|g| GenerationGauge {
                    generation: g.id,
                    phase: g.phase,
                    not_after: g.ca_not_after,
                })
                .collect(),
            next_rotation: self.next_event(now),
        }
    }

    fn record_latest(&mut self, now: OffsetDateTime, steps: &mut Vec<Step>) {
        let latest = Arc::clone(&self.latest);
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.is_live() && latest.same_ca(&e.record))
        {
            if e.keyed.is_none() {
                e.keyed = Some(Arc::clone(&latest));
            }
            let id = e.record.generation.id;
            self.supersede_prepared(id, now, steps);
            return;
        }
        let id = rules::next_id(self.entries.iter().map(|e| &e.record.generation));
        let prepared_at = self.anchors_published_since(&latest, now);
        let ca = latest.ca();
        let ca_not_after = ca
            .roots()
            .iter()
            .map(CaCertificate::not_after)
            .fold(ca.not_after(), OffsetDateTime::min);
        let record = Record {
            generation: Generation {
                id,
                phase: Phase::Prepared,
                ca_not_before: ca.certificate().not_before(),
                ca_not_after,
                prepared_at,
                activated_at: None,
                retired_at: None,
                activate_asap: true,
                last_leaf_not_after: None,
            },
            fingerprint: ca.fingerprint().to_string(),
            subject: ca.certificate().subject().to_string(),
            chain_pem: latest.chain_pem.clone(),
            anchors_pem: latest.anchors_pem.clone(),
        };
        info!(
            generation = id,
            secret = %self.settings.secret,
            issuing = %record.subject,
            fingerprint = %record.fingerprint,
            anchors_published_since = %prepared_at,
            signs_from = %prepared_at.saturating_add(self.settings.schedule.propagation()),
            "prepared: the new CA's anchors are published; it signs once they have propagated"
        );
        steps.push(Step::Prepare);
        self.entries.push(Entry {
            anchors: ca.roots().to_vec(),
            record,
            keyed: Some(latest),
        });
        self.dirty = true;
        self.supersede_prepared(id, now, steps);
    }

    /// Prepared generations other than `keep` signed nothing: they are retired (and dropped as
    /// soon as the planner runs).
    fn supersede_prepared(&mut self, keep: u32, now: OffsetDateTime, steps: &mut Vec<Step>) {
        let superseded: Vec<u32> = self
            .entries
            .iter()
            .filter(|e| {
                e.record.generation.phase == Phase::Prepared && e.record.generation.id != keep
            })
            .map(|e| e.record.generation.id)
            .collect();
        let max_leaf = self.settings.max_leaf_lifetime;
        for id in superseded {
            if let Some(e) = self
                .entries
                .iter_mut()
                .find(|e| e.record.generation.id == id)
            {
                e.record.generation.retire(max_leaf, now);
            }
            self.took(Step::Retire(id), steps);
        }
    }

    /// When every anchor of `ca` has been published without a gap (the earliest preparation of
    /// a still-published generation holding it); `now` for an anchor not published yet.
    fn anchors_published_since(
        &self,
        ca: &SecretCaContents,
        now: OffsetDateTime,
    ) -> OffsetDateTime {
        let published = self.published(now);
        ca.ca()
            .roots()
            .iter()
            .map(|anchor| {
                self.entries
                    .iter()
                    .filter(|e| {
                        published.contains(&e.record.generation.id) && e.anchors.contains(anchor)
                    })
                    .map(|e| e.record.generation.prepared_at)
                    .min()
                    .unwrap_or(now)
            })
            .max()
            .unwrap_or(now)
    }

    fn generations(&self) -> Vec<Generation> {
        self.entries
            .iter()
            .map(|e| e.record.generation.clone())
            .collect()
    }

    /// The ids of the generations whose anchors are published at `now`.
    fn published(&self, now: OffsetDateTime) -> HashSet<u32> {
        rotation::published(&self.generations(), now)
            .into_iter()
            .collect()
    }

    fn plan_to_fixed_point(&mut self, now: OffsetDateTime, steps: &mut Vec<Step>) {
        self.take_overdue_handover(now, steps);
        let advanced = rotation::advance(
            &self.generations(),
            &self.settings.schedule,
            self.settings.max_leaf_lifetime,
            now,
        );
        // `prepare_due` is not for this backend: podca makes no CAs here, a new one comes from
        // the Secret.
        for (e, g) in self.entries.iter_mut().zip(advanced.generations) {
            e.record.generation = g;
        }
        for step in advanced.steps {
            self.took(step, steps);
        }
        // Logged and counted above; a dropped generation is not kept (see `history`).
        self.entries.retain(|e| !e.is_dropped());
    }

    /// Takes a handover the history shows was due long ago with the times it was due at
    /// ([`rules::overdue_handover`]), so that the planner drops the replaced CA's anchor when it
    /// was due instead of publishing it again for a leaf lifetime.
    fn take_overdue_handover(&mut self, now: OffsetDateTime, steps: &mut Vec<Step>) {
        let Some(handover) = rules::overdue_handover(
            self.entries
                .iter()
                .map(|e| (&e.record.generation, e.keyed.is_some())),
            self.settings.schedule.propagation(),
            now,
        ) else {
            return;
        };
        let max_leaf = self.settings.max_leaf_lifetime;
        for e in &mut self.entries {
            let g = &mut e.record.generation;
            if g.id == handover.activate {
                g.activate(handover.due);
            } else if g.id == handover.retire {
                g.retire(max_leaf, handover.retired_at);
            }
        }
        info!(
            secret = %self.settings.secret,
            activated = handover.activate,
            retired = handover.retire,
            due = %handover.due,
            "a handover the CA history shows was due is taken with the times it was due at"
        );
        self.took(Step::Activate(handover.activate), steps);
        self.took(Step::Retire(handover.retire), steps);
    }

    /// Logs and records a step whose bookkeeping is done; a retired CA's key is let go.
    fn took(&mut self, step: Step, steps: &mut Vec<Step>) {
        let secret = &self.settings.secret;
        let id = match step {
            Step::Activate(id) | Step::Retire(id) | Step::Drop(id) => id,
            Step::Prepare => return,
        };
        let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.record.generation.id == id)
        else {
            return;
        };
        let g = &e.record.generation;
        match step {
            Step::Activate(_) => info!(
                generation = id,
                secret,
                issuing = %e.record.subject,
                fingerprint = %e.record.fingerprint,
                "activated: this CA signs from now on"
            ),
            Step::Retire(_) => {
                if let Some(k) = e.keyed.take() {
                    k.gate.retire();
                }
                info!(
                    generation = id,
                    secret,
                    fingerprint = %e.record.fingerprint,
                    anchor_published_until = %g.anchor_needed_until(),
                    "retired: this CA signs nothing; its anchor stays until its last certificate expired"
                );
            }
            Step::Drop(_) => info!(
                generation = id,
                secret,
                fingerprint = %e.record.fingerprint,
                "dropped: this CA's anchor leaves the trust bundle"
            ),
            Step::Prepare => {}
        }
        self.dirty = true;
        steps.push(step);
    }

    /// Opens the gates as the phases say; the signing CA and the anchors when either changed
    /// since the last install.
    fn install(&mut self, now: OffsetDateTime) -> Option<Install> {
        let propagation = self.settings.schedule.propagation();
        for e in &self.entries {
            if let Some(k) = &e.keyed {
                match rules::gate(&e.record.generation, propagation) {
                    Opening::OpenFrom(t) => {
                        k.gate.open_from(self.hold_until.map_or(t, |h| h.max(t)))
                    }
                    Opening::Retired => k.gate.retire(),
                }
            }
        }
        let signer = rules::signer(
            self.entries
                .iter()
                .map(|e| (&e.record.generation, e.keyed.is_some())),
        );
        let signer = self.entries.get(signer?)?;
        let published = self.published(now);
        let mut anchors: Vec<CaCertificate> = vec![];
        for e in self
            .entries
            .iter()
            .filter(|e| published.contains(&e.record.generation.id))
        {
            for a in &e.anchors {
                if !anchors.contains(a) {
                    anchors.push(a.clone());
                }
            }
        }
        let generation = signer.record.generation.id;
        let state = (
            generation,
            anchors.iter().map(CaCertificate::fingerprint).collect(),
        );
        if self.installed.as_ref() == Some(&state) {
            return None;
        }
        let keyed = signer.keyed.as_ref()?;
        let window = (signer.record.generation.phase == Phase::Prepared)
            .then(|| rules::window_end(&signer.record.generation, propagation));
        let hold = self.hold_until.filter(|h| *h > now);
        let gated_until = window.max(hold);
        let install = Install {
            generation,
            ca: Arc::clone(keyed.ca()),
            anchors,
            gated_until,
        };
        self.installed = Some(state);
        Some(install)
    }
}
