//! HSM throughput: SoftHSM2's raw P-256 sign rate, `Pkcs11Key::sign`, leaf issuance with the
//! HSM signing every leaf, and leaf issuance in intermediate mode; 1 and N threads.
//!
//! `cargo bench -p podca-signer --bench hsm`. Needs SoftHSM2 (`apt-get install -y -t bookworm
//! softhsm2`). The binary re-runs itself with `SOFTHSM2_CONF` pointing at a fresh token in a
//! temporary directory. `PODCA_BENCH_SECONDS` sets the time per cell (default 2).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, ObjectClass};
use cryptoki::session::UserType;
use cryptoki::types::AuthPin;
use podca_signer::backend::pkcs11::{
    PinSource, Pkcs11Config, Pkcs11Key, Pkcs11Uri, SOFTHSM2_MODULE,
};
use podca_signer::{CaAlgorithm, CaKey, IssuingCa, MemoryKey, SubjectKey, Validity};
use time::OffsetDateTime;

/// One benchmark row: thread count → operations per second.
type Bench<'a> = Box<dyn Fn(usize) -> f64 + 'a>;

const PIN: &str = "bench-user-pin-4821";
const LABEL: &str = "podca-bench";

fn main() {
    if std::env::var_os("PODCA_BENCH_CHILD").is_none() {
        parent();
        return;
    }
    let dir = std::path::PathBuf::from(std::env::var("PODCA_BENCH_DIR").unwrap_or_default());
    child(&dir);
}

fn parent() {
    let installed = Command::new("softhsm2-util")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        installed && Path::new(SOFTHSM2_MODULE).exists(),
        "SoftHSM2 is missing: apt-get install -y -t bookworm softhsm2"
    );
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
    std::fs::write(dir.join("pin"), PIN).unwrap_or_else(|e| panic!("{e}"));
    let init = Command::new("softhsm2-util")
        .env("SOFTHSM2_CONF", &conf)
        .args([
            "--init-token",
            "--free",
            "--label",
            LABEL,
            "--so-pin",
            "bench-so-pin",
            "--pin",
            PIN,
        ])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let status = Command::new(exe)
        .env("SOFTHSM2_CONF", &conf)
        .env("PODCA_BENCH_CHILD", "1")
        .env("PODCA_BENCH_DIR", dir)
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "the benchmark failed");
}

