//! The object store: objects as JSON, a global resourceVersion counter, a
//! bounded event history and a broadcast channel for watchers.

use super::resources::Res;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// A watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history and sent to watchers.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub res: Res,
    pub namespace: String,
    pub typ: EventType,
    /// The object (hub form) after the change; for DELETED, the last state.
    pub object: Arc<Value>,
    /// The object before the change (`None` for ADDED): what a list at an earlier
    /// resourceVersion shows (see [`Store::list_at`]).
    pub before: Option<Arc<Value>>,
    /// The watch lines already serialized for this event, one per rendering (API version,
    /// metadata only): every watcher that renders it alike sends the same bytes, serialized
    /// once, as kube-apiserver's watch cache does (its `cachingObject`).
    pub lines: Mutex<Vec<(Rendering, bytes::Bytes)>>,
}

/// How a watch renders an event's object: the API version asked for and whether it asked
/// for metadata only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendering {
    pub version: String,
    pub metadata_only: bool,
}

impl Event {
    /// This event's watch line as `rendering` shows it: serialized by `serialize` the first
    /// time, the same bytes after that.
    pub fn line(
        &self,
        rendering: &Rendering,
        serialize: impl FnOnce() -> bytes::Bytes,
    ) -> bytes::Bytes {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, line)) = lines.iter().find(|(r, _)| r == rendering) {
            return line.clone();
        }
        let line = serialize();
        lines.push((rendering.clone(), line.clone()));
        line
    }
}

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub type Key = (String, String);

/// The store. Always used under one lock.
#[derive(Debug)]
pub struct Store {
    objects: HashMap<Res, BTreeMap<Key, Arc<Value>>>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// Every event with rv > compacted_rv is still in `history`.
    compacted_rv: u64,
    tx: broadcast::Sender<Arc<Event>>,
}

impl Store {
    pub fn new(initial_rv: u64, history_limit: usize, broadcast_capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(broadcast_capacity.max(16));
        Self {
            objects: HashMap::new(),
            rv: initial_rv,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted_rv: initial_rv,
            tx,
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.rv
    }
    pub fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Events after `rv` (exclusive), or `None` if some were compacted away.
    pub fn events_since(&self, rv: u64) -> Option<Vec<Arc<Event>>> {
        if rv < self.compacted_rv {
            return None;
        }
        Some(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    pub fn get(&self, res: Res, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.objects
            .get(&res)?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// All objects of a type (in key order), optionally in one namespace.
    pub fn list(&self, res: Res, ns: Option<&str>) -> Vec<Arc<Value>> {
        let Some(m) = self.objects.get(&res) else {
            return Vec::new();
        };
        match ns {
            Some(ns) => m
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => m.values().cloned().collect(),
        }
    }

    /// Objects of a type in key order, optionally in one namespace, from just after `after`
    /// (a list page's continue key) on, without copying the rest of the type.
    pub fn list_after<'a>(
        &'a self,
        res: Res,
        ns: Option<&'a str>,
        after: Option<&Key>,
    ) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        self.entries_after(res, ns, after).map(|(_, v)| v)
    }

    fn entries_after<'a>(
        &'a self,
        res: Res,
        ns: Option<&'a str>,
        after: Option<&Key>,
    ) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> + 'a {
        let first_of_ns = |ns: &str| Bound::Included((ns.to_string(), String::new()));
        let from = match (after, ns) {
            // A key before the namespace starts at the namespace; one after it is past it.
            (Some(key), Some(ns)) if key.0.as_str() < ns => Some(first_of_ns(ns)),
            (Some(key), Some(ns)) if key.0.as_str() > ns => None,
            (Some(key), _) => Some(Bound::Excluded(key.clone())),
            (None, Some(ns)) => Some(first_of_ns(ns)),
            (None, None) => Some(Bound::Unbounded),
        };
        self.objects
            .get(&res)
            .zip(from)
            .into_iter()
            .flat_map(|(m, from)| m.range((from, Bound::Unbounded)))
            .take_while(move |((n, _), _)| ns.is_none_or(|ns| n == ns))
    }

