//! Authentication (bearer tokens) and authorization (an RBAC-like rule list,
//! the Node authorizer, and the synthetic `sign`/`attest` verbs on `signers`).

use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use time::OffsetDateTime;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn new(name: &str, groups: &[&str]) -> Self {
        let mut g: Vec<String> = groups.iter().map(|s| (*s).to_string()).collect();
        if name != "system:anonymous" && !g.iter().any(|x| x == "system:authenticated") {
            g.push("system:authenticated".into());
        }
        Self {
            name: name.to_string(),
            uid: String::new(),
            groups: g,
            extra: BTreeMap::new(),
        }
    }
    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
    /// `Some(node)` for a node identity (`system:node:<n>` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        if !self.groups.iter().any(|g| g == "system:nodes") {
            return None;
        }
        self.name.strip_prefix("system:node:")
    }
    pub fn to_json(&self) -> Value {
        let mut u = json!({"username": self.name, "groups": self.groups});
        if !self.uid.is_empty() {
            u["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            u["extra"] = json!(self.extra);
        }
        u
    }
}

/// Who a rule is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    User(String),
    Group(String),
}

/// An RBAC PolicyRule. Empty `resource_names` matches any name; empty
/// `namespaces` means cluster-wide (a ClusterRoleBinding), otherwise the rule
/// applies only in those namespaces (RoleBindings).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyRule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub verbs: Vec<String>,
    pub namespaces: Vec<String>,
    /// `nonResourceURLs` (a ClusterRole's only): `/metrics`, or a prefix ending in `*`.
    pub non_resource_urls: Vec<String>,
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_string()).collect()
}

impl PolicyRule {
    pub fn new(api_groups: &[&str], resources: &[&str], verbs: &[&str]) -> Self {
        Self {
            api_groups: strs(api_groups),
            resources: strs(resources),
            verbs: strs(verbs),
            ..Default::default()
        }
    }
    /// A rule on non-resource URLs (`nonResourceURLs`), as a ClusterRole grants them.
    pub fn non_resource(urls: &[&str], verbs: &[&str]) -> Self {
        Self {
            non_resource_urls: strs(urls),
            verbs: strs(verbs),
            ..Default::default()
        }
    }
    pub fn with_names(mut self, names: &[&str]) -> Self {
        self.resource_names = strs(names);
        self
    }
    pub fn in_namespaces(mut self, namespaces: &[&str]) -> Self {
        self.namespaces = strs(namespaces);
        self
    }
    /// Parse an RBAC rule JSON (`{"verbs","apiGroups","resources","resourceNames"}`).
    pub fn from_json(v: &Value) -> Self {
        let list = |k: &str| -> Vec<String> {
            v.get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        Self {
            api_groups: list("apiGroups"),
            resources: list("resources"),
            resource_names: list("resourceNames"),
            verbs: list("verbs"),
            namespaces: Vec::new(),
            non_resource_urls: list("nonResourceURLs"),
        }
    }

    /// RBAC's non-resource match: the verb, and the path exactly, or a URL ending in `*` as a
    /// prefix. Cluster-wide rules only (a RoleBinding grants no non-resource URL).
    fn matches_non_resource(&self, verb: &str, path: &str) -> bool {
        let verb_ok = self.verbs.iter().any(|v| v == "*" || v == verb);
        let path_ok = self.non_resource_urls.iter().any(|u| {
            u == path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        });
        self.namespaces.is_empty() && verb_ok && path_ok
    }

    fn matches(&self, a: &Attrs<'_>) -> bool {
        let any = |l: &[String], x: &str| l.iter().any(|e| e == "*" || e == x);
        if !any(&self.verbs, a.verb) || !any(&self.api_groups, a.group) {
            return false;
        }
        let full = if a.subresource.is_empty() {
            a.resource.to_string()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let res_ok = self.resources.iter().any(|r| {
            r == "*"
                || *r == full
                || (a.subresource.is_empty() && r == a.resource)
                || (!a.subresource.is_empty() && *r == format!("*/{}", a.subresource))
        });
        if !res_ok {
            return false;
        }
        if !self.resource_names.is_empty() && !self.resource_names.iter().any(|n| n == a.name) {
            return false;
        }
        if !self.namespaces.is_empty() && !self.namespaces.iter().any(|n| n == a.namespace) {
            return false;
        }
        true
    }
}

/// Attributes of one authorization decision.
#[derive(Debug, Clone, Copy)]
pub struct Attrs<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// A service-account token known to TokenReview (and accepted as a bearer token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountToken {
    pub namespace: String,
    pub service_account: String,
    pub service_account_uid: String,
    pub audiences: Vec<String>,
    pub expires: OffsetDateTime,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub node_name: Option<String>,
    pub node_uid: Option<String>,
    pub credential_id: String,
}

impl ServiceAccountToken {
    pub fn user(&self) -> UserInfo {
        let mut u = UserInfo::new(
            &format!(
                "system:serviceaccount:{}:{}",
                self.namespace, self.service_account
            ),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{}", self.namespace),
            ],
        );
        u.uid = self.service_account_uid.clone();
        let mut put = |k: &str, v: &Option<String>| {
            if let Some(v) = v {
                u.extra
                    .insert(format!("authentication.kubernetes.io/{k}"), vec![v.clone()]);
            }
        };
        put("pod-name", &self.pod_name);
        put("pod-uid", &self.pod_uid);
        put("node-name", &self.node_name);
        put("node-uid", &self.node_uid);
        u.extra.insert(
            "authentication.kubernetes.io/credential-id".into(),
            vec![format!("JTI={}", self.credential_id)],
        );
        u
    }
}

