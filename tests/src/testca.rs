//! A tiny test CA (rcgen) to play the signer in emulator tests: issues
//! leaves for a kubelet key and builds the `/status` patch the spec wants.

use crate::emulator::pcr::fmt_time;
use crate::kubelet::{KubeletError, SubjectKey};
use serde_json::{Value, json};
use time::OffsetDateTime;

fn kerr(e: impl std::fmt::Display) -> KubeletError {
    KubeletError(e.to_string())
}

/// A self-signed P-256 root.
#[derive(Debug)]
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The root certificate, PEM.
    pub cert_pem: String,
}

impl TestCa {
    pub fn new(common_name: &str) -> Result<Self, KubeletError> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(kerr)?;
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(3650);
        let cert = params.self_signed(&key).map_err(kerr)?;
        let cert_pem = cert.pem();
        Ok(Self {
            issuer: rcgen::Issuer::new(params, key),
            cert_pem,
        })
    }

    /// A leaf for `subject`'s public key, valid [not_before, not_after],
    /// with a SPIFFE URI SAN and no subject. Returns PEM.
    pub fn issue(
        &self,
        subject: &SubjectKey,
        spiffe_id: &str,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<String, KubeletError> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(spiffe_id).map_err(kerr)?,
        )];
        params.not_before = not_before;
        params.not_after = not_after;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        ];
        let cert = params
            .signed_by(subject.rcgen_key(), &self.issuer)
            .map_err(kerr)?;
        Ok(cert.pem())
    }

    /// A merge-patch body for `/status` that issues `subject` a
    /// `lifetime_secs` certificate with notBefore = now − 60 s and
    /// beginRefreshAt halfway.
    pub fn issue_patch(
        &self,
        subject: &SubjectKey,
        now: OffsetDateTime,
        lifetime_secs: i64,
    ) -> Result<Value, KubeletError> {
        let nb = now.replace_nanosecond(0).map_err(kerr)? - time::Duration::seconds(60);
        let na = nb + time::Duration::seconds(lifetime_secs);
        let bra = nb + time::Duration::seconds(lifetime_secs / 2);
        let chain = self.issue(subject, "spiffe://example.com/ns/test/sa/test", nb, na)?;
        Ok(json!({"status": {
            "conditions": [{"type": "Issued", "status": "True", "reason": "Issued", "message": "issued by the test CA", "lastTransitionTime": fmt_time(now)}],
            "certificateChain": chain,
            "notBefore": fmt_time(nb),
            "notAfter": fmt_time(na),
            "beginRefreshAt": fmt_time(bra),
        }}))
    }
}

/// A merge-patch body that denies with `reason`.
pub fn deny_patch(reason: &str, message: &str, now: OffsetDateTime) -> Value {
    json!({"status": {"conditions": [{"type": "Denied", "status": "True", "reason": reason, "message": message, "lastTransitionTime": fmt_time(now)}]}})
}
