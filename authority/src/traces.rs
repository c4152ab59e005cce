//! Traces (OpenTelemetry, issue #44): podca's `tracing` spans exported over OTLP/gRPC.
//!
//! Off by default. The subscriber is built before the configuration is read
//! (`podca`'s `init_logging`), so it carries an empty [`slot`]; [`start`] fills it with the
//! OpenTelemetry layer when `[tracing] otlp_endpoint` is set. Off, the slot stays empty: no
//! layer, no exporter, no queue, no task.
//!
//! Only spans are exported, never log events (they stay in the log): a span's attributes are
//! the fields podca gives it (signer, namespace, service account, outcome, reason, key type,
//! serial), never a token, key, PIN or CSR.
//!
//! Spans go through a bounded queue to one export task; a full queue or a failed export drops
//! them and counts them (`podca_trace_spans_dropped_total`), so a collector that is down or slow
//! never holds an issuance up.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures_util::future::Either;
use opentelemetry::context::{FutureExt as _, WithContext};
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor,
};
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use tokio::sync::mpsc;
use tracing::Subscriber;
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::reload;

use crate::runtime::{Runtime, Stage};

/// `[tracing]`: where spans go, and how many.
///
/// ```toml
/// [tracing]
/// otlp_endpoint = "https://otel-collector.observability:4317"
/// ca_file = "/etc/podca/collector-ca.pem"   # required for https
/// sampling_ratio = 0.1                       # of new traces; a caller's decision is kept
/// service_name = "podca"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(try_from = "RawTracingConfig")]
pub struct TracingConfig {
    /// `None`: traces are off (the default).
    pub exporter: Option<OtlpExporter>,
}

/// Where and how spans are exported (`[tracing]` with an `otlp_endpoint`).
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpExporter {
    /// The collector's OTLP/gRPC endpoint, `http://` or `https://`.
    pub endpoint: String,
    /// The collector's CA (PEM) for an `https://` endpoint; podca carries no system roots.
    pub ca_file: Option<PathBuf>,
    /// The share of new traces sampled, in [0, 1]; a caller's `traceparent` decides its own.
    pub sampling_ratio: f64,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Spans waiting for export at most; more are dropped (and counted).
    pub max_queue: usize,
    /// Spans per export call at most.
    pub max_batch: usize,
    /// One export call's deadline.
    pub export_timeout: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTracingConfig {
    otlp_endpoint: Option<String>,
    #[serde(default = "default_protocol")]
    protocol: String,
    ca_file: Option<PathBuf>,
    #[serde(default = "default_sampling_ratio")]
    sampling_ratio: f64,
    #[serde(default = "default_service_name")]
    service_name: String,
    #[serde(default = "default_max_queue")]
    max_queue: usize,
    #[serde(default = "default_max_batch")]
    max_batch: usize,
    #[serde(default = "default_export_timeout_seconds")]
    export_timeout_seconds: u64,
}

fn default_protocol() -> String {
    "grpc".into()
}
fn default_sampling_ratio() -> f64 {
    1.0
}
fn default_service_name() -> String {
    "podca".into()
}
fn default_max_queue() -> usize {
    2048
}
fn default_max_batch() -> usize {
    512
}
fn default_export_timeout_seconds() -> u64 {
    10
}

/// A `[tracing]` table podca cannot use.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TracingConfigError {
    #[error(
        "[tracing] otlp_endpoint {0:?}: expected http://host:port or https://host:port \
         (the collector's OTLP/gRPC port, usually 4317)"
    )]
    Endpoint(String),
    #[error("[tracing] protocol {0:?}: only \"grpc\" (OTLP over gRPC) is supported")]
    Protocol(String),
    #[error("[tracing] sampling_ratio {0}: expected a number from 0 to 1")]
    SamplingRatio(f64),
    #[error("[tracing] otlp_endpoint is https: ca_file (the collector's CA, PEM) is required")]
    MissingCaFile,
    #[error("[tracing] ca_file is set but otlp_endpoint is not https")]
    CaFileWithoutTls,
    #[error("[tracing] service_name must not be empty")]
    ServiceName,
    #[error("[tracing] {0} must be at least 1")]
    Zero(&'static str),
    #[error("[tracing] {0} is set but otlp_endpoint is not: traces are off")]
    WithoutEndpoint(&'static str),
}

impl TryFrom<RawTracingConfig> for TracingConfig {
    type Error = TracingConfigError;

    fn try_from(raw: RawTracingConfig) -> Result<Self, Self::Error> {
        let RawTracingConfig {
            otlp_endpoint,
            protocol,
            ca_file,
            sampling_ratio,
            service_name,
            max_queue,
            max_batch,
            export_timeout_seconds,
        } = raw;
        if protocol != "grpc" {
            return Err(TracingConfigError::Protocol(protocol));
        }
        if !(0.0..=1.0).contains(&sampling_ratio) {
            return Err(TracingConfigError::SamplingRatio(sampling_ratio));
        }
        let Some(endpoint) = otlp_endpoint else {
            if ca_file.is_some() {
                return Err(TracingConfigError::WithoutEndpoint("ca_file"));
            }
            return Ok(TracingConfig::default());
        };
        let tls = match endpoint_scheme(&endpoint) {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(TracingConfigError::Endpoint(endpoint)),
        };
        match (tls, &ca_file) {
            (true, None) => return Err(TracingConfigError::MissingCaFile),
            (false, Some(_)) => return Err(TracingConfigError::CaFileWithoutTls),
            _ => {}
        }
        if service_name.trim().is_empty() {
            return Err(TracingConfigError::ServiceName);
        }
        if max_queue == 0 {
            return Err(TracingConfigError::Zero("max_queue"));
        }
        if max_batch == 0 {
            return Err(TracingConfigError::Zero("max_batch"));
        }
        if export_timeout_seconds == 0 {
            return Err(TracingConfigError::Zero("export_timeout_seconds"));
        }
        Ok(TracingConfig {
            exporter: Some(OtlpExporter {
                endpoint,
                ca_file,
                sampling_ratio,
                service_name,
                max_queue,
                max_batch: max_batch.min(max_queue),
                export_timeout: Duration::from_secs(export_timeout_seconds),
            }),
        })
    }
}

/// `http` or `https` when `endpoint` is such a URL with a host, else `None`.
fn endpoint_scheme(endpoint: &str) -> Option<&'static str> {
    let uri: http::Uri = endpoint.parse().ok()?;
    uri.host().filter(|h| !h.is_empty())?;
    match uri.scheme_str()? {
        "http" => Some("http"),
        "https" => Some("https"),
        _ => None,
    }
}

