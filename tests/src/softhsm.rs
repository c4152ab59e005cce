//! SoftHSM2 tokens for the end-to-end tests of podca's PKCS#11 backend, and OpenSC's
//! `pkcs11-tool` (not podca) to see what a token holds.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The SoftHSM2 PKCS#11 module Debian and Ubuntu install.
pub const SOFTHSM2_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";
const INSTALL: &str = "apt-get install -y softhsm2 opensc";

/// A fresh SoftHSM2 token labelled `label` in `dir`, with the given PINs; returns the
/// `SOFTHSM2_CONF` path that makes it the only token.
pub fn softhsm_token(dir: &Path, label: &str, so_pin: &str, user_pin: &str) -> PathBuf {
    assert!(
        Path::new(SOFTHSM2_MODULE).exists(),
        "the SoftHSM2 module {SOFTHSM2_MODULE} is missing: this test needs SoftHSM2 ({INSTALL})"
    );
    std::fs::create_dir_all(dir.join("tokens")).expect("tokens dir");
    let conf = dir.join("softhsm2.conf");
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            dir.join("tokens").display()
        ),
    )
    .expect("softhsm2.conf");
    let out = Command::new("softhsm2-util")
        .args(["--init-token", "--free", "--label", label])
        .args(["--so-pin", so_pin, "--pin", user_pin])
        .env("SOFTHSM2_CONF", &conf)
        .output()
        .unwrap_or_else(|e| panic!("softhsm2-util: {e} ({INSTALL})"));
    assert!(
        out.status.success(),
        "softhsm2-util --init-token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    conf
}

/// The labels of the private keys in token `label` (SoftHSM2 configured by `conf`), listed by
/// OpenSC's `pkcs11-tool` after logging in with `user_pin`.
pub fn private_key_labels(conf: &Path, label: &str, user_pin: &str) -> Vec<String> {
    let out = Command::new("pkcs11-tool")
        .args(["--module", SOFTHSM2_MODULE, "--token-label", label])
        .args([
            "--login",
            "--pin",
            user_pin,
            "--list-objects",
            "--type",
            "privkey",
        ])
        .env("SOFTHSM2_CONF", conf)
        .output()
        .unwrap_or_else(|e| panic!("pkcs11-tool: {e} ({INSTALL})"));
    assert!(
        out.status.success(),
        "pkcs11-tool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("label:"))
        .map(|l| l.trim().to_owned())
        .collect()
}
