//! Why a request was denied or failed, as types. Each variant is one PodCertificateRequest
//! condition reason; [`DenyReason::condition_reason`] and [`FailReason::condition_reason`] give
//! the exact string written into the condition (users and alerts match on it, so it never
//! changes). The edges (PCR condition, gRPC status, CLI message) match on these enums, so a new
//! reason is a compile error wherever its mapping must be decided.
//!
//! Every reason matches `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$` (spec rule 33).
//!
//! The enums are deliberately not `#[non_exhaustive]`: that would force a wildcard arm on every
//! match outside this crate, which is exactly what must not decide a status code.

use std::fmt;

/// The reason of the `Issued` condition.
pub const ISSUED: &str = "Issued";

/// Declares a reason enum, its `ALL` list and its `condition_reason` from one table, so that the
/// list cannot miss a variant.
macro_rules! condition_reasons {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident => $text:literal, )+
            $( @dynamic $(#[$dyn_meta:meta])* $dyn_variant:ident, )?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$variant_meta])* $variant, )+
            $( $(#[$dyn_meta])* $dyn_variant(&'static str), )?
        }

        impl $name {
            /// Every fixed reason, in declaration order.
            pub const ALL: &'static [$name] = &[$( $name::$variant, )+];

            /// The condition reason written into the PodCertificateRequest.
            pub fn condition_reason(&self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                    $( $name::$dyn_variant(text) => text, )?
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.condition_reason())
            }
        }
    };
}

condition_reasons! {
    /// Why podca refuses a request (a `Denied` condition; kubelet never retries).
    pub enum DenyReason {
        /// The subject key type is one podca never certifies, or the policy does not allow it.
        UnsupportedKeyType => "UnsupportedKeyType",
        /// The request's public key or CSR cannot be parsed.
        MalformedPublicKey => "MalformedPublicKey",
        /// The namespace is not allowed, or excluded, by the signer's policy.
        NamespaceNotAllowed => "NamespaceNotAllowed",
        /// The service account is not allowed by the signer's policy.
        ServiceAccountNotAllowed => "ServiceAccountNotAllowed",
        /// An unknown user annotation, or a DNS name in `podca.dev/dns-names` that is not one or
        /// not allowed.
        InvalidUserAnnotations => "InvalidUnverifiedUserAnnotations",
        /// The signer's rules read the pod (`pod_facts`), and the request's pod does not exist,
        /// or a pod of that name has another UID.
        PodNotFound => "PolicyPodNotFound",
        /// A DNS name the request asks for is outside the issuing CA's nameConstraints: every
        /// verifier would reject the certificate.
        NameNotPermittedByCa => "NameNotPermittedByCA",
        /// A DNS name of podca's own serving certificate (its gRPC Service names): a workload
        /// holding it could pose as podca to clients.
        ReservedDnsName => "ReservedDNSName",
        /// A `kubernetes.io/service-ca` annotation asks for a name the pod is not entitled to: a
        /// Service that does not exist, is in another namespace or does not select the pod; no
        /// pod IPs; no hostname or headless Service for the pod's FQDN.
        NotEntitledToName => "NameNotEntitled",
        @dynamic
        /// A signer's CEL rule denied the request (the rule's configured reason), or failed to
        /// evaluate (`PolicyRuleFailed:<rule>`), or a CEL output gave a bad value
        /// (`PolicyOutputInvalid:<output>`). Checked against rule 33 when the config loads.
        Rule,
    }
}

condition_reasons! {
    /// Why podca cannot issue for a request it does not refuse (a `Failed` condition).
    pub enum FailReason {
        /// The CA ends before the shortest lifetime the request allows.
        CaExpiresTooSoon => "CAExpiresTooSoon",
        /// No lifetime satisfies the request, the policy and the CA together.
        LifetimeNotSatisfiable => "LifetimeNotSatisfiable",
        /// A `dns_name_templates` entry expands to something that is not a DNS name.
        InvalidDnsNameTemplate => "InvalidDNSNameTemplate",
        /// The CA key cannot sign and retrying will not help.
        CaKeyUnusable => "CAKeyUnusable",
        /// The certificate could not be encoded: a bug.
        CertificateBuildFailed => "CertificateBuildFailed",
        /// The request names a signer podca does not serve (the controller's answer).
        UnknownSigner => "UnknownSigner",
        /// A legacy (`pkixPublicKey`) request that only `certificates.k8s.io/v1beta1` shows, in a
        /// cluster that does not serve v1beta1 (the controller's answer).
        LegacyRequestUnreadable => "LegacyRequestUnreadable",
        /// The signer's identities (its trust domain) are outside the issuing CA's
        /// nameConstraints: a configuration error, no certificate of this signer could verify.
        IdentityNotPermittedByCa => "IdentityNotPermittedByCA",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_reason() -> Vec<&'static str> {
        let mut all = vec![ISSUED];
        all.extend(DenyReason::ALL.iter().map(DenyReason::condition_reason));
        all.extend(FailReason::ALL.iter().map(FailReason::condition_reason));
        all
    }

    #[test]
    fn reasons_are_todays_strings() {
        // Written into PCR conditions: changing one breaks users' alerts and tooling.
        assert_eq!(
            every_reason(),
            [
                "Issued",
                "UnsupportedKeyType",
                "MalformedPublicKey",
                "NamespaceNotAllowed",
                "ServiceAccountNotAllowed",
                "InvalidUnverifiedUserAnnotations",
                "PolicyPodNotFound",
                "NameNotPermittedByCA",
                "ReservedDNSName",
                "NameNotEntitled",
                "CAExpiresTooSoon",
                "LifetimeNotSatisfiable",
                "InvalidDNSNameTemplate",
                "CAKeyUnusable",
                "CertificateBuildFailed",
                "UnknownSigner",
                "LegacyRequestUnreadable",
                "IdentityNotPermittedByCA",
            ]
        );
    }

    #[test]
    fn reasons_are_distinct() {
        let all = every_reason();
        for (i, r) in all.iter().enumerate() {
            assert!(!all[..i].contains(r), "{r} twice");
        }
    }

    #[test]
    fn reasons_satisfy_rule_33() {
        for r in every_reason() {
            let bytes = r.as_bytes();
            assert!(bytes[0].is_ascii_alphabetic(), "{r}");
            assert!(
                bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b"_,:".contains(b)),
                "{r}"
            );
            let last = bytes[bytes.len() - 1];
            assert!(last.is_ascii_alphanumeric() || last == b'_', "{r}");
            assert!(r.len() <= 1024, "{r}");
        }
    }

    #[test]
    fn display_is_the_condition_reason() {
        assert_eq!(
            DenyReason::InvalidUserAnnotations.to_string(),
            "InvalidUnverifiedUserAnnotations"
        );
        assert_eq!(FailReason::CaKeyUnusable.to_string(), "CAKeyUnusable");
    }
}
