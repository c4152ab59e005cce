//! The in-tree serving signer's annotation vocabulary (`kubernetes.io/service-ca`,
//! kubernetes/enhancements#5784), decided from facts the controller looked up. Pure: the
//! controller reads the pod and the Services [`Asked::lookups`] names, and [`entitled`] says
//! which SANs the pod may have, or why not. A SAN the pod is not entitled to refuses the whole
//! request with the reason; nothing is dropped.
//!
//! | annotation | SANs |
//! | --- | --- |
//! | `kubernetes.io/service-names: a,b` | `<svc>.<ns>.svc`, `<svc>.<ns>.svc.<cluster domain>`, and the ClusterIPs of a Service that is not headless; each Service must be in the request's namespace and its selector must match the pod's labels |
//! | `kubernetes.io/add-pod-ips: "true"` (or `add-pod-ip`) | the pod's IPs from `status.podIPs` |
//! | `kubernetes.io/add-pod-fqdn: "true"` | `<hostname>.<subdomain>.<ns>.svc.<cluster domain>`: the pod's `spec.hostname`, and `spec.subdomain` naming a headless Service that selects it |

use std::collections::BTreeMap;
use std::net::IpAddr;

/// Comma-separated Services of the request's namespace.
pub const SERVICE_NAMES: &str = "kubernetes.io/service-names";
/// `"true"`: the pod's IPs.
pub const ADD_POD_IPS: &str = "kubernetes.io/add-pod-ips";
/// The singular spelling of [`ADD_POD_IPS`]; the same meaning.
pub const ADD_POD_IP: &str = "kubernetes.io/add-pod-ip";
/// `"true"`: the pod's hostname under its headless Service.
pub const ADD_POD_FQDN: &str = "kubernetes.io/add-pod-fqdn";
/// Every key of the vocabulary.
pub const KEYS: [&str; 4] = [SERVICE_NAMES, ADD_POD_IPS, ADD_POD_IP, ADD_POD_FQDN];
/// Most Services one request may name: each is one GET.
pub const MAX_SERVICES: usize = 16;

/// A signer's `[signers."…".service_ca]` table: the vocabulary is answered for its
/// PodCertificateRequests (opt-in; it costs one GET of the pod and one per named Service).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The cluster's DNS domain (`<svc>.<ns>.svc.<cluster_domain>`); default `cluster.local`.
    #[serde(default = "default_cluster_domain")]
    pub cluster_domain: String,
}

fn default_cluster_domain() -> String {
    "cluster.local".to_owned()
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            cluster_domain: default_cluster_domain(),
        }
    }
}

/// Why the pod is not entitled to what it asked for: the Denied message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotEntitled(pub String);

/// What a request asks for, parsed from its annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// Service names, in order, without duplicates.
    pub services: Vec<String>,
    pub pod_ips: bool,
    pub pod_fqdn: bool,
}

/// A Service as looked up: what entitlement needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub namespace: String,
    /// `spec.selector`; empty: the Service selects no pod by labels.
    pub selector: BTreeMap<String, String>,
    /// `spec.clusterIPs` (or `spec.clusterIP`); empty for a headless Service.
    pub cluster_ips: Vec<IpAddr>,
    /// `spec.clusterIP` is `None`.
    pub headless: bool,
}

/// The pod as looked up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    pub labels: BTreeMap<String, String>,
    /// `status.podIPs`.
    pub ips: Vec<IpAddr>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
}

/// The SANs a pod is entitled to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sans {
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
}

fn flag(annotations: &BTreeMap<String, String>, key: &str) -> Result<bool, NotEntitled> {
    match annotations.get(key).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(NotEntitled(format!(
            "{key}: {:?} is neither \"true\" nor \"false\"",
            other.chars().take(64).collect::<String>()
        ))),
    }
}

/// A Service name is an RFC 1035 label: `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
fn is_service_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

