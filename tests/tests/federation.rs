//! SPIFFE bundles beyond one podca (issue #43): the SPIFFE bundle document `podca bundle
//! --spiffe` prints, read by code that is not podca's (the `spiffe` crate's bundle types), and
//! compared with what the Workload API hands out and with `podca bundle`'s PEM; the bundle
//! endpoint serving it over `https_spiffe`, its SVID checked by webpki.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use podca_tests::process::{
    DevOptions, DevProcess, podca_binary, podca_bundle, podca_ca_init, podca_ca_rotate,
};
use podca_tests::verify::{der_to_pem, leaf_uris, openssl_verify, webpki_verify};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use spiffe::{JwtBundle, TrustDomain, WorkloadApiClient, X509Bundle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TRUST_DOMAIN: &str = "podca.dev.local";

/// `podca bundle --spiffe --dir dir`, parsed as JSON.
fn spiffe_document(dir: &Path) -> serde_json::Value {
    let out = Command::new(podca_binary())
        .args(["bundle", "--spiffe", "--dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podca bundle --spiffe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The document's keys of one `use`.
fn keys_of<'a>(document: &'a serde_json::Value, key_use: &str) -> Vec<&'a serde_json::Value> {
    document["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["use"] == key_use)
        .collect()
}

/// The document's X.509 authorities as the `spiffe` crate reads them (each key's single x5c
/// certificate, concatenated DER).
fn x509_bundle(document: &serde_json::Value) -> X509Bundle {
    let mut der = Vec::new();
    for key in keys_of(document, "x509-svid") {
        let x5c = key["x5c"].as_array().unwrap();
        assert_eq!(x5c.len(), 1, "one certificate per x509-svid key: {key}");
        der.extend(STANDARD.decode(x5c[0].as_str().unwrap()).unwrap());
    }
    X509Bundle::parse_from_der(TrustDomain::new(TRUST_DOMAIN).unwrap(), &der).unwrap()
}

/// The document's JWT authorities as the `spiffe` crate reads them.
fn jwt_bundle(document: &serde_json::Value) -> JwtBundle {
    let jwks = serde_json::json!({ "keys": keys_of(document, "jwt-svid") });
    JwtBundle::from_jwt_authorities(
        TrustDomain::new(TRUST_DOMAIN).unwrap(),
        jwks.to_string().as_bytes(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_spiffe_bundle_is_what_the_workload_api_and_podca_bundle_hand_out() {
    let dev = DevProcess::start();
    let client = WorkloadApiClient::connect_to(&format!("unix://{}", dev.socket.display()))
        .await
        .unwrap();
    let td = TrustDomain::new(TRUST_DOMAIN).unwrap();
    let document = spiffe_document(&dev.data_dir);

    // X.509: the Workload API's anchors, and `podca bundle`'s PEM, in the same order.
    let x509 = x509_bundle(&document);
    let served = client.fetch_x509_bundles().await.unwrap();
    let served = served.get(&td).expect("a bundle for podca.dev.local");
    let ours: Vec<&[u8]> = x509.authorities().iter().map(|c| c.as_ref()).collect();
    let theirs: Vec<&[u8]> = served.authorities().iter().map(|c| c.as_ref()).collect();
    assert!(!ours.is_empty());
    assert_eq!(ours, theirs);
    assert_eq!(der_to_pem(&ours), podca_bundle(&dev.data_dir));
    for key in keys_of(&document, "x509-svid") {
        assert_eq!(key["kty"], "EC", "the CA's key parameters: {key}");
        assert!(
            key.get("kid").is_none(),
            "x509-svid keys carry no kid: {key}"
        );
    }

    // JWT: every key the Workload API publishes, by kid, with the same parameters.
    let jwt = jwt_bundle(&document);
    let served_jwt = client.fetch_jwt_bundles().await.unwrap();
    let served_jwt = served_jwt
        .get(&td)
        .expect("a JWT bundle for podca.dev.local");
    let kids: Vec<&str> = keys_of(&document, "jwt-svid")
        .iter()
        .map(|k| k["kid"].as_str().unwrap())
        .collect();
    assert!(!kids.is_empty(), "dev publishes a JWT key");
    for kid in &kids {
        assert_eq!(
            jwt.find_jwt_authority(kid),
            served_jwt.find_jwt_authority(kid),
            "{kid}"
        );
    }

    // The default propagation window is 900 s: consumers refresh every 300 s.
    assert_eq!(document["spiffe_refresh_hint"], 300);
    assert!(document["spiffe_sequence"].as_u64().is_some());
}

#[test]
fn a_rotation_step_raises_the_sequence_and_replicas_agree() {
    let dir = tempfile::tempdir().unwrap();
    podca_ca_init(dir.path());
    let before = spiffe_document(dir.path());
    let sequence = before["spiffe_sequence"].as_u64().expect("a sequence");
    let anchors = x509_bundle(&before).authorities().len();

    // `podca ca rotate` prepares a CA: its anchor is published, with a higher sequence.
    podca_ca_rotate(dir.path());
    let rotated = spiffe_document(dir.path());
    assert_eq!(x509_bundle(&rotated).authorities().len(), anchors + 1);
    assert!(rotated["spiffe_sequence"].as_u64().unwrap() > sequence);
    // The same state always gives the same document: replicas serve the same sequence.
    assert_eq!(spiffe_document(dir.path()), rotated);
}

/// Keeps the server's chain; with `expect`, also checks it the way a SPIFFE consumer does:
/// webpki against the trust domain's anchors (PEM; rustls' own verifier needs a DNS name, an
/// X.509-SVID carries only its SPIFFE ID) and the leaf's only URI SAN. Without `expect` it
/// accepts any chain, for the test to verify afterwards.
#[derive(Debug, Default)]
struct Recorder {
    chain: Mutex<Vec<Vec<u8>>>,
    /// (anchors PEM, the SPIFFE ID the leaf must carry).
    expect: Option<(String, String)>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut chain = vec![end_entity.to_vec()];
        chain.extend(intermediates.iter().map(|c| c.to_vec()));
        if let Some((anchors, want)) = &self.expect {
            let ders: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
            let pem = der_to_pem(&ders);
            webpki_verify(&pem, anchors)
                .map_err(|e| rustls::Error::General(format!("webpki: {e:?}")))?;
            if leaf_uris(&pem) != [want.clone()] {
                return Err(rustls::Error::General(format!("not {want}")));
            }
        }
        *self.chain.lock().unwrap() = chain;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms =
            rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, &algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms =
            rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, &algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// One HTTPS request to `addr`: the server's chain (PEM), the status line and the body.
async fn https_request(addr: &str, request: &str) -> (String, String, Vec<u8>) {
    let recorder = Arc::new(Recorder::default());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::clone(&recorder) as Arc<dyn ServerCertVerifier>)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("bundle.test").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.unwrap();
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head.lines().next().unwrap().to_owned();
    let chain = recorder.chain.lock().unwrap().clone();
    let chain: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
    (der_to_pem(&chain), status, answer[split + 4..].to_vec())
}

const ENDPOINT_ID: &str = "spiffe://podca.dev.local/podca/bundle-endpoint";

#[tokio::test(flavor = "multi_thread")]
async fn the_https_spiffe_endpoint_serves_podca_bundle_under_its_own_svid() {
    let config = format!(
        "[bundle_endpoint]\nlisten = \"127.0.0.1:0\"\nprofile = \"https_spiffe\"\n\
         spiffe_id = \"{ENDPOINT_ID}\"\n"
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        ..DevOptions::default()
    });
    let prefix = "podca dev: SPIFFE bundle endpoint for podca.dev.local on https://";
    let addr = dev
        .banner
        .iter()
        .find_map(|l| l.strip_prefix(prefix))
        .expect("the banner names the bundle endpoint")
        .trim_end_matches('/')
        .to_owned();

    let (chain, status, body) = https_request(
        &addr,
        "GET / HTTP/1.1\r\nHost: bundle.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    // The endpoint's SVID: the configured ID as its only URI SAN, under the served bundle.
    let anchors = podca_bundle(&dev.data_dir);
    webpki_verify(&chain, &anchors).expect("the endpoint's SVID verifies under the bundle");
    assert_eq!(leaf_uris(&chain), [ENDPOINT_ID]);
    // The document is the one `podca bundle --spiffe` prints.
    let served: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(served, spiffe_document(&dev.data_dir));
    assert_eq!(
        der_to_pem(
            &x509_bundle(&served)
                .authorities()
                .iter()
                .map(|c| c.as_ref())
                .collect::<Vec<_>>()
        ),
        anchors
    );

    // One path, GET only.
    let (_, status, _) = https_request(
        &addr,
        "POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    let (_, status, _) = https_request(
        &addr,
        "GET /keys HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, "HTTP/1.1 404 Not Found");
}

/// The address `podca dev` printed for its bundle endpoint.
fn endpoint_addr(dev: &DevProcess) -> String {
    let prefix = "podca dev: SPIFFE bundle endpoint for ";
    dev.banner
        .iter()
        .find_map(|l| l.strip_prefix(prefix)?.split_once(" on https://"))
        .expect("the banner names the bundle endpoint")
        .1
        .trim_end_matches('/')
        .to_owned()
}

/// Waits up to `seconds` for `path` to hold a document that `accept` takes.
fn wait_for_document(
    path: &Path,
    seconds: u64,
    accept: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(doc) = std::fs::read(path)
            .ok()
            .and_then(|json| serde_json::from_slice::<serde_json::Value>(&json).ok())
            .filter(|doc| accept(doc))
        {
            return doc;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not get the expected bundle within {seconds} s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_podca_follows_the_first_ones_bundle_through_a_rotation() {
    // A: podca.dev.local, serving its bundle over https_spiffe.
    let a_config = format!(
        "[bundle_endpoint]\nlisten = \"127.0.0.1:0\"\nprofile = \"https_spiffe\"\n\
         spiffe_id = \"{ENDPOINT_ID}\"\n"
    );
    let a = DevProcess::start_with(DevOptions {
        config: Some(&a_config),
        ..DevOptions::default()
    });
    let addr = endpoint_addr(&a);
    let initial_dir = tempfile::tempdir().unwrap();
    let initial = initial_dir.path().join("podca.dev.local.json");
    std::fs::write(
        &initial,
        serde_json::to_vec(&spiffe_document(&a.data_dir)).unwrap(),
    )
    .unwrap();

    // B: another trust domain that federates with A, refreshing every second.
    let b_config = format!(
        "[signers.\"podca.dev/b\"]\ntrust_domain = \"b.test\"\n\
         federates_with = [\"podca.dev.local\"]\n\n\
         [[federation]]\ntrust_domain = \"podca.dev.local\"\n\
         bundle_endpoint_url = \"https://{addr}/\"\nprofile = \"https_spiffe\"\n\
         endpoint_spiffe_id = \"{ENDPOINT_ID}\"\ninitial_bundle = \"{}\"\n\
         min_refresh_seconds = 1\nmax_refresh_seconds = 1\n",
        initial.display()
    );
    let b_data = tempfile::tempdir().unwrap();
    let b = DevProcess::start_with(DevOptions {
        config: Some(&b_config),
        data_dir: Some(b_data.path().join("data")),
        ..DevOptions::default()
    });
    let kept = b.data_dir.join("federation").join("podca.dev.local.json");
    let first = wait_for_document(&kept, 20, |_| true);
    assert_eq!(first, spiffe_document(&a.data_dir));
    let sequence = first["spiffe_sequence"].as_u64().unwrap();

    // A rotates: B's kept bundle follows within a few refreshes, fetched from A's endpoint
    // whose SVID A renews from its new active CA as needed.
    podca_ca_rotate(&a.data_dir);
    let rotated = wait_for_document(&kept, 30, |doc| {
        doc["spiffe_sequence"]
            .as_u64()
            .is_some_and(|s| s > sequence)
    });
    assert_eq!(rotated, spiffe_document(&a.data_dir));
    assert_eq!(x509_bundle(&rotated).authorities().len(), 2);

    // Restarted with neither A nor the initial bundle at hand, B starts from the bundle it
    // kept (an unreadable initial_bundle would stop its start).
    assert!(a.stop().success());
    assert!(b.stop().success());
    std::fs::remove_file(&initial).unwrap();
    let b = DevProcess::start_with(DevOptions {
        config: Some(&b_config),
        data_dir: Some(b_data.path().join("data")),
        ..DevOptions::default()
    });
    assert_eq!(wait_for_document(&kept, 1, |_| true), rotated);
    assert!(b.stop().success());
}

/// A Web PKI CA (PEM) and a certificate and key (PEM) for `localhost` from it.
fn web_pki_localhost() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "ingress PKI root");
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (ca_pem, leaf.pem(), key.serialize_pem())
}

fn federation_status(config: &Path, data_dir: &Path) -> (bool, String, String) {
    let out = Command::new(podca_binary())
        .args(["federation", "status", "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `https_web`: A serves its bundle under an operator certificate for `localhost`; B fetches
/// it with no initial bundle, checking the chain against the operator's roots and the URL's
/// host, hands it to its workloads, and `podca federation status` reports it. The same
/// endpoint reached as `127.0.0.1` (a name its certificate lacks) is never accepted.
#[tokio::test(flavor = "multi_thread")]
async fn an_https_web_endpoint_is_checked_against_web_roots_and_its_host() {
    let dir = tempfile::tempdir().unwrap();
    let (roots, cert, key) = web_pki_localhost();
    let (roots_file, cert_file, key_file) = (
        dir.path().join("roots.pem"),
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
    );
    std::fs::write(&roots_file, roots).unwrap();
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let a_config = format!(
        "[bundle_endpoint]\nlisten = \"127.0.0.1:0\"\nprofile = \"https_web\"\n\
         cert_file = {cert_file:?}\nkey_file = {key_file:?}\n"
    );
    let a = DevProcess::start_with(DevOptions {
        config: Some(&a_config),
        ..DevOptions::default()
    });
    let port = endpoint_addr(&a).rsplit_once(':').unwrap().1.to_owned();

    let b_config = format!(
        "[signers.\"podca.dev/b\"]\ntrust_domain = \"b.test\"\n\
         federates_with = [\"podca.dev.local\", \"misnamed.test\"]\n\n\
         [[federation]]\ntrust_domain = \"podca.dev.local\"\n\
         bundle_endpoint_url = \"https://localhost:{port}/\"\nprofile = \"https_web\"\n\
         ca_file = {roots_file:?}\nmin_refresh_seconds = 1\nmax_refresh_seconds = 1\n\n\
         [[federation]]\ntrust_domain = \"misnamed.test\"\n\
         bundle_endpoint_url = \"https://127.0.0.1:{port}/\"\nprofile = \"https_web\"\n\
         ca_file = {roots_file:?}\nmin_refresh_seconds = 1\nmax_refresh_seconds = 1\n"
    );
    let b_config_file = dir.path().join("b.toml");
    std::fs::write(&b_config_file, &b_config).unwrap();
    let b_data = dir.path().join("b-data");
    let b = DevProcess::start_with(DevOptions {
        config: Some(&b_config),
        data_dir: Some(b_data.clone()),
        ..DevOptions::default()
    });
    let (_, anchors) = svid_and_peer_bundle(&b, TRUST_DOMAIN).await;
    let a_anchors: Vec<CertificateDer<'static>> = x509_bundle(&spiffe_document(&a.data_dir))
        .authorities()
        .iter()
        .map(|c| CertificateDer::from(c.as_ref().to_vec()))
        .collect();
    assert_eq!(anchors, a_anchors);
    let kept = b_data.join("federation").join("podca.dev.local.json");
    let document = wait_for_document(&kept, 10, |_| true);
    assert_eq!(document, spiffe_document(&a.data_dir));

    let (ok, out, err) = federation_status(&b_config_file, &b_data);
    assert!(!ok, "misnamed.test was never fetched: {out}");
    assert!(
        out.contains("podca.dev.local: fresh\n")
            && out.contains(&format!(
                "  sequence      {}\n",
                document["spiffe_sequence"].as_u64().unwrap()
            ))
            && out.contains("  anchors       1 X.509, 1 JWT\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "misnamed.test: never fetched (no last good bundle kept yet)\n  source        \
             https://127.0.0.1:{port}/ (https_web, roots {})",
            roots_file.display()
        )),
        "{out}"
    );
    assert!(
        err.contains("1 of 2 foreign trust domains are stale, expired or never fetched"),
        "{err}"
    );
    assert!(
        !b_data
            .join("federation")
            .join("misnamed.test.json")
            .exists()
    );
    assert!(b.stop().success());
    assert!(a.stop().success());
}

/// A workload's X.509-SVID and what its Workload API says to trust for `peer` (a federated
/// trust domain), waiting up to 20 s for that bundle to arrive.
async fn svid_and_peer_bundle(
    dev: &DevProcess,
    peer: &str,
) -> (spiffe::X509Svid, Vec<CertificateDer<'static>>) {
    let client = WorkloadApiClient::connect_to(&format!("unix://{}", dev.socket.display()))
        .await
        .unwrap();
    let td = TrustDomain::new(peer).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let anchors = loop {
        let bundles = client.fetch_x509_bundles().await.unwrap();
        if let Some(bundle) = bundles.get(&td) {
            break bundle
                .authorities()
                .iter()
                .map(|c| CertificateDer::from(c.as_ref().to_vec()))
                .collect::<Vec<_>>();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no federated bundle for {peer} from the Workload API within 20 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    (client.fetch_x509_svid().await.unwrap(), anchors)
}

/// One mutual-TLS handshake in memory: `server` presents its SVID and checks the client against
/// `server_trusts`; `client` presents its SVID and checks the server (`server_id`) against
/// `client_trusts`.
fn mutual_tls(
    server: &spiffe::X509Svid,
    server_trusts: &[CertificateDer<'static>],
    client: &spiffe::X509Svid,
    client_trusts: &[CertificateDer<'static>],
) -> Result<(), String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain = |svid: &spiffe::X509Svid| -> Vec<CertificateDer<'static>> {
        svid.cert_chain()
            .iter()
            .map(|c| CertificateDer::from(c.as_ref().to_vec()))
            .collect()
    };
    let key = |svid: &spiffe::X509Svid| {
        rustls::pki_types::PrivateKeyDer::Pkcs8(svid.private_key().as_ref().to_vec().into())
    };
    let mut roots = rustls::RootCertStore::empty();
    for anchor in server_trusts {
        roots.add(anchor.clone()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .unwrap();
    let server_config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain(server), key(server))
        .unwrap();
    let anchors: Vec<&[u8]> = client_trusts.iter().map(|c| c.as_ref()).collect();
    let spiffe_server = Recorder {
        expect: Some((der_to_pem(&anchors), server.spiffe_id().to_string())),
        ..Recorder::default()
    };
    let client_config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(spiffe_server))
        .with_client_auth_cert(chain(client), key(client))
        .unwrap();
    let name = ServerName::try_from("workload.test").unwrap();
    let mut c = rustls::ClientConnection::new(Arc::new(client_config), name).unwrap();
    let mut s = rustls::ServerConnection::new(Arc::new(server_config)).unwrap();
    podca_tests::tls::handshake_in_memory(&mut c, &mut s)?;
    match s.peer_certificates() {
        Some(certs) if !certs.is_empty() => Ok(()),
        _ => Err("the server saw no client certificate".into()),
    }
}

/// An SVID's chain as PEM.
fn chain_pem(svid: &spiffe::X509Svid) -> String {
    let ders: Vec<&[u8]> = svid.cert_chain().iter().map(|c| c.as_ref()).collect();
    der_to_pem(&ders)
}

/// Trust anchors as PEM.
fn anchors_pem(anchors: &[CertificateDer<'static>]) -> String {
    let ders: Vec<&[u8]> = anchors.iter().map(|c| c.as_ref()).collect();
    der_to_pem(&ders)
}

/// [`mutual_tls`] between `openssl s_server` and `openssl s_client` over loopback: the server
/// requires a client certificate and both sides abort on a verification error. Ok when the
/// client got the server's status page naming a client certificate; else openssl's output.
fn openssl_mutual_tls(
    server: &spiffe::X509Svid,
    server_trusts: &[CertificateDer<'static>],
    client: &spiffe::X509Svid,
    client_trusts: &[CertificateDer<'static>],
) -> Result<(), String> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let key_pem = |svid: &spiffe::X509Svid| {
        pem::encode(&pem::Pem::new(
            "PRIVATE KEY",
            svid.private_key().as_ref().to_vec(),
        ))
    };
    // `-cert` takes the leaf only; the intermediates go in `-cert_chain`.
    let split = |svid: &spiffe::X509Svid| {
        let ders: Vec<&[u8]> = svid.cert_chain().iter().map(|c| c.as_ref()).collect();
        (der_to_pem(&ders[..1]), der_to_pem(&ders[1..]))
    };
    let ((server_leaf, server_chain), (client_leaf, client_chain)) = (split(server), split(client));
    let (server_cert, server_chain, server_key, server_ca) = (
        write("server.pem", server_leaf),
        write("server-chain.pem", server_chain),
        write("server.key", key_pem(server)),
        write("server-trusts.pem", anchors_pem(server_trusts)),
    );
    let (client_cert, client_chain, client_key, client_ca) = (
        write("client.pem", client_leaf),
        write("client-chain.pem", client_chain),
        write("client.key", key_pem(client)),
        write("client-trusts.pem", anchors_pem(client_trusts)),
    );
    let port = podca_tests::process::free_port().to_string();
    let mut s_server = Command::new("openssl")
        .args([
            "s_server",
            "-accept",
            &format!("127.0.0.1:{port}"),
            "-naccept",
            "1",
        ])
        .args(["-www", "-Verify", "1", "-verify_return_error", "-cert"])
        .arg(&server_cert)
        .arg("-cert_chain")
        .arg(&server_chain)
        .arg("-key")
        .arg(&server_key)
        .arg("-CAfile")
        .arg(&server_ca)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl is installed");
    // s_server says ACCEPT once it listens.
    let mut lines = BufReader::new(s_server.stdout.take().unwrap()).lines();
    let listening = lines
        .by_ref()
        .any(|l| l.is_ok_and(|l| l.starts_with("ACCEPT")));
    assert!(listening, "openssl s_server did not listen");
    let mut s_client = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-verify_return_error", "-ign_eof", "-cert"])
        .arg(&client_cert)
        .arg("-cert_chain")
        .arg(&client_chain)
        .arg("-key")
        .arg(&client_key)
        .arg("-CAfile")
        .arg(&client_ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl is installed");
    s_client
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET / HTTP/1.0\r\n\r\n")
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while s_client.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            for child in [&mut s_client, &mut s_server] {
                let _ = child.kill();
                let _ = child.wait();
            }
            return Err("openssl s_client did not finish within 20 s".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = s_client.wait_with_output().unwrap();
    let _ = s_server.kill();
    let _ = s_server.wait();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let page_names_a_client_cert =
        text.contains("HTTP/1.0 200 ok") && !text.contains("no client certificate available");
    if out.status.success() && page_names_a_client_cert {
        Ok(())
    } else {
        Err(text)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn workloads_of_two_federated_trust_domains_complete_mutual_tls() {
    // Two podca dev, podca.dev.local (A) and b.test (B), each serving its bundle over
    // https_spiffe and federating with the other from an initial bundle.
    let work = tempfile::tempdir().unwrap();
    let (a_data, b_data) = (work.path().join("a"), work.path().join("b"));
    podca_ca_init(&a_data);
    podca_ca_init(&b_data);
    let (a_port, b_port) = (
        podca_tests::process::free_port(),
        podca_tests::process::free_port(),
    );
    let (a_initial, b_initial) = (work.path().join("a.json"), work.path().join("b.json"));
    std::fs::write(&a_initial, spiffe_document(&a_data).to_string()).unwrap();
    std::fs::write(&b_initial, spiffe_document(&b_data).to_string()).unwrap();
    let b_endpoint_id = "spiffe://b.test/podca/bundle-endpoint";
    let config = |signer: &str, own: (u16, &str), peer: (&str, u16, &str, &Path)| {
        format!(
            "{signer}[bundle_endpoint]\nlisten = \"127.0.0.1:{}\"\nprofile = \"https_spiffe\"\n\
             spiffe_id = \"{}\"\n\n[[federation]]\ntrust_domain = \"{}\"\n\
             bundle_endpoint_url = \"https://127.0.0.1:{}/\"\nprofile = \"https_spiffe\"\n\
             endpoint_spiffe_id = \"{}\"\ninitial_bundle = \"{}\"\n\
             min_refresh_seconds = 1\nmax_refresh_seconds = 1\n",
            own.0,
            own.1,
            peer.0,
            peer.1,
            peer.2,
            peer.3.display()
        )
    };
    let a_config = config(
        "",
        (a_port, ENDPOINT_ID),
        ("b.test", b_port, b_endpoint_id, &b_initial),
    );
    let b_config = config(
        "[signers.\"podca.dev/b\"]\ntrust_domain = \"b.test\"\nfederates_with = [\"podca.dev.local\"]\n\n",
        (b_port, b_endpoint_id),
        (TRUST_DOMAIN, a_port, ENDPOINT_ID, &a_initial),
    );
    let a = DevProcess::start_with(DevOptions {
        config: Some(&a_config),
        data_dir: Some(a_data.clone()),
        ..DevOptions::default()
    });
    let b = DevProcess::start_with(DevOptions {
        config: Some(&b_config),
        data_dir: Some(b_data.clone()),
        ..DevOptions::default()
    });

    // Each workload learns the other trust domain's bundle from its own Workload API (the
    // `spiffe` crate), and the two complete mutual TLS in both directions.
    let (a_svid, a_trusts_b) = svid_and_peer_bundle(&a, "b.test").await;
    let (b_svid, b_trusts_a) = svid_and_peer_bundle(&b, TRUST_DOMAIN).await;
    assert_eq!(
        b_svid.spiffe_id().to_string(),
        "spiffe://b.test/ns/default/sa/default"
    );
    mutual_tls(&a_svid, &a_trusts_b, &b_svid, &b_trusts_a).expect("A serves, B connects");
    mutual_tls(&b_svid, &b_trusts_a, &a_svid, &a_trusts_b).expect("B serves, A connects");
    // Not without federation: B's own bundle does not make A's workload a peer.
    let b_own: Vec<CertificateDer<'static>> = pem::parse_many(podca_bundle(&b_data))
        .unwrap()
        .into_iter()
        .map(|p| CertificateDer::from(p.into_contents()))
        .collect();
    assert!(mutual_tls(&a_svid, &a_trusts_b, &b_svid, &b_own).is_err());
    // The same boundary through an implementation independent of aws-lc: openssl's s_server
    // and s_client complete mutual TLS with the federated bundles, and not with B's own; and
    // `openssl verify` takes each SVID's chain under the bundle the peer federated and refuses
    // it under the peer's own bundle (no issuer there).
    openssl_mutual_tls(&a_svid, &a_trusts_b, &b_svid, &b_trusts_a)
        .expect("openssl: A serves, B connects");
    openssl_mutual_tls(&b_svid, &b_trusts_a, &a_svid, &a_trusts_b)
        .expect("openssl: B serves, A connects");
    let failed = openssl_mutual_tls(&a_svid, &a_trusts_b, &b_svid, &b_own)
        .expect_err("openssl: B's client trusting only B's own bundle");
    assert!(
        failed.contains("unable to get local issuer certificate"),
        "{failed}"
    );
    openssl_verify(&chain_pem(&a_svid), &anchors_pem(&b_trusts_a))
        .expect("openssl: A's SVID under the bundle B federated");
    openssl_verify(&chain_pem(&b_svid), &anchors_pem(&a_trusts_b))
        .expect("openssl: B's SVID under the bundle A federated");
    let refused = openssl_verify(&chain_pem(&a_svid), &anchors_pem(&b_own))
        .expect_err("openssl: A's SVID under B's own bundle");
    assert_eq!(
        refused.code,
        Some(podca_tests::verify::UNABLE_TO_GET_LOCAL_ISSUER),
        "{refused}"
    );

    // A JWT-SVID of A validates at B's Workload API (a federated trust domain's token).
    let a_client = WorkloadApiClient::connect_to(&format!("unix://{}", a.socket.display()))
        .await
        .unwrap();
    let token = a_client.fetch_jwt_svid(["b-service"], None).await.unwrap();
    let b_client = WorkloadApiClient::connect_to(&format!("unix://{}", b.socket.display()))
        .await
        .unwrap();
    let validated = b_client
        .validate_jwt_token("b-service", token.token())
        .await
        .expect("B validates A's JWT-SVID");
    assert_eq!(
        validated.spiffe_id().to_string(),
        "spiffe://podca.dev.local/ns/default/sa/default"
    );

    // A rotates its CA: B's workloads get the new anchors from the Workload API within the
    // refresh hint (1 s here), and a new SVID of A still completes mutual TLS with B's.
    podca_ca_rotate(&a_data);
    let a_anchors = pem::parse_many(podca_bundle(&a_data)).unwrap().len();
    assert_eq!(
        a_anchors, 2,
        "the rotation published the next CA beside the current one"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let b_trusts_a = loop {
        let (_, anchors) = svid_and_peer_bundle(&b, TRUST_DOMAIN).await;
        if anchors.len() == a_anchors {
            break anchors;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B's federated bundle of A did not follow A's rotation within 20 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    let (a_svid, a_trusts_b) = svid_and_peer_bundle(&a, "b.test").await;
    mutual_tls(&a_svid, &a_trusts_b, &b_svid, &b_trusts_a).expect("after A's rotation");
    openssl_mutual_tls(&a_svid, &a_trusts_b, &b_svid, &b_trusts_a)
        .expect("openssl: after A's rotation");
    assert!(a.stop().success());
    assert!(b.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_bundle_reaches_only_the_workloads_of_signers_that_federate_with_it() {
    // A foreign trust domain known only from its initial bundle (its endpoint never answers).
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let foreign = params
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let anchor = podca_signer::CaCertificate::from_der(foreign.der()).unwrap();
    let document = podca_signer::spiffe_bundle::SpiffeBundle::of(&[anchor], None, 300);
    let work = tempfile::tempdir().unwrap();
    let initial = work.path().join("away.test.json");
    std::fs::write(&initial, document.to_json().unwrap()).unwrap();
    let federation = format!(
        "[[federation]]\ntrust_domain = \"away.test\"\n\
         bundle_endpoint_url = \"https://127.0.0.1:9/\"\nprofile = \"https_spiffe\"\n\
         endpoint_spiffe_id = \"spiffe://away.test/podca-bundle\"\ninitial_bundle = \"{}\"\n",
        initial.display()
    );
    let away = TrustDomain::new("away.test").unwrap();
    for (grpc_signer, gets_it) in [("podca.dev/other", false), ("podca.dev/a", true)] {
        let config = format!(
            "[grpc]\nsigner = \"{grpc_signer}\"\n\n\
             [signers.\"podca.dev/a\"]\ntrust_domain = \"a.test\"\nfederates_with = [\"away.test\"]\n\n\
             [signers.\"podca.dev/other\"]\ntrust_domain = \"other.test\"\n\n{federation}"
        );
        let dev = DevProcess::start_with(DevOptions {
            config: Some(&config),
            ..DevOptions::default()
        });
        let client = WorkloadApiClient::connect_to(&format!("unix://{}", dev.socket.display()))
            .await
            .unwrap();
        let bundles = client.fetch_x509_bundles().await.unwrap();
        assert_eq!(
            bundles.get(&away).is_some(),
            gets_it,
            "[grpc] signer {grpc_signer}"
        );
        let jwt = client.fetch_jwt_bundles().await.unwrap();
        assert_eq!(
            jwt.get(&away).is_some(),
            gets_it,
            "[grpc] signer {grpc_signer}"
        );
        assert!(dev.stop().success());
    }
}

#[test]
fn federates_with_and_federation_tables_must_agree_at_start() {
    for (config, message) in [
        (
            "[signers.\"s\"]\ntrust_domain = \"a.test\"\nfederates_with = [\"away.test\"]\n",
            "federates_with names \"away.test\", which no [[federation]] table configures",
        ),
        (
            "[signers.\"s\"]\ntrust_domain = \"a.test\"\n\n[[federation]]\n\
             trust_domain = \"away.test\"\nbundle_endpoint_url = \"https://127.0.0.1:9/\"\n\
             profile = \"https_spiffe\"\nendpoint_spiffe_id = \"spiffe://away.test/b\"\n\
             initial_bundle = \"/nonexistent\"\n",
            "no signer lists it in federates_with",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("podca.toml");
        std::fs::write(&path, config).unwrap();
        let out = Command::new(podca_binary())
            .args(["dev", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(message), "{message}: {stderr}");
    }
}

/// ClusterTrustBundles as (name, trustBundle).
type NamedBundles = [(String, String)];

/// The ClusterTrustBundles of `signer` in the emulator labelled with the federated trust
/// domain `td`: (name, trustBundle).
fn federated_ctbs(emu: &podca_tests::Emulator, signer: &str, td: &str) -> Vec<(String, String)> {
    emu.list_objects(podca_tests::emulator::Res::Ctb, None)
        .into_iter()
        .filter(|o| {
            o["spec"]["signerName"] == signer
                && o["metadata"]["labels"]["podca.dev/federated-trust-domain"] == td
        })
        .map(|o| {
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["spec"]["trustBundle"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// `podca serve` federating with a `podca dev` over https_spiffe publishes the foreign trust
/// domain's authorities as a ClusterTrustBundle of the signer that federates with it, labelled
/// with that trust domain, and never mixes them into the signer's own bundle; a rotation of the
/// foreign CA reaches the ClusterTrustBundle.
#[tokio::test(flavor = "multi_thread")]
async fn serve_publishes_a_federated_trust_domain_as_a_cluster_trust_bundle() {
    const SIGNER: &str = "example.com/workload";
    let work = tempfile::tempdir().unwrap();
    let b_data = work.path().join("b");
    podca_ca_init(&b_data);
    let b_port = podca_tests::process::free_port();
    let b_endpoint_id = "spiffe://b.test/podca/bundle-endpoint";
    let b_initial = work.path().join("b.json");
    std::fs::write(&b_initial, spiffe_document(&b_data).to_string()).unwrap();
    let b = DevProcess::start_with(DevOptions {
        config: Some(&format!(
            "[signers.\"podca.dev/b\"]\ntrust_domain = \"b.test\"\n\n[bundle_endpoint]\n\
             listen = \"127.0.0.1:{b_port}\"\nprofile = \"https_spiffe\"\n\
             spiffe_id = \"{b_endpoint_id}\"\n"
        )),
        data_dir: Some(b_data.clone()),
        ..DevOptions::default()
    });

    let (cluster, ca_dir) = podca_tests::cluster::Cluster::for_serve(SIGNER, "bench").await;
    let config = cluster.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\
             federates_with = [\"b.test\"]\n\n[[federation]]\ntrust_domain = \"b.test\"\n\
             bundle_endpoint_url = \"https://127.0.0.1:{b_port}/\"\nprofile = \"https_spiffe\"\n\
             endpoint_spiffe_id = \"{b_endpoint_id}\"\ninitial_bundle = {:?}\n\
             min_refresh_seconds = 1\nmax_refresh_seconds = 1\n",
            ca_dir.display().to_string(),
            b_initial.display().to_string()
        ),
    )
    .unwrap();
    let serve = podca_tests::process::ServeProcess::start(
        &config,
        &cluster.kubeconfig,
        &["--no-grpc"],
        &[],
    );
    let emu = &cluster.emu;
    let wait_for = |what: &str, ok: &dyn Fn(&NamedBundles) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let found = federated_ctbs(emu, SIGNER, "b.test");
            if ok(&found) {
                return found;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} within 30 s: {found:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let anchors = |pem: &str| pem::parse_many(pem).unwrap().len();
    let b_bundle = podca_bundle(&b_data);
    let found = wait_for("b.test's ClusterTrustBundle", &|f| f.len() == 1);
    let (name, pem) = &found[0];
    assert_eq!(name, "example.com:workload:podca.federated.b.test");
    assert_eq!(
        pem::parse_many(pem).unwrap(),
        pem::parse_many(&b_bundle).unwrap(),
        "the federated bundle holds b.test's authorities, as `podca bundle` prints them"
    );
    // The signer's own bundle holds its own CA's anchors and none of b.test's.
    let own = emu
        .get_object(
            podca_tests::emulator::Res::Ctb,
            "",
            "example.com:workload:podca",
        )
        .expect("the signer's own ClusterTrustBundle");
    let own_pem = own["spec"]["trustBundle"].as_str().unwrap();
    assert_eq!(own_pem, podca_bundle(&ca_dir));
    for foreign in pem::parse_many(&b_bundle).unwrap() {
        assert!(!pem::parse_many(own_pem).unwrap().contains(&foreign));
    }
    // b.test rotates: the next root reaches the ClusterTrustBundle within the refresh hint.
    podca_ca_rotate(&b_data);
    let rotated = wait_for("b.test's rotation", &|f| {
        f.len() == 1 && anchors(&f[0].1) == 2
    });
    assert_eq!(
        pem::parse_many(&rotated[0].1).unwrap(),
        pem::parse_many(podca_bundle(&b_data)).unwrap()
    );
    // b.test's endpoint down and podca serve restarted: it starts from the configured initial
    // bundle (the one root from before the rotation), which must not replace the rotated one
    // it published; the passes run all the same.
    assert!(b.stop().success());
    drop(serve);
    let serve = podca_tests::process::ServeProcess::start(
        &config,
        &cluster.kubeconfig,
        &["--no-grpc"],
        &[],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while podca_tests::process::metric_value(&serve.metrics(), "podca_ctb_passes_total") < 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no publishing passes: {}",
            serve
                .metrics()
                .lines()
                .filter(|l| l.contains("ctb") || l.contains("federation"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let kept = federated_ctbs(emu, SIGNER, "b.test");
    assert_eq!(kept, rotated, "the restart kept the rotated bundle");
}
