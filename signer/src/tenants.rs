//! Tenants of a signer: named sets of namespaces, each its own SPIFFE trust domain with its own
//! CA (issue #39). A request is decided by the signer's policy with the trust domain of the
//! tenant its namespace belongs to, and signed by that tenant's CA, whose nameConstraints
//! permit only the tenant's names. A namespace in no tenant is denied, or (`untenanted =
//! "signer"`) signed by the signer's own CA.
//!
//! Membership is by namespace name: the CA's nameConstraints (the DNS subtrees of the tenant's
//! namespaces) are fixed when the CA is made, so a glob or a label selector, whose namespaces
//! change, cannot be constrained.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ca::{CaError, NameConstraints};
use crate::names::{DnsName, TrustDomain};
use crate::policy::{Decision, SignerPolicy};
use crate::reason::DenyReason;

/// The cluster DNS domain tenant DNS constraints name when none is configured.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// One tenant, as written under `[signers."<name>".tenants.<tenant>]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// The tenant's namespaces, by name.
    pub namespaces: Vec<String>,
    /// Its SPIFFE trust domain; default `<tenant>.<signer's trust domain>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
    /// The CA (`[cas.<name>]`) its certificates come from; default: the CA named like the
    /// tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// The cluster DNS domain of `<ns>.svc.<cluster domain>` in the CA's DNS constraints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_domain: Option<String>,
    /// Also constrain URIs to the tenant's trust domain in the CA certificates. Off by default:
    /// rustls-webpki refuses every leaf with a URI SAN under a URI-constrained CA (operator
    /// guide, "Name constraints"); OpenSSL, Go and BoringSSL peers check it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub uri_constraints: bool,
    /// CEL rules of the tenant, run after the signer's (`[[signers."x".tenants.<t>.rules]]`,
    /// the same form): a tenant's policy is the signer's plus these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<crate::rules::RuleSpec>,
}

/// What happens to a request from a namespace in no tenant, when the signer has tenants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Untenanted {
    /// Denied `NamespaceNotAllowed` (the default).
    #[default]
    Deny,
    /// Signed by the signer's own CA, in the signer's trust domain.
    Signer,
}

impl Untenanted {
    pub(crate) fn is_deny(&self) -> bool {
        *self == Untenanted::Deny
    }
}

/// The tenant a request belongs to, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant<'a> {
    pub name: &'a str,
    pub spec: &'a TenantSpec,
}

/// Why a signer's tenants are refused (a start-up error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TenantError {
    #[error(
        "tenant {0:?}: a tenant name is 1 to 63 lowercase letters, digits and '-', starting with \
         a letter (it is a label value and a CA name)"
    )]
    Name(String),
    #[error("tenant {0:?}: namespaces is empty")]
    NoNamespaces(String),
    #[error(
        "tenant {tenant:?}: namespace {namespace:?} is not a namespace name (tenants list names: \
         the CA's nameConstraints are fixed when it is made, so globs cannot be constrained)"
    )]
    Namespace { tenant: String, namespace: String },
    #[error("namespace {namespace:?} is claimed by tenants {first:?} and {second:?}")]
    TwoTenants {
        namespace: String,
        first: String,
        second: String,
    },
    #[error(
        "tenant {tenant:?}: trust_domain {trust_domain:?} is not a SPIFFE trust domain ({reason})"
    )]
    TrustDomain {
        tenant: String,
        trust_domain: String,
        reason: String,
    },
    #[error(
        "tenant {tenant:?}: its trust domain {trust_domain:?} is also {other}'s; each tenant is a \
         trust domain of its own"
    )]
    SharedTrustDomain {
        tenant: String,
        trust_domain: String,
        other: String,
    },
    #[error("tenants {first:?} and {second:?} both sign with CA {ca:?}; each needs its own")]
    SharedCa {
        first: String,
        second: String,
        ca: String,
    },
    #[error("tenant {tenant:?}: cluster_domain {domain:?} is not a DNS name")]
    ClusterDomain { tenant: String, domain: String },
    #[error("tenant {tenant:?}: its rules: {error}")]
    Rules { tenant: String, error: String },
}

impl<'a> Tenant<'a> {
    /// The tenant's trust domain.
    pub fn trust_domain(&self, signer_trust_domain: &str) -> String {
        self.spec
            .trust_domain
            .clone()
            .unwrap_or_else(|| format!("{}.{signer_trust_domain}", self.name))
    }

