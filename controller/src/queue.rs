//! A bounded work queue with de-duplication by PCR uid.
//!
//! * A uid is queued at most once; a newer copy of a queued PCR replaces the older one in place.
//! * A uid being worked on is not queued again: the worker owns it until it is done (and
//!   schedules its own retry when needed).
//! * Settled uids are remembered for [`SETTLED_MEMORY`], so that a stale copy from a relist does
//!   not cause a second signature. PCRs live at most ~20 minutes (the cleaner), so this is bounded.
//! * `push` waits when the queue is full: the watch stream stops being read, which is the
//!   backpressure we want (the API server buffers, not us).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use podca_signer::IssuedCertificate;
use tokio::sync::Notify;

use crate::request::Pcr;

/// How long a settled uid is remembered.
pub const SETTLED_MEMORY: Duration = Duration::from_secs(25 * 60);

/// Entries the queued-items tables keep room for once the queue drains. A burst grows them to
/// the queue's capacity (4,096 by default: a 450 KB hash table and a 100 KB ring), and a table
/// never gives memory back by itself; the allocator places blocks that large in 4 MiB pages, so
/// each kept one also pinned the burst's other, freed, blocks of its page (issue #48). 64 is
/// what a steady trickle uses, so draining it does not reallocate each time.
const IDLE_ROOM: usize = 64;

/// One unit of work.
#[derive(Debug, Clone)]
pub struct Item {
    pub pcr: Arc<Pcr>,
    /// 0 for the first try.
    pub attempt: u32,
    /// A certificate signed on an earlier attempt, re-sent while still fresh (rule 16.8).
    pub signed: Option<Arc<IssuedCertificate>>,
}

impl Item {
    pub fn new(pcr: Pcr) -> Self {
        Item {
            pcr: Arc::new(pcr),
            attempt: 0,
            signed: None,
        }
    }
}

/// A settled uid as the queue remembers it. Kubernetes uids are UUIDs: kept as their 16 bytes,
/// inside the map, rather than as a string allocated for each: a burst's settled uids outlive it
/// by [`SETTLED_MEMORY`], and the 48-byte allocation each was about 4.6 MiB after a burst of
/// 100,000 (issue #48).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SettledUid {
    Uuid([u8; 16]),
    /// Anything else (a uid that is not a lowercase UUID), as it is.
    Other(Box<str>),
}

impl SettledUid {
    fn of(uid: &str) -> Self {
        parse_uuid(uid).map_or_else(|| SettledUid::Other(uid.into()), SettledUid::Uuid)
    }
}

/// The 16 bytes of a lowercase `8-4-4-4-12` UUID; `None` for any other text, so that two uids
/// map to the same bytes only if they are the same text.
fn parse_uuid(uid: &str) -> Option<[u8; 16]> {
    let text = uid.as_bytes();
    if text.len() != 36 || [8, 13, 18, 23].iter().any(|&i| text[i] != b'-') {
        return None;
    }
    let mut digits = text.iter().filter(|&&c| c != b'-').map(|&c| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    });
    let mut bytes = [0u8; 16];
    for byte in &mut bytes {
        *byte = (digits.next()?? << 4) | digits.next()??;
    }
    Some(bytes)
}

/// What `push` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// A copy was already queued; it was replaced.
    Replaced,
    /// Being worked on, recently settled, or the queue is closed.
    Ignored,
}

#[derive(Debug, Default)]
struct Inner {
    order: VecDeque<String>,
    queued: HashMap<String, Item>,
    in_flight: HashSet<String>,
    settled: HashMap<SettledUid, Instant>,
    settled_pruned_at: Option<Instant>,
    closed: bool,
}

impl Inner {
    /// Gives back the room a burst grew the queued-items tables to, once nothing is queued.
    fn release_if_drained(&mut self) {
        if self.order.is_empty() && self.queued.capacity() > IDLE_ROOM {
            self.order.shrink_to(IDLE_ROOM);
            self.queued.shrink_to(IDLE_ROOM);
        }
    }
}

/// The queue. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct WorkQueue {
    inner: Mutex<Inner>,
    capacity: usize,
    ready: Notify,
    space: Notify,
}

