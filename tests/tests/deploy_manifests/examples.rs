//! The workload examples of deploy/examples, held to the configs they are written for: the
//! tenant's pod (deploy/examples/tenant-pod.yaml) parses strictly into its Kubernetes types, and
//! with the tenants flavour's config (the overlay's, and the Helm example's) it belongs to a
//! tenant, podca would issue its certificate in the tenant's trust domain within the tenant CA's
//! nameConstraints, and its clusterTrustBundle projection selects exactly that tenant's bundle
//! among every bundle podca publishes (named and labelled by podca's own publisher).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ClusterTrustBundleProjection, Pod, PodCertificateProjection, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use podca_authority::config::Config;
use podca_controller::publisher::{DesiredBundle, Publisher, PublisherOptions, TENANT_LABEL};
use podca_signer::KeyType;
use podca_signer::constraints::dns_within;
use podca_signer::policy::{Decision, RequestFacts};
use serde_json::Value;

use crate::config::config;
use crate::render::{documents, kind_of, name_of, repo_root};
use crate::strict::{parse_overlay, strict};
use crate::{TENANT_POD, TENANTS};

/// Every ClusterTrustBundle podca publishes for `cfg`, with its labels, as podca's publisher
/// names and labels them (the owner labels; a tenant's bundle also `podca.dev/tenant`).
pub fn bundles_of(cfg: &Config) -> Vec<(DesiredBundle, BTreeMap<String, String>)> {
    let options = PublisherOptions {
        suffix: cfg.trust_bundles.suffix.clone(),
        instance: cfg.trust_bundles.instance.clone(),
        ..PublisherOptions::default()
    };
    let publisher = Publisher::for_policies(&cfg.signers, &options)
        .unwrap_or_else(|e| panic!("podca would not publish: {e}"));
    let mut bundles: Vec<_> = publisher
        .bundles()
        .iter()
        .map(|b| {
            let mut labels = publisher.labels().clone();
            if let Some(tenant) = &b.tenant {
                labels.insert(TENANT_LABEL.to_string(), tenant.clone());
            }
            (b.clone(), labels)
        })
        .collect();
    bundles.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    bundles
}

/// Whether `selector` selects an object with `labels` (Kubernetes label selector semantics:
/// every matchLabels pair and every matchExpressions requirement).
pub fn selects(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let pairs = selector.match_labels.iter().flatten();
    let mut ok = pairs.into_iter().all(|(k, v)| labels.get(k) == Some(v));
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default();
        let value = labels.get(&e.key);
        ok &= match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => return Err(format!("label selector operator {other:?}")),
        };
    }
    Ok(ok)
}

/// The objects of an example file, each parsed strictly into its k8s-openapi type.
pub struct Example {
    pub pods: Vec<Pod>,
    pub service_accounts: Vec<ServiceAccount>,
}

