//! Validity math for leaves, pure and independent of any clock (spec rule 16).
//!
//! * `notBefore` = now truncated to a whole second, minus [`BACKDATE`] (inside kube-apiserver's
//!   ±5 min window, rule 16.8, with room for a slow write), and never before the CA's notBefore.
//! * lifetime = requested (or the policy default), raised to [`MIN_LIFETIME`] and capped at
//!   `min(maxExpirationSeconds, policy max)`; `notAfter = notBefore + lifetime` (never
//!   `now + max`, pitfall 7.10), and never past the issuing CA's notAfter.
//! * `beginRefreshAt` = `notBefore + lifetime / 2`, clamped into
//!   `[notBefore + 10 min, notAfter − 10 min]`. Half the lifetime leaves a long margin for a
//!   control-plane outage (KEP: a 24 h certificate refreshed at 12 h tolerates 12 h).

use time::{Duration, OffsetDateTime};

use crate::ca::whole_seconds;

/// How far notBefore is moved into the past to absorb clock skew between hosts.
pub const BACKDATE: Duration = Duration::seconds(60);
/// The shortest leaf lifetime kube-apiserver accepts (rule 16.10).
pub const MIN_LIFETIME: Duration = Duration::seconds(3600);
/// beginRefreshAt must stay this far from both ends (rules 16.12 and 16.13).
pub const REFRESH_MARGIN: Duration = Duration::seconds(600);

/// The inputs of the validity computation.
#[derive(Debug, Clone, Copy)]
pub struct ValidityInput {
    pub now: OffsetDateTime,
    /// What the client asked for; `None` means the policy default.
    pub requested: Option<Duration>,
    pub policy_default: Duration,
    pub policy_max: Duration,
    /// `spec.maxExpirationSeconds` of a PodCertificateRequest (none on the gRPC path).
    pub max_expiration: Option<Duration>,
    pub ca_not_before: OffsetDateTime,
    pub ca_not_after: OffsetDateTime,
}

/// A leaf's validity window and refresh hint, all whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Validity {
    #[serde(with = "time::serde::rfc3339")]
    pub not_before: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub begin_refresh_at: OffsetDateTime,
}

impl Validity {
    pub fn lifetime(&self) -> Duration {
        self.not_after - self.not_before
    }
}

/// Why no valid window exists. Both are permanent for the request at hand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidityError {
    #[error(
        "the largest allowed lifetime is {max_seconds} s, below the 3600 s minimum \
         (maxExpirationSeconds or the policy maximum is too small)"
    )]
    MaximumBelowMinimum { max_seconds: i64 },
    #[error(
        "the issuing CA expires at {ca_not_after}, too soon for a certificate of at least one hour \
         (it would start at {not_before}); rotate the CA"
    )]
    CaExpiresTooSoon {
        ca_not_after: OffsetDateTime,
        not_before: OffsetDateTime,
    },
}

