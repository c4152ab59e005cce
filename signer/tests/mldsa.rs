//! ML-DSA (FIPS 204, RFC 9881) subject keys and CA keys in the PKI core: parsing, refusals,
//! the leaf profile, CA certificates, key files, and chains that webpki verifies.
//! (The aws-lc-independent verifier, RustCrypto `ml-dsa`, runs in `tests/tests/mldsa.rs`.)

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use podca_signer::keys::GeneratedKey;
use podca_signer::{
    CaAlgorithm, CaKey, CertificateRequest, DenyReason, FileKey, IssuedCertificate, IssuingCa,
    KeyError, KeyType, MemoryKey, Outcome, SignerPolicy, SubjectKey,
};
use rustls_pki_types::CertificateDer;
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::{FromDer, X509Certificate};

const ML_DSA_CAS: [CaAlgorithm; 3] = [
    CaAlgorithm::MlDsa44,
    CaAlgorithm::MlDsa65,
    CaAlgorithm::MlDsa87,
];

fn two_level_ca(algorithm: CaAlgorithm) -> IssuingCa {
    let now = OffsetDateTime::now_utc();
    let root = IssuingCa::self_signed_root(
        Arc::new(MemoryKey::generate(algorithm).unwrap()),
        "pq test root",
        now,
        Duration::days(30),
    )
    .unwrap();
    root.sign_intermediate(
        Arc::new(MemoryKey::generate(algorithm).unwrap()),
        "pq test issuing",
        now,
        Duration::days(10),
    )
    .unwrap()
}

fn pq_policy() -> SignerPolicy {
    let mut policy = SignerPolicy::permissive("td.example");
    policy.key_types = KeyType::EVERY.to_vec();
    policy
}

fn request(key: Result<SubjectKey, KeyError>) -> CertificateRequest {
    CertificateRequest {
        key,
        namespace: "prod".into(),
        service_account: "web".into(),
        pod_name: Some("web-0".into()),
        max_expiration: Some(Duration::seconds(86400)),
        requested_lifetime: None,
        user_annotations: BTreeMap::new(),
    }
}

fn issue(policy: &SignerPolicy, ca: &IssuingCa, key: &GeneratedKey) -> Outcome {
    podca_signer::sign_request(
        policy,
        ca,
        &request(Ok(key.public.clone())),
        OffsetDateTime::now_utc(),
    )
}

fn issued(ca: &IssuingCa, key_type: KeyType) -> (GeneratedKey, IssuedCertificate) {
    let key = GeneratedKey::generate(key_type).unwrap();
    match issue(&pq_policy(), ca, &key) {
        Outcome::Issued(cert) => (key, *cert),
        other => panic!("{key_type}: expected Issued, got {other:?}"),
    }
}

fn ders(pem_text: &str) -> Vec<CertificateDer<'static>> {
    pem::parse_many(pem_text)
        .unwrap()
        .into_iter()
        .map(|p| CertificateDer::from(p.into_contents()))
        .collect()
}

fn denied(outcome: Outcome) -> (DenyReason, String) {
    match outcome {
        Outcome::Denied { reason, message } => (reason, message),
        other => panic!("expected Denied, got {other:?}"),
    }
}

/// The SPKI of an ML-DSA key with `oid_last` (17/18/19), optional parameters, `len` key bytes.
fn ml_dsa_spki(oid_last: u8, parameters: Option<&[u8]>, len: usize) -> Vec<u8> {
    let mut alg = vec![
        0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x03, oid_last,
    ];
    if let Some(p) = parameters {
        alg.extend_from_slice(p);
    }
    let mut bits = vec![0u8];
    bits.extend(std::iter::repeat_n(0x42, len));
    let mut body = tlv(0x30, &alg);
    body.extend(tlv(0x03, &bits));
    tlv(0x30, &body)
}

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else if len < 0x100 {
        out.extend([0x81, len as u8]);
    } else {
        out.extend([0x82, (len >> 8) as u8, len as u8]);
    }
    out.extend_from_slice(content);
    out
}

