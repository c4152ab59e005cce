//! Leaf issuance with the X.509-SVID profile, and the one entry point callers use:
//! [`sign_request`] (policy → validity → certificate).

use std::collections::BTreeMap;

use time::{Duration, OffsetDateTime};

use crate::backend::BackendError;
use crate::ca::{IssuingCa, leaf_serial};
use crate::constraints::NameViolation;
use crate::keys::{KeyError, KeyType, SubjectKey};
use crate::leaf::LeafFields;
use crate::names::service_ca::{self, Sans};
use crate::policy::{Decision, LeafPlan, RequestFacts, SignerPolicy};
use crate::reason::{DenyReason, FailReason};
use crate::renewal::RenewalChain;
use crate::rules::{PodMetadata, RequestSource, RuleFacts};
use crate::schedule::{Validity, ValidityError, ValidityInput, plan_validity};
use crate::x509;

/// A certificate podca issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCertificate {
    /// Leaf then intermediates, header-less PEM CERTIFICATE blocks (never the root).
    pub chain_pem: String,
    pub leaf_der: Vec<u8>,
    /// Serial number, lowercase hex.
    pub serial: String,
    pub validity: Validity,
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    /// iPAddress SANs (only the `kubernetes.io/service-ca` vocabulary gives any).
    pub ip_addresses: Vec<std::net::IpAddr>,
    /// SHA-256 of the subject SPKI, lowercase hex.
    pub spki_sha256: String,
    /// SHA-256 fingerprint of the issuing CA certificate.
    pub issuer_fingerprint: String,
    /// The subject key's type (what the ledger records; known here, so nobody parses the leaf).
    pub key_type: KeyType,
}

/// Why building a leaf failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    /// The CA key backend could not sign; transient ones should be retried.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The leaf cannot be encoded (a name that is not ASCII, a time no certificate can hold).
    #[error("building the certificate failed: {0}")]
    Build(String),
    /// A name is outside the nameConstraints of the issuing path: no verifier would accept the
    /// certificate, so it is not signed.
    #[error(transparent)]
    NotPermitted(#[from] NameViolation),
}

impl IssuingCa {
    /// Signs a leaf for `subject` with the X.509-SVID profile: empty subject, the SPIFFE ID as
    /// the only URI SAN (critical) plus `dns_names`, CA:false, digitalSignature (and
    /// keyEncipherment for RSA subjects), serverAuth and clientAuth, SKI and AKI.
    pub fn issue(
        &self,
        subject: &SubjectKey,
        spiffe_id: &str,
        dns_names: &[String],
        validity: &Validity,
    ) -> Result<IssuedCertificate, IssueError> {
        self.issue_owned(
            subject,
            spiffe_id.to_owned(),
            dns_names.to_vec(),
            &[],
            validity,
            None,
        )
    }

    /// [`IssuingCa::issue`] for a leaf of the renewal chain `chain` (its extension,
    /// [`crate::renewal`]); the validity is taken as given.
    pub fn issue_in_chain(
        &self,
        subject: &SubjectKey,
        spiffe_id: &str,
        validity: &Validity,
        chain: &RenewalChain,
    ) -> Result<IssuedCertificate, IssueError> {
        self.issue_owned(
            subject,
            spiffe_id.to_owned(),
            vec![],
            &[],
            validity,
            Some(chain),
        )
    }

