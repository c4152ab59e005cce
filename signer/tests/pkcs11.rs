//! The PKCS#11 CA key backend against a real SoftHSM2 token.
//!
//! SoftHSM2 reads `SOFTHSM2_CONF` when the library is initialised, once per process, and setting
//! an environment variable inside this process would need `unsafe`. So each test re-runs this
//! test binary as a child process, filtered to itself, with `SOFTHSM2_CONF` pointing at a
//! fresh token directory in a temporary directory and a freshly initialised token: tests stay
//! independent and can run in parallel. The parent asserts the child ran exactly one test and
//! passed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use podca_signer::backend::contract;
use podca_signer::backend::pkcs11::{
    PinSource, Pkcs11Config, Pkcs11Key, Pkcs11Uri, SOFTHSM2_MODULE, intermediate_needs_renewal,
    intermediate_renewal_time,
};
use podca_signer::{
    BackendError, CaAlgorithm, CaKey, IssuingCa, KeyType, MemoryKey, SubjectKey, Validity,
};
use time::{Duration, OffsetDateTime};

const USER_PIN: &str = "podca-user-pin-58213";
const SO_PIN: &str = "podca-so-pin-90417";
const INSTALL: &str = "apt-get install -y -t bookworm softhsm2 opensc";

/// What a test body gets: its token and a scratch directory.
struct Hsm {
    dir: PathBuf,
    label: String,
}

impl Hsm {
    fn pin_file(&self) -> PathBuf {
        self.dir.join("user.pin")
    }

    fn tokens(&self) -> PathBuf {
        self.dir.join("tokens")
    }

