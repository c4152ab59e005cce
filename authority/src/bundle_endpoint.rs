//! `[bundle_endpoint]`: where podca serves its SPIFFE bundle (SPIFFE Trust Domain and Bundle,
//! §5) and how the endpoint authenticates itself. The server is `podca_grpc::bundle_endpoint`.
//!
//! ```toml
//! [bundle_endpoint]
//! listen = "0.0.0.0:8443"
//! profile = "https_spiffe"              # or "https_web"
//! signer = ""                           # whose trust domain's bundle ("" = [grpc] signer)
//! # https_spiffe: podca's own SVID for this SPIFFE ID, from the signer's CA, renewed at half life
//! spiffe_id = "spiffe://cluster.local/ns/podca-system/sa/podca-bundle"
//! # https_web: an operator-provided certificate and key (PEM), reloaded when the files change
//! # cert_file = "/etc/podca/bundle-tls/tls.crt"
//! # key_file = "/etc/podca/bundle-tls/tls.key"
//! ```
//!
//! A table with settings of the other profile is refused, so a setting is never silently
//! ignored.
//!
//! # The server ([`serve`])
//!
//! HTTPS only (the TLS configuration comes from the caller: `podca_grpc::bundle_endpoint`
//! builds it for the profile), HTTP/1.1, one document at one path:
//!
//! | request | status |
//! |---|---|
//! | `GET`/`HEAD /` | 200 `application/json`, the bundle document ([`BundleSource`]) |
//! | any other path | 404 |
//! | any other method | 405, `Allow: GET, HEAD` |
//! | a request with a body | 413 |
//! | the document cannot be built (a CA key a JWK cannot carry) | 500, logged |
//!
//! Limits as OIDC discovery's ([`OidcLimits`]): 64 connections, 16 per source address, 10 s
//! for a TLS handshake and for a request head, 30 s idle. Counted in
//! `podca_bundle_endpoint_requests_total{status}`, `..._connections_refused_total` and
//! `..._tls_handshake_failures_total`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use podca_signer::spiffe_bundle::{BundleError, SpiffeBundle};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, error};

use crate::admin::IdleTimeout;
use crate::jwt::JwtHandle;
use crate::oidc::{MAX_REQUEST_HEAD, OidcLimits};
use crate::trust::CaHandle;

/// `[bundle_endpoint]`, parsed once ([`RawBundleEndpoint`] → this).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawBundleEndpoint")]
pub struct BundleEndpointConfig {
    pub listen: SocketAddr,
    /// The signer whose trust domain is served (`None`: `[grpc] signer`).
    pub signer: Option<String>,
    pub profile: EndpointProfile,
}

/// How the endpoint authenticates itself to bundle consumers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointProfile {
    /// `https_web`: a certificate from a Web PKI (or the cluster's ingress PKI), from files.
    HttpsWeb {
        cert_file: PathBuf,
        key_file: PathBuf,
    },
    /// `https_spiffe`: an X.509-SVID podca issues itself for `spiffe_id`.
    HttpsSpiffe { spiffe_id: String },
}

impl EndpointProfile {
    /// The profile's name as configured (and as SPIFFE names it).
    pub fn name(&self) -> &'static str {
        match self {
            EndpointProfile::HttpsWeb { .. } => "https_web",
            EndpointProfile::HttpsSpiffe { .. } => "https_spiffe",
        }
    }
}

/// The table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBundleEndpoint {
    listen: SocketAddr,
    profile: String,
    #[serde(default)]
    signer: String,
    #[serde(default)]
    cert_file: Option<PathBuf>,
    #[serde(default)]
    key_file: Option<PathBuf>,
    #[serde(default)]
    spiffe_id: Option<String>,
}

/// A `[bundle_endpoint]` table that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BundleEndpointConfigError {
    #[error("[bundle_endpoint] profile = {0:?}: use \"https_web\" or \"https_spiffe\"")]
    UnknownProfile(String),
    #[error("[bundle_endpoint] profile = \"https_web\" needs cert_file and key_file")]
    WebNeedsFiles,
    #[error("[bundle_endpoint] profile = \"https_spiffe\" needs spiffe_id")]
    SpiffeNeedsId,
    #[error("[bundle_endpoint] {setting} belongs to the other profile than {profile:?}")]
    OtherProfile {
        setting: &'static str,
        profile: &'static str,
    },
    #[error("[bundle_endpoint] spiffe_id = {0:?} is not a spiffe://<trust domain>/<path> ID")]
    BadSpiffeId(String),
}

