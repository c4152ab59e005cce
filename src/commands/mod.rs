//! The offline commands: everything that works on a CA data directory or on files.

pub mod bundle;
pub mod ca;
pub mod inspect;
pub mod issue;
pub mod ledger;

use std::path::PathBuf;

/// Where the CA lives unless `--dir` says otherwise: `$PODCA_DATA_DIR`, else
/// `$XDG_DATA_HOME/podca`, else `~/.local/share/podca`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("podca");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/podca"),
        None => PathBuf::from(".podca"),
    }
}
