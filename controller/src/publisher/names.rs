//! The names and labels of the bundles: rules 20 (the name derives from the signer name), 22
//! (signer name syntax) and 23 (the reserved `kubernetes.io` domain), and label values.

use super::PublisherError;

/// The longest object name kube-apiserver accepts for a ClusterTrustBundle.
pub const MAX_NAME_LEN: usize = 253;

/// `<signerName with every / replaced by :>:<suffix>`, checked against rules 20, 22 and 23.
pub fn bundle_name(signer: &str, suffix: &str) -> Result<String, PublisherError> {
    if let Some(reason) = signer_name_problem(signer) {
        return Err(PublisherError::InvalidSignerName {
            signer: signer.to_owned(),
            reason,
        });
    }
    if let Some(reason) = subdomain_problem(suffix) {
        return Err(PublisherError::InvalidSuffix {
            suffix: suffix.to_owned(),
            reason,
        });
    }
    let name = format!("{}:{suffix}", signer.replace('/', ":"));
    if name.len() > MAX_NAME_LEN {
        return Err(PublisherError::NameTooLong {
            signer: signer.to_owned(),
            len: name.len(),
            name,
        });
    }
    Ok(name)
}

/// Why a label value is not one (`IsValidLabelValue`), or `None`. Empty is refused too: an
/// empty instance would not tell installations apart.
pub fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".into());
    }
    if value.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    let b = value.as_bytes();
    let inner_ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if !inner_ok || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Some(
            "must consist of alphanumeric characters, '-', '_' or '.', and start and end with \
             an alphanumeric character"
                .into(),
        );
    }
    None
}

fn dns_label_ok(label: &str) -> bool {
    let b = label.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Why `s` is not a DNS-1123 subdomain, or `None`.
fn subdomain_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".into());
    }
    if s.len() > MAX_NAME_LEN {
        return Some(format!("must be no more than {MAX_NAME_LEN} characters"));
    }
    if !s.split('.').all(dns_label_ok) {
        return Some(
            "must be a lowercase RFC 1123 subdomain: lowercase alphanumerics, '-' and '.', \
             starting and ending with an alphanumeric character"
                .into(),
        );
    }
    None
}

/// Why `signer` is not a signer name a bundle can name (`ValidateSignerName`, rule 3/22, and
/// the reserved `kubernetes.io` domain, rule 23), or `None`.
fn signer_name_problem(signer: &str) -> Option<String> {
    let Some((domain, path)) = signer.split_once('/') else {
        return Some("must be of the form 'example.com/signer-name'".into());
    };
    if path.contains('/') {
        return Some("must contain exactly one '/'".into());
    }
    if domain.len() > 253 || !domain.split('.').all(dns_label_ok) || domain.split('.').count() < 2 {
        return Some("the domain must be a DNS name with at least two labels".into());
    }
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Some("the kubernetes.io domain is reserved".into());
    }
    if let Some(reason) = subdomain_problem(path) {
        return Some(format!("the path {reason}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            bundle_name("example.com/workload", "podca").as_deref(),
            Ok("example.com:workload:podca")
        );
        assert_eq!(
            bundle_name("ca.example.com/a.b", "live-1.x").as_deref(),
            Ok("ca.example.com:a.b:live-1.x")
        );
        for bad_suffix in ["", "Live", "a_b", "a:b", "-a", "a.", "a..b"] {
            assert!(
                matches!(
                    bundle_name("example.com/s", bad_suffix),
                    Err(PublisherError::InvalidSuffix { .. })
                ),
                "{bad_suffix:?}"
            );
        }
        for bad_signer in [
            "example.com",
            "example/s",
            "example.com/a/b",
            "Example.com/s",
            "kubernetes.io/s",
            "foo.kubernetes.io/s",
            "example.com/S",
            "example.com/",
        ] {
            assert!(
                matches!(
                    bundle_name(bad_signer, "podca"),
                    Err(PublisherError::InvalidSignerName { .. })
                ),
                "{bad_signer:?}"
            );
        }
        let long = format!("example.com/{}", vec!["a".repeat(60); 4].join("."));
        assert!(matches!(
            bundle_name(&long, "podca"),
            Err(PublisherError::NameTooLong { .. })
        ));
    }
}
