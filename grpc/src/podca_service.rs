//! The `podca.v1.PodCA` service: the gRPC edge over [`Api`].

use std::pin::Pin;
use std::sync::Arc;

use podca_proto::podca::v1::pod_ca_server::PodCa;
use podca_proto::podca::v1::{
    GetJwtBundleRequest, GetTrustBundleRequest, IssueCertificateRequest, IssueCertificateResponse,
    IssueForPodRequest, IssueJwtSvidRequest, JwtBundle, JwtSvid, TrustBundle,
};
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use super::auth::{AuthError, BearerToken, Credentials, Identity, Peer};
use super::core::{Api, IssueInput, Issued, JwtInput};
use super::errors::ApiError;
use super::observe::{code_name, observed};
use super::peer_identity::ClientCertificate;
use podca_authority::trust::CaSnapshot;

/// `Service/Method` of each RPC: the `method` label of the gRPC metrics.
pub const ISSUE_CERTIFICATE: &str = "podca.v1.PodCA/IssueCertificate";
pub const ISSUE_FOR_POD: &str = "podca.v1.PodCA/IssueForPod";
pub const GET_TRUST_BUNDLE: &str = "podca.v1.PodCA/GetTrustBundle";
pub const WATCH_TRUST_BUNDLE: &str = "podca.v1.PodCA/WatchTrustBundle";
pub const ISSUE_JWT_SVID: &str = "podca.v1.PodCA/IssueJwtSvid";
pub const GET_JWT_BUNDLE: &str = "podca.v1.PodCA/GetJwtBundle";

/// `podca.v1.PodCA`.
#[derive(Debug, Clone)]
pub struct PodCaService {
    api: Arc<Api>,
}

impl PodCaService {
    pub fn new(api: Arc<Api>) -> Self {
        PodCaService { api }
    }
}

/// Where a request came from: a Unix-socket peer (with its uid) or a TCP address.
pub fn peer_of<T>(request: &Request<T>) -> Peer {
    if let Some(info) = request.extensions().get::<UdsConnectInfo>() {
        return Peer::Unix {
            uid: info.peer_cred.map(|c| c.uid()),
        };
    }
    request.remote_addr().map_or(Peer::Unknown, Peer::Tcp)
}

/// The credentials a request carries.
pub fn credentials_of<T>(request: &Request<T>) -> Result<Credentials, ApiError> {
    let metadata = request.metadata();
    let text = |key: &str| {
        metadata
            .get(key)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let bearer = match metadata.get("authorization") {
        None => None,
        Some(value) => {
            let value = value.to_str().unwrap_or("");
            let token = value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    ApiError::Auth(AuthError::Invalid(
                        "the authorization metadata must be `Bearer <token>`".into(),
                    ))
                })?;
            Some(BearerToken::new(token))
        }
    };
    Ok(Credentials {
        bearer,
        dev_namespace: text("x-podca-namespace"),
        dev_service_account: text("x-podca-service-account"),
        client_certificate: ClientCertificate::of_request(request),
    })
}

impl PodCaService {
    /// Who is calling `rpc` (a method of `podca.v1.PodCA`); a refusal is audited.
    async fn caller<T>(&self, request: &Request<T>, rpc: &str) -> Result<Identity, ApiError> {
        let peer = peer_of(request);
        let identified = match credentials_of(request) {
            Ok(credentials) => self.api.identify(&peer, &credentials).await,
            Err(e) => Err(e),
        };
        let identity = identified
            .inspect_err(|e| audit_refusal(&format!("podca.v1.PodCA/{rpc}"), &peer, e))?;
        record_caller(&identity);
        self.api.check_rate(&identity)?;
        Ok(identity)
    }
}

/// The audit line of a caller refused before it was identified (never its token).
pub fn audit_refusal(method: &str, peer: &Peer, error: &ApiError) {
    podca_authority::ledger::audit::refused(&podca_authority::ledger::audit::Refusal {
        method: method.to_owned(),
        peer: match peer {
            Peer::Tcp(addr) => addr.to_string(),
            Peer::Unix { uid: Some(uid) } => format!("unix:uid={uid}"),
            Peer::Unix { uid: None } => "unix".into(),
            Peer::Unknown => "unknown".into(),
        },
        code: code_name(error.code()).to_owned(),
        reason: error.to_string(),
    });
}

