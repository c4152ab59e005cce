//! Envoy's Secret Discovery Service (`envoy.service.secret.v3.SecretDiscoveryService`) beside
//! the SPIFFE Workload API, on its Unix socket: `StreamSecrets` (state of the world),
//! `DeltaSecrets` (incremental) and `FetchSecrets` (one answer).
//!
//! # Resources
//!
//! Every resource is an `envoy.extensions.transport_sockets.tls.v3.Secret`:
//!
//! | Name | Secret |
//! | --- | --- |
//! | `[workload_api] sds_certificate_name` (`default`), or the caller's SPIFFE ID | `tls_certificate`: a fresh X.509-SVID chain and its PKCS#8 key |
//! | `[workload_api] sds_validation_context_name` (`ROOTCA`), or `spiffe://<its trust domain>` | `validation_context`: the caller's trust domain's anchors (`trusted_ca`) |
//! | `spiffe://<federated trust domain>` | `validation_context`: that trust domain's X.509 authorities ([`SdsService::with_federated`], from [`FederatedBundles`]) |
//!
//! The SVID is issued through the Workload API's path (`Api::issue_for_key`: the same policy,
//! ledger records with source `workload_api`), only on a stream that asks for a certificate,
//! and again before its beginRefreshAt and whenever the CA changes. A request naming no
//! resource gets them all, under SPIRE's names (the SPIFFE ID, `spiffe://<trust domain>`).
//!
//! # The protocol
//!
//! * State of the world: every answer carries all the requested resources, a `version_info`
//!   (a per-stream counter) and a nonce. A request whose `response_nonce` is not the last one
//!   sent is stale and ignored; one with the last nonce is an ACK, or a NACK when it carries
//!   `error_detail`: logged, and the same content is not sent again (the next change is).
//!   Changing `resource_names` gets an answer at once.
//! * Delta: each resource has its own version (a digest of its content); an answer carries
//!   only what the client lacks, and `removed_resources` for names that do not exist (or no
//!   longer do, such as a federated trust domain dropped). `initial_resource_versions` is
//!   honoured. ACK/NACK as above, matched by nonce.
//! * A name podca does not serve is left out of a state-of-the-world answer (the stream stays
//!   up, the other resources keep flowing); delta reports it in `removed_resources`. SPIRE
//!   instead ends the stream with INVALID_ARGUMENT naming the missing names: an Envoy
//!   listener with one misspelt secret would lose its working ones on every retry.
//! * A `type_url` other than the `Secret` type ends the stream with INVALID_ARGUMENT.
//!
//! Callers are identified as the Workload API's are (peer credentials on the socket in
//! `podca dev`), without its `workload.spiffe.io` header, which Envoy does not send (SPIRE
//! does not ask it on SDS either). Streams count against `[grpc] max_open_streams` with the
//! Workload API's, and calls against the per-identity rate limit.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use podca_authority::config::WorkloadApiConfig;
use podca_authority::trust::CaSnapshot;
use podca_proto::envoy_api::envoy::config::core::v3::{DataSource, data_source};
use podca_proto::envoy_api::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use podca_proto::envoy_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use podca_proto::envoy_api::envoy::service::secret::v3::secret_discovery_service_server::SecretDiscoveryService;
use podca_proto::prost::Message;
use podca_signer::SubjectKey;
use rcgen::PublicKeyData;
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::auth::Identity;
use super::core::{Api, IssuedVia};
use super::errors::ApiError;
use super::federation::{BundleMap, FederatedBundles};
use super::observe::observed;
use super::podca_service::{audit_refusal, credentials_of, peer_of, record_caller};

/// `Service/Method` of each RPC: the `method` label of the gRPC metrics.
pub const STREAM_SECRETS: &str = "SecretDiscoveryService/StreamSecrets";
pub const DELTA_SECRETS: &str = "SecretDiscoveryService/DeltaSecrets";
pub const FETCH_SECRETS: &str = "SecretDiscoveryService/FetchSecrets";

