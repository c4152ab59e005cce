//! The podca config: the files in deploy/, and the one the Deployment runs with (the
//! mounted ConfigMap key `--config` names), read by podca's own parser.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use podca_authority::config::{CaConfig, Config, DEFAULT_CA_NAME, Pkcs11Ca};
use podca_authority::ledger::config::{LedgerBackend, PostgresTls};
use podca_signer::backend::PinSource;

use crate::objects::{args, flag, mount_path, pod_spec, podca_container, the_deployment, volume};
use crate::render::repo_root;
use crate::strict::{Rendered, parse_overlay};
use crate::{NAMESPACE, OVERLAYS};

/// The config file the Deployment runs with: the mounted ConfigMap's key named by --config.
pub fn config_text(r: &Rendered) -> String {
    let d = the_deployment(r);
    let c = podca_container(d);
    let config_path = flag(&args(c), "--config").expect("podca serve gets --config");
    let mount = mount_path(c, "config");
    let key = Path::new(&config_path)
        .strip_prefix(&mount)
        .unwrap_or_else(|_| panic!("--config {config_path} is not under the config mount {mount}"))
        .to_str()
        .unwrap()
        .to_string();
    let cm_name = volume(d, "config")
        .config_map
        .as_ref()
        .expect("the config volume is a ConfigMap")
        .name
        .clone();
    let cm = r
        .config_maps
        .iter()
        .find(|cm| cm.metadata.name.as_deref() == Some(&cm_name))
        .unwrap_or_else(|| {
            panic!("the Deployment mounts ConfigMap {cm_name}, which is not rendered")
        });
    cm.data
        .as_ref()
        .and_then(|d| d.get(&key))
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {key}"))
        .clone()
}

/// The rendered config, read by podca's own parser: an unknown key or a bad value fails.
pub fn config(r: &Rendered) -> Config {
    Config::parse(&config_text(r))
        .unwrap_or_else(|e| panic!("the ConfigMap's config.toml is not a podca config: {e:#}"))
}

/// The config files as written: deploy/base/config.toml and every overlay's own config.toml.
pub fn config_files() -> Vec<PathBuf> {
    let mut files = vec![repo_root().join("deploy/base/config.toml")];
    for overlay in std::fs::read_dir(repo_root().join("deploy/overlays")).unwrap() {
        let file = overlay.unwrap().path().join("config.toml");
        if file.exists() {
            files.push(file);
        }
    }
    files.sort();
    files
}

#[test]
fn every_config_file_is_a_podca_config() {
    let files = config_files();
    assert!(
        files.len() >= 2,
        "the base and the hsm overlay have a config.toml: {files:?}"
    );
    for file in &files {
        Config::load(file).unwrap_or_else(|e| panic!("{e:#}"));
    }
    // The parser is the check: a misspelt key in a file that parses is an error.
    let base = std::fs::read_to_string(&files[0]).unwrap();
    assert!(base.contains("\ntoken_audience = "), "{base}");
    let typo = base.replace("\ntoken_audience = ", "\ntoken_audiense = ");
    let err = format!(
        "{:#}",
        Config::parse(&typo).expect_err("a typo must be caught")
    );
    assert!(err.contains("unknown field `token_audiense`"), "{err}");
}

#[test]
fn the_config_map_holds_a_valid_podca_config() {
    for overlay in OVERLAYS {
        check_config(
            &format!("overlay {overlay}"),
            overlay,
            &parse_overlay(overlay),
        );
    }
}