pub fn parse_example(docs: &[Value]) -> Result<Example, Vec<String>> {
    let mut ex = Example {
        pods: vec![],
        service_accounts: vec![],
    };
    let mut errors = Vec::new();
    for doc in docs {
        let result = match kind_of(doc) {
            ("v1", "Pod") => strict(doc).map(|o| ex.pods.push(o)),
            ("v1", "ServiceAccount") => strict(doc).map(|o| ex.service_accounts.push(o)),
            (api, kind) => Err(format!(
                "{}: unexpected object {api} {kind} in an example",
                name_of(doc)
            )),
        };
        if let Err(e) = result {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(ex)
    } else {
        Err(errors)
    }
}

/// The tenant pod example as YAML documents.
pub fn tenant_pod_docs() -> Vec<Value> {
    let path = repo_root().join(TENANT_POD);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    documents(&text)
}

/// What a tenant's pod gets from podca under `cfg`: its tenant, SPIFFE ID and bundle.
#[derive(Debug, PartialEq, Eq)]
pub struct TenantPod {
    pub tenant: String,
    pub spiffe_id: String,
    pub bundle: String,
}

/// The tenant pod of `ex` under `cfg`: its namespace belongs to a tenant of the signer its
/// podCertificate projection names; podca issues its certificate in the tenant's trust domain
/// with DNS names inside the tenant CA's nameConstraints; its clusterTrustBundle projection, for
/// the same signer, selects exactly the tenant's bundle of every bundle podca publishes; the
/// volume is mounted read-only; its ServiceAccount is in the file; the pod meets the
/// `restricted` Pod Security Standard's container rules.
pub fn check_tenant_pod(cfg: &Config, ex: &Example) -> Result<TenantPod, String> {
    let [pod] = &ex.pods[..] else {
        return Err(format!("{} pods, not one", ex.pods.len()));
    };
    let ns = pod.metadata.namespace.as_deref().ok_or("no namespace")?;
    let name = pod.metadata.name.as_deref().ok_or("no name")?;
    let spec = pod.spec.as_ref().ok_or("no spec")?;
    let sa = spec.service_account_name.as_deref().unwrap_or("default");
    let has_sa = ex.service_accounts.iter().any(|s| {
        s.metadata.name.as_deref() == Some(sa) && s.metadata.namespace.as_deref() == Some(ns)
    });
    if !has_sa {
        return Err(format!(
            "the ServiceAccount {ns}/{sa} is not in the example"
        ));
    }
    // The projected volume with both sources, mounted read-only.
    let mut found: Option<(
        &str,
        &PodCertificateProjection,
        &ClusterTrustBundleProjection,
    )> = None;
    for v in spec.volumes.iter().flatten() {
        let sources = v.projected.iter().flat_map(|p| p.sources.iter().flatten());
        let certs: Vec<_> = sources
            .clone()
            .filter_map(|s| s.pod_certificate.as_ref())
            .collect();
        let bundles: Vec<_> = sources
            .filter_map(|s| s.cluster_trust_bundle.as_ref())
            .collect();
        match (&certs[..], &bundles[..]) {
            ([], []) => {}
            ([cert], [bundle]) if found.is_none() => found = Some((&v.name, cert, bundle)),
            _ => {
                return Err(format!(
                    "volume {}: {} podCertificate and {} clusterTrustBundle sources (one of \
                     each, in one volume)",
                    v.name,
                    certs.len(),
                    bundles.len()
                ));
            }
        }
    }
    let (volume, cert, bundle) = found.ok_or("no projected podCertificate volume")?;
    if cert.credential_bundle_path.is_none() {
        return Err("podCertificate without credentialBundlePath".into());
    }
    if bundle.path.is_empty() {
        return Err("clusterTrustBundle without path".into());
    }
    let containers = &spec.containers;
    let mounted = containers.iter().any(|c| {
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == volume && m.read_only == Some(true))
    });
    if !mounted {
        return Err(format!("the volume {volume} is not mounted read-only"));
    }
    // The tenant the namespace belongs to, of the signer that signs the pod's certificate.
    let signer = cert.signer_name.as_str();
    let policy = cfg
        .signers
        .get(signer)
        .ok_or_else(|| format!("signer {signer} is not configured"))?;
    let tenant = match policy.tenant_of(ns) {
        Ok(Some(t)) => t,
        Ok(None) => return Err(format!("namespace {ns} belongs to no tenant of {signer}")),
        Err(d) => return Err(format!("namespace {ns} is refused by {signer}: {d:?}")),
    };
    // podca's decision for the pod's request.
    let (resolved, tenant_name) = policy.resolve(ns).map_err(|d| format!("{d:?}"))?;
    if tenant_name.as_deref() != Some(tenant.name) {
        return Err(format!(
            "decided as tenant {tenant_name:?}, not {}",
            tenant.name
        ));
    }
    let key_type: KeyType = serde_json::from_value(Value::String(cert.key_type.clone()))
        .map_err(|e| format!("keyType {}: {e}", cert.key_type))?;
    let annotations = BTreeMap::new();
    let plan = match resolved.decide(&RequestFacts {
        namespace: ns,
        service_account: sa,
        pod_name: Some(name),
        key_type: Ok(key_type),
        user_annotations: &annotations,
    }) {
        Decision::Issue(plan) => plan,
        other => return Err(format!("podca would not issue: {other:?}")),
    };
    let trust_domain = tenant.trust_domain(&policy.trust_domain);
    let spiffe_id = format!("spiffe://{trust_domain}/ns/{ns}/sa/{sa}");
    if plan.spiffe_id != spiffe_id {
        return Err(format!("SPIFFE ID {} is not {spiffe_id}", plan.spiffe_id));
    }
    let constraints = cfg
        .init_constraints(tenant.ca())
        .ok_or("the tenant's CA is no tenant CA")?
        .map_err(|e| e.to_string())?;
    for dns in &plan.dns_names {
        if !constraints
            .permitted_dns
            .iter()
            .any(|base| dns_within(dns, base))
        {
            return Err(format!(
                "DNS name {dns} is outside the tenant CA's constraints"
            ));
        }
    }
    // The bundle: the same signer's, selected by labels, exactly the tenant's.
    if bundle.name.is_some() || bundle.signer_name.as_deref() != Some(signer) {
        return Err(format!(
            "the clusterTrustBundle source names {:?}/{:?}, not the signer {signer} with a \
             label selector",
            bundle.name, bundle.signer_name
        ));
    }
    let selector = bundle
        .label_selector
        .as_ref()
        .ok_or("the clusterTrustBundle source has no labelSelector")?;
    let mut selected = Vec::new();
    for (b, labels) in bundles_of(cfg) {
        if b.signer_name == signer && selects(selector, &labels)? {
            selected.push(b);
        }
    }
    let want = bundles_of(cfg)
        .into_iter()
        .find(|(b, _)| b.signer_name == signer && b.tenant.as_deref() == Some(tenant.name))
        .map(|(b, _)| b.name)
        .ok_or("podca publishes no bundle for the tenant")?;
    let names: Vec<&str> = selected.iter().map(|b| b.name.as_str()).collect();
    if names != [want.as_str()] {
        return Err(format!(
            "the labelSelector selects {names:?}, not exactly the tenant's bundle {want}"
        ));
    }
    // The restricted Pod Security Standard, as far as the manifest says it.
    let psc = spec.security_context.as_ref();
    let pod_non_root = psc.and_then(|s| s.run_as_non_root) == Some(true);
    let pod_seccomp = psc
        .and_then(|s| s.seccomp_profile.as_ref())
        .is_some_and(|p| p.type_ == "RuntimeDefault");
    for c in containers {
        let sc = c.security_context.as_ref();
        let restricted = sc.and_then(|s| s.allow_privilege_escalation) == Some(false)
            && sc
                .and_then(|s| s.capabilities.as_ref())
                .and_then(|caps| caps.drop.as_deref())
                == Some(&["ALL".to_string()][..])
            && (pod_non_root || sc.and_then(|s| s.run_as_non_root) == Some(true))
            && (pod_seccomp
                || sc
                    .and_then(|s| s.seccomp_profile.as_ref())
                    .is_some_and(|p| p.type_ == "RuntimeDefault"));
        if !restricted {
            return Err(format!("container {} is not `restricted`", c.name));
        }
    }
    Ok(TenantPod {
        tenant: tenant.name.to_string(),
        spiffe_id,
        bundle: want,
    })
}

