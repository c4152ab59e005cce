//! Leader election on a `coordination.k8s.io/v1` Lease: only the holder watches and writes.
//!
//! [`start`] spawns the task that takes and renews the Lease and says on a watch channel
//! whether this replica leads; it leads only while kube-lease-manager holds the Lease *and*
//! the last successful write is recent enough ([`bounded::lease_step_down_after`]), and it
//! releases the Lease when told to stop.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use podca_authority::metrics::Metrics;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{Error, bounded};

/// Leader election on a `coordination.k8s.io/v1` Lease.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    pub lease_name: String,
    pub lease_namespace: String,
    /// This process's identity in the Lease.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderElection {
    /// The Lease `name`: in `namespace` (default `default`), as `identity` (default
    /// `<POD_NAME or HOSTNAME>-<random>`, so two processes on one host never share one), with
    /// kube-controller-manager's timings (15 s, renewed within 10 s, retried every 2 s).
    pub fn new(name: String, namespace: Option<String>, identity: Option<String>) -> Self {
        let base = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "podca".into());
        LeaderElection {
            lease_name: name,
            lease_namespace: namespace.unwrap_or_else(|| "default".into()),
            identity: identity.unwrap_or_else(|| format!("{base}-{:08x}", random_suffix())),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    pub fn with_timings(
        self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Self {
        LeaderElection {
            lease_duration,
            renew_deadline,
            retry_period,
            ..self
        }
    }
}

fn random_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

/// Takes and keeps the Lease until `stop`, saying on `leading` whether this replica leads.
pub(crate) async fn start(
    client: Client,
    le: LeaderElection,
    leading: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) -> Result<JoinHandle<()>, Error> {
    // Every Lease call is bounded below the renewal grace, and the last successful write tells
    // until when the Lease is surely ours (see bounded::lease_client).
    let bound = bounded::lease_call_bound(le.lease_duration, le.renew_deadline);
    let (client, renewed) = bounded::lease_client(client, bound, metrics);
    let manager = lease_manager(&client, &le).await?;
    info!(
        lease = %le.lease_name,
        namespace = %le.lease_namespace,
        identity = %le.identity,
        call_bound = ?bound,
        "leader election on"
    );
    let retry = le.retry_period;
    let valid_for = bounded::lease_step_down_after(le.lease_duration, le.renew_deadline);
    let mut renewed = renewed;
    Ok(tokio::spawn(async move {
        let mut manager = Some(manager);
        // What kube-lease-manager says, and what this replica acts on: it leads only while the
        // manager holds the Lease and its last write is recent enough (a manager started afresh
        // may find the Lease still naming it, expired, and must renew before anything is done).
        let (mut holds, mut announced) = (false, false);
        loop {
            /// What one round of the loop saw.
            enum Seen {
                Changed(bool),
                Failed(kube_lease_manager::LeaseManagerError),
                NotRenewed,
                Renewed,
                Stop,
            }
            let Some(current) = manager.as_ref() else {
                // A manager that lost track of the Lease is replaced by a fresh one.
                tokio::select! {
                    built = lease_manager(&client, &le) => match built {
                        Ok(m) => manager = Some(m),
                        Err(e) => {
                            warn!(error = %e, "leader election: reading the Lease");
                            tokio::time::sleep(retry).await;
                        }
                    },
                    _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
                }
                continue;
            };
            // Leading: the Lease is ours until the last write's start plus `valid_for`, a
            // deadline each renewal moves (watched inside the branch, so a renewal does not
            // cancel the manager's own future halfway through its write).
            let seen = tokio::select! {
                r = current.changed() => match r {
                    Ok(l) => Seen::Changed(l),
                    Err(e) => Seen::Failed(e),
                },
                _ = until_fresh_is(&mut renewed, valid_for, !announced), if holds => {
                    if announced { Seen::NotRenewed } else { Seen::Renewed }
                }
                _ = async { let _ = stop.wait_for(|s| *s).await; } => Seen::Stop,
            };
            match seen {
                Seen::Changed(l) => {
                    info!(is_leader = l, "leadership changed");
                    holds = l;
                }
                Seen::Renewed => {}
                Seen::Failed(e) => {
                    warn!(error = %e, "leader election");
                    if holds {
                        // kube-lease-manager still counts itself leader after a failed renewal
                        // and would not say so when it renews later: start afresh.
                        if announced {
                            warn!("could not renew the leader Lease: stepping down");
                        }
                        holds = false;
                        manager = None;
                    } else {
                        tokio::time::sleep(retry).await;
                    }
                }
                Seen::NotRenewed => {
                    warn!("the leader Lease was not renewed in time: stepping down");
                    holds = false;
                    manager = None;
                }
                Seen::Stop => break,
            }
            let fresh =
                (*renewed.borrow()).is_some_and(|t| tokio::time::Instant::now() < t + valid_for);
            if (holds && fresh) != announced {
                announced = holds && fresh;
                let _ = leading.send(announced);
            }
            if manager.is_none() {
                tokio::time::sleep(retry).await;
            }
        }
        let _ = leading.send(false);
        if let Some(manager) = manager {
            match manager.release().await {
                Ok(()) => info!("leader Lease released"),
                Err(e) => warn!(error = %e, "releasing the leader Lease"),
            }
        }
    }))
}

/// A Lease manager for `le` on the bounded client (it makes sure the Lease exists).
async fn lease_manager(
    client: &Client,
    le: &LeaderElection,
) -> Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError> {
    let duration = le.lease_duration.as_secs().max(1);
    let grace = duration
        .saturating_sub(le.renew_deadline.as_secs())
        .clamp(1, duration.saturating_sub(1).max(1));
    kube_lease_manager::LeaseManagerBuilder::new(client.clone(), le.lease_name.clone())
        .with_namespace(le.lease_namespace.clone())
        .with_identity(le.identity.clone())
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await
}

/// Returns once "the last successful Lease write started less than `valid_for` ago" is `want`:
/// with `want = false`, when the Lease was not renewed in time (each renewal moves the
/// deadline); with `want = true`, at the next renewal. Pending forever if the sender is gone.
async fn until_fresh_is(
    renewed: &mut watch::Receiver<Option<tokio::time::Instant>>,
    valid_for: Duration,
    want: bool,
) {
    loop {
        let until = (*renewed.borrow_and_update()).map(|t| t + valid_for);
        let now = tokio::time::Instant::now();
        match until.filter(|t| now < *t) {
            Some(_) if want => return,
            None if !want => return,
            Some(until) => tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                r = renewed.changed() => if r.is_err() { std::future::pending::<()>().await },
            },
            None => {
                if renewed.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_given_are_used() {
        let election = LeaderElection::new(
            "podca-controller".into(),
            Some("podca-system".into()),
            Some("replica-a".into()),
        )
        .with_timings(
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        assert_eq!(election.lease_name, "podca-controller");
        assert_eq!(election.lease_namespace, "podca-system");
        assert_eq!(election.identity, "replica-a");
        assert_eq!(election.lease_duration, Duration::from_secs(15));
        assert_eq!(election.renew_deadline, Duration::from_secs(10));
        assert_eq!(election.retry_period, Duration::from_secs(2));
    }

    #[test]
    fn defaults_are_namespace_default_and_a_suffixed_identity() {
        let election = LeaderElection::new("podca-controller".into(), None, None);
        assert_eq!(election.lease_namespace, "default");
        let (base, suffix) = election
            .identity
            .rsplit_once('-')
            .unwrap_or_else(|| panic!("no suffix in {:?}", election.identity));
        assert!(!base.is_empty(), "{:?}", election.identity);
        assert_eq!(suffix.len(), 8, "{:?}", election.identity);
        assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()));
    }

    /// The step-down deadline follows each renewal: a leader renewing every 3 s with a 3.75 s
    /// validity never steps down, and steps down 3.75 s after the renewals stop.
    #[tokio::test(start_paused = true)]
    async fn renewals_move_the_step_down_deadline() {
        use tokio::time::Instant;
        let valid_for = Duration::from_millis(3750);
        let start = Instant::now();
        let (tx, mut rx) = watch::channel(Some(start));
        let renewer = tokio::spawn(async move {
            for i in 1..=3 {
                tokio::time::sleep_until(start + Duration::from_secs(3 * i)).await;
                tx.send_replace(Some(Instant::now()));
            }
            // Keep the sender: a closed channel would mean "never".
            std::future::pending::<()>().await;
        });
        until_fresh_is(&mut rx, valid_for, false).await;
        assert_eq!(start.elapsed(), Duration::from_secs(9) + valid_for);
        renewer.abort();
    }

    /// Not yet fresh (found expired, or never written): fresh at the next renewal.
    #[tokio::test(start_paused = true)]
    async fn a_stale_lease_is_fresh_at_its_next_renewal() {
        use tokio::time::Instant;
        let valid_for = Duration::from_secs(3);
        let start = Instant::now();
        let (tx, mut rx) = watch::channel(Some(start - Duration::from_secs(10)));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            tx.send_replace(Some(Instant::now()));
            std::future::pending::<()>().await;
        });
        until_fresh_is(&mut rx, valid_for, true).await;
        assert_eq!(start.elapsed(), Duration::from_millis(700));
    }
}
