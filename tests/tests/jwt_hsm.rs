//! JWT-SVID signing keys held in a PKCS#11 token (real SoftHSM2), through the same store and
//! rotation driver `podca serve` uses (`podca_authority::jwt::open_store` + `JwtRotator`).
//!
//! SoftHSM2 reads `SOFTHSM2_CONF` once per process and setting it here would need `unsafe`, so
//! each test re-runs this binary as a child, filtered to itself, with its own token (as
//! signer/tests/pkcs11.rs does).
//!
//! Shown: the keys are generated in the token (sensitive, not extractable, `podca-jwt-…` labels
//! distinct from the CA key), only their metadata is in the data directory; a token signed by the
//! HSM key verifies with `jsonwebtoken` against the published JWKS and with the `openssl`
//! command line (no aws-lc at all); a rotation prepared → active → retired → dropped destroys
//! the old key's objects in the token and leaves the CA key alone; a restart opens the keys from
//! the token again; `podca ca show` lists the keys (run `cargo build --bin podca` first).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use podca_authority::config::{CaConfig, Pkcs11Ca, Pkcs11Mode};
use podca_authority::jwt::{JwtConfig, JwtRotator, open_store};
use podca_authority::trust::Clock;
use podca_signer::backend::pkcs11::{
    PinSource, Pkcs11Config, Pkcs11Key, Pkcs11Uri, SOFTHSM2_MODULE,
};
use podca_signer::jwt::{JwtKeyPhase, SvidRequest};
use podca_signer::{CaAlgorithm, FileStore, InitOptions};
use podca_tests::process::{DevOptions, DevProcess};
use spiffe::{JwtSvid, WorkloadApiClient};
use time::{Duration, OffsetDateTime};

const USER_PIN: &str = "podca-user-pin-31337";
const SO_PIN: &str = "podca-so-pin-73313";

struct Hsm {
    dir: PathBuf,
    label: String,
}

impl Hsm {
    fn pin_file(&self) -> PathBuf {
        self.dir.join("user.pin")
    }

    fn ca_uri(&self) -> String {
        format!(
            "pkcs11:token={};object=podca-ca?module-path={SOFTHSM2_MODULE}",
            self.label
        )
    }

    fn config(&self, uri: &str) -> Pkcs11Config {
        Pkcs11Config::new(
            Pkcs11Uri::parse(uri).unwrap_or_else(|e| panic!("{uri}: {e}")),
            PinSource::File(self.pin_file()),
        )
    }

    /// The private key labels in the token, read with OpenSC's pkcs11-tool (not podca).
    fn private_key_labels(&self) -> Vec<String> {
        podca_tests::softhsm::private_key_labels(
            &self.dir.join("softhsm2.conf"),
            &self.label,
            USER_PIN,
        )
    }
}

