//! The names podca reads and writes, each parsed once at the edge: Kubernetes object names, DNS
//! names for certificates, label values, signer names and podca's SPIFFE IDs.
//!
//! One rule, one place: every crate that used to carry its own copy of a name rule calls these.

use std::fmt;
use std::str::FromStr;

pub mod service_ca;

/// Why a string is not a name of the kind asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("must be no more than {max} characters")]
    TooLong { max: usize },
    #[error("must not contain an empty label (no leading, trailing or doubled '.')")]
    EmptyLabel,
    #[error("each label must be no more than 63 characters")]
    LabelTooLong,
    #[error("must not contain {0:?}")]
    InvalidCharacter(char),
    #[error("must start and end with an alphanumeric character")]
    BadEdge,
    #[error("must be of the form 'example.com/signer-name' with exactly one '/'")]
    SignerShape,
    #[error("the domain must have at least two labels")]
    SignerDomainOneLabel,
    #[error("must start with spiffe://")]
    SpiffeScheme,
    #[error("must be spiffe://<trust domain>/ns/<namespace>/sa/<service account>")]
    SpiffeShape,
    #[error("the {part} {error}")]
    Part {
        part: &'static str,
        error: Box<NameError>,
    },
}

impl NameError {
    fn in_part(part: &'static str) -> impl FnOnce(NameError) -> NameError {
        move |error| NameError::Part {
            part,
            error: Box::new(error),
        }
    }
}

/// The longest DNS name and Kubernetes object name.
pub const MAX_NAME_LEN: usize = 253;
/// The longest DNS label and Kubernetes label value.
pub const MAX_LABEL_LEN: usize = 63;
/// The longest signer name (`ValidateSignerName`).
pub const MAX_SIGNER_NAME_LEN: usize = 571;

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// Dot-separated labels of `[a-z0-9-]` with an alphanumeric at each end; `label_max` bounds
/// each label when the rule has such a bound.
fn check_labels(s: &str, max: usize, label_max: Option<usize>) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii() && (is_lower_alnum(c as u8) || c == '-' || c == '.')))
    {
        return Err(NameError::InvalidCharacter(c));
    }
    if s.len() > max {
        return Err(NameError::TooLong { max });
    }
    for label in s.split('.') {
        let bytes = label.as_bytes();
        let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
            return Err(NameError::EmptyLabel);
        };
        if label_max.is_some_and(|m| label.len() > m) {
            return Err(NameError::LabelTooLong);
        }
        if !is_lower_alnum(first) || !is_lower_alnum(last) {
            return Err(NameError::BadEdge);
        }
    }
    Ok(())
}

macro_rules! string_name {
    ($name:ident) => {
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

/// A Kubernetes object name: an RFC 1123 subdomain (`IsDNS1123Subdomain`) of at most 253
/// characters. Kubernetes bounds the whole name, not each label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectName(String);
string_name!(ObjectName);

impl FromStr for ObjectName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        check_labels(s, MAX_NAME_LEN, None)?;
        Ok(Self(s.to_owned()))
    }
}

/// A DNS name podca puts in a certificate's SAN (rule 16.3): lowercase labels of 1–63
/// `[a-z0-9-]` with no hyphen at either end, at most 253 characters, no wildcards and no
/// trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DnsName(String);
string_name!(DnsName);

impl FromStr for DnsName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        check_labels(s, MAX_NAME_LEN, Some(MAX_LABEL_LEN))?;
        Ok(Self(s.to_owned()))
    }
}

/// A Kubernetes label value: empty, or at most 63 characters of `[A-Za-z0-9-_.]` with an
/// alphanumeric at each end.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LabelValue(String);
string_name!(LabelValue);

impl FromStr for LabelValue {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        if let Some(c) = s
            .chars()
            .find(|&c| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
        {
            return Err(NameError::InvalidCharacter(c));
        }
        if s.len() > MAX_LABEL_LEN {
            return Err(NameError::TooLong { max: MAX_LABEL_LEN });
        }
        let bytes = s.as_bytes();
        if let (Some(first), Some(last)) = (bytes.first(), bytes.last())
            && !(first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric())
        {
            return Err(NameError::BadEdge);
        }
        Ok(Self(s.to_owned()))
    }
}

