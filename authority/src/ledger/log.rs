//! The ledger's Merkle log over a [`Store`]: signed checkpoints (published on a schedule by the
//! leader, or on demand by `podca ledger checkpoint`), inclusion and consistency proofs against
//! the latest checkpoint, and the whole-log verification of `podca ledger verify`. The tree
//! math and the note format are `podca_signer::merkle*`; `docs/ledger-log.md` is the reference.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use podca_signer::merkle::{Frontier, Hash, MerkleError, Tree, leaf_data, leaf_hash};
use podca_signer::merkle_note::{Checkpoint, LogKey, LogVerifier, NoteError};
use podca_signer::merkle_verify::{LogFault, LogSnapshot, LogSummary};
use tokio::sync::watch;

use super::{Store, StoreError};

/// `[ledger.log]`: signed checkpoints of the log. The leaves are written whatever this says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// The Ed25519 key file (PKCS#8 PEM, made 0600 if missing); `None`: `log.key` in the CA
    /// data directory.
    pub key_file: Option<PathBuf>,
    /// With the Secret CA backend: the Secret holding the key, beside the CA Secret (`None`:
    /// `<CA Secret>-log`); `podca_controller::log_key_secret`.
    pub key_secret: Option<String>,
    /// The log's origin: the checkpoints' first line and the key's name.
    pub origin: String,
    /// How often the leader signs a checkpoint of a grown log.
    pub interval: Duration,
}

pub const DEFAULT_ORIGIN: &str = "podca";
pub const DEFAULT_INTERVAL_SECONDS: u64 = 60;

/// Why a log operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Note(#[from] NoteError),
    #[error(transparent)]
    Tree(#[from] MerkleError),
    #[error("the log is not valid: {0}")]
    Fault(#[from] LogFault),
    #[error("no record with serial or id {0:?} in the ledger")]
    NoRecord(String),
    #[error("record {0:?} has no leaf in the log")]
    NoLeaf(String),
    #[error("the log has no checkpoint yet: run `podca ledger checkpoint` (or wait for the next)")]
    NoCheckpoint,
    #[error(
        "leaf {index} is not in the latest checkpoint (size {size}): wait for the next one, or \
         run `podca ledger checkpoint`"
    )]
    NotYetCheckpointed { index: u64, size: u64 },
    #[error(
        "the stored leaf hashes end at {have}, the checkpoint says {size}: the log was truncated"
    )]
    Truncated { have: u64, size: u64 },
}

/// An inclusion proof, as `podca ledger prove` prints it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InclusionProof {
    pub id: String,
    pub index: u64,
    pub size: u64,
    /// The leaf data (hex), whose hash is the leaf hash; hashes are hex too.
    pub leaf_data: String,
    pub leaf_hash: String,
    pub proof: Vec<String>,
    /// The signed checkpoint note the proof is against.
    pub checkpoint: String,
}

/// A consistency proof, as `podca ledger consistency` prints it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConsistencyProof {
    pub from: u64,
    pub from_root: String,
    pub size: u64,
    pub proof: Vec<String>,
    pub checkpoint: String,
}

impl Store {
    pub async fn log_frontier(&self) -> Result<Frontier, StoreError> {
        match self {
            Store::Redb(l) => blocking(l, |l| l.log_frontier()).await,
            Store::Postgres(pg) => pg.log_frontier().await,
        }
    }

    /// The leaf hashes of `[from, to)`.
    pub async fn log_leaf_hashes(&self, from: u64, to: u64) -> Result<Vec<Hash>, StoreError> {
        match self {
            Store::Redb(l) => blocking(l, move |l| l.log_leaf_hashes(from, to)).await,
            Store::Postgres(pg) => pg.log_leaf_hashes(from, to).await,
        }
    }

    pub async fn log_index_of(&self, id: &str) -> Result<Option<u64>, StoreError> {
        match self {
            Store::Redb(l) => {
                let id = id.to_owned();
                blocking(l, move |l| l.log_index_of(&id)).await
            }
            Store::Postgres(pg) => pg.log_index_of(id).await,
        }
    }

    /// The records of leaves `[from, to)` (`None`: pruned).
    pub async fn log_entries(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        match self {
            Store::Redb(l) => blocking(l, move |l| l.log_entries(from, to)).await,
            Store::Postgres(pg) => pg.log_entries(from, to).await,
        }
    }

    pub async fn add_checkpoint(&self, size: u64, note: String) -> Result<(), StoreError> {
        match self {
            Store::Redb(l) => blocking(l, move |l| l.add_checkpoint(size, &note)).await,
            Store::Postgres(pg) => pg.add_checkpoint(size, &note).await,
        }
    }

    pub async fn latest_checkpoint(&self) -> Result<Option<(u64, String)>, StoreError> {
        match self {
            Store::Redb(l) => blocking(l, |l| l.latest_checkpoint()).await,
            Store::Postgres(pg) => pg.latest_checkpoint().await,
        }
    }

    pub async fn log_snapshot(&self) -> Result<LogSnapshot, StoreError> {
        match self {
            Store::Redb(l) => blocking(l, |l| l.log_snapshot()).await,
            Store::Postgres(pg) => pg.log_snapshot().await,
        }
    }
}

