//! The end of mTLS renewal (issue #40, item 3), as an attacker would try to live off a
//! certificate: the real `podca serve` binary against the API emulator (harness:
//! `grpc_serve/mod.rs`), clients presenting podca certificates over real TLS handshakes.
//!
//! * Token-issued certificates carry where their renewal chain began (checked with openssl);
//!   a renewal keeps that origin and never outlives `max_renewal_seconds`.
//! * A certificate whose chain is older than the bound no longer renews; a token still works.
//! * A service account deleted, or deleted and re-created under the same name, stops renewing.
//! * `podca renewal --deny-serial/--deny-identity` stops renewal within seconds, `--allow-*`
//!   restores it; the ledger records the method and the presented serial.
//! * podca's own serving certificate is a ledger record too.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

mod grpc_serve;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration as StdDuration, Instant};

use grpc_serve::{Cluster, expect_code, with_token};
use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::{IssueCertificateRequest, IssueCertificateResponse};
use podca_signer::renewal::{OID_DOTTED, RenewalChain};
use podca_signer::{FileStore, Validity};
use podca_tests::emulator::{Res, ServiceAccountToken};
use podca_tests::process::{csr_for, podca_binary};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use time::{Duration, OffsetDateTime};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// A client credential: chain PEM and key PEM.
type Credential = (String, String);

/// A token for `shop/<sa>` whose TokenReview says the service account's UID `uid`.
fn token(cluster: &Cluster, sa: &str, uid: &str) -> String {
    let emu = &cluster.emu;
    emu.add_service_account_token(ServiceAccountToken {
        namespace: "shop".into(),
        service_account: sa.into(),
        service_account_uid: uid.into(),
        audiences: vec!["podca".into()],
        expires: emu.now() + Duration::hours(1),
        pod_name: None,
        pod_uid: None,
        node_name: None,
        node_uid: None,
        credential_id: podca_tests::emulator::new_uid(),
    })
}

/// A TLS gRPC client of `cluster` presenting `credential`, if any.
async fn client(cluster: &Cluster, credential: Option<&Credential>) -> PodCaClient<Channel> {
    podca_tests::tls::mtls_client(
        SocketAddr::from(([127, 0, 0, 1], cluster.grpc)),
        &cluster.anchors,
        credential.map(|(chain, key)| (chain.as_str(), key.as_str())),
    )
    .await
}

/// IssueCertificate with `credential` presented and `token` (if any); the new credential.
async fn issue(
    cluster: &Cluster,
    credential: Option<&Credential>,
    token: Option<&str>,
) -> Result<(Credential, IssueCertificateResponse), Status> {
    let key = rcgen::KeyPair::generate().unwrap();
    let request = IssueCertificateRequest {
        csr: csr_for(&key),
        ..Default::default()
    };
    let answer = client(cluster, credential)
        .await
        .issue_certificate(with_token(request, token))
        .await?
        .into_inner();
    Ok((
        (answer.certificate_chain_pem.clone(), key.serialize_pem()),
        answer,
    ))
}

