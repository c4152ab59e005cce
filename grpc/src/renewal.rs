//! The end of mTLS renewal (issue #40): a podca client certificate buys its successor only
//! while its renewal chain is young enough, its service account still exists (with the UID the
//! chain began with), and neither its serial nor its identity is on the denylist.
//!
//! * **Chain age.** Every gRPC-issued leaf carries where its chain began
//!   ([`podca_signer::renewal`]); a renewal copies it. Past `[grpc] max_renewal_seconds`
//!   (default 24 h) the certificate no longer renews: the workload must show a token again. A
//!   renewed leaf never outlives the bound either (its notAfter is clamped to it).
//! * **Service account.** Read from the API server (through the [`PodDirectory`]), cached for
//!   [`ACCOUNT_CACHE_TTL`] at most: a deleted service account, or one deleted and re-created
//!   under the same name (another UID), stops renewing within that time.
//! * **Denylist.** `[grpc] renewal_denylist` names a file of `serial <hex>` and
//!   `identity <SPIFFE ID>` lines (`#` comments), re-read within [`DENYLIST_RELOAD`] of a
//!   change (a mounted ConfigMap updates in place); `podca renewal deny|allow|list` edit it.
//!   A listed certificate or identity renews with a token only. A file that does not parse
//!   stops the start; one that stops parsing later leaves the last good list in force and is
//!   logged with its line (fail closed: a broken edit never lifts an entry).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use podca_signer::renewal::RenewalChain;

use crate::auth::{LookupError, PodDirectory};

/// The longest a service account's existence and UID are taken from the cache.
pub const ACCOUNT_CACHE_TTL: Duration = Duration::from_secs(30);
/// Accounts remembered at most (a bound, not a tuning knob: one entry per renewing identity).
const ACCOUNT_CACHE_MAX: usize = 50_000;
/// How often the denylist file is checked for a change.
pub const DENYLIST_RELOAD: Duration = Duration::from_secs(2);
/// The default `[grpc] max_renewal_seconds`: a day, as SPIRE's default agent SVID chain.
pub const DEFAULT_MAX_RENEWAL: Duration = Duration::from_secs(24 * 3600);

/// Why a certificate may not renew. The messages name what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RenewalRefusal {
    #[error(
        "the client certificate (serial {serial}) is on podca's renewal denylist; authenticate \
         with a service-account token"
    )]
    DeniedSerial { serial: String },
    #[error("{identity} is on podca's renewal denylist; authenticate with a service-account token")]
    DeniedIdentity { identity: String },
    #[error(
        "the client certificate's renewal chain began at {origin} and renewal ends after {max:?}; \
         authenticate with a service-account token"
    )]
    ChainTooOld {
        origin: OffsetDateTime,
        max: Duration,
    },
    #[error("the service account {namespace}/{name} no longer exists; it cannot renew")]
    AccountGone { namespace: String, name: String },
    #[error(
        "the service account {namespace}/{name} was re-created since the certificate was issued \
         (another UID); authenticate with a token"
    )]
    AccountReplaced { namespace: String, name: String },
    #[error("{0}")]
    Malformed(String),
}

/// What a certificate-only caller must pass (see the module docs).
pub struct RenewalRules {
    max_age: Duration,
    denylist: Arc<Denylist>,
    accounts: Option<AccountCache>,
}

impl fmt::Debug for RenewalRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenewalRules")
            .field("max_age", &self.max_age)
            .field("denylist", &self.denylist)
            .field("checks_accounts", &self.accounts.is_some())
            .finish()
    }
}

impl RenewalRules {
    /// `accounts`: where service accounts are read (`None`: not checked, tests and dev only).
    pub fn new(
        max_age: Duration,
        denylist: Arc<Denylist>,
        accounts: Option<Arc<dyn PodDirectory>>,
    ) -> Self {
        RenewalRules {
            max_age,
            denylist,
            accounts: accounts.map(AccountCache::new),
        }
    }

