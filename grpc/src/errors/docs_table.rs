//! The docs' tables of refusals agree with the mapping above: `docs/grpc-api.md`'s "Refusals"
//! has one row per (`reason` label, code) pair [`ApiError`] can answer, and
//! `docs/troubleshooting.md`'s condition-reason table one row per [`DenyReason`] and
//! [`FailReason`] with its gRPC code. A new variant without a sample here fails to compile (the
//! exhaustive `match`es), and a new or changed pair fails until the docs say so.

use std::collections::{BTreeMap, BTreeSet};

use podca_signer::jwt::{JwtAlgorithm, JwtError};
use podca_signer::{BackendError, DenyReason, FailReason, KeyError};
use tonic::Code;

use super::{ApiError, deny_code, fail_code};
use crate::auth::{AuthError, LookupError};
use crate::renewal::RenewalRefusal;

/// One value of every `AuthError` variant; `auth_index` proves none is missing.
fn auth_samples() -> Vec<AuthError> {
    let lookup = || LookupError::Failed("boom".into());
    vec![
        AuthError::Missing,
        AuthError::Invalid("expired".into()),
        AuthError::UnknownCaller("uid 7".into()),
        AuthError::NotLoopback("10.0.0.1".into()),
        AuthError::Unavailable(lookup()),
        AuthError::Mismatch("a/b".into()),
        AuthError::Busy(8),
        AuthError::SourceBusy(2),
        AuthError::RenewalRefused(RenewalRefusal::Malformed("m".into())),
        AuthError::AccountUnavailable(lookup()),
    ]
}

fn auth_index(e: &AuthError) -> usize {
    match e {
        AuthError::Missing => 0,
        AuthError::Invalid(_) => 1,
        AuthError::UnknownCaller(_) => 2,
        AuthError::NotLoopback(_) => 3,
        AuthError::Unavailable(_) => 4,
        AuthError::Mismatch(_) => 5,
        AuthError::Busy(_) => 6,
        AuthError::SourceBusy(_) => 7,
        AuthError::RenewalRefused(_) => 8,
        AuthError::AccountUnavailable(_) => 9,
    }
}

/// One value of every `JwtError` variant (two of `Backend`: its code depends on whether the
/// backend's error is transient).
fn jwt_samples() -> Vec<JwtError> {
    vec![
        JwtError::TooLarge {
            len: 9000,
            max: 8192,
        },
        JwtError::Malformed("three parts"),
        JwtError::UnsupportedAlgorithm("HS256".into()),
        JwtError::BadType("x".into()),
        JwtError::MissingKeyId,
        JwtError::UnknownKeyId("k".into()),
        JwtError::AlgorithmMismatch {
            kid: "k".into(),
            alg: JwtAlgorithm::RS256,
        },
        JwtError::BadSignature,
        JwtError::MissingClaim("exp"),
        JwtError::BadSubject("s".into()),
        JwtError::NoAudience,
        JwtError::TooManyAudiences { count: 9, max: 8 },
        JwtError::BadAudience(String::new()),
        JwtError::WrongAudience {
            expected: "a".into(),
        },
        JwtError::Expired { exp: 1, now: 2 },
        JwtError::NotYetValid { nbf: 2, now: 1 },
        JwtError::UnusableKey("k".into()),
        JwtError::NoSigningKey,
        JwtError::Backend(BackendError::Unavailable("token gone".into())),
        JwtError::Backend(BackendError::InvalidKey("bad".into())),
    ]
}

fn jwt_index(e: &JwtError) -> usize {
    match e {
        JwtError::TooLarge { .. } => 0,
        JwtError::Malformed(_) => 1,
        JwtError::UnsupportedAlgorithm(_) => 2,
        JwtError::BadType(_) => 3,
        JwtError::MissingKeyId => 4,
        JwtError::UnknownKeyId(_) => 5,
        JwtError::AlgorithmMismatch { .. } => 6,
        JwtError::BadSignature => 7,
        JwtError::MissingClaim(_) => 8,
        JwtError::BadSubject(_) => 9,
        JwtError::NoAudience => 10,
        JwtError::TooManyAudiences { .. } => 11,
        JwtError::BadAudience(_) => 12,
        JwtError::WrongAudience { .. } => 13,
        JwtError::Expired { .. } => 14,
        JwtError::NotYetValid { .. } => 15,
        JwtError::UnusableKey(_) => 16,
        JwtError::NoSigningKey => 17,
        JwtError::Backend(_) => 18,
    }
}

