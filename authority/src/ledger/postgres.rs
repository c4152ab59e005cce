//! The PostgreSQL backend: a pool of tokio-postgres connections (TLS through rustls), the
//! schema migrations embedded in the binary, batch inserts that skip records already there.

use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use podca_signer::merkle::{Frontier, Hash, record_leaf_hash};
use podca_signer::merkle_verify::{LogSnapshot, StoredLeaf};
use podca_signer::{Filter, LedgerRecord};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio_postgres::config::{Host, SslMode};

use super::StoreError;
use super::config::{PostgresSettings, PostgresTls};
use super::pg_tls::MakeRustlsConnect;

/// The migrations, in order; `(version, SQL)`. Never edit one that shipped: add the next.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_ledger.sql")),
    (2, include_str!("migrations/0002_log.sql")),
];

/// The newest schema this binary knows.
pub const SCHEMA_LATEST: i32 = 2;

/// Serializes migrations between replicas starting together (`pg_advisory_xact_lock`).
const MIGRATION_LOCK: i64 = 0x706f_6463_615f_6c67; // "podca_lg"

/// How long connecting (and waiting for a pooled connection) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than the server's `statement_timeout` podca waits for an answer before it
/// drops the connection: time for the server's own cancellation error to arrive.
const CLIENT_GRACE: Duration = Duration::from_secs(2);

/// The connection URL as read from its file. It may hold a password: `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl(String);

impl PostgresUrl {
    /// Reads the URL from `path` (surrounding whitespace dropped).
    pub fn read(path: &Path) -> Result<Self, StoreError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            StoreError::Config(format!("[ledger] url_file {}: {e}", path.display()))
        })?;
        let text = text.trim();
        if text.is_empty() {
            return Err(StoreError::Config(format!(
                "[ledger] url_file {} is empty",
                path.display()
            )));
        }
        Ok(PostgresUrl(text.to_owned()))
    }

    fn parse(&self, path: &Path) -> Result<tokio_postgres::Config, StoreError> {
        // tokio-postgres's parse errors name the option, never its value.
        tokio_postgres::Config::from_str(&self.0).map_err(|e| {
            StoreError::Config(format!(
                "[ledger] url_file {}: not a PostgreSQL connection string: {e}",
                path.display()
            ))
        })
    }
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PostgresUrl(<redacted>)")
    }
}

