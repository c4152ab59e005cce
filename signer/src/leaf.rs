//! The DER of a leaf certificate with the X.509-SVID profile, written directly.
//!
//! Everything that depends only on the issuing CA (signature algorithm, issuer name, authority
//! key identifier) and the extensions every leaf shares are encoded once per CA; a leaf adds its
//! serial, validity, SANs, SPKI (verbatim) and subject key identifier. Building each leaf through
//! rcgen instead cost a third of the CA's P-256 signature (issue #2). The bytes are the ones rcgen
//! wrote, extension order included (a unit test compares the two), except that the issuer Name
//! is now the CA certificate's own subject bytes rather than rcgen's re-encoding of them.

use aws_lc_rs::digest;
use time::{OffsetDateTime, UtcOffset};
use x509_parser::asn1_rs::oid;

use crate::backend::{BackendError, CaAlgorithm};
use crate::der::{self, context_constructed, context_primitive};
use crate::issue::IssueError;

// Object identifiers, as the content octets of a DER OBJECT IDENTIFIER.
const AUTHORITY_KEY_IDENTIFIER: &[u8] = &oid!(raw 2.5.29.35);
const SUBJECT_ALT_NAME: &[u8] = &oid!(raw 2.5.29.17);
const KEY_USAGE: &[u8] = &oid!(raw 2.5.29.15);
const EXTENDED_KEY_USAGE: &[u8] = &oid!(raw 2.5.29.37);
const SUBJECT_KEY_IDENTIFIER: &[u8] = &oid!(raw 2.5.29.14);
const BASIC_CONSTRAINTS: &[u8] = &oid!(raw 2.5.29.19);
/// id-kp-serverAuth
const SERVER_AUTH: &[u8] = &oid!(raw 1.3.6.1.5.5.7.3.1);
/// id-kp-clientAuth
const CLIENT_AUTH: &[u8] = &oid!(raw 1.3.6.1.5.5.7.3.2);
const ECDSA_WITH_SHA256: &[u8] = &oid!(raw 1.2.840.10045.4.3.2);
const ECDSA_WITH_SHA384: &[u8] = &oid!(raw 1.2.840.10045.4.3.3);
/// id-Ed25519
const ED25519: &[u8] = &oid!(raw 1.3.101.112);
/// sha256WithRSAEncryption
const SHA256_WITH_RSA: &[u8] = &oid!(raw 1.2.840.113549.1.1.11);
use crate::keys::{ML_DSA_44, ML_DSA_65, ML_DSA_87};

/// KeyUsage bits (RFC 5280 §4.2.1.3), numbered from the most significant bit of the first octet.
const DIGITAL_SIGNATURE: u8 = 0x80;
const KEY_ENCIPHERMENT: u8 = 0x20;

/// What differs from one leaf to the next.
pub(crate) struct LeafFields<'a> {
    /// Big-endian, positive.
    pub serial: &'a [u8],
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    /// The subject's SubjectPublicKeyInfo DER, copied into the certificate unchanged.
    pub spki: &'a [u8],
    pub subject_key_id: &'a [u8],
    /// keyEncipherment besides digitalSignature (RSA subjects).
    pub key_encipherment: bool,
    /// The only URI SAN.
    pub spiffe_id: &'a str,
    pub dns_names: &'a [String],
    /// iPAddress SANs, after the DNS names (the `kubernetes.io/service-ca` vocabulary).
    pub ip_addresses: &'a [std::net::IpAddr],
    /// Where its renewal chain began (gRPC paths): a private extension, last.
    pub renewal: Option<&'a crate::renewal::RenewalChain>,
}

/// The parts of every leaf an issuing CA signs that are the same for all of them, as DER.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeafTemplate {
    signature_algorithm: Vec<u8>,
    issuer: Vec<u8>,
    authority_key_identifier: Vec<u8>,
    key_usage: Vec<u8>,
    key_usage_rsa: Vec<u8>,
    extended_key_usage: Vec<u8>,
    basic_constraints: Vec<u8>,
    /// The longest signature the CA's algorithm makes, to size a leaf's buffer once.
    signature_len_max: usize,
}

