//! Traces over OTLP (issue #44): `podca serve` against the API emulator exports the span tree
//! of a PodCertificateRequest's decision and of a gRPC issuance to a test collector built from
//! the public OTLP definitions (tests/proto), honours a caller's `traceparent`, exports no
//! token, and with the collector down issues as before and counts the spans it drops.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use podca_proto::podca::v1::IssueCertificateRequest;
use podca_tests::cluster::{Cluster, PODCA_USER};
use podca_tests::emulator::{PolicyRule, Res, ServiceAccountToken, Subject};
use podca_tests::process::{
    DevOptions, DevProcess, csr_for, free_port, podca_binary, podca_bundle,
};
use serde_json::json;

use podca_tests::otlp;

use otlp::opentelemetry::proto::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use otlp::opentelemetry::proto::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use otlp::opentelemetry::proto::common::v1::any_value::Value;

const SIGNER: &str = "example.com/workload";
const NAMESPACE: &str = "payments";

/// One exported span, flattened: what the assertions need.
#[derive(Debug, Clone)]
struct Exported {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    attributes: HashMap<String, String>,
}

/// The test collector: keeps every span it is sent, and the raw bytes of every request.
#[derive(Debug, Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Exported>>>,
    raw: Arc<Mutex<Vec<u8>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        self.raw
            .lock()
            .unwrap()
            .extend(prost::Message::encode_to_vec(&request));
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref()))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(Exported {
                        service: service.clone(),
                        name: span.name,
                        trace_id: span.trace_id,
                        span_id: span.span_id,
                        parent_span_id: span.parent_span_id,
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn text(value: Option<&otlp::opentelemetry::proto::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

impl Collector {
    /// Serves OTLP/gRPC on a loopback port (plaintext: a test collector on loopback).
    async fn start() -> (Collector, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        (collector, port)
    }

    /// [`Collector::start`] over TLS, with a certificate for 127.0.0.1 from a fresh CA; also
    /// the CA (PEM).
    async fn start_tls() -> (Collector, u16, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &rcgen::Issuer::from_params(&ca_params, &ca_key))
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        let tls = tonic::transport::ServerTlsConfig::new().identity(
            tonic::transport::Identity::from_pem(leaf.pem(), key.serialize_pem()),
        );
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .tls_config(tls)
                .unwrap()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        (collector, port, ca.pem())
    }

    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until a span named `name` whose attributes include `with` has arrived, and returns
    /// every span of its trace.
    async fn trace_of(&self, name: &str, with: (&str, &str)) -> (Exported, Vec<Exported>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if let Some(root) = spans.iter().find(|s| {
                s.name == name && s.attributes.get(with.0).map(String::as_str) == Some(with.1)
            }) {
                let trace: Vec<_> = spans
                    .iter()
                    .filter(|s| s.trace_id == root.trace_id)
                    .cloned()
                    .collect();
                return (root.clone(), trace);
            }
            assert!(
                Instant::now() < deadline,
                "no {name} span with {with:?}; got {:#?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The single child of `parent` named `name` in `trace`.
fn child<'a>(trace: &'a [Exported], parent: &Exported, name: &str) -> &'a Exported {
    let children: Vec<_> = trace
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.name == name)
        .collect();
    assert_eq!(
        children.len(),
        1,
        "one {name} under {}: {trace:#?}",
        parent.name
    );
    children[0]
}

struct Setup {
    cluster: Cluster,
    ca_dir: PathBuf,
    config: PathBuf,
}

async fn setup(tracing: &str) -> Setup {
    let (cluster, ca_dir) = Cluster::for_serve(SIGNER, NAMESPACE).await;
    cluster.emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
    );
    let dir = cluster.dir.path().to_owned();
    let config = dir.join("podca.toml");
    std::fs::write(
        &config,
        format!(
            "[ca]\ndir = {:?}\n\n[signers.\"{SIGNER}\"]\ntrust_domain = \"cluster.local\"\n\n\
             [grpc]\n{}\n\n[tracing]\n{tracing}\n",
            ca_dir.display().to_string(),
            podca_tests::tls::GRPC_TLS_CONFIG,
        ),
    )
    .unwrap();
    Setup {
        cluster,
        ca_dir,
        config,
    }
}

/// A `podca serve` process logging to a file; killed when dropped.
struct Serve {
    child: Child,
    admin: u16,
    grpc: u16,
    log: PathBuf,
}

impl Serve {
    fn start(s: &Setup) -> Serve {
        let admin = free_port();
        let grpc = free_port();
        let log = s.cluster.dir.path().join("serve.log");
        let child = Command::new(podca_binary())
            .args(["serve", "--config"])
            .arg(&s.config)
            .arg("--kubeconfig")
            .arg(&s.cluster.kubeconfig)
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .env("PODCA_LOG", "info")
            .env_remove("POD_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut serve = Serve {
            child,
            admin,
            grpc,
            log,
        };
        podca_tests::process::wait_listening(&mut serve.child, grpc, &serve.log);
        serve
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = podca_tests::process::http_get(self.admin, "/metrics")?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- {} ---\n{log}", self.log.display());
        }
    }
}

