//! What a CA Secret holds, parsed and checked: the issuing CA, its chain and anchors, and its
//! key behind a [`Gate`] that the state machine opens and closes. The controller reads the
//! Secret and hands its fields over as [`SecretData`]; nothing here knows Kubernetes types.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use podca_signer::x509::CertError;
use podca_signer::{
    BackendError, CaAlgorithm, CaCertificate, CaError, CaKey, IssuingCa, MemoryKey,
};
use time::OffsetDateTime;

use crate::trust::Clock;

use super::Record;

/// The Secret type podca reads.
pub const SECRET_TYPE: &str = "kubernetes.io/tls";

/// A key of the Secret's `data` that podca reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretField {
    /// `tls.crt`: the issuing certificate, optionally followed by intermediates.
    TlsCrt,
    /// `tls.key`: the issuing certificate's private key.
    TlsKey,
    /// `ca.crt`: the trust anchor(s), optional.
    CaCrt,
}

impl SecretField {
    /// The key in the Secret's `data`.
    pub const fn key(self) -> &'static str {
        match self {
            SecretField::TlsCrt => "tls.crt",
            SecretField::TlsKey => "tls.key",
            SecretField::CaCrt => "ca.crt",
        }
    }
}

impl fmt::Display for SecretField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// Why a CA Secret holds no usable CA. No variant carries key material. The inner errors are
/// part of the message, so they are not also given as `source` (a chain would print them
/// twice).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    #[error("type is {found:?}; podca reads {SECRET_TYPE:?} Secrets")]
    WrongType { found: String },
    #[error("{0} is missing")]
    Missing(SecretField),
    #[error("{0} is not PEM text")]
    NotText(SecretField),
    /// `tls.key` is not a private key podca can use (encoding or algorithm).
    #[error("tls.key: {0}")]
    Key(BackendError),
    /// `tls.crt` or `ca.crt` holds something other than PEM certificates.
    #[error("{field}: {error}")]
    Certificates {
        field: SecretField,
        error: CertError,
    },
    #[error("tls.key does not match the public key of certificate {subject:?} in tls.crt")]
    KeyMismatch { subject: String },
    /// A certificate is not a CA, or the chain does not link up to an anchor.
    #[error("tls.crt/ca.crt: {0}")]
    Chain(CaError),
    #[error("certificate {subject:?} has expired (notAfter {not_after})")]
    Expired {
        subject: String,
        not_after: OffsetDateTime,
    },
}

/// The fields of a CA Secret, borrowed from wherever it was read.
pub struct SecretData<'a> {
    /// The Secret's type; `None`: not set, accepted.
    pub type_: Option<&'a str>,
    pub tls_crt: Option<&'a [u8]>,
    pub tls_key: Option<&'a [u8]>,
    pub ca_crt: Option<&'a [u8]>,
    /// Where the key comes from, as its [`CaKey::location`] tells it (names, never bytes).
    pub location: String,
}

impl fmt::Debug for SecretData<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretData")
            .field("type", &self.type_)
            .field("location", &self.location)
            .field("tls_crt_len", &self.tls_crt.map(<[u8]>::len))
            .field("tls_key", &self.tls_key.map(|_| "<redacted>"))
            .field("ca_crt_len", &self.ca_crt.map(<[u8]>::len))
            .finish()
    }
}

/// A validated CA from the Secret, with its (gated) key.
pub struct SecretCaContents {
    ca: Arc<IssuingCa>,
    /// The key itself, ungated: only for sealing the history ([`Self::sign_ungated`]).
    key: Arc<MemoryKey>,
    pub(super) gate: Arc<Gate>,
    pub(super) chain_pem: String,
    pub(super) anchors_pem: String,
}

impl fmt::Debug for SecretCaContents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretCaContents")
            .field("issuing", &self.ca.certificate())
            .field("anchors", &self.ca.roots())
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

