//! Discovery: `/version`, the group list, each group and its resource lists.

use crate::emulator::resources::{ApiMode, Res};
use serde_json::{Value, json};

/// `/version` of the release `mode` models (1.35, 1.36 or 1.37), unless `minor` says which.
pub(super) fn version_info(mode: ApiMode, minor: Option<u32>) -> Value {
    let minor = minor.unwrap_or(match mode {
        ApiMode::V1Beta1Legacy => 35,
        ApiMode::V1Beta1 => 36,
        ApiMode::V1Only | ApiMode::V1AndV1Beta1 => 37,
    });
    // 1.36.2 is the release the vectors were recorded from.
    let patch = if minor == 36 { 2 } else { 0 };
    json!({
        "major": "1",
        "minor": minor.to_string(),
        "emulationMajor": "1",
        "emulationMinor": minor.to_string(),
        "gitVersion": format!("v1.{minor}.{patch}-podca-emulator"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.26",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn groups(mode: ApiMode) -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("certificates.k8s.io", mode.cert_versions().to_vec()),
        ("coordination.k8s.io", vec!["v1"]),
        ("events.k8s.io", vec!["v1"]),
        ("authentication.k8s.io", vec!["v1"]),
        ("authorization.k8s.io", vec!["v1"]),
    ]
}

fn api_group_json(name: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": vs, "preferredVersion": preferred})
}

pub(super) fn api_group_list(mode: ApiMode) -> Value {
    let gs: Vec<Value> = groups(mode)
        .iter()
        .map(|(g, vs)| api_group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

pub(super) fn api_group(g: &str, mode: ApiMode) -> Option<Value> {
    groups(mode)
        .into_iter()
        .find(|(n, _)| *n == g)
        .map(|(n, vs)| {
            let mut v = api_group_json(n, &vs);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            v
        })
}

pub(super) fn group_has_version(g: &Value, v: &str) -> bool {
    g["versions"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["version"] == v))
}

const ALL_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub(super) fn resource_list(group: &str, version: &str, mode: ApiMode) -> Value {
    let mut rs = Vec::new();
    for res in Res::ALL {
        if res.group() != group || !res.versions(mode).contains(&version) {
            continue;
        }
        if res == Res::CoreEvent && !group.is_empty() {
            continue;
        }
        rs.push(json!({
            "name": res.plural(),
            "singularName": res.singular(),
            "namespaced": res.namespaced(),
            "kind": res.kind(),
            "verbs": ALL_VERBS,
        }));
        if res == Res::ServiceAccount {
            rs.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
        if res.has_status() {
            rs.push(json!({
                "name": format!("{}/status", res.plural()),
                "singularName": "",
                "namespaced": res.namespaced(),
                "kind": res.kind(),
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if group == "authentication.k8s.io" {
        rs.push(json!({"name": "tokenreviews", "singularName": "tokenreview", "namespaced": false, "kind": "TokenReview", "verbs": ["create"]}));
        rs.push(json!({"name": "selfsubjectreviews", "singularName": "selfsubjectreview", "namespaced": false, "kind": "SelfSubjectReview", "verbs": ["create"]}));
    }
    if group == "authorization.k8s.io" {
        rs.push(json!({"name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview", "namespaced": false, "kind": "SelfSubjectAccessReview", "verbs": ["create"]}));
        rs.push(json!({"name": "subjectaccessreviews", "singularName": "subjectaccessreview", "namespaced": false, "kind": "SubjectAccessReview", "verbs": ["create"]}));
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": rs})
}
