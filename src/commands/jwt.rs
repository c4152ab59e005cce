//! The JWT signing keys in `podca ca show`.

use podca_signer::FileStore;
use podca_signer::jwt::JwtKeyPhase;
use podca_signer::jwt::store::{JwtStore, StoredJwtKey};

/// Prints the data directory's JWT keys: kid, phase, algorithm, where the key is held (a file
/// or a PKCS#11 URI), times. Reads `jwt/state.json` only: no key is opened, no PIN needed.
pub fn show_keys(store: &FileStore) -> anyhow::Result<()> {
    let (_, keys) = JwtStore::new(store.clone()).stored()?;
    if keys.is_empty() {
        println!();
        println!("JWT signing keys: none yet (podca dev and podca serve make them on start)");
        return Ok(());
    }
    print_keys(&format!("{}/jwt", store.dir().display()), &keys);
    Ok(())
}

/// Prints `keys`, kept in `place`: kid, phase, algorithm, where each is held, times.
pub fn print_keys(place: &str, keys: &[StoredJwtKey]) {
    println!();
    println!("JWT signing keys ({place}):");
    for key in keys {
        let info = &key.info;
        println!("  key {} — {} ({})", info.kid, info.phase, info.algorithm);
        println!("    held at:   {}", key.location);
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
}
