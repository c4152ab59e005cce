//! `podca inspect` for a JWT-SVID: its header and claims, which key signed it, and whether it is
//! valid against a bundle (`--jwks`, or the data directory's JWT keys).

use std::path::{Path, PathBuf};

use anyhow::Context;
use podca_signer::FileStore;
use podca_signer::jwt::JwtBundle;
use podca_signer::jwt::store::JwtStore;
use podca_signer::report;
use time::OffsetDateTime;

pub use podca_signer::report::looks_like_jwt;

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
    print!("{}", report::jwt(&decoded));
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
    match report::jwt_validity(
        token,
        &decoded,
        &bundle,
        audience,
        OffsetDateTime::now_utc(),
    ) {
        Ok(audience) => {
            println!("valid: yes, for audience {audience:?} against {source}");
            Ok(())
        }
        Err(e) => {
            println!("valid: NO against {source}: {e}");
            anyhow::bail!("{}: the JWT-SVID is not valid: {e}", file.display())
        }
    }
}
