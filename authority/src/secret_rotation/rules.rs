//! The pure rules of the Secret CA backend's rotation, given the recorded generations and the
//! clock: when a CA read from the Secret may sign, which one signs, what id a new one gets and
//! when the next step is due. The state machine ([`super::SecretRotation`]) applies them;
//! `podca_signer::rotation::advance` moves the phases.

use podca_signer::rotation::{Generation, Phase};
use time::{Duration, OffsetDateTime};

/// When the key of a generation this process holds may sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// From this instant on.
    OpenFrom(OffsetDateTime),
    /// Never again.
    Retired,
}

/// An active CA signs at once; a prepared one once its anchor has been published for the
/// propagation window; a retired or dropped one never.
pub(super) fn gate(generation: &Generation, propagation: Duration) -> Gate {
    match generation.phase {
        Phase::Active => Gate::OpenFrom(OffsetDateTime::UNIX_EPOCH),
        Phase::Prepared => Gate::OpenFrom(window_end(generation, propagation)),
        Phase::Retired | Phase::Dropped => Gate::Retired,
    }
}

/// When a prepared generation's propagation window ends. Saturating: a time at the end of
/// `OffsetDateTime`'s range means never, and can neither panic nor wrap round to the past.
pub(super) fn window_end(generation: &Generation, propagation: Duration) -> OffsetDateTime {
    generation.prepared_at.saturating_add(propagation)
}

/// The index of the generation whose key signs: the active one if this process holds its key;
/// else (after a restart during the window, or a Secret changed while podca was down) the newest
/// prepared one with a key, which its gate holds until the window is over. Each item is a
/// generation and whether this process holds its key.
pub(super) fn signer<'a>(
    generations: impl IntoIterator<Item = (&'a Generation, bool)> + Clone,
) -> Option<usize> {
    let keyed = |phase: Phase| {
        generations
            .clone()
            .into_iter()
            .enumerate()
            .filter(move |(_, (g, keyed))| *keyed && g.phase == phase)
    };
    keyed(Phase::Active).map(|(i, _)| i).next().or_else(|| {
        keyed(Phase::Prepared)
            .max_by_key(|(_, (g, _))| g.id)
            .map(|(i, _)| i)
    })
}

/// How long after a handover was due another podca process may still have signed with the CA it
/// replaced: every process retires that CA at its first step from the end of the successor's
/// window, on a clock up to [`super::seal::MAX_CLOCK_SKEW`] off this one's. Twice the skew
/// covers the skew and a late timer.
pub(super) const HANDOVER_SLACK: Duration = Duration::minutes(10);

/// A handover the recorded generations show was due long before `now`, to be taken with the
/// times it was due at rather than `now` (see [`overdue_handover`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Handover {
    /// The prepared generation that takes over, activated at `due`.
    pub(super) activate: u32,
    /// The active generation it replaces, retired at `retired_at`.
    pub(super) retire: u32,
    /// The end of the prepared generation's window.
    pub(super) due: OffsetDateTime,
    /// `due` plus [`HANDOVER_SLACK`]: no process signed with `retire` after this instant.
    pub(super) retired_at: OffsetDateTime,
}

/// An active generation whose key this process does not hold, and the newest prepared one,
/// whose window ended more than [`HANDOVER_SLACK`] before `now`: a history that a restarted
/// replica reads late, or an older genuine history replayed. Whoever held the active CA's key
/// retired it when the window ended (a genuine history never records a prepared generation whose
/// window had ended when it was recorded: the same step activates it), or was not running and
/// signed nothing since. So its last certificate expires the longest leaf lifetime after the
/// slack, not after `now`: retiring it at `now` would publish again, for a whole leaf lifetime,
/// an anchor that was dropped long ago. `None`: the planner retires it at `now`, as before (a
/// key this process holds may have signed until now). Each item is a generation and whether
/// this process holds its key.
pub(super) fn overdue_handover<'a>(
    generations: impl IntoIterator<Item = (&'a Generation, bool)> + Clone,
    propagation: Duration,
    now: OffsetDateTime,
) -> Option<Handover> {
    let (active, keyed) = generations
        .clone()
        .into_iter()
        .find(|(g, _)| g.phase == Phase::Active)?;
    let prepared = generations
        .into_iter()
        .map(|(g, _)| g)
        .filter(|g| g.phase == Phase::Prepared)
        .max_by_key(|g| g.id)?;
    let due = window_end(prepared, propagation);
    let retired_at = due.saturating_add(HANDOVER_SLACK);
    let active_since = active.activated_at.unwrap_or(active.prepared_at);
    (!keyed && prepared.activate_asap && retired_at <= now && active_since <= due).then_some(
        Handover {
            activate: prepared.id,
            retire: active.id,
            due,
            retired_at,
        },
    )
}

