//! The ledger's Merkle log (issue #44), checked by code that is not podca's: an RFC 9162
//! verifier written here from the RFC's algorithms (§2.1.3.2 inclusion, §2.1.4.2 consistency),
//! the leaf hash recomputed from the leaf data podca prints, and the checkpoint's C2SP signed
//! note verified with ed25519-dalek over its exact text.
//!
//! redb: 10,000 records, every inclusion proof and a spread of consistency proofs; the command
//! line's checkpoint, prove, consistency and verify. PostgreSQL (a real server): each single
//! row changed or deleted makes `podca ledger verify` name it and the proofs fail; two stores
//! appending at once make one linear log. Tampering with the redb file's rows is the signer's
//! unit test (`ledger::tests::the_log_verifies_and_any_changed_or_deleted_row_is_named`): this
//! crate has no redb.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::path::{Path, PathBuf};
use std::process::Command;

use aws_lc_rs::digest::{SHA256, digest};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use podca_authority::ledger::{LedgerBackend, PostgresSettings, PostgresTls, Store, log};
use podca_signer::ledger::{JwtFacts, RecordContext, RecordOutcome, Source};
use podca_signer::merkle_note::LogKey;
use podca_signer::{LedgerRecord, merkle};
use podca_tests::postgres::Postgres;
use podca_tests::process::podca_binary;
use time::OffsetDateTime;

type Hash = [u8; 32];

// ---- the independent verifier (RFC 9162 §2.1) ----

fn sha256(parts: &[&[u8]]) -> Hash {
    let joined: Vec<u8> = parts.concat();
    digest(&SHA256, &joined).as_ref().try_into().unwrap()
}

fn hash_leaf(data: &[u8]) -> Hash {
    sha256(&[&[0u8], data])
}

fn hash_children(left: &Hash, right: &Hash) -> Hash {
    sha256(&[&[1u8], left, right])
}

/// RFC 9162 §2.1.3.2.
fn inclusion_ok(leaf_index: u64, tree_size: u64, leaf: Hash, path: &[Hash], root: Hash) -> bool {
    if leaf_index >= tree_size {
        return false;
    }
    let mut fn_ = leaf_index;
    let mut sn = tree_size - 1;
    let mut r = leaf;
    for p in path {
        if sn == 0 {
            return false;
        }
        if fn_ % 2 == 1 || fn_ == sn {
            r = hash_children(p, &r);
            if fn_.is_multiple_of(2) {
                while fn_.is_multiple_of(2) && fn_ != 0 {
                    fn_ /= 2;
                    sn /= 2;
                }
            }
        } else {
            r = hash_children(&r, p);
        }
        fn_ /= 2;
        sn /= 2;
    }
    sn == 0 && r == root
}

/// RFC 9162 §2.1.4.2.
fn consistency_ok(
    first: u64,
    second: u64,
    first_root: Hash,
    second_root: Hash,
    proof: &[Hash],
) -> bool {
    if first == 0 || first > second {
        return false;
    }
    if first == second {
        return proof.is_empty() && first_root == second_root;
    }
    let mut path = proof.to_vec();
    if first.count_ones() == 1 {
        path.insert(0, first_root);
    }
    if path.is_empty() {
        return false;
    }
    let mut fn_ = first - 1;
    let mut sn = second - 1;
    while fn_ % 2 == 1 {
        fn_ /= 2;
        sn /= 2;
    }
    let mut fr = path[0];
    let mut sr = path[0];
    for c in &path[1..] {
        if sn == 0 {
            return false;
        }
        if fn_ % 2 == 1 || fn_ == sn {
            fr = hash_children(c, &fr);
            sr = hash_children(c, &sr);
            if fn_.is_multiple_of(2) {
                while fn_.is_multiple_of(2) && fn_ != 0 {
                    fn_ /= 2;
                    sn /= 2;
                }
            }
        } else {
            sr = hash_children(&sr, c);
        }
        fn_ /= 2;
        sn /= 2;
    }
    fr == first_root && sr == second_root && sn == 0
}

/// A checkpoint note checked with ed25519-dalek against a verifier key string
/// (`<name>+<hex key ID>+<base64(0x01 || key)>`): its size and root.
fn open_checkpoint(note: &str, verifier_key: &str) -> Result<(u64, Hash), String> {
    let mut parts = verifier_key.splitn(3, '+');
    let (name, id, key) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let key = STANDARD.decode(key).unwrap();
    assert_eq!(key[0], 1, "an Ed25519 verifier key");
    let public: [u8; 32] = key[1..].try_into().unwrap();
    let key_id = &sha256(&[name.as_bytes(), b"\n", &[1], &public])[..4];
    assert_eq!(hex(key_id), id);
    let dalek = ed25519_dalek::VerifyingKey::from_bytes(&public).unwrap();
    let split = note.find("\n\n").ok_or("no blank line")?;
    let (text, signatures) = (&note[..=split], &note[split + 2..]);
    let mut verified = false;
    for line in signatures.lines() {
        let rest = line.strip_prefix("\u{2014} ").ok_or("no em dash")?;
        let (signer, sig) = rest.split_once(' ').ok_or("no signature")?;
        let sig = STANDARD.decode(sig).map_err(|e| e.to_string())?;
        if signer != name || sig[..4] != *key_id {
            continue;
        }
        let sig = ed25519_dalek::Signature::from_slice(&sig[4..]).map_err(|e| e.to_string())?;
        dalek
            .verify_strict(text.as_bytes(), &sig)
            .map_err(|e| format!("signature: {e}"))?;
        verified = true;
    }
    if !verified {
        return Err("no signature by the log key".into());
    }
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], name);
    let root: Hash = STANDARD.decode(lines[2]).unwrap().try_into().unwrap();
    Ok((lines[1].parse().unwrap(), root))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn hash_of(text: &serde_json::Value) -> Hash {
    unhex(text.as_str().unwrap()).try_into().unwrap()
}

