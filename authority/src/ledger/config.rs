//! The `[ledger]` table: where decisions are recorded and what happens when that store is down.
//!
//! ```toml
//! [ledger]
//! backend = "redb"                  # redb (default) | postgres | none
//! path = "/var/lib/podca/ledger.redb"   # redb: default <CA data dir>/ledger.redb
//!
//! # backend = "postgres"
//! # url_file = "/etc/podca/ledger/url"  # a libpq URL or key=value string, e.g. from a Secret
//! # tls = "verify-full"                 # verify-full (default) | disable (Unix socket/loopback)
//! # ca_file = "/etc/podca/ledger/ca.crt" # the CA bundle that verifies the server
//! # pool_size = 4
//! # statement_timeout_seconds = 30    # the server cancels a longer statement; 2 s later podca
//!                                     # drops a connection that never answered
//!
//! on_unavailable = "retry"          # retry (default) | continue
//! queue_limit = 10000               # continue: records held in memory at most
//! retention_days = 400              # optional: the leader prunes older records daily
//!
//! [ledger.log]                      # optional: signed checkpoints of the Merkle log
//! enabled = true
//! key_file = "/var/lib/podca/log.key" # Ed25519, made (0600) if missing; default <data dir>/log.key
//! # key_secret = "podca-ca-log"     # [ca] backend = "secret": the Secret holding it (this default:
//!                                   # <CA Secret>-log, beside the CA Secret), made if missing
//! origin = "podca.example/ledger"   # the checkpoints' origin line and key name
//! checkpoint_interval_seconds = 60
//! ```
//! Keys of another backend are errors, so a setting is never silently ignored.

use std::path::PathBuf;

use podca_signer::spelling::{Spelled as _, Spelling, UnknownName};
use serde::Deserialize;

/// `[ledger]`, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawLedgerConfig")]
pub struct LedgerConfig {
    pub backend: LedgerBackend,
    pub on_unavailable: OnUnavailable,
    /// `continue` only: records held in memory while the store is down, at most.
    pub queue_limit: usize,
    /// Records older than this are pruned by the leader (daily); `None`: kept for ever.
    pub retention: Option<time::Duration>,
    /// `[ledger.log] enabled = true`: checkpoints signed and published.
    pub log: Option<super::log::LogConfig>,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            backend: LedgerBackend::Redb { path: None },
            on_unavailable: OnUnavailable::Retry,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            retention: None,
            log: None,
        }
    }
}

/// Where records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerBackend {
    /// An embedded redb file (one process at a time); `None`: the command's default place.
    Redb { path: Option<PathBuf> },
    /// A PostgreSQL database shared by every replica.
    Postgres(PostgresSettings),
    /// Nothing durable (chosen explicitly); the audit log line is still written.
    None,
}

impl LedgerBackend {
    /// The `backend` label of the ledger metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LedgerBackend::Redb { .. } => "redb",
            LedgerBackend::Postgres(_) => "postgres",
            LedgerBackend::None => "none",
        }
    }
}

/// `backend = "postgres"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSettings {
    /// The file holding the connection URL (it may hold a password: never logged).
    pub url_file: PathBuf,
    pub tls: PostgresTls,
    /// PEM CA certificates that verify the server (`tls = "verify-full"`).
    pub ca_file: Option<PathBuf>,
    pub pool_size: usize,
    /// PostgreSQL's `statement_timeout` on podca's connections: a statement that runs or waits
    /// longer is cancelled by the server; one unanswered 2 s after that loses its connection.
    /// Either way the batch fails and is retried like any failed one.
    pub statement_timeout: std::time::Duration,
}

/// TLS to the PostgreSQL server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PostgresTls {
    /// TLS required; the server certificate must chain to `ca_file` and name the host.
    #[default]
    VerifyFull,
    /// No TLS: accepted only when every host is a Unix socket or a loopback address.
    Disable,
}

