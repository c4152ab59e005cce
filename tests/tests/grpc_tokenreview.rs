//! The in-cluster gRPC path: the real `podca serve` binary against the API emulator, with its
//! `KubeTokenReviewer` (TokenReview) and `KubePodDirectory` (pod lookups) — the gRPC code lives
//! in the binary, so the test talks to the process with the `podca-proto` client (harness:
//! `grpc_serve/mod.rs`).

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

mod grpc_serve;

use std::time::{Duration, Instant};

use grpc_serve::{Cluster, NODE_PROXY, TokenSpec, csr_request, expect_code, issue, issue_for_pod};
use podca_tests::emulator::{FaultScope, PodFixture};
use podca_tests::verify::assert_verifies;
use tonic::{Code, Request};

/// The URI SAN of the chain's leaf.
fn leaf_uri(chain_pem: &str) -> String {
    let blocks = pem::parse_many(chain_pem).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(blocks[0].contents()).unwrap();
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    san.value
        .general_names
        .iter()
        .find_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some((*u).to_string()),
            _ => None,
        })
        .expect("the leaf has a URI SAN")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_decides_who_may_issue_and_is_cached() {
    let cluster = Cluster::start().await;
    let mut client = cluster.client().await;

    // A pod-bound token for the audience `podca` (TokenReview checks that its pod exists).
    cluster.emu.add_node("node-1");
    cluster.pod("shop", "web-0", "node-1", "web");
    let good = cluster.token("shop", "web", TokenSpec::bound("web-0", "node-1"));
    let before = cluster.token_reviews();
    let issued = issue(&mut client, Some(&good)).await.unwrap();
    assert_eq!(issued.spiffe_id, "spiffe://cluster.local/ns/shop/sa/web");
    assert_eq!(
        leaf_uri(&issued.certificate_chain_pem),
        "spiffe://cluster.local/ns/shop/sa/web"
    );
    assert_verifies(&issued.certificate_chain_pem, &issued.trust_anchors_pem);
    assert_eq!(cluster.token_reviews(), before + 1, "one review");

    // The review is cached: a second call asks the Kubernetes API nothing.
    let again = issue(&mut client, Some(&good)).await.unwrap();
    assert_ne!(again.serial, issued.serial);
    assert_eq!(cluster.token_reviews(), before + 1, "the review was cached");

    // Refusals, with the messages the README documents.
    let wrong_audience = cluster.token(
        "shop",
        "web",
        TokenSpec {
            audience: "vault",
            ..Default::default()
        },
    );
    expect_code(
        issue(&mut client, Some(&wrong_audience)).await,
        Code::Unauthenticated,
        "invalid credentials: ",
    );
    expect_code(
        issue(&mut client, Some(&wrong_audience)).await,
        Code::Unauthenticated,
        "audiences",
    );
    let expired = cluster.token(
        "shop",
        "web",
        TokenSpec {
            lifetime: time::Duration::minutes(-1),
            ..Default::default()
        },
    );
    expect_code(
        issue(&mut client, Some(&expired)).await,
        Code::Unauthenticated,
        "expired",
    );
    expect_code(
        issue(&mut client, Some("sa.not-a-token-anyone-issued")).await,
        Code::Unauthenticated,
        "invalid credentials: ",
    );
    expect_code(
        issue(&mut client, None).await,
        Code::Unauthenticated,
        "no credentials: send `authorization: Bearer <service-account token>`",
    );
    let mut basic = Request::new(csr_request());
    basic
        .metadata_mut()
        .insert("authorization", "Basic dXNlcjpwdw==".parse().unwrap());
    expect_code(
        client.issue_certificate(basic).await,
        Code::Unauthenticated,
        "`Bearer <token>`",
    );
    // Refusals are remembered for 10 s (by the token's hash): the same refused token is
    // refused again, with the same message, without asking the Kubernetes API.
    let reviews = cluster.token_reviews();
    expect_code(
        issue(&mut client, Some(&wrong_audience)).await,
        Code::Unauthenticated,
        "audiences",
    );
    assert_eq!(cluster.token_reviews(), reviews);
    // Another unknown token is asked about.
    expect_code(
        issue(&mut client, Some("sa.another-token-nobody-issued")).await,
        Code::Unauthenticated,
        "invalid credentials: ",
    );
    assert_eq!(cluster.token_reviews(), reviews + 1);
    // A refused token's message never echoes the token.
    let status = issue(&mut client, Some(&expired)).await.unwrap_err();
    assert!(!status.message().contains(&expired));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_outage_is_unavailable_not_unauthenticated() {
    let cluster = Cluster::start().await;
    let mut client = cluster.client().await;
    let token = cluster.token("shop", "web", TokenSpec::default());
    // More failures than any client-side retry would absorb.
    cluster
        .emu
        .inject_errors(503, 1000, FaultScope::PathContains("tokenreviews".into()));
    // Promptly: podca bounds its wait for the Kubernetes API (5 s) although the kube client
    // would retry 503s with backoff for minutes.
    let started = Instant::now();
    expect_code(
        issue(&mut client, Some(&token)).await,
        Code::Unavailable,
        "cannot check credentials now",
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    // The outage is not remembered as a verdict: once the API is back, the same token works.
    cluster.emu.clear_faults();
    let issued = issue(&mut client, Some(&token)).await.unwrap();
    assert_eq!(issued.spiffe_id, "spiffe://cluster.local/ns/shop/sa/web");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_for_pod_only_for_node_proxies_and_pods_on_their_node() {
    let cluster = Cluster::start().await;
    let emu = &cluster.emu;
    let mut client = cluster.client().await;
    emu.add_node("node-1");
    emu.add_node("node-2");
    for (name, node) in [("web-1", "node-1"), ("web-2", "node-2")] {
        emu.add_pod(&PodFixture {
            namespace: "apps".into(),
            name: name.into(),
            node_name: node.into(),
            service_account: "web".into(),
            ..Default::default()
        });
    }
    let (proxy_ns, proxy_sa) = NODE_PROXY.split_once('/').unwrap();
    cluster.pod(proxy_ns, "node-proxy-x7k2p", "node-1", proxy_sa);
    let on_node_1 = TokenSpec::bound("node-proxy-x7k2p", "node-1");
    let proxy = cluster.token(proxy_ns, proxy_sa, on_node_1);

    // A pod on the proxy's node: a certificate with the pod's identity.
    let issued = issue_for_pod(&mut client, &proxy, "apps", "web-1")
        .await
        .unwrap();
    assert_eq!(issued.spiffe_id, "spiffe://cluster.local/ns/apps/sa/web");
    assert_eq!(
        leaf_uri(&issued.certificate_chain_pem),
        "spiffe://cluster.local/ns/apps/sa/web"
    );
    assert_verifies(&issued.certificate_chain_pem, &issued.trust_anchors_pem);

    // A pod on another node.
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "web-2").await,
        Code::PermissionDenied,
        "pod apps/web-2 does not run on the caller's node node-1",
    );
    // No such pod.
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "web-9").await,
        Code::NotFound,
        "pod apps/web-9 not found",
    );
    // Names that are not Kubernetes names never reach the API.
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "").await,
        Code::InvalidArgument,
        "pod_name \"\" is not a Kubernetes object name",
    );
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "../secrets/x").await,
        Code::InvalidArgument,
        "is not a Kubernetes object name",
    );
    // A service account that is not a node proxy, even with a token naming node-1.
    let workload = cluster.token("apps", "web", TokenSpec::bound("web-1", "node-1"));
    expect_code(
        issue_for_pod(&mut client, &workload, "apps", "web-1").await,
        Code::PermissionDenied,
        "service account apps/web may not request certificates or JWT-SVIDs for other pods",
    );
    // The node proxy's service account with a token bound to no pod names no node.
    let unbound = cluster.token(proxy_ns, proxy_sa, TokenSpec::default());
    expect_code(
        issue_for_pod(&mut client, &unbound, "apps", "web-1").await,
        Code::PermissionDenied,
        "the caller's token names no node",
    );
    // Pod lookups failing is an outage, not a verdict.
    emu.inject_errors(503, 1000, FaultScope::PathContains("/pods/".into()));
    let started = Instant::now();
    expect_code(
        issue_for_pod(&mut client, &proxy, "apps", "web-1").await,
        Code::Unavailable,
        "cannot check the pod now",
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

/// Must-show (#12 item 3): a flood of unauthenticated requests makes at most the configured
/// number of TokenReviews — one per distinct token at most, never more than
/// `max_token_reviews` at once, and a refused token is not asked about again for 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_tokens_makes_bounded_token_reviews() {
    const FLOOD: usize = 100;
    let cluster = Cluster::start_with("max_token_reviews = 2\n").await;
    // Each review takes a while, so that concurrency shows.
    cluster
        .emu
        .set_token_review_delay(Duration::from_millis(300));
    let client = cluster.client().await;

    // The same bad token, FLOOD times at once: one review, shared, then remembered.
    let before = cluster.token_reviews();
    let same = "sa.the-same-bad-token-every-time";
    let calls = (0..FLOOD).map(|_| {
        let mut client = client.clone();
        tokio::spawn(async move { issue(&mut client, Some(same)).await })
    });
    for call in calls.collect::<Vec<_>>() {
        expect_code(
            call.await.unwrap(),
            Code::Unauthenticated,
            "invalid credentials: ",
        );
    }
    assert_eq!(
        cluster.token_reviews() - before,
        1,
        "one review for one token"
    );
    expect_code(
        issue(&mut client.clone(), Some(same)).await,
        Code::Unauthenticated,
        "invalid credentials: ",
    );
    assert_eq!(cluster.token_reviews() - before, 1, "remembered");

    // FLOOD distinct bad tokens at once from one address: it has a share of the 2 review slots
    // (one); every request beyond is refused at once with RESOURCE_EXHAUSTED and costs the API
    // nothing (the global bound across addresses: grpc/src/auth.rs).
    let before = cluster.token_reviews();
    let tokens: Vec<String> = (0..FLOOD).map(|i| format!("sa.bad-token-{i:04}")).collect();
    let calls = tokens.iter().cloned().map(|token| {
        let mut client = client.clone();
        tokio::spawn(async move { issue(&mut client, Some(&token)).await })
    });
    let (mut refused, mut busy) = (0, 0);
    for call in calls.collect::<Vec<_>>() {
        let status = call.await.unwrap().expect_err("a bad token");
        match status.code() {
            Code::Unauthenticated => refused += 1,
            Code::ResourceExhausted => {
                assert!(
                    status
                        .message()
                        .contains("from this address (at most 1 uncached TokenReviews"),
                    "{status:?}"
                );
                busy += 1;
            }
            _ => panic!("{status:?}"),
        }
    }
    let reviews = cluster.token_reviews() - before;
    let counters = cluster.emu.counters();
    assert_eq!(counters.token_reviews_max_in_flight, 1, "{counters:?}");
    assert_eq!(
        reviews, refused,
        "one review per refused token, none for the others"
    );
    assert_eq!(refused + busy, FLOOD as u64);
    // 300 ms a review, one at a time for this address, no queueing: a handful of reviews.
    assert!(reviews <= 12, "{reviews} TokenReviews for {FLOOD} requests");

    // The metrics say so, and the log names each refusal with the peer, never a token.
    let metrics = cluster.metrics();
    for line in [
        "podca_tokenreview_cache_total{result=\"negative_hit\"}",
        "podca_tokenreview_requests_total{result=\"refused\"}",
        "podca_grpc_refusals_total{reason=\"tokenreview_source_busy\"}",
        "podca_tokenreview_duration_seconds_count",
    ] {
        assert!(metrics.contains(line), "{line} missing in:\n{metrics}");
    }
    let log = cluster.log_text();
    assert!(log.contains("gRPC request refused"), "{log}");
    assert!(log.contains("peer=127.0.0.1:"), "{log}");
    assert!(
        log.contains("reason=\"tokenreview_source_busy\"")
            || log.contains("reason=tokenreview_source_busy"),
        "{log}"
    );
    for token in tokens.iter().map(String::as_str).chain([same]) {
        let secret = token.trim_start_matches("sa.");
        assert!(!log.contains(secret), "the log shows the token {token}");
    }
}
