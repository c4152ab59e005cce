//! Signing with a [`Pkcs11Key`]: what the token is given, with which mechanism, retries on a
//! stale session, and the X.509 form of the result.

use cryptoki::context::Function;
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::Mechanism;

use super::Pkcs11Key;
use super::der;
use super::fault::{Fault, classify, describe};
use crate::backend::{BackendError, CaAlgorithm};

impl Pkcs11Key {
    /// The bytes handed to the token: a digest, a DigestInfo, or the message itself.
    fn token_input(&self, message: &[u8]) -> Vec<u8> {
        use aws_lc_rs::digest;
        match self.facts.algorithm {
            CaAlgorithm::EcdsaP384 => digest::digest(&digest::SHA384, message).as_ref().to_vec(),
            CaAlgorithm::RsaSha256 if self.facts.rsa_token_hashes => message.to_vec(),
            CaAlgorithm::RsaSha256 => {
                let mut input = der::SHA256_DIGEST_INFO_PREFIX.to_vec();
                input.extend_from_slice(digest::digest(&digest::SHA256, message).as_ref());
                input
            }
            // EdDSA hashes inside the token.
            CaAlgorithm::Ed25519 => message.to_vec(),
            // P-256.
            _ => digest::digest(&digest::SHA256, message).as_ref().to_vec(),
        }
    }

    fn mechanism(&self) -> Mechanism<'static> {
        match self.facts.algorithm {
            CaAlgorithm::RsaSha256 if self.facts.rsa_token_hashes => Mechanism::Sha256RsaPkcs,
            CaAlgorithm::RsaSha256 => Mechanism::RsaPkcs,
            CaAlgorithm::Ed25519 => Mechanism::Eddsa(cryptoki::mechanism::eddsa::EddsaParams::new(
                cryptoki::mechanism::eddsa::EddsaSignatureScheme::Pure,
            )),
            _ => Mechanism::Ecdsa,
        }
    }

    pub(super) fn sign_inner(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        let input = self.token_input(message);
        let mechanism = self.mechanism();
        for attempt in 0..2 {
            let lease = self.acquire()?;
            let result = {
                let _ctx = self.module.read();
                if self.module.epoch() != lease.session.epoch {
                    // The module was re-initialised while this session sat in the pool.
                    Err(CkError::Pkcs11(
                        RvError::SessionHandleInvalid,
                        Function::Sign,
                    ))
                } else {
                    match lease.session.session.as_ref() {
                        Some(s) => s.sign(&mechanism, lease.key, &input),
                        None => Err(CkError::Pkcs11(
                            RvError::SessionHandleInvalid,
                            Function::Sign,
                        )),
                    }
                }
            };
            let generation = lease.generation;
            match result {
                Ok(raw) => {
                    self.release(lease, true);
                    return self.to_x509(raw);
                }
                Err(e) => {
                    self.release(lease, false);
                    let fault = classify(&e);
                    let detail = format!("{}: {}", self.uri, describe(&e));
                    match fault {
                        Fault::Permanent => return Err(BackendError::InvalidKey(detail)),
                        Fault::Stale if attempt == 0 => {
                            self.invalidate(generation, &detail, false);
                        }
                        _ => {
                            self.invalidate(generation, &detail, true);
                            return Err(BackendError::Unavailable(detail));
                        }
                    }
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "{}: the token keeps failing",
            self.uri
        )))
    }

    fn to_x509(&self, raw: Vec<u8>) -> Result<Vec<u8>, BackendError> {
        if self.facts.coordinate_len == 0 {
            return Ok(raw);
        }
        der::ecdsa_raw_to_der(&raw, self.facts.coordinate_len).ok_or_else(|| {
            BackendError::Unavailable(format!(
                "{}: the token returned a {}-byte ECDSA signature",
                self.uri,
                raw.len()
            ))
        })
    }
}
