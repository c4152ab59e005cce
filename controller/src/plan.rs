//! What one reconcile attempt does, decided from facts already fetched. No I/O here: the async
//! reconcile in `controller.rs` fetches, calls [`plan`], carries out the one action it names and
//! makes at most one `/status` write.

use std::collections::BTreeMap;

use podca_authority::metrics::RetryCause;
use podca_signer::{FailReason, IssuedCertificate, Outcome};
use serde_json::Value;
use time::OffsetDateTime;

use crate::decide::{self, Settlement};
use crate::request::{KeySource, Pcr};

/// The PCR as this attempt sees it.
#[derive(Debug, Clone, Copy)]
pub enum Read<'a> {
    /// The watched copy (first attempt) or a fresh read with the same uid (retries).
    Found(&'a Pcr),
    /// A fresh read found nothing, or another object (a different uid) under the same name.
    Gone,
    /// A fresh read failed.
    Failed,
}

impl<'a> Read<'a> {
    /// Reads `fetched` as a copy of the PCR with `uid`.
    pub fn of<E>(fetched: &'a Result<Option<Pcr>, E>, uid: &str) -> Self {
        match fetched {
            Ok(Some(pcr)) if pcr.uid == uid => Read::Found(pcr),
            Ok(_) => Read::Gone,
            Err(_) => Read::Failed,
        }
    }
}

/// Everything [`plan`] decides on. `P` is the signer policy (generic so tests need none).
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a, P> {
    pub read: Read<'a>,
    /// The signer names podca serves, and their policies.
    pub policies: &'a BTreeMap<String, P>,
    /// A certificate signed for this uid on an earlier attempt.
    pub cached: Option<&'a IssuedCertificate>,
    /// Whether the cluster serves certificates.k8s.io/v1beta1 (legacy key fields, §1.6).
    pub legacy_readable: bool,
    pub now: OffsetDateTime,
}

/// Why an attempt ends without a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// Already `Issued`, `Denied` or `Failed`.
    Terminal,
    /// Deleted, or replaced by another object of the same name.
    Gone,
}

/// The one thing an attempt does.
#[derive(Debug)]
pub enum Plan<'a, P> {
    /// Nothing to do, ever again.
    Skip(SkipReason),
    /// Try again after a backoff; the cause labels the retry metric.
    Retry(RetryCause),
    /// Send the certificate signed on an earlier attempt again: it is still fresh (rule 16.8).
    ResendCached(Write),
    /// Answer without signing (an unserved signer, an unreadable legacy request).
    Write(Write),
    /// The PCR was read through v1 and hides its legacy key: read it through v1beta1, then sign.
    ReadThroughV1beta1(&'a P),
    /// Sign the PCR as read.
    Sign(&'a P, &'a Pcr),
}

/// A `/status` merge patch and the outcome it reports.
#[derive(Debug)]
pub struct Write {
    pub settlement: Settlement,
    pub patch: Value,
    pub outcome: Outcome,
}

impl Write {
    /// The write for `outcome`, or `None` when it is transient and the PCR stays pending.
    pub fn of(outcome: Outcome, now: OffsetDateTime) -> Option<Self> {
        let (settlement, patch) = decide::status_patch(&outcome, now)?;
        Some(Write {
            settlement,
            patch,
            outcome,
        })
    }
}

const LEGACY_UNREADABLE: &str = "the request has no stubPKCS10Request; it carries a legacy \
                                 pkixPublicKey/proofOfPossession that only \
                                 certificates.k8s.io/v1beta1 shows, and this cluster does not \
                                 serve v1beta1";

/// Decides what one attempt does. Every branch is a row of `tests::plan_table`.
pub fn plan<'a, P>(facts: Facts<'a, P>) -> Plan<'a, P> {
    let Facts {
        read,
        policies,
        cached,
        legacy_readable,
        now,
    } = facts;
    let pcr = match read {
        Read::Found(pcr) if pcr.terminal.is_some() => return Plan::Skip(SkipReason::Terminal),
        Read::Found(pcr) => pcr,
        Read::Gone => return Plan::Skip(SkipReason::Gone),
        Read::Failed => return Plan::Retry(RetryCause::Read),
    };
    if let Some(cert) = cached
        && !decide::needs_reissue(cert.validity.not_before, now)
        && let Some(write) = Write::of(Outcome::Issued(Box::new(cert.clone())), now)
    {
        return Plan::ResendCached(write);
    }
    let Some(policy) = policies.get(&pcr.signer_name) else {
        return fail(
            FailReason::UnknownSigner,
            format!("podca does not serve signer {:?}", pcr.signer_name),
            now,
        );
    };
    match pcr.key_source() {
        KeySource::LegacyHiddenByV1 if legacy_readable => Plan::ReadThroughV1beta1(policy),
        KeySource::LegacyHiddenByV1 => fail(
            FailReason::LegacyRequestUnreadable,
            LEGACY_UNREADABLE.into(),
            now,
        ),
        KeySource::StubCsr(_) | KeySource::PkixWithProof { .. } | KeySource::Missing => {
            Plan::Sign(policy, pcr)
        }
    }
}

