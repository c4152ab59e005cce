//! `podca dev`'s start-up banner: where the CA, the APIs and the kept bundles are, and how to
//! try them. Text only; the binary prints it.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use podca_authority::config::DevPlan;

use crate::keeper::KeptBundle;

/// What `podca dev` is serving, for [`banner`].
#[derive(Debug)]
pub struct Serving<'a> {
    pub data_dir: &'a Path,
    /// The CA was made by this start (else reused).
    pub created: bool,
    /// The podca.v1 listener.
    pub listen: SocketAddr,
    /// The Workload API socket.
    pub socket: &'a Path,
    pub bundles: &'a [KeptBundle],
}

/// The banner, one line per fact, ending with `podca dev: ready`.
pub fn banner(plan: &DevPlan, serving: &Serving<'_>) -> String {
    let DevPlan {
        signer,
        trust_domain,
        identities,
        ..
    } = plan;
    let Serving {
        data_dir,
        created,
        listen,
        socket,
        bundles,
    } = serving;
    let mut out = String::new();
    let verb = if *created { "created" } else { "reusing" };
    let _ = writeln!(out, "podca dev: {verb} the CA in {}", data_dir.display());
    let anchors = data_dir.join("root.pem");
    let _ = writeln!(out, "podca dev: trust anchors: {}", anchors.display());
    let _ = writeln!(
        out,
        "podca dev: signer {signer} (trust domain {trust_domain})"
    );
    for i in identities {
        let id = podca_signer::names::spiffe_id(trust_domain, &i.namespace, &i.service_account);
        let (uid, ns, sa) = (i.uid, &i.namespace, &i.service_account);
        let _ = writeln!(out, "podca dev: uid {uid} is {ns}/{sa} ({id})");
    }
    let _ = writeln!(out, "podca dev: gRPC API (podca.v1) on {listen}");
    let socket = socket.display();
    let _ = writeln!(out, "podca dev: SPIFFE Workload API on unix://{socket}");
    let _ = writeln!(out, "  export SPIFFE_ENDPOINT_SOCKET=unix://{socket}");
    let _ = writeln!(
        out,
        "  grpcurl -plaintext -import-path proto/proto -proto podca/v1/podca.proto \
         -H 'x-podca-namespace: default' -H 'x-podca-service-account: default' \
         {listen} podca.v1.PodCA/GetTrustBundle"
    );
    for KeptBundle { identity, dir } in *bundles {
        let _ = writeln!(
            out,
            "podca dev: credential bundle for {identity}: {} (trust bundle {})",
            dir.join("credentialbundle.pem").display(),
            dir.join("trust-bundle.pem").display()
        );
    }
    out.push_str(
        "podca dev: CA rotation runs on its schedule; `podca ca rotate` is picked up within 5 s \
         (SIGHUP: at once); Ctrl-C stops\npodca dev: ready\n",
    );
    out
}
