//! The Kubernetes facts behind the `kubernetes.io/service-ca` vocabulary
//! (`podca_signer::names::service_ca`): the request's pod (labels, `status.podIPs`,
//! `spec.hostname`, `spec.subdomain`) and the Services the request names, read with one GET
//! each. The decision itself is the signer's pure `entitled()`, which `podca policy test` can
//! run over sample objects; this module only reads and converts.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1 as core;
use podca_grpc::auth::KUBE_API_TIMEOUT;
use podca_signer::DenyReason;
use podca_signer::names::service_ca::{Asked, NotEntitled, Pod, Profile, Sans, Service, entitled};

/// Why the facts could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupFailed {
    /// The request's pod is gone, or another pod holds its name: deny.
    #[error("{0}")]
    PodGone(String),
    /// The API did not answer (or RBAC refused): decide nothing now, retry.
    #[error("cannot read {what} for kubernetes.io/service-ca: {error}")]
    Unavailable { what: String, error: String },
}

/// The pod as the vocabulary sees it; an unparsable IP in `status.podIPs` is left out (the API
/// server validates them, so none is expected).
pub fn pod_facts(pod: &core::Pod) -> Pod {
    let spec = pod.spec.as_ref();
    let ips = pod
        .status
        .as_ref()
        .and_then(|s| {
            s.pod_ips
                .as_ref()
                .map(|ips| ips.iter().map(|p| p.ip.clone()).collect::<Vec<_>>())
                .or_else(|| s.pod_ip.clone().map(|ip| vec![ip]))
        })
        .unwrap_or_default();
    Pod {
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        ips: ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
        hostname: spec
            .and_then(|s| s.hostname.clone())
            .filter(|h| !h.is_empty()),
        subdomain: spec
            .and_then(|s| s.subdomain.clone())
            .filter(|s| !s.is_empty()),
    }
}

/// The Service as the vocabulary sees it: headless when `spec.clusterIP` is `None`.
pub fn service_facts(service: &core::Service) -> Service {
    let spec = service.spec.as_ref();
    let cluster_ip = spec.and_then(|s| s.cluster_ip.as_deref());
    let headless = cluster_ip == Some("None");
    let listed: Vec<String> = spec
        .and_then(|s| s.cluster_ips.clone())
        .filter(|ips| !ips.is_empty())
        .or_else(|| cluster_ip.map(|ip| vec![ip.to_owned()]))
        .unwrap_or_default();
    let cluster_ips: Vec<IpAddr> = if headless {
        vec![]
    } else {
        listed.iter().filter_map(|ip| ip.parse().ok()).collect()
    };
    Service {
        namespace: service.metadata.namespace.clone().unwrap_or_default(),
        selector: spec.and_then(|s| s.selector.clone()).unwrap_or_default(),
        cluster_ips,
        headless,
    }
}

async fn get<K>(api: &kube::Api<K>, name: &str, what: &str) -> Result<Option<K>, LookupFailed>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let unavailable = |error: String| LookupFailed::Unavailable {
        what: what.to_owned(),
        error,
    };
    tokio::time::timeout(KUBE_API_TIMEOUT, api.get_opt(name))
        .await
        .map_err(|_| unavailable(format!("no answer in {KUBE_API_TIMEOUT:?}")))?
        .map_err(|e| unavailable(e.to_string()))
}

/// The request a lookup is for: where its pod is, and who it speaks for.
#[derive(Debug, Clone, Copy)]
pub struct ForRequest<'a> {
    pub namespace: &'a str,
    pub pod_name: &'a str,
    pub pod_uid: &'a str,
    /// The request's service account: the pod must run as it.
    pub service_account: &'a str,
}

/// What the vocabulary gives one PodCertificateRequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entitlement {
    /// None of the vocabulary's annotations: nothing was looked up.
    NotAsked,
    /// The SANs the pod is entitled to, to add to its certificate.
    Sans(Sans),
    /// The answer is Denied, with this reason and message.
    Refused { reason: DenyReason, message: String },
    /// Nothing can be decided now (the API did not answer): leave the request pending.
    Unavailable(LookupFailed),
}

/// What `annotations` ask of the vocabulary, checked against the pod and Services read from
/// the API: a malformed annotation is `InvalidUnverifiedUserAnnotations`, a pod that is gone
/// (or runs as another service account) `PolicyPodNotFound`, a name the pod is not entitled to
/// `NameNotEntitled`.
pub async fn entitlement(
    client: &kube::Client,
    profile: &Profile,
    request: ForRequest<'_>,
    annotations: &BTreeMap<String, String>,
) -> Entitlement {
    let asked = match Asked::of(annotations) {
        Ok(None) => return Entitlement::NotAsked,
        Ok(Some(asked)) => asked,
        Err(NotEntitled(message)) => {
            return Entitlement::Refused {
                reason: DenyReason::InvalidUserAnnotations,
                message,
            };
        }
    };
    let (pod, services) = match look_up(client, request, &asked).await {
        Ok(found) => found,
        Err(LookupFailed::PodGone(message)) => {
            return Entitlement::Refused {
                reason: DenyReason::PodNotFound,
                message,
            };
        }
        Err(e @ LookupFailed::Unavailable { .. }) => return Entitlement::Unavailable(e),
    };
    match entitled(
        &asked,
        request.namespace,
        &profile.cluster_domain,
        &pod,
        &services,
    ) {
        Ok(sans) => Entitlement::Sans(sans),
        Err(NotEntitled(message)) => Entitlement::Refused {
            reason: DenyReason::NotEntitledToName,
            message,
        },
    }
}