/// Traces could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceStartError {
    #[error("[tracing] ca_file {path}: {source}")]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("[tracing] the OTLP exporter: {0}")]
    Exporter(String),
    #[error(
        "[tracing] the log subscriber has no trace slot (traces need `podca serve` or `podca dev`)"
    )]
    NoSlot,
}

/// The layer type the subscriber carries (see [`slot`]).
pub type Slot<S> = reload::Layer<Option<Box<dyn Layer<S> + Send + Sync>>, S>;

type Installer = Box<dyn FnOnce(SdkTracer) -> bool + Send>;

/// How [`start`] fills the slot; set once, by [`slot`].
static INSTALLER: Mutex<Option<Installer>> = Mutex::new(None);

/// Whether spans are exported: a caller's `traceparent` is read only then.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The empty place in the subscriber `S` that [`start`] fills when traces are on. Call once,
/// where the subscriber is built.
pub fn slot<S>() -> Slot<S>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let (layer, handle) = reload::Layer::new(None);
    let install: Installer = Box::new(move |tracer: SdkTracer| {
        let otel = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_target(false)
            .with_level(false);
        let spans_only: Box<dyn Layer<S> + Send + Sync> = Box::new(SpansOnly(otel));
        handle.reload(Some(spans_only)).is_ok()
    });
    *INSTALLER.lock().unwrap_or_else(PoisonError::into_inner) = Some(install);
    layer
}

/// A layer that sees spans and never events: a log line's fields (an error's text) stay in
/// the log and out of the exported trace.
struct SpansOnly<L>(L);

impl<S, L> Layer<S> for SpansOnly<L>
where
    S: Subscriber,
    L: Layer<S>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        self.0.on_new_span(attrs, id, ctx);
    }
    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        self.0.on_record(span, values, ctx);
    }
    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        self.0.on_follows_from(span, follows, ctx);
    }
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.0.on_enter(id, ctx);
    }
    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        self.0.on_exit(id, ctx);
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        self.0.on_close(id, ctx);
    }
    fn on_id_change(&self, old: &Id, new: &Id, ctx: Context<'_, S>) {
        self.0.on_id_change(old, new, ctx);
    }
}

/// The trace exporter's counters (`podca_trace_*`).
#[derive(Debug, Clone, Default)]
pub struct TraceMetrics {
    /// Spans handed to the collector.
    pub exported: Counter,
    /// Spans lost: the queue was full, or the collector refused or did not answer.
    pub dropped: Counter,
}

