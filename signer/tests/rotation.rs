//! Rotation on disk: a forced rotation publishes the next root before it signs, keeps the old
//! root while its leaves live, then drops it and deletes its keys.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use podca_signer::rotation::{Phase, Schedule, ScheduleError, Step};
use podca_signer::store::ForeignCa;
use podca_signer::{CaAlgorithm, FileStore, InitOptions, KeyType, MemoryKey, StoreError};
use time::{Duration, OffsetDateTime};

#[test]
fn forced_rotation_overlaps_then_drops_the_old_root() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("ca"));
    let t0 = OffsetDateTime::now_utc();
    let schedule = Schedule {
        ca_lifetime_seconds: 30 * 86400,
        ..Schedule::default()
    };
    let max_leaf = Duration::hours(24);
    let first = store.init(&InitOptions::default(), t0).unwrap();
    assert_eq!(store.roots().unwrap().len(), 1);
    // Nothing due yet.
    assert!(
        store
            .rotate(&schedule, max_leaf, false, t0)
            .unwrap()
            .is_empty()
    );

    // `podca ca rotate`: the next CA is prepared, published, but does not sign yet.
    assert_eq!(
        store.rotate(&schedule, max_leaf, true, t0).unwrap(),
        [Step::Prepare]
    );
    let roots = store.roots().unwrap();
    assert_eq!(roots.len(), 2, "old and next root both published");
    assert_eq!(store.load().unwrap().certificate(), first.certificate());
    let (_, old_leaf) = common::issue_for(&store.load().unwrap(), KeyType::EcdsaP256, &[]);

    // Inside the propagation window nothing changes, even when forced again.
    let t1 = t0 + Duration::minutes(10);
    assert!(
        store
            .rotate(&schedule, max_leaf, true, t1)
            .unwrap()
            .is_empty()
    );
    // A forced rotation activates as soon as the window is over, not at the scheduled point.
    let t3 = t0 + schedule.propagation();
    let steps = store
        .rotate(&schedule, max_leaf, false, t3 - Duration::seconds(1))
        .unwrap();
    assert!(steps.is_empty(), "one second early: {steps:?}");
    assert_eq!(store.next_rotation_event(&schedule, t1).unwrap(), Some(t3));
    let steps = store.rotate(&schedule, max_leaf, false, t3).unwrap();
    assert_eq!(steps, [Step::Activate(2), Step::Retire(1)]);
    let second = store.load().unwrap();
    assert_ne!(second.certificate(), first.certificate());
    let gens = store.generations().unwrap();
    assert_eq!(
        gens.iter().map(|g| g.generation.phase).collect::<Vec<_>>(),
        [Phase::Retired, Phase::Active]
    );

    // During the overlap both old and new leaves verify against the published bundle.
    let bundle: String = store.roots().unwrap().iter().map(|r| r.pem()).collect();
    let (_, new_leaf) = common::issue_for(&second, KeyType::EcdsaP256, &[]);
    for chain in [&old_leaf.chain_pem, &new_leaf.chain_pem] {
        let (ok, out) = common::openssl_verify(dir.path(), &bundle, chain);
        assert!(ok, "{out}");
    }

    // After the old CA's last possible leaf expired, its root leaves and its keys go.
    let t4 = t3 + max_leaf;
    assert_eq!(
        store.rotate(&schedule, max_leaf, false, t4).unwrap(),
        [Step::Drop(1)]
    );
    assert_eq!(store.roots().unwrap().len(), 1);
    assert!(!store.generation_dir(1).join("issuing.key").exists());
    assert!(!store.generation_dir(1).join("root.key").exists());
    let bundle: String = store.roots().unwrap().iter().map(|r| r.pem()).collect();
    let (ok, _) = common::openssl_verify(dir.path(), &bundle, &old_leaf.chain_pem);
    assert!(!ok, "the dropped root no longer anchors anything");
}

#[test]
fn imported_ca_cannot_self_rotate_but_a_second_import_is_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let a = common::two_level_ca(podca_signer::CaAlgorithm::EcdsaP256);
    let store = FileStore::new(dir.path().join("ca"));
    let key_pem = |ca: &podca_signer::IssuingCa| {
        // The test CA keys live in memory; re-create a matching import from a fresh root.
        let _ = ca;
        let pair = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "imported root");
        let cert = params.self_signed(&pair).unwrap();
        (cert.pem(), pair.serialize_pem())
    };
    let (cert1, key1) = key_pem(&a);
    store.import(&cert1, &key1, None).unwrap();
    let err = store
        .rotate(
            &Schedule::default(),
            Duration::hours(24),
            true,
            OffsetDateTime::now_utc(),
        )
        .unwrap_err();
    assert_eq!(
        err,
        StoreError::CannotMakeSuccessor {
            ca: ForeignCa::Imported
        }
    );
    assert_eq!(
        err.to_string(),
        "this CA was imported: podca cannot make its successor; import the next CA with `podca \
         ca init --import-cert … --import-key …` and it will be prepared and activated with \
         overlap"
    );
    // The schedule itself (podca serve's driver) finds nothing it can do, and that is no error:
    // at any point of the CA's life it prepares nothing and keeps the imported CA active.
    for years in [0, 1, 5, 20] {
        let steps = store
            .rotate(
                &Schedule::default(),
                Duration::hours(24),
                false,
                OffsetDateTime::now_utc() + Duration::days(365 * years),
            )
            .unwrap();
        assert!(!steps.contains(&Step::Prepare), "{steps:?}");
    }
    let (cert2, key2) = key_pem(&a);
    store.import(&cert2, &key2, None).unwrap();
    let phases: Vec<_> = store
        .generations()
        .unwrap()
        .iter()
        .map(|g| g.generation.phase)
        .collect();
    assert_eq!(phases, [Phase::Active, Phase::Prepared]);
    assert_eq!(
        store.roots().unwrap().len(),
        2,
        "the next anchor is published at once"
    );
}

