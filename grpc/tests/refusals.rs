//! Every row of the status-code table in `podca_grpc`'s crate docs, through a real tonic
//! client against the crate's own server on a loopback port: exact code, and the part of the
//! message that tells the caller what to change.
//!
//! The API is `support::api`: the real `TokenReviewAuthenticator` over a fake `TokenReviewer`,
//! a fake pod directory, and a real in-memory CA.

// Fixture helpers outside #[test] fns panic on a broken fixture as the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use podca_grpc::Api;
use podca_grpc::auth::DevAuthenticator;
use podca_grpc::podca_service::PodCaService;
use podca_grpc::server;
use podca_grpc::workload::WorkloadService;
use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::pod_ca_server::PodCa;
use podca_proto::podca::v1::{GetTrustBundleRequest, IssueCertificateRequest, IssueForPodRequest};
use podca_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use podca_proto::workload::spiffe_workload_api_server::SpiffeWorkloadApiServer;
use podca_proto::workload::{
    JwtBundlesRequest, JwtsvidRequest, ValidateJwtsvidRequest, X509BundlesRequest, X509svidRequest,
};
use podca_signer::SignerPolicy;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::transport::server::{TcpConnectInfo, UdsConnectInfo};
use tonic::{Code, Request, Status};

use support::{FlakyKey, Setup, api, csr_of, p256_csr};

/// Serves `podca.v1` with [`server::serve_tcp`], and the Workload API with a plain tonic
/// server (the crate serves it on a Unix socket only), both on loopback ports.
async fn serve(api: Arc<Api>) -> (PodCaClient<Channel>, SpiffeWorkloadApiClient<Channel>) {
    let podca = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let podca_addr = podca.local_addr().unwrap();
    tokio::spawn(server::serve_tcp(
        podca,
        Arc::clone(&api),
        podca_grpc::connections::ConnectionLimits::default(),
        std::future::pending(),
    ));
    let workload = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let workload_addr = workload.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(SpiffeWorkloadApiServer::new(WorkloadService::new(api)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(workload)),
    );
    let channel = |addr: SocketAddr| async move {
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap()
    };
    (
        PodCaClient::new(channel(podca_addr).await),
        SpiffeWorkloadApiClient::new(channel(workload_addr).await),
    )
}

async fn start(setup: Setup) -> (PodCaClient<Channel>, SpiffeWorkloadApiClient<Channel>) {
    serve(api(setup)).await
}

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

fn workload_request<T>(message: T, token: &str) -> Request<T> {
    let mut request = with_token(message, token);
    request
        .metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    request
}

#[track_caller]
fn refused<T>(result: Result<T, Status>, code: Code, needle: &str) {
    match result {
        Ok(_) => panic!("expected {code:?} ({needle:?}), got a success"),
        Err(status) => {
            assert_eq!(status.code(), code, "message: {:?}", status.message());
            assert!(
                status.message().contains(needle),
                "{:?} does not contain {needle:?}",
                status.message()
            );
        }
    }
}

fn issue(csr: Vec<u8>) -> IssueCertificateRequest {
    IssueCertificateRequest {
        csr,
        ..Default::default()
    }
}

/// A DER TLV (definite length, up to 64 KiB of content).
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match content.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n < 0x100 => out.extend([0x81, n as u8]),
        n => out.extend([0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(content);
    out
}

/// A CSR for a secp256k1 key (no generator here makes one): the curve's generator point as
/// the public key, and a signature that is never looked at (the key type is refused first).
fn secp256k1_csr() -> Vec<u8> {
    const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    const SECP256K1: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x0a];
    const ECDSA_WITH_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
    const G: &str = "0479be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798\
                     483ada7726a3c4655da4fbfc0e1108a8fd17b448a68554199c47d08ffb10d4b8";
    let point: Vec<u8> = (0..G.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&G[i..i + 2], 16).unwrap())
        .collect();
    let algorithm = der(
        0x30,
        &[der(0x06, EC_PUBLIC_KEY), der(0x06, SECP256K1)].concat(),
    );
    let spki = der(
        0x30,
        &[algorithm, der(0x03, &[&[0][..], &point].concat())].concat(),
    );
    let info = der(
        0x30,
        &[der(0x02, &[0]), der(0x30, &[]), spki, der(0xa0, &[])].concat(),
    );
    let signature_algorithm = der(0x30, &der(0x06, ECDSA_WITH_SHA256));
    let signature = der(0x03, &[0, 0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01]);
    der(0x30, &[info, signature_algorithm, signature].concat())
}

