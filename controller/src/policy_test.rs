//! `podca policy test`'s decision for one sample, offline: a PodCertificateRequest through the
//! controller's own conversion and plan ([`crate::sample`]), a gRPC, Istio or JWT request
//! description through the gRPC API's own admission (`podca_grpc::admission`, then
//! `sign_request_with`). The certificate is signed by a throwaway CA that never limits the
//! answer; the result is a [`Verdict`] the command line prints.

use std::collections::BTreeMap;

use podca_authority::config::Config;
use podca_grpc::admission::{CertificateAsk, JwtFacts, JwtPlan, admit_certificate, admit_jwt};
use podca_grpc::auth::Identity;
use podca_grpc::errors::ApiError;
use podca_signer::keys::GeneratedKey;
use podca_signer::rules::RequestSource;
use podca_signer::verdict::{IssuedFacts, Verdict, passed, verdict};
use podca_signer::{
    CertificateRequest, DenyReason, KeyType, Outcome, RequestContext, SignerPolicy,
    sign_request_with,
};
use serde::Deserialize;
use time::{Duration, OffsetDateTime};

use crate::sample::{
    LabelsSample, PcrSample, PodSample, SampleError, labels_for, pod_for, throwaway_ca,
};

/// A configuration error met while deciding, as one line.
fn config_error(e: impl std::fmt::Display) -> SampleError {
    SampleError(format!("{e:#}"))
}

