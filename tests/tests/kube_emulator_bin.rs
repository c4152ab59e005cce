//! The `kube-emulator` binary: flags, the kubeconfigs it writes, podca's RBAC through them,
//! TokenRequest minting tokens that TokenReview accepts, and stopping on SIGTERM.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use base64::Engine as _;
use podca_tests::client::KubeClient;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kube-emulator");
const PODCA_USER: &str = "system:serviceaccount:podca-system:podca";

/// A running `kube-emulator`, killed when dropped.
struct EmulatorProcess {
    child: Child,
    dir: tempfile::TempDir,
    stdout: PathBuf,
}

impl EmulatorProcess {
    /// Start it on a free port with a workload namespace `app` and a node `node-1`, and wait
    /// for both kubeconfigs.
    fn start() -> EmulatorProcess {
        let dir = tempfile::tempdir().unwrap();
        let stdout = dir.path().join("stdout");
        let child = Command::new(BIN)
            .args(["--listen", "127.0.0.1:0", "--kubeconfig-dir"])
            .arg(dir.path().join("kube"))
            .args(["--namespace", "app", "--node", "node-1", "--issue-for-pod"])
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut p = EmulatorProcess { child, dir, stdout };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(p.kubeconfig_path("admin").exists() && p.kubeconfig_path("podca").exists()) {
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!("kube-emulator exited ({status}) before writing its kubeconfigs");
            }
            assert!(Instant::now() < deadline, "no kubeconfigs within 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    fn kubeconfig_path(&self, who: &str) -> PathBuf {
        self.dir
            .path()
            .join("kube")
            .join(format!("{who}.kubeconfig"))
    }

    fn kubeconfig(&self, who: &str) -> Kubeconfig {
        Kubeconfig::read(&self.kubeconfig_path(who))
    }

    fn client(&self, who: &str) -> KubeClient {
        let k = self.kubeconfig(who);
        KubeClient::new(&k.server, &k.token)
    }
}

impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a client takes from a kubeconfig.
#[derive(Debug)]
struct Kubeconfig {
    server: String,
    token: String,
    namespace: String,
}

impl Kubeconfig {
    fn read(path: &Path) -> Kubeconfig {
        let v: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let current = v["current-context"].as_str().unwrap();
        let context = v["contexts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == current)
            .unwrap();
        let named = |list: &str, key: &str| {
            let name = &context["context"][key];
            v[list]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == *name)
                .unwrap()
                .clone()
        };
        Kubeconfig {
            server: named("clusters", "cluster")["cluster"]["server"]
                .as_str()
                .unwrap()
                .to_string(),
            token: named("users", "user")["user"]["token"]
                .as_str()
                .unwrap()
                .to_string(),
            namespace: context["context"]["namespace"]
                .as_str()
                .unwrap()
                .to_string(),
        }
    }
}

#[tokio::test]
async fn podca_kubeconfig_carries_exactly_the_rbac_of_deploy() {
    let emu = EmulatorProcess::start();
    let k = emu.kubeconfig("podca");
    assert_eq!(k.namespace, "podca-system");
    assert_eq!(emu.kubeconfig("admin").server, k.server);
    let banner = std::fs::read_to_string(&emu.stdout).unwrap();
    assert!(
        banner.contains(&format!(
            "podca serve --kubeconfig {} --config podca.toml",
            emu.kubeconfig_path("podca").display()
        )),
        "{banner}"
    );
    assert!(
        banner.contains(&format!("serving the Kubernetes API on {}", k.server)),
        "{banner}"
    );
    // The printed TokenRequest one-liner works as printed.
    let mint = banner
        .lines()
        .find_map(|l| l.strip_prefix("mint a token:"))
        .unwrap();
    let out = Command::new("sh").args(["-c", mint]).output().unwrap();
    assert!(out.status.success(), "{mint}");
    let minted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(minted["kind"], "TokenRequest", "{minted}");
    assert_eq!(minted["spec"]["audiences"], json!(["podca"]));
    assert_eq!(
        minted["status"]["token"]
            .as_str()
            .unwrap()
            .split('.')
            .count(),
        3
    );

    let podca = emu.client("podca");

    let list = podca
        .get("/apis/certificates.k8s.io/v1/podcertificaterequests")
        .await
        .unwrap();
    assert_eq!(list.status, 200);
    assert_eq!(list.json()["kind"], "PodCertificateRequestList");

    // The Role of the secret backend names the CA Secret: podca may read it (absent: 404), not
    // delete it, and not read any other Secret.
    let secret = "/api/v1/namespaces/podca-system/secrets/podca-ca";
    assert_eq!(podca.get(secret).await.unwrap().status, 404);
    let delete = podca.delete(secret).await.unwrap();
    assert_eq!(delete.status, 403);
    assert_eq!(
        delete.json()["message"],
        format!(
            "secrets \"podca-ca\" is forbidden: User \"{PODCA_USER}\" cannot delete resource \"secrets\" in API group \"\" in the namespace \"podca-system\""
        )
    );
    let other = podca
        .get("/api/v1/namespaces/podca-system/secrets/other")
        .await
        .unwrap();
    assert_eq!(other.status, 403);

    // Pods: get (IssueForPod) and list (the Istio CA API's ImpersonatedIdentity), nothing else.
    assert_eq!(
        podca
            .get("/api/v1/namespaces/app/pods/none")
            .await
            .unwrap()
            .status,
        404
    );
    assert_eq!(
        podca
            .get("/api/v1/namespaces/app/pods?fieldSelector=spec.nodeName%3Dnode-1")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        podca
            .delete("/api/v1/namespaces/app/pods/none")
            .await
            .unwrap()
            .status,
        403
    );
}

#[tokio::test]
async fn a_token_from_token_request_passes_token_review_with_its_pod() {
    let emu = EmulatorProcess::start();
    let admin = emu.client("admin");
    let podca = emu.client("podca");
    let pod = admin
        .post(
            "/api/v1/namespaces/app/pods",
            &json!({"metadata": {"name": "app-0"}, "spec": {"nodeName": "node-1", "serviceAccountName": "default", "containers": [{"name": "app", "image": "example.invalid/app"}]}}),
        )
        .await
        .unwrap();
    assert_eq!(pod.status, 201, "{}", pod.json());
    let pod_uid = pod.json()["metadata"]["uid"].as_str().unwrap().to_string();
    let node = admin.get("/api/v1/nodes/node-1").await.unwrap().json();
    let node_uid = node["metadata"]["uid"].as_str().unwrap();

    let token_path = "/api/v1/namespaces/app/serviceaccounts/default/token";
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": ["podca"],
            "expirationSeconds": 600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "app-0", "uid": pod_uid},
        },
    });
    let minted = admin.post(token_path, &request).await.unwrap();
    assert_eq!(minted.status, 201, "{}", minted.json());
    let minted = minted.json();
    assert_eq!(minted["kind"], "TokenRequest");
    assert_eq!(minted["metadata"]["name"], "default");
    assert_eq!(minted["spec"]["audiences"], json!(["podca"]));
    let created = time::OffsetDateTime::parse(
        minted["metadata"]["creationTimestamp"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let expires = time::OffsetDateTime::parse(
        minted["status"]["expirationTimestamp"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert_eq!(expires - created, time::Duration::seconds(600));
    let token = minted["status"]["token"].as_str().unwrap();
    // A JWT whose claims podca can read without verifying (it caches a review until `exp`).
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["exp"], expires.unix_timestamp());
    assert_eq!(claims["sub"], "system:serviceaccount:app:default");
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], pod_uid.as_str());

    let review = |audience: &str| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token, "audiences": [audience]}});
    let reviews = "/apis/authentication.k8s.io/v1/tokenreviews";
    let accepted = podca.post(reviews, &review("podca")).await.unwrap();
    assert_eq!(accepted.status, 201);
    let status = &accepted.json()["status"];
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(status["audiences"], json!(["podca"]));
    assert_eq!(
        status["user"]["username"],
        "system:serviceaccount:app:default"
    );
    let extra = &status["user"]["extra"];
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        json!(["app-0"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/pod-uid"],
        json!([pod_uid])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-name"],
        json!(["node-1"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-uid"],
        json!([node_uid])
    );

    let other_audience = podca.post(reviews, &review("other")).await.unwrap().json();
    assert_eq!(other_audience["status"]["authenticated"], false);

    // kube-apiserver's refusals: too short a lifetime, a pod of another service account, a
    // pod that was recreated (another UID).
    for (spec, code, message) in [
        (
            json!({"expirationSeconds": 599}),
            422,
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes".to_string(),
        ),
        (
            json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "app-0"}}),
            400,
            "cannot bind token for serviceaccount \"other\" to pod running with different serviceaccount name.".to_string(),
        ),
        (
            json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "app-0", "uid": "0000"}}),
            409,
            "Operation cannot be fulfilled on Pod \"app-0\": the UID in the bound object reference (0000) does not match the UID in record. The object might have been deleted and then recreated".to_string(),
        ),
    ] {
        let sa = if code == 400 { "other" } else { "default" };
        if code == 400 {
            let created = admin
                .post(
                    "/api/v1/namespaces/app/serviceaccounts",
                    &json!({"metadata": {"name": "other"}}),
                )
                .await
                .unwrap();
            assert_eq!(created.status, 201);
        }
        let r = admin
            .post(
                &format!("/api/v1/namespaces/app/serviceaccounts/{sa}/token"),
                &json!({"spec": spec}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, code, "{spec}");
        assert_eq!(r.json()["message"], message, "{spec}");
    }

    // podca itself may not mint tokens.
    let refused = podca.post(token_path, &request).await.unwrap();
    assert_eq!(refused.status, 403);
    assert_eq!(
        refused.json()["message"],
        format!(
            "serviceaccounts \"default\" is forbidden: User \"{PODCA_USER}\" cannot create resource \"serviceaccounts/token\" in API group \"\" in the namespace \"app\""
        )
    );
}

