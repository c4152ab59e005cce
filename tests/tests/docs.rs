//! The docs hold together: every relative link and `#anchor` in README.md and docs/*.md
//! resolves, every repository path they cite exists, the configuration-key table names exactly
//! the keys the config schema accepts, and the README's tour runs as written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