impl TryFrom<RawBundleEndpoint> for BundleEndpointConfig {
    type Error = BundleEndpointConfigError;

    fn try_from(raw: RawBundleEndpoint) -> Result<Self, Self::Error> {
        let RawBundleEndpoint {
            listen,
            profile,
            signer,
            cert_file,
            key_file,
            spiffe_id,
        } = raw;
        let profile = match profile.as_str() {
            "https_web" => {
                if spiffe_id.is_some() {
                    return Err(BundleEndpointConfigError::OtherProfile {
                        setting: "spiffe_id",
                        profile: "https_web",
                    });
                }
                match (cert_file, key_file) {
                    (Some(cert_file), Some(key_file)) => EndpointProfile::HttpsWeb {
                        cert_file,
                        key_file,
                    },
                    _ => return Err(BundleEndpointConfigError::WebNeedsFiles),
                }
            }
            "https_spiffe" => {
                if cert_file.is_some() || key_file.is_some() {
                    return Err(BundleEndpointConfigError::OtherProfile {
                        setting: if cert_file.is_some() {
                            "cert_file"
                        } else {
                            "key_file"
                        },
                        profile: "https_spiffe",
                    });
                }
                let spiffe_id = spiffe_id.ok_or(BundleEndpointConfigError::SpiffeNeedsId)?;
                if trust_domain_of(&spiffe_id).is_none() {
                    return Err(BundleEndpointConfigError::BadSpiffeId(spiffe_id));
                }
                EndpointProfile::HttpsSpiffe { spiffe_id }
            }
            _ => return Err(BundleEndpointConfigError::UnknownProfile(profile)),
        };
        Ok(BundleEndpointConfig {
            listen,
            signer: Some(signer).filter(|s| !s.is_empty()),
            profile,
        })
    }
}

/// The trust domain of `spiffe://<td>/<path>` (a non-empty path), or `None`.
pub fn trust_domain_of(spiffe_id: &str) -> Option<&str> {
    let rest = spiffe_id.strip_prefix("spiffe://")?;
    let (td, path) = rest.split_once('/')?;
    let td_ok = !td.is_empty()
        && td
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b));
    let path_ok = !path.is_empty()
        && path.split('/').all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        });
    (td_ok && path_ok).then_some(td)
}

/// The one path the document is served at (as SPIRE serves it).
pub const BUNDLE_PATH: &str = "/";

/// A built document and the (CA generation, JWT key set sequence) it was built from.
type CachedDocument = ((u64, u64), Arc<Vec<u8>>);

/// Where the served document comes from: the same CA snapshot and JWT keys the Workload API
/// hands out, so the endpoint and the Workload API never disagree.
#[derive(Debug, Clone)]
pub struct BundleSource {
    pub ca: CaHandle,
    /// The JWT keys, when they belong to this trust domain.
    pub jwt: Option<JwtHandle>,
    /// `spiffe_refresh_hint`, seconds.
    pub refresh_hint: u64,
    /// The last document, by (CA generation, JWT sequence): HSM-held keys are not asked for
    /// their public key on every request.
    cached: Arc<Mutex<Option<CachedDocument>>>,
}

impl BundleSource {
    pub fn new(ca: CaHandle, jwt: Option<JwtHandle>, refresh_hint: u64) -> Self {
        BundleSource {
            ca,
            jwt,
            refresh_hint,
            cached: Arc::default(),
        }
    }

    /// The document for the CA and keys in force now.
    pub fn document(&self) -> Result<Arc<Vec<u8>>, BundleError> {
        let snapshot = self.ca.current();
        let keys = self.jwt.as_ref().map(JwtHandle::current);
        let version = (
            snapshot.generation,
            keys.as_ref().map_or(0, |k| k.sequence()),
        );
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, document)) = cached.as_ref()
            && *at == version
        {
            return Ok(Arc::clone(document));
        }
        let keys = keys.as_deref().filter(|k| k.infos().next().is_some());
        let bundle = SpiffeBundle::of(&snapshot.anchors, keys, self.refresh_hint);
        let document = Arc::new(bundle.to_json()?);
        *cached = Some((version, Arc::clone(&document)));
        Ok(document)
    }
}

