//! `podca policy lint`: every error of a configuration file, each signer's rules included, and
//! the warnings worth knowing. The verdict is the loader's ([`Config::load`]): exactly what
//! `podca serve` and `podca dev` accept.

use std::path::Path;

use podca_signer::rules::lint;

use crate::config::Config;

/// What the lint found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LintReport {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub signers: usize,
    pub rules: usize,
}

/// Lints the configuration `text` read from `path` (which the loader reads again).
pub fn lint(path: &Path, text: &str) -> LintReport {
    let loaded = Config::load(path);
    let parsed = toml::from_str::<Config>(text);
    let mut report = LintReport {
        errors: Vec::new(),
        warnings: Vec::new(),
        signers: 0,
        rules: 0,
    };
    match &parsed {
        Err(e) => (report.errors).push(format!("{}: {}", path.display(), one_line(&e.to_string()))),
        Ok(config) => {
            for (name, policy) in &config.signers {
                report.signers += 1;
                report.rules += policy.rules.len();
                report.errors.extend(
                    lint::signer_errors(policy)
                        .into_iter()
                        .map(|e| format!("signer {name:?}: {e}")),
                );
                report.warnings.extend(
                    lint::policy_warnings(policy)
                        .into_iter()
                        .map(|w| format!("signer {name:?}: {w}")),
                );
            }
        }
    }
    if let Err(e) = &loaded
        && report.errors.is_empty()
    {
        // Not a signer's: [grpc], [jwt] and the like.
        (report.errors).push(one_line(&podca_signer::report::error_chain(e)));
    }
    report
}

impl LintReport {
    /// One JSON object for CI tooling.
    pub fn to_json(&self, path: &Path) -> serde_json::Value {
        serde_json::json!({
            "config": path.display().to_string(),
            "errors": self.errors,
            "warnings": self.warnings,
            "signers": self.signers,
            "rules": self.rules,
        })
    }

    /// `error: …` and `warning: …` lines, then the counts.
    pub fn to_text(&self, path: &Path) -> String {
        let mut out = String::new();
        for e in &self.errors {
            out.push_str(&format!("error: {e}\n"));
        }
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        out.push_str(&format!(
            "{}: {}, {} ({}, {})\n",
            path.display(),
            plural(self.errors.len(), "error"),
            plural(self.warnings.len(), "warning"),
            plural(self.signers, "signer"),
            plural(self.rules, "rule")
        ));
        out
    }
}

/// A multi-line library message as one line.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