/// A signer name (`ValidateSignerName`, spec rule 3): `<domain>/<path>`, the domain a DNS name
/// of at least two labels, the path an RFC 1123 subdomain, at most 571 characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SignerName(String);
string_name!(SignerName);

impl SignerName {
    pub fn domain(&self) -> &str {
        self.split().0
    }

    pub fn path(&self) -> &str {
        self.split().1
    }

    fn split(&self) -> (&str, &str) {
        // Parsing checked that there is exactly one '/'.
        self.0.split_once('/').unwrap_or((&self.0, ""))
    }
}

impl FromStr for SignerName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        let Some((domain, path)) = s.split_once('/') else {
            return Err(NameError::SignerShape);
        };
        if path.contains('/') {
            return Err(NameError::SignerShape);
        }
        if s.len() > MAX_SIGNER_NAME_LEN {
            return Err(NameError::TooLong {
                max: MAX_SIGNER_NAME_LEN,
            });
        }
        check_labels(domain, MAX_NAME_LEN, Some(MAX_LABEL_LEN))
            .map_err(NameError::in_part("domain"))?;
        if !domain.contains('.') {
            return Err(NameError::SignerDomainOneLabel);
        }
        check_labels(path, MAX_NAME_LEN, None).map_err(NameError::in_part("path"))?;
        Ok(Self(s.to_owned()))
    }
}

/// podca's SPIFFE ID for a service account: `spiffe://<trust domain>/ns/<namespace>/sa/<sa>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpiffeId {
    pub trust_domain: TrustDomain,
    pub namespace: ObjectName,
    pub service_account: ObjectName,
}

impl SpiffeId {
    pub fn new(
        trust_domain: TrustDomain,
        namespace: ObjectName,
        service_account: ObjectName,
    ) -> Self {
        Self {
            trust_domain,
            namespace,
            service_account,
        }
    }
}

/// podca's SPIFFE ID of a service account, from parts already checked (a PCR's, a verified
/// token's): the one builder, which [`SpiffeId`]'s `Display` uses too.
pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&spiffe_id(
            self.trust_domain.as_str(),
            self.namespace.as_str(),
            self.service_account.as_str(),
        ))
    }
}

impl FromStr for SpiffeId {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        let rest = s.strip_prefix("spiffe://").ok_or(NameError::SpiffeScheme)?;
        let mut parts = rest.split('/');
        let (Some(td), Some("ns"), Some(ns), Some("sa"), Some(sa), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(NameError::SpiffeShape);
        };
        Ok(Self {
            trust_domain: td.parse().map_err(NameError::in_part("trust domain"))?,
            namespace: ns.parse().map_err(NameError::in_part("namespace"))?,
            service_account: sa.parse().map_err(NameError::in_part("service account"))?,
        })
    }
}