fn tenant_pod() -> Example {
    parse_example(&tenant_pod_docs()).unwrap_or_else(|errors| {
        panic!(
            "{TENANT_POD}: objects that do not match their Kubernetes 1.37 schema:\n  {}",
            errors.join("\n  ")
        )
    })
}

/// The tenants flavour's configs: the overlay's and the Helm example's.
fn tenants_configs() -> Vec<(&'static str, Config)> {
    vec![
        ("overlay tenants", config(&parse_overlay("tenants"))),
        ("helm tenants", config(&crate::helm::parse_helm("tenants"))),
    ]
}

#[test]
fn the_tenant_pod_gets_its_tenants_certificate_and_only_its_tenants_bundle() {
    let ex = tenant_pod();
    assert_eq!(ex.pods.len(), 1, "{TENANT_POD}: one Pod");
    let team_a = &TENANTS[0];
    assert_eq!(
        ex.pods[0].metadata.namespace.as_deref(),
        Some(team_a.namespaces[0]),
        "{TENANT_POD}: the pod is in {}'s namespace",
        team_a.name
    );
    for (what, cfg) in tenants_configs() {
        let got = check_tenant_pod(&cfg, &ex).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            got,
            TenantPod {
                tenant: team_a.name.into(),
                spiffe_id: "spiffe://team-a.mesh.example.com/ns/team-a/sa/web".into(),
                bundle: "example.com:mesh:podca.team-a".into(),
            },
            "{what}"
        );
        // The selector names a tenant of the config: the tenant label's value.
        let selector_tenant = ex.pods[0]
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()))
            .find_map(|s| s.cluster_trust_bundle.as_ref()?.label_selector.as_ref())
            .and_then(|sel| sel.match_labels.as_ref()?.get(TENANT_LABEL).cloned());
        let tenants: Vec<&str> = cfg.tenant_cas().iter().map(|(_, t, _)| *t).collect();
        assert!(
            selector_tenant
                .as_deref()
                .is_some_and(|t| tenants.contains(&t)),
            "{what}: the selector's tenant {selector_tenant:?} is none of {tenants:?}"
        );
    }
}

/// The pod example as JSON, changed by `edit`, checked against the overlay's config.
fn check_edited(cfg: &Config, edit: impl FnOnce(&mut Vec<Value>)) -> Result<TenantPod, String> {
    let mut docs = tenant_pod_docs();
    edit(&mut docs);
    let ex = parse_example(&docs).map_err(|e| e.join("; "))?;
    check_tenant_pod(cfg, &ex)
}

fn pod_doc(docs: &mut [Value]) -> &mut Value {
    docs.iter_mut()
        .find(|d| d["kind"] == "Pod")
        .expect("the example has a Pod")
}

fn sources(docs: &mut [Value]) -> &mut Vec<Value> {
    pod_doc(docs)["spec"]["volumes"][0]["projected"]["sources"]
        .as_array_mut()
        .expect("the first volume is projected")
}

fn ctb(docs: &mut [Value]) -> &mut Value {
    sources(docs)
        .iter_mut()
        .find_map(|s| s.get_mut("clusterTrustBundle"))
        .expect("a clusterTrustBundle source")
}