/// Checks a `podca ledger prove` answer with the independent verifier: the leaf hash is the
/// hash of the leaf data, and the path leads to the checkpoint's root.
fn proof_ok(proof: &serde_json::Value, verifier_key: &str) -> bool {
    let Ok((size, root)) = open_checkpoint(proof["checkpoint"].as_str().unwrap(), verifier_key)
    else {
        return false;
    };
    let data = unhex(proof["leaf_data"].as_str().unwrap());
    let leaf = hash_leaf(&data);
    let path: Vec<Hash> = proof["proof"]
        .as_array()
        .unwrap()
        .iter()
        .map(hash_of)
        .collect();
    proof["size"].as_u64() == Some(size)
        && hash_of(&proof["leaf_hash"]) == leaf
        && inclusion_ok(proof["index"].as_u64().unwrap(), size, leaf, &path, root)
}

// ---- fixtures ----

fn record(i: u32) -> LedgerRecord {
    let context = RecordContext {
        source: [Source::Pcr, Source::Grpc, Source::WorkloadApi, Source::Jwt][i as usize % 4],
        signer: "example.com/workload".into(),
        identity: format!("spiffe://cluster.local/ns/ns-{}/sa/api", i % 7),
        requester: Some("system:node:node-a".into()),
        namespace: format!("ns-{}", i % 7),
        service_account: "api".into(),
        pod_name: Some(format!("api-{i}")),
        pod_uid: None,
        node_name: Some("node-a".into()),
        request_uid: Some(format!("uid-{i}")),
        request_name: None,
        ca_generation: Some(1),
        issuer_fingerprint: Some("ab".repeat(32)),
        auth: None,
        replica: "podca-0".into(),
        time: OffsetDateTime::UNIX_EPOCH
            + time::Duration::days(20_000)
            + time::Duration::seconds(i.into()),
    };
    if i % 5 == 4 {
        return LedgerRecord::refused(&context, RecordOutcome::Denied, "NamespaceNotAllowed", "no");
    }
    let mut r = LedgerRecord::refused(&context, RecordOutcome::Issued, "Issued", "");
    r.message = None;
    r.id = format!("{i:032x}");
    r.serial = Some(r.id.clone());
    if context.source == Source::Jwt {
        r.serial = None;
        r.id = format!("jwt:{i:064x}");
        r.jwt = Some(JwtFacts {
            kid: "kid-1".into(),
            audiences: vec!["vault".into()],
            token_sha256: format!("{i:064x}"),
        });
    }
    r
}

