//! The JWT signing keys and their rotation, as pure functions plus the in-memory set.
//!
//! A key goes through three phases, like a CA generation (see [`crate::rotation`]):
//!
//! 1. **Prepared** a propagation window before the active key's rotation is due: published in
//!    every JWKS, signing nothing, so relying parties that cache the JWKS learn it first.
//! 2. **Active** once it has been published for the propagation window *and* the active key's
//!    rotation period is over. On activation its `not_after` is fixed: the end of its rotation
//!    period plus the maximum token lifetime. No token it signs outlives `not_after`.
//! 3. **Retired** when its successor activates: it signs nothing and stays published until
//!    `not_after`, when every token it signed has expired; then it is dropped.
//!
//! The very first key (and a key made because the active one reached `not_after` while podca was
//! down) is active at once: nothing else could sign.

use std::sync::Arc;

use aws_lc_rs::digest;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use super::jwks::{Jwk, JwtBundle};
use super::{IssueLimits, JwtError, SignedSvid, SvidRequest};
use crate::backend::{CaAlgorithm, CaKey};

/// Where a JWT key is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JwtKeyPhase {
    Prepared,
    Active,
    Retired,
}

impl std::fmt::Display for JwtKeyPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JwtKeyPhase::Prepared => "prepared",
            JwtKeyPhase::Active => "active",
            JwtKeyPhase::Retired => "retired",
        })
    }
}

/// What the rotation logic knows about one JWT key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwtKeyInfo {
    pub kid: String,
    pub algorithm: CaAlgorithm,
    pub phase: JwtKeyPhase,
    /// When it was first published.
    #[serde(with = "time::serde::rfc3339")]
    pub published_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub activated_at: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub retired_at: Option<OffsetDateTime>,
    /// Fixed on activation: no token it signs expires later, and it is published until then.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub not_after: Option<OffsetDateTime>,
}

/// The rotation schedule of the JWT keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JwtKeySchedule {
    /// How long a key signs before its successor takes over.
    pub rotation_period: Duration,
    /// How long a new key is published before it signs.
    pub propagation: Duration,
    /// The longest token lifetime (a retired key stays published this long).
    pub max_lifetime: Duration,
}

/// Why a [`JwtKeySchedule`] cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("the JWT key rotation period and maximum lifetime must be positive")]
    NotPositive,
    #[error(
        "the JWT key propagation window ({propagation} s) must be shorter than the rotation \
         period ({rotation} s)"
    )]
    PropagationTooLong { propagation: i64, rotation: i64 },
}

impl JwtKeySchedule {
    /// Refuses schedules that cannot work: the propagation window must fit in the rotation
    /// period, and every duration must be positive.
    pub fn check(&self) -> Result<(), ScheduleError> {
        if self.rotation_period <= Duration::ZERO
            || self.propagation < Duration::ZERO
            || self.max_lifetime <= Duration::ZERO
        {
            return Err(ScheduleError::NotPositive);
        }
        if self.propagation >= self.rotation_period {
            return Err(ScheduleError::PropagationTooLong {
                propagation: self.propagation.whole_seconds(),
                rotation: self.rotation_period.whole_seconds(),
            });
        }
        Ok(())
    }
}

/// The next change to the key set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtKeyStep {
    /// Make a new key; active at once (nothing can sign otherwise) or prepared.
    Generate { activate: bool },
    /// Make this prepared key the signing key; the active one retires.
    Activate(String),
    /// Remove this retired key: every token it signed has expired.
    Drop(String),
}

/// The next step for `keys` at `now`, or None when nothing is due. Callers apply it (see
/// [`apply`]) and ask again until None.
pub fn plan(
    keys: &[JwtKeyInfo],
    now: OffsetDateTime,
    schedule: &JwtKeySchedule,
) -> Option<JwtKeyStep> {
    if let Some(done) = keys
        .iter()
        .find(|k| k.phase == JwtKeyPhase::Retired && k.not_after.is_none_or(|t| t <= now))
    {
        return Some(JwtKeyStep::Drop(done.kid.clone()));
    }
    let active = keys.iter().find(|k| k.phase == JwtKeyPhase::Active);
    let prepared = keys.iter().find(|k| k.phase == JwtKeyPhase::Prepared);
    let usable = active.filter(|a| a.not_after.is_some_and(|t| t > now));
    match (usable, prepared) {
        (None, None) => Some(JwtKeyStep::Generate {
            activate: active.is_none(),
        }),
        // Nothing may sign: take the prepared key now rather than sign nothing.
        (None, Some(p)) => Some(JwtKeyStep::Activate(p.kid.clone())),
        (Some(a), Some(p)) => (p.published_at + schedule.propagation <= now
            && rotation_due(a, schedule) <= now)
            .then(|| JwtKeyStep::Activate(p.kid.clone())),
        (Some(a), None) => (rotation_due(a, schedule) - schedule.propagation <= now)
            .then_some(JwtKeyStep::Generate { activate: false }),
    }
}

