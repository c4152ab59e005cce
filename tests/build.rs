//! The test OTLP receiver's code (tests/tests/traces.rs), generated from the vendored public
//! OpenTelemetry definitions (tests/proto/README.md) with protox: no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(
        ["opentelemetry/proto/collector/trace/v1/trace_service.proto"],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
