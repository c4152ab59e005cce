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

/// The fingerprints of the generations a sealed history lists.
fn listed(sealed: &Sealed) -> Vec<String> {
    let history: History = serde_json::from_str(&sealed.history_json).expect("json");
    history
        .generations
        .iter()
        .map(|r| r.fingerprint.clone())
        .collect()
}

/// The scene carried on by its leader: B active when its window ended, A retired then and
/// dropped once its last leaf expired. The history sealed just after the handover (A retired,
/// B active), the one sealed after the drop, and when A was dropped.
fn carried_on(s: &Scene) -> (Sealed, Sealed, OffsetDateTime) {
    let handover = s.changed + WINDOW;
    s.sim.set(handover);
    let opened = seal::open(
        &s.genuine.history_json,
        Some(&s.genuine.seal_json),
        SECRET,
        s.b.parse(&s.sim).ca(),
        None,
        WINDOW,
        handover,
    );
    let mut leader =
        SecretRotation::from_opened(settings(), opened.expect("genuine"), s.b.parse(&s.sim));
    leader.step(handover);
    let retired = leader.seal(handover).expect("sealed");
    leader.written();
    let dropped_at = handover + settings().max_leaf_lifetime;
    s.sim.set(dropped_at);
    let stepped = leader.step(dropped_at);
    assert_eq!(stepped.steps, [podca_signer::rotation::Step::Drop(1)]);
    let after_drop = leader.seal(dropped_at).expect("sealed");
    (retired, after_drop, dropped_at)
}

#[test]
fn after_the_drop_the_sealed_history_no_longer_lists_the_dropped_generation() {
    let s = scene();
    let (retired, after_drop, _) = carried_on(&s);
    assert_eq!(listed(&retired), [s.a.fingerprint(), s.b.fingerprint()]);
    assert_eq!(
        listed(&after_drop),
        [s.b.fingerprint()],
        "the seal vouches for a generation that was dropped"
    );
    assert!(!after_drop.history_json.contains(&s.a.tls_crt));
}

/// The attack: a ConfigMap writer (or, for the copy, a holder of `attest`) puts back a genuine
/// history sealed before A's drop, one that still lists A as the active CA, and waits for a
/// restart. The Secret's key sealed it (B was the Secret then as now), so it verifies.
#[test]
fn a_replayed_seal_from_before_the_drop_never_publishes_the_dropped_root_again() {
    use super::start::Source;
    let s = scene();
    let (retired, after_drop, dropped_at) = carried_on(&s);
    let restarted = dropped_at + Duration::hours(1);
    // What the genuine history gives: B alone, signing.
    let genuine = (s.b.fingerprint(), vec![s.b.anchor()], None);
    assert_eq!(start(&s, &after_drop, restarted), (None, genuine.clone()));
    #[rustfmt::skip]
    let rows: [(&str, &Sealed); 2] = [
        ("A active, B prepared (sealed in B's window)", &s.genuine),
        ("A retired, B active (sealed at the handover)", &retired),
    ];
    for (name, old) in rows {
        let (rejection, got) = start(&s, old, restarted);
        assert_eq!(rejection, None, "{name}: a genuine seal verifies");
        assert_eq!(got, genuine, "{name}: the dropped root is published again");
        // Put back as podca's copy too (no newer witness anywhere): the same.
        assert_eq!(
            choose_at(&s, text(old), std::slice::from_ref(old), restarted),
            (Source::ConfigMap, None, genuine.clone()),
            "{name}: replayed as ConfigMap and copy"
        );
        // Beside the newer copy, the replay is refused as such.
        assert_eq!(
            choose_at(&s, text(old), std::slice::from_ref(&after_drop), restarted),
            (Source::Copy, Some("replayed"), genuine.clone()),
            "{name}: replayed beside the newer copy"
        );
    }
    // Restarted from the old history, the next seal does not list A either: the replay is not
    // carried forward.
    s.sim.set(restarted);
    let opened = seal::open(
        &s.genuine.history_json,
        Some(&s.genuine.seal_json),
        SECRET,
        s.b.parse(&s.sim).ca(),
        None,
        WINDOW,
        restarted,
    );
    let mut state =
        SecretRotation::from_opened(settings(), opened.expect("genuine"), s.b.parse(&s.sim));
    state.step(restarted);
    assert_eq!(
        listed(&state.seal(restarted).expect("sealed")),
        [s.b.fingerprint()]
    );
}

