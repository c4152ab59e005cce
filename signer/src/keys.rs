//! Subject public keys: what a PodCertificateRequest or a CSR asks us to certify.
//!
//! The key is taken from a DER PKCS#10 stub CSR (the 1.36+ and v1 field), from a DER
//! SubjectPublicKeyInfo plus proof of possession (the legacy v1beta1 fields), or from a
//! CSR whose self-signature we check ourselves (the gRPC path, where no kube-apiserver did).
//! The SPKI bytes are kept verbatim and end up unchanged in the certificate (spec §5.2.5).

use std::fmt;
use std::str::FromStr;

use aws_lc_rs::digest;
use aws_lc_rs::signature::{self, RsaPssSaltLength, UnparsedPublicKey, VerificationAlgorithm};
use rcgen::PublicKeyData;
use x509_parser::asn1_rs::oid;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::der;
use crate::spelling::{Spelled as _, Spelling};

/// The subject key types kubelet can request (spec §1.5, §5.1).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum KeyType {
    #[serde(rename = "RSA3072")]
    Rsa3072,
    #[serde(rename = "RSA4096")]
    Rsa4096,
    #[serde(rename = "ECDSAP256")]
    EcdsaP256,
    #[serde(rename = "ECDSAP384")]
    EcdsaP384,
    #[serde(rename = "ECDSAP521")]
    EcdsaP521,
    #[serde(rename = "ED25519")]
    Ed25519,
    /// ML-DSA-44 (FIPS 204, RFC 9881): off unless a signer's policy lists it.
    #[serde(rename = "MLDSA44")]
    MlDsa44,
    /// ML-DSA-65 (FIPS 204, RFC 9881): off unless a signer's policy lists it.
    #[serde(rename = "MLDSA65")]
    MlDsa65,
    /// ML-DSA-87 (FIPS 204, RFC 9881): off unless a signer's policy lists it.
    #[serde(rename = "MLDSA87")]
    MlDsa87,
}

impl KeyType {
    /// Every classical key type, in kubelet's order: what a policy accepts by default.
    pub const ALL: [KeyType; 6] = [
        KeyType::Rsa3072,
        KeyType::Rsa4096,
        KeyType::EcdsaP256,
        KeyType::EcdsaP384,
        KeyType::EcdsaP521,
        KeyType::Ed25519,
    ];

    /// The post-quantum ML-DSA key types (kubernetes#142108, gate `PodCertificateMLDSA`). A
    /// policy accepts them only when its `key_types` lists them: kubelets and every peer that
    /// verifies the certificates must support ML-DSA too.
    pub const ML_DSA: [KeyType; 3] = [KeyType::MlDsa44, KeyType::MlDsa65, KeyType::MlDsa87];

    /// Every key type podca can certify: [`KeyType::ALL`] then [`KeyType::ML_DSA`].
    pub const EVERY: [KeyType; 9] = [
        KeyType::Rsa3072,
        KeyType::Rsa4096,
        KeyType::EcdsaP256,
        KeyType::EcdsaP384,
        KeyType::EcdsaP521,
        KeyType::Ed25519,
        KeyType::MlDsa44,
        KeyType::MlDsa65,
        KeyType::MlDsa87,
    ];

    /// The name kubelet and the `podCertificate` projection use (`ECDSAP256`, …).
    pub fn kubelet_name(self) -> &'static str {
        match self {
            KeyType::Rsa3072 => "RSA3072",
            KeyType::Rsa4096 => "RSA4096",
            KeyType::EcdsaP256 => "ECDSAP256",
            KeyType::EcdsaP384 => "ECDSAP384",
            KeyType::EcdsaP521 => "ECDSAP521",
            KeyType::Ed25519 => "ED25519",
            KeyType::MlDsa44 => "MLDSA44",
            KeyType::MlDsa65 => "MLDSA65",
            KeyType::MlDsa87 => "MLDSA87",
        }
    }

    /// Whether this is an ML-DSA (post-quantum) key type.
    pub fn is_ml_dsa(self) -> bool {
        matches!(self, KeyType::MlDsa44 | KeyType::MlDsa65 | KeyType::MlDsa87)
    }

    /// For ML-DSA: the FIPS 204 name (`ML-DSA-65`) and the exact public key length in bytes
    /// (RFC 9881 §4: 1312, 1952, 2592).
    pub fn ml_dsa_parameters(self) -> Option<(&'static str, usize)> {
        match self {
            KeyType::MlDsa44 => Some(("ML-DSA-44", 1312)),
            KeyType::MlDsa65 => Some(("ML-DSA-65", 1952)),
            KeyType::MlDsa87 => Some(("ML-DSA-87", 2592)),
            _ => None,
        }
    }

    /// Whether certificates for this key get keyEncipherment (RSA only).
    pub fn is_rsa(self) -> bool {
        matches!(self, KeyType::Rsa3072 | KeyType::Rsa4096)
    }

    /// A comma-separated list of the classical kubelet names, for error messages (ML-DSA is
    /// named only where a policy allows it).
    pub fn supported_list() -> String {
        KeyType::ALL.map(KeyType::kubelet_name).join(", ")
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kubelet_name())
    }
}

