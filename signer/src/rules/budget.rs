//! The run-time budget of rules: the `cel` crate has no evaluation budget, so the inputs are
//! bounded instead. The static estimate (`estimate_cost`) bounds how many nodes an expression
//! visits per element of a collection; this bounds how long each string it can visit is.
//!
//! At load, [`StringReads::of`] finds the strings an expression can read from the unverified
//! maps (`request.annotations`, `pod.annotations`, the labels, `request.audiences`): the values
//! of the literal keys it indexes, or every value when it walks or passes on the whole map.
//! Before a request's rules run, [`StringReads::oversized`] names the first such string longer
//! than [`MAX_RULE_STRING_BYTES`], and the request is denied without evaluating anything. A
//! large annotation no rule reads (say `kubectl.kubernetes.io/last-applied-configuration`)
//! denies nothing.

use std::collections::BTreeMap;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators as op};

use super::RuleFacts;
use super::facts::{FactRef, Slot};

/// The longest string value a rule, message or output may read, in bytes (16 DNS names of 253
/// bytes and their commas fit: the most the `dns_names` output gives). Longer values a rule
/// reads deny the request before evaluation (`PolicyRuleFailed:<rule>`); a split of one gives
/// at most 4,097 elements, and each step of a walk over it touches at most this many bytes.
pub const MAX_RULE_STRING_BYTES: usize = 4096;

/// The maps and lists of strings whose values are bounded only here.
const STRING_COLLECTIONS: [Slot; 5] = [
    Slot::Annotations,
    Slot::Audiences,
    Slot::Labels,
    Slot::PodLabels,
    Slot::PodAnnotations,
];

/// Which unverified strings an expression can read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct StringReads {
    /// Values read by a literal key: `request.annotations['k']`, `pod.labels.app`.
    keys: Vec<(Slot, String)>,
    /// Collections read whole (walked, sized, compared or passed on), as [`Slot::bit`]s.
    whole: u32,
}

fn slot_name(slot: Slot) -> &'static str {
    match slot {
        Slot::Annotations => "request.annotations",
        Slot::Audiences => "request.audiences",
        Slot::Labels => "namespaceObject.metadata.labels",
        Slot::PodLabels => "pod.labels",
        Slot::PodAnnotations => "pod.annotations",
        _ => "a fact",
    }
}

/// The collection `e` denotes, when it is one of [`STRING_COLLECTIONS`] spelled out.
fn collection(e: &IdedExpr) -> Option<Slot> {
    let Expr::Select(s) = &e.expr else {
        return None;
    };
    if s.test {
        return None;
    }
    let ident = |e: &IdedExpr, name: &str| matches!(&e.expr, Expr::Ident(n) if n == name);
    match s.field.as_str() {
        "annotations" if ident(&s.operand, "request") => Some(Slot::Annotations),
        "audiences" if ident(&s.operand, "request") => Some(Slot::Audiences),
        "labels" if ident(&s.operand, "pod") => Some(Slot::PodLabels),
        "annotations" if ident(&s.operand, "pod") => Some(Slot::PodAnnotations),
        "labels" => match &s.operand.expr {
            Expr::Select(m) if !m.test && m.field == "metadata" => {
                ident(&m.operand, "namespaceObject").then_some(Slot::Labels)
            }
            _ => None,
        },
        _ => None,
    }
}

/// `request`, `request.pod`, `namespaceObject.metadata`, …: a path of podca's objects.
fn is_object_path(e: &IdedExpr) -> bool {
    match &e.expr {
        Expr::Ident(n) => matches!(n.as_str(), "request" | "pod" | "namespaceObject"),
        Expr::Select(s) => is_object_path(&s.operand),
        _ => false,
    }
}

impl StringReads {
    /// The reads of one parsed expression.
    pub(super) fn of(e: &IdedExpr) -> Self {
        let mut reads = StringReads::default();
        reads.walk(e);
        reads
    }

