//! The SPIFFE bundle endpoint as a runtime component (`[bundle_endpoint]`): binds the listener,
//! builds the TLS configuration of its profile and serves
//! [`podca_authority::bundle_endpoint::serve`].
//!
//! * `https_web`: the operator's certificate and key files, polled and reloaded when they
//!   change (as `[grpc] tls = "files"`); a bad new pair is logged and the old one stays.
//! * `https_spiffe`: an X.509-SVID for `spiffe_id` that podca issues itself from the served
//!   signer's CA, recorded in the ledger, renewed at half its life and at once when the active
//!   CA changes (`podca_authority::serving_cert::run`), so a consumer that verifies it against
//!   the bundle it fetched last time keeps succeeding through a rotation.
//!
//! The document is the one the Workload API hands out for that trust domain: the signer's CA
//! snapshot and, when the trust domain is `[grpc] signer`'s, the JWT keys.

use std::net::SocketAddr;
use std::sync::Arc;

use podca_authority::bundle_endpoint::{
    self as endpoint, BundleEndpointConfig, BundleEndpointMetrics, BundleSource, EndpointProfile,
    trust_domain_of,
};
use podca_authority::config::Config;
use podca_authority::jwt::JwtHandle;
use podca_authority::oidc::OidcLimits;
use podca_authority::serving_cert::{self, DEFAULT_LIFETIME, ServingIdentity, ServingLedger};
use podca_authority::{CaSet, Runtime, Stage};
use podca_signer::spiffe_bundle::refresh_hint_for;
use tokio::sync::watch;
use tracing::info;

use crate::component::StartError;
use crate::tls::{self, ServingFiles, ServingKeys};

/// The bound endpoint.
#[derive(Debug, Clone)]
pub struct Running {
    pub addr: SocketAddr,
    /// The trust domain whose bundle it serves.
    pub trust_domain: String,
}

/// Starts `config.bundle_endpoint` (`Ok(None)`: not configured). `jwt`: the JWT keys, which
/// belong to `[grpc] signer`'s trust domain.
pub async fn start(
    rt: &mut Runtime,
    config: &Config,
    cas: &CaSet,
    jwt: Option<&JwtHandle>,
) -> Result<Option<Running>, StartError> {
    let Some(endpoint_config) = &config.bundle_endpoint else {
        return Ok(None);
    };
    let BundleEndpointConfig {
        listen,
        signer,
        profile,
    } = endpoint_config;
    let refused = |e: &dyn std::fmt::Display| StartError::Refused(e.to_string());
    let (grpc_signer, grpc_policy) = config.grpc_signer().map_err(|e| refused(&e))?;
    let signer = signer.as_deref().unwrap_or(grpc_signer);
    let policy = config.signers.get(signer).ok_or_else(|| {
        StartError::Refused(format!(
            "[bundle_endpoint] signer = {signer:?} is not a configured signer"
        ))
    })?;
    let trust_domain = policy.trust_domain.clone();
    let ca = cas.for_signer(signer).clone();
    // One JWT key set, for the [grpc] signer's trust domain only.
    let jwt = jwt.filter(|_| grpc_policy.trust_domain == trust_domain);
    let mut refresh_hint = refresh_hint_for(config.rotation.propagation_seconds);
    if jwt.is_some() {
        refresh_hint =
            refresh_hint.min(refresh_hint_for(i64::from(config.jwt.propagation_seconds)));
    }
    let keys = match profile {
        EndpointProfile::HttpsWeb {
            cert_file,
            key_file,
        } => {
            let mut files = ServingFiles::new(cert_file, key_file);
            let first = files
                .load_if_changed()
                .map_err(|e| failed("[bundle_endpoint] cert_file / key_file", e))?
                .ok_or_else(|| {
                    StartError::Refused("[bundle_endpoint]: the files were read twice".into())
                })?;
            let keys = ServingKeys::new(first);
            let watched = Arc::clone(&keys);
            rt.spawn(
                Stage::Support,
                "bundle endpoint certificate files",
                |stop| files.watch(watched, tls::FILES_POLL, stop),
            );
            keys
        }
        EndpointProfile::HttpsSpiffe { spiffe_id } => {
            if trust_domain_of(spiffe_id) != Some(trust_domain.as_str()) {
                return Err(StartError::Refused(format!(
                    "[bundle_endpoint] spiffe_id = {spiffe_id:?} is not in the trust domain \
                     {trust_domain:?} of signer {signer:?}, whose CA would issue it"
                )));
            }
            let identity = ServingIdentity {
                spiffe_id: spiffe_id.clone(),
                dns_names: vec![],
                lifetime: DEFAULT_LIFETIME,
            };
            let clock = Arc::clone(rt.clock());
            let cert = identity
                .issue(&ca.current().ca, clock())
                .map_err(|e| failed("[bundle_endpoint]: issuing the endpoint's SVID", e))?;
            let keys = ServingKeys::new(
                tls::certified_key(&cert.chain_der, &cert.key_pkcs8_der)
                    .map_err(|e| failed("[bundle_endpoint]: the endpoint's SVID", e))?,
            );
            let (current, follow) = watch::channel(Arc::new(cert));
            let ledger = Some(ServingLedger {
                ledger: rt.ledger(),
                signer: signer.to_owned(),
            });
            let renewed = ca.clone();
            rt.spawn(Stage::Support, "bundle endpoint SVID", |stop| {
                serving_cert::run(identity, renewed, clock, current, ledger, stop)
            });
            // Ends with the renewal task (its sender).
            let swapped = Arc::clone(&keys);
            rt.spawn(Stage::Support, "bundle endpoint SVID swap", |_stop| {
                tls::follow_serving_cert(follow, swapped)
            });
            keys
        }
    };
    let server_tls =
        tls::http1_server_config(keys).map_err(|e| failed("[bundle_endpoint]: TLS", e))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| StartError::Listen {
            what: "[bundle_endpoint] listen",
            addr: *listen,
            error,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| failed("[bundle_endpoint] listen", e))?;
    info!(%addr, trust_domain, profile = profile.name(), "SPIFFE bundle endpoint listening");
    let source = BundleSource::new(ca, jwt.cloned(), refresh_hint);
    let metrics = rt
        .metrics()
        .register_component("bundle_endpoint", BundleEndpointMetrics::register);
    let ready = rt.init_handle("bundle endpoint");
    ready.set(true);
    rt.spawn(
        Stage::Serve,
        "SPIFFE bundle endpoint",
        move |stop| async move {
            endpoint::serve(
                listener,
                server_tls,
                source,
                metrics,
                OidcLimits::default(),
                stop,
            )
            .await;
            ready.set(false);
        },
    );
    Ok(Some(Running { addr, trust_domain }))
}

fn failed(
    context: &'static str,
    error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> StartError {
    StartError::Failed {
        context,
        error: error.into(),
    }
}
