//! `podca doctor`: a preflight of the cluster podca is about to run in (or runs in), through
//! the caller's kubeconfig. Each check asks the API server one question and answers with one
//! [`Check`]: `ok`, `warn` (podca works, but look at it) or `FAIL` (something podca needs is
//! missing or wrong). [`Report::healthy`] is false when any check failed.
//!
//! The checks, in the order they are reported:
//!
//! * `certificates-api`: which `certificates.k8s.io` versions serve PodCertificateRequests and
//!   ClusterTrustBundles, and, from `/version`, which feature gates and runtime-config to turn
//!   on when they are missing ([`api`]).
//! * `rbac`: a SelfSubjectAccessReview for every permission podca needs ([`permissions`]);
//!   `rbac-least-privilege`: a few dangerous ones it must not have.
//! * `ca-secret`: each CA in a Secret parses, and how many days it has left.
//! * `trust-bundle`: each signer's ClusterTrustBundle exists, holds its own CA's anchors and
//!   no anchor of another CA of the configuration.
//! * `shared-ca`: signers that share a CA (a certificate of one verifies under the other's
//!   bundle).
//! * `pending-requests`: PodCertificateRequests of podca's signers still unanswered, and how old.
//! * `clock-skew`: the API server's `Date` header against the local clock.
//!
//! SelfSubjectAccessReview answers for the caller: run the doctor as podca (its service
//! account's kubeconfig, or `--as system:serviceaccount:<ns>:<sa>` from an admin kubeconfig).

mod api;
mod ca;
mod clock;
mod pending;
pub mod permissions;

use std::path::PathBuf;

use kube::Client;
use podca_authority::Clock;
use podca_authority::config::Config;
use serde::Serialize;

use crate::Error;

/// What a probe could not find out, worded for its check's detail line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProbeError(String);

impl From<String> for ProbeError {
    fn from(detail: String) -> Self {
        ProbeError(detail)
    }
}

impl From<&str> for ProbeError {
    fn from(detail: &str) -> Self {
        ProbeError(detail.to_owned())
    }
}
pub use permissions::{Asker, Needs, Permission};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Status {
    Ok,
    /// podca works, but something deserves attention.
    Warn,
    /// Something podca needs is missing or wrong.
    Fail,
}

impl Status {
    /// As printed: `ok`, `warn`, `FAIL`.
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// The answer of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, status: Status, detail: impl Into<String>) -> Self {
        Check {
            name,
            status,
            detail: detail.into(),
        }
    }

    /// The worst of several findings of one check, their details joined.
    fn combined(name: &'static str, findings: Vec<(Status, String)>) -> Self {
        let status = findings.iter().map(|(s, _)| *s).max().unwrap_or(Status::Ok);
        let detail = findings
            .into_iter()
            .map(|(_, d)| d)
            .collect::<Vec<_>>()
            .join("; ");
        Check::new(name, status, detail)
    }
}

/// Every check's answer, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// No check failed.
    pub healthy: bool,
    pub checks: Vec<Check>,
}

impl Report {
    fn new(checks: Vec<Check>) -> Self {
        Report {
            healthy: checks.iter().all(|c| c.status != Status::Fail),
            checks,
        }
    }

    /// One line per check: status, name, detail.
    pub fn text(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        self.checks
            .iter()
            .map(|c| {
                format!(
                    "{:<4}  {:<width$}  {}\n",
                    c.status.label(),
                    c.name,
                    c.detail
                )
            })
            .collect()
    }
}

/// The Lease podca takes with `--leader-elect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    pub namespace: String,
    pub name: String,
    /// Rendezvous sharding (`--sharding rendezvous`; `[controller] sharding` sets it too, in
    /// [`Needs::from_config`]): every replica also holds a member Lease beside this one.
    pub sharded: bool,
}

/// What the doctor checks against.
#[derive(Clone)]
pub struct DoctorOptions {
    /// podca's configuration; `None`: the checks that need it (signer names, the CA Secret, the
    /// bundles) say they were skipped.
    pub config: Option<Config>,
    /// The leader Lease, when podca runs with `--leader-elect`.
    pub lease: Option<LeaseRef>,
    /// The local clock, compared with the API server's.
    pub clock: Clock,
    /// The API server's address, as [`connect`] found it (for the one line that says it cannot
    /// be reached).
    pub server: String,
}

impl std::fmt::Debug for DoctorOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DoctorOptions")
            .field("config", &self.config.is_some())
            .field("lease", &self.lease)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// Where the client comes from: kube's usual kubeconfig handling, plus impersonation.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// A kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, else in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// A context of the kubeconfig other than its current one.
    pub context: Option<String>,
    /// Act as this user (`Impersonate-User`), e.g. `system:serviceaccount:podca-system:podca`.
    pub impersonate: Option<String>,
    /// With these groups (`Impersonate-Group`).
    pub impersonate_groups: Vec<String>,
}