/// The rendered config against the Deployment: `flavour` is default, ha, hsm, two-signers or
/// tenants (the overlay, or the Helm example values file of the same name). Every CA some signer
/// or tenant uses is checked (`Config::cas_in_use`): a Secret CA is read through the API, in podca's namespace;
/// a data directory is `[ca]`'s, the `ca` volume.
pub fn check_config(what: &str, flavour: &str, r: &Rendered) {
    let cfg = config(r);
    let raw: toml::Table = toml::from_str(&config_text(r)).unwrap();
    assert!(
        raw.get("dev").is_none(),
        "{what}: [dev] is for `podca dev` only"
    );
    let d = the_deployment(r);
    let c = podca_container(d);
    let ledger_volumes = check_ledger(what, &cfg, d);
    let in_use = cfg.cas_in_use();
    // The file layout (file and pkcs11 backends): `[ca] dir` is the `ca` volume, a Secret
    // holding the data directory's certificates. The manifests mount no other CA directory.
    let ca_dir_items = |name: &str, ca_dir: Option<&Path>| {
        assert_eq!(
            name, DEFAULT_CA_NAME,
            "{what}: the CA {name} is a data directory; the manifests mount [ca]'s only"
        );
        let ca_mount = mount_path(c, "ca");
        assert_eq!(
            ca_dir,
            Some(Path::new(&ca_mount)),
            "{what}: [ca] dir is the CA mount"
        );
        let items: Vec<String> = volume(d, "ca")
            .secret
            .as_ref()
            .expect("the ca volume is a Secret")
            .items
            .iter()
            .flatten()
            .map(|i| i.path.clone())
            .collect();
        assert!(
            items.contains(&"state.json".to_string()),
            "{what}: state.json mounted"
        );
        assert!(items.contains(&"generations/1/issuing.pem".to_string()));
        assert!(items.contains(&"generations/1/root.pem".to_string()));
        items
    };
    // The hsm flavour's CA is in the HSM; no other flavour has one.
    assert_eq!(
        in_use
            .iter()
            .any(|(_, ca)| matches!(ca, CaConfig::Pkcs11(_))),
        flavour == "hsm",
        "{what}: a PKCS#11 CA in use"
    );
    let mut secret_names = Vec::new();
    for (name, ca) in &in_use {
        match ca {
            CaConfig::Secret(secret) => {
                // Read through the API (the Role podca-ca-secret): a Secret in podca's own
                // namespace. (Config parsing already refuses a reference that is not
                // namespace/name, a [ca] dir beside backend = secret, and two CAs on one
                // Secret.)
                assert_eq!(
                    secret.namespace, NAMESPACE,
                    "{what}: the CA {name}'s Secret is in podca's namespace"
                );
                secret_names.push(secret.name.clone());
            }
            CaConfig::File(f) => {
                let items = ca_dir_items(name, f.dir.as_deref());
                assert!(
                    items.contains(&"generations/1/issuing.key".to_string()),
                    "{what}: the file backend needs the issuing key"
                );
            }
            CaConfig::Pkcs11(p11) => {
                let items = ca_dir_items(name, p11.dir.as_deref());
                assert!(
                    !items.iter().any(|p| p.ends_with(".key")),
                    "{what}: with an HSM no key file is mounted"
                );
                let module =
                    pkcs11_module(p11).unwrap_or_else(|| panic!("{what}: no PKCS#11 module"));
                assert_module_from_image(what, &module, c);
                let PinSource::File(pin) = &p11.pin else {
                    panic!("{what}: the PIN comes from a file, got {:?}", p11.pin)
                };
                let pin_mount = mount_path(c, "pkcs11-pin");
                let rel = pin.strip_prefix(&pin_mount).expect("PIN under its mount");
                let pin_items: Vec<String> = volume(d, "pkcs11-pin")
                    .secret
                    .as_ref()
                    .expect("the PIN comes from a Secret")
                    .items
                    .iter()
                    .flatten()
                    .map(|i| i.path.clone())
                    .collect();
                assert_eq!(
                    pin_items,
                    [rel.to_str().unwrap()],
                    "{what}: the PIN file is mounted"
                );
            }
        }
    }
    // A Secret-held CA is read through the API: no CA Secret is mounted. The only Secret
    // volumes are the ledger's and, with a data-directory CA, its certificates and PIN.
    let dir_ca = in_use.iter().any(|(_, ca)| ca.dir().is_some());
    for v in pod_spec(d).volumes.iter().flatten() {
        let Some(secret) = &v.secret else { continue };
        let allowed = ledger_volumes.contains(&v.name)
            || (dir_ca && matches!(v.name.as_str(), "ca" | "pkcs11-pin"));
        assert!(
            allowed,
            "{what}: Secret volume {} (a Secret-held CA is read through the API; no Secret \
             needs mounting)",
            v.name
        );
        let mounted = secret.secret_name.clone().unwrap_or_default();
        assert!(
            !secret_names.contains(&mounted),
            "{what}: the CA Secret {mounted} is mounted as volume {}",
            v.name
        );
    }
    // Only the CAs in use are written as [ca]: an unused [ca] from the defaults would read as
    // a CA podca opens (and is granted nothing).
    if raw.contains_key("ca") {
        assert!(
            in_use.iter().any(|(name, _)| *name == DEFAULT_CA_NAME),
            "{what}: [ca] is written though no signer uses it"
        );
    }

    // Config::parse has validated every signer policy.
    assert!(!cfg.signers.is_empty(), "{what}: at least one signer");
    let signer = cfg.grpc.signer.as_deref().expect("grpc.signer");
    assert!(
        cfg.signers.contains_key(signer),
        "{what}: grpc.signer {signer} is configured"
    );
}

