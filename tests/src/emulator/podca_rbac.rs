//! The RBAC of `podca serve` (deploy/base/rbac.yaml, and the leader-election Role of
//! deploy/overlays/ha) as emulator rules, so a process run against the emulator is refused
//! whatever a cluster installed from `deploy/` would refuse it. A unit test below reads the
//! manifests and fails when the two drift apart.

use super::auth::PolicyRule;

/// podca's service account: the subject of every binding in `deploy/`.
pub const PODCA_NAMESPACE: &str = "podca-system";
pub const PODCA_SERVICE_ACCOUNT: &str = "podca";

/// What the manifests are rendered for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodcaRbac {
    /// The configured signer names (`sign` and `attest` resourceNames).
    pub signer_names: Vec<String>,
    /// `[ca] secret = "<namespace>/<name>"` of the secret backend: the Role on that Secret, its
    /// history ConfigMap `<name>-podca-history` and the JWT key Secret `<name>-jwt` (`get` and
    /// `update` by name, `create` in the namespace). `None` for the file and PKCS#11 backends.
    pub ca_secret: Option<(String, String)>,
    /// `--lease-name` of `podca serve --leader-elect`: the Lease Role in podca's namespace.
    pub lease_name: Option<String>,
    /// `pods get, list` for gRPC IssueForPod and the Istio CA API's ImpersonatedIdentity
    /// (deploy/components/issue-for-pod, with
    /// `[grpc] node_proxy_service_accounts` set).
    pub issue_for_pod: bool,
    /// `(namespace, name)` of the JWKS ConfigMap (`[jwt] jwks_configmap`) the leader writes:
    /// `get` and `update` on that name, `create` in its namespace. `None`: not published.
    pub jwks_configmap: Option<(String, String)>,
    /// `namespaces list, watch` for policy rules that read `namespaceObject.metadata.labels`
    /// (deploy/components/namespace-labels).
    pub namespace_labels: bool,
    /// `pods get` for signers with `pod_facts = true`, whose rules read the request's pod
    /// (deploy/components/pod-facts). With [`PodcaRbac::issue_for_pod`] too, both rules are
    /// granted, as the two components together grant them.
    pub pod_facts: bool,
    /// `pods get` and `services get` for signers with a `service_ca` table
    /// (deploy/components/service-ca).
    pub service_ca: bool,
}

impl PodcaRbac {
    /// The secret backend's Role for the CA Secret `namespace/name` (see [`PodcaRbac::ca_secret`]).
    pub fn secret_backend_rules(namespace: &str, name: &str) -> Vec<PolicyRule> {
        let ns = [namespace];
        vec![
            PolicyRule::new(&[""], &["secrets"], &["get", "list", "watch"])
                .with_names(&[name])
                .in_namespaces(&ns),
            PolicyRule::new(&[""], &["configmaps"], &["get", "update"])
                .with_names(&[&format!("{name}-podca-history")])
                .in_namespaces(&ns),
            PolicyRule::new(&[""], &["configmaps"], &["create"]).in_namespaces(&ns),
            PolicyRule::new(&[""], &["secrets"], &["get", "update"])
                .with_names(&[&format!("{name}-jwt")])
                .in_namespaces(&ns),
            PolicyRule::new(&[""], &["secrets"], &["create"]).in_namespaces(&ns),
        ]
    }

    /// The JWKS ConfigMap's Role (see [`PodcaRbac::jwks_configmap`]).
    pub fn jwks_configmap_rules(namespace: &str, name: &str) -> Vec<PolicyRule> {
        let ns = [namespace];
        vec![
            PolicyRule::new(&[""], &["configmaps"], &["get", "update"])
                .with_names(&[name])
                .in_namespaces(&ns),
            PolicyRule::new(&[""], &["configmaps"], &["create"]).in_namespaces(&ns),
        ]
    }

