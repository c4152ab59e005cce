//! The arrows between podca's crates point one way: the PKI core knows no Kubernetes, gRPC or
//! async runtime; the runtime and the gRPC edge know no Kubernetes. `cargo tree` over the
//! normal (non-dev) dependencies of each crate tells, so a new dependency that breaks a rule
//! fails the build instead of quietly linking Kubernetes into `podca dev`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Every package `package` depends on, directly or not, through normal dependencies.
fn dependencies(package: &str) -> BTreeSet<String> {
    tree(package, None)
}

/// The packages `package` names in its own `[dependencies]`.
fn direct_dependencies(package: &str) -> BTreeSet<String> {
    tree(package, Some(1))
}

fn tree(package: &str, depth: Option<u32>) -> BTreeSet<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}", "-p", package, "--manifest-path"])
        .arg(&manifest)
        .args(depth.map(|d| format!("--depth={d}")))
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deps: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    // The tree always names the package itself: an empty answer means cargo tree said nothing.
    assert!(
        deps.contains(package),
        "cargo tree -p {package} named no packages"
    );
    deps
}

fn assert_free_of(package: &str, forbidden: &[&str]) {
    let deps = dependencies(package);
    let found: Vec<&&str> = forbidden.iter().filter(|f| deps.contains(**f)).collect();
    assert!(
        found.is_empty(),
        "{package} must not depend on {found:?} (see the Design section of the README)"
    );
}

#[test]
fn the_pki_core_knows_no_kubernetes_grpc_or_async_runtime() {
    assert_free_of(
        "podca-signer",
        &[
            "kube",
            "kube-client",
            "k8s-openapi",
            "tonic",
            "tokio",
            "podca-authority",
            "podca-grpc",
            "podca-controller",
        ],
    );
}

#[test]
fn the_runtime_knows_no_kubernetes_and_no_grpc() {
    assert_free_of(
        "podca-authority",
        &[
            "kube",
            "kube-client",
            "k8s-openapi",
            "tonic",
            "podca-grpc",
            "podca-controller",
        ],
    );
}

#[test]
fn the_grpc_edge_knows_no_kubernetes() {
    assert_free_of(
        "podca-grpc",
        &["kube", "kube-client", "k8s-openapi", "podca-controller"],
    );
}

#[test]
fn the_check_sees_what_it_forbids() {
    // The controller does link kube: if this failed, the checks above would pass vacuously.
    let deps = dependencies("podca-controller");
    for expected in [
        "kube",
        "k8s-openapi",
        "podca-signer",
        "podca-authority",
        "podca-grpc",
    ] {
        assert!(
            deps.contains(expected),
            "podca-controller should depend on {expected}"
        );
    }
}

#[test]
fn only_the_controller_speaks_kubernetes() {
    // The binary wires the controller in; it names no Kubernetes crate of its own.
    let binary = direct_dependencies("podca");
    assert!(
        binary.contains("podca-controller"),
        "the check sees the binary's own dependencies: {binary:?}"
    );
    for crate_name in ["kube", "kube-client", "kube-runtime", "k8s-openapi"] {
        assert!(
            !binary.contains(crate_name),
            "the podca binary must reach Kubernetes through podca-controller, not {crate_name}"
        );
    }
    for package in [
        "podca-signer",
        "podca-authority",
        "podca-grpc",
        "podca-proto",
    ] {
        assert_free_of(package, &["kube", "kube-client", "k8s-openapi"]);
    }
}

/// Lines of Rust in the binary's own source, tests included.
fn lines_under(dir: &Path) -> usize {
    let mut lines = 0;
    for entry in std::fs::read_dir(dir).expect("reading src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            lines += lines_under(&path);
        } else if path.extension().is_some_and(|e| e == "rs") {
            lines += std::fs::read_to_string(&path)
                .expect("reading a source file")
                .lines()
                .count();
        }
    }
    lines
}

/// Issue #38: the binary parses flags, composes components and prints; decisions live in the
/// library crates. A new command that needs room moves logic out first.
const BINARY_LINES_AT_MOST: usize = 2_500;

#[test]
fn the_binary_is_wiring_only() {
    // Logic lives in the crates, where serve, dev and the command line share it; the binary
    // parses flags, composes components and prints.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let lines = lines_under(&src);
    assert!(lines > 500, "counted the binary's source: {lines} lines");
    assert!(
        lines <= BINARY_LINES_AT_MOST,
        "src/ has {lines} lines; at most {BINARY_LINES_AT_MOST} (move logic into signer, \
         authority, grpc or controller)"
    );
}

/// The library crates' errors are types: no `anyhow` among their dependencies, and no function
/// outside a test module answers `Result<_, String>` (issue #38). The CLI may do either.
#[test]
fn library_errors_are_types() {
    for package in [
        "podca-signer",
        "podca-authority",
        "podca-grpc",
        "podca-controller",
    ] {
        // Directly: a third-party crate may use anyhow inside; what matters is our API.
        assert!(
            !direct_dependencies(package).contains("anyhow"),
            "{package} depends on anyhow: give its errors types"
        );
    }
    let mut found = Vec::new();
    for krate in ["signer", "authority", "grpc", "controller"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(krate)
            .join("src");
        string_results(&dir, &mut found);
    }
    assert!(
        found.is_empty(),
        "functions answering Result<_, String> (give the error a type): {found:#?}"
    );
    // The scan sees what it forbids.
    let mut probe = Vec::new();
    scan_text(
        Path::new("probe.rs"),
        "fn f() -> Result<(), String> {}\n#[cfg(test)]\nmod tests {}",
        &mut probe,
    );
    assert_eq!(probe, ["probe.rs:1"]);
}

fn string_results(dir: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("reading a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            string_results(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("reading a source file");
            scan_text(&path, &text, found);
        }
    }
}

/// `path:line` of each `-> Result<…, String>` before the file's test module (one line or
/// several: the signature is joined first).
fn scan_text(path: &Path, text: &str, found: &mut Vec<String>) {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let mut line = 1;
    let mut rest = code;
    while let Some(at) = rest.find("-> Result<") {
        line += rest[..at].matches('\n').count();
        let after = &rest[at + "-> Result<".len()..];
        // The type up to its closing '>', nested generics included.
        let mut depth = 1;
        let end = after
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '<' => 1,
                    '>' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map_or(after.len(), |(i, _)| i);
        let joined: String = after[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if joined.ends_with(", String") {
            found.push(format!("{}:{line}", path.display()));
        }
        rest = after;
    }
}
