//! The CA signing-key boundary.
//!
//! Every CA key backend (file, Kubernetes Secret, PKCS#11) implements [`CaKey`]; certificate
//! building only ever calls [`CaKey::sign`], so backends differ in nothing else. Private key
//! material never crosses this trait.

use std::fmt;

use crate::spelling::{Spelled as _, Spelling, UnknownName};

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
    /// RSA PKCS#1 v1.5 with SHA-256 (a 3072-bit file key, or an imported or HSM-held one).
    RsaSha256,
    /// ML-DSA-44 (FIPS 204, pure, empty context; RFC 9881). File and Secret keys only.
    MlDsa44,
    /// ML-DSA-65. File and Secret keys only.
    MlDsa65,
    /// ML-DSA-87. File and Secret keys only.
    MlDsa87,
}

impl CaAlgorithm {
    /// The rcgen signature algorithm for this CA key.
    pub fn rcgen(self) -> &'static rcgen::SignatureAlgorithm {
        match self {
            CaAlgorithm::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            CaAlgorithm::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            CaAlgorithm::Ed25519 => &rcgen::PKCS_ED25519,
            CaAlgorithm::RsaSha256 => &rcgen::PKCS_RSA_SHA256,
            CaAlgorithm::MlDsa44 => &rcgen::PKCS_ML_DSA_44,
            CaAlgorithm::MlDsa65 => &rcgen::PKCS_ML_DSA_65,
            CaAlgorithm::MlDsa87 => &rcgen::PKCS_ML_DSA_87,
        }
    }

    /// Every CA key algorithm.
    pub const ALL: [CaAlgorithm; 7] = [
        CaAlgorithm::EcdsaP256,
        CaAlgorithm::EcdsaP384,
        CaAlgorithm::Ed25519,
        CaAlgorithm::RsaSha256,
        CaAlgorithm::MlDsa44,
        CaAlgorithm::MlDsa65,
        CaAlgorithm::MlDsa87,
    ];

    /// Whether this is an ML-DSA (post-quantum) algorithm.
    pub fn is_ml_dsa(self) -> bool {
        self.ml_dsa().is_some()
    }

    /// The aws-lc-rs ML-DSA signing algorithm, for ML-DSA keys.
    pub(crate) fn ml_dsa(self) -> Option<&'static aws_lc_rs::signature::PqdsaSigningAlgorithm> {
        use aws_lc_rs::signature as s;
        match self {
            CaAlgorithm::MlDsa44 => Some(&s::ML_DSA_44_SIGNING),
            CaAlgorithm::MlDsa65 => Some(&s::ML_DSA_65_SIGNING),
            CaAlgorithm::MlDsa87 => Some(&s::ML_DSA_87_SIGNING),
            _ => None,
        }
    }

    /// The DER content of the signature AlgorithmIdentifier's OID.
    pub fn signature_oid(self) -> &'static str {
        match self {
            CaAlgorithm::EcdsaP256 => "1.2.840.10045.4.3.2",
            CaAlgorithm::EcdsaP384 => "1.2.840.10045.4.3.3",
            CaAlgorithm::Ed25519 => "1.3.101.112",
            CaAlgorithm::RsaSha256 => "1.2.840.113549.1.1.11",
            CaAlgorithm::MlDsa44 => "2.16.840.1.101.3.4.3.17",
            CaAlgorithm::MlDsa65 => "2.16.840.1.101.3.4.3.18",
            CaAlgorithm::MlDsa87 => "2.16.840.1.101.3.4.3.19",
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
            CaAlgorithm::MlDsa44 => &s::ML_DSA_44,
            CaAlgorithm::MlDsa65 => &s::ML_DSA_65,
            CaAlgorithm::MlDsa87 => &s::ML_DSA_87,
        }
    }

    /// Maps an rcgen algorithm back, for keys loaded from PEM.
    pub fn from_rcgen(alg: &'static rcgen::SignatureAlgorithm) -> Option<Self> {
        CaAlgorithm::ALL.into_iter().find(|a| a.rcgen() == alg)
    }

    /// The CA algorithm of the key a (CA) certificate's SubjectPublicKeyInfo DER holds; `None`
    /// for a key podca's CAs do not sign with (P-521, RSA of another size, anything
    /// unparsable), so that callers fall back to their usual checks.
    pub fn of_spki(spki_der: &[u8]) -> Option<Self> {
        use crate::keys::{KeyType, SubjectKey};
        Some(match SubjectKey::from_spki_der(spki_der).ok()?.key_type() {
            KeyType::EcdsaP256 => CaAlgorithm::EcdsaP256,
            KeyType::EcdsaP384 => CaAlgorithm::EcdsaP384,
            KeyType::Ed25519 => CaAlgorithm::Ed25519,
            KeyType::Rsa3072 | KeyType::Rsa4096 => CaAlgorithm::RsaSha256,
            KeyType::MlDsa44 => CaAlgorithm::MlDsa44,
            KeyType::MlDsa65 => CaAlgorithm::MlDsa65,
            KeyType::MlDsa87 => CaAlgorithm::MlDsa87,
            KeyType::EcdsaP521 => return None,
        })
    }
}