/// The ledger podca opens with this rendering: `none`; redb on the PersistentVolumeClaim of the
/// writable `ledger` volume, with one replica that never runs twice at once (redb is
/// single-process); or PostgreSQL with its URL file (and CA bundle) mounted read-only, each the
/// one item of its Secret volume. The names of those volumes.
pub fn check_ledger(what: &str, cfg: &Config, d: &Deployment) -> Vec<String> {
    let c = podca_container(d);
    match &cfg.ledger.backend {
        LedgerBackend::None => vec![],
        LedgerBackend::Redb { path } => {
            let path = path.as_deref().unwrap_or_else(|| {
                panic!(
                    "{what}: [ledger] backend = \"redb\" without path would put ledger.redb in \
                     [ca] dir, a read-only Secret mount: podca would not start"
                )
            });
            let mount = mount_path(c, "ledger");
            assert!(
                path.starts_with(&mount) && path != Path::new(&mount),
                "{what}: [ledger] path {} is not a file on the ledger volume (mounted at \
                 {mount})",
                path.display()
            );
            let claim = volume(d, "ledger")
                .persistent_volume_claim
                .as_ref()
                .unwrap_or_else(|| {
                    panic!("{what}: the ledger volume is not a PersistentVolumeClaim")
                });
            assert!(
                !claim.claim_name.is_empty(),
                "{what}: the ledger claim has a name"
            );
            let writable = c
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "ledger" && m.read_only != Some(true));
            assert!(writable, "{what}: the ledger volume is mounted read-only");
            assert_eq!(
                d.spec.replicas.unwrap_or(1),
                1,
                "{what}: redb is single-process: one replica only"
            );
            assert_eq!(
                d.spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
                Some("Recreate"),
                "{what}: redb is single-process: never two pods at once"
            );
            vec!["ledger".into()]
        }
        LedgerBackend::Postgres(pg) => {
            let mut files = vec![("ledger-url", pg.url_file.as_path())];
            match (&pg.ca_file, pg.tls) {
                (Some(ca), _) => files.push(("ledger-ca", ca.as_path())),
                (None, PostgresTls::VerifyFull) => {
                    panic!("{what}: [ledger] tls = \"verify-full\" without ca_file")
                }
                (None, PostgresTls::Disable) => {}
            }
            for (name, file) in &files {
                let mount = mount_path(c, name);
                let rel = file.strip_prefix(&mount).unwrap_or_else(|_| {
                    panic!(
                        "{what}: {} is not under the {name} mount {mount}",
                        file.display()
                    )
                });
                let items: Vec<String> = volume(d, name)
                    .secret
                    .as_ref()
                    .unwrap_or_else(|| panic!("{what}: {name} is a Secret volume"))
                    .items
                    .iter()
                    .flatten()
                    .map(|i| i.path.clone())
                    .collect();
                assert_eq!(
                    items,
                    [rel.to_str().unwrap()],
                    "{what}: {name} mounts {}",
                    file.display()
                );
            }
            files.iter().map(|(name, _)| name.to_string()).collect()
        }
    }
}

/// The PKCS#11 module podca loads: `[ca] pkcs11_module`, else the URI's `module-path`.
pub fn pkcs11_module(p11: &Pkcs11Ca) -> Option<PathBuf> {
    if let Some(module) = &p11.module {
        return Some(module.clone());
    }
    let uri = p11.uri.as_deref()?;
    let query = uri.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("module-path="))
        .map(PathBuf::from)
}

/// The module runs inside podca's process: it must come from the image (read-only root
/// filesystem), never from a volume that something else could write (issue #13).
pub fn assert_module_from_image(what: &str, module: &Path, c: &Container) {
    assert!(
        module.is_absolute(),
        "{what}: the module path {} is not absolute",
        module.display()
    );
    for m in c.volume_mounts.iter().flatten() {
        assert!(
            !module.starts_with(&m.mount_path),
            "{what}: the PKCS#11 module {} is on the volume {} (mounted at {}); it must come \
             from the image",
            module.display(),
            m.name,
            m.mount_path
        );
    }
}

#[test]
fn the_module_check_refuses_a_module_on_a_volume() {
    let r = parse_overlay("hsm");
    let c = podca_container(the_deployment(&r));
    let CaConfig::Pkcs11(p11) = config(&r).ca else {
        panic!("the hsm overlay runs the pkcs11 backend")
    };
    let module = pkcs11_module(&p11).expect("a module");
    assert_module_from_image("hsm", &module, c);
    let on_volume = Path::new(&mount_path(c, "pkcs11-tokens")).join("lib/libpkcs11.so");
    let caught = std::panic::catch_unwind(|| assert_module_from_image("hsm", &on_volume, c));
    let message = caught.expect_err("a module on the token volume must be refused");
    let text = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("it must come from the image"), "{text}");
}
