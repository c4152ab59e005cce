//! Rendezvous (highest-random-weight) sharding of PodCertificateRequests over the live members.
//!
//! Every member ranks the members for a request's uid by `weight(member, uid)` — the first
//! 8 bytes of SHA-256(member ‖ 0 ‖ uid) — and the first in that order owns it. A member joining
//! or leaving moves only the requests it gains or held (the minimum churn), and every replica
//! computes the same owner from the same member list without talking to the others.
//!
//! A pending request that no one settled within a bound (its owner is stuck, or membership is
//! moving) falls to the next member in its order: after one `takeover_after` the second may take
//! it, after two the third, and so on ([`owns`]) — unless a member ahead of it in that order is
//! seen settling requests (its member Lease's settled count moved within the bound): an owner
//! working through a burst longer than the bound is not doubled, which would add writes the
//! API server refuses just when it is the bottleneck. Such a request is taken over only after
//! [`BUSY_FACTOR`] bounds (a request its owner lost, say).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::membership::Members;
use crate::request::Pcr;

/// The weight of `member` for the request `uid`: stable across processes and releases.
pub fn weight(member: &str, uid: &str) -> u64 {
    let mut input = Vec::with_capacity(member.len() + 1 + uid.len());
    input.extend_from_slice(member.as_bytes());
    // A separator, so ("ab", "c") and ("a", "bc") weigh differently.
    input.push(0);
    input.extend_from_slice(uid.as_bytes());
    let hex = podca_signer::x509::sha256_hex(&input);
    // sha256_hex gives 64 lowercase hex digits; the first 16 are a u64.
    u64::from_str_radix(&hex[..16], 16).unwrap_or(0)
}

/// The members ahead of `me` in `uid`'s order (none: `me` owns it); `None` when `me` is not a
/// member. Ties (never seen with SHA-256) are broken by the member name.
fn ahead<'m, S: AsRef<str>>(me: &str, members: &'m [S], uid: &str) -> Option<Vec<&'m str>> {
    let mine = weight(me, uid);
    let mut found = false;
    let mut ahead = Vec::new();
    for member in members {
        let member = member.as_ref();
        if member == me {
            found = true;
            continue;
        }
        let theirs = weight(member, uid);
        if theirs > mine || (theirs == mine && member < me) {
            ahead.push(member);
        }
    }
    found.then_some(ahead)
}

/// How many bounds a request waits before it is taken over from members that are settling
/// others (busy, not stuck).
pub const BUSY_FACTOR: u32 = 10;

/// Whether `me` should work on `uid`, pending for `age`: its owner always; the member ranked
/// `k` once the request has waited `k × takeover_after` and no member ranked above it is
/// `busy` (settling requests: a stuck owner is covered by the next), or `k × BUSY_FACTOR`
/// bounds whatever the others do.
///
/// `Some(k)`: `me` works on it, ranked `k` in its order (0: the owner); `None`: not `me`'s.
pub fn owns<S: AsRef<str>>(
    me: &str,
    members: &[S],
    uid: &str,
    age: Duration,
    takeover_after: Duration,
    busy: impl Fn(&str) -> bool,
) -> Option<usize> {
    let ahead = ahead(me, members, uid)?;
    let rank = ahead.len();
    if rank == 0 {
        return Some(0);
    }
    if takeover_after.is_zero() {
        return None;
    }
    let waited = age.as_secs_f64() / takeover_after.as_secs_f64();
    let entitled = waited >= (rank * BUSY_FACTOR as usize) as f64
        || (waited >= rank as f64 && !ahead.into_iter().any(busy));
    entitled.then_some(rank)
}

/// How long a pending request waits for its owner before the next member in its order takes
/// it: four Lease durations, and at least a minute, so that an owner merely working through a
/// burst is not doubled (an owner that stops renewing leaves the set after one duration).
pub fn takeover_after(lease_duration: Duration) -> Duration {
    (lease_duration * 4).max(Duration::from_secs(60))
}

