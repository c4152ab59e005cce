//! Connecting to a token: slot → session → login → key → public key.

use cryptoki::context::Pkcs11;
use cryptoki::error::RvError;
use cryptoki::mechanism::MechanismType;
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::{Limit, Slot};
use cryptoki::types::AuthPin;

use super::Pkcs11Uri;
use super::der;
use super::fault::{ConnectError, is_rv};
use crate::backend::CaAlgorithm;

/// Everything about the key that does not change while running.
#[derive(Clone)]
pub(super) struct KeyFacts {
    pub(super) algorithm: CaAlgorithm,
    pub(super) public_raw: Vec<u8>,
    /// ECDSA coordinate length, or 0 for RSA.
    pub(super) coordinate_len: usize,
    /// RSA: whether the token hashes (`CKM_SHA256_RSA_PKCS`).
    pub(super) rsa_token_hashes: bool,
}

/// Token properties found while connecting.
pub(super) struct Found {
    pub(super) slot: Slot,
    pub(super) session: Session,
    pub(super) key: ObjectHandle,
    pub(super) facts: KeyFacts,
    pub(super) max_sessions: Option<u64>,
}

pub(super) fn find_slot(ctx: &Pkcs11, uri: &Pkcs11Uri) -> Result<Slot, ConnectError> {
    let slots = ctx
        .get_slots_with_token()
        .map_err(|e| ConnectError::Ck("listing slots", e))?;
    let mut available = vec![];
    for slot in slots {
        let info = match ctx.get_token_info(slot) {
            Ok(info) => info,
            // A token can disappear between the two calls.
            Err(_) => continue,
        };
        let matches = info.label() == uri.token
            && uri
                .manufacturer
                .as_deref()
                .is_none_or(|m| info.manufacturer_id() == m)
            && uri.model.as_deref().is_none_or(|m| info.model() == m)
            && uri
                .serial
                .as_deref()
                .is_none_or(|s| info.serial_number() == s);
        if matches && info.token_initialized() {
            return Ok(slot);
        }
        if info.token_initialized() {
            available.push(format!("{:?}", info.label()));
        }
    }
    Err(ConnectError::NoToken { available })
}

/// The mechanisms podca may use (key generation and signing) that the token in `slot` offers.
///
/// Asked one by one (`C_GetMechanismInfo`), not as `C_GetMechanismList`: cryptoki logs an
/// ERROR line for every listed mechanism it has no name for, and real tokens list dozens of
/// vendor and newer ones (SoftHSM2: about 60), which a start-up log must not be full of.
pub(super) fn offered_mechanisms(
    ctx: &Pkcs11,
    slot: Slot,
) -> Result<Vec<MechanismType>, ConnectError> {
    const USED: [MechanismType; 7] = [
        MechanismType::ECC_KEY_PAIR_GEN,
        MechanismType::ECDSA,
        MechanismType::RSA_PKCS_KEY_PAIR_GEN,
        MechanismType::RSA_PKCS,
        MechanismType::SHA256_RSA_PKCS,
        MechanismType::ECC_EDWARDS_KEY_PAIR_GEN,
        MechanismType::EDDSA,
    ];
    let mut offered = Vec::new();
    for mechanism in USED {
        match ctx.get_mechanism_info(slot, mechanism) {
            Ok(_) => offered.push(mechanism),
            Err(e) if is_rv(&e, RvError::MechanismInvalid) => {}
            Err(e) => return Err(ConnectError::Ck("asking for a mechanism", e)),
        }
    }
    Ok(offered)
}

pub(super) fn login(session: &Session, pin: &AuthPin) -> Result<(), ConnectError> {
    match session.login(UserType::User, Some(pin)) {
        Ok(()) => Ok(()),
        // Login state is per application and token: another session logged in already.
        Err(e) if is_rv(&e, RvError::UserAlreadyLoggedIn) => Ok(()),
        Err(e)
            if is_rv(&e, RvError::PinIncorrect)
                || is_rv(&e, RvError::PinLocked)
                || is_rv(&e, RvError::PinExpired)
                || is_rv(&e, RvError::PinInvalid)
                || is_rv(&e, RvError::PinLenRange) =>
        {
            Err(ConnectError::Pin(e))
        }
        Err(e) => Err(ConnectError::Ck("logging in", e)),
    }
}

