//! JWT-SVIDs through the real `podca serve` binary and the API emulator (harness:
//! `grpc_serve/mod.rs`), over TLS verified against podca's bundle, for TokenReview-authenticated
//! callers (issue #17, the serve half):
//!
//! * `podca.v1.PodCA/IssueJwtSvid` gives the caller a token that `jsonwebtoken` (not podca's
//!   code) verifies with the JWK from `GetJwtBundle`, and the same key is the one in the data
//!   directory's `jwt/` (the rotation `podca serve` now runs);
//! * a node proxy gets one for a pod on its node and is refused for a pod elsewhere, and a caller
//!   that is no node proxy is refused for any pod;
//! * every bad input gets its documented status and message;
//! * each decision is a `jwt` record in the ledger (redb): kid, audiences, exp and the token's
//!   SHA-256, never the token;
//! * `podca issue --jwt` prints a token end to end;
//! * with the CA key in a SoftHSM2 token (`[ca] backend = "pkcs11"`), the JWT key is made in the
//!   token too: the token verifies, `pkcs11-tool` lists its object, no key file is written.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

mod grpc_serve;

use std::process::Command;

use grpc_serve::{Cluster, HsmCa, NODE_PROXY, PCR_ONLY_SIGNER, TokenSpec, expect_code, with_token};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::{GetJwtBundleRequest, IssueJwtSvidRequest, JwtSvid};
use podca_signer::ledger::{Filter, Ledger, LedgerRecord, RecordOutcome, Source};
use podca_tests::process::podca_binary;
use podca_tests::softhsm::{private_key_labels, softhsm_token};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// `[jwt]` for these tests: an issuer (the `iss` claim) and a small audience limit.
const JWT_CONFIG: &str = "\n[jwt]\nissuer = \"https://podca.example.com\"\nmax_audiences = 2\n\
                          max_lifetime_seconds = 600\n";

async fn start() -> Cluster {
    Cluster::start_with(JWT_CONFIG).await
}

fn ask(audiences: &[&str]) -> IssueJwtSvidRequest {
    IssueJwtSvidRequest {
        audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
        ..Default::default()
    }
}

async fn issue_jwt(
    client: &mut PodCaClient<Channel>,
    token: Option<&str>,
    request: IssueJwtSvidRequest,
) -> Result<JwtSvid, Status> {
    client
        .issue_jwt_svid(with_token(request, token))
        .await
        .map(tonic::Response::into_inner)
}

/// The JWKS `GetJwtBundle` answers.
async fn jwks(client: &mut PodCaClient<Channel>, token: &str) -> serde_json::Value {
    let bundle = client
        .get_jwt_bundle(with_token(GetJwtBundleRequest::default(), Some(token)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bundle.trust_domain, "spiffe://cluster.local");
    serde_json::from_slice(&bundle.jwks).unwrap()
}

/// Verifies `token` with jsonwebtoken and the JWK of its kid in `jwks`; its claims.
fn jsonwebtoken_verifies(
    token: &str,
    jwks: &serde_json::Value,
    audience: &str,
) -> serde_json::Value {
    let header = jsonwebtoken::decode_header(token).unwrap();
    assert_eq!(header.alg, Algorithm::ES256);
    let kid = header.kid.expect("a kid");
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .expect("the token's key is published");
    assert_eq!(jwk["use"], "jwt-svid");
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(jwk.clone()).unwrap();
    let key = DecodingKey::from_jwk(&jwk).unwrap();
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&[audience]);
    validation.set_issuer(&["https://podca.example.com"]);
    validation.set_required_spec_claims(&["exp", "sub", "aud", "iss"]);
    jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
        .unwrap()
        .claims
}

