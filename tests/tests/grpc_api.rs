//! The podca.v1 gRPC API of `podca dev`, end to end: issuance for every key type checked with
//! `openssl verify`, every documented refusal, limits, and trust-bundle rotation.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::time::Duration;

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::{
    GetTrustBundleRequest, IssueCertificateRequest, IssueCertificateResponse, IssueForPodRequest,
};
use podca_tests::process::{DevOptions, DevProcess, csr_for, podca_ca_rotate};
use podca_tests::verify::{assert_no_anchor_signed, assert_verifies, openssl_verify};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

fn as_identity<T>(message: T, namespace: &str, service_account: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("x-podca-namespace", namespace.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-podca-service-account", service_account.parse().unwrap());
    request
}

fn request(csr: Vec<u8>) -> IssueCertificateRequest {
    IssueCertificateRequest {
        csr,
        ..Default::default()
    }
}

async fn issue(
    client: &mut PodCaClient<Channel>,
    message: IssueCertificateRequest,
) -> Result<IssueCertificateResponse, Status> {
    client
        .issue_certificate(as_identity(message, "default", "default"))
        .await
        .map(|r| r.into_inner())
}

fn p256_csr() -> Vec<u8> {
    csr_for(&rcgen::KeyPair::generate().unwrap())
}

fn expect_code(result: Result<impl std::fmt::Debug, Status>, code: Code, needle: &str) -> Status {
    let status = result.expect_err("the call should fail");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(needle),
        "{:?} should mention {needle:?}",
        status.message()
    );
    status
}

#[tokio::test(flavor = "multi_thread")]
async fn issues_for_all_six_key_types_and_openssl_verifies() {
    let dev = DevProcess::start();
    let mut client = dev.tcp_client().await;
    let algorithms: [(&str, rcgen::KeyPair); 6] = [
        (
            "RSA3072",
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_3072)
                .unwrap(),
        ),
        (
            "RSA4096",
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_4096)
                .unwrap(),
        ),
        (
            "ECDSAP256",
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap(),
        ),
        (
            "ECDSAP384",
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap(),
        ),
        (
            "ECDSAP521",
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P521_SHA512).unwrap(),
        ),
        (
            "ED25519",
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap(),
        ),
    ];
    for (name, key) in algorithms {
        let answer = issue(&mut client, request(csr_for(&key)))
            .await
            .unwrap_or_else(|s| panic!("{name}: {s:?}"));
        assert_eq!(
            answer.spiffe_id,
            "spiffe://podca.dev.local/ns/default/sa/default"
        );
        openssl_verify(&answer.certificate_chain_pem, &answer.trust_anchors_pem)
            .unwrap_or_else(|e| panic!("{name}: openssl verify failed: {e}"));
        // The certificate certifies the CSR's key, byte for byte.
        let leaf = pem::parse(&answer.certificate_chain_pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.contents()).unwrap();
        assert_eq!(
            cert.public_key().raw,
            key.subject_public_key_info().as_slice(),
            "{name}"
        );
        let nb = answer.not_before.unwrap().seconds;
        let na = answer.not_after.unwrap().seconds;
        let refresh = answer.begin_refresh_at.unwrap().seconds;
        assert_eq!(na - nb, 86_400, "{name}: the policy default lifetime");
        assert!(nb < refresh && refresh < na, "{name}");
    }
}

