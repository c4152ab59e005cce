//! What the services share: configuration, the CA handle, authentication, limits, and the
//! issuing path (CSR → policy → certificate). No `tonic::Status` here: errors are [`ApiError`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use podca_signer::jwt::SignedSvid;
use podca_signer::ledger::{RecordOutcome, Source};
use podca_signer::names::{ObjectName, SpiffeId};
use podca_signer::rules::{NamespaceLabels, PodMetadata};
use podca_signer::{
    CaKey, CertificateRequest, IssuedCertificate, LedgerRecord, Outcome, RequestContext,
    RequestSource, SignerPolicy, SubjectKey, sign_request_with,
};
use time::{Duration, OffsetDateTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::auth::{
    Authenticator, Credentials, Identity, Peer, PodDirectory, PodFactsError, read_pod_facts,
};
use super::errors::ApiError;
use super::jwt::{JwtAsk, JwtService};
use super::ledger::{LedgerSink, RpcFacts};
use super::preauth::PreAuth;
use super::ratelimit::{RateLimiter, SigningShare};
use podca_authority::metrics::GrpcMetrics;
use podca_authority::trust::{CaHandle, CaSet, CaSnapshot, Clock, system_clock};

/// The ledger `reason` of a JWT-SVID refused because `spiffe_id` named another identity.
pub const UNKNOWN_SPIFFE_ID_REASON: &str = "UnknownSpiffeId";

/// An IssueJwtSvid request as the API receives it.
#[derive(Debug, Clone, Default)]
pub struct JwtInput {
    pub audiences: Vec<String>,
    pub requested_lifetime_seconds: Option<i64>,
    pub signer_name: String,
    /// Both empty: the caller's own identity.
    pub pod_namespace: String,
    pub pod_name: String,
}

/// Largest request message the servers accept.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The default `grpc.max_dns_names`.
pub const DEFAULT_MAX_DNS_NAMES: usize = 16;

/// The knobs of the gRPC API.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// Signer name → policy.
    pub signers: BTreeMap<String, SignerPolicy>,
    /// The signer used when a request names none (`grpc.signer`).
    pub default_signer: String,
    /// The signers gRPC callers may name (`grpc.signers`); the default signer always may.
    /// A configured signer outside this list is refused with `PERMISSION_DENIED`.
    pub allowed_signers: Vec<String>,
    /// DNS names one certificate may carry (`grpc.max_dns_names`), counting the signer's
    /// templates and the names the request asks for.
    pub max_dns_names: usize,
    /// `namespace/name` of service accounts allowed to call IssueForPod.
    pub node_proxy_service_accounts: Vec<String>,
    /// Requests per second per identity; 0 = unlimited.
    pub rate_limit_per_identity: u32,
    /// Open server streams (WatchTrustBundle, Workload API) across all callers.
    pub max_open_streams: usize,
}

/// A certificate request as the API receives it.
#[derive(Debug, Clone, Default)]
pub struct IssueInput {
    pub csr: Vec<u8>,
    pub requested_lifetime_seconds: Option<i64>,
    pub user_annotations: BTreeMap<String, String>,
    pub signer_name: String,
}

/// The Istio CA API's knobs ([`Api::with_istio`]).
#[derive(Debug, Clone, Default)]
pub struct IstioOptions {
    /// `[grpc] istio = false` (podca serve and dev's default): every call is answered
    /// `UNIMPLEMENTED` naming the key. A library [`Api`] serves it unless told so.
    pub off: bool,
    /// Who its callers are: tokens for `[grpc] istio_token_audience` (and podca client
    /// certificates, as for podca.v1). None: the podca.v1 authenticator.
    pub authenticator: Option<Arc<dyn Authenticator>>,
    /// `[grpc] istio_trust_domain_alias`: a trust domain Istio clients may name in CSRs and
    /// `ImpersonatedIdentity` instead of the signer's (Istio's default is `cluster.local`).
    /// Certificates always carry the signer's trust domain.
    pub trust_domain_alias: Option<String>,
}

/// A `CreateCertificate` request, decoded by the Istio adapter.
#[derive(Debug, Clone, Default)]
pub struct IstioInput {
    /// The CSR, DER (the adapter took it out of its PEM).
    pub csr: Vec<u8>,
    /// The CSR's URI SANs.
    pub uri_sans: Vec<String>,
    /// The CSR's other SANs (DNS names, IP addresses, e-mail addresses…), as text.
    pub other_sans: Vec<String>,
    /// `validity_duration`, seconds.
    pub validity_seconds: i64,
    /// `ImpersonatedIdentity` from `metadata` (node proxies only).
    pub impersonated: Option<SpiffeId>,
}

/// What [`Api::node_proxy`] established of a node proxy's token.
struct NodeProxy<'a> {
    pods: &'a Arc<dyn PodDirectory>,
    node: &'a String,
    pod: &'a String,
    uid: &'a String,
}

/// A certificate and the anchors that verify it.
#[derive(Debug, Clone)]
pub struct Issued {
    pub certificate: IssuedCertificate,
    pub anchors_pem: String,
    pub anchors_der: Vec<u8>,
    /// The CA generation that signed it, as `podca ca show` numbers them (for the ledger).
    pub ca_generation: Option<u32>,
}

/// Which path issued a certificate: the `source` of its ledger record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssuedVia {
    /// `podca.v1` IssueCertificate or IssueForPod.
    Grpc,
    /// The SPIFFE Workload API (`FetchX509SVID`).
    WorkloadApi,
    /// A credential bundle `podca dev` keeps on disk.
    DevBundle,
}

impl IssuedVia {
    pub fn ledger_source(self) -> Source {
        match self {
            IssuedVia::Grpc => Source::Grpc,
            IssuedVia::WorkloadApi => Source::WorkloadApi,
            IssuedVia::DevBundle => Source::DevBundle,
        }
    }
}

