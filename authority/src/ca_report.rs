//! `podca ca show`: what one CA data directory holds, and every CA a configuration names with
//! the signers that sign with it. Text only; nothing is opened but the files (no key, no PIN).

use std::fmt::Write as _;

use podca_signer::jwt::store::JwtStore;
use podca_signer::{FileStore, StoreError, report};
use time::OffsetDateTime;

use crate::config::{CaConfig, Config};

/// One data directory: where the signing key is (`key`: its location and algorithm, when the
/// caller opened it), the published anchors, every generation, the JWT keys.
pub fn directory(
    store: &FileStore,
    key: Option<(String, String)>,
    now: OffsetDateTime,
) -> Result<String, StoreError> {
    let mut out = format!("CA data directory: {}\n", store.dir().display());
    match key {
        Some((location, algorithm)) => {
            let _ = writeln!(out, "signing key: {location} ({algorithm})");
        }
        None => {
            let place = store
                .external_key_location()?
                .unwrap_or_else(|| "a file in the directory".into());
            let _ = writeln!(out, "signing key: {place}");
        }
    }
    let _ = writeln!(
        out,
        "published trust anchors: {} in {}",
        store.roots()?.len(),
        store.root_cert_path().display()
    );
    for info in store.generations()? {
        out.push_str(&report::generation(
            &info.generation,
            Some(&info.issuing),
            &info.roots,
            now,
        ));
    }
    let (_, keys) = JwtStore::new(store.clone()).stored()?;
    if keys.is_empty() {
        out.push_str(
            "\nJWT signing keys: none here (podca dev and podca serve make them on start, with \
             the gRPC signer's CA)\n",
        );
    } else {
        let place = format!("{}/jwt", store.dir().display());
        out.push_str(&report::jwt_keys(&place, &keys));
    }
    Ok(out)
}

/// Every CA `config` uses, each with its signers, then its directory (or where its Secret is).
/// A CA several signers share is said so: a certificate of one verifies under the others'
/// bundles.
pub fn configuration(config: &Config, now: OffsetDateTime) -> String {
    let mut out = String::new();
    let groups = config.signers_by_ca();
    for (name, ca) in config.cas_in_use() {
        let signers: Vec<&str> = groups
            .iter()
            .find(|(group, _)| *group == name)
            .map(|(_, signers)| signers.clone())
            .unwrap_or_default();
        let tenants: Vec<String> = config
            .tenant_cas()
            .into_iter()
            .filter(|(_, _, ca)| *ca == name)
            .map(|(signer, tenant, _)| format!("tenant {tenant} of {signer}"))
            .collect();
        let serves: Vec<String> = signers
            .iter()
            .map(|s| (*s).to_owned())
            .chain(tenants)
            .collect();
        let table = match name {
            crate::config::DEFAULT_CA_NAME => "[ca]".to_owned(),
            other => format!("[cas.{other}]"),
        };
        let _ = writeln!(
            out,
            "== CA {name:?} ({table}, backend {}): signs for {}",
            ca.backend_name(),
            match serves.is_empty() {
                true => "no signer".to_owned(),
                false => serves.join(", "),
            }
        );
        if signers.len() > 1 {
            let _ = writeln!(
                out,
                "   shared: a certificate of one of these signers verifies under the others' \
                 bundles; give each its own CA ([cas.<name>], docs/trust-domains.md)"
            );
        }
        match ca {
            CaConfig::Secret(s) => {
                let _ = writeln!(
                    out,
                    "   held in the Secret {ns}/{n}: `podca ca show --secret {ns}/{n}`",
                    ns = s.namespace,
                    n = s.name
                );
            }
            other => match other.dir() {
                Some(dir) => match directory(&FileStore::new(dir), None, now) {
                    Ok(text) => out.push_str(&text),
                    Err(e) => {
                        let _ = writeln!(out, "   {}: {e}", dir.display());
                    }
                },
                None => {
                    let _ = writeln!(out, "   no dir (podca dev places it in its data directory)");
                }
            },
        }
        out.push('\n');
    }
    out
}

