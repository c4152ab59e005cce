//! Certificate authorities: CA certificates, and the issuing CA (key + certificate + chain).

use std::fmt;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DistinguishedName, DnType, IsCa,
    KeyIdMethod, KeyUsagePurpose, PublicKeyData, SerialNumber,
};
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::ParsedExtension;

use crate::backend::{BackendError, CaKey};
use crate::constraints::{NameViolation, Subtrees};
use crate::der;
use crate::leaf::{self, LeafTemplate};
use crate::names::{DnsName, NameError, TrustDomain};
use crate::x509::{self, CertError};

/// Why a CA could not be built or loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    #[error(transparent)]
    Certificate(#[from] CertError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("certificate {subject:?} is not a CA (basicConstraints cA is not true)")]
    NotACa { subject: String },
    #[error("the CA key does not match the public key of certificate {subject:?}")]
    KeyMismatch { subject: String },
    #[error("certificate {subject:?} is not signed by {issuer:?}: {detail}")]
    BrokenChain {
        subject: String,
        issuer: String,
        detail: String,
    },
    #[error("certificate {subject:?} has expired (notAfter {not_after})")]
    Expired {
        subject: String,
        not_after: OffsetDateTime,
    },
    #[error("certificate {subject:?} is not valid yet (notBefore {not_before})")]
    NotYetValid {
        subject: String,
        not_before: OffsetDateTime,
    },
    #[error("certificate {subject:?} may not sign certificates (its keyUsage lacks keyCertSign)")]
    NoKeyCertSign { subject: String },
    #[error(
        "certificate {subject:?} allows {path_len} CA certificate(s) below it \
         (pathLenConstraint) but the chain has {below}"
    )]
    PathLength {
        subject: String,
        path_len: u32,
        below: usize,
    },
    #[error("invalid name constraint {value:?}: it {reason}")]
    NameConstraint {
        value: String,
        reason: crate::names::NameError,
    },
    #[error("building a certificate failed: {0}")]
    Build(String),
}

/// How far a certificate's notBefore may lie ahead of our clock when importing it.
const IMPORT_CLOCK_SKEW: Duration = Duration::minutes(5);

/// Permitted name subtrees (RFC 5280 §4.2.1.10) that a CA places on every certificate below
/// it. Verifiers (OpenSSL, Go, rustls/webpki) then refuse any leaf naming something else, even
/// one signed with a stolen issuing key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameConstraints {
    /// URI subtrees by host (RFC 5280 constrains a URI's host): `cluster.local` permits
    /// exactly `spiffe://cluster.local/…`, i.e. the trust domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permitted_uri_hosts: Vec<String>,
    /// DNS subtrees: `example.com` permits it and every name below it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permitted_dns: Vec<String>,
}