#[test]
fn kubelet_names_and_ca_algorithm_names() {
    for (kt, name) in KeyType::ML_DSA
        .iter()
        .zip(["MLDSA44", "MLDSA65", "MLDSA87"])
    {
        assert_eq!(kt.kubelet_name(), name);
        assert_eq!(name.parse::<KeyType>().unwrap(), *kt);
        assert!(kt.is_ml_dsa());
        let json = serde_json::to_string(kt).unwrap();
        assert_eq!(json, format!("\"{name}\""));
    }
    assert!(KeyType::ALL.iter().all(|k| !k.is_ml_dsa()));
    for (alg, name) in ML_DSA_CAS
        .iter()
        .zip(["ml-dsa-44", "ml-dsa-65", "ml-dsa-87"])
    {
        assert_eq!(name.parse::<CaAlgorithm>().unwrap(), *alg);
        assert_eq!(alg.to_string(), name);
    }
}

#[test]
fn every_parameter_set_parses_with_its_exact_length() {
    for (kt, (last, len)) in
        KeyType::ML_DSA
            .into_iter()
            .zip([(17u8, 1312usize), (18, 1952), (19, 2592)])
    {
        let generated = GeneratedKey::generate(kt).unwrap();
        assert_eq!(generated.public.key_type(), kt);
        // What aws-lc writes is RFC 9881's canonical form, which we rebuild byte for byte.
        let spki = generated.public.spki_der();
        assert_eq!(spki.len(), ml_dsa_spki(last, None, len).len(), "{kt}");
        assert_eq!(
            SubjectKey::from_spki_der(spki).unwrap().key_type(),
            kt,
            "{kt}"
        );
        let csr = generated.stub_csr_der().unwrap();
        assert_eq!(SubjectKey::from_stub_csr(&csr).unwrap().key_type(), kt);
        assert_eq!(SubjectKey::from_csr_verified(&csr).unwrap().key_type(), kt);
    }
}

#[test]
fn malformed_ml_dsa_keys_are_refused_precisely() {
    // One byte short for ML-DSA-65.
    let short = SubjectKey::from_spki_der(&ml_dsa_spki(18, None, 1951)).unwrap_err();
    assert_eq!(
        short.to_string(),
        "malformed ML-DSA public key: ML-DSA-65 public key is 1951 bytes; it must be 1952"
    );
    // ML-DSA-44's length under the ML-DSA-87 OID.
    let wrong_set = SubjectKey::from_spki_der(&ml_dsa_spki(19, None, 1312)).unwrap_err();
    assert_eq!(
        wrong_set.to_string(),
        "malformed ML-DSA public key: ML-DSA-87 public key is 1312 bytes; it must be 2592"
    );
    // NULL parameters.
    let params =
        SubjectKey::from_spki_der(&ml_dsa_spki(17, Some(&[0x05, 0x00]), 1312)).unwrap_err();
    assert_eq!(
        params.to_string(),
        "malformed ML-DSA public key: the ML-DSA-44 AlgorithmIdentifier has parameters; \
         RFC 9881 requires them absent"
    );
    // Each maps to Denied MalformedPublicKey, message unchanged.
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    for err in [short, wrong_set, params] {
        let (reason, message) = denied(podca_signer::sign_request(
            &pq_policy(),
            &ca,
            &request(Err(err.clone())),
            OffsetDateTime::now_utc(),
        ));
        assert_eq!(reason, DenyReason::MalformedPublicKey);
        assert_eq!(message, err.to_string());
    }
}

