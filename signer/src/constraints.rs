//! RFC 5280 name constraints (§4.2.1.10) as podca's leaves meet them: the host of the SPIFFE
//! URI and the DNS names. A CA certificate anywhere on the issuing path may carry them (podca
//! writes them for tenant CAs and `ca init --permitted-*`; an imported CA may bring its own),
//! and a verifier rejects a leaf whose names fall outside. So podca checks before it signs and
//! answers with a precise refusal instead of a certificate nobody would accept.
//!
//! The matching is RFC 5280's, as rustls-webpki and OpenSSL apply it:
//! * a DNS constraint `example.com` permits `example.com` and every name below it (labels added
//!   on the left); `.example.com` (a form some CAs write) permits only the names below it;
//! * a URI constraint `host.example` permits exactly that host; `.example` every host below it;
//! * a permitted list of a type restricts that type only; an excluded entry refuses whatever
//!   it matches. Comparison ignores ASCII case.

use x509_parser::extensions::{GeneralName, NameConstraints};

/// The URI and DNS subtrees of one CA certificate's nameConstraints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subtrees {
    /// `None`: no permitted URI subtree, so URIs are not restricted (by this certificate).
    pub permitted_uri_hosts: Option<Vec<String>>,
    pub excluded_uri_hosts: Vec<String>,
    /// `None`: no permitted DNS subtree.
    pub permitted_dns: Option<Vec<String>>,
    pub excluded_dns: Vec<String>,
}

/// A name the issuing path's nameConstraints do not permit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameViolation {
    #[error(
        "the identity {id:?} is outside the nameConstraints of the CA certificate {ca:?} \
         (its URI host {host:?} is not permitted)"
    )]
    UriHost {
        ca: String,
        id: String,
        host: String,
    },
    #[error("the DNS name {name:?} is outside the nameConstraints of the CA certificate {ca:?}")]
    DnsName { ca: String, name: String },
}

