//! The configuration file (TOML), one schema for `podca serve` and `podca dev`.
//!
//! ```toml
//! [ca]
//! backend = "file"              # file | secret | pkcs11
//! dir = "/var/lib/podca"        # file backend: the CA data directory
//!
//! [cas.payments]                # more CAs by name, each a table like [ca]
//! backend = "secret"
//! secret = "podca-system/ca-payments"
//!
//! [signers."example.com/workload"]   # one table per signer name (a SignerPolicy)
//! trust_domain = "cluster.local"
//! key_types = ["ECDSAP256", "ED25519"]
//! ca = "payments"                    # the CA it signs with; default: [ca]
//!
//! [grpc]
//! listen = "127.0.0.1:8443"
//! signer = "example.com/workload"    # whose policy gRPC requests get
//!
//! [controller]
//! workers = 8                        # where the adaptive concurrency starts
//! max_in_flight = 64                 # its bound
//! sharding = "leader"                # or "rendezvous": every replica signs its share
//! ```
//! Unknown keys are errors, so a typo never silently falls back to a default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use podca_signer::SignerPolicy;
use podca_signer::backend::PinSource;
use podca_signer::policy::PolicyError;
use podca_signer::spelling::{Spelled as _, Spelling, UnknownName};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub ca: CaConfig,
    /// Named CAs (`[cas.<name>]`, each a table like `[ca]`): a signer signs with the one its
    /// `ca` key names, or with `[ca]` (named `default`) when it names none.
    #[serde(default)]
    pub cas: BTreeMap<String, CaConfig>,
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
    /// Where decisions are recorded (`crate::ledger::config`).
    #[serde(default)]
    pub ledger: crate::ledger::LedgerConfig,
    /// JWT-SVIDs and their keys (`crate::jwt`).
    #[serde(default)]
    pub jwt: crate::jwt::JwtConfig,
    /// The SPIFFE bundle endpoint (`crate::bundle_endpoint`); absent: not served.
    #[serde(default)]
    pub bundle_endpoint: Option<crate::bundle_endpoint::BundleEndpointConfig>,
    /// Foreign trust domains whose bundles podca fetches (`[[federation]]`).
    #[serde(default)]
    pub federation: Vec<crate::bundle_endpoint::FederationConfig>,
    /// Traces over OTLP (`crate::traces`); off unless `otlp_endpoint` is set.
    #[serde(default)]
    pub tracing: crate::traces::TracingConfig,
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

/// Where the CA key lives and who drives the CA's state, parsed once from the `[ca]` table.
///
/// The table stays flat (`backend = "file" | "pkcs11" | "secret"` beside the backend's keys);
/// parsing turns it into one of these variants and refuses keys that belong to another
/// backend, so a setting can never be silently ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawCaConfig")]
pub enum CaConfig {
    /// A CA data directory with the keys in files (`podca ca init`).
    File(FileCa),
    /// A CA data directory whose active key is held in an HSM, over PKCS#11.
    Pkcs11(Pkcs11Ca),
    /// A `kubernetes.io/tls` Secret, read and watched through the Kubernetes API.
    Secret(SecretCa),
}

/// `[ca] backend = "file"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCa {
    /// The CA data directory; `podca dev` and the command line fill it in when absent.
    pub dir: Option<PathBuf>,
    /// Run the `[rotation]` schedule (single replica, writable directory).
    pub automatic_rotation: bool,
    /// A new CA split off the CA of this name (`[cas.<name>] split_from`): while `dir` holds no
    /// CA yet, podca serve and podca dev make it at start as a copy of that CA's generations and
    /// rotate it to a key of its own at once (published first, signing after the propagation
    /// window); ignored once `dir` holds a CA.
    pub split_from: Option<String>,
}

/// `[ca] backend = "pkcs11"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pkcs11Ca {
    /// The CA data directory holding the public certificates and the key's location.
    pub dir: Option<PathBuf>,
    /// RFC 7512 URI of the CA key; default: the location recorded in the data directory.
    pub uri: Option<String>,
    /// The module (overrides the URI's module-path).
    pub module: Option<PathBuf>,
    /// Where the user PIN is read from (never the config file itself).
    pub pin: PinSource,
    /// Who signs leaves.
    pub mode: Pkcs11Mode,
    /// Run the `[rotation]` schedule.
    pub automatic_rotation: bool,
}

/// `[ca] backend = "secret"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretCa {
    pub namespace: String,
    pub name: String,
}

/// Who signs leaves when the CA key is in an HSM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pkcs11Mode {
    /// The HSM key signs every leaf: the key never leaves the token, one HSM operation per leaf.
    #[default]
    HsmSignsLeaves,
    /// The HSM key signs a short-lived intermediate kept in memory, which signs leaves.
    Intermediate {
        /// Lifetime of the in-memory intermediate (re-issued by the HSM at two thirds of it);
        /// `None`: three times the largest leaf lifetime, at least one day.
        lifetime_seconds: Option<u32>,
    },
}

impl Default for CaConfig {
    fn default() -> Self {
        CaConfig::File(FileCa {
            dir: None,
            automatic_rotation: true,
            split_from: None,
        })
    }
}

impl CaConfig {
    /// The CA data directory (`[ca] dir`); none for a Secret-held CA.
    pub fn dir(&self) -> Option<&std::path::Path> {
        match self {
            CaConfig::File(f) => f.dir.as_deref(),
            CaConfig::Pkcs11(p) => p.dir.as_deref(),
            CaConfig::Secret(_) => None,
        }
    }

    /// The backend's name as the config file spells it.
    pub fn backend_name(&self) -> &'static str {
        match self {
            CaConfig::File(_) => "file",
            CaConfig::Pkcs11(_) => "pkcs11",
            CaConfig::Secret(_) => "secret",
        }
    }

    /// Whether podca takes scheduled rotation steps itself (file and PKCS#11 backends; a
    /// Secret-held CA is rotated by replacing the Secret).
    pub fn automatic_rotation(&self) -> bool {
        match self {
            CaConfig::File(f) => f.automatic_rotation,
            CaConfig::Pkcs11(p) => p.automatic_rotation,
            CaConfig::Secret(_) => false,
        }
    }
}

/// Why a `[ca]` table is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaConfigError {
    #[error("[ca] {key} does not apply to backend = \"{backend}\" (it is a {owner} setting)")]
    ForeignKey {
        key: &'static str,
        backend: &'static str,
        owner: &'static str,
    },
    #[error(
        "[ca] backend = \"secret\" needs secret = \"<namespace>/<name>\" (a kubernetes.io/tls \
         Secret)"
    )]
    SecretMissing,
    #[error("[ca] secret: {0}")]
    SecretRef(#[from] SecretRefError),
    #[error("[ca] pkcs11_pin_file and pkcs11_pin_env are both set; choose one")]
    TwoPins,
    #[error(
        "[ca] backend = \"pkcs11\" needs pkcs11_pin_file or pkcs11_pin_env (the PIN is never \
         read from the config file itself)"
    )]
    NoPin,
    #[error("[ca] intermediate_lifetime_seconds is set, but pkcs11_mode is not \"intermediate\"")]
    LifetimeWithoutIntermediate,
}

