//! Set-up the gRPC benchmarks share: a release `podca serve` over TLS on the API emulator, with
//! a service-account token it accepts, and the CPU time a process has used so far.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::EmulatorConfig;
use crate::cluster::{Cluster, ClusterConfig, PODCA_USER};
use crate::emulator::{ApiMode, PolicyRule, ServiceAccountToken, Subject};
use crate::process::{ServeProcess, podca_binary_release, podca_bundle};

/// A release `podca serve` over TLS, its cluster, and what a client needs to call it.
pub struct TlsServe {
    pub serve: ServeProcess,
    pub cluster: Cluster,
    pub addr: SocketAddr,
    /// The CA's anchors (PEM), which the serving certificate chains to.
    pub anchors: String,
    /// A service-account token (`default/default`, audience `podca`) for `authorization`.
    pub token: String,
}

impl std::fmt::Debug for TlsServe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential: never printed.
        f.debug_struct("TlsServe")
            .field("addr", &self.addr)
            .field("pid", &self.serve.child.id())
            .finish_non_exhaustive()
    }
}

impl TlsServe {
    /// Starts `podca serve` with a fresh file CA, the one signer `example.com/workload`, no
    /// fair-share limits (one identity and one address measure podca, not its limits), and
    /// `ledger` as the `[ledger]` table's body (empty: the default redb file).
    pub async fn start(ledger: &str) -> TlsServe {
        Self::start_with(ledger, &podca_binary_release(), &[]).await
    }

    /// [`TlsServe::start`] with the `podca` at `binary` and `env` added to its environment.
    pub async fn start_with(ledger: &str, binary: &Path, env: &[(&str, &Path)]) -> TlsServe {
        let cluster = Cluster::start_with(ClusterConfig {
            emulator: EmulatorConfig {
                api_mode: ApiMode::V1Only,
                auto_create_namespaces: true,
                ..Default::default()
            },
            podca_groups: &["system:serviceaccounts"],
            // As deployed: the controller and the trust-bundle publisher run beside the gRPC
            // API (and are quiet, with no PodCertificateRequests), not refused and retrying.
            signers: &["example.com/workload"],
        })
        .await;
        cluster.emu.grant(
            Subject::User(PODCA_USER.into()),
            PolicyRule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
        );
        cluster.emu.grant(
            Subject::User(PODCA_USER.into()),
            PolicyRule::new(
                &[""],
                &["configmaps"],
                &["get", "create", "update", "patch"],
            ),
        );
        let ca_dir = cluster.dir.path().join("ca");
        let init = std::process::Command::new(podca_binary_release())
            .args(["ca", "init", "--dir"])
            .arg(&ca_dir)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run podca ca init");
        assert!(init.success(), "podca ca init failed");
        let config = cluster.dir.path().join("podca.toml");
        let ledger = if ledger.is_empty() {
            String::new()
        } else {
            format!("\n[ledger]\n{ledger}")
        };
        std::fs::write(
            &config,
            format!(
                "[ca]\ndir = {:?}\n\n[signers.\"example.com/workload\"]\ntrust_domain = \
                 \"cluster.local\"\n\n[grpc]\n{}\
                 rate_limit_per_identity = 0\nmax_connections_per_peer = 4096\n{ledger}",
                ca_dir.display().to_string(),
                crate::tls::GRPC_TLS_CONFIG
            ),
        )
        .expect("write podca.toml");
        let serve = ServeProcess::start_binary(binary, &config, &cluster.kubeconfig, &[], env);
        let addr = SocketAddr::from(([127, 0, 0, 1], serve.grpc));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "podca serve's gRPC API did not listen"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut served = TlsServe {
            serve,
            cluster,
            addr,
            anchors: podca_bundle(&ca_dir),
            token: String::new(),
        };
        served.token = served.token_for("podca");
        served
    }

    /// A new token for `default/default` with `audience` (the Istio API's is `istio-ca`).
    pub fn token_for(&self, audience: &str) -> String {
        self.cluster
            .emu
            .add_service_account_token(ServiceAccountToken {
                namespace: "default".into(),
                service_account: "default".into(),
                service_account_uid: crate::emulator::new_uid(),
                audiences: vec![audience.into()],
                expires: self.cluster.emu.now() + time::Duration::hours(1),
                pod_name: None,
                pod_uid: None,
                node_name: None,
                node_uid: None,
                credential_id: crate::emulator::new_uid(),
            })
    }
    /// The CA directory `podca serve` signs from.
    pub fn ca_dir(&self) -> std::path::PathBuf {
        self.cluster.dir.path().join("ca")
    }
}

/// The CPU time (user + system) process `pid` has used so far, from `/proc/<pid>/stat`.
pub fn process_cpu(pid: u32) -> Duration {
    cpu_from_stat(
        &std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
            .expect("read /proc/<pid>/stat"),
    )
}

/// `utime + stime` of a `/proc/<pid>/stat` line, at the kernel's USER_HZ of 100 ticks/s (the
/// value every Linux architecture exports to user space).
fn cpu_from_stat(stat: &str) -> Duration {
    // The command name (field 2) is in parentheses and may hold spaces: count after its ')'.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of the line are the 12th and 13th after the name.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let line = "4242 (podca serve) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 9 0 \
                    123 456 789";
        assert_eq!(cpu_from_stat(line), Duration::from_millis(3250));
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        // Spin until the reading shows CPU time, not for a fixed wall time: with four test
        // processes on two cores, 30 ms of wall time once gave this process less than one
        // 10 ms tick. A reader that never counts (a wrong field, say) still fails, at the
        // deadline.
        let spin = Instant::now();
        while process_cpu(std::process::id()) < Duration::from_millis(10) {
            assert!(
                spin.elapsed() < Duration::from_secs(10),
                "10 s of spinning never showed 10 ms of CPU time"
            );
            for _ in 0..100_000 {
                std::hint::black_box(0u64);
            }
        }
    }
}