impl Asked {
    /// What `annotations` ask for; `None` when they use none of [`KEYS`].
    pub fn of(annotations: &BTreeMap<String, String>) -> Result<Option<Asked>, NotEntitled> {
        if !KEYS.iter().any(|k| annotations.contains_key(*k)) {
            return Ok(None);
        }
        let mut asked = Asked {
            pod_ips: flag(annotations, ADD_POD_IPS)? | flag(annotations, ADD_POD_IP)?,
            pod_fqdn: flag(annotations, ADD_POD_FQDN)?,
            services: vec![],
        };
        if let Some(list) = annotations.get(SERVICE_NAMES) {
            for entry in list.split(',').map(str::trim) {
                if entry.contains('/') || (entry.contains('.') && !entry.is_empty()) {
                    let shown: String = entry.chars().take(64).collect();
                    return Err(NotEntitled(format!(
                        "{SERVICE_NAMES}: {shown:?} names a Service in another namespace; only \
                         Services in the request's namespace can be named"
                    )));
                }
                if !is_service_name(entry) {
                    let shown: String = entry.chars().take(64).collect();
                    return Err(NotEntitled(format!(
                        "{SERVICE_NAMES}: {shown:?} is not a Service name (a comma-separated \
                         list of RFC 1035 labels, no empty entries)"
                    )));
                }
                if !asked.services.iter().any(|s| s == entry) {
                    if asked.services.len() == MAX_SERVICES {
                        return Err(NotEntitled(format!(
                            "{SERVICE_NAMES}: more than {MAX_SERVICES} Services"
                        )));
                    }
                    asked.services.push(entry.to_owned());
                }
            }
        }
        Ok(Some(asked))
    }

    /// The Services the controller must look up: those named, and the pod's `spec.subdomain`
    /// when the pod's FQDN is asked for.
    pub fn lookups(&self, pod: &Pod) -> Vec<String> {
        let mut names = self.services.clone();
        if self.pod_fqdn
            && let Some(sub) = &pod.subdomain
            && !names.contains(sub)
        {
            names.push(sub.clone());
        }
        names
    }
}

fn selects(service: &Service, pod: &Pod) -> bool {
    !service.selector.is_empty()
        && service
            .selector
            .iter()
            .all(|(k, v)| pod.labels.get(k) == Some(v))
}

/// Checks that `service` (looked up by `name`) is in `namespace` and selects `pod`.
fn selecting<'a>(
    key: &str,
    name: &str,
    namespace: &str,
    service: Option<&'a Service>,
    pod: &Pod,
) -> Result<&'a Service, NotEntitled> {
    let Some(service) = service else {
        return Err(NotEntitled(format!(
            "{key}: Service {namespace}/{name} does not exist"
        )));
    };
    if service.namespace != namespace {
        return Err(NotEntitled(format!(
            "{key}: Service {name} is in namespace {}, not the request's ({namespace})",
            service.namespace
        )));
    }
    if service.selector.is_empty() {
        return Err(NotEntitled(format!(
            "{key}: Service {namespace}/{name} has no selector, so it selects no pod"
        )));
    }
    if !selects(service, pod) {
        return Err(NotEntitled(format!(
            "{key}: Service {namespace}/{name} does not select this pod (its selector does not \
             match the pod's labels)"
        )));
    }
    Ok(service)
}