/// Reads the request's pod (which must have its UID and run as its service account) and the
/// Services `asked` needs.
pub async fn look_up(
    client: &kube::Client,
    request: ForRequest<'_>,
    asked: &Asked,
) -> Result<(Pod, BTreeMap<String, Service>), LookupFailed> {
    let ForRequest {
        namespace,
        pod_name: name,
        pod_uid: uid,
        service_account,
    } = request;
    let pods: kube::Api<core::Pod> = kube::Api::namespaced(client.clone(), namespace);
    let what = format!("pod {namespace}/{name}");
    let pod = match get(&pods, name, &what).await? {
        None => {
            return Err(LookupFailed::PodGone(format!(
                "pod {namespace}/{name} does not exist: kubernetes.io/service-ca names are \
                 checked against the pod"
            )));
        }
        Some(pod) if pod.metadata.uid.as_deref() != Some(uid) => {
            return Err(LookupFailed::PodGone(format!(
                "pod {namespace}/{name} is not the pod of this request (the request names UID \
                 {uid})"
            )));
        }
        Some(pod)
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref())
                .unwrap_or("default")
                != service_account =>
        {
            return Err(LookupFailed::PodGone(format!(
                "pod {namespace}/{name} does not run as service account {service_account}, \
                 which the request names"
            )));
        }
        Some(pod) => pod_facts(&pod),
    };
    let api: kube::Api<core::Service> = kube::Api::namespaced(client.clone(), namespace);
    let mut services = BTreeMap::new();
    for service in asked.lookups(&pod) {
        let what = format!("Service {namespace}/{service}");
        if let Some(found) = get(&api, &service, &what).await? {
            services.insert(service, service_facts(&found));
        }
    }
    Ok((pod, services))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodIP, PodSpec, PodStatus, ServiceSpec};

    #[test]
    fn a_pod_gives_its_labels_ips_hostname_and_subdomain() {
        let mut pod = core::Pod::default();
        pod.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        pod.spec = Some(PodSpec {
            hostname: Some("web-0".into()),
            subdomain: Some(String::new()),
            ..Default::default()
        });
        pod.status = Some(PodStatus {
            pod_ip: Some("10.0.0.7".into()),
            pod_ips: Some(vec![
                PodIP {
                    ip: "10.0.0.7".into(),
                },
                PodIP {
                    ip: "fd00::7".into(),
                },
            ]),
            ..Default::default()
        });
        let facts = pod_facts(&pod);
        assert_eq!(facts.labels["app"], "web");
        assert_eq!(
            facts.ips,
            [
                "10.0.0.7".parse::<IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
        assert_eq!(facts.hostname.as_deref(), Some("web-0"));
        // An empty subdomain is none.
        assert_eq!(facts.subdomain, None);
        // No podIPs: the single podIP; no status: no IPs.
        if let Some(status) = pod.status.as_mut() {
            status.pod_ips = None;
        }
        assert_eq!(pod_facts(&pod).ips.len(), 1);
        pod.status = None;
        assert!(pod_facts(&pod).ips.is_empty());
    }

    #[test]
    fn a_service_is_headless_when_its_cluster_ip_is_none() {
        let service = |cluster_ip: &str, cluster_ips: Option<Vec<String>>| {
            let mut s = core::Service::default();
            s.metadata.namespace = Some("shop".into());
            s.spec = Some(ServiceSpec {
                cluster_ip: Some(cluster_ip.into()),
                cluster_ips,
                selector: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..Default::default()
            });
            service_facts(&s)
        };
        let headless = service("None", Some(vec!["None".into()]));
        assert!(headless.headless && headless.cluster_ips.is_empty());
        assert_eq!(headless.namespace, "shop");
        assert_eq!(headless.selector["app"], "web");
        let dual = service(
            "10.96.0.10",
            Some(vec!["10.96.0.10".into(), "fd00:96::10".into()]),
        );
        assert!(!dual.headless);
        assert_eq!(dual.cluster_ips.len(), 2);
        let single = service("10.96.0.11", None);
        assert_eq!(
            single.cluster_ips,
            ["10.96.0.11".parse::<IpAddr>().unwrap()]
        );
    }
}
