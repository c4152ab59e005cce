//! The SPIFFE bundle document (SPIFFE Trust Domain and Bundle, §4): a JWKS whose keys are the
//! trust domain's X.509 authorities (`use: x509-svid`, one CA certificate in `x5c`) and JWT
//! authorities (`use: jwt-svid`, with `kid`), plus `spiffe_sequence` and
//! `spiffe_refresh_hint`. podca writes it for its own trust domains (`podca bundle --spiffe`,
//! the bundle endpoint) and reads it from foreign ones (federation), with the same types.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};
use time::OffsetDateTime;

use crate::ca::CaCertificate;
use crate::jwt::jwks::USE_JWT_SVID;
use crate::jwt::store::JwtStore;
use crate::jwt::{Jwk, JwtAlgorithm, JwtBundle, JwtKeySet};
use crate::store::{FileStore, StoreError};

/// The `use` of an X.509 authority in a SPIFFE bundle.
pub const USE_X509_SVID: &str = "x509-svid";

/// The largest bundle document podca reads (a foreign endpoint's answer included).
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// One trust domain's bundle: what a relying party needs to verify its SVIDs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpiffeBundle {
    /// The X.509 authorities (CA certificates), in document order.
    pub x509_authorities: Vec<CaCertificate>,
    /// The JWT authorities, each with its `kid`.
    pub jwt_authorities: Vec<Jwk>,
    /// `spiffe_sequence`: increases with every change of the authorities.
    pub sequence: Option<u64>,
    /// `spiffe_refresh_hint`, in seconds: how often consumers should fetch it again.
    pub refresh_hint: Option<u64>,
}

/// Why a bundle document was refused; every variant names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    #[error("the bundle document is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the bundle document is not a JSON object with a \"keys\" array: {0}")]
    Malformed(String),
    #[error("key {index}: {detail}")]
    BadKey { index: usize, detail: String },
    #[error("key {index}: the x509-svid authority {subject:?} is not a CA certificate")]
    NotCa { index: usize, subject: String },
    #[error("the bundle has no X.509 and no JWT authority")]
    Empty,
    #[error("the X.509 authority {subject:?} has a {what} key, which a JWK cannot carry here")]
    UnsupportedKey { subject: String, what: &'static str },
}

impl SpiffeBundle {
    /// The bundle of a trust domain podca serves: `anchors` (the CA's published roots, as the
    /// Workload API hands them out) and the JWT key set's published keys, with the sequence
    /// every replica derives alike ([`sequence_of`]).
    pub fn of(anchors: &[CaCertificate], jwt: Option<&JwtKeySet>, refresh_hint: u64) -> Self {
        let jwt_authorities = jwt.map(|k| k.bundle(None).keys).unwrap_or_default();
        SpiffeBundle {
            x509_authorities: anchors.to_vec(),
            jwt_authorities,
            sequence: Some(sequence_of(anchors, jwt.map_or(0, JwtKeySet::sequence))),
            refresh_hint: Some(refresh_hint),
        }
    }

    /// The bundle of the CA in data directory `store` (its published roots and JWT keys), for
    /// a CA that publishes anchors `propagation_seconds` before they sign
    /// ([`refresh_hint_for`]): what `podca bundle --spiffe` prints.
    pub fn of_store(store: &FileStore, propagation_seconds: i64) -> Result<Self, StoreError> {
        let roots = store.roots()?;
        let keys = JwtStore::new(store.clone()).load()?;
        let jwt = keys.infos().next().is_some().then_some(&keys);
        Ok(Self::of(&roots, jwt, refresh_hint_for(propagation_seconds)))
    }

    /// The document as JSON bytes.
    pub fn to_json(&self) -> Result<Vec<u8>, BundleError> {
        let mut keys = Vec::with_capacity(self.x509_authorities.len() + self.jwt_authorities.len());
        for ca in &self.x509_authorities {
            keys.push(x509_key(ca)?);
        }
        for jwk in &self.jwt_authorities {
            let mut jwk = jwk.clone();
            jwk.key_use = Some(USE_JWT_SVID.to_owned());
            // Plain strings: serialising cannot fail.
            keys.push(serde_json::to_value(jwk).unwrap_or_default());
        }
        let mut document = Map::new();
        document.insert("keys".into(), Value::Array(keys));
        if let Some(sequence) = self.sequence {
            document.insert("spiffe_sequence".into(), sequence.into());
        }
        if let Some(hint) = self.refresh_hint {
            document.insert("spiffe_refresh_hint".into(), hint.into());
        }
        let mut json = serde_json::to_vec_pretty(&Value::Object(document)).unwrap_or_default();
        json.push(b'\n');
        Ok(json)
    }

