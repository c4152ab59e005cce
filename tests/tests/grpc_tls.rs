//! TLS on podca serve's gRPC listener (issue #12, item 1).
//!
//! * The real `podca serve` against the API emulator: a client that trusts only the anchors
//!   `podca bundle` prints and verifies the documented server name issues a certificate; a
//!   plaintext client, a client verifying another name and a client trusting a foreign root are
//!   refused; openssl (independent of aws-lc and rustls) verifies the served chain and name;
//!   `podca issue --server https://…` works with `--ca-file` and names a wrong `--server-name`.
//! * `podca issue --server-name spiffe://…` pins podca's SPIFFE ID: podca's own issues, any
//!   other ID fails in the handshake before a token is sent (issue #40).
//! * `tls = "off"`: refused on a non-loopback address unless `insecure_plaintext = true`, which
//!   the `podca_grpc_insecure_plaintext` gauge shows.
//! * A WatchTrustBundle stream over TLS gets its first bundle, then a rotated one, beside unary
//!   calls on the same connection.
//! * In process: after the active CA changes, the served certificate chains to the new CA at
//!   once, and a connection opened before keeps working.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podca_proto::podca::v1::pod_ca_client::PodCaClient;
use podca_proto::podca::v1::{GetTrustBundleRequest, IssueCertificateRequest};
use podca_tests::cluster::{ClusterConfig, PODCA_USER};
use podca_tests::emulator::{ApiMode, PolicyRule, ServiceAccountToken, Subject};
use podca_tests::process::{
    csr_for, free_port, http_get, podca_binary, podca_bundle, podca_ca_rotate,
};
use podca_tests::tls::{SERVER_NAME, TlsChannel, served_chain};
use podca_tests::verify::assert_verifies;
use podca_tests::{Emulator, EmulatorConfig};
use tonic::Request;

const SIGNER: &str = "example.com/workload";

/// The emulator (TokenReviews allowed), a CA data directory and a running `podca serve`.
struct Serve {
    emu: Emulator,
    child: Child,
    grpc: u16,
    admin: u16,
    ca_dir: PathBuf,
    log: PathBuf,
    dir: tempfile::TempDir,
}

async fn emulator() -> (Emulator, tempfile::TempDir, PathBuf) {
    let podca_tests::cluster::Cluster {
        emu,
        dir,
        kubeconfig,
        ..
    } = podca_tests::cluster::Cluster::start_with(ClusterConfig {
        emulator: EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            ..Default::default()
        },
        podca_groups: &["system:serviceaccounts"],
        signers: &[],
    })
    .await;
    emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
    );
    (emu, dir, kubeconfig)
}

fn ca_init(dir: &Path) {
    ca_init_named(dir, "podca");
}

fn ca_init_named(dir: &Path, name: &str) {
    let status = Command::new(podca_binary())
        .args(["ca", "init", "--name", name, "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

impl Serve {
    /// `podca serve` with `grpc_table` (lines of `[grpc]`) on `listen_ip`.
    async fn start(grpc_table: &str, listen_ip: &str) -> Serve {
        let (emu, dir, kubeconfig) = emulator().await;
        let ca_dir = dir.path().join("ca");
        ca_init(&ca_dir);
        let (grpc, admin) = (free_port(), free_port());
        let config = dir.path().join("podca.toml");
        std::fs::write(
            &config,
            format!(
                "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
                 [grpc]\n{grpc_table}",
                ca_dir.display().to_string()
            ),
        )
        .unwrap();
        let log = dir.path().join("serve.log");
        let child = Command::new(podca_binary())
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--grpc-listen", &format!("{listen_ip}:{grpc}")])
            .env("PODCA_LOG", "info")
            .env_remove("POD_NAMESPACE")
            .env_remove("PODCA_SERVICE_ACCOUNT")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut serve = Serve {
            emu,
            child,
            grpc,
            admin,
            ca_dir,
            log,
            dir,
        };
        serve.wait_listening();
        serve
    }

    fn wait_listening(&mut self) {
        podca_tests::process::wait_listening(&mut self.child, self.grpc, &self.log);
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.grpc))
    }

    fn anchors(&self) -> String {
        podca_bundle(&self.ca_dir)
    }

    /// A token TokenReview accepts for `default/app`, audience `podca`.
    fn token(&self) -> String {
        self.emu.add_service_account_token(ServiceAccountToken {
            namespace: "default".into(),
            service_account: "app".into(),
            service_account_uid: podca_tests::emulator::new_uid(),
            audiences: vec!["podca".into()],
            expires: self.emu.now() + time::Duration::hours(1),
            pod_name: None,
            pod_uid: None,
            node_name: None,
            node_uid: None,
            credential_id: podca_tests::emulator::new_uid(),
        })
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- podca serve log ---\n{}", self.log_text());
        }
    }
}

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

