//! Every refusal of the issue's bad-input list, each tripping only its own rule, plus
//! properties: what podca signs validates, and no mangling of a token validates or panics.

use std::collections::BTreeMap;

use proptest::prelude::*;
use time::macros::datetime;

use super::*;
use crate::backend::MemoryKey;
use crate::jwt::keyset::kid_of;

const TD: &str = "example.org";
const ID: &str = "spiffe://example.org/ns/default/sa/web";

fn now() -> OffsetDateTime {
    datetime!(2026-06-01 12:00 UTC)
}

fn key(algorithm: CaAlgorithm) -> MemoryKey {
    MemoryKey::generate(algorithm).expect("key generation")
}

fn bundle_of(keys: &[&MemoryKey]) -> JwtBundle {
    JwtBundle {
        keys: keys
            .iter()
            .map(|k| Jwk::of_key(*k, &kid_of(*k)).expect("a JWT key"))
            .collect(),
        spiffe_sequence: None,
        spiffe_refresh_hint: None,
    }
}

fn audiences(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn issue(key: &MemoryKey, aud: &[&str]) -> SignedSvid {
    let aud = audiences(aud);
    sign(
        key,
        &kid_of(key),
        &SvidRequest {
            spiffe_id: ID,
            audiences: &aud,
            lifetime: None,
        },
        &IssueLimits::default(),
        now(),
        None,
    )
    .expect("signing")
}

fn expect(audience: &str) -> Expectations<'_> {
    Expectations {
        audience,
        trust_domain: Some(TD),
        max_audiences: 8,
    }
}

/// A token with this header and these claims, signed by `key` (tokens podca would not issue).
fn forged(key: &MemoryKey, header: serde_json::Value, claims: serde_json::Value) -> String {
    let h = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).expect("json"));
    let c = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).expect("json"));
    let input = format!("{h}.{c}");
    let der = key.sign(input.as_bytes()).expect("sign");
    let sig = ecdsa_der_to_fixed(&der, 32).expect("ES256 signature");
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
}

fn good_claims() -> serde_json::Value {
    serde_json::json!({"sub": ID, "aud": "vault", "exp": now().unix_timestamp() + 300})
}

fn es256_header(key: &MemoryKey) -> serde_json::Value {
    serde_json::json!({"alg": "ES256", "kid": kid_of(key), "typ": "JWT"})
}

#[test]
fn issued_tokens_have_the_standard_header_and_claims() {
    let k = key(CaAlgorithm::EcdsaP256);
    let svid = issue(&k, &["vault"]);
    let decoded = decode(&svid.token).expect("decodes");
    assert_eq!(
        decoded.header,
        Header {
            alg: "ES256".into(),
            kid: Some(kid_of(&k)),
            typ: Some("JWT".into()),
        }
    );
    assert_eq!(decoded.claims.sub, ID);
    assert_eq!(decoded.claims.aud, vec!["vault".to_owned()]);
    assert_eq!(decoded.claims.iat, Some(now().unix_timestamp()));
    assert_eq!(
        decoded.claims.exp,
        now().unix_timestamp() + 300,
        "default lifetime 5 min"
    );
    assert_eq!(decoded.claims.iss, None);
    // One audience is a string, several an array (both RFC 7519).
    let claims_json = URL_SAFE_NO_PAD
        .decode(svid.token.split('.').nth(1).expect("claims"))
        .expect("b64");
    let claims: serde_json::Value = serde_json::from_slice(&claims_json).expect("json");
    assert_eq!(claims["aud"], serde_json::json!("vault"));
    let two = issue(&k, &["a", "b"]);
    assert_eq!(
        decode(&two.token).expect("decodes").claims.aud,
        audiences(&["a", "b"])
    );
    // ES256 signatures are the fixed-size r || s (64 bytes), not DER.
    let sig = URL_SAFE_NO_PAD
        .decode(svid.token.rsplit('.').next().expect("sig"))
        .expect("b64");
    assert_eq!(sig.len(), 64);
}

