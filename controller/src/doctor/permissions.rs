//! podca's permissions, listed once: [`Needs::required`] is what `podca serve` uses (the
//! ClusterRole `podca` of `deploy/base/rbac.yaml`, the rules of the components the config asks
//! for (`deploy/components/issue-for-pod`, `namespace-labels`, `pod-facts`), the Role on the CA
//! Secrets (one per Secret-held CA some signer uses: `[ca]` and `[cas.<name>]`), and the leader
//! Lease Role of `deploy/overlays/ha`); `tests/tests/doctor.rs` checks it against those
//! manifests, so the two cannot drift apart. [`beyond`] lists a few permissions podca must not
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
use podca_authority::components::ca::primary_ca;
use podca_authority::config::{CaConfig, Config, MetricsAuthMode, SecretCa, Sharding, TlsSetting};

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
    /// The Secret of every Secret-held CA some signer uses (`[ca]` or `[cas.<name>]` with
    /// `backend = "secret"`, in [`Config::cas_in_use`] order): (namespace, name). podca reads
    /// and watches each and keeps its history ConfigMap `<name>-podca-history` beside it.
    pub ca_secrets: Vec<(String, String)>,
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
    /// Some signer has a `service_ca` table: podca reads the request's pod and the Services its
    /// `kubernetes.io/service-names` annotation names (deploy/components/service-ca).
    pub service_ca: bool,
    /// mTLS renewal is on (`[grpc] mtls_renewal`, TLS not off): podca reads the renewing
    /// certificate's service account (issue #40).
    pub mtls_renewal: bool,
    /// `[admin] metrics_auth = "kubernetes"`: a SubjectAccessReview per scraper token
    /// (deploy/components/metrics-auth).
    pub metrics_auth: bool,
    /// The JWKS ConfigMap the leader writes (`[jwt] jwks_configmap`, JWT-SVIDs on):
    /// (namespace, name).
    pub jwks_configmap: Option<(String, String)>,
    /// The JWT key Secret (`[jwt] keys_secret`, default `<CA Secret>-jwt`, JWT-SVIDs on) beside
    /// the primary CA's Secret (`primary_ca`: the `[grpc] signer`'s CA), when that CA is
    /// Secret-held; the keys live with the primary CA only: (namespace, name).
    pub jwt_keys_secret: Option<(String, String)>,
    /// The ledger log's checkpoint key Secret (`[ledger.log]` on without `key_file`;
    /// `key_secret`, default `<CA Secret>-log`) beside the primary CA's Secret: (namespace,
    /// name).
    pub log_key_secret: Option<(String, String)>,
}

