//! `podca dev` as a command: CA creation and reuse, credential bundles, clean shutdown.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::time::Duration;

use podca_tests::process::{DevOptions, DevProcess, csr_for, podca_binary};
use podca_tests::verify::{assert_verifies, pem_blocks};

/// `[dev] identities` maps another user: the socket lets everyone connect (0666) and tells
/// callers apart by uid, as before.
#[test]
fn a_socket_for_other_users_is_open_to_them() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    let config = format!(
        "[[dev.identities]]\nuid = {me}\nnamespace = \"default\"\nservice_account = \"default\"\n\
         [[dev.identities]]\nuid = {}\nnamespace = \"apps\"\nservice_account = \"web\"\n",
        me + 1
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        ..Default::default()
    });
    let mode = std::fs::metadata(&dev.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666, "the Workload API socket is {mode:o}");
    assert!(dev.stop().success());
}

#[test]
fn creates_then_reuses_the_ca_and_removes_its_socket_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let first = DevProcess::start_with(DevOptions {
        data_dir: Some(data_dir.clone()),
        socket_outside: false,
        ..Default::default()
    });
    assert!(
        first
            .banner
            .iter()
            .any(|l| l.starts_with("podca dev: created the CA in"))
    );
    assert_eq!(first.socket, data_dir.join("workload.sock"));
    // The user's alone: no other local user can even connect.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&first.socket)
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "the Workload API socket is {mode:o}");
    }
    assert!(first.banner.iter().any(|l| l.contains("grpcurl")));
    let root = std::fs::read_to_string(data_dir.join("root.pem")).unwrap();
    let socket = first.socket.clone();
    let status = first.stop();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    assert!(!socket.exists(), "the socket is removed on shutdown");

    let second = DevProcess::start_with(DevOptions {
        data_dir: Some(data_dir.clone()),
        socket_outside: false,
        ..Default::default()
    });
    assert!(
        second
            .banner
            .iter()
            .any(|l| l.starts_with("podca dev: reusing the CA in"))
    );
    assert_eq!(
        std::fs::read_to_string(data_dir.join("root.pem")).unwrap(),
        root
    );
    assert!(second.stop().success());
}

