//! Shared helpers for the signer's integration tests.
#![allow(dead_code)]
// Test support: a failed setup step should fail the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use podca_signer::keys::GeneratedKey;
use podca_signer::{
    CaAlgorithm, CertificateRequest, IssuedCertificate, IssuingCa, KeyType, MemoryKey, Outcome,
    SignerPolicy,
};
use time::{Duration, OffsetDateTime};

/// A root CA plus an issuing intermediate, both in memory.
pub fn two_level_ca(algorithm: CaAlgorithm) -> IssuingCa {
    let now = OffsetDateTime::now_utc();
    let root = IssuingCa::self_signed_root(
        Arc::new(MemoryKey::generate(algorithm).unwrap()),
        "test root",
        now,
        Duration::days(30),
    )
    .unwrap();
    root.sign_intermediate(
        Arc::new(MemoryKey::generate(algorithm).unwrap()),
        "test issuing",
        now,
        Duration::days(10),
    )
    .unwrap()
}

/// Issues for a generated key through the full `sign_request` path.
pub fn issue_for(
    ca: &IssuingCa,
    key_type: KeyType,
    dns_names: &[&str],
) -> (GeneratedKey, IssuedCertificate) {
    issue_in(ca, "test.example", key_type, dns_names)
}

/// As [`issue_for`], for a SPIFFE ID in `trust_domain`.
pub fn issue_in(
    ca: &IssuingCa,
    trust_domain: &str,
    key_type: KeyType,
    dns_names: &[&str],
) -> (GeneratedKey, IssuedCertificate) {
    let key = GeneratedKey::generate(key_type).unwrap();
    let mut policy = SignerPolicy::permissive(trust_domain);
    policy.allowed_dns_names = vec!["*".into()];
    let request = request_for(&key, dns_names);
    match podca_signer::sign_request(&policy, ca, &request, OffsetDateTime::now_utc()) {
        Outcome::Issued(cert) => (key, *cert),
        other => panic!("expected Issued for {key_type}, got {other:?}"),
    }
}

/// A request of `prod/web` (pod `web-0`) for `key`, asking for `dns_names` through the
/// `podca.dev/dns-names` annotation, for at most a day.
pub fn request_for(key: &GeneratedKey, dns_names: &[&str]) -> CertificateRequest {
    let mut annotations = BTreeMap::new();
    if !dns_names.is_empty() {
        annotations.insert("podca.dev/dns-names".to_string(), dns_names.join(","));
    }
    CertificateRequest {
        key: Ok(key.public.clone()),
        namespace: "prod".into(),
        service_account: "web".into(),
        pod_name: Some("web-0".into()),
        max_expiration: Some(Duration::seconds(86400)),
        requested_lifetime: None,
        user_annotations: annotations,
    }
}

/// Runs the real `openssl verify` on a leaf + chain against roots; returns (success, output).
pub fn openssl_verify(dir: &Path, roots_pem: &str, chain_pem: &str) -> (bool, String) {
    let blocks = pem::parse_many(chain_pem).unwrap();
    let leaf = pem::encode(&blocks[0]);
    let untrusted: String = blocks[1..].iter().map(pem::encode).collect();
    std::fs::write(dir.join("roots.pem"), roots_pem).unwrap();
    std::fs::write(dir.join("leaf.pem"), leaf).unwrap();
    std::fs::write(dir.join("untrusted.pem"), untrusted).unwrap();
    let mut cmd = Command::new("openssl");
    cmd.arg("verify")
        .arg("-x509_strict")
        .arg("-purpose")
        .arg("sslclient")
        .arg("-CAfile")
        .arg(dir.join("roots.pem"));
    if blocks.len() > 1 {
        cmd.arg("-untrusted").arg(dir.join("untrusted.pem"));
    }
    let out = cmd
        .arg(dir.join("leaf.pem"))
        .output()
        .expect("the `openssl` binary is required for these tests: apt-get install -y openssl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The DER certificates of a PEM text, in order.
pub fn ders(pem_text: &str) -> Vec<rustls_pki_types::CertificateDer<'static>> {
    pem::parse_many(pem_text)
        .unwrap()
        .into_iter()
        .map(|p| rustls_pki_types::CertificateDer::from(p.into_contents()))
        .collect()
}

/// rustls-webpki's verdict (aws-lc-rs algorithms, ML-DSA included) on a PEM chain, leaf
/// first, under the anchors of `roots_pem`, as a client certificate now: an implementation
/// independent of podca's and of OpenSSL.
pub fn webpki_verify(roots_pem: &str, chain_pem: &str) -> Result<(), webpki::Error> {
    let roots = ders(roots_pem);
    let anchors: Vec<_> = roots
        .iter()
        .map(|d| webpki::anchor_from_trusted_cert(d).unwrap().to_owned())
        .collect();
    let chain = ders(chain_pem);
    let leaf = webpki::EndEntityCert::try_from(&chain[0]).unwrap();
    let algorithms = rustls::crypto::aws_lc_rs::default_provider()
        .signature_verification_algorithms
        .all;
    leaf.verify_for_usage(
        algorithms,
        &anchors,
        &chain[1..],
        rustls_pki_types::UnixTime::now(),
        webpki::KeyUsage::client_auth(),
        None,
        None,
    )
    .map(|_| ())
}