    /// Whether the certificate with `serial` (lowercase hex), identity `spiffe_id` of
    /// `namespace/name`, and renewal chain `chain` may renew at `now`; on success the chain
    /// with its cap (the latest notAfter of the renewal) and the account's UID.
    pub async fn check(
        &self,
        serial: &str,
        spiffe_id: &str,
        (namespace, name): (&str, &str),
        mut chain: RenewalChain,
        now: OffsetDateTime,
    ) -> Result<RenewalChain, CheckError> {
        self.denylist.check(serial, spiffe_id)?;
        let max = time::Duration::try_from(self.max_age).unwrap_or(time::Duration::DAY);
        let cap = chain.origin + max;
        if cap <= now {
            return Err(RenewalRefusal::ChainTooOld {
                origin: chain.origin,
                max: self.max_age,
            }
            .into());
        }
        chain.cap = Some(cap);
        if let Some(accounts) = &self.accounts {
            match accounts.uid(namespace, name).await? {
                None => {
                    return Err(RenewalRefusal::AccountGone {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                    }
                    .into());
                }
                Some(uid) => match &chain.service_account_uid {
                    Some(carried) if *carried != uid => {
                        return Err(RenewalRefusal::AccountReplaced {
                            namespace: namespace.to_owned(),
                            name: name.to_owned(),
                        }
                        .into());
                    }
                    Some(_) => {}
                    // A chain that began without a UID (a PodCertificateRequest's leaf) is
                    // bound to the account that exists now.
                    None => chain.service_account_uid = Some(uid),
                },
            }
        }
        Ok(chain)
    }
}

/// A refusal, or the API server could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Refused(#[from] RenewalRefusal),
    #[error("cannot check the service account now: {0}")]
    Unavailable(#[from] LookupError),
}

/// `(namespace, name)` → when read, and the UID (`None`: no such account).
type AccountEntries = HashMap<(String, String), (Instant, Option<String>)>;

/// Service-account UIDs, cached for at most [`ACCOUNT_CACHE_TTL`].
struct AccountCache {
    directory: Arc<dyn PodDirectory>,
    entries: Mutex<AccountEntries>,
}

impl AccountCache {
    fn new(directory: Arc<dyn PodDirectory>) -> Self {
        AccountCache {
            directory,
            entries: Mutex::new(HashMap::new()),
        }
    }

    async fn uid(&self, namespace: &str, name: &str) -> Result<Option<String>, LookupError> {
        let key = (namespace.to_owned(), name.to_owned());
        let now = Instant::now();
        if let Some((at, uid)) = self.lock().get(&key)
            && now.duration_since(*at) < ACCOUNT_CACHE_TTL
        {
            return Ok(uid.clone());
        }
        let uid = self.directory.service_account_uid(namespace, name).await?;
        let mut entries = self.lock();
        if entries.len() >= ACCOUNT_CACHE_MAX {
            entries.retain(|_, (at, _)| now.duration_since(*at) < ACCOUNT_CACHE_TTL);
            if entries.len() >= ACCOUNT_CACHE_MAX {
                entries.clear();
            }
        }
        entries.insert(key, (now, uid.clone()));
        Ok(uid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AccountEntries> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The serials and identities that may not renew (see the module docs).
pub struct Denylist {
    path: Option<PathBuf>,
    entries: RwLock<Arc<DenyEntries>>,
}

impl fmt::Debug for Denylist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries = self.current();
        f.debug_struct("Denylist")
            .field("path", &self.path)
            .field("serials", &entries.serials.len())
            .field("identities", &entries.identities.len())
            .finish()
    }
}

/// One parsed denylist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DenyEntries {
    /// Lowercase hex without leading zeros or separators.
    pub serials: HashSet<String>,
    pub identities: HashSet<String>,
}

