//! Where a certificate's renewal chain began: a non-critical private extension in the leaves
//! podca's gRPC paths issue, so that mTLS renewal (a certificate buying its successor, issue
//! #40) has an end.
//!
//! A certificate issued to a token-authenticated caller starts a chain: its extension says
//! *now* and the service account's UID from the TokenReview. A certificate renewed over mTLS
//! copies its predecessor's extension, so the chain's origin never moves forward without a
//! fresh token; podca refuses a renewal once the origin is older than `[grpc]
//! max_renewal_seconds` and never lets a renewal outlive that bound ([`RenewalChain::cap`]).
//! A leaf without the extension (a PodCertificateRequest's, or one issued before it existed)
//! began its chain at its notBefore: kubelet or a token authenticated its request then.
//!
//! ```text
//! id-podca-renewal-chain OBJECT IDENTIFIER ::= { 2 25 252228685824337025458437214531765536329 }
//! RenewalChain ::= SEQUENCE {
//!     origin             INTEGER,               -- Unix seconds of the token authentication
//!     serviceAccountUid  UTF8String OPTIONAL }  -- the TokenReview's user.uid
//! ```
//!
//! The OID is in the `2.25` arc (a UUID, ITU-T X.667): no registration needed, no collision.

use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::der;

/// The OID's content octets (`2.25.<UUID bdc17a56-c0e4-44d4-aea8-ef5a000e0649 as an integer>`).
pub const OID: &[u8] = &[
    0x69, 0x82, 0xfb, 0xc1, 0xbd, 0x95, 0xd8, 0x8e, 0xa2, 0x93, 0xa9, 0xae, 0xd4, 0xbb, 0xeb, 0xa0,
    0x80, 0xb8, 0x8c, 0x49,
];
/// The OID in dotted form, for humans and `openssl x509 -text`.
pub const OID_DOTTED: &str = "2.25.252228685824337025458437214531765536329";
/// The longest service-account UID carried (a Kubernetes UID is a 36-character UUID).
const MAX_UID_LEN: usize = 128;
const UTF8_STRING: u8 = 0x0c;

/// Where a renewal chain began (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RenewalChain {
    /// When a token last authenticated this chain (whole seconds).
    pub origin: OffsetDateTime,
    /// The service account's UID, when the authentication said it.
    pub service_account_uid: Option<String>,
    /// The latest notAfter a certificate of this chain may get (a renewal's clamp); `None` for
    /// a chain that starts now. Not encoded: it follows from the origin and the configuration.
    pub cap: Option<OffsetDateTime>,
}

/// The extension is there but is not a [`RenewalChain`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the renewal-chain extension ({OID_DOTTED}) is malformed")]
pub struct MalformedChain;

impl RenewalChain {
    /// A chain that starts at `origin` (a token authenticated it then).
    pub fn starting(origin: OffsetDateTime, service_account_uid: Option<String>) -> Self {
        RenewalChain {
            origin: origin.replace_nanosecond(0).unwrap_or(origin),
            service_account_uid: service_account_uid.filter(|u| u.len() <= MAX_UID_LEN),
            cap: None,
        }
    }

    /// The chain of `leaf` (DER): its extension, else a chain that began at its notBefore.
    pub fn of_leaf(leaf: &[u8]) -> Result<Self, MalformedChain> {
        let (_, cert) = X509Certificate::from_der(leaf).map_err(|_| MalformedChain)?;
        Self::of_certificate(&cert)
    }

    /// [`RenewalChain::of_leaf`] of a certificate already parsed.
    pub fn of_certificate(cert: &X509Certificate<'_>) -> Result<Self, MalformedChain> {
        let own = cert
            .extensions()
            .iter()
            .find(|e| e.oid.as_bytes() == OID)
            .map(|e| Self::decode(e.value))
            .transpose()?;
        Ok(own.unwrap_or_else(|| {
            RenewalChain::starting(cert.validity().not_before.to_datetime(), None)
        }))
    }

