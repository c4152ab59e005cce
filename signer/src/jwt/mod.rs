//! JWT-SVIDs, per the SPIFFE JWT-SVID standard: building, validating, the key set and its
//! rotation, and the SPIFFE bundle's JWKS.
//!
//! A JWT-SVID is a JWS in compact serialisation. Its header carries `alg` (one of the standard's
//! list: RS256/384/512, ES256/384/512, PS256/384/512 — never `none`, an HMAC or EdDSA), `kid`
//! (always) and `typ: JWT`; its claims `sub` (the SPIFFE ID), `aud` (one or more audiences),
//! `exp`, `iat`, and `iss` when an issuer URL is configured.
//!
//! Signing goes through [`CaKey`], so the file, Secret and HSM backends sign JWT-SVIDs exactly
//! as they sign certificates; only the signature's encoding differs (JOSE ECDSA signatures are
//! the fixed-size `r || s`, not DER). JWT keys are distinct from the CA keys and rotate on their
//! own schedule ([`keyset`]).
//!
//! Validation ([`validate`]) checks, in this order: size, shape, header (`alg`, `typ`, `kid`),
//! the key in the bundle, the signature, then the claims (`sub`, `aud`, `exp`, `nbf`). Every
//! refusal is its own [`JwtError`] variant, so each edge maps it with an exhaustive match.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::backend::{BackendError, CaAlgorithm, CaKey};

pub mod detached;
pub mod jwks;
pub mod keyset;
pub mod pkcs11;
pub mod secret;
pub mod store;

pub use jwks::{Jwk, JwtBundle};
pub use keyset::{JwtKeyInfo, JwtKeyPhase, JwtKeySchedule, JwtKeySet, JwtKeyStep, plan};

/// Tokens longer than this are refused before any parsing (a JWT-SVID from podca is well under
/// 1 KiB; RSA-4096 signatures and a handful of audiences stay far below it).
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// The JWS algorithms the JWT-SVID standard allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JwtAlgorithm {
    RS256,
    RS384,
    RS512,
    ES256,
    ES384,
    ES512,
    PS256,
    PS384,
    PS512,
}

impl JwtAlgorithm {
    /// Every algorithm the standard lists.
    pub const ALL: [JwtAlgorithm; 9] = [
        JwtAlgorithm::RS256,
        JwtAlgorithm::RS384,
        JwtAlgorithm::RS512,
        JwtAlgorithm::ES256,
        JwtAlgorithm::ES384,
        JwtAlgorithm::ES512,
        JwtAlgorithm::PS256,
        JwtAlgorithm::PS384,
        JwtAlgorithm::PS512,
    ];

    /// The `alg` header value.
    pub fn name(self) -> &'static str {
        match self {
            JwtAlgorithm::RS256 => "RS256",
            JwtAlgorithm::RS384 => "RS384",
            JwtAlgorithm::RS512 => "RS512",
            JwtAlgorithm::ES256 => "ES256",
            JwtAlgorithm::ES384 => "ES384",
            JwtAlgorithm::ES512 => "ES512",
            JwtAlgorithm::PS256 => "PS256",
            JwtAlgorithm::PS384 => "PS384",
            JwtAlgorithm::PS512 => "PS512",
        }
    }

    /// Parses an `alg` header value; anything off the standard's list is refused.
    pub fn from_name(name: &str) -> Result<Self, JwtError> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| JwtError::UnsupportedAlgorithm(truncate(name)))
    }

    /// The algorithm a podca key signs JWT-SVIDs with. Ed25519 (EdDSA) is not on the standard's
    /// list, so an Ed25519 key cannot be a JWT key.
    pub fn for_key(algorithm: CaAlgorithm) -> Result<Self, JwtError> {
        match algorithm {
            CaAlgorithm::EcdsaP256 => Ok(JwtAlgorithm::ES256),
            CaAlgorithm::EcdsaP384 => Ok(JwtAlgorithm::ES384),
            CaAlgorithm::RsaSha256 => Ok(JwtAlgorithm::RS256),
            CaAlgorithm::Ed25519 => Err(JwtError::UnusableKey(
                "Ed25519 (EdDSA) is not a JWT-SVID algorithm; use ecdsa-p256, ecdsa-p384 or rsa"
                    .into(),
            )),
            CaAlgorithm::MlDsa44 | CaAlgorithm::MlDsa65 | CaAlgorithm::MlDsa87 => {
                Err(JwtError::UnusableKey(
                    "ML-DSA is not a JWT-SVID algorithm; use ecdsa-p256, ecdsa-p384 or rsa".into(),
                ))
            }
        }
    }

    /// The fixed size of one ECDSA coordinate, for the ES algorithms.
    fn ecdsa_scalar_len(self) -> Option<usize> {
        match self {
            JwtAlgorithm::ES256 => Some(32),
            JwtAlgorithm::ES384 => Some(48),
            JwtAlgorithm::ES512 => Some(66),
            _ => None,
        }
    }
}

