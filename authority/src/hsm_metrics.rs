//! HSM metrics: the PKCS#11 key's signing statistics as Prometheus metrics (prefix `podca_hsm_`).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use podca_signer::backend::Pkcs11Stats;

use crate::ca::HsmKeySlot;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// The exported figures.
#[derive(Debug, Clone, Default)]
pub struct HsmMetrics {
    signs: Counter,
    errors: Counter,
    sign_seconds: Counter<f64, AtomicU64>,
    max_sign_seconds: Gauge<f64, AtomicU64>,
    recoveries: Counter,
    pool_size: Gauge,
}

impl HsmMetrics {
    /// Registers the metrics in the HSM's sub-registry (prefix `hsm`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = HsmMetrics::default();
        registry.register(
            "signatures",
            "Signatures made by the HSM-held CA key",
            m.signs.clone(),
        );
        registry.register(
            "errors",
            "HSM sign operations that failed (retried; requests stay pending)",
            m.errors.clone(),
        );
        registry.register(
            "sign_seconds",
            "Total seconds spent in HSM sign operations (divide by hsm_signatures for the mean)",
            m.sign_seconds.clone(),
        );
        registry.register(
            "max_sign_seconds",
            "Slowest HSM sign operation of the current key, in seconds",
            m.max_sign_seconds.clone(),
        );
        registry.register(
            "recoveries",
            "Reconnections to the token after a failure",
            m.recoveries.clone(),
        );
        registry.register(
            "session_pool_size",
            "PKCS#11 sessions in the pool",
            m.pool_size.clone(),
        );
        m
    }

    /// Copies the key's statistics every few seconds until `stop` turns true.
    pub async fn export(self, key: HsmKeySlot, mut stop: watch::Receiver<bool>) {
        // Statistics belong to one opened key; a reopened key starts again from zero.
        let mut last: Option<(usize, Pkcs11Stats)> = None;
        loop {
            let current = key
                .lock()
                .ok()
                .and_then(|k| k.as_ref().map(|k| (Arc::as_ptr(k) as usize, k.stats())));
            if let Some((id, stats)) = current {
                let base = match &last {
                    Some((last_id, s)) if *last_id == id => *s,
                    _ => Pkcs11Stats::default(),
                };
                self.signs.inc_by(stats.signs.saturating_sub(base.signs));
                self.errors.inc_by(stats.errors.saturating_sub(base.errors));
                self.recoveries
                    .inc_by(stats.recoveries.saturating_sub(base.recoveries));
                self.sign_seconds.inc_by(
                    stats
                        .total_latency
                        .saturating_sub(base.total_latency)
                        .as_secs_f64(),
                );
                self.max_sign_seconds.set(stats.max_latency.as_secs_f64());
                self.pool_size.set(stats.pool_size as i64);
                last = Some((id, stats));
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                r = stop.wait_for(|s| *s) => { let _ = r; return; }
            }
        }
    }
}
