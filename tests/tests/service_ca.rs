//! The `kubernetes.io/service-ca` vocabulary (issue #42, item 3) over the API emulator: the
//! controller's lookups (`podca_controller::service_ca::look_up`) read the pod and Services
//! created there, through RBAC, and the signer's pure decision
//! (`podca_signer::names::service_ca::entitled`) gives the KEP's SANs or refuses with the
//! reason. Not yet wired into `podca serve`'s PCR reconcile (see the issue).

use std::collections::BTreeMap;
use std::net::IpAddr;

use podca_controller::service_ca::{LookupFailed, look_up};
use podca_signer::names::service_ca::{Asked, Sans, entitled};
use podca_tests::emulator::services::{ServiceFixture, Serving};
use podca_tests::emulator::{PodFixture, PolicyRule, Subject};
use podca_tests::{Emulator, EmulatorConfig};

const NS: &str = "shop";
const USER: &str = "system:serviceaccount:podca:podca";

fn strings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn service(namespace: &str, name: &str, app: &str, ips: &[&str]) -> ServiceFixture {
    ServiceFixture {
        namespace: namespace.into(),
        name: name.into(),
        selector: if app.is_empty() {
            vec![]
        } else {
            strings(&[("app", app)])
        },
        cluster_ips: ips.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn pod(name: &str) -> PodFixture {
    PodFixture {
        namespace: NS.into(),
        name: name.into(),
        node_name: "node-1".into(),
        service_account: "web".into(),
        pod_certificates: vec![],
        uid: None,
        mirror: false,
    }
}

fn asked(pairs: &[(&str, &str)]) -> Asked {
    let annotations: BTreeMap<String, String> = strings(pairs).into_iter().collect();
    Asked::of(&annotations)
        .expect("well-formed annotations")
        .expect("a vocabulary key")
}

/// The emulator with a web pod (`app=web`, two IPs, hostname `web-0` under `web-hl`), a pod
/// without a hostname, and Services; a kubeconfig for the controller's identity, allowed `get`
/// on pods and Services (or only on pods). Returns the emulator (kept alive), the kubeconfig's
/// directory and the two pods' UIDs.
async fn cluster(services_allowed: bool) -> (Emulator, tempfile::TempDir, String, String) {
    let emu = Emulator::start(EmulatorConfig::default())
        .await
        .expect("emulator");
    emu.add_node("node-1");
    emu.add_service_account(NS, "web");
    let serving = Serving {
        labels: strings(&[("app", "web"), ("tier", "front")]),
        pod_ips: vec!["10.0.0.7".into(), "fd00::7".into()],
        hostname: Some("web-0".into()),
        subdomain: Some("web-hl".into()),
    };
    let web = emu.add_serving_pod(&pod("web-0"), &serving);
    let bare = emu.add_serving_pod(
        &pod("web-1"),
        &Serving {
            hostname: None,
            ..serving
        },
    );
    emu.add_service(&service(NS, "web", "web", &["10.96.0.10", "fd00:96::10"]));
    emu.add_service(&service(NS, "web-hl", "web", &[]));
    emu.add_service(&service(NS, "db", "db", &["10.96.0.11"]));
    emu.add_service(&service(NS, "manual", "", &["10.96.0.12"]));
    emu.add_service(&service("other", "api", "web", &["10.96.0.13"]));
    emu.add_identity("podca", USER, &[]);
    let resources: &[&str] = if services_allowed {
        &["pods", "services"]
    } else {
        &["pods"]
    };
    emu.grant(
        Subject::User(USER.into()),
        PolicyRule::new(&[""], resources, &["get"]),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    emu.write_kubeconfig(&dir.path().join("kubeconfig"), "podca")
        .expect("kubeconfig");
    (emu, dir, web, bare)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("a test IP")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keps_sans_for_a_pod_its_services_select() {
    let (_emu, dir, web, _) = cluster(true).await;
    let client = podca_controller::connect(Some(&dir.path().join("kubeconfig")))
        .await
        .expect("client");
    let want = asked(&[
        ("kubernetes.io/service-names", "web,web-hl"),
        ("kubernetes.io/add-pod-ips", "true"),
        ("kubernetes.io/add-pod-fqdn", "true"),
    ]);
    let (pod, services) = look_up(&client, NS, ("web-0", &web), &want)
        .await
        .expect("lookups");
    let sans = entitled(&want, NS, "cluster.local", &pod, &services).expect("entitled");
    assert_eq!(
        sans,
        Sans {
            dns_names: vec![
                "web.shop.svc".into(),
                "web.shop.svc.cluster.local".into(),
                "web-hl.shop.svc".into(),
                "web-hl.shop.svc.cluster.local".into(),
                "web-0.web-hl.shop.svc.cluster.local".into(),
            ],
            ip_addresses: vec![
                ip("10.96.0.10"),
                ip("fd00:96::10"),
                ip("10.0.0.7"),
                ip("fd00::7"),
            ],
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_san_the_pod_is_not_entitled_to_is_refused_with_its_reason() {
    let (_emu, dir, web, bare) = cluster(true).await;
    let client = podca_controller::connect(Some(&dir.path().join("kubeconfig")))
        .await
        .expect("client");
    for (pod_name, uid, pairs, reason) in [
        (
            "web-0",
            &web,
            vec![("kubernetes.io/service-names", "web,db")],
            "kubernetes.io/service-names: Service shop/db does not select this pod (its \
             selector does not match the pod's labels)",
        ),
        (
            "web-0",
            &web,
            vec![("kubernetes.io/service-names", "api")],
            "kubernetes.io/service-names: Service shop/api does not exist",
        ),
        (
            "web-0",
            &web,
            vec![("kubernetes.io/service-names", "nosuch")],
            "kubernetes.io/service-names: Service shop/nosuch does not exist",
        ),
        (
            "web-0",
            &web,
            vec![("kubernetes.io/service-names", "manual")],
            "kubernetes.io/service-names: Service shop/manual has no selector, so it selects \
             no pod",
        ),
        (
            "web-1",
            &bare,
            vec![("kubernetes.io/add-pod-fqdn", "true")],
            "kubernetes.io/add-pod-fqdn: the pod has no spec.hostname",
        ),
    ] {
        let want = asked(&pairs);
        let (pod, services) = look_up(&client, NS, (pod_name, uid), &want)
            .await
            .expect("lookups");
        let refused =
            entitled(&want, NS, "cluster.local", &pod, &services).expect_err("not entitled");
        assert_eq!(refused.0, reason, "{pairs:?}");
    }
    // A Service of another namespace cannot even be named.
    let annotations = BTreeMap::from([(
        "kubernetes.io/service-names".to_owned(),
        "other/api".to_owned(),
    )]);
    assert_eq!(
        Asked::of(&annotations).map_err(|e| e.0),
        Err(
            "kubernetes.io/service-names: \"other/api\" names a Service in another namespace; \
             only Services in the request's namespace can be named"
                .to_owned()
        )
    );
    // A request whose pod was replaced speaks for no pod.
    let want = asked(&[("kubernetes.io/add-pod-ips", "true")]);
    let gone = look_up(&client, NS, ("web-0", "another-uid"), &want)
        .await
        .expect_err("another UID");
    assert!(
        matches!(&gone, LookupFailed::PodGone(m) if m.contains("is not the pod of this request")),
        "{gone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_rbac_on_services_the_lookup_is_unavailable_not_a_denial() {
    let (_emu, dir, web, _) = cluster(false).await;
    let client = podca_controller::connect(Some(&dir.path().join("kubeconfig")))
        .await
        .expect("client");
    let want = asked(&[("kubernetes.io/service-names", "web")]);
    let failed = look_up(&client, NS, ("web-0", &web), &want)
        .await
        .expect_err("services get is not granted");
    match failed {
        LookupFailed::Unavailable { what, error } => {
            assert_eq!(what, "Service shop/web");
            assert!(
                error.contains("403") || error.contains("forbidden"),
                "{error}"
            );
        }
        other => panic!("want Unavailable, got {other:?}"),
    }
}
