//! RBAC: exactly the spec §3 table plus the justified extras, no wildcards, bound only to
//! podca's ServiceAccount.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;
use podca_authority::components::ca::primary_ca;
use podca_authority::config::{CaConfig, Config, MetricsAuthMode, Sharding};

use crate::config::config;
use crate::objects::{args, flag, podca_container, the_deployment};
use crate::render::{documents, render_default_with, render_overlay_with, repo_root};
use crate::strict::{Rendered, parse_all, parse_overlay};
use crate::{
    DEFAULT_LEASE, NAMESPACE, OVERLAYS, SERVICE_ACCOUNT, SIGNER, TENANT_SIGNERS, TENANTS,
    TENANTS_PRIMARY, TWO_SIGNERS, TWO_SIGNERS_PRIMARY, signers_of,
};

/// One permission: scope ("cluster" or a namespace), apiGroup, resource, verb, resourceName.
pub type Grant = (String, String, String, String, Option<String>);

pub fn expand(scope: &str, rules: &[PolicyRule], problems: &mut Vec<String>) -> BTreeSet<Grant> {
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

/// The cluster-wide reads the config turns on, each with its component.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClusterReads {
    /// `[grpc] node_proxy_service_accounts` is set (deploy/components/issue-for-pod).
    pub issue_for_pod: bool,
    /// A rule reads `namespaceObject.metadata.labels` (deploy/components/namespace-labels).
    pub namespace_labels: bool,
    /// A signer sets `pod_facts = true` (deploy/components/pod-facts).
    pub pod_facts: bool,
    /// A signer has a `service_ca` table (deploy/components/service-ca).
    pub service_ca: bool,
    /// `[admin] metrics_auth = "kubernetes"` (deploy/components/metrics-auth).
    pub metrics_auth: bool,
}

/// `--leader-elect`: the leader Lease's name, and whether every replica signs its share
/// (`--sharding rendezvous` or `[controller] sharding = "rendezvous"`).
pub struct Lease<'a> {
    pub name: &'a str,
    pub sharded: bool,
}

/// What podca may do: spec §3's table, plus the justified extras.
pub fn expected_grants(
    signers: &[String],
    ca_secrets: &[(&str, &str)],
    lease: Option<Lease<'_>>,
    reads: ClusterReads,
    jwks_configmap: Option<(&str, &str)>,
    jwt_keys_secret: Option<(&str, &str)>,
    log_key_secret: Option<(&str, &str)>,
) -> BTreeSet<Grant> {
    let ClusterReads {
        issue_for_pod,
        namespace_labels,
        pod_facts,
        service_ca,
        metrics_auth,
    } = reads;
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
        &["patch"],
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
        &["get", "list", "watch", "create", "update", "delete"],
        None,
    );
    // Extras (each justified in deploy/base/rbac.yaml): Events (the kube-runtime Recorder
    // creates, then patches a repeat), TokenReview (gRPC API).
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
    // serviceaccounts get, cluster-wide: mTLS renewal (on by default) checks that a renewing
    // certificate's service account still exists with its chain's UID (issue #40).
    add("cluster", "", "serviceaccounts", &["get"], None);
    // pods get, cluster-wide, only when IssueForPod can succeed: with
    // `[grpc] node_proxy_service_accounts` set (deploy/components/issue-for-pod, or the Helm
    // chart's config.grpc.node_proxy_service_accounts). Without it every IssueForPod is refused
    // before any pod is read.
    if issue_for_pod {
        add("cluster", "", "pods", &["get", "list"], None);
    }
    // namespaces list and watch, cluster-wide, only when a policy rule reads
    // `namespaceObject.metadata.labels` (deploy/components/namespace-labels, or the Helm chart when a rule
    // names it): podca's metadata-only namespace watch.
    if namespace_labels {
        add("cluster", "", "namespaces", &["list", "watch"], None);
    }
    // pods get, cluster-wide, only when a signer sets `pod_facts = true`
    // (deploy/components/pod-facts, or the Helm chart when a signer entry has pod_facts: true):
    // one GET of the request's pod for rules that read pod.labels or pod.annotations. No list:
    // with IssueForPod on too, the two grants are one set.
    if pod_facts {
        add("cluster", "", "pods", &["get"], None);
    }
    // pods get and services get, cluster-wide, only when a signer has a `service_ca` table
    // (deploy/components/service-ca, or the Helm chart when a signer entry has service_ca):
    // the request's pod and the Services its kubernetes.io/service-names annotation names, one
    // GET each.
    if service_ca {
        add("cluster", "", "pods", &["get"], None);
        add("cluster", "", "services", &["get"], None);
    }
    // subjectaccessreviews create, only with `[admin] metrics_auth = "kubernetes"`
    // (deploy/components/metrics-auth, or the Helm chart's config.admin.metrics_auth): may the
    // scraper's user get /metrics?
    if metrics_auth {
        add(
            "cluster",
            "authorization.k8s.io",
            "subjectaccessreviews",
            &["create"],
            None,
        );
    }
    // The `secret` CA backend, for each Secret-held CA some signer or tenant uses (`[ca]` and
    // `[cas.<name>]`), in its Secret's namespace: the Secret by name (get, and list/watch with a
    // metadata.name field selector), the history ConfigMap `<secret>-podca-history` by name, and
    // create for that ConfigMap (create cannot be limited by name).
    for &(ns, secret) in ca_secrets {
        add(ns, "", "secrets", &["get", "list", "watch"], Some(secret));
        let history = format!("{secret}-podca-history");
        add(ns, "", "configmaps", &["get", "update"], Some(&history));
        add(ns, "", "configmaps", &["create"], None);
    }
    // The JWT key Secret beside the primary CA's Secret (`[jwt] keys_secret`, with JWT-SVIDs on
    // and a Secret-held primary CA): get and update by name, create in its namespace (create
    // cannot be limited by name).
    if let Some((ns, name)) = jwt_keys_secret {
        add(ns, "", "secrets", &["get", "update"], Some(name));
        add(ns, "", "secrets", &["create"], None);
    }
    // The ledger log's checkpoint key Secret (`[ledger.log]` on, no key_file, a Secret-held
    // primary CA): get by name, create in its namespace.
    if let Some((ns, name)) = log_key_secret {
        add(ns, "", "secrets", &["get"], Some(name));
        add(ns, "", "secrets", &["create"], None);
    }
    // The JWKS ConfigMap (`[jwt] jwks_configmap`, with JWT-SVIDs on): get and update by name,
    // create in its namespace (create cannot be limited by name).
    if let Some((ns, name)) = jwks_configmap {
        add(ns, "", "configmaps", &["get", "update"], Some(name));
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
            Some(lease.name),
        );
        // Rendezvous sharding: the member Leases, named after the pods (deploy/components/
        // sharding).
        if lease.sharded {
            add(
                NAMESPACE,
                "coordination.k8s.io",
                "leases",
                &["list", "patch", "delete"],
                None,
            );
        }
    }
    g
}

