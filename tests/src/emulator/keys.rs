//! Public-key parsing, classification and signature checks used by the
//! PodCertificateRequest rules (spec §2.1 rules 7–8, §5).

use aws_lc_rs::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use x509_parser::der_parser::oid::Oid;
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

const OID_RSA: &str = "1.2.840.113549.1.1.1";
const OID_EC: &str = "1.2.840.10045.2.1";
const OID_ED25519: &str = "1.3.101.112";
const OID_X25519: &str = "1.3.101.110";
const OID_P256: &str = "1.2.840.10045.3.1.7";
const OID_P384: &str = "1.3.132.0.34";
const OID_P521: &str = "1.3.132.0.35";
const OID_P224: &str = "1.3.132.0.33";

/// A parsed subject public key, in the terms Go's `x509.ParsePKIXPublicKey` uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PubKey {
    /// Modulus (no leading zeros) and exponent (no leading zeros).
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// Curve name as Go prints it (`P-256`…) and the uncompressed point.
    Ec {
        curve: &'static str,
        point: Vec<u8>,
    },
    Ed25519(Vec<u8>),
    /// An RFC 9881 ML-DSA key (Go 1.27 `*mldsa.PublicKey`).
    MlDsa(super::mldsa::MlDsaKey),
    /// A key Go parses but that is none of the above (X25519).
    Other,
}

fn strip_zeros(b: &[u8]) -> Vec<u8> {
    let i = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    b[i..].to_vec()
}

fn oid_str(o: &Oid<'_>) -> String {
    o.to_id_string()
}

/// Parse a DER SubjectPublicKeyInfo like Go's `x509.ParsePKIXPublicKey`.
pub fn parse_spki(der: &[u8]) -> Result<PubKey, String> {
    let (rest, spki) = SubjectPublicKeyInfo::from_der(der).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err("x509: trailing data after ASN.1 of public-key".into());
    }
    pubkey_from_spki(&spki)
}

/// Classify an already parsed SPKI.
pub fn pubkey_from_spki(spki: &SubjectPublicKeyInfo<'_>) -> Result<PubKey, String> {
    let alg = oid_str(&spki.algorithm.algorithm);
    let key = spki.subject_public_key.data.as_ref();
    match alg.as_str() {
        OID_RSA => {
            use x509_parser::public_key::PublicKey;
            match spki.parsed() {
                Ok(PublicKey::RSA(rsa)) => Ok(PubKey::Rsa {
                    n: strip_zeros(rsa.modulus),
                    e: strip_zeros(rsa.exponent),
                }),
                _ => Err("x509: invalid RSA public key".into()),
            }
        }
        OID_EC => {
            let curve_oid = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|o| oid_str(&o))
                .ok_or_else(|| {
                    "x509: failed to parse ECDSA parameters as named curve".to_string()
                })?;
            let (curve, len) = match curve_oid.as_str() {
                OID_P256 => ("P-256", 65),
                OID_P384 => ("P-384", 97),
                OID_P521 => ("P-521", 133),
                OID_P224 => ("P-224", 57),
                _ => return Err("x509: unsupported elliptic curve".into()),
            };
            if key.len() != len || key.first() != Some(&4) {
                return Err("x509: failed to unmarshal elliptic curve point".into());
            }
            Ok(PubKey::Ec {
                curve,
                point: key.to_vec(),
            })
        }
        OID_ED25519 => {
            if key.len() != 32 {
                return Err("x509: wrong Ed25519 public key size".into());
            }
            Ok(PubKey::Ed25519(key.to_vec()))
        }
        OID_X25519 => Ok(PubKey::Other),
        oid if super::mldsa::is_ml_dsa_oid(oid) => {
            super::mldsa::parse(oid, spki).map(PubKey::MlDsa)
        }
        _ => Err("x509: unknown public key algorithm".into()),
    }
}

