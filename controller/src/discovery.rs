//! Which versions of certificates.k8s.io serve PodCertificateRequests (spec §1.6: discover, do
//! not hard-code v1). certificates.k8s.io/v1 exists on every cluster for CSRs, so the version
//! alone says nothing: each version's resource list must name `podcertificaterequests`.

use kube::Client;

use crate::Error;
use crate::request::ApiVersion;

/// PCR-serving versions of certificates.k8s.io.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Served {
    pub v1: bool,
    pub v1beta1: bool,
}

impl Served {
    /// The version to watch through: v1 when served, else v1beta1.
    pub fn watch_version(self) -> Result<ApiVersion, Error> {
        match self {
            Served { v1: true, .. } => Ok(ApiVersion::V1),
            Served { v1beta1: true, .. } => Ok(ApiVersion::V1Beta1),
            _ => Err(Error::PodCertificateRequestsNotServed),
        }
    }

    /// Whether a legacy (pkix + proof) request can be read at all.
    pub fn legacy_readable(self) -> bool {
        self.v1beta1
    }
}

/// Asks the API server.
pub async fn discover(client: &Client) -> Result<Served, Error> {
    let group = match client
        .list_api_group_resources("certificates.k8s.io/v1")
        .await
    {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 404 => Default::default(),
        Err(e) => return Err(e.into()),
    };
    let v1 = serves_pcr(&group);
    let beta = match client
        .list_api_group_resources("certificates.k8s.io/v1beta1")
        .await
    {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 404 => Default::default(),
        Err(e) => return Err(e.into()),
    };
    Ok(Served {
        v1,
        v1beta1: serves_pcr(&beta),
    })
}

fn serves_pcr(list: &k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList) -> bool {
    list.resources
        .iter()
        .any(|r| r.name == "podcertificaterequests")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_choice() {
        let s = |v1, v1beta1| Served { v1, v1beta1 };
        assert_eq!(s(true, true).watch_version().ok(), Some(ApiVersion::V1));
        assert_eq!(s(true, false).watch_version().ok(), Some(ApiVersion::V1));
        assert_eq!(
            s(false, true).watch_version().ok(),
            Some(ApiVersion::V1Beta1)
        );
        assert!(s(false, false).watch_version().is_err());
        assert!(!s(true, false).legacy_readable());
        assert!(s(true, true).legacy_readable());
    }
}
