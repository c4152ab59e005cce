//! The configuration file (TOML), one schema for `podca serve` and `podca dev`.
//!
//! ```toml
//! [ca]
//! backend = "file"              # file | secret | pkcs11
//! dir = "/var/lib/podca"        # file backend: the CA data directory
//!
//! [signers."example.com/workload"]   # one table per signer name (a SignerPolicy)
//! trust_domain = "cluster.local"
//! key_types = ["ECDSAP256", "ED25519"]
//!
//! [grpc]
//! listen = "127.0.0.1:8443"
//! signer = "example.com/workload"    # whose policy gRPC requests get
//!
//! [controller]
//! workers = 8
//! ```
//! Unknown keys are errors, so a typo never silently falls back to a default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use podca_signer::SignerPolicy;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub ca: CaConfig,
    /// Signer name → policy.
    #[serde(default)]
    pub signers: BTreeMap<String, SignerPolicy>,
    #[serde(default)]
    pub grpc: GrpcConfig,
    #[serde(default)]
    pub workload_api: WorkloadApiConfig,
    #[serde(default)]
    pub dev: DevConfig,
    #[serde(default)]
    pub controller: ControllerConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    /// CA rotation schedule (podca-made CAs).
    #[serde(default)]
    pub rotation: podca_signer::rotation::Schedule,
    /// ClusterTrustBundle publishing (`podca serve`).
    #[serde(default)]
    pub trust_bundles: TrustBundlesConfig,
}

/// One ClusterTrustBundle per signer name, named `<signer with / → :>:<suffix>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustBundlesConfig {
    /// Publish (and keep) the bundles; off: manage them yourself.
    #[serde(default = "yes")]
    pub publish: bool,
    /// The end of every bundle name (a DNS-1123 subdomain).
    #[serde(default = "default_bundle_suffix")]
    pub suffix: String,
    /// The `podca.dev/instance` label: keeps two podca installations out of each other's bundles.
    #[serde(default = "default_bundle_instance")]
    pub instance: String,
    /// Full re-check of the bundles on top of the watches, in seconds.
    #[serde(default = "default_bundle_resync")]
    pub resync_seconds: u64,
}

impl Default for TrustBundlesConfig {
    fn default() -> Self {
        TrustBundlesConfig {
            publish: true,
            suffix: default_bundle_suffix(),
            instance: default_bundle_instance(),
            resync_seconds: default_bundle_resync(),
        }
    }
}

/// The default end of every ClusterTrustBundle name.
pub const DEFAULT_BUNDLE_SUFFIX: &str = "podca";
/// The default `podca.dev/instance` label.
pub const DEFAULT_BUNDLE_INSTANCE: &str = "podca";
/// The default full re-check period of the bundles.
pub const DEFAULT_BUNDLE_RESYNC: std::time::Duration = std::time::Duration::from_secs(5 * 60);

fn default_bundle_suffix() -> String {
    DEFAULT_BUNDLE_SUFFIX.into()
}
fn default_bundle_instance() -> String {
    DEFAULT_BUNDLE_INSTANCE.into()
}
fn default_bundle_resync() -> u64 {
    DEFAULT_BUNDLE_RESYNC.as_secs()
}

/// Where the CA key lives.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaConfig {
    #[serde(default)]
    pub backend: CaBackend,
    /// File backend: the CA data directory (see `podca ca init`).
    pub dir: Option<PathBuf>,
    /// Secret backend: `namespace/name` of a `kubernetes.io/tls` Secret.
    pub secret: Option<String>,
    /// PKCS#11 backend: RFC 7512 URI of the CA key (module path, token, object).
    pub pkcs11_uri: Option<String>,
    /// PKCS#11 backend: file holding the user PIN (never put the PIN itself here).
    pub pkcs11_pin_file: Option<PathBuf>,
    /// PKCS#11 backend: name of an environment variable holding the user PIN.
    pub pkcs11_pin_env: Option<String>,
    /// PKCS#11 backend: the module (overrides the URI's module-path).
    pub pkcs11_module: Option<PathBuf>,
    /// PKCS#11 backend: who signs leaves (see the operator guide for the trade-off).
    #[serde(default)]
    pub pkcs11_mode: Pkcs11Mode,
    /// PKCS#11 `intermediate` mode: lifetime of the in-memory intermediate (re-issued by the
    /// HSM at two thirds of it). Default: three times the largest leaf lifetime, at least 1 day.
    pub intermediate_lifetime_seconds: Option<u32>,
    /// Run the `[rotation]` schedule (file and PKCS#11 backends, single replica). Off, podca
    /// still follows changes made with `podca ca rotate` without a restart.
    #[serde(default = "yes")]
    pub automatic_rotation: bool,
}

