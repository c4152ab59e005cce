//! Authorization at the gRPC edge (#12 item 5), against the real `podca serve` and the API
//! emulator (harness: `grpc_serve/mod.rs`): the `[grpc] signers` allow-list, IssueForPod's
//! pod checks (pod-bound tokens only; terminating, finished and replaced pods refused; a
//! cached review never vouching for a pod that has gone), `[grpc] max_dns_names`, and policy
//! rules that read the pod (`pod_facts`). Each refusal with the status the README documents
//! (`grpc/src/lib.rs`).

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

mod grpc_serve;

use grpc_serve::{
    Cluster, NODE_PROXY, PCR_ONLY_SIGNER, SIGNER, TokenSpec, csr_request, expect_code, issue,
    issue_for_pod, with_token,
};
use podca_proto::istio::v1::auth::IstioCertificateRequest;
use podca_proto::podca::v1::{GetTrustBundleRequest, IssueJwtSvidRequest};
use podca_tests::emulator::{FaultScope, PodFixture, Res, ServiceAccountToken};
use podca_tests::istio::{Ztunnel, ztunnel_csr};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_signers_in_the_allow_list_are_offered() {
    let cluster = Cluster::start_with("max_dns_names = 2\n").await;
    let mut client = cluster.client().await;
    let token = cluster.token("shop", "web", TokenSpec::default());

    // The default signer (grpc.signer) is offered.
    let issued = issue(&mut client, Some(&token)).await.unwrap();
    assert_eq!(issued.spiffe_id, "spiffe://cluster.local/ns/shop/sa/web");
    let mut named = csr_request();
    named.signer_name = SIGNER.into();
    client
        .issue_certificate(with_token(named, Some(&token)))
        .await
        .unwrap();

    // A configured signer that is not in grpc.signers: neither its policy nor its bundle.
    let mut other = csr_request();
    other.signer_name = PCR_ONLY_SIGNER.into();
    expect_code(
        client
            .issue_certificate(with_token(other, Some(&token)))
            .await,
        Code::PermissionDenied,
        "signer \"example.com/pcr-only\" is not offered over gRPC (it is not in grpc.signers)",
    );
    expect_code(
        client
            .get_trust_bundle(with_token(
                GetTrustBundleRequest {
                    signer_name: PCR_ONLY_SIGNER.into(),
                },
                Some(&token),
            ))
            .await,
        Code::PermissionDenied,
        "not in grpc.signers",
    );
    // A signer nobody configured stays NOT_FOUND.
    let mut unknown = csr_request();
    unknown.signer_name = "example.com/nope".into();
    expect_code(
        client
            .issue_certificate(with_token(unknown, Some(&token)))
            .await,
        Code::NotFound,
        "unknown signer \"example.com/nope\"",
    );

    // max_dns_names = 2: three requested names are refused before the policy runs.
    let mut many = csr_request();
    many.user_annotations.insert(
        "podca.dev/dns-names".into(),
        "a.shop.svc,b.shop.svc,c.shop.svc".into(),
    );
    expect_code(
        client
            .issue_certificate(with_token(many, Some(&token)))
            .await,
        Code::InvalidArgument,
        "too many DNS names: the certificate would carry 3, at most 2 are allowed \
         (grpc.max_dns_names)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_for_pod_refuses_pods_that_are_not_running_and_callers_that_are_gone() {
    let cluster = Cluster::start().await;
    let emu = &cluster.emu;
    let mut client = cluster.client().await;
    emu.add_node("node-1");
    for name in ["web-1", "leaving", "done", "crashed", "static-web"] {
        cluster.pod("apps", name, "node-1", "web");
    }
    // A static pod's mirror, as the kubelet creates it.
    assert!(emu.set_pod_metadata(
        "apps",
        "static-web",
        &[],
        &[("kubernetes.io/config.mirror", "0123abcd")]
    ));
    assert!(emu.begin_pod_deletion("apps", "leaving"));
    assert!(emu.set_pod_phase("apps", "done", "Succeeded"));
    assert!(emu.set_pod_phase("apps", "crashed", "Failed"));
    let (proxy_ns, proxy_sa) = NODE_PROXY.split_once('/').unwrap();
    cluster.pod(proxy_ns, "node-proxy-a", "node-1", proxy_sa);
    let proxy = cluster.token(
        proxy_ns,
        proxy_sa,
        TokenSpec::bound("node-proxy-a", "node-1"),
    );

    let issued = issue_for_pod(&mut client, &proxy, "apps", "web-1")
        .await
        .unwrap();
    assert_eq!(issued.spiffe_id, "spiffe://cluster.local/ns/apps/sa/web");
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "leaving").await,
        Code::FailedPrecondition,
        "pod apps/leaving is terminating (it has a deletionTimestamp)",
    );
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "done").await,
        Code::FailedPrecondition,
        "pod apps/done has finished (phase Succeeded)",
    );
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "crashed").await,
        Code::FailedPrecondition,
        "pod apps/crashed has finished (phase Failed)",
    );
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "static-web").await,
        Code::FailedPrecondition,
        "pod apps/static-web is a static pod's mirror: no service account vouches for it",
    );

    // A token bound to the node only (no pod name and UID) is not pod-bound.
    let node_bound = emu.add_service_account_token(ServiceAccountToken {
        namespace: proxy_ns.into(),
        service_account: proxy_sa.into(),
        service_account_uid: podca_tests::emulator::new_uid(),
        audiences: vec!["podca".into()],
        expires: emu.now() + time::Duration::hours(1),
        pod_name: None,
        pod_uid: None,
        node_name: Some("node-1".into()),
        node_uid: Some(podca_tests::emulator::new_uid()),
        credential_id: podca_tests::emulator::new_uid(),
    });
    expect_code(
        issue_for_pod(&mut client, &node_bound, "apps", "web-1").await,
        Code::PermissionDenied,
        "the caller's token is not bound to a pod (no pod name and UID)",
    );

    // The proxy's review is cached now; its pod goes away. The cached identity does not
    // outlive the pod: IssueForPod reads the caller's pod on every call.
    let reviews = cluster.token_reviews();
    assert!(emu.delete_object(Res::Pod, proxy_ns, "node-proxy-a"));
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "web-1").await,
        Code::PermissionDenied,
        "the caller's pod mesh/node-proxy-a no longer exists",
    );
    assert_eq!(
        cluster.token_reviews(),
        reviews,
        "the review came from the cache"
    );
    // A new pod of the same name (another UID) does not inherit the old pod's tokens.
    let new_uid = emu.add_pod(&PodFixture {
        namespace: proxy_ns.into(),
        name: "node-proxy-a".into(),
        node_name: "node-1".into(),
        service_account: proxy_sa.into(),
        ..Default::default()
    });
    let status = issue_for_pod(&mut client, &proxy, "apps", "web-1")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().starts_with(
            "the caller's pod mesh/node-proxy-a is not the pod its token was issued for (UID "
        ) && status.message().contains(&new_uid),
        "{status:?}"
    );
    // The new pod's own token works.
    let fresh = cluster.token(
        proxy_ns,
        proxy_sa,
        TokenSpec::bound("node-proxy-a", "node-1"),
    );
    issue_for_pod(&mut client, &fresh, "apps", "web-1")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_refuses_tokens_of_pods_that_have_gone() {
    // The emulator's TokenReview, as kube-apiserver's: a pod-bound token dies with its pod.
    let cluster = Cluster::start_with("token_cache_seconds = 0\n").await;
    let emu = &cluster.emu;
    let mut client = cluster.client().await;
    emu.add_node("node-1");
    cluster.pod("shop", "web-0", "node-1", "web");
    let token = cluster.token("shop", "web", TokenSpec::bound("web-0", "node-1"));
    issue(&mut client, Some(&token)).await.unwrap();
    // token_cache_seconds = 0: every call asks, so the deletion shows at once.
    assert!(emu.delete_object(Res::Pod, "shop", "web-0"));
    expect_code(
        issue(&mut client, Some(&token)).await,
        Code::Unauthenticated,
        "service account token has been invalidated",
    );
}

