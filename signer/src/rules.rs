//! Declarative issuance rules in CEL (the `cel` crate), over facts kube-apiserver or a
//! TokenReview verified.
//!
//! A signer's `rules` run in order after its allow-lists passed; the first rule that denies
//! decides. A rule is `deny` (deny when the expression is true) or `require` (deny when it is
//! false), with a Kubernetes condition reason and an optional message expression.
//!
//! At load ([`RuleSet::compile`]) every expression is parsed, its identifiers and fields are
//! checked against the variables below, its result type is inferred (and, where the inference
//! gives `dyn`, checked on a sample request), and its estimated cost is bounded. Each error
//! names the rule and the line:column.
//!
//! Variables (see docs/policy.md for their sources):
//!
//! | variable | type |
//! | --- | --- |
//! | `request.source` | string: `pcr`, `grpc`, `istio`, `jwt` |
//! | `request.signer_name` | string |
//! | `request.namespace`, `request.service_account` | string |
//! | `request.pod.name`, `request.pod.uid`, `request.node.name` | string (`""` when unknown) |
//! | `request.key_type` | string (kubelet name, `""` for JWTs) |
//! | `request.requested_lifetime_seconds` | int (0 when none was asked for) |
//! | `request.annotations` | map(string, string), unverified |
//! | `request.audiences` | list(string), JWTs only |
//! | `namespaceObject.metadata.labels` | map(string, string) |
//! | `pod.labels`, `pod.annotations` | map(string, string), read per request (`pod_facts`) |
//! | `now` | int, Unix seconds |
//!
//! Evaluation is fail closed: a runtime error, a wrong result type, a collection larger than
//! [`MAX_COLLECTION_ENTRIES`], or a string longer than [`MAX_RULE_STRING_BYTES`] that the rule
//! reads (checked before evaluation: the run-time budget, `rules/budget.rs`) denies with the
//! reason `PolicyRuleFailed:<rule>` and is counted.
//!
//! After the rules, a signer's optional outputs ([`OutputSpec`]) run on the same activation:
//! `dns_names` (a `list(string)`) replaces the DNS names of the certificate, and
//! `max_lifetime_seconds` (an `int`) caps its lifetime (and a JWT-SVID's). A bad output (a
//! name that is not a lowercase RFC 1123 name, more than [`MAX_OUTPUT_DNS_NAMES`] names, a cap
//! below [`MIN_CERTIFICATE_LIFETIME_SECONDS`] for certificates or below 1 s for JWT-SVIDs, a
//! runtime error) denies with `PolicyOutputInvalid:<output>` and is counted
//! ([`RuleSet::counts`]).
//!
//! Besides CEL's standard functions, expressions may call the strings extension of the `cel`
//! crate (cel-go's `ext.Strings()`): `split`, `join`, `lowerAscii`, `upperAscii`, `trim`,
//! `replace`, `substring`, `charAt`, `indexOf`, `lastIndexOf`, `reverse`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::{Context, Env, Program, Value};
use serde::{Deserialize, Serialize};

mod budget;
mod facts;
pub mod lint;
mod memo;

pub use budget::MAX_RULE_STRING_BYTES;
use budget::StringReads;
use facts::FactResolver;
use memo::{FactHashes, Memo};
pub use memo::{MAX_ENTRIES as MAX_REMEMBERED_DECISIONS, set_enabled as remember_decisions};

/// Longest expression source, in bytes.
pub const MAX_EXPRESSION_BYTES: usize = 4096;
/// Deepest nesting the parser accepts.
pub const MAX_NESTING: u16 = 32;
/// Highest estimated cost of one expression (see [`estimate_cost`]).
pub const MAX_COST: u64 = 25_000;
/// The largest list or map a comprehension is assumed to walk, and the largest one a rule is
/// evaluated over: a request with a bigger `annotations`, `audiences`,
/// `namespaceObject.metadata.labels`, `pod.labels` or `pod.annotations` is denied by every
/// signer that has rules (fail closed).
pub const MAX_COLLECTION_ENTRIES: usize = 256;
/// Most rules per signer.
pub const MAX_RULES: usize = 64;
/// Most DNS names the `dns_names` output may give (after duplicates are dropped).
pub const MAX_OUTPUT_DNS_NAMES: usize = 16;
/// The lowest lifetime cap for a certificate: Kubernetes' minimum lifetime of a Pod certificate.
pub const MIN_CERTIFICATE_LIFETIME_SECONDS: i64 = 3600;

/// One rule as written in the config file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Names the rule in errors, messages and metrics: `[A-Za-z][A-Za-z0-9_]*`, at most 63.
    pub name: String,
    /// Deny when this expression is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<String>,
    /// Deny when this expression is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require: Option<String>,
    /// The condition reason of the denial (a valid Kubernetes condition reason).
    pub reason: String,
    /// A CEL expression giving the denial's message (a string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A signer's CEL outputs as written in the config file (`[signers."X".outputs]`): each
/// optional, evaluated after the rules pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// A `list(string)`: the certificate's DNS names, replacing `dns_name_templates` and the
    /// `podca.dev/dns-names` annotation's allow-list (which must then be empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_names: Option<String>,
    /// An `int`: a cap in seconds on the lifetime; the leaf lives min(policy, cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lifetime_seconds: Option<String>,
}

impl OutputSpec {
    /// Whether no output is set.
    pub fn is_empty(&self) -> bool {
        self.dns_names.is_none() && self.max_lifetime_seconds.is_none()
    }

    /// Each set output's name and expression.
    pub fn expressions(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("dns_names", self.dns_names.as_deref()),
            ("max_lifetime_seconds", self.max_lifetime_seconds.as_deref()),
        ]
        .into_iter()
        .filter_map(|(name, e)| e.map(|e| (name, e)))
    }
}

impl RuleSpec {
    /// The rule's expressions: its condition and its message.
    pub fn expressions(&self) -> impl Iterator<Item = &str> {
        [&self.deny, &self.require, &self.message]
            .into_iter()
            .filter_map(|e| e.as_deref())
    }
}

/// What the outputs computed for one request: `None` where the signer has no such output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleOutputs {
    /// Valid, distinct DNS names, in the order the expression gave them.
    pub dns_names: Option<Vec<String>>,
    /// A positive cap in seconds (at least [`MIN_CERTIFICATE_LIFETIME_SECONDS`] except for JWTs).
    pub max_lifetime_seconds: Option<i64>,
}

/// Where a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestSource {
    /// A PodCertificateRequest.
    Pcr,
    /// podca.v1 (IssueCertificate, IssueForPod, the Workload API, `podca dev` bundles).
    Grpc,
    /// The Istio CA API.
    Istio,
    /// A JWT-SVID.
    Jwt,
    /// `podca issue`, and library callers that give no context ([`crate::sign_request`]).
    Cli,
}

impl RequestSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestSource::Pcr => "pcr",
            RequestSource::Grpc => "grpc",
            RequestSource::Istio => "istio",
            RequestSource::Jwt => "jwt",
            RequestSource::Cli => "cli",
        }
    }
}

/// The facts rules see. Only what kube-apiserver or a TokenReview verified, except
/// `annotations` (the PCR's `unverifiedUserAnnotations`, or the gRPC request's).
#[derive(Debug, Clone, Copy)]
pub struct RuleFacts<'a> {
    pub source: RequestSource,
    pub signer_name: &'a str,
    pub namespace: &'a str,
    pub service_account: &'a str,
    pub pod_name: Option<&'a str>,
    pub pod_uid: Option<&'a str>,
    pub node_name: Option<&'a str>,
    /// Kubelet name of the subject key type; `None` for JWTs.
    pub key_type: Option<&'a str>,
    pub requested_lifetime_seconds: Option<i64>,
    pub annotations: &'a BTreeMap<String, String>,
    pub audiences: &'a [String],
    /// The namespace's labels; `None` when podca does not watch namespaces (no rule uses them)
    /// or does not know the namespace: rules see an empty map.
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The pod's labels and annotations, read from the API for this request when the signer
    /// has `pod_facts` on and the request names a pod; `None`: rules see empty maps.
    pub pod: Option<&'a PodMetadata>,
    /// Unix seconds.
    pub now: i64,
}

/// What rules see of the pod behind a request (`pod.labels`, `pod.annotations`): read with one
/// GET of the pod, whose UID must be the request's, when the signer has `pod_facts = true`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMetadata {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// How one read of a pod for the rules ended (`podca_policy_pod_reads_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRead {
    /// The pod exists with the request's UID: its labels and annotations are the facts.
    Found,
    /// No such pod: the request is denied (`PolicyPodNotFound`).
    NotFound,
    /// A pod of that name has another UID (it was replaced): denied (`PolicyPodNotFound`).
    UidMismatch,
    /// The API did not answer (timeout, error, RBAC): nothing is decided, the request waits
    /// (PCRs) or is refused UNAVAILABLE (gRPC).
    Error,
}

impl PodRead {
    pub const ALL: [PodRead; 4] = [
        PodRead::Found,
        PodRead::NotFound,
        PodRead::UidMismatch,
        PodRead::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PodRead::Found => "found",
            PodRead::NotFound => "not_found",
            PodRead::UidMismatch => "uid_mismatch",
            PodRead::Error => "error",
        }
    }
}

/// A rule set that cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {message}", if is_output_field(field) { String::from("outputs.") + field } else { format!("rule {rule:?}") }, position.map(|(l, c)| if is_output_field(field) { format!(" at {l}:{c}") } else { format!(" at {field} {l}:{c}") }).unwrap_or_else(|| if field.is_empty() || is_output_field(field) { String::new() } else { format!(" ({field})") }))]
pub struct RuleError {
    /// The rule's name (or its index when it has none); `outputs` for an output.
    pub rule: String,
    /// Which expression: `deny`, `require`, `message`, an output (`dns_names`,
    /// `max_lifetime_seconds`), or empty.
    pub field: &'static str,
    /// 1-based line and column in the expression.
    pub position: Option<(u32, u32)>,
    pub message: String,
}

fn is_output_field(field: &str) -> bool {
    matches!(field, "dns_names" | "max_lifetime_seconds")
}

/// A rule's denial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleDenial {
    pub rule: String,
    /// The condition reason: the rule's, or `PolicyRuleFailed:<rule>` after an error.
    pub reason: &'static str,
    pub message: String,
    /// Whether the rule failed to evaluate (fail closed) rather than denied.
    pub error: bool,
}

/// What a rule counted, for metrics.
#[derive(Debug, Default)]
pub struct RuleCounters {
    pub denials: AtomicU64,
    pub errors: AtomicU64,
}

/// What a rule set counted, for the metrics the runtime exports (`authority::metrics`): each
/// rule's denials and errors, each output's failures, and the reads of requests' pods. The
/// counters live in the [`RuleSet`] (shared by every clone of its policy), not in the process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleCounts {
    /// Rule name, denials, errors.
    pub rules: Vec<(String, u64, u64)>,
    /// Output name (`dns_names`, `max_lifetime_seconds`), failed evaluations.
    pub outputs: Vec<(&'static str, u64)>,
    /// Pod read result ([`PodRead::as_str`]), reads.
    pub pod_reads: Vec<(&'static str, u64)>,
}

/// Interns a condition reason: reasons come from the config and live as long as the process
/// (one copy per distinct text, however often the config is loaded).
pub fn intern_reason(reason: &str) -> &'static str {
    static REASONS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut set = REASONS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(r) = set.get(reason) {
        return r;
    }
    let leaked: &'static str = Box::leak(reason.to_owned().into_boxed_str());
    set.insert(leaked);
    leaked
}

/// Whether `s` is a valid Kubernetes condition reason
/// (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most 1024 characters).
pub fn is_condition_reason(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 1024
        && b[0].is_ascii_alphabetic()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_,:".contains(c))
        && (b[b.len() - 1].is_ascii_alphanumeric() || b[b.len() - 1] == b'_')
}

fn is_rule_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[derive(Debug)]
struct CompiledRule {
    name: String,
    /// True: deny when the condition is true; false: deny when it is false.
    deny_when: bool,
    condition: Program,
    reason: &'static str,
    error_reason: &'static str,
    message: Option<Program>,
    /// The unverified strings the condition and message read (bounded before evaluation).
    reads: StringReads,
    counters: Arc<RuleCounters>,
    /// The condition's results, by the facts each evaluation read.
    memo: Memo,
}