    /// [`IssuingCa::issue`] with the names handed over, not copied.
    fn issue_owned(
        &self,
        subject: &SubjectKey,
        spiffe_id: String,
        dns_names: Vec<String>,
        ip_addresses: &[std::net::IpAddr],
        validity: &Validity,
        renewal: Option<&RenewalChain>,
    ) -> Result<IssuedCertificate, IssueError> {
        // Every leaf, whatever path asked for it (policy, the operator, the serving
        // certificate), passes the issuing path's nameConstraints or is not signed.
        self.check_names(&spiffe_id, &dns_names)?;
        let serial = leaf_serial(std::time::SystemTime::now());
        // One digest gives the ledger's key fingerprint and, as its first 20 bytes, the subject
        // key identifier (see `leaf::key_identifier`).
        let spki_sha256 = subject.spki_sha256();
        let template = self.leaf_template();
        let leaf_der = template.certificate(
            &LeafFields {
                serial: &serial,
                not_before: validity.not_before,
                not_after: validity.not_after,
                spki: subject.spki_der(),
                subject_key_id: &spki_sha256[..20],
                key_encipherment: subject.key_type().is_rsa(),
                spiffe_id: &spiffe_id,
                dns_names: &dns_names,
                ip_addresses,
                renewal,
            },
            |tbs| self.key().sign(tbs),
        )?;
        // The CA's part of the chain is encoded once per CA; one allocation holds the whole.
        let suffix = self.chain_suffix_pem();
        let mut chain_pem =
            String::with_capacity(x509::certificate_pem_len(&leaf_der) + suffix.len());
        x509::push_certificate_pem(&mut chain_pem, &leaf_der);
        chain_pem.push_str(suffix);
        Ok(IssuedCertificate {
            chain_pem,
            serial: x509::hex_lower(&serial),
            validity: *validity,
            spiffe_id,
            dns_names,
            ip_addresses: ip_addresses.to_vec(),
            spki_sha256: x509::hex_lower(&spki_sha256),
            issuer_fingerprint: self.fingerprint().to_owned(),
            key_type: subject.key_type(),
            leaf_der,
        })
    }
}

/// A request for a certificate, from a PodCertificateRequest or the gRPC API.
#[derive(Debug, Clone)]
pub struct CertificateRequest {
    /// The subject key, or why it was not accepted (an unsupported key is a Denied answer).
    pub key: Result<SubjectKey, KeyError>,
    pub namespace: String,
    pub service_account: String,
    pub pod_name: Option<String>,
    /// `spec.maxExpirationSeconds` (PodCertificateRequests only).
    pub max_expiration: Option<Duration>,
    /// Lifetime the client asked for (gRPC only).
    pub requested_lifetime: Option<Duration>,
    pub user_annotations: BTreeMap<String, String>,
}

/// The answer to a [`CertificateRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Issued(Box<IssuedCertificate>),
    /// Permanent refusal (kubelet never retries).
    Denied {
        reason: DenyReason,
        message: String,
    },
    /// Permanent inability to issue (kubelet never retries).
    Failed {
        reason: FailReason,
        message: String,
    },
    /// Transient trouble (CA backend unavailable): leave the request pending and retry.
    Retry(BackendError),
}

impl Outcome {
    /// The answer to a request policy refused before signing ([`crate::Decision::Deny`] or
    /// `Fail`); an issuing decision has nothing to refuse and is answered as a failure.
    pub fn of_refusal(decision: crate::Decision) -> Outcome {
        match decision {
            crate::Decision::Deny { reason, message } => Outcome::Denied { reason, message },
            crate::Decision::Fail { reason, message } => Outcome::Failed { reason, message },
            crate::Decision::Issue(_) => Outcome::Failed {
                reason: FailReason::CertificateBuildFailed,
                message: "internal: an issuing decision where a refusal was expected".into(),
            },
        }
    }
}

/// What the policy rules see besides the [`CertificateRequest`]: where the request came from
/// and the verified facts only the edge knows.
#[derive(Debug, Clone, Copy)]
pub struct RequestContext<'a> {
    pub source: RequestSource,
    pub signer_name: &'a str,
    pub pod_uid: Option<&'a str>,
    pub node_name: Option<&'a str>,
    /// The namespace's labels, when podca watches namespaces.
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The pod's labels and annotations, when the signer's rules read them (`pod_facts`).
    pub pod: Option<&'a PodMetadata>,
    /// The gRPC paths: where the caller's renewal chain began, written into the leaf; its
    /// `cap` bounds the notAfter ([`crate::renewal`]).
    pub renewal: Option<&'a RenewalChain>,
    /// The SANs the `kubernetes.io/service-ca` vocabulary entitled the pod to (the controller
    /// looked up its pod and Services): added to the leaf after policy allowed the request.
    /// `None` with one of the vocabulary's annotations present is refused, never ignored.
    pub service_sans: Option<&'a Sans>,
}

