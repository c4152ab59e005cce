//! The docs hold together: every relative link and `#anchor` in README.md and docs/*.md
//! resolves, every repository path they cite exists, the configuration-key table of
//! docs/reference.md names exactly the keys the config schema accepts, and the README's tour
//! runs as written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use podca_tests::process::{DevOptions, DevProcess, podca_binary};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every docs/*.md.
fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("reading docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The lines of a Markdown text with fenced code blocks blanked (so numbering stays).
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                ""
            } else if fenced {
                ""
            } else {
                line
            }
        })
        .collect()
}

/// A line with its inline code spans removed (a run of n backticks closes on n backticks).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        let fence = "`".repeat(ticks);
        match after.find(&fence) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped, spaces
/// to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a Markdown file, with GitHub's `-1`, `-2` … for repeated headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes + 1..]);
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of `[text](target)` links on a line (inline code excluded).
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = vec![];
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].to_owned());
        rest = &after[end..];
    }
    out
}

/// Every relative link `[…](path)`, `[…](path#anchor)` and `[…](#anchor)` in README.md and
/// docs/*.md points at a file that exists and, for a Markdown file, at one of its headings.
fn broken_links(files: &[PathBuf]) -> Vec<String> {
    let mut broken = vec![];
    for file in files {
        let text = read(file);
        for (n, line) in prose_lines(&text).into_iter().enumerate() {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let dest = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().expect("a doc has a directory").join(path)
                };
                let at = format!("{}:{}: ({target})", file.display(), n + 1);
                if !dest.exists() {
                    broken.push(format!("{at}: no such file"));
                } else if !anchor.is_empty()
                    && dest.extension().is_some_and(|e| e == "md")
                    && !anchors(&read(&dest)).contains(anchor)
                {
                    broken.push(format!("{at}: no heading with that anchor"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let broken = broken_links(&doc_files());
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The checker itself finds a missing file, a missing anchor and a repeated heading's anchor.
#[test]
fn the_link_checker_finds_what_is_broken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let page = dir.path().join("page.md");
    std::fs::write(
        &page,
        "# Title\n\n## Twice\n\n## Twice\n\n## `podca serve` (the signer)\n\n\
         [ok](#twice-1) [ok](#podca-serve-the-signer) [ok](page.md#title) `[code](#no)`\n\
         [bad](#twice-2) [bad](gone.md) [bad](page.md#nowhere)\n\
         ```\n[fenced](#no)\n```\n",
    )
    .expect("writing the page");
    let broken = broken_links(&[page]);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].ends_with("(#twice-2): no heading with that anchor"));
    assert!(broken[1].ends_with("(gone.md): no such file"));
    assert!(broken[2].ends_with("(page.md#nowhere): no heading with that anchor"));
}

/// The repository's top-level directories: a path a doc cites starting with one of them must
/// exist.
const CITED_ROOTS: &[&str] = &[
    "signer/",
    "authority/",
    "grpc/",
    "controller/",
    "src/",
    "proto/",
    "tests/",
    "deploy/",
    "docs/",
    "fuzz/",
    ".ci/",
];

/// The repository paths cited on a line (`signer/src/policy.rs`, `deploy/base/`…), except
/// globs and templates (`tests/tests/grpc_*.rs`, `generations/<n>/`) and kubectl's
/// `deploy/NAME` object references.
fn cited_paths(line: &str) -> Vec<String> {
    let path_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    let mut out = vec![];
    let bytes: Vec<(usize, char)> = line.char_indices().collect();
    let mut i = 0;
    while i < bytes.len() {
        let (at, c) = bytes[i];
        let boundary =
            i == 0 || !(path_char(bytes[i - 1].1) || matches!(bytes[i - 1].1, '<' | '>' | '$'));
        if boundary && CITED_ROOTS.iter().any(|r| line[at..].starts_with(r)) {
            let mut j = i;
            while j < bytes.len() && path_char(bytes[j].1) {
                j += 1;
            }
            let end = bytes.get(j).map_or(line.len(), |b| b.0);
            let next = bytes.get(j).map(|b| b.1);
            let token = line[at..end].trim_end_matches(['.', '-']);
            let kubectl_object = token.starts_with("deploy/")
                && token.matches('/').count() == 1
                && !token.contains('.')
                && line.contains("kubectl");
            if !matches!(next, Some('*' | '<' | '{')) && !kubectl_object {
                out.push(token.to_owned());
            }
            i = j;
        } else {
            i += 1;
        }
        let _ = c;
    }
    out
}

#[test]
fn every_cited_repository_path_exists() {
    let root = repo_root();
    let mut missing = vec![];
    let mut cited = 0;
    for file in doc_files() {
        let text = read(&file);
        for (n, line) in prose_lines(&text).into_iter().enumerate() {
            for path in cited_paths(line) {
                cited += 1;
                if !root.join(&path).exists() {
                    missing.push(format!("{}:{}: {path}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(
        cited > 200,
        "only {cited} cited paths found: is the scanner broken?"
    );
    assert!(
        missing.is_empty(),
        "cited paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_path_scanner_reads_citations_as_meant() {
    assert_eq!(
        cited_paths("see `signer/src/policy.rs`, deploy/base/ and tests/tests/grpc_*.rs."),
        ["signer/src/policy.rs", "deploy/base/"]
    );
    assert_eq!(
        cited_paths("kubectl rollout status deploy/podca; /etc/podca/x.toml; ../docs/a.md"),
        Vec::<String>::new()
    );
    assert_eq!(cited_paths("deploy/Dockerfile."), ["deploy/Dockerfile"]);
}

/// The command lines of the README's tour: every ```sh block of its "A 5-minute tour" section,
/// comments dropped and `\` continuations joined.
fn tour_commands(readme: &str) -> Vec<String> {
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("A 5-minute tour"))
        .expect("the README has a section \"A 5-minute tour\"");
    let mut commands = vec![];
    for block in section.split("```sh\n").skip(1) {
        let body = block.split("```").next().unwrap_or_default();
        let mut pending = String::new();
        for line in body.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(start) => pending.push_str(start),
                None => {
                    pending.push_str(line);
                    commands.push(std::mem::take(&mut pending));
                }
            }
        }
        assert!(
            pending.is_empty(),
            "a tour command ends with `\\`: {pending}"
        );
    }
    commands
}

/// Runs the README's tour as a reader would, against a temporary home directory: the first
/// command (`cargo run --release -- dev`) becomes the debug `podca dev` the other tests run, with
/// its data directory where the README says (`~/.local/share/podca`) and a free port in place of
/// 127.0.0.1:8443; every other command runs as written through `sh`, with `podca` on `PATH`,
/// and must succeed. Editing the tour in the README changes what runs here.
#[test]
fn the_readme_tour_runs_as_written() {
    let commands = tour_commands(&read(&repo_root().join("README.md")));
    let (first, rest) = commands.split_first().expect("the tour has commands");
    assert_eq!(
        first, "cargo run --release -- dev",
        "the tour starts podca dev"
    );
    assert!(rest.len() >= 5, "the tour has lost commands: {rest:#?}");

    // Inside the checkout, so that `cargo run -p …` finds the workspace: under its `target/`
    // (ignored by git), which is not where the build went if CARGO_TARGET_DIR points elsewhere.
    let scratch = repo_root().join("target");
    std::fs::create_dir_all(&scratch).expect("creating target/");
    let work = tempfile::tempdir_in(&scratch).expect("tempdir");
    let home = work.path().join("home");
    let data_dir = home.join(".local/share/podca");
    std::fs::create_dir_all(&data_dir).expect("creating the data directory");
    let dev = DevProcess::start_with(DevOptions {
        data_dir: Some(data_dir.clone()),
        socket_outside: false,
        ..DevOptions::default()
    });

    let podca = podca_binary();
    let cargo = PathBuf::from(env!("CARGO"));
    let mut path = vec![
        podca.parent().expect("podca has a directory").to_owned(),
        cargo.parent().expect("cargo has a directory").to_owned(),
    ];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let real_home = PathBuf::from(std::env::var_os("HOME").expect("HOME is set"));
    let cargo_home =
        std::env::var_os("CARGO_HOME").map_or_else(|| real_home.join(".cargo"), PathBuf::from);
    for command in rest {
        let command = command.replace("127.0.0.1:8443", &dev.grpc.to_string());
        let out = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .current_dir(work.path())
            .env("HOME", &home)
            .env("PATH", std::env::join_paths(&path).expect("a PATH"))
            .env("CARGO_HOME", &cargo_home)
            .env("PODCA_LOG", "warn")
            .env_remove("PODCA_DATA_DIR")
            .env_remove("XDG_DATA_HOME")
            .env_remove("PODCA_CONFIG")
            .output()
            .expect("running sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the tour's `{command}` failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        if command.contains("--example spiffe-client") {
            assert!(
                stdout.contains("X.509-SVID spiffe://podca.dev.local/ns/default/sa/default")
                    && stdout.contains("JWT-SVID spiffe://"),
                "the SPIFFE client got no SVIDs:\n{stdout}"
            );
        }
    }
    // The tour's `podca ca rotate` prepared generation 2: both roots are the anchors now.
    assert!(
        std::fs::read_to_string(data_dir.join("root.pem"))
            .expect("the anchors")
            .matches("BEGIN CERTIFICATE")
            .count()
            == 2,
        "after the tour's rotation both roots are published"
    );
    assert!(dev.stop().success());
}

/// One step from a table of the config to a child: a key, the element of an array of tables
/// (`[[…]]`), or an entry of a map keyed by name (`[signers."<name>"]`).
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Element,
    Entry,
}

/// A TOML document with the table at `path` holding only the key `zzz_probe`.
fn probe_document(path: &[Step]) -> toml::Value {
    fn build(path: &[Step]) -> toml::Value {
        let Some((step, rest)) = path.split_first() else {
            let mut probe = toml::map::Map::new();
            probe.insert("zzz_probe".into(), toml::Value::Integer(1));
            return toml::Value::Table(probe);
        };
        match step {
            Step::Key(key) => {
                let mut table = toml::map::Map::new();
                table.insert(key.clone(), build(rest));
                toml::Value::Table(table)
            }
            Step::Element => toml::Value::Array(vec![build(rest)]),
            Step::Entry => {
                let mut table = toml::map::Map::new();
                table.insert("example".into(), build(rest));
                toml::Value::Table(table)
            }
        }
    }
    build(path)
}

/// What the config schema says about the table at `path`: the fields serde lists when it meets
/// the unknown key (`deny_unknown_fields`), or, for something that is not a struct, the error.
fn probe(path: &[Step]) -> Result<Vec<String>, String> {
    let error = match probe_document(path).try_into::<podca_authority::config::Config>() {
        Ok(_) => return Err("accepted an unknown key".into()),
        Err(e) => e.to_string(),
    };
    let Some(at) = error.find("unknown field `zzz_probe`") else {
        return Err(error);
    };
    let rest = &error[at..];
    if rest.contains("there are no fields") {
        return Ok(vec![]);
    }
    let expected = rest
        .split_once("expected ")
        .map(|(_, e)| e.lines().next().unwrap_or_default())
        .ok_or_else(|| error.clone())?;
    Ok(expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect())
}

/// Every key the config accepts, as a dotted path (`grpc.listen`, `signers.<name>.rules[].name`),
/// found by walking the schema with [`probe`]: nothing here lists the keys by hand.
fn accepted_config_keys() -> BTreeSet<String> {
    fn name(path: &[Step]) -> String {
        let mut out = String::new();
        for step in path {
            match step {
                Step::Key(k) if out.is_empty() => out.push_str(k),
                Step::Key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Step::Element => out.push_str("[]"),
                Step::Entry => out.push_str(".<name>"),
            }
        }
        out
    }
    fn walk(path: Vec<Step>, keys: &mut BTreeSet<String>) {
        let fields = probe(&path).unwrap_or_else(|e| panic!("{}: {e}", name(&path)));
        for field in fields {
            let mut child = path.clone();
            child.push(Step::Key(field));
            match probe(&child) {
                Ok(_) => walk(child, keys),
                Err(e) if e.contains("expected a sequence") => {
                    child.push(Step::Element);
                    if probe(&child).is_ok() {
                        walk(child, keys);
                    } else {
                        child.pop();
                        keys.insert(name(&child));
                    }
                }
                Err(_) => {
                    child.push(Step::Entry);
                    if probe(&child).is_ok() {
                        walk(child, keys);
                    } else {
                        child.pop();
                        keys.insert(name(&child));
                    }
                }
            }
        }
    }
    let mut keys = BTreeSet::new();
    walk(vec![], &mut keys);
    keys
}

/// The keys the reference table names, each with how many rows name it.
fn documented_config_keys(reference: &str) -> BTreeMap<String, usize> {
    let section = reference
        .split("\n## ")
        .find(|s| s.starts_with("Configuration keys\n"))
        .expect("docs/reference.md has a section \"Configuration keys\"");
    let mut keys = BTreeMap::new();
    for line in section
        .lines()
        .skip_while(|l| *l != "| Key | Default | Meaning |")
        .skip(2)
        .take_while(|l| l.starts_with('|'))
    {
        let cell = line
            .trim_start_matches('|')
            .split(" | ")
            .next()
            .unwrap_or_default();
        *keys
            .entry(cell.trim().trim_matches('`').to_owned())
            .or_default() += 1;
    }
    keys
}

fn config_table_problems(reference: &str, accepted: &BTreeSet<String>) -> Vec<String> {
    let documented = documented_config_keys(reference);
    let mut problems = vec![];
    for key in accepted {
        if !documented.contains_key(key) {
            problems.push(format!("{key}: accepted by the config, no row"));
        }
    }
    for (key, rows) in &documented {
        if !accepted.contains(key) {
            problems.push(format!("{key}: a row, but the config accepts no such key"));
        } else if *rows > 1 {
            problems.push(format!("{key}: {rows} rows"));
        }
    }
    problems
}

#[test]
fn the_config_reference_names_exactly_the_accepted_keys() {
    let accepted = accepted_config_keys();
    // The walk reaches every level: plain tables, maps of tables, arrays of tables in maps.
    for key in [
        "grpc.listen",
        "ca.pkcs11_pin_file",
        "cas.<name>.secret",
        "signers.<name>.trust_domain",
        "signers.<name>.rules[].require",
        "signers.<name>.tenants.<name>.rules[].deny",
        "federation[].trust_domain",
        "ledger.log.origin",
    ] {
        assert!(
            accepted.contains(key),
            "the schema walk missed {key}: {accepted:#?}"
        );
    }
    let problems = config_table_problems(&read(&repo_root().join("docs/reference.md")), &accepted);
    assert!(
        problems.is_empty(),
        "docs/reference.md's configuration keys and the config schema disagree:\n{}",
        problems.join("\n")
    );
}

/// A row dropped, a row for a key that does not exist and a key the schema would newly accept
/// are each caught.
#[test]
fn a_broken_config_reference_is_caught() {
    let reference = read(&repo_root().join("docs/reference.md"));
    let accepted = accepted_config_keys();
    let dropped: String = reference
        .lines()
        .filter(|l| !l.starts_with("| `grpc.max_dns_names` |"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        config_table_problems(&dropped, &accepted),
        ["grpc.max_dns_names: accepted by the config, no row"]
    );
    let invented = reference.replace(
        "| `grpc.max_dns_names` |",
        "| `grpc.max_dns_name` | 1 | x |\n| `grpc.max_dns_names` |",
    );
    assert_eq!(
        config_table_problems(&invented, &accepted),
        ["grpc.max_dns_name: a row, but the config accepts no such key"]
    );
    let mut grown = accepted.clone();
    grown.insert("grpc.new_key".into());
    assert_eq!(
        config_table_problems(&reference, &grown),
        ["grpc.new_key: accepted by the config, no row"]
    );
}
