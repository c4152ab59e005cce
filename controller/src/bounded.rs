//! Bounds on every Kubernetes call podca makes, in one place. During an API outage — the nasty
//! kind, where connections are accepted but nothing is answered — no task may wait longer than
//! these bounds: a stalled call fails with a timeout, counts in
//! `podca_kube_request_timeouts_total{call}`, and its work stays pending (the PCR stays queued,
//! the bundle or the history is written on the next round) until the API answers again.
//!
//! * Every request/response call (get, list, create, replace, patch, delete) is one attempt
//!   bounded by [`CALL_TIMEOUT`] as a whole ([`call`]).
//! * The client itself: [`CONNECT_TIMEOUT`], [`WRITE_TIMEOUT`], and [`READ_TIMEOUT`] between
//!   two reads of a response (counted from the request, not from when a pooled connection went
//!   idle), which also ends a watch whose connection went silent. Watches ask the server to end
//!   them after [`WATCH_TIMEOUT_SECONDS`] (then resume from their resourceVersion without a
//!   relist), and kube's watcher reconnects a watch that delivered nothing — not even a
//!   bookmark — for that long plus 5 s, so a watch open when the API vanished is re-established
//!   at most about 25 s after the last thing it heard, and at once when the API is back.
//! * Retry budget: kube's built-in retry of 429/503/504 (up to 15 attempts, delays up to 1000 s)
//!   is turned off: it is what blocked calls for minutes. A failed or timed-out call is retried
//!   by the loop that owns the work, with that loop's backoff: a PCR with
//!   exponential backoff from 200 ms to 30 s (plus jitter) until it is answered or expires, a
//!   ClusterTrustBundle on the publisher's next round (backoff to 30 s), the CA history on the
//!   Secret backend's next check (at most 30 s later). Calls at start, where no loop retries
//!   yet, get [`START_ATTEMPTS`] attempts ([`retrying`]).
//! * The leader Lease (kube-lease-manager) gets a client of its own ([`lease_client`]) whose
//!   every call is bounded by half the renewal grace ([`lease_call_bound`]); the leader steps
//!   down when a renewal fails, or has not succeeded a quarter of the grace before the Lease
//!   would expire ([`lease_step_down_after`]), so an outage never leaves two replicas leading.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use podca_authority::metrics::{CallLabels, Metrics};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

/// Connecting to the API server (TCP and TLS).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Sending a request.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Waiting for the next bytes of a response. Above [`WATCH_TIMEOUT_SECONDS`], so that a quiet
/// but healthy watch is ended by the server before this fires.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// One request/response call as a whole.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server keeps a watch open before ending it (`timeoutSeconds`).
pub const WATCH_TIMEOUT_SECONDS: u32 = 20;
/// Attempts of a call made at start, before any retrying loop runs.
pub const START_ATTEMPTS: u32 = 3;
/// The pause before the second attempt at start; doubled for each further one.
pub const START_RETRY_DELAY: Duration = Duration::from_millis(500);