/// The `[ca]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCaConfig {
    #[serde(default)]
    backend: RawBackend,
    dir: Option<PathBuf>,
    secret: Option<String>,
    pkcs11_uri: Option<String>,
    pkcs11_pin_file: Option<PathBuf>,
    pkcs11_pin_env: Option<String>,
    pkcs11_module: Option<PathBuf>,
    pkcs11_mode: Option<RawPkcs11Mode>,
    intermediate_lifetime_seconds: Option<u32>,
    automatic_rotation: Option<bool>,
    split_from: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum RawBackend {
    #[default]
    File,
    Secret,
    Pkcs11,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum RawPkcs11Mode {
    HsmSignsLeaves,
    Intermediate,
}

impl TryFrom<RawCaConfig> for CaConfig {
    type Error = CaConfigError;

    fn try_from(raw: RawCaConfig) -> Result<Self, CaConfigError> {
        let backend = match raw.backend {
            RawBackend::File => "file",
            RawBackend::Secret => "secret",
            RawBackend::Pkcs11 => "pkcs11",
        };
        let foreign = |key: &'static str, owner: &'static str| CaConfigError::ForeignKey {
            key,
            backend,
            owner,
        };
        let pkcs11_keys = [
            ("pkcs11_uri", raw.pkcs11_uri.is_some()),
            ("pkcs11_pin_file", raw.pkcs11_pin_file.is_some()),
            ("pkcs11_pin_env", raw.pkcs11_pin_env.is_some()),
            ("pkcs11_module", raw.pkcs11_module.is_some()),
            ("pkcs11_mode", raw.pkcs11_mode.is_some()),
            (
                "intermediate_lifetime_seconds",
                raw.intermediate_lifetime_seconds.is_some(),
            ),
        ];
        let no_pkcs11_keys = || match pkcs11_keys.iter().find(|(_, set)| *set) {
            Some((key, _)) => Err(foreign(key, "pkcs11")),
            None => Ok(()),
        };
        match raw.backend {
            RawBackend::File => {
                if raw.secret.is_some() {
                    return Err(foreign("secret", "secret"));
                }
                no_pkcs11_keys()?;
                Ok(CaConfig::File(FileCa {
                    dir: raw.dir,
                    automatic_rotation: raw.automatic_rotation.unwrap_or(true),
                    split_from: raw.split_from,
                }))
            }
            RawBackend::Secret | RawBackend::Pkcs11 if raw.split_from.is_some() => {
                Err(foreign("split_from", "file"))
            }
            RawBackend::Secret => {
                if raw.dir.is_some() {
                    return Err(foreign("dir", "file and pkcs11"));
                }
                if raw.automatic_rotation.is_some() {
                    return Err(foreign("automatic_rotation", "file and pkcs11"));
                }
                no_pkcs11_keys()?;
                let secret = raw.secret.ok_or(CaConfigError::SecretMissing)?;
                let (namespace, name) = secret_ref(&secret)?;
                Ok(CaConfig::Secret(SecretCa {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                }))
            }
            RawBackend::Pkcs11 => {
                if raw.secret.is_some() {
                    return Err(foreign("secret", "secret"));
                }
                let pin = match (raw.pkcs11_pin_file, raw.pkcs11_pin_env) {
                    (Some(file), None) => PinSource::File(file),
                    (None, Some(var)) => PinSource::Env(var),
                    (Some(_), Some(_)) => return Err(CaConfigError::TwoPins),
                    (None, None) => return Err(CaConfigError::NoPin),
                };
                let mode = match raw.pkcs11_mode.unwrap_or(RawPkcs11Mode::HsmSignsLeaves) {
                    RawPkcs11Mode::HsmSignsLeaves
                        if raw.intermediate_lifetime_seconds.is_some() =>
                    {
                        return Err(CaConfigError::LifetimeWithoutIntermediate);
                    }
                    RawPkcs11Mode::HsmSignsLeaves => Pkcs11Mode::HsmSignsLeaves,
                    RawPkcs11Mode::Intermediate => Pkcs11Mode::Intermediate {
                        lifetime_seconds: raw.intermediate_lifetime_seconds,
                    },
                };
                Ok(CaConfig::Pkcs11(Pkcs11Ca {
                    dir: raw.dir,
                    uri: raw.pkcs11_uri,
                    module: raw.pkcs11_module,
                    pin,
                    mode,
                    automatic_rotation: raw.automatic_rotation.unwrap_or(true),
                }))
            }
        }
    }
}

fn yes() -> bool {
    true
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
    /// Requests per second allowed per identity (token bucket, bursts of as many), 0 =
    /// unlimited; default 100.
    #[serde(default = "default_rate")]
    pub rate_limit_per_identity: u32,
    /// Server streams (WatchTrustBundle, Workload API) open at once, across all callers.
    #[serde(default = "default_max_open_streams")]
    pub max_open_streams: usize,
    /// TLS on the TCP listener: `self-issued` (default), `files` or `off`; see [`GrpcTls`].
    #[serde(default)]
    pub tls: TlsSetting,
    /// self-issued: the DNS SANs; default: those of the Service `tls_service` in podca's
    /// namespace (`NAME`, `NAME.NS`, `NAME.NS.svc`, `NAME.NS.svc.cluster.local`).
    pub tls_dns_names: Option<Vec<String>>,
    /// self-issued: the name of podca's gRPC Service (default `podca`).
    pub tls_service: Option<String>,
    /// self-issued: podca's namespace (default: `POD_NAMESPACE`, then the service-account
    /// namespace file, then `default`).
    pub tls_namespace: Option<String>,
    /// self-issued: podca's service account (default: `PODCA_SERVICE_ACCOUNT`, then `podca`).
    pub tls_service_account: Option<String>,
    /// self-issued: the serving certificate's lifetime (default 86400; at least 600; never
    /// past the CA's notAfter).
    pub tls_lifetime_seconds: Option<u32>,
    /// files: the certificate chain (PEM, leaf first), reloaded when it changes.
    pub tls_cert_file: Option<PathBuf>,
    /// files: the private key (PEM), reloaded when it changes.
    pub tls_key_file: Option<PathBuf>,
    /// With `tls = "off"`: allow plaintext on a non-loopback address (logged, and shown by the
    /// `podca_grpc_insecure_plaintext` gauge).
    #[serde(default)]
    pub insecure_plaintext: bool,

    // Limits before authentication and mTLS renewal (issue #12; docs/grpc-api.md, "Connection
    // limits and HTTP/2 settings" and "mTLS renewal").
    /// TCP connections from one IP address at once, TLS handshakes included; more are closed at
    /// accept, before the handshake.
    #[serde(default = "default_max_connections_per_peer")]
    pub max_connections_per_peer: NonZeroUsize,
    /// TCP connections at once, from everyone; more are closed at accept.
    #[serde(default = "default_max_connections")]
    pub max_connections: NonZeroUsize,
    /// With TLS: ask clients for an (optional) podca certificate, with which they may renew
    /// for its identity without a token.
    #[serde(default = "yes")]
    pub mtls_renewal: bool,
    /// How long after a token last authenticated it a certificate chain may keep renewing
    /// over mTLS; a renewal never outlives it (issue #40). 10 minutes to 30 days.
    #[serde(default = "default_max_renewal_seconds")]
    pub max_renewal_seconds: u64,
    /// A file of `serial <hex>` / `identity <SPIFFE ID>` lines that may not renew over mTLS,
    /// re-read on change (`podca renewal deny`); `""` = none.
    #[serde(default)]
    pub renewal_denylist: String,
    // Authorization and TokenReview bounds (see `docs/grpc-api.md`, "Authorization").
    /// The signer names gRPC callers may use; default: `signer` only. Must include `signer`.
    pub signers: Option<Vec<String>>,
    /// TokenReviews in flight at once, across all callers.
    #[serde(default = "default_max_token_reviews")]
    pub max_token_reviews: usize,
    /// The longest a successful TokenReview is trusted: how long a revoked token keeps working.
    #[serde(default = "default_token_cache_seconds")]
    pub token_cache_seconds: u64,
    /// DNS names one gRPC-issued certificate may carry.
    #[serde(default = "default_max_dns_names")]
    pub max_dns_names: usize,
    // The Istio CA API (issue #16; docs/istio.md, "Istio ambient and sidecars").
    /// Serve the Istio CA API (`istio.v1.auth.IstioCertificateService`) beside podca.v1. Off by
    /// default (issue #40): a second way in, for meshes that chose podca as their CA.
    #[serde(default)]
    pub istio: bool,
    /// Audience the tokens of Istio CA API callers (ztunnel, istio-agent) must carry.
    #[serde(default = "default_istio_audience")]
    pub istio_token_audience: String,
    /// A trust domain Istio clients may name (CSR URI SAN, `ImpersonatedIdentity`) for the
    /// signer's own; `""` = none. Certificates always carry the signer's trust domain.
    #[serde(default = "default_istio_trust_domain_alias")]
    pub istio_trust_domain_alias: String,
}

/// The bounds of `[grpc] max_renewal_seconds`: 10 minutes to 30 days.
pub const MAX_RENEWAL_SECONDS_RANGE: std::ops::RangeInclusive<u64> = 600..=30 * 24 * 3600;

/// The largest `[grpc] token_cache_seconds` accepted.
pub const MAX_TOKEN_CACHE_SECONDS: u64 = 600;

/// `[grpc] tls` as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsSetting {
    #[default]
    SelfIssued,
    Files,
    Off,
}

/// The TLS of the gRPC TCP listener, checked against the address it listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcTls {
    /// podca issues its own serving certificate from its active CA.
    SelfIssued(SelfIssuedTls),
    /// An operator-provided certificate chain and key, reloaded when the files change.
    Files { cert: PathBuf, key: PathBuf },
    /// Plaintext HTTP/2; `insecure`: on an address other than loopback.
    Off { insecure: bool },
}

/// `[grpc] tls = "self-issued"`: what the configuration says of the serving certificate.
/// Unset names are filled in from podca's environment (see `podca serve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfIssuedTls {
    pub dns_names: Option<Vec<String>>,
    pub service: String,
    pub namespace: Option<String>,
    pub service_account: Option<String>,
    pub lifetime: time::Duration,
}

/// The default `[grpc] tls_service`.
pub const DEFAULT_TLS_SERVICE: &str = "podca";