fn podca(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(podca_binary()).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---- redb ----

/// A redb ledger in `dir`, the log key `dir/log.key` (origin `podca.test/ledger`) and its
/// verifier key's text.
async fn redb_store_and_key(dir: &Path) -> (Store, LogKey, String) {
    let store = Store::open(
        &LedgerBackend::Redb {
            path: Some(dir.join("ledger.redb")),
        },
        None,
    )
    .await
    .unwrap()
    .unwrap();
    let key = LogKey::load_or_generate(&dir.join("log.key"), "podca.test/ledger").unwrap();
    let verifier_key = key.verifier().to_text();
    (store, key, verifier_key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proofs_for_10000_records_verify_with_an_independent_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let (store, key, verifier_key) = redb_store_and_key(dir.path()).await;
    let records: Vec<LedgerRecord> = (0..10_000).map(record).collect();
    let mut checkpoints = vec![];
    for chunk in records.chunks(1000) {
        store.append(chunk.to_vec()).await.unwrap();
        checkpoints.push(log::publish_checkpoint(&store, &key).await.unwrap());
    }
    let (size, root) = open_checkpoint(&checkpoints[9].1, &verifier_key).unwrap();
    assert_eq!(size, 10_000);
    // Every leaf is the hash of the record's canonical encoding, and every proof (made by
    // podca's tree over the stored leaf hashes) leads to the signed root.
    let leaves = store.log_leaf_hashes(0, size).await.unwrap();
    let tree = merkle::Tree::new(leaves.clone());
    for (i, r) in records.iter().enumerate() {
        let i = i as u64;
        let leaf = hash_leaf(&merkle::leaf_data(r));
        assert_eq!(leaves[i as usize], leaf, "leaf {i}");
        let path = tree.inclusion_proof(i, size).unwrap();
        assert!(inclusion_ok(i, size, leaf, &path, root), "leaf {i}");
        assert!(!inclusion_ok(i, size, hash_leaf(b"forged"), &path, root));
    }
    // Each checkpoint is consistent with every later one.
    for (a, (from, note_a)) in checkpoints.iter().enumerate() {
        let (_, from_root) = open_checkpoint(note_a, &verifier_key).unwrap();
        for (to, note_b) in &checkpoints[a..] {
            let (_, to_root) = open_checkpoint(note_b, &verifier_key).unwrap();
            let proof = tree.consistency_proof(*from, *to).unwrap();
            assert!(
                consistency_ok(*from, *to, from_root, to_root, &proof),
                "{from} → {to}"
            );
            if from < to {
                assert!(!consistency_ok(*from, *to, to_root, to_root, &proof));
            }
        }
    }
    // podca's own answers, through the library the command line calls.
    for serial in [&records[0].id, &records[4321].id, &records[9999].id] {
        let proof = log::prove(&store, serial, Some(key.verifier()))
            .await
            .unwrap();
        assert!(proof_ok(
            &serde_json::to_value(&proof).unwrap(),
            &verifier_key
        ));
    }
    let summary = log::verify(&store, key.verifier()).await.unwrap();
    assert_eq!((summary.leaves, summary.checkpoints), (10_000, 10));
    assert_eq!(summary.root, root);
}

#[test]
fn the_command_line_signs_proves_and_verifies_and_refuses_precisely() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let store = Store::open(
                &LedgerBackend::Redb {
                    path: Some(data.join("ledger.redb")),
                },
                None,
            )
            .await
            .unwrap()
            .unwrap();
            store.append((0..40).map(record).collect()).await.unwrap();
        });
    }
    let d = arg(data);
    let (ok, _, err) = podca(&["ledger", "prove", "--dir", d, "--serial", "01"]);
    assert!(!ok);
    assert!(err.contains("no such file"), "{err}");
    let (ok, note, err) = podca(&[
        "ledger",
        "checkpoint",
        "--dir",
        d,
        "--origin",
        "podca.test/ledger",
    ]);
    assert!(ok, "{err}");
    let verifier_key = note
        .lines()
        .find_map(|l| l.strip_prefix("verifier key: "))
        .unwrap()
        .to_owned();
    let note_text = format!("{}\n", note.split("\n\nverifier key").next().unwrap());
    assert_eq!(open_checkpoint(&note_text, &verifier_key).unwrap().0, 40);
    let o = ["--origin", "podca.test/ledger"];
    let serial = format!("{:032x}", 17);
    let (ok, out, err) = podca(
        &[
            &["ledger", "prove", "--dir", d, "--serial", &serial][..],
            &o,
        ]
        .concat(),
    );
    assert!(ok, "{err}");
    let proof: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(proof["index"], 17);
    assert!(proof_ok(&proof, &verifier_key));
    // A verifier key alone (no private key file) is enough to check.
    let (ok, out, err) = podca(&[
        "ledger",
        "consistency",
        "--dir",
        d,
        "--from",
        "13",
        "--verifier",
        &verifier_key,
    ]);
    assert!(ok, "{err}");
    let c: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (size, root) = open_checkpoint(c["checkpoint"].as_str().unwrap(), &verifier_key).unwrap();
    let path: Vec<Hash> = c["proof"].as_array().unwrap().iter().map(hash_of).collect();
    assert!(consistency_ok(
        13,
        size,
        hash_of(&c["from_root"]),
        root,
        &path
    ));
    let (ok, out, err) = podca(&[&["ledger", "verify", "--dir", d][..], &o].concat());
    assert!(ok, "{err}");
    assert!(
        out.starts_with("ok: 40 leaves (40 records, 0 pruned), 1 checkpoints, root "),
        "{out}"
    );
    // A serial not in the log.
    let (ok, _, err) =
        podca(&[&["ledger", "prove", "--dir", d, "--serial", "ffff"][..], &o].concat());
    assert!(!ok);
    assert!(
        err.contains("no record with serial or id \"ffff\" in the ledger"),
        "{err}"
    );
    // A record after the checkpoint is not proved until the next one.
    {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let store = Store::open(
                &LedgerBackend::Redb {
                    path: Some(data.join("ledger.redb")),
                },
                None,
            )
            .await
            .unwrap()
            .unwrap();
            store.append(vec![record(40)]).await.unwrap();
        });
    }
    let (ok, _, err) = podca(
        &[
            &[
                "ledger",
                "prove",
                "--dir",
                d,
                "--serial",
                &format!("{:032x}", 40),
            ][..],
            &o,
        ]
        .concat(),
    );
    assert!(!ok);
    assert!(
        err.contains("leaf 40 is not in the latest checkpoint (size 40)"),
        "{err}"
    );
    // Checkpoints signed by another key are refused.
    let other = data.join("other.key");
    LogKey::load_or_generate(&other, "podca.test/ledger").unwrap();
    let (ok, _, err) = podca(
        &[
            &["ledger", "verify", "--dir", d, "--key-file", arg(&other)][..],
            &o,
        ]
        .concat(),
    );
    assert!(!ok);
    assert!(
        err.contains(
            "checkpoint 40: the checkpoint is not signed by the log key podca.test/ledger"
        ),
        "{err}"
    );
}

// ---- PostgreSQL ----

