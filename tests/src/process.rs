//! Running the real `podca` binary in tests: building it once, free ports, plain HTTP GETs,
//! `podca serve` ([`ServeProcess`]) and `podca dev` ([`DevProcess`]).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use tonic::transport::{Channel, Endpoint};

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

/// `podca bundle --dir dir`: the trust anchors of a CA data directory, as clients get them.
pub fn podca_bundle(dir: &Path) -> String {
    String::from_utf8(podca_on_dir(&["bundle"], dir)).expect("the bundle is PEM text")
}

/// `podca ca rotate --dir dir`: the next rotation step on a CA data directory (panics with its
/// stderr if it fails).
pub fn podca_ca_rotate(dir: &Path) {
    podca_on_dir(&["ca", "rotate"], dir);
}

/// `podca ca init --dir dir`: a new file CA in a data directory (panics with its stderr if it
/// fails).
pub fn podca_ca_init(dir: &Path) {
    podca_on_dir(&["ca", "init"], dir);
}

/// `podca <command> --dir dir`'s standard output; panics with its stderr if it fails.
fn podca_on_dir(command: &[&str], dir: &Path) -> Vec<u8> {
    let what = format!("podca {}", command.join(" "));
    let out = Command::new(podca_binary())
        .args(command)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Waits until `child` (a `podca serve` writing its log to `log`) accepts TCP connections on
/// 127.0.0.1:`port`, for at most 30 s; panics with the log if it exits or never listens.
pub fn wait_listening(child: &mut Child, port: u16, log: &Path) {
    let log_text = || std::fs::read_to_string(log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait().expect("polling podca serve") {
            panic!("podca serve exited ({status}):\n{}", log_text());
        }
        assert!(
            Instant::now() < deadline,
            "podca serve's gRPC API did not listen within 30 s:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A TCP port nobody listens on right now, below Linux's ephemeral range (32768–60999).
///
/// A port the kernel hands out for `bind(0)` is free again once released, and every outgoing
/// connection of every test process draws its local port from that same range: CI saw a
/// `podca serve` fail with "Address already in use" on such a port. Ports below the range are
/// only ever taken by listeners that chose them. Between this check and the listener's bind
/// (a child process starting: a few hundred milliseconds) another test could still draw the
/// same port (seen once in a local CI run: a `podca serve`'s admin port taken), so each port
/// handed out is also claimed for the whole test run: in this process, and under nextest, by a
/// marker file that every test process of the run (one `NEXTEST_RUN_ID`) creates exclusively.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    const FIRST: u16 = 20_000;
    const COUNT: u16 = 12_000;
    for _ in 0..1000 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        let port = FIRST + (h.finish() % u64::from(COUNT)) as u16;
        if claim_port(port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "no free port in {FIRST}..{} after 1000 tries",
        FIRST + COUNT
    )
}

/// Whether `port` was not handed out before in this test run (see [`free_port`]); claims it.
fn claim_port(port: u16) -> bool {
    static CLAIMED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let fresh = CLAIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(port);
    let run = std::env::var_os("NEXTEST_RUN_ID");
    let (true, Some(run)) = (fresh, run) else {
        return fresh;
    };
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| sweep_port_dirs(&std::env::temp_dir(), Duration::from_secs(86_400)));
    let dir = std::env::temp_dir().join(format!("{PORTS_DIR}{}", run.to_string_lossy()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("creating {}: {e}", dir.display());
    }
    let marker = dir.join(port.to_string());
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker)
    {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => panic!("creating {}: {e}", marker.display()),
    }
}

/// The prefix of the directories of claimed ports, one per nextest run.
const PORTS_DIR: &str = "podca-test-ports-";

/// Removes the claimed-port directories in `tmp` that nothing has written to for `age`:
/// earlier test runs' (a run's directory gains a file with each port it hands out). Best
/// effort: a directory another process removes first is no error.
fn sweep_port_dirs(tmp: &Path, age: Duration) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|e| e > age));
        if old && entry.file_name().to_string_lossy().starts_with(PORTS_DIR) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
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

