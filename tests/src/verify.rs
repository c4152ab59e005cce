//! The independent verifier: `openssl verify` on an issued chain against trust anchors, the
//! way a TLS peer would check it, so podca's own chain building is never the judge of itself.

use std::fmt;
use std::process::Command;

/// openssl's `X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY`: no anchor signed the chain.
pub const UNABLE_TO_GET_LOCAL_ISSUER: u32 = 20;
/// openssl's `X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN`: the chain ends in a root not trusted here.
pub const SELF_SIGNED_IN_CHAIN: u32 = 19;

/// Why `openssl verify` refused a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyFailure {
    /// The first `error N at D depth lookup: …` code, when openssl printed one.
    pub code: Option<u32>,
    /// What was checked: the leaf's subject and SANs, the chain and bundle sizes.
    pub what: String,
    /// openssl's stdout and stderr.
    pub output: String,
}

impl fmt::Display for VerifyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self
            .code
            .map_or_else(|| "no error code".to_owned(), |c| format!("error {c}"));
        write!(
            f,
            "openssl verify -x509_strict refused {} ({code}):\n{}",
            self.what,
            self.output.trim_end()
        )
    }
}

impl std::error::Error for VerifyFailure {}

/// The PEM `CERTIFICATE` blocks of `text` (a chain, a bundle, or a credential bundle with its
/// key), each re-encoded on its own.
pub fn pem_blocks(text: &str) -> Vec<String> {
    pem::parse_many(text)
        .unwrap_or_else(|e| panic!("not PEM ({e}):\n{text}"))
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| pem::encode(&p))
        .collect()
}

/// PEM text (LF line endings, as podca writes it) of DER certificates, in order.
pub fn der_to_pem(ders: &[&[u8]]) -> String {
    let lf = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    ders.iter()
        .map(|d| pem::encode_config(&pem::Pem::new("CERTIFICATE", d.to_vec()), lf))
        .collect()
}

/// `openssl verify -x509_strict` of the first certificate of `chain_pem` against the
/// certificates of `anchors_pem`, with the rest of the chain as untrusted intermediates.
/// `chain_pem` may also be a credential bundle (its key is skipped).
pub fn openssl_verify(chain_pem: &str, anchors_pem: &str) -> Result<(), VerifyFailure> {
    openssl_verify_at(chain_pem, anchors_pem, None)
}

/// [`openssl_verify`] at `at` (Unix seconds, openssl's `-attime`) instead of now.
pub fn openssl_verify_at(
    chain_pem: &str,
    anchors_pem: &str,
    at: Option<i64>,
) -> Result<(), VerifyFailure> {
    match at {
        Some(at) => openssl_verify_with(chain_pem, anchors_pem, &["-attime", &at.to_string()]),
        None => openssl_verify_with(chain_pem, anchors_pem, &[]),
    }
}

/// [`openssl_verify`] with more of `openssl verify`'s options, e.g. `-verify_ip 10.0.0.7` or
/// `-verify_hostname web.shop.svc` (the leaf must carry that name, as a TLS client checks it).
pub fn openssl_verify_with(
    chain_pem: &str,
    anchors_pem: &str,
    options: &[&str],
) -> Result<(), VerifyFailure> {
    let blocks = pem_blocks(chain_pem);
    assert!(
        !blocks.is_empty(),
        "no certificate in the chain:\n{chain_pem}"
    );
    let anchors = pem_blocks(anchors_pem);
    assert!(
        !anchors.is_empty(),
        "no certificate in the anchors:\n{anchors_pem}"
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    };
    let leaf = write("leaf.pem", &blocks[0]);
    let untrusted = write("untrusted.pem", &blocks[1..].concat());
    let anchors_file = write("anchors.pem", &anchors.concat());
    let mut cmd = Command::new("openssl");
    cmd.args(["verify", "-x509_strict", "-CAfile"])
        .arg(&anchors_file);
    cmd.args(options);
    if blocks.len() > 1 {
        cmd.arg("-untrusted").arg(&untrusted);
    }
    let out = cmd
        .arg(&leaf)
        .output()
        .unwrap_or_else(|e| panic!("openssl is required (apt-get install -y openssl): {e}"));
    if out.status.success() {
        return Ok(());
    }
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Err(VerifyFailure {
        code: error_code(&output),
        what: format!(
            "the leaf {} with {} intermediate(s) against {} anchor(s)",
            describe_leaf(&blocks[0]),
            blocks.len() - 1,
            anchors.len()
        ),
        output,
    })
}

/// Panics with openssl's reason unless `chain_pem` verifies against `anchors_pem`.
#[track_caller]
pub fn assert_verifies(chain_pem: &str, anchors_pem: &str) {
    if let Err(e) = openssl_verify(chain_pem, anchors_pem) {
        panic!("{e}");
    }
}

/// Panics unless openssl refuses `chain_pem` for lack of an anchor that signed it.
#[track_caller]
pub fn assert_no_anchor_signed(chain_pem: &str, anchors_pem: &str) {
    match openssl_verify(chain_pem, anchors_pem) {
        Ok(()) => panic!("the chain verified against anchors that did not sign it"),
        Err(e) => assert_eq!(e.code, Some(UNABLE_TO_GET_LOCAL_ISSUER), "{e}"),
    }
}

/// rustls-webpki's verdict (aws-lc-rs algorithms) on the first certificate of `chain_pem` as a
/// client certificate now, under the certificates of `anchors_pem`, the rest of the chain as
/// intermediates: the second implementation, independent of podca's and of OpenSSL.
pub fn webpki_verify(chain_pem: &str, anchors_pem: &str) -> Result<(), webpki::Error> {
    webpki_verify_at(chain_pem, anchors_pem, rustls::pki_types::UnixTime::now())
}