impl NameConstraints {
    /// Constraints for SPIFFE trust domains (`cluster.local`, or `spiffe://cluster.local`),
    /// each a [`TrustDomain`] with no empty label, and DNS subtrees (`example.com` or
    /// `.example.com`), each a [`DnsName`].
    pub fn new(trust_domains: &[String], dns: &[String]) -> Result<Self, CaError> {
        let refused = |value: &String| {
            let value = value.clone();
            move |reason| CaError::NameConstraint { value, reason }
        };
        let uri = trust_domains
            .iter()
            .map(|td| {
                let host = td.strip_prefix("spiffe://").unwrap_or(td);
                let host = host.strip_suffix('/').unwrap_or(host);
                if host.split('.').any(str::is_empty) && !host.is_empty() {
                    return Err(refused(td)(NameError::EmptyLabel));
                }
                host.parse::<TrustDomain>()
                    .map(|h| h.to_string())
                    .map_err(refused(td))
            })
            .collect::<Result<_, _>>()?;
        let dns = dns
            .iter()
            .map(|d| {
                let name = d.strip_prefix('.').unwrap_or(d);
                name.parse::<DnsName>()
                    .map(|n| n.to_string())
                    .map_err(refused(d))
            })
            .collect::<Result<_, _>>()?;
        Ok(NameConstraints {
            permitted_uri_hosts: uri,
            permitted_dns: dns,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.permitted_uri_hosts.is_empty() && self.permitted_dns.is_empty()
    }

    /// The DER of the NameConstraints extension value: `SEQUENCE { permittedSubtrees [0]
    /// SEQUENCE OF GeneralSubtree }`, each `GeneralSubtree { base GeneralName }` with
    /// uniformResourceIdentifier `[6]` or dNSName `[2]`.
    pub fn to_der(&self) -> Vec<u8> {
        let mut out = vec![];
        der::push_nested(&mut out, der::SEQUENCE, |nc| {
            der::push_nested(nc, der::context_constructed(0), |subtrees| {
                let names = self
                    .permitted_uri_hosts
                    .iter()
                    .map(|h| (6, h))
                    .chain(self.permitted_dns.iter().map(|d| (2, d)));
                for (tag, name) in names {
                    der::push_nested(subtrees, der::SEQUENCE, |subtree| {
                        der::push(subtree, der::context_primitive(tag), name.as_bytes())
                    });
                }
            });
        });
        out
    }
}

/// A parsed CA (or any) certificate with the facts podca needs.
#[derive(Clone, PartialEq, Eq)]
pub struct CaCertificate {
    der: Vec<u8>,
    subject: String,
    /// The subject Name as DER, for the issuer field of the certificates this one signs.
    subject_der: Vec<u8>,
    issuer: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    is_ca: bool,
    /// basicConstraints pathLenConstraint.
    path_len: Option<u32>,
    /// Whether keyUsage has keyCertSign; None without a keyUsage extension (RFC 5280: no
    /// restriction).
    key_cert_sign: Option<bool>,
    spki: Vec<u8>,
    subject_key_id: Option<Vec<u8>>,
    /// The URI and DNS subtrees of its nameConstraints, when it has any.
    name_constraints: Option<Subtrees>,
    signature_oid: String,
    tbs: Vec<u8>,
    signature: Vec<u8>,
}

impl fmt::Debug for CaCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaCertificate")
            .field("subject", &self.subject)
            .field("not_after", &self.not_after)
            .field("sha256", &self.fingerprint())
            .finish()
    }
}

