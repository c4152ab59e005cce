//! The ledger's Merkle log: every record is a leaf of an append-only tree hashed as RFC 9162
//! §2.1 says (leaf `SHA-256(0x00 || data)`, node `SHA-256(0x01 || left || right)`), so a
//! signed checkpoint of the tree ([`crate::merkle_note`]) commits to every record before it and
//! a removed or altered record is detectable by anyone holding a checkpoint.
//!
//! This file is the pure part: the canonical leaf encoding of a [`LedgerRecord`], the compact
//! frontier a store keeps to know its root after each append, the tree over stored leaf hashes
//! that answers inclusion and consistency proofs, and the RFC 9162 §2.1.3.2 / §2.1.4.2
//! verifiers. `docs/ledger-log.md` documents the encoding and the proofs.

use aws_lc_rs::digest::{Context, SHA256, digest};
use time::OffsetDateTime;

use crate::ledger::{LedgerRecord, RecordOutcome};

/// A SHA-256 tree hash.
pub type Hash = [u8; 32];

/// The first byte of every leaf's data: the version of [`leaf_data`]'s encoding.
pub const LEAF_VERSION: u8 = 1;

/// Why a proof could not be made or a tree state not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MerkleError {
    #[error("leaf {index} is not in a tree of {size} leaves")]
    NoSuchLeaf { index: u64, size: u64 },
    #[error(
        "a tree of {size} leaves has no consistency proof from size {from} (want 0 < from ≤ size)"
    )]
    BadRange { from: u64, size: u64 },
    #[error("the log holds {have} leaves, fewer than the {want} asked for")]
    TooFewLeaves { have: u64, want: u64 },
    #[error("the stored frontier is corrupt: {0}")]
    Frontier(&'static str),
}

/// `SHA-256(0x00 || data)`.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut c = Context::new(&SHA256);
    c.update(&[0]);
    c.update(data);
    to_hash(c.finish().as_ref())
}

/// `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut c = Context::new(&SHA256);
    c.update(&[1]);
    c.update(left);
    c.update(right);
    to_hash(c.finish().as_ref())
}

/// The root of the empty tree: `SHA-256()`.
pub fn empty_root() -> Hash {
    to_hash(digest(&SHA256, b"").as_ref())
}

fn to_hash(bytes: &[u8]) -> Hash {
    let mut h = [0u8; 32];
    h.copy_from_slice(bytes);
    h
}

/// The leaf hash of `record`.
pub fn record_leaf_hash(record: &LedgerRecord) -> Hash {
    leaf_hash(&leaf_data(record))
}

/// The canonical encoding of a record (version [`LEAF_VERSION`]): the version byte, then every
/// field of the record in a fixed order, each length-prefixed so no two records encode alike.
/// Strings are a u32 big-endian byte length and UTF-8; an optional value is `0x00` (absent) or
/// `0x01` and the value; a list a u32 count and its strings; a time its Unix seconds (i64) and
/// nanoseconds (u32); integers big-endian; a bool one byte. The order is
/// `docs/ledger-log.md`'s table.
pub fn leaf_data(r: &LedgerRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.push(LEAF_VERSION);
    out.extend_from_slice(&r.schema.to_be_bytes());
    put_str(&mut out, &r.id);
    put_time(&mut out, r.time);
    put_str(&mut out, r.source.as_str());
    put_str(&mut out, &r.signer);
    put_str(
        &mut out,
        match r.outcome {
            RecordOutcome::Issued => "issued",
            RecordOutcome::Denied => "denied",
            RecordOutcome::Failed => "failed",
        },
    );
    put_str(&mut out, &r.reason);
    put_opt_str(&mut out, r.message.as_deref());
    put_str(&mut out, &r.identity);
    put_opt_str(&mut out, r.requester.as_deref());
    put_str(&mut out, &r.namespace);
    put_str(&mut out, &r.service_account);
    for field in [
        &r.pod_name,
        &r.pod_uid,
        &r.node_name,
        &r.request_uid,
        &r.request_name,
        &r.serial,
        &r.cert_sha256,
        &r.spki_sha256,
        &r.key_type,
    ] {
        put_opt_str(&mut out, field.as_deref());
    }
    put_list(&mut out, &r.dns_names);
    put_opt_time(&mut out, r.not_before);
    put_opt_time(&mut out, r.not_after);
    match r.ca_generation {
        Some(g) => {
            out.push(1);
            out.extend_from_slice(&g.to_be_bytes());
        }
        None => out.push(0),
    }
    put_opt_str(&mut out, r.issuer_fingerprint.as_deref());
    put_str(&mut out, &r.replica);
    match &r.jwt {
        Some(jwt) => {
            out.push(1);
            put_str(&mut out, &jwt.kid);
            put_list(&mut out, &jwt.audiences);
            put_str(&mut out, &jwt.token_sha256);
        }
        None => out.push(0),
    }
    match &r.auth {
        Some(auth) => {
            out.push(1);
            put_str(&mut out, &auth.method);
            out.push(u8::from(auth.verified));
            put_opt_str(&mut out, auth.presented_serial.as_deref());
            put_opt_time(&mut out, auth.chain_origin);
        }
        None => out.push(0),
    }
    out
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Records are bounded far below 4 GiB (messages are cut at 1 KiB, names by policy).
    let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => {
            out.push(1);
            put_str(out, s);
        }
        None => out.push(0),
    }
}

