//! The CA and trust anchors every part of podca reads, in one shared handle: a rotation (or a
//! reload) swaps a new snapshot in, and the PCR controller, the ClusterTrustBundle publisher and
//! every open gRPC stream (WatchTrustBundle, the Workload API) see it at once.
//!
//! Also the [`Clock`] everything time-dependent reads, so tests can run a CA's whole life in
//! simulated time.

use std::collections::BTreeMap;
use std::sync::Arc;

use podca_signer::{CaCertificate, IssuingCa};
use time::OffsetDateTime;
use tokio::sync::watch;

/// The CA in force and the anchors relying parties must trust right now.
#[derive(Debug)]
pub struct CaSnapshot {
    pub ca: Arc<IssuingCa>,
    /// Every anchor to trust (the active root, plus a prepared or retired one during a rotation).
    pub anchors: Vec<CaCertificate>,
    /// The anchors as PEM.
    pub anchors_pem: String,
    /// Increases with every swap in this process: a version for watchers (bundle streams), not
    /// the CA's generation.
    pub generation: u64,
    /// The CA generation that signs, as `podca ca show`, the metrics and the ledger number
    /// them; `None` for a CA made in code.
    pub ca_generation: Option<u32>,
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
        Self::from_arc(Arc::new(ca), anchors)
    }

    /// Like [`CaHandle::new`] for a CA that is already shared.
    pub fn from_arc(ca: Arc<IssuingCa>, anchors: Vec<CaCertificate>) -> Self {
        let numbered = ca.generation();
        Self::numbered(ca, anchors, numbered)
    }

    /// Like [`CaHandle::from_arc`], for a CA whose generation its owner knows (see
    /// [`CaHandle::replace_numbered`]).
    pub fn numbered(
        ca: Arc<IssuingCa>,
        anchors: Vec<CaCertificate>,
        ca_generation: Option<u32>,
    ) -> Self {
        let mut first = snapshot(ca, anchors, 1);
        first.ca_generation = ca_generation;
        let (tx, _) = watch::channel(Arc::new(first));
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
        self.replace_arc(Arc::new(ca), anchors)
    }

    /// Like [`CaHandle::replace`] for a CA that is already shared.
    pub fn replace_arc(&self, ca: Arc<IssuingCa>, anchors: Vec<CaCertificate>) -> u64 {
        let numbered = ca.generation();
        self.replace_numbered(ca, anchors, numbered)
    }

    /// Like [`CaHandle::replace_arc`], for a CA whose generation its owner knows (a Secret's
    /// history) rather than the CA itself ([`IssuingCa::generation`]).
    pub fn replace_numbered(
        &self,
        ca: Arc<IssuingCa>,
        anchors: Vec<CaCertificate>,
        ca_generation: Option<u32>,
    ) -> u64 {
        let mut generation = 0;
        self.tx.send_modify(|current| {
            generation = current.generation + 1;
            let mut next = snapshot(ca, anchors, generation);
            next.ca_generation = ca_generation;
            *current = Arc::new(next);
        });
        generation
    }
}

impl From<IssuingCa> for CaHandle {
    fn from(ca: IssuingCa) -> Self {
        CaHandle::new(ca, vec![])
    }
}

impl From<Arc<IssuingCa>> for CaHandle {
    fn from(ca: Arc<IssuingCa>) -> Self {
        CaHandle::from_arc(ca, vec![])
    }
}

/// Every CA of the process, by name, and the CA each signer signs with: a signer's
/// certificates, its ClusterTrustBundles and its gRPC bundles come from its own CA only, so
/// signers with different CAs are separate trust domains. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CaSet {
    /// CA name → handle.
    cas: Arc<BTreeMap<String, CaHandle>>,
    /// Signer name → CA name; a signer not listed signs with `fallback`.
    signers: Arc<BTreeMap<String, String>>,
    /// Signer → tenant → CA name.
    tenants: Arc<BTreeMap<String, BTreeMap<String, String>>>,
    fallback: String,
}

/// A signer names a CA the set does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("signer {signer:?} signs with CA {ca:?}, which is not open")]
pub struct UnknownCa {
    pub signer: String,
    pub ca: String,
}