    /// The rules of the ClusterRole `podca`, then of the namespaced Roles.
    pub fn rules(&self) -> Vec<PolicyRule> {
        let cert = "certificates.k8s.io";
        let signers: Vec<&str> = self.signer_names.iter().map(String::as_str).collect();
        let mut rules = vec![
            PolicyRule::new(
                &[cert],
                &["podcertificaterequests"],
                &["get", "list", "watch"],
            ),
            PolicyRule::new(&[cert], &["podcertificaterequests/status"], &["patch"]),
            PolicyRule::new(&[cert], &["signers"], &["sign"]).with_names(&signers),
            PolicyRule::new(
                &[cert],
                &["clustertrustbundles"],
                &["get", "list", "watch", "create", "update", "delete"],
            ),
            PolicyRule::new(&[cert], &["signers"], &["attest"]).with_names(&signers),
            PolicyRule::new(&["events.k8s.io"], &["events"], &["create", "patch"]),
            PolicyRule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
            PolicyRule::new(&[""], &["serviceaccounts"], &["get"]),
        ];
        if self.issue_for_pod {
            rules.push(PolicyRule::new(&[""], &["pods"], &["get", "list"]));
        }
        if self.namespace_labels {
            rules.push(PolicyRule::new(&[""], &["namespaces"], &["list", "watch"]));
        }
        if self.pod_facts {
            rules.push(PolicyRule::new(&[""], &["pods"], &["get"]));
        }
        if self.service_ca {
            rules.push(PolicyRule::new(&[""], &["pods", "services"], &["get"]));
        }
        if let Some((namespace, name)) = &self.ca_secret {
            rules.extend(Self::secret_backend_rules(namespace, name));
        }
        if let Some((namespace, name)) = &self.jwks_configmap {
            rules.extend(Self::jwks_configmap_rules(namespace, name));
        }
        if let Some(lease) = &self.lease_name {
            let ns = [PODCA_NAMESPACE];
            rules.extend([
                PolicyRule::new(&["coordination.k8s.io"], &["leases"], &["create"])
                    .in_namespaces(&ns),
                PolicyRule::new(
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["get", "update", "patch"],
                )
                .with_names(&[lease])
                .in_namespaces(&ns),
            ]);
        }
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize as _;
    use std::path::Path;

    /// Every rule of the (Cluster)Roles in a manifest, scoped to the Role's namespace.
    fn manifest_rules(relative: &str) -> Vec<PolicyRule> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(relative);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut rules = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = serde_json::Value::deserialize(doc).expect("the manifest is YAML");
            let namespaces: Vec<&str> = match v["kind"].as_str() {
                Some("ClusterRole") => Vec::new(),
                Some("Role") => vec![v["metadata"]["namespace"].as_str().expect("a namespace")],
                _ => continue,
            };
            for r in v["rules"].as_array().expect("rules") {
                rules.push(PolicyRule::from_json(r).in_namespaces(&namespaces));
            }
        }
        rules
    }

    /// The rules the component deploy/components/issue-for-pod adds to the ClusterRole (the
    /// values of its JSON patch's `add` operations).
    fn component_rules(relative: &str) -> Vec<PolicyRule> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(relative);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let v: serde_json::Value = serde_yaml::from_str(&text).expect("the component is YAML");
        let mut rules = Vec::new();
        for patch in v["patches"].as_array().expect("patches") {
            assert_eq!(patch["target"]["kind"], "ClusterRole");
            let ops: serde_json::Value =
                serde_yaml::from_str(patch["patch"].as_str().expect("an inline patch"))
                    .expect("the patch is YAML");
            for op in ops.as_array().expect("JSON patch operations") {
                assert_eq!(op["op"], "add");
                assert_eq!(op["path"], "/rules/-");
                rules.push(PolicyRule::from_json(&op["value"]));
            }
        }
        rules
    }

    #[test]
    fn the_rules_are_those_of_deploy_base_and_the_ha_overlay() {
        let mut rbac = PodcaRbac {
            signer_names: vec!["example.com/workload".into()],
            ca_secret: Some(("podca-system".into(), "podca-ca".into())),
            lease_name: Some("podca-controller".into()),
            issue_for_pod: false,
            jwks_configmap: Some(("podca-system".into(), "podca-jwks".into())),
            namespace_labels: false,
            pod_facts: false,
            service_ca: false,
        };
        // The base and the HA overlay, with these components' rules added to the ClusterRole,
        // whose rules come first, in this order.
        let want = |components: &[&str]| {
            let mut want = manifest_rules("deploy/base/rbac.yaml");
            let cluster_rules = want.iter().take_while(|r| r.namespaces.is_empty()).count();
            let extra: Vec<PolicyRule> = components
                .iter()
                .flat_map(|c| component_rules(&format!("deploy/components/{c}/kustomization.yaml")))
                .collect();
            want.splice(cluster_rules..cluster_rules, extra);
            want.extend(manifest_rules(
                "deploy/overlays/ha/leader-election-rbac.yaml",
            ));
            want
        };
        assert_eq!(rbac.rules(), want(&[]));
        // IssueForPod's component adds its rule.
        rbac.issue_for_pod = true;
        assert_eq!(rbac.rules(), want(&["issue-for-pod"]));
        // So does the namespace-labels component, after IssueForPod's.
        rbac.namespace_labels = true;
        assert_eq!(rbac.rules(), want(&["issue-for-pod", "namespace-labels"]));
        // And the pod-facts component, last.
        rbac.pod_facts = true;
        assert_eq!(
            rbac.rules(),
            want(&["issue-for-pod", "namespace-labels", "pod-facts"])
        );
        // And the service-ca component, after it.
        rbac.service_ca = true;
        assert_eq!(
            rbac.rules(),
            want(&[
                "issue-for-pod",
                "namespace-labels",
                "pod-facts",
                "service-ca"
            ])
        );
        rbac.service_ca = false;
        // pod_facts alone: only `pods get`, no list.
        let alone = PodcaRbac {
            issue_for_pod: false,
            namespace_labels: false,
            ..rbac
        };
        let pods: Vec<PolicyRule> = alone
            .rules()
            .into_iter()
            .filter(|r| r.resources == ["pods"])
            .collect();
        assert_eq!(
            pods,
            component_rules("deploy/components/pod-facts/kustomization.yaml")
        );
        assert_eq!(pods, [PolicyRule::new(&[""], &["pods"], &["get"])]);
    }

    #[test]
    fn without_a_secret_or_lease_only_the_cluster_role_is_granted() {
        let rbac = PodcaRbac {
            signer_names: vec!["a.example/x".into(), "b.example/y".into()],
            ca_secret: None,
            lease_name: None,
            issue_for_pod: false,
            jwks_configmap: None,
            namespace_labels: false,
            pod_facts: false,
            service_ca: false,
        };
        let rules = rbac.rules();
        assert_eq!(rules.len(), 8);
        assert!(rules.iter().all(|r| r.namespaces.is_empty()));
        let sign = rules
            .iter()
            .find(|r| r.verbs == ["sign"])
            .expect("a sign rule");
        assert_eq!(sign.resource_names, ["a.example/x", "b.example/y"]);
    }
}
