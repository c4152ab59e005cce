//! Fetching a foreign trust domain's SPIFFE bundle from its bundle endpoint, and deciding
//! whether it may replace the bundle in force.
//!
//! * `https_spiffe`: the endpoint is authenticated against the foreign trust domain's X.509
//!   authorities in force (the configured initial bundle, then each accepted one): webpki
//!   checks the chain, and the leaf must carry exactly one URI SAN, the configured endpoint
//!   SPIFFE ID ([`crate::client::PinnedSpiffeId`]).
//! * `https_web`: the endpoint's chain is checked against Web PKI roots (`ca_file`, else the
//!   system's) and must name the URL's host, as a browser checks it.
//! * One HTTP/1.1 `GET`, bounded in time ([`FetchLimits::timeout`], connect to last byte) and
//!   size ([`FetchLimits::max_bytes`]); `Content-Length` or chunked bodies.
//! * A bundle is refused, with a [`Refusal`] whose [`Refusal::reason`] is the metric label,
//!   when it is malformed or empty, an X.509 authority is no CA or names another trust domain,
//!   or its sequence is lower than the one in force; the bundle in force stays.
//!
//! When to fetch next is [`next_fetch_in`]: the bundle's refresh hint within the configured
//! clamps, or exponential backoff after a failure.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use podca_authority::bundle_endpoint::{FederationConfig, FederationProfile};
use podca_authority::{Runtime, Stage};
use podca_signer::spiffe_bundle::{BundleError, SpiffeBundle};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::pki_types::{CertificateDer, ServerName};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{debug, error, warn};

use crate::client::PinnedSpiffeId;
use crate::federation::{FederatedBundles, FederationRefusal, ForeignBundle};

/// Bounds on one fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchLimits {
    /// The whole answer (head and body) at most this long.
    pub max_bytes: usize,
    /// Connect, handshake, request and answer within this.
    pub timeout: Duration,
}

impl Default for FetchLimits {
    /// 1 MiB (a bundle of hundreds of authorities fits), 10 s.
    fn default() -> Self {
        FetchLimits {
            max_bytes: podca_signer::spiffe_bundle::MAX_DOCUMENT_BYTES,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why a fetched bundle is not in force. The bundle in force stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    #[error("bundle_endpoint_url {0:?} is not https://<host>[:port][/path]")]
    BadUrl(String),
    #[error("connecting to the bundle endpoint failed: {0}")]
    Connect(String),
    #[error("the bundle endpoint's TLS handshake failed: {0}")]
    Tls(String),
    #[error("the bundle endpoint did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the bundle endpoint's answer is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the bundle endpoint answered HTTP status {0}")]
    Status(u16),
    #[error("the bundle endpoint's answer is not HTTP/1.1: {0}")]
    Http(&'static str),
    #[error("the bundle is malformed: {0}")]
    Malformed(BundleError),
    #[error("the bundle is empty: {0}")]
    Empty(BundleError),
    #[error("the bundle's X.509 authority {subject:?} is not a CA certificate")]
    NotCa { subject: String },
    #[error("the bundle's X.509 authority {subject:?} names {named}, not {expected}")]
    OtherTrustDomain {
        subject: String,
        named: String,
        expected: String,
    },
    #[error("the bundle's sequence {offered} is lower than the {in_force} in force")]
    LoweredSequence { offered: u64, in_force: u64 },
}

impl Refusal {
    /// The `reason` label of the refusal metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::BadUrl(_) => "bad_url",
            Refusal::Connect(_) => "connect",
            Refusal::Tls(_) => "tls",
            Refusal::Timeout(_) => "timeout",
            Refusal::TooLarge(_) => "too_large",
            Refusal::Status(_) => "status",
            Refusal::Http(_) => "http",
            Refusal::Malformed(_) => "malformed",
            Refusal::Empty(_) => "empty",
            Refusal::NotCa { .. } => "not_ca",
            Refusal::OtherTrustDomain { .. } => "other_trust_domain",
            Refusal::LoweredSequence { .. } => "lowered_sequence",
        }
    }
}

/// Where one foreign bundle endpoint is and who it must be.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub trust_domain: String,
    /// `https://host[:port][/path]`.
    pub url: String,
    pub auth: EndpointAuth,
}