impl crate::spelling::Spelled for KeyType {
    const WHAT: &'static str = "key type";
    const SPELLINGS: &'static [Spelling<Self>] = &[
        Spelling {
            value: KeyType::Rsa3072,
            name: "RSA3072",
            aliases: &[],
            help: "RSA, 3072 bits",
        },
        Spelling {
            value: KeyType::Rsa4096,
            name: "RSA4096",
            aliases: &[],
            help: "RSA, 4096 bits",
        },
        Spelling {
            value: KeyType::EcdsaP256,
            name: "ECDSAP256",
            aliases: &[],
            help: "ECDSA on P-256",
        },
        Spelling {
            value: KeyType::EcdsaP384,
            name: "ECDSAP384",
            aliases: &[],
            help: "ECDSA on P-384",
        },
        Spelling {
            value: KeyType::EcdsaP521,
            name: "ECDSAP521",
            aliases: &[],
            help: "ECDSA on P-521",
        },
        Spelling {
            value: KeyType::Ed25519,
            name: "ED25519",
            aliases: &[],
            help: "Ed25519",
        },
        Spelling {
            value: KeyType::MlDsa44,
            name: "MLDSA44",
            aliases: &[],
            help: "post-quantum ML-DSA-44 (a signer's key_types must list it)",
        },
        Spelling {
            value: KeyType::MlDsa65,
            name: "MLDSA65",
            aliases: &[],
            help: "post-quantum ML-DSA-65 (likewise)",
        },
        Spelling {
            value: KeyType::MlDsa87,
            name: "MLDSA87",
            aliases: &[],
            help: "post-quantum ML-DSA-87 (likewise)",
        },
    ];
}

/// A kubelet key type name, in any ASCII case.
impl FromStr for KeyType {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_name(s).map_err(|_| KeyError::UnsupportedKeyType {
            found: format!("key type name {s:?}"),
        })
    }
}

/// Why a subject key could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The input is not well-formed DER of the expected structure.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    /// A well-formed key of a type podca does not certify.
    #[error(
        "unsupported key type: {found}; supported key types are {}",
        KeyType::supported_list()
    )]
    UnsupportedKeyType { found: String },
    /// The CSR self-signature or the proof of possession does not verify.
    #[error("{what} does not verify against the subject public key")]
    BadSignature { what: &'static str },
}

/// The DER of a CSR file's contents: a PEM `CERTIFICATE REQUEST` block, or DER as it is.
/// Nothing is parsed beyond the PEM armour; [`SubjectKey::from_csr_verified`] does the rest.
pub fn csr_der(bytes: &[u8]) -> Result<Vec<u8>, KeyError> {
    let malformed = |detail: String| KeyError::Malformed {
        what: "CSR file",
        detail,
    };
    if !(bytes.starts_with(b"-----") || bytes.iter().take(64).all(u8::is_ascii)) {
        return Ok(bytes.to_vec());
    }
    let text = std::str::from_utf8(bytes).map_err(|_| malformed("not UTF-8 PEM".into()))?;
    let block = pem::parse(text).map_err(|e| malformed(pem_in_words(&e)))?;
    match block.tag() {
        "CERTIFICATE REQUEST" | "NEW CERTIFICATE REQUEST" => Ok(block.into_contents()),
        other => Err(malformed(format!(
            "PEM block is {other:?}, expected CERTIFICATE REQUEST"
        ))),
    }
}

/// A public key that podca will certify, with its SPKI bytes exactly as requested.
#[derive(Clone, PartialEq, Eq)]
pub struct SubjectKey {
    key_type: KeyType,
    spki_der: Vec<u8>,
    /// Where the BIT STRING content of the SPKI (what rcgen calls the public key DER) starts
    /// in `spki_der`: the canonical form ends with it, so the key is not stored twice.
    key_start: usize,
    algorithm: &'static rcgen::SignatureAlgorithm,
}

impl fmt::Debug for SubjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubjectKey")
            .field("key_type", &self.key_type)
            .field("spki_sha256", &hex::encode(self.spki_sha256()))
            .finish()
    }
}

impl SubjectKey {
    /// Parses and classifies a DER SubjectPublicKeyInfo.
    pub fn from_spki_der(der: &[u8]) -> Result<Self, KeyError> {
        let (rest, spki) =
            SubjectPublicKeyInfo::from_der(der).map_err(|e| KeyError::Malformed {
                what: "SubjectPublicKeyInfo",
                detail: e.to_string(),
            })?;
        if !rest.is_empty() {
            return Err(KeyError::Malformed {
                what: "SubjectPublicKeyInfo",
                detail: format!("{} trailing bytes", rest.len()),
            });
        }
        Self::from_parsed_spki(&spki, der)
    }

    /// Takes the key from a DER PKCS#10 stub CSR without checking its self-signature.
    ///
    /// This is the PodCertificateRequest path: kube-apiserver verified the signature at create
    /// time (spec rule 8.2), so we do not pay for it again. Nothing but the key is used.
    pub fn from_stub_csr(der: &[u8]) -> Result<Self, KeyError> {
        if let Some(key) = Self::from_canonical_stub_csr(der) {
            return Ok(key);
        }
        let csr = parse_csr(der)?;
        let spki = &csr.certification_request_info.subject_pki;
        Self::from_parsed_spki(spki, spki.raw)
    }

