//! The rotation of a CA held in a Kubernetes Secret, without Kubernetes: the pure state machine
//! that `podca_controller::secret_ca` drives. The controller reads the Secret (handing its
//! fields over as [`SecretData`]) and the history ConfigMap (as [`Checked`] records), calls
//! [`SecretRotation`], and writes what it returns: the [`History`] to persist, the CA and
//! anchors to [`Install`] into the [`crate::CaHandle`], the steps to count.
//!
//! A new CA in the Secret is taken over as a rotation with overlap, never as an abrupt switch,
//! using the rules of [`podca_signer::rotation`]:
//!
//! 1. **Prepared** as soon as it is seen (and validated): its anchors are published at once
//!    (the handle's anchors become old + new) while the *old* CA, whose key stays in memory,
//!    keeps signing.
//! 2. **Active** once its anchors have been published for the propagation window
//!    ([`Schedule::propagation`], default 15 min): it signs from then on, and the old CA is
//!    **Retired**: it signs nothing, but its anchor stays published until its last certificate
//!    can have expired (retired_at + the largest leaf lifetime, capped at its notAfter).
//! 3. **Dropped** afterwards: its anchor leaves the bundle.
//!
//! Same anchor: when every anchor of the new CA is already published (for example cert-manager
//! re-issued the intermediate under the same root), the new CA is recorded as prepared at the
//! time that anchor was first published, so it takes over at once when that was a propagation
//! window ago — relying parties already trust it, and no certificate can be signed by a CA whose
//! anchor was published less than the window earlier.
//!
//! The first CA ever seen (no history) is active at once: nobody can trust anything before it
//! is published, as with the first CA of the file store.
//!
//! After a restart during the propagation window the old CA's key is gone (it lived only in
//! the previous Secret contents). Then the new CA is installed with a **gated key**: the anchors
//! are published as recorded, but the key refuses to sign (a transient backend error: requests
//! stay pending and are retried) until the window recorded in the history has passed
//! ([`Install::gated_until`]). The same holds when the Secret changed while podca was not
//! running. So no certificate is ever signed by a CA whose anchor was published less than the
//! propagation window ago; the price is a delay of at most the window after such a restart.
//!
//! The history is sealed with the Secret's key and verified on every read ([`seal`]). A
//! history that does not verify or holds impossible values is never used: a running replica
//! keeps what it had, and a replica starting without a trusted history takes the Secret's CA
//! with a **hold** ([`SecretRotation::distrust_history`]): its anchors are published at once,
//! but it signs nothing for one propagation window, since podca cannot know whether relying
//! parties trust it yet. The hold is recorded in the seal, so a restart does not shorten it.
//! Before that, a replica starting beside a rejected, foreign or missing ConfigMap tries podca's
//! copy of its last history ([`start`]), so that only a forgery of both loses what the genuine
//! history knew.
//!
//! [`Schedule::propagation`]: podca_signer::rotation::Schedule::propagation

mod contents;
mod rules;
pub mod seal;
pub mod start;
mod state;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod seal_tests;
#[cfg(test)]
mod tests;

use podca_signer::CaCertificate;
use podca_signer::rotation::Generation;
use serde::{Deserialize, Serialize};

pub use contents::{SECRET_TYPE, SecretCaContents, SecretData, SecretError, SecretField};
pub use seal::{Opened, Rejection, SealError, Sealed};
pub use state::{
    GenerationGauge, Install, MetricValues, Observation, SecretRotation, Settings, Stepped,
};

/// One CA generation as the history keeps it: public certificates only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub generation: Generation,
    /// SHA-256 of the issuing certificate.
    pub fingerprint: String,
    pub subject: String,
    /// The issuing certificate and its intermediates (never the root), PEM.
    pub chain_pem: String,
    /// The trust anchors, PEM.
    pub anchors_pem: String,
}

/// The history of a Secret's CA generations, as podca persists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// `namespace/name` of the Secret this history belongs to.
    pub secret: String,
    pub generations: Vec<Record>,
}

/// A recorded generation whose anchors parsed (see [`Checked::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub record: Record,
    pub anchors: Vec<CaCertificate>,
}

impl Checked {
    /// Parses the record's anchors.
    pub fn new(record: Record) -> Result<Self, podca_signer::x509::CertError> {
        let anchors = CaCertificate::all_from_pem(&record.anchors_pem)?;
        Ok(Checked { record, anchors })
    }
}
