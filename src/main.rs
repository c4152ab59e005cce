//! `podca`: a certificate authority for Kubernetes workloads.

mod cli;
mod commands;
mod dev;
mod serve;

// glibc malloc was 10-18 % of the server's CPU under load (README, "Performance"); only the
// binary chooses the allocator, the library crates leave it to whoever links them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // One crypto provider for the whole process (rustls, kube, tonic), installed before anything
    // can ask for a default one.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    cli::main()
}