/// A denylist line that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}, line {line}: {problem}")]
pub struct DenylistError {
    pub path: String,
    pub line: usize,
    pub problem: String,
}

/// A serial as the denylist keeps it: lowercase hex, no `:` separators, no leading zeros.
pub fn normalize_serial(serial: &str) -> Option<String> {
    let hex: String = serial
        .trim()
        .trim_start_matches("0x")
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    if hex.is_empty() || hex.len() > 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let trimmed = hex.trim_start_matches('0');
    Some(if trimmed.is_empty() { "0" } else { trimmed }.to_owned())
}

impl DenyEntries {
    /// Parses the file format (see the module docs); `path` only names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self, DenylistError> {
        let mut entries = DenyEntries::default();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let error = |problem: String| DenylistError {
                path: path.to_owned(),
                line: index + 1,
                problem,
            };
            let (kind, value) = line
                .split_once(char::is_whitespace)
                .map(|(k, v)| (k, v.trim()))
                .ok_or_else(|| error("expected `serial <hex>` or `identity <SPIFFE ID>`".into()))?;
            match kind {
                "serial" => {
                    let serial = normalize_serial(value)
                        .ok_or_else(|| error(format!("{value:?} is not a hex serial number")))?;
                    entries.serials.insert(serial);
                }
                "identity" => {
                    value
                        .parse::<podca_signer::names::SpiffeId>()
                        .map_err(|e| {
                            error(format!("{value:?} is not a SPIFFE ID of podca's form: {e}"))
                        })?;
                    entries.identities.insert(value.to_owned());
                }
                other => {
                    return Err(error(format!(
                        "unknown entry kind {other:?}; expected `serial` or `identity`"
                    )));
                }
            }
        }
        Ok(entries)
    }

    /// The file text, sorted (what `podca renewal` writes).
    pub fn render(&self) -> String {
        let mut serials: Vec<&String> = self.serials.iter().collect();
        serials.sort();
        let mut identities: Vec<&String> = self.identities.iter().collect();
        identities.sort();
        let mut out = String::from(
            "# podca mTLS renewal denylist: these certificates and identities renew with a token \
             only.\n",
        );
        for s in serials {
            out.push_str(&format!("serial {s}\n"));
        }
        for i in identities {
            out.push_str(&format!("identity {i}\n"));
        }
        out
    }
}

impl Denylist {
    /// No file: nothing denied.
    pub fn empty() -> Arc<Self> {
        Arc::new(Denylist {
            path: None,
            entries: RwLock::new(Arc::new(DenyEntries::default())),
        })
    }

    /// Loads `path`; a missing file is an empty list (it may be created later), one that does
    /// not parse stops the start.
    pub fn load(path: &Path) -> Result<Arc<Self>, DenylistError> {
        let entries = read(path)?.unwrap_or_default();
        Ok(Arc::new(Denylist {
            path: Some(path.to_owned()),
            entries: RwLock::new(Arc::new(entries)),
        }))
    }

    /// Entries given directly (tests).
    pub fn of(entries: DenyEntries) -> Arc<Self> {
        Arc::new(Denylist {
            path: None,
            entries: RwLock::new(Arc::new(entries)),
        })
    }