/// Why the `[grpc]` TLS settings are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrpcTlsError {
    #[error("[grpc] {key} does not apply to tls = \"{mode}\" (it is a tls = \"{owner}\" setting)")]
    ForeignKey {
        key: &'static str,
        mode: &'static str,
        owner: &'static str,
    },
    #[error("[grpc] tls = \"files\" needs tls_cert_file and tls_key_file")]
    FilesMissing,
    #[error(
        "[grpc] tls = \"off\" on {listen}, which is not a loopback address: set \
         insecure_plaintext = true to serve plaintext anyway, or use tls = \"self-issued\" or \
         \"files\""
    )]
    PlaintextNotLoopback { listen: SocketAddr },
    #[error("[grpc] insecure_plaintext = true applies only to tls = \"off\"")]
    InsecureWithTls,
    #[error("[grpc] tls_lifetime_seconds = {0} is below the minimum of 600")]
    LifetimeTooShort(u32),
    #[error("[grpc] tls_dns_names: {0:?} is not a DNS name")]
    BadDnsName(String),
}

impl TlsSetting {
    fn name(self) -> &'static str {
        match self {
            TlsSetting::SelfIssued => "self-issued",
            TlsSetting::Files => "files",
            TlsSetting::Off => "off",
        }
    }
}

impl GrpcConfig {
    /// The listener's TLS when it listens on `listen` (`[grpc] listen` or `--grpc-listen`).
    pub fn tls(&self, listen: SocketAddr) -> Result<GrpcTls, GrpcTlsError> {
        let mode = self.tls.name();
        let self_issued_keys = [
            ("tls_dns_names", self.tls_dns_names.is_some()),
            ("tls_service", self.tls_service.is_some()),
            ("tls_namespace", self.tls_namespace.is_some()),
            ("tls_service_account", self.tls_service_account.is_some()),
            ("tls_lifetime_seconds", self.tls_lifetime_seconds.is_some()),
        ];
        let files_keys = [
            ("tls_cert_file", self.tls_cert_file.is_some()),
            ("tls_key_file", self.tls_key_file.is_some()),
        ];
        let refuse = |keys: &[(&'static str, bool)], owner: &'static str| match keys
            .iter()
            .find(|(_, set)| *set)
        {
            Some((key, _)) => Err(GrpcTlsError::ForeignKey { key, mode, owner }),
            None => Ok(()),
        };
        if self.insecure_plaintext && self.tls != TlsSetting::Off {
            return Err(GrpcTlsError::InsecureWithTls);
        }
        match self.tls {
            TlsSetting::SelfIssued => {
                refuse(&files_keys, "files")?;
                let lifetime = self.tls_lifetime_seconds.unwrap_or(86_400);
                if lifetime < 600 {
                    return Err(GrpcTlsError::LifetimeTooShort(lifetime));
                }
                if let Some(bad) = self
                    .tls_dns_names
                    .iter()
                    .flatten()
                    .find(|n| !podca_signer::policy::is_dns_name(n))
                {
                    return Err(GrpcTlsError::BadDnsName(bad.clone()));
                }
                Ok(GrpcTls::SelfIssued(SelfIssuedTls {
                    dns_names: self.tls_dns_names.clone(),
                    service: self
                        .tls_service
                        .clone()
                        .unwrap_or_else(|| DEFAULT_TLS_SERVICE.into()),
                    namespace: self.tls_namespace.clone(),
                    service_account: self.tls_service_account.clone(),
                    lifetime: time::Duration::seconds(i64::from(lifetime)),
                }))
            }
            TlsSetting::Files => {
                refuse(&self_issued_keys, "self-issued")?;
                match (&self.tls_cert_file, &self.tls_key_file) {
                    (Some(cert), Some(key)) => Ok(GrpcTls::Files {
                        cert: cert.clone(),
                        key: key.clone(),
                    }),
                    _ => Err(GrpcTlsError::FilesMissing),
                }
            }
            TlsSetting::Off => {
                refuse(&self_issued_keys, "self-issued")?;
                refuse(&files_keys, "files")?;
                let loopback = listen.ip().is_loopback();
                if !loopback && !self.insecure_plaintext {
                    return Err(GrpcTlsError::PlaintextNotLoopback { listen });
                }
                Ok(GrpcTls::Off {
                    insecure: !loopback,
                })
            }
        }
    }
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
            tls: TlsSetting::default(),
            tls_dns_names: None,
            tls_service: None,
            tls_namespace: None,
            tls_service_account: None,
            tls_lifetime_seconds: None,
            tls_cert_file: None,
            tls_key_file: None,
            insecure_plaintext: false,
            max_connections_per_peer: default_max_connections_per_peer(),
            max_connections: default_max_connections(),
            mtls_renewal: true,
            max_renewal_seconds: default_max_renewal_seconds(),
            renewal_denylist: String::new(),
            signers: None,
            max_token_reviews: default_max_token_reviews(),
            token_cache_seconds: default_token_cache_seconds(),
            max_dns_names: default_max_dns_names(),
            istio: false,
            istio_token_audience: default_istio_audience(),
            istio_trust_domain_alias: default_istio_trust_domain_alias(),
        }
    }
}

/// The SPIFFE Workload API, and Envoy's Secret Discovery Service on the same socket.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadApiConfig {
    /// Unix socket path; defaults to `<data dir>/workload.sock` in dev mode.
    pub socket: Option<PathBuf>,
    /// Serve Envoy SDS (`envoy.service.secret.v3`) beside the Workload API.
    #[serde(default = "yes")]
    pub sds: bool,
    /// The SDS name of the caller's certificate and key (`tls_certificate`).
    #[serde(default = "default_sds_certificate_name")]
    pub sds_certificate_name: String,
    /// The SDS name of the caller's own trust domain's anchors (`validation_context`).
    #[serde(default = "default_sds_validation_context_name")]
    pub sds_validation_context_name: String,
}

impl Default for WorkloadApiConfig {
    fn default() -> Self {
        WorkloadApiConfig {
            socket: None,
            sds: true,
            sds_certificate_name: default_sds_certificate_name(),
            sds_validation_context_name: default_sds_validation_context_name(),
        }
    }
}

/// SPIRE's names, so that an Envoy configured for SPIRE's SDS works unchanged.
fn default_sds_certificate_name() -> String {
    "default".to_owned()
}

fn default_sds_validation_context_name() -> String {
    "ROOTCA".to_owned()
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

/// A `--bundle` flag that is not `NS/SA[:KEY_TYPE]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{spec:?}: {problem}")]
pub struct DevBundleError {
    spec: String,
    problem: String,
}

impl std::str::FromStr for DevBundle {
    type Err = DevBundleError;

    /// `NS/SA[:KEY_TYPE]` (`:` is in neither a namespace nor a service-account name); the key
    /// type defaults to ECDSAP256.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let refused = |problem: String| DevBundleError {
            spec: spec.to_owned(),
            problem,
        };
        let (identity, key_type) = match spec.split_once(':') {
            Some((identity, key_type)) => (
                identity,
                key_type.parse::<podca_signer::KeyType>().map_err(|_| {
                    refused(format!(
                        "unknown key type {key_type:?}; expected one of {}",
                        podca_signer::KeyType::EVERY
                            .map(|k| k.kubelet_name())
                            .join(", ")
                    ))
                })?,
            ),
            None => (spec, podca_signer::KeyType::EcdsaP256),
        };
        let (namespace, service_account) = identity
            .split_once('/')
            .filter(|(ns, sa)| !ns.is_empty() && !sa.is_empty() && !sa.contains('/'))
            .ok_or_else(|| refused("expected namespace/service-account[:KEY_TYPE]".into()))?;
        for (what, name) in [
            ("namespace", namespace),
            ("service account", service_account),
        ] {
            if let Err(e) = name.parse::<podca_signer::names::ObjectName>() {
                return Err(refused(format!(
                    "the {what} {name:?} is not a Kubernetes name: it {e}"
                )));
            }
        }
        Ok(DevBundle {
            namespace: namespace.into(),
            service_account: service_account.into(),
            key_type,
        })
    }
}

/// The signer `podca dev` uses when the config names none.
pub const DEV_SIGNER: &str = "podca.dev/default";
/// Its trust domain.
pub const DEV_TRUST_DOMAIN: &str = "podca.dev.local";

/// What `podca dev` runs, decided once from its config (or its absence) and its command line.
#[derive(Debug, Clone)]
pub struct DevPlan {
    /// The gRPC signer and its trust domain.
    pub signer: String,
    pub trust_domain: String,
    /// Unix-socket callers: `[dev] identities`, else the current user as default/default.
    pub identities: Vec<DevIdentity>,
    /// Credential bundles to keep: `[dev] bundles`, then the `--bundle` flags.
    pub bundles: Vec<DevBundle>,
}

