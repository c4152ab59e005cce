//! `podca doctor`: a preflight of the cluster through the current kubeconfig. The checks are
//! `podca_controller::doctor`'s; this prints one line per check (or JSON) and exits 1 when one
//! failed.

use std::path::PathBuf;

use anyhow::Context as _;
use podca_authority::config::Config;
use podca_controller::doctor::{self, ClientOptions, DoctorOptions, LeaseRef, Status};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Kubeconfig file; default: KUBECONFIG, ~/.kube/config, in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use instead of its current one.
    #[arg(long)]
    pub context: Option<String>,
    /// Ask as this user, e.g. `system:serviceaccount:podca-system:podca`: the RBAC checks answer
    /// for whoever asks (needs the right to impersonate).
    #[arg(long = "as", value_name = "USER")]
    pub as_user: Option<String>,
    /// With this group (repeatable), e.g. `system:serviceaccounts`.
    #[arg(long = "as-group", value_name = "GROUP", requires = "as_user")]
    pub as_groups: Vec<String>,
    /// podca serve's configuration: the signer names, the CA Secret, the bundles.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// podca serve runs with `--leader-elect --lease-name NAME`: check the Lease permissions too.
    #[arg(long)]
    pub lease_name: Option<String>,
    /// Namespace of the leader Lease (default: POD_NAMESPACE, else `default`, as podca serve).
    #[arg(long, requires = "lease_name")]
    pub lease_namespace: Option<String>,
    /// podca serve runs with `--sharding rendezvous` (or its config says so): check the member
    /// Leases' permissions too.
    #[arg(long, requires = "lease_name", value_parser = crate::cli::spelled::<podca_authority::config::Sharding>(), ignore_case = true)]
    pub sharding: Option<podca_authority::config::Sharding>,
    /// Print the report as JSON: `{"healthy": bool, "checks": [{"name", "status", "detail"}]}`.
    #[arg(long)]
    pub json: bool,
}

impl DoctorArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let Self {
            kubeconfig,
            context,
            as_user,
            as_groups,
            config,
            lease_name,
            lease_namespace,
            sharding,
            json,
        } = self;
        let config = config
            .map(|path| Config::load(&path).with_context(|| format!("{}", path.display())))
            .transpose()?;
        let lease = lease_name.map(|name| LeaseRef {
            namespace: lease_namespace
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_else(|| "default".into()),
            name,
            sharded: sharding == Some(podca_authority::config::Sharding::Rendezvous),
        });
        let client_options = ClientOptions {
            kubeconfig,
            context,
            impersonate: as_user,
            impersonate_groups: as_groups,
        };
        let runtime = super::block_on_runtime()?;
        let report = runtime.block_on(async {
            let (client, server) = doctor::connect(&client_options).await?;
            let options = DoctorOptions {
                config,
                lease,
                clock: podca_authority::system_clock(),
                server,
            };
            anyhow::Ok(doctor::run(&client, &options).await?)
        })?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.text());
        }
        let failed = report
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        anyhow::ensure!(
            failed == 0,
            "{failed} of {} checks failed",
            report.checks.len()
        );
        Ok(())
    }
}