/// One value of every `ApiError` variant but the policy's (`Denied`, `Failed`: the conditions
/// table), with every `AuthError` and `JwtError`.
fn api_samples() -> Vec<ApiError> {
    let lookup = || LookupError::Timeout(std::time::Duration::from_secs(5));
    let mut all = vec![
        ApiError::EmptyCsr,
        ApiError::Key(KeyError::BadSignature { what: "CSR" }),
        ApiError::UnknownSigner("x".into()),
        ApiError::SignerNotAllowed("x".into()),
        ApiError::TooManyDnsNames {
            requested: 17,
            max: 16,
        },
        ApiError::BadLifetime(0),
        ApiError::Unavailable(BackendError::Unavailable("hsm".into())),
        ApiError::LedgerUnavailable("ledger".into()),
        ApiError::RateLimited(100),
        ApiError::TooManyStreams(10),
        ApiError::NotNodeProxy("x".into()),
        ApiError::PodNotFound("x".into()),
        ApiError::BadPodName("x".into()),
        ApiError::PodLookupUnavailable {
            pod: "a/b".into(),
            error: lookup(),
        },
        ApiError::PodOnOtherNode("x".into()),
        ApiError::PodListUnavailable {
            what: "pods".into(),
            error: lookup(),
        },
        ApiError::CallerPodGone("x".into()),
        ApiError::PodNotRunning("x".into()),
        ApiError::MirrorPod("x".into()),
        ApiError::NoPodDirectory,
        ApiError::MissingWorkloadHeader,
        ApiError::BadIstioCsr("x".into()),
        ApiError::CsrNameNotAllowed("x".into()),
        ApiError::BadValidity(0),
        ApiError::BadImpersonation("x".into()),
        ApiError::NoPodOnNode("x".into()),
        ApiError::ImpersonationWithoutPods,
        ApiError::Unimplemented("off"),
        ApiError::JwtTrustDomain {
            signer: "s".into(),
            trust_domain: "a".into(),
            served: "b".into(),
        },
        ApiError::UnknownSpiffeId {
            requested: "a".into(),
            own: "b".into(),
        },
        ApiError::EmptyField("svid"),
        ApiError::Internal("bug".into()),
    ];
    all.extend(auth_samples().into_iter().map(ApiError::Auth));
    all.extend(jwt_samples().into_iter().map(ApiError::Jwt));
    all
}

fn api_index(e: &ApiError) -> usize {
    match e {
        ApiError::EmptyCsr => 0,
        ApiError::Key(_) => 1,
        ApiError::UnknownSigner(_) => 2,
        ApiError::SignerNotAllowed(_) => 3,
        ApiError::TooManyDnsNames { .. } => 4,
        ApiError::Auth(_) => 5,
        ApiError::Denied { .. } | ApiError::Failed { .. } => 6,
        ApiError::BadLifetime(_) => 7,
        ApiError::Unavailable(_) => 8,
        ApiError::LedgerUnavailable(_) => 9,
        ApiError::RateLimited(_) => 10,
        ApiError::TooManyStreams(_) => 11,
        ApiError::NotNodeProxy(_) => 12,
        ApiError::PodNotFound(_) => 13,
        ApiError::BadPodName(_) => 14,
        ApiError::PodLookupUnavailable { .. } => 15,
        ApiError::PodOnOtherNode(_) => 16,
        ApiError::PodListUnavailable { .. } => 17,
        ApiError::CallerPodGone(_) => 18,
        ApiError::PodNotRunning(_) => 19,
        ApiError::MirrorPod(_) => 20,
        ApiError::NoPodDirectory => 21,
        ApiError::MissingWorkloadHeader => 22,
        ApiError::BadIstioCsr(_) => 23,
        ApiError::CsrNameNotAllowed(_) => 24,
        ApiError::BadValidity(_) => 25,
        ApiError::BadImpersonation(_) => 26,
        ApiError::NoPodOnNode(_) => 27,
        ApiError::ImpersonationWithoutPods => 28,
        ApiError::Unimplemented(_) => 29,
        ApiError::Jwt(_) => 30,
        ApiError::JwtTrustDomain { .. } => 31,
        ApiError::UnknownSpiffeId { .. } => 32,
        ApiError::EmptyField(_) => 33,
        ApiError::Internal(_) => 34,
    }
}

