//! What `podca ca show` and `podca ca rotate` say about a CA, in text: one generation with its
//! certificates, one certificate, the JWT signing keys, one rotation step. Shared by a CA data
//! directory and a Secret-held CA, so both read the same.

use std::fmt::Write;

use time::OffsetDateTime;

use x509_parser::prelude::{GeneralName, ParsedExtension, X509Certificate};

use crate::jwt::JwtKeyPhase;
use crate::jwt::store::StoredJwtKey;
use crate::rotation::{Generation, Phase, Schedule, Step};
use crate::{CaCertificate, SubjectKey};

/// An error and its causes in one line (`a: b: c`), for messages that must say why in full.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        line.push_str(": ");
        line.push_str(&e.to_string());
        cause = e.source();
    }
    line
}

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

/// `podca inspect`'s description of certificate `i` of a bundle (DER `der`): names, serial,
/// validity with the time left, key type, SANs, CA flag, fingerprints.
pub fn certificate_details(
    i: usize,
    cert: &X509Certificate<'_>,
    der: &[u8],
    now: OffsetDateTime,
) -> String {
    let mut out = String::new();
    let not_after = cert.validity().not_after.to_datetime();
    let left = not_after - now;
    let state = if left.is_negative() {
        "EXPIRED".to_string()
    } else if cert.validity().not_before.to_datetime() > now {
        "NOT YET VALID".to_string()
    } else {
        format!("{}h{}m left", left.whole_hours(), left.whole_minutes() % 60)
    };
    let _ = writeln!(out, "certificate {i}:");
    let _ = writeln!(out, "  subject:    {}", cert.subject());
    let _ = writeln!(out, "  issuer:     {}", cert.issuer());
    let _ = writeln!(
        out,
        "  serial:     {}",
        cert.raw_serial_as_string().replace(':', "")
    );
    let _ = writeln!(
        out,
        "  not before: {}",
        cert.validity().not_before.to_datetime()
    );
    let _ = writeln!(out, "  not after:  {not_after} ({state})");
    let key = SubjectKey::from_spki_der(cert.public_key().raw)
        .map(|k| k.key_type().to_string())
        .unwrap_or_else(|e| e.to_string());
    let _ = writeln!(out, "  key:        {key}");
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    let shown = match name {
                        GeneralName::URI(u) => format!("URI:{u}"),
                        GeneralName::DNSName(d) => format!("DNS:{d}"),
                        GeneralName::RFC822Name(e) => format!("email:{e}"),
                        GeneralName::IPAddress(ip) => format!("IP:{}", hex::encode(ip)),
                        other => format!("{other:?}"),
                    };
                    let _ = writeln!(out, "  SAN:        {shown}");
                }
            }
            ParsedExtension::BasicConstraints(bc) => {
                let _ = writeln!(out, "  CA:         {}", bc.ca);
            }
            _ => {}
        }
    }
    let _ = writeln!(out, "  sha256:     {}", crate::x509::sha256_hex(der));
    let _ = writeln!(
        out,
        "  spki sha256: {}",
        crate::x509::sha256_hex(cert.public_key().raw)
    );
    out
}

/// The chain check of `podca inspect`: every certificate signed by the next, the last by one of
/// `anchors`, or a line saying why it was not checked against any (`Err(why)`): a chain that
/// merely hangs together must not read as trusted. Returns the lines and whether it all
/// verifies.
pub fn chain(certs: &[CaCertificate], anchors: Result<&[CaCertificate], &str>) -> (String, bool) {
    let mut out = String::new();
    let mut ok = true;
    for (i, pair) in certs.windows(2).enumerate() {
        match pair[0].verify_signed_by(&pair[1]) {
            Ok(()) => {
                let _ = writeln!(
                    out,
                    "chain: certificate {i} is signed by certificate {}",
                    i + 1
                );
            }
            Err(e) => {
                ok = false;
                let _ = writeln!(out, "chain: BROKEN at certificate {i}: {e}");
            }
        }
    }
    if let Err(why) = anchors {
        let _ = writeln!(out, "chain: not checked against trust anchors ({why})");
    }
    if let (Ok(anchors), Some(last)) = (anchors, certs.last()) {
        match anchors
            .iter()
            .find(|a| *a == last || last.verify_signed_by(a).is_ok())
        {
            Some(a) => {
                let _ = writeln!(
                    out,
                    "chain: anchored in {} ({})",
                    a.subject(),
                    a.fingerprint()
                );
            }
            None => {
                ok = false;
                let _ = writeln!(
                    out,
                    "chain: NOT anchored in any of the {} trust anchors",
                    anchors.len()
                );
            }
        }
    }
    (out, ok)
}

/// Whether `text` looks like a JWS compact token rather than PEM.
pub fn looks_like_jwt(text: &str) -> bool {
    let token = text.trim();
    !token.is_empty()
        && token.split('.').count() == 3
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// `podca inspect`'s lines for a decoded JWT-SVID: header, claims, subject, audiences, expiry,
/// key id.
pub fn jwt(decoded: &crate::jwt::Decoded) -> String {
    let when = |t: i64| {
        OffsetDateTime::from_unix_timestamp(t)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| t.to_string())
    };
    format!(
        "header: {}\nclaims: {}\nsubject: {}\naudience: {}\nexpires: {}\nkey: {}\n",
        serde_json::to_string(&decoded.header).unwrap_or_default(),
        serde_json::to_string(&decoded.claims).unwrap_or_default(),
        decoded.claims.sub,
        decoded.claims.aud.join(", "),
        when(decoded.claims.exp),
        decoded.header.kid.clone().unwrap_or_default()
    )
}

/// Validates `token` against `bundle` for `audience` (default: its first audience) in its own
/// trust domain; returns the audience it was checked for.
pub fn jwt_validity(
    token: &str,
    decoded: &crate::jwt::Decoded,
    bundle: &crate::jwt::JwtBundle,
    audience: Option<&str>,
    now: OffsetDateTime,
) -> Result<String, crate::jwt::JwtError> {
    let audience = audience
        .map(str::to_owned)
        .or_else(|| decoded.claims.aud.first().cloned())
        .unwrap_or_default();
    let trust_domain = crate::names::trust_domain_of(&decoded.claims.sub);
    crate::jwt::validate(
        token,
        bundle,
        &crate::jwt::Expectations {
            audience: &audience,
            trust_domain: trust_domain.as_ref().map(|td| td.as_str()),
            max_audiences: usize::MAX,
        },
        now,
    )?;
    Ok(audience)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_three_base64url_parts_look_like_a_jwt() {
        assert!(looks_like_jwt("eyJh.eyJz.c2ln\n"));
        assert!(!looks_like_jwt("not a certificate"));
        assert!(!looks_like_jwt("-----BEGIN CERTIFICATE-----\nMIIB\n"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt(""));
    }

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
