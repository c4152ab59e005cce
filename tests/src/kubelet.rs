//! A kubelet simulator: files PodCertificateRequests as a node, the way the
//! kubelet's pod-certificate manager does (spec §4), and checks an issued
//! credential the way a pod would use it.

use crate::client::{ClientError, KubeClient};
use crate::emulator::keys::{self, PubKey};
use crate::emulator::pcr::{fmt_time, parse_time};
use crate::emulator::pem;
use aws_lc_rs::encoding::AsDer;
use base64::Engine as _;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use time::OffsetDateTime;
use x509_parser::prelude::FromDer;

/// Errors of the simulator.
#[derive(Debug)]
pub struct KubeletError(pub String);

impl std::fmt::Display for KubeletError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KubeletError {}

impl From<ClientError> for KubeletError {
    fn from(e: ClientError) -> Self {
        Self(e.0)
    }
}

fn kerr(e: impl std::fmt::Display) -> KubeletError {
    KubeletError(e.to_string())
}

type Result<T> = std::result::Result<T, KubeletError>;

/// The kubelet key types (`PodCertificateProjection.keyType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    Rsa3072,
    Rsa4096,
    EcdsaP256,
    EcdsaP384,
    EcdsaP521,
    Ed25519,
    /// ML-DSA (kubernetes#142108, gate `PodCertificateMLDSA`).
    MlDsa44,
    MlDsa65,
    MlDsa87,
}

impl KeyType {
    /// The six classical types every kube-apiserver admits.
    pub const ALL: [KeyType; 6] = [
        KeyType::Rsa3072,
        KeyType::Rsa4096,
        KeyType::EcdsaP256,
        KeyType::EcdsaP384,
        KeyType::EcdsaP521,
        KeyType::Ed25519,
    ];
    /// The ML-DSA types, admitted only with the gate.
    pub const ML_DSA: [KeyType; 3] = [KeyType::MlDsa44, KeyType::MlDsa65, KeyType::MlDsa87];

    /// The API name (`RSA3072`, …).
    pub fn name(self) -> &'static str {
        match self {
            KeyType::Rsa3072 => "RSA3072",
            KeyType::Rsa4096 => "RSA4096",
            KeyType::EcdsaP256 => "ECDSAP256",
            KeyType::EcdsaP384 => "ECDSAP384",
            KeyType::EcdsaP521 => "ECDSAP521",
            KeyType::Ed25519 => "ED25519",
            KeyType::MlDsa44 => "MLDSA44",
            KeyType::MlDsa65 => "MLDSA65",
            KeyType::MlDsa87 => "MLDSA87",
        }
    }
    pub fn parse(s: &str) -> Option<KeyType> {
        KeyType::ALL
            .into_iter()
            .chain(KeyType::ML_DSA)
            .find(|k| k.name() == s)
    }
    pub fn is_ml_dsa(self) -> bool {
        KeyType::ML_DSA.contains(&self)
    }
    fn rcgen_alg(self) -> &'static rcgen::SignatureAlgorithm {
        match self {
            KeyType::Rsa3072 | KeyType::Rsa4096 => &rcgen::PKCS_RSA_SHA256,
            KeyType::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            KeyType::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            KeyType::EcdsaP521 => &rcgen::PKCS_ECDSA_P521_SHA512,
            KeyType::Ed25519 => &rcgen::PKCS_ED25519,
            KeyType::MlDsa44 => &rcgen::PKCS_ML_DSA_44,
            KeyType::MlDsa65 => &rcgen::PKCS_ML_DSA_65,
            KeyType::MlDsa87 => &rcgen::PKCS_ML_DSA_87,
        }
    }
    fn ml_dsa_signing(self) -> Option<&'static aws_lc_rs::signature::PqdsaSigningAlgorithm> {
        use aws_lc_rs::signature as s;
        match self {
            KeyType::MlDsa44 => Some(&s::ML_DSA_44_SIGNING),
            KeyType::MlDsa65 => Some(&s::ML_DSA_65_SIGNING),
            KeyType::MlDsa87 => Some(&s::ML_DSA_87_SIGNING),
            _ => None,
        }
    }
}

/// A subject key pair held by the simulated kubelet (never leaves it).
#[derive(Debug)]
pub struct SubjectKey {
    pub key_type: KeyType,
    pkcs8: Vec<u8>,
    key_pair: std::sync::Arc<rcgen::KeyPair>,
}

