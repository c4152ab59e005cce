//! Issuance policy: request facts in, `Issue | Deny | Fail` out. Pure; no clock, no I/O.
//!
//! One [`SignerPolicy`] per signer name, read from the config file. The identity is always the
//! X.509-SVID `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`; DNS SANs come from
//! templates and, where policy allows the name, from the `podca.dev/dns-names` user annotation.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use serde::Deserialize;
use time::Duration;

use crate::keys::{KeyError, KeyType};
use crate::reason::{DenyReason, FailReason};
use crate::rules::{OutputSpec, RuleError, RuleFacts, RuleOutputs, RuleSet, RuleSpec};

/// The only user-annotation key podca recognises: extra DNS SANs, comma-separated.
pub const DNS_NAMES_ANNOTATION: &str = "podca.dev/dns-names";

/// Why a user annotation is refused before policy: the denial's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AnnotationRefused(pub String);

/// The longest value a declared annotation may have unless it says otherwise.
pub const DEFAULT_ANNOTATION_MAX_LENGTH: usize = 256;

/// A user-annotation key a signer accepts (`[[signers."…".annotations]]`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredAnnotation {
    /// The annotation key, e.g. `example.com/ticket` (a Kubernetes qualified name).
    pub key: String,
    /// A glob the whole value must match (`*` any run, `?` one character); none: any value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// The longest value accepted, in bytes (default 256).
    #[serde(default = "default_annotation_max_length")]
    pub max_length: usize,
}

fn default_annotation_max_length() -> usize {
    DEFAULT_ANNOTATION_MAX_LENGTH
}

/// The policy of one signer name, as written in the config file.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SignerPolicy {
    /// SPIFFE trust domain, e.g. `cluster.local`.
    pub trust_domain: String,
    /// Namespaces that may get certificates (globs, `*` matches anything).
    #[serde(default = "everything")]
    pub namespaces: Vec<String>,
    /// Namespaces that never get certificates, even when `namespaces` matches.
    #[serde(default)]
    pub excluded_namespaces: Vec<String>,
    /// `namespace/service-account` globs that may get certificates.
    #[serde(default = "every_service_account")]
    pub service_accounts: Vec<String>,
    /// Lifetime when the request names none, in seconds.
    #[serde(default = "default_lifetime")]
    pub default_lifetime_seconds: u32,
    /// Longest lifetime this signer issues, in seconds.
    #[serde(default = "max_lifetime")]
    pub max_lifetime_seconds: u32,
    /// Subject key types this signer accepts (kubelet names).
    #[serde(default = "all_key_types")]
    pub key_types: Vec<KeyType>,
    /// DNS SANs every certificate gets; `{ns}`, `{sa}` and `{pod}` are replaced.
    #[serde(default)]
    pub dns_name_templates: Vec<String>,
    /// DNS names a workload may request with the `podca.dev/dns-names` annotation (globs, with
    /// `{ns}` and `{sa}` replaced). Empty: the annotation is refused.
    #[serde(default)]
    pub allowed_dns_names: Vec<String>,
    /// The `unverifiedUserAnnotations` keys (besides `podca.dev/dns-names`) this signer accepts
    /// and passes to its rules as `request.annotations` (issue #42); any other key is denied
    /// before policy. Each with an optional value glob and a maximum length.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<DeclaredAnnotation>,
    /// Foreign trust domains (each a `[[federation]]` entry) whose bundles this signer's
    /// workloads receive; none by default. A foreign bundle reaches no workload of a signer
    /// that does not list it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub federates_with: Vec<String>,
    /// CEL rules, run in order after the allow-lists pass (see [`crate::rules`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleSpec>,
    /// CEL outputs (DNS names, a lifetime cap), evaluated after `rules` (see [`crate::rules`]).
    #[serde(default, skip_serializing_if = "OutputSpec::is_empty")]
    pub outputs: OutputSpec,
    /// Lets `rules` and `outputs` read `pod.labels` and `pod.annotations`: each request whose
    /// rules read them costs one GET of its pod (RBAC `pods get`). Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pod_facts: bool,
    /// Answers the in-tree serving signer's annotations (`kubernetes.io/service-names`,
    /// `add-pod-ips`, `add-pod-fqdn`; [`crate::names::service_ca`]) for PodCertificateRequests:
    /// the pod and the Services it names are looked up (RBAC `pods get`, `services get`) and
    /// the SANs it is entitled to are added. Off (`None`) by default: the keys are then
    /// unknown annotations, denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_ca: Option<crate::names::service_ca::Profile>,
    /// The CA this signer signs with: a `[cas.<name>]` table of the configuration; `None`: the
    /// `[ca]` table (named `default`). Signers with different CAs are separate trust domains:
    /// a certificate of one never verifies under the other's bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// Tenants: named sets of namespaces, each its own trust domain and CA
    /// ([`crate::tenants`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, crate::tenants::TenantSpec>,
    /// With tenants: what a request from a namespace in none gets (default: denied).
    #[serde(default, skip_serializing_if = "crate::tenants::Untenanted::is_deny")]
    pub untenanted: crate::tenants::Untenanted,
    /// The policies of the tenants, built at first use and shared by clones
    /// ([`Self::for_tenant`]).
    #[serde(skip)]
    pub(crate) tenant_policies: TenantPolicies,
    /// `rules` and `outputs`, compiled once (at [`Self::validate`] or at first use) and shared by clones.
    #[serde(skip)]
    compiled: CompiledRules,
    /// DNS names no certificate of this signer may carry: podca's own serving names, set by
    /// `podca serve` at start (never from the file), so that a workload allowed `*.svc` cannot
    /// get a certificate clients would take for podca's gRPC API.
    #[serde(skip)]
    pub reserved_dns_names: Vec<String>,
}

/// The tenants' derived policies, built once (see [`SignerPolicy::for_tenant`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct TenantPolicies(Arc<OnceLock<BTreeMap<String, SignerPolicy>>>);

impl TenantPolicies {
    pub(crate) fn get_or_init(
        &self,
        build: impl FnOnce() -> BTreeMap<String, SignerPolicy>,
    ) -> &BTreeMap<String, SignerPolicy> {
        self.0.get_or_init(build)
    }
}

