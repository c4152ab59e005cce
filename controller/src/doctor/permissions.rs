//! podca's permissions, listed once: [`Needs::required`] is what `podca serve` uses (the
//! ClusterRole `podca` of `deploy/base/rbac.yaml`, the rules of the components the config asks
//! for (`deploy/components/issue-for-pod`, `namespace-labels`, `pod-facts`), the Role on the CA
//! Secret, and the leader Lease Role of `deploy/overlays/ha`); `tests/tests/doctor.rs` checks it
//! against those manifests, so the two cannot drift apart. [`beyond`] lists a few permissions podca must not
//! have, each of which would turn a compromised podca into a cluster compromise.
//!
//! Each is asked with a SelfSubjectAccessReview (authorization.k8s.io/v1), which kube-apiserver
//! answers for the caller from every authorizer (RBAC, Node, webhooks) at once.

use std::fmt;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use podca_authority::config::{CaConfig, Config};

use super::{Check, LeaseRef, NO_CONFIG, Status};
use crate::secret_ca::HISTORY_SUFFIX;

/// One permission: a verb on a resource (`resource/subresource`), cluster-wide or in one
/// namespace, for any object or only the named one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub verb: String,
    /// `""` for the core group.
    pub group: String,
    /// The plural, with `/subresource` when there is one.
    pub resource: String,
    /// `None`: every namespace (a ClusterRole bound cluster-wide).
    pub namespace: Option<String>,
    /// `None`: any object (a rule without resourceNames).
    pub name: Option<String>,
}

impl Permission {
    fn new(verb: &str, group: &str, resource: &str) -> Self {
        Permission {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            namespace: None,
            name: None,
        }
    }

    fn named(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }

    fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    fn review(&self) -> SelfSubjectAccessReview {
        let (resource, subresource) = match self.resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_owned())),
            None => (self.resource.as_str(), None),
        };
        SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(self.verb.clone()),
                    group: Some(self.group.clone()),
                    resource: Some(resource.to_owned()),
                    subresource,
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        }
    }
}

/// As `kubectl auth can-i` takes it: `verb resource[.group] [name] in <namespace>|cluster-wide`.
impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (resource, sub) = match self.resource.split_once('/') {
            Some((r, s)) => (r, format!("/{s}")),
            None => (self.resource.as_str(), String::new()),
        };
        write!(f, "{} {resource}", self.verb)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        write!(f, "{sub}")?;
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in {ns}"),
            None => write!(f, " cluster-wide"),
        }
    }
}

/// What decides podca's permissions: the configuration and `--leader-elect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// The configured signer names (`sign` and `attest` resourceNames).
    pub signers: Vec<String>,
    /// The Secret of `[ca] backend = "secret"`: (namespace, name).
    pub ca_secret: Option<(String, String)>,
    /// The leader Lease.
    pub lease: Option<LeaseRef>,
    /// gRPC IssueForPod is on (`[grpc] node_proxy_service_accounts` set): it reads pods.
    pub issue_for_pod: bool,
    /// Some signer's rules read `namespaceObject.metadata.labels`: podca keeps a metadata-only
    /// list and watch of namespaces (deploy/components/namespace-labels).
    pub namespace_labels: bool,
    /// Some signer sets `pod_facts = true`: podca reads the request's pod for its rules
    /// (deploy/components/pod-facts). By the flag, as the manifests grant it.
    pub pod_facts: bool,
    /// The JWKS ConfigMap the leader writes (`[jwt] jwks_configmap`, JWT-SVIDs on):
    /// (namespace, name).
    pub jwks_configmap: Option<(String, String)>,
    /// The Secret backend's JWT key Secret (`[jwt] keys_secret`, JWT-SVIDs on), in the CA
    /// Secret's namespace: (namespace, name).
    pub jwt_keys_secret: Option<(String, String)>,
}

