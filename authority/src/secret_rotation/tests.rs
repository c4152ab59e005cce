//! The Secret CA state machine through every branch, in simulated time: the exact steps, what
//! is installed, which keys sign, and what is recorded.

use std::sync::Arc;

use podca_signer::backend::contract;
use podca_signer::rotation::{Phase, Schedule, Step};
use podca_signer::{CaAlgorithm, CaKey, IssuingCa};
use time::{Duration, OffsetDateTime};

use super::fixtures::{Ca, Sim, T0};
use super::*;

const WINDOW: Duration = Duration::minutes(15);
const MAX_LEAF: Duration = Duration::hours(24);

fn settings() -> Settings {
    Settings {
        secret: "podca/ca".into(),
        schedule: Schedule::default(),
        max_leaf_lifetime: MAX_LEAF,
    }
}

/// What an install swaps in: the signing generation, the issuing CA's fingerprint, the
/// anchors' fingerprints, and until when the signer is gated.
type Seen = (u32, String, Vec<String>, Option<OffsetDateTime>);

fn seen(install: &Install) -> Seen {
    (
        install.generation,
        install.ca.fingerprint().to_owned(),
        install.anchors.iter().map(|a| a.fingerprint()).collect(),
        install.gated_until,
    )
}

fn expect(
    generation: u32,
    signer: &Ca,
    anchors: &[&Ca],
    gated_until: Option<OffsetDateTime>,
) -> Seen {
    (
        generation,
        signer.fingerprint(),
        anchors.iter().map(|a| a.anchor()).collect(),
        gated_until,
    )
}

/// Steps at `now` (the gated keys read the same time).
fn step(
    state: &mut SecretRotation,
    sim: &Sim,
    now: OffsetDateTime,
) -> (Vec<Step>, Option<Seen>, Option<Install>) {
    sim.set(now);
    let Stepped { steps, install } = state.step(now);
    (steps, install.as_ref().map(seen), install)
}

fn phases(state: &SecretRotation) -> Vec<(u32, Phase)> {
    state
        .history()
        .generations
        .iter()
        .map(|r| (r.generation.id, r.generation.phase))
        .collect()
}

/// The history as a restarted process (or a standby) reads it back.
fn reread(history: &History) -> Vec<Checked> {
    history
        .generations
        .iter()
        .cloned()
        .map(|r| Checked::new(r).expect("recorded anchors parse"))
        .collect()
}

fn signs(ca: &IssuingCa) -> bool {
    ca.key().sign(b"message").is_ok()
}

/// Observes a Secret holding `ca`; returns its CA (key gated) for checking who signs.
fn observe(
    state: &mut SecretRotation,
    sim: &Sim,
    version: &str,
    ca: &Ca,
) -> (Observation, Arc<IssuingCa>) {
    let contents = ca.parse(sim);
    let issuing = Arc::clone(contents.ca());
    (state.observe(Some(version), || Ok(contents)), issuing)
}

#[test]
fn first_start_with_empty_history_activates_at_once() {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let mut state = SecretRotation::new(settings(), vec![], a.parse(&sim));
    let (steps, seen, install) = step(&mut state, &sim, T0);
    assert_eq!(steps, [Step::Prepare, Step::Activate(1)]);
    assert_eq!(seen, Some(expect(1, &a, &[&a], None)));
    assert!(signs(&install.expect("installed").ca));
    assert!(state.needs_writing());
    let history = state.history();
    assert_eq!(history.secret, "podca/ca");
    let [record] = history.generations.as_slice() else {
        panic!("one generation: {history:?}");
    };
    assert_eq!(record.fingerprint, a.fingerprint());
    assert_eq!(record.subject, a.subject());
    assert_eq!(record.chain_pem, a.tls_crt);
    assert_eq!(record.anchors_pem, a.tls_crt, "the root is its own anchor");
    let g = &record.generation;
    assert_eq!(
        (g.phase, g.prepared_at, g.activated_at, g.activate_asap),
        (Phase::Active, T0, Some(T0), true)
    );
    assert_eq!(state.next_event(T0), None);
    assert_eq!(
        state.metric_values(T0),
        MetricValues {
            generations: vec![GenerationGauge {
                generation: 1,
                phase: Phase::Active,
                not_after: g.ca_not_after,
            }],
            next_rotation: None,
        }
    );
    state.written();
    let (steps, seen, _) = step(&mut state, &sim, T0 + Duration::minutes(1));
    assert_eq!((steps, seen), (vec![], None), "nothing more to do");
    assert!(!state.needs_writing());
}

