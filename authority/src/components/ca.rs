//! The CA component: where the CA comes from and how it is driven, decided once.
//!
//! [`plan`] reads `[ca]`: a data directory (file or PKCS#11 keys) is opened here, so a wrong
//! PIN, a missing token or a broken directory is a start-up error rather than a stream of
//! pending requests; a Secret is left to `podca_controller::secret_ca::component`, which opens
//! it once the Kubernetes API is reachable. [`DirectoryCa::start`] spawns the rotation driver:
//! it runs the `[rotation]` schedule itself only when the configuration asks for it, the
//! directory is writable, and replicas do not share it (`--leader-elect`); it always follows
//! other writers' changes (`podca ca rotate`) within [`POLL`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use podca_signer::rotation::ScheduleError;
use podca_signer::{FileStore, InitOptions, StoreError};
use time::OffsetDateTime;
use tracing::info;

use crate::ca::{self, CaSource, OpenError};
use crate::config::{CaConfig, Config, DEFAULT_CA_NAME, FileCa, Pkcs11Ca, SecretCa, ca_name_of};
use crate::hsm_metrics::HsmMetrics;
use crate::rotation::{Rotator, RotatorOptions};
use crate::runtime::{Runtime, Stage};
use crate::trust::{CaHandle, CaSet};

/// How often the rotation driver looks at the data directory (other writers' changes).
pub const POLL: Duration = Duration::from_secs(5);

/// How long a driver on the async runtime waits for another writer of the data directory per
/// tick (a CLI command holding its lock); it retries at the next tick rather than block.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The CA could not be opened. Each message carries its cause (one line, as printed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaStartError {
    #[error("repairing the CA data directory {}: {error}", .dir.display())]
    Repair {
        dir: std::path::PathBuf,
        error: StoreError,
    },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("opening the CA: {0}")]
    Load(OpenError),
    #[error("[rotation] in the config file: {0}")]
    Schedule(ScheduleError),
    /// `podca dev` keeps its CA in its data directory (see [`in_data_dir`]).
    #[error("{0}")]
    NotInDataDir(String),
    #[error("creating a CA in {}: {error}", .dir.display())]
    Create { dir: PathBuf, error: StoreError },
    #[error(transparent)]
    UnknownCa(#[from] crate::trust::UnknownCa),
    #[error("splitting it off CA {from:?}: {error}")]
    Split { from: String, error: StoreError },
    /// One of several CAs could not be opened: which, and why.
    #[error("[cas.{ca}]: {error}")]
    InCa {
        ca: String,
        error: Box<CaStartError>,
    },
    /// A signer's trust domain is outside the CA's nameConstraints: it could issue nothing.
    #[error("signer {signer:?} cannot be served by this CA: {violation}")]
    SignerOutsideCa {
        signer: String,
        violation: podca_signer::constraints::NameViolation,
    },
}

/// Which signers each CA signs for, from the configuration: exported as
/// `podca_ca_signers{ca}`, with a warning at start for every CA that several signers share
/// (their trust domains are not apart: a certificate of one verifies under the others'
/// bundles). Kept working for compatibility; `podca doctor` reports it too.
#[derive(Debug, Clone, Default)]
pub struct Sharing {
    counts: Vec<(String, usize)>,
    warnings: Vec<String>,
}

impl Sharing {
    pub fn of(config: &Config) -> Self {
        Sharing {
            counts: config
                .signers_by_ca()
                .into_iter()
                .map(|(ca, signers)| (ca.to_owned(), signers.len()))
                .collect(),
            warnings: config.shared_ca_warnings(),
        }
    }

    /// Sets the gauge and logs the warnings.
    pub fn report(&self, rt: &Runtime) {
        for (ca, count) in &self.counts {
            rt.metrics()
                .ca_signers
                .get_or_create(&crate::metrics::CaNameLabels { ca: ca.clone() })
                .set(i64::try_from(*count).unwrap_or(i64::MAX));
        }
        for warning in &self.warnings {
            tracing::warn!("{warning}; give each signer its own CA");
        }
    }
}

