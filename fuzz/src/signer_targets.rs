//! The signer's parsers of untrusted input, one function each. The cargo-fuzz targets
//! (`fuzz/fuzz_targets/*.rs`) are thin wrappers over them, and the stable property tests
//! (`signer/tests/properties.rs`, which include this file) call the same functions on inputs
//! grown from [`seeds`]. Each function returns for every input — a panic is the bug — and
//! asserts the roundtrip where an encoder exists. Errors are the parsers' own typed errors.
//!
//! Plain Rust with no fuzzing crate, so it builds on stable.

use podca_signer::backend::Pkcs11Uri;
use podca_signer::keys::SubjectKey;
use podca_signer::{CaCertificate, MemoryKey, x509};

/// DER SubjectPublicKeyInfo (legacy `pkixPublicKey`).
pub fn spki(data: &[u8]) {
    if let Ok(key) = SubjectKey::from_spki_der(data) {
        // Only the canonical encoding is accepted, and it is kept byte for byte.
        assert_eq!(key.spki_der(), data, "an accepted SPKI is kept verbatim");
        let again = SubjectKey::from_spki_der(key.spki_der());
        assert_eq!(
            again.as_ref(),
            Ok(&key),
            "an accepted SPKI parses again the same"
        );
    }
}

/// DER PKCS#10 CSR: the PodCertificateRequest stub path and the gRPC verified path.
pub fn csr(data: &[u8]) {
    let stub = SubjectKey::from_stub_csr(data);
    let verified = SubjectKey::from_csr_verified(data);
    if let Ok(key) = &verified {
        // A CSR whose signature verifies holds the same key on the path that skips the check.
        assert_eq!(
            stub.as_ref(),
            Ok(key),
            "verified and stub CSR paths disagree"
        );
        spki(key.spki_der());
    }
}

/// PEM text of certificates (bundles, chains, `root.pem`).
pub fn pem_certificates(text: &str) {
    if let Ok(ders) = x509::certificates_from_pem(text) {
        let again = x509::certificates_to_pem(ders.iter().map(Vec::as_slice));
        assert_eq!(
            x509::certificates_from_pem(&again).as_ref(),
            Ok(&ders),
            "PEM certificates roundtrip"
        );
        for der in &ders {
            certificate_der(der);
        }
    }
    let _ = CaCertificate::all_from_pem(text);
}

/// One DER certificate.
pub fn certificate_der(data: &[u8]) {
    if let Ok(cert) = CaCertificate::from_der(data) {
        assert_eq!(cert.der(), data, "a parsed certificate keeps its DER");
        let again = CaCertificate::all_from_pem(&cert.pem());
        assert_eq!(again, Ok(vec![cert]), "certificate PEM roundtrip");
    }
}

/// An RFC 7512 PKCS#11 URI (`[ca] pkcs11_uri`, `--pkcs11-uri`).
pub fn pkcs11_uri(text: &str) {
    if let Ok(uri) = Pkcs11Uri::parse(text) {
        let canonical = uri.to_string();
        assert_eq!(
            Pkcs11Uri::parse(&canonical).as_ref(),
            Ok(&uri),
            "PKCS#11 URI roundtrip through {canonical:?}"
        );
    }
}

/// A PEM private key (imported CA keys, `tls.key`).
pub fn private_key_pem(text: &str) {
    let _ = MemoryKey::from_pem(text);
}

/// Valid examples of each input, for the property tests to mutate (and to seed a fuzz corpus).
pub mod seeds {
    use podca_signer::keys::{GeneratedKey, KeyType};

    /// A DER SPKI and a DER stub CSR for every key type podca certifies.
    pub fn keys() -> Vec<(Vec<u8>, Vec<u8>)> {
        KeyType::ALL
            .into_iter()
            // RSA-4096 generation is slow and adds no shape RSA-3072 lacks.
            .filter(|k| *k != KeyType::Rsa4096)
            .map(|k| {
                let key = GeneratedKey::generate(k).expect("key generation works");
                let csr = key.stub_csr_der().expect("a stub CSR");
                (key.public.spki_der().to_vec(), csr)
            })
            .collect()
    }

    /// A two-level CA's chain and anchors as PEM text (what `root.pem` and `issuing.pem` hold).
    pub fn ca_pem() -> String {
        use std::sync::Arc;
        let now = time::OffsetDateTime::now_utc();
        let key = || {
            Arc::new(
                podca_signer::MemoryKey::generate(podca_signer::CaAlgorithm::EcdsaP256)
                    .expect("key generation works"),
            )
        };
        let root = podca_signer::IssuingCa::self_signed_root(
            key(),
            "seed root",
            now,
            time::Duration::days(30),
        )
        .expect("a root");
        let issuing = root
            .sign_intermediate(key(), "seed issuing", now, time::Duration::days(10))
            .expect("an intermediate");
        issuing.chain_pem() + &issuing.roots_pem()
    }

    /// PKCS#11 URIs as operators write them.
    pub const PKCS11_URIS: &[&str] = &[
        "pkcs11:token=podca;object=podca-ca",
        "pkcs11:token=podca;object=podca-ca?module-path=/usr/lib/softhsm/libsofthsm2.so",
        "pkcs11:token=My%20Token;id=%01%02;type=private",
        "pkcs11:manufacturer=SoftHSM;model=x;serial=1234;token=t;object=o?module-path=/opt/p11.so",
    ];

    /// Applies byte-level mutations (the shapes libFuzzer makes): `(kind, position, byte)`
    /// overwrites, inserts, deletes or truncates at `position` modulo the length.
    pub fn mutate(seed: &[u8], ops: &[(u8, usize, u8)]) -> Vec<u8> {
        let mut out = seed.to_vec();
        for &(kind, position, byte) in ops {
            let at = if out.is_empty() {
                0
            } else {
                position % out.len()
            };
            match kind % 4 {
                0 if !out.is_empty() => out[at] = byte,
                1 => out.insert(at, byte),
                2 if !out.is_empty() => {
                    out.remove(at);
                }
                3 => out.truncate(at),
                _ => out.push(byte),
            }
        }
        out
    }
}
