//! The pure half of reconciliation: what to write for an [`Outcome`], how to read an API error,
//! when to re-issue and how long to back off. No I/O here; everything is table-tested.

use std::time::Duration;

use podca_signer::{Outcome, reason};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Longest condition message kube-apiserver accepts (rule 34).
pub const MAX_MESSAGE_BYTES: usize = 32_768;

/// A signed certificate older than this (since its notBefore) is re-issued rather than sent: the
/// API server refuses a notBefore more than 5 minutes in the past (rule 16.8).
pub const REISSUE_AFTER: time::Duration = time::Duration::seconds(240);

/// The terminal condition types (rule 12).
pub const TERMINAL_TYPES: [&str; 3] = ["Issued", "Denied", "Failed"];

/// How a settled PCR ended, for metrics and events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    Issued,
    Denied,
    Failed,
}

impl Settlement {
    pub fn condition_type(self) -> &'static str {
        match self {
            Settlement::Issued => "Issued",
            Settlement::Denied => "Denied",
            Settlement::Failed => "Failed",
        }
    }
}

/// The one `/status` write for an outcome: a JSON merge patch of the whole status, or `None` when
/// the outcome is transient and the PCR must stay pending.
///
/// Issued: chain, notBefore, notAfter, beginRefreshAt and one `Issued` condition in one write
/// (rules 16, 17). Denied/Failed: only the condition (rule 15).
pub fn status_patch(outcome: &Outcome, now: OffsetDateTime) -> Option<(Settlement, Value)> {
    let now = format_time(now);
    match outcome {
        Outcome::Issued(cert) => {
            let message = format!("issued {} (serial {})", cert.spiffe_id, cert.serial);
            Some((
                Settlement::Issued,
                json!({ "status": {
                    "certificateChain": cert.chain_pem,
                    "notBefore": format_time(cert.validity.not_before),
                    "notAfter": format_time(cert.validity.not_after),
                    "beginRefreshAt": format_time(cert.validity.begin_refresh_at),
                    "conditions": [condition("Issued", reason::ISSUED, &message, &now)],
                }}),
            ))
        }
        Outcome::Denied { reason, message } => Some((
            Settlement::Denied,
            json!({ "status": { "conditions": [condition("Denied", reason.condition_reason(), message, &now)] } }),
        )),
        Outcome::Failed { reason, message } => Some((
            Settlement::Failed,
            json!({ "status": { "conditions": [condition("Failed", reason.condition_reason(), message, &now)] } }),
        )),
        Outcome::Retry(_) => None,
    }
}

fn condition(kind: &str, reason: &str, message: &str, now: &str) -> Value {
    json!({
        "type": kind,
        "status": "True",
        "reason": sanitize_reason(reason),
        "message": truncate_message(message),
        "lastTransitionTime": now,
    })
}

/// `metav1.Time`: RFC 3339, whole seconds, `Z` (spec §6.2).
pub fn format_time(t: OffsetDateTime) -> String {
    let t = t
        .to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .unwrap_or(t); // 0 is always a valid nanosecond
    t.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into()) // only years outside 0..=9999 fail
}

/// A reason that passes rule 33 (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, ≤ 1024 chars).
/// Reasons come from the typed reasons of `podca_signer::reason`; this guards against a bad one ever reaching the API server.
pub fn sanitize_reason(reason: &str) -> String {
    let mut out: String = reason
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
        .take(1024)
        .collect();
    while out.ends_with([',', ':']) {
        out.pop();
    }
    if !out.starts_with(|c: char| c.is_ascii_alphabetic()) {
        out.insert_str(0, "Reason");
        out.truncate(1024);
    }
    out
}

/// Cut a message to rule 34's byte limit on a character boundary.
pub fn truncate_message(message: &str) -> &str {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// The terminal condition type of a status's conditions, if any.
pub fn terminal_condition<'a>(types: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    types.into_iter().find(|t| TERMINAL_TYPES.contains(t))
}

/// Whether a certificate signed with this notBefore is too old to send (rule 16.8).
pub fn needs_reissue(not_before: OffsetDateTime, now: OffsetDateTime) -> bool {
    now - not_before > REISSUE_AFTER
}

