//! An in-memory CA key: tests, and short-lived intermediates that never touch disk.

use std::fmt;

use aws_lc_rs::signature::KeyPair as _;
use rcgen::{PublicKeyData, SigningKey};
use zeroize::Zeroizing;

use super::{BackendError, CaAlgorithm, CaKey, KeyPair, key_pair_from_pem};

/// A CA key held in process memory.
///
/// The key itself is aws-lc's (which cleanses it when freed); rcgen's PKCS#8 copy of a
/// classical key is wiped when the key is dropped (`KeyPair`'s `Drop`, rcgen's `zeroize`
/// feature). What podca makes of the key (PEM text, DER) is wiped when dropped too.
pub struct MemoryKey {
    pair: KeyPair,
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
        let failed = |e: String| BackendError::InvalidKey(format!("key generation failed: {e}"));
        if let Some(signing) = algorithm.ml_dsa() {
            let pair = aws_lc_rs::signature::PqdsaKeyPair::generate(signing)
                .map_err(|e| failed(e.to_string()))?;
            return Ok(MemoryKey {
                pair: KeyPair::MlDsa(pair, algorithm),
                algorithm,
            });
        }
        let pair = match algorithm {
            CaAlgorithm::RsaSha256 => {
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_3072)
            }
            other => rcgen::KeyPair::generate_for(other.rcgen()),
        }
        .map_err(|e| failed(e.to_string()))?;
        Ok(MemoryKey {
            pair: KeyPair::Rcgen(pair),
            algorithm,
        })
    }

    /// Loads a key from PEM text.
    pub fn from_pem(pem: &str) -> Result<Self, BackendError> {
        let pair = key_pair_from_pem(pem, "private key")?;
        Self::from_pair(pair)
    }

    pub(crate) fn from_pair(pair: KeyPair) -> Result<Self, BackendError> {
        let algorithm = match &pair {
            KeyPair::Rcgen(pair) => CaAlgorithm::from_rcgen(pair.algorithm())
                .ok_or_else(|| BackendError::InvalidKey("unsupported CA key algorithm".into()))?,
            KeyPair::MlDsa(_, algorithm) => *algorithm,
        };
        Ok(MemoryKey { pair, algorithm })
    }

    /// The private key as PKCS#8 v1 PEM (every TLS stack reads it; Ed25519 included; ML-DSA
    /// in RFC 9881's seed form, which OpenSSL 3.5 reads), for writing a key file. Handle with
    /// care: it is wiped when dropped.
    pub(crate) fn pkcs8_pem(&self) -> Result<Zeroizing<String>, BackendError> {
        match &self.pair {
            KeyPair::Rcgen(pair) => Ok(crate::keys::pkcs8_v1_pem(pair)),
            KeyPair::MlDsa(pair, _) => {
                // aws-lc-rs wipes its own buffer when `der` is dropped.
                let der = pair.to_pkcs8v1().map_err(|_| {
                    BackendError::InvalidKey("the ML-DSA key has no seed to write".into())
                })?;
                Ok(crate::keys::pkcs8_pem_block(Zeroizing::new(
                    der.as_ref().to_vec(),
                )))
            }
        }
    }
}

impl CaKey for MemoryKey {
    fn algorithm(&self) -> CaAlgorithm {
        self.algorithm
    }

    fn public_key_raw(&self) -> &[u8] {
        match &self.pair {
            KeyPair::Rcgen(pair) => pair.der_bytes(),
            KeyPair::MlDsa(pair, _) => pair.public_key().as_ref(),
        }
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        match &self.pair {
            KeyPair::Rcgen(pair) => pair
                .sign(message)
                .map_err(|e| BackendError::Unavailable(format!("signing failed: {e}"))),
            KeyPair::MlDsa(pair, _) => {
                let mut signature = vec![0; pair.algorithm().signature_len()];
                let len = pair
                    .sign(message, &mut signature)
                    .map_err(|e| BackendError::Unavailable(format!("signing failed: {e}")))?;
                signature.truncate(len);
                Ok(signature)
            }
        }
    }

    fn location(&self) -> String {
        "memory".into()
    }

    fn signs_quickly_in_process(&self) -> bool {
        // An ML-DSA signature is a few hundred microseconds (and RSA more): too long to hold
        // an async worker, so those go to the blocking pool.
        !(self.algorithm() == CaAlgorithm::RsaSha256 || self.algorithm().is_ml_dsa())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PEM text of a key, which podca writes to key files and Secrets, is wiped when
    /// dropped (the type says so), and holds the key.
    #[test]
    fn a_keys_pem_text_is_wiped_when_dropped() {
        for algorithm in [CaAlgorithm::EcdsaP256, CaAlgorithm::MlDsa44] {
            let key = MemoryKey::generate(algorithm).unwrap_or_else(|e| panic!("{e}"));
            let pem: Zeroizing<String> = key.pkcs8_pem().unwrap_or_else(|e| panic!("{e}"));
            let again = MemoryKey::from_pem(&pem).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(again.public_key_raw(), key.public_key_raw(), "{algorithm}");
        }
    }

    /// rcgen's PKCS#8 copy of a classical key is what `KeyPair`'s `Drop` wipes: zeroizing
    /// leaves none of it (rcgen's `zeroize` feature is on).
    #[test]
    fn rcgens_copy_of_the_key_is_wiped() {
        let mut pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!pair.serialize_der().is_empty());
        zeroize::Zeroize::zeroize(&mut pair);
        assert!(
            pair.serialize_der().is_empty(),
            "nothing of the key is left"
        );
    }
}