/// The PostgreSQL ledger.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// How long podca waits for a statement's answer (`statement_timeout_seconds` +
    /// [`CLIENT_GRACE`]).
    answer_timeout: Duration,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.pool.status();
        f.debug_struct("PgStore")
            .field("pool_size", &status.max_size)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects, and brings the schema up to [`SCHEMA_LATEST`] (refusing a newer one).
    pub async fn connect(settings: &PostgresSettings) -> Result<Self, StoreError> {
        let url = PostgresUrl::read(&settings.url_file)?;
        Self::connect_url(&url, settings).await
    }

    /// As [`connect`](Self::connect), with the URL already read.
    pub async fn connect_url(
        url: &PostgresUrl,
        settings: &PostgresSettings,
    ) -> Result<Self, StoreError> {
        let mut config = url.parse(&settings.url_file)?;
        config.connect_timeout(CONNECT_TIMEOUT);
        if config.get_application_name().is_none() {
            config.application_name("podca");
        }
        // The server cancels a statement that runs (or waits for a lock) longer than this, so
        // nothing lands after podca gave up on it; `answered` is the backstop for a server that
        // does not answer at all.
        let limit = format!(
            "-c statement_timeout={}",
            settings.statement_timeout.as_millis()
        );
        let options = match config.get_options() {
            Some(theirs) => format!("{theirs} {limit}"),
            None => limit,
        };
        config.options(&options);
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match settings.tls {
            PostgresTls::Disable => {
                if let Some(host) = remote_host(&config) {
                    return Err(StoreError::Config(format!(
                        "[ledger] tls = \"disable\" is allowed for Unix sockets and loopback \
                         only, not for host {host}: use tls = \"verify-full\" with ca_file"
                    )));
                }
                config.ssl_mode(SslMode::Disable);
                Manager::from_config(config, tokio_postgres::NoTls, manager_config)
            }
            PostgresTls::VerifyFull => {
                let ca_file = settings.ca_file.as_deref().ok_or_else(|| {
                    StoreError::Config(
                        "[ledger] tls = \"verify-full\" needs ca_file (the PEM CA bundle that \
                         signed the server's certificate)"
                            .into(),
                    )
                })?;
                config.ssl_mode(SslMode::Require);
                Manager::from_config(
                    config,
                    MakeRustlsConnect::new(tls_config(ca_file)?),
                    manager_config,
                )
            }
        };
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT * 2))
            .build()
            .map_err(|e| StoreError::Config(format!("[ledger] PostgreSQL pool: {e}")))?;
        let store = PgStore {
            pool,
            answer_timeout: settings.statement_timeout + CLIENT_GRACE,
        };
        store.migrate().await?;
        store.add_missing_leaves().await?;
        Ok(store)
    }

    /// Applies the migrations this binary has and the database lacks, under an advisory lock,
    /// so replicas starting together apply each once.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| start_error(pool_error(&e)))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| start_error(pg(&e)))?;
        tx.execute("select pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| start_error(pg(&e)))?;
        tx.batch_execute(
            "create table if not exists podca_schema_migrations (
                version integer primary key,
                applied_at timestamptz not null default now())",
        )
        .await
        .map_err(|e| start_error(pg(&e)))?;
        let current: Option<i32> = tx
            .query_one("select max(version) from podca_schema_migrations", &[])
            .await
            .map_err(|e| start_error(pg(&e)))?
            .get(0);
        let current = current.unwrap_or(0);
        if current > SCHEMA_LATEST {
            return Err(StoreError::SchemaTooNew {
                found: current,
                known: SCHEMA_LATEST,
            });
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.batch_execute(sql)
                .await
                .map_err(|e| start_error(format!("migration {version}: {}", pg(&e))))?;
            tx.execute(
                "insert into podca_schema_migrations (version) values ($1)",
                &[version],
            )
            .await
            .map_err(|e| start_error(pg(&e)))?;
            tracing::info!(version, "ledger: applied PostgreSQL schema migration");
        }
        tx.commit().await.map_err(|e| start_error(pg(&e)))
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(pool_error(&e)))
    }

    /// Inserts `records` in one transaction with their leaves of the Merkle log; says, per
    /// record, whether it was new (an id already there is skipped). The transaction first locks
    /// the log's state row, so sequence numbers and leaf indices are taken by one appender at a
    /// time across every replica.
    pub async fn append(&self, records: &[LedgerRecord]) -> Result<Vec<bool>, StoreError> {
        if records.is_empty() {
            return Ok(vec![]);
        }
        let mut json = String::from("[");
        for (i, r) in records.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&r.to_json());
        }
        json.push(']');
        let mut client = self.client().await?;
        // Prepared once per connection (deadpool's statement cache): parsing and planning it
        // for every batch was about 4 % of the PostgreSQL backend's CPU under load, plus a
        // round trip.
        let answer = tokio::time::timeout(self.answer_timeout, async {
            let tx = client.transaction().await?;
            let state = tx.prepare_cached(LOCK_LOG).await?;
            let frontier: Vec<u8> = tx.query_one(&state, &[]).await?.get(0);
            let insert = tx.prepare_cached(APPEND).await?;
            let rows = tx.query(&insert, &[&json]).await?;
            let mut new: Vec<(i64, String)> =
                rows.iter().map(|row| (row.get(1), row.get(0))).collect();
            new.sort_unstable();
            if !new.is_empty() {
                let by_id: std::collections::HashMap<&str, &LedgerRecord> =
                    records.iter().map(|r| (r.id.as_str(), r)).collect();
                let Ok(mut frontier) = Frontier::decode(&frontier) else {
                    return Ok(Err("the log's stored frontier is corrupt".to_owned()));
                };
                let (mut idx, mut seqs, mut hashes) = (vec![], vec![], vec![]);
                for (seq, id) in &new {
                    let Some(record) = by_id.get(id.as_str()) else {
                        continue;
                    };
                    let hash = record_leaf_hash(record);
                    idx.push(i64::try_from(frontier.size()).unwrap_or(i64::MAX));
                    seqs.push(*seq);
                    hashes.push(hash.to_vec());
                    frontier.push(hash);
                }
                let leaves = tx.prepare_cached(ADD_LEAVES).await?;
                tx.execute(&leaves, &[&idx, &seqs, &hashes]).await?;
                let save = tx.prepare_cached(SAVE_FRONTIER).await?;
                tx.execute(&save, &[&frontier.encode()]).await?;
            }
            tx.commit().await?;
            Ok(Ok(new))
        })
        .await;
        let new = self
            .answered(client, answer)?
            .map_err(StoreError::Unavailable)?;
        let mut new: HashSet<String> = new.into_iter().map(|(_, id)| id).collect();
        Ok(records.iter().map(|r| new.remove(&r.id)).collect())
    }

    /// Gives every record after the log's last leaf a leaf, in sequence order: the records of a
    /// database written before schema 2.
    async fn add_missing_leaves(&self) -> Result<(), StoreError> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| start_error(pool_error(&e)))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| start_error(pg(&e)))?;
        let frontier: Vec<u8> = tx
            .query_one(LOCK_LOG, &[])
            .await
            .map_err(|e| start_error(pg(&e)))?
            .get(0);
        let mut frontier = Frontier::decode(&frontier).map_err(|e| start_error(e.to_string()))?;
        let rows = tx
            .query(
                "select seq, record::text from podca_ledger
                 where seq > coalesce((select max(seq) from podca_log_leaves), 0)
                 order by seq",
                &[],
            )
            .await
            .map_err(|e| start_error(pg(&e)))?;
        if rows.is_empty() {
            return Ok(());
        }
        let (mut idx, mut seqs, mut hashes) = (vec![], vec![], vec![]);
        for row in &rows {
            let seq: i64 = row.get(0);
            let text: String = row.get(1);
            let record = LedgerRecord::from_json(text.as_bytes())
                .map_err(|e| start_error(format!("record seq {seq} does not parse: {e}")))?;
            let hash = record_leaf_hash(&record);
            idx.push(i64::try_from(frontier.size()).unwrap_or(i64::MAX));
            seqs.push(seq);
            hashes.push(hash.to_vec());
            frontier.push(hash);
        }
        tx.execute(ADD_LEAVES, &[&idx, &seqs, &hashes])
            .await
            .map_err(|e| start_error(pg(&e)))?;
        tx.execute(SAVE_FRONTIER, &[&frontier.encode()])
            .await
            .map_err(|e| start_error(pg(&e)))?;
        tx.commit().await.map_err(|e| start_error(pg(&e)))?;
        tracing::info!(
            leaves = rows.len(),
            "ledger: gave earlier records their log leaves"
        );
        Ok(())
    }

    /// The log's frontier as of the last commit.
    pub async fn log_frontier(&self) -> Result<Frontier, StoreError> {
        let client = self.client().await?;
        let answer = tokio::time::timeout(
            self.answer_timeout,
            client.query_one("select frontier from podca_log_state where id = 1", &[]),
        )
        .await;
        let row = self.answered(client, answer)?;
        Frontier::decode(row.get::<_, &[u8]>(0)).map_err(|e| StoreError::Unavailable(e.to_string()))
    }

    /// The leaf hashes of `[from, to)`.
    pub async fn log_leaf_hashes(&self, from: u64, to: u64) -> Result<Vec<Hash>, StoreError> {
        let client = self.client().await?;
        let (from, to) = (as_i64(from), as_i64(to));
        let answer = tokio::time::timeout(
            self.answer_timeout,
            client.query(
                "select hash from podca_log_leaves where idx >= $1 and idx < $2 order by idx",
                &[&from, &to],
            ),
        )
        .await;
        let rows = self.answered(client, answer)?;
        Ok(rows.iter().map(|r| to_hash(r.get(0))).collect())
    }

    /// The leaf index of the record with this id.
    pub async fn log_index_of(&self, id: &str) -> Result<Option<u64>, StoreError> {
        let client = self.client().await?;
        let answer = tokio::time::timeout(
            self.answer_timeout,
            client.query_opt(
                "select l.idx from podca_ledger r join podca_log_leaves l on l.seq = r.seq
                 where r.id = $1",
                &[&id],
            ),
        )
        .await;
        let row = self.answered(client, answer)?;
        Ok(row.map(|r| u64::try_from(r.get::<_, i64>(0)).unwrap_or_default()))
    }

    /// The records (JSON) of leaves `[from, to)`, `None` for a pruned one.
    pub async fn log_entries(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let client = self.client().await?;
        let (from, to) = (as_i64(from), as_i64(to));
        let answer = tokio::time::timeout(
            self.answer_timeout,
            client.query(
                "select r.record::text from podca_log_leaves l
                 left join podca_ledger r on r.seq = l.seq
                 where l.idx >= $1 and l.idx < $2 order by l.idx",
                &[&from, &to],
            ),
        )
        .await;
        let rows = self.answered(client, answer)?;
        Ok(rows
            .iter()
            .map(|r| r.get::<_, Option<String>>(0).map(String::into_bytes))
            .collect())
    }

    /// Keeps a signed checkpoint (one per size: the first stays).
    pub async fn add_checkpoint(&self, size: u64, note: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        let size = as_i64(size);
        let answer = tokio::time::timeout(
            self.answer_timeout,
            client.execute(
                "insert into podca_log_checkpoints (size, note) values ($1, $2)
                 on conflict do nothing",
                &[&size, &note],
            ),
        )
        .await;
        self.answered(client, answer).map(|_| ())
    }

    /// The newest checkpoint: its size and note.
    pub async fn latest_checkpoint(&self) -> Result<Option<(u64, String)>, StoreError> {
        let client = self.client().await?;
        let answer = tokio::time::timeout(
            self.answer_timeout,
            client.query_opt(
                "select size, note from podca_log_checkpoints order by size desc limit 1",
                &[],
            ),
        )
        .await;
        let row = self.answered(client, answer)?;
        Ok(row.map(|r| {
            (
                u64::try_from(r.get::<_, i64>(0)).unwrap_or_default(),
                r.get(1),
            )
        }))
    }

    /// Everything `podca ledger verify` checks, read in one repeatable-read transaction.
    pub async fn log_snapshot(&self) -> Result<LogSnapshot, StoreError> {
        let mut client = self.client().await?;
        let answer = tokio::time::timeout(self.answer_timeout * 10, async {
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await?;
            let mut snapshot = LogSnapshot::default();
            for row in tx
                .query(
                    "select idx, seq, hash from podca_log_leaves order by idx",
                    &[],
                )
                .await?
            {
                snapshot.leaves.push(StoredLeaf {
                    index: u64::try_from(row.get::<_, i64>(0)).unwrap_or(u64::MAX),
                    seq: u64::try_from(row.get::<_, i64>(1)).unwrap_or(u64::MAX),
                    hash: to_hash(row.get(2)),
                });
            }
            for row in tx
                .query("select seq, record::text from podca_ledger", &[])
                .await?
            {
                let seq = u64::try_from(row.get::<_, i64>(0)).unwrap_or(u64::MAX);
                snapshot
                    .records
                    .insert(seq, row.get::<_, String>(1).into_bytes());
            }
            for row in tx.query("select seq from podca_log_pruned", &[]).await? {
                snapshot
                    .pruned
                    .insert(u64::try_from(row.get::<_, i64>(0)).unwrap_or(u64::MAX));
            }
            for row in tx
                .query(
                    "select size, note from podca_log_checkpoints order by size",
                    &[],
                )
                .await?
            {
                let size = u64::try_from(row.get::<_, i64>(0)).unwrap_or(u64::MAX);
                snapshot.checkpoints.push((size, row.get(1)));
            }
            snapshot.frontier = tx
                .query_opt("select frontier from podca_log_state where id = 1", &[])
                .await?
                .map(|r| r.get(0))
                .unwrap_or_default();
            tx.commit().await?;
            Ok(snapshot)
        })
        .await;
        self.answered(client, answer)
    }

    /// The records `filter` wants, newest first.
    pub async fn query(&self, filter: &Filter) -> Result<Vec<LedgerRecord>, StoreError> {
        let client = self.client().await?;
        let time = |t: Option<OffsetDateTime>| t.and_then(|t| t.format(&Rfc3339).ok());
        let serial = filter
            .serial
            .as_deref()
            .map(podca_signer::ledger::normalize_hex);
        let fingerprint = filter
            .fingerprint
            .as_deref()
            .map(podca_signer::ledger::normalize_hex);
        let outcome = filter.outcome.map(|o| o.as_str().to_owned());
        let limit = (filter.limit != 0).then(|| i64::try_from(filter.limit).unwrap_or(i64::MAX));
        let answer = tokio::time::timeout(
            self.answer_timeout,
            client.query(
                "select record::text from podca_ledger
                 where ($1::text is null or identity = $1)
                   and ($2::text is null or namespace = $2)
                   and ($3::text is null or node_name = $3)
                   and ($4::text is null or serial = $4)
                   and ($5::text is null or cert_sha256 = $5 or spki_sha256 = $5
                        or issuer_fingerprint = $5 or record->'jwt'->>'token_sha256' = $5)
                   and ($6::text is null or time >= $6::text::timestamptz)
                   and ($7::text is null or time < $7::text::timestamptz)
                   and ($8::text is null or outcome = $8)
                 order by time desc, seq desc
                 limit $9",
                &[
                    &filter.identity,
                    &filter.namespace,
                    &filter.node,
                    &serial,
                    &fingerprint,
                    &time(filter.since),
                    &time(filter.until),
                    &outcome,
                    &limit,
                ],
            ),
        )
        .await;
        let rows = self.answered(client, answer)?;
        rows.iter()
            .map(|row| {
                let text: String = row.get(0);
                LedgerRecord::from_json(text.as_bytes())
                    .map_err(|e| StoreError::Unavailable(format!("a record does not parse: {e}")))
            })
            .collect()
    }

    /// Deletes the records made before `before`; says how many.
    pub async fn prune(&self, before: OffsetDateTime) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let before = before
            .format(&Rfc3339)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let answer = tokio::time::timeout(
            self.answer_timeout,
            // The leaves stay; the tombstones say these records went on purpose.
            client.execute(
                "with gone as (delete from podca_ledger where time < $1::text::timestamptz
                               returning seq)
                 insert into podca_log_pruned (seq) select seq from gone",
                &[&before],
            ),
        )
        .await;
        self.answered(client, answer)
    }

    /// A statement's answer, or why there is none. The server cancels a statement that runs or
    /// waits for a lock past `statement_timeout` (an ERROR, the connection stays usable); one
    /// still unanswered after `answer_timeout` gives up its connection (dropped, never pooled
    /// again), for a server that stops answering without closing it (a network partition that
    /// drops packets). Neither may hold the ledger writer, and every decision waiting on it, for
    /// ever: the batch fails and is retried like any failed one, and records that did land are
    /// skipped by their ids.
    fn answered<T>(
        &self,
        client: deadpool_postgres::Object,
        answer: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        match answer {
            Ok(answer) => answer.map_err(|e| StoreError::Unavailable(pg(&e))),
            Err(_) => {
                drop(deadpool_postgres::Object::take(client));
                Err(StoreError::Unavailable(format!(
                    "no answer within {} s (statement_timeout_seconds, and {} s of grace); \
                     the connection was dropped",
                    (self.answer_timeout - CLIENT_GRACE).as_secs(),
                    CLIENT_GRACE.as_secs()
                )))
            }
        }
    }
}

