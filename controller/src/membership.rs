//! Membership through Leases: each replica holds a `coordination.k8s.io/v1` Lease of its own
//! (`<lease name>-<identity>`, labelled `podca.dev/member=<lease name>`) and lists the others'.
//!
//! Liveness is judged the way client-go's leader election judges a holder, by observation: a
//! Lease counts as renewed when this replica *sees* its `renewTime` change, and stays live for
//! its `leaseDurationSeconds` plus a skew margin from that moment on this replica's monotonic
//! clock. A writer's skewed clock therefore moves no expiry; the Lease's own fields are trusted
//! only on first sight (an old Lease found at start is not taken for live). A Lease whose holder
//! does not match its name (someone edited it) is ignored; a member whose own renewals fail
//! leaves its own set before the others drop it.
//!
//! Each renewal also carries how many requests the member has settled (the annotation
//! [`SETTLED_ANNOTATION`]); the others note when they see that count move, on their own clock
//! again, so that a member busy with a burst is told from one that renews its Lease but settles
//! nothing (`sharding::owns`: only the latter's requests are taken over at the first bound).
//!
//! [`Roster`] is the pure part (table-tested); [`start`] runs it against the API.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use podca_authority::metrics::Metrics;
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::bounded;

/// The label that marks a member Lease; its value is the group (the leader Lease's name).
pub const MEMBER_LABEL: &str = "podca.dev/member";
/// The annotation on a member Lease with how many requests its holder has settled since it
/// started (a decimal count, moved at each renewal).
pub const SETTLED_ANNOTATION: &str = "podca.dev/settled";

/// The live members as this replica sees them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Members {
    /// This replica's identity.
    pub me: String,
    /// Live identities, sorted; holds `me` only while this replica's own Lease is fresh.
    pub live: Arc<Vec<String>>,
    /// Until when `me` may count itself in (its last renewal's start plus the duration less
    /// the margin): checked again before each write, as a process resumed after SIGSTOP runs
    /// its decisions before its membership task has looked at the clock.
    pub me_until: Option<Instant>,
    /// When each live *other* member was last seen to settle something (its
    /// [`SETTLED_ANNOTATION`] moved), on this replica's clock; first sight counts as progress.
    pub progressed: Arc<BTreeMap<String, Instant>>,
}

impl Members {
    /// Whether this replica is in its own set (and may work).
    pub fn includes_me(&self) -> bool {
        self.live.contains(&self.me)
    }

    /// Whether this replica is in its own set at `now`.
    pub fn includes_me_at(&self, now: Instant) -> bool {
        self.includes_me() && self.me_until.is_some_and(|t| now < t)
    }
}

/// A member Lease as read from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLease {
    pub name: String,
    pub holder: Option<String>,
    pub renew_time: Option<OffsetDateTime>,
    pub duration: Option<Duration>,
    /// Its holder's count of settled requests ([`SETTLED_ANNOTATION`]); `None` from a replica
    /// that does not say (an older podca), which then never counts as progressing.
    pub settled: Option<u64>,
}

/// The Lease name of `identity` in `group`: a DNS subdomain (lowercase alphanumerics, `-`, `.`).
pub fn lease_name(group: &str, identity: &str) -> String {
    let mut name: String = format!("{group}-{identity}")
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .take(253)
        .collect();
    while name.ends_with(['-', '.']) {
        name.pop();
    }
    name
}

/// What this replica remembers of one Lease.
#[derive(Debug, Clone)]
struct Observed {
    holder: String,
    renew_time: OffsetDateTime,
    /// Live until then (this replica's clock).
    live_until: Instant,
    /// Its settled count as last seen, and when it was first seen at that value.
    settled: Option<u64>,
    progressed: Instant,
}

/// The membership decision: which Leases are live, from what was listed and when.
#[derive(Debug)]
pub struct Roster {
    group: String,
    me: String,
    /// A Lease seen renewed counts this much longer than its duration (clock skew, list delay).
    margin: Duration,
    observed: HashMap<String, Observed>,
    /// Holders already warned about (a skewed clock, a mismatched name), so a log line is not
    /// repeated every round.
    warned: HashMap<String, &'static str>,
}

