//! Issue #39: every signer name is its own trust domain. Two signers, each with its own CA
//! (`[cas.<name>]`): a certificate of one verifies under its own signer's bundle and fails under
//! the other's, checked by openssl and by rustls-webpki, never by podca's own code; on every
//! path that issues (PodCertificateRequests, podca.v1, the Istio CA API) and for the gRPC
//! serving certificate.

// Test helpers: a failure should stop the test where it happens.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use podca_proto::istio::v1::auth::IstioCertificateRequest;
use podca_proto::podca::v1::{GetTrustBundleRequest, IssueCertificateRequest, IssueJwtSvidRequest};
use podca_tests::cluster::{Cluster, NewPcr};
use podca_tests::emulator::ApiMode;
use podca_tests::istio::{Ztunnel, ztunnel_csr};
use podca_tests::kubelet::trust_anchors_for_signer;
use podca_tests::process::{
    DevOptions, DevProcess, ServeProcess, csr_for, metric_value, podca_binary, podca_bundle,
};
use podca_tests::verify::{assert_verifies_only_under, der_to_pem};

const PAYMENTS: &str = "example.com/payments";
const BATCH: &str = "example.com/batch";

/// The two signers' tables, each naming its CA, and the two CA tables (`dirs`: payments', then
/// batch's; none: podca dev places them).
fn two_signers(dirs: Option<(&std::path::Path, &std::path::Path)>) -> String {
    let dir = |d: Option<&std::path::Path>| match d {
        Some(d) => format!("dir = {:?}\n", d.display().to_string()),
        None => String::new(),
    };
    format!(
        "[cas.payments]\n{}\n[cas.batch]\n{}\n\
         [signers.\"{PAYMENTS}\"]\ntrust_domain = \"payments.test\"\nca = \"payments\"\n\n\
         [signers.\"{BATCH}\"]\ntrust_domain = \"batch.test\"\nca = \"batch\"\n",
        dir(dirs.map(|d| d.0)),
        dir(dirs.map(|d| d.1)),
    )
}

