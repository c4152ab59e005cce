//! A detached JWS over the JWKS podca publishes (issue #40): RFC 7515 compact serialisation
//! with the payload left out (Appendix F), `<protected header>..<signature>`, so that a relying
//! party that reads the JWKS from somewhere others can write (the JWKS ConfigMap) can tell
//! podca's keys from a forged set.
//!
//! The signature is made with the active issuing key of the CA that holds the JWT keys, and
//! the header's `x5c` carries that CA's issuing certificate and any intermediates (never the
//! root): the chain ends at the anchors podca publishes in the signer's ClusterTrustBundle, so
//! the JWS verifies with nothing but the bundle. The header:
//!
//! ```json
//! {"alg":"ES256","typ":"jwk-set+jws","cty":"jwk-set+json","iat":1767225600,"x5c":["MIIB…"]}
//! ```
//!
//! * `alg` follows the CA key: `ES256` (P-256), `ES384` (P-384), `RS256` (RSA), `EdDSA`
//!   (Ed25519, RFC 8037), and for ML-DSA CAs `ML-DSA-44`, `ML-DSA-65` or `ML-DSA-87`, the
//!   names of draft-ietf-cose-dilithium (pure ML-DSA, empty context): not yet an RFC, so few
//!   verifiers know them; a verifier that does not refuses the JWS, which fails closed.
//! * `iat`: when podca signed; a verifier that wants a fresh set can bound its age.
//!
//! The signing input is `BASE64URL(header) "." BASE64URL(jwks.json bytes)`: ASCII, so the CA
//! key never signs anything that parses as a certificate or a CRL (a DER `SEQUENCE` starts
//! with 0x30, `e` is 0x65).

use aws_lc_rs::signature::{self as lc, UnparsedPublicKey, VerificationAlgorithm};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::{ecdsa_der_to_fixed, truncate};
use crate::backend::{BackendError, CaAlgorithm, CaKey};
use crate::ca::{CaCertificate, IssuingCa};

/// The header's `typ`: this JWS signs a JWK set, and nothing else podca signs has this type.
pub const JWS_TYPE: &str = "jwk-set+jws";
/// The header's `cty`: the detached payload is a JWK set.
pub const PAYLOAD_TYPE: &str = "jwk-set+json";
/// A JWS longer than this is refused before it is parsed (an ML-DSA-87 signature and three
/// ML-DSA-87 certificates stay under 40 KiB).
pub const MAX_JWS_BYTES: usize = 64 * 1024;
/// At most this many certificates in `x5c`.
const MAX_X5C: usize = 8;

/// The JWS algorithms podca signs a JWKS with: one per CA key algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JwsAlgorithm {
    ES256,
    ES384,
    RS256,
    /// RFC 8037, Ed25519.
    EdDSA,
    /// draft-ietf-cose-dilithium.
    MlDsa44,
    MlDsa65,
    MlDsa87,
}

impl JwsAlgorithm {
    pub const ALL: [JwsAlgorithm; 7] = [
        JwsAlgorithm::ES256,
        JwsAlgorithm::ES384,
        JwsAlgorithm::RS256,
        JwsAlgorithm::EdDSA,
        JwsAlgorithm::MlDsa44,
        JwsAlgorithm::MlDsa65,
        JwsAlgorithm::MlDsa87,
    ];

    /// The `alg` header value.
    pub fn name(self) -> &'static str {
        match self {
            JwsAlgorithm::ES256 => "ES256",
            JwsAlgorithm::ES384 => "ES384",
            JwsAlgorithm::RS256 => "RS256",
            JwsAlgorithm::EdDSA => "EdDSA",
            JwsAlgorithm::MlDsa44 => "ML-DSA-44",
            JwsAlgorithm::MlDsa65 => "ML-DSA-65",
            JwsAlgorithm::MlDsa87 => "ML-DSA-87",
        }
    }

    /// Parses an `alg` header value; anything else (`none`, HMAC, …) is refused.
    pub fn from_name(name: &str) -> Result<Self, DetachedJwsError> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| DetachedJwsError::UnsupportedAlgorithm(truncate(name)))
    }

    /// The algorithm a CA key signs the JWKS with (every CA key has one).
    pub fn for_key(algorithm: CaAlgorithm) -> Self {
        match algorithm {
            CaAlgorithm::EcdsaP256 => JwsAlgorithm::ES256,
            CaAlgorithm::EcdsaP384 => JwsAlgorithm::ES384,
            CaAlgorithm::RsaSha256 => JwsAlgorithm::RS256,
            CaAlgorithm::Ed25519 => JwsAlgorithm::EdDSA,
            CaAlgorithm::MlDsa44 => JwsAlgorithm::MlDsa44,
            CaAlgorithm::MlDsa65 => JwsAlgorithm::MlDsa65,
            CaAlgorithm::MlDsa87 => JwsAlgorithm::MlDsa87,
        }
    }

    /// The CA key algorithm that signs with this `alg` (the inverse of [`Self::for_key`]).
    pub fn key_algorithm(self) -> CaAlgorithm {
        match self {
            JwsAlgorithm::ES256 => CaAlgorithm::EcdsaP256,
            JwsAlgorithm::ES384 => CaAlgorithm::EcdsaP384,
            JwsAlgorithm::RS256 => CaAlgorithm::RsaSha256,
            JwsAlgorithm::EdDSA => CaAlgorithm::Ed25519,
            JwsAlgorithm::MlDsa44 => CaAlgorithm::MlDsa44,
            JwsAlgorithm::MlDsa65 => CaAlgorithm::MlDsa65,
            JwsAlgorithm::MlDsa87 => CaAlgorithm::MlDsa87,
        }
    }

    /// The verifier of a JOSE signature: ECDSA as the fixed-size `r || s`.
    fn verification(self) -> &'static dyn VerificationAlgorithm {
        match self {
            JwsAlgorithm::ES256 => &lc::ECDSA_P256_SHA256_FIXED,
            JwsAlgorithm::ES384 => &lc::ECDSA_P384_SHA384_FIXED,
            other => other.key_algorithm().verification(),
        }
    }

    /// The size of one ECDSA coordinate for the ES algorithms.
    fn ecdsa_scalar_len(self) -> Option<usize> {
        match self {
            JwsAlgorithm::ES256 => Some(32),
            JwsAlgorithm::ES384 => Some(48),
            _ => None,
        }
    }
}