impl std::fmt::Display for JwtAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a JWT-SVID could not be built or was refused.
///
/// Deliberately not `#[non_exhaustive]` (as the enums of [`crate::reason`]): the gRPC edge maps
/// each variant to a status and a metric label with an exhaustive match, so a new variant fails
/// to compile there instead of silently becoming `INTERNAL`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// The token is larger than [`MAX_TOKEN_BYTES`].
    #[error("the token is {len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    /// Not a JWS compact serialisation (three base64url parts, JSON header and claims).
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// `alg` is not one of the JWT-SVID standard's algorithms (`none`, HMAC, EdDSA, …).
    #[error("algorithm {0:?} is not allowed for JWT-SVIDs")]
    UnsupportedAlgorithm(String),
    /// `typ` is present and neither `JWT` nor `JOSE`.
    #[error("header typ {0:?} is not JWT")]
    BadType(String),
    /// The header has no `kid`.
    #[error("the token has no key ID (kid)")]
    MissingKeyId,
    /// No key with this `kid` is in the bundle.
    #[error("key ID {0:?} is not in the trust domain's JWT bundle")]
    UnknownKeyId(String),
    /// The key with this `kid` does not sign with the header's `alg`.
    #[error("key {kid:?} does not sign with {alg}")]
    AlgorithmMismatch { kid: String, alg: JwtAlgorithm },
    /// The signature does not verify.
    #[error("the signature does not verify")]
    BadSignature,
    /// A required claim is absent or of the wrong type.
    #[error("claim {0:?} is missing or malformed")]
    MissingClaim(&'static str),
    /// `sub` is not a SPIFFE ID (of the expected trust domain).
    #[error("subject {0:?} is not a SPIFFE ID of this trust domain")]
    BadSubject(String),
    /// No audience (requested, or in the token).
    #[error("no audience: a JWT-SVID needs at least one")]
    NoAudience,
    /// More audiences than the configured limit.
    #[error("{count} audiences, over the limit of {max}")]
    TooManyAudiences { count: usize, max: usize },
    /// An audience is empty or too long.
    #[error("audience {0:?} is empty or longer than 256 bytes")]
    BadAudience(String),
    /// The token is not for the expected audience.
    #[error("the token is not for audience {expected:?}")]
    WrongAudience { expected: String },
    /// `exp` is past.
    #[error("the token expired at {exp} (now {now})")]
    Expired { exp: i64, now: i64 },
    /// `nbf` is in the future.
    #[error("the token is not valid before {nbf} (now {now})")]
    NotYetValid { nbf: i64, now: i64 },
    /// The key cannot sign JWT-SVIDs (wrong algorithm, unreadable public key).
    #[error("unusable JWT key: {0}")]
    UnusableKey(String),
    /// No key may sign now (none active yet).
    #[error("no active JWT signing key")]
    NoSigningKey,
    /// The key backend failed to sign.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// The JOSE header of a JWT-SVID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub alg: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typ: Option<String>,
}

/// The claims of a JWT-SVID as podca writes and reads them; other claims are kept in `extra`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    #[serde(with = "audience")]
    pub aud: Vec<String>,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `aud` is a string or an array of strings (RFC 7519 §4.1.3); podca writes a string for one
/// audience and an array for more.
mod audience {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }

    pub fn serialize<S: Serializer>(aud: &[String], s: S) -> Result<S::Ok, S::Error> {
        match aud {
            [one] => s.serialize_str(one),
            many => s.collect_seq(many),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        })
    }
}

/// What to put in a new JWT-SVID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvidRequest<'a> {
    pub spiffe_id: &'a str,
    pub audiences: &'a [String],
    /// The requested lifetime (None: the default).
    pub lifetime: Option<Duration>,
}

