//! The parsers of untrusted input outside the signer: the config file, a CA Secret's
//! contents, the CA history object, and the gRPC request decoders with their conversion into a
//! signer request. Like `signer_targets.rs`: one function each, called by the cargo-fuzz
//! targets and by the stable property tests (`tests/tests/properties.rs` includes this file).

use std::collections::BTreeMap;
use std::sync::Arc;

use podca_authority::config::Config;
use podca_authority::secret_rotation::{Checked, History, SecretCaContents, SecretData};
use podca_proto::podca::v1::{IssueCertificateRequest, IssueForPodRequest};
use podca_signer::keys::SubjectKey;
use podca_signer::{CertificateRequest, IssuingCa, Outcome, SignerPolicy};
use prost::Message;
use time::{Duration, OffsetDateTime};

/// The TOML config file (`podca serve --config`).
pub fn config(text: &str) {
    let _ = Config::parse(text);
}

/// A kubernetes.io/tls Secret holding the CA (`[ca] backend = "secret"`).
pub fn secret_contents(tls_crt: &[u8], tls_key: &[u8], ca_crt: Option<&[u8]>) {
    let now = OffsetDateTime::now_utc();
    let data = SecretData {
        type_: Some("kubernetes.io/tls"),
        tls_crt: Some(tls_crt),
        tls_key: Some(tls_key),
        ca_crt,
        location: "secret:fuzz/fuzz".into(),
    };
    let _ = SecretCaContents::parse(data, now, Arc::new(move || now));
}

/// The CA history podca keeps in Kubernetes (JSON), and the check of each record's anchors.
pub fn history(data: &[u8]) {
    if let Ok(history) = serde_json::from_slice::<History>(data) {
        let json = serde_json::to_vec(&history).expect("a parsed history serialises");
        let again: History = serde_json::from_slice(&json).expect("a serialised history parses");
        assert_eq!(again, history, "history JSON roundtrip");
        for record in history.generations {
            let _ = Checked::new(record);
        }
    }
}

/// A protobuf `IssueCertificateRequest` as the gRPC edge decodes it, then turned into a signer
/// request and decided (with `ca`, when the CSR holds a key) the way `IssueCertificate` does.
pub fn grpc_issue(data: &[u8], ca: Option<&IssuingCa>) {
    if let Ok(request) = IssueCertificateRequest::decode(data) {
        let again = IssueCertificateRequest::decode(request.encode_to_vec().as_slice());
        assert_eq!(again.as_ref(), Ok(&request), "protobuf roundtrip");
        convert(&request, ca);
    }
}

/// A protobuf `IssueForPodRequest`, likewise.
pub fn grpc_issue_for_pod(data: &[u8], ca: Option<&IssuingCa>) {
    if let Ok(request) = IssueForPodRequest::decode(data) {
        let again = IssueForPodRequest::decode(request.encode_to_vec().as_slice());
        assert_eq!(again.as_ref(), Ok(&request), "protobuf roundtrip");
        if let Some(inner) = &request.request {
            convert(inner, ca);
        }
    }
}

fn convert(request: &IssueCertificateRequest, ca: Option<&IssuingCa>) {
    let key = SubjectKey::from_csr_verified(&request.csr);
    let (Ok(key), Some(ca)) = (key, ca) else {
        return;
    };
    let policy = SignerPolicy::permissive("fuzz.example");
    let request = CertificateRequest {
        key: Ok(key),
        namespace: "fuzz".into(),
        service_account: "fuzz".into(),
        pod_name: None,
        max_expiration: None,
        requested_lifetime: request.requested_lifetime_seconds.map(Duration::seconds),
        user_annotations: request
            .user_annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
    };
    // Any typed outcome is fine (issued, denied, failed); only a panic is not.
    let outcome: Outcome =
        podca_signer::sign_request(&policy, ca, &request, OffsetDateTime::now_utc());
    drop(outcome);
}
