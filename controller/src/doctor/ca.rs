//! `ca-secret` and `trust-bundle`: the CA in the configured Secret, checked as `podca serve`
//! checks it at start-up ([`crate::secret_ca::parse_secret`]), with its days left; and each
//! signer's ClusterTrustBundle, present and holding the CA's anchors.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use podca_authority::Clock;
use podca_authority::config::{CaConfig, Config};
use podca_signer::CaCertificate;
use time::{Duration, OffsetDateTime};

use super::api::Discovered;
use super::{Check, NO_CONFIG, ProbeError, Status};
use crate::discovery::Resource;
use crate::publisher::{DesiredBundle, Publisher, PublisherOptions};
use crate::secret_ca::parse_secret;

/// Fewer days left than this fails: time to put the next CA into the Secret is short (the new
/// CA signs only after the propagation window, and the old one must outlive its leaves).
pub(super) const FAIL_DAYS: i64 = 7;
/// Fewer days left than this warns.
pub(super) const WARN_DAYS: i64 = 30;

/// What the doctor learnt about the CA.
#[derive(Debug)]
pub(super) enum SecretCa {
    /// The CA is in a data directory (`backend` names the backend); its anchors when the
    /// directory is readable here.
    Directory {
        backend: &'static str,
        anchors: Option<Vec<CaCertificate>>,
    },
    /// The Secret could not be read or does not hold a CA podca accepts.
    Unusable { secret: String, problem: String },
    Valid {
        secret: String,
        /// The issuing certificate and the chain above it.
        chain: Vec<CaCertificate>,
        anchors: Vec<CaCertificate>,
    },
}

pub(super) async fn read_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    now: OffsetDateTime,
    clock: Clock,
) -> SecretCa {
    let secret = format!("{namespace}/{name}");
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let object = match api.get_opt(name).await {
        Ok(Some(object)) => object,
        Ok(None) => {
            return SecretCa::Unusable {
                secret,
                problem: "not found: create it (docs/ca.md, \"Secret backend\")".into(),
            };
        }
        Err(e) => {
            return SecretCa::Unusable {
                secret,
                problem: format!("cannot be read: {}", super::error_line(&e)),
            };
        }
    };
    match parse_secret(&object, now, clock) {
        Ok(contents) => {
            let ca = contents.ca();
            let mut chain = vec![ca.certificate().clone()];
            chain.extend(ca.chain().iter().cloned());
            SecretCa::Valid {
                secret,
                chain,
                anchors: ca.roots().to_vec(),
            }
        }
        Err(e) => SecretCa::Unusable {
            secret,
            problem: format!("podca refuses it: {e}"),
        },
    }
}

/// `shared-ca`: whether signers share a CA, so that their trust domains are not apart (a
/// certificate of one verifies under another's ClusterTrustBundle). From the configuration.
pub(super) fn check_shared(config: Option<&Config>) -> Check {
    const NAME: &str = "shared-ca";
    let Some(config) = config else {
        return Check::new(NAME, Status::Warn, NO_CONFIG);
    };
    let warnings = config.shared_ca_warnings();
    if warnings.is_empty() {
        return Check::new(NAME, Status::Ok, "every signer has a CA of its own");
    }
    Check::combined(
        NAME,
        warnings
            .into_iter()
            .map(|w| (Status::Warn, format!("{w}; give each signer its own CA")))
            .collect(),
    )
}

/// What the doctor learnt about every CA the configuration uses, by CA name (empty: no
/// configuration).
pub(super) type Cas = Vec<(String, SecretCa)>;

/// Reads every CA `config` uses: Secrets through the API, data directories when readable here.
pub(super) async fn read_all(
    client: &Client,
    config: Option<&Config>,
    now: OffsetDateTime,
    clock: &Clock,
) -> Cas {
    let Some(config) = config else {
        return vec![];
    };
    let mut cas = Vec::new();
    for (name, ca) in config.cas_in_use() {
        let facts = match ca {
            CaConfig::Secret(s) => {
                read_secret(client, &s.namespace, &s.name, now, clock.clone()).await
            }
            other => SecretCa::Directory {
                backend: other.backend_name(),
                anchors: other
                    .dir()
                    .and_then(|dir| podca_signer::FileStore::new(dir).roots().ok()),
            },
        };
        cas.push((name.to_owned(), facts));
    }
    cas
}

