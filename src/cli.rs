//! Command-line parsing and dispatch. One clap `Args` per command.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Parser, Subcommand};
use podca_authority::log_format::{EscapedFields, log_filter};
use podca_signer::spelling::Spelled;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::{commands, dev, serve};

#[derive(Debug, Parser)]
#[command(
    name = "podca",
    version,
    about = "A certificate authority for Kubernetes workloads"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "PODCA_LOG_FORMAT", default_value = "text", help_heading = GLOBAL)]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `podca=debug`.
    #[arg(long, global = true, env = "PODCA_LOG", default_value = "info", value_parser = log_filter, help_heading = GLOBAL)]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

/// Where `--help` lists the options every command takes, apart from the command's own.
const GLOBAL: &str = "Global options";

/// The value parser of an option that names one of a library enum's values: the names of its
/// [`Spelled`] table are clap's possible values, so `--help` (with each one's aliases), the
/// completions and the man pages list them. Give the option `ignore_case`, as the table does.
pub fn spelled<T: Spelled + Clone + Send + Sync>() -> impl TypedValueParser<Value = T> {
    let values = T::SPELLINGS.iter().map(|s| {
        PossibleValue::new(s.name)
            .aliases(s.aliases.iter().copied())
            .help(s.help_line())
    });
    PossibleValuesParser::new(values).try_map(|given| T::from_name(&given))
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, import and show the CA.
    #[command(subcommand)]
    Ca(commands::ca::CaCommand),
    /// Issue a certificate from a CSR, or for a generated key, and write a credential bundle.
    Issue(commands::issue::IssueArgs),
    /// Print the trust anchors (PEM).
    Bundle(commands::bundle::BundleArgs),
    /// Decode a certificate or bundle: subject, SANs, validity, fingerprints, chain check.
    Inspect(commands::inspect::InspectArgs),
    /// Query the issuance ledger.
    #[command(subcommand)]
    Ledger(commands::ledger::LedgerCommand),
    /// Run in a cluster: the PodCertificateRequest signer, gRPC API and admin server.
    Serve(serve::ServeArgs),
    /// Run on a laptop with no cluster: local CA, gRPC on loopback, SPIFFE Workload API.
    Dev(dev::DevArgs),
    /// Preflight a cluster for podca: APIs served, RBAC, CA Secret, trust bundle, clock skew.
    Doctor(commands::doctor::DoctorArgs),
    /// Test and lint issuance policy offline: decide a sample request, check every rule.
    #[command(subcommand)]
    Policy(commands::policy::PolicyCommand),
    /// Foreign trust domains ([[federation]]): the bundle in force for each, and its age.
    #[command(subcommand)]
    Federation(commands::federation::FederationCommand),
    /// Show or edit the mTLS renewal denylist (`[grpc] renewal_denylist`).
    Renewal(commands::renewal::RenewalArgs),
    /// kube-apiserver's external service-account token signer, on a Unix socket.
    TokenSigner(commands::token_signer::TokenSignerArgs),
    /// Print shell completions (bash, zsh, fish) or, with --man, the man pages.
    Completions(commands::completions::CompletionsArgs),
}

pub fn main() -> ExitCode {
    podca_authority::closed_pipe::install();
    let cli = Cli::parse();
    // doctor reports API errors in its own lines: kube's connection errors would say them twice.
    let quiet_kube = matches!(cli.command, Command::Doctor(_));
    init_logging(cli.log_format, &cli.log, quiet_kube);
    let result = match cli.command {
        Command::Ca(c) => c.run(),
        Command::Issue(a) => a.run(),
        Command::Bundle(a) => a.run(),
        Command::Inspect(a) => a.run(),
        Command::Ledger(c) => c.run(),
        Command::Serve(a) => serve::run(a),
        Command::Dev(a) => dev::run(a),
        Command::Doctor(a) => a.run(),
        Command::Completions(a) => a.run(),
        Command::Federation(c) => c.run(),
        Command::Renewal(a) => a.run(),
        Command::TokenSigner(a) => a.run(),
        // Its own exit codes: 1 is a refusal (denied, or lint errors), 2 bad input.
        Command::Policy(c) => return c.run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if podca_authority::closed_pipe::caused(e.chain()) => ExitCode::SUCCESS,
        Err(e) => {
            // One clear line: the context chain, outermost first.
            eprintln!("podca: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, filter: &str, quiet_kube: bool) {
    // `log_filter` has accepted it when the command line was parsed.
    let filter = match quiet_kube {
        true => format!("{filter},kube_client::client::builder=off"),
        false => filter.to_owned(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(podca_authority::log_format::colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(std::io::stderr);
    // The trace slot stays empty unless `[tracing]` names a collector (podca_authority::traces).
    let _ = match format {
        LogFormat::Text => (builder.fmt_fields(EscapedFields).finish())
            .with(podca_authority::traces::slot())
            .try_init(),
        LogFormat::Json => (builder.json().finish())
            .with(podca_authority::traces::slot())
            .try_init(),
    };
}