/// A rule on the caller's pod labels (`pod_facts`, docs/policy.md "Pod labels and
/// annotations").
const POD_RULE: &str = r#"pod_facts = true
excluded_namespaces = ["blocked"]

[[signers."example.com/workload".rules]]
name = "labelled_pods_only"
require = "'certs.example.com/allowed' in pod.labels && pod.labels['certs.example.com/allowed'] == 'true'"
reason = "PodNotLabelled"
message = "'pod ' + request.pod.name + ' lacks certs.example.com/allowed=true'"
"#;

/// `podca_policy_pod_reads_total` of [`SIGNER`] for `result`, from `podca serve`'s /metrics.
fn pod_reads(cluster: &Cluster, result: &str) -> u64 {
    let prefix =
        format!("podca_policy_pod_reads_total{{signer=\"{SIGNER}\",result=\"{result}\"}} ");
    cluster
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(|n| n.parse().unwrap()))
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_label_rules_read_the_pod_of_each_grpc_request() {
    let cluster = Cluster::start_with_signer(POD_RULE, "").await;
    let emu = &cluster.emu;
    let mut client = cluster.client().await;
    emu.add_node("node-1");
    let allowed = [("certs.example.com/allowed", "true")];
    for name in ["web-1", "web-2", "web-3"] {
        cluster.pod("apps", name, "node-1", "web");
    }
    assert!(emu.set_pod_metadata("apps", "web-1", &allowed, &[]));
    let bound = |pod| cluster.token("apps", "web", TokenSpec::bound(pod, "node-1"));
    let (web1, web2) = (bound("web-1"), bound("web-2"));

    // podca.v1 IssueCertificate: the bound token's pod decides.
    issue(&mut client, Some(&web1)).await.unwrap();
    expect_code(
        issue(&mut client, Some(&web2)).await,
        Code::PermissionDenied,
        "PodNotLabelled: pod web-2 lacks certs.example.com/allowed=true",
    );
    // A token bound to no pod: rules that read the pod fail closed, whatever they say.
    let unbound = cluster.token("apps", "web", TokenSpec::default());
    expect_code(
        issue(&mut client, Some(&unbound)).await,
        Code::PermissionDenied,
        "PolicyPodNotFound: the signer's rules read the pod (pod_facts) and this request names \
         none (a token bound to no pod, an impersonated identity or podca dev): the rules fail \
         closed",
    );
    // A label edit applies to the next request, without a restart.
    assert!(emu.set_pod_metadata("apps", "web-2", &allowed, &[]));
    issue(&mut client, Some(&web2)).await.unwrap();

    // IssueForPod: the target pod's labels, not the node proxy's.
    let (proxy_ns, proxy_sa) = NODE_PROXY.split_once('/').unwrap();
    cluster.pod(proxy_ns, "node-proxy-a", "node-1", proxy_sa);
    let proxy = cluster.token(
        proxy_ns,
        proxy_sa,
        TokenSpec::bound("node-proxy-a", "node-1"),
    );
    issue_for_pod(&mut client, &proxy, "apps", "web-2")
        .await
        .unwrap();
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "web-3").await,
        Code::PermissionDenied,
        "PodNotLabelled: pod web-3 lacks certs.example.com/allowed=true",
    );

    // The Istio CA API, with the workload's own token.
    let istio_token = |pod| {
        cluster.token(
            "apps",
            "web",
            TokenSpec {
                audience: "podca-istio",
                ..TokenSpec::bound(pod, "node-1")
            },
        )
    };
    let id = "spiffe://cluster.local/ns/apps/sa/web";
    let csr = || {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        IstioCertificateRequest {
            csr: ztunnel_csr(&key, &[id]),
            validity_duration: 3600,
            metadata: None,
        }
    };
    let channel = cluster.channel().await;
    let mut istio = Ztunnel::new(channel.clone(), Some(istio_token("web-2")), "cluster.local");
    istio.send(csr()).await.unwrap();
    let mut istio = Ztunnel::new(channel, Some(istio_token("web-3")), "cluster.local");
    expect_code(
        istio.send(csr()).await,
        Code::PermissionDenied,
        "PodNotLabelled: pod web-3 lacks certs.example.com/allowed=true",
    );

    // JWT-SVIDs (podca.v1 IssueJwtSvid), the same rule.
    let jwt = |token: String| {
        let mut client = client.clone();
        async move {
            let request = IssueJwtSvidRequest {
                audiences: vec!["vault".into()],
                ..Default::default()
            };
            client
                .issue_jwt_svid(with_token(request, Some(&token)))
                .await
                .map(tonic::Response::into_inner)
        }
    };
    jwt(web2.clone()).await.unwrap();
    expect_code(
        jwt(bound("web-3")).await,
        Code::PermissionDenied,
        "PodNotLabelled: pod web-3 lacks certs.example.com/allowed=true",
    );

    // The pod goes while its token's review is still cached (token_cache_seconds 60): the
    // read finds no pod, and the request is denied, not decided on stale labels.
    assert!(emu.delete_object(Res::Pod, "apps", "web-1"));
    expect_code(
        issue(&mut client, Some(&web1)).await,
        Code::PermissionDenied,
        "PolicyPodNotFound: pod apps/web-1 does not exist",
    );

    // An excluded namespace: the allow-list denies first, and its pod is not read.
    cluster.pod("blocked", "web-9", "node-1", "web");
    let blocked = cluster.token("blocked", "web", TokenSpec::bound("web-9", "node-1"));
    expect_code(
        issue(&mut client, Some(&blocked)).await,
        Code::PermissionDenied,
        "NamespaceNotAllowed: ",
    );

    // One GET per admitted request that names a pod: IssueCertificate 3, IssueForPod 2, Istio
    // 2, JWT 2; the unbound token and the blocked namespace none; and the deleted pod.
    assert_eq!(pod_reads(&cluster, "found"), 9);
    assert_eq!(pod_reads(&cluster, "not_found"), 1);
    assert_eq!(pod_reads(&cluster, "error"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_label_rules_answer_unavailable_when_the_pod_cannot_be_read() {
    let cluster = Cluster::start_with_signer(POD_RULE, "").await;
    let emu = &cluster.emu;
    let mut client = cluster.client().await;
    emu.add_node("node-1");
    cluster.pod("apps", "web-1", "node-1", "web");
    let token = cluster.token("apps", "web", TokenSpec::bound("web-1", "node-1"));
    // The API server refuses the pod read (as when the RBAC rule is missing): nothing is
    // decided without the pod.
    emu.inject_errors(
        403,
        1,
        FaultScope::PathContains("/namespaces/apps/pods/web-1".into()),
    );
    expect_code(
        issue(&mut client, Some(&token)).await,
        Code::Unavailable,
        "cannot check the pod now: reading pod apps/web-1: ",
    );
    assert_eq!(pod_reads(&cluster, "error"), 1);
    // The next call reads the pod and the rule decides (web-1 has no label).
    expect_code(
        issue(&mut client, Some(&token)).await,
        Code::PermissionDenied,
        "PodNotLabelled: pod web-1 lacks",
    );
    assert_eq!(pod_reads(&cluster, "found"), 1);
}
