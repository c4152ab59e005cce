//! JWT-SVIDs at the gRPC edge: issuing for an identified caller, validating a token against the
//! published keys, and the bundle message. The Workload API ([`crate::workload`]) calls these;
//! the rules themselves are `podca_signer::jwt`'s.

use std::collections::HashMap;
use std::sync::Arc;

use podca_authority::jwt::{JwtConfig, JwtHandle};
use podca_proto::workload::JwtBundlesResponse;
use podca_signer::jwt::{
    Expectations, IssueLimits, JwtError, JwtKeySet, SignedSvid, SvidRequest, ValidatedSvid,
};
use podca_signer::policy::Decision;
use time::Duration;

use super::auth::Identity;
use super::core::Api;
use super::errors::ApiError;
use super::federation::ForeignBundle;

/// How often bundle consumers should re-fetch (the bundle's `spiffe_refresh_hint`): often
/// enough to see a prepared key well within the propagation window.
pub fn refresh_hint(config: &JwtConfig) -> Duration {
    Duration::seconds(i64::from(config.propagation_seconds / 3).max(1))
}

/// One JWT-SVID to issue ([`JwtService::issue`]).
#[derive(Debug, Clone)]
pub struct JwtAsk<'a> {
    /// The signer whose policy and trust domain apply; empty: `grpc.signer`.
    pub signer: &'a str,
    /// Whom the token is for.
    pub subject: &'a Identity,
    /// Who asked (a node proxy for a pod on its node, else the subject).
    pub caller: &'a Identity,
    /// `namespace/name` of the pod a node proxy asked for.
    pub request_name: Option<String>,
    pub audiences: &'a [String],
    /// The Workload API's `spiffe_id` selection (empty: none).
    pub spiffe_id: &'a str,
    /// The requested lifetime (None: `[jwt] default_lifetime_seconds`).
    pub lifetime: Option<Duration>,
}

/// The JWT-SVID half of the API.
#[derive(Debug, Clone)]
pub struct JwtService {
    keys: JwtHandle,
    limits: IssueLimits,
    refresh_hint: Duration,
}

impl JwtService {
    pub fn new(keys: JwtHandle, config: &JwtConfig) -> Self {
        JwtService {
            keys,
            limits: config.limits(),
            refresh_hint: refresh_hint(config),
        }
    }

    pub fn keys(&self) -> &JwtHandle {
        &self.keys
    }

    pub fn limits(&self) -> &IssueLimits {
        &self.limits
    }

    /// Issues a JWT-SVID for `ask.subject` under `ask.signer`'s policy and records the decision
    /// (issued, or denied by the policy or for another `spiffe_id`) in the API's ledger before
    /// it returns. `spiffe_id`, when not empty, must be the subject's own (podca gives each
    /// caller exactly one). Bad input (audiences) and a missing key are answered, not recorded,
    /// as for certificates.
    pub async fn issue(&self, api: &Api, ask: JwtAsk<'_>) -> Result<SignedSvid, ApiError> {
        let (signer, _) = api.signer(ask.signer)?;
        let signer = signer.to_owned();
        let result = self.issue_unrecorded(api, &signer, &ask).await;
        api.settle_jwt(result, &signer, ask.subject, ask.caller, ask.request_name)
            .await
    }

