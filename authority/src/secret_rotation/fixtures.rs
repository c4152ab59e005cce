//! Test CAs as a Secret would hold them, and simulated time for their keys' gates.

use std::sync::{Arc, Mutex};

use podca_signer::{IssuingCa, MemoryKey};
use time::macros::datetime;
use time::{Duration, OffsetDateTime};

use super::{SECRET_TYPE, SecretCaContents, SecretData};
use crate::trust::Clock;

pub(super) const T0: OffsetDateTime = datetime!(2027-01-01 0:00 UTC);

/// The time the gated keys read; tests move it.
#[derive(Clone)]
pub(super) struct Sim(Arc<Mutex<OffsetDateTime>>);

impl Sim {
    pub(super) fn at(t: OffsetDateTime) -> Self {
        Sim(Arc::new(Mutex::new(t)))
    }

    pub(super) fn now(&self) -> OffsetDateTime {
        *self.0.lock().expect("sim clock")
    }

    pub(super) fn set(&self, t: OffsetDateTime) {
        *self.0.lock().expect("sim clock") = t;
    }

    pub(super) fn clock(&self) -> Clock {
        let sim = self.clone();
        Arc::new(move || sim.now())
    }
}

/// A CA valid for 30 days from T0, as the fields of a Secret.
pub(super) struct Ca {
    pub(super) tls_crt: String,
    pub(super) tls_key: String,
    pub(super) ca_crt: Option<String>,
    /// The key as PKCS#8 DER, for the Debug checks.
    pub(super) pkcs8: Vec<u8>,
    ca: IssuingCa,
}

impl Ca {
    /// A self-signed ECDSA P-256 root that issues leaves directly.
    pub(super) fn root(common_name: &str) -> Ca {
        Ca::root_with(&rcgen::PKCS_ECDSA_P256_SHA256, common_name)
    }

    pub(super) fn root_with(alg: &'static rcgen::SignatureAlgorithm, common_name: &str) -> Ca {
        let (key, tls_key, pkcs8) = key(alg);
        let ca = IssuingCa::self_signed_root(Arc::new(key), common_name, T0, Duration::days(30))
            .expect("self-signed root");
        Ca {
            tls_crt: ca.certificate().pem(),
            tls_key,
            ca_crt: None,
            pkcs8,
            ca,
        }
    }

    /// An intermediate under this root: `tls.crt` holds it alone, `ca.crt` the root.
    pub(super) fn intermediate(&self, common_name: &str) -> Ca {
        let (key, tls_key, pkcs8) = key(&rcgen::PKCS_ECDSA_P256_SHA256);
        let ca = self
            .ca
            .sign_intermediate(Arc::new(key), common_name, T0, Duration::days(30))
            .expect("intermediate");
        Ca {
            tls_crt: ca.certificate().pem(),
            tls_key,
            ca_crt: Some(self.ca.certificate().pem()),
            pkcs8,
            ca,
        }
    }

    pub(super) fn data(&self) -> SecretData<'_> {
        SecretData {
            type_: Some(SECRET_TYPE),
            tls_crt: Some(self.tls_crt.as_bytes()),
            tls_key: Some(self.tls_key.as_bytes()),
            ca_crt: self.ca_crt.as_deref().map(str::as_bytes),
            location: "kubernetes-secret:podca/ca".into(),
        }
    }

    /// What the Secret backend reads from this CA's Secret at the simulated time.
    pub(super) fn parse(&self, sim: &Sim) -> SecretCaContents {
        SecretCaContents::parse(self.data(), sim.now(), sim.clock()).expect("a valid CA Secret")
    }

    /// The issuing certificate's fingerprint.
    pub(super) fn fingerprint(&self) -> String {
        self.ca.fingerprint().to_owned()
    }

    /// The trust anchor's fingerprint.
    pub(super) fn anchor(&self) -> String {
        self.ca.roots()[0].fingerprint()
    }

    pub(super) fn subject(&self) -> String {
        self.ca.certificate().subject().to_owned()
    }
}

/// A fresh key: the key, its PKCS#8 PEM and DER.
fn key(alg: &'static rcgen::SignatureAlgorithm) -> (MemoryKey, String, Vec<u8>) {
    let pair = if alg == &rcgen::PKCS_RSA_SHA256 {
        rcgen::KeyPair::generate_rsa_for(alg, rcgen::RsaKeySize::_2048)
    } else {
        rcgen::KeyPair::generate_for(alg)
    }
    .expect("key generation");
    let pem = pair.serialize_pem();
    let key = MemoryKey::from_pem(&pem).expect("a generated key loads");
    (key, pem, pair.serialize_der())
}