/// When the next step is due if nothing changes (None: only on demand).
pub fn next_event(keys: &[JwtKeyInfo], schedule: &JwtKeySchedule) -> Option<OffsetDateTime> {
    let active = keys.iter().find(|k| k.phase == JwtKeyPhase::Active);
    let prepared = keys.iter().find(|k| k.phase == JwtKeyPhase::Prepared);
    let mut events: Vec<OffsetDateTime> = keys
        .iter()
        .filter(|k| k.phase == JwtKeyPhase::Retired)
        .filter_map(|k| k.not_after)
        .collect();
    if let Some(a) = active {
        events.extend(a.not_after);
        match prepared {
            Some(p) => {
                events.push(rotation_due(a, schedule).max(p.published_at + schedule.propagation))
            }
            None => events.push(rotation_due(a, schedule) - schedule.propagation),
        }
    }
    events.into_iter().min()
}

fn rotation_due(active: &JwtKeyInfo, schedule: &JwtKeySchedule) -> OffsetDateTime {
    active.activated_at.unwrap_or(active.published_at) + schedule.rotation_period
}

/// Applies `step` to the key infos. `new_key` is the info of the key a `Generate` step made
/// (phase and times are set here).
pub fn apply(
    keys: &mut Vec<JwtKeyInfo>,
    step: &JwtKeyStep,
    now: OffsetDateTime,
    schedule: &JwtKeySchedule,
    new_key: Option<(String, CaAlgorithm)>,
) {
    let activate = |k: &mut JwtKeyInfo| {
        k.phase = JwtKeyPhase::Active;
        k.activated_at = Some(now);
        k.not_after = Some(now + schedule.rotation_period + schedule.max_lifetime);
    };
    let retire_active = |keys: &mut Vec<JwtKeyInfo>| {
        for k in keys.iter_mut().filter(|k| k.phase == JwtKeyPhase::Active) {
            k.phase = JwtKeyPhase::Retired;
            k.retired_at = Some(now);
        }
    };
    match step {
        JwtKeyStep::Generate {
            activate: now_active,
        } => {
            let Some((kid, algorithm)) = new_key else {
                return;
            };
            let mut info = JwtKeyInfo {
                kid,
                algorithm,
                phase: JwtKeyPhase::Prepared,
                published_at: now,
                activated_at: None,
                retired_at: None,
                not_after: None,
            };
            if *now_active {
                retire_active(keys);
                activate(&mut info);
            }
            keys.push(info);
        }
        JwtKeyStep::Activate(kid) => {
            retire_active(keys);
            if let Some(k) = keys.iter_mut().find(|k| &k.kid == kid) {
                activate(k);
            }
        }
        JwtKeyStep::Drop(kid) => keys.retain(|k| &k.kid != kid),
    }
}

/// The key ID of a public key: the first 24 bytes of the SHA-256 of its SPKI, base64url (32
/// characters). Derived from the key, so it needs no storage and cannot disagree with it.
pub fn kid_of(key: &dyn CaKey) -> String {
    let spki = key.public_key_spki();
    let d = digest::digest(&digest::SHA256, &spki);
    URL_SAFE_NO_PAD.encode(&d.as_ref()[..24])
}

/// The JWT keys in memory: what signs now and what is published.
#[derive(Clone, Default)]
pub struct JwtKeySet {
    keys: Vec<(JwtKeyInfo, Arc<dyn CaKey>)>,
    /// Bumped on every change (the bundle's `spiffe_sequence`).
    sequence: u64,
}

impl std::fmt::Debug for JwtKeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtKeySet")
            .field("keys", &self.infos().collect::<Vec<_>>())
            .field("sequence", &self.sequence)
            .finish()
    }
}

