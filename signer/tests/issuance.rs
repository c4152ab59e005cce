//! Issuance end to end: every subject key type, checked by independent verifiers (the openssl
//! binary, webpki) and by a real mutual-TLS handshake.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use podca_signer::{CaAlgorithm, KeyType, SubjectKey};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use x509_parser::prelude::{FromDer, X509Certificate};

use common::{issue_for, openssl_verify, two_level_ca, webpki_verify};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn ders(pem_text: &str) -> Vec<CertificateDer<'static>> {
    pem::parse_many(pem_text)
        .unwrap()
        .into_iter()
        .map(|p| CertificateDer::from(p.into_contents()))
        .collect()
}

#[test]
fn every_key_type_verifies_with_openssl_and_webpki() {
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let dir = tempfile::tempdir().unwrap();
    for key_type in KeyType::ALL {
        let (key, cert) = issue_for(&ca, key_type, &[]);
        let (ok, out) = openssl_verify(dir.path(), &ca.roots_pem(), &cert.chain_pem);
        assert!(ok, "openssl verify failed for {key_type}: {out}");

        let chain = ders(&cert.chain_pem);
        assert_eq!(
            chain.len(),
            2,
            "leaf + issuing intermediate, never the root"
        );
        webpki_verify(&ca.roots_pem(), &cert.chain_pem)
            .unwrap_or_else(|e| panic!("webpki rejected the {key_type} leaf: {e:?}"));

        // The SPKI in the certificate is the requested one, byte for byte.
        let (_, parsed) = X509Certificate::from_der(&chain[0]).unwrap();
        assert_eq!(parsed.public_key().raw, key.public.spki_der(), "{key_type}");
        assert_eq!(
            SubjectKey::from_spki_der(parsed.public_key().raw)
                .unwrap()
                .key_type(),
            key_type
        );
    }
}

#[test]
fn leaf_follows_the_x509_svid_profile() {
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    for key_type in [KeyType::EcdsaP256, KeyType::Rsa3072] {
        let (_, cert) = issue_for(&ca, key_type, &["web.prod.svc"]);
        let chain = ders(&cert.chain_pem);
        let (_, leaf) = X509Certificate::from_der(&chain[0]).unwrap();
        assert!(leaf.subject().iter().next().is_none(), "empty subject");
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        assert!(san.critical, "SAN must be critical with an empty subject");
        let uris: Vec<_> = san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::URI(u) => Some(*u),
                _ => None,
            })
            .collect();
        assert_eq!(uris, ["spiffe://test.example/ns/prod/sa/web"]);
        let bc = leaf.basic_constraints().unwrap().unwrap();
        assert!(
            bc.critical && !bc.value.ca,
            "basicConstraints CA:false, critical"
        );
        let ku = leaf.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature());
        assert_eq!(ku.key_encipherment(), key_type.is_rsa());
        assert!(!ku.key_cert_sign());
        let eku = leaf.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        let ski = leaf
            .extensions()
            .iter()
            .any(|e| e.oid.to_id_string() == "2.5.29.14");
        let aki = leaf
            .extensions()
            .iter()
            .any(|e| e.oid.to_id_string() == "2.5.29.35");
        assert!(ski && aki, "SKI and AKI present");
        // Random serial: positive, at least 64 bits.
        let serial = leaf.raw_serial();
        assert!(serial.len() >= 9 || (serial.len() == 8 && serial[0] != 0));
        assert!(serial[0] & 0x80 == 0, "positive serial");
        assert_eq!(hex::encode(serial), cert.serial);
        // Times in the certificate are the ones reported.
        assert_eq!(
            leaf.validity().not_before.to_datetime(),
            cert.validity.not_before
        );
        assert_eq!(
            leaf.validity().not_after.to_datetime(),
            cert.validity.not_after
        );
    }
}

#[test]
fn serials_do_not_repeat_for_the_same_key() {
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let (_, a) = issue_for(&ca, KeyType::EcdsaP256, &[]);
    let (_, b) = issue_for(&ca, KeyType::EcdsaP256, &[]);
    assert_ne!(a.serial, b.serial);
}

#[test]
fn other_ca_algorithms_issue_verifiable_chains() {
    let dir = tempfile::tempdir().unwrap();
    for alg in [CaAlgorithm::EcdsaP384, CaAlgorithm::Ed25519] {
        let ca = two_level_ca(alg);
        let (_, cert) = issue_for(&ca, KeyType::EcdsaP256, &[]);
        let (ok, out) = openssl_verify(dir.path(), &ca.roots_pem(), &cert.chain_pem);
        assert!(ok, "{alg}: {out}");
    }
}