/// Computes the validity window of a leaf.
pub fn plan_validity(input: &ValidityInput) -> Result<Validity, ValidityError> {
    let ca_not_after = whole_seconds(input.ca_not_after);
    let not_before = (whole_seconds(input.now) - BACKDATE).max(whole_seconds(input.ca_not_before));
    let max = input
        .max_expiration
        .map_or(input.policy_max, |m| m.min(input.policy_max));
    if max < MIN_LIFETIME {
        return Err(ValidityError::MaximumBelowMinimum {
            max_seconds: max.whole_seconds(),
        });
    }
    let wanted = input
        .requested
        .unwrap_or(input.policy_default)
        .clamp(MIN_LIFETIME, max);
    let lifetime = Duration::seconds(wanted.whole_seconds()).min(ca_not_after - not_before);
    if lifetime < MIN_LIFETIME {
        return Err(ValidityError::CaExpiresTooSoon {
            ca_not_after,
            not_before,
        });
    }
    let not_after = not_before + lifetime;
    let half = Duration::seconds(lifetime.whole_seconds() / 2);
    let begin_refresh_at =
        (not_before + half).clamp(not_before + REFRESH_MARGIN, not_after - REFRESH_MARGIN);
    Ok(Validity {
        not_before,
        not_after,
        begin_refresh_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn input() -> ValidityInput {
        ValidityInput {
            now: datetime!(2026-11-29 12:00:00.750 UTC),
            requested: None,
            policy_default: Duration::hours(24),
            policy_max: Duration::days(7),
            max_expiration: Some(Duration::seconds(86400)),
            ca_not_before: datetime!(2026-01-01 0:00 UTC),
            ca_not_after: datetime!(2027-01-01 0:00 UTC),
        }
    }

    #[test]
    fn default_day_long_leaf() {
        let v = plan_validity(&input()).unwrap();
        assert_eq!(v.not_before, datetime!(2026-11-29 11:59:00 UTC));
        assert_eq!(v.lifetime(), Duration::hours(24));
        assert_eq!(v.begin_refresh_at, v.not_before + Duration::hours(12));
    }

    #[test]
    fn whole_seconds_everywhere() {
        let v = plan_validity(&input()).unwrap();
        for t in [v.not_before, v.not_after, v.begin_refresh_at] {
            assert_eq!(t.nanosecond(), 0, "{t} has a fraction");
        }
    }

    #[test]
    fn lifetime_exactly_one_hour_has_refresh_in_bounds() {
        let v = plan_validity(&ValidityInput {
            max_expiration: Some(Duration::seconds(3600)),
            ..input()
        })
        .unwrap();
        assert_eq!(v.lifetime(), Duration::seconds(3600));
        assert!(v.begin_refresh_at >= v.not_before + REFRESH_MARGIN);
        assert!(v.begin_refresh_at <= v.not_after - REFRESH_MARGIN);
        assert_eq!(v.begin_refresh_at, v.not_before + Duration::minutes(30));
    }

    #[test]
    fn max_expiration_below_policy_default_wins() {
        let v = plan_validity(&ValidityInput {
            max_expiration: Some(Duration::seconds(7200)),
            ..input()
        })
        .unwrap();
        assert_eq!(v.lifetime(), Duration::seconds(7200));
    }

    #[test]
    fn policy_max_caps_a_larger_max_expiration() {
        let v = plan_validity(&ValidityInput {
            max_expiration: Some(Duration::days(91)),
            requested: Some(Duration::days(30)),
            ..input()
        })
        .unwrap();
        assert_eq!(v.lifetime(), Duration::days(7));
    }

    #[test]
    fn short_request_is_raised_to_one_hour() {
        let v = plan_validity(&ValidityInput {
            requested: Some(Duration::minutes(5)),
            ..input()
        })
        .unwrap();
        assert_eq!(v.lifetime(), MIN_LIFETIME);
    }

    #[test]
    fn maximum_below_an_hour_is_an_error() {
        let e = plan_validity(&ValidityInput {
            max_expiration: Some(Duration::seconds(3599)),
            ..input()
        })
        .unwrap_err();
        assert_eq!(e, ValidityError::MaximumBelowMinimum { max_seconds: 3599 });
    }

    #[test]
    fn leaf_is_cut_at_ca_not_after() {
        let now = input().now;
        let v = plan_validity(&ValidityInput {
            ca_not_after: now + Duration::hours(5),
            ..input()
        })
        .unwrap();
        assert_eq!(v.not_after, whole_seconds(now + Duration::hours(5)));
        assert!(v.lifetime() >= MIN_LIFETIME);
    }

    #[test]
    fn ca_with_less_than_an_hour_left_fails() {
        let now = input().now;
        // notBefore is backdated 60 s, so 59 minutes from now still fits a one-hour leaf;
        // 58 minutes does not.
        let e = plan_validity(&ValidityInput {
            ca_not_after: now + Duration::minutes(58),
            ..input()
        })
        .unwrap_err();
        assert!(matches!(e, ValidityError::CaExpiresTooSoon { .. }), "{e}");
    }

    #[test]
    fn ca_with_exactly_an_hour_after_not_before_still_issues() {
        let now = input().now;
        let nb = whole_seconds(now) - BACKDATE;
        let v = plan_validity(&ValidityInput {
            ca_not_after: nb + MIN_LIFETIME,
            ..input()
        })
        .unwrap();
        assert_eq!(v.lifetime(), MIN_LIFETIME);
    }

    #[test]
    fn not_before_never_precedes_a_fresh_ca() {
        let now = input().now;
        let v = plan_validity(&ValidityInput {
            ca_not_before: now,
            ..input()
        })
        .unwrap();
        assert_eq!(v.not_before, whole_seconds(now));
        // Still inside kube-apiserver's ±5 minute window.
        assert!((v.not_before - now).abs() < Duration::minutes(5));
    }

    #[test]
    fn refresh_bounds_hold_for_every_lifetime_between_one_hour_and_a_day() {
        for secs in (3600..=86400).step_by(7) {
            let v = plan_validity(&ValidityInput {
                requested: Some(Duration::seconds(secs)),
                ..input()
            })
            .unwrap();
            assert!(
                v.begin_refresh_at - v.not_before >= REFRESH_MARGIN,
                "{secs}"
            );
            assert!(v.not_after - v.begin_refresh_at >= REFRESH_MARGIN, "{secs}");
            assert_eq!(v.lifetime(), Duration::seconds(secs));
        }
    }
}
