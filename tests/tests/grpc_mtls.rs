//! mTLS renewal on the gRPC listener (issue #12, item 2), in process: the real TLS listener
//! (`server::serve_tls` with `peer_identity::ClientTrust`), a TokenReview stand-in, and rustls
//! clients presenting certificates.
//!
//! * A current podca certificate renews for exactly its identity without a token.
//! * Token and certificate together must name the same identity (PERMISSION_DENIED otherwise).
//! * Refused at the handshake, with the documented TLS alert: an expired certificate
//!   (`certificate_expired`), a foreign one (`unknown_ca`), and, after a rotation retires the
//!   CA that issued it, a retired-CA one (`unknown_ca`). A connection opened before the
//!   rotation gets UNAUTHENTICATED on its next request instead.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use podca_authority::CaHandle;
use podca_authority::serving_cert::{self, ServingIdentity};
use podca_grpc::auth::{
    Authenticator, BearerToken, LookupError, ReviewStatus, TokenReviewAuthenticator, TokenReviewer,
};
use podca_grpc::connections::ConnectionLimits;
use podca_grpc::peer_identity::{CertificateAuthenticator, ClientTrust};
use podca_grpc::tls::{ServingKeys, certified_key, server_config};
use podca_grpc::{Api, ApiOptions, server};
use podca_proto::podca::v1::IssueCertificateRequest;
use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_signer::keys::GeneratedKey;
use podca_signer::{CaAlgorithm, IssuingCa, KeyType, MemoryKey, SignerPolicy, Validity};
use podca_tests::process::csr_for;
use podca_tests::tls::SERVER_NAME;
use rustls::AlertDescription;
use rustls::pki_types::ServerName;
use time::{Duration, OffsetDateTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Code, Request};

const TRUST_DOMAIN: &str = "cluster.local";

/// TokenReview stand-in: the token `web` is `shop/web`, `db` is `shop/db`.
#[derive(Debug)]
struct Reviewer;

#[tonic::async_trait]
impl TokenReviewer for Reviewer {
    async fn review(
        &self,
        token: &BearerToken,
        audience: &str,
    ) -> Result<ReviewStatus, LookupError> {
        let sa = match token.expose() {
            "web" => "web",
            "db" => "db",
            _ => {
                return Ok(ReviewStatus {
                    error: Some("unknown token".into()),
                    ..Default::default()
                });
            }
        };
        Ok(ReviewStatus {
            authenticated: true,
            username: format!("system:serviceaccount:shop:{sa}"),
            audiences: vec![audience.into()],
            ..Default::default()
        })
    }
}

/// A root CA whose life started `age` ago.
fn root(name: &str, age: Duration) -> IssuingCa {
    let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap();
    IssuingCa::self_signed_root(
        Arc::new(key),
        name,
        OffsetDateTime::now_utc() - age,
        Duration::days(30),
    )
    .unwrap()
}

/// A client certificate: the chain (PEM) and key (PEM) of a leaf for `shop/<sa>` from `ca`,
/// valid from `not_before` for an hour.
fn leaf(ca: &IssuingCa, sa: &str, not_before: OffsetDateTime) -> (String, String) {
    let key = GeneratedKey::generate(KeyType::EcdsaP256).unwrap();
    let validity = Validity {
        not_before,
        not_after: not_before + Duration::hours(1),
        begin_refresh_at: not_before + Duration::minutes(30),
    };
    let issued = ca
        .issue(
            &key.public,
            &format!("spiffe://{TRUST_DOMAIN}/ns/shop/sa/{sa}"),
            &[],
            &validity,
        )
        .unwrap();
    (issued.chain_pem, key.private_key_pem())
}

fn client_config(
    anchors_pem: &str,
    client: Option<&(String, String)>,
) -> Arc<rustls::ClientConfig> {
    podca_tests::tls::client_config_with(anchors_pem, client.map(|(c, k)| (c.as_str(), k.as_str())))
}

/// A gRPC client over TLS presenting `client` (chain and key PEM), if any.
async fn mtls_client(
    addr: SocketAddr,
    anchors_pem: &str,
    client: Option<&(String, String)>,
) -> PodCaClient<Channel> {
    podca_tests::tls::mtls_client(
        addr,
        anchors_pem,
        client.map(|(c, k)| (c.as_str(), k.as_str())),
    )
    .await
}

