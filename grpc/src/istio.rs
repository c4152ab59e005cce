//! The Istio CA API (`istio.v1.auth.IstioCertificateService`): what istio-agent (sidecars) and
//! ztunnel (ambient) ask their CA with. A thin adapter onto [`Api`]: the same identification,
//! policy, lifetime clamp, rate limit, ledger and metrics as `podca.v1`; only the wire format,
//! the token audience (`[grpc] istio_token_audience`) and node-proxy delegation through the
//! `ImpersonatedIdentity` metadata differ.
//!
//! * `csr`: PEM PKCS#10. Its URI SANs must all be the SPIFFE ID podca derives for the identity
//!   (the signer's trust domain, or `[grpc] istio_trust_domain_alias`); any other SAN is
//!   refused (`PERMISSION_DENIED`), never silently dropped.
//! * `validity_duration`: seconds, positive; above the policy maximum it is clamped, as
//!   `podca.v1`'s `requested_lifetime_seconds`.
//! * The answer's `cert_chain`: the leaf, the intermediates, then one element holding every
//!   anchor in force (during a CA rotation, the old and the new root).
//! * The `ClusterID` header is logged, never trusted for authorization.

use std::sync::Arc;

use podca_proto::istio::v1::auth::istio_certificate_service_server::IstioCertificateService;
use podca_proto::istio::v1::auth::{IstioCertificateRequest, IstioCertificateResponse};
use tonic::{Request, Response, Status};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use super::auth::Identity;
use podca_signer::names::{NameError, SpiffeId};

use super::core::{Api, Issued, IstioInput};
use super::errors::ApiError;
use super::observe::observed;
use super::podca_service::{audit_refusal, credentials_of, peer_of, record_caller};

/// `Service/Method`: the `method` label of the gRPC metrics.
pub const CREATE_CERTIFICATE: &str = "istio.v1.auth.IstioCertificateService/CreateCertificate";

/// The metadata key ztunnel names the identity it asks for with.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// The header Istio clients name their cluster with (HTTP/2 lowercases it).
pub const CLUSTER_ID_HEADER: &str = "clusterid";

/// The longest cluster id that is logged as sent; longer ones are cut.
const MAX_CLUSTER_ID_CHARS: usize = 128;

/// `istio.v1.auth.IstioCertificateService`.
#[derive(Debug, Clone)]
pub struct IstioService {
    api: Arc<Api>,
}

impl IstioService {
    pub fn new(api: Arc<Api>) -> Self {
        IstioService { api }
    }

    /// Who is calling; a refusal is audited.
    async fn caller<T>(&self, request: &Request<T>) -> Result<Identity, ApiError> {
        let peer = peer_of(request);
        let identified = match credentials_of(request) {
            Ok(credentials) => self.api.identify_istio(&peer, &credentials).await,
            Err(e) => Err(e),
        };
        let identity = identified.inspect_err(|e| audit_refusal(CREATE_CERTIFICATE, &peer, e))?;
        record_caller(&identity);
        self.api.check_rate(&identity)?;
        Ok(identity)
    }
}

/// The cluster id a request names (for logs only), cut to a sane length.
pub fn cluster_id_of<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get(CLUSTER_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().take(MAX_CLUSTER_ID_CHARS).collect())
        .unwrap_or_default()
}

/// A CSR out of its PEM, with its SANs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedCsr {
    pub der: Vec<u8>,
    /// The URI SANs.
    pub uris: Vec<String>,
    /// Every other SAN, in words (for messages).
    pub others: Vec<String>,
}

