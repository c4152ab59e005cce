//! Who a TLS client is by its certificate (mTLS renewal): a workload that presents a valid podca
//! certificate may renew for exactly the identity in it, without a token, as SPIRE agents renew
//! with their SVID.
//!
//! * [`ClientTrust`] is the listener's client-certificate verifier: optional client
//!   certificates, verified (chain, notAfter, clientAuth) against the anchors of the CA
//!   generations that are active or prepared, never a retired or dropped one
//!   ([`accepted_anchors`]). [`ClientTrust::follow`] rebuilds it on every CA change; new
//!   handshakes see the new anchors at once, established connections stay open.
//! * Each request re-checks the presented chain against the anchors in force *now* (a
//!   connection may outlive its certificate or the CA that issued it), then reads the identity
//!   from the leaf's SPIFFE URI SAN ([`CertIdentity`]), never from anything the request says.
//! * [`CertificateAuthenticator`] combines that with the token authenticator: certificate only →
//!   its identity; token only → the token's; both → they must name the same identity
//!   ([`same_identity`]), else `PERMISSION_DENIED`. Policy still decides what gets issued.

use std::fmt;
use std::sync::{Arc, RwLock};

use podca_authority::trust::{CaSnapshot, Clock};
use podca_signer::CaCertificate;
use podca_signer::names::{NameError, SpiffeId};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio::sync::watch;
use tracing::{error, info};

use super::auth::{
    AuthError, AuthMethod, Authentication, Authenticator, Credentials, Identity, Peer,
};
use crate::renewal::{CheckError, DEFAULT_MAX_RENEWAL, Denylist, RenewalRules};
use podca_signer::renewal::RenewalChain;

/// The certificate chain a TLS client presented (leaf first), as rustls verified it at the
/// handshake. Only [`ClientTrust::identify`] turns it into an identity.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    chain: Arc<Vec<CertificateDer<'static>>>,
}

impl ClientCertificate {
    /// `None` for an empty chain (no client certificate).
    pub fn new(chain: Arc<Vec<CertificateDer<'static>>>) -> Option<Self> {
        (!chain.is_empty()).then_some(ClientCertificate { chain })
    }

    /// The leaf's serial (lowercase hex) and renewal chain ([`podca_signer::renewal`]).
    pub fn renewal_facts(&self) -> Result<(String, RenewalChain), MalformedLeaf> {
        let leaf = self.chain.first().ok_or(MalformedLeaf)?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|_| MalformedLeaf)?;
        let serial = podca_signer::x509::serial_hex(cert.raw_serial());
        let chain = RenewalChain::of_certificate(&cert).map_err(|_| MalformedLeaf)?;
        Ok((serial, chain))
    }

    /// The certificate a request's connection presented, if any (TLS connections only).
    pub fn of_request<T>(request: &tonic::Request<T>) -> Option<Self> {
        use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
        request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs)
            .and_then(Self::new)
    }
}

impl fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("certificates", &self.chain.len())
            .finish()
    }
}

/// A verified leaf whose serial or renewal-chain extension does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the client certificate's renewal-chain extension ({}) is malformed",
    podca_signer::renewal::OID_DOTTED
)]
pub struct MalformedLeaf;

/// The identity a verified leaf names: `spiffe://<trust domain>/ns/<namespace>/sa/<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    pub spiffe_id: String,
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

impl CertIdentity {
    /// Reads the one SPIFFE URI SAN of `leaf` (DER).
    pub fn of_leaf(leaf: &[u8]) -> Result<Self, CertRefusal> {
        let (_, cert) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| CertRefusal::Malformed(e.to_string()))?;
        let sans = cert
            .subject_alternative_name()
            .map_err(|e| CertRefusal::Malformed(format!("its SAN extension: {e}")))?
            .ok_or(CertRefusal::UriSans)?;
        let mut uris = sans.value.general_names.iter().filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(uri) => Some(*uri),
            _ => None,
        });
        let (Some(uri), None) = (uris.next(), uris.next()) else {
            return Err(CertRefusal::UriSans);
        };
        Self::parse(uri)
    }

    /// Parses a podca SPIFFE ID (`signer::names::SpiffeId`).
    pub fn parse(spiffe_id: &str) -> Result<Self, CertRefusal> {
        let id: SpiffeId = spiffe_id.parse().map_err(|reason| CertRefusal::NotPodca {
            uri: spiffe_id.to_owned(),
            reason,
        })?;
        Ok(CertIdentity {
            spiffe_id: spiffe_id.to_owned(),
            trust_domain: id.trust_domain.to_string(),
            namespace: id.namespace.to_string(),
            service_account: id.service_account.to_string(),
        })
    }

    pub fn identity(&self) -> Identity {
        Identity::service_account(&self.namespace, &self.service_account)
    }
}

