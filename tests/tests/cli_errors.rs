//! Errors a user can act on (issue #47 item 7): each wrong input gets one line that says, in
//! the command line's words, what is wrong and what to do; never a parser's internal name
//! (`malformedframing`, `Der(UnexpectedTag …)`) or an annotation the user never wrote. (TLS:
//! the names a certificate carries, and `http://` against a TLS listener, are in `grpc_tls`.)

use std::path::Path;
use std::process::Command;

use podca_tests::process::podca_binary;

/// podca's exit status and standard error.
fn podca(args: &[&str]) -> (bool, String) {
    let out = Command::new(podca_binary())
        .args(args)
        .env_remove("PODCA_DATA_DIR")
        .env_remove("PODCA_CONFIG")
        .output()
        .expect("podca runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// One line, failing, equal to `want`.
#[track_caller]
fn refused(args: &[&str], want: &str) {
    let (ok, stderr) = podca(args);
    assert!(!ok, "{args:?} succeeded");
    assert_eq!(stderr, want, "{args:?}");
}

#[test]
fn bad_csrs_are_described_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    assert!(podca(&["ca", "init", "--dir", s(&ca)]).0);
    let file = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    let good = params.serialize_request(&key).unwrap().der().to_vec();
    let cases = [
        (
            file("text.csr", b"not a request\n"),
            "malformed CSR file: neither a PEM block (-----BEGIN CERTIFICATE REQUEST----- … \
             -----END CERTIFICATE REQUEST-----) nor DER",
        ),
        (
            file("cut.der", &good[..good.len() / 2]),
            "malformed CSR: it ends before its DER does (truncated or cut short)",
        ),
        (
            // A certificate's DER, or anything else that is not a request.
            file("other.der", &[0xa0, 0x03, 0x02, 0x01, 0x05]),
            "malformed CSR: it is not a PKCS#10 certification request (its DER has another \
             structure)",
        ),
        (
            file(
                "empty-block.csr",
                b"-----BEGIN CERTIFICATE REQUEST-----\n!!!!\n-----END CERTIFICATE REQUEST-----\n",
            ),
            "malformed CSR file: its PEM block is not valid base64",
        ),
    ];
    for (path, want) in &cases {
        let (ok, stderr) = podca(&[
            "issue",
            "--dir",
            s(&ca),
            "-n",
            "apps",
            "--service-account",
            "web",
            "--csr",
            s(path),
        ]);
        assert!(!ok, "{}", path.display());
        assert!(stderr.contains(want), "{}: {stderr}", path.display());
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        for jargon in ["malformedframing", "Parsing Error", "Der(", "NomError"] {
            assert!(!stderr.contains(jargon), "{stderr}");
        }
    }
}

#[test]
fn dns_refusals_speak_of_the_dns_flag() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    assert!(podca(&["ca", "init", "--dir", s(&ca)]).0);
    let base = ["issue", "-n", "apps", "--service-account", "web"];
    let local = [&base[..], &["--dir", s(&ca), "--dns", "bad_name!"]].concat();
    refused(
        &local,
        "podca: --dns \"bad_name!\" is not a DNS name: it must not contain '_'",
    );
    // Before anything is sent to a server (none listens here).
    let remote = [
        "issue",
        "--server",
        "http://127.0.0.1:1",
        "--dns",
        "web..apps",
    ];
    refused(
        &remote,
        "podca: --dns \"web..apps\" is not a DNS name: it must not contain an empty label (no \
         leading, trailing or doubled '.')",
    );
}

#[test]
fn an_empty_data_directory_names_itself_in_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("my ca");
    let shown = s(&empty).to_owned();
    refused(
        &[
            "issue",
            "--dir",
            &shown,
            "-n",
            "apps",
            "--service-account",
            "web",
        ],
        &format!("podca: {shown} holds no CA yet; run `podca ca init --dir '{shown}'` first"),
    );
}

#[test]
fn a_bad_time_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    assert!(podca(&["ca", "init", "--dir", s(&ca)]).0);
    refused(
        &["ledger", "list", "--dir", s(&ca), "--since", "yesterday"],
        "podca: --since \"yesterday\" is not an RFC 3339 time (2026-11-29T12:00:00Z)",
    );
}
