//! Generates the tonic/prost code from the .proto files with protox (a pure-Rust protobuf
//! compiler), so building podca needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["podca/v1/podca.proto", "spiffe/workload/workload.proto"];
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
