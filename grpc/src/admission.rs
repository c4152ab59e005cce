//! Admission, pure: what a request asks, the signer's policy and the API's limits → an admitted
//! plan or a typed refusal ([`ApiError`]). The servers call these once they know who the caller
//! is (and, for rules that read them, the namespace's labels and the pod); `podca policy test`
//! calls the same functions with facts read from files, so the offline answer is the server's
//! (as `podca_controller::sample` calls the PCR controller's `plan()`).
//!
//! A certificate's policy decision itself is `podca_signer::sign_request_with`, which both call
//! after [`admit_certificate`]; a JWT-SVID's is [`admit_jwt`], whole.

use std::collections::BTreeMap;

use podca_signer::jwt::{IssueLimits, token_expiry};
use podca_signer::policy::Decision;
use podca_signer::rules::PodMetadata;
use podca_signer::{RequestSource, RuleFacts, SignerPolicy};
use time::{Duration, OffsetDateTime};

use crate::auth::Identity;
use crate::core::dns_name_count;
use crate::errors::ApiError;

/// A requested lifetime as the gRPC APIs carry it: `None`, or positive seconds. One longer than
/// any policy allows is not refused: it is clamped to `u32` seconds here and to the policy's
/// maximum when the validity is planned.
pub fn requested_lifetime(seconds: Option<i64>) -> Result<Option<Duration>, ApiError> {
    match seconds {
        None => Ok(None),
        Some(s) if s <= 0 => Err(ApiError::BadLifetime(s)),
        Some(s) => Ok(Some(Duration::seconds(s.min(i64::from(u32::MAX))))),
    }
}

/// What a certificate request asks, before any key work.
#[derive(Debug, Clone)]
pub struct CertificateAsk<'a> {
    pub requested_lifetime_seconds: Option<i64>,
    pub user_annotations: &'a BTreeMap<String, String>,
    /// `[grpc] max_dns_names`.
    pub max_dns_names: usize,
}

/// A certificate request that passed the API's own checks; the signer's policy decides the rest
/// (`podca_signer::sign_request_with`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmittedCertificate {
    /// Clamped to `u32` seconds; the policy clamps it further.
    pub requested_lifetime: Option<Duration>,
}

/// The API's checks of a certificate request under `policy`: the lifetime's form and the number
/// of DNS names (the signer's templates and the requested ones) against `max_dns_names`.
pub fn admit_certificate(
    policy: &SignerPolicy,
    ask: &CertificateAsk<'_>,
) -> Result<AdmittedCertificate, ApiError> {
    let requested_lifetime = requested_lifetime(ask.requested_lifetime_seconds)?;
    let requested = dns_name_count(policy, ask.user_annotations);
    if requested > ask.max_dns_names {
        return Err(ApiError::TooManyDnsNames {
            requested,
            max: ask.max_dns_names,
        });
    }
    Ok(AdmittedCertificate { requested_lifetime })
}

/// What a JWT-SVID request is, with the facts the signer's rules read.
#[derive(Debug, Clone)]
pub struct JwtFacts<'a> {
    /// The signer's name (its rules are compiled per signer).
    pub signer: &'a str,
    /// Whom the token is for.
    pub subject: &'a Identity,
    pub audiences: &'a [String],
    /// The Workload API's `spiffe_id` selection (empty: none).
    pub spiffe_id: &'a str,
    /// The requested lifetime (None: `[jwt] default_lifetime_seconds`).
    pub lifetime: Option<Duration>,
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    pub pod: Option<&'a PodMetadata>,
    pub now: OffsetDateTime,
}

/// An admitted JWT-SVID: whom it names and within which limits it is signed.
#[derive(Debug, Clone)]
pub struct JwtPlan {
    pub spiffe_id: String,
    /// `[jwt]`'s limits, with the rules' lifetime cap applied.
    pub limits: IssueLimits,
    pub lifetime: Option<Duration>,
}

impl JwtPlan {
    /// The token's expiry if signed at `now` by a key published until `key_published_until`.
    pub fn expiry(
        &self,
        now: OffsetDateTime,
        key_published_until: Option<OffsetDateTime>,
    ) -> OffsetDateTime {
        token_expiry(now, self.lifetime, &self.limits, key_published_until)
    }
}

