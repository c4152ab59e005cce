//! The audit log: every decision, and every refused unauthenticated caller, as one JSON line on
//! the tracing target [`TARGET`] (schema [`AUDIT_SCHEMA`], documented in docs/ledger.md, "The
//! audit log"). Ship that target to Loki or a SIEM; the message of each event is the JSON object.

use podca_signer::LedgerRecord;
use serde::Serialize;
use time::OffsetDateTime;

/// The tracing target of audit lines.
pub const TARGET: &str = "podca::audit";
/// The version of the audit line (the `audit` field).
pub const AUDIT_SCHEMA: u32 = 1;

#[derive(Serialize)]
struct DecisionLine<'a> {
    audit: u32,
    event: &'static str,
    #[serde(flatten)]
    record: &'a LedgerRecord,
}

/// A caller the gRPC edge refused before it knew who it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// `podca.v1.PodCA/IssueCertificate`, …
    pub method: String,
    /// The peer address (`10.0.0.7:51234`, `unix`).
    pub peer: String,
    /// The gRPC status code name (`UNAUTHENTICATED`, `PERMISSION_DENIED`, `UNAVAILABLE`).
    pub code: String,
    /// Why, as the caller was told (never the token).
    pub reason: String,
}

#[derive(Serialize)]
struct RefusalLine<'a> {
    audit: u32,
    event: &'static str,
    #[serde(with = "time::serde::rfc3339")]
    time: OffsetDateTime,
    #[serde(flatten)]
    refusal: &'a Refusal,
    replica: &'a str,
}

/// The audit line of a recorded decision.
pub fn decision_line(record: &LedgerRecord) -> String {
    serde_json::to_string(&DecisionLine {
        audit: AUDIT_SCHEMA,
        event: "decision",
        record,
    })
    .unwrap_or_default()
}

/// The audit line of a refused caller.
pub fn refusal_line(refusal: &Refusal, time: OffsetDateTime, replica: &str) -> String {
    serde_json::to_string(&RefusalLine {
        audit: AUDIT_SCHEMA,
        event: "refusal",
        time: time.replace_nanosecond(0).unwrap_or(time),
        refusal,
        replica,
    })
    .unwrap_or_default()
}

/// Writes the audit line of a decision.
pub fn decision(record: &LedgerRecord) {
    tracing::info!(target: TARGET, "{}", decision_line(record));
}

/// Writes the audit line of a refused caller: the hook the gRPC authentication layer calls.
pub fn refused(refusal: &Refusal) {
    let line = refusal_line(refusal, OffsetDateTime::now_utc(), &replica());
    tracing::info!(target: TARGET, "{line}");
}

fn replica() -> String {
    static REPLICA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    REPLICA
        .get_or_init(podca_signer::ledger::replica_identity)
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_line_is_one_json_object_without_the_token() {
        let refusal = Refusal {
            method: "podca.v1.PodCA/IssueCertificate".into(),
            peer: "10.0.0.7:51234".into(),
            code: "UNAUTHENTICATED".into(),
            reason: "invalid credentials: token expired".into(),
        };
        let line = refusal_line(
            &refusal,
            time::macros::datetime!(2026-11-24 10:00:00.25 UTC),
            "podca-0",
        );
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "audit": 1,
                "event": "refusal",
                "time": "2026-11-24T10:00:00Z",
                "method": "podca.v1.PodCA/IssueCertificate",
                "peer": "10.0.0.7:51234",
                "code": "UNAUTHENTICATED",
                "reason": "invalid credentials: token expired",
                "replica": "podca-0",
            })
        );
        assert!(!line.contains('\n'));
    }
}