impl Config {
    /// Completes a `podca dev` configuration: with no signer configured, a permissive one for
    /// [`DEV_TRUST_DOMAIN`] that also allows the key types `--bundle` flags ask for (a config
    /// file must list them itself); every bundle's key type must be one the signer allows.
    /// `uid` is the caller identity's when `[dev] identities` names none.
    pub fn plan_dev(
        &mut self,
        configured: bool,
        flags: Vec<DevBundle>,
        uid: u32,
    ) -> Result<DevPlan, ConfigError> {
        if self.signers.is_empty() {
            let mut permissive = SignerPolicy::permissive(DEV_TRUST_DOMAIN);
            // No signer configured: the dev signer federates with every [[federation]].
            permissive.federates_with = self
                .federation
                .iter()
                .map(|f| f.trust_domain.clone())
                .collect();
            for bundle in &flags {
                if !permissive.key_types.contains(&bundle.key_type) {
                    permissive.key_types.push(bundle.key_type);
                }
            }
            self.signers.insert(DEV_SIGNER.into(), permissive);
        }
        let (signer, policy) = self.grpc_signer()?;
        let mut bundles = self.dev.bundles.clone();
        bundles.extend(flags);
        if let Some(refused) = bundles
            .iter()
            .find(|b| !policy.key_types.contains(&b.key_type))
        {
            return Err(ConfigError::Invalid(format!(
                "credential bundle {}/{}: key type {} is not in signer {signer:?}'s key_types{}",
                refused.namespace,
                refused.service_account,
                refused.key_type,
                if configured {
                    " (add it in the config file)"
                } else {
                    ""
                }
            )));
        }
        let identities = match self.dev.identities.as_slice() {
            [] => vec![DevIdentity {
                uid,
                namespace: "default".into(),
                service_account: "default".into(),
            }],
            configured => configured.to_vec(),
        };
        Ok(DevPlan {
            signer: signer.to_owned(),
            trust_domain: policy.trust_domain.clone(),
            identities,
            bundles,
        })
    }
}

#[cfg(test)]
mod dev_bundle_tests {
    use super::{Config, DEV_SIGNER, DEV_TRUST_DOMAIN, DevBundle};
    use podca_signer::KeyType;

    /// podca serve reserves its own serving names in every signer: a workload allowed any
    /// DNS name still cannot get `podca.<ns>.svc`, through the annotation or a CEL output.
    #[test]
    fn podcas_serving_names_are_reserved_in_every_signer() {
        let mut config = Config::parse(
            "[signers.\"example.com/a\"]\ntrust_domain = \"a.test\"\nallowed_dns_names = [\"*\"]\n\
             [grpc]\ntls_namespace = \"podca-system\"",
        )
        .unwrap();
        assert_eq!(
            config.serving_dns_names(Some("ignored")),
            [
                "podca",
                "podca.podca-system",
                "podca.podca-system.svc",
                "podca.podca-system.svc.cluster.local"
            ]
        );
        config.reserve_serving_names(None);
        let policy = &config.signers["example.com/a"];
        let ask = |names: &str| {
            let annotations = std::collections::BTreeMap::from([(
                podca_signer::policy::DNS_NAMES_ANNOTATION.to_string(),
                names.to_string(),
            )]);
            policy.decide(&podca_signer::policy::RequestFacts {
                namespace: "apps",
                service_account: "web",
                pod_name: None,
                key_type: Ok(podca_signer::KeyType::EcdsaP256),
                user_annotations: &annotations,
            })
        };
        assert!(matches!(
            ask("web.apps.svc"),
            podca_signer::policy::Decision::Issue(_)
        ));
        match ask("web.apps.svc,PODCA.podca-system.svc") {
            podca_signer::policy::Decision::Deny { reason, message } => {
                assert_eq!(reason, podca_signer::DenyReason::ReservedDnsName);
                assert_eq!(
                    message,
                    "DNS name \"podca.podca-system.svc\" is one of podca's own serving names; \
                     no workload certificate may carry it"
                );
            }
            other => panic!("{other:?}"),
        }
        // Without the grpc table's namespace: the pod's, else `default`.
        let bare = Config::default();
        assert_eq!(bare.serving_dns_names(Some("ns"))[2], "podca.ns.svc");
        assert_eq!(bare.serving_dns_names(None)[2], "podca.default.svc");
    }

    #[test]
    fn signers_sharing_the_one_ca_are_named() {
        let mut config = Config::default();
        assert_eq!(config.shared_ca_warnings(), Vec::<String>::new());
        for name in ["example.com/a", "example.com/b", "example.com/c"] {
            config.signers.insert(
                name.into(),
                podca_signer::SignerPolicy::permissive("a.test"),
            );
            if name == "example.com/a" {
                assert_eq!(config.shared_ca_warnings(), Vec::<String>::new());
            }
        }
        assert_eq!(
            config.shared_ca_warnings(),
            [
                "signers \"example.com/a\", \"example.com/b\" and \"example.com/c\" share a CA \
              (default): a certificate of one verifies under the others' ClusterTrustBundles"
            ]
        );
    }

    /// Bad `[cas]` input is a precise start-up error, naming the table and what would work.
    #[test]
    fn ca_tables_and_signer_ca_keys_are_checked() {
        let parse = |text: &str| {
            Config::parse(text)
                .map(|_| ())
                .map_err(|e| podca_signer::report::error_chain(&e))
        };
        let signer = |ca: &str| {
            format!("[signers.\"example.com/a\"]\ntrust_domain = \"a.test\"\nca = \"{ca}\"\n")
        };
        assert_eq!(
            parse(&format!("[cas.pay]\ndir = \"/p\"\n{}", signer("pay"))),
            Ok(())
        );
        assert_eq!(
            parse(&signer("nope")),
            Err(
                "[signers.\"example.com/a\"] ca = \"nope\": no [cas.nope] table is configured \
                 (configured: default)"
                    .into()
            )
        );
        assert_eq!(
            parse("[cas.default]\ndir = \"/p\"\n"),
            Err(
                "[cas.default]: the CA named \"default\" is the [ca] table; give this one \
                 another name"
                    .into()
            )
        );
        assert!(
            parse("[cas.Pay_1]\ndir = \"/p\"\n")
                .is_err_and(|e| e.starts_with("[cas.\"Pay_1\"]: a CA name is 1 to 63")),
        );
        assert_eq!(
            parse(&format!(
                "[ca]\ndir = \"/p\"\n[cas.pay]\ndir = \"/p\"\n{}\
                 [signers.\"example.com/b\"]\ntrust_domain = \"b.test\"\n",
                signer("pay")
            )),
            Err(
                "CAs \"default\" and \"pay\" are both the directory /p: they would be one CA; \
                 give each its own"
                    .into()
            )
        );
        assert_eq!(
            parse("[cas.pay]\nsplit_from = \"pay\"\n"),
            Err("[cas.pay] split_from names the CA itself".into())
        );
        assert_eq!(
            parse("[cas.pay]\nsplit_from = \"gone\"\n"),
            Err("[cas.pay] split_from = \"gone\": no such CA in this configuration".into())
        );
        assert!(
            parse("[cas.vault]\nbackend = \"secret\"\nsecret = \"ns/v\"\n\
                   [cas.pay]\nsplit_from = \"vault\"\n")
                .is_err_and(|e| e.contains("the source must be a file CA (it is backend = \"secret\")")),
        );
        assert!(
            parse("[cas.pay]\nbackend = \"secret\"\nsecret = \"ns/v\"\nsplit_from = \"default\"\n")
                .is_err_and(|e| e.contains("split_from does not apply to backend = \"secret\"")),
        );
    }

    #[test]
    fn dev_plans_a_permissive_signer_unless_configured() {
        let pq: DevBundle = "apps/web:MLDSA65".parse().unwrap();
        let mut bare = Config::default();
        let plan = bare.plan_dev(false, vec![pq.clone()], 1000).unwrap();
        assert_eq!(
            (plan.signer.as_str(), plan.trust_domain.as_str()),
            (DEV_SIGNER, DEV_TRUST_DOMAIN)
        );
        assert_eq!(
            (
                plan.identities[0].uid,
                plan.identities[0].namespace.as_str()
            ),
            (1000, "default")
        );
        assert!(
            bare.signers[DEV_SIGNER]
                .key_types
                .contains(&KeyType::MlDsa65)
        );

        let mut file = Config::parse(
            "[signers.\"example.com/a\"]\ntrust_domain = \"a.test\"\nkey_types = [\"ECDSAP256\"]\n\
             [[dev.identities]]\nuid = 7\nnamespace = \"n\"\nservice_account = \"s\"",
        )
        .unwrap();
        let refused = file.clone().plan_dev(true, vec![pq], 1000).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "credential bundle apps/web: key type MLDSA65 is not in signer \"example.com/a\"'s \
             key_types (add it in the config file)"
        );
        let plan = file
            .plan_dev(true, vec!["apps/web".parse().unwrap()], 1000)
            .unwrap();
        assert_eq!(
            (
                plan.identities[0].uid,
                plan.bundles.len(),
                plan.trust_domain.as_str()
            ),
            (7, 1, "a.test")
        );
    }

    #[test]
    fn bundle_flags_parse_or_say_what_is_wrong() {
        let ok: DevBundle = "apps/web".parse().unwrap();
        assert_eq!(
            (
                ok.namespace.as_str(),
                ok.service_account.as_str(),
                ok.key_type
            ),
            ("apps", "web", KeyType::EcdsaP256)
        );
        let pq: DevBundle = "apps/web:MLDSA65".parse().unwrap();
        assert_eq!(pq.key_type, KeyType::MlDsa65);
        for (spec, error) in [
            (
                "apps",
                "\"apps\": expected namespace/service-account[:KEY_TYPE]",
            ),
            (
                "apps/",
                "\"apps/\": expected namespace/service-account[:KEY_TYPE]",
            ),
            (
                "a/b/c",
                "\"a/b/c\": expected namespace/service-account[:KEY_TYPE]",
            ),
        ] {
            let refused = spec.parse::<DevBundle>().unwrap_err();
            assert_eq!(refused.to_string(), error);
        }
        let refused = "Apps/web".parse::<DevBundle>().unwrap_err();
        assert_eq!(
            refused.to_string(),
            "\"Apps/web\": the namespace \"Apps\" is not a Kubernetes name: it must not \
             contain 'A'"
        );
        let refused = "apps/web:DSA".parse::<DevBundle>().unwrap_err();
        assert!(
            refused
                .to_string()
                .starts_with("\"apps/web:DSA\": unknown key type \"DSA\"; expected one of RSA3072"),
            "{refused}"
        );
    }
}