fn put_list(out: &mut Vec<u8>, items: &[String]) {
    let count = u32::try_from(items.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_be_bytes());
    for item in items {
        put_str(out, item);
    }
}

fn put_time(out: &mut Vec<u8>, t: OffsetDateTime) {
    out.extend_from_slice(&t.unix_timestamp().to_be_bytes());
    out.extend_from_slice(&t.nanosecond().to_be_bytes());
}

fn put_opt_time(out: &mut Vec<u8>, t: Option<OffsetDateTime>) {
    match t {
        Some(t) => {
            out.push(1);
            put_time(out, t);
        }
        None => out.push(0),
    }
}

/// The compact range `[0, size)` of the tree: the root of each maximal complete subtree, the
/// largest first (one per set bit of `size`). Enough to append a leaf and to compute the root
/// without reading any earlier leaf, so a store keeps it beside its leaves in the same commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    peaks: Vec<Hash>,
}

impl Frontier {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends one leaf hash.
    pub fn push(&mut self, leaf: Hash) {
        let mut hash = leaf;
        let mut size = self.size;
        while size & 1 == 1 {
            // A set low bit of `size` always has its peak on the stack.
            let Some(left) = self.peaks.pop() else { break };
            hash = node_hash(&left, &hash);
            size >>= 1;
        }
        self.peaks.push(hash);
        self.size += 1;
    }

    /// The tree's root (RFC 9162 MTH).
    pub fn root(&self) -> Hash {
        let mut peaks = self.peaks.iter().rev();
        let Some(last) = peaks.next() else {
            return empty_root();
        };
        peaks.fold(*last, |right, left| node_hash(left, &right))
    }

    /// `size` (u64 big-endian) and the peaks.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 32 * self.peaks.len());
        out.extend_from_slice(&self.size.to_be_bytes());
        for p in &self.peaks {
            out.extend_from_slice(p);
        }
        out
    }

    /// The empty frontier for no bytes (a store that never appended).
    pub fn decode(bytes: &[u8]) -> Result<Self, MerkleError> {
        if bytes.is_empty() {
            return Ok(Frontier::default());
        }
        let (size, rest) = bytes
            .split_first_chunk::<8>()
            .ok_or(MerkleError::Frontier("shorter than its size"))?;
        let size = u64::from_be_bytes(*size);
        if rest.len() % 32 != 0 || rest.len() / 32 != size.count_ones() as usize {
            return Err(MerkleError::Frontier(
                "its hashes do not match its size (one per set bit)",
            ));
        }
        Ok(Frontier {
            size,
            peaks: rest.chunks_exact(32).map(to_hash).collect(),
        })
    }
}

/// A tree over a log's leaf hashes, with every complete subtree's hash precomputed: a proof or
/// a root at any earlier size then costs O(log² n) hashes.
#[derive(Debug, Clone)]
pub struct Tree {
    /// `levels[k][i]`: the hash of leaves `[i·2^k, (i+1)·2^k)`, complete subtrees only.
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    pub fn new(leaves: Vec<Hash>) -> Self {
        let mut levels = vec![leaves];
        loop {
            let below = &levels[levels.len() - 1];
            if below.len() < 2 {
                break;
            }
            let above: Vec<Hash> = below
                .chunks_exact(2)
                .map(|pair| node_hash(&pair[0], &pair[1]))
                .collect();
            levels.push(above);
        }
        Tree { levels }
    }

    pub fn size(&self) -> u64 {
        self.levels[0].len() as u64
    }

