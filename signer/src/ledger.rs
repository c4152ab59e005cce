//! The issuance ledger: one record per decision podca made (a certificate issued, a request
//! denied or failed), and the embedded store for it, a redb file. Indexes by record id (the
//! serial of an issued certificate), identity and time.
//!
//! The record ([`LedgerRecord`], schema [`SCHEMA_VERSION`]) is the same in every backend and in
//! the audit log line; the PostgreSQL backend lives in `podca-authority` (it needs an async
//! runtime), this file is the pure part and the redb store.
//!
//! redb commits are atomic and durable (copy-on-write B-trees with a checksummed commit slot),
//! so a process killed mid-write leaves either the whole batch or none of it. Appending a record
//! whose id is already there does nothing, so a retried write never makes a duplicate.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use redb::{
    Database, MultimapTableDefinition, MultimapTableHandle, ReadableDatabase,
    ReadableMultimapTable, ReadableTable, ReadableTableMetadata, TableDefinition,
};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::issue::{IssuedCertificate, Outcome};
use crate::merkle::{Frontier, Hash, record_leaf_hash};
use crate::merkle_verify::{LogSnapshot, StoredLeaf};
use crate::spelling::{Spelled as _, Spelling, UnknownName};

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
/// Record id → sequence number. Named for its first use: an issued certificate's id is its
/// serial, and files written before ids existed hold serials only.
const BY_ID: TableDefinition<&str, u64> = TableDefinition::new("by_serial");
/// (identity, sequence number): the records of one identity, in order.
const BY_IDENTITY: TableDefinition<(&str, u64), ()> = TableDefinition::new("by_identity_seq");
/// The identity index of files written before 2026-12-04, moved into [`BY_IDENTITY`] at open.
/// A multimap keeps each identity's sequence numbers in a tree of their own, so every append
/// rewrote two page paths (the key's leaf and the value tree) instead of one.
const OLD_BY_IDENTITY: MultimapTableDefinition<&str, u64> =
    MultimapTableDefinition::new("by_identity");
const BY_TIME: TableDefinition<(i64, u64), ()> = TableDefinition::new("by_time");
/// The Merkle log ([`crate::merkle`]): leaf index → the record's sequence number (u64
/// big-endian) and the leaf hash, 40 bytes.
const LOG_LEAVES: TableDefinition<u64, &[u8]> = TableDefinition::new("log_leaves");
/// Whether appends write the Merkle log's leaves: always, except in a build with the
/// `bench-unlogged` feature, the baseline of the log's cost benchmark (docs/benchmarks.md) and
/// never for use (its records have no leaves until a normal build opens the file).
const MERKLE_LOG: bool = !cfg!(feature = "bench-unlogged");
/// `frontier`: the log's [`Frontier`], written in the commit of every append.
const LOG_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("log_state");
/// Tree size → the signed checkpoint note of the log at that size.
const LOG_CHECKPOINTS: TableDefinition<u64, &str> = TableDefinition::new("log_checkpoints");
/// Sequence numbers of records pruned by retention: their leaves stay, their records are gone
/// on purpose.
const LOG_PRUNED: TableDefinition<u64, ()> = TableDefinition::new("log_pruned");
const FRONTIER: &str = "frontier";

/// The version of [`LedgerRecord`]'s JSON form (the `schema` field), in every backend and in
/// the audit log. A change that removes, retypes or redefines a field is a new version.
///
/// 2: `ca_generation` is the CA generation that signed, as `podca ca show` numbers them. In
/// schema 1 it counted the CA swaps inside the process that wrote the record (a certificate of
/// generation 1 could read 3 after a rotation and a reload); those records keep their value and
/// their `schema`, and `issuer_fingerprint` names their CA ([`LedgerRecord::signing_generation`]).
pub const SCHEMA_VERSION: u32 = 2;

/// The first [`SCHEMA_VERSION`] whose `ca_generation` is the CA's own generation number.
pub const NUMBERED_GENERATIONS: u32 = 2;

/// The memory redb may use for its page cache (read cache and write buffer together). redb's own
/// default is 1 GiB, and it keeps the pages it writes: the cache grew with the file, about 1.7 KB
/// per issued JWT-SVID (about 540 MB after 30 s of the #17 benchmark), far past the shipped 256 MiB
/// memory limit. Appends touch only the right edge of each index and the freed-page tree, so a
/// small cache holds what a commit needs; queries (`podca ledger list`) read the rest from disk.
/// 4 MiB rather than 32: `podca serve`'s peak RSS under a 10,000-PCR burst was 63 MiB with 32 MiB,
/// 60 with 8, 55 with 4 and 54 with 2, the rate the same within the machine's noise (issue #48;
/// the gRPC benchmarks were not rerun).
pub const CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Which path made the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// A PodCertificateRequest (`podca serve`'s controller).
    Pcr,
    /// `podca.v1` IssueCertificate.
    Grpc,
    /// `podca.v1` IssueForPod (a node proxy asking for a pod on its node).
    IssueForPod,
    /// The SPIFFE Workload API (`FetchX509SVID`).
    WorkloadApi,
    /// The Istio CA API (`istio.v1.auth.IstioCertificateService/CreateCertificate`), for the
    /// caller or, from a node proxy, for the identity it impersonates.
    Istio,
    /// A credential bundle `podca dev` keeps on disk.
    #[serde(rename = "dev")]
    DevBundle,
    /// `podca issue` on the command line.
    Cli,
    /// A JWT-SVID: `podca.v1` IssueJwtSvid (for the caller or, from a node proxy, a pod on its
    /// node) or the Workload API's `FetchJWTSVID`. Its record carries [`JwtFacts`], never the
    /// token.
    Jwt,
    /// A CA certificate podca signed itself and keeps only in memory: the short-lived
    /// intermediate of `pkcs11_mode = "intermediate"` (its HSM-held CA signs it).
    Intermediate,
    /// podca's own gRPC/OIDC serving certificate (`[grpc] tls = "self-issued"`), issued from
    /// the gRPC signer's CA at start and at each renewal.
    Serving,
    /// A source this podca does not know (a record written by a newer one).
    #[serde(other)]
    Unknown,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Pcr => "pcr",
            Source::Grpc => "grpc",
            Source::IssueForPod => "issue-for-pod",
            Source::WorkloadApi => "workload-api",
            Source::Istio => "istio",
            Source::DevBundle => "dev",
            Source::Cli => "cli",
            Source::Jwt => "jwt",
            Source::Intermediate => "intermediate",
            Source::Serving => "serving",
            Source::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordOutcome {
    Issued,
    Denied,
    Failed,
}

impl RecordOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordOutcome::Issued => "issued",
            RecordOutcome::Denied => "denied",
            RecordOutcome::Failed => "failed",
        }
    }
}

impl fmt::Display for RecordOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl crate::spelling::Spelled for RecordOutcome {
    const WHAT: &'static str = "outcome";
    const SPELLINGS: &'static [Spelling<Self>] = &[
        Spelling {
            value: RecordOutcome::Issued,
            name: "issued",
            aliases: &[],
            help: "a certificate or JWT-SVID was issued",
        },
        Spelling {
            value: RecordOutcome::Denied,
            name: "denied",
            aliases: &[],
            help: "the request was refused (a DenyReason)",
        },
        Spelling {
            value: RecordOutcome::Failed,
            name: "failed",
            aliases: &[],
            help: "podca could not serve the request (a FailReason)",
        },
    ];
}

impl FromStr for RecordOutcome {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_name(s)
    }
}