/// `verify-full` or `disable`, as `--postgres-tls` spells them.
impl podca_signer::spelling::Spelled for PostgresTls {
    const WHAT: &'static str = "PostgreSQL TLS mode";
    const SPELLINGS: &'static [Spelling<Self>] = &[
        Spelling {
            value: PostgresTls::VerifyFull,
            name: "verify-full",
            aliases: &[],
            help: "TLS, the server's certificate and name verified (the default)",
        },
        Spelling {
            value: PostgresTls::Disable,
            name: "disable",
            aliases: &[],
            help: "no TLS (Unix sockets and loopback only)",
        },
    ];
}

impl std::str::FromStr for PostgresTls {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::from_name(text)
    }
}

/// What a decision waits for when the store cannot be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OnUnavailable {
    /// Nothing is handed out unrecorded: PodCertificateRequests stay pending (retried), gRPC
    /// callers get UNAVAILABLE.
    #[default]
    Retry,
    /// Hand out anyway and hold the record in memory (bounded by `queue_limit`) until the store
    /// is back; a metric and a Warning say so.
    Continue,
}

pub const DEFAULT_QUEUE_LIMIT: usize = 10_000;
pub const DEFAULT_POOL_SIZE: usize = 4;
/// `statement_timeout_seconds` when unset.
pub const DEFAULT_STATEMENT_TIMEOUT_SECONDS: u32 = 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum BackendName {
    #[default]
    Redb,
    Postgres,
    None,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLedgerConfig {
    #[serde(default)]
    backend: BackendName,
    path: Option<PathBuf>,
    url_file: Option<PathBuf>,
    tls: Option<PostgresTls>,
    ca_file: Option<PathBuf>,
    pool_size: Option<usize>,
    statement_timeout_seconds: Option<u32>,
    #[serde(default)]
    on_unavailable: OnUnavailable,
    queue_limit: Option<usize>,
    retention_days: Option<u32>,
    log: Option<RawLogConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLogConfig {
    #[serde(default)]
    enabled: bool,
    key_file: Option<PathBuf>,
    key_secret: Option<String>,
    origin: Option<String>,
    checkpoint_interval_seconds: Option<u64>,
}

/// A `[ledger]` table that names keys its backend does not use, or misses one it needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerConfigError {
    #[error("[ledger.log] names key_file and key_secret: the checkpoint key is in one place")]
    TwoLogKeys,
    #[error("[ledger] {key} does not apply to backend = \"{backend}\"")]
    Foreign {
        key: &'static str,
        backend: &'static str,
    },
    #[error("[ledger] backend = \"postgres\" needs url_file (a file holding the connection URL)")]
    NoUrlFile,
    #[error("[ledger] {0} must be at least 1")]
    Zero(&'static str),
    #[error("[ledger] queue_limit applies to on_unavailable = \"continue\" only")]
    QueueLimitWithoutContinue,
    #[error("[ledger.log] origin {0:?} must be non-empty, without spaces or '+'")]
    BadOrigin(String),
}

impl TryFrom<RawLedgerConfig> for LedgerConfig {
    type Error = LedgerConfigError;

    fn try_from(raw: RawLedgerConfig) -> Result<Self, Self::Error> {
        let RawLedgerConfig {
            backend,
            path,
            url_file,
            tls,
            ca_file,
            pool_size,
            statement_timeout_seconds,
            on_unavailable,
            queue_limit,
            retention_days,
            log,
        } = raw;
        let name = match backend {
            BackendName::Redb => "redb",
            BackendName::Postgres => "postgres",
            BackendName::None => "none",
        };
        let foreign = |key| LedgerConfigError::Foreign { key, backend: name };
        let postgres_keys = [
            ("url_file", url_file.is_some()),
            ("tls", tls.is_some()),
            ("ca_file", ca_file.is_some()),
            ("pool_size", pool_size.is_some()),
            (
                "statement_timeout_seconds",
                statement_timeout_seconds.is_some(),
            ),
        ];
        let backend = match backend {
            BackendName::Redb | BackendName::None => {
                if let Some((key, _)) = postgres_keys.iter().find(|(_, set)| *set) {
                    return Err(foreign(key));
                }
                if backend == BackendName::None {
                    if path.is_some() {
                        return Err(foreign("path"));
                    }
                    LedgerBackend::None
                } else {
                    LedgerBackend::Redb { path }
                }
            }
            BackendName::Postgres => {
                if path.is_some() {
                    return Err(foreign("path"));
                }
                let pool_size = pool_size.unwrap_or(DEFAULT_POOL_SIZE);
                if pool_size == 0 {
                    return Err(LedgerConfigError::Zero("pool_size"));
                }
                let timeout =
                    statement_timeout_seconds.unwrap_or(DEFAULT_STATEMENT_TIMEOUT_SECONDS);
                if timeout == 0 {
                    return Err(LedgerConfigError::Zero("statement_timeout_seconds"));
                }
                LedgerBackend::Postgres(PostgresSettings {
                    url_file: url_file.ok_or(LedgerConfigError::NoUrlFile)?,
                    tls: tls.unwrap_or_default(),
                    ca_file,
                    pool_size,
                    statement_timeout: std::time::Duration::from_secs(timeout.into()),
                })
            }
        };
        if queue_limit.is_some() && on_unavailable != OnUnavailable::Continue {
            return Err(LedgerConfigError::QueueLimitWithoutContinue);
        }
        let queue_limit = queue_limit.unwrap_or(DEFAULT_QUEUE_LIMIT);
        if queue_limit == 0 {
            return Err(LedgerConfigError::Zero("queue_limit"));
        }
        if retention_days == Some(0) {
            return Err(LedgerConfigError::Zero("retention_days"));
        }
        let log = match log {
            Some(log) if log.enabled => {
                let origin = log
                    .origin
                    .unwrap_or_else(|| super::log::DEFAULT_ORIGIN.to_owned());
                if origin.is_empty() || origin.contains(['+', ' ', '\n']) {
                    return Err(LedgerConfigError::BadOrigin(origin));
                }
                let every = log
                    .checkpoint_interval_seconds
                    .unwrap_or(super::log::DEFAULT_INTERVAL_SECONDS);
                if every == 0 {
                    return Err(LedgerConfigError::Zero("log.checkpoint_interval_seconds"));
                }
                if log.key_file.is_some() && log.key_secret.is_some() {
                    return Err(LedgerConfigError::TwoLogKeys);
                }
                Some(super::log::LogConfig {
                    key_file: log.key_file,
                    key_secret: log.key_secret,
                    origin,
                    interval: std::time::Duration::from_secs(every),
                })
            }
            _ => None,
        };
        Ok(LedgerConfig {
            backend,
            on_unavailable,
            queue_limit,
            retention: retention_days.map(|d| time::Duration::days(i64::from(d))),
            log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LedgerConfig, String> {
        #[derive(Deserialize)]
        struct Wrapper {
            ledger: LedgerConfig,
        }
        toml::from_str::<Wrapper>(text)
            .map(|w| w.ledger)
            .map_err(|e| e.message().to_owned())
    }

    #[test]
    fn defaults_are_redb_and_retry() {
        let c = parse("[ledger]\n").unwrap();
        assert_eq!(c, LedgerConfig::default());
        assert_eq!(c.backend, LedgerBackend::Redb { path: None });
        assert_eq!(c.on_unavailable, OnUnavailable::Retry);
    }

    #[test]
    fn the_log_table_is_off_unless_enabled_and_checks_its_keys() {
        assert_eq!(parse("[ledger.log]\n").unwrap().log, None);
        let c = parse(
            "[ledger.log]\nenabled = true\nkey_file = \"/k\"\norigin = \"o.example/l\"\n\
             checkpoint_interval_seconds = 5\n",
        )
        .unwrap();
        assert_eq!(
            c.log,
            Some(crate::ledger::log::LogConfig {
                key_file: Some("/k".into()),
                key_secret: None,
                origin: "o.example/l".into(),
                interval: std::time::Duration::from_secs(5),
            })
        );
        let c = parse("[ledger.log]\nenabled = true\n").unwrap();
        assert_eq!(c.log.map(|l| l.origin), Some("podca".into()));
        for (text, error) in [
            (
                "[ledger.log]\nenabled = true\norigin = \"a b\"\n",
                "[ledger.log] origin \"a b\" must be non-empty, without spaces or '+'",
            ),
            (
                "[ledger.log]\nenabled = true\ncheckpoint_interval_seconds = 0\n",
                "[ledger] log.checkpoint_interval_seconds must be at least 1",
            ),
            (
                "[ledger.log]\nenabled = true\nkey_file = \"/k\"\nkey_secret = \"s\"\n",
                "[ledger.log] names key_file and key_secret: the checkpoint key is in one place",
            ),
        ] {
            assert_eq!(parse(text).unwrap_err(), error, "{text}");
        }
        assert!(
            parse("[ledger.log]\nenabld = true\n")
                .unwrap_err()
                .starts_with("unknown field `enabld`")
        );
    }

    #[test]
    fn postgres_takes_its_keys() {
        let c = parse(
            "[ledger]\nbackend = \"postgres\"\nurl_file = \"/u\"\nca_file = \"/ca\"\n\
             pool_size = 2\nstatement_timeout_seconds = 7\non_unavailable = \"continue\"\n\
             queue_limit = 5\nretention_days = 30\n",
        )
        .unwrap();
        assert_eq!(
            c.backend,
            LedgerBackend::Postgres(PostgresSettings {
                url_file: "/u".into(),
                tls: PostgresTls::VerifyFull,
                ca_file: Some("/ca".into()),
                pool_size: 2,
                statement_timeout: std::time::Duration::from_secs(7),
            })
        );
        assert_eq!(c.on_unavailable, OnUnavailable::Continue);
        assert_eq!(c.queue_limit, 5);
        assert_eq!(c.retention, Some(time::Duration::days(30)));
        let c = parse("[ledger]\nbackend = \"postgres\"\nurl_file = \"/u\"\ntls = \"disable\"\n")
            .unwrap();
        assert!(matches!(
            c.backend,
            LedgerBackend::Postgres(PostgresSettings {
                tls: PostgresTls::Disable,
                statement_timeout,
                ..
            }) if statement_timeout == std::time::Duration::from_secs(30)
        ));
    }

    #[test]
    fn each_misplaced_key_is_its_own_error() {
        for (text, error) in [
            (
                "backend = \"redb\"\nurl_file = \"/u\"",
                "[ledger] url_file does not apply to backend = \"redb\"",
            ),
            (
                "backend = \"none\"\npath = \"/l\"",
                "[ledger] path does not apply to backend = \"none\"",
            ),
            (
                "backend = \"postgres\"\nurl_file = \"/u\"\npath = \"/l\"",
                "[ledger] path does not apply to backend = \"postgres\"",
            ),
            (
                "backend = \"postgres\"",
                "[ledger] backend = \"postgres\" needs url_file (a file holding the connection URL)",
            ),
            (
                "backend = \"postgres\"\nurl_file = \"/u\"\npool_size = 0",
                "[ledger] pool_size must be at least 1",
            ),
            (
                "backend = \"postgres\"\nurl_file = \"/u\"\nstatement_timeout_seconds = 0",
                "[ledger] statement_timeout_seconds must be at least 1",
            ),
            (
                "statement_timeout_seconds = 5",
                "[ledger] statement_timeout_seconds does not apply to backend = \"redb\"",
            ),
            (
                "queue_limit = 3",
                "[ledger] queue_limit applies to on_unavailable = \"continue\" only",
            ),
            (
                "retention_days = 0",
                "[ledger] retention_days must be at least 1",
            ),
        ] {
            assert_eq!(
                parse(&format!("[ledger]\n{text}\n")),
                Err(error.into()),
                "{text}"
            );
        }
        let unknown = parse("[ledger]\nbackend = \"sqlite\"\n").unwrap_err();
        assert!(unknown.starts_with("unknown variant `sqlite`"), "{unknown}");
        let stray = parse("[ledger]\nurl = \"postgres://\"\n").unwrap_err();
        assert!(stray.starts_with("unknown field `url`"), "{stray}");
    }
}
