//! The SPIFFE Workload API (X.509-SVID profile) on the Unix socket.
//!
//! `FetchX509SVID` generates a fresh P-256 key for the caller, issues an SVID for its identity,
//! and streams a new one before the old one's beginRefreshAt and on every CA swap.
//! `FetchX509Bundles` streams the trust bundle.
//!
//! The JWT profile ([`crate::jwt`]): `FetchJWTSVID` signs a JWT-SVID for the caller's identity
//! (`spiffe_id` may only name it), `FetchJWTBundles` streams the JWKS and pushes it again on
//! every key-set change (a new prepared key reaches every open stream before it signs), and
//! `ValidateJWTSVID` checks a token against the published keys. With `[jwt] enabled = false`
//! they answer UNIMPLEMENTED.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use podca_proto::workload::spiffe_workload_api_server::SpiffeWorkloadApi;
use podca_proto::workload::{
    JwtBundlesRequest, JwtBundlesResponse, Jwtsvid, JwtsvidRequest, JwtsvidResponse,
    ValidateJwtsvidRequest, ValidateJwtsvidResponse, X509BundlesRequest, X509BundlesResponse,
    X509svid, X509svidRequest, X509svidResponse,
};
use podca_signer::SubjectKey;
use rcgen::PublicKeyData;
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::auth::Identity;
use super::core::{Api, IssuedVia};
use super::errors::ApiError;
use super::jwt::{JwtAsk, JwtService, MaybeJwt, claims_struct};
use super::ledger::{WorkloadMethod, audit_workload_refusal};
use super::observe::observed;
use super::podca_service::{credentials_of, peer_of, record_caller};

/// `Service/Method` of each RPC: the `method` label of the gRPC metrics.
pub const FETCH_X509_SVID: &str = "SpiffeWorkloadAPI/FetchX509SVID";
pub const FETCH_X509_BUNDLES: &str = "SpiffeWorkloadAPI/FetchX509Bundles";
pub const FETCH_JWT_SVID: &str = "SpiffeWorkloadAPI/FetchJWTSVID";
pub const FETCH_JWT_BUNDLES: &str = "SpiffeWorkloadAPI/FetchJWTBundles";
pub const VALIDATE_JWT_SVID: &str = "SpiffeWorkloadAPI/ValidateJWTSVID";
use podca_authority::trust::CaSnapshot;

use crate::federation::{BundleMap, FederatedBundles, ForeignBundle};

/// `SpiffeWorkloadAPI`.
#[derive(Debug, Clone)]
pub struct WorkloadService {
    api: Arc<Api>,
    jwt: MaybeJwt,
    /// Foreign trust domains' bundles (`[[federation]]`); none: no federation.
    federated: FederatedBundles,
}

impl WorkloadService {
    pub fn new(api: Arc<Api>) -> Self {
        WorkloadService {
            api,
            jwt: None,
            federated: FederatedBundles::new([]),
        }
    }

    /// Hands out the foreign bundles in force, beside the caller's own, in `federated_bundles`
    /// (FetchX509SVID) and `bundles` (FetchX509Bundles, FetchJWTBundles), and streams their
    /// changes.
    pub fn with_federated(mut self, federated: FederatedBundles) -> Self {
        self.federated = federated;
        self
    }

    /// Serves the JWT profile with `jwt`.
    pub fn with_jwt(mut self, jwt: Arc<JwtService>) -> Self {
        self.jwt = Some(jwt);
        self
    }

    fn jwt(&self) -> Result<&Arc<JwtService>, ApiError> {
        self.jwt.as_ref().ok_or(ApiError::Unimplemented(
            "JWT-SVIDs are disabled ([jwt] enabled = false)",
        ))
    }

    /// Who is calling; a caller refused before it is identified is audited.
    async fn caller<T: WorkloadMethod>(&self, request: &Request<T>) -> Result<Identity, ApiError> {
        let identity = self
            .identify(request)
            .await
            .inspect_err(|e| audit_workload_refusal(request, e))?;
        record_caller(&identity);
        self.api.check_rate(&identity)?;
        Ok(identity)
    }