impl PartialEq for TenantPolicies {
    /// A cache of `tenants`: policies compare by their fields.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The compiled form of a policy's `rules` and `outputs`, with the specs it was compiled from.
#[derive(Debug, Clone, Default)]
struct CompiledRules(Arc<OnceLock<Compiled>>);

/// The specs compiled, and what compiling them gave.
type Compiled = ((Vec<RuleSpec>, OutputSpec), Result<RuleSet, RuleError>);

impl PartialEq for CompiledRules {
    /// A cache of `rules`: policies compare by their fields.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

fn everything() -> Vec<String> {
    vec!["*".into()]
}
fn every_service_account() -> Vec<String> {
    vec!["*/*".into()]
}
fn default_lifetime() -> u32 {
    86_400
}
fn max_lifetime() -> u32 {
    7 * 86_400
}
fn all_key_types() -> Vec<KeyType> {
    KeyType::ALL.to_vec()
}

/// What is known about a request when policy decides.
#[derive(Debug, Clone)]
pub struct RequestFacts<'a> {
    pub namespace: &'a str,
    pub service_account: &'a str,
    pub pod_name: Option<&'a str>,
    /// The subject key's type, or why the key was not accepted.
    pub key_type: Result<KeyType, &'a KeyError>,
    pub user_annotations: &'a BTreeMap<String, String>,
}

/// What to put into the certificate when policy says yes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafPlan {
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub policy_default: Duration,
    pub policy_max: Duration,
}

/// The policy's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Issue(LeafPlan),
    Deny { reason: DenyReason, message: String },
    Fail { reason: FailReason, message: String },
}

/// A policy that cannot work as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    #[error("invalid signer policy: trust_domain {0:?} is not a DNS name")]
    TrustDomainNotADnsName(String),
    #[error(
        "invalid signer policy: max_lifetime_seconds {0} is below the 3600 s Kubernetes minimum"
    )]
    MaxLifetimeTooShort(u32),
    #[error(
        "invalid signer policy: default_lifetime_seconds {default} must be between 3600 and \
         max_lifetime_seconds ({max})"
    )]
    DefaultLifetimeOutOfRange { default: u32, max: u32 },
    #[error("invalid signer policy: key_types is empty")]
    NoKeyTypes,
    #[error("invalid signer policy: service_accounts entry {0:?} must be namespace/name")]
    ServiceAccountNotNamespaced(String),
    #[error("invalid signer policy: {0}")]
    Rule(RuleError),
    #[error(
        "invalid signer policy: outputs.dns_names replaces dns_name_templates and \
         allowed_dns_names; remove them (and write them in the expression)"
    )]
    DnsNamesOutputWithAllowLists,
    #[error(
        "invalid signer policy: {0} reads the pod (pod.labels, pod.annotations), which needs \
         pod_facts = true for this signer: each such request then costs one GET of its pod \
         (RBAC `pods get`: deploy/components/pod-facts, or pod_facts: true in the signer's \
         entry under config.signers in helm)"
    )]
    PodFactsNotEnabled(String),
    #[error("invalid signer policy: {0}")]
    Tenant(crate::tenants::TenantError),
    #[error("invalid signer policy: annotations: {0}")]
    Annotation(String),
}

/// The annotation keys an expression reads: `request.annotations['k']` / `["k"]` and
/// `'k' in request.annotations`. A textual scan: keys computed at run time are not seen.
pub fn annotation_keys_read(expr: &str) -> Vec<String> {
    let mut keys = vec![];
    let quoted = |s: &str| -> Option<String> {
        let quote = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let rest = &s[1..];
        rest.find(quote).map(|end| rest[..end].to_owned())
    };
    for (at, _) in expr.match_indices("request.annotations[") {
        if let Some(key) = quoted(expr[at + "request.annotations[".len()..].trim_start()) {
            keys.push(key);
        }
    }
    for (at, _) in expr.match_indices(" in request.annotations") {
        let before = expr[..at].trim_end();
        if let Some(quote) = before.chars().last().filter(|c| *c == '\'' || *c == '"')
            && let Some(start) = before[..before.len() - 1].rfind(quote)
        {
            keys.push(before[start + 1..before.len() - 1].to_owned());
        }
    }
    keys
}

