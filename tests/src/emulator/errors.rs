//! Kubernetes `Status` errors and `field.Error` rendering, formatted the way
//! kube-apiserver formats them (apimachinery `field.Error.ErrorBody`).

use serde_json::{Value, json};

/// The type of a field error, as in apimachinery `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorType {
    Invalid,
    Required,
    Forbidden,
    NotSupported,
    TooLong,
    Duplicate,
}

impl FieldErrorType {
    /// The `Status.details.causes[].reason` value.
    pub fn cause_reason(self) -> &'static str {
        match self {
            Self::Invalid => "FieldValueInvalid",
            Self::Required => "FieldValueRequired",
            Self::Forbidden => "FieldValueForbidden",
            Self::NotSupported => "FieldValueNotSupported",
            Self::TooLong => "FieldValueTooLong",
            Self::Duplicate => "FieldValueDuplicate",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Self::Invalid => "Invalid value",
            Self::Required => "Required value",
            Self::Forbidden => "Forbidden",
            Self::NotSupported => "Unsupported value",
            Self::TooLong => "Too long",
            Self::Duplicate => "Duplicate value",
        }
    }
}

/// One validation error on one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: FieldErrorType,
    pub field: String,
    /// The rendered bad value; `None` when the value is omitted.
    pub value: Option<String>,
    pub detail: String,
}

