//! podca's gRPC edge: the `podca.v1` API (TCP, and the Unix socket in dev mode), the SPIFFE
//! Workload API (Unix socket) and the Istio CA API (TCP, beside `podca.v1`; [`istio`]).
//!
//! # Status codes
//!
//! Every refusal is a precise gRPC status; the message says what to change. Nothing here ever
//! puts a token or a private key into a status message or a log line. `tests/refusals.rs`
//! checks each row through a tonic client.
//!
//! | Situation | Code |
//! | --- | --- |
//! | `csr` empty, not DER, not a PKCS#10 CSR, trailing bytes | `INVALID_ARGUMENT` |
//! | CSR self-signature does not verify (or its algorithm does not fit the key) | `INVALID_ARGUMENT` |
//! | key type podca never certifies (e.g. RSA-2048, secp256k1); the message lists the supported ones | `INVALID_ARGUMENT` |
//! | key type supported by podca but not allowed by the signer's policy (`key_types`); the message lists the allowed ones | `FAILED_PRECONDITION` |
//! | `signer_name` is not a configured signer | `NOT_FOUND` |
//! | `signer_name` is a configured signer not listed in `grpc.signers` | `PERMISSION_DENIED` |
//! | more DNS names than `grpc.max_dns_names` (the signer's templates plus the `podca.dev/dns-names` annotation's distinct names) | `INVALID_ARGUMENT` |
//! | every TokenReview slot (`grpc.max_token_reviews`) stayed busy for 1 s (`too many credential checks in flight …`) | `RESOURCE_EXHAUSTED` |
//! | no credentials (message `no credentials: …`); an `authorization` that is not `Bearer <token>`; unknown or expired token, wrong audience, not a service-account token (`invalid credentials: <the TokenReview's reason>`) | `UNAUTHENTICATED` |
//! | dev mode: Unix-socket caller whose uid is not in `[dev] identities`; metadata identity from a non-loopback peer | `PERMISSION_DENIED` |
//! | TLS client certificate no longer valid at a request (expired, or its CA retired since the handshake), or naming no podca SPIFFE ID (`invalid credentials: the client certificate …`); refused at the handshake instead: TLS alerts `certificate_expired`, `unknown_ca` ([`peer_identity`]) | `UNAUTHENTICATED` |
//! | token and TLS client certificate of different identities (`the token is for … but the client certificate is for …`) | `PERMISSION_DENIED` |
//! | policy denial (namespace, service account, DNS-name annotation, unknown annotation, a DNS name outside the CA's nameConstraints `NameNotPermittedByCA`); message = `<Reason>: <detail>` | `PERMISSION_DENIED` |
//! | `pod_facts` rules: the identity's pod is gone or has another UID (`PolicyPodNotFound: …`) | `PERMISSION_DENIED` |
//! | `pod_facts` rules: reading the identity's pod failed or took too long | `UNAVAILABLE` |
//! | `requested_lifetime_seconds` ≤ 0 | `INVALID_ARGUMENT` |
//! | `requested_lifetime_seconds` above the policy maximum | clamped, not an error: the answer's `not_after` tells the real lifetime (below 3600 s it is raised to 3600 s) |
//! | policy cannot issue at all (CA expires too soon, lifetime not satisfiable, bad DNS template, the signer's trust domain outside the CA's nameConstraints) | `FAILED_PRECONDITION` |
//! | request larger than 64 KiB | `OUT_OF_RANGE` (tonic's decoder limit) |
//! | CA key backend unavailable (`Outcome::Retry`): retry later | `UNAVAILABLE` |
//! | the certificate was issued but the issuance ledger could not record it (`[ledger] on_unavailable = "retry"`): it is not handed out | `UNAVAILABLE` |
//! | TokenReview / Kubernetes API unreachable, failing or slower than 5 s (`cannot check credentials now: …`); never cached, the next call asks again | `UNAVAILABLE` |
//! | per-identity rate limit (`grpc.rate_limit_per_identity`, token bucket) exceeded | `RESOURCE_EXHAUSTED` |
//! | open streams above `grpc.max_open_streams` | `RESOURCE_EXHAUSTED` |
//! | `IssueForPod`: caller not in `grpc.node_proxy_service_accounts`, its token names no node or no pod (not pod-bound), or the pod runs on another node | `PERMISSION_DENIED` |
//! | `IssueForPod`: the caller's own pod (its token's pod name) no longer exists or has another UID than the token names (`the caller's pod …`) | `PERMISSION_DENIED` |
//! | `IssueForPod`: the pod is terminating (deletionTimestamp set) or has finished (phase `Succeeded`/`Failed`) | `FAILED_PRECONDITION` |
//! | `IssueForPod`: the pod is a static pod's mirror (annotation `kubernetes.io/config.mirror`, or no `serviceAccountName`): no service account vouches for it | `FAILED_PRECONDITION` |
//! | `IssueForPod`: `pod_namespace` or `pod_name` is not a Kubernetes object name | `INVALID_ARGUMENT` |
//! | `IssueForPod`: pod does not exist (`pod <ns>/<name> not found`; only a node proxy gets this far) | `NOT_FOUND` |
//! | `IssueForPod`: a pod lookup (the caller's or the target's) failed or took over 5 s (`cannot check the pod now: …`) | `UNAVAILABLE` |
//! | `IssueForPod` in `podca dev` (no Kubernetes API to check pods against) | `FAILED_PRECONDITION` |
//! | Istio `CreateCertificate`: `csr` empty, not PEM, not a CERTIFICATE REQUEST, not PKCS#10, or without a URI SAN | `INVALID_ARGUMENT` |
//! | Istio: a CSR SAN that is not the SPIFFE ID podca derives (another identity, a DNS name, an IP…): refused, never dropped | `PERMISSION_DENIED` |
//! | Istio: `validity_duration` ≤ 0 | `INVALID_ARGUMENT` |
//! | Istio: `validity_duration` above the policy maximum | clamped, as `requested_lifetime_seconds` |
//! | Istio: `ImpersonatedIdentity` from a non-node-proxy (as IssueForPod), or no running pod of that service account on the caller's node | `PERMISSION_DENIED` |
//! | Istio: `ImpersonatedIdentity` malformed, not a Kubernetes name, or of another trust domain than the signer's or `grpc.istio_trust_domain_alias` | `INVALID_ARGUMENT` |
//! | Istio: listing the pods on the caller's node failed or took over 5 s (`cannot check the pods now: …`) | `UNAVAILABLE` |
//! | Istio: `ImpersonatedIdentity` in `podca dev` | `FAILED_PRECONDITION` |
//! | Workload API call without the `workload.spiffe.io: true` metadata | `INVALID_ARGUMENT` |
//! | Workload API JWT RPCs with `[jwt] enabled = false` | `UNIMPLEMENTED` |
//! | podca.v1 `IssueJwtSvid`/`GetJwtBundle` with `[jwt] enabled = false` | `UNIMPLEMENTED` |
//! | `IssueJwtSvid` for a signer or tenant of another trust domain than the `[grpc] signer`'s (the one JWT key set; `jwt_trust_domain`) | `FAILED_PRECONDITION` |
//! | `IssueJwtSvid`: no audience, more than `[jwt] max_audiences`, an empty or over-long audience; `requested_lifetime_seconds` ≤ 0 (above the maximum: clamped) | `INVALID_ARGUMENT` |
//! | `IssueJwtSvid`: unknown / not-offered `signer_name` | `NOT_FOUND` / `PERMISSION_DENIED` (as IssueCertificate) |
//! | `IssueJwtSvid` with `pod_namespace`/`pod_name`: every refusal of IssueForPod (not a node proxy, pod on another node, gone, terminating, bad name, lookup failing) with IssueForPod's code | as IssueForPod |
//! | `IssueJwtSvid`: signed but the ledger could not record it | `UNAVAILABLE` |
//! | `FetchJWTSVID`: no audience, more than `[jwt] max_audiences`, an empty or over-long audience | `INVALID_ARGUMENT` |
//! | `FetchJWTSVID`: `spiffe_id` that is not the caller's | `PERMISSION_DENIED` |
//! | `ValidateJWTSVID`: empty `svid`/`audience`; a token oversized, malformed, with an `alg` off the JWT-SVID list (`none`, HMAC, EdDSA), unknown `kid`, bad signature, bad claims, another audience, expired or not yet valid ([`errors`]' `jwt_code`) | `INVALID_ARGUMENT` |
//! | no active JWT signing key, or its backend unavailable | `UNAVAILABLE` |
//! | a bug (certificate building failed) | `INTERNAL` |
//!
//! # Who the caller is
//!
//! * In a cluster (`podca serve`): `authorization: Bearer <service-account token>`, checked with
//!   a TokenReview for the audience `grpc.token_audience` ([`auth::TokenReviewAuthenticator`]).
//!   podca needs `tokenreviews create` and, for IssueForPod, `pods get`: nothing else.
//! * mTLS renewal (`podca serve` with TLS): a valid podca client certificate stands for its
//!   SPIFFE ID's identity without a token; with a token, both must agree
//!   ([`peer_identity::CertificateAuthenticator`]).
//! * In `podca dev` ([`auth::DevAuthenticator`]): Unix-socket callers by their uid
//!   (SO_PEERCRED), mapped through `[dev] identities`; TCP callers on loopback name their
//!   identity with the metadata `x-podca-namespace` and `x-podca-service-account` (defaulting
//!   to the first `[dev] identities` entry). Anything that can reach a loopback port can claim
//!   any identity that way: this is a development convenience, refused from other addresses.

pub mod admission;
pub mod auth;
pub mod bundle_endpoint;
pub mod client;
pub mod coalesce;
pub mod component;
pub mod connections;
pub mod core;
pub mod cork;
pub mod dev_banner;
pub mod errors;
pub mod federation;
pub mod federation_fetch;
pub mod federation_status;
pub mod istio;
pub mod jwt;
pub mod keeper;
pub mod ledger;
pub mod observe;
pub mod otlp;
pub mod peer_identity;
pub mod podca_service;
pub mod preauth;
pub mod ratelimit;
pub mod renewal;
pub mod sds;
pub mod server;
pub mod tls;
pub mod token_signer;
pub mod uds_authority;
pub mod workload;

pub use self::core::{Api, ApiOptions};
pub use podca_authority::CaHandle;