impl CaCertificate {
    /// Parses a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        let cert = x509::parse_certificate(der, 0)?;
        let basic_constraints = cert.basic_constraints().ok().flatten();
        let is_ca = basic_constraints.as_ref().is_some_and(|bc| bc.value.ca);
        let path_len = basic_constraints.and_then(|bc| bc.value.path_len_constraint);
        let key_cert_sign = cert
            .key_usage()
            .ok()
            .flatten()
            .map(|ku| ku.value.key_cert_sign());
        let subject_key_id = cert
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
                _ => None,
            });
        let name_constraints = cert
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::NameConstraints(nc) => Some(Subtrees::from_extension(nc)),
                _ => None,
            })
            .filter(|s| !s.is_empty());
        Ok(CaCertificate {
            der: der.to_vec(),
            subject: cert.subject().to_string(),
            subject_der: cert.subject().as_raw().to_vec(),
            issuer: cert.issuer().to_string(),
            not_before: x509::to_offset(cert.validity().not_before),
            not_after: x509::to_offset(cert.validity().not_after),
            is_ca,
            path_len,
            key_cert_sign,
            spki: cert.public_key().raw.to_vec(),
            subject_key_id,
            name_constraints,
            signature_oid: cert.signature_algorithm.algorithm.to_id_string(),
            tbs: cert.tbs_certificate.as_ref().to_vec(),
            signature: cert.signature_value.data.to_vec(),
        })
    }

    /// Parses every certificate of a PEM bundle.
    pub fn all_from_pem(text: &str) -> Result<Vec<Self>, CertError> {
        x509::certificates_from_pem(text)?
            .iter()
            .enumerate()
            .map(|(i, der)| {
                Self::from_der(der).map_err(|e| match e {
                    CertError::Parse { detail, .. } => CertError::Parse { index: i, detail },
                    other => other,
                })
            })
            .collect()
    }

    pub fn der(&self) -> &[u8] {
        &self.der
    }
    pub fn pem(&self) -> String {
        x509::certificates_to_pem([self.der.as_slice()])
    }
    pub fn subject(&self) -> &str {
        &self.subject
    }
    pub fn issuer(&self) -> &str {
        &self.issuer
    }
    pub fn not_before(&self) -> OffsetDateTime {
        self.not_before
    }
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }
    pub fn is_ca(&self) -> bool {
        self.is_ca
    }
    pub fn spki_der(&self) -> &[u8] {
        &self.spki
    }
    /// SHA-256 fingerprint of the DER certificate, lowercase hex.
    pub fn fingerprint(&self) -> String {
        x509::sha256_hex(&self.der)
    }
    /// Whether the certificate names itself as issuer and its signature verifies with its key.
    pub fn is_self_signed(&self) -> bool {
        self.subject == self.issuer && self.verify_signed_by(self).is_ok()
    }

    /// Checks that `issuer`'s key signed this certificate.
    pub fn verify_signed_by(&self, issuer: &CaCertificate) -> Result<(), CaError> {
        x509::verify_signature(
            &issuer.spki,
            &self.signature_oid,
            &self.tbs,
            &self.signature,
        )
        .map_err(|e| CaError::BrokenChain {
            subject: self.subject.clone(),
            issuer: issuer.subject.clone(),
            detail: e.to_string(),
        })
    }
}

/// The rcgen signing key of an issuing CA: a shared [`CaKey`] plus the last backend error.
struct SharedKey {
    key: Arc<dyn CaKey>,
    error: Mutex<Option<BackendError>>,
}

impl PublicKeyData for SharedKey {
    fn der_bytes(&self) -> &[u8] {
        self.key.public_key_raw()
    }
    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        self.key.algorithm().rcgen()
    }
}

impl rcgen::SigningKey for SharedKey {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        self.key.sign(msg).map_err(|e| {
            if let Ok(mut slot) = self.error.lock() {
                *slot = Some(e);
            }
            rcgen::Error::RemoteKeyError
        })
    }
}

/// A CA that signs: its key, its certificate, the intermediates that lead to a root, and the
/// root(s) that relying parties trust.
pub struct IssuingCa {
    certificate: CaCertificate,
    /// Certificates sent after a leaf: the issuing certificate unless it is a root, then every
    /// intermediate up to (never including) the root.
    chain: Vec<CaCertificate>,
    roots: Vec<CaCertificate>,
    /// Signs intermediates.
    issuer: rcgen::Issuer<'static, SharedKey>,
    /// Everything in a leaf that only depends on this CA, encoded once.
    leaf_template: LeafTemplate,
    /// Computed once: every issued chain ends with this PEM, and every ledger record names the
    /// issuer's fingerprint.
    chain_suffix_pem: String,
    fingerprint: String,
    /// The nameConstraints on the path from the issuing certificate to its anchor, with the
    /// subject of the certificate that carries each: every leaf must pass all of them.
    path_constraints: Vec<(String, Subtrees)>,
    /// The CA generation this is, as `podca ca show` numbers them (its store's or Secret's);
    /// `None` for a CA made in code. An intermediate it signs inherits it.
    generation: Option<u32>,
}

impl fmt::Debug for IssuingCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuingCa")
            .field("certificate", &self.certificate)
            .field("chain_len", &self.chain.len())
            .field("roots", &self.roots)
            .field("key", &self.issuer.key().key)
            .finish()
    }
}

