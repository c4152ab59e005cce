//! The ledger components (deploy/components/ledger-redb, deploy/components/ledger-postgres) on
//! the overlays they are for, held to the same checks as the overlays: the config parses with
//! podca's parser and its ledger is one podca can open from the mounted volumes, the RBAC is
//! exactly the overlay's, the pod stays locked down, and the NetworkPolicy opens PostgreSQL's one
//! port to named peers only.

use podca_authority::ledger::config::LedgerBackend;

use crate::config::{check_config, config};
use crate::network::check_network;
use crate::rbac::{check_rbac, expected_for};
use crate::render::{documents, render_overlay_with, repo_root};
use crate::strict::{Rendered, parse_all, parse_overlay};
use crate::workload::{check_pod_locked_down, check_replicas};

const REDB: &str = "deploy/components/ledger-redb";
const POSTGRES: &str = "deploy/components/ledger-postgres";

/// (overlay, component): each component on every overlay it is documented for.
const COMBINATIONS: &[(&str, &str)] = &[("default", REDB), ("default", POSTGRES), ("ha", POSTGRES)];

fn parse_with(overlay: &str, component: &str) -> Rendered {
    let yaml = render_overlay_with(overlay, &[component], None);
    parse_all(&documents(&yaml)).unwrap_or_else(|e| {
        panic!(
            "{overlay} + {component}: objects do not parse:\n  {}",
            e.join("\n  ")
        )
    })
}

#[test]
fn every_ledger_component_passes_the_overlay_checks() {
    for (overlay, component) in COMBINATIONS {
        let what = format!("overlay {overlay} + {component}");
        let r = parse_with(overlay, component);
        check_config(&what, overlay, &r);
        check_network(&what, &r);
        check_pod_locked_down(&what, &r);
        check_replicas(&what, overlay, &r);
        check_rbac(&what, &r);
        assert_eq!(
            expected_for(&r),
            expected_for(&parse_overlay(overlay)),
            "{what}: the ledger changes no RBAC"
        );
        let cfg = config(&r);
        match (*component, &cfg.ledger.backend) {
            (REDB, LedgerBackend::Redb { .. }) => {
                let claims: Vec<_> = r
                    .persistent_volume_claims
                    .iter()
                    .map(|c| c.metadata.name.clone().unwrap_or_default())
                    .collect();
                assert_eq!(claims, ["podca-ledger"], "{what}: the component's claim");
            }
            (POSTGRES, LedgerBackend::Postgres(_)) => {
                assert!(r.persistent_volume_claims.is_empty(), "{what}");
            }
            (_, backend) => panic!("{what}: [ledger] backend is {backend:?}"),
        }
    }
}

/// The panic message of `check_config` on `r`, which must refuse it.
fn refusal(what: &str, r: &Rendered) -> String {
    let caught = std::panic::catch_unwind(|| check_config(what, "default", r));
    let message = caught.expect_err("the ledger check must refuse this rendering");
    message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn the_ledger_check_refuses_redb_with_two_pods() {
    // The component pins one replica and Recreate; each rule trips on its own.
    let mut two = parse_with("default", REDB);
    two.deployments[0].spec.replicas = Some(2);
    let text = refusal("default + ledger-redb, 2 replicas", &two);
    assert!(
        text.contains("redb is single-process: one replica only"),
        "{text}"
    );
    let mut rolling = parse_with("default", REDB);
    if let Some(strategy) = rolling.deployments[0].spec.strategy.as_mut() {
        strategy.type_ = Some("RollingUpdate".into());
    }
    let text = refusal("default + ledger-redb, RollingUpdate", &rolling);
    assert!(
        text.contains("redb is single-process: never two pods at once"),
        "{text}"
    );
}

#[test]
fn each_component_config_is_the_base_config_with_its_own_ledger() {
    let table = |path: &str| -> toml::Table {
        let text = std::fs::read_to_string(repo_root().join(path)).unwrap();
        toml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let mut base = table("deploy/base/config.toml");
    base.remove("ledger");
    for component in [REDB, POSTGRES] {
        let mut own = table(&format!("{component}/config.toml"));
        let ledger = own.remove("ledger");
        assert_eq!(
            own, base,
            "{component}/config.toml differs from deploy/base/config.toml outside [ledger]"
        );
        let ledger = ledger.unwrap_or_else(|| panic!("{component}: no [ledger]"));
        let backend = ledger["backend"].as_str();
        let expected = if component == REDB {
            "redb"
        } else {
            "postgres"
        };
        assert_eq!(backend, Some(expected), "{component}");
    }
}

const SHARDING: &str = "deploy/components/sharding";

/// deploy/components/sharding on the ha overlay, alone and with the PostgreSQL ledger: three
/// replicas with `--sharding=rendezvous`, the overlay checks, and exactly the member Leases'
/// `list`, `patch` and `delete` in podca's namespace added to the RBAC.
#[test]
fn the_sharding_component_adds_three_replicas_and_the_member_lease_grants_only() {
    let ha = expected_for(&parse_overlay("ha"));
    for components in [&[SHARDING][..], &[POSTGRES, SHARDING][..]] {
        let what = format!("overlay ha + {}", components.join(" + "));
        let yaml = render_overlay_with("ha", components, None);
        let r = parse_all(&documents(&yaml))
            .unwrap_or_else(|e| panic!("{what}: objects do not parse:\n  {}", e.join("\n  ")));
        check_config(&what, "ha", &r);
        check_network(&what, &r);
        check_pod_locked_down(&what, &r);
        check_replicas(&what, "ha-sharded", &r);
        check_rbac(&what, &r);
        let added: Vec<_> = expected_for(&r).difference(&ha).cloned().collect();
        let member = |verb: &str| {
            (
                crate::NAMESPACE.to_string(),
                "coordination.k8s.io".to_string(),
                "leases".to_string(),
                verb.to_string(),
                None,
            )
        };
        assert_eq!(
            added,
            [member("delete"), member("list"), member("patch")],
            "{what}"
        );
        assert!(
            ha.is_subset(&expected_for(&r)),
            "{what}: nothing of ha taken away"
        );
    }
}

/// `config.ledger.log` in the chart: the key Secret's grant comes with it (the ha-postgres
/// example, checked as every example); with an HSM CA nothing is added (the key is made in the
/// token); a log without a ledger is refused at helm time.
#[test]
fn the_chart_keeps_the_ledger_log_key_beside_the_ca_or_refuses_the_log() {
    let log = "config:\n  ledger:\n    log:\n      enabled: true\n";
    let err = crate::helm::helm_with_values(log).expect_err("the chart's ledger is none");
    assert!(
        err.contains("config.ledger.log needs config.ledger.backend=postgres"),
        "{err}"
    );
    let hsm = std::fs::read_to_string(
        crate::render::repo_root().join("deploy/helm/podca/examples/hsm.yaml"),
    )
    .unwrap();
    let postgres = "  ledger:\n    backend: postgres\n    tls: disable\n    log:\n      enabled: true\n\
                    ledger:\n  postgresUrlSecret:\n    name: pg\n";
    let values = format!(
        "{hsm}\n{}",
        postgres.replacen("  ledger:", "config:\n  ledger:", 1)
    );
    // With the CA in a token the key is made there: no Secret, no grant, no mount.
    let r = crate::helm::check_helm_values("helm hsm with the ledger log", "hsm", &values);
    let log = config(&r).ledger.log.expect("[ledger.log]");
    assert_eq!((log.key_file, log.key_secret), (None, None));
    check_rbac("helm hsm with the ledger log", &r);
}
