//! The history's seal: the history ConfigMap is authenticated by the CA that the Secret holds,
//! and checked for impossible values, before podca uses a byte of it.
//!
//! Why a signature by the Secret's key, verified against the Secret's certificates: the Secret
//! is the authority (podca trusts nothing it did not read from it), the ConfigMap only adds
//! history, and whoever can write ConfigMaps in podca's namespace cannot read that key. The
//! signature is made with the key the Secret holds *now* (not the active CA's, which during a
//! rotation is the previous Secret's), so that every replica, having read the same Secret, can
//! verify it; and through [`CaKey::sign`] of the key itself, so it works for every key type the
//! Secret may hold. A MAC keyed from the key would need the private key bytes, which podca's key
//! abstraction deliberately never hands out.
//!
//! What is signed is the exact `history.json` text as stored (no canonical re-encoding to get
//! wrong), behind a domain-separation prefix, the Secret it belongs to, a sequence number and
//! the hold (see below), one per line; none of them can hold a newline, and the text comes last.
//!
//! The signer is vouched for by the Secret when its certificate is one of the Secret's (issuing,
//! intermediate or anchor), or is signed by one of them: a history written before cert-manager
//! re-issued the intermediate under the same root still verifies after a restart. A history
//! written under a Secret that shares no certificate with today's cannot be verified and is
//! rejected (see `docs/ca.md`, "CA history integrity").
//!
//! Replays: the sequence grows with every write; a replica rejects a sequence lower than one it
//! verified already. Across a restart an older genuine history cannot be told from the newest,
//! but it can only hold podca's own past values: the planner then takes again the steps taken
//! since (with the recorded times, so activation and dropping happen when they were due), or
//! records the Secret's CA as new — never earlier signing nor an anchor podca did not publish.
//! A handover such a history shows was due long ago is taken with the times it was due at, so a
//! dropped root is not published again (`rules::overdue_handover`). What is sealed lists
//! only live generations (prepared, active, retired): a dropped one leaves the history, which
//! stays as small as the rotations one leaf lifetime spans; one in a history of an earlier
//! version verifies as before and is left out from then on.

use podca_signer::rotation::Phase;
use podca_signer::{BackendError, CaAlgorithm, CaCertificate, IssuingCa};
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use super::contents::SecretCaContents;
use super::{Checked, History};

/// The only seal version podca writes and reads.
const VERSION: u32 = 1;
/// Separates these signatures from anything else the CA key signs.
const DOMAIN: &str = "podca CA history seal v1";
/// How far a recorded event may lie in the future of this replica's clock (clock skew between
/// replicas) before the history counts as impossible.
pub const MAX_CLOCK_SKEW: Duration = Duration::minutes(5);

/// A history as podca stores it: `history.json` and its seal, both text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub history_json: String,
    pub seal_json: String,
}

/// A history that verified: its generations, its sequence number and the hold it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub recorded: Vec<Checked>,
    pub sequence: u64,
    /// Nothing signs before this instant (see [`super::SecretRotation::distrust_history`]).
    pub hold_until: Option<OffsetDateTime>,
    /// The subject of the certificate whose key made the seal.
    pub signer: String,
}

/// Why a history is not used. Each maps to one `reason` label of
/// `podca_ca_history_rejected_total` ([`Rejection::reason`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    #[error("history.json carries no seal (written by someone else, or by podca before 0.x)")]
    Unsigned,
    #[error("the seal is not readable: {detail}")]
    SealUnreadable { detail: String },
    #[error("sealed by {subject:?}, a CA the Secret does not vouch for")]
    UnknownSigner { subject: String },
    #[error("the seal's signature does not verify over this history")]
    BadSignature,
    #[error("history.json is not readable: {detail}")]
    Unreadable { detail: String },
    #[error("records the CA of Secret {recorded}, not {configured}")]
    OtherSecret {
        recorded: String,
        configured: String,
    },
    #[error("impossible values: {detail}")]
    Impossible { detail: String },
    #[error("sequence {found} is older than sequence {seen}, verified already (a replay)")]
    Replayed { found: u64, seen: u64 },
    #[error(
        "the ConfigMap does not carry the label app.kubernetes.io/managed-by=podca (someone else \
         wrote it)"
    )]
    NotOwned,
    #[error(
        "the ConfigMap is gone, but podca's copy on its ClusterTrustBundle shows a history \
         (sequence {sequence}) was written"
    )]
    Missing { sequence: u64 },
}

impl Rejection {
    /// The metric label: low cardinality, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::Unsigned => "unsigned",
            Rejection::SealUnreadable { .. } => "seal_unreadable",
            Rejection::UnknownSigner { .. } => "unknown_signer",
            Rejection::BadSignature => "bad_signature",
            Rejection::Unreadable { .. } => "unreadable",
            Rejection::OtherSecret { .. } => "other_secret",
            Rejection::Impossible { .. } => "impossible_values",
            Rejection::Replayed { .. } => "replayed",
            Rejection::NotOwned => "not_owned",
            Rejection::Missing { .. } => "missing",
        }
    }
}