/// The PodCertificateRequest controller. How many PCR decisions are in flight follows the API
/// server (AIMD on the status writes' answers: `podca_controller::concurrency`): it starts at
/// `workers` and never exceeds `max_in_flight`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// Where the concurrency limit starts, and where it climbs back to quickly after the API
    /// server pushed back (the limit podca trusts).
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// The most PCR decisions (and so `/status` writes) in flight at once, whatever the limit.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Who signs PCRs when `podca serve --leader-elect` runs several replicas.
    #[serde(default)]
    pub sharding: Sharding,
}

/// `[controller] sharding`: with `--leader-elect`, `leader` (the Lease holder signs every PCR,
/// the default: an upgrade keeps its RBAC and behaviour) or `rendezvous` (every live replica
/// signs its share, by rendezvous hashing over per-replica Leases; no failover gap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharding {
    #[default]
    Leader,
    Rendezvous,
}

impl podca_signer::spelling::Spelled for Sharding {
    const WHAT: &'static str = "sharding";
    const SPELLINGS: &'static [Spelling<Self>] = &[
        Spelling {
            value: Sharding::Leader,
            name: "leader",
            aliases: &[],
            help: "the Lease holder signs every PodCertificateRequest",
        },
        Spelling {
            value: Sharding::Rendezvous,
            name: "rendezvous",
            aliases: &[],
            help: "every live replica signs its share",
        },
    ];
}

/// `--sharding`: the values of `[controller] sharding`.
impl std::str::FromStr for Sharding {
    type Err = UnknownName;

    fn from_str(value: &str) -> Result<Self, UnknownName> {
        Self::from_name(value)
    }
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            workers: default_workers(),
            max_in_flight: default_max_in_flight(),
            sharding: Sharding::default(),
        }
    }
}

impl ControllerConfig {
    /// `1 <= workers <= max_in_flight`.
    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        if self.workers == 0 || self.max_in_flight == 0 {
            return invalid("[controller] workers and max_in_flight must be at least 1".into());
        }
        if self.workers > self.max_in_flight {
            return invalid(format!(
                "[controller] workers = {} is above max_in_flight = {}",
                self.workers, self.max_in_flight
            ));
        }
        Ok(())
    }
}

/// /metrics, /livez, /readyz.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// Who may read `/metrics` (`/livez` and `/readyz` are always open).
    #[serde(default)]
    pub metrics_auth: MetricsAuthMode,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin_listen(),
            metrics_auth: MetricsAuthMode::default(),
        }
    }
}

/// `[admin] metrics_auth`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAuthMode {
    /// Anyone who can connect (the NetworkPolicy says who can).
    #[default]
    None,
    /// A bearer token the API server authenticates (TokenReview) whose user may `get` the
    /// non-resource URL `/metrics` (SubjectAccessReview), as kube-rbac-proxy checks.
    Kubernetes,
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

fn default_istio_audience() -> String {
    "podca-istio".into()
}

fn default_istio_trust_domain_alias() -> String {
    "cluster.local".into()
}
/// On by default so that one identity cannot monopolise issuance; a burst of 100 covers a
/// node's pods restarting at once.
fn default_rate() -> u32 {
    100
}
fn default_max_connections_per_peer() -> NonZeroUsize {
    NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN)
}
fn default_max_connections() -> NonZeroUsize {
    NonZeroUsize::new(4096).unwrap_or(NonZeroUsize::MIN)
}
fn default_max_open_streams() -> usize {
    10_000
}
fn default_max_token_reviews() -> usize {
    8
}
fn default_max_renewal_seconds() -> u64 {
    24 * 3600
}

fn default_token_cache_seconds() -> u64 {
    60
}
fn default_max_dns_names() -> usize {
    16
}
fn default_workers() -> usize {
    8
}
/// Little's law on the real server's figures (docs/benchmarks.md, #41): its raw PATCH rate of
/// 500–740/s was reached at 32 in flight with a p50 of ~53 ms, so keeping it busy takes ~32–40
/// writes in flight, plus room for the decisions in their ledger commit or signing; 64 is that
/// with headroom, and a third of kube-apiserver's default `--max-mutating-requests-inflight`
/// (200), so podca alone cannot take the server's writes even before it pushes back.
fn default_max_in_flight() -> usize {
    64
}
fn default_key_type() -> podca_signer::KeyType {
    podca_signer::KeyType::EcdsaP256
}

