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
    // Transparent huge pages grew mimalloc's arena in 2 MiB steps and kept them: a third of the
    // peak RSS under a PCR burst (issue #48). Off before anything much is allocated.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    // One crypto provider for the whole process (rustls, kube, tonic), installed before anything
    // can ask for a default one.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    cli::main()
}
