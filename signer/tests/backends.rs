//! Every CA key backend passes the same contract; keys stay out of Debug output and off
//! world-readable files.

// Test code: an unexpected error should fail the test where it happens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use podca_signer::backend::contract::{self, Secret};
use podca_signer::{BackendError, CaAlgorithm, CaKey, FileKey, FileStore, InitOptions, MemoryKey};
use time::{Duration, OffsetDateTime};

fn der_of(pem_text: &str) -> Vec<u8> {
    pem::parse(pem_text).unwrap().into_contents()
}

#[test]
fn memory_backend_passes_the_contract() {
    for alg in [
        CaAlgorithm::EcdsaP256,
        CaAlgorithm::EcdsaP384,
        CaAlgorithm::Ed25519,
        CaAlgorithm::RsaSha256,
    ] {
        let pair = match alg {
            CaAlgorithm::RsaSha256 => {
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
            }
            other => rcgen::KeyPair::generate_for(other.rcgen()),
        }
        .unwrap();
        let key = MemoryKey::from_pem(&pair.serialize_pem()).unwrap();
        assert_eq!(key.algorithm(), alg);
        contract::check(Arc::new(key), Secret::Pkcs8Der(&pair.serialize_der()));
    }
}

#[test]
fn file_backend_passes_the_contract_and_writes_0600() {
    let dir = tempfile::tempdir().unwrap();
    for alg in [
        CaAlgorithm::EcdsaP256,
        CaAlgorithm::EcdsaP384,
        CaAlgorithm::Ed25519,
    ] {
        let path = dir.path().join(format!("{alg}.key"));
        let created = FileKey::create(&path, alg).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{alg} key file mode");
        let pem = std::fs::read_to_string(&path).unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "PKCS#8 PEM");
        let loaded = FileKey::load(&path).unwrap();
        assert_eq!(loaded.public_key_raw(), created.public_key_raw());
        contract::check(Arc::new(loaded), Secret::Pkcs8Der(&der_of(&pem)));
        match FileKey::create(&path, alg) {
            Err(BackendError::Io { path: p, detail }) => {
                assert_eq!(p, path.display().to_string());
                assert!(detail.contains("File exists"), "{detail}");
            }
            other => panic!("never overwrite a key file: {other:?}"),
        }
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            pem,
            "{alg} untouched"
        );
    }
}

#[test]
fn ca_debug_output_never_contains_key_material() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("ca"));
    let ca = store
        .init(&InitOptions::default(), OffsetDateTime::now_utc())
        .unwrap();
    let key_pem = std::fs::read_to_string(store.issuing_key_path()).unwrap();
    let root_pem = std::fs::read_to_string(store.root_key_path()).unwrap();
    let debug = format!("{ca:?} {:?} {:?}", ca.key(), store);
    for pem_text in [&key_pem, &root_pem] {
        contract::assert_debug_hides(&debug, Secret::Pkcs8Der(&der_of(pem_text)));
    }
    assert!(debug.contains("<redacted>"));
    for path in [store.issuing_key_path(), store.root_key_path()] {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", path.display());
    }
    let dir_mode = std::fs::metadata(store.dir()).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
}

/// The redaction check itself: it must catch each form a careless `Debug` would print.
#[test]
fn the_redaction_check_catches_every_form() {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let der = pair.serialize_der();
    let leaks = [
        format!("MemoryKey {{ der: {der:?} }}"),
        format!("key={}", hex::encode(&der)),
        format!(
            "key={}",
            pair.serialize_pem()
                .replace('\n', "\\n")
                .replace("PRIVATE KEY", "")
        ),
        // The scalar sits at a fixed offset in an EC PKCS#8 (SEC1 privateKey OCTET STRING).
        format!("d={}", hex::encode(&der[36..68])),
        format!("d[..8]={:?}", &der[40..48]),
    ];
    for leak in leaks {
        let caught = std::panic::catch_unwind(|| {
            contract::assert_debug_hides(&leak, Secret::Pkcs8Der(&der))
        })
        .expect_err("a leak must fail the check");
        // The contract's own refusal, not some other panic on the way.
        let message = caught
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or_default();
        assert!(
            message.starts_with("Debug output holds a PEM key")
                || message.starts_with("Debug output reveals the"),
            "{leak}: {message}"
        );
    }
    contract::assert_debug_hides(
        "MemoryKey { algorithm: EcdsaP256, private_key: \"<redacted>\" }",
        Secret::Pkcs8Der(&der),
    );
}