impl IssuingCa {
    /// A self-signed root that issues leaves directly.
    pub fn self_signed_root(
        key: Arc<dyn CaKey>,
        common_name: &str,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<Self, CaError> {
        Self::self_signed_root_constrained(
            key,
            common_name,
            now,
            validity,
            &NameConstraints::default(),
        )
    }

    /// [`IssuingCa::self_signed_root`] with name constraints (none when empty).
    pub fn self_signed_root_constrained(
        key: Arc<dyn CaKey>,
        common_name: &str,
        now: OffsetDateTime,
        validity: Duration,
        constraints: &NameConstraints,
    ) -> Result<Self, CaError> {
        let params = ca_params(common_name, now, validity, None, constraints)?;
        let signing = shared(Arc::clone(&key));
        let cert = params
            .self_signed(&signing)
            .map_err(|e| build_error(e, &signing))?;
        let certificate = CaCertificate::from_der(cert.der())?;
        Self::assemble(key, certificate.clone(), vec![], vec![certificate])
    }

    /// Signs a new intermediate CA for `key` with this CA. The intermediate cannot outlive
    /// this CA.
    pub fn sign_intermediate(
        &self,
        key: Arc<dyn CaKey>,
        common_name: &str,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<IssuingCa, CaError> {
        self.sign_intermediate_constrained(
            key,
            common_name,
            now,
            validity,
            &NameConstraints::default(),
        )
    }

    /// [`IssuingCa::sign_intermediate`] with name constraints (none when empty).
    pub fn sign_intermediate_constrained(
        &self,
        key: Arc<dyn CaKey>,
        common_name: &str,
        now: OffsetDateTime,
        validity: Duration,
        constraints: &NameConstraints,
    ) -> Result<IssuingCa, CaError> {
        let not_after_cap = self.certificate.not_after;
        let mut params = ca_params(common_name, now, validity, Some(0), constraints)?;
        if params.not_after > not_after_cap {
            params.not_after = not_after_cap;
        }
        let signing = shared(Arc::clone(&key));
        let cert = params
            .signed_by(&signing, &self.issuer)
            .map_err(|e| build_error(e, self.issuer.key()))?;
        let certificate = CaCertificate::from_der(cert.der())?;
        let mut chain = vec![certificate.clone()];
        chain.extend(self.chain.iter().cloned());
        let mut intermediate = Self::assemble(key, certificate, chain, self.roots.clone())?;
        intermediate.generation = self.generation;
        Ok(intermediate)
    }

    /// Loads an issuing CA from its key and PEM certificates: `chain_pem` holds the issuing
    /// certificate first, then any intermediates, optionally ending with the root;
    /// `roots_pem` holds the trust anchors (may be empty when the chain ends in a root).
    /// Checks that the key matches, that every certificate is a CA and that the chain links up
    /// to one of the roots.
    pub fn from_pem(
        key: Arc<dyn CaKey>,
        chain_pem: &str,
        roots_pem: Option<&str>,
    ) -> Result<Self, CaError> {
        let mut certs = CaCertificate::all_from_pem(chain_pem)?;
        let mut roots = match roots_pem {
            Some(text) if !text.trim().is_empty() => CaCertificate::all_from_pem(text)?,
            _ => vec![],
        };
        if let Some(last) = certs.last()
            && last.is_self_signed()
            && (certs.len() > 1 || roots.is_empty())
        {
            let root = certs.pop().expect("last() returned Some");
            if !roots.contains(&root) {
                roots.push(root.clone());
            }
            if certs.is_empty() {
                // The issuing certificate is itself the root.
                return Self::assemble(key, root, vec![], roots);
            }
        }
        let certificate = certs[0].clone();
        Self::assemble(key, certificate, certs, roots)
    }

    fn assemble(
        key: Arc<dyn CaKey>,
        certificate: CaCertificate,
        chain: Vec<CaCertificate>,
        roots: Vec<CaCertificate>,
    ) -> Result<Self, CaError> {
        if key.public_key_spki() != certificate.spki {
            return Err(CaError::KeyMismatch {
                subject: certificate.subject.clone(),
            });
        }
        for c in chain.iter().chain(&roots).chain([&certificate]) {
            if !c.is_ca {
                return Err(CaError::NotACa {
                    subject: c.subject.clone(),
                });
            }
        }
        // Each chain certificate must be signed by the next, the last by one of the roots.
        for pair in chain.windows(2) {
            pair[0].verify_signed_by(&pair[1])?;
        }
        let top = chain.last().unwrap_or(&certificate);
        let anchor = roots.iter().find(|r| top.verify_signed_by(r).is_ok());
        if anchor.is_none() {
            return Err(CaError::BrokenChain {
                subject: top.subject.clone(),
                issuer: "any configured trust anchor".into(),
                detail: "no root verifies it".into(),
            });
        }
        // Leaves name the CA key by its certificate's subjectKeyIdentifier or, when it has none,
        // by the identifier podca gives every key (rcgen chose the same way).
        let key_id = match &certificate.subject_key_id {
            Some(id) => id.clone(),
            None => leaf::key_identifier(&certificate.spki),
        };
        let leaf_template = LeafTemplate::new(key.algorithm(), &certificate.subject_der, &key_id);
        let issuer =
            rcgen::Issuer::from_ca_cert_der(&certificate.der.as_slice().into(), shared(key))
                .map_err(|e| CaError::Build(e.to_string()))?;
        let chain_suffix_pem = x509::certificates_to_pem(chain.iter().map(|c| c.der.as_slice()));
        let fingerprint = certificate.fingerprint();
        let path_constraints = [&certificate]
            .into_iter()
            .chain(chain.iter().filter(|c| **c != certificate))
            .chain(anchor.filter(|a| **a != certificate))
            .filter_map(|c| Some((c.subject.clone(), c.name_constraints.clone()?)))
            .collect();
        Ok(IssuingCa {
            certificate,
            chain,
            roots,
            issuer,
            leaf_template,
            chain_suffix_pem,
            fingerprint,
            path_constraints,
            generation: None,
        })
    }

    /// This CA, labelled as generation `generation` of its store (what the ledger records).
    pub fn with_generation(mut self, generation: u32) -> Self {
        self.generation = Some(generation);
        self
    }

    /// The CA generation this is, as `podca ca show` numbers them; `None` for a CA made in code.
    pub fn generation(&self) -> Option<u32> {
        self.generation
    }

    /// Whether a leaf for `spiffe_id` with `dns_names` passes the nameConstraints of every
    /// certificate on the issuing path (see [`crate::constraints`]): a verifier would reject
    /// it otherwise, so podca does not sign it.
    pub fn check_names(&self, spiffe_id: &str, dns_names: &[String]) -> Result<(), NameViolation> {
        // The common case, on every issuance: nothing on the path is constrained.
        if self.path_constraints.is_empty() {
            return Ok(());
        }
        let host = crate::constraints::uri_host(spiffe_id);
        for (ca, subtrees) in &self.path_constraints {
            subtrees.check(ca, (spiffe_id, host), dns_names)?;
        }
        Ok(())
    }

    /// Whether some certificate on the issuing path carries nameConstraints.
    pub fn is_name_constrained(&self) -> bool {
        !self.path_constraints.is_empty()
    }

    /// Whether identities of `trust_domain` can be certified at all under this CA's
    /// nameConstraints: a signer whose trust domain they exclude could issue nothing.
    pub fn check_trust_domain(&self, trust_domain: &str) -> Result<(), NameViolation> {
        self.check_names(&format!("spiffe://{trust_domain}"), &[])
    }

    /// The checks an imported CA must pass before anything is written, beyond
    /// [`IssuingCa::from_pem`]'s: along the path from the issuing certificate to the anchor
    /// that signs the top of the chain, every certificate may sign certificates (keyUsage
    /// keyCertSign when it has a keyUsage), allows the CA certificates below it
    /// (pathLenConstraint), and is valid now (notBefore at most 5 minutes ahead).
    pub fn check_importable(&self, now: OffsetDateTime) -> Result<(), CaError> {
        let mut path = vec![&self.certificate];
        path.extend(self.chain.iter().filter(|c| **c != self.certificate));
        let top = path.last().copied().unwrap_or(&self.certificate);
        if let Some(anchor) = self.roots.iter().find(|r| top.verify_signed_by(r).is_ok())
            && anchor != top
        {
            path.push(anchor);
        }
        for (below, c) in path.into_iter().enumerate() {
            if c.key_cert_sign == Some(false) {
                return Err(CaError::NoKeyCertSign {
                    subject: c.subject.clone(),
                });
            }
            if let Some(path_len) = c.path_len
                && below > path_len as usize
            {
                return Err(CaError::PathLength {
                    subject: c.subject.clone(),
                    path_len,
                    below,
                });
            }
            if now > c.not_after {
                return Err(CaError::Expired {
                    subject: c.subject.clone(),
                    not_after: c.not_after,
                });
            }
            if c.not_before > now + IMPORT_CLOCK_SKEW {
                return Err(CaError::NotYetValid {
                    subject: c.subject.clone(),
                    not_before: c.not_before,
                });
            }
        }
        Ok(())
    }

    /// The certificate whose key signs leaves.
    pub fn certificate(&self) -> &CaCertificate {
        &self.certificate
    }
    /// The certificates that follow a leaf in an issued chain (never a root).
    pub fn chain(&self) -> &[CaCertificate] {
        &self.chain
    }
    /// The trust anchors.
    pub fn roots(&self) -> &[CaCertificate] {
        &self.roots
    }
    /// The CA key.
    pub fn key(&self) -> &Arc<dyn CaKey> {
        &self.issuer.key().key
    }
    /// The issuing certificate followed by the chain up to the root, as PEM.
    pub fn chain_pem(&self) -> String {
        let mut ders: Vec<&[u8]> = vec![];
        if self.chain.first() != Some(&self.certificate) {
            ders.push(&self.certificate.der);
        }
        ders.extend(self.chain.iter().map(|c| c.der.as_slice()));
        x509::certificates_to_pem(ders)
    }
    /// The trust anchors as PEM.
    pub fn roots_pem(&self) -> String {
        x509::certificates_to_pem(self.roots.iter().map(|c| c.der.as_slice()))
    }
    /// The earliest notAfter along the chain: no leaf may outlive it.
    pub fn not_after(&self) -> OffsetDateTime {
        self.chain
            .iter()
            .chain([&self.certificate])
            .map(|c| c.not_after)
            .min()
            .unwrap_or(self.certificate.not_after)
    }

    /// The PEM of the certificates that follow a leaf (see [`IssuingCa::chain`]).
    pub(crate) fn chain_suffix_pem(&self) -> &str {
        &self.chain_suffix_pem
    }

    /// SHA-256 fingerprint of the issuing certificate.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    pub(crate) fn leaf_template(&self) -> &LeafTemplate {
        &self.leaf_template
    }
}

fn shared(key: Arc<dyn CaKey>) -> SharedKey {
    SharedKey {
        key,
        error: Mutex::new(None),
    }
}

fn build_error(e: rcgen::Error, signing: &SharedKey) -> CaError {
    let backend = signing.error.lock().map(|mut s| s.take()).unwrap_or(None);
    match backend {
        Some(b) => CaError::Backend(b),
        None => CaError::Build(e.to_string()),
    }
}

/// A random positive serial of 16 bytes (126 bits of entropy; the top two bits are fixed so the
/// DER encoding is always 16 bytes and never negative).
pub(crate) fn random_serial() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    // aws-lc-rs's system RNG only fails if the OS has no entropy source at all.
    aws_lc_rs::rand::fill(&mut bytes).expect("the system random number generator failed");
    bytes[0] = (bytes[0] & 0x3f) | 0x40;
    bytes
}