/// `needle` replaced by `with` (same length) at its last occurrence.
fn replace_last(mut bytes: Vec<u8>, needle: &[u8], with: &[u8]) -> Vec<u8> {
    assert_eq!(needle.len(), with.len());
    let at = bytes
        .windows(needle.len())
        .rposition(|w| w == needle)
        .unwrap();
    bytes[at..at + needle.len()].copy_from_slice(with);
    bytes
}

/// The end of an unsupported-key-type message: every type podca certifies.
const SUPPORTED: &str = "; supported key types are RSA3072, RSA4096, ECDSAP256, ECDSAP384, \
                         ECDSAP521, ED25519";

#[tokio::test]
async fn malformed_csrs_are_invalid_argument() {
    let (mut client, _) = start(Setup::default()).await;
    let mut trailing = p256_csr();
    trailing.push(0);
    let mut bad_signature = p256_csr();
    // The last byte is inside the ECDSA signature's `s`: still DER, no longer a signature.
    *bad_signature.last_mut().unwrap() ^= 0x01;
    // The outer signatureAlgorithm (the last OID) says ecdsa-with-SHA512, which podca never
    // pairs with a P-256 key.
    let wrong_algorithm = replace_last(
        p256_csr(),
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02],
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04],
    );
    let rsa2048 = csr_of(
        &rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
            .unwrap(),
    );
    for (what, csr, needle) in [
        ("empty", vec![], "csr is empty; send a DER PKCS#10"),
        ("not DER", b"-----BEGIN".to_vec(), "malformed CSR: "),
        (
            "trailing bytes",
            trailing,
            "malformed CSR: 1 trailing bytes",
        ),
        (
            "bad signature",
            bad_signature,
            "CSR self-signature does not verify against the subject public key",
        ),
        (
            "algorithm does not fit the key",
            wrong_algorithm,
            "signature algorithm 1.2.840.10045.4.3.4 does not fit",
        ),
        ("RSA-2048", rsa2048, SUPPORTED),
        ("secp256k1", secp256k1_csr(), SUPPORTED),
    ] {
        eprintln!("{what}");
        let result = client
            .issue_certificate(with_token(issue(csr), "web"))
            .await;
        refused(result, Code::InvalidArgument, needle);
    }
}

#[tokio::test]
async fn oversized_request_is_out_of_range() {
    let (mut client, _) = start(Setup::default()).await;
    let result = client
        .issue_certificate(with_token(issue(vec![0x30; 70 * 1024]), "web"))
        .await;
    refused(result, Code::OutOfRange, "decoded message length too large");
}

#[tokio::test]
async fn signer_and_policy_refusals() {
    let (mut client, _) = start(Setup::default()).await;
    let request = IssueCertificateRequest {
        csr: p256_csr(),
        signer_name: "p384-only".into(),
        ..Default::default()
    };
    let result = client.issue_certificate(with_token(request, "web")).await;
    refused(
        result,
        Code::FailedPrecondition,
        "UnsupportedKeyType: key type ECDSAP256 is not allowed by this signer's policy",
    );

    let request = IssueCertificateRequest {
        csr: p256_csr(),
        signer_name: "nope".into(),
        ..Default::default()
    };
    let result = client.issue_certificate(with_token(request, "web")).await;
    refused(result, Code::NotFound, "unknown signer \"nope\"");
    let result = client
        .get_trust_bundle(with_token(
            GetTrustBundleRequest {
                signer_name: "nope".into(),
            },
            "web",
        ))
        .await;
    refused(result, Code::NotFound, "unknown signer \"nope\"");

    // Configured, but not in grpc.signers: no gRPC caller may use its policy or its bundle.
    let request = IssueCertificateRequest {
        csr: p256_csr(),
        signer_name: "pcr-only".into(),
        ..Default::default()
    };
    let result = client.issue_certificate(with_token(request, "web")).await;
    refused(
        result,
        Code::PermissionDenied,
        "signer \"pcr-only\" is not offered over gRPC (it is not in grpc.signers)",
    );
    let result = client
        .get_trust_bundle(with_token(
            GetTrustBundleRequest {
                signer_name: "pcr-only".into(),
            },
            "web",
        ))
        .await;
    refused(result, Code::PermissionDenied, "not in grpc.signers");

    // More DNS names than grpc.max_dns_names (4 here), counted before the policy runs.
    let mut request = issue(p256_csr());
    request.user_annotations.insert(
        "podca.dev/dns-names".into(),
        "a.example, b.example,c.example,d.example,e.example".into(),
    );
    let result = client.issue_certificate(with_token(request, "web")).await;
    refused(
        result,
        Code::InvalidArgument,
        "too many DNS names: the certificate would carry 5, at most 4 are allowed \
         (grpc.max_dns_names)",
    );

    let result = client
        .issue_certificate(with_token(issue(p256_csr()), "forbidden"))
        .await;
    refused(
        result,
        Code::PermissionDenied,
        "NamespaceNotAllowed: namespace \"forbidden\" may not get certificates",
    );

    for seconds in [0, -3600] {
        let request = IssueCertificateRequest {
            csr: p256_csr(),
            requested_lifetime_seconds: Some(seconds),
            ..Default::default()
        };
        let result = client.issue_certificate(with_token(request, "web")).await;
        refused(
            result,
            Code::InvalidArgument,
            &format!("requested_lifetime_seconds must be positive, got {seconds}"),
        );
    }
}