/// Refuses to start a CA under whose nameConstraints some signer's trust domain falls outside:
/// every certificate of that signer would be refused (`IdentityNotPermittedByCA`), so it is a
/// start-up error instead.
pub fn check_signers<'a>(
    ca: &podca_signer::IssuingCa,
    signers: impl IntoIterator<Item = (&'a String, &'a podca_signer::SignerPolicy)>,
) -> Result<(), CaStartError> {
    for (signer, policy) in signers {
        ca.check_trust_domain(&policy.trust_domain)
            .map_err(|violation| CaStartError::SignerOutsideCa {
                signer: signer.clone(),
                violation,
            })?;
    }
    Ok(())
}

impl From<ScheduleError> for CaStartError {
    fn from(error: ScheduleError) -> Self {
        CaStartError::Schedule(error)
    }
}

/// Where the CA comes from, decided by [`plan`].
#[derive(Debug)]
pub enum CaPlan {
    /// A data directory, opened.
    Directory(DirectoryCa),
    /// A `kubernetes.io/tls` Secret, opened through the API by the controller crate.
    Secret(SecretCa),
}

/// A CA data directory, opened: its active CA and how its driver runs.
pub struct DirectoryCa {
    handle: CaHandle,
    rotator: RotatorOptions,
    hsm: Option<crate::ca::HsmKeySlot>,
}

impl std::fmt::Debug for DirectoryCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectoryCa")
            .field("dir", &self.rotator.store.dir())
            .field("automatic", &self.rotator.automatic)
            .field("hsm", &self.hsm.is_some())
            .finish_non_exhaustive()
    }
}

/// A running directory CA: the handle every component reads, and the driver (`podca dev`
/// reloads through it on SIGHUP).
#[derive(Debug, Clone)]
pub struct RunningCa {
    pub handle: CaHandle,
    pub rotator: Arc<Rotator>,
}

/// Every CA the configuration uses ([`Config::cas_in_use`]), planned, and which signer signs
/// with which.
#[derive(Debug)]
pub struct CaPlans {
    /// CA name → where it comes from, in name order.
    pub cas: Vec<(String, CaPlan)>,
    /// Signer name → CA name.
    pub signers: BTreeMap<String, String>,
    /// (signer, tenant) → CA name.
    pub tenants: BTreeMap<(String, String), String>,
    /// The CA whose data directory also holds the JWT keys and the default ledger: that of the
    /// `[grpc] signer` (JWT-SVIDs are signed for its trust domain), else the first.
    pub primary: String,
    /// Which CAs several signers share (reported once, at start).
    pub sharing: Sharing,
}

impl CaPlans {
    /// The primary CA when it is a data directory.
    pub fn primary_dir(&self) -> Option<&DirectoryCa> {
        self.cas.iter().find_map(|(name, plan)| match plan {
            CaPlan::Directory(dir) if *name == self.primary => Some(dir),
            _ => None,
        })
    }

    /// The primary CA's table in `config`.
    pub fn primary_config<'c>(&self, config: &'c Config) -> &'c CaConfig {
        config.ca_named(&self.primary).unwrap_or(&config.ca)
    }

    /// Starts every CA, all data directories (`podca dev`: a Secret-held CA needs the
    /// Kubernetes API), and gives the set every component reads, with each CA's driver.
    pub fn start_directories(
        self,
        rt: &mut Runtime,
    ) -> Result<(CaSet, BTreeMap<String, RunningCa>), CaStartError> {
        let mut running = BTreeMap::new();
        for (name, plan) in self.cas {
            match plan {
                CaPlan::Directory(dir) => {
                    running.insert(name, dir.start(rt));
                }
                CaPlan::Secret(secret) => {
                    return Err(CaStartError::NotInDataDir(format!(
                        "CA {name:?} is held in the Secret {}/{}, read through the Kubernetes \
                         API, which this command does not use",
                        secret.namespace, secret.name
                    )));
                }
            }
        }
        self.sharing.report(rt);
        let handles = running
            .iter()
            .map(|(name, ca)| (name.clone(), ca.handle.clone()))
            .collect();
        let set = CaSet::new(handles, self.signers)?.with_tenants(self.tenants)?;
        Ok((set, running))
    }

    /// The primary CA when it is held in a Secret.
    pub fn primary_secret(&self) -> Option<&SecretCa> {
        self.cas.iter().find_map(|(name, plan)| match plan {
            CaPlan::Secret(secret) if *name == self.primary => Some(secret),
            _ => None,
        })
    }
}

