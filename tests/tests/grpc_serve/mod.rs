//! The in-cluster gRPC harness shared by `grpc_tokenreview`, `grpc_authz` and `grpc_health`:
//! the API emulator, a CA, and the real `podca serve` binary whose gRPC API uses the
//! emulator's TokenReview and pods (`KubeTokenReviewer`, `KubePodDirectory`).
//!
//! podca's identity has exactly the RBAC the gRPC API needs: `tokenreviews create`, `pods
//! get` and `serviceaccounts get`. (Its PodCertificateRequest controller is refused and retries in the background;
//! the gRPC API does not depend on it.)

#![allow(dead_code)] // each test binary uses part of the harness

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::{
    IssueCertificateRequest, IssueCertificateResponse, IssueForPodRequest,
};
use podca_tests::cluster::{ClusterConfig, PODCA_USER};
use podca_tests::emulator::{ApiMode, PodFixture, PolicyRule, ServiceAccountToken, Subject};
use podca_tests::process::{csr_for, free_port, podca_binary, podca_bundle};
use podca_tests::{Emulator, EmulatorConfig};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

pub const SIGNER: &str = "example.com/workload";
/// A second signer, configured (for PodCertificateRequests) but not offered over gRPC.
pub const PCR_ONLY_SIGNER: &str = "example.com/pcr-only";
pub const NODE_PROXY: &str = "mesh/node-proxy";

/// A SoftHSM2 token (`podca_tests::softhsm::softhsm_token`) for the CA key.
pub struct HsmCa {
    pub softhsm_conf: PathBuf,
    pub token: String,
    pub pin_file: PathBuf,
}

impl HsmCa {
    /// Where `podca ca init --pkcs11-generate` makes the CA key.
    pub fn ca_uri(&self) -> String {
        format!(
            "pkcs11:token={};object=podca-ca?module-path={}",
            self.token,
            podca_tests::softhsm::SOFTHSM2_MODULE
        )
    }
}

/// The emulator, a CA and a running `podca serve` whose gRPC API uses them.
pub struct Cluster {
    pub emu: Emulator,
    pub serve: Child,
    pub grpc: u16,
    pub admin: u16,
    /// What clients verify the gRPC listener against (`podca bundle`).
    pub anchors: String,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub async fn start() -> Cluster {
        Self::start_with("").await
    }

    /// With `grpc_lines` added to the `[grpc]` table.
    pub async fn start_with(grpc_lines: &str) -> Cluster {
        Self::start_with_ca(grpc_lines, None).await
    }

    /// With `grpc_lines` added to the `[grpc]` table and, given `hsm`, the CA key generated in
    /// its token (`podca ca init --pkcs11-generate`, `[ca] backend = "pkcs11"`).
    pub async fn start_with_ca(grpc_lines: &str, hsm: Option<&HsmCa>) -> Cluster {
        Self::start_full("", grpc_lines, hsm).await
    }

    /// With `signer_lines` added to the policy of [`SIGNER`] (keys, then its `[[…rules]]`
    /// tables) and `grpc_lines` to the `[grpc]` table.
    pub async fn start_with_signer(signer_lines: &str, grpc_lines: &str) -> Cluster {
        Self::start_full(signer_lines, grpc_lines, None).await
    }