/// [`webpki_verify`] at `at`.
pub fn webpki_verify_at(
    chain_pem: &str,
    anchors_pem: &str,
    at: rustls::pki_types::UnixTime,
) -> Result<(), webpki::Error> {
    let ders = |text: &str| -> Vec<rustls::pki_types::CertificateDer<'static>> {
        pem::parse_many(text)
            .unwrap_or_else(|e| panic!("not PEM ({e}):\n{text}"))
            .into_iter()
            .filter(|p| p.tag() == "CERTIFICATE")
            .map(|p| rustls::pki_types::CertificateDer::from(p.into_contents()))
            .collect()
    };
    let roots = ders(anchors_pem);
    let anchors: Vec<_> = roots
        .iter()
        .map(|d| {
            webpki::anchor_from_trusted_cert(d)
                .unwrap_or_else(|e| panic!("an anchor that is not a CA certificate: {e:?}"))
                .to_owned()
        })
        .collect();
    let chain = ders(chain_pem);
    let (leaf, intermediates) = chain
        .split_first()
        .unwrap_or_else(|| panic!("no certificate in the chain:\n{chain_pem}"));
    let leaf = webpki::EndEntityCert::try_from(leaf)?;
    let algorithms = rustls::crypto::aws_lc_rs::default_provider()
        .signature_verification_algorithms
        .all;
    leaf.verify_for_usage(
        algorithms,
        &anchors,
        intermediates,
        at,
        webpki::KeyUsage::client_auth(),
        None,
        None,
    )
    .map(|_| ())
}

/// Panics unless `chain_pem` verifies under `anchors_pem` and fails under `foreign_pem`, by
/// both openssl (no anchor signed it) and rustls-webpki (unknown issuer): a certificate of one
/// trust domain must never verify under another's bundle.
#[track_caller]
pub fn assert_verifies_only_under(chain_pem: &str, anchors_pem: &str, foreign_pem: &str) {
    assert_verifies_only_under_at(chain_pem, anchors_pem, foreign_pem, None);
}

/// [`assert_verifies_only_under`] at `at` (Unix seconds; `None`: now), for simulated time.
#[track_caller]
pub fn assert_verifies_only_under_at(
    chain_pem: &str,
    anchors_pem: &str,
    foreign_pem: &str,
    at: Option<i64>,
) {
    let when = match at {
        Some(seconds) => rustls::pki_types::UnixTime::since_unix_epoch(
            std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or_default()),
        ),
        None => rustls::pki_types::UnixTime::now(),
    };
    if let Err(e) = openssl_verify_at(chain_pem, anchors_pem, at) {
        panic!("{e}");
    }
    if let Err(e) = webpki_verify_at(chain_pem, anchors_pem, when) {
        panic!("rustls-webpki refused the chain under its own anchors: {e:?}");
    }
    match openssl_verify_at(chain_pem, foreign_pem, at) {
        Ok(()) => panic!("the chain verified against anchors that did not sign it"),
        // No anchor signed it; or the chain ends in a root (an HSM-held root that signs
        // leaves) that is not among the anchors.
        Err(e) => assert!(
            matches!(
                e.code,
                Some(UNABLE_TO_GET_LOCAL_ISSUER | SELF_SIGNED_IN_CHAIN)
            ),
            "{e}"
        ),
    }
    match webpki_verify_at(chain_pem, foreign_pem, when) {
        // No anchor issued it; with a chain that carries its own root (an HSM-held root that
        // signs leaves), webpki reports the last path it tried: that root's self-signature
        // under a foreign anchor's key.
        Err(webpki::Error::UnknownIssuer | webpki::Error::InvalidSignatureForPublicKey) => {}
        other => panic!("rustls-webpki under a foreign bundle: {other:?}, not a refusal"),
    }
}

/// The URI SANs of the first certificate of `chain_pem`.
pub fn leaf_uris(chain_pem: &str) -> Vec<String> {
    let blocks = pem::parse_many(chain_pem).unwrap_or_else(|e| panic!("not PEM ({e})"));
    let leaf = blocks
        .iter()
        .find(|p| p.tag() == "CERTIFICATE")
        .unwrap_or_else(|| panic!("no certificate in:\n{chain_pem}"));
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.contents())
        .unwrap_or_else(|e| panic!("the leaf does not parse: {e}"));
    cert.subject_alternative_name()
        .ok()
        .flatten()
        .map(|sans| {
            sans.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some((*u).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `error 20 at 0 depth lookup: …` → 20.
fn error_code(output: &str) -> Option<u32> {
    output.lines().find_map(|l| {
        l.split_once("error ")
            .and_then(|(_, rest)| rest.split_once(" at "))
            .and_then(|(n, _)| n.parse().ok())
    })
}

fn describe_leaf(pem_text: &str) -> String {
    let Ok(block) = pem::parse(pem_text) else {
        return "(not PEM)".into();
    };
    match x509_parser::parse_x509_certificate(block.contents()) {
        Ok((_, cert)) => {
            let sans = cert
                .subject_alternative_name()
                .ok()
                .flatten()
                .map(|s| format!("{:?}", s.value.general_names))
                .unwrap_or_else(|| "no SANs".into());
            format!("[subject {:?}, {sans}]", cert.subject().to_string())
        }
        Err(e) => format!("(not a certificate: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_code_is_the_first_error_line() {
        let out = "CN = x\nerror 20 at 0 depth lookup: unable to get local issuer certificate\n\
                   error leaf.pem: verification failed\n";
        assert_eq!(error_code(out), Some(UNABLE_TO_GET_LOCAL_ISSUER));
        assert_eq!(error_code("error leaf.pem: verification failed\n"), None);
    }
}
