//! An emulated cluster set up the way podca runs in one: the API emulator, podca's identity with
//! the spec §3 signer role for each signer name, its kubeconfig on disk, an admin client, and
//! PodCertificateRequests filed by hand (without a pod or a kubelet behind them).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::client::KubeClient;
use crate::emulator::{ApiMode, Emulator, EmulatorConfig, PodFixture, Res, new_uid};
use crate::kubelet::{KeyType, PodRef};

/// podca's user name: the service account `podca/podca`.
pub const PODCA_USER: &str = "system:serviceaccount:podca:podca";
/// The emulator identity (and kubeconfig user) podca runs as.
pub const PODCA_IDENTITY: &str = "podca";
/// The groups a service account's token authenticates with.
pub const SERVICE_ACCOUNT_GROUPS: &[&str] = &["system:serviceaccounts", "system:authenticated"];

/// How to set a [`Cluster`] up.
#[derive(Debug, Clone)]
pub struct ClusterConfig<'a> {
    pub emulator: EmulatorConfig,
    /// The groups of podca's identity. Without `system:serviceaccounts` podca gets no built-in
    /// read access to ClusterTrustBundles, only what the signer role grants.
    pub podca_groups: &'a [&'a str],
    /// The signer names podca gets the signer role for.
    pub signers: &'a [&'a str],
}

impl Default for ClusterConfig<'_> {
    fn default() -> Self {
        ClusterConfig {
            emulator: EmulatorConfig::default(),
            podca_groups: SERVICE_ACCOUNT_GROUPS,
            signers: &[],
        }
    }
}

/// A running emulator with podca's identity, grants and kubeconfig.
#[derive(Debug)]
pub struct Cluster {
    pub emu: Emulator,
    /// A client with the emulator's admin token.
    pub admin: KubeClient,
    /// Holds the kubeconfigs; tests put their CA directories and config files here too.
    pub dir: tempfile::TempDir,
    /// podca's kubeconfig.
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// An emulator serving `mode` that creates namespaces on first use, with podca as a
    /// service account holding the signer role for `signers`.
    pub async fn start(mode: ApiMode, signers: &[&str]) -> Cluster {
        Self::start_with(ClusterConfig {
            emulator: EmulatorConfig {
                api_mode: mode,
                auto_create_namespaces: true,
                ..Default::default()
            },
            signers,
            ..Default::default()
        })
        .await
    }