#[test]
fn keeps_credential_bundles_and_renews_them_on_rotation() {
    let config = r#"
[[dev.bundles]]
namespace = "shop"
service_account = "web"
key_type = "ED25519"
"#;
    let dev = DevProcess::start_with(DevOptions {
        config: Some(config),
        args: vec!["--bundle".into(), "default/default".into()],
        ..Default::default()
    });
    // shop/web has the key type it is configured with, default/default (--bundle) the default.
    for (ns, sa, key_type) in [
        ("shop", "web", &rcgen::PKCS_ED25519),
        ("default", "default", &rcgen::PKCS_ECDSA_P256_SHA256),
    ] {
        let dir = dev.data_dir.join("bundles").join(ns).join(sa);
        assert!(
            dev.banner
                .iter()
                .any(|l| l.contains(&dir.display().to_string()))
        );
        let credential = wait_for_file(&dir.join("credentialbundle.pem"));
        let trust = wait_for_file(&dir.join("trust-bundle.pem"));
        let blocks = pem::parse_many(&credential).unwrap();
        assert_eq!(blocks[0].tag(), "PRIVATE KEY", "PKCS#8 key first");
        assert!(blocks[1..].iter().all(|b| b.tag() == "CERTIFICATE"));
        let chain: String = pem_blocks(&credential).concat();
        assert_verifies(&chain, &trust);
        let leaf = x509_parser::parse_x509_certificate(blocks[1].contents())
            .unwrap()
            .1;
        let uri = format!("spiffe://podca.dev.local/ns/{ns}/sa/{sa}");
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        assert!(format!("{:?}", san.value).contains(&uri));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("credentialbundle.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            bundle_key_algorithm(&credential),
            key_type,
            "{ns}/{sa}: the key type of the bundle"
        );
    }
    let dir = dev.data_dir.join("bundles/shop/web");
    let before = std::fs::read_to_string(dir.join("credentialbundle.pem")).unwrap();
    let new_anchors = dev.replace_ca_and_reload();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let trust = std::fs::read_to_string(dir.join("trust-bundle.pem")).unwrap_or_default();
        let credential =
            std::fs::read_to_string(dir.join("credentialbundle.pem")).unwrap_or_default();
        if trust == new_anchors && credential != before {
            assert_verifies(&credential, &new_anchors);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "bundle renewed after the rotation"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_bundle_flag_can_name_a_post_quantum_key_type() {
    // Without a config file the built-in signer takes the ML-DSA type the flag asks for.
    let dev = DevProcess::start_with(DevOptions {
        args: vec!["--bundle".into(), "shop/pq:MLDSA65".into()],
        ..Default::default()
    });
    let dir = dev.data_dir.join("bundles/shop/pq");
    let credential = wait_for_file(&dir.join("credentialbundle.pem"));
    let blocks = pem::parse_many(&credential).unwrap();
    assert_eq!(blocks[0].tag(), "PRIVATE KEY", "PKCS#8 key first");
    let leaf = x509_parser::parse_x509_certificate(blocks[1].contents())
        .unwrap()
        .1;
    assert_eq!(
        leaf.public_key().algorithm.algorithm.to_id_string(),
        "2.16.840.1.101.3.4.3.18",
        "id-ml-dsa-65 subject key"
    );
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    assert!(format!("{:?}", san.value).contains("spiffe://podca.dev.local/ns/shop/sa/pq"));
    assert!(dev.stop().success());
}

#[test]
fn a_bundle_flag_with_a_bad_key_type_or_one_the_signer_refuses_is_a_start_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let socket = tmp.path().join("s.sock");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "dev",
            "--grpc-listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir.to_str().unwrap(),
            "--socket",
            socket.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        podca(&args)
    };
    let (status, _, stderr) = run(&["--bundle", "shop/pq:MLDSA66"]);
    assert!(!status.success());
    assert!(
        stderr.contains(r#"--bundle "shop/pq:MLDSA66": unknown key type "MLDSA66""#)
            && stderr.contains("MLDSA65"),
        "{stderr}"
    );
    let (status, _, stderr) = run(&["--bundle", "shop:MLDSA65"]);
    assert!(!status.success());
    assert!(
        stderr.contains("expected namespace/service-account[:KEY_TYPE]"),
        "{stderr}"
    );
    // A config file's signer must list the key type itself.
    let config = tmp.path().join("podca.toml");
    std::fs::write(
        &config,
        "[signers.\"podca.dev/default\"]\ntrust_domain = \"podca.dev.local\"\n",
    )
    .unwrap();
    let (status, _, stderr) = run(&[
        "--config",
        config.to_str().unwrap(),
        "--bundle",
        "shop/pq:MLDSA65",
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("credential bundle shop/pq: key type MLDSA65 is not in signer")
            && stderr.contains("add it in the config file"),
        "{stderr}"
    );
}

#[test]
fn refuses_a_non_loopback_grpc_address() {
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(podca_binary())
        .args(["dev", "--grpc-listen", "0.0.0.0:0", "--data-dir"])
        .arg(tmp.path().join("data"))
        .arg("--socket")
        .arg(tmp.path().join("s.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}

/// The algorithm of a credential bundle's PKCS#8 key, once checked to be the leaf's key.
fn bundle_key_algorithm(credential: &str) -> &'static rcgen::SignatureAlgorithm {
    let blocks = pem::parse_many(credential).unwrap();
    assert_eq!(blocks[0].tag(), "PRIVATE KEY", "PKCS#8 key first");
    let key = rcgen::KeyPair::try_from(blocks[0].contents()).unwrap();
    let leaf = x509_parser::parse_x509_certificate(blocks[1].contents())
        .unwrap()
        .1;
    assert_eq!(
        rcgen::PublicKeyData::subject_public_key_info(&key),
        leaf.public_key().raw,
        "the bundle's key is the leaf's key"
    );
    key.algorithm()
}

fn wait_for_file(path: &std::path::Path) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.is_empty()
        {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} appears",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `podca` with `args`; exit status, stdout, stderr.
fn podca(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = std::process::Command::new(podca_binary())
        .args(args)
        .env_remove("PODCA_DATA_DIR")
        .env_remove("PODCA_CONFIG")
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn issue_with_server_writes_a_credential_bundle_that_verifies() {
    let dev = DevProcess::start();
    let tmp = tempfile::tempdir().unwrap();
    let server = format!("http://{}", dev.grpc);
    let token = tmp.path().join("token");
    // podca dev identifies loopback callers by metadata and ignores the token; podca serve
    // would check it with TokenReview. Either way it travels in a file, never in argv.
    std::fs::write(&token, "dev-token\n").unwrap();
    let out = tmp.path().join("credentialbundle.pem");
    let trust = tmp.path().join("trust-bundle.pem");
    let (status, stdout, stderr) = podca(&[
        "issue",
        "--server",
        &server,
        "--token-file",
        token.to_str().unwrap(),
        "--key-type",
        "ECDSAP384",
        "-n",
        "shop",
        "--service-account",
        "web",
        "-o",
        out.to_str().unwrap(),
        "--trust-bundle",
        trust.to_str().unwrap(),
    ]);
    assert!(status.success(), "{stderr}");
    assert!(stdout.is_empty());
    let summary: Vec<&str> = stderr.lines().collect();
    assert_eq!(summary.len(), 1, "one-line summary: {stderr}");
    assert!(
        summary[0].starts_with("issued spiffe://podca.dev.local/ns/shop/sa/web (serial "),
        "{stderr}"
    );
    assert!(summary[0].contains(&server) && summary[0].contains(out.to_str().unwrap()));

    let credential = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        bundle_key_algorithm(&credential),
        &rcgen::PKCS_ECDSA_P384_SHA384,
        "--key-type ECDSAP384"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&out).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // The chain verifies against the written trust bundle, checked by openssl on the contents
    // of the files themselves: leaf, then the intermediates as untrusted.
    let trust_text = std::fs::read_to_string(&trust).unwrap();
    assert_verifies(&credential, &trust_text);
    assert_eq!(
        std::fs::read_to_string(&trust).unwrap(),
        std::fs::read_to_string(dev.data_dir.join("root.pem")).unwrap()
    );

    // Over the Unix socket the caller is its uid (default/default); with a CSR from a file,
    // only the chain is written.
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = tmp.path().join("req.csr");
    std::fs::write(
        &csr,
        rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap(),
    )
    .unwrap();
    let socket = format!("unix://{}", dev.socket.display());
    let (status, stdout, stderr) =
        podca(&["issue", "--server", &socket, "--csr", csr.to_str().unwrap()]);
    assert!(status.success(), "{stderr}");
    assert!(stderr.starts_with("issued spiffe://podca.dev.local/ns/default/sa/default "));
    assert!(
        stdout.starts_with("-----BEGIN CERTIFICATE-----"),
        "{stdout}"
    );
    assert!(!stdout.contains("PRIVATE KEY"));
    assert_verifies(
        &stdout,
        &std::fs::read_to_string(dev.data_dir.join("root.pem")).unwrap(),
    );
}

#[test]
fn issue_with_server_refusals_are_one_line_with_the_grpc_code() {
    let dev = DevProcess::start();
    let server = format!("http://{}", dev.grpc);
    let cases: [(&[&str], &str); 4] = [
        (
            &["--signer", "example.com/nope"],
            "the server refused the request (NOT_FOUND): unknown signer \"example.com/nope\"",
        ),
        (
            &["--dns", "evil.example.com"],
            "the server refused the request (PERMISSION_DENIED): ",
        ),
        (
            &["-n", "Not_A_Name", "--service-account", "x"],
            "the server refused the request (UNAUTHENTICATED): invalid credentials: ",
        ),
        (
            &["--key-type", "ECDSAP256", "--lifetime-seconds=-5"],
            "the server refused the request (INVALID_ARGUMENT): requested_lifetime_seconds \
             must be positive",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["issue", "--server", &server];
        args.extend_from_slice(extra);
        let (status, stdout, stderr) = podca(&args);
        assert_eq!(status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("podca: {server}: {expected}")),
            "{args:?}: {stderr}"
        );
    }
    drop(dev);

    // Client-side problems, before or without a server.
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let gone = format!("http://127.0.0.1:{}", podca_tests::process::free_port());
    for (args, expected) in [
        (
            vec!["issue", "--server", &gone],
            "cannot connect to http://127.0.0.1:",
        ),
        (
            vec!["issue", "--server", "ftp://podca:8443"],
            "use https://HOST:PORT, http://HOST:PORT or unix:///path/to/socket",
        ),
        (
            vec!["issue", "--server", "https://podca:8443"],
            "https://podca:8443: give --ca-file ROOTS.pem",
        ),
        (
            vec![
                "issue",
                "--server",
                &gone,
                "--token-file",
                empty.to_str().unwrap(),
            ],
            "is empty",
        ),
    ] {
        let (status, _, stderr) = podca(&args);
        assert_eq!(status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // There is no flag that takes a token itself.
    let (status, _, stderr) = podca(&["issue", "--server", &gone, "--token", "abc"]);
    assert!(!status.success());
    assert!(stderr.contains("unexpected argument '--token'"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_certificate_podca_dev_issues_is_in_the_ledger() {
    use podca_proto::podca::v1::IssueCertificateRequest;
    // Our own data dir: stopping the DevProcess removes its temporary one.
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let dev = DevProcess::start_with(DevOptions {
        args: vec!["--bundle".into(), "shop/web".into()],
        data_dir: Some(data_dir.clone()),
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    let mut grpc_serials = vec![];
    for _ in 0..3 {
        let answer = client
            .issue_certificate(IssueCertificateRequest {
                csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        grpc_serials.push(answer.serial);
    }
    let svid = spiffe::WorkloadApiClient::connect_to(&format!("unix://{}", dev.socket.display()))
        .await
        .unwrap()
        .fetch_x509_svid()
        .await
        .unwrap();
    let svid_leaf = x509_parser::parse_x509_certificate(svid.cert_chain()[0].as_ref())
        .unwrap()
        .1;
    let svid_serial = svid_leaf.raw_serial_as_string();
    wait_for_file(&data_dir.join("bundles/shop/web/credentialbundle.pem"));

    // redb admits one process: the ledger is read once podca dev has stopped.
    let (status, _, stderr) = podca(&["ledger", "list", "--dir", data_dir.to_str().unwrap()]);
    assert!(!status.success());
    assert!(stderr.contains("open in another podca process"), "{stderr}");
    assert!(dev.stop().success());

    let (status, stdout, stderr) = podca(&[
        "ledger",
        "list",
        "--json",
        "--dir",
        data_dir.to_str().unwrap(),
    ]);
    assert!(status.success(), "{stderr}");
    let records: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let with_source = |source: &str| {
        records
            .iter()
            .filter(|r| r["source"] == source)
            .map(|r| r["serial"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let grpc = with_source("grpc");
    for serial in &grpc_serials {
        assert!(grpc.contains(serial), "{serial} in {grpc:?}");
    }
    assert!(!with_source("workload-api").is_empty(), "{records:?}");
    assert!(!with_source("dev").is_empty(), "{records:?}");
    // The table form names the serial too.
    let (_, table, _) = podca(&["ledger", "list", "--dir", data_dir.to_str().unwrap()]);
    assert!(table.contains(&grpc_serials[0]), "{table}");
    // And `ledger show` finds the Workload API SVID by its serial as x509 prints it.
    let (status, shown, stderr) = podca(&[
        "ledger",
        "show",
        "--dir",
        data_dir.to_str().unwrap(),
        &svid_serial,
    ]);
    assert!(status.success(), "{svid_serial}: {stderr}");
    assert!(shown.contains("\"source\": \"workload-api\""), "{shown}");
    assert!(shown.contains("spiffe://podca.dev.local/ns/default/sa/default"));
}

/// Issue #47 item 4: the ledger records the CA generation `podca ca show` reports, not a count
/// of reloads: after `podca ca rotate` and a SIGHUP, generation 1 still signs (generation 2
/// waits out the propagation window) and a new certificate records 1, as does dev's reload
/// line. A JWT-SVID's row shows its record id, which `ledger show` takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_records_the_generation_ca_show_reports_across_a_rotation_and_sighup() {
    use podca_proto::podca::v1::IssueCertificateRequest;
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let dir = data_dir.to_str().unwrap().to_owned();
    let dev = DevProcess::start_with(DevOptions {
        data_dir: Some(data_dir.clone()),
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    let mut issue = async || {
        client
            .issue_certificate(IssueCertificateRequest {
                csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .serial
    };
    let before = issue().await;
    let (status, _, stderr) = podca(&["ca", "rotate", "--dir", &dir]);
    assert!(status.success(), "{stderr}");
    // A reload that swaps nothing in (the same active CA) and one after the rotation: with the
    // old count the next certificate would have read generation 3.
    for _ in 0..2 {
        dev.signal("HUP");
        let line = dev.wait_for_line("podca dev: reloaded the CA", Duration::from_secs(20));
        assert!(line.ends_with("(generation 1 signs)"), "{line}");
    }
    let after = issue().await;
    let token = spiffe::WorkloadApiClient::connect_to(&format!("unix://{}", dev.socket.display()))
        .await
        .unwrap()
        .fetch_jwt_svid(["vault"], None)
        .await
        .unwrap();
    assert!(!token.token().is_empty());
    assert!(dev.stop().success());

    let (status, shown, stderr) = podca(&["ca", "show", "--dir", &dir]);
    assert!(status.success(), "{stderr}");
    assert!(
        shown
            .lines()
            .any(|l| l.contains("generation 1") && l.contains("active")),
        "{shown}"
    );
    let (status, stdout, stderr) = podca(&["ledger", "list", "--json", "--dir", &dir]);
    assert!(status.success(), "{stderr}");
    let records: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for serial in [&before, &after] {
        let record = records
            .iter()
            .find(|r| r["serial"] == serial.as_str())
            .unwrap_or_else(|| panic!("{serial} in {records:?}"));
        assert_eq!(record["ca_generation"], 1, "{record}");
        assert_eq!(record["schema"], 2, "{record}");
    }
    // The table: generation 1 in the CA column, and the JWT-SVID by its record id.
    let jwt = records
        .iter()
        .find(|r| r["source"] == "jwt")
        .unwrap_or_else(|| panic!("a JWT-SVID record in {records:?}"));
    let id = jwt["id"].as_str().unwrap();
    let (_, table, _) = podca(&["ledger", "list", "--dir", &dir]);
    let row = |needle: &str| {
        table
            .lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("a row for {needle} in\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row(&after)[4], "1", "the CA column\n{table}");
    assert_eq!(row(id)[0], id);
    let (status, shown, stderr) = podca(&["ledger", "show", "--dir", &dir, id]);
    assert!(status.success(), "{id}: {stderr}");
    assert!(shown.contains("\"source\": \"jwt\""), "{shown}");
}
