//! Set-up the benchmarks share: a release `podca serve` over TLS on the API emulator, with a
//! service-account token it accepts; the CPU time a process has used so far; and the emulator's
//! raw `/status` PATCH ceiling ([`raw_patch_ceiling`]), what a signer that costs nothing could
//! reach.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use podca_signer::{
    CaAlgorithm, CertificateRequest, IssuingCa, MemoryKey, Outcome, SignerPolicy, SubjectKey,
    sign_request,
};
use serde_json::{Value, json};

use crate::client::KubeClient;
use crate::cluster::{Cluster, ClusterConfig, PODCA_IDENTITY, PODCA_USER};
use crate::emulator::{ApiMode, PolicyRule, Res, ServiceAccountToken, Subject};
use crate::process::{ServeProcess, podca_binary_release, podca_bundle};
use crate::{Emulator, EmulatorConfig};

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
        Self::start_configured(ledger, "", binary, env).await
    }

    /// [`TlsServe::start_with`] with `extra` appended to the config file (more tables).
    pub async fn start_configured(
        ledger: &str,
        extra: &str,
        binary: &Path,
        env: &[(&str, &Path)],
    ) -> TlsServe {
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
                 rate_limit_per_identity = 0\nmax_connections_per_peer = 4096\nistio = true\n{ledger}\
                 {extra}",
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

    /// A new token for `default/default` with `audience` (the Istio API's is `podca-istio`).
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

/// `/proc/<pid>/stat`; `None` when the process has exited.
fn read_stat(pid: u32) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()
}

/// The fields of a stat line after the command name (field 2), which is in parentheses and may
/// hold spaces: the first is field 3.
fn fields_after_name(stat: &str) -> Vec<&str> {
    stat[stat.rfind(')').expect("a stat line") + 1..]
        .split_whitespace()
        .collect()
}

/// The parent of process `pid` (field 4; `None` when it has exited).
pub fn parent_pid(pid: u32) -> Option<u32> {
    fields_after_name(&read_stat(pid)?).get(1)?.parse().ok()
}

/// [`process_cpu`], or zero when the process has exited meanwhile.
pub fn process_cpu_if_alive(pid: u32) -> Duration {
    read_stat(pid).map_or(Duration::ZERO, |stat| cpu_from_stat(&stat))
}

/// The CPU time (user + system) process `pid` has used so far, from `/proc/<pid>/stat`.
pub fn process_cpu(pid: u32) -> Duration {
    cpu_from_stat(&read_stat(pid).expect("read /proc/<pid>/stat"))
}

/// `utime + stime` of a `/proc/<pid>/stat` line, at the kernel's USER_HZ of 100 ticks/s (the
/// value every Linux architecture exports to user space).
fn cpu_from_stat(stat: &str) -> Duration {
    let fields = fields_after_name(stat);
    // Fields 14 and 15 of the line are the 12th and 13th after the name.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// The signer the burst benchmark's PCRs name.
pub const BENCH_SIGNER: &str = "example.com/workload";

/// The namespace the burst benchmark files its PCRs in.
pub const BENCH_NAMESPACE: &str = "bench";

/// A subject key's stub CSR, as DER and as the base64 of `spec.stubPKCS10Request`.
#[derive(Debug)]
pub struct Stub {
    pub der: Vec<u8>,
    pub csr: String,
}

/// Sixteen P-256 subject keys' stub CSRs, which the benchmark's PCRs take in turn.
pub fn stubs() -> Vec<Stub> {
    (0..16)
        .map(|_| {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .expect("P-256 key generation does not fail");
            let mut p = rcgen::CertificateParams::default();
            p.distinguished_name = rcgen::DistinguishedName::new();
            let der = p
                .serialize_request(&key)
                .expect("an empty-subject CSR serializes")
                .der()
                .to_vec();
            let csr = base64::engine::general_purpose::STANDARD.encode(&der);
            Stub { der, csr }
        })
        .collect()
}

/// A PCR `name` in [`BENCH_NAMESPACE`] for [`BENCH_SIGNER`], with the stub CSR `csr` (base64).
pub fn bench_pcr(name: &str, csr: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": BENCH_NAMESPACE},
        "spec": {
            "signerName": BENCH_SIGNER, "podName": format!("pod-{name}"),
            "podUID": crate::emulator::new_uid(),
            "serviceAccountName": "app", "serviceAccountUID": "sa-uid",
            "nodeName": "node-1", "nodeUID": "node-uid", "maxExpirationSeconds": 86400,
            "stubPKCS10Request": csr,
        },
        "status": {},
    })
}

/// The emulator's raw `/status` PATCH ceiling, measured by [`raw_patch_ceiling`].
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    /// PCRs filed and settled.
    pub count: usize,
    pub concurrency: usize,
    /// From the first filing to the last PCR filed (into the store: no HTTP).
    pub filed: Duration,
    /// From the first filing to the last PATCH answered.
    pub took: Duration,
    /// PATCHes answered with anything but 200.
    pub rejected: u64,
    /// The emulator's count of writes its validation rejected during the run.
    pub validation_rejections: u64,
}

impl Ceiling {
    /// PCRs settled per second, timed like podca's burst: from the first filing.
    pub fn rate(&self) -> f64 {
        self.count as f64 / self.took.as_secs_f64()
    }

    /// PATCHes answered per second, from the first PATCH sent.
    pub fn patch_rate(&self) -> f64 {
        self.count as f64 / (self.took - self.filed).as_secs_f64()
    }
}