fn pg_backend(dir: &Path, pg: &Postgres) -> (LedgerBackend, PathBuf) {
    let url_file = dir.join("url");
    std::fs::write(&url_file, pg.unix_url()).unwrap();
    let backend = LedgerBackend::Postgres(PostgresSettings {
        url_file: url_file.clone(),
        tls: PostgresTls::Disable,
        ca_file: None,
        pool_size: 2,
        statement_timeout: std::time::Duration::from_secs(30),
    });
    (backend, url_file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_any_changed_or_deleted_row_is_named_and_proofs_fail() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (backend, url_file) = pg_backend(dir.path(), &pg);
    let store = Store::open(&backend, None).await.unwrap().unwrap();
    let key_file = dir.path().join("log.key");
    let key = LogKey::load_or_generate(&key_file, "podca.test/ledger").unwrap();
    let verifier_key = key.verifier().to_text();
    let records: Vec<LedgerRecord> = (0..300).map(record).collect();
    store.append(records[..150].to_vec()).await.unwrap();
    log::publish_checkpoint(&store, &key).await.unwrap();
    store.append(records[150..].to_vec()).await.unwrap();
    log::publish_checkpoint(&store, &key).await.unwrap();
    let verify = || {
        podca(&[
            "ledger",
            "verify",
            "--postgres-url-file",
            arg(&url_file),
            "--postgres-tls",
            "disable",
            "--key-file",
            arg(&key_file),
            "--origin",
            "podca.test/ledger",
        ])
    };
    let (ok, out, err) = verify();
    assert!(ok, "{err}");
    assert!(
        out.starts_with("ok: 300 leaves (300 records, 0 pruned), 2 checkpoints"),
        "{out}"
    );
    let target = &records[42];
    let proves = |i: usize| {
        let (store, id) = (store.clone(), records[i].id.clone());
        let verifier_key = verifier_key.clone();
        async move {
            match log::prove(&store, &id, None).await {
                Ok(p) => proof_ok(&serde_json::to_value(&p).unwrap(), &verifier_key),
                Err(_) => false,
            }
        }
    };
    assert!(proves(42).await && proves(43).await);
    let seq = pg.psql(&format!(
        "select seq from podca_ledger where id = '{}'",
        target.id
    ));
    // Each tampering (SQL), its undoing, what verify must say, and the record whose proof must
    // then fail (none for an older checkpoint changed: proofs are against the latest).
    let cases: &[(&str, &str, String, Option<usize>)] = &[
        (
            "update podca_ledger set record = jsonb_set(record, '{node_name}', '\"node-z\"') where seq = 43",
            "update podca_ledger set record = jsonb_set(record, '{node_name}', '\"node-a\"') where seq = 43",
            format!(
                "leaf 42 (record seq {seq}, id \"{}\"): the stored leaf hash is not the hash of the record",
                target.id
            ),
            Some(42),
        ),
        (
            "create table keep as select * from podca_log_leaves where idx = 42; \
             update podca_log_leaves set hash = sha256('forged') where idx = 42",
            "update podca_log_leaves l set hash = k.hash from keep k where l.idx = k.idx; drop table keep",
            format!(
                "leaf 42 (record seq {seq}, id \"{}\"): the stored leaf hash",
                target.id
            ),
            // Record 42's own path does not hold its leaf: its neighbour's does.
            Some(43),
        ),
        (
            "create table keep as select * from podca_ledger where seq = 43; \
             delete from podca_ledger where seq = 43",
            "insert into podca_ledger select * from keep; drop table keep",
            format!("leaf 42: its record (seq {seq}) is missing and was not pruned"),
            Some(42),
        ),
        (
            "create table keep as select * from podca_log_leaves where idx = 7; \
             delete from podca_log_leaves where idx = 7",
            "insert into podca_log_leaves select * from keep; drop table keep",
            "leaf 7 is missing (the leaves jump from 6 to 8)".to_owned(),
            Some(42),
        ),
        (
            "create table keep as select * from podca_log_checkpoints where size = 150; \
             update podca_log_checkpoints set note = replace(note, E'\\n150\\n', E'\\n149\\n') where size = 150",
            "update podca_log_checkpoints c set note = k.note from keep k where c.size = k.size; drop table keep",
            "checkpoint 150: the checkpoint's signature by podca.test/ledger does not verify"
                .to_owned(),
            None,
        ),
        (
            "create table keep as select * from podca_log_leaves where idx = 299; \
             create table keep_r as select * from podca_ledger where seq = 300; \
             delete from podca_log_leaves where idx = 299; delete from podca_ledger where seq = 300",
            "insert into podca_log_leaves select * from keep; insert into podca_ledger select * from keep_r; \
             drop table keep; drop table keep_r",
            "the stored frontier (size 300) does not match the 299 stored leaves".to_owned(),
            Some(42),
        ),
    ];
    assert_eq!(seq, "43", "the fixture's SQL names record 42 by seq 43");
    for (tamper, undo, said, broken_proof) in cases {
        pg.psql(tamper);
        let (ok, _, err) = verify();
        assert!(!ok, "verify passed after: {tamper}");
        assert!(err.contains(said.as_str()), "after {tamper}:\n{err}");
        if let Some(i) = broken_proof {
            assert!(
                !proves(*i).await,
                "record {i}'s proof still verifies after: {tamper}"
            );
        }
        pg.psql(undo);
        let (ok, _, err) = verify();
        assert!(ok, "after undoing {tamper}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_appenders_at_once_make_one_linear_log() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (backend, _) = pg_backend(dir.path(), &pg);
    // Two stores with their own connection pools: two replicas, as PostgreSQL sees them.
    let (a, b) = tokio::join!(Store::open(&backend, None), Store::open(&backend, None));
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    let append = |store: Store, base: u32| async move {
        for batch in 0..50u32 {
            let start = base + batch * 10;
            store
                .append((start..start + 10).map(record).collect())
                .await
                .unwrap();
        }
    };
    tokio::join!(append(a.clone(), 0), append(b.clone(), 100_000));
    assert_eq!(
        pg.psql("select count(*), min(idx), max(idx), count(distinct seq) from podca_log_leaves"),
        "1000|0|999|1000"
    );
    // Leaf order is commit order: the sequence numbers rise with the index.
    assert_eq!(
        pg.psql(
            "select count(*) from (select seq < lag(seq) over (order by idx) as back \
             from podca_log_leaves) t where back"
        ),
        "0"
    );
    let key = LogKey::load_or_generate(&dir.path().join("log.key"), "podca.test/ledger").unwrap();
    log::publish_checkpoint(&a, &key).await.unwrap();
    let summary = log::verify(&b, key.verifier()).await.unwrap();
    assert_eq!((summary.leaves, summary.records), (1000, 1000));
}

/// Two `podca issue` processes at a time, each recording into the same PostgreSQL ledger:
/// every certificate is one leaf, the indices have no gap, and the log verifies.
#[test]
fn postgres_podca_processes_issuing_at_once_make_one_linear_log() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    podca_tests::process::podca_ca_init(&ca);
    let (_, url_file) = pg_backend(dir.path(), &pg);
    let config = dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {ca:?}\n\n[ledger]\nbackend = \"postgres\"\nurl_file = {url_file:?}\n\
             tls = \"disable\"\n"
        ),
    )
    .unwrap();
    let issuer = |who: &'static str| {
        let (config, out) = (config.clone(), dir.path().join(format!("{who}.pem")));
        std::thread::spawn(move || {
            for _ in 0..12 {
                let (ok, _, err) = podca(&[
                    "issue",
                    "--config",
                    arg(&config),
                    "-n",
                    who,
                    "--service-account",
                    "api",
                    "-o",
                    arg(&out),
                ]);
                assert!(ok, "{err}");
                std::fs::remove_file(&out).ok();
            }
        })
    };
    let (a, b) = (issuer("a"), issuer("b"));
    a.join().unwrap();
    b.join().unwrap();
    assert_eq!(
        pg.psql("select count(*), min(idx), max(idx), count(distinct seq) from podca_log_leaves"),
        "24|0|23|24"
    );
    let key_file = dir.path().join("log.key");
    let (ok, _, err) = podca(&[
        "ledger",
        "checkpoint",
        "--config",
        arg(&config),
        "--key-file",
        arg(&key_file),
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = podca(&[
        "ledger",
        "verify",
        "--config",
        arg(&config),
        "--key-file",
        arg(&key_file),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("ok: 24 leaves (24 records, 0 pruned), 1 checkpoints"),
        "{out}"
    );
}

// ---- the log over HTTP, as C2SP tlog-tiles ----

/// `GET path` on 127.0.0.1:`port`: status, the head, and the body's bytes.
fn get_bytes(port: u16, path: &str) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = vec![];
    tcp.read_to_end(&mut answer).unwrap();
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(answer[..end].to_vec()).unwrap();
    let status = head[9..12].parse().unwrap();
    (status, head, answer[end + 4..].to_vec())
}

/// RFC 6962 §2.1's MTH, straight from the definition.
fn mth(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => sha256(&[]),
        1 => leaves[0],
        n => {
            // The largest power of two smaller than n.
            let mut k = 1;
            while k * 2 < n {
                k *= 2;
            }
            hash_children(&mth(&leaves[..k]), &mth(&leaves[k..]))
        }
    }
}