impl Default for CaConfig {
    fn default() -> Self {
        CaConfig {
            backend: CaBackend::default(),
            dir: None,
            secret: None,
            pkcs11_uri: None,
            pkcs11_pin_file: None,
            pkcs11_pin_env: None,
            pkcs11_module: None,
            pkcs11_mode: Pkcs11Mode::default(),
            intermediate_lifetime_seconds: None,
            automatic_rotation: true,
        }
    }
}

/// Who signs leaves when the CA key is in an HSM.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Pkcs11Mode {
    /// The HSM key signs every leaf: the key never leaves the token, one HSM operation per leaf.
    #[default]
    HsmSignsLeaves,
    /// The HSM key signs a short-lived intermediate kept in memory, which signs leaves.
    Intermediate,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CaBackend {
    #[default]
    File,
    Secret,
    Pkcs11,
}

/// The podca.v1 gRPC API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcConfig {
    #[serde(default = "default_grpc_listen")]
    pub listen: SocketAddr,
    /// The signer name whose policy gRPC requests get; defaults to the only one configured.
    pub signer: Option<String>,
    /// Audience that service-account tokens must carry (TokenReview).
    #[serde(default = "default_audience")]
    pub token_audience: String,
    /// `namespace/name` of service accounts allowed to call IssueForPod (node-level proxies).
    #[serde(default)]
    pub node_proxy_service_accounts: Vec<String>,
    /// Requests per second allowed per identity (token bucket), 0 = unlimited.
    #[serde(default = "default_rate")]
    pub rate_limit_per_identity: u32,
    /// Server streams (WatchTrustBundle, Workload API) open at once, across all callers.
    #[serde(default = "default_max_open_streams")]
    pub max_open_streams: usize,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            listen: default_grpc_listen(),
            signer: None,
            token_audience: default_audience(),
            node_proxy_service_accounts: vec![],
            rate_limit_per_identity: default_rate(),
            max_open_streams: default_max_open_streams(),
        }
    }
}

/// The SPIFFE Workload API.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct WorkloadApiConfig {
    /// Unix socket path; defaults to `<data dir>/workload.sock` in dev mode.
    pub socket: Option<PathBuf>,
}

/// `podca dev` only: who the local callers are.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DevConfig {
    /// Unix-socket callers (by uid) mapped to identities.
    #[serde(default)]
    pub identities: Vec<DevIdentity>,
    /// Identities whose credential bundles `podca dev` keeps on disk and refreshes.
    #[serde(default)]
    pub bundles: Vec<DevBundle>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevIdentity {
    pub uid: u32,
    pub namespace: String,
    pub service_account: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevBundle {
    pub namespace: String,
    pub service_account: String,
    #[serde(default = "default_key_type")]
    pub key_type: podca_signer::KeyType,
}

/// The PodCertificateRequest controller.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// Concurrent PCR workers.
    #[serde(default = "default_workers")]
    pub workers: usize,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            workers: default_workers(),
        }
    }
}

/// /metrics, /livez, /readyz.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin_listen(),
        }
    }
}

fn default_grpc_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8443))
}
fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9090))
}
fn default_audience() -> String {
    "podca".into()
}
fn default_rate() -> u32 {
    0
}
fn default_max_open_streams() -> usize {
    10_000
}
fn default_workers() -> usize {
    8
}
fn default_key_type() -> podca_signer::KeyType {
    podca_signer::KeyType::EcdsaP256
}

impl Config {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("config file {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let config: Config = toml::from_str(text)?;
        for (name, policy) in &config.signers {
            policy
                .validate()
                .with_context(|| format!("signer {name:?}"))?;
        }
        Ok(config)
    }

    /// The longest leaf lifetime any signer issues: how long a retired CA's leaves can live.
    pub fn max_leaf_lifetime(&self) -> time::Duration {
        time::Duration::seconds(
            self.signers
                .values()
                .map(|p| i64::from(p.max_lifetime_seconds))
                .max()
                .unwrap_or(86_400),
        )
    }

    /// The policy gRPC requests get: `grpc.signer`, or the only configured signer.
    pub fn grpc_signer(&self) -> anyhow::Result<(&str, &SignerPolicy)> {
        match &self.grpc.signer {
            Some(name) => self
                .signers
                .get_key_value(name)
                .map(|(k, v)| (k.as_str(), v))
                .with_context(|| format!("grpc.signer {name:?} is not a configured signer")),
            None if self.signers.len() == 1 => self
                .signers
                .iter()
                .next()
                .map(|(k, v)| (k.as_str(), v))
                .context("no signer configured"),
            None => anyhow::bail!(
                "{} signers are configured; set grpc.signer to choose one for gRPC requests",
                self.signers.len()
            ),
        }
    }
}

/// `namespace/name` of a Secret (`[ca] secret`, `podca ca show --secret`).
pub fn secret_ref(text: &str) -> anyhow::Result<(&str, &str)> {
    text.split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
        .with_context(|| format!("{text:?}: expected \"<namespace>/<name>\""))
}
