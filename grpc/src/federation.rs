//! Federated trust domains' bundles, in force right now: one shared [`FederatedBundles`] that
//! the federation fetcher writes and every reader subscribes to (the Workload API's
//! `federated_bundles`, `ValidateJWTSVID`, Envoy SDS validation contexts, the
//! ClusterTrustBundle publisher). A reader gets, per foreign trust domain, its X.509
//! authorities and its JWT keys ([`ForeignBundle`]), and is woken on every change.
//!
//! What a signer's workloads receive is decided by its allow-list (`federates_with`):
//! [`FederatedBundles::for_signer`]. podca's own trust domains can never be set here: a foreign
//! bundle for one of them is refused ([`FederationRefusal::OwnTrustDomain`]), so no foreign
//! endpoint can change whom podca's own workloads trust.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use podca_signer::jwt::JwtBundle;
use podca_signer::spiffe_bundle::SpiffeBundle;
use time::OffsetDateTime;
use tokio::sync::watch;

/// Foreign trust domain (no `spiffe://`) → its bundle in force.
pub type BundleMap = BTreeMap<String, Arc<ForeignBundle>>;

/// One foreign trust domain's bundle, as last accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignBundle {
    /// The trust domain, without `spiffe://`.
    pub trust_domain: String,
    /// The document's authorities, sequence and refresh hint.
    pub bundle: SpiffeBundle,
    /// When it was accepted (fetched, or read from the configured initial bundle or the
    /// last-good file).
    pub accepted_at: OffsetDateTime,
    /// Read from the configured `initial_bundle` at start, not fetched nor kept: it bootstraps
    /// the first fetch, but may be older than what was published before a restart.
    pub from_initial_bundle: bool,
}

impl ForeignBundle {
    /// The X.509 authorities as concatenated DER (the Workload API's bundle bytes).
    pub fn x509_der(&self) -> Vec<u8> {
        self.bundle.x509_der()
    }

    /// The JWT authorities as a JWKS (`FetchJWTBundles`, `ValidateJWTSVID`).
    pub fn jwt_bundle(&self) -> JwtBundle {
        self.bundle.jwt_bundle()
    }

    /// The Workload API's key for it: `spiffe://<trust domain>`.
    pub fn spiffe_key(&self) -> String {
        format!("spiffe://{}", self.trust_domain)
    }
}

/// Why a bundle was not put in force; the bundle in force (if any) stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FederationRefusal {
    #[error("{0} is one of podca's own trust domains: a foreign bundle cannot replace it")]
    OwnTrustDomain(String),
    #[error(
        "the bundle of {trust_domain} has sequence {offered}, lower than the {in_force} in force"
    )]
    LoweredSequence {
        trust_domain: String,
        offered: u64,
        in_force: u64,
    },
}

/// The federated bundles in force, shared by the fetcher (writer) and every reader. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct FederatedBundles {
    tx: Arc<watch::Sender<Arc<BundleMap>>>,
    own: Arc<BTreeSet<String>>,
}

impl FederatedBundles {
    /// No foreign bundle yet; `own`: podca's own trust domains, which stay out of it.
    pub fn new(own: impl IntoIterator<Item = String>) -> Self {
        let (tx, _) = watch::channel(Arc::new(BundleMap::new()));
        FederatedBundles {
            tx: Arc::new(tx),
            own: Arc::new(own.into_iter().collect()),
        }
    }

    /// Every foreign bundle in force.
    pub fn current(&self) -> Arc<BundleMap> {
        Arc::clone(&self.tx.borrow())
    }

    /// A receiver woken on every change of any foreign bundle.
    pub fn subscribe(&self) -> watch::Receiver<Arc<BundleMap>> {
        self.tx.subscribe()
    }

    /// The bundles `federates_with` allows (a signer's allow-list), by trust domain.
    pub fn for_signer(map: &BundleMap, federates_with: &[String]) -> BundleMap {
        map.iter()
            .filter(|(td, _)| federates_with.iter().any(|allowed| allowed == *td))
            .map(|(td, b)| (td.clone(), Arc::clone(b)))
            .collect()
    }