#[test]
fn every_podca_key_type_signs_tokens_that_validate() {
    for (algorithm, alg) in [
        (CaAlgorithm::EcdsaP256, "ES256"),
        (CaAlgorithm::EcdsaP384, "ES384"),
        (CaAlgorithm::RsaSha256, "RS256"),
    ] {
        let k = key(algorithm);
        let svid = issue(&k, &["vault"]);
        let valid = validate(&svid.token, &bundle_of(&[&k]), &expect("vault"), now())
            .unwrap_or_else(|e| panic!("{alg}: {e}"));
        assert_eq!(valid.alg.name(), alg);
        assert_eq!(valid.claims.sub, ID);
        assert_eq!(valid.kid, kid_of(&k));
    }
}

#[test]
fn ed25519_cannot_be_a_jwt_key() {
    let k = key(CaAlgorithm::Ed25519);
    let aud = audiences(&["vault"]);
    let err = sign(
        &k,
        "kid",
        &SvidRequest {
            spiffe_id: ID,
            audiences: &aud,
            lifetime: None,
        },
        &IssueLimits::default(),
        now(),
        None,
    )
    .expect_err("EdDSA is not on the JWT-SVID list");
    assert!(
        matches!(err, JwtError::UnusableKey(ref m) if m.contains("Ed25519")),
        "{err}"
    );
}

#[test]
fn lifetimes_are_clamped_to_policy_and_to_the_key() {
    let limits = IssueLimits::default();
    let at = now();
    assert_eq!(
        token_expiry(at, None, &limits, None),
        at + Duration::minutes(5)
    );
    assert_eq!(
        token_expiry(at, Some(Duration::hours(5)), &limits, None),
        at + Duration::hours(1),
        "policy maximum"
    );
    assert_eq!(
        token_expiry(at, Some(Duration::ZERO), &limits, None),
        at + Duration::seconds(1)
    );
    let key_end = at + Duration::minutes(2);
    assert_eq!(
        token_expiry(at, None, &limits, Some(key_end)),
        key_end,
        "never past the key"
    );
}

#[test]
fn requests_without_or_with_too_many_audiences_are_refused() {
    assert_eq!(check_audiences(&[], 8), Err(JwtError::NoAudience));
    let nine: Vec<String> = (0..9).map(|i| format!("aud{i}")).collect();
    assert_eq!(
        check_audiences(&nine, 8),
        Err(JwtError::TooManyAudiences { count: 9, max: 8 })
    );
    assert_eq!(check_audiences(&nine[..8], 8), Ok(()));
    assert_eq!(
        check_audiences(&audiences(&[""]), 8),
        Err(JwtError::BadAudience(String::new()))
    );
    let long = "a".repeat(MAX_AUDIENCE_BYTES + 1);
    assert!(matches!(
        check_audiences(&[long], 8),
        Err(JwtError::BadAudience(_))
    ));
}

#[test]
fn alg_none_and_hmac_and_eddsa_are_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let bundle = bundle_of(&[&k]);
    for alg in ["none", "HS256", "HS512", "EdDSA", "es256", ""] {
        let header = serde_json::json!({"alg": alg, "kid": kid_of(&k), "typ": "JWT"});
        let token = forged(&k, header, good_claims());
        assert_eq!(
            validate(&token, &bundle, &expect("vault"), now()),
            Err(JwtError::UnsupportedAlgorithm(alg.to_owned())),
            "{alg}"
        );
    }
    // The classic `none` token has an empty signature part: refused, never accepted.
    let h = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","kid":"x"}"#);
    let c = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&good_claims()).expect("json"));
    assert_eq!(
        validate(&format!("{h}.{c}."), &bundle, &expect("vault"), now()),
        Err(JwtError::Malformed("the signature is empty"))
    );
}

#[test]
fn a_wrong_or_missing_kid_is_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let other = key(CaAlgorithm::EcdsaP256);
    let bundle = bundle_of(&[&k]);
    // Signed by a key the bundle does not hold.
    let token = issue(&other, &["vault"]).token;
    assert_eq!(
        validate(&token, &bundle, &expect("vault"), now()),
        Err(JwtError::UnknownKeyId(kid_of(&other)))
    );
    // The right kid, the wrong key's signature.
    let header = es256_header(&k);
    let token = forged(&other, header, good_claims());
    assert_eq!(
        validate(&token, &bundle, &expect("vault"), now()),
        Err(JwtError::BadSignature)
    );
    let token = forged(
        &k,
        serde_json::json!({"alg": "ES256", "typ": "JWT"}),
        good_claims(),
    );
    assert_eq!(
        validate(&token, &bundle, &expect("vault"), now()),
        Err(JwtError::MissingKeyId)
    );
}