    pub fn leaves(&self) -> &[Hash] {
        &self.levels[0]
    }

    /// The root of the first `size` leaves.
    pub fn root(&self, size: u64) -> Result<Hash, MerkleError> {
        self.check_size(size)?;
        Ok(if size == 0 {
            empty_root()
        } else {
            self.mth(0, size)
        })
    }

    /// The hash of the complete subtree at `level` (2^level leaves), index `index`, if the tree
    /// has it (a full tile's entry).
    pub fn node(&self, level: usize, index: u64) -> Option<Hash> {
        self.levels
            .get(level)
            .and_then(|l| l.get(usize::try_from(index).ok()?))
            .copied()
    }

    /// RFC 9162 §2.1.3.1 PATH(index, D[0:size]).
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Result<Vec<Hash>, MerkleError> {
        self.check_size(size)?;
        if index >= size {
            return Err(MerkleError::NoSuchLeaf { index, size });
        }
        let mut proof = vec![];
        self.path(index, 0, size, &mut proof);
        Ok(proof)
    }

    /// RFC 9162 §2.1.4.1 PROOF(from, D[0:size]); empty when `from == size`.
    pub fn consistency_proof(&self, from: u64, size: u64) -> Result<Vec<Hash>, MerkleError> {
        self.check_size(size)?;
        if from == 0 || from > size {
            return Err(MerkleError::BadRange { from, size });
        }
        let mut proof = vec![];
        if from < size {
            self.subproof(from, 0, size, true, &mut proof);
        }
        Ok(proof)
    }

    fn check_size(&self, size: u64) -> Result<(), MerkleError> {
        if size > self.size() {
            return Err(MerkleError::TooFewLeaves {
                have: self.size(),
                want: size,
            });
        }
        Ok(())
    }

    /// MTH(D[lo:hi]), 0 < hi - lo.
    fn mth(&self, lo: u64, hi: u64) -> Hash {
        let n = hi - lo;
        if n.is_power_of_two() && lo.is_multiple_of(n) {
            let level = n.trailing_zeros() as usize;
            if let Some(h) = self.node(level, lo / n) {
                return h;
            }
        }
        let k = split(n);
        node_hash(&self.mth(lo, lo + k), &self.mth(lo + k, hi))
    }

    fn path(&self, m: u64, lo: u64, hi: u64, out: &mut Vec<Hash>) {
        let n = hi - lo;
        if n == 1 {
            return;
        }
        let k = split(n);
        if m < k {
            self.path(m, lo, lo + k, out);
            out.push(self.mth(lo + k, hi));
        } else {
            self.path(m - k, lo + k, hi, out);
            out.push(self.mth(lo, lo + k));
        }
    }

    fn subproof(&self, m: u64, lo: u64, hi: u64, whole: bool, out: &mut Vec<Hash>) {
        let n = hi - lo;
        if m == n {
            if !whole {
                out.push(self.mth(lo, hi));
            }
            return;
        }
        let k = split(n);
        if m <= k {
            self.subproof(m, lo, lo + k, whole, out);
            out.push(self.mth(lo + k, hi));
        } else {
            self.subproof(m - k, lo + k, hi, false, out);
            out.push(self.mth(lo, lo + k));
        }
    }
}

/// The largest power of two smaller than `n` (n > 1).
fn split(n: u64) -> u64 {
    1 << (63 - (n - 1).leading_zeros())
}

/// RFC 9162 §2.1.3.2: whether `proof` shows `leaf` at `index` in the tree of `size` with root
/// `root`.
pub fn verify_inclusion(index: u64, size: u64, leaf: &Hash, proof: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    s == 0 && r == *root
}