#[test]
fn a_new_ca_is_prepared_activates_after_the_window_and_the_old_one_retires_then_drops() {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let b = Ca::root("b");
    let mut state = SecretRotation::new(settings(), vec![], a.parse(&sim));
    let (_, _, install) = step(&mut state, &sim, T0);
    let a_ca = install.expect("installed").ca;
    state.written();

    // The Secret is replaced by B: prepared, its anchor published next to A's; A signs on.
    let t1 = T0 + Duration::minutes(1);
    sim.set(t1);
    let (seen_b, b_ca) = observe(&mut state, &sim, "2", &b);
    assert!(matches!(seen_b, Observation::New), "{seen_b:?}");
    let (steps, seen, _) = step(&mut state, &sim, t1);
    assert_eq!(steps, [Step::Prepare]);
    assert_eq!(seen, Some(expect(1, &a, &[&a, &b], None)));
    assert_eq!(phases(&state), [(1, Phase::Active), (2, Phase::Prepared)]);
    assert!(state.needs_writing());
    assert!(signs(&a_ca));
    assert!(!signs(&b_ca), "B signs nothing inside its window");
    assert_eq!(state.next_event(t1), Some(t1 + WINDOW));
    assert_eq!(state.metric_values(t1).next_rotation, Some(t1 + WINDOW));
    state.written();

    // The same Secret again: nothing new.
    let (again, _) = observe(&mut state, &sim, "2", &b);
    assert!(matches!(again, Observation::Unchanged), "{again:?}");
    let (steps, seen, _) = step(&mut state, &sim, t1 + WINDOW - Duration::SECOND);
    assert_eq!((steps, seen), (vec![], None), "a second early");

    // The window elapsed: B active, A retired (its anchor stays for its leaves).
    let t2 = t1 + WINDOW;
    let (steps, seen, _) = step(&mut state, &sim, t2);
    assert_eq!(steps, [Step::Activate(2), Step::Retire(1)]);
    assert_eq!(seen, Some(expect(2, &b, &[&a, &b], None)));
    assert!(signs(&b_ca));
    assert!(!signs(&a_ca), "a retired CA never signs again");
    assert_eq!(phases(&state), [(1, Phase::Retired), (2, Phase::Active)]);
    assert_eq!(state.next_event(t2), Some(t2 + MAX_LEAF));
    let gauges = state.metric_values(t2).generations;
    assert_eq!(
        gauges
            .iter()
            .map(|g| (g.generation, g.phase))
            .collect::<Vec<_>>(),
        [(1, Phase::Retired), (2, Phase::Active)]
    );
    state.written();

    // A's last leaf can have expired: its anchor leaves.
    let (steps, seen, _) = step(&mut state, &sim, t2 + MAX_LEAF - Duration::SECOND);
    assert_eq!((steps, seen), (vec![], None));
    let t3 = t2 + MAX_LEAF;
    let (steps, seen, _) = step(&mut state, &sim, t3);
    assert_eq!(steps, [Step::Drop(1)]);
    assert_eq!(seen, Some(expect(2, &b, &[&b], None)));
    assert_eq!(
        phases(&state),
        [(2, Phase::Active)],
        "a dropped one is not kept"
    );
    let values = state.metric_values(t3);
    assert_eq!(
        values
            .generations
            .iter()
            .map(|g| g.generation)
            .collect::<Vec<_>>(),
        [2],
        "no gauge for a dropped generation"
    );
    assert_eq!(values.next_rotation, None);
}