/// Runs `op` on `threads` threads for `secs`; returns operations per second.
fn rate<'a>(
    threads: usize,
    secs: Duration,
    op: impl Fn(usize) -> Box<dyn FnMut() + Send + 'a>,
) -> f64 {
    let start = Instant::now();
    let counts: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mut f = op(t);
                s.spawn(move || {
                    let mut n = 0u64;
                    while start.elapsed() < secs {
                        f();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
    });
    counts.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64()
}

fn child(dir: &Path) {
    let secs = Duration::from_secs_f64(
        std::env::var("PODCA_BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    );
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let many = (2 * cores).max(2);
    let uri = Pkcs11Uri::parse(&format!(
        "pkcs11:token={LABEL};object=ca?module-path={SOFTHSM2_MODULE}"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let mut config = Pkcs11Config::new(uri, PinSource::File(dir.join("pin")));
    config.pool_size = Some(many);
    let key = Arc::new(
        Pkcs11Key::generate(&config, CaAlgorithm::EcdsaP256).unwrap_or_else(|e| panic!("{e}")),
    );

    // Raw token rate: C_Sign(CKM_ECDSA) over a 32-byte digest on one session per thread.
    let ctx = Pkcs11::new(SOFTHSM2_MODULE).unwrap_or_else(|e| panic!("{e}"));
    // Already initialised by the key in this process; that error is expected.
    let _ = ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK));
    let slot = ctx
        .get_slots_with_token()
        .unwrap_or_default()
        .into_iter()
        .find(|s| ctx.get_token_info(*s).is_ok_and(|i| i.label() == LABEL))
        .unwrap_or_else(|| panic!("token not found"));
    let raw = |threads: usize| {
        rate(threads, secs, |_| {
            let session = ctx.open_ro_session(slot).unwrap_or_else(|e| panic!("{e}"));
            let _ = session.login(UserType::User, Some(&AuthPin::from(PIN)));
            let handle = session
                .find_objects(&[
                    Attribute::Class(ObjectClass::PRIVATE_KEY),
                    Attribute::Label(b"ca".to_vec()),
                ])
                .unwrap_or_default()
                .first()
                .copied()
                .unwrap_or_else(|| panic!("key not found"));
            let digest = [7u8; 32];
            Box::new(move || {
                session
                    .sign(&Mechanism::Ecdsa, handle, &digest)
                    .unwrap_or_else(|e| panic!("{e}"));
            })
        })
    };

    let backend = |threads: usize| {
        rate(threads, secs, |t| {
            let key = Arc::clone(&key);
            let msg =
                format!("a to-be-signed certificate of about this size, thread {t}").repeat(8);
            Box::new(move || {
                key.sign(msg.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            })
        })
    };

    let now = OffsetDateTime::now_utc();
    let root = IssuingCa::self_signed_root(
        Arc::clone(&key) as Arc<dyn CaKey>,
        "bench HSM root",
        now,
        time::Duration::days(30),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let intermediate = root
        .sign_intermediate(
            Arc::new(MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap_or_else(|e| panic!("{e}"))),
            "bench intermediate",
            now,
            time::Duration::hours(3),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let subject_kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap_or_else(|e| panic!("{e}"));
    let subject =
        SubjectKey::from_spki_der(&rcgen::PublicKeyData::subject_public_key_info(&subject_kp))
            .unwrap_or_else(|e| panic!("{e}"));
    let start = podca_signer::ca::whole_seconds(now);
    let validity = Validity {
        not_before: start,
        not_after: start + time::Duration::hours(1),
        begin_refresh_at: start + time::Duration::minutes(30),
    };
    let issue = |ca: &IssuingCa, threads: usize| {
        rate(threads, secs, |_| {
            let (subject, validity) = (&subject, &validity);
            Box::new(move || {
                ca.issue(
                    subject,
                    "spiffe://cluster.local/ns/bench/sa/bench",
                    &[],
                    validity,
                )
                .unwrap_or_else(|e| panic!("{e}"));
            })
        })
    };

    println!();
    println!(
        "PKCS#11 CA key benchmark (SoftHSM2, ECDSA P-256 CA key, P-256 subject keys), {:.1}s per cell, {cores} cores",
        secs.as_secs_f64()
    );
    println!(
        "{:<54} {:>12} {:>12}",
        "operation",
        "1 thread",
        format!("{many} threads")
    );
    let rows: [(&str, Bench<'_>); 4] = [
        (
            "SoftHSM2 raw C_Sign (CKM_ECDSA, host digest)",
            Box::new(raw),
        ),
        ("Pkcs11Key::sign (digest + pool + DER)", Box::new(backend)),
        (
            "leaves/s, HSM signs every leaf",
            Box::new(|n| issue(&root, n)),
        ),
        (
            "leaves/s, intermediate mode (in-memory P-256)",
            Box::new(|n| issue(&intermediate, n)),
        ),
    ];
    let mut results = vec![];
    for (name, f) in rows.iter() {
        let one = f(1);
        let n = f(many);
        println!("{name:<54} {one:>10.0}/s {n:>10.0}/s");
        results.push((one, n));
    }
    let ratio = |row: usize, col: usize| {
        let pick = |r: (f64, f64)| if col == 0 { r.0 } else { r.1 };
        100.0 * pick(results[row]) / pick(results[0])
    };
    println!(
        "HSM-signed leaves vs raw sign rate: {:.0}% (1 thread), {:.0}% ({many} threads); target >= 80%",
        ratio(2, 0),
        ratio(2, 1)
    );
    let stats = key.stats();
    println!(
        "Pkcs11Key stats: {} signs, {} errors, mean latency {:?}, max latency {:?}, pool {}",
        stats.signs,
        stats.errors,
        stats
            .total_latency
            .checked_div(u32::try_from(stats.signs.max(1)).unwrap_or(u32::MAX))
            .unwrap_or_default(),
        stats.max_latency,
        stats.pool_size
    );
}
