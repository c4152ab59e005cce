//! The JWT half of a SPIFFE bundle: a JWKS whose keys carry `use: jwt-svid` (SPIFFE Trust Domain
//! and Bundle, §4), and the public keys validation needs.

use aws_lc_rs::signature as sig;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::{JwtAlgorithm, JwtError};
use crate::backend::CaKey;

/// The `use` of a JWT authority in a SPIFFE bundle.
pub const USE_JWT_SVID: &str = "jwt-svid";

/// One public key as a JWK (EC or RSA).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    pub kty: String,
    pub kid: String,
    #[serde(rename = "use", default, skip_serializing_if = "Option::is_none")]
    pub key_use: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crv: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub y: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e: Option<String>,
}

impl Jwk {
    /// The JWK of a podca JWT key (`use: jwt-svid`, `alg` set).
    pub fn of_key(key: &dyn CaKey, kid: &str) -> Result<Self, JwtError> {
        let alg = JwtAlgorithm::for_key(key.algorithm())?;
        let spki = key.public_key_spki();
        Self::from_spki(&spki, kid, alg)
    }

    /// The JWK of a DER SubjectPublicKeyInfo.
    pub fn from_spki(spki: &[u8], kid: &str, alg: JwtAlgorithm) -> Result<Self, JwtError> {
        let unusable = |what: &str| JwtError::UnusableKey(format!("the public key: {what}"));
        let (_, info) =
            SubjectPublicKeyInfo::from_der(spki).map_err(|_| unusable("not a DER SPKI"))?;
        let parsed = info.parsed().map_err(|_| unusable("unparseable"))?;
        let mut jwk = Jwk {
            kty: String::new(),
            kid: kid.to_owned(),
            key_use: Some(USE_JWT_SVID.to_owned()),
            alg: Some(alg.name().to_owned()),
            crv: None,
            x: None,
            y: None,
            n: None,
            e: None,
        };
        match (parsed, alg.ecdsa_scalar_len()) {
            (PublicKey::EC(point), Some(len)) => {
                let point = point.data();
                if point.len() != 1 + 2 * len || point[0] != 4 {
                    return Err(unusable("not an uncompressed point of the curve"));
                }
                jwk.kty = "EC".into();
                jwk.crv = Some(curve_name(alg).to_owned());
                jwk.x = Some(URL_SAFE_NO_PAD.encode(&point[1..=len]));
                jwk.y = Some(URL_SAFE_NO_PAD.encode(&point[1 + len..]));
            }
            (PublicKey::RSA(rsa), None) => {
                jwk.kty = "RSA".into();
                jwk.n = Some(URL_SAFE_NO_PAD.encode(strip_zeros(rsa.modulus)));
                jwk.e = Some(URL_SAFE_NO_PAD.encode(strip_zeros(rsa.exponent)));
            }
            _ => return Err(unusable("its type does not match the algorithm")),
        }
        Ok(jwk)
    }

    /// Verifies `signature` over `message` with this key, for a token whose header says `alg`.
    pub fn verify(
        &self,
        alg: JwtAlgorithm,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), JwtError> {
        let mismatch = || JwtError::AlgorithmMismatch {
            kid: self.kid.clone(),
            alg,
        };
        if self.alg.as_deref().is_some_and(|a| a != alg.name()) {
            return Err(mismatch());
        }
        let b64 = |field: &Option<String>| {
            field
                .as_deref()
                .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
                .ok_or_else(mismatch)
        };
        match alg.ecdsa_scalar_len() {
            Some(len) => {
                if self.kty != "EC" || self.crv.as_deref() != Some(curve_name(alg)) {
                    return Err(mismatch());
                }
                let (x, y) = (b64(&self.x)?, b64(&self.y)?);
                if x.len() != len || y.len() != len {
                    return Err(mismatch());
                }
                let mut point = Vec::with_capacity(1 + 2 * len);
                point.push(4);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                let algorithm: &'static sig::EcdsaVerificationAlgorithm = match alg {
                    JwtAlgorithm::ES256 => &sig::ECDSA_P256_SHA256_FIXED,
                    JwtAlgorithm::ES384 => &sig::ECDSA_P384_SHA384_FIXED,
                    _ => &sig::ECDSA_P521_SHA512_FIXED,
                };
                sig::UnparsedPublicKey::new(algorithm, point)
                    .verify(message, signature)
                    .map_err(|_| JwtError::BadSignature)
            }
            None => {
                if self.kty != "RSA" {
                    return Err(mismatch());
                }
                let (n, e) = (b64(&self.n)?, b64(&self.e)?);
                let algorithm: &'static sig::RsaParameters = match alg {
                    JwtAlgorithm::RS256 => &sig::RSA_PKCS1_2048_8192_SHA256,
                    JwtAlgorithm::RS384 => &sig::RSA_PKCS1_2048_8192_SHA384,
                    JwtAlgorithm::RS512 => &sig::RSA_PKCS1_2048_8192_SHA512,
                    JwtAlgorithm::PS256 => &sig::RSA_PSS_2048_8192_SHA256,
                    JwtAlgorithm::PS384 => &sig::RSA_PSS_2048_8192_SHA384,
                    _ => &sig::RSA_PSS_2048_8192_SHA512,
                };
                sig::RsaPublicKeyComponents { n: &n, e: &e }
                    .verify(algorithm, message, signature)
                    .map_err(|_| JwtError::BadSignature)
            }
        }
    }
}

fn curve_name(alg: JwtAlgorithm) -> &'static str {
    match alg {
        JwtAlgorithm::ES384 => "P-384",
        JwtAlgorithm::ES512 => "P-521",
        _ => "P-256",
    }
}

fn strip_zeros(bytes: &[u8]) -> &[u8] {
    &bytes[bytes.iter().take_while(|b| **b == 0).count()..]
}

/// A trust domain's JWT authorities, as published in the SPIFFE bundle and the OIDC JWKS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwtBundle {
    pub keys: Vec<Jwk>,
    /// Bumped on every change of the key set (SPIFFE bundle `spiffe_sequence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spiffe_sequence: Option<u64>,
    /// How often consumers should re-fetch, in seconds (`spiffe_refresh_hint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spiffe_refresh_hint: Option<u64>,
}

impl JwtBundle {
    /// The key with this `kid`, if it is a JWT-SVID authority.
    pub fn find(&self, kid: &str) -> Option<&Jwk> {
        self.keys
            .iter()
            .find(|k| k.kid == kid && k.key_use.as_deref().is_none_or(|u| u == USE_JWT_SVID))
    }

    /// The JWKS as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses a JWKS (a SPIFFE bundle or a plain OIDC JWKS).
    pub fn from_json(json: &[u8]) -> Result<Self, JwtError> {
        serde_json::from_slice(json).map_err(|_| JwtError::Malformed("not a JWKS"))
    }
}
