//! `kube-emulator`: the Kubernetes API emulator of `podca-tests` as a long-running process, so
//! that `podca serve`, kubectl or any client can be pointed at it by hand. It writes an admin
//! kubeconfig and one for podca's service account with exactly the RBAC of `deploy/`, and
//! serves until SIGINT or SIGTERM. Nothing is kept: a restart starts from an empty cluster.

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use podca_tests::emulator::names;
use podca_tests::emulator::podca_rbac::{PODCA_NAMESPACE, PODCA_SERVICE_ACCOUNT, PodcaRbac};
use podca_tests::emulator::{ApiMode, LatencyModel, Subject, UserInfo};
use podca_tests::{Emulator, EmulatorConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The placeholder signer name of deploy/base (config.toml and rbac.yaml).
const DEFAULT_SIGNER: &str = "example.com/workload";

/// Serve the podca-tests Kubernetes API emulator until SIGINT or SIGTERM.
#[derive(Debug, Parser)]
#[command(name = "kube-emulator")]
struct Args {
    /// Address to serve the API on (plain HTTP). Port 0 picks a free one; the kubeconfigs
    /// name the real address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Directory to write admin.kubeconfig and podca.kubeconfig into (created if missing).
    #[arg(long, value_name = "DIR")]
    kubeconfig_dir: PathBuf,
    /// A signer name podca may `sign` and `attest` for; repeat for several
    /// [default: example.com/workload].
    #[arg(long = "signer", value_name = "NAME")]
    signers: Vec<String>,
    /// A namespace to create (with its `default` service account); repeat for several.
    #[arg(long = "namespace", value_name = "NS")]
    namespaces: Vec<String>,
    /// A node to create; repeat for several.
    #[arg(long = "node", value_name = "NAME")]
    nodes: Vec<String>,
    /// The certificates.k8s.io versions served.
    #[arg(long, value_enum, default_value_t = Mode::V1)]
    api_mode: Mode,
    /// The CA Secret of podca's secret backend: podca may read it and keep its history
    /// ConfigMap `<NAME>-podca-history`, in that namespace.
    #[arg(long, value_name = "NS/NAME", default_value = "podca-system/podca-ca")]
    ca_secret: String,
    /// The Lease of `podca serve --leader-elect --lease-name NAME`: podca may hold it.
    #[arg(long, value_name = "NAME")]
    lease_name: Option<String>,
    /// podca may `get` and `list` pods, for gRPC IssueForPod and the Istio CA API's
    /// ImpersonatedIdentity (deploy/components/issue-for-pod; podca's config needs
    /// `[grpc] node_proxy_service_accounts` too).
    #[arg(long)]
    issue_for_pod: bool,
    /// podca may `list` and `watch` namespaces, for policy rules that read `namespaceObject.metadata.labels`
    /// (deploy/components/namespace-labels).
    #[arg(long)]
    namespace_labels: bool,
    /// podca may `get` pods cluster-wide, for signers with `pod_facts = true`, whose policy
    /// rules read the request's pod (`pod.labels`, `pod.annotations`): deploy/components/pod-facts.
    #[arg(long)]
    pod_facts: bool,
    /// podca may `get` pods and Services cluster-wide, for signers with a `service_ca` table
    /// (the `kubernetes.io/service-ca` annotations): deploy/components/service-ca.
    #[arg(long)]
    service_ca: bool,
    /// Service times and concurrency per class of request: `off`, `real-apiserver` (calibrated
    /// to a kube-apiserver 1.36.3 with etcd on 2 cores), or a spec such as
    /// `servers=3,update=3.75ms+2.22ms,create=2.56ms+1.9ms,list=39ms,watch=5ms`
    /// (`<class>=<base>[+<exponential tail mean>][/<servers of its own>]`, `servers=<shared>`;
    /// see the emulator's `latency` module).
    #[arg(
        long,
        value_name = "SPEC",
        env = "PODCA_EMULATOR_LATENCY",
        default_value = "off"
    )]
    latency: String,
}

/// `--api-mode`, after the releases that serve each set of versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// 1.37: certificates.k8s.io/v1.
    V1,
    /// 1.36: v1beta1 with stubPKCS10Request.
    V1beta1,
    /// 1.35: v1beta1 without stubPKCS10Request.
    V1beta1Legacy,
    /// v1 and v1beta1 together.
    Both,
}

/// The checked flags.
#[derive(Debug)]
struct Setup {
    listen: SocketAddr,
    dir: PathBuf,
    namespaces: Vec<String>,
    nodes: Vec<String>,
    api_mode: ApiMode,
    rbac: PodcaRbac,
    latency: LatencyModel,
}

