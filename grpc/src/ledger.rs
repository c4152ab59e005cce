//! Records every certificate the API issues in the issuance ledger, off the request path.
//!
//! A redb commit is a durable write (an fsync), far slower than signing a P-256 leaf, so
//! requests only queue their record; one writer thread appends whatever has queued up in a
//! single transaction, at most one every 100 ms. [`LedgerWriter::finish`] writes the rest before
//! the process exits, so a clean shutdown loses nothing; a crash loses at most the records still
//! queued.

use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;

use podca_signer::{Ledger, LedgerRecord};
use tokio::sync::mpsc;

/// Records queued before senders wait for the writer (backpressure rather than dropping).
const QUEUE: usize = 65_536;
/// Most records in one transaction.
const MAX_BATCH: usize = 4096;
/// Shortest time between two commits. Every commit rewrites the touched B-tree paths of four
/// tables and syncs; committing whatever trickled in each time cost a quarter of the gRPC
/// throughput (5,235 → ~4,000 issuances/s with 64 clients; ~4,800/s with this interval).
/// Waiting this long gathers larger batches; a crash loses at most this much more.
const MIN_COMMIT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

enum Message {
    Record(Box<LedgerRecord>),
    /// Write everything queued before this, then stop.
    Finish,
}

/// Where the API sends the records of what it issued. Cheap to clone.
#[derive(Clone)]
pub struct LedgerSink {
    tx: mpsc::Sender<Message>,
}

impl std::fmt::Debug for LedgerSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LedgerSink")
    }
}

impl LedgerSink {
    /// Queues a record; waits only when the writer is [`QUEUE`] records behind.
    pub async fn record(&self, record: LedgerRecord) {
        if self
            .tx
            .send(Message::Record(Box::new(record)))
            .await
            .is_err()
        {
            tracing::warn!("the ledger writer has stopped; a certificate went unrecorded");
        }
    }
}

/// The thread that writes the ledger.
#[derive(Debug)]
pub struct LedgerWriter {
    tx: mpsc::Sender<Message>,
    thread: JoinHandle<()>,
    done: std_mpsc::Receiver<u64>,
}

impl LedgerWriter {
    /// Starts the writer thread for `ledger`.
    pub fn start(ledger: Ledger) -> std::io::Result<(LedgerSink, LedgerWriter)> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (done_tx, done) = std_mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("podca-ledger".into())
            .spawn(move || {
                let written = write_batches(&ledger, rx);
                let _ = done_tx.send(written);
            })?;
        Ok((
            LedgerSink { tx: tx.clone() },
            LedgerWriter { tx, thread, done },
        ))
    }

    /// Writes what is queued, stops the thread and says how many records it wrote in all.
    /// Blocking: call it from a blocking context.
    pub fn finish(self, timeout: std::time::Duration) -> Result<u64, FinishError> {
        let LedgerWriter { tx, thread, done } = self;
        tx.blocking_send(Message::Finish)
            .map_err(|_| FinishError::AlreadyStopped)?;
        let written = done
            .recv_timeout(timeout)
            .map_err(|_| FinishError::Timeout(timeout))?;
        let _ = thread.join();
        Ok(written)
    }
}

/// Why [`LedgerWriter::finish`] could not confirm that every queued record was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FinishError {
    /// The writer thread had stopped before it was asked to finish: it panicked.
    #[error("the ledger writer had already stopped")]
    AlreadyStopped,
    /// The writer did not report back in time; records may still be unwritten.
    #[error("the ledger writer did not finish within {0:?}")]
    Timeout(std::time::Duration),
}

fn write_batches(ledger: &Ledger, mut rx: mpsc::Receiver<Message>) -> u64 {
    let mut written = 0;
    let mut finishing = false;
    while !finishing {
        let Some(first) = rx.blocking_recv() else {
            break;
        };
        let mut batch = Vec::new();
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Record(record) => batch.push(*record),
                Message::Finish => finishing = true,
            }
            if batch.len() >= MAX_BATCH {
                break;
            }
            next = rx.try_recv().ok();
        }
        if batch.is_empty() {
            continue;
        }
        let started = std::time::Instant::now();
        match ledger.append(&batch) {
            Ok(()) => written += batch.len() as u64,
            // Issuing goes on: the certificates exist whether or not the ledger says so.
            Err(e) => tracing::error!(
                error = %e,
                records = batch.len(),
                "could not write to the issuance ledger"
            ),
        }
        if !finishing {
            std::thread::sleep(MIN_COMMIT_INTERVAL.saturating_sub(started.elapsed()));
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::OffsetDateTime;

    fn record(serial: &str) -> LedgerRecord {
        let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        LedgerRecord {
            serial: serial.into(),
            source: "grpc".into(),
            request_uid: None,
            request_name: None,
            identity: "spiffe://example.org/ns/a/sa/b".into(),
            dns_names: vec![],
            not_before: now,
            not_after: now,
            spki_sha256: String::new(),
            issuer_fingerprint: String::new(),
            issued_at: now,
        }
    }

    #[tokio::test]
    async fn finish_writes_everything_queued() {
        // No tempfile crate in the binary: a unique name under the system temp dir.
        let path = std::env::temp_dir().join(format!(
            "podca-ledger-test-{}-{}.redb",
            std::process::id(),
            OffsetDateTime::now_utc().unix_timestamp_nanos()
        ));
        let (sink, writer) = LedgerWriter::start(Ledger::open(&path).unwrap()).unwrap();
        for i in 0..5000 {
            sink.record(record(&format!("{i:04x}"))).await;
        }
        let written =
            tokio::task::spawn_blocking(move || writer.finish(std::time::Duration::from_secs(30)))
                .await
                .unwrap()
                .unwrap();
        assert_eq!(written, 5000);
        let ledger = Ledger::open(&path).unwrap();
        assert_eq!(ledger.len().unwrap(), 5000);
        assert!(ledger.by_serial("1387").unwrap().is_some());
        drop(ledger);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn finish_errors_read_as_before() {
        assert_eq!(
            FinishError::AlreadyStopped.to_string(),
            "the ledger writer had already stopped"
        );
        assert_eq!(
            FinishError::Timeout(std::time::Duration::from_secs(10)).to_string(),
            "the ledger writer did not finish within 10s"
        );
    }
}
