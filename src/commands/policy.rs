//! `podca policy test` and `podca policy lint`: a signer's issuance policy (allow-lists, then
//! CEL rules) checked offline, for the CI pipelines of platform teams.
//!
//! `test` decides one sample request exactly as the running podca would: a PodCertificateRequest
//! goes through the controller's own conversion and plan (`podca_controller::sample`), a gRPC,
//! Istio or JWT request description through the gRPC API's own admission
//! (`podca_grpc::admission`: `admit_certificate` then `sign_request_with`; `admit_jwt`). The certificate is signed by
//! a throwaway in-memory CA valid long before and after `--now`, so the CA is never what limits
//! the answer: CA-dependent failures (`CAExpiresTooSoon`, `CAKeyUnusable`, a lifetime cut by the
//! CA's end) are not simulated.
//!
//! `lint` loads the config with [`Config::load`], the loader `podca serve` and `podca dev` use,
//! and reports every signer's and every rule's error, plus a few warnings.
//!
//! Exit codes: `test` 0 issued, 1 denied or failed, 2 bad usage, config or input; `lint` 0 clean
//! (warnings allowed), 1 errors, 2 the config file cannot be read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use podca_authority::config::Config;
use podca_controller::sample::{self, LabelsSample, PcrSample, PodSample, labels_for, pod_for};
use podca_grpc::admission::{CertificateAsk, JwtFacts, JwtPlan, admit_certificate, admit_jwt};
use podca_grpc::auth::Identity;
use podca_grpc::errors::ApiError;
use podca_signer::keys::GeneratedKey;
use podca_signer::rules::{RequestSource, lint};
use podca_signer::verdict::{IssuedFacts, Verdict, passed, verdict};
use podca_signer::{
    CertificateRequest, DenyReason, KeyType, Outcome, RequestContext, SignerPolicy,
    sign_request_with,
};
use serde::Deserialize;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

/// Exit code of `test` for a denied or failed request, and of `lint` for a config with errors.
const EXIT_REFUSED: u8 = 1;
/// Exit code for bad usage, an unreadable or invalid config, or an unreadable request.
const EXIT_INPUT: u8 = 2;

#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// Decide a sample request (a PodCertificateRequest, or a gRPC/Istio/JWT request description)
    /// as podca would, and print the decision and what made it.
    #[command(
        long_about = "Decide a sample request as podca would and print the decision (Issued, \
                      Denied or Failed), its reason and message, which allow-list or rule decided, \
                      and for Issued the SPIFFE ID, DNS names and lifetime.\n\n\
                      A throwaway in-memory CA signs, valid long before and after --now: \
                      CA-dependent failures (CAExpiresTooSoon, CAKeyUnusable, a lifetime cut by \
                      the CA's end) are not simulated.\n\n\
                      Exit status: 0 issued, 1 denied or failed, 2 bad usage, config or input.",
        after_help = "Examples:\n  \
                      kubectl get pcr -n shop req-1 -o yaml > pcr.yaml\n  \
                      podca policy test --config podca.toml --request pcr.yaml\n  \
                      podca policy test --config podca.toml --request grpc.yaml \
                      --namespace-labels namespaces.yaml -o json"
    )]
    Test(TestArgs),
    /// Load and compile every signer's policy and rules as `podca serve` does; report every
    /// error (exit 1) and warnings worth knowing (exit 0).
    Lint(LintArgs),
}

/// How `podca policy test` and `podca policy lint` print their answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// The podca config file (TOML), as `podca serve --config` reads it.
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: PathBuf,
    /// The sample request: a PodCertificateRequest (v1 or v1beta1, as `kubectl get pcr NAME -o
    /// yaml` prints it) or a request description (source: grpc | istio | jwt). JSON when the
    /// name ends in .json, YAML otherwise.
    #[arg(long)]
    pub request: PathBuf,
    /// Decide under this signer instead of the PCR's spec.signerName or the description's
    /// signer (default: the [grpc] signer).
    #[arg(long)]
    pub signer: Option<String>,
    /// Namespace labels the rules see as namespaceObject.metadata.labels: a map namespace →
    /// labels, a Namespace, or a list of Namespaces (`kubectl get ns -o yaml`). Without it,
    /// rules see an empty map.
    #[arg(long)]
    pub namespace_labels: Option<PathBuf>,
    /// The request's pod (`kubectl get pod NAME -o yaml`): its labels and annotations are what
    /// rules of a signer with pod_facts see as pod.labels and pod.annotations. A pod of another
    /// name or UID than the request's is denied PolicyPodNotFound, as podca would.
    #[arg(long)]
    pub pod: Option<PathBuf>,
    /// The time of the decision (the rules' `now`, the certificate's validity), RFC 3339.
    /// Default: the current time.
    #[arg(long, value_parser = parse_rfc3339)]
    pub now: Option<OffsetDateTime>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: OutputFormat,
}