fn token(s: &Setup, service_account: &str) -> String {
    s.cluster
        .emu
        .add_service_account_token(ServiceAccountToken {
            namespace: NAMESPACE.into(),
            service_account: service_account.into(),
            service_account_uid: podca_tests::emulator::new_uid(),
            audiences: vec!["podca".into()],
            expires: s.cluster.emu.now() + time::Duration::hours(1),
            pod_name: None,
            pod_uid: None,
            node_name: None,
            node_uid: None,
            credential_id: podca_tests::emulator::new_uid(),
        })
}

fn issue_request(
    token: &str,
    traceparent: Option<&str>,
) -> tonic::Request<IssueCertificateRequest> {
    let mut request = tonic::Request::new(IssueCertificateRequest {
        csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
        ..Default::default()
    });
    let metadata = request.metadata_mut();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    if let Some(traceparent) = traceparent {
        metadata.insert("traceparent", traceparent.parse().unwrap());
    }
    request
}

fn file_pcr(s: &Setup, name: &str) {
    let key = rcgen::KeyPair::generate().unwrap();
    s.cluster.emu.seed_object(
        Res::Pcr,
        json!({
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "signerName": SIGNER, "podName": format!("pod-{name}"),
                "podUID": podca_tests::emulator::new_uid(),
                "serviceAccountName": "api", "serviceAccountUID": "sa-uid",
                "nodeName": "node-a", "nodeUID": "node-uid", "maxExpirationSeconds": 86400,
                "stubPKCS10Request": base64::engine::general_purpose::STANDARD.encode(csr_for(&key)),
            },
            "status": {},
        }),
    );
}