/// A restart soon after the handover was due (its slack not yet over): A may have signed until
/// a moment ago in another replica, so it is retired now and its anchor kept a leaf lifetime.
#[test]
fn a_restart_just_after_the_window_keeps_the_replaced_root() {
    let s = scene();
    let restarted = s.changed + WINDOW + Duration::minutes(9);
    let (rejection, got) = start(&s, &s.genuine, restarted);
    assert_eq!(rejection, None);
    assert_eq!(
        got,
        (s.b.fingerprint(), vec![s.a.anchor(), s.b.anchor()], None)
    );
    // Past the slack, but within a leaf lifetime of the handover: still kept.
    let later = s.changed + WINDOW + Duration::hours(23);
    let (_, got) = start(&s, &s.genuine, later);
    assert_eq!(
        got,
        (s.b.fingerprint(), vec![s.a.anchor(), s.b.anchor()], None)
    );
}

#[test]
fn the_sealed_history_stays_bounded_through_many_rotations() {
    let sim = Sim::at(T0);
    let max_leaf = Duration::minutes(30);
    let settings = Settings {
        max_leaf_lifetime: max_leaf,
        ..settings()
    };
    let mut leader = SecretRotation::new(settings, vec![], Ca::root("ca-0").parse(&sim));
    let mut now = T0;
    leader.step(now);
    let mut largest = 0;
    // About 1.5 KiB a generation: kept, 150 would be more than the 192 KiB podca's copy on a
    // ClusterTrustBundle may hold, and the copy would no longer be kept.
    for rotation in 1..=150 {
        now += Duration::minutes(1);
        sim.set(now);
        let contents = Ca::root(&format!("ca-{rotation}")).parse(&sim);
        leader.observe(Some(&rotation.to_string()), || Ok(contents));
        leader.step(now);
        now += WINDOW;
        sim.set(now);
        leader.step(now);
        let during = leader.seal(now).expect("sealed");
        now += max_leaf;
        sim.set(now);
        leader.step(now);
        let after = leader.seal(now).expect("sealed");
        leader.written();
        assert_eq!(listed(&during).len(), 2, "rotation {rotation}: old and new");
        assert_eq!(listed(&after).len(), 1, "rotation {rotation}: the new one");
        largest = largest.max(during.history_json.len() + during.seal_json.len());
    }
    assert!(largest < 8 * 1024, "{largest} bytes");
    let opened = leader.open(
        &leader.seal(now).expect("sealed").history_json,
        Some(&leader.seal(now).expect("sealed").seal_json),
        now,
    );
    assert_eq!(
        opened.map(|o| o.recorded[0].record.generation.id),
        Ok(151),
        "ids keep counting up"
    );
}

/// Backward compatibility: a history sealed by the previous version, which kept dropped
/// generations, verifies and starts as before; the dropped one is left out from then on.
#[test]
fn a_history_of_the_previous_version_with_dropped_generations_still_starts() {
    let s = scene();
    let restarted = s.changed + Duration::minutes(5);
    let (_, genuine) = start(&s, &s.genuine, restarted);
    let x = Ca::root("x");
    let mut old: History = serde_json::from_str(&s.genuine.history_json).expect("json");
    let mut dropped = record_of(&x, 9, &s.sim);
    dropped.generation.phase = Phase::Dropped;
    old.generations.insert(0, dropped);
    // The seal format is unchanged: this is what the previous version wrote.
    let stored = seal::seal(&old, 5, None, &s.b.parse(&s.sim)).expect("sealed");
    assert_eq!(listed(&stored).len(), 3);
    let (rejection, got) = start(&s, &stored, restarted);
    assert_eq!((rejection, got), (None, genuine));
    s.sim.set(restarted);
    let opened = seal::open(
        &stored.history_json,
        Some(&stored.seal_json),
        SECRET,
        s.b.parse(&s.sim).ca(),
        None,
        WINDOW,
        restarted,
    );
    let mut state =
        SecretRotation::from_opened(settings(), opened.expect("verifies"), s.b.parse(&s.sim));
    state.step(restarted);
    let next = state.seal(restarted).expect("sealed");
    assert_eq!(listed(&next), [s.a.fingerprint(), s.b.fingerprint()]);
    // Its sequence continues the old one's (a replay of the old one stays refused).
    let mut standby = SecretRotation::new(settings(), vec![], s.b.parse(&s.sim));
    standby.adopt_opened(
        standby
            .open(&next.history_json, Some(&next.seal_json), restarted)
            .expect("verifies"),
    );
    assert_eq!(
        standby
            .open(&stored.history_json, Some(&stored.seal_json), restarted)
            .map(|_| ()),
        Err(Rejection::Replayed { found: 5, seen: 6 })
    );
}
