//! The JWT signing keys in `podca ca show`.

use podca_signer::FileStore;
use podca_signer::jwt::store::JwtStore;

/// Prints the data directory's JWT keys: kid, phase, algorithm, where the key is held (a file
/// or a PKCS#11 URI), times. Reads `jwt/state.json` only: no key is opened, no PIN needed.
pub fn show_keys(store: &FileStore) -> anyhow::Result<()> {
    let (_, keys) = JwtStore::new(store.clone()).stored()?;
    if keys.is_empty() {
        println!();
        println!("JWT signing keys: none yet (podca dev and podca serve make them on start)");
        return Ok(());
    }
    let place = format!("{}/jwt", store.dir().display());
    print!("{}", podca_signer::report::jwt_keys(&place, &keys));
    Ok(())
}
