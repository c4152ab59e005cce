//! `certificates-api`: which versions of certificates.k8s.io serve the two resources podca uses,
//! read from discovery as the controller reads them ([`crate::discovery`]), and, with the
//! Kubernetes minor version from `/version`, what to turn on when one is missing (the table of
//! docs/kubernetes-contract.md §1.6: beta and off by default in 1.35 and 1.36, GA in v1 from
//! 1.37).

use kube::Client;

use super::{Check, ProbeError, Status};
use crate::discovery::{self, Certificates, Resource, Served};

/// What discovery said: the minor version (when `/version` answered with one) and the
/// resource lists, or the error that stopped it.
#[derive(Debug)]
pub(super) struct Discovered {
    pub minor: Option<u32>,
    pub certificates: Result<Certificates, ProbeError>,
}

impl Discovered {
    /// The versions serving `resource`; nothing when discovery failed.
    pub fn served(&self, resource: Resource) -> Served {
        self.certificates
            .as_ref()
            .map(|c| c.served(resource))
            .unwrap_or_default()
    }
}

pub(super) async fn discover(client: &Client) -> Discovered {
    let minor = client
        .apiserver_version()
        .await
        .ok()
        .and_then(|v| minor_version(&v.minor));
    Discovered {
        minor,
        certificates: discovery::certificates(client).await.map_err(|e| {
            format!(
                "discovery of certificates.k8s.io: {}",
                super::error_line(&e)
            )
            .into()
        }),
    }
}

/// `"36"`, or `"36+"` as some providers write it.
fn minor_version(text: &str) -> Option<u32> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

pub(super) fn check(d: &Discovered) -> Check {
    const NAME: &str = "certificates-api";
    if let Err(e) = &d.certificates {
        return Check::new(NAME, Status::Fail, e.to_string());
    }
    Check::combined(
        NAME,
        [
            Resource::PodCertificateRequests,
            Resource::ClusterTrustBundles,
        ]
        .into_iter()
        .map(|r| verdict(r, d.minor, d.served(r)))
        .collect(),
    )
}

/// The feature gates a resource needs in 1.35 and 1.36, and on which components.
fn gates(resource: Resource) -> &'static str {
    match resource {
        Resource::PodCertificateRequests => {
            "--feature-gates=PodCertificateRequest=true on kube-apiserver, kube-controller-manager \
             and every kubelet"
        }
        Resource::ClusterTrustBundles => {
            "--feature-gates=ClusterTrustBundle=true,ClusterTrustBundleProjection=true on \
             kube-apiserver and every kubelet"
        }
    }
}

const RUNTIME_CONFIG: &str = "--runtime-config=certificates.k8s.io/v1beta1=true on kube-apiserver";