/// The emulator's authentication and authorization tables.
#[derive(Debug, Default)]
pub struct AuthState {
    /// token → (identity name, user)
    pub tokens: HashMap<String, (String, UserInfo)>,
    /// identity name → token
    pub identities: HashMap<String, String>,
    pub rules: Vec<(Subject, PolicyRule)>,
    pub sa_tokens: HashMap<String, ServiceAccountToken>,
}

/// The result of an authorization check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, with the authorizer's reason (may be empty).
    Deny(String),
}

impl AuthState {
    fn rbac(&self, user: &UserInfo, a: &Attrs<'_>) -> bool {
        self.rules.iter().any(|(s, r)| {
            let bound = match s {
                Subject::User(u) => *u == user.name,
                Subject::Group(g) => user.groups.iter().any(|x| x == g),
            };
            bound && r.matches(a)
        })
    }

    /// Authorize a request (Node authorizer, then RBAC, then built-in defaults).
    pub fn authorize(&self, user: &UserInfo, a: &Attrs<'_>) -> Decision {
        if user.is_admin() {
            return Decision::Allow;
        }
        let mut reason = String::new();
        if user.node_name().is_some() {
            match node_authorizer(a) {
                Some(true) => return Decision::Allow,
                Some(false)
                    if a.resource == "podcertificaterequests" && a.subresource == "status" =>
                {
                    reason =
                        "nodes may not access the status subresource of PodCertificateRequests"
                            .into();
                }
                _ => {}
            }
        }
        if self.rbac(user, a) {
            return Decision::Allow;
        }
        // Built-in: every service account and node may read CTBs (spec §1.4).
        let reader = user
            .groups
            .iter()
            .any(|g| g == "system:serviceaccounts" || g == "system:nodes");
        if reader
            && a.group == "certificates.k8s.io"
            && a.resource == "clustertrustbundles"
            && matches!(a.verb, "get" | "list" | "watch")
        {
            return Decision::Allow;
        }
        // Built-in: authenticated users may create TokenReviews of their own?
        // No: TokenReview needs RBAC like upstream (system:auth-delegator).
        Decision::Deny(reason)
    }

    /// Authorize a request for a non-resource URL (`/metrics`, `/healthz`): `system:masters`,
    /// then the RBAC rules with `nonResourceURLs`. The Node authorizer has no opinion.
    pub fn authorize_non_resource(&self, user: &UserInfo, verb: &str, path: &str) -> Decision {
        if user.is_admin() {
            return Decision::Allow;
        }
        let granted = self.rules.iter().any(|(s, r)| {
            let bound = match s {
                Subject::User(u) => *u == user.name,
                Subject::Group(g) => user.groups.iter().any(|x| x == g),
            };
            bound && r.matches_non_resource(verb, path)
        });
        match granted {
            true => Decision::Allow,
            false => Decision::Deny(String::new()),
        }
    }

    /// `IsAuthorizedForSignerName`: `<signer>`, then `<domain>/*`.
    pub fn authorized_for_signer(&self, user: &UserInfo, verb: &str, signer: &str) -> bool {
        let check = |name: &str| {
            self.authorize(
                user,
                &Attrs {
                    verb,
                    group: "certificates.k8s.io",
                    resource: "signers",
                    subresource: "",
                    namespace: "",
                    name,
                },
            ) == Decision::Allow
        };
        if check(signer) {
            return true;
        }
        match signer.split_once('/') {
            Some((domain, _)) => check(&format!("{domain}/*")),
            None => false,
        }
    }
}

/// What the Node authorizer allows (before NodeRestriction admission).
/// `None` means no opinion.
fn node_authorizer(a: &Attrs<'_>) -> Option<bool> {
    let read = matches!(a.verb, "get" | "list" | "watch");
    match (a.group, a.resource, a.subresource) {
        ("certificates.k8s.io", "podcertificaterequests", "") => {
            Some(matches!(a.verb, "create" | "get" | "list" | "watch"))
        }
        ("certificates.k8s.io", "podcertificaterequests", _) => Some(false),
        ("certificates.k8s.io", "clustertrustbundles", "") => Some(read),
        ("", "pods" | "nodes" | "serviceaccounts" | "namespaces", "") => Some(read),
        ("", "nodes", "status") => Some(matches!(a.verb, "get" | "update" | "patch")),
        ("", "events", "") | ("events.k8s.io", "events", "") => {
            Some(matches!(a.verb, "create" | "update" | "patch"))
        }
        ("coordination.k8s.io", "leases", "") => Some(true),
        _ => None,
    }
}

/// The standard RBAC "cannot" message.
pub fn forbidden_message(user: &UserInfo, a: &Attrs<'_>, reason: &str) -> String {
    let res = if a.subresource.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    let mut m = format!(
        "User \"{}\" cannot {} resource \"{res}\" in API group \"{}\" {scope}",
        user.name, a.verb, a.group
    );
    if !reason.is_empty() {
        m.push_str(": ");
        m.push_str(reason);
    }
    m
}
