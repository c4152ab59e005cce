//! `podca policy test` and a running `podca dev` give the same answer for the same request
//! (issue #38): the decision and reason, the certificate's DNS names and lifetime, and a
//! JWT-SVID's lifetime, including when a CEL output caps it. Both call the gRPC API's own
//! admission (`podca_grpc::admission`); before it, `policy test` ignored the cap for JWT-SVIDs
//! and promised a token longer than podca signs. Declared annotation keys (issue #42) are
//! decided the same way too.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use base64::Engine;
use podca_proto::podca::v1::{IssueCertificateRequest, IssueJwtSvidRequest};
use podca_tests::process::{DevOptions, DevProcess, csr_for, podca_binary};
use serde_json::Value;
use tonic::{Code, Request};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// One signer: templates for DNS names, a rule that refuses `admin`, and an output that caps
/// lifetimes (120 s for JWT-SVIDs for the audience `short`, 12 h otherwise).
const CONFIG: &str = r#"
[signers."example.com/workload"]
trust_domain = "example.com"
default_lifetime_seconds = 7200
max_lifetime_seconds = 86400
dns_name_templates = ["{sa}.{ns}.svc"]

[[signers."example.com/workload".rules]]
name = "no_admin"
deny = "request.service_account == 'admin'"
reason = "AdminRefused"
message = "'admin is refused'"

# Issue #42: a declared annotation key reaches the rules; any other is denied before them.
[[signers."example.com/workload".annotations]]
key = "example.com/ticket"
pattern = "T-*"
max_length = 8

[[signers."example.com/workload".rules]]
name = "no_closed_ticket"
deny = "'example.com/ticket' in request.annotations && request.annotations['example.com/ticket'] == 'T-0'"
reason = "TicketClosed"
message = "'ticket ' + request.annotations['example.com/ticket'] + ' is closed'"

[signers."example.com/workload".outputs]
max_lifetime_seconds = "request.source == 'jwt' && 'short' in request.audiences ? 120 : 43200"

[jwt]
enabled = true
default_lifetime_seconds = 600
max_lifetime_seconds = 3600
"#;

/// `podca policy test -o json` for `description` (YAML).
fn policy_test(dir: &Path, description: &str) -> Value {
    let config = dir.join("podca.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let request = dir.join("request.yaml");
    std::fs::write(&request, description).unwrap();
    let out = Command::new(podca_binary())
        .args(["policy", "test", "-o", "json", "--config"])
        .arg(&config)
        .arg("--request")
        .arg(&request)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "policy test printed no JSON ({e}): {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn as_caller<T>(message: T, service_account: &str) -> Request<T> {
    let mut request = Request::new(message);
    let metadata = request.metadata_mut();
    metadata.insert("x-podca-namespace", "shop".parse().unwrap());
    metadata.insert("x-podca-service-account", service_account.parse().unwrap());
    request
}

/// The rule's refusal, as the server said it and as policy test says it.
fn assert_same_refusal(status: &tonic::Status, offline: &Value) {
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), "AdminRefused: admin is refused");
    assert_eq!(offline["decision"], "Denied", "{offline:#}");
    assert_eq!(offline["reason"], "AdminRefused");
    assert_eq!(offline["message"], "admin is refused");
}