/// Longest duration a Lease is taken at (a Lease edited to a huge duration is not trusted).
const MAX_DURATION: Duration = Duration::from_secs(300);

impl Roster {
    pub fn new(group: &str, me: &str, margin: Duration) -> Self {
        Roster {
            group: group.to_owned(),
            me: me.to_owned(),
            margin,
            observed: HashMap::new(),
            warned: HashMap::new(),
        }
    }

    /// Takes in a listing made at `wall` (this replica's wall clock) and `now` (its monotonic
    /// clock); returns the live *other* members, sorted.
    pub fn observe(
        &mut self,
        leases: &[MemberLease],
        wall: OffsetDateTime,
        now: Instant,
    ) -> Vec<String> {
        let mut seen = HashMap::new();
        for lease in leases {
            let (Some(holder), Some(renew_time), Some(duration)) =
                (&lease.holder, lease.renew_time, lease.duration)
            else {
                continue;
            };
            if holder == &self.me || holder.is_empty() {
                continue;
            }
            if lease_name(&self.group, holder) != lease.name {
                self.warn_once(holder, "name", || {
                    warn!(
                        lease = %lease.name,
                        holder = %holder,
                        "a member Lease names a holder other than its own: ignored (edited by someone else?)"
                    )
                });
                continue;
            }
            let duration = duration.clamp(Duration::from_secs(1), MAX_DURATION);
            let live_until = match self.observed.get(&lease.name) {
                // Renewed since the last look: live for a duration from now, whatever the
                // writer's clock says.
                Some(o) if o.renew_time != renew_time || &o.holder != holder => {
                    now + duration + self.margin
                }
                Some(o) => o.live_until,
                // First sight: as long as its own fields say (plus the margin), at most a
                // duration; an expired one is not live.
                None => {
                    let margin = time::Duration::try_from(self.margin).unwrap_or_default();
                    let left = (renew_time + duration + margin) - wall;
                    let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
                    now + left.min(duration + self.margin)
                }
            };
            let progressed = match self.observed.get(&lease.name) {
                Some(o) if o.settled != lease.settled || &o.holder != holder => now,
                Some(o) => o.progressed,
                None => now,
            };
            let renewed_now = self
                .observed
                .get(&lease.name)
                .is_some_and(|o| o.renew_time != renew_time);
            if skew_suspected(renew_time, renewed_now, duration, wall) {
                self.warn_once(holder, "skew", || {
                    warn!(
                        holder = %holder,
                        renew_time = %renew_time,
                        "a member's renewTime is more than its lease duration away from this \
                         replica's clock (clock skew?): judged by when its renewals are seen"
                    )
                });
            }
            seen.insert(
                lease.name.clone(),
                Observed {
                    holder: holder.clone(),
                    renew_time,
                    live_until,
                    settled: lease.settled,
                    progressed,
                },
            );
        }
        self.observed = seen;
        self.live(now)
    }

    /// The live other members at `now`, as last listed (expiries run between listings).
    pub fn live(&self, now: Instant) -> Vec<String> {
        self.live_progress(now).into_keys().collect()
    }

    /// The live other members at `now`, each with when it was last seen to settle something.
    pub fn live_progress(&self, now: Instant) -> BTreeMap<String, Instant> {
        let mut live = BTreeMap::new();
        for o in self.observed.values().filter(|o| o.live_until > now) {
            let at = live.entry(o.holder.clone()).or_insert(o.progressed);
            *at = (*at).max(o.progressed);
        }
        live
    }

    /// The earliest moment one of the live Leases expires (when to look again at the latest).
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.observed
            .values()
            .map(|o| o.live_until)
            .filter(|t| *t > now)
            .min()
    }

    fn warn_once(&mut self, holder: &str, what: &'static str, log: impl FnOnce()) {
        if self.warned.get(holder) != Some(&what) {
            log();
            self.warned.insert(holder.to_owned(), what);
        }
    }
}

/// Whether a member Lease's `renewTime` points at a skewed clock: ahead of this replica's clock
/// by more than `duration`, or a renewal just seen (`renewed_now`) that claims to be older than
/// that. A Lease first seen old is merely expired (a replica killed without leaving).
fn skew_suspected(
    renew_time: OffsetDateTime,
    renewed_now: bool,
    duration: Duration,
    wall: OffsetDateTime,
) -> bool {
    let limit = time::Duration::try_from(duration).unwrap_or(time::Duration::ZERO);
    renew_time - wall > limit || (renewed_now && wall - renew_time > limit)
}

