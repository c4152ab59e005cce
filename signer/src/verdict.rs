//! The answer `podca policy test` gives for one request: the decision, its reason and message,
//! which allow-list or rule decided (found by deciding again under each prefix of the rules),
//! and for an issued certificate or token what it carries. Pure: the command line reads the
//! inputs and prints [`Verdict::to_text`] or [`Verdict::to_json`].

use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::{DenyReason, FailReason, Outcome, SignerPolicy};

fn time(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// The answer `podca policy test` prints.
#[derive(Debug)]
pub struct Verdict {
    /// `Issued`, `Denied` or `Failed`.
    pub decision: &'static str,
    pub reason: String,
    pub message: String,
    /// Which allow-list or rule decided.
    pub decided_by: String,
    /// The request as decided, in one line.
    pub request: String,
    /// The CA that signs for the request's signer, as the configuration names it.
    pub ca: Option<String>,
    pub issued: Option<IssuedFacts>,
    pub notes: Vec<String>,
}

#[derive(Debug)]
pub struct IssuedFacts {
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    /// iPAddress SANs (the `kubernetes.io/service-ca` vocabulary).
    pub ip_addresses: Vec<std::net::IpAddr>,
    pub lifetime_seconds: i64,
    /// None for JWT-SVIDs (the token is dated when signed).
    pub not_before: Option<OffsetDateTime>,
    pub not_after: OffsetDateTime,
}

impl Verdict {
    /// The answer as one JSON object (`-o json`).
    pub fn to_json(&self) -> serde_json::Value {
        {
            {
                let issued = self.issued.as_ref().map(|i| {
                    json!({
                        "spiffe_id": i.spiffe_id,
                        "dns_names": i.dns_names,
                        "ip_addresses": i.ip_addresses,
                        "lifetime_seconds": i.lifetime_seconds,
                        "not_before": i.not_before.map(time),
                        "not_after": time(i.not_after),
                    })
                });
                json!({
                    "decision": self.decision,
                    "reason": self.reason,
                    "message": self.message,
                    "decided_by": self.decided_by,
                    "request": self.request,
                    "ca": self.ca,
                    "issued": issued,
                    "notes": self.notes,
                })
            }
        }
    }

    /// The answer as text lines (`-o text`).
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        {
            {
                let _ = writeln!(out, "decision:   {}", self.decision);
                let _ = writeln!(out, "reason:     {}", self.reason);
                if !self.message.is_empty() {
                    let _ = writeln!(out, "message:    {}", self.message);
                }
                let _ = writeln!(out, "decided by: {}", self.decided_by);
                let _ = writeln!(out, "request:    {}", self.request);
                if let Some(ca) = &self.ca {
                    let _ = writeln!(out, "ca:         {ca}");
                }
                if let Some(i) = &self.issued {
                    let _ = writeln!(out, "spiffe id:  {}", i.spiffe_id);
                    if i.dns_names.is_empty() {
                        let _ = writeln!(out, "dns names:  (none)");
                    } else {
                        let _ = writeln!(out, "dns names:  {}", i.dns_names.join(", "));
                    }
                    if !i.ip_addresses.is_empty() {
                        let ips: Vec<String> =
                            i.ip_addresses.iter().map(ToString::to_string).collect();
                        let _ = writeln!(out, "ip sans:    {}", ips.join(", "));
                    }
                    let _ = match i.not_before {
                        Some(nb) => writeln!(
                            out,
                            "lifetime:   {} s (not before {}, not after {})",
                            i.lifetime_seconds,
                            time(nb),
                            time(i.not_after)
                        ),
                        None => writeln!(
                            out,
                            "lifetime:   {} s (expires {})",
                            i.lifetime_seconds,
                            time(i.not_after)
                        ),
                    };
                }
                for note in &self.notes {
                    let _ = writeln!(out, "note:       {note}");
                }
            }
        }
        out
    }
}

/// "allow-lists passed, N rules passed".
pub fn passed(policy: &SignerPolicy) -> String {
    match policy.rules.len() {
        0 => "the allow-lists passed (no rules)".into(),
        1 => "the allow-lists and the 1 rule passed".into(),
        n => format!("the allow-lists and all {n} rules passed"),
    }
}