/// The trust domain of any SPIFFE ID, `spiffe://<trust domain>[/<segment>…]` (SPIFFE ID spec
/// §2: segments of `[A-Za-z0-9-._]`, neither empty nor `.` or `..`); `None` when `id` is not
/// one. podca's own IDs are [`SpiffeId`]s; this reads anyone's (a JWT-SVID's `sub`).
pub fn trust_domain_of(id: &str) -> Option<TrustDomain> {
    let rest = id.strip_prefix("spiffe://")?;
    let (domain, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path_ok = path.is_empty()
        || path.split('/').all(|segment| {
            !matches!(segment, "" | "." | "..")
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        });
    path_ok.then(|| domain.parse().ok()).flatten()
}

/// A SPIFFE trust domain: lowercase letters, digits, '-', '.' and '_' (SPIFFE ID spec §2.1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TrustDomain(String);
string_name!(TrustDomain);

/// The longest trust domain (SPIFFE ID spec §2.1).
pub const MAX_TRUST_DOMAIN_LEN: usize = 255;

impl FromStr for TrustDomain {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        if let Some(c) = s
            .chars()
            .find(|&c| !(c.is_ascii() && (is_lower_alnum(c as u8) || "-._".contains(c))))
        {
            return Err(NameError::InvalidCharacter(c));
        }
        if s.len() > MAX_TRUST_DOMAIN_LEN {
            return Err(NameError::TooLong {
                max: MAX_TRUST_DOMAIN_LEN,
            });
        }
        Ok(Self(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NameError::*;

    fn part(part: &'static str, error: NameError) -> NameError {
        Part {
            part,
            error: Box::new(error),
        }
    }

    /// Each row trips one rule (or none); the same input may appear under several types, since
    /// the types' rules differ on purpose.
    #[test]
    fn edge_cases() {
        let label63 = "a".repeat(63);
        let label64 = "a".repeat(64);
        // Three labels of 63, three dots and a last label of 61 or 62.
        let n253 = format!("{label63}.{label63}.{label63}.{}", "a".repeat(61));
        let n254 = format!("{n253}a");
        assert_eq!((n253.len(), n254.len()), (253, 254));

        type Row<'a> = (&'a str, Result<(), NameError>);
        let object: Vec<Row> = vec![
            ("a.b", Ok(())),
            ("0a-b", Ok(())),
            (&n253, Ok(())),
            (&label64, Ok(())), // Kubernetes bounds object names as a whole only.
            ("", Err(Empty)),
            (&n254, Err(TooLong { max: 253 })),
            ("a..b", Err(EmptyLabel)),
            (".a", Err(EmptyLabel)),
            ("a.", Err(EmptyLabel)),
            ("-a", Err(BadEdge)),
            ("a-", Err(BadEdge)),
            ("a.-b", Err(BadEdge)),
            ("A", Err(InvalidCharacter('A'))),
            ("a_b", Err(InvalidCharacter('_'))),
            ("a%2fb", Err(InvalidCharacter('%'))),
        ];
        for (input, want) in object {
            assert_eq!(
                input.parse::<ObjectName>().map(|_| ()),
                want,
                "object {input:?}"
            );
        }

        let dns: Vec<Row> = vec![
            ("example.com", Ok(())),
            ("localhost", Ok(())),
            (&label63, Ok(())),
            (&n253, Ok(())),
            (&label64, Err(LabelTooLong)),
            (&n254, Err(TooLong { max: 253 })),
            ("", Err(Empty)),
            ("a..b", Err(EmptyLabel)),
            ("example.com.", Err(EmptyLabel)),
            (".example.com", Err(EmptyLabel)),
            ("-a.com", Err(BadEdge)),
            ("Example.com", Err(InvalidCharacter('E'))),
            ("a_b.com", Err(InvalidCharacter('_'))),
            ("*.example.com", Err(InvalidCharacter('*'))),
        ];
        for (input, want) in dns {
            assert_eq!(input.parse::<DnsName>().map(|_| ()), want, "dns {input:?}");
        }

        let label: Vec<Row> = vec![
            ("", Ok(())),
            ("Web_1.v-2", Ok(())),
            (&label63, Ok(())),
            (&label64, Err(TooLong { max: 63 })),
            ("-a", Err(BadEdge)),
            ("a.", Err(BadEdge)),
            ("a/b", Err(InvalidCharacter('/'))),
            ("a b", Err(InvalidCharacter(' '))),
        ];
        for (input, want) in label {
            assert_eq!(
                input.parse::<LabelValue>().map(|_| ()),
                want,
                "label {input:?}"
            );
        }

        let signer_long = format!("example.com/{}", "a".repeat(MAX_SIGNER_NAME_LEN));
        let signer_label64 = format!("{label64}.com/s");
        let signer: Vec<Row> = vec![
            ("example.com/workload", Ok(())),
            ("ca.example.com/a.b", Ok(())),
            ("example.com", Err(SignerShape)),
            ("example.com/a/b", Err(SignerShape)),
            (&signer_long, Err(TooLong { max: 571 })),
            ("example/s", Err(SignerDomainOneLabel)),
            ("Example.com/s", Err(part("domain", InvalidCharacter('E')))),
            ("a..com/s", Err(part("domain", EmptyLabel))),
            (&signer_label64, Err(part("domain", LabelTooLong))),
            ("example.com/", Err(part("path", Empty))),
            ("example.com/S", Err(part("path", InvalidCharacter('S')))),
            ("example.com/a..b", Err(part("path", EmptyLabel))),
        ];
        for (input, want) in signer {
            assert_eq!(
                input.parse::<SignerName>().map(|_| ()),
                want,
                "signer {input:?}"
            );
        }

        let spiffe: Vec<Row> = vec![
            ("spiffe://cluster.local/ns/default/sa/web", Ok(())),
            ("spiffe://td_1/ns/a.b/sa/c", Ok(())),
            ("https://cluster.local/ns/a/sa/b", Err(SpiffeScheme)),
            ("SPIFFE://cluster.local/ns/a/sa/b", Err(SpiffeScheme)),
            ("spiffe://cluster.local/ns/a/sa/b/extra", Err(SpiffeShape)),
            ("spiffe://cluster.local/ns/a/sa", Err(SpiffeShape)),
            ("spiffe://cluster.local/ns/a", Err(SpiffeShape)),
            ("spiffe://cluster.local", Err(SpiffeShape)),
            ("spiffe://cluster.local/ns/a/sa/b/", Err(SpiffeShape)),
            ("spiffe://cluster.local/namespace/a/sa/b", Err(SpiffeShape)),
            ("spiffe:///ns/a/sa/b", Err(part("trust domain", Empty))),
            (
                "spiffe://Cluster.local/ns/a/sa/b",
                Err(part("trust domain", InvalidCharacter('C'))),
            ),
            (
                "spiffe://cluster.local:8443/ns/a/sa/b",
                Err(part("trust domain", InvalidCharacter(':'))),
            ),
            (
                "spiffe://cluster.local/ns//sa/b",
                Err(part("namespace", Empty)),
            ),
            (
                "spiffe://cluster.local/ns/a%2fb/sa/b",
                Err(part("namespace", InvalidCharacter('%'))),
            ),
            (
                "spiffe://cluster.local/ns/a..b/sa/b",
                Err(part("namespace", EmptyLabel)),
            ),
            (
                "spiffe://cluster.local/ns/a/sa/",
                Err(part("service account", Empty)),
            ),
            (
                "spiffe://cluster.local/ns/a/sa/B",
                Err(part("service account", InvalidCharacter('B'))),
            ),
        ];
        for (input, want) in spiffe {
            assert_eq!(
                input.parse::<SpiffeId>().map(|_| ()),
                want,
                "spiffe {input:?}"
            );
        }
    }

    /// Anyone's SPIFFE ID (a JWT-SVID `sub`): any path, but a well-formed one.
    #[test]
    fn trust_domains_of_any_spiffe_id() {
        for (input, want) in [
            ("spiffe://cluster.local/ns/a/sa/b", Some("cluster.local")),
            ("spiffe://example.org", Some("example.org")),
            ("spiffe://example.org/Billing/v1.2_x", Some("example.org")),
            ("spiffe://example.org/a//b", None),
            ("spiffe://example.org/a/../b", None),
            ("spiffe://example.org/a/.", None),
            ("spiffe://example.org/a b", None),
            ("spiffe://Example.org/a", None),
            ("spiffe:///a", None),
            ("https://example.org/a", None),
        ] {
            assert_eq!(
                trust_domain_of(input).as_ref().map(TrustDomain::as_str),
                want,
                "{input:?}"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        let id: SpiffeId = "spiffe://cluster.local/ns/default/sa/web".parse().unwrap();
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/default/sa/web");
        assert_eq!(id.namespace.as_str(), "default");
        let signer: SignerName = "ca.example.com/a.b".parse().unwrap();
        assert_eq!((signer.domain(), signer.path()), ("ca.example.com", "a.b"));
        assert_eq!(signer.to_string(), "ca.example.com/a.b");
        assert_eq!(
            part("path", Empty).to_string(),
            "the path must not be empty"
        );
    }
}