/// A leaf's serial: 16 bytes, positive, `01` in the top two bits (so its DER encoding is
/// always 16 bytes), then the wall-clock time in Unix milliseconds (46 bits, until the year
/// 4199), then 80 random bits (the CA/Browser Forum's baseline asks for at least 64).
///
/// The time comes first so that serials grow as leaves are issued. The ledger's redb store
/// indexes records by serial, and random serials put each record of a commit into another leaf
/// page of that index, about one 4 KB page written per certificate (issue #17 measured the
/// same for JWT-SVID ids); serials in time order fill the index's last pages.
pub(crate) fn leaf_serial(now: std::time::SystemTime) -> [u8; 16] {
    const MILLIS_BITS: u32 = 46;
    let millis = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
        & ((1 << MILLIS_BITS) - 1);
    let mut random = [0u8; 16];
    crate::random::fill(&mut random[6..]);
    (1u128 << 126 | millis << 80 | u128::from_be_bytes(random)).to_be_bytes()
}

fn ca_params(
    common_name: &str,
    now: OffsetDateTime,
    validity: Duration,
    path_len: Option<u8>,
    constraints: &NameConstraints,
) -> Result<CertificateParams, CaError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "podca");
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(match path_len {
        Some(n) => BasicConstraints::Constrained(n),
        None => BasicConstraints::Unconstrained,
    });
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.key_identifier_method = KeyIdMethod::Sha256;
    params.use_authority_key_identifier_extension = path_len.is_some();
    let start = whole_seconds(now) - Duration::minutes(5);
    params.not_before = start;
    params.not_after = start + validity;
    params.serial_number = Some(SerialNumber::from_slice(&random_serial()));
    if !constraints.is_empty() {
        // RFC 5280 §4.2.1.10: conforming CAs mark it critical.
        let mut ext = CustomExtension::from_oid_content(&[2, 5, 29, 30], constraints.to_der());
        ext.set_criticality(true);
        params.custom_extensions.push(ext);
    }
    Ok(params)
}

