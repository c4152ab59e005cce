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
    Ok(())
}