#[test]
fn a_restart_mid_window_gates_the_new_ca_until_the_recorded_window_ends() {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let b = Ca::root("b");
    let mut before = SecretRotation::new(settings(), vec![], a.parse(&sim));
    step(&mut before, &sim, T0);
    let prepared_at = T0 + Duration::minutes(5);
    sim.set(prepared_at);
    observe(&mut before, &sim, "2", &b);
    assert_eq!(step(&mut before, &sim, prepared_at).0, [Step::Prepare]);
    let history = before.history();
    drop(before);

    // Restarted 5 minutes later: A's key is gone, B's is gated until B's recorded window ends.
    let restart = prepared_at + Duration::minutes(5);
    sim.set(restart);
    let mut state = SecretRotation::new(settings(), reread(&history), b.parse(&sim));
    let (steps, seen, install) = step(&mut state, &sim, restart);
    let opens = prepared_at + WINDOW;
    assert_eq!(steps, [], "B is recorded already");
    assert_eq!(seen, Some(expect(2, &b, &[&a, &b], Some(opens))));
    assert!(!state.needs_writing(), "nothing changed in the history");
    let b_ca = install.expect("installed").ca;
    sim.set(opens - Duration::SECOND);
    assert!(
        !signs(&b_ca),
        "gated until the window recorded before the restart"
    );
    sim.set(opens);
    assert!(signs(&b_ca), "open from the recorded window's end");

    let (steps, seen, _) = step(&mut state, &sim, opens);
    assert_eq!(steps, [Step::Activate(2), Step::Retire(1)]);
    assert_eq!(seen, None, "the handle holds B and both anchors already");
    assert!(signs(&b_ca));
    assert!(state.needs_writing());
}

#[test]
fn a_secret_changed_while_podca_was_down_is_gated_for_a_full_window() {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let b = Ca::root("b");
    let mut before = SecretRotation::new(settings(), vec![], a.parse(&sim));
    step(&mut before, &sim, T0);
    let history = before.history();

    let restart = T0 + Duration::hours(1);
    sim.set(restart);
    let mut state = SecretRotation::new(settings(), reread(&history), b.parse(&sim));
    let (steps, seen, _) = step(&mut state, &sim, restart);
    assert_eq!(steps, [Step::Prepare]);
    assert_eq!(seen, Some(expect(2, &b, &[&a, &b], Some(restart + WINDOW))));
    let (steps, seen, _) = step(&mut state, &sim, restart + WINDOW);
    assert_eq!(steps, [Step::Activate(2), Step::Retire(1)]);
    assert_eq!(seen, None);
}

#[test]
fn histories_with_generations_this_process_has_no_key_for() {
    let sim = Sim::at(T0);
    let x = Ca::root("x");
    let a = Ca::root("a");
    let c = Ca::root("c");
    // Recorded by an earlier run: X dropped, A active, C prepared (the Secret held C for a
    // while, then A's owner put B in place of it).
    let mut earlier = SecretRotation::new(settings(), vec![], x.parse(&sim));
    step(&mut earlier, &sim, T0);
    let t = T0 + Duration::minutes(1);
    sim.set(t);
    observe(&mut earlier, &sim, "2", &a);
    step(&mut earlier, &sim, t);
    let t = t + WINDOW;
    step(&mut earlier, &sim, t);
    let t = t + MAX_LEAF;
    step(&mut earlier, &sim, t);
    assert_eq!(
        phases(&earlier),
        [(2, Phase::Active)],
        "X dropped, not kept"
    );
    let history = earlier.history();
    let now = t + Duration::hours(1);
    sim.set(now);

    type Row<'a> = (&'a str, &'a Ca, &'a [Step], Seen, &'a [(u32, Phase)]);
    let b = Ca::root("b");
    #[rustfmt::skip]
    let rows: [Row<'_>; 3] = [
        ("the Secret holds the recorded active CA: keyed again, nothing to do",
            &a, &[], expect(2, &a, &[&a], None),
            &[(2, Phase::Active)]),
        ("the Secret holds a CA that was dropped: a new generation, gated (A has no key here)",
            &x, &[Step::Prepare], expect(3, &x, &[&a, &x], Some(now + WINDOW)),
            &[(2, Phase::Active), (3, Phase::Prepared)]),
        ("the Secret holds an unknown CA: a new generation, gated",
            &b, &[Step::Prepare], expect(3, &b, &[&a, &b], Some(now + WINDOW)),
            &[(2, Phase::Active), (3, Phase::Prepared)]),
    ];
    for (name, secret, want_steps, want_seen, want_phases) in rows {
        let mut state = SecretRotation::new(settings(), reread(&history), secret.parse(&sim));
        let (steps, seen, _) = step(&mut state, &sim, now);
        assert_eq!(steps, want_steps, "{name}");
        assert_eq!(seen, Some(want_seen), "{name}");
        assert_eq!(phases(&state), want_phases, "{name}");
    }

    // A recorded prepared CA nobody holds any more (C) is superseded by the Secret's B: retired
    // and, never having signed, dropped at once.
    let mut with_c = SecretRotation::new(settings(), reread(&history), a.parse(&sim));
    step(&mut with_c, &sim, now);
    observe(&mut with_c, &sim, "3", &c);
    step(&mut with_c, &sim, now);
    let history = with_c.history();
    let later = now + Duration::minutes(5);
    sim.set(later);
    let mut state = SecretRotation::new(settings(), reread(&history), b.parse(&sim));
    let (steps, seen, _) = step(&mut state, &sim, later);
    assert_eq!(steps, [Step::Prepare, Step::Retire(3), Step::Drop(3)]);
    assert_eq!(seen, Some(expect(4, &b, &[&a, &b], Some(later + WINDOW))));
    assert_eq!(
        phases(&state),
        [(2, Phase::Active), (4, Phase::Prepared)],
        "C dropped, not kept"
    );
}