fn key_template(uri: &Pkcs11Uri, class: ObjectClass) -> Vec<Attribute> {
    let mut template = vec![Attribute::Class(class)];
    if let Some(label) = &uri.object {
        template.push(Attribute::Label(label.as_bytes().to_vec()));
    }
    if let Some(id) = &uri.id {
        template.push(Attribute::Id(id.clone()));
    }
    template
}

pub(super) fn find_private_keys(
    session: &Session,
    uri: &Pkcs11Uri,
) -> Result<Vec<ObjectHandle>, ConnectError> {
    session
        .find_objects(&key_template(uri, ObjectClass::PRIVATE_KEY))
        .map_err(|e| ConnectError::Ck("finding the private key", e))
}

pub(super) fn connect(
    ctx: &Pkcs11,
    uri: &Pkcs11Uri,
    pin: &AuthPin,
    startup: bool,
) -> Result<Found, ConnectError> {
    let slot = find_slot(ctx, uri)?;
    let token = ctx
        .get_token_info(slot)
        .map_err(|e| ConnectError::Ck("reading token information", e))?;
    let max_sessions = match token.max_session_count() {
        Limit::Max(n) if n > 0 => Some(n),
        _ => None,
    };
    let session = ctx
        .open_ro_session(slot)
        .map_err(|e| ConnectError::Ck("opening a session", e))?;
    login(&session, pin)?;
    let keys = find_private_keys(&session, uri)?;
    let key = match keys.as_slice() {
        [key] => *key,
        [] => {
            return Err(ConnectError::Key(
                "no private key with this label/id in the token".into(),
            ));
        }
        many => {
            return Err(ConnectError::Key(format!(
                "{} private keys match; add id= or object= to the URI to name one",
                many.len()
            )));
        }
    };
    let attrs = session
        .get_attributes(
            key,
            &[
                AttributeType::KeyType,
                AttributeType::Sign,
                AttributeType::Id,
            ],
        )
        .map_err(|e| ConnectError::Ck("reading the private key attributes", e))?;
    let mut key_type = None;
    let mut can_sign = false;
    let mut id = None;
    for a in attrs {
        match a {
            Attribute::KeyType(t) => key_type = Some(t),
            Attribute::Sign(s) => can_sign = s,
            Attribute::Id(i) => id = Some(i),
            _ => {}
        }
    }
    if !can_sign {
        return Err(ConnectError::Key(
            "the private key does not allow signing (CKA_SIGN)".into(),
        ));
    }
    // The public half: the public key object with the same id (or label), which carries
    // CKA_EC_POINT; RSA moduli are readable on the private key too.
    let mut public_uri = uri.clone();
    if let Some(id) = id.filter(|i| !i.is_empty()) {
        public_uri.id = Some(id);
    }
    let facts = if key_type == Some(KeyType::EC) {
        let (params, point) = ec_public_key(&session, &public_uri, "EC")?;
        let (algorithm, coordinate_len) = match params.as_deref() {
            Some(p) if p == der::P256_PARAMS => (CaAlgorithm::EcdsaP256, 32),
            Some(p) if p == der::P384_PARAMS => (CaAlgorithm::EcdsaP384, 48),
            _ => {
                return Err(ConnectError::Key(
                    "unsupported EC curve (podca signs with P-256 or P-384)".into(),
                ));
            }
        };
        let public_raw = point
            .as_deref()
            .and_then(|p| der::ec_point_from_attribute(p, 1 + 2 * coordinate_len))
            .ok_or_else(|| ConnectError::Key("CKA_EC_POINT is not an uncompressed point".into()))?;
        KeyFacts {
            algorithm,
            public_raw,
            coordinate_len,
            rsa_token_hashes: false,
        }
    } else if key_type == Some(KeyType::EC_EDWARDS) {
        // Ed25519 (the ledger log's checkpoint key; CA keys are refused by `supports`).
        let (params, point) = ec_public_key(&session, &public_uri, "EdDSA")?;
        if params.as_deref() != Some(&der::ED25519_PARAMS[..]) {
            return Err(ConnectError::Key(
                "unsupported Edwards curve (podca signs with Ed25519)".into(),
            ));
        }
        let public_raw = point
            .as_deref()
            .and_then(der::ed25519_point_from_attribute)
            .ok_or_else(|| ConnectError::Key("CKA_EC_POINT is not an Ed25519 key".into()))?;
        KeyFacts {
            algorithm: CaAlgorithm::Ed25519,
            public_raw,
            coordinate_len: 0,
            rsa_token_hashes: false,
        }
    } else if key_type == Some(KeyType::RSA) {
        let attrs = session
            .get_attributes(
                key,
                &[AttributeType::Modulus, AttributeType::PublicExponent],
            )
            .map_err(|e| ConnectError::Ck("reading the RSA public key", e))?;
        let (mut modulus, mut exponent) = (None, None);
        for a in attrs {
            match a {
                Attribute::Modulus(m) => modulus = Some(m),
                Attribute::PublicExponent(e) => exponent = Some(e),
                _ => {}
            }
        }
        let (Some(modulus), Some(exponent)) = (modulus, exponent) else {
            return Err(ConnectError::Key(
                "the RSA key hides its modulus or exponent".into(),
            ));
        };
        let bits = modulus.iter().skip_while(|b| **b == 0).count() * 8;
        if bits < 2048 {
            return Err(ConnectError::Key(format!(
                "RSA key of about {bits} bits: at least 2048 required"
            )));
        }
        let mechanisms = offered_mechanisms(ctx, slot)?;
        KeyFacts {
            algorithm: CaAlgorithm::RsaSha256,
            public_raw: der::rsa_public_key(&modulus, &exponent),
            coordinate_len: 0,
            rsa_token_hashes: mechanisms.contains(&MechanismType::SHA256_RSA_PKCS),
        }
    } else {
        return Err(ConnectError::Key(
            "unsupported key type (podca signs with EC P-256/P-384 or RSA keys)".into(),
        ));
    };
    if startup {
        tracing::info!(key = %uri, algorithm = %facts.algorithm, "PKCS#11 CA key found");
    }
    Ok(Found {
        slot,
        session,
        key,
        facts,
        max_sessions,
    })
}

/// An attribute a token may leave out.
type MaybeBytes = Option<Vec<u8>>;

/// CKA_EC_PARAMS and CKA_EC_POINT of the one public key object `public_uri` names, next to a
/// private key of `kind` (EC, EdDSA).
fn ec_public_key(
    session: &Session,
    public_uri: &Pkcs11Uri,
    kind: &str,
) -> Result<(MaybeBytes, MaybeBytes), ConnectError> {
    let publics = session
        .find_objects(&key_template(public_uri, ObjectClass::PUBLIC_KEY))
        .map_err(|e| ConnectError::Ck("finding the public key", e))?;
    let [public] = publics.as_slice() else {
        return Err(ConnectError::Key(format!(
            "expected one public key object next to the {kind} private key, found {}",
            publics.len()
        )));
    };
    let attrs = session
        .get_attributes(*public, &[AttributeType::EcParams, AttributeType::EcPoint])
        .map_err(|e| ConnectError::Ck("reading the public key", e))?;
    let (mut params, mut point) = (None, None);
    for a in attrs {
        match a {
            Attribute::EcParams(p) => params = Some(p),
            Attribute::EcPoint(p) => point = Some(p),
            _ => {}
        }
    }
    Ok((params, point))
}