/// Decides where each CA of `config` comes from and opens the data directories. `leader_elect`:
/// replicas share the CAs, so this process never rotates them on its own.
pub fn plan(config: &Config, leader_elect: bool) -> Result<CaPlans, CaStartError> {
    plan_at(config, leader_elect, OffsetDateTime::now_utc())
}

/// [`plan`] at `now` (a CA split off another is made and its rotation started at `now`).
pub fn plan_at(
    config: &Config,
    leader_elect: bool,
    now: OffsetDateTime,
) -> Result<CaPlans, CaStartError> {
    let in_use = config.cas_in_use();
    let several = in_use.len() > 1 || in_use.iter().any(|(name, _)| *name != DEFAULT_CA_NAME);
    let mut cas = Vec::with_capacity(in_use.len());
    for (name, ca) in in_use {
        let policies = config.policies_of_ca(name);
        let signers = policies.iter().map(|(what, policy)| (what, policy));
        let planned =
            plan_one(name, ca, signers, config, leader_elect, now).map_err(
                |error| match several {
                    true => CaStartError::InCa {
                        ca: name.to_owned(),
                        error: Box::new(error),
                    },
                    false => error,
                },
            )?;
        cas.push((name.to_owned(), planned));
    }
    let signers = config
        .signers
        .iter()
        .map(|(signer, policy)| (signer.clone(), ca_name_of(policy).to_owned()))
        .collect();
    let tenants = config
        .tenant_cas()
        .into_iter()
        .map(|(signer, tenant, ca)| ((signer.to_owned(), tenant.to_owned()), ca.to_owned()))
        .collect();
    Ok(CaPlans {
        primary: primary_ca(config).to_owned(),
        cas,
        signers,
        tenants,
        sharing: Sharing::of(config),
    })
}

/// Makes the CA `name` in `dir` split off the CA `from` ([`FileStore::split_from`]) when `dir`
/// holds no CA yet: its signers keep the shared CA's certificates and anchors until their own
/// key takes over after the propagation window, with overlap, as every rotation.
fn split_if_new(
    name: &str,
    dir: &Path,
    from: &str,
    config: &Config,
    now: OffsetDateTime,
) -> Result<(), CaStartError> {
    let target = FileStore::new(dir);
    if target.is_initialised() {
        return Ok(());
    }
    let source_dir = config
        .ca_dir(from)
        .map_err(|e| CaStartError::NotInDataDir(e.to_string()))?;
    let steps = target
        .split_from(
            &FileStore::new(source_dir),
            name,
            &config.rotation,
            config.max_leaf_lifetime(),
            now,
        )
        .map_err(|error| CaStartError::Split {
            from: from.to_owned(),
            error,
        })?;
    info!(
        ca = name,
        from,
        dir = %dir.display(),
        ?steps,
        signs_from = %(now + config.rotation.propagation()),
        "CA split off a shared one: it signs as before until its own key, published now, takes \
         over after the propagation window"
    );
    Ok(())
}

/// The CA of the `[grpc] signer` when there is one, else the first CA in use.
pub fn primary_ca(config: &Config) -> &str {
    config
        .grpc_signer()
        .ok()
        .and_then(|(signer, _)| config.ca_of_signer(signer))
        .or_else(|| config.cas_in_use().first().map(|(name, _)| *name))
        .unwrap_or(DEFAULT_CA_NAME)
}

