//! The OTLP/gRPC span exporter (issue #44) that `podca_authority::traces::start` sends spans
//! through: tonic, with TLS (aws-lc-rs) to an `https://` collector trusting `[tracing]
//! ca_file` only. It lives here because the runtime crate knows no gRPC.

use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
use podca_authority::traces::{OtlpExporter, TraceStartError};

/// The exporter `config` describes. Call inside the Tokio runtime: the channel connects lazily
/// there, so a collector that is down is found (and its spans dropped) at the first export.
pub fn exporter(
    config: &OtlpExporter,
) -> Result<opentelemetry_otlp::SpanExporter, TraceStartError> {
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(config.endpoint.clone())
        .with_timeout(config.export_timeout);
    if let Some(path) = &config.ca_file {
        let pem = std::fs::read(path).map_err(|source| TraceStartError::CaFile {
            path: path.clone(),
            source,
        })?;
        builder = builder.with_tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(pem)),
        );
    }
    builder
        .build()
        .map_err(|e| TraceStartError::Exporter(e.to_string()))
}
