//! The API under test, shared by this crate's integration tests: a real [`Api`] over a real
//! in-memory CA, the real [`TokenReviewAuthenticator`] over a fake [`TokenReviewer`], a fake
//! [`PodDirectory`], and a CA key that can be switched off.

// Fixture helpers panic on a broken fixture as the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use podca_grpc::auth::{
    Authenticator, BearerToken, LookupError, NamedPod, PodDirectory, PodInfo, ReviewStatus,
    TokenReviewAuthenticator, TokenReviewer,
};
use podca_grpc::{Api, ApiOptions, CaHandle};
use podca_signer::{BackendError, CaAlgorithm, CaKey, IssuingCa, KeyType, MemoryKey, SignerPolicy};
use time::OffsetDateTime;

const AUDIENCE: &str = "podca";
const NODE_PROXY: &str = "kube-system/node-proxy";

/// Tokens are plain names; each one answers as its comment says.
#[derive(Debug)]
pub struct FakeReviewer;

#[tonic::async_trait]
impl TokenReviewer for FakeReviewer {
    async fn review(
        &self,
        token: &BearerToken,
        audience: &str,
    ) -> Result<ReviewStatus, LookupError> {
        let service_account = |username: &str, node: Option<&str>| ReviewStatus {
            authenticated: true,
            username: format!("system:serviceaccount:{username}"),
            audiences: vec![audience.to_owned()],
            extra: node
                .map(|n| {
                    BTreeMap::from([(
                        "authentication.kubernetes.io/node-name".to_owned(),
                        vec![n.to_owned()],
                    )])
                })
                .unwrap_or_default(),
            error: None,
            uid: None,
        };
        // Bound to the pod `kube-system/<pod>` with the UID `uid-<pod>`, on node-a.
        let bound_proxy = |pod: &str| {
            let mut status = service_account("kube-system:node-proxy", Some("node-a"));
            for (key, value) in [
                ("pod-name", pod.to_owned()),
                ("pod-uid", format!("uid-{pod}")),
            ] {
                status
                    .extra
                    .insert(format!("authentication.kubernetes.io/{key}"), vec![value]);
            }
            status
        };
        match token.expose() {
            // A workload on node-a.
            "web" => Ok(service_account("shop:web", Some("node-a"))),
            // The node proxy of node-a, with a pod-bound token (its pod node-proxy-0 exists).
            "proxy" => Ok(bound_proxy("node-proxy-0")),
            // Bound to a pod that has gone.
            "proxy-gone" => Ok(bound_proxy("node-proxy-gone")),
            // Bound to a pod whose name now belongs to another pod (another UID).
            "proxy-replaced" => Ok(bound_proxy("node-proxy-replaced")),
            // Names a node but no pod.
            "proxy-nodeonly" => Ok(service_account("kube-system:node-proxy", Some("node-a"))),
            // The node proxy with a token bound to no pod (so to no node).
            "proxy-unbound" => Ok(service_account("kube-system:node-proxy", None)),
            // A namespace the default signer excludes.
            "forbidden" => Ok(service_account("forbidden:web", None)),
            "review-down" => Err(LookupError::Failed("connection refused".into())),
            "review-slow" => Err(LookupError::Timeout(Duration::from_secs(5))),
            _ => Ok(ReviewStatus {
                error: Some("token has been revoked".into()),
                ..Default::default()
            }),
        }
    }
}

#[derive(Debug)]
pub struct FakePods;

#[tonic::async_trait]
impl PodDirectory for FakePods {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodInfo>, LookupError> {
        let on = |node: &str| PodInfo {
            service_account: "web".into(),
            node_name: Some(node.into()),
            uid: Some(format!("uid-{name}")),
            phase: Some("Running".into()),
            ..Default::default()
        };
        match (namespace, name) {
            ("kube-system", "node-proxy-0") => Ok(Some(on("node-a"))),
            ("kube-system", "node-proxy-replaced") => Ok(Some(PodInfo {
                uid: Some("uid-of-a-newer-pod".into()),
                ..on("node-a")
            })),
            ("shop", "web-0") => Ok(Some(on("node-a"))),
            ("shop", "leaving") => Ok(Some(PodInfo {
                terminating: true,
                ..on("node-a")
            })),
            ("shop", "done") => Ok(Some(PodInfo {
                phase: Some("Succeeded".into()),
                ..on("node-a")
            })),
            ("shop", "crashed") => Ok(Some(PodInfo {
                phase: Some("Failed".into()),
                ..on("node-a")
            })),
            ("shop", "static-web") => Ok(Some(PodInfo {
                mirror: true,
                ..on("node-a")
            })),
            ("shop", "db-0") => Ok(Some(on("node-b"))),
            ("shop", "broken") => Err(LookupError::Failed("pods \"broken\" is forbidden".into())),
            ("shop", "slow") => Err(LookupError::Timeout(Duration::from_secs(5))),
            _ => Ok(None),
        }
    }

