//! Envoy SDS (`envoy.service.secret.v3`) on `podca dev`'s Workload API socket, driven by a tonic
//! client generated from the vendored Envoy protos: the `default` certificate and the `ROOTCA`
//! validation context over state-of-the-world and delta, a new version after a CA change,
//! ACK/NACK and stale nonces, unknown names, and the shared stream limit.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::time::Duration;

use podca_proto::envoy_api::envoy::config::core::v3::data_source::Specifier;
use podca_proto::envoy_api::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use podca_proto::envoy_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use podca_proto::envoy_api::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use podca_proto::envoy_api::google::rpc;
use podca_proto::prost::Message;
use podca_tests::process::{DevOptions, DevProcess, podca_bundle};
use podca_tests::verify::assert_verifies;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
const SPIFFE_ID: &str = "spiffe://podca.dev.local/ns/default/sa/default";
const WAIT: Duration = Duration::from_secs(20);

async fn client(dev: &DevProcess) -> SecretDiscoveryServiceClient<Channel> {
    SecretDiscoveryServiceClient::new(dev.unix_channel().await)
}

fn request(names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.into(),
        resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
        type_url: SECRET.into(),
        response_nonce: nonce.into(),
        ..DiscoveryRequest::default()
    }
}

/// A state-of-the-world stream: the sender of its requests and its responses.
async fn sotw(
    client: &mut SecretDiscoveryServiceClient<Channel>,
    first: DiscoveryRequest,
) -> (mpsc::Sender<DiscoveryRequest>, Streaming<DiscoveryResponse>) {
    let (tx, rx) = mpsc::channel(8);
    tx.send(first).await.unwrap();
    let responses = client
        .stream_secrets(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, responses)
}

async fn next<T>(stream: &mut Streaming<T>) -> T {
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("an answer within 20 s")
        .unwrap()
        .expect("the stream is open")
}

fn secret_of(any: &prost_types::Any) -> Secret {
    assert_eq!(any.type_url, SECRET);
    Secret::decode(any.value.as_slice()).unwrap()
}

fn inline_text(
    source: Option<&podca_proto::envoy_api::envoy::config::core::v3::DataSource>,
) -> String {
    match source.and_then(|s| s.specifier.as_ref()) {
        Some(Specifier::InlineBytes(bytes)) => String::from_utf8(bytes.clone()).unwrap(),
        other => panic!("expected inline bytes, got {other:?}"),
    }
}

/// The `tls_certificate` in `secret`: its chain and key (PEM).
fn certificate(secret: &Secret) -> (String, String) {
    match &secret.r#type {
        Some(secret::Type::TlsCertificate(tls)) => (
            inline_text(tls.certificate_chain.as_ref()),
            inline_text(tls.private_key.as_ref()),
        ),
        other => panic!("{} is not a tls_certificate: {other:?}", secret.name),
    }
}

/// The `trusted_ca` of the `validation_context` in `secret`.
fn trusted_ca(secret: &Secret) -> String {
    match &secret.r#type {
        Some(secret::Type::ValidationContext(context)) => inline_text(context.trusted_ca.as_ref()),
        other => panic!("{} is not a validation_context: {other:?}", secret.name),
    }
}