fn rsa_cache() -> &'static Mutex<HashMap<KeyType, Vec<Vec<u8>>>> {
    static CACHE: OnceLock<Mutex<HashMap<KeyType, Vec<Vec<u8>>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Clone for SubjectKey {
    fn clone(&self) -> Self {
        // The same key (rcgen cannot re-load an ML-DSA PKCS#8, so share the pair).
        Self {
            key_type: self.key_type,
            pkcs8: self.pkcs8.clone(),
            key_pair: std::sync::Arc::clone(&self.key_pair),
        }
    }
}

impl SubjectKey {
    /// A fresh key (RSA keys take a while, RSA-4096 up to seconds).
    pub fn generate(kt: KeyType) -> Result<Self> {
        let pkcs8 = match kt {
            KeyType::Rsa3072 | KeyType::Rsa4096 => {
                let size = if kt == KeyType::Rsa3072 {
                    aws_lc_rs::rsa::KeySize::Rsa3072
                } else {
                    aws_lc_rs::rsa::KeySize::Rsa4096
                };
                let kp = aws_lc_rs::rsa::KeyPair::generate(size).map_err(kerr)?;
                kp.as_der().map_err(kerr)?.as_ref().to_vec()
            }
            // RFC 9881 seed-form PKCS#8 (what Go 1.27's kubelet writes too).
            KeyType::MlDsa44 | KeyType::MlDsa65 | KeyType::MlDsa87 => {
                let key_pair = rcgen::KeyPair::generate_for(kt.rcgen_alg()).map_err(kerr)?;
                return Ok(Self {
                    key_type: kt,
                    pkcs8: key_pair.serialize_der(),
                    key_pair: std::sync::Arc::new(key_pair),
                });
            }
            _ => rcgen::KeyPair::generate_for(kt.rcgen_alg())
                .map_err(kerr)?
                .serialize_der(),
        };
        Self::from_pkcs8(kt, &pkcs8)
    }

    /// For RSA types, one of up to `pool` process-wide cached keys (RSA
    /// generation is slow); other types get a fresh key.
    pub fn generate_cached(kt: KeyType, pool: usize) -> Result<Self> {
        if !matches!(kt, KeyType::Rsa3072 | KeyType::Rsa4096) {
            return Self::generate(kt);
        }
        let pool = pool.max(1);
        let mut cache = crate::emulator::lock(rsa_cache());
        let entry = cache.entry(kt).or_default();
        if entry.len() < pool {
            drop(cache);
            let k = Self::generate(kt)?;
            let mut cache = crate::emulator::lock(rsa_cache());
            cache.entry(kt).or_default().push(k.pkcs8.clone());
            return Ok(k);
        }
        let mut b = [0u8; 1];
        let _ = aws_lc_rs::rand::fill(&mut b);
        let der = entry[b[0] as usize % entry.len()].clone();
        drop(cache);
        Self::from_pkcs8(kt, &der)
    }

    /// Load a PKCS#8 key (not ML-DSA: rcgen cannot load those).
    pub fn from_pkcs8(kt: KeyType, der: &[u8]) -> Result<Self> {
        if kt.is_ml_dsa() {
            return Err(KubeletError(format!(
                "{} keys cannot be loaded from PKCS#8 here; generate them",
                kt.name()
            )));
        }
        let key_pair = rcgen::KeyPair::from_pem_and_sign_algo(
            &pem::encode("PRIVATE KEY", der),
            kt.rcgen_alg(),
        )
        .map_err(kerr)?;
        Ok(Self {
            key_type: kt,
            pkcs8: der.to_vec(),
            key_pair: std::sync::Arc::new(key_pair),
        })
    }

    /// DER SubjectPublicKeyInfo.
    pub fn spki_der(&self) -> Vec<u8> {
        use rcgen::PublicKeyData;
        self.key_pair.subject_public_key_info()
    }

    /// The rcgen key pair (e.g. to have a test CA certify its public key).
    pub fn rcgen_key(&self) -> &rcgen::KeyPair {
        &self.key_pair
    }