impl LeafTemplate {
    /// The template for a CA whose key signs with `algorithm`, whose certificate's subject Name
    /// is `issuer_name` (DER, copied verbatim so name chaining is byte-exact) and whose key
    /// identifier is `authority_key_id`.
    pub(crate) fn new(algorithm: CaAlgorithm, issuer_name: &[u8], authority_key_id: &[u8]) -> Self {
        let mut signature_algorithm = vec![];
        der::push_nested(&mut signature_algorithm, der::SEQUENCE, |alg| {
            let (oid, null_parameters) = match algorithm {
                CaAlgorithm::EcdsaP256 => (ECDSA_WITH_SHA256, false),
                CaAlgorithm::EcdsaP384 => (ECDSA_WITH_SHA384, false),
                CaAlgorithm::Ed25519 => (ED25519, false),
                // RFC 4055 §5: the RSA PKCS#1 v1.5 algorithms carry NULL parameters.
                CaAlgorithm::RsaSha256 => (SHA256_WITH_RSA, true),
                // RFC 9881 §2: id-ml-dsa-* with parameters absent.
                CaAlgorithm::MlDsa44 => (ML_DSA_44, false),
                CaAlgorithm::MlDsa65 => (ML_DSA_65, false),
                CaAlgorithm::MlDsa87 => (ML_DSA_87, false),
            };
            der::push(alg, der::OID, oid);
            if null_parameters {
                der::push(alg, der::NULL, &[]);
            }
        });
        let mut authority_key_identifier = vec![];
        push_extension(
            &mut authority_key_identifier,
            AUTHORITY_KEY_IDENTIFIER,
            false,
            |v| {
                der::push_nested(v, der::SEQUENCE, |aki| {
                    der::push(aki, context_primitive(0), authority_key_id);
                });
            },
        );
        let key_usage = |bits: u8| {
            let mut ext = vec![];
            // RFC 5280 §4.2.1.3: conforming CAs SHOULD mark keyUsage critical. DER drops the
            // trailing zero bits; the first content octet counts them.
            push_extension(&mut ext, KEY_USAGE, true, |v| {
                der::push(v, der::BIT_STRING, &[bits.trailing_zeros() as u8, bits]);
            });
            ext
        };
        let mut extended_key_usage = vec![];
        push_extension(&mut extended_key_usage, EXTENDED_KEY_USAGE, false, |v| {
            der::push_nested(v, der::SEQUENCE, |purposes| {
                der::push(purposes, der::OID, SERVER_AUTH);
                der::push(purposes, der::OID, CLIENT_AUTH);
            });
        });
        let mut basic_constraints = vec![];
        // An empty SEQUENCE: cA is FALSE by default, and DER omits defaults.
        push_extension(&mut basic_constraints, BASIC_CONSTRAINTS, true, |v| {
            der::push(v, der::SEQUENCE, &[]);
        });
        LeafTemplate {
            signature_algorithm,
            issuer: issuer_name.to_vec(),
            authority_key_identifier,
            key_usage: key_usage(DIGITAL_SIGNATURE),
            key_usage_rsa: key_usage(DIGITAL_SIGNATURE | KEY_ENCIPHERMENT),
            extended_key_usage,
            basic_constraints,
            signature_len_max: signature_len_max(algorithm),
        }
    }

    /// The DER TBSCertificate of a leaf: what the CA key signs.
    #[cfg(test)]
    pub(crate) fn tbs_certificate(&self, leaf: &LeafFields<'_>) -> Result<Vec<u8>, IssueError> {
        let mut out = Vec::new();
        self.push_tbs_certificate(&mut out, leaf, self.tbs_len_estimate(leaf))?;
        Ok(out)
    }