/// Checks a certificate secret: the caller's SPIFFE ID, a key that matches the leaf, a chain
/// that openssl verifies under `anchors`. Returns the leaf's serial.
fn check_certificate(secret: &Secret, anchors: &str) -> Vec<u8> {
    let (chain, key) = certificate(secret);
    let ders = podca_signer::x509::certificates_from_pem(&chain).unwrap();
    let leaf = x509_parser::parse_x509_certificate(&ders[0]).unwrap().1;
    let uris: Vec<String> = leaf
        .subject_alternative_name()
        .unwrap()
        .expect("a SAN extension")
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(uris, [SPIFFE_ID]);
    let key = rcgen::KeyPair::from_pem(&key).unwrap();
    use rcgen::PublicKeyData;
    assert_eq!(
        leaf.public_key().raw,
        key.subject_public_key_info().as_slice(),
        "the key is the certificate's"
    );
    assert_verifies(&chain, anchors);
    leaf.raw_serial().to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn sotw_serves_the_certificate_and_rootca_and_pushes_a_ca_change() {
    let dev = DevProcess::start();
    let anchors = podca_bundle(&dev.data_dir);
    let mut client = client(&dev).await;

    let (cert_tx, mut certs) = sotw(&mut client, request(&["default"], "", "")).await;
    let first = next(&mut certs).await;
    assert_eq!(first.type_url, SECRET);
    assert_eq!(first.version_info, "1");
    assert_eq!(first.resources.len(), 1);
    let secret = secret_of(&first.resources[0]);
    assert_eq!(secret.name, "default");
    let old_serial = check_certificate(&secret, &anchors);
    cert_tx
        .send(request(&["default"], &first.version_info, &first.nonce))
        .await
        .unwrap();

    let (root_tx, mut roots) = sotw(&mut client, request(&["ROOTCA"], "", "")).await;
    let root = next(&mut roots).await;
    let secret = secret_of(&root.resources[0]);
    assert_eq!(secret.name, "ROOTCA");
    assert_eq!(
        trusted_ca(&secret),
        anchors,
        "the anchors podca bundle prints"
    );
    root_tx
        .send(request(&["ROOTCA"], &root.version_info, &root.nonce))
        .await
        .unwrap();

    let new_anchors = dev.replace_ca_and_reload();
    assert_ne!(new_anchors, anchors);
    let pushed = next(&mut roots).await;
    assert_eq!(pushed.version_info, "2");
    assert_ne!(pushed.nonce, root.nonce);
    assert_eq!(trusted_ca(&secret_of(&pushed.resources[0])), new_anchors);
    let renewed = next(&mut certs).await;
    assert_eq!(renewed.version_info, "2");
    let new_serial = check_certificate(&secret_of(&renewed.resources[0]), &new_anchors);
    assert_ne!(new_serial, old_serial, "a new SVID under the new CA");
    assert_eq!(podca_bundle(&dev.data_dir), new_anchors);
}

#[tokio::test(flavor = "multi_thread")]
async fn sotw_honours_nack_and_stale_nonces_and_leaves_unknown_names_out() {
    let dev = DevProcess::start();
    let anchors = podca_bundle(&dev.data_dir);
    let mut client = client(&dev).await;
    let (tx, mut responses) = sotw(&mut client, request(&["ROOTCA", "nope"], "", "")).await;
    let first = next(&mut responses).await;
    let names: Vec<String> = first.resources.iter().map(|r| secret_of(r).name).collect();
    assert_eq!(names, ["ROOTCA"], "the unknown name is left out");

    // A NACK of version 1: podca does not send the same content again…
    tx.send(DiscoveryRequest {
        error_detail: Some(rpc::Status {
            code: Code::InvalidArgument as i32,
            message: "Failed to load trusted CA certificates".into(),
            details: vec![],
        }),
        ..request(&["ROOTCA", "nope"], "", &first.nonce)
    })
    .await
    .unwrap();
    // …and a request with a nonce it never sent is stale, so its names are not served…
    tx.send(request(&["spiffe://podca.dev.local"], "", "not-a-nonce"))
        .await
        .unwrap();
    // …while new names with the current nonce are answered at once.
    tx.send(request(&["ROOTCA", "default", SPIFFE_ID], "", &first.nonce))
        .await
        .unwrap();
    let second = next(&mut responses).await;
    assert_eq!(second.version_info, "2", "nothing was sent in between");
    let secrets: Vec<Secret> = second.resources.iter().map(secret_of).collect();
    let names: Vec<&str> = secrets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["ROOTCA", "default", SPIFFE_ID]);
    assert_eq!(trusted_ca(&secrets[0]), anchors);
    // The default name and the SPIFFE ID name the same SVID.
    assert_eq!(certificate(&secrets[1]), certificate(&secrets[2]));
    check_certificate(&secrets[1], &anchors);

    // Another resource type is refused precisely, ending the stream.
    tx.send(DiscoveryRequest {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        ..request(&["x"], "2", &second.nonce)
    })
    .await
    .unwrap();
    let status = tokio::time::timeout(WAIT, responses.message())
        .await
        .unwrap()
        .expect_err("another type ends the stream");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains(
            "the request asks for \"type.googleapis.com/envoy.config.cluster.v3.Cluster\""
        ),
        "{status:?}"
    );
}

