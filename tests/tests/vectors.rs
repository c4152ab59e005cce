//! Replays every vector recorded from kube-apiserver 1.36.2 against a fresh
//! emulator per vector, over HTTP, and compares the answers.

use podca_tests::client::KubeClient;
use podca_tests::emulator::{
    ApiMode, CleanerConfig, Emulator, EmulatorConfig, PodFixture, PolicyRule, Res, Subject,
};
use serde_json::{Value, json};
use std::path::PathBuf;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

fn vectors_path() -> PathBuf {
    match std::env::var_os("PODCA_VECTORS") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vectors/apiserver-1.36.2.json"),
    }
}

fn load() -> Value {
    let p = vectors_path();
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "the recorded vectors are missing: looked at {} ({e}); the repository carries a copy in tests/vectors/ (refreshed from shared/vectors/); PODCA_VECTORS overrides",
            p.display()
        )
    });
    serde_json::from_str(&text).expect("vectors file is JSON")
}

fn sha256_hex(b: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b)
        .as_ref()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Expand `{"$expand": [...], "length", "sha256"}` objects, checking them.
fn expand(v: &Value, problems: &mut Vec<String>) -> Value {
    match v {
        Value::Object(m) if m.contains_key("$expand") => {
            let mut s = String::new();
            for part in m["$expand"].as_array().into_iter().flatten() {
                match part {
                    Value::String(x) => s.push_str(x),
                    Value::Object(r) => {
                        let unit = r["repeat"].as_str().unwrap_or("");
                        let times = r["times"].as_u64().unwrap_or(0);
                        for _ in 0..times {
                            s.push_str(unit);
                        }
                    }
                    _ => problems.push("bad $expand part".into()),
                }
            }
            if m["length"].as_u64() != Some(s.len() as u64) {
                problems.push(format!("$expand length {} != {}", s.len(), m["length"]));
            }
            if m["sha256"].as_str() != Some(sha256_hex(s.as_bytes()).as_str()) {
                problems.push("$expand sha256 mismatch".into());
            }
            Value::String(s)
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), expand(x, problems)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| expand(x, problems)).collect()),
        other => other.clone(),
    }
}