/// The sharding metrics (`podca_controller_*`).
#[derive(Debug, Clone, Default)]
pub struct ShardMetrics {
    /// `podca_controller_members`: live members as this replica sees them.
    pub members: Gauge,
    /// `podca_controller_owned_share`: the share of requests this replica owns (1/members),
    /// 0 while it is not a member.
    pub owned_share: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `podca_controller_parked_requests`: pending requests seen here that another member owns.
    pub parked: Gauge,
    /// `podca_controller_handovers_total{cause}`: pending requests this replica took over from
    /// another member (`membership`: the owner left or this one joined; `takeover`: the owner
    /// did not settle it in time).
    pub handovers: Family<CauseLabels, Counter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

impl ShardMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = ShardMetrics::default();
        registry.register(
            "members",
            "Live podca replicas (member Leases) as this replica sees them",
            m.members.clone(),
        );
        registry.register(
            "owned_share",
            "Share of PodCertificateRequests this replica owns (rendezvous sharding)",
            m.owned_share.clone(),
        );
        registry.register(
            "parked_requests",
            "Pending PodCertificateRequests seen here that another member owns",
            m.parked.clone(),
        );
        registry.register(
            "handovers",
            "Pending PodCertificateRequests taken over from another member, by cause",
            m.handovers.clone(),
        );
        m
    }

    /// Shows `members`.
    pub fn show(&self, members: &Members) {
        self.members.set(members.live.len() as i64);
        let share = if members.includes_me() {
            1.0 / members.live.len() as f64
        } else {
            0.0
        };
        self.owned_share.set(share);
    }
}

/// This replica's part in rendezvous sharding: the members it sees, and the pending requests
/// it saw that others own ("parked"), to take when ownership moves to it.
#[derive(Debug)]
pub struct Shard {
    pub members: watch::Receiver<Members>,
    pub takeover_after: Duration,
    pub metrics: ShardMetrics,
    /// Requests this replica settled (its member Lease says so to the others).
    settled: Arc<AtomicU64>,
    parked: Mutex<HashMap<String, Arc<Pcr>>>,
}

