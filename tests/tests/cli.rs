//! The `podca` command line as a user runs it: the real binary, real openssl, real SoftHSM2.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use podca_tests::process::podca_binary;
use podca_tests::verify::openssl_verify;

fn podca(args: &[&str]) -> Output {
    Command::new(podca_binary())
        .args(args)
        .env_remove("PODCA_DATA_DIR")
        .env("PODCA_LOG", "warn")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = podca(args);
    assert!(
        out.status.success(),
        "podca {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a failing command and returns its one-line error.
fn fails(args: &[&str]) -> String {
    let out = podca(args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "podca {args:?} should fail with status 1"
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("podca: "))
        .collect();
    assert_eq!(lines.len(), 1, "one error line expected: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    lines[0].to_string()
}

fn openssl(dir: &Path, args: &[&str]) -> Output {
    Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the `openssl` binary is required: apt-get install -y openssl")
}

/// Checks the kubelet layout of a credential bundle (PKCS#8 key first) and verifies its chain
/// against the anchors in `roots` with `openssl verify`.
fn assert_bundle_verifies(roots: &Path, bundle: &Path, what: &str) {
    let text = std::fs::read_to_string(bundle).unwrap();
    let blocks = pem::parse_many(&text).unwrap();
    assert_eq!(
        blocks[0].tag(),
        "PRIVATE KEY",
        "{what}: kubelet layout: PKCS#8 key first"
    );
    if let Err(e) = openssl_verify(&text, &std::fs::read_to_string(roots).unwrap()) {
        panic!("{what}: {e}");
    }
}

#[test]
fn init_issue_every_key_type_inspect_and_query_the_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    let d = dir.to_str().unwrap();
    ok(&["ca", "init", "--dir", d]);
    let roots = tmp.path().join("roots.pem");
    ok(&["bundle", "--dir", d, "-o", roots.to_str().unwrap()]);
    for key_type in [
        "RSA3072",
        "RSA4096",
        "ECDSAP256",
        "ECDSAP384",
        "ECDSAP521",
        "ED25519",
    ] {
        let out = tmp.path().join(format!("{key_type}.pem"));
        let o = out.to_str().unwrap();
        ok(&[
            "issue",
            "--dir",
            d,
            "-n",
            "prod",
            "--service-account",
            "web",
            "--key-type",
            key_type,
            "--dns",
            "web.prod.svc",
            "-o",
            o,
        ]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "a bundle holding a private key is private");
        assert_bundle_verifies(&roots, &out, key_type);
        let shown = ok(&["inspect", "--dir", d, o]);
        assert!(
            shown.contains(&format!("key:        {key_type}")),
            "{shown}"
        );
        assert!(
            shown.contains("URI:spiffe://cluster.local/ns/prod/sa/web"),
            "{shown}"
        );
        assert!(shown.contains("DNS:web.prod.svc"), "{shown}");
        assert!(
            shown.contains("private key: matches certificate 0"),
            "{shown}"
        );
        assert!(shown.contains("chain: anchored in"), "{shown}");
    }
    let listed = ok(&["ledger", "list", "--dir", d, "--json"]);
    let records: Vec<serde_json::Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 6);
    assert!(
        records
            .iter()
            .all(|r| r["identity"] == "spiffe://cluster.local/ns/prod/sa/web"
                && r["source"] == "cli")
    );
    let serial = records[0]["serial"].as_str().unwrap();
    let shown = ok(&["ledger", "show", "--dir", d, serial]);
    assert!(shown.contains(serial));
    let by_id = ok(&[
        "ledger",
        "list",
        "--dir",
        d,
        "--identity",
        "spiffe://cluster.local/ns/prod/sa/web",
    ]);
    assert_eq!(by_id.lines().count(), 7, "header + 6 rows: {by_id}");
    let missing = fails(&["ledger", "show", "--dir", d, "00ff"]);
    assert!(
        missing.contains("no certificate with serial 00ff"),
        "{missing}"
    );
}

#[test]
fn issue_from_an_openssl_csr_and_refuse_a_tampered_one() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let d = t.join("ca");
    let d = d.to_str().unwrap();
    ok(&["ca", "init", "--dir", d, "--algorithm", "ecdsa-p384"]);
    for args in [
        &[
            "ecparam",
            "-name",
            "secp384r1",
            "-genkey",
            "-noout",
            "-out",
            "k.pem",
        ][..],
        &[
            "req",
            "-new",
            "-key",
            "k.pem",
            "-subj",
            "/CN=ignored",
            "-out",
            "req.pem",
        ],
        &[
            "req", "-in", "req.pem", "-outform", "DER", "-out", "req.der",
        ],
    ] {
        let o = openssl(t, args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    for csr in ["req.pem", "req.der"] {
        let chain = ok(&[
            "issue",
            "--dir",
            d,
            "--csr",
            t.join(csr).to_str().unwrap(),
            "-n",
            "a",
            "--service-account",
            "b",
        ]);
        assert!(
            chain.starts_with("-----BEGIN CERTIFICATE-----"),
            "chain only, no key: {chain}"
        );
    }
    let mut der = std::fs::read(t.join("req.der")).unwrap();
    let n = der.len();
    der[n - 3] ^= 0x40;
    std::fs::write(t.join("bad.der"), der).unwrap();
    let e = fails(&[
        "issue",
        "--dir",
        d,
        "--csr",
        t.join("bad.der").to_str().unwrap(),
        "-n",
        "a",
        "--service-account",
        "b",
    ]);
    assert!(
        e.contains("bad.der") && e.contains("does not verify"),
        "{e}"
    );
}

/// `-o` names a file someone else made first, world-readable, and keeps open: podca replaces
/// it with a file of its own, mode 0600, so neither the old mode nor the held descriptor sees
/// the private key.
#[test]
fn issue_out_never_writes_a_key_into_a_file_it_did_not_create() {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("ca");
    let d = d.to_str().unwrap();
    ok(&["ca", "init", "--dir", d]);
    let out = tmp.path().join("web.pem");
    std::fs::write(&out, "").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut held = std::fs::File::open(&out).unwrap();
    let o = out.to_str().unwrap();
    ok(&[
        "issue",
        "--dir",
        d,
        "-n",
        "apps",
        "--service-account",
        "web",
        "-o",
        o,
    ]);
    let written = std::fs::read_to_string(&out).unwrap();
    assert!(
        written.starts_with("-----BEGIN PRIVATE KEY-----"),
        "{written}"
    );
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the credential is {mode:o}");
    let mut seen = String::new();
    held.read_to_string(&mut seen).unwrap();
    assert_eq!(seen, "", "the descriptor held on the old file saw the key");
}

/// `podca serve --sharding`: a bad value is a usage error naming both values; rendezvous (by
/// flag or by config) without `--leader-elect` is refused before anything starts, and so is a
/// `--takeover-after` without rendezvous or shorter than a Lease.
#[test]
fn rendezvous_sharding_needs_leader_election() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("podca.toml");
    std::fs::write(
        &config,
        "[ca]\ndir = \"/nonexistent\"\n\n[signers.\"example.com/x\"]\ntrust_domain = \"td\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let usage = podca(&["serve", "--config", config, "--sharding", "everyone"]);
    let e = String::from_utf8_lossy(&usage.stderr);
    assert_eq!(usage.status.code(), Some(2), "{e}");
    assert!(e.contains("[possible values: leader, rendezvous]"), "{e}");
    let e = fails(&["serve", "--config", config, "--sharding", "rendezvous"]);
    assert!(
        e.contains("rendezvous sharding needs --leader-elect"),
        "{e}"
    );
    let in_config = tmp.path().join("sharded.toml");
    std::fs::write(
        &in_config,
        format!(
            "{}\n[controller]\nsharding = \"rendezvous\"\n",
            std::fs::read_to_string(config).unwrap()
        ),
    )
    .unwrap();
    let e = fails(&["serve", "--config", in_config.to_str().unwrap()]);
    assert!(
        e.contains("rendezvous sharding needs --leader-elect"),
        "{e}"
    );
    // The flag overrides the config: `leader` gets past this check (and fails later, on the CA
    // directory that does not exist).
    let e = fails(&[
        "serve",
        "--config",
        in_config.to_str().unwrap(),
        "--sharding",
        "leader",
    ]);
    assert!(!e.contains("rendezvous sharding"), "{e}");
    // --takeover-after: rendezvous only, and not below the Lease duration.
    let in_config = in_config.to_str().unwrap();
    let e = fails(&["serve", "--config", config, "--takeover-after", "2m"]);
    assert!(
        e.contains("--takeover-after applies to rendezvous sharding only"),
        "{e}"
    );
    let sharded = |after| {
        fails(&[
            "serve",
            "--config",
            in_config,
            "--leader-elect",
            "--takeover-after",
            after,
        ])
    };
    let e = sharded("10s");
    assert!(
        e.contains("--takeover-after (10s) must be at least --lease-duration (15s)"),
        "{e}"
    );
    let e = sharded("15s");
    assert!(!e.contains("--takeover-after"), "{e}");
}

#[test]
fn errors_are_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("none");
    let d = d.to_str().unwrap();
    let e = fails(&["issue", "--dir", d, "-n", "a", "--service-account", "b"]);
    assert!(e.contains("podca ca init"), "{e}");
    let e = fails(&["ca", "show", "--dir", d]);
    assert!(e.contains(d), "{e}");
    ok(&["ca", "init", "--dir", d]);
    let e = fails(&["ca", "init", "--dir", d]);
    assert!(e.contains("refusing to overwrite"), "{e}");
    let garbage = tmp.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let e = fails(&["inspect", garbage.to_str().unwrap()]);
    assert!(e.contains("garbage.pem"), "{e}");
    let e = fails(&[
        "issue",
        "--dir",
        d,
        "-n",
        "a",
        "--service-account",
        "b",
        "--trust-domain",
        "Not Valid",
    ]);
    assert!(e.contains("trust-domain"), "{e}");
    let e = fails(&[
        "issue",
        "--dir",
        d,
        "-n",
        "a",
        "--service-account",
        "b",
        "--dns",
        "bad..name",
    ]);
    assert!(
        e.contains("InvalidUnverifiedUserAnnotations") || e.contains("not a DNS name"),
        "{e}"
    );
}

#[test]
fn rotate_publishes_the_next_root_before_it_signs() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("ca");
    let d = d.to_str().unwrap();
    ok(&["ca", "init", "--dir", d]);
    let before = ok(&["bundle", "--dir", d]);
    assert_eq!(before.matches("BEGIN CERTIFICATE").count(), 1);
    let said = ok(&["ca", "rotate", "--dir", d]);
    assert!(said.contains("prepared the next CA"), "{said}");
    let after = ok(&["bundle", "--dir", d]);
    assert_eq!(
        after.matches("BEGIN CERTIFICATE").count(),
        2,
        "old and next roots"
    );
    let shown = ok(&["ca", "show", "--dir", d]);
    assert!(shown.contains("generation 1 — active"), "{shown}");
    assert!(shown.contains("generation 2 — prepared"), "{shown}");
    // Still signing with generation 1 inside the propagation window.
    let chain = ok(&["issue", "--dir", d, "-n", "a", "--service-account", "b"]);
    let cert = tmp.path().join("c.pem");
    std::fs::write(&cert, &chain).unwrap();
    let shown = ok(&["inspect", "--dir", d, cert.to_str().unwrap()]);
    assert!(
        shown.contains("issuer:     O=podca, CN=podca issuing 1"),
        "{shown}"
    );
}