/// The CSR out of its PEM, and its SANs: URIs, and everything else as text.
pub fn decode_csr(pem_text: &str) -> Result<DecodedCsr, ApiError> {
    if pem_text.trim().is_empty() {
        return Err(ApiError::BadIstioCsr(
            "csr is empty; send a PEM PKCS#10 certificate signing request".into(),
        ));
    }
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).map_err(|_| {
        ApiError::BadIstioCsr(
            "csr is not PEM; send a PEM PKCS#10 certificate signing request \
             (-----BEGIN CERTIFICATE REQUEST-----)"
                .into(),
        )
    })?;
    if pem.label != "CERTIFICATE REQUEST" && pem.label != "NEW CERTIFICATE REQUEST" {
        return Err(ApiError::BadIstioCsr(format!(
            "csr is a PEM {:?} block, not a CERTIFICATE REQUEST",
            pem.label
        )));
    }
    let (rest, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(|e| {
                ApiError::BadIstioCsr(format!("csr is not a PKCS#10 certificate request: {e}"))
            })?;
    if !rest.is_empty() {
        return Err(ApiError::BadIstioCsr(
            "csr has trailing bytes after the PKCS#10 request".into(),
        ));
    }
    let mut uris = Vec::new();
    let mut others = Vec::new();
    for extension in csr.requested_extensions().into_iter().flatten() {
        match extension {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    match name {
                        GeneralName::URI(uri) => uris.push((*uri).to_owned()),
                        GeneralName::DNSName(dns) => others.push(format!("the DNS name {dns:?}")),
                        GeneralName::IPAddress(_) => others.push("an IP address".to_owned()),
                        GeneralName::RFC822Name(mail) => {
                            others.push(format!("the e-mail address {mail:?}"));
                        }
                        _ => others.push("a SAN of another type".to_owned()),
                    }
                }
            }
            ParsedExtension::ParseError { error } => {
                return Err(ApiError::BadIstioCsr(format!(
                    "csr has a malformed requested extension: {error}"
                )));
            }
            _ => {}
        }
    }
    drop(csr);
    Ok(DecodedCsr {
        der: pem.contents,
        uris,
        others,
    })
}

/// `ImpersonatedIdentity` from the request's `metadata`, if it is there.
pub fn impersonated_of(
    metadata: Option<&prost_types::Struct>,
) -> Result<Option<SpiffeId>, ApiError> {
    let Some(value) = metadata.and_then(|m| m.fields.get(IMPERSONATED_IDENTITY)) else {
        return Ok(None);
    };
    let Some(prost_types::value::Kind::StringValue(text)) = &value.kind else {
        return Err(ApiError::BadImpersonation(
            "ImpersonatedIdentity must be a string (spiffe://<trust domain>/ns/<namespace>/sa/\
             <service account>)"
                .into(),
        ));
    };
    text.parse().map(Some).map_err(|e| match e {
        NameError::SpiffeScheme | NameError::SpiffeShape => ApiError::BadImpersonation(format!(
            "ImpersonatedIdentity {text:?} is not a SPIFFE ID of the form \
             spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
        )),
        // A part that is not a Kubernetes name (or trust domain) never reaches the API.
        e => ApiError::BadImpersonation(format!("ImpersonatedIdentity {text:?}: {e}")),
    })
}

/// The request, decoded for [`Api::issue_istio`].
pub fn input(request: &IstioCertificateRequest) -> Result<IstioInput, ApiError> {
    if request.validity_duration <= 0 {
        return Err(ApiError::BadValidity(request.validity_duration));
    }
    let impersonated = impersonated_of(request.metadata.as_ref())?;
    let csr = decode_csr(&request.csr)?;
    Ok(IstioInput {
        csr: csr.der,
        uri_sans: csr.uris,
        other_sans: csr.others,
        validity_seconds: request.validity_duration,
        impersonated,
    })
}

/// The answer: leaf, intermediates, then every anchor in force in one element.
pub fn response(issued: &Issued) -> Result<IstioCertificateResponse, ApiError> {
    let mut cert_chain = pem_blocks(&issued.certificate.chain_pem);
    if cert_chain.is_empty() {
        return Err(ApiError::Internal("the issued chain is empty".into()));
    }
    cert_chain.push(issued.anchors_pem.clone());
    Ok(IstioCertificateResponse { cert_chain })
}

/// The `CERTIFICATE` blocks of a PEM chain that podca encoded itself, one string each, as
/// they are: cut at each END line, with no base64 decoding and re-encoding on every issuance.
fn pem_blocks(chain_pem: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::with_capacity(2);
    let mut rest = chain_pem;
    while let Some(at) = rest.find(END) {
        let mut cut = at + END.len();
        if rest[cut..].starts_with('\n') {
            cut += 1;
        }
        let (block, tail) = rest.split_at(cut);
        let mut block = block.trim_start().to_owned();
        if !block.ends_with('\n') {
            block.push('\n');
        }
        blocks.push(block);
        rest = tail;
    }
    blocks
}

