//! The Istio CA API (`istio.v1.auth.IstioCertificateService`, issue #16), with a client that
//! behaves like ztunnel (`podca_tests::istio`).
//!
//! * Against the real `podca serve` and the API emulator (harness: `grpc_serve/mod.rs`), over
//!   TLS verified against podca's bundle: certificates for the caller itself and, as a node
//!   proxy, for a pod on its node; refused for a pod on another node; every bad input of the
//!   issue with its status and message (the README's refusal table).
//! * In process, in simulated time: two ztunnels on different nodes keep certificates for a pod
//!   each, trusting only the last element of their latest answer (as ztunnel does), and
//!   complete mTLS handshakes every simulated second through a full CA rotation; the last
//!   element holds every anchor in force before, during and after it.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

mod grpc_serve;
#[path = "support/rotating_ca.rs"]
mod rotating_ca;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use grpc_serve::{Cluster, NODE_PROXY, TokenSpec, expect_code, issue};
use podca_authority::CaHandle;
use podca_authority::metrics::Metrics;
use podca_grpc::auth::{
    AuthError, Authenticator, Credentials, Identity, LookupError, NamedPod, Peer, PodDirectory,
    PodInfo,
};
use podca_grpc::connections::ConnectionLimits;
use podca_grpc::core::IstioOptions;
use podca_grpc::{Api, ApiOptions, server};
use podca_proto::istio::v1::auth::IstioCertificateRequest;
use podca_signer::SignerPolicy;
use podca_signer::rotation::{Phase, Step};
use podca_tests::cluster::PODCA_USER;
use podca_tests::emulator::{PodFixture, PolicyRule, Subject};
use podca_tests::istio::{Obtained, Ztunnel, csr_with_sans, impersonating, ztunnel_csr};
use podca_tests::sim::{SimClock, provider};
use podca_tests::verify::assert_verifies;
use rotating_ca::Lifetimes;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use time::{Duration, OffsetDateTime, macros::datetime};
use tonic::Code;

const ISTIO_AUDIENCE: &str = "podca-istio";

fn ders(pem_text: &str) -> Vec<CertificateDer<'static>> {
    pem::parse_many(pem_text)
        .expect("PEM")
        .into_iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| CertificateDer::from(b.into_contents()))
        .collect()
}

fn der_set(pem_text: &str) -> BTreeSet<Vec<u8>> {
    ders(pem_text).into_iter().map(|d| d.to_vec()).collect()
}

use podca_tests::verify::leaf_uris;

fn leaf_lifetime(chain_pem: &str) -> i64 {
    let leaf = ders(chain_pem).into_iter().next().expect("a leaf");
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf).unwrap();
    cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()
}

/// A token for the Istio audience, bound to `pod` on `node`.
fn istio_token(cluster: &Cluster, namespace: &str, sa: &str, pod: &str, node: &str) -> String {
    cluster.token(
        namespace,
        sa,
        TokenSpec {
            audience: ISTIO_AUDIENCE,
            ..TokenSpec::bound(pod, node)
        },
    )
}

