//! `podca bundle`: print the trust anchors (PEM), or the SPIFFE bundle document.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podca_signer::FileStore;
use podca_signer::spiffe_bundle::SpiffeBundle;

#[derive(Debug, Args)]
pub struct BundleArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// Write the bundle here instead of standard output.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Print the SPIFFE bundle document (JWKS: X.509 and JWT authorities, sequence, refresh
    /// hint for the default propagation window), as the bundle endpoint serves it.
    #[arg(long)]
    pub spiffe: bool,
}

impl BundleArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let Self { dir, out, spiffe } = self;
        let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
        let pem = if spiffe {
            let propagation = podca_signer::rotation::Schedule::default().propagation_seconds;
            let bundle = SpiffeBundle::of_store(&store, propagation)?;
            String::from_utf8(bundle.to_json()?)?
        } else {
            store.roots()?.iter().map(|r| r.pem()).collect()
        };
        match out {
            Some(path) => std::fs::write(&path, pem)
                .with_context(|| format!("cannot write {}", path.display())),
            None => {
                print!("{pem}");
                Ok(())
            }
        }
    }
}
