//! The pod: locked down (non-root, read-only, no capabilities, probes on the admin port),
//! and replicas, leader election and the disruption budget per overlay.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config::config;
use crate::objects::{args, container_port, pod_spec, podca_container, port_of, the_deployment};
use crate::strict::parse_overlay;
use crate::{ADMIN_PORT, OVERLAYS, SERVICE_ACCOUNT};

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
