//! `[admin] metrics_auth = "kubernetes"`: who may read `/metrics`, asked of the API server as
//! kube-rbac-proxy asks it. A TokenReview of the scraper's bearer token (no audience: the API
//! server's own, which a pod's service-account token carries), then a SubjectAccessReview for
//! that user, its groups, UID and extra: `get` on the non-resource URL `/metrics`. podca needs
//! `create` on `tokenreviews` (the gRPC API has it) and on `subjectaccessreviews`; the scraper
//! a ClusterRole with `nonResourceURLs: ["/metrics"], verbs: ["get"]`.
//!
//! The admin listener ([`podca_authority::admin`]) maps the [`Verdict`]s to 401, 403 and 503;
//! decisions are cached by [`CachedMetricsAuth`]. Each call is bounded by [`KUBE_API_TIMEOUT`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use podca_authority::Runtime;
use podca_authority::config::{AdminConfig, MetricsAuthMode};
use podca_authority::metrics_auth::{
    CacheLimits, CachedMetricsAuth, MetricsAuth, ScrapeToken, Verdict,
};
use podca_grpc::auth::{KUBE_API_TIMEOUT, LookupError};
use tracing::{info, warn};

/// The path and verb a scraper must be granted.
pub const METRICS_PATH: &str = "/metrics";
pub const METRICS_VERB: &str = "get";

/// With `metrics_auth = "kubernetes"`: the runtime's `/metrics` answers only the tokens the
/// API server allows (cached, see [`CacheLimits`]). With `"none"`: nothing changes.
pub fn protect_metrics(rt: &mut Runtime, client: &kube::Client, admin: &AdminConfig) {
    match admin.metrics_auth {
        MetricsAuthMode::None => {}
        MetricsAuthMode::Kubernetes => {
            info!("/metrics: bearer token, TokenReview and SubjectAccessReview (get /metrics)");
            let kube = Arc::new(KubeMetricsAuth::new(client.clone()));
            rt.protect_metrics(Arc::new(CachedMetricsAuth::new(
                kube,
                CacheLimits::default(),
            )));
        }
    }
}

/// TokenReview, then SubjectAccessReview, through the Kubernetes API.
#[derive(Clone)]
pub struct KubeMetricsAuth {
    client: kube::Client,
}

impl fmt::Debug for KubeMetricsAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KubeMetricsAuth")
    }
}

impl KubeMetricsAuth {
    pub fn new(client: kube::Client) -> Self {
        KubeMetricsAuth { client }
    }

    async fn decide(&self, token: &ScrapeToken) -> Result<Verdict, LookupError> {
        let status = token_review(&self.client, token.expose(), None).await?;
        if !status.authenticated.unwrap_or(false) {
            return Ok(Verdict::Unauthenticated);
        }
        let user = status.user.unwrap_or_default();
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.into()),
                    verb: Some(METRICS_VERB.into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let answer = tokio::time::timeout(
            KUBE_API_TIMEOUT,
            api.create(&kube::api::PostParams::default(), &review),
        )
        .await
        .map_err(|_| LookupError::Timeout(KUBE_API_TIMEOUT))?
        .map_err(|e| LookupError::Failed(e.to_string()))?;
        Ok(match answer.status.is_some_and(|s| s.allowed) {
            true => Verdict::Allowed,
            false => Verdict::Forbidden,
        })
    }
}

impl MetricsAuth for KubeMetricsAuth {
    fn authorize<'a>(
        &'a self,
        token: &'a ScrapeToken,
    ) -> Pin<Box<dyn Future<Output = Verdict> + Send + 'a>> {
        Box::pin(async move {
            match self.decide(token).await {
                Ok(verdict) => verdict,
                Err(error) => {
                    // Fail closed; the error names the URL and status, never the token.
                    warn!(%error, "/metrics: the API server could not be asked about a token");
                    Verdict::Unavailable
                }
            }
        })
    }
}

/// One TokenReview (authentication.k8s.io/v1) of `token` for `audiences` (`None`: the API
/// server's own): its status, user and groups included.
pub async fn token_review(
    client: &kube::Client,
    token: &str,
    audiences: Option<Vec<String>>,
) -> Result<TokenReviewStatus, LookupError> {
    let api: kube::Api<TokenReview> = kube::Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences,
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
    Ok(answer.status.unwrap_or_default())
}