    /// The DER Certificate of a leaf, its TBSCertificate signed by `sign` (the CA key). The
    /// TBSCertificate is written in place inside the Certificate, so its bytes are neither
    /// copied nor moved once written.
    pub(crate) fn certificate(
        &self,
        leaf: &LeafFields<'_>,
        sign: impl FnOnce(&[u8]) -> Result<Vec<u8>, BackendError>,
    ) -> Result<Vec<u8>, IssueError> {
        let tbs_len = self.tbs_len_estimate(leaf);
        let signature_len = self.signature_len_max;
        // The Certificate's content: the TBSCertificate with its header, the algorithm, and
        // the BIT STRING of the signature with its header.
        let content = 4 + tbs_len + self.signature_algorithm.len() + 5 + signature_len;
        let mut out = Vec::with_capacity(content + 4);
        let mut result = Ok(());
        der::push_nested_expecting(&mut out, der::SEQUENCE, content, |cert| {
            let tbs_at = cert.len();
            if let Err(e) = self.push_tbs_certificate(cert, leaf, tbs_len) {
                result = Err(e);
                return;
            }
            let signature = match sign(&cert[tbs_at..]) {
                Ok(signature) => signature,
                Err(e) => {
                    result = Err(e.into());
                    return;
                }
            };
            cert.extend_from_slice(&self.signature_algorithm);
            der::push_nested_expecting(cert, der::BIT_STRING, 1 + signature.len(), |bits| {
                // No unused bits.
                bits.push(0);
                bits.extend_from_slice(&signature);
            });
        });
        result.map(|()| out)
    }

    /// About the length of a TBSCertificate's content for `leaf`: enough that its length
    /// octets are right the first time.
    fn tbs_len_estimate(&self, leaf: &LeafFields<'_>) -> usize {
        let names_len: usize = leaf.dns_names.iter().map(|n| n.len() + 4).sum();
        200 + self.signature_algorithm.len()
            + self.issuer.len()
            + self.authority_key_identifier.len()
            + self.extended_key_usage.len()
            + leaf.spki.len()
            + leaf.spiffe_id.len()
            + names_len
            + 18 * leaf.ip_addresses.len()
            + if leaf.renewal.is_some() { 200 } else { 0 }
    }

    /// Appends the DER TBSCertificate of `leaf`, whose content is about `expected` bytes.
    fn push_tbs_certificate(
        &self,
        out: &mut Vec<u8>,
        leaf: &LeafFields<'_>,
        expected: usize,
    ) -> Result<(), IssueError> {
        // GeneralName's uniformResourceIdentifier and dNSName are IA5Strings.
        if !leaf.spiffe_id.is_ascii() {
            return Err(IssueError::Build(format!(
                "SPIFFE ID {:?} is not ASCII",
                leaf.spiffe_id
            )));
        }
        if let Some(name) = leaf.dns_names.iter().find(|n| !n.is_ascii()) {
            return Err(IssueError::Build(format!("DNS name {name:?} is not ASCII")));
        }
        let mut validity = Vec::with_capacity(2 * 17);
        push_time(&mut validity, leaf.not_before)?;
        push_time(&mut validity, leaf.not_after)?;
        der::push_nested_expecting(out, der::SEQUENCE, expected, |tbs| {
            // version v3 (2)
            der::push_nested(tbs, context_constructed(0), |v| {
                der::push(v, der::INTEGER, &[2])
            });
            der::push_unsigned(tbs, leaf.serial);
            tbs.extend_from_slice(&self.signature_algorithm);
            tbs.extend_from_slice(&self.issuer);
            der::push(tbs, der::SEQUENCE, &validity);
            // X.509-SVID: an empty subject; the SPIFFE ID is the URI SAN.
            der::push(tbs, der::SEQUENCE, &[]);
            tbs.extend_from_slice(leaf.spki);
            der::push_nested(tbs, context_constructed(3), |exts| {
                der::push_nested(exts, der::SEQUENCE, |exts| {
                    self.push_extensions(exts, leaf);
                });
            });
        });
        Ok(())
    }