async fn environment(d: &Value, server_time: &str) -> Emulator {
    let emu = Emulator::start(EmulatorConfig {
        api_mode: ApiMode::V1Beta1,
        cleaner: CleanerConfig {
            enabled: false,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("emulator starts");
    let t = OffsetDateTime::parse(server_time, &Rfc3339).expect("server_time parses");
    emu.set_time(t);
    let env = &d["environment"];
    let ids = &env["identities"];
    for (id, info) in ids.as_object().expect("identities") {
        if id == "admin" {
            continue;
        }
        let user = info["user"].as_str().expect("user");
        let groups: Vec<&str> = info["groups"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        emu.add_identity(id, user, &groups);
    }
    let roles = &env["rbac_clusterroles"];
    for user in ["nobody", "example-signer"] {
        for rule in roles["ctb-and-pcr-writer"].as_array().expect("role") {
            emu.grant(Subject::User(user.into()), PolicyRule::from_json(rule));
        }
    }
    for rule in roles["example-signer"].as_array().expect("role") {
        emu.grant(
            Subject::User("example-signer".into()),
            PolicyRule::from_json(rule),
        );
    }
    let fx = &env["fixtures"];
    let ns = fx["namespace"].as_str().expect("ns");
    emu.add_namespace(ns);
    emu.add_node_with_uid(
        fx["node"]["name"].as_str().expect("node"),
        fx["node"]["uid"].as_str().expect("uid"),
    );
    emu.add_service_account_with_uid(
        fx["serviceAccount"]["namespace"].as_str().expect("ns"),
        fx["serviceAccount"]["name"].as_str().expect("sa"),
        fx["serviceAccount"]["uid"].as_str().expect("uid"),
    );
    let pod = &fx["pod"];
    emu.add_pod(&PodFixture {
        namespace: pod["namespace"].as_str().expect("ns").into(),
        name: pod["name"].as_str().expect("name").into(),
        node_name: pod["nodeName"].as_str().expect("node").into(),
        service_account: pod["serviceAccountName"].as_str().expect("sa").into(),
        pod_certificates: vec![(
            pod["projectedPodCertificate"]["signerName"]
                .as_str()
                .expect("signer")
                .into(),
            pod["projectedPodCertificate"]["keyType"]
                .as_str()
                .expect("kt")
                .into(),
        )],
        uid: Some(pod["uid"].as_str().expect("uid").into()),
        mirror: false,
    });
    emu
}

fn client(emu: &Emulator, who: &str) -> KubeClient {
    let mut c = KubeClient::new(
        emu.base_url(),
        &emu.token_for(who)
            .unwrap_or_else(|| panic!("identity {who}")),
    );
    c.user_agent = "vec-recorder/1.0".into();
    c
}

fn with_chain_sha(status: &Value) -> Value {
    let mut s = status.clone();
    if let Some(m) = s.as_object_mut()
        && let Some(Value::String(chain)) = m.remove("certificateChain")
    {
        m.insert(
            "certificateChain_sha256".into(),
            json!(sha256_hex(chain.as_bytes())),
        );
    }
    s
}

fn diff(p: &mut Vec<String>, id: &str, what: &str, want: &Value, have: &Value) {
    if want != have {
        p.push(format!(
            "{id}: {what}\n    expected: {want}\n    got:      {have}"
        ));
    }
}

fn none_if_null(v: &Value) -> Option<&Value> {
    if v.is_null() { None } else { Some(v) }
}

async fn replay(d: &Value, v: &Value) -> Vec<String> {
    let mut p = Vec::new();
    let id = v["id"].as_str().unwrap_or("?");
    let emu = environment(d, v["server_time"].as_str().expect("server_time")).await;
    let setup = &v["setup"];
    let mut setup_rv = None;
    let mut target: Option<(Res, String, String)> = None;
    if let Some(pcr) = none_if_null(&setup["pcr"]) {
        let stored = emu.seed_object(Res::Pcr, pcr.clone());
        if stored["metadata"]["resourceVersion"] != pcr["metadata"]["resourceVersion"] {
            p.push(format!("{id}: setup resourceVersion not kept"));
        }
        setup_rv = Some(
            pcr["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        target = Some((
            Res::Pcr,
            pcr["metadata"]["namespace"].as_str().unwrap_or("").into(),
            pcr["metadata"]["name"].as_str().unwrap_or("").into(),
        ));
    }
    if let Some(ctb) = none_if_null(&setup["ctb"]) {
        emu.seed_object(Res::Ctb, ctb.clone());
        setup_rv = Some(
            ctb["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        target = Some((
            Res::Ctb,
            String::new(),
            ctb["metadata"]["name"].as_str().unwrap_or("").into(),
        ));
    }
    let req = &v["request"];
    let body = expand(&req["body"], &mut p);
    let ct = req["content_type"].as_str();
    let bytes = match (&body, ct) {
        (Value::Null, _) => Vec::new(),
        (Value::String(s), Some(c)) if c.contains("yaml") => s.clone().into_bytes(),
        (b, _) => serde_json::to_vec(b).expect("json"),
    };
    if target.is_none() && req["method"] == "POST" {
        let res = if req["path"]
            .as_str()
            .unwrap_or("")
            .contains("clustertrustbundles")
        {
            Res::Ctb
        } else {
            Res::Pcr
        };
        target = Some((
            res,
            body["metadata"]["namespace"].as_str().unwrap_or("").into(),
            body["metadata"]["name"].as_str().unwrap_or("").into(),
        ));
    }
    let c = client(&emu, req["as"].as_str().expect("as"));
    let resp = match c
        .request(
            req["method"].as_str().expect("method"),
            req["path"].as_str().expect("path"),
            ct,
            bytes,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            p.push(format!("{id}: request failed: {e}"));
            return p;
        }
    };
    let got = resp.json();
    let exp = &v["expect"];
    diff(&mut p, id, "HTTP code", &exp["code"], &json!(resp.status));
    let is_status = got["kind"] == "Status";
    if exp.get("status").is_some() || resp.status >= 300 {
        diff(
            &mut p,
            id,
            "Status.reason",
            &exp["reason"],
            &got.get("reason").cloned().unwrap_or(Value::Null),
        );
        diff(
            &mut p,
            id,
            "Status.message",
            &exp["message"],
            &got.get("message").cloned().unwrap_or(Value::Null),
        );
        if let Some(s) = exp.get("status") {
            diff(&mut p, id, "Status.status", s, &got["status"]);
        }
        let causes: Vec<Value> = got["details"]["causes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|c| json!({"field": c["field"], "message": c["message"], "reason": c["reason"]}))
            .collect();
        diff(&mut p, id, "causes", &exp["causes"], &Value::Array(causes));
        match exp.get("details") {
            Some(dt) => {
                for k in ["name", "group", "kind"] {
                    diff(
                        &mut p,
                        id,
                        &format!("details.{k}"),
                        &dt[k],
                        &got["details"][k],
                    );
                }
            }
            None => {
                if !got["details"].is_null()
                    && !got["details"].as_object().is_some_and(|m| m.is_empty())
                {
                    p.push(format!("{id}: unexpected details {}", got["details"]));
                }
            }
        }
    } else if is_status {
        p.push(format!("{id}: expected an object, got a Status: {got}"));
    }
    if resp.status < 300 {
        if let Some(k) = exp.get("response_kind") {
            diff(&mut p, id, "response kind", k, &got["kind"]);
        }
        let after = &v["after"];
        let Some((res, ns, name)) = target else {
            p.push(format!("{id}: no target"));
            return p;
        };
        let stored = emu.get_object(res, &ns, &name);
        if req["method"] == "DELETE" {
            if stored.is_some() {
                p.push(format!("{id}: object still exists after DELETE"));
            }
            return p;
        }
        let Some(stored) = stored else {
            p.push(format!("{id}: object not stored"));
            return p;
        };
        if let Some(changed) = after
            .get("resource_version_changed")
            .and_then(Value::as_bool)
        {
            let now_rv = stored["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_string();
            diff(
                &mut p,
                id,
                "resource_version_changed",
                &json!(changed),
                &json!(Some(now_rv) != setup_rv),
            );
        }
        if let Some(st) = after.get("status") {
            diff(
                &mut p,
                id,
                "stored status",
                st,
                &with_chain_sha(&stored["status"]),
            );
        }
        if let Some(spec) = after.get("stored_spec") {
            diff(&mut p, id, "stored spec", spec, &stored["spec"]);
        }
        if let Some(st) = after.get("stored_status") {
            diff(&mut p, id, "stored status", st, &stored["status"]);
        }
        if let Some(g) = after.get("metadata_generation_present") {
            diff(
                &mut p,
                id,
                "generation present",
                g,
                &json!(stored["metadata"].get("generation").is_some()),
            );
        }
        if after.get("resourceVersion").is_some() {
            let rv = stored["metadata"]["resourceVersion"].as_str().unwrap_or("");
            if rv.is_empty() || !rv.bytes().all(|b| b.is_ascii_digit()) {
                p.push(format!(
                    "{id}: resourceVersion {rv:?} is not a decimal string"
                ));
            }
            if setup_rv.as_deref() == Some(rv) {
                p.push(format!("{id}: resourceVersion did not change"));
            }
        }
        if let Some(s) = after.get("spec_signerName") {
            diff(
                &mut p,
                id,
                "spec.signerName",
                s,
                &stored["spec"]
                    .get("signerName")
                    .cloned()
                    .unwrap_or(Value::Null),
            );
        }
        // The answer must be the stored object.
        if got["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"] {
            p.push(format!("{id}: answer resourceVersion differs from stored"));
        }
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recorded_write_is_answered_like_kube_apiserver() {
    let d = load();
    let vectors = d["vectors"].as_array().expect("vectors");
    assert_eq!(vectors.len(), 87, "the file should hold 87 writes");
    let mut problems = Vec::new();
    let mut passed = 0;
    for v in vectors {
        let p = replay(&d, v).await;
        if p.is_empty() {
            passed += 1;
        }
        problems.extend(p);
    }
    eprintln!("vectors: {passed}/{} passed", vectors.len());
    assert!(
        problems.is_empty(),
        "{} mismatches:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

fn keys_of(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}

/// The five list/watch observations, as far as an emulator can reproduce
/// them (resourceVersions and UIDs differ by nature).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_watch_observations_match_the_recording() {
    use base64::Engine as _;
    use podca_tests::kubelet::{KeyType, SubjectKey};
    use podca_tests::testca::TestCa;

    let d = load();
    let obs: Vec<&Value> = d["watch"].as_array().expect("watch").iter().collect();
    assert_eq!(obs.len(), 5);
    let by_id = |id: &str| {
        *obs.iter()
            .find(|o| o["id"] == id)
            .unwrap_or_else(|| panic!("{id}"))
    };
    let mut p = Vec::new();
    let emu = environment(
        &d,
        by_id("list-pcrs-by-signer")["server_time"]
            .as_str()
            .expect("time"),
    )
    .await;
    let fx = &d["environment"]["fixtures"];
    let node = client(&emu, "node");
    let signer = client(&emu, "signer-with-sign");
    let admin = client(&emu, "admin");
    let key = SubjectKey::generate(KeyType::EcdsaP256).expect("key");
    let pcr_body = |name: &str| {
        json!({
            "apiVersion": "certificates.k8s.io/v1beta1", "kind": "PodCertificateRequest",
            "metadata": {"name": name, "namespace": fx["namespace"]},
            "spec": {
                "signerName": d["environment"]["signerName"], "podName": fx["pod"]["name"], "podUID": fx["pod"]["uid"],
                "serviceAccountName": fx["serviceAccount"]["name"], "serviceAccountUID": fx["serviceAccount"]["uid"],
                "nodeName": fx["node"]["name"], "nodeUID": fx["node"]["uid"],
                "stubPKCS10Request": base64::engine::general_purpose::STANDARD.encode(key.stub_csr_der().expect("csr")),
            }
        })
    };
    let ns = fx["namespace"].as_str().expect("ns");
    let base = format!("/apis/certificates.k8s.io/v1beta1/namespaces/{ns}/podcertificaterequests");
    for n in ["obs-1", "obs-2"] {
        let r = node.post(&base, &pcr_body(n)).await.expect("create");
        assert_eq!(r.status, 201, "{}", r.json());
    }

    // list-pcrs-by-signer
    let o = by_id("list-pcrs-by-signer");
    let r = signer
        .get(o["request"]["path"].as_str().expect("path"))
        .await
        .expect("list");
    let l = r.json();
    diff(
        &mut p,
        "list",
        "code",
        &o["expect"]["code"],
        &json!(r.status),
    );
    diff(&mut p, "list", "kind", &o["expect"]["kind"], &l["kind"]);
    diff(
        &mut p,
        "list",
        "apiVersion",
        &o["expect"]["apiVersion"],
        &l["apiVersion"],
    );
    diff(
        &mut p,
        "list",
        "metadata keys",
        &json!(keys_of(&o["expect"]["metadata"])),
        &json!(keys_of(&l["metadata"])),
    );
    let list_rv = l["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if list_rv.is_empty() || !list_rv.bytes().all(|b| b.is_ascii_digit()) {
        p.push(format!("list: resourceVersion {list_rv:?} is not decimal"));
    }
    diff(
        &mut p,
        "list",
        "item count",
        &o["expect"]["item_count_at_recording"],
        &json!(l["items"].as_array().map_or(0, Vec::len)),
    );
    let kind_present = l["items"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|i| i.get("kind").is_some() || i.get("apiVersion").is_some());
    diff(
        &mut p,
        "list",
        "item kind present",
        &o["expect"]["item_kind_field_present"],
        &json!(kind_present),
    );

    // watch-pcrs-by-signer
    let o = by_id("watch-pcrs-by-signer");
    let path = o["request"]["path"]
        .as_str()
        .expect("path")
        .replace("{listResourceVersion}", &list_rv);
    let mut w = signer.watch(&path).await.expect("watch");
    diff(
        &mut p,
        "watch",
        "code",
        &o["expect"]["code"],
        &json!(w.status),
    );
    diff(
        &mut p,
        "watch",
        "content type",
        &o["expect"]["content_type"],
        &json!(w.header("content-type")),
    );
    diff(
        &mut p,
        "watch",
        "transfer encoding",
        &o["expect"]["transfer_encoding"],
        &json!(w.header("transfer-encoding")),
    );
    let r = node
        .post(&base, &pcr_body("watch-pcr"))
        .await
        .expect("create");
    assert_eq!(r.status, 201);
    let ca = TestCa::new("vec test root CA").expect("ca");
    let patch = ca.issue_patch(&key, emu.now(), 86400).expect("patch");
    let r = signer
        .merge_patch(&format!("{base}/watch-pcr/status"), &patch)
        .await
        .expect("issue");
    assert_eq!(r.status, 200, "{}", r.json());
    let r = admin
        .delete(&format!("{base}/watch-pcr"))
        .await
        .expect("delete");
    assert_eq!(r.status, 200);
    let want = o["expect"]["events"].as_array().expect("events");
    let mut last_rv = 0u64;
    for (i, we) in want.iter().enumerate() {
        let ev = match w.next_event(std::time::Duration::from_secs(10)).await {
            Ok(Some(ev)) => ev,
            other => {
                p.push(format!("watch: event {i} missing: {other:?}"));
                break;
            }
        };
        let ctx = format!("watch event {i}");
        diff(&mut p, &ctx, "type", &we["type"], &ev["type"]);
        let (wo, go) = (&we["object"], &ev["object"]);
        for k in ["kind", "apiVersion"] {
            diff(&mut p, &ctx, k, &wo[k], &go[k]);
        }
        diff(
            &mut p,
            &ctx,
            "object keys",
            &json!(keys_of(wo)),
            &json!(keys_of(go)),
        );
        diff(
            &mut p,
            &ctx,
            "metadata.name",
            &wo["metadata"]["name"],
            &go["metadata"]["name"],
        );
        let mut go_meta = go["metadata"].clone();
        if let Some(m) = go_meta.as_object_mut() {
            m.remove("managedFields");
        }
        diff(
            &mut p,
            &ctx,
            "metadata keys",
            &json!(keys_of(&wo["metadata"])),
            &json!(keys_of(&go_meta)),
        );
        diff(
            &mut p,
            &ctx,
            "spec keys",
            &json!(keys_of(&wo["spec"])),
            &json!(keys_of(&go["spec"])),
        );
        diff(
            &mut p,
            &ctx,
            "status keys",
            &json!(keys_of(&wo["status"])),
            &json!(keys_of(&go["status"])),
        );
        for k in ["pkixPublicKey", "proofOfPossession"] {
            diff(&mut p, &ctx, k, &wo["spec"][k], &go["spec"][k]);
        }
        let rv: u64 = go["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if rv <= last_rv {
            p.push(format!("{ctx}: resourceVersion {rv} not increasing"));
        }
        last_rv = rv;
    }

    // watch-too-old-resource-version
    let o = by_id("watch-too-old-resource-version");
    let mut w = signer
        .watch(o["request"]["path"].as_str().expect("path"))
        .await
        .expect("watch");
    diff(
        &mut p,
        "too-old watch",
        "code",
        &o["expect"]["code"],
        &json!(w.status),
    );
    diff(
        &mut p,
        "too-old watch",
        "content type",
        &o["expect"]["content_type"],
        &json!(w.header("content-type")),
    );
    match w.next_event(std::time::Duration::from_secs(10)).await {
        Ok(Some(ev)) => {
            let want = &o["expect"]["first_event"];
            diff(&mut p, "too-old watch", "type", &want["type"], &ev["type"]);
            let mut got_obj = ev["object"].clone();
            let msg = got_obj["message"].as_str().unwrap_or("").to_string();
            let ok = msg.starts_with("too old resource version: 1 (")
                && msg.ends_with(')')
                && msg["too old resource version: 1 (".len()..msg.len() - 1]
                    .bytes()
                    .all(|b| b.is_ascii_digit());
            if !ok {
                p.push(format!("too-old watch: message {msg:?}"));
            }
            got_obj["message"] = want["object"]["message"].clone();
            diff(&mut p, "too-old watch", "object", &want["object"], &got_obj);
        }
        other => p.push(format!("too-old watch: no first event: {other:?}")),
    }

    // list-too-old-resource-version-exact
    let o = by_id("list-too-old-resource-version-exact");
    let r = signer
        .get(o["request"]["path"].as_str().expect("path"))
        .await
        .expect("list");
    diff(
        &mut p,
        "exact list",
        "code",
        &o["expect"]["code"],
        &json!(r.status),
    );
    diff(
        &mut p,
        "exact list",
        "body",
        &o["expect"]["body"],
        &r.json(),
    );

    // list-too-old-resource-version-not-older-than
    let o = by_id("list-too-old-resource-version-not-older-than");
    let r = signer
        .get(o["request"]["path"].as_str().expect("path"))
        .await
        .expect("list");
    let l = r.json();
    diff(
        &mut p,
        "not-older-than list",
        "code",
        &o["expect"]["code"],
        &json!(r.status),
    );
    diff(
        &mut p,
        "not-older-than list",
        "kind",
        &o["expect"]["kind"],
        &l["kind"],
    );
    diff(
        &mut p,
        "not-older-than list",
        "item count",
        &o["expect"]["item_count_at_recording"],
        &json!(l["items"].as_array().map_or(0, Vec::len)),
    );
    diff(
        &mut p,
        "not-older-than list",
        "metadata keys",
        &json!(keys_of(&o["expect"]["metadata"])),
        &json!(keys_of(&l["metadata"])),
    );

    assert!(p.is_empty(), "{} mismatches:\n{}", p.len(), p.join("\n"));
}