/// The id of a new generation: one more than any recorded.
pub(super) fn next_id<'a>(generations: impl IntoIterator<Item = &'a Generation>) -> u32 {
    // Saturating: a recorded id this large is refused as impossible before it gets here.
    generations
        .into_iter()
        .map(|g| g.id)
        .max()
        .unwrap_or(0)
        .saturating_add(1)
}

/// When a step is next due (not before `now`): a prepared CA's window ends, or a retired
/// anchor may go.
pub(super) fn next_event<'a>(
    generations: impl IntoIterator<Item = &'a Generation>,
    propagation: Duration,
    now: OffsetDateTime,
) -> Option<OffsetDateTime> {
    generations
        .into_iter()
        .filter_map(|g| match g.phase {
            Phase::Prepared => Some(window_end(g, propagation)),
            Phase::Retired => Some(g.anchor_needed_until()),
            Phase::Active | Phase::Dropped => None,
        })
        .map(|t| t.max(now))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const T0: OffsetDateTime = datetime!(2027-01-01 0:00 UTC);
    const WINDOW: Duration = Duration::hours(1);

    fn generation(id: u32, phase: Phase) -> Generation {
        Generation {
            id,
            phase,
            ca_not_before: T0,
            ca_not_after: T0 + Duration::days(30),
            prepared_at: T0 + Duration::hours(i64::from(id)),
            activated_at: None,
            retired_at: None,
            activate_asap: true,
            last_leaf_not_after: None,
        }
    }

    #[test]
    fn gates_follow_the_phase() {
        for (phase, want) in [
            (Phase::Active, Gate::OpenFrom(OffsetDateTime::UNIX_EPOCH)),
            (Phase::Prepared, Gate::OpenFrom(T0 + Duration::hours(3))),
            (Phase::Retired, Gate::Retired),
            (Phase::Dropped, Gate::Retired),
        ] {
            assert_eq!(gate(&generation(2, phase), WINDOW), want, "{phase}");
        }
    }

    /// Name, generations as (id, phase, key held), index of the signer.
    type Row<'a> = (&'a str, &'a [(u32, Phase, bool)], Option<usize>);

    #[test]
    fn signer_table() {
        use Phase::{Active, Dropped, Prepared, Retired};
        #[rustfmt::skip]
        let rows: [Row<'_>; 7] = [
            ("nothing recorded", &[], None),
            ("the keyed active CA", &[(1, Retired, true), (2, Active, true), (3, Prepared, true)], Some(1)),
            ("no key for the active: newest keyed prepared", &[(2, Active, false), (3, Prepared, true), (4, Prepared, true)], Some(2)),
            ("newest by id, not by position", &[(4, Prepared, true), (3, Prepared, true)], Some(0)),
            ("an unkeyed prepared CA never signs", &[(2, Active, false), (3, Prepared, false)], None),
            ("retired and dropped never sign", &[(1, Retired, true), (2, Dropped, true)], None),
            ("the only keyed prepared CA", &[(1, Dropped, false), (2, Prepared, true)], Some(1)),
        ];
        for (name, entries, want) in rows {
            let generations: Vec<(Generation, bool)> = entries
                .iter()
                .map(|&(id, phase, keyed)| (generation(id, phase), keyed))
                .collect();
            let got = signer(generations.iter().map(|(g, keyed)| (g, *keyed)));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_window_past_the_end_of_time_never_opens_and_never_panics() {
        let mut g = generation(2, Phase::Prepared);
        g.prepared_at = OffsetDateTime::new_utc(time::Date::MAX, time::Time::MIDNIGHT);
        let end_of_time = time::PrimitiveDateTime::MAX.assume_utc();
        assert_eq!(gate(&g, WINDOW * 48), Gate::OpenFrom(end_of_time));
        assert_eq!(next_event(&[g], WINDOW * 48, T0), Some(end_of_time));
    }

    /// Each row trips one condition of an overdue handover; `generation(id, _)` is prepared at
    /// T0 + id hours, so prepared generation 3's window ends at T0 + 4 h.
    #[test]
    fn overdue_handover_table() {
        use Phase::{Active, Prepared, Retired};
        let due = T0 + Duration::hours(4);
        let past_slack = due + HANDOVER_SLACK;
        let taken = Some(Handover {
            activate: 3,
            retire: 2,
            due,
            retired_at: past_slack,
        });
        let mut not_asap = generation(3, Prepared);
        not_asap.activate_asap = false;
        let mut active_later = generation(2, Active);
        active_later.activated_at = Some(due + Duration::SECOND);
        let g = generation;
        type Row = (
            &'static str,
            Vec<(Generation, bool)>,
            OffsetDateTime,
            Option<Handover>,
        );
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            ("unkeyed active, window over plus the slack", vec![(g(2, Active), false), (g(3, Prepared), true)], past_slack, taken),
            ("also when nobody holds the prepared key", vec![(g(2, Active), false), (g(3, Prepared), false)], past_slack, taken),
            ("the newest prepared one", vec![(g(1, Retired), false), (g(2, Active), false), (g(3, Prepared), true)], past_slack, taken),
            ("within the slack: the planner's now", vec![(g(2, Active), false), (g(3, Prepared), true)], past_slack - Duration::SECOND, None),
            ("this process holds the active key", vec![(g(2, Active), true), (g(3, Prepared), true)], past_slack, None),
            ("no prepared generation", vec![(g(2, Active), false)], past_slack, None),
            ("no active generation", vec![(g(3, Prepared), true)], past_slack, None),
            ("a scheduled, not an as-soon-as-possible, handover", vec![(g(2, Active), false), (not_asap, true)], past_slack, None),
            ("active only after the window ended", vec![(active_later, false), (g(3, Prepared), true)], past_slack, None),
        ];
        for (name, generations, now, want) in rows {
            let got = overdue_handover(generations.iter().map(|(g, k)| (g, *k)), WINDOW, now);
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn ids_count_up_from_one() {
        assert_eq!(next_id(&[]), 1);
        let recorded = [generation(3, Phase::Retired), generation(1, Phase::Dropped)];
        assert_eq!(next_id(&recorded), 4);
    }

    #[test]
    fn next_event_is_the_earliest_due_step_and_never_past() {
        let prepared = generation(2, Phase::Prepared); // window ends T0 + 3 h
        let mut retired = generation(1, Phase::Retired);
        retired.activated_at = Some(T0);
        retired.last_leaf_not_after = Some(T0 + Duration::hours(5));
        let active = generation(3, Phase::Active);
        let dropped = generation(4, Phase::Dropped);
        assert_eq!(
            next_event(&[active.clone(), dropped.clone()], WINDOW, T0),
            None
        );
        assert_eq!(
            next_event(&[retired.clone(), prepared.clone(), active], WINDOW, T0),
            Some(T0 + Duration::hours(3))
        );
        assert_eq!(
            next_event(&[retired.clone(), dropped], WINDOW, T0),
            Some(T0 + Duration::hours(5))
        );
        let late = T0 + Duration::hours(4);
        assert_eq!(
            next_event(&[retired, prepared], WINDOW, late),
            Some(late),
            "an overdue step is due now"
        );
    }
}