/// What an API error means for a PCR write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Try again later with backoff: 429, 5xx, timeouts, connection trouble, a missing `sign`
    /// permission (an operator can fix it; failing the PCR would be permanent for the pod).
    Transient,
    /// The PCR is gone (the cleaner deleted it): nothing to do.
    Gone,
    /// 409: re-read; if the PCR is terminal now, someone else settled it.
    Conflict,
    /// 422 "immutable after ... issued, denied, or failed": someone else settled it.
    SettledElsewhere,
    /// Any other refusal: our write is wrong and repeating it will not help.
    Rejected,
}

/// Classifies an HTTP status code and message from the API server.
pub fn classify_status(code: u16, message: &str) -> ErrorClass {
    match code {
        404 | 410 => ErrorClass::Gone,
        409 => ErrorClass::Conflict,
        422 if message.contains("immutable after PodCertificateRequest is issued") => {
            ErrorClass::SettledElsewhere
        }
        // The sign check answers 422 with a Forbidden cause (rule 18): RBAC can be fixed.
        422 if message.contains("spec.signerName: Forbidden") => ErrorClass::Transient,
        401 | 403 | 408 | 429 => ErrorClass::Transient,
        500..=599 => ErrorClass::Transient,
        _ => ErrorClass::Rejected,
    }
}

/// Classifies any kube client error.
pub fn classify(error: &kube::Error) -> ErrorClass {
    match error {
        kube::Error::Api(status) => classify_status(status.code, &status.message),
        // Transport, timeouts, undecodable responses (a proxy's HTML error page): retry.
        _ => ErrorClass::Transient,
    }
}