#[test]
fn an_alg_the_key_does_not_sign_with_is_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let header = serde_json::json!({"alg": "RS256", "kid": kid_of(&k)});
    let token = forged(&k, header, good_claims());
    assert_eq!(
        validate(&token, &bundle_of(&[&k]), &expect("vault"), now()),
        Err(JwtError::AlgorithmMismatch {
            kid: kid_of(&k),
            alg: JwtAlgorithm::RS256
        })
    );
}

#[test]
fn a_typ_other_than_jwt_is_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let header = serde_json::json!({"alg": "ES256", "kid": kid_of(&k), "typ": "at+jwt"});
    assert_eq!(
        validate(
            &forged(&k, header, good_claims()),
            &bundle_of(&[&k]),
            &expect("vault"),
            now()
        ),
        Err(JwtError::BadType("at+jwt".into()))
    );
}

#[test]
fn expired_and_not_yet_valid_tokens_are_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let bundle = bundle_of(&[&k]);
    let token = issue(&k, &["vault"]).token;
    let exp = now().unix_timestamp() + 300;
    // Valid up to the second before exp, refused from exp on.
    assert!(
        validate(
            &token,
            &bundle,
            &expect("vault"),
            now() + Duration::seconds(299)
        )
        .is_ok()
    );
    assert_eq!(
        validate(
            &token,
            &bundle,
            &expect("vault"),
            now() + Duration::seconds(300)
        ),
        Err(JwtError::Expired { exp, now: exp })
    );
    let mut claims = good_claims();
    claims["nbf"] = serde_json::json!(now().unix_timestamp() + 60);
    let token = forged(&k, es256_header(&k), claims);
    assert_eq!(
        validate(&token, &bundle, &expect("vault"), now()),
        Err(JwtError::NotYetValid {
            nbf: now().unix_timestamp() + 60,
            now: now().unix_timestamp()
        })
    );
    assert!(
        validate(
            &token,
            &bundle,
            &expect("vault"),
            now() + Duration::seconds(60)
        )
        .is_ok()
    );
}

#[test]
fn a_token_for_another_audience_is_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let token = issue(&k, &["vault", "aws"]).token;
    let bundle = bundle_of(&[&k]);
    assert!(validate(&token, &bundle, &expect("aws"), now()).is_ok());
    assert_eq!(
        validate(&token, &bundle, &expect("gcp"), now()),
        Err(JwtError::WrongAudience {
            expected: "gcp".into()
        })
    );
}

#[test]
fn tokens_without_audience_or_with_too_many_are_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let bundle = bundle_of(&[&k]);
    for aud in [serde_json::json!([]), serde_json::Value::Null] {
        let mut claims = good_claims();
        match aud {
            serde_json::Value::Null => {
                claims.as_object_mut().expect("object").remove("aud");
            }
            aud => claims["aud"] = aud,
        }
        let token = forged(&k, es256_header(&k), claims);
        assert_eq!(
            validate(&token, &bundle, &expect("vault"), now()),
            Err(JwtError::NoAudience)
        );
    }
    let mut claims = good_claims();
    claims["aud"] = serde_json::json!((0..9).map(|i| format!("a{i}")).collect::<Vec<_>>());
    let token = forged(&k, es256_header(&k), claims);
    assert_eq!(
        validate(&token, &bundle, &expect("a0"), now()),
        Err(JwtError::TooManyAudiences { count: 9, max: 8 })
    );
}

#[test]
fn missing_or_mistyped_claims_are_named() {
    let k = key(CaAlgorithm::EcdsaP256);
    let bundle = bundle_of(&[&k]);
    for (claim, value) in [
        ("sub", None),
        ("sub", Some(serde_json::json!(7))),
        ("exp", None),
        ("exp", Some(serde_json::json!("tomorrow"))),
        ("aud", Some(serde_json::json!(7))),
        ("iat", Some(serde_json::json!("now"))),
        ("nbf", Some(serde_json::json!(1.5))),
    ] {
        let mut claims = good_claims();
        let object = claims.as_object_mut().expect("object");
        match value {
            Some(v) => {
                object.insert(claim.into(), v);
            }
            None => {
                object.remove(claim);
            }
        }
        let token = forged(&k, es256_header(&k), claims);
        assert_eq!(
            validate(&token, &bundle, &expect("vault"), now()),
            Err(JwtError::MissingClaim(claim)),
            "{claim}"
        );
    }
}