impl RequestContext<'_> {
    /// No context: `podca issue` and library callers (rules see `request.source == "cli"`).
    pub const CLI: RequestContext<'static> = RequestContext {
        source: RequestSource::Cli,
        signer_name: "",
        pod_uid: None,
        node_name: None,
        namespace_labels: None,
        pod: None,
        renewal: None,
        service_sans: None,
    };
}

/// Decides and, when policy allows, issues: policy → validity → leaf. Rules see
/// [`RequestContext::CLI`]; the edges call [`sign_request_with`].
pub fn sign_request(
    policy: &SignerPolicy,
    ca: &IssuingCa,
    request: &CertificateRequest,
    now: OffsetDateTime,
) -> Outcome {
    sign_request_with(policy, ca, request, &RequestContext::CLI, now)
}

/// Decides and, when policy (allow-lists, then CEL rules) allows, issues. The CEL outputs,
/// when set, give the DNS names and cap the lifetime (the leaf lives min(policy, cap)).
pub fn sign_request_with(
    policy: &SignerPolicy,
    ca: &IssuingCa,
    request: &CertificateRequest,
    context: &RequestContext<'_>,
    now: OffsetDateTime,
) -> Outcome {
    let facts = RequestFacts {
        namespace: &request.namespace,
        service_account: &request.service_account,
        pod_name: request.pod_name.as_deref(),
        key_type: request.key.as_ref().map(SubjectKey::key_type),
        user_annotations: &request.user_annotations,
    };
    // Traces (issue #44): the decision, then the signature, each a child span of the request.
    let deciding = tracing::info_span!("policy").entered();
    let mut plan: LeafPlan = match policy.decide(&facts) {
        Decision::Issue(plan) => plan,
        Decision::Deny { reason, message } => return Outcome::Denied { reason, message },
        Decision::Fail { reason, message } => return Outcome::Failed { reason, message },
    };
    if policy.has_rules() {
        let lifetime = request.requested_lifetime.or(request.max_expiration);
        let key_type = request
            .key
            .as_ref()
            .ok()
            .map(|k| k.key_type().kubelet_name());
        let rule_facts = RuleFacts {
            source: context.source,
            signer_name: context.signer_name,
            namespace: &request.namespace,
            service_account: &request.service_account,
            pod_name: request.pod_name.as_deref(),
            pod_uid: context.pod_uid,
            node_name: context.node_name,
            key_type,
            requested_lifetime_seconds: lifetime.map(|d| d.whole_seconds()),
            annotations: &request.user_annotations,
            audiences: &[],
            namespace_labels: context.namespace_labels,
            pod: context.pod,
            now: now.unix_timestamp(),
        };
        match policy.apply_rules_with_outputs(&rule_facts) {
            Ok(outputs) => {
                // The outputs replace the allow-list DNS names and cap the lifetime.
                if let Some(names) = outputs.dns_names {
                    if let Some(Decision::Deny { reason, message }) = policy.reserved_among(&names)
                    {
                        return Outcome::Denied { reason, message };
                    }
                    plan.dns_names = names;
                }
                if let Some(cap) = outputs.max_lifetime_seconds {
                    let cap = Duration::seconds(cap);
                    plan.policy_max = plan.policy_max.min(cap);
                    plan.policy_default = plan.policy_default.min(cap);
                }
            }
            Err(Decision::Deny { reason, message }) => return Outcome::Denied { reason, message },
            Err(Decision::Fail { reason, message }) => return Outcome::Failed { reason, message },
            Err(Decision::Issue(_)) => {}
        }
    }
    let ip_addresses: &[std::net::IpAddr] = match service_sans(policy, request, context) {
        Ok(None) => &[],
        Ok(Some(sans)) => {
            if let Some(Decision::Deny { reason, message }) = policy.reserved_among(&sans.dns_names)
            {
                return Outcome::Denied { reason, message };
            }
            for name in &sans.dns_names {
                if !plan.dns_names.contains(name) {
                    plan.dns_names.push(name.clone());
                }
            }
            &sans.ip_addresses
        }
        Err(refused) => return refused,
    };
    drop(deciding);
    let Ok(subject) = &request.key else {
        // decide() denies every key error, so this is unreachable in practice; answer anyway.
        return Outcome::Denied {
            reason: DenyReason::MalformedPublicKey,
            message: "the request carries no usable public key".into(),
        };
    };
    let mut validity = match plan_validity(&ValidityInput {
        now,
        requested: request.requested_lifetime,
        policy_default: plan.policy_default,
        policy_max: plan.policy_max,
        max_expiration: request.max_expiration,
        ca_not_before: ca.certificate().not_before(),
        ca_not_after: ca.not_after(),
    }) {
        Ok(v) => v,
        Err(e @ ValidityError::CaExpiresTooSoon { .. }) => {
            return Outcome::Failed {
                reason: FailReason::CaExpiresTooSoon,
                message: e.to_string(),
            };
        }
        Err(e) => {
            return Outcome::Failed {
                reason: FailReason::LifetimeNotSatisfiable,
                message: e.to_string(),
            };
        }
    };
    if let Some(cap) = context.renewal.and_then(|chain| chain.cap) {
        // A renewal never outlives its chain's bound (the authenticator refused a chain
        // already past it, so `cap` is ahead of now).
        if cap < validity.not_after {
            validity.not_after = cap.max(validity.not_before + Duration::seconds(1));
            let half = Duration::seconds(validity.lifetime().whole_seconds() / 2);
            validity.begin_refresh_at = validity.begin_refresh_at.min(validity.not_before + half);
        }
    }
    let signing = tracing::info_span!(
        "signing",
        key_type = subject.key_type().kubelet_name(),
        serial = tracing::field::Empty,
    )
    .entered();
    match ca.issue_owned(
        subject,
        plan.spiffe_id,
        plan.dns_names,
        ip_addresses,
        &validity,
        context.renewal,
    ) {
        Ok(cert) => {
            signing.record("serial", tracing::field::display(&cert.serial));
            Outcome::Issued(Box::new(cert))
        }
        Err(IssueError::Backend(b)) if b.is_transient() => Outcome::Retry(b),
        Err(IssueError::Backend(b)) => Outcome::Failed {
            reason: FailReason::CaKeyUnusable,
            message: b.to_string(),
        },
        Err(IssueError::Build(m)) => Outcome::Failed {
            reason: FailReason::CertificateBuildFailed,
            message: m,
        },
        Err(IssueError::NotPermitted(violation)) => refusal_of(violation),
    }
}
/// The SANs of the `kubernetes.io/service-ca` vocabulary for this request: those the controller
/// looked up, or none. A request that uses the vocabulary's annotations where nobody looked
/// anything up (a signer without `service_ca`, which denied the keys already; the gRPC paths)
/// is refused: its names are never dropped silently.
fn service_sans<'a>(
    policy: &SignerPolicy,
    request: &CertificateRequest,
    context: &RequestContext<'a>,
) -> Result<Option<&'a Sans>, Outcome> {
    if let Some(sans) = context.service_sans {
        return Ok(Some(sans));
    }
    match service_ca::KEYS
        .iter()
        .find(|k| request.user_annotations.contains_key(**k))
    {
        Some(key) if policy.service_ca.is_some() => Err(Outcome::Denied {
            reason: DenyReason::InvalidUserAnnotations,
            message: if context.source == RequestSource::Pcr {
                // The controller always looks them up: only an offline decision gets here.
                format!(
                    "{key}: the kubernetes.io/service-ca SANs need the request's pod and \
                     Services, which were not looked up (an offline decision, e.g. `podca \
                     policy test`)"
                )
            } else {
                format!(
                    "{key}: the kubernetes.io/service-ca annotations are answered for \
                     PodCertificateRequests only, whose pod and Services podca looks up (this \
                     request came from {})",
                    context.source.as_str()
                )
            },
        }),
        _ => Ok(None),
    }
}

