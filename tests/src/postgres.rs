//! A throwaway PostgreSQL server for tests, as a developer would run one on a laptop: `initdb`
//! and `pg_ctl` from Debian's `/usr/lib/postgresql/<version>/bin`, a cluster in a temporary
//! directory, a loopback port plus the Unix socket in that directory.
//!
//! PostgreSQL refuses to run as root; tests run as root in CI, so the server runs as the
//! `postgres` user Debian's package creates (`runuser -u postgres --`). A missing installation
//! or user is a test failure with a message saying what to install, never a skip.
//!
//! Local (Unix socket) connections are trusted; TCP connections need the password
//! [`PASSWORD`] of the user `postgres` (SCRAM), so a wrong password is a real refusal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The password of the `postgres` user over TCP.
pub const PASSWORD: &str = "podca-test-pw";

/// A running server; stopped (immediately) on drop.
#[derive(Debug)]
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    as_postgres: bool,
    options: String,
}

/// TLS for the server: PEM certificate chain and key.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Postgres {
    /// Starts a server without TLS.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts a server, with TLS when `tls` is given (TCP connections may then use it).
    pub fn start_with(tls: Option<ServerTls>) -> Self {
        let bin = server_bin();
        let as_postgres = running_as_root();
        if as_postgres {
            let ok = Command::new("id")
                .arg("postgres")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "running as root, and there is no `postgres` user to run PostgreSQL as: \
                 install Debian's `postgresql` package (bash .ci/run does), which creates it"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("podca-pg-")
            .tempdir()
            .expect("a temporary directory");
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, PASSWORD).expect("writing the password file");
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -k {} -c max_connections=100",
            dir.path().display()
        );
        if let Some(tls) = &tls {
            let cert = dir.path().join("server.crt");
            let key = dir.path().join("server.key");
            std::fs::write(&cert, &tls.cert_pem).expect("writing the server certificate");
            std::fs::write(&key, &tls.key_pem).expect("writing the server key");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
                .expect("chmod the server key");
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            ));
        }
        if as_postgres {
            let chown = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("running chown");
            assert!(chown.success(), "chown of {} failed", dir.path().display());
        }
        let server = Postgres {
            port: crate::process::free_port(),
            dir,
            bin,
            as_postgres,
            options,
        };
        let data = server.data_dir();
        let out = server.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "--auth-local=trust".as_ref(),
                "--auth-host=scram-sha-256".as_ref(),
                "--pwfile".as_ref(),
                pwfile.as_os_str(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--no-sync".as_ref(),
            ],
        );
        assert!(out.status.success(), "initdb failed: {}", stderr(&out));
        server.start_again();
        server
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The CPU time the server has used so far: the postmaster and every process it started
    /// that is still running (the backends, the WAL writer, the checkpointer), from `/proc`.
    pub fn cpu(&self) -> std::time::Duration {
        let pid_file = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .expect("postmaster.pid of a running server");
        let postmaster: u32 = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("the postmaster's pid on postmaster.pid's first line");
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if crate::bench::parent_pid(pid) == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids.into_iter()
            .map(crate::bench::process_cpu_if_alive)
            .sum()
    }

    /// The directory holding the Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A key=value connection string over the Unix socket (trusted: no password).
    pub fn unix_url(&self) -> String {
        format!(
            "host={} port={} user=postgres dbname=postgres",
            self.socket_dir().display(),
            self.port
        )
    }

    /// A URL over TCP to `host` (which must resolve to 127.0.0.1) with `password`.
    pub fn tcp_url(&self, host: &str, password: &str) -> String {
        format!(
            "postgres://postgres:{password}@{host}:{}/postgres",
            self.port
        )
    }

    /// Starts the (stopped) server and waits until it accepts connections.
    pub fn start_again(&self) {
        let data = self.data_dir();
        let log = self.dir.path().join("server.log");
        let out = self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-w".as_ref(),
                "-t".as_ref(),
                "30".as_ref(),
                "-o".as_ref(),
                format!("-p {} {}", self.port, self.options).as_ref(),
                "start".as_ref(),
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{}",
            stderr(&out),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// Stops the server (fast shutdown: connections are cut, committed data stays).
    pub fn stop(&self) {
        let data = self.data_dir();
        let out = self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-m".as_ref(),
                "fast".as_ref(),
                "-w".as_ref(),
                "stop".as_ref(),
            ],
        );
        assert!(out.status.success(), "pg_ctl stop failed: {}", stderr(&out));
    }

    /// Runs `sql` with psql over the Unix socket; the rows, unaligned, one per line.
    pub fn psql(&self, sql: &str) -> String {
        let psql = self.bin.join("psql");
        let psql = if psql.exists() {
            psql
        } else {
            PathBuf::from("psql")
        };
        let mut cmd = self.command(&psql);
        cmd.args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.socket_dir())
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                sql,
            ]);
        let out = cmd.output().expect("running psql");
        assert!(out.status.success(), "psql {sql:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn command(&self, program: &Path) -> Command {
        if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }

    fn run(&self, tool: &str, args: &[&std::ffi::OsStr]) -> Output {
        let mut cmd = self.command(&self.bin.join(tool));
        cmd.args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        cmd.output()
            .unwrap_or_else(|e| panic!("running {tool}: {e}"))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data_dir();
        let _ = self
            .command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` with `initdb` in it.
fn server_bin() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server under /usr/lib/postgresql/<version>/bin (initdb, pg_ctl): \
             install Debian's `postgresql` package (bash .ci/run does)"
        )
    })
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