/// What `podca ca init` made: the CA's subject and expiry, its roots, and where the anchors are.
/// `hsm_uri`: the key is in that token, and the CA is a self-signed root.
pub fn initialised(
    store: &FileStore,
    ca: &podca_signer::IssuingCa,
    hsm_uri: Option<&str>,
) -> String {
    let mut out = match hsm_uri {
        Some(uri) => format!(
            "CA ready in {} (key in the HSM: {uri})\n  root: {} (expires {})\n",
            store.dir().display(),
            ca.certificate().subject(),
            ca.not_after()
        ),
        None => format!(
            "CA ready in {}\n  issuing: {} (expires {})\n",
            store.dir().display(),
            ca.certificate().subject(),
            ca.not_after()
        ),
    };
    if hsm_uri.is_none() {
        for root in ca.roots() {
            let _ = writeln!(
                out,
                "  root:    {} (expires {})",
                root.subject(),
                root.not_after()
            );
        }
    }
    let _ = writeln!(out, "  trust anchors: {}", store.root_cert_path().display());
    out
}

/// `podca ca rotate`: runs the schedule once (`start`: prepare a successor now) and says what
/// it did and when the next step is due.
pub fn rotate(
    store: &FileStore,
    schedule: &podca_signer::rotation::Schedule,
    max_leaf_lifetime: time::Duration,
    start: bool,
    now: OffsetDateTime,
) -> Result<String, StoreError> {
    let steps = store.rotate(schedule, max_leaf_lifetime, start, now)?;
    let mut out = String::new();
    if steps.is_empty() {
        out.push_str("nothing to do now\n");
    }
    for step in &steps {
        let _ = writeln!(out, "{}", report::step(*step, schedule, now));
    }
    if let Some(next) = store.next_rotation_event(schedule, now)? {
        let _ = writeln!(
            out,
            "next rotation step due at {next} (run `podca ca rotate --scheduled-only`, or let \
             podca serve/dev do it)"
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podca_signer::InitOptions;

    /// Two signers with their own CAs and a third sharing one: each CA is listed with its
    /// signers and generations, and the shared one says what sharing means.
    #[test]
    fn every_ca_is_listed_with_its_signers() {
        let root = tempfile::tempdir().unwrap();
        let now = OffsetDateTime::now_utc();
        for name in ["payments", "batch"] {
            let options = InitOptions {
                name: name.into(),
                ..InitOptions::default()
            };
            FileStore::new(root.path().join(name))
                .init(&options, now)
                .unwrap();
        }
        let config = Config::parse(&format!(
            "[cas.payments]\ndir = {:?}\n[cas.batch]\ndir = {:?}\n\
             [signers.\"example.com/payments\"]\ntrust_domain = \"p.test\"\nca = \"payments\"\n\
             [signers.\"example.com/batch\"]\ntrust_domain = \"b.test\"\nca = \"batch\"\n\
             [signers.\"example.com/jobs\"]\ntrust_domain = \"b.test\"\nca = \"batch\"\n",
            root.path().join("payments"),
            root.path().join("batch"),
        ))
        .unwrap();
        let text = configuration(&config, now);
        let batch = text.find("== CA \"batch\" ([cas.batch], backend file): signs for example.com/batch, example.com/jobs");
        let payments = text.find(
            "== CA \"payments\" ([cas.payments], backend file): signs for example.com/payments",
        );
        assert!(batch.is_some() && payments.is_some(), "{text}");
        assert_eq!(text.matches("   shared:").count(), 1, "{text}");
        assert_eq!(text.matches("generation 1 — active").count(), 2, "{text}");
        // [ca] is used by no signer: not listed.
        assert!(!text.contains("[ca]"), "{text}");

        let tenants = Config::parse(&format!(
            "[cas.payments]\ndir = {:?}\n\
             [signers.\"example.com/m\"]\ntrust_domain = \"m.test\"\n\
             [signers.\"example.com/m\".tenants.payments]\nnamespaces = [\"shop\"]\n",
            root.path().join("payments"),
        ))
        .unwrap();
        let text = configuration(&tenants, now);
        assert!(
            text.contains(
                "== CA \"payments\" ([cas.payments], backend file): signs for tenant payments \
                 of example.com/m\n"
            ),
            "{text}"
        );
    }
}
