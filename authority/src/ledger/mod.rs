//! The ledger service: every decision podca makes is recorded durably before its answer leaves
//! (a certificate returned to a gRPC caller or written to a PodCertificateRequest's status).
//!
//! Callers hand a record to [`LedgerHandle::record`] and wait for the commit of the batch it
//! lands in (group commit): one writer task takes everything queued, commits it in one
//! transaction, answers every waiter, and starts the next commit as soon as the previous one is
//! done, so the batch grows with the load and a commit's cost is shared.
//!
//! When the store cannot be written, [`OnUnavailable::Retry`] (the default) answers
//! [`LedgerUnavailable`]: the caller does not hand the certificate out (PCRs stay pending and
//! are retried; gRPC answers UNAVAILABLE). [`OnUnavailable::Continue`] instead keeps the
//! record in a bounded memory queue, retried until the store is back, and says so
//! (`podca_ledger_queue_depth`, a Warning log). Retried records never become duplicates: the
//! record id (the serial) is unique in every store.
//!
//! Each recorded decision is also one JSON line on the audit target ([`audit`]).

pub mod audit;
pub mod config;
pub mod log;
mod pg_tls;
pub mod postgres;
pub mod query;
pub mod tiles;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_signer::{Filter, Ledger, LedgerError, LedgerRecord};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::{mpsc, oneshot, watch};

pub use config::{
    DEFAULT_POOL_SIZE, DEFAULT_STATEMENT_TIMEOUT_SECONDS, LedgerBackend, LedgerConfig,
    OnUnavailable, PostgresSettings, PostgresTls,
};
pub use postgres::{PgStore, PostgresUrl};

/// Most records in one commit.
const MAX_BATCH: usize = 4096;
/// Records waiting for the writer before callers wait to enqueue.
const CHANNEL: usize = 65_536;
/// Times the writer lets the other tasks run before it commits, to take in the records of
/// requests already in flight: a commit's cost (redb's page writes, `fdatasync`) is mostly per
/// commit, not per record. When nothing else is ready a yield returns at once, so an idle
/// podca commits a lone record without waiting.
const YIELDS: usize = 2;
/// A batch of patient records only ([`LedgerHandle::record_patiently`]: the controller's PCR
/// decisions) is committed no sooner than `PACE` after the last commit started. A commit costs
/// ~0.5 ms of CPU however few records it holds (redb's page writes, `fdatasync`); the controller
/// keeps only a few of its decisions in the ledger at a time, so committing whatever was queued
/// spent that on every 1–2 PCRs at a real API server's pace (500 PCR/s) and on every ~10 in a
/// fast burst (issues #41, #48). A PCR after a quiet spell (no commit for `PACE`) is committed at
/// once; one in a stream waits at most `PACE`, a small part of a kube-apiserver's write. A
/// record someone waits for at once (gRPC: a client holds its call open) ends the pause, as does
/// a batch of [`PACE_UNTIL`].
const PACE: Duration = Duration::from_millis(5);
const PACE_UNTIL: usize = 64;
/// How long the writer waits before retrying a held backlog (`continue`).
const BACKLOG_RETRY: Duration = Duration::from_millis(500);

/// Why a store could not be opened, read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// At start: the configuration, the URL file, TLS, credentials, the schema.
    #[error("{0}")]
    Config(String),
    /// The database holds a schema this podca does not know: a newer podca wrote it.
    #[error(
        "ledger: the PostgreSQL schema is version {found}, newer than this podca knows \
         ({known}); run the newer podca (or restore the database)"
    )]
    SchemaTooNew { found: i32, known: i32 },
    /// A redb file.
    #[error(transparent)]
    Redb(#[from] LedgerError),
    /// The store did not answer or refused a write (retried).
    #[error("ledger: PostgreSQL: {0}")]
    Unavailable(String),
}

/// A store the ledger writes to and the command line reads from.
#[derive(Debug, Clone)]
pub enum Store {
    Redb(Arc<Ledger>),
    Postgres(PgStore),
}