/// One decision: a certificate issued, or a request denied or failed. Schema
/// [`SCHEMA_VERSION`]; `docs/ledger.md` ("Audit ledger") documents every field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRecord {
    /// [`SCHEMA_VERSION`] when written.
    pub schema: u32,
    /// Unique per decision: the serial of an issued certificate; `<source>:<request uid>` for a
    /// refused PodCertificateRequest; `<source>:<random>` for a refused gRPC call.
    pub id: String,
    /// When the decision was made (whole seconds).
    #[serde(with = "time::serde::rfc3339")]
    pub time: OffsetDateTime,
    pub source: Source,
    /// The signer name whose policy decided.
    pub signer: String,
    pub outcome: RecordOutcome,
    /// `Issued`, or the condition reason of the refusal (`NamespaceNotAllowed`, …).
    pub reason: String,
    /// What the refusal said (absent for issued certificates).
    pub message: Option<String>,
    /// The SPIFFE ID: the certificate's, or the one a refused request would have had.
    pub identity: String,
    /// Who asked: `system:node:<node>` for a PodCertificateRequest (kubelet), the caller's
    /// `namespace/service-account` for gRPC, `uid:<n>` or `cli` locally.
    pub requester: Option<String>,
    pub namespace: String,
    pub service_account: String,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub node_name: Option<String>,
    /// The PodCertificateRequest's metadata.uid.
    pub request_uid: Option<String>,
    /// The request's `namespace/name` (a PodCertificateRequest, or the pod of IssueForPod).
    pub request_name: Option<String>,
    /// Serial number, lowercase hex (issued only).
    pub serial: Option<String>,
    /// SHA-256 of the leaf certificate DER, lowercase hex.
    pub cert_sha256: Option<String>,
    /// SHA-256 of the subject public key (SPKI DER), lowercase hex.
    pub spki_sha256: Option<String>,
    /// `ECDSAP256`, `ED25519`, … (kubelet's names).
    pub key_type: Option<String>,
    pub dns_names: Vec<String>,
    /// iPAddress SANs (the `kubernetes.io/service-ca` vocabulary); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub not_before: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub not_after: Option<OffsetDateTime>,
    /// The CA generation that signed, as `podca ca show` numbers them (schema 2; see
    /// [`SCHEMA_VERSION`] for older records); `issuer_fingerprint` names the issuing CA.
    pub ca_generation: Option<u64>,
    /// SHA-256 fingerprint of the issuing CA certificate.
    pub issuer_fingerprint: Option<String>,
    /// Which process decided: the pod name (`POD_NAME`), else the host name.
    pub replica: String,
    /// An issued JWT-SVID (source `jwt`): its key, audiences and digest. Its `iat` and `exp`
    /// are `not_before` and `not_after`. Absent from every other record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtFacts>,
    /// How the requester was authenticated ([`AuthFacts`]); absent from older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthFacts>,
}

/// What a ledger record says of an issued JWT-SVID: enough to recognise the token (its SHA-256)
/// and the key that signed it, never the token itself (a bearer credential).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwtFacts {
    /// The `kid` of the signing key.
    pub kid: String,
    /// The `aud` claim.
    pub audiences: Vec<String>,
    /// SHA-256 of the compact token (its ASCII bytes), lowercase hex.
    pub token_sha256: String,
}

/// How the requester of a decision was authenticated (issue #40): the gRPC paths say how the
/// caller proved itself and which certificate it presented; a PodCertificateRequest's
/// requester is the node its spec names, which the API server checked and podca did not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthFacts {
    /// `token`, `certificate` (mTLS renewal), `token+certificate`, `dev`, or `kubelet` (a
    /// PodCertificateRequest).
    pub method: String,
    /// Whether podca itself verified the requester (false for a PodCertificateRequest, whose
    /// requester is what its spec says).
    pub verified: bool,
    /// The serial (lowercase hex) of the client certificate presented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presented_serial: Option<String>,
    /// When the renewal chain of the issued certificate began (gRPC paths).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub chain_origin: Option<OffsetDateTime>,
}

impl AuthFacts {
    /// A PodCertificateRequest's: its requester is unverified by podca.
    pub fn kubelet() -> Self {
        AuthFacts {
            method: "kubelet".into(),
            verified: false,
            presented_serial: None,
            chain_origin: None,
        }
    }
}

/// Everything about a decision but its outcome: who asked, for whom, where, when.
#[derive(Debug, Clone)]
pub struct RecordContext {
    pub source: Source,
    pub signer: String,
    /// The SPIFFE ID the request is for (`spiffe://<trust domain>/ns/<ns>/sa/<sa>`).
    pub identity: String,
    pub requester: Option<String>,
    pub namespace: String,
    pub service_account: String,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub node_name: Option<String>,
    pub request_uid: Option<String>,
    pub request_name: Option<String>,
    pub ca_generation: Option<u64>,
    /// The CA in force when the decision was made (a refusal names it too).
    pub issuer_fingerprint: Option<String>,
    pub replica: String,
    pub time: OffsetDateTime,
    /// How the requester was authenticated (absent: not said, e.g. `podca issue`).
    pub auth: Option<AuthFacts>,
}

impl LedgerRecord {
    /// The CA generation that signed, as `podca ca show` numbers them; `None` for records of
    /// schema 1 and older, whose `ca_generation` counted CA swaps in one process.
    pub fn signing_generation(&self) -> Option<u64> {
        self.ca_generation
            .filter(|_| self.schema >= NUMBERED_GENERATIONS)
    }

    /// The record of `outcome`; `None` for [`Outcome::Retry`] (nothing was decided).
    pub fn of_outcome(context: &RecordContext, outcome: &Outcome) -> Option<Self> {
        match outcome {
            Outcome::Issued(cert) => Some(Self::issued(context, cert)),
            Outcome::Denied { reason, message } => Some(Self::refused(
                context,
                RecordOutcome::Denied,
                reason.condition_reason(),
                message,
            )),
            Outcome::Failed { reason, message } => Some(Self::refused(
                context,
                RecordOutcome::Failed,
                reason.condition_reason(),
                message,
            )),
            Outcome::Retry(_) => None,
        }
    }

    /// The record of a certificate just issued.
    pub fn issued(context: &RecordContext, cert: &IssuedCertificate) -> Self {
        let mut record = Self::base(context, RecordOutcome::Issued, crate::reason::ISSUED);
        record.id.clone_from(&cert.serial);
        record.identity.clone_from(&cert.spiffe_id);
        record.serial = Some(cert.serial.clone());
        record.cert_sha256 = Some(crate::x509::sha256_hex(&cert.leaf_der));
        record.spki_sha256 = Some(cert.spki_sha256.clone());
        record.key_type = Some(cert.key_type.kubelet_name().to_owned());
        record.dns_names.clone_from(&cert.dns_names);
        record.ip_addresses = cert.ip_addresses.iter().map(ToString::to_string).collect();
        record.not_before = Some(cert.validity.not_before);
        record.not_after = Some(cert.validity.not_after);
        record.issuer_fingerprint = Some(cert.issuer_fingerprint.clone());
        record
    }

    /// The record of a CA certificate podca signed (`source` `intermediate`): its serial, DER
    /// digest, key digest and validity; `identity` is its subject, `issuer_fingerprint` the
    /// signing CA's.
    pub fn ca_certificate(
        context: &RecordContext,
        cert: &crate::CaCertificate,
        issuer_fingerprint: &str,
    ) -> Self {
        let mut record = Self::base(context, RecordOutcome::Issued, crate::reason::ISSUED);
        let serial = x509_parser::parse_x509_certificate(cert.der())
            .map(|(_, c)| crate::x509::serial_hex(c.raw_serial()))
            .unwrap_or_default();
        record.id = format!("{}:{serial}", context.source);
        record.identity = cert.subject().to_owned();
        record.serial = Some(serial);
        record.cert_sha256 = Some(cert.fingerprint());
        record.spki_sha256 = Some(crate::x509::sha256_hex(cert.spki_der()));
        record.not_before = Some(cert.not_before());
        record.not_after = Some(cert.not_after());
        record.issuer_fingerprint = Some(issuer_fingerprint.to_owned());
        record
    }

