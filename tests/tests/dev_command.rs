//! `podca dev` as a command: CA creation and reuse, credential bundles, clean shutdown.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

mod grpc_support;

use std::time::Duration;

use grpc_support::{DevOptions, DevServer, openssl_verify, pem_blocks, podca_binary};

#[test]
fn creates_then_reuses_the_ca_and_removes_its_socket_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let first = DevServer::start_with(DevOptions {
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
    assert!(first.banner.iter().any(|l| l.contains("grpcurl")));
    let root = std::fs::read_to_string(data_dir.join("root.pem")).unwrap();
    let socket = first.socket.clone();
    let status = first.stop();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    assert!(!socket.exists(), "the socket is removed on shutdown");

    let second = DevServer::start_with(DevOptions {
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
    let dev = DevServer::start_with(DevOptions {
        config: Some(config),
        args: vec!["--bundle".into(), "default/default".into()],
        ..Default::default()
    });
    for (ns, sa) in [("shop", "web"), ("default", "default")] {
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
        openssl_verify(&chain, &trust).unwrap();
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
            openssl_verify(&pem_blocks(&credential).concat(), &new_anchors).unwrap();
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