    async fn start_full(signer_lines: &str, grpc_lines: &str, hsm: Option<&HsmCa>) -> Cluster {
        // podca with no signer role: its PodCertificateRequest controller is refused.
        let podca_tests::cluster::Cluster {
            emu,
            dir,
            kubeconfig,
            ..
        } = podca_tests::cluster::Cluster::start_with(ClusterConfig {
            emulator: EmulatorConfig {
                api_mode: ApiMode::V1Only,
                auto_create_namespaces: true,
                ..Default::default()
            },
            podca_groups: &["system:serviceaccounts"],
            signers: &[],
        })
        .await;
        // Exactly what the gRPC API needs of the Kubernetes API.
        let podca = || Subject::User(PODCA_USER.into());
        emu.grant(
            podca(),
            PolicyRule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
        );
        emu.grant(podca(), PolicyRule::new(&[""], &["pods"], &["get"]));
        // mTLS renewal reads the renewing certificate's service account.
        emu.grant(
            podca(),
            PolicyRule::new(&[""], &["serviceaccounts"], &["get"]),
        );

        let ca_dir = dir.path().join("ca");
        let mut init = Command::new(podca_binary());
        init.args(["ca", "init", "--dir"]).arg(&ca_dir);
        let mut ca_table = format!("[ca]\ndir = {:?}\n", ca_dir.display().to_string());
        if let Some(hsm) = hsm {
            init.args(["--pkcs11-uri", &hsm.ca_uri(), "--pkcs11-generate"])
                .arg("--pkcs11-pin-file")
                .arg(&hsm.pin_file)
                .env("SOFTHSM2_CONF", &hsm.softhsm_conf);
            ca_table.push_str(&format!(
                "backend = \"pkcs11\"\npkcs11_pin_file = {:?}\n",
                hsm.pin_file.display().to_string()
            ));
        }
        let init = init.stdout(Stdio::null()).status().unwrap();
        assert!(init.success());
        let grpc = free_port();
        let admin = free_port();
        // The Istio CA API is opt-in; the harness serves it unless a test says otherwise.
        let istio = if grpc_lines.contains("istio =") {
            ""
        } else {
            "istio = true\n"
        };
        let config = dir.path().join("podca.toml");
        std::fs::write(
            &config,
            format!(
                "{ca_table}\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\
                 {signer_lines}\n\n\
                 [signers.\"{PCR_ONLY_SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
                 [grpc]\nlisten = \"127.0.0.1:{grpc}\"\nsigner = \"{SIGNER}\"\n\
                 node_proxy_service_accounts = [\"{NODE_PROXY}\"]\n{}{istio}{grpc_lines}\n",
                podca_tests::tls::GRPC_TLS_CONFIG,
            ),
        )
        .unwrap();
        let anchors = podca_bundle(&ca_dir);
        let log = dir.path().join("serve.log");
        let mut serve = Command::new(podca_binary());
        if let Some(hsm) = hsm {
            serve.env("SOFTHSM2_CONF", &hsm.softhsm_conf);
        }
        let serve = serve
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            // The per-request lines (the cluster id of an Istio caller, …) are at debug.
            .env("PODCA_LOG", "info,podca_grpc=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut cluster = Cluster {
            emu,
            serve,
            grpc,
            admin,
            anchors,
            log,
            _dir: dir,
        };
        podca_tests::process::wait_listening(&mut cluster.serve, cluster.grpc, &cluster.log);
        cluster
    }

    /// The CA data directory `podca serve` uses (its ledger.redb, its `jwt/` keys).
    pub fn ca_dir(&self) -> PathBuf {
        self._dir.path().join("ca")
    }

    /// Kills `podca serve` (SIGKILL) and waits for it, so that its files may be opened.
    pub fn kill_serve(&mut self) {
        let _ = self.serve.kill();
        let _ = self.serve.wait();
    }

    /// podca's log. It is a file, not a terminal, so it must hold plain lines: no colour codes
    /// (ANSI escapes) for `grep` and log shippers to trip over.
    pub fn log_text(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(
            !log.contains('\u{1b}'),
            "colour codes in a log file:\n{log}"
        );
        log
    }

    pub async fn client(&self) -> PodCaClient<Channel> {
        podca_tests::tls::client(self.grpc, &self.anchors).await
    }

    /// A TLS channel to the gRPC listener, for the other services on it.
    pub async fn channel(&self) -> Channel {
        podca_tests::tls::TlsChannel::connect(
            std::net::SocketAddr::from(([127, 0, 0, 1], self.grpc)),
            &self.anchors,
            podca_tests::tls::SERVER_NAME,
        )
        .await
        .unwrap()
        .channel
    }