/// Lifetime and audience limits of JWT-SVID issuance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueLimits {
    pub default_lifetime: Duration,
    pub max_lifetime: Duration,
    pub max_audiences: usize,
    /// `iss`, when configured.
    pub issuer: Option<String>,
}

impl Default for IssueLimits {
    fn default() -> Self {
        IssueLimits {
            default_lifetime: Duration::minutes(5),
            max_lifetime: Duration::hours(1),
            max_audiences: 8,
            issuer: None,
        }
    }
}

/// A signed JWT-SVID.
#[derive(Debug, Clone, PartialEq)]
pub struct SignedSvid {
    pub token: String,
    pub kid: String,
    pub claims: Claims,
}

/// The longest audience podca accepts (a URL or an ARN fits with room to spare).
pub const MAX_AUDIENCE_BYTES: usize = 256;

/// Checks a requested audience list against the limit.
pub fn check_audiences(audiences: &[String], max: usize) -> Result<(), JwtError> {
    if audiences.is_empty() {
        return Err(JwtError::NoAudience);
    }
    if audiences.len() > max {
        return Err(JwtError::TooManyAudiences {
            count: audiences.len(),
            max,
        });
    }
    if let Some(bad) = audiences
        .iter()
        .find(|a| a.is_empty() || a.len() > MAX_AUDIENCE_BYTES)
    {
        return Err(JwtError::BadAudience(truncate(bad)));
    }
    Ok(())
}

/// The expiry of a new token: the requested (or default) lifetime, clamped to the policy
/// maximum and to `key_published_until` (a token never outlives its key's place in the bundle).
pub fn token_expiry(
    now: OffsetDateTime,
    requested: Option<Duration>,
    limits: &IssueLimits,
    key_published_until: Option<OffsetDateTime>,
) -> OffsetDateTime {
    let lifetime = requested
        .unwrap_or(limits.default_lifetime)
        .clamp(Duration::seconds(1), limits.max_lifetime);
    let exp = now + lifetime;
    match key_published_until {
        Some(until) => exp.min(until),
        None => exp,
    }
}

/// Builds and signs a JWT-SVID with `key` (blocking: HSM keys wait on the device).
pub fn sign(
    key: &dyn CaKey,
    kid: &str,
    request: &SvidRequest<'_>,
    limits: &IssueLimits,
    now: OffsetDateTime,
    key_published_until: Option<OffsetDateTime>,
) -> Result<SignedSvid, JwtError> {
    check_audiences(request.audiences, limits.max_audiences)?;
    let alg = JwtAlgorithm::for_key(key.algorithm())?;
    let exp = token_expiry(now, request.lifetime, limits, key_published_until);
    let claims = Claims {
        sub: request.spiffe_id.to_owned(),
        aud: request.audiences.to_vec(),
        exp: exp.unix_timestamp(),
        iat: Some(now.unix_timestamp()),
        nbf: None,
        iss: limits.issuer.clone(),
        extra: BTreeMap::new(),
    };
    let header = Header {
        alg: alg.name().to_owned(),
        kid: Some(kid.to_owned()),
        typ: Some("JWT".to_owned()),
    };
    let token = encode_and_sign(key, alg, &header, &claims)?;
    Ok(SignedSvid {
        token,
        kid: kid.to_owned(),
        claims,
    })
}

/// Serialises header and claims and signs them. Exposed for tests that need tokens podca would
/// never issue (other claims, other headers).
pub fn encode_and_sign(
    key: &dyn CaKey,
    alg: JwtAlgorithm,
    header: &Header,
    claims: &Claims,
) -> Result<String, JwtError> {
    let header = serde_json::to_vec(header).map_err(|_| JwtError::Malformed("header"))?;
    let claims = serde_json::to_vec(claims).map_err(|_| JwtError::Malformed("claims"))?;
    let mut token = String::with_capacity(512);
    URL_SAFE_NO_PAD.encode_string(header, &mut token);
    token.push('.');
    URL_SAFE_NO_PAD.encode_string(claims, &mut token);
    let signature = sign_input(key, alg, token.as_bytes())?;
    token.push('.');
    URL_SAFE_NO_PAD.encode_string(signature, &mut token);
    Ok(token)
}