/// Exponential backoff with jitter: 200 ms doubling to 30 s; `jitter` in [0, 1) adds up to 50 %.
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let base_ms = 200u64.saturating_mul(1u64 << attempt.min(8)).min(30_000);
    let extra = (base_ms as f64 * 0.5 * jitter.clamp(0.0, 1.0)) as u64;
    Duration::from_millis(base_ms + extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podca_signer::{BackendError, IssuedCertificate, Validity};
    use time::macros::datetime;

    fn issued() -> Outcome {
        Outcome::Issued(Box::new(IssuedCertificate {
            chain_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            leaf_der: vec![],
            serial: "01ab".into(),
            validity: Validity {
                not_before: datetime!(2026-08-26 10:00:00 UTC),
                not_after: datetime!(2026-08-27 10:00:00 UTC),
                begin_refresh_at: datetime!(2026-08-26 22:00:00 UTC),
            },
            spiffe_id: "spiffe://cluster.local/ns/a/sa/b".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            spki_sha256: String::new(),
            issuer_fingerprint: String::new(),
            key_type: podca_signer::KeyType::EcdsaP256,
        }))
    }

    #[test]
    fn status_patch_table() {
        let now = datetime!(2026-08-26 10:01:00.750 UTC);
        let (kind, patch) = status_patch(&issued(), now).expect("issued writes");
        assert_eq!(kind, Settlement::Issued);
        let status = &patch["status"];
        assert_eq!(status["notBefore"], "2026-08-26T10:00:00Z");
        assert_eq!(status["notAfter"], "2026-08-27T10:00:00Z");
        assert_eq!(status["beginRefreshAt"], "2026-08-26T22:00:00Z");
        assert!(
            status["certificateChain"]
                .as_str()
                .is_some_and(|c| c.starts_with("-----BEGIN CERTIFICATE"))
        );
        let conditions = status["conditions"].as_array().expect("array");
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0]["type"], "Issued");
        assert_eq!(conditions[0]["status"], "True");
        assert_eq!(conditions[0]["reason"], "Issued");
        // Whole seconds, no fraction (rule 35 and §6.2).
        assert_eq!(conditions[0]["lastTransitionTime"], "2026-08-26T10:01:00Z");

        for (outcome, kind, ty, why) in [
            (
                Outcome::Denied {
                    reason: podca_signer::DenyReason::UnsupportedKeyType,
                    message: "no".into(),
                },
                Settlement::Denied,
                "Denied",
                "UnsupportedKeyType",
            ),
            (
                Outcome::Failed {
                    reason: podca_signer::FailReason::CaExpiresTooSoon,
                    message: "rotate".into(),
                },
                Settlement::Failed,
                "Failed",
                "CAExpiresTooSoon",
            ),
        ] {
            let (k, patch) = status_patch(&outcome, now).expect("terminal writes");
            assert_eq!(k, kind);
            let status = patch["status"].as_object().expect("object");
            // Rule 15: only conditions.
            assert_eq!(status.keys().collect::<Vec<_>>(), vec!["conditions"]);
            assert_eq!(status["conditions"][0]["type"], ty);
            assert_eq!(status["conditions"][0]["reason"], why);
            assert_eq!(status["conditions"][0]["status"], "True");
        }

        let retry = Outcome::Retry(BackendError::Unavailable("hsm down".into()));
        assert!(
            status_patch(&retry, now).is_none(),
            "transient outcomes write nothing"
        );
    }

    #[test]
    fn reasons_are_always_valid() {
        let valid = |r: &str| {
            let b = r.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphabetic()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"_,:".contains(c))
                && !r.ends_with([',', ':'])
        };
        for (input, want) in [
            ("Issued", "Issued"),
            ("Policy Denied", "PolicyDenied"),
            ("ca-expired.", "caexpired"),
            ("9lives", "Reason9lives"),
            ("", "Reason"),
            ("A:b,", "A:b"),
        ] {
            let got = sanitize_reason(input);
            assert_eq!(got, want, "{input:?}");
            assert!(valid(&got), "{got:?}");
        }
        let signer_reasons = [reason::ISSUED].into_iter().chain(
            podca_signer::DenyReason::ALL
                .iter()
                .map(|r| r.condition_reason())
                .chain(
                    podca_signer::FailReason::ALL
                        .iter()
                        .map(|r| r.condition_reason()),
                ),
        );
        for r in signer_reasons {
            assert_eq!(sanitize_reason(r), r, "signer reasons are already valid");
        }
    }

    #[test]
    fn messages_are_cut_on_char_boundaries() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = truncate_message(&long);
        assert!(cut.len() <= MAX_MESSAGE_BYTES);
        assert!(cut.len() >= MAX_MESSAGE_BYTES - 1);
        assert_eq!(truncate_message("short"), "short");
    }

    #[test]
    fn error_classes() {
        for (code, message, want) in [
            (404, "not found", ErrorClass::Gone),
            (409, "the object has been modified", ErrorClass::Conflict),
            (
                422,
                "status: Invalid value: ...: immutable after PodCertificateRequest is issued, denied, or failed",
                ErrorClass::SettledElsewhere,
            ),
            (
                422,
                "spec.signerName: Forbidden: User \"x\" is not permitted to \"sign\"",
                ErrorClass::Transient,
            ),
            (
                422,
                "status.notBefore: must be within 5 minutes",
                ErrorClass::Rejected,
            ),
            (429, "too many requests", ErrorClass::Transient),
            (500, "internal", ErrorClass::Transient),
            (503, "unavailable", ErrorClass::Transient),
            (504, "timeout", ErrorClass::Transient),
            (403, "forbidden", ErrorClass::Transient),
            (400, "bad request", ErrorClass::Rejected),
        ] {
            assert_eq!(classify_status(code, message), want, "{code} {message}");
        }
    }

    #[test]
    fn reissue_after_four_minutes() {
        let nb = datetime!(2026-08-26 10:00:00 UTC);
        for (secs, want) in [
            (0, false),
            (60, false),
            (240, false),
            (241, true),
            (600, true),
        ] {
            assert_eq!(
                needs_reissue(nb, nb + time::Duration::seconds(secs)),
                want,
                "{secs}"
            );
        }
    }

    #[test]
    fn terminal_detection() {
        assert_eq!(terminal_condition(["Issued"]), Some("Issued"));
        assert_eq!(terminal_condition(["Other", "Denied"]), Some("Denied"));
        assert_eq!(terminal_condition(Vec::<&str>::new()), None);
        assert_eq!(terminal_condition(["Pending"]), None);
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(0, 0.0), Duration::from_millis(200));
        assert_eq!(backoff(1, 0.0), Duration::from_millis(400));
        assert_eq!(backoff(20, 0.0), Duration::from_secs(30));
        assert_eq!(backoff(20, 0.999_999), Duration::from_millis(44_999));
        assert!(backoff(3, 0.5) > backoff(3, 0.0));
    }
}
