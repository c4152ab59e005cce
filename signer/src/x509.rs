//! Small X.509 helpers: PEM handling, parsed facts about a certificate, signature checks.

use aws_lc_rs::digest;
use aws_lc_rs::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::x509::SubjectPublicKeyInfo;

/// Why certificate material was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    #[error("not PEM: {0}")]
    Pem(String),
    #[error("PEM block {index} is {label:?}, expected CERTIFICATE")]
    NotACertificate { index: usize, label: String },
    #[error("no CERTIFICATE block found")]
    Empty,
    #[error("certificate {index} does not parse: {detail}")]
    Parse { index: usize, detail: String },
    #[error("{0}")]
    Signature(String),
}

/// Splits PEM text into the DER of its CERTIFICATE blocks; any other block is an error.
pub fn certificates_from_pem(text: &str) -> Result<Vec<Vec<u8>>, CertError> {
    let blocks = pem::parse_many(text).map_err(|e| CertError::Pem(e.to_string()))?;
    if blocks.is_empty() {
        return Err(CertError::Empty);
    }
    blocks
        .into_iter()
        .enumerate()
        .map(|(index, b)| {
            if b.tag() == "CERTIFICATE" {
                Ok(b.into_contents())
            } else {
                Err(CertError::NotACertificate {
                    index,
                    label: b.tag().to_owned(),
                })
            }
        })
        .collect()
}

/// PEM-encodes DER certificates as header-less `CERTIFICATE` blocks, LF line endings.
pub fn certificates_to_pem<'a>(ders: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut out = String::new();
    for der in ders {
        push_certificate_pem(&mut out, der);
    }
    out
}

const PEM_BEGIN: &str = "-----BEGIN CERTIFICATE-----\n";
const PEM_END: &str = "-----END CERTIFICATE-----\n";
/// DER bytes per PEM line: 64 base64 characters (RFC 7468 §2).
const PEM_LINE_BYTES: usize = 48;
/// Base64 characters per PEM line.
const PEM_LINE_CHARS: usize = PEM_LINE_BYTES / 3 * 4;

/// The length of `der`'s PEM block as [`push_certificate_pem`] writes it.
pub(crate) fn certificate_pem_len(der: &[u8]) -> usize {
    PEM_BEGIN.len() + der.len().div_ceil(3) * 4 + der.len().div_ceil(PEM_LINE_BYTES) + PEM_END.len()
}

/// Appends `der` as a `CERTIFICATE` block: the text `pem::encode_config` writes with LF line
/// endings (a unit test compares them), but in place, reserved once, and with the whole DER
/// base64-encoded in one SIMD pass before it is cut into lines, since every issuance encodes its
/// leaf (issue #18: a 5 KB ML-DSA leaf; line by line with the base64 crate it cost ~12 % of an
/// issuance).
pub(crate) fn push_certificate_pem(out: &mut String, der: &[u8]) {
    out.reserve(certificate_pem_len(der));
    out.push_str(PEM_BEGIN);
    let encoded = base64_simd::STANDARD.encode_to_string(der);
    let mut rest = encoded.as_str();
    while !rest.is_empty() {
        // Base64 is ASCII, so every index is a character boundary.
        let (line, tail) = rest.split_at(rest.len().min(PEM_LINE_CHARS));
        out.push_str(line);
        out.push('\n');
        rest = tail;
    }
    out.push_str(PEM_END);
}

/// A certificate's serial as the ledger writes it: lowercase hex of the DER INTEGER's content
/// (`raw`, as x509-parser's `raw_serial` gives it) without its sign octet.
pub fn serial_hex(raw: &[u8]) -> String {
    hex_lower(match raw {
        [0, rest @ ..] if !rest.is_empty() => rest,
        _ => raw,
    })
}

/// Lower-case hex, as `hex::encode` writes it but without its per-character iterator (the
/// ledger's serial and key fingerprint of every issuance).
pub fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

pub(crate) fn parse_certificate(
    der: &[u8],
    index: usize,
) -> Result<X509Certificate<'_>, CertError> {
    let (rest, cert) = X509Certificate::from_der(der).map_err(|e| CertError::Parse {
        index,
        detail: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(CertError::Parse {
            index,
            detail: "trailing bytes after the certificate".into(),
        });
    }
    Ok(cert)
}

pub(crate) fn to_offset(t: x509_parser::time::ASN1Time) -> OffsetDateTime {
    t.to_datetime()
}

/// SHA-256 of some bytes as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex_lower(digest::digest(&digest::SHA256, bytes).as_ref())
}