    /// Adds `other`'s reads (a rule's condition and its message).
    pub(super) fn extend(&mut self, other: StringReads) {
        self.keys.extend(other.keys);
        self.whole |= other.whole;
    }

    fn walk(&mut self, e: &IdedExpr) {
        if let Some(slot) = collection(e) {
            self.whole |= slot.bit();
            return;
        }
        match &e.expr {
            Expr::Unspecified | Expr::Literal(_) => {}
            // A whole object: every collection under it.
            Expr::Ident(name) => match name.as_str() {
                "request" => self.whole |= Slot::Annotations.bit() | Slot::Audiences.bit(),
                "pod" => self.whole |= Slot::PodLabels.bit() | Slot::PodAnnotations.bit(),
                "namespaceObject" => self.whole |= Slot::Labels.bit(),
                _ => {}
            },
            Expr::Select(s) => match collection(&s.operand) {
                // `has(pod.labels.app)` reads no value.
                Some(_) if s.test => {}
                Some(slot) => self.keys.push((slot, s.field.clone())),
                // `request.namespace`, `has(request.annotations)`: names kube-apiserver or
                // the token bounds, or no value at all.
                None if is_object_path(&s.operand) => {}
                None => self.walk(&s.operand),
            },
            Expr::Call(c) => {
                if let [map, key] = c.args.as_slice()
                    && c.func_name == op::INDEX
                    && let Some(slot) = collection(map)
                    && slot != Slot::Audiences
                    && let Expr::Literal(LiteralValue::String(k)) = &key.expr
                {
                    self.keys.push((slot, k.to_string()));
                    return;
                }
                // `'k' in pod.labels` reads keys only, which the API bounds.
                if let [needle, map] = c.args.as_slice()
                    && c.func_name == op::IN
                    && collection(map).is_some_and(|s| s != Slot::Audiences)
                {
                    self.walk(needle);
                    return;
                }
                if let Some(t) = &c.target {
                    self.walk(t);
                }
                c.args.iter().for_each(|a| self.walk(a));
            }
            Expr::List(l) => l.elements.iter().for_each(|x| self.walk(x)),
            Expr::Map(m) => m.entries.iter().for_each(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => {
                    self.walk(&m.key);
                    self.walk(&m.value);
                }
                EntryExpr::StructField(f) => self.walk(&f.value),
            }),
            Expr::Struct(s) => s.entries.iter().for_each(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => {
                    self.walk(&m.key);
                    self.walk(&m.value);
                }
                EntryExpr::StructField(f) => self.walk(&f.value),
            }),
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

