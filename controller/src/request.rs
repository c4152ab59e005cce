//! A PodCertificateRequest as the controller sees it, whichever API version it was read through.

use std::collections::BTreeMap;

use k8s_openapi::api::certificates::{v1, v1beta1};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use podca_signer::names::service_ca::Sans;
use podca_signer::rules::{PodMetadata, RequestSource};
use podca_signer::{
    CertificateRequest, IssuingCa, KeyError, Outcome, RequestContext, SignerPolicy, SubjectKey,
    sign_request_with,
};
use time::{Duration, OffsetDateTime};

use crate::decide;

/// The served version a PCR was read through (and is written back through).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiVersion {
    V1,
    V1Beta1,
}

impl ApiVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "certificates.k8s.io/v1",
            ApiVersion::V1Beta1 => "certificates.k8s.io/v1beta1",
        }
    }
}

/// The fields of a PCR that reconciliation needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcr {
    pub version: ApiVersion,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub signer_name: String,
    pub created: Option<OffsetDateTime>,
    /// `Issued`, `Denied` or `Failed` when the PCR is settled.
    pub terminal: Option<String>,
    pub pod_name: String,
    pub pod_uid: String,
    /// The node the pod runs on (whose kubelet asked).
    pub node_name: String,
    pub service_account: String,
    pub max_expiration_seconds: Option<i32>,
    pub stub_csr: Vec<u8>,
    /// Legacy key material (v1beta1 only).
    pub pkix_public_key: Option<Vec<u8>>,
    pub proof_of_possession: Option<Vec<u8>>,
    pub user_annotations: BTreeMap<String, String>,
    /// Placed by the watch without its spec ([`Pcr::lean`]): everything past `created` is
    /// empty, and the worker re-reads the request before deciding.
    pub lean: bool,
}

/// Where the subject key of a PCR comes from.
#[derive(Debug, PartialEq, Eq)]
pub enum KeySource<'a> {
    StubCsr(&'a [u8]),
    PkixWithProof {
        spki: &'a [u8],
        proof: &'a [u8],
    },
    /// Read through v1 with an empty stub: a legacy request, readable only through v1beta1.
    LegacyHiddenByV1,
    /// No key at all (cannot pass API validation, but answer anyway).
    Missing,
}

impl Pcr {
    pub fn from_v1(obj: v1::PodCertificateRequest) -> Option<Self> {
        let meta = obj.metadata;
        let status = obj.status.unwrap_or_default();
        let spec = obj.spec;
        Some(Pcr {
            version: ApiVersion::V1,
            uid: meta.uid?,
            namespace: meta.namespace?,
            name: meta.name?,
            signer_name: spec.signer_name,
            created: meta.creation_timestamp.as_ref().and_then(to_offset),
            terminal: terminal(status.conditions.as_deref()),
            pod_name: spec.pod_name,
            pod_uid: spec.pod_uid,
            node_name: spec.node_name,
            service_account: spec.service_account_name,
            max_expiration_seconds: spec.max_expiration_seconds,
            stub_csr: spec.stub_pkc_s10_request.0,
            pkix_public_key: None,
            proof_of_possession: None,
            user_annotations: spec.unverified_user_annotations.unwrap_or_default(),
            lean: false,
        })
    }

    /// A request placed by the watch from its metadata alone (`crate::watched`): uid, name,
    /// namespace, signer and creation time; the rest is empty until a read fills it.
    pub fn lean(
        version: ApiVersion,
        (uid, namespace, name): (String, String, String),
        signer: &str,
        created: Option<&Time>,
    ) -> Self {
        Pcr {
            version,
            uid,
            namespace,
            name,
            signer_name: signer.to_owned(),
            created: created.and_then(to_offset),
            terminal: None,
            pod_name: String::new(),
            pod_uid: String::new(),
            node_name: String::new(),
            service_account: String::new(),
            max_expiration_seconds: None,
            stub_csr: Vec::new(),
            pkix_public_key: None,
            proof_of_possession: None,
            user_annotations: BTreeMap::new(),
            lean: true,
        }
    }

    pub fn from_v1beta1(obj: v1beta1::PodCertificateRequest) -> Option<Self> {
        let meta = obj.metadata;
        let status = obj.status.unwrap_or_default();
        let spec = obj.spec;
        Some(Pcr {
            version: ApiVersion::V1Beta1,
            uid: meta.uid?,
            namespace: meta.namespace?,
            name: meta.name?,
            signer_name: spec.signer_name,
            created: meta.creation_timestamp.as_ref().and_then(to_offset),
            terminal: terminal(status.conditions.as_deref()),
            pod_name: spec.pod_name,
            pod_uid: spec.pod_uid,
            node_name: spec.node_name,
            service_account: spec.service_account_name,
            max_expiration_seconds: spec.max_expiration_seconds,
            stub_csr: spec.stub_pkc_s10_request.0,
            pkix_public_key: spec.pkix_public_key.map(|b| b.0),
            proof_of_possession: spec.proof_of_possession.map(|b| b.0),
            user_annotations: spec.unverified_user_annotations.unwrap_or_default(),
            lean: false,
        })
    }

