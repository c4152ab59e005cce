//! Field and label selectors.

use super::resources::Res;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    In,
    NotIn,
    Exists,
    NotExists,
}

#[derive(Debug, Clone)]
struct Req {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A parsed label selector.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector {
    reqs: Vec<Req>,
}

fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
            }
            c => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let set = |p: &str, kw: &str| -> Option<(String, Vec<String>)> {
                let idx = p.find(kw)?;
                let key = p[..idx].trim().to_string();
                let rest = p[idx + kw.len()..].trim();
                let inner = rest.strip_prefix('(')?.strip_suffix(')')?;
                Some((
                    key,
                    inner.split(',').map(|v| v.trim().to_string()).collect(),
                ))
            };
            if let Some((key, values)) = set(p, " notin ") {
                reqs.push(Req {
                    key,
                    op: Op::NotIn,
                    values,
                });
            } else if let Some((key, values)) = set(p, " in ") {
                reqs.push(Req {
                    key,
                    op: Op::In,
                    values,
                });
            } else if let Some((k, v)) = p.split_once("!=") {
                reqs.push(Req {
                    key: k.trim().into(),
                    op: Op::Ne,
                    values: vec![v.trim().into()],
                });
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                reqs.push(Req {
                    key: k.trim().into(),
                    op: Op::Eq,
                    values: vec![v.trim().into()],
                });
            } else if let Some(k) = p.strip_prefix('!') {
                reqs.push(Req {
                    key: k.trim().into(),
                    op: Op::NotExists,
                    values: vec![],
                });
            } else if p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                reqs.push(Req {
                    key: p.into(),
                    op: Op::Exists,
                    values: vec![],
                });
            } else {
                return Err(format!("unable to parse requirement: {p}"));
            }
        }
        Ok(Self { reqs })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        self.reqs.iter().all(|r| {
            let v = labels.and_then(|l| l.get(&r.key)).and_then(Value::as_str);
            match r.op {
                Op::Eq | Op::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                Op::Ne | Op::NotIn => v.is_none_or(|v| !r.values.iter().any(|x| x == v)),
                Op::Exists => v.is_some(),
                Op::NotExists => v.is_none(),
            }
        })
    }
}

/// A parsed field selector (`a=b`, `a==b`, `a!=b`, comma-joined).
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(s: &str, res: Res) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for p in s.split(',') {
            let p = p.trim();
            if p.is_empty() {
                continue;
            }
            let (k, eq, v) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                (k, true, v)
            } else {
                return Err(format!("invalid selector: '{p}'; can't understand '{p}'"));
            };
            let k = k.trim();
            if !res.field_labels().contains(&k) {
                return Err(format!("field label not supported: {k}"));
            }
            reqs.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(Self { reqs })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(k, eq, v)| {
            let mut cur = Some(obj);
            for seg in k.split('.') {
                cur = cur.and_then(|c| c.get(seg));
            }
            let actual = cur.and_then(Value::as_str).unwrap_or("");
            (actual == v) == *eq
        })
    }

    /// The value required for `key` by an equality requirement, if any.
    pub fn required(&self, key: &str) -> Option<&str> {
        self.reqs
            .iter()
            .find(|(k, eq, _)| k == key && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        assert!(LabelSelector::parse("a=1").unwrap().matches(&o));
        assert!(!LabelSelector::parse("a=2").unwrap().matches(&o));
        assert!(LabelSelector::parse("a in (1,3),b").unwrap().matches(&o));
        assert!(LabelSelector::parse("c notin (1),!d").unwrap().matches(&o));
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "x"}, "spec": {"signerName": "a/b"}});
        assert!(
            FieldSelector::parse("spec.signerName=a/b", Res::Pcr)
                .unwrap()
                .matches(&o)
        );
        assert!(FieldSelector::parse("spec.bogus=1", Res::Pcr).is_err());
    }
}