/// Why a configuration is refused. The Display names where; the source, if any, says why
/// (`{:#}` with anyhow prints both, as `config file F: signer "s": …`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An error in the file at `path`.
    #[error("config file {}", path.display())]
    In {
        path: PathBuf,
        #[source]
        source: Box<ConfigError>,
    },
    #[error(transparent)]
    Syntax(#[from] toml::de::Error),
    #[error("signer {name:?}")]
    Signer {
        name: String,
        #[source]
        source: PolicyError,
    },
    #[error(transparent)]
    GrpcTls(#[from] GrpcTlsError),
    /// A key whose value cannot work; the message names the key and what would.
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| ConfigError::In {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text)?;
        for (name, policy) in &config.signers {
            policy.validate().map_err(|source| ConfigError::Signer {
                name: name.clone(),
                source,
            })?;
        }
        config.check_cas()?;
        config.grpc.tls(config.grpc.listen)?;
        config.check_grpc_limits()?;
        config.controller.check()?;
        config.jwt.check()?;
        config.check_federation()?;
        Ok(config)
    }

    /// `federates_with` names configured `[[federation]]` trust domains, and every
    /// `[[federation]]` is listed by a signer (else its bundle would reach no workload). With no
    /// signer configured (`podca dev`'s permissive one), the dev signer federates with each.
    fn check_federation(&self) -> Result<(), ConfigError> {
        let configured: std::collections::BTreeSet<&str> = self
            .federation
            .iter()
            .map(|f| f.trust_domain.as_str())
            .collect();
        for (name, policy) in &self.signers {
            if let Some(td) = policy
                .federates_with
                .iter()
                .find(|td| !configured.contains(td.as_str()))
            {
                return Err(ConfigError::Invalid(format!(
                    "[signers.\"{name}\"] federates_with names {td:?}, which no [[federation]] \
                     table configures"
                )));
            }
        }
        if self.signers.is_empty() {
            return Ok(());
        }
        for td in configured {
            if !self
                .signers
                .values()
                .any(|p| p.federates_with.iter().any(|f| f == td))
            {
                return Err(ConfigError::Invalid(format!(
                    "[[federation]] {td:?}: no signer lists it in federates_with, so its bundle \
                     would reach no workload"
                )));
            }
        }
        Ok(())
    }

    /// The `[grpc]` authorization keys: signers that exist, bounds that make sense.
    fn check_grpc_limits(&self) -> Result<(), ConfigError> {
        let grpc = &self.grpc;
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        if let Some(names) = &grpc.signers {
            if names.is_empty() {
                return invalid(
                    "[grpc] signers is empty; list at least the signer gRPC issues for".into(),
                );
            }
            if let Some(unknown) = names.iter().find(|n| !self.signers.contains_key(*n)) {
                return invalid(format!(
                    "[grpc] signers: {unknown:?} is not a configured signer"
                ));
            }
            if let Some(default) = &grpc.signer
                && !names.contains(default)
            {
                return invalid(format!(
                    "[grpc] signers must include [grpc] signer {default:?}"
                ));
            }
        }
        if !MAX_RENEWAL_SECONDS_RANGE.contains(&grpc.max_renewal_seconds) {
            return invalid(format!(
                "[grpc] max_renewal_seconds = {} is outside {}..={} (10 minutes to 30 days)",
                grpc.max_renewal_seconds,
                MAX_RENEWAL_SECONDS_RANGE.start(),
                MAX_RENEWAL_SECONDS_RANGE.end()
            ));
        }
        if grpc.max_token_reviews == 0 {
            return invalid("[grpc] max_token_reviews must be at least 1".into());
        }
        if grpc.token_cache_seconds > MAX_TOKEN_CACHE_SECONDS {
            return invalid(format!(
                "[grpc] token_cache_seconds = {} is above the maximum of {MAX_TOKEN_CACHE_SECONDS}",
                grpc.token_cache_seconds
            ));
        }
        if grpc.max_dns_names == 0 {
            return invalid("[grpc] max_dns_names must be at least 1".into());
        }
        if grpc.istio_token_audience.trim().is_empty() {
            return invalid(
                "[grpc] istio_token_audience is empty; podca's default is \"podca-istio\"".into(),
            );
        }
        let alias = &grpc.istio_trust_domain_alias;
        if !alias.is_empty() && !podca_signer::policy::is_dns_name(alias) {
            return invalid(format!(
                "[grpc] istio_trust_domain_alias {alias:?} is not a DNS name (a trust domain, \
                 such as \"cluster.local\"; \"\" for none)"
            ));
        }
        Ok(())
    }

    /// The signer names gRPC callers may use: `[grpc] signers`, or the gRPC signer alone.
    pub fn grpc_allowed_signers(&self) -> Result<Vec<String>, ConfigError> {
        match &self.grpc.signers {
            Some(names) => Ok(names.clone()),
            None => Ok(vec![self.grpc_signer()?.0.to_owned()]),
        }
    }

    /// The DNS names podca's gRPC API answers to: `[grpc] tls_dns_names`, else those of the
    /// Service `tls_service` in `tls_namespace` (else `pod_namespace`, else `default`), as the
    /// self-issued serving certificate carries them.
    pub fn serving_dns_names(&self, pod_namespace: Option<&str>) -> Vec<String> {
        if let Some(names) = &self.grpc.tls_dns_names {
            return names.clone();
        }
        let namespace = self
            .grpc
            .tls_namespace
            .as_deref()
            .or(pod_namespace)
            .unwrap_or("default");
        let service = self
            .grpc
            .tls_service
            .as_deref()
            .unwrap_or(DEFAULT_TLS_SERVICE);
        crate::serving_cert::service_dns_names(service, namespace)
    }

    /// Reserves [`Self::serving_dns_names`] in every signer's policy: no workload certificate
    /// may carry them (`ReservedDNSName`), or it could pose as podca's gRPC API.
    pub fn reserve_serving_names(&mut self, pod_namespace: Option<&str>) {
        let reserved = self.serving_dns_names(pod_namespace);
        for policy in self.signers.values_mut() {
            policy.reserved_dns_names = reserved.clone();
            // The tenants' policies copy it: build them again.
            policy.reset_tenant_policies();
        }
    }

    /// The signers that sign with one CA, by CA name, in name order: only CAs some signer
    /// uses (the `[ca]` table is `default`). More than one signer in a group means a certificate
    /// of one verifies under another's ClusterTrustBundle.
    pub fn signers_by_ca(&self) -> Vec<(&str, Vec<&str>)> {
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (signer, policy) in &self.signers {
            groups
                .entry(ca_name_of(policy))
                .or_default()
                .push(signer.as_str());
        }
        groups.into_iter().collect()
    }

    /// The CA a signer signs with, by name (`default`: the `[ca]` table).
    pub fn ca_of_signer(&self, signer: &str) -> Option<&str> {
        self.signers.get(signer).map(ca_name_of)
    }

    /// The data directory of the CA a signer signs with (none: a Secret-held CA).
    pub fn ca_dir_of_signer(&self, signer: &str) -> Option<&Path> {
        self.ca_of_signer(signer)
            .and_then(|name| self.ca_named(name))
            .and_then(CaConfig::dir)
    }

    /// The data directory of the CA named `name` (`podca ca … --ca NAME`).
    pub fn ca_dir(&self, name: &str) -> Result<&Path, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid(message);
        let ca = self.ca_named(name).ok_or_else(|| {
            let known: Vec<&str> = std::iter::once(DEFAULT_CA_NAME)
                .chain(self.cas.keys().map(String::as_str))
                .collect();
            invalid(format!(
                "--ca {name:?}: no such CA (configured: {})",
                known.join(", ")
            ))
        })?;
        match ca {
            CaConfig::Secret(s) => Err(invalid(format!(
                "CA {name:?} is held in the Secret {}/{}: podca serve follows it (`podca ca \
                 show --secret {}/{}`)",
                s.namespace, s.name, s.namespace, s.name
            ))),
            other => other.dir().ok_or_else(|| {
                invalid(format!(
                    "CA {name:?} has no dir in the configuration (podca dev keeps it in \
                     <data dir>/cas/{name}: pass --dir)"
                ))
            }),
        }
    }

    /// The CA table named `name`: `default` is `[ca]`, any other a `[cas.<name>]`.
    pub fn ca_named(&self, name: &str) -> Option<&CaConfig> {
        match name {
            DEFAULT_CA_NAME => Some(&self.ca),
            other => self.cas.get(other),
        }
    }

    /// Every CA some signer signs with (or `[ca]` alone when no signer is configured), by
    /// name, in name order: the CAs `podca serve` and `podca dev` open.
    pub fn cas_in_use(&self) -> Vec<(&str, &CaConfig)> {
        let groups = self.signers_by_ca();
        if groups.is_empty() {
            return vec![(DEFAULT_CA_NAME, &self.ca)];
        }
        let mut names: Vec<&str> = groups.into_iter().map(|(name, _)| name).collect();
        names.extend(self.tenant_cas().into_iter().map(|(_, _, ca)| ca));
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .filter_map(|name| Some((name, self.ca_named(name)?)))
            .collect()
    }

    /// Every tenant of every signer with the CA that signs for it: (signer, tenant, CA name).
    pub fn tenant_cas(&self) -> Vec<(&str, &str, &str)> {
        self.signers
            .iter()
            .flat_map(|(signer, policy)| {
                policy
                    .tenants()
                    .map(move |tenant| (signer.as_str(), tenant.name, tenant.ca()))
            })
            .collect()
    }

    /// The nameConstraints podca gives the CA `name` when it makes it (`podca ca init --ca`,
    /// `podca dev`): a tenant's CA permits only the tenant's names; `None` for other CAs.
    pub fn init_constraints(
        &self,
        name: &str,
    ) -> Option<Result<podca_signer::NameConstraints, podca_signer::CaError>> {
        self.signers.values().find_map(|policy| {
            let tenant = policy.tenants().find(|t| t.ca() == name)?;
            Some(tenant.name_constraints(&policy.trust_domain))
        })
    }

    /// Whether the CA `name` signs for a tenant.
    pub fn is_tenant_ca(&self, name: &str) -> bool {
        self.tenant_cas().iter().any(|(_, _, ca)| *ca == name)
    }

    /// The policies the CA `name` signs for, each with what it is (`signer "x"` or `tenant "t"
    /// of signer "x"`): signers whose own CA it is, and tenants (in their trust domain).
    pub fn policies_of_ca(&self, name: &str) -> Vec<(String, SignerPolicy)> {
        let mut out = Vec::new();
        for (signer, policy) in &self.signers {
            if ca_name_of(policy) == name {
                out.push((signer.clone(), policy.clone()));
            }
            for tenant in policy.tenants().filter(|t| t.ca() == name) {
                out.push((
                    format!("{signer} (tenant {})", tenant.name),
                    policy.for_tenant(&tenant),
                ));
            }
        }
        out
    }

    /// The `[cas]` tables and the signers' `ca` keys: names that can label metrics and name
    /// directories, no signer naming a CA that is not configured, no two CAs on one place.
    fn check_cas(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        if self.cas.contains_key(DEFAULT_CA_NAME) {
            return invalid(format!(
                "[cas.{DEFAULT_CA_NAME}]: the CA named {DEFAULT_CA_NAME:?} is the [ca] table; \
                 give this one another name"
            ));
        }
        for name in self.cas.keys() {
            if !is_ca_name(name) {
                return invalid(format!(
                    "[cas.{name:?}]: a CA name is 1 to 63 lowercase letters, digits and '-', \
                     starting with a letter (it labels metrics and names directories)"
                ));
            }
        }
        for (signer, policy) in &self.signers {
            let name = ca_name_of(policy);
            if self.ca_named(name).is_none() {
                let known: Vec<&str> = std::iter::once(DEFAULT_CA_NAME)
                    .chain(self.cas.keys().map(String::as_str))
                    .collect();
                return invalid(format!(
                    "[signers.{signer:?}] ca = {name:?}: no [cas.{name}] table is configured \
                     (configured: {})",
                    known.join(", ")
                ));
            }
        }
        for (name, ca) in &self.cas {
            let CaConfig::File(FileCa {
                split_from: Some(from),
                ..
            }) = ca
            else {
                continue;
            };
            match self.ca_named(from) {
                _ if from == name => {
                    return invalid(format!("[cas.{name}] split_from names the CA itself"));
                }
                Some(CaConfig::File(_)) => {}
                Some(other) => {
                    return invalid(format!(
                        "[cas.{name}] split_from = {from:?}: a CA split off another is a copy of \
                         its generations, so the source must be a file CA (it is backend = \
                         \"{}\")",
                        other.backend_name()
                    ));
                }
                None => {
                    return invalid(format!(
                        "[cas.{name}] split_from = {from:?}: no such CA in this configuration"
                    ));
                }
            }
        }
        let mut tenant_of_ca: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
        for (signer, tenant, ca) in self.tenant_cas() {
            if !self.cas.contains_key(ca) {
                return invalid(format!(
                    "[signers.{signer:?}.tenants.{tenant}] signs with CA {ca:?}: no [cas.{ca}] \
                     table is configured (a tenant's CA is a [cas.<name>] of its own)"
                ));
            }
            if let Some((own, _)) = self.signers_by_ca().into_iter().find(|(n, _)| *n == ca) {
                return invalid(format!(
                    "[signers.{signer:?}.tenants.{tenant}]: CA {ca:?} is also the own CA of \
                     signer(s) {}; a tenant's CA signs for the tenant alone",
                    self.signers_by_ca()
                        .into_iter()
                        .find(|(n, _)| *n == own)
                        .map(|(_, s)| s.join(", "))
                        .unwrap_or_default()
                ));
            }
            if let Some((other_signer, other)) = tenant_of_ca.insert(ca, (signer, tenant)) {
                return invalid(format!(
                    "CA {ca:?} signs for tenant {other:?} of {other_signer:?} and tenant \
                     {tenant:?} of {signer:?}; each tenant needs its own"
                ));
            }
        }
        let mut places: BTreeMap<String, &str> = BTreeMap::new();
        for (name, ca) in self.cas_in_use() {
            let place = match ca {
                CaConfig::Secret(s) => format!("the Secret {}/{}", s.namespace, s.name),
                other => match other.dir() {
                    Some(dir) => format!("the directory {}", dir.display()),
                    None => continue,
                },
            };
            if let Some(first) = places.insert(place.clone(), name) {
                return invalid(format!(
                    "CAs {first:?} and {name:?} are both {place}: they would be one CA; give \
                     each its own"
                ));
            }
        }
        Ok(())
    }

    /// The groups of [`Self::signers_by_ca`] with more than one signer, as one line each:
    /// `signers "a" and "b" share a CA: …`.
    pub fn shared_ca_warnings(&self) -> Vec<String> {
        self.signers_by_ca()
            .into_iter()
            .filter_map(|(ca, signers)| {
                let names: Vec<String> = signers.iter().map(|s| format!("{s:?}")).collect();
                let (last, rest) = names.split_last()?;
                (!rest.is_empty()).then(|| {
                    format!(
                        "signers {} and {last} share a CA ({ca}): a certificate of one verifies \
                         under the others' ClusterTrustBundles",
                        rest.join(", ")
                    )
                })
            })
            .collect()
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

    /// The policy gRPC requests get: `grpc.signer`, or the only configured signer, or the one
    /// `[grpc] signers` names.
    pub fn grpc_signer(&self) -> Result<(&str, &SignerPolicy), ConfigError> {
        fn only<'a>(mut names: impl Iterator<Item = &'a String>) -> Option<&'a String> {
            let first = names.next()?;
            names.next().is_none().then_some(first)
        }
        let (name, key) = match &self.grpc.signer {
            Some(name) => (name, "grpc.signer"),
            None => match only(self.signers.keys())
                .map(|n| (n, ""))
                .or_else(|| only(self.grpc.signers.iter().flatten()).map(|n| (n, "grpc.signers")))
            {
                Some(found) => found,
                None => {
                    return Err(ConfigError::Invalid(format!(
                        "{} signers are configured; set grpc.signer to choose one for gRPC \
                         requests",
                        self.signers.len()
                    )));
                }
            },
        };
        self.signers
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| {
                ConfigError::Invalid(format!("{key} {name:?} is not a configured signer"))
            })
    }
}