impl Store {
    /// Opens what `backend` names; a redb file with no path goes to `default_redb`.
    /// `None` for `backend = "none"`.
    pub async fn open(
        backend: &LedgerBackend,
        default_redb: Option<&Path>,
    ) -> Result<Option<Store>, StoreError> {
        match backend {
            LedgerBackend::None => Ok(None),
            LedgerBackend::Redb { path } => {
                let path = path.as_deref().or(default_redb).ok_or_else(|| {
                    StoreError::Config(
                        "[ledger] path is required here: there is no CA data directory to put \
                         ledger.redb in (or use backend = \"postgres\")"
                            .into(),
                    )
                })?;
                let path = path.to_owned();
                let ledger = tokio::task::spawn_blocking(move || Ledger::open(&path))
                    .await
                    .map_err(|e| StoreError::Config(format!("ledger: opening: {e}")))??;
                Ok(Some(Store::Redb(Arc::new(ledger))))
            }
            LedgerBackend::Postgres(settings) => {
                Ok(Some(Store::Postgres(PgStore::connect(settings).await?)))
            }
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Store::Redb(_) => "redb",
            Store::Postgres(_) => "postgres",
        }
    }

    /// Appends in one transaction; per record, whether it was new.
    pub async fn append(&self, records: Vec<LedgerRecord>) -> Result<Vec<bool>, StoreError> {
        self.append_shared(Arc::new(records)).await
    }

    /// [`Store::append`] of records the caller keeps (the writer needs them afterwards for the
    /// audit line and the metrics, and should not copy every record to get that).
    async fn append_shared(
        &self,
        records: Arc<Vec<LedgerRecord>>,
    ) -> Result<Vec<bool>, StoreError> {
        match self {
            Store::Redb(ledger) => {
                let ledger = Arc::clone(ledger);
                tokio::task::spawn_blocking(move || ledger.append(&records))
                    .await
                    .map_err(|e| StoreError::Config(format!("ledger writer: {e}")))?
                    .map_err(StoreError::from)
            }
            Store::Postgres(pg) => pg.append(&records).await,
        }
    }

    /// The records `filter` wants, newest first.
    pub async fn query(&self, filter: &Filter) -> Result<Vec<LedgerRecord>, StoreError> {
        match self {
            Store::Redb(ledger) => {
                let (ledger, filter) = (Arc::clone(ledger), filter.clone());
                tokio::task::spawn_blocking(move || ledger.query(&filter))
                    .await
                    .map_err(|e| StoreError::Config(format!("ledger query: {e}")))?
                    .map_err(StoreError::from)
            }
            Store::Postgres(pg) => pg.query(filter).await,
        }
    }

    /// The record of the certificate with serial `serial_or_id` (hex, colons allowed), else
    /// the record whose id it is (a refusal's `pcr:<uid>`).
    pub async fn find(&self, serial_or_id: &str) -> Result<Option<LedgerRecord>, StoreError> {
        let by_serial = Filter {
            serial: Some(serial_or_id.to_owned()),
            ..Filter::default()
        };
        if let Some(found) = self.query(&by_serial).await?.into_iter().next() {
            return Ok(Some(found));
        }
        let all = self.query(&Filter::default()).await?;
        Ok(all.into_iter().find(|r| r.id == serial_or_id))
    }

    /// Deletes the records made before `before`; says how many.
    pub async fn prune(&self, before: OffsetDateTime) -> Result<u64, StoreError> {
        match self {
            Store::Redb(ledger) => {
                let ledger = Arc::clone(ledger);
                tokio::task::spawn_blocking(move || ledger.prune(before))
                    .await
                    .map_err(|e| StoreError::Config(format!("ledger prune: {e}")))?
                    .map_err(StoreError::from)
            }
            Store::Postgres(pg) => pg.prune(before).await,
        }
    }
}