#[derive(Debug)]
struct CompiledOutput {
    /// `dns_names` or `max_lifetime_seconds`.
    name: &'static str,
    program: Program,
    /// The unverified strings the expression reads (bounded before evaluation).
    reads: StringReads,
    /// `PolicyOutputInvalid:<name>`.
    reason: &'static str,
    errors: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct CompiledOutputs {
    dns_names: Option<CompiledOutput>,
    max_lifetime_seconds: Option<CompiledOutput>,
}

/// A signer's compiled rules and outputs, cheap to share.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    rules: Arc<Vec<CompiledRule>>,
    outputs: Arc<CompiledOutputs>,
    uses_namespace_labels: bool,
    /// The first rule (or `outputs.<name>`) that reads `pod`, if any.
    pod_reader: Option<String>,
    /// Reads of requests' pods, by [`PodRead`] (its discriminant).
    pod_reads: Arc<[AtomicU64; PodRead::ALL.len()]>,
}

fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        // No optional syntax (`a.?b`): rules see plain values.
        let base = || Env::stdlib().with_optional_support(false);
        let mut env = base();
        // `split`, `join`, `lowerAscii`, … (cel-go's ext.Strings()). It declares only new
        // names, so it cannot fail on the standard library; fall back to that if it did.
        if env.add_extension(cel::extensions::strings).is_err() {
            env = base();
        }
        Arc::new(env)
    })
}

impl RuleSet {
    /// Compiles `specs`.
    pub fn compile(specs: &[RuleSpec]) -> Result<RuleSet, RuleError> {
        Self::compile_with_outputs(specs, &OutputSpec::default())
    }

    /// Compiles `specs` and `outputs`.
    pub fn compile_with_outputs(
        specs: &[RuleSpec],
        outputs: &OutputSpec,
    ) -> Result<RuleSet, RuleError> {
        if specs.len() > MAX_RULES {
            return Err(RuleError {
                rule: String::new(),
                field: "",
                position: None,
                message: format!("{} rules; at most {MAX_RULES} per signer", specs.len()),
            });
        }
        let mut rules = Vec::with_capacity(specs.len());
        let mut names = BTreeSet::new();
        let mut uses_namespace_labels = false;
        let mut pod_reader: Option<String> = None;
        for (i, spec) in specs.iter().enumerate() {
            let err = |field: &'static str, position, message: String| RuleError {
                rule: if spec.name.is_empty() {
                    format!("#{}", i + 1)
                } else {
                    spec.name.clone()
                },
                field,
                position,
                message,
            };
            if !is_rule_name(&spec.name) {
                return Err(err(
                    "",
                    None,
                    "name must match [A-Za-z][A-Za-z0-9_]* (at most 63 characters)".into(),
                ));
            }
            if !names.insert(spec.name.as_str()) {
                return Err(err("", None, "two rules have this name".into()));
            }
            if !is_condition_reason(&spec.reason) {
                return Err(err(
                    "",
                    None,
                    format!(
                        "reason {:?} is not a Kubernetes condition reason \
                         (^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$)",
                        spec.reason
                    ),
                ));
            }
            let (field, source, deny_when) = match (&spec.deny, &spec.require) {
                (Some(d), None) => ("deny", d, true),
                (None, Some(r)) => ("require", r, false),
                _ => {
                    return Err(err("", None, "give exactly one of deny or require".into()));
                }
            };
            let checked = check(source, Type::Bool).map_err(|(p, m)| err(field, p, m))?;
            uses_namespace_labels |= checked.uses_namespace_labels;
            if checked.uses_pod {
                pod_reader.get_or_insert_with(|| spec.name.clone());
            }
            let mut reads = checked.reads;
            let message = match &spec.message {
                None => None,
                Some(m) => {
                    let checked = check(m, Type::String).map_err(|(p, m)| err("message", p, m))?;
                    uses_namespace_labels |= checked.uses_namespace_labels;
                    if checked.uses_pod {
                        pod_reader.get_or_insert_with(|| spec.name.clone());
                    }
                    reads.extend(checked.reads);
                    Some(checked.program)
                }
            };
            rules.push(CompiledRule {
                name: spec.name.clone(),
                deny_when,
                condition: checked.program,
                reason: intern_reason(&spec.reason),
                error_reason: intern_reason(&format!("PolicyRuleFailed:{}", spec.name)),
                message,
                reads,
                counters: Arc::default(),
                memo: Memo::default(),
            });
        }
        let mut compile_output = |name: &'static str, source: &Option<String>, want: Type| {
            let Some(source) = source else {
                return Ok(None);
            };
            let checked = check(source, want).map_err(|(position, message)| RuleError {
                rule: "outputs".into(),
                field: name,
                position,
                message,
            })?;
            uses_namespace_labels |= checked.uses_namespace_labels;
            if checked.uses_pod {
                pod_reader.get_or_insert_with(|| format!("outputs.{name}"));
            }
            Ok(Some(CompiledOutput {
                name,
                program: checked.program,
                reads: checked.reads,
                reason: intern_reason(&format!("PolicyOutputInvalid:{name}")),
                errors: Arc::default(),
            }))
        };
        let compiled_outputs = CompiledOutputs {
            dns_names: compile_output(
                "dns_names",
                &outputs.dns_names,
                Type::List(Box::new(Type::String)),
            )?,
            max_lifetime_seconds: compile_output(
                "max_lifetime_seconds",
                &outputs.max_lifetime_seconds,
                Type::Int,
            )?,
        };
        Ok(RuleSet {
            rules: Arc::new(rules),
            outputs: Arc::new(compiled_outputs),
            uses_namespace_labels,
            pod_reader,
            pod_reads: Arc::default(),
        })
    }

    /// Counts one read of a request's pod for these rules (`podca_policy_pod_reads_total`).
    pub fn count_pod_read(&self, result: PodRead) {
        self.pod_reads[result as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// What these rules counted so far.
    pub fn counts(&self) -> RuleCounts {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RuleCounts {
            rules: self
                .rules
                .iter()
                .map(|r| {
                    (
                        r.name.clone(),
                        load(&r.counters.denials),
                        load(&r.counters.errors),
                    )
                })
                .collect(),
            outputs: [&self.outputs.dns_names, &self.outputs.max_lifetime_seconds]
                .into_iter()
                .flatten()
                .map(|o| (o.name, load(&o.errors)))
                .collect(),
            pod_reads: PodRead::ALL
                .iter()
                .map(|&r| (r.as_str(), load(&self.pod_reads[r as usize])))
                .filter(|&(_, n)| n > 0)
                .collect(),
        }
    }

    /// Whether there are neither rules nor outputs.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && !self.has_outputs()
    }

    /// Whether some output is set.
    pub fn has_outputs(&self) -> bool {
        self.outputs.dns_names.is_some() || self.outputs.max_lifetime_seconds.is_some()
    }

    /// Whether some rule reads `namespaceObject.metadata.labels` (podca then watches namespaces).
    pub fn uses_namespace_labels(&self) -> bool {
        self.uses_namespace_labels
    }

    /// Whether some rule or output reads `pod.labels` or `pod.annotations` (each request then
    /// needs a read of its pod).
    pub fn uses_pod_facts(&self) -> bool {
        self.pod_reader.is_some()
    }

    /// The first rule (its name) or output (`outputs.<name>`) that reads `pod`.
    pub fn pod_reader(&self) -> Option<&str> {
        self.pod_reader.as_deref()
    }

    /// Runs the rules in order; the first denial decides. Outputs run too (a bad one denies);
    /// [`Self::decide`] also returns what they computed.
    pub fn evaluate(&self, facts: &RuleFacts<'_>) -> Result<(), RuleDenial> {
        self.decide(facts).map(|_| ())
    }

    /// Runs the rules in order (the first denial decides), then the outputs, over one
    /// request's facts. A rule's condition is evaluated only when no earlier evaluation that
    /// read the same facts is remembered (see `rules/memo.rs`).
    pub fn decide(&self, facts: &RuleFacts<'_>) -> Result<RuleOutputs, RuleDenial> {
        if self.is_empty() {
            return Ok(RuleOutputs::default());
        }
        if let Err(why) = check_collections(facts) {
            // Fail closed: the first rule (or output) answers for the set.
            let message = format!("policy rules cannot be evaluated: {why}");
            if let Some(rule) = self.rules.first() {
                rule.counters.errors.fetch_add(1, Ordering::Relaxed);
                return Err(RuleDenial {
                    rule: rule.name.clone(),
                    reason: rule.error_reason,
                    message,
                    error: true,
                });
            }
            let output = self
                .outputs
                .dns_names
                .as_ref()
                .or(self.outputs.max_lifetime_seconds.as_ref());
            return Err(match output {
                Some(o) => o.deny(message),
                None => RuleDenial {
                    rule: String::new(),
                    reason: "PolicyRuleFailed",
                    message,
                    error: true,
                },
            });
        }
        self.check_strings(facts)?;
        let resolver = FactResolver::new(facts);
        let context = std::cell::OnceCell::new();
        let context = || {
            context.get_or_init(|| {
                let mut c = Context::with_env(Arc::clone(env()));
                c.set_variable_resolver(&resolver);
                c
            })
        };
        self.run_rules(facts, &resolver, &context)?;
        if self.has_outputs() {
            self.run_outputs(context(), facts.source)
        } else {
            Ok(RuleOutputs::default())
        }
    }

    /// Denies, before anything is evaluated, a request with a string longer than
    /// [`MAX_RULE_STRING_BYTES`] where a rule, message or output reads it: the first such rule
    /// (or output) answers, as when it fails (`rules/budget.rs`).
    fn check_strings(&self, facts: &RuleFacts<'_>) -> Result<(), RuleDenial> {
        for rule in self.rules.iter() {
            if let Some(why) = rule.reads.oversized(facts) {
                rule.counters.errors.fetch_add(1, Ordering::Relaxed);
                return Err(RuleDenial {
                    rule: rule.name.clone(),
                    reason: rule.error_reason,
                    message: format!(
                        "rule {:?} was not evaluated: {why} (denied: rules fail closed)",
                        rule.name
                    ),
                    error: true,
                });
            }
        }
        let outputs = [&self.outputs.dns_names, &self.outputs.max_lifetime_seconds];
        for output in outputs.into_iter().flatten() {
            if let Some(why) = output.reads.oversized(facts) {
                return Err(output.deny(format!(
                    "output {} was not evaluated: {why} (denied: outputs fail closed)",
                    output.name
                )));
            }
        }
        Ok(())
    }

    fn run_rules<'c>(
        &self,
        facts: &RuleFacts<'_>,
        resolver: &FactResolver<'_>,
        context: &dyn Fn() -> &'c Context<'c, 'c>,
    ) -> Result<(), RuleDenial> {
        let remember = memo::enabled();
        let mut hashes = FactHashes::new(facts);
        for rule in self.rules.iter() {
            let remembered = if remember {
                rule.memo.get(&mut hashes)
            } else {
                None
            };
            let value = match remembered {
                Some(b) => b,
                None => {
                    resolver.take_reads();
                    let b = rule.condition_value(context())?;
                    if remember {
                        rule.memo.put(&mut hashes, resolver.take_reads(), b);
                    }
                    b
                }
            };
            if value != rule.deny_when {
                continue;
            }
            rule.counters.denials.fetch_add(1, Ordering::Relaxed);
            let message = match &rule.message {
                None => format!("denied by policy rule {:?}", rule.name),
                Some(program) => match program.execute(context()) {
                    Ok(Value::String(s)) => s.to_string(),
                    Ok(other) => {
                        rule.counters.errors.fetch_add(1, Ordering::Relaxed);
                        format!(
                            "denied by policy rule {:?} (its message gave {}, not a string)",
                            rule.name,
                            value_type(&other)
                        )
                    }
                    Err(e) => {
                        rule.counters.errors.fetch_add(1, Ordering::Relaxed);
                        format!(
                            "denied by policy rule {:?} (its message failed: {e})",
                            rule.name
                        )
                    }
                },
            };
            return Err(RuleDenial {
                rule: rule.name.clone(),
                reason: rule.reason,
                message,
                error: false,
            });
        }
        Ok(())
    }

    fn run_outputs(
        &self,
        context: &Context<'_, '_>,
        source: RequestSource,
    ) -> Result<RuleOutputs, RuleDenial> {
        let mut outputs = RuleOutputs::default();
        if let Some(o) = &self.outputs.dns_names {
            outputs.dns_names = Some(o.dns_names(context)?);
        }
        if let Some(o) = &self.outputs.max_lifetime_seconds {
            outputs.max_lifetime_seconds = Some(o.max_lifetime_seconds(context, source)?);
        }
        Ok(outputs)
    }
}