/// Why a history could not be sealed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    #[error("history.json cannot be encoded: {0}")]
    Encode(String),
    #[error("the Secret's key cannot sign the history: {0}")]
    Sign(BackendError),
}

/// The seal as stored.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Seal {
    version: u32,
    sequence: u64,
    #[serde(default, with = "time::serde::rfc3339::option")]
    hold_until: Option<OffsetDateTime>,
    /// The signing certificate, PEM.
    signer: String,
    /// The signature algorithm ([`CaAlgorithm`]'s name).
    algorithm: String,
    /// The signature, hex.
    signature: String,
}

/// Encodes `history` and signs it with the key of `by` (the Secret's CA).
pub(super) fn seal(
    history: &History,
    sequence: u64,
    hold_until: Option<OffsetDateTime>,
    by: &SecretCaContents,
) -> Result<Sealed, SealError> {
    let history_json =
        serde_json::to_string_pretty(history).map_err(|e| SealError::Encode(e.to_string()))?;
    let message = message(&history.secret, sequence, hold_until, &history_json);
    let signature = by
        .sign_ungated(message.as_bytes())
        .map_err(SealError::Sign)?;
    let seal = Seal {
        version: VERSION,
        sequence,
        hold_until,
        signer: by.ca().certificate().pem(),
        algorithm: by.ca().key().algorithm().to_string(),
        signature: hex::encode(signature),
    };
    let seal_json = serde_json::to_string(&seal).map_err(|e| SealError::Encode(e.to_string()))?;
    Ok(Sealed {
        history_json,
        seal_json,
    })
}

/// Verifies and checks a stored history of Secret `secret` against the CA the Secret holds:
/// the seal (present, readable, by a CA the Secret vouches for, over this text), the text (the
/// history of this Secret, anchors that parse), no replay of a sequence below `seen`, and no
/// impossible value at `now` (a hold longer than one propagation window is one).
pub fn open(
    history_json: &str,
    seal_json: Option<&str>,
    secret: &str,
    authority: &IssuingCa,
    seen: Option<u64>,
    propagation: Duration,
    now: OffsetDateTime,
) -> Result<Opened, Rejection> {
    let known = vouching(authority);
    open_with(
        history_json,
        seal_json,
        secret,
        &known,
        seen,
        propagation,
        now,
    )
}

/// The certificates of `ca` that vouch for a seal's signer: the issuing one, its intermediates
/// and its anchors.
pub(super) fn vouching(ca: &IssuingCa) -> Vec<CaCertificate> {
    std::iter::once(ca.certificate())
        .chain(ca.chain())
        .chain(ca.roots())
        .cloned()
        .collect()
}

/// [`open`] with the vouching certificates given: a running replica adds those of the live
/// generations it trusts already, so that a history the leader sealed with the previous
/// Secret's key still verifies after this replica read the new Secret; `podca ca show
/// --secret` gives the certificates of the Secret (`tls.crt` and `ca.crt`) without its key.
pub fn open_with(
    history_json: &str,
    seal_json: Option<&str>,
    secret: &str,
    known: &[CaCertificate],
    seen: Option<u64>,
    propagation: Duration,
    now: OffsetDateTime,
) -> Result<Opened, Rejection> {
    let seal_json = seal_json.ok_or(Rejection::Unsigned)?;
    let seal: Seal = serde_json::from_str(seal_json).map_err(|e| Rejection::SealUnreadable {
        detail: e.to_string(),
    })?;
    let unreadable = |detail: String| Rejection::SealUnreadable { detail };
    if seal.version != VERSION {
        return Err(unreadable(format!(
            "version {} is not {VERSION}",
            seal.version
        )));
    }
    let signer = match CaCertificate::all_from_pem(&seal.signer) {
        Ok(certs) if certs.len() == 1 => certs.into_iter().next(),
        Ok(certs) => return Err(unreadable(format!("{} signer certificates", certs.len()))),
        Err(e) => return Err(unreadable(format!("signer: {e}"))),
    }
    .ok_or_else(|| unreadable("no signer certificate".into()))?;
    let algorithm: CaAlgorithm = seal
        .algorithm
        .parse()
        .map_err(|e: podca_signer::spelling::UnknownName| unreadable(format!("algorithm: {e}")))?;
    let signature =
        hex::decode(&seal.signature).map_err(|e| unreadable(format!("signature: {e}")))?;
    if !vouched(&signer, known) {
        return Err(Rejection::UnknownSigner {
            subject: signer.subject().to_owned(),
        });
    }
    let message = message(secret, seal.sequence, seal.hold_until, history_json);
    podca_signer::x509::verify_signature(
        signer.spki_der(),
        signature_oid(algorithm),
        message.as_bytes(),
        &signature,
    )
    .map_err(|_| Rejection::BadSignature)?;
    // From here on the text is podca's own: what fails now is a bug or a clock far off, still
    // never a reason to crash or to use the values.
    if let Some(seen) = seen
        && seal.sequence < seen
    {
        return Err(Rejection::Replayed {
            found: seal.sequence,
            seen,
        });
    }
    let history: History =
        serde_json::from_str(history_json).map_err(|e| Rejection::Unreadable {
            detail: e.to_string(),
        })?;
    if history.secret != secret {
        return Err(Rejection::OtherSecret {
            recorded: history.secret,
            configured: secret.to_owned(),
        });
    }
    let recorded = check_values(history, now)?;
    if let Some(hold) = seal.hold_until
        && hold
            > now
                .saturating_add(MAX_CLOCK_SKEW)
                .saturating_add(propagation)
    {
        return Err(Rejection::Impossible {
            detail: format!("hold until {hold} lies in the future"),
        });
    }
    Ok(Opened {
        recorded,
        sequence: seal.sequence,
        hold_until: seal.hold_until,
        signer: signer.subject().to_owned(),
    })
}

