//! JWT-SVIDs with the Secret CA backend (`[ca] backend = "secret"`), `podca serve` on the API
//! emulator (issue #17 item 3): the keys live in the Secret `podca-ca-jwt` beside the CA Secret
//! (controller/src/jwt_secret.rs).
//!
//! The rotation runs on a short real schedule (20 s keys, 6 s of propagation, 8 s tokens), as in
//! tests/tests/oidc_serve.rs; the Secret's content is checked at each step, after a deletion of
//! the Secret, through write conflicts (409) injected by the emulator, and across a failover. The RBAC is podca's
//! from deploy/ (`PodcaRbac`), so a write the manifests do not grant fails here too.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use podca_proto::podca::v1::{GetJwtBundleRequest, IssueJwtSvidRequest};
use podca_tests::EmulatorConfig;
use podca_tests::cluster::{Cluster, ClusterConfig, PODCA_USER};
use podca_tests::emulator::podca_rbac::PodcaRbac;
use podca_tests::emulator::{ApiMode, Res, ServiceAccountToken, Subject, new_uid};
use podca_tests::process::{ServeProcess, podca_binary};
use podca_tests::tls::NAMESPACE;
use serde_json::Value;

const SIGNER: &str = "example.com/workload";
const CA_SECRET: &str = "podca-ca";
const JWT_SECRET: &str = "podca-ca-jwt";
const CONFIGMAP: &str = "podca-jwks";
const ISSUER: &str = "https://oidc.podca.example";
const JWT: &str = "key_rotation_seconds = 20\npropagation_seconds = 6\n\
                   max_lifetime_seconds = 8\ndefault_lifetime_seconds = 8\n";

struct World {
    cluster: Cluster,
    config: std::path::PathBuf,
    /// The CA certificate (the gRPC clients' trust anchor).
    anchors: String,
}

/// A cluster with a CA Secret made elsewhere (as cert-manager would), podca's RBAC from
/// deploy/ (`lease`: the HA overlay's Lease Role too), and a config for the Secret backend.
async fn world(lease: bool, before: impl FnOnce(&Cluster)) -> World {
    let cluster = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            ..Default::default()
        },
        podca_groups: &["system:serviceaccounts"],
        signers: &[SIGNER],
    })
    .await;
    let anchors = cluster
        .emu
        .add_ca_secret(NAMESPACE, CA_SECRET, "secret-held root");
    let rbac = PodcaRbac {
        signer_names: vec![SIGNER.into()],
        ca_secret: Some((NAMESPACE.into(), CA_SECRET.into())),
        lease_name: lease.then(|| "podca-controller".into()),
        issue_for_pod: false,
        jwks_configmap: Some((NAMESPACE.into(), CONFIGMAP.into())),
        namespace_labels: false,
        pod_facts: false,
        service_ca: false,
    };
    for rule in rbac.rules() {
        cluster.emu.grant(Subject::User(PODCA_USER.into()), rule);
    }
    before(&cluster);
    let config = cluster.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\nbackend = \"secret\"\nsecret = \"{NAMESPACE}/{CA_SECRET}\"\n\n\
             [signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n[grpc]\n{}\n\
             [ledger]\nbackend = \"none\"\n\n[jwt]\n{JWT}issuer = {ISSUER:?}\n",
            podca_tests::tls::GRPC_TLS_CONFIG
        ),
    )
    .unwrap();
    World {
        cluster,
        config,
        anchors,
    }
}

/// `podca serve` logging to `log`; with `identity`, leader election on short Lease timings.
fn serve(w: &World, log: &Path, identity: Option<&str>) -> ServeProcess {
    let mut extra = Vec::new();
    if let Some(identity) = identity {
        extra = vec![
            "--leader-elect",
            "--lease-namespace",
            NAMESPACE,
            "--lease-identity",
            identity,
            "--lease-duration",
            "4s",
            "--lease-renew-deadline",
            "3s",
            "--lease-retry-period",
            "1s",
        ];
    }
    ServeProcess::start_logged(&w.config, &w.cluster.kubeconfig, &extra, log)
}

