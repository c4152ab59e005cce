use podca_grpc::renewal::{DenylistEdit, edit_file};

/// `podca renewal`: show or change the mTLS renewal denylist (`[grpc] renewal_denylist`):
/// listed certificates and identities renew with a token only. Prints the new list.
#[derive(clap::Args, Debug)]
pub struct RenewalArgs {
    /// The denylist file (`[grpc] renewal_denylist`); created when missing.
    #[arg(long)]
    denylist: std::path::PathBuf,
    /// A certificate serial (hex, as `podca inspect` and the ledger print it).
    #[arg(long = "deny-serial", value_name = "HEX")]
    deny_serials: Vec<String>,
    #[arg(long = "deny-identity", value_name = "SPIFFE_ID")]
    deny_identities: Vec<String>,
    #[arg(long = "allow-serial", value_name = "HEX")]
    allow_serials: Vec<String>,
    #[arg(long = "allow-identity", value_name = "SPIFFE_ID")]
    allow_identities: Vec<String>,
}

impl RenewalArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let edit = DenylistEdit {
            deny_serials: self.deny_serials,
            deny_identities: self.deny_identities,
            allow_serials: self.allow_serials,
            allow_identities: self.allow_identities,
        };
        print!("{}", edit_file(&self.denylist, &edit)?.render());
        Ok(())
    }
}
