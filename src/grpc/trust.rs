//! The CA and trust anchors every service reads, in one shared handle: a rotation swaps a new
//! snapshot in and every open stream (WatchTrustBundle, the Workload API) sees it at once.

use std::sync::Arc;

use podca_signer::{CaCertificate, IssuingCa};
use tokio::sync::watch;

/// The CA in force and the anchors relying parties must trust right now.
#[derive(Debug)]
pub struct CaSnapshot {
    pub ca: Arc<IssuingCa>,
    /// Every anchor to trust (the active root, plus a prepared or retired one during a rotation).
    pub anchors: Vec<CaCertificate>,
    /// The anchors as PEM.
    pub anchors_pem: String,
    /// Increases with every swap.
    pub generation: u64,
}

impl CaSnapshot {
    /// The anchors as concatenated DER, as the Workload API carries bundles.
    pub fn anchors_der(&self) -> Vec<u8> {
        self.anchors
            .iter()
            .flat_map(|c| c.der().iter().copied())
            .collect()
    }
}

/// A cheap-to-clone handle on the current [`CaSnapshot`].
#[derive(Debug, Clone)]
pub struct CaHandle {
    tx: Arc<watch::Sender<Arc<CaSnapshot>>>,
}

impl CaHandle {
    /// `anchors` empty means the CA's own roots.
    pub fn new(ca: IssuingCa, anchors: Vec<CaCertificate>) -> Self {
        let (tx, _) = watch::channel(Arc::new(snapshot(ca, anchors, 1)));
        CaHandle { tx: Arc::new(tx) }
    }

    pub fn current(&self) -> Arc<CaSnapshot> {
        Arc::clone(&self.tx.borrow())
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<CaSnapshot>> {
        self.tx.subscribe()
    }

    /// Swaps a new CA in (after a rotation or a reload) and wakes every watcher.
    pub fn replace(&self, ca: IssuingCa, anchors: Vec<CaCertificate>) -> u64 {
        let mut generation = 0;
        self.tx.send_modify(|current| {
            generation = current.generation + 1;
            *current = Arc::new(snapshot(ca, anchors, generation));
        });
        generation
    }
}

fn snapshot(ca: IssuingCa, anchors: Vec<CaCertificate>, generation: u64) -> CaSnapshot {
    let anchors = if anchors.is_empty() {
        ca.roots().to_vec()
    } else {
        anchors
    };
    let anchors_pem = anchors.iter().map(CaCertificate::pem).collect::<String>();
    CaSnapshot {
        ca: Arc::new(ca),
        anchors,
        anchors_pem,
        generation,
    }
}
