//! The gRPC listener's own TLS certificate (`[grpc] tls = "self-issued"`): what podca issues
//! itself from its active CA, when it renews it, and the task that keeps it current.
//!
//! * The key is a fresh P-256 key made in memory for every certificate; the CA key is used only
//!   through [`podca_signer::CaKey::sign`] (via [`IssuingCa::issue`]), so with an HSM-held CA the
//!   HSM signs the certificate and nothing else.
//! * SANs: podca's own SPIFFE ID (the X.509-SVID profile every podca leaf has) and the DNS names
//!   of its Service.
//! * Renewed at half its life, and at once when the active CA changes (a rotation or reload), so
//!   the served chain always ends at an anchor clients currently hold.
//!
//! The rules ([`ServingIdentity::validity`], [`ServingCert::renewal_due`]) are pure; the task
//! ([`run`]) only waits and hands new certificates to whoever serves them (the gRPC crate
//! turns them into a rustls `CertifiedKey`).

use std::sync::Arc;

use podca_signer::keys::GeneratedKey;
use podca_signer::ledger::{LedgerRecord, RecordContext, Source};
use podca_signer::names::SpiffeId;
use podca_signer::{IssuedCertificate, IssuingCa, KeyType, Validity};
use time::{Duration, OffsetDateTime};
use tokio::sync::watch;
use tracing::{error, info};

use crate::ledger::{LedgerHandle, LedgerUnavailable};
use crate::trust::{CaHandle, CaSnapshot, Clock};

/// How far notBefore is moved into the past, for clients whose clock runs a little behind.
pub const BACKDATE: Duration = Duration::seconds(60);
/// The shortest lifetime `[grpc] tls_lifetime_seconds` accepts.
pub const MIN_LIFETIME: Duration = Duration::minutes(10);
/// The default `[grpc] tls_lifetime_seconds`.
pub const DEFAULT_LIFETIME: Duration = Duration::hours(24);
/// Wait before trying again after a failed issuance (e.g. an HSM that is unavailable).
pub const RETRY_AFTER: Duration = Duration::seconds(10);

/// Who the serving certificate names and how long it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingIdentity {
    /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
    pub spiffe_id: String,
    pub dns_names: Vec<String>,
    pub lifetime: Duration,
}

/// Why no serving certificate could be issued. The certificate in force (if any) stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServingCertError {
    #[error(
        "the active CA expires at {ca_not_after}: too soon for a serving certificate (at least \
         {min} s from {not_before}); rotate the CA"
    )]
    CaExpiresTooSoon {
        ca_not_after: OffsetDateTime,
        not_before: OffsetDateTime,
        min: i64,
    },
    #[error("generating the serving key failed: {0}")]
    Key(String),
    #[error("issuing the serving certificate failed: {0}")]
    Issue(String),
}

/// The DNS names a Service `service` in `namespace` answers to inside the cluster.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

impl ServingIdentity {
    /// The validity of a certificate issued at `now` by `ca`: backdated by [`BACKDATE`] (never
    /// before the CA's notBefore), `lifetime` long but never past the CA's notAfter, renewed at
    /// half of what it got.
    pub fn validity(
        &self,
        ca_not_before: OffsetDateTime,
        ca_not_after: OffsetDateTime,
        now: OffsetDateTime,
    ) -> Result<Validity, ServingCertError> {
        let not_before = (whole_seconds(now) - BACKDATE).max(whole_seconds(ca_not_before));
        let ca_not_after = whole_seconds(ca_not_after);
        let not_after = (not_before + self.lifetime).min(ca_not_after);
        // Below this, the certificate would need renewing every few minutes.
        if not_after - not_before < MIN_LIFETIME {
            return Err(ServingCertError::CaExpiresTooSoon {
                ca_not_after,
                not_before,
                min: MIN_LIFETIME.whole_seconds(),
            });
        }
        let half = Duration::seconds((not_after - not_before).whole_seconds() / 2);
        Ok(Validity {
            not_before,
            not_after,
            begin_refresh_at: not_before + half,
        })
    }