/// The decision on a JWT-SVID: the signer's allow-lists, then its CEL rules over the verified
/// identity and the audiences (an output's lifetime cap applies to the token too; its DNS names
/// do not), then the SPIFFE ID the Workload API may have selected (only the subject's own).
pub fn admit_jwt(
    policy: &SignerPolicy,
    facts: &JwtFacts<'_>,
    limits: &IssueLimits,
) -> Result<JwtPlan, ApiError> {
    let subject = facts.subject;
    if let Err(Decision::Deny { reason, message }) =
        policy.admits(&subject.namespace, &subject.service_account)
    {
        return Err(ApiError::Denied { reason, message });
    }
    let no_annotations = BTreeMap::new();
    let rule_facts = RuleFacts {
        source: RequestSource::Jwt,
        signer_name: facts.signer,
        namespace: &subject.namespace,
        service_account: &subject.service_account,
        pod_name: subject.pod_name.as_deref(),
        pod_uid: subject.pod_uid.as_deref(),
        node_name: subject.node_name.as_deref(),
        key_type: None,
        requested_lifetime_seconds: facts.lifetime.map(|l| l.whole_seconds()),
        annotations: &no_annotations,
        audiences: facts.audiences,
        namespace_labels: facts.namespace_labels,
        pod: facts.pod,
        now: facts.now.unix_timestamp(),
    };
    let cap = match policy.apply_rules_with_outputs(&rule_facts) {
        Ok(outputs) => outputs.max_lifetime_seconds.map(Duration::seconds),
        Err(Decision::Deny { reason, message }) => {
            return Err(ApiError::Denied { reason, message });
        }
        Err(_) => None,
    };
    let own = podca_signer::names::spiffe_id(
        &policy.trust_domain,
        &subject.namespace,
        &subject.service_account,
    );
    if !facts.spiffe_id.is_empty() && facts.spiffe_id != own {
        return Err(ApiError::UnknownSpiffeId {
            requested: facts.spiffe_id.chars().take(256).collect(),
            own,
        });
    }
    let mut limits = limits.clone();
    if let Some(cap) = cap {
        limits.max_lifetime = limits.max_lifetime.min(cap);
        limits.default_lifetime = limits.default_lifetime.min(cap);
    }
    Ok(JwtPlan {
        spiffe_id: own,
        limits,
        lifetime: facts.lifetime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A permissive policy; with `cap`, an output capping lifetimes at that CEL expression.
    fn policy(cap: &str) -> SignerPolicy {
        let mut policy = SignerPolicy::permissive("example.org");
        if !cap.is_empty() {
            policy.outputs.max_lifetime_seconds = Some(cap.to_owned());
        }
        policy
    }

    fn facts<'a>(subject: &'a Identity, audiences: &'a [String]) -> JwtFacts<'a> {
        JwtFacts {
            signer: "example.org/jwt",
            subject,
            audiences,
            spiffe_id: "",
            lifetime: Some(Duration::hours(1)),
            namespace_labels: None,
            pod: None,
            now: OffsetDateTime::UNIX_EPOCH + Duration::days(20_000),
        }
    }

    #[test]
    fn a_rules_lifetime_cap_shortens_the_token() {
        let policy = policy("120");
        let subject = Identity::service_account("apps", "web");
        let audiences = vec!["db".to_owned()];
        let plan = admit_jwt(
            &policy,
            &facts(&subject, &audiences),
            &IssueLimits::default(),
        )
        .unwrap();
        assert_eq!(plan.spiffe_id, "spiffe://example.org/ns/apps/sa/web");
        let now = OffsetDateTime::UNIX_EPOCH;
        assert_eq!(plan.expiry(now, None) - now, Duration::seconds(120));
    }

    #[test]
    fn another_spiffe_id_and_a_denied_namespace_are_refused() {
        let subject = Identity::service_account("apps", "web");
        let audiences = vec!["db".to_owned()];
        let mut asked = facts(&subject, &audiences);
        asked.spiffe_id = "spiffe://example.org/ns/apps/sa/admin";
        let refused = admit_jwt(&policy(""), &asked, &IssueLimits::default()).unwrap_err();
        assert!(
            matches!(&refused, ApiError::UnknownSpiffeId { own, .. }
                if own == "spiffe://example.org/ns/apps/sa/web"),
            "{refused:?}"
        );
        let mut narrow = policy("");
        narrow.namespaces = vec!["prod".into()];
        let refused = admit_jwt(
            &narrow,
            &facts(&subject, &audiences),
            &IssueLimits::default(),
        )
        .unwrap_err();
        assert!(
            matches!(
                &refused,
                ApiError::Denied {
                    reason: podca_signer::DenyReason::NamespaceNotAllowed,
                    ..
                }
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn certificate_lifetimes_and_dns_names_are_checked_before_any_key_work() {
        let none = BTreeMap::new();
        let ask = |seconds, max_dns_names| CertificateAsk {
            requested_lifetime_seconds: seconds,
            user_annotations: &none,
            max_dns_names,
        };
        let policy = policy("");
        assert_eq!(
            admit_certificate(&policy, &ask(Some(i64::MAX), 16))
                .unwrap()
                .requested_lifetime,
            Some(Duration::seconds(i64::from(u32::MAX)))
        );
        assert!(matches!(
            admit_certificate(&policy, &ask(Some(0), 16)),
            Err(ApiError::BadLifetime(0))
        ));
        let mut templated = policy.clone();
        templated.dns_name_templates = vec!["a.example".into(), "b.example".into()];
        assert!(matches!(
            admit_certificate(&templated, &ask(None, 1)),
            Err(ApiError::TooManyDnsNames {
                requested: 2,
                max: 1
            })
        ));
    }
}
