//! The facts as CEL variables, answered by name.
//!
//! The interpreter asks for `request.namespace` (the whole qualified name first, then its
//! prefixes), so [`FactResolver`] answers each variable a rule can read straight from
//! [`RuleFacts`], borrowing its strings: no map is built for a leaf, and the two string maps
//! and the audiences list are built at most once per request, only if a rule reads them.
//!
//! It also records which facts ([`Slot`]s) an evaluation read, so that a rule's decision can be
//! remembered for every request that agrees on exactly those facts (see `memo.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use cel::common::types::{CelInt, CelList, CelMap, CelMapKey, CelString};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;

use super::RuleFacts;

/// One fact a rule can read; a set of them is a bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Slot {
    Source,
    SignerName,
    Namespace,
    ServiceAccount,
    PodName,
    PodUid,
    NodeName,
    KeyType,
    Lifetime,
    Annotations,
    Audiences,
    Labels,
    Now,
    PodLabels,
    PodAnnotations,
}

impl Slot {
    pub(super) const ALL: [Slot; 15] = [
        Slot::Source,
        Slot::SignerName,
        Slot::Namespace,
        Slot::ServiceAccount,
        Slot::PodName,
        Slot::PodUid,
        Slot::NodeName,
        Slot::KeyType,
        Slot::Lifetime,
        Slot::Annotations,
        Slot::Audiences,
        Slot::Labels,
        Slot::Now,
        Slot::PodLabels,
        Slot::PodAnnotations,
    ];

    pub(super) const fn bit(self) -> u32 {
        1 << self as u8
    }
}

/// Every fact under `request`.
const REQUEST: u32 =
    !(Slot::Labels.bit() | Slot::Now.bit() | Slot::PodLabels.bit() | Slot::PodAnnotations.bit())
        & ((1 << Slot::ALL.len()) - 1);
/// Every fact under `pod` (the pod object read for the rules).
const POD_OBJECT: u32 = Slot::PodLabels.bit() | Slot::PodAnnotations.bit();
const POD: u32 = Slot::PodName.bit() | Slot::PodUid.bit();

/// What one fact is, as a rule sees it (an unknown string is `""`, no lifetime is 0, no labels
/// an empty map).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum FactRef<'a> {
    Str(&'a str),
    Int(i64),
    Map(&'a BTreeMap<String, String>),
    List(&'a [String]),
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl<'a> RuleFacts<'a> {
    pub(super) fn labels(&self) -> &'a BTreeMap<String, String> {
        self.namespace_labels.unwrap_or(&NO_LABELS)
    }

    pub(super) fn pod_labels(&self) -> &'a BTreeMap<String, String> {
        self.pod.map_or(&NO_LABELS, |p| &p.labels)
    }

    pub(super) fn pod_annotations(&self) -> &'a BTreeMap<String, String> {
        self.pod.map_or(&NO_LABELS, |p| &p.annotations)
    }

    /// The value of `slot` as rules see it.
    pub(super) fn fact(&self, slot: Slot) -> FactRef<'a> {
        let s = |v: Option<&'a str>| FactRef::Str(v.unwrap_or(""));
        match slot {
            Slot::Source => FactRef::Str(self.source.as_str()),
            Slot::SignerName => FactRef::Str(self.signer_name),
            Slot::Namespace => FactRef::Str(self.namespace),
            Slot::ServiceAccount => FactRef::Str(self.service_account),
            Slot::PodName => s(self.pod_name),
            Slot::PodUid => s(self.pod_uid),
            Slot::NodeName => s(self.node_name),
            Slot::KeyType => s(self.key_type),
            Slot::Lifetime => FactRef::Int(self.requested_lifetime_seconds.unwrap_or(0)),
            Slot::Annotations => FactRef::Map(self.annotations),
            Slot::Audiences => FactRef::List(self.audiences),
            Slot::Labels => FactRef::Map(self.labels()),
            Slot::Now => FactRef::Int(self.now),
            Slot::PodLabels => FactRef::Map(self.pod_labels()),
            Slot::PodAnnotations => FactRef::Map(self.pod_annotations()),
        }
    }
}

/// The variables `request`, `namespaceObject`, `pod` and `now` over one request's facts.
pub(super) struct FactResolver<'a> {
    facts: &'a RuleFacts<'a>,
    /// The slots read since the last [`Self::take_reads`].
    reads: AtomicU32,
    annotations: OnceLock<CelMap<'a>>,
    labels: OnceLock<CelMap<'a>>,
    audiences: OnceLock<CelList<'a>>,
    pod_labels: OnceLock<CelMap<'a>>,
    pod_annotations: OnceLock<CelMap<'a>>,
}

fn string_map<'a>(m: &'a BTreeMap<String, String>) -> CelMap<'a> {
    let map: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = m
        .iter()
        .map(|(k, v)| {
            (
                CelMapKey::from(k.as_str()),
                Box::new(CelString::from(v.as_str())) as Box<dyn Val + 'a>,
            )
        })
        .collect();
    CelMap::from(map)
}

fn object<'a>(fields: Vec<(&'static str, Box<dyn Val + 'a>)>) -> Box<dyn Val + 'a> {
    let map: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = fields
        .into_iter()
        .map(|(k, v)| (CelMapKey::from(k), v))
        .collect();
    Box::new(CelMap::from(map))
}

impl<'a> FactResolver<'a> {
    pub(super) fn new(facts: &'a RuleFacts<'a>) -> Self {
        FactResolver {
            facts,
            reads: AtomicU32::new(0),
            annotations: OnceLock::new(),
            labels: OnceLock::new(),
            audiences: OnceLock::new(),
            pod_labels: OnceLock::new(),
            pod_annotations: OnceLock::new(),
        }
    }

