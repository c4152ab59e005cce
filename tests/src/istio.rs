//! A client of the Istio CA API that behaves like ztunnel: a fresh P-256 key per certificate, a
//! CSR with an empty subject and one non-critical URI SAN (the SPIFFE ID), a Bearer token, the
//! `ClusterID` header, and `ImpersonatedIdentity` in `metadata` when it asks for a pod on its
//! node. Built from podca's own `istio/v1/auth/ca.proto`.

use podca_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use podca_proto::istio::v1::auth::{IstioCertificateRequest, IstioCertificateResponse};
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The cluster id ztunnel sends by default.
pub const CLUSTER_ID: &str = "Kubernetes";

/// A certificate ztunnel obtained: its key and the answer's `cert_chain`.
#[derive(Debug)]
pub struct Obtained {
    pub key: rcgen::KeyPair,
    /// Leaf, intermediates, then every anchor in one element.
    pub cert_chain: Vec<String>,
}

impl Obtained {
    /// The leaf and intermediates (PEM), without the anchors.
    pub fn chain_pem(&self) -> String {
        let n = self.cert_chain.len().saturating_sub(1);
        self.cert_chain[..n].concat()
    }

    /// The last element: the anchors ztunnel trusts.
    pub fn anchors_pem(&self) -> &str {
        self.cert_chain.last().map_or("", String::as_str)
    }
}

/// DER length octets.
fn der_len(len: usize) -> Vec<u8> {
    if len < 0x80 {
        return vec![len as u8];
    }
    let bytes: Vec<u8> = len
        .to_be_bytes()
        .into_iter()
        .skip_while(|b| *b == 0)
        .collect();
    let mut out = vec![0x80 | bytes.len() as u8];
    out.extend(bytes);
    out
}

/// The value of a subjectAltName extension holding `uris` as URIs (`GeneralNames`).
fn san_uris(uris: &[&str]) -> Vec<u8> {
    let mut names = Vec::new();
    for uri in uris {
        names.push(0x86); // [6] IMPLICIT IA5String: uniformResourceIdentifier
        names.extend(der_len(uri.len()));
        names.extend(uri.as_bytes());
    }
    let mut out = vec![0x30];
    out.extend(der_len(names.len()));
    out.extend(names);
    out
}

/// A CSR as ztunnel makes it: empty subject, `key`, one URI SAN per entry of `uris` in a
/// non-critical subjectAltName extension (rcgen would mark it critical for an empty subject).
pub fn ztunnel_csr(key: &rcgen::KeyPair, uris: &[&str]) -> String {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    let mut san = rcgen::CustomExtension::from_oid_content(&[2, 5, 29, 17], san_uris(uris));
    san.set_criticality(false);
    params.custom_extensions = vec![san];
    params
        .serialize_request(key)
        .expect("a CSR")
        .pem()
        .expect("PEM")
}

/// A CSR with the standard rcgen SANs (for tests of DNS SANs and the like).
pub fn csr_with_sans(key: &rcgen::KeyPair, sans: Vec<rcgen::SanType>) -> String {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.subject_alt_names = sans;
    params
        .serialize_request(key)
        .expect("a CSR")
        .pem()
        .expect("PEM")
}

/// The `ImpersonatedIdentity` metadata.
pub fn impersonating(spiffe_id: &str) -> prost_types::Struct {
    prost_types::Struct {
        fields: [(
            "ImpersonatedIdentity".to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(spiffe_id.to_owned())),
            },
        )]
        .into_iter()
        .collect(),
    }
}

/// A ztunnel-like client on one channel (TLS, verified against podca's bundle, in the tests).
#[derive(Debug, Clone)]
pub struct Ztunnel {
    pub client: IstioCertificateServiceClient<Channel>,
    /// Its projected service-account token (audience `istio-ca`); none in `podca dev`.
    pub token: Option<String>,
    /// The trust domain it names identities in.
    pub trust_domain: String,
    /// Seconds it asks for.
    pub validity_seconds: i64,
}

impl Ztunnel {
    pub fn new(channel: Channel, token: Option<String>, trust_domain: &str) -> Self {
        Ztunnel {
            client: IstioCertificateServiceClient::new(channel),
            token,
            trust_domain: trust_domain.to_owned(),
            validity_seconds: 86_400,
        }
    }

    pub fn spiffe_id(&self, namespace: &str, service_account: &str) -> String {
        format!(
            "spiffe://{}/ns/{namespace}/sa/{service_account}",
            self.trust_domain
        )
    }

    /// The request with ztunnel's headers.
    pub fn request(&self, message: IstioCertificateRequest) -> Request<IstioCertificateRequest> {
        let mut request = Request::new(message);
        if let Some(token) = &self.token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII"),
            );
        }
        request
            .metadata_mut()
            .insert("clusterid", CLUSTER_ID.parse().expect("ASCII"));
        request
    }

    /// Sends `message` as is.
    pub async fn send(
        &mut self,
        message: IstioCertificateRequest,
    ) -> Result<IstioCertificateResponse, Status> {
        let request = self.request(message);
        self.client
            .create_certificate(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// A certificate for `namespace/service_account`: as itself (`impersonate` false), or
    /// on behalf of a pod on its node (`ImpersonatedIdentity`).
    pub async fn obtain(
        &mut self,
        namespace: &str,
        service_account: &str,
        impersonate: bool,
    ) -> Result<Obtained, Status> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256");
        let id = self.spiffe_id(namespace, service_account);
        let message = IstioCertificateRequest {
            csr: ztunnel_csr(&key, &[&id]),
            validity_duration: self.validity_seconds,
            metadata: impersonate.then(|| impersonating(&id)),
        };
        let answer = self.send(message).await?;
        Ok(Obtained {
            key,
            cert_chain: answer.cert_chain,
        })
    }
}