impl Shard {
    pub fn new(
        members: watch::Receiver<Members>,
        takeover_after: Duration,
        metrics: ShardMetrics,
        settled: Arc<AtomicU64>,
    ) -> Self {
        Shard {
            members,
            takeover_after,
            metrics,
            settled,
            parked: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a request this replica settled.
    pub fn count_settled(&self) {
        self.settled.fetch_add(1, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Pcr>>> {
        // Nothing panics while holding the lock; recover the map if something ever does.
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where this replica stands for `pcr` at `now`: `Some(0)` owner, `Some(k)` k-th in line
    /// and entitled by its age, `None` not its to work on.
    fn standing(&self, pcr: &Pcr, now: OffsetDateTime) -> Option<usize> {
        let members = self.members.borrow();
        let clock = tokio::time::Instant::now();
        if !members.includes_me_at(clock) {
            return None;
        }
        let age = pcr
            .created
            .and_then(|c| Duration::try_from(now - c).ok())
            .unwrap_or(Duration::ZERO);
        owns(
            &members.me,
            &members.live,
            &pcr.uid,
            age,
            self.takeover_after,
            |member| {
                members
                    .progressed
                    .get(member)
                    .is_some_and(|at| clock < *at + self.takeover_after)
            },
        )
    }

    /// Whether this replica works on `pcr` now; if not, it is parked until it does.
    pub fn take_or_park(&self, pcr: &Arc<Pcr>, now: OffsetDateTime) -> bool {
        if self.standing(pcr, now).is_some() {
            return true;
        }
        self.lock().insert(pcr.uid.clone(), Arc::clone(pcr));
        false
    }

    /// Forgets a parked request (settled or deleted).
    pub fn unpark(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Parked requests.
    pub fn parked(&self) -> usize {
        self.lock().len()
    }

    /// Takes out of the parked set the requests this replica works on now (counted as
    /// handovers).
    pub fn claim(&self, now: OffsetDateTime) -> Vec<Arc<Pcr>> {
        let mut parked = self.lock();
        let mut claimed = Vec::new();
        parked.retain(|_, pcr| match self.standing(pcr, now) {
            None => true,
            Some(rank) => {
                let cause = if rank == 0 { "membership" } else { "takeover" };
                self.metrics
                    .handovers
                    .get_or_create(&CauseLabels { cause })
                    .inc();
                claimed.push(Arc::clone(pcr));
                false
            }
        });
        claimed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `me` stands in `uid`'s order over `members` (0: the owner).
    fn rank<S: AsRef<str>>(me: &str, members: &[S], uid: &str) -> Option<usize> {
        ahead(me, members, uid).map(|ahead| ahead.len())
    }

    /// Whether `me` works on `uid` (see [`super::owns`]).
    fn owns<S: AsRef<str>>(
        me: &str,
        members: &[S],
        uid: &str,
        age: Duration,
        takeover_after: Duration,
        busy: impl Fn(&str) -> bool,
    ) -> bool {
        super::owns(me, members, uid, age, takeover_after, busy).is_some()
    }

    /// The owner of `uid` among `members`.
    fn owner<'a, S: AsRef<str>>(members: &'a [S], uid: &str) -> Option<&'a str> {
        members
            .iter()
            .map(AsRef::as_ref)
            .max_by(|a, b| weight(a, uid).cmp(&weight(b, uid)).then(b.cmp(a)))
    }

    fn uids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("6f1c2d3e-0000-4000-8000-{i:012}"))
            .collect()
    }

    #[test]
    fn weight_is_stable_and_separates_member_from_uid() {
        // Fixed values: a change of hash would split a rolling upgrade's replicas.
        assert_eq!(weight("a", "b"), weight("a", "b"));
        assert_ne!(weight("ab", "c"), weight("a", "bc"));
        let w = weight("podca-0", "uid-1");
        let hex = podca_signer::x509::sha256_hex(b"podca-0\0uid-1");
        assert_eq!(format!("{w:016x}"), hex[..16]);
    }

    #[test]
    fn exactly_one_owner_per_uid() {
        let members = ["a", "b", "c"];
        for uid in uids(500) {
            let owners: Vec<_> = members
                .iter()
                .filter(|m| rank(m, &members, &uid) == Some(0))
                .collect();
            assert_eq!(owners.len(), 1, "{uid}: {owners:?}");
            assert_eq!(owner(&members, &uid), Some(*owners[0]));
        }
        assert_eq!(rank("d", &members, "x"), None);
        assert_eq!(owner::<&str>(&[], "x"), None);
    }

    #[test]
    fn shares_are_balanced() {
        let members = ["podca-7d9f-a", "podca-7d9f-b", "podca-7d9f-c"];
        let all = uids(30_000);
        for m in members {
            let share = all.iter().filter(|u| owner(&members, u) == Some(m)).count();
            // 10,000 expected; 3 sigma of a binomial(30000, 1/3) is ~245.
            assert!((9_600..=10_400).contains(&share), "{m}: {share}");
        }
    }

    #[test]
    fn a_member_joining_takes_only_its_share_and_leaving_moves_only_its_own() {
        let three = ["a", "b", "c"];
        let four = ["a", "b", "c", "d"];
        let all = uids(20_000);
        let mut moved = 0;
        for u in &all {
            let before = owner(&three, u);
            let after = owner(&four, u);
            if before != after {
                // Minimum churn: what moves, moves to the newcomer.
                assert_eq!(after, Some("d"), "{u}");
                moved += 1;
            }
        }
        // A quarter expected (5,000).
        assert!((4_700..=5_300).contains(&moved), "{moved}");
        // c leaves: only c's requests move, and they spread over the others.
        let two = ["a", "b"];
        for u in &all {
            let before = owner(&three, u);
            if before != Some("c") {
                assert_eq!(owner(&two, u), before, "{u}");
            }
        }
    }

    #[test]
    fn the_next_in_order_takes_over_after_the_bound() {
        let members = ["a", "b", "c"];
        let bound = Duration::from_secs(30);
        let uid = "some-uid";
        let mut order: Vec<&str> = members.to_vec();
        order.sort_by_key(|m| rank(m, &members, uid));
        let (first, second, third) = (order[0], order[1], order[2]);
        let stuck = |_: &str| false;
        assert!(owns(first, &members, uid, Duration::ZERO, bound, stuck));
        assert!(!owns(
            second,
            &members,
            uid,
            Duration::from_secs(29),
            bound,
            stuck
        ));
        assert!(owns(
            second,
            &members,
            uid,
            Duration::from_secs(30),
            bound,
            stuck
        ));
        assert!(!owns(
            third,
            &members,
            uid,
            Duration::from_secs(59),
            bound,
            stuck
        ));
        assert!(owns(
            third,
            &members,
            uid,
            Duration::from_secs(60),
            bound,
            stuck
        ));
        assert!(!owns(
            "z",
            &members,
            uid,
            Duration::from_secs(600),
            bound,
            stuck
        ));
        assert!(!owns(
            second,
            &members,
            uid,
            Duration::from_secs(600),
            Duration::ZERO,
            stuck
        ));
    }

    #[test]
    fn a_busy_member_ahead_is_covered_only_after_ten_bounds() {
        let members = ["a", "b", "c"];
        let bound = Duration::from_secs(30);
        let uid = "another-uid";
        let mut order: Vec<&str> = members.to_vec();
        order.sort_by_key(|m| rank(m, &members, uid));
        let (first, second, third) = (order[0], order[1], order[2]);
        let s = Duration::from_secs;
        // The owner settles others: its request waits for it, however long, up to ten bounds.
        let owner_busy = |m: &str| m == first;
        assert!(!owns(second, &members, uid, s(299), bound, owner_busy));
        assert!(owns(second, &members, uid, s(300), bound, owner_busy));
        // The third waits while either member ahead of it is busy.
        assert!(!owns(third, &members, uid, s(60), bound, owner_busy));
        let second_busy = |m: &str| m == second;
        assert!(owns(second, &members, uid, s(30), bound, second_busy));
        assert!(!owns(third, &members, uid, s(599), bound, second_busy));
        assert!(owns(third, &members, uid, s(600), bound, second_busy));
        // Busy members behind it do not hold it back; the owner is never held back.
        let third_busy = |m: &str| m == third;
        assert!(owns(second, &members, uid, s(30), bound, third_busy));
        assert!(owns(first, &members, uid, s(0), bound, |_| true));
    }

    fn pcr(uid: &str) -> Arc<Pcr> {
        Arc::new(Pcr {
            created: Some(time::macros::datetime!(2026-12-07 01:00:00 UTC)),
            ..crate::request::test_pcr(uid, uid)
        })
    }

    fn members(me: &str, live: &[&str]) -> Members {
        Members {
            me: me.into(),
            live: Arc::new(live.iter().map(|m| m.to_string()).collect()),
            me_until: Some(tokio::time::Instant::now() + Duration::from_secs(60)),
            progressed: Default::default(),
        }
    }

    #[tokio::test]
    async fn parked_requests_are_claimed_when_their_owner_leaves_or_stalls() {
        let (tx, rx) = watch::channel(members("a", &["a", "b"]));
        let shard = Shard::new(
            rx,
            Duration::from_secs(60),
            ShardMetrics::default(),
            Arc::default(),
        );
        let now = time::macros::datetime!(2026-12-07 01:00:01 UTC);
        let all: Vec<_> = uids(200).iter().map(|u| pcr(u)).collect();
        let mine = all.iter().filter(|p| shard.take_or_park(p, now)).count();
        assert!((60..=140).contains(&mine), "{mine}");
        assert_eq!(shard.parked(), 200 - mine);
        // Nothing moves while b lives and its requests are young.
        assert!(shard.claim(now).is_empty());
        // Its requests pending past the bound: a takes them over.
        let late = now + time::Duration::seconds(61);
        let taken = shard.claim(late);
        assert_eq!(taken.len(), 200 - mine);
        assert_eq!(shard.parked(), 0);
        let takeovers = shard
            .metrics
            .handovers
            .get_or_create(&CauseLabels { cause: "takeover" })
            .get();
        assert_eq!(takeovers, (200 - mine) as u64);
        // Parked again; b leaves: a owns them all at once.
        for p in &taken {
            assert!(shard.take_or_park(p, late));
        }
        tx.send_replace(members("a", &["a", "b"]));
        let young: Vec<_> = uids(200).iter().map(|u| pcr(&format!("y{u}"))).collect();
        let parked = young.iter().filter(|p| !shard.take_or_park(p, now)).count();
        assert_eq!(shard.parked(), parked);
        tx.send_replace(members("a", &["a"]));
        assert_eq!(shard.claim(now).len(), parked);
        let moved = shard
            .metrics
            .handovers
            .get_or_create(&CauseLabels {
                cause: "membership",
            })
            .get();
        assert_eq!(moved, parked as u64);
        // Settled or deleted: forgotten.
        tx.send_replace(members("a", &["a", "b"]));
        let p = young
            .iter()
            .find(|p| !shard.take_or_park(p, now))
            .expect("one of b's");
        shard.unpark(&p.uid);
        assert_eq!(shard.parked(), 0);
        // Not fresh (resumed after SIGSTOP): nothing is ours.
        let mut stale = members("a", &["a"]);
        stale.me_until = Some(tokio::time::Instant::now());
        tx.send_replace(stale);
        assert!(!shard.take_or_park(&young[0], now));
    }
}
