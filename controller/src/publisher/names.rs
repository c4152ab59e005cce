//! The names and labels of the bundles: rules 20 (the name derives from the signer name), 22
//! (signer name syntax) and 23 (the reserved `kubernetes.io` domain), and label values.

use podca_signer::names::{LabelValue, ObjectName, SignerName};

use super::PublisherError;

/// The longest object name kube-apiserver accepts for a ClusterTrustBundle.
pub const MAX_NAME_LEN: usize = podca_signer::names::MAX_NAME_LEN;

/// `<signerName with every / replaced by :>:<suffix>`, checked against rules 20, 22 and 23.
pub fn bundle_name(signer: &str, suffix: &str) -> Result<String, PublisherError> {
    let invalid_signer = |reason: String| PublisherError::InvalidSignerName {
        signer: signer.to_owned(),
        reason,
    };
    let parsed: SignerName = signer.parse().map_err(|e| invalid_signer(format!("{e}")))?;
    let domain = parsed.domain();
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Err(invalid_signer(
            "the kubernetes.io domain is reserved".into(),
        ));
    }
    if let Err(e) = suffix.parse::<ObjectName>() {
        return Err(PublisherError::InvalidSuffix {
            suffix: suffix.to_owned(),
            reason: e.to_string(),
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
    value.parse::<LabelValue>().err().map(|e| e.to_string())
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
