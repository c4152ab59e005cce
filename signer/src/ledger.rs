//! The issuance ledger: an append-only, crash-safe record of every certificate podca issued,
//! kept in a redb file. One record per certificate; indexes by serial, identity and time.
//!
//! redb commits are atomic and durable (copy-on-write B-trees with a checksummed commit slot),
//! so a process killed mid-write leaves either the whole batch or none of it.

use std::path::Path;

use redb::{
    Database, MultimapTableDefinition, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::issue::IssuedCertificate;

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
const BY_SERIAL: TableDefinition<&str, u64> = TableDefinition::new("by_serial");
const BY_IDENTITY: MultimapTableDefinition<&str, u64> = MultimapTableDefinition::new("by_identity");
const BY_TIME: TableDefinition<(i64, u64), ()> = TableDefinition::new("by_time");

/// One issued certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRecord {
    /// Serial number, lowercase hex.
    pub serial: String,
    /// Where the request came from: `pcr`, `grpc`, `cli`, `dev`.
    pub source: String,
    /// The request's UID (a PodCertificateRequest's metadata.uid), if any.
    pub request_uid: Option<String>,
    /// The request's `namespace/name`, if any.
    pub request_name: Option<String>,
    /// The SPIFFE ID in the certificate.
    pub identity: String,
    pub dns_names: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub not_before: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
    /// SHA-256 of the subject public key (SPKI DER), lowercase hex.
    pub spki_sha256: String,
    /// SHA-256 fingerprint of the issuing CA certificate.
    pub issuer_fingerprint: String,
    #[serde(with = "time::serde::rfc3339")]
    pub issued_at: OffsetDateTime,
}

impl LedgerRecord {
    /// The record of a certificate just issued.
    pub fn of(
        cert: &IssuedCertificate,
        source: &str,
        request_uid: Option<&str>,
        request_name: Option<&str>,
        issued_at: OffsetDateTime,
    ) -> Self {
        LedgerRecord {
            serial: cert.serial.clone(),
            source: source.into(),
            request_uid: request_uid.map(Into::into),
            request_name: request_name.map(Into::into),
            identity: cert.spiffe_id.clone(),
            dns_names: cert.dns_names.clone(),
            not_before: cert.validity.not_before,
            not_after: cert.validity.not_after,
            spki_sha256: cert.spki_sha256.clone(),
            issuer_fingerprint: cert.issuer_fingerprint.clone(),
            issued_at: issued_at.replace_nanosecond(0).unwrap_or(issued_at),
        }
    }
}

/// Why the ledger could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    #[error(
        "ledger {path} is open in another podca process (podca dev or serve); stop it to query \
         the ledger directly"
    )]
    InUse { path: String },
    #[error("ledger {path}: {detail}")]
    Storage { path: String, detail: String },
    #[error("ledger {path}: record {seq} is corrupt: {detail}")]
    Corrupt {
        path: String,
        seq: u64,
        detail: String,
    },
}

/// The ledger file.
#[derive(Debug)]
pub struct Ledger {
    db: Database,
    path: String,
}