/// The live set including this replica while `renewed_at + fresh_for > now` and it has been a
/// member for `warm_up` (so the others have seen its Lease before it takes its share).
pub fn with_me(
    others: &BTreeMap<String, Instant>,
    me: &str,
    first_renewed: Option<Instant>,
    last_renewed: Option<Instant>,
    (fresh_for, warm_up): (Duration, Duration),
    now: Instant,
) -> Members {
    let mut live: Vec<String> = others.keys().cloned().collect();
    let fresh = last_renewed.is_some_and(|t| now < t + fresh_for);
    let warm = first_renewed.is_some_and(|t| now >= t + warm_up);
    let me_until = (fresh && warm)
        .then(|| last_renewed.map(|t| t + fresh_for))
        .flatten();
    if me_until.is_some() {
        live.push(me.to_owned());
        live.sort();
        live.dedup();
    }
    Members {
        me: me.to_owned(),
        live: Arc::new(live),
        me_until,
        progressed: Arc::new(others.clone()),
    }
}

/// Settings of the member Lease.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    pub group: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    /// How often the Lease is renewed and the others listed.
    pub period: Duration,
    /// How many requests this replica has settled (the controller counts, each renewal says).
    pub settled: Arc<AtomicU64>,
}

impl MemberConfig {
    /// The skew margin: an eighth of the duration, at most 1 s.
    pub fn margin(&self) -> Duration {
        (self.lease_duration / 8).min(Duration::from_secs(1))
    }
}

/// Renews this replica's Lease and lists the others every `period`, sending the live set on
/// `members` until `stop`; deletes its Lease on the way out.
pub(crate) fn start(
    client: Client,
    config: MemberConfig,
    members: watch::Sender<Members>,
    mut stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    let resource = ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client, &config.namespace, &resource);
    let name = lease_name(&config.group, &config.identity);
    let margin = config.margin();
    info!(
        lease = %name,
        namespace = %config.namespace,
        identity = %config.identity,
        "rendezvous sharding: membership on"
    );
    tokio::spawn(async move {
        let mut roster = Roster::new(&config.group, &config.identity, margin);
        let (mut first_renewed, mut last_renewed) = (None, None);
        // This replica stops counting itself a margin before the others would drop it.
        let fresh_for = config.lease_duration.saturating_sub(margin);
        let warm_up = config.period + margin;
        let mut others = BTreeMap::new();
        loop {
            let started = Instant::now();
            match renew(&api, &name, &config, &metrics).await {
                Ok(()) => {
                    first_renewed.get_or_insert(started);
                    last_renewed = Some(started);
                }
                Err(e) => warn!(lease = %name, error = %e, "renewing the member Lease"),
            }
            let listed = bounded::call(
                "list_member_leases",
                &metrics,
                api.list(
                    &ListParams::default().labels(&format!("{MEMBER_LABEL}={}", config.group)),
                ),
            )
            .await;
            match listed {
                Ok(list) => {
                    let leases: Vec<MemberLease> = list.items.iter().map(member_lease).collect();
                    let wall = OffsetDateTime::now_utc();
                    let now = Instant::now();
                    roster.observe(&leases, wall, now);
                    others = roster.live_progress(now);
                    // Replicas that died without leaving (SIGKILL) leave their Lease behind.
                    for stale in leases.iter().filter(|l| is_stale(l, wall)) {
                        leave(&api, &stale.name, &metrics).await;
                    }
                }
                // The others stay as last seen; their observed expiries still run.
                Err(e) => warn!(error = %e, "listing the member Leases"),
            }
            let publish = |others: &BTreeMap<String, Instant>| {
                let now = Instant::now();
                let next = with_me(
                    others,
                    &config.identity,
                    first_renewed,
                    last_renewed,
                    (fresh_for, warm_up),
                    now,
                );
                members.send_if_modified(|current| {
                    if *current == next {
                        return false;
                    }
                    // Each renewal moves `me_until`; only a change of the set is news.
                    if current.live != next.live {
                        info!(members = ?next.live, "members changed");
                    }
                    *current = next;
                    true
                });
            };
            publish(&others);
            // Look again at the next period, or sooner when a member (or this one) expires.
            let next_round = started + config.period;
            loop {
                let now = Instant::now();
                let mut wake = next_round;
                if let Some(t) = roster.next_expiry(now) {
                    wake = wake.min(t);
                }
                for t in [
                    last_renewed.map(|t| t + fresh_for),
                    first_renewed.map(|t| t + warm_up),
                ]
                .into_iter()
                .flatten()
                .filter(|t| *t > now)
                {
                    wake = wake.min(t);
                }
                let stopped = tokio::select! {
                    _ = tokio::time::sleep_until(wake) => false,
                    _ = async { let _ = stop.wait_for(|s| *s).await; } => true,
                };
                if stopped {
                    leave(&api, &name, &metrics).await;
                    return;
                }
                if Instant::now() >= next_round {
                    break;
                }
                others = roster.live_progress(Instant::now());
                publish(&others);
            }
        }
    })
}

