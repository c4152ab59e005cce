//! The key files podca writes, as a new user would try them: every key type's credential bundle
//! loads with `openssl pkey` and serves a real TLS handshake from `openssl s_server`, verified by
//! `openssl s_client` against the trust bundle. (OpenSSL 3.0 refuses PKCS#8 v2 Ed25519 keys;
//! podca writes v1, like kubelet.)

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podca_tests::process::{free_port, podca_binary};

const KEY_TYPES: [&str; 6] = [
    "RSA3072",
    "RSA4096",
    "ECDSAP256",
    "ECDSAP384",
    "ECDSAP521",
    "ED25519",
];

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the command runs (openssl installed?)");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn podca(args: &[&str]) -> String {
    run(Command::new(podca_binary())
        .args(args)
        .env_remove("PODCA_DATA_DIR")
        .env("PODCA_LOG", "warn"))
}

/// Serves one TLS handshake from `bundle` (key and chain) and checks it from a client that
/// trusts only `anchors`.
fn handshake(dir: &Path, bundle: &Path, anchors: &Path, what: &str) {
    let text = std::fs::read_to_string(bundle).unwrap();
    let certs: Vec<_> = pem::parse_many(&text)
        .unwrap()
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .collect();
    let intermediates = dir.join("intermediates.pem");
    std::fs::write(
        &intermediates,
        certs[1..].iter().map(pem::encode).collect::<String>(),
    )
    .unwrap();
    let port = free_port();
    let mut server = Command::new("openssl")
        .args(["s_server", "-naccept", "1", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-key")
        .arg(bundle)
        .arg("-cert")
        .arg(bundle)
        .arg("-cert_chain")
        .arg(&intermediates)
        // s_server quits at the end of its standard input: keep it open until the test is done.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("ACCEPT") => break,
            Some(Ok(_)) => {}
            other => {
                let _ = server.kill();
                let out = server.wait_with_output().unwrap();
                panic!(
                    "{what}: openssl s_server did not start ({other:?}): {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        assert!(Instant::now() < deadline, "{what}: s_server never listened");
    }
    let client = Command::new("openssl")
        .args(["s_client", "-brief", "-verify_return_error", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-CAfile")
        .arg(anchors)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let said = String::from_utf8_lossy(&client.stderr).into_owned()
        + &String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success() && said.contains("Verification: OK"),
        "{what}: the TLS handshake from the bundle failed: {said}"
    );
}

#[test]
fn every_key_type_bundle_loads_in_openssl_and_serves_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    let d = dir.to_str().unwrap();
    podca(&["ca", "init", "--dir", d]);
    for key_type in KEY_TYPES {
        let bundle = tmp.path().join(format!("{key_type}.pem"));
        let anchors = tmp.path().join(format!("{key_type}-anchors.pem"));
        podca(&[
            "issue",
            "--dir",
            d,
            "-n",
            "default",
            "--service-account",
            "web",
            "--key-type",
            key_type,
            "-o",
            bundle.to_str().unwrap(),
            "--trust-bundle",
            anchors.to_str().unwrap(),
        ]);
        // openssl reads the key (and says what it is).
        let text = run(Command::new("openssl")
            .args(["pkey", "-noout", "-text", "-in"])
            .arg(&bundle));
        let expect = match key_type {
            "ED25519" => "ED25519 Private-Key",
            _ => "Private-Key: (",
        };
        assert!(
            text.contains(expect),
            "{key_type}: openssl pkey said {text}"
        );
        handshake(tmp.path(), &bundle, &anchors, key_type);
    }
}

#[test]
fn an_ed25519_ca_key_file_loads_in_openssl() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    podca(&[
        "ca",
        "init",
        "--dir",
        dir.to_str().unwrap(),
        "--algorithm",
        "ed25519",
    ]);
    for key in ["root.key", "issuing.key"] {
        let text = run(Command::new("openssl")
            .args(["pkey", "-noout", "-text", "-in"])
            .arg(dir.join("generations/1").join(key)));
        assert!(text.contains("ED25519 Private-Key"), "{key}: {text}");
    }
}