    /// Parses a document. Keys of another `use` are skipped (the specification lets bundles
    /// grow new uses); an x509-svid key must carry exactly one CA certificate, a jwt-svid key a
    /// `kid`; a document with no authority at all is refused.
    pub fn parse(json: &[u8]) -> Result<Self, BundleError> {
        if json.len() > MAX_DOCUMENT_BYTES {
            return Err(BundleError::TooLarge {
                limit: MAX_DOCUMENT_BYTES,
            });
        }
        let document: Value =
            serde_json::from_slice(json).map_err(|e| BundleError::Malformed(e.to_string()))?;
        let keys = document
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| BundleError::Malformed("no \"keys\" array".into()))?;
        let number = |field: &str| match document.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| BundleError::Malformed(format!("{field} is not a whole number"))),
        };
        let mut bundle = SpiffeBundle {
            x509_authorities: vec![],
            jwt_authorities: vec![],
            sequence: number("spiffe_sequence")?,
            refresh_hint: number("spiffe_refresh_hint")?,
        };
        for (index, key) in keys.iter().enumerate() {
            let bad = |detail: &str| BundleError::BadKey {
                index,
                detail: detail.to_owned(),
            };
            match key.get("use").and_then(Value::as_str) {
                Some(USE_X509_SVID) => {
                    let x5c = key
                        .get("x5c")
                        .and_then(Value::as_array)
                        .ok_or_else(|| bad("an x509-svid key without x5c"))?;
                    let [cert] = x5c.as_slice() else {
                        return Err(bad("an x509-svid key must carry exactly one certificate"));
                    };
                    let der = cert
                        .as_str()
                        .and_then(|b64| STANDARD.decode(b64).ok())
                        .ok_or_else(|| bad("x5c is not base64"))?;
                    let ca = CaCertificate::from_der(&der)
                        .map_err(|e| bad(&format!("x5c does not parse: {e}")))?;
                    if !ca.is_ca() {
                        return Err(BundleError::NotCa {
                            index,
                            subject: ca.subject().to_owned(),
                        });
                    }
                    bundle.x509_authorities.push(ca);
                }
                Some(USE_JWT_SVID) => {
                    let jwk: Jwk = serde_json::from_value(key.clone())
                        .map_err(|e| bad(&format!("not a JWK with a kid: {e}")))?;
                    if jwk.kid.is_empty() {
                        return Err(bad("a jwt-svid key with an empty kid"));
                    }
                    bundle.jwt_authorities.push(jwk);
                }
                Some(_) => {}
                None => return Err(bad("no \"use\"")),
            }
        }
        if bundle.x509_authorities.is_empty() && bundle.jwt_authorities.is_empty() {
            return Err(BundleError::Empty);
        }
        Ok(bundle)
    }

    /// The X.509 authorities as concatenated DER, as the Workload API carries bundles.
    pub fn x509_der(&self) -> Vec<u8> {
        self.x509_authorities
            .iter()
            .flat_map(|c| c.der().iter().copied())
            .collect()
    }

    /// The JWT authorities as a JWKS, as `FetchJWTBundles` carries them.
    pub fn jwt_bundle(&self) -> JwtBundle {
        JwtBundle {
            keys: self.jwt_authorities.clone(),
            spiffe_sequence: self.sequence,
            spiffe_refresh_hint: self.refresh_hint,
        }
    }
}

