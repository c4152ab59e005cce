//! The history's seal against forgeries: every forged or impossible variant of a genuine
//! history is rejected with its own reason, and leaves the state machine exactly where the
//! genuine history would (a running replica) or on the Secret's CA alone with a hold (a start),
//! never with a forged anchor nor signing earlier than the genuine history allows.

use podca_signer::rotation::{Phase, Schedule};
use time::{Duration, OffsetDateTime};

use super::fixtures::{Ca, Sim, T0};
use super::seal::{self, MAX_CLOCK_SKEW};
use super::*;

const WINDOW: Duration = Duration::minutes(15);
const SECRET: &str = "podca/ca";

fn settings() -> Settings {
    Settings {
        secret: SECRET.into(),
        schedule: Schedule::default(),
        max_leaf_lifetime: Duration::hours(24),
    }
}

/// A rotation caught in its window: A active since T0, B (the Secret now) prepared at
/// `changed`; the history as the leader sealed it then.
struct Scene {
    sim: Sim,
    a: Ca,
    b: Ca,
    changed: OffsetDateTime,
    genuine: Sealed,
}

fn scene() -> Scene {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let b = Ca::root("b");
    let mut leader = SecretRotation::new(settings(), vec![], a.parse(&sim));
    leader.step(T0);
    leader.written();
    let changed = T0 + Duration::minutes(1);
    sim.set(changed);
    let contents = b.parse(&sim);
    leader.observe(Some("2"), || Ok(contents));
    leader.step(changed);
    let genuine = leader.seal(changed).expect("sealed");
    Scene {
        sim,
        a,
        b,
        changed,
        genuine,
    }
}

/// What the handle would hold: signing CA, anchors, gated until.
type Outcome = (String, Vec<String>, Option<OffsetDateTime>);

fn outcome(install: &Install) -> Outcome {
    (
        install.ca.fingerprint().to_owned(),
        install.anchors.iter().map(|a| a.fingerprint()).collect(),
        install.gated_until,
    )
}

/// A replica starting at `now` from `stored`, as the Secret backend's driver does: a history
/// that verifies is used, any other is distrusted.
fn start(scene: &Scene, stored: &Sealed, now: OffsetDateTime) -> (Option<Rejection>, Outcome) {
    scene.sim.set(now);
    let contents = scene.b.parse(&scene.sim);
    let opened = seal::open(
        &stored.history_json,
        Some(&stored.seal_json),
        SECRET,
        contents.ca(),
        None,
        WINDOW,
        now,
    );
    let (rejection, mut state) = match opened {
        Ok(opened) => (
            None,
            SecretRotation::from_opened(settings(), opened, contents),
        ),
        Err(r) => {
            let mut state = SecretRotation::new(settings(), vec![], contents);
            state.distrust_history(now);
            (Some(r), state)
        }
    };
    let install = state.step(now).install.expect("installed at start");
    (rejection, outcome(&install))
}

/// `genuine`'s history changed by `edit`, keeping the genuine seal.
fn edited(genuine: &Sealed, edit: impl FnOnce(&mut History)) -> Sealed {
    let mut history: History = serde_json::from_str(&genuine.history_json).expect("genuine");
    edit(&mut history);
    Sealed {
        history_json: serde_json::to_string_pretty(&history).expect("encodes"),
        seal_json: genuine.seal_json.clone(),
    }
}

/// A history sealed by `by` (an attacker's CA, or the genuine key for impossible values).
fn sealed_by(history: &History, by: &Ca, sim: &Sim) -> Sealed {
    seal::seal(history, 7, None, &by.parse(sim)).expect("sealed")
}

