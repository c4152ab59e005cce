//! `podca token-signer` (issue #46), the real binary on its Unix socket, called by a tonic
//! client generated from the `v1.ExternalJWTSigner` proto as kube-apiserver calls it:
//!
//! * `Metadata` answers `[jwt] max_lifetime_seconds`; `FetchKeys` the data directory's key as
//!   PKIX DER with its kid; a token assembled from `Sign`'s header and signature around the
//!   claims as sent verifies with `jsonwebtoken` (not podca's code) against that key, for ES256
//!   and RS256 keys;
//! * bad claims (no `exp`, oversized, not base64url, `exp` past the maximum) are
//!   INVALID_ARGUMENT with their precise message;
//! * the socket is 0600; a caller of another uid is PERMISSION_DENIED (as root: the socket is
//!   handed to another uid, which root can still open);
//! * through a rotation on a short `[jwt]` schedule, every key `Sign` uses was published by
//!   `FetchKeys` before it signed, and the retired key stays published;
//! * `[jwt] oidc_listen`: the token signer's OIDC discovery (HTTPS with the operator's files)
//!   names the issuer and serves a JWKS with exactly `FetchKeys`' keys, and a token `Sign`
//!   made verifies with `jsonwebtoken` against the JWK fetched from it; per-method, per-outcome
//!   counts on the admin listener;
//! * with the keys in a SoftHSM2 token (`[ca] backend = "pkcs11"`): tokens verify with
//!   `jsonwebtoken` and the `openssl` command line, `pkcs11-tool` reports the key never
//!   extractable, and the data directory holds only its metadata.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use podca_proto::externaljwt::v1::external_jwt_signer_client::ExternalJwtSignerClient;
use podca_proto::externaljwt::v1::{
    FetchKeysRequest, FetchKeysResponse, MetadataRequest, SignJwtRequest,
};
use podca_tests::process::{podca_binary, unix_channel};
use podca_tests::softhsm::{SOFTHSM2_MODULE, softhsm_token};
use tonic::Code;
use tonic::transport::Channel;
use x509_parser::prelude::FromDer;

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// A running `podca token-signer`, killed on drop.
struct Signer {
    child: Child,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Signer {
    fn start(jwt: &str, extra: &[&str]) -> Signer {
        Signer::start_with("backend = \"file\"", jwt, extra, &[])
    }

    /// `ca`: the `[ca]` keys besides `dir` (the data directory, made here).
    fn start_with(ca: &str, jwt: &str, extra: &[&str], env: &[(&str, &Path)]) -> Signer {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("podca.toml");
        let data = dir.path().join("data");
        std::fs::write(
            &config,
            format!("[ca]\n{ca}\ndir = {data:?}\n\n[jwt]\n{jwt}\n"),
        )
        .unwrap();
        let socket = dir.path().join("run/signer.sock");
        let child = Command::new(podca_binary())
            .args(["token-signer", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the token signer never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        Signer { child, socket, dir }
    }

    /// `[jwt]` as given, then `[grpc]` (which the token signer reads only for its OIDC TLS).
    fn start_with_grpc(jwt: &str, grpc: &str, extra: &[&str]) -> Signer {
        Signer::start_with(
            "backend = \"file\"",
            &format!("{jwt}\n\n[grpc]\n{grpc}"),
            extra,
            &[],
        )
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    async fn client(&self) -> ExternalJwtSignerClient<Channel> {
        ExternalJwtSignerClient::new(unix_channel(&self.socket).await)
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// The claims kube-apiserver sends for a projected token, base64url as in the JWT.
fn kube_claims(lifetime: i64) -> (serde_json::Value, String) {
    let now = now();
    let claims = serde_json::json!({
        "aud": ["https://kubernetes.default.svc.cluster.local"],
        "exp": now + lifetime,
        "iat": now,
        "nbf": now,
        "iss": ISSUER,
        "jti": "6f1f1b0e-8b1a-4c55-9a3e-4c3a1f1b0e8b",
        "kubernetes.io": {
            "namespace": "default",
            "serviceaccount": {"name": "default", "uid": "0b8d2f1e-2f6c-4b43-9d6b-2b8f0f0c1a11"},
        },
        "sub": "system:serviceaccount:default:default",
    });
    let encoded = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
    (claims, encoded)
}

/// Signs `claims` and assembles the token as kube-apiserver does: header, claims as sent,
/// signature.
async fn sign(client: &mut ExternalJwtSignerClient<Channel>, claims: &str) -> String {
    let answer = client
        .sign(SignJwtRequest {
            claims: claims.to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    format!("{}.{claims}.{}", answer.header, answer.signature)
}

async fn fetch(client: &mut ExternalJwtSignerClient<Channel>) -> FetchKeysResponse {
    client
        .fetch_keys(FetchKeysRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Verifies `token` with jsonwebtoken against the PKIX DER key `FetchKeys` gave for its kid;
/// its claims.
fn verify(token: &str, keys: &FetchKeysResponse, alg: Algorithm) -> serde_json::Value {
    let header = jsonwebtoken::decode_header(token).unwrap();
    assert_eq!(header.alg, alg);
    let kid = header.kid.clone().expect("a kid");
    let key = keys
        .keys
        .iter()
        .find(|k| k.key_id == kid)
        .expect("the signing key is published");
    assert!(!key.exclude_from_oidc_discovery);
    // The SubjectPublicKeyInfo's key bits (x509-parser): the EC point, or PKCS#1 for RSA.
    let (rest, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&key.key).unwrap();
    assert!(rest.is_empty(), "PKIX DER, nothing after it");
    let bits = &spki.subject_public_key.data;
    let decoding = match alg {
        Algorithm::ES256 => DecodingKey::from_ec_der(bits),
        Algorithm::RS256 => DecodingKey::from_rsa_der(bits),
        other => panic!("{other:?}"),
    };
    let mut validation = Validation::new(alg);
    validation.set_audience(&["https://kubernetes.default.svc.cluster.local"]);
    validation.set_issuer(&[ISSUER]);
    validation.set_required_spec_claims(&["exp", "sub", "aud", "iss"]);
    jsonwebtoken::decode::<serde_json::Value>(token, &decoding, &validation)
        .unwrap()
        .claims
}

/// The header `Sign` returned: only alg, kid and typ.
fn header_of(token: &str) -> serde_json::Value {
    let header = token.split('.').next().unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_calls_verify_with_an_independent_verifier() {
    for (key_algorithm, alg) in [
        ("ecdsa-p256", Algorithm::ES256),
        ("rsa-sha256", Algorithm::RS256),
    ] {
        let signer = Signer::start(
            &format!("key_algorithm = \"{key_algorithm}\"\nmax_lifetime_seconds = 3600"),
            &[],
        );
        let mut client = signer.client().await;
        let metadata = client
            .metadata(MetadataRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(metadata.max_token_expiration_seconds, 3600);
        let keys = fetch(&mut client).await;
        assert_eq!(keys.keys.len(), 1, "{keys:?}");
        // A third of the default 900 s propagation window.
        assert_eq!(keys.refresh_hint_seconds, 300);
        let stamp = keys.data_timestamp.expect("a data timestamp").seconds;
        assert!((stamp - now()).abs() <= 5, "{stamp}");

        let (claims, encoded) = kube_claims(3600);
        let token = sign(&mut client, &encoded).await;
        assert_eq!(verify(&token, &keys, alg), claims, "{key_algorithm}");
        let header = header_of(&token);
        let fields: Vec<&String> = header.as_object().unwrap().keys().collect();
        assert_eq!(fields, ["alg", "kid", "typ"], "{header}");
        assert_eq!(header["typ"], "JWT");
        assert_eq!(header["kid"], keys.keys[0].key_id.as_str());
        // The claims are signed as sent, never re-encoded.
        assert_eq!(token.split('.').nth(1), Some(encoded.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_kube_apiserver_would_never_send_are_invalid_arguments() {
    let signer = Signer::start("max_lifetime_seconds = 600", &[]);
    let mut client = signer.client().await;
    let refused = |claims: String| {
        let mut client = client.clone();
        async move {
            client
                .sign(SignJwtRequest { claims })
                .await
                .expect_err("refused")
        }
    };
    let (mut claims, _) = kube_claims(600);
    claims.as_object_mut().unwrap().remove("exp");
    let status = refused(URL_SAFE_NO_PAD.encode(claims.to_string())).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status.message(),
        "claim \"exp\" is missing or not of its type"
    );

    let oversized = URL_SAFE_NO_PAD.encode(vec![b' '; 13_000]);
    let status = refused(oversized.clone()).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status.message(),
        format!(
            "the claims are {} bytes, over the limit of 16384",
            oversized.len()
        )
    );

    let status = refused("not*base64url".into()).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(
        status.message(),
        "the claims are not base64url (URL-safe alphabet, no padding)"
    );

    let (_, too_long) = kube_claims(3600);
    let status = refused(too_long).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().ends_with("over the maximum of 600 s"),
        "{status:?}"
    );
    // Still serving after the refusals.
    let (_, good) = kube_claims(600);
    let keys = fetch(&mut client).await;
    verify(&sign(&mut client, &good).await, &keys, Algorithm::ES256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_is_private_and_another_uid_is_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let signer = Signer::start("", &[]);
    let meta = std::fs::metadata(&signer.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    drop(signer);
    // Handing the socket to another uid takes root; root then still opens the 0600 socket of
    // another user, and only the uid check stands between it and the signer.
    if !is_root() {
        eprintln!("not root: the refusal of another uid is covered by the unit test of admit()");
        return;
    }
    let signer = Signer::start("", &["--socket-owner", "65534"]);
    let meta = std::fs::metadata(&signer.socket).unwrap();
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o777),
        (65534, 0o600)
    );
    let mut client = signer.client().await;
    let status = client
        .metadata(MetadataRequest {})
        .await
        .expect_err("root is not the configured user");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        status.message(),
        "uid 0 may not use the token signer (only uid 65534)"
    );
    let (_, claims) = kube_claims(600);
    let status = client
        .sign(SignJwtRequest { claims })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_publishes_the_next_key_before_it_signs() {
    // Keys sign for 6 s; the next is published 3 s before.
    let signer = Signer::start(
        "max_lifetime_seconds = 600\nkey_rotation_seconds = 6\npropagation_seconds = 3",
        &[],
    );
    let mut client = signer.client().await;
    let mut first_published: BTreeMap<String, Instant> = BTreeMap::new();
    let mut first_signed: BTreeMap<String, Instant> = BTreeMap::new();
    let mut signing_order: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(16);
    while Instant::now() < deadline && signing_order.len() < 3 {
        let keys = fetch(&mut client).await;
        let at = Instant::now();
        for key in &keys.keys {
            first_published.entry(key.key_id.clone()).or_insert(at);
        }
        // Well inside the key's published_until (rotation period + max lifetime).
        let (_, claims) = kube_claims(300);
        let token = sign(&mut client, &claims).await;
        let kid = header_of(&token)["kid"].as_str().unwrap().to_owned();
        // The token verifies against the keys fetched just before: its key was published.
        verify(&token, &keys, Algorithm::ES256);
        if !first_signed.contains_key(&kid) {
            first_signed.insert(kid.clone(), Instant::now());
            signing_order.push(kid.clone());
            // The retired key stays published: every kid that signed is still fetched.
            let now_published = fetch(&mut client).await;
            for old in &signing_order {
                assert!(
                    now_published.keys.iter().any(|k| &k.key_id == old),
                    "{old} left FetchKeys while tokens it signed are valid"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        signing_order.len() >= 2,
        "no rotation within 16 s: {signing_order:?}"
    );
    for kid in &signing_order[1..] {
        let published = first_published[kid];
        let signed = first_signed[kid];
        // Published for the propagation window (3 s, less the polling slack) before it signed.
        assert!(
            signed.duration_since(published) >= Duration::from_secs(2),
            "{kid} signed {:?} after it was first published",
            signed.duration_since(published)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_in_softhsm2_are_not_extractable_and_verify_with_openssl() {
    const USER_PIN: &str = "podca-token-signer-pin-2718";
    let hsm = tempfile::tempdir().unwrap();
    let conf = softhsm_token(hsm.path(), "token-signer", "podca-so-pin-8172", USER_PIN);
    let pin = hsm.path().join("user.pin");
    std::fs::write(&pin, format!("{USER_PIN}\n")).unwrap();
    let signer = Signer::start_with(
        &format!(
            "backend = \"pkcs11\"\npkcs11_uri = \"pkcs11:token=token-signer;object=podca-ca?\
             module-path={SOFTHSM2_MODULE}\"\npkcs11_pin_file = {pin:?}"
        ),
        "max_lifetime_seconds = 600",
        &[],
        &[("SOFTHSM2_CONF", &conf)],
    );
    let mut client = signer.client().await;
    let keys = fetch(&mut client).await;
    let (claims, encoded) = kube_claims(600);
    let token = sign(&mut client, &encoded).await;
    assert_eq!(verify(&token, &keys, Algorithm::ES256), claims);

    // openssl (no aws-lc, no jsonwebtoken): the signing input, the signature as DER, the key
    // FetchKeys returned as a PEM SubjectPublicKeyInfo.
    let work = tempfile::tempdir().unwrap();
    let (input, signature) = token.rsplit_once('.').unwrap();
    let signature = URL_SAFE_NO_PAD.decode(signature).unwrap();
    assert_eq!(signature.len(), 64, "ES256 is r || s");
    std::fs::write(work.path().join("input"), input).unwrap();
    std::fs::write(work.path().join("sig.der"), ecdsa_der(&signature)).unwrap();
    let pem = pem::encode(&pem::Pem::new("PUBLIC KEY", keys.keys[0].key.clone()));
    std::fs::write(work.path().join("key.pem"), pem).unwrap();
    let out = Command::new("openssl")
        .current_dir(work.path())
        .args([
            "dgst",
            "-sha256",
            "-verify",
            "key.pem",
            "-signature",
            "sig.der",
            "input",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The key is in the token, sensitive and never extractable (OpenSC's pkcs11-tool, not
    // podca, says so), and the data directory holds only its metadata.
    let out = Command::new("pkcs11-tool")
        .args(["--module", SOFTHSM2_MODULE, "--token-label", "token-signer"])
        .args([
            "--login",
            "--pin",
            USER_PIN,
            "--list-objects",
            "--type",
            "privkey",
        ])
        .env("SOFTHSM2_CONF", &conf)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("label:      podca-jwt-"), "{listed}");
    assert!(listed.contains("never extractable"), "{listed}");
    let jwt_files: Vec<String> = std::fs::read_dir(signer.data_dir().join("jwt"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(jwt_files, ["state.json"]);
}

/// A JOSE ECDSA signature (`r || s`) as the DER `SEQUENCE { INTEGER r, INTEGER s }` openssl
/// reads, encoded here rather than by podca.
fn ecdsa_der(fixed: &[u8]) -> Vec<u8> {
    let integer = |bytes: &[u8]| {
        let mut digits: Vec<u8> = bytes.iter().copied().skip_while(|b| *b == 0).collect();
        if digits.first().is_none_or(|b| b & 0x80 != 0) {
            digits.insert(0, 0);
        }
        let mut out = vec![0x02, u8::try_from(digits.len()).unwrap()];
        out.extend(digits);
        out
    };
    let (r, s) = fixed.split_at(fixed.len() / 2);
    let body = [integer(r), integer(s)].concat();
    let mut out = vec![0x30, u8::try_from(body.len()).unwrap()];
    out.extend(body);
    out
}

/// One HTTP/1.1 GET over TLS to 127.0.0.1:`port`, verified against `anchors` for `name`: the
/// status and body.
async fn https_get(port: u16, anchors: &str, name: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut config = (*podca_tests::tls::client_config(anchors)).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let server = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let mut tls = connector.connect(server, tcp).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_discovery_serves_the_fetched_keys_and_a_signed_token_verifies_with_its_jwks() {
    // The operator's serving certificate for the discovery host, from a CA of the test's own.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let host = "oidc.control-plane.example";
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![host.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &rcgen::Issuer::from_params(&ca_params, &ca_key))
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (files.path().join("tls.crt"), files.path().join("tls.key"));
    std::fs::write(&cert_file, leaf.pem()).unwrap();
    std::fs::write(&key_file, leaf_key.serialize_pem()).unwrap();

    let (oidc_port, admin_port) = (
        podca_tests::process::free_port(),
        podca_tests::process::free_port(),
    );
    let signer = Signer::start_with_grpc(
        &format!("issuer = \"{ISSUER}\"\noidc_listen = \"127.0.0.1:{oidc_port}\""),
        &format!("tls = \"files\"\ntls_cert_file = {cert_file:?}\ntls_key_file = {key_file:?}"),
        &["--admin-listen", &format!("127.0.0.1:{admin_port}")],
    );
    let mut client = signer.client().await;
    let keys = fetch(&mut client).await;
    let (claims, encoded) = kube_claims(3600);
    let token = sign(&mut client, &encoded).await;

    let (status, document) = https_get(
        oidc_port,
        &ca.pem(),
        host,
        "/.well-known/openid-configuration",
    )
    .await;
    assert_eq!(status, 200, "{document}");
    let document: serde_json::Value = serde_json::from_str(&document).unwrap();
    assert_eq!(document["issuer"], ISSUER);
    assert_eq!(document["jwks_uri"], format!("{ISSUER}/keys"));
    assert_eq!(
        document["id_token_signing_alg_values_supported"][0],
        "ES256"
    );

    let (status, jwks) = https_get(oidc_port, &ca.pem(), host, "/keys").await;
    assert_eq!(status, 200, "{jwks}");
    let jwks: jsonwebtoken::jwk::JwkSet = serde_json::from_str(&jwks).unwrap();
    let mut served: Vec<String> = jwks
        .keys
        .iter()
        .filter_map(|k| k.common.key_id.clone())
        .collect();
    let mut fetched: Vec<String> = keys.keys.iter().map(|k| k.key_id.clone()).collect();
    served.sort();
    fetched.sort();
    assert_eq!(served, fetched, "the JWKS is exactly FetchKeys' key set");

    // The token verifies with the key from the JWKS (jsonwebtoken, not podca's code).
    let kid = jsonwebtoken::decode_header(&token).unwrap().kid.unwrap();
    let jwk = jwks.find(&kid).expect("the signing key is in the JWKS");
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&["https://kubernetes.default.svc.cluster.local"]);
    validation.set_issuer(&[ISSUER]);
    let verified = jsonwebtoken::decode::<serde_json::Value>(
        &token,
        &DecodingKey::from_jwk(jwk).unwrap(),
        &validation,
    )
    .unwrap();
    assert_eq!(verified.claims, claims);

    // One refusal, counted by its reason beside the successes.
    let (_, too_long) = kube_claims(86_400 * 30);
    let refused = client.sign(SignJwtRequest { claims: too_long }).await;
    assert_eq!(refused.expect_err("refused").code(), Code::InvalidArgument);
    let (status, page) = podca_tests::process::http_get(admin_port, "/metrics").unwrap();
    assert_eq!(status, 200);
    let count = |series: &str| podca_tests::process::metric_value(&page, series);
    assert_eq!(
        count(r#"podca_token_signer_requests_total{method="Sign",outcome="ok"}"#),
        1.0
    );
    assert_eq!(
        count(r#"podca_token_signer_requests_total{method="FetchKeys",outcome="ok"}"#),
        1.0
    );
    assert_eq!(
        count(r#"podca_token_signer_requests_total{method="Sign",outcome="too_long"}"#),
        1.0
    );
    assert_eq!(
        count(r#"podca_oidc_requests_total{path="jwks",status="200"}"#),
        1.0
    );
}

#[test]
fn oidc_discovery_without_tls_files_or_an_issuer_is_refused_at_start() {
    for (jwt, grpc, message) in [
        (
            "oidc_listen = \"127.0.0.1:0\"",
            "tls = \"off\"",
            "[jwt] oidc_listen needs [jwt] issuer",
        ),
        (
            &*format!("issuer = \"{ISSUER}\"\noidc_listen = \"127.0.0.1:0\""),
            "",
            "it has no CA to issue its own certificate from",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("podca.toml");
        let data = dir.path().join("data");
        std::fs::write(
            &config,
            format!("[ca]\nbackend = \"file\"\ndir = {data:?}\n\n[jwt]\n{jwt}\n\n[grpc]\n{grpc}\n"),
        )
        .unwrap();
        let out = Command::new(podca_binary())
            .args(["token-signer", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(dir.path().join("signer.sock"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(message), "{message}: {stderr}");
    }
}