/// The `spiffe_sequence` of a trust domain whose X.509 authorities are `anchors` and whose JWT
/// key set has sequence `jwt_sequence` (0 without JWT keys).
///
/// Every replica computes the same number from the same published state, with no counter to
/// share: twice the sum of the oldest and the newest anchor's notBefore (Unix seconds), plus the
/// number of anchors, plus the JWT key set's sequence. A rotation adds an anchor no older than
/// the newest (the count grows, even within the same second), retiring drops the oldest (twice
/// the seconds it moves forward outweigh the count's one), and the JWT key set's sequence only
/// grows, so every change raises it. Not covered: anchors made within the same second and then
/// retired one by one, and replacing the CA by an older one (consumers refuse a lower sequence).
pub fn sequence_of(anchors: &[CaCertificate], jwt_sequence: u64) -> u64 {
    let seconds = |t: OffsetDateTime| u64::try_from(t.unix_timestamp()).unwrap_or(0);
    let oldest = anchors.iter().map(|a| seconds(a.not_before())).min();
    let newest = anchors.iter().map(|a| seconds(a.not_before())).max();
    let count = u64::try_from(anchors.len()).unwrap_or(u64::MAX);
    oldest
        .unwrap_or(0)
        .saturating_add(newest.unwrap_or(0))
        .saturating_mul(2)
        .saturating_add(count)
        .saturating_add(jwt_sequence)
}

/// The `spiffe_refresh_hint` for a CA whose prepared anchors are published `propagation_seconds`
/// before they sign: a third of it, so a consumer fetches a new anchor at least twice before
/// it is used (as the JWT bundle's hint).
pub fn refresh_hint_for(propagation_seconds: i64) -> u64 {
    u64::try_from(propagation_seconds / 3).unwrap_or(0).max(1)
}

/// The x509-svid JWK of one CA certificate: its public key's parameters plus `x5c`.
fn x509_key(ca: &CaCertificate) -> Result<Value, BundleError> {
    const CANDIDATES: [JwtAlgorithm; 4] = [
        JwtAlgorithm::ES256,
        JwtAlgorithm::ES384,
        JwtAlgorithm::ES512,
        JwtAlgorithm::RS256,
    ];
    let jwk = CANDIDATES
        .iter()
        .find_map(|alg| Jwk::from_spki(ca.spki_der(), "", *alg).ok());
    let mut key = match jwk {
        Some(jwk) => {
            let Value::Object(mut map) = serde_json::to_value(jwk).unwrap_or_default() else {
                return Err(unsupported(ca, "unreadable"));
            };
            map.remove("kid");
            map.remove("alg");
            map
        }
        None => ed25519_key(ca)?,
    };
    key.insert("use".into(), USE_X509_SVID.into());
    key.insert(
        "x5c".into(),
        Value::Array(vec![STANDARD.encode(ca.der()).into()]),
    );
    Ok(Value::Object(key))
}