#[derive(Debug, clap::Args)]
pub struct LintArgs {
    /// The podca config file (TOML).
    #[arg(long, env = "PODCA_CONFIG")]
    pub config: PathBuf,
    /// Output format: text lines, or one JSON object (config, errors, warnings, signers,
    /// rules) for CI tooling.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: OutputFormat,
}

fn parse_rfc3339(s: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(s, &Rfc3339)
        .map_err(|e| format!("{s:?} is not an RFC 3339 time (e.g. 2026-12-01T10:00:00Z): {e}"))
}

impl PolicyCommand {
    pub fn run(self) -> ExitCode {
        match self {
            PolicyCommand::Test(args) => match test(&args) {
                Ok(verdict) => {
                    match args.output {
                        OutputFormat::Json => println!("{:#}", verdict.to_json()),
                        OutputFormat::Text => print!("{}", verdict.to_text()),
                    }
                    if verdict.decision == "Issued" {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(EXIT_REFUSED)
                    }
                }
                Err(e) => {
                    eprintln!("podca: {e:#}");
                    ExitCode::from(EXIT_INPUT)
                }
            },
            PolicyCommand::Lint(args) => lint(&args.config, args.output),
        }
    }
}

// ---- podca policy test ----------------------------------------------------------------------

/// Reads a JSON (`.json`) or YAML file into a JSON value; errors name the file and position.
fn read_document(path: &Path, what: &str) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if is_json {
        serde_json::from_str(&text)
            .with_context(|| format!("{what} {}: not valid JSON", path.display()))
    } else {
        serde_saphyr::from_str(&text).map_err(|e| {
            // The first line has the position and the problem; a source snippet follows.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            anyhow::anyhow!(
                "{what} {}: not valid YAML: {}",
                path.display(),
                first.strip_prefix("error: ").unwrap_or(first)
            )
        })
    }
}