    /// As [`list_after`](Self::list_after), but as the store was at resourceVersion `at` (a
    /// continue token's snapshot, as kube-apiserver serves every page of a paginated list):
    /// objects changed since `at` show as they were then, those created since are left out and
    /// those deleted since are put back, all from the history. `None` when the history no longer
    /// reaches back to `at` (kube-apiserver: 410 Expired).
    pub fn list_at<'a>(
        &'a self,
        res: Res,
        ns: Option<&'a str>,
        after: Option<&Key>,
        at: u64,
    ) -> Option<impl Iterator<Item = Arc<Value>> + 'a> {
        if at < self.compacted_rv {
            return None;
        }
        // Per key changed since `at`, its state at `at`: what its first later change replaced.
        let mut then: BTreeMap<Key, Option<Arc<Value>>> = BTreeMap::new();
        for e in self.history.iter().filter(|e| e.rv > at && e.res == res) {
            if ns.is_some_and(|ns| e.namespace != ns) {
                continue;
            }
            let key = (e.namespace.clone(), meta_str(&e.object, "name").to_string());
            if after.is_some_and(|after| &key <= after) {
                continue;
            }
            then.entry(key).or_insert_with(|| e.before.clone());
        }
        let mut then = then.into_iter().peekable();
        let mut now = self.entries_after(res, ns, after).peekable();
        Some(std::iter::from_fn(move || {
            loop {
                let (from_history, from_now) = match (then.peek(), now.peek()) {
                    (None, None) => return None,
                    (Some((k, _)), Some((n, _))) if k < *n => (true, false),
                    (Some((k, _)), Some((n, _))) if k == *n => (true, true),
                    (Some(_), None) => (true, false),
                    _ => (false, true),
                };
                let current = if from_now { now.next() } else { None };
                if from_history {
                    if let Some((_, Some(old))) = then.next() {
                        return Some(old);
                    }
                    // Created after `at`: not in this snapshot.
                    continue;
                }
                if let Some((_, v)) = current {
                    return Some(Arc::clone(v));
                }
            }
        }))
    }

    pub fn count(&self, res: Res) -> usize {
        self.objects.get(&res).map_or(0, BTreeMap::len)
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, ev: Event) {
        let ev = Arc::new(ev);
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        // No receivers is fine.
        let _ = self.tx.send(ev);
    }

    /// Store a new or changed object: assigns the next resourceVersion,
    /// records and broadcasts the event. Returns the stored object.
    pub fn put(&mut self, res: Res, ns: &str, name: &str, mut obj: Value) -> Arc<Value> {
        let rv = self.next_rv();
        set_rv(&mut obj, rv);
        let obj = Arc::new(obj);
        let key = (ns.to_string(), name.to_string());
        let before = self
            .objects
            .entry(res)
            .or_default()
            .insert(key, obj.clone());
        self.record(Event {
            rv,
            res,
            namespace: ns.to_string(),
            typ: if before.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            },
            object: obj.clone(),
            before,
            lines: Mutex::default(),
        });
        obj
    }

    /// Insert an object verbatim with its own resourceVersion (fixtures and
    /// replay setup); the counter moves up to it. Emits an ADDED/MODIFIED event.
    pub fn seed(
        &mut self,
        res: Res,
        ns: &str,
        name: &str,
        obj: Value,
        rv: Option<u64>,
    ) -> Arc<Value> {
        match rv {
            Some(rv) if rv > self.rv => {
                self.rv = rv - 1;
                self.put(res, ns, name, obj)
            }
            _ => self.put(res, ns, name, obj),
        }
    }

    /// Delete an object; the DELETED event carries the last state with a new
    /// resourceVersion.
    pub fn delete(&mut self, res: Res, ns: &str, name: &str) -> Option<Arc<Value>> {
        let key = (ns.to_string(), name.to_string());
        let old = self.objects.get_mut(&res)?.remove(&key)?;
        let rv = self.next_rv();
        let mut last = (*old).clone();
        set_rv(&mut last, rv);
        let last = Arc::new(last);
        self.record(Event {
            rv,
            res,
            namespace: ns.to_string(),
            typ: EventType::Deleted,
            object: last.clone(),
            before: Some(old),
            lines: Mutex::default(),
        });
        Some(last)
    }

    /// Forget all history ("restart"): every resourceVersion before now is
    /// too old for a watch.
    pub fn compact_all(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
    }

    /// Approximate number of history entries.
    pub fn history_len(&self) -> usize {
        self.history.len()
    }
}

