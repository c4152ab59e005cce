//! `pending-requests`: PodCertificateRequests of podca's signers that have no answer yet, and
//! the age of the oldest. kubelet asks for a new certificate at beginRefreshAt, which podca puts
//! at least 10 minutes before notAfter: a request older than that may have let a pod's
//! certificate lapse, and one half as old is on its way there.

use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use podca_authority::config::Config;
use time::{Duration, OffsetDateTime};

use super::api::Discovered;
use super::{Check, NO_CONFIG, Status};
use crate::discovery::Resource;

/// Older than this warns: half of the 10 minutes between beginRefreshAt and notAfter.
pub(super) const WARN_AFTER: Duration = Duration::minutes(5);
/// Older than this fails: the pod's certificate may have expired already.
pub(super) const FAIL_AFTER: Duration = Duration::minutes(10);

/// One unanswered request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    /// `namespace/name`.
    name: String,
    age: Duration,
}

pub(super) async fn check(
    client: &Client,
    config: Option<&Config>,
    served: &Discovered,
    now: OffsetDateTime,
) -> Check {
    const NAME: &str = "pending-requests";
    let Some(config) = config else {
        return Check::new(NAME, Status::Warn, NO_CONFIG);
    };
    let Some(version) = served.served(Resource::PodCertificateRequests).preferred() else {
        return Check::new(
            NAME,
            Status::Fail,
            "cannot look: PodCertificateRequests are not served (see certificates-api)",
        );
    };
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &Resource::PodCertificateRequests.api_resource(version),
    );
    let mut findings = Vec::new();
    for signer in config.signers.keys() {
        let params = ListParams::default().fields(&format!("spec.signerName={signer}"));
        findings.push(match api.list(&params).await {
            Err(e) => (
                Status::Fail,
                format!(
                    "{signer}: cannot list PodCertificateRequests: {}",
                    super::error_line(&e)
                ),
            ),
            Ok(list) => verdict(
                signer,
                &list
                    .items
                    .iter()
                    .filter_map(|o| pending(o, now))
                    .collect::<Vec<_>>(),
            ),
        });
    }
    Check::combined(NAME, findings)
}

/// The request, when it has no condition yet.
fn pending(o: &DynamicObject, now: OffsetDateTime) -> Option<Pending> {
    let answered = o.data["status"]["conditions"]
        .as_array()
        .is_some_and(|c| !c.is_empty());
    if answered {
        return None;
    }
    let created = o
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.0.as_second()).ok())
        .unwrap_or(now);
    Some(Pending {
        name: format!(
            "{}/{}",
            o.metadata.namespace.as_deref().unwrap_or(""),
            o.metadata.name.as_deref().unwrap_or("")
        ),
        age: now - created,
    })
}

fn verdict(signer: &str, pending: &[Pending]) -> (Status, String) {
    let Some(oldest) = pending.iter().max_by_key(|p| p.age) else {
        return (Status::Ok, format!("{signer}: no request waiting"));
    };
    let summary = format!(
        "{signer}: {} request(s) waiting, the oldest {} for {}s",
        pending.len(),
        oldest.name,
        oldest.age.whole_seconds()
    );
    if oldest.age >= FAIL_AFTER {
        (
            Status::Fail,
            format!(
                "{summary}: over 10 minutes, pods' certificates may have expired; is podca \
                 running, leading and signing (its logs, podca_* metrics)?"
            ),
        )
    } else if oldest.age >= WARN_AFTER {
        (
            Status::Warn,
            format!("{summary}: over 5 minutes, half of kubelet's 10-minute margin"),
        )
    } else {
        (Status::Ok, summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, seconds: i64) -> Pending {
        Pending {
            name: name.into(),
            age: Duration::seconds(seconds),
        }
    }

    #[test]
    fn the_oldest_request_decides() {
        assert_eq!(
            verdict("a/b", &[]),
            (Status::Ok, "a/b: no request waiting".into())
        );
        let (s, d) = verdict("a/b", &[p("ns/young", 10), p("ns/old", 299)]);
        assert_eq!(s, Status::Ok);
        assert_eq!(d, "a/b: 2 request(s) waiting, the oldest ns/old for 299s");
        let (s, d) = verdict("a/b", &[p("ns/old", 300)]);
        assert_eq!(s, Status::Warn, "{d}");
        let (s, d) = verdict("a/b", &[p("ns/young", 1), p("ns/old", 600)]);
        assert_eq!(s, Status::Fail, "{d}");
        assert!(
            d.contains("the oldest ns/old for 600s: over 10 minutes"),
            "{d}"
        );
    }
}