    /// Issues a serving certificate from `ca` for a new in-memory P-256 key.
    pub fn issue(
        &self,
        ca: &IssuingCa,
        now: OffsetDateTime,
    ) -> Result<ServingCert, ServingCertError> {
        let validity = self.validity(ca.certificate().not_before(), ca.not_after(), now)?;
        let key = GeneratedKey::generate(KeyType::EcdsaP256)
            .map_err(|e| ServingCertError::Key(e.to_string()))?;
        let issued = ca
            .issue(&key.public, &self.spiffe_id, &self.dns_names, &validity)
            .map_err(|e| ServingCertError::Issue(e.to_string()))?;
        let chain_der = pem::parse_many(&issued.chain_pem)
            .map_err(|e| ServingCertError::Issue(format!("the issued chain: {e}")))?
            .into_iter()
            .map(pem::Pem::into_contents)
            .collect();
        let key_pkcs8_der = pem::parse(key.private_key_pem())
            .map_err(|e| ServingCertError::Key(format!("the generated key: {e}")))?
            .into_contents();
        Ok(ServingCert {
            chain_der,
            key_pkcs8_der,
            validity,
            serial: issued.serial.clone(),
            issuer_fingerprint: ca.fingerprint().to_owned(),
            issued: Some(Box::new(issued)),
        })
    }
}

/// A serving certificate and its key.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingCert {
    /// The leaf, then the CA's chain up to but excluding the root (clients hold the anchors).
    pub chain_der: Vec<Vec<u8>>,
    /// The private key, PKCS#8 DER. Never logged (see the `Debug` impl).
    pub key_pkcs8_der: Vec<u8>,
    pub validity: Validity,
    /// Serial number, lowercase hex.
    pub serial: String,
    /// SHA-256 fingerprint of the CA certificate that issued it.
    pub issuer_fingerprint: String,
    /// What the ledger records of it (no key); `None` for one built by hand (tests).
    pub issued: Option<Box<IssuedCertificate>>,
}

/// Where serving certificates are recorded (issue #40): the ledger, like every certificate
/// podca signs, under the name of the signer whose CA issued it.
#[derive(Debug, Clone)]
pub struct ServingLedger {
    pub ledger: LedgerHandle,
    pub signer: String,
}

impl ServingLedger {
    /// Records `cert`, issued at `now` by CA generation `generation` (source `serving`,
    /// requester `podca`).
    pub async fn record(
        &self,
        cert: &ServingCert,
        generation: Option<u32>,
        now: OffsetDateTime,
    ) -> Result<(), LedgerUnavailable> {
        let Some(issued) = &cert.issued else {
            return Ok(());
        };
        let (namespace, service_account) = issued
            .spiffe_id
            .parse::<SpiffeId>()
            .map(|id| (id.namespace.to_string(), id.service_account.to_string()))
            .unwrap_or_default();
        let context = RecordContext {
            source: Source::Serving,
            signer: self.signer.clone(),
            identity: issued.spiffe_id.clone(),
            requester: Some("podca".into()),
            namespace,
            service_account,
            pod_name: None,
            pod_uid: None,
            node_name: None,
            request_uid: None,
            request_name: None,
            ca_generation: generation.map(u64::from),
            issuer_fingerprint: Some(cert.issuer_fingerprint.clone()),
            auth: None,
            replica: podca_signer::ledger::replica_identity(),
            time: now,
        };
        self.ledger
            .record(LedgerRecord::issued(&context, issued))
            .await
    }
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field(
                "chain_der",
                &format_args!("<{} certificates>", self.chain_der.len()),
            )
            .field("key_pkcs8_der", &"<redacted>")
            .field("validity", &self.validity)
            .field("serial", &self.serial)
            .field("issuer_fingerprint", &self.issuer_fingerprint)
            .finish_non_exhaustive()
    }
}

impl ServingCert {
    /// Whether a new certificate is due at `now` while `active_ca_fingerprint` is the active
    /// CA: half its life has passed, or another CA is active now.
    pub fn renewal_due(&self, active_ca_fingerprint: &str, now: OffsetDateTime) -> bool {
        now >= self.validity.begin_refresh_at || self.issuer_fingerprint != active_ca_fingerprint
    }
}

fn whole_seconds(t: OffsetDateTime) -> OffsetDateTime {
    podca_signer::ca::whole_seconds(t)
}

