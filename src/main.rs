//! `podca`: a certificate authority for Kubernetes workloads.

mod cli;
mod commands;
mod dev;
mod serve;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // One crypto provider for the whole process (rustls, kube, tonic), installed before anything
    // can ask for a default one.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    cli::main()
}