#[test]
fn a_broken_ml_dsa_csr_signature_is_refused() {
    let key = GeneratedKey::generate(KeyType::MlDsa65).unwrap();
    let mut csr = key.stub_csr_der().unwrap();
    // The signature BIT STRING is last: flip its final byte.
    let last = csr.len() - 1;
    csr[last] ^= 0x01;
    // The stub path takes the key only (kube-apiserver checked the signature).
    assert!(SubjectKey::from_stub_csr(&csr).is_ok());
    let err = SubjectKey::from_csr_verified(&csr).unwrap_err();
    assert_eq!(
        err,
        KeyError::BadSignature {
            what: "CSR self-signature"
        }
    );
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let (reason, message) = denied(podca_signer::sign_request(
        &pq_policy(),
        &ca,
        &request(Err(err)),
        OffsetDateTime::now_utc(),
    ));
    assert_eq!(reason, DenyReason::MalformedPublicKey);
    assert_eq!(
        message,
        "CSR self-signature does not verify against the subject public key"
    );
    // An ML-DSA-44 signature algorithm on an ML-DSA-65 key does not fit.
    let other = GeneratedKey::generate(KeyType::MlDsa44).unwrap();
    let mut mixed = other.stub_csr_der().unwrap();
    let at = mixed
        .windows(11)
        .position(|w| {
            w == [
                0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x03, 17,
            ]
        })
        .unwrap();
    mixed[at + 10] = 18;
    // The first occurrence is the SPKI's: now an ML-DSA-65 OID over a 1312-byte key.
    assert!(matches!(
        SubjectKey::from_csr_verified(&mixed),
        Err(KeyError::Malformed { detail, .. }) if detail.contains("1312 bytes; it must be 1952")
    ));
}

#[test]
fn ml_dsa_is_off_unless_the_policy_lists_it_and_the_suggestion_stays_classical() {
    let ca = two_level_ca(CaAlgorithm::EcdsaP256);
    let key = GeneratedKey::generate(KeyType::MlDsa65).unwrap();
    let default = SignerPolicy::permissive("td.example");
    let (reason, message) = denied(issue(&default, &ca, &key));
    assert_eq!(reason, DenyReason::UnsupportedKeyType);
    assert_eq!(
        message,
        "key type MLDSA65 is not allowed by this signer's policy; use keyType ECDSAP256 \
         (allowed: RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519)"
    );
    // A policy of ML-DSA-87 and Ed25519 suggests Ed25519, the classical one.
    let mut narrow = SignerPolicy::permissive("td.example");
    narrow.key_types = vec![KeyType::MlDsa87, KeyType::Ed25519];
    let (reason, message) = denied(issue(&narrow, &ca, &key));
    assert_eq!(reason, DenyReason::UnsupportedKeyType);
    assert!(
        message.contains("use keyType ED25519 (allowed: MLDSA87, ED25519)"),
        "{message}"
    );
    // Listed: issued.
    assert!(matches!(issue(&pq_policy(), &ca, &key), Outcome::Issued(_)));
}

#[test]
fn the_legacy_pkix_fields_do_not_take_ml_dsa() {
    let key = GeneratedKey::generate(KeyType::MlDsa44).unwrap();
    let err =
        SubjectKey::from_pkix_with_proof(key.public.spki_der(), &[0; 2420], "uid-1").unwrap_err();
    assert!(
        matches!(&err, KeyError::UnsupportedKeyType { found } if found.contains("MLDSA44 in pkixPublicKey")),
        "{err}"
    );
}