fn main() -> ExitCode {
    let setup = match Args::try_parse().map_err(usage_error).and_then(Args::check) {
        Ok(setup) => setup,
        Err(exit) => return exit,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(run(setup)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("{e:#}")),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("kube-emulator: {message}");
    ExitCode::FAILURE
}

/// A bad command line: one line on stderr, exit status 2 (help and version: stdout, 0).
fn usage(message: &str) -> ExitCode {
    eprintln!("kube-emulator: {message} (see --help)");
    ExitCode::from(2)
}

fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        print!("{e}");
        return ExitCode::SUCCESS;
    }
    // clap renders "error: <what>" (a list of missing flags on the lines after it), a blank
    // line, then usage; the part before the blank line is the point.
    let rendered = e.render().to_string();
    let what: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let what = what.join(" ");
    usage(what.strip_prefix("error: ").unwrap_or(&what))
}

impl Args {
    fn check(self) -> Result<Setup, ExitCode> {
        let Self {
            listen,
            kubeconfig_dir,
            mut signers,
            namespaces,
            nodes,
            api_mode,
            ca_secret,
            lease_name,
            issue_for_pod,
            namespace_labels,
            pod_facts,
            service_ca,
            latency,
        } = self;
        if signers.is_empty() {
            signers.push(DEFAULT_SIGNER.to_string());
        }
        for s in &signers {
            if let Some(e) = names::validate_signer_name("--signer", s).first() {
                return Err(usage(&e.full()));
            }
        }
        for (flag, name) in namespaces
            .iter()
            .map(|n| ("--namespace", n))
            .chain(nodes.iter().map(|n| ("--node", n)))
        {
            let problems = if flag == "--namespace" {
                names::is_dns1123_label(name)
            } else {
                names::is_dns1123_subdomain(name)
            };
            if let Some(p) = problems.first() {
                return Err(usage(&format!("{flag} {name:?}: {p}")));
            }
        }
        let ca_secret = match ca_secret.split_once('/') {
            Some((ns, name))
                if names::is_dns1123_label(ns).is_empty()
                    && names::is_dns1123_subdomain(name).is_empty() =>
            {
                (ns.to_string(), name.to_string())
            }
            _ => {
                return Err(usage(&format!(
                    "--ca-secret {ca_secret:?}: expected NAMESPACE/NAME"
                )));
            }
        };
        let latency: LatencyModel = latency
            .parse()
            .map_err(|e| usage(&format!("--latency: {e}")))?;
        if let Some(lease) = &lease_name
            && let Some(p) = names::is_dns1123_subdomain(lease).first()
        {
            return Err(usage(&format!("--lease-name {lease:?}: {p}")));
        }
        Ok(Setup {
            listen,
            dir: kubeconfig_dir,
            namespaces,
            nodes,
            api_mode: match api_mode {
                Mode::V1 => ApiMode::V1Only,
                Mode::V1beta1 => ApiMode::V1Beta1,
                Mode::V1beta1Legacy => ApiMode::V1Beta1Legacy,
                Mode::Both => ApiMode::V1AndV1Beta1,
            },
            rbac: PodcaRbac {
                signer_names: signers,
                ca_secret: Some(ca_secret),
                lease_name,
                issue_for_pod,
                // deploy/base's JWKS ConfigMap (`[jwt] jwks_configmap`'s default).
                jwks_configmap: Some((
                    podca_tests::emulator::podca_rbac::PODCA_NAMESPACE.into(),
                    "podca-jwks".into(),
                )),
                namespace_labels,
                pod_facts,
                service_ca,
            },
            latency,
        })
    }
}

