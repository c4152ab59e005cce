//! The `kubernetes.io/service-ca` vocabulary (issue #42, item 3) over the API emulator: the
//! controller's lookups (`podca_controller::service_ca::look_up`) read the pod and Services
//! created there, through RBAC, and the signer's pure decision
//! (`podca_signer::names::service_ca::entitled`) gives the KEP's SANs or refuses with the
//! reason; end to end, `podca serve` with `[signers."…".service_ca]` issues those SANs (checked
//! with openssl, which verifies the chain for each name and IP) and denies the rest.

use std::collections::BTreeMap;
use std::net::IpAddr;

use podca_controller::service_ca::{ForRequest, LookupFailed, look_up};
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

/// The lookup of the pod `name` (UID `uid`, service account `web`) in [`NS`].
fn request<'a>(name: &'a str, uid: &'a str) -> ForRequest<'a> {
    ForRequest {
        namespace: NS,
        pod_name: name,
        pod_uid: uid,
        service_account: "web",
    }
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
    let (pod, services) = look_up(&client, request("web-0", &web), &want)
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
        let (pod, services) = look_up(&client, request(pod_name, uid), &want)
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
    let gone = look_up(&client, request("web-0", "another-uid"), &want)
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
    let failed = look_up(&client, request("web-0", &web), &want)
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

mod serve {
    //! `podca serve` with a signer that opts in to the vocabulary, against the emulator.

    use std::time::{Duration, Instant};

    use podca_tests::cluster::{Cluster, NewPcr, PODCA_USER};
    use podca_tests::emulator::services::{ServiceFixture, Serving};
    use podca_tests::emulator::{PodFixture, PolicyRule, Res, Subject};
    use podca_tests::process::ServeProcess;
    use podca_tests::verify::{openssl_verify, openssl_verify_with};
    use serde_json::json;

    use super::{NS, service, strings};

    const SIGNER: &str = "example.com/serving";
    /// A signer without `service_ca`: the vocabulary's keys are unknown annotations there.
    const PLAIN: &str = "example.com/plain";

    /// A PCR of `signer` in [`NS`] with `annotations`, and its pod (`pod-<name>`, running as
    /// `account`, labelled `app=<app>`, with `serving`'s IPs, hostname and subdomain).
    fn pcr<'a>(
        c: &Cluster,
        (name, signer): (&str, &'a str),
        (account, app): (&str, &str),
        serving: &Serving,
        annotations: &[(&str, &str)],
    ) -> NewPcr<'a> {
        let mut request = NewPcr::p256(name, signer);
        request.namespace = NS;
        request.annotations = Some(json!(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), json!(v)))
                .collect::<serde_json::Map<_, _>>()
        ));
        c.emu.add_serving_pod(
            &PodFixture {
                namespace: NS.into(),
                name: format!("pod-{name}"),
                node_name: "node-1".into(),
                service_account: account.into(),
                pod_certificates: vec![],
                uid: Some(request.pod_uid.clone()),
                mirror: false,
            },
            &Serving {
                labels: strings(&[("app", app)]),
                ..serving.clone()
            },
        );
        request
    }

    /// The first condition of `NS/name` once it has one: (type, reason, message, chain).
    async fn settled(c: &Cluster, name: &str) -> (String, String, String, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(o) = c.emu.get_object(Res::Pcr, NS, name)
                && let Some(cond) = o["status"]["conditions"].as_array().and_then(|c| c.first())
            {
                let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
                return (
                    s(&cond["type"]),
                    s(&cond["reason"]),
                    s(&cond["message"]),
                    s(&o["status"]["certificateChain"]),
                );
            }
            assert!(Instant::now() < deadline, "{NS}/{name} did not settle");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The leaf's subjectAltName as openssl prints it.
    fn openssl_sans(chain_pem: &str) -> String {
        let leaf = podca_tests::verify::pem_blocks(chain_pem).remove(0);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leaf.pem");
        std::fs::write(&path, leaf).expect("leaf");
        let out = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
            .arg(&path)
            .output()
            .expect("openssl");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn podca_serve_issues_the_keps_sans_and_denies_every_other_name() {
        let (c, ca_dir) = Cluster::for_serve(SIGNER, NS).await;
        c.emu.grant_signer_role(PODCA_USER, PLAIN);
        // What deploy/components/service-ca adds to podca's ClusterRole.
        c.emu.grant(
            Subject::User(PODCA_USER.into()),
            PolicyRule::new(&[""], &["pods", "services"], &["get"]),
        );
        c.emu
            .add_service(&service(NS, "web", "web", &["10.96.0.10", "fd00:96::10"]));
        c.emu.add_service(&service(NS, "web-hl", "web", &[]));
        c.emu.add_service(&service(NS, "db", "db", &["10.96.0.11"]));
        c.emu.add_service(&ServiceFixture {
            // Selects the web pods from another namespace: not the request's to name.
            namespace: "other".into(),
            ..service("other", "api", "web", &["10.96.0.13"])
        });
        let web = Serving {
            labels: vec![],
            pod_ips: vec!["10.0.0.7".into(), "fd00::7".into()],
            hostname: Some("web-0".into()),
            subdomain: Some("web-hl".into()),
        };
        let everything = [
            ("kubernetes.io/service-names", "web, web-hl"),
            ("kubernetes.io/add-pod-ips", "true"),
            ("kubernetes.io/add-pod-fqdn", "true"),
        ];
        let no_ips = Serving {
            pod_ips: vec![],
            ..web.clone()
        };
        let under_clusterip = Serving {
            subdomain: Some("web".into()),
            ..web.clone()
        };
        let cases: Vec<(NewPcr<'_>, &str, &str)> = vec![
            (
                pcr(&c, ("all", SIGNER), ("app", "web"), &web, &everything),
                "Issued",
                "",
            ),
            (
                pcr(
                    &c,
                    ("singular", SIGNER),
                    ("app", "web"),
                    &web,
                    &[("kubernetes.io/add-pod-ip", "true")],
                ),
                "Issued",
                "",
            ),
            (
                pcr(
                    &c,
                    ("unselected", SIGNER),
                    ("app", "web"),
                    &web,
                    &[("kubernetes.io/service-names", "web,db")],
                ),
                "NameNotEntitled",
                "kubernetes.io/service-names: Service shop/db does not select this pod (its \
                 selector does not match the pod's labels)",
            ),
            (
                pcr(
                    &c,
                    ("elsewhere", SIGNER),
                    ("app", "web"),
                    &web,
                    &[("kubernetes.io/service-names", "api")],
                ),
                "NameNotEntitled",
                "kubernetes.io/service-names: Service shop/api does not exist",
            ),
            (
                pcr(
                    &c,
                    ("qualified", SIGNER),
                    ("app", "web"),
                    &web,
                    &[("kubernetes.io/service-names", "other/api")],
                ),
                "InvalidUnverifiedUserAnnotations",
                "kubernetes.io/service-names: \"other/api\" names a Service in another \
                 namespace; only Services in the request's namespace can be named",
            ),
            (
                pcr(
                    &c,
                    ("no-hostname", SIGNER),
                    ("app", "web"),
                    &Serving {
                        hostname: None,
                        ..web.clone()
                    },
                    &[("kubernetes.io/add-pod-fqdn", "true")],
                ),
                "NameNotEntitled",
                "kubernetes.io/add-pod-fqdn: the pod has no spec.hostname",
            ),
            (
                pcr(
                    &c,
                    ("not-headless", SIGNER),
                    ("app", "web"),
                    &under_clusterip,
                    &[("kubernetes.io/add-pod-fqdn", "true")],
                ),
                "NameNotEntitled",
                "kubernetes.io/add-pod-fqdn: Service shop/web (spec.subdomain) is not \
                 headless, so no per-pod DNS name exists under it",
            ),
            (
                pcr(
                    &c,
                    ("no-ips", SIGNER),
                    ("app", "web"),
                    &no_ips,
                    &[("kubernetes.io/add-pod-ips", "true")],
                ),
                "NameNotEntitled",
                "kubernetes.io/add-pod-ips: the pod has no IPs in status.podIPs",
            ),
            (
                pcr(
                    &c,
                    ("not-a-flag", SIGNER),
                    ("app", "web"),
                    &web,
                    &[("kubernetes.io/add-pod-ips", "yes")],
                ),
                "InvalidUnverifiedUserAnnotations",
                "kubernetes.io/add-pod-ips: \"yes\" is neither \"true\" nor \"false\"",
            ),
            (
                // The pod runs as another account than the request names (only a node's
                // requests are cross-checked by the API server).
                pcr(
                    &c,
                    ("other-account", SIGNER),
                    ("db", "web"),
                    &web,
                    &[("kubernetes.io/add-pod-ips", "true")],
                ),
                "PolicyPodNotFound",
                "pod shop/pod-other-account does not run as service account app, which the \
                 request names",
            ),
            (
                pcr(
                    &c,
                    ("plain", PLAIN),
                    ("app", "web"),
                    &web,
                    &[("kubernetes.io/service-names", "web")],
                ),
                "InvalidUnverifiedUserAnnotations",
                "unrecognised user annotation \"kubernetes.io/service-names\"; this signer \
                 recognises only \"podca.dev/dns-names\"",
            ),
        ];
        let config = c.dir.path().join("podca.toml");
        std::fs::write(
            &config,
            format!(
                "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\
                 \n[signers.\"{SIGNER}\".service_ca]\ncluster_domain = \"cluster.local\"\n\n\
                 [signers.\"{PLAIN}\"]\ntrust_domain = \"plain.local\"\n\n\
                 [ledger]\nbackend = \"none\"\n",
                ca_dir.display().to_string()
            ),
        )
        .expect("config");
        let _serve = ServeProcess::start(&config, &c.kubeconfig, &["--no-grpc"], &[]);
        for (request, _, _) in &cases {
            request.file(&c.admin).await;
        }
        let anchors = std::fs::read_to_string(ca_dir.join("root.pem")).expect("root.pem");
        for (request, want, message) in &cases {
            let (ty, reason, said, chain) = settled(&c, &request.name).await;
            if *want == "Issued" {
                assert_eq!(ty, "Issued", "{}: {reason} {said}", request.name);
                openssl_verify(&chain, &anchors).unwrap_or_else(|e| panic!("{e}"));
            } else {
                assert_eq!(
                    (ty.as_str(), reason.as_str(), said.as_str()),
                    ("Denied", *want, *message),
                    "{}",
                    request.name
                );
            }
        }
        // The KEP's SANs, as openssl reads them, and a TLS client's name checks of each.
        let (_, _, _, all) = settled(&c, "all").await;
        assert_eq!(
            openssl_sans(&all),
            "URI:spiffe://cluster.local/ns/shop/sa/app, DNS:web.shop.svc, \
             DNS:web.shop.svc.cluster.local, DNS:web-hl.shop.svc, \
             DNS:web-hl.shop.svc.cluster.local, DNS:web-0.web-hl.shop.svc.cluster.local, \
             IP Address:10.96.0.10, IP Address:FD00:96:0:0:0:0:0:10, IP Address:10.0.0.7, \
             IP Address:FD00:0:0:0:0:0:0:7"
        );
        for (option, name) in [
            ("-verify_hostname", "web.shop.svc.cluster.local"),
            ("-verify_hostname", "web-0.web-hl.shop.svc.cluster.local"),
            ("-verify_ip", "10.96.0.10"),
            ("-verify_ip", "fd00::7"),
        ] {
            openssl_verify_with(&all, &anchors, &[option, name])
                .unwrap_or_else(|e| panic!("{option} {name}: {e}"));
        }
        // A name the pod was not entitled to is not in the certificate: openssl refuses it.
        for (option, name) in [
            ("-verify_hostname", "db.shop.svc"),
            ("-verify_ip", "10.96.0.11"),
        ] {
            assert!(
                openssl_verify_with(&all, &anchors, &[option, name]).is_err(),
                "{option} {name} must not verify"
            );
        }
        let (_, _, _, singular) = settled(&c, "singular").await;
        assert_eq!(
            openssl_sans(&singular),
            "URI:spiffe://cluster.local/ns/shop/sa/app, IP Address:10.0.0.7, \
             IP Address:FD00:0:0:0:0:0:0:7"
        );
    }
}
