//! The ledger's Merkle log over HTTP in the C2SP `tlog-tiles` layout, served by the admin
//! listener under `/log/` (`crate::admin`): `checkpoint`, `tile/<L>/<N>[.p/<W>]` and
//! `tile/entries/<N>[.p/<W>]` ([`podca_signer::merkle_tiles`] names and encodes them).
//!
//! Only what the latest signed checkpoint covers is served: a tile or bundle reaching past its
//! size is 404, like an empty one. Tiles and bundles never change once served (a partial tile
//! of width `W` stays the same bytes), so they are cacheable for a year; the checkpoint is not
//! cached. A bundle holding an entry removed by retention answers 410 (the tile of its hashes
//! stays available, and proofs with it). The roots of full tiles are kept in memory as they
//! are computed, so a tile at level `L ≥ 1` reads each leaf hash at most once per process.

use std::collections::HashMap;
use std::sync::Mutex;

use podca_signer::LedgerRecord;
use podca_signer::merkle::{Hash, leaf_data};
use podca_signer::merkle_tiles::{TILE_WIDTH, TileRequest, entry_bundle, perfect_root, tile_bytes};

use super::{Store, StoreError};

/// Full-tile roots kept at most (32 bytes each, ~50 MiB with the map's overhead): a log of
/// 268 million leaves; beyond, the cache starts again.
const MAX_CACHED_ROOTS: usize = 1 << 20;
/// Leaf hashes read from the store at once (2 MiB).
const READ_LEAVES: u64 = 1 << 16;

/// Why a tile could not be made.
#[derive(Debug, thiserror::Error)]
enum TileError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the log is inconsistent: {0}")]
    Corrupt(String),
}

/// What the admin listener sends for a `/log/` path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TileAnswer {
    pub status: u16,
    pub content_type: &'static str,
    pub cache_control: &'static str,
    pub body: Vec<u8>,
}

impl TileAnswer {
    fn text(status: u16, body: &str) -> Self {
        TileAnswer {
            status,
            content_type: "text/plain; charset=utf-8",
            cache_control: "no-store",
            body: body.as_bytes().to_vec(),
        }
    }

    fn immutable(body: Vec<u8>) -> Self {
        TileAnswer {
            status: 200,
            content_type: "application/octet-stream",
            cache_control: "public, max-age=31536000, immutable",
            body,
        }
    }
}

/// Serves one ledger's log.
#[derive(Debug)]
pub struct LogTiles {
    store: Store,
    /// `(level, index)` → the root of that full tile.
    roots: Mutex<HashMap<(u8, u64), Hash>>,
}

impl LogTiles {
    pub fn new(store: Store) -> Self {
        LogTiles {
            store,
            roots: Mutex::new(HashMap::new()),
        }
    }

    /// The answer for `path`, relative to the log's prefix (`/log/`).
    pub async fn answer(&self, path: &str) -> TileAnswer {
        let Some(request) = TileRequest::parse(path) else {
            return TileAnswer::text(404, "not a tlog-tiles resource\n");
        };
        match self.try_answer(request).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(path, error = %e, "ledger log: a tile could not be read");
                TileAnswer::text(503, "the ledger could not be read\n")
            }
        }
    }

    async fn try_answer(&self, request: TileRequest) -> Result<TileAnswer, TileError> {
        let Some((size, note)) = self.store.latest_checkpoint().await? else {
            return Ok(TileAnswer::text(404, "no checkpoint yet\n"));
        };
        if request == TileRequest::Checkpoint {
            return Ok(TileAnswer {
                status: 200,
                content_type: "text/plain; charset=utf-8",
                cache_control: "no-store",
                body: note.into_bytes(),
            });
        }
        let Some((start, end)) = request.leaf_range().filter(|&(_, end)| end <= size) else {
            return Ok(TileAnswer::text(
                404,
                "beyond the latest checkpoint's tree size\n",
            ));
        };
        match request {
            TileRequest::Hashes {
                level: 0,
                index: _,
                width: _,
            } => {
                let leaves = self.store.log_leaf_hashes(start, end).await?;
                Ok(TileAnswer::immutable(tile_bytes(&leaves)))
            }
            TileRequest::Hashes {
                level,
                index,
                width,
            } => {
                let first = index.saturating_mul(TILE_WIDTH);
                let roots = self.full_roots(level - 1, first, first + width).await?;
                Ok(TileAnswer::immutable(tile_bytes(&roots)))
            }
            TileRequest::Entries { .. } => {
                let mut data = Vec::new();
                for record in self.store.log_entries(start, end).await? {
                    let Some(json) = record else {
                        return Ok(TileAnswer::text(
                            410,
                            "an entry of this bundle was removed by retention\n",
                        ));
                    };
                    let record = LedgerRecord::from_json(&json)
                        .map_err(|e| TileError::Corrupt(e.to_string()))?;
                    data.push(leaf_data(&record));
                }
                match entry_bundle(&data) {
                    Ok(bundle) => Ok(TileAnswer::immutable(bundle)),
                    Err(i) => Err(TileError::Corrupt(format!(
                        "leaf {} is over 65,535 bytes",
                        start + i as u64
                    ))),
                }
            }
            TileRequest::Checkpoint => unreachable!("answered above"),
        }
    }

    /// The roots of the full tiles `[from, to)` at `level`.
    fn full_roots(
        &self,
        level: u8,
        from: u64,
        to: u64,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Hash>, TileError>> + Send + '_>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut next = from;
            while next < to {
                if let Some(root) = self.cached(level, next) {
                    out.push(root);
                    next += 1;
                    continue;
                }
                if level == 0 {
                    // Every missing tile up to the read bound at once.
                    let tiles = (to - next).min(READ_LEAVES / TILE_WIDTH);
                    let leaves = self
                        .store
                        .log_leaf_hashes(next * TILE_WIDTH, (next + tiles) * TILE_WIDTH)
                        .await?;
                    for (i, tile) in leaves.chunks(TILE_WIDTH as usize).enumerate() {
                        let root = perfect_root(tile).ok_or_else(|| {
                            TileError::Corrupt(format!("tile 0/{} is short", next + i as u64))
                        })?;
                        self.keep(0, next + i as u64, root);
                        out.push(root);
                    }
                    next += tiles;
                } else {
                    let below = self
                        .full_roots(level - 1, next * TILE_WIDTH, (next + 1) * TILE_WIDTH)
                        .await?;
                    let root = perfect_root(&below).ok_or_else(|| {
                        TileError::Corrupt(format!("tile {level}/{next} is short"))
                    })?;
                    self.keep(level, next, root);
                    out.push(root);
                    next += 1;
                }
            }
            Ok(out)
        })
    }

    fn cached(&self, level: u8, index: u64) -> Option<Hash> {
        self.lock().get(&(level, index)).copied()
    }

    fn keep(&self, level: u8, index: u64, root: Hash) {
        let mut roots = self.lock();
        if roots.len() >= MAX_CACHED_ROOTS {
            roots.clear();
        }
        roots.insert((level, index), root);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u8, u64), Hash>> {
        self.roots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