    /// The record of an issued JWT-SVID: id `jwt:<decision time>-<token SHA-256>` (see
    /// [`jwt_id`]), `not_before`/`not_after` = `iat`/`exp`, the kid and audiences in
    /// [`JwtFacts`]. The token itself is not kept.
    pub fn jwt_issued(context: &RecordContext, svid: &crate::jwt::SignedSvid) -> Self {
        let mut record = Self::base(context, RecordOutcome::Issued, crate::reason::ISSUED);
        let token_sha256 = crate::x509::sha256_hex(svid.token.as_bytes());
        record.id = jwt_id(context.time, &token_sha256);
        record.identity.clone_from(&svid.claims.sub);
        record.not_before = svid
            .claims
            .iat
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok());
        record.not_after = OffsetDateTime::from_unix_timestamp(svid.claims.exp).ok();
        record.jwt = Some(JwtFacts {
            kid: svid.kid.clone(),
            audiences: svid.claims.aud.clone(),
            token_sha256,
        });
        record
    }

    /// The record of a refusal (`Denied` or `Failed`, with its condition reason); its message is
    /// cut at [`MAX_MESSAGE_BYTES`].
    pub fn refused(
        context: &RecordContext,
        outcome: RecordOutcome,
        reason: &str,
        message: &str,
    ) -> Self {
        let mut record = Self::base(context, outcome, reason);
        record.id = match &context.request_uid {
            // A request is settled once: retrying its write must not add a second record.
            Some(uid) => format!("{}:{uid}", context.source),
            None => format!("{}:{}", context.source, random_id()),
        };
        record.message = Some(bounded_message(message));
        record
    }

    fn base(context: &RecordContext, outcome: RecordOutcome, reason: &str) -> Self {
        let c = context.clone();
        LedgerRecord {
            schema: SCHEMA_VERSION,
            id: String::new(),
            time: c.time.replace_nanosecond(0).unwrap_or(c.time),
            source: c.source,
            signer: c.signer,
            outcome,
            reason: reason.to_owned(),
            message: None,
            identity: c.identity,
            requester: c.requester,
            namespace: c.namespace,
            service_account: c.service_account,
            pod_name: c.pod_name,
            pod_uid: c.pod_uid,
            node_name: c.node_name,
            request_uid: c.request_uid,
            request_name: c.request_name,
            serial: None,
            cert_sha256: None,
            spki_sha256: None,
            key_type: None,
            dns_names: vec![],
            ip_addresses: vec![],
            not_before: None,
            not_after: None,
            ca_generation: c.ca_generation,
            issuer_fingerprint: c.issuer_fingerprint,
            replica: c.replica,
            jwt: None,
            auth: c.auth,
        }
    }

    /// The record as one line of JSON (the ledger's and the audit log's form).
    pub fn to_json(&self) -> String {
        // Serializing plain strings, numbers and RFC 3339 times cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a record written by any podca: schema 1, or the issued-only records of earlier
    /// versions (no `schema` field).
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        match serde_json::from_slice::<LedgerRecord>(bytes) {
            Ok(record) => Ok(record),
            Err(e) => match serde_json::from_slice::<LegacyRecord>(bytes) {
                Ok(legacy) => Ok(legacy.into()),
                Err(_) => Err(e),
            },
        }
    }
}

/// The longest refusal message a record keeps, in bytes. Messages carry request-chosen text
/// (a DNS name, a CEL rule's message over annotations): the ledger and the audit log must not
/// grow by what a caller chooses to send.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `message`, cut on a character boundary at [`MAX_MESSAGE_BYTES`] with a marker saying so.
fn bounded_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_owned();
    }
    const MARK: &str = "… (truncated)";
    let mut end = MAX_MESSAGE_BYTES - MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &message[..end])
}

/// Which process this is, for the `replica` field: `POD_NAME`, else `HOSTNAME`, else the
/// kernel's host name.
pub fn replica_identity() -> String {
    let nonempty = |s: String| {
        let s = s.trim().to_owned();
        (!s.is_empty()).then_some(s)
    };
    std::env::var("POD_NAME")
        .ok()
        .and_then(nonempty)
        .or_else(|| std::env::var("HOSTNAME").ok().and_then(nonempty))
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .and_then(nonempty)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The id of an issued JWT-SVID's record: `jwt:`, the decision time in Unix milliseconds (13
/// digits until the year 2286), `-`, and the token's SHA-256 in hex.
///
/// The time comes first so that ids grow as tokens are issued. The redb store indexes records by
/// id, and random ids (the digest alone, as before) put each record of a commit into another
/// leaf page of that index: about one 4 KB page written per token, most of the ledger's cost at
/// thousands of tokens per second (issue #17). Ids in time order fill the index's last pages.
pub fn jwt_id(time: OffsetDateTime, token_sha256: &str) -> String {
    let millis = (time.unix_timestamp_nanos() / 1_000_000).max(0);
    format!("{}:{millis:013}-{token_sha256}", Source::Jwt)
}

fn random_id() -> String {
    let mut bytes = [0u8; 12];
    // A failing system RNG leaves zeros: the id is then not unique, and the store keeps the
    // first record of that id; refusals carry no certificate, so nothing is lost that matters.
    let _ = aws_lc_rs::rand::fill(&mut bytes);
    hex::encode(bytes)
}

/// An issued-only record as podca wrote them before [`SCHEMA_VERSION`] 1.
#[derive(Deserialize)]
struct LegacyRecord {
    serial: String,
    source: String,
    request_uid: Option<String>,
    request_name: Option<String>,
    identity: String,
    dns_names: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    not_before: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    not_after: OffsetDateTime,
    spki_sha256: String,
    issuer_fingerprint: String,
    #[serde(with = "time::serde::rfc3339")]
    issued_at: OffsetDateTime,
}

impl From<LegacyRecord> for LedgerRecord {
    fn from(l: LegacyRecord) -> Self {
        let source =
            serde_json::from_value(serde_json::Value::String(l.source)).unwrap_or(Source::Unknown);
        // spiffe://<td>/ns/<ns>/sa/<sa>
        let mut parts = l.identity.rsplit('/');
        let service_account = parts.next().unwrap_or_default().to_owned();
        let _ = parts.next();
        let namespace = parts.next().unwrap_or_default().to_owned();
        LedgerRecord {
            schema: 0,
            id: l.serial.clone(),
            time: l.issued_at,
            source,
            signer: String::new(),
            outcome: RecordOutcome::Issued,
            reason: crate::reason::ISSUED.into(),
            message: None,
            identity: l.identity,
            requester: None,
            namespace,
            service_account,
            pod_name: None,
            pod_uid: None,
            node_name: None,
            request_uid: l.request_uid,
            request_name: l.request_name,
            serial: Some(l.serial),
            cert_sha256: None,
            spki_sha256: Some(l.spki_sha256),
            key_type: None,
            dns_names: l.dns_names,
            ip_addresses: vec![],
            not_before: Some(l.not_before),
            not_after: Some(l.not_after),
            ca_generation: None,
            issuer_fingerprint: Some(l.issuer_fingerprint),
            replica: String::new(),
            jwt: None,
            auth: None,
        }
    }
}

/// Which records a query wants; every field set must match. Serials and fingerprints are hex in
/// any case, colons allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// The SPIFFE ID.
    pub identity: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
    pub serial: Option<String>,
    /// The certificate's, the subject key's or the issuing CA's SHA-256 fingerprint, or a
    /// JWT-SVID's SHA-256 (`jwt.token_sha256`).
    pub fingerprint: Option<String>,
    /// At or after.
    pub since: Option<OffsetDateTime>,
    /// Before.
    pub until: Option<OffsetDateTime>,
    pub outcome: Option<RecordOutcome>,
    /// At most this many (newest first); 0 = no limit.
    pub limit: usize,
}

/// Hex as the ledger stores it: lowercase, no colons.
pub fn normalize_hex(text: &str) -> String {
    text.replace(':', "").trim().to_ascii_lowercase()
}

impl Filter {
    pub fn matches(&self, r: &LedgerRecord) -> bool {
        let eq = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|w| Some(w) == have)
        };
        let serial = self.serial.as_deref().map(normalize_hex);
        let fingerprint = self.fingerprint.as_deref().map(normalize_hex);
        eq(&self.identity, Some(r.identity.as_str()))
            && eq(&self.namespace, Some(r.namespace.as_str()))
            && eq(&self.node, r.node_name.as_deref())
            && eq(&serial, r.serial.as_deref())
            && fingerprint.as_deref().is_none_or(|f| {
                let token = r.jwt.as_ref().map(|j| j.token_sha256.clone());
                [
                    &r.cert_sha256,
                    &r.spki_sha256,
                    &r.issuer_fingerprint,
                    &token,
                ]
                .iter()
                .any(|have| have.as_deref().map(normalize_hex).as_deref() == Some(f))
            })
            && self.since.is_none_or(|s| r.time >= s)
            && self.until.is_none_or(|u| r.time < u)
            && self.outcome.is_none_or(|o| r.outcome == o)
    }

    fn full(&self, found: usize) -> bool {
        self.limit != 0 && found >= self.limit
    }
}

