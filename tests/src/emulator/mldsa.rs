//! ML-DSA subject keys in PodCertificateRequests (kubernetes#142108, gate `PodCertificateMLDSA`;
//! spec rules 8.8–8.11): Go 1.27's `x509.ParsePKIXPublicKey` parses RFC 9881 ML-DSA keys, and
//! `validateStubPKCS10Request` admits them only while the gate is on. The legacy
//! `pkixPublicKey` fields never take them.

use aws_lc_rs::signature::{self, VerificationAlgorithm};
use x509_parser::x509::SubjectPublicKeyInfo;

/// An ML-DSA public key: the parameter set and the raw key bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlDsaKey {
    pub set: MlDsaSet,
    pub key: Vec<u8>,
}

/// The three FIPS 204 parameter sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlDsaSet {
    MlDsa44,
    MlDsa65,
    MlDsa87,
}

impl MlDsaSet {
    /// id-ml-dsa-* (RFC 9881 §2), dotted.
    pub fn oid(self) -> &'static str {
        match self {
            MlDsaSet::MlDsa44 => "2.16.840.1.101.3.4.3.17",
            MlDsaSet::MlDsa65 => "2.16.840.1.101.3.4.3.18",
            MlDsaSet::MlDsa87 => "2.16.840.1.101.3.4.3.19",
        }
    }

    fn from_oid(oid: &str) -> Option<Self> {
        [MlDsaSet::MlDsa44, MlDsaSet::MlDsa65, MlDsaSet::MlDsa87]
            .into_iter()
            .find(|s| s.oid() == oid)
    }

    /// The public key length (FIPS 204 Table 2).
    pub fn public_key_len(self) -> usize {
        match self {
            MlDsaSet::MlDsa44 => 1312,
            MlDsaSet::MlDsa65 => 1952,
            MlDsaSet::MlDsa87 => 2592,
        }
    }

    /// The `keyType` name (`MLDSA65`).
    pub fn key_type_name(self) -> &'static str {
        match self {
            MlDsaSet::MlDsa44 => "MLDSA44",
            MlDsaSet::MlDsa65 => "MLDSA65",
            MlDsaSet::MlDsa87 => "MLDSA87",
        }
    }

    fn verification(self) -> &'static dyn VerificationAlgorithm {
        match self {
            MlDsaSet::MlDsa44 => &signature::ML_DSA_44,
            MlDsaSet::MlDsa65 => &signature::ML_DSA_65,
            MlDsaSet::MlDsa87 => &signature::ML_DSA_87,
        }
    }
}

/// Whether `oid` names an ML-DSA key.
pub fn is_ml_dsa_oid(oid: &str) -> bool {
    MlDsaSet::from_oid(oid).is_some()
}

/// Parses an ML-DSA SPKI as Go 1.27 does: parameters absent, the exact key length.
pub fn parse(oid: &str, spki: &SubjectPublicKeyInfo<'_>) -> Result<MlDsaKey, String> {
    let set = MlDsaSet::from_oid(oid).ok_or("x509: unknown public key algorithm")?;
    if spki.algorithm.parameters.is_some() {
        return Err("x509: ML-DSA key encoded with illegal parameters".into());
    }
    let key = spki.subject_public_key.data.as_ref();
    if key.len() != set.public_key_len() {
        return Err("x509: invalid ML-DSA public key".into());
    }
    Ok(MlDsaKey {
        set,
        key: key.to_vec(),
    })
}

/// Rule 8.9: with the gate off the stub's key type switch has no ML-DSA case.
pub const GATE_OFF_DETAIL: &str =
    "unknown public key type; supported types are Ed25519, ECDSA, and RSA";

/// Verifies an ML-DSA signature (pure, empty context) whose algorithm is the key's own set
/// (RFC 9881 §3); any other pairing fails, as in Go.
pub fn verify(sig_oid: &str, key: &MlDsaKey, msg: &[u8], sig: &[u8]) -> bool {
    sig_oid == key.set.oid()
        && signature::UnparsedPublicKey::new(key.set.verification(), &key.key)
            .verify(msg, sig)
            .is_ok()
}