    async fn issue_unrecorded(
        &self,
        api: &Api,
        signer: &str,
        ask: &JwtAsk<'_>,
    ) -> Result<SignedSvid, ApiError> {
        let identity = ask.subject;
        let (_, policy) = api.signer(signer)?;
        // A tenant's policy: its trust domain (a tenant's tokens would need keys of its own).
        let (policy, _) = Api::resolve(policy, &identity.namespace)?;
        let policy = &policy;
        // One key set, for the [grpc] signer's trust domain: never shared with another.
        let served = api.trust_domain()?;
        if policy.trust_domain != served {
            return Err(ApiError::JwtTrustDomain {
                signer: signer.to_owned(),
                trust_domain: policy.trust_domain.clone(),
                served,
            });
        }
        // The allow-lists first: a refused request costs no API call for its facts.
        if let Err(Decision::Deny { reason, message }) =
            policy.admits(&identity.namespace, &identity.service_account)
        {
            return Err(ApiError::Denied { reason, message });
        }
        let labels = api.namespace_labels_for(policy, &identity.namespace)?;
        let pod = api.pod_facts_for(policy, signer, identity).await?;
        let plan = crate::admission::admit_jwt(
            policy,
            &crate::admission::JwtFacts {
                signer,
                subject: identity,
                audiences: ask.audiences,
                spiffe_id: ask.spiffe_id,
                lifetime: ask.lifetime,
                namespace_labels: labels.as_deref(),
                pod: pod.as_ref(),
                now: api.now(),
            },
            &self.limits,
        )?;
        let keys = self.keys.current();
        let now = api.now();
        let quick = keys
            .signing(now)
            .is_some_and(|(_, key)| key.signs_quickly_in_process());
        let crate::admission::JwtPlan {
            spiffe_id: own,
            limits,
            lifetime,
        } = plan;
        let audiences = ask.audiences.to_vec();
        let sign = move |keys: &JwtKeySet| {
            keys.sign(
                &SvidRequest {
                    spiffe_id: &own,
                    audiences: &audiences,
                    lifetime,
                },
                &limits,
                now,
            )
        };
        let signed = if quick {
            sign(&keys)
        } else {
            // HSM keys wait on the device: keep that off the async workers.
            tokio::task::spawn_blocking(move || sign(&keys))
                .await
                .map_err(|e| ApiError::Internal(format!("JWT signing task failed: {e}")))?
        };
        signed.map_err(ApiError::Jwt)
    }

    /// Validates `token` for `audience` against the published keys.
    pub fn validate(
        &self,
        api: &Api,
        token: &str,
        audience: &str,
    ) -> Result<ValidatedSvid, ApiError> {
        if audience.is_empty() {
            return Err(ApiError::EmptyField("audience"));
        }
        if token.is_empty() {
            return Err(ApiError::EmptyField("svid"));
        }
        let trust_domain = api.trust_domain()?;
        let bundle = self.keys.current().bundle(None);
        podca_signer::jwt::validate(
            token,
            &bundle,
            &Expectations {
                audience,
                trust_domain: Some(&trust_domain),
                max_audiences: self.limits.max_audiences,
            },
            api.now(),
        )
        .map_err(ApiError::Jwt)
    }

    /// [`validate`](Self::validate) for a token of a federated trust domain: checked against
    /// that trust domain's JWT authorities, its `sub` in that trust domain.
    pub fn validate_foreign(
        &self,
        api: &Api,
        token: &str,
        audience: &str,
        foreign: &ForeignBundle,
    ) -> Result<ValidatedSvid, ApiError> {
        if audience.is_empty() {
            return Err(ApiError::EmptyField("audience"));
        }
        podca_signer::jwt::validate(
            token,
            &foreign.jwt_bundle(),
            &Expectations {
                audience,
                trust_domain: Some(&foreign.trust_domain),
                max_audiences: self.limits.max_audiences,
            },
            api.now(),
        )
        .map_err(ApiError::Jwt)
    }

    /// The SPIFFE bundle JWKS of the published keys.
    pub fn bundle_json(&self, keys: &JwtKeySet) -> Vec<u8> {
        keys.bundle(Some(self.refresh_hint)).to_json()
    }

    /// One `FetchJWTBundles` message.
    pub fn bundles_response(&self, trust_domain: &str, keys: &JwtKeySet) -> JwtBundlesResponse {
        JwtBundlesResponse {
            bundles: HashMap::from([(format!("spiffe://{trust_domain}"), self.bundle_json(keys))]),
        }
    }
}

/// The validated claims as a `google.protobuf.Struct`, as ValidateJWTSVID returns them.
pub fn claims_struct(validated: &ValidatedSvid) -> Result<prost_types::Struct, JwtError> {
    let value =
        serde_json::to_value(&validated.claims).map_err(|_| JwtError::Malformed("the claims"))?;
    let serde_json::Value::Object(map) = value else {
        return Err(JwtError::Malformed("the claims are not an object"));
    };
    Ok(prost_types::Struct {
        fields: map.into_iter().map(|(k, v)| (k, to_prost(v))).collect(),
    })
}

fn to_prost(value: serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s),
        serde_json::Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.into_iter().map(to_prost).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o.into_iter().map(|(k, v)| (k, to_prost(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A shared [`JwtService`], or None when `[jwt] enabled = false`.
pub type MaybeJwt = Option<Arc<JwtService>>;