/// The value of one series (`name{labels}`, exactly as exposed) in a `/metrics` page; 0 when
/// the page does not have it (a counter family with no event yet).
pub fn metric_value(page: &str, series: &str) -> f64 {
    page.lines()
        .filter_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .filter_map(|value| value.trim().parse::<f64>().ok())
        .sum()
}

/// `kill -name pid` with the `kill` utility (no libc in tests either).
fn kill(name: &str, pid: u32) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{name} {pid}: {status}");
}

/// A running `podca serve` (debug binary) with its admin and gRPC listeners on free loopback
/// ports; killed when dropped.
#[derive(Debug)]
pub struct ServeProcess {
    pub child: std::process::Child,
    pub admin: u16,
    pub grpc: u16,
}

/// `podca serve --leader-elect` flags for `identity` in the Lease namespace `default`, with the
/// Lease `timings`: duration, renew deadline, retry period (e.g. `["4s", "3s", "1s"]`).
pub fn leader_elect_flags<'a>(identity: &'a str, timings: [&'a str; 3]) -> Vec<&'a str> {
    let [duration, renew_deadline, retry_period] = timings;
    vec![
        "--leader-elect",
        "--lease-namespace",
        "default",
        "--lease-identity",
        identity,
        "--lease-duration",
        duration,
        "--lease-renew-deadline",
        renew_deadline,
        "--lease-retry-period",
        retry_period,
    ]
}

impl ServeProcess {
    /// `podca serve --config config --kubeconfig kubeconfig` plus `extra` arguments, with `env`.
    pub fn start(config: &Path, kubeconfig: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Self {
        Self::start_binary(&podca_binary(), config, kubeconfig, extra, env)
    }

    /// [`ServeProcess::start`] with stdout and stderr appended to the file `log` (to check what
    /// podca logs).
    pub fn start_logged(config: &Path, kubeconfig: &Path, extra: &[&str], log: &Path) -> Self {
        Self::start_logged_with(config, kubeconfig, extra, log, &[])
    }

    /// [`ServeProcess::start_logged`] with `env` added (e.g. `SOFTHSM2_CONF`).
    pub fn start_logged_with(
        config: &Path,
        kubeconfig: &Path,
        extra: &[&str],
        log: &Path,
        env: &[(&str, &Path)],
    ) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("the log file");
        let err = file.try_clone().expect("the log file");
        Self::start_command(
            &podca_binary(),
            config,
            kubeconfig,
            extra,
            env,
            (Stdio::from(file), Stdio::from(err)),
        )
    }

    /// `podca serve` from `binary` with `env` added (benchmarks comparing two builds).
    pub fn start_binary(
        binary: &Path,
        config: &Path,
        kubeconfig: &Path,
        extra: &[&str],
        env: &[(&str, &Path)],
    ) -> Self {
        Self::start_command(
            binary,
            config,
            kubeconfig,
            extra,
            env,
            (Stdio::null(), Stdio::inherit()),
        )
    }

    fn start_command(
        binary: &Path,
        config: &Path,
        kubeconfig: &Path,
        extra: &[&str],
        env: &[(&str, &Path)],
        (stdout, stderr): (Stdio, Stdio),
    ) -> Self {
        let admin = free_port();
        let grpc = free_port();
        let mut cmd = Command::new(binary);
        cmd.args(["serve", "--config"])
            .arg(config)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(extra)
            // The serving certificate's names must not depend on where the tests run.
            .env_remove("POD_NAMESPACE")
            .env_remove("PODCA_SERVICE_ACCOUNT")
            .stdout(stdout)
            .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut serve = ServeProcess {
            child: cmd.spawn().expect("spawn podca serve"),
            admin,
            grpc,
        };
        serve.wait_admin(Duration::from_secs(30));
        serve
    }

    /// Waits until the admin listener accepts connections (the last listener `podca serve`
    /// opens), or the process has exited, at most `timeout`.
    fn wait_admin(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while std::net::TcpStream::connect(("127.0.0.1", self.admin)).is_err() {
            if self.child.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The `/metrics` text, or empty when the admin listener does not answer.
    pub fn metrics(&self) -> String {
        http_get(self.admin, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Sends the signal `name` (`TERM`, `KILL`, …) with the `kill` utility.
    pub fn signal(&self, name: &str) {
        kill(name, self.child.id());
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
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

/// A running `podca dev` (a fresh data directory and socket unless [`DevOptions`] say
/// otherwise), ready once it printed its banner; killed when dropped.
#[derive(Debug)]
pub struct DevProcess {
    child: Child,
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    pub grpc: SocketAddr,
    lines: Mutex<mpsc::Receiver<String>>,
    pub banner: Vec<String>,
    _tmp: Option<tempfile::TempDir>,
}

#[derive(Debug)]
pub struct DevOptions<'a> {
    /// The text of a config file to pass with `--config`.
    pub config: Option<&'a str>,
    pub args: Vec<String>,
    /// Reuse this data dir (else a fresh temp dir).
    pub data_dir: Option<PathBuf>,
    /// Run a release build of podca.
    pub release: bool,
    /// Put the socket outside the data dir (so the data dir can be replaced).
    pub socket_outside: bool,
    /// Environment variables to set (e.g. `SOFTHSM2_CONF`).
    pub env: Vec<(&'a str, PathBuf)>,
}

impl Default for DevOptions<'_> {
    fn default() -> Self {
        DevOptions {
            config: None,
            args: vec![],
            data_dir: None,
            release: false,
            socket_outside: true,
            env: vec![],
        }
    }
}

impl DevProcess {
    pub fn start() -> DevProcess {
        Self::start_with(DevOptions::default())
    }

    pub fn start_with(options: DevOptions<'_>) -> DevProcess {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data_dir = options
            .data_dir
            .clone()
            .unwrap_or_else(|| tmp.path().join("data"));
        let socket = if options.socket_outside {
            tmp.path().join("workload.sock")
        } else {
            data_dir.join("workload.sock")
        };
        let binary = if options.release {
            podca_binary_release()
        } else {
            podca_binary()
        };
        let mut cmd = Command::new(binary);
        cmd.arg("dev")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--grpc-listen")
            .arg("127.0.0.1:0")
            .arg("--socket")
            .arg(&socket)
            .args(&options.args)
            .env("PODCA_LOG", "warn")
            .env_remove("PODCA_CONFIG")
            .envs(options.env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(config) = options.config {
            let path = tmp.path().join("podca.toml");
            std::fs::write(&path, config).expect("writing the config");
            cmd.arg("--config").arg(path);
        }
        let mut child = cmd.spawn().expect("starting podca dev");
        // Piped above.
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut banner = vec![];
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("podca dev did not print `ready` within 60 s");
            let done = line == "podca dev: ready";
            banner.push(line);
            if done {
                break;
            }
        }
        let grpc = banner
            .iter()
            .find_map(|l| l.strip_prefix("podca dev: gRPC API (podca.v1) on "))
            .expect("banner names the gRPC address")
            .parse()
            .expect("the banner's gRPC address parses");
        assert!(
            socket.exists(),
            "socket {} exists once ready",
            socket.display()
        );
        DevProcess {
            child,
            data_dir,
            socket,
            grpc,
            lines: Mutex::new(rx),
            banner,
            _tmp: Some(tmp),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the signal `name` (`TERM`, `HUP`, …) with the `kill` utility.
    pub fn signal(&self, name: &str) {
        kill(name, self.pid());
    }

    /// Waits for a stdout line starting with `prefix`.
    pub fn wait_for_line(&self, prefix: &str, timeout: Duration) -> String {
        let rx = self
            .lines
            .lock()
            .expect("the line receiver is not poisoned");
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line starting with {prefix:?} within {timeout:?}"));
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    /// SIGTERM, then waits for the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "podca dev did not stop within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub async fn tcp_client(&self) -> PodCaClient<Channel> {
        let channel = Endpoint::from_shared(format!("http://{}", self.grpc))
            .expect("a valid endpoint")
            .connect()
            .await
            .expect("podca dev's gRPC listener connects");
        PodCaClient::new(channel)
    }

    /// A channel over the Unix socket.
    pub async fn unix_channel(&self) -> Channel {
        unix_channel(&self.socket).await
    }

    /// Replaces the CA in the data dir by a brand-new one (a stand-in for `podca ca rotate`,
    /// which belongs to another issue), then asks podca dev to reload it.
    ///
    /// The new CA is made in a sibling directory and swapped in by two renames: emptying the
    /// live data dir and initialising it in place raced with podca dev's own rotation ticks
    /// (which take the store's lock and tidy the directory), and once left no `root.pem`.
    pub fn replace_ca_and_reload(&self) -> String {
        assert!(
            !self.socket.starts_with(&self.data_dir),
            "replace_ca_and_reload moves the data dir: start podca dev with socket_outside"
        );
        let parent = self.data_dir.parent().expect("the data dir has a parent");
        let fresh = tempfile::Builder::new()
            .prefix("rotated-ca")
            .tempdir_in(parent)
            .expect("a directory beside the data dir")
            .keep();
        let store = podca_signer::FileStore::new(&fresh);
        let options = podca_signer::InitOptions {
            name: "rotated".into(),
            ..Default::default()
        };
        store
            .init(&options, time::OffsetDateTime::now_utc())
            .expect("a new CA");
        let anchors = std::fs::read_to_string(fresh.join("root.pem")).expect("the new root.pem");
        let old = parent.join(format!(
            "{}.replaced",
            fresh.file_name().expect("a name").to_string_lossy()
        ));
        std::fs::rename(&self.data_dir, &old).expect("moving the old CA aside");
        std::fs::rename(&fresh, &self.data_dir).expect("moving the new CA in");
        let _ = std::fs::remove_dir_all(&old);
        self.signal("HUP");
        self.wait_for_line("podca dev: reloaded the CA", Duration::from_secs(20));
        anchors
    }
}

impl Drop for DevProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn unix_channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower_service_fn(socket))
        .await
        .expect("the Unix socket connects")
}

fn tower_service_fn(
    socket: PathBuf,
) -> impl tower::Service<
    tonic::transport::Uri,
    Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(socket).await?,
            ))
        }
    })
}

