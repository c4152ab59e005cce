//! Garbage collection: deleting the owned bundles podca no longer publishes (a signer removed
//! from the configuration, a changed suffix). What is garbage is decided by [`garbage`]; this is
//! the I/O around it.

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::watch;
use tracing::info;

use super::ctb::{self, Ctbs};
use super::plan::{self, DesiredBundle, garbage};
use podca_authority::metrics::{Metrics, OpLabels};

/// Lists the bundles carrying `labels` and deletes those not in `bundles`, while leading. True
/// when nothing needs a retry.
#[tracing::instrument(name = "ctb_gc", skip_all)]
pub async fn collect(
    ctbs: &Ctbs,
    bundles: &[DesiredBundle],
    labels: &BTreeMap<String, String>,
    metrics: &Metrics,
    leading: &watch::Receiver<bool>,
) -> bool {
    let owned = match ctbs.list(&plan::label_selector(labels)).await {
        Ok(owned) => owned,
        Err(e) => return ctb::api_failure(metrics, "(list)", "list", &e),
    };
    let desired: BTreeSet<&str> = bundles.iter().map(|b| b.name.as_str()).collect();
    let mut ok = true;
    for victim in garbage(&owned, &desired, labels) {
        if !*leading.borrow() {
            return true;
        }
        match ctbs.delete(victim).await {
            Ok(()) => {
                metrics
                    .ctb_writes
                    .get_or_create(&OpLabels { op: "delete" })
                    .inc();
                info!(
                    bundle = %victim.name,
                    signer = %victim.signer_name,
                    anchors = plan::count_pem_blocks(&victim.trust_bundle),
                    op = "delete",
                    "ClusterTrustBundle no longer configured: deleted"
                );
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => ok &= ctb::api_failure(metrics, &victim.name, "delete", &e),
        }
    }
    ok
}