fn sha256_hex(bytes: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `jwt` records of the data directory's ledger, once `podca serve` has been killed.
fn jwt_records(cluster: &mut Cluster) -> Vec<LedgerRecord> {
    cluster.kill_serve();
    let ledger = Ledger::open(&cluster.ca_dir().join("ledger.redb")).unwrap();
    ledger
        .query(&Filter {
            limit: 100,
            ..Filter::default()
        })
        .unwrap()
        .into_iter()
        .filter(|r| r.source == Source::Jwt)
        .collect()
}

/// Checks the record of an issued `svid` and that it does not hold the token.
fn check_issued_record(record: &LedgerRecord, svid: &JwtSvid, requester: &str) {
    assert_eq!(record.outcome, RecordOutcome::Issued);
    assert_eq!(record.identity, svid.spiffe_id);
    assert_eq!(record.requester.as_deref(), Some(requester));
    let facts = record.jwt.as_ref().expect("a JWT record carries its facts");
    assert_eq!(facts.kid, svid.kid);
    assert_eq!(facts.audiences, svid.audiences);
    assert_eq!(facts.token_sha256, sha256_hex(svid.token.as_bytes()));
    assert_eq!(
        record.not_after.map(|t| t.unix_timestamp()),
        svid.expires_at.map(|t| t.seconds)
    );
    assert_eq!(
        record.not_before.map(|t| t.unix_timestamp()),
        svid.issued_at.map(|t| t.seconds)
    );
    assert_eq!(record.serial, None);
    let json = record.to_json();
    assert!(json.contains("\"source\":\"jwt\""), "{json}");
    // Neither the token nor its signature is in the record.
    let signature = svid.token.rsplit('.').next().unwrap();
    assert!(
        !json.contains(signature),
        "the record holds the token: {json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_reviewed_caller_gets_a_jwt_svid_that_jsonwebtoken_verifies() {
    let mut cluster = start().await;
    let token = cluster.token("apps", "web", TokenSpec::default());
    let mut client = cluster.client().await;

    let svid = issue_jwt(
        &mut client,
        Some(&token),
        ask(&["vault", "sts.amazonaws.com"]),
    )
    .await
    .unwrap();
    assert_eq!(svid.spiffe_id, "spiffe://cluster.local/ns/apps/sa/web");
    assert_eq!(svid.audiences, ["vault", "sts.amazonaws.com"]);
    let (iat, exp) = (
        svid.issued_at.unwrap().seconds,
        svid.expires_at.unwrap().seconds,
    );
    assert_eq!(exp - iat, 300, "the default lifetime is 5 minutes");

    // jsonwebtoken, given only the JWK GetJwtBundle publishes, verifies the token.
    let jwks = jwks(&mut client, &token).await;
    let claims = jsonwebtoken_verifies(&svid.token, &jwks, "vault");
    assert_eq!(claims["sub"], svid.spiffe_id);
    assert_eq!(claims["exp"], exp);
    assert_eq!(claims["iss"], "https://podca.example.com");
    assert_eq!(
        jsonwebtoken::decode_header(&svid.token)
            .unwrap()
            .typ
            .as_deref(),
        Some("JWT")
    );
    // The key is the one podca serve made in the data directory on its first start.
    let key_file = cluster
        .ca_dir()
        .join("jwt")
        .join(format!("{}.key", svid.kid));
    assert!(key_file.is_file(), "{} is missing", key_file.display());

    // A shorter lifetime is honoured; a longer one is clamped to max_lifetime_seconds.
    for (asked, got) in [(60, 60), (100_000, 600)] {
        let svid = issue_jwt(
            &mut client,
            Some(&token),
            IssueJwtSvidRequest {
                requested_lifetime_seconds: Some(asked),
                ..ask(&["vault"])
            },
        )
        .await
        .unwrap();
        let lifetime = svid.expires_at.unwrap().seconds - svid.issued_at.unwrap().seconds;
        assert_eq!(lifetime, got, "asked for {asked} s");
    }

    // Recorded before it was returned: the record is there after SIGKILL.
    let records = jwt_records(&mut cluster);
    assert_eq!(records.len(), 3, "{records:?}");
    let record = records
        .iter()
        .find(|r| r.jwt.as_ref().is_some_and(|j| j.audiences.len() == 2))
        .expect("the first token's record");
    check_issued_record(record, &svid, "apps/web");
    assert_eq!(record.signer, grpc_serve::SIGNER);
    // An auditor holding a token finds its record by the token's SHA-256.
    let ledger = Ledger::open(&cluster.ca_dir().join("ledger.redb")).unwrap();
    let found = ledger
        .query(&Filter {
            fingerprint: Some(sha256_hex(svid.token.as_bytes()).to_uppercase()),
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(&found[0], record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_proxy_gets_a_jwt_svid_for_a_pod_on_its_node_only() {
    let mut cluster = start().await;
    let (proxy_ns, proxy_sa) = NODE_PROXY.split_once('/').unwrap();
    cluster.emu.add_node("node-1");
    cluster.emu.add_node("node-2");
    cluster.pod(proxy_ns, "proxy-a", "node-1", proxy_sa);
    cluster.pod("apps", "web-1", "node-1", "web");
    cluster.pod("apps", "db-2", "node-2", "db");
    let proxy = cluster.token(proxy_ns, proxy_sa, TokenSpec::bound("proxy-a", "node-1"));
    let mut client = cluster.client().await;
    let for_pod = |name: &str| IssueJwtSvidRequest {
        pod_namespace: "apps".into(),
        pod_name: name.into(),
        ..ask(&["vault"])
    };

    let svid = issue_jwt(&mut client, Some(&proxy), for_pod("web-1"))
        .await
        .unwrap();
    assert_eq!(svid.spiffe_id, "spiffe://cluster.local/ns/apps/sa/web");
    let jwks = jwks(&mut client, &proxy).await;
    assert_eq!(
        jsonwebtoken_verifies(&svid.token, &jwks, "vault")["sub"],
        svid.spiffe_id
    );
    // The proxy's own token, without a pod.
    let own = issue_jwt(&mut client, Some(&proxy), ask(&["vault"]))
        .await
        .unwrap();
    assert_eq!(
        own.spiffe_id,
        "spiffe://cluster.local/ns/mesh/sa/node-proxy"
    );

    expect_code(
        issue_jwt(&mut client, Some(&proxy), for_pod("db-2")).await,
        Code::PermissionDenied,
        "pod apps/db-2 does not run on the caller's node node-1",
    );
    expect_code(
        issue_jwt(&mut client, Some(&proxy), for_pod("gone")).await,
        Code::NotFound,
        "pod apps/gone not found",
    );
    expect_code(
        issue_jwt(
            &mut client,
            Some(&proxy),
            IssueJwtSvidRequest {
                pod_name: String::new(),
                ..for_pod("web-1")
            },
        )
        .await,
        Code::InvalidArgument,
        "pod_name \"\" is not a Kubernetes object name",
    );
    // A caller that is no node proxy asks for a pod on its own node.
    cluster.pod("apps", "web-2", "node-1", "web");
    let web = cluster.token("apps", "web", TokenSpec::bound("web-2", "node-1"));
    expect_code(
        issue_jwt(&mut client, Some(&web), for_pod("web-1")).await,
        Code::PermissionDenied,
        "service account apps/web may not request certificates or JWT-SVIDs for other pods",
    );

    let records = jwt_records(&mut cluster);
    assert_eq!(records.len(), 2, "only decisions are recorded: {records:?}");
    let record = records
        .iter()
        .find(|r| r.request_name.as_deref() == Some("apps/web-1"))
        .expect("the node proxy's token for apps/web-1");
    check_issued_record(record, &svid, NODE_PROXY);
    assert_eq!(record.pod_name.as_deref(), Some("web-1"));
    assert_eq!(record.node_name.as_deref(), Some("node-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_jwt_request_gets_its_status() {
    let cluster = start().await;
    let token = cluster.token("apps", "web", TokenSpec::default());
    let mut client = cluster.client().await;
    let long = "a".repeat(257);
    let cases: Vec<(&str, IssueJwtSvidRequest, Code, &str)> = vec![
        (
            "no audience",
            ask(&[]),
            Code::InvalidArgument,
            "no audience: a JWT-SVID needs at least one",
        ),
        (
            "over max_audiences",
            ask(&["a", "b", "c"]),
            Code::InvalidArgument,
            "3 audiences, over the limit of 2",
        ),
        (
            "an audience over 256 bytes",
            ask(&["a", &long]),
            Code::InvalidArgument,
            "is empty or longer than 256 bytes",
        ),
        (
            "an empty audience",
            ask(&[""]),
            Code::InvalidArgument,
            "audience \"\" is empty or longer than 256 bytes",
        ),
        (
            "a lifetime of 0",
            IssueJwtSvidRequest {
                requested_lifetime_seconds: Some(0),
                ..ask(&["vault"])
            },
            Code::InvalidArgument,
            "requested_lifetime_seconds must be positive, got 0",
        ),
        (
            "an unknown signer",
            IssueJwtSvidRequest {
                signer_name: "example.com/nope".into(),
                ..ask(&["vault"])
            },
            Code::NotFound,
            "unknown signer \"example.com/nope\"",
        ),
        (
            "a signer not offered over gRPC",
            IssueJwtSvidRequest {
                signer_name: PCR_ONLY_SIGNER.into(),
                ..ask(&["vault"])
            },
            Code::PermissionDenied,
            "is not offered over gRPC",
        ),
        (
            "a pod from a caller that is no node proxy",
            IssueJwtSvidRequest {
                pod_namespace: "apps".into(),
                pod_name: "web-1".into(),
                ..ask(&["vault"])
            },
            Code::PermissionDenied,
            "is not in grpc.node_proxy_service_accounts",
        ),
    ];
    for (what, request, code, needle) in cases {
        let status = issue_jwt(&mut client, Some(&token), request)
            .await
            .expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{what}: {:?} should mention {needle:?}",
            status.message()
        );
    }
    // No credentials, and a token for another audience.
    expect_code(
        issue_jwt(&mut client, None, ask(&["vault"])).await,
        Code::Unauthenticated,
        "no credentials",
    );
    let other = cluster.token(
        "apps",
        "web",
        TokenSpec {
            audience: "vault",
            ..TokenSpec::default()
        },
    );
    expect_code(
        issue_jwt(&mut client, Some(&other), ask(&["vault"])).await,
        Code::Unauthenticated,
        "invalid credentials",
    );
    expect_code(
        client
            .get_jwt_bundle(with_token(
                GetJwtBundleRequest {
                    signer_name: "example.com/nope".into(),
                },
                Some(&token),
            ))
            .await,
        Code::NotFound,
        "unknown signer",
    );
    // No token ever reaches the log.
    let log = cluster.log_text();
    assert!(!log.contains(&token), "the caller's token is in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_disabled_is_unimplemented() {
    let cluster = Cluster::start_with("\n[jwt]\nenabled = false\n").await;
    let token = cluster.token("apps", "web", TokenSpec::default());
    let mut client = cluster.client().await;
    expect_code(
        issue_jwt(&mut client, Some(&token), ask(&["vault"])).await,
        Code::Unimplemented,
        "JWT-SVIDs are not served here ([jwt] enabled = false",
    );
    expect_code(
        client
            .get_jwt_bundle(with_token(GetJwtBundleRequest::default(), Some(&token)))
            .await,
        Code::Unimplemented,
        "JWT-SVIDs are not served here",
    );
    assert!(
        !cluster.ca_dir().join("jwt").exists(),
        "no JWT keys are made when [jwt] enabled = false"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podca_issue_jwt_prints_a_token_end_to_end() {
    let cluster = start().await;
    let token = cluster.token("apps", "web", TokenSpec::default());
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let anchors = dir.path().join("anchors.pem");
    std::fs::write(&anchors, &cluster.anchors).unwrap();
    let server = format!("https://127.0.0.1:{}", cluster.grpc);
    let run = |audiences: &[&str]| {
        let mut cmd = Command::new(podca_binary());
        cmd.args(["issue", "--jwt", "--server", &server, "--ca-file"])
            .arg(&anchors)
            .args([
                "--server-name",
                podca_tests::tls::SERVER_NAME,
                "--token-file",
            ])
            .arg(&token_file);
        for audience in audiences {
            cmd.args(["--audience", audience]);
        }
        cmd.output().unwrap()
    };

    let out = run(&["vault", "aws"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let printed = stdout.strip_suffix('\n').expect("one line");
    assert!(
        !printed.contains('\n'),
        "stdout is the token only: {stdout:?}"
    );
    let mut client = cluster.client().await;
    let claims = jsonwebtoken_verifies(printed, &jwks(&mut client, &token).await, "aws");
    assert_eq!(claims["sub"], "spiffe://cluster.local/ns/apps/sa/web");
    assert_eq!(claims["aud"], serde_json::json!(["vault", "aws"]));
    assert!(
        stderr.contains("issued a JWT-SVID for spiffe://cluster.local/ns/apps/sa/web"),
        "{stderr}"
    );
    assert!(!stderr.contains(printed), "the token is on stderr too");

    // The server's refusal, with its code.
    let out = run(&["a", "b", "c"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("INVALID_ARGUMENT"), "{stderr}");
    assert!(
        stderr.contains("3 audiences, over the limit of 2"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    // --jwt needs an audience (clap, before anything is sent).
    let out = run(&[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--audience"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hsm_held_jwt_key_signs_through_podca_serve() {
    const USER_PIN: &str = "podca-serve-pin-4711";
    let hsm_dir = tempfile::tempdir().unwrap();
    let token_label = "jwt-serve";
    let hsm = HsmCa {
        softhsm_conf: softhsm_token(hsm_dir.path(), token_label, "podca-so-pin-1174", USER_PIN),
        token: token_label.to_owned(),
        pin_file: hsm_dir.path().join("user.pin"),
    };
    std::fs::write(&hsm.pin_file, format!("{USER_PIN}\n")).unwrap();
    let mut cluster = Cluster::start_with_ca(JWT_CONFIG, Some(&hsm)).await;
    let token = cluster.token("apps", "web", TokenSpec::default());
    let mut client = cluster.client().await;

    let svid = issue_jwt(&mut client, Some(&token), ask(&["vault"]))
        .await
        .unwrap();
    assert_eq!(svid.spiffe_id, "spiffe://cluster.local/ns/apps/sa/web");
    let jwks = jwks(&mut client, &token).await;
    let claims = jsonwebtoken_verifies(&svid.token, &jwks, "vault");
    assert_eq!(claims["sub"], svid.spiffe_id);
    let kid = jsonwebtoken::decode_header(&svid.token)
        .unwrap()
        .kid
        .unwrap();
    assert_eq!(kid, svid.kid);

    // state.json records the kid's key at a PKCS#11 URI in the CA's token, and that object is a
    // private key pkcs11-tool (not podca) finds there, next to the CA key.
    let jwt_dir = cluster.ca_dir().join("jwt");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(jwt_dir.join("state.json")).unwrap()).unwrap();
    let location = state["locations"][kid.as_str()]
        .as_str()
        .unwrap_or_else(|| panic!("no location for {kid} in {state}"));
    let prefix = format!("pkcs11:token={token_label};object=");
    let object = location
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{location} is not in token {token_label}"));
    let object = object.split([';', '?']).next().unwrap();
    assert!(object.starts_with("podca-jwt-"), "{location}");
    let labels = private_key_labels(&hsm.softhsm_conf, token_label, USER_PIN);
    assert!(
        labels.iter().any(|l| l == object),
        "{object} not in {labels:?}"
    );
    assert!(labels.iter().any(|l| l == "podca-ca"), "{labels:?}");

    // The data directory holds no JWT private key: jwt/ is state.json only, and no file in the
    // data directory is a PEM private key.
    let jwt_files: Vec<String> = std::fs::read_dir(&jwt_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        jwt_files,
        ["state.json"],
        "no key file in {}",
        jwt_dir.display()
    );
    cluster.kill_serve();
    let mut dirs = vec![cluster.ca_dir()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !String::from_utf8_lossy(&bytes).contains("PRIVATE KEY"),
                    "{} holds a private key",
                    path.display()
                );
            }
        }
    }
}