impl Needs {
    pub fn from_config(config: &Config, lease: Option<LeaseRef>) -> Self {
        let jwks_configmap =
            (config.jwt.enabled && !config.jwt.jwks_configmap.is_empty()).then(|| {
                // As `podca serve` resolves it; for its pod's namespace, which the doctor
                // does not run in, POD_NAMESPACE or else the CA Secret's or Lease's
                // namespace (podca's own in deploy/).
                let namespace = config
                    .jwt
                    .jwks_configmap_namespace
                    .clone()
                    .or_else(|| config.grpc.tls_namespace.clone())
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .or_else(|| match &config.ca {
                        CaConfig::Secret(s) => Some(s.namespace.clone()),
                        CaConfig::File(_) | CaConfig::Pkcs11(_) => None,
                    })
                    .or_else(|| lease.as_ref().map(|l| l.namespace.clone()))
                    .unwrap_or_else(|| "default".into());
                (namespace, config.jwt.jwks_configmap.clone())
            });
        Needs {
            signers: config.signers.keys().cloned().collect(),
            ca_secret: match &config.ca {
                CaConfig::Secret(s) => Some((s.namespace.clone(), s.name.clone())),
                CaConfig::File(_) | CaConfig::Pkcs11(_) => None,
            },
            lease,
            issue_for_pod: !config.grpc.node_proxy_service_accounts.is_empty(),
            namespace_labels: config
                .signers
                .values()
                .any(|policy| policy.rules_use_namespace_labels()),
            pod_facts: config.signers.values().any(|policy| policy.pod_facts),
            jwks_configmap,
            jwt_keys_secret: match &config.ca {
                CaConfig::Secret(s) if config.jwt.enabled => {
                    Some((s.namespace.clone(), config.jwt.keys_secret_for(&s.name)))
                }
                _ => None,
            },
        }
    }

    /// Every permission `podca serve` uses, in the order of the manifests' rules.
    pub fn required(&self) -> Vec<Permission> {
        let cert = "certificates.k8s.io";
        let mut all = Vec::new();
        let each = |verbs: &[&str], group: &str, resource: &str| -> Vec<Permission> {
            verbs
                .iter()
                .map(|v| Permission::new(v, group, resource))
                .collect()
        };
        // The watch of PodCertificateRequests, in every namespace.
        all.extend(each(
            &["get", "list", "watch"],
            cert,
            "podcertificaterequests",
        ));
        // The one /status write per request.
        all.extend(each(
            &["update", "patch"],
            cert,
            "podcertificaterequests/status",
        ));
        // kube-apiserver's signer check on every status write.
        all.extend(
            self.signers
                .iter()
                .map(|s| Permission::new("sign", cert, "signers").named(s)),
        );
        // The ClusterTrustBundle publisher.
        all.extend(each(
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
            cert,
            "clustertrustbundles",
        ));
        all.extend(
            self.signers
                .iter()
                .map(|s| Permission::new("attest", cert, "signers").named(s)),
        );
        // Warning Events on requests (the Recorder patches a repeated Event).
        all.extend(each(&["create", "patch"], "events.k8s.io", "events"));
        // The gRPC API: TokenReview, and IssueForPod's pod lookup (only when it is on:
        // deploy/components/issue-for-pod).
        all.push(Permission::new(
            "create",
            "authentication.k8s.io",
            "tokenreviews",
        ));
        if self.issue_for_pod {
            // get: IssueForPod; list: the Istio CA API's ImpersonatedIdentity (pods on a node).
            all.extend(each(&["get", "list"], "", "pods"));
        }
        if self.namespace_labels {
            // The metadata-only namespace watch behind `namespaceObject.metadata.labels`.
            all.extend(each(&["list", "watch"], "", "namespaces"));
        }
        if self.pod_facts && !self.issue_for_pod {
            // One GET of the request's pod per request whose rules read it (IssueForPod's
            // `get` covers it when that is on).
            all.push(Permission::new("get", "", "pods"));
        }
        if let Some((namespace, name)) = &self.ca_secret {
            let history = format!("{name}{HISTORY_SUFFIX}");
            all.extend(["get", "list", "watch"].map(|v| {
                Permission::new(v, "", "secrets")
                    .named(name)
                    .in_namespace(namespace)
            }));
            all.extend(["get", "update"].map(|v| {
                Permission::new(v, "", "configmaps")
                    .named(&history)
                    .in_namespace(namespace)
            }));
            all.push(Permission::new("create", "", "configmaps").in_namespace(namespace));
        }
        if let Some((namespace, name)) = &self.jwt_keys_secret {
            all.extend(["get", "update"].map(|v| {
                Permission::new(v, "", "secrets")
                    .named(name)
                    .in_namespace(namespace)
            }));
            // Kubernetes cannot limit `create` by name.
            all.push(Permission::new("create", "", "secrets").in_namespace(namespace));
        }
        if let Some((namespace, name)) = &self.jwks_configmap {
            all.extend(["get", "update"].map(|v| {
                Permission::new(v, "", "configmaps")
                    .named(name)
                    .in_namespace(namespace)
            }));
            // Kubernetes cannot limit `create` by name; the history ConfigMap may need it too.
            let create = Permission::new("create", "", "configmaps").in_namespace(namespace);
            if !all.contains(&create) {
                all.push(create);
            }
        }
        if let Some(lease) = &self.lease {
            let group = "coordination.k8s.io";
            all.push(Permission::new("create", group, "leases").in_namespace(&lease.namespace));
            all.extend(["get", "update", "patch"].map(|v| {
                Permission::new(v, group, "leases")
                    .named(&lease.name)
                    .in_namespace(&lease.namespace)
            }));
        }
        all
    }
}

