//! The deployment manifests in deploy/: every overlay is rendered with the real kubectl
//! (`kubectl kustomize`), every object must parse into its k8s-openapi type with no field lost,
//! the RBAC must be exactly the spec §3 table plus the justified extras (for every CA a signer
//! or a signer's tenant uses: its Secret and history ConfigMap; the JWT keys beside the primary
//! CA only), the pod must be locked down, the config must be a valid podca config, and the
//! renderings must match deploy/golden/.
//!
//! kubectl: `PODCA_KUBECTL`, else the cache of deploy/tools/install-kubectl.sh. Missing kubectl
//! is a failure, never a skip.
//!
//! The Helm chart (deploy/helm/podca) is held to the same checks: [`helm`] renders each example
//! values file with the real helm (`PODCA_HELM`, else the cache of deploy/tools/install-helm.sh;
//! missing helm is a failure too) and runs the check functions of the modules below on it.
//!
//! One module per concern: [`render`] (kubectl, helm, golden files), [`strict`] (typed parsing),
//! [`objects`] (Deployment helpers), [`config`], [`rbac`], [`workload`] (the pod) and
//! [`network`] (Service, NetworkPolicy, ServiceMonitor); [`ledger`] holds the ledger components
//! to all of them; [`examples`] holds the workload examples of deploy/examples (a tenant's pod)
//! to the configs they are written for.

// Test code: a panic with a message is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod config;
mod examples;
mod federation;
mod helm;
mod ledger;
mod network;
mod objects;
mod rbac;
mod render;
mod strict;
mod workload;

const OVERLAYS: &[&str] = &["default", "ha", "hsm", "two-signers", "tenants"];
/// The Helm chart's example values files: one per overlay, and ha with the ledger in PostgreSQL.
const HELM_EXAMPLES: &[&str] = &[
    "default",
    "ha",
    "hsm",
    "ha-postgres",
    "two-signers",
    "tenants",
];
/// The PostgreSQL port the ha-postgres example's NetworkPolicy opens.
const POSTGRES_PORT: i32 = 5432;
const NAMESPACE: &str = "podca-system";
const SERVICE_ACCOUNT: &str = "podca";
/// The documented placeholder signer name.
const SIGNER: &str = "example.com/workload";
/// The two-signers flavour (deploy/overlays/two-signers, the chart's examples/two-signers.yaml):
/// each signer with its own CA, `[cas.<ca>]` a Secret: (signer, CA name, CA Secret), by signer.
const TWO_SIGNERS: &[(&str, &str, &str)] = &[
    ("example.com/batch", "batch", "ca-batch"),
    ("example.com/payments", "payments", "ca-payments"),
];
/// The two-signers flavour's `[grpc] signer`: its CA is the primary one, beside which the JWT
/// keys live.
const TWO_SIGNERS_PRIMARY: &str = "example.com/payments";

/// The tenants flavour (deploy/overlays/tenants, the chart's examples/tenants.yaml): two signers,
/// each with its own CA, `[cas.<ca>]` a Secret: (signer, CA name, CA Secret), by signer ...
const TENANT_SIGNERS: &[(&str, &str, &str)] = &[
    ("example.com/batch", "batch", "ca-batch"),
    ("example.com/mesh", "mesh", "ca-mesh"),
];
/// ... and example.com/mesh's two tenants, each its own trust domain with its own Secret CA:
/// (signer, tenant, its namespaces, CA name, CA Secret), by tenant.
const TENANTS: &[Tenant] = &[
    Tenant {
        signer: "example.com/mesh",
        name: "team-a",
        namespaces: &["team-a", "team-a-jobs"],
        ca: "team-a",
        secret: "ca-team-a",
    },
    Tenant {
        signer: "example.com/mesh",
        name: "team-b",
        namespaces: &["team-b"],
        ca: "team-b",
        secret: "ca-team-b",
    },
];
/// The tenants flavour's `[grpc] signer`: its own CA (mesh, not a tenant's) is the primary one.
const TENANTS_PRIMARY: &str = "example.com/mesh";
/// The example workload of a tenant (a Pod of team-a), for the tenants flavour.
const TENANT_POD: &str = "deploy/examples/tenant-pod.yaml";

/// One tenant of the tenants flavour.
#[derive(Debug, Clone, Copy)]
struct Tenant {
    signer: &'static str,
    name: &'static str,
    namespaces: &'static [&'static str],
    ca: &'static str,
    secret: &'static str,
}

/// The signer names a flavour (an overlay, or the Helm example of the same name) configures, in
/// name order.
fn signers_of(flavour: &str) -> Vec<&'static str> {
    match flavour {
        "two-signers" => TWO_SIGNERS.iter().map(|(signer, _, _)| *signer).collect(),
        "tenants" => TENANT_SIGNERS
            .iter()
            .map(|(signer, _, _)| *signer)
            .collect(),
        _ => vec![SIGNER],
    }
}
/// `podca serve --lease-name` default.
const DEFAULT_LEASE: &str = "podca-controller";
const GRPC_PORT: i32 = 8443;
const ADMIN_PORT: i32 = 9090;
/// `[jwt] oidc_listen`'s port (the Service maps 443 onto it).
const OIDC_PORT: i32 = 8444;
const UPDATE_HINT: &str = "PODCA_UPDATE_GOLDEN=1 cargo test -p podca-tests --test deploy_manifests";