/// Rule 7.3 / 8.3: the key must be one of the six kubelet key types, or (rule 8.9, stub only,
/// with the `PodCertificateMLDSA` gate: `allow_ml_dsa`) an ML-DSA key.
/// Returns the Go-rendered value and detail of the `field.Invalid`.
pub fn check_key_type(
    k: &PubKey,
    allow_ml_dsa: bool,
) -> Result<(), (Option<String>, &'static str)> {
    match k {
        PubKey::MlDsa(_) if allow_ml_dsa => Ok(()),
        PubKey::MlDsa(_) => Err((None, super::mldsa::GATE_OFF_DETAIL)),
        PubKey::Ed25519(_) => Ok(()),
        PubKey::Ec { curve, .. } => {
            if matches!(*curve, "P-256" | "P-384" | "P-521") {
                Ok(())
            } else {
                Err((
                    Some(format!("curve {curve}")),
                    "elliptic public keys must use curve P256, P384, or P521",
                ))
            }
        }
        PubKey::Rsa { n, .. } => {
            let bits = n.len() * 8;
            if bits == 3072 || bits == 4096 {
                Ok(())
            } else {
                Err((
                    Some(format!("{bits}-bit modulus")),
                    "RSA keys must have modulus size 3072 or 4096",
                ))
            }
        }
        PubKey::Other => Err((
            None,
            "unknown public key type; supported types are Ed25519, ECDSA, and RSA",
        )),
    }
}

/// The kubelet key type name of a key, if it is one.
pub fn key_type_name(k: &PubKey) -> Option<&'static str> {
    match k {
        PubKey::Ed25519(_) => Some("ED25519"),
        PubKey::Ec { curve: "P-256", .. } => Some("ECDSAP256"),
        PubKey::Ec { curve: "P-384", .. } => Some("ECDSAP384"),
        PubKey::Ec { curve: "P-521", .. } => Some("ECDSAP521"),
        PubKey::Rsa { n, .. } if n.len() == 384 => Some("RSA3072"),
        PubKey::Rsa { n, .. } if n.len() == 512 => Some("RSA4096"),
        PubKey::MlDsa(k) => Some(k.set.key_type_name()),
        _ => None,
    }
}

fn verify(alg: &'static dyn VerificationAlgorithm, key: &[u8], msg: &[u8], sig: &[u8]) -> bool {
    UnparsedPublicKey::new(alg, key).verify(msg, sig).is_ok()
}

/// Rule 7.4: verify a legacy proof of possession over the pod UID (spec §5.3).
pub fn verify_pop(spki_der: &[u8], pod_uid: &str, pop: &[u8]) -> bool {
    let Ok((_, spki)) = SubjectPublicKeyInfo::from_der(spki_der) else {
        return false;
    };
    let key = spki.subject_public_key.data.as_ref();
    match pubkey_from_spki(&spki) {
        Ok(PubKey::Ed25519(_)) => verify(&signature::ED25519, key, pod_uid.as_bytes(), pop),
        Ok(PubKey::Ec { curve, .. }) => {
            // Go: ecdsa.VerifyASN1(pub, sha256(podUID), sig) — the digest is
            // SHA-256 whatever the curve.
            let alg: &'static dyn VerificationAlgorithm = match curve {
                "P-256" => &signature::ECDSA_P256_SHA256_ASN1,
                "P-384" => &signature::ECDSA_P384_SHA256_ASN1,
                "P-521" => &signature::ECDSA_P521_SHA256_ASN1,
                _ => return false,
            };
            verify(alg, key, pod_uid.as_bytes(), pop)
        }
        Ok(PubKey::Rsa { .. }) => verify(
            &signature::RSA_PSS_2048_8192_SHA256,
            key,
            pod_uid.as_bytes(),
            pop,
        ),
        _ => false,
    }
}