impl SecretCaContents {
    /// Parses the CA in a Secret and checks everything: the type, the key (PKCS#8, SEC1 or
    /// PKCS#1 PEM) matching the issuing certificate, every certificate a CA, the chain
    /// verifying up to an anchor (`ca.crt`, or the self-signed top of `tls.crt`), nothing
    /// expired at `now`, and the path's keyUsage, pathLenConstraint and notBefore
    /// ([`IssuingCa::check_importable`], as for a directory import). The key is wrapped in a gate that is closed until the state machine
    /// opens it.
    pub fn parse(
        data: SecretData<'_>,
        now: OffsetDateTime,
        clock: Clock,
    ) -> Result<Self, SecretError> {
        if let Some(t) = data.type_
            && t != SECRET_TYPE
        {
            return Err(SecretError::WrongType {
                found: t.to_owned(),
            });
        }
        let cert_pem = text(SecretField::TlsCrt, data.tls_crt)?
            .ok_or(SecretError::Missing(SecretField::TlsCrt))?;
        let key_pem = text(SecretField::TlsKey, data.tls_key)?
            .ok_or(SecretError::Missing(SecretField::TlsKey))?;
        let roots_pem = text(SecretField::CaCrt, data.ca_crt)?;
        let key = Arc::new(MemoryKey::from_pem(key_pem).map_err(SecretError::Key)?);
        // Parsed on their own first only to tell which field holds bad PEM.
        CaCertificate::all_from_pem(cert_pem).map_err(|error| SecretError::Certificates {
            field: SecretField::TlsCrt,
            error,
        })?;
        if let Some(roots) = roots_pem.filter(|r| !r.trim().is_empty()) {
            CaCertificate::all_from_pem(roots).map_err(|error| SecretError::Certificates {
                field: SecretField::CaCrt,
                error,
            })?;
        }
        let gate = Arc::new(Gate::closed());
        let gated = GatedKey {
            inner: Arc::clone(&key),
            gate: Arc::clone(&gate),
            clock,
            location: data.location,
        };
        let ca =
            IssuingCa::from_pem(Arc::new(gated), cert_pem, roots_pem).map_err(|e| match e {
                CaError::KeyMismatch { subject } => SecretError::KeyMismatch { subject },
                other => SecretError::Chain(other),
            })?;
        for c in ca
            .chain()
            .iter()
            .chain([ca.certificate()])
            .chain(ca.roots())
        {
            if c.not_after() <= now {
                return Err(SecretError::Expired {
                    subject: c.subject().to_owned(),
                    not_after: c.not_after(),
                });
            }
        }
        // What an imported directory CA must pass too: keyCertSign and pathLenConstraint along
        // the path to the anchor, and a notBefore that has come (5 minutes of clock skew).
        ca.check_importable(now).map_err(SecretError::Chain)?;
        let chain_pem = chain_pem(&ca);
        let anchors_pem = ca.roots_pem();
        Ok(SecretCaContents {
            ca: Arc::new(ca),
            key,
            gate,
            chain_pem,
            anchors_pem,
        })
    }

    /// The CA, its key gated.
    pub fn ca(&self) -> &Arc<IssuingCa> {
        &self.ca
    }

    /// Signs `message` with the Secret's key whatever its gate says. The gate keeps certificates
    /// from being signed before relying parties trust the CA; the history's seal is no
    /// certificate and is trusted by podca alone, and it must be written while the gate is
    /// still closed (the history records the window the gate waits for).
    pub(super) fn sign_ungated(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        self.key.sign(message)
    }

    /// Whether `record` is this CA: the same chain and the same anchors.
    pub(super) fn same_ca(&self, record: &Record) -> bool {
        self.chain_pem == record.chain_pem && self.anchors_pem == record.anchors_pem
    }

    /// Whether `other` holds the same CA as this (a Secret rewritten with the same contents).
    pub(super) fn same_as(&self, other: &SecretCaContents) -> bool {
        self.chain_pem == other.chain_pem && self.anchors_pem == other.anchors_pem
    }
}

/// A field's bytes as text; `None` when the field is absent.
fn text(field: SecretField, bytes: Option<&[u8]>) -> Result<Option<&str>, SecretError> {
    bytes
        .map(|b| std::str::from_utf8(b).map_err(|_| SecretError::NotText(field)))
        .transpose()
}

/// The issuing certificate and its intermediates, never the root, as PEM.
fn chain_pem(ca: &IssuingCa) -> String {
    let mut pem = ca.certificate().pem();
    for c in ca.chain() {
        if c != ca.certificate() && !ca.roots().contains(c) {
            pem.push_str(&c.pem());
        }
    }
    pem
}

/// When a CA read from the Secret may sign: not before its anchor propagated, never after it
/// was retired (even through a snapshot someone still holds).
#[derive(Debug)]
pub(super) struct Gate {
    /// Unix seconds; `i64::MAX`: closed.
    open_at: AtomicI64,
    retired: AtomicBool,
}

impl Gate {
    fn closed() -> Self {
        Gate {
            open_at: AtomicI64::new(i64::MAX),
            retired: AtomicBool::new(false),
        }
    }

    pub(super) fn open_from(&self, t: OffsetDateTime) {
        self.open_at.store(t.unix_timestamp(), Ordering::SeqCst);
    }