/// Files `count` PCRs named `<prefix>-<i>` into [`BENCH_NAMESPACE`] and settles each with one
/// merge PATCH of `/status` carrying a certificate chain built before the clock starts: what a
/// signer that costs nothing could do. `concurrency` workers each send on one kept-alive HTTP/1.1
/// connection (like kube-rs's pool) with podca's identity ([`PODCA_IDENTITY`], which must be allowed to
/// sign for [`BENCH_SIGNER`], as [`Cluster`] allows).
pub async fn raw_patch_ceiling(
    emu: &Emulator,
    stubs: &[Stub],
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> Ceiling {
    let patches = Arc::new(issued_patches(stubs));
    let token = emu.token_for(PODCA_IDENTITY).expect("podca's token");
    let client = KubeClient::new(emu.base_url(), &token);
    let rejections_before = emu.counters().validation_rejections;
    let next = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    for i in 0..count {
        emu.seed_object(
            Res::Pcr,
            bench_pcr(&format!("{prefix}-{i}"), &stubs[i % stubs.len()].csr),
        );
    }
    let filed = start.elapsed();
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let mut conn = client.keep_alive();
            let (patches, next, rejected) =
                (Arc::clone(&patches), Arc::clone(&next), Arc::clone(&rejected));
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    let path = format!(
                        "/apis/certificates.k8s.io/v1/namespaces/{BENCH_NAMESPACE}/podcertificaterequests/{prefix}-{i}/status"
                    );
                    let answer = conn
                        .merge_patch(&path, &patches[i % patches.len()])
                        .await
                        .expect("PATCH /status");
                    if answer.status != 200 && rejected.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!(
                            "ceiling: {prefix}-{i} rejected: {} {}",
                            answer.status,
                            String::from_utf8_lossy(&answer.body)
                        );
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("ceiling worker");
    }
    let took = start.elapsed();
    Ceiling {
        count,
        concurrency,
        filed,
        took,
        rejected: rejected.load(Ordering::Relaxed),
        validation_rejections: emu.counters().validation_rejections - rejections_before,
    }
}

/// One Issued `/status` merge patch per stub key, as podca writes it (chain, notBefore,
/// notAfter, beginRefreshAt, one Issued condition), signed by one issuing CA.
fn issued_patches(stubs: &[Stub]) -> Vec<Value> {
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("P-256 key generation");
    let now = time::OffsetDateTime::now_utc();
    let ca =
        IssuingCa::self_signed_root(Arc::new(key), "ceiling CA", now, time::Duration::days(30))
            .expect("a 30-day root from a fresh key");
    let policy = SignerPolicy::permissive("cluster.local");
    let rfc3339 = |t: time::OffsetDateTime| {
        t.replace_nanosecond(0)
            .expect("0 is a valid nanosecond")
            .format(&time::format_description::well_known::Rfc3339)
            .expect("a time in 0..=9999")
    };
    stubs
        .iter()
        .map(|stub| {
            let request = CertificateRequest {
                key: SubjectKey::from_stub_csr(&stub.der),
                namespace: BENCH_NAMESPACE.into(),
                service_account: "app".into(),
                pod_name: Some("pod".into()),
                max_expiration: Some(time::Duration::seconds(86400)),
                requested_lifetime: None,
                user_annotations: BTreeMap::new(),
            };
            let Outcome::Issued(cert) = sign_request(&policy, &ca, &request, now) else {
                panic!("the ceiling's certificate is not issued");
            };
            json!({"status": {
                "certificateChain": cert.chain_pem,
                "notBefore": rfc3339(cert.validity.not_before),
                "notAfter": rfc3339(cert.validity.not_after),
                "beginRefreshAt": rfc3339(cert.validity.begin_refresh_at),
                "conditions": [{
                    "type": "Issued", "status": "True", "reason": "Issued",
                    "message": format!("issued {} (serial {})", cert.spiffe_id, cert.serial),
                    "lastTransitionTime": rfc3339(now),
                }],
            }})
        })
        .collect()
}

/// Watches PCRs from now on; resolves to when each one named `<prefix>…` was first seen
/// Issued, once `count` were (or when no event came for `idle`). A stream the server ends (it
/// closes watchers that lag, as kube-apiserver does) is resumed from the last event seen.
pub async fn watch_issued(
    emu: &Emulator,
    prefix: &str,
    count: usize,
    idle: Duration,
) -> tokio::task::JoinHandle<std::collections::HashMap<String, Instant>> {
    let admin = KubeClient::new(emu.base_url(), &emu.admin_token());
    let path = |rv: &str| {
        format!(
            "/apis/certificates.k8s.io/v1/podcertificaterequests?watch=true&resourceVersion={rv}"
        )
    };
    let mut rv = emu.resource_version().to_string();
    let mut watch = admin.watch(&path(&rv)).await.expect("watch");
    let prefix = prefix.to_owned();
    tokio::spawn(async move {
        let mut issued = std::collections::HashMap::new();
        let mut last_event = Instant::now();
        while issued.len() < count {
            match watch.next_event(idle).await {
                Ok(Some(ev)) if ev["type"] != "ERROR" => {
                    last_event = Instant::now();
                    let o = &ev["object"];
                    if let Some(v) = o["metadata"]["resourceVersion"].as_str() {
                        v.clone_into(&mut rv);
                    }
                    let name = o["metadata"]["name"].as_str().unwrap_or_default();
                    if name.starts_with(&prefix) && o["status"]["conditions"][0]["type"] == "Issued"
                    {
                        issued.entry(name.to_owned()).or_insert_with(Instant::now);
                    }
                }
                Ok(None) if last_event.elapsed() < idle => match admin.watch(&path(&rv)).await {
                    Ok(w) => watch = w,
                    Err(_) => break,
                },
                _ => break,
            }
        }
        issued
    })
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
