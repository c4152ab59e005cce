//! An in-memory CA key: tests, and short-lived intermediates that never touch disk.

use std::fmt;

use rcgen::{PublicKeyData, SigningKey};

use super::{BackendError, CaAlgorithm, CaKey, key_pair_from_pem};

/// A CA key held in process memory.
pub struct MemoryKey {
    pair: rcgen::KeyPair,
    algorithm: CaAlgorithm,
}

impl fmt::Debug for MemoryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryKey")
            .field("algorithm", &self.algorithm)
            .field("private_key", &"<redacted>")
            .finish()
    }
}

impl MemoryKey {
    /// Generates a fresh key.
    pub fn generate(algorithm: CaAlgorithm) -> Result<Self, BackendError> {
        let pair = match algorithm {
            CaAlgorithm::RsaSha256 => {
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_3072)
            }
            other => rcgen::KeyPair::generate_for(other.rcgen()),
        }
        .map_err(|e| BackendError::InvalidKey(format!("key generation failed: {e}")))?;
        Ok(MemoryKey { pair, algorithm })
    }

    /// Loads a key from PEM text.
    pub fn from_pem(pem: &str) -> Result<Self, BackendError> {
        let pair = key_pair_from_pem(pem, "private key")?;
        Self::from_pair(pair)
    }

    pub(crate) fn from_pair(pair: rcgen::KeyPair) -> Result<Self, BackendError> {
        let algorithm = CaAlgorithm::from_rcgen(pair.algorithm())
            .ok_or_else(|| BackendError::InvalidKey("unsupported CA key algorithm".into()))?;
        Ok(MemoryKey { pair, algorithm })
    }

    /// The private key as PKCS#8 v1 PEM (every TLS stack reads it; Ed25519 included), for
    /// writing a key file. Handle with care.
    pub(crate) fn pkcs8_pem(&self) -> String {
        crate::keys::pkcs8_v1_pem(&self.pair)
    }
}

impl CaKey for MemoryKey {
    fn algorithm(&self) -> CaAlgorithm {
        self.algorithm
    }

    fn public_key_raw(&self) -> &[u8] {
        self.pair.der_bytes()
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        self.pair
            .sign(message)
            .map_err(|e| BackendError::Unavailable(format!("signing failed: {e}")))
    }

    fn location(&self) -> String {
        "memory".into()
    }

    fn signs_quickly_in_process(&self) -> bool {
        self.algorithm() != CaAlgorithm::RsaSha256
    }
}