/// The C2SP tlog-tiles index path, written from the spec: zero-padded groups of three digits,
/// all but the last prefixed with `x`.
fn tile_path(index: u64) -> String {
    let mut groups = vec![format!("{:03}", index % 1000)];
    let mut rest = index / 1000;
    while rest > 0 {
        groups.push(format!("x{:03}", rest % 1000));
        rest /= 1000;
    }
    groups.reverse();
    groups.join("/")
}

/// The tiles a tree of `size` has at `level`, per the spec: the full ones, then a partial one
/// of width `floor(size / 256^level) mod 256` unless that is 0.
fn tiles_at(level: u32, size: u64) -> Vec<(u64, u64, String)> {
    let hashes = size / 256u64.pow(level);
    let mut out: Vec<(u64, u64, String)> =
        (0..hashes / 256).map(|n| (n, 256, tile_path(n))).collect();
    if !hashes.is_multiple_of(256) {
        let n = hashes / 256;
        out.push((
            n,
            hashes % 256,
            format!("{}.p/{}", tile_path(n), hashes % 256),
        ));
    }
    out
}

/// Follows the log at `port` as a monitor would: the checkpoint (its signature checked with
/// `verifier_key`), every level-0 tile and entry bundle (each entry hashing to its tile's
/// hash), every tile above (each hash the MTH of the 256 subtrees it covers), and the root of
/// the leaves the checkpoint's. Returns the checkpoint's size and the entries.
fn follow_log(port: u16, verifier_key: &str) -> (u64, Vec<Vec<u8>>) {
    let (status, head, note) = get_bytes(port, "/log/checkpoint");
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("cache-control: no-store"),
        "{head}"
    );
    let (size, root) = open_checkpoint(&String::from_utf8(note).unwrap(), verifier_key).unwrap();
    let mut leaves: Vec<Hash> = vec![];
    let mut entries: Vec<Vec<u8>> = vec![];
    for (_, width, path) in tiles_at(0, size) {
        let (status, head, tile) = get_bytes(port, &format!("/log/tile/0/{path}"));
        assert_eq!(status, 200, "tile/0/{path}: {head}");
        assert!(head.contains("immutable"), "{head}");
        assert_eq!(tile.len() as u64, width * 32, "tile/0/{path}");
        let hashes: Vec<Hash> = tile.chunks(32).map(|c| c.try_into().unwrap()).collect();
        let (status, _, bundle) = get_bytes(port, &format!("/log/tile/entries/{path}"));
        assert_eq!(status, 200, "tile/entries/{path}");
        let mut rest = &bundle[..];
        for (i, hash) in hashes.iter().enumerate() {
            let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            let entry = rest[2..2 + len].to_vec();
            assert_eq!(hash_leaf(&entry), *hash, "entry {i} of tile/entries/{path}");
            entries.push(entry);
            rest = &rest[2 + len..];
        }
        assert!(rest.is_empty(), "tile/entries/{path} has more than {width}");
        leaves.extend(hashes);
    }
    assert_eq!(leaves.len() as u64, size);
    assert_eq!(mth(&leaves), root, "the leaves' root is the checkpoint's");
    for level in 1..4u32 {
        let span = 256usize.pow(level);
        for (n, width, path) in tiles_at(level, size) {
            let (status, _, tile) = get_bytes(port, &format!("/log/tile/{level}/{path}"));
            assert_eq!(status, 200, "tile/{level}/{path}");
            assert_eq!(tile.len() as u64, width * 32);
            for (i, hash) in tile.chunks(32).enumerate() {
                let first = (n as usize * 256 + i) * span;
                assert_eq!(
                    hash,
                    mth(&leaves[first..first + span]),
                    "hash {i} of tile/{level}/{path}"
                );
            }
        }
    }
    (size, entries)
}