/// A DER PKCS#10 CSR for `key`, as a gRPC caller sends it (rcgen's default subject, no SANs).
pub fn csr_for(key: &rcgen::KeyPair) -> Vec<u8> {
    rcgen::CertificateParams::new(Vec::<String>::new())
        .and_then(|params| params.serialize_request(key))
        .expect("a CSR for a generated key")
        .der()
        .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn only_claimed_port_directories_unwritten_for_the_age_are_swept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let day_ago = SystemTime::now() - Duration::from_secs(86_400);
        let make = |name: &str, modified: Option<SystemTime>| {
            let dir = tmp.path().join(name);
            std::fs::create_dir(&dir).expect("mkdir");
            std::fs::write(dir.join("20001"), "").expect("a marker");
            if let Some(at) = modified {
                std::fs::File::open(&dir)
                    .and_then(|d| d.set_modified(at))
                    .expect("setting the mtime");
            }
            dir
        };
        let old = make("podca-test-ports-old-run", Some(day_ago));
        let current = make("podca-test-ports-this-run", None);
        let foreign = make("someone-elses", Some(day_ago));
        sweep_port_dirs(tmp.path(), Duration::from_secs(3600));
        assert!(!old.exists());
        assert!(current.join("20001").exists());
        assert!(foreign.exists());
    }
}
