//! The CA data directory under crashes and concurrent writers: a real `podca` killed with
//! SIGKILL at each point of each rotation step (the debug-build-only fault injection
//! `PODCA_TEST_CRASH_AT`), then the next `podca` start repairs the directory; and many writers at
//! once never corrupt `state.json`.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use podca_tests::process::podca_binary;
use podca_tests::verify::openssl_verify;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

fn podca(args: &[&str], crash_at: Option<&str>) -> Output {
    let mut cmd = Command::new(podca_binary());
    cmd.args(args)
        .env_remove("PODCA_DATA_DIR")
        .env_remove("PODCA_TEST_CRASH_AT")
        .env("PODCA_LOG", "warn");
    if let Some(point) = crash_at {
        cmd.env("PODCA_TEST_CRASH_AT", point);
    }
    cmd.output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = podca(args, None);
    assert!(
        out.status.success(),
        "podca {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `args` with the crash point armed and checks the process died of SIGKILL there.
fn killed_at(args: &[&str], point: &str) {
    let out = podca(args, Some(point));
    assert_eq!(
        out.status.signal(),
        Some(9),
        "podca {args:?} should have been SIGKILLed at {point}: {:?} {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn state(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("state.json")).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("state.json does not parse: {e}\n{text}"))
}

fn edit_state(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let mut s = state(dir);
    edit(&mut s);
    std::fs::write(
        dir.join("state.json"),
        serde_json::to_string_pretty(&s).unwrap(),
    )
    .unwrap();
}

fn rfc3339(t: OffsetDateTime) -> Value {
    Value::String(t.format(&Rfc3339).unwrap())
}

/// (id, phase) of every generation in state.json.
fn phases(dir: &Path) -> Vec<(u64, String)> {
    state(dir)["generations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["id"].as_u64().unwrap(),
                g["phase"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// What a repaired directory must hold: `expected` phases; exactly those generation
/// directories, no staging directory and no temporary file; `root.pem` exactly the roots of the
/// prepared and active generations and of `retired_published`; no keys for dropped ones; and
/// `podca issue` signs with the active generation, verified by openssl against `root.pem`.
fn assert_repaired(dir: &Path, expected: &[(u64, &str)], retired_published: &[u64]) {
    let got = phases(dir);
    let want: Vec<(u64, String)> = expected.iter().map(|(i, p)| (*i, p.to_string())).collect();
    assert_eq!(got, want, "generations after repair");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir.join("generations"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut named: Vec<String> = expected.iter().map(|(i, _)| i.to_string()).collect();
    named.sort();
    assert_eq!(on_disk, named, "generation directories after repair");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with(".tmp-"), "temporary file left: {name}");
    }
    let mut anchors = String::new();
    for (id, phase) in expected {
        let gdir = dir.join("generations").join(id.to_string());
        let published = matches!(*phase, "prepared" | "active") || retired_published.contains(id);
        if published {
            anchors.push_str(&std::fs::read_to_string(gdir.join("root.pem")).unwrap());
        }
        if *phase == "dropped" {
            assert!(
                !gdir.join("issuing.key").exists(),
                "dropped {id} kept its key"
            );
            assert!(!gdir.join("root.key").exists(), "dropped {id} kept its key");
        }
    }
    let root_pem = std::fs::read_to_string(dir.join("root.pem")).unwrap();
    assert_eq!(
        root_pem, anchors,
        "root.pem holds exactly the published roots"
    );

    let active = expected.iter().find(|(_, p)| *p == "active").unwrap().0;
    let bundle = dir.join(format!("bundle-{}.pem", std::process::id()));
    let d = dir.to_str().unwrap();
    ok(&[
        "issue",
        "--dir",
        d,
        "-n",
        "default",
        "--service-account",
        "app",
        "--key-type",
        "ECDSAP256",
        "-o",
        bundle.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&bundle).unwrap();
    std::fs::remove_file(&bundle).unwrap();
    if let Err(e) = openssl_verify(&text, &root_pem) {
        panic!("the issued chain does not verify against root.pem: {e}");
    }
    let leaf = pem::parse_many(&text)
        .unwrap()
        .into_iter()
        .find(|p| p.tag() == "CERTIFICATE")
        .unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.contents()).unwrap();
    assert!(
        cert.issuer()
            .to_string()
            .ends_with(&format!("issuing {active}")),
        "signed by {} instead of generation {active}",
        cert.issuer()
    );
}

fn init(dir: &Path) {
    ok(&["ca", "init", "--dir", dir.to_str().unwrap()]);
}

/// Makes generation `id`'s prepared anchor old enough to activate.
fn propagated(dir: &Path, id: u64) {
    let past = OffsetDateTime::now_utc() - time::Duration::hours(1);
    edit_state(dir, |s| {
        for g in s["generations"].as_array_mut().unwrap() {
            if g["id"].as_u64() == Some(id) {
                g["prepared_at"] = rfc3339(past);
            }
        }
    });
}

/// Makes retired generation `id`'s last leaf expired, so its anchor may be dropped.
fn leaves_expired(dir: &Path, id: u64) {
    let past = OffsetDateTime::now_utc() - time::Duration::minutes(1);
    edit_state(dir, |s| {
        for g in s["generations"].as_array_mut().unwrap() {
            if g["id"].as_u64() == Some(id) {
                g["last_leaf_not_after"] = rfc3339(past);
            }
        }
    });
}

const POINTS: [&str; 3] = ["before-state", "after-state", "after-anchors"];

#[test]
fn a_prepare_killed_at_any_point_is_repaired_by_the_next_start() {
    let points = ["prepare:after-key", "prepare:after-generation"]
        .into_iter()
        .map(str::to_owned)
        .chain(POINTS.iter().map(|p| format!("prepare:{p}")));
    for point in points {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ca");
        let d = dir.to_str().unwrap();
        init(&dir);
        killed_at(&["ca", "rotate", "--dir", d], &point);
        // The next start: repairs first, then finds nothing due.
        ok(&["ca", "rotate", "--dir", d, "--scheduled-only"]);
        let reached_state = point.ends_with("after-state") || point.ends_with("after-anchors");
        if reached_state {
            assert_repaired(&dir, &[(1, "active"), (2, "prepared")], &[]);
        } else {
            // Rolled back: the half-made generation is gone, and the next key creation works.
            assert_repaired(&dir, &[(1, "active")], &[]);
            ok(&["ca", "rotate", "--dir", d]);
            assert_repaired(&dir, &[(1, "active"), (2, "prepared")], &[]);
        }
        eprintln!("{point}: repaired");
    }
}

#[test]
fn an_activation_and_retirement_killed_at_any_point_is_completed_by_the_next_start() {
    for step in ["activate", "retire"] {
        for point in POINTS {
            let point = format!("{step}:{point}");
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("ca");
            let d = dir.to_str().unwrap();
            init(&dir);
            ok(&["ca", "rotate", "--dir", d]);
            propagated(&dir, 2);
            killed_at(&["ca", "rotate", "--dir", d, "--scheduled-only"], &point);
            if point.ends_with("before-state") {
                // The old state stands, and root.pem already holds both roots.
                assert_eq!(phases(&dir), [(1, "active".into()), (2, "prepared".into())]);
            }
            // The next start repairs, then takes the step that is still due.
            ok(&["ca", "rotate", "--dir", d, "--scheduled-only"]);
            assert_repaired(&dir, &[(1, "retired"), (2, "active")], &[1]);
            eprintln!("{point}: completed");
        }
    }
}

#[test]
fn a_drop_killed_at_any_point_is_completed_by_the_next_start() {
    for point in POINTS {
        let point = format!("drop:{point}");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ca");
        let d = dir.to_str().unwrap();
        init(&dir);
        ok(&["ca", "rotate", "--dir", d]);
        propagated(&dir, 2);
        ok(&["ca", "rotate", "--dir", d, "--scheduled-only"]);
        leaves_expired(&dir, 1);
        killed_at(&["ca", "rotate", "--dir", d, "--scheduled-only"], &point);
        if point.ends_with("after-state") {
            // Killed between the state and the key removal: the keys are still there.
            assert!(dir.join("generations/1/issuing.key").exists());
        }
        ok(&["ca", "rotate", "--dir", d, "--scheduled-only"]);
        assert_repaired(&dir, &[(1, "dropped"), (2, "active")], &[]);
        eprintln!("{point}: completed");
    }
}

#[test]
fn an_interrupted_first_init_is_cleared_by_the_next_init() {
    for point in ["prepare:after-key", "init:before-state"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ca");
        let d = dir.to_str().unwrap();
        killed_at(&["ca", "init", "--dir", d], point);
        assert!(!dir.join("state.json").exists());
        init(&dir);
        assert_repaired(&dir, &[(1, "active")], &[]);
    }
}

#[test]
fn many_concurrent_rotations_never_corrupt_the_state() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    let d = dir.to_str().unwrap();
    init(&dir);
    let children: Vec<_> = (0..8)
        .map(|_| {
            Command::new(podca_binary())
                .args(["ca", "rotate", "--dir", d])
                .env_remove("PODCA_TEST_CRASH_AT")
                .env("PODCA_LOG", "warn")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut prepared = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Every writer either did its change or found it done: none failed, none panicked.
        assert!(out.status.success(), "a writer failed: {stdout}{stderr}");
        if stdout.contains("prepared the next CA") {
            prepared += 1;
        }
    }
    // One writer prepared the next CA; the others, serialised behind it, found it prepared.
    assert_eq!(prepared, 1);
    assert_repaired(&dir, &[(1, "active"), (2, "prepared")], &[]);
}

#[test]
fn a_second_writer_waits_then_names_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    let d = dir.to_str().unwrap();
    init(&dir);
    let lock = podca_signer::FileStore::new(&dir).lock().unwrap();
    let start = Instant::now();
    let out = podca(&["ca", "rotate", "--dir", d], None);
    let waited = start.elapsed();
    drop(lock);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.starts_with("podca: ")).unwrap();
    assert!(
        line.contains(&format!(
            "is being changed by another podca process (pid {})",
            std::process::id()
        )) && line.contains("waited 10 s"),
        "{line}"
    );
    assert!(
        waited >= Duration::from_secs(10),
        "gave up after {waited:?}"
    );
    // Nothing changed, and once the holder is gone the writer goes through.
    assert_eq!(phases(&dir), [(1, "active".into())]);
    ok(&["ca", "rotate", "--dir", d]);
    assert_repaired(&dir, &[(1, "active"), (2, "prepared")], &[]);
}