    pub async fn start_with(config: ClusterConfig<'_>) -> Cluster {
        let ClusterConfig {
            emulator,
            podca_groups,
            signers,
        } = config;
        let emu = Emulator::start(emulator)
            .await
            .unwrap_or_else(|e| panic!("the emulator starts: {e}"));
        emu.add_identity(PODCA_IDENTITY, PODCA_USER, podca_groups);
        for signer in signers {
            emu.grant_signer_role(PODCA_USER, signer);
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let admin = KubeClient::new(emu.base_url(), &emu.admin_token());
        let mut cluster = Cluster {
            emu,
            admin,
            dir,
            kubeconfig: PathBuf::new(),
        };
        cluster.kubeconfig = cluster.write_kubeconfig(PODCA_IDENTITY);
        cluster
    }

    /// What the `podca serve` tests start from: a v1-only emulator that creates namespaces on
    /// first use, podca in `system:authenticated` with the signer role for `signer`,
    /// `namespace` made, and a CA made by `podca ca init` in `<dir>/ca` (returned).
    pub async fn for_serve(signer: &str, namespace: &str) -> (Cluster, PathBuf) {
        Cluster::for_serve_with(signer, namespace, EmulatorConfig::default()).await
    }

    /// [`Cluster::for_serve`] on an emulator configured as `emulator` (its API mode and
    /// namespace creation set as there).
    pub async fn for_serve_with(
        signer: &str,
        namespace: &str,
        emulator: EmulatorConfig,
    ) -> (Cluster, PathBuf) {
        let cluster = Cluster::start_with(ClusterConfig {
            emulator: EmulatorConfig {
                api_mode: ApiMode::V1Only,
                auto_create_namespaces: true,
                ..emulator
            },
            podca_groups: &["system:authenticated"],
            signers: &[signer],
        })
        .await;
        cluster.emu.add_namespace(namespace);
        let ca_dir = cluster.dir.path().join("ca");
        crate::process::podca_ca_init(&ca_dir);
        (cluster, ca_dir)
    }

    /// Writes a kubeconfig for the emulator identity `identity` into [`Cluster::dir`].
    pub fn write_kubeconfig(&self, identity: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{identity}.kubeconfig"));
        self.emu
            .write_kubeconfig(&path, identity)
            .unwrap_or_else(|e| panic!("kubeconfig for {identity}: {e}"));
        path
    }

    /// Files a PCR for a fresh P-256 stub in `apps` (see [`NewPcr::p256`]).
    pub async fn file_pcr(&self, name: &str, signer: &str) {
        NewPcr::p256(name, signer).file(&self.admin).await;
    }

    /// Waits until the PCR `apps/name` has a condition, asserts that it is `Issued`, and
    /// returns its certificate chain.
    pub async fn wait_issued(&self, name: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let o = self
                .emu
                .get_object(Res::Pcr, "apps", name)
                .unwrap_or_else(|| panic!("PCR apps/{name} exists"));
            if let Some(t) = o["status"]["conditions"][0]["type"].as_str() {
                assert_eq!(t, "Issued", "{o:#}");
                return o["status"]["certificateChain"]
                    .as_str()
                    .unwrap_or_else(|| panic!("an Issued PCR has a chain: {o:#}"))
                    .to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "apps/{name} not issued within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Adds the service account `namespace/service_account` and the pod `namespace/name` on `node`
/// (name, uid) with one pod-certificate projection per (signer, key type), and returns the pod as
/// the kubelet simulator files requests for it.
pub fn add_pod(
    emu: &Emulator,
    namespace: &str,
    name: &str,
    service_account: &str,
    (node_name, node_uid): (&str, &str),
    certificates: &[(&str, KeyType)],
) -> PodRef {
    let service_account_uid = emu.add_service_account(namespace, service_account);
    let uid = emu.add_pod(&PodFixture {
        namespace: namespace.into(),
        name: name.into(),
        node_name: node_name.into(),
        service_account: service_account.into(),
        pod_certificates: certificates
            .iter()
            .map(|(signer, key_type)| ((*signer).to_owned(), key_type.name().to_owned()))
            .collect(),
        ..Default::default()
    });
    PodRef {
        namespace: namespace.into(),
        name: name.into(),
        uid,
        service_account: service_account.into(),
        service_account_uid,
        node_name: node_name.into(),
        node_uid: node_uid.into(),
    }
}

/// A PodCertificateRequest filed with the admin token for a pod that need not exist (the
/// signer does not look pods up).
#[derive(Debug, Clone)]
pub struct NewPcr<'a> {
    /// `v1` or `v1beta1`.
    pub version: &'a str,
    pub namespace: &'a str,
    pub name: String,
    pub signer: &'a str,
    /// DER of `stubPKCS10Request`.
    pub stub: Option<Vec<u8>>,
    /// DER of `pkixPublicKey` and `proofOfPossession` (v1beta1).
    pub legacy: Option<(Vec<u8>, Vec<u8>)>,
    pub pod_uid: String,
    pub annotations: Option<Value>,
}

impl<'a> NewPcr<'a> {
    /// A request carrying the stub CSR `csr` (DER), for a fresh pod UID.
    pub fn stub(
        version: &'a str,
        namespace: &'a str,
        name: String,
        signer: &'a str,
        csr: Vec<u8>,
    ) -> Self {
        NewPcr {
            version,
            namespace,
            name,
            signer,
            stub: Some(csr),
            legacy: None,
            pod_uid: new_uid(),
            annotations: None,
        }
    }

    /// A v1 request in `apps` with the stub of a fresh P-256 key.
    pub fn p256(name: &str, signer: &'a str) -> Self {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .unwrap_or_else(|e| panic!("P-256 key: {e}"));
        Self::stub("v1", "apps", name.to_owned(), signer, stub_csr(&key))
    }

    /// POSTs the request and asserts `201 Created`.
    pub async fn file(&self, admin: &KubeClient) {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut spec = json!({
            "signerName": self.signer,
            "podName": format!("pod-{}", self.name),
            "podUID": self.pod_uid,
            "serviceAccountName": "app",
            "serviceAccountUID": "7f0c1e0a-0000-4000-8000-000000000001",
            "nodeName": "node-1",
            "nodeUID": "7f0c1e0a-0000-4000-8000-000000000002",
            "maxExpirationSeconds": 86400,
        });
        if let Some(stub) = &self.stub {
            spec["stubPKCS10Request"] = json!(b64(stub));
        }
        if let Some((spki, pop)) = &self.legacy {
            spec["pkixPublicKey"] = json!(b64(spki));
            spec["proofOfPossession"] = json!(b64(pop));
        }
        if let Some(a) = &self.annotations {
            spec["unverifiedUserAnnotations"] = a.clone();
        }
        let body = json!({
            "apiVersion": format!("certificates.k8s.io/{}", self.version),
            "kind": "PodCertificateRequest",
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": spec,
        });
        let path = format!(
            "/apis/certificates.k8s.io/{}/namespaces/{}/podcertificaterequests",
            self.version, self.namespace
        );
        let resp = admin
            .post(&path, &body)
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        assert_eq!(
            resp.status,
            201,
            "create {}/{}: {}",
            self.namespace,
            self.name,
            String::from_utf8_lossy(&resp.body)
        );
    }
}

/// DER of a stub CSR (empty subject) for `key`, as the kubelet makes it.
pub fn stub_csr(key: &rcgen::KeyPair) -> Vec<u8> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .serialize_request(key)
        .unwrap_or_else(|e| panic!("stub CSR: {e}"))
        .der()
        .to_vec()
}