/// A record of `ca`, retired long ago (an anchor that would stay published for a day).
fn record_of(ca: &Ca, id: u32, sim: &Sim) -> Record {
    let contents = ca.parse(sim);
    Record {
        generation: podca_signer::rotation::Generation {
            id,
            phase: Phase::Retired,
            ca_not_before: contents.ca().certificate().not_before(),
            ca_not_after: contents.ca().not_after(),
            prepared_at: T0,
            activated_at: Some(T0),
            retired_at: Some(T0),
            activate_asap: true,
            last_leaf_not_after: Some(T0 + Duration::days(1)),
        },
        fingerprint: contents.ca().fingerprint().to_owned(),
        subject: contents.ca().certificate().subject().to_owned(),
        chain_pem: contents.chain_pem.clone(),
        anchors_pem: contents.anchors_pem.clone(),
    }
}

#[test]
fn a_genuine_history_verifies_and_a_restart_keeps_its_window() {
    let s = scene();
    let restarted = s.changed + Duration::minutes(5);
    let (rejection, got) = start(&s, &s.genuine, restarted);
    assert_eq!(rejection, None);
    assert_eq!(
        got,
        (
            s.b.fingerprint(),
            vec![s.a.anchor(), s.b.anchor()],
            Some(s.changed + WINDOW)
        )
    );
}

#[test]
fn forged_histories_are_rejected_and_never_widen_trust_or_shorten_the_window() {
    let s = scene();
    let restarted = s.changed + Duration::minutes(5);
    let mallory = Ca::root("mallory");
    let far = OffsetDateTime::new_utc(time::Date::MAX, time::Time::MIDNIGHT);
    let genuine_history: History = serde_json::from_str(&s.genuine.history_json).expect("json");
    let mut with_mallory = genuine_history.clone();
    with_mallory
        .generations
        .insert(0, record_of(&mallory, 9, &s.sim));
    let mut far_future = genuine_history.clone();
    far_future.generations[1].generation.prepared_at = far;
    #[rustfmt::skip]
    let rows: Vec<(&str, Sealed, &str)> = vec![
        ("extra root under the genuine seal",
            edited(&s.genuine, |h| h.generations.push(record_of(&mallory, 9, &s.sim))), "bad_signature"),
        ("extra root sealed by its own CA", sealed_by(&with_mallory, &mallory, &s.sim), "unknown_signer"),
        ("skipped window", edited(&s.genuine, |h| {
            h.generations[1].generation.prepared_at = T0 - Duration::days(1);
        }), "bad_signature"),
        ("dropped live root", edited(&s.genuine, |h| { h.generations.remove(0); }), "bad_signature"),
        ("far-future times", edited(&s.genuine, |h| {
            h.generations[1].generation.prepared_at = far;
        }), "bad_signature"),
        ("far-future times under the Secret's own key", sealed_by(&far_future, &s.b, &s.sim),
            "impossible_values"),
        ("an emptied seal", Sealed { seal_json: String::new(), ..s.genuine.clone() }, "seal_unreadable"),
        ("seal of another Secret", Sealed {
            history_json: s.genuine.history_json.replace("podca/ca", "other/ca"),
            ..s.genuine.clone()
        }, "bad_signature"),
    ];
    // A start without a trusted history: the Secret's CA, its anchor alone, held one window.
    let distrusted = (
        s.b.fingerprint(),
        vec![s.b.anchor()],
        Some(restarted + WINDOW),
    );
    let (_, genuine) = start(&s, &s.genuine, restarted);
    for (name, stored, reason) in rows {
        let (rejection, got) = start(&s, &stored, restarted);
        let rejection = rejection.unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(rejection.reason(), reason, "{name}: {rejection}");
        assert_eq!(got, distrusted, "{name}");
        assert!(!got.1.contains(&mallory.anchor()), "{name}: forged anchor");
        assert!(
            got.2 >= genuine.2,
            "{name}: signs earlier than the genuine history allows"
        );
    }
    let missing = seal::open(
        &s.genuine.history_json,
        None,
        SECRET,
        s.b.parse(&s.sim).ca(),
        None,
        WINDOW,
        restarted,
    );
    assert_eq!(missing, Err(Rejection::Unsigned));
}

