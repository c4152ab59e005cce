//! Pod lifecycle states and pod-bound service-account tokens, as kube-apiserver handles them.
//!
//! * A graceful delete does not remove a pod: it sets `metadata.deletionTimestamp` (now + the
//!   grace period) and `metadata.deletionGracePeriodSeconds`; the pod stays readable until the
//!   kubelet confirms. [`Emulator::begin_pod_deletion`] does exactly that.
//! * `status.phase` moves to `Succeeded` or `Failed` when a pod's containers have ended
//!   ([`Emulator::set_pod_phase`]).
//! * A token bound to a pod (`boundObjectRef` kind Pod, the `kubernetes.io` claims' pod name and
//!   UID) is valid only while that pod exists with that UID and is not long past its
//!   deletionTimestamp (the service-account token authenticator's `Validate`): TokenReview
//!   answers `authenticated: false` with "service account token has been invalidated" or a UID
//!   mismatch message otherwise ([`bound_pod_problem`]).
//!
//! TokenReviews are counted (`Counters::token_reviews`) along with the most ever in flight at
//! once (`Counters::token_reviews_max_in_flight`); [`Emulator::set_token_review_delay`] makes
//! each review take a while, so that a test can see how many a client runs concurrently.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use time::OffsetDateTime;

use super::auth::ServiceAccountToken;
use super::resources::Res;
use super::{Emulator, Shared, lock, pcr};

/// How long after its deletionTimestamp a pod still vouches for its tokens
/// (kube-apiserver's `invalidIfDeletedBefore`).
const DELETED_POD_TOKEN_GRACE: time::Duration = time::Duration::seconds(10);
/// The default grace period of a pod delete (`terminationGracePeriodSeconds`).
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// TokenReview knobs and in-flight accounting.
#[derive(Debug, Default)]
pub(crate) struct TokenReviewState {
    delay_ms: AtomicU64,
    in_flight: AtomicU64,
}

/// Held while one TokenReview is answered.
pub(crate) struct InFlight<'a>(&'a Shared);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.token_review.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts one TokenReview, waits the configured delay, and tracks the most in flight.
pub(crate) async fn begin_token_review(shared: &Shared) -> InFlight<'_> {
    let now = shared.token_review.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    shared.count(|c| {
        c.token_reviews += 1;
        c.token_reviews_max_in_flight = c.token_reviews_max_in_flight.max(now);
    });
    let guard = InFlight(shared);
    let delay = shared.token_review.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    guard
}

/// Why a pod-bound token no longer authenticates, in TokenReview's words; `None`: it does (or
/// is bound to no pod).
pub(crate) fn bound_pod_problem(
    shared: &Shared,
    token: &ServiceAccountToken,
    now: OffsetDateTime,
) -> Option<String> {
    let name = token.pod_name.as_deref()?;
    let pod = lock(&shared.store).get(Res::Pod, &token.namespace, name);
    let Some(pod) = pod else {
        return Some("service account token has been invalidated".into());
    };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    if let Some(want) = token.pod_uid.as_deref()
        && uid != want
    {
        return Some(format!(
            "pod UID ({uid}) does not match service account pod ref UID ({want})"
        ));
    }
    let deleted = pod["metadata"]["deletionTimestamp"].as_str().and_then(|t| {
        OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
    });
    if deleted.is_some_and(|at| at < now - DELETED_POD_TOKEN_GRACE) {
        return Some("service account token has been invalidated".into());
    }
    None
}

impl Emulator {
    /// Every TokenReview takes `delay` from now on (zero: answered at once).
    pub fn set_token_review_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared
            .token_review
            .delay_ms
            .store(ms, Ordering::SeqCst);
    }

    /// A graceful delete as kube-apiserver records it: deletionTimestamp = now + grace period.
    /// Returns false when there is no such pod.
    pub fn begin_pod_deletion(&self, namespace: &str, name: &str) -> bool {
        let at = pcr::fmt_time(self.now() + time::Duration::seconds(DEFAULT_GRACE_SECONDS));
        self.update_pod(namespace, name, |pod| {
            pod["metadata"]["deletionTimestamp"] = json!(at);
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(DEFAULT_GRACE_SECONDS);
        })
    }

    /// Sets `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    pub fn set_pod_phase(&self, namespace: &str, name: &str, phase: &str) -> bool {
        self.update_pod(namespace, name, |pod| {
            pod["status"]["phase"] = json!(phase);
        })
    }

    /// The UID of a pod.
    pub fn pod_uid(&self, namespace: &str, name: &str) -> Option<String> {
        let pod = lock(&self.shared.store).get(Res::Pod, namespace, name)?;
        pod["metadata"]["uid"].as_str().map(str::to_owned)
    }

    fn update_pod(&self, namespace: &str, name: &str, change: impl FnOnce(&mut Value)) -> bool {
        let mut store = lock(&self.shared.store);
        let Some(pod) = store.get(Res::Pod, namespace, name) else {
            return false;
        };
        let mut pod = (*pod).clone();
        change(&mut pod);
        store.put(Res::Pod, namespace, name, pod);
        true
    }
}