impl crate::spelling::Spelled for CaAlgorithm {
    const WHAT: &'static str = "CA key algorithm";
    const SPELLINGS: &'static [Spelling<Self>] = &[
        Spelling {
            value: CaAlgorithm::EcdsaP256,
            name: "ecdsa-p256",
            aliases: &["p256", "p-256", "ecdsap256"],
            help: "ECDSA P-256 with SHA-256",
        },
        Spelling {
            value: CaAlgorithm::EcdsaP384,
            name: "ecdsa-p384",
            aliases: &["p384", "p-384", "ecdsap384"],
            help: "ECDSA P-384 with SHA-384",
        },
        Spelling {
            value: CaAlgorithm::Ed25519,
            name: "ed25519",
            aliases: &[],
            help: "Ed25519",
        },
        Spelling {
            value: CaAlgorithm::RsaSha256,
            name: "rsa-sha256",
            aliases: &["rsa"],
            help: "RSA (3072-bit when podca makes the key) with PKCS#1 v1.5 and SHA-256",
        },
        Spelling {
            value: CaAlgorithm::MlDsa44,
            name: "ml-dsa-44",
            aliases: &["mldsa44"],
            help: "post-quantum ML-DSA-44 (FIPS 204; file and Secret keys only)",
        },
        Spelling {
            value: CaAlgorithm::MlDsa65,
            name: "ml-dsa-65",
            aliases: &["mldsa65"],
            help: "post-quantum ML-DSA-65 (file and Secret keys only)",
        },
        Spelling {
            value: CaAlgorithm::MlDsa87,
            name: "ml-dsa-87",
            aliases: &["mldsa87"],
            help: "post-quantum ML-DSA-87 (file and Secret keys only)",
        },
    ];
}

/// A name of [`CaAlgorithm`]'s spelling table.
impl std::str::FromStr for CaAlgorithm {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_name(s)
    }
}

impl fmt::Display for CaAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.canonical_name())
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

/// A CA key pair in memory: rcgen's for the classical algorithms, aws-lc-rs's ML-DSA pair
/// otherwise (rcgen 0.14 signs with ML-DSA but cannot load an ML-DSA PKCS#8).
pub(crate) enum KeyPair {
    Rcgen(rcgen::KeyPair),
    MlDsa(aws_lc_rs::signature::PqdsaKeyPair, CaAlgorithm),
}

impl Drop for KeyPair {
    /// rcgen keeps a PKCS#8 DER copy of a classical key: wiped here (its `zeroize` feature).
    /// aws-lc cleanses its own copies (and ML-DSA's) when it frees them.
    fn drop(&mut self) {
        if let KeyPair::Rcgen(pair) = self {
            zeroize::Zeroize::zeroize(pair);
        }
    }
}

/// Builds a key pair from PEM (PKCS#8, SEC1 `EC PRIVATE KEY` or PKCS#1 `RSA PRIVATE KEY`), as
/// written by podca, openssl or cfssl; ML-DSA keys as RFC 9881 PKCS#8 (seed, expanded key or
/// both, as OpenSSL 3.5 writes them).
pub(crate) fn key_pair_from_pem(pem: &str, origin: &str) -> Result<KeyPair, BackendError> {
    let unusable = || {
        BackendError::InvalidKey(format!(
            "{origin}: not a PEM private key podca can use (PKCS#8, SEC1 EC or PKCS#1 RSA; \
             ECDSA P-256/P-384, Ed25519, RSA or ML-DSA-44/65/87)"
        ))
    };
    let pair = match rcgen::KeyPair::from_pem(pem) {
        Ok(pair) => pair,
        Err(_) => {
            let block = ::pem::parse(pem).map_err(|_| unusable())?;
            let tag_is_pkcs8 = block.tag() == "PRIVATE KEY";
            let der = zeroize::Zeroizing::new(block.into_contents());
            if !tag_is_pkcs8 {
                return Err(unusable());
            }
            return ml_dsa_from_pkcs8(&der).ok_or_else(unusable);
        }
    };
    if CaAlgorithm::from_rcgen(pair.algorithm()).is_none() {
        return Err(BackendError::InvalidKey(format!(
            "{origin}: unsupported CA key algorithm (ECDSA P-256/P-384, Ed25519, RSA or ML-DSA)"
        )));
    }
    Ok(KeyPair::Rcgen(pair))
}

/// An ML-DSA key of any parameter set from PKCS#8 DER.
fn ml_dsa_from_pkcs8(der: &[u8]) -> Option<KeyPair> {
    [
        CaAlgorithm::MlDsa44,
        CaAlgorithm::MlDsa65,
        CaAlgorithm::MlDsa87,
    ]
    .into_iter()
    .find_map(|algorithm| {
        let signing = algorithm.ml_dsa()?;
        aws_lc_rs::signature::PqdsaKeyPair::from_pkcs8(signing, der)
            .ok()
            .map(|pair| KeyPair::MlDsa(pair, algorithm))
    })
}
