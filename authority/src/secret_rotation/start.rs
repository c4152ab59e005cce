//! Which history a replica starts from: the history ConfigMap's, or podca's **copy** of the last
//! history it wrote, kept where a ConfigMap writer in podca's namespace cannot reach (an
//! annotation on podca's ClusterTrustBundles; `podca_controller::secret_ca` reads and writes
//! it). Both are sealed and verified alike ([`super::seal::open`]); the copy only adds a second
//! witness, so that a forged, replayed, foreign or deleted ConfigMap at start leaves the state
//! exactly where the genuine history would, instead of losing the anchors it kept.
//!
//! The rule ([`choose`]): of the histories that verify, the one with the highest sequence wins.
//!
//! * The ConfigMap verifies and no copy is newer: the ConfigMap (the normal case; a copy may lag
//!   behind by a write that had not reached the ClusterTrustBundle yet).
//! * The ConfigMap verifies but a copy is newer: the ConfigMap is an older genuine history put
//!   back (a replay), reported as such; the copy.
//! * The ConfigMap is rejected, foreign (no podca label) or gone while a copy verifies: reported;
//!   the copy.
//! * Neither verifies: the Secret's CA alone with a hold
//!   ([`SecretRotation::distrust_history`]); with no ConfigMap and no copy at all, a first start.

use time::OffsetDateTime;

use super::contents::SecretCaContents;
use super::seal::{self, Opened, Rejection, Sealed};
use super::state::{SecretRotation, Settings};

/// The history ConfigMap as read at start, not yet verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored<'a> {
    /// There is no history ConfigMap (or it holds no `history.json`).
    Missing,
    /// A ConfigMap of that name without podca's label: someone else's, never used.
    NotOwned,
    /// podca's ConfigMap: `history.json` and, when present, `history.seal`.
    Text {
        history_json: &'a str,
        seal_json: Option<&'a str>,
    },
}

/// Where the starting state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// No history anywhere: the first start with this Secret.
    FirstStart,
    /// The history ConfigMap verified.
    ConfigMap,
    /// The ConfigMap was not usable; podca's copy verified.
    Copy,
    /// Nothing verified: the Secret's CA alone, held for one propagation window.
    Distrusted,
}

/// The state to start from and what to report.
#[derive(Debug)]
pub struct Start {
    pub state: SecretRotation,
    pub source: Source,
    /// Why the ConfigMap was not used (to log, count and record as an Event); `None` when it was,
    /// or when there is neither a ConfigMap nor a copy.
    pub rejected: Option<Rejection>,
    /// Why copies were not used (logged; a copy is written only by podca and cluster
    /// administrators, so one failing is a bug or an older Secret, not the common attack).
    pub copies_rejected: Vec<Rejection>,
}

/// Verifies the ConfigMap and every copy against the Secret's CA `contents` at `now` and builds
/// the state to start from (see the module documentation). A state started from a copy, or with
/// the ConfigMap rejected, must be written back: [`SecretRotation::needs_writing`] says so.
pub fn choose(
    settings: Settings,
    contents: SecretCaContents,
    stored: Stored<'_>,
    copies: &[Sealed],
    now: OffsetDateTime,
) -> Start {
    let open = |history_json: &str, seal_json: Option<&str>| {
        seal::open(
            history_json,
            seal_json,
            &settings.secret,
            contents.ca(),
            None,
            settings.schedule.propagation(),
            now,
        )
    };
    let mut copies_rejected = vec![];
    let mut newest_copy: Option<Opened> = None;
    for copy in copies {
        match open(&copy.history_json, Some(&copy.seal_json)) {
            Ok(opened)
                if newest_copy
                    .as_ref()
                    .is_none_or(|n| opened.sequence > n.sequence) =>
            {
                newest_copy = Some(opened);
            }
            Ok(_) => {}
            Err(rejection) => copies_rejected.push(rejection),
        }
    }
    let configmap = match stored {
        Stored::Missing => None,
        Stored::NotOwned => Some(Err(Rejection::NotOwned)),
        Stored::Text {
            history_json,
            seal_json,
        } => Some(open(history_json, seal_json)),
    };
    let (opened, source, rejected) = match (configmap, newest_copy) {
        (None, None) => (None, Source::FirstStart, None),
        (None, Some(copy)) => {
            let missing = Rejection::Missing {
                sequence: copy.sequence,
            };
            (Some(copy), Source::Copy, Some(missing))
        }
        (Some(Ok(cm)), Some(copy)) if copy.sequence > cm.sequence => {
            let replayed = Rejection::Replayed {
                found: cm.sequence,
                seen: copy.sequence,
            };
            (Some(copy), Source::Copy, Some(replayed))
        }
        (Some(Ok(cm)), _) => (Some(cm), Source::ConfigMap, None),
        (Some(Err(rejection)), Some(copy)) => (Some(copy), Source::Copy, Some(rejection)),
        (Some(Err(rejection)), None) => (None, Source::Distrusted, Some(rejection)),
    };
    let state = match (opened, source) {
        (Some(opened), Source::Copy) => {
            let mut state = SecretRotation::from_opened(settings, opened, contents);
            // The ConfigMap does not hold this history: the leader writes it back.
            state.rewrite();
            state
        }
        (Some(opened), _) => SecretRotation::from_opened(settings, opened, contents),
        (None, Source::Distrusted) => {
            let mut state = SecretRotation::new(settings, vec![], contents);
            state.distrust_history(now);
            state
        }
        (None, _) => SecretRotation::new(settings, vec![], contents),
    };
    Start {
        state,
        source,
        rejected,
        copies_rejected,
    }
}