impl CompiledRule {
    /// Evaluates the condition; a runtime error or a result that is not a bool denies (fail
    /// closed) and is counted.
    fn condition_value(&self, context: &Context<'_, '_>) -> Result<bool, RuleDenial> {
        let message = match self.condition.execute(context) {
            Ok(Value::Bool(b)) => return Ok(b),
            Ok(other) => format!(
                "rule {:?} gave {}, not a bool (denied: rules fail closed)",
                self.name,
                value_type(&other)
            ),
            Err(e) => format!(
                "rule {:?} failed: {e} (denied: rules fail closed)",
                self.name
            ),
        };
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        Err(RuleDenial {
            rule: self.name.clone(),
            reason: self.error_reason,
            message,
            error: true,
        })
    }
}

impl CompiledOutput {
    /// A denial by this output, counted.
    fn deny(&self, message: String) -> RuleDenial {
        self.errors.fetch_add(1, Ordering::Relaxed);
        RuleDenial {
            rule: format!("outputs.{}", self.name),
            reason: self.reason,
            message,
            error: true,
        }
    }

    fn execute(&self, context: &Context<'_, '_>) -> Result<Value, RuleDenial> {
        self.program.execute(context).map_err(|e| {
            self.deny(format!(
                "output {} failed: {e} (denied: outputs fail closed)",
                self.name
            ))
        })
    }

    fn dns_names(&self, context: &Context<'_, '_>) -> Result<Vec<String>, RuleDenial> {
        let list = match self.execute(context)? {
            Value::List(list) => list,
            other => {
                return Err(self.deny(format!(
                    "output dns_names gave {}, not a list of strings",
                    value_type(&other)
                )));
            }
        };
        let mut names: Vec<String> = Vec::new();
        for value in list.iter() {
            let Value::String(name) = value else {
                return Err(self.deny(format!(
                    "output dns_names gave a list holding {}, not only strings",
                    value_type(value)
                )));
            };
            if !crate::policy::is_dns_name(name) {
                let shown: String = name.chars().take(64).collect();
                return Err(self.deny(format!(
                    "output dns_names gave {shown:?}, which is not a DNS name (lowercase RFC 1123 \
                     labels of [a-z0-9-], at most 253 characters, no wildcard)"
                )));
            }
            if !names.iter().any(|n| n.as_str() == name.as_str()) {
                if names.len() == MAX_OUTPUT_DNS_NAMES {
                    return Err(self.deny(format!(
                        "output dns_names gave more than {MAX_OUTPUT_DNS_NAMES} distinct names"
                    )));
                }
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    fn max_lifetime_seconds(
        &self,
        context: &Context<'_, '_>,
        source: RequestSource,
    ) -> Result<i64, RuleDenial> {
        let cap = match self.execute(context)? {
            Value::Int(cap) => cap,
            other => {
                return Err(self.deny(format!(
                    "output max_lifetime_seconds gave {}, not an int",
                    value_type(&other)
                )));
            }
        };
        // JWT-SVIDs live minutes; certificates at least Kubernetes' hour.
        let (min, what) = match source {
            RequestSource::Jwt => (1, "a JWT-SVID's"),
            _ => (MIN_CERTIFICATE_LIFETIME_SECONDS, "a certificate's"),
        };
        if cap < min {
            return Err(self.deny(format!(
                "output max_lifetime_seconds gave {cap}; {what} lifetime cap must be at least \
                 {min} seconds"
            )));
        }
        Ok(cap)
    }
}

fn value_type(v: &Value) -> String {
    v.type_of().to_string()
}

/// A collection too large for rules to be evaluated over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} has {entries} entries; rules accept at most {MAX_COLLECTION_ENTRIES}")]
struct TooManyEntries {
    what: &'static str,
    entries: usize,
}

/// Rules are not evaluated over collections larger than [`MAX_COLLECTION_ENTRIES`].
fn check_collections(f: &RuleFacts<'_>) -> Result<(), TooManyEntries> {
    for (what, n) in [
        ("request.annotations", f.annotations.len()),
        ("request.audiences", f.audiences.len()),
        ("namespaceObject.metadata.labels", f.labels().len()),
        ("pod.labels", f.pod_labels().len()),
        ("pod.annotations", f.pod_annotations().len()),
    ] {
        if n > MAX_COLLECTION_ENTRIES {
            return Err(TooManyEntries { what, entries: n });
        }
    }
    Ok(())
}

// ---- namespace labels -----------------------------------------------------------------------

/// The message of the `PolicyPodNotFound` denial for a request that names no pod (a token bound
/// to none, an impersonated identity, `podca dev`) under rules that read `pod`: they fail closed
/// rather than judge empty maps. One text for the servers and `podca policy test`.
pub const NO_POD: &str = "the signer's rules read the pod (pod_facts) and this request names \
                          none (a token bound to no pod, an impersonated identity or podca dev): \
                          the rules fail closed";

/// Most namespaces [`NamespaceLabels`] keeps; past it, new namespaces are not recorded (their
/// requests wait, as before the first sync) and a warning is counted by the watcher.
pub const MAX_NAMESPACES: usize = 100_000;

/// The labels of every namespace, filled by the controller's metadata-only namespace watch and
/// read by every edge: only the labels are kept, at most [`MAX_COLLECTION_ENTRIES`] +1 per
/// namespace (a namespace with more is kept oversized, so that its rules fail closed) and at
/// most [`MAX_NAMESPACES`] namespaces.
#[derive(Debug, Clone, Default)]
pub struct NamespaceLabels(Arc<std::sync::RwLock<LabelState>>);

#[derive(Debug, Default)]
struct LabelState {
    synced: bool,
    namespaces: std::collections::HashMap<String, Arc<BTreeMap<String, String>>>,
}

/// Namespace labels asked for before the watch's first list finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("namespace labels are not known yet (the namespace watch has not synced)")]
pub struct LabelsNotSynced;

impl NamespaceLabels {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, LabelState> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, LabelState> {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A namespace's labels: empty when the synced watch has not seen it.
    pub fn get(&self, namespace: &str) -> Result<Arc<BTreeMap<String, String>>, LabelsNotSynced> {
        let state = self.read();
        if !state.synced {
            return Err(LabelsNotSynced);
        }
        Ok(state.namespaces.get(namespace).cloned().unwrap_or_default())
    }

    /// Records a namespace's labels; false when the namespace limit dropped it.
    pub fn set(&self, namespace: &str, labels: BTreeMap<String, String>) -> bool {
        let labels: BTreeMap<String, String> = labels
            .into_iter()
            .take(MAX_COLLECTION_ENTRIES + 1)
            .collect();
        let mut state = self.write();
        if state.namespaces.len() >= MAX_NAMESPACES && !state.namespaces.contains_key(namespace) {
            return false;
        }
        state
            .namespaces
            .insert(namespace.to_owned(), Arc::new(labels));
        true
    }

    pub fn remove(&self, namespace: &str) {
        self.write().namespaces.remove(namespace);
    }

    /// A relist starts: namespaces not listed again are forgotten at [`Self::relisted`].
    pub fn relisting(&self) -> BTreeSet<String> {
        self.read().namespaces.keys().cloned().collect()
    }

    /// A (re)list finished: `gone` (the namespaces the relist did not show) are dropped.
    pub fn relisted(&self, gone: impl IntoIterator<Item = String>) {
        let mut state = self.write();
        for ns in gone {
            state.namespaces.remove(&ns);
        }
        state.synced = true;
    }

    /// How many namespaces are recorded.
    pub fn len(&self) -> usize {
        self.read().namespaces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// ---- load-time checks -----------------------------------------------------------------------

/// The static types the checker knows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Type {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List(Box<Type>),
    Map(Box<Type>, Box<Type>),
    /// A variable with fixed fields (`request`, `request.pod`, …).
    Object(&'static str),
    Dyn,
}

/// `t` with its article: "an int", "a string".
fn an(t: &Type) -> String {
    let name = t.to_string();
    // "a uint": no other type name starts with a u.
    let vowel = name.starts_with(['a', 'e', 'i', 'o']);
    format!("{} {name}", if vowel { "an" } else { "a" })
}

/// The type two operands share, dyn standing for any type (also inside lists and maps);
/// `None` when two known types differ.
fn unify(a: &Type, b: &Type) -> Option<Type> {
    match (a, b) {
        (Type::Dyn, t) | (t, Type::Dyn) => Some(t.clone()),
        (Type::List(x), Type::List(y)) => Some(Type::List(Box::new(unify(x, y)?))),
        (Type::Map(k1, v1), Type::Map(k2, v2)) => Some(Type::Map(
            Box::new(unify(k1, k2)?),
            Box::new(unify(v1, v2)?),
        )),
        // podca's objects (request, pod, namespaceObject) are maps at run time.
        (Type::Object(_), Type::Map(..)) | (Type::Map(..), Type::Object(_)) => Some(Type::Dyn),
        (x, y) if x == y => Some(x.clone()),
        _ => None,
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Bool => f.write_str("bool"),
            Type::Int => f.write_str("int"),
            Type::Uint => f.write_str("uint"),
            Type::Double => f.write_str("double"),
            Type::String => f.write_str("string"),
            Type::Bytes => f.write_str("bytes"),
            Type::Null => f.write_str("null"),
            Type::List(t) => write!(f, "list({t})"),
            Type::Map(k, v) => write!(f, "map({k}, {v})"),
            Type::Object(name) => f.write_str(name),
            Type::Dyn => f.write_str("dyn"),
        }
    }
}

fn string_map_type() -> Type {
    Type::Map(Box::new(Type::String), Box::new(Type::String))
}

/// The fields of an object type.
fn fields(object: &str) -> &'static [&'static str] {
    match object {
        "request" => &[
            "source",
            "signer_name",
            "namespace",
            "service_account",
            "pod",
            "node",
            "key_type",
            "requested_lifetime_seconds",
            "annotations",
            "audiences",
        ],
        "request.pod" => &["name", "uid"],
        "request.node" => &["name"],
        "namespaceObject" => &["metadata"],
        "namespaceObject.metadata" => &["labels"],
        "pod" => &["labels", "annotations"],
        _ => &[],
    }
}

fn field_type(object: &'static str, field: &str) -> Option<Type> {
    Some(match (object, field) {
        ("request", "pod") => Type::Object("request.pod"),
        ("request", "node") => Type::Object("request.node"),
        ("request", "requested_lifetime_seconds") => Type::Int,
        ("namespaceObject", "metadata") => Type::Object("namespaceObject.metadata"),
        ("request", "annotations")
        | ("namespaceObject.metadata", "labels")
        | ("pod", "labels" | "annotations") => string_map_type(),
        ("request", "audiences") => Type::List(Box::new(Type::String)),
        (o, f) if fields(o).contains(&f) => Type::String,
        _ => return None,
    })
}

/// The functions rules may call (CEL's standard library without timestamps and durations,
/// and the strings extension without `format` and `strings.quote`).
const FUNCTIONS: &[&str] = &[
    "size",
    "split",
    "join",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "substring",
    "charAt",
    "indexOf",
    "lastIndexOf",
    "reverse",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "dyn",
    "type",
];

struct Checked {
    program: Program,
    uses_namespace_labels: bool,
    uses_pod: bool,
    reads: StringReads,
}

type CheckError = (Option<(u32, u32)>, String);

fn check(source: &str, want: Type) -> Result<Checked, CheckError> {
    if source.len() > MAX_EXPRESSION_BYTES {
        return Err((
            None,
            format!(
                "expression is {} bytes; at most {MAX_EXPRESSION_BYTES}",
                source.len()
            ),
        ));
    }
    let parser = env().parser().max_recursion_depth(MAX_NESTING);
    let (expression, info) = parser.parse_with_source_info(source).map_err(|errors| {
        let first = errors.errors.first();
        let position = first.map(|e| {
            (
                u32::try_from(e.pos.0).unwrap_or(0),
                u32::try_from(e.pos.1).unwrap_or(0),
            )
        });
        let message = first
            .map(|e| e.msg.clone())
            .unwrap_or_else(|| "syntax error".into());
        let hint = if message.contains("reserved identifier: namespace") {
            " (`namespace` is reserved in CEL: the namespace's labels are \
             namespaceObject.metadata.labels, its name request.namespace)"
        } else {
            ""
        };
        (position, format!("syntax error: {message}{hint}"))
    })?;
    let position = |id: u64| {
        info.offset_for(id)
            .map(|(start, _)| line_column(source, start as usize))
    };
    let mut checker = Checker {
        scopes: vec![],
        uses_namespace_labels: false,
        uses_pod: false,
        position: &position,
    };
    let got = checker.infer(&expression)?;
    let cost = estimate_cost(&expression);
    if cost > MAX_COST {
        return Err((
            position(expression.id),
            format!("estimated cost {cost} exceeds the limit of {MAX_COST}"),
        ));
    }
    let uses_namespace_labels = checker.uses_namespace_labels;
    let uses_pod = checker.uses_pod;
    let program = env()
        .compile(source)
        .map_err(|e| (None, format!("syntax error: {e}")))?;
    match (&got, &want) {
        (Type::Dyn, _) => {
            // The inference cannot tell: try a sample request. Errors there are left to
            // evaluation (which fails closed); a value of the wrong type is a load error.
            let sample = sample_facts();
            let resolver = FactResolver::new(&sample);
            let mut context = Context::with_env(Arc::clone(env()));
            context.set_variable_resolver(&resolver);
            if let Ok(v) = program.execute(&context) {
                let ok = matches!(
                    (&v, &want),
                    (Value::Bool(_), Type::Bool)
                        | (Value::String(_), Type::String)
                        | (Value::Int(_), Type::Int)
                        | (Value::List(_), Type::List(_))
                );
                if !ok {
                    return Err((
                        position(expression.id),
                        format!("gives {}, want {want}", value_type(&v)),
                    ));
                }
            }
        }
        (g, w) if g == w => {}
        // `[]`, or a list of mixed literals: the elements are checked at evaluation.
        (Type::List(elem), Type::List(_)) if **elem == Type::Dyn => {}
        (g, w) => {
            return Err((position(expression.id), format!("gives {g}, want {w}")));
        }
    }
    Ok(Checked {
        program,
        uses_namespace_labels,
        uses_pod,
        reads: StringReads::of(&expression),
    })
}

fn sample_facts() -> RuleFacts<'static> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    RuleFacts {
        source: RequestSource::Pcr,
        signer_name: "example.com/signer",
        namespace: "default",
        service_account: "default",
        pod_name: Some("pod"),
        pod_uid: Some("00000000-0000-0000-0000-000000000000"),
        node_name: Some("node"),
        key_type: Some("ECDSAP256"),
        requested_lifetime_seconds: Some(86_400),
        annotations: &EMPTY,
        audiences: &[],
        namespace_labels: None,
        pod: None,
        now: 1_800_000_000,
    }
}

/// 1-based line and column of a character offset.
fn line_column(source: &str, offset: usize) -> (u32, u32) {
    let (mut line, mut column) = (1u32, 1u32);
    for c in source.chars().take(offset) {
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    (line, column)
}

struct Checker<'a> {
    /// Comprehension variables in scope, innermost last.
    scopes: Vec<(String, Type)>,
    uses_namespace_labels: bool,
    uses_pod: bool,
    position: &'a dyn Fn(u64) -> Option<(u32, u32)>,
}

impl Checker<'_> {
    fn error(&self, e: &IdedExpr, message: String) -> CheckError {
        ((self.position)(e.id), message)
    }

    fn infer(&mut self, e: &IdedExpr) -> Result<Type, CheckError> {
        Ok(match &e.expr {
            Expr::Unspecified => Type::Dyn,
            Expr::Literal(l) => match l {
                LiteralValue::Boolean(_) => Type::Bool,
                LiteralValue::Int(_) => Type::Int,
                LiteralValue::UInt(_) => Type::Uint,
                LiteralValue::Double(_) => Type::Double,
                LiteralValue::String(_) => Type::String,
                LiteralValue::Bytes(_) => Type::Bytes,
                LiteralValue::Null => Type::Null,
            },
            Expr::Ident(name) => {
                if let Some((_, t)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
                    t.clone()
                } else {
                    match name.as_str() {
                        "request" => Type::Object("request"),
                        // `namespace` is a reserved word in CEL: the namespace is
                        // `namespaceObject`, as in ValidatingAdmissionPolicy.
                        "namespaceObject" => {
                            // Any use: as a whole object too (`namespaceObject == x`).
                            self.uses_namespace_labels = true;
                            Type::Object("namespaceObject")
                        }
                        "pod" => {
                            self.uses_pod = true;
                            Type::Object("pod")
                        }
                        "now" => Type::Int,
                        // Type names, as in `type(x) == string`.
                        "int" | "uint" | "double" | "string" | "bool" | "bytes" | "list"
                        | "map" | "null_type" | "type" => Type::Dyn,
                        _ => {
                            return Err(self.error(
                                e,
                                format!(
                                    "unknown variable {name:?} (known: request, namespaceObject, pod, now)"
                                ),
                            ));
                        }
                    }
                }
            }
            Expr::Select(select) => {
                let operand = self.infer(&select.operand)?;
                let t = match &operand {
                    Type::Object(o) => match field_type(o, &select.field) {
                        Some(t) => t,
                        None => {
                            return Err(self.error(
                                e,
                                format!(
                                    "{o} has no field {:?} (fields: {})",
                                    select.field,
                                    fields(o).join(", ")
                                ),
                            ));
                        }
                    },
                    Type::Map(_, v) => (**v).clone(),
                    Type::Dyn => Type::Dyn,
                    other => {
                        return Err(self.error(
                            e,
                            format!("cannot select {:?} from a {other}", select.field),
                        ));
                    }
                };
                if select.test { Type::Bool } else { t }
            }
            Expr::List(list) => {
                let mut elem: Option<Type> = None;
                for x in &list.elements {
                    let t = self.infer(x)?;
                    elem = Some(match elem {
                        None => t,
                        Some(prev) if prev == t => prev,
                        Some(_) => Type::Dyn,
                    });
                }
                Type::List(Box::new(elem.unwrap_or(Type::Dyn)))
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(m) = &entry.expr {
                        self.infer(&m.key)?;
                        self.infer(&m.value)?;
                    }
                }
                Type::Map(Box::new(Type::Dyn), Box::new(Type::Dyn))
            }
            Expr::Struct(_) => {
                return Err(self.error(e, "message literals are not supported".into()));
            }
            Expr::Comprehension(c) => {
                let range = self.infer(&c.iter_range)?;
                let (first, second) = match &range {
                    Type::List(t) => (Type::Int, (**t).clone()),
                    Type::Map(k, v) => ((**k).clone(), (**v).clone()),
                    Type::Dyn => (Type::Dyn, Type::Dyn),
                    other => {
                        return Err(
                            self.error(&c.iter_range, format!("cannot iterate over a {other}"))
                        );
                    }
                };
                // One variable: the element (lists) or key (maps); two: index/key and value.
                let vars: Vec<(String, Type)> = match &c.iter_var2 {
                    None => vec![(
                        c.iter_var.clone(),
                        if matches!(range, Type::List(_)) {
                            second.clone()
                        } else {
                            first.clone()
                        },
                    )],
                    Some(v2) => vec![(c.iter_var.clone(), first), (v2.clone(), second)],
                };
                let accu = self.infer(&c.accu_init)?;
                let depth = self.scopes.len();
                self.scopes.push((c.accu_var.clone(), accu));
                self.scopes.extend(vars);
                self.infer(&c.loop_cond)?;
                let step = self.infer(&c.loop_step)?;
                self.scopes.truncate(depth);
                self.scopes.push((c.accu_var.clone(), step));
                let result = self.infer(&c.result)?;
                self.scopes.truncate(depth);
                result
            }
            Expr::Call(call) => {
                let target = match &call.target {
                    Some(t) => Some(self.infer(t)?),
                    None => None,
                };
                let mut args = Vec::with_capacity(call.args.len());
                for a in &call.args {
                    args.push(self.infer(a)?);
                }
                self.call(e, &call.func_name, target, &args)?
            }
        })
    }