#[test]
fn openssl_rejects_a_chain_against_another_ca() {
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let other = two_level_ca(CaAlgorithm::EcdsaP256);
    let dir = tempfile::tempdir().unwrap();
    let (_, cert) = issue_for(&ca, KeyType::EcdsaP256, &[]);
    let (ok, _) = openssl_verify(dir.path(), &other.roots_pem(), &cert.chain_pem);
    assert!(!ok, "a chain must not verify against an unrelated root");
}

/// Server and client each hold a podca certificate; both verify the peer against the roots.
async fn mtls_handshake(
    server_roots: &str,
    client_roots: &str,
    server: (&str, &str),
    client: (&str, &str),
) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn roots(pem_text: &str) -> Arc<rustls::RootCertStore> {
        let mut store = rustls::RootCertStore::empty();
        for d in ders(pem_text) {
            store.add(d).unwrap();
        }
        Arc::new(store)
    }
    fn key(pem_text: &str) -> PrivateKeyDer<'static> {
        let block = pem::parse(pem_text).unwrap();
        PrivateKeyDer::Pkcs8(block.into_contents().into())
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots(server_roots),
        provider(),
    )
    .build()
    .unwrap();
    let server_config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(ders(server.1), key(server.0))
        .unwrap();
    let client_config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(client_roots))
        .with_client_auth_cert(ders(client.1), key(client.0))
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let server_task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        tls.shutdown().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    });
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let client_result = async {
        let mut tls = connector
            .connect(ServerName::try_from("server.test").unwrap(), tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        if &buf != b"pong" {
            return Err("bad reply".to_string());
        }
        Ok(())
    }
    .await;
    let server_result = server_task.await.unwrap();
    client_result.and(server_result)
}

#[tokio::test]
async fn mutual_tls_between_two_issued_certificates() {
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let other = two_level_ca(CaAlgorithm::EcdsaP256);
    for key_type in KeyType::ALL {
        let (skey, scert) = issue_for(&ca, key_type, &["server.test"]);
        let (ckey, ccert) = issue_for(&ca, KeyType::EcdsaP256, &[]);
        let server = (skey.private_key_pem(), scert.chain_pem.clone());
        let client = (ckey.private_key_pem(), ccert.chain_pem.clone());
        mtls_handshake(
            &ca.roots_pem(),
            &ca.roots_pem(),
            (&server.0, &server.1),
            (&client.0, &client.1),
        )
        .await
        .unwrap_or_else(|e| panic!("mTLS with a {key_type} server certificate failed: {e}"));

        // The client trusts another CA: the handshake must fail.
        let err = mtls_handshake(
            &ca.roots_pem(),
            &other.roots_pem(),
            (&server.0, &server.1),
            (&client.0, &client.1),
        )
        .await
        .expect_err("a client trusting another CA must reject the server");
        assert!(err.to_lowercase().contains("certificate"), "{err}");
    }
}

#[tokio::test]
async fn server_rejects_a_client_from_another_ca() {
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let other = two_level_ca(CaAlgorithm::EcdsaP256);
    let (skey, scert) = issue_for(&ca, KeyType::EcdsaP256, &["server.test"]);
    let (ckey, ccert) = issue_for(&other, KeyType::EcdsaP256, &[]);
    let result = mtls_handshake(
        &ca.roots_pem(),
        &ca.roots_pem(),
        (&skey.private_key_pem(), &scert.chain_pem),
        (&ckey.private_key_pem(), &ccert.chain_pem),
    )
    .await;
    // TLS 1.3: the client's handshake is done before the server checks its certificate, so the
    // client learns of the refusal from the server's alert. Both CAs bear the same names, so the
    // server finds "the" issuer and its signature fails: BadSignature, sent as DecryptError.
    let err = result.expect_err("a client certificate from another CA must be refused");
    assert_eq!(err, "received fatal alert: DecryptError");
}