impl FieldError {
    /// `field.Invalid` with a string value (Go `%q`).
    pub fn invalid_str(field: &str, value: &str, detail: impl Into<String>) -> Self {
        Self::invalid_raw(field, go_quote(value), detail)
    }
    /// `field.Invalid` with a value rendered verbatim (numbers, JSON).
    pub fn invalid_raw(field: &str, value: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorType::Invalid,
            field: field.to_string(),
            value: Some(value.into()),
            detail: detail.into(),
        }
    }
    /// `field.Invalid` with `field.OmitValueType{}`.
    pub fn invalid_omitted(field: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorType::Invalid,
            field: field.to_string(),
            value: None,
            detail: detail.into(),
        }
    }
    pub fn required(field: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorType::Required,
            field: field.to_string(),
            value: None,
            detail: detail.into(),
        }
    }
    pub fn forbidden(field: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorType::Forbidden,
            field: field.to_string(),
            value: None,
            detail: detail.into(),
        }
    }
    pub fn too_long(field: &str, max: usize) -> Self {
        Self {
            kind: FieldErrorType::TooLong,
            field: field.to_string(),
            value: None,
            detail: format!("may not be more than {max} bytes"),
        }
    }
    pub fn duplicate(field: &str, value: &str) -> Self {
        Self {
            kind: FieldErrorType::Duplicate,
            field: field.to_string(),
            value: Some(go_quote(value)),
            detail: String::new(),
        }
    }
    /// `field.NotSupported` with string values.
    pub fn not_supported(field: &str, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
        Self {
            kind: FieldErrorType::NotSupported,
            field: field.to_string(),
            value: Some(go_quote(value)),
            detail: format!("supported values: {}", list.join(", ")),
        }
    }

    /// `ErrorBody()`: the cause message without the field path.
    pub fn body(&self) -> String {
        let mut s = match (self.kind, &self.value) {
            (FieldErrorType::Required | FieldErrorType::Forbidden | FieldErrorType::TooLong, _) => {
                self.kind.label().to_string()
            }
            (_, None) => self.kind.label().to_string(),
            (_, Some(v)) => format!("{}: {}", self.kind.label(), v),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// `Error()`: `field: body`.
    pub fn full(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }
}

/// Go `strconv.Quote`.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                let n = c as u32;
                if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An error answered as a Kubernetes `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    /// `Status.reason`; empty for an unknown reason (plain 500).
    pub reason: String,
    pub message: String,
    pub details: Option<Box<Details>>,
    /// Extra headers (e.g. Retry-After).
    pub retry_after: Option<u64>,
}

/// `Status.details`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Details {
    pub name: String,
    pub group: String,
    pub kind: String,
    pub uid: Option<String>,
    pub causes: Vec<FieldError>,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    fn with_details(mut self, name: &str, group: &str, kind: &str) -> Self {
        self.details = Some(Box::new(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: kind.to_string(),
            uid: None,
            causes: Vec::new(),
        }));
        self
    }

    /// 422 from strategy validation: `Kind.group "name" is invalid: ...`.
    pub fn invalid(kind: &str, group: &str, name: &str, errs: Vec<FieldError>) -> Self {
        let qualified = qualified(kind, group);
        let body = if errs.len() == 1 {
            errs[0].full()
        } else {
            let parts: Vec<String> = errs.iter().map(FieldError::full).collect();
            format!("[{}]", parts.join(", "))
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{qualified} {} is invalid: {body}", go_quote(name)),
        )
        .with_details(name, group, kind);
        if let Some(d) = e.details.as_mut() {
            d.causes = errs;
        }
        e
    }

    /// 403 from authorization or admission: `resource.group "name" is forbidden: msg`.
    pub fn forbidden(resource: &str, group: &str, name: &str, msg: &str) -> Self {
        let qualified = qualified(resource, group);
        let message = if name.is_empty() {
            format!("{qualified} is forbidden: {msg}")
        } else {
            format!("{qualified} {} is forbidden: {msg}", go_quote(name))
        };
        Self::new(403, "Forbidden", message).with_details(name, group, resource)
    }

    pub fn not_found(resource: &str, group: &str, name: &str) -> Self {
        let qualified = qualified(resource, group);
        Self::new(
            404,
            "NotFound",
            format!("{qualified} {} not found", go_quote(name)),
        )
        .with_details(name, group, resource)
    }

    pub fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        let qualified = qualified(resource, group);
        Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} {} already exists", go_quote(name)),
        )
        .with_details(name, group, resource)
    }

    pub fn conflict(resource: &str, group: &str, name: &str) -> Self {
        let qualified = qualified(resource, group);
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} {}: the object has been modified; please apply your changes to the latest version and try again",
                go_quote(name)
            ),
        )
        .with_details(name, group, resource)
    }

    /// 422 raised by the storage layer (details kind = the resource).
    pub fn invalid_resource(
        resource: &str,
        group: &str,
        name: &str,
        errs: Vec<FieldError>,
    ) -> Self {
        Self::invalid(resource, group, name, errs)
    }

    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", msg)
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(500, "InternalError", msg)
    }

    /// A plain Go error turned into a Status: code 500, no reason.
    pub fn plain(msg: impl Into<String>) -> Self {
        Self::new(500, "", msg)
    }

    pub fn expired(msg: impl Into<String>) -> Self {
        Self::new(410, "Expired", msg)
    }

    pub fn method_not_allowed(msg: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", msg)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf; got {content_type}"
            ),
        )
    }

    /// The Status JSON object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        // A Retry-After is in the details too, with or without other details.
        let no_details = Details::default();
        let details = self
            .details
            .as_deref()
            .or(self.retry_after.map(|_| &no_details));
        if let Some(d) = details {
            let mut dj = serde_json::Map::new();
            if !d.name.is_empty() {
                dj.insert("name".into(), json!(d.name));
            }
            if !d.group.is_empty() {
                dj.insert("group".into(), json!(d.group));
            }
            if !d.kind.is_empty() {
                dj.insert("kind".into(), json!(d.kind));
            }
            if let Some(uid) = &d.uid {
                dj.insert("uid".into(), json!(uid));
            }
            if !d.causes.is_empty() {
                let causes: Vec<Value> = d
                    .causes
                    .iter()
                    .map(|c| {
                        json!({
                            "reason": c.kind.cause_reason(),
                            "message": c.body(),
                            "field": c.field,
                        })
                    })
                    .collect();
                dj.insert("causes".into(), Value::Array(causes));
            }
            if let Some(r) = self.retry_after {
                dj.insert("retryAfterSeconds".into(), json!(r));
            }
            s["details"] = Value::Object(dj);
        }
        s
    }
}

/// `resource.group`, or just `resource` for the core group.
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_matches_go() {
        assert_eq!(go_quote("a\nb\"c"), "\"a\\nb\\\"c\"");
    }

    #[test]
    fn multi_cause_message() {
        let e = ApiError::invalid(
            "X",
            "g.io",
            "n",
            vec![
                FieldError::required("a", ""),
                FieldError::invalid_omitted("b", "bad"),
            ],
        );
        assert_eq!(
            e.message,
            "X.g.io \"n\" is invalid: [a: Required value, b: Invalid value: bad]"
        );
    }
}