/// `ca-secret`: every Secret-held CA, as `podca serve` checks it at start-up, with its days
/// left. With several CAs each finding names its CA.
pub(super) fn check_secret(cas: &Cas, now: OffsetDateTime) -> Check {
    const NAME: &str = "ca-secret";
    if cas.is_empty() {
        return Check::new(NAME, Status::Warn, NO_CONFIG);
    }
    let several = cas.len() > 1;
    let findings = cas
        .iter()
        .map(|(name, ca)| {
            let (status, detail) = match ca {
                SecretCa::Directory { backend, .. } => (
                    Status::Ok,
                    format!(
                        "not applicable: backend = \"{backend}\" keeps the CA in a data \
                         directory (check it with `podca ca show`)"
                    ),
                ),
                SecretCa::Unusable { secret, problem } => {
                    (Status::Fail, format!("Secret {secret} {problem}"))
                }
                SecretCa::Valid {
                    secret,
                    chain,
                    anchors,
                } => {
                    let (status, detail) = validity(chain, anchors, now);
                    (status, format!("Secret {secret}: {detail}"))
                }
            };
            match several {
                true => (status, format!("CA {name}: {detail}")),
                false => (status, detail),
            }
        })
        .collect();
    Check::combined(NAME, findings)
}

impl SecretCa {
    /// The CA's anchors, when known.
    fn anchors(&self) -> Option<&[CaCertificate]> {
        match self {
            SecretCa::Valid { anchors, .. } => Some(anchors),
            SecretCa::Directory {
                anchors: Some(anchors),
                ..
            } => Some(anchors),
            _ => None,
        }
    }
}

/// How long the CA (the earliest notAfter of its chain and anchors) has left.
fn validity(
    chain: &[CaCertificate],
    anchors: &[CaCertificate],
    now: OffsetDateTime,
) -> (Status, String) {
    let all = || chain.iter().chain(anchors);
    if let Some(early) = all().find(|c| c.not_before() > now) {
        return (
            Status::Fail,
            format!(
                "certificate {:?} is not valid before {} (is the local clock right?)",
                early.subject(),
                early.not_before()
            ),
        );
    }
    let Some(first) = all().min_by_key(|c| c.not_after()) else {
        return (Status::Fail, "holds no certificate".into());
    };
    let left = first.not_after() - now;
    let days = left.whole_days();
    let issuing = chain.first().map_or("", |c| c.subject());
    let summary = format!(
        "issuing CA {issuing:?} valid; {:?} expires {} ({days} days left)",
        first.subject(),
        first.not_after().date()
    );
    if left < Duration::days(FAIL_DAYS) {
        (
            Status::Fail,
            format!(
                "{summary}: less than {FAIL_DAYS} days; put the next CA into the Secret now \
                 (docs/ca.md, \"Runbook: the Secret backend\")"
            ),
        )
    } else if left < Duration::days(WARN_DAYS) {
        (
            Status::Warn,
            format!("{summary}: less than {WARN_DAYS} days; plan the next CA"),
        )
    } else {
        (Status::Ok, summary)
    }
}