impl std::fmt::Display for JwsAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a detached JWS could not be made, or does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DetachedJwsError {
    #[error("the JWS is {len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("malformed detached JWS: {0}")]
    Malformed(&'static str),
    #[error("alg {0:?} is not one podca signs a JWKS with")]
    UnsupportedAlgorithm(String),
    #[error("typ {0:?} is not {JWS_TYPE:?}")]
    BadType(String),
    #[error("critical header parameters podca does not understand: {0}")]
    Critical(String),
    #[error("x5c: certificate {index} does not parse")]
    BadCertificate { index: usize },
    #[error("x5c: {subject} is not valid now")]
    NotValidNow { subject: String },
    #[error("x5c: {0}")]
    BrokenChain(String),
    #[error("x5c: {subject} does not chain to any of the trust anchors")]
    NoAnchor { subject: String },
    #[error("alg {alg} does not match the key of {subject}")]
    AlgorithmMismatch { alg: JwsAlgorithm, subject: String },
    #[error("the signature does not verify over this JWKS")]
    BadSignature,
    #[error("signing the JWKS")]
    Signing(#[source] BackendError),
}

/// The protected header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwsHeader {
    pub alg: String,
    pub typ: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cty: Option<String>,
    /// Seconds since the epoch.
    pub iat: i64,
    /// Standard (not URL-safe) base64 DER, the signing certificate first.
    pub x5c: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crit: Option<Vec<String>>,
}

/// What a verified JWS says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub alg: JwsAlgorithm,
    pub issued_at: OffsetDateTime,
    /// The certificate whose key signed (`x5c[0]`).
    pub signer: CaCertificate,
}

/// The `x5c` of `ca`: its issuing certificate, then the intermediates above it, never a root
/// other than the issuing certificate itself.
pub fn x5c_of(ca: &IssuingCa) -> Vec<&CaCertificate> {
    let mut x5c = vec![ca.certificate()];
    x5c.extend(
        ca.chain()
            .iter()
            .filter(|c| *c != ca.certificate() && !ca.roots().contains(c)),
    );
    x5c
}

/// Signs `payload` (the exact `jwks.json` bytes) with `ca`'s issuing key (blocking: an HSM
/// key waits on the device).
pub fn sign(
    ca: &IssuingCa,
    payload: &[u8],
    now: OffsetDateTime,
) -> Result<String, DetachedJwsError> {
    sign_with(ca.key().as_ref(), &x5c_of(ca), payload, now)
}