    pub(super) fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }
}

/// The Secret's key behind a [`Gate`].
struct GatedKey {
    inner: Arc<MemoryKey>,
    gate: Arc<Gate>,
    clock: Clock,
    location: String,
}

impl fmt::Debug for GatedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedKey")
            .field("location", &self.location)
            .field("key", &self.inner)
            .field("gate", &self.gate)
            .finish()
    }
}

impl CaKey for GatedKey {
    fn algorithm(&self) -> CaAlgorithm {
        self.inner.algorithm()
    }

    fn public_key_raw(&self) -> &[u8] {
        self.inner.public_key_raw()
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BackendError> {
        if self.gate.retired.load(Ordering::SeqCst) {
            return Err(BackendError::Unavailable(
                "this CA was retired; its successor signs".into(),
            ));
        }
        let open_at = self.gate.open_at.load(Ordering::SeqCst);
        if (self.clock)().unix_timestamp() < open_at {
            let when = OffsetDateTime::from_unix_timestamp(open_at)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| "a later rotation step".into());
            return Err(BackendError::Unavailable(format!(
                "the CA from {} signs from {when}, once its trust anchor has been published for \
                 the propagation window",
                self.location
            )));
        }
        self.inner.sign(message)
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    /// The gate is two atomic loads and a clock read: as quick as the key behind it.
    fn signs_quickly_in_process(&self) -> bool {
        self.inner.signs_quickly_in_process()
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Ca, Sim, T0};
    use super::*;
    use time::Duration;

    fn parse(data: SecretData<'_>, now: OffsetDateTime) -> Result<SecretCaContents, SecretError> {
        SecretCaContents::parse(data, now, Sim::at(now).clock())
    }

    #[test]
    fn each_check_refuses_with_its_own_error_and_no_key_material() {
        let a = Ca::root("a");
        let b = Ca::root("b");
        let bad_key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        let not_a_cert = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        let i = a.intermediate("i");
        let late = T0 + Duration::days(31);
        // A CA certificate whose keyUsage lacks keyCertSign (as a careless import might have).
        let (no_sign_crt, no_sign_key) = {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let mut params = rcgen::CertificateParams::default();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "no-sign");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
            params.not_before = T0 - Duration::days(1);
            params.not_after = T0 + Duration::days(30);
            (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
        };
        let no_sign = SecretData {
            tls_crt: Some(no_sign_crt.as_bytes()),
            tls_key: Some(no_sign_key.as_bytes()),
            ca_crt: None,
            ..a.data()
        };
        type Check = fn(&SecretError) -> bool;
        #[rustfmt::skip]
        let rows: Vec<(&str, SecretData<'_>, OffsetDateTime, Check, String)> = vec![
            ("another type", SecretData { type_: Some("Opaque"), ..a.data() }, T0,
                |e| matches!(e, SecretError::WrongType { found } if found == "Opaque"),
                "type is \"Opaque\"; podca reads \"kubernetes.io/tls\" Secrets".into()),
            ("no tls.crt", SecretData { tls_crt: None, ..a.data() }, T0,
                |e| matches!(e, SecretError::Missing(SecretField::TlsCrt)),
                "tls.crt is missing".into()),
            ("no tls.key", SecretData { tls_key: None, ..a.data() }, T0,
                |e| matches!(e, SecretError::Missing(SecretField::TlsKey)),
                "tls.key is missing".into()),
            ("tls.key not text", SecretData { tls_key: Some(&[0xff, 0xfe]), ..a.data() }, T0,
                |e| matches!(e, SecretError::NotText(SecretField::TlsKey)),
                "tls.key is not PEM text".into()),
            ("ca.crt not text", SecretData { ca_crt: Some(&[0xff]), ..a.data() }, T0,
                |e| matches!(e, SecretError::NotText(SecretField::CaCrt)),
                "ca.crt is not PEM text".into()),
            ("tls.key no key", SecretData { tls_key: Some(bad_key.as_bytes()), ..a.data() }, T0,
                |e| matches!(e, SecretError::Key(BackendError::InvalidKey(_))),
                "tls.key: CA key unusable: private key: not a PEM private key podca can use \
                 (PKCS#8, SEC1 EC or PKCS#1 RSA; ECDSA P-256/P-384, Ed25519, RSA or \
                 ML-DSA-44/65/87)".into()),
            ("tls.crt no certificate", SecretData { tls_crt: Some(not_a_cert.as_bytes()), ..a.data() }, T0,
                |e| matches!(e, SecretError::Certificates { field: SecretField::TlsCrt, error: CertError::NotACertificate { index: 0, .. } }),
                "tls.crt: PEM block 0 is \"PUBLIC KEY\", expected CERTIFICATE".into()),
            ("ca.crt no certificate", SecretData { ca_crt: Some(b"junk"), ..a.data() }, T0,
                |e| matches!(e, SecretError::Certificates { field: SecretField::CaCrt, error: CertError::Empty }),
                "ca.crt: no CERTIFICATE block found".into()),
            ("another CA's key", SecretData { tls_key: Some(b.tls_key.as_bytes()), ..a.data() }, T0,
                |e| matches!(e, SecretError::KeyMismatch { .. }),
                format!("tls.key does not match the public key of certificate {:?} in tls.crt", a.subject())),
            ("an anchor that did not sign it", SecretData { ca_crt: Some(b.tls_crt.as_bytes()), ..i.data() }, T0,
                |e| matches!(e, SecretError::Chain(CaError::BrokenChain { .. })),
                "tls.crt/ca.crt: ".into()),
            ("expired", a.data(), late,
                |e| matches!(e, SecretError::Expired { .. }),
                format!("certificate {:?} has expired (notAfter ", a.subject())),
            ("not yet valid", a.data(), T0 - Duration::hours(1),
                |e| matches!(e, SecretError::Chain(CaError::NotYetValid { .. })),
                format!("tls.crt/ca.crt: certificate {:?} is not valid yet (notBefore ", a.subject())),
            ("no keyCertSign", no_sign, T0,
                |e| matches!(e, SecretError::Chain(CaError::NoKeyCertSign { .. })),
                "tls.crt/ca.crt: certificate \"CN=no-sign\" may not sign certificates (its keyUsage \
                 lacks keyCertSign)".into()),
        ];
        for (name, data, now, check, text) in rows {
            let e = match parse(data, now) {
                Err(e) => e,
                Ok(c) => panic!("{name}: accepted {c:?}"),
            };
            assert!(check(&e), "{name}: {e:?}");
            let shown = e.to_string();
            assert!(
                shown.starts_with(&text),
                "{name}: {shown:?} should start with {text:?}"
            );
            for key in [&a.pkcs8, &b.pkcs8] {
                podca_signer::backend::contract::assert_debug_hides(
                    &format!("{shown} {e:?}"),
                    podca_signer::backend::contract::Secret::Pkcs8Der(key),
                );
            }
        }
    }

    #[test]
    fn a_secret_with_an_anchor_in_ca_crt_parses() {
        let root = Ca::root("root");
        let intermediate = root.intermediate("intermediate");
        let contents = parse(intermediate.data(), T0).expect("valid");
        assert_eq!(contents.ca().fingerprint(), intermediate.fingerprint());
        assert_eq!(contents.ca().roots().len(), 1);
        assert_eq!(contents.ca().roots()[0].fingerprint(), root.anchor());
        assert_eq!(contents.chain_pem, intermediate.tls_crt, "never the root");
        assert_eq!(contents.ca().key().location(), "kubernetes-secret:podca/ca");
    }

    #[test]
    fn the_gate_holds_signing_until_open_and_forever_after_retirement() {
        let sim = Sim::at(T0);
        let contents = Ca::root("a").parse(&sim);
        let k = contents.ca().key();
        let closed = k.sign(b"x").expect_err("closed at first");
        assert!(closed.is_transient());
        contents.gate.open_from(T0 + Duration::minutes(15));
        let early = k.sign(b"x").expect_err("not yet");
        assert!(early.is_transient());
        assert!(
            early
                .to_string()
                .contains("signs from 2027-01-01 0:15:00.0 +00:00:00"),
            "{early}"
        );
        sim.set(T0 + Duration::minutes(15));
        assert!(k.sign(b"x").is_ok());
        contents.gate.retire();
        let retired = k.sign(b"x").expect_err("retired");
        assert!(retired.is_transient());
        assert!(retired.to_string().contains("retired"), "{retired}");
    }

    #[test]
    fn secret_data_debug_shows_no_key() {
        let a = Ca::root("a");
        let debug = format!("{:?}", a.data());
        assert!(debug.contains("<redacted>"), "{debug}");
        podca_signer::backend::contract::assert_debug_hides(
            &debug,
            podca_signer::backend::contract::Secret::Pkcs8Der(&a.pkcs8),
        );
        let body = a.tls_key.lines().nth(1).expect("a key line");
        assert!(!debug.contains(body), "{debug}");
    }
}