use rcgen::PublicKeyData;

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_maps_to_documented_statuses() {
    let config = r#"
[signers."example.com/workload"]
trust_domain = "example.com"
namespaces = ["default", "shop"]
service_accounts = ["default/*", "shop/web"]

[signers."example.com/ed25519-only"]
trust_domain = "example.com"
key_types = ["ED25519"]

[grpc]
signer = "example.com/workload"
# Offered over gRPC too, so that its key-type policy (not the allow-list) answers.
signers = ["example.com/workload", "example.com/ed25519-only"]

[[dev.identities]]
uid = 4294967290
namespace = "default"
service_account = "default"
"#;
    let dev = DevProcess::start_with(DevOptions {
        config: Some(config),
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;

    // Malformed CSR, empty CSR.
    expect_code(
        issue(&mut client, request(b"not a csr".to_vec())).await,
        Code::InvalidArgument,
        "malformed CSR",
    );
    expect_code(
        issue(&mut client, request(vec![])).await,
        Code::InvalidArgument,
        "csr is empty",
    );
    // Broken self-signature: flip the last byte of the signature.
    let mut csr = p256_csr();
    *csr.last_mut().unwrap() ^= 0x55;
    expect_code(
        issue(&mut client, request(csr)).await,
        Code::InvalidArgument,
        "does not verify",
    );
    // A key type podca never certifies; the message lists the supported ones.
    let rsa2048 =
        rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
            .unwrap();
    expect_code(
        issue(&mut client, request(csr_for(&rsa2048))).await,
        Code::InvalidArgument,
        "RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519",
    );
    // A supported key type this signer's policy does not allow.
    expect_code(
        issue(
            &mut client,
            IssueCertificateRequest {
                signer_name: "example.com/ed25519-only".into(),
                ..request(p256_csr())
            },
        )
        .await,
        Code::FailedPrecondition,
        "ED25519",
    );
    // Unknown signer.
    expect_code(
        issue(
            &mut client,
            IssueCertificateRequest {
                signer_name: "example.com/nope".into(),
                ..request(p256_csr())
            },
        )
        .await,
        Code::NotFound,
        "example.com/nope",
    );
    // Policy denials carry the reason.
    let denied = client
        .issue_certificate(as_identity(request(p256_csr()), "kube-system", "default"))
        .await;
    expect_code(denied, Code::PermissionDenied, "NamespaceNotAllowed");
    let denied = client
        .issue_certificate(as_identity(request(p256_csr()), "shop", "batch"))
        .await;
    expect_code(denied, Code::PermissionDenied, "ServiceAccountNotAllowed");
    let mut annotated = request(p256_csr());
    annotated
        .user_annotations
        .insert("example.com/unknown".into(), "x".into());
    expect_code(
        issue(&mut client, annotated).await,
        Code::PermissionDenied,
        "InvalidUnverifiedUserAnnotations",
    );
    // Lifetimes: non-positive is refused, too long is clamped to the policy maximum.
    expect_code(
        issue(
            &mut client,
            IssueCertificateRequest {
                requested_lifetime_seconds: Some(-5),
                ..request(p256_csr())
            },
        )
        .await,
        Code::InvalidArgument,
        "requested_lifetime_seconds",
    );
    let clamped = issue(
        &mut client,
        IssueCertificateRequest {
            requested_lifetime_seconds: Some(10 * 365 * 86_400),
            ..request(p256_csr())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        clamped.not_after.unwrap().seconds - clamped.not_before.unwrap().seconds,
        7 * 86_400,
        "clamped to max_lifetime_seconds"
    );
    // Oversized request.
    expect_code(
        issue(&mut client, request(vec![0x30; 100 * 1024])).await,
        Code::OutOfRange,
        "decoded message length too large",
    );
    // Credentials: malformed authorization, half a dev identity.
    let mut bad_auth = Request::new(request(p256_csr()));
    bad_auth
        .metadata_mut()
        .insert("authorization", "Basic c2VjcmV0".parse().unwrap());
    let status = expect_code(
        client.issue_certificate(bad_auth).await,
        Code::Unauthenticated,
        "Bearer",
    );
    assert!(
        !status.message().contains("c2VjcmV0"),
        "credentials never echoed"
    );
    let mut half = Request::new(request(p256_csr()));
    half.metadata_mut()
        .insert("x-podca-namespace", "default".parse().unwrap());
    expect_code(
        client.issue_certificate(half).await,
        Code::Unauthenticated,
        "x-podca-service-account",
    );
    // IssueForPod has no Kubernetes API to check pods against in dev mode.
    let for_pod = client
        .issue_for_pod(as_identity(
            IssueForPodRequest {
                pod_namespace: "default".into(),
                pod_name: "web-0".into(),
                request: Some(request(p256_csr())),
            },
            "default",
            "default",
        ))
        .await;
    expect_code(for_pod, Code::FailedPrecondition, "Kubernetes API");
    // Unix-socket callers whose uid is not in [dev] identities.
    let mut unix = PodCaClient::new(dev.unix_channel().await);
    let unknown = unix
        .get_trust_bundle(GetTrustBundleRequest::default())
        .await;
    expect_code(unknown, Code::PermissionDenied, "not mapped");
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_limit_and_stream_limit() {
    let config = r#"
[grpc]
rate_limit_per_identity = 2
max_open_streams = 1
"#;
    let dev = DevProcess::start_with(DevOptions {
        config: Some(config),
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    let mut limited = 0;
    for _ in 0..6 {
        match client
            .get_trust_bundle(as_identity(
                GetTrustBundleRequest::default(),
                "default",
                "a",
            ))
            .await
        {
            Ok(_) => {}
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert!(s.message().contains("rate limit"));
                limited += 1;
            }
        }
    }
    assert!(
        limited >= 3,
        "a bucket of 2 lets at most ~2-3 of 6 quick calls through"
    );
    // Another identity has its own bucket.
    client
        .get_trust_bundle(as_identity(
            GetTrustBundleRequest::default(),
            "default",
            "b",
        ))
        .await
        .unwrap();
    let mut first = client
        .watch_trust_bundle(as_identity(
            GetTrustBundleRequest::default(),
            "default",
            "c",
        ))
        .await
        .unwrap()
        .into_inner();
    first.message().await.unwrap().unwrap();
    let second = client
        .watch_trust_bundle(as_identity(
            GetTrustBundleRequest::default(),
            "default",
            "d",
        ))
        .await;
    expect_code(second, Code::ResourceExhausted, "too many open streams");
    drop(first);
    // The slot is released when the client goes away.
    let mut reopened = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(s) = client
            .watch_trust_bundle(as_identity(
                GetTrustBundleRequest::default(),
                "default",
                "e",
            ))
            .await
        {
            reopened = Some(s);
            break;
        }
    }
    assert!(reopened.is_some(), "the stream slot was released");
}

/// `podca ca rotate` on the data directory of a running `podca dev`, with no signal: the
/// rotation driver notices within seconds, every open stream gets old + next anchors, and the
/// current CA keeps signing (the next one waits out the propagation window).
#[tokio::test(flavor = "multi_thread")]
async fn ca_rotate_reaches_open_streams_without_a_signal() {
    let dev = DevProcess::start();
    let mut client = dev.tcp_client().await;
    let mut watch = client
        .watch_trust_bundle(as_identity(
            GetTrustBundleRequest::default(),
            "default",
            "default",
        ))
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    podca_ca_rotate(&dev.data_dir);
    let second = tokio::time::timeout(Duration::from_secs(15), watch.message())
        .await
        .expect("a new bundle within 15 s, without SIGHUP")
        .unwrap()
        .unwrap();
    assert_eq!(
        second.trust_anchors_pem,
        std::fs::read_to_string(dev.data_dir.join("root.pem")).unwrap()
    );
    assert_eq!(
        second
            .trust_anchors_pem
            .matches("BEGIN CERTIFICATE")
            .count(),
        2
    );
    assert!(
        second
            .trust_anchors_pem
            .starts_with(&first.trust_anchors_pem)
    );
    // Still signed by the current CA: its certificates verify with the old anchor alone.
    let cert = issue(&mut client, request(p256_csr())).await.unwrap();
    assert_verifies(&cert.certificate_chain_pem, &first.trust_anchors_pem);
}

#[tokio::test(flavor = "multi_thread")]
async fn rotation_pushes_a_new_bundle_to_open_watch_streams() {
    let dev = DevProcess::start();
    let mut client = dev.tcp_client().await;
    let mut watch = client
        .watch_trust_bundle(as_identity(
            GetTrustBundleRequest::default(),
            "default",
            "default",
        ))
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.signer_name, "podca.dev/default");
    assert_eq!(
        first.trust_anchors_pem,
        std::fs::read_to_string(dev.data_dir.join("root.pem")).unwrap()
    );
    let old = issue(&mut client, request(p256_csr())).await.unwrap();

    let new_anchors = dev.replace_ca_and_reload();
    let second = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("a new bundle within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(second.trust_anchors_pem, new_anchors);
    assert_ne!(second.trust_anchors_pem, first.trust_anchors_pem);
    assert!(second.generation > first.generation);
    // New certificates chain to the new anchors, not to the old ones.
    let new = issue(&mut client, request(p256_csr())).await.unwrap();
    assert_verifies(&new.certificate_chain_pem, &new_anchors);
    assert_no_anchor_signed(&new.certificate_chain_pem, &first.trust_anchors_pem);
    assert_no_anchor_signed(&old.certificate_chain_pem, &new_anchors);
    let got = client
        .get_trust_bundle(as_identity(
            GetTrustBundleRequest::default(),
            "default",
            "default",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.trust_anchors_pem, new_anchors);
}