/// A client as `options` says, and the API server's address it talks to.
pub async fn connect(options: &ClientOptions) -> Result<(Client, String), Error> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let kube_options = KubeConfigOptions {
        context: options.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut config = match (&options.kubeconfig, &options.context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube_options)
                .await
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&kube_options)
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
        (None, None) => kube::Config::infer()
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
    };
    if let Some(user) = &options.impersonate {
        config.auth_info.impersonate = Some(user.clone());
    }
    if !options.impersonate_groups.is_empty() {
        config.auth_info.impersonate_groups = Some(options.impersonate_groups.clone());
    }
    let server = config.cluster_url.to_string();
    Ok((Client::try_from(config)?, server))
}

/// The API server did not answer at all: there is nothing to check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot reach the API server at {server}: {cause}")]
pub struct Unreachable {
    pub server: String,
    pub cause: String,
}

/// A kube error in one line: the API server's own message for an API error (a 403 names the
/// verb, the resource and the user), else the chain of causes (`tcp connect error: Connection
/// refused`); never the `Status { … }` dump of kube's Display.
pub fn error_line(error: &kube::Error) -> String {
    if let kube::Error::Api(status) = error {
        return match (status.message.is_empty(), status.code) {
            (true, code) => format!("the API server answered {code} {}", status.reason),
            (false, 0) => status.message.clone(),
            (false, code) => format!("{} ({code})", status.message),
        };
    }
    let mut parts: Vec<String> = vec![];
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        let text = e.to_string();
        // Wrappers repeat their source's text, or say only what kind of error follows.
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cause = e.source();
    }
    parts.join(": ")
}

/// Who asks: a SelfSubjectReview's user (`authentication.k8s.io/v1`, Kubernetes ≥ 1.28).
async fn asker(client: &Client, config: Option<&Config>) -> Asker {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = SelfSubjectReview::default();
    let Ok(answer) = api.create(&kube::api::PostParams::default(), &review).await else {
        return Asker::Unknown;
    };
    let user = answer
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default();
    if user.is_empty() {
        return Asker::Unknown;
    }
    let namespace = config
        .and_then(|c| c.grpc.tls_namespace.clone())
        .unwrap_or_else(|| "podca-system".to_owned());
    Asker::of(&user, &namespace)
}

/// Runs every check; fails as a whole only when the API server cannot be reached: any other
/// API error is the answer of the check that met it.
pub async fn run(client: &Client, options: &DoctorOptions) -> Result<Report, Unreachable> {
    match client.apiserver_version().await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => {
            return Err(Unreachable {
                server: options.server.clone(),
                cause: error_line(&e),
            });
        }
    }
    let asker = asker(client, options.config.as_ref()).await;
    let skew = clock::measure(client, &options.clock).await;
    let served = api::discover(client).await;
    let mut checks = vec![api::check(&served)];
    let needs = options
        .config
        .as_ref()
        .map(|c| Needs::from_config(c, options.lease.clone()));
    checks.push(permissions::check_required(client, needs.as_ref(), &asker).await);
    checks.push(permissions::check_beyond(client, needs.as_ref(), &asker).await);
    let now = options.clock.as_ref()();
    let cas = ca::read_all(client, options.config.as_ref(), now, &options.clock).await;
    checks.push(ca::check_secret(&cas, now));
    checks.push(ca::check_bundles(client, options.config.as_ref(), &served, &cas).await);
    checks.push(ca::check_shared(options.config.as_ref()));
    let server_now = skew.as_ref().ok().map_or(now, |s| now + s.skew);
    checks.push(pending::check(client, options.config.as_ref(), &served, server_now).await);
    checks.push(clock::check(&skew));
    Ok(Report::new(checks))
}

/// The text of the check that needs podca's configuration and has none.
const NO_CONFIG: &str = "skipped: no podca configuration (give --config, the podca serve one)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_healthy_unless_a_check_failed_and_prints_one_line_per_check() {
        let report = Report::new(vec![
            Check::new("one", Status::Ok, "fine"),
            Check::new("second", Status::Warn, "look"),
        ]);
        assert!(report.healthy);
        assert_eq!(report.text(), "ok    one     fine\nwarn  second  look\n");
        let report = Report::new(vec![
            Check::new("one", Status::Ok, "fine"),
            Check::new("two", Status::Fail, "broken"),
        ]);
        assert!(!report.healthy);
        assert_eq!(report.text(), "ok    one  fine\nFAIL  two  broken\n");
    }

    #[test]
    fn a_combined_check_takes_the_worst_status_and_every_detail() {
        let c = Check::combined(
            "x",
            vec![
                (Status::Ok, "a".into()),
                (Status::Fail, "b".into()),
                (Status::Warn, "c".into()),
            ],
        );
        assert_eq!(c, Check::new("x", Status::Fail, "a; b; c"));
        assert_eq!(Check::combined("x", vec![]).status, Status::Ok);
    }

    #[test]
    fn json_names_the_status_in_lower_case() {
        let report = Report::new(vec![Check::new("one", Status::Fail, "broken")]);
        let json = serde_json::to_value(&report).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({"healthy": false, "checks": [
                {"name": "one", "status": "fail", "detail": "broken"}
            ]})
        );
    }
}
