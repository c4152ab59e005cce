//! Remembered rule decisions.
//!
//! A rule is a pure function of the facts it reads: CEL has no side effects, and the only
//! inputs an evaluation has are the variables [`FactResolver`](super::facts::FactResolver)
//! answers. When an evaluation of a rule read the set of facts `S` and gave `b`, every request
//! that agrees with it on `S` gives `b` too, whatever its other facts, because the interpreter
//! takes the same steps on the same values. So each rule keeps the decisions it made, keyed by
//! the facts that evaluation read (not by every fact of the request): `request.namespace in
//! [...]` is remembered per namespace, whatever pod asks, and a rule that stops at
//! `request.source == 'pcr' && ...` per source alone.
//!
//! A hit is checked against the facts themselves (the hash only finds candidates), so a hash
//! collision can never lend one request another's decision. Errors and non-bool results are
//! never remembered: each such request is evaluated, counted and denied again. Each rule keeps
//! at most [`MAX_ENTRIES`] decisions holding at most [`MAX_BYTES`] of facts, and forgets them
//! all when either is reached; a fact set larger than [`MAX_KEY_BYTES`] is not remembered. So a
//! signer with the most rules ([`super::MAX_RULES`]) holds at most 16 MiB of them, and a flood
//! of distinct requests (say, random annotations) costs evaluations, never memory.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use super::RuleFacts;
use super::facts::{FactRef, Slot};

/// Most decisions one rule remembers.
pub const MAX_ENTRIES: usize = 4096;
/// Largest fact set remembered, in bytes of strings.
pub const MAX_KEY_BYTES: usize = 4096;
/// Most bytes of facts one rule keeps (each entry counts [`ENTRY_OVERHEAD`] more).
pub const MAX_BYTES: usize = 256 * 1024;
/// What an entry costs besides its facts' strings, roughly.
const ENTRY_OVERHEAD: usize = 64;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns remembering decisions on or off for the whole process (on by default). For
/// benchmarks and tests that measure or check evaluation itself.
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

pub(super) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

fn hasher() -> &'static RandomState {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::new)
}

/// One fact, kept.
#[derive(Debug, Clone, PartialEq)]
enum Fact {
    Str(Box<str>),
    Int(i64),
    Map(BTreeMap<String, String>),
    List(Box<[String]>),
}

impl Fact {
    fn keep(f: FactRef<'_>) -> Fact {
        match f {
            FactRef::Str(s) => Fact::Str(s.into()),
            FactRef::Int(i) => Fact::Int(i),
            FactRef::Map(m) => Fact::Map(m.clone()),
            FactRef::List(l) => Fact::List(l.into()),
        }
    }

    fn is(&self, f: FactRef<'_>) -> bool {
        match (self, f) {
            (Fact::Str(a), FactRef::Str(b)) => **a == *b,
            (Fact::Int(a), FactRef::Int(b)) => *a == b,
            (Fact::Map(a), FactRef::Map(b)) => a == b,
            (Fact::List(a), FactRef::List(b)) => **a == *b,
            _ => false,
        }
    }
}

fn bytes(f: FactRef<'_>) -> usize {
    match f {
        FactRef::Str(s) => s.len(),
        FactRef::Int(_) => 8,
        FactRef::Map(m) => m.iter().map(|(k, v)| k.len() + v.len()).sum(),
        FactRef::List(l) => l.iter().map(String::len).sum(),
    }
}

fn hash_fact(h: &mut impl Hasher, f: FactRef<'_>) {
    match f {
        FactRef::Str(s) => s.hash(h),
        FactRef::Int(i) => i.hash(h),
        FactRef::Map(m) => m.hash(h),
        FactRef::List(l) => l.hash(h),
    }
}

fn slots(mask: u32) -> impl Iterator<Item = Slot> {
    Slot::ALL.into_iter().filter(move |s| mask & s.bit() != 0)
}

/// The hashes of one request's facts, each computed at most once.
pub(super) struct FactHashes<'a> {
    facts: &'a RuleFacts<'a>,
    hashes: [Option<u64>; Slot::ALL.len()],
}

impl<'a> FactHashes<'a> {
    pub(super) fn new(facts: &'a RuleFacts<'a>) -> Self {
        FactHashes {
            facts,
            hashes: [None; Slot::ALL.len()],
        }
    }

    fn of(&mut self, mask: u32) -> u64 {
        let mut h = hasher().build_hasher();
        mask.hash(&mut h);
        for slot in slots(mask) {
            let facts = self.facts;
            let one = *self.hashes[slot as usize].get_or_insert_with(|| {
                let mut h = hasher().build_hasher();
                hash_fact(&mut h, facts.fact(slot));
                h.finish()
            });
            h.write_u64(one);
        }
        h.finish()
    }
}

#[derive(Debug)]
struct Entry {
    mask: u32,
    facts: Box<[Fact]>,
    value: bool,
}

impl Entry {
    fn matches(&self, mask: u32, facts: &RuleFacts<'_>) -> bool {
        self.mask == mask
            && self
                .facts
                .iter()
                .zip(slots(mask))
                .all(|(kept, slot)| kept.is(facts.fact(slot)))
    }
}

#[derive(Debug, Default)]
struct State {
    /// The read sets seen so far, in the order first seen.
    masks: Vec<u32>,
    entries: HashMap<u64, Vec<Entry>>,
    len: usize,
    bytes: usize,
}

/// One rule's remembered decisions.
#[derive(Debug, Default)]
pub(super) struct Memo(Mutex<State>);

impl Memo {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The decision remembered for a request with these facts, if any.
    pub(super) fn get(&self, hashes: &mut FactHashes<'_>) -> Option<bool> {
        let state = self.state();
        for &mask in &state.masks {
            let Some(bucket) = state.entries.get(&hashes.of(mask)) else {
                continue;
            };
            if let Some(e) = bucket.iter().find(|e| e.matches(mask, hashes.facts)) {
                return Some(e.value);
            }
        }
        None
    }

    /// Remembers that an evaluation which read `mask` gave `value`.
    pub(super) fn put(&self, hashes: &mut FactHashes<'_>, mask: u32, value: bool) {
        let facts = hashes.facts;
        let size = slots(mask).map(|s| bytes(facts.fact(s))).sum::<usize>();
        if size > MAX_KEY_BYTES {
            return;
        }
        let key = hashes.of(mask);
        let entry = Entry {
            mask,
            facts: slots(mask).map(|s| Fact::keep(facts.fact(s))).collect(),
            value,
        };
        let mut state = self.state();
        if state.len >= MAX_ENTRIES || state.bytes + size + ENTRY_OVERHEAD > MAX_BYTES {
            *state = State::default();
        }
        if !state.masks.contains(&mask) {
            state.masks.push(mask);
        }
        let bucket = state.entries.entry(key).or_default();
        if !bucket.iter().any(|e| e.matches(mask, facts)) {
            bucket.push(entry);
            state.len += 1;
            state.bytes += size + ENTRY_OVERHEAD;
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.state().len
    }
}