/// podca may list pods (the `ImpersonatedIdentity` check), besides the harness' `pods get`.
fn grant_pods_list(cluster: &Cluster) {
    cluster.emu.grant(
        Subject::User(PODCA_USER.into()),
        PolicyRule::new(&[""], &["pods"], &["list"]),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_gets_chains_for_itself_and_for_pods_on_its_node() {
    let cluster = Cluster::start().await;
    grant_pods_list(&cluster);
    let emu = &cluster.emu;
    emu.add_node("node-1");
    emu.add_node("node-2");
    let (proxy_ns, proxy_sa) = NODE_PROXY.split_once('/').unwrap();
    cluster.pod(proxy_ns, "ztunnel-a", "node-1", proxy_sa);
    for (name, node, sa) in [("web-1", "node-1", "web"), ("db-2", "node-2", "db")] {
        emu.add_pod(&PodFixture {
            namespace: "apps".into(),
            name: name.into(),
            node_name: node.into(),
            service_account: sa.into(),
            ..Default::default()
        });
    }
    let token = istio_token(&cluster, proxy_ns, proxy_sa, "ztunnel-a", "node-1");
    // TLS, verified against podca's bundle for the Service name.
    let mut ztunnel = Ztunnel::new(cluster.channel().await, Some(token), "cluster.local");

    // For itself.
    let own = ztunnel.obtain(proxy_ns, proxy_sa, false).await.unwrap();
    check_answer(
        &own,
        &cluster.anchors,
        "spiffe://cluster.local/ns/mesh/sa/node-proxy",
    );

    // As a node proxy, for a pod on its node.
    let web = ztunnel.obtain("apps", "web", true).await.unwrap();
    check_answer(
        &web,
        &cluster.anchors,
        "spiffe://cluster.local/ns/apps/sa/web",
    );

    // Refused for a pod on another node.
    expect_code(
        ztunnel.obtain("apps", "db", true).await,
        Code::PermissionDenied,
        "no running pod of service account apps/db is on the caller's node node-1",
    );

    // The Istio API asks TokenReview for its own audience: a podca.v1 token is refused.
    let podca_token = cluster.token(proxy_ns, proxy_sa, TokenSpec::bound("ztunnel-a", "node-1"));
    let mut wrong = Ztunnel::new(cluster.channel().await, Some(podca_token), "cluster.local");
    expect_code(
        wrong.obtain(proxy_ns, proxy_sa, false).await,
        Code::Unauthenticated,
        "token audiences ... is invalid for the target audiences",
    );
    let mut anonymous = Ztunnel::new(cluster.channel().await, None, "cluster.local");
    expect_code(
        anonymous.obtain(proxy_ns, proxy_sa, false).await,
        Code::Unauthenticated,
        "no credentials",
    );

    // Counted under its own method; the cluster id is in the log, and the ledger-facing log
    // line names the impersonated identity.
    let metrics = cluster.metrics();
    assert!(
        metrics.contains(
            "method=\"istio.v1.auth.IstioCertificateService/CreateCertificate\",code=\"OK\""
        ),
        "{metrics}"
    );
    let log = cluster.log_text();
    assert!(
        log.contains("issued a certificate over the Istio CA API"),
        "{log}"
    );
    assert!(log.contains("\"Kubernetes\""), "{log}");
    assert!(
        log.contains("spiffe://cluster.local/ns/apps/sa/web"),
        "{log}"
    );
}

/// The answer's shape: leaf with exactly `spiffe_id`, chain verified by openssl against the
/// last element, which holds exactly podca's anchors.
#[track_caller]
fn check_answer(answer: &Obtained, anchors: &str, spiffe_id: &str) {
    assert!(answer.cert_chain.len() >= 2, "{:?}", answer.cert_chain);
    assert_eq!(leaf_uris(&answer.chain_pem()), [spiffe_id]);
    assert_eq!(der_set(answer.anchors_pem()), der_set(anchors));
    // Every element but the last is one certificate; the leaf's key is ztunnel's.
    for element in &answer.cert_chain[..answer.cert_chain.len() - 1] {
        assert_eq!(ders(element).len(), 1, "{element}");
    }
    let leaf = ders(&answer.chain_pem()).remove(0);
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf).unwrap();
    assert_eq!(
        cert.public_key().subject_public_key.data.as_ref(),
        answer.key.public_key_raw()
    );
    assert_verifies(&answer.chain_pem(), answer.anchors_pem());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_has_its_status_and_message() {
    let cluster = Cluster::start_with("istio_trust_domain_alias = \"mesh.example\"\n").await;
    grant_pods_list(&cluster);
    let emu = &cluster.emu;
    emu.add_node("node-1");
    let (proxy_ns, proxy_sa) = NODE_PROXY.split_once('/').unwrap();
    cluster.pod(proxy_ns, "ztunnel-a", "node-1", proxy_sa);
    cluster.pod("apps", "web-1", "node-1", "web");
    let proxy_token = istio_token(&cluster, proxy_ns, proxy_sa, "ztunnel-a", "node-1");
    let web_token = istio_token(&cluster, "apps", "web", "web-1", "node-1");
    let mut proxy = Ztunnel::new(cluster.channel().await, Some(proxy_token), "cluster.local");
    let mut web = Ztunnel::new(cluster.channel().await, Some(web_token), "cluster.local");
    let key = || rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let own_id = "spiffe://cluster.local/ns/apps/sa/web";
    let request = |csr: String, validity: i64, metadata| IstioCertificateRequest {
        csr,
        validity_duration: validity,
        metadata,
    };

    // A CSR that is not PEM (DER bytes as text, or nothing).
    expect_code(
        web.send(request("MIIBnot-pem".into(), 3600, None)).await,
        Code::InvalidArgument,
        "csr is not PEM; send a PEM PKCS#10 certificate signing request",
    );
    expect_code(
        web.send(request(String::new(), 3600, None)).await,
        Code::InvalidArgument,
        "csr is empty",
    );
    // PEM, but of something else.
    let cert_pem = cluster.anchors.clone();
    expect_code(
        web.send(request(cert_pem, 3600, None)).await,
        Code::InvalidArgument,
        "csr is a PEM \"CERTIFICATE\" block, not a CERTIFICATE REQUEST",
    );
    // A CSR asking for another identity.
    expect_code(
        web.send(request(
            ztunnel_csr(&key(), &["spiffe://cluster.local/ns/apps/sa/admin"]),
            3600,
            None,
        ))
        .await,
        Code::PermissionDenied,
        "the CSR asks for \"spiffe://cluster.local/ns/apps/sa/admin\", but the caller may only \
         be certified as spiffe://cluster.local/ns/apps/sa/web",
    );
    // … or for its own and another one, or for a name podca does not derive.
    expect_code(
        web.send(request(
            ztunnel_csr(&key(), &[own_id, "spiffe://other.example/ns/apps/sa/web"]),
            3600,
            None,
        ))
        .await,
        Code::PermissionDenied,
        "the CSR asks for \"spiffe://other.example/ns/apps/sa/web\"",
    );
    let with_dns = csr_with_sans(
        &key(),
        vec![
            rcgen::SanType::URI(own_id.try_into().unwrap()),
            rcgen::SanType::DnsName("evil.example".try_into().unwrap()),
        ],
    );
    expect_code(
        web.send(request(with_dns, 3600, None)).await,
        Code::PermissionDenied,
        "the CSR asks for the DNS name \"evil.example\", which podca does not derive",
    );
    expect_code(
        web.send(request(ztunnel_csr(&key(), &[]), 3600, None))
            .await,
        Code::InvalidArgument,
        "the CSR carries no URI SAN; it must name the SPIFFE ID spiffe://cluster.local/ns/apps/sa/web",
    );
    // A validity of 0 or negative.
    for v in [0, -60] {
        expect_code(
            web.send(request(ztunnel_csr(&key(), &[own_id]), v, None))
                .await,
            Code::InvalidArgument,
            &format!("validity_duration must be a positive number of seconds, got {v}"),
        );
    }
    // Above the maximum: clamped to the policy's (default 7 days), as podca.v1 does.
    let long = web
        .send(request(
            ztunnel_csr(&key(), &[own_id]),
            10 * 365 * 86_400,
            None,
        ))
        .await
        .unwrap();
    let long_chain: String = long.cert_chain[..long.cert_chain.len() - 1].concat();
    assert_eq!(leaf_lifetime(&long_chain), 7 * 86_400);
    // ImpersonatedIdentity from a caller that is not a node proxy.
    expect_code(
        web.send(request(
            ztunnel_csr(&key(), &[own_id]),
            3600,
            Some(impersonating(own_id)),
        ))
        .await,
        Code::PermissionDenied,
        "service account apps/web may not request certificates or JWT-SVIDs for other pods (it \
         is not in grpc.node_proxy_service_accounts)",
    );
    // Malformed ImpersonatedIdentity.
    for bad in ["spiffe://cluster.local/ns/apps", "apps/web", ""] {
        expect_code(
            proxy
                .send(request(
                    ztunnel_csr(&key(), &[own_id]),
                    3600,
                    Some(impersonating(bad)),
                ))
                .await,
            Code::InvalidArgument,
            "is not a SPIFFE ID of the form spiffe://<trust domain>/ns/<namespace>/sa/<service account>",
        );
    }
    let mut number = impersonating(own_id);
    number.fields.insert(
        "ImpersonatedIdentity".into(),
        prost_types::Value {
            kind: Some(prost_types::value::Kind::NumberValue(7.0)),
        },
    );
    expect_code(
        proxy
            .send(request(ztunnel_csr(&key(), &[own_id]), 3600, Some(number)))
            .await,
        Code::InvalidArgument,
        "ImpersonatedIdentity must be a string",
    );
    // Another trust domain than the signer's or its alias.
    let foreign = "spiffe://other.example/ns/apps/sa/web";
    expect_code(
        proxy
            .send(request(
                ztunnel_csr(&key(), &[foreign]),
                3600,
                Some(impersonating(foreign)),
            ))
            .await,
        Code::InvalidArgument,
        "ImpersonatedIdentity spiffe://other.example/ns/apps/sa/web is not in the trust domain \
         \"cluster.local\" (or its alias \"mesh.example\")",
    );
    // Names that are not Kubernetes names never reach the API.
    let odd = "spiffe://cluster.local/ns/Apps_1/sa/web";
    expect_code(
        proxy
            .send(request(
                ztunnel_csr(&key(), &[odd]),
                3600,
                Some(impersonating(odd)),
            ))
            .await,
        Code::InvalidArgument,
        "ImpersonatedIdentity \"spiffe://cluster.local/ns/Apps_1/sa/web\": the namespace must \
         not contain 'A'",
    );
    // The alias is accepted in the CSR and ImpersonatedIdentity; the certificate carries the
    // signer's trust domain.
    let aliased = "spiffe://mesh.example/ns/apps/sa/web";
    let issued = proxy
        .send(request(
            ztunnel_csr(&key(), &[aliased]),
            3600,
            Some(impersonating(aliased)),
        ))
        .await
        .unwrap();
    let chain: String = issued.cert_chain[..issued.cert_chain.len() - 1].concat();
    assert_eq!(leaf_uris(&chain), [own_id]);
    // A terminating pod does not vouch: none is left on the node.
    let refusals = cluster.metrics();
    assert!(
        refusals.contains("reason=\"csr_name_not_allowed\""),
        "{refusals}"
    );
    assert!(
        refusals.contains("reason=\"bad_impersonation\""),
        "{refusals}"
    );
}

// ---- In-process, simulated time: a full rotation under ztunnel-to-ztunnel mTLS. ----

const T0: OffsetDateTime = datetime!(2027-03-01 00:00 UTC);
const CA_LIFETIME: i64 = 6 * 3600;
/// ztunnel renews at half of a certificate's life and only then learns new roots (the last
/// element of the answer): the propagation window must be longer than that half (30 min for
/// the shortest leaves podca issues, 1 h).
const PROPAGATION: i64 = 40 * 60;
const LEAF_LIFETIME: i64 = 3600;
const LIFETIMES: Lifetimes = Lifetimes {
    ca_lifetime: CA_LIFETIME,
    propagation: PROPAGATION,
    leaf_lifetime: LEAF_LIFETIME,
};
const TRUST_DOMAIN: &str = "cluster.local";

/// Each ztunnel's token stands for its pod-bound identity on its node.
#[derive(Debug)]
struct NodeTokens;

#[tonic::async_trait]
impl Authenticator for NodeTokens {
    async fn authenticate(
        &self,
        _peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, AuthError> {
        let token = credentials.bearer.as_ref().ok_or(AuthError::Missing)?;
        let node = token
            .expose()
            .strip_prefix("ztunnel-on-")
            .ok_or_else(|| AuthError::Invalid("unknown token".into()))?;
        Ok(Identity {
            namespace: "istio-system".into(),
            service_account: "ztunnel".into(),
            pod_name: Some(format!("ztunnel-{node}")),
            pod_uid: Some(format!("uid-ztunnel-{node}")),
            node_name: Some(node.into()),
            authentication: Default::default(),
        })
    }
}

/// ztunnel on node-1 and node-2, `apps/web` on node-1, `apps/db` on node-2.
#[derive(Debug)]
struct TwoNodes;

fn pod_on(node: &str, sa: &str, uid: &str) -> PodInfo {
    PodInfo {
        service_account: sa.into(),
        node_name: Some(node.into()),
        uid: Some(uid.into()),
        terminating: false,
        phase: Some("Running".into()),
        metadata: Default::default(),
        mirror: false,
    }
}

#[tonic::async_trait]
impl PodDirectory for TwoNodes {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodInfo>, LookupError> {
        Ok(match (namespace, name) {
            ("istio-system", "ztunnel-node-1") => {
                Some(pod_on("node-1", "ztunnel", "uid-ztunnel-node-1"))
            }
            ("istio-system", "ztunnel-node-2") => {
                Some(pod_on("node-2", "ztunnel", "uid-ztunnel-node-2"))
            }
            _ => None,
        })
    }

    async fn pods_on_node(
        &self,
        namespace: &str,
        node: &str,
        service_account: &str,
    ) -> Result<Vec<NamedPod>, LookupError> {
        let all = [("web-0", "node-1", "web"), ("db-0", "node-2", "db")];
        Ok(all
            .into_iter()
            .filter(|(_, n, sa)| namespace == "apps" && *n == node && *sa == service_account)
            .map(|(name, n, sa)| NamedPod {
                name: name.into(),
                info: pod_on(n, sa, &format!("uid-{name}")),
            })
            .collect())
    }

    async fn service_account_uid(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, LookupError> {
        Ok(Some(format!("uid-sa-{namespace}-{name}")))
    }
}

/// One ztunnel as the simulation keeps it: the certificate of its pod and the roots of its
/// latest answer.
struct Node {
    ztunnel: Ztunnel,
    service_account: &'static str,
    dns: String,
    held: Obtained,
    refresh_at: OffsetDateTime,
    fetched_at: OffsetDateTime,
    refreshes: usize,
}

fn refresh_at(chain_pem: &str) -> OffsetDateTime {
    let leaf = ders(chain_pem).into_iter().next().expect("a leaf");
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf).unwrap();
    let (nb, na) = (
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    );
    OffsetDateTime::from_unix_timestamp(nb + (na - nb) / 2).unwrap()
}

fn roots(pem_text: &str) -> Arc<rustls::RootCertStore> {
    let mut store = rustls::RootCertStore::empty();
    for d in ders(pem_text) {
        store.add(d).expect("anchor");
    }
    Arc::new(store)
}

fn key_der(obtained: &Obtained) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(obtained.key.serialize_der().into())
}

/// One mutual-TLS handshake in memory at the simulated time, each side verifying the other
/// against the last element of its own latest answer.
fn handshake(clock: &SimClock, client: &Node, server: &Node) -> Result<(), String> {
    let time: Arc<dyn rustls::time_provider::TimeProvider> = Arc::new(clock.clone());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots(server.held.anchors_pem()),
        provider(),
    )
    .build()
    .map_err(|e| format!("server verifier: {e}"))?;
    let server_config = rustls::ServerConfig::builder_with_details(provider(), Arc::clone(&time))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(ders(&server.held.chain_pem()), key_der(&server.held))
        .map_err(|e| format!("server config: {e}"))?;
    let client_config = rustls::ClientConfig::builder_with_details(provider(), time)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(client.held.anchors_pem()))
        .with_client_auth_cert(ders(&client.held.chain_pem()), key_der(&client.held))
        .map_err(|e| format!("client config: {e}"))?;
    let name = ServerName::try_from(server.dns.clone()).map_err(|e| e.to_string())?;
    let mut c =
        rustls::ClientConnection::new(Arc::new(client_config), name).map_err(|e| e.to_string())?;
    let mut s =
        rustls::ServerConnection::new(Arc::new(server_config)).map_err(|e| e.to_string())?;
    podca_tests::tls::handshake_in_memory(&mut c, &mut s)?;
    if s.peer_certificates().is_none_or(|c| c.is_empty()) {
        return Err("the server saw no client certificate".into());
    }
    Ok(())
}