/// Sets the client's timeouts and turns off kube's own retries (see the module docs).
pub fn configure(config: &mut kube::Config) {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(WRITE_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.reset_reader_on_write = true;
    config.default_retry = false;
}

/// A watcher configuration with podca's watch timeout.
pub fn watcher_config(config: kube::runtime::watcher::Config) -> kube::runtime::watcher::Config {
    config.timeout(WATCH_TIMEOUT_SECONDS)
}

/// Why a call gave up waiting.
#[derive(Debug, thiserror::Error)]
#[error("the Kubernetes API did not answer {call} within {after:?}")]
pub struct TimedOut {
    pub call: &'static str,
    /// The bound that passed ([`CALL_TIMEOUT`], or a Lease call's shorter one).
    pub after: Duration,
}

/// Runs one Kubernetes call bounded by [`CALL_TIMEOUT`]; a timeout is counted under `call` and
/// returned as a transport error (which every caller already treats as transient).
pub async fn call<T>(
    call: &'static str,
    metrics: &Metrics,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(CALL_TIMEOUT, request).await {
        Ok(result) => result,
        Err(_) => {
            metrics
                .kube_request_timeouts
                .get_or_create(&CallLabels { call })
                .inc();
            warn!(call, timeout = ?CALL_TIMEOUT, "Kubernetes API call timed out; the work stays pending");
            Err(kube::Error::Service(Box::new(TimedOut {
                call,
                after: CALL_TIMEOUT,
            })))
        }
    }
}

/// [`call`] up to [`START_ATTEMPTS`] times while it fails transiently (a timeout, a transport
/// error, 429 or 5xx), for the calls at start.
pub async fn retrying<T, F, Fut>(
    name: &'static str,
    metrics: &Metrics,
    mut request: F,
) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut delay = START_RETRY_DELAY;
    let mut attempt = 1;
    loop {
        match call(name, metrics, request()).await {
            Err(e) if attempt < START_ATTEMPTS && transient(&e) => {
                warn!(call = name, attempt, error = %e, ?delay, "retrying a Kubernetes API call");
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The leader Lease's calls: each request of kube-lease-manager is one attempt bounded by half
/// the renewal grace (`--lease-duration` minus `--lease-renew-deadline`: the holder renews that
/// long before the Lease expires), at most [`CALL_TIMEOUT`], counted as `lease_get`,
/// `lease_create`, `lease_update` or `lease_patch` when it times out. So a renewal that cannot
/// complete fails while the Lease is still ours, and the leader steps down before anyone else
/// may take it.
pub fn lease_call_bound(lease_duration: Duration, renew_deadline: Duration) -> Duration {
    (lease_grace(lease_duration, renew_deadline) / 2)
        .clamp(Duration::from_millis(100), CALL_TIMEOUT)
}

/// How long after the start of its last successful Lease write a leader stops leading unless
/// it renewed meanwhile: the Lease's duration less a quarter of the grace, which is after a
/// renewal begun on time has succeeded or failed ([`lease_call_bound`]) and before the Lease
/// expires, leaving the rest for clock skew between replicas and for stopping work.
pub fn lease_step_down_after(lease_duration: Duration, renew_deadline: Duration) -> Duration {
    lease_duration.saturating_sub(lease_grace(lease_duration, renew_deadline) / 4)
}

/// The renewal grace kube-lease-manager is given: at least one second, less than the duration.
fn lease_grace(lease_duration: Duration, renew_deadline: Duration) -> Duration {
    let duration = lease_duration.as_secs().max(1);
    Duration::from_secs(
        duration
            .saturating_sub(renew_deadline.as_secs())
            .clamp(1, duration.saturating_sub(1).max(1)),
    )
}

/// A client for kube-lease-manager whose every request is bounded by `bound` (see
/// [`lease_call_bound`]), and the start of the last Lease write that succeeded: the Lease is
/// valid until at most that instant plus its duration (the renewal time it carries was set
/// before the request was sent).
pub fn lease_client(
    client: kube::Client,
    bound: Duration,
    metrics: Arc<Metrics>,
) -> (kube::Client, watch::Receiver<Option<Instant>>) {
    let (renewed, renewed_rx) = watch::channel(None);
    let namespace = client.default_namespace().to_owned();
    let service = LeaseCalls {
        inner: client,
        bound,
        metrics,
        renewed: Arc::new(renewed),
    };
    (kube::Client::new(service, namespace), renewed_rx)
}

/// The tower service behind [`lease_client`]: the inner client's `send`, bounded.
#[derive(Clone)]
struct LeaseCalls {
    inner: kube::Client,
    bound: Duration,
    metrics: Arc<Metrics>,
    renewed: Arc<watch::Sender<Option<Instant>>>,
}

type LeaseResponse = http::Response<kube::client::Body>;

impl tower_service::Service<http::Request<kube::client::Body>> for LeaseCalls {
    type Response = LeaseResponse;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<LeaseResponse, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let call = lease_call_name(request.method());
        let writes = call != "lease_get";
        let Self {
            inner,
            bound,
            metrics,
            renewed,
        } = self.clone();
        Box::pin(async move {
            let started = Instant::now();
            match tokio::time::timeout(bound, inner.send(request)).await {
                Ok(Ok(response)) => {
                    if writes && response.status().is_success() {
                        renewed.send_replace(Some(started));
                    }
                    Ok(response)
                }
                Ok(Err(e)) => Err(e),
                Err(_) => {
                    metrics
                        .kube_request_timeouts
                        .get_or_create(&CallLabels { call })
                        .inc();
                    warn!(call, timeout = ?bound, "leader Lease call timed out");
                    Err(kube::Error::Service(Box::new(TimedOut {
                        call,
                        after: bound,
                    })))
                }
            }
        })
    }
}

/// The `call` label of a Lease request.
fn lease_call_name(method: &http::Method) -> &'static str {
    match *method {
        http::Method::POST => "lease_create",
        http::Method::PUT => "lease_update",
        http::Method::PATCH => "lease_patch",
        _ => "lease_get",
    }
}

fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_stalled_call_times_out_and_is_counted_under_its_name() {
        let metrics = Metrics::new();
        let started = tokio::time::Instant::now();
        let e = call(
            "get_thing",
            &metrics,
            std::future::pending::<Result<(), _>>(),
        )
        .await
        .expect_err("stalled");
        assert_eq!(started.elapsed(), CALL_TIMEOUT);
        assert_eq!(
            e.to_string(),
            "ServiceError: the Kubernetes API did not answer get_thing within 10s"
        );
        let count = |call| {
            metrics
                .kube_request_timeouts
                .get_or_create(&CallLabels { call })
                .get()
        };
        assert_eq!((count("get_thing"), count("other")), (1, 0));
    }

    #[test]
    fn a_lease_call_ends_before_the_leader_steps_down_and_that_before_the_lease_expires() {
        let s = Duration::from_secs;
        // (duration, renew deadline) → (call bound, step down after)
        let table = [
            (
                (s(15), s(10)),
                (Duration::from_millis(2500), Duration::from_millis(13750)),
            ),
            (
                (s(4), s(3)),
                (Duration::from_millis(500), Duration::from_millis(3750)),
            ),
            ((s(60), s(10)), (CALL_TIMEOUT, Duration::from_millis(47500))),
            // A renew deadline at or past the duration still leaves a one-second grace.
            (
                (s(2), s(5)),
                (Duration::from_millis(500), Duration::from_millis(1750)),
            ),
        ];
        for ((duration, renew), (bound, step_down)) in table {
            assert_eq!(
                lease_call_bound(duration, renew),
                bound,
                "{duration:?}/{renew:?}"
            );
            assert_eq!(
                lease_step_down_after(duration, renew),
                step_down,
                "{duration:?}/{renew:?}"
            );
            let grace = lease_grace(duration, renew);
            // A renewal begun on time (grace before expiry) has ended before the step-down.
            assert!(
                duration - grace + bound < step_down,
                "{duration:?}/{renew:?}"
            );
            assert!(step_down < duration, "{duration:?}/{renew:?}");
        }
    }

    /// A stalled Lease call gives up after the Lease bound and says so, not the general one.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_lease_call_names_its_own_bound() {
        /// A server that never answers.
        #[derive(Clone)]
        struct Stalled;
        impl tower_service::Service<http::Request<kube::client::Body>> for Stalled {
            type Response = LeaseResponse;
            type Error = kube::Error;
            type Future = std::future::Pending<Result<LeaseResponse, kube::Error>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: http::Request<kube::client::Body>) -> Self::Future {
                std::future::pending()
            }
        }
        let stalled = kube::Client::new(Stalled, "default");
        let metrics = Arc::new(Metrics::new());
        let bound = Duration::from_millis(500);
        let (client, renewed) = lease_client(stalled, bound, Arc::clone(&metrics));
        let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(client, "default");
        let started = tokio::time::Instant::now();
        let e = api
            .get("podca-controller")
            .await
            .expect_err("never answered");
        assert_eq!(started.elapsed(), bound);
        assert!(
            e.to_string()
                .ends_with("the Kubernetes API did not answer lease_get within 500ms"),
            "{e}"
        );
        assert!(renewed.borrow().is_none(), "a read renews nothing");
    }

    #[test]
    fn each_lease_request_is_counted_under_its_own_name() {
        use http::Method;
        assert_eq!(
            [Method::GET, Method::POST, Method::PUT, Method::PATCH].map(|m| lease_call_name(&m)),
            ["lease_get", "lease_create", "lease_update", "lease_patch"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn calls_at_start_get_a_bounded_number_of_attempts() {
        let metrics = Metrics::new();
        let attempts = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let e = retrying("discover", &metrics, || {
            attempts.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<(), kube::Error>>()
        })
        .await
        .expect_err("never answered");
        assert!(e.to_string().contains("did not answer discover"), "{e}");
        assert_eq!(attempts.load(Ordering::SeqCst), START_ATTEMPTS);
        // Three timeouts and the pauses of 0.5 s and 1 s between them.
        assert_eq!(
            started.elapsed(),
            CALL_TIMEOUT * 3 + Duration::from_millis(1500)
        );
        let refused = AtomicU32::new(0);
        let forbidden = retrying("discover", &metrics, || {
            refused.fetch_add(1, Ordering::SeqCst);
            async {
                Err::<(), _>(kube::Error::Api(Box::new(
                    kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
                )))
            }
        })
        .await;
        assert!(
            matches!(&forbidden, Err(kube::Error::Api(s)) if s.code == 403),
            "{forbidden:?}"
        );
        assert_eq!(refused.load(Ordering::SeqCst), 1, "403 is not retried");
    }
}