/// [`sign`] with a key and an `x5c` of one's choosing (tests build mismatches with it).
pub fn sign_with(
    key: &dyn CaKey,
    x5c: &[&CaCertificate],
    payload: &[u8],
    now: OffsetDateTime,
) -> Result<String, DetachedJwsError> {
    let alg = JwsAlgorithm::for_key(key.algorithm());
    let header = JwsHeader {
        alg: alg.name().to_owned(),
        typ: JWS_TYPE.to_owned(),
        cty: Some(PAYLOAD_TYPE.to_owned()),
        iat: now.unix_timestamp(),
        x5c: x5c.iter().map(|c| STANDARD.encode(c.der())).collect(),
        crit: None,
    };
    let header = serde_json::to_vec(&header).map_err(|_| DetachedJwsError::Malformed("header"))?;
    let header = URL_SAFE_NO_PAD.encode(header);
    let signature = key
        .sign(signing_input(&header, payload).as_bytes())
        .map_err(DetachedJwsError::Signing)?;
    let signature = match alg.ecdsa_scalar_len() {
        Some(len) => ecdsa_der_to_fixed(&signature, len).ok_or(DetachedJwsError::Signing(
            BackendError::Unavailable("the key returned a malformed ECDSA signature".into()),
        ))?,
        None => signature,
    };
    Ok(format!("{header}..{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// Checks that `jws` signs exactly `payload`, by a key whose `x5c` chain ends at one of
/// `anchors` with every certificate valid at `now`.
pub fn verify(
    jws: &str,
    payload: &[u8],
    anchors: &[CaCertificate],
    now: OffsetDateTime,
) -> Result<Verified, DetachedJwsError> {
    if jws.len() > MAX_JWS_BYTES {
        return Err(DetachedJwsError::TooLarge {
            len: jws.len(),
            max: MAX_JWS_BYTES,
        });
    }
    let mut parts = jws.trim().split('.');
    let (Some(header_b64), Some(""), Some(signature_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(DetachedJwsError::Malformed(
            "not <header>..<signature> (a detached compact JWS)",
        ));
    };
    let header = URL_SAFE_NO_PAD
        .decode(header_b64)
        .map_err(|_| DetachedJwsError::Malformed("the header is not base64url"))?;
    let header: JwsHeader = serde_json::from_slice(&header)
        .map_err(|_| DetachedJwsError::Malformed("the header is not the expected JSON"))?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature_b64)
        .map_err(|_| DetachedJwsError::Malformed("the signature is not base64url"))?;
    if let Some(crit) = &header.crit {
        return Err(DetachedJwsError::Critical(truncate(&crit.join(","))));
    }
    let alg = JwsAlgorithm::from_name(&header.alg)?;
    if header.typ != JWS_TYPE {
        return Err(DetachedJwsError::BadType(truncate(&header.typ)));
    }
    let chain = certificates(&header.x5c)?;
    check_chain(&chain, anchors, now)?;
    let signer = &chain[0];
    if CaAlgorithm::of_spki(signer.spki_der()) != Some(alg.key_algorithm()) {
        return Err(DetachedJwsError::AlgorithmMismatch {
            alg,
            subject: signer.subject().to_owned(),
        });
    }
    let (_, spki) = SubjectPublicKeyInfo::from_der(signer.spki_der())
        .map_err(|_| DetachedJwsError::BadCertificate { index: 0 })?;
    UnparsedPublicKey::new(alg.verification(), &spki.subject_public_key.data)
        .verify(signing_input(header_b64, payload).as_bytes(), &signature)
        .map_err(|_| DetachedJwsError::BadSignature)?;
    Ok(Verified {
        alg,
        issued_at: OffsetDateTime::from_unix_timestamp(header.iat)
            .map_err(|_| DetachedJwsError::Malformed("iat is out of range"))?,
        signer: signer.clone(),
    })
}

fn signing_input(header_b64: &str, payload: &[u8]) -> String {
    format!("{header_b64}.{}", URL_SAFE_NO_PAD.encode(payload))
}

fn certificates(x5c: &[String]) -> Result<Vec<CaCertificate>, DetachedJwsError> {
    if x5c.is_empty() || x5c.len() > MAX_X5C {
        return Err(DetachedJwsError::Malformed(
            "x5c holds no or too many certificates",
        ));
    }
    x5c.iter()
        .enumerate()
        .map(|(index, b64)| {
            STANDARD
                .decode(b64)
                .ok()
                .and_then(|der| CaCertificate::from_der(&der).ok())
                .ok_or(DetachedJwsError::BadCertificate { index })
        })
        .collect()
}

/// Each certificate signed by the next, the last one an anchor or signed by one, all valid at
/// `now`.
fn check_chain(
    chain: &[CaCertificate],
    anchors: &[CaCertificate],
    now: OffsetDateTime,
) -> Result<(), DetachedJwsError> {
    for cert in chain {
        if now < cert.not_before() || now > cert.not_after() {
            return Err(DetachedJwsError::NotValidNow {
                subject: cert.subject().to_owned(),
            });
        }
    }
    for pair in chain.windows(2) {
        pair[0]
            .verify_signed_by(&pair[1])
            .map_err(|e| DetachedJwsError::BrokenChain(e.to_string()))?;
    }
    // `certificates` refused an empty x5c.
    let top = &chain[chain.len() - 1];
    let anchored = anchors.iter().any(|anchor| {
        now >= anchor.not_before()
            && now <= anchor.not_after()
            && (anchor == top || (anchor.is_ca() && top.verify_signed_by(anchor).is_ok()))
    });
    if anchored {
        Ok(())
    } else {
        Err(DetachedJwsError::NoAnchor {
            subject: top.subject().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests;