/// `podca_bundle_endpoint_*`. Cloning shares the series.
#[derive(Debug, Clone, Default)]
pub struct BundleEndpointMetrics {
    /// `podca_bundle_endpoint_requests_total{status}`.
    pub requests: Family<StatusLabels, Counter>,
    /// `podca_bundle_endpoint_connections_refused_total`: closed at accept by the cap.
    pub connections_refused: Counter,
    /// `podca_bundle_endpoint_tls_handshake_failures_total`.
    pub tls_handshake_failures: Counter,
}

/// The `status` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: u16,
}

impl BundleEndpointMetrics {
    /// Registers the series in `registry` (the component's sub-registry, prefix
    /// `bundle_endpoint`).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "requests",
            "SPIFFE bundle endpoint requests answered, by status",
            metrics.requests.clone(),
        );
        registry.register(
            "connections_refused",
            "SPIFFE bundle endpoint connections closed at accept by the connection cap",
            metrics.connections_refused.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes on the SPIFFE bundle endpoint that failed or timed out",
            metrics.tls_handshake_failures.clone(),
        );
        metrics
    }
}

/// The answer to one request (see the module docs' table).
pub fn respond(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    source: &BundleSource,
) -> Response<Full<Bytes>> {
    let text = |code: StatusCode, body: &'static str| {
        answer(
            code,
            Bytes::from_static(body.as_bytes()),
            "text/plain; charset=utf-8",
        )
    };
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    if headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
    {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "a request body is not accepted\n",
        );
    }
    if path != BUNDLE_PATH {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    match source.document() {
        Ok(document) => answer(
            StatusCode::OK,
            Bytes::from(Vec::clone(&document)),
            "application/json",
        ),
        Err(e) => {
            error!(error = %e, "the SPIFFE bundle document cannot be built");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the bundle cannot be served\n",
            )
        }
    }
}

fn answer(code: StatusCode, body: Bytes, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Serves the bundle of `source` over `tls` on `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    source: BundleSource,
    metrics: BundleEndpointMetrics,
    limits: OidcLimits,
    mut stop: watch::Receiver<bool>,
) {
    let slots = crate::slots::Slots::new(limits.max_connections, limits.max_connections_per_peer);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                debug!(error = %e, "bundle endpoint: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.try_acquire(peer.ip()) else {
            debug!(%peer, "bundle endpoint: connection closed at accept (no slot)");
            metrics.connections_refused.inc();
            continue;
        };
        let (source, acceptor, metrics) = (source.clone(), acceptor.clone(), metrics.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let io = IdleTimeout::new(stream, limits.idle_timeout);
            let tls =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(io)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "bundle endpoint: TLS handshake failed");
                        metrics.tls_handshake_failures.inc();
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "bundle endpoint: TLS handshake timed out");
                        metrics.tls_handshake_failures.inc();
                        return;
                    }
                };
            let requests = metrics.requests.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let response = respond(req.method(), req.uri().path(), req.headers(), &source);
                requests
                    .get_or_create(&StatusLabels {
                        status: response.status().as_u16(),
                    })
                    .inc();
                async move { Ok::<_, Infallible>(response) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(MAX_REQUEST_HEAD);
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

/// One `[[federation]]` entry: a foreign trust domain whose bundle podca fetches
/// (`podca_grpc::federation_fetch`), parsed once ([`RawFederation`] → this).
///
/// ```toml
/// [[federation]]
/// trust_domain = "cluster-b.example"
/// bundle_endpoint_url = "https://bundle.cluster-b.example:8443/"
/// profile = "https_spiffe"      # or "https_web"
/// # https_spiffe: the endpoint's SPIFFE ID and the foreign bundle to authenticate it with first
/// endpoint_spiffe_id = "spiffe://cluster-b.example/ns/podca-system/sa/podca-bundle"
/// initial_bundle = "/etc/podca/federation/cluster-b.example.json"  # its SPIFFE bundle
/// # https_web: the endpoint's DNS name checked against Web PKI roots (the system's, or ca_file)
/// # ca_file = "/etc/podca/federation/web-roots.pem"
/// last_good_file = "/var/lib/podca/federation/cluster-b.example.json"  # kept across restarts
/// min_refresh_seconds = 30      # the refresh hint is clamped to [min, max]; backoff starts at min
/// max_refresh_seconds = 3600
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawFederation")]
pub struct FederationConfig {
    pub trust_domain: String,
    pub bundle_endpoint_url: String,
    pub profile: FederationProfile,
    /// The bundle to start from when no last good one is kept (`https_spiffe`: required, it
    /// authenticates the first fetch; `https_web`: optional).
    pub initial_bundle: Option<PathBuf>,
    /// Where the last accepted bundle is kept, so a restart starts from it (`podca dev`:
    /// `<data dir>/federation/<td>.json` when unset).
    pub last_good_file: Option<PathBuf>,
    pub min_refresh_seconds: u64,
    pub max_refresh_seconds: u64,
}

/// How a foreign bundle endpoint is authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FederationProfile {
    /// Its certificate chains to the foreign trust domain's X.509 authorities in force and
    /// carries `endpoint_spiffe_id` as its only URI SAN.
    HttpsSpiffe { endpoint_spiffe_id: String },
    /// Its certificate chains to Web PKI roots (`ca_file`'s PEM certificates, else the
    /// system's) and names the URL's host.
    HttpsWeb { ca_file: Option<PathBuf> },
}