fn csr_request() -> IssueCertificateRequest {
    IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        ..Default::default()
    }
}

/// The SANs of a DER certificate, as x509-parser prints them.
fn sans(der: &[u8]) -> Vec<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| n.to_string())
        .collect()
}

fn to_pem(ders: &[rustls::pki_types::CertificateDer<'_>]) -> String {
    ders.iter()
        .map(|d| pem::encode(&pem::Pem::new("CERTIFICATE", d.to_vec())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_speaks_tls_that_clients_verify_with_the_published_anchors() {
    let serve = Serve::start(podca_tests::tls::GRPC_TLS_CONFIG, "127.0.0.1").await;
    let anchors = serve.anchors();
    let token = serve.token();

    // A client trusting only the anchors, verifying the documented name, issues.
    let channel = TlsChannel::connect(serve.addr(), &anchors, SERVER_NAME)
        .await
        .expect("a verified TLS connection");
    let answer = channel
        .client()
        .issue_certificate(with_token(csr_request(), &token))
        .await
        .expect("IssueCertificate over TLS")
        .into_inner();
    assert_verifies(&answer.certificate_chain_pem, &anchors);
    assert!(answer.spiffe_id.ends_with("/ns/default/sa/app"));

    // The served chain: the leaf names podca's SPIFFE ID and its Service, and chains to the
    // anchors (openssl checks the name and the chain independently below).
    let chain = served_chain(serve.addr(), &anchors, SERVER_NAME)
        .await
        .unwrap();
    let names = sans(&chain[0]);
    for want in [
        "URI(spiffe://cluster.local/ns/podca-system/sa/podca)",
        "DNSName(podca)",
        "DNSName(podca.podca-system)",
        "DNSName(podca.podca-system.svc)",
        "DNSName(podca.podca-system.svc.cluster.local)",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    assert_verifies(&to_pem(&chain), &anchors);

    // Plaintext HTTP/2 to the same port gets no gRPC answer.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", serve.addr()))
        .unwrap()
        .timeout(Duration::from_secs(15));
    // The TLS listener reads the HTTP/2 preface as a bad TLS record and closes: the call fails
    // in the transport (a protocol error, a broken pipe or a closed connection, as the race
    // goes), never with a status the server sent.
    let refused = match endpoint.connect().await {
        Ok(channel) => {
            let status = PodCaClient::new(channel)
                .get_trust_bundle(GetTrustBundleRequest::default())
                .await
                .expect_err("a plaintext client got an answer");
            let transport = std::error::Error::source(&status)
                .is_some_and(|e| e.is::<tonic::transport::Error>());
            assert!(transport, "not a transport failure: {status:?}");
            status.to_string()
        }
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains("h2 protocol error")
            || refused.contains("transport error")
            || refused.contains("connection closed"),
        "{refused}"
    );
    // And raw: the HTTP/2 preface gets no HTTP/2 SETTINGS frame back (a TLS alert or a close).
    let reply = raw_reply(
        serve.addr(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0",
    );
    assert!(
        reply.len() < 9 || reply[3] != 0x04,
        "the server answered plaintext HTTP/2: {reply:02x?}"
    );

    // The wrong name, and a foreign root: the handshake fails, for that reason.
    let wrong = served_chain(serve.addr(), &anchors, "podca.elsewhere.svc")
        .await
        .unwrap_err();
    assert!(
        matches!(
            tls_error(&wrong),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. }
            ))
        ),
        "{wrong}"
    );
    // A foreign root under another name is no issuer; one under podca's own name (another
    // installation's default) is found by name but its signature does not verify.
    for (name, expected) in [
        ("foreign", rustls::CertificateError::UnknownIssuer),
        ("podca", rustls::CertificateError::BadSignature),
    ] {
        let foreign_dir = serve.dir.path().join(format!("foreign-{name}"));
        ca_init_named(&foreign_dir, name);
        let foreign = served_chain(serve.addr(), &podca_bundle(&foreign_dir), SERVER_NAME)
            .await
            .unwrap_err();
        assert_eq!(
            tls_error(&foreign),
            Some(&rustls::Error::InvalidCertificate(expected)),
            "{name}: {foreign}"
        );
    }
    // The server is still serving everyone else, and the first connection still works.
    channel
        .client()
        .issue_certificate(with_token(csr_request(), &token))
        .await
        .expect("the first connection still issues");
    assert_eq!(channel.connection_count(), 1);

    // openssl: an implementation independent of aws-lc and rustls verifies chain and name.
    let anchors_file = serve.dir.path().join("anchors.pem");
    std::fs::write(&anchors_file, &anchors).unwrap();
    let (ok, out) = s_client(serve.addr(), &anchors_file, SERVER_NAME);
    assert!(ok && out.contains("Verify return code: 0 (ok)"), "{out}");
    assert!(out.contains("ALPN protocol: h2"), "{out}");
    let (ok, out) = s_client(serve.addr(), &anchors_file, "podca.elsewhere.svc");
    assert!(!ok && out.contains("hostname mismatch"), "{out}");

    // podca issue --server https://… with --ca-file, and its error for a wrong --server-name.
    let token_file = serve.dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let out_file = serve.dir.path().join("issued.pem");
    let url = format!("https://127.0.0.1:{}", serve.grpc);
    let issue = |server_name: &str, out: &Path| {
        Command::new(podca_binary())
            .args(["issue", "--server", &url, "--ca-file"])
            .arg(&anchors_file)
            .args(["--server-name", server_name, "--token-file"])
            .arg(&token_file)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    let o = issue(SERVER_NAME, &out_file);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bundle = std::fs::read_to_string(&out_file).unwrap();
    assert!(
        bundle.starts_with("-----BEGIN PRIVATE KEY-----"),
        "{bundle}"
    );
    let chain_start = bundle.find("-----BEGIN CERTIFICATE-----").unwrap();
    assert_verifies(&bundle[chain_start..], &anchors);
    let o = issue("podca.elsewhere.svc", &serve.dir.path().join("never.pem"));
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot connect to {url}: TLS: the server's certificate is not valid for \
             \"podca.elsewhere.svc\""
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The name defaults to the URL's host, which the certificate does not carry.
    let o = Command::new(podca_binary())
        .args(["issue", "--server", &url, "--ca-file"])
        .arg(&anchors_file)
        .arg("--token-file")
        .arg(&token_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("not valid for \"127.0.0.1\""),
        "{stderr}"
    );
    // The refusal names what the certificate carries (issue #47 item 7).
    assert!(
        stderr.contains("; it carries spiffe://") && stderr.contains(&format!(", {SERVER_NAME}")),
        "{stderr}"
    );
    // Plaintext against the TLS listener: the fix is said.
    let plain = url.replacen("https://", "http://", 1);
    let o = Command::new(podca_binary())
        .args(["issue", "--server", &plain])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && stderr.contains(&format!("use --server {url} with --ca-file"))
            && stderr.lines().count() == 1,
        "{stderr}"
    );

    let metrics = http_get(serve.admin, "/metrics").unwrap().1;
    assert!(
        metrics.contains("podca_grpc_insecure_plaintext 0"),
        "{metrics}"
    );
}

/// Server streaming over TLS, through the cork that holds each answer until the next flush or
/// read (`grpc/src/cork.rs`): WatchTrustBundle's first bundle arrives, unary calls on the same
/// connection are answered while the stream stays open, and a rotation's bundle arrives
/// without the client sending anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stream_over_tls_gets_every_bundle_beside_unary_calls() {
    let serve = Serve::start(podca_tests::tls::GRPC_TLS_CONFIG, "127.0.0.1").await;
    let anchors = serve.anchors();
    let token = serve.token();
    let channel = TlsChannel::connect(serve.addr(), &anchors, SERVER_NAME)
        .await
        .expect("a verified TLS connection");
    let mut client = channel.client();
    let mut stream = client
        .watch_trust_bundle(with_token(GetTrustBundleRequest::default(), &token))
        .await
        .expect("WatchTrustBundle over TLS")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the first bundle within 5 s")
        .expect("a bundle, not a status")
        .expect("the stream stays open");
    assert_eq!(first.trust_anchors_pem.trim(), anchors.trim());
    for i in 0..20 {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            client.issue_certificate(with_token(csr_request(), &token)),
        )
        .await
        .unwrap_or_else(|_| panic!("call {i} answered within 5 s"))
        .expect("IssueCertificate beside the stream")
        .into_inner();
        assert_verifies(&answer.certificate_chain_pem, &anchors);
    }
    // A refusal is a lone HEADERS frame (gRPC's trailers-only answer), whose one flush the cork
    // holds until the task it woke runs again: the client, sending nothing meanwhile, gets it.
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        client.issue_certificate(Request::new(csr_request())),
    )
    .await
    .expect("a refusal within 5 s")
    .expect_err("no credentials");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    assert_eq!(channel.connection_count(), 1);

    // A rotation pushes a second bundle.
    podca_ca_rotate(&serve.ca_dir);
    let second = tokio::time::timeout(Duration::from_secs(15), stream.message())
        .await
        .expect("the rotated bundle within 15 s")
        .expect("a bundle, not a status")
        .expect("the stream stays open");
    assert_eq!(second.trust_anchors_pem.trim(), serve.anchors().trim());
    assert_eq!(
        second
            .trust_anchors_pem
            .matches("BEGIN CERTIFICATE")
            .count(),
        2
    );
    assert!(second.generation > first.generation);
}

