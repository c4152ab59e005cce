//! Post-quantum Pod certificates (issue #18): ML-DSA subject keys and ML-DSA CAs through the
//! controller (kubelet simulator, emulator with the `PodCertificateMLDSA` gate), the gRPC API and
//! the CLI, every chain checked by an implementation that is not aws-lc (RustCrypto `ml-dsa` for
//! ML-DSA signatures and keys, the `openssl` binary for classical signatures); the emulator's
//! gate; the size limits at the largest case; a rustls mutual-TLS handshake between ML-DSA-65
//! pods; `podca serve` with an ML-DSA-65 CA from a Kubernetes Secret; SoftHSM2's clear refusal
//! of an ML-DSA CA at start.

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use ml_dsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use ml_dsa::{MlDsa44, MlDsa65, MlDsa87, MlDsaParams, Signer, Verifier};
use podca_controller::Options;
use podca_proto::podca::v1::IssueCertificateRequest;
use podca_signer::keys::GeneratedKey;
use podca_signer::{CaAlgorithm, IssuingCa, KeyType as SignerKeyType, MemoryKey, SignerPolicy};
use podca_tests::EmulatorConfig;
use podca_tests::cluster::{Cluster, ClusterConfig, add_pod};
use podca_tests::emulator::ApiMode;
use podca_tests::kubelet::{Credential, KeyType, KubeletSim, Outcome, PodRef, RequestOptions};
use podca_tests::process::{DevOptions, DevProcess, podca_binary};
use podca_tests::sim::install_crypto;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use time::{Duration, OffsetDateTime};
use tokio::sync::oneshot;
use x509_parser::prelude::{FromDer, X509Certificate};

const PQ: &str = "example.com/pq";
const CLASSICAL: &str = "example.com/classical";
const NS: &str = "shop";
const ML_DSA_OIDS: [&str; 3] = [
    "2.16.840.1.101.3.4.3.17",
    "2.16.840.1.101.3.4.3.18",
    "2.16.840.1.101.3.4.3.19",
];

// ---------------------------------------------------------------------------------------------
// The independent verifier.

fn ml_dsa_verify_with<P: MlDsaParams>(spki: &[u8], msg: &[u8], sig: &[u8]) -> Result<(), String>
where
    ml_dsa::VerifyingKey<P>: DecodePublicKey,
{
    let key = ml_dsa::VerifyingKey::<P>::from_public_key_der(spki)
        .map_err(|e| format!("RustCrypto refuses the SPKI: {e}"))?;
    let sig = ml_dsa::Signature::<P>::try_from(sig)
        .map_err(|e| format!("RustCrypto refuses the signature encoding: {e}"))?;
    key.verify(msg, &sig)
        .map_err(|e| format!("RustCrypto: the signature does not verify: {e}"))
}

/// Verifies an ML-DSA signature with RustCrypto: `sig_oid` must be the key's own set.
fn ml_dsa_verify(spki: &[u8], sig_oid: &str, msg: &[u8], sig: &[u8]) -> Result<(), String> {
    let (_, parsed) = x509_parser::x509::SubjectPublicKeyInfo::from_der(spki)
        .map_err(|e| format!("SPKI: {e}"))?;
    let key_oid = parsed.algorithm.algorithm.to_id_string();
    if key_oid != sig_oid {
        return Err(format!("signature algorithm {sig_oid} on a {key_oid} key"));
    }
    match sig_oid {
        "2.16.840.1.101.3.4.3.17" => ml_dsa_verify_with::<MlDsa44>(spki, msg, sig),
        "2.16.840.1.101.3.4.3.18" => ml_dsa_verify_with::<MlDsa65>(spki, msg, sig),
        "2.16.840.1.101.3.4.3.19" => ml_dsa_verify_with::<MlDsa87>(spki, msg, sig),
        other => Err(format!("{other} is not ML-DSA")),
    }
}

fn pem_of(ders: &[Vec<u8>]) -> String {
    ders.iter()
        .map(|d| pem::encode(&pem::Pem::new("CERTIFICATE", d.clone())))
        .collect()
}

fn der_blocks(text: &str) -> Vec<Vec<u8>> {
    pem::parse_many(text)
        .expect("PEM")
        .into_iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| b.into_contents())
        .collect()
}

/// Verifies a classical (ECDSA) signature with the `openssl` binary (`openssl dgst -verify`):
/// OpenSSL 3.0 cannot parse a certificate whose key is ML-DSA, but it checks the signature
/// over its TBSCertificate with the issuer's key.
fn openssl_verify_signature(issuer_spki: &[u8], sig_oid: &str, tbs: &[u8], sig: &[u8]) {
    let digest = match sig_oid {
        "1.2.840.10045.4.3.2" => "-sha256",
        "1.2.840.10045.4.3.3" => "-sha384",
        other => panic!("no openssl check for signature algorithm {other}"),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("issuer.pem");
    std::fs::write(
        &key,
        pem::encode(&pem::Pem::new("PUBLIC KEY", issuer_spki.to_vec())),
    )
    .expect("write");
    std::fs::write(dir.path().join("tbs.der"), tbs).expect("write");
    std::fs::write(dir.path().join("sig.der"), sig).expect("write");
    let out = Command::new("openssl")
        .args(["dgst", digest, "-verify"])
        .arg(&key)
        .arg("-signature")
        .arg(dir.path().join("sig.der"))
        .arg(dir.path().join("tbs.der"))
        .output()
        .expect("the `openssl` binary is required for these tests");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Verified OK"),
        "openssl dgst -verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Verifies `chain` (leaf first, no root) up to one of `anchors` without aws-lc: each ML-DSA
/// signature with RustCrypto, each ECDSA one with the `openssl` binary, plus the issuer names
/// and CA bits. Returns how many ML-DSA signatures RustCrypto checked.
fn verify_independently(chain: &[Vec<u8>], anchors: &[Vec<u8>]) -> usize {
    fn parse(d: &[u8]) -> X509Certificate<'_> {
        X509Certificate::from_der(d).expect("certificate").1
    }
    let certs: Vec<_> = chain.iter().map(|d| parse(d)).collect();
    let roots: Vec<_> = anchors.iter().map(|d| parse(d)).collect();
    let mut ml_dsa_checked = 0;
    for (i, c) in certs.iter().enumerate() {
        let issuer = certs
            .get(i + 1)
            .filter(|n| n.subject() == c.issuer())
            .or_else(|| roots.iter().find(|r| r.subject() == c.issuer()))
            .unwrap_or_else(|| panic!("certificate {i}: no issuer in the chain or the anchors"));
        assert!(issuer.is_ca(), "certificate {i}: its issuer is not a CA");
        let sig_oid = c.signature_algorithm.algorithm.to_id_string();
        if ML_DSA_OIDS.contains(&sig_oid.as_str()) {
            assert!(
                c.signature_algorithm.parameters.is_none(),
                "certificate {i}: RFC 9881 wants absent parameters"
            );
            ml_dsa_verify(
                issuer.public_key().raw,
                &sig_oid,
                c.tbs_certificate.as_ref(),
                &c.signature_value.data,
            )
            .unwrap_or_else(|e| panic!("certificate {i}: {e}"));
            ml_dsa_checked += 1;
        } else {
            openssl_verify_signature(
                issuer.public_key().raw,
                &sig_oid,
                c.tbs_certificate.as_ref(),
                &c.signature_value.data,
            );
        }
    }
    // The anchor that ends the chain, when self-signed with ML-DSA, too.
    for r in &roots {
        let oid = r.signature_algorithm.algorithm.to_id_string();
        if ML_DSA_OIDS.contains(&oid.as_str()) && r.subject() == r.issuer() {
            ml_dsa_verify(
                r.public_key().raw,
                &oid,
                r.tbs_certificate.as_ref(),
                &r.signature_value.data,
            )
            .unwrap_or_else(|e| panic!("root {}: {e}", r.subject()));
        }
    }
    ml_dsa_checked
}

/// The private key (PKCS#8 DER) and the leaf's SPKI are one ML-DSA key pair, and the private
/// key is RFC 9881's seed form (what RustCrypto, like OpenSSL 3.5, reads): RustCrypto loads the
/// private key, signs, and verifies with the certified public key.
fn key_matches_leaf(pkcs8: &[u8], leaf: &[u8]) {
    fn with<P: MlDsaParams>(pkcs8: &[u8], spki: &[u8])
    where
        ml_dsa::SigningKey<P>: DecodePrivateKey,
        ml_dsa::VerifyingKey<P>: DecodePublicKey,
    {
        let signing = ml_dsa::SigningKey::<P>::from_pkcs8_der(pkcs8)
            .unwrap_or_else(|e| panic!("RustCrypto refuses the private key: {e}"));
        let signature: ml_dsa::Signature<P> = signing.sign(b"podca key check");
        let verifying = ml_dsa::VerifyingKey::<P>::from_public_key_der(spki).expect("SPKI");
        verifying
            .verify(b"podca key check", &signature)
            .expect("the certified key is the private key's");
    }
    let (_, cert) = X509Certificate::from_der(leaf).expect("leaf");
    let spki = cert.public_key().raw;
    match cert
        .public_key()
        .algorithm
        .algorithm
        .to_id_string()
        .as_str()
    {
        "2.16.840.1.101.3.4.3.17" => with::<MlDsa44>(pkcs8, spki),
        "2.16.840.1.101.3.4.3.18" => with::<MlDsa65>(pkcs8, spki),
        "2.16.840.1.101.3.4.3.19" => with::<MlDsa87>(pkcs8, spki),
        other => panic!("the leaf key is {other}, not ML-DSA"),
    }
}

/// The profile bits that differ for ML-DSA leaves: keyUsage digitalSignature only.
fn assert_ml_dsa_leaf(leaf: &[u8], what: &str) {
    let (_, cert) = X509Certificate::from_der(leaf).expect("leaf");
    let spki = cert.public_key();
    assert!(
        ML_DSA_OIDS.contains(&spki.algorithm.algorithm.to_id_string().as_str()),
        "{what}"
    );
    assert!(spki.algorithm.parameters.is_none(), "{what}");
    let ku = cert.key_usage().expect("keyUsage").expect("keyUsage").value;
    assert_eq!(ku.flags, 1, "{what}: digitalSignature only");
}

// ---------------------------------------------------------------------------------------------
// CAs.

fn two_level_ca(algorithm: CaAlgorithm) -> IssuingCa {
    let now = OffsetDateTime::now_utc();
    IssuingCa::self_signed_root(
        Arc::new(MemoryKey::generate(algorithm).expect("root key")),
        &format!("{algorithm} root"),
        now,
        Duration::days(30),
    )
    .expect("root")
    .sign_intermediate(
        Arc::new(MemoryKey::generate(algorithm).expect("issuing key")),
        &format!("{algorithm} issuing"),
        now,
        Duration::days(10),
    )
    .expect("issuing")
}

/// An imported-style ML-DSA-87 CA with the longest chain a signer meets: root → intermediate →
/// issuing (podca's own `ca init` makes root → issuing), built with rcgen.
fn ml_dsa_87_three_level_ca() -> IssuingCa {
    let params = |cn: &str, path_len: Option<u8>| {
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, cn.to_string());
        p.is_ca = rcgen::IsCa::Ca(match path_len {
            Some(n) => rcgen::BasicConstraints::Constrained(n),
            None => rcgen::BasicConstraints::Unconstrained,
        });
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        p.use_authority_key_identifier_extension = path_len.is_some();
        p.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
        p.not_after = OffsetDateTime::now_utc() + Duration::days(30);
        p
    };
    let key = || rcgen::KeyPair::generate_for(&rcgen::PKCS_ML_DSA_87).expect("ML-DSA-87 key");
    let (root_key, mid_key, issuing_key) = (key(), key(), key());
    let root_params = params("pq 87 root", None);
    let root = root_params.self_signed(&root_key).expect("root");
    let root_issuer = rcgen::Issuer::new(root_params, root_key);
    let mid_params = params("pq 87 intermediate", Some(1));
    let mid = mid_params
        .signed_by(&mid_key, &root_issuer)
        .expect("intermediate");
    let mid_issuer = rcgen::Issuer::new(mid_params, mid_key);
    let issuing = params("pq 87 issuing", Some(0))
        .signed_by(&issuing_key, &mid_issuer)
        .expect("issuing");
    let ca_key = MemoryKey::from_pem(&issuing_key.serialize_pem()).expect("podca loads it");
    IssuingCa::from_pem(
        Arc::new(ca_key),
        &format!("{}{}", issuing.pem(), mid.pem()),
        Some(&root.pem()),
    )
    .expect("a three-level ML-DSA-87 CA")
}

