//! `podca federation status`: a foreign trust domain's state, from the last good bundle podca
//! keeps for it (`last_good_file`, or `<data dir>/federation/<td>.json` for `podca dev`). The
//! file is rewritten on every accepted fetch ([`crate::federation_fetch`]), so its time is the
//! last refresh.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use podca_authority::bundle_endpoint::{FederationConfig, FederationProfile};
use podca_signer::spiffe_bundle::{BundleError, SpiffeBundle};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Why a kept bundle cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeptError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the kept bundle {path}: {source}")]
    Parse { path: String, source: BundleError },
}

/// The report of every entry, and how many are not healthy ([`report`]).
pub fn status(
    entries: &[FederationConfig],
    data_dir: &Path,
    now: OffsetDateTime,
) -> Result<(String, usize), KeptError> {
    let mut text = String::new();
    let mut unhealthy = 0;
    for entry in entries {
        let path = kept_at(entry, data_dir);
        let (one, healthy) = report(entry, &path, read_kept(&path)?.as_ref(), now);
        text.push_str(&one);
        unhealthy += usize::from(!healthy);
    }
    Ok((text, unhealthy))
}

/// Where `entry`'s last good bundle is kept (`data_dir`: `podca dev`'s).
pub fn kept_at(entry: &FederationConfig, data_dir: &Path) -> PathBuf {
    entry.last_good_file.clone().unwrap_or_else(|| {
        crate::federation_fetch::last_good_path(&data_dir.join("federation"), &entry.trust_domain)
    })
}

/// The kept bundle and when it was written; `None` if there is none yet.
pub fn read_kept(path: &Path) -> Result<Option<(SpiffeBundle, OffsetDateTime)>, KeptError> {
    let json = match std::fs::read(path) {
        Ok(json) => json,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(KeptError::Read {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let written = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let bundle = SpiffeBundle::parse(&json).map_err(|source| KeptError::Parse {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Some((bundle, OffsetDateTime::from(written))))
}

/// One trust domain's report, and whether it is healthy: fetched within twice its
/// `max_refresh_seconds` and no X.509 authority expired.
pub fn report(
    entry: &FederationConfig,
    path: &Path,
    kept: Option<&(SpiffeBundle, OffsetDateTime)>,
    now: OffsetDateTime,
) -> (String, bool) {
    let source = match &entry.profile {
        FederationProfile::HttpsSpiffe { endpoint_spiffe_id } => {
            format!("https_spiffe, endpoint {endpoint_spiffe_id}")
        }
        FederationProfile::HttpsWeb { ca_file: Some(f) } => {
            format!("https_web, roots {}", f.display())
        }
        FederationProfile::HttpsWeb { ca_file: None } => "https_web, system roots".to_owned(),
    };
    let head = |state: &str| {
        format!(
            "{}: {state}\n  source        {} ({source})\n  kept at       {}\n",
            entry.trust_domain,
            entry.bundle_endpoint_url,
            path.display()
        )
    };
    let Some((bundle, written)) = kept else {
        return (head("never fetched (no last good bundle kept yet)"), false);
    };
    let age = (now - *written).whole_seconds().max(0);
    let limit = i64::try_from(entry.max_refresh_seconds.saturating_mul(2)).unwrap_or(i64::MAX);
    let first_expiry = bundle.x509_authorities.iter().map(|c| c.not_after()).min();
    let expired = first_expiry.is_some_and(|t| t <= now);
    let state = if expired {
        "expired".to_owned()
    } else if age > limit {
        format!("stale (not refreshed for {age} s, over twice max_refresh_seconds)")
    } else {
        "fresh".to_owned()
    };
    let stamp = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_else(|_| t.to_string());
    let mut text = head(&state);
    text.push_str(&format!(
        "  sequence      {}\n  anchors       {} X.509, {} JWT\n  last refresh  {} ({age} s ago)\n  first expiry  {}\n",
        bundle
            .sequence
            .map_or_else(|| "none".to_owned(), |s| s.to_string()),
        bundle.x509_authorities.len(),
        bundle.jwt_authorities.len(),
        stamp(*written),
        first_expiry.map_or_else(|| "no X.509 authority".to_owned(), stamp),
    ));
    (text, state == "fresh")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use podca_signer::IssuingCa;
    use podca_signer::backend::{CaAlgorithm, MemoryKey};

    use super::*;

    fn entry() -> FederationConfig {
        FederationConfig {
            trust_domain: "b.test".into(),
            bundle_endpoint_url: "https://b.test/".into(),
            profile: FederationProfile::HttpsWeb { ca_file: None },
            initial_bundle: None,
            last_good_file: None,
            min_refresh_seconds: 30,
            max_refresh_seconds: 600,
        }
    }

    fn bundle(days: i64, now: OffsetDateTime) -> SpiffeBundle {
        let key = Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap());
        let ca = IssuingCa::self_signed_root(
            key,
            "b root",
            now - time::Duration::days(1),
            time::Duration::days(days),
        )
        .unwrap();
        SpiffeBundle {
            x509_authorities: ca.roots().to_vec(),
            jwt_authorities: vec![],
            sequence: Some(7),
            refresh_hint: Some(60),
        }
    }

    #[test]
    fn fresh_stale_expired_and_never_fetched_are_told_apart() {
        let now = OffsetDateTime::now_utc();
        let path = Path::new("/k/b.test.json");
        let (text, ok) = report(&entry(), path, None, now);
        assert!(!ok);
        assert!(text.starts_with("b.test: never fetched"), "{text}");
        assert!(
            text.contains("https://b.test/ (https_web, system roots)"),
            "{text}"
        );

        let kept = (bundle(10, now), now - time::Duration::seconds(30));
        let (text, ok) = report(&entry(), path, Some(&kept), now);
        assert!(ok, "{text}");
        assert!(text.starts_with("b.test: fresh\n"), "{text}");
        assert!(text.contains("  sequence      7\n"), "{text}");
        assert!(text.contains("  anchors       1 X.509, 0 JWT\n"), "{text}");
        assert!(text.contains("(30 s ago)"), "{text}");

        let kept = (bundle(10, now), now - time::Duration::seconds(1201));
        let (text, ok) = report(&entry(), path, Some(&kept), now);
        assert!(!ok);
        assert!(
            text.starts_with("b.test: stale (not refreshed for 1201 s"),
            "{text}"
        );

        let kept = (bundle(1, now), now);
        let (text, ok) = report(&entry(), path, Some(&kept), now + time::Duration::hours(1));
        assert!(!ok);
        assert!(text.starts_with("b.test: expired\n"), "{text}");
    }
}
