//! The ledger component: opens `[ledger]` once (redb, PostgreSQL or none), registers its
//! metrics, and runs its writer and, while this replica leads, its retention. Every replica
//! records into it, leader or standby. The writer stops in the support stage, after every
//! serving component has recorded its last decision.

use std::path::Path;

use tracing::{info, warn};

use crate::ledger::{self, LedgerConfig, LedgerHandle, LedgerMetrics, Store, StoreError};
use crate::runtime::{Runtime, Stage};

/// Opens the ledger `config` names (`default_redb`: the data directory's `ledger.redb`, for a
/// configuration that names no path) and spawns its tasks. `log_key`: the checkpoint key when
/// it is not in a file (the Secret CA backend's, `podca_controller::log_key_secret`). The error
/// is one line: unreachable, credentials, TLS, a newer schema, a redb file in use.
pub async fn start(
    rt: &mut Runtime,
    config: &LedgerConfig,
    default_redb: Option<&Path>,
    log_key: Option<podca_signer::merkle_note::LogKey>,
) -> Result<LedgerHandle, StoreError> {
    let Some(store) = Store::open(&config.backend, default_redb).await? else {
        warn!("[ledger] backend = \"none\": decisions are written to the audit log only");
        return Ok(LedgerHandle::none());
    };
    info!(backend = store.label(), on_unavailable = ?config.on_unavailable, "ledger open");
    if let Some(retention) = config.retention {
        let (store, leading) = (store.clone(), rt.leadership().subscribe());
        rt.spawn(Stage::Support, "ledger retention", |stop| {
            ledger::apply_retention(store, retention, leading, stop)
        });
    }
    let metrics = rt
        .metrics()
        .register_component("ledger", LedgerMetrics::register);
    if let Some(log) = &config.log {
        let key = match log_key {
            Some(key) => key,
            None if log.key_secret.is_some() => {
                return Err(StoreError::Config(
                    "[ledger.log] key_secret needs the CA in a Secret ([ca] backend = \"secret\", \
                     podca serve); use key_file here"
                        .into(),
                ));
            }
            None => {
                let key_file = log
                    .key_file
                    .clone()
                    .or_else(|| {
                        default_redb
                            .and_then(Path::parent)
                            .map(|d| d.join("log.key"))
                    })
                    .ok_or_else(|| {
                        StoreError::Config(
                            "[ledger.log] key_file is required here: there is no CA data \
                             directory to put log.key in (with [ca] backend = \"secret\" the key \
                             goes in a Secret)"
                                .into(),
                        )
                    })?;
                podca_signer::merkle_note::LogKey::load_or_generate(&key_file, &log.origin)
                    .map_err(|e| StoreError::Config(e.to_string()))?
            }
        };
        info!(verifier = %key.verifier().to_text(), "ledger log: checkpoints signed by this key");
        rt.serve_log(std::sync::Arc::new(ledger::tiles::LogTiles::new(
            store.clone(),
        )));
        let (store, leading, every) = (store.clone(), rt.leadership().subscribe(), log.interval);
        let metrics = metrics.clone();
        rt.spawn(Stage::Support, "ledger checkpoints", move |stop| {
            let key = std::sync::Arc::new(key);
            ledger::log::publish_checkpoints(store, key, every, metrics, leading, stop)
        });
    }
    let (handle, writer) = ledger::start(store, config, metrics);
    rt.spawn(Stage::Support, "ledger writer", |stop| writer.run(stop));
    rt.use_ledger(handle.clone());
    Ok(handle)
}