/// The one resource type SDS serves.
pub const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// The resource names `[workload_api]` gives the caller's certificate and trust anchors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdsNames {
    pub certificate: String,
    pub validation_context: String,
}

/// `[workload_api]` SDS names that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SdsConfigError {
    #[error("[workload_api] {key} must not be empty")]
    Empty { key: &'static str },
    #[error(
        "[workload_api] {key} = {name:?}: names starting with spiffe:// are trust domains' \
         validation contexts"
    )]
    TrustDomainName { key: &'static str, name: String },
    #[error(
        "[workload_api] sds_certificate_name and sds_validation_context_name are both {0:?}; \
         they must differ"
    )]
    Same(String),
}

impl SdsNames {
    /// The names `[workload_api]` sets, or `None` with `sds = false`.
    pub fn from_config(config: &WorkloadApiConfig) -> Result<Option<Self>, SdsConfigError> {
        if !config.sds {
            return Ok(None);
        }
        let check = |key: &'static str, name: &str| {
            if name.is_empty() {
                Err(SdsConfigError::Empty { key })
            } else if name.starts_with("spiffe://") {
                Err(SdsConfigError::TrustDomainName {
                    key,
                    name: name.to_owned(),
                })
            } else {
                Ok(name.to_owned())
            }
        };
        let certificate = check("sds_certificate_name", &config.sds_certificate_name)?;
        let validation_context = check(
            "sds_validation_context_name",
            &config.sds_validation_context_name,
        )?;
        if certificate == validation_context {
            return Err(SdsConfigError::Same(certificate));
        }
        Ok(Some(SdsNames {
            certificate,
            validation_context,
        }))
    }
}

/// `envoy.service.secret.v3.SecretDiscoveryService`.
#[derive(Debug, Clone)]
pub struct SdsService {
    api: Arc<Api>,
    names: Arc<SdsNames>,
    federated: Option<FederatedBundles>,
}

impl SdsService {
    pub fn new(api: Arc<Api>, names: SdsNames) -> Self {
        SdsService {
            api,
            names: Arc::new(names),
            federated: None,
        }
    }

    /// Serves the federated trust domains' validation contexts from `bundles` (every foreign
    /// trust domain in force), pushed again on every change.
    pub fn with_federated(mut self, bundles: FederatedBundles) -> Self {
        self.federated = Some(bundles);
        self
    }

    /// Who is calling `method`; a caller refused before it is identified is audited.
    async fn caller<T>(&self, request: &Request<T>, method: &str) -> Result<Identity, ApiError> {
        let peer = peer_of(request);
        let identified = match credentials_of(request) {
            Ok(credentials) => self.api.identify(&peer, &credentials).await,
            Err(e) => Err(e),
        };
        let identity = identified.inspect_err(|e| audit_refusal(method, &peer, e))?;
        record_caller(&identity);
        self.api.check_rate(&identity)?;
        Ok(identity)
    }

    /// The state every answer to `identity` is built from.
    fn session(&self, identity: Identity) -> Result<Session, ApiError> {
        let trust_domain = self.api.trust_domain_for("", &identity.namespace)?;
        let ca = self.api.ca_for("", &identity.namespace).subscribe();
        Ok(Session {
            api: Arc::clone(&self.api),
            names: Arc::clone(&self.names),
            spiffe_id: format!(
                "spiffe://{trust_domain}/ns/{}/sa/{}",
                identity.namespace, identity.service_account
            ),
            trust_domain,
            identity,
            ca,
            federated: self.federated.as_ref().map(FederatedBundles::subscribe),
            federates_with: self.api.signer("")?.1.federates_with.clone(),
            svid: None,
        })
    }
}

/// A caller's SVID and key (the key never reaches a log or Debug output).
struct Svid {
    chain_pem: String,
    key_pem: String,
    begin_refresh_at: OffsetDateTime,
}