/// The anchors client certificates may chain to: those of the active CA generation and of any
/// generation created after it (prepared), never one created before it (retired, soon dropped;
/// dropped anchors are not in the snapshot at all).
///
/// The snapshot does not carry phases, but generations are created in order and activated in
/// order, so an anchor whose notBefore is earlier than the active root's belongs to a
/// generation the active one replaced. The active CA's own roots are always accepted.
pub fn accepted_anchors(snapshot: &CaSnapshot) -> Vec<CaCertificate> {
    let active = snapshot.ca.roots();
    let Some(cutoff) = active.iter().map(CaCertificate::not_before).min() else {
        return snapshot.anchors.clone();
    };
    snapshot
        .anchors
        .iter()
        .filter(|a| active.contains(a) || a.not_before() >= cutoff)
        .cloned()
        .collect()
}

/// Why a client certificate is not accepted for a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertRefusal {
    /// The chain does not verify against the anchors in force now (expired since the
    /// handshake, or its CA was retired); rustls' reason.
    #[error("the client certificate is not valid now: {0}")]
    NotValid(String),
    #[error("the client certificate does not parse: {0}")]
    Malformed(String),
    #[error("the client certificate must carry exactly one URI SAN (its SPIFFE ID)")]
    UriSans,
    #[error("the client certificate's URI SAN {uri:?} is not a podca SPIFFE ID ({reason})")]
    NotPodca { uri: String, reason: NameError },
    #[error("the client certificate's trust domain {found:?} is not one of podca's ({accepted})")]
    ForeignTrustDomain { found: String, accepted: String },
}

/// The client-certificate anchors could not be loaded into a verifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AnchorError(String);

struct Verifier {
    /// Every accepted anchor (active and prepared generations): the handshake's check.
    verifier: Arc<dyn ClientCertVerifier>,
    /// The anchors of prepared generations only (newer than the active CA's root).
    prepared: Option<Arc<dyn ClientCertVerifier>>,
    /// The key of the active issuing certificate (SPKI DER): a certificate of the active
    /// generation must be signed by exactly it, not by a sibling CA under the same root.
    active_issuer_spki: Vec<u8>,
    /// Of the snapshot the verifier was built from.
    generation: u64,
}

/// The gRPC listener's client-certificate verifier, swapped on every CA change (see the module
/// docs). Client certificates are optional: a client without one authenticates with a token.
///
/// With several CAs, each has its own verifier and its own trust domains (those of the signers
/// that sign with it): a certificate is accepted only under the CA of its own trust domain, so
/// a certificate of one CA naming another CA's trust domain is refused.
pub struct ClientTrust {
    cas: Vec<TrustedCa>,
}

/// One CA's verifier and the trust domains its certificates may name.
struct TrustedCa {
    current: RwLock<Arc<Verifier>>,
    trust_domains: Vec<String>,
}

impl TrustedCa {
    fn verifier(&self) -> Arc<Verifier> {
        match self.current.read() {
            Ok(current) => Arc::clone(&current),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }
}

impl fmt::Debug for ClientTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cas: Vec<(u64, &[String])> = self
            .cas
            .iter()
            .map(|ca| (ca.verifier().generation, ca.trust_domains.as_slice()))
            .collect();
        f.debug_struct("ClientTrust").field("cas", &cas).finish()
    }
}

impl ClientTrust {
    /// A verifier for the accepted anchors of `snapshot`, for certificates of `trust_domains`.
    pub fn new(
        snapshot: &CaSnapshot,
        trust_domains: Vec<String>,
    ) -> Result<Arc<Self>, AnchorError> {
        Self::for_cas([(snapshot, trust_domains)])
    }

    /// One verifier per CA: the accepted anchors of its snapshot, for certificates of its
    /// trust domains.
    pub fn for_cas<'a>(
        cas: impl IntoIterator<Item = (&'a CaSnapshot, Vec<String>)>,
    ) -> Result<Arc<Self>, AnchorError> {
        let cas = cas
            .into_iter()
            .map(|(snapshot, trust_domains)| {
                Ok(TrustedCa {
                    current: RwLock::new(Arc::new(build(snapshot)?)),
                    trust_domains,
                })
            })
            .collect::<Result<Vec<_>, AnchorError>>()?;
        if cas.is_empty() {
            return Err(AnchorError(
                "no CA to verify client certificates with".into(),
            ));
        }
        Ok(Arc::new(ClientTrust { cas }))
    }