    /// The slots read since the last call, and starts a new count.
    pub(super) fn take_reads(&self) -> u32 {
        self.reads.swap(0, Ordering::Relaxed)
    }

    fn read(&self, slots: u32) {
        self.reads.fetch_or(slots, Ordering::Relaxed);
    }

    fn str(&self, slot: Slot) -> Box<dyn Val + 'a> {
        match self.facts.fact(slot) {
            FactRef::Str(s) => Box::new(CelString::from(s)),
            FactRef::Int(i) => Box::new(CelInt::from(i)),
            // Not reached: only string slots are asked for here.
            FactRef::Map(m) => Box::new(string_map(m)),
            FactRef::List(l) => Box::new(list(l)),
        }
    }

    fn pod(&self) -> Box<dyn Val + 'a> {
        object(vec![
            ("name", self.str(Slot::PodName)),
            ("uid", self.str(Slot::PodUid)),
        ])
    }

    fn node(&self) -> Box<dyn Val + 'a> {
        object(vec![("name", self.str(Slot::NodeName))])
    }

    fn metadata(&self) -> Box<dyn Val + 'a> {
        object(vec![("labels", Box::new(string_map(self.facts.labels())))])
    }

    /// The whole `pod` object.
    fn pod_object(&self) -> Box<dyn Val + 'a> {
        object(vec![
            ("labels", Box::new(string_map(self.facts.pod_labels()))),
            (
                "annotations",
                Box::new(string_map(self.facts.pod_annotations())),
            ),
        ])
    }

    /// The whole `request` object, for the rare expression that uses it as a value.
    fn request(&self) -> Box<dyn Val + 'a> {
        let f = self.facts;
        object(vec![
            ("source", self.str(Slot::Source)),
            ("signer_name", self.str(Slot::SignerName)),
            ("namespace", self.str(Slot::Namespace)),
            ("service_account", self.str(Slot::ServiceAccount)),
            ("pod", self.pod()),
            ("node", self.node()),
            ("key_type", self.str(Slot::KeyType)),
            ("requested_lifetime_seconds", self.str(Slot::Lifetime)),
            ("annotations", Box::new(string_map(f.annotations))),
            ("audiences", Box::new(list(f.audiences))),
        ])
    }
}

fn list<'a>(items: &'a [String]) -> CelList<'a> {
    CelList::from(
        items
            .iter()
            .map(|a| Box::new(CelString::from(a.as_str())) as Box<dyn Val + 'a>)
            .collect::<Vec<_>>(),
    )
}

impl VariableResolver for FactResolver<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let leaf = |slot: Slot| {
            self.read(slot.bit());
            Some(CowVal::Owned(self.str(slot)))
        };
        match variable {
            "request.source" => leaf(Slot::Source),
            "request.signer_name" => leaf(Slot::SignerName),
            "request.namespace" => leaf(Slot::Namespace),
            "request.service_account" => leaf(Slot::ServiceAccount),
            "request.pod.name" => leaf(Slot::PodName),
            "request.pod.uid" => leaf(Slot::PodUid),
            "request.node.name" => leaf(Slot::NodeName),
            "request.key_type" => leaf(Slot::KeyType),
            "request.requested_lifetime_seconds" => leaf(Slot::Lifetime),
            "now" => leaf(Slot::Now),
            "request.annotations" => {
                self.read(Slot::Annotations.bit());
                let map = self
                    .annotations
                    .get_or_init(|| string_map(self.facts.annotations));
                Some(CowVal::Borrowed(map))
            }
            "namespaceObject.metadata.labels" => {
                self.read(Slot::Labels.bit());
                let map = self.labels.get_or_init(|| string_map(self.facts.labels()));
                Some(CowVal::Borrowed(map))
            }
            "pod.labels" => {
                self.read(Slot::PodLabels.bit());
                let map = self
                    .pod_labels
                    .get_or_init(|| string_map(self.facts.pod_labels()));
                Some(CowVal::Borrowed(map))
            }
            "pod.annotations" => {
                self.read(Slot::PodAnnotations.bit());
                let map = self
                    .pod_annotations
                    .get_or_init(|| string_map(self.facts.pod_annotations()));
                Some(CowVal::Borrowed(map))
            }
            "pod" => {
                self.read(POD_OBJECT);
                Some(CowVal::Owned(self.pod_object()))
            }
            "request.audiences" => {
                self.read(Slot::Audiences.bit());
                let l = self.audiences.get_or_init(|| list(self.facts.audiences));
                Some(CowVal::Borrowed(l))
            }
            "request.pod" => {
                self.read(POD);
                Some(CowVal::Owned(self.pod()))
            }
            "request.node" => {
                self.read(Slot::NodeName.bit());
                Some(CowVal::Owned(self.node()))
            }
            "request" => {
                self.read(REQUEST);
                Some(CowVal::Owned(self.request()))
            }
            "namespaceObject.metadata" => {
                self.read(Slot::Labels.bit());
                Some(CowVal::Owned(self.metadata()))
            }
            "namespaceObject" => {
                self.read(Slot::Labels.bit());
                Some(CowVal::Owned(object(vec![("metadata", self.metadata())])))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_mask_is_every_request_fact() {
        for slot in Slot::ALL {
            let under_request = !matches!(
                slot,
                Slot::Labels | Slot::Now | Slot::PodLabels | Slot::PodAnnotations
            );
            assert_eq!(REQUEST & slot.bit() != 0, under_request, "{slot:?}");
        }
    }
}