/// The state every service shares.
pub struct Api {
    options: ApiOptions,
    /// Every CA, and which signer signs with which.
    ca: CaSet,
    auth: Arc<dyn Authenticator>,
    pods: Option<Arc<dyn PodDirectory>>,
    limiter: RateLimiter,
    /// Concurrent gRPC signings: PCR signing keeps the rest of the machine.
    signing: SigningShare,
    /// `default_signer` and `allowed_signers`.
    allowed: BTreeSet<String>,
    streams: Arc<Semaphore>,
    metrics: GrpcMetrics,
    shutdown: watch::Receiver<bool>,
    /// Where decisions are recorded, before the answer leaves; none = not recorded here.
    ledger: Option<LedgerSink>,
    /// This process in ledger records (`POD_NAME`, else the host name).
    replica: String,
    /// The time certificates are issued at: the process clock, so that the API, rotation and
    /// the controller agree on "now" (and tests can move it).
    clock: Clock,
    /// The Istio CA API's authenticator and trust domain alias.
    istio: IstioOptions,
    /// JWT-SVIDs (`IssueJwtSvid`, `GetJwtBundle`); None: answered UNIMPLEMENTED.
    jwt: Option<Arc<JwtService>>,
    /// Namespace labels for policy rules that read them.
    namespace_labels: Option<NamespaceLabels>,
    /// Where policy rules that read `pod` (`pod_facts`) get the pod from.
    pod_facts: Option<Arc<dyn PodDirectory>>,
    /// The TCP listeners' gates before authentication ([`crate::preauth`]).
    pre_auth: Arc<PreAuth>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The clock is a closure with no Debug of its own.
        f.debug_struct("Api")
            .field("options", &self.options)
            .field("ca", &self.ca)
            .field("auth", &self.auth)
            .field("pods", &self.pods)
            .field("limiter", &self.limiter)
            .field("signing", &self.signing)
            .field("streams", &self.streams)
            .field("shutdown", &self.shutdown)
            .field("ledger", &self.ledger)
            .field("istio", &self.istio)
            .field("jwt", &self.jwt)
            .finish_non_exhaustive()
    }
}

/// [`Api::new`] was given a default or allowed signer that is not configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("grpc signer {0:?} is not a configured signer")]
pub struct UnknownSigner(pub String);