    /// The extension's value (the content of its extnValue OCTET STRING).
    pub(crate) fn push_value(&self, out: &mut Vec<u8>) {
        der::push_nested(out, der::SEQUENCE, |seq| {
            let seconds = self.origin.unix_timestamp();
            // Before 1970 cannot happen (a token authenticated it); write 0 rather than a
            // negative INTEGER no reader expects.
            let seconds = u64::try_from(seconds).unwrap_or(0);
            der::push_unsigned(seq, &seconds.to_be_bytes());
            if let Some(uid) = &self.service_account_uid {
                der::push(seq, UTF8_STRING, uid.as_bytes());
            }
        });
    }

    fn decode(value: &[u8]) -> Result<Self, MalformedChain> {
        let seq = der::read(value).filter(|r| r.tag == der::SEQUENCE && r.rest.is_empty());
        let seq = seq.ok_or(MalformedChain)?;
        let origin = der::read(seq.content)
            .filter(|r| r.tag == der::INTEGER)
            .ok_or(MalformedChain)?;
        let digits = origin.content;
        // Non-negative and at most 8 octets of magnitude (one leading zero allowed).
        if digits.is_empty() || digits[0] & 0x80 != 0 || digits.len() > 9 {
            return Err(MalformedChain);
        }
        let seconds = digits.iter().fold(0u64, |n, b| n << 8 | u64::from(*b));
        let origin_time = i64::try_from(seconds)
            .ok()
            .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
            .ok_or(MalformedChain)?;
        let service_account_uid = match der::read(origin.rest) {
            None if origin.rest.is_empty() => None,
            Some(uid) if uid.tag == UTF8_STRING && uid.rest.is_empty() => {
                if uid.content.len() > MAX_UID_LEN {
                    return Err(MalformedChain);
                }
                Some(
                    std::str::from_utf8(uid.content)
                        .map_err(|_| MalformedChain)?
                        .to_owned(),
                )
            }
            _ => return Err(MalformedChain),
        };
        Ok(RenewalChain {
            origin: origin_time,
            service_account_uid,
            cap: None,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use time::macros::datetime;

    #[test]
    fn the_value_round_trips_with_and_without_a_uid() {
        for uid in [
            None,
            Some("0b7c6a52-3d5e-4c8e-9a52-5f2f3e1d4c21".to_owned()),
        ] {
            let chain = RenewalChain::starting(datetime!(2026-12-06 10:00:00.5 UTC), uid);
            let mut value = vec![];
            chain.push_value(&mut value);
            let back = RenewalChain::decode(&value).unwrap();
            assert_eq!(back.origin, datetime!(2026-12-06 10:00:00 UTC));
            assert_eq!(back.service_account_uid, chain.service_account_uid);
        }
    }

    #[test]
    fn malformed_values_are_refused() {
        let mut good = vec![];
        RenewalChain::starting(datetime!(2026-12-06 10:00:00 UTC), Some("u".into()))
            .push_value(&mut good);
        let mut trailing = good.clone();
        trailing.push(0);
        let negative = [0x30, 0x03, 0x02, 0x01, 0x80];
        let wrong_tag = [0x30, 0x03, 0x04, 0x01, 0x01];
        let uid_not_utf8 = [0x30, 0x07, 0x02, 0x01, 0x01, 0x0c, 0x02, 0xff, 0xfe];
        for bad in [
            &trailing[..],
            &negative[..],
            &wrong_tag[..],
            &uid_not_utf8[..],
            &[][..],
            &good[..good.len() - 1],
        ] {
            assert_eq!(RenewalChain::decode(bad), Err(MalformedChain), "{bad:02x?}");
        }
    }

    #[test]
    fn the_oid_is_the_dotted_one() {
        // x509-parser prints arcs above 64 bits in hex: decode base 128 by hand.
        let (first, rest) = OID.split_first().unwrap();
        let arc = rest
            .iter()
            .fold(0u128, |n, b| n << 7 | u128::from(b & 0x7f));
        assert_eq!(rest.last().unwrap() & 0x80, 0);
        let dotted = format!("{}.{}.{arc}", first / 40, first % 40);
        assert_eq!(dotted, OID_DOTTED);
    }
}
