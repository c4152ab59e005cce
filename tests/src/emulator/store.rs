//! The object store: objects as JSON, a global resourceVersion counter, a
//! bounded event history and a broadcast channel for watchers.

use super::resources::Res;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
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
            .map(|(_, v)| v)
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
        let existed = self
            .objects
            .entry(res)
            .or_default()
            .insert(key, obj.clone())
            .is_some();
        self.record(Event {
            rv,
            res,
            namespace: ns.to_string(),
            typ: if existed {
                EventType::Modified
            } else {
                EventType::Added
            },
            object: obj.clone(),
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
}
