//! HTTP behaviour of the emulator not covered by the recorded vectors:
//! discovery, version modes, watch resumption and 410, bookmarks,
//! selectors, the cleaner, fault knobs, leases, TokenReview, the kubelet
//! simulator end to end, and a burst.

use podca_tests::client::KubeClient;
use podca_tests::emulator::{
    ApiMode, CleanerConfig, Emulator, EmulatorConfig, FaultScope, PodFixture, Res,
    ServiceAccountToken,
};
use podca_tests::kubelet::{KeyType, KubeletSim, Outcome, PodRef, RequestOptions, SubjectKey};
use podca_tests::testca::{TestCa, deny_patch};
use serde_json::{Value, json};
use std::time::Duration;
use time::OffsetDateTime;

const SIGNER: &str = "example.com/my-signer";
const NS: &str = "app";
const T: Duration = Duration::from_secs(10);

struct Env {
    emu: Emulator,
    admin: KubeClient,
    signer: KubeClient,
    kubelet: KubeletSim,
    pod: PodRef,
    version: &'static str,
}

async fn env_with(mode: ApiMode, cleaner: CleanerConfig) -> Env {
    let emu = Emulator::start(EmulatorConfig {
        api_mode: mode,
        cleaner,
        bookmark_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .expect("emulator");
    let node_uid = emu.add_node("node-1");
    let sa_uid = emu.add_service_account(NS, "app");
    let pod_uid = emu.add_pod(&PodFixture {
        namespace: NS.into(),
        name: "app-0".into(),
        node_name: "node-1".into(),
        service_account: "app".into(),
        pod_certificates: vec![(SIGNER.into(), "ECDSAP256".into())],
        ..Default::default()
    });
    let node_token = emu.add_node_identity("node-1");
    let signer_token = emu.add_identity(
        "signer",
        "system:serviceaccount:podca:podca",
        &["system:serviceaccounts"],
    );
    emu.grant_signer_role("system:serviceaccount:podca:podca", SIGNER);
    let version = mode.cert_versions()[0];
    let admin = KubeClient::new(emu.base_url(), &emu.admin_token());
    let signer = KubeClient::new(emu.base_url(), &signer_token);
    let kubelet = KubeletSim::new(
        emu.base_url(),
        &node_token,
        if mode == ApiMode::V1AndV1Beta1 {
            "v1beta1"
        } else {
            version
        },
    );
    let pod = PodRef {
        namespace: NS.into(),
        name: "app-0".into(),
        uid: pod_uid,
        service_account: "app".into(),
        service_account_uid: sa_uid,
        node_name: "node-1".into(),
        node_uid,
    };
    Env {
        emu,
        admin,
        signer,
        kubelet,
        pod,
        version,
    }
}

async fn env(mode: ApiMode) -> Env {
    env_with(
        mode,
        CleanerConfig {
            enabled: false,
            ..Default::default()
        },
    )
    .await
}

fn pcrs(version: &str, ns: Option<&str>) -> String {
    match ns {
        Some(ns) => {
            format!("/apis/certificates.k8s.io/{version}/namespaces/{ns}/podcertificaterequests")
        }
        None => format!("/apis/certificates.k8s.io/{version}/podcertificaterequests"),
    }
}

/// The kubelet files an Ed25519 request for the test pod; its name.
async fn file_ed25519(e: &Env) -> String {
    e.kubelet
        .request(&e.pod, &RequestOptions::new(SIGNER, KeyType::Ed25519), None)
        .await
        .expect("the request is filed")
        .name
}

/// The signer's watch of every PodCertificateRequest from resourceVersion `rv`.
async fn watch_from(e: &Env, rv: impl std::fmt::Display) -> podca_tests::client::WatchStream {
    e.signer
        .watch(&format!(
            "{}?watch=1&resourceVersion={rv}",
            pcrs(e.version, None)
        ))
        .await
        .expect("a watch answer")
}

/// A list page of two PodCertificateRequests as the signer sees it: the first (`cont` None) or
/// the one after a continue token; the raw answer (status and body).
async fn page_of_two(e: &Env, cont: Option<&str>) -> podca_tests::client::HttpResponse {
    let cont = cont.map_or(String::new(), |c| format!("&continue={c}"));
    e.signer
        .get(&format!("{}?limit=2{cont}", pcrs(e.version, None)))
        .await
        .expect("a list answer")
}

async fn issue(e: &Env, name: &str, key: &SubjectKey, ca: &TestCa) -> (u16, Value) {
    let patch = ca.issue_patch(key, e.emu.now(), 86400).expect("patch");
    let r = e
        .signer
        .merge_patch(
            &format!("{}/{name}/status", pcrs(e.version, Some(NS))),
            &patch,
        )
        .await
        .expect("patch");
    (r.status, r.json())
}

#[tokio::test]
async fn discovery_lists_served_versions_and_status_subresource() {
    for (mode, versions) in [
        (ApiMode::V1Only, vec!["v1"]),
        (ApiMode::V1Beta1, vec!["v1beta1"]),
        (ApiMode::V1Beta1Legacy, vec!["v1beta1"]),
        (ApiMode::V1AndV1Beta1, vec!["v1", "v1beta1"]),
    ] {
        let e = env(mode).await;
        let g = e
            .admin
            .get("/apis/certificates.k8s.io")
            .await
            .unwrap()
            .json();
        let got: Vec<&str> = g["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["version"].as_str().unwrap())
            .collect();
        assert_eq!(got, versions, "{mode:?}");
        assert_eq!(g["preferredVersion"]["version"], versions[0]);
        for v in &versions {
            let l = e
                .admin
                .get(&format!("/apis/certificates.k8s.io/{v}"))
                .await
                .unwrap()
                .json();
            let names: Vec<&str> = l["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["name"].as_str().unwrap())
                .collect();
            assert!(
                names.contains(&"podcertificaterequests/status"),
                "{names:?}"
            );
            assert!(names.contains(&"clustertrustbundles"));
        }
        for v in ["v1", "v1beta1"] {
            let r = e.admin.get(&pcrs(v, None)).await.unwrap();
            assert_eq!(r.status == 200, versions.contains(&v), "{mode:?} {v}");
        }
        assert_eq!(e.admin.get("/version").await.unwrap().status, 200);
        let apis = e.admin.get("/apis").await.unwrap().json();
        assert!(
            apis["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "coordination.k8s.io")
        );
    }
}

#[tokio::test]
async fn kubelet_gets_a_verified_credential_for_every_key_type() {
    let e = env(ApiMode::V1Beta1).await;
    let ca = TestCa::new("test root").unwrap();
    for kt in KeyType::ALL {
        let p = e
            .kubelet
            .request(&e.pod, &RequestOptions::new(SIGNER, kt), None)
            .await
            .unwrap_or_else(|err| panic!("{kt:?}: {err}"));
        let (code, body) = issue(&e, &p.name, &p.key, &ca).await;
        assert_eq!(code, 200, "{kt:?}: {body}");
        let Outcome::Issued(cred) = e.kubelet.wait(&p, T).await.unwrap() else {
            panic!("{kt:?} not issued");
        };
        cred.check_leaf_key().unwrap();
        cred.verify_chain(&ca.cert_pem, e.emu.now()).unwrap();
        assert!(
            cred.credential_bundle()
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
        assert!(!cred.refresh_due(e.emu.now()));
        assert!(cred.refresh_due(cred.begin_refresh_at));
        // A chain from another CA does not verify.
        let other = TestCa::new("other").unwrap();
        let refused = cred
            .verify_chain(&other.cert_pem, e.emu.now())
            .expect_err("a chain from another CA");
        assert_eq!(
            refused.0,
            "certificate 0 is signed by neither the next certificate nor a trust anchor"
        );
    }
    let c = e.emu.counters();
    assert_eq!(c.validation_rejections, 0, "{c:?}");
    assert_eq!(c.issued, 6);
}

#[tokio::test]
async fn a_leaf_for_another_key_is_rejected_and_counted() {
    let e = env(ApiMode::V1Beta1).await;
    let ca = TestCa::new("root").unwrap();
    let p = e
        .kubelet
        .request(
            &e.pod,
            &RequestOptions::new(SIGNER, KeyType::EcdsaP256),
            None,
        )
        .await
        .unwrap();
    let other = SubjectKey::generate(KeyType::EcdsaP256).unwrap();
    let (code, body) = issue(&e, &p.name, &other, &ca).await;
    assert_eq!(code, 422);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("leaf certificate was not issued to the requested public key")
    );
    let c = e.emu.counters();
    assert_eq!(c.validation_rejections, 1);
    assert_eq!(
        c.rejections_by_cause
            .get("PodCertificateRequest status.certificateChain FieldValueInvalid"),
        Some(&1)
    );
    // Denied works and is terminal.
    let r = e
        .signer
        .merge_patch(
            &format!("{}/{}/status", pcrs(e.version, Some(NS)), p.name),
            &deny_patch("UnsupportedKeyType", "no", e.emu.now()),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    match e.kubelet.wait(&p, T).await.unwrap() {
        Outcome::Denied { reason, .. } => assert_eq!(reason, "UnsupportedKeyType"),
        o => panic!("{o:?}"),
    }
}

#[tokio::test]
async fn legacy_pkix_requests_are_accepted_and_readable_through_v1_with_an_empty_stub() {
    let e = env(ApiMode::V1AndV1Beta1).await;
    for kt in [
        KeyType::EcdsaP256,
        KeyType::Ed25519,
        KeyType::Rsa3072,
        KeyType::EcdsaP521,
    ] {
        let mut o = RequestOptions::new(SIGNER, kt);
        o.legacy = true;
        let p = e
            .kubelet
            .request(&e.pod, &o, None)
            .await
            .unwrap_or_else(|err| panic!("{kt:?}: {err}"));
        let v1 = e
            .admin
            .get(&format!("{}/{}", pcrs("v1", Some(NS)), p.name))
            .await
            .unwrap()
            .json();
        assert_eq!(v1["apiVersion"], "certificates.k8s.io/v1");
        assert!(v1["spec"]["stubPKCS10Request"].is_null(), "{kt:?}");
        assert!(v1["spec"].get("pkixPublicKey").is_none());
        let b1 = e
            .admin
            .get(&format!("{}/{}", pcrs("v1beta1", Some(NS)), p.name))
            .await
            .unwrap()
            .json();
        assert!(b1["spec"]["pkixPublicKey"].is_string());
    }
    // A bad proof of possession is rejected.
    let key = SubjectKey::generate(KeyType::EcdsaP256).unwrap();
    let mut o = RequestOptions::new(SIGNER, KeyType::EcdsaP256);
    o.legacy = true;
    let mut pod = e.pod.clone();
    pod.uid = "wrong".into();
    let err = e.kubelet.request(&pod, &o, Some(key)).await.unwrap_err();
    assert!(err.0.contains("500"), "{err}");
}

#[tokio::test]
async fn v1_requires_the_stub_and_v1beta1_legacy_mode_has_no_stub_field() {
    let e = env(ApiMode::V1Only).await;
    let mut o = RequestOptions::new(SIGNER, KeyType::EcdsaP256);
    let p = e.kubelet.request(&e.pod, &o, None).await.unwrap();
    assert!(!p.name.is_empty());
    o.legacy = true;
    let err = e.kubelet.request(&e.pod, &o, None).await.unwrap_err();
    assert!(
        err.0.contains("spec.stubPKCS10Request: Required value"),
        "{err}"
    );

    let e = env(ApiMode::V1Beta1Legacy).await;
    let o = RequestOptions::new(SIGNER, KeyType::EcdsaP256);
    let err = e.kubelet.request(&e.pod, &o, None).await.unwrap_err();
    assert!(err.0.contains("spec.pkixPublicKey"), "{err}");
    let mut o = RequestOptions::new(SIGNER, KeyType::EcdsaP256);
    o.legacy = true;
    let p = e.kubelet.request(&e.pod, &o, None).await.unwrap();
    let v = e
        .admin
        .get(&format!("{}/{}", pcrs("v1beta1", Some(NS)), p.name))
        .await
        .unwrap()
        .json();
    assert!(v["spec"].get("stubPKCS10Request").is_none());
    // And it can be issued.
    let ca = TestCa::new("root").unwrap();
    let (code, body) = issue(&e, &p.name, &p.key, &ca).await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_and_410s_when_too_old() {
    let e = env(ApiMode::V1Beta1).await;
    let list = e
        .signer
        .get(&format!(
            "{}?fieldSelector=spec.signerName%3D{}",
            pcrs(e.version, None),
            SIGNER.replace('/', "%2F")
        ))
        .await
        .unwrap()
        .json();
    assert_eq!(list["kind"], "PodCertificateRequestList");
    let rv0: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut names = Vec::new();
    for _ in 0..3 {
        let p = e
            .kubelet
            .request(
                &e.pod,
                &RequestOptions::new(SIGNER, KeyType::EcdsaP256),
                None,
            )
            .await
            .unwrap();
        names.push(p.name);
    }
    // Watch from rv0 sees all three.
    let mut w = watch_from(&e, rv0).await;
    assert_eq!(w.status, 200);
    assert_eq!(w.header("content-type"), Some("application/json"));
    let mut got = Vec::new();
    for _ in 0..3 {
        let ev = w.next_event(T).await.unwrap().unwrap();
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["kind"], "PodCertificateRequest");
        got.push(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(got, names);
    // From the second object's rv: only the third.
    let second = e.emu.get_object(Res::Pcr, NS, &names[1]).unwrap();
    let rv1 = second["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w2 = watch_from(&e, &rv1).await;
    let ev = w2.next_event(T).await.unwrap().unwrap();
    assert_eq!(ev["object"]["metadata"]["name"], names[2].as_str());
    // Live events keep coming: a delete.
    let r = e
        .admin
        .delete(&format!("{}/{}", pcrs(e.version, Some(NS)), names[0]))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let ev = w.next_event(T).await.unwrap().unwrap();
    assert_eq!(ev["type"], "DELETED");
    // Too old: the recorded shape.
    let mut old = e
        .signer
        .watch(&format!(
            "{}?watch=1&resourceVersion=1",
            pcrs(e.version, None)
        ))
        .await
        .unwrap();
    assert_eq!(old.status, 200);
    let ev = old.next_event(T).await.unwrap().unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert!(
        ev["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version: 1 (")
    );
    let l = e
        .signer
        .get(&format!(
            "{}?resourceVersion=1&resourceVersionMatch=Exact",
            pcrs(e.version, None)
        ))
        .await
        .unwrap();
    assert_eq!(l.status, 410);
    assert_eq!(
        l.json()["message"],
        "The resourceVersion for the provided list is too old."
    );
    // A restart compacts everything: the rv we resumed from is now too old,
    // and open watches end.
    e.emu.restart();
    assert!(
        w.next_event(T).await.unwrap().is_none(),
        "restart ends open watches"
    );
    let mut w3 = watch_from(&e, &rv1).await;
    assert_eq!(
        w3.next_event(T).await.unwrap().unwrap()["object"]["code"],
        410
    );
}

#[tokio::test]
async fn bookmarks_initial_events_and_list_paging() {
    let e = env(ApiMode::V1Beta1).await;
    for _ in 0..3 {
        file_ed25519(&e).await;
    }
    let mut w = e.signer.watch(&format!("{}?watch=1&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", pcrs(e.version, None))).await.unwrap();
    let evs = w.until(T, |ev| ev["type"] == "BOOKMARK").await.unwrap();
    assert_eq!(evs.len(), 4);
    let bm = evs.last().unwrap();
    assert_eq!(
        bm["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let next = w.next_event(T).await.unwrap().unwrap();
    assert_eq!(next["type"], "BOOKMARK", "periodic bookmarks");
    // limit/continue
    let p1 = page_of_two(&e, None).await.json();
    assert_eq!(p1["items"].as_array().unwrap().len(), 2);
    assert!(
        p1["items"][0].get("kind").is_none(),
        "list items carry no kind"
    );
    let cont = p1["metadata"]["continue"].as_str().unwrap();
    let p2 = page_of_two(&e, Some(cont)).await.json();
    assert_eq!(p2["items"].as_array().unwrap().len(), 1);
    assert!(p2["metadata"].get("continue").is_none());
    let nolimit = e.signer.get(&pcrs(e.version, None)).await.unwrap().json();
    assert_eq!(
        nolimit["metadata"].as_object().unwrap().len(),
        1,
        "only resourceVersion without limit"
    );
}

/// Every page of a paginated list is read at the first page's resourceVersion, as
/// kube-apiserver reads it from etcd at that revision: what is created or deleted between pages
/// is not in them, the list reports the first page's resourceVersion, and a watch from it
/// delivers those changes. (Reading later pages live, and reporting the newest resourceVersion,
/// lost the ADDED events of objects created meanwhile with keys before the cursor: a controller
/// relisting during a burst never saw them.)
#[tokio::test]
async fn a_paginated_list_is_one_snapshot_and_a_watch_from_it_misses_nothing() {
    let e = env(ApiMode::V1Beta1).await;
    for _ in 0..3 {
        file_ed25519(&e).await;
    }
    let name = |o: &Value| o["metadata"]["name"].as_str().unwrap().to_string();
    let p1 = page_of_two(&e, None).await.json();
    let rv = p1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let cont = p1["metadata"]["continue"].as_str().unwrap().to_string();
    let first: Vec<String> = p1["items"].as_array().unwrap().iter().map(name).collect();
    let all: Vec<String> = e.signer.get(&pcrs(e.version, None)).await.unwrap().json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(name)
        .collect();
    let third = all.iter().find(|n| !first.contains(n)).unwrap().clone();
    // Between the pages: a new request (its key may sort before or after the cursor) and the
    // deletion of the one the second page holds.
    let created = file_ed25519(&e).await;
    let r = e
        .admin
        .delete(&format!("{}/{third}", pcrs(e.version, Some(NS))))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let p2 = page_of_two(&e, Some(&cont)).await.json();
    let second: Vec<String> = p2["items"].as_array().unwrap().iter().map(name).collect();
    assert_eq!(
        second,
        std::slice::from_ref(&third),
        "the page as of the first page's revision"
    );
    assert_eq!(p2["metadata"]["resourceVersion"], rv.as_str());
    assert!(p2["metadata"].get("continue").is_none());
    let mut w = watch_from(&e, &rv).await;
    let added = w.next_event(T).await.unwrap().unwrap();
    assert_eq!(
        (added["type"].as_str(), name(&added["object"])),
        (Some("ADDED"), created)
    );
    let deleted = w.next_event(T).await.unwrap().unwrap();
    assert_eq!(
        (deleted["type"].as_str(), name(&deleted["object"])),
        (Some("DELETED"), third)
    );
    // A token whose revision is compacted away: 410, as kube-apiserver answers.
    e.emu.restart();
    let late = page_of_two(&e, Some(&cont)).await;
    assert_eq!(late.status, 410);
    assert_eq!(late.json()["reason"], "Expired");
    assert!(
        late.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("The provided continue parameter is too old"),
        "{}",
        late.json()
    );
}

#[tokio::test]
async fn field_and_label_selectors() {
    let e = env(ApiMode::V1Beta1).await;
    let p = e
        .kubelet
        .request(
            &e.pod,
            &RequestOptions::new(SIGNER, KeyType::EcdsaP256),
            None,
        )
        .await
        .unwrap();
    let q = |sel: &str| format!("{}?fieldSelector={sel}", pcrs(e.version, None));
    let count = |v: Value| v["items"].as_array().unwrap().len();
    assert_eq!(
        count(
            e.signer
                .get(&q("spec.signerName%3Dexample.com%2Fmy-signer"))
                .await
                .unwrap()
                .json()
        ),
        1
    );
    assert_eq!(
        count(
            e.signer
                .get(&q("spec.signerName%3Dexample.com%2Fother"))
                .await
                .unwrap()
                .json()
        ),
        0
    );
    assert_eq!(
        count(
            e.signer
                .get(&q("spec.nodeName%3Dnode-1,spec.podName%3Dapp-0"))
                .await
                .unwrap()
                .json()
        ),
        1
    );
    assert_eq!(
        count(
            e.signer
                .get(&q(&format!("metadata.name%3D{}", p.name)))
                .await
                .unwrap()
                .json()
        ),
        1
    );
    assert_eq!(
        count(
            e.signer
                .get(&q("metadata.namespace%21%3Dapp"))
                .await
                .unwrap()
                .json()
        ),
        0
    );
    let bad = e.signer.get(&q("spec.podUID%3Dx")).await.unwrap();
    assert_eq!(bad.status, 400);
    // Label selectors on CTBs.
    let ca = TestCa::new("root").unwrap();
    for (name, label) in [
        ("example.com:my-signer:live", "live"),
        ("example.com:my-signer:canary", "canary"),
    ] {
        let r = e
            .signer
            .post(
                &format!(
                    "/apis/certificates.k8s.io/{}/clustertrustbundles",
                    e.version
                ),
                &json!({
                    "metadata": {"name": name, "labels": {"track": label}},
                    "spec": {"signerName": SIGNER, "trustBundle": ca.cert_pem},
                }),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 201, "{}", r.json());
    }
    let l = e
        .signer
        .get(&format!(
            "/apis/certificates.k8s.io/{}/clustertrustbundles?labelSelector=track%3Dlive",
            e.version
        ))
        .await
        .unwrap()
        .json();
    assert_eq!(count(l), 1);
    let anchors = podca_tests::kubelet::trust_anchors_for_signer(&e.signer, e.version, SIGNER)
        .await
        .unwrap();
    assert_eq!(anchors, ca.cert_pem, "identical anchors are de-duplicated");
}

#[tokio::test]
async fn the_cleaner_deletes_old_pcrs() {
    let e = env(ApiMode::V1Beta1).await;
    e.emu.set_time(OffsetDateTime::now_utc());
    let p = e
        .kubelet
        .request(
            &e.pod,
            &RequestOptions::new(SIGNER, KeyType::EcdsaP256),
            None,
        )
        .await
        .unwrap();
    let mut w = watch_from(&e, e.emu.resource_version()).await;
    e.emu.advance_clock(Duration::from_secs(14 * 60));
    assert_eq!(e.emu.run_cleaner_now(), 0);
    e.emu.advance_clock(Duration::from_secs(2 * 60));
    assert_eq!(e.emu.run_cleaner_now(), 1);
    let ev = w.next_event(T).await.unwrap().unwrap();
    assert_eq!(ev["type"], "DELETED");
    assert_eq!(ev["object"]["metadata"]["name"], p.name.as_str());
    let gone = e
        .kubelet
        .wait(&p, T)
        .await
        .expect_err("kubelet sees the PCR gone");
    assert_eq!(
        gone.0,
        format!("PCR {} was deleted before an answer", p.name)
    );
    assert_eq!(e.emu.counters().cleaner_deleted, 1);

    // The periodic cleaner.
    let e = env_with(
        ApiMode::V1Beta1,
        CleanerConfig {
            enabled: true,
            max_age: Duration::from_millis(200),
            period: Duration::from_millis(50),
        },
    )
    .await;
    e.kubelet
        .request(
            &e.pod,
            &RequestOptions::new(SIGNER, KeyType::EcdsaP256),
            None,
        )
        .await
        .unwrap();
    // The cleaner deletes it once older than max_age (200 ms), on one of its 50 ms rounds.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while e.emu.count_objects(Res::Pcr) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the cleaner never deleted the PCR"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(e.emu.counters().cleaner_deleted, 1);
}

#[tokio::test]
async fn fault_knobs() {
    let e = env(ApiMode::V1Beta1).await;
    let ca = TestCa::new("root").unwrap();
    let p = e
        .kubelet
        .request(
            &e.pod,
            &RequestOptions::new(SIGNER, KeyType::EcdsaP256),
            None,
        )
        .await
        .unwrap();
    e.emu.inject_errors(429, 2, FaultScope::StatusWrites);
    for _ in 0..2 {
        let patch = ca.issue_patch(&p.key, e.emu.now(), 3600).unwrap();
        let r = e
            .signer
            .merge_patch(
                &format!("{}/{}/status", pcrs(e.version, Some(NS)), p.name),
                &patch,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 429);
        assert_eq!(r.header("retry-after"), Some("1"));
        // Reads are not affected.
        assert_eq!(
            e.signer
                .get(&format!("{}/{}", pcrs(e.version, Some(NS)), p.name))
                .await
                .unwrap()
                .status,
            200
        );
    }
    let (code, _) = issue(&e, &p.name, &p.key, &ca).await;
    assert_eq!(code, 200);
    assert_eq!(e.emu.counters().injected_faults, 2);

    e.emu.inject_errors(
        500,
        1,
        FaultScope::PathContains("/clustertrustbundles".into()),
    );
    assert_eq!(
        e.signer
            .get(&format!(
                "/apis/certificates.k8s.io/{}/clustertrustbundles",
                e.version
            ))
            .await
            .unwrap()
            .status,
        500
    );
    e.emu.inject_errors(409, 1, FaultScope::Writes);
    let r = e
        .admin
        .merge_patch(
            &format!("{}/{}", pcrs(e.version, Some(NS)), p.name),
            &json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 409);

    // drop_watches ends streams.
    let mut w = e
        .signer
        .watch(&format!("{}?watch=1", pcrs(e.version, None)))
        .await
        .unwrap();
    assert_eq!(w.next_event(T).await.unwrap().unwrap()["type"], "ADDED");
    e.emu.drop_watches();
    assert!(w.next_event(T).await.unwrap().is_none());

    // Latency and hangs.
    e.emu.set_latency(Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    e.signer.get("/version").await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(200));
    e.emu.clear_faults();
    e.emu
        .hang_requests(Duration::from_secs(3), 1, FaultScope::Reads);
    let hung = tokio::time::timeout(Duration::from_millis(500), e.signer.get("/version")).await;
    assert!(hung.is_err(), "the request hangs");
    let t0 = std::time::Instant::now();
    e.signer.get("/version").await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "only one request hangs"
    );
}

#[tokio::test]
async fn leases_use_optimistic_concurrency() {
    let e = env(ApiMode::V1Beta1).await;
    let base = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let r = e.signer.post(base, &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "podca"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})).await.unwrap();
    assert_eq!(r.status, 201, "{}", r.json());
    let rv = r.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let again = e
        .signer
        .post(base, &json!({"metadata": {"name": "podca"}, "spec": {}}))
        .await
        .unwrap();
    assert_eq!(again.status, 409);
    assert_eq!(again.json()["reason"], "AlreadyExists");
    let upd = |rv: &str, holder: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "podca", "resourceVersion": rv}, "spec": {"holderIdentity": holder}});
    let ok = e
        .signer
        .put(&format!("{base}/podca"), &upd(&rv, "b"))
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
    let stale = e
        .signer
        .put(&format!("{base}/podca"), &upd(&rv, "c"))
        .await
        .unwrap();
    assert_eq!(stale.status, 409);
    assert_eq!(stale.json()["reason"], "Conflict");
    let norv = e
        .signer
        .put(
            &format!("{base}/podca"),
            &json!({"metadata": {"name": "podca"}, "spec": {"holderIdentity": "d"}}),
        )
        .await
        .unwrap();
    assert_eq!(norv.status, 422);
    let got = e.signer.get(&format!("{base}/podca")).await.unwrap().json();
    assert_eq!(got["spec"]["holderIdentity"], "b");
    // A merge patch with a stale resourceVersion is a conflict too.
    let p = e
        .signer
        .merge_patch(
            &format!("{base}/podca"),
            &json!({"metadata": {"resourceVersion": rv}, "spec": {"holderIdentity": "e"}}),
        )
        .await
        .unwrap();
    assert_eq!(p.status, 409);
    // Server-side apply creates and updates.
    let apply = e.signer.request("PATCH", &format!("{base}/other?fieldManager=x"), Some("application/apply-patch+yaml"), b"apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: other\nspec:\n  holderIdentity: z\n".to_vec()).await.unwrap();
    assert_eq!(apply.status, 201, "{}", apply.json());
}

#[tokio::test]
async fn configmaps_are_validated_as_kube_apiserver_validates_them() {
    let e = env(ApiMode::V1Beta1).await;
    let base = "/api/v1/namespaces/default/configmaps";
    let cm = |name: &str, data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data});
    let bad_key = e
        .admin
        .post(base, &cm("c", json!({"a/b": "x"})))
        .await
        .unwrap();
    assert_eq!(bad_key.status, 422, "{}", bad_key.json());
    let message = bad_key.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with(
            "ConfigMap \"c\" is invalid: data[a/b]: Invalid value: \"a/b\": a valid config key"
        ),
        "{message}"
    );
    let big = e
        .admin
        .post(base, &cm("big", json!({"a": "x".repeat(1024 * 1024 + 1)})))
        .await
        .unwrap();
    assert_eq!(big.status, 422, "{}", big.json());
    let bad_name = e
        .admin
        .post(base, &cm("Bad_Name", json!({})))
        .await
        .unwrap();
    assert_eq!(bad_name.status, 422, "{}", bad_name.json());
    // Immutable: the data cannot change any more.
    let mut frozen = cm("frozen", json!({"k": "1"}));
    frozen["immutable"] = json!(true);
    let created = e.admin.post(base, &frozen).await.unwrap();
    assert_eq!(created.status, 201, "{}", created.json());
    let mut changed = created.json();
    changed["data"]["k"] = json!("2");
    let refused = e
        .admin
        .put(&format!("{base}/frozen"), &changed)
        .await
        .unwrap();
    assert_eq!(refused.status, 422, "{}", refused.json());
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .contains("data: Forbidden: field is immutable when `immutable` is set"),
        "{}",
        refused.json()
    );
}

#[tokio::test]
async fn token_review_outcomes() {
    let e = env(ApiMode::V1Beta1).await;
    let now = OffsetDateTime::now_utc();
    let tok = |aud: &str, expires: OffsetDateTime| ServiceAccountToken {
        namespace: NS.into(),
        service_account: "app".into(),
        service_account_uid: e.pod.service_account_uid.clone(),
        audiences: vec![aud.into()],
        expires,
        pod_name: Some("app-0".into()),
        pod_uid: Some(e.pod.uid.clone()),
        node_name: Some("node-1".into()),
        node_uid: Some(e.pod.node_uid.clone()),
        credential_id: "abc".into(),
    };
    let good = e
        .emu
        .add_service_account_token(tok("podca", now + time::Duration::hours(1)));
    let expired = e
        .emu
        .add_service_account_token(tok("podca", now - time::Duration::hours(1)));
    let review = |t: &str| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": t, "audiences": ["podca"]}});
    let path = "/apis/authentication.k8s.io/v1/tokenreviews";
    let r = e.signer.post(path, &review(&good)).await.unwrap();
    assert_eq!(r.status, 201);
    let s = &r.json()["status"];
    assert_eq!(s["authenticated"], true);
    assert_eq!(s["user"]["username"], "system:serviceaccount:app:app");
    assert_eq!(
        s["user"]["extra"]["authentication.kubernetes.io/pod-name"][0],
        "app-0"
    );
    assert_eq!(
        s["user"]["extra"]["authentication.kubernetes.io/pod-uid"][0],
        e.pod.uid.as_str()
    );
    assert_eq!(s["audiences"][0], "podca");
    for t in [expired.as_str(), "nonsense"] {
        let r = e.signer.post(path, &review(t)).await.unwrap().json();
        assert_eq!(r["status"]["authenticated"], false, "{t}");
    }
    let wrong_aud = e
        .signer
        .post(
            path,
            &json!({"spec": {"token": good, "audiences": ["other"]}}),
        )
        .await
        .unwrap()
        .json();
    assert_eq!(wrong_aud["status"]["authenticated"], false);
    // Without RBAC a user cannot review tokens.
    let nobody = e.emu.add_identity("nobody", "nobody", &[]);
    let r = KubeClient::new(e.emu.base_url(), &nobody)
        .post(path, &review(&good))
        .await
        .unwrap();
    assert_eq!(r.status, 403);
}

/// SubjectAccessReview as kube-rbac-proxy and podca's `/metrics` send it: the reviewer needs
/// `create` on `subjectaccessreviews`; the subject's non-resource grant decides.
#[tokio::test]
async fn subject_access_review_outcomes() {
    use podca_tests::emulator::{PolicyRule, Subject};
    let e = env(ApiMode::V1Beta1).await;
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let review = |user: &str, groups: &[&str], verb: &str, url: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups,
                "nonResourceAttributes": {"path": url, "verb": verb}}})
    };
    let prometheus = (
        "system:serviceaccount:monitoring:prometheus",
        [
            "system:serviceaccounts",
            "system:serviceaccounts:monitoring",
        ],
    );
    let ask = |body: Value| {
        let signer = &e.signer;
        async move { signer.post(path, &body).await.unwrap() }
    };
    let r = ask(review(prometheus.0, &prometheus.1, "get", "/metrics")).await;
    assert_eq!(r.status, 403, "no create on subjectaccessreviews yet");
    e.emu.grant(
        Subject::User("system:serviceaccount:podca:podca".into()),
        PolicyRule::new(
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
            &["create"],
        ),
    );
    let allowed = |body: Value| async move {
        let r = ask(body).await;
        assert_eq!(r.status, 201, "{:?}", r.json());
        r.json()["status"]["allowed"].as_bool().expect("allowed")
    };
    assert!(!allowed(review(prometheus.0, &prometheus.1, "get", "/metrics")).await);
    e.emu.grant(
        Subject::Group("system:serviceaccounts:monitoring".into()),
        PolicyRule::non_resource(&["/metrics"], &["get"]),
    );
    e.emu.grant(
        Subject::User("debugger".into()),
        PolicyRule::non_resource(&["/debug/*"], &["*"]),
    );
    assert!(allowed(review(prometheus.0, &prometheus.1, "get", "/metrics")).await);
    let cases = [
        (prometheus.0, &prometheus.1[..], "post", "/metrics", false),
        (prometheus.0, &prometheus.1[..], "get", "/metricsz", false),
        // The grant is the group's: the user name alone is not in it.
        (prometheus.0, &[][..], "get", "/metrics", false),
        (
            "system:serviceaccount:app:app",
            &["system:serviceaccounts"][..],
            "get",
            "/metrics",
            false,
        ),
        ("debugger", &[][..], "get", "/debug/pprof", true),
        ("debugger", &[][..], "get", "/metrics", false),
    ];
    for (user, groups, verb, url, want) in cases {
        assert_eq!(
            allowed(review(user, groups, verb, url)).await,
            want,
            "{user} {groups:?} {verb} {url}"
        );
    }
    // Resource attributes go through the same RBAC rules.
    let resource = json!({"spec": {"user": "system:serviceaccount:podca:podca",
        "resourceAttributes": {"verb": "create", "group": "authorization.k8s.io",
            "resource": "subjectaccessreviews"}}});
    assert!(allowed(resource).await);
    // Invalid reviews, as kube-apiserver refuses them.
    let neither = json!({"spec": {"user": "x"}});
    let nobody = json!({"spec": {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}});
    for body in [neither, nobody] {
        assert_eq!(ask(body.clone()).await.status, 422, "{body}");
    }
}