#[test]
fn a_second_new_ca_inside_the_window_supersedes_the_prepared_one() {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let b = Ca::root("b");
    let c = Ca::root("c");
    let mut state = SecretRotation::new(settings(), vec![], a.parse(&sim));
    step(&mut state, &sim, T0);
    let t1 = T0 + Duration::minutes(1);
    sim.set(t1);
    let (_, b_ca) = observe(&mut state, &sim, "2", &b);
    step(&mut state, &sim, t1);
    let t2 = t1 + Duration::minutes(5);
    sim.set(t2);
    observe(&mut state, &sim, "3", &c);
    let (steps, seen, _) = step(&mut state, &sim, t2);
    assert_eq!(steps, [Step::Prepare, Step::Retire(2), Step::Drop(2)]);
    assert_eq!(seen, Some(expect(1, &a, &[&a, &c], None)));
    sim.set(t1 + WINDOW);
    assert!(
        !signs(&b_ca),
        "a superseded CA never signs, even after its window"
    );
    let (steps, seen, _) = step(&mut state, &sim, t2 + WINDOW);
    assert_eq!(steps, [Step::Activate(3), Step::Retire(1)]);
    assert_eq!(seen, Some(expect(3, &c, &[&a, &c], None)));
}

#[test]
fn a_new_intermediate_under_a_published_anchor_counts_from_that_anchor() {
    let sim = Sim::at(T0);
    let root = Ca::root("root");
    let first = root.intermediate("first");
    let second = root.intermediate("second");
    /// Name, time since the first CA, steps, what is swapped in (signer and issuing CA; the
    /// anchor is the same root), the next event.
    type Row<'a> = (
        &'a str,
        Duration,
        &'a [Step],
        Option<(u32, &'a Ca)>,
        OffsetDateTime,
    );
    let late = T0 + Duration::hours(1);
    #[rustfmt::skip]
    let rows: [Row<'_>; 2] = [
        ("the anchor was published a window ago: at once",
            Duration::hours(1), &[Step::Prepare, Step::Activate(2), Step::Retire(1)],
            Some((2, &second)), late + MAX_LEAF),
        ("the anchor was published 5 minutes ago: after the rest of its window",
            Duration::minutes(5), &[Step::Prepare], None, T0 + WINDOW),
    ];
    for (name, after, want_steps, want_swap, next) in rows {
        sim.set(T0);
        let mut state = SecretRotation::new(settings(), vec![], first.parse(&sim));
        let (steps, seen, _) = step(&mut state, &sim, T0);
        assert_eq!(steps, [Step::Prepare, Step::Activate(1)], "{name}");
        assert_eq!(seen, Some(expect(1, &first, &[&root], None)), "{name}");
        let now = T0 + after;
        sim.set(now);
        observe(&mut state, &sim, "2", &second);
        let (steps, seen, _) = step(&mut state, &sim, now);
        assert_eq!(steps, want_steps, "{name}");
        assert_eq!(
            seen,
            want_swap.map(|(id, ca)| expect(id, ca, &[&root], None)),
            "{name}"
        );
        let prepared = &state.history().generations[1].generation;
        assert_eq!(
            prepared.prepared_at, T0,
            "{name}: published since the first CA's"
        );
        assert_eq!(state.next_event(now), Some(next), "{name}");
    }
}

