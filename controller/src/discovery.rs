//! Which versions of certificates.k8s.io serve the resources podca uses (spec §1.6: discover, do
//! not hard-code v1): PodCertificateRequests for the controller, ClusterTrustBundles for the
//! publisher. certificates.k8s.io/v1 exists on every cluster for CSRs, so the version alone says
//! nothing: each version's resource list must name the resource.
//!
//! [`certificates`] reads both versions' resource lists once; [`Certificates::served`] answers
//! for either resource. Callers bound the call (`crate::bounded`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::Client;
use kube::api::ApiResource;

use crate::Error;
use crate::request::ApiVersion;

/// A certificates.k8s.io resource podca reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    PodCertificateRequests,
    ClusterTrustBundles,
}

impl Resource {
    /// The plural name in the group's resource list.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::PodCertificateRequests => "podcertificaterequests",
            Resource::ClusterTrustBundles => "clustertrustbundles",
        }
    }

    /// The kind of its objects.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::PodCertificateRequests => "PodCertificateRequest",
            Resource::ClusterTrustBundles => "ClusterTrustBundle",
        }
    }

    /// The resource at `version`, for kube's dynamic API.
    pub fn api_resource(self, version: ApiVersion) -> ApiResource {
        ApiResource {
            group: "certificates.k8s.io".into(),
            version: match version {
                ApiVersion::V1 => "v1",
                ApiVersion::V1Beta1 => "v1beta1",
            }
            .into(),
            api_version: version.as_str().into(),
            kind: self.kind().into(),
            plural: self.plural().into(),
        }
    }
}

/// The versions of certificates.k8s.io that serve one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Served {
    pub v1: bool,
    pub v1beta1: bool,
}

impl Served {
    /// v1 when served, else v1beta1; `None` when neither serves the resource.
    pub fn preferred(self) -> Option<ApiVersion> {
        match self {
            Served { v1: true, .. } => Some(ApiVersion::V1),
            Served { v1beta1: true, .. } => Some(ApiVersion::V1Beta1),
            _ => None,
        }
    }

    /// The version to watch PodCertificateRequests through: [`Served::preferred`], or the
    /// controller's start-up error.
    pub fn watch_version(self) -> Result<ApiVersion, Error> {
        self.preferred()
            .ok_or(Error::PodCertificateRequestsNotServed)
    }

    /// Whether a legacy (pkix + proof) request can be read at all.
    pub fn legacy_readable(self) -> bool {
        self.v1beta1
    }
}

/// The resource lists of certificates.k8s.io/v1 and /v1beta1 (empty where a version is not
/// served at all).
#[derive(Debug, Clone, Default)]
pub struct Certificates {
    v1: APIResourceList,
    v1beta1: APIResourceList,
}

impl Certificates {
    /// From the two resource lists; `None`: the version is not served (404).
    pub fn from_lists(v1: Option<APIResourceList>, v1beta1: Option<APIResourceList>) -> Self {
        Certificates {
            v1: v1.unwrap_or_default(),
            v1beta1: v1beta1.unwrap_or_default(),
        }
    }

    /// Which versions serve `resource`.
    pub fn served(&self, resource: Resource) -> Served {
        Served {
            v1: names(&self.v1, resource),
            v1beta1: names(&self.v1beta1, resource),
        }
    }
}

/// Asks the API server for both versions' resource lists. A version that is not served (404)
/// lists nothing; any other failure is returned.
pub async fn certificates(client: &Client) -> Result<Certificates, kube::Error> {
    Ok(Certificates::from_lists(
        resource_list(client, ApiVersion::V1).await?,
        resource_list(client, ApiVersion::V1Beta1).await?,
    ))
}

async fn resource_list(
    client: &Client,
    version: ApiVersion,
) -> Result<Option<APIResourceList>, kube::Error> {
    match client.list_api_group_resources(version.as_str()).await {
        Ok(list) => Ok(Some(list)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

fn names(list: &APIResourceList, resource: Resource) -> bool {
    list.resources.iter().any(|r| r.name == resource.plural())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    #[test]
    fn version_choice() {
        let s = |v1, v1beta1| Served { v1, v1beta1 };
        assert_eq!(s(true, true).watch_version().ok(), Some(ApiVersion::V1));
        assert_eq!(s(true, false).watch_version().ok(), Some(ApiVersion::V1));
        assert_eq!(
            s(false, true).watch_version().ok(),
            Some(ApiVersion::V1Beta1)
        );
        assert!(matches!(
            s(false, false).watch_version(),
            Err(Error::PodCertificateRequestsNotServed)
        ));
        assert_eq!(s(false, false).preferred(), None);
        assert!(!s(true, false).legacy_readable());
        assert!(s(true, true).legacy_readable());
    }

    fn list(names: &[&str]) -> APIResourceList {
        APIResourceList {
            resources: names
                .iter()
                .map(|n| APIResource {
                    name: (*n).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn each_resource_is_looked_up_in_each_version() {
        use Resource::*;
        // v1 serves CSRs everywhere: a version that lists neither resource serves neither.
        let c = Certificates::from_lists(
            Some(list(&["certificatesigningrequests", "clustertrustbundles"])),
            Some(list(&["podcertificaterequests", "clustertrustbundles"])),
        );
        let s = |v1, v1beta1| Served { v1, v1beta1 };
        assert_eq!(c.served(PodCertificateRequests), s(false, true));
        assert_eq!(c.served(ClusterTrustBundles), s(true, true));
        let beta_absent = Certificates::from_lists(Some(list(&["podcertificaterequests"])), None);
        assert_eq!(beta_absent.served(PodCertificateRequests), s(true, false));
        assert_eq!(beta_absent.served(ClusterTrustBundles), s(false, false));
        assert_eq!(
            Certificates::from_lists(None, None).served(ClusterTrustBundles),
            Served::default()
        );
    }
}