/// `exp - iat` of a JWT.
fn token_lifetime(token: &str) -> i64 {
    let payload = token.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_test_and_podca_dev_agree_on_certificates_and_jwt_svids() {
    let dir = tempfile::tempdir().unwrap();
    let dev = DevProcess::start_with(DevOptions {
        config: Some(CONFIG),
        ..DevOptions::default()
    });
    let mut client = dev.tcp_client().await;

    // A certificate: DNS names from the template, 24 h asked, the 12 h cap applies.
    let key = rcgen::KeyPair::generate().unwrap();
    let issued = client
        .issue_certificate(as_caller(
            IssueCertificateRequest {
                csr: csr_for(&key),
                requested_lifetime_seconds: Some(86_400),
                ..Default::default()
            },
            "web",
        ))
        .await
        .unwrap()
        .into_inner();
    let leaf = pem::parse_many(&issued.certificate_chain_pem).unwrap()[0]
        .contents()
        .to_vec();
    let (_, cert) = X509Certificate::from_der(&leaf).unwrap();
    let served_lifetime =
        cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    let mut served_dns: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect();
    served_dns.sort();
    let offline = policy_test(
        dir.path(),
        "source: grpc\nnamespace: shop\nservice_account: web\nrequested_lifetime_seconds: 86400\n",
    );
    assert_eq!(offline["decision"], "Issued", "{offline:#}");
    assert_eq!(offline["issued"]["spiffe_id"], issued.spiffe_id);
    assert_eq!(
        offline["issued"]["dns_names"],
        serde_json::json!(served_dns),
        "{offline:#}"
    );
    assert_eq!(served_dns, ["web.shop.svc"]);
    assert_eq!(offline["issued"]["lifetime_seconds"], served_lifetime);
    assert_eq!(served_lifetime, 43_200);

    // JWT-SVIDs: the rules' cap (120 s for `short`), and `[jwt]`'s own maximum otherwise.
    for (audience, asked, expected) in [("short", 3600, 120), ("long", 3000, 3000)] {
        let svid = client
            .issue_jwt_svid(as_caller(
                IssueJwtSvidRequest {
                    audiences: vec![audience.into()],
                    requested_lifetime_seconds: Some(asked),
                    ..Default::default()
                },
                "web",
            ))
            .await
            .unwrap()
            .into_inner();
        let served = token_lifetime(&svid.token);
        let offline = policy_test(
            dir.path(),
            &format!(
                "source: jwt\nnamespace: shop\nservice_account: web\naudiences: [{audience}]\n\
                 requested_lifetime_seconds: {asked}\n"
            ),
        );
        assert_eq!(offline["decision"], "Issued", "{offline:#}");
        assert_eq!(offline["issued"]["spiffe_id"], svid.spiffe_id);
        assert_eq!(
            offline["issued"]["lifetime_seconds"], served,
            "audience {audience}: {offline:#}"
        );
        assert_eq!(served, expected, "audience {audience}");
    }

    // Refused by the rule, with the same reason and message on both paths.
    let status = client
        .issue_jwt_svid(as_caller(
            IssueJwtSvidRequest {
                audiences: vec!["long".into()],
                ..Default::default()
            },
            "admin",
        ))
        .await
        .unwrap_err();
    let offline = policy_test(
        dir.path(),
        "source: jwt\nnamespace: shop\nservice_account: admin\naudiences: [long]\n",
    );
    assert_same_refusal(&status, &offline);
    let status = client
        .issue_certificate(as_caller(
            IssueCertificateRequest {
                csr: csr_for(&key),
                ..Default::default()
            },
            "admin",
        ))
        .await
        .unwrap_err();
    let offline = policy_test(
        dir.path(),
        "source: grpc\nnamespace: shop\nservice_account: admin\n",
    );
    assert_same_refusal(&status, &offline);
    drop(client);
    assert!(dev.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_test_and_podca_dev_agree_on_declared_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let dev = DevProcess::start_with(DevOptions {
        config: Some(CONFIG),
        ..DevOptions::default()
    });
    let mut client = dev.tcp_client().await;
    for (key, value, expected) in [
        ("example.com/ticket", "T-42", None),
        (
            "example.com/ticket",
            "T-0",
            Some(("TicketClosed", "ticket T-0 is closed")),
        ),
        (
            "example.com/ticket",
            "X-1",
            Some((
                "InvalidUnverifiedUserAnnotations",
                "user annotation \"example.com/ticket\" does not match its declared pattern \"T-*\"",
            )),
        ),
        (
            "example.com/ticket",
            "T-123456789",
            Some((
                "InvalidUnverifiedUserAnnotations",
                "user annotation \"example.com/ticket\" is 11 bytes long, over its declared maximum of 8",
            )),
        ),
        (
            "example.com/flavour",
            "x",
            Some((
                "InvalidUnverifiedUserAnnotations",
                "unrecognised user annotation \"example.com/flavour\"; this signer recognises only \
                 \"podca.dev/dns-names\", \"example.com/ticket\"",
            )),
        ),
    ] {
        let key_pair = rcgen::KeyPair::generate().unwrap();
        let served = client
            .issue_certificate(as_caller(
                IssueCertificateRequest {
                    csr: csr_for(&key_pair),
                    user_annotations: [(key.to_owned(), value.to_owned())].into(),
                    ..Default::default()
                },
                "web",
            ))
            .await;
        let offline = policy_test(
            dir.path(),
            &format!(
                "source: grpc\nnamespace: shop\nservice_account: web\nannotations:\n  {key}: \"{value}\"\n"
            ),
        );
        match expected {
            None => {
                served.unwrap_or_else(|s| panic!("{key}={value}: {s:?}"));
                assert_eq!(offline["decision"], "Issued", "{key}={value}: {offline:#}");
            }
            Some((reason, message)) => {
                let status = served.expect_err("refused");
                assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
                assert_eq!(status.message(), format!("{reason}: {message}"));
                assert_eq!(offline["decision"], "Denied", "{offline:#}");
                assert_eq!(offline["reason"], reason, "{offline:#}");
                assert_eq!(offline["message"], message, "{offline:#}");
            }
        }
    }
}