/// 70,000 records (the spec's example size: 273 full level-0 tiles and one of width 112, one
/// full level-1 tile and one of width 17, a level-2 tile of width 1) served by the admin
/// listener and followed by the independent client above; what lies beyond the checkpoint or
/// is named non-canonically is 404, and a bundle with a pruned entry 410 while its hashes stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_served_as_tlog_tiles_an_independent_client_follows() {
    use podca_authority::admin::{AdminLimits, Readiness, serve_with};
    use podca_authority::ledger::tiles::LogTiles;
    use podca_authority::metrics::Metrics;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let (store, key, verifier_key) = redb_store_and_key(dir.path()).await;
    let records: Vec<LedgerRecord> = (0..70_000).map(record).collect();
    for chunk in records.chunks(5_000) {
        store.append(chunk.to_vec()).await.unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(serve_with(
        listener,
        Arc::new(Metrics::new()),
        Readiness::new(),
        None,
        Some(Arc::new(LogTiles::new(store.clone()))),
        AdminLimits::default(),
        stopped,
    ));
    let get = |path: &'static str| tokio::task::spawn_blocking(move || get_bytes(port, path));
    assert_eq!(
        get("/log/checkpoint").await.unwrap().0,
        404,
        "no checkpoint yet"
    );
    log::publish_checkpoint(&store, &key).await.unwrap();

    let key_text = verifier_key.clone();
    let (size, entries) = tokio::task::spawn_blocking(move || follow_log(port, &key_text))
        .await
        .unwrap();
    assert_eq!(size, 70_000);
    assert_eq!(tiles_at(0, size).len(), 274);
    assert_eq!(tiles_at(1, size).last().unwrap().1, 17);
    assert_eq!(tiles_at(2, size), [(0, 1, "000.p/1".to_owned())]);
    for i in [0usize, 12_345, 69_999] {
        assert_eq!(entries[i], merkle::leaf_data(&records[i]), "entry {i}");
    }

    for (path, status) in [
        ("/log/tile/0/273.p/113", 404), // wider than the checkpoint's tree
        ("/log/tile/0/274", 404),
        ("/log/tile/2/000", 404),
        ("/log/tile/0/0", 404),    // not zero-padded
        ("/log/tile/00/000", 404), // a leading zero in the level
        ("/log/tile/0/000.p/256", 404),
        ("/log/tiles", 404),
        ("/log/tile/0/273.p/112", 200),
        ("/log/tile/0/x000/273", 404), // not canonical
    ] {
        assert_eq!(get(path).await.unwrap().0, status, "{path}");
    }

    // Retention prunes records 0..100: their bundle is gone (410), their hashes are not.
    let tile_before = get("/log/tile/0/000").await.unwrap().2;
    let cut =
        OffsetDateTime::UNIX_EPOCH + time::Duration::days(20_000) + time::Duration::seconds(100);
    assert_eq!(store.prune(cut).await.unwrap(), 100);
    let (status, _, body) = get("/log/tile/entries/000").await.unwrap();
    assert_eq!(status, 410, "{}", String::from_utf8_lossy(&body));
    assert_eq!(get("/log/tile/0/000").await.unwrap().2, tile_before);
    assert_eq!(get("/log/tile/entries/001").await.unwrap().0, 200);
}