/// A multi-line library message as one line.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A gRPC, Istio or JWT request, as described in a sample file (docs/operator-guide.md,
/// "Testing policy in CI"). Only the facts podca verified for such a request, plus the
/// annotations the client sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Description {
    source: DescribedSource,
    /// The signer the client names (gRPC, JWT); default: the `[grpc]` signer.
    #[serde(default)]
    signer: Option<String>,
    namespace: String,
    service_account: String,
    #[serde(default)]
    pod: Option<PodRef>,
    #[serde(default)]
    node: Option<NodeRef>,
    /// The CSR's key type (default ECDSAP256); not for JWTs.
    #[serde(default)]
    key_type: Option<KeyType>,
    #[serde(default)]
    requested_lifetime_seconds: Option<i64>,
    /// podca.v1 `user_annotations` (gRPC only).
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    /// JWT-SVID audiences (JWT only).
    #[serde(default)]
    audiences: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum DescribedSource {
    Grpc,
    Istio,
    Jwt,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodRef {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeRef {
    name: String,
}

fn test(args: &TestArgs) -> anyhow::Result<Verdict> {
    let config = Config::load(&args.config)?;
    let now = args.now.unwrap_or_else(OffsetDateTime::now_utc);
    let document = read_document(&args.request, "request file")?;
    let labels = match &args.namespace_labels {
        Some(path) => Some(read_labels(path)?),
        None => None,
    };
    let pod = match &args.pod {
        Some(path) => Some(read_pod(path)?),
        None => None,
    };
    let request_file = args.request.display().to_string();
    if let Some(signer) = &args.signer
        && !config.signers.contains_key(signer)
    {
        bail!(
            "--signer {signer:?} is not a configured signer (configured: {})",
            signer_list(&config)
        );
    }
    let is_pcr = document.get("kind").and_then(Value::as_str) == Some("PodCertificateRequest");
    if is_pcr {
        let mut sample = PcrSample::from_json(document)
            .with_context(|| format!("request file {request_file}"))?;
        if let Some(signer) = &args.signer {
            sample.set_signer_name(signer);
        }
        return test_pcr(&config, &sample, labels.as_ref(), pod.as_ref(), now);
    }
    if document.get("source").is_some() {
        let description: Description = serde_json::from_value(document)
            .with_context(|| format!("request file {request_file}: request description"))?;
        return test_description(
            &config,
            description,
            args.signer.as_deref(),
            (labels.as_ref(), pod.as_ref()),
            now,
        )
        .with_context(|| format!("request file {request_file}"));
    }
    let kind = document.get("kind").and_then(Value::as_str);
    bail!(
        "request file {request_file}: neither a PodCertificateRequest (kind: \
         PodCertificateRequest{}) nor a request description (source: grpc, istio or jwt)",
        match kind {
            Some(k) => format!("; this is kind {k:?}"),
            None => String::new(),
        }
    )
}

fn signer_list(config: &Config) -> String {
    if config.signers.is_empty() {
        return "none".into();
    }
    config
        .signers
        .keys()
        .map(|k| format!("{k:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn read_pod(path: &Path) -> anyhow::Result<PodSample> {
    PodSample::from_json(&read_document(path, "pod file")?)
        .map_err(|e| anyhow::anyhow!("pod file {}: {e}", path.display()))
}

fn read_labels(path: &Path) -> anyhow::Result<LabelsSample> {
    sample::labels_from_json(read_document(path, "namespace labels file")?)
        .map_err(|e| anyhow::anyhow!("namespace labels file {}: {e}", path.display()))
}

fn test_pcr(
    config: &Config,
    sample: &PcrSample,
    labels: Option<&LabelsSample>,
    pod: Option<&PodSample>,
    now: OffsetDateTime,
) -> anyhow::Result<Verdict> {
    let ca = sample::throwaway_ca(now)?;
    let mut notes = Vec::new();
    let policy = config.signers.get(sample.signer_name());
    let ns_labels = labels_for(labels, sample.namespace(), policy, &mut notes);
    let pod = pod_for(
        pod,
        (Some(sample.pod_name()), Some(sample.pod_uid())),
        policy,
        &mut notes,
    );
    if let Some(terminal) = sample.terminal() {
        notes.push(format!(
            "the object is already {terminal}: its spec was decided anew (status ignored)"
        ));
    }
    let decide = |signers: &BTreeMap<String, SignerPolicy>| match &pod {
        Ok(facts) => sample.decide(signers, &ca, ns_labels, *facts, now),
        Err(message) => Ok(Outcome::Denied {
            reason: DenyReason::PodNotFound,
            message: message.clone(),
        }),
    };
    let outcome = decide(&config.signers)?;
    let request = format!(
        "PodCertificateRequest {}/{} ({}), signer {:?}, service account {}/{}, pod {}, node {}",
        sample.namespace(),
        sample.name(),
        sample.api_version(),
        sample.signer_name(),
        sample.namespace(),
        sample.service_account(),
        sample.pod_name(),
        sample.node_name()
    );
    let rerun = |p: &SignerPolicy| {
        let mut signers = config.signers.clone();
        signers.insert(sample.signer_name().to_owned(), p.clone());
        decide(&signers).ok()
    };
    // Reason and message as the controller writes them into the condition.
    let condition = podca_controller::sample::condition(&outcome, now);
    let mut v = verdict(
        outcome,
        policy,
        sample.signer_name(),
        request,
        notes,
        &rerun,
    );
    if let Some((_, reason, message)) = condition {
        v.reason = reason;
        v.message = message;
    }
    Ok(v)
}

fn test_description(
    config: &Config,
    d: Description,
    signer_flag: Option<&str>,
    (labels, pod_file): (Option<&LabelsSample>, Option<&PodSample>),
    now: OffsetDateTime,
) -> anyhow::Result<Verdict> {
    if d.namespace.is_empty() || d.service_account.is_empty() {
        bail!("request description: namespace and service_account must not be empty");
    }
    let named = signer_flag.or(d.signer.as_deref());
    let (signer, policy) = match (d.source, named) {
        (DescribedSource::Istio, Some(name)) if name != config.grpc_signer()?.0 => bail!(
            "request description: the Istio CA API always issues for the [grpc] signer {:?}, \
             not {name:?}",
            config.grpc_signer()?.0
        ),
        (_, Some(name)) => {
            let policy = config.signers.get(name).with_context(|| {
                format!(
                    "request description: signer {name:?} is not a configured signer \
                     (configured: {})",
                    signer_list(config)
                )
            })?;
            (name, policy)
        }
        (_, None) => config.grpc_signer()?,
    };
    if !config.grpc_allowed_signers()?.iter().any(|s| s == signer) {
        bail!(
            "request description: signer {signer:?} is not offered over gRPC ([grpc] signers): \
             podca would refuse the request before its policy runs"
        );
    }
    let lifetime = match d.requested_lifetime_seconds {
        Some(s) if s <= 0 => {
            bail!("request description: requested_lifetime_seconds must be positive, not {s}")
        }
        other => other,
    };
    if d.source != DescribedSource::Grpc && !d.annotations.is_empty() {
        bail!("request description: annotations are podca.v1 user_annotations (source grpc only)");
    }
    if d.source != DescribedSource::Jwt && !d.audiences.is_empty() {
        bail!("request description: audiences are for JWT-SVIDs (source jwt only)");
    }
    let mut notes = Vec::new();
    let ns_labels = labels_for(labels, &d.namespace, Some(policy), &mut notes);
    let pod_name = d.pod.as_ref().and_then(|p| p.name.clone());
    let pod_uid = d.pod.as_ref().and_then(|p| p.uid.clone());
    let node_name = d.node.as_ref().map(|n| n.name.clone());
    let pod = pod_for(
        pod_file,
        (pod_name.as_deref(), pod_uid.as_deref()),
        Some(policy),
        &mut notes,
    );
    let source = match d.source {
        DescribedSource::Grpc => RequestSource::Grpc,
        DescribedSource::Istio => RequestSource::Istio,
        DescribedSource::Jwt => RequestSource::Jwt,
    };
    let mut request = format!(
        "{} request, signer {signer:?}, service account {}/{}",
        source.as_str(),
        d.namespace,
        d.service_account
    );
    if let Some(p) = &pod_name {
        request.push_str(&format!(", pod {p}"));
    }
    if let Some(n) = &node_name {
        request.push_str(&format!(", node {n}"));
    }

    if d.source == DescribedSource::Jwt {
        if d.key_type.is_some() {
            bail!("request description: key_type is for certificates, not JWT-SVIDs");
        }
        if d.audiences.is_empty() {
            bail!("request description: a JWT-SVID request needs at least one audience");
        }
        if !config.jwt.enabled {
            bail!("[jwt] enabled = false: podca issues no JWT-SVIDs with this config");
        }
        // The JWT-SVID decision of the gRPC API itself: allow-lists, rules, their lifetime cap.
        let limits = config.jwt.limits();
        let subject = Identity {
            pod_name: pod_name.clone(),
            pod_uid: pod_uid.clone(),
            node_name: node_name.clone(),
            ..Identity::service_account(&d.namespace, &d.service_account)
        };
        let decide = |p: &SignerPolicy| -> Result<JwtPlan, ApiError> {
            let pod = pod.clone().map_err(|message| ApiError::Denied {
                reason: DenyReason::PodNotFound,
                message,
            })?;
            let facts = JwtFacts {
                signer,
                subject: &subject,
                audiences: &d.audiences,
                spiffe_id: "",
                lifetime: lifetime.map(Duration::seconds),
                namespace_labels: ns_labels,
                pod,
                now,
            };
            admit_jwt(p, &facts, &limits)
        };
        let denied = |refused: ApiError| match refused {
            ApiError::Denied { reason, message } => Some(Outcome::Denied { reason, message }),
            _ => None,
        };
        request.push_str(&format!(", audiences {}", d.audiences.join(", ")));
        return Ok(match decide(policy) {
            Err(ApiError::Denied { reason, message }) => verdict(
                Outcome::Denied { reason, message },
                Some(policy),
                signer,
                request,
                notes,
                &|p| decide(p).err().and_then(denied),
            ),
            Err(other) => bail!("request description: podca would refuse it: {other}"),
            Ok(plan) => {
                notes.push(
                    "the JWT signing key's own end, which can shorten a token, is not simulated"
                        .into(),
                );
                let expires = plan.expiry(now, None);
                Verdict {
                    decision: "Issued",
                    reason: podca_signer::reason::ISSUED.into(),
                    message: String::new(),
                    decided_by: passed(policy),
                    request,
                    issued: Some(IssuedFacts {
                        spiffe_id: plan.spiffe_id,
                        dns_names: vec![],
                        lifetime_seconds: (expires - now).whole_seconds(),
                        not_before: None,
                        not_after: expires,
                    }),
                    notes,
                }
            }
        });
    }

    let key_type = d.key_type.unwrap_or(KeyType::EcdsaP256);
    request.push_str(&format!(", key {}", key_type.kubelet_name()));
    let key = GeneratedKey::generate(key_type)
        .with_context(|| format!("generating a {} key", key_type.kubelet_name()))?
        .public;
    let ca = sample::throwaway_ca(now)?;
    // The gRPC API's own checks (lifetime form, the DNS-name limit) before the policy.
    let admitted = admit_certificate(
        policy,
        &CertificateAsk {
            requested_lifetime_seconds: lifetime,
            user_annotations: &d.annotations,
            max_dns_names: config.grpc.max_dns_names,
        },
    )
    .map_err(|refused| {
        anyhow::anyhow!(
            "request description: podca would refuse it before its policy runs: {refused}"
        )
    })?;
    let certificate_request = CertificateRequest {
        key: Ok(key),
        namespace: d.namespace.clone(),
        service_account: d.service_account.clone(),
        pod_name: pod_name.clone(),
        max_expiration: None,
        requested_lifetime: admitted.requested_lifetime,
        user_annotations: d.annotations.clone(),
    };
    let decide = |p: &SignerPolicy| {
        let pod = match &pod {
            Ok(pod) => *pod,
            Err(message) => {
                return Outcome::Denied {
                    reason: DenyReason::PodNotFound,
                    message: message.clone(),
                };
            }
        };
        let context = RequestContext {
            source,
            signer_name: signer,
            pod_uid: pod_uid.as_deref(),
            node_name: node_name.as_deref(),
            namespace_labels: ns_labels,
            pod,
        };
        sign_request_with(p, &ca, &certificate_request, &context, now)
    };
    let outcome = decide(policy);
    Ok(verdict(
        outcome,
        Some(policy),
        signer,
        request,
        notes,
        &|p| Some(decide(p)),
    ))
}

// ---- podca policy lint ----------------------------------------------------------------------

fn lint(path: &Path, output: OutputFormat) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("podca: cannot read config file {}: {e}", path.display());
            return ExitCode::from(EXIT_INPUT);
        }
    };
    // The verdict is the loader's: exactly what `podca serve` and `podca dev` accept.
    let loaded = Config::load(path);
    let parsed = toml::from_str::<Config>(&text);
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let (mut signers, mut rules) = (0, 0);
    match &parsed {
        Err(e) => errors.push(format!("{}: {}", path.display(), one_line(&e.to_string()))),
        Ok(config) => {
            for (name, policy) in &config.signers {
                signers += 1;
                rules += policy.rules.len();
                errors.extend(
                    lint::signer_errors(name, policy)
                        .into_iter()
                        .map(|e| format!("signer {name:?}: {e}")),
                );
                warnings.extend(
                    policy
                        .rules
                        .iter()
                        .flat_map(lint::rule_warnings)
                        .map(|w| format!("signer {name:?}: {w}")),
                );
            }
        }
    }
    if let Err(e) = &loaded
        && errors.is_empty()
    {
        // Not a signer's: [grpc], [jwt] and the like.
        errors.push(one_line(&format!("{e:#}")));
    }
    match output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::json!({
                "config": path.display().to_string(),
                "errors": errors,
                "warnings": warnings,
                "signers": signers,
                "rules": rules,
            })
        ),
        OutputFormat::Text => {
            for e in &errors {
                println!("error: {e}");
            }
            for w in &warnings {
                println!("warning: {w}");
            }
            let plural =
                |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
            println!(
                "{}: {}, {} ({}, {})",
                path.display(),
                plural(errors.len(), "error"),
                plural(warnings.len(), "warning"),
                plural(signers, "signer"),
                plural(rules, "rule")
            );
        }
    }
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REFUSED)
    }
}