    /// Takes the key from a DER PKCS#10 CSR and verifies the CSR's self-signature.
    ///
    /// This is the gRPC path, where no kube-apiserver checked the request.
    pub fn from_csr_verified(der: &[u8]) -> Result<Self, KeyError> {
        let csr = parse_csr(der)?;
        let spki = &csr.certification_request_info.subject_pki;
        let key = Self::from_parsed_spki(spki, spki.raw)?;
        let sig_oid = csr.signature_algorithm.algorithm.to_id_string();
        let alg = csr_verification_algorithm(key.key_type, &sig_oid).ok_or_else(|| {
            KeyError::Malformed {
                what: "CSR",
                detail: format!(
                    "signature algorithm {sig_oid} does not fit a {} key",
                    key.key_type
                ),
            }
        })?;
        let signed = csr.certification_request_info.raw;
        UnparsedPublicKey::new(alg, key.raw_public_key())
            .verify(signed, &csr.signature_value.data)
            .map_err(|_| KeyError::BadSignature {
                what: "CSR self-signature",
            })?;
        Ok(key)
    }

    /// Takes the key from the legacy `pkixPublicKey` and checks `proofOfPossession`, a
    /// signature over the ASCII pod UID (spec §5.3).
    pub fn from_pkix_with_proof(
        spki_der: &[u8],
        proof_of_possession: &[u8],
        pod_uid: &str,
    ) -> Result<Self, KeyError> {
        let key = Self::from_spki_der(spki_der)?;
        let message = pod_uid.as_bytes();
        let verified = match key.key_type {
            // kubernetes#142108 allows ML-DSA only in the stub CSR; the legacy fields keep
            // the six classical types and define no ML-DSA proof of possession.
            KeyType::MlDsa44 | KeyType::MlDsa65 | KeyType::MlDsa87 => {
                return Err(KeyError::UnsupportedKeyType {
                    found: format!(
                        "{} in pkixPublicKey (ML-DSA keys come only in stubPKCS10Request)",
                        key.key_type
                    ),
                });
            }
            KeyType::Ed25519 => verify(&signature::ED25519, &key, message, proof_of_possession),
            KeyType::EcdsaP256 => verify(
                &signature::ECDSA_P256_SHA256_ASN1,
                &key,
                message,
                proof_of_possession,
            ),
            KeyType::EcdsaP384 => verify(
                &signature::ECDSA_P384_SHA256_ASN1,
                &key,
                message,
                proof_of_possession,
            ),
            KeyType::EcdsaP521 => verify(
                &signature::ECDSA_P521_SHA256_ASN1,
                &key,
                message,
                proof_of_possession,
            ),
            // Go's SignPSS with nil options uses the largest salt; accept the digest-length
            // salt too, which other signers use.
            KeyType::Rsa3072 | KeyType::Rsa4096 => {
                verify(
                    &const {
                        signature::RSA_PSS_2048_8192_SHA256
                            .with_pss_salt_length(RsaPssSaltLength::Max)
                    },
                    &key,
                    message,
                    proof_of_possession,
                ) || verify(
                    &signature::RSA_PSS_2048_8192_SHA256,
                    &key,
                    message,
                    proof_of_possession,
                )
            }
        };
        if verified {
            Ok(key)
        } else {
            Err(KeyError::BadSignature {
                what: "proof of possession",
            })
        }
    }

    /// The classified key type.
    pub fn key_type(&self) -> KeyType {
        self.key_type
    }

    /// The SubjectPublicKeyInfo DER exactly as it was requested.
    pub fn spki_der(&self) -> &[u8] {
        &self.spki_der
    }

    /// The BIT STRING content of the SPKI.
    fn raw_public_key(&self) -> &[u8] {
        &self.spki_der[self.key_start..]
    }

    /// SHA-256 of the SPKI DER: the key fingerprint recorded in the ledger.
    pub fn spki_sha256(&self) -> [u8; 32] {
        let d = digest::digest(&digest::SHA256, &self.spki_der);
        let mut out = [0u8; 32];
        out.copy_from_slice(d.as_ref());
        out
    }

    /// The common stub CSR without x509-parser: a DER `CertificationRequest` whose SPKI is the
    /// canonical one of a key type with a fixed key length (ECDSA with an uncompressed point,
    /// Ed25519, ML-DSA). `None` for anything else, which [`Self::from_stub_csr`] then parses in
    /// full for its precise answer.
    ///
    /// The full parse cost about 1.2 µs, 3 % of an issuance for an ML-DSA-65 subject under a
    /// P-256 CA (issue #18). This walk checks the structure down to the SPKI (every value
    /// where PKCS#10 puts it, version 0, nothing trailing) but not the contents of the subject
    /// name, the attributes and the signature algorithm, which x509-parser would also decode:
    /// nothing of them is used, and kube-apiserver parsed the whole CSR and verified its
    /// signature before it stored the request (spec rule 8.2). The key is taken from the same
    /// bytes either way (a test and the `csr` fuzz target compare the two paths).
    fn from_canonical_stub_csr(der: &[u8]) -> Option<Self> {
        let csr = der::read(der).filter(|v| v.tag == der::SEQUENCE && v.rest.is_empty())?;
        let info = der::read(csr.content).filter(|v| v.tag == der::SEQUENCE)?;
        let signature_algorithm = der::read(info.rest).filter(|v| v.tag == der::SEQUENCE)?;
        der::read(signature_algorithm.rest)
            .filter(|v| v.tag == der::BIT_STRING && v.rest.is_empty())?;
        let version =
            der::read(info.content).filter(|v| v.tag == der::INTEGER && v.content == [0])?;
        let subject = der::read(version.rest).filter(|v| v.tag == der::SEQUENCE)?;
        let spki = der::read(subject.rest).filter(|v| v.tag == der::SEQUENCE)?;
        der::read(spki.rest)
            .filter(|v| v.tag == der::context_constructed(0) && v.rest.is_empty())?;
        let spki = spki.whole;
        let (key_type, key_start) = canonical_fixed_length_prefixes()
            .iter()
            .find(|(_, prefix, key_len)| {
                spki.len() == prefix.len() + key_len && spki.starts_with(prefix)
            })
            .map(|(key_type, prefix, _)| (*key_type, prefix.len()))?;
        Some(SubjectKey {
            key_type,
            spki_der: spki.to_vec(),
            key_start,
            algorithm: spki_algorithm(key_type),
        })
    }

