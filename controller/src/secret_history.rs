//! The one reader of the Secret CA's history ConfigMap: the backend's driver
//! ([`crate::secret_ca`]) reads it through `parse_generations`, and `podca ca show --secret`
//! through [`read`] without running the backend. A ConfigMap without podca's
//! `app.kubernetes.io/managed-by` label is someone else's and is refused, `history.json` must
//! parse, must record the configured Secret, and every generation's anchors must be
//! certificates. [`read_verified`] also checks the seal as the backend does, against the
//! Secret's certificates (never its key). Read-only: nothing is ever written.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use podca_authority::secret_rotation::{Checked, Rejection, SecretField, seal};
use podca_signer::CaCertificate;
use time::{Duration, OffsetDateTime};

use crate::publisher::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::secret_ca::{
    HISTORY_KEY, History, HistoryError, SEAL_KEY, SecretCaError, SecretCaOptions, history_error,
};

/// What the history ConfigMap of a Secret CA holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// There is no ConfigMap of that name: no podca has run with this Secret yet.
    NoConfigMap,
    /// podca's ConfigMap, without `history.json` (the backend starts from no history).
    NoHistory,
    History(History),
}

/// Reads the history ConfigMap named by `options` (its namespace is the Secret's) and checks
/// it as [`parse`] does.
pub async fn read(client: Client, options: &SecretCaOptions) -> Result<Recorded, SecretCaError> {
    let api: Api<ConfigMap> = Api::namespaced(client, &options.namespace);
    match api.get_opt(&options.history_name()).await? {
        None => Ok(Recorded::NoConfigMap),
        Some(cm) => Ok(parse(&cm, options)?.map_or(Recorded::NoHistory, Recorded::History)),
    }
}

/// What the seal of a history says, checked as `podca serve` checks it at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealStatus {
    /// Sealed by a CA the Secret vouches for, over this very text, with no impossible value.
    Valid { sequence: u64, signer: String },
    /// `podca serve` would not use this history, for this reason.
    Rejected(Rejection),
    /// The Secret's certificates could not be read, so the seal was not checked.
    Unverified { reason: String },
}

/// The longest hold a seal may carry and still be called valid here: `podca ca show` does not
/// know the configured propagation window, so it accepts any hold up to a day (the window is
/// minutes in practice); `podca serve` checks it against the window it runs with.
const DISPLAY_MAX_HOLD: Duration = Duration::days(1);

/// [`read`], and the seal of the history checked at `now` against the certificates of the Secret
/// (`tls.crt` and `ca.crt`; its key is not looked at). The status is `None` when there is no
/// history to check.
pub async fn read_verified(
    client: Client,
    options: &SecretCaOptions,
    now: OffsetDateTime,
) -> Result<(Recorded, Option<SealStatus>), SecretCaError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &options.namespace);
    let Some(cm) = api.get_opt(&options.history_name()).await? else {
        return Ok((Recorded::NoConfigMap, None));
    };
    let recorded = parse(&cm, options)?.map_or(Recorded::NoHistory, Recorded::History);
    let data = cm.data.unwrap_or_default();
    let Some(history_json) = data.get(HISTORY_KEY) else {
        return Ok((recorded, None));
    };
    let Some(seal_json) = data.get(SEAL_KEY) else {
        // Nothing to check against the Secret.
        return Ok((recorded, Some(SealStatus::Rejected(Rejection::Unsigned))));
    };
    let status = match secret_certificates(client, options).await {
        Err(reason) => SealStatus::Unverified {
            reason: reason.to_string(),
        },
        Ok(known) => seal_status(history_json, seal_json, &secret_ref(options), &known, now),
    };
    Ok((recorded, Some(status)))
}

/// The seal of `history_json` checked against the Secret's certificates `known`.
fn seal_status(
    history_json: &str,
    seal_json: &str,
    secret: &str,
    known: &[CaCertificate],
    now: OffsetDateTime,
) -> SealStatus {
    match seal::open_with(
        history_json,
        Some(seal_json),
        secret,
        known,
        None,
        DISPLAY_MAX_HOLD,
        now,
    ) {
        Ok(opened) => SealStatus::Valid {
            sequence: opened.sequence,
            signer: opened.signer,
        },
        Err(rejection) => SealStatus::Rejected(rejection),
    }
}