/// RFC 9162 §2.1.4.2: whether `proof` shows the tree of `size` (root `root`) extends the tree
/// of `from` (root `from_root`).
pub fn verify_consistency(
    from: u64,
    size: u64,
    from_root: &Hash,
    root: &Hash,
    proof: &[Hash],
) -> bool {
    if from == 0 || from > size {
        return false;
    }
    if from == size {
        return proof.is_empty() && from_root == root;
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if from.is_power_of_two() {
        path.push(*from_root);
    }
    path.extend_from_slice(proof);
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    let (mut f, mut s) = (from - 1, size - 1);
    while f & 1 == 1 {
        f >>= 1;
        s >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        f >>= 1;
        s >>= 1;
    }
    fr == *from_root && sr == *root && s == 0
}

/// The C2SP tlog-tiles path of a tile index: groups of three digits, all but the last with an
/// `x` (`1234067` → `x001/x234/067`).
pub fn tile_index_path(index: u64) -> String {
    let digits = format!("{index:03}");
    let padded = format!("{:0>width$}", digits, width = digits.len().div_ceil(3) * 3);
    let groups: Vec<&str> = padded
        .as_bytes()
        .chunks(3)
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    let last = groups.len() - 1;
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            if i < last {
                format!("x{g}")
            } else {
                (*g).to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Parses [`tile_index_path`]'s form back; `None` for anything else (a non-canonical path).
pub fn parse_tile_index(path: &str) -> Option<u64> {
    let parts: Vec<&str> = path.split('/').collect();
    let (last, init) = parts.split_last()?;
    let mut digits = String::new();
    for p in init {
        digits.push_str(p.strip_prefix('x')?);
    }
    digits.push_str(last);
    let all_groups = init.iter().all(|p| p.len() == 4) && last.len() == 3;
    if !all_groups || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let index: u64 = digits.parse().ok()?;
    (tile_index_path(index) == path).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: u64) -> Vec<Hash> {
        (0..n).map(|i| leaf_hash(&i.to_be_bytes())).collect()
    }

    /// MTH straight from the recursive definition, for comparison.
    fn reference_root(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => empty_root(),
            1 => leaves[0],
            n => {
                let k = split(n as u64) as usize;
                node_hash(&reference_root(&leaves[..k]), &reference_root(&leaves[k..]))
            }
        }
    }

    #[test]
    fn the_frontier_and_the_tree_agree_with_the_definition_at_every_size() {
        let all = leaves(70);
        let tree = Tree::new(all.clone());
        let mut frontier = Frontier::default();
        assert_eq!(frontier.root(), empty_root());
        for n in 1..=70u64 {
            frontier.push(all[n as usize - 1]);
            let want = reference_root(&all[..n as usize]);
            assert_eq!(frontier.root(), want, "frontier at {n}");
            assert_eq!(tree.root(n).unwrap(), want, "tree at {n}");
            let again = Frontier::decode(&frontier.encode()).unwrap();
            assert_eq!(again, frontier);
        }
        assert_eq!(
            Frontier::decode(&[0, 0, 0, 0, 0, 0, 0, 3, 1]),
            Err(MerkleError::Frontier(
                "its hashes do not match its size (one per set bit)"
            ))
        );
    }

    #[test]
    fn every_proof_verifies_and_a_changed_one_does_not() {
        let all = leaves(33);
        let tree = Tree::new(all.clone());
        for size in 1..=33u64 {
            let root = tree.root(size).unwrap();
            for i in 0..size {
                let proof = tree.inclusion_proof(i, size).unwrap();
                assert!(verify_inclusion(i, size, &all[i as usize], &proof, &root));
                assert!(!verify_inclusion(
                    i,
                    size,
                    &all[0].map(|b| !b),
                    &proof,
                    &root
                ));
                if let Some(first) = proof.first() {
                    let mut bad = proof.clone();
                    bad[0] = node_hash(first, first);
                    assert!(!verify_inclusion(i, size, &all[i as usize], &bad, &root));
                }
            }
            for from in 1..=size {
                let proof = tree.consistency_proof(from, size).unwrap();
                let old = tree.root(from).unwrap();
                assert!(
                    verify_consistency(from, size, &old, &root, &proof),
                    "{from} → {size}"
                );
                if from < size {
                    assert!(!verify_consistency(from, size, &root, &root, &proof));
                }
            }
        }
        assert_eq!(
            tree.inclusion_proof(5, 5),
            Err(MerkleError::NoSuchLeaf { index: 5, size: 5 })
        );
        assert_eq!(
            tree.consistency_proof(0, 5),
            Err(MerkleError::BadRange { from: 0, size: 5 })
        );
        assert_eq!(
            tree.root(34),
            Err(MerkleError::TooFewLeaves { have: 33, want: 34 })
        );
    }

    #[test]
    fn tile_paths_follow_c2sp() {
        for (index, path) in [
            (0, "000"),
            (5, "005"),
            (999, "999"),
            (1000, "x001/000"),
            (1234067, "x001/x234/067"),
        ] {
            assert_eq!(tile_index_path(index), path);
            assert_eq!(parse_tile_index(path), Some(index));
        }
        for bad in ["5", "x1/000", "001/000", "x001/0a0", "", "x000/005"] {
            assert_eq!(parse_tile_index(bad), None, "{bad}");
        }
    }
}