/// Names the caller in the handler's span (its `caller` field), once it is known.
pub fn record_caller(identity: &Identity) {
    tracing::Span::current().record("caller", tracing::field::display(identity.key()));
}

fn input(request: IssueCertificateRequest) -> IssueInput {
    let IssueCertificateRequest {
        csr,
        requested_lifetime_seconds,
        user_annotations,
        signer_name,
    } = request;
    IssueInput {
        csr,
        requested_lifetime_seconds,
        user_annotations: user_annotations.into_iter().collect(),
        signer_name,
    }
}

fn timestamp(t: OffsetDateTime) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.unix_timestamp(),
        nanos: 0,
    }
}

fn response(issued: Issued) -> IssueCertificateResponse {
    let c = issued.certificate;
    IssueCertificateResponse {
        certificate_chain_pem: c.chain_pem,
        not_before: Some(timestamp(c.validity.not_before)),
        not_after: Some(timestamp(c.validity.not_after)),
        begin_refresh_at: Some(timestamp(c.validity.begin_refresh_at)),
        trust_anchors_pem: issued.anchors_pem,
        spiffe_id: c.spiffe_id,
        serial: c.serial,
    }
}

fn jwt_input(request: IssueJwtSvidRequest) -> JwtInput {
    let IssueJwtSvidRequest {
        audiences,
        requested_lifetime_seconds,
        signer_name,
        pod_namespace,
        pod_name,
    } = request;
    JwtInput {
        audiences,
        requested_lifetime_seconds,
        signer_name,
        pod_namespace,
        pod_name,
    }
}

fn jwt_response(signed: podca_signer::jwt::SignedSvid) -> JwtSvid {
    let c = signed.claims;
    let at = |t: i64| prost_types::Timestamp {
        seconds: t,
        nanos: 0,
    };
    JwtSvid {
        token: signed.token,
        spiffe_id: c.sub,
        kid: signed.kid,
        audiences: c.aud,
        issued_at: c.iat.map(at),
        expires_at: Some(at(c.exp)),
    }
}

fn bundle(signer_name: &str, snapshot: &CaSnapshot) -> TrustBundle {
    TrustBundle {
        signer_name: signer_name.to_owned(),
        trust_anchors_pem: snapshot.anchors_pem.clone(),
        generation: snapshot.generation,
    }
}

type BundleStream = Pin<Box<dyn Stream<Item = Result<TrustBundle, Status>> + Send>>;

