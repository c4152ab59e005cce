//! Intermediate mode (`[ca] pkcs11_mode = "intermediate"`): the HSM-held CA key signs a
//! short-lived intermediate whose key lives only in memory, and that intermediate signs leaves,
//! so issuance costs no HSM operation. Everything about it is here: how long an intermediate
//! lives, how one is made, and when the rotation driver must replace it.
//!
//! The two-thirds point itself is `podca_signer::backend::pkcs11::intermediate_renewal_time`.

use std::sync::Arc;

use podca_signer::backend::pkcs11::intermediate_needs_renewal;
use podca_signer::{IssuingCa, MemoryKey};
use time::{Duration, OffsetDateTime};

use crate::ca::OpenError;
use crate::config::Pkcs11Mode;

/// The common name of every in-memory intermediate.
const COMMON_NAME: &str = "podca in-memory intermediate";

/// Intermediate mode as configured: how long each in-memory intermediate lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intermediate {
    lifetime: Duration,
}

impl Intermediate {
    /// Intermediate mode for `mode` (`None`: the HSM signs every leaf). Without a configured
    /// lifetime: three times `max_leaf_lifetime`, at least one day. A lifetime shorter than
    /// three times `max_leaf_lifetime` is refused: the intermediate is re-issued at two thirds
    /// of its life, so the last third must still cover the longest leaf.
    pub fn configured(
        mode: &Pkcs11Mode,
        max_leaf_lifetime: Duration,
    ) -> Result<Option<Self>, OpenError> {
        let lifetime = match mode {
            Pkcs11Mode::HsmSignsLeaves => return Ok(None),
            Pkcs11Mode::Intermediate { lifetime_seconds } => lifetime_seconds
                .map(|s| Duration::seconds(i64::from(s)))
                .unwrap_or_else(|| Ord::max(max_leaf_lifetime * 3i32, Duration::days(1))),
        };
        if lifetime < max_leaf_lifetime * 3i32 {
            return Err(OpenError::IntermediateTooShort {
                lifetime_seconds: lifetime.whole_seconds(),
                max_leaf_seconds: max_leaf_lifetime.whole_seconds(),
            });
        }
        Ok(Some(Intermediate { lifetime }))
    }

    /// How long each in-memory intermediate lives.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// A fresh in-memory key and an intermediate for it, signed by the HSM-held CA at `now`
    /// (backdated a minute for clock skew; never outliving `hsm_ca`).
    pub fn issue(&self, hsm_ca: &IssuingCa, now: OffsetDateTime) -> Result<IssuingCa, OpenError> {
        let key =
            MemoryKey::generate(hsm_ca.key().algorithm()).map_err(OpenError::IntermediateKey)?;
        hsm_ca
            .sign_intermediate(
                Arc::new(key),
                COMMON_NAME,
                now - Duration::minutes(1),
                self.lifetime,
            )
            .map_err(OpenError::IntermediateSignature)
    }

    /// The renewal rule: whether `active` (the intermediate [`Intermediate::issue`] made) is
    /// due for re-issuance at `now` — at two thirds of its life, or once it has expired. The
    /// rotation driver then reopens the CA, which issues a new one.
    pub fn needs_renewal(&self, active: &IssuingCa, now: OffsetDateTime) -> bool {
        intermediate_needs_renewal(active.certificate(), now)
    }
}

#[cfg(test)]
mod tests {
    use podca_signer::CaAlgorithm;
    use time::macros::datetime;

    use super::*;

    const NOW: OffsetDateTime = datetime!(2030-01-01 00:00 UTC);

    fn hsm_stand_in() -> IssuingCa {
        let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("generating a P-256 key");
        IssuingCa::self_signed_root(Arc::new(key), "test root", NOW, Duration::days(30))
            .expect("signing the test root")
    }

    fn intermediate_mode(lifetime_seconds: u32) -> Pkcs11Mode {
        Pkcs11Mode::Intermediate {
            lifetime_seconds: Some(lifetime_seconds),
        }
    }

    #[test]
    fn hsm_signs_leaves_is_not_intermediate_mode() {
        let mode = Intermediate::configured(&Pkcs11Mode::HsmSignsLeaves, Duration::days(30));
        assert_eq!(mode.ok(), Some(None));
    }

    #[test]
    fn default_lifetime_is_three_leaf_lifetimes_at_least_a_day() {
        let default = Pkcs11Mode::Intermediate {
            lifetime_seconds: None,
        };
        let lifetime = |max_leaf| {
            Intermediate::configured(&default, max_leaf)
                .ok()
                .flatten()
                .map(|i| i.lifetime())
        };
        assert_eq!(lifetime(Duration::days(1)), Some(Duration::days(3)));
        assert_eq!(lifetime(Duration::hours(1)), Some(Duration::days(1)));
    }

    #[test]
    fn configured_lifetime_must_cover_three_leaf_lifetimes() {
        let max_leaf = Duration::hours(1);
        let exact = Intermediate::configured(&intermediate_mode(3 * 3600), max_leaf);
        assert_eq!(
            exact.ok().flatten().map(|i| i.lifetime()),
            Some(Duration::hours(3))
        );
        match Intermediate::configured(&intermediate_mode(3 * 3600 - 1), max_leaf) {
            Err(OpenError::IntermediateTooShort {
                lifetime_seconds,
                max_leaf_seconds,
            }) => {
                assert_eq!((lifetime_seconds, max_leaf_seconds), (10_799, 3600));
            }
            other => panic!("expected IntermediateTooShort, got {other:?}"),
        }
    }

    #[test]
    fn issued_intermediate_is_signed_by_the_hsm_ca_for_its_lifetime() {
        let hsm_ca = hsm_stand_in();
        let mode = Intermediate {
            lifetime: Duration::hours(3),
        };
        let active = mode.issue(&hsm_ca, NOW).expect("issuing the intermediate");
        let cert = active.certificate();
        assert_eq!(cert.not_after() - cert.not_before(), Duration::hours(3));
        assert!(cert.not_before() < NOW, "backdated for clock skew");
        assert_eq!(cert.issuer(), hsm_ca.certificate().subject());
        assert!(cert.subject().contains(COMMON_NAME), "{}", cert.subject());
        assert_ne!(
            cert.spki_der(),
            hsm_ca.certificate().spki_der(),
            "a fresh key"
        );
        assert_eq!(active.roots(), hsm_ca.roots());
    }

    #[test]
    fn renewal_is_due_at_two_thirds_of_life_and_after_expiry() {
        let mode = Intermediate {
            lifetime: Duration::hours(3),
        };
        let active = mode
            .issue(&hsm_stand_in(), NOW)
            .expect("issuing the intermediate");
        let not_before = active.certificate().not_before();
        let renewal_point = not_before + Duration::hours(2);
        let expired = active.certificate().not_after() + Duration::SECOND;
        assert!(!mode.needs_renewal(&active, not_before), "just issued");
        assert!(
            !mode.needs_renewal(&active, renewal_point - Duration::SECOND),
            "a second before two thirds"
        );
        assert!(mode.needs_renewal(&active, renewal_point), "at two thirds");
        assert!(
            mode.needs_renewal(&active, renewal_point + Duration::minutes(30)),
            "past two thirds"
        );
        assert!(mode.needs_renewal(&active, expired), "expired");
    }
}
