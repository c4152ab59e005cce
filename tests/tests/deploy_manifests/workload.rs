//! The pod: locked down (non-root, read-only, no capabilities, probes on the admin port),
//! and replicas, leader election and the disruption budget per overlay.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config::config;
use crate::objects::{
    args, container_port, flag, pod_spec, podca_container, port_of, the_deployment,
};
use crate::strict::{Rendered, parse_overlay};
use crate::{ADMIN_PORT, OVERLAYS, SERVICE_ACCOUNT};

#[test]
fn the_pod_is_locked_down() {
    for overlay in OVERLAYS {
        check_pod_locked_down(&format!("overlay {overlay}"), &parse_overlay(overlay));
    }
}

/// Non-root, read-only, no capabilities, probes on the admin port, only tmp and a software
/// token's store writable.
pub fn check_pod_locked_down(what: &str, r: &Rendered) {
    let d = the_deployment(r);
    let spec = pod_spec(d);
    let psc = spec.security_context.as_ref().expect("pod securityContext");
    assert_eq!(psc.run_as_non_root, Some(true), "{what}: runAsNonRoot");
    assert_eq!(psc.run_as_user, Some(65532), "{what}: runAsUser");
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault"),
        "{what}: pod seccompProfile"
    );
    assert_ne!(spec.host_network, Some(true), "{what}: hostNetwork");
    assert_ne!(spec.host_pid, Some(true), "{what}: hostPID");
    assert_ne!(spec.host_ipc, Some(true), "{what}: hostIPC");
    assert!(spec.init_containers.is_none(), "{what}: init containers");
    assert_eq!(spec.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
    for v in spec.volumes.iter().flatten() {
        assert!(v.host_path.is_none(), "{what}: hostPath volume {}", v.name);
    }

    let c = podca_container(d);
    let sc = c
        .security_context
        .as_ref()
        .expect("container securityContext");
    assert_eq!(sc.run_as_non_root, Some(true), "{what}: runAsNonRoot");
    assert_eq!(sc.run_as_user, Some(65532), "{what}: runAsUser");
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{what}: readOnlyRootFilesystem"
    );
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{what}: allowPrivilegeEscalation"
    );
    assert_ne!(sc.privileged, Some(true), "{what}: privileged");
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_string()][..]),
        "{what}: drop ALL"
    );
    assert!(
        caps.add.as_ref().is_none_or(Vec::is_empty),
        "{what}: no added capabilities"
    );
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault"),
        "{what}: container seccompProfile"
    );

    // Resources: requests and limits for CPU and memory.
    let res = c.resources.as_ref().expect("resources");
    for (what, map) in [("requests", &res.requests), ("limits", &res.limits)] {
        let map = map.as_ref().unwrap_or_else(|| panic!("{what}: no {what}"));
        for k in ["cpu", "memory"] {
            assert!(map.contains_key(k), "{what}: {what}.{k} unset");
        }
    }

    // Probes on the admin port, at the admin server's real paths.
    let admin_port = port_of(config(r).admin.listen);
    assert_eq!(admin_port, ADMIN_PORT);
    for (probe, path) in [
        (&c.liveness_probe, "/livez"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("{what}: no httpGet probe for {path}"));
        assert_eq!(get.path.as_deref(), Some(path), "{what}");
        let port = match &get.port {
            IntOrString::Int(p) => *p,
            IntOrString::String(name) => container_port(c, name),
        };
        assert_eq!(port, admin_port, "{what}: {path} probes the admin port");
    }

    // Read-only mounts for the config and the CA; the only writable ones are tmp, for a
    // software HSM token its object store (the module itself comes from the image), and the
    // redb ledger's volume (config::check_ledger holds it to the [ledger] path), and the
    // emptyDir where each federated trust domain's last good bundle is kept.
    for m in c.volume_mounts.iter().flatten() {
        let writable_ok = matches!(
            m.name.as_str(),
            "tmp" | "pkcs11-tokens" | "ledger" | "federation-state"
        );
        assert!(
            writable_ok || m.read_only == Some(true),
            "{what}: volume {} is mounted writable",
            m.name
        );
    }
    assert_eq!(
        args(c).first().map(String::as_str),
        Some("serve"),
        "{what}: podca serve"
    );
}

#[test]
fn replicas_leader_election_and_disruption_budget() {
    for overlay in OVERLAYS {
        check_replicas(
            &format!("overlay {overlay}"),
            overlay,
            &parse_overlay(overlay),
        );
    }
}

/// `ha`: two replicas, leader election, a PodDisruptionBudget and anti-affinity; otherwise
/// exactly one replica that is never run twice at once.
pub fn check_replicas(what: &str, flavour: &str, r: &Rendered) {
    let d = the_deployment(r);
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
    if matches!(flavour, "ha" | "ha-postgres" | "ha-sharded") {
        // Rendezvous sharding (deploy/components/sharding): three, each signing its share.
        let want = if flavour == "ha-sharded" { 3 } else { 2 };
        assert_eq!(replicas, want, "{what}: {want} replicas");
        assert_eq!(
            flag(&a, "--sharding").as_deref(),
            (flavour == "ha-sharded").then_some("rendezvous"),
            "{what}: --sharding"
        );
        assert!(elect, "{what}: --leader-elect");
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
        assert_eq!(r.pdbs.len(), 1, "{what}: one PodDisruptionBudget");
        let pdb = r.pdbs[0].spec.as_ref().unwrap();
        assert_eq!(pdb.min_available, Some(IntOrString::Int(1)));
        let pdb_sel = pdb.selector.as_ref().unwrap().match_labels.clone().unwrap();
        assert!(pdb_sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        let anti = pod_spec(d)
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .expect("{what}: pod anti-affinity");
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
        assert_eq!(replicas, 1, "{what}: one replica");
        assert!(!elect, "{what}: no --leader-elect");
        assert!(r.pdbs.is_empty(), "{what}: no PodDisruptionBudget");
        assert_eq!(
            spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
            Some("Recreate"),
            "{what}: never two pods at once"
        );
    }
}