#[test]
fn a_running_replica_keeps_the_genuine_state_through_forgeries_and_replays() {
    let s = scene();
    let now = s.changed + Duration::minutes(2);
    s.sim.set(now);
    let (_, genuine) = start(&s, &s.genuine, now);
    let mut standby = SecretRotation::new(settings(), vec![], s.b.parse(&s.sim));
    let opened = standby.open(&s.genuine.history_json, Some(&s.genuine.seal_json), now);
    standby.adopt_opened(opened.expect("genuine verifies"));
    let first = standby.step(now).install.expect("installed");
    assert_eq!(outcome(&first), genuine);

    // An older genuine history, replayed: verified by its seal, refused by its sequence.
    let newer = standby.seal(now).expect("sealed");
    let opened = standby.open(&newer.history_json, Some(&newer.seal_json), now);
    standby.adopt_opened(opened.expect("newer verifies"));
    let replay = standby.open(&s.genuine.history_json, Some(&s.genuine.seal_json), now);
    assert_eq!(
        replay.map(|_| ()),
        Err(Rejection::Replayed { found: 2, seen: 3 })
    );
    let forged = edited(&s.genuine, |h| {
        h.generations.remove(0);
    });
    let refused = standby.open(&forged.history_json, Some(&forged.seal_json), now);
    assert_eq!(refused.map(|_| ()), Err(Rejection::BadSignature));
    // Refused histories are not adopted: nothing to install, the same CA and anchors.
    assert!(standby.step(now).install.is_none());
}

#[test]
fn a_history_sealed_under_the_same_root_verifies_after_the_intermediate_changed() {
    let sim = Sim::at(T0);
    let root = Ca::root("root");
    let first = root.intermediate("one");
    let second = root.intermediate("two");
    let mut leader = SecretRotation::new(settings(), vec![], first.parse(&sim));
    leader.step(T0);
    let stored = leader.seal(T0).expect("sealed");
    let open_with = |ca: &Ca| {
        seal::open(
            &stored.history_json,
            Some(&stored.seal_json),
            SECRET,
            ca.parse(&sim).ca(),
            None,
            WINDOW,
            T0,
        )
        .map(|o| o.recorded.len())
    };
    assert_eq!(open_with(&second), Ok(1), "vouched for by the shared root");
    assert_eq!(
        open_with(&Ca::root("stranger")),
        Err(Rejection::UnknownSigner {
            subject: first.subject()
        })
    );
}

#[test]
fn every_key_type_seals_and_verifies() {
    let sim = Sim::at(T0);
    for alg in [
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_ED25519,
        &rcgen::PKCS_RSA_SHA256,
    ] {
        let ca = Ca::root_with(alg, "any");
        let mut state = SecretRotation::new(settings(), vec![], ca.parse(&sim));
        state.step(T0);
        let stored = state.seal(T0).expect("sealed");
        let opened = state.open(&stored.history_json, Some(&stored.seal_json), T0);
        assert_eq!(opened.map(|o| o.sequence), Ok(1), "{alg:?}");
    }
}