/// Every problem with the RBAC of a rendering: grants that differ from `expected` either way,
/// wildcards, and bindings to anyone but podca's ServiceAccount or to roles that do not exist.
pub fn rbac_problems(r: &Rendered, expected: &BTreeSet<Grant>) -> Vec<String> {
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

/// The Secret of every Secret-held CA some signer or tenant uses (`Config::cas_in_use`):
/// (namespace, name), in CA name order.
pub fn ca_secrets(cfg: &Config) -> Vec<(String, String)> {
    cfg.cas_in_use()
        .into_iter()
        .filter_map(|(_, ca)| match ca {
            CaConfig::Secret(s) => Some((s.namespace.clone(), s.name.clone())),
            CaConfig::File(_) | CaConfig::Pkcs11(_) => None,
        })
        .collect()
}

/// The JWT key Secret podca opens (JWT-SVIDs on): `[jwt] keys_secret` (default
/// `<secret>-jwt`) beside the primary CA's Secret (`primary_ca`: the `[grpc] signer`'s CA),
/// when that CA is Secret-held; none beside any other CA.
pub fn jwt_keys_secret(cfg: &Config) -> Option<(String, String)> {
    match cfg.ca_named(primary_ca(cfg)) {
        Some(CaConfig::Secret(s)) if cfg.jwt.enabled => {
            Some((s.namespace.clone(), cfg.jwt.keys_secret_for(&s.name)))
        }
        _ => None,
    }
}

/// The ledger log's checkpoint key Secret podca opens: `[ledger.log] key_secret` (default
/// `<secret>-log`) beside the primary CA's Secret, when the log is on without a key_file.
pub fn log_key_secret(cfg: &Config) -> Option<(String, String)> {
    let log = cfg.ledger.log.as_ref().filter(|l| l.key_file.is_none())?;
    match cfg.ca_named(primary_ca(cfg)) {
        Some(CaConfig::Secret(s)) => Some((
            s.namespace.clone(),
            log.key_secret
                .clone()
                .unwrap_or_else(|| format!("{}-log", s.name)),
        )),
        _ => None,
    }
}

/// The expected grants for a rendering, from its own config and Deployment: the signer names
/// of the config, the Secret of every Secret-held CA a signer uses (`[ca]` and `[cas.<name>]`),
/// the JWT keys beside the primary CA's, the Lease when --leader-elect is set, pods get when
/// IssueForPod has callers or a signer sets pod_facts.
pub fn expected_for(r: &Rendered) -> BTreeSet<Grant> {
    let cfg = config(r);
    let signers: Vec<String> = cfg.signers.keys().cloned().collect();
    let d = the_deployment(r);
    let a = args(podca_container(d));
    let ca_secrets = ca_secrets(&cfg);
    let lease = a
        .iter()
        .any(|x| x == "--leader-elect")
        .then(|| flag(&a, "--lease-name").unwrap_or_else(|| DEFAULT_LEASE.to_string()));
    let sharded = match flag(&a, "--sharding") {
        Some(mode) => mode == "rendezvous",
        None => cfg.controller.sharding == Sharding::Rendezvous,
    };
    let issue_for_pod = !cfg.grpc.node_proxy_service_accounts.is_empty();
    let jwks = (cfg.jwt.enabled && !cfg.jwt.jwks_configmap.is_empty()).then(|| {
        let ns = cfg
            .jwt
            .jwks_configmap_namespace
            .as_deref()
            .or(cfg.grpc.tls_namespace.as_deref())
            .unwrap_or(NAMESPACE);
        (ns, cfg.jwt.jwks_configmap.as_str())
    });
    let namespace_labels = cfg
        .signers
        .values()
        .any(|policy| policy.rules_use_namespace_labels());
    // By the flag, not by the rules: the RBAC follows `pod_facts`, as the chart does.
    let pod_facts = cfg.signers.values().any(|policy| policy.pod_facts);
    let service_ca = cfg
        .signers
        .values()
        .any(|policy| policy.service_ca.is_some());
    let jwt_keys_secret = jwt_keys_secret(&cfg);
    let ca_secrets: Vec<(&str, &str)> = ca_secrets
        .iter()
        .map(|(ns, name)| (ns.as_str(), name.as_str()))
        .collect();
    expected_grants(
        &signers,
        &ca_secrets,
        lease.as_deref().map(|name| Lease { name, sharded }),
        ClusterReads {
            issue_for_pod,
            namespace_labels,
            pod_facts,
            service_ca,
            metrics_auth: cfg.admin.metrics_auth == MetricsAuthMode::Kubernetes,
        },
        jwks,
        jwt_keys_secret
            .as_ref()
            .map(|(ns, name)| (ns.as_str(), name.as_str())),
        log_key_secret(&cfg)
            .as_ref()
            .map(|(ns, name)| (ns.as_str(), name.as_str())),
    )
}

#[test]
fn rbac_is_exactly_the_spec_table_plus_justified_extras() {
    for overlay in OVERLAYS {
        check_rbac_signers(
            &format!("overlay {overlay}"),
            &parse_overlay(overlay),
            &signers_of(overlay),
        );
    }
}

/// The RBAC of a rendering is exactly what its config and Deployment need, for the documented
/// placeholder signer.
pub fn check_rbac(what: &str, r: &Rendered) {
    check_rbac_signers(what, r, &[SIGNER]);
}

/// The RBAC of a rendering is exactly what its config and Deployment need, and the config's
/// signer names (those of the sign/attest rules) are `signers`.
pub fn check_rbac_signers(what: &str, r: &Rendered, signers: &[&str]) {
    let expected = expected_for(r);
    let problems = rbac_problems(r, &expected);
    assert!(
        problems.is_empty(),
        "{what}: RBAC problems:\n  {}",
        problems.join("\n  ")
    );
    let cfg = config(r);
    let configured: Vec<&String> = cfg.signers.keys().collect();
    assert_eq!(configured, signers, "{what}: the configured signer names");
}

/// The namespaced grants of a two-signers rendering, as podca needs them: both CAs' Secrets
/// and history ConfigMaps, the JWT keys beside the primary CA's Secret only, the JWKS
/// ConfigMap. Written out, not derived from the config: the expectation itself is checked.
fn two_signers_namespaced_grants() -> BTreeSet<Grant> {
    let mut want = BTreeSet::new();
    let mut add = |res: &str, verbs: &[&str], name: Option<&str>| {
        for v in verbs {
            want.insert((
                NAMESPACE.to_string(),
                String::new(),
                res.to_string(),
                v.to_string(),
                name.map(str::to_string),
            ));
        }
    };
    for (_, _, secret) in TWO_SIGNERS {
        add("secrets", &["get", "list", "watch"], Some(secret));
        add(
            "configmaps",
            &["get", "update"],
            Some(&format!("{secret}-podca-history")),
        );
    }
    add("configmaps", &["create"], None);
    add("secrets", &["get", "update"], Some("ca-payments-jwt"));
    add("secrets", &["create"], None);
    add("configmaps", &["get", "update"], Some("podca-jwks"));
    want
}

/// The two-signers rendering `r` (the overlay or the Helm example): each signer signs with its
/// own Secret-held CA, the `[ca]` table is neither written nor granted (no signer uses it), and
/// the RBAC names both Secrets, both history ConfigMaps, both signers, and the JWT keys of the
/// primary CA only.
pub fn check_two_signers(what: &str, r: &Rendered) {
    let cfg = config(r);
    let raw: toml::Table = toml::from_str(&crate::config::config_text(r)).unwrap();
    assert!(
        raw.get("ca").is_none(),
        "{what}: [ca] is written though no signer uses it"
    );
    for (signer, ca, secret) in TWO_SIGNERS {
        assert_eq!(cfg.ca_of_signer(signer), Some(*ca), "{what}: {signer}'s CA");
        match cfg.ca_named(ca) {
            Some(CaConfig::Secret(s)) => {
                assert_eq!(
                    (s.namespace.as_str(), s.name.as_str()),
                    (NAMESPACE, *secret),
                    "{what}: [cas.{ca}]"
                );
            }
            other => panic!("{what}: [cas.{ca}] is not a Secret CA: {other:?}"),
        }
    }
    assert_eq!(cfg.grpc.signer.as_deref(), Some(TWO_SIGNERS_PRIMARY));
    assert_eq!(primary_ca(&cfg), "payments", "{what}: the primary CA");
    assert_eq!(
        cfg.shared_ca_warnings(),
        [] as [String; 0],
        "{what}: no two signers share a CA"
    );
    let expected = expected_for(r);
    let namespaced: BTreeSet<Grant> = expected
        .iter()
        .filter(|g| g.0 != "cluster")
        .cloned()
        .collect();
    assert_eq!(
        namespaced,
        two_signers_namespaced_grants(),
        "{what}: the namespaced grants podca needs"
    );
    for verb in ["sign", "attest"] {
        let names: Vec<&str> = expected
            .iter()
            .filter(|g| g.2 == "signers" && g.3 == verb)
            .filter_map(|g| g.4.as_deref())
            .collect();
        assert_eq!(names, signers_of("two-signers"), "{what}: {verb}");
    }
    check_rbac_signers(what, r, &signers_of("two-signers"));
}

#[test]
fn the_two_signers_overlay_grants_each_ca_and_the_primary_s_jwt_keys() {
    check_two_signers("overlay two-signers", &parse_overlay("two-signers"));
}

/// The namespaced grants of a tenants rendering, as podca needs them: the Secret and history
/// ConfigMap of both signers' own CAs and of both tenants' CAs (each a CA podca opens), the JWT
/// keys beside the primary CA's Secret only (mesh's, never a tenant's), the JWKS ConfigMap.
/// Written out, not derived from the config: the expectation itself is checked.
fn tenants_namespaced_grants() -> BTreeSet<Grant> {
    let mut want = BTreeSet::new();
    let mut add = |res: &str, verbs: &[&str], name: Option<&str>| {
        for v in verbs {
            want.insert((
                NAMESPACE.to_string(),
                String::new(),
                res.to_string(),
                v.to_string(),
                name.map(str::to_string),
            ));
        }
    };
    for secret in ["ca-batch", "ca-mesh", "ca-team-a", "ca-team-b"] {
        add("secrets", &["get", "list", "watch"], Some(secret));
        add(
            "configmaps",
            &["get", "update"],
            Some(&format!("{secret}-podca-history")),
        );
    }
    add("configmaps", &["create"], None);
    add("secrets", &["get", "update"], Some("ca-mesh-jwt"));
    add("secrets", &["create"], None);
    add("configmaps", &["get", "update"], Some("podca-jwks"));
    want
}

/// The tenants rendering `r` (the overlay or the Helm example): each signer signs with its own
/// Secret-held CA; example.com/mesh has the tenants team-a and team-b, each with its namespaces,
/// its own trust domain and its own Secret CA, constrained to its namespaces' DNS names; a
/// namespace in no tenant is denied; `[ca]` is neither written nor granted; the RBAC names all
/// four CA Secrets and history ConfigMaps, both signers, and the JWT keys of the primary CA only;
/// every ClusterTrustBundle podca publishes (the tenants' included) is of a signer it may attest.
pub fn check_tenants(what: &str, r: &Rendered) {
    let cfg = config(r);
    let raw: toml::Table = toml::from_str(&crate::config::config_text(r)).unwrap();
    assert!(
        raw.get("ca").is_none(),
        "{what}: [ca] is written though no signer uses it"
    );
    let secret_ca = |ca: &str| match cfg.ca_named(ca) {
        Some(CaConfig::Secret(s)) => (s.namespace.clone(), s.name.clone()),
        other => panic!("{what}: [cas.{ca}] is not a Secret CA: {other:?}"),
    };
    for (signer, ca, secret) in TENANT_SIGNERS {
        assert_eq!(cfg.ca_of_signer(signer), Some(*ca), "{what}: {signer}'s CA");
        assert_eq!(
            secret_ca(ca),
            (NAMESPACE.to_string(), secret.to_string()),
            "{what}: [cas.{ca}]"
        );
    }
    // The tenants, as podca reads them: (signer, tenant, CA).
    let want: Vec<(&str, &str, &str)> = TENANTS.iter().map(|t| (t.signer, t.name, t.ca)).collect();
    assert_eq!(cfg.tenant_cas(), want, "{what}: the tenants and their CAs");
    for t in TENANTS {
        let policy = &cfg.signers[t.signer];
        let tenant = policy
            .tenants()
            .find(|x| x.name == t.name)
            .unwrap_or_else(|| panic!("{what}: no tenant {}", t.name));
        assert_eq!(tenant.spec.namespaces, t.namespaces, "{what}: {}", t.name);
        assert_eq!(
            tenant.trust_domain(&policy.trust_domain),
            format!("{}.{}", t.name, policy.trust_domain),
            "{what}: {}'s trust domain",
            t.name
        );
        assert_eq!(
            secret_ca(t.ca),
            (NAMESPACE.to_string(), t.secret.to_string()),
            "{what}: [cas.{}]",
            t.ca
        );
        // What the tenant's CA is made with: its namespaces' DNS subtrees, no URI constraint
        // (rustls would refuse every leaf under it).
        let constraints = cfg
            .init_constraints(t.ca)
            .unwrap_or_else(|| panic!("{what}: {} is not a tenant CA", t.ca))
            .unwrap();
        let dns: Vec<String> = t
            .namespaces
            .iter()
            .flat_map(|ns| [format!("{ns}.svc"), format!("{ns}.svc.cluster.local")])
            .collect();
        assert_eq!(constraints.permitted_dns, dns, "{what}: {}'s CA", t.name);
        assert!(constraints.permitted_uri_hosts.is_empty(), "{what}");
        for ns in t.namespaces {
            let of = policy.tenant_of(ns).unwrap().map(|x| x.name);
            assert_eq!(of, Some(t.name), "{what}: namespace {ns}'s tenant");
        }
    }
    // A namespace in no tenant is denied: no certificate of the signer's own CA for it.
    let mesh = &cfg.signers[TENANTS_PRIMARY];
    assert_eq!(mesh.untenanted, podca_signer::tenants::Untenanted::Deny);
    assert!(mesh.tenant_of("batch").is_err(), "{what}: untenanted");
    let in_use: Vec<&str> = cfg.cas_in_use().into_iter().map(|(n, _)| n).collect();
    assert_eq!(in_use, ["batch", "mesh", "team-a", "team-b"], "{what}");
    assert_eq!(cfg.grpc.signer.as_deref(), Some(TENANTS_PRIMARY));
    assert_eq!(primary_ca(&cfg), "mesh", "{what}: the primary CA");
    assert_eq!(
        cfg.shared_ca_warnings(),
        [] as [String; 0],
        "{what}: no two signers share a CA"
    );
    let expected = expected_for(r);
    let namespaced: BTreeSet<Grant> = expected
        .iter()
        .filter(|g| g.0 != "cluster")
        .cloned()
        .collect();
    assert_eq!(
        namespaced,
        tenants_namespaced_grants(),
        "{what}: the namespaced grants podca needs"
    );
    for verb in ["sign", "attest"] {
        let names: Vec<&str> = expected
            .iter()
            .filter(|g| g.2 == "signers" && g.3 == verb)
            .filter_map(|g| g.4.as_deref())
            .collect();
        assert_eq!(names, signers_of("tenants"), "{what}: {verb}");
    }
    // The bundles podca publishes, from the publisher itself: each signer's, and one per tenant
    // linked to its signer, so `attest` on the signer names covers them all.
    let bundles = crate::examples::bundles_of(&cfg);
    let names: Vec<&str> = bundles.iter().map(|(b, _)| b.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "example.com:batch:podca",
            "example.com:mesh:podca",
            "example.com:mesh:podca.team-a",
            "example.com:mesh:podca.team-b"
        ],
        "{what}: the ClusterTrustBundles"
    );
    for (bundle, _) in &bundles {
        assert!(
            signers_of("tenants").contains(&bundle.signer_name.as_str()),
            "{what}: {} is of {}, which podca may not attest",
            bundle.name,
            bundle.signer_name
        );
    }
    check_rbac_signers(what, r, &signers_of("tenants"));
}

