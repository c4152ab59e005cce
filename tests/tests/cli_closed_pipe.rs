//! Every subcommand that prints ends quietly when its reader has gone (issue #47 item 5):
//! `podca inspect … | head` used to exit 101 with a panic ("failed printing to stdout: Broken
//! pipe"). Each command runs with its standard output the write end of a pipe whose read end is
//! already closed, so its first write fails with EPIPE however small the output; it must exit 0
//! with nothing on standard error. A full disk is still an error, said in one line.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use podca_tests::cluster::Cluster;
use podca_tests::emulator::ApiMode;
use podca_tests::process::podca_binary;

/// Runs podca with `args`, its standard output a pipe nobody reads.
fn into_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    Command::new(podca_binary())
        .args(args)
        .env("PODCA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("podca runs")
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(podca_binary())
        .args(args)
        .output()
        .expect("podca runs");
    assert!(
        out.status.success(),
        "podca {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_printing_subcommand_ends_quietly_on_a_closed_pipe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    run(&["ca", "init", "--dir", s(&ca)]);
    // A credential bundle (key and chain), and a ledger record to show.
    let bundle = dir.path().join("web.pem");
    run(&[
        "issue",
        "--dir",
        s(&ca),
        "-n",
        "apps",
        "--service-account",
        "web",
        "--out",
        s(&bundle),
    ]);
    let listed = run(&["ledger", "list", "--dir", s(&ca), "--json"]);
    let first = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .next()
        .map(str::to_owned)
        .expect("one record");
    let record: serde_json::Value = serde_json::from_str(&first).expect("a JSON record");
    let serial = record["id"].as_str().expect("an id").to_owned();
    let config = dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"example.com/workload\"]\ntrust_domain = \
             \"cluster.local\"\nfederates_with = [\"partner.example\"]\n\n[ledger]\nbackend = \"none\"\n\n[[federation]]\n\
             trust_domain = \"partner.example\"\n\
             bundle_endpoint_url = \"https://bundle.partner.example/\"\nprofile = \"https_web\"\n",
            s(&ca)
        ),
    )
    .expect("config");
    let request = dir.path().join("request.yaml");
    std::fs::write(
        &request,
        "source: grpc\nnamespace: shop\nservice_account: web\n",
    )
    .expect("request");
    let denylist = dir.path().join("denylist.json");
    // doctor needs an API server: the emulator.
    let cluster = Cluster::start(ApiMode::V1Only, &["example.com/workload"]).await;
    let fresh = dir.path().join("fresh");
    let commands: Vec<Vec<&str>> = vec![
        vec!["ca", "init", "--dir", s(&fresh)],
        vec!["ca", "show", "--dir", s(&ca)],
        vec!["ca", "rotate", "--dir", s(&ca)],
        vec!["bundle", "--dir", s(&ca)],
        vec!["inspect", s(&bundle), "--dir", s(&ca)],
        vec![
            "issue",
            "--dir",
            s(&ca),
            "-n",
            "apps",
            "--service-account",
            "db",
        ],
        vec!["ledger", "list", "--dir", s(&ca)],
        vec!["ledger", "show", "--dir", s(&ca), &serial],
        vec!["ledger", "export", "--dir", s(&ca)],
        vec!["policy", "lint", "--config", s(&config)],
        vec![
            "policy",
            "test",
            "--config",
            s(&config),
            "--request",
            s(&request),
        ],
        vec!["renewal", "--denylist", s(&denylist)],
        vec!["federation", "status", "--config", s(&config)],
        vec!["completions", "bash"],
        vec!["completions", "--man"],
        vec![
            "doctor",
            "--kubeconfig",
            s(&cluster.kubeconfig),
            "--config",
            s(&config),
        ],
    ];
    for args in &commands {
        let out = into_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "podca {args:?} on a closed pipe: {:?}\n{stderr}",
            out.status
        );
    }
}

#[test]
fn a_full_disk_is_one_line_and_a_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    run(&["ca", "init", "--dir", s(&ca)]);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = Command::new(podca_binary())
        .args(["bundle", "--dir", s(&ca)])
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .expect("podca runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "podca: failed printing to stdout: No space left on device (os error 28)"
    );
}