    /// Puts `bundle` in force for its trust domain and wakes the readers (only if it changed).
    /// Refused: one of podca's own trust domains, or a sequence lower than the one in force.
    pub fn accept(&self, bundle: ForeignBundle) -> Result<(), FederationRefusal> {
        let td = bundle.trust_domain.clone();
        if self.own.contains(&td) {
            return Err(FederationRefusal::OwnTrustDomain(td));
        }
        let mut refusal = None;
        self.tx.send_if_modified(|map| {
            if let Some(in_force) = map.get(&td) {
                if let (Some(offered), Some(current)) =
                    (bundle.bundle.sequence, in_force.bundle.sequence)
                    && offered < current
                {
                    refusal = Some(FederationRefusal::LoweredSequence {
                        trust_domain: td.clone(),
                        offered,
                        in_force: current,
                    });
                    return false;
                }
                if in_force.bundle == bundle.bundle {
                    return false;
                }
            }
            let mut next = BundleMap::clone(map);
            next.insert(td.clone(), Arc::new(bundle));
            *map = Arc::new(next);
            true
        });
        refusal.map_or(Ok(()), Err)
    }

    /// Whether `trust_domain` is one of podca's own.
    pub fn is_own(&self, trust_domain: &str) -> bool {
        self.own.contains(trust_domain)
    }
}

#[cfg(test)]
mod tests {
    use podca_signer::jwt::Jwk;

    use super::*;

    fn bundle(td: &str, sequence: Option<u64>, kid: &str) -> ForeignBundle {
        ForeignBundle {
            trust_domain: td.to_owned(),
            bundle: SpiffeBundle {
                x509_authorities: vec![],
                jwt_authorities: vec![Jwk {
                    kty: "EC".into(),
                    kid: kid.into(),
                    key_use: Some("jwt-svid".into()),
                    alg: None,
                    crv: Some("P-256".into()),
                    x: Some("x".into()),
                    y: Some("y".into()),
                    n: None,
                    e: None,
                }],
                sequence,
                refresh_hint: None,
            },
            accepted_at: OffsetDateTime::UNIX_EPOCH,
            from_initial_bundle: false,
        }
    }

    #[test]
    fn own_trust_domains_and_lowered_sequences_are_refused() {
        let bundles = FederatedBundles::new(["home.test".to_owned()]);
        assert_eq!(
            bundles.accept(bundle("home.test", Some(1), "a")),
            Err(FederationRefusal::OwnTrustDomain("home.test".into()))
        );
        assert!(bundles.current().is_empty());
        bundles
            .accept(bundle("away.test", Some(5), "a"))
            .expect("a first bundle");
        assert_eq!(
            bundles.accept(bundle("away.test", Some(4), "b")),
            Err(FederationRefusal::LoweredSequence {
                trust_domain: "away.test".into(),
                offered: 4,
                in_force: 5
            })
        );
        let in_force = &bundles.current()["away.test"];
        assert_eq!(in_force.bundle.jwt_authorities[0].kid, "a");
        bundles
            .accept(bundle("away.test", Some(6), "b"))
            .expect("a newer bundle");
        assert_eq!(bundles.current()["away.test"].bundle.sequence, Some(6));
    }

    #[test]
    fn readers_wake_on_change_only() {
        let bundles = FederatedBundles::new([]);
        let mut rx = bundles.subscribe();
        rx.borrow_and_update();
        bundles.accept(bundle("a.test", Some(1), "a")).expect("ok");
        assert!(rx.has_changed().expect("open"));
        rx.borrow_and_update();
        bundles.accept(bundle("a.test", Some(1), "a")).expect("ok");
        assert!(!rx.has_changed().expect("open"));
    }

    #[test]
    fn a_signer_sees_only_the_trust_domains_it_federates_with() {
        let bundles = FederatedBundles::new([]);
        bundles.accept(bundle("a.test", None, "a")).expect("ok");
        bundles.accept(bundle("b.test", None, "b")).expect("ok");
        let seen = FederatedBundles::for_signer(&bundles.current(), &["b.test".to_owned()]);
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["b.test"]);
        assert!(FederatedBundles::for_signer(&bundles.current(), &[]).is_empty());
    }
}