/// Verify the self-signature of a parsed CSR (rule 8.2).
pub fn verify_csr_signature(
    csr: &x509_parser::certification_request::X509CertificationRequest<'_>,
) -> bool {
    verify_signature(
        &csr.signature_algorithm,
        &csr.certification_request_info.subject_pki,
        csr.certification_request_info.raw,
        csr.signature_value.data.as_ref(),
    )
}

/// Verify `sig` over `msg` made with `sig_alg` by the key in `spki`
/// (RSA PKCS#1 v1.5 and PSS, ECDSA P-256/384/521 with SHA-2, Ed25519).
pub fn verify_signature(
    sig_alg: &x509_parser::x509::AlgorithmIdentifier<'_>,
    spki: &SubjectPublicKeyInfo<'_>,
    msg: &[u8],
    sig: &[u8],
) -> bool {
    let key = spki.subject_public_key.data.as_ref();
    let alg_oid = oid_str(&sig_alg.algorithm);
    let pk = match pubkey_from_spki(spki) {
        Ok(pk) => pk,
        Err(_) => return false,
    };
    let alg: &'static dyn VerificationAlgorithm = match (alg_oid.as_str(), &pk) {
        ("1.2.840.113549.1.1.11", PubKey::Rsa { .. }) => &signature::RSA_PKCS1_2048_8192_SHA256,
        ("1.2.840.113549.1.1.12", PubKey::Rsa { .. }) => &signature::RSA_PKCS1_2048_8192_SHA384,
        ("1.2.840.113549.1.1.13", PubKey::Rsa { .. }) => &signature::RSA_PKCS1_2048_8192_SHA512,
        ("1.2.840.113549.1.1.10", PubKey::Rsa { .. }) => {
            // RSASSA-PSS: pick the hash from the parameters (default SHA-256 here).
            let params = sig_alg
                .parameters
                .as_ref()
                .map(|p| p.as_bytes().to_vec())
                .unwrap_or_default();
            let has = |oid_tail: &[u8]| params.windows(oid_tail.len()).any(|w| w == oid_tail);
            if has(&[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03]) {
                &signature::RSA_PSS_2048_8192_SHA512
            } else if has(&[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02]) {
                &signature::RSA_PSS_2048_8192_SHA384
            } else {
                &signature::RSA_PSS_2048_8192_SHA256
            }
        }
        (s, PubKey::Ec { curve, .. }) => match (s, *curve) {
            ("1.2.840.10045.4.3.2", "P-256") => &signature::ECDSA_P256_SHA256_ASN1,
            ("1.2.840.10045.4.3.3", "P-256") => &signature::ECDSA_P256_SHA384_ASN1,
            ("1.2.840.10045.4.3.4", "P-256") => &signature::ECDSA_P256_SHA512_ASN1,
            ("1.2.840.10045.4.3.2", "P-384") => &signature::ECDSA_P384_SHA256_ASN1,
            ("1.2.840.10045.4.3.3", "P-384") => &signature::ECDSA_P384_SHA384_ASN1,
            ("1.2.840.10045.4.3.4", "P-384") => &signature::ECDSA_P384_SHA512_ASN1,
            ("1.2.840.10045.4.3.2", "P-521") => &signature::ECDSA_P521_SHA256_ASN1,
            ("1.2.840.10045.4.3.3", "P-521") => &signature::ECDSA_P521_SHA384_ASN1,
            ("1.2.840.10045.4.3.4", "P-521") => &signature::ECDSA_P521_SHA512_ASN1,
            _ => return false,
        },
        ("1.3.101.112", PubKey::Ed25519(_)) => &signature::ED25519,
        (s, PubKey::MlDsa(k)) => return super::mldsa::verify(s, k, msg, sig),
        _ => return false,
    };
    verify(alg, key, msg, sig)
}

/// Go `PublicKey.Equal` on two parsed keys.
pub fn same_key(a: &PubKey, b: &PubKey) -> bool {
    match (a, b) {
        (PubKey::Other, _) | (_, PubKey::Other) => false,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_not_a_key() {
        assert!(parse_spki(b"garbage").is_err());
    }
}