    fn from_parsed_spki(spki: &SubjectPublicKeyInfo<'_>, der: &[u8]) -> Result<Self, KeyError> {
        let key_type = classify(spki)?;
        let raw_public_key: &[u8] = &spki.subject_public_key.data;
        // The SPKI goes into the certificate verbatim: accept only its one canonical DER form
        // (the one Go, openssl and rcgen write), so every verifier reads the same key from it.
        // Compared without re-encoding the key: the canonical prefix, then the key itself.
        let prefix = canonical_spki_prefix(key_type, raw_public_key.len());
        let key_start = prefix.len();
        if der.len() != key_start + raw_public_key.len()
            || der[..key_start] != prefix[..]
            || &der[key_start..] != raw_public_key
        {
            return Err(KeyError::Malformed {
                what: "SubjectPublicKeyInfo",
                detail: "not in canonical DER form".into(),
            });
        }
        Ok(SubjectKey {
            key_type,
            spki_der: der.to_vec(),
            key_start,
            algorithm: spki_algorithm(key_type),
        })
    }
}

/// Only tells rcgen how to write the SPKI's AlgorithmIdentifier; for P-521 any of rcgen's three
/// P-521 entries writes the same one.
fn spki_algorithm(key_type: KeyType) -> &'static rcgen::SignatureAlgorithm {
    match key_type {
        KeyType::Rsa3072 | KeyType::Rsa4096 => &rcgen::PKCS_RSA_SHA256,
        KeyType::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
        KeyType::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
        KeyType::EcdsaP521 => &rcgen::PKCS_ECDSA_P521_SHA512,
        KeyType::Ed25519 => &rcgen::PKCS_ED25519,
        KeyType::MlDsa44 => &rcgen::PKCS_ML_DSA_44,
        KeyType::MlDsa65 => &rcgen::PKCS_ML_DSA_65,
        KeyType::MlDsa87 => &rcgen::PKCS_ML_DSA_87,
    }
}

/// The key types whose keys have one length (uncompressed EC points, RFC 8410, RFC 9881): each
/// with its canonical SPKI prefix ([`canonical_spki_prefix`]) and its key's length.
fn canonical_fixed_length_prefixes() -> &'static [(KeyType, Vec<u8>, usize)] {
    static PREFIXES: std::sync::OnceLock<Vec<(KeyType, Vec<u8>, usize)>> =
        std::sync::OnceLock::new();
    PREFIXES.get_or_init(|| {
        [
            (KeyType::EcdsaP256, 65),
            (KeyType::EcdsaP384, 97),
            (KeyType::EcdsaP521, 133),
            (KeyType::Ed25519, 32),
            (KeyType::MlDsa44, 1312),
            (KeyType::MlDsa65, 1952),
            (KeyType::MlDsa87, 2592),
        ]
        .into_iter()
        .map(|(key_type, len)| (key_type, canonical_spki_prefix(key_type, len), len))
        .collect()
    })
}

impl PublicKeyData for SubjectKey {
    fn der_bytes(&self) -> &[u8] {
        self.raw_public_key()
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        self.algorithm
    }
}

fn verify(
    alg: &'static dyn VerificationAlgorithm,
    key: &SubjectKey,
    message: &[u8],
    sig: &[u8],
) -> bool {
    UnparsedPublicKey::new(alg, key.raw_public_key())
        .verify(message, sig)
        .is_ok()
}

/// What is wrong with a CSR file's PEM, in words (the pem crate says `malformedframing`).
fn pem_in_words(error: &pem::PemError) -> String {
    use pem::PemError;
    match error {
        PemError::MalformedFraming | PemError::MissingBeginTag | PemError::MissingEndTag => {
            "neither a PEM block (-----BEGIN CERTIFICATE REQUEST----- … -----END CERTIFICATE \
             REQUEST-----) nor DER"
                .into()
        }
        PemError::MismatchedTags(begin, end) => {
            format!("its PEM block begins as {begin:?} but ends as {end:?}")
        }
        PemError::MissingData => "its PEM block is empty".into(),
        PemError::InvalidData(e) => format!("its PEM block is not valid base64 ({e})"),
        other => format!("its PEM is malformed: {other}"),
    }
}