/// Signs a JWS signing input (`base64url(header) "." base64url(claims)`) with `key`, and
/// returns the signature as JWS carries it: ECDSA as the fixed-size `r || s`, not DER. The one
/// place podca turns a key's signature into a JWS one (JWT-SVIDs, and the service-account
/// tokens kube-apiserver sends to `podca token-signer`, whose claims it encodes itself).
pub fn sign_input(
    key: &dyn CaKey,
    alg: JwtAlgorithm,
    signing_input: &[u8],
) -> Result<Vec<u8>, JwtError> {
    let signature = key.sign(signing_input)?;
    match alg.ecdsa_scalar_len() {
        Some(len) => ecdsa_der_to_fixed(&signature, len)
            .ok_or_else(|| JwtError::UnusableKey("the key returned a malformed signature".into())),
        None => Ok(signature),
    }
}

/// A token whose signature, `sub`, `aud`, `exp` and `nbf` were checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedSvid {
    pub header: Header,
    pub claims: Claims,
    pub alg: JwtAlgorithm,
    pub kid: String,
}

/// What a validator expects of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectations<'a> {
    /// The audience the token must carry.
    pub audience: &'a str,
    /// The trust domain `sub` must be in (None: any SPIFFE ID).
    pub trust_domain: Option<&'a str>,
    /// Tokens with more audiences are refused.
    pub max_audiences: usize,
}

/// A token split and decoded, its signature not yet checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub header: Header,
    pub claims: Claims,
    signing_input_len: usize,
    signature: Vec<u8>,
}

/// Splits and decodes a token without checking its signature (`podca inspect`, and the first
/// half of [`validate`]).
pub fn decode(token: &str) -> Result<Decoded, JwtError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(JwtError::TooLarge {
            len: token.len(),
            max: MAX_TOKEN_BYTES,
        });
    }
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed(
            "not a JWS compact serialisation (three parts)",
        ));
    };
    let header_json = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| JwtError::Malformed("the header is not base64url"))?;
    let header: Header = serde_json::from_slice(&header_json)
        .map_err(|_| JwtError::Malformed("the header is not a JOSE header"))?;
    let claims_json = URL_SAFE_NO_PAD
        .decode(claims)
        .map_err(|_| JwtError::Malformed("the claims are not base64url"))?;
    let claims_value: serde_json::Value = serde_json::from_slice(&claims_json)
        .map_err(|_| JwtError::Malformed("the claims are not JSON"))?;
    let claims = parse_claims(claims_value)?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| JwtError::Malformed("the signature is not base64url"))?;
    if signature.is_empty() {
        return Err(JwtError::Malformed("the signature is empty"));
    }
    Ok(Decoded {
        header,
        claims,
        signing_input_len: token.len() - token.rsplit('.').next().map_or(0, str::len) - 1,
        signature,
    })
}

/// Each required claim checked on its own, so a missing one is named.
fn parse_claims(value: serde_json::Value) -> Result<Claims, JwtError> {
    let object = value
        .as_object()
        .ok_or(JwtError::Malformed("the claims are not a JSON object"))?;
    if !object.get("sub").is_some_and(serde_json::Value::is_string) {
        return Err(JwtError::MissingClaim("sub"));
    }
    match object.get("aud") {
        None => return Err(JwtError::NoAudience),
        Some(serde_json::Value::Array(a)) if a.is_empty() => return Err(JwtError::NoAudience),
        Some(serde_json::Value::String(_)) => {}
        Some(serde_json::Value::Array(a)) if a.iter().all(serde_json::Value::is_string) => {}
        Some(_) => return Err(JwtError::MissingClaim("aud")),
    }
    if !object.get("exp").is_some_and(serde_json::Value::is_i64) {
        return Err(JwtError::MissingClaim("exp"));
    }
    for optional in ["iat", "nbf"] {
        if object
            .get(optional)
            .is_some_and(|v| !v.is_i64() && !v.is_null())
        {
            return Err(JwtError::MissingClaim(optional));
        }
    }
    serde_json::from_value(value).map_err(|_| JwtError::Malformed("the claims are malformed"))
}