fn pq_policy() -> SignerPolicy {
    let mut policy = SignerPolicy::permissive("cluster.local");
    policy.key_types = SignerKeyType::EVERY.to_vec();
    policy.dns_name_templates = vec!["{sa}.{ns}.svc".into()];
    policy
}

// ---------------------------------------------------------------------------------------------
// The controller path.

struct Env {
    cluster: Cluster,
    kubelet: KubeletSim,
    node_uid: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), podca_controller::Error>>,
}

impl Env {
    /// An emulator (`PodCertificateMLDSA` as given), the controller signing with `ca` for
    /// [`PQ`] (ML-DSA allowed) and [`CLASSICAL`] (the default key types).
    async fn start(ca: IssuingCa, gate: bool, version: &str) -> Env {
        install_crypto();
        let cluster = Cluster::start_with(ClusterConfig {
            emulator: EmulatorConfig {
                api_mode: ApiMode::V1AndV1Beta1,
                pod_certificate_mldsa: gate,
                auto_create_namespaces: true,
                ..Default::default()
            },
            signers: &[PQ, CLASSICAL],
            ..Default::default()
        })
        .await;
        cluster.emu.add_namespace(NS);
        let node_uid = cluster.emu.add_node("node-1");
        let token = cluster.emu.add_node_identity("node-1");
        let kubelet = KubeletSim::new(cluster.emu.base_url(), &token, version);
        let client = podca_controller::connect(Some(&cluster.kubeconfig))
            .await
            .expect("client");
        let signers = BTreeMap::from([
            (PQ.to_string(), pq_policy()),
            (
                CLASSICAL.to_string(),
                SignerPolicy::permissive("cluster.local"),
            ),
        ]);
        let mut options = Options::new(signers, Arc::new(ca));
        options.publisher = Some(podca_controller::publisher::PublisherOptions::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(podca_controller::run(client, options, async move {
            let _ = stopped.await;
        }));
        Env {
            cluster,
            kubelet,
            node_uid,
            stop: Some(stop),
            task,
        }
    }

    fn pod(&self, name: &str, signer: &str, key_type: KeyType) -> PodRef {
        add_pod(
            &self.cluster.emu,
            NS,
            name,
            name,
            ("node-1", &self.node_uid),
            &[(signer, key_type)],
        )
    }

    async fn obtain(&self, pod: &PodRef, signer: &str, key_type: KeyType) -> Outcome {
        self.kubelet
            .obtain(
                pod,
                &RequestOptions::new(signer, key_type),
                StdDuration::from_secs(30),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", key_type.name()))
    }

    /// Stops the controller without the no-rejections check (for tests that provoke them).
    fn abort(self) {
        self.task.abort();
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(StdDuration::from_secs(20), self.task).await;
        let counters = self.cluster.emu.counters();
        assert_eq!(
            (counters.validation_rejections, counters.forbidden),
            (0, 0),
            "the emulator refused a write: {:?}",
            counters.rejections_by_cause
        );
    }
}

fn issued(outcome: Outcome, what: &str) -> Credential {
    match outcome {
        Outcome::Issued(c) => *c,
        other => panic!("{what}: not issued: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ml_dsa_subject_under_an_ecdsa_and_an_ml_dsa_ca_through_the_controller() {
    for ca_alg in [CaAlgorithm::EcdsaP256, CaAlgorithm::MlDsa65] {
        let ca = two_level_ca(ca_alg);
        let anchors = der_blocks(&ca.roots_pem());
        let env = Env::start(ca, true, "v1").await;
        for (i, kt) in KeyType::ML_DSA.into_iter().enumerate() {
            let what = format!("{ca_alg} CA, {} subject", kt.name());
            let pod = env.pod(&format!("pq-{i}"), PQ, kt);
            let credential = issued(env.obtain(&pod, PQ, kt).await, &what);
            credential.check_leaf_key().expect("the kubelet's key");
            credential
                .verify_chain(&pem_of(&anchors), OffsetDateTime::now_utc())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(credential.chain_der.len(), 2, "{what}: leaf + issuing");
            let checked = verify_independently(&credential.chain_der, &anchors);
            let expected = if ca_alg.is_ml_dsa() { 2 } else { 0 };
            assert_eq!(checked, expected, "{what}: ML-DSA signatures checked");
            assert_ml_dsa_leaf(&credential.chain_der[0], &what);
            key_matches_leaf(credential.key.pkcs8_der(), &credential.chain_der[0]);
        }
        // A classical subject under the ML-DSA CA, and the default policy's refusal of ML-DSA.
        let pod = env.pod("classical-0", CLASSICAL, KeyType::EcdsaP256);
        let credential = issued(
            env.obtain(&pod, CLASSICAL, KeyType::EcdsaP256).await,
            "ECDSAP256",
        );
        verify_independently(&credential.chain_der, &anchors);
        let pod = env.pod("refused-0", CLASSICAL, KeyType::MlDsa65);
        match env.obtain(&pod, CLASSICAL, KeyType::MlDsa65).await {
            Outcome::Denied { reason, message } => {
                assert_eq!(reason, "UnsupportedKeyType");
                assert_eq!(
                    message,
                    "key type MLDSA65 is not allowed by this signer's policy; use keyType \
                     ECDSAP256 (allowed: RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, \
                     ED25519)"
                );
            }
            other => panic!("ML-DSA under the default policy: {other:?}"),
        }
        env.stop().await;
    }
}

/// The stub of `key` with its self-signature's last byte flipped.
fn broken_stub(kt: KeyType) -> Vec<u8> {
    let key = podca_tests::kubelet::SubjectKey::generate(kt).expect("key");
    let mut csr = key.stub_csr_der().expect("stub");
    let last = csr.len() - 1;
    csr[last] ^= 1;
    csr
}

/// Creates a PCR for `pod` with `stub` as the cluster admin (no NodeRestriction); the answer's
/// status and message.
async fn create_with_stub(cluster: &Cluster, pod: &PodRef, stub: &[u8]) -> (u16, String) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(stub);
    let body = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {"generateName": "req-", "namespace": pod.namespace},
        "spec": {
            "signerName": PQ,
            "podName": pod.name,
            "podUID": pod.uid,
            "serviceAccountName": pod.service_account,
            "serviceAccountUID": pod.service_account_uid,
            "nodeName": pod.node_name,
            "nodeUID": pod.node_uid,
            "stubPKCS10Request": b64,
        },
    });
    let resp = cluster
        .admin
        .post(
            &format!(
                "/apis/certificates.k8s.io/v1/namespaces/{}/podcertificaterequests",
                pod.namespace
            ),
            &body,
        )
        .await
        .expect("the emulator answers");
    let message = resp.json()["message"].as_str().unwrap_or("").to_string();
    (resp.status, message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_admits_ml_dsa_stubs_only_with_the_gate() {
    // Without the gate: every ML-DSA stub is refused at create, as upstream does (rule 8.9).
    let env = Env::start(two_level_ca(CaAlgorithm::EcdsaP256), false, "v1").await;
    for (i, kt) in KeyType::ML_DSA.into_iter().enumerate() {
        let pod = env.pod(&format!("off-{i}"), PQ, kt);
        let err = env
            .kubelet
            .request(&pod, &RequestOptions::new(PQ, kt), None)
            .await
            .expect_err("refused without the gate");
        assert!(
            err.0.contains("PCR create answered 422")
                && err.0.contains(
                    "spec.stubPKCS10Request: Invalid value: unknown public key type; supported \
                     types are Ed25519, ECDSA, and RSA"
                ),
            "{}: {err}",
            kt.name()
        );
    }
    // Classical keys are unaffected.
    let pod = env.pod("off-classical", PQ, KeyType::Ed25519);
    issued(env.obtain(&pod, PQ, KeyType::Ed25519).await, "ED25519");
    let rejected = env.cluster.emu.counters().validation_rejections;
    assert_eq!(rejected, 3, "the three ML-DSA creates");
    env.abort();

    // With the gate: admitted and issued; a broken ML-DSA self-signature is still refused
    // (rule 8.11), and the legacy fields never take ML-DSA (rule 8.10).
    let env = Env::start(two_level_ca(CaAlgorithm::MlDsa44), true, "v1beta1").await;
    let pod = env.pod("on-0", PQ, KeyType::MlDsa44);
    issued(env.obtain(&pod, PQ, KeyType::MlDsa44).await, "MLDSA44");
    let pod = env.pod("on-broken", PQ, KeyType::MlDsa87);
    let (status, message) =
        create_with_stub(&env.cluster, &pod, &broken_stub(KeyType::MlDsa87)).await;
    assert_eq!(status, 422, "{message}");
    assert!(
        message.contains("spec.stubPKCS10Request: Invalid value: invalid signature"),
        "{message}"
    );
    let pod = env.pod("on-legacy", PQ, KeyType::MlDsa65);
    let mut legacy = RequestOptions::new(PQ, KeyType::MlDsa65);
    legacy.legacy = true;
    let err = env
        .kubelet
        .request(&pod, &legacy, None)
        .await
        .expect_err("the legacy fields refuse ML-DSA");
    assert!(
        err.0.contains("spec.pkixPublicKey")
            && err
                .0
                .contains("unknown public key type; supported types are Ed25519, ECDSA, and RSA"),
        "{err}"
    );
    let counters = env.cluster.emu.counters();
    assert_eq!(counters.validation_rejections, 2, "{counters:?}");
    env.abort();
}

// ---------------------------------------------------------------------------------------------
// The rustls handshake between two ML-DSA-65 pods of an ML-DSA-65 CA.

fn rustls_roots(anchors: &[Vec<u8>]) -> Arc<rustls::RootCertStore> {
    let mut store = rustls::RootCertStore::empty();
    for d in anchors {
        store.add(CertificateDer::from(d.clone())).expect("anchor");
    }
    Arc::new(store)
}

fn chain_of(c: &Credential) -> Vec<CertificateDer<'static>> {
    c.chain_der
        .iter()
        .map(|d| CertificateDer::from(d.clone()))
        .collect()
}

fn key_of(c: &Credential) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(c.key.pkcs8_der().to_vec().into())
}

/// One in-memory mutual-TLS handshake (TLS 1.3): `client` connects to `server_name`; both
/// verify the peer against `anchors`.
fn handshake(
    client: &Credential,
    server: &Credential,
    server_name: &str,
    anchors: &[Vec<u8>],
) -> Result<(), String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        rustls_roots(anchors),
        Arc::clone(&provider),
    )
    .build()
    .map_err(|e| e.to_string())?;
    let server_config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain_of(server), key_of(server))
        .map_err(|e| format!("server config: {e}"))?;
    let client_config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(rustls_roots(anchors))
        .with_client_auth_cert(chain_of(client), key_of(client))
        .map_err(|e| format!("client config: {e}"))?;
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
    let mut c =
        rustls::ClientConnection::new(Arc::new(client_config), name).map_err(|e| e.to_string())?;
    let mut s =
        rustls::ServerConnection::new(Arc::new(server_config)).map_err(|e| e.to_string())?;
    podca_tests::tls::handshake_in_memory(&mut c, &mut s)?;
    if s.peer_certificates().is_none_or(|p| p.is_empty()) {
        return Err("the server saw no client certificate".into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ml_dsa_65_pods_of_an_ml_dsa_65_ca_complete_a_rustls_mtls_handshake() {
    let ca = two_level_ca(CaAlgorithm::MlDsa65);
    let anchors = der_blocks(&ca.roots_pem());
    let env = Env::start(ca, true, "v1").await;
    let mut credentials = vec![];
    for name in ["frontend", "backend"] {
        let pod = env.pod(name, PQ, KeyType::MlDsa65);
        credentials.push(issued(env.obtain(&pod, PQ, KeyType::MlDsa65).await, name));
    }
    env.stop().await;
    let (front, back) = (&credentials[0], &credentials[1]);
    for c in [front, back] {
        // The key signs what its certificate's key verifies (aws-lc both sides).
        let pair = aws_lc_rs::signature::PqdsaKeyPair::from_pkcs8(
            &aws_lc_rs::signature::ML_DSA_65_SIGNING,
            c.key.pkcs8_der(),
        )
        .expect("ML-DSA-65 PKCS#8");
        let mut sig = vec![0; 3309];
        pair.sign(b"m", &mut sig).expect("sign");
        let (_, leaf) = X509Certificate::from_der(&c.chain_der[0]).expect("leaf");
        aws_lc_rs::signature::UnparsedPublicKey::new(
            &aws_lc_rs::signature::ML_DSA_65,
            &leaf.public_key().subject_public_key.data,
        )
        .verify(b"m", &sig)
        .expect("the leaf's key verifies the pod key's signature");
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            rustls_roots(&anchors),
            Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        )
        .build()
        .expect("verifier");
        let chain = chain_of(c);
        use rustls::client::danger::ServerCertVerifier as _;
        let name = if std::ptr::eq(c, front) {
            "frontend.shop.svc"
        } else {
            "backend.shop.svc"
        };
        verifier
            .verify_server_cert(
                &chain[0],
                &chain[1..],
                &ServerName::try_from(name).expect("name"),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .expect("the chain verifies");
    }
    // Both ways; each side verifies the other's ML-DSA-65 chain and CertificateVerify.
    handshake(front, back, "backend.shop.svc", &anchors).expect("frontend → backend");
    handshake(back, front, "frontend.shop.svc", &anchors).expect("backend → frontend");
    // A peer that trusts another ML-DSA-65 CA (of the same names) refuses them: its root's
    // key does not verify the issuing certificate's signature.
    let other = der_blocks(&two_level_ca(CaAlgorithm::MlDsa65).roots_pem());
    let err = handshake(front, back, "backend.shop.svc", &other).unwrap_err();
    assert_eq!(err, "client side: invalid peer certificate: BadSignature");
}

// ---------------------------------------------------------------------------------------------
// The CLI and the gRPC API (`podca ca init`, `podca issue`, `podca dev`).

fn podca(args: &[&str]) -> Output {
    Command::new(podca_binary())
        .args(args)
        .env_remove("PODCA_DATA_DIR")
        .env("PODCA_LOG", "warn")
        .output()
        .expect("podca runs")
}

fn ok(args: &[&str]) -> String {
    let out = podca(args);
    assert!(
        out.status.success(),
        "podca {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checks a credential bundle (PKCS#8 key, then the chain) independently.
fn check_bundle(bundle: &str, anchors_pem: &str, what: &str) {
    let blocks = pem::parse_many(bundle).expect("PEM");
    assert_eq!(blocks[0].tag(), "PRIVATE KEY", "{what}: kubelet layout");
    let chain = der_blocks(bundle);
    let anchors = der_blocks(anchors_pem);
    verify_independently(&chain, &anchors);
    assert_ml_dsa_leaf(&chain[0], what);
    key_matches_leaf(blocks[0].contents(), &chain[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_the_grpc_api_issue_ml_dsa_under_ecdsa_and_ml_dsa_cas() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for algorithm in ["ecdsa-p256", "ml-dsa-65"] {
        let dir = tmp.path().join(algorithm);
        let d = dir.to_str().expect("utf-8");
        ok(&["ca", "init", "--dir", d, "--algorithm", algorithm]);
        let anchors = std::fs::read_to_string(podca_signer::FileStore::new(&dir).root_cert_path())
            .expect("anchors");
        let anchor_ders = der_blocks(&anchors);
        let (_, root) = X509Certificate::from_der(&anchor_ders[0]).expect("root");
        let expected_sig = if algorithm == "ml-dsa-65" {
            "2.16.840.1.101.3.4.3.18"
        } else {
            "1.2.840.10045.4.3.2"
        };
        assert_eq!(
            root.signature_algorithm.algorithm.to_id_string(),
            expected_sig
        );
        for kt in ["MLDSA44", "MLDSA65", "MLDSA87"] {
            let out = dir.join(format!("{kt}.pem"));
            ok(&[
                "issue",
                "--dir",
                d,
                "-n",
                NS,
                "--service-account",
                "web",
                "--key-type",
                kt,
                "-o",
                out.to_str().expect("utf-8"),
            ]);
            let bundle = std::fs::read_to_string(&out).expect("bundle");
            check_bundle(
                &bundle,
                &anchors,
                &format!("podca issue, {algorithm} CA, {kt}"),
            );
        }
    }

    // `podca ca rotate --algorithm` prepares an ML-DSA successor of the ECDSA CA.
    let ecdsa_dir = tmp.path().join("ecdsa-p256");
    let said = podca(&[
        "ca",
        "rotate",
        "--dir",
        ecdsa_dir.to_str().expect("utf-8"),
        "--algorithm",
        "ml-dsa-87",
        "--ca-lifetime-days",
        "30",
        "--max-leaf-lifetime-seconds",
        "86400",
    ]);
    assert!(said.status.success(), "{said:?}");
    assert!(
        String::from_utf8_lossy(&said.stderr)
            .contains("new CA generations use ml-dsa-87 (was ecdsa-p256)"),
        "{said:?}"
    );
    let generations = podca_signer::FileStore::new(&ecdsa_dir)
        .generations()
        .expect("generations");
    let phases: Vec<_> = generations.iter().map(|g| g.generation.phase).collect();
    assert_eq!(
        phases,
        [
            podca_signer::rotation::Phase::Active,
            podca_signer::rotation::Phase::Prepared
        ]
    );
    let (_, next_root) = X509Certificate::from_der(generations[1].roots[0].der()).expect("root");
    assert_eq!(
        next_root.signature_algorithm.algorithm.to_id_string(),
        "2.16.840.1.101.3.4.3.19"
    );

    // An HSM cannot hold an ML-DSA CA key: a clear error before any token is touched.
    let hsm = podca(&[
        "ca",
        "init",
        "--dir",
        tmp.path().join("hsm").to_str().expect("utf-8"),
        "--algorithm",
        "ml-dsa-65",
        "--pkcs11-uri",
        "pkcs11:token=podca;object=ca?module-path=/nonexistent/libsofthsm2.so&pin-value=1234",
        "--pkcs11-generate",
    ]);
    assert!(!hsm.status.success());
    let stderr = String::from_utf8_lossy(&hsm.stderr);
    assert!(
        stderr.contains(
            "the PKCS#11 backend supports ecdsa-p256, ecdsa-p384 and rsa-sha256 CA keys, not \
             ml-dsa-65 (ML-DSA CA keys need the file or Secret backend)"
        ),
        "{stderr}"
    );

    // podca dev on the ML-DSA-65 CA, with a signer that allows ML-DSA: gRPC IssueCertificate
    // for every parameter set, and `podca issue --server`.
    let config = r#"
[signers."podca.dev/default"]
trust_domain = "podca.dev.local"
key_types = ["ECDSAP256", "MLDSA44", "MLDSA65", "MLDSA87"]

[signers."example.com/classical"]
trust_domain = "podca.dev.local"

[grpc]
signer = "podca.dev/default"
signers = ["podca.dev/default", "example.com/classical"]

[[dev.bundles]]
namespace = "shop"
service_account = "pq"
key_type = "MLDSA87"
"#;
    let dev = DevProcess::start_with(DevOptions {
        config: Some(config),
        data_dir: Some(tmp.path().join("ml-dsa-65")),
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    for kt in SignerKeyType::ML_DSA {
        let key = GeneratedKey::generate(kt).expect("key");
        let request = IssueCertificateRequest {
            csr: key.stub_csr_der().expect("CSR"),
            ..Default::default()
        };
        assert!(
            prost::Message::encoded_len(&request) < podca_grpc::core::MAX_MESSAGE_BYTES / 4,
            "{kt}: the request is far below the gRPC message limit"
        );
        let mut call = tonic::Request::new(request);
        call.metadata_mut()
            .insert("x-podca-namespace", "default".parse().expect("ascii"));
        call.metadata_mut()
            .insert("x-podca-service-account", "default".parse().expect("ascii"));
        let answer = client
            .issue_certificate(call)
            .await
            .unwrap_or_else(|s| panic!("{kt}: {s:?}"))
            .into_inner();
        let chain = der_blocks(&answer.certificate_chain_pem);
        let checked = verify_independently(&chain, &der_blocks(&answer.trust_anchors_pem));
        assert_eq!(checked, 2, "{kt}: leaf and issuing signed with ML-DSA-65");
        assert_ml_dsa_leaf(&chain[0], &format!("gRPC {kt}"));
        assert_eq!(chain[0].len(), {
            let (_, c) = X509Certificate::from_der(&chain[0]).expect("leaf");
            c.as_ref().len()
        });
    }
    // The refusals, each with its status and message.
    let refusal = |csr: Vec<u8>, signer: &str| {
        let mut call = tonic::Request::new(IssueCertificateRequest {
            csr,
            signer_name: signer.to_string(),
            ..Default::default()
        });
        call.metadata_mut()
            .insert("x-podca-namespace", "default".parse().expect("ascii"));
        call.metadata_mut()
            .insert("x-podca-service-account", "default".parse().expect("ascii"));
        call
    };
    let cases: [(Vec<u8>, &str, tonic::Code, &str); 4] = [
        (
            csr_around(&ml_dsa_spki(18, None, 1951)),
            "",
            tonic::Code::InvalidArgument,
            "malformed ML-DSA public key: ML-DSA-65 public key is 1951 bytes; it must be 1952",
        ),
        (
            csr_around(&ml_dsa_spki(18, Some(&[0x05, 0x00]), 1952)),
            "",
            tonic::Code::InvalidArgument,
            "malformed ML-DSA public key: the ML-DSA-65 AlgorithmIdentifier has parameters; \
             RFC 9881 requires them absent",
        ),
        (
            {
                let mut csr = GeneratedKey::generate(SignerKeyType::MlDsa87)
                    .expect("key")
                    .stub_csr_der()
                    .expect("CSR");
                let last = csr.len() - 1;
                csr[last] ^= 1;
                csr
            },
            "",
            tonic::Code::InvalidArgument,
            "CSR self-signature does not verify against the subject public key",
        ),
        (
            GeneratedKey::generate(SignerKeyType::MlDsa65)
                .expect("key")
                .stub_csr_der()
                .expect("CSR"),
            "example.com/classical",
            tonic::Code::FailedPrecondition,
            "UnsupportedKeyType: key type MLDSA65 is not allowed by this signer's policy; use \
             keyType ECDSAP256 (allowed: RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, \
             ED25519)",
        ),
    ];
    for (csr, signer, code, message) in cases {
        let status = client
            .issue_certificate(refusal(csr, signer))
            .await
            .expect_err("refused");
        assert_eq!((status.code(), status.message()), (code, message));
    }

    // The kept credential bundle: an ML-DSA-87 key under the ML-DSA-65 CA.
    let bundle_dir = dev.data_dir.join("bundles/shop/pq");
    let mut kept = String::new();
    for _ in 0..400 {
        kept = std::fs::read_to_string(bundle_dir.join("credentialbundle.pem")).unwrap_or_default();
        if kept.contains("END CERTIFICATE") {
            break;
        }
        tokio::time::sleep(StdDuration::from_millis(25)).await;
    }
    check_bundle(
        &kept,
        &std::fs::read_to_string(bundle_dir.join("trust-bundle.pem")).expect("trust bundle"),
        "podca dev bundle",
    );
    let kept_chain = der_blocks(&kept);
    let (_, leaf) = X509Certificate::from_der(&kept_chain[0]).expect("leaf");
    assert_eq!(
        leaf.public_key().algorithm.algorithm.to_id_string(),
        "2.16.840.1.101.3.4.3.19"
    );

    let out = tmp.path().join("remote.pem");
    let trust = tmp.path().join("remote-anchors.pem");
    ok(&[
        "issue",
        "--server",
        &format!("http://{}", dev.grpc),
        "--key-type",
        "MLDSA65",
        "-o",
        out.to_str().expect("utf-8"),
        "--trust-bundle",
        trust.to_str().expect("utf-8"),
    ]);
    check_bundle(
        &std::fs::read_to_string(&out).expect("bundle"),
        &std::fs::read_to_string(&trust).expect("anchors"),
        "podca issue --server",
    );
}

// ---------------------------------------------------------------------------------------------
// Sizes at the largest case: ML-DSA-87 subject, ML-DSA-87 CA, root → intermediate → issuing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_case_fits_every_limit() {
    let ca = ml_dsa_87_three_level_ca();
    let anchors_pem = ca.roots_pem();
    let anchors = der_blocks(&anchors_pem);

    // The ledger record: fingerprints and the key type, whatever the certificate's size.
    let key = GeneratedKey::generate(SignerKeyType::MlDsa87).expect("key");
    let request = podca_signer::CertificateRequest {
        key: Ok(key.public.clone()),
        namespace: NS.into(),
        service_account: "web".into(),
        pod_name: None,
        max_expiration: None,
        requested_lifetime: None,
        user_annotations: BTreeMap::new(),
    };
    let now = OffsetDateTime::now_utc();
    let cert = match podca_signer::sign_request(&pq_policy(), &ca, &request, now) {
        podca_signer::Outcome::Issued(c) => *c,
        other => panic!("{other:?}"),
    };
    let context = podca_signer::RecordContext {
        source: podca_signer::Source::Cli,
        signer: PQ.into(),
        identity: cert.spiffe_id.clone(),
        requester: None,
        namespace: NS.into(),
        service_account: "web".into(),
        pod_name: None,
        pod_uid: None,
        node_name: None,
        request_uid: None,
        request_name: None,
        ca_generation: None,
        issuer_fingerprint: None,
        auth: None,
        replica: "test".into(),
        time: now,
    };
    let record = podca_signer::LedgerRecord::issued(&context, &cert);
    let encoded = serde_json::to_vec(&record).expect("JSON");
    assert!(encoded.len() < 2048, "{} bytes", encoded.len());
    let tmp = tempfile::tempdir().expect("tempdir");
    let ledger = podca_signer::Ledger::open(&tmp.path().join("ledger.redb")).expect("ledger");
    ledger
        .append(std::slice::from_ref(&record))
        .expect("append");
    let back = ledger.latest(1).expect("read");
    assert_eq!(back[0].key_type.as_deref(), Some("MLDSA87"));

    // The PCR status (chain ≤ 100 KiB) and the ClusterTrustBundle, through the controller.
    let env = Env::start(ca, true, "v1").await;
    let pod = env.pod("largest", PQ, KeyType::MlDsa87);
    let credential = issued(env.obtain(&pod, PQ, KeyType::MlDsa87).await, "MLDSA87");
    assert_eq!(credential.chain_der.len(), 3, "leaf, issuing, intermediate");
    assert_eq!(verify_independently(&credential.chain_der, &anchors), 3);
    key_matches_leaf(credential.key.pkcs8_der(), &credential.chain_der[0]);
    let chain_pem = credential.chain_pem.len();
    let ders: Vec<usize> = credential.chain_der.iter().map(Vec::len).collect();
    eprintln!("largest case: chain DER sizes {ders:?}, chain PEM {chain_pem} bytes");
    assert!(
        chain_pem < podca_tests::emulator::pcr::MAX_CHAIN / 2,
        "{chain_pem} bytes of chain"
    );
    // A stub CSR is capped at 10 KiB (rule 8.7): ML-DSA-87's is the largest kubelet sends.
    let stub = credential.key.stub_csr_der().expect("stub").len();
    assert!(
        stub < podca_tests::emulator::pcr::MAX_KEY_MATERIAL,
        "{stub} bytes"
    );
    let mut published = String::new();
    for _ in 0..400 {
        published = podca_tests::kubelet::trust_anchors_for_signer(&env.cluster.admin, "v1", PQ)
            .await
            .expect("CTB list");
        if !published.is_empty() {
            break;
        }
        tokio::time::sleep(StdDuration::from_millis(25)).await;
    }
    assert_eq!(
        der_blocks(&published),
        anchors,
        "the CTB holds the ML-DSA-87 root"
    );
    // During a rotation the bundle holds two roots: still far below the CTB's 1 MiB.
    let overlap = format!(
        "{anchors_pem}{}",
        two_level_ca(CaAlgorithm::MlDsa87).roots_pem()
    );
    assert!(podca_tests::emulator::pcr::validate_trust_bundle(&overlap).is_empty());
    assert!(overlap.len() < 64 * 1024, "{} bytes", overlap.len());
    eprintln!(
        "largest case: stub CSR {stub} bytes, two-root CTB {} bytes",
        overlap.len()
    );
    env.stop().await;

    // gRPC: the request is the CSR; the answer (chain + anchors) passes tonic's default
    // 4 MiB decoding limit by three orders of magnitude.
    let csr = key.stub_csr_der().expect("CSR");
    let request = IssueCertificateRequest {
        csr,
        ..Default::default()
    };
    let request_len = prost::Message::encoded_len(&request);
    assert!(
        request_len < podca_grpc::core::MAX_MESSAGE_BYTES,
        "{request_len} bytes"
    );
    eprintln!(
        "largest case: gRPC request {request_len} bytes, ledger record {} bytes",
        encoded.len()
    );
    assert!(cert.chain_pem.len() + anchors_pem.len() < 64 * 1024);
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

/// The SPKI of an ML-DSA key with the OID ending `oid_last` (17/18/19), optional parameters
/// and `len` key bytes.
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

/// A CSR around `spki` with an empty subject and a garbage signature (the key is refused
/// before the signature is looked at).
fn csr_around(spki: &[u8]) -> Vec<u8> {
    let mut info = vec![0x02, 0x01, 0x00, 0x30, 0x00];
    info.extend_from_slice(spki);
    info.extend([0xa0, 0x00]);
    let mut body = tlv(0x30, &info);
    body.extend(tlv(
        0x30,
        &[
            0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x03, 18,
        ],
    ));
    body.extend(tlv(0x03, &[0u8; 3310]));
    tlv(0x30, &body)
}

// ---------------------------------------------------------------------------------------------
// The Secret CA backend with an ML-DSA-65 CA, through the real `podca serve`.

/// `podca ca init --algorithm ml-dsa-65` makes the CA; its issuing certificate, key and root go
/// into the `kubernetes.io/tls` Secret as `docs/ca.md` says ("Secret backend"); `podca
/// serve` with `[ca] backend = "secret"` publishes the ML-DSA root and signs PCRs for an
/// ML-DSA-65 and a P-256 subject (emulator with `PodCertificateMLDSA`). Each chain is checked
/// without aws-lc: both ML-DSA-65 signatures (leaf, issuing) and the root's with RustCrypto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_signs_ml_dsa_and_p256_subjects_with_an_ml_dsa_65_ca_from_a_secret() {
    use podca_tests::cluster::{NewPcr, PODCA_USER};
    use podca_tests::emulator::Subject;
    use podca_tests::emulator::podca_rbac::PodcaRbac;
    use podca_tests::kubelet::trust_anchors_for_signer;
    use podca_tests::process::ServeProcess;

    let c = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            pod_certificate_mldsa: true,
            auto_create_namespaces: true,
            ..Default::default()
        },
        // Not in `system:serviceaccounts`: podca reads the bundles through its signer role only.
        podca_groups: &["system:authenticated"],
        signers: &[PQ],
    })
    .await;
    let ca_dir = c.dir.path().join("ca");
    ok(&[
        "ca",
        "init",
        "--dir",
        ca_dir.to_str().expect("utf-8"),
        "--algorithm",
        "ml-dsa-65",
    ]);
    let generation = ca_dir.join("generations/1");
    let read = |file: &str| std::fs::read(generation.join(file)).expect("a ca init file");
    let (issuing, key, root) = (read("issuing.pem"), read("issuing.key"), read("root.pem"));
    c.emu.add_secret(
        "podca-system",
        "podca-ca",
        "kubernetes.io/tls",
        &[("tls.crt", &issuing), ("tls.key", &key), ("ca.crt", &root)],
    );
    // Exactly the rules the Secret backend documents, in the Secret's namespace (the CA Secret,
    // its history ConfigMap, the JWT key Secret), and the JWKS ConfigMap's (`[jwt]
    // jwks_configmap_namespace` below).
    let rules = PodcaRbac::secret_backend_rules("podca-system", "podca-ca")
        .into_iter()
        .chain(PodcaRbac::jwks_configmap_rules(
            "podca-system",
            "podca-jwks",
        ));
    for rule in rules {
        c.emu.grant(Subject::User(PODCA_USER.into()), rule);
    }
    let config = c.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\nbackend = \"secret\"\nsecret = \"podca-system/podca-ca\"\n\n[jwt]\n\
             jwks_configmap_namespace = \"podca-system\"\n\n[ledger]\npath = \
             {:?}\n\n[signers.\"{PQ}\"]\ntrust_domain = \"cluster.local\"\nkey_types = \
             [\"ECDSAP256\", \"MLDSA65\"]\n",
            c.dir.path().join("ledger.redb").display().to_string()
        ),
    )
    .expect("config");
    let _serve = ServeProcess::start(&config, &c.kubeconfig, &[], &[]);

    // The ML-DSA-65 root from the Secret's ca.crt is the published anchor.
    let deadline = std::time::Instant::now() + StdDuration::from_secs(30);
    let bundle = loop {
        let text = trust_anchors_for_signer(&c.admin, "v1", PQ)
            .await
            .unwrap_or_default();
        if text.contains("BEGIN CERTIFICATE") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no bundle published for {PQ}"
        );
        tokio::time::sleep(StdDuration::from_millis(100)).await;
    };
    let anchors = der_blocks(&bundle);
    assert_eq!(
        anchors,
        der_blocks(std::str::from_utf8(&root).expect("PEM"))
    );
    let issuing_der = der_blocks(std::str::from_utf8(&issuing).expect("PEM"));

    for (name, key_type) in [
        ("secret-mldsa65", SignerKeyType::MlDsa65),
        ("secret-p256", SignerKeyType::EcdsaP256),
    ] {
        let subject = GeneratedKey::generate(key_type).expect("key");
        let stub = subject.stub_csr_der().expect("stub CSR");
        NewPcr::stub("v1", "apps", name.to_owned(), PQ, stub)
            .file(&c.admin)
            .await;
        let chain = der_blocks(&c.wait_issued(name, StdDuration::from_secs(30)).await);
        assert_eq!(chain.len(), 2, "{name}: leaf and issuing, no root");
        assert_eq!(chain[1], issuing_der[0], "{name}: the Secret's issuing CA");
        let checked = verify_independently(&chain, &anchors);
        assert_eq!(checked, 2, "{name}: leaf and issuing signed with ML-DSA-65");
        let (_, leaf) = X509Certificate::from_der(&chain[0]).expect("leaf");
        assert_eq!(
            leaf.signature_algorithm.algorithm.to_id_string(),
            "2.16.840.1.101.3.4.3.18",
            "{name}"
        );
        assert_eq!(
            leaf.public_key().raw,
            subject.public.spki_der(),
            "{name}: the requested SPKI verbatim"
        );
        if key_type.is_ml_dsa() {
            assert_ml_dsa_leaf(&chain[0], name);
        } else {
            // A classical subject keeps the classical profile: keyUsage digitalSignature.
            let ku = leaf.key_usage().expect("keyUsage").expect("keyUsage").value;
            assert_eq!(ku.flags, 1, "{name}");
        }
    }
    let counters = c.emu.counters();
    assert_eq!(
        (counters.validation_rejections, counters.forbidden),
        (0, 0),
        "{:?}",
        counters.rejections_by_cause
    );
}

// ---------------------------------------------------------------------------------------------
// An HSM without ML-DSA (SoftHSM2): a clear error at start, naming the algorithm.

/// `podca ca init --algorithm ml-dsa-65` into a real SoftHSM2 token, and `podca serve` with
/// `[ca] backend = "pkcs11"` on an ML-DSA-65 CA whose key would have to come from the token,
/// each stop at once with one error that names ml-dsa-65 and the backends that can hold it;
/// nothing is generated in the token, and serve does not report a mere key mismatch (the
/// token holds an ECDSA key exactly where the URI points).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn softhsm2_refuses_an_ml_dsa_ca_at_start_naming_the_algorithm() {
    use podca_tests::softhsm::{SOFTHSM2_MODULE, private_key_labels, softhsm_token};
    const REFUSAL: &str = "the PKCS#11 backend supports ecdsa-p256, ecdsa-p384 and rsa-sha256 \
                           CA keys, not ml-dsa-65 (ML-DSA CA keys need the file or Secret \
                           backend)";
    let c = Cluster::start(ApiMode::V1Only, &[PQ]).await;
    let t = c.dir.path();
    let conf = softhsm_token(t, "pq", "87654321", "123456");
    let pin = t.join("pin");
    std::fs::write(&pin, "123456\n").expect("pin");
    let pin = pin.to_str().expect("utf-8");
    let uri = format!("pkcs11:token=pq;object=podca-ca?module-path={SOFTHSM2_MODULE}");
    let run = |args: &[&str]| {
        Command::new(podca_binary())
            .args(args)
            .env_remove("PODCA_DATA_DIR")
            .env("PODCA_LOG", "warn")
            .env("SOFTHSM2_CONF", &conf)
            .output()
            .expect("podca runs")
    };
    let dir = |name: &str| t.join(name).to_str().expect("utf-8").to_owned();

    let init = run(&[
        "ca",
        "init",
        "--dir",
        &dir("hsm"),
        "--algorithm",
        "ml-dsa-65",
        "--pkcs11-uri",
        &uri,
        "--pkcs11-generate",
        "--pkcs11-pin-file",
        pin,
    ]);
    assert_eq!(init.status.code(), Some(1), "{init:?}");
    assert_eq!(
        String::from_utf8_lossy(&init.stderr).trim_end(),
        format!("podca: --algorithm ml-dsa-65 with --pkcs11-uri: CA key unusable: {REFUSAL}")
    );
    assert!(!podca_signer::FileStore::new(dir("hsm")).is_initialised());
    assert_eq!(
        private_key_labels(&conf, "pq", "123456"),
        Vec::<String>::new()
    );

    // An ML-DSA-65 CA made with file keys, served with the PKCS#11 backend and a URI naming
    // an ECDSA key in the token.
    assert!(
        run(&[
            "ca",
            "init",
            "--dir",
            &dir("pq"),
            "--algorithm",
            "ml-dsa-65"
        ])
        .status
        .success()
    );
    let ecdsa = run(&[
        "ca",
        "init",
        "--dir",
        &dir("ecdsa"),
        "--pkcs11-uri",
        &uri,
        "--pkcs11-generate",
        "--pkcs11-pin-file",
        pin,
    ]);
    assert!(ecdsa.status.success(), "{ecdsa:?}");
    // Migrating that HSM-held CA by rotation: refused, and nothing is saved for later.
    let state = std::fs::read(t.join("ecdsa/state.json")).expect("state.json");
    let rotate = run(&[
        "ca",
        "rotate",
        "--dir",
        &dir("ecdsa"),
        "--algorithm",
        "ml-dsa-65",
    ]);
    assert_eq!(rotate.status.code(), Some(1), "{rotate:?}");
    assert_eq!(
        String::from_utf8_lossy(&rotate.stderr).trim_end(),
        "podca: this CA's key is held outside the data directory (HSM): podca makes none of its \
         successors, so --algorithm ml-dsa-65 would apply to nothing (nothing was changed); \
         bring a next CA with that algorithm yourself (docs/ca.md, \"HSM-held and \
         imported CAs\")"
    );
    assert_eq!(
        std::fs::read(t.join("ecdsa/state.json")).expect("state.json"),
        state
    );
    let config = t.join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\nbackend = \"pkcs11\"\ndir = {:?}\npkcs11_uri = {uri:?}\npkcs11_pin_file = \
             {pin:?}\n\n[signers.\"{PQ}\"]\ntrust_domain = \"cluster.local\"\n",
            dir("pq")
        ),
    )
    .expect("config");
    let serve = run(&[
        "serve",
        "--config",
        config.to_str().expect("utf-8"),
        "--kubeconfig",
        c.kubeconfig.to_str().expect("utf-8"),
        "--admin-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
    ]);
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(1), "{stderr}");
    let issuing = t.join("pq/generations/1/issuing.pem");
    assert!(
        stderr.contains(&format!(
            "[ca] backend = \"pkcs11\", but {} certifies an ml-dsa-65 key: {REFUSAL}",
            issuing.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("does not match"), "{stderr}");
    assert!(
        !stderr.contains("123456"),
        "the PIN never appears: {stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// ECDSA → ML-DSA CA rotation under continuous mTLS (simulated time, as `rotation_mtls.rs`),
// between a PQ-capable and a classical-only peer set.

#[path = "support/rotating_ca.rs"]
mod rotating_ca;

mod migration {

    use podca_authority::metrics::Metrics;
    use podca_controller::publisher::PublisherOptions;
    use podca_signer::rotation::{Phase, Step};
    use podca_tests::emulator::ClockMode;
    use podca_tests::kubelet::trust_anchors_for_signer;
    use podca_tests::sim::SimClock;
    use rustls::SignatureScheme;

    use time::macros::datetime;

    use super::rotating_ca::{self, Lifetimes};
    use super::*;

    const T0: OffsetDateTime = datetime!(2027-03-01 00:00 UTC);
    const CA_LIFETIME: i64 = 6 * 3600;
    const PROPAGATION: i64 = 15 * 60;
    const LEAF_LIFETIME: i64 = 3600;
    const LIFETIMES: Lifetimes = Lifetimes {
        ca_lifetime: CA_LIFETIME,
        propagation: PROPAGATION,
        leaf_lifetime: LEAF_LIFETIME,
    };
    const BUNDLE_CACHE: i64 = 300;
    /// What rustls without ML-DSA says about an ML-DSA-65-signed peer certificate.
    const UNSUPPORTED_ML_DSA_65: &str = "invalid peer certificate: \
        UnsupportedSignatureAlgorithmContext { signature_algorithm_id: \
        [6, 9, 96, 134, 72, 1, 101, 3, 4, 3, 18]";
    /// Every 30 simulated seconds, every ordered pair of the four pods handshakes.
    const HANDSHAKE_EVERY: i64 = 30;

    fn is_ml_dsa_alg_id(id: &[u8]) -> bool {
        id.windows(4).any(|w| w == [0x65, 0x03, 0x04, 0x03])
    }

    /// A TLS stack that verifies everything rustls does except ML-DSA (an OpenSSL 3.0 or
    /// pre-1.27 Go peer): no ML-DSA in certificate chains, no ML-DSA CertificateVerify.
    fn classical_only() -> Arc<rustls::crypto::CryptoProvider> {
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        let algs = provider.signature_verification_algorithms;
        let all: Vec<_> = algs
            .all
            .iter()
            .copied()
            .filter(|a| !is_ml_dsa_alg_id(a.signature_alg_id().as_ref()))
            .collect();
        let mapping: Vec<_> = algs
            .mapping
            .iter()
            .copied()
            .filter(|(scheme, _)| {
                !matches!(
                    scheme,
                    SignatureScheme::ML_DSA_44
                        | SignatureScheme::ML_DSA_65
                        | SignatureScheme::ML_DSA_87
                )
            })
            .collect();
        assert!(all.len() < algs.all.len(), "the full stack verifies ML-DSA");
        provider.signature_verification_algorithms = rustls::crypto::WebPkiSupportedAlgorithms {
            all: Box::leak(all.into_boxed_slice()),
            mapping: Box::leak(mapping.into_boxed_slice()),
        };
        Arc::new(provider)
    }

    fn pq_capable() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::aws_lc_rs::default_provider())
    }

    struct Peer {
        name: &'static str,
        pq: bool,
        dns: String,
        pod: PodRef,
        credential: Credential,
        bundle: String,
        cache_phase: i64,
        refreshes: usize,
    }

    impl Peer {
        fn provider(&self) -> Arc<rustls::crypto::CryptoProvider> {
            if self.pq {
                pq_capable()
            } else {
                classical_only()
            }
        }
        /// Whether this peer's current leaf is signed with ML-DSA.
        fn ml_dsa_signed(&self) -> bool {
            let (_, leaf) = X509Certificate::from_der(&self.credential.chain_der[0]).expect("leaf");
            ML_DSA_OIDS.contains(&leaf.signature_algorithm.algorithm.to_id_string().as_str())
        }
    }

    fn handshake(clock: &SimClock, client: &Peer, server: &Peer) -> Result<(), String> {
        let time: Arc<dyn rustls::time_provider::TimeProvider> = Arc::new(clock.clone());
        let roots = |p: &Peer| rustls_roots(&der_blocks(&p.bundle));
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots(server),
            server.provider(),
        )
        .build()
        .map_err(|e| format!("server verifier: {e}"))?;
        let server_config =
            rustls::ServerConfig::builder_with_details(server.provider(), Arc::clone(&time))
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|e| e.to_string())?
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain_of(&server.credential), key_of(&server.credential))
                .map_err(|e| format!("server config: {e}"))?;
        let client_config = rustls::ClientConfig::builder_with_details(client.provider(), time)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots(client))
            .with_client_auth_cert(chain_of(&client.credential), key_of(&client.credential))
            .map_err(|e| format!("client config: {e}"))?;
        let name = ServerName::try_from(server.dns.clone()).map_err(|e| e.to_string())?;
        let mut c = rustls::ClientConnection::new(Arc::new(client_config), name)
            .map_err(|e| e.to_string())?;
        let mut s =
            rustls::ServerConnection::new(Arc::new(server_config)).map_err(|e| e.to_string())?;
        podca_tests::tls::handshake_in_memory(&mut c, &mut s)?;
        Ok(())
    }

    async fn obtain(kubelet: &KubeletSim, pod: &PodRef) -> Credential {
        let mut opts = RequestOptions::new(PQ, KeyType::EcdsaP256);
        opts.max_expiration_seconds = Some(LEAF_LIFETIME);
        issued(
            kubelet
                .obtain(pod, &opts, StdDuration::from_secs(20))
                .await
                .expect("answered"),
            &pod.name,
        )
    }

    async fn wait_published(admin: &podca_tests::client::KubeClient, want: &str) {
        let want: std::collections::BTreeSet<_> = der_blocks(want).into_iter().collect();
        for _ in 0..400 {
            let got = trust_anchors_for_signer(admin, "v1beta1", PQ)
                .await
                .expect("CTB");
            if der_blocks(&got)
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>()
                == want
            {
                return;
            }
            tokio::time::sleep(StdDuration::from_millis(25)).await;
        }
        panic!("the ClusterTrustBundle did not follow the CA handle within 10 s");
    }

    /// What each kind of peer must and must not see: a handshake fails exactly when one side is
    /// classical-only and the other side's leaf is ML-DSA-signed; PQ-capable pairs never fail,
    /// and nobody fails before the ML-DSA CA signs (its root in the bundle breaks nothing).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ecdsa_to_ml_dsa_rotation_under_continuous_mtls_with_classical_and_pq_peers() {
        install_crypto();
        let sim = SimClock::at(T0);
        let Cluster {
            emu,
            admin,
            dir,
            kubeconfig,
        } = Cluster::start_with(ClusterConfig {
            emulator: EmulatorConfig {
                bookmark_interval: StdDuration::from_millis(200),
                pod_certificate_mldsa: true,
                ..Default::default()
            },
            signers: &[PQ],
            ..Default::default()
        })
        .await;
        emu.set_clock(ClockMode::Fixed(T0));
        emu.add_namespace(NS);
        let node_uid = emu.add_node("node-1");
        let token = emu.add_node_identity("node-1");
        let kubelet = KubeletSim::new(emu.base_url(), &token, "v1beta1");

        // An ECDSA P-256 CA whose next generations are ML-DSA-65.
        let metrics = Arc::new(Metrics::new());
        let (store, handle, rotator) = rotating_ca::start(
            &dir.path().join("ca"),
            LIFETIMES,
            T0,
            sim.clock(),
            Arc::clone(&metrics),
            |store| {
                assert_eq!(
                    store.set_algorithm(CaAlgorithm::MlDsa65, T0).expect("set"),
                    CaAlgorithm::EcdsaP256
                );
            },
        );
        let mut policy = pq_policy();
        policy.default_lifetime_seconds = LEAF_LIFETIME as u32;
        policy.max_lifetime_seconds = LEAF_LIFETIME as u32;
        let mut options = Options::new(BTreeMap::from([(PQ.to_string(), policy)]), handle.clone());
        options.clock = sim.clock();
        options.metrics = Arc::clone(&metrics);
        options.publisher = Some(PublisherOptions::default());
        let client = podca_controller::connect(Some(&kubeconfig))
            .await
            .expect("client");
        let (stop, stopped) = oneshot::channel::<()>();
        let controller = tokio::spawn(podca_controller::run(client, options, async move {
            let _ = stopped.await;
        }));
        wait_published(&admin, &handle.current().anchors_pem).await;

        let mut peers = Vec::new();
        for (i, (name, pq)) in [
            ("pq-a", true),
            ("pq-b", true),
            ("classic-a", false),
            ("classic-b", false),
        ]
        .into_iter()
        .enumerate()
        {
            let pod = add_pod(
                &emu,
                NS,
                name,
                name,
                ("node-1", &node_uid),
                &[(PQ, KeyType::EcdsaP256)],
            );
            let credential = obtain(&kubelet, &pod).await;
            let bundle = trust_anchors_for_signer(&admin, "v1beta1", PQ)
                .await
                .expect("CTB");
            peers.push(Peer {
                name,
                pq,
                dns: format!("{name}.{NS}.svc"),
                pod,
                credential,
                bundle,
                cache_phase: i as i64 * (BUNDLE_CACHE / 4),
                refreshes: 0,
            });
        }

        let mut unexpected: Vec<String> = Vec::new();
        let mut expected_failures = 0u64;
        let mut failure_kinds: BTreeMap<String, u64> = BTreeMap::new();
        let mut handshakes = 0u64;
        let mut first_ml_dsa_leaf: Option<i64> = None;
        let mut steps_seen: Vec<(i64, Step)> = Vec::new();
        let end = T0 + Duration::minutes(270);
        let mut now = T0;
        while now < end {
            now += Duration::SECOND;
            sim.set(now);
            emu.set_clock(ClockMode::Fixed(now));
            let t = (now - T0).whole_seconds();
            let tick = rotator.tick().expect("rotation tick");
            for step in &tick.steps {
                steps_seen.push((t, *step));
            }
            if tick.swapped {
                wait_published(&admin, &handle.current().anchors_pem).await;
            }
            for p in &mut peers {
                let since = t - p.cache_phase;
                if since >= 0 && since % BUNDLE_CACHE == 0 {
                    p.bundle = trust_anchors_for_signer(&admin, "v1beta1", PQ)
                        .await
                        .expect("CTB");
                }
                if p.credential.refresh_due(now) {
                    p.credential = obtain(&kubelet, &p.pod).await;
                    p.refreshes += 1;
                    if p.ml_dsa_signed() && first_ml_dsa_leaf.is_none() {
                        first_ml_dsa_leaf = Some(t);
                    }
                }
            }
            if t % HANDSHAKE_EVERY != 0 {
                continue;
            }
            for c in 0..peers.len() {
                for s in 0..peers.len() {
                    if c == s {
                        continue;
                    }
                    let (client, server) = (&peers[c], &peers[s]);
                    handshakes += 1;
                    let must_fail = (!client.pq && server.ml_dsa_signed())
                        || (!server.pq && client.ml_dsa_signed());
                    match (handshake(&sim, client, server), must_fail) {
                        (Ok(()), false) => {}
                        // The classical-only side cannot verify id-ml-dsa-65 signatures.
                        (Err(e), true) if e.contains(UNSUPPORTED_ML_DSA_65) => {
                            expected_failures += 1;
                            let side = e.split(':').next().unwrap_or_default().to_string();
                            *failure_kinds.entry(side).or_default() += 1;
                        }
                        (result, _) => unexpected.push(format!(
                            "t+{t}s {} → {}: {result:?} (must fail: {must_fail})",
                            client.name, server.name
                        )),
                    }
                }
            }
        }
        let _ = stop.send(());
        let _ = tokio::time::timeout(StdDuration::from_secs(20), controller).await;

        // The rotation ran in order, to an ML-DSA-65 CA.
        let first = |want: fn(&Step) -> bool| {
            steps_seen
                .iter()
                .find(|(_, s)| want(s))
                .map(|(t, _)| *t)
                .unwrap_or_else(|| panic!("missing step; steps: {steps_seen:?}"))
        };
        let prepared = first(|s| *s == Step::Prepare);
        let activated = first(|s| *s == Step::Activate(2));
        let dropped = first(|s| *s == Step::Drop(1));
        assert!(
            prepared < activated && activated < dropped,
            "{steps_seen:?}"
        );
        let generations = store.generations().expect("generations");
        let phases: Vec<Phase> = generations.iter().map(|g| g.generation.phase).collect();
        assert_eq!(phases, [Phase::Dropped, Phase::Active], "{phases:?}");
        let new_root = &generations[1].roots[0];
        let (_, root) = X509Certificate::from_der(new_root.der()).expect("root");
        assert_eq!(
            root.signature_algorithm.algorithm.to_id_string(),
            "2.16.840.1.101.3.4.3.18",
            "the new CA is ML-DSA-65"
        );
        // Everyone ends on the ML-DSA CA, each chain checked without aws-lc.
        for p in &peers {
            assert!(
                p.ml_dsa_signed(),
                "{} still holds an ECDSA-signed leaf",
                p.name
            );
            assert!(
                p.refreshes >= 6,
                "{} refreshed {} times",
                p.name,
                p.refreshes
            );
            verify_independently(&p.credential.chain_der, &[new_root.der().to_vec()]);
        }
        // No ML-DSA-signed leaf before activation; classical peers fail only from then on.
        let first_ml_dsa_leaf = first_ml_dsa_leaf.expect("ML-DSA leaves were issued");
        assert!(
            first_ml_dsa_leaf >= activated,
            "{first_ml_dsa_leaf} < {activated}"
        );
        assert!(
            expected_failures > 0,
            "classical-only peers met ML-DSA peers"
        );
        // Both directions: a classical client refuses an ML-DSA server, a classical server an
        // ML-DSA client.
        assert_eq!(failure_kinds.len(), 2, "{failure_kinds:?}");
        eprintln!(
            "{handshakes} handshakes; prepared t+{prepared}s, activated t+{activated}s, first \
             ML-DSA leaf t+{first_ml_dsa_leaf}s, dropped t+{dropped}s; expected failures by \
             side: {failure_kinds:?}"
        );
        assert!(handshakes > 5_000, "{handshakes} handshakes");
        assert!(
            unexpected.is_empty(),
            "{} of {handshakes} handshakes went against the expectation; first ones:\n{}",
            unexpected.len(),
            unexpected
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
        let counters = emu.counters();
        assert_eq!(
            (counters.validation_rejections, counters.forbidden),
            (0, 0),
            "{:?}",
            counters.rejections_by_cause
        );
    }
}