/// What is wrong with DER that should be a PKCS#10 request, in words (x509-parser says
/// `Parsing Error: NomError(Eof)` or `Der(UnexpectedTag { … })`).
fn csr_der_in_words(error: &x509_parser::nom::Err<x509_parser::error::X509Error>) -> String {
    use x509_parser::asn1_rs::Error as Asn1;
    use x509_parser::error::X509Error;
    let inner = match error {
        x509_parser::nom::Err::Incomplete(_) => None,
        x509_parser::nom::Err::Error(e) | x509_parser::nom::Err::Failure(e) => Some(e),
    };
    match inner {
        None
        | Some(X509Error::NomError(x509_parser::nom::error::ErrorKind::Eof))
        | Some(X509Error::Der(Asn1::Incomplete(_))) => {
            "it ends before its DER does (truncated or cut short)".into()
        }
        Some(X509Error::Der(Asn1::UnexpectedTag { .. } | Asn1::UnexpectedClass { .. })) => {
            "it is not a PKCS#10 certification request (its DER has another structure)".into()
        }
        Some(X509Error::Der(Asn1::InvalidLength)) => {
            "a DER length does not fit the data (the request is damaged)".into()
        }
        Some(other) => format!("it is not a valid PKCS#10 certification request ({other})"),
    }
}

fn parse_csr(der: &[u8]) -> Result<X509CertificationRequest<'_>, KeyError> {
    let (rest, csr) = X509CertificationRequest::from_der(der).map_err(|e| KeyError::Malformed {
        what: "CSR",
        detail: csr_der_in_words(&e),
    })?;
    if !rest.is_empty() {
        return Err(KeyError::Malformed {
            what: "CSR",
            detail: format!("{} trailing bytes", rest.len()),
        });
    }
    Ok(csr)
}

// Object identifiers, as the content octets of a DER OBJECT IDENTIFIER.
const RSA_ENCRYPTION: &[u8] = &oid!(raw 1.2.840.113549.1.1.1);
const EC_PUBLIC_KEY: &[u8] = &oid!(raw 1.2.840.10045.2.1);
const ED25519: &[u8] = &oid!(raw 1.3.101.112);
const P256: &[u8] = &oid!(raw 1.2.840.10045.3.1.7);
const P384: &[u8] = &oid!(raw 1.3.132.0.34);
const P521: &[u8] = &oid!(raw 1.3.132.0.35);
/// id-ml-dsa-44/65/87 (RFC 9881 §2).
pub(crate) const ML_DSA_44: &[u8] = &oid!(raw 2.16.840.1.101.3.4.3.17);
pub(crate) const ML_DSA_65: &[u8] = &oid!(raw 2.16.840.1.101.3.4.3.18);
pub(crate) const ML_DSA_87: &[u8] = &oid!(raw 2.16.840.1.101.3.4.3.19);

fn classify(spki: &SubjectPublicKeyInfo<'_>) -> Result<KeyType, KeyError> {
    let alg = &spki.algorithm.algorithm;
    match alg.as_bytes() {
        RSA_ENCRYPTION => {
            let bits = match spki.parsed() {
                Ok(PublicKey::RSA(rsa)) => rsa.key_size(),
                _ => {
                    return Err(KeyError::Malformed {
                        what: "RSA public key",
                        detail: "cannot parse the modulus".into(),
                    });
                }
            };
            match bits {
                3072 => Ok(KeyType::Rsa3072),
                4096 => Ok(KeyType::Rsa4096),
                n => Err(KeyError::UnsupportedKeyType {
                    found: format!("RSA-{n}"),
                }),
            }
        }
        EC_PUBLIC_KEY => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .ok_or_else(|| KeyError::Malformed {
                    what: "EC public key",
                    detail: "no named curve".into(),
                })?;
            match curve.as_bytes() {
                P256 => Ok(KeyType::EcdsaP256),
                P384 => Ok(KeyType::EcdsaP384),
                P521 => Ok(KeyType::EcdsaP521),
                _ => Err(KeyError::UnsupportedKeyType {
                    found: format!("EC curve {}", curve_name(&curve.to_id_string())),
                }),
            }
        }
        ED25519 => Ok(KeyType::Ed25519),
        ML_DSA_44 => ml_dsa(spki, KeyType::MlDsa44),
        ML_DSA_65 => ml_dsa(spki, KeyType::MlDsa65),
        ML_DSA_87 => ml_dsa(spki, KeyType::MlDsa87),
        _ => Err(KeyError::UnsupportedKeyType {
            found: format!("algorithm {}", algorithm_name(&alg.to_id_string())),
        }),
    }
}

/// An ML-DSA SPKI per RFC 9881 §4: the AlgorithmIdentifier has no parameters, and the BIT
/// STRING is the raw public key of exactly the parameter set's length.
fn ml_dsa(spki: &SubjectPublicKeyInfo<'_>, key_type: KeyType) -> Result<KeyType, KeyError> {
    let (name, length) = key_type
        .ml_dsa_parameters()
        .ok_or_else(|| KeyError::Malformed {
            what: "ML-DSA public key",
            detail: format!("{key_type} is not an ML-DSA key type"),
        })?;
    if spki.algorithm.parameters.is_some() {
        return Err(KeyError::Malformed {
            what: "ML-DSA public key",
            detail: format!(
                "the {name} AlgorithmIdentifier has parameters; RFC 9881 requires them absent"
            ),
        });
    }
    let found = spki.subject_public_key.data.len();
    if found != length || spki.subject_public_key.unused_bits != 0 {
        return Err(KeyError::Malformed {
            what: "ML-DSA public key",
            detail: format!("{name} public key is {found} bytes; it must be {length}"),
        });
    }
    Ok(key_type)
}