    pub fn current(&self) -> Arc<DenyEntries> {
        match self.entries.read() {
            Ok(e) => Arc::clone(&e),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn check(&self, serial: &str, spiffe_id: &str) -> Result<(), RenewalRefusal> {
        let entries = self.current();
        if let Some(serial) = normalize_serial(serial).filter(|s| entries.serials.contains(s)) {
            return Err(RenewalRefusal::DeniedSerial { serial });
        }
        if entries.identities.contains(spiffe_id) {
            return Err(RenewalRefusal::DeniedIdentity {
                identity: spiffe_id.to_owned(),
            });
        }
        Ok(())
    }

    /// Re-reads the file; `Ok(true)` when the entries changed.
    pub fn reload(&self) -> Result<bool, DenylistError> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        let entries = read(path)?.unwrap_or_default();
        let mut current = match self.entries.write() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        if **current == entries {
            return Ok(false);
        }
        *current = Arc::new(entries);
        Ok(true)
    }

    /// Re-reads the file every [`DENYLIST_RELOAD`] until `stop`; a file that does not parse
    /// leaves the previous entries in force (logged once per change).
    pub async fn follow(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut last_error = None;
        loop {
            tokio::select! {
                () = tokio::time::sleep(DENYLIST_RELOAD) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            match self.reload() {
                Ok(true) => {
                    last_error = None;
                    let e = self.current();
                    info!(
                        serials = e.serials.len(),
                        identities = e.identities.len(),
                        "gRPC: renewal denylist reloaded"
                    );
                }
                Ok(false) => last_error = None,
                Err(e) if last_error.as_ref() != Some(&e) => {
                    warn!(error = %e, "gRPC: the renewal denylist does not parse; the previous one stays in force");
                    last_error = Some(e);
                }
                Err(_) => {}
            }
        }
    }
}

/// What `podca renewal` changes in a denylist.
#[derive(Debug, Clone, Default)]
pub struct DenylistEdit {
    pub deny_serials: Vec<String>,
    pub deny_identities: Vec<String>,
    pub allow_serials: Vec<String>,
    pub allow_identities: Vec<String>,
}

impl DenyEntries {
    /// Applies `edit`: every value is checked as the file format checks it.
    pub fn apply(&mut self, edit: &DenylistEdit) -> Result<(), DenylistError> {
        let mut lines = String::new();
        for s in edit.deny_serials.iter().chain(&edit.allow_serials) {
            lines.push_str(&format!("serial {s}\n"));
        }
        for i in edit.deny_identities.iter().chain(&edit.allow_identities) {
            lines.push_str(&format!("identity {i}\n"));
        }
        // The same checks as the file's, each value named in the error.
        DenyEntries::parse(&lines, "the command line")?;
        let serial = |s: &String| normalize_serial(s).unwrap_or_default();
        self.serials.extend(edit.deny_serials.iter().map(serial));
        self.identities.extend(edit.deny_identities.iter().cloned());
        for s in &edit.allow_serials {
            self.serials.remove(&serial(s));
        }
        for i in &edit.allow_identities {
            self.identities.remove(i);
        }
        Ok(())
    }
}

/// Reads the denylist at `path` (missing: empty), applies `edit` and, when it changed
/// anything, writes it back atomically (a temporary file renamed over it, so podca never
/// reads half a list). Returns the list now in the file.
pub fn edit_file(path: &Path, edit: &DenylistEdit) -> Result<DenyEntries, DenylistError> {
    let mut entries = read(path)?.unwrap_or_default();
    let before = entries.clone();
    entries.apply(edit)?;
    if entries != before || !path.exists() {
        let failed = |e: std::io::Error| DenylistError {
            path: path.display().to_string(),
            line: 0,
            problem: format!("writing it: {e}"),
        };
        let mut temp_name = path.as_os_str().to_owned();
        temp_name.push(format!(".{}.tmp", std::process::id()));
        let temp = PathBuf::from(temp_name);
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)?;
            std::io::Write::write_all(&mut file, entries.render().as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temp, path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(failed(e));
        }
    }
    Ok(entries)
}

fn read(path: &Path) -> Result<Option<DenyEntries>, DenylistError> {
    let shown = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => DenyEntries::parse(&text, &shown).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DenylistError {
            path: shown,
            line: 0,
            problem: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::auth::{NamedPod, PodInfo};
    use time::macros::datetime;

    #[derive(Debug, Default)]
    struct Accounts {
        uids: Mutex<HashMap<String, String>>,
        reads: std::sync::atomic::AtomicUsize,
    }

    #[tonic::async_trait]
    impl PodDirectory for Accounts {
        async fn pod(&self, _: &str, _: &str) -> Result<Option<PodInfo>, LookupError> {
            Ok(None)
        }
        async fn pods_on_node(
            &self,
            _: &str,
            _: &str,
            _: &str,
        ) -> Result<Vec<NamedPod>, LookupError> {
            Ok(vec![])
        }
        async fn service_account_uid(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<String>, LookupError> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(self
                .uids
                .lock()
                .unwrap()
                .get(&format!("{namespace}/{name}"))
                .cloned())
        }
    }

    const NOW: OffsetDateTime = datetime!(2026-12-06 12:00:00 UTC);
    const ID: &str = "spiffe://cluster.local/ns/shop/sa/web";

    fn rules(accounts: &Arc<Accounts>, denylist: Arc<Denylist>) -> RenewalRules {
        let directory: Arc<dyn PodDirectory> = Arc::clone(accounts) as _;
        RenewalRules::new(Duration::from_secs(24 * 3600), denylist, Some(directory))
    }

    /// Accounts where `shop/web` exists with `uid`.
    fn web_account(uid: &str) -> Arc<Accounts> {
        let accounts = Arc::new(Accounts::default());
        accounts.set("shop/web", Some(uid));
        accounts
    }

    impl Accounts {
        fn set(&self, key: &str, uid: Option<&str>) {
            let mut uids = self.uids.lock().unwrap();
            match uid {
                Some(uid) => uids.insert(key.into(), uid.into()),
                None => uids.remove(key),
            };
        }
    }

    /// Checks a certificate of `id` (`account`) with `serial` and `chain` at NOW.
    async fn check(
        rules: &RenewalRules,
        (serial, id, account): (&str, &str, (&str, &str)),
        chain: RenewalChain,
    ) -> Result<RenewalChain, CheckError> {
        rules.check(serial, id, account, chain, NOW).await
    }

    /// The refusal a check must give.
    async fn refusal(
        rules: &RenewalRules,
        cert: (&str, &str, (&str, &str)),
        chain: RenewalChain,
    ) -> RenewalRefusal {
        match check(rules, cert, chain).await {
            Err(CheckError::Refused(refusal)) => refusal,
            other => panic!("not a refusal: {other:?}"),
        }
    }

    const WEB: (&str, &str, (&str, &str)) = ("0a", ID, ("shop", "web"));

    #[tokio::test]
    async fn a_chain_renews_until_its_bound_then_needs_a_token() {
        let rules = rules(&web_account("uid-1"), Denylist::empty());
        let young = RenewalChain::starting(NOW - time::Duration::hours(23), Some("uid-1".into()));
        let checked = check(&rules, WEB, young).await.unwrap();
        assert_eq!(checked.cap, Some(NOW + time::Duration::hours(1)));
        let old = RenewalChain::starting(NOW - time::Duration::hours(24), Some("uid-1".into()));
        let refused = refusal(&rules, WEB, old).await;
        assert!(
            matches!(refused, RenewalRefusal::ChainTooOld { .. }),
            "{refused}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_or_recreated_account_stops_renewing_within_the_cache_ttl() {
        let accounts = web_account("uid-1");
        let rules = rules(&accounts, Denylist::empty());
        let chain = || RenewalChain::starting(NOW - time::Duration::hours(1), Some("uid-1".into()));
        check(&rules, WEB, chain()).await.unwrap();
        // Re-created under the same name: another UID, seen once the cache entry is stale.
        accounts.set("shop/web", Some("uid-2"));
        check(&rules, WEB, chain()).await.unwrap();
        tokio::time::advance(ACCOUNT_CACHE_TTL).await;
        let replaced = refusal(&rules, WEB, chain()).await;
        assert!(
            matches!(replaced, RenewalRefusal::AccountReplaced { .. }),
            "{replaced}"
        );
        accounts.set("shop/web", None);
        tokio::time::advance(ACCOUNT_CACHE_TTL).await;
        let gone = refusal(&rules, WEB, chain()).await;
        assert!(matches!(gone, RenewalRefusal::AccountGone { .. }), "{gone}");
        assert_eq!(accounts.reads.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn listed_serials_and_identities_do_not_renew() {
        let entries = DenyEntries::parse(
            "# incident 42\nserial 00:0A:ff\nidentity spiffe://cluster.local/ns/shop/sa/db\n",
            "test",
        )
        .unwrap();
        let rules = rules(&web_account("uid-1"), Denylist::of(entries));
        let chain = || RenewalChain::starting(NOW, None);
        let serial = refusal(&rules, ("aff", ID, ("shop", "web")), chain()).await;
        assert!(
            matches!(serial, RenewalRefusal::DeniedSerial { .. }),
            "{serial}"
        );
        let db = "spiffe://cluster.local/ns/shop/sa/db";
        let identity = refusal(&rules, ("0b", db, ("shop", "db")), chain()).await;
        assert!(
            matches!(identity, RenewalRefusal::DeniedIdentity { .. }),
            "{identity}"
        );
        // Neither listed: renews, bound to the account's UID.
        let ok = check(&rules, ("0b", ID, ("shop", "web")), chain())
            .await
            .unwrap();
        assert_eq!(ok.service_account_uid.as_deref(), Some("uid-1"));
    }

    #[test]
    fn the_file_format_is_strict_and_round_trips() {
        for (bad, problem) in [
            ("serial xyz", "not a hex serial"),
            ("identity https://example.com", "not a SPIFFE ID"),
            ("revoke 0a", "unknown entry kind"),
            ("serial", "expected `serial <hex>`"),
        ] {
            let e = DenyEntries::parse(&format!("\n{bad}\n"), "deny.txt").unwrap_err();
            assert_eq!(e.line, 2, "{bad}");
            assert!(e.to_string().contains(problem), "{bad}: {e}");
        }
        let entries =
            DenyEntries::parse("serial 0A\nidentity spiffe://td/ns/a/sa/b\n", "x").unwrap();
        assert_eq!(DenyEntries::parse(&entries.render(), "x").unwrap(), entries);
    }

    #[test]
    fn the_command_line_edit_adds_removes_and_refuses_bad_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("denylist");
        let deny = DenylistEdit {
            deny_serials: vec!["0A:FF".into()],
            deny_identities: vec![ID.into()],
            ..Default::default()
        };
        let entries = edit_file(&path, &deny).unwrap();
        assert!(entries.serials.contains("aff") && entries.identities.contains(ID));
        assert_eq!(Denylist::load(&path).unwrap().current().as_ref(), &entries);
        let allow = DenylistEdit {
            allow_serials: vec!["0aff".into()],
            ..Default::default()
        };
        let entries = edit_file(&path, &allow).unwrap();
        assert!(entries.serials.is_empty() && entries.identities.contains(ID));
        let bad = DenylistEdit {
            deny_serials: vec!["not-hex".into()],
            ..Default::default()
        };
        let e = edit_file(&path, &bad).unwrap_err();
        assert!(
            e.to_string().contains("\"not-hex\" is not a hex serial"),
            "{e}"
        );
        assert_eq!(
            Denylist::load(&path).unwrap().current().as_ref(),
            &entries,
            "unchanged"
        );
    }

    #[test]
    fn a_changed_file_is_reloaded_and_a_broken_one_keeps_the_last_good_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("denylist");
        let list = Denylist::load(&path).unwrap();
        assert!(list.current().serials.is_empty());
        std::fs::write(&path, "serial 0b\n").unwrap();
        assert!(list.reload().unwrap());
        assert!(list.check("0B", ID).is_err());
        std::fs::write(&path, "serial zz\n").unwrap();
        assert!(list.reload().is_err());
        assert!(
            list.check("0b", ID).is_err(),
            "the last good list stays in force"
        );
    }
}