#[test]
fn impossible_values_are_refused_each_by_its_own_check() {
    let s = scene();
    let now = s.changed;
    let history: History = serde_json::from_str(&s.genuine.history_json).expect("json");
    type Edit = fn(&mut History);
    #[rustfmt::skip]
    let rows: [(&str, Edit, &str); 8] = [
        ("an event in the future", |h| h.generations[1].generation.prepared_at += Duration::hours(1),
            "prepared_at"),
        ("an id recorded twice", |h| h.generations[1].generation.id = 1, "recorded twice"),
        ("an id that could overflow", |h| h.generations[1].generation.id = u32::MAX, "too large"),
        ("active without activation", |h| h.generations[0].generation.activated_at = None,
            "active contradicts"),
        ("activated before prepared", |h| {
            h.generations[0].generation.activated_at = Some(T0 - Duration::days(1));
        }, "active contradicts"),
        ("a validity not the certificate's", |h| {
            h.generations[0].generation.ca_not_after += Duration::days(365);
        }, "validity"),
        ("a fingerprint not the certificate's", |h| h.generations[0].fingerprint = "00".into(),
            "fingerprint"),
        ("two active generations", |h| {
            let g = &mut h.generations[1].generation;
            g.phase = Phase::Active;
            g.activated_at = Some(g.prepared_at);
        }, "2 active"),
    ];
    for (name, edit, detail) in rows {
        let mut h = history.clone();
        edit(&mut h);
        let stored = sealed_by(&h, &s.b, &s.sim);
        let got = seal::open(
            &stored.history_json,
            Some(&stored.seal_json),
            SECRET,
            s.b.parse(&s.sim).ca(),
            None,
            WINDOW,
            now,
        );
        match got {
            Err(Rejection::Impossible { detail: d }) => assert!(d.contains(detail), "{name}: {d}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    // Clock skew between replicas is tolerated.
    let mut h = history.clone();
    h.generations[1].generation.prepared_at = now + MAX_CLOCK_SKEW;
    let stored = sealed_by(&h, &s.b, &s.sim);
    let skewed = seal::open(
        &stored.history_json,
        Some(&stored.seal_json),
        SECRET,
        s.b.parse(&s.sim).ca(),
        None,
        WINDOW,
        now,
    );
    assert!(skewed.is_ok(), "{skewed:?}");
}

/// A replica starting at `now` through [`super::start::choose`]: where its state came from, the
/// reason the ConfigMap was not used, and what the handle would hold.
fn choose_at(
    scene: &Scene,
    stored: super::start::Stored<'_>,
    copies: &[Sealed],
    now: OffsetDateTime,
) -> (super::start::Source, Option<&'static str>, Outcome) {
    scene.sim.set(now);
    let super::start::Start {
        mut state,
        source,
        rejected,
        copies_rejected,
    } = super::start::choose(settings(), scene.b.parse(&scene.sim), stored, copies, now);
    assert!(copies_rejected.is_empty(), "{copies_rejected:?}");
    let install = state.step(now).install.expect("installed at start");
    (source, rejected.map(|r| r.reason()), outcome(&install))
}

fn text(sealed: &Sealed) -> super::start::Stored<'_> {
    super::start::Stored::Text {
        history_json: &sealed.history_json,
        seal_json: Some(&sealed.seal_json),
    }
}

#[test]
fn at_start_podcas_copy_makes_every_forgery_equal_the_genuine_history() {
    use super::start::{Source, Stored};
    let s = scene();
    let restarted = s.changed + Duration::minutes(5);
    let mallory = Ca::root("mallory");
    let far = OffsetDateTime::new_utc(time::Date::MAX, time::Time::MIDNIGHT);
    let copy = std::slice::from_ref(&s.genuine);
    let (_, genuine) = start(&s, &s.genuine, restarted);
    assert_eq!(
        choose_at(&s, text(&s.genuine), copy, restarted),
        (Source::ConfigMap, None, genuine.clone())
    );
    // A newer genuine history in the copy than in the ConfigMap: the ConfigMap was put back.
    let mut standby = SecretRotation::new(settings(), vec![], s.b.parse(&s.sim));
    let opened = standby.open(
        &s.genuine.history_json,
        Some(&s.genuine.seal_json),
        restarted,
    );
    standby.adopt_opened(opened.expect("genuine verifies"));
    let newer = standby.seal(restarted).expect("sealed");
    let unsigned = Stored::Text {
        history_json: &s.genuine.history_json,
        seal_json: None,
    };
    let extra = edited(&s.genuine, |h| {
        h.generations.push(record_of(&mallory, 9, &s.sim))
    });
    let skipped = edited(&s.genuine, |h| {
        h.generations[1].generation.prepared_at = T0 - Duration::days(1);
    });
    let dropped = edited(&s.genuine, |h| {
        h.generations.remove(0);
    });
    let future = edited(&s.genuine, |h| {
        h.generations[1].generation.prepared_at = far
    });
    #[rustfmt::skip]
    let rows: Vec<(&str, Stored<'_>, &[Sealed], &str)> = vec![
        ("extra root", text(&extra), copy, "bad_signature"),
        ("extra root, seal removed", unsigned, copy, "unsigned"),
        ("skipped window", text(&skipped), copy, "bad_signature"),
        ("dropped live root", text(&dropped), copy, "bad_signature"),
        ("far-future times", text(&future), copy, "bad_signature"),
        ("replayed older genuine history", text(&s.genuine), std::slice::from_ref(&newer),
            "replayed"),
        ("a ConfigMap without podca's label", Stored::NotOwned, copy, "not_owned"),
        ("a deleted ConfigMap", Stored::Missing, copy, "missing"),
    ];
    for (name, stored, copies, reason) in rows {
        let (source, rejected, got) = choose_at(&s, stored, copies, restarted);
        assert_eq!(source, Source::Copy, "{name}");
        assert_eq!(rejected, Some(reason), "{name}");
        assert_eq!(got, genuine, "{name}: not what the genuine history gives");
    }
    // Without a copy: the forgery is distrusted as before, a missing ConfigMap is a first start.
    let distrusted = (
        s.b.fingerprint(),
        vec![s.b.anchor()],
        Some(restarted + WINDOW),
    );
    assert_eq!(
        choose_at(&s, text(&dropped), &[], restarted),
        (
            Source::Distrusted,
            Some("bad_signature"),
            distrusted.clone()
        )
    );
    assert_eq!(
        choose_at(&s, Stored::NotOwned, &[], restarted),
        (Source::Distrusted, Some("not_owned"), distrusted)
    );
    assert_eq!(
        choose_at(&s, Stored::Missing, &[], restarted),
        (
            Source::FirstStart,
            None,
            (s.b.fingerprint(), vec![s.b.anchor()], None)
        )
    );
}

#[test]
fn at_start_a_forged_or_older_copy_never_wins_over_the_genuine_configmap() {
    use super::start::{Source, choose};
    let s = scene();
    let restarted = s.changed + Duration::minutes(5);
    let (_, genuine) = start(&s, &s.genuine, restarted);
    let forged_copy = edited(&s.genuine, |h| {
        h.generations.remove(0);
    });
    s.sim.set(restarted);
    let started = choose(
        settings(),
        s.b.parse(&s.sim),
        text(&s.genuine),
        std::slice::from_ref(&forged_copy),
        restarted,
    );
    assert_eq!(
        (started.source, started.rejected),
        (Source::ConfigMap, None)
    );
    assert_eq!(
        started.copies_rejected,
        vec![Rejection::BadSignature],
        "the forged copy is reported"
    );
    let mut state = started.state;
    assert_eq!(
        outcome(&state.step(restarted).install.expect("installed")),
        genuine
    );
    assert!(!state.needs_writing(), "the ConfigMap holds this history");

    // A copy that lags one write behind the ConfigMap: the ConfigMap wins.
    let mut standby = SecretRotation::new(settings(), vec![], s.b.parse(&s.sim));
    let opened = standby.open(
        &s.genuine.history_json,
        Some(&s.genuine.seal_json),
        restarted,
    );
    standby.adopt_opened(opened.expect("genuine verifies"));
    let newer = standby.seal(restarted).expect("sealed");
    let (source, rejected, got) = choose_at(
        &s,
        text(&newer),
        std::slice::from_ref(&s.genuine),
        restarted,
    );
    assert_eq!((source, rejected), (Source::ConfigMap, None));
    assert_eq!(got, genuine);
    // A start from the copy is written back to the ConfigMap.
    let from_copy = choose(
        settings(),
        s.b.parse(&s.sim),
        super::start::Stored::Missing,
        std::slice::from_ref(&s.genuine),
        restarted,
    );
    assert!(from_copy.state.needs_writing());
}
