//! Strict typed parsing: every rendered object parses into its k8s-openapi type with no
//! field lost (a typo or a misplaced field is an error, not a silently dropped key).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::render::{documents, kind_of, name_of, render_overlay};
use crate::{NAMESPACE, OVERLAYS};

/// Removes nulls (k8s-openapi serializes `None` as absent, YAML may say `null`).
pub fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Paths where `input` and `round` differ.
pub fn differences(path: &str, input: &Value, round: &Value, out: &mut Vec<String>) {
    match (input, round) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(vb) => differences(&p, va, vb, out),
                    None => out.push(format!("{p}: unknown field (dropped by the typed schema)")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: added by the round trip"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} became {b}")),
    }
}

/// Deserializes `doc` as `T` and fails on any field the type does not know (serde ignores
/// them silently): the re-serialized object must equal the input.
pub fn strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(doc.clone())
        .map_err(|e| format!("{}: does not parse: {e}", name_of(doc)))?;
    let round = serde_json::to_value(&typed).unwrap();
    let mut diffs = Vec::new();
    differences("", &strip_nulls(doc), &strip_nulls(&round), &mut diffs);
    if diffs.is_empty() {
        Ok(typed)
    } else {
        Err(format!("{}: {}", name_of(doc), diffs.join("; ")))
    }
}

/// One overlay's objects, each parsed into its k8s-openapi type.
#[derive(Default)]
pub struct Rendered {
    pub namespaces: Vec<Namespace>,
    pub service_accounts: Vec<ServiceAccount>,
    pub config_maps: Vec<ConfigMap>,
    pub services: Vec<Service>,
    /// The ledger-redb component's volume.
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    pub deployments: Vec<Deployment>,
    pub network_policies: Vec<NetworkPolicy>,
    pub pdbs: Vec<PodDisruptionBudget>,
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    /// CRD objects (ServiceMonitor), which k8s-openapi has no type for.
    pub custom: Vec<Value>,
}

pub fn parse_all(docs: &[Value]) -> Result<Rendered, Vec<String>> {
    let mut r = Rendered::default();
    let mut errors = Vec::new();
    for doc in docs {
        let result = match kind_of(doc) {
            ("v1", "Namespace") => strict(doc).map(|o| r.namespaces.push(o)),
            ("v1", "ServiceAccount") => strict(doc).map(|o| r.service_accounts.push(o)),
            ("v1", "ConfigMap") => strict(doc).map(|o| r.config_maps.push(o)),
            ("v1", "Service") => strict(doc).map(|o| r.services.push(o)),
            ("v1", "PersistentVolumeClaim") => {
                strict(doc).map(|o| r.persistent_volume_claims.push(o))
            }
            ("apps/v1", "Deployment") => strict(doc).map(|o| r.deployments.push(o)),
            ("networking.k8s.io/v1", "NetworkPolicy") => {
                strict(doc).map(|o| r.network_policies.push(o))
            }
            ("policy/v1", "PodDisruptionBudget") => strict(doc).map(|o| r.pdbs.push(o)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                strict(doc).map(|o| r.cluster_roles.push(o))
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                strict(doc).map(|o| r.cluster_role_bindings.push(o))
            }
            ("rbac.authorization.k8s.io/v1", "Role") => strict(doc).map(|o| r.roles.push(o)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                strict(doc).map(|o| r.role_bindings.push(o))
            }
            ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                r.custom.push(doc.clone());
                Ok(())
            }
            (api, kind) => Err(format!(
                "{}: unexpected object {api} {kind} (add it to the test's type table)",
                name_of(doc)
            )),
        };
        if let Err(e) = result {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(r)
    } else {
        Err(errors)
    }
}

pub fn parse_overlay(name: &str) -> Rendered {
    let docs = documents(&render_overlay(name));
    parse_all(&docs).unwrap_or_else(|errors| {
        panic!(
            "overlay {name}: objects that do not match their Kubernetes 1.37 schema:\n  {}",
            errors.join("\n  ")
        )
    })
}

#[test]
fn every_object_parses_strictly_into_its_kubernetes_type() {
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        assert_eq!(r.namespaces.len(), 1, "{overlay}: one Namespace");
        assert_eq!(r.namespaces[0].metadata.name.as_deref(), Some(NAMESPACE));
        assert_eq!(r.service_accounts.len(), 1, "{overlay}: one ServiceAccount");
        assert_eq!(r.services.len(), 1, "{overlay}: one Service");
        assert_eq!(r.network_policies.len(), 1, "{overlay}: one NetworkPolicy");
        assert!(r.custom.is_empty(), "{overlay}: CRD objects in an overlay");
        // Every namespaced object lives in podca-system.
        for doc in documents(&render_overlay(overlay)) {
            let cluster_scoped = matches!(
                kind_of(&doc).1,
                "Namespace" | "ClusterRole" | "ClusterRoleBinding"
            );
            let ns = doc["metadata"]["namespace"].as_str();
            if cluster_scoped {
                assert_eq!(ns, None, "{overlay}: {} has a namespace", name_of(&doc));
            } else {
                assert_eq!(ns, Some(NAMESPACE), "{overlay}: {}", name_of(&doc));
            }
        }
    }
}

#[test]
fn the_strict_check_catches_unknown_and_misplaced_fields() {
    let docs = documents(&render_overlay("default"));
    let deployment = docs
        .iter()
        .find(|d| kind_of(d).1 == "Deployment")
        .unwrap()
        .clone();
    assert!(strict::<Deployment>(&deployment).is_ok());

    let mut typo = deployment.clone();
    typo["spec"]["template"]["spec"]["containers"][0]["securityContxt"] =
        serde_json::json!({"privileged": true});
    let err = strict::<Deployment>(&typo).expect_err("a typo must be caught");
    assert!(err.contains("securityContxt"), "{err}");

    let mut misplaced = deployment.clone();
    misplaced["spec"]["template"]["spec"]["readOnlyRootFilesystem"] = Value::Bool(true);
    let err = strict::<Deployment>(&misplaced).expect_err("a misplaced field must be caught");
    assert_eq!(
        err,
        "Deployment/podca: .spec.template.spec.readOnlyRootFilesystem: unknown field (dropped by the typed schema)"
    );

    let mut wrong_kind = deployment;
    wrong_kind["kind"] = Value::String("StatefulSet".into());
    let err = strict::<Deployment>(&wrong_kind).expect_err("a wrong kind must be caught");
    assert_eq!(
        err,
        "StatefulSet/podca: does not parse: invalid value: string \"StatefulSet\", expected Deployment"
    );
}