    fn push_extensions(&self, exts: &mut Vec<u8>, leaf: &LeafFields<'_>) {
        exts.extend_from_slice(&self.authority_key_identifier);
        // Critical because the subject is empty (RFC 5280 §4.2.1.6).
        push_extension(exts, SUBJECT_ALT_NAME, true, |v| {
            der::push_nested(v, der::SEQUENCE, |names| {
                der::push(names, context_primitive(6), leaf.spiffe_id.as_bytes());
                for name in leaf.dns_names {
                    der::push(names, context_primitive(2), name.as_bytes());
                }
                for ip in leaf.ip_addresses {
                    // iPAddress: 4 octets for IPv4, 16 for IPv6 (RFC 5280 §4.2.1.6).
                    match ip {
                        std::net::IpAddr::V4(v4) => {
                            der::push(names, context_primitive(7), &v4.octets());
                        }
                        std::net::IpAddr::V6(v6) => {
                            der::push(names, context_primitive(7), &v6.octets());
                        }
                    }
                }
            });
        });
        exts.extend_from_slice(if leaf.key_encipherment {
            &self.key_usage_rsa
        } else {
            &self.key_usage
        });
        exts.extend_from_slice(&self.extended_key_usage);
        push_extension(exts, SUBJECT_KEY_IDENTIFIER, false, |v| {
            der::push(v, der::OCTET_STRING, leaf.subject_key_id);
        });
        exts.extend_from_slice(&self.basic_constraints);
        if let Some(chain) = leaf.renewal {
            push_extension(exts, crate::renewal::OID, false, |v| chain.push_value(v));
        }
    }
}

/// The longest signature `algorithm` makes: DER ECDSA signatures vary in length, the others
/// do not (RSA by key size: room for 4096 bits). Only a buffer size: a longer one costs a move.
fn signature_len_max(algorithm: CaAlgorithm) -> usize {
    match algorithm {
        CaAlgorithm::EcdsaP256 => 72,
        CaAlgorithm::EcdsaP384 => 104,
        CaAlgorithm::Ed25519 => 64,
        CaAlgorithm::RsaSha256 => 512,
        // FIPS 204 Table 2.
        CaAlgorithm::MlDsa44 => 2420,
        CaAlgorithm::MlDsa65 => 3309,
        CaAlgorithm::MlDsa87 => 4627,
    }
}

/// The key identifier podca (and rcgen) give a key: the first 20 bytes of the SHA-256 of its
/// SubjectPublicKeyInfo DER (RFC 7093 §2 method 1, over the whole SPKI).
pub(crate) fn key_identifier(spki_der: &[u8]) -> Vec<u8> {
    digest::digest(&digest::SHA256, spki_der).as_ref()[..20].to_vec()
}

/// `Extension ::= SEQUENCE { extnID, critical BOOLEAN DEFAULT FALSE, extnValue OCTET STRING }`
fn push_extension(out: &mut Vec<u8>, oid: &[u8], critical: bool, value: impl FnOnce(&mut Vec<u8>)) {
    der::push_nested(out, der::SEQUENCE, |ext| {
        der::push(ext, der::OID, oid);
        if critical {
            der::push(ext, der::BOOLEAN, &[0xff]);
        }
        der::push_nested(ext, der::OCTET_STRING, value);
    });
}