#[tokio::test]
async fn secrets_events_and_unauthenticated_requests() {
    let e = env(ApiMode::V1Beta1).await;
    e.emu.add_secret(
        NS,
        "ca",
        "kubernetes.io/tls",
        &[("tls.crt", b"x"), ("tls.key", b"y")],
    );
    let s = e
        .signer
        .get(&format!("/api/v1/namespaces/{NS}/secrets/ca"))
        .await
        .unwrap()
        .json();
    assert_eq!(s["data"]["tls.crt"], "eA==");
    let ev = e.signer.post(&format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"), &json!({"metadata": {"generateName": "pcr-"}, "reason": "Denied", "note": "x", "type": "Warning", "regarding": {"kind": "PodCertificateRequest", "name": "p"}})).await.unwrap();
    assert_eq!(ev.status, 201, "{}", ev.json());
    let l = e
        .admin
        .get(&format!(
            "/apis/events.k8s.io/v1/namespaces/{NS}/events?fieldSelector=reason%3DDenied"
        ))
        .await
        .unwrap()
        .json();
    assert_eq!(l["items"].as_array().unwrap().len(), 1);
    let anon = KubeClient::new(e.emu.base_url(), "bogus")
        .get("/api/v1/namespaces")
        .await
        .unwrap();
    assert_eq!(anon.status, 401);
    let forbidden = e
        .signer
        .delete(&format!("/api/v1/namespaces/{NS}/secrets/ca"))
        .await
        .unwrap();
    assert_eq!(forbidden.status, 403);
    assert_eq!(
        forbidden.json()["message"],
        format!(
            "secrets \"ca\" is forbidden: User \"system:serviceaccount:podca:podca\" cannot delete resource \"secrets\" in API group \"\" in the namespace \"{NS}\""
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pcrs_is_absorbed_with_bounded_history() {
    let emu = Emulator::start(EmulatorConfig {
        watch_history_limit: 500,
        cleaner: CleanerConfig {
            enabled: false,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .unwrap();
    let node_uid = emu.add_node("n");
    let sa_uid = emu.add_service_account(NS, "app");
    let pod_uid = emu.add_pod(&PodFixture {
        namespace: NS.into(),
        name: "p".into(),
        node_name: "n".into(),
        service_account: "app".into(),
        ..Default::default()
    });
    let token = emu.add_node_identity("n");
    let pod = PodRef {
        namespace: NS.into(),
        name: "p".into(),
        uid: pod_uid,
        service_account: "app".into(),
        service_account_uid: sa_uid,
        node_name: "n".into(),
        node_uid,
    };
    let admin = KubeClient::new(emu.base_url(), &emu.admin_token());
    let mut w = admin
        .watch(&format!(
            "{}?watch=1&resourceVersion={}",
            pcrs("v1beta1", None),
            emu.resource_version()
        ))
        .await
        .unwrap();
    let key = SubjectKey::generate(KeyType::EcdsaP256).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let k = KubeletSim::new(emu.base_url(), &token, "v1beta1");
        let pod = pod.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                k.request(
                    &pod,
                    &RequestOptions::new(SIGNER, KeyType::EcdsaP256),
                    Some(key.clone()),
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(emu.count_objects(Res::Pcr), 1000);
    let mut seen = 0;
    while seen < 1000 {
        let ev = w.next_event(T).await.unwrap().expect("watch stays open");
        assert_eq!(ev["type"], "ADDED");
        seen += 1;
    }
    // Only the last 500 events are kept: an early resourceVersion is gone.
    let mut old = admin
        .watch(&format!(
            "{}?watch=1&resourceVersion=1001",
            pcrs("v1beta1", None)
        ))
        .await
        .unwrap();
    assert_eq!(
        old.next_event(T).await.unwrap().unwrap()["object"]["code"],
        410
    );
    assert_eq!(emu.counters().pcr_created, 1000);
}

/// A watch line is `{"type":…,"object":…}` in that order, as kube-apiserver writes it (the
/// recorded watch vector): a client decoding into an adjacently tagged enum (kube's
/// `WatchEvent`) reads the object straight into its type only when the tag comes first. Every
/// watcher that renders an event alike gets the same bytes (serialized once); another version
/// renders its own.
#[tokio::test]
async fn watch_lines_put_the_type_first_and_watchers_share_one_rendering() {
    let e = env(ApiMode::V1AndV1Beta1).await;
    let rv = e.emu.resource_version();
    let mut first = watch_from(&e, rv).await;
    let mut second = watch_from(&e, rv).await;
    let mut beta = e
        .signer
        .watch(&format!(
            "{}?watch=1&resourceVersion={rv}",
            pcrs("v1beta1", None)
        ))
        .await
        .expect("a v1beta1 watch");
    let name = file_ed25519(&e).await;
    let a = first.next_line(T).await.unwrap().expect("an event");
    let b = second.next_line(T).await.unwrap().expect("an event");
    let c = beta.next_line(T).await.unwrap().expect("an event");
    for line in [&a, &c] {
        let text = String::from_utf8_lossy(line);
        assert!(
            text.starts_with(r#"{"type":"ADDED","object":{"#),
            "the type is not first: {text}"
        );
        let ev: Value = serde_json::from_slice(line).expect("one JSON object");
        assert_eq!(ev["object"]["metadata"]["name"], name.as_str());
    }
    assert_eq!(a, b, "two v1 watchers got different bytes for one event");
    let v1: Value = serde_json::from_slice(&a).unwrap();
    let v1beta1: Value = serde_json::from_slice(&c).unwrap();
    assert_eq!(v1["object"]["apiVersion"], "certificates.k8s.io/v1");
    assert_eq!(
        v1beta1["object"]["apiVersion"],
        "certificates.k8s.io/v1beta1"
    );
}