/// `trust-bundle`: each signer's ClusterTrustBundle.
pub(super) async fn check_bundles(
    client: &Client,
    config: Option<&Config>,
    served: &Discovered,
    cas: &Cas,
) -> Check {
    const NAME: &str = "trust-bundle";
    let Some(config) = config else {
        return Check::new(NAME, Status::Warn, NO_CONFIG);
    };
    let Some(version) = served.served(Resource::ClusterTrustBundles).preferred() else {
        return Check::new(
            NAME,
            Status::Fail,
            "cannot look: ClusterTrustBundles are not served (see certificates-api)",
        );
    };
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &Resource::ClusterTrustBundles.api_resource(version),
    );
    // The names and labels podca gives its bundles, from the publisher itself.
    let publisher = if config.trust_bundles.publish {
        let options = PublisherOptions {
            suffix: config.trust_bundles.suffix.clone(),
            instance: config.trust_bundles.instance.clone(),
            ..PublisherOptions::default()
        };
        match Publisher::for_policies(&config.signers, &options) {
            Ok(p) => Some(p),
            Err(e) => return Check::new(NAME, Status::Fail, format!("[trust_bundles]: {e}")),
        }
    } else {
        None
    };
    let mut findings = Vec::new();
    // Each signer's own bundle, then one per tenant: each from its own CA only.
    let wanted = config.signers.iter().flat_map(|(signer, policy)| {
        let own = (
            signer,
            None,
            config.ca_of_signer(signer).unwrap_or_default(),
        );
        std::iter::once(own).chain(
            policy
                .tenants()
                .map(move |t| (signer, Some(t.name), t.ca())),
        )
    });
    for (signer, tenant, own) in wanted {
        let Some((_, ca)) = cas.iter().find(|(name, _)| name == own) else {
            continue;
        };
        let others: Vec<(&str, &[CaCertificate])> = cas
            .iter()
            .filter(|(name, _)| name != own)
            .filter_map(|(name, ca)| Some((name.as_str(), ca.anchors()?)))
            .collect();
        let what = match tenant {
            Some(t) => format!("{signer} (tenant {t})"),
            None => signer.clone(),
        };
        findings.push(
            match bundle(&api, publisher.as_ref(), signer, tenant).await {
                Err(problem) => (Status::Fail, format!("{what}: {problem}")),
                Ok((name, pem)) => match compare(&what, &name, &pem, ca) {
                    (Status::Ok, detail) => {
                        foreign(&what, &name, &pem, ca, &others).unwrap_or((Status::Ok, detail))
                    }
                    other => other,
                },
            },
        );
    }
    // Each federated trust domain's bundle, under the name the publisher gives it.
    if let Some(publisher) = &publisher {
        let own: HashSet<&[u8]> = cas
            .iter()
            .filter_map(|(_, ca)| ca.anchors())
            .flatten()
            .map(CaCertificate::der)
            .collect();
        for desired in publisher.bundles().iter().filter(|b| b.federated.is_some()) {
            findings.push(federated_bundle(&api, desired, &own).await);
        }
    }
    Check::combined(NAME, findings)
}

/// One federated trust domain's ClusterTrustBundle: published (else a warning: serve writes it
/// once a bundle of the trust domain is in force), parseable, free of podca's own anchors, and
/// not expired; says how many anchors it holds and when the first expires.
async fn federated_bundle(
    api: &Api<DynamicObject>,
    desired: &DesiredBundle,
    own: &HashSet<&[u8]>,
) -> (Status, String) {
    let td = desired.federated.as_deref().unwrap_or_default();
    let (what, name) = (
        format!("{} (federated {td})", desired.signer_name),
        &desired.name,
    );
    let object = match api.get_opt(name).await {
        Ok(Some(object)) => object,
        Ok(None) => {
            return (
                Status::Warn,
                format!(
                    "{what}: ClusterTrustBundle {name} is not published yet (podca serve writes                      it once a bundle of {td} is in force: initial_bundle or a fetch)"
                ),
            );
        }
        Err(e) => {
            return (
                Status::Fail,
                format!("{what}: cannot read {name}: {}", super::error_line(&e)),
            );
        }
    };
    let pem = object.data["spec"]["trustBundle"]
        .as_str()
        .unwrap_or_default();
    let certs = match CaCertificate::all_from_pem(pem) {
        Ok(certs) if !certs.is_empty() => certs,
        Ok(_) => return (Status::Fail, format!("{what}: {name} holds no certificate")),
        Err(e) => return (Status::Fail, format!("{what}: {name} does not parse: {e}")),
    };
    if let Some(mine) = certs.iter().find(|c| own.contains(c.der())) {
        return (
            Status::Fail,
            format!(
                "{what}: {name} holds podca's own anchor {:?}: a federated bundle must hold only                  {td}'s",
                mine.subject()
            ),
        );
    }
    let first = certs
        .iter()
        .min_by_key(|c| c.not_after())
        .map_or(OffsetDateTime::UNIX_EPOCH, CaCertificate::not_after);
    let status = if first <= OffsetDateTime::now_utc() {
        Status::Fail
    } else {
        Status::Ok
    };
    (
        status,
        format!(
            "{what}: {name} holds {} anchor(s); the first expires {}",
            certs.len(),
            first.date()
        ),
    )
}