impl std::fmt::Debug for Svid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Svid")
            .field("begin_refresh_at", &self.begin_refresh_at)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// One caller's view: its identity, its CA, the federated anchors and its SVID when issued.
struct Session {
    api: Arc<Api>,
    names: Arc<SdsNames>,
    identity: Identity,
    spiffe_id: String,
    trust_domain: String,
    ca: watch::Receiver<Arc<CaSnapshot>>,
    federated: Option<watch::Receiver<Arc<BundleMap>>>,
    /// The foreign trust domains the caller's signer lists (`federates_with`): the only
    /// federated validation contexts it gets.
    federates_with: Vec<String>,
    svid: Option<Svid>,
}

/// Which resources a request asks for: named ones, or (no names) all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    All,
    Named(BTreeSet<String>),
}

impl Wanted {
    fn of(names: &[String]) -> Self {
        let named: BTreeSet<String> = names.iter().filter(|n| !n.is_empty()).cloned().collect();
        if named.is_empty() {
            Wanted::All
        } else {
            Wanted::Named(named)
        }
    }
}

/// One resource as sent: its name, content digest (the delta version) and encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Built {
    name: String,
    version: String,
    any: prost_types::Any,
}

impl Session {
    fn is_certificate(&self, name: &str) -> bool {
        name == self.names.certificate || name == self.spiffe_id
    }

    fn wants_certificate(&self, wanted: &Wanted) -> bool {
        match wanted {
            Wanted::All => true,
            Wanted::Named(names) => names.iter().any(|n| self.is_certificate(n)),
        }
    }

    /// Issues a fresh SVID now (policy, ledger: the Workload API's path).
    async fn renew(&mut self) -> Result<(), ApiError> {
        let snapshot = Arc::clone(&self.ca.borrow_and_update());
        let (key_pem, subject) = tokio::task::spawn_blocking(|| {
            let key_pair = rcgen::KeyPair::generate()
                .map_err(|e| ApiError::Internal(format!("generating the SVID key: {e}")))?;
            let subject = SubjectKey::from_spki_der(&key_pair.subject_public_key_info())
                .map_err(|e| ApiError::Internal(format!("the generated key: {e}")))?;
            Ok::<_, ApiError>((key_pair.serialize_pem(), subject))
        })
        .await
        .map_err(|e| ApiError::Internal(format!("key generation task failed: {e}")))??;
        let issued = self
            .api
            .issue_for_key(&self.identity, subject, snapshot, IssuedVia::WorkloadApi)
            .await?;
        self.spiffe_id = issued.certificate.spiffe_id.clone();
        self.svid = Some(Svid {
            chain_pem: issued.certificate.chain_pem,
            key_pem,
            begin_refresh_at: issued.certificate.validity.begin_refresh_at,
        });
        Ok(())
    }

    /// Makes sure a certificate is at hand if `wanted` asks for one.
    async fn prepare(&mut self, wanted: &Wanted) -> Result<(), ApiError> {
        if self.svid.is_none() && self.wants_certificate(wanted) {
            self.renew().await?;
        }
        Ok(())
    }

