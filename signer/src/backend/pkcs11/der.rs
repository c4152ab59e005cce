//! The few DER encodings the PKCS#11 backend needs: ECDSA r‖s → ECDSA-Sig-Value, the
//! CKA_EC_POINT OCTET STRING wrapper, PKCS#1 RSAPublicKey and the SHA-256 DigestInfo.

use crate::der;

/// Converts a PKCS#11 ECDSA signature (r‖s, each `coordinate_len` bytes) into the X.509
/// form, `SEQUENCE { r INTEGER, s INTEGER }`. `None` when the length is not 2 × `coordinate_len`.
pub(crate) fn ecdsa_raw_to_der(raw: &[u8], coordinate_len: usize) -> Option<Vec<u8>> {
    if raw.len() != 2 * coordinate_len {
        return None;
    }
    let (r, s) = raw.split_at(coordinate_len);
    let mut out = Vec::with_capacity(raw.len() + 8);
    der::push_nested(&mut out, der::SEQUENCE, |sig| {
        der::push_unsigned(sig, r);
        der::push_unsigned(sig, s);
    });
    Some(out)
}

/// The uncompressed point from CKA_EC_POINT, which PKCS#11 says is a DER OCTET STRING but some
/// tokens return bare. `point_len` is 1 + 2 × the coordinate length.
pub(crate) fn ec_point_from_attribute(value: &[u8], point_len: usize) -> Option<Vec<u8>> {
    if value.len() == point_len && value.first() == Some(&0x04) {
        return Some(value.to_vec());
    }
    // OCTET STRING, short or long form length.
    let (&tag, rest) = value.split_first()?;
    if tag != 0x04 {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, body) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 2 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (len == body.len() && len == point_len && body.first() == Some(&0x04)).then(|| body.to_vec())
}

/// An Ed25519 public key from CKA_EC_POINT: the 32 bytes bare, or as a DER OCTET STRING
/// (PKCS#11 3.0 says the latter; tokens differ).
pub(crate) fn ed25519_point_from_attribute(value: &[u8]) -> Option<Vec<u8>> {
    match value {
        [0x04, 0x20, key @ ..] if key.len() == 32 => Some(key.to_vec()),
        key if key.len() == 32 => Some(key.to_vec()),
        _ => None,
    }
}

/// PKCS#1 `RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }`: the SPKI
/// BIT STRING content of an RSA key.
pub(crate) fn rsa_public_key(modulus: &[u8], exponent: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(modulus.len() + exponent.len() + 16);
    der::push_nested(&mut out, der::SEQUENCE, |key| {
        der::push_unsigned(key, modulus);
        der::push_unsigned(key, exponent);
    });
    out
}

/// `DigestInfo` prefix for SHA-256 (RFC 8017 §9.2 note 1), for CKM_RSA_PKCS.
pub(crate) const SHA256_DIGEST_INFO_PREFIX: [u8; 19] = [
    0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05,
    0x00, 0x04, 0x20,
];

/// DER `namedCurve` OIDs as CKA_EC_PARAMS holds them.
pub(crate) const P256_PARAMS: [u8; 10] =
    [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
pub(crate) const P384_PARAMS: [u8; 7] = [0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
/// CKA_EC_PARAMS of an Ed25519 key: the OID id-Ed25519 (1.3.101.112, RFC 8410).
pub(crate) const ED25519_PARAMS: [u8; 5] = [0x06, 0x03, 0x2b, 0x65, 0x70];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecdsa_integers_are_minimal_and_positive() {
        let mut raw = vec![0u8; 64];
        raw[31] = 0x05; // r = 5 (leading zeros dropped)
        raw[32] = 0x80; // s has its top bit set: needs a 0x00 pad
        let der = ecdsa_raw_to_der(&raw, 32).unwrap_or_default();
        assert_eq!(&der[..5], &[0x30, 3 + 35, 0x02, 0x01, 0x05]);
        assert_eq!(&der[5..8], &[0x02, 33, 0x00]);
        assert_eq!(der[8], 0x80);
        assert_eq!(der.len(), 2 + 3 + 35);
        assert!(ecdsa_raw_to_der(&raw, 48).is_none());
        let zero = ecdsa_raw_to_der(&[0u8; 64], 32).unwrap_or_default();
        assert_eq!(zero, vec![0x30, 6, 0x02, 1, 0, 0x02, 1, 0]);
    }

    #[test]
    fn ec_point_unwraps_octet_string_or_takes_bare() {
        let mut point = vec![0x04];
        point.extend([7u8; 64]);
        let mut wrapped = vec![0x04, 65];
        wrapped.extend(&point);
        assert_eq!(ec_point_from_attribute(&wrapped, 65), Some(point.clone()));
        assert_eq!(ec_point_from_attribute(&point, 65), Some(point.clone()));
        let mut p384 = vec![0x04];
        p384.extend([9u8; 96]);
        let mut long = vec![0x04, 0x81, 97];
        long.extend(&p384);
        assert_eq!(ec_point_from_attribute(&long, 97), Some(p384));
        assert_eq!(ec_point_from_attribute(&wrapped, 97), None);
        assert_eq!(ec_point_from_attribute(&[0x04, 0x02, 0x04], 65), None);
    }

    #[test]
    fn rsa_public_key_long_lengths() {
        let modulus = vec![0xc1u8; 384];
        let der = rsa_public_key(&modulus, &[1, 0, 1]);
        // SEQUENCE, long length (2 octets), INTEGER of 385 octets (padded) then 3-octet exponent.
        assert_eq!(&der[..4], &[0x30, 0x82, 0x01, 0x8a]);
        assert_eq!(&der[4..9], &[0x02, 0x82, 0x01, 0x81, 0x00]);
        assert_eq!(&der[der.len() - 5..], &[0x02, 0x03, 1, 0, 1]);
        assert_eq!(der.len(), 4 + 0x18a);
    }
}