    /// Rebuilds the first CA's verifier from `snapshot`; on failure the current one stays.
    pub fn update(&self, snapshot: &CaSnapshot) -> Result<(), AnchorError> {
        self.update_ca(0, snapshot)
    }

    /// Rebuilds CA `index`'s verifier (in [`ClientTrust::for_cas`] order) from `snapshot`; on
    /// failure the current one stays.
    pub fn update_ca(&self, index: usize, snapshot: &CaSnapshot) -> Result<(), AnchorError> {
        let Some(ca) = self.cas.get(index) else {
            return Err(AnchorError(format!("no CA number {index}")));
        };
        let verifier = Arc::new(build(snapshot)?);
        match ca.current.write() {
            Ok(mut current) => *current = verifier,
            // A writer panicked mid-assignment of an `Arc`: the value is still whole.
            Err(poisoned) => *poisoned.into_inner() = verifier,
        }
        Ok(())
    }

    /// Follows the (first) CA handle until `stop` turns true or the handle is gone.
    pub async fn follow(
        self: Arc<Self>,
        snapshots: watch::Receiver<Arc<CaSnapshot>>,
        stop: watch::Receiver<bool>,
    ) {
        self.follow_ca(0, snapshots, stop).await;
    }

    /// Follows CA `index`'s handle until `stop` turns true or the handle is gone: every new
    /// snapshot rebuilds its verifier.
    pub async fn follow_ca(
        self: Arc<Self>,
        index: usize,
        mut snapshots: watch::Receiver<Arc<CaSnapshot>>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                changed = snapshots.changed() => if changed.is_err() { return },
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            let snapshot = Arc::clone(&snapshots.borrow_and_update());
            match self.update_ca(index, &snapshot) {
                Ok(()) => info!(
                    generation = snapshot.generation,
                    "gRPC: client certificates now verified against the new CA anchors"
                ),
                Err(e) => error!(
                    error = %e,
                    "gRPC: cannot verify client certificates against the new CA anchors; the \
                     previous ones stay"
                ),
            }
        }
    }

    /// Verifies `presented` against the anchors in force at `now` of the CA of its trust
    /// domain, and reads its identity.
    pub fn identify(
        &self,
        presented: &ClientCertificate,
        now: UnixTime,
    ) -> Result<CertIdentity, CertRefusal> {
        let (leaf, intermediates) = presented
            .chain
            .split_first()
            .ok_or_else(|| CertRefusal::NotValid("no certificate".into()))?;
        let identity = CertIdentity::of_leaf(leaf)?;
        let mut refusal = None;
        let mut known = false;
        for ca in &self.cas {
            if !ca.trust_domains.contains(&identity.trust_domain) {
                continue;
            }
            known = true;
            match ca.verifier().live_issuer(leaf, intermediates, now) {
                Ok(()) => return Ok(identity),
                Err(e) => refusal = Some(e),
            }
        }
        if !known {
            let mut accepted: Vec<&str> = self
                .cas
                .iter()
                .flat_map(|ca| ca.trust_domains.iter().map(String::as_str))
                .collect();
            accepted.sort_unstable();
            accepted.dedup();
            return Err(CertRefusal::ForeignTrustDomain {
                found: identity.trust_domain,
                accepted: accepted.join(", "),
            });
        }
        Err(refusal.unwrap_or_else(|| CertRefusal::NotValid(String::new())))
    }

    /// The first verifier that accepts the chain, else the last refusal.
    fn verify_any(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let mut last = rustls::Error::General("no CA accepts client certificates".into());
        for ca in &self.cas {
            match ca
                .verifier()
                .verifier
                .verify_client_cert(end_entity, intermediates, now)
            {
                Ok(verified) => return Ok(verified),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The signature algorithms handshake signatures are checked with (they do not depend on
    /// the anchors).
    fn algorithms() -> rustls::crypto::WebPkiSupportedAlgorithms {
        super::tls::provider().signature_verification_algorithms
    }
}

impl Verifier {
    /// Whether the chain verifies and was issued by a live CA generation: signed by the active
    /// issuing certificate's key, or chaining to a prepared generation's anchor. A retired
    /// generation, a sibling CA under the same root, or a re-issued CA certificate with another
    /// key does not renew (issue #40).
    fn live_issuer(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), CertRefusal> {
        self.verifier
            .verify_client_cert(leaf, intermediates, now)
            .map_err(|e| CertRefusal::NotValid(e.to_string()))?;
        if podca_signer::x509::certificate_signed_by(leaf, &self.active_issuer_spki).is_ok() {
            return Ok(());
        }
        match &self.prepared {
            Some(prepared)
                if prepared
                    .verify_client_cert(leaf, intermediates, now)
                    .is_ok() =>
            {
                Ok(())
            }
            _ => Err(CertRefusal::NotValid(
                "it was not issued by a live CA generation of podca (the active issuing CA, or \
                 a prepared one): a retired generation or another CA under the same root does \
                 not renew; authenticate with a token"
                    .into(),
            )),
        }
    }
}

/// A client verifier over `anchors`; `None` when there are none.
fn verifier_for(
    anchors: &[CaCertificate],
) -> Result<Option<Arc<dyn ClientCertVerifier>>, AnchorError> {
    if anchors.is_empty() {
        return Ok(None);
    }
    let mut roots = RootCertStore::empty();
    for anchor in anchors {
        roots
            .add(CertificateDer::from(anchor.der().to_vec()))
            .map_err(|e| AnchorError(format!("anchor {}: {e}", anchor.subject())))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), super::tls::provider())
        .allow_unauthenticated()
        .build()
        .map(Some)
        .map_err(|e| AnchorError(e.to_string()))
}

fn build(snapshot: &CaSnapshot) -> Result<Verifier, AnchorError> {
    let accepted = accepted_anchors(snapshot);
    let active = snapshot.ca.roots();
    let prepared: Vec<CaCertificate> = accepted
        .iter()
        .filter(|a| !active.contains(a))
        .cloned()
        .collect();
    let verifier =
        verifier_for(&accepted)?.ok_or_else(|| AnchorError("no anchor to accept".into()))?;
    Ok(Verifier {
        verifier,
        prepared: verifier_for(&prepared)?,
        active_issuer_spki: snapshot.ca.certificate().spki_der().to_vec(),
        generation: snapshot.generation,
    })
}

impl ClientCertVerifier for ClientTrust {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: the anchors change with the CA, and a borrowed list cannot follow the swap. An
    /// empty list tells clients to send their certificate whatever issued it.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verify_any(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &Self::algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &Self::algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Self::algorithms().supported_schemes()
    }
}

/// Token and certificate together: the token's identity (it may say more, e.g. the pod) if it
/// is the certificate's, else a refusal naming both.
pub fn same_identity(certificate: &CertIdentity, token: Identity) -> Result<Identity, AuthError> {
    if token.namespace == certificate.namespace
        && token.service_account == certificate.service_account
    {
        Ok(token)
    } else {
        Err(AuthError::Mismatch(format!(
            "the token is for {} but the client certificate is for {}/{} ({}); send one \
             identity's credentials",
            token.key(),
            certificate.namespace,
            certificate.service_account,
            certificate.spiffe_id
        )))
    }
}

/// The caller's identity from its client certificate and/or its token (see the module docs).
pub struct CertificateAuthenticator {
    tokens: Arc<dyn Authenticator>,
    trust: Arc<ClientTrust>,
    /// What a certificate-only caller must pass to renew ([`crate::renewal`]).
    renewal: Arc<RenewalRules>,
    /// The time a chain is verified at: the process clock.
    clock: Clock,
}

impl fmt::Debug for CertificateAuthenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthenticator")
            .field("tokens", &self.tokens)
            .field("trust", &self.trust)
            .field("renewal", &self.renewal)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthenticator {
    /// With the default renewal rules: chains end after a day, nothing denied, service
    /// accounts not read (see [`Self::with_renewal`]).
    pub fn new(tokens: Arc<dyn Authenticator>, trust: Arc<ClientTrust>, clock: Clock) -> Self {
        CertificateAuthenticator {
            tokens,
            trust,
            renewal: Arc::new(RenewalRules::new(
                DEFAULT_MAX_RENEWAL,
                Denylist::empty(),
                None,
            )),
            clock,
        }
    }

    pub fn with_renewal(mut self, renewal: Arc<RenewalRules>) -> Self {
        self.renewal = renewal;
        self
    }

    fn now(&self) -> UnixTime {
        let seconds = u64::try_from((self.clock)().unix_timestamp()).unwrap_or(0);
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(seconds))
    }
}