/// A validity time: UTCTime for 1950–2049, GeneralizedTime otherwise (RFC 5280 §4.1.2.5), both
/// in UTC with whole seconds.
fn push_time(out: &mut Vec<u8>, time: OffsetDateTime) -> Result<(), IssueError> {
    let t = time.to_offset(UtcOffset::UTC);
    let year = t.year();
    let (tag, year_digits) = match year {
        1950..=2049 => (der::UTC_TIME, 2),
        0..=9999 => (der::GENERALIZED_TIME, 4),
        _ => {
            return Err(IssueError::Build(format!(
                "validity time {time} cannot be written in a certificate"
            )));
        }
    };
    let mut text = [0u8; 15];
    let mut at = 0;
    let mut digits = |value: u32, width: u32| {
        for i in (0..width).rev() {
            text[at] = b'0' + (value / 10u32.pow(i) % 10) as u8;
            at += 1;
        }
    };
    // `year` is in 0..=9999 here.
    digits(year as u32, year_digits);
    digits(u32::from(u8::from(t.month())), 2);
    digits(u32::from(t.day()), 2);
    digits(u32::from(t.hour()), 2);
    digits(u32::from(t.minute()), 2);
    digits(u32::from(t.second()), 2);
    text[at] = b'Z';
    der::push(out, tag, &text[..=at]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use time::macros::datetime;
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::prelude::{FromDer, X509Certificate, X509Version};

    use super::*;
    use crate::backend::MemoryKey;
    use crate::ca::IssuingCa;
    use crate::keys::{GeneratedKey, KeyType};
    use crate::schedule::Validity;

    fn leaf_fields<'a>(
        spki: &'a [u8],
        key_id: &'a [u8],
        rsa: bool,
        (dns_names, ip_addresses): (&'a [String], &'a [std::net::IpAddr]),
        (not_before, not_after): (OffsetDateTime, OffsetDateTime),
    ) -> LeafFields<'a> {
        LeafFields {
            serial: &[0x5a; 16],
            not_before,
            not_after,
            spki,
            subject_key_id: key_id,
            key_encipherment: rsa,
            spiffe_id: "spiffe://td.example/ns/prod/sa/web",
            dns_names,
            ip_addresses,
            renewal: None,
        }
    }

    /// The same leaf through rcgen, the way podca built leaves before this module existed.
    fn rcgen_tbs(
        issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
        subject: &crate::keys::SubjectKey,
        fields: &LeafFields<'_>,
    ) -> Vec<u8> {
        use rcgen::{ExtendedKeyUsagePurpose as Eku, KeyUsagePurpose as Ku};
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            fields
                .spiffe_id
                .to_owned()
                .try_into()
                .unwrap_or_else(|e| panic!("{e}")),
        )];
        for name in fields.dns_names {
            let name = name.clone().try_into().unwrap_or_else(|e| panic!("{e}"));
            params.subject_alt_names.push(rcgen::SanType::DnsName(name));
        }
        for ip in fields.ip_addresses {
            params
                .subject_alt_names
                .push(rcgen::SanType::IpAddress(*ip));
        }
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.key_usages = vec![Ku::DigitalSignature];
        if fields.key_encipherment {
            params.key_usages.push(Ku::KeyEncipherment);
        }
        params.extended_key_usages = vec![Eku::ServerAuth, Eku::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = fields.not_before;
        params.not_after = fields.not_after;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(fields.serial));
        let cert = params
            .signed_by(subject, issuer)
            .unwrap_or_else(|e| panic!("rcgen: {e}"));
        let (_, parsed) = X509Certificate::from_der(cert.der()).unwrap_or_else(|e| panic!("{e}"));
        parsed.tbs_certificate.as_ref().to_vec()
    }

    fn subjects() -> Vec<GeneratedKey> {
        KeyType::ALL
            .into_iter()
            .map(|k| GeneratedKey::generate(k).unwrap_or_else(|e| panic!("{k}: {e}")))
            .collect()
    }

    #[test]
    fn writes_the_bytes_rcgen_wrote() {
        let now = OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap_or_else(|e| panic!("{e}"));
        let subjects = subjects();
        let ip = |s: &str| {
            s.parse::<std::net::IpAddr>()
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let name_sets: [(Vec<String>, Vec<std::net::IpAddr>); 4] = [
            (vec![], vec![]),
            (
                vec!["web.prod.svc".into(), "web.prod.svc.cluster.local".into()],
                vec![],
            ),
            // Long enough for a long-form SAN length.
            (
                (0..8)
                    .map(|i| format!("replica-{i}.web.prod.svc.cluster.local"))
                    .collect(),
                vec![],
            ),
            // The service-ca vocabulary's IP SANs, v4 and v6.
            (
                vec!["web.prod.svc".into()],
                vec![ip("10.96.0.10"), ip("fd00::7")],
            ),
        ];
        let times = [
            (now, now + time::Duration::hours(24)),
            (
                datetime!(2049-12-31 23:59:59 UTC),
                datetime!(2050-01-01 00:00:00 UTC),
            ),
            (
                datetime!(1949-12-31 23:59:59 UTC),
                datetime!(1950-01-01 00:00:00 UTC),
            ),
        ];
        for algorithm in [
            CaAlgorithm::EcdsaP256,
            CaAlgorithm::EcdsaP384,
            CaAlgorithm::Ed25519,
            CaAlgorithm::RsaSha256,
        ] {
            let pair = match algorithm {
                CaAlgorithm::RsaSha256 => rcgen::KeyPair::generate_rsa_for(
                    &rcgen::PKCS_RSA_SHA256,
                    rcgen::RsaKeySize::_2048,
                ),
                other => rcgen::KeyPair::generate_for(other.rcgen()),
            }
            .unwrap_or_else(|e| panic!("{e}"));
            let key = MemoryKey::from_pem(&pair.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
            let ca = IssuingCa::self_signed_root(
                Arc::new(key),
                "leaf test",
                now,
                time::Duration::days(1),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let issuer = rcgen::Issuer::from_ca_cert_der(&ca.certificate().der().into(), pair)
                .unwrap_or_else(|e| panic!("{e}"));
            for subject in &subjects {
                let key = &subject.public;
                let key_id = key_identifier(key.spki_der());
                for (dns_names, ip_addresses) in &name_sets {
                    for validity in times {
                        let fields = leaf_fields(
                            key.spki_der(),
                            &key_id,
                            key.key_type().is_rsa(),
                            (dns_names, ip_addresses),
                            validity,
                        );
                        let ours = ca
                            .leaf_template()
                            .tbs_certificate(&fields)
                            .unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(
                            ours,
                            rcgen_tbs(&issuer, key, &fields),
                            "{algorithm} CA, {} subject, {} DNS names, {} IPs, {validity:?}",
                            key.key_type(),
                            dns_names.len(),
                            ip_addresses.len()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_field_and_extension_parses_as_the_profile_says() {
        let now = OffsetDateTime::now_utc();
        let root = IssuingCa::self_signed_root(
            Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap_or_else(|e| panic!("{e}"))),
            "leaf test root",
            now,
            time::Duration::days(2),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let ca = root
            .sign_intermediate(
                Arc::new(
                    MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap_or_else(|e| panic!("{e}")),
                ),
                "leaf test issuing",
                now,
                time::Duration::days(1),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, ca_cert) =
            X509Certificate::from_der(ca.certificate().der()).unwrap_or_else(|e| panic!("{e}"));
        let ca_key_id = ca_cert
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("the intermediate has a subjectKeyIdentifier"));
        let validity = Validity {
            not_before: now.replace_nanosecond(0).unwrap_or(now),
            not_after: now.replace_nanosecond(0).unwrap_or(now) + time::Duration::hours(1),
            begin_refresh_at: now + time::Duration::minutes(30),
        };
        let dns_names = vec!["web.prod.svc".to_string(), "web".to_string()];
        let spiffe_id = "spiffe://td.example/ns/prod/sa/web";
        for subject in subjects() {
            let key = &subject.public;
            let kt = key.key_type();
            let issued = ca
                .issue(key, spiffe_id, &dns_names, &validity)
                .unwrap_or_else(|e| panic!("{kt}: {e}"));
            let (rest, leaf) =
                X509Certificate::from_der(&issued.leaf_der).unwrap_or_else(|e| panic!("{kt}: {e}"));
            assert!(rest.is_empty(), "{kt}: trailing bytes");
            assert_eq!(leaf.version(), X509Version::V3, "{kt}");
            let serial = leaf.raw_serial();
            assert_eq!(serial.len(), 16, "{kt}");
            assert_eq!(serial[0] & 0xc0, 0x40, "{kt}: positive, 16 bytes");
            assert_eq!(hex::encode(serial), issued.serial, "{kt}");
            assert_eq!(
                leaf.tbs_certificate.signature.algorithm.to_id_string(),
                "1.2.840.10045.4.3.2",
                "{kt}"
            );
            assert!(leaf.tbs_certificate.signature.parameters.is_none(), "{kt}");
            assert_eq!(
                leaf.signature_algorithm, leaf.tbs_certificate.signature,
                "{kt}"
            );
            assert_eq!(leaf.issuer().as_raw(), ca_cert.subject().as_raw(), "{kt}");
            assert_eq!(
                leaf.validity().not_before.to_datetime(),
                validity.not_before
            );
            assert_eq!(leaf.validity().not_after.to_datetime(), validity.not_after);
            assert!(
                leaf.subject().as_raw() == [0x30, 0x00],
                "{kt}: empty subject"
            );
            assert_eq!(leaf.public_key().raw, key.spki_der(), "{kt}: SPKI verbatim");
            assert!(
                leaf.issuer_uid.is_none() && leaf.subject_uid.is_none(),
                "{kt}"
            );

            let extensions = leaf.extensions();
            let layout: Vec<(String, bool)> = extensions
                .iter()
                .map(|e| (e.oid.to_id_string(), e.critical))
                .collect();
            let expected: Vec<(String, bool)> = [
                ("2.5.29.35", false),
                ("2.5.29.17", true),
                ("2.5.29.15", true),
                ("2.5.29.37", false),
                ("2.5.29.14", false),
                ("2.5.29.19", true),
            ]
            .into_iter()
            .map(|(oid, critical)| (oid.to_string(), critical))
            .collect();
            assert_eq!(
                layout, expected,
                "{kt}: extensions and criticality, in order"
            );
            for ext in extensions {
                match ext.parsed_extension() {
                    ParsedExtension::AuthorityKeyIdentifier(aki) => {
                        let id = aki.key_identifier.as_ref().map(|id| id.0.to_vec());
                        assert_eq!(id, Some(ca_key_id.clone()), "{kt}");
                        assert!(aki.authority_cert_issuer.is_none(), "{kt}");
                        assert!(aki.authority_cert_serial.is_none(), "{kt}");
                    }
                    ParsedExtension::SubjectAlternativeName(san) => {
                        let mut names = san.general_names.iter();
                        assert!(
                            matches!(names.next(), Some(GeneralName::URI(u)) if *u == spiffe_id),
                            "{kt}: the SPIFFE ID comes first"
                        );
                        let dns: Vec<_> = names
                            .map(|n| match n {
                                GeneralName::DNSName(d) => d.to_string(),
                                other => panic!("{kt}: unexpected SAN {other:?}"),
                            })
                            .collect();
                        assert_eq!(dns, dns_names, "{kt}");
                    }
                    ParsedExtension::KeyUsage(ku) => {
                        let expected = if kt.is_rsa() { 0b101 } else { 0b1 };
                        assert_eq!(ku.flags, expected, "{kt}: {ku}");
                    }
                    ParsedExtension::ExtendedKeyUsage(eku) => {
                        assert!(eku.server_auth && eku.client_auth, "{kt}");
                        assert!(!eku.any && eku.other.is_empty(), "{kt}");
                        assert!(!(eku.code_signing || eku.email_protection), "{kt}");
                        assert!(!(eku.time_stamping || eku.ocsp_signing), "{kt}");
                    }
                    ParsedExtension::SubjectKeyIdentifier(ski) => {
                        assert_eq!(ski.0, &key.spki_sha256()[..20], "{kt}");
                    }
                    ParsedExtension::BasicConstraints(bc) => {
                        assert!(!bc.ca && bc.path_len_constraint.is_none(), "{kt}");
                    }
                    other => panic!("{kt}: unexpected extension {other:?}"),
                }
            }
            crate::x509::verify_signature(
                ca.certificate().spki_der(),
                &leaf.signature_algorithm.algorithm.to_id_string(),
                leaf.tbs_certificate.as_ref(),
                &leaf.signature_value.data,
            )
            .unwrap_or_else(|e| panic!("{kt}: {e}"));
        }
    }

    #[test]
    fn names_that_are_not_ia5_strings_are_refused() {
        let template = LeafTemplate::new(CaAlgorithm::EcdsaP256, &[0x30, 0x00], &[1; 20]);
        let times = (
            datetime!(2030-01-01 00:00 UTC),
            datetime!(2030-01-02 00:00 UTC),
        );
        let ascii = vec!["web".to_string()];
        let mut fields = leaf_fields(&[0x30, 0x00], &[2; 20], false, (&ascii, &[]), times);
        assert!(template.tbs_certificate(&fields).is_ok());
        fields.spiffe_id = "spiffe://td.example/ns/prod/sa/wéb";
        assert!(matches!(
            template.tbs_certificate(&fields),
            Err(IssueError::Build(m)) if m.contains("SPIFFE ID")
        ));
        let accented = vec!["wéb".to_string()];
        let fields = leaf_fields(&[0x30, 0x00], &[2; 20], false, (&accented, &[]), times);
        assert!(matches!(
            template.tbs_certificate(&fields),
            Err(IssueError::Build(m)) if m.contains("DNS name")
        ));
    }

    #[test]
    fn the_certificate_holds_the_signed_tbs_whatever_the_signature_length() {
        let template = LeafTemplate::new(CaAlgorithm::EcdsaP256, &[0x30, 0x00], &[1; 20]);
        let times = (
            datetime!(2030-01-01 00:00 UTC),
            datetime!(2030-01-02 00:00 UTC),
        );
        let names = vec!["web".to_string()];
        let fields = leaf_fields(&[0x30, 0x00], &[2; 20], false, (&names, &[]), times);
        let tbs = template
            .tbs_certificate(&fields)
            .unwrap_or_else(|e| panic!("{e}"));
        // Shorter than, as long as and far longer than the 72 bytes the buffer is sized for.
        for len in [8usize, 72, 5000] {
            let mut seen = vec![];
            let der = template
                .certificate(&fields, |signed| {
                    seen = signed.to_vec();
                    Ok(vec![0xab; len])
                })
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(seen, tbs, "the signer is given exactly the TBSCertificate");
            let mut expected = vec![];
            der::push_nested(&mut expected, der::SEQUENCE, |cert| {
                cert.extend_from_slice(&tbs);
                cert.extend_from_slice(&template.signature_algorithm);
                der::push(
                    cert,
                    der::BIT_STRING,
                    &[&[0u8][..], &vec![0xab; len]].concat(),
                );
            });
            assert_eq!(der, expected, "signature of {len} bytes");
        }
        let failed = template.certificate(&fields, |_| {
            Err(BackendError::Unavailable("HSM gone".into()))
        });
        assert!(
            matches!(&failed, Err(IssueError::Backend(BackendError::Unavailable(m))) if m == "HSM gone"),
            "{failed:?}"
        );
    }

    #[test]
    fn times_in_utc_with_the_right_string_type() {
        let encoded = |t: OffsetDateTime| {
            let mut out = vec![];
            push_time(&mut out, t).map(|()| out)
        };
        let utc = |text: &str| [&[der::UTC_TIME, 13][..], text.as_bytes()].concat();
        let generalized = |text: &str| [&[der::GENERALIZED_TIME, 15][..], text.as_bytes()].concat();
        assert_eq!(
            encoded(datetime!(2031-02-03 04:05:06 UTC)),
            Ok(utc("310203040506Z"))
        );
        assert_eq!(
            encoded(datetime!(1950-01-01 00:00:00 UTC)),
            Ok(utc("500101000000Z"))
        );
        assert_eq!(
            encoded(datetime!(2049-12-31 23:59:59 UTC)),
            Ok(utc("491231235959Z"))
        );
        assert_eq!(
            encoded(datetime!(2050-01-01 00:00:00 UTC)),
            Ok(generalized("20500101000000Z"))
        );
        assert_eq!(
            encoded(datetime!(1949-12-31 23:59:59 UTC)),
            Ok(generalized("19491231235959Z"))
        );
        // Offsets are converted to UTC, fractions of a second dropped.
        assert_eq!(
            encoded(datetime!(2031-01-01 01:30:00.75 +02:00)),
            Ok(utc("301231233000Z"))
        );
        assert!(matches!(
            encoded(datetime!(-0001-12-31 23:59:59 UTC)),
            Err(IssueError::Build(m)) if m.ends_with("cannot be written in a certificate")
        ));
    }
}
