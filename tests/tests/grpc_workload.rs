//! The SPIFFE Workload API of `podca dev`, driven by a third-party client (the `spiffe` crate)
//! and by hand-made HTTP/2 frames for the `:authority` interop fix.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::io::{Read, Write};
use std::time::Duration;

use podca_proto::workload::X509BundlesRequest;
use podca_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use podca_tests::process::DevProcess;
use podca_tests::verify::{assert_verifies, der_to_pem};
use spiffe::{TrustDomain, WorkloadApiClient};
use tokio_stream::StreamExt;
use tonic::Code;

#[tokio::test(flavor = "multi_thread")]
async fn spiffe_client_fetches_an_svid_that_verifies_against_the_bundle() {
    let dev = DevProcess::start();
    let endpoint = format!("unix://{}", dev.socket.display());
    assert!(
        dev.banner
            .iter()
            .any(|l| l.contains(&format!("SPIFFE_ENDPOINT_SOCKET={endpoint}")))
    );
    let client = WorkloadApiClient::connect_to(&endpoint).await.unwrap();

    let svid = client.fetch_x509_svid().await.unwrap();
    assert_eq!(
        svid.spiffe_id().to_string(),
        "spiffe://podca.dev.local/ns/default/sa/default"
    );
    let bundles = client.fetch_x509_bundles().await.unwrap();
    let td = TrustDomain::new("podca.dev.local").unwrap();
    let bundle = bundles.get(&td).expect("a bundle for podca.dev.local");
    let anchors: Vec<&[u8]> = bundle.authorities().iter().map(|c| c.as_ref()).collect();
    let chain: Vec<&[u8]> = svid.cert_chain().iter().map(|c| c.as_ref()).collect();
    assert!(chain.len() >= 2, "leaf and issuing intermediate");
    assert_verifies(&der_to_pem(&chain), &der_to_pem(&anchors));
    assert_eq!(
        der_to_pem(&anchors),
        std::fs::read_to_string(dev.data_dir.join("root.pem")).unwrap()
    );
    // The private key matches the leaf.
    let leaf = x509_parser::parse_x509_certificate(chain[0]).unwrap().1;
    let key = rcgen::KeyPair::try_from(svid.private_key().as_ref()).unwrap();
    use rcgen::PublicKeyData;
    assert_eq!(
        leaf.public_key().raw,
        key.subject_public_key_info().as_slice()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rotation_pushes_new_svids_and_bundles_to_open_workload_streams() {
    let dev = DevProcess::start();
    let endpoint = format!("unix://{}", dev.socket.display());
    let client = WorkloadApiClient::connect_to(&endpoint).await.unwrap();
    let td = TrustDomain::new("podca.dev.local").unwrap();
    let mut contexts = client.stream_x509_contexts().await.unwrap();
    let mut bundles = client.stream_x509_bundles().await.unwrap();
    let first = contexts.next().await.unwrap().unwrap();
    let first_bundles = bundles.next().await.unwrap().unwrap();
    let old_anchor = first_bundles.get(&td).unwrap().authorities()[0]
        .as_ref()
        .to_vec();

    let new_anchors = dev.replace_ca_and_reload();
    let next = tokio::time::timeout(Duration::from_secs(10), contexts.next())
        .await
        .expect("a new X.509 context within 10 s")
        .unwrap()
        .unwrap();
    let next_bundles = tokio::time::timeout(Duration::from_secs(10), bundles.next())
        .await
        .expect("a new bundle within 10 s")
        .unwrap()
        .unwrap();
    let new_anchor = next_bundles.get(&td).unwrap().authorities()[0]
        .as_ref()
        .to_vec();
    assert_ne!(old_anchor, new_anchor);
    assert_eq!(der_to_pem(&[&new_anchor]), new_anchors);
    let svid = next.default_svid().unwrap();
    assert_ne!(
        svid.cert_chain()[0].as_ref(),
        first.default_svid().unwrap().cert_chain()[0].as_ref()
    );
    let chain: Vec<&[u8]> = svid.cert_chain().iter().map(|c| c.as_ref()).collect();
    assert_verifies(&der_to_pem(&chain), &new_anchors);
    let ctx_anchor = next.bundle_set().get(&td).unwrap().authorities()[0]
        .as_ref()
        .to_vec();
    assert_eq!(ctx_anchor, new_anchor);
}

#[tokio::test(flavor = "multi_thread")]
async fn workload_api_requires_its_header_and_refuses_jwt_when_disabled() {
    // JWT-SVIDs themselves: tests/tests/jwt_workload.rs.
    let dev = DevProcess::start_with(podca_tests::process::DevOptions {
        config: Some("[jwt]\nenabled = false\n"),
        ..Default::default()
    });
    let mut raw = SpiffeWorkloadApiClient::new(dev.unix_channel().await);
    let status = raw
        .fetch_x509_bundles(X509BundlesRequest {})
        .await
        .expect_err("no workload.spiffe.io header");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("workload.spiffe.io"),
        "{status:?}"
    );

    let mut request = tonic::Request::new(podca_proto::workload::JwtsvidRequest {
        audience: vec!["x".into()],
        spiffe_id: String::new(),
    });
    request
        .metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    let status = raw
        .fetch_jwtsvid(request)
        .await
        .expect_err("JWT is disabled");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert_eq!(
        status.message(),
        "JWT-SVIDs are disabled ([jwt] enabled = false)"
    );
}

/// A raw HTTP/2 client sends what grpcio and grpc-java send on Unix sockets: the socket path as
/// `:authority`. Without the fix, h2 answers RST_STREAM(PROTOCOL_ERROR).
#[test]
fn socket_path_authority_is_accepted() {
    let dev = DevProcess::start();
    let mut stream = std::os::unix::net::UnixStream::connect(&dev.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let frame = |t: u8, flags: u8, id: u32, payload: &[u8]| {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, t, flags];
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(payload);
        f
    };
    let authority = dev.socket.display().to_string();
    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/SpiffeWorkloadAPI/FetchX509Bundles"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"workload.spiffe.io", b"true"),
    ];
    let block = loona_hpack::Encoder::new().encode(headers);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    stream.write_all(&out).unwrap();

    let mut decoder = loona_hpack::Decoder::new();
    let mut status = None;
    loop {
        let mut head = [0u8; 9];
        stream.read_exact(&mut head).expect("the server answers");
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).unwrap();
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match head[3] {
            0x4 if head[4] & 0x1 == 0 => stream.write_all(&frame(0x4, 0x1, 0, &[])).unwrap(),
            0x1 if id == 1 => {
                let h = decoder.decode(&payload).unwrap();
                status = h
                    .iter()
                    .find(|(n, _)| n.as_slice() == b":status")
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
            }
            0x3 if id == 1 => panic!("RST_STREAM {:?}: the :authority was refused", payload),
            0x0 if id == 1 => {
                assert_eq!(status.as_deref(), Some("200"));
                assert!(payload.len() > 5, "a gRPC message with the bundle");
                return;
            }
            0x7 => panic!("GOAWAY {payload:?}"),
            _ => {}
        }
    }
}