/// Plans the CA `name` for `signers`.
fn plan_one<'a>(
    name: &str,
    ca: &CaConfig,
    signers: impl IntoIterator<Item = (&'a String, &'a podca_signer::SignerPolicy)>,
    config: &Config,
    leader_elect: bool,
    now: OffsetDateTime,
) -> Result<CaPlan, CaStartError> {
    if let CaConfig::Secret(secret) = ca {
        config.rotation.validate()?;
        return Ok(CaPlan::Secret(secret.clone()));
    }
    let max_leaf_lifetime = config.max_leaf_lifetime();
    if let CaConfig::File(FileCa {
        dir: Some(dir),
        split_from: Some(from),
        ..
    }) = ca
    {
        split_if_new(name, dir, from, config, now)?;
    }
    let source = ca::open(ca, max_leaf_lifetime)?;
    let writable = dir_writable(source.store.dir());
    if writable {
        // A writer killed mid-change left the directory half-way: finish or roll back first
        // (under the directory's lock, which every writer shares).
        source
            .store
            .recover()
            .map_err(|error| CaStartError::Repair {
                dir: source.store.dir().to_owned(),
                error,
            })?;
    }
    let (active, anchors) = source.load().map_err(CaStartError::Load)?;
    check_signers(&active, signers)?;
    if config.is_tenant_ca(name) && !active.is_name_constrained() {
        tracing::warn!(
            ca = name,
            "this tenant CA carries no nameConstraints: its key can sign names of other tenants \
             that verifiers accept under its bundle (make it with `podca ca init --config … --ca \
             {name}`, which constrains it to the tenant's names)"
        );
    }
    let automatic = automatic_rotation(&source, leader_elect, writable);
    if automatic {
        config.rotation.validate()?;
    }
    let CaSource {
        store,
        open,
        hsm,
        intermediate,
        automatic_rotation: _,
    } = source;
    Ok(CaPlan::Directory(DirectoryCa {
        handle: CaHandle::new(active, anchors),
        rotator: RotatorOptions {
            name: name.to_owned(),
            store: store.with_lock_wait(LOCK_WAIT),
            schedule: config.rotation,
            automatic,
            max_leaf_lifetime,
            poll: POLL,
            open,
            refresh_when: intermediate,
        },
        hsm,
    }))
}

impl DirectoryCa {
    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.rotator.store.dir()
    }

    /// The data directory's redb ledger, for a `[ledger]` that names no path.
    pub fn ledger_path(&self) -> std::path::PathBuf {
        self.rotator.store.ledger_path()
    }

    /// The CA as opened, before its driver runs.
    pub fn handle(&self) -> &CaHandle {
        &self.handle
    }

    /// Spawns the rotation driver and (HSM) the `podca_hsm_*` exporter.
    pub fn start(self, rt: &mut Runtime) -> RunningCa {
        let DirectoryCa {
            handle,
            rotator,
            hsm,
        } = self;
        let in_memory_intermediate = rotator.refresh_when.is_some();
        let rotator = Arc::new(Rotator::new(
            rotator,
            handle.clone(),
            Arc::clone(rt.clock()),
            Arc::clone(rt.metrics()),
        ));
        let driver = Arc::clone(&rotator);
        rt.spawn(Stage::Support, "CA rotation driver", |stop| {
            driver.run(stop)
        });
        if in_memory_intermediate {
            // Each in-memory intermediate is a certificate podca signed: a ledger record.
            let (handle, ledger) = (handle.clone(), rt.ledger());
            rt.spawn(Stage::Support, "intermediate records", |stop| {
                record_intermediates(handle, ledger, stop)
            });
        }
        if let Some(slot) = hsm {
            let metrics = rt.metrics().register_component("hsm", HsmMetrics::register);
            rt.spawn(Stage::Support, "HSM metrics", |stop| {
                metrics.export(slot, stop)
            });
        }
        RunningCa { handle, rotator }
    }
}