/// The Secret's certificates could not be read, so no seal can be checked against them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
struct SecretUnreadable(String);

/// Every certificate in the Secret's `tls.crt` and `ca.crt`: those that vouch for a seal.
async fn secret_certificates(
    client: Client,
    options: &SecretCaOptions,
) -> Result<Vec<CaCertificate>, SecretUnreadable> {
    let unreadable = SecretUnreadable;
    let api: Api<Secret> = Api::namespaced(client, &options.namespace);
    let secret = api
        .get_opt(&options.name)
        .await
        .map_err(|e| unreadable(format!("reading Secret {}: {e}", secret_ref(options))))?
        .ok_or_else(|| unreadable(format!("Secret {} not found", secret_ref(options))))?;
    let data = secret.data.unwrap_or_default();
    let mut known = vec![];
    for field in [SecretField::TlsCrt, SecretField::CaCrt] {
        let Some(bytes) = data.get(field.key()) else {
            continue;
        };
        let text = std::str::from_utf8(&bytes.0)
            .map_err(|_| unreadable(format!("{} is not PEM text", field.key())))?;
        known.extend(
            CaCertificate::all_from_pem(text)
                .map_err(|e| unreadable(format!("{}: {e}", field.key())))?,
        );
    }
    Ok(known)
}

/// The history in `cm`, the history ConfigMap of `options`' Secret; `None` when it holds no
/// `history.json` yet. Refuses a ConfigMap podca does not own, an unreadable history, a
/// history of another Secret and unreadable anchors.
pub fn parse(cm: &ConfigMap, options: &SecretCaOptions) -> Result<Option<History>, SecretCaError> {
    Ok(parse_generations(cm, options)?.map(|generations| History {
        // parse_generations checked that the history records this Secret.
        secret: secret_ref(options),
        generations: generations.into_iter().map(|g| g.record).collect(),
    }))
}