    /// PKCS#8 DER of the private key.
    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8
    }

    /// `-----BEGIN PRIVATE KEY-----` PEM.
    pub fn private_key_pem(&self) -> String {
        pem::encode("PRIVATE KEY", &self.pkcs8)
    }

    /// An empty-subject PKCS#10 CSR signed by this key (what a 1.36+ kubelet sends).
    pub fn stub_csr_der(&self) -> Result<Vec<u8>> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let csr = params.serialize_request(&*self.key_pair).map_err(kerr)?;
        Ok(csr.der().to_vec())
    }

    /// The legacy proof of possession over the pod UID (spec §5.3): Ed25519
    /// plain, ECDSA DER over SHA-256(uid), RSA-PSS SHA-256 (salt = 32 bytes).
    /// ECDSA P-384 is not supported (no SHA-256 signer for that curve here).
    pub fn proof_of_possession(&self, pod_uid: &str) -> Result<Vec<u8>> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let msg = pod_uid.as_bytes();
        use aws_lc_rs::signature::{self, KeyPair as _};
        match self.key_type {
            KeyType::Ed25519 => {
                let kp = signature::Ed25519KeyPair::from_pkcs8(&self.pkcs8).map_err(kerr)?;
                Ok(kp.sign(msg).as_ref().to_vec())
            }
            KeyType::EcdsaP256 | KeyType::EcdsaP521 => {
                let alg = if self.key_type == KeyType::EcdsaP256 {
                    &signature::ECDSA_P256_SHA256_ASN1_SIGNING
                } else {
                    &signature::ECDSA_P521_SHA256_ASN1_SIGNING
                };
                let kp = signature::EcdsaKeyPair::from_pkcs8(alg, &self.pkcs8).map_err(kerr)?;
                let _ = kp.public_key();
                Ok(kp.sign(&rng, msg).map_err(kerr)?.as_ref().to_vec())
            }
            KeyType::Rsa3072 | KeyType::Rsa4096 => {
                let kp = aws_lc_rs::rsa::KeyPair::from_pkcs8(&self.pkcs8).map_err(kerr)?;
                let mut sig = vec![0u8; kp.public_modulus_len()];
                kp.sign(&signature::RSA_PSS_SHA256, &rng, msg, &mut sig)
                    .map_err(kerr)?;
                Ok(sig)
            }
            // Not defined upstream (ML-DSA comes only in the stub CSR); a pure ML-DSA
            // signature over the UID lets a test show the legacy fields refuse the key type.
            KeyType::MlDsa44 | KeyType::MlDsa65 | KeyType::MlDsa87 => {
                let alg = self
                    .key_type
                    .ml_dsa_signing()
                    .ok_or_else(|| KubeletError("not an ML-DSA key".into()))?;
                let kp = aws_lc_rs::signature::PqdsaKeyPair::from_pkcs8(alg, &self.pkcs8)
                    .map_err(kerr)?;
                let mut sig = vec![0u8; alg.signature_len()];
                let len = kp.sign(msg, &mut sig).map_err(kerr)?;
                sig.truncate(len);
                Ok(sig)
            }
            KeyType::EcdsaP384 => Err(KubeletError(
                "legacy proof of possession for ECDSAP384 is not supported by the simulator".into(),
            )),
        }
    }
}

/// The pod a request is for (all fields as kubelet fills them).
#[derive(Debug, Clone, Default)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub service_account: String,
    pub service_account_uid: String,
    pub node_name: String,
    pub node_uid: String,
}

/// How to file one request.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    pub signer_name: String,
    pub key_type: KeyType,
    pub max_expiration_seconds: Option<i64>,
    pub user_annotations: Option<BTreeMap<String, String>>,
    /// Send pkixPublicKey + proofOfPossession (1.34/1.35 kubelet) instead of a stub CSR.
    pub legacy: bool,
    /// Reuse cached RSA keys (see [`SubjectKey::generate_cached`]).
    pub cache_rsa_keys: bool,
}

impl RequestOptions {
    pub fn new(signer_name: &str, key_type: KeyType) -> Self {
        Self {
            signer_name: signer_name.to_string(),
            key_type,
            max_expiration_seconds: None,
            user_annotations: None,
            legacy: false,
            cache_rsa_keys: true,
        }
    }
}

/// A filed, not yet answered request.
#[derive(Debug, Clone)]
pub struct PendingRequest {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub key: SubjectKey,
}

/// A terminal answer.
#[derive(Debug, Clone)]
pub enum Outcome {
    Issued(Box<Credential>),
    Denied { reason: String, message: String },
    Failed { reason: String, message: String },
}