#[test]
fn a_bad_secret_is_reported_once_per_version_and_the_ca_in_force_stays() {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let mut state = SecretRotation::new(settings(), vec![], a.parse(&sim));
    step(&mut state, &sim, T0);
    let bad = || Err(SecretError::Missing(SecretField::TlsKey));
    let first = state.observe(Some("7"), bad);
    assert!(
        matches!(
            first,
            Observation::Rejected(SecretError::Missing(SecretField::TlsKey))
        ),
        "{first:?}"
    );
    let again = state.observe(Some("7"), || {
        panic!("a refused version is not parsed again")
    });
    assert!(matches!(again, Observation::AlreadyRejected), "{again:?}");
    let unversioned = state.observe(None, bad);
    assert!(
        matches!(unversioned, Observation::Rejected(_)),
        "{unversioned:?}"
    );
    let (steps, seen, _) = step(&mut state, &sim, T0);
    assert_eq!((steps, seen), (vec![], None), "the CA in force stays");
    // Fixed in the next version; refused again after that, it is reported again.
    let (fixed, _) = observe(&mut state, &sim, "8", &a);
    assert!(matches!(fixed, Observation::Unchanged), "{fixed:?}");
    let broken_again = state.observe(Some("7"), bad);
    assert!(
        matches!(broken_again, Observation::Rejected(_)),
        "{broken_again:?}"
    );
}

#[test]
fn a_standby_follows_the_leaders_history_with_its_own_keys() {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let b = Ca::root("b");
    let mut leader = SecretRotation::new(settings(), vec![], a.parse(&sim));
    step(&mut leader, &sim, T0);
    let standby_a = a.parse(&sim);
    let standby_a_ca = Arc::clone(standby_a.ca());
    let mut standby = SecretRotation::new(settings(), reread(&leader.history()), standby_a);
    let (steps, seen, _) = step(&mut standby, &sim, T0);
    assert_eq!(steps, []);
    assert_eq!(seen, Some(expect(1, &a, &[&a], None)));

    let t1 = T0 + Duration::minutes(1);
    sim.set(t1);
    observe(&mut leader, &sim, "2", &b);
    step(&mut leader, &sim, t1);
    // The standby's tick: the leader's history, then the Secret, then the steps.
    standby.adopt(reread(&leader.history()));
    let (_, b_ca) = observe(&mut standby, &sim, "2", &b);
    let (steps, seen, _) = step(&mut standby, &sim, t1);
    assert_eq!(steps, [], "the leader prepared B");
    assert_eq!(seen, Some(expect(1, &a, &[&a, &b], None)));

    let t2 = t1 + WINDOW;
    step(&mut leader, &sim, t2);
    standby.adopt(reread(&leader.history()));
    let (steps, seen, _) = step(&mut standby, &sim, t2);
    assert_eq!(steps, []);
    assert_eq!(seen, Some(expect(2, &b, &[&a, &b], None)));
    assert!(signs(&b_ca), "the standby's own key for B");
    assert!(
        !signs(&standby_a_ca),
        "A, retired by the leader, never signs again on the standby either"
    );
    assert_eq!(standby.history(), leader.history());
}

#[test]
fn debug_names_generations_and_shows_no_key() {
    let sim = Sim::at(T0);
    let a = Ca::root("a");
    let mut state = SecretRotation::new(settings(), vec![], a.parse(&sim));
    step(&mut state, &sim, T0);
    let debug = format!("{state:?} {:?}", a.parse(&sim));
    assert!(
        debug.contains(&format!("1 active {}", a.fingerprint())),
        "{debug}"
    );
    contract::assert_debug_hides(&debug, contract::Secret::Pkcs8Der(&a.pkcs8));
}

