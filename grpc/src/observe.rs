//! Observability at the gRPC edge: per-method metrics by status code and latency, one log line
//! per refusal (peer, method, code, reason; never the token), the `grpc.health.v1` health
//! service and server reflection.

use std::future::Future;
use std::time::Instant;

use podca_authority::metrics::{GrpcCallLabels, GrpcMetrics, MethodLabels, ReasonLabels};
use tonic::{Code, Status};

use super::auth::Peer;
use super::errors::ApiError;

/// Runs one handler: counts its answer by method and code, observes its latency, and logs a
/// refusal once, with the peer and the reason.
pub async fn observed<T>(
    metrics: &GrpcMetrics,
    method: &'static str,
    peer: Peer,
    handler: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, Status> {
    let started = Instant::now();
    let result = handler.await;
    let code = match &result {
        Ok(_) => Code::Ok,
        Err(e) => e.code(),
    };
    // The handler span's outcome (traces): declared `Empty` by the handlers that decide.
    let span = tracing::Span::current();
    span.record("outcome", code_name(code));
    if let Err(e) = &result {
        span.record("reason", e.reason());
    }
    metrics
        .request_seconds
        .get_or_create(&MethodLabels { method })
        .observe(started.elapsed().as_secs_f64());
    metrics
        .requests
        .get_or_create(&GrpcCallLabels {
            method,
            code: code_name(code),
        })
        .inc();
    result.map_err(|e| {
        let reason = e.reason();
        metrics
            .refusals
            .get_or_create(&ReasonLabels { reason })
            .inc();
        // Status messages never hold a token (errors.rs); the peer is an address or a uid.
        log_refusal(method, &peer, code, reason, &e);
        Status::from(e)
    })
}

fn log_refusal(method: &str, peer: &Peer, code: Code, reason: &str, error: &ApiError) {
    let peer = match peer {
        Peer::Tcp(addr) => addr.to_string(),
        Peer::Unix { uid: Some(uid) } => format!("unix:uid={uid}"),
        Peer::Unix { uid: None } => "unix".to_owned(),
        Peer::Unknown => "unknown".to_owned(),
    };
    // Server faults are worth a warning; a caller's mistake or an outage it retries is info.
    if code == Code::Internal {
        tracing::warn!(%peer, method, code = code_name(code), reason, error = %error, "gRPC request refused");
    } else {
        tracing::info!(%peer, method, code = code_name(code), reason, error = %error, "gRPC request refused");
    }
}

/// The canonical name of a status code, as grpc-go and the gRPC docs spell it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// `grpc.health.v1.Health`: SERVING for the whole server (`""`), for `podca.v1.PodCA` and
/// `istio.v1.auth.IstioCertificateService` once
/// the server runs (the CA is loaded before an [`crate::Api`] exists), NOT_SERVING from the
/// moment `shutdown` says the process is stopping, so probes fail while connections drain.
pub async fn health_service(
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    use podca_proto::istio::v1::auth::istio_certificate_service_server::IstioCertificateServiceServer;
    use podca_proto::podca::v1::pod_ca_server::PodCaServer;
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<PodCaServer<super::podca_service::PodCaService>>()
        .await;
    reporter
        .set_serving::<IstioCertificateServiceServer<super::istio::IstioService>>()
        .await;
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
        reporter
            .set_not_serving::<PodCaServer<super::podca_service::PodCaService>>()
            .await;
        reporter
            .set_not_serving::<IstioCertificateServiceServer<super::istio::IstioService>>()
            .await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    });
    service
}

/// Server reflection (`grpc.reflection.v1` and `v1alpha`) over podca's descriptors, so that
/// `grpcurl` works without the .proto files.
pub fn reflection_services() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(podca_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// The health and reflection services, for every gRPC server podca runs beside its own APIs.
/// Reflection that cannot be built (a bug in the embedded descriptors) is logged and left out.
pub async fn edge_routes(api: &crate::Api) -> tonic::service::Routes {
    let mut routes =
        tonic::service::Routes::default().add_service(health_service(api.shutdown_signal()).await);
    match reflection_services() {
        Ok((v1, v1alpha)) => routes = routes.add_service(v1).add_service(v1alpha),
        Err(e) => tracing::error!(error = %e, "gRPC server reflection is unavailable"),
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_canonical_name() {
        for (code, name) in [
            (Code::Ok, "OK"),
            (Code::Unauthenticated, "UNAUTHENTICATED"),
            (Code::PermissionDenied, "PERMISSION_DENIED"),
            (Code::ResourceExhausted, "RESOURCE_EXHAUSTED"),
        ] {
            assert_eq!(code_name(code), name);
        }
    }

    #[tokio::test]
    async fn refusals_are_counted_by_method_code_and_reason() {
        let metrics = GrpcMetrics::default();
        let peer = Peer::Tcp("10.1.2.3:4000".parse().unwrap());
        let ok: Result<u8, Status> = observed(&metrics, "m/A", peer, async { Ok(1) }).await;
        assert_eq!(ok.unwrap(), 1);
        let refused: Result<u8, Status> = observed(&metrics, "m/A", peer, async {
            Err(ApiError::SignerNotAllowed("x.example/y".into()))
        })
        .await;
        assert_eq!(refused.unwrap_err().code(), Code::PermissionDenied);
        let count = |code| {
            metrics
                .requests
                .get_or_create(&GrpcCallLabels {
                    method: "m/A",
                    code,
                })
                .get()
        };
        assert_eq!(count("OK"), 1);
        assert_eq!(count("PERMISSION_DENIED"), 1);
        assert_eq!(
            metrics
                .refusals
                .get_or_create(&ReasonLabels {
                    reason: "signer_not_allowed"
                })
                .get(),
            1
        );
    }
}