/// One renewal: server-side apply of the whole Lease (creating it when missing, and putting
/// back a holder someone else edited).
async fn renew(
    api: &Api<DynamicObject>,
    name: &str,
    config: &MemberConfig,
    metrics: &Metrics,
) -> Result<(), kube::Error> {
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "labels": { MEMBER_LABEL: config.group },
            "annotations": {
                SETTLED_ANNOTATION: config.settled.load(Ordering::Relaxed).to_string(),
            },
        },
        "spec": {
            "holderIdentity": config.identity,
            "leaseDurationSeconds": config.lease_duration.as_secs().max(1),
            "renewTime": micro_time(OffsetDateTime::now_utc()),
        },
    });
    let params = PatchParams::apply("podca-membership").force();
    bounded::call(
        "renew_member_lease",
        metrics,
        api.patch(name, &params, &Patch::Apply(&lease)),
    )
    .await
    .map(|_| ())
}

/// Deletes this replica's Lease, so the others drop it at their next look.
async fn leave(api: &Api<DynamicObject>, name: &str, metrics: &Metrics) {
    match bounded::call(
        "delete_member_lease",
        metrics,
        api.delete(name, &DeleteParams::default()),
    )
    .await
    {
        Ok(_) => info!(lease = %name, "member Lease deleted"),
        Err(e) => warn!(lease = %name, error = %e, "deleting the member Lease"),
    }
}

/// A member Lease not renewed for an hour (by its own `renewTime`) is deleted by whoever sees it.
const STALE_AFTER: time::Duration = time::Duration::hours(1);

fn is_stale(lease: &MemberLease, wall: OffsetDateTime) -> bool {
    lease.renew_time.is_some_and(|t| wall - t > STALE_AFTER)
}

/// A Lease object's fields that membership reads.
fn member_lease(object: &DynamicObject) -> MemberLease {
    let spec = &object.data["spec"];
    let settled = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SETTLED_ANNOTATION))
        .and_then(|v| v.parse().ok());
    MemberLease {
        name: object.metadata.name.clone().unwrap_or_default(),
        holder: spec["holderIdentity"].as_str().map(str::to_owned),
        renew_time: spec["renewTime"]
            .as_str()
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok()),
        duration: spec["leaseDurationSeconds"]
            .as_u64()
            .map(Duration::from_secs),
        settled,
    }
}