/// `podca serve` with `[ledger.log]` serves its own log on the admin listener: the first
/// checkpoint covers the serving certificate's record, and the independent client follows it.
#[test]
fn podca_serve_serves_its_log_on_the_admin_listener() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (cluster, ca_dir) = runtime.block_on(podca_tests::cluster::Cluster::for_serve(
        "example.com/workload",
        "default",
    ));
    let dir = cluster.dir.path().to_owned();
    let key_file = dir.join("log.key");
    let config = dir.join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {ca_dir:?}\n\n[signers.\"example.com/workload\"]\n\
             trust_domain = \"cluster.local\"\n\n[grpc]\n{}\n\n[ledger.log]\nenabled = true\n\
             key_file = {key_file:?}\norigin = \"podca.test/serve\"\n\
             checkpoint_interval_seconds = 1\n",
            podca_tests::tls::GRPC_TLS_CONFIG,
        ),
    )
    .unwrap();
    let serve = podca_tests::process::ServeProcess::start(&config, &cluster.kubeconfig, &[], &[]);
    let key = LogKey::load_or_generate(&key_file, "podca.test/serve").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // The first checkpoint may be of the empty log; wait for one with the serving record.
    let covers_a_leaf = |(status, _, note): (u16, String, Vec<u8>)| {
        status == 200 && String::from_utf8_lossy(&note).lines().nth(1) != Some("0")
    };
    while !covers_a_leaf(get_bytes(serve.admin, "/log/checkpoint")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint of a leaf on the admin listener within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (size, entries) = follow_log(serve.admin, &key.verifier().to_text());
    assert!(size >= 1);
    let first = String::from_utf8_lossy(&entries[0]).into_owned();
    assert!(
        first.contains("serving"),
        "the serving certificate's record: {first:?}"
    );
}

/// With the CA in a Secret, the checkpoint key lives in the Secret `<CA Secret>-log` beside it:
/// the first `podca serve` makes it (labelled podca's), the checkpoints it serves verify under
/// the key in that Secret, a second replica reads the same key rather than making one, and a
/// foreign Secret of that name stops podca at start with its name.
#[test]
fn with_the_ca_in_a_secret_the_log_key_is_kept_in_a_secret_beside_it() {
    use podca_tests::cluster::{Cluster, ClusterConfig, PODCA_USER};
    use podca_tests::emulator::podca_rbac::PodcaRbac;
    use podca_tests::emulator::{ApiMode, PolicyRule, Res, Subject};
    use podca_tests::tls::NAMESPACE;

    const SIGNER: &str = "example.com/workload";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cluster = runtime.block_on(Cluster::start_with(ClusterConfig {
        emulator: podca_tests::EmulatorConfig {
            api_mode: ApiMode::V1Only,
            auto_create_namespaces: true,
            ..Default::default()
        },
        podca_groups: &["system:serviceaccounts"],
        signers: &[SIGNER],
    }));
    cluster
        .emu
        .add_ca_secret(NAMESPACE, "podca-ca", "secret-held root");
    let rbac = PodcaRbac {
        signer_names: vec![SIGNER.into()],
        ca_secret: Some((NAMESPACE.into(), "podca-ca".into())),
        lease_name: None,
        issue_for_pod: false,
        jwks_configmap: None,
        namespace_labels: false,
        pod_facts: false,
        service_ca: false,
    };
    for rule in rbac.rules() {
        cluster.emu.grant(Subject::User(PODCA_USER.into()), rule);
    }
    // What the log adds: `get` on its Secret by name (`create` in the namespace is granted).
    cluster.emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&[""], &["secrets"], &["get"])
            .with_names(&["podca-ca-log"])
            .in_namespaces(&[NAMESPACE]),
    );
    let dir = cluster.dir.path().to_owned();
    let config = dir.join("podca.toml");
    let write_config = |key_secret: &str| {
        std::fs::write(
            &config,
            format!(
                "[ca]\nbackend = \"secret\"\nsecret = \"{NAMESPACE}/podca-ca\"\n\n\
                 [signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n[grpc]\n{}\n\
                 [jwt]\nenabled = false\n\n[ledger]\nbackend = \"redb\"\npath = {:?}\n\n\
                 [ledger.log]\nenabled = true\norigin = \"podca.test/secret\"\n\
                 checkpoint_interval_seconds = 1\n{key_secret}",
                podca_tests::tls::GRPC_TLS_CONFIG,
                dir.join("ledger.redb"),
            ),
        )
        .unwrap();
    };
    write_config("");
    let log_key_of_secret = || {
        let secret = cluster
            .emu
            .get_object(Res::Secret, NAMESPACE, "podca-ca-log")
            .expect("the log key Secret");
        assert_eq!(
            secret["metadata"]["labels"]["app.kubernetes.io/managed-by"], "podca",
            "{secret}"
        );
        let pem = STANDARD
            .decode(secret["data"]["log.key"].as_str().unwrap())
            .unwrap();
        LogKey::from_pem(&pem, "podca.test/secret", "the Secret").unwrap()
    };
    let serve = podca_tests::process::ServeProcess::start(&config, &cluster.kubeconfig, &[], &[]);
    let key = log_key_of_secret();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while get_bytes(serve.admin, "/log/checkpoint").0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (_, _, note) = get_bytes(serve.admin, "/log/checkpoint");
    let note = String::from_utf8(note).unwrap();
    open_checkpoint(&note, &key.verifier().to_text()).unwrap();
    drop(serve);

    // A restart (or a second replica) reads the same key: the Secret is not replaced.
    let before = cluster
        .emu
        .get_object(Res::Secret, NAMESPACE, "podca-ca-log")
        .unwrap();
    let serve = podca_tests::process::ServeProcess::start(&config, &cluster.kubeconfig, &[], &[]);
    let (status, _, _) = get_bytes(serve.admin, "/log/checkpoint");
    assert_eq!(status, 200);
    let after = cluster
        .emu
        .get_object(Res::Secret, NAMESPACE, "podca-ca-log")
        .unwrap();
    assert_eq!(
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );
    assert_eq!(
        log_key_of_secret().verifier().to_text(),
        key.verifier().to_text()
    );
    drop(serve);

    // A Secret of that name that is not podca's is never used nor overwritten.
    write_config("key_secret = \"someone-elses\"\n");
    cluster.emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&[""], &["secrets"], &["get"])
            .with_names(&["someone-elses"])
            .in_namespaces(&[NAMESPACE]),
    );
    cluster
        .emu
        .add_secret(NAMESPACE, "someone-elses", "Opaque", &[("log.key", b"x")]);
    let log = dir.join("foreign.log");
    let mut serve =
        podca_tests::process::ServeProcess::start_logged(&config, &cluster.kubeconfig, &[], &log);
    assert!(
        !serve
            .wait_exit(std::time::Duration::from_secs(20))
            .success()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!(
            "the Secret {NAMESPACE}/someone-elses exists but is not podca's"
        )),
        "{text}"
    );
}