#[tokio::test]
async fn lifetime_above_the_maximum_is_clamped() {
    let (mut client, _) = start(Setup::default()).await;
    let request = IssueCertificateRequest {
        csr: p256_csr(),
        requested_lifetime_seconds: Some(10 * 365 * 86_400),
        ..Default::default()
    };
    let answer = client
        .issue_certificate(with_token(request, "web"))
        .await
        .unwrap()
        .into_inner();
    let lifetime = answer.not_after.unwrap().seconds - answer.not_before.unwrap().seconds;
    let max = i64::from(SignerPolicy::permissive("example.org").max_lifetime_seconds);
    assert!(lifetime <= max + 60, "{lifetime} s");
}

#[tokio::test]
async fn ca_that_cannot_issue_is_failed_precondition() {
    let (mut client, _) = start(Setup {
        ca_lifetime: time::Duration::minutes(30),
        ..Setup::default()
    })
    .await;
    let result = client
        .issue_certificate(with_token(issue(p256_csr()), "web"))
        .await;
    refused(result, Code::FailedPrecondition, "CAExpiresTooSoon: ");
}

#[tokio::test]
async fn credential_refusals() {
    let (mut client, _) = start(Setup::default()).await;
    let result = client
        .issue_certificate(Request::new(issue(p256_csr())))
        .await;
    refused(
        result,
        Code::Unauthenticated,
        "no credentials: send `authorization: Bearer <service-account token>`",
    );

    let mut basic = Request::new(issue(p256_csr()));
    basic
        .metadata_mut()
        .insert("authorization", "Basic dXNlcjpwdw==".parse().unwrap());
    refused(
        client.issue_certificate(basic).await,
        Code::Unauthenticated,
        "invalid credentials: the authorization metadata must be `Bearer <token>`",
    );

    let result = client
        .issue_certificate(with_token(issue(p256_csr()), "stolen"))
        .await;
    refused(
        result,
        Code::Unauthenticated,
        "invalid credentials: token has been revoked",
    );

    for (token, needle) in [
        (
            "review-down",
            "cannot check credentials now: TokenReview failed: connection refused",
        ),
        (
            "review-slow",
            "cannot check credentials now: TokenReview did not answer within 5s",
        ),
    ] {
        let result = client
            .issue_certificate(with_token(issue(p256_csr()), token))
            .await;
        refused(result, Code::Unavailable, needle);
    }
}

#[tokio::test]
async fn ca_backend_unavailable_is_unavailable() {
    let key = Arc::new(FlakyKey::p256());
    let (mut client, _) = start(Setup {
        key: key.clone(),
        ..Setup::default()
    })
    .await;
    key.remove();
    let result = client
        .issue_certificate(with_token(issue(p256_csr()), "web"))
        .await;
    refused(result, Code::Unavailable, "HSM token removed; retry later");
}