#[test]
fn a_subject_outside_the_trust_domain_or_not_spiffe_is_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let bundle = bundle_of(&[&k]);
    for sub in [
        "spiffe://other.org/ns/default/sa/web",
        "https://example.org/x",
        "spiffe://example.org/a/../b",
        "spiffe://Example.org/x",
        "spiffe:///x",
    ] {
        let mut claims = good_claims();
        claims["sub"] = serde_json::json!(sub);
        let token = forged(&k, es256_header(&k), claims);
        assert_eq!(
            validate(&token, &bundle, &expect("vault"), now()),
            Err(JwtError::BadSubject(sub.into())),
            "{sub}"
        );
    }
}

#[test]
fn truncated_and_oversized_tokens_are_refused() {
    let k = key(CaAlgorithm::EcdsaP256);
    let bundle = bundle_of(&[&k]);
    let token = issue(&k, &["vault"]).token;
    let (input, sig) = token.rsplit_once('.').expect("three parts");
    // Without the signature part.
    assert_eq!(
        validate(input, &bundle, &expect("vault"), now()),
        Err(JwtError::Malformed(
            "not a JWS compact serialisation (three parts)"
        ))
    );
    // A signature cut short: at a byte boundary it is a bad signature, mid-character it is
    // not base64url.
    let sig_bytes = URL_SAFE_NO_PAD.decode(sig).expect("b64");
    let short = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&sig_bytes[..48]));
    assert_eq!(
        validate(&short, &bundle, &expect("vault"), now()),
        Err(JwtError::BadSignature)
    );
    let ragged = format!("{input}.{}", &sig[..sig.len() - 1]);
    assert_eq!(
        validate(&ragged, &bundle, &expect("vault"), now()),
        Err(JwtError::Malformed("the signature is not base64url"))
    );
    // Cut inside the header.
    assert_eq!(
        validate(&token[..7], &bundle, &expect("vault"), now()),
        Err(JwtError::Malformed(
            "not a JWS compact serialisation (three parts)"
        ))
    );
    let big = "a".repeat(MAX_TOKEN_BYTES + 1);
    assert_eq!(
        validate(&big, &bundle, &expect("vault"), now()),
        Err(JwtError::TooLarge {
            len: MAX_TOKEN_BYTES + 1,
            max: MAX_TOKEN_BYTES
        })
    );
}

#[test]
fn a_changed_claim_breaks_the_signature() {
    let k = key(CaAlgorithm::EcdsaP256);
    let token = issue(&k, &["vault"]).token;
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims: Claims =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("b64")).expect("json");
    claims.sub = "spiffe://example.org/ns/kube-system/sa/admin".into();
    claims.extra = BTreeMap::new();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).expect("json")),
        parts[2]
    );
    assert_eq!(
        validate(&tampered, &bundle_of(&[&k]), &expect("vault"), now()),
        Err(JwtError::BadSignature)
    );
}

#[test]
fn the_bundle_is_a_spiffe_jwks() {
    let ec = key(CaAlgorithm::EcdsaP256);
    let rsa = key(CaAlgorithm::RsaSha256);
    let json = bundle_of(&[&ec, &rsa]).to_json();
    let value: serde_json::Value = serde_json::from_slice(&json).expect("json");
    let keys = value["keys"].as_array().expect("keys");
    assert_eq!(keys[0]["kty"], "EC");
    assert_eq!(keys[0]["crv"], "P-256");
    assert_eq!(keys[0]["use"], "jwt-svid");
    assert_eq!(keys[0]["kid"], kid_of(&ec));
    // x and y are the point's coordinates.
    let x = URL_SAFE_NO_PAD
        .decode(keys[0]["x"].as_str().expect("x"))
        .expect("b64");
    assert_eq!(x, ec.public_key_raw()[1..33]);
    assert_eq!(keys[1]["kty"], "RSA");
    assert_eq!(keys[1]["e"], "AQAB");
    assert_eq!(keys[1]["use"], "jwt-svid");
    assert_eq!(
        JwtBundle::from_json(&json).expect("parses"),
        bundle_of(&[&ec, &rsa])
    );
    // A key published for another use is not a JWT authority.
    let mut x509 = bundle_of(&[&ec]);
    x509.keys[0].key_use = Some("x509-svid".into());
    assert!(x509.find(&kid_of(&ec)).is_none());
}