#[test]
fn the_tenants_overlay_grants_each_tenant_ca_and_the_primary_s_jwt_keys() {
    check_tenants("overlay tenants", &parse_overlay("tenants"));
}

/// A change to an overlay's RBAC, what it is, and the problem the check must report.
type Mutation = (&'static str, fn(&mut Rendered), &'static str);

/// The overlay's RBAC passes the check, and each mutation of it is reported as expected.
fn assert_mutations_caught(overlay: &str, mutations: &[Mutation]) {
    let base = parse_overlay(overlay);
    let expected = expected_for(&base);
    assert!(rbac_problems(&base, &expected).is_empty());
    for (what, mutate, problem) in mutations {
        let mut r = parse_overlay(overlay);
        mutate(&mut r);
        let problems = rbac_problems(&r, &expected);
        assert!(
            problems.iter().any(|p| p == problem),
            "the RBAC check missed: {what}; problems: {problems:#?}"
        );
    }
}

#[test]
fn the_rbac_check_holds_each_tenant_ca_to_its_own_grants() {
    let mutations: &[Mutation] = &[
        (
            "a tenant CA's Secret missing",
            |r| drop_name(r, "ca-team-b"),
            "missing permission: (\"podca-system\", \"\", \"secrets\", \"watch\", Some(\"ca-team-b\"))",
        ),
        (
            "a tenant CA's history ConfigMap missing",
            |r| drop_name(r, "ca-team-a-podca-history"),
            "missing permission: (\"podca-system\", \"\", \"configmaps\", \"update\", \
             Some(\"ca-team-a-podca-history\"))",
        ),
        (
            "JWT keys beside a tenant's CA",
            |r| add_name(r, "ca-mesh-jwt", "ca-team-a-jwt"),
            "permission not in spec §3 or the justified extras: (\"podca-system\", \"\", \
             \"secrets\", \"update\", Some(\"ca-team-a-jwt\"))",
        ),
        (
            "the signer with tenants without attest (its tenants' bundles)",
            |r| drop_name(r, "example.com/mesh"),
            "missing permission: (\"cluster\", \"certificates.k8s.io\", \"signers\", \
             \"attest\", Some(\"example.com/mesh\"))",
        ),
    ];
    assert_mutations_caught("tenants", mutations);
}