/// The DER SubjectPublicKeyInfo of a `key_type` key whose BIT STRING holds `public_key`
/// (RFC 3279 §2.3.1 with NULL parameters for RSA, RFC 5480 named curves, RFC 8410 for Ed25519,
/// RFC 9881 for ML-DSA).
#[cfg(test)]
fn canonical_spki(key_type: KeyType, public_key: &[u8]) -> Vec<u8> {
    let mut out = canonical_spki_prefix(key_type, public_key.len());
    out.extend_from_slice(public_key);
    out
}

/// The canonical SubjectPublicKeyInfo of a `key_type` key of `key_len` bytes up to where the
/// key starts: the outer SEQUENCE's header, the AlgorithmIdentifier, the BIT STRING's header
/// and its unused-bits octet (0).
fn canonical_spki_prefix(key_type: KeyType, key_len: usize) -> Vec<u8> {
    let mut algorithm = Vec::with_capacity(24);
    der::push_nested(&mut algorithm, der::SEQUENCE, |alg| {
        let (oid, curve) = match key_type {
            KeyType::Rsa3072 | KeyType::Rsa4096 => (RSA_ENCRYPTION, None),
            KeyType::EcdsaP256 => (EC_PUBLIC_KEY, Some(P256)),
            KeyType::EcdsaP384 => (EC_PUBLIC_KEY, Some(P384)),
            KeyType::EcdsaP521 => (EC_PUBLIC_KEY, Some(P521)),
            KeyType::Ed25519 => (ED25519, None),
            KeyType::MlDsa44 => (ML_DSA_44, None),
            KeyType::MlDsa65 => (ML_DSA_65, None),
            KeyType::MlDsa87 => (ML_DSA_87, None),
        };
        der::push(alg, der::OID, oid);
        match curve {
            Some(curve) => der::push(alg, der::OID, curve),
            None if key_type.is_rsa() => der::push(alg, der::NULL, &[]),
            None => {}
        }
    });
    let mut bit_string_header = Vec::with_capacity(6);
    bit_string_header.push(der::BIT_STRING);
    // The unused-bits octet, then the key.
    der::push_len(&mut bit_string_header, 1 + key_len);
    // No unused bits.
    bit_string_header.push(0);
    let mut out = Vec::with_capacity(48);
    out.push(der::SEQUENCE);
    der::push_len(
        &mut out,
        algorithm.len() + bit_string_header.len() + key_len,
    );
    out.extend_from_slice(&algorithm);
    out.extend_from_slice(&bit_string_header);
    out
}

fn curve_name(oid: &str) -> String {
    let name = match oid {
        "1.3.132.0.10" => "secp256k1",
        "1.2.840.10045.3.1.1" => "P-192",
        "1.3.132.0.33" => "P-224",
        "1.3.36.3.3.2.8.1.1.7" => "brainpoolP256r1",
        _ => return oid.to_owned(),
    };
    format!("{name} ({oid})")
}

fn algorithm_name(oid: &str) -> String {
    let name = match oid {
        "1.2.840.10040.4.1" => "DSA",
        "1.3.101.113" => "Ed448",
        "1.3.101.110" => "X25519",
        "2.16.840.1.101.3.4.3.20" => "SLH-DSA-SHA2-128s",
        "1.2.840.113549.1.1.10" => "RSASSA-PSS",
        _ => return oid.to_owned(),
    };
    format!("{name} ({oid})")
}

/// The aws-lc-rs algorithm that checks a CSR signed with `sig_oid` by a `key_type` key.
fn csr_verification_algorithm(
    key_type: KeyType,
    sig_oid: &str,
) -> Option<&'static dyn VerificationAlgorithm> {
    use KeyType::*;
    Some(match (key_type, sig_oid) {
        (Rsa3072 | Rsa4096, "1.2.840.113549.1.1.11") => &signature::RSA_PKCS1_2048_8192_SHA256,
        (Rsa3072 | Rsa4096, "1.2.840.113549.1.1.12") => &signature::RSA_PKCS1_2048_8192_SHA384,
        (Rsa3072 | Rsa4096, "1.2.840.113549.1.1.13") => &signature::RSA_PKCS1_2048_8192_SHA512,
        (EcdsaP256, "1.2.840.10045.4.3.2") => &signature::ECDSA_P256_SHA256_ASN1,
        (EcdsaP256, "1.2.840.10045.4.3.3") => &signature::ECDSA_P256_SHA384_ASN1,
        (EcdsaP384, "1.2.840.10045.4.3.2") => &signature::ECDSA_P384_SHA256_ASN1,
        (EcdsaP384, "1.2.840.10045.4.3.3") => &signature::ECDSA_P384_SHA384_ASN1,
        (EcdsaP521, "1.2.840.10045.4.3.2") => &signature::ECDSA_P521_SHA256_ASN1,
        (EcdsaP521, "1.2.840.10045.4.3.3") => &signature::ECDSA_P521_SHA384_ASN1,
        (EcdsaP521, "1.2.840.10045.4.3.4") => &signature::ECDSA_P521_SHA512_ASN1,
        (Ed25519, "1.3.101.112") => &signature::ED25519,
        // RFC 9881 §3: pure ML-DSA with the empty context string, the key's own parameter set.
        (MlDsa44, "2.16.840.1.101.3.4.3.17") => &signature::ML_DSA_44,
        (MlDsa65, "2.16.840.1.101.3.4.3.18") => &signature::ML_DSA_65,
        (MlDsa87, "2.16.840.1.101.3.4.3.19") => &signature::ML_DSA_87,
        _ => return None,
    })
}