#[tonic::async_trait]
impl PodCa for PodCaService {
    #[tracing::instrument(skip_all, fields(
        rpc = "IssueCertificate",
        signer = %request.get_ref().signer_name,
        caller = tracing::field::Empty,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
    ))]
    async fn issue_certificate(
        &self,
        request: Request<IssueCertificateRequest>,
    ) -> Result<Response<IssueCertificateResponse>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), ISSUE_CERTIFICATE, peer, async move {
            let identity = self.caller(&request, "IssueCertificate").await?;
            let issued = self
                .api
                .issue(&identity, input(request.into_inner()))
                .await?;
            // DEBUG: the decision is already one INFO line, the audit line (`podca::audit`),
            // written once the ledger has it; a second line per certificate only cost CPU.
            tracing::debug!(
                identity = %identity.key(),
                serial = %issued.certificate.serial,
                spiffe_id = %issued.certificate.spiffe_id,
                "issued a certificate over gRPC"
            );
            Ok(Response::new(response(issued)))
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(
        rpc = "IssueForPod",
        signer = %request.get_ref().request.as_ref().map_or("", |r| r.signer_name.as_str()),
        pod = %format!("{}/{}", request.get_ref().pod_namespace, request.get_ref().pod_name),
        caller = tracing::field::Empty,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
    ))]
    async fn issue_for_pod(
        &self,
        request: Request<IssueForPodRequest>,
    ) -> Result<Response<IssueCertificateResponse>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), ISSUE_FOR_POD, peer, async move {
            let caller = self.caller(&request, "IssueForPod").await?;
            let IssueForPodRequest {
                pod_namespace,
                pod_name,
                request: inner,
            } = request.into_inner();
            let issued = self
                .api
                .issue_for_pod(
                    &caller,
                    &pod_namespace,
                    &pod_name,
                    input(inner.unwrap_or_default()),
                )
                .await?;
            tracing::debug!(
                caller = %caller.key(),
                pod = %format!("{pod_namespace}/{pod_name}"),
                serial = %issued.certificate.serial,
                "issued a certificate for a pod over gRPC"
            );
            Ok(Response::new(response(issued)))
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(
        rpc = "GetTrustBundle",
        signer = %request.get_ref().signer_name,
        caller = tracing::field::Empty,
    ))]
    async fn get_trust_bundle(
        &self,
        request: Request<GetTrustBundleRequest>,
    ) -> Result<Response<TrustBundle>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), GET_TRUST_BUNDLE, peer, async move {
            let caller = self.caller(&request, "GetTrustBundle").await?;
            let (name, _) = self.api.signer(&request.get_ref().signer_name)?;
            // The caller's tenant's anchors, else the signer's.
            let ca = self.api.ca_for(name, &caller.namespace);
            Ok(Response::new(bundle(name, &ca.current())))
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(
        rpc = "IssueJwtSvid",
        signer = %request.get_ref().signer_name,
        caller = tracing::field::Empty,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
    ))]
    async fn issue_jwt_svid(
        &self,
        request: Request<IssueJwtSvidRequest>,
    ) -> Result<Response<JwtSvid>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), ISSUE_JWT_SVID, peer, async move {
            let caller = self.caller(&request, "IssueJwtSvid").await?;
            let signed = self
                .api
                .issue_jwt(&caller, jwt_input(request.into_inner()))
                .await?;
            // Never the token: it is a bearer credential.
            tracing::debug!(
                caller = %caller.key(),
                spiffe_id = %signed.claims.sub,
                kid = %signed.kid,
                audiences = ?signed.claims.aud,
                "issued a JWT-SVID over gRPC"
            );
            Ok(Response::new(jwt_response(signed)))
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(
        rpc = "GetJwtBundle",
        signer = %request.get_ref().signer_name,
        caller = tracing::field::Empty,
    ))]
    async fn get_jwt_bundle(
        &self,
        request: Request<GetJwtBundleRequest>,
    ) -> Result<Response<JwtBundle>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), GET_JWT_BUNDLE, peer, async move {
            self.caller(&request, "GetJwtBundle").await?;
            let jwt = self.api.jwt()?;
            let (_, policy) = self.api.signer(&request.get_ref().signer_name)?;
            Ok(Response::new(JwtBundle {
                trust_domain: format!("spiffe://{}", policy.trust_domain),
                jwks: jwt.bundle_json(&jwt.keys().current()),
            }))
        })
        .await
    }

    type WatchTrustBundleStream = BundleStream;

    #[tracing::instrument(skip_all, fields(
        rpc = "WatchTrustBundle",
        signer = %request.get_ref().signer_name,
        caller = tracing::field::Empty,
    ))]
    async fn watch_trust_bundle(
        &self,
        request: Request<GetTrustBundleRequest>,
    ) -> Result<Response<Self::WatchTrustBundleStream>, Status> {
        let peer = peer_of(&request);
        observed(self.api.metrics(), WATCH_TRUST_BUNDLE, peer, async move {
            let caller = self.caller(&request, "WatchTrustBundle").await?;
            let (name, _) = self.api.signer(&request.get_ref().signer_name)?;
            let name = name.to_owned();
            let permit = self.api.open_stream()?;
            let mut anchors = self.api.ca_for(&name, &caller.namespace).subscribe();
            let mut shutdown = self.api.shutdown_signal();
            let (tx, rx) = mpsc::channel(2);
            tokio::spawn(async move {
                let _permit = permit;
                let mut last_pem = String::new();
                loop {
                    let snapshot = Arc::clone(&anchors.borrow_and_update());
                    // A CA swap that keeps the same anchors (a new issuing CA under the same root)
                    // is not news to relying parties.
                    if snapshot.anchors_pem != last_pem {
                        last_pem.clone_from(&snapshot.anchors_pem);
                        if tx.send(Ok(bundle(&name, &snapshot))).await.is_err() {
                            return;
                        }
                    }
                    tokio::select! {
                        changed = anchors.changed() => if changed.is_err() { return },
                        _ = tx.closed() => return,
                        _ = shutdown.wait_for(|stop| *stop) => return,
                    }
                }
            });
            let stream: Self::WatchTrustBundleStream = Box::pin(ReceiverStream::new(rx));
            Ok(Response::new(stream))
        })
        .await
    }
}