async fn blocking<T: Send + 'static>(
    ledger: &Arc<podca_signer::Ledger>,
    f: impl FnOnce(&podca_signer::Ledger) -> Result<T, podca_signer::LedgerError> + Send + 'static,
) -> Result<T, StoreError> {
    let ledger = Arc::clone(ledger);
    tokio::task::spawn_blocking(move || f(&ledger))
        .await
        .map_err(|e| StoreError::Config(format!("ledger log: {e}")))?
        .map_err(StoreError::from)
}

/// Signs and stores a checkpoint of the log as it is now; its size and note.
pub async fn publish_checkpoint(store: &Store, key: &LogKey) -> Result<(u64, String), LogError> {
    let frontier = store.log_frontier().await?;
    let note = key.sign(frontier.size(), frontier.root())?;
    store.add_checkpoint(frontier.size(), note.clone()).await?;
    Ok((frontier.size(), note))
}

/// The latest checkpoint, verified by `verifier` if given.
async fn latest(
    store: &Store,
    verifier: Option<&LogVerifier>,
) -> Result<(Checkpoint, String), LogError> {
    let (_, note) = store
        .latest_checkpoint()
        .await?
        .ok_or(LogError::NoCheckpoint)?;
    let checkpoint = match verifier {
        Some(v) => v.verify(&note)?,
        None => {
            let body = note.split_once("\n\n").map_or(note.as_str(), |(b, _)| b);
            Checkpoint::parse_body(&format!("{body}\n"))?
        }
    };
    Ok((checkpoint, note))
}

/// The tree of the first `size` leaves.
async fn tree(store: &Store, size: u64) -> Result<Tree, LogError> {
    let leaves = store.log_leaf_hashes(0, size).await?;
    let have = leaves.len() as u64;
    if have != size {
        return Err(LogError::Truncated { have, size });
    }
    Ok(Tree::new(leaves))
}

/// The inclusion proof of the record with serial or id `serial_or_id` against the latest
/// checkpoint.
pub async fn prove(
    store: &Store,
    serial_or_id: &str,
    verifier: Option<&LogVerifier>,
) -> Result<InclusionProof, LogError> {
    let record = store
        .find(serial_or_id)
        .await?
        .ok_or_else(|| LogError::NoRecord(serial_or_id.to_owned()))?;
    let index = store
        .log_index_of(&record.id)
        .await?
        .ok_or_else(|| LogError::NoLeaf(record.id.clone()))?;
    let (checkpoint, note) = latest(store, verifier).await?;
    if index >= checkpoint.size {
        return Err(LogError::NotYetCheckpointed {
            index,
            size: checkpoint.size,
        });
    }
    let tree = tree(store, checkpoint.size).await?;
    let proof = tree.inclusion_proof(index, checkpoint.size)?;
    let data = leaf_data(&record);
    Ok(InclusionProof {
        id: record.id,
        index,
        size: checkpoint.size,
        leaf_hash: hex::encode(leaf_hash(&data)),
        leaf_data: hex::encode(data),
        proof: proof.iter().map(hex::encode).collect(),
        checkpoint: note,
    })
}

/// The consistency proof from the tree of `from` leaves to the latest checkpoint.
pub async fn consistency(
    store: &Store,
    from: u64,
    verifier: Option<&LogVerifier>,
) -> Result<ConsistencyProof, LogError> {
    let (checkpoint, note) = latest(store, verifier).await?;
    let tree = tree(store, checkpoint.size).await?;
    let proof = tree.consistency_proof(from, checkpoint.size)?;
    Ok(ConsistencyProof {
        from,
        from_root: hex::encode(tree.root(from)?),
        size: checkpoint.size,
        proof: proof.iter().map(hex::encode).collect(),
        checkpoint: note,
    })
}

/// `podca ledger verify`: the whole log, or the first thing wrong with it.
pub async fn verify(store: &Store, verifier: &LogVerifier) -> Result<LogSummary, LogError> {
    let snapshot = store.log_snapshot().await?;
    let verifier = verifier.clone();
    tokio::task::spawn_blocking(move || podca_signer::merkle_verify::verify(&snapshot, &verifier))
        .await
        .map_err(|e| StoreError::Config(format!("ledger verify: {e}")))?
        .map_err(LogError::from)
}

/// Signs a checkpoint every `interval` while this replica leads and the log has grown.
pub async fn publish_checkpoints(
    store: Store,
    key: Arc<LogKey>,
    interval: Duration,
    metrics: super::LedgerMetrics,
    mut leading: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last = None;
    loop {
        tokio::select! {
            ok = leading.wait_for(|l| *l) => if ok.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        match store.log_frontier().await {
            Ok(f) if last != Some(f.size()) => match publish_checkpoint(&store, &key).await {
                Ok((size, _)) => {
                    last = Some(size);
                    metrics.checkpoints.inc();
                    metrics
                        .checkpoint_size
                        .set(i64::try_from(size).unwrap_or(i64::MAX));
                    metrics
                        .checkpoint_timestamp
                        .set(time::OffsetDateTime::now_utc().unix_timestamp());
                    tracing::debug!(size, "ledger log checkpoint signed");
                }
                Err(e) => {
                    metrics.checkpoint_errors.inc();
                    tracing::warn!(error = %e, "ledger log checkpoint failed; retrying");
                }
            },
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "ledger log: reading the tree failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