impl JwtKeySet {
    /// A set from its keys. Refuses a key whose algorithm cannot sign JWT-SVIDs or whose ID does
    /// not match its public key.
    pub fn new(keys: Vec<(JwtKeyInfo, Arc<dyn CaKey>)>, sequence: u64) -> Result<Self, JwtError> {
        for (info, key) in &keys {
            super::JwtAlgorithm::for_key(key.algorithm())?;
            if kid_of(key.as_ref()) != info.kid {
                return Err(JwtError::UnusableKey(format!(
                    "key {} does not match its public key",
                    info.kid
                )));
            }
        }
        Ok(JwtKeySet { keys, sequence })
    }

    /// The keys' infos, in order.
    pub fn infos(&self) -> impl Iterator<Item = &JwtKeyInfo> {
        self.keys.iter().map(|(info, _)| info)
    }

    /// Every published key (prepared, active and retired) with its info, in order.
    pub fn published(&self) -> impl Iterator<Item = (&JwtKeyInfo, &Arc<dyn CaKey>)> {
        self.keys.iter().map(|(info, key)| (info, key))
    }

    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The key that signs at `now`: the active one, while before its `not_after`.
    pub fn signing(&self, now: OffsetDateTime) -> Option<(&JwtKeyInfo, &Arc<dyn CaKey>)> {
        self.keys
            .iter()
            .find(|(info, _)| {
                info.phase == JwtKeyPhase::Active && info.not_after.is_some_and(|t| t > now)
            })
            .map(|(info, key)| (info, key))
    }

    /// Signs a JWT-SVID with the active key (blocking for HSM keys).
    pub fn sign(
        &self,
        request: &SvidRequest<'_>,
        limits: &IssueLimits,
        now: OffsetDateTime,
    ) -> Result<SignedSvid, JwtError> {
        let (info, key) = self.signing(now).ok_or(JwtError::NoSigningKey)?;
        super::sign(
            key.as_ref(),
            &info.kid,
            request,
            limits,
            now,
            info.not_after,
        )
    }

