//! What `podca ca show` and `podca ca rotate` say about a CA, in text: one generation with its
//! certificates, one certificate, the JWT signing keys, one rotation step. Shared by a CA data
//! directory and a Secret-held CA, so both read the same.

use std::fmt::Write;

use time::OffsetDateTime;

use crate::CaCertificate;
use crate::jwt::JwtKeyPhase;
use crate::jwt::store::StoredJwtKey;
use crate::rotation::{Generation, Phase, Schedule, Step};

/// A blank line, then the generation's phase and times, its issuing certificate and roots.
pub fn generation(
    g: &Generation,
    issuing: Option<&CaCertificate>,
    roots: &[CaCertificate],
    now: OffsetDateTime,
) -> String {
    let mut out = format!(
        "\ngeneration {} — {}\n  prepared:   {}\n",
        g.id, g.phase, g.prepared_at
    );
    if let Some(t) = g.activated_at {
        let _ = writeln!(out, "  activated:  {t}");
    }
    if let Some(t) = g.retired_at {
        let _ = writeln!(out, "  retired:    {t}");
    }
    if g.phase == Phase::Retired {
        let _ = writeln!(out, "  anchor published until: {}", g.anchor_needed_until());
    }
    if let Some(c) = issuing {
        out.push_str(&certificate("issuing", c, now));
    }
    for r in roots {
        out.push_str(&certificate("root", r, now));
    }
    out
}

/// One certificate: subject, issuer, validity with the days left, fingerprint.
pub fn certificate(role: &str, c: &CaCertificate, now: OffsetDateTime) -> String {
    let left = c.not_after() - now;
    let state = if left.is_negative() {
        "EXPIRED".to_string()
    } else {
        format!("{} days left", left.whole_days())
    };
    format!(
        "  {role}:\n    subject:    {}\n    issuer:     {}\n    not before: {}\n    not after:  \
         {} ({state})\n    sha256:     {}\n",
        c.subject(),
        c.issuer(),
        c.not_before(),
        c.not_after(),
        c.fingerprint()
    )
}

/// A blank line, then `keys`, kept in `place`: kid, phase, algorithm, where each is held, times.
pub fn jwt_keys(place: &str, keys: &[StoredJwtKey]) -> String {
    let mut out = format!("\nJWT signing keys ({place}):\n");
    for key in keys {
        let info = &key.info;
        let _ = writeln!(
            out,
            "  key {} — {} ({})",
            info.kid, info.phase, info.algorithm
        );
        let _ = writeln!(out, "    held at:   {}", key.location);
        let _ = writeln!(out, "    published: {}", info.published_at);
        if let Some(t) = info.activated_at {
            let _ = writeln!(out, "    activated: {t}");
        }
        if let Some(t) = info.retired_at {
            let _ = writeln!(out, "    retired:   {t}");
        }
        if let Some(t) = info.not_after {
            let what = match info.phase {
                JwtKeyPhase::Retired => "published until",
                _ => "not after",
            };
            let _ = writeln!(out, "    {what}: {t}");
        }
    }
    out
}

/// What a rotation step did, in one line.
pub fn step(step: Step, schedule: &Schedule, now: OffsetDateTime) -> String {
    match step {
        Step::Prepare => format!(
            "prepared the next CA: its root is published now and it signs from {} on",
            now + schedule.propagation()
        ),
        Step::Activate(id) => format!("generation {id} is now the signing CA"),
        Step::Retire(id) => format!(
            "generation {id} retired: it signs nothing, its root stays published while its \
             certificates live"
        ),
        Step::Drop(id) => {
            format!("generation {id} dropped: its root left the bundle and its keys were deleted")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_say_what_they_did() {
        let schedule = Schedule::default();
        let now = OffsetDateTime::UNIX_EPOCH;
        assert_eq!(
            step(Step::Activate(3), &schedule, now),
            "generation 3 is now the signing CA"
        );
        assert_eq!(
            step(Step::Retire(2), &schedule, now),
            "generation 2 retired: it signs nothing, its root stays published while its \
             certificates live"
        );
        assert!(
            step(Step::Prepare, &schedule, now)
                .ends_with(&format!("signs from {} on", now + schedule.propagation()))
        );
    }
}