/// Checks that the certificate `cert_der` was signed by the key in `issuer_spki_der`.
pub fn certificate_signed_by(cert_der: &[u8], issuer_spki_der: &[u8]) -> Result<(), CertError> {
    let (_, cert) = X509Certificate::from_der(cert_der).map_err(|e| CertError::Parse {
        index: 0,
        detail: e.to_string(),
    })?;
    verify_signature(
        issuer_spki_der,
        &cert.signature_algorithm.algorithm.to_id_string(),
        cert.tbs_certificate.as_ref(),
        &cert.signature_value.data,
    )
}

/// Checks that `signed` carries a valid signature by the key in `issuer_spki_der`.
pub fn verify_signature(
    issuer_spki_der: &[u8],
    signature_oid: &str,
    signed: &[u8],
    sig: &[u8],
) -> Result<(), CertError> {
    let (_, spki) = SubjectPublicKeyInfo::from_der(issuer_spki_der)
        .map_err(|e| CertError::Signature(format!("issuer key does not parse: {e}")))?;
    let alg = verification_algorithm(&spki, signature_oid).ok_or_else(|| {
        CertError::Signature(format!(
            "signature algorithm {signature_oid} is not supported for this issuer key"
        ))
    })?;
    UnparsedPublicKey::new(alg, &spki.subject_public_key.data)
        .verify(signed, sig)
        .map_err(|_| CertError::Signature("signature does not verify".into()))
}

fn verification_algorithm(
    spki: &SubjectPublicKeyInfo<'_>,
    sig_oid: &str,
) -> Option<&'static dyn VerificationAlgorithm> {
    let key_oid = spki.algorithm.algorithm.to_id_string();
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|o| o.to_id_string());
    Some(match (key_oid.as_str(), curve.as_deref(), sig_oid) {
        ("1.2.840.113549.1.1.1", _, "1.2.840.113549.1.1.11") => {
            &signature::RSA_PKCS1_2048_8192_SHA256
        }
        ("1.2.840.113549.1.1.1", _, "1.2.840.113549.1.1.12") => {
            &signature::RSA_PKCS1_2048_8192_SHA384
        }
        ("1.2.840.113549.1.1.1", _, "1.2.840.113549.1.1.13") => {
            &signature::RSA_PKCS1_2048_8192_SHA512
        }
        ("1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7"), "1.2.840.10045.4.3.2") => {
            &signature::ECDSA_P256_SHA256_ASN1
        }
        ("1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7"), "1.2.840.10045.4.3.3") => {
            &signature::ECDSA_P256_SHA384_ASN1
        }
        ("1.2.840.10045.2.1", Some("1.3.132.0.34"), "1.2.840.10045.4.3.2") => {
            &signature::ECDSA_P384_SHA256_ASN1
        }
        ("1.2.840.10045.2.1", Some("1.3.132.0.34"), "1.2.840.10045.4.3.3") => {
            &signature::ECDSA_P384_SHA384_ASN1
        }
        ("1.2.840.10045.2.1", Some("1.3.132.0.35"), "1.2.840.10045.4.3.4") => {
            &signature::ECDSA_P521_SHA512_ASN1
        }
        ("1.3.101.112", _, "1.3.101.112") => &signature::ED25519,
        // RFC 9881: the signature algorithm is the key's own parameter set.
        ("2.16.840.1.101.3.4.3.17", None, "2.16.840.1.101.3.4.3.17") => &signature::ML_DSA_44,
        ("2.16.840.1.101.3.4.3.18", None, "2.16.840.1.101.3.4.3.18") => &signature::ML_DSA_65,
        ("2.16.840.1.101.3.4.3.19", None, "2.16.840.1.101.3.4.3.19") => &signature::ML_DSA_87,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_pem_is_what_the_pem_crate_writes() {
        let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
        // Around the line (48 bytes) and base64 group (3 bytes) boundaries, and ML-DSA sizes.
        for len in [0, 1, 2, 3, 47, 48, 49, 95, 96, 97, 500, 5_000, 7_519] {
            let der: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let expected = pem::encode_config(&pem::Pem::new("CERTIFICATE", der.clone()), config);
            let mut written = String::new();
            push_certificate_pem(&mut written, &der);
            assert_eq!(written, expected, "{len} bytes");
            assert_eq!(certificate_pem_len(&der), expected.len(), "{len} bytes");
            assert_eq!(
                certificates_to_pem([der.as_slice(), der.as_slice()]),
                expected.repeat(2)
            );
        }
    }

    #[test]
    fn hex_is_what_the_hex_crate_writes() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_lower(&bytes), hex::encode(&bytes));
        assert_eq!(hex_lower(&[]), "");
    }
}