    /// The name of the CA that signs for the tenant.
    pub fn ca(&self) -> &'a str {
        self.spec.ca.as_deref().unwrap_or(self.name)
    }

    /// What the tenant's CA certificates permit: the DNS subtrees `<ns>.svc` and
    /// `<ns>.svc.<cluster domain>` of each namespace, and (`uri_constraints`) the tenant's
    /// trust domain.
    pub fn name_constraints(&self, signer_trust_domain: &str) -> Result<NameConstraints, CaError> {
        let domain = self
            .spec
            .cluster_domain
            .as_deref()
            .unwrap_or(DEFAULT_CLUSTER_DOMAIN);
        let dns: Vec<String> = self
            .spec
            .namespaces
            .iter()
            .flat_map(|ns| [format!("{ns}.svc"), format!("{ns}.svc.{domain}")])
            .collect();
        let uris = match self.spec.uri_constraints {
            true => vec![self.trust_domain(signer_trust_domain)],
            false => vec![],
        };
        NameConstraints::new(&uris, &dns)
    }
}

impl SignerPolicy {
    /// The tenants, by name.
    pub fn tenants(&self) -> impl Iterator<Item = Tenant<'_>> {
        self.tenants
            .iter()
            .map(|(name, spec)| Tenant { name, spec })
    }

    /// The tenant `namespace` belongs to: `None` when the signer has no tenants, or (with
    /// `untenanted = "signer"`) when the namespace is in none; a namespace in no tenant is
    /// otherwise denied `NamespaceNotAllowed`.
    pub fn tenant_of(&self, namespace: &str) -> Result<Option<Tenant<'_>>, Decision> {
        if self.tenants.is_empty() {
            return Ok(None);
        }
        if let Some(tenant) = self
            .tenants()
            .find(|t| t.spec.namespaces.iter().any(|ns| ns == namespace))
        {
            return Ok(Some(tenant));
        }
        match self.untenanted {
            Untenanted::Signer => Ok(None),
            Untenanted::Deny => Err(Decision::Deny {
                reason: DenyReason::NamespaceNotAllowed,
                message: format!(
                    "namespace {namespace:?} belongs to no tenant of this signer (untenanted = \
                     \"deny\")"
                ),
            }),
        }
    }

    /// The policy a tenant's requests are decided by: this one, in the tenant's trust domain,
    /// with the tenant's rules after the signer's. Built once per tenant and shared by clones
    /// (its rules are compiled once).
    pub fn for_tenant(&self, tenant: &Tenant<'_>) -> SignerPolicy {
        let built = self.tenant_policies.get_or_init(|| {
            self.tenants()
                .map(|t| (t.name.to_owned(), self.derive_for(&t)))
                .collect()
        });
        match built.get(tenant.name) {
            Some(policy) => policy.clone(),
            // A tenant of another policy value (tenants changed after a clone built these).
            None => self.derive_for(tenant),
        }
    }

    fn derive_for(&self, tenant: &Tenant<'_>) -> SignerPolicy {
        let mut policy = self.clone();
        policy.trust_domain = tenant.trust_domain(&self.trust_domain);
        policy.ca = Some(tenant.ca().to_owned());
        policy.tenants = BTreeMap::new();
        policy.tenant_policies = Default::default();
        if !tenant.spec.rules.is_empty() {
            policy.rules.extend(tenant.spec.rules.iter().cloned());
            // Its own compiled rules: the signer's cache holds the signer's rules only.
            policy.reset_compiled();
        }
        policy
    }

    /// The policy and tenant a request from `namespace` is decided by ([`Self::tenant_of`]).
    pub fn resolve(&self, namespace: &str) -> Result<(SignerPolicy, Option<String>), Decision> {
        Ok(match self.tenant_of(namespace)? {
            Some(tenant) => (self.for_tenant(&tenant), Some(tenant.name.to_owned())),
            None => (self.clone(), None),
        })
    }

    pub(crate) fn validate_tenants(&self) -> Result<(), TenantError> {
        let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
        let mut domains: BTreeMap<String, String> =
            BTreeMap::from([(self.trust_domain.clone(), "the signer".to_owned())]);
        let mut cas: BTreeMap<&str, &str> = BTreeMap::new();
        for tenant in self.tenants() {
            let name = tenant.name;
            if !is_tenant_name(name) {
                return Err(TenantError::Name(name.to_owned()));
            }
            if tenant.spec.namespaces.is_empty() {
                return Err(TenantError::NoNamespaces(name.to_owned()));
            }
            for ns in &tenant.spec.namespaces {
                if !is_tenant_name(ns) {
                    return Err(TenantError::Namespace {
                        tenant: name.to_owned(),
                        namespace: ns.clone(),
                    });
                }
                if let Some(first) = owner.insert(ns, name)
                    && first != name
                {
                    return Err(TenantError::TwoTenants {
                        namespace: ns.clone(),
                        first: first.to_owned(),
                        second: name.to_owned(),
                    });
                }
            }
            let trust_domain = tenant.trust_domain(&self.trust_domain);
            if let Err(e) = trust_domain.parse::<TrustDomain>() {
                return Err(TenantError::TrustDomain {
                    tenant: name.to_owned(),
                    trust_domain,
                    reason: e.to_string(),
                });
            }
            if let Some(other) = domains.insert(trust_domain.clone(), format!("tenant {name:?}")) {
                return Err(TenantError::SharedTrustDomain {
                    tenant: name.to_owned(),
                    trust_domain,
                    other,
                });
            }
            if let Some(first) = cas.insert(tenant.ca(), name) {
                return Err(TenantError::SharedCa {
                    first: first.to_owned(),
                    second: name.to_owned(),
                    ca: tenant.ca().to_owned(),
                });
            }
            if let Some(domain) = &tenant.spec.cluster_domain
                && domain.parse::<DnsName>().is_err()
            {
                return Err(TenantError::ClusterDomain {
                    tenant: name.to_owned(),
                    domain: domain.clone(),
                });
            }
        }
        Ok(())
    }
}