/// The OKP JWK (RFC 8037) of an Ed25519 CA certificate.
fn ed25519_key(ca: &CaCertificate) -> Result<Map<String, Value>, BundleError> {
    // An Ed25519 SPKI is a fixed 12-byte header then the 32-byte key (RFC 8410).
    const HEADER: [u8; 12] = [
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    let spki = ca.spki_der();
    match spki.strip_prefix(&HEADER[..]) {
        Some(x) if x.len() == 32 => {
            let mut map = Map::new();
            map.insert("kty".into(), "OKP".into());
            map.insert("crv".into(), "Ed25519".into());
            map.insert(
                "x".into(),
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(x)
                    .into(),
            );
            Ok(map)
        }
        _ => Err(unsupported(ca, "non-EC, non-RSA, non-Ed25519")),
    }
}

fn unsupported(ca: &CaCertificate, what: &'static str) -> BundleError {
    BundleError::UnsupportedKey {
        subject: ca.subject().to_owned(),
        what,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use time::Duration;

    use super::*;
    use crate::backend::{CaAlgorithm, MemoryKey};
    use crate::ca::IssuingCa;

    fn root(algorithm: CaAlgorithm, at: OffsetDateTime) -> CaCertificate {
        let key = Arc::new(MemoryKey::generate(algorithm).expect("generating a test key"));
        let ca = IssuingCa::self_signed_root(key, "test root", at, Duration::days(30))
            .expect("a test root");
        ca.certificate().clone()
    }

    fn jwk() -> Jwk {
        let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("generating a test key");
        Jwk::of_key(&key, "kid-1").expect("a JWK")
    }

    #[test]
    fn a_written_bundle_reads_back_the_same() {
        let now = OffsetDateTime::now_utc();
        for algorithm in [
            CaAlgorithm::EcdsaP256,
            CaAlgorithm::EcdsaP384,
            CaAlgorithm::Ed25519,
        ] {
            let bundle = SpiffeBundle {
                x509_authorities: vec![root(algorithm, now)],
                jwt_authorities: vec![jwk()],
                sequence: Some(7),
                refresh_hint: Some(300),
            };
            let json = bundle.to_json().expect("a document");
            assert_eq!(SpiffeBundle::parse(&json), Ok(bundle), "{algorithm:?}");
        }
    }

    #[test]
    fn each_malformed_document_gets_its_own_error() {
        let now = OffsetDateTime::now_utc();
        let good = SpiffeBundle {
            x509_authorities: vec![root(CaAlgorithm::EcdsaP256, now)],
            jwt_authorities: vec![],
            sequence: None,
            refresh_hint: None,
        };
        let good: Value = serde_json::from_slice(&good.to_json().expect("doc")).expect("json");
        let with_key = |edit: &dyn Fn(&mut Map<String, Value>)| {
            let mut doc = good.clone();
            let key = doc["keys"][0].as_object_mut().expect("a key object");
            edit(key);
            serde_json::to_vec(&doc).expect("json")
        };
        assert!(matches!(
            SpiffeBundle::parse(b"[1]"),
            Err(BundleError::Malformed(_))
        ));
        assert_eq!(
            SpiffeBundle::parse(br#"{"keys":[]}"#),
            Err(BundleError::Empty)
        );
        assert!(matches!(
            SpiffeBundle::parse(br#"{"keys":[],"spiffe_sequence":-1}"#),
            Err(BundleError::Malformed(m)) if m.contains("spiffe_sequence")
        ));
        let two = with_key(&|k| {
            let cert = k["x5c"][0].clone();
            k.insert("x5c".into(), Value::Array(vec![cert.clone(), cert]));
        });
        assert!(matches!(
            SpiffeBundle::parse(&two),
            Err(BundleError::BadKey { index: 0, detail }) if detail.contains("exactly one")
        ));
        let no_kid = br#"{"keys":[{"use":"jwt-svid","kty":"EC","kid":""}]}"#;
        assert!(matches!(
            SpiffeBundle::parse(no_kid),
            Err(BundleError::BadKey { index: 0, detail }) if detail.contains("empty kid")
        ));
        let huge = vec![b' '; MAX_DOCUMENT_BYTES + 1];
        assert_eq!(
            SpiffeBundle::parse(&huge),
            Err(BundleError::TooLarge {
                limit: MAX_DOCUMENT_BYTES
            })
        );
    }

    #[test]
    fn a_leaf_is_no_x509_authority() {
        let now = OffsetDateTime::now_utc();
        let key = Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).expect("key"));
        let ca = IssuingCa::self_signed_root(key, "root", now, Duration::days(30)).expect("root");
        let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
        let params = rcgen::CertificateParams::new(vec!["leaf.test".to_owned()]).expect("params");
        let leaf = params.self_signed(&leaf_key).expect("a leaf");
        let doc = serde_json::json!({"keys": [
            {"use": "x509-svid", "kty": "EC", "x5c": [STANDARD.encode(ca.certificate().der())]},
            {"use": "x509-svid", "kty": "EC", "x5c": [STANDARD.encode(leaf.der())]},
        ]});
        assert!(matches!(
            SpiffeBundle::parse(doc.to_string().as_bytes()),
            Err(BundleError::NotCa { index: 1, .. })
        ));
    }

    #[test]
    fn the_sequence_grows_with_every_rotation_step() {
        let t0 = OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("a time");
        let old = root(CaAlgorithm::EcdsaP256, t0);
        let new = root(CaAlgorithm::EcdsaP256, t0 + Duration::hours(1));
        let alone = sequence_of(std::slice::from_ref(&old), 3);
        let prepared = sequence_of(&[old.clone(), new.clone()], 3);
        let retired = sequence_of(std::slice::from_ref(&new), 3);
        let jwt_rotated = sequence_of(std::slice::from_ref(&new), 4);
        assert!(alone < prepared && prepared < retired && retired < jwt_rotated);
        // A CA prepared within the same second as the one in force still raises it.
        let twin = root(CaAlgorithm::EcdsaP256, t0);
        assert!(sequence_of(&[old.clone(), twin], 3) > alone);
        assert_eq!(sequence_of(&[new.clone(), old.clone()], 3), prepared);
    }

    #[test]
    fn the_refresh_hint_is_a_third_of_the_propagation_window() {
        assert_eq!(refresh_hint_for(900), 300);
        assert_eq!(refresh_hint_for(0), 1);
        assert_eq!(refresh_hint_for(-5), 1);
    }
}
