//! The gRPC edge's ledger records: what each RPC decided, recorded durably before the answer
//! leaves (see `podca_authority::ledger` for the group commit and the durability contract).

use podca_authority::trust::CaSnapshot;
use podca_signer::ledger::{RecordContext, Source, spiffe_id};
use time::OffsetDateTime;

use super::auth::Identity;

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
            ca_generation: Some(self.snapshot.generation),
            issuer_fingerprint: Some(self.snapshot.ca.fingerprint().to_owned()),
            replica: self.replica.to_owned(),
            time: self.time,
        }
    }
}
