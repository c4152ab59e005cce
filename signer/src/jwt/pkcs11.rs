//! JWT signing keys generated inside the CA's PKCS#11 token.
//!
//! Each key is a key pair made in the same token as the CA key, with the protections of CA
//! keys ([`Pkcs11Key::generate`]: `CKA_SENSITIVE`, not `CKA_EXTRACTABLE`, `CKA_SIGN` only),
//! labelled `podca-jwt-<hex id>` with a random 16-byte `CKA_ID` (CA keys get 8-byte ids and the
//! operator's label), so a JWT key can never be mistaken for the CA key or match its URI. Its
//! URI is recorded in the data directory's `jwt/state.json`; nothing else about it leaves the
//! token. A dropped key's private and public objects are destroyed in the token.

use std::sync::Arc;

use super::JwtAlgorithm;
use super::keyset::kid_of;
use super::store::{GeneratedJwtKey, JwtKeyBackend};
use crate::backend::{BackendError, CaAlgorithm, CaKey, Pkcs11Config, Pkcs11Key, Pkcs11Uri};
use crate::store::StoreError;

/// The label prefix of every JWT key podca makes in a token.
pub const LABEL_PREFIX: &str = "podca-jwt-";

/// JWT keys in one token: the token the CA key's URI names, reached with the CA's PIN.
#[derive(Debug, Clone)]
pub struct Pkcs11JwtKeys {
    /// The token (no `object`, no `id`), PIN source and module.
    base: Pkcs11Config,
}

impl Pkcs11JwtKeys {
    /// JWT keys on the token of `ca_key` (the CA key's URI and PIN; its `object` and `id` are
    /// dropped).
    pub fn new(ca_key: &Pkcs11Config) -> Self {
        let mut base = ca_key.clone();
        base.uri.object = None;
        base.uri.id = None;
        Pkcs11JwtKeys { base }
    }

    fn token(&self) -> String {
        self.base.uri.to_string()
    }

    fn config_for(&self, kid: &str, location: Option<&str>) -> Result<Pkcs11Config, StoreError> {
        let Some(location) = location else {
            return Err(self.error(format!("JWT key {kid} has no recorded token location")));
        };
        let uri = Pkcs11Uri::parse(location).map_err(|e| self.error(message(&e)))?;
        let ours = uri.token == self.base.uri.token
            && uri
                .object
                .as_deref()
                .is_some_and(|o| o.starts_with(LABEL_PREFIX))
            && uri.id.is_some();
        if !ours {
            return Err(self.error(format!(
                "JWT key {kid} is recorded at {uri}, which is not a podca JWT key on this token \
                 ({LABEL_PREFIX}… label and id on token {:?})",
                self.base.uri.token
            )));
        }
        let mut config = self.base.clone();
        config.uri = Pkcs11Uri {
            module_path: uri
                .module_path
                .clone()
                .or(self.base.uri.module_path.clone()),
            ..uri
        };
        Ok(config)
    }

    fn error(&self, detail: String) -> StoreError {
        StoreError::JwtKey {
            location: self.token(),
            detail,
        }
    }
}

/// A backend error without its "CA key …" prefix (these are JWT keys).
fn message(e: &BackendError) -> String {
    match e {
        BackendError::Unavailable(m) | BackendError::InvalidKey(m) => m.clone(),
        other => other.to_string(),
    }
}

impl JwtKeyBackend for Pkcs11JwtKeys {
    fn kind(&self) -> &'static str {
        "pkcs11"
    }

    fn check(&self, algorithm: CaAlgorithm) -> Result<(), StoreError> {
        let jwt = JwtAlgorithm::for_key(algorithm).map_err(|e| self.error(e.to_string()))?;
        Pkcs11Key::token_supports(&self.base, algorithm).map_err(|e| {
            self.error(format!(
                "cannot make {jwt} ({algorithm}) JWT signing keys: {}",
                message(&e)
            ))
        })
    }

    fn generate(&self, algorithm: CaAlgorithm) -> Result<GeneratedJwtKey, StoreError> {
        let mut id = vec![0u8; 16];
        aws_lc_rs::rand::fill(&mut id)
            .map_err(|_| self.error("the system random number generator failed".into()))?;
        let mut config = self.base.clone();
        config.uri.object = Some(format!("{LABEL_PREFIX}{}", hex::encode(&id)));
        config.uri.id = Some(id);
        let key = Pkcs11Key::generate(&config, algorithm).map_err(|e| {
            self.error(format!(
                "generating a JWT signing key ({algorithm}): {}",
                message(&e)
            ))
        })?;
        let location = key.uri().to_string();
        let kid = kid_of(&key);
        tracing::info!(kid = %kid, key = %location, "JWT signing key generated in the token");
        Ok(GeneratedJwtKey {
            kid,
            location: Some(location),
            key: Arc::new(key),
        })
    }

    fn load(&self, kid: &str, location: Option<&str>) -> Result<Arc<dyn CaKey>, StoreError> {
        let config = self.config_for(kid, location)?;
        let key = Pkcs11Key::open(&config)
            .map_err(|e| self.error(format!("opening JWT key {kid}: {}", message(&e))))?;
        Ok(Arc::new(key))
    }

    fn delete(&self, kid: &str, location: Option<&str>) -> Result<(), StoreError> {
        let config = self.config_for(kid, location)?;
        let destroyed = Pkcs11Key::destroy(&config)
            .map_err(|e| self.error(format!("destroying JWT key {kid}: {}", message(&e))))?;
        tracing::info!(kid = %kid, key = %config.uri, objects = destroyed, "JWT signing key destroyed in the token");
        Ok(())
    }
}