/// CEL outputs through `sign_request`: the leaf carries the names the expression computed (not
/// the allow-list's, which must then be empty) and lives min(policy, cap); a bad output
/// denies, and a policy with both an output and DNS allow-lists does not validate.
#[test]
fn cel_outputs_give_the_leafs_dns_names_and_cap_its_lifetime() {
    use podca_signer::policy::PolicyError;
    use podca_signer::rules::OutputSpec;
    use podca_signer::{CertificateRequest, DenyReason, Outcome, SignerPolicy};
    use time::{Duration, OffsetDateTime};

    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let mut policy = SignerPolicy::permissive("test.example");
    policy.outputs = OutputSpec {
        dns_names: Some(
            "[request.pod.name + '.' + request.namespace + '.svc'] + \
             request.annotations['podca.dev/dns-names'].split(',').map(n, n.trim().lowerAscii())"
                .into(),
        ),
        max_lifetime_seconds: Some("request.service_account == 'web' ? 7200 : 3599".into()),
    };
    policy.validate().unwrap();
    let key = podca_signer::keys::GeneratedKey::generate(KeyType::EcdsaP256).unwrap();
    let request = |sa: &str, names: &str| CertificateRequest {
        key: Ok(key.public.clone()),
        namespace: "prod".into(),
        service_account: sa.into(),
        pod_name: Some("web-0".into()),
        max_expiration: Some(Duration::seconds(86400)),
        requested_lifetime: None,
        user_annotations: [("podca.dev/dns-names".to_string(), names.to_string())].into(),
    };
    let sign = |r: &CertificateRequest| {
        podca_signer::sign_request(&policy, &ca, r, OffsetDateTime::now_utc())
    };
    // No allow-list admits "Other.example": the output alone decides.
    let Outcome::Issued(cert) = sign(&request("web", "Other.example, api.prod.svc")) else {
        panic!("expected Issued");
    };
    assert_eq!(
        cert.dns_names,
        ["web-0.prod.svc", "other.example", "api.prod.svc"]
    );
    assert_eq!(cert.validity.lifetime(), Duration::seconds(7200));
    let (_, leaf) = X509Certificate::from_der(&cert.leaf_der).unwrap();
    let in_leaf: Vec<String> = leaf
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(in_leaf, cert.dns_names);
    for (sa, names, reason, message) in [
        (
            "web",
            "*.prod.svc",
            "PolicyOutputInvalid:dns_names",
            "output dns_names gave \"*.prod.svc\", which is not a DNS name",
        ),
        (
            "db",
            "db.prod.svc",
            "PolicyOutputInvalid:max_lifetime_seconds",
            "output max_lifetime_seconds gave 3599; a certificate's lifetime cap must be at \
             least 3600 seconds",
        ),
    ] {
        match sign(&request(sa, names)) {
            Outcome::Denied {
                reason: DenyReason::Rule(r),
                message: m,
            } => {
                assert_eq!(r, reason);
                assert!(m.starts_with(message), "{m}");
            }
            other => panic!("{sa} {names}: expected Denied, got {other:?}"),
        }
    }
    let mut both = policy.clone();
    both.allowed_dns_names = vec!["*".into()];
    assert_eq!(
        both.validate(),
        Err(PolicyError::DnsNamesOutputWithAllowLists)
    );
    let toml_policy: SignerPolicy = toml::from_str(
        "trust_domain = \"t.example\"\n[outputs]\nmax_lifetime_seconds = \"'long'\"\n",
    )
    .unwrap();
    let e = toml_policy.validate().unwrap_err().to_string();
    assert_eq!(
        e,
        "invalid signer policy: outputs.max_lifetime_seconds at 1:1: gives string, want int"
    );
}