/// The SANs the pod is entitled to for `asked`, given the pod and the Services looked up by name
/// (an absent entry: not found). Names are lowercase; duplicates are dropped.
pub fn entitled(
    asked: &Asked,
    namespace: &str,
    cluster_domain: &str,
    pod: &Pod,
    services: &BTreeMap<String, Service>,
) -> Result<Sans, NotEntitled> {
    let mut sans = Sans::default();
    let dns = |name: String, sans: &mut Sans| {
        if !sans.dns_names.contains(&name) {
            sans.dns_names.push(name);
        }
    };
    for name in &asked.services {
        let service = selecting(SERVICE_NAMES, name, namespace, services.get(name), pod)?;
        dns(format!("{name}.{namespace}.svc"), &mut sans);
        dns(
            format!("{name}.{namespace}.svc.{cluster_domain}"),
            &mut sans,
        );
        if !service.headless {
            for ip in &service.cluster_ips {
                if !sans.ip_addresses.contains(ip) {
                    sans.ip_addresses.push(*ip);
                }
            }
        }
    }
    if asked.pod_ips {
        if pod.ips.is_empty() {
            return Err(NotEntitled(format!(
                "{ADD_POD_IPS}: the pod has no IPs in status.podIPs"
            )));
        }
        for ip in &pod.ips {
            if !sans.ip_addresses.contains(ip) {
                sans.ip_addresses.push(*ip);
            }
        }
    }
    if asked.pod_fqdn {
        let Some(hostname) = pod.hostname.as_deref().filter(|h| !h.is_empty()) else {
            return Err(NotEntitled(format!(
                "{ADD_POD_FQDN}: the pod has no spec.hostname"
            )));
        };
        let Some(subdomain) = pod.subdomain.as_deref().filter(|s| !s.is_empty()) else {
            return Err(NotEntitled(format!(
                "{ADD_POD_FQDN}: the pod has no spec.subdomain naming a headless Service"
            )));
        };
        let service = selecting(
            ADD_POD_FQDN,
            subdomain,
            namespace,
            services.get(subdomain),
            pod,
        )?;
        if !service.headless {
            return Err(NotEntitled(format!(
                "{ADD_POD_FQDN}: Service {namespace}/{subdomain} (spec.subdomain) is not \
                 headless, so no per-pod DNS name exists under it"
            )));
        }
        dns(
            format!("{hostname}.{subdomain}.{namespace}.svc.{cluster_domain}"),
            &mut sans,
        );
    }
    Ok(sans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        annotations(pairs)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("a test IP")
    }

    fn web_pod() -> Pod {
        Pod {
            labels: labels(&[("app", "web"), ("tier", "front")]),
            ips: vec![ip("10.0.0.7"), ip("fd00::7")],
            hostname: Some("web-0".into()),
            subdomain: Some("web-hl".into()),
        }
    }

    fn services() -> BTreeMap<String, Service> {
        let svc = |ns: &str, selector: &[(&str, &str)], ips: &[&str]| Service {
            namespace: ns.into(),
            selector: labels(selector),
            cluster_ips: ips.iter().map(|s| ip(s)).collect(),
            headless: ips.is_empty(),
        };
        BTreeMap::from([
            (
                "web".to_owned(),
                svc("shop", &[("app", "web")], &["10.96.0.10"]),
            ),
            ("web-hl".to_owned(), svc("shop", &[("app", "web")], &[])),
            (
                "db".to_owned(),
                svc("shop", &[("app", "db")], &["10.96.0.11"]),
            ),
            ("manual".to_owned(), svc("shop", &[], &["10.96.0.12"])),
            ("elsewhere".to_owned(), svc("other", &[("app", "web")], &[])),
        ])
    }

    fn decide(pairs: &[(&str, &str)], pod: &Pod) -> Result<Sans, String> {
        let asked = Asked::of(&annotations(pairs))
            .map_err(|e| e.0)?
            .ok_or("no vocabulary key")?;
        entitled(&asked, "shop", "cluster.local", pod, &services()).map_err(|e| e.0)
    }

    #[test]
    fn the_keps_sans_for_an_entitled_pod() {
        let got = decide(
            &[
                (SERVICE_NAMES, "web, web-hl"),
                (ADD_POD_IPS, "true"),
                (ADD_POD_FQDN, "true"),
            ],
            &web_pod(),
        );
        assert_eq!(
            got,
            Ok(Sans {
                dns_names: vec![
                    "web.shop.svc".into(),
                    "web.shop.svc.cluster.local".into(),
                    "web-hl.shop.svc".into(),
                    "web-hl.shop.svc.cluster.local".into(),
                    "web-0.web-hl.shop.svc.cluster.local".into(),
                ],
                // The ClusterIP of the non-headless Service, then the pod's.
                ip_addresses: vec![ip("10.96.0.10"), ip("10.0.0.7"), ip("fd00::7")],
            })
        );
        let singular = decide(&[(ADD_POD_IP, "true")], &web_pod()).map(|s| s.ip_addresses);
        assert_eq!(singular, Ok(vec![ip("10.0.0.7"), ip("fd00::7")]));
        assert_eq!(Asked::of(&annotations(&[("example.com/x", "y")])), Ok(None));
    }

    #[test]
    fn each_san_the_pod_is_not_entitled_to_refuses_with_its_reason() {
        let no_hostname = Pod {
            hostname: None,
            ..web_pod()
        };
        let no_ips = Pod {
            ips: vec![],
            ..web_pod()
        };
        let beside_a_clusterip = Pod {
            subdomain: Some("web".into()),
            ..web_pod()
        };
        for (pairs, pod, want) in [
            (
                vec![(SERVICE_NAMES, "web,db")],
                web_pod(),
                "kubernetes.io/service-names: Service shop/db does not select this pod (its \
                 selector does not match the pod's labels)",
            ),
            (
                vec![(SERVICE_NAMES, "missing")],
                web_pod(),
                "kubernetes.io/service-names: Service shop/missing does not exist",
            ),
            (
                vec![(SERVICE_NAMES, "elsewhere")],
                web_pod(),
                "kubernetes.io/service-names: Service elsewhere is in namespace other, not the \
                 request's (shop)",
            ),
            (
                vec![(SERVICE_NAMES, "web.other")],
                web_pod(),
                "kubernetes.io/service-names: \"web.other\" names a Service in another \
                 namespace; only Services in the request's namespace can be named",
            ),
            (
                vec![(SERVICE_NAMES, "other/web")],
                web_pod(),
                "kubernetes.io/service-names: \"other/web\" names a Service in another \
                 namespace; only Services in the request's namespace can be named",
            ),
            (
                vec![(SERVICE_NAMES, "web,,db")],
                web_pod(),
                "kubernetes.io/service-names: \"\" is not a Service name (a comma-separated \
                 list of RFC 1035 labels, no empty entries)",
            ),
            (
                vec![(SERVICE_NAMES, "Web")],
                web_pod(),
                "kubernetes.io/service-names: \"Web\" is not a Service name (a comma-separated \
                 list of RFC 1035 labels, no empty entries)",
            ),
            (
                vec![(SERVICE_NAMES, "manual")],
                web_pod(),
                "kubernetes.io/service-names: Service shop/manual has no selector, so it \
                 selects no pod",
            ),
            (
                vec![(ADD_POD_FQDN, "true")],
                no_hostname,
                "kubernetes.io/add-pod-fqdn: the pod has no spec.hostname",
            ),
            (
                vec![(ADD_POD_FQDN, "true")],
                beside_a_clusterip,
                "kubernetes.io/add-pod-fqdn: Service shop/web (spec.subdomain) is not headless, \
                 so no per-pod DNS name exists under it",
            ),
            (
                vec![(ADD_POD_IPS, "true")],
                no_ips,
                "kubernetes.io/add-pod-ips: the pod has no IPs in status.podIPs",
            ),
            (
                vec![(ADD_POD_IPS, "yes")],
                web_pod(),
                "kubernetes.io/add-pod-ips: \"yes\" is neither \"true\" nor \"false\"",
            ),
        ] {
            assert_eq!(decide(&pairs, &pod), Err(want.to_owned()), "{pairs:?}");
        }
        let many = (0..=MAX_SERVICES)
            .map(|i| format!("s{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            decide(&[(SERVICE_NAMES, &many)], &web_pod()),
            Err("kubernetes.io/service-names: more than 16 Services".to_owned())
        );
    }

    #[test]
    fn lookups_add_the_subdomain_only_for_the_fqdn() {
        let asked = Asked {
            services: vec!["web".into()],
            pod_ips: false,
            pod_fqdn: true,
        };
        assert_eq!(asked.lookups(&web_pod()), ["web", "web-hl"]);
        let plain = Asked {
            pod_fqdn: false,
            ..asked
        };
        assert_eq!(plain.lookups(&web_pod()), ["web"]);
    }
}