#[test]
fn the_tenant_pod_check_refuses_a_pod_that_would_not_get_its_tenants_identity() {
    let cfg = config(&parse_overlay("tenants"));
    check_edited(&cfg, |_| {}).expect("the example as written passes");
    type Edit = fn(&mut Vec<Value>);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "a typo in the projection (strict parsing)",
            |d| ctb(d)["labelSelectr"] = serde_json::json!({}),
            "labelSelectr: unknown field",
        ),
        (
            "no tenant label: every bundle of the signer, the other tenant's included",
            |d| {
                let labels = ctb(d)["labelSelector"]["matchLabels"]
                    .as_object_mut()
                    .unwrap();
                labels.remove(TENANT_LABEL);
            },
            "selects [\"example.com:mesh:podca\", \"example.com:mesh:podca.team-a\", \
             \"example.com:mesh:podca.team-b\"]",
        ),
        (
            "the other tenant's bundle",
            |d| ctb(d)["labelSelector"]["matchLabels"][TENANT_LABEL] = "team-b".into(),
            "selects [\"example.com:mesh:podca.team-b\"], not exactly the tenant's bundle \
             example.com:mesh:podca.team-a",
        ),
        (
            "a tenant the config does not have",
            |d| ctb(d)["labelSelector"]["matchLabels"][TENANT_LABEL] = "team-c".into(),
            "selects [], not exactly",
        ),
        (
            "another podca installation's bundles",
            |d| ctb(d)["labelSelector"]["matchLabels"]["podca.dev/instance"] = "other".into(),
            "selects [], not exactly",
        ),
        (
            "the bundle of another signer",
            |d| ctb(d)["signerName"] = "example.com/batch".into(),
            "not the signer example.com/mesh",
        ),
        (
            "a namespace in no tenant (untenanted = \"deny\")",
            |d| {
                for doc in d.iter_mut() {
                    doc["metadata"]["namespace"] = "payments".into();
                }
            },
            "namespace payments is refused by example.com/mesh",
        ),
        (
            "a key type the signer refuses",
            |d| {
                let cert = sources(d)
                    .iter_mut()
                    .find_map(|s| s.get_mut("podCertificate"))
                    .unwrap();
                cert["keyType"] = "RSA3072".into();
            },
            "podca would not issue: Deny",
        ),
        (
            "the identity volume not mounted",
            |d| {
                pod_doc(d)["spec"]["containers"][0]["volumeMounts"] = serde_json::json!([]);
            },
            "is not mounted read-only",
        ),
        (
            "a ServiceAccount the example does not create",
            |d| pod_doc(d)["spec"]["serviceAccountName"] = "api".into(),
            "the ServiceAccount team-a/api is not in the example",
        ),
        (
            "a container that may escalate",
            |d| {
                pod_doc(d)["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                    true.into();
            },
            "is not `restricted`",
        ),
    ];
    for (what, edit, expected) in cases {
        let err = check_edited(&cfg, edit).expect_err(what);
        assert!(
            err.contains(expected),
            "{what}: expected {expected:?} in {err:?}"
        );
    }
    // Another namespace of the same tenant gets the same tenant, with its own SPIFFE ID.
    let jobs = check_edited(&cfg, |d| {
        for doc in d.iter_mut() {
            doc["metadata"]["namespace"] = "team-a-jobs".into();
        }
    })
    .unwrap();
    assert_eq!(jobs.tenant, "team-a");
    assert_eq!(
        jobs.spiffe_id,
        "spiffe://team-a.mesh.example.com/ns/team-a-jobs/sa/web"
    );
}

#[test]
fn the_label_selector_follows_kubernetes_semantics() {
    let labels: BTreeMap<String, String> = [("a", "1"), ("b", "2")]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
    let sel = |v: Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
    let cases = [
        (serde_json::json!({}), true),
        (serde_json::json!({"matchLabels": {"a": "1"}}), true),
        (
            serde_json::json!({"matchLabels": {"a": "1", "c": "3"}}),
            false,
        ),
        (
            serde_json::json!({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}),
            true,
        ),
        (
            serde_json::json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}),
            false,
        ),
        (
            serde_json::json!({"matchExpressions": [{"key": "b", "operator": "In", "values": ["2", "3"]}]}),
            true,
        ),
        (
            serde_json::json!({"matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["2"]}]}),
            false,
        ),
        (
            serde_json::json!({"matchExpressions": [{"key": "c", "operator": "Exists"}]}),
            false,
        ),
    ];
    for (v, want) in cases {
        assert_eq!(selects(&sel(v.clone()), &labels), Ok(want), "{v}");
    }
    let bad = sel(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]}));
    assert!(selects(&bad, &labels).is_err());
}
