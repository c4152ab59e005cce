//! PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch (with
//! `conditions` as a list-map keyed by `type`), JSON patch (RFC 6902) and
//! server-side apply (merged like a strategic merge patch).

use serde_json::{Map, Value};

/// JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(pm) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(tm) = target {
                for (k, pv) in pm {
                    if pv.is_null() {
                        tm.remove(k);
                    } else {
                        let entry = tm.entry(k.clone()).or_insert(Value::Null);
                        merge_patch(entry, pv);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// List-map keys known to the emulator (field name → merge key).
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "containers" | "initContainers" | "volumes" | "ports" | "env" => Some("name"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

/// Strategic merge patch.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(pm) = patch else {
        *target = patch.clone();
        return;
    };
    if pm.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = pm.clone();
        p.remove("$patch");
        *target = Value::Object(p);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(tm) = target else {
        return;
    };
    for (k, pv) in pm {
        if k.starts_with('$') {
            continue;
        }
        if pv.is_null() {
            tm.remove(k);
            continue;
        }
        match (merge_key(k), pv) {
            (Some(mk), Value::Array(items)) => {
                let cur = tm.entry(k.clone()).or_insert_with(|| Value::Array(vec![]));
                if !cur.is_array() {
                    *cur = Value::Array(vec![]);
                }
                if let Value::Array(list) = cur {
                    for item in items {
                        let key = item.get(mk).cloned();
                        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                        let pos = key
                            .as_ref()
                            .and_then(|kv| list.iter().position(|e| e.get(mk) == Some(kv)));
                        match (pos, delete) {
                            (Some(i), true) => {
                                list.remove(i);
                            }
                            (None, true) => {}
                            (Some(i), false) => strategic_merge(&mut list[i], item),
                            (None, false) => {
                                let mut fresh = Value::Object(Map::new());
                                strategic_merge(&mut fresh, item);
                                list.push(fresh);
                            }
                        }
                    }
                }
            }
            (_, Value::Object(_)) => {
                let entry = tm.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(entry, pv);
            }
            _ => {
                tm.insert(k.clone(), pv.clone());
            }
        }
    }
}

fn unescape(tok: &str) -> String {
    tok.replace("~1", "/").replace("~0", "~")
}

fn pointer_parts(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(vec![]);
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!("invalid JSON pointer {path:?}"));
    };
    Ok(rest.split('/').map(unescape).collect())
}

fn parent_mut<'a>(doc: &'a mut Value, parts: &[String]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for p in parts {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(p)
                .ok_or_else(|| format!("missing path element {p:?}"))?,
            Value::Array(a) => {
                let i: usize = p.parse().map_err(|_| format!("invalid index {p:?}"))?;
                a.get_mut(i)
                    .ok_or_else(|| format!("index {i} out of range"))?
            }
            _ => return Err(format!("cannot descend into {p:?}")),
        };
    }
    Ok(cur)
}

fn add(doc: &mut Value, path: &str, val: Value) -> Result<(), String> {
    let parts = pointer_parts(path)?;
    let Some((last, init)) = parts.split_last() else {
        *doc = val;
        return Ok(());
    };
    match parent_mut(doc, init)? {
        Value::Object(m) => {
            m.insert(last.clone(), val);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(val);
                return Ok(());
            }
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid index {last:?}"))?;
            if i > a.len() {
                return Err(format!("index {i} out of range"));
            }
            a.insert(i, val);
            Ok(())
        }
        _ => Err(format!("cannot add at {path:?}")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let parts = pointer_parts(path)?;
    let Some((last, init)) = parts.split_last() else {
        return Err("cannot remove the root".into());
    };
    match parent_mut(doc, init)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("path {path:?} does not exist")),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid index {last:?}"))?;
            if i >= a.len() {
                return Err(format!("index {i} out of range"));
            }
            Ok(a.remove(i))
        }
        _ => Err(format!("cannot remove {path:?}")),
    }
}

fn get<'a>(doc: &'a Value, path: &str) -> Result<&'a Value, String> {
    let parts = pointer_parts(path)?;
    let mut cur = doc;
    for p in &parts {
        cur = match cur {
            Value::Object(m) => m
                .get(p)
                .ok_or_else(|| format!("path {path:?} does not exist"))?,
            Value::Array(a) => {
                let i: usize = p.parse().map_err(|_| format!("invalid index {p:?}"))?;
                a.get(i).ok_or_else(|| format!("index {i} out of range"))?
            }
            _ => return Err(format!("path {path:?} does not exist")),
        };
    }
    Ok(cur)
}

/// JSON patch (RFC 6902).
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let Value::Array(ops) = ops else {
        return Err("json patch must be an array of operations".into());
    };
    for op in ops {
        let name = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op.get("path").and_then(Value::as_str).unwrap_or("");
        match name {
            "add" => add(doc, path, op.get("value").cloned().unwrap_or(Value::Null))?,
            "remove" => {
                remove(doc, path)?;
            }
            "replace" => {
                remove(doc, path)?;
                add(doc, path, op.get("value").cloned().unwrap_or(Value::Null))?;
            }
            "move" => {
                let from = op.get("from").and_then(Value::as_str).unwrap_or("");
                let v = remove(doc, from)?;
                add(doc, path, v)?;
            }
            "copy" => {
                let from = op.get("from").and_then(Value::as_str).unwrap_or("");
                let v = get(doc, from)?.clone();
                add(doc, path, v)?;
            }
            "test" => {
                let want = op.get("value").cloned().unwrap_or(Value::Null);
                if *get(doc, path)? != want {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => return Err(format!("Unexpected kind: {other}")),
        }
    }
    Ok(())
}

/// Parse an apply-patch YAML (or JSON) document into JSON.
pub fn parse_apply_yaml(body: &[u8]) -> Result<Value, String> {
    let v: serde_yaml::Value = serde_yaml::from_slice(body).map_err(|e| e.to_string())?;
    serde_json::to_value(v).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge() {
        let mut t = json!({"a": 1, "b": {"c": 2}});
        merge_patch(&mut t, &json!({"a": null, "b": {"d": 3}}));
        assert_eq!(t, json!({"b": {"c": 2, "d": 3}}));
    }

    #[test]
    fn strategic_conditions() {
        let mut t = json!({"status": {"conditions": [{"type": "A", "status": "True"}]}});
        strategic_merge(
            &mut t,
            &json!({"status": {"conditions": [{"type": "B", "status": "True"}]}}),
        );
        assert_eq!(t["status"]["conditions"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn jsonpatch() {
        let mut t = json!({"status": {}});
        json_patch(
            &mut t,
            &json!([{"op": "add", "path": "/status/x", "value": 1}]),
        )
        .unwrap();
        assert_eq!(t, json!({"status": {"x": 1}}));
        assert!(
            json_patch(
                &mut t,
                &json!([{"op": "test", "path": "/status/x", "value": 2}])
            )
            .is_err()
        );
    }
}
