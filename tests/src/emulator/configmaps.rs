//! ConfigMap validation as kube-apiserver's `ValidateConfigMap` and `ValidateConfigMapUpdate`
//! (pkg/apis/core/validation) do it, with apimachinery's messages: the name is a DNS-1123
//! subdomain; every `data` and `binaryData` key is a config key (`IsConfigMapKey`: at most 253
//! characters of `[-._a-zA-Z0-9]`, not `.` or `..`, not starting with `..`), in one of the two
//! maps only; `data` values are strings; all values together at most 1 MiB (`MaxSecretSize`);
//! and once `immutable: true`, neither the data nor the flag may change.

use serde_json::Value;

use super::errors::FieldError;
use super::names;

/// `core.MaxSecretSize`, which ConfigMaps share.
pub const MAX_SIZE: usize = 1024 * 1024;

const KEY_MSG: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";
const IMMUTABLE_MSG: &str = "field is immutable when `immutable` is set";

/// `validation.IsConfigMapKey`.
pub fn is_config_map_key(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if key.len() > 253 {
        errs.push("must be no more than 253 characters".to_owned());
    }
    if key.is_empty()
        || !key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
    {
        errs.push(KEY_MSG.to_owned());
    }
    if key == "." {
        errs.push("must not be '.'".to_owned());
    } else if key == ".." {
        errs.push("must not be '..'".to_owned());
    } else if key.starts_with("..") {
        errs.push("must not start with '..'".to_owned());
    }
    errs
}

fn map<'a>(obj: &'a Value, field: &str) -> Option<&'a serde_json::Map<String, Value>> {
    obj.get(field).and_then(Value::as_object)
}

/// The errors of a ConfigMap to be stored; `old` is the stored one on an update.
pub fn validate(name: &str, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if old.is_none() {
        for msg in names::name_is_dns_subdomain(name, false) {
            errs.push(FieldError::invalid_str("metadata.name", name, msg));
        }
    }
    if let Some(old) = old
        && old.get("immutable").and_then(Value::as_bool) == Some(true)
    {
        if obj.get("immutable").and_then(Value::as_bool) != Some(true) {
            errs.push(FieldError::forbidden("immutable", IMMUTABLE_MSG));
        }
        for field in ["data", "binaryData"] {
            if map(obj, field) != map(old, field) {
                errs.push(FieldError::forbidden(field, IMMUTABLE_MSG));
            }
        }
    }
    let data = map(obj, "data");
    let binary = map(obj, "binaryData");
    let mut size = 0;
    for (key, value) in data.into_iter().flatten() {
        let path = format!("data[{key}]");
        for msg in is_config_map_key(key) {
            errs.push(FieldError::invalid_str(&path, key, msg));
        }
        if binary.is_some_and(|b| b.contains_key(key)) {
            errs.push(FieldError::invalid_str(
                &path,
                key,
                "duplicate of key present in binaryData",
            ));
        }
        match value.as_str() {
            Some(text) => size += text.len(),
            None => errs.push(FieldError::invalid_raw(
                &path,
                value.to_string(),
                "must be a string",
            )),
        }
    }
    for (key, value) in binary.into_iter().flatten() {
        for msg in is_config_map_key(key) {
            errs.push(FieldError::invalid_str(
                &format!("binaryData[{key}]"),
                key,
                msg,
            ));
        }
        // base64 in JSON: the stored bytes are 3/4 of it.
        size += value.as_str().map_or(0, |b64| b64.len() / 4 * 3);
    }
    if size > MAX_SIZE {
        errs.push(FieldError::too_long("", MAX_SIZE));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.field.as_str()).collect()
    }

    #[test]
    fn keys_follow_is_config_map_key() {
        for good in ["jwks.json", "KEY_NAME", "key-name", ".hidden", "a..b"] {
            assert!(is_config_map_key(good).is_empty(), "{good}");
        }
        assert_eq!(is_config_map_key("a/b"), [KEY_MSG]);
        assert_eq!(is_config_map_key(""), [KEY_MSG]);
        assert_eq!(is_config_map_key("."), ["must not be '.'"]);
        assert_eq!(is_config_map_key(".."), ["must not be '..'"]);
        assert_eq!(is_config_map_key("..x"), ["must not start with '..'"]);
        assert_eq!(
            is_config_map_key(&"k".repeat(254)),
            ["must be no more than 253 characters"]
        );
    }

    #[test]
    fn a_configmap_is_checked_as_kube_apiserver_checks_it() {
        let good = json!({"data": {"jwks.json": "{}"}, "binaryData": {"b.bin": "AAAA"}});
        assert!(validate("podca-jwks", &good, None).is_empty());
        let bad = json!({
            "data": {"a/b": "x", "dup": "y", "n": 1},
            "binaryData": {"dup": "AAAA"},
        });
        assert_eq!(
            fields(&validate("Bad_Name", &bad, None)),
            ["metadata.name", "data[a/b]", "data[dup]", "data[n]"]
        );
        let big = json!({"data": {"a": "x".repeat(MAX_SIZE), "b": "y"}});
        let errs = validate("big", &big, None);
        assert_eq!(errs, [FieldError::too_long("", MAX_SIZE)]);
    }

    #[test]
    fn an_immutable_configmap_keeps_its_data_and_flag() {
        let old = json!({"immutable": true, "data": {"a": "1"}});
        assert!(validate("c", &old.clone(), Some(&old)).is_empty());
        let changed = json!({"immutable": true, "data": {"a": "2"}});
        assert_eq!(fields(&validate("c", &changed, Some(&old))), ["data"]);
        let unset = json!({"data": {"a": "1"}});
        assert_eq!(fields(&validate("c", &unset, Some(&old))), ["immutable"]);
        // A mutable one may change and become immutable.
        let mutable = json!({"data": {"a": "1"}});
        assert!(validate("c", &changed, Some(&mutable)).is_empty());
    }
}