/// Validates a JWT-SVID against a bundle: signature, then `sub`, `aud`, `exp` and `nbf`.
pub fn validate(
    token: &str,
    bundle: &JwtBundle,
    expect: &Expectations<'_>,
    now: OffsetDateTime,
) -> Result<ValidatedSvid, JwtError> {
    let decoded = decode(token)?;
    let alg = JwtAlgorithm::from_name(&decoded.header.alg)?;
    if let Some(typ) = &decoded.header.typ
        && typ != "JWT"
        && typ != "JOSE"
    {
        return Err(JwtError::BadType(truncate(typ)));
    }
    let kid = decoded.header.kid.clone().ok_or(JwtError::MissingKeyId)?;
    let jwk = bundle
        .find(&kid)
        .ok_or_else(|| JwtError::UnknownKeyId(truncate(&kid)))?;
    jwk.verify(
        alg,
        &token.as_bytes()[..decoded.signing_input_len],
        &decoded.signature,
    )
    .map_err(|e| match e {
        JwtError::AlgorithmMismatch { .. } => JwtError::AlgorithmMismatch {
            kid: truncate(&kid),
            alg,
        },
        other => other,
    })?;
    check_claims(&decoded.claims, expect, now)?;
    Ok(ValidatedSvid {
        header: decoded.header,
        claims: decoded.claims,
        alg,
        kid,
    })
}

/// The claim checks after the signature.
pub fn check_claims(
    claims: &Claims,
    expect: &Expectations<'_>,
    now: OffsetDateTime,
) -> Result<(), JwtError> {
    if !is_spiffe_id(&claims.sub, expect.trust_domain) {
        return Err(JwtError::BadSubject(truncate(&claims.sub)));
    }
    if claims.aud.is_empty() {
        return Err(JwtError::NoAudience);
    }
    if claims.aud.len() > expect.max_audiences {
        return Err(JwtError::TooManyAudiences {
            count: claims.aud.len(),
            max: expect.max_audiences,
        });
    }
    if !claims.aud.iter().any(|a| a == expect.audience) {
        return Err(JwtError::WrongAudience {
            expected: truncate(expect.audience),
        });
    }
    let now = now.unix_timestamp();
    if claims.exp <= now {
        return Err(JwtError::Expired {
            exp: claims.exp,
            now,
        });
    }
    if let Some(nbf) = claims.nbf
        && nbf > now
    {
        return Err(JwtError::NotYetValid { nbf, now });
    }
    Ok(())
}

/// Whether `id` is a SPIFFE ID (any path: a JWT-SVID's `sub` need not be podca's form) of
/// `trust_domain`, when given.
fn is_spiffe_id(id: &str, trust_domain: Option<&str>) -> bool {
    crate::names::trust_domain_of(id)
        .is_some_and(|domain| trust_domain.is_none_or(|td| td == domain.as_str()))
}

/// Attacker-chosen strings go into errors (and from there into logs) at most 64 characters long.
fn truncate(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// An ECDSA signature from DER (`SEQUENCE { INTEGER r, INTEGER s }`) to JOSE's fixed-size
/// `r || s`, each left-padded to the curve's scalar length.
pub(crate) fn ecdsa_der_to_fixed(der: &[u8], scalar_len: usize) -> Option<Vec<u8>> {
    let (tag, body, rest) = der_tlv(der)?;
    if tag != crate::der::SEQUENCE || !rest.is_empty() {
        return None;
    }
    let (tag_r, r, after_r) = der_tlv(body)?;
    let (tag_s, s, after_s) = der_tlv(after_r)?;
    if tag_r != crate::der::INTEGER || tag_s != crate::der::INTEGER || !after_s.is_empty() {
        return None;
    }
    let mut out = vec![0u8; scalar_len * 2];
    for (i, int) in [r, s].into_iter().enumerate() {
        let digits = &int[int.iter().take_while(|b| **b == 0).count()..];
        if digits.len() > scalar_len {
            return None;
        }
        let end = (i + 1) * scalar_len;
        out[end - digits.len()..end].copy_from_slice(digits);
    }
    Some(out)
}

/// One DER tag-length-value: (tag, content, the bytes after it). Short and long lengths up to
/// two octets (ECDSA signatures are never longer).
fn der_tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        n if n < 0x80 => (usize::from(n), rest),
        0x81 => {
            let (&n, rest) = rest.split_first()?;
            (usize::from(n), rest)
        }
        0x82 => {
            let (hi, rest) = rest.split_first()?;
            let (lo, rest) = rest.split_first()?;
            (usize::from(*hi) << 8 | usize::from(*lo), rest)
        }
        _ => return None,
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

#[cfg(test)]
mod tests;