#[test]
fn sigterm_stops_it() {
    let mut emu = EmulatorProcess::start();
    let kill = Command::new("kill")
        .args(["-TERM", &emu.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = emu.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let out = std::fs::read_to_string(&emu.stdout).unwrap();
    assert_eq!(out.lines().last(), Some("kube-emulator: stopped"), "{out}");
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--kubeconfig-dir", dir, "--bogus"],
            "kube-emulator: unexpected argument '--bogus' found (see --help)",
        ),
        (
            vec!["--listen", "localhost"],
            "kube-emulator: invalid value 'localhost' for '--listen <ADDR>': invalid socket address syntax (see --help)",
        ),
        (
            vec!["--kubeconfig-dir", dir, "--signer", "no-domain"],
            "kube-emulator: --signer: Invalid value: \"no-domain\": must be a fully qualified domain and path of the form 'example.com/signer-name' (see --help)",
        ),
        (
            vec!["--kubeconfig-dir", dir, "--ca-secret", "podca-ca"],
            "kube-emulator: --ca-secret \"podca-ca\": expected NAMESPACE/NAME (see --help)",
        ),
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr, format!("{needle}\n"), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let missing = Command::new(BIN).output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
    let stderr = String::from_utf8(missing.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--kubeconfig-dir <DIR>"), "{stderr}");
}
