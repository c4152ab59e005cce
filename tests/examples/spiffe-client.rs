//! A SPIFFE Workload API client for the README's tour: fetches this process's X.509-SVID and a
//! JWT-SVID from `$SPIFFE_ENDPOINT_SOCKET` with the `spiffe` crate (the same client
//! `tests/tests/dev_command.rs` uses) and prints what it got.
//!
//! `SPIFFE_ENDPOINT_SOCKET=unix://… cargo run -q -p podca-tests --example spiffe-client -- AUDIENCE`

use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let audience = std::env::args().nth(1).unwrap_or_else(|| "demo".into());
    match fetch(&audience).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spiffe-client: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn fetch(audience: &str) -> Result<(), spiffe::WorkloadApiError> {
    let client = spiffe::WorkloadApiClient::connect_env().await?;
    let svid = client.fetch_x509_svid().await?;
    println!(
        "X.509-SVID {} ({} certificates in the chain)",
        svid.spiffe_id(),
        svid.cert_chain().len()
    );
    let token = client.fetch_jwt_svid([audience], None).await?;
    println!(
        "JWT-SVID {} for audience {:?}, expires at {}",
        token.spiffe_id(),
        token.audience(),
        token.claims().exp()
    );
    Ok(())
}