/// The key as the Secret backend builds it — `tls.key` PEM in each accepted encoding, parsed,
/// gated, and opened by the first step — passes the contract every CA key backend passes.
#[test]
fn the_secret_backends_key_passes_the_backend_contract_in_every_encoding() {
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::signature::{self, EcdsaKeyPair};

    let sec1 = |alg: &'static signature::EcdsaSigningAlgorithm, pkcs8: &[u8]| {
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8).expect("a PKCS#8 EC key");
        let der = pair.private_key().as_der().expect("SEC1 DER");
        ("EC PRIVATE KEY", der.as_ref().to_vec())
    };
    let cases: [(CaAlgorithm, &'static rcgen::SignatureAlgorithm); 4] = [
        (CaAlgorithm::EcdsaP256, &rcgen::PKCS_ECDSA_P256_SHA256),
        (CaAlgorithm::EcdsaP384, &rcgen::PKCS_ECDSA_P384_SHA384),
        (CaAlgorithm::Ed25519, &rcgen::PKCS_ED25519),
        (CaAlgorithm::RsaSha256, &rcgen::PKCS_RSA_SHA256),
    ];
    let mut checked = vec![];
    for (algorithm, rcgen_alg) in cases {
        let mut ca = Ca::root_with(rcgen_alg, &format!("{algorithm}"));
        let mut encodings = vec![("PRIVATE KEY", ca.pkcs8.clone())];
        match algorithm {
            CaAlgorithm::EcdsaP256 => {
                encodings.push(sec1(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &ca.pkcs8))
            }
            CaAlgorithm::EcdsaP384 => {
                encodings.push(sec1(&signature::ECDSA_P384_SHA384_ASN1_SIGNING, &ca.pkcs8))
            }
            CaAlgorithm::RsaSha256 => encodings.push(("RSA PRIVATE KEY", pkcs1(&ca.pkcs8))),
            _ => {}
        }
        for (label, der) in encodings {
            ca.tls_key = pem::encode(&pem::Pem::new(label, der.clone()));
            let sim = Sim::at(T0);
            let mut state = SecretRotation::new(settings(), vec![], ca.parse(&sim));
            let install = state.step(T0).install.expect("the first CA is installed");
            let key: Arc<dyn CaKey> = Arc::clone(install.ca.key());
            assert_eq!(key.algorithm(), algorithm, "{label}");
            assert_eq!(key.location(), "kubernetes-secret:podca/ca");
            assert_eq!(
                key.signs_quickly_in_process(),
                algorithm != CaAlgorithm::RsaSha256,
                "{label}: EC and Ed25519 keys sign inline, RSA in the blocking pool"
            );
            contract::check(Arc::clone(&key), contract::Secret::Pkcs8Der(&ca.pkcs8));
            // The key as it was encoded in the Secret, too (its DER is not PKCS#8 for SEC1
            // and PKCS#1, so only its whole encodings are looked for).
            contract::assert_debug_hides(&format!("{key:?}"), contract::Secret::Pkcs8Der(&der));
            checked.push(format!("{algorithm} {label}"));
        }
    }
    assert_eq!(checked.len(), 7, "{checked:?}");
}

/// The RSAPrivateKey (PKCS#1) inside a PKCS#8 PrivateKeyInfo: `SEQUENCE { INTEGER version,
/// SEQUENCE algorithm, OCTET STRING privateKey }`.
fn pkcs1(pkcs8: &[u8]) -> Vec<u8> {
    let (info, _) = der_element(pkcs8, 0x30);
    let (_, rest) = der_element(info, 0x02);
    let (_, rest) = der_element(rest, 0x30);
    let (key, _) = der_element(rest, 0x04);
    key.to_vec()
}

/// The contents of the DER element of `tag` at the start of `input`, and what follows it.
fn der_element(input: &[u8], tag: u8) -> (&[u8], &[u8]) {
    assert_eq!(input.first(), Some(&tag), "DER tag");
    let (len, header) = match input[1] {
        short if short < 0x80 => (usize::from(short), 2),
        0x81 => (usize::from(input[2]), 3),
        0x82 => (usize::from(u16::from_be_bytes([input[2], input[3]])), 4),
        other => panic!("unexpected DER length byte {other:#x}"),
    };
    (&input[header..header + len], &input[header + len..])
}