/// The batch insert of [`PgStore::append`]: the records as one JSON array, each row's indexed
/// columns taken from its object; ids already there are skipped and not returned.
const APPEND: &str = "insert into podca_ledger (id, serial, time, source, signer, outcome, reason,
        identity, namespace, service_account, pod_name, node_name, cert_sha256,
        spki_sha256, issuer_fingerprint, replica, record)
     select r->>'id', r->>'serial', (r->>'time')::timestamptz, r->>'source',
        r->>'signer', r->>'outcome', r->>'reason', r->>'identity', r->>'namespace',
        r->>'service_account', r->>'pod_name', r->>'node_name', r->>'cert_sha256',
        r->>'spki_sha256', r->>'issuer_fingerprint', r->>'replica', r
     from jsonb_array_elements($1::text::jsonb) with ordinality as t(r, n)
     order by n
     on conflict do nothing
     returning id, seq";

/// The log's sequencer: the state row, locked until the append commits.
const LOCK_LOG: &str = "select frontier from podca_log_state where id = 1 for update";

/// New leaves: `(idx, seq, hash)` as three arrays.
const ADD_LEAVES: &str = "insert into podca_log_leaves (idx, seq, hash)
     select * from unnest($1::bigint[], $2::bigint[], $3::bytea[])";