/// A DNS label starting with a letter: a tenant name, a namespace name, a CA name (also a
/// metric label and a directory name).
pub fn is_tenant_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(tenants: &str) -> SignerPolicy {
        toml::from_str(&format!("trust_domain = \"mesh.test\"\n{tenants}")).unwrap()
    }

    #[test]
    fn a_namespace_belongs_to_its_tenant_or_is_denied() {
        let p = policy(
            "[tenants.team-a]\nnamespaces = [\"a1\", \"a2\"]\n\
             [tenants.team-b]\nnamespaces = [\"b1\"]\ntrust_domain = \"b.example\"\nca = \"ca-b\"\n",
        );
        assert_eq!(p.validate_tenants(), Ok(()));
        let a = p.tenant_of("a2").unwrap().unwrap();
        assert_eq!(
            (a.name, a.trust_domain("mesh.test"), a.ca()),
            ("team-a", "team-a.mesh.test".to_owned(), "team-a")
        );
        let b = p.tenant_of("b1").unwrap().unwrap();
        assert_eq!(
            (b.trust_domain("mesh.test"), b.ca()),
            ("b.example".to_owned(), "ca-b")
        );
        match p.tenant_of("other") {
            Err(Decision::Deny { reason, message }) => {
                assert_eq!(reason, DenyReason::NamespaceNotAllowed);
                assert_eq!(
                    message,
                    "namespace \"other\" belongs to no tenant of this signer (untenanted = \"deny\")"
                );
            }
            other => panic!("{other:?}"),
        }
        let lenient = policy("untenanted = \"signer\"\n[tenants.team-a]\nnamespaces = [\"a1\"]\n");
        assert_eq!(lenient.tenant_of("other"), Ok(None));
        assert_eq!(policy("").tenant_of("any"), Ok(None));
        // The tenant's policy: the signer's, in the tenant's trust domain, with its CA.
        let (resolved, tenant) = p.resolve("a1").unwrap();
        assert_eq!(
            (
                resolved.trust_domain.as_str(),
                resolved.ca.as_deref(),
                tenant.as_deref()
            ),
            ("team-a.mesh.test", Some("team-a"), Some("team-a"))
        );
    }

    #[test]
    fn a_tenants_ca_permits_its_namespaces_dns_and_optionally_its_trust_domain() {
        let p = policy(
            "[tenants.team-a]\nnamespaces = [\"a1\", \"a2\"]\ncluster_domain = \"c.example\"\n\
             [tenants.team-b]\nnamespaces = [\"b1\"]\nuri_constraints = true\n",
        );
        let a = p.tenant_of("a1").unwrap().unwrap();
        let c = a.name_constraints("mesh.test").unwrap();
        assert_eq!(
            c.permitted_dns,
            ["a1.svc", "a1.svc.c.example", "a2.svc", "a2.svc.c.example"]
        );
        assert!(c.permitted_uri_hosts.is_empty());
        let b = p.tenant_of("b1").unwrap().unwrap();
        let c = b.name_constraints("mesh.test").unwrap();
        assert_eq!(c.permitted_uri_hosts, ["team-b.mesh.test"]);
        assert_eq!(c.permitted_dns, ["b1.svc", "b1.svc.cluster.local"]);
    }

    /// A tenant's policy is the signer's plus the tenant's rules, compiled once and shared; a
    /// rule that does not compile is a start-up error naming the tenant.
    #[test]
    fn a_tenants_rules_run_after_the_signers() {
        let p = policy(
            "[[rules]]\nname = \"no_default\"\ndeny = \"request.service_account == 'default'\"\n\
             reason = \"NoDefault\"\n\
             [tenants.team-a]\nnamespaces = [\"a1\"]\n\
             [[tenants.team-a.rules]]\nname = \"web_only\"\n\
             require = \"request.service_account == 'web'\"\nreason = \"WebOnly\"\n",
        );
        assert_eq!(p.validate(), Ok(()));
        let a = p.tenant_of("a1").unwrap().unwrap();
        let tenant = p.for_tenant(&a);
        let names: Vec<&str> = tenant.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["no_default", "web_only"]);
        assert_eq!(p.rules.len(), 1, "the signer's own rules are unchanged");
        let annotations = BTreeMap::new();
        let verdict = |policy: &SignerPolicy, service_account: &str| match policy.apply_rules(
            &crate::RuleFacts {
                source: crate::RequestSource::Pcr,
                signer_name: "example.com/mesh",
                namespace: "a1",
                service_account,
                pod_name: None,
                pod_uid: None,
                node_name: None,
                key_type: None,
                requested_lifetime_seconds: None,
                annotations: &annotations,
                audiences: &[],
                namespace_labels: None,
                pod: None,
                now: 0,
            },
        ) {
            Ok(()) => "issued".to_owned(),
            Err(Decision::Deny { reason, .. }) => reason.condition_reason().to_owned(),
            Err(other) => format!("{other:?}"),
        };
        assert_eq!(verdict(&tenant, "web"), "issued");
        assert_eq!(verdict(&tenant, "api"), "WebOnly");
        assert_eq!(verdict(&tenant, "default"), "NoDefault");
        // The signer's own policy (another namespace) does not run the tenant's rules.
        assert_eq!(verdict(&p, "api"), "issued");
        let bad = policy(
            "[tenants.team-a]\nnamespaces = [\"a1\"]\n\
             [[tenants.team-a.rules]]\nname = \"broken\"\ndeny = \"request.nope(\"\nreason = \"X\"\n",
        );
        let refused = bad.validate().unwrap_err().to_string();
        assert!(
            refused.starts_with("invalid signer policy: tenant \"team-a\": its rules: "),
            "{refused}"
        );
    }

    #[test]
    fn bad_tenants_are_refused_with_the_reason() {
        let refused = |text: &str| policy(text).validate_tenants().unwrap_err().to_string();
        assert_eq!(
            refused("[tenants.a]\nnamespaces = [\"x\"]\n[tenants.b]\nnamespaces = [\"x\"]\n"),
            "namespace \"x\" is claimed by tenants \"a\" and \"b\""
        );
        assert!(refused("[tenants.a]\nnamespaces = [\"team-*\"]\n").contains("globs cannot"));
        assert_eq!(
            refused("[tenants.a]\nnamespaces = []\n"),
            "tenant \"a\": namespaces is empty"
        );
        assert!(
            refused("[tenants.a]\nnamespaces = [\"x\"]\ntrust_domain = \"Bad_TD\"\n")
                .starts_with("tenant \"a\": trust_domain \"Bad_TD\" is not a SPIFFE trust domain")
        );
        assert_eq!(
            refused("[tenants.a]\nnamespaces = [\"x\"]\ntrust_domain = \"mesh.test\"\n"),
            "tenant \"a\": its trust domain \"mesh.test\" is also the signer's; each tenant is a \
             trust domain of its own"
        );
        assert_eq!(
            refused(
                "[tenants.a]\nnamespaces = [\"x\"]\nca = \"c\"\n\
                 [tenants.b]\nnamespaces = [\"y\"]\nca = \"c\"\n"
            ),
            "tenants \"a\" and \"b\" both sign with CA \"c\"; each needs its own"
        );
        assert!(
            refused("[tenants.A]\nnamespaces = [\"x\"]\n")
                .starts_with("tenant \"A\": a tenant name")
        );
    }
}