#[test]
fn leaves_of_every_subject_under_every_ca_follow_the_profile_and_verify() {
    for ca_alg in [CaAlgorithm::EcdsaP256, CaAlgorithm::MlDsa65]
        .into_iter()
        .chain(ML_DSA_CAS)
    {
        let ca = two_level_ca(ca_alg);
        for kt in KeyType::ML_DSA.into_iter().chain([KeyType::EcdsaP256]) {
            let (key, cert) = issued(&ca, kt);
            let chain = ders(&cert.chain_pem);
            assert_eq!(chain.len(), 2, "{ca_alg}/{kt}: leaf + issuing");
            let (_, leaf) = X509Certificate::from_der(&chain[0]).unwrap();
            assert_eq!(
                leaf.public_key().raw,
                key.public.spki_der(),
                "SPKI verbatim"
            );
            assert_eq!(
                leaf.signature_algorithm.algorithm.to_id_string(),
                ca_alg.signature_oid(),
                "{ca_alg}/{kt}"
            );
            assert!(
                leaf.signature_algorithm.parameters.is_none(),
                "{ca_alg}/{kt}: parameters absent"
            );
            let ku = leaf.key_usage().unwrap().unwrap().value;
            assert!(ku.digital_signature(), "{ca_alg}/{kt}");
            assert_eq!(ku.flags, 1, "{ca_alg}/{kt}: digitalSignature only");
            common::webpki_verify(&ca.roots_pem(), &cert.chain_pem)
                .unwrap_or_else(|e| panic!("webpki rejected {ca_alg} CA / {kt} leaf: {e:?}"));
        }
        // The CA certificates themselves: id-ml-dsa-* signatures, parameters absent.
        for ca_cert in ders(&ca.roots_pem()).iter().chain(&ders(&ca.chain_pem())) {
            let (_, c) = X509Certificate::from_der(ca_cert).unwrap();
            assert_eq!(
                c.signature_algorithm.algorithm.to_id_string(),
                ca_alg.signature_oid()
            );
            assert!(c.signature_algorithm.parameters.is_none());
            assert!(c.public_key().algorithm.parameters.is_none() || !ca_alg.is_ml_dsa());
        }
    }
}

#[test]
fn ml_dsa_ca_keys_round_trip_through_files_as_rfc_9881_seed_pkcs8() {
    let dir = tempfile::tempdir().unwrap();
    for alg in ML_DSA_CAS {
        let path = dir.path().join(format!("{alg}.key"));
        let created = FileKey::create(&path, alg).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let block = pem::parse(&text).unwrap();
        assert_eq!(block.tag(), "PRIVATE KEY");
        let der = block.contents();
        // PrivateKeyInfo v1 { version 0, AlgorithmIdentifier { id-ml-dsa-* }, OCTET STRING {
        // [0] IMPLICIT OCTET STRING (32-byte seed) } }: 2+3+13+(2+34) = 54 bytes.
        assert_eq!(der.len(), 54, "{alg}: seed-only PKCS#8");
        assert_eq!(&der[2..5], &[0x02, 0x01, 0x00], "{alg}: version v1");
        assert_eq!(&der[18..22], &[0x04, 0x22, 0x80, 0x20], "{alg}: [0] seed");
        let loaded = FileKey::load(&path).unwrap();
        assert_eq!(loaded.algorithm(), alg);
        assert_eq!(loaded.public_key_raw(), created.public_key_raw());
        let memory = MemoryKey::from_pem(&text).unwrap();
        assert_eq!(memory.public_key_raw(), created.public_key_raw());
        // Signatures verify with the public key.
        let signature = loaded.sign(b"tbs").unwrap();
        aws_lc_rs::signature::UnparsedPublicKey::new(alg.verification(), loaded.public_key_raw())
            .verify(b"tbs", &signature)
            .unwrap();
        assert!(!format!("{loaded:?}").contains(&hex::encode(&der[22..])));
    }
}

#[test]
fn the_pkcs11_backend_refuses_ml_dsa_with_a_clear_error() {
    for alg in [
        CaAlgorithm::EcdsaP256,
        CaAlgorithm::EcdsaP384,
        CaAlgorithm::RsaSha256,
    ] {
        assert!(podca_signer::backend::Pkcs11Key::supports(alg).is_ok());
    }
    // The refusal is decided before any token is touched.
    let err = podca_signer::backend::Pkcs11Key::supports(CaAlgorithm::MlDsa65).unwrap_err();
    assert_eq!(
        err.to_string(),
        "CA key unusable: the PKCS#11 backend supports ecdsa-p256, ecdsa-p384 and rsa-sha256 CA keys, not \
         ml-dsa-65 (ML-DSA CA keys need the file or Secret backend)"
    );
}