/// How the endpoint's certificate is checked.
#[derive(Debug, Clone)]
pub enum EndpointAuth {
    /// Chains to the foreign X.509 authorities in force; this SPIFFE ID its only URI SAN.
    Spiffe(String),
    /// Chains to these roots and names the URL's host.
    Web(Arc<rustls::RootCertStore>),
}

/// Fetches `endpoint`'s bundle, authenticating it as its [`EndpointAuth`] says (`https_spiffe`
/// needs a bundle in force), and checks it may replace `in_force` ([`check`]).
pub async fn fetch(
    endpoint: &Endpoint,
    in_force: Option<&ForeignBundle>,
    limits: FetchLimits,
) -> Result<SpiffeBundle, Refusal> {
    let body = tokio::time::timeout(limits.timeout, get(endpoint, in_force, limits))
        .await
        .map_err(|_| Refusal::Timeout(limits.timeout))??;
    let bundle = SpiffeBundle::parse(&body).map_err(|e| match e {
        BundleError::Empty => Refusal::Empty(e),
        BundleError::NotCa { subject, .. } => Refusal::NotCa { subject },
        BundleError::TooLarge { limit } => Refusal::TooLarge(limit),
        other => Refusal::Malformed(other),
    })?;
    check(&endpoint.trust_domain, &bundle, in_force)?;
    Ok(bundle)
}

/// Whether `offered` may be `trust_domain`'s bundle after `in_force`: no X.509 authority that
/// names (by a `spiffe://` URI SAN) another trust domain, and no lower sequence.
pub fn check(
    trust_domain: &str,
    offered: &SpiffeBundle,
    in_force: Option<&ForeignBundle>,
) -> Result<(), Refusal> {
    for ca in &offered.x509_authorities {
        for uri in spiffe_uris(ca.der()) {
            let named = uri
                .strip_prefix("spiffe://")
                .and_then(|rest| rest.split('/').next())
                .unwrap_or_default();
            if named != trust_domain {
                return Err(Refusal::OtherTrustDomain {
                    subject: ca.subject().to_owned(),
                    named: named.escape_debug().to_string(),
                    expected: trust_domain.to_owned(),
                });
            }
        }
    }
    if let (Some(offered), Some(in_force)) =
        (offered.sequence, in_force.and_then(|b| b.bundle.sequence))
        && offered < in_force
    {
        return Err(Refusal::LoweredSequence { offered, in_force });
    }
    Ok(())
}

/// When to fetch next: after a success, the bundle's refresh hint (`None`: `max`) within
/// `[min, max]`; after `failures` failures in a row, `min` doubled per failure, at most `max`.
pub fn next_fetch_in(
    refresh_hint: Option<u64>,
    failures: u32,
    min: Duration,
    max: Duration,
) -> Duration {
    if failures > 0 {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(20));
        return min.saturating_mul(factor).min(max);
    }
    refresh_hint
        .map_or(max, Duration::from_secs)
        .clamp(min, max.max(min))
}

fn spiffe_uris(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return vec![];
    };
    let Ok(Some(sans)) = cert.subject_alternative_name() else {
        return vec![];
    };
    sans.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) if uri.starts_with("spiffe://") => Some((*uri).to_owned()),
            _ => None,
        })
        .collect()
}