/// `podca ledger list`'s table: a header line, then one line per record. A JWT-SVID has no
/// serial: its record id (what `ledger show` takes) stands in that column; a refusal shows its
/// reason. The CA column is the generation `podca ca show` lists (`-` for records of schema 1,
/// whose number counted reloads; their `issuer_fingerprint` names the CA).
pub fn table(records: &[LedgerRecord]) -> Vec<String> {
    let header = format!(
        "{:<34} {:<20} {:<7} {:<16} {:<3} IDENTITY",
        "SERIAL", "TIME", "OUTCOME", "NODE", "CA"
    );
    let rows = records.iter().map(|r| {
        let jwt_id = r.jwt.as_ref().map(|_| r.id.as_str());
        format!(
            "{:<34} {:<20} {:<7} {:<16} {:<3} {}",
            r.serial.as_deref().or(jwt_id).unwrap_or(r.reason.as_str()),
            format_time(r.time),
            r.outcome,
            r.node_name.as_deref().unwrap_or("-"),
            r.signing_generation()
                .map_or_else(|| "-".into(), |g| g.to_string()),
            r.identity
        )
    });
    std::iter::once(header).chain(rows).collect()
}

/// A record's time as the command line shows it: RFC 3339.
pub fn format_time(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// A time the command line was given (`flag`: which option, for the message).
pub fn parse_time(flag: &str, value: &str) -> Result<OffsetDateTime, BadTime> {
    OffsetDateTime::parse(value, &Rfc3339).map_err(|_| BadTime {
        flag: flag.to_owned(),
        value: value.to_owned(),
    })
}

/// A time that is not RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value:?} is not an RFC 3339 time (2026-11-29T12:00:00Z)")]
pub struct BadTime {
    pub flag: String,
    pub value: String,
}

/// The ledger could not record a decision: do not hand its certificate out; retry later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the issuance ledger is unavailable: {0}")]
pub struct LedgerUnavailable(pub String);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecordLabels {
    pub backend: &'static str,
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub backend: &'static str,
}

/// `podca_ledger_*`.
#[derive(Debug, Clone)]
pub struct LedgerMetrics {
    records: Family<RecordLabels, Counter>,
    write_errors: Family<BackendLabels, Counter>,
    queue_depth: Gauge,
    commit_seconds: Histogram,
    /// The Merkle log's checkpoints ([`log`]).
    pub(crate) checkpoints: Counter,
    pub(crate) checkpoint_errors: Counter,
    pub(crate) checkpoint_size: Gauge,
    pub(crate) checkpoint_timestamp: Gauge,
}

impl Default for LedgerMetrics {
    fn default() -> Self {
        LedgerMetrics {
            records: Family::default(),
            write_errors: Family::default(),
            queue_depth: Gauge::default(),
            // 0.5 ms … ~8 s.
            commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 15)),
            checkpoints: Counter::default(),
            checkpoint_errors: Counter::default(),
            checkpoint_size: Gauge::default(),
            checkpoint_timestamp: Gauge::default(),
        }
    }
}

impl LedgerMetrics {
    /// Registers the metrics in the ledger's sub-registry (prefix `ledger`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = LedgerMetrics::default();
        registry.register(
            "records",
            "Decisions recorded in the ledger, by backend and outcome",
            m.records.clone(),
        );
        registry.register(
            "write_errors",
            "Ledger commits that failed (the records were refused or held, see on_unavailable)",
            m.write_errors.clone(),
        );
        registry.register(
            "queue_depth",
            "Records waiting for a ledger commit (with on_unavailable = continue, also those held \
             while the store is down)",
            m.queue_depth.clone(),
        );
        registry.register(
            "commit_seconds",
            "Time one ledger commit (a batch) took",
            m.commit_seconds.clone(),
        );
        registry.register(
            "log_checkpoints",
            "Checkpoints of the Merkle log this replica signed",
            m.checkpoints.clone(),
        );
        registry.register(
            "log_checkpoint_errors",
            "Checkpoints of the Merkle log that could not be signed or stored",
            m.checkpoint_errors.clone(),
        );
        registry.register(
            "log_checkpoint_size",
            "Tree size of the last checkpoint this replica signed",
            m.checkpoint_size.clone(),
        );
        registry.register(
            "log_checkpoint_timestamp_seconds",
            "When this replica last signed a checkpoint (Unix seconds)",
            m.checkpoint_timestamp.clone(),
        );
        m
    }
}

