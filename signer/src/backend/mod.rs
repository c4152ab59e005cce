//! The CA signing-key boundary.
//!
//! Every CA key backend (file, Kubernetes Secret, PKCS#11) implements [`CaKey`]; certificate
//! building only ever calls [`CaKey::sign`], so backends differ in nothing else. Private key
//! material never crosses this trait.

use std::fmt;

mod file;
mod memory;
pub mod pkcs11;

#[doc(hidden)]
pub mod contract;

pub use file::FileKey;
pub use memory::MemoryKey;
pub use pkcs11::{PinSource, Pkcs11Config, Pkcs11Key, Pkcs11Stats, Pkcs11Uri};

/// The CA key algorithms podca can sign with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaAlgorithm {
    /// ECDSA P-256 with SHA-256 (the default).
    EcdsaP256,
    /// ECDSA P-384 with SHA-384.
    EcdsaP384,
    /// Ed25519.
    Ed25519,
    /// RSA PKCS#1 v1.5 with SHA-256 (imported or HSM-held RSA keys only).
    RsaSha256,
}

impl CaAlgorithm {
    /// The rcgen signature algorithm for this CA key.
    pub fn rcgen(self) -> &'static rcgen::SignatureAlgorithm {
        match self {
            CaAlgorithm::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            CaAlgorithm::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            CaAlgorithm::Ed25519 => &rcgen::PKCS_ED25519,
            CaAlgorithm::RsaSha256 => &rcgen::PKCS_RSA_SHA256,
        }
    }

    /// The aws-lc-rs algorithm that verifies this key's signatures.
    pub fn verification(self) -> &'static dyn aws_lc_rs::signature::VerificationAlgorithm {
        use aws_lc_rs::signature as s;
        match self {
            CaAlgorithm::EcdsaP256 => &s::ECDSA_P256_SHA256_ASN1,
            CaAlgorithm::EcdsaP384 => &s::ECDSA_P384_SHA384_ASN1,
            CaAlgorithm::Ed25519 => &s::ED25519,
            CaAlgorithm::RsaSha256 => &s::RSA_PKCS1_2048_8192_SHA256,
        }
    }

    /// Maps an rcgen algorithm back, for keys loaded from PEM.
    pub fn from_rcgen(alg: &'static rcgen::SignatureAlgorithm) -> Option<Self> {
        [
            CaAlgorithm::EcdsaP256,
            CaAlgorithm::EcdsaP384,
            CaAlgorithm::Ed25519,
            CaAlgorithm::RsaSha256,
        ]
        .into_iter()
        .find(|a| a.rcgen() == alg)
    }
}

impl std::str::FromStr for CaAlgorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "ecdsa-p256" | "p256" | "p-256" | "ecdsap256" => Ok(CaAlgorithm::EcdsaP256),
            "ecdsa-p384" | "p384" | "p-384" | "ecdsap384" => Ok(CaAlgorithm::EcdsaP384),
            "ed25519" => Ok(CaAlgorithm::Ed25519),
            "rsa" | "rsa-sha256" => Ok(CaAlgorithm::RsaSha256),
            _ => Err(format!(
                "unknown CA key algorithm {s:?}; expected ecdsa-p256, ecdsa-p384 or ed25519"
            )),
        }
    }
}

impl fmt::Display for CaAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CaAlgorithm::EcdsaP256 => "ecdsa-p256",
            CaAlgorithm::EcdsaP384 => "ecdsa-p384",
            CaAlgorithm::Ed25519 => "ed25519",
            CaAlgorithm::RsaSha256 => "rsa-sha256",
        })
    }
}

/// Why a CA key could not sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend cannot sign right now (token removed, library error, network); retry later.
    #[error("CA key backend unavailable: {0}")]
    Unavailable(String),
    /// The key material or its configuration is unusable; retrying will not help.
    #[error("CA key unusable: {0}")]
    InvalidKey(String),
    /// Reading or writing key files failed.
    #[error("CA key file {path}: {detail}")]
    Io { path: String, detail: String },
}

impl BackendError {
    /// Whether retrying later may succeed (keep requests pending instead of failing them).
    pub fn is_transient(&self) -> bool {
        matches!(self, BackendError::Unavailable(_))
    }
}

/// A CA private key held by some backend: it can tell its public key and sign.
///
/// Implementations must be safe to call from many threads at once. `sign` is blocking: call
/// it from `spawn_blocking` or a dedicated pool in async code.
pub trait CaKey: Send + Sync + fmt::Debug {
    /// The signature algorithm this key signs with.
    fn algorithm(&self) -> CaAlgorithm;

    /// The public key as rcgen expects it: the SubjectPublicKeyInfo BIT STRING content.
    fn public_key_raw(&self) -> &[u8];

    /// Signs `message`; the signature is in X.509 form (DER for ECDSA).
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError>;

    /// Where the key lives, for humans (`file:/path`, `pkcs11:token=…;object=…`). No secrets.
    fn location(&self) -> String;

    /// Whether a signature is a few dozen microseconds of CPU in this process — an in-memory
    /// ECDSA or Ed25519 key — never a wait on a device, the network or a lock held elsewhere.
    /// Async callers may then sign inline instead of handing the work to a blocking pool (a
    /// thread hand-off per certificate costs more than the signature). Default: false.
    fn signs_quickly_in_process(&self) -> bool {
        false
    }

    /// The public key as a DER SubjectPublicKeyInfo.
    fn public_key_spki(&self) -> Vec<u8> {
        rcgen::PublicKeyData::subject_public_key_info(&RawPublicKey {
            raw: self.public_key_raw(),
            algorithm: self.algorithm(),
        })
    }
}

/// A public key as rcgen sees it, to serialise an SPKI.
struct RawPublicKey<'a> {
    raw: &'a [u8],
    algorithm: CaAlgorithm,
}

impl rcgen::PublicKeyData for RawPublicKey<'_> {
    fn der_bytes(&self) -> &[u8] {
        self.raw
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        self.algorithm.rcgen()
    }
}

/// Builds a key pair from PEM (PKCS#8, SEC1 `EC PRIVATE KEY` or PKCS#1 `RSA PRIVATE KEY`), as
/// written by podca, openssl or cfssl.
pub(crate) fn key_pair_from_pem(pem: &str, origin: &str) -> Result<rcgen::KeyPair, BackendError> {
    let pair = rcgen::KeyPair::from_pem(pem).map_err(|_| {
        BackendError::InvalidKey(format!(
            "{origin}: not a PEM private key podca can use (PKCS#8, SEC1 EC or PKCS#1 RSA; \
             ECDSA P-256/P-384, Ed25519 or RSA)"
        ))
    })?;
    if CaAlgorithm::from_rcgen(pair.algorithm()).is_none() {
        return Err(BackendError::InvalidKey(format!(
            "{origin}: unsupported CA key algorithm (ECDSA P-256/P-384, Ed25519 or RSA)"
        )));
    }
    Ok(pair)
}