impl FederationProfile {
    /// The profile's name as configured (and as SPIFFE names it).
    pub fn name(&self) -> &'static str {
        match self {
            FederationProfile::HttpsWeb { .. } => "https_web",
            FederationProfile::HttpsSpiffe { .. } => "https_spiffe",
        }
    }
}

/// A `[[federation]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFederation {
    trust_domain: String,
    bundle_endpoint_url: String,
    profile: String,
    #[serde(default)]
    endpoint_spiffe_id: Option<String>,
    #[serde(default)]
    initial_bundle: Option<PathBuf>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    last_good_file: Option<PathBuf>,
    #[serde(default = "default_min_refresh")]
    min_refresh_seconds: u64,
    #[serde(default = "default_max_refresh")]
    max_refresh_seconds: u64,
}

/// A `[[federation]]` table that cannot be fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FederationConfigError {
    #[error("[[federation]] {td}: profile = {profile:?}: use \"https_spiffe\" or \"https_web\"")]
    UnknownProfile { td: String, profile: String },
    #[error(
        "[[federation]] {td}: profile = \"https_spiffe\" needs endpoint_spiffe_id and \
         initial_bundle (the foreign bundle that authenticates the first fetch)"
    )]
    SpiffeNeeds { td: String },
    #[error("[[federation]] {td}: {setting} belongs to the other profile than {profile:?}")]
    OtherProfile {
        td: String,
        setting: &'static str,
        profile: &'static str,
    },
}

impl TryFrom<RawFederation> for FederationConfig {
    type Error = FederationConfigError;

    fn try_from(raw: RawFederation) -> Result<Self, Self::Error> {
        let td = raw.trust_domain.clone();
        let profile = match raw.profile.as_str() {
            "https_spiffe" => {
                if raw.ca_file.is_some() {
                    return Err(FederationConfigError::OtherProfile {
                        td,
                        setting: "ca_file",
                        profile: "https_spiffe",
                    });
                }
                match (raw.endpoint_spiffe_id, &raw.initial_bundle) {
                    (Some(endpoint_spiffe_id), Some(_)) => {
                        FederationProfile::HttpsSpiffe { endpoint_spiffe_id }
                    }
                    _ => return Err(FederationConfigError::SpiffeNeeds { td }),
                }
            }
            "https_web" => {
                if raw.endpoint_spiffe_id.is_some() {
                    return Err(FederationConfigError::OtherProfile {
                        td,
                        setting: "endpoint_spiffe_id",
                        profile: "https_web",
                    });
                }
                FederationProfile::HttpsWeb {
                    ca_file: raw.ca_file,
                }
            }
            _ => {
                return Err(FederationConfigError::UnknownProfile {
                    td,
                    profile: raw.profile,
                });
            }
        };
        Ok(FederationConfig {
            trust_domain: raw.trust_domain,
            bundle_endpoint_url: raw.bundle_endpoint_url,
            profile,
            initial_bundle: raw.initial_bundle,
            last_good_file: raw.last_good_file,
            min_refresh_seconds: raw.min_refresh_seconds,
            max_refresh_seconds: raw.max_refresh_seconds,
        })
    }
}