    /// The resource named `name`, if this caller has one by that name.
    fn resource(&self, name: &str) -> Option<Secret> {
        let secret = |kind| Secret {
            name: name.to_owned(),
            r#type: Some(kind),
        };
        if self.is_certificate(name) {
            let svid = self.svid.as_ref()?;
            return Some(secret(secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: Some(inline(svid.chain_pem.as_bytes())),
                private_key: Some(inline(svid.key_pem.as_bytes())),
                ..TlsCertificate::default()
            })));
        }
        let anchors = if name == self.names.validation_context
            || name.strip_prefix("spiffe://") == Some(self.trust_domain.as_str())
        {
            self.ca.borrow().anchors_pem.clone()
        } else {
            let trust_domain = name.strip_prefix("spiffe://")?;
            if !self.federates_with.iter().any(|td| td == trust_domain) {
                return None;
            }
            federated_pem(&self.federated.as_ref()?.borrow(), trust_domain)?
        };
        Some(secret(secret::Type::ValidationContext(
            CertificateValidationContext {
                trusted_ca: Some(inline(anchors.as_bytes())),
                ..CertificateValidationContext::default()
            },
        )))
    }

    /// Every name this caller could ask for now, under SPIRE's names.
    fn all_names(&self) -> Vec<String> {
        let mut names = vec![
            self.spiffe_id.clone(),
            format!("spiffe://{}", self.trust_domain),
        ];
        if let Some(federated) = &self.federated {
            let allowed = |td: &&String| self.federates_with.contains(td);
            let in_force = federated.borrow();
            names.extend(
                in_force
                    .keys()
                    .filter(allowed)
                    .map(|td| format!("spiffe://{td}")),
            );
        }
        names
    }

    /// The resources `wanted` names that exist, in name order; the names that do not.
    fn build(&self, wanted: &Wanted) -> (Vec<Built>, Vec<String>) {
        let names = match wanted {
            Wanted::All => self.all_names().into_iter().collect::<BTreeSet<_>>(),
            Wanted::Named(names) => names.clone(),
        };
        let mut built = Vec::new();
        let mut missing = Vec::new();
        for name in names {
            match self.resource(&name) {
                Some(secret) => {
                    let value = secret.encode_to_vec();
                    built.push(Built {
                        version: digest(&value),
                        any: prost_types::Any {
                            type_url: SECRET_TYPE_URL.to_owned(),
                            value,
                        },
                        name,
                    });
                }
                None => missing.push(name),
            }
        }
        (built, missing)
    }

    /// Waits for what changes the answer: the CA, the federated anchors, the SVID's refresh
    /// time. `None`: the server is stopping or the source is gone.
    async fn changed(&mut self) -> Option<Change> {
        let refresh = self
            .svid
            .as_ref()
            .map(|svid| svid.begin_refresh_at - self.api.now());
        let sleep = async move {
            match refresh {
                Some(wait) => tokio::time::sleep(wait.try_into().unwrap_or_default()).await,
                None => std::future::pending().await,
            }
        };
        let source = self.federated.as_mut();
        let federated = async move {
            match source {
                Some(source) => source.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let ca = &mut self.ca;
        tokio::select! {
            changed = ca.changed() => changed.is_ok().then_some(Change::Ca),
            () = sleep => Some(Change::Refresh),
            alive = federated => alive.then_some(Change::Federated),
        }
    }

    /// Applies `change`: a new SVID when the CA changed or the old one is due.
    async fn apply(&mut self, change: Change) -> Result<(), ApiError> {
        match change {
            Change::Ca | Change::Refresh if self.svid.is_some() => self.renew().await,
            Change::Ca | Change::Refresh | Change::Federated => Ok(()),
        }
    }
}

/// What woke a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Ca,
    Refresh,
    Federated,
}

/// A foreign trust domain's X.509 authorities as PEM (`None`: not federated, or no X.509
/// authority in its bundle).
fn federated_pem(bundles: &BundleMap, trust_domain: &str) -> Option<String> {
    let bundle = bundles.get(trust_domain)?;
    let authorities = &bundle.bundle.x509_authorities;
    (!authorities.is_empty()).then(|| authorities.iter().map(|ca| ca.pem()).collect())
}

fn inline(bytes: &[u8]) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(bytes.to_vec())),
        ..DataSource::default()
    }
}

/// The first 8 bytes of the SHA-256 of `bytes`, in hex: a resource's delta version.
fn digest(bytes: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes).as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn check_type(type_url: &str) -> Result<(), Status> {
    if type_url.is_empty() || type_url == SECRET_TYPE_URL {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "SDS serves only {SECRET_TYPE_URL}; the request asks for {type_url:?}"
        )))
    }
}