#[test]
fn a_ca_whose_key_is_held_elsewhere_is_neither_loaded_nor_rotated_here() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("ca"));
    let now = OffsetDateTime::now_utc();
    let key = Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap());
    store
        .init_with_key(key, &InitOptions::default(), now)
        .unwrap();
    let err = store.load().unwrap_err();
    assert_eq!(
        err,
        StoreError::KeyHeldElsewhere {
            location: "memory".into(),
            dir: store.dir().display().to_string(),
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "the active CA key is held at memory; open it with its PIN (e.g. --pkcs11-pin-file) \
             instead of loading it from {}",
            store.dir().display()
        )
    );
    let err = store
        .rotate(&Schedule::default(), Duration::hours(24), true, now)
        .unwrap_err();
    assert_eq!(
        err,
        StoreError::CannotMakeSuccessor {
            ca: ForeignCa::ExternalKey
        }
    );
    assert!(
        err.to_string()
            .starts_with("this CA's key is held outside the data directory (HSM): podca cannot"),
        "{err}"
    );
    // `podca ca rotate --algorithm ml-dsa-65` on it: refused before anything is written, so
    // the directory's state is what it was (the setting is not saved for later).
    let state = std::fs::read(store.state_path()).unwrap();
    let err = store.set_algorithm(CaAlgorithm::MlDsa65, now).unwrap_err();
    assert_eq!(
        err,
        StoreError::AlgorithmNotApplicable {
            ca: ForeignCa::ExternalKey,
            algorithm: CaAlgorithm::MlDsa65,
        }
    );
    assert_eq!(
        err.to_string(),
        "this CA's key is held outside the data directory (HSM): podca makes none of its \
         successors, so --algorithm ml-dsa-65 would apply to nothing (nothing was changed); \
         bring a next CA with that algorithm yourself (docs/ca.md, \"HSM-held and \
         imported CAs\")"
    );
    assert_eq!(std::fs::read(store.state_path()).unwrap(), state);
}

#[test]
fn an_unworkable_schedule_is_refused_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("ca"));
    let now = OffsetDateTime::now_utc();
    store.init(&InitOptions::default(), now).unwrap();
    let schedule = Schedule {
        propagation_seconds: 60,
        ..Schedule::default()
    };
    let err = store
        .rotate(&schedule, Duration::hours(24), true, now)
        .unwrap_err();
    assert_eq!(
        err,
        StoreError::Schedule(ScheduleError::PropagationTooShort(60))
    );
    assert_eq!(
        err.to_string(),
        ScheduleError::PropagationTooShort(60).to_string()
    );
    assert_eq!(store.generations().unwrap().len(), 1, "nothing prepared");
}

/// A CA split off a shared one: the copy signs with the shared key and publishes its anchor, a
/// generation of its own is prepared at once (published beside it, signing after the window),
/// then the shared generation is retired and dropped. The source directory is untouched.
#[test]
fn a_split_ca_starts_as_a_copy_and_rotates_to_a_key_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let shared = FileStore::new(dir.path().join("shared"));
    let own = FileStore::new(dir.path().join("own"));
    let t0 = OffsetDateTime::now_utc();
    let schedule = Schedule::default();
    let max_leaf = Duration::hours(1);
    let shared_ca = shared.init(&InitOptions::default(), t0).unwrap();
    let shared_state = std::fs::read(shared.state_path()).unwrap();

    let steps = own
        .split_from(&shared, "payments", &schedule, max_leaf, t0)
        .unwrap();
    assert_eq!(steps, [Step::Prepare]);
    assert_eq!(std::fs::read(shared.state_path()).unwrap(), shared_state);
    // Until the window is over the copy signs, with the shared CA's very certificate.
    assert_eq!(own.load().unwrap().certificate(), shared_ca.certificate());
    let roots = own.roots().unwrap();
    assert_eq!(
        roots.len(),
        2,
        "the shared root and its own, both published"
    );
    assert_eq!(&roots[0], &shared.roots().unwrap()[0]);
    let mode = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(&own.generation_dir(1).join("issuing.key")), 0o600);

    // After the window its own key signs, under a root named for it; the shared one retires.
    let t1 = t0 + schedule.propagation();
    let steps = own.rotate(&schedule, max_leaf, false, t1).unwrap();
    assert_eq!(steps, [Step::Activate(2), Step::Retire(1)]);
    let signing = own.load().unwrap();
    assert_ne!(signing.certificate(), shared_ca.certificate());
    assert!(
        signing.roots()[0].subject().contains("payments root 2"),
        "{}",
        signing.roots()[0].subject()
    );
    // Once the retired generation's leaves can no longer live, only its own root is left.
    let t2 = t1 + max_leaf + Duration::seconds(1);
    let steps = own.rotate(&schedule, max_leaf, false, t2).unwrap();
    assert_eq!(steps, [Step::Drop(1)]);
    assert_eq!(own.roots().unwrap(), signing.roots());
    assert!(!own.generation_dir(1).join("issuing.key").exists());
    // The shared CA never saw any of it.
    assert_eq!(std::fs::read(shared.state_path()).unwrap(), shared_state);

    // Only into an empty directory, and only from a CA podca makes successors for.
    let again = own.split_from(&shared, "payments", &schedule, max_leaf, t2);
    assert!(
        matches!(again, Err(StoreError::AlreadyInitialised { .. })),
        "{again:?}"
    );
}
