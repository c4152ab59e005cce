//! `podca inspect` for a JWT-SVID: its header and claims, which key signed it, and whether it is
//! valid against a bundle (`--jwks`, or the data directory's JWT keys).

use std::path::{Path, PathBuf};

use anyhow::Context;
use podca_signer::FileStore;
use podca_signer::jwt::store::JwtStore;
use podca_signer::jwt::{Expectations, JwtBundle};
use time::OffsetDateTime;

/// Whether `text` looks like a JWS compact token rather than PEM.
pub fn looks_like_jwt(text: &str) -> bool {
    let token = text.trim();
    !token.is_empty()
        && token.split('.').count() == 3
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Decodes and checks the token in `file`.
pub fn inspect(
    file: &Path,
    text: &str,
    jwks: Option<&PathBuf>,
    audience: Option<&str>,
    dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    let token = text.trim();
    let decoded = podca_signer::jwt::decode(token)
        .map_err(|e| anyhow::anyhow!("{}: not a JWT-SVID: {e}", file.display()))?;
    println!(
        "header: {}",
        serde_json::to_string(&decoded.header).unwrap_or_default()
    );
    println!(
        "claims: {}",
        serde_json::to_string(&decoded.claims).unwrap_or_default()
    );
    let when = |t: i64| {
        OffsetDateTime::from_unix_timestamp(t)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| t.to_string())
    };
    println!("subject: {}", decoded.claims.sub);
    println!("audience: {}", decoded.claims.aud.join(", "));
    println!("expires: {}", when(decoded.claims.exp));
    let kid = decoded.header.kid.clone().unwrap_or_default();
    println!("key: {kid}");
    let (bundle, source) = match jwks {
        Some(path) => {
            let json =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let bundle = JwtBundle::from_json(&json)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            (Some(bundle), path.display().to_string())
        }
        None => {
            let dir = dir.unwrap_or_else(super::default_data_dir);
            let keys = JwtStore::new(FileStore::new(&dir)).load().ok();
            (
                keys.filter(|k| k.infos().next().is_some())
                    .map(|k| k.bundle(None)),
                format!("{}/jwt", dir.display()),
            )
        }
    };
    let Some(bundle) = bundle else {
        println!("valid: not checked (no --jwks and no JWT keys in {source})");
        return Ok(());
    };
    let audience = audience
        .map(str::to_owned)
        .or_else(|| decoded.claims.aud.first().cloned())
        .unwrap_or_default();
    let trust_domain = decoded
        .claims
        .sub
        .strip_prefix("spiffe://")
        .and_then(|rest| rest.split('/').next())
        .map(str::to_owned);
    match podca_signer::jwt::validate(
        token,
        &bundle,
        &Expectations {
            audience: &audience,
            trust_domain: trust_domain.as_deref(),
            max_audiences: usize::MAX,
        },
        OffsetDateTime::now_utc(),
    ) {
        Ok(_) => {
            println!("valid: yes, for audience {audience:?} against {source}");
            Ok(())
        }
        Err(e) => {
            println!("valid: NO against {source}: {e}");
            anyhow::bail!("{}: the JWT-SVID is not valid: {e}", file.display())
        }
    }
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
}