/// Truncates to a whole second: certificates and Kubernetes timestamps carry no fractions.
pub fn whole_seconds(t: OffsetDateTime) -> OffsetDateTime {
    t.replace_nanosecond(0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::leaf_serial;

    #[test]
    fn leaf_serials_grow_with_time_and_keep_80_random_bits() {
        let t = UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
        let serial = leaf_serial(t);
        let value = u128::from_be_bytes(serial);
        assert_eq!(serial[0] & 0xc0, 0x40, "positive, always 16 bytes in DER");
        assert_eq!((value >> 80) & ((1 << 46) - 1), 1_800_000_000_123);
        // Later milliseconds sort after, whatever the random part.
        for _ in 0..100 {
            assert!(leaf_serial(t) < leaf_serial(t + Duration::from_millis(1)));
        }
        // The low 80 bits are random: 64 serials of one millisecond are all different, and
        // every one of those bits is seen both set and clear.
        let serials: Vec<u128> = (0..64)
            .map(|_| u128::from_be_bytes(leaf_serial(t)))
            .collect();
        let distinct: std::collections::BTreeSet<_> = serials.iter().collect();
        assert_eq!(distinct.len(), serials.len());
        let random = (1u128 << 80) - 1;
        let ones = serials.iter().fold(0, |acc, s| acc | s) & random;
        let zeros = serials.iter().fold(0, |acc, s| acc | !s) & random;
        assert_eq!((ones, zeros), (random, random));
        // Until the year 4199 the time fits; before 1970 it is zero, still positive.
        assert_eq!(
            leaf_serial(UNIX_EPOCH - Duration::from_secs(1))[0] & 0xc0,
            0x40
        );
    }
}