#[test]
fn the_doctor_asks_for_every_tenant_ca_secret() {
    use podca_controller::doctor::Needs;
    let mut cfg = config(&parse_overlay("tenants"));
    cfg.jwt
        .jwks_configmap_namespace
        .get_or_insert_with(|| NAMESPACE.to_string());
    let mut secrets: Vec<(String, String)> = Needs::from_config(&cfg, None)
        .required()
        .into_iter()
        .filter(|p| p.resource == "secrets" && p.verb == "get")
        .filter_map(|p| Some((p.namespace?, p.name?)))
        .collect();
    secrets.sort();
    let want: Vec<(String, String)> = [
        "ca-batch",
        "ca-mesh",
        "ca-mesh-jwt",
        "ca-team-a",
        "ca-team-b",
    ]
    .iter()
    .map(|s| (NAMESPACE.to_string(), s.to_string()))
    .collect();
    assert_eq!(secrets, want, "`podca doctor`: the Secrets podca reads");
}

/// Every rule of every Role and ClusterRole that names `name` in its resourceNames.
fn rules_naming<'a>(r: &'a mut Rendered, name: &str) -> Vec<&'a mut PolicyRule> {
    let roles = r.roles.iter_mut().flat_map(|role| role.rules.iter_mut());
    let cluster_roles = r
        .cluster_roles
        .iter_mut()
        .flat_map(|cr| cr.rules.iter_mut());
    roles
        .chain(cluster_roles)
        .flatten()
        .filter(|rule| {
            rule.resource_names
                .as_ref()
                .is_some_and(|names| names.iter().any(|n| n == name))
        })
        .collect()
}