/// `podca doctor --config config --kubeconfig kubeconfig`'s report, off the async runtime.
async fn doctor_report(config: &std::path::Path, kubeconfig: &std::path::Path) -> String {
    let (config, kubeconfig) = (config.to_owned(), kubeconfig.to_owned());
    let doctor = tokio::task::spawn_blocking(move || {
        Command::new(podca_binary())
            .args(["doctor", "--config"])
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("PODCA_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    String::from_utf8_lossy(&doctor.stdout).into_owned()
}

fn ca_init(dir: &std::path::Path, name: &str) {
    let status = Command::new(podca_binary())
        .args(["ca", "init", "--name", name, "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .expect("podca ca init");
    assert!(status.success());
}

/// PodCertificateRequests and ClusterTrustBundles through `podca serve`: each signer's
/// certificates come from its own CA, each signer's bundle holds its own CA's anchors only,
/// and the gRPC serving certificate comes from the `[grpc] signer`'s CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signers_with_their_own_cas_are_separate_trust_domains() {
    let c = Cluster::start(ApiMode::V1Only, &[PAYMENTS, BATCH]).await;
    let (payments_dir, batch_dir) = (c.dir.path().join("payments"), c.dir.path().join("batch"));
    ca_init(&payments_dir, "payments");
    ca_init(&batch_dir, "batch");
    let config = c.dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[grpc]\nsigner = \"{PAYMENTS}\"\n{}\n[ledger]\nbackend = \"none\"\n",
            two_signers(Some((&payments_dir, &batch_dir))),
            podca_tests::tls::GRPC_TLS_CONFIG,
        ),
    )
    .unwrap();
    let serve = ServeProcess::start(&config, &c.kubeconfig, &[], &[]);

    NewPcr::p256("pay", PAYMENTS).file(&c.admin).await;
    NewPcr::p256("batch", BATCH).file(&c.admin).await;
    let pay_chain = c.wait_issued("pay", Duration::from_secs(30)).await;
    let batch_chain = c.wait_issued("batch", Duration::from_secs(30)).await;

    // The bundles kubelet projects for each signer: exactly that signer's CA's anchors.
    let (payments_anchors, batch_anchors) = (podca_bundle(&payments_dir), podca_bundle(&batch_dir));
    let published = |signer: &'static str, want: String| {
        let admin = &c.admin;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let found = trust_anchors_for_signer(admin, "v1", signer).await.unwrap();
                if found == want {
                    return found;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{signer}'s bundles hold\n{found}\nnot only their CA's anchors\n{want}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let payments_bundle = published(PAYMENTS, payments_anchors).await;
    let batch_bundle = published(BATCH, batch_anchors).await;
    assert_ne!(payments_bundle, batch_bundle);

    assert_verifies_only_under(&pay_chain, &payments_bundle, &batch_bundle);
    assert_verifies_only_under(&batch_chain, &batch_bundle, &payments_bundle);

    // podca's own gRPC serving certificate: from the gRPC signer's CA only.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], serve.grpc));
    let served =
        podca_tests::tls::served_chain(addr, &payments_bundle, podca_tests::tls::SERVER_NAME)
            .await
            .expect("the serving certificate verifies under the gRPC signer's bundle");
    let ders: Vec<&[u8]> = served.iter().map(|c| c.as_ref()).collect();
    let served_pem = der_to_pem(&ders);
    podca_tests::verify::assert_no_anchor_signed(&served_pem, &batch_bundle);

    // One signer per CA: no CA is shared, each CA's metrics carry its name.
    let metrics = serve.metrics();
    for ca in ["payments", "batch"] {
        assert_eq!(
            metric_value(&metrics, &format!("podca_ca_signers{{ca=\"{ca}\"}}")),
            1.0,
            "{metrics}"
        );
        assert!(
            metrics.contains(&format!(
                "podca_ca_generation_not_after_timestamp_seconds{{generation=\"1\",state=\"active\",ca=\"{ca}\"}}"
            )),
            "{metrics}"
        );
    }
    assert!(!metrics.contains("ca=\"default\""), "{metrics}");

    // podca doctor: each signer's bundle holds its own CA's anchor (the directories are
    // readable here), no CA is shared.
    let report = doctor_report(&config, &c.kubeconfig).await;
    let line = |name: &str| {
        report
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in\n{report}"))
            .to_owned()
    };
    let bundles = line("trust-bundle");
    assert!(bundles.starts_with("ok "), "{report}");
    for signer in [PAYMENTS, BATCH] {
        assert!(
            bundles.contains(&format!("{signer}: "))
                && bundles
                    .matches("holds the CA's 1 anchor(s) (1 certificate(s) in all)")
                    .count()
                    == 2,
            "{report}"
        );
    }
    let shared = line("shared-ca");
    assert!(
        shared.starts_with("ok ") && shared.ends_with("every signer has a CA of its own"),
        "{report}"
    );
}

/// podca.v1 and the Istio CA API through `podca dev` with two CAs: IssueCertificate signs with
/// the named signer's CA, GetTrustBundle answers that CA's anchors only, and the Istio API (the
/// default signer's) likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podca_v1_and_istio_sign_with_the_deciding_signers_ca() {
    let config = format!(
        "{}\n[grpc]\nsigner = \"{PAYMENTS}\"\nsigners = [\"{PAYMENTS}\", \"{BATCH}\"]\n\
         istio = true\n",
        two_signers(None)
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        ..Default::default()
    });
    // podca dev made both CAs in its data directory.
    for ca in ["payments", "batch"] {
        assert!(
            dev.data_dir.join("cas").join(ca).join("root.pem").exists(),
            "{}",
            dev.banner.join("\n")
        );
    }
    let mut client = dev.tcp_client().await;
    let mut chain_and_bundle = async |signer: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let issued = client
            .issue_certificate(IssueCertificateRequest {
                csr: csr_for(&key),
                signer_name: signer.into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{signer}: {e}"))
            .into_inner();
        let bundle = client
            .get_trust_bundle(GetTrustBundleRequest {
                signer_name: signer.into(),
            })
            .await
            .unwrap()
            .into_inner();
        (issued.certificate_chain_pem, bundle.trust_anchors_pem)
    };
    let (pay_chain, payments_bundle) = chain_and_bundle(PAYMENTS).await;
    let (batch_chain, batch_bundle) = chain_and_bundle(BATCH).await;
    assert_eq!(
        payments_bundle,
        podca_bundle(&dev.data_dir.join("cas/payments"))
    );
    assert_eq!(batch_bundle, podca_bundle(&dev.data_dir.join("cas/batch")));
    assert_verifies_only_under(&pay_chain, &payments_bundle, &batch_bundle);
    assert_verifies_only_under(&batch_chain, &batch_bundle, &payments_bundle);

    // JWT-SVIDs: one key set, for the [grpc] signer's trust domain; never shared with a
    // signer of another trust domain (its tokens would verify with the other's JWKS).
    let jwt = |signer: &str| IssueJwtSvidRequest {
        audiences: vec!["vault".into()],
        signer_name: signer.into(),
        ..Default::default()
    };
    let token = client
        .issue_jwt_svid(jwt(PAYMENTS))
        .await
        .unwrap()
        .into_inner();
    assert!(
        token.spiffe_id.starts_with("spiffe://payments.test/"),
        "{}",
        token.spiffe_id
    );
    let refused = client.issue_jwt_svid(jwt(BATCH)).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert_eq!(
        refused.message(),
        "JWT-SVIDs are signed here for trust domain \"payments.test\" only (the [grpc] signer's); \
         signer \"example.com/batch\" is in \"batch.test\" and would need keys of its own"
    );

    // The Istio CA API signs for the default ([grpc] signer) signer, with its CA.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", dev.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut ztunnel = Ztunnel::new(channel, None, "payments.test");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut request = ztunnel.request(IstioCertificateRequest {
        csr: ztunnel_csr(&key, &["spiffe://payments.test/ns/shop/sa/web"]),
        validity_duration: 3600,
        metadata: None,
    });
    request
        .metadata_mut()
        .insert("x-podca-namespace", "shop".parse().unwrap());
    request
        .metadata_mut()
        .insert("x-podca-service-account", "web".parse().unwrap());
    let answer = ztunnel
        .client
        .create_certificate(request)
        .await
        .unwrap()
        .into_inner();
    let (anchors, chain) = answer.cert_chain.split_last().unwrap();
    assert_eq!(*anchors, payments_bundle);
    assert_verifies_only_under(&chain.concat(), &payments_bundle, &batch_bundle);
}