    async fn identify<T>(&self, request: &Request<T>) -> Result<Identity, ApiError> {
        let header = request
            .metadata()
            .get("workload.spiffe.io")
            .and_then(|v| v.to_str().ok());
        if header != Some("true") {
            return Err(ApiError::MissingWorkloadHeader);
        }
        let credentials = credentials_of(request)?;
        self.api.identify(&peer_of(request), &credentials).await
    }
}

/// One SVID message and when to send the next.
async fn svid_response(
    api: &Api,
    identity: &Identity,
    snapshot: Arc<CaSnapshot>,
    federated: &BundleMap,
) -> Result<(X509svidResponse, OffsetDateTime), ApiError> {
    let (key_pair, subject) = tokio::task::spawn_blocking(|| {
        let key_pair = rcgen::KeyPair::generate()
            .map_err(|e| ApiError::Internal(format!("generating the SVID key: {e}")))?;
        let subject = SubjectKey::from_spki_der(&key_pair.subject_public_key_info())
            .map_err(|e| ApiError::Internal(format!("the generated key: {e}")))?;
        Ok::<_, ApiError>((key_pair, subject))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("key generation task failed: {e}")))??;
    let issued = api
        .issue_for_key(identity, subject, snapshot, IssuedVia::WorkloadApi)
        .await?;
    let chain_der: Vec<u8> =
        podca_signer::x509::certificates_from_pem(&issued.certificate.chain_pem)
            .map_err(|e| ApiError::Internal(format!("re-reading the issued chain: {e}")))?
            .concat();
    let refresh = issued.certificate.validity.begin_refresh_at;
    let response = X509svidResponse {
        svids: vec![X509svid {
            spiffe_id: issued.certificate.spiffe_id,
            x509_svid: chain_der,
            x509_svid_key: key_pair.serialize_der(),
            bundle: issued.anchors_der,
            hint: String::new(),
        }],
        crl: vec![],
        federated_bundles: foreign_x509(federated),
    };
    Ok((response, refresh))
}

/// The foreign bundles the Workload API's signer (the default one) lists in `federates_with`.
fn allowed(api: &Api, map: &BundleMap) -> BundleMap {
    match api.signer("") {
        Ok((_, policy)) => FederatedBundles::for_signer(map, &policy.federates_with),
        Err(_) => BundleMap::new(),
    }
}

/// The federated bundle of the trust domain `token`'s `sub` names, if it is a foreign one in
/// force (read before the signature is checked: it only chooses which keys check it).
fn foreign_issuer(token: &str, federated: &BundleMap) -> Option<Arc<ForeignBundle>> {
    let decoded = podca_signer::jwt::decode(token).ok()?;
    let rest = decoded.claims.sub.strip_prefix("spiffe://")?;
    let trust_domain = rest.split('/').next()?;
    federated.get(trust_domain).cloned()
}

/// The foreign trust domains' X.509 authorities, keyed `spiffe://<trust domain>`.
fn foreign_x509(federated: &BundleMap) -> HashMap<String, Vec<u8>> {
    federated
        .values()
        .map(|bundle| (bundle.spiffe_key(), bundle.x509_der()))
        .collect()
}

/// The caller's trust domain's anchors, then every foreign one's (never replacing its own: a
/// foreign bundle for one of podca's trust domains is refused before it is in force).
fn bundles_response(
    trust_domain: &str,
    snapshot: &CaSnapshot,
    federated: &BundleMap,
) -> X509BundlesResponse {
    let mut bundles = foreign_x509(federated);
    bundles.insert(format!("spiffe://{trust_domain}"), snapshot.anchors_der());
    X509BundlesResponse {
        crl: vec![],
        bundles,
    }
}