fn in_child(name: &str, body: impl FnOnce(&Hsm)) {
    let label: String = name.chars().take(32).collect();
    if std::env::var("PODCA_HSM_CHILD").as_deref() == Ok(name) {
        let dir = PathBuf::from(std::env::var("PODCA_HSM_DIR").expect("PODCA_HSM_DIR"));
        body(&Hsm { dir, label });
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let conf = podca_tests::softhsm::softhsm_token(dir, &label, SO_PIN, USER_PIN);
    std::fs::write(dir.join("user.pin"), format!("{USER_PIN}\n")).expect("pin");
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("SOFTHSM2_CONF", &conf)
        .env("PODCA_HSM_CHILD", name)
        .env("PODCA_HSM_DIR", dir)
        .output()
        .expect("running the child test");
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

/// jsonwebtoken (not podca's code) verifies `token` with the JWK of its kid from `jwks`.
fn jsonwebtoken_verifies(
    token: &str,
    jwks: &serde_json::Value,
    audience: &str,
) -> serde_json::Value {
    let kid = jsonwebtoken::decode_header(token)
        .expect("header")
        .kid
        .expect("a kid");
    let jwk = jwks["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .expect("the token's key is published");
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(jwk.clone()).expect("a JWK");
    let key = DecodingKey::from_jwk(&jwk).expect("a decoding key");
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&[audience]);
    validation.set_required_spec_claims(&["exp", "sub", "aud"]);
    jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
        .expect("jsonwebtoken verifies the HSM-signed token")
        .claims
}

/// `openssl dgst -verify` (OpenSSL, no aws-lc) checks an ES256 token against the P-256 JWK's
/// `x`/`y`: the SPKI and the DER signature are assembled from the JOSE encodings here.
fn openssl_verifies(dir: &Path, token: &str, jwk: &serde_json::Value) -> bool {
    let b64 = |s: &serde_json::Value| {
        URL_SAFE_NO_PAD
            .decode(s.as_str().expect("a string"))
            .expect("base64url")
    };
    // SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING 04 || x || y }
    let mut spki = hex_bytes("3059301306072a8648ce3d020106082a8648ce3d030107034200");
    spki.push(0x04);
    spki.extend(b64(&jwk["x"]));
    spki.extend(b64(&jwk["y"]));
    let (input, signature) = token.rsplit_once('.').expect("three parts");
    let raw = URL_SAFE_NO_PAD.decode(signature).expect("signature");
    assert_eq!(raw.len(), 64, "ES256 signatures are r || s, 32 bytes each");
    let int = |v: &[u8]| {
        let v = &v[v.iter().take_while(|b| **b == 0).count()..];
        let mut out = vec![0x02];
        let pad = v.first().is_some_and(|b| *b >= 0x80);
        out.push(u8::try_from(v.len() + usize::from(pad)).expect("short"));
        if pad {
            out.push(0);
        }
        out.extend_from_slice(v);
        out
    };
    let body = [int(&raw[..32]), int(&raw[32..])].concat();
    let der = [vec![0x30, u8::try_from(body.len()).expect("short")], body].concat();
    std::fs::write(
        dir.join("jwk.pem"),
        pem::encode(&pem::Pem::new("PUBLIC KEY", spki)),
    )
    .expect("pem");
    std::fs::write(dir.join("sig.der"), der).expect("sig");
    std::fs::write(dir.join("input"), input).expect("input");
    let out = Command::new("openssl")
        .args(["dgst", "-sha256", "-verify"])
        .arg(dir.join("jwk.pem"))
        .arg("-signature")
        .arg(dir.join("sig.der"))
        .arg(dir.join("input"))
        .output()
        .expect("openssl");
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Verified OK")
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A CA data directory whose key is generated in the token (`podca ca init --pkcs11-generate`).
fn init_hsm_ca(hsm: &Hsm, data: &Path) {
    let key =
        Pkcs11Key::generate(&hsm.config(&hsm.ca_uri()), CaAlgorithm::EcdsaP256).expect("CA key");
    FileStore::new(data)
        .init_with_key(
            Arc::new(key),
            &InitOptions::default(),
            OffsetDateTime::now_utc(),
        )
        .expect("CA data directory");
}

#[test]
fn jwt_keys_live_in_the_token_sign_verifiable_tokens_and_are_destroyed_on_drop() {
    in_child(
        "jwt_keys_live_in_the_token_sign_verifiable_tokens_and_are_destroyed_on_drop",
        |hsm| {
            // The CA key, in the same token (what `podca ca init --pkcs11-generate` makes).
            let data = hsm.dir.join("ca");
            init_hsm_ca(hsm, &data);
            let ca = CaConfig::Pkcs11(Pkcs11Ca {
                dir: Some(data.clone()),
                // The token: from the location the data directory records for the CA key.
                uri: None,
                module: None,
                pin: PinSource::File(hsm.pin_file()),
                mode: Pkcs11Mode::HsmSignsLeaves,
                automatic_rotation: false,
            });
            let store = open_store(&ca).expect("the JWT store");
            assert_eq!(store.backend_kind(), "pkcs11");

            // Simulated time from now (jsonwebtoken checks exp against the real clock).
            let t0 = OffsetDateTime::now_utc().replace_nanosecond(0).expect("t0");
            let now = Arc::new(Mutex::new(t0));
            let clock: Clock = {
                let now = Arc::clone(&now);
                Arc::new(move || *now.lock().expect("clock"))
            };
            let set = |t| *now.lock().expect("clock") = t;
            let config = JwtConfig {
                key_rotation_seconds: 3600,
                propagation_seconds: 600,
                max_lifetime_seconds: 300,
                default_lifetime_seconds: 300,
                ..JwtConfig::default()
            };
            let rotator = JwtRotator::start(
                store.clone(),
                &config,
                Arc::clone(&clock),
                StdDuration::from_secs(5),
            )
            .expect("first start makes the first key in the token");

            // One key, in the token; the data directory holds only its metadata.
            let (_, stored) = store.stored().expect("state");
            assert_eq!(stored.len(), 1);
            let first = stored[0].clone();
            assert_eq!(first.info.phase, JwtKeyPhase::Active);
            let prefix = format!("pkcs11:token={};object=podca-jwt-", hsm.label);
            assert!(first.location.starts_with(&prefix), "{}", first.location);
            let files: Vec<_> = std::fs::read_dir(data.join("jwt"))
                .expect("jwt dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(files, vec!["state.json".to_owned()], "no key file");
            let labels = hsm.private_key_labels();
            assert_eq!(labels.len(), 2, "the CA key and one JWT key: {labels:?}");
            assert!(labels.contains(&"podca-ca".to_owned()), "{labels:?}");
            let first_label = labels
                .iter()
                .find(|l| l.starts_with("podca-jwt-"))
                .expect("a podca-jwt- key")
                .clone();

            // Sensitive and never extractable, as the token reports it.
            let opened = Pkcs11Key::open(&hsm.config(&first.location)).expect("open JWT key");
            let protection = opened.protection().expect("attributes");
            assert!(!protection.extractable, "CKA_EXTRACTABLE must be false");
            assert!(protection.sensitive && protection.never_extractable && protection.token);
            drop(opened);

            // A token signed in the HSM verifies with independent code against the JWKS.
            let sign = |at| {
                rotator
                    .handle()
                    .current()
                    .sign(
                        &SvidRequest {
                            spiffe_id: "spiffe://td.example/ns/a/sa/b",
                            audiences: &["vault".to_owned()],
                            lifetime: None,
                        },
                        &config.limits(),
                        at,
                    )
                    .expect("signs")
            };
            let jwks = |set: &podca_signer::jwt::JwtKeySet| -> serde_json::Value {
                serde_json::from_slice(&set.bundle(None).to_json()).expect("JWKS JSON")
            };
            let svid = sign(t0);
            assert_eq!(svid.kid, first.info.kid);
            let published = jwks(&rotator.handle().current());
            let claims = jsonwebtoken_verifies(&svid.token, &published, "vault");
            assert_eq!(claims["sub"], "spiffe://td.example/ns/a/sa/b");
            let jwk = published["keys"][0].clone();
            assert!(openssl_verifies(&hsm.dir, &svid.token, &jwk));
            // …and a tampered token does not (the check can fail).
            // (A character inside the signature: the last one also carries padding bits.)
            let at = svid.token.len() - 10;
            let flipped = if &svid.token[at..=at] == "A" {
                "B"
            } else {
                "A"
            };
            let tampered = format!("{}{flipped}{}", &svid.token[..at], &svid.token[at + 1..]);
            assert!(!openssl_verifies(&hsm.dir, &tampered, &jwk));

            // 50 min: a second key is prepared in the token; the first still signs.
            set(t0 + Duration::minutes(50));
            rotator.tick().expect("prepare");
            assert_eq!(hsm.private_key_labels().len(), 3);
            let (_, stored) = store.stored().expect("state");
            let phases: Vec<_> = stored.iter().map(|k| k.info.phase).collect();
            assert_eq!(phases, vec![JwtKeyPhase::Active, JwtKeyPhase::Prepared]);
            let second = stored[1].clone();
            assert_ne!(second.location, first.location);
            assert_eq!(sign(t0 + Duration::minutes(50)).kid, first.info.kid);

            // 60 min: the second signs; the first is retired but still published and in the token.
            set(t0 + Duration::minutes(60));
            rotator.tick().expect("activate");
            let svid2 = sign(t0 + Duration::minutes(60));
            assert_eq!(svid2.kid, second.info.kid);
            assert_eq!(hsm.private_key_labels().len(), 3);
            let published = jwks(&rotator.handle().current());
            jsonwebtoken_verifies(&svid2.token, &published, "vault");

            // 65 min (rotation + max lifetime): the first key is dropped and destroyed in the token.
            set(t0 + Duration::minutes(65));
            rotator.tick().expect("drop");
            let labels = hsm.private_key_labels();
            assert_eq!(labels.len(), 2, "{labels:?}");
            assert!(!labels.contains(&first_label), "{labels:?}");
            assert!(
                labels.contains(&"podca-ca".to_owned()),
                "the CA key stays: {labels:?}"
            );
            let err = Pkcs11Key::open(&hsm.config(&first.location))
                .expect_err("the dropped key is gone from the token");
            assert!(err.to_string().contains("no private key"), "{err}");
            let (_, stored) = store.stored().expect("state");
            assert_eq!(
                stored.iter().map(|k| &k.info.kid).collect::<Vec<_>>(),
                vec![&second.info.kid]
            );

            // `podca ca show` lists the key and where it is held.
            let out = Command::new(podca_tests::process::podca_binary())
                .args(["ca", "show", "--dir"])
                .arg(&data)
                .arg("--pkcs11-pin-file")
                .arg(hsm.pin_file())
                .output()
                .expect("podca ca show (cargo build --bin podca first)");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                text.contains(&format!("key {} — active (ecdsa-p256)", second.info.kid)),
                "{text}"
            );
            assert!(
                text.contains(&format!("held at:   {}", second.location)),
                "{text}"
            );
            assert!(!text.contains(&first.info.kid), "{text}");

            // A restart (a new store on the same directory) opens the key from the token again.
            let restarted = open_store(&ca)
                .expect("store")
                .load()
                .expect("load from the token");
            let svid3 = restarted
                .sign(
                    &SvidRequest {
                        spiffe_id: "spiffe://td.example/ns/a/sa/b",
                        audiences: &["vault".to_owned()],
                        lifetime: None,
                    },
                    &config.limits(),
                    t0 + Duration::minutes(66),
                )
                .expect("signs after a restart");
            assert_eq!(svid3.kid, second.info.kid);
            jsonwebtoken_verifies(&svid3.token, &jwks(&restarted), "vault");
        },
    );
}

#[test]
fn a_wrong_pin_names_the_problem_and_never_the_pin() {
    in_child("a_wrong_pin_names_the_problem_and_never_the_pin", |hsm| {
        init_hsm_ca(hsm, &hsm.dir.join("ca"));
        std::fs::write(hsm.dir.join("bad.pin"), "99999999\n").expect("pin");
        let ca = CaConfig::Pkcs11(Pkcs11Ca {
            dir: Some(hsm.dir.join("ca")),
            uri: Some(hsm.ca_uri()),
            module: None,
            pin: PinSource::File(hsm.dir.join("bad.pin")),
            mode: Pkcs11Mode::HsmSignsLeaves,
            automatic_rotation: false,
        });
        let clock: Clock = Arc::new(OffsetDateTime::now_utc);
        let err = JwtRotator::start(
            open_store(&ca).expect("store"),
            &JwtConfig::default(),
            clock,
            StdDuration::from_secs(5),
        )
        .expect_err("a wrong PIN");
        let text = format!("{err:#}");
        assert!(text.contains("the user PIN is incorrect"), "{text}");
        assert!(
            text.contains("generating a JWT signing key (ecdsa-p256)"),
            "{text}"
        );
        assert!(!text.contains("99999999"), "{text}");
        // Nothing was recorded: the next start tries again from scratch.
        let (_, stored) = open_store(&ca).expect("store").stored().expect("state");
        assert!(stored.is_empty());
    });
}

/// `podca dev` with its CA key in the token makes its JWT keys there too, and the third-party
/// `spiffe` crate fetches a JWT-SVID signed in the HSM and validates it against the bundle.
#[test]
fn podca_dev_with_an_hsm_ca_signs_jwt_svids_with_a_key_in_the_token() {
    in_child(
        "podca_dev_with_an_hsm_ca_signs_jwt_svids_with_a_key_in_the_token",
        |hsm| {
            let data = hsm.dir.join("ca");
            init_hsm_ca(hsm, &data);
            let config = format!(
                "[ca]\nbackend = \"pkcs11\"\npkcs11_pin_file = {:?}\n",
                hsm.pin_file().to_str().expect("utf-8")
            );
            // The child's SOFTHSM2_CONF reaches podca dev.
            let dev = DevProcess::start_with(DevOptions {
                config: Some(&config),
                data_dir: Some(data.clone()),
                ..DevOptions::default()
            });
            let (_, stored) = open_store(&CaConfig::Pkcs11(Pkcs11Ca {
                dir: Some(data.clone()),
                uri: None,
                module: None,
                pin: PinSource::File(hsm.pin_file()),
                mode: Pkcs11Mode::HsmSignsLeaves,
                automatic_rotation: false,
            }))
            .expect("store")
            .stored()
            .expect("state");
            assert_eq!(stored.len(), 1);
            assert!(
                stored[0].location.contains(";object=podca-jwt-"),
                "{}",
                stored[0].location
            );
            assert!(
                hsm.private_key_labels()
                    .iter()
                    .any(|l| l.starts_with("podca-jwt-")),
                "the JWT key is in the token"
            );
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let client =
                    WorkloadApiClient::connect_to(&format!("unix://{}", dev.socket.display()))
                        .await
                        .expect("connect");
                let svid = client
                    .fetch_jwt_svid(["vault"], None)
                    .await
                    .expect("a JWT-SVID");
                assert_eq!(svid.key_id(), stored[0].info.kid);
                let bundles = client.fetch_jwt_bundles().await.expect("bundles");
                let local = JwtSvid::parse_and_validate(svid.token(), &bundles, &["vault"])
                    .expect("validates against the bundle");
                assert_eq!(
                    local.spiffe_id().to_string(),
                    "spiffe://podca.dev.local/ns/default/sa/default"
                );
            });
            dev.stop();
        },
    );
}