/// Where an operator finds the grant of a permission that `needs` requires and that is not in
/// deploy/base/rbac.yaml (`None`: it is there, or in the Roles the config asks for).
fn component_of(needs: &Needs, p: &Permission) -> Option<&'static str> {
    if !p.group.is_empty() || p.namespace.is_some() {
        return None;
    }
    match p.resource.as_str() {
        "pods" if needs.issue_for_pod => {
            Some("IssueForPod has callers: deploy/components/issue-for-pod")
        }
        "pods" if needs.pod_facts => {
            Some("a signer sets pod_facts = true: deploy/components/pod-facts")
        }
        "namespaces" if needs.namespace_labels => {
            Some("a rule reads namespaceObject.metadata.labels: deploy/components/namespace-labels")
        }
        _ => None,
    }
}

/// Permissions podca must not have: every Secret of the cluster, any Secret of the CA's
/// namespace besides its own, everything (`*`), and binding itself a ClusterRole.
pub fn beyond(needs: Option<&Needs>) -> Vec<Permission> {
    let secret_namespace = needs
        .and_then(|n| n.ca_secret.as_ref())
        .map_or("kube-system", |(ns, _)| ns.as_str());
    vec![
        Permission::new("list", "", "secrets"),
        Permission::new("get", "", "secrets").in_namespace(secret_namespace),
        Permission::new("*", "*", "*"),
        Permission::new("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
    ]
}

/// Asks whether the caller may do `permission`.
async fn allowed(client: &Client, permission: &Permission) -> Result<bool, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api
        .create(&PostParams::default(), &permission.review())
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// `rbac`: every required permission is granted.
pub(super) async fn check_required(client: &Client, needs: Option<&Needs>) -> Check {
    let Some(needs) = needs else {
        return Check::new("rbac", Status::Warn, NO_CONFIG);
    };
    let required = needs.required();
    let mut missing = Vec::new();
    for p in &required {
        match allowed(client, p).await {
            Ok(true) => {}
            Ok(false) => missing.push(match component_of(needs, p) {
                Some(why) => format!("{p} ({why})"),
                None => p.to_string(),
            }),
            Err(e) => {
                return Check::new(
                    "rbac",
                    Status::Fail,
                    format!("SelfSubjectAccessReview for {p}: {e}"),
                );
            }
        }
    }
    if missing.is_empty() {
        Check::new(
            "rbac",
            Status::Ok,
            format!("all {} permissions podca needs are granted", required.len()),
        )
    } else {
        Check::new(
            "rbac",
            Status::Fail,
            format!(
                "{} of {} permissions missing (see deploy/base/rbac.yaml): {}",
                missing.len(),
                required.len(),
                missing.join(", ")
            ),
        )
    }
}

/// `rbac-least-privilege`: none of [`beyond`] is granted.
pub(super) async fn check_beyond(client: &Client, needs: Option<&Needs>) -> Check {
    const NAME: &str = "rbac-least-privilege";
    let mut excess = Vec::new();
    let dangerous = beyond(needs);
    for p in &dangerous {
        match allowed(client, p).await {
            Ok(false) => {}
            Ok(true) => excess.push(p.to_string()),
            Err(e) => {
                return Check::new(
                    NAME,
                    Status::Fail,
                    format!("SelfSubjectAccessReview for {p}: {e}"),
                );
            }
        }
    }
    if excess.is_empty() {
        Check::new(
            NAME,
            Status::Ok,
            format!(
                "denied, as they should be: {}",
                dangerous
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    } else {
        Check::new(
            NAME,
            Status::Fail,
            format!(
                "granted beyond what podca needs (remove the binding that grants it): {}",
                excess.join(", ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_print_as_kubectl_auth_can_i_reads_them() {
        let p = |verb, group, resource| Permission::new(verb, group, resource);
        assert_eq!(p("get", "", "pods").to_string(), "get pods cluster-wide");
        assert_eq!(
            p(
                "update",
                "certificates.k8s.io",
                "podcertificaterequests/status"
            )
            .to_string(),
            "update podcertificaterequests.certificates.k8s.io/status cluster-wide"
        );
        assert_eq!(
            p("get", "", "secrets")
                .named("podca-ca")
                .in_namespace("podca-system")
                .to_string(),
            "get secrets podca-ca in podca-system"
        );
    }

    #[test]
    fn a_review_splits_the_subresource_off() {
        let review = Permission::new(
            "patch",
            "certificates.k8s.io",
            "podcertificaterequests/status",
        )
        .review();
        let a = review
            .spec
            .resource_attributes
            .expect("resource attributes");
        assert_eq!(a.resource.as_deref(), Some("podcertificaterequests"));
        assert_eq!(a.subresource.as_deref(), Some("status"));
        assert_eq!(a.verb.as_deref(), Some("patch"));
        assert_eq!(a.namespace, None);
        assert_eq!(a.name, None);
    }

    /// The permissions `needs` requires beyond the plain ClusterRole, as printed.
    fn added(needs: &Needs) -> Vec<String> {
        let plain = Needs {
            issue_for_pod: false,
            namespace_labels: false,
            pod_facts: false,
            ..needs.clone()
        }
        .required();
        needs
            .required()
            .iter()
            .filter(|p| !plain.contains(p))
            .map(ToString::to_string)
            .collect()
    }

    fn needs() -> Needs {
        Needs {
            signers: vec!["a.example/x".into()],
            ca_secret: None,
            lease: None,
            issue_for_pod: false,
            namespace_labels: false,
            pod_facts: false,
            jwks_configmap: None,
            jwt_keys_secret: None,
        }
    }

    #[test]
    fn pod_facts_and_namespace_label_rules_add_their_cluster_wide_reads() {
        let base = needs();
        assert!(added(&base).is_empty());
        assert!(
            !base
                .required()
                .iter()
                .any(|p| p.resource == "pods" || p.resource == "namespaces")
        );
        let pod_facts = Needs {
            pod_facts: true,
            ..base.clone()
        };
        assert_eq!(added(&pod_facts), ["get pods cluster-wide"]);
        let labels = Needs {
            namespace_labels: true,
            ..base.clone()
        };
        assert_eq!(
            added(&labels),
            [
                "list namespaces cluster-wide",
                "watch namespaces cluster-wide"
            ]
        );
        // IssueForPod's `get` covers pod_facts': each permission once.
        let both = Needs {
            pod_facts: true,
            issue_for_pod: true,
            ..base.clone()
        };
        assert_eq!(
            added(&both),
            ["get pods cluster-wide", "list pods cluster-wide"]
        );
        // A missing one names the component that grants it; the base's do not.
        let get_pods = Permission::new("get", "", "pods");
        assert_eq!(
            component_of(&pod_facts, &get_pods),
            Some("a signer sets pod_facts = true: deploy/components/pod-facts")
        );
        assert_eq!(
            component_of(&both, &get_pods),
            Some("IssueForPod has callers: deploy/components/issue-for-pod")
        );
        assert_eq!(
            component_of(&labels, &Permission::new("watch", "", "namespaces")),
            Some(
                "a rule reads namespaceObject.metadata.labels: deploy/components/namespace-labels"
            )
        );
        assert_eq!(component_of(&base, &get_pods), None);
        assert_eq!(
            component_of(
                &pod_facts,
                &Permission::new("create", "authentication.k8s.io", "tokenreviews")
            ),
            None
        );
    }

    #[test]
    fn needs_follow_the_pod_facts_flag_and_the_rules_on_namespace_labels() {
        let signer = "[signers.\"a.example/x\"]\ntrust_domain = \"cluster.local\"\n";
        let config = |text: &str| Config::parse(text).expect("a valid config");
        let plain = Needs::from_config(&config(signer), None);
        assert!(!plain.pod_facts && !plain.namespace_labels);
        // The flag decides, whether or not a rule reads the pod yet (as the RBAC does).
        let flag = Needs::from_config(&config(&format!("{signer}pod_facts = true\n")), None);
        assert!(flag.pod_facts && !flag.namespace_labels);
        let rule = |expr: &str| {
            format!(
                "[[signers.\"a.example/x\".rules]]\nname = \"r\"\nrequire = \"{expr}\"\n\
                 reason = \"R\"\n"
            )
        };
        let pod_rule = format!(
            "{signer}pod_facts = true\n{}",
            rule("pod.labels['app'] == 'web'")
        );
        assert!(Needs::from_config(&config(&pod_rule), None).pod_facts);
        let labels = format!(
            "{signer}{}",
            rule("namespaceObject.metadata.labels['tier'] == 'prod'")
        );
        let labels = Needs::from_config(&config(&labels), None);
        assert!(labels.namespace_labels && !labels.pod_facts);
        let other = Needs::from_config(&config(&format!("{signer}{}", rule("true"))), None);
        assert!(!other.namespace_labels);
    }

    #[test]
    fn the_secret_and_the_lease_add_their_namespaced_permissions() {
        let base = Needs {
            signers: vec!["a.example/x".into(), "b.example/y".into()],
            ..needs()
        };
        let plain = base.required();
        assert!(!plain.iter().any(|p| p.resource == "pods"));
        let with_pods = Needs {
            issue_for_pod: true,
            ..base.clone()
        }
        .required();
        assert_eq!(with_pods.len(), plain.len() + 2);
        for want in ["get pods cluster-wide", "list pods cluster-wide"] {
            assert!(with_pods.iter().any(|p| p.to_string() == want), "{want}");
        }
        assert!(plain.iter().all(|p| p.namespace.is_none()));
        let sign: Vec<_> = plain.iter().filter(|p| p.verb == "sign").collect();
        assert_eq!(sign.len(), 2);
        let full = Needs {
            ca_secret: Some(("ca-ns".into(), "ca".into())),
            jwt_keys_secret: Some(("ca-ns".into(), "ca-jwt".into())),
            lease: Some(LeaseRef {
                namespace: "podca-system".into(),
                name: "podca-controller".into(),
            }),
            ..base
        }
        .required();
        let extra: Vec<String> = full[plain.len()..]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            extra,
            [
                "get secrets ca in ca-ns",
                "list secrets ca in ca-ns",
                "watch secrets ca in ca-ns",
                "get configmaps ca-podca-history in ca-ns",
                "update configmaps ca-podca-history in ca-ns",
                "create configmaps in ca-ns",
                "get secrets ca-jwt in ca-ns",
                "update secrets ca-jwt in ca-ns",
                "create secrets in ca-ns",
                "create leases.coordination.k8s.io in podca-system",
                "get leases.coordination.k8s.io podca-controller in podca-system",
                "update leases.coordination.k8s.io podca-controller in podca-system",
                "patch leases.coordination.k8s.io podca-controller in podca-system",
            ]
        );
    }
}