impl Subtrees {
    /// The URI and DNS subtrees of a parsed extension; other name types are not podca's to
    /// check (its leaves carry only a URI and DNS names).
    pub fn from_extension(nc: &NameConstraints<'_>) -> Self {
        let pick = |list: &Option<Vec<x509_parser::extensions::GeneralSubtree<'_>>>, uri: bool| {
            list.as_ref().map(|subtrees| {
                subtrees
                    .iter()
                    .filter_map(|s| match (&s.base, uri) {
                        (GeneralName::URI(base), true) | (GeneralName::DNSName(base), false) => {
                            Some(base.to_ascii_lowercase())
                        }
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            })
        };
        // A permitted list of another type only does not restrict this one.
        let permitted = |uri| pick(&nc.permitted_subtrees, uri).filter(|l| !l.is_empty());
        Subtrees {
            permitted_uri_hosts: permitted(true),
            excluded_uri_hosts: pick(&nc.excluded_subtrees, true).unwrap_or_default(),
            permitted_dns: permitted(false),
            excluded_dns: pick(&nc.excluded_subtrees, false).unwrap_or_default(),
        }
    }

    /// Whether a leaf with the URI host `host` (of `id`) and `dns_names` passes these
    /// subtrees; `ca` names the certificate in the refusal.
    pub fn check(
        &self,
        ca: &str,
        (id, host): (&str, &str),
        dns_names: &[String],
    ) -> Result<(), NameViolation> {
        let uri_ok = self
            .permitted_uri_hosts
            .as_ref()
            .is_none_or(|bases| bases.iter().any(|b| uri_host_within(host, b)))
            && !self
                .excluded_uri_hosts
                .iter()
                .any(|b| uri_host_within(host, b));
        if !uri_ok {
            return Err(NameViolation::UriHost {
                ca: ca.to_owned(),
                id: id.to_owned(),
                host: host.to_owned(),
            });
        }
        for name in dns_names {
            let ok = self
                .permitted_dns
                .as_ref()
                .is_none_or(|bases| bases.iter().any(|b| dns_within(name, b)))
                && !self.excluded_dns.iter().any(|b| dns_within(name, b));
            if !ok {
                return Err(NameViolation::DnsName {
                    ca: ca.to_owned(),
                    name: name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Whether nothing is constrained.
    pub fn is_empty(&self) -> bool {
        self.permitted_uri_hosts.is_none()
            && self.permitted_dns.is_none()
            && self.excluded_uri_hosts.is_empty()
            && self.excluded_dns.is_empty()
    }
}

/// The host of a URI SAN (`spiffe://host/path` → `host`), lowercased by the caller's rules.
pub fn uri_host(uri: &str) -> &str {
    let rest = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // userinfo@host:port → host
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host.split(':').next().unwrap_or_default()
}

/// RFC 5280 DNS matching: `base` and every name with labels added on its left; a leading `.`
/// means below it only; an empty base matches everything.
pub fn dns_within(name: &str, base: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let base = base.trim_end_matches('.').to_ascii_lowercase();
    if base.is_empty() {
        return true;
    }
    match base.strip_prefix('.') {
        Some(below) => name.len() > below.len() + 1 && name.ends_with(&format!(".{below}")),
        None => name == base || name.ends_with(&format!(".{base}")),
    }
}

/// RFC 5280 URI matching on the host: `base` exactly, or with a leading `.` every host below.
pub fn uri_host_within(host: &str, base: &str) -> bool {
    let host = host.to_ascii_lowercase();
    let base = base.to_ascii_lowercase();
    match base.strip_prefix('.') {
        Some(below) => host.len() > below.len() + 1 && host.ends_with(&format!(".{below}")),
        None => host == base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_subtrees_add_labels_on_the_left_only() {
        for (name, base, within) in [
            ("example.com", "example.com", true),
            ("a.example.com", "example.com", true),
            ("A.Example.COM", "example.com", true),
            ("badexample.com", "example.com", false),
            ("example.com.evil", "example.com", false),
            ("example.com", ".example.com", false),
            ("a.example.com", ".example.com", true),
            ("anything", "", true),
            ("web.apps.svc", "apps.svc", true),
            ("web.shop.svc", "apps.svc", false),
        ] {
            assert_eq!(dns_within(name, base), within, "{name} in {base}");
        }
    }

    #[test]
    fn uri_subtrees_match_the_host() {
        assert_eq!(
            uri_host("spiffe://a.cluster.local/ns/x/sa/y"),
            "a.cluster.local"
        );
        assert_eq!(uri_host("https://u@h.example:8443/p?q"), "h.example");
        for (host, base, within) in [
            ("a.cluster.local", "a.cluster.local", true),
            ("b.cluster.local", "a.cluster.local", false),
            ("a.cluster.local", "cluster.local", false),
            ("a.cluster.local", ".cluster.local", true),
            ("cluster.local", ".cluster.local", false),
        ] {
            assert_eq!(uri_host_within(host, base), within, "{host} in {base}");
        }
    }

    #[test]
    fn a_permitted_list_restricts_its_type_and_exclusions_refuse() {
        let tenant = Subtrees {
            permitted_uri_hosts: Some(vec!["a.cluster.local".into()]),
            permitted_dns: Some(vec!["apps.svc".into()]),
            ..Subtrees::default()
        };
        let id = "spiffe://a.cluster.local/ns/apps/sa/web";
        assert_eq!(
            tenant.check("CN=a", (id, "a.cluster.local"), &["web.apps.svc".into()]),
            Ok(())
        );
        let other = "spiffe://b.cluster.local/ns/shop/sa/web";
        assert_eq!(
            tenant.check("CN=a", (other, "b.cluster.local"), &[]),
            Err(NameViolation::UriHost {
                ca: "CN=a".into(),
                id: other.into(),
                host: "b.cluster.local".into()
            })
        );
        assert_eq!(
            tenant.check("CN=a", (id, "a.cluster.local"), &["web.shop.svc".into()]),
            Err(NameViolation::DnsName {
                ca: "CN=a".into(),
                name: "web.shop.svc".into()
            })
        );
        // URI constraints only: DNS names are free.
        let uri_only = Subtrees {
            permitted_uri_hosts: Some(vec!["a.cluster.local".into()]),
            ..Subtrees::default()
        };
        assert_eq!(
            uri_only.check(
                "CN=a",
                (id, "a.cluster.local"),
                &["anything.example".into()]
            ),
            Ok(())
        );
        let excluding = Subtrees {
            excluded_dns: vec!["internal.example".into()],
            ..Subtrees::default()
        };
        assert!(matches!(
            excluding.check(
                "CN=x",
                (id, "a.cluster.local"),
                &["db.internal.example".into()]
            ),
            Err(NameViolation::DnsName { .. })
        ));
    }
}
