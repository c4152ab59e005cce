//! Shared helpers for the gRPC and `podca dev` tests: build the `podca` binary once, run
//! `podca dev` as a child process, talk to it over TCP and the Unix socket.

// Test support: panicking on a broken fixture is the point.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use tonic::transport::{Channel, Endpoint};

pub use podca_tests::process::{podca_binary, podca_binary_release};

/// A running `podca dev`.
pub struct DevServer {
    child: Child,
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    pub grpc: SocketAddr,
    lines: Mutex<mpsc::Receiver<String>>,
    pub banner: Vec<String>,
    _tmp: Option<tempfile::TempDir>,
}

pub struct DevOptions<'a> {
    pub config: Option<&'a str>,
    pub args: Vec<String>,
    /// Reuse this data dir (else a fresh temp dir).
    pub data_dir: Option<PathBuf>,
    /// Run a release build of podca.
    pub release: bool,
    /// Put the socket outside the data dir (so the data dir can be replaced).
    pub socket_outside: bool,
}

impl Default for DevOptions<'_> {
    fn default() -> Self {
        DevOptions {
            config: None,
            args: vec![],
            data_dir: None,
            release: false,
            socket_outside: true,
        }
    }
}

impl DevServer {
    pub fn start() -> DevServer {
        Self::start_with(DevOptions::default())
    }

    pub fn start_with(options: DevOptions<'_>) -> DevServer {
        let tmp = tempfile::tempdir().unwrap();
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
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(config) = options.config {
            let path = tmp.path().join("podca.toml");
            std::fs::write(&path, config).unwrap();
            cmd.arg("--config").arg(path);
        }
        let mut child = cmd.spawn().expect("starting podca dev");
        let stdout = child.stdout.take().unwrap();
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
            .unwrap();
        assert!(
            socket.exists(),
            "socket {} exists once ready",
            socket.display()
        );
        DevServer {
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

    /// Sends a signal with the `kill` utility (no libc in tests either).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for a stdout line starting with `prefix`.
    pub fn wait_for_line(&self, prefix: &str, timeout: Duration) -> String {
        let rx = self.lines.lock().unwrap();
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
            if let Some(status) = self.child.try_wait().unwrap() {
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
            .unwrap()
            .connect()
            .await
            .unwrap();
        PodCaClient::new(channel)
    }

    /// A channel over the Unix socket.
    pub async fn unix_channel(&self) -> Channel {
        unix_channel(&self.socket).await
    }

    /// Replaces the CA in the data dir by a brand-new one (a stand-in for `podca ca rotate`,
    /// which belongs to another issue), then asks podca dev to reload it.
    pub fn replace_ca_and_reload(&self) -> String {
        for entry in std::fs::read_dir(&self.data_dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
        let store = podca_signer::FileStore::new(&self.data_dir);
        let options = podca_signer::InitOptions {
            name: "rotated".into(),
            ..Default::default()
        };
        store
            .init(&options, time::OffsetDateTime::now_utc())
            .unwrap();
        let anchors = std::fs::read_to_string(self.data_dir.join("root.pem")).unwrap();
        self.signal("HUP");
        self.wait_for_line("podca dev: reloaded the CA", Duration::from_secs(20));
        anchors
    }
}

impl Drop for DevServer {
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
        .unwrap()
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

/// A DER PKCS#10 CSR for a fresh key of `alg`, and the key.
pub fn csr_for(key: &rcgen::KeyPair) -> Vec<u8> {
    rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(key)
        .unwrap()
        .der()
        .to_vec()
}

/// PEM CERTIFICATE blocks of a text.
pub fn pem_blocks(text: &str) -> Vec<String> {
    pem::parse_many(text)
        .unwrap()
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| pem::encode(&p))
        .collect()
}

/// `openssl verify` of a leaf against anchors, with the rest of the chain as untrusted
/// intermediates. Returns openssl's stdout+stderr on failure.
pub fn openssl_verify(chain_pem: &str, anchors_pem: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let blocks = pem_blocks(chain_pem);
    assert!(!blocks.is_empty(), "empty chain");
    let leaf = dir.path().join("leaf.pem");
    let untrusted = dir.path().join("untrusted.pem");
    let anchors = dir.path().join("anchors.pem");
    std::fs::write(&leaf, &blocks[0]).unwrap();
    std::fs::write(&untrusted, blocks[1..].concat()).unwrap();
    std::fs::write(&anchors, anchors_pem).unwrap();
    let mut cmd = Command::new("openssl");
    cmd.arg("verify").arg("-CAfile").arg(&anchors);
    if blocks.len() > 1 {
        cmd.arg("-untrusted").arg(&untrusted);
    }
    let out = cmd.arg(&leaf).output().expect("running openssl");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