/// Records every in-memory intermediate `handle` serves (source `intermediate`) until `stop`:
/// the one in force at start, then each re-issue. A record the ledger cannot take is retried
/// with the next change or after a minute.
async fn record_intermediates(
    handle: CaHandle,
    ledger: crate::ledger::LedgerHandle,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut snapshots = handle.subscribe();
    let mut recorded: Option<String> = None;
    loop {
        let snapshot = Arc::clone(&snapshots.borrow_and_update());
        let ca = &snapshot.ca;
        let fingerprint = ca.fingerprint().to_owned();
        let signer = ca.chain().get(1).or_else(|| ca.roots().first());
        if recorded.as_deref() != Some(fingerprint.as_str())
            && let Some(signer) = signer
        {
            let context = podca_signer::ledger::RecordContext {
                source: podca_signer::ledger::Source::Intermediate,
                signer: String::new(),
                identity: String::new(),
                requester: Some("podca".into()),
                namespace: String::new(),
                service_account: String::new(),
                pod_name: None,
                pod_uid: None,
                node_name: None,
                request_uid: None,
                request_name: None,
                ca_generation: snapshot.ca_generation.map(u64::from),
                issuer_fingerprint: None,
                auth: None,
                replica: podca_signer::ledger::replica_identity(),
                time: OffsetDateTime::now_utc(),
            };
            let record = podca_signer::ledger::LedgerRecord::ca_certificate(
                &context,
                ca.certificate(),
                &signer.fingerprint(),
            );
            match ledger.record(record).await {
                Ok(()) => recorded = Some(fingerprint.clone()),
                Err(e) => {
                    tracing::error!(error = %e, "the ledger cannot record the in-memory intermediate; retrying")
                }
            }
        }
        let retry = recorded.as_deref() != Some(fingerprint.as_str());
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            changed = snapshots.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(std::time::Duration::from_secs(60)), if retry => {}
        }
    }
}

/// `podca dev`: every CA lives in the data directory: `[ca]` in it, `[cas.<name>]` in
/// `<data dir>/cas/<name>`; a missing file CA in use is made. Returns the names of the CAs
/// made.
pub fn place_in_data_dir(
    config: &mut Config,
    data_dir: &Path,
) -> Result<Vec<String>, CaStartError> {
    config.ca = in_data_dir(&config.ca, "[ca]", data_dir)?;
    for (name, ca) in config.cas.iter_mut() {
        *ca = in_data_dir(
            ca,
            &format!("[cas.{name}]"),
            &data_dir.join("cas").join(name),
        )?;
    }
    let mut made = vec![];
    for (name, ca) in config.cas_in_use() {
        let dir = ca.dir().unwrap_or(data_dir);
        let mut options = InitOptions {
            name: match name {
                DEFAULT_CA_NAME => "podca dev".to_owned(),
                other => format!("podca dev {other}"),
            },
            ..InitOptions::default()
        };
        // A tenant's CA permits only the tenant's names.
        if let Some(constraints) = config.init_constraints(name) {
            options.name_constraints = constraints
                .map_err(|e| CaStartError::NotInDataDir(format!("[cas.{name}]: {e}")))?;
        }
        if create_if_missing(ca, dir, &options)? {
            made.push(name.to_owned());
        }
    }
    Ok(made)
}