/// `metav1.MicroTime`: RFC 3339 with exactly six fractional digits, UTC.
fn micro_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const D: Duration = Duration::from_secs(15);
    const M: Duration = Duration::from_secs(1);

    fn lease(holder: &str, renewed: OffsetDateTime) -> MemberLease {
        MemberLease {
            name: lease_name("podca-controller", holder),
            holder: Some(holder.into()),
            renew_time: Some(renewed),
            duration: Some(D),
            settled: None,
        }
    }

    #[test]
    fn lease_names_are_dns_subdomains() {
        assert_eq!(
            lease_name("podca-controller", "podca-7f-x2"),
            "podca-controller-podca-7f-x2"
        );
        assert_eq!(lease_name("g", "Node_1/A"), "g-node-1-a");
        assert_eq!(lease_name("g", "a_"), "g-a");
        assert_eq!(lease_name("g", &"x".repeat(400)).len(), 253);
    }

    #[test]
    fn a_lease_seen_renewed_lives_a_duration_from_the_sighting() {
        let wall = datetime!(2026-12-07 01:00:00 UTC);
        let t0 = Instant::now();
        let mut r = Roster::new("podca-controller", "me", M);
        // Renewed 5 s ago by its own clock: 10 s left, plus the margin.
        let a = lease("a", wall - time::Duration::seconds(5));
        assert_eq!(r.observe(std::slice::from_ref(&a), wall, t0), vec!["a"]);
        assert_eq!(r.live(t0 + Duration::from_millis(10_900)), vec!["a"]);
        assert!(r.live(t0 + Duration::from_secs(11)).is_empty());
        // Not renewed: the same listing later changes nothing.
        let t1 = t0 + Duration::from_secs(12);
        assert!(
            r.observe(
                std::slice::from_ref(&a),
                wall + time::Duration::seconds(12),
                t1
            )
            .is_empty()
        );
        // Renewed (renewTime moved): live for D + M from this sighting.
        let a2 = lease("a", wall + time::Duration::seconds(12));
        assert_eq!(
            r.observe(&[a2], wall + time::Duration::seconds(12), t1),
            vec!["a"]
        );
        assert_eq!(r.live(t1 + D + M - Duration::from_millis(1)), vec!["a"]);
        assert!(r.live(t1 + D + M).is_empty());
        assert_eq!(r.next_expiry(t1), Some(t1 + D + M));
    }

    #[test]
    fn an_old_lease_at_start_is_not_live_and_myself_is_not_counted() {
        let wall = datetime!(2026-12-07 01:00:00 UTC);
        let t0 = Instant::now();
        let mut r = Roster::new("podca-controller", "me", M);
        let old = lease("gone", wall - time::Duration::minutes(5));
        let me = lease("me", wall);
        assert!(r.observe(&[old.clone(), me], wall, t0).is_empty());
        assert!(is_stale(
            &lease("x", wall - time::Duration::minutes(61)),
            wall
        ));
        assert!(!is_stale(&old, wall));
    }

    #[test]
    fn a_skewed_writer_is_judged_by_its_renewals_not_its_clock() {
        let wall = datetime!(2026-12-07 01:00:00 UTC);
        let t0 = Instant::now();
        let mut r = Roster::new("podca-controller", "me", M);
        // Its clock is 10 minutes behind: on first sight it looks expired ...
        let behind = |s: i64| {
            lease(
                "slow",
                wall - time::Duration::minutes(10) + time::Duration::seconds(s),
            )
        };
        assert!(r.observe(&[behind(0)], wall, t0).is_empty());
        // ... but each renewal seen counts from the sighting.
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(r.observe(&[behind(5)], wall, t1), vec!["slow"]);
        assert_eq!(r.live(t1 + D), vec!["slow"]);
        // A clock far ahead is held to one duration from the first sighting.
        let mut r = Roster::new("podca-controller", "me", M);
        let ahead = lease("fast", wall + time::Duration::hours(1));
        assert_eq!(r.observe(&[ahead], wall, t0), vec!["fast"]);
        assert!(r.live(t0 + D + M).is_empty());
    }

    #[test]
    fn only_a_clock_ahead_or_a_late_renewal_is_called_skew() {
        let wall = datetime!(2026-12-07 01:00:00 UTC);
        let d = Duration::from_secs(4);
        let s = time::Duration::seconds;
        // First sight of a killed replica's Lease: expired, not skewed.
        assert!(!skew_suspected(wall - s(60), false, d, wall));
        // A renewal seen just now that says it is a minute old: the writer's clock is behind.
        assert!(skew_suspected(wall - s(60), true, d, wall));
        // Ahead of this clock by more than a duration, seen first or renewed.
        assert!(skew_suspected(wall + s(60), false, d, wall));
        assert!(skew_suspected(wall + s(60), true, d, wall));
        // Within a duration either way.
        assert!(!skew_suspected(wall - s(3), true, d, wall));
        assert!(!skew_suspected(wall + s(3), false, d, wall));
    }

    #[test]
    fn edited_leases_are_ignored_or_bounded() {
        let wall = datetime!(2026-12-07 01:00:00 UTC);
        let t0 = Instant::now();
        let mut r = Roster::new("podca-controller", "me", M);
        // Someone set another holder on a's Lease: it speaks for no member.
        let mut stolen = lease("a", wall);
        stolen.holder = Some("intruder".into());
        // Released (no holder), or without a renewTime or duration.
        let mut released = lease("b", wall);
        released.holder = None;
        let mut no_time = lease("c", wall);
        no_time.renew_time = None;
        let mut no_duration = lease("d", wall);
        no_duration.duration = None;
        // A huge duration is capped.
        let mut huge = lease("e", wall);
        huge.duration = Some(Duration::from_secs(86_400));
        let live = r.observe(&[stolen, released, no_time, no_duration, huge], wall, t0);
        assert_eq!(live, vec!["e"]);
        assert!(r.live(t0 + MAX_DURATION + M).is_empty());
    }

    #[test]
    fn i_am_a_member_once_warm_and_while_fresh() {
        let t0 = Instant::now();
        let others = BTreeMap::from([("b".to_string(), t0)]);
        let timings = (Duration::from_secs(14), Duration::from_secs(3));
        let m = with_me(&others, "a", None, None, timings, t0);
        assert!(!m.includes_me());
        let m = with_me(
            &others,
            "a",
            Some(t0),
            Some(t0),
            timings,
            t0 + Duration::from_secs(2),
        );
        assert!(!m.includes_me(), "warming up");
        let m = with_me(
            &others,
            "a",
            Some(t0),
            Some(t0),
            timings,
            t0 + Duration::from_secs(3),
        );
        assert_eq!(*m.live, vec!["a", "b"]);
        assert_eq!(m.me_until, Some(t0 + Duration::from_secs(14)));
        assert!(m.includes_me_at(t0 + Duration::from_millis(13_999)));
        assert!(
            !m.includes_me_at(t0 + Duration::from_secs(14)),
            "resumed after SIGSTOP"
        );
        let m = with_me(
            &others,
            "a",
            Some(t0),
            Some(t0),
            timings,
            t0 + Duration::from_secs(14),
        );
        assert!(!m.includes_me(), "not renewed for too long");
    }

    #[test]
    fn progress_is_when_the_settled_count_is_seen_to_move() {
        let wall = datetime!(2026-12-07 01:00:00 UTC);
        let t0 = Instant::now();
        let s = time::Duration::seconds;
        let a = |renewed: i64, settled: Option<u64>| MemberLease {
            settled,
            ..lease("a", wall + s(renewed))
        };
        let mut r = Roster::new("podca-controller", "me", M);
        // First sight counts as progress.
        r.observe(&[a(0, Some(7))], wall, t0);
        assert_eq!(r.live_progress(t0), BTreeMap::from([("a".to_string(), t0)]));
        // Renewed with the same count: progress stays where it was.
        let t1 = t0 + Duration::from_secs(2);
        r.observe(&[a(2, Some(7))], wall + s(2), t1);
        assert_eq!(r.live_progress(t1)["a"], t0);
        // The count moved: progress now.
        let t2 = t0 + Duration::from_secs(4);
        r.observe(&[a(4, Some(9))], wall + s(4), t2);
        assert_eq!(r.live_progress(t2)["a"], t2);
        // A Lease without the count (an older podca) never moves it.
        let mut r = Roster::new("podca-controller", "me", M);
        r.observe(&[a(0, None)], wall, t0);
        r.observe(&[a(2, None)], wall + s(2), t1);
        assert_eq!(r.live_progress(t1)["a"], t0);
        // The count is read from the Lease's annotation; a garbled one is no count.
        let object = |value: &str| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": { "name": "podca-controller-a", "annotations": { SETTLED_ANNOTATION: value } },
                "spec": { "holderIdentity": "a", "leaseDurationSeconds": 15 },
            }))
            .unwrap()
        };
        assert_eq!(member_lease(&object("12")).settled, Some(12));
        assert_eq!(member_lease(&object("twelve")).settled, None);
    }

    #[test]
    fn micro_time_has_six_digits() {
        assert_eq!(
            micro_time(datetime!(2026-12-07 01:02:03.000045678 UTC)),
            "2026-12-07T01:02:03.000045Z"
        );
    }
}