    /// The published keys (prepared, active and retired) as a SPIFFE bundle JWKS.
    pub fn bundle(&self, refresh_hint: Option<Duration>) -> JwtBundle {
        JwtBundle {
            keys: self
                .keys
                .iter()
                .filter_map(|(info, key)| Jwk::of_key(key.as_ref(), &info.kid).ok())
                .collect(),
            spiffe_sequence: Some(self.sequence),
            spiffe_refresh_hint: refresh_hint
                .map(|d| u64::try_from(d.whole_seconds()).unwrap_or(0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> JwtKeySchedule {
        JwtKeySchedule {
            rotation_period: Duration::hours(24),
            propagation: Duration::hours(1),
            max_lifetime: Duration::hours(1),
        }
    }

    fn t0() -> OffsetDateTime {
        time::macros::datetime!(2026-01-01 00:00 UTC)
    }

    /// Runs the plan to its fixed point, naming new keys k1, k2, ….
    fn settle(keys: &mut Vec<JwtKeyInfo>, now: OffsetDateTime, made: &mut u32) -> Vec<JwtKeyStep> {
        let mut steps = Vec::new();
        while let Some(step) = plan(keys, now, &schedule()) {
            let new_key = matches!(step, JwtKeyStep::Generate { .. }).then(|| {
                *made += 1;
                (format!("k{made}"), CaAlgorithm::EcdsaP256)
            });
            apply(keys, &step, now, &schedule(), new_key);
            steps.push(step);
            assert!(steps.len() < 10, "the plan does not settle: {steps:?}");
        }
        steps
    }

    fn phases(keys: &[JwtKeyInfo]) -> Vec<(String, JwtKeyPhase)> {
        keys.iter().map(|k| (k.kid.clone(), k.phase)).collect()
    }

    #[test]
    fn the_first_key_is_active_at_once() {
        let (mut keys, mut made) = (Vec::new(), 0);
        let steps = settle(&mut keys, t0(), &mut made);
        assert_eq!(steps, vec![JwtKeyStep::Generate { activate: true }]);
        assert_eq!(phases(&keys), vec![("k1".into(), JwtKeyPhase::Active)]);
        assert_eq!(keys[0].not_after, Some(t0() + Duration::hours(25)));
    }

    #[test]
    fn a_rotation_publishes_first_and_drops_after_the_last_token() {
        let (mut keys, mut made) = (Vec::new(), 0);
        settle(&mut keys, t0(), &mut made);
        // Just before the propagation window: nothing.
        let before = t0() + Duration::hours(23) - Duration::seconds(1);
        assert_eq!(settle(&mut keys, before, &mut made), vec![]);
        assert_eq!(
            next_event(&keys, &schedule()),
            Some(t0() + Duration::hours(23))
        );
        // Prepared a propagation window before the rotation is due.
        let prepare = t0() + Duration::hours(23);
        assert_eq!(
            settle(&mut keys, prepare, &mut made),
            vec![JwtKeyStep::Generate { activate: false }]
        );
        assert_eq!(
            phases(&keys),
            vec![
                ("k1".into(), JwtKeyPhase::Active),
                ("k2".into(), JwtKeyPhase::Prepared)
            ]
        );
        assert_eq!(
            next_event(&keys, &schedule()),
            Some(t0() + Duration::hours(24))
        );
        assert_eq!(
            settle(
                &mut keys,
                t0() + Duration::hours(24) - Duration::seconds(1),
                &mut made
            ),
            vec![]
        );
        // Activated when the rotation period is over; k1 retires but stays published.
        let rotate = t0() + Duration::hours(24);
        assert_eq!(
            settle(&mut keys, rotate, &mut made),
            vec![JwtKeyStep::Activate("k2".into())]
        );
        assert_eq!(
            phases(&keys),
            vec![
                ("k1".into(), JwtKeyPhase::Retired),
                ("k2".into(), JwtKeyPhase::Active)
            ]
        );
        // Dropped at its not_after: every token it signed (clamped to it) has expired.
        assert_eq!(
            next_event(&keys, &schedule()),
            Some(t0() + Duration::hours(25))
        );
        assert_eq!(
            settle(
                &mut keys,
                t0() + Duration::hours(25) - Duration::seconds(1),
                &mut made
            ),
            vec![]
        );
        assert_eq!(
            settle(&mut keys, t0() + Duration::hours(25), &mut made),
            vec![JwtKeyStep::Drop("k1".into())]
        );
        assert_eq!(phases(&keys), vec![("k2".into(), JwtKeyPhase::Active)]);
    }

    #[test]
    fn a_late_start_still_waits_for_propagation() {
        let (mut keys, mut made) = (Vec::new(), 0);
        settle(&mut keys, t0(), &mut made);
        // podca was down when the key was due to be prepared: it is prepared late, and the
        // rotation waits for its propagation window instead of happening on schedule.
        let late = t0() + Duration::hours(23) + Duration::minutes(30);
        assert_eq!(
            settle(&mut keys, late, &mut made),
            vec![JwtKeyStep::Generate { activate: false }]
        );
        assert_eq!(
            settle(&mut keys, t0() + Duration::hours(24), &mut made),
            vec![]
        );
        let ready = late + Duration::hours(1);
        assert_eq!(
            settle(&mut keys, ready, &mut made),
            vec![JwtKeyStep::Activate("k2".into())]
        );
    }

    #[test]
    fn an_expired_active_key_is_replaced_at_once() {
        let (mut keys, mut made) = (Vec::new(), 0);
        settle(&mut keys, t0(), &mut made);
        let much_later = t0() + Duration::days(10);
        let steps = settle(&mut keys, much_later, &mut made);
        assert_eq!(
            steps,
            vec![
                JwtKeyStep::Generate { activate: false },
                JwtKeyStep::Activate("k2".into()),
                JwtKeyStep::Drop("k1".into()),
            ]
        );
        assert_eq!(phases(&keys), vec![("k2".into(), JwtKeyPhase::Active)]);
    }

    #[test]
    fn schedules_that_cannot_work_are_refused() {
        let mut s = schedule();
        assert_eq!(s.check(), Ok(()));
        s.propagation = s.rotation_period;
        assert_eq!(
            s.check(),
            Err(ScheduleError::PropagationTooLong {
                propagation: s.propagation.whole_seconds(),
                rotation: s.rotation_period.whole_seconds()
            })
        );
        let mut s = schedule();
        s.max_lifetime = Duration::ZERO;
        assert_eq!(s.check(), Err(ScheduleError::NotPositive));
    }
}