    /// Checks the arguments of a strings-extension method: how many, and their types.
    fn method_args(&self, e: &IdedExpr, name: &str, args: &[Type]) -> Result<(), CheckError> {
        use Type::{Int, String as Str};
        // (required, optional) argument types.
        let (required, optional): (&[Type], &[Type]) = match name {
            "split" | "indexOf" | "lastIndexOf" => (&[Str], &[Int]),
            "replace" => (&[Str, Str], &[Int]),
            "substring" => (&[Int], &[Int]),
            "charAt" => (&[Int], &[]),
            "join" => (&[], &[Str]),
            _ => (&[], &[]),
        };
        if args.len() < required.len() || args.len() > required.len() + optional.len() {
            let n = required.len();
            let m = n + optional.len();
            let count = if n == m {
                format!("{n}")
            } else {
                format!("{n} or {m}")
            };
            return Err(self.error(
                e,
                format!("{name}() takes {count} arguments, not {}", args.len()),
            ));
        }
        for (got, want) in args.iter().zip(required.iter().chain(optional)) {
            if got != want && *got != Type::Dyn {
                return Err(self.error(
                    e,
                    format!("{name}() takes {} here, not {}", an(want), an(got)),
                ));
            }
        }
        Ok(())
    }

    fn call(
        &self,
        e: &IdedExpr,
        name: &str,
        target: Option<Type>,
        args: &[Type],
    ) -> Result<Type, CheckError> {
        use cel::common::ast::operators as op;
        let bool_args = |what: &str| -> Result<Type, CheckError> {
            for a in args {
                if !matches!(a, Type::Bool | Type::Dyn) {
                    return Err(self.error(e, format!("{what} needs bool operands, not {a}")));
                }
            }
            Ok(Type::Bool)
        };
        // Two known types that cannot meet in one operation (dyn and null meet anything; the
        // numeric types meet each other only in comparisons, as CEL's heterogeneous numeric
        // comparison does).
        let known = |t: &Type| !matches!(t, Type::Dyn | Type::Null);
        let numeric = |t: &Type| matches!(t, Type::Int | Type::Uint | Type::Double);
        Ok(match name {
            op::LOGICAL_AND => bool_args("&&")?,
            op::LOGICAL_OR => bool_args("||")?,
            op::LOGICAL_NOT => bool_args("!")?,
            op::NOT_STRICTLY_FALSE => Type::Bool,
            op::EQUALS | op::NOT_EQUALS => {
                if let [a, b] = args
                    && known(a)
                    && known(b)
                    && unify(a, b).is_none()
                    && !(numeric(a) && numeric(b))
                {
                    let sign = if name == op::EQUALS { "==" } else { "!=" };
                    return Err(self.error(
                        e,
                        format!("{sign} compares {} with {}: it is never true", an(a), an(b)),
                    ));
                }
                Type::Bool
            }
            op::LESS | op::LESS_EQUALS | op::GREATER | op::GREATER_EQUALS => {
                for a in args {
                    if known(a)
                        && !numeric(a)
                        && !matches!(a, Type::String | Type::Bytes | Type::Bool)
                    {
                        return Err(self.error(e, format!("cannot order {}", an(a))));
                    }
                }
                if let [a, b] = args
                    && known(a)
                    && known(b)
                    && unify(a, b).is_none()
                    && !(numeric(a) && numeric(b))
                {
                    return Err(self.error(e, format!("cannot order {} against {}", an(a), an(b))));
                }
                Type::Bool
            }
            op::IN => {
                match args {
                    [elem, Type::List(t)]
                        if known(elem) && known(t) && unify(elem, t).is_none() =>
                    {
                        return Err(self.error(
                            e,
                            format!(
                                "`in` looks for {} in a list({t}): it is never found",
                                an(elem)
                            ),
                        ));
                    }
                    [key, Type::Map(k, _)] if known(key) && known(k) && unify(key, k).is_none() => {
                        return Err(self.error(
                            e,
                            format!(
                                "`in` looks for {} key in a map({k}, …): it is never found",
                                an(key)
                            ),
                        ));
                    }
                    [_, other]
                        if known(other) && !matches!(other, Type::List(_) | Type::Map(..)) =>
                    {
                        return Err(self.error(
                            e,
                            format!("`in` needs a list or a map on its right, not {}", an(other)),
                        ));
                    }
                    _ => {}
                }
                Type::Bool
            }
            op::CONDITIONAL => match args {
                [c, a, b] => {
                    if !matches!(c, Type::Bool | Type::Dyn) {
                        return Err(self.error(e, format!("?: needs a bool condition, not {c}")));
                    }
                    match unify(a, b) {
                        Some(t) => t,
                        None if known(a) && known(b) => {
                            return Err(self.error(
                                e,
                                format!(
                                    "?: gives {} or {}: both branches need one type",
                                    an(a),
                                    an(b)
                                ),
                            ));
                        }
                        None => Type::Dyn,
                    }
                }
                _ => Type::Dyn,
            },
            op::ADD | op::SUBSTRACT | op::MULTIPLY | op::DIVIDE | op::MODULO => {
                let sign = match name {
                    op::ADD => "+",
                    op::SUBSTRACT => "-",
                    op::MULTIPLY => "*",
                    op::DIVIDE => "/",
                    _ => "%",
                };
                let allowed = |t: &Type| match name {
                    op::ADD => {
                        numeric(t) || matches!(t, Type::String | Type::Bytes | Type::List(_))
                    }
                    op::MODULO => matches!(t, Type::Int | Type::Uint),
                    _ => numeric(t),
                };
                for a in args {
                    if known(a) && !allowed(a) {
                        return Err(self.error(e, format!("{sign} does not apply to {}", an(a))));
                    }
                }
                match args {
                    [a, b] if unify(a, b).is_some() => unify(a, b).unwrap_or(Type::Dyn),
                    [a, b] if known(a) && known(b) => {
                        return Err(self.error(
                            e,
                            format!(
                                "{sign} of {} and {}: convert one first (e.g. string(x), int(x))",
                                an(a),
                                an(b)
                            ),
                        ));
                    }
                    _ => Type::Dyn,
                }
            }
            op::NEGATE => match args.first() {
                Some(t) if known(t) && !matches!(t, Type::Int | Type::Double) => {
                    return Err(self.error(e, format!("- does not apply to {}", an(t))));
                }
                Some(t) => t.clone(),
                None => Type::Dyn,
            },
            op::INDEX => match args {
                [Type::List(t), i] => {
                    if known(i) && !matches!(i, Type::Int | Type::Uint) {
                        return Err(self.error(
                            e,
                            format!("a list({t}) is indexed with an int, not {}", an(i)),
                        ));
                    }
                    (**t).clone()
                }
                [Type::Map(k, v), key] => {
                    if known(key) && known(k) && unify(key, k).is_none() {
                        return Err(self.error(
                            e,
                            format!("a map({k}, {v}) is indexed with {}, not {}", an(k), an(key)),
                        ));
                    }
                    (**v).clone()
                }
                [Type::Object(o), _] => {
                    return Err(self.error(e, format!("index {o} with . fields, not []")));
                }
                [other, _] if known(other) => {
                    return Err(self.error(e, format!("{} cannot be indexed", an(other))));
                }
                _ => Type::Dyn,
            },
            "size" => {
                let operand = target.as_ref().or(args.first());
                let count = args.len() + usize::from(target.is_some());
                if count != 1 {
                    return Err(self.error(e, format!("size() takes 1 argument, not {count}")));
                }
                if let Some(t) = operand
                    && known(t)
                    && !matches!(
                        t,
                        Type::String | Type::Bytes | Type::List(_) | Type::Map(..)
                    )
                {
                    return Err(self.error(
                        e,
                        format!("size() takes a string, bytes, list or map, not {}", an(t)),
                    ));
                }
                Type::Int
            }
            "contains" | "startsWith" | "endsWith" | "matches" => {
                if let Some(t) = &target
                    && !matches!(t, Type::String | Type::Dyn)
                {
                    return Err(self.error(e, format!("{name}() is a string method, not {t}'s")));
                }
                // `matches` is also a global function: matches(s, re).
                let wanted = if target.is_some() { 1 } else { 2 };
                if args.len() != wanted {
                    return Err(self.error(
                        e,
                        format!(
                            "{name}() takes {wanted} string argument(s), not {}",
                            args.len()
                        ),
                    ));
                }
                if let Some(a) = args.iter().find(|a| known(a) && **a != Type::String) {
                    return Err(self.error(e, format!("{name}() takes a string, not {}", an(a))));
                }
                Type::Bool
            }
            "split" | "lowerAscii" | "upperAscii" | "trim" | "replace" | "substring" | "charAt"
            | "indexOf" | "lastIndexOf" | "reverse" => {
                match &target {
                    Some(Type::String | Type::Dyn) => {}
                    Some(t) => {
                        return Err(
                            self.error(e, format!("{name}() is a string method, not {t}'s"))
                        );
                    }
                    None => {
                        return Err(
                            self.error(e, format!("{name}() is a method: write s.{name}(…)"))
                        );
                    }
                }
                self.method_args(e, name, args)?;
                match name {
                    "split" => Type::List(Box::new(Type::String)),
                    "indexOf" | "lastIndexOf" => Type::Int,
                    _ => Type::String,
                }
            }
            "join" => {
                match &target {
                    Some(Type::List(_) | Type::Dyn) => {}
                    Some(t) => {
                        return Err(self.error(e, format!("join() is a list method, not {t}'s")));
                    }
                    None => {
                        return Err(
                            self.error(e, "join() is a method: write list.join(sep)".into())
                        );
                    }
                }
                self.method_args(e, name, args)?;
                Type::String
            }
            "int" => Type::Int,
            "uint" => Type::Uint,
            "double" => Type::Double,
            "string" => Type::String,
            "bool" => Type::Bool,
            "bytes" => Type::Bytes,
            f if FUNCTIONS.contains(&f) => Type::Dyn,
            _ => {
                return Err(self.error(
                    e,
                    format!(
                        "unknown function {name:?} (known: {})",
                        FUNCTIONS.join(", ")
                    ),
                ));
            }
        })
    }
}