/// A CA table as `podca dev` uses it: the CA always lives at `dir` in the data directory (file
/// keys, or an HSM key recorded there); a Secret-held CA needs the Kubernetes API, which dev
/// does not use.
fn in_data_dir(ca: &CaConfig, table: &str, data_dir: &Path) -> Result<CaConfig, CaStartError> {
    let dir = |configured: &Option<PathBuf>| match configured {
        Some(d) if d != data_dir => Err(CaStartError::NotInDataDir(format!(
            "{table} dir = {} but podca dev keeps this CA in {}; drop {table} dir (or pass \
             --data-dir)",
            d.display(),
            data_dir.display(),
        ))),
        _ => Ok(Some(data_dir.to_owned())),
    };
    Ok(match ca {
        CaConfig::Secret(s) => {
            return Err(CaStartError::NotInDataDir(format!(
                "{table} backend = \"secret\" ({}/{}) is read through the Kubernetes API, which \
                 podca dev does not use; use backend = \"file\" (the default) or \"pkcs11\"",
                s.namespace, s.name
            )));
        }
        CaConfig::File(f) => CaConfig::File(FileCa {
            dir: dir(&f.dir)?,
            ..f.clone()
        }),
        CaConfig::Pkcs11(p) => CaConfig::Pkcs11(Pkcs11Ca {
            dir: dir(&p.dir)?,
            ..p.clone()
        }),
    })
}

/// Makes a file CA with `options` in `dir` on a first run; a CA whose key is in an HSM is made
/// with `podca ca init --pkcs11-uri` first. Returns whether it made one.
pub fn create_if_missing(
    ca: &CaConfig,
    dir: &Path,
    options: &InitOptions,
) -> Result<bool, CaStartError> {
    let store = FileStore::new(dir);
    let made_by_split = matches!(
        ca,
        CaConfig::File(FileCa {
            split_from: Some(_),
            ..
        })
    );
    if store.is_initialised() || !matches!(ca, CaConfig::File(_)) || made_by_split {
        return Ok(false);
    }
    store
        .init(options, OffsetDateTime::now_utc())
        .map_err(|error| CaStartError::Create {
            dir: dir.to_owned(),
            error,
        })?;
    Ok(true)
}

/// Whether the rotation driver takes scheduled steps: when the configuration asks for it,
/// unless replicas share the directory (`--leader-elect`) or it is read-only; either is logged.
fn automatic_rotation(source: &CaSource, leader_elect: bool, writable: bool) -> bool {
    let configured = source.automatic_rotation;
    if configured && leader_elect {
        // Replicas do not share a writable data directory: each would make its own CA.
        info!(
            "automatic CA rotation is off with --leader-elect; rotate with `podca ca \
             rotate` on the CA data directory (every replica follows the change without \
             a restart)"
        );
        return false;
    }
    if configured && !writable {
        info!(
            dir = %source.store.dir().display(),
            "the CA data directory is read-only: automatic CA rotation is off (changes \
             to it are still followed)"
        );
        return false;
    }
    configured
}

/// Whether podca may write the CA state in `dir` (a Secret mount is read-only).
pub fn dir_writable(dir: &Path) -> bool {
    let probe = dir.join(format!(".podca-write-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            true
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podca_signer::{FileStore, InitOptions, NameConstraints, SignerPolicy};

    /// A data directory whose CA permits only `spiffe://a.test` identities: a config with a
    /// signer of another trust domain does not start, and says which signer and why.
    #[test]
    fn a_signer_outside_the_cas_name_constraints_is_a_start_up_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path());
        let options = InitOptions {
            name_constraints: NameConstraints::new(&["a.test".to_owned()], &[]).unwrap(),
            ..InitOptions::default()
        };
        store
            .init(&options, time::OffsetDateTime::now_utc())
            .unwrap();
        let mut config = Config::parse(&format!(
            "[ca]\ndir = {:?}\nautomatic_rotation = false",
            dir.path()
        ))
        .unwrap();
        config
            .signers
            .insert("example.com/a".into(), SignerPolicy::permissive("a.test"));
        assert!(matches!(
            plan(&config, false).map(|p| p.cas.into_iter().next()),
            Ok(Some((_, CaPlan::Directory(_))))
        ));
        config
            .signers
            .insert("example.com/b".into(), SignerPolicy::permissive("b.test"));
        let refused = plan(&config, false).unwrap_err();
        assert!(
            refused.to_string().starts_with(
                "signer \"example.com/b\" cannot be served by this CA: the identity \
                 \"spiffe://b.test\" is outside the nameConstraints of the CA certificate"
            ),
            "{refused}"
        );
    }
}
