//! The Kubernetes implementations of the gRPC edge's lookups: [`KubeTokenReviewer`]
//! (TokenReview, authentication.k8s.io/v1) and [`KubePodDirectory`] (pods, for IssueForPod).
//! Both bound every call by [`KUBE_API_TIMEOUT`].

use std::fmt;

use podca_grpc::auth::KUBE_API_TIMEOUT;
use podca_grpc::auth::{
    BearerToken, LookupError, NamedPod, PodDirectory, PodInfo, ReviewStatus, TokenReviewer,
};
use podca_signer::PodMetadata;

/// TokenReview through the Kubernetes API (authentication.k8s.io/v1).
#[derive(Clone)]
pub struct KubeTokenReviewer {
    client: kube::Client,
}

impl fmt::Debug for KubeTokenReviewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KubeTokenReviewer")
    }
}

impl KubeTokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        KubeTokenReviewer { client }
    }
}

#[tonic::async_trait]
impl TokenReviewer for KubeTokenReviewer {
    // The token is never a span field: skip_all, and only the audience is recorded.
    #[tracing::instrument(name = "token_review", skip_all, fields(audience = %audience))]
    async fn review(
        &self,
        token: &BearerToken,
        audience: &str,
    ) -> Result<ReviewStatus, LookupError> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.expose().to_owned(),
                audiences: Some(vec![audience.to_owned()]),
            },
            ..Default::default()
        };
        let answer = tokio::time::timeout(
            KUBE_API_TIMEOUT,
            api.create(&kube::api::PostParams::default(), &review),
        )
        .await
        .map_err(|_| LookupError::Timeout(KUBE_API_TIMEOUT))?
        // kube errors name the URL and status, never the request body.
        .map_err(|e| LookupError::Failed(e.to_string()))?;
        let status = answer.status.unwrap_or_default();
        let user = status.user.unwrap_or_default();
        Ok(ReviewStatus {
            authenticated: status.authenticated.unwrap_or(false),
            username: user.username.unwrap_or_default(),
            audiences: status.audiences.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
            error: status.error.filter(|e| !e.is_empty()),
            uid: user.uid.filter(|u| !u.is_empty()),
        })
    }
}

/// Pods through the Kubernetes API.
#[derive(Clone)]
pub struct KubePodDirectory {
    client: kube::Client,
}

impl fmt::Debug for KubePodDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KubePodDirectory")
    }
}

impl KubePodDirectory {
    pub fn new(client: kube::Client) -> Self {
        KubePodDirectory { client }
    }
}

/// What the gRPC checks and policy rules read of a Pod.
fn pod_info(p: k8s_openapi::api::core::v1::Pod) -> PodInfo {
    let spec = p.spec.unwrap_or_default();
    let mirror = spec.service_account_name.is_none()
        || p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    PodInfo {
        mirror,
        service_account: spec
            .service_account_name
            .unwrap_or_else(|| "default".into()),
        node_name: spec.node_name,
        uid: p.metadata.uid,
        terminating: p.metadata.deletion_timestamp.is_some(),
        phase: p.status.and_then(|s| s.phase),
        metadata: PodMetadata {
            labels: p.metadata.labels.unwrap_or_default(),
            annotations: p.metadata.annotations.unwrap_or_default(),
        },
    }
}

#[tonic::async_trait]
impl PodDirectory for KubePodDirectory {
    #[tracing::instrument(name = "pod_lookup", skip_all, fields(namespace = %namespace, pod = %name))]
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodInfo>, LookupError> {
        use k8s_openapi::api::core::v1::Pod;
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        let pod = tokio::time::timeout(KUBE_API_TIMEOUT, api.get_opt(name))
            .await
            .map_err(|_| LookupError::Timeout(KUBE_API_TIMEOUT))?
            .map_err(|e| LookupError::Failed(e.to_string()))?;
        Ok(pod.map(pod_info))
    }

    /// One LIST in `namespace` with `fieldSelector=spec.nodeName=<node>,spec.serviceAccountName=
    /// <sa>` (both are pod field selectors of kube-apiserver): needs `pods list`.
    #[tracing::instrument(name = "pods_on_node", skip_all, fields(namespace = %namespace, node = %node))]
    async fn pods_on_node(
        &self,
        namespace: &str,
        node: &str,
        service_account: &str,
    ) -> Result<Vec<NamedPod>, LookupError> {
        use k8s_openapi::api::core::v1::Pod;
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        let params = kube::api::ListParams::default().fields(&format!(
            "spec.nodeName={node},spec.serviceAccountName={service_account}"
        ));
        let list = tokio::time::timeout(KUBE_API_TIMEOUT, api.list(&params))
            .await
            .map_err(|_| LookupError::Timeout(KUBE_API_TIMEOUT))?
            .map_err(|e| LookupError::Failed(e.to_string()))?;
        Ok(list
            .items
            .into_iter()
            .map(|mut p| NamedPod {
                name: p.metadata.name.take().unwrap_or_default(),
                info: pod_info(p),
            })
            // The selector already says so; a pod that does not match is never trusted.
            .filter(|p| {
                p.info.node_name.as_deref() == Some(node)
                    && p.info.service_account == service_account
            })
            .collect())
    }

    /// One GET of the ServiceAccount (needs `serviceaccounts get`; mTLS renewal only).
    #[tracing::instrument(name = "service_account_lookup", skip_all, fields(namespace = %namespace, service_account = %name))]
    async fn service_account_uid(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, LookupError> {
        use k8s_openapi::api::core::v1::ServiceAccount;
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(self.client.clone(), namespace);
        let account = tokio::time::timeout(KUBE_API_TIMEOUT, api.get_opt(name))
            .await
            .map_err(|_| LookupError::Timeout(KUBE_API_TIMEOUT))?
            .map_err(|e| LookupError::Failed(e.to_string()))?;
        Ok(account.map(|a| a.metadata.uid.unwrap_or_default()))
    }
}
