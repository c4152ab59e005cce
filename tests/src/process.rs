//! Running the real `podca` binary in tests: building it once, free ports, plain HTTP GETs.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The `podca` binary: `PODCA_BIN` if set, else built (once per test binary) by the cargo that
/// runs the tests, in the same target directory.
pub fn podca_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build(&[])).clone()
}

/// The release build of `podca` (benchmarks); `PODCA_BIN` overrides it too.
pub fn podca_binary_release() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build(&["--release"])).clone()
}

fn build(extra: &[&str]) -> PathBuf {
    if let Ok(p) = std::env::var("PODCA_BIN") {
        return p.into();
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "podca",
            "--bin",
            "podca",
            "--message-format=json",
        ])
        .args(extra)
        .arg("--manifest-path")
        .arg(&manifest)
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo build");
    assert!(out.status.success(), "cargo build -p podca failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "podca")
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .next_back()
        .expect("cargo did not report the podca executable")
}

/// A TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `GET path` on 127.0.0.1:port: status and body, or `None` if nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// A running `podca serve` (debug binary) with its admin and gRPC listeners on free loopback
/// ports; killed when dropped.
#[derive(Debug)]
pub struct ServeProcess {
    pub child: std::process::Child,
    pub admin: u16,
    pub grpc: u16,
}

impl ServeProcess {
    /// `podca serve --config config --kubeconfig kubeconfig` plus `extra` arguments, with `env`.
    pub fn start(config: &Path, kubeconfig: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Self {
        let admin = free_port();
        let grpc = free_port();
        let mut cmd = Command::new(podca_binary());
        cmd.args(["serve", "--config"])
            .arg(config)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        ServeProcess {
            child: cmd.spawn().expect("spawn podca serve"),
            admin,
            grpc,
        }
    }

    /// The `/metrics` text, or empty when the admin listener does not answer.
    pub fn metrics(&self) -> String {
        http_get(self.admin, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Sends a signal (`-TERM`, `-KILL`, …) with the `kill` utility.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "podca serve did not exit"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