/// A freshly generated subject key pair, as kubelet would make for a projection.
pub struct GeneratedKey {
    /// The public half, ready to certify.
    pub public: SubjectKey,
    pair: rcgen::KeyPair,
}

impl fmt::Debug for GeneratedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GeneratedKey")
            .field("public", &self.public)
            .field("private_key", &"<redacted>")
            .finish()
    }
}

impl GeneratedKey {
    /// Generates a key of `key_type` (RSA-4096 takes a second or more).
    pub fn generate(key_type: KeyType) -> Result<Self, KeyError> {
        let pair = match key_type {
            KeyType::Rsa3072 => {
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_3072)
            }
            KeyType::Rsa4096 => {
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_4096)
            }
            KeyType::EcdsaP256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
            KeyType::EcdsaP384 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
            KeyType::EcdsaP521 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P521_SHA512),
            KeyType::Ed25519 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519),
            // aws-lc-rs keeps the seed; the PKCS#8 is RFC 9881's seed form.
            KeyType::MlDsa44 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ML_DSA_44),
            KeyType::MlDsa65 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ML_DSA_65),
            KeyType::MlDsa87 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ML_DSA_87),
        }
        .map_err(|e| KeyError::Malformed {
            what: "generated key",
            detail: e.to_string(),
        })?;
        let public = SubjectKey::from_spki_der(&pair.subject_public_key_info())?;
        Ok(GeneratedKey { public, pair })
    }

    /// The private key as a PKCS#8 v1 `PRIVATE KEY` PEM block (kubelet's credential-bundle
    /// form; see [`pkcs8_v1_der`]).
    pub fn private_key_pem(&self) -> String {
        // The caller writes it out and owns this copy.
        String::clone(&pkcs8_v1_pem(&self.pair))
    }

    /// A DER PKCS#10 CSR with an empty subject, signed by this key (a kubelet stub CSR).
    pub fn stub_csr_der(&self) -> Result<Vec<u8>, KeyError> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .serialize_request(&self.pair)
            .map(|csr| csr.der().to_vec())
            .map_err(|e| KeyError::Malformed {
                what: "CSR",
                detail: e.to_string(),
            })
    }
}

/// The private key of `pair` as PKCS#8 v1 (RFC 5208) DER. aws-lc-rs makes Ed25519 keys as
/// PKCS#8 v2 (RFC 5958, with the public key), which OpenSSL 3.0 (`openssl pkey`, nginx, curl)
/// and pyca/cryptography refuse; kubelet writes v1. ECDSA and RSA keys are v1 already.
pub(crate) fn pkcs8_v1_der(pair: &rcgen::KeyPair) -> Vec<u8> {
    let der = pair.serialized_der();
    if pair.algorithm() == &rcgen::PKCS_ED25519 {
        // The key parsed as Ed25519 when the pair was made, so it parses again; the v1 form
        // holds the same seed.
        if let Some(v1) = signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .ok()
            .and_then(|k| k.to_pkcs8v1().ok())
        {
            return v1.as_ref().to_vec();
        }
    }
    der.to_vec()
}

/// [`pkcs8_v1_der`] as a `PRIVATE KEY` PEM block, LF line endings; wiped when dropped.
pub(crate) fn pkcs8_v1_pem(pair: &rcgen::KeyPair) -> zeroize::Zeroizing<String> {
    pkcs8_pem_block(zeroize::Zeroizing::new(pkcs8_v1_der(pair)))
}