/// The leaf serial of PCR `name` once it is Issued (hex, as the ledger writes it).
async fn issued_serial(s: &Setup, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pcr = s.cluster.emu.get_object(Res::Pcr, NAMESPACE, name).unwrap();
        if let Some(chain) = pcr["status"]["certificateChain"].as_str() {
            let block = pem::parse_many(chain).unwrap().remove(0);
            let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).unwrap();
            return cert
                .raw_serial()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
        }
        assert!(Instant::now() < deadline, "{name} was never issued: {pcr}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pcr_and_a_grpc_issuance_arrive_as_span_trees() {
    let (collector, port) = Collector::start().await;
    let s = setup(&format!(
        "otlp_endpoint = \"http://127.0.0.1:{port}\"\nservice_name = \"podca-test\""
    ))
    .await;
    let serve = Serve::start(&s);

    // A PodCertificateRequest: one decision span, its children the policy, the signature, the
    // ledger commit and the status write.
    file_pcr(&s, "traced");
    let serial = issued_serial(&s, "traced").await;
    let (pcr, trace) = collector.trace_of("pcr", ("name", "traced")).await;
    assert!(pcr.parent_span_id.is_empty(), "a root: {pcr:#?}");
    assert_eq!(pcr.service, "podca-test");
    for (key, value) in [
        ("namespace", NAMESPACE),
        ("signer", SIGNER),
        ("service_account", "api"),
        ("outcome", "issued"),
        ("reason", "Issued"),
    ] {
        assert_eq!(
            pcr.attributes.get(key).map(String::as_str),
            Some(value),
            "{key}: {pcr:#?}"
        );
    }
    child(&trace, &pcr, "policy");
    let signing = child(&trace, &pcr, "signing");
    assert_eq!(signing.attributes["key_type"], "ECDSAP256");
    assert_eq!(signing.attributes["serial"], serial);
    child(&trace, &pcr, "ledger_commit");
    child(&trace, &pcr, "status_write");

    // gRPC IssueCertificate with the caller's W3C trace context: the handler's span is a
    // child of the caller's span, in the caller's trace.
    let anchors = podca_bundle(&s.ca_dir);
    let mut client = podca_tests::tls::client(serve.grpc, &anchors).await;
    let secret = token(&s, "api");
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let issued = client
        .issue_certificate(issue_request(
            &secret,
            Some(&format!("00-{caller_trace}-{caller_span}-01")),
        ))
        .await
        .unwrap()
        .into_inner();
    let (rpc, trace) = collector
        .trace_of("issue_certificate", ("caller", "payments/api"))
        .await;
    assert_eq!(hex(&rpc.trace_id), caller_trace);
    assert_eq!(hex(&rpc.parent_span_id), caller_span);
    assert_eq!(rpc.attributes["outcome"], "OK");
    assert_eq!(rpc.attributes["signer"], "");
    child(&trace, &rpc, "token_review");
    child(&trace, &rpc, "policy");
    let signing = child(&trace, &rpc, "signing");
    assert_eq!(signing.attributes["serial"], issued.serial);
    child(&trace, &rpc, "ledger_commit");

    // A refusal carries its reason; a call without `traceparent` starts a trace of its own.
    let refused = client
        .issue_certificate(issue_request("not-a-token", None))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let (rpc, _) = collector
        .trace_of("issue_certificate", ("outcome", "UNAUTHENTICATED"))
        .await;
    assert!(rpc.parent_span_id.is_empty());
    assert_ne!(hex(&rpc.trace_id), caller_trace);
    assert!(!rpc.attributes["reason"].is_empty(), "{rpc:#?}");

    // No token in anything exported: not the one that worked, not the one refused.
    let raw = collector.raw.lock().unwrap().clone();
    for secret in [secret.as_bytes(), b"not-a-token".as_slice()] {
        assert!(
            !raw.windows(secret.len()).any(|w| w == secret),
            "a token reached the collector"
        );
    }
    assert!(serve.metric("podca_trace_spans_exported_total").unwrap() > 0.0);
    assert_eq!(serve.metric("podca_trace_spans_dropped_total"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_collector_down_issuance_works_and_dropped_spans_are_counted() {
    // Nothing listens there.
    let port = free_port();
    let s = setup(&format!(
        "otlp_endpoint = \"http://127.0.0.1:{port}\"\nexport_timeout_seconds = 2"
    ))
    .await;
    let serve = Serve::start(&s);
    let anchors = podca_bundle(&s.ca_dir);
    let mut client = podca_tests::tls::client(serve.grpc, &anchors).await;
    let secret = token(&s, "api");
    for _ in 0..5 {
        let started = Instant::now();
        client
            .issue_certificate(issue_request(&secret, None))
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "held up by the exporter"
        );
    }
    file_pcr(&s, "untraced");
    issued_serial(&s, "untraced").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dropped = serve
            .metric("podca_trace_spans_dropped_total")
            .unwrap_or(0.0);
        // Five RPCs and a PCR: at least their root spans.
        if dropped >= 6.0 {
            break;
        }
        assert!(Instant::now() < deadline, "dropped spans: {dropped}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(serve.metric("podca_trace_spans_exported_total"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podca_dev_exports_the_trace_of_an_issuance() {
    let (collector, port) = Collector::start().await;
    let config = format!("[tracing]\notlp_endpoint = \"http://127.0.0.1:{port}\"\n");
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        env: vec![("PODCA_LOG", "info".into())],
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    let issued = client
        .issue_certificate(IssueCertificateRequest {
            csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (rpc, trace) = collector
        .trace_of("issue_certificate", ("outcome", "OK"))
        .await;
    assert!(rpc.parent_span_id.is_empty(), "a root: {rpc:#?}");
    assert_eq!(rpc.service, "podca");
    child(&trace, &rpc, "policy");
    let signing = child(&trace, &rpc, "signing");
    assert_eq!(signing.attributes["serial"], issued.serial);
    child(&trace, &rpc, "ledger_commit");
    assert!(dev.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_collector_is_trusted_through_ca_file() {
    let (collector, port, ca_pem) = Collector::start_tls().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("collector-ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let config = format!(
        "[tracing]\notlp_endpoint = \"https://127.0.0.1:{port}\"\nca_file = {:?}\n",
        ca_file.display().to_string()
    );
    let dev = DevProcess::start_with(DevOptions {
        config: Some(&config),
        env: vec![("PODCA_LOG", "info".into())],
        ..Default::default()
    });
    let mut client = dev.tcp_client().await;
    let issued = client
        .issue_certificate(IssueCertificateRequest {
            csr: csr_for(&rcgen::KeyPair::generate().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (rpc, trace) = collector
        .trace_of("issue_certificate", ("outcome", "OK"))
        .await;
    assert_eq!(
        child(&trace, &rpc, "signing").attributes["serial"],
        issued.serial
    );
    assert!(dev.stop().success());
}
