//! `podca completions bash|zsh|fish` and `podca completions --man`: generated from the clap
//! definitions, each output names the subcommands (a completion script or man page that lost
//! them would be useless), and bad invocations are refused.

// Test code: a panic with a message is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use podca_tests::process::podca_binary;

fn podca(args: &[&str]) -> Output {
    Command::new(podca_binary())
        .args(args)
        .output()
        .expect("run podca")
}

fn stdout_of(args: &[&str]) -> String {
    let out = podca(args);
    assert!(
        out.status.success(),
        "podca {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn each_shell_gets_a_script_that_completes_the_subcommands() {
    // A marker of each shell's own syntax, so a script for the wrong shell fails.
    for (shell, marker) in [
        ("bash", "complete -F _podca"),
        ("zsh", "#compdef podca"),
        ("fish", "complete -c podca"),
    ] {
        let script = stdout_of(&["completions", shell]);
        assert!(
            script.contains(marker),
            "{shell}: no {marker:?} in:\n{script}"
        );
        for sub in [
            "serve",
            "issue",
            "inspect",
            "ledger",
            "policy",
            "completions",
        ] {
            assert!(script.contains(sub), "{shell}: subcommand {sub} missing");
        }
        // Flags of nested commands too.
        assert!(script.contains("leader-elect"), "{shell}: serve's flags");
        assert!(
            script.contains("namespace-labels"),
            "{shell}: policy test's flags"
        );
    }
}

#[test]
fn the_man_page_is_roff_and_lists_the_subcommands() {
    let page = stdout_of(&["completions", "--man"]);
    assert!(
        page.starts_with(".ie") || page.contains(".TH podca 1"),
        "{page}"
    );
    assert!(page.contains(".TH podca 1"), "a section 1 page: {page}");
    assert!(page.contains("A certificate authority for Kubernetes workloads"));
    for sub in ["serve", "issue", "policy", "completions"] {
        assert!(page.contains(sub), "subcommand {sub} missing:\n{page}");
    }
}

#[test]
fn a_shell_or_man_is_required_and_unknown_shells_are_refused() {
    let out = podca(&["completions"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("<SHELL>"), "{err}");
    let out = podca(&["completions", "powershell"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value 'powershell'") && err.contains("bash, zsh, fish"),
        "{err}"
    );
    let out = podca(&["completions", "bash", "--man"]);
    assert!(!out.status.success(), "a shell and --man at once");
}
