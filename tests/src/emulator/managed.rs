//! A small model of `metadata.managedFields`: each write records, for its
//! manager, the fields it changed (FieldsV1 shape). This is what makes a
//! main-resource write of a discarded status still change the
//! resourceVersion (vector `pcr-main-resource-status-ignored`).

use serde_json::{Map, Value, json};

const SKIP_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "managedFields",
    "selfLink",
    "generateName",
];

fn list_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        _ => None,
    }
}

/// The FieldsV1 set of fields in `new` that differ from `old`.
pub fn changed_fields(old: Option<&Value>, new: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    let Value::Object(nm) = new else {
        return out;
    };
    for (k, nv) in nm {
        if k == "apiVersion" || k == "kind" {
            continue;
        }
        let ov = old.and_then(|o| o.get(k));
        if k == "metadata" {
            let mut meta = Map::new();
            if let Value::Object(mm) = nv {
                for (mk, mv) in mm {
                    if SKIP_META.contains(&mk.as_str()) {
                        continue;
                    }
                    let omv = ov.and_then(|o| o.get(mk));
                    if omv == Some(mv) {
                        continue;
                    }
                    let sub = changed_fields(omv, mv);
                    meta.insert(format!("f:{mk}"), Value::Object(sub));
                }
            }
            if !meta.is_empty() {
                out.insert("f:metadata".into(), Value::Object(meta));
            }
            continue;
        }
        if ov == Some(nv) {
            continue;
        }
        match nv {
            Value::Object(inner) if !inner.is_empty() => {
                let sub = changed_fields(ov, nv);
                if !sub.is_empty() {
                    out.insert(format!("f:{k}"), Value::Object(sub));
                }
            }
            Value::Array(items) if list_key(k).is_some() => {
                let key = list_key(k).unwrap_or("type");
                let mut node = Map::new();
                node.insert(".".into(), json!({}));
                for item in items {
                    let kv = item.get(key).cloned().unwrap_or(Value::Null);
                    let old_item = ov
                        .and_then(Value::as_array)
                        .and_then(|a| a.iter().find(|e| e.get(key) == Some(&kv)));
                    if old_item == Some(item) {
                        continue;
                    }
                    let mut elem = changed_fields(old_item, item);
                    elem.insert(".".into(), json!({}));
                    let mut km = Map::new();
                    km.insert(key.to_string(), kv);
                    node.insert(format!("k:{}", Value::Object(km)), Value::Object(elem));
                }
                out.insert(format!("f:{k}"), Value::Object(node));
            }
            Value::Null => {}
            _ => {
                out.insert(format!("f:{k}"), json!({}));
            }
        }
    }
    out
}

fn union(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (Some(Value::Object(a)), Value::Object(b)) => union(a, b),
            (None, _) => {
                into.insert(k.clone(), v.clone());
            }
            _ => {}
        }
    }
}

/// Record `set` for (manager, operation, subresource) in `obj`'s
/// managedFields. Returns whether managedFields changed.
#[allow(clippy::too_many_arguments)]
pub fn record(
    obj: &mut Value,
    manager: &str,
    operation: &str,
    api_version: &str,
    subresource: Option<&str>,
    set: &Map<String, Value>,
    time: &str,
    replace: bool,
) -> bool {
    if set.is_empty() && !replace {
        return false;
    }
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return false;
    };
    let mf = meta
        .entry("managedFields")
        .or_insert_with(|| Value::Array(vec![]));
    if !mf.is_array() {
        *mf = Value::Array(vec![]);
    }
    let Value::Array(entries) = mf else {
        return false;
    };
    let sub = subresource.unwrap_or("");
    let pos = entries.iter().position(|e| {
        e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some(operation)
            && e.get("subresource").and_then(Value::as_str).unwrap_or("") == sub
    });
    match pos {
        Some(i) => {
            let entry = &mut entries[i];
            let mut fields = entry
                .get("fieldsV1")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let before = fields.clone();
            if replace {
                fields = set.clone();
            } else {
                union(&mut fields, set);
            }
            if fields == before {
                return false;
            }
            entry["fieldsV1"] = Value::Object(fields);
            entry["time"] = json!(time);
            entry["apiVersion"] = json!(api_version);
            true
        }
        None => {
            if set.is_empty() {
                return false;
            }
            let mut e = json!({
                "manager": manager,
                "operation": operation,
                "apiVersion": api_version,
                "time": time,
                "fieldsType": "FieldsV1",
                "fieldsV1": Value::Object(set.clone()),
            });
            if let Some(s) = subresource {
                e["subresource"] = json!(s);
            }
            entries.push(e);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_is_empty() {
        let a = json!({"status": {"x": 1}, "metadata": {"name": "n"}});
        assert!(changed_fields(Some(&a), &a).is_empty());
    }

    #[test]
    fn status_change_is_recorded() {
        let a = json!({"status": {}});
        let b = json!({"status": {"conditions": [{"type": "Issued", "status": "True"}], "notBefore": "x"}});
        let set = changed_fields(Some(&a), &b);
        assert!(
            set["f:status"]["f:conditions"]
                .get("k:{\"type\":\"Issued\"}")
                .is_some()
        );
    }
}