impl Needs {
    pub fn from_config(config: &Config, lease: Option<LeaseRef>) -> Self {
        let secret_of = |ca: &CaConfig| match ca {
            CaConfig::Secret(s) => Some(s.clone()),
            CaConfig::File(_) | CaConfig::Pkcs11(_) => None,
        };
        let secrets: Vec<SecretCa> = config
            .cas_in_use()
            .into_iter()
            .filter_map(|(_, ca)| secret_of(ca))
            .collect();
        // The JWT keys live with the primary CA only (in a Secret beside it when it is one).
        let primary_secret = config.ca_named(primary_ca(config)).and_then(secret_of);
        let jwks_configmap =
            (config.jwt.enabled && !config.jwt.jwks_configmap.is_empty()).then(|| {
                // As `podca serve` resolves it; for its pod's namespace, which the doctor
                // does not run in, POD_NAMESPACE or else a CA Secret's (the primary CA's
                // first) or the Lease's namespace (podca's own in deploy/).
                let namespace = config
                    .jwt
                    .jwks_configmap_namespace
                    .clone()
                    .or_else(|| config.grpc.tls_namespace.clone())
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .or_else(|| {
                        primary_secret
                            .as_ref()
                            .or(secrets.first())
                            .map(|s| s.namespace.clone())
                    })
                    .or_else(|| lease.as_ref().map(|l| l.namespace.clone()))
                    .unwrap_or_else(|| "default".into());
                (namespace, config.jwt.jwks_configmap.clone())
            });
        Needs {
            signers: config.signers.keys().cloned().collect(),
            ca_secrets: secrets
                .iter()
                .map(|s| (s.namespace.clone(), s.name.clone()))
                .collect(),
            lease: lease.map(|lease| LeaseRef {
                sharded: lease.sharded || config.controller.sharding == Sharding::Rendezvous,
                ..lease
            }),
            issue_for_pod: !config.grpc.node_proxy_service_accounts.is_empty(),
            namespace_labels: config
                .signers
                .values()
                .any(|policy| policy.rules_use_namespace_labels()),
            pod_facts: config.signers.values().any(|policy| policy.pod_facts),
            service_ca: config
                .signers
                .values()
                .any(|policy| policy.service_ca.is_some()),
            mtls_renewal: config.grpc.mtls_renewal && config.grpc.tls != TlsSetting::Off,
            metrics_auth: config.admin.metrics_auth == MetricsAuthMode::Kubernetes,
            jwks_configmap,
            log_key_secret: config
                .ledger
                .log
                .as_ref()
                .filter(|l| l.key_file.is_none())
                .zip(primary_secret.as_ref())
                .map(|(log, s)| {
                    let name = log
                        .key_secret
                        .clone()
                        .unwrap_or_else(|| format!("{}-log", s.name));
                    (s.namespace.clone(), name)
                }),
            jwt_keys_secret: primary_secret
                .filter(|_| config.jwt.enabled)
                .map(|s| (s.namespace.clone(), config.jwt.keys_secret_for(&s.name))),
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
        all.extend(each(&["patch"], cert, "podcertificaterequests/status"));
        // kube-apiserver's signer check on every status write.
        all.extend(
            self.signers
                .iter()
                .map(|s| Permission::new("sign", cert, "signers").named(s)),
        );
        // The ClusterTrustBundle publisher.
        all.extend(each(
            &["get", "list", "watch", "create", "update", "delete"],
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
        if self.mtls_renewal {
            // mTLS renewal: the renewing certificate's service account still exists, with the
            // UID its chain began with.
            all.push(Permission::new("get", "", "serviceaccounts"));
        }
        if self.issue_for_pod {
            // get: IssueForPod; list: the Istio CA API's ImpersonatedIdentity (pods on a node).
            all.extend(each(&["get", "list"], "", "pods"));
        }
        if self.namespace_labels {
            // The metadata-only namespace watch behind `namespaceObject.metadata.labels`.
            all.extend(each(&["list", "watch"], "", "namespaces"));
        }
        if (self.pod_facts || self.service_ca) && !self.issue_for_pod {
            // One GET of the request's pod per request whose rules (or the service-ca
            // vocabulary) read it; IssueForPod's `get` covers it when that is on.
            all.push(Permission::new("get", "", "pods"));
        }
        if self.service_ca {
            // One GET per Service a kubernetes.io/service-names annotation names.
            all.push(Permission::new("get", "", "services"));
        }
        if self.metrics_auth {
            // May this scraper's user get /metrics? (Its TokenReview is the gRPC API's grant.)
            all.push(Permission::new(
                "create",
                "authorization.k8s.io",
                "subjectaccessreviews",
            ));
        }
        // Kubernetes cannot limit `create` by name: one per namespace, whatever needs it.
        let push_once = |all: &mut Vec<Permission>, p: Permission| {
            if !all.contains(&p) {
                all.push(p);
            }
        };
        for (namespace, name) in &self.ca_secrets {
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
            push_once(
                &mut all,
                Permission::new("create", "", "configmaps").in_namespace(namespace),
            );
        }
        if let Some((namespace, name)) = &self.jwt_keys_secret {
            all.extend(["get", "update"].map(|v| {
                Permission::new(v, "", "secrets")
                    .named(name)
                    .in_namespace(namespace)
            }));
            push_once(
                &mut all,
                Permission::new("create", "", "secrets").in_namespace(namespace),
            );
        }
        if let Some((namespace, name)) = &self.log_key_secret {
            // Made once by the first replica, read by every one.
            all.push(
                Permission::new("get", "", "secrets")
                    .named(name)
                    .in_namespace(namespace),
            );
            push_once(
                &mut all,
                Permission::new("create", "", "secrets").in_namespace(namespace),
            );
        }
        if let Some((namespace, name)) = &self.jwks_configmap {
            all.extend(["get", "update"].map(|v| {
                Permission::new(v, "", "configmaps")
                    .named(name)
                    .in_namespace(namespace)
            }));
            // The history ConfigMaps may need the same `create`.
            push_once(
                &mut all,
                Permission::new("create", "", "configmaps").in_namespace(namespace),
            );
        }
        if let Some(lease) = &self.lease {
            let group = "coordination.k8s.io";
            all.push(Permission::new("create", group, "leases").in_namespace(&lease.namespace));
            all.extend(["get", "update", "patch"].map(|v| {
                Permission::new(v, group, "leases")
                    .named(&lease.name)
                    .in_namespace(&lease.namespace)
            }));
            if lease.sharded {
                // The member Leases, named after the pods: no resourceNames can narrow these
                // (deploy/components/sharding).
                all.extend(
                    ["list", "patch", "delete"].map(|v| {
                        Permission::new(v, group, "leases").in_namespace(&lease.namespace)
                    }),
                );
            }
        }
        all
    }
}

/// Where an operator finds the grant of a permission that `needs` requires and that is not in
/// deploy/base/rbac.yaml (`None`: it is there, or in the Roles the config asks for).
fn component_of(needs: &Needs, p: &Permission) -> Option<&'static str> {
    if needs.metrics_auth && p.resource == "subjectaccessreviews" {
        return Some("[admin] metrics_auth = \"kubernetes\": deploy/components/metrics-auth");
    }
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
        "pods" | "services" if needs.service_ca => {
            Some("a signer has a service_ca table: deploy/components/service-ca")
        }
        "namespaces" if needs.namespace_labels => {
            Some("a rule reads namespaceObject.metadata.labels: deploy/components/namespace-labels")
        }
        _ => None,
    }
}

/// Permissions podca must not have: every Secret of the cluster, any Secret of a CA Secret's
/// namespace besides its own (each such namespace once; `kube-system` without a Secret CA),
/// everything (`*`), and binding itself a ClusterRole.
pub fn beyond(needs: Option<&Needs>) -> Vec<Permission> {
    let mut namespaces: Vec<&str> = needs
        .map(|n| n.ca_secrets.iter().map(|(ns, _)| ns.as_str()).collect())
        .unwrap_or_default();
    if namespaces.is_empty() {
        namespaces.push("kube-system");
    }
    let mut all = vec![Permission::new("list", "", "secrets")];
    for namespace in namespaces {
        let any = Permission::new("get", "", "secrets").in_namespace(namespace);
        if !all.contains(&any) {
            all.push(any);
        }
    }
    all.extend([
        Permission::new("*", "*", "*"),
        Permission::new("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
    ]);
    all
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
pub(super) async fn check_required(client: &Client, needs: Option<&Needs>, asker: &Asker) -> Check {
    let check = required_for_asker(client, needs).await;
    match asker.not_podca() {
        // Someone else's answers say nothing about podca: never a verdict on podca's RBAC.
        Some(note) => Check::new(
            check.name,
            Status::Warn,
            format!("{}; {note}", check.detail),
        ),
        None => check,
    }
}

async fn required_for_asker(client: &Client, needs: Option<&Needs>) -> Check {
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
                    format!("SelfSubjectAccessReview for {p}: {}", super::error_line(&e)),
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
pub(super) async fn check_beyond(client: &Client, needs: Option<&Needs>, asker: &Asker) -> Check {
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
                    format!("SelfSubjectAccessReview for {p}: {}", super::error_line(&e)),
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
    } else if let Some(note) = asker.not_podca() {
        // An administrator's own wide grants: nothing to remove from podca.
        Check::new(
            NAME,
            Status::Warn,
            format!("granted to the asker: {}; {note}", excess.join(", ")),
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

/// Who the SelfSubjectAccessReviews answer for (a SelfSubjectReview says): the RBAC checks
/// speak of podca only when podca's service account, or one impersonating it, asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asker {
    /// A service account (`system:serviceaccount:<ns>:<name>`): podca's, presumably.
    ServiceAccount(String),
    /// A user that is no service account (an administrator's kubeconfig), and podca's
    /// namespace for the `--as` hint.
    Other { user: String, namespace: String },
    /// The API server did not say (no SelfSubjectReview).
    Unknown,
}

impl Asker {
    /// Of a user name: a service account, or someone else.
    pub fn of(user: &str, namespace: &str) -> Asker {
        if user.starts_with("system:serviceaccount:") {
            Asker::ServiceAccount(user.to_owned())
        } else {
            Asker::Other {
                user: user.to_owned(),
                namespace: namespace.to_owned(),
            }
        }
    }

    /// What to tell a reader when the answers are not podca's: whose they are, and how to ask
    /// as podca.
    pub fn not_podca(&self) -> Option<String> {
        let Asker::Other { user, namespace } = self else {
            return None;
        };
        Some(format!(
            "these answers are for {user:?}, who is not podca's service account: ask as podca \
             with `podca doctor --as system:serviceaccount:{namespace}:podca --as-group \
             system:serviceaccounts --as-group system:serviceaccounts:{namespace}` (or podca's \
             own kubeconfig)"
        ))
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
            service_ca: false,
            metrics_auth: false,
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
            ca_secrets: vec![],
            lease: None,
            issue_for_pod: false,
            namespace_labels: false,
            pod_facts: false,
            service_ca: false,
            mtls_renewal: true,
            metrics_auth: false,
            jwks_configmap: None,
            jwt_keys_secret: None,
            log_key_secret: None,
        }
    }

    #[test]
    fn the_ledger_logs_key_secret_adds_get_by_name_and_create() {
        let with = Needs {
            log_key_secret: Some(("podca-system".into(), "podca-ca-log".into())),
            ..needs()
        };
        let plain = needs().required();
        let extra: Vec<String> = with
            .required()
            .iter()
            .filter(|p| !plain.contains(p))
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            extra,
            [
                "get secrets podca-ca-log in podca-system",
                "create secrets in podca-system",
            ]
        );
    }

    #[test]
    fn metrics_auth_adds_subjectaccessreviews_and_names_its_component() {
        let with = Needs {
            metrics_auth: true,
            ..needs()
        };
        assert_eq!(
            added(&with),
            ["create subjectaccessreviews.authorization.k8s.io cluster-wide"]
        );
        let sar = Permission::new("create", "authorization.k8s.io", "subjectaccessreviews");
        assert_eq!(
            component_of(&with, &sar),
            Some("[admin] metrics_auth = \"kubernetes\": deploy/components/metrics-auth")
        );
        assert_eq!(component_of(&needs(), &sar), None);
        let config = Config::parse("[admin]\nmetrics_auth = \"kubernetes\"\n").unwrap();
        assert!(Needs::from_config(&config, None).metrics_auth);
        assert!(!Needs::from_config(&Config::parse("").unwrap(), None).metrics_auth);
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
        // The service-ca vocabulary reads the pod and the Services it names.
        let service_ca = Needs {
            service_ca: true,
            ..base.clone()
        };
        assert_eq!(
            added(&service_ca),
            ["get pods cluster-wide", "get services cluster-wide"]
        );
        assert_eq!(
            component_of(&service_ca, &Permission::new("get", "", "services")),
            Some("a signer has a service_ca table: deploy/components/service-ca")
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

    /// Rendezvous sharding, by flag or by config, adds the member Leases' verbs beside the
    /// leader Lease's; without `--leader-elect` there is no Lease at all.
    #[test]
    fn rendezvous_adds_the_member_leases() {
        let lease = |sharded| LeaseRef {
            namespace: "podca-system".into(),
            name: "podca-controller".into(),
            sharded,
        };
        let plain = Config::parse(
            "[ca]\ndir = \"/ca\"\n\n[signers.\"a.example/x\"]\ntrust_domain = \"td\"\n",
        )
        .unwrap();
        let mut by_config = plain.clone();
        by_config.controller.sharding = Sharding::Rendezvous;
        let leader = Needs::from_config(&plain, Some(lease(false))).required();
        let members = [
            "list leases.coordination.k8s.io in podca-system",
            "patch leases.coordination.k8s.io in podca-system",
            "delete leases.coordination.k8s.io in podca-system",
        ];
        for (what, needs) in [
            ("flag", Needs::from_config(&plain, Some(lease(true)))),
            ("config", Needs::from_config(&by_config, Some(lease(false)))),
        ] {
            let all = needs.required();
            let added: Vec<String> = all[leader.len()..]
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(added, members, "{what}");
        }
        assert!(
            !Needs::from_config(&by_config, None)
                .required()
                .iter()
                .any(|p| p.resource == "leases")
        );
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
            ca_secrets: vec![("ca-ns".into(), "ca".into())],
            jwt_keys_secret: Some(("ca-ns".into(), "ca-jwt".into())),
            lease: Some(LeaseRef {
                namespace: "podca-system".into(),
                name: "podca-controller".into(),
                sharded: false,
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

    /// `[ca]` (Secret `podca-ca`, used by no signer), `[cas.payments]` and `[cas.batch]` (each
    /// a Secret in podca-system), a signer on each, the `[grpc] signer` on `grpc_signer`, and
    /// `extra` appended.
    fn two_cas(grpc_signer: &str, extra: &str) -> Config {
        Config::parse(&format!(
            "[ca]\nbackend = \"secret\"\nsecret = \"podca-system/podca-ca\"\n\n\
             [cas.payments]\nbackend = \"secret\"\nsecret = \"podca-system/ca-payments\"\n\n\
             [cas.batch]\nbackend = \"secret\"\nsecret = \"podca-system/ca-batch\"\n\n\
             [signers.\"example.com/payments\"]\ntrust_domain = \"payments.example.com\"\n\
             ca = \"payments\"\n\n\
             [signers.\"example.com/batch\"]\ntrust_domain = \"batch.example.com\"\n\
             ca = \"batch\"\n\n\
             [grpc]\nsigner = \"{grpc_signer}\"\n\n\
             [jwt]\njwks_configmap_namespace = \"podca-system\"\n{extra}"
        ))
        .expect("a valid config")
    }

    /// The namespaced permissions of `needs`, as printed, in order.
    fn namespaced(needs: &Needs) -> Vec<String> {
        needs
            .required()
            .iter()
            .filter(|p| p.namespace.is_some())
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn every_secret_ca_in_use_gets_its_secret_and_history_and_the_primary_its_jwt_keys() {
        let needs = Needs::from_config(&two_cas("example.com/payments", ""), None);
        assert_eq!(
            needs.signers,
            ["example.com/batch", "example.com/payments"],
            "sign and attest for both signers"
        );
        // Both CAs' Secrets and history ConfigMaps; `[ca]` (podca-ca) is used by no signer, so
        // podca never opens it and needs nothing on it.
        assert_eq!(
            needs.ca_secrets,
            [
                ("podca-system".to_string(), "ca-batch".to_string()),
                ("podca-system".to_string(), "ca-payments".to_string()),
            ]
        );
        assert_eq!(
            needs.jwt_keys_secret,
            Some(("podca-system".into(), "ca-payments-jwt".into()))
        );
        assert_eq!(
            namespaced(&needs),
            [
                "get secrets ca-batch in podca-system",
                "list secrets ca-batch in podca-system",
                "watch secrets ca-batch in podca-system",
                "get configmaps ca-batch-podca-history in podca-system",
                "update configmaps ca-batch-podca-history in podca-system",
                "create configmaps in podca-system",
                "get secrets ca-payments in podca-system",
                "list secrets ca-payments in podca-system",
                "watch secrets ca-payments in podca-system",
                "get configmaps ca-payments-podca-history in podca-system",
                "update configmaps ca-payments-podca-history in podca-system",
                "get secrets ca-payments-jwt in podca-system",
                "update secrets ca-payments-jwt in podca-system",
                "create secrets in podca-system",
                "get configmaps podca-jwks in podca-system",
                "update configmaps podca-jwks in podca-system",
            ]
        );
        let all = needs.required();
        for (i, p) in all.iter().enumerate() {
            assert!(!all[..i].contains(p), "{p} is listed twice");
        }
        for verb in ["sign", "attest"] {
            let named: Vec<_> = all
                .iter()
                .filter(|p| p.verb == verb)
                .filter_map(|p| p.name.as_deref())
                .collect();
            assert_eq!(
                named,
                ["example.com/batch", "example.com/payments"],
                "{verb}"
            );
        }
        // The JWT keys follow the primary CA (the [grpc] signer's), and only it.
        let batch = Needs::from_config(&two_cas("example.com/batch", ""), None);
        assert_eq!(batch.ca_secrets, needs.ca_secrets);
        assert_eq!(
            batch.jwt_keys_secret,
            Some(("podca-system".into(), "ca-batch-jwt".into()))
        );
        let named_keys = Needs::from_config(
            &two_cas("example.com/batch", "keys_secret = \"jwt-keys\"\n"),
            None,
        );
        assert_eq!(
            named_keys.jwt_keys_secret,
            Some(("podca-system".into(), "jwt-keys".into()))
        );
        let no_jwt =
            Needs::from_config(&two_cas("example.com/payments", "enabled = false\n"), None);
        assert_eq!(no_jwt.jwt_keys_secret, None);
        assert_eq!(no_jwt.jwks_configmap, None);
        assert_eq!(no_jwt.ca_secrets, needs.ca_secrets);
        assert!(
            !namespaced(&no_jwt).iter().any(|p| p.contains("jwt")),
            "{:?}",
            namespaced(&no_jwt)
        );
    }

    #[test]
    fn a_directory_primary_ca_keeps_its_jwt_keys_and_a_secret_ca_beside_it_gets_its_role() {
        // [ca]: a data directory for a.example/x (the [grpc] signer); [cas.other]: a Secret in
        // ns-b for b.example/y.
        let text = |grpc: &str| {
            format!(
                "[ca]\nbackend = \"file\"\ndir = \"/var/lib/podca\"\n\n\
                 [cas.other]\nbackend = \"secret\"\nsecret = \"ns-b/ca-other\"\n\n\
                 [signers.\"a.example/x\"]\ntrust_domain = \"a.example\"\n\n\
                 [signers.\"b.example/y\"]\ntrust_domain = \"b.example\"\nca = \"other\"\n\n\
                 [grpc]\nsigner = \"{grpc}\"\n\n[jwt]\njwks_configmap = \"\"\n"
            )
        };
        let dir_primary = Needs::from_config(&Config::parse(&text("a.example/x")).unwrap(), None);
        assert_eq!(
            dir_primary.ca_secrets,
            [("ns-b".to_string(), "ca-other".to_string())]
        );
        assert_eq!(
            dir_primary.jwt_keys_secret, None,
            "the keys are in [ca] dir"
        );
        assert_eq!(
            namespaced(&dir_primary),
            [
                "get secrets ca-other in ns-b",
                "list secrets ca-other in ns-b",
                "watch secrets ca-other in ns-b",
                "get configmaps ca-other-podca-history in ns-b",
                "update configmaps ca-other-podca-history in ns-b",
                "create configmaps in ns-b",
            ]
        );
        let secret_primary =
            Needs::from_config(&Config::parse(&text("b.example/y")).unwrap(), None);
        assert_eq!(
            secret_primary.jwt_keys_secret,
            Some(("ns-b".into(), "ca-other-jwt".into()))
        );
        // No Secret CA in use at all: nothing namespaced.
        let files = Config::parse(
            "[cas.other]\nbackend = \"secret\"\nsecret = \"ns-b/ca-other\"\n\n\
             [signers.\"a.example/x\"]\ntrust_domain = \"a.example\"\n",
        )
        .unwrap();
        let files = Needs::from_config(&files, None);
        assert_eq!(files.ca_secrets, []);
        assert_eq!(files.jwt_keys_secret, None);
        assert_eq!(
            beyond(Some(&files))[1].to_string(),
            "get secrets in kube-system"
        );
    }

    #[test]
    fn a_config_with_only_the_ca_table_needs_what_it_always_did() {
        let secret = "[ca]\nbackend = \"secret\"\nsecret = \"podca-system/podca-ca\"\n";
        let signer = "[signers.\"example.com/workload\"]\ntrust_domain = \"cluster.local\"\n";
        let jwt = "[jwt]\njwks_configmap_namespace = \"podca-system\"\n";
        for text in [format!("{secret}{signer}{jwt}"), format!("{secret}{jwt}")] {
            let needs = Needs::from_config(&Config::parse(&text).unwrap(), None);
            assert_eq!(
                needs.ca_secrets,
                [("podca-system".to_string(), "podca-ca".to_string())],
                "{text}"
            );
            assert_eq!(
                needs.jwt_keys_secret,
                Some(("podca-system".into(), "podca-ca-jwt".into()))
            );
            assert_eq!(
                namespaced(&needs),
                [
                    "get secrets podca-ca in podca-system",
                    "list secrets podca-ca in podca-system",
                    "watch secrets podca-ca in podca-system",
                    "get configmaps podca-ca-podca-history in podca-system",
                    "update configmaps podca-ca-podca-history in podca-system",
                    "create configmaps in podca-system",
                    "get secrets podca-ca-jwt in podca-system",
                    "update secrets podca-ca-jwt in podca-system",
                    "create secrets in podca-system",
                    "get configmaps podca-jwks in podca-system",
                    "update configmaps podca-jwks in podca-system",
                ]
            );
        }
        // The file backend: nothing namespaced.
        let file = Needs::from_config(&Config::parse(signer).unwrap(), None);
        assert_eq!(file.ca_secrets, []);
        assert_eq!(file.jwt_keys_secret, None);
    }

    #[test]
    fn beyond_forbids_any_secret_of_every_ca_secret_namespace() {
        let shown = |needs: Option<&Needs>| -> Vec<String> {
            beyond(needs).iter().map(ToString::to_string).collect()
        };
        assert_eq!(
            shown(None),
            [
                "list secrets cluster-wide",
                "get secrets in kube-system",
                "* *.* cluster-wide",
                "create clusterrolebindings.rbac.authorization.k8s.io cluster-wide",
            ]
        );
        let two = Needs {
            ca_secrets: vec![
                ("ns-a".into(), "one".into()),
                ("ns-b".into(), "two".into()),
                ("ns-a".into(), "three".into()),
            ],
            ..needs()
        };
        assert_eq!(
            shown(Some(&two))[..3],
            [
                "list secrets cluster-wide",
                "get secrets in ns-a",
                "get secrets in ns-b"
            ]
        );
        assert_eq!(beyond(Some(&two)).len(), 5, "each namespace once");
    }
}