/// Issue #40 (Low): a client pins podca's SPIFFE ID. `podca issue --server-name spiffe://…`
/// issues from podca, over an address its certificate carries no name for; pinning another
/// service account's ID (an impostor's, as a hijacked DNS name or port-forward would serve it)
/// fails in the handshake, before the token is sent: the emulator answers no TokenReview. A
/// certificate from another installation's CA with podca's ID is refused for its chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podca_issue_pins_podcas_spiffe_id_and_refuses_any_other() {
    const PODCA_ID: &str = "spiffe://cluster.local/ns/podca-system/sa/podca";
    let serve = Serve::start(podca_tests::tls::GRPC_TLS_CONFIG, "127.0.0.1").await;
    let anchors_file = serve.dir.path().join("anchors.pem");
    std::fs::write(&anchors_file, serve.anchors()).unwrap();
    let url = format!("https://127.0.0.1:{}", serve.grpc);
    // Each attempt sends a token TokenReview has never seen, so one sent is one reviewed.
    let issue = |anchors: &Path, server_name: &str, out: &Path| {
        let token_file = out.with_extension("token");
        std::fs::write(&token_file, serve.token()).unwrap();
        Command::new(podca_binary())
            .args(["issue", "--server", &url, "--ca-file"])
            .arg(anchors)
            .args(["--server-name", server_name, "--token-file"])
            .arg(&token_file)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    let reviews = || serve.emu.counters().token_reviews;

    let before = reviews();
    let out_file = serve.dir.path().join("pinned.pem");
    let o = issue(&anchors_file, PODCA_ID, &out_file);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bundle = std::fs::read_to_string(&out_file).unwrap();
    let chain_start = bundle.find("-----BEGIN CERTIFICATE-----").unwrap();
    assert_verifies(&bundle[chain_start..], &serve.anchors());
    assert_eq!(
        reviews(),
        before + 1,
        "the pinned call's token was reviewed"
    );

    for pinned in [
        "spiffe://cluster.local/ns/podca-system/sa/impostor",
        "spiffe://example.org/ns/podca-system/sa/podca",
    ] {
        let before = reviews();
        let never = serve.dir.path().join("never.pem");
        let o = issue(&anchors_file, pinned, &never);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{pinned}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "cannot connect to {url}: TLS: the server's certificate is for {PODCA_ID}, not \
                 the pinned {pinned}"
            )),
            "{pinned}: {stderr}"
        );
        assert_eq!(reviews(), before, "{pinned}: a token left the client");
        assert!(!never.exists());
    }

    // Another installation's CA: podca's ID under it is no podca's.
    let foreign_dir = serve.dir.path().join("foreign");
    ca_init_named(&foreign_dir, "foreign");
    let foreign_anchors = serve.dir.path().join("foreign.pem");
    std::fs::write(&foreign_anchors, podca_bundle(&foreign_dir)).unwrap();
    let before = reviews();
    let o = issue(
        &foreign_anchors,
        PODCA_ID,
        &serve.dir.path().join("never.pem"),
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && stderr
                .contains("TLS: the server's certificate does not chain to an anchor in --ca-file"),
        "{stderr}"
    );
    assert_eq!(reviews(), before);
}

