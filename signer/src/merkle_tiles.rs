//! The C2SP `tlog-tiles` layout of the ledger's Merkle log (<https://c2sp.org/tlog-tiles>):
//! which resource a path names, which leaves it covers, and the bytes of tiles and entry
//! bundles. Reading the leaves is the caller's (`podca_authority::ledger::tiles`).
//!
//! * `checkpoint`: the latest signed checkpoint;
//! * `tile/<L>/<N>[.p/<W>]`: at level 0 the leaf hashes `[N·256, N·256 + W)`; at level `L` the
//!   roots of the full level `L − 1` tiles `N·256 … N·256 + W − 1`; `W` is 256 for a full tile;
//! * `tile/entries/<N>[.p/<W>]`: the leaves' data, each a big-endian u16 length and the bytes.

use crate::merkle::{Hash, node_hash, parse_tile_index};

/// Hashes (or entries) in a full tile.
pub const TILE_WIDTH: u64 = 256;

/// What a path under the log's prefix asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileRequest {
    Checkpoint,
    /// A Merkle tile: `width` hashes (256: full) at `level`.
    Hashes {
        level: u8,
        index: u64,
        width: u64,
    },
    /// An entry bundle of `width` entries.
    Entries {
        index: u64,
        width: u64,
    },
}

impl TileRequest {
    /// Parses a path relative to the prefix (`checkpoint`, `tile/0/x001/234.p/7`, …); `None`
    /// for anything the layout does not name, or names in a non-canonical form.
    pub fn parse(path: &str) -> Option<TileRequest> {
        if path == "checkpoint" {
            return Some(TileRequest::Checkpoint);
        }
        let rest = path.strip_prefix("tile/")?;
        let (kind, rest) = rest.split_once('/')?;
        let (index, width) = match rest.split_once(".p/") {
            Some((index, width)) => {
                let w: u64 = width.parse().ok()?;
                let canonical = (1..TILE_WIDTH).contains(&w) && w.to_string() == width;
                (index, canonical.then_some(w)?)
            }
            None => (rest, TILE_WIDTH),
        };
        let index = parse_tile_index(index)?;
        if kind == "entries" {
            return Some(TileRequest::Entries { index, width });
        }
        let level: u8 = kind.parse().ok()?;
        if level > 63 || level.to_string() != kind {
            return None;
        }
        Some(TileRequest::Hashes {
            level,
            index,
            width,
        })
    }

    /// The leaves `[start, end)` the resource covers; `None` past what a u64 counts.
    pub fn leaf_range(&self) -> Option<(u64, u64)> {
        let (level, index, width) = match *self {
            TileRequest::Checkpoint => return Some((0, 0)),
            TileRequest::Hashes {
                level,
                index,
                width,
            } => (u32::from(level), index, width),
            TileRequest::Entries { index, width } => (0, index, width),
        };
        let per_hash = TILE_WIDTH.checked_pow(level)?;
        let start = index.checked_mul(TILE_WIDTH)?.checked_mul(per_hash)?;
        let end = start.checked_add(width.checked_mul(per_hash)?)?;
        Some((start, end))
    }
}

/// The Merkle Tree Hash of a power-of-two number of subtree roots (a full tile's 256).
pub fn perfect_root(hashes: &[Hash]) -> Option<Hash> {
    if hashes.is_empty() || !hashes.len().is_power_of_two() {
        return None;
    }
    let mut level = hashes.to_vec();
    while level.len() > 1 {
        level = level
            .chunks_exact(2)
            .map(|pair| node_hash(&pair[0], &pair[1]))
            .collect();
    }
    level.first().copied()
}

/// A tile's bytes: its hashes, concatenated.
pub fn tile_bytes(hashes: &[Hash]) -> Vec<u8> {
    hashes.concat()
}

/// An entry bundle: each entry as a big-endian u16 length and its bytes. `Err` with the
/// position of the first entry over 65,535 bytes, which the layout cannot carry.
pub fn entry_bundle(entries: &[Vec<u8>]) -> Result<Vec<u8>, usize> {
    let mut out = Vec::with_capacity(entries.iter().map(|e| e.len() + 2).sum());
    for (i, entry) in entries.iter().enumerate() {
        let len = u16::try_from(entry.len()).map_err(|_| i)?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(entry);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::{Tree, leaf_hash};

    #[test]
    fn paths_parse_as_the_layout_names_them_and_nothing_else() {
        use TileRequest::*;
        for (path, expected) in [
            ("checkpoint", Checkpoint),
            (
                "tile/0/000",
                Hashes {
                    level: 0,
                    index: 0,
                    width: 256,
                },
            ),
            (
                "tile/1/x001/x234/067.p/8",
                Hashes {
                    level: 1,
                    index: 1_234_067,
                    width: 8,
                },
            ),
            (
                "tile/entries/012.p/255",
                Entries {
                    index: 12,
                    width: 255,
                },
            ),
        ] {
            assert_eq!(TileRequest::parse(path), Some(expected), "{path}");
        }
        for bad in [
            "",
            "checkpoint/",
            "tile/0/0",
            "tile/00/000",
            "tile/64/000",
            "tile/0/000.p/0",
            "tile/0/000.p/256",
            "tile/0/000.p/08",
            "tile/0/x000/001",
            "tile/entries/000.p/",
            "tile/x/000",
            "tiles/0/000",
        ] {
            assert_eq!(TileRequest::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ranges_follow_the_levels() {
        let range = |p: &str| TileRequest::parse(p).unwrap().leaf_range();
        assert_eq!(range("tile/0/001"), Some((256, 512)));
        assert_eq!(range("tile/0/001.p/3"), Some((256, 259)));
        assert_eq!(range("tile/1/000.p/2"), Some((0, 512)));
        assert_eq!(range("tile/2/001"), Some((1 << 24, 2 << 24)));
        assert_eq!(range("tile/entries/002.p/1"), Some((512, 513)));
        assert_eq!(range("tile/63/000"), None);
    }

    #[test]
    fn a_full_tiles_root_is_the_subtrees_and_bundles_are_length_prefixed() {
        let leaves: Vec<Hash> = (0u32..512).map(|i| leaf_hash(&i.to_be_bytes())).collect();
        let tree = Tree::new(leaves.clone());
        let first = perfect_root(&leaves[..256]).unwrap();
        assert_eq!(tree.root(256).unwrap(), first);
        let second = perfect_root(&leaves[256..]).unwrap();
        assert_eq!(tree.root(512).unwrap(), node_hash(&first, &second));
        assert_eq!(perfect_root(&leaves[..3]), None);
        assert_eq!(
            entry_bundle(&[b"ab".to_vec(), vec![]]).unwrap(),
            [0, 2, b'a', b'b', 0, 0]
        );
        assert_eq!(entry_bundle(&[vec![], vec![0; 70_000]]), Err(1));
    }
}
