//! The in-cluster gRPC path: the real `podca serve` binary against the API emulator, with its
//! `KubeTokenReviewer` (TokenReview) and `KubePodDirectory` (pod lookups) — the gRPC code lives
//! in the binary, so the test talks to the process with the `podca-proto` client.
//!
//! podca's identity has exactly the RBAC the gRPC API needs: `tokenreviews create` and
//! `pods get`. (Its PodCertificateRequest controller is refused and retries in the background;
//! the gRPC API does not depend on it.)

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::{
    IssueCertificateRequest, IssueCertificateResponse, IssueForPodRequest,
};
use podca_tests::cluster::{ClusterConfig, PODCA_USER};
use podca_tests::emulator::{
    ApiMode, FaultScope, PodFixture, PolicyRule, ServiceAccountToken, Subject,
};
use podca_tests::process::{csr_for, free_port, podca_binary, podca_bundle};
use podca_tests::verify::assert_verifies;
use podca_tests::{Emulator, EmulatorConfig};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const SIGNER: &str = "example.com/workload";
const NODE_PROXY: &str = "mesh/node-proxy";

/// The emulator, a CA and a running `podca serve` whose gRPC API uses them.
struct Cluster {
    emu: Emulator,
    serve: Child,
    grpc: u16,
    /// What clients verify the gRPC listener against (`podca bundle`).
    anchors: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
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