/// An issued credential, as kubelet keeps it.
#[derive(Debug, Clone)]
pub struct Credential {
    pub pcr_name: String,
    pub key: SubjectKey,
    /// The chain "cleaned" like kubelet does (each block re-encoded as CERTIFICATE).
    pub chain_pem: String,
    pub chain_der: Vec<Vec<u8>>,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub begin_refresh_at: OffsetDateTime,
}

impl Credential {
    /// The credential bundle kubelet writes: PKCS#8 PRIVATE KEY, then the chain.
    pub fn credential_bundle(&self) -> String {
        format!("{}{}", self.key.private_key_pem(), self.chain_pem)
    }

    /// Whether kubelet would start a refresh at `now` (jitter ignored).
    pub fn refresh_due(&self, now: OffsetDateTime) -> bool {
        now >= self.begin_refresh_at
    }

    /// The leaf's public key must be the kubelet's key.
    pub fn check_leaf_key(&self) -> Result<()> {
        let leaf = self
            .chain_der
            .first()
            .ok_or_else(|| KubeletError("empty chain".into()))?;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(leaf).map_err(kerr)?;
        let got = keys::pubkey_from_spki(cert.public_key()).map_err(KubeletError)?;
        let want = keys::parse_spki(&self.key.spki_der()).map_err(KubeletError)?;
        if !keys::same_key(&got, &want) {
            return Err(KubeletError(
                "the leaf certificate is not for the kubelet's key".into(),
            ));
        }
        Ok(())
    }

    /// Verify the chain up to one of `anchors_pem` (CERTIFICATE blocks) at
    /// instant `at`: each certificate's signature by the next (or by an
    /// anchor with the issuer's name), CA bits on issuers, and validity.
    pub fn verify_chain(&self, anchors_pem: &str, at: OffsetDateTime) -> Result<()> {
        verify_chain(&self.chain_der, anchors_pem, at)
    }

    /// The leaf's URI SANs (e.g. the SPIFFE ID).
    pub fn leaf_uris(&self) -> Vec<String> {
        let Some(leaf) = self.chain_der.first() else {
            return Vec::new();
        };
        let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(leaf) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                if let x509_parser::extensions::GeneralName::URI(u) = n {
                    out.push((*u).to_string());
                }
            }
        }
        out
    }
}

/// Verify a DER chain (leaf first) against PEM trust anchors at `at`.
pub fn verify_chain(chain: &[Vec<u8>], anchors_pem: &str, at: OffsetDateTime) -> Result<()> {
    use x509_parser::certificate::X509Certificate;
    let anchors_der: Vec<Vec<u8>> = pem::decode_all(anchors_pem.as_bytes())
        .into_iter()
        .filter(|b| b.typ == "CERTIFICATE")
        .map(|b| b.bytes)
        .collect();
    let anchors: Vec<X509Certificate<'_>> = anchors_der
        .iter()
        .filter_map(|d| X509Certificate::from_der(d).ok().map(|(_, c)| c))
        .collect();
    if anchors.is_empty() {
        return Err(KubeletError("no trust anchors".into()));
    }
    let certs: Vec<X509Certificate<'_>> = chain
        .iter()
        .map(|d| X509Certificate::from_der(d).map(|(_, c)| c).map_err(kerr))
        .collect::<Result<_>>()?;
    let ts = x509_parser::time::ASN1Time::from_timestamp(at.unix_timestamp()).map_err(kerr)?;
    for (i, c) in certs.iter().enumerate() {
        if !c.validity().is_valid_at(ts) {
            return Err(KubeletError(format!(
                "certificate {i} is not valid at {}",
                fmt_time(at)
            )));
        }
        let signed_by = |issuer: &X509Certificate<'_>| {
            issuer.subject() == c.issuer()
                && keys::verify_signature(
                    &c.signature_algorithm,
                    issuer.public_key(),
                    c.tbs_certificate.as_ref(),
                    c.signature_value.data.as_ref(),
                )
        };
        if let Some(a) = anchors
            .iter()
            .find(|a| signed_by(a) || a.as_raw() == c.as_raw())
        {
            if !a.is_ca() && a.as_raw() != c.as_raw() {
                return Err(KubeletError("trust anchor is not a CA".into()));
            }
            return Ok(());
        }
        match certs.get(i + 1) {
            Some(next) if signed_by(next) => {
                if !next.is_ca() {
                    return Err(KubeletError(format!("certificate {} is not a CA", i + 1)));
                }
            }
            _ => {
                return Err(KubeletError(format!(
                    "certificate {i} is signed by neither the next certificate nor a trust anchor"
                )));
            }
        }
    }
    Err(KubeletError(
        "the chain does not reach a trust anchor".into(),
    ))
}