/// The bundle `publisher` keeps for `signer` (its name and labels), or without a publisher
/// (`publish = false`) any bundle of the signer: (name, `spec.trustBundle`).
async fn bundle(
    api: &Api<DynamicObject>,
    publisher: Option<&Publisher>,
    signer: &str,
    tenant: Option<&str>,
) -> Result<(String, String), ProbeError> {
    let list = api
        .list(&ListParams::default().fields(&format!("spec.signerName={signer}")))
        .await
        .map_err(|e| format!("cannot list ClusterTrustBundles: {}", super::error_line(&e)))?;
    let found = match publisher {
        Some(publisher) => {
            let wanted = publisher
                .bundles()
                .iter()
                .find(|b| {
                    b.signer_name == signer
                        && b.tenant.as_deref() == tenant
                        && b.federated.is_none()
                })
                .map(|b| b.name.clone())
                .unwrap_or_default();
            let labels = publisher.labels();
            let ours = list.items.into_iter().find(|o| {
                let present = o.metadata.labels.clone().unwrap_or_default();
                o.metadata.name.as_deref() == Some(wanted.as_str())
                    && labels.iter().all(|(k, v)| present.get(k) == Some(v))
            });
            ours.ok_or_else(|| {
                format!(
                    "ClusterTrustBundle {wanted} (labels {}) is missing: podca publishes it once \
                     it runs and leads",
                    publisher.label_selector()
                )
            })?
        }
        None => list.items.into_iter().next().ok_or_else(|| {
            "no ClusterTrustBundle names this signer ([trust_bundles] publish = false: \
             publish it yourself)"
                .to_owned()
        })?,
    };
    let name = found.metadata.name.clone().unwrap_or_default();
    let pem = found.data["spec"]["trustBundle"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((name, pem))
}

/// Whether the bundle `name` of `signer` holds an anchor of another CA (`others`: name and
/// anchors) that is not also its own CA's: then a certificate of that CA's signers verifies
/// under this signer's bundle. `None`: it holds none.
fn foreign(
    signer: &str,
    name: &str,
    pem: &str,
    own: &SecretCa,
    others: &[(&str, &[CaCertificate])],
) -> Option<(Status, String)> {
    let published = CaCertificate::all_from_pem(pem).ok()?;
    let own: HashSet<&[u8]> = own
        .anchors()
        .unwrap_or_default()
        .iter()
        .map(CaCertificate::der)
        .collect();
    let found: Vec<String> = published
        .iter()
        .filter(|p| !own.contains(p.der()))
        .filter_map(|p| {
            let (ca, _) = others
                .iter()
                .find(|(_, anchors)| anchors.iter().any(|a| a.der() == p.der()))?;
            Some(format!(
                "{:?} of CA {ca} ({})",
                p.subject(),
                p.fingerprint()
            ))
        })
        .collect();
    (!found.is_empty()).then(|| {
        (
            Status::Fail,
            format!(
                "{signer}: {name} holds the anchor {}: certificates of that CA's signers \
                 verify under this signer's bundle (remove it; podca publishes only the \
                 signer's own CA)",
                found.join(", ")
            ),
        )
    })
}

/// Whether the bundle `name` holds every anchor of the signer's CA.
fn compare(signer: &str, name: &str, pem: &str, ca: &SecretCa) -> (Status, String) {
    let published = match CaCertificate::all_from_pem(pem) {
        Ok(certs) if !certs.is_empty() => certs,
        Ok(_) => {
            return (
                Status::Fail,
                format!("{signer}: {name} holds no certificate"),
            );
        }
        Err(e) => {
            return (
                Status::Fail,
                format!("{signer}: {name} does not parse: {e}"),
            );
        }
    };
    let Some(anchors) = ca.anchors() else {
        return (
            Status::Ok,
            format!(
                "{signer}: {name} holds {} certificate(s) (not compared: the CA is neither in a \
                 readable Secret nor in a data directory readable here)",
                published.len()
            ),
        );
    };
    let held: HashSet<&[u8]> = published.iter().map(CaCertificate::der).collect();
    let missing: Vec<String> = anchors
        .iter()
        .filter(|a| !held.contains(a.der()))
        .map(|a| format!("{:?} ({})", a.subject(), a.fingerprint()))
        .collect();
    if missing.is_empty() {
        (
            Status::Ok,
            format!(
                "{signer}: {name} holds the CA's {} anchor(s) ({} certificate(s) in all)",
                anchors.len(),
                published.len()
            ),
        )
    } else {
        (
            Status::Fail,
            format!(
                "{signer}: {name} lacks the CA's anchor {}: pods would not trust podca's \
                 certificates (is podca running with this Secret?)",
                missing.join(", ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use podca_signer::{CaAlgorithm, FileKey, IssuingCa};
    use time::macros::datetime;

    #[test]
    fn signers_that_share_the_ca_are_reported() {
        assert_eq!(check_shared(None).status, Status::Warn);
        let one = Config::parse("[signers.\"example.com/a\"]\ntrust_domain = \"a.test\"").unwrap();
        let check = check_shared(Some(&one));
        assert_eq!(
            (check.status, check.detail.as_str()),
            (Status::Ok, "every signer has a CA of its own")
        );
        let two = Config::parse(
            "[signers.\"example.com/a\"]\ntrust_domain = \"a.test\"\n\
             [signers.\"example.com/b\"]\ntrust_domain = \"b.test\"",
        )
        .unwrap();
        let check = check_shared(Some(&two));
        assert_eq!(
            (check.status, check.detail.as_str()),
            (
                Status::Warn,
                "signers \"example.com/a\" and \"example.com/b\" share a CA (default): a \
                 certificate of one verifies under the others' ClusterTrustBundles; give each \
                 signer its own CA"
            )
        );
    }

    const T0: OffsetDateTime = datetime!(2027-01-01 0:00 UTC);

    fn root(cn: &str, days: i64) -> CaCertificate {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = FileKey::create(&dir.path().join("k.pem"), CaAlgorithm::EcdsaP256).expect("key");
        IssuingCa::self_signed_root(Arc::new(key), cn, T0, Duration::days(days))
            .expect("root")
            .certificate()
            .clone()
    }

    #[test]
    fn days_left_decide_between_ok_warn_and_fail() {
        let cases = [
            (400, Status::Ok, "days left)"),
            (29, Status::Warn, "less than 30 days; plan the next CA"),
            (
                6,
                Status::Fail,
                "less than 7 days; put the next CA into the Secret now",
            ),
        ];
        for (days, status, text) in cases {
            let r = root("podca", days);
            let (got, detail) = validity(std::slice::from_ref(&r), std::slice::from_ref(&r), T0);
            assert_eq!(got, status, "{days}: {detail}");
            assert!(detail.contains(text), "{days}: {detail}");
        }
        let r = root("later", 30);
        let (got, detail) = validity(
            std::slice::from_ref(&r),
            std::slice::from_ref(&r),
            T0 - Duration::days(1),
        );
        assert_eq!(got, Status::Fail);
        assert!(detail.contains("is not valid before"), "{detail}");
    }

    /// A signer's bundle that holds another CA's anchor fails (that CA's certificates would
    /// verify under it); an anchor both CAs hold (a CA split off a shared one, until the shared
    /// generation is dropped) is the signer's own.
    #[test]
    fn a_bundle_holding_another_cas_anchor_fails() {
        let (own, other, shared) = (root("own", 100), root("other", 100), root("shared", 100));
        let ca = SecretCa::Directory {
            backend: "file",
            anchors: Some(vec![own.clone(), shared.clone()]),
        };
        let others_anchors = [other.clone(), shared.clone()];
        let others = [("batch", &others_anchors[..])];
        let clean = format!("{}{}", own.pem(), shared.pem());
        assert_eq!(foreign("a/b", "a:b:podca", &clean, &ca, &others), None);
        let polluted = format!("{clean}{}", other.pem());
        let (status, detail) =
            foreign("a/b", "a:b:podca", &polluted, &ca, &others).expect("a finding");
        assert_eq!(status, Status::Fail);
        assert!(
            detail.starts_with(&format!(
                "a/b: a:b:podca holds the anchor \"O=podca, CN=other\" of CA batch ({})",
                other.fingerprint()
            )),
            "{detail}"
        );
    }

    #[test]
    fn a_bundle_without_the_anchor_fails_and_with_it_passes() {
        let a = root("a", 100);
        let b = root("b", 100);
        let ca = SecretCa::Valid {
            secret: "ns/ca".into(),
            chain: vec![a.clone()],
            anchors: vec![a.clone()],
        };
        let (s, d) = compare("x/y", "x:y:podca", &format!("{}{}", b.pem(), a.pem()), &ca);
        assert_eq!(s, Status::Ok, "{d}");
        assert!(
            d.contains("holds the CA's 1 anchor(s) (2 certificate(s) in all)"),
            "{d}"
        );
        let (s, d) = compare("x/y", "x:y:podca", &b.pem(), &ca);
        assert_eq!(s, Status::Fail, "{d}");
        assert!(d.contains(&a.fingerprint()), "{d}");
        let (s, d) = compare("x/y", "x:y:podca", "", &ca);
        assert_eq!(s, Status::Fail, "{d}");
        assert!(
            d.contains("does not parse: no CERTIFICATE block found"),
            "{d}"
        );
    }
}