/// The trace exporter component: when `config` names a collector, exports every sampled span
/// there from now on through the exporter `build` makes (`podca_grpc::otlp::exporter`); off,
/// does nothing at all. Call inside the Tokio runtime.
pub fn start<E, B>(
    rt: &mut Runtime,
    config: &TracingConfig,
    build: B,
) -> Result<(), TraceStartError>
where
    E: SpanExporter + 'static,
    B: FnOnce(&OtlpExporter) -> Result<E, TraceStartError>,
{
    let Some(exporter_config) = &config.exporter else {
        return Ok(());
    };
    let metrics = rt.metrics().register_component("trace", |registry| {
        let metrics = TraceMetrics::default();
        registry.register(
            "spans_exported",
            "Spans handed to the OTLP collector",
            metrics.exported.clone(),
        );
        registry.register(
            "spans_dropped",
            "Spans dropped: the export queue was full, or the collector refused or did not answer",
            metrics.dropped.clone(),
        );
        metrics
    });
    let resource = Resource::builder_empty()
        .with_service_name(exporter_config.service_name.clone())
        .build();
    let mut exporter = build(exporter_config)?;
    exporter.set_resource(&resource);
    let (provider, queue) = provider(exporter_config, resource, metrics.clone());
    let installer = INSTALLER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .ok_or(TraceStartError::NoSlot)?;
    if !installer(provider.tracer("podca")) {
        return Err(TraceStartError::NoSlot);
    }
    ENABLED.store(true, Ordering::Release);
    tracing::info!(
        endpoint = %exporter_config.endpoint,
        sampling_ratio = exporter_config.sampling_ratio,
        "exporting traces over OTLP/gRPC"
    );
    let max_batch = exporter_config.max_batch;
    let timeout = exporter_config.export_timeout;
    rt.spawn(Stage::Support, "trace exporter", move |stop| {
        export_loop(exporter, queue, provider, metrics, max_batch, timeout, stop)
    });
    Ok(())
}

fn provider(
    config: &OtlpExporter,
    resource: Resource,
    metrics: TraceMetrics,
) -> (SdkTracerProvider, mpsc::Receiver<SpanData>) {
    let (tx, rx) = mpsc::channel(config.max_queue);
    let provider = SdkTracerProvider::builder()
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            config.sampling_ratio,
        ))))
        .with_resource(resource)
        .with_span_processor(QueueProcessor {
            queue: tx,
            dropped: metrics.dropped,
        })
        .build();
    (provider, rx)
}

/// Hands each ended span to the export task, or drops it (counted) when the queue is full.
#[derive(Debug)]
struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
    dropped: Counter,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Exports what the queue holds, a batch at a time, until stop; then what is left, once.
async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut queue: mpsc::Receiver<SpanData>,
    provider: SdkTracerProvider,
    metrics: TraceMetrics,
    max_batch: usize,
    timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut batch = Vec::with_capacity(max_batch);
    let failures = AtomicU64::new(0);
    loop {
        tokio::select! {
            received = queue.recv_many(&mut batch, max_batch) => {
                if received == 0 {
                    break;
                }
            }
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
        export(&exporter, &mut batch, &metrics, timeout, &failures).await;
    }
    // The last spans, within one export deadline.
    queue.close();
    while queue.recv_many(&mut batch, max_batch).await > 0 {
        export(&exporter, &mut batch, &metrics, timeout, &failures).await;
    }
    let _ = provider.shutdown();
    let _ = exporter.shutdown();
}

async fn export<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    metrics: &TraceMetrics,
    timeout: Duration,
    failures: &AtomicU64,
) {
    let spans = std::mem::take(batch);
    let count = spans.len() as u64;
    let outcome = tokio::time::timeout(timeout, exporter.export(spans)).await;
    match outcome {
        Ok(Ok(())) => {
            metrics.exported.inc_by(count);
            failures.store(0, Ordering::Relaxed);
        }
        Ok(Err(e)) => {
            metrics.dropped.inc_by(count);
            // One warning when the collector goes away, not one per batch.
            if failures.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(error = %e, "the trace collector refused spans; dropping them");
            }
        }
        Err(_) => {
            metrics.dropped.inc_by(count);
            if failures.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    ?timeout,
                    "the trace collector did not answer; dropping spans"
                );
            }
        }
    }
}

/// The tower layer that makes a gRPC caller's W3C trace context (`traceparent`, `tracestate`)
/// the parent of the handler's span (`Server::layer`). With traces off it reads no header.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContextLayer;

