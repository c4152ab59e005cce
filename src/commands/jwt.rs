//! The JWT signing keys in `podca ca show`.

use podca_signer::FileStore;
use podca_signer::jwt::JwtKeyPhase;
use podca_signer::jwt::store::JwtStore;

/// Prints the data directory's JWT keys: kid, phase, algorithm, times.
pub fn show_keys(store: &FileStore) -> anyhow::Result<()> {
    let keys = JwtStore::new(store.clone()).load()?;
    let mut any = false;
    for info in keys.infos() {
        if !any {
            println!();
            println!("JWT signing keys ({}/jwt):", store.dir().display());
            any = true;
        }
        println!("  key {} — {} ({})", info.kid, info.phase, info.algorithm);
        println!("    published: {}", info.published_at);
        if let Some(t) = info.activated_at {
            println!("    activated: {t}");
        }
        if let Some(t) = info.retired_at {
            println!("    retired:   {t}");
        }
        if let Some(t) = info.not_after {
            let what = match info.phase {
                JwtKeyPhase::Retired => "published until",
                _ => "not after",
            };
            println!("    {what}: {t}");
        }
    }
    if !any {
        println!();
        println!("JWT signing keys: none yet (podca dev makes them on its first start)");
    }
    Ok(())
}