/// The signed bytes: one field a line, the history text last.
fn message(
    secret: &str,
    sequence: u64,
    hold_until: Option<OffsetDateTime>,
    history_json: &str,
) -> String {
    let hold = hold_until.map_or_else(|| "-".to_owned(), |t| t.unix_timestamp().to_string());
    format!("{DOMAIN}\nsecret={secret}\nsequence={sequence}\nhold_until={hold}\n{history_json}")
}

/// Whether `known` vouches for `signer`: it is one of them, or one of them signed it.
fn vouched(signer: &CaCertificate, known: &[CaCertificate]) -> bool {
    signer.is_ca()
        && (known.contains(signer)
            || known
                .iter()
                .any(|c| c.subject() == signer.issuer() && signer.verify_signed_by(c).is_ok()))
}

/// The X.509 signature algorithm OID of what [`podca_signer::CaKey::sign`] returns.
fn signature_oid(algorithm: CaAlgorithm) -> &'static str {
    algorithm.signature_oid()
}

/// Parses each record's anchors and refuses values no podca can have written: times in the
/// future, phases that contradict their times, a fingerprint or validity that is not the
/// recorded certificate's, duplicate ids, more than one active or prepared generation. Every
/// time the state machine later adds to is then bounded, so no arithmetic can overflow.
fn check_values(history: History, now: OffsetDateTime) -> Result<Vec<Checked>, Rejection> {
    let latest_event = now.saturating_add(MAX_CLOCK_SKEW);
    let mut ids = std::collections::HashSet::new();
    let (mut active, mut prepared) = (0, 0);
    let mut checked = Vec::with_capacity(history.generations.len());
    for record in history.generations {
        let g = &record.generation;
        let id = g.id;
        let bad = |what: String| Rejection::Impossible {
            detail: format!("generation {id}: {what}"),
        };
        // A million rotations would take millennia; larger ids could only overflow.
        if id == 0 || id > 1_000_000 || !ids.insert(id) {
            return Err(bad("id zero, too large or recorded twice".into()));
        }
        match g.phase {
            Phase::Active => active += 1,
            Phase::Prepared => prepared += 1,
            Phase::Retired | Phase::Dropped => {}
        }
        let issuing = CaCertificate::all_from_pem(&record.chain_pem)
            .map_err(|e| bad(format!("chain: {e}")))?
            .into_iter()
            .next()
            .ok_or_else(|| bad("no issuing certificate".into()))?;
        if issuing.fingerprint() != record.fingerprint {
            return Err(bad("fingerprint is not the recorded certificate's".into()));
        }
        if g.ca_not_before != issuing.not_before()
            || g.ca_not_after > issuing.not_after()
            || g.ca_not_after < g.ca_not_before
        {
            return Err(bad("validity is not the recorded certificate's".into()));
        }
        for (name, t) in [
            ("prepared_at", Some(g.prepared_at)),
            ("activated_at", g.activated_at),
            ("retired_at", g.retired_at),
        ] {
            if let Some(t) = t
                && (t > latest_event || t < OffsetDateTime::UNIX_EPOCH)
            {
                return Err(bad(format!("{name} {t} is not a past instant")));
            }
        }
        let consistent = match g.phase {
            Phase::Prepared => g.activated_at.is_none() && g.retired_at.is_none(),
            Phase::Active => g.activated_at.is_some() && g.retired_at.is_none(),
            Phase::Retired | Phase::Dropped => g.retired_at.is_some(),
        } && g.activated_at.is_none_or(|a| a >= g.prepared_at)
            && g.retired_at.is_none_or(|r| r >= g.prepared_at)
            && g.last_leaf_not_after.is_none_or(|l| l <= g.ca_not_after);
        if !consistent {
            return Err(bad(format!("{} contradicts its recorded times", g.phase)));
        }
        let generation = id;
        checked.push(Checked::new(record).map_err(|e| Rejection::Impossible {
            detail: format!("generation {generation}: anchors: {e}"),
        })?);
    }
    if active > 1 || prepared > 1 {
        return Err(Rejection::Impossible {
            detail: format!(
                "{active} active and {prepared} prepared generations (at most one each)"
            ),
        });
    }
    Ok(checked)
}
