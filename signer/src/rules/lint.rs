//! What `podca policy lint` says of a configuration's rules, beyond the loader's first error:
//! every rule that does not compile, and warnings worth knowing about rules that do (a rule
//! that trusts the workload-written annotations, a rule that reads no fact at all).

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

use super::{RuleSet, RuleSpec, line_column};
use crate::SignerPolicy;

/// Every error of one signer's policy: the loader's ([`SignerPolicy::validate`], which stops
/// at the first) and, each rule compiled on its own, every rule that does not compile.
pub fn signer_errors(policy: &SignerPolicy) -> Vec<String> {
    let mut errors: Vec<String> = policy
        .rules
        .iter()
        .enumerate()
        .filter_map(|(i, rule)| {
            RuleSet::compile(std::slice::from_ref(rule))
                .err()
                .map(|mut e| {
                    if e.rule.starts_with('#') {
                        e.rule = format!("#{}", i + 1);
                    }
                    e.to_string()
                })
        })
        .collect();
    if let Err(e) = policy.validate() {
        let text = match e {
            crate::policy::PolicyError::Rule(r) => r.to_string(),
            other => other.to_string(),
        };
        if !errors.contains(&text) {
            errors.insert(0, text);
        }
    }
    errors
}

/// Warnings worth knowing about one rule that parses (a rule that does not is an error).
/// Every warning of a signer's policy: each rule's ([`rule_warnings`]) and each annotation key
/// a rule or output reads that the signer does not declare (such an expression only ever sees
/// the key absent: the request is denied before policy if it carries it).
pub fn policy_warnings(policy: &crate::policy::SignerPolicy) -> Vec<String> {
    let mut warnings: Vec<String> = policy.rules.iter().flat_map(rule_warnings).collect();
    for (rule, key) in policy.undeclared_annotation_reads() {
        warnings.push(format!(
            "{rule:?} reads the annotation {key:?}, which this signer does not declare \
             (`annotations`): a request carrying it is denied before the rules run"
        ));
    }
    warnings
}

pub fn rule_warnings(rule: &RuleSpec) -> Vec<String> {
    let mut warnings = Vec::new();
    let (field, source) = match (&rule.deny, &rule.require) {
        (Some(d), None) => ("deny", d),
        (None, Some(r)) => ("require", r),
        _ => return warnings,
    };
    let parser = cel::Env::stdlib().with_optional_support(false).parser();
    let Ok((expr, info)) = parser.parse_with_source_info(source) else {
        return warnings;
    };
    let mut facts = FactUse::default();
    facts.walk(&expr);
    if let Some(id) = facts.annotations {
        let at = info
            .offset_for(id)
            .map(|(start, _)| {
                let (l, c) = line_column(source, start as usize);
                format!(" at {field} {l}:{c}")
            })
            .unwrap_or_default();
        warnings.push(format!(
            "rule {:?}{at}: reads request.annotations, which the workload writes (a PCR's \
             unverifiedUserAnnotations, podca.v1 user_annotations): nothing verified them, so \
             a rule must not trust them to allow",
            rule.name
        ));
    }
    if !facts.reads_any {
        let value = cel::Value::resolve(&expr, &cel::Context::default());
        let denies_all = match value {
            Ok(cel::Value::Bool(b)) => Some(b == (field == "deny")),
            _ => None,
        };
        let effect = match denies_all {
            Some(true) => "denies every request",
            Some(false) => "never denies",
            None => "gives the same answer for every request",
        };
        warnings.push(format!(
            "rule {:?} ({field}): reads no request fact (request, namespaceObject, pod, now): it is \
             constant and {effect}",
            rule.name
        ));
    }
    warnings
}

/// Which facts an expression reads.
#[derive(Debug, Default)]
struct FactUse {
    /// Whether it reads `request`, `namespaceObject`, `pod` or `now` at all.
    reads_any: bool,
    /// The first `request.annotations` read.
    annotations: Option<u64>,
}

impl FactUse {
    fn walk(&mut self, e: &IdedExpr) {
        match &e.expr {
            Expr::Unspecified | Expr::Literal(_) => {}
            Expr::Ident(name) => {
                if matches!(name.as_str(), "request" | "namespaceObject" | "pod" | "now") {
                    self.reads_any = true;
                }
            }
            Expr::Select(s) => {
                if s.field == "annotations"
                    && matches!(&s.operand.expr, Expr::Ident(n) if n == "request")
                    && self.annotations.is_none()
                {
                    self.annotations = Some(e.id);
                }
                self.walk(&s.operand);
            }
            Expr::List(l) => l.elements.iter().for_each(|x| self.walk(x)),
            Expr::Map(m) => m.entries.iter().for_each(|entry| self.entry(&entry.expr)),
            Expr::Struct(s) => s.entries.iter().for_each(|entry| self.entry(&entry.expr)),
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    self.walk(t);
                }
                c.args.iter().for_each(|x| self.walk(x));
            }
            Expr::Comprehension(c) => {
                for x in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    self.walk(x);
                }
            }
        }
    }

    fn entry(&mut self, entry: &EntryExpr) {
        match entry {
            EntryExpr::MapEntry(m) => {
                self.walk(&m.key);
                self.walk(&m.value);
            }
            EntryExpr::StructField(f) => self.walk(&f.value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, deny: &str) -> RuleSpec {
        RuleSpec {
            name: name.into(),
            deny: Some(deny.into()),
            require: None,
            reason: "Refused".into(),
            message: None,
        }
    }

    #[test]
    fn annotation_reads_and_constant_rules_are_warned_about() {
        let annotations = rule("trusts_annotations", "request.annotations['x'] == 'y'");
        assert_eq!(
            rule_warnings(&annotations),
            [
                "rule \"trusts_annotations\" at deny 1:8: reads request.annotations, which the \
              workload writes (a PCR's unverifiedUserAnnotations, podca.v1 user_annotations): \
              nothing verified them, so a rule must not trust them to allow"
            ]
        );
        assert_eq!(
            rule_warnings(&rule("always", "1 == 1")),
            [
                "rule \"always\" (deny): reads no request fact (request, namespaceObject, pod, now): \
              it is constant and denies every request"
            ]
        );
        assert_eq!(
            rule_warnings(&rule("fine", "request.namespace == 'x'")),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_rule_that_does_not_compile_is_an_error() {
        let mut policy = SignerPolicy::permissive("example.org");
        policy.rules = vec![
            rule("a", "request.nope +"),
            rule("b", "request.namespace == 'x'"),
        ];
        let errors = signer_errors(&policy);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("\"a\""), "{errors:?}");
    }
}