#[tokio::test]
async fn limits_are_resource_exhausted() {
    let (mut client, _) = start(Setup {
        rate_limit_per_identity: 1,
        ..Setup::default()
    })
    .await;
    let bundle = || with_token(GetTrustBundleRequest::default(), "web");
    client.get_trust_bundle(bundle()).await.unwrap();
    refused(
        client.get_trust_bundle(bundle()).await,
        Code::ResourceExhausted,
        "rate limit of 1 requests per second for this identity exceeded",
    );
    // Another identity has its own bucket.
    client
        .get_trust_bundle(with_token(GetTrustBundleRequest::default(), "proxy"))
        .await
        .unwrap();

    let (mut client, _) = start(Setup {
        max_open_streams: 1,
        ..Setup::default()
    })
    .await;
    let watch = || with_token(GetTrustBundleRequest::default(), "web");
    let mut open = client
        .watch_trust_bundle(watch())
        .await
        .unwrap()
        .into_inner();
    open.message().await.unwrap().expect("the current bundle");
    refused(
        client.watch_trust_bundle(watch()).await,
        Code::ResourceExhausted,
        "too many open streams (1); retry later",
    );
}

fn for_pod(namespace: &str, name: &str) -> IssueForPodRequest {
    IssueForPodRequest {
        pod_namespace: namespace.into(),
        pod_name: name.into(),
        request: Some(issue(p256_csr())),
    }
}