async fn run(setup: Setup) -> anyhow::Result<()> {
    let Setup {
        listen,
        dir,
        namespaces,
        nodes,
        api_mode,
        rbac,
        latency,
    } = setup;
    let emu = Emulator::start_on(
        listen,
        EmulatorConfig {
            api_mode,
            latency: latency.clone(),
            ..Default::default()
        },
    )
    .await
    .with_context(|| format!("cannot listen on {listen}"))?;

    // The service-account controller gives every namespace a `default` service account.
    let mut all_namespaces = vec!["default".to_string(), PODCA_NAMESPACE.to_string()];
    all_namespaces.extend(namespaces);
    for ns in &all_namespaces {
        emu.add_service_account(ns, "default");
    }
    for node in &nodes {
        emu.add_node(node);
    }
    let podca_user = format!("system:serviceaccount:{PODCA_NAMESPACE}:{PODCA_SERVICE_ACCOUNT}");
    let mut user = UserInfo::new(
        &podca_user,
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{PODCA_NAMESPACE}"),
        ],
    );
    user.uid = emu.add_service_account(PODCA_NAMESPACE, PODCA_SERVICE_ACCOUNT);
    emu.add_identity_user("podca", user);
    for rule in rbac.rules() {
        emu.grant(Subject::User(podca_user.clone()), rule);
    }

    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let admin = dir.join("admin.kubeconfig");
    let podca = dir.join("podca.kubeconfig");
    write_kubeconfig(&emu, &admin, "admin", "default")?;
    write_kubeconfig(&emu, &podca, "podca", PODCA_NAMESPACE)?;

    let versions = api_mode.cert_versions().join(", ");
    println!(
        "kube-emulator: serving the Kubernetes API on {} (certificates.k8s.io {versions})",
        emu.base_url()
    );
    println!("  latency model: {latency}");
    println!("  {}  cluster-admin (system:masters)", admin.display());
    println!(
        "  {}  {podca_user}, the RBAC of deploy/ for {}",
        podca.display(),
        rbac.signer_names.join(", ")
    );
    println!(
        "run podca:       podca serve --kubeconfig {} --config podca.toml",
        podca.display()
    );
    // Not `kubectl create token`: kubectl sends no credentials to a plain-HTTP server
    // (clientcmd reads a kubeconfig's user only for TLS), so the TokenRequest goes by curl.
    println!(
        "mint a token:    curl -s -X POST -H \"Authorization: Bearer $(sed -n 's/^ *token: //p' {})\" \
         -H 'Content-Type: application/json' -d '{{\"spec\": {{\"audiences\": [\"podca\"]}}}}' \
         {}/api/v1/namespaces/default/serviceaccounts/default/token",
        admin.display(),
        emu.base_url()
    );
    println!("SIGINT (Ctrl-C) or SIGTERM stops it.");

    shutdown_signal().await?;
    emu.shutdown();
    println!("kube-emulator: stopped");
    Ok(())
}

fn write_kubeconfig(emu: &Emulator, path: &Path, identity: &str, ns: &str) -> anyhow::Result<()> {
    emu.write_kubeconfig_with_namespace(path, identity, ns)
        .with_context(|| format!("cannot write {}", path.display()))
}

async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;
    use podca_tests::emulator::PolicyRule;

    /// podca's rules on core `pods` for these flags.
    fn pod_rules(flags: &[&str]) -> Vec<PolicyRule> {
        let argv = ["kube-emulator", "--kubeconfig-dir", "kube"]
            .iter()
            .chain(flags);
        let setup = Args::try_parse_from(argv)
            .expect("the flags parse")
            .check()
            .expect("the flags check");
        setup
            .rbac
            .rules()
            .into_iter()
            .filter(|r| r.api_groups == [""] && r.resources == ["pods"])
            .collect()
    }

    #[test]
    fn pod_facts_grants_pods_get_cluster_wide_and_nothing_else() {
        assert_eq!(pod_rules(&[]), Vec::<PolicyRule>::new());
        assert_eq!(
            pod_rules(&["--pod-facts"]),
            [PolicyRule::new(&[""], &["pods"], &["get"])]
        );
        assert_eq!(
            pod_rules(&["--pod-facts", "--issue-for-pod"]),
            [
                PolicyRule::new(&[""], &["pods"], &["get", "list"]),
                PolicyRule::new(&[""], &["pods"], &["get"])
            ]
        );
        // The help says what it is for.
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("--pod-facts"), "{help}");
        assert!(help.contains("deploy/components/pod-facts"), "{help}");
    }

    #[test]
    fn latency_takes_the_preset_or_a_spec_and_refuses_a_bad_one() {
        let latency = |flags: &[&str]| {
            let argv = ["kube-emulator", "--kubeconfig-dir", "kube"]
                .iter()
                .chain(flags);
            Args::try_parse_from(argv)
                .expect("the flags parse")
                .check()
                .map(|setup| setup.latency)
        };
        // The default is off, unless PODCA_EMULATOR_LATENCY says otherwise.
        if std::env::var_os("PODCA_EMULATOR_LATENCY").is_none() {
            assert_eq!(latency(&[]).ok(), Some(LatencyModel::default()));
        }
        assert_eq!(
            latency(&["--latency", "real-apiserver"]).ok(),
            Some(LatencyModel::real_apiserver())
        );
        assert_eq!(
            latency(&["--latency", "update=2ms/4"])
                .ok()
                .map(|l| l.to_string()),
            Some("update=2ms/4".into())
        );
        assert!(latency(&["--latency", "update=2ms/0"]).is_err());
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("PODCA_EMULATOR_LATENCY"), "{help}");
    }
}
