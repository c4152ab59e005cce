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

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use podca_authority::config::Config;
use podca_controller::policy_test::{Description, decide_description, decide_pcr, signer_list};
use podca_controller::sample::{self, LabelsSample, PcrSample, PodSample};
use podca_signer::verdict::Verdict;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

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
        return Ok(decide_pcr(
            &config,
            &sample,
            labels.as_ref(),
            pod.as_ref(),
            now,
        )?);
    }
    if document.get("source").is_some() {
        let description: Description = serde_json::from_value(document)
            .with_context(|| format!("request file {request_file}: request description"))?;
        return decide_description(
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

fn read_pod(path: &Path) -> anyhow::Result<PodSample> {
    PodSample::from_json(&read_document(path, "pod file")?)
        .map_err(|e| anyhow::anyhow!("pod file {}: {e}", path.display()))
}

fn read_labels(path: &Path) -> anyhow::Result<LabelsSample> {
    sample::labels_from_json(read_document(path, "namespace labels file")?)
        .map_err(|e| anyhow::anyhow!("namespace labels file {}: {e}", path.display()))
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
    let report = podca_authority::config_lint::lint(path, &text);
    match output {
        OutputFormat::Json => println!("{}", report.to_json(path)),
        OutputFormat::Text => print!("{}", report.to_text(path)),
    }
    if report.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REFUSED)
    }
}