#[test]
fn ca_key_in_softhsm2_through_the_cli() {
    let module = Path::new("/usr/lib/softhsm/libsofthsm2.so");
    assert!(
        module.exists(),
        "SoftHSM2 is required for this test: apt-get install -y -t bookworm softhsm2"
    );
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    std::fs::create_dir(t.join("tokens")).unwrap();
    let conf = t.join("softhsm2.conf");
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}/tokens\nobjectstore.backend = file\n",
            t.display()
        ),
    )
    .unwrap();
    let init = Command::new("softhsm2-util")
        .args([
            "--init-token",
            "--free",
            "--label",
            "clitest",
            "--so-pin",
            "87654321",
            "--pin",
            "123456",
        ])
        .env("SOFTHSM2_CONF", &conf)
        .output()
        .expect("softhsm2-util is required: apt-get install -y -t bookworm softhsm2");
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    std::fs::write(t.join("pin"), "123456\n").unwrap();
    std::fs::write(t.join("bad-pin"), "000000\n").unwrap();
    let d = t.join("ca");
    let (d, pin, bad) = (d.to_str().unwrap(), t.join("pin"), t.join("bad-pin"));
    let uri = format!(
        "pkcs11:token=clitest;object=ca?module-path={}",
        module.display()
    );
    let run = |args: &[&str]| {
        Command::new(podca_binary())
            .args(args)
            .env("SOFTHSM2_CONF", &conf)
            .env("PODCA_LOG", "warn")
            .output()
            .unwrap()
    };
    let o = run(&[
        "ca",
        "init",
        "--dir",
        d,
        "--pkcs11-uri",
        &uri,
        "--pkcs11-generate",
        "--pkcs11-pin-file",
        pin.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !std::fs::read_dir(t.join("ca/generations/1"))
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".key")),
        "no key file on disk for an HSM CA"
    );
    let bundle = t.join("b.pem");
    let o = run(&[
        "issue",
        "--dir",
        d,
        "-n",
        "a",
        "--service-account",
        "b",
        "--key-type",
        "ECDSAP521",
        "-o",
        bundle.to_str().unwrap(),
        "--pkcs11-pin-file",
        pin.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_bundle_verifies(&t.join("ca/root.pem"), &bundle, "ECDSAP521 via PKCS#11");
    let o = run(&[
        "issue",
        "--dir",
        d,
        "-n",
        "a",
        "--service-account",
        "b",
        "--pkcs11-pin-file",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("the user PIN is incorrect"), "{stderr}");
    assert!(
        !stderr.contains("000000"),
        "the PIN never appears in errors"
    );
    let o = run(&["issue", "--dir", d, "-n", "a", "--service-account", "b"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pkcs11-pin-file"));
}