type SvidStream = Pin<Box<dyn Stream<Item = Result<X509svidResponse, Status>> + Send>>;
type BundlesStream = Pin<Box<dyn Stream<Item = Result<X509BundlesResponse, Status>> + Send>>;
type JwtBundlesStream = Pin<Box<dyn Stream<Item = Result<JwtBundlesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl SpiffeWorkloadApi for WorkloadService {
    #[tracing::instrument(skip_all, fields(rpc = "FetchJWTSVID", caller = tracing::field::Empty,
        outcome = tracing::field::Empty, reason = tracing::field::Empty))]
    async fn fetch_jwtsvid(
        &self,
        request: Request<JwtsvidRequest>,
    ) -> Result<Response<JwtsvidResponse>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), FETCH_JWT_SVID, peer, async move {
            let jwt = self.jwt()?;
            let identity = self.caller(&request).await?;
            let JwtsvidRequest {
                audience,
                spiffe_id,
            } = request.into_inner();
            let signed = jwt
                .issue(
                    &self.api,
                    JwtAsk {
                        signer: "",
                        subject: &identity,
                        caller: &identity,
                        request_name: None,
                        audiences: &audience,
                        spiffe_id: &spiffe_id,
                        lifetime: None,
                    },
                )
                .await?;
            Ok(Response::new(JwtsvidResponse {
                svids: vec![Jwtsvid {
                    spiffe_id: signed.claims.sub,
                    svid: signed.token,
                    hint: String::new(),
                }],
            }))
        })
        .await
    }

    type FetchJWTBundlesStream = JwtBundlesStream;

    #[tracing::instrument(skip_all, fields(rpc = "FetchJWTBundles", caller = tracing::field::Empty))]
    async fn fetch_jwt_bundles(
        &self,
        request: Request<JwtBundlesRequest>,
    ) -> Result<Response<Self::FetchJWTBundlesStream>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), FETCH_JWT_BUNDLES, peer, async move {
            let jwt = Arc::clone(self.jwt()?);
            self.caller(&request).await?;
            let trust_domain = self.api.trust_domain()?;
            let permit = self.api.open_stream()?;
            let mut keys = jwt.keys().subscribe();
            let mut foreign = self.federated.subscribe();
            let mut shutdown = self.api.shutdown_signal();
            let api = Arc::clone(&self.api);
            let (tx, rx) = mpsc::channel(2);
            tokio::spawn(async move {
                let _permit = permit;
                let mut last = None;
                loop {
                    let set = Arc::clone(&keys.borrow_and_update());
                    let mut message = jwt.bundles_response(&trust_domain, &set);
                    let in_force = Arc::clone(&foreign.borrow_and_update());
                    for bundle in allowed(&api, &in_force).values() {
                        let key = bundle.spiffe_key();
                        message
                            .bundles
                            .entry(key)
                            .or_insert_with(|| bundle.jwt_bundle().to_json());
                    }
                    let now: std::collections::BTreeMap<_, _> =
                        message.bundles.clone().into_iter().collect();
                    if last.as_ref() != Some(&now) {
                        last = Some(now);
                        if tx.send(Ok(message)).await.is_err() {
                            return;
                        }
                    }
                    tokio::select! {
                        changed = keys.changed() => if changed.is_err() { return },
                        changed = foreign.changed() => if changed.is_err() { return },
                        () = tx.closed() => return,
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    }
                }
            });
            let stream: Self::FetchJWTBundlesStream = Box::pin(ReceiverStream::new(rx));
            Ok(Response::new(stream))
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(rpc = "ValidateJWTSVID", caller = tracing::field::Empty))]
    async fn validate_jwtsvid(
        &self,
        request: Request<ValidateJwtsvidRequest>,
    ) -> Result<Response<ValidateJwtsvidResponse>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), VALIDATE_JWT_SVID, peer, async move {
            let jwt = self.jwt()?;
            self.caller(&request).await?;
            let ValidateJwtsvidRequest { audience, svid } = request.into_inner();
            let foreign = foreign_issuer(&svid, &allowed(&self.api, &self.federated.current()));
            let validated = match foreign {
                // A token of a federated trust domain: its bundle, its trust domain.
                Some(bundle) => jwt.validate_foreign(&self.api, &svid, &audience, &bundle)?,
                None => jwt.validate(&self.api, &svid, &audience)?,
            };
            let claims = claims_struct(&validated).map_err(ApiError::Jwt)?;
            Ok(Response::new(ValidateJwtsvidResponse {
                spiffe_id: validated.claims.sub,
                claims: Some(claims),
            }))
        })
        .await
    }

    type FetchX509SVIDStream = SvidStream;

    #[tracing::instrument(skip_all, fields(rpc = "FetchX509SVID", caller = tracing::field::Empty,
        outcome = tracing::field::Empty, reason = tracing::field::Empty))]
    async fn fetch_x509svid(
        &self,
        request: Request<X509svidRequest>,
    ) -> Result<Response<Self::FetchX509SVIDStream>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), FETCH_X509_SVID, peer, async move {
            let identity = self.caller(&request).await?;
            let permit = self.api.open_stream()?;
            let mut ca = self.api.ca_for("", &identity.namespace).subscribe();
            // The first SVID is issued before answering, so that a refusal is the call's status.
            let snapshot = Arc::clone(&ca.borrow_and_update());
            let mut foreign = self.federated.subscribe();
            let bundles = allowed(&self.api, &foreign.borrow_and_update());
            let (first, mut refresh_at) =
                svid_response(&self.api, &identity, snapshot, &bundles).await?;
            let api = Arc::clone(&self.api);
            let mut shutdown = api.shutdown_signal();
            let (tx, rx) = mpsc::channel(2);
            tokio::spawn(async move {
                let _permit = permit;
                let mut next = Some(first);
                loop {
                    if let Some(message) = next.take()
                        && tx.send(Ok(message)).await.is_err()
                    {
                        return;
                    }
                    let wait = refresh_at - api.now();
                    let sleep = tokio::time::sleep(wait.try_into().unwrap_or_default());
                    tokio::select! {
                        changed = ca.changed() => if changed.is_err() { return },
                        changed = foreign.changed() => if changed.is_err() { return },
                        () = sleep => {},
                        () = tx.closed() => return,
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    }
                    // A foreign bundle's change is sent with a fresh SVID, as SPIRE's agent does.
                    let snapshot = Arc::clone(&ca.borrow_and_update());
                    let bundles = allowed(&api, &foreign.borrow_and_update());
                    match svid_response(&api, &identity, snapshot, &bundles).await {
                        Ok((message, at)) => {
                            next = Some(message);
                            refresh_at = at;
                        }
                        Err(e) => {
                            tracing::warn!(identity = %identity.key(), error = %e, "renewing an SVID failed");
                            let _ = tx.send(Err(e.into())).await;
                            return;
                        }
                    }
                }
            });
            let stream: Self::FetchX509SVIDStream = Box::pin(ReceiverStream::new(rx));
            Ok(Response::new(stream))
        })
        .await
    }

    type FetchX509BundlesStream = BundlesStream;

    #[tracing::instrument(skip_all, fields(rpc = "FetchX509Bundles", caller = tracing::field::Empty))]
    async fn fetch_x509_bundles(
        &self,
        request: Request<X509BundlesRequest>,
    ) -> Result<Response<Self::FetchX509BundlesStream>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), FETCH_X509_BUNDLES, peer, async move {
            let caller = self.caller(&request).await?;
            // The caller's tenant's bundle, else the default signer's.
            let trust_domain = self.api.trust_domain_for("", &caller.namespace)?;
            let permit = self.api.open_stream()?;
            let mut ca = self.api.ca_for("", &caller.namespace).subscribe();
            let mut foreign = self.federated.subscribe();
            let mut shutdown = self.api.shutdown_signal();
            let api = Arc::clone(&self.api);
            let (tx, rx) = mpsc::channel(2);
            tokio::spawn(async move {
                let _permit = permit;
                let mut last = None;
                loop {
                    let snapshot = Arc::clone(&ca.borrow_and_update());
                    let bundles = allowed(&api, &foreign.borrow_and_update());
                    let message = bundles_response(&trust_domain, &snapshot, &bundles);
                    let now: std::collections::BTreeMap<_, _> =
                        message.bundles.clone().into_iter().collect();
                    if last.as_ref() != Some(&now) {
                        last = Some(now);
                        if tx.send(Ok(message)).await.is_err() {
                            return;
                        }
                    }
                    tokio::select! {
                        changed = ca.changed() => if changed.is_err() { return },
                        changed = foreign.changed() => if changed.is_err() { return },
                        () = tx.closed() => return,
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    }
                }
            });
            let stream: Self::FetchX509BundlesStream = Box::pin(ReceiverStream::new(rx));
            Ok(Response::new(stream))
        })
        .await
    }
}
