//! The ledger log's checkpoint key with the Secret CA backend: held in a Secret beside the CA
//! Secret, as the JWT keys are ([`crate::jwt_secret`]).
//!
//! * **Where.** `[ledger.log] key_secret`, default `<CA Secret name>-log` in the CA Secret's
//!   namespace (`podca-ca-log` in deploy/); type `Opaque`, labelled
//!   `app.kubernetes.io/managed-by: podca`; data key `log.key`, the Ed25519 PKCS#8 PEM that
//!   `podca_signer::merkle_note::LogKey` reads from a file otherwise.
//! * **Who makes it.** Whichever replica starts first and finds none: it creates the Secret
//!   with a new key; a replica that loses that race (409 AlreadyExists) reads the winner's. So
//!   every replica signs checkpoints with the same key, and the key never changes on its own.
//! * **Foreign or broken.** A Secret of that name without podca's label, or without a readable
//!   `log.key`, stops `podca serve` at start with the Secret's name: podca never overwrites it.
//! * **Deleted.** Replicas keep the key they read; the next start makes a new one, whose
//!   checkpoints verify under a new verifier key (podca logs it at start). Keep a copy.
//! * **RBAC.** `get` on that Secret by name, `create` in its namespace.
//!
//! Errors name the Secret and the data key, never key material.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};
use podca_signer::merkle_note::{LogKey, NoteError};
use tracing::info;

use crate::publisher::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// The data key holding the PEM.
pub const DATA_KEY: &str = "log.key";

/// Why the log key Secret could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogKeySecretError {
    #[error(
        "the Secret {secret} exists but is not podca's (no label \
         {MANAGED_BY_LABEL}={MANAGED_BY_VALUE}): podca never overwrites it; delete or rename it, \
         or set [ledger.log] key_secret to another name"
    )]
    Foreign { secret: String },
    #[error("the ledger log key Secret {secret}: {source}")]
    Kube {
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error("the ledger log key Secret {secret} has no data key {DATA_KEY}")]
    Missing { secret: String },
    #[error(transparent)]
    Key(#[from] NoteError),
}

/// Reads the log key from `namespace/name`, making the Secret with a new key if there is none.
pub async fn log_key(
    client: Client,
    namespace: &str,
    name: &str,
    origin: &str,
) -> Result<LogKey, LogKeySecretError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let secret = format!("{namespace}/{name}");
    let kube = |source| LogKeySecretError::Kube {
        secret: secret.clone(),
        source,
    };
    // Twice at most: absent → create; lost the race → read the winner's.
    for _ in 0..2 {
        if let Some(found) = api.get_opt(name).await.map_err(kube)? {
            return from_secret(&found, &secret, origin);
        }
        let pem = LogKey::generate_pem()?;
        let key = LogKey::from_pem(&pem, origin, &format!("{secret} {DATA_KEY}"))?;
        let object = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_owned(),
                    MANAGED_BY_VALUE.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([(DATA_KEY.to_owned(), ByteString(pem))])),
            ..Secret::default()
        };
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                info!(
                    secret,
                    "ledger log: made a new checkpoint key in the Secret"
                );
                return Ok(key);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(kube(e)),
        }
    }
    // Created and gone again between two reads: say so rather than loop.
    Err(LogKeySecretError::Missing { secret })
}

fn from_secret(found: &Secret, secret: &str, origin: &str) -> Result<LogKey, LogKeySecretError> {
    let owned = found
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY_VALUE);
    if !owned {
        return Err(LogKeySecretError::Foreign {
            secret: secret.to_owned(),
        });
    }
    let pem = found
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .ok_or_else(|| LogKeySecretError::Missing {
            secret: secret.to_owned(),
        })?;
    Ok(LogKey::from_pem(
        &pem.0,
        origin,
        &format!("{secret} {DATA_KEY}"),
    )?)
}