/// The rustls error a failed handshake carries.
fn tls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref())
}

/// What the server sends back within 5 s for `bytes` sent over plain TCP.
fn raw_reply(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let mut reply = vec![];
    let _ = s.read_to_end(&mut reply);
    reply
}

/// `openssl s_client` verifying `name` against `anchors`; (success, output).
fn s_client(addr: SocketAddr, anchors: &Path, name: &str) -> (bool, String) {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-CAfile"])
        .arg(anchors)
        .args([
            "-verify_hostname",
            name,
            "-servername",
            name,
            "-verify_return_error",
            "-alpn",
            "h2",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("openssl is installed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_off_loopback_needs_insecure_plaintext_and_shows_in_the_gauge() {
    // Refused at start, naming the keys.
    let (_emu, dir, kubeconfig) = emulator().await;
    let ca_dir = dir.path().join("ca");
    ca_init(&ca_dir);
    let config = dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
             [grpc]\ntls = \"off\"\n",
            ca_dir.display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(podca_binary())
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--grpc-listen", &format!("0.0.0.0:{}", free_port())])
        .args(["--admin-listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[grpc] tls = \"off\" on 0.0.0.0:")
            && stderr.contains("set insecure_plaintext = true"),
        "{stderr}"
    );
    drop(dir);

    // Allowed with insecure_plaintext, logged, and shown.
    let serve = Serve::start("tls = \"off\"\ninsecure_plaintext = true\n", "0.0.0.0").await;
    let mut client = PodCaClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{}", serve.addr()))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let token = serve.token();
    client
        .issue_certificate(with_token(csr_request(), &token))
        .await
        .expect("plaintext IssueCertificate");
    let metrics = http_get(serve.admin, "/metrics").unwrap().1;
    assert!(
        metrics.contains("podca_grpc_insecure_plaintext 1"),
        "{metrics}"
    );
    assert!(
        serve
            .log_text()
            .contains("serving PLAINTEXT on a non-loopback address"),
        "{}",
        serve.log_text()
    );
}

mod rotation {
    //! In process: the serving certificate follows the CaHandle, as it does in `podca serve`
    //! when the rotation driver activates a new CA (it swaps the new CA into the handle).

    use std::collections::BTreeMap;

    use podca_authority::CaHandle;
    use podca_authority::config::DevIdentity;
    use podca_authority::serving_cert::{self, ServingIdentity};
    use podca_grpc::auth::DevAuthenticator;
    use podca_grpc::tls::{ServingKeys, certified_key, follow_serving_cert, server_config};
    use podca_grpc::{Api, ApiOptions, server};
    use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey, SignerPolicy};
    use time::OffsetDateTime;
    use tokio::net::TcpListener;
    use tokio::sync::watch;

    use super::*;

    fn ca(name: &str) -> IssuingCa {
        let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap();
        let root = IssuingCa::self_signed_root(
            Arc::new(key),
            &format!("{name} root"),
            OffsetDateTime::now_utc(),
            time::Duration::days(30),
        )
        .unwrap();
        // An intermediate, so the served chain has something besides the leaf.
        let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap();
        root.sign_intermediate(
            Arc::new(key),
            &format!("{name} issuing"),
            OffsetDateTime::now_utc(),
            time::Duration::days(20),
        )
        .unwrap()
    }

    fn dev_request() -> Request<IssueCertificateRequest> {
        let mut request = Request::new(csr_request());
        request
            .metadata_mut()
            .insert("x-podca-namespace", "default".parse().unwrap());
        request
            .metadata_mut()
            .insert("x-podca-service-account", "app".parse().unwrap());
        request
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_ca_change_the_serving_certificate_chains_to_the_new_ca_and_old_connections_live()
     {
        let first = ca("first");
        let first_roots = first.roots_pem();
        let handle = CaHandle::new(first, vec![]);
        let (stop, stopped) = watch::channel(false);
        let identity = ServingIdentity {
            spiffe_id: podca_signer::names::spiffe_id("cluster.local", "podca-system", "podca"),
            dns_names: serving_cert::service_dns_names("podca", "podca-system"),
            lifetime: serving_cert::DEFAULT_LIFETIME,
        };
        let clock = podca_authority::system_clock();
        let cert = identity.issue(&handle.current().ca, clock()).unwrap();
        let keys = ServingKeys::new(certified_key(&cert.chain_der, &cert.key_pkcs8_der).unwrap());
        let (current, follow) = watch::channel(Arc::new(cert));
        tokio::spawn(serving_cert::run(
            identity,
            handle.clone(),
            clock,
            current,
            None,
            stopped.clone(),
        ));
        tokio::spawn(follow_serving_cert(follow, Arc::clone(&keys)));
        let api = Api::new(
            ApiOptions {
                signers: BTreeMap::from([(
                    "default".into(),
                    SignerPolicy::permissive("cluster.local"),
                )]),
                default_signer: "default".into(),
                allowed_signers: vec![],
                max_dns_names: podca_grpc::core::DEFAULT_MAX_DNS_NAMES,
                node_proxy_service_accounts: vec![],
                rate_limit_per_identity: 0,
                max_open_streams: 100,
            },
            handle.clone(),
            Arc::new(DevAuthenticator::new(&[DevIdentity {
                uid: 0,
                namespace: "default".into(),
                service_account: "app".into(),
            }])),
            None,
            stopped.clone(),
        )
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut shutdown = stopped.clone();
        tokio::spawn(server::serve_tls(
            listener,
            server_config(keys, None).unwrap(),
            Arc::new(api),
            podca_grpc::connections::ConnectionLimits::default(),
            async move {
                let _ = shutdown.wait_for(|s| *s).await;
            },
        ));

        // Before: a connection verified against the first CA's root.
        let before = TlsChannel::connect(addr, &first_roots, SERVER_NAME)
            .await
            .unwrap();
        before
            .client()
            .issue_certificate(dev_request())
            .await
            .expect("issues before the change");

        // The change: a new active CA, both roots trusted (as during a rotation).
        let second = ca("second");
        let second_roots = second.roots_pem();
        let second_issuing = second.certificate().der().to_vec();
        let anchors: Vec<_> = handle
            .current()
            .anchors
            .iter()
            .cloned()
            .chain(second.roots().iter().cloned())
            .collect();
        handle.replace(second, anchors);

        // A new handshake trusting only the new root succeeds: the served chain is leaf + the
        // new issuing CA.
        let deadline = Instant::now() + Duration::from_secs(10);
        let chain = loop {
            match served_chain(addr, &second_roots, SERVER_NAME).await {
                Ok(chain) => break chain,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "the serving certificate never chained to the new CA: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1].as_ref(), second_issuing.as_slice());
        assert_verifies(&to_pem(&chain), &second_roots);
        // …and the old root no longer verifies a new handshake.
        assert_eq!(
            podca_tests::tls::refused_certificate(
                served_chain(addr, &first_roots, SERVER_NAME).await
            ),
            rustls::CertificateError::UnknownIssuer
        );

        // The connection opened before the change keeps working, on the same connection, and
        // what it issues now comes from the new CA.
        let answer = before
            .client()
            .issue_certificate(dev_request())
            .await
            .expect("the old connection still issues")
            .into_inner();
        assert_eq!(before.connection_count(), 1);
        assert_verifies(&answer.certificate_chain_pem, &second_roots);
        stop.send_replace(true);
    }
}