/// `podca ca init|rotate|show --config FILE --ca NAME` work on the named CA's directory, each
/// CA on its own; `podca ca show --config FILE` lists every CA with its signers; an unknown or
/// Secret-held name is a precise error.
#[test]
fn ca_commands_take_a_ca_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (payments, batch) = (dir.path().join("payments"), dir.path().join("batch"));
    let config = dir.path().join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[cas.vault]\nbackend = \"secret\"\nsecret = \"podca-system/vault-ca\"\n\n\
             [grpc]\nsigner = \"{PAYMENTS}\"\nsigners = [\"{PAYMENTS}\", \"{BATCH}\"]\n",
            two_signers(Some((&payments, &batch)))
        ),
    )
    .unwrap();
    let podca = |args: &[&str]| {
        let out = Command::new(podca_binary())
            .args(args)
            .arg("--config")
            .arg(&config)
            .env_remove("PODCA_DATA_DIR")
            .output()
            .expect("podca runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for ca in ["payments", "batch"] {
        let (ok, _, err) = podca(&["ca", "init", "--ca", ca]);
        assert!(ok, "{err}");
    }
    assert!(payments.join("root.pem").exists() && batch.join("root.pem").exists());

    let (ok, out, err) = podca(&["ca", "rotate", "--ca", "batch"]);
    assert!(ok, "{err}");
    assert!(out.contains("prepare"), "{out}");
    let (ok, listing, err) = podca(&["ca", "show"]);
    assert!(ok, "{err}");
    let (pay_part, batch_part) = listing
        .split_once("== CA \"payments\"")
        .map(|(b, p)| (p.to_owned(), b.to_owned()))
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(
        batch_part.starts_with(
            "== CA \"batch\" ([cas.batch], backend file): signs for example.com/batch\n"
        ),
        "{listing}"
    );
    // The rotation prepared a generation in batch's directory only.
    assert!(batch_part.contains("generation 2 — prepared"), "{listing}");
    assert!(!pay_part.contains("generation 2"), "{listing}");
    assert!(!listing.contains("shared:"), "{listing}");

    let (ok, _, err) = podca(&["ca", "show", "--ca", "nope"]);
    assert!(!ok);
    assert!(
        err.contains("--ca \"nope\": no such CA (configured: default, batch, payments, vault)"),
        "{err}"
    );
    // podca policy test names the CA that would sign.
    let request = dir.path().join("request.yaml");
    std::fs::write(
        &request,
        format!("source: grpc\nsigner: {BATCH}\nnamespace: shop\nservice_account: web\n"),
    )
    .unwrap();
    let request = request.display().to_string();
    let (ok, out, err) = podca(&["policy", "test", "--request", &request]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("\nca:         batch ([cas.batch])\n"), "{out}");

    let (ok, _, err) = podca(&["ca", "rotate", "--ca", "vault"]);
    assert!(!ok);
    assert!(
        err.contains("CA \"vault\" is held in the Secret podca-system/vault-ca"),
        "{err}"
    );
}

