//! Generates the tonic/prost code from the .proto files with protox (a pure-Rust protobuf
//! compiler), so building podca needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The APIs podca's gRPC servers serve, and so list in server reflection.
    let served = [
        "podca/v1/podca.proto",
        "spiffe/workload/workload.proto",
        "istio/v1/auth/ca.proto",
    ];
    // kube-apiserver's external token signer API: served only on `podca token-signer`'s own
    // socket, so it stays out of the other servers' reflection.
    let token_signer = "k8s/externaljwt/v1/api.proto";
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(served, ["proto"])?;
    // The same descriptors (with their imports) for server reflection.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("podca_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    let mut all = served.to_vec();
    all.push(token_signer);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(all, ["proto"])?)?;
    envoy_sds(&out)
}

/// Envoy's Secret Discovery Service (vendored upstream files, `proto/README.md`), kept out of
/// the reflection set above. Only the packages whose messages SDS carries are generated (the
/// annotation packages exist for protox alone), into their own directory with a module tree
/// (`envoy/mod.rs`), without the upstream comments (Sphinx markup that rustdoc would read as
/// doctests).
fn envoy_sds(out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    const GENERATED: &[&str] = &[
        "envoy.service.secret.v3",
        "envoy.service.discovery.v3",
        "envoy.extensions.transport_sockets.tls.v3",
        "envoy.config.core.v3",
        "envoy.type.v3",
        "envoy.type.matcher.v3",
        "xds.core.v3",
        "google.rpc",
        // Not generated (prost maps them to prost-types), but prost reads them.
        "google.protobuf",
    ];
    let mut fds = protox::compile(
        [
            "envoy/service/secret/v3/sds.proto",
            "envoy/extensions/transport_sockets/tls/v3/secret.proto",
        ],
        ["proto"],
    )?;
    fds.file.retain(|file| GENERATED.contains(&file.package()));
    let dir = out.join("envoy");
    std::fs::create_dir_all(&dir)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(&dir)
        .include_file("mod.rs")
        .disable_comments(["."])
        .compile_fds(fds)?;
    Ok(())
}
