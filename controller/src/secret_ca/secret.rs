//! The Secret → [`SecretCaContents`] conversion: which fields of the Kubernetes object hold
//! what. The checks themselves are `podca_authority::secret_rotation`'s.

use k8s_openapi::api::core::v1::Secret;
use podca_authority::secret_rotation::{SecretCaContents, SecretData, SecretError, SecretField};
use podca_authority::trust::Clock;
use time::OffsetDateTime;

/// Parses the CA in a Secret and checks everything: the type, the key (PKCS#8, SEC1 or PKCS#1
/// PEM) matching the issuing certificate, every certificate a CA, the chain verifying up to an
/// anchor (`ca.crt`, or the self-signed top of `tls.crt`), and nothing expired at `now`. The
/// key is wrapped in a gate that is closed until the rotation state machine opens it. Errors
/// never hold key material.
pub fn parse_secret(
    secret: &Secret,
    now: OffsetDateTime,
    clock: Clock,
) -> Result<SecretCaContents, SecretError> {
    let field = |f: SecretField| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(f.key()))
            .map(|bytes| bytes.0.as_slice())
    };
    let data = SecretData {
        type_: secret.type_.as_deref(),
        tls_crt: field(SecretField::TlsCrt),
        tls_key: field(SecretField::TlsKey),
        ca_crt: field(SecretField::CaCrt),
        location: format!(
            "kubernetes-secret:{}/{}",
            secret.metadata.namespace.as_deref().unwrap_or(""),
            secret.metadata.name.as_deref().unwrap_or("")
        ),
    };
    SecretCaContents::parse(data, now, clock)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use podca_authority::secret_rotation::SECRET_TYPE;
    use podca_signer::{CaAlgorithm, FileKey, IssuingCa};
    use time::Duration;
    use time::macros::datetime;

    const T0: OffsetDateTime = datetime!(2027-01-01 0:00 UTC);

    fn clock() -> Clock {
        Arc::new(|| T0)
    }

    /// A self-signed root valid for 30 days from T0: (certificate PEM, key PEM).
    fn root(cn: &str) -> (String, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key.pem");
        let key = FileKey::create(&path, CaAlgorithm::EcdsaP256).expect("key");
        let key_pem = std::fs::read_to_string(&path).expect("key file");
        let ca =
            IssuingCa::self_signed_root(Arc::new(key), cn, T0, Duration::days(30)).expect("root");
        (ca.certificate().pem(), key_pem)
    }

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("ca".into()),
                namespace: Some("podca".into()),
                ..ObjectMeta::default()
            },
            type_: Some(SECRET_TYPE.into()),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn a_valid_secret_parses_and_its_debug_holds_no_key() {
        let (cert, key) = root("a");
        let contents = parse_secret(
            &secret(&[("tls.crt", &cert), ("tls.key", &key)]),
            T0,
            clock(),
        )
        .expect("valid");
        assert_eq!(contents.ca().roots().len(), 1);
        assert!(contents.ca().roots()[0].is_self_signed());
        assert_eq!(contents.ca().key().location(), "kubernetes-secret:podca/ca");
        let debug = format!("{contents:?} {:?}", contents.ca());
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
        assert!(
            !debug.contains(key.lines().nth(1).expect("key body")),
            "{debug}"
        );
    }

    /// Each field is read from its own key of `data`, and the type from `type`.
    #[test]
    fn bad_secrets_are_refused_with_a_reason_and_no_key_material() {
        let (cert, key) = root("a");
        let (_, other_key) = root("b");
        let bad_key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        let cases: Vec<(Secret, &str)> = vec![
            (secret(&[("tls.key", &key)]), "tls.crt is missing"),
            (secret(&[("tls.crt", &cert)]), "tls.key is missing"),
            (
                secret(&[("tls.crt", &cert), ("tls.key", bad_key)]),
                "tls.key: ",
            ),
            (
                secret(&[("tls.crt", &cert), ("tls.key", &other_key)]),
                "tls.key does not match the public key of certificate \"O=podca, CN=a\" in tls.crt",
            ),
            (
                secret(&[("tls.crt", &cert), ("tls.key", &key), ("ca.crt", "junk")]),
                "ca.crt: ",
            ),
            (
                Secret {
                    type_: Some("Opaque".into()),
                    ..secret(&[("tls.crt", &cert), ("tls.key", &key)])
                },
                "type is \"Opaque\"; podca reads \"kubernetes.io/tls\" Secrets",
            ),
        ];
        for (s, want) in cases {
            let e = parse_secret(&s, T0, clock()).expect_err(want).to_string();
            assert!(e.starts_with(want), "{e:?} should start with {want:?}");
            assert!(!e.contains("PRIVATE KEY"), "{e}");
            for line in key
                .lines()
                .chain(other_key.lines())
                .filter(|l| !l.starts_with("-----"))
            {
                assert!(!e.contains(line), "{e}");
            }
        }
        let late = T0 + Duration::days(31);
        let e = parse_secret(
            &secret(&[("tls.crt", &cert), ("tls.key", &key)]),
            late,
            clock(),
        )
        .expect_err("expired");
        assert!(
            matches!(&e, SecretError::Expired { subject, .. } if subject == "O=podca, CN=a"),
            "{e:?}"
        );
    }
}