/// What the client said of the last answer.
fn log_reply(method: &str, identity: &Identity, version: &str, error: Option<&str>) {
    match error {
        // Envoy's own message (why it could not apply the secret); never secret material.
        Some(message) => tracing::warn!(
            method,
            identity = %identity.key(),
            version,
            error = message,
            "Envoy rejected the secrets sent (NACK)"
        ),
        None => tracing::debug!(method, identity = %identity.key(), version, "secrets ACKed"),
    }
}

type SotwStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

/// A state-of-the-world stream until the client, the server or a failure ends it.
async fn run_sotw(
    mut session: Session,
    mut requests: Streaming<DiscoveryRequest>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) -> Result<(), Status> {
    let mut shutdown = session.api.shutdown_signal();
    let stopping = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopping);
    let mut wanted: Option<Wanted> = None;
    let mut last_nonce: Option<String> = None;
    let mut last_sent: Option<Vec<Built>> = None;
    let mut version = 0u64;
    loop {
        let mut force = false;
        tokio::select! {
            message = requests.message() => {
                let Ok(Some(request)) = message else { return Ok(()) };
                check_type(&request.type_url)?;
                if let Some(nonce) = &last_nonce {
                    if request.response_nonce != *nonce {
                        tracing::debug!(nonce = request.response_nonce, expected = nonce, "stale SDS request ignored");
                        continue;
                    }
                    let error = request.error_detail.as_ref().map(|e| e.message.as_str());
                    log_reply(STREAM_SECRETS, &session.identity, &request.version_info, error);
                }
                let asked = Wanted::of(&request.resource_names);
                if wanted.as_ref() != Some(&asked) {
                    wanted = Some(asked);
                    force = true;
                }
            }
            change = session.changed() => {
                let Some(change) = change else { return Ok(()) };
                session.apply(change).await?;
            }
            () = tx.closed() => return Ok(()),
            () = &mut stopping => return Ok(()),
        }
        let Some(wanted) = &wanted else { continue };
        session.prepare(wanted).await?;
        let (built, missing) = session.build(wanted);
        if !missing.is_empty() && force {
            tracing::info!(identity = %session.identity.key(), ?missing, "SDS names podca does not serve left out");
        }
        if !force && last_sent.as_ref() == Some(&built) {
            continue;
        }
        version += 1;
        let nonce = format!("{version}");
        let response = DiscoveryResponse {
            version_info: version.to_string(),
            resources: built.iter().map(|b| b.any.clone()).collect(),
            type_url: SECRET_TYPE_URL.to_owned(),
            nonce: nonce.clone(),
            ..DiscoveryResponse::default()
        };
        if tx.send(Ok(response)).await.is_err() {
            return Ok(());
        }
        last_nonce = Some(nonce);
        last_sent = Some(built);
    }
}

/// The client's state on a delta stream.
#[derive(Debug, Default)]
struct DeltaState {
    wildcard: bool,
    subscribed: BTreeSet<String>,
    /// Name → the version the client holds; `None`: told it does not exist.
    known: BTreeMap<String, Option<String>>,
    last_nonce: Option<String>,
    nonces: u64,
    started: bool,
}

impl DeltaState {
    /// Takes a request in; `Ok(false)`: a stale (N)ACK, ignored.
    fn receive(&mut self, request: &DeltaDiscoveryRequest, identity: &Identity) -> bool {
        if !self.started {
            self.started = true;
            self.wildcard = request.resource_names_subscribe.is_empty();
            for (name, version) in &request.initial_resource_versions {
                self.known.insert(name.clone(), Some(version.clone()));
            }
        }
        for name in &request.resource_names_unsubscribe {
            self.subscribed.remove(name);
            self.known.remove(name);
        }
        for name in request
            .resource_names_subscribe
            .iter()
            .filter(|n| !n.is_empty())
        {
            self.subscribed.insert(name.clone());
            // An explicit subscription is always answered, whatever the client may hold.
            if !request.initial_resource_versions.contains_key(name) {
                self.known.remove(name);
            }
        }
        if request.response_nonce.is_empty() {
            return true;
        }
        if self.last_nonce.as_deref() != Some(request.response_nonce.as_str()) {
            tracing::debug!(
                nonce = request.response_nonce,
                "stale SDS delta (N)ACK ignored"
            );
            return false;
        }
        let error = request.error_detail.as_ref().map(|e| e.message.as_str());
        log_reply(DELTA_SECRETS, identity, &request.response_nonce, error);
        true
    }