/// PKCS#8 DER as a `PRIVATE KEY` PEM block, LF line endings. Neither the DER nor the text
/// outlives its use unwiped.
pub(crate) fn pkcs8_pem_block(der: zeroize::Zeroizing<Vec<u8>>) -> zeroize::Zeroizing<String> {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    let block = pem::Pem::new("PRIVATE KEY", der.to_vec());
    let text = zeroize::Zeroizing::new(pem::encode_config(&block, config));
    drop(zeroize::Zeroizing::new(block.into_contents()));
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn csr_files_are_pem_or_der() {
        let key = GeneratedKey::generate(KeyType::EcdsaP256).unwrap();
        let der = key.stub_csr_der().unwrap();
        assert_eq!(csr_der(&der).unwrap(), der);
        let pem = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der.clone()));
        assert_eq!(csr_der(pem.as_bytes()).unwrap(), der);
        let cert = pem::encode(&pem::Pem::new("CERTIFICATE", der));
        assert_eq!(
            csr_der(cert.as_bytes()).unwrap_err().to_string(),
            "malformed CSR file: PEM block is \"CERTIFICATE\", expected CERTIFICATE REQUEST"
        );
    }

    use super::*;

    /// RFC 5208 PrivateKeyInfo: `SEQUENCE { INTEGER 0, …`; v2 (RFC 5958) has version 1.
    fn pkcs8_version(der: &[u8]) -> u8 {
        let (_, info) = x509_parser::der_parser::parse_der(der).unwrap_or_else(|e| panic!("{e}"));
        let items = info.as_sequence().unwrap_or_else(|e| panic!("{e}"));
        items[0].as_u32().unwrap_or_else(|e| panic!("{e}")) as u8
    }

    #[test]
    fn every_generated_subject_key_is_pkcs8_v1() {
        for key_type in KeyType::ALL {
            let generated = GeneratedKey::generate(key_type).unwrap_or_else(|e| panic!("{e}"));
            let pem = pem::parse(generated.private_key_pem()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(pem.tag(), "PRIVATE KEY");
            assert_eq!(pkcs8_version(pem.contents()), 0, "{key_type}");
            // The v1 form is the same key: it loads and has the certified public key.
            let reloaded =
                rcgen::KeyPair::try_from(pem.contents()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                reloaded.subject_public_key_info(),
                generated.public.spki_der(),
                "{key_type}"
            );
        }
    }

    #[test]
    fn canonical_spki_is_what_rcgen_and_aws_lc_write() {
        for key_type in KeyType::EVERY {
            let generated = GeneratedKey::generate(key_type).unwrap_or_else(|e| panic!("{e}"));
            let from_rcgen = generated.pair.subject_public_key_info();
            let key = &generated.public;
            assert_eq!(
                canonical_spki(key_type, key.raw_public_key()),
                from_rcgen,
                "{key_type}"
            );
            assert_eq!(key.spki_der(), from_rcgen, "{key_type}");
            assert_eq!(key.subject_public_key_info(), from_rcgen, "{key_type}");
        }
    }

    #[test]
    fn a_non_canonical_spki_is_refused() {
        let key = GeneratedKey::generate(KeyType::Rsa3072).unwrap_or_else(|e| panic!("{e}"));
        // The same RSA key with the AlgorithmIdentifier's NULL parameters left out.
        let mut spki = vec![];
        der::push_nested(&mut spki, der::SEQUENCE, |spki| {
            der::push_nested(spki, der::SEQUENCE, |alg| {
                der::push(alg, der::OID, RSA_ENCRYPTION)
            });
            der::push_nested(spki, der::BIT_STRING, |bits| {
                bits.push(0);
                bits.extend_from_slice(key.public.raw_public_key());
            });
        });
        assert!(matches!(
            SubjectKey::from_spki_der(&spki),
            Err(KeyError::Malformed { detail, .. }) if detail.contains("canonical")
        ));
    }

    /// [`SubjectKey::from_stub_csr`] without its fast path.
    fn parsed_stub_key(der: &[u8]) -> Result<SubjectKey, KeyError> {
        let csr = parse_csr(der)?;
        let spki = &csr.certification_request_info.subject_pki;
        SubjectKey::from_parsed_spki(spki, spki.raw)
    }

    #[test]
    fn the_stub_csr_fast_path_takes_every_fixed_length_key_as_the_full_parse_does() {
        for key_type in KeyType::EVERY {
            let generated = GeneratedKey::generate(key_type).unwrap_or_else(|e| panic!("{e}"));
            let stub = generated.stub_csr_der().unwrap_or_else(|e| panic!("{e}"));
            let fast = SubjectKey::from_canonical_stub_csr(&stub);
            let parsed = parsed_stub_key(&stub).unwrap_or_else(|e| panic!("{key_type}: {e}"));
            if key_type.is_rsa() {
                assert_eq!(fast, None, "RSA keys are left to the full parse");
            } else {
                assert_eq!(fast.as_ref(), Some(&parsed), "{key_type}");
                assert_eq!(parsed.spki_der(), generated.public.spki_der(), "{key_type}");
            }
            assert_eq!(SubjectKey::from_stub_csr(&stub).as_ref(), Ok(&parsed));
            // No proper prefix of the CSR passes the fast path.
            for len in 0..stub.len() {
                assert_eq!(
                    SubjectKey::from_canonical_stub_csr(&stub[..len]),
                    None,
                    "{len}"
                );
            }
        }
    }

    proptest::proptest! {
        /// Whatever a corrupted stub CSR the fast path accepts, its key is the SPKI that the
        /// full parse finds (when the corruption leaves x509-parser a CSR to read).
        #[test]
        fn the_stub_csr_fast_path_never_reads_another_key(
            key in proptest::sample::select(vec![KeyType::EcdsaP256, KeyType::Ed25519, KeyType::MlDsa44]),
            flips in proptest::collection::vec((proptest::num::usize::ANY, 1u8..), 1..4),
        ) {
            let generated = GeneratedKey::generate(key).unwrap_or_else(|e| panic!("{e}"));
            let mut stub = generated.stub_csr_der().unwrap_or_else(|e| panic!("{e}"));
            for (at, xor) in flips {
                let at = at % stub.len();
                stub[at] ^= xor;
            }
            if let Some(fast) = SubjectKey::from_canonical_stub_csr(&stub) {
                if let Ok(csr) = parse_csr(&stub) {
                    proptest::prop_assert_eq!(
                        fast.spki_der(),
                        csr.certification_request_info.subject_pki.raw
                    );
                }
                if let Ok(parsed) = parsed_stub_key(&stub) {
                    proptest::prop_assert_eq!(fast, parsed);
                }
            }
        }
    }
}