impl Ledger {
    /// Opens the ledger at `path`, creating it if needed, and repairing it if the last writer
    /// crashed.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        let shown = path.display().to_string();
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => LedgerError::InUse {
                path: shown.clone(),
            },
            other => LedgerError::Storage {
                path: shown.clone(),
                detail: other.to_string(),
            },
        })?;
        let ledger = Ledger { db, path: shown };
        // Create the tables up front so readers never see "table does not exist".
        let tx = ledger.db.begin_write().map_err(|e| ledger.storage(e))?;
        {
            tx.open_table(RECORDS).map_err(|e| ledger.storage(e))?;
            tx.open_table(BY_SERIAL).map_err(|e| ledger.storage(e))?;
            tx.open_multimap_table(BY_IDENTITY)
                .map_err(|e| ledger.storage(e))?;
            tx.open_table(BY_TIME).map_err(|e| ledger.storage(e))?;
        }
        tx.commit().map_err(|e| ledger.storage(e))?;
        Ok(ledger)
    }

    /// Appends records in one durable transaction: all of them or none.
    pub fn append(&self, records: &[LedgerRecord]) -> Result<(), LedgerError> {
        if records.is_empty() {
            return Ok(());
        }
        let tx = self.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
            let mut by_serial = tx.open_table(BY_SERIAL).map_err(|e| self.storage(e))?;
            let mut by_identity = tx
                .open_multimap_table(BY_IDENTITY)
                .map_err(|e| self.storage(e))?;
            let mut by_time = tx.open_table(BY_TIME).map_err(|e| self.storage(e))?;
            let first = table
                .last()
                .map_err(|e| self.storage(e))?
                .map_or(0, |(k, _)| k.value() + 1);
            for (seq, record) in (first..).zip(records) {
                let json = serde_json::to_vec(record).map_err(|e| self.storage(e))?;
                table
                    .insert(seq, json.as_slice())
                    .map_err(|e| self.storage(e))?;
                by_serial
                    .insert(record.serial.as_str(), seq)
                    .map_err(|e| self.storage(e))?;
                by_identity
                    .insert(record.identity.as_str(), seq)
                    .map_err(|e| self.storage(e))?;
                by_time
                    .insert((record.issued_at.unix_timestamp(), seq), ())
                    .map_err(|e| self.storage(e))?;
            }
        }
        tx.commit().map_err(|e| self.storage(e))
    }

    /// The record of one serial (hex, any case, optional colons).
    pub fn by_serial(&self, serial: &str) -> Result<Option<LedgerRecord>, LedgerError> {
        let serial = serial.replace(':', "").to_ascii_lowercase();
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let index = tx.open_table(BY_SERIAL).map_err(|e| self.storage(e))?;
        let Some(seq) = index.get(serial.as_str()).map_err(|e| self.storage(e))? else {
            return Ok(None);
        };
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        self.read(&table, seq.value()).map(Some)
    }

    /// Every record of one identity (SPIFFE ID), oldest first.
    pub fn by_identity(&self, identity: &str) -> Result<Vec<LedgerRecord>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let index = tx
            .open_multimap_table(BY_IDENTITY)
            .map_err(|e| self.storage(e))?;
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let mut out = vec![];
        for seq in index.get(identity).map_err(|e| self.storage(e))? {
            let seq = seq.map_err(|e| self.storage(e))?.value();
            out.push(self.read(&table, seq)?);
        }
        Ok(out)
    }

    /// Records issued in `[from, to)`, oldest first, at most `limit`.
    pub fn issued_between(
        &self,
        from: OffsetDateTime,
        to: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<LedgerRecord>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let index = tx.open_table(BY_TIME).map_err(|e| self.storage(e))?;
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let range = (from.unix_timestamp(), 0u64)..(to.unix_timestamp(), 0u64);
        let mut out = vec![];
        for entry in index.range(range).map_err(|e| self.storage(e))?.take(limit) {
            let (key, _) = entry.map_err(|e| self.storage(e))?;
            out.push(self.read(&table, key.value().1)?);
        }
        Ok(out)
    }

    /// The newest `limit` records, newest first.
    pub fn latest(&self, limit: usize) -> Result<Vec<LedgerRecord>, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let mut out = vec![];
        for entry in table.iter().map_err(|e| self.storage(e))?.rev().take(limit) {
            let (seq, bytes) = entry.map_err(|e| self.storage(e))?;
            out.push(self.decode(seq.value(), bytes.value())?);
        }
        Ok(out)
    }

    /// How many records the ledger holds.
    pub fn len(&self) -> Result<u64, LedgerError> {
        let tx = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = tx.open_table(RECORDS).map_err(|e| self.storage(e))?;
        table.len().map_err(|e| self.storage(e))
    }

    /// Whether the ledger holds no record.
    pub fn is_empty(&self) -> Result<bool, LedgerError> {
        self.len().map(|n| n == 0)
    }

    fn read(
        &self,
        table: &redb::ReadOnlyTable<u64, &[u8]>,
        seq: u64,
    ) -> Result<LedgerRecord, LedgerError> {
        let bytes = table
            .get(seq)
            .map_err(|e| self.storage(e))?
            .ok_or_else(|| LedgerError::Corrupt {
                path: self.path.clone(),
                seq,
                detail: "indexed record is missing".into(),
            })?;
        self.decode(seq, bytes.value())
    }

    fn decode(&self, seq: u64, bytes: &[u8]) -> Result<LedgerRecord, LedgerError> {
        serde_json::from_slice(bytes).map_err(|e| LedgerError::Corrupt {
            path: self.path.clone(),
            seq,
            detail: e.to_string(),
        })
    }

    fn storage(&self, e: impl std::fmt::Display) -> LedgerError {
        LedgerError::Storage {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }
}