    fn wanted(&self) -> Wanted {
        if self.wildcard && self.subscribed.is_empty() {
            Wanted::All
        } else {
            Wanted::Named(self.subscribed.clone())
        }
    }

    /// The answer that brings the client up to date, if it lacks anything.
    fn answer(
        &mut self,
        built: Vec<Built>,
        missing: Vec<String>,
    ) -> Option<DeltaDiscoveryResponse> {
        let mut resources = Vec::new();
        let mut removed = Vec::new();
        let present: BTreeSet<String> = built.iter().map(|b| b.name.clone()).collect();
        for b in built {
            let held = self.known.get(&b.name).cloned().flatten();
            if held.as_deref() != Some(b.version.as_str()) {
                self.known.insert(b.name.clone(), Some(b.version.clone()));
                resources.push(Resource {
                    name: b.name,
                    version: b.version,
                    resource: Some(b.any),
                    ..Resource::default()
                });
            }
        }
        for name in missing {
            if self.known.get(&name) != Some(&None) {
                self.known.insert(name.clone(), None);
                removed.push(name);
            }
        }
        // Under a wildcard, a resource that went away (a federated trust domain dropped).
        let gone: Vec<String> = self
            .known
            .iter()
            .filter(|(name, held)| held.is_some() && !present.contains(*name))
            .filter(|(name, _)| self.wildcard && !self.subscribed.contains(*name))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            self.known.remove(&name);
            removed.push(name);
        }
        if resources.is_empty() && removed.is_empty() {
            return None;
        }
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        self.last_nonce = Some(nonce.clone());
        Some(DeltaDiscoveryResponse {
            system_version_info: nonce.clone(),
            resources,
            type_url: SECRET_TYPE_URL.to_owned(),
            removed_resources: removed,
            nonce,
            ..DeltaDiscoveryResponse::default()
        })
    }
}

/// A delta stream until the client, the server or a failure ends it.
async fn run_delta(
    mut session: Session,
    mut requests: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) -> Result<(), Status> {
    let mut shutdown = session.api.shutdown_signal();
    let stopping = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopping);
    let mut state = DeltaState::default();
    loop {
        tokio::select! {
            message = requests.message() => {
                let Ok(Some(request)) = message else { return Ok(()) };
                check_type(&request.type_url)?;
                if !state.receive(&request, &session.identity) {
                    continue;
                }
            }
            change = session.changed(), if state.started => {
                let Some(change) = change else { return Ok(()) };
                session.apply(change).await?;
            }
            () = tx.closed() => return Ok(()),
            () = &mut stopping => return Ok(()),
        }
        let wanted = state.wanted();
        session.prepare(&wanted).await?;
        let (built, missing) = session.build(&wanted);
        if let Some(response) = state.answer(built, missing)
            && tx.send(Ok(response)).await.is_err()
        {
            return Ok(());
        }
    }
}

/// Runs a stream's task, ending the stream with its error status if it fails.
fn spawn_stream<T: Send + 'static>(
    permit: tokio::sync::OwnedSemaphorePermit,
    tx: mpsc::Sender<Result<T, Status>>,
    run: impl Future<Output = Result<(), Status>> + Send + 'static,
) {
    tokio::spawn(async move {
        let _permit = permit;
        if let Err(status) = run.await {
            tracing::warn!(code = ?status.code(), message = status.message(), "SDS stream ended");
            let _ = tx.send(Err(status)).await;
        }
    });
}

