//! OIDC discovery in `podca serve` on the API emulator (issue #17 item 4): the discovery
//! document and the JWKS over TLS verified against `podca bundle` for the documented server name
//! (`podca.podca-system.svc`), a JWT-SVID signed with podca's key verified by `jsonwebtoken`
//! with the key from that JWKS, the statuses of bad requests, plaintext refused off loopback,
//! and the JWKS ConfigMap following a key rotation.
//!
//! The rotation runs on a short real schedule (20 s keys, 6 s of propagation, 8 s tokens), as in
//! tests/tests/jwt_workload.rs. The token comes from `podca serve`'s podca.v1 `IssueJwtSvid`
//! over TLS, for a TokenReview-authenticated caller.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use podca_proto::podca::v1::IssueJwtSvidRequest;
use podca_tests::EmulatorConfig;
use podca_tests::cluster::{Cluster, ClusterConfig, PODCA_USER};
use podca_tests::emulator::podca_rbac::PodcaRbac;
use podca_tests::emulator::{ApiMode, FaultScope, Res, ServiceAccountToken, Subject, new_uid};
use podca_tests::process::{ServeProcess, free_port, podca_binary, podca_bundle, podca_ca_init};
use podca_tests::tls::{NAMESPACE, SERVER_NAME};
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const JWT: &str = "key_rotation_seconds = 20\npropagation_seconds = 6\n\
                   max_lifetime_seconds = 8\ndefault_lifetime_seconds = 8\n";
const CONFIGMAP: &str = "podca-jwks";
/// A JWKS with an attacker's key.
const FORGED_JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"forged","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0","use":"sig","alg":"ES256"}]}"#;

struct Oidc {
    serve: ServeProcess,
    cluster: Cluster,
    addr: SocketAddr,
    issuer: String,
    anchors: String,
}

fn config_text(ca_dir: &Path, grpc: &str, jwt: &str) -> String {
    format!(
        "[ca]\ndir = {:?}\n\n[signers.\"example.com/workload\"]\ntrust_domain = \
         \"cluster.local\"\n\n[grpc]\n{grpc}\n[jwt]\n{jwt}",
        ca_dir.display().to_string(),
    )
}

/// `podca serve` with a file CA, TLS (self-issued, `podca-system`), OIDC discovery on a free
/// loopback port, and podca's RBAC from deploy/ (the JWKS ConfigMap's Role included).
async fn start() -> Oidc {
    start_after(|_| {}).await
}

/// [`start`], with `before` run on the cluster before `podca serve` starts.
async fn start_after(before: impl FnOnce(&Cluster)) -> Oidc {
    let cluster = Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            ..Default::default()
        },
        podca_groups: &["system:serviceaccounts"],
        signers: &["example.com/workload"],
    })
    .await;
    let rbac = PodcaRbac {
        signer_names: vec!["example.com/workload".into()],
        ca_secret: None,
        lease_name: None,
        issue_for_pod: false,
        jwks_configmap: Some((NAMESPACE.into(), CONFIGMAP.into())),
        namespace_labels: false,
        pod_facts: false,
        service_ca: false,
    };
    for rule in rbac.rules() {
        cluster.emu.grant(Subject::User(PODCA_USER.into()), rule);
    }
    let ca_dir = cluster.dir.path().join("ca");
    podca_ca_init(&ca_dir);
    let port = free_port();
    let issuer = format!("https://{SERVER_NAME}:{port}");
    let jwt = format!("{JWT}issuer = {issuer:?}\noidc_listen = \"127.0.0.1:{port}\"\n");
    let config = cluster.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        config_text(&ca_dir, podca_tests::tls::GRPC_TLS_CONFIG, &jwt),
    )
    .unwrap();
    before(&cluster);
    let serve = ServeProcess::start(&config, &cluster.kubeconfig, &[], &[]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "OIDC discovery did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Oidc {
        serve,
        cluster,
        addr,
        issuer,
        anchors: podca_bundle(&ca_dir),
    }
}