/// A gRPC, Istio or JWT request, as described in a sample file (docs/policy.md,
/// "Testing policy in CI"). Only the facts podca verified for such a request, plus the
/// annotations the client sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    source: DescribedSource,
    /// The signer the client names (gRPC, JWT); default: the `[grpc]` signer.
    #[serde(default)]
    signer: Option<String>,
    namespace: String,
    service_account: String,
    #[serde(default)]
    pod: Option<PodRef>,
    #[serde(default)]
    node: Option<NodeRef>,
    /// The CSR's key type (default ECDSAP256); not for JWTs.
    #[serde(default)]
    key_type: Option<KeyType>,
    #[serde(default)]
    requested_lifetime_seconds: Option<i64>,
    /// podca.v1 `user_annotations` (gRPC only).
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    /// JWT-SVID audiences (JWT only).
    #[serde(default)]
    audiences: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum DescribedSource {
    Grpc,
    Istio,
    Jwt,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodRef {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeRef {
    name: String,
}

pub fn signer_list(config: &Config) -> String {
    if config.signers.is_empty() {
        return "none".into();
    }
    config
        .signers
        .keys()
        .map(|k| format!("{k:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn decide_pcr(
    config: &Config,
    sample: &PcrSample,
    labels: Option<&LabelsSample>,
    pod: Option<&PodSample>,
    now: OffsetDateTime,
) -> Result<Verdict, SampleError> {
    let ca = throwaway_ca(now)?;
    let mut notes = Vec::new();
    let policy = config.signers.get(sample.signer_name());
    let ns_labels = labels_for(labels, sample.namespace(), policy, &mut notes);
    let pod = pod_for(
        pod,
        (Some(sample.pod_name()), Some(sample.pod_uid())),
        policy,
        &mut notes,
    );
    if let Some(terminal) = sample.terminal() {
        notes.push(format!(
            "the object is already {terminal}: its spec was decided anew (status ignored)"
        ));
    }
    let decide = |signers: &BTreeMap<String, SignerPolicy>| match &pod {
        Ok(facts) => sample.decide(signers, &ca, ns_labels, *facts, now),
        Err(other) => Ok(Outcome::Denied {
            reason: DenyReason::PodNotFound,
            message: other.to_string(),
        }),
    };
    let outcome = decide(&config.signers)?;
    let request = format!(
        "PodCertificateRequest {}/{} ({}), signer {:?}, service account {}/{}, pod {}, node {}",
        sample.namespace(),
        sample.name(),
        sample.api_version(),
        sample.signer_name(),
        sample.namespace(),
        sample.service_account(),
        sample.pod_name(),
        sample.node_name()
    );
    let rerun = |p: &SignerPolicy| {
        let mut signers = config.signers.clone();
        signers.insert(sample.signer_name().to_owned(), p.clone());
        decide(&signers).ok()
    };
    // Reason and message as the controller writes them into the condition.
    let condition = crate::sample::condition(&outcome, now);
    let mut v = verdict(
        outcome,
        policy,
        sample.signer_name(),
        request,
        notes,
        &rerun,
    );
    if let Some((_, reason, message)) = condition {
        v.reason = reason;
        v.message = message;
    }
    v.ca = signing_ca(config, sample.signer_name(), sample.namespace());
    Ok(v)
}

pub fn decide_description(
    config: &Config,
    d: Description,
    signer_flag: Option<&str>,
    (labels, pod_file): (Option<&LabelsSample>, Option<&PodSample>),
    now: OffsetDateTime,
) -> Result<Verdict, SampleError> {
    if d.namespace.is_empty() || d.service_account.is_empty() {
        return Err(SampleError(
            "request description: namespace and service_account must not be empty".into(),
        ));
    }
    let named = signer_flag.or(d.signer.as_deref());
    let (signer, policy) = match (d.source, named) {
        (DescribedSource::Istio, Some(name))
            if name != config.grpc_signer().map_err(config_error)?.0 =>
        {
            return Err(SampleError(format!(
                "request description: the Istio CA API always issues for the [grpc] signer {:?}, \
             not {name:?}",
                config.grpc_signer().map_err(config_error)?.0
            )));
        }
        (_, Some(name)) => {
            let policy = config.signers.get(name).ok_or_else(|| {
                SampleError(format!(
                    "request description: signer {name:?} is not a configured signer \
                     (configured: {})",
                    signer_list(config)
                ))
            })?;
            (name, policy)
        }
        (_, None) => config.grpc_signer().map_err(config_error)?,
    };
    if !config
        .grpc_allowed_signers()
        .map_err(config_error)?
        .iter()
        .any(|s| s == signer)
    {
        return Err(SampleError(format!(
            "request description: signer {signer:?} is not offered over gRPC ([grpc] signers): \
             podca would refuse the request before its policy runs"
        )));
    }
    let lifetime = match d.requested_lifetime_seconds {
        Some(s) if s <= 0 => {
            return Err(SampleError(format!(
                "request description: requested_lifetime_seconds must be positive, not {s}"
            )));
        }
        other => other,
    };
    if d.source != DescribedSource::Grpc && !d.annotations.is_empty() {
        return Err(SampleError(
            "request description: annotations are podca.v1 user_annotations (source grpc only)"
                .into(),
        ));
    }
    if d.source != DescribedSource::Jwt && !d.audiences.is_empty() {
        return Err(SampleError(
            "request description: audiences are for JWT-SVIDs (source jwt only)".into(),
        ));
    }
    let mut notes = Vec::new();
    let ns_labels = labels_for(labels, &d.namespace, Some(policy), &mut notes);
    let pod_name = d.pod.as_ref().and_then(|p| p.name.clone());
    let pod_uid = d.pod.as_ref().and_then(|p| p.uid.clone());
    let node_name = d.node.as_ref().map(|n| n.name.clone());
    let pod = pod_for(
        pod_file,
        (pod_name.as_deref(), pod_uid.as_deref()),
        Some(policy),
        &mut notes,
    );
    let source = match d.source {
        DescribedSource::Grpc => RequestSource::Grpc,
        DescribedSource::Istio => RequestSource::Istio,
        DescribedSource::Jwt => RequestSource::Jwt,
    };
    let mut request = format!(
        "{} request, signer {signer:?}, service account {}/{}",
        source.as_str(),
        d.namespace,
        d.service_account
    );
    if let Some(p) = &pod_name {
        request.push_str(&format!(", pod {p}"));
    }
    if let Some(n) = &node_name {
        request.push_str(&format!(", node {n}"));
    }

    if d.source == DescribedSource::Jwt {
        if d.key_type.is_some() {
            return Err(SampleError(
                "request description: key_type is for certificates, not JWT-SVIDs".into(),
            ));
        }
        if d.audiences.is_empty() {
            return Err(SampleError(
                "request description: a JWT-SVID request needs at least one audience".into(),
            ));
        }
        if !config.jwt.enabled {
            return Err(SampleError(
                "[jwt] enabled = false: podca issues no JWT-SVIDs with this config".into(),
            ));
        }
        // The JWT-SVID decision of the gRPC API itself: allow-lists, rules, their lifetime cap.
        let limits = config.jwt.limits();
        let subject = Identity {
            pod_name: pod_name.clone(),
            pod_uid: pod_uid.clone(),
            node_name: node_name.clone(),
            ..Identity::service_account(&d.namespace, &d.service_account)
        };
        let decide = |p: &SignerPolicy| -> Result<JwtPlan, ApiError> {
            let pod = pod.clone().map_err(|other| ApiError::Denied {
                reason: DenyReason::PodNotFound,
                message: other.to_string(),
            })?;
            // As the gRPC API: the policy of the namespace's tenant, if any.
            let (p, _) = podca_grpc::Api::resolve(p, &d.namespace)?;
            let p = &p;
            let facts = JwtFacts {
                signer,
                subject: &subject,
                audiences: &d.audiences,
                spiffe_id: "",
                lifetime: lifetime.map(Duration::seconds),
                namespace_labels: ns_labels,
                pod,
                now,
            };
            admit_jwt(p, &facts, &limits)
        };
        let denied = |refused: ApiError| match refused {
            ApiError::Denied { reason, message } => Some(Outcome::Denied { reason, message }),
            _ => None,
        };
        request.push_str(&format!(", audiences {}", d.audiences.join(", ")));
        return Ok(match decide(policy) {
            Err(ApiError::Denied { reason, message }) => verdict(
                Outcome::Denied { reason, message },
                Some(policy),
                signer,
                request,
                notes,
                &|p| decide(p).err().and_then(denied),
            ),
            Err(other) => {
                return Err(SampleError(format!(
                    "request description: podca would refuse it: {other}"
                )));
            }
            Ok(plan) => {
                notes.push(
                    "the JWT signing key's own end, which can shorten a token, is not simulated"
                        .into(),
                );
                let expires = plan.expiry(now, None);
                Verdict {
                    decision: "Issued",
                    reason: podca_signer::reason::ISSUED.into(),
                    message: String::new(),
                    decided_by: passed(policy),
                    request,
                    // Signed with the JWT keys, not a CA.
                    ca: None,
                    issued: Some(IssuedFacts {
                        spiffe_id: plan.spiffe_id,
                        dns_names: vec![],
                        ip_addresses: vec![],
                        lifetime_seconds: (expires - now).whole_seconds(),
                        not_before: None,
                        not_after: expires,
                    }),
                    notes,
                }
            }
        });
    }

    let key_type = d.key_type.unwrap_or(KeyType::EcdsaP256);
    request.push_str(&format!(", key {}", key_type.kubelet_name()));
    let key = GeneratedKey::generate(key_type)
        .map_err(|e| SampleError(format!("generating a {} key: {e}", key_type.kubelet_name())))?
        .public;
    let ca = throwaway_ca(now)?;
    // The gRPC API's own checks (lifetime form, the DNS-name limit) before the policy.
    let admitted = admit_certificate(
        policy,
        &CertificateAsk {
            requested_lifetime_seconds: lifetime,
            user_annotations: &d.annotations,
            max_dns_names: config.grpc.max_dns_names,
        },
    )
    .map_err(|refused| {
        SampleError(format!(
            "request description: podca would refuse it before its policy runs: {refused}"
        ))
    })?;
    let certificate_request = CertificateRequest {
        key: Ok(key),
        namespace: d.namespace.clone(),
        service_account: d.service_account.clone(),
        pod_name: pod_name.clone(),
        max_expiration: None,
        requested_lifetime: admitted.requested_lifetime,
        user_annotations: d.annotations.clone(),
    };
    let decide = |p: &SignerPolicy| {
        let pod = match &pod {
            Ok(pod) => *pod,
            Err(other) => {
                return Outcome::Denied {
                    reason: DenyReason::PodNotFound,
                    message: other.to_string(),
                };
            }
        };
        // As the gRPC API: the policy of the namespace's tenant, if any.
        let p = &match p.resolve(&d.namespace) {
            Ok((p, _)) => p,
            Err(refusal) => return Outcome::of_refusal(refusal),
        };
        let context = RequestContext {
            source,
            signer_name: signer,
            pod_uid: pod_uid.as_deref(),
            node_name: node_name.as_deref(),
            namespace_labels: ns_labels,
            pod,
            renewal: None,
            service_sans: None,
        };
        sign_request_with(p, &ca, &certificate_request, &context, now)
    };
    let outcome = decide(policy);
    let mut v = verdict(outcome, Some(policy), signer, request, notes, &|p| {
        Some(decide(p))
    });
    v.ca = signing_ca(config, signer, &d.namespace);
    Ok(v)
}

/// The CA that signs for `signer` in `namespace`: its tenant's (with the tenant and its trust
/// domain), else the signer's own, with its table and the signers it is shared with.
fn signing_ca(config: &Config, signer: &str, namespace: &str) -> Option<String> {
    let policy = config.signers.get(signer)?;
    if let Ok(Some(tenant)) = policy.tenant_of(namespace) {
        return Some(format!(
            "{ca} ([cas.{ca}]), tenant {} (trust domain {})",
            tenant.name,
            tenant.trust_domain(&policy.trust_domain),
            ca = tenant.ca(),
        ));
    }
    let name = config.ca_of_signer(signer)?;
    let table = match name {
        podca_authority::config::DEFAULT_CA_NAME => "[ca]".to_owned(),
        other => format!("[cas.{other}]"),
    };
    let shared: Vec<&str> = config
        .signers_by_ca()
        .into_iter()
        .find(|(ca, _)| *ca == name)
        .map(|(_, signers)| signers.into_iter().filter(|s| *s != signer).collect())
        .unwrap_or_default();
    Some(match shared.is_empty() {
        true => format!("{name} ({table})"),
        false => format!("{name} ({table}; shared with {})", shared.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CA line names the table, and the signers a shared CA also signs for.
    #[test]
    fn the_signing_ca_is_named_with_whom_it_is_shared() {
        let config = Config::parse(
            "[cas.own]\ndir = \"/tmp/own\"\n\
             [signers.\"example.com/a\"]\ntrust_domain = \"a.test\"\n\
             [signers.\"example.com/b\"]\ntrust_domain = \"b.test\"\n\
             [signers.\"example.com/c\"]\ntrust_domain = \"c.test\"\nca = \"own\"\n",
        )
        .unwrap();
        assert_eq!(
            signing_ca(&config, "example.com/a", "ns").as_deref(),
            Some("default ([ca]; shared with example.com/b)")
        );
        assert_eq!(
            signing_ca(&config, "example.com/c", "ns").as_deref(),
            Some("own ([cas.own])")
        );
        assert_eq!(signing_ca(&config, "example.com/none", "ns"), None);
        let tenants = Config::parse(
            "[cas.team-a]\ndir = \"/tmp/a\"\n\
             [signers.\"example.com/m\"]\ntrust_domain = \"m.test\"\nuntenanted = \"signer\"\n\
             [signers.\"example.com/m\".tenants.team-a]\nnamespaces = [\"shop\"]\n",
        )
        .unwrap();
        assert_eq!(
            signing_ca(&tenants, "example.com/m", "shop").as_deref(),
            Some("team-a ([cas.team-a]), tenant team-a (trust domain team-a.m.test)")
        );
        assert_eq!(
            signing_ca(&tenants, "example.com/m", "other").as_deref(),
            Some("default ([ca])")
        );
    }
}