/// `podca_federation_*`, per foreign trust domain. Cloning shares the series.
#[derive(Debug, Clone, Default)]
pub struct FederationMetrics {
    /// `podca_federation_refusals_total{trust_domain,reason}`.
    pub refusals: Family<RefusalLabels, Counter>,
    /// `podca_federation_last_refresh_timestamp_seconds{trust_domain}`: the last accepted
    /// fetch (or the initial / last-good bundle at start). Staleness is `time()` minus it.
    pub last_refresh: Family<TrustDomainLabels, Gauge>,
    /// `podca_federation_anchors{trust_domain}`: X.509 authorities in force.
    pub anchors: Family<TrustDomainLabels, Gauge>,
    /// `podca_federation_sequence{trust_domain}`: the sequence in force.
    pub sequence: Family<TrustDomainLabels, Gauge>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub trust_domain: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrustDomainLabels {
    pub trust_domain: String,
}

impl FederationMetrics {
    fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "refusals",
            "Foreign SPIFFE bundles refused, by trust domain and reason",
            m.refusals.clone(),
        );
        registry.register(
            "last_refresh_timestamp_seconds",
            "When a foreign trust domain's bundle was last accepted",
            m.last_refresh.clone(),
        );
        registry.register(
            "anchors",
            "X.509 authorities in force for a foreign trust domain",
            m.anchors.clone(),
        );
        registry.register(
            "sequence",
            "spiffe_sequence of the foreign bundle in force",
            m.sequence.clone(),
        );
        m
    }

    fn accepted(&self, bundle: &ForeignBundle) {
        let labels = TrustDomainLabels {
            trust_domain: bundle.trust_domain.clone(),
        };
        self.last_refresh
            .get_or_create(&labels)
            .set(bundle.accepted_at.unix_timestamp());
        let anchors = i64::try_from(bundle.bundle.x509_authorities.len()).unwrap_or(i64::MAX);
        self.anchors.get_or_create(&labels).set(anchors);
        let sequence = bundle.bundle.sequence.and_then(|s| i64::try_from(s).ok());
        self.sequence
            .get_or_create(&labels)
            .set(sequence.unwrap_or(0));
    }

    fn refused(&self, trust_domain: &str, refusal: &Refusal) {
        self.refusals
            .get_or_create(&RefusalLabels {
                trust_domain: trust_domain.to_owned(),
                reason: refusal.reason(),
            })
            .inc();
    }
}

/// Why `[[federation]]` cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FederationStartError {
    #[error("[[federation]] {trust_domain}: {detail}")]
    Entry {
        trust_domain: String,
        detail: String,
    },
    #[error("[[federation]] {trust_domain}: initial_bundle {path}: {detail}")]
    InitialBundle {
        trust_domain: String,
        path: String,
        detail: String,
    },
}

/// The last good bundle of `trust_domain` under `dir`.
pub fn last_good_path(dir: &Path, trust_domain: &str) -> PathBuf {
    dir.join(format!("{trust_domain}.json"))
}

/// Starts a fetcher per `[[federation]]` entry. Each foreign bundle starts from the last good
/// one kept (its `last_good_file`, else `<state_dir>/<td>.json`; so a restart needs no
/// endpoint), else from `initial_bundle`, else (`https_web` only) from nothing until the first
/// fetch; every accepted one is written there. `bundles` must be empty of these trust domains.
pub fn start(
    rt: &mut Runtime,
    configs: &[FederationConfig],
    bundles: &FederatedBundles,
    state_dir: Option<PathBuf>,
) -> Result<(), FederationStartError> {
    if configs.is_empty() {
        return Ok(());
    }
    let metrics = rt
        .metrics()
        .register_component("federation", FederationMetrics::register);
    for config in configs {
        let td = config.trust_domain.clone();
        let entry = |detail: String| FederationStartError::Entry {
            trust_domain: td.clone(),
            detail,
        };
        if bundles.is_own(&td) {
            return Err(entry("is one of podca's own trust domains".into()));
        }
        parse_url(&config.bundle_endpoint_url).map_err(|e| entry(e.to_string()))?;
        let auth = match &config.profile {
            FederationProfile::HttpsSpiffe { endpoint_spiffe_id } => {
                if podca_authority::bundle_endpoint::trust_domain_of(endpoint_spiffe_id).is_none() {
                    return Err(entry(format!(
                        "endpoint_spiffe_id = {endpoint_spiffe_id:?} is not a SPIFFE ID"
                    )));
                }
                EndpointAuth::Spiffe(endpoint_spiffe_id.clone())
            }
            FederationProfile::HttpsWeb { ca_file } => {
                EndpointAuth::Web(Arc::new(web_roots(&td, ca_file.as_deref())?))
            }
        };
        let kept_at = config
            .last_good_file
            .clone()
            .or_else(|| state_dir.as_deref().map(|d| last_good_path(d, &td)));
        match initial_bundle(config, kept_at.as_deref())? {
            Some((initial, from_initial_bundle)) => {
                check(&td, &initial, None)
                    .map_err(|e| entry(format!("the starting bundle: {e}")))?;
                let first = ForeignBundle {
                    trust_domain: td.clone(),
                    bundle: initial,
                    accepted_at: OffsetDateTime::now_utc(),
                    from_initial_bundle,
                };
                metrics.accepted(&first);
                bundles.accept(first).map_err(|e| entry(e.to_string()))?;
            }
            None => {
                let labels = TrustDomainLabels {
                    trust_domain: td.clone(),
                };
                metrics.anchors.get_or_create(&labels).set(0);
            }
        }
        let endpoint = Endpoint {
            trust_domain: td.clone(),
            url: config.bundle_endpoint_url.clone(),
            auth,
        };
        let min = Duration::from_secs(config.min_refresh_seconds.max(1));
        let max = Duration::from_secs(config.max_refresh_seconds).max(min);
        let (bundles, metrics) = (bundles.clone(), metrics.clone());
        rt.spawn(Stage::Serve, format!("federation {td}"), move |stop| {
            refresh(endpoint, bundles, metrics, kept_at, (min, max), stop)
        });
    }
    Ok(())
}

