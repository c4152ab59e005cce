//! `podca bundle`: print the trust anchors.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podca_signer::FileStore;

#[derive(Debug, Args)]
pub struct BundleArgs {
    /// CA data directory.
    #[arg(long, env = "PODCA_DATA_DIR")]
    pub dir: Option<PathBuf>,
    /// Write the bundle here instead of standard output.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
}

impl BundleArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let Self { dir, out } = self;
        let store = FileStore::new(dir.unwrap_or_else(super::default_data_dir));
        let roots = store.roots()?;
        let pem: String = roots.iter().map(|r| r.pem()).collect();
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
