//! Observability at the gRPC edge (#12 item 6), against the real `podca serve` over TLS
//! (harness: `grpc_serve/mod.rs`): `grpc.health.v1` answers SERVING without credentials,
//! server reflection lists the services and resolves their descriptors (what `grpcurl`
//! needs), and `/metrics` counts requests by method and code.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

mod grpc_serve;

use grpc_serve::{Cluster, TokenSpec, expect_code, issue};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_serving_without_credentials() {
    let cluster = Cluster::start().await;
    let mut health = HealthClient::new(cluster.channel().await);
    for service in [
        "",
        "podca.v1.PodCA",
        "istio.v1.auth.IstioCertificateService",
    ] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_and_describes_the_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let cluster = Cluster::start().await;
    let mut reflection = ServerReflectionClient::new(cluster.channel().await);
    let ask = |message: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(message),
    };
    let requests = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "podca.v1.PodCA".into(),
        )),
        ask(MessageRequest::FileContainingSymbol(
            "podca.v1.IssueCertificateResponse".into(),
        )),
    ];
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("a service list first");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        // Every service of the embedded descriptors (the Workload API is served on the Unix
        // socket of `podca dev`) and the health service; each reflection version lists itself.
        [
            "SpiffeWorkloadAPI",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "istio.v1.auth.IstioCertificateService",
            "podca.v1.PodCA",
        ]
    );
    for _ in 0..2 {
        match answers.message().await.unwrap().unwrap().message_response {
            Some(MessageResponse::FileDescriptorResponse(files)) => {
                assert!(!files.file_descriptor_proto.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    // v1alpha too (older grpcurl releases ask it).
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as Alpha;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest as AlphaRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse as AlphaResponse;
    let mut alpha = Alpha::new(cluster.channel().await);
    let request = tonic_reflection::pb::v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(AlphaRequest::ListServices(String::new())),
    };
    let answer = alpha
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    let Some(AlphaResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("{answer:?}");
    };
    assert!(list.service.iter().any(|s| s.name == "podca.v1.PodCA"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_by_method_and_code() {
    let cluster = Cluster::start().await;
    let mut client = cluster.client().await;
    let token = cluster.token("shop", "web", TokenSpec::default());
    issue(&mut client, Some(&token)).await.unwrap();
    issue(&mut client, Some(&token)).await.unwrap();
    expect_code(
        issue(&mut client, None).await,
        Code::Unauthenticated,
        "no credentials",
    );
    let metrics = cluster.metrics();
    for line in [
        "podca_grpc_requests_total{method=\"podca.v1.PodCA/IssueCertificate\",code=\"OK\"} 2",
        "podca_grpc_requests_total{method=\"podca.v1.PodCA/IssueCertificate\",code=\"UNAUTHENTICATED\"} 1",
        "podca_grpc_request_duration_seconds_count{method=\"podca.v1.PodCA/IssueCertificate\"} 3",
        "podca_grpc_refusals_total{reason=\"no_credentials\"} 1",
        "podca_tokenreview_requests_total{result=\"authenticated\"} 1",
        "podca_tokenreview_cache_total{result=\"hit\"} 1",
        "podca_tokenreview_cache_total{result=\"miss\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing in:\n{metrics}");
    }
    // The refusal is logged once, with the peer and the reason; the token never is.
    let log = cluster.log_text();
    assert_eq!(log.matches("gRPC request refused").count(), 1, "{log}");
    assert!(log.contains("peer=127.0.0.1:"), "{log}");
    assert!(!log.contains(token.trim_start_matches("sa.")), "{log}");
}