fn leaf_der(chain_pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

fn chain_of(credential: &Credential) -> RenewalChain {
    RenewalChain::of_leaf(&leaf_der(&credential.0)).unwrap()
}

/// `podca renewal --denylist <file> <args>`: its stdout (the list now in force).
fn podca_renewal(denylist: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(podca_binary())
        .arg("renewal")
        .arg("--denylist")
        .arg(denylist)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Retries `renew` until its result satisfies `done` (the denylist is re-read every 2 s).
async fn eventually<F, Fut>(what: &str, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + StdDuration::from_secs(15);
    while !attempt().await {
        assert!(Instant::now() < deadline, "{what} within 15 s");
        tokio::time::sleep(StdDuration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_renews_only_within_its_chain_and_while_its_account_lives() {
    let dir = tempfile::tempdir().unwrap();
    let denylist = dir.path().join("renewal-denylist");
    let cluster = Cluster::start_with(&format!(
        "renewal_denylist = {:?}\n",
        denylist.display().to_string()
    ))
    .await;
    let web_uid = cluster.emu.add_service_account("shop", "web");
    let web_token = token(&cluster, "web", &web_uid);

    // A token starts a chain: now, with the account's UID (openssl sees the extension too).
    let before = OffsetDateTime::now_utc() - Duration::seconds(2);
    let (first, _) = issue(&cluster, None, Some(&web_token)).await.unwrap();
    let chain = chain_of(&first);
    assert!(chain.origin >= before, "{chain:?}");
    assert_eq!(chain.service_account_uid.as_deref(), Some(web_uid.as_str()));
    let text = openssl_text(&first.0);
    assert!(text.contains(OID_DOTTED), "{text}");

    // Renewed over mTLS (no token): the same origin, and no later than origin + 24 h.
    let (second, answer) = issue(&cluster, Some(&first), None).await.unwrap();
    assert_eq!(chain_of(&second).origin, chain.origin);
    let not_after = answer.not_after.unwrap().seconds;
    assert!(not_after <= (chain.origin + Duration::hours(24)).unix_timestamp());

    // A certificate of a chain that began 25 h ago (signed by podca's CA: the state a
    // workload reaches after a day of renewals) no longer renews; a token still works.
    let ca = FileStore::new(cluster.ca_dir()).load().unwrap();
    let key = podca_signer::keys::GeneratedKey::generate(podca_signer::KeyType::EcdsaP256).unwrap();
    let now = OffsetDateTime::now_utc();
    let old = ca
        .issue_in_chain(
            &key.public,
            "spiffe://cluster.local/ns/shop/sa/web",
            &Validity {
                not_before: now - Duration::minutes(5),
                not_after: now + Duration::hours(1),
                begin_refresh_at: now + Duration::minutes(30),
            },
            &RenewalChain::starting(now - Duration::hours(25), Some(web_uid.clone())),
        )
        .unwrap();
    let old: Credential = (old.chain_pem, key.private_key_pem());
    expect_code(
        issue(&cluster, Some(&old), None).await,
        Code::Unauthenticated,
        "renewal ends after",
    );
    let (fresh, _) = issue(&cluster, Some(&old), Some(&web_token)).await.unwrap();
    assert!(
        chain_of(&fresh).origin >= before,
        "a token starts a new chain"
    );

    // The denylist: a serial, then the identity; lifted again with --allow-*.
    let second_serial = podca_signer::x509::hex_lower(
        x509_parser::parse_x509_certificate(&leaf_der(&second.0))
            .unwrap()
            .1
            .raw_serial(),
    );
    let listed = podca_renewal(&denylist, &["--deny-serial", &second_serial]);
    assert!(listed.contains(&format!("serial {}", second_serial.trim_start_matches('0'))));
    eventually("the serial is refused", || async {
        matches!(issue(&cluster, Some(&second), None).await,
            Err(s) if s.code() == Code::Unauthenticated && s.message().contains("denylist"))
    })
    .await;
    issue(&cluster, Some(&first), None)
        .await
        .expect("another serial of the identity still renews");
    podca_renewal(
        &denylist,
        &["--deny-identity", "spiffe://cluster.local/ns/shop/sa/web"],
    );
    eventually("the identity is refused", || async {
        matches!(issue(&cluster, Some(&first), None).await,
            Err(s) if s.code() == Code::Unauthenticated && s.message().contains("denylist"))
    })
    .await;
    issue(&cluster, Some(&first), Some(&web_token))
        .await
        .expect("a token is not subject to the renewal denylist");
    podca_renewal(
        &denylist,
        &[
            "--allow-serial",
            &second_serial,
            "--allow-identity",
            "spiffe://cluster.local/ns/shop/sa/web",
        ],
    );
    eventually("renewal is allowed again", || async {
        issue(&cluster, Some(&second), None).await.is_ok()
    })
    .await;

    // An account deleted and re-created under the same name (another UID) does not inherit
    // the old one's certificates; a deleted one renews nothing.
    let db_uid = cluster.emu.add_service_account("shop", "db");
    let (db, _) = issue(&cluster, None, Some(&token(&cluster, "db", &db_uid)))
        .await
        .unwrap();
    assert!(cluster.emu.delete_object(Res::ServiceAccount, "shop", "db"));
    cluster.emu.add_service_account("shop", "db");
    expect_code(
        issue(&cluster, Some(&db), None).await,
        Code::Unauthenticated,
        "was re-created",
    );
    let api_uid = cluster.emu.add_service_account("shop", "api");
    let (api, _) = issue(&cluster, None, Some(&token(&cluster, "api", &api_uid)))
        .await
        .unwrap();
    assert!(
        cluster
            .emu
            .delete_object(Res::ServiceAccount, "shop", "api")
    );
    expect_code(
        issue(&cluster, Some(&api), None).await,
        Code::Unauthenticated,
        "no longer exists",
    );

    // The ledger says how each was authenticated and which certificate was presented.
    let mut cluster = cluster;
    cluster.kill_serve();
    let out = Command::new(podca_binary())
        .args(["ledger", "list", "--json", "--identity"])
        .arg("spiffe://cluster.local/ns/shop/sa/web")
        .arg("--dir")
        .arg(cluster.ca_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let renewal = records
        .iter()
        .find(|r| r["serial"] == answer.serial.as_str())
        .expect("the renewal's record");
    let first_serial = podca_signer::x509::hex_lower(
        x509_parser::parse_x509_certificate(&leaf_der(&first.0))
            .unwrap()
            .1
            .raw_serial(),
    );
    assert_eq!(renewal["auth"]["method"], "certificate", "{renewal}");
    assert_eq!(
        renewal["auth"]["presented_serial"]
            .as_str()
            .map(|s| s.trim_start_matches('0')),
        Some(first_serial.trim_start_matches('0')),
        "{renewal}"
    );
    assert!(
        records.iter().any(|r| r["auth"]["method"] == "token"),
        "the token issuance is recorded as such"
    );
}

/// `openssl x509 -text` of the leaf of `chain_pem`.
fn openssl_text(chain_pem: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leaf.pem");
    std::fs::write(&path, chain_pem).unwrap();
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// podca's own serving certificate is a ledger record like every certificate podca signs
/// (issue #40): source `serving`, requester `podca`, the serial the listener serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_is_in_the_ledger() {
    let mut cluster = Cluster::start().await;
    let chain = podca_tests::tls::served_chain(
        SocketAddr::from(([127, 0, 0, 1], cluster.grpc)),
        &cluster.anchors,
        podca_tests::tls::SERVER_NAME,
    )
    .await
    .unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).unwrap();
    let serial = podca_signer::x509::hex_lower(leaf.raw_serial());
    // Recorded as the renewal task starts, a moment after the listener opens: wait for the
    // ledger's first commit (nothing else is issued here), then read it.
    let deadline = Instant::now() + StdDuration::from_secs(10);
    let series = r#"podca_ledger_records_total{backend="redb",outcome="issued"}"#;
    while podca_tests::process::metric_value(&cluster.metrics(), series) < 1.0 {
        assert!(Instant::now() < deadline, "a ledger commit within 10 s");
        tokio::time::sleep(StdDuration::from_millis(50)).await;
    }
    // redb allows one process: read it once podca serve has stopped.
    cluster.kill_serve();
    let out = Command::new(podca_binary())
        .args(["ledger", "list", "--json", "--dir"])
        .arg(cluster.ca_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let record = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["source"] == "serving")
        .expect("a record of source serving");
    assert_eq!(
        record["serial"].as_str().map(|s| s.trim_start_matches('0')),
        Some(serial.trim_start_matches('0')),
        "{record}"
    );
    assert_eq!(record["requester"], "podca", "{record}");
    assert_eq!(
        record["identity"], "spiffe://cluster.local/ns/podca-system/sa/podca",
        "{record}"
    );
}