struct Pending {
    record: LedgerRecord,
    /// The caller can wait a few milliseconds (see [`PACE`]).
    patient: bool,
    done: Option<oneshot::Sender<Result<(), LedgerUnavailable>>>,
}

/// Where decisions are recorded. Cheap to clone.
#[derive(Clone)]
pub struct LedgerHandle {
    tx: Option<mpsc::Sender<Pending>>,
    backend: &'static str,
}

impl std::fmt::Debug for LedgerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerHandle")
            .field("backend", &self.backend)
            .finish()
    }
}

impl LedgerHandle {
    /// Records nothing durable (`backend = "none"`); the audit line is still written.
    pub fn none() -> Self {
        LedgerHandle {
            tx: None,
            backend: "none",
        }
    }

    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Records `record` and waits until it is durable (or, with `on_unavailable = "continue"`,
    /// held for a later commit).
    pub async fn record(&self, record: LedgerRecord) -> Result<(), LedgerUnavailable> {
        self.record_with(record, false).await
    }

    /// [`Self::record`] for a caller that can wait a few milliseconds more under load, so that
    /// its record shares a commit with more others (the controller's decisions: see [`PACE`]).
    pub async fn record_patiently(&self, record: LedgerRecord) -> Result<(), LedgerUnavailable> {
        self.record_with(record, true).await
    }

    async fn record_with(
        &self,
        record: LedgerRecord,
        patient: bool,
    ) -> Result<(), LedgerUnavailable> {
        let Some(tx) = &self.tx else {
            audit::decision(&record);
            return Ok(());
        };
        let (done, answer) = oneshot::channel();
        tx.send(Pending {
            record,
            patient,
            done: Some(done),
        })
        .await
        .map_err(|_| LedgerUnavailable("the ledger writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| LedgerUnavailable("the ledger writer has stopped".into()))?
    }
}

/// The writer task, to be spawned; it ends once `stop` is set and everything queued before is
/// committed (or refused).
pub struct LedgerWriter {
    store: Store,
    rx: mpsc::Receiver<Pending>,
    mode: OnUnavailable,
    queue_limit: usize,
    metrics: LedgerMetrics,
    /// [`PACE`] (tests stretch it).
    pace: Duration,
}

impl std::fmt::Debug for LedgerWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerWriter")
            .field("store", &self.store.label())
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// The handle to record through and the writer to spawn, for `store`.
pub fn start(
    store: Store,
    config: &LedgerConfig,
    metrics: LedgerMetrics,
) -> (LedgerHandle, LedgerWriter) {
    let (tx, rx) = mpsc::channel(CHANNEL);
    let handle = LedgerHandle {
        tx: Some(tx),
        backend: store.label(),
    };
    let writer = LedgerWriter {
        store,
        rx,
        mode: config.on_unavailable,
        queue_limit: config.queue_limit,
        metrics,
        pace: PACE,
    };
    (handle, writer)
}

impl LedgerWriter {
    /// Commits batches until `stop`; then commits what is still queued and returns.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let LedgerWriter {
            store,
            mut rx,
            mode,
            queue_limit,
            metrics,
            pace,
        } = self;
        let backend = store.label();
        // `continue`: records answered already, waiting for the store to come back.
        let mut held: VecDeque<Pending> = VecDeque::new();
        let mut stopping = false;
        // When the last commit started (the pace).
        let mut last_commit: Option<Instant> = None;
        loop {
            let mut batch: Vec<Pending> = Vec::new();
            if held.is_empty() && !stopping {
                tokio::select! {
                    message = rx.recv() => match message {
                        Some(p) => batch.push(p),
                        None => break,
                    },
                    _ = stop.wait_for(|s| *s) => stopping = true,
                }
            } else if !held.is_empty() && !stopping {
                // Something is held: retry it after a pause, or sooner with new records.
                tokio::select! {
                    message = rx.recv() => if let Some(p) = message { batch.push(p) },
                    _ = tokio::time::sleep(BACKLOG_RETRY) => {}
                    _ = stop.wait_for(|s| *s) => stopping = true,
                }
            }
            let room = MAX_BATCH - held.len().min(MAX_BATCH);
            let mut yields = 0;
            loop {
                while batch.len() < room {
                    match rx.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                if yields == YIELDS || batch.is_empty() || batch.len() >= room {
                    break;
                }
                yields += 1;
                tokio::task::yield_now().await;
                if rx.is_empty() {
                    break;
                }
            }
            let patient = !batch.is_empty() && batch.iter().all(|p| p.patient);
            let due = last_commit.map(|t| t + pace).filter(|_| patient);
            if let Some(due) = due.filter(|due| *due > Instant::now()) {
                let pause = tokio::time::sleep_until(due.into());
                tokio::pin!(pause);
                while batch.len() < room.min(PACE_UNTIL) {
                    tokio::select! {
                        _ = &mut pause => break,
                        _ = stop.wait_for(|s| *s) => {
                            stopping = true;
                            break;
                        }
                        message = rx.recv() => match message {
                            Some(p) => {
                                let waited_for = !p.patient;
                                batch.push(p);
                                if waited_for {
                                    break;
                                }
                            }
                            None => break,
                        },
                    }
                }
            }
            let take = held.len().min(MAX_BATCH);
            let mut all: Vec<Pending> = held.drain(..take).collect();
            all.extend(batch);
            metrics
                .queue_depth
                .set(i64::try_from(rx.len() + held.len() + all.len()).unwrap_or(i64::MAX));
            if all.is_empty() {
                if stopping {
                    break;
                }
                continue;
            }
            let (records, dones): (Vec<LedgerRecord>, Vec<_>) =
                all.into_iter().map(|p| (p.record, p.done)).unzip();
            let records = Arc::new(records);
            let started = Instant::now();
            last_commit = Some(started);
            let result = store.append_shared(Arc::clone(&records)).await;
            metrics
                .commit_seconds
                .observe(started.elapsed().as_secs_f64());
            // The store has let go of its share by now (also when its task panicked).
            let records = Arc::try_unwrap(records).unwrap_or_else(|shared| (*shared).clone());
            let all = records
                .into_iter()
                .zip(dones)
                .map(|(record, done)| Pending {
                    record,
                    patient: false,
                    done,
                });
            match result {
                Ok(inserted) => {
                    for (pending, new) in all.zip(inserted) {
                        if new {
                            audit::decision(&pending.record);
                            metrics
                                .records
                                .get_or_create(&RecordLabels {
                                    backend,
                                    outcome: pending.record.outcome.as_str(),
                                })
                                .inc();
                        }
                        if let Some(done) = pending.done {
                            let _ = done.send(Ok(()));
                        }
                    }
                }
                Err(e) => {
                    metrics
                        .write_errors
                        .get_or_create(&BackendLabels { backend })
                        .inc();
                    let detail = e.to_string();
                    match mode {
                        OnUnavailable::Retry => {
                            tracing::warn!(
                                error = %detail,
                                records = all.len(),
                                "ledger commit failed: the decisions wait (PCRs stay pending, \
                                 gRPC answers UNAVAILABLE)"
                            );
                            for pending in all {
                                if let Some(done) = pending.done {
                                    let _ = done.send(Err(LedgerUnavailable(detail.clone())));
                                }
                            }
                        }
                        OnUnavailable::Continue => {
                            let mut refused = 0;
                            for mut pending in all {
                                if held.len() < queue_limit {
                                    if let Some(done) = pending.done.take() {
                                        let _ = done.send(Ok(()));
                                    }
                                    held.push_back(pending);
                                } else {
                                    refused += 1;
                                    if let Some(done) = pending.done.take() {
                                        let _ = done.send(Err(LedgerUnavailable(format!(
                                            "{detail}; the in-memory queue is full ({queue_limit})"
                                        ))));
                                    }
                                }
                            }
                            tracing::warn!(
                                error = %detail,
                                held = held.len(),
                                refused,
                                "ledger commit failed: continuing, records held in memory until \
                                 the store is back (on_unavailable = \"continue\")"
                            );
                        }
                    }
                    if stopping {
                        if !held.is_empty() {
                            tracing::error!(
                                records = held.len(),
                                "stopping with ledger records never committed"
                            );
                        }
                        break;
                    }
                }
            }
            metrics
                .queue_depth
                .set(i64::try_from(rx.len() + held.len()).unwrap_or(i64::MAX));
            if stopping && held.is_empty() && rx.is_empty() {
                break;
            }
        }
        // Whoever still waits learns the writer is gone (their senders drop with `rx`).
        rx.close();
        while let Ok(pending) = rx.try_recv() {
            if let Some(done) = pending.done {
                let _ = done.send(Err(LedgerUnavailable(
                    "the ledger writer has stopped".into(),
                )));
            }
        }
    }
}

/// Prunes records older than `retention` once a day while `leading` says so; for the leader.
pub async fn apply_retention(
    store: Store,
    retention: time::Duration,
    mut leading: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    const EVERY: Duration = Duration::from_secs(24 * 3600);
    loop {
        tokio::select! {
            ok = leading.wait_for(|l| *l) => if ok.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        let before = OffsetDateTime::now_utc() - retention;
        match store.prune(before).await {
            Ok(n) => tracing::info!(pruned = n, %before, "ledger retention applied"),
            Err(e) => tracing::warn!(error = %e, "ledger retention failed; retrying in a day"),
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podca_signer::ledger::{RecordContext, RecordOutcome, Source};

    fn record(i: u32) -> LedgerRecord {
        let mut r = LedgerRecord::refused(
            &RecordContext {
                source: Source::Grpc,
                signer: "s".into(),
                identity: "spiffe://td/ns/a/sa/b".into(),
                requester: None,
                namespace: "a".into(),
                service_account: "b".into(),
                pod_name: None,
                pod_uid: None,
                node_name: None,
                request_uid: Some(format!("uid-{i}")),
                request_name: None,
                ca_generation: None,
                issuer_fingerprint: None,
                auth: None,
                replica: "r".into(),
                time: OffsetDateTime::now_utc(),
            },
            RecordOutcome::Issued,
            "Issued",
            "",
        );
        r.serial = Some(format!("{i:04x}"));
        r.id = format!("{i:04x}");
        r
    }

    async fn redb_store(dir: &tempfile::TempDir) -> Store {
        let path = dir.path().join("l.redb");
        Store::open(&LedgerBackend::Redb { path: Some(path) }, None)
            .await
            .unwrap()
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_caller_waits_for_its_commit_and_retries_add_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = redb_store(&dir).await;
        let (handle, writer) = start(
            store.clone(),
            &LedgerConfig::default(),
            LedgerMetrics::default(),
        );
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(writer.run(stop));
        let mut callers = tokio::task::JoinSet::new();
        for i in 0..2000 {
            let h = handle.clone();
            callers.spawn(async move { h.record(record(i)).await });
        }
        while let Some(answer) = callers.join_next().await {
            answer.unwrap().unwrap();
        }
        // Every answer came after its commit: the records are there now.
        let all = store.query(&Filter::default()).await.unwrap();
        assert_eq!(all.len(), 2000);
        // A retried record (same serial) is not a second one.
        handle.record(record(7)).await.unwrap();
        assert_eq!(store.query(&Filter::default()).await.unwrap().len(), 2000);
        stop_tx.send_replace(true);
        task.await.unwrap();
        // After the writer stopped, recording is refused rather than silently dropped.
        let error = handle.record(record(9000)).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "the issuance ledger is unavailable: the ledger writer has stopped"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn patient_records_faster_than_commits_are_paced_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = redb_store(&dir).await;
        let mut registry = Registry::default();
        let metrics = LedgerMetrics::register(registry.sub_registry_with_prefix("ledger"));
        let (handle, mut writer) = start(store.clone(), &LedgerConfig::default(), metrics);
        writer.pace = Duration::from_millis(100);
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(writer.run(stop));
        let metric = |name: &str| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ').map(str::to_owned))
                .map_or(0.0, |n| n.parse::<f64>().unwrap())
        };
        let commits = || metric("ledger_commit_seconds_count") as u64;
        // Time spent committing (a busy disk's fdatasync can take 100 ms), told apart from
        // time spent waiting for the pace.
        let committing = || Duration::from_secs_f64(metric("ledger_commit_seconds_sum"));
        // Records every ~2 ms, none waiting for another: `patient` ones commit at most once a
        // pace (plus the first, unpaced, and the last).
        let burst = || {
            let handle = handle.clone();
            async move {
                let t = std::time::Instant::now();
                let mut callers = tokio::task::JoinSet::new();
                for i in 0..100 {
                    let h = handle.clone();
                    callers.spawn(async move { h.record_patiently(record(i)).await });
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                while let Some(answer) = callers.join_next().await {
                    answer.unwrap().unwrap();
                }
                t.elapsed()
            }
        };
        let before = commits();
        let took = burst().await;
        let paced = commits() - before;
        let paces = (took.as_millis() / 100) as u64;
        assert!(paced <= paces + 3, "{paced} commits in {paces} paces");
        // The others are not paced: one right after a commit, inside that commit's pace, is
        // committed at once. Timed less the commit itself (a busy disk's fdatasync is slow; a
        // count of commits against the patient burst's said nothing then: CI, 2026-12-07).
        handle.record_patiently(record(1000)).await.unwrap();
        let (t, spent) = (std::time::Instant::now(), committing());
        handle.record(record(1001)).await.unwrap();
        let waited = t.elapsed().saturating_sub(committing() - spent);
        assert!(waited < Duration::from_millis(50), "{waited:?}");
        // A patient record after a quiet spell longer than the pace is committed at once; the
        // next, right after it, waits out the pace.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (t, spent) = (std::time::Instant::now(), committing());
        handle.record_patiently(record(2000)).await.unwrap();
        let waited = t.elapsed().saturating_sub(committing() - spent);
        assert!(waited < Duration::from_millis(50), "{waited:?}");
        let t = std::time::Instant::now();
        handle.record_patiently(record(2001)).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(50),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(store.query(&Filter::default()).await.unwrap().len(), 104);
        stop_tx.send_replace(true);
        task.await.unwrap();
    }

    #[tokio::test]
    async fn records_of_requests_in_flight_share_one_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = redb_store(&dir).await;
        let mut registry = Registry::default();
        let metrics = LedgerMetrics::register(registry.sub_registry_with_prefix("ledger"));
        let (handle, writer) = start(store.clone(), &LedgerConfig::default(), metrics);
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(writer.run(stop));
        // Seven requests become ready just after the first record is queued, so they are still in
        // flight when the writer takes that record (they run after it on this one thread).
        let ready = Arc::new(tokio::sync::Notify::new());
        let mut callers = tokio::task::JoinSet::new();
        for i in 1..8 {
            let (h, ready) = (handle.clone(), Arc::clone(&ready));
            callers.spawn(async move {
                ready.notified().await;
                h.record(record(i)).await
            });
        }
        let first = handle.clone();
        callers.spawn(async move { first.record(record(0)).await });
        callers.spawn(async move {
            ready.notify_waiters();
            Ok(())
        });
        while let Some(answer) = callers.join_next().await {
            answer.unwrap().unwrap();
        }
        assert_eq!(store.query(&Filter::default()).await.unwrap().len(), 8);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.lines().any(|l| l == "ledger_commit_seconds_count 1"),
            "the eight records should share one commit:\n{text}"
        );
        stop_tx.send_replace(true);
        task.await.unwrap();
    }
}
