//! Intermediate mode: when to re-issue the in-memory intermediate an HSM key signed.

/// When an intermediate valid from `not_before` to `not_after` should be replaced: at 2/3 of
/// its lifetime (so the remaining third covers an HSM outage and leaves issued just before).
pub fn intermediate_renewal_time(
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> time::OffsetDateTime {
    let life = not_after - not_before;
    if life <= time::Duration::ZERO {
        return not_before;
    }
    not_before + life * 2 / 3
}

/// Whether `intermediate` is due for re-issuance at `now` (or has expired).
pub fn intermediate_needs_renewal(
    intermediate: &crate::CaCertificate,
    now: time::OffsetDateTime,
) -> bool {
    now >= intermediate_renewal_time(intermediate.not_before(), intermediate.not_after())
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn renewal_at_two_thirds() {
        let nb = datetime!(2030-01-01 00:00 UTC);
        let na = datetime!(2030-01-01 03:00 UTC);
        assert_eq!(
            intermediate_renewal_time(nb, na),
            datetime!(2030-01-01 02:00 UTC)
        );
        // Degenerate certificates are due at once.
        assert_eq!(intermediate_renewal_time(na, nb), na);
        assert_eq!(intermediate_renewal_time(nb, nb), nb);
    }
}