/// A simulated kubelet acting as one node.
#[derive(Debug, Clone)]
pub struct KubeletSim {
    client: KubeClient,
    /// `v1` or `v1beta1`.
    pub api_version: String,
    /// Poll interval while waiting for an answer.
    pub poll: Duration,
}

impl KubeletSim {
    /// `node_token` is the bearer token of `system:node:<node>`.
    pub fn new(base_url: &str, node_token: &str, api_version: &str) -> Self {
        let mut client = KubeClient::new(base_url, node_token);
        client.user_agent = "kubelet/v1.36.2 (linux/amd64) podca-tests".into();
        Self {
            client,
            api_version: api_version.to_string(),
            poll: Duration::from_millis(25),
        }
    }

    fn base(&self, ns: &str) -> String {
        format!(
            "/apis/certificates.k8s.io/{}/namespaces/{ns}/podcertificaterequests",
            self.api_version
        )
    }

    /// File a PCR with a fresh key (or `key`). Errors carry the Status message.
    pub async fn request(
        &self,
        pod: &PodRef,
        opts: &RequestOptions,
        key: Option<SubjectKey>,
    ) -> Result<PendingRequest> {
        let key = match key {
            Some(k) => k,
            None if opts.cache_rsa_keys => SubjectKey::generate_cached(opts.key_type, 8)?,
            None => SubjectKey::generate(opts.key_type)?,
        };
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut spec = json!({
            "signerName": opts.signer_name,
            "podName": pod.name,
            "podUID": pod.uid,
            "serviceAccountName": pod.service_account,
            "serviceAccountUID": pod.service_account_uid,
            "nodeName": pod.node_name,
            "nodeUID": pod.node_uid,
        });
        if let Some(m) = opts.max_expiration_seconds {
            spec["maxExpirationSeconds"] = json!(m);
        }
        if let Some(a) = &opts.user_annotations {
            spec["unverifiedUserAnnotations"] = json!(a);
        }
        if opts.legacy {
            spec["pkixPublicKey"] = json!(b64(&key.spki_der()));
            spec["proofOfPossession"] = json!(b64(&key.proof_of_possession(&pod.uid)?));
        } else {
            spec["stubPKCS10Request"] = json!(b64(&key.stub_csr_der()?));
        }
        let body = json!({
            "apiVersion": format!("certificates.k8s.io/{}", self.api_version),
            "kind": "PodCertificateRequest",
            "metadata": {
                "generateName": "req-",
                "namespace": pod.namespace,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
            },
            "spec": spec,
        });
        let resp = self.client.post(&self.base(&pod.namespace), &body).await?;
        let v = resp.json();
        if resp.status != 201 {
            return Err(KubeletError(format!(
                "PCR create answered {}: {}",
                resp.status,
                v["message"].as_str().unwrap_or("")
            )));
        }
        Ok(PendingRequest {
            namespace: pod.namespace.clone(),
            name: v["metadata"]["name"].as_str().unwrap_or("").to_string(),
            uid: v["metadata"]["uid"].as_str().unwrap_or("").to_string(),
            key,
        })
    }