    /// `/metrics` of the admin listener.
    pub fn metrics(&self) -> String {
        let (code, body) =
            podca_tests::process::http_get(self.admin, "/metrics").expect("the admin listener");
        assert_eq!(code, 200, "{body}");
        body
    }

    /// A service-account token TokenReview knows, for `namespace/service_account`.
    pub fn token(&self, namespace: &str, service_account: &str, spec: TokenSpec<'_>) -> String {
        self.emu.add_service_account_token(ServiceAccountToken {
            namespace: namespace.into(),
            service_account: service_account.into(),
            service_account_uid: podca_tests::emulator::new_uid(),
            audiences: vec![spec.audience.into()],
            expires: self.emu.now() + spec.lifetime,
            pod_name: spec.pod.map(|p| p.name.into()),
            pod_uid: spec.pod.map(|p| {
                p.uid
                    .map(str::to_owned)
                    .or_else(|| self.emu.pod_uid(namespace, p.name))
                    .unwrap_or_else(podca_tests::emulator::new_uid)
            }),
            node_name: spec.pod.map(|p| p.node.into()),
            node_uid: spec.pod.map(|_| podca_tests::emulator::new_uid()),
            credential_id: podca_tests::emulator::new_uid(),
        })
    }

    /// A pod `namespace/name` on `node` running as `service_account`; its UID.
    pub fn pod(&self, namespace: &str, name: &str, node: &str, service_account: &str) -> String {
        self.emu.add_pod(&PodFixture {
            namespace: namespace.into(),
            name: name.into(),
            node_name: node.into(),
            service_account: service_account.into(),
            ..Default::default()
        })
    }

    pub fn token_reviews(&self) -> u64 {
        self.emu.counters().token_reviews
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.serve.kill();
        let _ = self.serve.wait();
        if std::thread::panicking() {
            eprintln!("--- podca serve log ---\n{}", self.log_text());
        }
    }
}

/// The pod a token is bound to.
#[derive(Clone, Copy)]
pub struct BoundPod<'a> {
    pub name: &'a str,
    pub node: &'a str,
    /// The UID the token names; default: the pod's in the emulator (a random one if none).
    pub uid: Option<&'a str>,
}

#[derive(Clone, Copy)]
pub struct TokenSpec<'a> {
    pub audience: &'a str,
    pub lifetime: time::Duration,
    pub pod: Option<BoundPod<'a>>,
}

impl Default for TokenSpec<'_> {
    fn default() -> Self {
        TokenSpec {
            audience: "podca",
            lifetime: time::Duration::hours(1),
            pod: None,
        }
    }
}

impl<'a> TokenSpec<'a> {
    /// Bound to the pod `name` on `node`.
    pub fn bound(name: &'a str, node: &'a str) -> Self {
        TokenSpec {
            pod: Some(BoundPod {
                name,
                node,
                uid: None,
            }),
            ..Default::default()
        }
    }
}

pub fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

pub fn csr_request() -> IssueCertificateRequest {
    IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        ..Default::default()
    }
}

pub async fn issue(
    client: &mut PodCaClient<Channel>,
    token: Option<&str>,
) -> Result<IssueCertificateResponse, Status> {
    client
        .issue_certificate(with_token(csr_request(), token))
        .await
        .map(tonic::Response::into_inner)
}

pub async fn issue_for_pod(
    client: &mut PodCaClient<Channel>,
    token: &str,
    namespace: &str,
    pod: &str,
) -> Result<IssueCertificateResponse, Status> {
    let message = IssueForPodRequest {
        pod_namespace: namespace.into(),
        pod_name: pod.into(),
        request: Some(csr_request()),
    };
    client
        .issue_for_pod(with_token(message, Some(token)))
        .await
        .map(tonic::Response::into_inner)
}

pub fn expect_code(result: Result<impl std::fmt::Debug, Status>, code: Code, needle: &str) {
    let status = result.expect_err("the call should fail");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(needle),
        "{:?} should mention {needle:?}",
        status.message()
    );
}