/// The answer to names the CA may not certify: a DNS name the request chose is Denied; the
/// signer's own identity outside the CA is a configuration error, Failed.
fn refusal_of(violation: NameViolation) -> Outcome {
    match violation {
        NameViolation::DnsName { .. } => Outcome::Denied {
            reason: DenyReason::NameNotPermittedByCa,
            message: violation.to_string(),
        },
        NameViolation::UriHost { .. } => Outcome::Failed {
            reason: FailReason::IdentityNotPermittedByCa,
            message: violation.to_string(),
        },
    }
}

/// What the CA's operator asks `podca issue` for: any identity of `trust_domain`, any key type
/// (ML-DSA too), any DNS name, up to a year.
#[derive(Debug, Clone)]
pub struct OperatorRequest<'a> {
    pub trust_domain: &'a str,
    pub namespace: &'a str,
    pub service_account: &'a str,
    pub key: SubjectKey,
    pub lifetime: Option<Duration>,
    pub dns_names: &'a [String],
}

/// Why the operator's request was not issued; one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OperatorRefused(String);

/// `podca issue --dns` values, checked in the words of the command line before they travel
/// as the `podca.dev/dns-names` annotation (whose refusals would speak of an annotation the
/// operator never wrote): each a DNS name, at most [`crate::policy::MAX_DNS_NAMES`].
pub fn check_dns_flags(names: &[String]) -> Result<(), OperatorRefused> {
    for name in names {
        if let Err(e) = name.parse::<crate::names::DnsName>() {
            return Err(OperatorRefused(format!(
                "--dns {name:?} is not a DNS name: it {e}"
            )));
        }
    }
    if names.len() > crate::policy::MAX_DNS_NAMES {
        return Err(OperatorRefused(format!(
            "--dns given {} times; a certificate carries at most {} DNS names",
            names.len(),
            crate::policy::MAX_DNS_NAMES
        )));
    }
    Ok(())
}

