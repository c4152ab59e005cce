//! Issue #39: every signer name is its own trust domain. Two signers, each with its own CA
//! (`[cas.<name>]`): a certificate of one verifies under its own signer's bundle and fails under
//! the other's, checked by openssl and by rustls-webpki, never by podca's own code; on every
//! path that issues (PodCertificateRequests, podca.v1, the Istio CA API) and for the gRPC
//! serving certificate.

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
    let (config_path, kubeconfig) = (config.clone(), c.kubeconfig.clone());
    let doctor = tokio::task::spawn_blocking(move || {
        Command::new(podca_binary())
            .args(["doctor", "--config"])
            .arg(&config_path)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("PODCA_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
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
        "{}\n[grpc]\nsigner = \"{PAYMENTS}\"\nsigners = [\"{PAYMENTS}\", \"{BATCH}\"]\n",
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