/// The verdict for `outcome`; `rerun` decides again under another policy (for which rule).
pub fn verdict(
    outcome: Outcome,
    policy: Option<&SignerPolicy>,
    signer: &str,
    request: String,
    notes: Vec<String>,
    rerun: &dyn Fn(&SignerPolicy) -> Option<Outcome>,
) -> Verdict {
    let mut v = Verdict {
        decision: "Issued",
        reason: String::new(),
        message: String::new(),
        decided_by: String::new(),
        request,
        ca: None,
        issued: None,
        notes,
    };
    match outcome {
        Outcome::Issued(cert) => {
            v.reason = crate::reason::ISSUED.into();
            v.decided_by = policy.map(passed).unwrap_or_default();
            let validity = cert.validity;
            v.issued = Some(IssuedFacts {
                spiffe_id: cert.spiffe_id.clone(),
                dns_names: cert.dns_names.clone(),
                ip_addresses: cert.ip_addresses.clone(),
                lifetime_seconds: (validity.not_after - validity.not_before).whole_seconds(),
                not_before: Some(validity.not_before),
                not_after: validity.not_after,
            });
        }
        Outcome::Denied { reason, message } => {
            v.decision = "Denied";
            v.reason = reason.condition_reason().into();
            v.decided_by = match (reason, policy) {
                (DenyReason::Rule(_), Some(policy)) => {
                    deciding_rule(policy, v.reason.as_str(), &message, rerun)
                }
                (DenyReason::Rule(_), None) => "a CEL rule".into(),
                (DenyReason::UnsupportedKeyType, _) => {
                    "allow-list key_types (or a key type podca never certifies)".into()
                }
                (DenyReason::MalformedPublicKey, _) => "the request's public key".into(),
                (DenyReason::NamespaceNotAllowed, _) => {
                    "allow-list namespaces / excluded_namespaces".into()
                }
                (DenyReason::ServiceAccountNotAllowed, _) => "allow-list service_accounts".into(),
                (DenyReason::InvalidUserAnnotations, _) => {
                    "allow-list allowed_dns_names (the podca.dev/dns-names annotation)".into()
                }
                (DenyReason::PodNotFound, _) => {
                    "the pod read for the rules (pod_facts): no such pod with that UID".into()
                }
                (DenyReason::NameNotPermittedByCa, _) => "the CA's nameConstraints".into(),
                (DenyReason::ReservedDnsName, _) => "podca's own serving names".into(),
                (DenyReason::NotEntitledToName, _) => {
                    "service_ca: the pod and the Services its annotations name".into()
                }
            };
            v.message = message;
        }
        Outcome::Failed { reason, message } => {
            v.decision = "Failed";
            v.reason = reason.condition_reason().into();
            v.decided_by = match reason {
                FailReason::UnknownSigner => {
                    format!("the controller: no [signers.{signer:?}] in the config")
                }
                FailReason::LegacyRequestUnreadable => {
                    "the controller: a legacy key only v1beta1 shows".into()
                }
                FailReason::InvalidDnsNameTemplate => "dns_name_templates".into(),
                FailReason::LifetimeNotSatisfiable => {
                    "the lifetimes (default/max_lifetime_seconds, maxExpirationSeconds)".into()
                }
                FailReason::CaExpiresTooSoon
                | FailReason::CaKeyUnusable
                | FailReason::CertificateBuildFailed => "the CA".into(),
                FailReason::IdentityNotPermittedByCa => "the CA's nameConstraints".into(),
            };
            v.message = message;
        }
        Outcome::Retry(e) => {
            // An in-memory key never reports a transient failure; answered anyway.
            v.decision = "Failed";
            v.reason = "CAUnavailable".into();
            v.decided_by = "the CA".into();
            v.message = e.to_string();
        }
    }
    v
}

/// Names the rule that denied: the shortest prefix of the rules that gives the same denial.
fn deciding_rule(
    policy: &SignerPolicy,
    reason: &str,
    message: &str,
    rerun: &dyn Fn(&SignerPolicy) -> Option<Outcome>,
) -> String {
    let n = policy.rules.len();
    for k in 1..=n {
        let mut prefix = policy.clone();
        prefix.rules.truncate(k);
        if let Some(Outcome::Denied {
            reason: r,
            message: m,
        }) = rerun(&prefix)
            && r.condition_reason() == reason
            && m == message
        {
            let rule = &policy.rules[k - 1];
            let kind = if rule.deny.is_some() {
                "deny"
            } else {
                "require"
            };
            let failed = if reason.starts_with("PolicyRuleFailed:") {
                ", failed to evaluate (rules fail closed)"
            } else {
                ""
            };
            return format!("rule {:?} ({k} of {n}, {kind}{failed})", rule.name);
        }
    }
    format!("a CEL rule (reason {reason})")
}