/// Drops `name` from every rule's resourceNames.
fn drop_name(r: &mut Rendered, name: &str) {
    for rule in rules_naming(r, name) {
        rule.resource_names.as_mut().unwrap().retain(|n| n != name);
    }
}

/// Adds `extra` to the resourceNames of every rule that names `beside`.
fn add_name(r: &mut Rendered, beside: &str, extra: &str) {
    for rule in rules_naming(r, beside) {
        rule.resource_names.as_mut().unwrap().push(extra.into());
    }
}

#[test]
fn the_rbac_check_holds_each_ca_to_its_own_grants() {
    let mutations: &[Mutation] = &[
        (
            "one CA's Secret missing",
            |r| drop_name(r, "ca-batch"),
            "missing permission: (\"podca-system\", \"\", \"secrets\", \"get\", Some(\"ca-batch\"))",
        ),
        (
            "one CA's history ConfigMap missing",
            |r| drop_name(r, "ca-payments-podca-history"),
            "missing permission: (\"podca-system\", \"\", \"configmaps\", \"get\", \
             Some(\"ca-payments-podca-history\"))",
        ),
        (
            "the CA no signer uses granted",
            |r| add_name(r, "ca-batch", "podca-ca"),
            "permission not in spec §3 or the justified extras: (\"podca-system\", \"\", \
             \"secrets\", \"get\", Some(\"podca-ca\"))",
        ),
        (
            "JWT keys beside the other CA too",
            |r| add_name(r, "ca-payments-jwt", "ca-batch-jwt"),
            "permission not in spec §3 or the justified extras: (\"podca-system\", \"\", \
             \"secrets\", \"get\", Some(\"ca-batch-jwt\"))",
        ),
        (
            "one signer without sign and attest",
            |r| drop_name(r, "example.com/batch"),
            "missing permission: (\"cluster\", \"certificates.k8s.io\", \"signers\", \
             \"attest\", Some(\"example.com/batch\"))",
        ),
    ];
    assert_mutations_caught("two-signers", mutations);
}