    async fn pods_on_node(
        &self,
        namespace: &str,
        node: &str,
        service_account: &str,
    ) -> Result<Vec<NamedPod>, LookupError> {
        let mut found = Vec::new();
        for name in ["web-0", "leaving", "done", "crashed", "db-0"] {
            if let Ok(Some(info)) = self.pod(namespace, name).await
                && info.node_name.as_deref() == Some(node)
                && info.service_account == service_account
            {
                found.push(NamedPod {
                    name: name.into(),
                    info,
                });
            }
        }
        Ok(found)
    }

    /// Every service account exists, with the UID `uid-sa-<namespace>-<name>`.
    async fn service_account_uid(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, LookupError> {
        Ok(Some(format!("uid-sa-{namespace}-{name}")))
    }
}

/// A CA key whose backend can be switched off, like an HSM that went away.
#[derive(Debug)]
pub struct FlakyKey {
    key: MemoryKey,
    down: AtomicBool,
}

impl CaKey for FlakyKey {
    fn algorithm(&self) -> CaAlgorithm {
        self.key.algorithm()
    }
    fn public_key_raw(&self) -> &[u8] {
        self.key.public_key_raw()
    }
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(BackendError::Unavailable("HSM token removed".into()));
        }
        self.key.sign(message)
    }
    fn location(&self) -> String {
        "memory:flaky".into()
    }
}

impl FlakyKey {
    /// A P-256 key, up.
    pub fn p256() -> Self {
        FlakyKey {
            key: MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap(),
            down: AtomicBool::new(false),
        }
    }

    /// Switches the backend off: every later signature is `Unavailable("HSM token removed")`.
    pub fn remove(&self) {
        self.down.store(true, Ordering::SeqCst);
    }
}

/// What differs between the APIs of the tests.
pub struct Setup {
    pub key: Arc<dyn CaKey>,
    pub ca_lifetime: time::Duration,
    pub rate_limit_per_identity: u32,
    pub max_open_streams: usize,
    pub pods: Option<Arc<dyn PodDirectory>>,
    pub authenticator: Arc<dyn Authenticator>,
    /// A fixed API clock (the CA then starts a day before it); `None`: the system clock, and the
    /// CA starts now.
    pub now: Option<OffsetDateTime>,
    /// Where decisions are recorded; `None`: nowhere.
    pub ledger: Option<podca_grpc::ledger::LedgerHandle>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            key: Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap()),
            ca_lifetime: time::Duration::days(365),
            rate_limit_per_identity: 0,
            max_open_streams: 16,
            pods: Some(Arc::new(FakePods)),
            authenticator: Arc::new(TokenReviewAuthenticator::new(
                Arc::new(FakeReviewer),
                AUDIENCE,
            )),
            now: None,
            ledger: None,
        }
    }
}

/// The signers: `default` (excludes the namespace `forbidden`) and `p384-only`, both offered
/// over gRPC, and `pcr-only`, configured but not in the gRPC allow-list.
pub fn api(setup: Setup) -> Arc<Api> {
    let ca_start = setup
        .now
        .map_or_else(OffsetDateTime::now_utc, |now| now - time::Duration::days(1));
    let ca = IssuingCa::self_signed_root(setup.key, "grpc test root", ca_start, setup.ca_lifetime)
        .unwrap();
    let mut default = SignerPolicy::permissive("example.org");
    default.excluded_namespaces = vec!["forbidden".into()];
    let mut p384_only = SignerPolicy::permissive("example.org");
    p384_only.key_types = vec![KeyType::EcdsaP384];
    // Streams end when the shutdown sender goes away; these servers live as long as the test
    // process, so it never does.
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    std::mem::forget(stop);
    let mut api = Api::new(
        ApiOptions {
            signers: BTreeMap::from([
                ("default".into(), default),
                ("p384-only".into(), p384_only),
                ("pcr-only".into(), SignerPolicy::permissive("example.org")),
            ]),
            default_signer: "default".into(),
            allowed_signers: vec!["p384-only".into()],
            max_dns_names: 4,
            node_proxy_service_accounts: vec![NODE_PROXY.into()],
            rate_limit_per_identity: setup.rate_limit_per_identity,
            max_open_streams: setup.max_open_streams,
        },
        CaHandle::new(ca, vec![]),
        setup.authenticator,
        setup.pods,
        stop_rx,
    )
    .unwrap();
    if let Some(now) = setup.now {
        api = api.with_clock(Arc::new(move || now));
    }
    if let Some(ledger) = setup.ledger {
        api = api.with_ledger(ledger);
    }
    Arc::new(api)
}

pub fn csr_of(key: &rcgen::KeyPair) -> Vec<u8> {
    rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(key)
        .unwrap()
        .der()
        .to_vec()
}

pub fn p256_csr() -> Vec<u8> {
    csr_of(&rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap())
}