async fn delta(
    client: &mut SecretDiscoveryServiceClient<Channel>,
    first: DeltaDiscoveryRequest,
) -> (
    mpsc::Sender<DeltaDiscoveryRequest>,
    Streaming<DeltaDiscoveryResponse>,
) {
    let (tx, rx) = mpsc::channel(8);
    tx.send(first).await.unwrap();
    let responses = client
        .delta_secrets(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, responses)
}

fn subscribe(names: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: SECRET.into(),
        resource_names_subscribe: names.iter().map(|n| (*n).to_owned()).collect(),
        response_nonce: nonce.into(),
        ..DeltaDiscoveryRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_sends_each_resource_once_per_version_and_removes_unknown_names() {
    let dev = DevProcess::start();
    let anchors = podca_bundle(&dev.data_dir);
    let mut client = client(&dev).await;
    let (tx, mut responses) =
        delta(&mut client, subscribe(&["default", "ROOTCA", "nope"], "")).await;
    let first = next(&mut responses).await;
    assert_eq!(first.type_url, SECRET);
    assert_eq!(first.removed_resources, ["nope"]);
    let names: Vec<&str> = first.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["ROOTCA", "default"]);
    let root_version = first.resources[0].version.clone();
    let root = secret_of(first.resources[0].resource.as_ref().unwrap());
    assert_eq!(trusted_ca(&root), anchors);
    let cert = secret_of(first.resources[1].resource.as_ref().unwrap());
    let old_serial = check_certificate(&cert, &anchors);

    // ACK, and subscribe to one more name: only that one comes.
    tx.send(subscribe(&["spiffe://podca.dev.local"], &first.nonce))
        .await
        .unwrap();
    let second = next(&mut responses).await;
    let names: Vec<&str> = second.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["spiffe://podca.dev.local"]);
    assert!(second.removed_resources.is_empty());
    assert_eq!(
        trusted_ca(&secret_of(second.resources[0].resource.as_ref().unwrap())),
        anchors
    );
    tx.send(subscribe(&[], &second.nonce)).await.unwrap();

    // A CA change: new versions of the certificate and of both validation contexts.
    let new_anchors = dev.replace_ca_and_reload();
    let mut seen = std::collections::BTreeMap::new();
    while seen.len() < 3 {
        let pushed = next(&mut responses).await;
        for resource in pushed.resources {
            seen.insert(resource.name.clone(), resource);
        }
        tx.send(subscribe(&[], &pushed.nonce)).await.unwrap();
    }
    assert_ne!(seen["ROOTCA"].version, root_version);
    assert_eq!(
        trusted_ca(&secret_of(seen["ROOTCA"].resource.as_ref().unwrap())),
        new_anchors
    );
    let serial = check_certificate(
        &secret_of(seen["default"].resource.as_ref().unwrap()),
        &new_anchors,
    );
    assert_ne!(serial, old_serial);
}

