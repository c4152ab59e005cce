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

/// A CA whose key SoftHSM2 generated (`podca ca init --pkcs11-generate`, object `podca-ca`),
/// as most PKCS#11 end-to-end tests start: a fresh token `label` in `dir` (SO PIN 87654321, user
/// PIN 123456, written to `dir/pin`) and the CA's files in `dir/hsm-ca`.
#[derive(Debug)]
pub struct HsmCa {
    /// The `SOFTHSM2_CONF` that makes the token the only one: every podca process needs it.
    pub conf: PathBuf,
    /// The user PIN's file (`pkcs11_pin_file`).
    pub pin: PathBuf,
    /// The CA's directory (`[ca] dir`).
    pub dir: PathBuf,
}

impl HsmCa {
    pub fn init(dir: &Path, label: &str) -> HsmCa {
        let conf = softhsm_token(dir, label, "87654321", "123456");
        let pin = dir.join("pin");
        std::fs::write(&pin, "123456\n").expect("the PIN file");
        let ca = dir.join("hsm-ca");
        let out = Command::new(crate::process::podca_binary())
            .args(["ca", "init", "--dir"])
            .arg(&ca)
            .arg("--pkcs11-uri")
            .arg(format!(
                "pkcs11:token={label};object=podca-ca?module-path={SOFTHSM2_MODULE}"
            ))
            .args(["--pkcs11-generate", "--pkcs11-pin-file"])
            .arg(&pin)
            .env("SOFTHSM2_CONF", &conf)
            .env("PODCA_LOG", "warn")
            .output()
            .expect("running podca ca init");
        assert!(
            out.status.success(),
            "podca ca init --pkcs11-generate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        HsmCa { conf, pin, dir: ca }
    }

    /// The `[ca]` table for `podca serve` in `mode` (`hsm-signs-leaves` or `intermediate`).
    pub fn ca_table(&self, mode: &str) -> String {
        format!(
            "[ca]\nbackend = \"pkcs11\"\ndir = {:?}\npkcs11_pin_file = {:?}\npkcs11_mode = \"{mode}\"\n",
            self.dir.display().to_string(),
            self.pin.display().to_string()
        )
    }
}