impl CaSet {
    /// One CA (named `default`) for every signer.
    pub fn single(handle: CaHandle) -> Self {
        CaSet {
            cas: Arc::new(BTreeMap::from([(
                crate::config::DEFAULT_CA_NAME.to_owned(),
                handle,
            )])),
            signers: Arc::default(),
            tenants: Arc::default(),
            fallback: crate::config::DEFAULT_CA_NAME.to_owned(),
        }
    }

    /// `cas` by name; `signers`: signer name → CA name, each of which `cas` must hold. A signer
    /// not in `signers` signs with the first CA of `cas` (there is one CA).
    pub fn new(
        cas: BTreeMap<String, CaHandle>,
        signers: BTreeMap<String, String>,
    ) -> Result<Self, UnknownCa> {
        if let Some((signer, ca)) = signers.iter().find(|(_, ca)| !cas.contains_key(*ca)) {
            return Err(UnknownCa {
                signer: signer.clone(),
                ca: ca.clone(),
            });
        }
        let fallback = match cas.keys().next() {
            Some(first) => first.clone(),
            None => {
                return Err(UnknownCa {
                    signer: signers.keys().next().cloned().unwrap_or_default(),
                    ca: String::new(),
                });
            }
        };
        Ok(CaSet {
            cas: Arc::new(cas),
            signers: Arc::new(signers),
            tenants: Arc::default(),
            fallback,
        })
    }

    /// With the CAs of signers' tenants: (signer, tenant) → CA name, each of which the set
    /// must hold.
    pub fn with_tenants(
        mut self,
        tenants: BTreeMap<(String, String), String>,
    ) -> Result<Self, UnknownCa> {
        if let Some(((signer, tenant), ca)) =
            tenants.iter().find(|(_, ca)| !self.cas.contains_key(*ca))
        {
            return Err(UnknownCa {
                signer: format!("{signer} (tenant {tenant})"),
                ca: ca.clone(),
            });
        }
        let mut by_signer: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for ((signer, tenant), ca) in tenants {
            by_signer.entry(signer).or_default().insert(tenant, ca);
        }
        self.tenants = Arc::new(by_signer);
        Ok(self)
    }

    /// The name of the CA that signs for `signer`'s `tenant` (`None`: the signer's own CA).
    pub fn ca_name_for(&self, signer: &str, tenant: Option<&str>) -> &str {
        tenant
            .and_then(|t| self.tenants.get(signer)?.get(t))
            .map_or_else(|| self.ca_name_of(signer), String::as_str)
    }

    /// The CA that signs for `signer`'s `tenant` (`None`: the signer's own CA).
    pub fn for_request(&self, signer: &str, tenant: Option<&str>) -> &CaHandle {
        &self.cas[self.ca_name_for(signer, tenant)]
    }

    /// The name of the CA `signer` signs with.
    pub fn ca_name_of(&self, signer: &str) -> &str {
        self.signers.get(signer).unwrap_or(&self.fallback)
    }

    /// The CA `signer` signs with.
    pub fn for_signer(&self, signer: &str) -> &CaHandle {
        &self.cas[self.ca_name_of(signer)]
    }

    /// Every CA, by name, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &CaHandle)> {
        self.cas.iter().map(|(name, ca)| (name.as_str(), ca))
    }
}

impl From<CaHandle> for CaSet {
    fn from(handle: CaHandle) -> Self {
        CaSet::single(handle)
    }
}

impl From<IssuingCa> for CaSet {
    fn from(ca: IssuingCa) -> Self {
        CaSet::single(ca.into())
    }
}

impl From<Arc<IssuingCa>> for CaSet {
    fn from(ca: Arc<IssuingCa>) -> Self {
        CaSet::single(ca.into())
    }
}

/// Where podca reads the time: the system clock in production, a settable one in tests.
pub type Clock = Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(OffsetDateTime::now_utc)
}

fn snapshot(ca: Arc<IssuingCa>, anchors: Vec<CaCertificate>, generation: u64) -> CaSnapshot {
    let anchors = if anchors.is_empty() {
        ca.roots().to_vec()
    } else {
        anchors
    };
    let anchors_pem = anchors.iter().map(CaCertificate::pem).collect::<String>();
    CaSnapshot {
        ca_generation: ca.generation(),
        ca,
        anchors,
        anchors_pem,
        generation,
    }
}