/// Web PKI roots: `ca_file`'s PEM certificates, else the system's.
fn web_roots(
    td: &str,
    ca_file: Option<&Path>,
) -> Result<rustls::RootCertStore, FederationStartError> {
    use rustls::pki_types::pem::PemObject;
    let failed = |detail: String| FederationStartError::Entry {
        trust_domain: td.to_owned(),
        detail,
    };
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| failed(format!("ca_file {}: {e}", path.display())))?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| failed(format!("ca_file {}: {e}", path.display())))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(failed(format!(
                    "ca_file {}: no CA certificate in it",
                    path.display()
                )));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                return Err(failed(
                    "https_web: the system has no root certificates; set ca_file".to_owned(),
                ));
            }
        }
    }
    Ok(roots)
}

/// The bundle to start from, and whether it is the configured `initial_bundle` (rather than
/// the last good one kept at `kept_at`); `None`: neither (`https_web` without one).
fn initial_bundle(
    config: &FederationConfig,
    kept_at: Option<&Path>,
) -> Result<Option<(SpiffeBundle, bool)>, FederationStartError> {
    if let Some(path) = kept_at
        && let Ok(json) = std::fs::read(path)
    {
        match SpiffeBundle::parse(&json) {
            Ok(bundle) => return Ok(Some((bundle, false))),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "federation: the last good bundle is unreadable; starting from initial_bundle")
            }
        }
    }
    let Some(path) = &config.initial_bundle else {
        return Ok(None);
    };
    let failed = |detail: String| FederationStartError::InitialBundle {
        trust_domain: config.trust_domain.clone(),
        path: path.display().to_string(),
        detail,
    };
    let json = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    let bundle = SpiffeBundle::parse(&json).map_err(|e| failed(e.to_string()))?;
    Ok(Some((bundle, true)))
}