/// Keeps `current` holding a serving certificate from the active CA until `stop` turns true:
/// renews it when [`ServingCert::renewal_due`] says so (checked when the CA changes and at the
/// refresh time); a failed issuance is logged and retried after [`RETRY_AFTER`], the old
/// certificate staying in force.
pub async fn run(
    identity: ServingIdentity,
    ca: CaHandle,
    clock: Clock,
    current: watch::Sender<Arc<ServingCert>>,
    ledger: Option<ServingLedger>,
    mut stop: watch::Receiver<bool>,
) {
    let mut snapshots = ca.subscribe();
    // The serial of the last certificate the ledger took: the first one is recorded here, at
    // once; a renewal is recorded before it is served.
    let mut recorded: Option<String> = None;
    loop {
        let snapshot: Arc<CaSnapshot> = Arc::clone(&snapshots.borrow_and_update());
        let now = clock();
        let cert = Arc::clone(&current.borrow());
        let mut wait = cert.validity.begin_refresh_at - now;
        if let Some(ledger) = &ledger
            && recorded.as_deref() != Some(cert.serial.as_str())
        {
            match ledger.record(&cert, snapshot.ca_generation, now).await {
                Ok(()) => recorded = Some(cert.serial.clone()),
                Err(e) => {
                    error!(error = %e, serial = %cert.serial, "the ledger cannot record the gRPC serving certificate; retrying");
                    wait = wait.min(RETRY_AFTER);
                }
            }
        }
        if cert.renewal_due(snapshot.ca.fingerprint(), now) {
            match identity.issue(&snapshot.ca, now) {
                Ok(new) => {
                    let taken = match &ledger {
                        Some(ledger) => ledger.record(&new, snapshot.ca_generation, now).await,
                        None => Ok(()),
                    };
                    match taken {
                        Ok(()) => {
                            info!(
                                serial = %new.serial,
                                not_after = %new.validity.not_after,
                                issuer = %new.issuer_fingerprint,
                                "gRPC serving certificate renewed"
                            );
                            wait = new.validity.begin_refresh_at - now;
                            recorded = Some(new.serial.clone());
                            current.send_replace(Arc::new(new));
                        }
                        // Never served unrecorded: the current one stays.
                        Err(e) => {
                            error!(error = %e, "the ledger cannot record the renewed gRPC serving certificate; the current one stays");
                            wait = RETRY_AFTER;
                        }
                    }
                }
                Err(e) => {
                    error!(error = %e, "renewing the gRPC serving certificate failed; the current one stays");
                    wait = RETRY_AFTER;
                }
            }
        }
        let wait = std::time::Duration::try_from(wait.max(Duration::seconds(1)))
            .unwrap_or(std::time::Duration::from_secs(1));
        tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => return,
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use podca_signer::SubjectKey;
    use time::macros::datetime;

    fn identity(lifetime: Duration) -> ServingIdentity {
        ServingIdentity {
            spiffe_id: podca_signer::names::spiffe_id("cluster.local", "podca-system", "podca"),
            dns_names: service_dns_names("podca", "podca-system"),
            lifetime,
        }
    }

    const NOW: OffsetDateTime = datetime!(2026-12-01 12:00:00.500 UTC);

    #[test]
    fn names() {
        assert_eq!(
            identity(DEFAULT_LIFETIME).spiffe_id,
            "spiffe://cluster.local/ns/podca-system/sa/podca"
        );
        assert_eq!(
            service_dns_names("podca", "podca-system"),
            [
                "podca",
                "podca.podca-system",
                "podca.podca-system.svc",
                "podca.podca-system.svc.cluster.local"
            ]
        );
    }

    #[test]
    fn validity_is_backdated_whole_seconds_and_renews_at_half() {
        let v = identity(Duration::hours(24))
            .validity(
                datetime!(2026-01-01 0:00 UTC),
                datetime!(2027-01-01 0:00 UTC),
                NOW,
            )
            .unwrap();
        assert_eq!(v.not_before, datetime!(2026-12-01 11:59:00 UTC));
        assert_eq!(v.not_after, datetime!(2026-12-02 11:59:00 UTC));
        assert_eq!(v.begin_refresh_at, datetime!(2026-12-01 23:59:00 UTC));
    }

    #[test]
    fn validity_never_starts_before_the_ca_nor_outlives_it() {
        let v = identity(Duration::hours(24))
            .validity(
                datetime!(2026-12-01 11:59:30 UTC),
                datetime!(2026-12-01 18:00:00 UTC),
                NOW,
            )
            .unwrap();
        assert_eq!(v.not_before, datetime!(2026-12-01 11:59:30 UTC));
        assert_eq!(v.not_after, datetime!(2026-12-01 18:00:00 UTC));
        assert_eq!(v.begin_refresh_at, datetime!(2026-12-01 14:59:45 UTC));
    }

    #[test]
    fn a_ca_about_to_expire_is_an_error() {
        let error = identity(Duration::hours(24))
            .validity(
                datetime!(2026-01-01 0:00 UTC),
                datetime!(2026-12-01 12:05 UTC),
                NOW,
            )
            .unwrap_err();
        assert!(
            matches!(error, ServingCertError::CaExpiresTooSoon { min: 600, .. }),
            "{error:?}"
        );
    }

    fn cert(begin_refresh_at: OffsetDateTime, issuer: &str) -> ServingCert {
        ServingCert {
            chain_der: vec![],
            key_pkcs8_der: vec![],
            validity: Validity {
                not_before: datetime!(2026-12-01 0:00 UTC),
                not_after: datetime!(2026-12-02 0:00 UTC),
                begin_refresh_at,
            },
            serial: "01".into(),
            issuer_fingerprint: issuer.into(),
            issued: None,
        }
    }

    #[test]
    fn renewal_is_due_at_half_life_or_on_a_new_ca() {
        let half = datetime!(2026-12-01 12:00 UTC);
        let c = cert(half, "ca-1");
        assert!(!c.renewal_due("ca-1", half - Duration::seconds(1)));
        assert!(c.renewal_due("ca-1", half));
        assert!(c.renewal_due("ca-2", half - Duration::hours(6)));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let mut c = cert(NOW, "ca");
        c.key_pkcs8_der = vec![0x30, 0x81, 0xAB, 0xCD, 0xEF];
        let text = format!("{c:?}");
        assert!(text.contains("<redacted>"), "{text}");
        // The bytes as Debug would print them (decimal), and as hex.
        for needle in ["171, 205, 239", "abcdef", "ABCDEF", "0x"] {
            assert!(!text.contains(needle), "{needle} in {text}");
        }
    }

    fn p256_key() -> Arc<dyn podca_signer::CaKey> {
        Arc::new(podca_signer::MemoryKey::generate(podca_signer::CaAlgorithm::EcdsaP256).unwrap())
    }

    #[test]
    fn issues_leaf_and_intermediate_for_a_matching_p256_key() {
        let start = datetime!(2026-11-01 0:00 UTC);
        let root =
            IssuingCa::self_signed_root(p256_key(), "serving root", start, Duration::days(90))
                .unwrap();
        let intermediate = root
            .sign_intermediate(p256_key(), "serving int", start, Duration::days(60))
            .unwrap();
        let id = identity(DEFAULT_LIFETIME);
        let cert = id.issue(&intermediate, NOW).unwrap();
        // Leaf, then the intermediate; never the root (clients hold it as their anchor).
        assert_eq!(cert.chain_der.len(), 2);
        assert_eq!(cert.chain_der[1], intermediate.certificate().der());
        assert_eq!(cert.issuer_fingerprint, intermediate.fingerprint());
        let leaf_cert = podca_signer::CaCertificate::from_der(&cert.chain_der[0]).unwrap();
        leaf_cert
            .verify_signed_by(intermediate.certificate())
            .unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&cert.chain_der[0]).unwrap();
        let sans = leaf.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = sans
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert!(names.iter().any(|n| n.contains(&id.spiffe_id)), "{names:?}");
        for dns in &id.dns_names {
            assert!(
                names.iter().any(|n| n == &format!("DNSName({dns})")),
                "{dns}: {names:?}"
            );
        }
        // The key is a P-256 PKCS#8 key, and the certified one.
        let key = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &cert.key_pkcs8_der,
        )
        .unwrap();
        let subject = SubjectKey::from_spki_der(leaf.public_key().raw).unwrap();
        assert_eq!(subject.key_type(), KeyType::EcdsaP256);
        use aws_lc_rs::signature::KeyPair;
        assert_eq!(
            &*leaf.public_key().subject_public_key.data,
            key.public_key().as_ref()
        );
    }
}