/// `[cas.<name>] split_from` through `podca dev`: after a restart with it, the payments signer
/// signs with a copy of the shared CA (so nothing its pods trust changes) and publishes its own
/// next anchor beside the shared one, which the batch signer's bundle never holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_split_off_at_start_signs_as_before_and_publishes_its_own_anchor() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().join("data");
    let signers = format!(
        "[signers.\"{PAYMENTS}\"]\ntrust_domain = \"payments.test\"\n{{ca}}\n\
         [signers.\"{BATCH}\"]\ntrust_domain = \"batch.test\"\n\n\
         [grpc]\nsigner = \"{PAYMENTS}\"\nsigners = [\"{PAYMENTS}\", \"{BATCH}\"]\n"
    );
    let bundle = async |dev: &DevProcess, signer: &str| {
        dev.tcp_client()
            .await
            .get_trust_bundle(GetTrustBundleRequest {
                signer_name: signer.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .trust_anchors_pem
    };
    // Before: one CA for both signers.
    let shared = {
        let config = signers.replace("{ca}", "");
        let dev = DevProcess::start_with(DevOptions {
            config: Some(&config),
            data_dir: Some(data_dir.clone()),
            ..Default::default()
        });
        let shared = bundle(&dev, PAYMENTS).await;
        assert_eq!(shared, bundle(&dev, BATCH).await);
        assert!(dev.stop().success());
        shared
    };
    // After: payments names a CA split off the shared one.
    let config = format!(
        "[cas.payments]\nsplit_from = \"default\"\n\n{}",
        signers.replace("{ca}", "ca = \"payments\"")
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        data_dir: Some(data_dir.clone()),
        ..Default::default()
    });
    let payments = bundle(&dev, PAYMENTS).await;
    assert_eq!(bundle(&dev, BATCH).await, shared);
    let blocks = podca_tests::verify::pem_blocks(&payments);
    assert_eq!(blocks.len(), 2, "{payments}");
    let shared_blocks = podca_tests::verify::pem_blocks(&shared);
    assert_eq!(shared_blocks.len(), 1, "{shared}");
    assert_eq!(blocks[0], shared_blocks[0], "the shared anchor stays first");
    let own_root = blocks[1].clone();
    assert_ne!(own_root, shared_blocks[0]);
    // Until the window is over the copy signs: the certificate still verifies under the shared
    // anchor, as the pods' cached bundles expect.
    let issued = dev
        .tcp_client()
        .await
        .issue_certificate(IssueCertificateRequest {
            csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
            signer_name: PAYMENTS.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    podca_tests::verify::assert_verifies(&issued.certificate_chain_pem, &shared);
    podca_tests::verify::assert_no_anchor_signed(&issued.certificate_chain_pem, &own_root);
    assert_eq!(
        std::fs::read_to_string(data_dir.join("cas/payments/root.pem")).unwrap(),
        payments
    );
    assert!(dev.stop().success());
}

const MESH: &str = "example.com/mesh";

/// The anchors of `signer`'s ClusterTrustBundles that carry `podca.dev/tenant=<tenant>`, as a
/// pod's `clusterTrustBundle` projection with that `labelSelector` sees them (`None`: those
/// without the label, the signer's own).
async fn tenant_bundle(
    admin: &podca_tests::client::KubeClient,
    signer: &str,
    tenant: Option<&str>,
) -> String {
    let path = format!(
        "/apis/certificates.k8s.io/v1/clustertrustbundles?fieldSelector=spec.signerName%3D{}",
        signer.replace('/', "%2F")
    );
    let list = admin.get(&path).await.unwrap().json();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["metadata"]["labels"]["podca.dev/tenant"].as_str() == tenant)
        .map(|b| b["spec"]["trustBundle"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits until `namespace/name` has a condition; returns its type, reason and chain.
async fn settled(c: &Cluster, namespace: &str, name: &str) -> (String, String, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let o = c
            .emu
            .get_object(podca_tests::emulator::Res::Pcr, namespace, name)
            .unwrap();
        if let Some(t) = o["status"]["conditions"][0]["type"].as_str() {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            return (
                t.to_owned(),
                text(&o["status"]["conditions"][0]["reason"]),
                text(&o["status"]["certificateChain"]),
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{namespace}/{name} not settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A leaf for `spiffe_id` and `dns`, signed with the issuing key in the CA directory `dir` as
/// an attacker holding that key would; with its chain.
fn forge(dir: &std::path::Path, spiffe_id: &str, dns: &[&str]) -> String {
    let store = podca_signer::FileStore::new(dir);
    let chain = std::fs::read_to_string(store.issuing_cert_path()).unwrap();
    let key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(store.issuing_key_path()).unwrap())
        .unwrap();
    let forger = rcgen::Issuer::from_ca_cert_pem(&chain, key).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = std::iter::once(rcgen::SanType::URI(spiffe_id.try_into().unwrap()))
        .chain(
            dns.iter()
                .map(|d| rcgen::SanType::DnsName((*d).try_into().unwrap())),
        )
        .collect();
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    // As podca's own leaves: strict verifiers want the issuer's key identifier.
    params.use_authority_key_identifier_extension = true;
    let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = params.signed_by(&leaf_key, &forger).unwrap();
    format!("{}{chain}", leaf.pem())
}

/// Issue #39, tenants: two tenants of one signer, each a trust domain with a CA of its own that
/// `podca ca init --ca` constrains to the tenant's names. A tenant's certificate verifies under
/// its tenant's bundle only; a certificate forged with tenant A's CA key for a DNS name of
/// tenant B is refused by openssl and rustls-webpki under A's bundle (nameConstraints), one for
/// B's SPIFFE ID under B's bundle; podca itself refuses to issue either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_of_one_signer_are_separate_trust_domains() {
    let c = Cluster::start(ApiMode::V1Only, &[MESH]).await;
    let dir = |name: &str| c.dir.path().join(name);
    let config = dir("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n[cas.team-a]\ndir = {:?}\n[cas.team-b]\ndir = {:?}\n\
             [cas.team-c]\ndir = {:?}\n\n\
             [signers.\"{MESH}\"]\ntrust_domain = \"mesh.test\"\nallowed_dns_names = [\"*\"]\n\
             [signers.\"{MESH}\".tenants.team-a]\nnamespaces = [\"team-a\"]\n\
             [signers.\"{MESH}\".tenants.team-b]\nnamespaces = [\"team-b\"]\n\
             [signers.\"{MESH}\".tenants.team-c]\nnamespaces = [\"team-c\"]\n\
             uri_constraints = true\n\n\
             [grpc]\n{}\n[ledger]\nbackend = \"none\"\n[jwt]\nenabled = false\n",
            dir("ca").display().to_string(),
            dir("team-a").display().to_string(),
            dir("team-b").display().to_string(),
            dir("team-c").display().to_string(),
            podca_tests::tls::GRPC_TLS_CONFIG,
        ),
    )
    .unwrap();
    ca_init(&dir("ca"), "mesh");
    for tenant in ["team-a", "team-b", "team-c"] {
        let out = Command::new(podca_binary())
            .args(["ca", "init", "--ca", tenant, "--name", tenant, "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _serve = ServeProcess::start(&config, &c.kubeconfig, &[], &[]);

    let file = async |namespace: &'static str, name: &str, dns: &str| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut pcr = NewPcr::stub(
            "v1",
            namespace,
            name.to_owned(),
            MESH,
            podca_tests::cluster::stub_csr(&key),
        );
        pcr.annotations = Some(serde_json::json!({ "podca.dev/dns-names": dns }));
        pcr.file(&c.admin).await;
        settled(&c, namespace, name).await
    };
    let (kind, _, chain_a) = file("team-a", "a", "web.team-a.svc").await;
    assert_eq!(kind, "Issued");
    let (kind, _, chain_b) = file("team-b", "b", "web.team-b.svc").await;
    assert_eq!(kind, "Issued");
    // podca refuses what the tenant's CA does not permit, and a namespace in no tenant.
    assert_eq!(
        file("team-a", "a-as-b", "web.team-b.svc").await.1,
        "NameNotPermittedByCA"
    );
    assert_eq!(
        file("elsewhere", "none", "web.elsewhere.svc").await.1,
        "NamespaceNotAllowed"
    );

    // Each tenant's bundle (label podca.dev/tenant) holds its own CA's anchors only.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (bundle_a, bundle_b) = loop {
        let a = tenant_bundle(&c.admin, MESH, Some("team-a")).await;
        let b = tenant_bundle(&c.admin, MESH, Some("team-b")).await;
        if a == podca_bundle(&dir("team-a")) && b == podca_bundle(&dir("team-b")) {
            break (a, b);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "tenant bundles:\n{a}\n{b}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        tenant_bundle(&c.admin, MESH, None).await,
        podca_bundle(&dir("ca"))
    );
    let uris = podca_tests::verify::leaf_uris(&chain_a);
    assert_eq!(uris, ["spiffe://team-a.mesh.test/ns/team-a/sa/app"]);
    assert_verifies_only_under(&chain_a, &bundle_a, &bundle_b);
    assert_verifies_only_under(&chain_b, &bundle_b, &bundle_a);

    // Forged with team A's CA key: a DNS name of team B is refused under A's own bundle, by
    // both verifiers, because of the CA's nameConstraints.
    let forged_dns = forge(
        &dir("team-a"),
        "spiffe://team-a.mesh.test/ns/team-a/sa/app",
        &["web.team-b.svc"],
    );
    let refused = podca_tests::verify::openssl_verify(&forged_dns, &bundle_a).unwrap_err();
    assert_eq!(
        refused.code,
        Some(47),
        "permitted subtree violation: {refused}"
    );
    assert_eq!(
        podca_tests::verify::webpki_verify(&forged_dns, &bundle_a),
        Err(webpki::Error::NameConstraintViolation)
    );
    // Team B's SPIFFE ID: refused under B's bundle (another CA), which is the bundle a SPIFFE
    // verifier uses for B's trust domain; A's CA carries DNS constraints only (rustls-webpki
    // refuses every URI-constrained leaf), so under A's bundle it is the ID's trust domain
    // that gives it away.
    let forged_id = forge(
        &dir("team-a"),
        "spiffe://team-b.mesh.test/ns/team-b/sa/app",
        &[],
    );
    podca_tests::verify::assert_no_anchor_signed(&forged_id, &bundle_b);
    assert_eq!(
        podca_tests::verify::webpki_verify(&forged_id, &bundle_b),
        Err(webpki::Error::UnknownIssuer)
    );
    // The emulator's ClusterTrustBundle rules (signer-linked names, attest on the signer)
    // accepted every tenant bundle; podca doctor finds each holding its own CA's anchors.
    let counters = c.emu.counters();
    assert_eq!(
        (counters.validation_rejections, counters.forbidden),
        (0, 0),
        "{:?}",
        counters.rejections_by_cause
    );
    let report = doctor_report(&config, &c.kubeconfig).await;
    let bundles = report
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("trust-bundle"))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(bundles.starts_with("ok "), "{report}");
    for tenant in ["team-a", "team-b", "team-c"] {
        assert!(
            bundles.contains(&format!(
                "{MESH} (tenant {tenant}): example.com:mesh:podca.{tenant} holds the CA's 1 anchor(s)"
            )),
            "{report}"
        );
    }
    // With uri_constraints (tenant C), B's SPIFFE ID forged with C's key is refused under C's
    // own bundle by both; C's genuine leaves verify with openssl, and rustls-webpki refuses
    // them too (it does not implement URI constraints: fails closed).
    let (kind, _, chain_c) = file("team-c", "c", "web.team-c.svc").await;
    assert_eq!(kind, "Issued");
    let bundle_c = podca_bundle(&dir("team-c"));
    podca_tests::verify::assert_verifies(&chain_c, &bundle_c);
    assert_eq!(
        podca_tests::verify::webpki_verify(&chain_c, &bundle_c),
        Err(webpki::Error::NameConstraintViolation)
    );
    let forged_c = forge(
        &dir("team-c"),
        "spiffe://team-b.mesh.test/ns/team-b/sa/app",
        &[],
    );
    let refused = podca_tests::verify::openssl_verify(&forged_c, &bundle_c).unwrap_err();
    assert!(
        refused.output.contains("permitted subtree violation"),
        "{refused}"
    );
    assert_eq!(
        podca_tests::verify::webpki_verify(&forged_c, &bundle_c),
        Err(webpki::Error::NameConstraintViolation)
    );
}

/// A request with podca dev's loopback identity headers for `namespace/web`.
fn as_caller<T>(namespace: &str, message: T) -> tonic::Request<T> {
    as_account(namespace, "web", message)
}

/// A request with podca dev's loopback identity headers for `namespace/service_account`.
fn as_account<T>(namespace: &str, service_account: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("x-podca-namespace", namespace.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-podca-service-account", service_account.parse().unwrap());
    request
}

/// Tenants over podca.v1 (`podca dev`): podca dev makes the tenant's CA constrained to its
/// names; a caller in the tenant's namespace gets a certificate of the tenant's trust domain
/// from the tenant's CA and the tenant's anchors as its bundle; a caller in no tenant
/// (`untenanted = "signer"`) gets the signer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podca_v1_answers_a_tenants_caller_with_the_tenants_ca() {
    let config = format!(
        "[cas.shop]\n\n[signers.\"{MESH}\"]\ntrust_domain = \"mesh.test\"\nuntenanted = \"signer\"\n\
         dns_name_templates = [\"{{sa}}.{{ns}}.svc\"]\n\
         [signers.\"{MESH}\".tenants.shop]\nnamespaces = [\"shop\"]\n\
         [[signers.\"{MESH}\".tenants.shop.rules]]\nname = \"no_jobs\"\n\
         deny = \"request.service_account == 'jobs'\"\nreason = \"NoJobsInShop\"\n"
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        ..Default::default()
    });
    // The tenant's own rules run after the signer's, for the tenant's namespaces only.
    let as_jobs = |namespace: &str| {
        let csr = csr_for(&rcgen::KeyPair::generate().unwrap());
        as_account(
            namespace,
            "jobs",
            IssueCertificateRequest {
                csr,
                ..Default::default()
            },
        )
    };
    let refused = dev
        .tcp_client()
        .await
        .issue_certificate(as_jobs("shop"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().starts_with("NoJobsInShop"), "{refused:?}");
    assert!(
        dev.tcp_client()
            .await
            .issue_certificate(as_jobs("other"))
            .await
            .is_ok()
    );
    let tenant_anchors = podca_bundle(&dev.data_dir.join("cas/shop"));
    let signer_anchors = podca_bundle(&dev.data_dir);
    let mut client = dev.tcp_client().await;
    let ask = async |client: &mut podca_proto::podca::v1::pod_ca_client::PodCaClient<_>,
                     namespace: &str| {
        let issued = client
            .issue_certificate(as_caller(
                namespace,
                IssueCertificateRequest {
                    csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner();
        let bundle = client
            .get_trust_bundle(as_caller(namespace, GetTrustBundleRequest::default()))
            .await
            .unwrap()
            .into_inner()
            .trust_anchors_pem;
        (issued, bundle)
    };
    let (shop, shop_bundle) = ask(&mut client, "shop").await;
    assert_eq!(shop_bundle, tenant_anchors);
    assert_eq!(shop.trust_anchors_pem, tenant_anchors);
    assert_eq!(
        podca_tests::verify::leaf_uris(&shop.certificate_chain_pem),
        ["spiffe://shop.mesh.test/ns/shop/sa/web"]
    );
    assert_verifies_only_under(
        &shop.certificate_chain_pem,
        &tenant_anchors,
        &signer_anchors,
    );
    let (other, other_bundle) = ask(&mut client, "other").await;
    assert_eq!(other_bundle, signer_anchors);
    assert_eq!(
        podca_tests::verify::leaf_uris(&other.certificate_chain_pem),
        ["spiffe://mesh.test/ns/other/sa/web"]
    );
    assert_verifies_only_under(
        &other.certificate_chain_pem,
        &signer_anchors,
        &tenant_anchors,
    );
    // podca policy test decides as podca dev did, and names the tenant's CA.
    let scratch = tempfile::tempdir().unwrap();
    let (config_file, request) = (
        scratch.path().join("podca.toml"),
        scratch.path().join("r.yaml"),
    );
    std::fs::write(&config_file, &config).unwrap();
    std::fs::write(
        &request,
        "source: grpc\nnamespace: shop\nservice_account: web\n",
    )
    .unwrap();
    let out = Command::new(podca_binary())
        .args(["policy", "test", "-o", "json", "--config"])
        .arg(&config_file)
        .arg("--request")
        .arg(&request)
        .output()
        .unwrap();
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            verdict["issued"]["spiffe_id"].as_str(),
            verdict["ca"].as_str()
        ),
        (
            Some("spiffe://shop.mesh.test/ns/shop/sa/web"),
            Some("shop ([cas.shop]), tenant shop (trust domain shop.mesh.test)")
        ),
        "{verdict:#}"
    );
    // The tenant's CA podca dev made is constrained to the tenant's names: a DNS name of
    // another namespace forged with its key is refused by both verifiers.
    let forged = forge(
        &dev.data_dir.join("cas/shop"),
        "spiffe://shop.mesh.test/ns/shop/sa/web",
        &["web.other.svc"],
    );
    let refused = podca_tests::verify::openssl_verify(&forged, &tenant_anchors).unwrap_err();
    assert!(
        refused.output.contains("permitted subtree violation"),
        "{refused}"
    );
    assert_eq!(
        podca_tests::verify::webpki_verify(&forged, &tenant_anchors),
        Err(webpki::Error::NameConstraintViolation)
    );
    assert!(dev.stop().success());
}

/// HSM custody per CA: two tenant CAs whose keys podca generates in one SoftHSM2 token under
/// labels of their own (non-extractable), constrained to their tenants; `podca dev` signs each
/// tenant's certificates in the token with its own key, and neither verifies under the other's
/// anchors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_cas_keep_their_keys_in_one_token_under_labels_of_their_own() {
    use podca_tests::softhsm::{SOFTHSM2_MODULE, private_key_labels, softhsm_token};
    let scratch = tempfile::tempdir().unwrap();
    let conf = softhsm_token(scratch.path(), "podca", "87654321", "123456");
    let pin = scratch.path().join("pin");
    std::fs::write(&pin, "123456").unwrap();
    let data = scratch.path().join("data");
    let config_text = format!(
        "[cas.team-a]\nbackend = \"pkcs11\"\npkcs11_pin_file = {pin:?}\n\
         [cas.team-b]\nbackend = \"pkcs11\"\npkcs11_pin_file = {pin:?}\n\n\
         [signers.\"{MESH}\"]\ntrust_domain = \"mesh.test\"\nuntenanted = \"signer\"\n\
         [signers.\"{MESH}\".tenants.team-a]\nnamespaces = [\"team-a\"]\n\
         [signers.\"{MESH}\".tenants.team-b]\nnamespaces = [\"team-b\"]\n"
    );
    let config = scratch.path().join("podca.toml");
    std::fs::write(&config, &config_text).unwrap();
    for tenant in ["team-a", "team-b"] {
        let uri = format!("pkcs11:token=podca;object={tenant}?module-path={SOFTHSM2_MODULE}");
        let out = Command::new(podca_binary())
            .args([
                "ca",
                "init",
                "--ca",
                tenant,
                "--pkcs11-uri",
                &uri,
                "--pkcs11-generate",
            ])
            .arg("--config")
            .arg(&config)
            .arg("--dir")
            .arg(data.join("cas").join(tenant))
            .arg("--pkcs11-pin-file")
            .arg(&pin)
            .env("SOFTHSM2_CONF", &conf)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut labels = private_key_labels(&conf, "podca", "123456");
    labels.sort();
    assert_eq!(labels, ["team-a", "team-b"]);

    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config_text),
        data_dir: Some(data.clone()),
        env: vec![("SOFTHSM2_CONF", conf.clone())],
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    let mut chain_of = async |namespace: &str| {
        client
            .issue_certificate(as_caller(
                namespace,
                IssueCertificateRequest {
                    csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner()
    };
    let a = chain_of("team-a").await;
    let b = chain_of("team-b").await;
    assert_eq!(a.trust_anchors_pem, podca_bundle(&data.join("cas/team-a")));
    assert_verifies_only_under(
        &a.certificate_chain_pem,
        &a.trust_anchors_pem,
        &b.trust_anchors_pem,
    );
    assert_verifies_only_under(
        &b.certificate_chain_pem,
        &b.trust_anchors_pem,
        &a.trust_anchors_pem,
    );
    // Made with --ca: constrained to the tenant's names, as the file CAs are.
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-ext", "nameConstraints", "-in"])
        .arg(data.join("cas/team-a/root.pem"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("critical")
            && text.contains("DNS:team-a.svc")
            && text.contains("DNS:team-a.svc.cluster.local"),
        "{text}"
    );
    assert!(dev.stop().success());
}