#[tokio::test(flavor = "multi_thread")]
async fn fetch_secrets_answers_once_and_refuses_other_types() {
    let dev = DevProcess::start();
    let anchors = podca_bundle(&dev.data_dir);
    let mut client = client(&dev).await;
    let answer = client
        .fetch_secrets(request(&["default", "ROOTCA"], "", ""))
        .await
        .unwrap()
        .into_inner();
    let secrets: Vec<Secret> = answer.resources.iter().map(secret_of).collect();
    assert_eq!(secrets[0].name, "ROOTCA");
    assert_eq!(trusted_ca(&secrets[0]), anchors);
    assert_eq!(secrets[1].name, "default");
    check_certificate(&secrets[1], &anchors);
    assert!(answer.nonce.is_empty());

    let status = client
        .fetch_secrets(DiscoveryRequest {
            type_url: "type.googleapis.com/envoy.config.listener.v3.Listener".into(),
            ..request(&["default"], "", "")
        })
        .await
        .expect_err("another type");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sds_streams_share_the_workload_api_stream_limit_and_can_be_turned_off() {
    let dev = DevProcess::start_with(DevOptions {
        config: Some("[grpc]\nmax_open_streams = 1\n"),
        ..Default::default()
    });
    let mut client = client(&dev).await;
    let (_tx, mut open) = sotw(&mut client, request(&["ROOTCA"], "", "")).await;
    next(&mut open).await;
    let (tx, rx) = mpsc::channel(1);
    tx.send(request(&["ROOTCA"], "", "")).await.unwrap();
    let status = client
        .stream_secrets(ReceiverStream::new(rx))
        .await
        .expect_err("the one stream slot is taken");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    drop(dev);

    let off = DevProcess::start_with(DevOptions {
        config: Some("[workload_api]\nsds = false\n"),
        ..Default::default()
    });
    let status = client_for_off(&off).await;
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
}

async fn client_for_off(dev: &DevProcess) -> tonic::Status {
    client(dev)
        .await
        .fetch_secrets(request(&["default"], "", ""))
        .await
        .expect_err("SDS is off")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_federated_trust_domain_is_served_as_its_own_validation_context() {
    // A foreign trust domain's CA and its SPIFFE bundle, the [[federation]] entry's initial
    // bundle (its endpoint is unreachable: the initial bundle stays in force).
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let foreign = params.self_signed(&key).unwrap();
    let foreign = podca_signer::CaCertificate::from_der(foreign.der()).unwrap();
    let bundle =
        podca_signer::spiffe_bundle::SpiffeBundle::of(std::slice::from_ref(&foreign), None, 300);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("away.test.json");
    std::fs::write(&path, bundle.to_json().unwrap()).unwrap();
    let config = format!(
        "[[federation]]\ntrust_domain = \"away.test\"\n\
         bundle_endpoint_url = \"https://127.0.0.1:9/\"\nprofile = \"https_spiffe\"\n\
         endpoint_spiffe_id = \"spiffe://away.test/podca-bundle\"\n\
         initial_bundle = \"{}\"\n",
        path.display()
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        ..Default::default()
    });
    let mut client = client(&dev).await;
    let (tx, mut responses) = sotw(&mut client, request(&["spiffe://away.test"], "", "")).await;
    // The first answer may precede the fetcher's start; the bundle is pushed when it arrives.
    let mut answer = next(&mut responses).await;
    while answer.resources.is_empty() {
        tx.send(request(
            &["spiffe://away.test"],
            &answer.version_info,
            &answer.nonce,
        ))
        .await
        .unwrap();
        answer = next(&mut responses).await;
    }
    let secret = secret_of(&answer.resources[0]);
    assert_eq!(secret.name, "spiffe://away.test");
    assert_eq!(trusted_ca(&secret), foreign.pem());

    // No names: every resource, under SPIRE's names, the federated one included.
    let all = client
        .fetch_secrets(request(&[], "", ""))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<String> = all.resources.iter().map(|r| secret_of(r).name).collect();
    assert_eq!(
        names,
        ["spiffe://away.test", "spiffe://podca.dev.local", SPIFFE_ID]
    );
}