    /// Where the subject key comes from (spec §1.6, §5.2, §5.3).
    pub fn key_source(&self) -> KeySource<'_> {
        if !self.stub_csr.is_empty() {
            return KeySource::StubCsr(&self.stub_csr);
        }
        match (
            &self.pkix_public_key,
            &self.proof_of_possession,
            self.version,
        ) {
            (Some(spki), Some(proof), _) if !spki.is_empty() => {
                KeySource::PkixWithProof { spki, proof }
            }
            (_, _, ApiVersion::V1) => KeySource::LegacyHiddenByV1,
            _ => KeySource::Missing,
        }
    }

    /// The signer's view of the request. `LegacyHiddenByV1` must be resolved by the caller.
    pub fn to_certificate_request(&self) -> CertificateRequest {
        let key = match self.key_source() {
            KeySource::StubCsr(der) => SubjectKey::from_stub_csr(der),
            // The API server verified the proof at create time; re-checking it is cheap and
            // keeps the signer's contract (from_pkix_with_proof is the only legacy entry point).
            KeySource::PkixWithProof { spki, proof } => {
                SubjectKey::from_pkix_with_proof(spki, proof, &self.pod_uid)
            }
            KeySource::LegacyHiddenByV1 | KeySource::Missing => Err(KeyError::Malformed {
                what: "PodCertificateRequest",
                detail: "neither stubPKCS10Request nor pkixPublicKey is set".into(),
            }),
        };
        CertificateRequest {
            key,
            namespace: self.namespace.clone(),
            service_account: self.service_account.clone(),
            pod_name: Some(self.pod_name.clone()),
            max_expiration: self
                .max_expiration_seconds
                .map(|s| Duration::seconds(i64::from(s))),
            requested_lifetime: None,
            user_annotations: self.user_annotations.clone(),
        }
    }
}

/// What the controller looked up for a request besides the PCR itself (each only when the
/// signer's policy needs it).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Facts<'a> {
    /// The namespace's labels (rules read `namespaceObject.metadata.labels`).
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The pod's labels and annotations (`pod_facts`).
    pub pod: Option<&'a PodMetadata>,
    /// The SANs of the `kubernetes.io/service-ca` vocabulary (`service_ca`).
    pub service_sans: Option<&'a Sans>,
}

/// Signs `pcr` under `policy`: the one call a reconcile makes (`controller.rs` `sign`) and
/// `podca policy test` repeats (`crate::sample`). The rules' facts the `CertificateRequest` does
/// not carry all come from the PCR's spec, which kube-apiserver checked against the pod (spec
/// §1.5); `namespace_labels` are the namespace's labels when some rule reads them, `pod` the
/// pod's labels and annotations when some rule reads them (`pod_facts`).
pub(crate) fn sign_pcr(
    policy: &SignerPolicy,
    ca: &IssuingCa,
    pcr: &Pcr,
    facts: Facts<'_>,
    now: OffsetDateTime,
) -> Outcome {
    let request = pcr.to_certificate_request();
    let context = RequestContext {
        source: RequestSource::Pcr,
        signer_name: &pcr.signer_name,
        pod_uid: Some(&pcr.pod_uid),
        node_name: Some(&pcr.node_name),
        namespace_labels: facts.namespace_labels,
        pod: facts.pod,
        renewal: None,
        service_sans: facts.service_sans,
    };
    sign_request_with(policy, ca, &request, &context, now)
}

pub(crate) fn terminal(conditions: Option<&[Condition]>) -> Option<String> {
    let conditions = conditions?;
    decide::terminal_condition(
        conditions
            .iter()
            .filter(|c| c.status == "True")
            .map(|c| c.type_.as_str()),
    )
    .map(str::to_owned)
}

/// A v1 request `uid` named `name` in `ns` for `example.com/s`, for unit tests.
#[cfg(test)]
pub(crate) fn test_pcr(uid: &str, name: &str) -> Pcr {
    Pcr {
        version: ApiVersion::V1,
        uid: uid.into(),
        namespace: "ns".into(),
        name: name.into(),
        signer_name: "example.com/s".into(),
        created: None,
        terminal: None,
        pod_name: "p".into(),
        pod_uid: "pu".into(),
        node_name: "n".into(),
        service_account: "sa".into(),
        max_expiration_seconds: None,
        stub_csr: vec![],
        pkix_public_key: None,
        proof_of_possession: None,
        user_annotations: Default::default(),
        lean: false,
    }
}

fn to_offset(t: &Time) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(t.0.as_second()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn beta(stub: &[u8], pkix: Option<&[u8]>) -> Pcr {
        let mut obj = v1beta1::PodCertificateRequest::default();
        obj.metadata.uid = Some("u".into());
        obj.metadata.namespace = Some("ns".into());
        obj.metadata.name = Some("req-1".into());
        obj.spec.stub_pkc_s10_request = ByteString(stub.to_vec());
        obj.spec.pkix_public_key = pkix.map(|p| ByteString(p.to_vec()));
        obj.spec.proof_of_possession = pkix.map(|_| ByteString(b"sig".to_vec()));
        Pcr::from_v1beta1(obj).expect("complete metadata")
    }

    #[test]
    fn key_sources() {
        assert_eq!(beta(b"csr", None).key_source(), KeySource::StubCsr(b"csr"));
        assert_eq!(
            beta(b"", Some(b"spki")).key_source(),
            KeySource::PkixWithProof {
                spki: b"spki",
                proof: b"sig"
            }
        );
        assert_eq!(beta(b"", None).key_source(), KeySource::Missing);
        let mut v1 = beta(b"", None);
        v1.version = ApiVersion::V1;
        assert_eq!(v1.key_source(), KeySource::LegacyHiddenByV1);
    }

    #[test]
    fn terminal_only_when_true() {
        let cond = |t: &str, s: &str| Condition {
            type_: t.into(),
            status: s.into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            message: String::new(),
            observed_generation: None,
            reason: "R".into(),
        };
        assert_eq!(
            terminal(Some(&[cond("Issued", "True")])),
            Some("Issued".into())
        );
        assert_eq!(terminal(Some(&[cond("Denied", "False")])), None);
        assert_eq!(terminal(None), None);
    }

    #[test]
    fn missing_metadata_is_skipped() {
        assert!(Pcr::from_v1(v1::PodCertificateRequest::default()).is_none());
    }
}