#[tokio::test]
async fn issue_for_pod_refusals() {
    let (mut client, _) = start(Setup::default()).await;
    for (token, namespace, name, code, needle) in [
        (
            "web",
            "shop",
            "web-0",
            Code::PermissionDenied,
            "service account shop/web may not request certificates or JWT-SVIDs for other pods",
        ),
        (
            "proxy-unbound",
            "shop",
            "web-0",
            Code::PermissionDenied,
            "the caller's token names no node; use a pod-bound service-account token",
        ),
        (
            "proxy",
            "shop",
            "db-0",
            Code::PermissionDenied,
            "pod shop/db-0 does not run on the caller's node node-a",
        ),
        (
            "proxy",
            "shop",
            "ghost",
            Code::NotFound,
            "pod shop/ghost not found",
        ),
        (
            "proxy",
            "shop",
            "web/0",
            Code::InvalidArgument,
            "pod_name \"web/0\" is not a Kubernetes object name",
        ),
        (
            "proxy",
            "",
            "web-0",
            Code::InvalidArgument,
            "pod_namespace \"\" is not a Kubernetes object name",
        ),
        (
            "proxy",
            "shop",
            "broken",
            Code::Unavailable,
            "cannot check the pod now: reading pod shop/broken: pods \"broken\" is forbidden; \
             retry later",
        ),
        (
            "proxy",
            "shop",
            "slow",
            Code::Unavailable,
            "cannot check the pod now: reading pod shop/slow: no answer within 5s; retry later",
        ),
        (
            "proxy-nodeonly",
            "shop",
            "web-0",
            Code::PermissionDenied,
            "the caller's token is not bound to a pod (no pod name and UID)",
        ),
        (
            "proxy-gone",
            "shop",
            "web-0",
            Code::PermissionDenied,
            "the caller's pod kube-system/node-proxy-gone no longer exists",
        ),
        (
            "proxy-replaced",
            "shop",
            "web-0",
            Code::PermissionDenied,
            "the caller's pod kube-system/node-proxy-replaced is not the pod its token was \
             issued for (UID uid-of-a-newer-pod, the token names uid-node-proxy-replaced)",
        ),
        (
            "proxy",
            "shop",
            "leaving",
            Code::FailedPrecondition,
            "pod shop/leaving is terminating (it has a deletionTimestamp)",
        ),
        (
            "proxy",
            "shop",
            "done",
            Code::FailedPrecondition,
            "pod shop/done has finished (phase Succeeded)",
        ),
        (
            "proxy",
            "shop",
            "crashed",
            Code::FailedPrecondition,
            "pod shop/crashed has finished (phase Failed)",
        ),
        (
            "proxy",
            "shop",
            "static-web",
            Code::FailedPrecondition,
            "pod shop/static-web is a static pod's mirror: no service account vouches for it, \
             so podca certifies no identity for it",
        ),
    ] {
        let result = client
            .issue_for_pod(with_token(for_pod(namespace, name), token))
            .await;
        refused(result, code, needle);
    }
    let answer = client
        .issue_for_pod(with_token(for_pod("shop", "web-0"), "proxy"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.spiffe_id, "spiffe://example.org/ns/shop/sa/web");
}

#[tokio::test]
async fn issue_for_pod_without_pod_directory_is_failed_precondition() {
    let (mut client, _) = start(Setup {
        pods: None,
        ..Setup::default()
    })
    .await;
    let result = client
        .issue_for_pod(with_token(for_pod("shop", "web-0"), "proxy"))
        .await;
    refused(
        result,
        Code::FailedPrecondition,
        "IssueForPod needs the Kubernetes API to check the pod's node; `podca dev` has none",
    );
}

#[tokio::test]
async fn dev_callers_that_are_not_allowed_are_permission_denied() {
    // A real client cannot come from a non-loopback address, nor from another uid, here: call
    // the service with the connection info the server would attach.
    let service = PodCaService::new(api(Setup {
        authenticator: Arc::new(DevAuthenticator::new(&[])),
        pods: None,
        ..Setup::default()
    }));
    let mut request = Request::new(GetTrustBundleRequest::default());
    for (key, value) in [
        ("x-podca-namespace", "shop"),
        ("x-podca-service-account", "web"),
    ] {
        request.metadata_mut().insert(key, value.parse().unwrap());
    }
    request.extensions_mut().insert(TcpConnectInfo {
        local_addr: Some("10.0.0.1:8443".parse().unwrap()),
        remote_addr: Some("10.0.0.5:50000".parse().unwrap()),
    });
    let result = service.get_trust_bundle(request).await;
    refused(
        result,
        Code::PermissionDenied,
        "dev identities are accepted from loopback only, not from 10.0.0.5",
    );

    // A Unix-socket caller whose uid is not in [dev] identities (there are none here): this
    // process, as SO_PEERCRED reports it.
    let (_ours, theirs) = tokio::net::UnixStream::pair().unwrap();
    let peer_cred = theirs.peer_cred().unwrap();
    let mut request = Request::new(GetTrustBundleRequest::default());
    request.extensions_mut().insert(UdsConnectInfo {
        peer_addr: None,
        peer_cred: Some(peer_cred),
    });
    let result = service.get_trust_bundle(request).await;
    refused(
        result,
        Code::PermissionDenied,
        &format!(
            "uid {} is not mapped to an identity; add it to [dev] identities",
            peer_cred.uid()
        ),
    );
}

#[tokio::test]
async fn workload_api_refusals() {
    let (_, mut workload) = start(Setup::default()).await;
    refused(
        workload
            .fetch_x509svid(with_token(X509svidRequest::default(), "web"))
            .await,
        Code::InvalidArgument,
        "missing the `workload.spiffe.io: true` metadata",
    );
    refused(
        workload
            .fetch_x509_bundles(with_token(X509BundlesRequest::default(), "web"))
            .await,
        Code::InvalidArgument,
        "missing the `workload.spiffe.io: true` metadata",
    );
    // A Workload API without a JWT service (`[jwt] enabled = false`).
    let unimplemented = "JWT-SVIDs are disabled ([jwt] enabled = false)";
    refused(
        workload
            .fetch_jwtsvid(workload_request(JwtsvidRequest::default(), "web"))
            .await,
        Code::Unimplemented,
        unimplemented,
    );
    refused(
        workload
            .fetch_jwt_bundles(workload_request(JwtBundlesRequest::default(), "web"))
            .await,
        Code::Unimplemented,
        unimplemented,
    );
    refused(
        workload
            .validate_jwtsvid(workload_request(ValidateJwtsvidRequest::default(), "web"))
            .await,
        Code::Unimplemented,
        unimplemented,
    );
    // The Workload API authenticates as podca.v1 does.
    refused(
        workload
            .fetch_x509svid(workload_request(X509svidRequest::default(), "stolen"))
            .await,
        Code::Unauthenticated,
        "invalid credentials: token has been revoked",
    );
}

#[tokio::test]
async fn success() {
    let (mut client, mut workload) = start(Setup::default()).await;
    let answer = client
        .issue_certificate(with_token(issue(p256_csr()), "web"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.spiffe_id, "spiffe://example.org/ns/shop/sa/web");
    assert!(answer.certificate_chain_pem.contains("BEGIN CERTIFICATE"));
    assert!(answer.trust_anchors_pem.contains("BEGIN CERTIFICATE"));

    let mut svids = workload
        .fetch_x509svid(workload_request(X509svidRequest::default(), "web"))
        .await
        .unwrap()
        .into_inner();
    let first = svids.message().await.unwrap().expect("a first SVID");
    assert_eq!(
        first.svids[0].spiffe_id,
        "spiffe://example.org/ns/shop/sa/web"
    );
    assert!(!first.svids[0].x509_svid_key.is_empty());
}