#[tonic::async_trait]
impl IstioCertificateService for IstioService {
    #[tracing::instrument(skip_all, fields(
        rpc = "CreateCertificate",
        cluster = ?cluster_id_of(&request),
        caller = tracing::field::Empty,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
    ))]
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        if self.api.istio_off() {
            return Err(Status::unimplemented(
                "the Istio CA API is off in this podca: set [grpc] istio = true to serve it",
            ));
        }
        let peer = peer_of(&request);
        observed(self.api.metrics(), CREATE_CERTIFICATE, peer, async move {
            let caller = self.caller(&request).await?;
            let cluster = cluster_id_of(&request);
            let input = input(request.get_ref())?;
            let impersonated = input.impersonated.as_ref().map(ToString::to_string);
            let issued = self.api.issue_istio(&caller, input).await?;
            let answer = response(&issued)?;
            // DEBUG, as podca.v1's: the decision's INFO line is its audit line.
            tracing::debug!(
                caller = %caller.key(),
                cluster = ?cluster,
                impersonated = ?impersonated,
                serial = %issued.certificate.serial,
                spiffe_id = %issued.certificate.spiffe_id,
                "issued a certificate over the Istio CA API"
            );
            Ok(Response::new(answer))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chain_is_cut_into_its_certificates_as_encoded() {
        let pems: Vec<String> = (0..2)
            .map(|_| {
                let key = rcgen::KeyPair::generate().unwrap();
                rcgen::CertificateParams::new(vec!["a.example".into()])
                    .unwrap()
                    .self_signed(&key)
                    .unwrap()
                    .pem()
            })
            .collect();
        let chain = pems.concat();
        let blocks = super::pem_blocks(&chain);
        assert_eq!(blocks, pems);
        // Each block is one certificate that parses back to the DER of the chain's.
        let ders = podca_signer::x509::certificates_from_pem(&chain).unwrap();
        for (block, der) in blocks.iter().zip(&ders) {
            assert_eq!(
                &podca_signer::x509::certificates_from_pem(block).unwrap(),
                std::slice::from_ref(der)
            );
        }
        // The last block without its newline still ends in one.
        let blocks = super::pem_blocks(chain.trim_end());
        assert_eq!(blocks, pems);
        assert!(super::pem_blocks("").is_empty());
    }

    use super::*;
    use prost_types::value::Kind;

    fn csr_pem(sans: Vec<rcgen::SanType>) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.subject_alt_names = sans;
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[test]
    fn csr_sans_are_sorted_into_uris_and_others() {
        let uri = "spiffe://cluster.local/ns/shop/sa/web";
        let pem = csr_pem(vec![
            rcgen::SanType::URI(rcgen::string::Ia5String::try_from(uri).unwrap()),
            rcgen::SanType::DnsName(rcgen::string::Ia5String::try_from("web.shop").unwrap()),
        ]);
        let csr = decode_csr(&pem).unwrap();
        assert!(!csr.der.is_empty());
        assert_eq!(csr.uris, [uri]);
        assert_eq!(csr.others, ["the DNS name \"web.shop\""]);
    }

    #[test]
    fn bad_csrs_are_invalid_arguments() {
        for (text, want) in [
            ("", "csr is empty"),
            ("not pem at all", "csr is not PEM"),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "not a CERTIFICATE REQUEST",
            ),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                "not a PKCS#10",
            ),
        ] {
            let e = decode_csr(text).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{text:?}");
            assert!(e.to_string().contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn impersonated_identity_is_read_from_metadata() {
        let with = |kind| prost_types::Struct {
            fields: [(
                IMPERSONATED_IDENTITY.to_owned(),
                prost_types::Value { kind: Some(kind) },
            )]
            .into_iter()
            .collect(),
        };
        assert_eq!(impersonated_of(None).unwrap(), None);
        let id = impersonated_of(Some(&with(Kind::StringValue(
            "spiffe://cluster.local/ns/shop/sa/web".into(),
        ))))
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                id.trust_domain.as_str(),
                id.namespace.as_str(),
                id.service_account.as_str()
            ),
            ("cluster.local", "shop", "web")
        );
        for bad in [
            Kind::NumberValue(1.0),
            Kind::StringValue("spiffe://cluster.local/ns/shop".into()),
            Kind::StringValue("https://cluster.local/ns/shop/sa/web".into()),
        ] {
            let e = impersonated_of(Some(&with(bad))).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.to_string().contains("ImpersonatedIdentity"), "{e}");
        }
    }

    #[test]
    fn validity_must_be_positive() {
        for v in [0, -1] {
            let e = input(&IstioCertificateRequest {
                csr: String::new(),
                validity_duration: v,
                metadata: None,
            })
            .unwrap_err();
            assert_eq!(e, ApiError::BadValidity(v));
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
        }
    }
}