/// The JWT key Secret as stored: (labels, type, data decoded).
fn jwt_secret(w: &World) -> Option<(Value, String, std::collections::BTreeMap<String, String>)> {
    let s = w
        .cluster
        .emu
        .get_object(Res::Secret, NAMESPACE, JWT_SECRET)?;
    let data = s["data"]
        .as_object()
        .map(|d| {
            d.iter()
                .map(|(k, v)| {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(v.as_str().unwrap())
                        .unwrap();
                    (k.clone(), String::from_utf8(bytes).unwrap())
                })
                .collect()
        })
        .unwrap_or_default();
    Some((
        s["metadata"]["labels"].clone(),
        s["type"].as_str().unwrap_or_default().to_owned(),
        data,
    ))
}

/// The keys' (kid, phase) in the Secret's state.json.
fn secret_keys(w: &World) -> Vec<(String, String)> {
    let Some((_, _, data)) = jwt_secret(w) else {
        return Vec::new();
    };
    let state: Value = serde_json::from_str(&data["state.json"]).unwrap();
    state["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["kid"].as_str().unwrap().to_owned(),
                k["phase"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Waits until the Secret's keys satisfy `f` (at most `timeout`), and returns them.
async fn wait_keys(
    w: &World,
    what: &str,
    timeout: Duration,
    f: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    let deadline = Instant::now() + timeout;
    loop {
        let keys = secret_keys(w);
        if f(&keys) {
            return keys;
        }
        assert!(
            Instant::now() < deadline,
            "the Secret never held {what}: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn bearer(w: &World) -> String {
    w.cluster
        .emu
        .add_service_account_token(ServiceAccountToken {
            namespace: "apps".into(),
            service_account: "web".into(),
            service_account_uid: new_uid(),
            audiences: vec!["podca".into()],
            expires: w.cluster.emu.now() + time::Duration::hours(1),
            pod_name: None,
            pod_uid: None,
            node_name: None,
            node_uid: None,
            credential_id: new_uid(),
        })
}

fn authorized<T>(w: &World, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", bearer(w)).parse().unwrap(),
    );
    request
}

/// A JWT-SVID for `apps/web` from `serve`'s podca.v1 IssueJwtSvid: (token, kid).
async fn issue(
    w: &World,
    serve: &ServeProcess,
    audience: &str,
) -> Result<(String, String), tonic::Status> {
    let mut client = podca_tests::tls::client(serve.grpc, &w.anchors).await;
    let svid = client
        .issue_jwt_svid(authorized(
            w,
            IssueJwtSvidRequest {
                audiences: vec![audience.to_owned()],
                ..Default::default()
            },
        ))
        .await?
        .into_inner();
    Ok((svid.token, svid.kid))
}

/// `serve`'s JWKS from podca.v1 GetJwtBundle.
async fn bundle(w: &World, serve: &ServeProcess) -> Value {
    let mut client = podca_tests::tls::client(serve.grpc, &w.anchors).await;
    let bundle = client
        .get_jwt_bundle(authorized(w, GetJwtBundleRequest::default()))
        .await
        .unwrap()
        .into_inner();
    serde_json::from_slice(&bundle.jwks).unwrap()
}

fn kids(jwks: &Value) -> Vec<String> {
    jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

/// Verifies `token` with `jsonwebtoken` and the key of its kid in `jwks`.
fn verify(token: &str, jwks: &Value, audience: &str) -> Result<Value, String> {
    let kid = jsonwebtoken::decode_header(token).unwrap().kid.unwrap();
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .ok_or_else(|| format!("kid {kid} not in the JWKS"))?;
    let mut jwk = jwk.clone();
    // The SPIFFE bundle's `use: jwt-svid` is not an RFC 7517 value jsonwebtoken knows.
    jwk.as_object_mut().unwrap().remove("use");
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(jwk).unwrap();
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&[audience]);
    validation.set_issuer(&[ISSUER]);
    validation.leeway = 0;
    validation.set_required_spec_claims(&["exp", "sub", "aud", "iss"]);
    jsonwebtoken::decode::<Value>(token, &DecodingKey::from_jwk(&jwk).unwrap(), &validation)
        .map(|d| d.claims)
        .map_err(|e| e.to_string())
}

/// The JWKS in the ConfigMap, once it holds `want` keys.
async fn configmap_jwks(w: &World, want: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(cm) = w
            .cluster
            .emu
            .get_object(Res::ConfigMap, NAMESPACE, CONFIGMAP)
        {
            let jwks: Value =
                serde_json::from_str(cm["data"]["jwks.json"].as_str().unwrap()).unwrap();
            if kids(&jwks).len() == want {
                return jwks;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the ConfigMap never held {want} keys"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The base64 body lines of every private key PEM in the Secret's data.
fn key_lines(w: &World) -> BTreeSet<String> {
    let Some((_, _, data)) = jwt_secret(w) else {
        return BTreeSet::new();
    };
    data.iter()
        .filter(|(k, _)| k.ends_with(".key"))
        .flat_map(|(_, pem)| {
            pem.lines()
                .filter(|l| !l.starts_with("-----") && l.len() > 16)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_ca_serve_signs_jwt_svids_and_rotates_its_keys_in_their_secret() {
    let w = world(false, |_| {}).await;
    let log = w.cluster.dir.path().join("serve.log");
    let serve = serve(&w, &log, None);
    // The first key: in the Secret, podca's, Opaque, active at once.
    let first = wait_keys(&w, "a first key", Duration::from_secs(30), |k| k.len() == 1).await;
    let (labels, type_, data) = jwt_secret(&w).unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "podca");
    assert_eq!(type_, "Opaque");
    let (a, phase) = &first[0];
    assert_eq!(phase, "active");
    // As a set: the kid is random, so it sorts before or after "state.json".
    assert_eq!(
        data.keys()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        [format!("{a}.key"), "state.json".to_owned()].into()
    );
    assert!(data[&format!("{a}.key")].starts_with("-----BEGIN PRIVATE KEY-----"));
    let mut seen_keys = key_lines(&w);

    // A token signed with that key verifies with jsonwebtoken and the ConfigMap's JWKS.
    let jwks = configmap_jwks(&w, 1).await;
    assert_eq!(kids(&jwks), vec![a.clone()]);
    let (token, kid) = issue(&w, &serve, "sts.amazonaws.com").await.unwrap();
    assert_eq!(&kid, a);
    let claims = verify(&token, &jwks, "sts.amazonaws.com").unwrap();
    assert_eq!(claims["sub"], "spiffe://cluster.local/ns/apps/sa/web");
    assert_eq!(
        verify(&token, &jwks, "vault").unwrap_err(),
        "InvalidAudience",
        "another audience"
    );
    let cm = w
        .cluster
        .emu
        .get_object(Res::ConfigMap, NAMESPACE, CONFIGMAP)
        .unwrap();
    let doc: Value =
        serde_json::from_str(cm["data"]["openid-configuration.json"].as_str().unwrap()).unwrap();
    assert_eq!(doc["issuer"], ISSUER);

    // `podca ca show --secret` lists the key and where it is held.
    let shown = std::process::Command::new(podca_binary())
        .args([
            "ca",
            "show",
            "--secret",
            &format!("{NAMESPACE}/{CA_SECRET}"),
        ])
        .arg("--kubeconfig")
        .arg(&w.cluster.kubeconfig)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "JWT signing keys (Secret {NAMESPACE}/{JWT_SECRET}):"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("key {a} — active (ecdsa-p256)")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "held at:   kubernetes-secret:{NAMESPACE}/{JWT_SECRET}#{a}.key"
        )),
        "{stdout}"
    );

    // ~14 s: the next key is in the Secret and published, prepared; the old one still signs.
    let both = wait_keys(&w, "a prepared key", Duration::from_secs(30), |k| {
        k.len() == 2
    })
    .await;
    assert_eq!(both[0], (a.clone(), "active".to_owned()));
    let b = both[1].0.clone();
    assert_eq!(both[1].1, "prepared");
    seen_keys.extend(key_lines(&w));
    // serve installs the keys just after its write returned.
    let deadline = Instant::now() + Duration::from_secs(5);
    while kids(&bundle(&w, &serve).await).len() != 2 {
        assert!(
            Instant::now() < deadline,
            "the prepared key is not published"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(kids(&bundle(&w, &serve).await), vec![a.clone(), b.clone()]);
    let (old_token, kid) = issue(&w, &serve, "vault").await.unwrap();
    // The Secret may have activated the new key in between: then this is its token.
    let activated = secret_keys(&w)
        .iter()
        .any(|(k, p)| k == &b && p == "active");
    assert!(kid == *a || activated, "the prepared key {b} signed early");

    // ~20 s: the new key signs; the old key's token still verifies until it expires.
    wait_keys(&w, "the new key active", Duration::from_secs(20), |k| {
        k.iter().any(|(kid, p)| kid == &b && p == "active")
    })
    .await;
    // podca serve follows the Secret within its poll: its tokens switch to the new key.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, kid) = issue(&w, &serve, "vault").await.unwrap();
        if kid == *b {
            break;
        }
        assert_eq!(kid, *a, "signed by neither key");
        assert!(
            std::time::Instant::now() < deadline,
            "still signing with {a} after the Secret activated {b}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = bundle(&w, &serve).await;
    if kids(&now).contains(a) {
        verify(&old_token, &now, "vault").unwrap();
    }

    // ~28 s: the old key's last token has expired: it is gone from the Secret and the JWKS.
    let after = wait_keys(&w, "only the new key", Duration::from_secs(20), |k| {
        k.len() == 1
    })
    .await;
    assert_eq!(after, vec![(b.clone(), "active".to_owned())]);
    let (_, _, data) = jwt_secret(&w).unwrap();
    assert!(
        !data.contains_key(&format!("{a}.key")),
        "the dropped key stays in the Secret"
    );
    let jwks = configmap_jwks(&w, 1).await;
    assert_eq!(kids(&jwks), vec![b.clone()]);
    assert!(
        verify(&old_token, &jwks, "vault")
            .unwrap_err()
            .contains("not in the JWKS")
    );

    let metrics = serve.metrics();
    for line in [
        "podca_jwt_key_secret_writes_total{op=\"create\"} 1",
        "podca_jwt_key_rotation_errors_total 0",
    ] {
        assert!(metrics.contains(line), "{line} missing in:\n{metrics}");
    }
    assert!(
        metrics.contains(&format!(
            "podca_jwt_key_not_after_timestamp_seconds{{kid=\"{b}\",state=\"active\"}}"
        )),
        "{metrics}"
    );
    let counters = w.cluster.emu.counters();
    assert_eq!((counters.validation_rejections, counters.forbidden), (0, 0));

    // The Secret's private keys never reached the log.
    drop(serve);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("JWT signing keys changed in the Secret"),
        "{text}"
    );
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    assert!(seen_keys.len() > 2);
    for line in &seen_keys {
        assert!(
            !text.contains(line.as_str()),
            "a private key line in the log"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_and_a_standby_publish_the_same_jwks_and_only_the_leader_writes() {
    let w = world(true, |_| {}).await;
    let a = serve(&w, &w.cluster.dir.path().join("a.log"), Some("a"));
    wait_leader(&w, "a", Duration::from_secs(30)).await;
    let b = serve(&w, &w.cluster.dir.path().join("b.log"), Some("b"));
    let first = wait_keys(&w, "a first key", Duration::from_secs(30), |k| k.len() == 1).await;
    // The standby follows within a poll (5 s): the same JWKS, and it signs with the same key.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (from_a, from_b) = loop {
        let (from_a, from_b) = (bundle(&w, &a).await, bundle(&w, &b).await);
        if kids(&from_b) == kids(&from_a) && kids(&from_a) == vec![first[0].0.clone()] {
            break (from_a, from_b);
        }
        assert!(
            Instant::now() < deadline,
            "the standby never followed: {from_a} {from_b}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(from_a["keys"], from_b["keys"]);
    let (token, kid) = issue(&w, &b, "vault").await.unwrap();
    assert_eq!(kid, first[0].0);
    verify(&token, &from_a, "vault").unwrap();

    // Through the rotation (prepared at ~14 s): both publish the new key; only a wrote.
    wait_keys(&w, "a prepared key", Duration::from_secs(30), |k| {
        k.len() == 2
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while kids(&bundle(&w, &b).await).len() != 2 {
        assert!(
            Instant::now() < deadline,
            "the standby never published the new key"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let leader = a.metrics();
    assert!(
        leader.contains("podca_jwt_key_secret_writes_total{op=\"create\"} 1"),
        "{leader}"
    );
    assert!(
        leader.contains("podca_jwt_key_secret_writes_total{op=\"update\"}"),
        "{leader}"
    );
    let standby = b.metrics();
    assert!(standby.contains("podca_leader 0"), "{standby}");
    assert!(
        !standby.contains("podca_jwt_key_secret_writes_total{"),
        "{standby}"
    );
    assert!(
        standby.contains("podca_jwt_key_rotation_errors_total 0"),
        "{standby}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_secret_of_that_name_is_never_overwritten() {
    let w = world(false, |cluster| {
        cluster.emu.add_secret(
            NAMESPACE,
            JWT_SECRET,
            "Opaque",
            &[("token", b"someone else's")],
        );
    })
    .await;
    let before = w
        .cluster
        .emu
        .get_object(Res::Secret, NAMESPACE, JWT_SECRET)
        .unwrap();
    let log = w.cluster.dir.path().join("serve.log");
    let serve = serve(&w, &log, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    let message = format!(
        "the Secret {NAMESPACE}/{JWT_SECRET} exists but is not podca's (no label \
         app.kubernetes.io/managed-by=podca): podca never overwrites it; delete or rename it, or \
         set [jwt] keys_secret to another name"
    );
    // Refused at start and on the next check (5 s later), each with the reason.
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.matches(&message).count() >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "no refusal logged:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = w
        .cluster
        .emu
        .get_object(Res::Secret, NAMESPACE, JWT_SECRET)
        .unwrap();
    assert_eq!(after, before, "the foreign Secret was changed");
    let metrics = serve.metrics();
    assert!(
        !metrics.contains("podca_jwt_key_secret_writes_total{"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("podca_jwt_key_rotation_errors_total 0"),
        "{metrics}"
    );
    // No key, no token: the RPC says so; certificates are unaffected.
    let err = issue(&w, &serve, "vault").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    w.cluster.file_pcr("still-issued", SIGNER).await;
    w.cluster
        .wait_issued("still-issued", Duration::from_secs(30))
        .await;
}

/// Waits until `identity` holds the leader Lease (at most `timeout`).
async fn wait_leader(w: &World, identity: &str, timeout: Duration) {
    let holder = || {
        w.cluster
            .emu
            .get_object(Res::Lease, NAMESPACE, "podca-controller")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
            .filter(|h| !h.is_empty())
    };
    let deadline = Instant::now() + timeout;
    while holder().as_deref() != Some(identity) {
        assert!(Instant::now() < deadline, "{identity} never took the Lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `podca_jwt_key_rotation_errors_total` of `serve`.
fn rotation_errors(serve: &ServeProcess) -> u64 {
    serve
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix("podca_jwt_key_rotation_errors_total "))
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_jwt_secret_is_recreated_from_the_keys_in_memory() {
    let w = world(false, |_| {}).await;
    let log = w.cluster.dir.path().join("serve.log");
    let serve = serve(&w, &log, None);
    let first = wait_keys(&w, "a first key", Duration::from_secs(30), |k| k.len() == 1).await;
    let material = key_lines(&w);
    let jwks = bundle(&w, &serve).await;
    let (token, kid) = issue(&w, &serve, "vault").await.unwrap();
    assert_eq!(kid, first[0].0);

    // Someone deletes the Secret (well before the key's rotation, prepared at ~14 s).
    assert!(
        w.cluster
            .emu
            .delete_object(Res::Secret, NAMESPACE, JWT_SECRET)
    );
    let again = wait_keys(&w, "the keys again", Duration::from_secs(12), |k| {
        !k.is_empty()
    })
    .await;
    // The same key, private key and all: nothing changed for anyone who trusts it.
    assert_eq!(again, first);
    assert_eq!(key_lines(&w), material);
    let (labels, type_, _) = jwt_secret(&w).unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "podca");
    assert_eq!(type_, "Opaque");
    assert_eq!(bundle(&w, &serve).await["keys"], jwks["keys"]);
    verify(&token, &jwks, "vault").unwrap();
    let metrics = serve.metrics();
    assert!(
        metrics.contains("podca_jwt_key_secret_writes_total{op=\"create\"} 2"),
        "{metrics}"
    );
    assert_eq!(rotation_errors(&serve), 0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("the JWT key Secret was gone: re-created it from the keys in memory"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_conflicts_discard_the_step_and_nothing_is_published_before_the_secret_has_it() {
    let w = world(false, |_| {}).await;
    let log = w.cluster.dir.path().join("serve.log");
    let serve = serve(&w, &log, None);
    let first = wait_keys(&w, "a first key", Duration::from_secs(30), |k| k.len() == 1).await;
    let faults = w.cluster.emu.counters().injected_faults;
    let secret_puts = || {
        podca_tests::emulator::FaultScope::MethodPath(
            "PUT".into(),
            format!("/namespaces/{NAMESPACE}/secrets/{JWT_SECRET}"),
        )
    };
    // Every write of the prepare step (due at ~14 s) meets a 409, as when another writer or an
    // edit keeps coming between podca's read and its write: three attempts, then an error. The
    // fourth conflict meets the next check (a poll, 5 s, later).
    w.cluster.emu.inject_errors(409, 4, secret_puts());
    let deadline = Instant::now() + Duration::from_secs(30);
    while rotation_errors(&serve) == 0 {
        assert!(Instant::now() < deadline, "the conflicts never surfaced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(w.cluster.emu.counters().injected_faults, faults + 3);
    // The discarded key was never published nor used: one key everywhere.
    assert_eq!(secret_keys(&w), first);
    assert_eq!(kids(&bundle(&w, &serve).await), vec![first[0].0.clone()]);
    let (_, kid) = issue(&w, &serve, "vault").await.unwrap();
    assert_eq!(kid, first[0].0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!(
            "the Secret {NAMESPACE}/{JWT_SECRET} changed 3 times while podca wrote it (409 \
             Conflict)"
        )),
        "{text}"
    );

    // The next check meets one conflict: it reads again and writes at the second attempt, with
    // no error; the prepared key is then in the Secret, and published.
    let keys = wait_keys(&w, "a prepared key", Duration::from_secs(15), |k| {
        k.len() == 2
    })
    .await;
    assert_eq!(keys[0], first[0]);
    assert_eq!(keys[1].1, "prepared");
    assert_eq!(w.cluster.emu.counters().injected_faults, faults + 4);
    assert_eq!(rotation_errors(&serve), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while kids(&bundle(&w, &serve).await).len() != 2 {
        assert!(
            Instant::now() < deadline,
            "the prepared key was never published"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_takes_over_continues_the_rotation_from_the_secret() {
    let w = world(true, |_| {}).await;
    let mut a = serve(&w, &w.cluster.dir.path().join("a.log"), Some("a"));
    wait_leader(&w, "a", Duration::from_secs(30)).await;
    let b = serve(&w, &w.cluster.dir.path().join("b.log"), Some("b"));
    let first = wait_keys(&w, "a first key", Duration::from_secs(30), |k| k.len() == 1).await;
    let material = key_lines(&w);
    // The leader dies (SIGKILL: no hand-over) before the key's rotation is due (~14 s).
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    wait_leader(&w, "b", Duration::from_secs(20)).await;
    // b continues from the Secret: the same first key (no new one at take-over), then the
    // schedule's next step, written by b.
    assert_eq!(secret_keys(&w), first);
    let keys = wait_keys(&w, "a prepared key", Duration::from_secs(30), |k| {
        k.len() == 2
    })
    .await;
    assert_eq!(keys[0], first[0]);
    assert_eq!(keys[1].1, "prepared");
    assert!(material.is_subset(&key_lines(&w)));
    let metrics = b.metrics();
    assert!(metrics.contains("podca_leader 1"), "{metrics}");
    assert!(
        metrics.contains("podca_jwt_key_secret_writes_total{op=\"update\"} "),
        "{metrics}"
    );
    assert!(
        !metrics.contains("podca_jwt_key_secret_writes_total{op=\"create\"}"),
        "b found the Secret: {metrics}"
    );
    assert_eq!(rotation_errors(&b), 0);
    // b signs with the key the Secret marks active, and publishes both.
    let jwks = bundle(&w, &b).await;
    assert_eq!(kids(&jwks).len(), 2, "{jwks}");
    let (token, kid) = issue(&w, &b, "vault").await.unwrap();
    assert_eq!(kid, first[0].0);
    verify(&token, &jwks, "vault").unwrap();
}