/// The alert the server answers a client certificate with: the client's side of a TLS 1.3
/// handshake completes before the server has checked the certificate, so the alert arrives
/// with the first read.
async fn handshake_alert(
    addr: SocketAddr,
    anchors_pem: &str,
    client: &(String, String),
) -> Option<AlertDescription> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let connected = tokio_rustls::TlsConnector::from(client_config(anchors_pem, Some(client)))
        .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
        .await;
    let error = match connected {
        Err(e) => e,
        Ok(mut tls) => {
            let _ = tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
            let mut buf = [0u8; 64];
            match tokio::time::timeout(StdDuration::from_secs(5), tls.read(&mut buf))
                .await
                .expect("the server answers or closes within 5 s")
            {
                Ok(_) => return None,
                Err(e) => e,
            }
        }
    };
    match error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::AlertReceived(alert)) => Some(*alert),
        other => panic!("expected a TLS alert, got {error} ({other:?})"),
    }
}

fn issue_request(token: Option<&str>) -> Request<IssueCertificateRequest> {
    let mut request = Request::new(IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        ..Default::default()
    });
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

/// The TLS listener with client certificates verified against `handle`'s accepted anchors.
async fn serve(handle: &CaHandle, stopped: watch::Receiver<bool>) -> SocketAddr {
    let identity = ServingIdentity {
        spiffe_id: podca_signer::names::spiffe_id(TRUST_DOMAIN, "podca-system", "podca"),
        dns_names: serving_cert::service_dns_names("podca", "podca-system"),
        lifetime: serving_cert::DEFAULT_LIFETIME,
    };
    let cert = identity
        .issue(&handle.current().ca, OffsetDateTime::now_utc())
        .unwrap();
    let keys = ServingKeys::new(certified_key(&cert.chain_der, &cert.key_pkcs8_der).unwrap());
    let trust = ClientTrust::new(&handle.current(), vec![TRUST_DOMAIN.into()]).unwrap();
    tokio::spawn(Arc::clone(&trust).follow(handle.subscribe(), stopped.clone()));
    let tokens: Arc<dyn Authenticator> =
        Arc::new(TokenReviewAuthenticator::new(Arc::new(Reviewer), "podca"));
    let api = Api::new(
        ApiOptions {
            signers: BTreeMap::from([("default".into(), SignerPolicy::permissive(TRUST_DOMAIN))]),
            default_signer: "default".into(),
            node_proxy_service_accounts: vec![],
            rate_limit_per_identity: 0,
            max_open_streams: 100,
            allowed_signers: vec![],
            max_dns_names: podca_grpc::core::DEFAULT_MAX_DNS_NAMES,
        },
        handle.clone(),
        Arc::new(CertificateAuthenticator::new(
            tokens,
            Arc::clone(&trust),
            podca_authority::system_clock(),
        )),
        None,
        stopped.clone(),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut shutdown = stopped;
    tokio::spawn(server::serve_tls(
        listener,
        server_config(keys, Some(trust)).unwrap(),
        Arc::new(api),
        ConnectionLimits::default(),
        async move {
            let _ = shutdown.wait_for(|s| *s).await;
        },
    ));
    addr
}

fn spiffe_id_of(answer: &podca_proto::podca::v1::IssueCertificateResponse) -> &str {
    &answer.spiffe_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_certificate_renews_its_own_identity_without_a_token() {
    let ca = root("first", Duration::days(2));
    let anchors = ca.roots_pem();
    let web = leaf(&ca, "web", OffsetDateTime::now_utc() - Duration::minutes(5));
    let handle = CaHandle::new(ca, vec![]);
    let (stop, stopped) = watch::channel(false);
    let addr = serve(&handle, stopped).await;

    let mut renewing = mtls_client(addr, &anchors, Some(&web)).await;
    let answer = renewing
        .issue_certificate(issue_request(None))
        .await
        .expect("a current certificate renews without a token")
        .into_inner();
    assert_eq!(
        spiffe_id_of(&answer),
        "spiffe://cluster.local/ns/shop/sa/web"
    );

    // Token and certificate for the same identity: fine.
    renewing
        .issue_certificate(issue_request(Some("web")))
        .await
        .expect("token and certificate agree");
    // For different identities: refused, naming both.
    let status = renewing
        .issue_certificate(issue_request(Some("db")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        status.message(),
        "the token is for shop/db but the client certificate is for shop/web \
         (spiffe://cluster.local/ns/shop/sa/web); send one identity's credentials"
    );
    // A bad token next to a good certificate is not rescued by the certificate.
    let status = renewing
        .issue_certificate(issue_request(Some("nobody")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // Without a certificate the token decides, as before; with neither: UNAUTHENTICATED.
    let mut plain = mtls_client(addr, &anchors, None).await;
    let answer = plain
        .issue_certificate(issue_request(Some("db")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        spiffe_id_of(&answer),
        "spiffe://cluster.local/ns/shop/sa/db"
    );
    let status = plain
        .issue_certificate(issue_request(None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_foreign_certificates_are_refused_at_the_handshake() {
    let ca = root("first", Duration::days(2));
    let anchors = ca.roots_pem();
    let expired = leaf(&ca, "web", OffsetDateTime::now_utc() - Duration::hours(3));
    let foreign = leaf(
        &root("foreign", Duration::days(1)),
        "web",
        OffsetDateTime::now_utc() - Duration::minutes(5),
    );
    let handle = CaHandle::new(ca, vec![]);
    let (stop, stopped) = watch::channel(false);
    let addr = serve(&handle, stopped).await;

    assert_eq!(
        handshake_alert(addr, &anchors, &expired).await,
        Some(AlertDescription::CertificateExpired)
    );
    assert_eq!(
        handshake_alert(addr, &anchors, &foreign).await,
        Some(AlertDescription::UnknownCA)
    );
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rotation_retires_its_ca_a_certificate_is_refused() {
    let first = root("first", Duration::days(2));
    let now = OffsetDateTime::now_utc();
    let old = leaf(&first, "web", now - Duration::minutes(5));
    let handle = CaHandle::new(first, vec![]);
    let first_anchors = handle.current().anchors.clone();
    let (stop, stopped) = watch::channel(false);
    let addr = serve(&handle, stopped).await;

    // Before the rotation the certificate renews, on a connection that stays open.
    let both_pem = || {
        handle
            .current()
            .anchors
            .iter()
            .map(podca_signer::CaCertificate::pem)
            .collect::<String>()
    };
    let mut before = mtls_client(addr, &both_pem(), Some(&old)).await;
    before
        .issue_certificate(issue_request(None))
        .await
        .expect("renews before the rotation");

    // The rotation: a newer CA is active; the old one is retired, its anchor still published
    // (certificates it issued are still valid for relying parties).
    let second = root("second", Duration::days(1));
    let new = leaf(&second, "web", now - Duration::minutes(5));
    let anchors: Vec<_> = first_anchors
        .into_iter()
        .chain(second.roots().iter().cloned())
        .collect();
    handle.replace(second, anchors);
    let anchors_pem = both_pem();

    // New handshakes with the retired CA's certificate: `unknown_ca` (once the verifier has
    // followed the handle, which happens at once but on another task).
    let deadline = Instant::now() + StdDuration::from_secs(10);
    loop {
        match handshake_alert(addr, &anchors_pem, &old).await {
            Some(AlertDescription::UnknownCA) => break,
            None => assert!(
                Instant::now() < deadline,
                "the retired CA's certificate is still accepted"
            ),
            Some(other) => panic!("expected unknown_ca, got {other:?}"),
        }
        tokio::time::sleep(StdDuration::from_millis(50)).await;
    }
    // The connection opened before: still open, but the certificate no longer renews.
    let status = before
        .issue_certificate(issue_request(None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("invalid credentials: the client certificate is not valid now:"),
        "{status:?}"
    );
    // …and a token next to it does not rescue it: the certificate is still checked.
    let status = before
        .issue_certificate(issue_request(Some("web")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // The new CA's certificate renews.
    let mut renewed = mtls_client(addr, &anchors_pem, Some(&new)).await;
    renewed
        .issue_certificate(issue_request(None))
        .await
        .expect("the active CA's certificate renews");
    stop.send_replace(true);
}