#[tonic::async_trait]
impl Authenticator for CertificateAuthenticator {
    async fn authenticate(
        &self,
        peer: &Peer,
        credentials: &Credentials,
    ) -> Result<Identity, AuthError> {
        let Some(presented) = &credentials.client_certificate else {
            return self.tokens.authenticate(peer, credentials).await;
        };
        let certificate = self
            .trust
            .identify(presented, self.now())
            .map_err(|e| AuthError::Invalid(e.to_string()))?;
        let (serial, chain) = presented
            .renewal_facts()
            .map_err(|e| AuthError::Invalid(e.to_string()))?;
        if credentials.bearer.is_some() {
            // A fresh token: the chain of what is issued now starts again.
            let token = self.tokens.authenticate(peer, credentials).await?;
            let mut identity = same_identity(&certificate, token)?;
            identity.authentication.method = AuthMethod::TokenAndCertificate;
            identity.authentication.presented_serial = Some(serial);
            return Ok(identity);
        }
        let chain = self
            .renewal
            .check(
                &serial,
                &certificate.spiffe_id,
                (&certificate.namespace, &certificate.service_account),
                chain,
                (self.clock)(),
            )
            .await
            .map_err(|e| match e {
                CheckError::Refused(refusal) => AuthError::RenewalRefused(refusal),
                CheckError::Unavailable(lookup) => AuthError::AccountUnavailable(lookup),
            })?;
        let mut identity = certificate.identity();
        identity.authentication = Authentication {
            method: AuthMethod::Certificate,
            presented_serial: Some(serial),
            service_account_uid: chain.service_account_uid.clone(),
            renewal: Some(chain),
        };
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use podca_signer::{CaAlgorithm, IssuingCa, MemoryKey};
    use time::{Duration, OffsetDateTime};

    fn root_at(name: &str, not_before: OffsetDateTime) -> Arc<IssuingCa> {
        root(name, not_before)
    }

    fn root(name: &str, not_before: OffsetDateTime) -> Arc<IssuingCa> {
        let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap();
        Arc::new(
            IssuingCa::self_signed_root(Arc::new(key), name, not_before, Duration::days(30))
                .unwrap(),
        )
    }

    #[test]
    fn spiffe_ids_parse_only_in_podca_form() {
        let id = CertIdentity::parse("spiffe://cluster.local/ns/shop/sa/web").unwrap();
        assert_eq!(
            (
                id.trust_domain.as_str(),
                id.namespace.as_str(),
                id.service_account.as_str()
            ),
            ("cluster.local", "shop", "web")
        );
        assert_eq!(id.identity().key(), "shop/web");
        for bad in [
            "https://cluster.local/ns/shop/sa/web",
            "spiffe://cluster.local/ns/shop",
            "spiffe://cluster.local/ns/shop/sa/web/extra",
            "spiffe://cluster.local/sa/web/ns/shop",
            "spiffe:///ns/shop/sa/web",
            "spiffe://cluster.local/ns//sa/web",
            "spiffe://cluster.local/ns/shop/sa/",
        ] {
            let error = CertIdentity::parse(bad).unwrap_err();
            assert!(
                matches!(&error, CertRefusal::NotPodca { uri, .. } if uri == bad),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn retired_anchors_are_not_accepted_and_prepared_ones_are() {
        let now = OffsetDateTime::now_utc();
        let retired = root("retired", now - Duration::days(20));
        let active = root("active", now - Duration::days(10));
        let prepared = root("prepared", now - Duration::days(1));
        let all = [&retired, &active, &prepared]
            .iter()
            .flat_map(|ca| ca.roots().to_vec())
            .collect::<Vec<_>>();
        let fingerprints = |certs: Vec<CaCertificate>| {
            certs
                .iter()
                .map(|c| c.subject().to_owned())
                .collect::<Vec<_>>()
        };
        let subject = |ca: &IssuingCa| ca.roots()[0].subject().to_owned();
        let handle = podca_authority::CaHandle::from_arc(Arc::clone(&active), all.clone());
        assert_eq!(
            fingerprints(accepted_anchors(&handle.current())),
            [subject(&active), subject(&prepared)]
        );
        // Before the rotation: only the active root is published.
        let handle = podca_authority::CaHandle::from_arc(Arc::clone(&retired), vec![]);
        assert_eq!(
            fingerprints(accepted_anchors(&handle.current())),
            [subject(&retired)]
        );
        // After the next activation the former active root is the retired one.
        let handle = podca_authority::CaHandle::from_arc(Arc::clone(&prepared), all);
        assert_eq!(
            fingerprints(accepted_anchors(&handle.current())),
            [subject(&prepared)]
        );
    }

    /// A leaf for `shop/web` of `cluster.local`, issued by `ca`, as the chain a client sends.
    fn client_chain(ca: &IssuingCa) -> ClientCertificate {
        let key = rcgen::KeyPair::generate().unwrap();
        let subject = podca_signer::SubjectKey::from_spki_der(
            &rcgen::PublicKeyData::subject_public_key_info(&key),
        )
        .unwrap();
        let now = OffsetDateTime::now_utc();
        let validity = podca_signer::Validity {
            not_before: now - Duration::minutes(1),
            not_after: now + Duration::hours(1),
            begin_refresh_at: now + Duration::minutes(30),
        };
        let issued = ca
            .issue(
                &subject,
                "spiffe://cluster.local/ns/shop/sa/web",
                &[],
                &validity,
            )
            .unwrap();
        let chain = podca_signer::x509::certificates_from_pem(&issued.chain_pem).unwrap();
        ClientCertificate::new(Arc::new(
            chain.into_iter().map(CertificateDer::from).collect(),
        ))
        .unwrap()
    }

    /// Issue #40: mTLS renewal trusts the live issuing CA, not every chain to the root. A
    /// sibling CA under the same root (another intermediate, or the issuing certificate
    /// re-issued with another key) does not renew; the active issuing CA and a prepared
    /// generation do.
    #[test]
    fn only_a_live_issuing_ca_renews() {
        let now = OffsetDateTime::now_utc();
        let root = root("root", now - Duration::days(2));
        let intermediate = |name: &str| {
            let key = MemoryKey::generate(CaAlgorithm::EcdsaP256).unwrap();
            Arc::new(
                root.sign_intermediate(
                    Arc::new(key),
                    name,
                    now - Duration::days(1),
                    Duration::days(10),
                )
                .unwrap(),
            )
        };
        let (active, sibling) = (intermediate("issuing"), intermediate("issuing"));
        let prepared = root_at("prepared", now - Duration::hours(1));
        let mut anchors = root.roots().to_vec();
        anchors.extend(prepared.roots().iter().cloned());
        let handle = podca_authority::CaHandle::from_arc(Arc::clone(&active), anchors);
        let trust = ClientTrust::new(&handle.current(), vec!["cluster.local".into()]).unwrap();
        let at = UnixTime::now();
        assert_eq!(
            trust
                .identify(&client_chain(&active), at)
                .map(|i| i.spiffe_id),
            Ok("spiffe://cluster.local/ns/shop/sa/web".to_owned())
        );
        assert!(trust.identify(&client_chain(&prepared), at).is_ok());
        match trust.identify(&client_chain(&sibling), at) {
            Err(CertRefusal::NotValid(why)) => {
                assert!(why.contains("not issued by a live CA generation"), "{why}")
            }
            other => panic!("a sibling CA's certificate renewed: {other:?}"),
        }
        // The handshake itself still lets it in: it may authenticate with a token instead.
        let chain = client_chain(&sibling);
        assert!(
            trust
                .verify_client_cert(&chain.chain[0], &chain.chain[1..], at)
                .is_ok()
        );
    }

    #[test]
    fn token_and_certificate_must_agree() {
        let cert = CertIdentity::parse("spiffe://cluster.local/ns/shop/sa/web").unwrap();
        let mut token = Identity::service_account("shop", "web");
        token.pod_name = Some("web-0".into());
        assert_eq!(same_identity(&cert, token.clone()), Ok(token));
        for (ns, sa) in [("shop", "db"), ("other", "web")] {
            let error = same_identity(&cert, Identity::service_account(ns, sa)).unwrap_err();
            assert_eq!(
                error,
                AuthError::Mismatch(format!(
                    "the token is for {ns}/{sa} but the client certificate is for shop/web \
                     (spiffe://cluster.local/ns/shop/sa/web); send one identity's credentials"
                ))
            );
        }
    }

    #[test]
    fn debug_shows_no_certificate_bytes() {
        let chain = Arc::new(vec![CertificateDer::from(vec![0x30, 0x82, 0xAB, 0xCD])]);
        let presented = ClientCertificate::new(chain).unwrap();
        assert_eq!(
            format!("{presented:?}"),
            "ClientCertificate { certificates: 1 }"
        );
        assert!(ClientCertificate::new(Arc::new(vec![])).is_none());
    }
}