const SAVE_FRONTIER: &str = "update podca_log_state set frontier = $1 where id = 1";

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stored hash; one of another length (a damaged row) reads as zeros where it differs, which
/// `verify` reports as a leaf that does not match its record.
fn to_hash(bytes: &[u8]) -> Hash {
    let mut hash = [0u8; 32];
    for (d, s) in hash.iter_mut().zip(bytes) {
        *d = *s;
    }
    hash
}

/// The first host that is neither a Unix socket nor loopback, if any.
fn remote_host(config: &tokio_postgres::Config) -> Option<String> {
    let addrs_local = config.get_hostaddrs().iter().all(|a| a.is_loopback());
    if !config.get_hostaddrs().is_empty() && addrs_local {
        return None;
    }
    if config.get_hosts().is_empty() {
        // libpq's default is the local Unix socket; tokio-postgres needs a host: let it say so.
        return None;
    }
    config.get_hosts().iter().find_map(|host| match host {
        Host::Unix(_) => None,
        Host::Tcp(name) => {
            let local = name == "localhost"
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            (!local).then(|| name.clone())
        }
    })
}

/// A rustls client configuration trusting the certificates in `ca_file`.
fn tls_config(ca_file: &Path) -> Result<rustls::ClientConfig, StoreError> {
    let shown = ca_file.display();
    let text = std::fs::read(ca_file)
        .map_err(|e| StoreError::Config(format!("[ledger] ca_file {shown}: {e}")))?;
    let blocks = pem::parse_many(&text)
        .map_err(|e| StoreError::Config(format!("[ledger] ca_file {shown}: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    for block in blocks.iter().filter(|b| b.tag() == "CERTIFICATE") {
        roots
            .add(rustls::pki_types::CertificateDer::from(
                block.contents().to_vec(),
            ))
            .map_err(|e| StoreError::Config(format!("[ledger] ca_file {shown}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(StoreError::Config(format!(
            "[ledger] ca_file {shown} holds no PEM certificate"
        )));
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Config(format!("[ledger] TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

fn start_error(detail: String) -> StoreError {
    StoreError::Config(format!("ledger: PostgreSQL: {detail}"))
}

/// One line saying what went wrong, with the server's own message when it sent one.
pub(crate) fn pg(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn pool_error(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => pg(e),
        PoolError::Timeout(_) => format!("no connection within {:?}", CONNECT_TIMEOUT * 2),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_never_shows_in_debug() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("url");
        std::fs::write(&path, "postgres://podca:s3cr3t-pw@db.example:5432/podca\n").unwrap();
        let url = PostgresUrl::read(&path).unwrap();
        let shown = format!("{url:?}");
        assert_eq!(shown, "PostgresUrl(<redacted>)");
        assert!(!shown.contains("s3cr3t"));
        // A URL that does not parse: the error names the file, not the URL.
        std::fs::write(
            &path,
            "postgres://podca:s3cr3t-pw@db.example:notaport/podca",
        )
        .unwrap();
        let error = PostgresUrl::read(&path)
            .unwrap()
            .parse(&path)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("not a PostgreSQL connection string"),
            "{error}"
        );
        assert!(!error.contains("s3cr3t"), "{error}");
    }

    #[test]
    fn plaintext_is_for_unix_sockets_and_loopback_only() {
        for (url, remote) in [
            ("host=/run/postgresql user=podca", None),
            ("host=127.0.0.1 user=podca", None),
            ("host=localhost user=podca", None),
            ("postgres://podca@[::1]/podca", None),
            ("host=db.example user=podca", Some("db.example")),
            ("host=/run/postgresql,10.0.0.5 user=podca", Some("10.0.0.5")),
        ] {
            let config = tokio_postgres::Config::from_str(url).unwrap();
            assert_eq!(remote_host(&config).as_deref(), remote, "{url}");
        }
    }
}