/// Fetches `endpoint` now and then on [`next_fetch_in`]'s schedule until `stop`.
async fn refresh(
    endpoint: Endpoint,
    bundles: FederatedBundles,
    metrics: FederationMetrics,
    kept_at: Option<PathBuf>,
    (min, max): (Duration, Duration),
    mut stop: watch::Receiver<bool>,
) {
    let td = endpoint.trust_domain.clone();
    let mut failures = 0u32;
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(wait) => {}
        }
        let in_force = bundles.current().get(&td).cloned();
        let fetched = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            fetched = fetch(&endpoint, in_force.as_deref(), FetchLimits::default()) => fetched,
        };
        let outcome = match fetched {
            Ok(bundle) => {
                let hint = bundle.refresh_hint;
                let json = bundle.to_json();
                let accepted = ForeignBundle {
                    trust_domain: td.clone(),
                    bundle,
                    accepted_at: OffsetDateTime::now_utc(),
                    from_initial_bundle: false,
                };
                metrics.accepted(&accepted);
                match bundles.accept(accepted) {
                    Ok(()) => Ok((hint, json)),
                    Err(FederationRefusal::LoweredSequence {
                        offered, in_force, ..
                    }) => Err(Refusal::LoweredSequence { offered, in_force }),
                    Err(other) => {
                        error!(trust_domain = td, error = %other, "federation: refused");
                        return;
                    }
                }
            }
            Err(refusal) => Err(refusal),
        };
        match outcome {
            Ok((hint, json)) => {
                failures = 0;
                wait = next_fetch_in(hint, 0, min, max);
                if let (Some(path), Ok(json)) = (&kept_at, json) {
                    let dir = path.parent().unwrap_or(Path::new("."));
                    let kept = std::fs::create_dir_all(dir)
                        .map_err(|e| e.to_string())
                        .and_then(|()| {
                            podca_signer::store::write_atomic(path, &json, 0o644)
                                .map_err(|e| e.to_string())
                        });
                    if let Err(e) = kept {
                        warn!(trust_domain = td, error = %e, "federation: cannot keep the last good bundle");
                    }
                }
                debug!(trust_domain = td, next_in = ?wait, "federation: bundle refreshed");
            }
            Err(refusal) => {
                failures = failures.saturating_add(1);
                wait = next_fetch_in(None, failures, min, max);
                metrics.refused(&td, &refusal);
                warn!(
                    trust_domain = td,
                    reason = refusal.reason(),
                    error = %refusal,
                    retry_in = ?wait,
                    "federation: foreign bundle refused; the bundle in force stays"
                );
            }
        }
    }
}

/// The URL's host, port and path.
fn parse_url(url: &str) -> Result<(String, u16, String), Refusal> {
    let bad = || Refusal::BadUrl(url.escape_debug().to_string());
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("https") {
        return Err(bad());
    }
    let host = uri.host().ok_or_else(bad)?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    Ok((host, uri.port_u16().unwrap_or(443), path))
}

/// One GET; the body of a 200 answer.
async fn get(
    endpoint: &Endpoint,
    in_force: Option<&ForeignBundle>,
    limits: FetchLimits,
) -> Result<Vec<u8>, Refusal> {
    let (host, port, path) = parse_url(&endpoint.url)?;
    let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Refusal::Tls(e.to_string()))?;
    let (config, expected, anchors) = match &endpoint.auth {
        EndpointAuth::Spiffe(spiffe_id) => {
            let in_force = in_force.ok_or_else(|| {
                Refusal::Tls("no bundle in force to authenticate the endpoint with".into())
            })?;
            let anchors: Vec<CertificateDer<'static>> = in_force
                .bundle
                .x509_authorities
                .iter()
                .map(|c| CertificateDer::from(c.der().to_vec()))
                .collect();
            let verifier =
                PinnedSpiffeId::new(spiffe_id, anchors).map_err(|e| Refusal::Tls(e.to_string()))?;
            // The verifier pins the SPIFFE ID; the name only fills SNI.
            let config = builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth();
            (
                config,
                spiffe_id.clone(),
                "in the foreign trust domain's bundle in force",
            )
        }
        EndpointAuth::Web(roots) => {
            let config = builder
                .with_root_certificates(Arc::clone(roots))
                .with_no_client_auth();
            (
                config,
                host.clone(),
                "among the Web PKI roots (ca_file, else the system's)",
            )
        }
    };
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| Refusal::Connect(e.to_string()))?;
    let name = ServerName::try_from(host.clone())
        .map_err(|_| Refusal::BadUrl(endpoint.url.escape_debug().to_string()))?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| Refusal::Tls(crate::client::tls_failure_in(&e, &expected, "", anchors)))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| Refusal::Connect(e.to_string()))?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match tls.read(&mut chunk).await {
            Ok(n) => n,
            // A peer that closes without close_notify after a complete answer is common.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(Refusal::Connect(e.to_string())),
        };
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
        if answer.len() > limits.max_bytes {
            return Err(Refusal::TooLarge(limits.max_bytes));
        }
    }
    body_of(&answer)
}