/// The finding for one resource on a cluster of minor version `minor`.
fn verdict(resource: Resource, minor: Option<u32>, served: Served) -> (Status, String) {
    let plural = resource.plural();
    let release = minor.map_or_else(
        || "this Kubernetes".to_owned(),
        |m| format!("Kubernetes 1.{m}"),
    );
    match (served, minor) {
        (Served { v1: true, v1beta1 }, _) => (
            Status::Ok,
            format!(
                "{plural} served in v1{}",
                if v1beta1 { " (and v1beta1)" } else { "" }
            ),
        ),
        (Served { v1beta1: true, .. }, Some(m)) if m >= 37 => (
            Status::Fail,
            format!(
                "{plural} served only in v1beta1, deprecated since 1.37, but not in v1, GA and on \
                 by default in {release}: is certificates.k8s.io/v1 turned off with \
                 --runtime-config?"
            ),
        ),
        (Served { v1beta1: true, .. }, _) => (
            Status::Ok,
            format!(
                "{plural} served in v1beta1 ({release}: the beta feature gates and runtime-config \
                 are on; v1 comes with 1.37)"
            ),
        ),
        (_, Some(m)) if m < 35 => (
            Status::Fail,
            format!(
                "{plural} not served: {release} is too old, podca needs 1.35 or later (1.37 for \
                 v1)"
            ),
        ),
        (_, Some(35 | 36)) => (
            Status::Fail,
            format!(
                "{plural} not served in v1 or v1beta1: in {release} they are beta and off by \
                 default; turn on {} and {RUNTIME_CONFIG}",
                gates(resource)
            ),
        ),
        (_, Some(_)) => (
            Status::Fail,
            format!(
                "{plural} not served in v1, although {release} serves them by default: is \
                 certificates.k8s.io/v1 turned off with --runtime-config?"
            ),
        ),
        (_, None) => (
            Status::Fail,
            format!(
                "{plural} not served in v1 or v1beta1: from 1.37 on they are GA; on 1.35 and \
                 1.36 turn on {} and {RUNTIME_CONFIG}",
                gates(resource)
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Resource::*;

    fn served(v1: bool, v1beta1: bool) -> Served {
        Served { v1, v1beta1 }
    }

    #[test]
    fn minor_versions_parse_with_a_provider_suffix() {
        assert_eq!(minor_version("36"), Some(36));
        assert_eq!(minor_version("37+"), Some(37));
        assert_eq!(minor_version(""), None);
    }

    #[test]
    fn each_release_and_served_set_gets_its_own_verdict() {
        let cases: &[(Resource, Option<u32>, Served, Status, &str)] = &[
            (
                PodCertificateRequests,
                Some(37),
                served(true, false),
                Status::Ok,
                "podcertificaterequests served in v1",
            ),
            (
                PodCertificateRequests,
                Some(37),
                served(true, true),
                Status::Ok,
                "podcertificaterequests served in v1 (and v1beta1)",
            ),
            (
                PodCertificateRequests,
                Some(36),
                served(false, true),
                Status::Ok,
                "podcertificaterequests served in v1beta1 (Kubernetes 1.36: the beta feature gates",
            ),
            (
                PodCertificateRequests,
                Some(37),
                served(false, true),
                Status::Fail,
                "podcertificaterequests served only in v1beta1, deprecated since 1.37, but not in v1",
            ),
            (
                PodCertificateRequests,
                Some(36),
                served(false, false),
                Status::Fail,
                "turn on --feature-gates=PodCertificateRequest=true on kube-apiserver, \
              kube-controller-manager and every kubelet and --runtime-config=certificates.k8s.io/v1beta1=true",
            ),
            (
                ClusterTrustBundles,
                Some(35),
                served(false, false),
                Status::Fail,
                "turn on --feature-gates=ClusterTrustBundle=true,ClusterTrustBundleProjection=true",
            ),
            (
                PodCertificateRequests,
                Some(34),
                served(false, false),
                Status::Fail,
                "Kubernetes 1.34 is too old, podca needs 1.35 or later",
            ),
            (
                ClusterTrustBundles,
                Some(38),
                served(false, false),
                Status::Fail,
                "clustertrustbundles not served in v1, although Kubernetes 1.38 serves them by default",
            ),
            (
                PodCertificateRequests,
                None,
                served(false, false),
                Status::Fail,
                "from 1.37 on they are GA; on 1.35 and 1.36 turn on --feature-gates=PodCertificateRequest=true",
            ),
        ];
        for (resource, minor, s, status, text) in cases {
            let (got_status, detail) = verdict(*resource, *minor, *s);
            assert_eq!(
                got_status, *status,
                "{resource:?} {minor:?} {s:?}: {detail}"
            );
            assert!(
                detail.contains(text),
                "{resource:?} {minor:?} {s:?}: {detail}"
            );
        }
    }

    #[test]
    fn a_failed_discovery_fails_the_check() {
        let d = Discovered {
            minor: Some(37),
            certificates: Err(ProbeError::from("discovery of certificates.k8s.io: boom")),
        };
        let c = check(&d);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.detail, "discovery of certificates.k8s.io: boom");
    }
}
