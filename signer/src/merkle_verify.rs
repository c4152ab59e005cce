//! `podca ledger verify`: the whole Merkle log checked against its records and checkpoints,
//! the same for every backend. A backend reads a [`LogSnapshot`]; [`verify`] recomputes every
//! leaf from its record, the root from the leaves, checks every stored checkpoint's signature
//! and root, and the consistency of consecutive checkpoints, and names the first mismatch.

use std::collections::{BTreeMap, BTreeSet};

use crate::ledger::LedgerRecord;
use crate::merkle::{Frontier, Tree, record_leaf_hash, verify_consistency};
use crate::merkle_note::{LogVerifier, NoteError};

/// One stored leaf: its index, its record's sequence number and its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLeaf {
    pub index: u64,
    pub seq: u64,
    pub hash: [u8; 32],
}

/// Everything a store holds of the log, read at one point in time.
#[derive(Debug, Clone, Default)]
pub struct LogSnapshot {
    /// In index order.
    pub leaves: Vec<StoredLeaf>,
    /// Sequence number → the record as stored (JSON).
    pub records: BTreeMap<u64, Vec<u8>>,
    /// Sequence numbers retention pruned.
    pub pruned: BTreeSet<u64>,
    /// The stored frontier (empty: none).
    pub frontier: Vec<u8>,
    /// Stored under size → the note, in size order.
    pub checkpoints: Vec<(u64, String)>,
}

/// The first thing wrong with a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogFault {
    #[error("leaf {index} is missing (the leaves jump from {before} to {index_found})")]
    LeafMissing {
        index: u64,
        before: u64,
        index_found: u64,
    },
    #[error(
        "leaf {index} (record seq {seq}, id {id:?}): the stored leaf hash is not the hash of \
         the record (the record or the hash was changed)"
    )]
    LeafMismatch { index: u64, seq: u64, id: String },
    #[error("leaf {index}: its record (seq {seq}) is missing and was not pruned")]
    RecordMissing { index: u64, seq: u64 },
    #[error("record seq {seq} does not parse: {detail}")]
    RecordUnreadable { seq: u64, detail: String },
    #[error("record seq {seq} (id {id:?}) has no leaf in the log")]
    RecordWithoutLeaf { seq: u64, id: String },
    #[error("the stored frontier ({detail}) does not match the {leaves} stored leaves")]
    Frontier { leaves: u64, detail: String },
    #[error("checkpoint {size}: {error}")]
    CheckpointSignature { size: u64, error: NoteError },
    #[error("checkpoint stored under size {key} says size {size}")]
    CheckpointMisfiled { key: u64, size: u64 },
    #[error(
        "checkpoint {size}: the log holds only {leaves} leaves (truncated: leaves after \
         {leaves} were removed)"
    )]
    Truncated { size: u64, leaves: u64 },
    #[error("checkpoint {size}: its root is not the root of the stored leaves 0..{size}")]
    CheckpointRoot { size: u64 },
    #[error("checkpoints {from} and {to} are not consistent")]
    Inconsistent { from: u64, to: u64 },
}

/// What a clean log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSummary {
    pub leaves: u64,
    pub records: u64,
    pub pruned: u64,
    pub checkpoints: u64,
    pub root: [u8; 32],
}

/// Checks `snapshot`; the checkpoints must be signed by `key`.
pub fn verify(snapshot: &LogSnapshot, key: &LogVerifier) -> Result<LogSummary, LogFault> {
    let mut hashes = Vec::with_capacity(snapshot.leaves.len());
    let mut with_leaf = BTreeSet::new();
    let mut pruned = 0;
    for (want, leaf) in (0u64..).zip(&snapshot.leaves) {
        if leaf.index != want {
            return Err(LogFault::LeafMissing {
                index: want,
                before: want.saturating_sub(1),
                index_found: leaf.index,
            });
        }
        match snapshot.records.get(&leaf.seq) {
            Some(bytes) => {
                let record =
                    LedgerRecord::from_json(bytes).map_err(|e| LogFault::RecordUnreadable {
                        seq: leaf.seq,
                        detail: e.to_string(),
                    })?;
                if record_leaf_hash(&record) != leaf.hash {
                    return Err(LogFault::LeafMismatch {
                        index: leaf.index,
                        seq: leaf.seq,
                        id: record.id,
                    });
                }
            }
            None if snapshot.pruned.contains(&leaf.seq) => pruned += 1,
            None => {
                return Err(LogFault::RecordMissing {
                    index: leaf.index,
                    seq: leaf.seq,
                });
            }
        }
        with_leaf.insert(leaf.seq);
        hashes.push(leaf.hash);
    }
    if let Some((&seq, bytes)) = snapshot
        .records
        .iter()
        .find(|(seq, _)| !with_leaf.contains(seq))
    {
        let id = LedgerRecord::from_json(bytes)
            .map(|r| r.id)
            .unwrap_or_default();
        return Err(LogFault::RecordWithoutLeaf { seq, id });
    }
    let tree = Tree::new(hashes);
    let leaves = tree.size();
    let root = tree.root(leaves).unwrap_or_default();
    let frontier = Frontier::decode(&snapshot.frontier).map_err(|e| LogFault::Frontier {
        leaves,
        detail: e.to_string(),
    })?;
    if frontier.size() != leaves || frontier.root() != root {
        return Err(LogFault::Frontier {
            leaves,
            detail: format!("size {}", frontier.size()),
        });
    }
    let mut previous: Option<(u64, [u8; 32])> = None;
    for (stored_size, note) in &snapshot.checkpoints {
        let checkpoint = key
            .verify(note)
            .map_err(|error| LogFault::CheckpointSignature {
                size: *stored_size,
                error,
            })?;
        let size = checkpoint.size;
        if size != *stored_size {
            return Err(LogFault::CheckpointMisfiled {
                key: *stored_size,
                size,
            });
        }
        if size > leaves {
            return Err(LogFault::Truncated { size, leaves });
        }
        if tree.root(size).ok() != Some(checkpoint.root) {
            return Err(LogFault::CheckpointRoot { size });
        }
        if let Some((from, from_root)) = previous
            && from > 0
        {
            let proof = tree
                .consistency_proof(from, size)
                .map_err(|_| LogFault::Inconsistent { from, to: size })?;
            if !verify_consistency(from, size, &from_root, &checkpoint.root, &proof) {
                return Err(LogFault::Inconsistent { from, to: size });
            }
        }
        previous = Some((size, checkpoint.root));
    }
    Ok(LogSummary {
        leaves,
        records: snapshot.records.len() as u64,
        pruned,
        checkpoints: snapshot.checkpoints.len() as u64,
        root,
    })
}