impl<S> tower_layer::Layer<S> for TraceContextLayer {
    type Service = TraceContextService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TraceContextService { inner }
    }
}

/// See [`TraceContextLayer`].
#[derive(Debug, Clone)]
pub struct TraceContextService<S> {
    inner: S,
}

impl<S, B> tower_service::Service<http::Request<B>> for TraceContextService<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, WithContext<S::Future>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match caller_context(request.headers()) {
            Some(parent) => Either::Right(self.inner.call(request).with_context(parent)),
            None => Either::Left(self.inner.call(request)),
        }
    }
}

/// The caller's trace context, when traces are on and the request carries a `traceparent`.
pub fn caller_context(headers: &http::HeaderMap) -> Option<opentelemetry::Context> {
    if !ENABLED.load(Ordering::Acquire) || !headers.contains_key("traceparent") {
        return None;
    }
    let context = TraceContextPropagator::new().extract(&Headers(headers));
    use opentelemetry::trace::TraceContextExt as _;
    context.span().span_context().is_valid().then_some(context)
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<TracingConfig, String> {
        toml::from_str::<TracingConfig>(toml_text).map_err(|e| e.to_string())
    }

    #[test]
    fn off_unless_an_endpoint_is_set() {
        assert_eq!(parse(""), Ok(TracingConfig::default()));
        assert_eq!(parse("sampling_ratio = 0.5"), Ok(TracingConfig::default()));
        let on = parse("otlp_endpoint = \"http://collector:4317\"\nsampling_ratio = 0.25")
            .expect("valid")
            .exporter
            .expect("on");
        assert_eq!(on.endpoint, "http://collector:4317");
        assert_eq!(on.sampling_ratio, 0.25);
        assert_eq!(on.service_name, "podca");
        assert_eq!((on.max_queue, on.max_batch), (2048, 512));
    }

    #[test]
    fn each_mistake_has_its_own_message() {
        let cases = [
            (
                "otlp_endpoint = \"collector:4317\"",
                "expected http://host:port",
            ),
            (
                "otlp_endpoint = \"ftp://collector:4317\"",
                "expected http://host:port",
            ),
            (
                "otlp_endpoint = \"http://c:4317\"\nprotocol = \"http/protobuf\"",
                "only \"grpc\"",
            ),
            (
                "otlp_endpoint = \"http://c:4317\"\nsampling_ratio = 1.5",
                "from 0 to 1",
            ),
            (
                "otlp_endpoint = \"https://c:4317\"",
                "ca_file (the collector's CA, PEM) is required",
            ),
            (
                "otlp_endpoint = \"http://c:4317\"\nca_file = \"/ca.pem\"",
                "is not https",
            ),
            (
                "ca_file = \"/ca.pem\"",
                "ca_file is set but otlp_endpoint is not",
            ),
            (
                "otlp_endpoint = \"http://c:4317\"\nservice_name = \" \"",
                "service_name must not",
            ),
            (
                "otlp_endpoint = \"http://c:4317\"\nmax_queue = 0",
                "max_queue must be",
            ),
            (
                "otlp_endpoint = \"http://c:4317\"\nsampling = 1",
                "unknown field `sampling`",
            ),
        ];
        for (text, expected) in cases {
            let e = parse(text).expect_err(text);
            assert!(e.contains(expected), "{text}: {e}");
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts() {
        let (tx, mut rx) = mpsc::channel(1);
        let processor = QueueProcessor {
            queue: tx,
            dropped: Counter::default(),
        };
        let span = || SpanData {
            span_context: opentelemetry::trace::SpanContext::empty_context(),
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: opentelemetry::trace::SpanKind::Internal,
            name: "pcr".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes: vec![],
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: opentelemetry::trace::Status::Unset,
            instrumentation_scope: Default::default(),
        };
        processor.on_end(span());
        processor.on_end(span());
        processor.on_end(span());
        assert_eq!(processor.dropped.get(), 2);
        assert_eq!(rx.recv().await.map(|s| s.name), Some("pcr".into()));
    }

    #[test]
    fn a_traceparent_is_read_only_when_traces_are_on() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        );
        // Off (nothing in this test process started traces).
        assert!(caller_context(&headers).is_none());
        ENABLED.store(true, Ordering::Release);
        use opentelemetry::trace::TraceContextExt as _;
        let context = caller_context(&headers).expect("a valid traceparent");
        assert_eq!(
            context.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        headers.insert("traceparent", http::HeaderValue::from_static("00-zz-01"));
        assert!(caller_context(&headers).is_none(), "malformed: no parent");
        ENABLED.store(false, Ordering::Release);
    }
}
