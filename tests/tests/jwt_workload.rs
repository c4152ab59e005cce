//! JWT-SVIDs from `podca dev`'s Workload API, checked by code that is not podca's: the `spiffe`
//! crate as the client and local validator, and `jsonwebtoken` (on aws-lc-rs) verifying the same
//! tokens with the published JWK. Every bad input of `ValidateJWTSVID` and `FetchJWTSVID` gets
//! its documented status; a key rotation reaches open bundle streams before the new key signs.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use podca_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use podca_proto::workload::{JwtBundlesRequest, JwtsvidRequest, ValidateJwtsvidRequest};
use podca_tests::process::{DevOptions, DevProcess, http_get};
use spiffe::{JwtSvid, TrustDomain, WorkloadApiClient};
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Code, Request};

const ID: &str = "spiffe://podca.dev.local/ns/default/sa/default";

fn endpoint(dev: &DevProcess) -> String {
    format!("unix://{}", dev.socket.display())
}

/// A request with the Workload API's required metadata.
fn workload<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    request
}

async fn raw_client(dev: &DevProcess) -> SpiffeWorkloadApiClient<Channel> {
    SpiffeWorkloadApiClient::new(dev.unix_channel().await)
}

/// The JWKS podca publishes, from the first FetchJWTBundles message.
async fn jwks(client: &mut SpiffeWorkloadApiClient<Channel>) -> serde_json::Value {
    let mut stream = client
        .fetch_jwt_bundles(workload(JwtBundlesRequest {}))
        .await
        .unwrap()
        .into_inner();
    let message = stream.next().await.unwrap().unwrap();
    let json = &message.bundles["spiffe://podca.dev.local"];
    serde_json::from_slice(json).unwrap()
}

/// Verifies `token` with jsonwebtoken and the JWK of its kid.
fn jsonwebtoken_verifies(
    token: &str,
    jwks: &serde_json::Value,
    audience: &str,
) -> serde_json::Value {
    let header = jsonwebtoken::decode_header(token).unwrap();
    let kid = header.kid.expect("a kid");
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .expect("the token's key is published");
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(jwk.clone()).unwrap();
    let key = DecodingKey::from_jwk(&jwk).unwrap();
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&[audience]);
    validation.set_required_spec_claims(&["exp", "sub", "aud"]);
    jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
        .unwrap()
        .claims
}