/// podca's own serving names are refused when a CEL output computes them, as when the
/// annotation asks for them (`SignerPolicy::reserved_dns_names`).
#[test]
fn a_cel_output_cannot_give_podcas_own_serving_name() {
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let mut policy = podca_signer::SignerPolicy::permissive("cluster.local");
    policy.outputs = podca_signer::rules::OutputSpec {
        dns_names: Some("['web.apps.svc', 'podca.podca-system.svc']".into()),
        max_lifetime_seconds: None,
    };
    policy.validate().unwrap();
    let key = podca_signer::keys::GeneratedKey::generate(KeyType::EcdsaP256).unwrap();
    let request = common::request_for(&key, &[]);
    let now = time::OffsetDateTime::now_utc();
    assert!(matches!(
        podca_signer::sign_request(&policy, &ca, &request, now),
        podca_signer::Outcome::Issued(_)
    ));
    policy.reserved_dns_names = vec!["podca.podca-system.svc".into()];
    match podca_signer::sign_request(&policy, &ca, &request, now) {
        podca_signer::Outcome::Denied { reason, message } => {
            assert_eq!(reason, podca_signer::DenyReason::ReservedDnsName);
            assert!(message.contains("\"podca.podca-system.svc\""), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// The `kubernetes.io/service-ca` SANs the controller looked up reach the leaf (DNS and IP,
/// checked by webpki as a TLS client would), and the ledger records them; podca's own serving
/// names stay reserved; the vocabulary on a path that looks nothing up is refused, never
/// dropped; without `service_ca` its keys are unknown annotations.
#[test]
fn service_ca_sans_reach_the_leaf_and_are_refused_where_nobody_looked_them_up() {
    use podca_signer::names::service_ca::{Profile, Sans};
    use podca_signer::{Outcome, RequestContext, RequestSource, sign_request_with};
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let mut policy = podca_signer::SignerPolicy::permissive("cluster.local");
    policy.service_ca = Some(Profile::default());
    policy.validate().unwrap();
    let key = podca_signer::keys::GeneratedKey::generate(KeyType::EcdsaP256).unwrap();
    let mut request = common::request_for(&key, &[]);
    request
        .user_annotations
        .insert("kubernetes.io/service-names".into(), "web".into());
    request
        .user_annotations
        .insert("kubernetes.io/add-pod-ips".into(), "true".into());
    let sans = Sans {
        dns_names: vec!["web.prod.svc".into(), "web.prod.svc.cluster.local".into()],
        ip_addresses: vec!["10.96.0.10".parse().unwrap(), "fd00::7".parse().unwrap()],
    };
    let pcr = RequestContext {
        source: RequestSource::Pcr,
        signer_name: "example.com/serving",
        service_sans: Some(&sans),
        ..RequestContext::CLI
    };
    let now = time::OffsetDateTime::now_utc();
    let cert = match sign_request_with(&policy, &ca, &request, &pcr, now) {
        Outcome::Issued(cert) => cert,
        other => panic!("{other:?}"),
    };
    assert_eq!(cert.dns_names, sans.dns_names);
    assert_eq!(cert.ip_addresses, sans.ip_addresses);
    webpki_verify(&ca.roots_pem(), &cert.chain_pem).unwrap();
    let chain = ders(&cert.chain_pem);
    let leaf = webpki::EndEntityCert::try_from(&chain[0]).unwrap();
    for name in ["web.prod.svc.cluster.local", "10.96.0.10", "fd00::7"] {
        leaf.verify_is_valid_for_subject_name(&ServerName::try_from(name).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
    }
    assert!(
        leaf.verify_is_valid_for_subject_name(&ServerName::try_from("10.96.0.11").unwrap())
            .is_err()
    );
    let record = podca_signer::LedgerRecord::issued(&record_context(), &cert);
    assert_eq!(record.ip_addresses, ["10.96.0.10", "fd00::7"]);
    // podca's own serving names are reserved for these SANs too.
    policy.reserved_dns_names = vec!["web.prod.svc".into()];
    match sign_request_with(&policy, &ca, &request, &pcr, now) {
        Outcome::Denied { reason, message } => {
            assert_eq!(reason, podca_signer::DenyReason::ReservedDnsName);
            assert!(message.contains("\"web.prod.svc\""), "{message}");
        }
        other => panic!("{other:?}"),
    }
    policy.reserved_dns_names.clear();
    // The gRPC paths look nothing up: the vocabulary is refused there, not ignored.
    let grpc = RequestContext {
        source: RequestSource::Grpc,
        ..RequestContext::CLI
    };
    match sign_request_with(&policy, &ca, &request, &grpc, now) {
        Outcome::Denied { reason, message } => {
            assert_eq!(reason, podca_signer::DenyReason::InvalidUserAnnotations);
            assert!(
                message.contains("answered for PodCertificateRequests only"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Without service_ca the keys are unknown annotations, denied before policy.
    policy.service_ca = None;
    match sign_request_with(&policy, &ca, &request, &pcr, now) {
        Outcome::Denied { reason, message } => {
            assert_eq!(reason, podca_signer::DenyReason::InvalidUserAnnotations);
            assert!(
                message.contains("unrecognised user annotation"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

fn record_context() -> podca_signer::RecordContext {
    podca_signer::RecordContext {
        source: podca_signer::Source::Pcr,
        signer: "example.com/serving".into(),
        identity: "spiffe://cluster.local/ns/prod/sa/web".into(),
        requester: None,
        namespace: "prod".into(),
        service_account: "web".into(),
        pod_name: Some("web-0".into()),
        pod_uid: None,
        node_name: None,
        request_uid: None,
        request_name: None,
        ca_generation: None,
        issuer_fingerprint: None,
        replica: "test".into(),
        time: time::OffsetDateTime::now_utc(),
        auth: None,
    }
}