/// What each answer's last element must be: every anchor the CA handle has in force.
#[track_caller]
fn assert_all_anchors(obtained: &Obtained, handle: &CaHandle, when: &str) {
    assert_eq!(
        der_set(obtained.anchors_pem()),
        der_set(&handle.current().anchors_pem),
        "{when}: the last element is not every anchor in force"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ztunnels_keep_mtls_through_a_full_rotation() {
    provider();
    let sim = SimClock::at(T0);
    let dir = tempfile::tempdir().unwrap();
    let (store, handle, rotator) = rotating_ca::start(
        &dir.path().join("ca"),
        LIFETIMES,
        T0,
        sim.clock(),
        Arc::new(Metrics::new()),
        |_| {},
    );

    // The API, in process, on the simulated clock; plaintext on loopback (the TLS listener is
    // covered against podca serve above).
    let signer = "example.com/mesh";
    let mut policy = SignerPolicy::permissive(TRUST_DOMAIN);
    policy.dns_name_templates = vec!["{sa}.{ns}.svc".into()];
    policy.default_lifetime_seconds = LEAF_LIFETIME as u32;
    policy.max_lifetime_seconds = LEAF_LIFETIME as u32;
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let api = Arc::new(
        Api::new(
            ApiOptions {
                signers: BTreeMap::from([(signer.to_owned(), policy)]),
                default_signer: signer.to_owned(),
                allowed_signers: vec![],
                max_dns_names: 16,
                node_proxy_service_accounts: vec!["istio-system/ztunnel".into()],
                rate_limit_per_identity: 0,
                max_open_streams: 16,
            },
            handle.clone(),
            Arc::new(NodeTokens),
            Some(Arc::new(TwoNodes)),
            stopped,
        )
        .unwrap()
        .with_clock(sim.clock())
        .with_istio(IstioOptions::default()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve_tcp(
        listener,
        api,
        ConnectionLimits::default(),
        std::future::pending(),
    ));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();

    // Start half an hour before the next CA is prepared.
    let start = T0 + Duration::seconds(CA_LIFETIME / 2 - 1800);
    sim.set(start);
    let mut nodes = Vec::new();
    for (node, sa) in [("node-1", "web"), ("node-2", "db")] {
        let mut ztunnel = Ztunnel::new(
            channel.clone(),
            Some(format!("ztunnel-on-{node}")),
            TRUST_DOMAIN,
        );
        ztunnel.validity_seconds = LEAF_LIFETIME;
        // ztunnel's own certificate, then its pod's.
        let own = ztunnel
            .obtain("istio-system", "ztunnel", false)
            .await
            .unwrap();
        assert_eq!(
            leaf_uris(&own.chain_pem()),
            ["spiffe://cluster.local/ns/istio-system/sa/ztunnel"]
        );
        let held = ztunnel.obtain("apps", sa, true).await.unwrap();
        assert_all_anchors(&held, &handle, "before the rotation");
        assert_eq!(ders(held.anchors_pem()).len(), 1, "one root before");
        nodes.push(Node {
            refresh_at: refresh_at(&held.chain_pem()),
            ztunnel,
            service_account: sa,
            dns: format!("{sa}.apps.svc"),
            held,
            fetched_at: start,
            refreshes: 0,
        });
    }
    // A pod on the other node is refused, as against podca serve.
    expect_code(
        nodes[0].ztunnel.obtain("apps", "db", true).await,
        Code::PermissionDenied,
        "no running pod of service account apps/db is on the caller's node node-1",
    );

    let mut failures = Vec::new();
    let mut handshakes = 0u64;
    let mut steps_seen: Vec<(i64, Step)> = Vec::new();
    let mut roots_seen: BTreeSet<usize> = BTreeSet::new();
    let end = start + Duration::seconds(1800 + PROPAGATION + LEAF_LIFETIME + 1800);
    let mut now = start;
    while now < end {
        now += Duration::SECOND;
        sim.set(now);
        let tick = rotator.tick().expect("rotation tick");
        for step in &tick.steps {
            steps_seen.push(((now - start).whole_seconds(), *step));
        }
        for n in &mut nodes {
            if now >= n.refresh_at {
                let held = n
                    .ztunnel
                    .obtain("apps", n.service_account, true)
                    .await
                    .unwrap_or_else(|e| panic!("renewal at {now}: {e:?}"));
                assert_all_anchors(&held, &handle, &format!("t={now}"));
                roots_seen.insert(ders(held.anchors_pem()).len());
                n.refresh_at = refresh_at(&held.chain_pem());
                n.held = held;
                n.fetched_at = now;
                n.refreshes += 1;
            }
        }
        for (c, s) in [(0, 1), (1, 0)] {
            handshakes += 1;
            if let Err(e) = handshake(&sim, &nodes[c], &nodes[s]) {
                failures.push(format!(
                    "t+{}s {} → {}: {e} (answers from t+{}s and t+{}s)",
                    (now - start).whole_seconds(),
                    nodes[c].dns,
                    nodes[s].dns,
                    (nodes[c].fetched_at - start).whole_seconds(),
                    (nodes[s].fetched_at - start).whole_seconds(),
                ));
            }
        }
    }

    // The rotation happened in full: prepared, activated, the old CA retired and dropped.
    let first = |want: fn(&Step) -> bool| {
        steps_seen
            .iter()
            .find(|(_, s)| want(s))
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("missing step; steps: {steps_seen:?}"))
    };
    let prepared = first(|s| *s == Step::Prepare);
    let activated = first(|s| *s == Step::Activate(2));
    let dropped = first(|s| *s == Step::Drop(1));
    assert!(
        prepared < activated && activated < dropped,
        "{steps_seen:?}"
    );
    let generations = store.generations().expect("generations");
    let phases: Vec<Phase> = generations.iter().map(|g| g.generation.phase).collect();
    assert_eq!(phases, [Phase::Dropped, Phase::Active], "{phases:?}");
    // Answers carried one root, then both during the overlap, then only the new one.
    assert_eq!(roots_seen, BTreeSet::from([1, 2]), "{roots_seen:?}");
    let new_root = der_set(&generations[1].roots[0].pem());
    for n in &nodes {
        assert_eq!(der_set(n.held.anchors_pem()), new_root, "{}", n.dns);
        assert!(
            n.refreshes >= 5,
            "{} refreshed {} times",
            n.dns,
            n.refreshes
        );
    }
    assert!(handshakes > 10_000, "{handshakes} handshakes");
    assert!(
        failures.is_empty(),
        "{} of {handshakes} handshakes failed; first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podca_dev_serves_it_on_its_loopback_listener() {
    // Opt-in there too (`[grpc] istio = true`).
    let dev = podca_tests::process::DevProcess::start_with(podca_tests::process::DevOptions {
        config: Some("[grpc]\nistio = true\n"),
        ..Default::default()
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", dev.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // No token: a dev identity named in metadata, as for podca.v1 on this listener; the CSR
    // names it in Istio's default trust domain (the default alias).
    let mut ztunnel = Ztunnel::new(channel, None, "cluster.local");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let id = "spiffe://cluster.local/ns/shop/sa/web";
    let ask = |metadata| {
        let mut request = ztunnel.request(IstioCertificateRequest {
            csr: ztunnel_csr(&key, &[id]),
            validity_duration: 3600,
            metadata,
        });
        request
            .metadata_mut()
            .insert("x-podca-namespace", "shop".parse().unwrap());
        request
            .metadata_mut()
            .insert("x-podca-service-account", "web".parse().unwrap());
        request
    };
    let (first, second) = (ask(None), ask(Some(impersonating(id))));
    let answer = ztunnel
        .client
        .create_certificate(first)
        .await
        .unwrap()
        .into_inner();
    let chain: String = answer.cert_chain[..answer.cert_chain.len() - 1].concat();
    let uris = leaf_uris(&chain);
    assert!(
        uris.len() == 1 && uris[0].ends_with("/ns/shop/sa/web"),
        "{uris:?}"
    );
    assert_verifies(&chain, answer.cert_chain.last().unwrap());
    // No Kubernetes API in podca dev: nobody may impersonate.
    expect_code(
        ztunnel.client.create_certificate(second).await,
        Code::FailedPrecondition,
        "ImpersonatedIdentity needs the Kubernetes API",
    );
}

/// The Istio CA API is opt-in (issue #40): with `[grpc] istio = false` (the default) a call
/// is answered UNIMPLEMENTED naming the key, before any token is reviewed; podca.v1 still
/// serves on the same listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_istio_api_answers_only_when_turned_on() {
    let cluster = Cluster::start_with("istio = false\n").await;
    let (proxy_ns, proxy_sa) = NODE_PROXY.split_once('/').unwrap();
    cluster.pod(proxy_ns, "ztunnel-a", "node-1", proxy_sa);
    let token = istio_token(&cluster, proxy_ns, proxy_sa, "ztunnel-a", "node-1");
    let mut ztunnel = Ztunnel::new(cluster.channel().await, Some(token), "cluster.local");
    expect_code(
        ztunnel.obtain(proxy_ns, proxy_sa, false).await,
        Code::Unimplemented,
        "the Istio CA API is off in this podca: set [grpc] istio = true to serve it",
    );
    assert_eq!(cluster.token_reviews(), 0, "no token was reviewed");
    let podca_token = cluster.token(proxy_ns, proxy_sa, TokenSpec::bound("ztunnel-a", "node-1"));
    issue(&mut cluster.client().await, Some(&podca_token))
        .await
        .expect("podca.v1 serves");
}