/// [`parse`], keeping each generation's parsed anchors: the one reader of the history, for the
/// backend's driver and for `podca ca show --secret` alike.
pub(crate) fn parse_generations(
    cm: &ConfigMap,
    options: &SecretCaOptions,
) -> Result<Option<Vec<Checked>>, SecretCaError> {
    let refuse = |reason: HistoryError| history_error(options, reason);
    if !owned(cm) {
        return Err(refuse(HistoryError::NotOwned));
    }
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(HISTORY_KEY)) else {
        return Ok(None);
    };
    let history: History = serde_json::from_str(text).map_err(|e| {
        refuse(HistoryError::Unreadable {
            detail: e.to_string(),
        })
    })?;
    let secret = secret_ref(options);
    if history.secret != secret {
        return Err(refuse(HistoryError::OtherSecret {
            recorded: history.secret,
            configured: secret,
        }));
    }
    history
        .generations
        .into_iter()
        .map(|record| {
            let generation = record.generation.id;
            Checked::new(record)
                .map_err(|error| refuse(HistoryError::Anchors { generation, error }))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Whether podca owns `cm` (its `app.kubernetes.io/managed-by` label says podca): podca reads
/// and overwrites only its own history ConfigMap.
pub(crate) fn owned(cm: &ConfigMap) -> bool {
    cm.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY_VALUE)
}

/// `namespace/name` of the Secret, as the history records it.
pub(crate) fn secret_ref(options: &SecretCaOptions) -> String {
    format!("{}/{}", options.namespace, options.name)
}

/// `podca ca show --secret`'s answer: the report, and what is wrong with the history's seal.
#[derive(Debug, Clone)]
pub struct Shown {
    pub text: String,
    /// Why the seal does not verify (`--check` fails on it).
    pub problem: Option<String>,
    /// `namespace/name` of the history ConfigMap.
    pub configmap: String,
}

/// `podca ca show --secret` could not read what it shows; one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ShowError(String);

/// Reads the history of the CA Secret `secret` (`namespace/name`) through the backend's own
/// reader (a ConfigMap podca does not own is refused, not shown), verifies its seal against the
/// Secret's certificates, and reads the JWT keys in `jwt_keys_secret` (default
/// `<name>-jwt`): the text `podca ca show` prints.
pub async fn show(
    secret: &str,
    kubeconfig: Option<&std::path::Path>,
    jwt_keys_secret: Option<&str>,
    now: OffsetDateTime,
) -> Result<Shown, ShowError> {
    use std::fmt::Write;

    use podca_signer::report;

    let (namespace, name) = podca_authority::config::secret_ref(secret)
        .map_err(|e| ShowError(format!("--secret: {e}")))?;
    let options = SecretCaOptions::new(namespace, name);
    let configmap = options.history_name();
    let jwt_name = jwt_keys_secret.map_or_else(|| format!("{name}-jwt"), str::to_owned);
    let client = crate::connect(kubeconfig)
        .await
        .map_err(|e| ShowError(podca_signer::report::error_chain(&e)))?;
    let jwt_keys = crate::jwt_secret::JwtSecretStore::new(
        client.clone(),
        namespace,
        &jwt_name,
        std::sync::Arc::new(podca_authority::metrics::Metrics::new()),
    )
    .read()
    .await;
    let (recorded, seal) = match read_verified(client, &options, now).await {
        Ok(recorded) => recorded,
        Err(SecretCaError::Kube(e)) => {
            return Err(ShowError(format!(
                "reading ConfigMap {namespace}/{configmap}: {}",
                podca_signer::report::error_chain(&e)
            )));
        }
        Err(e) => return Err(ShowError(podca_signer::report::error_chain(&e))),
    };
    let mut out = String::new();
    let history = match recorded {
        Recorded::History(history) => history,
        Recorded::NoConfigMap => {
            return Err(ShowError(format!(
                "ConfigMap {namespace}/{configmap} does not exist: podca serve has not run with \
                 [ca] secret = \"{secret}\" yet"
            )));
        }
        Recorded::NoHistory => {
            return Err(ShowError(format!(
                "ConfigMap {namespace}/{configmap} has no {HISTORY_KEY}"
            )));
        }
    };
    let _ = writeln!(
        out,
        "CA Secret: {} (history in ConfigMap {namespace}/{configmap})",
        history.secret
    );
    let problem = match &seal {
        Some(SealStatus::Valid { sequence, signer }) => {
            let _ = writeln!(
                out,
                "history seal: valid (sequence {sequence}, sealed by {signer})"
            );
            None
        }
        Some(SealStatus::Rejected(rejection)) => {
            let _ = writeln!(
                out,
                "history seal: NOT VALID ({}): {rejection}; podca serve would not use this history",
                rejection.reason()
            );
            Some(rejection.to_string())
        }
        Some(SealStatus::Unverified { reason }) => {
            let _ = writeln!(out, "history seal: not verified: {reason}");
            Some(format!("the seal could not be checked: {reason}"))
        }
        // read_verified checks every history it finds.
        None => None,
    };
    for record in &history.generations {
        let chain =
            CaCertificate::all_from_pem(&record.chain_pem).map_err(|e| ShowError(e.to_string()))?;
        let roots = CaCertificate::all_from_pem(&record.anchors_pem)
            .map_err(|e| ShowError(e.to_string()))?;
        print!(
            "{}",
            report::generation(&record.generation, chain.first(), &roots, now)
        );
    }
    match jwt_keys {
        Ok(Some(keys)) => {
            let place = format!("Secret {namespace}/{jwt_name}");
            out.push_str(&report::jwt_keys(&place, &keys.stored().1));
        }
        Ok(None) => {
            let _ = writeln!(out,);
            let _ = writeln!(
                out,
                "JWT signing keys: none (no Secret {namespace}/{jwt_name}; the podca serve \
                 leader makes it with [jwt] enabled)"
            );
        }
        Err(e) => {
            let _ = writeln!(out,);
            let _ = writeln!(out, "JWT signing keys: not shown: {e}");
        }
    }
    Ok(Shown {
        text: out,
        problem,
        configmap: format!("{namespace}/{configmap}"),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn options() -> SecretCaOptions {
        SecretCaOptions::new("podca-system", "podca-ca")
    }

    fn configmap(labels: &[(&str, &str)], history: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("podca-ca-podca-history".into()),
                namespace: Some("podca-system".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            data: history.map(|h| BTreeMap::from([(HISTORY_KEY.to_owned(), h.to_owned())])),
            ..Default::default()
        }
    }

    const OURS: &[(&str, &str)] = &[(MANAGED_BY_LABEL, MANAGED_BY_VALUE)];

    fn reason(result: Result<Option<History>, SecretCaError>) -> HistoryError {
        match result {
            Err(SecretCaError::History {
                namespace,
                name,
                reason,
            }) => {
                assert_eq!(
                    (namespace.as_str(), name.as_str()),
                    ("podca-system", "podca-ca-podca-history")
                );
                reason
            }
            other => panic!("expected a refused history, got {other:?}"),
        }
    }

    #[test]
    fn an_owned_history_of_this_secret_is_read() {
        let text = r#"{"secret":"podca-system/podca-ca","generations":[]}"#;
        let history = parse(&configmap(OURS, Some(text)), &options()).expect("readable");
        assert_eq!(
            history,
            Some(History {
                secret: "podca-system/podca-ca".into(),
                generations: vec![],
            })
        );
        assert_eq!(parse(&configmap(OURS, None), &options()).ok(), Some(None));
    }

    #[test]
    fn each_check_refuses_with_its_own_reason() {
        let good = r#"{"secret":"podca-system/podca-ca","generations":[]}"#;
        let unowned = "exists without the label app.kubernetes.io/managed-by=podca; podca does \
                       not use or overwrite it (delete it, or name another with \
                       history_configmap)";
        assert_eq!(HistoryError::NotOwned.to_string(), unowned);
        assert_eq!(
            reason(parse(&configmap(&[], Some(good)), &options())),
            HistoryError::NotOwned
        );
        assert_eq!(
            reason(parse(
                &configmap(&[(MANAGED_BY_LABEL, "helm")], Some(good)),
                &options()
            )),
            HistoryError::NotOwned
        );
        let unreadable = reason(parse(&configmap(OURS, Some("{")), &options()));
        assert!(
            matches!(unreadable, HistoryError::Unreadable { .. })
                && unreadable
                    .to_string()
                    .starts_with("history.json is not readable: "),
            "{unreadable:?}"
        );
        let other = r#"{"secret":"other/ca","generations":[]}"#;
        let other = reason(parse(&configmap(OURS, Some(other)), &options()));
        assert_eq!(
            other,
            HistoryError::OtherSecret {
                recorded: "other/ca".into(),
                configured: "podca-system/podca-ca".into(),
            }
        );
        assert_eq!(
            other.to_string(),
            "records the CA of Secret other/ca, not podca-system/podca-ca"
        );
        let bad_anchor = serde_json::json!({
            "secret": "podca-system/podca-ca",
            "generations": [{
                "generation": {
                    "id": 3, "phase": "active",
                    "ca_not_before": "2025-01-01T00:00:00Z",
                    "ca_not_after": "2026-01-01T00:00:00Z",
                    "prepared_at": "2025-01-01T00:00:00Z",
                },
                "fingerprint": "00", "subject": "CN=x", "chain_pem": "",
                "anchors_pem": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            }],
        })
        .to_string();
        let bad_anchor = reason(parse(&configmap(OURS, Some(&bad_anchor)), &options()));
        assert!(
            matches!(bad_anchor, HistoryError::Anchors { generation: 3, .. })
                && bad_anchor.to_string().starts_with("generation 3: "),
            "{bad_anchor:?}"
        );
    }
}