    /// Poll the PCR until it is Issued, Denied or Failed.
    pub async fn wait(&self, p: &PendingRequest, timeout: Duration) -> Result<Outcome> {
        let deadline = tokio::time::Instant::now() + timeout;
        let path = format!("{}/{}", self.base(&p.namespace), p.name);
        loop {
            let resp = self.client.get(&path).await?;
            if resp.status == 404 {
                return Err(KubeletError(format!(
                    "PCR {} was deleted before an answer",
                    p.name
                )));
            }
            let v = resp.json();
            if resp.status == 200
                && let Some(o) = outcome(&v, &p.key)?
            {
                return Ok(o);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KubeletError(format!(
                    "PCR {} not answered within {timeout:?}",
                    p.name
                )));
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// File, wait, and on Issued check the leaf key.
    pub async fn obtain(
        &self,
        pod: &PodRef,
        opts: &RequestOptions,
        timeout: Duration,
    ) -> Result<Outcome> {
        let p = self.request(pod, opts, None).await?;
        let o = self.wait(&p, timeout).await?;
        if let Outcome::Issued(c) = &o {
            c.check_leaf_key()?;
        }
        Ok(o)
    }

    /// Refresh: a new PCR with a new key (kubelet keeps the old one meanwhile).
    pub async fn refresh(
        &self,
        pod: &PodRef,
        opts: &RequestOptions,
        timeout: Duration,
    ) -> Result<Outcome> {
        self.obtain(pod, opts, timeout).await
    }
}

fn condition(v: &Value, typ: &str) -> Option<(String, String)> {
    v["status"]["conditions"].as_array()?.iter().find_map(|c| {
        (c["type"] == typ && c["status"] == "True").then(|| {
            (
                c["reason"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            )
        })
    })
}

/// Turn a PCR JSON into an outcome, if it is terminal.
pub fn outcome(v: &Value, key: &SubjectKey) -> Result<Option<Outcome>> {
    if let Some((reason, message)) = condition(v, "Denied") {
        return Ok(Some(Outcome::Denied { reason, message }));
    }
    if let Some((reason, message)) = condition(v, "Failed") {
        return Ok(Some(Outcome::Failed { reason, message }));
    }
    if condition(v, "Issued").is_none() {
        return Ok(None);
    }
    let st = &v["status"];
    let chain = st["certificateChain"].as_str().unwrap_or("");
    let blocks = pem::decode_all(chain.as_bytes());
    let chain_der: Vec<Vec<u8>> = blocks.into_iter().map(|b| b.bytes).collect();
    let chain_pem: String = chain_der
        .iter()
        .map(|d| pem::encode("CERTIFICATE", d))
        .collect();
    let t = |k: &str| -> Result<OffsetDateTime> {
        parse_time(st.get(k))
            .map_err(KubeletError)?
            .ok_or_else(|| KubeletError(format!("issued PCR without status.{k}")))
    };
    Ok(Some(Outcome::Issued(Box::new(Credential {
        pcr_name: v["metadata"]["name"].as_str().unwrap_or("").to_string(),
        key: key.clone(),
        chain_pem,
        chain_der,
        not_before: t("notBefore")?,
        not_after: t("notAfter")?,
        begin_refresh_at: t("beginRefreshAt")?,
    }))))
}

/// Waits until the v1 CTBs for `signer_name` hold `n` distinct anchors (see
/// [`trust_anchors_for_signer`]) and returns them; panics after `within`.
pub async fn wait_anchors_for_signer(
    client: &KubeClient,
    signer_name: &str,
    n: usize,
    within: std::time::Duration,
) -> String {
    let deadline = std::time::Instant::now() + within;
    loop {
        let pem_text = trust_anchors_for_signer(client, "v1", signer_name)
            .await
            .unwrap_or_default();
        if pem_text.matches("BEGIN CERTIFICATE").count() == n {
            return pem_text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the published bundle for {signer_name} never held {n} anchors; now:\n{pem_text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Concatenated trust anchors of every CTB for `signer_name` (what a
/// `clusterTrustBundle` projection with `labelSelector: {}` sees).
pub async fn trust_anchors_for_signer(
    client: &KubeClient,
    api_version: &str,
    signer_name: &str,
) -> Result<String> {
    let path = format!(
        "/apis/certificates.k8s.io/{api_version}/clustertrustbundles?fieldSelector=spec.signerName%3D{}",
        signer_name.replace('/', "%2F")
    );
    let resp = client.get(&path).await?;
    if resp.status != 200 {
        return Err(KubeletError(format!("CTB list answered {}", resp.status)));
    }
    let v = resp.json();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = String::new();
    for item in v["items"].as_array().into_iter().flatten() {
        for b in pem::decode_all(
            item["spec"]["trustBundle"]
                .as_str()
                .unwrap_or("")
                .as_bytes(),
        ) {
            if b.typ == "CERTIFICATE" && seen.insert(b.bytes.clone()) {
                out.push_str(&pem::encode("CERTIFICATE", &b.bytes));
            }
        }
    }
    Ok(out)
}

/// The parsed public key of a DER SPKI (convenience for tests).
pub fn parse_public_key(spki: &[u8]) -> Result<PubKey> {
    keys::parse_spki(spki).map_err(KubeletError)
}
