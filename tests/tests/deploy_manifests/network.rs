//! What the pod exposes: the Service and NetworkPolicy (gRPC, OIDC and metrics only), and the
//! monitoring component's ServiceMonitor.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config::config;
use crate::objects::{container_port, podca_container, port_of, the_deployment};
use crate::render::{documents, render_default_with_monitoring, render_overlay};
use crate::strict::{Rendered, parse_all, parse_overlay};
use podca_authority::ledger::config::LedgerBackend;

use crate::{ADMIN_PORT, GRPC_PORT, NAMESPACE, OIDC_PORT, OVERLAYS, POSTGRES_PORT};

#[test]
fn service_and_network_policy_expose_only_grpc_and_metrics() {
    for overlay in OVERLAYS {
        check_network(&format!("overlay {overlay}"), &parse_overlay(overlay));
    }
}

/// The Service and the NetworkPolicy expose only gRPC and metrics; egress only DNS and the API
/// server, and with a PostgreSQL ledger its port on the peers named.
pub fn check_network(what: &str, r: &Rendered) {
    let d = the_deployment(r);
    let c = podca_container(d);
    let cfg = config(r);
    let grpc = port_of(cfg.grpc.listen);
    let admin = port_of(cfg.admin.listen);
    assert_eq!((grpc, admin), (GRPC_PORT, ADMIN_PORT), "{what}");
    assert_eq!(container_port(c, "grpc"), grpc);
    assert_eq!(container_port(c, "metrics"), admin);
    // OIDC discovery ([jwt] oidc_listen), over HTTPS with the gRPC certificate.
    let oidc = port_of(cfg.jwt.oidc_listen.expect("[jwt] oidc_listen is set"));
    assert_eq!(oidc, OIDC_PORT, "{what}");
    assert_eq!(container_port(c, "oidc"), oidc);
    assert!(
        cfg.jwt
            .issuer
            .as_deref()
            .is_some_and(|i| i.starts_with("https://")),
        "{what}: an https issuer"
    );

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
            // The Istio CA API's conventional port, onto the same listener (issue #16).
            (
                "grpc-istio".into(),
                (15012, Some(IntOrString::String("grpc".into())))
            ),
            // OIDC discovery on the HTTPS port: the issuer needs no port (issue #17).
            (
                "oidc".into(),
                (443, Some(IntOrString::String("oidc".into())))
            ),
            (
                "metrics".into(),
                (ADMIN_PORT, Some(IntOrString::String("metrics".into())))
            ),
        ]),
        "{what}: Service ports"
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
        "{what}: both directions are restricted"
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
        BTreeSet::from([
            (GRPC_PORT, "TCP".into()),
            (OIDC_PORT, "TCP".into()),
            (ADMIN_PORT, "TCP".into())
        ]),
        "{what}: ingress only to gRPC, OIDC discovery and metrics"
    );
    // gRPC from every pod; OIDC discovery and the admin port only from their named peers
    // (issue #40: one pod must not reach, and starve, the probes' port).
    let from_of = |port: i32| -> Vec<serde_json::Value> {
        let rules: Vec<_> = ingress
            .iter()
            .filter(|r| {
                r.ports
                    .iter()
                    .flatten()
                    .any(|p| p.port == Some(IntOrString::Int(port)))
            })
            .collect();
        assert_eq!(rules.len(), 1, "{what}: one ingress rule for port {port}");
        assert_eq!(
            rules[0].ports.as_ref().map(Vec::len),
            Some(1),
            "{what}: port {port}'s rule opens that port only"
        );
        rules[0]
            .from
            .iter()
            .flatten()
            .map(|peer| serde_json::to_value(peer).expect("a peer serializes"))
            .collect()
    };
    assert_eq!(
        from_of(GRPC_PORT),
        Vec::<serde_json::Value>::new(),
        "{what}"
    );
    assert_eq!(
        from_of(ADMIN_PORT),
        [serde_json::json!({"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}})],
        "{what}: the admin port from the monitoring namespace only"
    );
    assert_eq!(
        from_of(OIDC_PORT),
        [serde_json::json!({"namespaceSelector": {"matchLabels": {
            "podca.dev/oidc-client": "true"}}})],
        "{what}: OIDC discovery from labelled namespaces only"
    );
    let mut egress = np.egress.clone().unwrap();
    let postgres = matches!(cfg.ledger.backend, LedgerBackend::Postgres(_));
    let postgres_rule = |r: &k8s_openapi::api::networking::v1::NetworkPolicyEgressRule| {
        r.ports
            .iter()
            .flatten()
            .any(|p| p.port == Some(IntOrString::Int(POSTGRES_PORT)))
    };
    let postgres_rules: Vec<_> = egress
        .iter()
        .filter(|r| postgres_rule(r))
        .cloned()
        .collect();
    egress.retain(|r| !postgres_rule(r));
    if postgres {
        assert_eq!(postgres_rules.len(), 1, "{what}: one rule for PostgreSQL");
        let rule = &postgres_rules[0];
        assert_eq!(
            port_set(vec![rule.ports.clone().unwrap()]),
            BTreeSet::from([(POSTGRES_PORT, "TCP".into())]),
            "{what}: the PostgreSQL rule opens its port only"
        );
        let to = rule.to.clone().unwrap_or_default();
        assert!(
            !to.is_empty()
                && to.iter().all(|peer| peer.ip_block.is_some()
                    || (peer.pod_selector.is_some() && peer.namespace_selector.is_some())),
            "{what}: PostgreSQL egress goes to named peers only: {to:?}"
        );
    } else {
        assert!(
            postgres_rules.is_empty(),
            "{what}: no PostgreSQL egress without a PostgreSQL ledger"
        );
    }
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
        "{what}: egress only to DNS and the API server"
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
