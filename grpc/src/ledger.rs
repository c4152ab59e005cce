//! The gRPC edge's ledger records: what each RPC decided, recorded durably before the answer
//! leaves (see `podca_authority::ledger` for the group commit and the durability contract).

use podca_authority::trust::CaSnapshot;
use podca_proto::workload::{
    JwtBundlesRequest, JwtsvidRequest, ValidateJwtsvidRequest, X509BundlesRequest, X509svidRequest,
};
use podca_signer::ledger::{AuthFacts, RecordContext, Source};
use podca_signer::names::spiffe_id;
use time::OffsetDateTime;
use tonic::Request;

use super::auth::Identity;
use super::errors::ApiError;
use super::podca_service::{audit_refusal, peer_of};
use super::workload::{
    FETCH_JWT_BUNDLES, FETCH_JWT_SVID, FETCH_X509_BUNDLES, FETCH_X509_SVID, VALIDATE_JWT_SVID,
};

pub use podca_authority::ledger::{LedgerHandle, LedgerUnavailable};

/// Where the API records its decisions (the name the API has always used).
pub type LedgerSink = LedgerHandle;

/// Who asked for what, for the record of one RPC.
pub(crate) struct RpcFacts<'a> {
    pub source: Source,
    pub signer: &'a str,
    pub trust_domain: &'a str,
    /// Whom the certificate is for.
    pub subject: &'a Identity,
    /// Who called (the node proxy of IssueForPod, else the subject itself).
    pub caller: &'a Identity,
    /// `namespace/name` of the pod IssueForPod asked for.
    pub request_name: Option<String>,
    pub snapshot: &'a CaSnapshot,
    pub replica: &'a str,
    pub time: OffsetDateTime,
}

impl RpcFacts<'_> {
    pub(crate) fn context(&self) -> RecordContext {
        let s = self.subject;
        RecordContext {
            source: self.source,
            signer: self.signer.to_owned(),
            identity: spiffe_id(self.trust_domain, &s.namespace, &s.service_account),
            requester: Some(self.caller.key()),
            namespace: s.namespace.clone(),
            service_account: s.service_account.clone(),
            pod_name: s.pod_name.clone(),
            pod_uid: s.pod_uid.clone(),
            node_name: s.node_name.clone(),
            request_uid: None,
            request_name: self.request_name.clone(),
            ca_generation: self.snapshot.ca_generation.map(u64::from),
            issuer_fingerprint: Some(self.snapshot.ca.fingerprint().to_owned()),
            auth: Some(auth_facts(self.caller, self.subject, self.time)),
            replica: self.replica.to_owned(),
            time: self.time,
        }
    }
}

/// How `caller` was authenticated, and where the renewal chain of a certificate issued to
/// `subject` at `time` begins.
fn auth_facts(caller: &Identity, subject: &Identity, time: OffsetDateTime) -> AuthFacts {
    let auth = &caller.authentication;
    AuthFacts {
        method: auth.method.name().to_owned(),
        verified: true,
        presented_serial: auth.presented_serial.clone(),
        chain_origin: Some(subject.authentication.chain_at(time).origin),
    }
}

/// A request message of the SPIFFE Workload API, and the method it is the request of: the
/// `method` of its refusals' audit lines.
pub(crate) trait WorkloadMethod {
    const METHOD: &'static str;
}

impl WorkloadMethod for X509svidRequest {
    const METHOD: &'static str = FETCH_X509_SVID;
}

impl WorkloadMethod for X509BundlesRequest {
    const METHOD: &'static str = FETCH_X509_BUNDLES;
}

impl WorkloadMethod for JwtsvidRequest {
    const METHOD: &'static str = FETCH_JWT_SVID;
}

impl WorkloadMethod for JwtBundlesRequest {
    const METHOD: &'static str = FETCH_JWT_BUNDLES;
}

impl WorkloadMethod for ValidateJwtsvidRequest {
    const METHOD: &'static str = VALIDATE_JWT_SVID;
}

/// The audit line of a Workload API caller refused before it was identified (no
/// `workload.spiffe.io` header, an unknown uid on the socket, bad credentials): the same line
/// podca.v1 writes for its refused callers. Decisions on identified callers (policy denials)
/// are ledger records, written where they are decided.
pub(crate) fn audit_workload_refusal<T: WorkloadMethod>(request: &Request<T>, error: &ApiError) {
    audit_refusal(T::METHOD, &peer_of(request), error);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_request_names_its_own_method() {
        assert_eq!(
            [
                X509svidRequest::METHOD,
                X509BundlesRequest::METHOD,
                JwtsvidRequest::METHOD,
                JwtBundlesRequest::METHOD,
                ValidateJwtsvidRequest::METHOD,
            ],
            [
                "SpiffeWorkloadAPI/FetchX509SVID",
                "SpiffeWorkloadAPI/FetchX509Bundles",
                "SpiffeWorkloadAPI/FetchJWTSVID",
                "SpiffeWorkloadAPI/FetchJWTBundles",
                "SpiffeWorkloadAPI/ValidateJWTSVID",
            ]
        );
    }
}