/// With the CA key in a PKCS#11 token (SoftHSM2), the checkpoint key is an Ed25519 key made in
/// the same token, labelled `podca-log`: the checkpoints `podca serve` serves verify (with
/// ed25519-dalek) under the verifier key it logs, and a restart signs with the same key rather
/// than making another.
#[test]
fn with_an_hsm_ca_the_log_key_is_an_ed25519_key_in_the_token() {
    use podca_tests::softhsm::{HsmCa, private_key_labels};

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (cluster, _) = runtime.block_on(podca_tests::cluster::Cluster::for_serve(
        "example.com/workload",
        "default",
    ));
    let dir = cluster.dir.path().to_owned();
    let HsmCa { conf, pin, dir: ca } = HsmCa::init(&dir, "ledger");
    let config = dir.join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\nbackend = \"pkcs11\"\ndir = {ca:?}\npkcs11_pin_file = {pin:?}\n\n\
             [signers.\"example.com/workload\"]\ntrust_domain = \"cluster.local\"\n\n[grpc]\n{}\n\
             [ledger]\nbackend = \"redb\"\npath = {:?}\n\n[ledger.log]\nenabled = true\n\
             origin = \"podca.test/hsm\"\ncheckpoint_interval_seconds = 1\n",
            podca_tests::tls::GRPC_TLS_CONFIG,
            dir.join("ledger.redb"),
        ),
    )
    .unwrap();
    let env = [("SOFTHSM2_CONF", conf.as_path())];
    let verifier_in = |log: &Path| {
        let text = std::fs::read_to_string(log).unwrap();
        text.lines()
            .find(|l| l.contains("ledger log: checkpoints signed by this key"))
            .and_then(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("verifier="))
            })
            .unwrap_or_else(|| panic!("no verifier key logged:\n{text}"))
            .to_owned()
    };
    let mut verifiers = vec![];
    for run in ["first", "restart"] {
        let log = dir.join(format!("{run}.log"));
        let serve = podca_tests::process::ServeProcess::start_logged_with(
            &config,
            &cluster.kubeconfig,
            &[],
            &log,
            &env,
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let note = loop {
            let (status, _, note) = get_bytes(serve.admin, "/log/checkpoint");
            if status == 200 {
                break String::from_utf8(note).unwrap();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{run}: no checkpoint within 20 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        let verifier = verifier_in(&log);
        open_checkpoint(&note, &verifier).unwrap_or_else(|e| panic!("{run}: {e}\n{note}"));
        verifiers.push(verifier);
        drop(serve);
    }
    assert_eq!(
        verifiers[0], verifiers[1],
        "the restart signs with the same key"
    );
    // The command line finds the same key in the token (redb: once serve has stopped).
    let verify = Command::new(podca_binary())
        .args(["ledger", "verify", "--config", arg(&config)])
        .env("SOFTHSM2_CONF", &conf)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success() && out.starts_with("ok: "),
        "{out}{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let labels = private_key_labels(&conf, "ledger", "123456");
    assert_eq!(
        labels.iter().filter(|l| *l == "podca-log").count(),
        1,
        "one log key in the token: {labels:?}"
    );
}