/// Why the ledger could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    #[error(
        "ledger {path} is open in another podca process (podca dev or serve); stop it to query \
         the ledger directly, or give each replica its own [ledger] path (or use backend = \
         \"postgres\")"
    )]
    InUse { path: String },
    #[error("ledger {path}: {detail}")]
    Storage { path: String, detail: String },
    #[error("ledger {path}: record {seq} is corrupt: {detail}")]
    Corrupt {
        path: String,
        seq: u64,
        detail: String,
    },
}

/// The ledger file.
#[derive(Debug)]
pub struct Ledger {
    db: Database,
    path: String,
}

impl Ledger {
    /// Opens the ledger at `path`, creating it if needed, and repairing it if the last writer
    /// crashed.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        Self::open_with_cache(path, CACHE_BYTES)
    }

    /// [`open`](Self::open) with a page cache of at most `cache_bytes` (read cache and write
    /// buffer together) instead of [`CACHE_BYTES`].
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Self, LedgerError> {
        let shown = path.display().to_string();
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => LedgerError::InUse {
                    path: shown.clone(),
                },
                other => LedgerError::Storage {
                    path: shown.clone(),
                    detail: other.to_string(),
                },
            })?;
        let ledger = Ledger { db, path: shown };
        // Create the tables up front so readers never see "table does not exist".
        let tx = ledger.db.begin_write().map_err(|e| ledger.storage(e))?;
        let old_index = tx
            .list_multimap_tables()
            .map_err(|e| ledger.storage(e))?
            .any(|t| t.name() == OLD_BY_IDENTITY.name());
        {
            let records = tx.open_table(RECORDS).map_err(|e| ledger.storage(e))?;
            tx.open_table(BY_ID).map_err(|e| ledger.storage(e))?;
            let mut by_identity = tx.open_table(BY_IDENTITY).map_err(|e| ledger.storage(e))?;
            tx.open_table(BY_TIME).map_err(|e| ledger.storage(e))?;
            tx.open_table(LOG_CHECKPOINTS)
                .map_err(|e| ledger.storage(e))?;
            tx.open_table(LOG_PRUNED).map_err(|e| ledger.storage(e))?;
            if old_index {
                ledger.move_old_identity_index(&tx, &records, &mut by_identity)?;
            }
            ledger.add_missing_leaves(&tx, &records)?;
        }
        if old_index {
            tx.delete_multimap_table(OLD_BY_IDENTITY)
                .map_err(|e| ledger.storage(e))?;
        }
        tx.commit().map_err(|e| ledger.storage(e))?;
        Ok(ledger)
    }

    /// Copies the multimap identity index of an older file into [`BY_IDENTITY`] (the caller
    /// deletes it afterwards, in the same transaction). An older podca run after a newer one
    /// prunes from its own index only, so entries of [`BY_IDENTITY`] whose record has gone are
    /// dropped here too.
    fn move_old_identity_index(
        &self,
        tx: &redb::WriteTransaction,
        records: &redb::Table<'_, u64, &'static [u8]>,
        by_identity: &mut redb::Table<'_, (&'static str, u64), ()>,
    ) -> Result<(), LedgerError> {
        let mut gone = vec![];
        for entry in by_identity.iter().map_err(|e| self.storage(e))? {
            let (key, _) = entry.map_err(|e| self.storage(e))?;
            let (identity, seq) = key.value();
            if records.get(seq).map_err(|e| self.storage(e))?.is_none() {
                gone.push((identity.to_owned(), seq));
            }
        }
        for (identity, seq) in gone {
            by_identity
                .remove((identity.as_str(), seq))
                .map_err(|e| self.storage(e))?;
        }
        let old = tx
            .open_multimap_table(OLD_BY_IDENTITY)
            .map_err(|e| self.storage(e))?;
        for entry in old.iter().map_err(|e| self.storage(e))? {
            let (identity, seqs) = entry.map_err(|e| self.storage(e))?;
            for seq in seqs {
                let seq = seq.map_err(|e| self.storage(e))?.value();
                by_identity
                    .insert((identity.value(), seq), ())
                    .map_err(|e| self.storage(e))?;
            }
        }
        Ok(())
    }

    /// Gives every record after the log's last leaf a leaf, in sequence order: records of a
    /// file written before the log existed, or by an older podca since.
    fn add_missing_leaves(
        &self,
        tx: &redb::WriteTransaction,
        records: &redb::Table<'_, u64, &'static [u8]>,
    ) -> Result<(), LedgerError> {
        let mut leaves = tx.open_table(LOG_LEAVES).map_err(|e| self.storage(e))?;
        let mut state = tx.open_table(LOG_STATE).map_err(|e| self.storage(e))?;
        let last_seq = leaves
            .last()
            .map_err(|e| self.storage(e))?
            .map(|(_, v)| leaf_row(v.value()).0);
        let from = last_seq.map_or(0, |s| s + 1);
        let mut frontier = self.frontier_in(&state)?;
        let before = frontier.size();
        for entry in records.range(from..).map_err(|e| self.storage(e))? {
            let (seq, bytes) = entry.map_err(|e| self.storage(e))?;
            let record = self.decode(seq.value(), bytes.value())?;
            let hash = record_leaf_hash(&record);
            leaves
                .insert(frontier.size(), leaf_value(seq.value(), &hash).as_slice())
                .map_err(|e| self.storage(e))?;
            frontier.push(hash);
        }
        if frontier.size() != before {
            state
                .insert(FRONTIER, frontier.encode().as_slice())
                .map_err(|e| self.storage(e))?;
        }
        Ok(())
    }

    fn frontier_in(
        &self,
        state: &impl ReadableTable<&'static str, &'static [u8]>,
    ) -> Result<Frontier, LedgerError> {
        match state.get(FRONTIER).map_err(|e| self.storage(e))? {
            Some(bytes) => Frontier::decode(bytes.value()).map_err(|e| self.storage(e)),
            None => Ok(Frontier::default()),
        }
    }

    /// The file, as shown in errors.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Appends records in one durable transaction: all of them or none. A record whose id is
    /// already in the ledger (a retried write) is skipped; the answer says, per record, whether
    /// it was new.
    pub fn append(&self, records: &[LedgerRecord]) -> Result<Vec<bool>, LedgerError> {
        if records.is_empty() {
            return Ok(vec![]);
        }
        let mut inserted = Vec::with_capacity(records.len());
        let tx = self.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
            let mut by_id = tx.open_table(BY_ID).map_err(|e| self.storage(e))?;
            let mut by_identity = tx.open_table(BY_IDENTITY).map_err(|e| self.storage(e))?;
            let mut by_time = tx.open_table(BY_TIME).map_err(|e| self.storage(e))?;
            let mut leaves = tx.open_table(LOG_LEAVES).map_err(|e| self.storage(e))?;
            let mut state = tx.open_table(LOG_STATE).map_err(|e| self.storage(e))?;
            let mut frontier = self.frontier_in(&state)?;
            // A leaf may outlive its record (retention): a sequence number is never reused.
            let after_leaves = match leaves.last().map_err(|e| self.storage(e))? {
                Some((_, v)) => leaf_row(v.value()).0 + 1,
                None => 0,
            };
            let mut seq = table
                .last()
                .map_err(|e| self.storage(e))?
                .map_or(0, |(k, _)| k.value() + 1)
                .max(after_leaves);
            let before = frontier.size();
            for record in records {
                // One descent of the id index both claims the id and tells whether a retried
                // write already holds it (then its entry is put back as it was).
                let earlier = by_id
                    .insert(record.id.as_str(), seq)
                    .map_err(|e| self.storage(e))?
                    .map(|old| old.value());
                if let Some(earlier) = earlier {
                    by_id
                        .insert(record.id.as_str(), earlier)
                        .map_err(|e| self.storage(e))?;
                    inserted.push(false);
                    continue;
                }
                let json = record.to_json();
                table
                    .insert(seq, json.as_bytes())
                    .map_err(|e| self.storage(e))?;
                by_identity
                    .insert((record.identity.as_str(), seq), ())
                    .map_err(|e| self.storage(e))?;
                by_time
                    .insert((record.time.unix_timestamp(), seq), ())
                    .map_err(|e| self.storage(e))?;
                if MERKLE_LOG {
                    let hash = record_leaf_hash(record);
                    leaves
                        .insert(frontier.size(), leaf_value(seq, &hash).as_slice())
                        .map_err(|e| self.storage(e))?;
                    frontier.push(hash);
                }
                inserted.push(true);
                seq += 1;
            }
            if frontier.size() != before {
                state
                    .insert(FRONTIER, frontier.encode().as_slice())
                    .map_err(|e| self.storage(e))?;
            }
        }
        tx.commit().map_err(|e| self.storage(e))?;
        Ok(inserted)
    }

    /// The record of one issued certificate by serial (hex, any case, optional colons).
    pub fn by_serial(&self, serial: &str) -> Result<Option<LedgerRecord>, LedgerError> {
        self.by_id(&normalize_hex(serial))
    }

    /// The record with this id.
    pub fn by_id(&self, id: &str) -> Result<Option<LedgerRecord>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let index = tx.open_table(BY_ID).map_err(|e| self.storage(e))?;
        let Some(seq) = index.get(id).map_err(|e| self.storage(e))? else {
            return Ok(None);
        };
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        self.read(&table, seq.value()).map(Some)
    }

    /// Every record of one identity (SPIFFE ID), oldest first.
    pub fn by_identity(&self, identity: &str) -> Result<Vec<LedgerRecord>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let index = tx.open_table(BY_IDENTITY).map_err(|e| self.storage(e))?;
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let mut out = vec![];
        for entry in index
            .range((identity, 0u64)..=(identity, u64::MAX))
            .map_err(|e| self.storage(e))?
        {
            let (key, _) = entry.map_err(|e| self.storage(e))?;
            out.push(self.read(&table, key.value().1)?);
        }
        Ok(out)
    }

    /// Records made in `[from, to)`, oldest first, at most `limit`.
    pub fn issued_between(
        &self,
        from: OffsetDateTime,
        to: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<LedgerRecord>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let index = tx.open_table(BY_TIME).map_err(|e| self.storage(e))?;
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let range = (from.unix_timestamp(), 0u64)..(to.unix_timestamp(), 0u64);
        let mut out = vec![];
        for entry in index.range(range).map_err(|e| self.storage(e))?.take(limit) {
            let (key, _) = entry.map_err(|e| self.storage(e))?;
            out.push(self.read(&table, key.value().1)?);
        }
        Ok(out)
    }

    /// The newest `limit` records, newest first.
    pub fn latest(&self, limit: usize) -> Result<Vec<LedgerRecord>, LedgerError> {
        self.query(&Filter {
            limit,
            ..Filter::default()
        })
    }

    /// The records `filter` wants, newest first.
    pub fn query(&self, filter: &Filter) -> Result<Vec<LedgerRecord>, LedgerError> {
        if let Some(serial) = &filter.serial {
            return Ok(self
                .by_serial(serial)?
                .filter(|r| filter.matches(r))
                .into_iter()
                .collect());
        }
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        if let Some(identity) = &filter.identity {
            let index = tx.open_table(BY_IDENTITY).map_err(|e| self.storage(e))?;
            let entries = index
                .range((identity.as_str(), 0u64)..=(identity.as_str(), u64::MAX))
                .map_err(|e| self.storage(e))?
                .rev()
                .map(|entry| entry.map(|(key, _)| key.value().1));
            return self.newest_matching(&table, entries, filter);
        }
        let index = tx.open_table(BY_TIME).map_err(|e| self.storage(e))?;
        let from = filter.since.map_or(i64::MIN, |t| t.unix_timestamp());
        let to = filter.until.map_or(i64::MAX, |t| t.unix_timestamp());
        let entries = index
            .range((from, 0u64)..=(to, u64::MAX))
            .map_err(|e| self.storage(e))?
            .rev()
            .map(|entry| entry.map(|(key, _)| key.value().1));
        self.newest_matching(&table, entries, filter)
    }

    /// The records of `seqs` (an index read newest first) that `filter` wants, up to its limit.
    fn newest_matching(
        &self,
        table: &redb::ReadOnlyTable<u64, &[u8]>,
        seqs: impl Iterator<Item = Result<u64, redb::StorageError>>,
        filter: &Filter,
    ) -> Result<Vec<LedgerRecord>, LedgerError> {
        let mut out = vec![];
        for seq in seqs {
            let record = self.read(table, seq.map_err(|e| self.storage(e))?)?;
            if filter.matches(&record) {
                out.push(record);
                if filter.full(out.len()) {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Deletes every record made before `before`; says how many.
    pub fn prune(&self, before: OffsetDateTime) -> Result<u64, LedgerError> {
        let tx = self.db.begin_write().map_err(|e| self.storage(e))?;
        let mut pruned = 0;
        {
            let mut table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
            let mut by_id = tx.open_table(BY_ID).map_err(|e| self.storage(e))?;
            let mut by_identity = tx.open_table(BY_IDENTITY).map_err(|e| self.storage(e))?;
            let mut by_time = tx.open_table(BY_TIME).map_err(|e| self.storage(e))?;
            let mut tombstones = tx.open_table(LOG_PRUNED).map_err(|e| self.storage(e))?;
            let mut old = vec![];
            for entry in by_time
                .range(..(before.unix_timestamp(), 0u64))
                .map_err(|e| self.storage(e))?
            {
                let (key, _) = entry.map_err(|e| self.storage(e))?;
                old.push(key.value());
            }
            for (second, seq) in old {
                let record = match table.remove(seq).map_err(|e| self.storage(e))? {
                    Some(bytes) => Some(self.decode(seq, bytes.value())?),
                    None => None,
                };
                if let Some(record) = record {
                    by_id
                        .remove(record.id.as_str())
                        .map_err(|e| self.storage(e))?;
                    by_identity
                        .remove((record.identity.as_str(), seq))
                        .map_err(|e| self.storage(e))?;
                    tombstones.insert(seq, ()).map_err(|e| self.storage(e))?;
                    pruned += 1;
                }
                by_time.remove((second, seq)).map_err(|e| self.storage(e))?;
            }
        }
        tx.commit().map_err(|e| self.storage(e))?;
        Ok(pruned)
    }

    /// How many records the ledger holds.
    pub fn len(&self) -> Result<u64, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        table.len().map_err(|e| self.storage(e))
    }

    /// Whether the ledger holds no record.
    pub fn is_empty(&self) -> Result<bool, LedgerError> {
        self.len().map(|n| n == 0)
    }

    /// The log's frontier: its size and root as of the last commit.
    pub fn log_frontier(&self) -> Result<Frontier, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let state = tx.open_table(LOG_STATE).map_err(|e| self.storage(e))?;
        self.frontier_in(&state)
    }

    /// The leaf hashes of `[from, to)` (fewer if the log is shorter).
    pub fn log_leaf_hashes(&self, from: u64, to: u64) -> Result<Vec<Hash>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let leaves = tx.open_table(LOG_LEAVES).map_err(|e| self.storage(e))?;
        let mut out = vec![];
        for entry in leaves.range(from..to).map_err(|e| self.storage(e))? {
            let (_, v) = entry.map_err(|e| self.storage(e))?;
            out.push(leaf_row(v.value()).1);
        }
        Ok(out)
    }

    /// The leaf index of the record with this id, if it has one.
    pub fn log_index_of(&self, id: &str) -> Result<Option<u64>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let by_id = tx.open_table(BY_ID).map_err(|e| self.storage(e))?;
        let Some(seq) = by_id.get(id).map_err(|e| self.storage(e))? else {
            return Ok(None);
        };
        let seq = seq.value();
        let leaves = tx.open_table(LOG_LEAVES).map_err(|e| self.storage(e))?;
        // Leaves are in sequence order: a binary search over the index.
        let (mut lo, mut hi) = (0u64, leaves.len().map_err(|e| self.storage(e))?);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let at = leaves
                .get(mid)
                .map_err(|e| self.storage(e))?
                .map(|v| leaf_row(v.value()).0);
            match at {
                Some(s) if s == seq => return Ok(Some(mid)),
                Some(s) if s < seq => lo = mid + 1,
                _ => hi = mid,
            }
        }
        Ok(None)
    }

    /// The records (JSON) of leaves `[from, to)`, `None` for a pruned one.
    pub fn log_entries(&self, from: u64, to: u64) -> Result<Vec<Option<Vec<u8>>>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let leaves = tx.open_table(LOG_LEAVES).map_err(|e| self.storage(e))?;
        let records = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let mut out = vec![];
        for entry in leaves.range(from..to).map_err(|e| self.storage(e))? {
            let (_, v) = entry.map_err(|e| self.storage(e))?;
            let seq = leaf_row(v.value()).0;
            let record = records.get(seq).map_err(|e| self.storage(e))?;
            out.push(record.map(|r| r.value().to_vec()));
        }
        Ok(out)
    }

    /// Keeps a signed checkpoint of the log at `size` (a second one of the same size is kept
    /// as the first).
    pub fn add_checkpoint(&self, size: u64, note: &str) -> Result<(), LedgerError> {
        let tx = self.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut table = tx
                .open_table(LOG_CHECKPOINTS)
                .map_err(|e| self.storage(e))?;
            if table.get(size).map_err(|e| self.storage(e))?.is_none() {
                table.insert(size, note).map_err(|e| self.storage(e))?;
            }
        }
        tx.commit().map_err(|e| self.storage(e))
    }

    /// The newest checkpoint: its size and note.
    pub fn latest_checkpoint(&self) -> Result<Option<(u64, String)>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = tx
            .open_table(LOG_CHECKPOINTS)
            .map_err(|e| self.storage(e))?;
        Ok(table
            .last()
            .map_err(|e| self.storage(e))?
            .map(|(k, v)| (k.value(), v.value().to_owned())))
    }

    /// Everything `podca ledger verify` checks, read in one transaction.
    pub fn log_snapshot(&self) -> Result<LogSnapshot, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let mut snapshot = LogSnapshot::default();
        for entry in tx
            .open_table(LOG_LEAVES)
            .map_err(|e| self.storage(e))?
            .iter()
            .map_err(|e| self.storage(e))?
        {
            let (k, v) = entry.map_err(|e| self.storage(e))?;
            let (seq, hash) = leaf_row(v.value());
            snapshot.leaves.push(StoredLeaf {
                index: k.value(),
                seq,
                hash,
            });
        }
        for entry in tx
            .open_table(RECORDS)
            .map_err(|e| self.storage(e))?
            .iter()
            .map_err(|e| self.storage(e))?
        {
            let (k, v) = entry.map_err(|e| self.storage(e))?;
            snapshot.records.insert(k.value(), v.value().to_vec());
        }
        for entry in tx
            .open_table(LOG_PRUNED)
            .map_err(|e| self.storage(e))?
            .iter()
            .map_err(|e| self.storage(e))?
        {
            let (k, _) = entry.map_err(|e| self.storage(e))?;
            snapshot.pruned.insert(k.value());
        }
        for entry in tx
            .open_table(LOG_CHECKPOINTS)
            .map_err(|e| self.storage(e))?
            .iter()
            .map_err(|e| self.storage(e))?
        {
            let (k, v) = entry.map_err(|e| self.storage(e))?;
            snapshot.checkpoints.push((k.value(), v.value().to_owned()));
        }
        let state = tx.open_table(LOG_STATE).map_err(|e| self.storage(e))?;
        snapshot.frontier = state
            .get(FRONTIER)
            .map_err(|e| self.storage(e))?
            .map(|v| v.value().to_vec())
            .unwrap_or_default();
        Ok(snapshot)
    }

    fn read(
        &self,
        table: &redb::ReadOnlyTable<u64, &[u8]>,
        seq: u64,
    ) -> Result<LedgerRecord, LedgerError> {
        let bytes = table
            .get(seq)
            .map_err(|e| self.storage(e))?
            .ok_or_else(|| LedgerError::Corrupt {
                path: self.path.clone(),
                seq,
                detail: "indexed record is missing".into(),
            })?;
        self.decode(seq, bytes.value())
    }

    fn decode(&self, seq: u64, bytes: &[u8]) -> Result<LedgerRecord, LedgerError> {
        LedgerRecord::from_json(bytes).map_err(|e| LedgerError::Corrupt {
            path: self.path.clone(),
            seq,
            detail: e.to_string(),
        })
    }

    fn storage(&self, e: impl std::fmt::Display) -> LedgerError {
        LedgerError::Storage {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }
}