/// The body of a complete HTTP/1.1 200 answer.
fn body_of(answer: &[u8]) -> Result<Vec<u8>, Refusal> {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(Refusal::Http("no end of the head"))?;
    let head = std::str::from_utf8(&answer[..end]).map_err(|_| Refusal::Http("head not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.strip_prefix("HTTP/1."))
        .and_then(|l| l.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or(Refusal::Http("no status line"))?;
    if status != 200 {
        return Err(Refusal::Status(status));
    }
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_ascii_lowercase())
        })
    };
    let body = &answer[end + 4..];
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return dechunk(body);
    }
    match header("content-length") {
        Some(length) => {
            let length: usize = length
                .parse()
                .map_err(|_| Refusal::Http("bad Content-Length"))?;
            body.get(..length)
                .map(<[u8]>::to_vec)
                .ok_or(Refusal::Http("the body is shorter than its Content-Length"))
        }
        None => Ok(body.to_vec()),
    }
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(Refusal::Http("a chunk without its size line"))?;
        let size = std::str::from_utf8(&body[..line_end])
            .ok()
            .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok())
            .ok_or(Refusal::Http("a bad chunk size"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let data = body
            .get(..size)
            .ok_or(Refusal::Http("a chunk shorter than its size"))?;
        out.extend_from_slice(data);
        body = body
            .get(size + 2..)
            .ok_or(Refusal::Http("a chunk without its end"))?;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use podca_authority::serving_cert::ServingIdentity;
    use podca_signer::IssuingCa;
    use podca_signer::backend::{CaAlgorithm, MemoryKey};
    use time::OffsetDateTime;
    use tokio::net::TcpListener;

    use super::*;

    const ENDPOINT_ID: &str = "spiffe://away.test/bundle-endpoint";

    fn ca() -> IssuingCa {
        let key = Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap());
        let now = OffsetDateTime::now_utc();
        IssuingCa::self_signed_root(key, "away root", now, time::Duration::days(10)).unwrap()
    }

    fn in_force(ca: &IssuingCa, sequence: u64) -> ForeignBundle {
        ForeignBundle {
            trust_domain: "away.test".into(),
            bundle: SpiffeBundle {
                x509_authorities: ca.roots().to_vec(),
                jwt_authorities: vec![],
                sequence: Some(sequence),
                refresh_hint: Some(60),
            },
            accepted_at: OffsetDateTime::now_utc(),
            from_initial_bundle: false,
        }
    }

    /// What the test endpoint answers.
    enum Answer {
        Bytes(Vec<u8>),
        Stall,
    }

    fn ok(body: &[u8]) -> Answer {
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(body);
        Answer::Bytes(answer)
    }

    /// A one-answer HTTPS endpoint with an SVID for `spiffe_id` from `ca`.
    async fn endpoint(ca: &IssuingCa, spiffe_id: &str, answer: Answer) -> Endpoint {
        let identity = ServingIdentity {
            spiffe_id: spiffe_id.into(),
            dns_names: vec![],
            lifetime: time::Duration::hours(1),
        };
        let cert = identity.issue(ca, OffsetDateTime::now_utc()).unwrap();
        let addr = serve_once(&cert.chain_der, &cert.key_pkcs8_der, answer).await;
        Endpoint {
            trust_domain: "away.test".into(),
            url: format!("https://{addr}/"),
            auth: EndpointAuth::Spiffe(ENDPOINT_ID.into()),
        }
    }

    /// Serves `answer` once over TLS with the chain and key given.
    async fn serve_once(chain: &[Vec<u8>], key: &[u8], answer: Answer) -> std::net::SocketAddr {
        let keys = crate::tls::ServingKeys::new(crate::tls::certified_key(chain, key).unwrap());
        let acceptor =
            tokio_rustls::TlsAcceptor::from(crate::tls::http1_server_config(keys).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && tls.read(&mut byte).await.unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            match answer {
                Answer::Bytes(bytes) => {
                    let _ = tls.write_all(&bytes).await;
                    let _ = tls.shutdown().await;
                }
                Answer::Stall => tokio::time::sleep(Duration::from_secs(60)).await,
            }
        });
        addr
    }

    fn document(ca: &IssuingCa, sequence: u64) -> Vec<u8> {
        SpiffeBundle {
            x509_authorities: ca.roots().to_vec(),
            jwt_authorities: vec![],
            sequence: Some(sequence),
            refresh_hint: Some(30),
        }
        .to_json()
        .unwrap()
    }

    fn quick() -> FetchLimits {
        FetchLimits {
            max_bytes: 64 * 1024,
            // Room for a handshake on a loaded machine; the stall case waits it out.
            timeout: Duration::from_secs(3),
        }
    }

    #[tokio::test]
    async fn a_newer_bundle_from_the_pinned_endpoint_is_taken() {
        let ca = ca();
        let served = endpoint(&ca, ENDPOINT_ID, ok(&document(&ca, 6))).await;
        let bundle = fetch(&served, Some(&in_force(&ca, 5)), quick())
            .await
            .unwrap();
        assert_eq!(bundle.sequence, Some(6));
        assert_eq!(bundle.x509_authorities, ca.roots());
        // Chunked, as Go's net/http sends larger answers.
        let doc = document(&ca, 7);
        let (a, b) = doc.split_at(doc.len() / 2);
        let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for part in [a, b] {
            chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            chunked.extend_from_slice(part);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        let served = endpoint(&ca, ENDPOINT_ID, Answer::Bytes(chunked)).await;
        let bundle = fetch(&served, Some(&in_force(&ca, 5)), quick())
            .await
            .unwrap();
        assert_eq!(bundle.sequence, Some(7));
    }

    #[tokio::test]
    async fn each_bad_answer_is_refused_with_its_reason() {
        let ca = ca();
        let leaf = {
            let key = rcgen::KeyPair::generate().unwrap();
            let params = rcgen::CertificateParams::new(vec!["leaf.test".into()]).unwrap();
            params.self_signed(&key).unwrap().der().to_vec()
        };
        let other_td_ca = {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.subject_alt_names = vec![rcgen::SanType::URI(
                "spiffe://other.test".try_into().unwrap(),
            )];
            params.self_signed(&key).unwrap().der().to_vec()
        };
        let with_x5c = |der: &[u8]| {
            use base64::Engine;
            let x5c = base64::engine::general_purpose::STANDARD.encode(der);
            format!(r#"{{"keys":[{{"use":"x509-svid","kty":"EC","x5c":["{x5c}"]}}],"spiffe_sequence":9}}"#)
                .into_bytes()
        };
        let huge = vec![b' '; 100 * 1024];
        let cases: Vec<(Answer, &str, &str)> = vec![
            (ok(&document(&ca, 4)), ENDPOINT_ID, "lowered_sequence"),
            (ok(b"{}"), ENDPOINT_ID, "malformed"),
            (ok(br#"{"keys":[]}"#), ENDPOINT_ID, "empty"),
            (ok(&with_x5c(&leaf)), ENDPOINT_ID, "not_ca"),
            (
                ok(&with_x5c(&other_td_ca)),
                ENDPOINT_ID,
                "other_trust_domain",
            ),
            (ok(&huge), ENDPOINT_ID, "too_large"),
            (Answer::Stall, ENDPOINT_ID, "timeout"),
            (
                Answer::Bytes(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n".to_vec()),
                ENDPOINT_ID,
                "status",
            ),
            // The endpoint is someone else of the foreign trust domain.
            (ok(&document(&ca, 6)), "spiffe://away.test/impostor", "tls"),
        ];
        for (answer, served_as, reason) in cases {
            let served = endpoint(&ca, served_as, answer).await;
            let refusal = fetch(&served, Some(&in_force(&ca, 5)), quick())
                .await
                .unwrap_err();
            assert_eq!(refusal.reason(), reason, "{refusal}");
        }
        // An endpoint whose CA is not among the foreign trust domain's authorities.
        let stranger = self::ca();
        let served = endpoint(&stranger, ENDPOINT_ID, ok(&document(&stranger, 6))).await;
        let refusal = fetch(&served, Some(&in_force(&ca, 5)), quick())
            .await
            .unwrap_err();
        assert_eq!(refusal.reason(), "tls", "{refusal}");
    }

    /// A Web PKI root and an endpoint certificate for `localhost` from it, as DER.
    fn web_pki(root_name: &str) -> (CertificateDer<'static>, Vec<u8>, Vec<u8>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, root_name);
        let root = ca.self_signed(&ca_key).unwrap().der().clone();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (root, leaf.der().to_vec(), key.serialize_der())
    }

    #[tokio::test]
    async fn an_https_web_endpoint_must_chain_to_the_roots_and_name_the_host() {
        let ca = ca();
        let (root, leaf, key) = web_pki("ingress root");
        let (other_root, ..) = web_pki("another root");
        let web = |host: &str, port: u16, root: &CertificateDer<'static>| {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(root.clone()).unwrap();
            Endpoint {
                trust_domain: "away.test".into(),
                url: format!("https://{host}:{port}/"),
                auth: EndpointAuth::Web(Arc::new(roots)),
            }
        };
        // No bundle in force is needed: the first fetch stands on the Web PKI.
        let addr = serve_once(std::slice::from_ref(&leaf), &key, ok(&document(&ca, 3))).await;
        let bundle = fetch(&web("localhost", addr.port(), &root), None, quick())
            .await
            .unwrap();
        assert_eq!(bundle.sequence, Some(3));
        for (host, root, expected) in [
            ("127.0.0.1", &root, "not valid for \"127.0.0.1\""),
            (
                "localhost",
                &other_root,
                "does not chain to an anchor among the Web PKI roots",
            ),
        ] {
            let addr = serve_once(std::slice::from_ref(&leaf), &key, ok(&document(&ca, 3))).await;
            let refusal = fetch(&web(host, addr.port(), root), None, quick())
                .await
                .unwrap_err();
            assert_eq!(refusal.reason(), "tls", "{refusal}");
            assert!(refusal.to_string().contains(expected), "{refusal}");
        }
        // https_spiffe without a bundle in force cannot authenticate anything.
        let served = endpoint(&ca, ENDPOINT_ID, ok(&document(&ca, 6))).await;
        let refusal = fetch(&served, None, quick()).await.unwrap_err();
        assert_eq!(refusal.reason(), "tls", "{refusal}");
    }

    #[test]
    fn the_next_fetch_follows_the_hint_within_clamps_and_backs_off() {
        let (min, max) = (Duration::from_secs(10), Duration::from_secs(600));
        let s = Duration::from_secs;
        assert_eq!(next_fetch_in(Some(300), 0, min, max), s(300));
        assert_eq!(next_fetch_in(Some(1), 0, min, max), s(10));
        assert_eq!(next_fetch_in(Some(86_400), 0, min, max), s(600));
        assert_eq!(next_fetch_in(None, 0, min, max), s(600));
        assert_eq!(next_fetch_in(Some(300), 1, min, max), s(10));
        assert_eq!(next_fetch_in(Some(300), 3, min, max), s(40));
        assert_eq!(next_fetch_in(Some(300), 30, min, max), s(600));
    }

    #[test]
    fn urls_must_be_https() {
        assert_eq!(
            parse_url("https://b.test:8443/bundle").unwrap(),
            ("b.test".into(), 8443, "/bundle".into())
        );
        assert_eq!(parse_url("https://b.test").unwrap().1, 443);
        assert!(matches!(
            parse_url("http://b.test/"),
            Err(Refusal::BadUrl(_))
        ));
        assert!(matches!(parse_url("b.test"), Err(Refusal::BadUrl(_))));
    }
}
