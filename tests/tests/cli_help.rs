//! What `podca` tells about itself (issue #47 item 9): a man page for every subcommand that
//! groff reads, completions that offer each fixed set of values, the global options apart from
//! a command's own, `serve --config` shown as required, every accepted spelling documented and
//! the rest refused with the list, `inspect` saying when it checked no anchors, and the docs'
//! `[dev] identities` example a configuration podca accepts.

// Test code: a panic with a message is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use podca_tests::process::podca_binary;

fn podca(args: &[&str]) -> Output {
    Command::new(podca_binary())
        .args(args)
        .env_remove("PODCA_DATA_DIR")
        .env_remove("PODCA_CONFIG")
        .env("PODCA_LOG", "warn")
        .output()
        .expect("run podca")
}

fn ok(args: &[&str]) -> String {
    let out = podca(args);
    assert!(
        out.status.success(),
        "podca {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// A usage error (exit 2): its stderr.
fn usage_error(args: &[&str]) -> String {
    let out = podca(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "podca {args:?} should be a usage error"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The subcommands `podca <path> --help` lists, `help` aside.
fn listed_subcommands(path: &[String]) -> Vec<String> {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push("--help");
    let help = ok(&args);
    let Some(commands) = help.split("Commands:\n").nth(1) else {
        return vec![];
    };
    commands
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path below `podca`, found through `--help` (not through the generator).
fn command_paths() -> Vec<Vec<String>> {
    let mut all = vec![vec![]];
    let mut at = 0;
    while at < all.len() {
        let path = all[at].clone();
        for sub in listed_subcommands(&path) {
            let mut child = path.clone();
            child.push(sub);
            all.push(child);
        }
        at += 1;
    }
    all
}

/// The roff of one `.SH` section, up to the next.
fn section<'a>(page: &'a str, name: &str) -> Option<&'a str> {
    let start = page.find(&format!(".SH {name}\n"))?;
    let body = &page[start + name.len() + 5..];
    Some(body.split("\n.SH ").next().unwrap_or(body))
}

#[test]
fn every_subcommand_has_a_man_page_with_examples_that_groff_reads() {
    let paths = command_paths();
    assert!(paths.len() > 20, "found the nested commands: {paths:?}");
    assert!(paths.contains(&vec!["ca".to_owned(), "init".to_owned()]));
    let dir = tempfile::tempdir().unwrap();
    let printed = ok(&[
        "completions",
        "--man",
        "--out-dir",
        dir.path().to_str().unwrap(),
    ]);

    let expected: BTreeSet<String> = paths
        .iter()
        .map(|p| match p.is_empty() {
            true => "podca.1".to_owned(),
            false => format!("podca-{}.1", p.join("-")),
        })
        .collect();
    let written: BTreeSet<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(written, expected, "one page per command, no other");
    assert_eq!(printed.lines().count(), expected.len(), "{printed}");

    let groff = which("groff")
        .expect("groff is needed to check the man pages (Debian: groff-base; .ci/run installs it)");
    for path in &paths {
        let command = format!("podca {}", path.join(" "));
        let command = command.trim_end();
        let file = dir.path().join(match path.is_empty() {
            true => "podca.1".to_owned(),
            false => format!("podca-{}.1", path.join("-")),
        });
        let page = std::fs::read_to_string(&file).unwrap();
        assert!(
            page.starts_with(".ie") || page.starts_with(".TH"),
            "{command}: {page}"
        );
        for name in [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "OPTIONS",
            "ENVIRONMENT",
            "FILES",
            "EXAMPLES",
        ] {
            let body = section(&page, name).unwrap_or_else(|| panic!("{command}: no {name}"));
            assert!(!body.trim().is_empty(), "{command}: {name} is empty");
        }
        // Each page's examples run its own command, hyphens as minus signs (`\-`).
        let examples = section(&page, "EXAMPLES").unwrap();
        assert!(
            examples.contains(&command.replace('-', "\\-")),
            "{command}: no example of it in\n{examples}"
        );
        // Every variable a flag reads is in ENVIRONMENT.
        let environment = section(&page, "ENVIRONMENT").unwrap();
        assert!(
            environment.contains(".B PODCA_LOG\n"),
            "{command}: {environment}"
        );

        // groff reads it: no undefined macro, bad escape or other warning, and the rendered
        // page shows the example as typed.
        let out = Command::new(&groff)
            // -P-cbou: plain text, no bold or underline.
            .args(["-k", "-man", "-Tutf8", "-P-cbou", "-ww", "-Wbreak"])
            .arg(&file)
            .output()
            .unwrap();
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && warnings.is_empty(),
            "{command}: {warnings}"
        );
        let rendered = String::from_utf8_lossy(&out.stdout);
        assert!(rendered.contains("EXAMPLES"), "{command}: {rendered}");
        assert!(rendered.contains(command), "{command}: not in\n{rendered}");
    }
}

#[test]
fn the_groff_check_sees_broken_roff() {
    let Some(groff) = which("groff") else {
        panic!("groff is needed (Debian: groff-base; .ci/run installs it)");
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.1");
    std::fs::write(
        &file,
        ".TH bad 1\n.SH NAME\n.XX undefined\n\\[nosuchglyph]\n",
    )
    .unwrap();
    let out = Command::new(groff)
        .args(["-k", "-man", "-Tutf8", "-ww", "-Wbreak"])
        .arg(&file)
        .output()
        .unwrap();
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(warnings.contains("'XX'"), "{warnings}");
    assert!(warnings.contains("nosuchglyph"), "{warnings}");
}

#[test]
fn the_top_page_alone_goes_to_standard_output() {
    let page = ok(&["completions", "--man"]);
    assert!(page.contains(".TH podca 1"), "{page}");
    assert!(
        page.contains("podca\\-ca(1)"),
        "it names the subcommand pages: {page}"
    );
    assert!(
        !page.contains("podca\\-help(1)"),
        "no page for `help`: {page}"
    );
    assert!(section(&page, "EXAMPLES").is_some(), "{page}");
    let err = usage_error(&["completions", "bash", "--out-dir", "x"]);
    assert!(
        err.contains("cannot be used with '--out-dir <DIR>'"),
        "pages or a shell's completions: {err}"
    );
}

#[test]
fn bash_completions_offer_each_fixed_set_of_values() {
    let script = ok(&["completions", "bash"]);
    for values in [
        "ecdsa-p256 ecdsa-p384 ed25519 rsa-sha256 ml-dsa-44 ml-dsa-65 ml-dsa-87",
        "RSA3072 RSA4096 ECDSAP256 ECDSAP384 ECDSAP521 ED25519 MLDSA44 MLDSA65 MLDSA87",
        "leader rendezvous",
        "verify-full disable",
        "issued denied failed",
        "text json",
    ] {
        assert!(
            script.contains(&format!("compgen -W \"{values}\"")),
            "bash does not offer {values:?}"
        );
    }
}

/// `--help` split at its headings: (heading, the lines below it).
fn help_sections(help: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = vec![];
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            sections.push((line.to_owned(), String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    sections
}

#[test]
fn global_options_are_listed_apart_from_a_command_own() {
    for args in [&["--help"][..], &["ca", "init", "--help"], &["serve", "-h"]] {
        let sections = help_sections(&ok(args));
        let body = |heading: &str| {
            sections
                .iter()
                .find(|(h, _)| h == heading)
                .map(|(_, b)| b.clone())
                .unwrap_or_else(|| panic!("{args:?}: no {heading:?} in {sections:?}"))
        };
        let (own, global) = (body("Options:"), body("Global options:"));
        for flag in ["--log <LOG>", "--log-format <LOG_FORMAT>"] {
            assert!(
                global.contains(flag),
                "{args:?}: {flag} not global: {global}"
            );
            assert!(!own.contains(flag), "{args:?}: {flag} among the own: {own}");
        }
        assert!(own.contains("--help"), "{args:?}: {own}");
    }
}

#[test]
fn serve_shows_config_as_required_and_still_reads_it_from_the_environment() {
    let help = ok(&["serve", "--help"]);
    assert!(
        help.contains("Usage: podca serve [OPTIONS] --config <CONFIG>"),
        "{help}"
    );
    let err = usage_error(&["serve"]);
    assert!(
        err.contains("the following required arguments were not provided")
            && err.contains("--config <CONFIG>"),
        "{err}"
    );
    let missing = "/nonexistent/podca.toml";
    let out = Command::new(podca_binary())
        .arg("serve")
        .env("PODCA_CONFIG", missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(missing), "PODCA_CONFIG was read: {err}");
}

#[test]
fn every_accepted_spelling_is_documented_and_others_are_refused_with_the_list() {
    let help = ok(&["ca", "init", "--help"]);
    for documented in [
        "ecdsa-p256: ECDSA P-256 with SHA-256; also p256, p-256, ecdsap256",
        "rsa-sha256: ",
        "; also rsa",
        "; also mldsa65",
    ] {
        assert!(help.contains(documented), "{documented:?} not in\n{help}");
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let ca = ca.to_str().unwrap();

    let err = usage_error(&["ca", "init", "--dir", ca, "--algorithm", "ecdsa_p256"]);
    assert!(
        err.contains("invalid value 'ecdsa_p256' for '--algorithm <ALGORITHM>'")
            && err.contains("[possible values: ecdsa-p256, ecdsa-p384, ed25519, rsa-sha256,"),
        "{err}"
    );
    assert!(!Path::new(ca).exists(), "nothing made");
    // An alias in another case: documented, so accepted.
    ok(&["ca", "init", "--dir", ca, "--algorithm", "P-256"]);
    let shown = ok(&["ca", "show", "--dir", ca]);
    assert!(shown.contains("(ecdsa-p256)"), "{shown}");

    let err = usage_error(&[
        "issue",
        "--dir",
        ca,
        "-n",
        "a",
        "--service-account",
        "b",
        "--key-type",
        "p256",
    ]);
    assert!(
        err.contains("invalid value 'p256' for '--key-type <KEY_TYPE>'")
            && err.contains("ECDSAP256"),
        "{err}"
    );
    let bundle = ok(&[
        "issue",
        "--dir",
        ca,
        "-n",
        "a",
        "--service-account",
        "b",
        "--key-type",
        "ecdsap384",
    ]);
    assert!(
        bundle.contains("BEGIN PRIVATE KEY"),
        "any case of a kubelet name"
    );

    let err = usage_error(&["ledger", "list", "--dir", ca, "--outcome", "refused"]);
    assert!(
        err.contains("[possible values: issued, denied, failed]"),
        "{err}"
    );
    let err = usage_error(&["doctor", "--lease-name", "l", "--sharding", "ring"]);
    assert!(
        err.contains("[possible values: leader, rendezvous]"),
        "{err}"
    );
}

#[test]
fn a_log_filter_tracing_cannot_read_is_a_usage_error() {
    let err = usage_error(&["--log", "podca=verbose", "bundle"]);
    assert!(
        err.contains("podca=verbose") && err.contains("expected e.g. `info`"),
        "{err}"
    );
}

#[test]
fn inspect_says_when_it_checked_no_trust_anchors() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let (ca, empty) = (ca.to_str().unwrap(), dir.path().join("empty"));
    let bundle = dir.path().join("bundle.pem");
    ok(&["ca", "init", "--dir", ca]);
    ok(&[
        "issue",
        "--dir",
        ca,
        "-n",
        "a",
        "--service-account",
        "b",
        "-o",
        bundle.to_str().unwrap(),
    ]);

    let unchecked = ok(&[
        "inspect",
        bundle.to_str().unwrap(),
        "--dir",
        empty.to_str().unwrap(),
    ]);
    let line = format!(
        "chain: not checked against trust anchors (no --ca-file and no local CA in {})",
        empty.display()
    );
    assert!(
        unchecked.lines().any(|l| l == line),
        "{line:?} not in\n{unchecked}"
    );
    assert!(!unchecked.contains("anchored in"), "{unchecked}");

    let checked = ok(&["inspect", bundle.to_str().unwrap(), "--dir", ca]);
    assert!(checked.contains("chain: anchored in"), "{checked}");
    assert!(!checked.contains("not checked"), "{checked}");
}

#[test]
fn the_docs_dev_identities_example_is_a_config_podca_accepts() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dev.md");
    let text = std::fs::read_to_string(docs).unwrap();
    let example = text
        .split("```toml\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .find(|block| block.contains("[[dev.identities]]"))
        .expect("docs/dev.md has a [[dev.identities]] example");
    let config = podca_authority::config::Config::parse(example).expect("the example parses");
    let identities: Vec<(u32, &str, &str)> = (config.dev.identities.iter())
        .map(|i| (i.uid, i.namespace.as_str(), i.service_account.as_str()))
        .collect();
    assert_eq!(
        identities,
        [(1000, "default", "default"), (1001, "shop", "web")]
    );
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}