/// The gRPC name of a code, as the docs write it.
fn code_name(code: Code) -> String {
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

fn doc(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The rows of the Markdown table whose header row is `header`, as cells without backticks
/// around them.
fn table_rows(text: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = text.lines().skip_while(|l| l.trim() != header);
    assert!(
        lines.next().is_some(),
        "no table with the header {header:?}"
    );
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`').to_owned())
                .collect()
        })
        .collect()
}

const REFUSALS_HEADER: &str = "| Situation | Code | `reason` | Message |";
const CONDITIONS_HEADER: &str = "| Outcome | Reason | gRPC code | Cause | Fix |";

/// The (`reason`, code) pairs of the refusals table, each with how many rows name it.
fn documented_refusals(text: &str) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for row in table_rows(text, REFUSALS_HEADER) {
        *out.entry((row[2].clone(), row[1].clone())).or_default() += 1;
    }
    out
}

fn mapped_refusals() -> BTreeSet<(String, String)> {
    api_samples()
        .iter()
        .map(|e| (e.reason().to_owned(), code_name(e.code())))
        .collect()
}

#[test]
fn the_samples_cover_every_variant() {
    let covered = |indices: BTreeSet<usize>, n: usize, what: &str| {
        assert_eq!(indices, (0..n).collect(), "a {what} variant has no sample");
    };
    covered(
        auth_samples().iter().map(auth_index).collect(),
        10,
        "AuthError",
    );
    covered(
        jwt_samples().iter().map(jwt_index).collect(),
        19,
        "JwtError",
    );
    let mut api: BTreeSet<usize> = api_samples().iter().map(api_index).collect();
    api.insert(6); // Denied and Failed: checked against the conditions table below.
    covered(api, 35, "ApiError");
}

#[test]
fn the_refusals_table_has_one_row_per_reason_and_code() {
    let documented = documented_refusals(&doc("docs/grpc-api.md"));
    let mapped = mapped_refusals();
    let extra: Vec<_> = documented.keys().filter(|k| !mapped.contains(*k)).collect();
    let missing: Vec<_> = mapped
        .iter()
        .filter(|k| !documented.contains_key(*k))
        .collect();
    let repeated: Vec<_> = documented.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        extra.is_empty() && missing.is_empty() && repeated.is_empty(),
        "docs/grpc-api.md's refusals table and grpc/src/errors.rs disagree:\n\
         rows no refusal answers: {extra:?}\nrefusals with no row: {missing:?}\n\
         pairs with several rows: {repeated:?}"
    );
}

/// A pair dropped from, or added to, the table is caught (the comparison above is not
/// vacuous).
#[test]
fn a_broken_refusals_table_is_caught() {
    let text = doc("docs/grpc-api.md");
    let row = text
        .lines()
        .find(|l| l.contains("| `rate_limited` |"))
        .expect("the rate_limited row");
    let without = documented_refusals(&text.replace(&format!("{row}\n"), ""));
    assert!(!without.contains_key(&("rate_limited".into(), "RESOURCE_EXHAUSTED".into())));
    assert_ne!(
        without.keys().cloned().collect::<BTreeSet<_>>(),
        mapped_refusals()
    );
    let wrong_code = documented_refusals(&text.replace(
        "`RESOURCE_EXHAUSTED` | `rate_limited`",
        "`UNAVAILABLE` | `rate_limited`",
    ));
    assert!(wrong_code.contains_key(&("rate_limited".into(), "UNAVAILABLE".into())));
}

/// The condition-reason rows: (outcome, reason, code); the rule-defined rows (not one plain
/// name) as reason `None`.
fn documented_conditions(text: &str) -> Vec<(String, Option<String>, String)> {
    table_rows(text, CONDITIONS_HEADER)
        .into_iter()
        .filter(|row| row[0] != "pending")
        .map(|row| {
            let plain = row[1].chars().all(|c| c.is_ascii_alphanumeric()) && !row[1].is_empty();
            (
                row[0].clone(),
                plain.then(|| row[1].clone()),
                row[2].clone(),
            )
        })
        .collect()
}

fn check_conditions(text: &str) -> Vec<String> {
    let mut problems = vec![];
    let rows = documented_conditions(text);
    let mut want: BTreeMap<String, (&str, String)> = BTreeMap::new();
    for reason in DenyReason::ALL {
        want.insert(
            reason.condition_reason().into(),
            ("Denied", code_name(deny_code(*reason))),
        );
    }
    for reason in FailReason::ALL {
        want.insert(
            reason.condition_reason().into(),
            ("Failed", code_name(fail_code(*reason))),
        );
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (outcome, reason, code) in &rows {
        match reason {
            Some(reason) => {
                *seen.entry(reason.clone()).or_default() += 1;
                match want.get(reason) {
                    None => problems.push(format!("row {reason}: no such condition reason")),
                    Some((o, c)) if o != outcome || c != code => problems.push(format!(
                        "row {reason}: the docs say {outcome} {code}, the code {o} {c}"
                    )),
                    Some(_) => {}
                }
            }
            None => {
                let rule = code_name(deny_code(DenyReason::Rule("rule")));
                if outcome != "Denied" || *code != rule {
                    problems.push(format!(
                        "a rule-defined row says {outcome} {code}, the code Denied {rule}"
                    ));
                }
            }
        }
    }
    for reason in want.keys() {
        match seen.get(reason) {
            None => problems.push(format!("{reason}: no row")),
            Some(n) if *n > 1 => problems.push(format!("{reason}: {n} rows")),
            Some(_) => {}
        }
    }
    problems
}

#[test]
fn the_conditions_table_has_one_row_per_reason_with_its_code() {
    let problems = check_conditions(&doc("docs/troubleshooting.md"));
    assert!(
        problems.is_empty(),
        "docs/troubleshooting.md's condition reasons and signer/src/reason.rs, \
         grpc/src/errors.rs disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_broken_conditions_table_is_caught() {
    let text = doc("docs/troubleshooting.md");
    let dropped = text
        .lines()
        .filter(|l| !l.starts_with("| Failed | `CAKeyUnusable`"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(check_conditions(&dropped), ["CAKeyUnusable: no row"]);
    let recoded = text.replace(
        "| `MalformedPublicKey` | `INVALID_ARGUMENT` |",
        "| `MalformedPublicKey` | `PERMISSION_DENIED` |",
    );
    assert_eq!(
        check_conditions(&recoded),
        [
            "row MalformedPublicKey: the docs say Denied PERMISSION_DENIED, the code Denied \
          INVALID_ARGUMENT"
        ]
    );
}