/// The CA Role's rule for the history ConfigMap (the ConfigMap rule with resourceNames).
fn history_rule(r: &mut Rendered) -> &mut PolicyRule {
    let rules = r.roles[0].rules.as_mut().expect("the CA Role has rules");
    rules
        .iter_mut()
        .find(|x| x.resources == Some(vec!["configmaps".into()]) && x.resource_names.is_some())
        .expect("a rule for the history ConfigMap")
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
            let tokenreviews = rules
                .iter_mut()
                .find(|x| x.resources == Some(vec!["tokenreviews".into()]));
            tokenreviews.unwrap().verbs.push("get".into());
        }),
        ("pods get without IssueForPod callers", |r| {
            r.cluster_roles[0].rules.as_mut().unwrap().push(PolicyRule {
                api_groups: Some(vec!["".into()]),
                resources: Some(vec!["pods".into()]),
                verbs: vec!["get".into()],
                ..Default::default()
            });
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
            history_rule(r).resource_names = None;
        }),
        ("delete on the history ConfigMap", |r| {
            history_rule(r).verbs.push("delete".into());
        }),
        ("every ConfigMap, not just the JWKS", |r| {
            let jwks = r
                .roles
                .iter_mut()
                .find(|role| role.metadata.name.as_deref() == Some("podca-jwks"))
                .expect("the JWKS Role");
            for rule in jwks.rules.as_mut().unwrap() {
                rule.resource_names = None;
            }
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

/// The component and the config that turn IssueForPod on.
const ISSUE_FOR_POD: &str = "deploy/components/issue-for-pod";

/// The base config with a node proxy allowed to call IssueForPod.
fn config_with_node_proxy() -> String {
    let base = std::fs::read_to_string(repo_root().join("deploy/base/config.toml")).unwrap();
    let with = base.replace(
        "\ntoken_audience = ",
        "\nnode_proxy_service_accounts = [\"kube-system/node-proxy\"]\ntoken_audience = ",
    );
    assert_ne!(with, base, "the base config has [grpc] token_audience");
    with
}

fn parse_kustomization(yaml: &str) -> Rendered {
    parse_all(&documents(yaml)).unwrap_or_else(|e| panic!("{}", e.join("\n")))
}

fn grants_pods(r: &Rendered) -> bool {
    let mut problems = Vec::new();
    r.cluster_roles.iter().any(|cr| {
        expand(
            "cluster",
            cr.rules.as_deref().unwrap_or_default(),
            &mut problems,
        )
        .iter()
        .any(|(_, group, res, _, _)| group.is_empty() && res == "pods")
    })
}

#[test]
fn pods_get_only_with_issue_for_pod_callers() {
    for overlay in OVERLAYS {
        assert!(
            !grants_pods(&parse_overlay(overlay)),
            "overlay {overlay}: pods access without IssueForPod callers"
        );
    }
    // The component with callers configured: exactly the expected grants, pods get included.
    let with = config_with_node_proxy();
    let r = parse_kustomization(&render_default_with(&[ISSUE_FOR_POD], Some(&with)));
    check_rbac("default + issue-for-pod", &r);
    assert!(grants_pods(&r), "the component grants pods get");
    // The component without callers: pods get is one permission too many.
    let r = parse_kustomization(&render_default_with(&[ISSUE_FOR_POD], None));
    let problems = rbac_problems(&r, &expected_for(&r));
    assert_eq!(
        problems,
        [
            "permission not in spec §3 or the justified extras: \
             (\"cluster\", \"\", \"pods\", \"get\", None)",
            "permission not in spec §3 or the justified extras: \
             (\"cluster\", \"\", \"pods\", \"list\", None)"
        ],
        "the component without callers"
    );
    // Callers without the component: IssueForPod would fail with 403 on every call.
    let r = parse_kustomization(&render_default_with(&[], Some(&with)));
    let problems = rbac_problems(&r, &expected_for(&r));
    assert_eq!(
        problems,
        [
            "missing permission: (\"cluster\", \"\", \"pods\", \"get\", None)",
            "missing permission: (\"cluster\", \"\", \"pods\", \"list\", None)"
        ],
        "callers without the component"
    );
}

/// The component that lets policy rules read namespace labels.
const NAMESPACE_LABELS: &str = "deploy/components/namespace-labels";

/// The base config with a rule on `namespaceObject.metadata.labels` for its signer.
pub fn config_with_namespace_label_rule() -> String {
    let base = std::fs::read_to_string(repo_root().join("deploy/base/config.toml")).unwrap();
    let cfg = podca_authority::config::Config::parse(&base).unwrap();
    let signer = cfg
        .signers
        .keys()
        .next()
        .expect("the base config has a signer")
        .clone();
    format!(
        "{base}\n[[signers.\"{signer}\".rules]]\nname = \"production_only\"\n\
         require = \"namespaceObject.metadata.labels.tier == 'prod'\"\nreason = \"NamespaceNotProduction\"\n"
    )
}

fn grants_namespaces(r: &Rendered) -> bool {
    let mut problems = Vec::new();
    r.cluster_roles.iter().any(|cr| {
        expand(
            "cluster",
            cr.rules.as_deref().unwrap_or_default(),
            &mut problems,
        )
        .iter()
        .any(|(_, group, res, _, _)| group.is_empty() && res == "namespaces")
    })
}

#[test]
fn namespaces_list_watch_only_with_a_namespace_label_rule() {
    for overlay in OVERLAYS {
        assert!(
            !grants_namespaces(&parse_overlay(overlay)),
            "overlay {overlay}: namespace access without a rule that reads namespace labels"
        );
    }
    let with = config_with_namespace_label_rule();
    let r = parse_kustomization(&render_default_with(&[NAMESPACE_LABELS], Some(&with)));
    check_rbac("default + namespace-labels", &r);
    assert!(
        grants_namespaces(&r),
        "the component grants namespaces list, watch"
    );
    // The component without such a rule: one permission too many.
    let r = parse_kustomization(&render_default_with(&[NAMESPACE_LABELS], None));
    let problems = rbac_problems(&r, &expected_for(&r));
    assert_eq!(
        problems,
        [
            "permission not in spec §3 or the justified extras: \
             (\"cluster\", \"\", \"namespaces\", \"list\", None)",
            "permission not in spec §3 or the justified extras: \
             (\"cluster\", \"\", \"namespaces\", \"watch\", None)"
        ],
        "the component without a rule"
    );
    // A rule without the component: the namespace watch would get 403.
    let r = parse_kustomization(&render_default_with(&[], Some(&with)));
    let problems = rbac_problems(&r, &expected_for(&r));
    assert_eq!(
        problems,
        [
            "missing permission: (\"cluster\", \"\", \"namespaces\", \"list\", None)",
            "missing permission: (\"cluster\", \"\", \"namespaces\", \"watch\", None)"
        ],
        "a rule without the component"
    );
}

/// The component that lets signers with `pod_facts = true` read the request's pod.
const POD_FACTS: &str = "deploy/components/pod-facts";

/// The base config with `pod_facts = true` for its signer, and a rule that reads the pod's
/// labels (what the flag is for; the RBAC follows the flag alone).
pub fn config_with_pod_facts() -> String {
    let base = std::fs::read_to_string(repo_root().join("deploy/base/config.toml")).unwrap();
    let header = format!("[signers.\"{SIGNER}\"]\n");
    let with = base.replace(&header, &format!("{header}pod_facts = true\n"));
    assert_ne!(with, base, "the base config has a {header:?} table");
    format!(
        "{with}\n[[signers.\"{SIGNER}\".rules]]\nname = \"labelled\"\n\
         require = \"pod.labels['certs.example.com/allowed'] == 'true'\"\nreason = \"PodNotLabelled\"\n"
    )
}

/// Every ClusterRole rule on core `pods`, as rendered.
fn pod_rules(r: &Rendered) -> Vec<PolicyRule> {
    r.cluster_roles
        .iter()
        .flat_map(|cr| cr.rules.clone().unwrap_or_default())
        .filter(|rule| {
            rule.api_groups.as_deref() == Some(&["".to_string()][..])
                && rule
                    .resources
                    .as_deref()
                    .is_some_and(|res| res.iter().any(|x| x == "pods"))
        })
        .collect()
}

fn pods_rule(verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec!["".into()]),
        resources: Some(vec!["pods".into()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn pods_get_only_with_a_signer_that_sets_pod_facts() {
    // No overlay grants any pod access (neither IssueForPod's get, list nor pod_facts' get).
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        assert_eq!(pod_rules(&r), [], "overlay {overlay}: a rule on pods");
        assert!(!config(&r).signers.values().any(|p| p.pod_facts));
    }
    let with = config_with_pod_facts();
    let cfg = podca_authority::config::Config::parse(&with).expect("podca accepts the config");
    assert!(cfg.signers[SIGNER].pod_facts);
    assert!(cfg.signers[SIGNER].rules_use_pod_facts());
    // The component with pod_facts: exactly the expected grants, and the one rule `pods get`.
    let r = parse_kustomization(&render_default_with(&[POD_FACTS], Some(&with)));
    check_rbac("default + pod-facts", &r);
    assert_eq!(pod_rules(&r), [pods_rule(&["get"])], "default + pod-facts");
    let mut problems = Vec::new();
    let pods: Vec<Grant> = expand("cluster", &pod_rules(&r), &mut problems)
        .into_iter()
        .collect();
    assert_eq!(
        pods,
        [(
            "cluster".to_string(),
            String::new(),
            "pods".to_string(),
            "get".to_string(),
            None
        )],
        "cluster-wide get, no list, no watch, no resourceNames"
    );
    assert!(problems.is_empty(), "{problems:?}");
    // The component without pod_facts: one permission too many.
    let r = parse_kustomization(&render_default_with(&[POD_FACTS], None));
    let problems = rbac_problems(&r, &expected_for(&r));
    assert_eq!(
        problems,
        ["permission not in spec §3 or the justified extras: \
          (\"cluster\", \"\", \"pods\", \"get\", None)"],
        "the component without pod_facts"
    );
    // pod_facts without the component: every pod read would get 403.
    let r = parse_kustomization(&render_default_with(&[], Some(&with)));
    let problems = rbac_problems(&r, &expected_for(&r));
    assert_eq!(
        problems,
        ["missing permission: (\"cluster\", \"\", \"pods\", \"get\", None)"],
        "pod_facts without the component"
    );
    // With IssueForPod too: both components, both rules; the grants are their union.
    let both = config_with_node_proxy().replace(
        &format!("[signers.\"{SIGNER}\"]\n"),
        &format!("[signers.\"{SIGNER}\"]\npod_facts = true\n"),
    );
    let r = parse_kustomization(&render_default_with(
        &[ISSUE_FOR_POD, POD_FACTS],
        Some(&both),
    ));
    check_rbac("default + issue-for-pod + pod-facts", &r);
    assert_eq!(
        pod_rules(&r),
        [pods_rule(&["get", "list"]), pods_rule(&["get"])],
        "default + issue-for-pod + pod-facts"
    );
    // IssueForPod's component alone covers pod_facts' get.
    let r = parse_kustomization(&render_default_with(&[ISSUE_FOR_POD], Some(&both)));
    check_rbac("default + issue-for-pod, pod_facts on", &r);
}

#[test]
fn the_doctor_asks_for_exactly_the_grants_of_every_overlay() {
    use podca_controller::doctor::{LeaseRef, Needs};
    let sharded = parse_all(&documents(&render_overlay_with(
        "ha",
        &["deploy/components/sharding"],
        None,
    )))
    .expect("ha + sharding parses");
    let renderings = OVERLAYS
        .iter()
        .map(|o| (format!("overlay {o}"), parse_overlay(o)))
        .chain([("overlay ha + sharding".to_string(), sharded)]);
    for (overlay, r) in renderings {
        let mut cfg = config(&r);
        // `podca serve` puts the JWKS ConfigMap in its pod's namespace; the doctor, which does
        // not run there, is told it here rather than through POD_NAMESPACE.
        cfg.jwt
            .jwks_configmap_namespace
            .get_or_insert_with(|| NAMESPACE.to_string());
        let a = args(podca_container(the_deployment(&r)));
        let lease = a.iter().any(|x| x == "--leader-elect").then(|| LeaseRef {
            namespace: NAMESPACE.into(),
            name: flag(&a, "--lease-name").unwrap_or_else(|| DEFAULT_LEASE.to_string()),
            sharded: flag(&a, "--sharding").as_deref() == Some("rendezvous"),
        });
        let doctor: BTreeSet<Grant> = Needs::from_config(&cfg, lease)
            .required()
            .into_iter()
            .map(|p| {
                (
                    p.namespace.unwrap_or_else(|| "cluster".into()),
                    p.group,
                    p.resource,
                    p.verb,
                    p.name,
                )
            })
            .collect();
        assert_eq!(
            doctor,
            expected_for(&r),
            "{overlay}: `podca doctor` and the manifests disagree"
        );
    }
}

const METRICS_AUTH: &str = "deploy/components/metrics-auth";

/// The ClusterRole rules on `subjectaccessreviews`, as rendered.
fn access_review_rules(r: &Rendered) -> Vec<PolicyRule> {
    r.cluster_roles
        .iter()
        .flat_map(|cr| cr.rules.clone().unwrap_or_default())
        .filter(|rule| {
            rule.resources
                .as_deref()
                .is_some_and(|res| res.iter().any(|x| x == "subjectaccessreviews"))
        })
        .collect()
}

#[test]
fn subjectaccessreviews_only_with_metrics_auth_kubernetes() {
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        assert_eq!(access_review_rules(&r), [], "overlay {overlay}");
        assert_eq!(config(&r).admin.metrics_auth, MetricsAuthMode::None);
    }
    let base = std::fs::read_to_string(repo_root().join("deploy/base/config.toml")).unwrap();
    let with = base.replace("[admin]\n", "[admin]\nmetrics_auth = \"kubernetes\"\n");
    assert_ne!(with, base, "the base config has an [admin] table");
    let r = parse_kustomization(&render_default_with(&[METRICS_AUTH], Some(&with)));
    assert_eq!(config(&r).admin.metrics_auth, MetricsAuthMode::Kubernetes);
    check_rbac("default + metrics-auth", &r);
    assert_eq!(
        access_review_rules(&r),
        [PolicyRule {
            api_groups: Some(vec!["authorization.k8s.io".into()]),
            resources: Some(vec!["subjectaccessreviews".into()]),
            verbs: vec!["create".into()],
            ..Default::default()
        }]
    );
    // The setting without the component: podca could not ask, so the check says so.
    let r = parse_kustomization(&render_default_with(&[], Some(&with)));
    let problems = rbac_problems(&r, &expected_for(&r));
    assert!(
        problems.iter().any(|p| p.contains("subjectaccessreviews")),
        "{problems:?}"
    );
}

/// The component that lets signers with a `service_ca` table read pods and Services.
const SERVICE_CA: &str = "deploy/components/service-ca";

/// The base config with a `service_ca` table for its signer.
pub fn config_with_service_ca() -> String {
    let base = std::fs::read_to_string(repo_root().join("deploy/base/config.toml")).unwrap();
    format!("{base}\n[signers.\"{SIGNER}\".service_ca]\ncluster_domain = \"cluster.local\"\n")
}

#[test]
fn pods_and_services_get_only_with_a_signer_that_has_service_ca() {
    for overlay in OVERLAYS {
        let r = parse_overlay(overlay);
        assert!(
            !config(&r).signers.values().any(|p| p.service_ca.is_some()),
            "overlay {overlay}"
        );
    }
    let with = config_with_service_ca();
    let cfg = podca_authority::config::Config::parse(&with).expect("podca accepts the config");
    assert!(cfg.signers[SIGNER].service_ca.is_some());
    // The component with the table: exactly the expected grants.
    let r = parse_kustomization(&render_default_with(&[SERVICE_CA], Some(&with)));
    check_rbac("default + service-ca", &r);
    let mut problems = Vec::new();
    let reads: Vec<Grant> = expand(
        "cluster",
        &r.cluster_roles[0].rules.clone().unwrap_or_default(),
        &mut problems,
    )
    .into_iter()
    .filter(|(_, group, res, _, _)| group.is_empty() && (res == "pods" || res == "services"))
    .collect();
    let get = |res: &str| {
        (
            "cluster".to_string(),
            String::new(),
            res.to_string(),
            "get".to_string(),
            None,
        )
    };
    assert_eq!(
        reads,
        [get("pods"), get("services")],
        "get only, no list, no watch"
    );
    assert_eq!(problems, [] as [String; 0]);
    // Without the table the component's grants are more than podca needs; with the table and
    // without the component, podca lacks them.
    let base = std::fs::read_to_string(repo_root().join("deploy/base/config.toml")).unwrap();
    let extra = parse_kustomization(&render_default_with(&[SERVICE_CA], Some(&base)));
    let want = expected_for(&extra);
    assert!(!want.contains(&get("services")));
    let missing = parse_kustomization(&render_default_with(&[], Some(&with)));
    assert!(expected_for(&missing).contains(&get("services")));
    assert!(
        !expand(
            "cluster",
            &missing.cluster_roles[0].rules.clone().unwrap_or_default(),
            &mut Vec::new()
        )
        .contains(&get("services")),
        "the base grants no Service reads"
    );
}