impl Api {
    pub fn new(
        options: ApiOptions,
        ca: impl Into<CaSet>,
        auth: Arc<dyn Authenticator>,
        pods: Option<Arc<dyn PodDirectory>>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self, UnknownSigner> {
        let allowed: BTreeSet<String> = options
            .allowed_signers
            .iter()
            .chain([&options.default_signer])
            .cloned()
            .collect();
        if let Some(unknown) = allowed.iter().find(|s| !options.signers.contains_key(*s)) {
            return Err(UnknownSigner(unknown.clone()));
        }
        Ok(Api {
            allowed,
            metrics: GrpcMetrics::default(),
            limiter: RateLimiter::new(options.rate_limit_per_identity),
            signing: SigningShare::for_this_machine(),
            streams: Arc::new(Semaphore::new(options.max_open_streams)),
            options,
            ca: ca.into(),
            auth,
            pods,
            shutdown,
            ledger: None,
            replica: podca_signer::ledger::replica_identity(),
            clock: system_clock(),
            istio: IstioOptions::default(),
            jwt: None,
            namespace_labels: None,
            pod_facts: None,
            pre_auth: PreAuth::new(),
        })
    }

    /// Serves the Istio CA API with these options (its own token audience, the trust domain
    /// alias).
    pub fn with_istio(mut self, istio: IstioOptions) -> Self {
        self.istio = istio;
        self
    }

    /// Whether the Istio CA API is turned off (`[grpc] istio = false`).
    pub fn istio_off(&self) -> bool {
        self.istio.off
    }

    /// Serves JWT-SVIDs on podca.v1 (`IssueJwtSvid`, `GetJwtBundle`) with `jwt`.
    pub fn with_jwt(mut self, jwt: Arc<JwtService>) -> Self {
        self.jwt = Some(jwt);
        self
    }

    /// The JWT-SVID service, or UNIMPLEMENTED when this process serves none.
    pub fn jwt(&self) -> Result<&Arc<JwtService>, ApiError> {
        self.jwt.as_ref().ok_or(ApiError::Unimplemented(
            "JWT-SVIDs are not served here ([jwt] enabled = false)",
        ))
    }

    /// Gives policy rules that read `namespaceObject.metadata.labels` this store (the controller's namespace
    /// watch fills it). Without one, such rules see an empty map.
    pub fn with_namespace_labels(mut self, labels: NamespaceLabels) -> Self {
        self.namespace_labels = Some(labels);
        self
    }

    /// The labels of `namespace` when `policy`'s rules read them.
    pub(crate) fn namespace_labels_for(
        &self,
        policy: &SignerPolicy,
        namespace: &str,
    ) -> Result<Option<Arc<BTreeMap<String, String>>>, ApiError> {
        match &self.namespace_labels {
            Some(store) if policy.rules_use_namespace_labels() => {
                store.get(namespace).map(Some).map_err(|e| {
                    ApiError::Unavailable(podca_signer::BackendError::Unavailable(e.to_string()))
                })
            }
            _ => Ok(None),
        }
    }

    /// Reads the pods behind requests through `pods` for signers whose rules read `pod`
    /// (`pod_facts`). Without it, such a request that names a pod is refused UNAVAILABLE.
    pub fn with_pod_facts(mut self, pods: Arc<dyn PodDirectory>) -> Self {
        self.pod_facts = Some(pods);
        self
    }

    /// The labels and annotations of the identity's pod when `policy`'s rules read them: one
    /// GET, and the pod must have the identity's UID. An identity with no pod (a token not
    /// bound to one, `ImpersonatedIdentity`, `podca dev`) is denied `PolicyPodNotFound`: rules
    /// that read the pod fail closed rather than judge empty maps.
    pub(crate) async fn pod_facts_for(
        &self,
        policy: &SignerPolicy,
        signer: &str,
        identity: &Identity,
    ) -> Result<Option<PodMetadata>, ApiError> {
        if !policy.reads_pod_for(&identity.namespace, &identity.service_account) {
            return Ok(None);
        }
        let (Some(name), Some(uid)) = (&identity.pod_name, &identity.pod_uid) else {
            return Err(ApiError::Denied {
                reason: podca_signer::DenyReason::PodNotFound,
                message: podca_signer::rules::NO_POD.into(),
            });
        };
        let Some(pods) = &self.pod_facts else {
            return Err(ApiError::Unavailable(
                podca_signer::BackendError::Unavailable(format!(
                    "signer {signer}'s rules read the pod, but this process reads no pods"
                )),
            ));
        };
        match read_pod_facts(
            pods.as_ref(),
            (signer, policy),
            &identity.namespace,
            (name, uid),
            &identity.service_account,
        )
        .await
        {
            Ok(pod) => Ok(Some(pod)),
            Err(PodFactsError::Gone(message)) => Err(ApiError::Denied {
                reason: podca_signer::DenyReason::PodNotFound,
                message,
            }),
            Err(PodFactsError::Unavailable { pod, error }) => {
                Err(ApiError::PodLookupUnavailable { pod, error })
            }
        }
    }

    /// Reads the time from `clock` instead of the system clock.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Now, by the API's clock.
    pub fn now(&self) -> OffsetDateTime {
        (self.clock)()
    }

    /// Allows `share` concurrent gRPC signings instead of one core fewer than the machine has.
    pub fn with_signing_share(mut self, share: SigningShare) -> Self {
        self.signing = share;
        self
    }

    /// Counts requests, refusals and latencies in `metrics` (the process registry's).
    pub fn with_metrics(mut self, metrics: GrpcMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &GrpcMetrics {
        &self.metrics
    }

    /// Closes connections that have not authenticated within `deadline` of accept (default
    /// [`crate::preauth::DEFAULT_PRE_AUTH_DEADLINE`]).
    pub fn with_pre_auth_deadline(mut self, deadline: std::time::Duration) -> Self {
        self.pre_auth = PreAuth::with_deadline(deadline);
        self
    }

    /// The gates before authentication of the TCP listeners serving this API.
    pub fn pre_auth(&self) -> Arc<PreAuth> {
        Arc::clone(&self.pre_auth)
    }

    /// A request from `peer` authenticated: its connection is past the gate.
    fn passed(&self, peer: &Peer) {
        if let Peer::Tcp(conn) = peer {
            self.pre_auth.authenticated(*conn);
        }
    }

    /// Records every decision this API makes in the ledger behind `sink`, durably before the
    /// answer leaves: when the ledger cannot record a certificate, the caller gets UNAVAILABLE
    /// instead of it.
    pub fn with_ledger(mut self, sink: LedgerSink) -> Self {
        self.ledger = Some(sink);
        self
    }

    /// The tenant of `signer` that `namespace` belongs to, if any.
    fn tenant_name(&self, signer: &str, namespace: &str) -> Option<String> {
        let policy = self.options.signers.get(signer)?;
        match policy.tenant_of(namespace) {
            Ok(Some(tenant)) => Some(tenant.name.to_owned()),
            _ => None,
        }
    }

    /// The CA that signs `signer`'s certificates for a caller in `namespace`: its tenant's, else
    /// the signer's (`signer` empty: the default signer). A namespace a signer with tenants
    /// denies gets the signer's CA here (bundles), and a refusal when it asks for a certificate.
    pub fn ca_for(&self, signer: &str, namespace: &str) -> &CaHandle {
        let signer = match signer {
            "" => self.options.default_signer.as_str(),
            named => named,
        };
        let tenant = self.tenant_name(signer, namespace);
        self.ca.for_request(signer, tenant.as_deref())
    }

    /// The trust domain of `signer`'s certificates for a caller in `namespace` (its tenant's,
    /// else the signer's; `signer` empty: the default signer).
    pub fn trust_domain_for(&self, signer: &str, namespace: &str) -> Result<String, ApiError> {
        let (_, policy) = self.signer(signer)?;
        Ok(match policy.tenant_of(namespace) {
            Ok(Some(tenant)) => tenant.trust_domain(&policy.trust_domain),
            _ => policy.trust_domain.clone(),
        })
    }

    /// The policy a request of `signer` from `namespace` is decided by (its tenant's), and the
    /// tenant; a namespace the signer's tenants refuse is denied.
    pub fn resolve(
        policy: &SignerPolicy,
        namespace: &str,
    ) -> Result<(SignerPolicy, Option<String>), ApiError> {
        policy
            .resolve(namespace)
            .map_err(|decision| match decision {
                podca_signer::Decision::Deny { reason, message } => {
                    ApiError::Denied { reason, message }
                }
                podca_signer::Decision::Fail { reason, message } => {
                    ApiError::Failed { reason, message }
                }
                podca_signer::Decision::Issue(_) => {
                    ApiError::Internal("an issuing decision where a refusal was expected".into())
                }
            })
    }

    /// Resolves when the server is shutting down (streams end then).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    pub async fn identify(
        &self,
        peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, ApiError> {
        let identity = self.auth.authenticate(peer, credentials).await?;
        self.passed(peer);
        Ok(identity)
    }

    /// Who is calling the Istio CA API: its own authenticator (token audience), else podca.v1's.
    pub async fn identify_istio(
        &self,
        peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, ApiError> {
        let auth = self.istio.authenticator.as_ref().unwrap_or(&self.auth);
        let identity = auth.authenticate(peer, credentials).await?;
        self.passed(peer);
        Ok(identity)
    }

    /// Spends one token of the caller's bucket.
    pub fn check_rate(&self, identity: &Identity) -> Result<(), ApiError> {
        if self.limiter.try_acquire(&identity.key()) {
            Ok(())
        } else {
            Err(ApiError::RateLimited(self.limiter.rate()))
        }
    }

    /// A slot for one open stream, held for as long as the stream lives.
    pub fn open_stream(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        Arc::clone(&self.streams)
            .try_acquire_owned()
            .map_err(|_| ApiError::TooManyStreams(self.options.max_open_streams))
    }

    /// The signer a request names, or the default one: configured, and offered over gRPC.
    pub fn signer(&self, name: &str) -> Result<(&str, &SignerPolicy), ApiError> {
        let name = if name.is_empty() {
            self.options.default_signer.as_str()
        } else {
            name
        };
        let (name, policy) = self
            .options
            .signers
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| ApiError::UnknownSigner(name.to_owned()))?;
        if !self.allowed.contains(name) {
            return Err(ApiError::SignerNotAllowed(name.to_owned()));
        }
        Ok((name, policy))
    }

    /// IssueCertificate: a certificate for the caller's own identity.
    pub async fn issue(&self, identity: &Identity, input: IssueInput) -> Result<Issued, ApiError> {
        let signer = self.signer(&input.signer_name)?.0.to_owned();
        let result = self
            .issue_unrecorded(identity, input, RequestSource::Grpc)
            .await;
        self.settle(result, Source::Grpc, &signer, identity, identity, None)
            .await
    }

    async fn issue_unrecorded(
        &self,
        identity: &Identity,
        input: IssueInput,
        source: RequestSource,
    ) -> Result<Issued, ApiError> {
        let (signer_name, policy) = self.signer(&input.signer_name)?;
        let signer_name = signer_name.to_owned();
        let (policy, tenant) = Self::resolve(policy, &identity.namespace)?;
        let labels = self.namespace_labels_for(&policy, &identity.namespace)?;
        let requested_lifetime =
            crate::admission::requested_lifetime(input.requested_lifetime_seconds)?;
        if input.csr.is_empty() {
            return Err(ApiError::EmptyCsr);
        }
        crate::admission::admit_certificate(
            &policy,
            &crate::admission::CertificateAsk {
                requested_lifetime_seconds: input.requested_lifetime_seconds,
                user_annotations: &input.user_annotations,
                max_dns_names: self.options.max_dns_names,
            },
        )?;
        // After the cheap checks: a refused request costs no API call.
        let pod = self.pod_facts_for(&policy, &signer_name, identity).await?;
        // The deciding signer's (or tenant's) own CA: each is a trust domain of its own.
        let snapshot = self
            .ca
            .for_request(&signer_name, tenant.as_deref())
            .current();
        let identity = identity.clone();
        let clock = Arc::clone(&self.clock);
        // An in-memory ECDSA/Ed25519 CA key signs in microseconds: inline is cheaper than a
        // hand-off to the blocking pool (+6 % throughput). An HSM, an RSA CA key or an RSA CSR
        // (verifying RSA-4096 is fine, but keep the rule simple) go to the blocking pool.
        let inline = signs_inline(snapshot.ca.key().as_ref(), &input.csr);
        let work = move || {
            let key = SubjectKey::from_csr_verified(&input.csr).map_err(ApiError::Key)?;
            issue_blocking(
                &policy,
                &snapshot,
                &identity,
                key,
                requested_lifetime,
                input.user_annotations,
                (source, &signer_name, labels.as_deref(), pod.as_ref()),
                clock(),
            )
        };
        let _turn = self.signing.turn().await;
        if inline {
            return work();
        }
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(work))
            .await
            .map_err(|e| ApiError::Internal(format!("issuing task failed: {e}")))?
    }

    /// IssueForPod: a certificate for a pod on the caller's node (node-level proxies).
    pub async fn issue_for_pod(
        &self,
        caller: &Identity,
        pod_namespace: &str,
        pod_name: &str,
        input: IssueInput,
    ) -> Result<Issued, ApiError> {
        let subject = self.pod_subject(caller, pod_namespace, pod_name).await?;
        let signer = self.signer(&input.signer_name)?.0.to_owned();
        let result = self
            .issue_unrecorded(&subject, input, RequestSource::Grpc)
            .await;
        let request_name = format!("{pod_namespace}/{pod_name}");
        self.settle(
            result,
            Source::IssueForPod,
            &signer,
            &subject,
            caller,
            Some(request_name),
        )
        .await
    }

    /// The identity of a pod a node proxy asks for (IssueForPod, IssueJwtSvid with a pod): the
    /// caller is a node proxy whose own pod still exists, and the pod exists, runs on the
    /// caller's node and has neither finished nor begun terminating.
    async fn pod_subject(
        &self,
        caller: &Identity,
        pod_namespace: &str,
        pod_name: &str,
    ) -> Result<Identity, ApiError> {
        let proxy = self.node_proxy(caller)?;
        let caller_node = proxy.node;
        // Checked before anything reaches the Kubernetes API: an empty name would turn the GET
        // into a LIST, and a `/` would change the path.
        for (what, value) in [("pod_namespace", pod_namespace), ("pod_name", pod_name)] {
            if let Err(e) = value.parse::<ObjectName>() {
                return Err(ApiError::BadPodName(format!(
                    "{what} {value:?} is not a Kubernetes object name: it {e}"
                )));
            }
        }
        self.check_caller_pod(&proxy, caller).await?;
        let pod = pod_lookup(proxy.pods, pod_namespace, pod_name)
            .await?
            .ok_or_else(|| {
                ApiError::PodNotFound(format!("pod {pod_namespace}/{pod_name} not found"))
            })?;
        if pod.node_name.as_deref() != Some(caller_node.as_str()) {
            return Err(ApiError::PodOnOtherNode(format!(
                "pod {pod_namespace}/{pod_name} does not run on the caller's node {caller_node}"
            )));
        }
        if pod.mirror {
            return Err(ApiError::MirrorPod(format!(
                "pod {pod_namespace}/{pod_name} is a static pod's mirror: no service account \
                 vouches for it, so podca certifies no identity for it"
            )));
        }
        if pod.terminating {
            return Err(ApiError::PodNotRunning(format!(
                "pod {pod_namespace}/{pod_name} is terminating (it has a deletionTimestamp)"
            )));
        }
        if pod.finished() {
            return Err(ApiError::PodNotRunning(format!(
                "pod {pod_namespace}/{pod_name} has finished (phase {})",
                pod.phase.as_deref().unwrap_or("")
            )));
        }
        Ok(Identity {
            namespace: pod_namespace.to_owned(),
            service_account: pod.service_account,
            pod_name: Some(pod_name.to_owned()),
            pod_uid: pod.uid,
            node_name: pod.node_name,
            authentication: caller.authentication.on_behalf(),
        })
    }

    /// IssueJwtSvid: a JWT-SVID for the caller, or (a node proxy naming a pod) for a pod on the
    /// caller's node. The signer, lifetime and audiences are checked before any pod lookup.
    pub async fn issue_jwt(
        &self,
        caller: &Identity,
        input: JwtInput,
    ) -> Result<SignedSvid, ApiError> {
        let jwt = Arc::clone(self.jwt()?);
        self.signer(&input.signer_name)?;
        // Longer than `[jwt] max_lifetime_seconds`: clamped when signing.
        let lifetime = crate::admission::requested_lifetime(input.requested_lifetime_seconds)?;
        podca_signer::jwt::check_audiences(&input.audiences, jwt.limits().max_audiences)
            .map_err(ApiError::Jwt)?;
        let (subject, request_name) = if input.pod_namespace.is_empty() && input.pod_name.is_empty()
        {
            (caller.clone(), None)
        } else {
            let subject = self
                .pod_subject(caller, &input.pod_namespace, &input.pod_name)
                .await?;
            let name = format!("{}/{}", input.pod_namespace, input.pod_name);
            (subject, Some(name))
        };
        jwt.issue(
            self,
            JwtAsk {
                signer: &input.signer_name,
                subject: &subject,
                caller,
                request_name,
                audiences: &input.audiences,
                spiffe_id: "",
                lifetime,
            },
        )
        .await
    }

    /// What a node proxy's token must say (IssueForPod, `ImpersonatedIdentity`): the caller is
    /// in `grpc.node_proxy_service_accounts`, and its token is bound to a pod and a node.
    fn node_proxy<'a>(&'a self, caller: &'a Identity) -> Result<NodeProxy<'a>, ApiError> {
        let Some(pods) = &self.pods else {
            return Err(ApiError::NoPodDirectory);
        };
        if !self
            .options
            .node_proxy_service_accounts
            .iter()
            .any(|sa| *sa == caller.key())
        {
            return Err(ApiError::NotNodeProxy(format!(
                "service account {} may not request certificates or JWT-SVIDs for other pods (it \
                 is not in grpc.node_proxy_service_accounts)",
                caller.key()
            )));
        }
        let Some(node) = &caller.node_name else {
            return Err(ApiError::NotNodeProxy(
                "the caller's token names no node; use a pod-bound service-account token".into(),
            ));
        };
        let (Some(pod), Some(uid)) = (&caller.pod_name, &caller.pod_uid) else {
            return Err(ApiError::NotNodeProxy(
                "the caller's token is not bound to a pod (no pod name and UID); use a \
                 pod-bound service-account token"
                    .into(),
            ));
        };
        Ok(NodeProxy {
            pods,
            node,
            pod,
            uid,
        })
    }

    /// The caller's own pod, read now: a cached token review never speaks for a pod that has
    /// gone (or was replaced by another of the same name).
    async fn check_caller_pod(
        &self,
        proxy: &NodeProxy<'_>,
        caller: &Identity,
    ) -> Result<(), ApiError> {
        let caller_ref = format!("{}/{}", caller.namespace, proxy.pod);
        match pod_lookup(proxy.pods, &caller.namespace, proxy.pod).await? {
            None => Err(ApiError::CallerPodGone(format!(
                "the caller's pod {caller_ref} no longer exists"
            ))),
            Some(own) if own.uid.as_deref() != Some(proxy.uid.as_str()) => {
                Err(ApiError::CallerPodGone(format!(
                    "the caller's pod {caller_ref} is not the pod its token was issued for \
                     (UID {}, the token names {})",
                    own.uid.as_deref().unwrap_or("none"),
                    proxy.uid
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// The Istio CA API's `CreateCertificate`: a certificate for the caller, or, from a node
    /// proxy with `ImpersonatedIdentity`, for a service account with a running pod on the
    /// caller's node. The CSR must name exactly that identity (its URI SANs) and nothing else.
    pub async fn issue_istio(
        &self,
        caller: &Identity,
        input: IstioInput,
    ) -> Result<Issued, ApiError> {
        let (signer, _) = self.signer("")?;
        let signer = signer.to_owned();
        if input.validity_seconds <= 0 {
            return Err(ApiError::BadValidity(input.validity_seconds));
        }
        let (subject, vouching_pod) = match &input.impersonated {
            None => (caller.clone(), None),
            Some(id) => {
                // The trust domain of the namespace it names (its tenant's, else the signer's).
                let trust_domain = self.trust_domain_for("", id.namespace.as_str())?;
                let (subject, pod) = self.impersonated_subject(caller, id, &trust_domain).await?;
                (subject, Some(pod))
            }
        };
        let trust_domain = self.trust_domain_for("", &subject.namespace)?;
        self.check_csr_names(&input, &subject, &trust_domain)?;
        let result = self
            .issue_unrecorded(
                &subject,
                IssueInput {
                    csr: input.csr,
                    requested_lifetime_seconds: Some(input.validity_seconds),
                    user_annotations: BTreeMap::new(),
                    signer_name: String::new(),
                },
                RequestSource::Istio,
            )
            .await;
        self.settle(
            result,
            Source::Istio,
            &signer,
            &subject,
            caller,
            vouching_pod,
        )
        .await
    }

    /// Whether `trust_domain` is the signer's or its Istio alias.
    fn istio_trust_domain_ok(&self, named: &str, signer_trust_domain: &str) -> bool {
        named == signer_trust_domain || self.istio.trust_domain_alias.as_deref() == Some(named)
    }

    /// The trust domains Istio clients may name, for messages.
    fn istio_trust_domains(&self, signer_trust_domain: &str) -> String {
        match &self.istio.trust_domain_alias {
            Some(alias) => format!("{signer_trust_domain:?} (or its alias {alias:?})"),
            None => format!("{signer_trust_domain:?}"),
        }
    }

    /// `ImpersonatedIdentity`: the caller is a node proxy, the identity is of this signer's
    /// trust domain, and a running pod with that service account is on the caller's node.
    /// Returns the subject and the `namespace/name` of the pod that vouches for it.
    async fn impersonated_subject(
        &self,
        caller: &Identity,
        id: &SpiffeId,
        signer_trust_domain: &str,
    ) -> Result<(Identity, String), ApiError> {
        if self.pods.is_none() {
            return Err(ApiError::ImpersonationWithoutPods);
        }
        let proxy = self.node_proxy(caller)?;
        if !self.istio_trust_domain_ok(id.trust_domain.as_str(), signer_trust_domain) {
            return Err(ApiError::BadImpersonation(format!(
                "ImpersonatedIdentity {id} is not in the trust domain {}",
                self.istio_trust_domains(signer_trust_domain)
            )));
        }
        self.check_caller_pod(&proxy, caller).await?;
        let node = proxy.node;
        let pods = proxy
            .pods
            .pods_on_node(id.namespace.as_str(), node, id.service_account.as_str())
            .await
            .map_err(|error| ApiError::PodListUnavailable {
                what: format!(
                    "the pods of service account {}/{} on node {node}",
                    id.namespace, id.service_account
                ),
                error,
            })?;
        let running = pods.into_iter().find(|p| {
            p.info.node_name.as_deref() == Some(node.as_str())
                && p.info.service_account == id.service_account.as_str()
                && !p.info.mirror
                && !p.info.terminating
                && !p.info.finished()
        });
        let Some(pod) = running else {
            return Err(ApiError::NoPodOnNode(format!(
                "no running pod of service account {}/{} is on the caller's node {node}",
                id.namespace, id.service_account
            )));
        };
        let subject = Identity {
            namespace: id.namespace.to_string(),
            service_account: id.service_account.to_string(),
            pod_name: None,
            pod_uid: None,
            node_name: Some(node.clone()),
            authentication: caller.authentication.on_behalf(),
        };
        Ok((subject, format!("{}/{}", id.namespace, pod.name)))
    }

    /// The CSR's names: at least one URI SAN, every one the subject's SPIFFE ID (in the
    /// signer's trust domain or its alias), and no SAN of another kind.
    fn check_csr_names(
        &self,
        input: &IstioInput,
        subject: &Identity,
        signer_trust_domain: &str,
    ) -> Result<(), ApiError> {
        let derived = podca_signer::names::spiffe_id(
            signer_trust_domain,
            &subject.namespace,
            &subject.service_account,
        );
        if let Some(other) = input.other_sans.first() {
            return Err(ApiError::CsrNameNotAllowed(format!(
                "the CSR asks for {other}, which podca does not derive from the identity {derived}; \
                 send a CSR whose only SAN is that URI"
            )));
        }
        if input.uri_sans.is_empty() {
            return Err(ApiError::BadIstioCsr(format!(
                "the CSR carries no URI SAN; it must name the SPIFFE ID {derived}"
            )));
        }
        for uri in &input.uri_sans {
            let matches = uri.parse::<SpiffeId>().is_ok_and(|id| {
                self.istio_trust_domain_ok(id.trust_domain.as_str(), signer_trust_domain)
                    && id.namespace.as_str() == subject.namespace
                    && id.service_account.as_str() == subject.service_account
            });
            if !matches {
                return Err(ApiError::CsrNameNotAllowed(format!(
                    "the CSR asks for {uri:?}, but the caller may only be certified as {derived} \
                     (trust domain {})",
                    self.istio_trust_domains(signer_trust_domain)
                )));
            }
        }
        Ok(())
    }

    /// A certificate for a key podca generated itself (the Workload API, credential bundles).
    pub async fn issue_for_key(
        &self,
        identity: &Identity,
        key: SubjectKey,
        snapshot: Arc<CaSnapshot>,
        via: IssuedVia,
    ) -> Result<Issued, ApiError> {
        let (signer, policy) = self.signer("")?;
        let signer = signer.to_owned();
        let signer_name = signer.clone();
        let (policy, _tenant) = Self::resolve(policy, &identity.namespace)?;
        let labels = self.namespace_labels_for(&policy, &identity.namespace)?;
        let pod = self.pod_facts_for(&policy, &signer_name, identity).await?;
        let subject = identity.clone();
        let identity = identity.clone();
        let clock = Arc::clone(&self.clock);
        let turn = self.signing.turn().await;
        let span = tracing::Span::current();
        let result = tokio::task::spawn_blocking(move || {
            let _in_request = span.enter();
            issue_blocking(
                &policy,
                &snapshot,
                &identity,
                key,
                None,
                BTreeMap::new(),
                (
                    RequestSource::Grpc,
                    &signer_name,
                    labels.as_deref(),
                    pod.as_ref(),
                ),
                clock(),
            )
        })
        .await
        .map_err(|e| ApiError::Internal(format!("issuing task failed: {e}")))?;
        drop(turn);
        self.settle(
            result,
            via.ledger_source(),
            &signer,
            &subject,
            &subject,
            None,
        )
        .await
    }

    /// Records the decision `result` stands for (issued, denied or failed) and waits for it to
    /// be durable. An issued certificate the ledger could not record is not handed out
    /// (UNAVAILABLE); a refusal is answered whatever the ledger says.
    async fn settle(
        &self,
        result: Result<Issued, ApiError>,
        source: Source,
        signer: &str,
        subject: &Identity,
        caller: &Identity,
        request_name: Option<String>,
    ) -> Result<Issued, ApiError> {
        let Some(ledger) = &self.ledger else {
            return result;
        };
        let mut context = self.record_context(source, signer, subject, caller, request_name);
        let record = match &result {
            Ok(issued) => {
                context.ca_generation = issued.ca_generation.map(u64::from);
                LedgerRecord::issued(&context, &issued.certificate)
            }
            Err(ApiError::Denied { reason, message }) => LedgerRecord::refused(
                &context,
                RecordOutcome::Denied,
                reason.condition_reason(),
                message,
            ),
            Err(ApiError::Failed { reason, message }) => LedgerRecord::refused(
                &context,
                RecordOutcome::Failed,
                reason.condition_reason(),
                message,
            ),
            // Not a decision on the request (bad input, no CA now): nothing to record.
            Err(_) => return result,
        };
        record_then_answer(ledger, record, result).await
    }

    /// [`Self::settle`] for a JWT-SVID (source `jwt`): an issued token is recorded (kid,
    /// audiences, `iat`/`exp`, its SHA-256; never the token) before it is handed out, and a
    /// refusal by the policy or for another identity's `spiffe_id` as `denied`.
    pub(crate) async fn settle_jwt(
        &self,
        result: Result<SignedSvid, ApiError>,
        signer: &str,
        subject: &Identity,
        caller: &Identity,
        request_name: Option<String>,
    ) -> Result<SignedSvid, ApiError> {
        let Some(ledger) = &self.ledger else {
            return result;
        };
        let mut context = self.record_context(Source::Jwt, signer, subject, caller, request_name);
        // A JWT-SVID is signed by a JWT key (its kid is in the record), not by the CA.
        context.ca_generation = None;
        context.issuer_fingerprint = None;
        let record = match &result {
            Ok(signed) => LedgerRecord::jwt_issued(&context, signed),
            Err(ApiError::Denied { reason, message }) => LedgerRecord::refused(
                &context,
                RecordOutcome::Denied,
                reason.condition_reason(),
                message,
            ),
            Err(e @ ApiError::UnknownSpiffeId { .. }) => LedgerRecord::refused(
                &context,
                RecordOutcome::Denied,
                UNKNOWN_SPIFFE_ID_REASON,
                &e.to_string(),
            ),
            // Bad input, no signing key now: nothing decided on the request.
            Err(_) => return result,
        };
        record_then_answer(ledger, record, result).await
    }

    /// The ledger facts of one decision on `subject`, asked by `caller`, under `signer`.
    fn record_context(
        &self,
        source: Source,
        signer: &str,
        subject: &Identity,
        caller: &Identity,
        request_name: Option<String>,
    ) -> podca_signer::ledger::RecordContext {
        let snapshot = self.ca_for(signer, &subject.namespace).current();
        let trust_domain = self
            .trust_domain_for(signer, &subject.namespace)
            .unwrap_or_default();
        RpcFacts {
            source,
            signer,
            trust_domain: &trust_domain,
            subject,
            caller,
            request_name,
            snapshot: &snapshot,
            replica: &self.replica,
            time: self.now(),
        }
        .context()
    }

    /// The trust domain of the default signer.
    pub fn trust_domain(&self) -> Result<String, ApiError> {
        Ok(self.signer("")?.1.trust_domain.clone())
    }
}

/// Reads one pod through the directory, an error naming it.
async fn pod_lookup(
    pods: &Arc<dyn PodDirectory>,
    namespace: &str,
    name: &str,
) -> Result<Option<super::auth::PodInfo>, ApiError> {
    pods.pod(namespace, name)
        .await
        .map_err(|error| ApiError::PodLookupUnavailable {
            pod: format!("{namespace}/{name}"),
            error,
        })
}

/// Whether a request is verified and signed on the async worker itself rather than on the
/// blocking pool.
fn signs_inline(ca_key: &dyn CaKey, csr: &[u8]) -> bool {
    ca_key.signs_quickly_in_process() && !looks_like_rsa(csr)
}

/// Whether a CSR (DER) carries an RSA key: the rsaEncryption OID appears in it. A cheap
/// pre-check that only decides where the CSR is verified, never whether it is accepted.
fn looks_like_rsa(csr: &[u8]) -> bool {
    const RSA_ENCRYPTION: &[u8] = &[
        0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
    ];
    csr.windows(RSA_ENCRYPTION.len())
        .any(|w| w == RSA_ENCRYPTION)
}

/// How many DNS names a certificate for this request would carry at most: the policy's
/// templates plus the distinct names of the `podca.dev/dns-names` annotation. Counted before
/// the policy runs, so that a request with thousands of names costs no policy work.
pub(crate) fn dns_name_count(
    policy: &SignerPolicy,
    annotations: &BTreeMap<String, String>,
) -> usize {
    let requested: BTreeSet<String> = annotations
        .get(podca_signer::policy::DNS_NAMES_ANNOTATION)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_ascii_lowercase)
                .collect()
        })
        .unwrap_or_default();
    policy.dns_name_templates.len() + requested.len()
}

/// Signs after policy; `rule_scope` is what only the edge knows for the rules: the source, the
/// signer's name, the namespace's labels and the pod's facts.
// One caller per API; a struct for the arguments would only rename them.
#[allow(clippy::too_many_arguments)]
fn issue_blocking(
    policy: &SignerPolicy,
    snapshot: &CaSnapshot,
    identity: &Identity,
    key: SubjectKey,
    requested_lifetime: Option<Duration>,
    user_annotations: BTreeMap<String, String>,
    rule_scope: (
        RequestSource,
        &str,
        Option<&BTreeMap<String, String>>,
        Option<&PodMetadata>,
    ),
    now: OffsetDateTime,
) -> Result<Issued, ApiError> {
    let request = CertificateRequest {
        key: Ok(key),
        namespace: identity.namespace.clone(),
        service_account: identity.service_account.clone(),
        pod_name: identity.pod_name.clone(),
        max_expiration: None,
        requested_lifetime,
        user_annotations,
    };
    let (source, signer_name, namespace_labels, pod) = rule_scope;
    // Where the caller's renewal chain began: a renewal keeps its predecessor's (issue #40).
    let chain = identity.authentication.chain_at(now);
    // The identity is what the TokenReview (or the client certificate) verified.
    let context = RequestContext {
        source,
        signer_name,
        pod_uid: identity.pod_uid.as_deref(),
        node_name: identity.node_name.as_deref(),
        namespace_labels,
        pod,
        renewal: Some(&chain),
        service_sans: None,
    };
    match sign_request_with(policy, &snapshot.ca, &request, &context, now) {
        Outcome::Issued(certificate) => Ok(Issued {
            certificate: *certificate,
            anchors_pem: snapshot.anchors_pem.clone(),
            anchors_der: snapshot.anchors_der(),
            ca_generation: snapshot.ca_generation,
        }),
        Outcome::Denied { reason, message } => Err(ApiError::Denied { reason, message }),
        Outcome::Failed { reason, message } => Err(ApiError::Failed { reason, message }),
        Outcome::Retry(e) => Err(ApiError::Unavailable(e)),
    }
}

/// Records `record` before `result` is answered: an issuance the ledger cannot take becomes
/// UNAVAILABLE; a refusal is answered whatever the ledger says.
async fn record_then_answer<T>(
    ledger: &LedgerSink,
    record: LedgerRecord,
    result: Result<T, ApiError>,
) -> Result<T, ApiError> {
    let recorded = tracing::Instrument::instrument(
        ledger.record(record),
        tracing::info_span!("ledger_commit"),
    )
    .await;
    match (recorded, result) {
        (Ok(()), result) => result,
        (Err(e), Ok(_)) => Err(ApiError::LedgerUnavailable(e.to_string())),
        (Err(e), refusal) => {
            tracing::warn!(error = %e, "the ledger could not record a refusal");
            refusal
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podca_signer::{BackendError, CaAlgorithm, MemoryKey};

    /// A backend that keeps `CaKey`'s default answer to `signs_quickly_in_process` (false).
    #[derive(Debug)]
    struct UnknownBackend(MemoryKey);

    impl CaKey for UnknownBackend {
        fn algorithm(&self) -> CaAlgorithm {
            self.0.algorithm()
        }
        fn public_key_raw(&self) -> &[u8] {
            self.0.public_key_raw()
        }
        fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
            self.0.sign(message)
        }
        fn location(&self) -> String {
            "memory:unknown-backend".into()
        }
    }

    fn csr() -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .der()
            .to_vec()
    }

    #[test]
    fn where_signing_runs() {
        let rsa_csr = {
            let rsa =
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                    .unwrap();
            rcgen::CertificateParams::new(Vec::<String>::new())
                .unwrap()
                .serialize_request(&rsa)
                .unwrap()
                .der()
                .to_vec()
        };
        let ec_csr = csr();
        let memory =
            |algorithm| Arc::new(MemoryKey::generate(algorithm).unwrap()) as Arc<dyn CaKey>;
        let unknown = Arc::new(UnknownBackend(
            MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap(),
        )) as Arc<dyn CaKey>;
        let rsa_ca = memory(CaAlgorithm::RsaSha256);
        // In-memory ECDSA/Ed25519 CA keys sign EC CSRs inline; an RSA CA key, a backend that
        // does not say it is quick (the default), or an RSA CSR go to the blocking pool.
        for (what, key, csr, inline) in [
            (
                "P-256 CA, EC CSR",
                memory(CaAlgorithm::EcdsaP256),
                &ec_csr,
                true,
            ),
            (
                "P-384 CA, EC CSR",
                memory(CaAlgorithm::EcdsaP384),
                &ec_csr,
                true,
            ),
            (
                "Ed25519 CA, EC CSR",
                memory(CaAlgorithm::Ed25519),
                &ec_csr,
                true,
            ),
            (
                "P-256 CA, RSA CSR",
                memory(CaAlgorithm::EcdsaP256),
                &rsa_csr,
                false,
            ),
            ("RSA CA, EC CSR", Arc::clone(&rsa_ca), &ec_csr, false),
            ("RSA CA, RSA CSR", Arc::clone(&rsa_ca), &rsa_csr, false),
            (
                "unknown backend, EC CSR",
                Arc::clone(&unknown),
                &ec_csr,
                false,
            ),
            (
                "unknown backend, RSA CSR",
                Arc::clone(&unknown),
                &rsa_csr,
                false,
            ),
        ] {
            assert_eq!(signs_inline(key.as_ref(), csr), inline, "{what}");
        }
        // The RSA pre-check itself: RSA CSRs are recognised; EC ones are not mistaken for RSA.
        assert!(looks_like_rsa(&rsa_csr));
        assert!(!looks_like_rsa(&ec_csr));
    }
}