/// The JWT signing key podca made, read from the data directory (to forge tokens podca would
/// never issue, signed with the real key).
fn signing_key(dev: &DevProcess, kid: &str) -> EncodingKey {
    let pem_text =
        std::fs::read_to_string(dev.data_dir.join("jwt").join(format!("{kid}.key"))).unwrap();
    EncodingKey::from_ec_der(pem::parse(pem_text).unwrap().contents())
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[tokio::test(flavor = "multi_thread")]
async fn spiffe_client_fetches_a_jwt_svid_that_validates_against_the_bundle() {
    let dev = DevProcess::start();
    let client = WorkloadApiClient::connect_to(&endpoint(&dev))
        .await
        .unwrap();

    let svid = client.fetch_jwt_svid(["vault"], None).await.unwrap();
    assert_eq!(svid.spiffe_id().to_string(), ID);
    assert_eq!(svid.audience(), ["vault".to_string()]);
    let bundles = client.fetch_jwt_bundles().await.unwrap();
    let td = TrustDomain::new("podca.dev.local").unwrap();
    let bundle = bundles.get(&td).expect("a JWT bundle for podca.dev.local");
    assert!(bundle.find_jwt_authority(svid.key_id()).is_some());
    // Validated locally by the spiffe crate (jsonwebtoken inside)…
    let local = JwtSvid::parse_and_validate(svid.token(), &bundles, &["vault"]).unwrap();
    assert_eq!(local.spiffe_id().to_string(), ID);
    // …and by podca's ValidateJWTSVID.
    let remote = client
        .validate_jwt_token("vault", svid.token())
        .await
        .unwrap();
    assert_eq!(remote.spiffe_id().to_string(), ID);
    // The spiffe crate asks with a selected SPIFFE ID too.
    let selected = client
        .fetch_jwt_svid(["a", "b"], Some(&ID.parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(selected.audience(), ["a".to_string(), "b".to_string()]);

    // jsonwebtoken, given only the published JWK, verifies the same token.
    let mut raw = raw_client(&dev).await;
    let jwks = jwks(&mut raw).await;
    assert_eq!(jwks["keys"][0]["use"], "jwt-svid");
    let claims = jsonwebtoken_verifies(svid.token(), &jwks, "vault");
    assert_eq!(claims["sub"], ID);
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert_eq!(lifetime, 300, "the default lifetime is 5 minutes");

    // ValidateJWTSVID returns the claims as a Struct.
    let answer = raw
        .validate_jwtsvid(workload(ValidateJwtsvidRequest {
            audience: "vault".into(),
            svid: svid.token().into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.spiffe_id, ID);
    let fields = answer.claims.unwrap().fields;
    use prost_types::value::Kind;
    assert_eq!(fields["sub"].kind, Some(Kind::StringValue(ID.into())));
    assert_eq!(
        fields["exp"].kind,
        Some(Kind::NumberValue(claims["exp"].as_i64().unwrap() as f64))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fetch_jwt_svid_refuses_bad_requests_with_their_status() {
    let dev = DevProcess::start();
    let mut raw = raw_client(&dev).await;
    let fetch = |audience: Vec<&str>, spiffe_id: &str| {
        workload(JwtsvidRequest {
            audience: audience.into_iter().map(String::from).collect(),
            spiffe_id: spiffe_id.into(),
        })
    };
    let cases: Vec<(Request<JwtsvidRequest>, Code, &str)> = vec![
        (
            fetch(vec![], ""),
            Code::InvalidArgument,
            "no audience: a JWT-SVID needs at least one",
        ),
        (
            fetch(vec!["a", "b", "c", "d", "e", "f", "g", "h", "i"], ""),
            Code::InvalidArgument,
            "9 audiences, over the limit of 8",
        ),
        (
            fetch(
                vec!["vault"],
                "spiffe://podca.dev.local/ns/kube-system/sa/admin",
            ),
            Code::PermissionDenied,
            "spiffe_id \"spiffe://podca.dev.local/ns/kube-system/sa/admin\" is not this caller's identity (spiffe://podca.dev.local/ns/default/sa/default)",
        ),
    ];
    for (request, code, message) in cases {
        let status = raw.fetch_jwtsvid(request).await.unwrap_err();
        assert_eq!((status.code(), status.message()), (code, message));
    }
    // Without the Workload API metadata.
    let status = raw
        .fetch_jwtsvid(Request::new(JwtsvidRequest {
            audience: vec!["vault".into()],
            spiffe_id: String::new(),
        }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("workload.spiffe.io"),
        "{}",
        status.message()
    );
}

/// Every FetchJWTSVID decision is a `jwt` record in the data directory's ledger: the token's
/// kid, audiences, exp and SHA-256 (never the token), and a refused `spiffe_id` as denied.
#[tokio::test(flavor = "multi_thread")]
async fn fetch_jwt_svid_decisions_are_recorded_in_the_ledger() {
    use podca_signer::ledger::{Ledger, RecordOutcome, Source};

    let data = tempfile::tempdir().unwrap();
    let dev = DevProcess::start_with(DevOptions {
        data_dir: Some(data.path().to_owned()),
        ..DevOptions::default()
    });
    let mut raw = raw_client(&dev).await;
    let svid = raw
        .fetch_jwtsvid(workload(JwtsvidRequest {
            audience: vec!["vault".into(), "aws".into()],
            spiffe_id: String::new(),
        }))
        .await
        .unwrap()
        .into_inner()
        .svids
        .remove(0);
    let other = "spiffe://podca.dev.local/ns/kube-system/sa/admin";
    let status = raw
        .fetch_jwtsvid(workload(JwtsvidRequest {
            audience: vec!["vault".into()],
            spiffe_id: other.into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    // Bad input is answered, not recorded (as for certificates).
    let status = raw
        .fetch_jwtsvid(workload(JwtsvidRequest {
            audience: vec![],
            spiffe_id: String::new(),
        }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    drop(raw);
    assert!(dev.stop().success());

    let ledger = Ledger::open(&data.path().join("ledger.redb")).unwrap();
    let records: Vec<_> = ledger
        .latest(100)
        .unwrap()
        .into_iter()
        .filter(|r| r.source == Source::Jwt)
        .collect();
    assert_eq!(records.len(), 2, "{records:?}");
    let issued = records
        .iter()
        .find(|r| r.outcome == RecordOutcome::Issued)
        .expect("the issued token's record");
    let claims = jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(&svid.svid)
        .unwrap()
        .claims;
    let facts = issued.jwt.as_ref().expect("JWT facts");
    assert_eq!(
        facts.kid,
        jsonwebtoken::decode_header(&svid.svid)
            .unwrap()
            .kid
            .unwrap()
    );
    assert_eq!(facts.audiences, ["vault", "aws"]);
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, svid.svid.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(facts.token_sha256, hex);
    // `jwt:<decision time in Unix ms>-<token SHA-256>`; the record keeps its time in seconds.
    let (millis, digest) = issued
        .id
        .strip_prefix("jwt:")
        .and_then(|rest| rest.split_once('-'))
        .expect("jwt:<ms>-<digest>");
    assert_eq!(millis.len(), 13, "{}", issued.id);
    assert_eq!(
        millis.parse::<i64>().unwrap() / 1000,
        issued.time.unix_timestamp()
    );
    assert_eq!(digest, hex);
    assert_eq!(
        issued.not_after.map(|t| t.unix_timestamp()),
        claims["exp"].as_i64()
    );
    assert_eq!(issued.identity, ID);
    assert!(!issued.to_json().contains(&svid.svid));
    let denied = records
        .iter()
        .find(|r| r.outcome == RecordOutcome::Denied)
        .expect("the refused spiffe_id's record");
    assert_eq!(denied.reason, "UnknownSpiffeId");
    assert_eq!(denied.identity, ID);
    assert!(
        denied.message.as_deref().is_some_and(|m| m.contains(other)),
        "{denied:?}"
    );
    assert_eq!(denied.jwt, None);
}

/// podca.v1 `IssueJwtSvid` on `podca dev`'s loopback listener: the signer's namespace rule
/// decides, and both the token and the policy denial are `jwt` ledger records.
#[tokio::test(flavor = "multi_thread")]
async fn podca_v1_issue_jwt_svid_follows_the_policy_and_records_denials() {
    use podca_proto::podca::v1::IssueJwtSvidRequest;
    use podca_signer::ledger::{Ledger, RecordOutcome, Source};

    let config = r#"
[signers."example.com/workload"]
trust_domain = "example.com"
namespaces = ["shop"]
"#;
    let data = tempfile::tempdir().unwrap();
    let dev = DevProcess::start_with(DevOptions {
        config: Some(config),
        data_dir: Some(data.path().to_owned()),
        ..DevOptions::default()
    });
    let mut client = dev.tcp_client().await;
    let as_identity = |namespace: &str| {
        let mut request = Request::new(IssueJwtSvidRequest {
            audiences: vec!["vault".into()],
            ..Default::default()
        });
        let metadata = request.metadata_mut();
        metadata.insert("x-podca-namespace", namespace.parse().unwrap());
        metadata.insert("x-podca-service-account", "web".parse().unwrap());
        request
    };
    let svid = client
        .issue_jwt_svid(as_identity("shop"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(svid.spiffe_id, "spiffe://example.com/ns/shop/sa/web");
    let status = client
        .issue_jwt_svid(as_identity("default"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().starts_with("NamespaceNotAllowed: "),
        "{}",
        status.message()
    );
    drop(client);
    assert!(dev.stop().success());

    let ledger = Ledger::open(&data.path().join("ledger.redb")).unwrap();
    let mut records: Vec<_> = ledger
        .latest(100)
        .unwrap()
        .into_iter()
        .filter(|r| r.source == Source::Jwt)
        .collect();
    records.sort_by_key(|r| r.outcome == RecordOutcome::Denied);
    let outcomes: Vec<_> = records
        .iter()
        .map(|r| (r.outcome, r.reason.as_str(), r.identity.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (
                RecordOutcome::Issued,
                "Issued",
                "spiffe://example.com/ns/shop/sa/web"
            ),
            (
                RecordOutcome::Denied,
                "NamespaceNotAllowed",
                "spiffe://example.com/ns/default/sa/web"
            ),
        ]
    );
    assert_eq!(
        records[0].jwt.as_ref().map(|j| j.kid.as_str()),
        Some(svid.kid.as_str())
    );
    assert_eq!(records[1].signer, "example.com/workload");
}

#[tokio::test(flavor = "multi_thread")]
async fn validate_jwt_svid_refuses_every_bad_token_with_its_status() {
    let dev = DevProcess::start();
    let mut raw = raw_client(&dev).await;
    let good = raw
        .fetch_jwtsvid(workload(JwtsvidRequest {
            audience: vec!["vault".into()],
            spiffe_id: String::new(),
        }))
        .await
        .unwrap()
        .into_inner()
        .svids
        .remove(0)
        .svid;
    let kid = jsonwebtoken::decode_header(&good).unwrap().kid.unwrap();
    let key = signing_key(&dev, &kid);
    let forge = |header: Header, claims: serde_json::Value| {
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    };
    let es256 = |kid: &str| {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some(kid.into());
        h
    };
    let claims = |aud: serde_json::Value, exp: i64, nbf: Option<i64>| {
        let mut c = serde_json::json!({"sub": ID, "aud": aud, "exp": exp});
        if let Some(nbf) = nbf {
            c["nbf"] = nbf.into();
        }
        c
    };
    // A forged token with the real key and podca's claims validates: the forgeries below fail
    // for their one difference only.
    let control = forge(es256(&kid), claims("vault".into(), now() + 300, None));
    raw.validate_jwtsvid(workload(ValidateJwtsvidRequest {
        audience: "vault".into(),
        svid: control,
    }))
    .await
    .unwrap();

    let b64 = |v: serde_json::Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap());
    let body = b64(claims("vault".into(), now() + 300, None));
    let alg_none = format!(
        "{}.{body}.",
        b64(serde_json::json!({"alg": "none", "kid": kid}))
    );
    let hs256 = {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some(kid.clone());
        jsonwebtoken::encode(
            &h,
            &claims("vault".into(), now() + 300, None),
            &EncodingKey::from_secret(b"the public key as an HMAC secret"),
        )
        .unwrap()
    };
    let (head, _sig) = good.rsplit_once('.').unwrap();
    let too_many: Vec<String> = (0..9).map(|i| format!("a{i}")).collect();
    let cases: Vec<(&str, String, &str, String)> = vec![
        (
            "alg none",
            alg_none,
            "vault",
            "the signature is empty".into(),
        ),
        (
            "HS256",
            hs256,
            "vault",
            "algorithm \"HS256\" is not allowed for JWT-SVIDs".into(),
        ),
        (
            "wrong kid",
            forge(
                es256("not-a-podca-key"),
                claims("vault".into(), now() + 300, None),
            ),
            "vault",
            "key ID \"not-a-podca-key\" is not in the trust domain's JWT bundle".into(),
        ),
        (
            "expired",
            forge(es256(&kid), claims("vault".into(), now() - 10, None)),
            "vault",
            "the token expired at".into(),
        ),
        (
            "not yet valid",
            forge(
                es256(&kid),
                claims("vault".into(), now() + 300, Some(now() + 200)),
            ),
            "vault",
            "the token is not valid before".into(),
        ),
        (
            "other audience",
            good.clone(),
            "aws",
            "the token is not for audience \"aws\"".into(),
        ),
        (
            "no audience",
            forge(
                es256(&kid),
                claims(serde_json::json!([]), now() + 300, None),
            ),
            "vault",
            "no audience: a JWT-SVID needs at least one".into(),
        ),
        (
            "too many audiences",
            forge(
                es256(&kid),
                claims(serde_json::json!(too_many), now() + 300, None),
            ),
            "a0",
            "9 audiences, over the limit of 8".into(),
        ),
        (
            "truncated",
            head.to_owned(),
            "vault",
            "malformed token: not a JWS compact serialisation (three parts)".into(),
        ),
        (
            "oversized",
            format!("{good}{}", "A".repeat(8 * 1024)),
            "vault",
            "the token is ".into(),
        ),
        ("empty", String::new(), "vault", "svid is empty".into()),
        (
            "no expected audience",
            good.clone(),
            "",
            "audience is empty".into(),
        ),
    ];
    for (what, svid, audience, message) in cases {
        let status = raw
            .validate_jwtsvid(workload(ValidateJwtsvidRequest {
                audience: audience.into(),
                svid,
            }))
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
        assert!(
            status.message().contains(&message),
            "{what}: {}",
            status.message()
        );
    }
}

/// The JWKS keys' kids, in order.
fn kids(jwks: &[u8]) -> Vec<String> {
    let value: serde_json::Value = serde_json::from_slice(jwks).unwrap();
    value["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_rotation_publishes_before_signing_and_drops_after_the_last_token() {
    // A 20 s rotation period with 6 s of propagation and 8 s tokens: key 1 signs from 0 s,
    // key 2 is published at ~14 s and signs from ~20 s; key 1 is gone at ~28 s.
    let config = "[jwt]\nkey_rotation_seconds = 20\npropagation_seconds = 6\n\
                  max_lifetime_seconds = 8\ndefault_lifetime_seconds = 8\n";
    let dev = DevProcess::start_with(DevOptions {
        config: Some(config),
        ..DevOptions::default()
    });
    let mut raw = raw_client(&dev).await;
    let mut stream = raw
        .fetch_jwt_bundles(workload(JwtBundlesRequest {}))
        .await
        .unwrap()
        .into_inner();
    // The next message whose key list differs from `previous` (a step that changes only a
    // phase re-sends the same keys with a new spiffe_sequence).
    async fn next_change(
        stream: &mut tonic::Streaming<podca_proto::workload::JwtBundlesResponse>,
        previous: &[String],
    ) -> Vec<String> {
        let fut = async {
            loop {
                let message = stream.next().await.unwrap().unwrap();
                let now = kids(&message.bundles["spiffe://podca.dev.local"]);
                if now != previous {
                    return now;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), fut)
            .await
            .expect("a changed key list within 30 s")
    }
    let first = next_change(&mut stream, &[]).await;
    assert_eq!(first.len(), 1);
    let old_kid = first[0].clone();
    let fetch = |raw: &mut SpiffeWorkloadApiClient<Channel>| {
        let mut raw = raw.clone();
        async move {
            raw.fetch_jwtsvid(workload(JwtsvidRequest {
                audience: vec!["vault".into()],
                spiffe_id: String::new(),
            }))
            .await
            .unwrap()
            .into_inner()
            .svids
            .remove(0)
            .svid
        }
    };
    let kid_of = |token: &str| jsonwebtoken::decode_header(token).unwrap().kid.unwrap();

    // The new key arrives on the open stream while the old one still signs.
    let published = next_change(&mut stream, &first).await;
    assert_eq!(published.len(), 2, "{published:?}");
    assert_eq!(published[0], old_kid);
    let new_kid = published[1].clone();
    let old_token = fetch(&mut raw).await;
    assert_eq!(
        kid_of(&old_token),
        old_kid,
        "the prepared key must not sign yet"
    );

    // Once it signs, tokens of the old key still validate until they expire.
    let deadline = Instant::now() + Duration::from_secs(20);
    let new_token = loop {
        let token = fetch(&mut raw).await;
        if kid_of(&token) == new_kid {
            break token;
        }
        assert!(Instant::now() < deadline, "the new key never signed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let validate = |raw: &mut SpiffeWorkloadApiClient<Channel>, svid: String| {
        let mut raw = raw.clone();
        async move {
            raw.validate_jwtsvid(workload(ValidateJwtsvidRequest {
                audience: "vault".into(),
                svid,
            }))
            .await
        }
    };
    validate(&mut raw, new_token.clone()).await.unwrap();
    let old_exp = jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(&old_token)
        .unwrap()
        .claims["exp"]
        .as_i64()
        .unwrap();
    if now() < old_exp {
        validate(&mut raw, old_token.clone()).await.unwrap();
    }

    // Afterwards the old key is gone from the stream, and its tokens with it.
    let after = next_change(&mut stream, &published).await;
    assert_eq!(after, vec![new_kid.clone()]);
    let status = validate(&mut raw, old_token).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("is not in the trust domain's JWT bundle"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn jsonwebtoken_verifies_with_the_key_from_oidc_discovery() {
    let dev = DevProcess::start_with(DevOptions {
        config: Some("[jwt]\noidc_listen = \"127.0.0.1:0\"\n"),
        ..DevOptions::default()
    });
    let url = dev
        .banner
        .iter()
        .find_map(|l| l.strip_prefix("podca dev: OIDC discovery on "))
        .expect("the banner names the discovery URL")
        .to_owned();
    let (base, path) = url.rsplit_once("/.well-known").unwrap();
    let port: u16 = base.rsplit_once(':').unwrap().1.parse().unwrap();
    let (code, body) = http_get(port, &format!("/.well-known{path}")).unwrap();
    assert_eq!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["issuer"], base);
    assert_eq!(doc["id_token_signing_alg_values_supported"][0], "ES256");
    assert_eq!(doc["response_types_supported"][0], "id_token");
    assert_eq!(doc["subject_types_supported"][0], "public");
    let jwks_uri = doc["jwks_uri"].as_str().unwrap();
    let jwks_path = jwks_uri
        .strip_prefix(base)
        .expect("the JWKS is on the same listener");
    let (code, body) = http_get(port, jwks_path).unwrap();
    assert_eq!(code, 200, "{body}");
    let jwks: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(jwks["keys"][0]["use"], "sig");

    let client = WorkloadApiClient::connect_to(&endpoint(&dev))
        .await
        .unwrap();
    let svid = client
        .fetch_jwt_svid(["sts.amazonaws.com"], None)
        .await
        .unwrap();
    let claims = jsonwebtoken_verifies(svid.token(), &jwks, "sts.amazonaws.com");
    // The token's iss is the discovery issuer, as OIDC relying parties require.
    assert_eq!(claims["iss"], base);

    // Cacheable answers.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "GET {jwks_path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(
        raw.to_ascii_lowercase()
            .contains("cache-control: public, max-age=300"),
        "{raw}"
    );
}

fn podca(args: &[&str]) -> std::process::Output {
    std::process::Command::new(podca_tests::process::podca_binary())
        .args(args)
        .env_remove("PODCA_DATA_DIR")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_decodes_a_jwt_svid_and_ca_show_lists_the_keys() {
    let dev = DevProcess::start();
    let client = WorkloadApiClient::connect_to(&endpoint(&dev))
        .await
        .unwrap();
    let svid = client.fetch_jwt_svid(["vault"], None).await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("token.jwt");
    std::fs::write(&token, format!("{}\n", svid.token())).unwrap();
    let dir = dev.data_dir.to_str().unwrap();

    let out = podca(&["inspect", "--dir", dir, token.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("subject: {ID}")), "{text}");
    assert!(text.contains(&format!("key: {}", svid.key_id())), "{text}");
    assert!(
        text.contains("valid: yes, for audience \"vault\""),
        "{text}"
    );

    // Against another JWKS (a bundle without its key) and for another audience: not valid.
    let other = tmp.path().join("other.json");
    std::fs::write(&other, r#"{"keys":[]}"#).unwrap();
    let out = podca(&[
        "inspect",
        "--jwks",
        other.to_str().unwrap(),
        token.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not in the trust domain's JWT bundle"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = podca(&[
        "inspect",
        "--dir",
        dir,
        "--audience",
        "aws",
        token.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("the token is not for audience \"aws\""),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = podca(&["ca", "show", "--dir", dir]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("key {} — active (ecdsa-p256)", svid.key_id())),
        "{text}"
    );
}