fn default_min_refresh() -> u64 {
    30
}
fn default_max_refresh() -> u64 {
    3600
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BundleEndpointConfig, String> {
        toml::from_str(text).map_err(|e| e.message().to_owned())
    }

    fn federation(text: &str) -> Result<FederationConfig, String> {
        let head = "trust_domain = \"b.test\"\nbundle_endpoint_url = \"https://b.test/\"\n";
        toml::from_str(&format!("{head}{text}")).map_err(|e| e.message().to_owned())
    }

    #[test]
    fn a_federation_entry_takes_each_profiles_own_settings_only() {
        let spiffe = federation(
            "profile = \"https_spiffe\"\nendpoint_spiffe_id = \"spiffe://b.test/e\"\n\
             initial_bundle = \"/b.json\"",
        )
        .expect("https_spiffe");
        assert_eq!(
            spiffe.profile,
            FederationProfile::HttpsSpiffe {
                endpoint_spiffe_id: "spiffe://b.test/e".into()
            }
        );
        assert_eq!(
            (spiffe.min_refresh_seconds, spiffe.max_refresh_seconds),
            (30, 3600)
        );
        let web = federation("profile = \"https_web\"\nlast_good_file = \"/k/b.json\"")
            .expect("https_web without roots or initial bundle");
        assert_eq!(web.profile, FederationProfile::HttpsWeb { ca_file: None });
        assert_eq!(web.initial_bundle, None);
        assert_eq!(web.last_good_file, Some(PathBuf::from("/k/b.json")));
        for (text, expected) in [
            (
                "profile = \"http\"",
                "profile = \"http\": use \"https_spiffe\" or \"https_web\"",
            ),
            (
                "profile = \"https_spiffe\"\nendpoint_spiffe_id = \"spiffe://b.test/e\"",
                "needs endpoint_spiffe_id and initial_bundle",
            ),
            (
                "profile = \"https_spiffe\"\ninitial_bundle = \"/b.json\"",
                "needs endpoint_spiffe_id and initial_bundle",
            ),
            (
                "profile = \"https_web\"\nendpoint_spiffe_id = \"spiffe://b.test/e\"",
                "endpoint_spiffe_id belongs to the other profile than \"https_web\"",
            ),
            (
                "profile = \"https_spiffe\"\nendpoint_spiffe_id = \"spiffe://b.test/e\"\n\
                 initial_bundle = \"/b.json\"\nca_file = \"/r.pem\"",
                "ca_file belongs to the other profile than \"https_spiffe\"",
            ),
            (
                "profile = \"https_web\"\nbundle_url = \"x\"",
                "unknown field `bundle_url`",
            ),
        ] {
            let err = federation(text).expect_err(text);
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn each_profile_parses_with_its_own_settings_only() {
        let spiffe = parse(
            "listen = \"127.0.0.1:8443\"\nprofile = \"https_spiffe\"\n\
             spiffe_id = \"spiffe://a.test/bundle\"",
        )
        .expect("https_spiffe");
        assert_eq!(
            spiffe.profile,
            EndpointProfile::HttpsSpiffe {
                spiffe_id: "spiffe://a.test/bundle".into()
            }
        );
        assert_eq!(spiffe.signer, None);
        let web = parse(
            "listen = \"127.0.0.1:8443\"\nprofile = \"https_web\"\nsigner = \"s\"\n\
             cert_file = \"c.pem\"\nkey_file = \"k.pem\"",
        )
        .expect("https_web");
        assert_eq!(web.profile.name(), "https_web");
        assert_eq!(web.signer.as_deref(), Some("s"));
    }

    #[test]
    fn each_bad_table_gets_its_own_message() {
        let cases = [
            (
                "profile = \"http\"",
                "use \"https_web\" or \"https_spiffe\"",
            ),
            (
                "profile = \"https_web\"\ncert_file = \"c\"",
                "needs cert_file and key_file",
            ),
            ("profile = \"https_spiffe\"", "needs spiffe_id"),
            (
                "profile = \"https_spiffe\"\nspiffe_id = \"spiffe://a.test/x\"\nkey_file = \"k\"",
                "key_file belongs to the other profile",
            ),
            (
                "profile = \"https_web\"\ncert_file = \"c\"\nkey_file = \"k\"\n\
                 spiffe_id = \"spiffe://a.test/x\"",
                "spiffe_id belongs to the other profile",
            ),
            (
                "profile = \"https_spiffe\"\nspiffe_id = \"spiffe://A.test/x\"",
                "is not a spiffe://",
            ),
            (
                "profile = \"https_spiffe\"\nspiffe_id = \"spiffe://a.test\"",
                "is not a spiffe://",
            ),
            (
                "profile = \"https_web\"\npath = \"/\"",
                "unknown field `path`",
            ),
        ];
        for (table, expected) in cases {
            let text = format!("listen = \"127.0.0.1:1\"\n{table}");
            let error = parse(&text).expect_err(table);
            assert!(error.contains(expected), "{table}: {error}");
        }
    }

    fn source() -> BundleSource {
        let key = std::sync::Arc::new(
            podca_signer::MemoryKey::generate(podca_signer::CaAlgorithm::EcdsaP256).expect("key"),
        );
        let ca = podca_signer::IssuingCa::self_signed_root(
            key,
            "bundle endpoint test",
            time::OffsetDateTime::now_utc(),
            time::Duration::days(10),
        )
        .expect("a root");
        BundleSource::new(CaHandle::from(ca), None, 300)
    }

    #[test]
    fn the_document_is_served_at_one_path_to_get_only() {
        let source = source();
        let get = respond(&Method::GET, "/", &HeaderMap::new(), &source);
        assert_eq!(get.status(), StatusCode::OK);
        assert_eq!(get.headers()[header::CONTENT_TYPE], "application/json");
        let document = source.document().expect("a document");
        let bundle = SpiffeBundle::parse(&document).expect("it parses back");
        assert_eq!(bundle.x509_authorities, source.ca.current().anchors);
        assert_eq!(bundle.refresh_hint, Some(300));
        // Rotation (a new snapshot) bumps the sequence; the cache follows it.
        let before = bundle.sequence.expect("a sequence");
        let snapshot = source.ca.current();
        let key = std::sync::Arc::new(
            podca_signer::MemoryKey::generate(podca_signer::CaAlgorithm::EcdsaP256).expect("key"),
        );
        let next = podca_signer::IssuingCa::self_signed_root(
            key,
            "next",
            time::OffsetDateTime::now_utc() + time::Duration::seconds(5),
            time::Duration::days(10),
        )
        .expect("a root");
        let mut anchors = snapshot.anchors.clone();
        anchors.extend(next.roots().iter().cloned());
        source
            .ca
            .replace_arc(std::sync::Arc::clone(&snapshot.ca), anchors);
        let after = SpiffeBundle::parse(&source.document().expect("doc")).expect("parses");
        assert_eq!(after.x509_authorities.len(), 2);
        assert!(after.sequence.expect("a sequence") > before);

        let post = respond(&Method::POST, "/", &HeaderMap::new(), &source);
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(post.headers()[header::ALLOW], "GET, HEAD");
        let other = respond(&Method::GET, "/keys", &HeaderMap::new(), &source);
        assert_eq!(other.status(), StatusCode::NOT_FOUND);
        let mut with_body = HeaderMap::new();
        with_body.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        let body = respond(&Method::GET, "/", &with_body, &source);
        assert_eq!(body.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn trust_domains_of_spiffe_ids() {
        assert_eq!(trust_domain_of("spiffe://a.test/ns/x/sa/y"), Some("a.test"));
        for bad in [
            "spiffe://a.test/",
            "spiffe://a.test//x",
            "spiffe://a.test/../x",
            "https://a.test/x",
            "spiffe:///x",
        ] {
            assert_eq!(trust_domain_of(bad), None, "{bad}");
        }
    }
}