/// The estimated worst-case cost of an expression: one unit per node, and a comprehension's
/// condition, step and result count [`MAX_COLLECTION_ENTRIES`] times (the largest collection
/// a rule is evaluated over), so nested comprehensions multiply.
pub fn estimate_cost(e: &IdedExpr) -> u64 {
    let n = MAX_COLLECTION_ENTRIES as u64;
    match &e.expr {
        Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => 1,
        Expr::Select(s) => 1 + estimate_cost(&s.operand),
        Expr::List(l) => 1 + l.elements.iter().map(estimate_cost).sum::<u64>(),
        Expr::Map(m) => {
            1 + m
                .entries
                .iter()
                .map(|entry| match &entry.expr {
                    EntryExpr::MapEntry(m) => estimate_cost(&m.key) + estimate_cost(&m.value),
                    EntryExpr::StructField(f) => estimate_cost(&f.value),
                })
                .sum::<u64>()
        }
        Expr::Struct(s) => {
            1 + s
                .entries
                .iter()
                .map(|entry| match &entry.expr {
                    EntryExpr::MapEntry(m) => estimate_cost(&m.key) + estimate_cost(&m.value),
                    EntryExpr::StructField(f) => estimate_cost(&f.value),
                })
                .sum::<u64>()
        }
        Expr::Call(c) => {
            1 + c.target.as_deref().map(estimate_cost).unwrap_or(0)
                + c.args.iter().map(estimate_cost).sum::<u64>()
        }
        Expr::Comprehension(c) => {
            let body = estimate_cost(&c.loop_cond)
                .saturating_add(estimate_cost(&c.loop_step))
                .saturating_add(1);
            estimate_cost(&c.iter_range)
                .saturating_add(estimate_cost(&c.accu_init))
                .saturating_add(n.saturating_mul(body))
                .saturating_add(estimate_cost(&c.result))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, deny: &str) -> RuleSpec {
        RuleSpec {
            name: name.into(),
            deny: Some(deny.into()),
            require: None,
            reason: "PolicyDenied".into(),
            message: None,
        }
    }

    fn compile_err(specs: &[RuleSpec]) -> RuleError {
        RuleSet::compile(specs).expect_err("must not compile")
    }

    fn facts<'a>(
        annotations: &'a BTreeMap<String, String>,
        audiences: &'a [String],
        labels: Option<&'a BTreeMap<String, String>>,
    ) -> RuleFacts<'a> {
        RuleFacts {
            source: RequestSource::Pcr,
            signer_name: "example.com/s",
            namespace: "shop",
            service_account: "cart",
            pod_name: Some("cart-7d9"),
            pod_uid: Some("1f0c"),
            node_name: Some("node-a"),
            key_type: Some("ECDSAP256"),
            requested_lifetime_seconds: Some(7200),
            annotations,
            audiences,
            namespace_labels: labels,
            pod: None,
            now: 1_800_000_000,
        }
    }

    #[test]
    fn compile_errors_name_the_rule_the_field_and_the_position() {
        for (specs, want) in [
            (
                vec![spec("syntax", "request.namespace ==")],
                "rule \"syntax\" at deny 1:21: syntax error",
            ),
            (
                vec![spec("reserved", "namespace.labels.tier == 'a'")],
                "(`namespace` is reserved in CEL: the namespace's labels are \
                 namespaceObject.metadata.labels",
            ),
            (
                vec![spec("unknown_var", "requst.namespace == 'a'")],
                "rule \"unknown_var\" at deny 1:1: unknown variable \"requst\"",
            ),
            (
                vec![spec("unknown_field", "request.pod.nmae == 'a'")],
                "rule \"unknown_field\" at deny 1:12: request.pod has no field \"nmae\"",
            ),
            (
                vec![spec("multiline", "true &&\n  request.nope")],
                "rule \"multiline\" at deny 2:10: request has no field \"nope\"",
            ),
            (
                vec![spec("not_bool", "request.namespace")],
                "rule \"not_bool\" at deny 1:8: gives string, want bool",
            ),
            (
                vec![spec("int_rule", "request.requested_lifetime_seconds + 1")],
                "gives int, want bool",
            ),
            (
                vec![spec("unknown_fn", "lower(request.namespace) == 'a'")],
                "rule \"unknown_fn\" at deny 1:6: unknown function \"lower\"",
            ),
            (
                vec![spec(
                    "comprehension_var",
                    "request.audiences.exists(a, b == 'x')",
                )],
                "unknown variable \"b\"",
            ),
            (
                vec![spec("bad-name", "true")],
                "rule \"bad-name\": name must match",
            ),
            (
                vec![RuleSpec {
                    reason: "Not A Reason".into(),
                    ..spec("bad_reason", "true")
                }],
                "reason \"Not A Reason\" is not a Kubernetes condition reason",
            ),
            (
                vec![RuleSpec {
                    require: Some("true".into()),
                    ..spec("both", "true")
                }],
                "give exactly one of deny or require",
            ),
            (
                vec![RuleSpec {
                    message: Some("1 + 2".into()),
                    ..spec("int_message", "true")
                }],
                "rule \"int_message\" at message 1:3: gives int, want string",
            ),
            (
                vec![spec("twice", "true"), spec("twice", "false")],
                "two rules have this name",
            ),
        ] {
            let e = compile_err(&specs).to_string();
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    /// Issue #42: what Kubernetes' own CEL refuses at write time is refused at load, with the
    /// rule, the position and the types; before, each of these linted clean and denied every
    /// request at run time (`PolicyRuleFailed`).
    #[test]
    fn type_errors_are_refused_at_load_with_the_types() {
        for (expression, want) in [
            (
                "request.key_type.startsWith(42)",
                "1:28: startsWith() takes a string, not an int",
            ),
            ("request.namespace + 1 == 'a'", "+ of a string and an int"),
            ("request.namespace == 1", "== compares a string with an int"),
            (
                "request.namespace != true",
                "!= compares a string with a bool",
            ),
            (
                "size(5) > 1",
                "size() takes a string, bytes, list or map, not an int",
            ),
            (
                "request.audiences['x'] == 'y'",
                "a list(string) is indexed with an int, not a string",
            ),
            (
                "request.annotations[1] == 'y'",
                "a map(string, string) is indexed with a string, not an int",
            ),
            ("request.namespace[0] == 'a'", "a string cannot be indexed"),
            (
                "1 in request.audiences",
                "`in` looks for an int in a list(string)",
            ),
            (
                "1 in request.annotations",
                "`in` looks for an int key in a map(string",
            ),
            (
                "'a' in request.namespace",
                "`in` needs a list or a map on its right, not a string",
            ),
            (
                "request.namespace < 1",
                "cannot order a string against an int",
            ),
            ("request.audiences < ['a']", "cannot order a list(string)"),
            ("-request.namespace == 'a'", "- does not apply to a string"),
            (
                "request.namespace * 2 == 'aa'",
                "* does not apply to a string",
            ),
            ("now % 2.0 == 0", "% does not apply to a double"),
            ("now - 5u > 0", "- of an int and a uint"),
            (
                "(request.namespace == 'a' ? 1 : 'b') == 1",
                "?: gives an int or a string",
            ),
            (
                "request.audiences.exists(a, a + 1 == 2)",
                "+ of a string and an int",
            ),
            (
                "request.audiences.all(a, a.size() > 'x')",
                "cannot order an int against a string",
            ),
            (
                "request.audiences.map(a, a.startsWith(1)).size() > 0",
                "startsWith() takes a string, not an int",
            ),
            (
                "request.namespace.contains()",
                "contains() takes 1 string argument(s), not 0",
            ),
            (
                "request.namespace.split(1).size() > 0",
                "split() takes a string here, not an int",
            ),
            (
                "request.annotations.filter(k, k > 1).size() > 0",
                "cannot order a string against an int",
            ),
            (
                "'team' in pod.labels && pod.labels['team'] + 2 == 'x'",
                "+ of a string and an int",
            ),
            (
                "request.requested_lifetime_seconds == 'a'",
                "== compares an int with a string",
            ),
        ] {
            let e = compile_err(&[spec("typed", expression)]).to_string();
            assert!(
                e.contains("rule \"typed\" at deny") && e.contains(want),
                "{expression}: {e:?} should contain {want:?}"
            );
        }
        // Well typed: numeric comparisons across types, dyn, null, lists and maps.
        for expression in [
            "request.requested_lifetime_seconds > 3600.0",
            "request.requested_lifetime_seconds == null",
            "request.audiences == ['a', 'b']",
            "'team' in request.annotations && request.annotations['team'].startsWith('pay')",
            "request.audiences.exists(a, a.endsWith('.svc')) || size(request.audiences) == 0",
            "request.namespace.split('-').size() > 1 && matches(request.namespace, '^[a-z]+$')",
            "[1, 'a'][0] == 1",
            "now - 5 > 0 && now % 2 == 0",
        ] {
            assert!(
                RuleSet::compile(&[spec("typed", expression)]).is_ok(),
                "{expression}: {:?}",
                RuleSet::compile(&[spec("typed", expression)]).err()
            );
        }
    }

    /// Every rule and output the README and the docs show compiles and type-checks:
    /// each ```toml block that parses is searched for `rules` arrays and `outputs` tables
    /// (under `[signers."…"]` or on their own).
    #[test]
    fn every_rule_the_docs_show_type_checks() {
        fn visit(value: &toml::Value, found: &mut Vec<(Vec<RuleSpec>, OutputSpec)>) {
            let Some(table) = value.as_table() else {
                return;
            };
            let rules: Vec<RuleSpec> = table
                .get("rules")
                .and_then(|r| r.clone().try_into().ok())
                .unwrap_or_default();
            let outputs: OutputSpec = table
                .get("outputs")
                .and_then(|o| o.clone().try_into().ok())
                .unwrap_or_default();
            if !rules.is_empty() || !outputs.is_empty() {
                found.push((rules, outputs));
            }
            for child in table.values() {
                visit(child, found);
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut found = vec![];
        let mut docs = vec![root.join("README.md")];
        for entry in std::fs::read_dir(root.join("docs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
        for doc in docs {
            let text = std::fs::read_to_string(doc).unwrap();
            for block in text.split("```toml\n").skip(1) {
                let block = block.split("```").next().unwrap_or_default();
                if let Ok(value) = toml::from_str::<toml::Value>(block) {
                    visit(&value, &mut found);
                }
            }
        }
        assert!(
            found.len() >= 5,
            "only {} rule sets found in the docs",
            found.len()
        );
        for (rules, outputs) in &found {
            if let Err(e) = RuleSet::compile_with_outputs(rules, outputs) {
                panic!("a documented rule does not compile: {e}\n{rules:#?}\n{outputs:#?}");
            }
        }
    }

    #[test]
    fn dyn_results_are_checked_on_a_sample_request() {
        // `request.annotations` values are strings, so `[...][0]` infers dyn: the sample decides.
        let e = compile_err(&[spec("dyn_int", "[1, 'a'][0]")]).to_string();
        assert!(e.contains("gives int, want bool"), "{e}");
        assert!(RuleSet::compile(&[spec("dyn_bool", "[true, 'a'][0]")]).is_ok());
    }

    #[test]
    fn cost_and_size_limits() {
        let one = "request.annotations.exists(k, k.startsWith('x'))";
        assert!(RuleSet::compile(&[spec("one", one)]).is_ok());
        let nested = "request.annotations.exists(k, request.annotations.exists(j, \
                      request.annotations.exists(i, i == j && j == k)))";
        let e = compile_err(&[spec("nested", nested)]).to_string();
        assert!(
            e.contains("rule \"nested\" at deny 1:")
                && e.contains(&format!("exceeds the limit of {MAX_COST}")),
            "{e}"
        );
        let long = format!(
            "request.namespace == '{}'",
            "a".repeat(MAX_EXPRESSION_BYTES)
        );
        let e = compile_err(&[spec("long", &long)]).to_string();
        assert!(e.contains("at most 4096"), "{e}");
        let deep = format!("{}true{}", "(".repeat(64), ")".repeat(64));
        let e = compile_err(&[spec("deep", &deep)]).to_string();
        assert!(e.contains("syntax error"), "{e}");
        let many: Vec<RuleSpec> = (0..=MAX_RULES)
            .map(|i| spec(&format!("r{i}"), "true"))
            .collect();
        assert!(
            compile_err(&many)
                .to_string()
                .contains("at most 64 per signer")
        );
    }

    #[test]
    fn runtime_errors_fail_closed_and_are_counted() {
        let rules = RuleSet::compile(&[spec("missing_key", "request.annotations['team'] == 'x'")])
            .expect("compiles");
        let empty = BTreeMap::new();
        let denial = rules
            .evaluate(&facts(&empty, &[], None))
            .expect_err("an evaluation error denies");
        assert_eq!(denial.reason, "PolicyRuleFailed:missing_key");
        assert!(denial.error);
        assert!(
            denial.message.contains("rule \"missing_key\" failed")
                && denial.message.contains("team"),
            "{}",
            denial.message
        );
        // Counted by the rule set itself: one error, no denial.
        assert_eq!(rules.counts().rules, [("missing_key".to_string(), 0, 1)]);
        // Too many entries: denied before any rule runs.
        let big: BTreeMap<String, String> = (0..=MAX_COLLECTION_ENTRIES)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        let denial = rules
            .evaluate(&facts(&big, &[], None))
            .expect_err("oversized input denies");
        assert_eq!(denial.reason, "PolicyRuleFailed:missing_key");
        assert!(denial.message.contains("at most 256"), "{}", denial.message);
    }

    /// The remembered decisions of one rule of `rules`.
    fn remembered(rules: &RuleSet, rule: usize) -> usize {
        rules.rules[rule].memo.len()
    }

    #[test]
    fn decisions_are_remembered_by_the_facts_each_evaluation_read() {
        let rules = RuleSet::compile(&[
            spec("by_namespace", "request.namespace == 'kube-system'"),
            // Reads the UID only for gRPC requests.
            spec(
                "bound_tokens_only",
                "request.source == 'grpc' && request.pod.uid == ''",
            ),
            spec("by_clock", "now < 0"),
        ])
        .expect("compiles");
        let empty = BTreeMap::new();
        let pod = |name: &'static str, uid: &'static str| RuleFacts {
            pod_name: Some(name),
            pod_uid: Some(uid),
            ..facts(&empty, &[], None)
        };
        rules.evaluate(&pod("a", "1")).expect("admitted");
        assert_eq!(
            (
                remembered(&rules, 0),
                remembered(&rules, 1),
                remembered(&rules, 2)
            ),
            (1, 1, 1)
        );
        // Another pod of the namespace: all three answered from memory.
        rules.evaluate(&pod("b", "2")).expect("admitted");
        assert_eq!(
            (
                remembered(&rules, 0),
                remembered(&rules, 1),
                remembered(&rules, 2)
            ),
            (1, 1, 1)
        );
        // Another namespace: the first rule evaluates again; the others did not read it.
        let other = RuleFacts {
            namespace: "kube-system",
            ..pod("c", "3")
        };
        let denial = rules.evaluate(&other).expect_err("kube-system is denied");
        assert_eq!(denial.rule, "by_namespace");
        assert_eq!(remembered(&rules, 0), 2);
        // The clock is a fact too: another second is another evaluation.
        let later = RuleFacts {
            now: 1_800_000_001,
            ..pod("d", "4")
        };
        rules.evaluate(&later).expect("admitted");
        assert_eq!(remembered(&rules, 2), 2);
        // A gRPC request reads the UID: the PCR answer (which did not) is not lent to it.
        let grpc = |uid: &'static str| RuleFacts {
            source: RequestSource::Grpc,
            ..pod("e", uid)
        };
        let denial = rules.evaluate(&grpc("")).expect_err("no UID over gRPC");
        assert_eq!(denial.rule, "bound_tokens_only");
        rules.evaluate(&grpc("5")).expect("a UID is enough");
        let denial = rules
            .evaluate(&grpc(""))
            .expect_err("still denied, from memory");
        assert_eq!(denial.rule, "bound_tokens_only");
        assert_eq!(remembered(&rules, 1), 3);
    }

    #[test]
    fn errors_are_not_remembered_and_are_counted_each_time() {
        let rules = RuleSet::compile(&[spec("missing_key", "request.annotations['team'] == 'x'")])
            .expect("compiles");
        let empty = BTreeMap::new();
        let errors = || rules.counts().rules[0].2;
        let before = errors();
        for _ in 0..3 {
            let denial = rules
                .evaluate(&facts(&empty, &[], None))
                .expect_err("an evaluation error denies");
            assert_eq!(denial.reason, "PolicyRuleFailed:missing_key");
        }
        assert_eq!(errors(), before + 3);
        assert_eq!(remembered(&rules, 0), 0);
    }

    #[test]
    fn remembered_decisions_are_bounded() {
        let rules = RuleSet::compile(&[
            spec("by_namespace", "request.namespace == 'kube-system'"),
            spec("by_annotations", "size(request.annotations) > 8"),
        ])
        .expect("compiles");
        let empty = BTreeMap::new();
        let mut most = 0;
        for i in 0..(memo::MAX_ENTRIES + 100) {
            let namespace = format!("ns-{i}");
            rules
                .evaluate(&RuleFacts {
                    namespace: &namespace,
                    ..facts(&empty, &[], None)
                })
                .expect("admitted");
            most = most.max(remembered(&rules, 0));
        }
        // Small entries: the entry count or the byte budget, whichever comes first.
        assert!(
            most <= memo::MAX_ENTRIES && most > memo::MAX_ENTRIES / 2,
            "{most} entries kept"
        );
        assert!(
            remembered(&rules, 0) < most,
            "forgotten when full, then refilled"
        );
        // A fact set over MAX_KEY_BYTES is evaluated every time, never kept.
        let big: BTreeMap<String, String> =
            [("a".to_string(), "x".repeat(memo::MAX_KEY_BYTES))].into();
        let before = remembered(&rules, 1);
        rules.evaluate(&facts(&big, &[], None)).expect("admitted");
        assert_eq!(remembered(&rules, 1), before);
        // Facts of 3 KiB each: the byte budget, not the entry count, forgets first.
        let mut most = 0;
        for i in 0..200 {
            let value: BTreeMap<String, String> = [(format!("k{i}"), "y".repeat(3 * 1024))].into();
            rules.evaluate(&facts(&value, &[], None)).expect("admitted");
            most = most.max(remembered(&rules, 1));
        }
        assert!(
            most < 200 && most * 3 * 1024 <= memo::MAX_BYTES,
            "{most} entries kept"
        );
    }

    /// Every combination of a few values of every fact, through one rule set that remembers
    /// and through a fresh one per request (which cannot): the same decision each time.
    #[test]
    fn remembered_decisions_equal_evaluated_ones() {
        let specs = [
            spec(
                "ns_or_account",
                "request.namespace == 'a' || request.service_account == 'x'",
            ),
            spec(
                "labelled",
                "'tier' in namespaceObject.metadata.labels && \
                 namespaceObject.metadata.labels['tier'] == request.namespace",
            ),
            spec(
                "annotated",
                "request.annotations.exists(k, request.annotations[k] == request.pod.name)",
            ),
            spec(
                "pod_object",
                "has(request.pod.uid) && request.pod.uid == request.node.name",
            ),
            spec(
                "uid_over_grpc",
                "request.source == 'grpc' && request.pod.uid == ''",
            ),
            spec(
                "whole_request",
                "request.source == 'jwt' ? size(request.audiences) > 1 : \
                 request.requested_lifetime_seconds > 7200 && now % 2 == 0",
            ),
            spec(
                "pod_facts",
                "'k' in pod.labels || pod.annotations.exists(k, k == request.namespace)",
            ),
            spec("whole_pod", "pod == {'labels': {}, 'annotations': {}}"),
        ];
        let shared = RuleSet::compile(&specs).expect("compiles");
        let maps: Vec<BTreeMap<String, String>> = vec![
            BTreeMap::new(),
            [("tier".to_string(), "a".to_string())].into(),
            [("k".to_string(), "p".to_string())].into(),
        ];
        let audiences: Vec<Vec<String>> = vec![vec![], vec!["x".into(), "y".into()]];
        let mut checked = 0;
        for source in [RequestSource::Pcr, RequestSource::Grpc, RequestSource::Jwt] {
            for namespace in ["a", "b"] {
                for service_account in ["x", "y"] {
                    for (pod_name, pod_uid) in [("p", "n"), ("p", ""), ("q", "n"), ("q", "")] {
                        for (a, annotations) in maps.iter().enumerate() {
                            for (l, labels) in maps.iter().enumerate() {
                                // The pod's maps vary with the others (a third loop would
                                // triple the run): its labels are the next annotation map.
                                let pod = PodMetadata {
                                    labels: maps[(a + 1) % maps.len()].clone(),
                                    annotations: maps[(l + 2) % maps.len()].clone(),
                                };
                                for audiences in &audiences {
                                    for (lifetime, now) in [(3600, 2), (86400, 3), (86400, 4)] {
                                        let f = RuleFacts {
                                            source,
                                            namespace,
                                            service_account,
                                            pod_name: Some(pod_name),
                                            pod_uid: Some(pod_uid),
                                            node_name: Some("n"),
                                            requested_lifetime_seconds: Some(lifetime),
                                            annotations,
                                            audiences,
                                            namespace_labels: Some(labels),
                                            pod: Some(&pod),
                                            now,
                                            ..facts(annotations, audiences, None)
                                        };
                                        let fresh = RuleSet::compile(&specs).expect("compiles");
                                        let want = fresh.evaluate(&f).map_err(|d| d.rule);
                                        // Twice: once evaluated or remembered, once remembered.
                                        assert_eq!(shared.evaluate(&f).map_err(|d| d.rule), want);
                                        assert_eq!(shared.evaluate(&f).map_err(|d| d.rule), want);
                                        checked += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 2 * 2 * 4 * 3 * 3 * 2 * 3);
        assert!(
            remembered(&shared, 0) < checked / 10,
            "ns_or_account reads two facts"
        );
    }

    #[test]
    fn rule_table_covers_every_variable_and_both_decisions() {
        let annotations =
            BTreeMap::from([("podca.dev/dns-names".to_string(), "a.shop".to_string())]);
        let audiences = vec!["vault".to_string()];
        let labels = BTreeMap::from([("tier".to_string(), "prod".to_string())]);
        let pod = PodMetadata {
            labels: BTreeMap::from([("app".to_string(), "web".to_string())]),
            annotations: BTreeMap::from([("example.com/team".to_string(), "pay".to_string())]),
        };
        // (expression true for `facts`, its negation's result is the opposite)
        for expr in [
            "request.source == 'pcr'",
            "request.signer_name == 'example.com/s'",
            "request.namespace == 'shop'",
            "request.service_account == 'cart'",
            "request.pod.name.startsWith('cart-')",
            "request.pod.uid == '1f0c'",
            "request.node.name == 'node-a'",
            "request.key_type in ['ECDSAP256', 'ED25519']",
            "request.requested_lifetime_seconds <= 7200",
            "request.annotations['podca.dev/dns-names'].endsWith('.shop')",
            "'podca.dev/dns-names' in request.annotations",
            "request.audiences.exists(a, a == 'vault')",
            "namespaceObject.metadata.labels.tier == 'prod'",
            "has(namespaceObject.metadata.labels.tier)",
            "now > 1700000000",
            "size(request.namespace) == 4 && request.namespace.matches('^s[a-z]+$')",
            "pod.labels.app == 'web'",
            "pod.annotations['example.com/team'] == 'pay'",
            "'app' in pod.labels && size(pod.annotations) == 1",
            "pod.labels['app'] + '/' + pod.annotations['example.com/team'] == 'web/pay'",
        ] {
            for (decision, fires_when) in [("deny", true), ("require", false)] {
                for (e, truth) in [(expr.to_string(), true), (format!("!({expr})"), false)] {
                    let rule = RuleSpec {
                        name: "r".into(),
                        deny: (decision == "deny").then(|| e.clone()),
                        require: (decision == "require").then(|| e.clone()),
                        reason: "TableDenied".into(),
                        message: Some("'no: ' + request.namespace".into()),
                    };
                    let rules =
                        RuleSet::compile(&[rule]).unwrap_or_else(|err| panic!("{e}: {err}"));
                    let got = rules.evaluate(&RuleFacts {
                        pod: Some(&pod),
                        ..facts(&annotations, &audiences, Some(&labels))
                    });
                    if truth == fires_when {
                        let d = got.expect_err(&e);
                        assert_eq!(
                            (d.reason, d.message.as_str(), d.error),
                            ("TableDenied", "no: shop", false),
                            "{decision} {e}"
                        );
                    } else {
                        assert_eq!(got, Ok(()), "{decision} {e}");
                    }
                }
            }
        }
        // Other sources and absent facts.
        let empty = BTreeMap::new();
        let jwt = RuleFacts {
            source: RequestSource::Jwt,
            pod_name: None,
            key_type: None,
            requested_lifetime_seconds: None,
            ..facts(&empty, &audiences, None)
        };
        let rules = RuleSet::compile(&[spec(
                "jwt_facts",
                "request.source == 'jwt' && request.pod.name == '' && request.key_type == '' \
                 && request.requested_lifetime_seconds == 0 && size(namespaceObject.metadata.labels) == 0 \
                 && size(pod.labels) == 0 && pod.annotations == {}",
            )],
        )
        .expect("compiles");
        assert!(rules.uses_namespace_labels());
        assert!(rules.uses_pod_facts());
        assert_eq!(rules.pod_reader(), Some("jwt_facts"));
        assert_eq!(
            rules.evaluate(&jwt).map_err(|d| d.reason),
            Err("PolicyDenied")
        );
        for source in [
            RequestSource::Grpc,
            RequestSource::Istio,
            RequestSource::Cli,
        ] {
            assert_eq!(rules.evaluate(&RuleFacts { source, ..jwt }), Ok(()));
        }
    }

    #[test]
    fn pod_facts_are_typed_bounded_and_found_in_any_use() {
        // A field the pod object does not have names the ones it has.
        let err = compile_err(&[spec("pod_name", "pod.name == 'x'")]);
        assert!(
            err.message
                .contains("pod has no field \"name\" (fields: labels, annotations)"),
            "{err}"
        );
        // A pod map is map(string, string).
        let err = compile_err(&[spec("typed", "pod.annotations")]);
        assert!(
            err.message.contains("gives map(string, string), want bool"),
            "{err}"
        );
        // Any use of `pod` or of `namespaceObject` counts, also as a whole object or in a
        // message or an output.
        for (specs, outputs, pod, ns) in [
            (
                vec![spec("whole", "pod == {}")],
                OutputSpec::default(),
                true,
                false,
            ),
            (
                vec![spec("whole_ns", "namespaceObject != {}")],
                OutputSpec::default(),
                false,
                true,
            ),
            (
                vec![RuleSpec {
                    message: Some("'app ' + pod.labels.app".into()),
                    ..spec("in_message", "false")
                }],
                OutputSpec::default(),
                true,
                false,
            ),
            (
                vec![],
                OutputSpec {
                    dns_names: Some("[pod.labels.app + '.svc']".into()),
                    max_lifetime_seconds: None,
                },
                true,
                false,
            ),
            (
                vec![spec("plain", "request.namespace == 'a'")],
                OutputSpec::default(),
                false,
                false,
            ),
        ] {
            let rules = RuleSet::compile_with_outputs(&specs, &outputs).expect("compiles");
            assert_eq!(
                (rules.uses_pod_facts(), rules.uses_namespace_labels()),
                (pod, ns),
                "{specs:?} {outputs:?}"
            );
        }
        let rules = RuleSet::compile_with_outputs(
            &[],
            &OutputSpec {
                dns_names: Some("[pod.labels.app + '.svc']".into()),
                max_lifetime_seconds: None,
            },
        )
        .expect("compiles");
        assert_eq!(rules.pod_reader(), Some("outputs.dns_names"));
        // More labels than rules accept: fail closed, whatever the rule says.
        let rules = RuleSet::compile(&[spec("never", "false")]).expect("compiles");
        let big = PodMetadata {
            labels: (0..=MAX_COLLECTION_ENTRIES)
                .map(|i| (format!("k{i}"), String::new()))
                .collect(),
            annotations: BTreeMap::new(),
        };
        let empty = BTreeMap::new();
        let denial = rules
            .evaluate(&RuleFacts {
                pod: Some(&big),
                ..facts(&empty, &[], None)
            })
            .expect_err("oversized pod labels deny");
        assert_eq!(denial.reason, "PolicyRuleFailed:never");
        assert!(
            denial.message.contains("pod.labels has 257 entries"),
            "{}",
            denial.message
        );
    }

    #[test]
    fn remembered_decisions_follow_the_pods_labels() {
        let rules = RuleSet::compile(&[spec("canary", "pod.labels['track'] == 'canary'")])
            .expect("compiles");
        let empty = BTreeMap::new();
        let with = |track: &str| PodMetadata {
            labels: BTreeMap::from([("track".to_string(), track.to_string())]),
            annotations: BTreeMap::new(),
        };
        let (canary, stable) = (with("canary"), with("stable"));
        for _ in 0..3 {
            for (pod, denied) in [(&canary, true), (&stable, false)] {
                let got = rules.evaluate(&RuleFacts {
                    pod: Some(pod),
                    ..facts(&empty, &[], None)
                });
                assert_eq!(got.is_err(), denied, "{pod:?}");
            }
        }
        assert_eq!(remembered(&rules, 0), 2);
    }

    #[test]
    fn first_denying_rule_decides_and_default_message_names_it() {
        let empty = BTreeMap::new();
        let rules = RuleSet::compile(&[
            spec("passes", "false"),
            RuleSpec {
                reason: "FirstReason".into(),
                ..spec("first", "request.namespace == 'shop'")
            },
            RuleSpec {
                reason: "SecondReason".into(),
                ..spec("second", "true")
            },
        ])
        .expect("compiles");
        assert!(!rules.uses_namespace_labels());
        let d = rules
            .evaluate(&facts(&empty, &[], None))
            .expect_err("denied");
        assert_eq!(d.rule, "first");
        assert_eq!(d.reason, "FirstReason");
        assert_eq!(d.message, "denied by policy rule \"first\"");
    }

    #[test]
    fn every_listed_function_exists() {
        let empty = BTreeMap::new();
        for expr in [
            "size('ab') == 2",
            "'ab'.contains('b')",
            "'ab'.startsWith('a')",
            "'ab'.endsWith('b')",
            "'ab'.matches('^a')",
            "int('2') == 2",
            "uint(2) == 2u",
            "double(2) == 2.0",
            "string(2) == '2'",
            "bool('true')",
            "bytes('a') == b'a'",
            "dyn(1) == 1",
            "type(1) == int",
        ] {
            let rules =
                RuleSet::compile(&[spec("f", expr)]).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert!(
                rules
                    .evaluate(&facts(&empty, &[], None))
                    .is_err_and(|d| !d.error),
                "{expr} should be true"
            );
        }
    }

    fn with_outputs(dns_names: Option<&str>, cap: Option<&str>) -> RuleSet {
        RuleSet::compile_with_outputs(
            &[spec("ok", "false")],
            &OutputSpec {
                dns_names: dns_names.map(Into::into),
                max_lifetime_seconds: cap.map(Into::into),
            },
        )
        .unwrap_or_else(|e| panic!("{dns_names:?} {cap:?}: {e}"))
    }

    /// The `allowed_dns_names = ["*.{ns}.svc"]` + `dns_name_templates = ["{pod}.{ns}.svc"]`
    /// policy as one output (the docs show it).
    const DNS_OUTPUT: &str = "[request.pod.name + '.' + request.namespace + '.svc'] + \
        ('podca.dev/dns-names' in request.annotations \
          ? request.annotations['podca.dev/dns-names'].split(',') \
              .map(n, n.trim().lowerAscii()).filter(n, n != '') \
          : [])";

    #[test]
    fn outputs_give_the_dns_names_and_cap_the_lifetime() {
        let rules = with_outputs(
            Some(DNS_OUTPUT),
            Some("request.namespace == 'shop' ? 7200 : 86400"),
        );
        assert!(rules.has_outputs() && !rules.is_empty());
        let annotations = BTreeMap::from([(
            "podca.dev/dns-names".to_string(),
            " API.shop.svc, ,cart-7d9.shop.svc,api.shop.svc".to_string(),
        )]);
        let got = rules
            .decide(&facts(&annotations, &[], None))
            .expect("issues");
        assert_eq!(
            got,
            RuleOutputs {
                dns_names: Some(vec!["cart-7d9.shop.svc".into(), "api.shop.svc".into()]),
                max_lifetime_seconds: Some(7200),
            }
        );
        // Without outputs nothing is computed; without the annotation only the pod's name.
        let empty = BTreeMap::new();
        assert_eq!(
            RuleSet::compile(&[spec("ok", "false")])
                .unwrap()
                .decide(&facts(&empty, &[], None)),
            Ok(RuleOutputs::default())
        );
        let only_cap = with_outputs(None, Some("3600"));
        assert_eq!(
            only_cap.decide(&facts(&empty, &[], None)),
            Ok(RuleOutputs {
                dns_names: None,
                max_lifetime_seconds: Some(3600)
            })
        );
        let only_dns = with_outputs(Some(DNS_OUTPUT), None);
        assert_eq!(
            only_dns
                .decide(&facts(&empty, &[], None))
                .map(|o| o.dns_names),
            Ok(Some(vec!["cart-7d9.shop.svc".to_string()]))
        );
        // A rule that denies decides before the outputs run.
        let denying = RuleSet::compile_with_outputs(
            &[spec("no", "true")],
            &OutputSpec {
                // Would fail (no such annotation), but the denying rule decides first.
                dns_names: Some("[request.annotations['absent']]".into()),
                max_lifetime_seconds: None,
            },
        )
        .unwrap();
        assert_eq!(
            denying
                .decide(&facts(&empty, &[], None))
                .map_err(|d| d.rule),
            Err("no".to_string())
        );
        // JWT-SVIDs take caps below an hour; certificates do not.
        let short = with_outputs(None, Some("300"));
        let jwt = RuleFacts {
            source: RequestSource::Jwt,
            ..facts(&empty, &[], None)
        };
        assert_eq!(
            short.decide(&jwt).map(|o| o.max_lifetime_seconds),
            Ok(Some(300))
        );
    }

    #[test]
    fn bad_outputs_deny_with_a_precise_reason_and_are_counted() {
        let annotations =
            |v: &str| BTreeMap::from([("podca.dev/dns-names".to_string(), v.to_string())]);
        let from_annotation = "request.annotations['podca.dev/dns-names'].split(',')";
        let dns = "PolicyOutputInvalid:dns_names";
        let cap = "PolicyOutputInvalid:max_lifetime_seconds";
        let many = (0..=MAX_OUTPUT_DNS_NAMES)
            .map(|i| format!("n{i}.shop"))
            .collect::<Vec<_>>()
            .join(",");
        let sixteen_twice = (0..MAX_OUTPUT_DNS_NAMES)
            .map(|i| format!("n{i}.shop,n{i}.shop"))
            .collect::<Vec<_>>()
            .join(",");
        let errors = |rules: &RuleSet, output: &str| {
            rules
                .counts()
                .outputs
                .into_iter()
                .find(|r| r.0 == output)
                .map_or(0, |r| r.1)
        };
        for (dns_names, max_lifetime, annotation, source, reason, want) in [
            (
                Some(from_annotation),
                None,
                "Web.shop",
                RequestSource::Pcr,
                dns,
                "gave \"Web.shop\", which is not a DNS name",
            ),
            (
                Some(from_annotation),
                None,
                "*.shop",
                RequestSource::Grpc,
                dns,
                "gave \"*.shop\", which is not a DNS name",
            ),
            (
                Some(from_annotation),
                None,
                "a..shop",
                RequestSource::Istio,
                dns,
                "gave \"a..shop\"",
            ),
            (
                Some(from_annotation),
                None,
                "",
                RequestSource::Pcr,
                dns,
                "gave \"\", which is not a DNS name",
            ),
            (
                Some(from_annotation),
                None,
                many.as_str(),
                RequestSource::Pcr,
                dns,
                "more than 16 distinct names",
            ),
            (
                Some("request.annotations['missing'].split(',')"),
                None,
                "a.shop",
                RequestSource::Pcr,
                dns,
                "output dns_names failed: ",
            ),
            (
                Some("[request.annotations['podca.dev/dns-names'], 1]"),
                None,
                "a.shop",
                RequestSource::Pcr,
                dns,
                "a list holding int, not only strings",
            ),
            (
                // Mixed branches are a load error now; a dyn list still reaches run time.
                Some("[['a'], 'b'][request.annotations['podca.dev/dns-names'] == 'x' ? 0 : 1]"),
                None,
                "a.shop",
                RequestSource::Pcr,
                dns,
                "gave string, not a list of strings",
            ),
            (
                None,
                Some("0"),
                "a.shop",
                RequestSource::Pcr,
                cap,
                "gave 0; a certificate's lifetime cap must be at least 3600 seconds",
            ),
            (
                None,
                Some("-3600"),
                "a.shop",
                RequestSource::Grpc,
                cap,
                "gave -3600;",
            ),
            (
                None,
                Some("1800"),
                "a.shop",
                RequestSource::Istio,
                cap,
                "gave 1800; a certificate's",
            ),
            (
                None,
                Some("0"),
                "a.shop",
                RequestSource::Jwt,
                cap,
                "gave 0; a JWT-SVID's lifetime cap must be at least 1 seconds",
            ),
            (
                None,
                Some("int(request.annotations['podca.dev/dns-names'])"),
                "a.shop",
                RequestSource::Pcr,
                cap,
                "output max_lifetime_seconds failed: ",
            ),
            (
                None,
                Some("[1, 'b'][request.annotations['podca.dev/dns-names'] == 'x' ? 0 : 1]"),
                "a.shop",
                RequestSource::Pcr,
                cap,
                "gave string, not an int",
            ),
        ] {
            let rules = with_outputs(dns_names, max_lifetime);
            let output = if dns_names.is_some() {
                "dns_names"
            } else {
                "max_lifetime_seconds"
            };
            let before = errors(&rules, output);
            let a = annotations(annotation);
            let d = rules
                .decide(&RuleFacts {
                    source,
                    ..facts(&a, &[], None)
                })
                .expect_err(want);
            assert_eq!((d.reason, d.error), (reason, true), "{want}");
            assert_eq!(d.rule, format!("outputs.{output}"));
            assert!(
                d.message.contains(want),
                "{:?} should contain {want:?}",
                d.message
            );
            assert_eq!(errors(&rules, output), before + 1, "{want}: counted");
        }
        // Duplicates are dropped before the count.
        let rules = with_outputs(Some(from_annotation), None);
        let a = annotations(&sixteen_twice);
        assert_eq!(
            rules
                .decide(&facts(&a, &[], None))
                .map(|o| o.dns_names.map(|n| n.len())),
            Ok(Some(MAX_OUTPUT_DNS_NAMES))
        );
        // Oversized input: an output-only set denies with the output's reason.
        let big: BTreeMap<String, String> = (0..=MAX_COLLECTION_ENTRIES)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        let only_cap = RuleSet::compile_with_outputs(
            &[],
            &OutputSpec {
                dns_names: None,
                max_lifetime_seconds: Some("7200".into()),
            },
        )
        .unwrap();
        let d = only_cap
            .decide(&facts(&big, &[], None))
            .expect_err("oversized");
        assert_eq!(d.reason, cap);
        assert!(d.message.contains("at most 256"), "{}", d.message);
    }

    #[test]
    fn output_compile_errors_name_the_output_and_the_position() {
        let compile = |dns_names: Option<&str>, cap: Option<&str>| {
            RuleSet::compile_with_outputs(
                &[],
                &OutputSpec {
                    dns_names: dns_names.map(Into::into),
                    max_lifetime_seconds: cap.map(Into::into),
                },
            )
            .expect_err("must not compile")
            .to_string()
        };
        for (got, want) in [
            (
                compile(Some("request.namespace"), None),
                "outputs.dns_names at 1:8: gives string, want list(string)",
            ),
            (
                compile(Some("[1, 2]"), None),
                "outputs.dns_names at 1:1: gives list(int), want list(string)",
            ),
            (
                compile(None, Some("'3600'")),
                "outputs.max_lifetime_seconds at 1:1: gives string, want int",
            ),
            (
                compile(None, Some("3600 +")),
                "outputs.max_lifetime_seconds at 1:7: syntax error",
            ),
            (
                compile(Some("[requst.namespace]"), None),
                "outputs.dns_names at 1:2: unknown variable \"requst\"",
            ),
            (
                compile(Some("request.namespace.split(1)"), None),
                "outputs.dns_names at 1:24: split() takes a string here, not an int",
            ),
            (
                compile(Some("[request.namespace.trim('x')]"), None),
                "trim() takes 0 arguments, not 1",
            ),
            (
                compile(Some("request.namespace.split(',', 1, 2)"), None),
                "split() takes 1 or 2 arguments, not 3",
            ),
            (
                compile(Some("split(request.namespace, ',')"), None),
                "outputs.dns_names at 1:6: split() is a method",
            ),
            (
                compile(None, Some("request.audiences.join(',')")),
                "gives string, want int",
            ),
            (
                compile(None, Some("request.namespace.join(',')")),
                "join() is a list method, not string's",
            ),
        ] {
            assert!(got.contains(want), "{got:?} should contain {want:?}");
        }
        // A list the inference cannot type is accepted and checked at evaluation.
        assert!(
            RuleSet::compile_with_outputs(
                &[],
                &OutputSpec {
                    dns_names: Some("[]".into()),
                    max_lifetime_seconds: None
                }
            )
            .is_ok()
        );
    }

    #[test]
    fn string_extension_functions_work_and_are_typed() {
        let empty = BTreeMap::new();
        for expr in [
            "'a,b'.split(',') == ['a', 'b']",
            "'a,b,c'.split(',', 2) == ['a', 'b,c']",
            "['a', 'b'].join('.') == 'a.b'",
            "['a', 'b'].join() == 'ab'",
            "'AbC'.lowerAscii() == 'abc'",
            "'abc'.upperAscii() == 'ABC'",
            "' a '.trim() == 'a'",
            "'a.b'.replace('.', '-') == 'a-b'",
            "'shop'.substring(1, 3) == 'ho'",
            "'shop'.charAt(0) == 's'",
            "'shop'.indexOf('o') == 2",
            "'a.b.c'.lastIndexOf('.') == 3",
            "'abc'.reverse() == 'cba'",
            "request.namespace.split('o').size() == 2",
        ] {
            let rules =
                RuleSet::compile(&[spec("f", expr)]).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert!(
                rules
                    .evaluate(&facts(&empty, &[], None))
                    .is_err_and(|d| !d.error),
                "{expr} should be true"
            );
        }
        // Their result types are known at load.
        for (expr, want) in [
            ("'a'.split(',')", "gives list(string), want bool"),
            ("'a'.lowerAscii()", "gives string, want bool"),
            ("'a'.indexOf('a')", "gives int, want bool"),
            ("['a'].join(',')", "gives string, want bool"),
        ] {
            let e = compile_err(&[spec("t", expr)]).to_string();
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    #[test]
    fn reasons_are_checked_and_interned() {
        for ok in ["A", "PolicyDenied", "Team:Shop", "a_b,c"] {
            assert!(is_condition_reason(ok), "{ok}");
        }
        for bad in ["", "9a", "a-b", "a:", "a b", &"a".repeat(1025)] {
            assert!(!is_condition_reason(bad), "{bad}");
        }
        assert!(std::ptr::eq(
            intern_reason("SameText"),
            intern_reason("SameText")
        ));
    }
}