#[tonic::async_trait]
impl SecretDiscoveryService for SdsService {
    type StreamSecretsStream = SotwStream;

    #[tracing::instrument(skip_all, fields(rpc = "StreamSecrets", caller = tracing::field::Empty,
        outcome = tracing::field::Empty, reason = tracing::field::Empty))]
    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), STREAM_SECRETS, peer, async move {
            let identity = self.caller(&request, STREAM_SECRETS).await?;
            let session = self.session(identity)?;
            let permit = self.api.open_stream()?;
            let (tx, rx) = mpsc::channel(2);
            let run = run_sotw(session, request.into_inner(), tx.clone());
            spawn_stream(permit, tx, run);
            let stream: Self::StreamSecretsStream = Box::pin(ReceiverStream::new(rx));
            Ok(Response::new(stream))
        })
        .await
    }

    type DeltaSecretsStream = DeltaStream;

    #[tracing::instrument(skip_all, fields(rpc = "DeltaSecrets", caller = tracing::field::Empty,
        outcome = tracing::field::Empty, reason = tracing::field::Empty))]
    async fn delta_secrets(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), DELTA_SECRETS, peer, async move {
            let identity = self.caller(&request, DELTA_SECRETS).await?;
            let session = self.session(identity)?;
            let permit = self.api.open_stream()?;
            let (tx, rx) = mpsc::channel(2);
            let run = run_delta(session, request.into_inner(), tx.clone());
            spawn_stream(permit, tx, run);
            let stream: Self::DeltaSecretsStream = Box::pin(ReceiverStream::new(rx));
            Ok(Response::new(stream))
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(rpc = "FetchSecrets", caller = tracing::field::Empty,
        outcome = tracing::field::Empty, reason = tracing::field::Empty))]
    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let peer = peer_of(&request);
        let type_url = request.get_ref().type_url.clone();
        check_type(&type_url)?;
        observed(self.api.metrics(), FETCH_SECRETS, peer, async move {
            let identity = self.caller(&request, FETCH_SECRETS).await?;
            let mut session = self.session(identity)?;
            let wanted = Wanted::of(&request.get_ref().resource_names);
            session.prepare(&wanted).await?;
            let (built, _missing) = session.build(&wanted);
            let all: Vec<u8> = built.iter().flat_map(|b| b.version.bytes()).collect();
            Ok(Response::new(DiscoveryResponse {
                version_info: digest(&all),
                resources: built.into_iter().map(|b| b.any).collect(),
                type_url: SECRET_TYPE_URL.to_owned(),
                ..DiscoveryResponse::default()
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(certificate: &str, validation_context: &str) -> WorkloadApiConfig {
        WorkloadApiConfig {
            sds_certificate_name: certificate.to_owned(),
            sds_validation_context_name: validation_context.to_owned(),
            ..WorkloadApiConfig::default()
        }
    }

    #[test]
    fn names_default_to_spires_and_refuse_what_cannot_work() {
        assert_eq!(
            SdsNames::from_config(&WorkloadApiConfig::default()),
            Ok(Some(SdsNames {
                certificate: "default".into(),
                validation_context: "ROOTCA".into(),
            }))
        );
        let off = WorkloadApiConfig {
            sds: false,
            ..WorkloadApiConfig::default()
        };
        assert_eq!(SdsNames::from_config(&off), Ok(None));
        assert_eq!(
            SdsNames::from_config(&config("", "ROOTCA")),
            Err(SdsConfigError::Empty {
                key: "sds_certificate_name"
            })
        );
        assert_eq!(
            SdsNames::from_config(&config("default", "spiffe://example.org")),
            Err(SdsConfigError::TrustDomainName {
                key: "sds_validation_context_name",
                name: "spiffe://example.org".into()
            })
        );
        assert_eq!(
            SdsNames::from_config(&config("same", "same")),
            Err(SdsConfigError::Same("same".into()))
        );
    }

    /// A self-signed CA certificate (rcgen), as a foreign trust domain's authority.
    fn foreign_ca() -> podca_signer::CaCertificate {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        podca_signer::CaCertificate::from_der(cert.der()).unwrap()
    }

    #[test]
    fn federated_validation_contexts_carry_the_foreign_authorities() {
        let ca = foreign_ca();
        let bundles = FederatedBundles::new(["home.test".to_owned()]);
        bundles
            .accept(crate::federation::ForeignBundle {
                trust_domain: "away.test".into(),
                bundle: podca_signer::spiffe_bundle::SpiffeBundle {
                    x509_authorities: vec![ca.clone()],
                    jwt_authorities: vec![],
                    sequence: Some(1),
                    refresh_hint: None,
                },
                accepted_at: OffsetDateTime::UNIX_EPOCH,
                from_initial_bundle: false,
            })
            .unwrap();
        let map = bundles.current();
        assert_eq!(federated_pem(&map, "away.test"), Some(ca.pem()));
        assert_eq!(federated_pem(&map, "home.test"), None);
        assert_eq!(federated_pem(&map, "spiffe://away.test"), None);
    }

    #[test]
    fn the_svid_key_stays_out_of_debug_output() {
        let svid = Svid {
            chain_pem: "chain".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\nTOPSECRET\n".into(),
            begin_refresh_at: OffsetDateTime::UNIX_EPOCH,
        };
        let shown = format!("{svid:?}");
        assert!(!shown.contains("TOPSECRET"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    fn built(name: &str, version: &str) -> Built {
        Built {
            name: name.into(),
            version: version.into(),
            any: prost_types::Any {
                type_url: SECRET_TYPE_URL.into(),
                value: version.as_bytes().to_vec(),
            },
        }
    }

    #[test]
    fn delta_sends_only_what_the_client_lacks() {
        let mut state = DeltaState {
            started: true,
            ..DeltaState::default()
        };
        state.subscribed.insert("default".into());
        state.subscribed.insert("nope".into());
        let first = state
            .answer(vec![built("default", "v1")], vec!["nope".into()])
            .expect("the first answer");
        assert_eq!(first.resources.len(), 1);
        assert_eq!(first.removed_resources, ["nope"]);
        assert_eq!(first.nonce, "1");
        // Nothing changed: nothing to say (not even the unknown name again).
        assert!(
            state
                .answer(vec![built("default", "v1")], vec!["nope".into()])
                .is_none()
        );
        let second = state
            .answer(vec![built("default", "v2")], vec!["nope".into()])
            .expect("a renewal");
        assert_eq!(second.resources[0].version, "v2");
        assert!(second.removed_resources.is_empty());
        assert_eq!(second.nonce, "2");
    }

    #[test]
    fn a_stale_delta_nonce_is_ignored_and_initial_versions_are_honoured() {
        let identity = Identity::dev("ns", "sa");
        let mut state = DeltaState::default();
        let first = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["ROOTCA".into()],
            initial_resource_versions: [("ROOTCA".to_owned(), "v1".to_owned())].into(),
            ..DeltaDiscoveryRequest::default()
        };
        assert!(state.receive(&first, &identity));
        // The client already holds v1: nothing to send.
        assert!(state.answer(vec![built("ROOTCA", "v1")], vec![]).is_none());
        let response = state
            .answer(vec![built("ROOTCA", "v2")], vec![])
            .expect("v2");
        let stale = DeltaDiscoveryRequest {
            response_nonce: "not-sent".into(),
            ..DeltaDiscoveryRequest::default()
        };
        assert!(!state.receive(&stale, &identity));
        let ack = DeltaDiscoveryRequest {
            response_nonce: response.nonce,
            ..DeltaDiscoveryRequest::default()
        };
        assert!(state.receive(&ack, &identity));
    }
}
