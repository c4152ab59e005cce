//! The real binary's text log (the default `--log-format`) escapes control characters in
//! values a client chose (issue #40): a pod name cannot start a fake log line or colour the
//! operator's terminal.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::{IssueCertificateRequest, IssueForPodRequest};
use podca_tests::process::{csr_for, podca_binary};

/// The attack: a caller of `podca dev`'s gRPC API names a pod whose name holds a newline, a
/// forged log record and an ANSI colour. podca dev refuses the call (it has no Kubernetes API
/// to find the pod's node) and logs the refusal with the pod name as a span field: one line,
/// the value escaped.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_name_cannot_forge_a_log_line_or_colour_the_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let log_path = tmp.path().join("stderr.log");
    let mut child = Command::new(podca_binary())
        .args(["dev", "--grpc-listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("data"))
        .arg("--socket")
        .arg(tmp.path().join("workload.sock"))
        .env("PODCA_LOG", "info")
        .env_remove("PODCA_CONFIG")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    // The banner names the gRPC address; `ready` ends it.
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut grpc = None;
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(address) = line.strip_prefix("podca dev: gRPC API (podca.v1) on ") {
            grpc = Some(address.to_owned());
        }
        if line == "podca dev: ready" {
            break;
        }
    }
    let grpc = grpc.expect("the banner names the gRPC address");

    let forged = "web-0\n2030-01-01T00:00:00.000000Z  INFO podca: issued a certificate \
                  identity=kube-system/admin\x1b[31m";
    let mut client = PodCaClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let refused = client
        .issue_for_pod(IssueForPodRequest {
            pod_namespace: "default".into(),
            pod_name: forged.into(),
            request: Some(IssueCertificateRequest {
                csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
                ..Default::default()
            }),
        })
        .await
        .expect_err("podca dev has no pods");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );

    // The refusal is logged once the answer is sent; give the writer a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = std::fs::read_to_string(&log_path).unwrap();
        if log.contains("gRPC request refused") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();

    let refusal: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("gRPC request refused"))
        .collect();
    assert_eq!(refusal.len(), 1, "one refusal line:\n{log}");
    assert!(
        refusal[0].contains(
            r"pod=default/web-0\n2030-01-01T00:00:00.000000Z  INFO podca: issued a certificate identity=kube-system/admin\u{1b}[31m"
        ),
        "the pod name, escaped, in the refusal line:\n{log}"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("2030-01-01")),
        "a forged line:\n{log}"
    );
    assert!(!log.contains('\x1b'), "an escape reached the log:\n{log}");
}