#[test]
fn store_refuses_to_overwrite_and_reloads_the_same_ca() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path());
    assert!(
        store
            .load()
            .unwrap_err()
            .to_string()
            .contains("podca ca init")
    );
    let ca = store
        .init(&InitOptions::default(), OffsetDateTime::now_utc())
        .unwrap();
    let err = store
        .init(&InitOptions::default(), OffsetDateTime::now_utc())
        .unwrap_err();
    assert!(err.to_string().contains("refusing to overwrite"), "{err}");
    let again = store.load().unwrap();
    assert_eq!(again.certificate(), ca.certificate());
    assert_eq!(again.roots(), ca.roots());
}

#[test]
fn import_of_an_openssl_made_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(d)
            .output()
            .expect("the `openssl` binary is required: apt-get install -y openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // A root with a SEC1 "EC PRIVATE KEY" (as `openssl ecparam` and cfssl write them).
    run(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        "root.key",
    ]);
    run(&[
        "req",
        "-x509",
        "-new",
        "-key",
        "root.key",
        "-subj",
        "/CN=openssl root",
        "-days",
        "30",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-out",
        "root.pem",
    ]);
    let store = FileStore::new(d.join("store"));
    let ca = store
        .import(
            &std::fs::read_to_string(d.join("root.pem")).unwrap(),
            &std::fs::read_to_string(d.join("root.key")).unwrap(),
            None,
        )
        .unwrap();
    assert_eq!(ca.roots().len(), 1);
    let reloaded = store.load().unwrap();
    let (_, cert) = common::issue_for(&reloaded, podca_signer::KeyType::EcdsaP384, &[]);
    let (ok, out) = common::openssl_verify(d, &reloaded.roots_pem(), &cert.chain_pem);
    assert!(ok, "{out}");

    // A key that does not belong to the certificate is refused before anything is written.
    let unrelated_key = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let wrong = FileStore::new(d.join("wrong"));
    let e = wrong
        .import(
            &std::fs::read_to_string(d.join("root.pem")).unwrap(),
            &unrelated_key,
            None,
        )
        .unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");
    assert!(!wrong.dir().join("issuing.key").exists());
}

#[test]
fn issuing_ca_with_less_than_an_hour_left_fails_cleanly() {
    let now = OffsetDateTime::now_utc();
    let root = podca_signer::IssuingCa::self_signed_root(
        Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap()),
        "short root",
        now,
        // ca_params backdates by 5 minutes: this CA ends ~55 minutes from now.
        Duration::hours(1),
    )
    .unwrap();
    let key = podca_signer::keys::GeneratedKey::generate(podca_signer::KeyType::EcdsaP256).unwrap();
    let request = podca_signer::CertificateRequest {
        key: Ok(key.public.clone()),
        namespace: "a".into(),
        service_account: "b".into(),
        pod_name: None,
        max_expiration: None,
        requested_lifetime: None,
        user_annotations: Default::default(),
    };
    let policy = podca_signer::SignerPolicy::permissive("t.example");
    match podca_signer::sign_request(&policy, &root, &request, now) {
        podca_signer::Outcome::Failed { reason, message } => {
            assert_eq!(reason, podca_signer::FailReason::CaExpiresTooSoon);
            assert!(message.contains("rotate the CA"), "{message}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// A key file other users may read (or write) is refused at load, with the mode and what to
/// do; group bits (what an fsGroup volume adds) are accepted.
#[test]
fn a_key_file_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("issuing.key");
    FileKey::create(&path, CaAlgorithm::EcdsaP256).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    FileKey::load(&path).expect("group-readable, as on an fsGroup volume");
    for mode in [0o644, 0o602] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        match FileKey::load(&path) {
            Err(BackendError::Io { path: p, detail }) => {
                assert_eq!(p, path.display().to_string());
                assert_eq!(
                    detail,
                    format!(
                        "mode {mode:o} lets other users read or write the private key; refusing \
                         it (chmod o-rwx, and consider the key exposed)"
                    )
                );
            }
            other => panic!("mode {mode:o}: {other:?}"),
        }
    }
}