    /// The first string these reads would reach that is longer than
    /// [`MAX_RULE_STRING_BYTES`], described for a denial.
    pub(super) fn oversized(&self, facts: &RuleFacts<'_>) -> Option<String> {
        let too_long = |slot: Slot, key: &str, value: &str| {
            (value.len() > MAX_RULE_STRING_BYTES).then(|| {
                format!(
                    "{}[{key:?}] is {} bytes; rules read strings of at most \
                     {MAX_RULE_STRING_BYTES} bytes",
                    slot_name(slot),
                    value.len()
                )
            })
        };
        for (slot, key) in &self.keys {
            if let FactRef::Map(map) = facts.fact(*slot)
                && let Some(value) = map.get(key)
                && let Some(why) = too_long(*slot, key, value)
            {
                return Some(why);
            }
        }
        for slot in STRING_COLLECTIONS {
            if self.whole & slot.bit() == 0 {
                continue;
            }
            let found = match facts.fact(slot) {
                FactRef::Map(map) => first_oversized(map, |k, v| too_long(slot, k, v)),
                FactRef::List(list) => list
                    .iter()
                    .enumerate()
                    .find_map(|(i, v)| too_long(slot, &i.to_string(), v)),
                FactRef::Str(_) | FactRef::Int(_) => None,
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }
}

fn first_oversized(
    map: &BTreeMap<String, String>,
    too_long: impl Fn(&str, &str) -> Option<String>,
) -> Option<String> {
    map.iter().find_map(|(k, v)| too_long(k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(source: &str) -> StringReads {
        let parsed = super::super::env()
            .parser()
            .parse(source)
            .expect("a valid expression");
        StringReads::of(&parsed)
    }

    fn keys(r: &StringReads) -> Vec<(&'static str, &str)> {
        r.keys
            .iter()
            .map(|(s, k)| (slot_name(*s), k.as_str()))
            .collect()
    }

    #[test]
    fn literal_keys_are_read_alone_and_walks_read_everything() {
        let r = reads("pod.annotations['a'].split(',').size() > 1 && pod.labels.app == 'x'");
        assert_eq!(keys(&r), [("pod.annotations", "a"), ("pod.labels", "app")]);
        assert_eq!(r.whole, 0);
        let r = reads("'team' in request.annotations && has(pod.labels.app)");
        assert_eq!((keys(&r), r.whole), (vec![], 0));
        let r = reads("request.namespace == 'a' && request.pod.name != ''");
        assert_eq!((keys(&r), r.whole), (vec![], 0));
        for (source, slot) in [
            ("pod.annotations.exists(k, k == 'a')", Slot::PodAnnotations),
            ("request.annotations.size() > 0", Slot::Annotations),
            ("'a' in request.audiences", Slot::Audiences),
            (
                "namespaceObject.metadata.labels[request.namespace] == 'x'",
                Slot::Labels,
            ),
            ("[pod][0].labels.app == 'x'", Slot::PodLabels),
        ] {
            let r = reads(source);
            assert!(r.whole & slot.bit() != 0, "{source}: {r:?}");
        }
    }
}

#[cfg(test)]
mod evaluation {
    use super::super::*;
    use std::time::{Duration, Instant};

    fn facts<'a>(pod: &'a PodMetadata, empty: &'a BTreeMap<String, String>) -> RuleFacts<'a> {
        RuleFacts {
            source: RequestSource::Pcr,
            signer_name: "example.com/s",
            namespace: "shop",
            service_account: "cart",
            pod_name: Some("cart-7d9"),
            pod_uid: Some("1f0c"),
            node_name: Some("node-a"),
            key_type: Some("ECDSAP256"),
            requested_lifetime_seconds: None,
            annotations: empty,
            audiences: &[],
            namespace_labels: None,
            pod: Some(pod),
            now: 1_800_000_000,
        }
    }

    fn require(source: &str) -> Result<RuleSet, RuleError> {
        RuleSet::compile(&[RuleSpec {
            name: "tickets".into(),
            deny: None,
            require: Some(source.into()),
            reason: "TicketRequired".into(),
            message: None,
        }])
    }

    fn pod(annotations: &[(&str, String)]) -> PodMetadata {
        PodMetadata {
            labels: BTreeMap::new(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn a_256_kib_annotation_a_rule_splits_is_denied_before_evaluation() {
        let rules = require("pod.annotations['tickets'].split(',').all(t, t.startsWith('T-'))")
            .expect("compiles");
        let empty = BTreeMap::new();
        let huge = pod(&[("tickets", "T-1,".repeat(64 * 1024))]);
        let denial = rules
            .evaluate(&facts(&huge, &empty))
            .expect_err("an oversized value a rule reads denies");
        assert_eq!(denial.reason, "PolicyRuleFailed:tickets");
        assert_eq!(
            denial.message,
            "rule \"tickets\" was not evaluated: pod.annotations[\"tickets\"] is 262144 bytes; \
             rules read strings of at most 4096 bytes (denied: rules fail closed)"
        );
        assert!(denial.error);
        // At the cap it is evaluated; a large annotation no rule reads changes nothing.
        let at_cap = "T-1,".repeat(MAX_RULE_STRING_BYTES / 4 - 1) + "T-12";
        assert_eq!(at_cap.len(), MAX_RULE_STRING_BYTES);
        let fine = pod(&[
            ("tickets", at_cap),
            (
                "kubectl.kubernetes.io/last-applied-configuration",
                "x".repeat(200 * 1024),
            ),
        ]);
        assert_eq!(
            rules.evaluate(&facts(&fine, &empty)).map_err(|d| d.message),
            Ok(())
        );
        // A rule that walks the whole map reads every value.
        let walker = require("pod.annotations.all(k, pod.annotations[k].size() < 300000)")
            .expect("compiles");
        let denial = walker
            .evaluate(&facts(&fine, &empty))
            .expect_err("the walk would reach the large value");
        assert!(
            denial.message.contains(
                "pod.annotations[\"kubectl.kubernetes.io/last-applied-configuration\"] is \
                 204800 bytes"
            ),
            "{}",
            denial.message
        );
    }

    #[test]
    fn an_oversized_value_an_output_reads_denies_with_the_output() {
        let outputs = OutputSpec {
            dns_names: Some("request.annotations['podca.dev/dns-names'].split(',')".into()),
            max_lifetime_seconds: None,
        };
        let rules = RuleSet::compile_with_outputs(&[], &outputs).expect("compiles");
        let names = BTreeMap::from([(
            "podca.dev/dns-names".to_owned(),
            "a.example.com,".repeat(1000),
        )]);
        let nobody = PodMetadata::default();
        let denial = rules
            .decide(&facts(&nobody, &names))
            .expect_err("14,000 bytes is over the cap");
        assert_eq!(denial.reason, "PolicyOutputInvalid:dns_names");
        assert!(
            denial
                .message
                .starts_with("output dns_names was not evaluated: request.annotations"),
            "{}",
            denial.message
        );
    }

    /// The costliest rule found that the static estimate still allows, over strings at the cap:
    /// each element of a split walks and copies the whole string (quadratic in its length),
    /// repeated as often as the estimate allows. docs/policy.md states the time.
    #[test]
    fn the_worst_rule_allowed_over_strings_at_the_cap_runs_in_bounded_time() {
        let body = "pod.annotations['s'].split('').all(x, pod.annotations['s'].replace(x, 'bb').size() > 0)";
        let mut accepted = None;
        for n in 1.. {
            let source = vec![body; n].join(" && ");
            match require(&source) {
                Ok(rules) => accepted = Some((n, rules)),
                Err(e) => {
                    assert!(e.to_string().contains("estimated cost"), "{e}");
                    break;
                }
            }
        }
        let (n, rules) = accepted.expect("one comprehension is allowed");
        assert!(n >= 2, "{n}");
        let empty = BTreeMap::new();
        let worst = pod(&[("s", "a".repeat(MAX_RULE_STRING_BYTES))]);
        // Freshly compiled rules remember nothing: each evaluation below is a real one.
        let start = Instant::now();
        let decided = rules.evaluate(&facts(&worst, &empty));
        let took = start.elapsed();
        assert_eq!(decided.map_err(|d| d.message), Ok(()));
        println!("{n} comprehensions over {MAX_RULE_STRING_BYTES} bytes: {took:?}");
        // For comparison, the usual shape: split, then check each part (linear).
        let linear =
            require("pod.annotations['s'].split('').all(x, x.startsWith('a'))").expect("compiles");
        let start = Instant::now();
        let decided = linear.evaluate(&facts(&worst, &empty));
        let linear_took = start.elapsed();
        assert_eq!(decided.map_err(|d| d.message), Ok(()));
        println!("one split-and-check over {MAX_RULE_STRING_BYTES} bytes: {linear_took:?}");
        // Unoptimised build on a shared machine: generous, yet far below what a 256 KiB value
        // would take (about 4,000 times the work).
        assert!(took < Duration::from_secs(20), "{took:?}");
    }
}