/// A rustls client trusting only `anchors`, ALPN `http/1.1`.
fn client(anchors: &str) -> tokio_rustls::TlsConnector {
    let mut config = (*podca_tests::tls::client_config(anchors)).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// An HTTP/1.1 answer: status, head (lowercased) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// One request over TLS to `addr`, verified for `name`; `request` is the request line and any
/// extra headers (`Host` and `Connection: close` are added).
async fn https(
    addr: SocketAddr,
    anchors: &str,
    name: &str,
    request: &str,
) -> std::io::Result<Answer> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let mut tls = client(anchors).connect(name, tcp).await?;
    tls.write_all(
        format!("{request}\r\nHost: {SERVER_NAME}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    // The server closes after its answer; a missing close_notify is not our concern here.
    let _ = tls.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {raw:?}"));
    Ok(Answer {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    })
}

async fn get(o: &Oidc, path: &str) -> Answer {
    https(
        o.addr,
        &o.anchors,
        SERVER_NAME,
        &format!("GET {path} HTTP/1.1"),
    )
    .await
    .unwrap()
}

fn kids(jwks: &Value) -> Vec<String> {
    jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

/// A JWT-SVID from `podca serve`'s podca.v1 `IssueJwtSvid`, over TLS, for the
/// TokenReview-authenticated service account `apps/web`.
async fn podca_token(o: &Oidc, audience: &str) -> String {
    let token = o
        .cluster
        .emu
        .add_service_account_token(ServiceAccountToken {
            namespace: "apps".into(),
            service_account: "web".into(),
            service_account_uid: new_uid(),
            audiences: vec!["podca".into()],
            expires: o.cluster.emu.now() + time::Duration::hours(1),
            pod_name: None,
            pod_uid: None,
            node_name: None,
            node_uid: None,
            credential_id: new_uid(),
        });
    let mut client = podca_tests::tls::client(o.serve.grpc, &o.anchors).await;
    let mut request = tonic::Request::new(IssueJwtSvidRequest {
        audiences: vec![audience.to_owned()],
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    client
        .issue_jwt_svid(request)
        .await
        .unwrap()
        .into_inner()
        .token
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_and_jwks_over_verified_tls_verify_a_podca_token() {
    let o = start().await;
    let doc = get(&o, "/.well-known/openid-configuration").await;
    assert_eq!(doc.status, 200, "{doc:?}");
    assert!(
        doc.head.contains("content-type: application/json"),
        "{doc:?}"
    );
    // The refresh hint: a third of the 6 s propagation window.
    assert!(
        doc.head.contains("cache-control: public, max-age=2"),
        "{doc:?}"
    );
    let doc: Value = serde_json::from_str(&doc.body).unwrap();
    assert_eq!(doc["issuer"], o.issuer.as_str());
    assert_eq!(doc["jwks_uri"], format!("{}/keys", o.issuer));
    assert_eq!(doc["id_token_signing_alg_values_supported"][0], "ES256");

    let jwks = get(&o, "/keys").await;
    assert_eq!(jwks.status, 200, "{jwks:?}");
    assert!(
        jwks.head.contains("content-type: application/jwk-set+json"),
        "{jwks:?}"
    );
    let jwks: Value = serde_json::from_str(&jwks.body).unwrap();
    assert_eq!(jwks["keys"][0]["use"], "sig");

    // jsonwebtoken verifies podca's token with the published key, issuer and audience.
    let token = podca_token(&o, "sts.amazonaws.com").await;
    let kid = jsonwebtoken::decode_header(&token).unwrap().kid.unwrap();
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .expect("the token's key is in the JWKS");
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(jwk.clone()).unwrap();
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&["sts.amazonaws.com"]);
    validation.set_issuer(&[o.issuer.as_str()]);
    validation.set_required_spec_claims(&["exp", "sub", "aud", "iss"]);
    let claims =
        jsonwebtoken::decode::<Value>(&token, &DecodingKey::from_jwk(&jwk).unwrap(), &validation)
            .unwrap()
            .claims;
    assert_eq!(claims["sub"], "spiffe://cluster.local/ns/apps/sa/web");
    // Another audience is refused by the same verifier (it does check).
    validation.set_audience(&["vault"]);
    let refused =
        jsonwebtoken::decode::<Value>(&token, &DecodingKey::from_jwk(&jwk).unwrap(), &validation)
            .unwrap_err();
    assert_eq!(
        refused.kind(),
        &jsonwebtoken::errors::ErrorKind::InvalidAudience
    );

    // The certificate is verified: another name, or other anchors, fail the handshake.
    let wrong_name = https(
        o.addr,
        &o.anchors,
        "podca.elsewhere.svc",
        "GET /keys HTTP/1.1",
    )
    .await;
    assert!(
        matches!(
            podca_tests::tls::refused_certificate(wrong_name),
            rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. }
        ),
        "another name"
    );
    let other = {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_owned()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    };
    let foreign = https(o.addr, &other, SERVER_NAME, "GET /keys HTTP/1.1").await;
    assert_eq!(
        podca_tests::tls::refused_certificate(foreign),
        rustls::CertificateError::UnknownIssuer
    );

    // Bad requests get their precise statuses.
    let head = https(o.addr, &o.anchors, SERVER_NAME, "HEAD /keys HTTP/1.1")
        .await
        .unwrap();
    assert_eq!((head.status, head.body.as_str()), (200, ""), "{head:?}");
    let post = https(
        o.addr,
        &o.anchors,
        SERVER_NAME,
        "POST /keys HTTP/1.1\r\nContent-Length: 0",
    )
    .await
    .unwrap();
    assert_eq!(post.status, 405, "{post:?}");
    assert!(post.head.contains("allow: get, head"), "{post:?}");
    assert_eq!(get(&o, "/.well-known/jwks.json").await.status, 404);
    let body = https(
        o.addr,
        &o.anchors,
        SERVER_NAME,
        "GET /keys HTTP/1.1\r\nContent-Length: 2\r\n\r\nab",
    )
    .await
    .unwrap();
    assert_eq!(body.status, 413, "{body:?}");

    // Plaintext HTTP on the TLS listener gets no HTTP answer.
    let mut plain = TcpStream::connect(o.addr).await.unwrap();
    plain
        .write_all(b"GET /keys HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut raw)).await;
    assert!(
        !String::from_utf8_lossy(&raw).contains("HTTP/1.1 200"),
        "{raw:?}"
    );

    let metrics = o.serve.metrics();
    for line in [
        "podca_oidc_requests_total{path=\"discovery\",status=\"200\"} 1",
        "podca_oidc_requests_total{path=\"jwks\",status=\"405\"} 1",
        "podca_oidc_requests_total{path=\"other\",status=\"404\"} 1",
        "podca_oidc_requests_total{path=\"jwks\",status=\"413\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing in:\n{metrics}");
    }
}

/// The ConfigMap's JWKS, once it is podca's and holds `want` keys (at most `timeout`).
async fn configmap_jwks(o: &Oidc, want: usize, timeout: Duration) -> (Value, Value) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(cm) = o
            .cluster
            .emu
            .get_object(Res::ConfigMap, NAMESPACE, CONFIGMAP)
        {
            assert_eq!(
                cm["metadata"]["labels"]["app.kubernetes.io/managed-by"], "podca",
                "{cm:#}"
            );
            let jwks: Value =
                serde_json::from_str(cm["data"]["jwks.json"].as_str().unwrap()).unwrap();
            if kids(&jwks).len() == want {
                return (jwks, cm);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the ConfigMap {NAMESPACE}/{CONFIGMAP} never held {want} keys"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_configmap_holds_the_jwks_and_follows_a_key_rotation() {
    let o = start().await;
    let (first, cm) = configmap_jwks(&o, 1, Duration::from_secs(15)).await;
    let served: Value = serde_json::from_str(&get(&o, "/keys").await.body).unwrap();
    assert_eq!(first, served, "the ConfigMap holds exactly the served JWKS");
    let doc: Value =
        serde_json::from_str(cm["data"]["openid-configuration.json"].as_str().unwrap()).unwrap();
    assert_eq!(doc["issuer"], o.issuer.as_str());

    // The next key is published (at ~14 s) before it signs, in the ConfigMap too.
    let (both, _) = configmap_jwks(&o, 2, Duration::from_secs(30)).await;
    assert_eq!(kids(&both)[0], kids(&first)[0]);
    // Once the old key's last token has expired (~28 s), it is gone from the ConfigMap.
    let (after, after_cm) = configmap_jwks(&o, 1, Duration::from_secs(30)).await;
    assert_eq!(kids(&after), vec![kids(&both)[1].clone()]);
    // Each set podca published was signed again: its JWS verifies over it, not over the first.
    let anchors = podca_signer::CaCertificate::all_from_pem(&o.anchors).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let jws = after_cm["data"]["jwks.json.jws"].as_str().unwrap();
    let raw = after_cm["data"]["jwks.json"].as_str().unwrap();
    podca_signer::jwt::detached::verify(jws, raw.as_bytes(), &anchors, now).unwrap();
    let first_raw = cm["data"]["jwks.json"].as_str().unwrap();
    assert!(podca_signer::jwt::detached::verify(jws, first_raw.as_bytes(), &anchors, now).is_err());
    let metrics = o.serve.metrics();
    assert!(
        metrics.contains("podca_jwks_configmap_writes_total{op=\"create\"} 1"),
        "{metrics}"
    );
}

/// Issue #40 (High): the JWKS ConfigMap is a trust anchor for in-cluster verifiers, so podca
/// never stands down on its name. An attacker who can write ConfigMaps there puts a forged key
/// in first under another label, then (once podca took it back) edits podca's own object with
/// the label kept: each time podca overwrites it with the served JWKS within seconds and
/// counts a take-back.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_or_foreign_jwks_configmap_is_taken_back() {
    let forged_jwks = FORGED_JWKS;
    let foreign = serde_json::json!({
        "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "helm"}},
        "data": {"jwks.json": forged_jwks},
    });
    let o = start_after(|cluster| {
        cluster.emu.add_namespace(NAMESPACE);
        cluster.emu.seed_object(Res::ConfigMap, foreign.clone());
    })
    .await;
    let served: Value = serde_json::from_str(&get(&o, "/keys").await.body).unwrap();
    let taken_back = |n: u32| format!("podca_jwks_configmap_writes_total{{op=\"take_back\"}} {n}");
    let wait_restored = async |n: u32| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let cm = o
                .cluster
                .emu
                .get_object(Res::ConfigMap, NAMESPACE, CONFIGMAP);
            let restored = cm.as_ref().is_some_and(|cm| {
                cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "podca"
                    && serde_json::from_str::<Value>(cm["data"]["jwks.json"].as_str().unwrap_or(""))
                        .is_ok_and(|jwks| jwks == served)
            });
            if restored && o.serve.metrics().contains(&taken_back(n)) {
                return cm.unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "not taken back ({n}): {cm:#?}\n{}",
                o.serve.metrics()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let cm = wait_restored(1).await;
    assert!(!cm["data"]["jwks.json"].as_str().unwrap().contains("forged"));

    // The attacker edits podca's own object, label kept: restored again.
    let mut edited = cm.clone();
    edited["data"]["jwks.json"] = Value::String(forged_jwks.into());
    o.cluster.emu.seed_object(Res::ConfigMap, edited);
    let cm = wait_restored(2).await;
    assert!(!cm["data"]["jwks.json"].as_str().unwrap().contains("forged"));
}

/// Issue #40: while the ConfigMap on podca's name is not podca's, `/readyz` fails and a
/// Warning Event names it, for as long as the take-back is impossible (here the API server
/// refuses podca's PUT, as a missing RBAC grant or an admission webhook would); once the
/// take-back succeeds podca is ready again.
#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_jwks_configmap_fails_readyz_and_raises_an_event_until_taken_back() {
    let foreign = serde_json::json!({
        "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
        "data": {"jwks.json": FORGED_JWKS},
    });
    let o = start_after(|cluster| {
        cluster.emu.add_namespace(NAMESPACE);
        cluster.emu.seed_object(Res::ConfigMap, foreign.clone());
        cluster.emu.inject_errors(
            403,
            u64::MAX,
            FaultScope::MethodPath("PUT".into(), format!("/configmaps/{CONFIGMAP}")),
        );
    })
    .await;
    let readyz = || podca_tests::process::http_get(o.serve.admin, "/readyz");
    // Not ready, for this reason (not the controller's start).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((503, body)) = readyz()
            && body.contains("jwks-configmap")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never named the JWKS ConfigMap: {:?}",
            readyz()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let event = loop {
        let events = o.cluster.emu.list_objects(Res::Event, Some(NAMESPACE));
        if let Some(e) = events
            .into_iter()
            .find(|e| e["reason"] == "JwksConfigMapTakenBack")
        {
            break e;
        }
        assert!(Instant::now() < deadline, "no Warning Event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(event["type"], "Warning", "{event:#}");
    assert_eq!(event["regarding"]["kind"], "ConfigMap", "{event:#}");
    assert_eq!(event["regarding"]["name"], CONFIGMAP, "{event:#}");
    let note = event["note"].as_str().unwrap();
    assert!(note.contains("another writer's object"), "{note}");
    assert!(
        !note.contains("f83OJ3D2"),
        "no key material in the note: {note}"
    );
    // Still unready after more refused attempts (backoff 1 s, 2 s): the forged key is still
    // there, so podca does not say it is fine.
    let errors =
        |m: &str| podca_tests::process::metric_value(m, "podca_jwks_configmap_errors_total");
    while errors(&o.serve.metrics()) < 3.0 {
        assert!(Instant::now() < deadline, "{}", o.serve.metrics());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, body) = readyz().unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("jwks-configmap"), "{body}");
    let cm = o
        .cluster
        .emu
        .get_object(Res::ConfigMap, NAMESPACE, CONFIGMAP)
        .unwrap();
    assert!(cm["data"]["jwks.json"].as_str().unwrap().contains("forged"));
    // One Event for the one foreign object, however many attempts.
    let events = o.cluster.emu.list_objects(Res::Event, Some(NAMESPACE));
    assert_eq!(
        events
            .iter()
            .filter(|e| e["reason"] == "JwksConfigMapTakenBack")
            .map(|e| e["series"]["count"].as_i64().unwrap_or(1))
            .sum::<i64>(),
        1,
        "{events:#?}"
    );

    // The API accepts the write again: taken back, ready.
    o.cluster.emu.clear_faults();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let restored = o
            .cluster
            .emu
            .get_object(Res::ConfigMap, NAMESPACE, CONFIGMAP)
            .is_some_and(|cm| {
                cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "podca"
                    && !cm["data"]["jwks.json"].as_str().unwrap().contains("forged")
            });
        if restored && readyz().is_some_and(|(status, _)| status == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready again: {:?}\n{}",
            readyz(),
            o.serve.metrics()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        o.serve
            .metrics()
            .contains("podca_jwks_configmap_writes_total{op=\"take_back\"} 1")
    );
}

/// The verification recipe of docs/jwt.md ("The JWKS ConfigMap"), after its
/// `kubectl get` lines (the test writes `cm.json` and `ctbs.json` from the API emulator):
/// the x5c chain against the signer's ClusterTrustBundle, then the ES256 signature over the
/// exact `jwks.json` bytes, with openssl, jq and coreutils only.
const VERIFY_RECIPE: &str = r#"set -eu
signer=example.com/workload
jq -j '.data["jwks.json"]' cm.json > jwks.json
jq -j '.data["jwks.json.jws"]' cm.json > jwks.json.jws
jq -r --arg s "$signer" '.items[] | select(.spec.signerName == $s) | .spec.trustBundle' ctbs.json > bundle.pem
b64url_decode() { tr '_-' '/+' | awk '{ while (length($0) % 4) $0 = $0 "="; print }' | base64 -d; }
cut -d. -f1 jwks.json.jws | b64url_decode > header.json
jq -r '.alg, .typ' header.json
jq -r '.x5c[0]' header.json | base64 -d | openssl x509 -inform DER -out signer.pem
jq -r '.x5c[1:][]' header.json | while read -r c; do
  printf '%s' "$c" | base64 -d | openssl x509 -inform DER
done > intermediates.pem
if [ -s intermediates.pem ]; then
  openssl verify -CAfile bundle.pem -untrusted intermediates.pem signer.pem
else
  openssl verify -CAfile bundle.pem signer.pem
fi
printf '%s.%s' "$(cut -d. -f1 jwks.json.jws)" \
  "$(base64 -w0 < jwks.json | tr '+/' '-_' | tr -d '=')" > signing-input
cut -d. -f3 jwks.json.jws | b64url_decode > sig.raw
n=$(( $(wc -c < sig.raw) / 2 ))
printf 'asn1=SEQUENCE:sig\n[sig]\nr=INTEGER:0x%s\ns=INTEGER:0x%s\n' \
  "$(head -c "$n" sig.raw | xxd -p -c 256)" "$(tail -c "$n" sig.raw | xxd -p -c 256)" > sig.cnf
openssl asn1parse -genconf sig.cnf -out sig.der -noout
openssl x509 -in signer.pem -pubkey -noout > pub.pem
openssl dgst -sha256 -verify pub.pem -signature sig.der signing-input
"#;

/// Runs [`VERIFY_RECIPE`] in `dir` (holding `cm.json` and `ctbs.json`): success and output.
fn run_recipe(dir: &Path) -> (bool, String) {
    let out = std::process::Command::new("sh")
        .args(["-c", VERIFY_RECIPE])
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Issue #40: what podca publishes in the ConfigMap verifies, with openssl and the signer's
/// ClusterTrustBundle alone, as podca's: the detached JWS chains to the bundle's anchors and
/// signs the exact `jwks.json`. A forged key added to `jwks.json` (what a consumer would mount
/// before podca takes the object back) no longer verifies, nor does a JWS made with the
/// forger's own CA.
#[tokio::test(flavor = "multi_thread")]
async fn the_published_jwks_verifies_with_openssl_under_the_clustertrustbundle() {
    // docs/jwt.md shows this very recipe.
    let guide =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/jwt.md"))
            .unwrap();
    assert!(
        guide.contains(VERIFY_RECIPE),
        "docs/jwt.md's recipe differs from VERIFY_RECIPE"
    );
    let o = start().await;
    let (jwks, cm) = configmap_jwks(&o, 1, Duration::from_secs(15)).await;
    let served: Value = serde_json::from_str(&get(&o, "/keys").await.body).unwrap();
    assert_eq!(jwks, served);
    let jws = cm["data"]["jwks.json.jws"]
        .as_str()
        .expect("a JWS")
        .to_owned();
    let ctbs = serde_json::json!({"items": o.cluster.emu.list_objects(Res::Ctb, None)});
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cm.json"), cm.to_string()).unwrap();
    std::fs::write(dir.path().join("ctbs.json"), ctbs.to_string()).unwrap();
    let (ok, out) = run_recipe(dir.path());
    assert!(ok, "{out}");
    assert!(out.contains("ES256\njwk-set+jws\n"), "{out}");
    assert!(out.contains("signer.pem: OK"), "{out}");
    assert!(out.contains("Verified OK"), "{out}");
    // The bundle is the signer's: podca's anchors are what the chain ends at.
    assert_eq!(
        podca_tests::verify::pem_blocks(
            &std::fs::read_to_string(dir.path().join("bundle.pem")).unwrap()
        ),
        podca_tests::verify::pem_blocks(&o.anchors)
    );

    // A key added to jwks.json, the signature kept.
    let mut forged_cm = cm.clone();
    let mut forged: Value =
        serde_json::from_str(cm["data"]["jwks.json"].as_str().unwrap()).unwrap();
    let extra: Value = serde_json::from_str::<Value>(FORGED_JWKS).unwrap()["keys"][0].clone();
    forged["keys"].as_array_mut().unwrap().push(extra);
    forged_cm["data"]["jwks.json"] = Value::String(forged.to_string());
    std::fs::write(dir.path().join("cm.json"), forged_cm.to_string()).unwrap();
    let (ok, out) = run_recipe(dir.path());
    assert!(!ok, "{out}");
    assert!(
        out.contains("signer.pem: OK"),
        "the chain is still podca's: {out}"
    );
    assert!(out.contains("Verification failure"), "{out}");

    // The forger's own CA signing the forged set: its chain ends at no anchor of the bundle.
    let forger = podca_signer::IssuingCa::self_signed_root(
        Arc::new(podca_signer::MemoryKey::generate(podca_signer::CaAlgorithm::EcdsaP256).unwrap()),
        "podca",
        time::OffsetDateTime::now_utc() - time::Duration::minutes(1),
        time::Duration::days(1),
    )
    .unwrap();
    let theirs = podca_signer::jwt::detached::sign(
        &forger,
        forged.to_string().as_bytes(),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    forged_cm["data"]["jwks.json.jws"] = Value::String(theirs);
    std::fs::write(dir.path().join("cm.json"), forged_cm.to_string()).unwrap();
    let (ok, out) = run_recipe(dir.path());
    assert!(!ok, "{out}");
    assert!(
        out.contains("unable to get local issuer certificate")
            || out.contains("self-signed certificate")
            || out.contains("self signed certificate"),
        "{out}"
    );
    // podca's own verifier agrees on all three.
    let anchors = podca_signer::CaCertificate::all_from_pem(&o.anchors).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let raw = cm["data"]["jwks.json"].as_str().unwrap();
    podca_signer::jwt::detached::verify(&jws, raw.as_bytes(), &anchors, now).unwrap();
    assert_eq!(
        podca_signer::jwt::detached::verify(&jws, forged.to_string().as_bytes(), &anchors, now),
        Err(podca_signer::jwt::detached::DetachedJwsError::BadSignature)
    );
}

/// `podca serve` refuses to start with `config` (written next to a fresh CA), with `message`.
fn refused(grpc: &str, jwt: &str, message: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    podca_ca_init(&ca_dir);
    let config = dir.path().join("podca.toml");
    std::fs::write(&config, config_text(&ca_dir, grpc, jwt)).unwrap();
    let out = std::process::Command::new(podca_binary())
        .args(["serve", "--config"])
        .arg(&config)
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--kubeconfig",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(message), "{message:?} not in:\n{stderr}");
}

#[test]
fn plaintext_off_loopback_and_an_http_issuer_are_refused_at_start() {
    refused(
        "tls = \"off\"\nlisten = \"127.0.0.1:8443\"\n",
        "issuer = \"https://oidc.example\"\noidc_listen = \"0.0.0.0:8444\"\n",
        "[jwt] oidc_listen = 0.0.0.0:8444 is not a loopback address and [grpc] tls = \"off\"",
    );
    refused(
        "",
        "issuer = \"http://oidc.example\"\noidc_listen = \"127.0.0.1:8444\"\n",
        "[jwt] issuer \"http://oidc.example\" must be an https:// URL",
    );
    refused(
        "",
        "oidc_listen = \"127.0.0.1:8444\"\n",
        "[jwt] oidc_listen = 127.0.0.1:8444 needs [jwt] issuer",
    );
}
