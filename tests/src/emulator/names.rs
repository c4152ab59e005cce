//! Name syntax checks with apimachinery's messages.

use super::errors::FieldError;

pub const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
pub const CONDITION_REASON_MSG: &str = "a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')";

fn label_like(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// `validation.IsDNS1123Label`.
pub fn is_dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !label_like(s) {
        errs.push(DNS1123_LABEL_MSG.to_string());
    }
    errs
}

/// `validation.IsDNS1123Subdomain`.
pub fn is_dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if s.is_empty() || !s.split('.').all(label_like) {
        errs.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    errs
}

/// `NameIsDNSSubdomain(name, prefix)`.
pub fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    if prefix {
        let masked = mask_trailing_dash(name);
        return is_dns1123_subdomain(&masked);
    }
    is_dns1123_subdomain(name)
}

fn mask_trailing_dash(name: &str) -> String {
    if name.len() > 1 && name.ends_with('-') {
        format!("{}a", &name[..name.len() - 1])
    } else {
        name.to_string()
    }
}

fn name_part_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// `validation.IsQualifiedName`.
pub fn is_qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [n] => *n,
        [prefix, n] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                for m in is_dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {m}"));
                }
            }
            n
        }
        _ => {
            errs.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string());
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !name.is_empty() && !name_part_ok(name) {
        errs.push(QUALIFIED_NAME_MSG.to_string());
    }
    errs
}

/// `validation.IsValidLabelValue`.
pub fn is_valid_label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !s.is_empty() && !name_part_ok(s) {
        errs.push(LABEL_VALUE_MSG.to_string());
    }
    errs
}

/// The condition reason regex `[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?`.
pub fn is_valid_condition_reason(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphabetic() {
        return false;
    }
    if !b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':'))
    {
        return false;
    }
    let last = b[b.len() - 1];
    last.is_ascii_alphanumeric() || last == b'_'
}

/// `ValidateSignerName` (pkg/apis/core/validation/names.go).
pub fn validate_signer_name(path: &str, signer: &str) -> Vec<FieldError> {
    let mut el = Vec::new();
    if signer.is_empty() {
        el.push(FieldError::required(path, ""));
        return el;
    }
    let segments: Vec<&str> = signer.split('/').collect();
    if segments.len() != 2 {
        el.push(FieldError::invalid_str(
            path,
            signer,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return el;
    }
    let (domain, p) = (segments[0], segments[1]);
    if domain.len() > 253 {
        el.push(FieldError::too_long(path, 253));
    }
    let labels: Vec<&str> = domain.split('.').collect();
    for lbl in &labels {
        let errs = is_dns1123_label(lbl);
        if !errs.is_empty() {
            for e in errs {
                el.push(FieldError::invalid_str(
                    path,
                    domain,
                    format!("validating label {}: {e}", super::errors::go_quote(lbl)),
                ));
            }
            break;
        }
    }
    if labels.len() < 2 {
        el.push(FieldError::invalid_str(
            path,
            domain,
            "should be a domain with at least two segments separated by dots",
        ));
    }
    for lbl in p.split('.') {
        let errs = is_dns1123_subdomain(lbl);
        if !errs.is_empty() {
            for e in errs {
                el.push(FieldError::invalid_str(
                    path,
                    p,
                    format!("validating label {}: {e}", super::errors::go_quote(lbl)),
                ));
            }
            break;
        }
    }
    let max = 253 + 253 + 63 + 1 + 1;
    if signer.len() > max {
        el.push(FieldError::too_long(path, max));
    }
    el
}

/// `IsKubernetesSignerName`.
pub fn is_kubernetes_signer_name(signer: &str) -> bool {
    let host = signer.split('/').next().unwrap_or("");
    host == "kubernetes.io" || host.ends_with(".kubernetes.io")
}

/// `ValidateClusterTrustBundleName(signerName)(name, false)`.
pub fn validate_ctb_name(signer: &str, name: &str) -> Vec<String> {
    if signer.is_empty() {
        if name.contains(':') {
            return vec![
                "ClusterTrustBundle without signer name must not have \":\" in its name"
                    .to_string(),
            ];
        }
        return name_is_dns_subdomain(name, false);
    }
    let prefix = format!("{}:", signer.replace('/', ":"));
    match name.strip_prefix(&prefix) {
        Some(rest) => name_is_dns_subdomain(rest, false),
        None => vec![format!(
            "ClusterTrustBundle for signerName {signer} must be named with prefix {prefix}"
        )],
    }
}

/// A loose port of Go's `net/mail.ParseAddress` acceptance (addr-spec, or
/// `display name <addr-spec>`).
pub fn parse_mail_address(s: &str) -> bool {
    let s = s.trim();
    let addr = if let (Some(open), true) = (s.rfind('<'), s.ends_with('>')) {
        let display = s[..open].trim();
        if !display.is_empty()
            && !display
                .chars()
                .all(|c| is_atext(c) || c == ' ' || c == '.' || c == '"')
        {
            return false;
        }
        &s[open + 1..s.len() - 1]
    } else {
        s
    };
    let Some(at) = addr.rfind('@') else {
        return false;
    };
    let (local, domain) = (&addr[..at], &addr[at + 1..]);
    let local_ok = if local.starts_with('"') && local.ends_with('"') && local.len() >= 2 {
        !local[1..local.len() - 1].contains('"') || local.contains("\\\"")
    } else {
        dot_atom(local)
    };
    let domain_ok = if domain.starts_with('[') && domain.ends_with(']') {
        domain.len() > 2
    } else {
        dot_atom(domain)
    };
    local_ok && domain_ok
}

fn is_atext(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || "!#$%&'*+-/=?^_`{|}~".contains(c)
        || (!c.is_ascii() && !c.is_control())
}

fn dot_atom(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|p| !p.is_empty() && p.chars().all(is_atext))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signer_names() {
        assert!(validate_signer_name("p", "example.com/my-signer").is_empty());
        assert!(!validate_signer_name("p", "example/x").is_empty());
        assert!(!validate_signer_name("p", "example.com/a/b").is_empty());
    }

    #[test]
    fn ctb_names() {
        assert!(validate_ctb_name("example.com/s", "example.com:s:live").is_empty());
        assert!(!validate_ctb_name("example.com/s", "example.com:s:").is_empty());
        assert!(!validate_ctb_name("", "a:b").is_empty());
    }

    #[test]
    fn mail() {
        assert!(parse_mail_address("a@example.com"));
        assert!(!parse_mail_address("not an address"));
    }

    #[test]
    fn reasons() {
        assert!(is_valid_condition_reason("Issued"));
        assert!(!is_valid_condition_reason("Policy Denied"));
        assert!(!is_valid_condition_reason("Policy-Denied"));
    }
}