#[test]
fn der_signatures_convert_to_fixed_size() {
    // r with a leading zero octet (top bit set) and a short s.
    let mut der = vec![0x30, 0x00, 0x02, 33, 0x00];
    der.extend([0x80; 32]);
    der.extend([0x02, 1, 0x05]);
    der[1] = (der.len() - 2) as u8;
    let fixed = ecdsa_der_to_fixed(&der, 32).expect("converts");
    assert_eq!(&fixed[..32], &[0x80; 32]);
    assert_eq!(&fixed[32..63], &[0; 31]);
    assert_eq!(fixed[63], 5);
    assert_eq!(
        ecdsa_der_to_fixed(&der[..der.len() - 1], 32),
        None,
        "truncated"
    );
    assert_eq!(ecdsa_der_to_fixed(&der, 16), None, "too long for the curve");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Changing any one byte of a token (to another base64url character) never yields a valid
    /// token, and never panics.
    #[test]
    fn no_single_byte_change_validates(index in 0usize..1000, replacement in "[A-Za-z0-9_.-]") {
        let k = key(CaAlgorithm::EcdsaP256);
        let token = issue(&k, &["vault"]).token;
        let index = index % token.len();
        let replacement = replacement.as_bytes()[0];
        prop_assume!(token.as_bytes()[index] != replacement);
        let mut bytes = token.into_bytes();
        bytes[index] = replacement;
        let mangled = String::from_utf8(bytes).expect("ascii");
        let result = validate(&mangled, &bundle_of(&[&k]), &expect("vault"), now());
        // Base64 has slack bits in the last character of a part: a change there may decode to
        // the same bytes, the only way a changed token may still be accepted.
        if let Ok(valid) = result {
            prop_assert_eq!(valid.claims.sub, ID);
        }
    }

    /// Arbitrary text never panics the validator.
    #[test]
    fn arbitrary_text_is_refused_without_panic(text in ".{0,300}") {
        let k = key(CaAlgorithm::EcdsaP256);
        prop_assert!(validate(&text, &bundle_of(&[&k]), &expect("vault"), now()).is_err());
    }

    /// What podca signs for any lifetime validates until exp and not after, and never outlives
    /// the policy maximum.
    #[test]
    fn signed_tokens_validate_until_exp(lifetime in 1i64..10_000) {
        let k = key(CaAlgorithm::EcdsaP256);
        let aud = audiences(&["vault"]);
        let svid = sign(&k, &kid_of(&k), &SvidRequest {
            spiffe_id: ID, audiences: &aud, lifetime: Some(Duration::seconds(lifetime)),
        }, &IssueLimits::default(), now(), None).expect("signs");
        let exp = svid.claims.exp;
        prop_assert!(exp - now().unix_timestamp() <= 3600);
        let last = OffsetDateTime::from_unix_timestamp(exp - 1).expect("time");
        let at_exp = OffsetDateTime::from_unix_timestamp(exp).expect("time");
        prop_assert!(validate(&svid.token, &bundle_of(&[&k]), &expect("vault"), last).is_ok());
        let expired = matches!(
            validate(&svid.token, &bundle_of(&[&k]), &expect("vault"), at_exp),
            Err(JwtError::Expired { .. })
        );
        prop_assert!(expired);
    }
}

#[test]
fn only_the_standards_algorithms_can_be_jwt_keys() {
    assert_eq!(
        JwtAlgorithm::for_key(CaAlgorithm::EcdsaP256).unwrap(),
        JwtAlgorithm::ES256
    );
    assert_eq!(
        JwtAlgorithm::for_key(CaAlgorithm::EcdsaP384).unwrap(),
        JwtAlgorithm::ES384
    );
    assert_eq!(
        JwtAlgorithm::for_key(CaAlgorithm::RsaSha256).unwrap(),
        JwtAlgorithm::RS256
    );
    for algorithm in [
        CaAlgorithm::Ed25519,
        CaAlgorithm::MlDsa44,
        CaAlgorithm::MlDsa65,
        CaAlgorithm::MlDsa87,
    ] {
        let err = JwtAlgorithm::for_key(algorithm).unwrap_err().to_string();
        assert!(
            err.contains("is not a JWT-SVID algorithm"),
            "{algorithm:?}: {err}"
        );
    }
}