    fn uri(&self, object: &str) -> Pkcs11Uri {
        Pkcs11Uri::parse(&format!(
            "pkcs11:token={};object={object}?module-path={SOFTHSM2_MODULE}",
            self.label
        ))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn config(&self, object: &str) -> Pkcs11Config {
        Pkcs11Config::new(self.uri(object), PinSource::File(self.pin_file()))
    }

    fn generate(&self, object: &str, alg: CaAlgorithm) -> Pkcs11Key {
        Pkcs11Key::generate(&self.config(object), alg)
            .unwrap_or_else(|e| panic!("generating {alg} key {object}: {e}"))
    }
}

fn require_softhsm() {
    let util = Command::new("softhsm2-util").arg("--version").output();
    assert!(
        matches!(&util, Ok(o) if o.status.success()),
        "softhsm2-util is missing: these tests need SoftHSM2 ({INSTALL})"
    );
    assert!(
        Path::new(SOFTHSM2_MODULE).exists(),
        "the SoftHSM2 module {SOFTHSM2_MODULE} is missing: these tests need SoftHSM2 ({INSTALL})"
    );
}

/// Token labels are at most 32 bytes; each test has its own token directory anyway.
fn token_label(test: &str) -> String {
    test.chars().take(32).collect()
}

/// Runs `body` in a child process with its own SoftHSM2 configuration and token.
fn in_child(name: &str, body: impl FnOnce(&Hsm)) {
    if std::env::var("PODCA_HSM_CHILD").as_deref() == Ok(name) {
        let dir = PathBuf::from(
            std::env::var("PODCA_HSM_DIR").unwrap_or_else(|_| panic!("PODCA_HSM_DIR unset")),
        );
        body(&Hsm {
            dir,
            label: token_label(name),
        });
        return;
    }
    require_softhsm();
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path();
    std::fs::create_dir(dir.join("tokens")).unwrap_or_else(|e| panic!("{e}"));
    let conf = dir.join("softhsm2.conf");
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            dir.join("tokens").display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("user.pin"), format!("{USER_PIN}\n")).unwrap_or_else(|e| panic!("{e}"));
    let init = Command::new("softhsm2-util")
        .env("SOFTHSM2_CONF", &conf)
        .args(["--init-token", "--free", "--label", &token_label(name)])
        .args(["--so-pin", SO_PIN, "--pin", USER_PIN])
        .output()
        .unwrap_or_else(|e| panic!("softhsm2-util: {e} ({INSTALL})"));
    assert!(
        init.status.success(),
        "softhsm2-util --init-token failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("SOFTHSM2_CONF", &conf)
        .env("PODCA_HSM_CHILD", name)
        .env("PODCA_HSM_DIR", dir)
        .env("PODCA_TEST_PIN_ENV", USER_PIN)
        .output()
        .unwrap_or_else(|e| panic!("running the child test: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- child {name} stdout ---\n{stdout}\n--- child stderr ---\n{stderr}");
    assert!(
        out.status.success(),
        "child test {name} failed (output above)"
    );
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "child test {name} did not run exactly one test (output above)"
    );
}

fn verify(key: &dyn CaKey, message: &[u8], sig: &[u8]) -> bool {
    aws_lc_rs::signature::UnparsedPublicKey::new(
        key.algorithm().verification(),
        key.public_key_raw(),
    )
    .verify(message, sig)
    .is_ok()
}

// ---------------------------------------------------------------------------------------------

fn contract_for(hsm: &Hsm, alg: CaAlgorithm) {
    let key = hsm.generate("ca", alg);
    assert_eq!(key.algorithm(), alg);
    let debug = format!("{key:?}");
    assert!(debug.contains("<redacted>"), "{debug}");
    assert!(!key.location().contains(USER_PIN));
    assert!(
        key.location()
            .starts_with(&format!("pkcs11:token={};object=ca;id=%", hsm.label))
    );
    let key = Arc::new(key);
    contract::check(
        Arc::clone(&key) as Arc<dyn CaKey>,
        contract::Secret::Text(USER_PIN),
    );
    let stats = key.stats();
    // At least 5 lengths + 200 concurrent + the root.
    assert!(stats.signs >= 206, "{stats:?}");
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert!(
        stats.max_latency > std::time::Duration::ZERO && stats.total_latency >= stats.max_latency
    );
    assert!(stats.pool_size >= 1);
}

#[test]
fn contract_p256() {
    in_child("contract_p256", |hsm| {
        contract_for(hsm, CaAlgorithm::EcdsaP256)
    });
}

#[test]
fn contract_p384() {
    in_child("contract_p384", |hsm| {
        contract_for(hsm, CaAlgorithm::EcdsaP384)
    });
}

#[test]
fn contract_rsa() {
    in_child("contract_rsa", |hsm| {
        contract_for(hsm, CaAlgorithm::RsaSha256)
    });
}

#[test]
fn open_finds_the_generated_key_by_label_or_id() {
    in_child("open_finds_the_generated_key_by_label_or_id", |hsm| {
        let generated = hsm.generate("ca", CaAlgorithm::EcdsaP256);
        let by_label = Pkcs11Key::open(&hsm.config("ca")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(by_label.public_key_raw(), generated.public_key_raw());
        let id = generated.uri().id.clone().unwrap_or_default();
        assert_eq!(id.len(), 8, "generate picks a random 8-byte id");
        let id_uri = format!(
            "pkcs11:token={};id={}?module-path={SOFTHSM2_MODULE}",
            hsm.label,
            id.iter().map(|b| format!("%{b:02x}")).collect::<String>()
        );
        let by_id = Pkcs11Key::open(&Pkcs11Config::new(
            Pkcs11Uri::parse(&id_uri).unwrap_or_else(|e| panic!("{e}")),
            PinSource::Env("PODCA_TEST_PIN_ENV".into()),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(by_id.public_key_raw(), generated.public_key_raw());
        let sig = by_id.sign(b"hello").unwrap_or_else(|e| panic!("{e}"));
        assert!(verify(&generated, b"hello", &sig));
        // Generating over an existing key is refused.
        let again = Pkcs11Key::generate(&hsm.config("ca"), CaAlgorithm::EcdsaP256);
        assert!(
            matches!(&again, Err(BackendError::InvalidKey(m)) if m.contains("already exists")),
            "{again:?}"
        );
    });
}

#[test]
fn start_up_errors_are_clear_and_permanent() {
    in_child("start_up_errors_are_clear_and_permanent", |hsm| {
        hsm.generate("ca", CaAlgorithm::EcdsaP256);
        let wrong = hsm.dir.join("wrong.pin");
        std::fs::write(&wrong, "not-the-pin-31337\n").unwrap_or_else(|e| panic!("{e}"));
        let err = Pkcs11Key::open(&Pkcs11Config::new(hsm.uri("ca"), PinSource::File(wrong)))
            .map(|_| ())
            .expect_err("a wrong PIN must fail");
        let msg = err.to_string();
        assert!(matches!(err, BackendError::InvalidKey(_)), "{err:?}");
        assert!(
            msg.contains(&format!("login to token {:?} failed: the user PIN is incorrect (C_Login returned CKR_PIN_INCORRECT)", hsm.label)),
            "{msg}"
        );
        assert!(!msg.contains("not-the-pin-31337"), "{msg}");
        // The right PIN still works: the failed attempt did not lock anything.
        Pkcs11Key::open(&hsm.config("ca")).unwrap_or_else(|e| panic!("{e}"));

        let missing_token = Pkcs11Config::new(
            Pkcs11Uri::parse(&format!(
                "pkcs11:token=no-such-token;object=ca?module-path={SOFTHSM2_MODULE}"
            ))
            .unwrap_or_else(|e| panic!("{e}")),
            PinSource::File(hsm.pin_file()),
        );
        let err = Pkcs11Key::open(&missing_token)
            .map(|_| ())
            .expect_err("missing token");
        assert!(
            matches!(&err, BackendError::InvalidKey(m)
            if m.contains("no token labelled \"no-such-token\" is present") && m.contains(&hsm.label)),
            "{err:?}"
        );

        let err = Pkcs11Key::open(&hsm.config("nope"))
            .map(|_| ())
            .expect_err("missing key");
        assert!(
            matches!(&err, BackendError::InvalidKey(m) if m.contains("no private key")),
            "{err:?}"
        );

        let mut no_module = hsm.config("ca");
        no_module.module_path = Some("/nonexistent/libpkcs11.so".into());
        let err = Pkcs11Key::open(&no_module)
            .map(|_| ())
            .expect_err("missing module");
        assert!(
            matches!(&err, BackendError::InvalidKey(m) if m.contains("not found") && m.contains("apt-get install")),
            "{err:?}"
        );

        let no_pin =
            Pkcs11Config::new(hsm.uri("ca"), PinSource::Env("PODCA_TEST_UNSET_PIN".into()));
        let err = Pkcs11Key::open(&no_pin)
            .map(|_| ())
            .expect_err("missing PIN variable");
        assert!(
            matches!(&err, BackendError::InvalidKey(m) if m.contains("PODCA_TEST_UNSET_PIN")),
            "{err:?}"
        );
    });
}

#[test]
fn private_key_is_sensitive_and_never_extractable() {
    in_child("private_key_is_sensitive_and_never_extractable", |hsm| {
        let key = hsm.generate("ca", CaAlgorithm::EcdsaP256);
        let p = key.protection().unwrap_or_else(|e| panic!("{e}"));
        assert!(p.sensitive && !p.extractable, "{p:?}");
        assert!(
            p.always_sensitive && p.never_extractable && p.token && p.private,
            "{p:?}"
        );
        // And as an independent tool sees it.
        let out = Command::new("pkcs11-tool")
            .args([
                "--module",
                SOFTHSM2_MODULE,
                "--token-label",
                &hsm.label,
                "--login",
                "--pin",
                USER_PIN,
            ])
            .args(["--list-objects", "--type", "privkey"])
            .output()
            .unwrap_or_else(|e| panic!("pkcs11-tool: {e} ({INSTALL})"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let access: Vec<&str> = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Access:"))
            .unwrap_or_else(|| panic!("no Access line in {text}"))
            .split(',')
            .map(str::trim)
            .collect();
        assert!(
            access.contains(&"sensitive") && access.contains(&"never extractable"),
            "{access:?}"
        );
        assert!(!access.contains(&"extractable"), "{access:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// Issuance in both modes, checked with the openssl binary.

fn subject_keys() -> Vec<(KeyType, SubjectKey)> {
    let pair = |kp: rcgen::KeyPair| {
        SubjectKey::from_spki_der(&rcgen::PublicKeyData::subject_public_key_info(&kp))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let gen_for = |alg| rcgen::KeyPair::generate_for(alg).unwrap_or_else(|e| panic!("{e}"));
    let rsa = |size| {
        rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, size)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    vec![
        (KeyType::Rsa3072, pair(rsa(rcgen::RsaKeySize::_3072))),
        (KeyType::Rsa4096, pair(rsa(rcgen::RsaKeySize::_4096))),
        (
            KeyType::EcdsaP256,
            pair(gen_for(&rcgen::PKCS_ECDSA_P256_SHA256)),
        ),
        (
            KeyType::EcdsaP384,
            pair(gen_for(&rcgen::PKCS_ECDSA_P384_SHA384)),
        ),
        (
            KeyType::EcdsaP521,
            pair(gen_for(&rcgen::PKCS_ECDSA_P521_SHA512)),
        ),
        (KeyType::Ed25519, pair(gen_for(&rcgen::PKCS_ED25519))),
    ]
}

fn openssl_verify(dir: &Path, ca: &IssuingCa, chain_pem: &str, tag: &str) {
    let blocks = pem::parse_many(chain_pem).unwrap_or_else(|e| panic!("{e}"));
    assert!(!blocks.is_empty());
    let root = dir.join(format!("{tag}-root.pem"));
    let leaf = dir.join(format!("{tag}-leaf.pem"));
    let chain = dir.join(format!("{tag}-chain.pem"));
    std::fs::write(&root, ca.roots_pem()).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&leaf, pem::encode(&blocks[0])).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new("openssl");
    cmd.args(["verify", "-x509_strict", "-purpose", "sslclient", "-CAfile"])
        .arg(&root);
    if blocks.len() > 1 {
        std::fs::write(&chain, pem::encode_many(&blocks[1..])).unwrap_or_else(|e| panic!("{e}"));
        cmd.arg("-untrusted").arg(&chain);
    }
    let out = cmd
        .arg(&leaf)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains(": OK"),
        "openssl verify ({tag}): {text}"
    );
}

fn issue_all(dir: &Path, ca: &IssuingCa, mode: &str, expected_chain_len: usize) {
    let now = OffsetDateTime::now_utc();
    let validity = Validity {
        not_before: podca_signer::ca::whole_seconds(now) - Duration::minutes(1),
        not_after: podca_signer::ca::whole_seconds(now) + Duration::hours(1),
        begin_refresh_at: podca_signer::ca::whole_seconds(now) + Duration::minutes(30),
    };
    for (kind, subject) in subject_keys() {
        let cert = ca
            .issue(
                &subject,
                "spiffe://cluster.local/ns/default/sa/web",
                &["web.default.svc".into()],
                &validity,
            )
            .unwrap_or_else(|e| panic!("{mode}: issuing for {kind}: {e}"));
        assert_eq!(
            pem::parse_many(&cert.chain_pem)
                .map(|b| b.len())
                .unwrap_or(0),
            1 + expected_chain_len
        );
        openssl_verify(dir, ca, &cert.chain_pem, &format!("{mode}-{kind}"));
    }
}

#[test]
fn hsm_key_signs_every_leaf_for_all_key_types() {
    in_child("hsm_key_signs_every_leaf_for_all_key_types", |hsm| {
        for (object, alg) in [
            ("p256", CaAlgorithm::EcdsaP256),
            ("p384", CaAlgorithm::EcdsaP384),
        ] {
            let key = Arc::new(hsm.generate(object, alg));
            let root = IssuingCa::self_signed_root(
                Arc::clone(&key) as Arc<dyn CaKey>,
                "podca HSM root",
                OffsetDateTime::now_utc(),
                Duration::days(365),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let before = key.stats().signs;
            issue_all(&hsm.dir, &root, &format!("direct-{object}"), 0);
            assert_eq!(key.stats().signs - before, 6, "the HSM signed each leaf");
        }
    });
}

#[test]
fn intermediate_mode_for_all_key_types() {
    in_child("intermediate_mode_for_all_key_types", |hsm| {
        let key = Arc::new(hsm.generate("root", CaAlgorithm::EcdsaP384));
        let now = OffsetDateTime::now_utc();
        let root = IssuingCa::self_signed_root(
            Arc::clone(&key) as Arc<dyn CaKey>,
            "podca HSM root",
            now,
            Duration::days(365),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let signs_before = key.stats().signs;
        let intermediate = root
            .sign_intermediate(
                Arc::new(
                    MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap_or_else(|e| panic!("{e}")),
                ),
                "podca intermediate",
                now,
                Duration::hours(3),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            key.stats().signs - signs_before,
            1,
            "the HSM signed the intermediate"
        );
        issue_all(&hsm.dir, &intermediate, "intermediate", 1);
        assert_eq!(
            key.stats().signs - signs_before,
            1,
            "leaves never touched the HSM"
        );

        // Re-issue at 2/3 of the intermediate's life.
        let cert = intermediate.certificate();
        let due = intermediate_renewal_time(cert.not_before(), cert.not_after());
        assert_eq!(
            due - cert.not_before(),
            (cert.not_after() - cert.not_before()) * 2 / 3
        );
        assert!(!intermediate_needs_renewal(cert, now));
        assert!(!intermediate_needs_renewal(
            cert,
            due - Duration::seconds(1)
        ));
        assert!(intermediate_needs_renewal(cert, due));
        assert!(intermediate_needs_renewal(
            cert,
            cert.not_after() + Duration::hours(1)
        ));
    });
}

// ---------------------------------------------------------------------------------------------
// Token outage.

#[test]
fn token_outage_is_transient_and_recovers() {
    in_child("token_outage_is_transient_and_recovers", |hsm| {
        let mut config = hsm.config("ca");
        config.retry_interval = std::time::Duration::from_millis(20);
        Pkcs11Key::generate(&config, CaAlgorithm::EcdsaP256).unwrap_or_else(|e| panic!("{e}"));
        let key = Arc::new(Pkcs11Key::open(&config).unwrap_or_else(|e| panic!("{e}")));

        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let unavailable = Arc::new(AtomicU64::new(0));
        let messages = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (key, stop, ok, unavailable) = (
                    Arc::clone(&key),
                    Arc::clone(&stop),
                    Arc::clone(&ok),
                    Arc::clone(&unavailable),
                );
                let messages = Arc::clone(&messages);
                std::thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let msg = format!("worker {t} message {i}");
                        i += 1;
                        match key.sign(msg.as_bytes()) {
                            Ok(sig) => {
                                assert!(verify(&*key, msg.as_bytes(), &sig), "bad signature");
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(BackendError::Unavailable(m)) => {
                                assert!(!m.contains(USER_PIN));
                                let mut seen = messages.lock().unwrap_or_else(|p| p.into_inner());
                                if !seen.contains(&m) && seen.len() < 10 {
                                    seen.push(m);
                                }
                                drop(seen);
                                unavailable.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(std::time::Duration::from_millis(2));
                            }
                            Err(other) => {
                                panic!("sign during an outage must be transient: {other:?}")
                            }
                        }
                    }
                })
            })
            .collect();
        let wait_for = |counter: &AtomicU64, at_least: u64, what: &str| {
            let start = std::time::Instant::now();
            while counter.load(Ordering::Relaxed) < at_least {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(30),
                    "timed out waiting for {what}"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        wait_for(&ok, 200, "signatures before the outage");

        // Take the token away: move its directory out of the token directory.
        let token_dir = std::fs::read_dir(hsm.tokens())
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.is_dir())
            .unwrap_or_else(|| panic!("no token directory"));
        let away = hsm.dir.join("away");
        std::fs::rename(&token_dir, &away).unwrap_or_else(|e| panic!("{e}"));
        let ok_at_outage = ok.load(Ordering::Relaxed);
        wait_for(&unavailable, 20, "Unavailable during the outage");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let ok_during = ok.load(Ordering::Relaxed) - ok_at_outage;
        println!(
            "outage: {} ok just after removal, {} unavailable",
            ok_during,
            unavailable.load(Ordering::Relaxed)
        );
        let ok_before_restore = ok.load(Ordering::Relaxed);

        std::fs::rename(&away, &token_dir).unwrap_or_else(|e| panic!("{e}"));
        wait_for(&ok, ok_before_restore + 200, "signatures after the restore");
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join()
                .unwrap_or_else(|_| panic!("a signing thread panicked"));
        }
        let stats = key.stats();
        println!("{stats:?}");
        for m in messages.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            println!("observed: {m}");
        }
        assert_eq!(
            stats.signs,
            ok.load(Ordering::Relaxed),
            "every success counted"
        );
        assert_eq!(stats.errors, unavailable.load(Ordering::Relaxed));
        assert!(stats.recoveries >= 1, "{stats:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// The ledger log's Ed25519 key beside an HSM CA.

#[test]
fn an_ed25519_log_key_is_made_once_in_the_token_and_signs_there() {
    in_child(
        "an_ed25519_log_key_is_made_once_in_the_token_and_signs_there",
        |hsm| {
            let config = hsm.config("podca-log");
            let (key, made) =
                Pkcs11Key::open_or_generate_ed25519(&config).unwrap_or_else(|e| panic!("{e}"));
            assert!(made, "made on first use");
            assert_eq!(key.algorithm(), CaAlgorithm::Ed25519);
            let protection = key.protection().unwrap_or_else(|e| panic!("{e}"));
            assert!(
                protection.sensitive && !protection.extractable && protection.never_extractable
            );
            // The signature is plain Ed25519 over the message: aws-lc verifies it with the
            // public key the token reported.
            let message = b"podca.test/log\n7\nAAAA\n";
            let signature = key.sign(message).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(signature.len(), 64);
            let public = aws_lc_rs::signature::UnparsedPublicKey::new(
                &aws_lc_rs::signature::ED25519,
                key.public_key_raw(),
            );
            public
                .verify(message, &signature)
                .expect("an Ed25519 signature");
            // A second start finds it rather than making another.
            let (again, made) =
                Pkcs11Key::open_or_generate_ed25519(&config).unwrap_or_else(|e| panic!("{e}"));
            assert!(!made);
            assert_eq!(again.public_key_raw(), key.public_key_raw());
            // A CA key of the token is not taken for the log key.
            hsm.generate("ca", CaAlgorithm::EcdsaP256);
            let err = Pkcs11Key::open_or_generate_ed25519(&hsm.config("ca")).unwrap_err();
            assert!(err.to_string().contains("not Ed25519"), "{err}");
        },
    );
}