/// A Kubernetes qualified name with a DNS prefix: `example.com/ticket`.
fn is_qualified_name(key: &str) -> bool {
    let Some((prefix, name)) = key.split_once('/') else {
        return false;
    };
    is_dns_name(prefix)
        && !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

impl SignerPolicy {
    /// A permissive policy for a trust domain: every namespace and key type, 24 h default.
    pub fn permissive(trust_domain: &str) -> Self {
        SignerPolicy {
            trust_domain: trust_domain.into(),
            namespaces: everything(),
            excluded_namespaces: vec![],
            service_accounts: every_service_account(),
            default_lifetime_seconds: default_lifetime(),
            max_lifetime_seconds: max_lifetime(),
            key_types: all_key_types(),
            dns_name_templates: vec![],
            allowed_dns_names: vec![],
            annotations: vec![],
            federates_with: vec![],
            rules: vec![],
            outputs: OutputSpec::default(),
            pod_facts: false,
            service_ca: None,
            ca: None,
            tenants: BTreeMap::new(),
            untenanted: crate::tenants::Untenanted::default(),
            tenant_policies: TenantPolicies::default(),
            compiled: CompiledRules::default(),
            reserved_dns_names: vec![],
        }
    }

    /// Forgets the tenants' derived policies: call after changing a field they copy (podca
    /// serve sets `reserved_dns_names` after the config was validated).
    pub fn reset_tenant_policies(&mut self) {
        self.tenant_policies = TenantPolicies::default();
    }

    /// Forgets the compiled rules (a derived policy whose rules differ from its origin's).
    pub(crate) fn reset_compiled(&mut self) {
        self.compiled = CompiledRules::default();
    }

    /// Checks the policy for mistakes that would make every request fail, and compiles its
    /// rules (and each tenant's: the signer's plus its own).
    pub fn validate(&self) -> Result<(), PolicyError> {
        for tenant in self.tenants() {
            self.for_tenant(&tenant)
                .validate_own()
                .map_err(|e| match e {
                    PolicyError::Rule(rule) => {
                        PolicyError::Tenant(crate::tenants::TenantError::Rules {
                            tenant: tenant.name.to_owned(),
                            error: rule.to_string(),
                        })
                    }
                    other => other,
                })?;
        }
        self.validate_own()
    }

    fn validate_own(&self) -> Result<(), PolicyError> {
        self.validate_fields()?;
        let rules = self.rule_set().map_err(PolicyError::Rule)?;
        match rules.pod_reader() {
            Some(reader) if !self.pod_facts => {
                let what = if reader.starts_with("outputs.") {
                    reader.to_owned()
                } else {
                    format!("rule {reader:?}")
                };
                Err(PolicyError::PodFactsNotEnabled(what))
            }
            _ => Ok(()),
        }
    }

    /// Whether the signer has CEL rules or outputs.
    pub fn has_rules(&self) -> bool {
        !self.rules.is_empty() || !self.outputs.is_empty()
    }

    /// The compiled rules; compiled at the first call and shared by clones.
    fn rule_set(&self) -> Result<RuleSet, RuleError> {
        if !self.has_rules() {
            return Ok(RuleSet::default());
        }
        let compile = || RuleSet::compile_with_outputs(&self.rules, &self.outputs);
        let ((specs, outputs), compiled) = self
            .compiled
            .0
            .get_or_init(|| ((self.rules.clone(), self.outputs.clone()), compile()));
        if *specs == self.rules && *outputs == self.outputs {
            compiled.clone()
        } else {
            // `rules` changed after a clone compiled them: compile this version (uncached).
            compile()
        }
    }

    /// Counts one read of a request's pod for these rules (`podca_policy_pod_reads_total`).
    pub fn count_pod_read(&self, result: crate::rules::PodRead) {
        if let Ok(rules) = self.rule_set() {
            rules.count_pod_read(result);
        }
    }

    /// The compiled rules and outputs (shared with every clone, counters included); `None`
    /// without any, or when they do not compile.
    pub fn compiled_rules(&self) -> Option<RuleSet> {
        if !self.has_rules() {
            return None;
        }
        self.rule_set().ok()
    }

    /// Whether some rule reads `namespaceObject.metadata.labels`: podca then watches namespaces.
    pub fn rules_use_namespace_labels(&self) -> bool {
        self.rule_set()
            .is_ok_and(|rules| rules.uses_namespace_labels())
            || self.tenants().any(|t| {
                self.for_tenant(&t)
                    .rule_set()
                    .is_ok_and(|rules| rules.uses_namespace_labels())
            })
    }

    /// Whether requests need a read of their pod: `pod_facts` is on and some rule or output
    /// reads `pod.labels` or `pod.annotations`.
    pub fn rules_use_pod_facts(&self) -> bool {
        self.pod_facts
            && (self.rule_set().is_ok_and(|rules| rules.uses_pod_facts())
                || self.tenants().any(|t| {
                    self.for_tenant(&t)
                        .rule_set()
                        .is_ok_and(|rules| rules.uses_pod_facts())
                }))
    }

    /// Whether a request of `ns`/`sa` needs a read of its pod: the rules read it
    /// ([`Self::rules_use_pod_facts`]) and the allow-lists admit the request (they deny first, so
    /// a request they refuse costs no read).
    pub fn reads_pod_for(&self, ns: &str, sa: &str) -> bool {
        self.rules_use_pod_facts() && self.admits(ns, sa).is_ok()
    }

    /// Runs the signer's CEL rules over verified facts: the X.509 path ([`crate::sign_request_with`])
    /// and JWT-SVIDs call this after [`Self::admits`]. The error is the `Decision::Deny` to
    /// answer; rules that do not compile deny everything (fail closed).
    pub fn apply_rules(&self, facts: &RuleFacts<'_>) -> Result<(), Decision> {
        self.apply_rules_with_outputs(facts).map(|_| ())
    }

    /// [`Self::apply_rules`], and what the outputs computed (DNS names, a lifetime cap).
    pub fn apply_rules_with_outputs(&self, facts: &RuleFacts<'_>) -> Result<RuleOutputs, Decision> {
        let rules = self.rule_set().map_err(|e| Decision::Deny {
            reason: DenyReason::Rule(crate::rules::intern_reason("PolicyRulesInvalid")),
            message: format!("this signer's policy rules do not compile: {e}"),
        })?;
        if rules.uses_pod_facts() && !self.pod_facts {
            // validate refuses this at load; a policy built in code is refused here.
            return Err(Decision::Deny {
                reason: DenyReason::Rule(crate::rules::intern_reason("PolicyRulesInvalid")),
                message: "this signer's rules read the pod, but pod_facts is off".into(),
            });
        }
        rules.decide(facts).map_err(|denial| Decision::Deny {
            reason: DenyReason::Rule(denial.reason),
            message: denial.message,
        })
    }

    /// Whether the user annotation `key` = `value` is one this signer declares, within its
    /// pattern and length; the error is the denial's message.
    fn declared_annotation(&self, key: &str, value: &str) -> Result<(), AnnotationRefused> {
        let Some(declared) = self.annotations.iter().find(|a| a.key == key) else {
            let mut known = vec![format!("{DNS_NAMES_ANNOTATION:?}")];
            known.extend(self.annotations.iter().map(|a| format!("{:?}", a.key)));
            if self.service_ca.is_some() {
                known.extend(
                    crate::names::service_ca::KEYS
                        .iter()
                        .map(|k| format!("{k:?}")),
                );
            }
            return Err(AnnotationRefused(format!(
                "unrecognised user annotation {key:?}; this signer recognises only {}",
                known.join(", ")
            )));
        };
        if value.len() > declared.max_length {
            return Err(AnnotationRefused(format!(
                "user annotation {key:?} is {} bytes long, over its declared maximum of {}",
                value.len(),
                declared.max_length
            )));
        }
        if let Some(pattern) = &declared.pattern
            && !glob(pattern, value)
        {
            return Err(AnnotationRefused(format!(
                "user annotation {key:?} does not match its declared pattern {pattern:?}"
            )));
        }
        Ok(())
    }

    /// The annotation keys rules read (`request.annotations['k']`, `'k' in request.annotations`)
    /// that this signer does not declare: `policy lint` warns about each (such a rule can only
    /// see the key absent).
    pub fn undeclared_annotation_reads(&self) -> Vec<(String, String)> {
        let mut found = vec![];
        let exprs = self
            .rules
            .iter()
            .flat_map(|r| r.expressions().map(move |e| (r.name.clone(), e.to_owned())))
            .chain(
                self.outputs
                    .expressions()
                    .map(|(name, e)| (format!("outputs.{name}"), e.to_owned())),
            );
        for (rule, expr) in exprs {
            for key in annotation_keys_read(&expr) {
                let declared = key == DNS_NAMES_ANNOTATION
                    || self.annotations.iter().any(|a| a.key == key)
                    || (self.service_ca.is_some()
                        && crate::names::service_ca::KEYS.contains(&key.as_str()));
                if !declared && !found.contains(&(rule.clone(), key.clone())) {
                    found.push((rule.clone(), key));
                }
            }
        }
        found
    }

    fn validate_fields(&self) -> Result<(), PolicyError> {
        let mut seen = std::collections::BTreeSet::new();
        for declared in &self.annotations {
            let key = &declared.key;
            if key == DNS_NAMES_ANNOTATION {
                return Err(PolicyError::Annotation(format!(
                    "{key:?} is podca's own annotation (allowed_dns_names governs it); do not \
                     declare it"
                )));
            }
            if !is_qualified_name(key) {
                return Err(PolicyError::Annotation(format!(
                    "{key:?} is not an annotation key (prefix/name, e.g. example.com/ticket)"
                )));
            }
            if !seen.insert(key) {
                return Err(PolicyError::Annotation(format!(
                    "{key:?} is declared twice"
                )));
            }
            if declared.max_length == 0 || declared.max_length > 64 * 1024 {
                return Err(PolicyError::Annotation(format!(
                    "{key:?}: max_length {} is outside 1..=65536",
                    declared.max_length
                )));
            }
        }
        if let Some(profile) = &self.service_ca {
            if let Some(key) = self
                .annotations
                .iter()
                .find(|a| crate::names::service_ca::KEYS.contains(&a.key.as_str()))
            {
                return Err(PolicyError::Annotation(format!(
                    "{:?} belongs to the kubernetes.io/service-ca vocabulary, which service_ca \
                     governs; do not declare it",
                    key.key
                )));
            }
            if !is_dns_name(&profile.cluster_domain) {
                return Err(PolicyError::Annotation(format!(
                    "service_ca.cluster_domain {:?} is not a DNS name",
                    profile.cluster_domain
                )));
            }
        }
        if !is_dns_name(&self.trust_domain) {
            return Err(PolicyError::TrustDomainNotADnsName(
                self.trust_domain.clone(),
            ));
        }
        if self.max_lifetime_seconds < 3600 {
            return Err(PolicyError::MaxLifetimeTooShort(self.max_lifetime_seconds));
        }
        if self.default_lifetime_seconds < 3600
            || self.default_lifetime_seconds > self.max_lifetime_seconds
        {
            return Err(PolicyError::DefaultLifetimeOutOfRange {
                default: self.default_lifetime_seconds,
                max: self.max_lifetime_seconds,
            });
        }
        if self.key_types.is_empty() {
            return Err(PolicyError::NoKeyTypes);
        }
        if let Some(sa) = self
            .service_accounts
            .iter()
            .find(|sa| sa.split('/').count() != 2)
        {
            return Err(PolicyError::ServiceAccountNotNamespaced(sa.clone()));
        }
        if self.outputs.dns_names.is_some()
            && !(self.dns_name_templates.is_empty() && self.allowed_dns_names.is_empty())
        {
            return Err(PolicyError::DnsNamesOutputWithAllowLists);
        }
        self.validate_tenants().map_err(PolicyError::Tenant)?;
        Ok(())
    }

    /// Whether this service account may get credentials from this signer at all (the
    /// namespace and service-account rules): the X.509 path ([`Self::decide`]) and JWT-SVIDs
    /// both ask here. The error is the `Decision::Deny` to answer.
    pub fn admits(&self, ns: &str, sa: &str) -> Result<(), Decision> {
        if !self.namespaces.iter().any(|p| glob(p, ns))
            || self.excluded_namespaces.iter().any(|p| glob(p, ns))
        {
            return Err(Decision::Deny {
                reason: DenyReason::NamespaceNotAllowed,
                message: format!("namespace {ns:?} may not get certificates from this signer"),
            });
        }
        if !self.service_accounts.iter().any(|p| {
            p.split_once('/')
                .is_some_and(|(pn, ps)| glob(pn, ns) && glob(ps, sa))
        }) {
            return Err(Decision::Deny {
                reason: DenyReason::ServiceAccountNotAllowed,
                message: format!(
                    "service account {ns}/{sa} may not get certificates from this signer"
                ),
            });
        }
        Ok(())
    }

    /// Decides a request.
    pub fn decide(&self, facts: &RequestFacts<'_>) -> Decision {
        let key_type = match facts.key_type {
            Ok(k) => k,
            Err(KeyError::UnsupportedKeyType { .. }) => {
                return Decision::Deny {
                    reason: DenyReason::UnsupportedKeyType,
                    message: format!(
                        "{}; use keyType {} (supported here: {})",
                        facts
                            .key_type
                            .err()
                            .map(|e| e.to_string())
                            .unwrap_or_default(),
                        self.suggested_key_type(),
                        self.key_type_list()
                    ),
                };
            }
            Err(e) => {
                return Decision::Deny {
                    reason: DenyReason::MalformedPublicKey,
                    message: e.to_string(),
                };
            }
        };
        if !self.key_types.contains(&key_type) {
            return Decision::Deny {
                reason: DenyReason::UnsupportedKeyType,
                message: format!(
                    "key type {key_type} is not allowed by this signer's policy; use keyType {} \
                     (allowed: {})",
                    self.suggested_key_type(),
                    self.key_type_list()
                ),
            };
        }
        let (ns, sa) = (facts.namespace, facts.service_account);
        if let Err(deny) = self.admits(ns, sa) {
            return deny;
        }
        // At most MAX_DNS_NAMES + 1 distinct names are ever kept (the annotation is refused
        // beyond), so the linear de-duplication below stays cheap for any input.
        let mut dns_names = Vec::new();
        // With a `dns_names` output, CEL computes the names (after the rules): the annotation
        // is only checked for unknown keys here.
        let dns_from_output = self.outputs.dns_names.is_some();
        for template in &self.dns_name_templates {
            let name = expand(template, facts);
            if !is_dns_name(&name) {
                return Decision::Fail {
                    reason: FailReason::InvalidDnsNameTemplate,
                    message: format!(
                        "DNS name template {template:?} gives {name:?}, which is not a DNS name"
                    ),
                };
            }
            push_unique(&mut dns_names, name);
        }
        for (key, value) in facts.user_annotations {
            if self.service_ca.is_some() && crate::names::service_ca::KEYS.contains(&key.as_str()) {
                // The controller parsed and checked these against the pod and its Services
                // (`crate::names::service_ca`); sign_request_with adds the SANs.
                continue;
            }
            if key != DNS_NAMES_ANNOTATION {
                match self.declared_annotation(key, value) {
                    Ok(()) => continue,
                    Err(AnnotationRefused(message)) => {
                        return Decision::Deny {
                            reason: DenyReason::InvalidUserAnnotations,
                            message,
                        };
                    }
                }
            }
            // The one unverified value rules see unbounded otherwise: what split() and the
            // macros walk over it is bounded by this (issue #42's runtime budget).
            if value.len() > MAX_DNS_NAMES_ANNOTATION_BYTES {
                return Decision::Deny {
                    reason: DenyReason::InvalidUserAnnotations,
                    message: format!(
                        "{DNS_NAMES_ANNOTATION} is {} bytes long; at most \
                         {MAX_DNS_NAMES_ANNOTATION_BYTES} ({MAX_DNS_NAMES} names of 253 bytes and \
                         their commas)",
                        value.len()
                    ),
                };
            }
            if dns_from_output {
                continue;
            }
            for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let name = name.to_ascii_lowercase();
                if !is_dns_name(&name) {
                    return Decision::Deny {
                        reason: DenyReason::InvalidUserAnnotations,
                        message: format!("{DNS_NAMES_ANNOTATION}: {name:?} is not a DNS name"),
                    };
                }
                let allowed = self
                    .allowed_dns_names
                    .iter()
                    .any(|p| glob(&expand(p, facts), &name));
                if !allowed {
                    return Decision::Deny {
                        reason: DenyReason::InvalidUserAnnotations,
                        message: format!(
                            "{DNS_NAMES_ANNOTATION}: DNS name {name:?} is not allowed for \
                             {ns}/{sa} by this signer's policy"
                        ),
                    };
                }
                push_unique(&mut dns_names, name);
                if dns_names.len() > MAX_DNS_NAMES {
                    return Decision::Deny {
                        reason: DenyReason::InvalidUserAnnotations,
                        message: format!(
                            "{DNS_NAMES_ANNOTATION}: more than {MAX_DNS_NAMES} distinct DNS \
                             names; a certificate carries at most {MAX_DNS_NAMES}"
                        ),
                    };
                }
            }
        }
        if let Some(denied) = self.reserved_among(&dns_names) {
            return denied;
        }
        Decision::Issue(LeafPlan {
            spiffe_id: crate::names::spiffe_id(&self.trust_domain, ns, sa),
            dns_names,
            policy_default: Duration::seconds(self.default_lifetime_seconds.into()),
            policy_max: Duration::seconds(self.max_lifetime_seconds.into()),
        })
    }

    fn suggested_key_type(&self) -> KeyType {
        if self.key_types.contains(&KeyType::EcdsaP256) {
            KeyType::EcdsaP256
        } else {
            // A classical type when the policy has one: every kubelet and peer supports those.
            self.key_types
                .iter()
                .find(|k| !k.is_ml_dsa())
                .or(self.key_types.first())
                .copied()
                .unwrap_or(KeyType::EcdsaP256)
        }
    }

    fn key_type_list(&self) -> String {
        self.key_types
            .iter()
            .map(|k| k.kubelet_name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl SignerPolicy {
    /// The denial of a certificate that would carry one of [`Self::reserved_dns_names`].
    pub fn reserved_among(&self, names: &[String]) -> Option<Decision> {
        let name = names.iter().find(|n| {
            self.reserved_dns_names
                .iter()
                .any(|r| r.eq_ignore_ascii_case(n))
        })?;
        Some(Decision::Deny {
            reason: DenyReason::ReservedDnsName,
            message: format!(
                "DNS name {name:?} is one of podca's own serving names; no workload certificate \
                 may carry it"
            ),
        })
    }
}

/// The most distinct DNS names a certificate carries (templates and the annotation together).
pub const MAX_DNS_NAMES: usize = 64;
/// The longest `podca.dev/dns-names` value: [`MAX_DNS_NAMES`] names of the longest DNS name
/// (253 bytes) and a comma after each.
pub const MAX_DNS_NAMES_ANNOTATION_BYTES: usize = MAX_DNS_NAMES * 254;

fn push_unique(names: &mut Vec<String>, name: String) {
    if !names.contains(&name) {
        names.push(name);
    }
}

fn expand(template: &str, facts: &RequestFacts<'_>) -> String {
    template
        .replace("{ns}", facts.namespace)
        .replace("{sa}", facts.service_account)
        .replace("{pod}", facts.pod_name.unwrap_or(""))
}

/// `*` matches any run of characters (including none); everything else matches itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == text;
    };
    let Some(mut remaining) = text.strip_prefix(head) else {
        return false;
    };
    let mut parts: Vec<&str> = rest.split('*').collect();
    let tail = parts.pop().unwrap_or("");
    for part in parts {
        match remaining.find(part) {
            Some(i) => remaining = &remaining[i + part.len()..],
            None => return false,
        }
    }
    remaining.len() >= tail.len() && remaining.ends_with(tail)
}

/// A DNS name kube-apiserver accepts in a leaf (rule 16.3); the rule is [`crate::names::DnsName`].
pub fn is_dns_name(name: &str) -> bool {
    name.parse::<crate::names::DnsName>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(
        ns: &'a str,
        sa: &'a str,
        key: Result<KeyType, &'a KeyError>,
        ann: &'a BTreeMap<String, String>,
    ) -> RequestFacts<'a> {
        RequestFacts {
            namespace: ns,
            service_account: sa,
            pod_name: Some("web-0"),
            key_type: key,
            user_annotations: ann,
        }
    }

    fn declaring(toml_text: &str) -> SignerPolicy {
        let policy: SignerPolicy =
            toml::from_str(&format!("trust_domain = \"cluster.local\"\n{toml_text}"))
                .unwrap_or_else(|e| panic!("{e}"));
        policy.validate().unwrap_or_else(|e| panic!("{e}"));
        policy
    }

    /// Issue #42 item 3: `service_ca` takes the vocabulary's keys (they may not also be
    /// declared), a DNS cluster domain, and nothing else; a rule reading its keys is not warned
    /// about.
    #[test]
    fn the_service_ca_table_is_checked_at_load() {
        let on = declaring("[service_ca]\n");
        assert_eq!(
            on.service_ca.as_ref().map(|p| p.cluster_domain.as_str()),
            Some("cluster.local")
        );
        let custom = declaring("[service_ca]\ncluster_domain = \"corp.example\"\n");
        assert_eq!(
            custom.service_ca.map(|p| p.cluster_domain),
            Some("corp.example".to_owned())
        );
        for (text, needle) in [
            (
                "[service_ca]\ncluster_domain = \"not a domain\"\n",
                "service_ca.cluster_domain \"not a domain\" is not a DNS name",
            ),
            (
                "[[annotations]]\nkey = \"kubernetes.io/add-pod-ips\"\n[service_ca]\n",
                "\"kubernetes.io/add-pod-ips\" belongs to the kubernetes.io/service-ca \
                 vocabulary",
            ),
        ] {
            let policy: SignerPolicy =
                toml::from_str(&format!("trust_domain = \"cluster.local\"\n{text}")).unwrap();
            let e = policy.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
        let unknown = toml::from_str::<SignerPolicy>(
            "trust_domain = \"cluster.local\"\n[service_ca]\nclusterDomain = \"x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            unknown.contains("unknown field `clusterDomain`"),
            "{unknown}"
        );
        let reads = "[[rules]]\nname = \"r\"\nrequire = \"'kubernetes.io/service-names' in \
                     request.annotations\"\nreason = \"R\"\n";
        assert!(
            declaring(&format!("[service_ca]\n{reads}"))
                .undeclared_annotation_reads()
                .is_empty()
        );
        assert_eq!(declaring(reads).undeclared_annotation_reads().len(), 1);
    }

    /// Issue #42: a declared key reaches the rules within its pattern and length; others are
    /// denied before policy, naming what the signer accepts.
    #[test]
    fn declared_annotations_pass_within_their_pattern_and_length() {
        let policy = declaring(
            "[[annotations]]\nkey = \"example.com/ticket\"\npattern = \"T-*\"\nmax_length = 8\n\
             [[annotations]]\nkey = \"example.com/tier\"\n",
        );
        let decide = |pairs: &[(&str, &str)]| {
            let ann: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            policy.decide(&facts("apps", "web", Ok(KeyType::EcdsaP256), &ann))
        };
        assert!(matches!(
            decide(&[("example.com/ticket", "T-42"), ("example.com/tier", "gold")]),
            Decision::Issue(_)
        ));
        for (pairs, needle) in [
            (
                &[("example.com/ticket", "T-123456789")][..],
                "is 11 bytes long, over its declared maximum of 8",
            ),
            (
                &[("example.com/ticket", "X-1")][..],
                "does not match its declared pattern \"T-*\"",
            ),
            (
                &[("example.com/other", "1")][..],
                "unrecognised user annotation \"example.com/other\"; this signer recognises \
                 only \"podca.dev/dns-names\", \"example.com/ticket\", \"example.com/tier\"",
            ),
        ] {
            match decide(pairs) {
                Decision::Deny { reason, message } => {
                    assert_eq!(reason, DenyReason::InvalidUserAnnotations);
                    assert!(message.contains(needle), "{message}");
                }
                other => panic!("{pairs:?}: {other:?}"),
            }
        }
        // The default maximum is 256 bytes.
        let long = "x".repeat(257);
        assert!(matches!(
            decide(&[("example.com/tier", &long)]),
            Decision::Deny { .. }
        ));
    }

    #[test]
    fn a_declaration_that_cannot_work_is_refused_at_load() {
        for (text, needle) in [
            ("key = \"podca.dev/dns-names\"", "podca's own annotation"),
            ("key = \"ticket\"", "not an annotation key"),
            ("key = \"example.com/-x\"", "not an annotation key"),
            (
                "key = \"example.com/t\"\nmax_length = 0",
                "outside 1..=65536",
            ),
        ] {
            let policy: SignerPolicy = toml::from_str(&format!(
                "trust_domain = \"cluster.local\"\n[[annotations]]\n{text}\n"
            ))
            .unwrap();
            let e = policy.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
        let twice: SignerPolicy = toml::from_str(
            "trust_domain = \"cluster.local\"\n[[annotations]]\nkey = \"example.com/t\"\n\
             [[annotations]]\nkey = \"example.com/t\"\n",
        )
        .unwrap();
        assert!(
            twice
                .validate()
                .unwrap_err()
                .to_string()
                .contains("declared twice")
        );
    }

    #[test]
    fn rules_reading_undeclared_annotation_keys_are_found() {
        assert_eq!(
            annotation_keys_read(
                "request.annotations['example.com/a'] == 'x' && \"example.com/b\" in \
                 request.annotations && request.annotations[ \"example.com/c\"].size() > 1"
            ),
            ["example.com/a", "example.com/c", "example.com/b"]
        );
        let policy = declaring(
            "[[annotations]]\nkey = \"example.com/a\"\n\
             [[rules]]\nname = \"r\"\nrequire = \"request.annotations['example.com/a'] == 'x' \
             || 'example.com/b' in request.annotations\"\nreason = \"R\"\n",
        );
        assert_eq!(
            policy.undeclared_annotation_reads(),
            [("r".to_owned(), "example.com/b".to_owned())]
        );
    }

    /// Issue #42's runtime bound: the annotation rules see (and split) is at most 16,256
    /// bytes; a longer one, even of duplicates, is refused before any rule runs.
    #[test]
    fn a_dns_names_annotation_longer_than_the_names_can_be_is_refused() {
        let mut policy = SignerPolicy::permissive("cluster.local");
        policy.allowed_dns_names = vec!["*.apps.svc".into()];
        let decide = |value: String| {
            let ann = BTreeMap::from([(DNS_NAMES_ANNOTATION.to_string(), value)]);
            policy.decide(&facts("apps", "web", Ok(KeyType::EcdsaP256), &ann))
        };
        let name = "web.apps.svc,";
        let at_most = name.repeat(MAX_DNS_NAMES_ANNOTATION_BYTES / name.len());
        assert!(matches!(decide(at_most), Decision::Issue(_)));
        let over = name.repeat(MAX_DNS_NAMES_ANNOTATION_BYTES / name.len() + 1);
        match decide(over) {
            Decision::Deny { reason, message } => {
                assert_eq!(reason, DenyReason::InvalidUserAnnotations);
                assert!(message.contains("at most 16256"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Thousands of names in the annotation (as much as kube-apiserver lets through): refused
    /// at the 65th distinct one, in linear time; duplicates count once.
    #[test]
    fn dns_names_are_capped_and_duplicates_count_once() {
        let mut policy = SignerPolicy::permissive("cluster.local");
        policy.allowed_dns_names = vec!["*.apps.svc".into()];
        let names = |n: usize| {
            (0..n)
                .map(|i| format!("n{i}.apps.svc"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let ann = |value: String| BTreeMap::from([(DNS_NAMES_ANNOTATION.to_string(), value)]);
        let decide = |value: String| {
            let ann = ann(value);
            policy.decide(&facts("apps", "web", Ok(KeyType::EcdsaP256), &ann))
        };
        match decide(names(MAX_DNS_NAMES)) {
            Decision::Issue(plan) => assert_eq!(plan.dns_names.len(), MAX_DNS_NAMES),
            other => panic!("{other:?}"),
        }
        let twice = format!("{},{}", names(MAX_DNS_NAMES), names(MAX_DNS_NAMES));
        assert!(matches!(decide(twice), Decision::Issue(p) if p.dns_names.len() == MAX_DNS_NAMES));
        match decide(names(MAX_DNS_NAMES + 1)) {
            Decision::Deny { reason, message } => {
                assert_eq!(reason, DenyReason::InvalidUserAnnotations);
                assert_eq!(
                    message,
                    "podca.dev/dns-names: more than 64 distinct DNS names; a certificate \
                     carries at most 64"
                );
            }
            other => panic!("{other:?}"),
        }
        // 20,000 names: refused by its length, before any is parsed.
        let started = std::time::Instant::now();
        match decide(names(20_000)) {
            Decision::Deny { reason, message } => {
                assert_eq!(reason, DenyReason::InvalidUserAnnotations);
                assert!(message.contains("bytes long; at most 16256"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// What a table row expects: the decision and a piece of its message, so that two rules
    /// giving the same reason are told apart.
    #[derive(Debug)]
    enum Want {
        Issue,
        Deny(DenyReason, &'static str),
        Fail(FailReason, &'static str),
    }

    fn check(d: &Decision, want: &Want) -> bool {
        match (d, want) {
            (Decision::Issue(_), Want::Issue) => true,
            (Decision::Deny { reason, message }, Want::Deny(r, m)) => {
                reason == r && message.contains(m)
            }
            (Decision::Fail { reason, message }, Want::Fail(r, m)) => {
                reason == r && message.contains(m)
            }
            _ => false,
        }
    }

    /// Each row trips exactly one rule, so a broken rule fails its own row.
    #[test]
    fn table() {
        let none = BTreeMap::new();
        let unknown: BTreeMap<String, String> =
            [("example.com/flavour".to_string(), "x".to_string())].into();
        let dns_ok: BTreeMap<String, String> = [(
            DNS_NAMES_ANNOTATION.to_string(),
            "web.prod.example.com".to_string(),
        )]
        .into();
        // A DNS name, but not an allowed one.
        let dns_not_allowed: BTreeMap<String, String> = [(
            DNS_NAMES_ANNOTATION.to_string(),
            "evil.attacker.com".to_string(),
        )]
        .into();
        // Matches the allowed glob, but is not a DNS name (a label starts with a hyphen).
        let dns_not_a_name: BTreeMap<String, String> = [(
            DNS_NAMES_ANNOTATION.to_string(),
            "-web.prod.example.com".to_string(),
        )]
        .into();
        let rsa2048 = KeyError::UnsupportedKeyType {
            found: "RSA-2048".into(),
        };
        let malformed = KeyError::Malformed {
            what: "CSR",
            detail: "x".into(),
        };
        let mut policy = SignerPolicy::permissive("cluster.local");
        policy.excluded_namespaces = vec!["kube-*".into()];
        policy.service_accounts = vec!["prod/*".into(), "*/default".into()];
        policy.key_types = vec![KeyType::EcdsaP256, KeyType::Ed25519];
        policy.allowed_dns_names = vec!["*.{ns}.example.com".into()];
        assert!(glob("*.prod.example.com", "-web.prod.example.com"));

        let cases: Vec<(RequestFacts<'_>, Want)> = vec![
            (
                facts("prod", "web", Ok(KeyType::EcdsaP256), &none),
                Want::Issue,
            ),
            (
                facts("dev", "default", Ok(KeyType::Ed25519), &none),
                Want::Issue,
            ),
            (
                facts("dev", "web", Ok(KeyType::EcdsaP256), &none),
                Want::Deny(
                    DenyReason::ServiceAccountNotAllowed,
                    "service account dev/web may not",
                ),
            ),
            (
                facts("kube-system", "default", Ok(KeyType::EcdsaP256), &none),
                Want::Deny(
                    DenyReason::NamespaceNotAllowed,
                    "namespace \"kube-system\" may not",
                ),
            ),
            (
                facts("prod", "web", Ok(KeyType::Rsa4096), &none),
                Want::Deny(
                    DenyReason::UnsupportedKeyType,
                    "key type RSA4096 is not allowed by this signer's policy",
                ),
            ),
            (
                facts("prod", "web", Err(&rsa2048), &none),
                Want::Deny(DenyReason::UnsupportedKeyType, "RSA-2048"),
            ),
            (
                facts("prod", "web", Err(&malformed), &none),
                Want::Deny(DenyReason::MalformedPublicKey, "malformed CSR: x"),
            ),
            (
                facts("prod", "web", Ok(KeyType::EcdsaP256), &unknown),
                Want::Deny(
                    DenyReason::InvalidUserAnnotations,
                    "unrecognised user annotation \"example.com/flavour\"",
                ),
            ),
            (
                facts("prod", "web", Ok(KeyType::EcdsaP256), &dns_ok),
                Want::Issue,
            ),
            (
                facts("prod", "web", Ok(KeyType::EcdsaP256), &dns_not_allowed),
                Want::Deny(
                    DenyReason::InvalidUserAnnotations,
                    "DNS name \"evil.attacker.com\" is not allowed for prod/web",
                ),
            ),
            (
                facts("prod", "web", Ok(KeyType::EcdsaP256), &dns_not_a_name),
                Want::Deny(
                    DenyReason::InvalidUserAnnotations,
                    "\"-web.prod.example.com\" is not a DNS name",
                ),
            ),
        ];
        for (f, want) in cases {
            let d = policy.decide(&f);
            assert!(check(&d, &want), "{f:?} → {d:?}, want {want:?}");
        }
    }

    #[test]
    fn a_template_that_is_no_dns_name_fails() {
        let mut policy = SignerPolicy::permissive("cluster.local");
        policy.dns_name_templates = vec!["{pod}.{ns}.svc".into()];
        let none = BTreeMap::new();
        let mut f = facts("prod", "web", Ok(KeyType::EcdsaP256), &none);
        f.pod_name = None;
        let d = policy.decide(&f);
        let want = Want::Fail(
            FailReason::InvalidDnsNameTemplate,
            "DNS name template \"{pod}.{ns}.svc\" gives \".prod.svc\"",
        );
        assert!(check(&d, &want), "{d:?}");
        f.pod_name = Some("web-0");
        assert!(check(&policy.decide(&f), &Want::Issue));
    }

    #[test]
    fn issue_plan_has_spiffe_id_and_dns_names() {
        let mut policy = SignerPolicy::permissive("example.org");
        policy.dns_name_templates = vec!["{sa}.{ns}.svc".into(), "{sa}.{ns}.svc".into()];
        policy.allowed_dns_names = vec!["*.{ns}.example.com".into()];
        let ann: BTreeMap<String, String> = [(
            DNS_NAMES_ANNOTATION.to_string(),
            "a.prod.example.com, B.prod.example.com".to_string(),
        )]
        .into();
        let Decision::Issue(plan) =
            policy.decide(&facts("prod", "web", Ok(KeyType::EcdsaP384), &ann))
        else {
            panic!("expected Issue");
        };
        assert_eq!(plan.spiffe_id, "spiffe://example.org/ns/prod/sa/web");
        assert_eq!(
            plan.dns_names,
            ["web.prod.svc", "a.prod.example.com", "b.prod.example.com"]
        );
    }

    #[test]
    fn unsupported_key_message_suggests_a_type() {
        let policy = SignerPolicy::permissive("cluster.local");
        let e = KeyError::UnsupportedKeyType {
            found: "RSA-2048".into(),
        };
        let none = BTreeMap::new();
        match policy.decide(&facts("a", "b", Err(&e), &none)) {
            Decision::Deny { reason, message } => {
                assert_eq!(reason, DenyReason::UnsupportedKeyType);
                assert!(message.contains("use keyType ECDSAP256"), "{message}");
                assert!(message.contains("RSA-2048"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob("team-*", "team-a"));
        assert!(!glob("team-*", "xteam-a"));
        assert!(glob("*.example.com", "a.example.com"));
        assert!(!glob("*.example.com", "example.com"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
        assert!(glob("exact", "exact"));
    }

    /// Each case breaks one rule of an otherwise valid policy.
    #[test]
    fn validate_names_the_broken_rule() {
        let ok = SignerPolicy::permissive("cluster.local");
        assert_eq!(ok.validate(), Ok(()));
        let broken = |change: fn(&mut SignerPolicy)| {
            let mut p = ok.clone();
            change(&mut p);
            p.validate().unwrap_err()
        };
        let cases: [(PolicyError, &str); 6] = [
            (
                broken(|p| p.trust_domain = "Not A Domain".into()),
                "invalid signer policy: trust_domain \"Not A Domain\" is not a DNS name",
            ),
            (
                broken(|p| p.max_lifetime_seconds = 60),
                "invalid signer policy: max_lifetime_seconds 60 is below the 3600 s Kubernetes \
                 minimum",
            ),
            (
                broken(|p| p.default_lifetime_seconds = 1800),
                "invalid signer policy: default_lifetime_seconds 1800 must be between 3600 and \
                 max_lifetime_seconds (604800)",
            ),
            (
                broken(|p| p.default_lifetime_seconds = 2 * 604_800),
                "invalid signer policy: default_lifetime_seconds 1209600 must be between 3600 \
                 and max_lifetime_seconds (604800)",
            ),
            (
                broken(|p| p.key_types.clear()),
                "invalid signer policy: key_types is empty",
            ),
            (
                broken(|p| p.service_accounts = vec!["prod/*".into(), "nope".into()]),
                "invalid signer policy: service_accounts entry \"nope\" must be namespace/name",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
        }
        assert_eq!(broken(|p| p.key_types.clear()), PolicyError::NoKeyTypes);
        assert_eq!(
            broken(|p| p.default_lifetime_seconds = 1800),
            PolicyError::DefaultLifetimeOutOfRange {
                default: 1800,
                max: 604_800
            }
        );
    }

    #[test]
    fn rules_that_read_the_pod_need_pod_facts() {
        let policy: SignerPolicy = toml::from_str(
            r#"
            trust_domain = "cluster.local"
            [[rules]]
            name = "plain"
            deny = "request.namespace == 'x'"
            reason = "Plain"
            [[rules]]
            name = "canary_only"
            require = "pod.labels['track'] == 'canary'"
            reason = "NotCanary"
            "#,
        )
        .unwrap();
        assert!(!policy.pod_facts, "off by default");
        let err = policy.validate().unwrap_err();
        assert_eq!(
            err,
            PolicyError::PodFactsNotEnabled("rule \"canary_only\"".into())
        );
        assert!(
            err.to_string().contains(
                "rule \"canary_only\" reads the pod (pod.labels, pod.annotations), which needs \
                 pod_facts = true for this signer"
            ),
            "{err}"
        );
        assert!(!policy.rules_use_pod_facts());
        // Built in code without validation: every request is denied, never decided without
        // the pod.
        let annotations = BTreeMap::new();
        let facts = RuleFacts {
            source: crate::RequestSource::Pcr,
            signer_name: "example.com/pods",
            namespace: "a",
            service_account: "b",
            pod_name: Some("p"),
            pod_uid: Some("u"),
            node_name: None,
            key_type: None,
            requested_lifetime_seconds: None,
            annotations: &annotations,
            audiences: &[],
            namespace_labels: None,
            pod: None,
            now: 0,
        };
        match policy.apply_rules(&facts) {
            Err(Decision::Deny { reason, .. }) => {
                assert_eq!(reason.condition_reason(), "PolicyRulesInvalid");
            }
            other => panic!("{other:?}"),
        }

        let enabled = SignerPolicy {
            pod_facts: true,
            ..policy.clone()
        };
        assert_eq!(enabled.validate(), Ok(()));
        assert!(enabled.rules_use_pod_facts());
        let canary = crate::PodMetadata {
            labels: BTreeMap::from([("track".to_string(), "canary".to_string())]),
            annotations: BTreeMap::new(),
        };
        assert!(matches!(
            enabled.apply_rules(&RuleFacts {
                pod: Some(&canary),
                ..facts
            }),
            Ok(())
        ));
        // pod_facts without a rule that reads the pod: valid, and no pod is read.
        let unused = SignerPolicy {
            pod_facts: true,
            ..SignerPolicy::permissive("cluster.local")
        };
        assert_eq!(unused.validate(), Ok(()));
        assert!(!unused.rules_use_pod_facts());
    }

    #[test]
    fn config_parses_from_toml() {
        let p: SignerPolicy = toml::from_str(
            r#"
            trust_domain = "cluster.local"
            key_types = ["ECDSAP256", "ED25519"]
            max_lifetime_seconds = 172800
            "#,
        )
        .unwrap();
        assert_eq!(p.key_types, [KeyType::EcdsaP256, KeyType::Ed25519]);
        assert_eq!(p.namespaces, ["*"]);
        let unknown = toml::from_str::<SignerPolicy>("trust_domain = \"a.b\"\nbogus = 1")
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("unknown field `bogus`"), "{unknown}");
    }
}