fn fail<'a, P>(reason: FailReason, message: String, now: OffsetDateTime) -> Plan<'a, P> {
    match Write::of(Outcome::Failed { reason, message }, now) {
        Some(write) => Plan::Write(write),
        // A Failed outcome always has a patch; kept total rather than unwrapped.
        None => Plan::Retry(RetryCause::Policy),
    }
}

/// What the signer's answer means: a write, or a retry while the CA backend is unavailable.
pub fn after_signing(outcome: Outcome, now: OffsetDateTime) -> Result<Write, RetryCause> {
    Write::of(outcome, now).ok_or(RetryCause::CaBackend)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podca_signer::{BackendError, DenyReason, Validity};
    use time::macros::datetime;

    use crate::request::ApiVersion;

    const NOW: OffsetDateTime = datetime!(2026-08-26 10:00:00 UTC);
    const POLICY: &str = "policy";

    fn pcr(version: ApiVersion, stub: &[u8], pkix: bool, terminal: Option<&str>) -> Pcr {
        Pcr {
            version,
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "req".into(),
            signer_name: "example.com/podca".into(),
            created: None,
            terminal: terminal.map(str::to_owned),
            pod_name: "pod".into(),
            pod_uid: "pod-uid".into(),
            node_name: "node-1".into(),
            service_account: "sa".into(),
            max_expiration_seconds: None,
            stub_csr: stub.to_vec(),
            pkix_public_key: pkix.then(|| b"spki".to_vec()),
            proof_of_possession: pkix.then(|| b"sig".to_vec()),
            user_annotations: Default::default(),
            lean: false,
        }
    }

    fn cert(not_before: OffsetDateTime) -> IssuedCertificate {
        IssuedCertificate {
            chain_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            leaf_der: vec![],
            serial: "01ab".into(),
            validity: Validity {
                not_before,
                not_after: not_before + time::Duration::days(1),
                begin_refresh_at: not_before + time::Duration::hours(12),
            },
            spiffe_id: "spiffe://cluster.local/ns/ns/sa/sa".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            spki_sha256: String::new(),
            issuer_fingerprint: String::new(),
            key_type: podca_signer::KeyType::EcdsaP256,
        }
    }

    /// A plan reduced to what a row checks.
    #[derive(Debug, PartialEq, Eq)]
    enum Want {
        Skip(SkipReason),
        Retry(RetryCause),
        ResendCached(String),
        Fail(String),
        ReadThroughV1beta1,
        Sign(ApiVersion),
    }

    fn want(plan: Plan<'_, &str>) -> Want {
        match plan {
            Plan::Skip(reason) => Want::Skip(reason),
            Plan::Retry(cause) => Want::Retry(cause),
            Plan::ResendCached(w) => {
                assert_eq!(w.settlement, Settlement::Issued);
                let Outcome::Issued(c) = &w.outcome else {
                    panic!("a resend reports Issued: {:?}", w.outcome)
                };
                assert_eq!(w.patch["status"]["certificateChain"], c.chain_pem.as_str());
                Want::ResendCached(c.serial.clone())
            }
            Plan::Write(w) => {
                assert_eq!(w.settlement, Settlement::Failed);
                let reason = &w.patch["status"]["conditions"][0]["reason"];
                Want::Fail(reason.as_str().unwrap_or_default().to_owned())
            }
            Plan::ReadThroughV1beta1(p) => {
                assert_eq!(*p, POLICY);
                Want::ReadThroughV1beta1
            }
            Plan::Sign(p, pcr) => {
                assert_eq!(*p, POLICY);
                Want::Sign(pcr.version)
            }
        }
    }

    /// Name, read, served signers, cached certificate, v1beta1 served, expected plan.
    type Row<'a> = (
        &'a str,
        Read<'a>,
        &'a BTreeMap<String, &'a str>,
        Option<&'a IssuedCertificate>,
        bool,
        Want,
    );

    #[test]
    fn plan_table() {
        use ApiVersion::{V1, V1Beta1};
        let stub_v1 = pcr(V1, b"csr", false, None);
        let legacy_v1 = pcr(V1, b"", false, None);
        let legacy_beta = pcr(V1Beta1, b"", true, None);
        let keyless_beta = pcr(V1Beta1, b"", false, None);
        let issued = pcr(V1, b"csr", false, Some("Issued"));
        let denied = pcr(V1Beta1, b"csr", false, Some("Denied"));
        let fresh = cert(NOW - time::Duration::seconds(240));
        let stale = cert(NOW - time::Duration::seconds(241));
        let served = BTreeMap::from([("example.com/podca".to_owned(), POLICY)]);
        let served = &served;
        let other = &BTreeMap::from([("example.com/other".to_owned(), POLICY)]);
        #[rustfmt::skip]
        let rows: [Row<'_>; 14] = [
            ("stub CSR is signed", Read::Found(&stub_v1), served, None, true, Want::Sign(V1)),
            ("terminal Issued", Read::Found(&issued), served, None, true, Want::Skip(SkipReason::Terminal)),
            ("terminal Denied beats a cache", Read::Found(&denied), served, Some(&fresh), true, Want::Skip(SkipReason::Terminal)),
            ("gone on re-read", Read::Gone, served, Some(&fresh), true, Want::Skip(SkipReason::Gone)),
            ("re-read failed", Read::Failed, served, Some(&fresh), true, Want::Retry(RetryCause::Read)),
            ("fresh cache is resent", Read::Found(&stub_v1), served, Some(&fresh), true, Want::ResendCached("01ab".into())),
            ("fresh cache beats an unserved signer", Read::Found(&stub_v1), other, Some(&fresh), true, Want::ResendCached("01ab".into())),
            ("stale cache is re-signed", Read::Found(&stub_v1), served, Some(&stale), true, Want::Sign(V1)),
            ("unserved signer fails", Read::Found(&stub_v1), other, None, true, Want::Fail("UnknownSigner".into())),
            ("stale cache, unserved signer", Read::Found(&stub_v1), other, Some(&stale), true, Want::Fail("UnknownSigner".into())),
            ("legacy behind v1, v1beta1 served", Read::Found(&legacy_v1), served, None, true, Want::ReadThroughV1beta1),
            ("legacy behind v1, no v1beta1", Read::Found(&legacy_v1), served, None, false, Want::Fail("LegacyRequestUnreadable".into())),
            ("legacy read through v1beta1", Read::Found(&legacy_beta), served, None, false, Want::Sign(V1Beta1)),
            ("no key at all: the signer denies", Read::Found(&keyless_beta), served, None, true, Want::Sign(V1Beta1)),
        ];
        for (name, read, policies, cached, legacy_readable, expected) in rows {
            let got = want(plan(Facts {
                read,
                policies,
                cached,
                legacy_readable,
                now: NOW,
            }));
            assert_eq!(got, expected, "{name}");
        }
    }

    #[test]
    fn read_of_a_fetch() {
        let mine = pcr(ApiVersion::V1, b"csr", false, None);
        let mut other = mine.clone();
        other.uid = "u2".into();
        let found: Result<Option<Pcr>, ()> = Ok(Some(mine));
        assert!(matches!(Read::of(&found, "u1"), Read::Found(p) if p.uid == "u1"));
        assert!(matches!(
            Read::of(&Ok::<_, ()>(Some(other)), "u1"),
            Read::Gone
        ));
        assert!(matches!(Read::of(&Ok::<_, ()>(None), "u1"), Read::Gone));
        assert!(matches!(
            Read::of(&Err::<Option<Pcr>, _>(()), "u1"),
            Read::Failed
        ));
    }

    #[test]
    fn after_signing_table() {
        let issued = Outcome::Issued(Box::new(cert(NOW)));
        assert_eq!(
            after_signing(issued, NOW).map(|w| w.settlement).ok(),
            Some(Settlement::Issued)
        );
        let denied = Outcome::Denied {
            reason: DenyReason::UnsupportedKeyType,
            message: "no".into(),
        };
        assert_eq!(
            after_signing(denied, NOW).map(|w| w.settlement).ok(),
            Some(Settlement::Denied)
        );
        let retry = Outcome::Retry(BackendError::Unavailable("hsm down".into()));
        assert_eq!(after_signing(retry, NOW).err(), Some(RetryCause::CaBackend));
    }
}