/// The name metrics and warnings give the one `[ca]` table.
pub const DEFAULT_CA_NAME: &str = "default";

/// The CA a signer policy names (`default` when none).
pub fn ca_name_of(policy: &SignerPolicy) -> &str {
    policy.ca.as_deref().unwrap_or(DEFAULT_CA_NAME)
}

/// A CA name: a DNS label starting with a letter (it is a metric label and a directory name),
/// as tenant names are.
pub fn is_ca_name(name: &str) -> bool {
    podca_signer::tenants::is_tenant_name(name)
}

/// A Secret reference that is not `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected \"<namespace>/<name>\"")]
pub struct SecretRefError(pub String);

/// `namespace/name` of a Secret (`[ca] secret`, `podca ca show --secret`).
pub fn secret_ref(text: &str) -> Result<(&str, &str), SecretRefError> {
    text.split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
        .ok_or_else(|| SecretRefError(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(table: &str) -> Result<CaConfig, String> {
        Config::parse(&format!("[ca]\n{table}"))
            .map(|c| c.ca)
            .map_err(|e| podca_signer::report::error_chain(&e))
    }

    #[test]
    fn metrics_are_open_unless_admin_says_kubernetes() {
        let mode = |text: &str| Config::parse(text).map(|c| c.admin.metrics_auth);
        assert_eq!(mode("").unwrap(), MetricsAuthMode::None);
        assert_eq!(
            mode("[admin]\nmetrics_auth = \"none\"").unwrap(),
            MetricsAuthMode::None
        );
        assert_eq!(
            mode("[admin]\nmetrics_auth = \"kubernetes\"").unwrap(),
            MetricsAuthMode::Kubernetes
        );
        let error = format!(
            "{:#}",
            mode("[admin]\nmetrics_auth = \"token\"").unwrap_err()
        );
        assert!(error.contains("unknown variant `token`"), "{error}");
    }

    #[test]
    fn no_ca_table_is_a_file_ca_with_rotation() {
        let config = Config::parse("").expect("empty config");
        assert_eq!(
            config.ca,
            CaConfig::File(FileCa {
                dir: None,
                automatic_rotation: true,
                split_from: None,
            })
        );
    }

    #[test]
    fn each_backend_becomes_its_variant() {
        assert_eq!(
            ca("dir = \"/d\"\nautomatic_rotation = false"),
            Ok(CaConfig::File(FileCa {
                dir: Some("/d".into()),
                automatic_rotation: false,
                split_from: None,
            }))
        );
        assert_eq!(
            ca("backend = \"secret\"\nsecret = \"podca-system/podca-ca\""),
            Ok(CaConfig::Secret(SecretCa {
                namespace: "podca-system".into(),
                name: "podca-ca".into()
            }))
        );
        assert_eq!(
            ca(
                "backend = \"pkcs11\"\ndir = \"/d\"\npkcs11_pin_env = \"PIN\"\n\
                pkcs11_mode = \"intermediate\"\nintermediate_lifetime_seconds = 864000"
            ),
            Ok(CaConfig::Pkcs11(Pkcs11Ca {
                dir: Some("/d".into()),
                uri: None,
                module: None,
                pin: PinSource::Env("PIN".into()),
                mode: Pkcs11Mode::Intermediate {
                    lifetime_seconds: Some(864_000)
                },
                automatic_rotation: true,
            }))
        );
        assert_eq!(
            ca("backend = \"pkcs11\"\npkcs11_pin_file = \"/p\"")
                .map(|c| matches!(c, CaConfig::Pkcs11(p) if p.mode == Pkcs11Mode::HsmSignsLeaves && p.pin == PinSource::File("/p".into()))),
            Ok(true)
        );
    }

    #[test]
    fn a_key_of_another_backend_is_refused_not_ignored() {
        let cases = [
            (
                "secret = \"a/b\"",
                "[ca] secret does not apply to backend = \"file\"",
            ),
            (
                "pkcs11_pin_file = \"/p\"",
                "[ca] pkcs11_pin_file does not apply to backend = \"file\"",
            ),
            (
                "backend = \"secret\"\nsecret = \"a/b\"\ndir = \"/d\"",
                "[ca] dir does not apply to backend = \"secret\"",
            ),
            (
                "backend = \"secret\"\nsecret = \"a/b\"\npkcs11_mode = \"intermediate\"",
                "[ca] pkcs11_mode does not apply to backend = \"secret\"",
            ),
            (
                "backend = \"pkcs11\"\npkcs11_pin_env = \"P\"\nsecret = \"a/b\"",
                "[ca] secret does not apply to backend = \"pkcs11\"",
            ),
        ];
        for (table, expected) in cases {
            let err = ca(table).expect_err(table);
            assert!(err.contains(expected), "{table}: {err}");
        }
    }

    #[test]
    fn incomplete_tables_say_what_is_missing() {
        let cases = [
            (
                "backend = \"secret\"",
                "needs secret = \"<namespace>/<name>\"",
            ),
            (
                "backend = \"secret\"\nsecret = \"nons\"",
                "\"nons\": expected \"<namespace>/<name>\"",
            ),
            (
                "backend = \"secret\"\nsecret = \"a/b/c\"",
                "\"a/b/c\": expected",
            ),
            (
                "backend = \"pkcs11\"",
                "needs pkcs11_pin_file or pkcs11_pin_env",
            ),
            (
                "backend = \"pkcs11\"\npkcs11_pin_env = \"P\"\npkcs11_pin_file = \"/p\"",
                "both set; choose one",
            ),
            (
                "backend = \"pkcs11\"\npkcs11_pin_env = \"P\"\nintermediate_lifetime_seconds = 1",
                "pkcs11_mode is not \"intermediate\"",
            ),
            ("backend = \"vault\"", "unknown variant `vault`"),
            ("bakend = \"file\"", "unknown field `bakend`"),
        ];
        for (table, expected) in cases {
            let err = ca(table).expect_err(table);
            assert!(err.contains(expected), "{table}: {err}");
        }
    }

    #[test]
    fn only_podca_made_cas_rotate_on_schedule() {
        assert!(CaConfig::default().automatic_rotation());
        assert!(
            !ca("backend = \"secret\"\nsecret = \"a/b\"")
                .unwrap()
                .automatic_rotation()
        );
    }

    fn grpc(table: &str) -> Result<GrpcTls, String> {
        let config = Config::parse(&format!("[grpc]\n{table}"))
            .map_err(|e| podca_signer::report::error_chain(&e))?;
        config
            .grpc
            .tls(config.grpc.listen)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn grpc_tls_modes_parse() {
        let GrpcTls::SelfIssued(default) = grpc("").unwrap() else {
            panic!("the default is self-issued");
        };
        assert_eq!(
            default,
            SelfIssuedTls {
                dns_names: None,
                service: "podca".into(),
                namespace: None,
                service_account: None,
                lifetime: time::Duration::hours(24),
            }
        );
        let GrpcTls::SelfIssued(set) = grpc(
            "tls = \"self-issued\"\ntls_dns_names = [\"ca.example.com\"]\ntls_service = \"ca\"\n\
             tls_namespace = \"sec\"\ntls_service_account = \"signer\"\ntls_lifetime_seconds = 3600",
        )
        .unwrap() else {
            panic!("self-issued");
        };
        assert_eq!(set.dns_names, Some(vec!["ca.example.com".to_string()]));
        assert_eq!(set.service, "ca");
        assert_eq!(set.namespace.as_deref(), Some("sec"));
        assert_eq!(set.service_account.as_deref(), Some("signer"));
        assert_eq!(set.lifetime, time::Duration::hours(1));
        assert_eq!(
            grpc("tls = \"files\"\ntls_cert_file = \"/c.pem\"\ntls_key_file = \"/k.pem\"").unwrap(),
            GrpcTls::Files {
                cert: "/c.pem".into(),
                key: "/k.pem".into()
            }
        );
        assert_eq!(
            grpc("tls = \"off\"").unwrap(),
            GrpcTls::Off { insecure: false }
        );
        assert_eq!(
            grpc("tls = \"off\"\nlisten = \"[::1]:8443\"").unwrap(),
            GrpcTls::Off { insecure: false }
        );
        assert_eq!(
            grpc("tls = \"off\"\nlisten = \"0.0.0.0:8443\"\ninsecure_plaintext = true").unwrap(),
            GrpcTls::Off { insecure: true }
        );
    }

    #[test]
    fn grpc_tls_refusals_name_the_keys() {
        let cases = [
            (
                "tls = \"off\"\nlisten = \"0.0.0.0:8443\"",
                "tls = \"off\" on 0.0.0.0:8443, which is not a loopback address: set insecure_plaintext = true",
            ),
            (
                "insecure_plaintext = true\nlisten = \"0.0.0.0:8443\"",
                "insecure_plaintext = true applies only to tls = \"off\"",
            ),
            (
                "tls = \"files\"\ntls_cert_file = \"/c\"",
                "needs tls_cert_file and tls_key_file",
            ),
            (
                "tls_cert_file = \"/c\"",
                "[grpc] tls_cert_file does not apply to tls = \"self-issued\"",
            ),
            (
                "tls = \"files\"\ntls_cert_file = \"/c\"\ntls_key_file = \"/k\"\ntls_service = \"x\"",
                "[grpc] tls_service does not apply to tls = \"files\"",
            ),
            (
                "tls = \"off\"\ntls_lifetime_seconds = 3600",
                "[grpc] tls_lifetime_seconds does not apply to tls = \"off\"",
            ),
            (
                "tls_lifetime_seconds = 599",
                "tls_lifetime_seconds = 599 is below the minimum of 600",
            ),
            (
                "tls_dns_names = [\"not a name\"]",
                "\"not a name\" is not a DNS name",
            ),
            ("tls = \"on\"", "unknown variant `on`"),
        ];
        for (table, expected) in cases {
            let err = grpc(table).expect_err(table);
            assert!(err.contains(expected), "{table}: {err}");
        }
    }

    #[test]
    fn grpc_authorization_keys() {
        let two = "[signers.\"a.example/x\"]\ntrust_domain = \"t\"\n\
                   [signers.\"a.example/y\"]\ntrust_domain = \"t\"\n";
        let c = Config::parse(&format!("{two}[grpc]\nsigner = \"a.example/x\"")).unwrap();
        assert_eq!(c.grpc_allowed_signers().unwrap(), ["a.example/x"]);
        assert_eq!(c.grpc.max_token_reviews, 8);
        assert_eq!(c.grpc.token_cache_seconds, 60);
        assert_eq!(c.grpc.max_dns_names, 16);
        assert_eq!(c.grpc.max_renewal_seconds, 86_400);
        assert_eq!(c.grpc.renewal_denylist, "");
        assert!(!c.grpc.istio, "the Istio CA API is opt-in");
        assert_eq!(c.grpc.istio_token_audience, "podca-istio");
        assert_eq!(c.grpc.istio_trust_domain_alias, "cluster.local");
        let c = Config::parse(&format!("{two}[grpc]\nsigners = [\"a.example/y\"]")).unwrap();
        assert_eq!(c.grpc_signer().unwrap().0, "a.example/y");
        assert_eq!(c.grpc_allowed_signers().unwrap(), ["a.example/y"]);
        for (table, needle) in [
            (
                "signers = [\"a.example/z\"]",
                "\"a.example/z\" is not a configured signer",
            ),
            ("signers = []", "[grpc] signers is empty"),
            (
                "signer = \"a.example/x\"\nsigners = [\"a.example/y\"]",
                "must include [grpc] signer",
            ),
            (
                "max_token_reviews = 0",
                "max_token_reviews must be at least 1",
            ),
            ("token_cache_seconds = 601", "above the maximum of 600"),
            ("max_renewal_seconds = 599", "outside 600..=2592000"),
            ("max_renewal_seconds = 2592001", "outside 600..=2592000"),
            ("max_dns_names = 0", "max_dns_names must be at least 1"),
            (
                "istio_token_audience = \"\"",
                "[grpc] istio_token_audience is empty",
            ),
            (
                "istio_trust_domain_alias = \"Not A Domain\"",
                "[grpc] istio_trust_domain_alias \"Not A Domain\" is not a DNS name",
            ),
            ("istio_token_audience = 3", "invalid type"),
        ] {
            let err = Config::parse(&format!("{two}[grpc]\n{table}")).unwrap_err();
            assert!(format!("{err:#}").contains(needle), "{table}: {err:#}");
        }
    }

    #[test]
    fn grpc_tls_off_is_checked_against_the_effective_listen_address() {
        let config = Config::parse("[grpc]\ntls = \"off\"").unwrap();
        assert_eq!(
            config.grpc.tls("0.0.0.0:1".parse().unwrap()),
            Err(GrpcTlsError::PlaintextNotLoopback {
                listen: "0.0.0.0:1".parse().unwrap()
            })
        );
    }

    #[test]
    fn connection_limits_and_mtls_renewal_default_on_and_zero_is_refused() {
        let grpc = Config::parse("").unwrap().grpc;
        assert_eq!(grpc.max_connections_per_peer.get(), 64);
        assert_eq!(grpc.max_connections.get(), 4096);
        assert!(grpc.mtls_renewal);
        assert_eq!(grpc.rate_limit_per_identity, 100);
        let grpc = Config::parse(
            "[grpc]\nmax_connections_per_peer = 3\nmax_connections = 7\nmtls_renewal = false",
        )
        .unwrap()
        .grpc;
        assert_eq!(
            (
                grpc.max_connections_per_peer.get(),
                grpc.max_connections.get(),
                grpc.mtls_renewal
            ),
            (3, 7, false)
        );
        for key in ["max_connections_per_peer", "max_connections"] {
            let error = format!(
                "{:#}",
                Config::parse(&format!("[grpc]\n{key} = 0")).unwrap_err()
            );
            assert!(error.contains("nonzero"), "{key}: {error}");
        }
    }
}