/// Issues for the CA's operator (`podca issue` without `--server`) under a permissive policy
/// of `trust_domain`, and the ledger record to keep before the certificate is handed out.
pub fn for_operator(
    ca: &IssuingCa,
    request: &OperatorRequest<'_>,
    now: OffsetDateTime,
) -> Result<(IssuedCertificate, crate::LedgerRecord), OperatorRefused> {
    let mut policy = SignerPolicy::permissive(request.trust_domain);
    policy.allowed_dns_names = vec!["*".into()];
    policy.key_types = KeyType::EVERY.to_vec();
    policy.max_lifetime_seconds = policy.max_lifetime_seconds.max(365 * 86400);
    policy
        .validate()
        .map_err(|e| OperatorRefused(format!("--trust-domain {:?}: {e}", request.trust_domain)))?;
    check_dns_flags(request.dns_names)?;
    let mut user_annotations = BTreeMap::new();
    if !request.dns_names.is_empty() {
        user_annotations.insert(
            crate::policy::DNS_NAMES_ANNOTATION.to_string(),
            request.dns_names.join(","),
        );
    }
    let certificate_request = CertificateRequest {
        key: Ok(request.key.clone()),
        namespace: request.namespace.to_owned(),
        service_account: request.service_account.to_owned(),
        pod_name: None,
        max_expiration: None,
        requested_lifetime: request.lifetime,
        user_annotations,
    };
    let cert = match sign_request(&policy, ca, &certificate_request, now) {
        Outcome::Issued(cert) => cert,
        Outcome::Denied { reason, message } => {
            return Err(OperatorRefused(format!("denied ({reason}): {message}")));
        }
        Outcome::Failed { reason, message } => {
            return Err(OperatorRefused(format!("failed ({reason}): {message}")));
        }
        Outcome::Retry(e) => {
            return Err(OperatorRefused(format!("CA unavailable, try again: {e}")));
        }
    };
    let context = crate::RecordContext {
        source: crate::Source::Cli,
        signer: OPERATOR_SIGNER.into(),
        identity: crate::names::spiffe_id(
            request.trust_domain,
            request.namespace,
            request.service_account,
        ),
        requester: Some("cli".into()),
        namespace: request.namespace.to_owned(),
        service_account: request.service_account.to_owned(),
        pod_name: None,
        pod_uid: None,
        node_name: None,
        request_uid: None,
        request_name: None,
        ca_generation: None,
        issuer_fingerprint: None,
        auth: None,
        replica: crate::ledger::replica_identity(),
        time: now,
    };
    let record = crate::LedgerRecord::issued(&context, &cert);
    Ok((*cert, record))
}

/// The `signer` of the operator's records (`podca issue` issues under no configured signer).
pub const OPERATOR_SIGNER: &str = "podca issue";