pub fn set_rv(obj: &mut Value, rv: u64) {
    if let Value::Object(m) = obj {
        let meta = m
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(meta) = meta {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
    }
}

/// `metadata.<key>` as a string ("" when absent).
pub fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The resourceVersion of an object as a number (0 when absent/invalid).
pub fn obj_rv(obj: &Value) -> u64 {
    meta_str(obj, "resourceVersion").parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store_with(keys: &[(&str, &str)]) -> Store {
        let mut st = Store::new(0, 100, 16);
        for (ns, name) in keys {
            st.put(
                Res::Pcr,
                ns,
                name,
                json!({"metadata": {"namespace": ns, "name": name}}),
            );
        }
        st
    }

    fn names(st: &Store, ns: Option<&str>, after: Option<(&str, &str)>) -> Vec<String> {
        let after = after.map(|(n, m)| (n.to_string(), m.to_string()));
        st.list_after(Res::Pcr, ns, after.as_ref())
            .map(|o| format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name")))
            .collect()
    }

    #[test]
    fn list_after_starts_just_past_the_key_and_stays_in_the_namespace() {
        let st = store_with(&[("a", "x"), ("a", "y"), ("b", "x"), ("b", "y"), ("c", "x")]);
        assert_eq!(names(&st, None, None), ["a/x", "a/y", "b/x", "b/y", "c/x"]);
        assert_eq!(names(&st, None, Some(("a", "y"))), ["b/x", "b/y", "c/x"]);
        assert_eq!(names(&st, Some("b"), None), ["b/x", "b/y"]);
        assert_eq!(names(&st, Some("b"), Some(("b", "x"))), ["b/y"]);
        // A key before the namespace starts at its first object, one after it yields nothing.
        assert_eq!(names(&st, Some("b"), Some(("a", "z"))), ["b/x", "b/y"]);
        assert!(names(&st, Some("b"), Some(("c", ""))).is_empty());
        assert!(names(&st, Some("d"), None).is_empty());
        assert!(st.list_after(Res::Pod, None, None).next().is_none());
    }

    #[test]
    fn list_after_follows_the_list_order_across_namespaces_that_share_a_prefix() {
        // "apps-2/..." sorts before "apps/..." as a string but after "apps" as a key; a page that
        // ended in "apps" must still reach "apps-2".
        let st = store_with(&[("apps", "x"), ("apps-2", "a")]);
        assert_eq!(names(&st, None, None), ["apps/x", "apps-2/a"]);
        assert_eq!(names(&st, None, Some(("apps", "x"))), ["apps-2/a"]);
    }

    /// `(namespace/name, state)` of a page read at resourceVersion `at`.
    fn at(st: &Store, after: Option<(&str, &str)>, rv: u64) -> Option<Vec<(String, String)>> {
        let after = after.map(|(n, m)| (n.to_string(), m.to_string()));
        Some(
            st.list_at(Res::Pcr, None, after.as_ref(), rv)?
                .map(|o| {
                    (
                        format!("{}/{}", meta_str(&o, "namespace"), meta_str(&o, "name")),
                        o["state"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect(),
        )
    }

    fn pcr(ns: &str, name: &str, state: &str) -> Value {
        json!({"metadata": {"namespace": ns, "name": name}, "state": state})
    }

    #[test]
    fn a_page_at_an_earlier_resource_version_shows_the_store_as_it_was_then() {
        let mut st = Store::new(0, 100, 16);
        for name in ["b", "d", "f"] {
            st.put(Res::Pcr, "a", name, pcr("a", name, "old"));
        }
        let first_page = st.current_rv();
        // After the first page: one created before the cursor and one after it, one changed,
        // one deleted, and an object of another type.
        st.put(Res::Pcr, "a", "a", pcr("a", "a", "new"));
        st.put(Res::Pcr, "a", "e", pcr("a", "e", "new"));
        st.put(Res::Pcr, "a", "d", pcr("a", "d", "new"));
        st.delete(Res::Pcr, "a", "f");
        st.put(Res::Pod, "a", "c", pcr("a", "c", "new"));
        let old = |n: &str| (format!("a/{n}"), "old".to_string());
        assert_eq!(
            at(&st, None, first_page).unwrap(),
            [old("b"), old("d"), old("f")]
        );
        assert_eq!(
            at(&st, Some(("a", "b")), first_page).unwrap(),
            [old("d"), old("f")]
        );
        // At the current resourceVersion it is the live list.
        let now = at(&st, Some(("a", "b")), st.current_rv()).unwrap();
        let new = |n: &str| (format!("a/{n}"), "new".to_string());
        assert_eq!(now, [new("d"), new("e")]);
        // Compacted past the snapshot: gone (the list answers 410).
        st.compact_all();
        assert!(at(&st, None, first_page).is_none());
    }
}