        let ca_dir = dir.path().join("ca");
        let init = Command::new(podca_binary())
            .args(["ca", "init", "--dir"])
            .arg(&ca_dir)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(init.success());
        let grpc = free_port();
        let config = dir.path().join("podca.toml");
        std::fs::write(
            &config,
            format!(
                "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
                 [grpc]\nlisten = \"127.0.0.1:{grpc}\"\nnode_proxy_service_accounts = [\"{NODE_PROXY}\"]\n{}",
                ca_dir.display().to_string(),
                podca_tests::tls::GRPC_TLS_CONFIG,
            ),
        )
        .unwrap();
        let anchors = podca_bundle(&ca_dir);
        let log = dir.path().join("serve.log");
        let serve = Command::new(podca_binary())
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--admin-listen", &format!("127.0.0.1:{}", free_port())])
            .env("PODCA_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut cluster = Cluster {
            emu,
            serve,
            grpc,
            anchors,
            log,
            _dir: dir,
        };
        cluster.wait_listening();
        cluster
    }

    fn wait_listening(&mut self) {
        podca_tests::process::wait_listening(&mut self.serve, self.grpc, &self.log);
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn client(&self) -> PodCaClient<Channel> {
        podca_tests::tls::client(self.grpc, &self.anchors).await
    }

    /// A service-account token TokenReview knows, for `namespace/service_account`.
    fn token(&self, namespace: &str, service_account: &str, spec: TokenSpec<'_>) -> String {
        self.emu.add_service_account_token(ServiceAccountToken {
            namespace: namespace.into(),
            service_account: service_account.into(),
            service_account_uid: podca_tests::emulator::new_uid(),
            audiences: vec![spec.audience.into()],
            expires: self.emu.now() + spec.lifetime,
            pod_name: spec.pod.map(|(name, _)| name.into()),
            pod_uid: spec.pod.map(|_| podca_tests::emulator::new_uid()),
            node_name: spec.pod.map(|(_, node)| node.into()),
            node_uid: spec.pod.map(|_| podca_tests::emulator::new_uid()),
            credential_id: podca_tests::emulator::new_uid(),
        })
    }

    fn token_reviews(&self) -> u64 {
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

#[derive(Clone, Copy)]
struct TokenSpec<'a> {
    audience: &'a str,
    lifetime: time::Duration,
    /// Pod-bound: (pod name, node name).
    pod: Option<(&'a str, &'a str)>,
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

fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

fn csr_request() -> IssueCertificateRequest {
    IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        ..Default::default()
    }
}

async fn issue(
    client: &mut PodCaClient<Channel>,
    token: Option<&str>,
) -> Result<IssueCertificateResponse, Status> {
    client
        .issue_certificate(with_token(csr_request(), token))
        .await
        .map(tonic::Response::into_inner)
}

async fn issue_for_pod(
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

fn expect_code(result: Result<impl std::fmt::Debug, Status>, code: Code, needle: &str) {
    let status = result.expect_err("the call should fail");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(needle),
        "{:?} should mention {needle:?}",
        status.message()
    );
}

/// The URI SAN of the chain's leaf.
fn leaf_uri(chain_pem: &str) -> String {
    let blocks = pem::parse_many(chain_pem).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(blocks[0].contents()).unwrap();
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    san.value
        .general_names
        .iter()
        .find_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some((*u).to_string()),
            _ => None,
        })
        .expect("the leaf has a URI SAN")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_decides_who_may_issue_and_is_cached() {
    let cluster = Cluster::start().await;
    let mut client = cluster.client().await;

    // A pod-bound token for the audience `podca`.
    cluster.emu.add_node("node-1");
    let good = cluster.token(
        "shop",
        "web",
        TokenSpec {
            pod: Some(("web-0", "node-1")),
            ..Default::default()
        },
    );
    let before = cluster.token_reviews();
    let issued = issue(&mut client, Some(&good)).await.unwrap();
    assert_eq!(issued.spiffe_id, "spiffe://cluster.local/ns/shop/sa/web");
    assert_eq!(
        leaf_uri(&issued.certificate_chain_pem),
        "spiffe://cluster.local/ns/shop/sa/web"
    );
    assert_verifies(&issued.certificate_chain_pem, &issued.trust_anchors_pem);
    assert_eq!(cluster.token_reviews(), before + 1, "one review");

    // The review is cached: a second call asks the Kubernetes API nothing.
    let again = issue(&mut client, Some(&good)).await.unwrap();
    assert_ne!(again.serial, issued.serial);
    assert_eq!(cluster.token_reviews(), before + 1, "the review was cached");

    // Refusals, with the messages the README documents.
    let wrong_audience = cluster.token(
        "shop",
        "web",
        TokenSpec {
            audience: "vault",
            ..Default::default()
        },
    );
    expect_code(
        issue(&mut client, Some(&wrong_audience)).await,
        Code::Unauthenticated,
        "invalid credentials: ",
    );
    expect_code(
        issue(&mut client, Some(&wrong_audience)).await,
        Code::Unauthenticated,
        "audiences",
    );
    let expired = cluster.token(
        "shop",
        "web",
        TokenSpec {
            lifetime: time::Duration::minutes(-1),
            ..Default::default()
        },
    );
    expect_code(
        issue(&mut client, Some(&expired)).await,
        Code::Unauthenticated,
        "expired",
    );
    expect_code(
        issue(&mut client, Some("sa.not-a-token-anyone-issued")).await,
        Code::Unauthenticated,
        "invalid credentials: ",
    );
    expect_code(
        issue(&mut client, None).await,
        Code::Unauthenticated,
        "no credentials: send `authorization: Bearer <service-account token>`",
    );
    let mut basic = Request::new(csr_request());
    basic
        .metadata_mut()
        .insert("authorization", "Basic dXNlcjpwdw==".parse().unwrap());
    expect_code(
        client.issue_certificate(basic).await,
        Code::Unauthenticated,
        "`Bearer <token>`",
    );
    // Refusals are not cached: each unknown token is asked about again.
    let reviews = cluster.token_reviews();
    expect_code(
        issue(&mut client, Some(&wrong_audience)).await,
        Code::Unauthenticated,
        "invalid credentials: ",
    );
    assert_eq!(cluster.token_reviews(), reviews + 1);
    // A refused token's message never echoes the token.
    let status = issue(&mut client, Some(&expired)).await.unwrap_err();
    assert!(!status.message().contains(&expired));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_outage_is_unavailable_not_unauthenticated() {
    let cluster = Cluster::start().await;
    let mut client = cluster.client().await;
    let token = cluster.token("shop", "web", TokenSpec::default());
    // More failures than any client-side retry would absorb.
    cluster
        .emu
        .inject_errors(503, 1000, FaultScope::PathContains("tokenreviews".into()));
    // Promptly: podca bounds its wait for the Kubernetes API (5 s) although the kube client
    // would retry 503s with backoff for minutes.
    let started = Instant::now();
    expect_code(
        issue(&mut client, Some(&token)).await,
        Code::Unavailable,
        "cannot check credentials now",
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    // The outage is not remembered as a verdict: once the API is back, the same token works.
    cluster.emu.clear_faults();
    let issued = issue(&mut client, Some(&token)).await.unwrap();
    assert_eq!(issued.spiffe_id, "spiffe://cluster.local/ns/shop/sa/web");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_for_pod_only_for_node_proxies_and_pods_on_their_node() {
    let cluster = Cluster::start().await;
    let emu = &cluster.emu;
    let mut client = cluster.client().await;
    emu.add_node("node-1");
    emu.add_node("node-2");
    for (name, node) in [("web-1", "node-1"), ("web-2", "node-2")] {
        emu.add_pod(&PodFixture {
            namespace: "apps".into(),
            name: name.into(),
            node_name: node.into(),
            service_account: "web".into(),
            ..Default::default()
        });
    }
    let (proxy_ns, proxy_sa) = NODE_PROXY.split_once('/').unwrap();
    let on_node_1 = TokenSpec {
        pod: Some(("node-proxy-x7k2p", "node-1")),
        ..Default::default()
    };
    let proxy = cluster.token(proxy_ns, proxy_sa, on_node_1);

    // A pod on the proxy's node: a certificate with the pod's identity.
    let issued = issue_for_pod(&mut client, &proxy, "apps", "web-1")
        .await
        .unwrap();
    assert_eq!(issued.spiffe_id, "spiffe://cluster.local/ns/apps/sa/web");
    assert_eq!(
        leaf_uri(&issued.certificate_chain_pem),
        "spiffe://cluster.local/ns/apps/sa/web"
    );
    assert_verifies(&issued.certificate_chain_pem, &issued.trust_anchors_pem);

    // A pod on another node.
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "web-2").await,
        Code::PermissionDenied,
        "pod apps/web-2 does not run on the caller's node node-1",
    );
    // No such pod.
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "web-9").await,
        Code::NotFound,
        "pod apps/web-9 not found",
    );
    // Names that are not Kubernetes names never reach the API.
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "").await,
        Code::InvalidArgument,
        "pod_name \"\" is not a Kubernetes object name",
    );
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "../secrets/x").await,
        Code::InvalidArgument,
        "is not a Kubernetes object name",
    );
    // A service account that is not a node proxy, even with a token naming node-1.
    let workload = cluster.token("apps", "web", on_node_1);
    expect_code(
        issue_for_pod(&mut client, &workload, "apps", "web-1").await,
        Code::PermissionDenied,
        "service account apps/web may not request certificates for other pods",
    );
    // The node proxy's service account with a token bound to no pod names no node.
    let unbound = cluster.token(proxy_ns, proxy_sa, TokenSpec::default());
    expect_code(
        issue_for_pod(&mut client, &unbound, "apps", "web-1").await,
        Code::PermissionDenied,
        "the caller's token names no node",
    );
    // Pod lookups failing is an outage, not a verdict.
    emu.inject_errors(503, 1000, FaultScope::PathContains("/pods/".into()));
    let started = Instant::now();
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "web-1").await,
        Code::Unavailable,
        "cannot check the pod now",
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}