/// A [`LOG_LEAVES`] value: the record's sequence number and the leaf hash.
fn leaf_value(seq: u64, hash: &Hash) -> [u8; 40] {
    let mut v = [0u8; 40];
    v[..8].copy_from_slice(&seq.to_be_bytes());
    v[8..].copy_from_slice(hash);
    v
}

/// The inverse of [`leaf_value`]; a short value (a damaged row) reads as zeros where it ends,
/// which `verify` then reports as a hash that does not match its record.
fn leaf_row(v: &[u8]) -> (u64, Hash) {
    let mut seq = [0u8; 8];
    let mut hash = [0u8; 32];
    for (d, s) in seq.iter_mut().zip(v) {
        *d = *s;
    }
    for (d, s) in hash.iter_mut().zip(v.iter().skip(8)) {
        *d = *s;
    }
    (u64::from_be_bytes(seq), hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_messages_are_bounded_on_a_character_boundary() {
        assert_eq!(bounded_message("short"), "short");
        let exact = "a".repeat(MAX_MESSAGE_BYTES);
        assert_eq!(bounded_message(&exact), exact);
        // Multi-byte characters across the cut: never split, never over the bound.
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = bounded_message(&long);
        assert!(cut.len() <= MAX_MESSAGE_BYTES, "{}", cut.len());
        assert!(cut.ends_with("… (truncated)"));
        assert!(
            cut.trim_end_matches("… (truncated)")
                .chars()
                .all(|c| c == 'é')
        );
        let record =
            LedgerRecord::refused(&context(), RecordOutcome::Denied, "R", &"x".repeat(5000));
        assert!(record.message.is_some_and(|m| m.len() <= MAX_MESSAGE_BYTES));
    }

    fn context() -> RecordContext {
        RecordContext {
            source: Source::Pcr,
            signer: "example.com/workload".into(),
            identity: crate::names::spiffe_id("cluster.local", "payments", "api"),
            requester: Some("system:node:node-1".into()),
            namespace: "payments".into(),
            service_account: "api".into(),
            pod_name: Some("api-0".into()),
            pod_uid: Some("pod-uid".into()),
            node_name: Some("node-1".into()),
            request_uid: Some("pcr-uid".into()),
            request_name: Some("payments/api-0-pcr".into()),
            ca_generation: Some(3),
            issuer_fingerprint: Some("ab".repeat(32)),
            auth: None,
            replica: "podca-0".into(),
            time: time::macros::datetime!(2026-11-24 10:00:00.5 UTC),
        }
    }

    #[test]
    fn an_issued_record_names_the_key_type_the_leaf_carries() {
        let now = OffsetDateTime::now_utc();
        let ca = crate::IssuingCa::self_signed_root(
            std::sync::Arc::new(
                crate::MemoryKey::generate(crate::CaAlgorithm::EcdsaP256)
                    .unwrap_or_else(|e| panic!("{e}")),
            ),
            "ledger test",
            now,
            time::Duration::days(1),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let validity = crate::Validity {
            not_before: now,
            not_after: now + time::Duration::hours(1),
            begin_refresh_at: now + time::Duration::minutes(30),
        };
        for (algorithm, name) in [
            (&rcgen::PKCS_ECDSA_P256_SHA256, "ECDSAP256"),
            (&rcgen::PKCS_ECDSA_P384_SHA384, "ECDSAP384"),
            (&rcgen::PKCS_ED25519, "ED25519"),
        ] {
            let pair = rcgen::KeyPair::generate_for(algorithm).unwrap_or_else(|e| panic!("{e}"));
            let subject = crate::keys::SubjectKey::from_spki_der(
                &rcgen::PublicKeyData::subject_public_key_info(&pair),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let cert = ca
                .issue(&subject, "spiffe://cluster.local/ns/a/sa/b", &[], &validity)
                .unwrap_or_else(|e| panic!("{e}"));
            let record = LedgerRecord::issued(&context(), &cert);
            assert_eq!(record.key_type.as_deref(), Some(name));
            // What the leaf itself says, read back from its DER.
            let (_, leaf) = x509_parser::parse_x509_certificate(&cert.leaf_der)
                .unwrap_or_else(|e| panic!("{e}"));
            let carried =
                crate::keys::SubjectKey::from_spki_der(leaf.tbs_certificate.subject_pki.raw)
                    .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(carried.key_type().kubelet_name(), name);
        }
    }

    #[test]
    fn a_refused_request_is_keyed_by_its_uid_so_a_retry_is_no_second_record() {
        let c = context();
        let a = LedgerRecord::refused(&c, RecordOutcome::Denied, "NamespaceNotAllowed", "no");
        let b = LedgerRecord::refused(&c, RecordOutcome::Denied, "NamespaceNotAllowed", "no");
        assert_eq!(a.id, "pcr:pcr-uid");
        assert_eq!(a, b);
        assert_eq!(a.time, time::macros::datetime!(2026-11-24 10:00 UTC));
        assert_eq!(a.schema, SCHEMA_VERSION);
        // Without a request uid (a gRPC refusal) every record is its own.
        let mut grpc = context();
        grpc.source = Source::Grpc;
        grpc.request_uid = None;
        let x = LedgerRecord::refused(&grpc, RecordOutcome::Failed, "CANotReady", "m");
        let y = LedgerRecord::refused(&grpc, RecordOutcome::Failed, "CANotReady", "m");
        assert!(x.id.starts_with("grpc:"), "{}", x.id);
        assert_ne!(x.id, y.id);
    }

    #[test]
    fn json_round_trips_and_legacy_records_still_read() {
        let record = LedgerRecord::refused(&context(), RecordOutcome::Denied, "R", "m");
        let json = record.to_json();
        assert!(json.contains("\"schema\":2"), "{json}");
        assert!(json.contains("\"outcome\":\"denied\""), "{json}");
        // Schema 2 numbers generations as `podca ca show` does; schema 1 counted reloads.
        assert_eq!(record.signing_generation(), Some(3));
        let mut older = record.clone();
        older.schema = 1;
        assert_eq!(older.signing_generation(), None);
        assert!(json.contains("\"source\":\"pcr\""), "{json}");
        assert_eq!(LedgerRecord::from_json(json.as_bytes()).unwrap(), record);
        let legacy = br#"{"serial":"0a","source":"grpc","request_uid":null,"request_name":null,
            "identity":"spiffe://td/ns/a/sa/b","dns_names":[],
            "not_before":"2026-11-29T12:00:00Z","not_after":"2026-11-30T12:00:00Z",
            "spki_sha256":"cd","issuer_fingerprint":"ef","issued_at":"2026-11-29T12:00:00Z"}"#;
        let old = LedgerRecord::from_json(legacy).unwrap();
        assert_eq!(old.id, "0a");
        assert_eq!(old.source, Source::Grpc);
        assert_eq!(
            (old.namespace.as_str(), old.service_account.as_str()),
            ("a", "b")
        );
        assert_eq!(old.outcome, RecordOutcome::Issued);
        let err = LedgerRecord::from_json(b"{\"serial\":1}").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid type: integer `1`, expected a string at line 1 column 11"
        );
    }

    #[test]
    fn filters_match_each_field_on_its_own() {
        let mut r = LedgerRecord::refused(&context(), RecordOutcome::Issued, "Issued", "");
        r.serial = Some("0abc".into());
        r.cert_sha256 = Some("11".repeat(32));
        let all = Filter::default();
        assert!(all.matches(&r));
        let t = r.time;
        for (what, filter, hit) in [
            (
                "identity",
                Filter {
                    identity: Some(r.identity.clone()),
                    ..all.clone()
                },
                true,
            ),
            (
                "identity other",
                Filter {
                    identity: Some("spiffe://x".into()),
                    ..all.clone()
                },
                false,
            ),
            (
                "namespace other",
                Filter {
                    namespace: Some("web".into()),
                    ..all.clone()
                },
                false,
            ),
            (
                "node",
                Filter {
                    node: Some("node-1".into()),
                    ..all.clone()
                },
                true,
            ),
            (
                "node other",
                Filter {
                    node: Some("node-2".into()),
                    ..all.clone()
                },
                false,
            ),
            (
                "serial any case",
                Filter {
                    serial: Some("0A:BC".into()),
                    ..all.clone()
                },
                true,
            ),
            (
                "serial other",
                Filter {
                    serial: Some("0abd".into()),
                    ..all.clone()
                },
                false,
            ),
            (
                "cert fingerprint",
                Filter {
                    fingerprint: Some("11".repeat(32)),
                    ..all.clone()
                },
                true,
            ),
            (
                "issuer fingerprint",
                Filter {
                    fingerprint: Some("AB".repeat(32)),
                    ..all.clone()
                },
                true,
            ),
            (
                "fingerprint other",
                Filter {
                    fingerprint: Some("22".repeat(32)),
                    ..all.clone()
                },
                false,
            ),
            (
                "since",
                Filter {
                    since: Some(t),
                    ..all.clone()
                },
                true,
            ),
            (
                "since later",
                Filter {
                    since: Some(t + time::Duration::SECOND),
                    ..all.clone()
                },
                false,
            ),
            (
                "until is exclusive",
                Filter {
                    until: Some(t),
                    ..all.clone()
                },
                false,
            ),
            (
                "outcome",
                Filter {
                    outcome: Some(RecordOutcome::Issued),
                    ..all.clone()
                },
                true,
            ),
            (
                "outcome other",
                Filter {
                    outcome: Some(RecordOutcome::Denied),
                    ..all.clone()
                },
                false,
            ),
        ] {
            assert_eq!(filter.matches(&r), hit, "{what}");
        }
    }

    #[test]
    fn a_retried_record_keeps_the_first_one_and_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("l.redb")).unwrap();
        let refused = |reason: &str| {
            let mut grpc = context();
            grpc.source = Source::Grpc;
            grpc.request_uid = None;
            LedgerRecord::refused(&grpc, RecordOutcome::Denied, reason, "m")
        };
        let first = refused("First");
        assert_eq!(ledger.append(std::slice::from_ref(&first)).unwrap(), [true]);
        // The same id again, with other content, beside a new record in one batch.
        let mut again = first.clone();
        again.reason = "Second".into();
        let other = refused("Other");
        assert_eq!(
            ledger.append(&[again, other.clone()]).unwrap(),
            [false, true]
        );
        assert_eq!(ledger.by_id(&first.id).unwrap(), Some(first.clone()));
        assert_eq!(ledger.by_id(&other.id).unwrap(), Some(other.clone()));
        let all = ledger.by_identity(&first.identity).unwrap();
        assert_eq!(all, [first, other]);
    }

    /// A ledger of `n` refusals with a checkpoint of all of them, and its key.
    fn logged(dir: &tempfile::TempDir, n: u32) -> (Ledger, crate::merkle_note::LogKey) {
        let ledger = Ledger::open(&dir.path().join("l.redb")).unwrap();
        let records: Vec<_> = (0..n)
            .map(|i| {
                let mut c = context();
                c.request_uid = Some(format!("uid-{i}"));
                LedgerRecord::refused(&c, RecordOutcome::Denied, "R", "m")
            })
            .collect();
        ledger.append(&records[..n as usize / 2]).unwrap();
        let key =
            crate::merkle_note::LogKey::load_or_generate(&dir.path().join("log.key"), "test/log")
                .unwrap();
        let half = ledger.log_frontier().unwrap();
        ledger
            .add_checkpoint(half.size(), &key.sign(half.size(), half.root()).unwrap())
            .unwrap();
        ledger.append(&records[n as usize / 2..]).unwrap();
        let all = ledger.log_frontier().unwrap();
        assert_eq!(all.size(), u64::from(n));
        ledger
            .add_checkpoint(all.size(), &key.sign(all.size(), all.root()).unwrap())
            .unwrap();
        (ledger, key)
    }

    #[test]
    fn the_log_verifies_and_any_changed_or_deleted_row_is_named() {
        use crate::merkle_verify::{LogFault, verify};
        let dir = tempfile::tempdir().unwrap();
        let (ledger, key) = logged(&dir, 10);
        let summary = verify(&ledger.log_snapshot().unwrap(), key.verifier()).unwrap();
        assert_eq!((summary.leaves, summary.checkpoints), (10, 2));
        assert_eq!(ledger.log_index_of("pcr:uid-7").unwrap(), Some(7));
        assert_eq!(ledger.log_index_of("pcr:nope").unwrap(), None);
        // Each tampering, on a fresh copy of the file, and what verify says of it.
        let tamper = |what: &dyn Fn(&redb::WriteTransaction)| {
            let copy = tempfile::tempdir().unwrap();
            let path = copy.path().join("l.redb");
            std::fs::copy(dir.path().join("l.redb"), &path).unwrap();
            {
                let db = Database::create(&path).unwrap();
                let tx = db.begin_write().unwrap();
                what(&tx);
                tx.commit().unwrap();
            }
            let opened = Ledger::open(&path).unwrap();
            verify(&opened.log_snapshot().unwrap(), key.verifier()).unwrap_err()
        };
        let changed_record = tamper(&|tx| {
            let mut t = tx.open_table(RECORDS).unwrap();
            let json = t.get(3).unwrap().unwrap().value().to_vec();
            let json = String::from_utf8(json).unwrap().replace("\"R\"", "\"Q\"");
            t.insert(3, json.as_bytes()).unwrap();
        });
        assert_eq!(
            changed_record,
            LogFault::LeafMismatch {
                index: 3,
                seq: 3,
                id: "pcr:uid-3".into()
            }
        );
        let changed_hash = tamper(&|tx| {
            let mut t = tx.open_table(LOG_LEAVES).unwrap();
            t.insert(4, leaf_value(4, &[0; 32]).as_slice()).unwrap();
        });
        assert!(matches!(
            changed_hash,
            LogFault::LeafMismatch { index: 4, .. }
        ));
        let deleted_record = tamper(&|tx| {
            tx.open_table(RECORDS).unwrap().remove(2).unwrap();
        });
        assert_eq!(deleted_record, LogFault::RecordMissing { index: 2, seq: 2 });
        let deleted_leaf = tamper(&|tx| {
            tx.open_table(LOG_LEAVES).unwrap().remove(6).unwrap();
        });
        assert!(matches!(
            deleted_leaf,
            LogFault::LeafMissing { index: 6, .. }
        ));
        // The last leaf and its record gone, the frontier rewritten to match: truncation.
        let truncated = tamper(&|tx| {
            tx.open_table(LOG_LEAVES).unwrap().remove(9).unwrap();
            tx.open_table(RECORDS).unwrap().remove(9).unwrap();
            let leaves = tx.open_table(LOG_LEAVES).unwrap();
            let mut f = Frontier::default();
            for e in leaves.iter().unwrap() {
                f.push(leaf_row(e.unwrap().1.value()).1);
            }
            tx.open_table(LOG_STATE)
                .unwrap()
                .insert(FRONTIER, f.encode().as_slice())
                .unwrap();
        });
        assert_eq!(
            truncated,
            LogFault::Truncated {
                size: 10,
                leaves: 9
            }
        );
        let changed_checkpoint = tamper(&|tx| {
            let mut t = tx.open_table(LOG_CHECKPOINTS).unwrap();
            let note = t.get(5).unwrap().unwrap().value().to_owned();
            let forged = key.sign(5, [7; 32]).unwrap();
            assert_ne!(note, forged);
            t.insert(5, forged.as_str()).unwrap();
        });
        assert_eq!(changed_checkpoint, LogFault::CheckpointRoot { size: 5 });
        let other_key = tamper(&|tx| {
            let other = crate::merkle_note::LogKey::load_or_generate(
                &dir.path().join("other.key"),
                "test/log",
            )
            .unwrap();
            let f = Frontier::default();
            tx.open_table(LOG_CHECKPOINTS)
                .unwrap()
                .insert(0, other.sign(0, f.root()).unwrap().as_str())
                .unwrap();
        });
        assert!(
            matches!(
                other_key,
                LogFault::CheckpointSignature {
                    size: 0,
                    error: crate::merkle_note::NoteError::NotSigned { .. }
                }
            ),
            "{other_key}"
        );
    }

    #[test]
    fn pruned_records_keep_their_leaves_and_the_log_still_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, key) = logged(&dir, 6);
        let later = context().time + time::Duration::hours(1);
        assert_eq!(ledger.prune(later).unwrap(), 6);
        let summary =
            crate::merkle_verify::verify(&ledger.log_snapshot().unwrap(), key.verifier()).unwrap();
        assert_eq!((summary.leaves, summary.pruned, summary.records), (6, 6, 0));
        // A new record after everything was pruned takes the next index, not index 0.
        let mut c = context();
        c.request_uid = Some("after".into());
        ledger
            .append(&[LedgerRecord::refused(&c, RecordOutcome::Denied, "R", "m")])
            .unwrap();
        assert_eq!(ledger.log_index_of("pcr:after").unwrap(), Some(6));
        crate::merkle_verify::verify(&ledger.log_snapshot().unwrap(), key.verifier()).unwrap();
    }

    #[test]
    fn a_file_with_the_multimap_identity_index_is_moved_to_the_new_one_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.redb");
        let record = |identity: &str, reason: &str| {
            let mut c = context();
            c.source = Source::Grpc;
            c.request_uid = None;
            c.identity = identity.into();
            LedgerRecord::refused(&c, RecordOutcome::Denied, reason, "m")
        };
        let a = "spiffe://cluster.local/ns/payments/sa/api";
        let b = "spiffe://cluster.local/ns/payments/sa/web";
        let old = [record(a, "A0"), record(b, "B0"), record(a, "A1")];
        // The layout written before 2026-12-04 (the same tables, the identity index a multimap),
        // after a newer podca had run on it once and an older one again.
        {
            let db = Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut records = tx.open_table(RECORDS).unwrap();
                let mut by_id = tx.open_table(BY_ID).unwrap();
                let mut by_identity = tx.open_multimap_table(OLD_BY_IDENTITY).unwrap();
                let mut by_time = tx.open_table(BY_TIME).unwrap();
                // An entry of the new index whose record an older podca pruned since.
                let mut new_index = tx.open_table(BY_IDENTITY).unwrap();
                new_index.insert((a, 99u64), ()).unwrap();
                for (seq, r) in (0u64..).zip(&old) {
                    records.insert(seq, r.to_json().as_bytes()).unwrap();
                    by_id.insert(r.id.as_str(), seq).unwrap();
                    by_identity.insert(r.identity.as_str(), seq).unwrap();
                    by_time.insert((r.time.unix_timestamp(), seq), ()).unwrap();
                }
            }
            tx.commit().unwrap();
        }
        let ledger = Ledger::open(&path).unwrap();
        assert_eq!(
            ledger.by_identity(a).unwrap(),
            [old[0].clone(), old[2].clone()]
        );
        assert_eq!(ledger.by_identity(b).unwrap(), [old[1].clone()]);
        // The old index is gone; newest first, only as many as the limit.
        let tx = ledger.db.begin_read().unwrap();
        assert_eq!(tx.list_multimap_tables().unwrap().count(), 0);
        drop(tx);
        let newest = Filter {
            identity: Some(a.into()),
            limit: 1,
            ..Filter::default()
        };
        assert_eq!(ledger.query(&newest).unwrap(), [old[2].clone()]);
        // New records join the moved ones, and reopening moves nothing twice.
        let new = record(a, "A2");
        assert_eq!(ledger.append(std::slice::from_ref(&new)).unwrap(), [true]);
        drop(ledger);
        let ledger = Ledger::open(&path).unwrap();
        assert_eq!(
            ledger.by_identity(a).unwrap(),
            [old[0].clone(), old[2].clone(), new.clone()]
        );
        // Pruning removes a record from the identity index too.
        let later = new.time + time::Duration::SECOND;
        assert_eq!(ledger.prune(later).unwrap(), 4);
        assert_eq!(ledger.by_identity(a).unwrap(), []);
        let tx = ledger.db.begin_read().unwrap();
        assert_eq!(tx.open_table(BY_IDENTITY).unwrap().len().unwrap(), 0);
    }
}