impl WorkQueue {
    pub fn new(capacity: usize) -> Self {
        WorkQueue {
            inner: Mutex::new(Inner::default()),
            capacity: capacity.max(1),
            ready: Notify::new(),
            space: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // No code path panics while holding the lock; recover the data if one ever does.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues an item, waiting for room when the queue is full.
    pub async fn push(&self, item: Item) -> Pushed {
        loop {
            let space = self.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            match self.try_push(item.clone(), false) {
                Some(p) => return p,
                None => space.await,
            }
        }
    }

    /// Queues a retry without waiting: the item held a slot while it was in flight, so the
    /// queue may briefly exceed its capacity by at most the decisions in flight
    /// (`[controller] max_in_flight`).
    pub fn push_retry(&self, item: Item) -> Pushed {
        self.try_push(item, true).unwrap_or(Pushed::Ignored)
    }

    fn try_push(&self, item: Item, over_capacity: bool) -> Option<Pushed> {
        let mut inner = self.lock();
        let uid = &item.pcr.uid;
        if inner.closed
            || inner.in_flight.contains(uid)
            || inner.settled.contains_key(&SettledUid::of(uid))
        {
            return Some(Pushed::Ignored);
        }
        if let Some(queued) = inner.queued.get_mut(uid) {
            queued.pcr = item.pcr;
            return Some(Pushed::Replaced);
        }
        if !over_capacity && inner.order.len() >= self.capacity {
            return None;
        }
        inner.order.push_back(uid.clone());
        inner.queued.insert(uid.clone(), item);
        drop(inner);
        self.ready.notify_one();
        Some(Pushed::Queued)
    }

    /// Takes the next item; `None` once the queue is closed (queued items are abandoned: they
    /// stay pending in the API and the next leader or restart picks them up).
    pub async fn pop(&self) -> Option<Item> {
        loop {
            let ready = self.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            {
                let mut inner = self.lock();
                if inner.closed {
                    return None;
                }
                while let Some(uid) = inner.order.pop_front() {
                    if let Some(item) = inner.queued.remove(&uid) {
                        inner.in_flight.insert(uid);
                        inner.release_if_drained();
                        drop(inner);
                        self.space.notify_one();
                        return Some(item);
                    }
                }
            }
            ready.await;
        }
    }

    /// The worker is done with `uid`; `settled` remembers it as answered.
    pub fn done(&self, uid: &str, settled: bool) {
        let mut inner = self.lock();
        inner.in_flight.remove(uid);
        if settled {
            let now = Instant::now();
            inner.settled.insert(SettledUid::of(uid), now);
            let due = inner
                .settled_pruned_at
                .is_none_or(|t| now.duration_since(t) > Duration::from_secs(60));
            if due {
                inner
                    .settled
                    .retain(|_, at| now.duration_since(*at) < SETTLED_MEMORY);
                inner.settled_pruned_at = Some(now);
            }
        }
    }

    /// Drops a queued PCR that was deleted.
    pub fn forget(&self, uid: &str) {
        let mut inner = self.lock();
        if inner.queued.remove(uid).is_some() {
            inner.order.retain(|u| u != uid);
            inner.release_if_drained();
            drop(inner);
            self.space.notify_one();
        }
    }

    /// Whether `uid` was settled by this process recently.
    #[cfg(test)]
    pub fn is_settled(&self, uid: &str) -> bool {
        self.lock().settled.contains_key(&SettledUid::of(uid))
    }

    /// Queued (not in-flight) items.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items being worked on.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }

    /// Stops handing out work and wakes every waiter.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_waiters();
        self.space.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcr(uid: &str, name: &str) -> Pcr {
        crate::request::test_pcr(uid, name)
    }

    #[test]
    fn settled_uids_are_kept_as_uuid_bytes_only_when_that_is_exact() {
        let uuid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        assert_eq!(
            SettledUid::of(uuid),
            SettledUid::Uuid([
                0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2,
                0xe1, 0xf0
            ])
        );
        for other in [
            "0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0", // uppercase: a different uid
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f",  // short
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f00", // long
            "0f1e2d3c04b5a-6978-8796-a5b4c3d2e1f0", // no dash
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fg", // not hex
            "a",
        ] {
            assert_eq!(
                SettledUid::of(other),
                SettledUid::Other(other.into()),
                "{other}"
            );
        }
    }

    #[tokio::test]
    async fn dedups_by_uid_and_keeps_the_newest_copy() {
        let q = WorkQueue::new(10);
        assert_eq!(q.push(Item::new(pcr("a", "old"))).await, Pushed::Queued);
        assert_eq!(q.push(Item::new(pcr("a", "new"))).await, Pushed::Replaced);
        assert_eq!(q.push(Item::new(pcr("b", "b"))).await, Pushed::Queued);
        assert_eq!(q.len(), 2);
        let first = q.pop().await.expect("item");
        assert_eq!(first.pcr.name, "new");
        // In flight: not queued again.
        assert_eq!(q.push(Item::new(pcr("a", "again"))).await, Pushed::Ignored);
        q.done("a", true);
        // Settled: a stale relist copy is ignored.
        assert_eq!(q.push(Item::new(pcr("a", "stale"))).await, Pushed::Ignored);
        assert!(q.is_settled("a"));
        // Not settled (gave up): may be queued again.
        let b = q.pop().await.expect("item");
        q.done(&b.pcr.uid, false);
        assert_eq!(q.push(Item::new(pcr("b", "b2"))).await, Pushed::Queued);
    }

    #[tokio::test]
    async fn a_drained_queue_gives_back_the_room_a_burst_took() {
        let q = WorkQueue::new(4096);
        for i in 0..4096 {
            q.push(Item::new(pcr(&format!("u{i}"), "p"))).await;
        }
        let room = |q: &WorkQueue| {
            let inner = q.lock();
            (inner.order.capacity(), inner.queued.capacity())
        };
        let (order, queued) = room(&q);
        assert!(order >= 4096 && queued >= 4096, "{order} {queued}");
        for _ in 0..4095 {
            q.pop().await.expect("item");
        }
        let (order, queued) = room(&q);
        assert!(
            order >= 4096 && queued >= 4096,
            "kept while anything is queued: {order} {queued}"
        );
        q.pop().await.expect("item");
        let (order, queued) = room(&q);
        assert!(
            order <= 2 * IDLE_ROOM && queued <= 2 * IDLE_ROOM,
            "{order} {queued}"
        );
        // A forgotten last item drains it too.
        for i in 0..1000 {
            q.push(Item::new(pcr(&format!("v{i}"), "p"))).await;
        }
        for _ in 0..999 {
            q.pop().await.expect("item");
        }
        q.forget("v999");
        let (order, queued) = room(&q);
        assert!(
            order <= 2 * IDLE_ROOM && queued <= 2 * IDLE_ROOM,
            "{order} {queued}"
        );
    }

    /// Paused time: the sleep below ends only once every task is idle, so the other task
    /// has run as far as it can.
    #[tokio::test(start_paused = true)]
    async fn push_waits_for_room() {
        let q = Arc::new(WorkQueue::new(1));
        q.push(Item::new(pcr("a", "a"))).await;
        let q2 = Arc::clone(&q);
        let pusher = tokio::spawn(async move { q2.push(Item::new(pcr("b", "b"))).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !pusher.is_finished(),
            "a full queue holds the producer back"
        );
        assert_eq!(q.len(), 1);
        let _a = q.pop().await;
        assert_eq!(pusher.await.expect("join"), Pushed::Queued);
        // A retry may exceed the capacity.
        assert_eq!(q.push_retry(Item::new(pcr("c", "c"))), Pushed::Queued);
        assert_eq!(q.len(), 2);
    }

    /// Paused time: the sleep below ends only once every task is idle, so the other task
    /// has run as far as it can.
    #[tokio::test(start_paused = true)]
    async fn close_releases_waiters_and_forget_removes() {
        let q = Arc::new(WorkQueue::new(4));
        q.push(Item::new(pcr("a", "a"))).await;
        q.forget("a");
        assert!(q.is_empty());
        let q2 = Arc::clone(&q);
        let popper = tokio::spawn(async move { q2.pop().await.is_none() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.close();
        assert!(popper.await.expect("join"));
        assert_eq!(q.push(Item::new(pcr("b", "b"))).await, Pushed::Ignored);
    }
}
