//! Generating a key pair inside the token.

use cryptoki::mechanism::{Mechanism, MechanismType};
use cryptoki::object::{Attribute, ObjectClass};

use super::connect::{find_private_keys, find_slot, login, offered_mechanisms};
use super::der;
use super::fault::ConnectError;
use super::module::Module;
use super::{Pkcs11Config, Pkcs11Key};
use crate::backend::{BackendError, CaAlgorithm};

impl Pkcs11Key {
    /// Whether this backend can hold a CA key of `algorithm`: ECDSA P-256/P-384 and RSA. The
    /// error names the backends that can (Ed25519 and ML-DSA: the file or Secret backend).
    pub fn supports(algorithm: CaAlgorithm) -> Result<(), BackendError> {
        match algorithm {
            CaAlgorithm::EcdsaP256 | CaAlgorithm::EcdsaP384 | CaAlgorithm::RsaSha256 => Ok(()),
            CaAlgorithm::Ed25519
            | CaAlgorithm::MlDsa44
            | CaAlgorithm::MlDsa65
            | CaAlgorithm::MlDsa87 => Err(BackendError::InvalidKey(format!(
                "the PKCS#11 backend supports ecdsa-p256, ecdsa-p384 and rsa-sha256 CA keys, \
                 not {algorithm}{}",
                if algorithm.is_ml_dsa() {
                    " (ML-DSA CA keys need the file or Secret backend)"
                } else {
                    ""
                }
            ))),
        }
    }

    /// Generates a key pair inside the token (`CKA_TOKEN`, `CKA_PRIVATE`, `CKA_SENSITIVE`,
    /// not `CKA_EXTRACTABLE`, `CKA_SIGN` only), labelled with the URI's `object` and `id` (a
    /// random 8-byte id when the URI has none), then opens it. Refuses when a private key
    /// matching the URI already exists. RSA keys are 3072 bits.
    pub fn generate(
        config: &Pkcs11Config,
        algorithm: CaAlgorithm,
    ) -> Result<Pkcs11Key, BackendError> {
        Self::supports(algorithm)?;
        Self::generate_in_token(config, algorithm)
    }

    /// The Ed25519 key `config.uri` names (by its `object` label), made in the token with
    /// [`Pkcs11Key::generate`]'s protections when there is none: the ledger log's checkpoint
    /// key beside a PKCS#11 CA. Also whether it was made now.
    pub fn open_or_generate_ed25519(
        config: &Pkcs11Config,
    ) -> Result<(Pkcs11Key, bool), BackendError> {
        let module = Module::get(&config.module()?)?;
        let pin = config.pin.read()?;
        let exists = {
            let ctx = module.read();
            let start = |e: ConnectError| e.startup(&config.uri);
            let slot = find_slot(&ctx, &config.uri).map_err(start)?;
            let session = ctx
                .open_ro_session(slot)
                .map_err(|e| start(ConnectError::Ck("opening a session", e)))?;
            login(&session, &pin).map_err(start)?;
            !find_private_keys(&session, &config.uri)
                .map_err(start)?
                .is_empty()
        };
        let key = match exists {
            true => Self::open(config)?,
            false => Self::generate_in_token(config, CaAlgorithm::Ed25519)?,
        };
        if key.facts.algorithm != CaAlgorithm::Ed25519 {
            return Err(BackendError::InvalidKey(format!(
                "{}: holds a {} key, not Ed25519",
                config.uri, key.facts.algorithm
            )));
        }
        Ok((key, !exists))
    }

    fn generate_in_token(
        config: &Pkcs11Config,
        algorithm: CaAlgorithm,
    ) -> Result<Pkcs11Key, BackendError> {
        let module = Module::get(&config.module()?)?;
        let pin = config.pin.read()?;
        let mut uri = config.uri.clone();
        let id = match &uri.id {
            Some(id) => id.clone(),
            None => {
                let mut id = vec![0u8; 8];
                aws_lc_rs::rand::fill(&mut id).map_err(|_| {
                    BackendError::Unavailable("the system random number generator failed".into())
                })?;
                uri.id = Some(id.clone());
                id
            }
        };
        {
            let ctx = module.read();
            let start = |e: ConnectError| e.startup(&uri);
            let slot = find_slot(&ctx, &uri).map_err(start)?;
            let session = ctx
                .open_rw_session(slot)
                .map_err(|e| start(ConnectError::Ck("opening a read-write session", e)))?;
            let offered = offered_mechanisms(&ctx, slot).map_err(start)?;
            check_mechanisms(algorithm, &offered)
                .map_err(|missing| start(ConnectError::Key(missing.to_string())))?;
            login(&session, &pin).map_err(start)?;
            // Check with the URI as given: a generated id must not hide an existing label.
            if !find_private_keys(&session, &config.uri)
                .map_err(start)?
                .is_empty()
            {
                return Err(BackendError::InvalidKey(format!(
                    "{uri}: a private key with this label/id already exists in the token; \
                     open it instead of generating a new one"
                )));
            }
            let mut public = vec![
                Attribute::Token(true),
                Attribute::Private(false),
                Attribute::Verify(true),
                Attribute::Id(id.clone()),
            ];
            let mut private = vec![
                Attribute::Token(true),
                Attribute::Private(true),
                Attribute::Sensitive(true),
                Attribute::Extractable(false),
                Attribute::Sign(true),
                Attribute::Decrypt(false),
                Attribute::Derive(false),
                Attribute::Id(id),
            ];
            if let Some(label) = &uri.object {
                public.push(Attribute::Label(label.as_bytes().to_vec()));
                private.push(Attribute::Label(label.as_bytes().to_vec()));
            }
            let mechanism = match algorithm {
                CaAlgorithm::EcdsaP256 => {
                    public.push(Attribute::EcParams(der::P256_PARAMS.to_vec()));
                    Mechanism::EccKeyPairGen
                }
                CaAlgorithm::EcdsaP384 => {
                    public.push(Attribute::EcParams(der::P384_PARAMS.to_vec()));
                    Mechanism::EccKeyPairGen
                }
                CaAlgorithm::RsaSha256 => {
                    public.push(Attribute::ModulusBits(3072.into()));
                    public.push(Attribute::PublicExponent(vec![0x01, 0x00, 0x01]));
                    Mechanism::RsaPkcsKeyPairGen
                }
                CaAlgorithm::Ed25519 => {
                    public.push(Attribute::EcParams(der::ED25519_PARAMS.to_vec()));
                    Mechanism::EccEdwardsKeyPairGen
                }
                // Refused by `supports` above.
                CaAlgorithm::MlDsa44 | CaAlgorithm::MlDsa65 | CaAlgorithm::MlDsa87 => {
                    return Err(Self::supports(algorithm).err().unwrap_or_else(|| {
                        BackendError::InvalidKey(format!("{algorithm} keys are not generated here"))
                    }));
                }
            };
            session
                .generate_key_pair(&mechanism, &public, &private)
                .map_err(|e| start(ConnectError::Ck("generating the key pair", e)))?;
        }
        let mut config = config.clone();
        config.uri = uri;
        Self::open(&config)
    }

    /// Whether the token `config.uri` names can generate and sign with `algorithm` keys (its
    /// mechanism list; no login needed). The error names the algorithm and what is missing.
    pub fn token_supports(
        config: &Pkcs11Config,
        algorithm: CaAlgorithm,
    ) -> Result<(), BackendError> {
        Self::supports(algorithm)?;
        let module = Module::get(&config.module()?)?;
        let ctx = module.read();
        let uri = &config.uri;
        let slot = find_slot(&ctx, uri).map_err(|e| e.startup(uri))?;
        let offered = offered_mechanisms(&ctx, slot).map_err(|e| e.startup(uri))?;
        check_mechanisms(algorithm, &offered)
            .map_err(|missing| ConnectError::Key(missing.to_string()).startup(uri))
    }

    /// Destroys the key pair `config.uri` names (its private and public objects, matched by
    /// label and id). Returns how many objects were destroyed; none found is not an error (the
    /// key is already gone). Refuses a URI with neither `object` nor `id` (it would match
    /// every key on the token).
    pub fn destroy(config: &Pkcs11Config) -> Result<usize, BackendError> {
        let uri = &config.uri;
        if uri.object.is_none() && uri.id.is_none() {
            return Err(BackendError::InvalidKey(format!(
                "{uri}: refusing to destroy keys by token alone; name the key with object= or id="
            )));
        }
        let module = Module::get(&config.module()?)?;
        let pin = config.pin.read()?;
        let ctx = module.read();
        let start = |e: ConnectError| e.startup(uri);
        let slot = find_slot(&ctx, uri).map_err(start)?;
        let session = ctx
            .open_rw_session(slot)
            .map_err(|e| start(ConnectError::Ck("opening a read-write session", e)))?;
        login(&session, &pin).map_err(start)?;
        let mut destroyed = 0;
        for class in [ObjectClass::PRIVATE_KEY, ObjectClass::PUBLIC_KEY] {
            let mut template = vec![Attribute::Class(class)];
            if let Some(label) = &uri.object {
                template.push(Attribute::Label(label.as_bytes().to_vec()));
            }
            if let Some(id) = &uri.id {
                template.push(Attribute::Id(id.clone()));
            }
            let objects = session
                .find_objects(&template)
                .map_err(|e| start(ConnectError::Ck("finding the key objects", e)))?;
            for object in objects {
                session
                    .destroy_object(object)
                    .map_err(|e| start(ConnectError::Ck("destroying a key object", e)))?;
                destroyed += 1;
            }
        }
        Ok(destroyed)
    }
}

/// Why a token cannot make `algorithm` keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum MechanismError {
    #[error("{0} keys are not made in a PKCS#11 token")]
    NotInTokens(CaAlgorithm),
    #[error("the token does not offer {} needed for {algorithm} keys", missing.join(" and "))]
    Missing {
        algorithm: CaAlgorithm,
        missing: Vec<&'static str>,
    },
}

/// Whether a token offering `offered` can generate and sign with `algorithm` keys; the error
/// names the algorithm and the missing mechanisms.
pub(super) fn check_mechanisms(
    algorithm: CaAlgorithm,
    offered: &[MechanismType],
) -> Result<(), MechanismError> {
    let needed: &[(MechanismType, &'static str)] = match algorithm {
        CaAlgorithm::EcdsaP256 | CaAlgorithm::EcdsaP384 => &[
            (MechanismType::ECC_KEY_PAIR_GEN, "CKM_EC_KEY_PAIR_GEN"),
            (MechanismType::ECDSA, "CKM_ECDSA"),
        ],
        // Signing needs CKM_RSA_PKCS or CKM_SHA256_RSA_PKCS (see `sign`).
        CaAlgorithm::RsaSha256 if offered.contains(&MechanismType::SHA256_RSA_PKCS) => &[(
            MechanismType::RSA_PKCS_KEY_PAIR_GEN,
            "CKM_RSA_PKCS_KEY_PAIR_GEN",
        )],
        CaAlgorithm::RsaSha256 => &[
            (
                MechanismType::RSA_PKCS_KEY_PAIR_GEN,
                "CKM_RSA_PKCS_KEY_PAIR_GEN",
            ),
            (MechanismType::RSA_PKCS, "CKM_RSA_PKCS"),
        ],
        CaAlgorithm::Ed25519 => &[
            (
                MechanismType::ECC_EDWARDS_KEY_PAIR_GEN,
                "CKM_EC_EDWARDS_KEY_PAIR_GEN",
            ),
            (MechanismType::EDDSA, "CKM_EDDSA"),
        ],
        CaAlgorithm::MlDsa44 | CaAlgorithm::MlDsa65 | CaAlgorithm::MlDsa87 => {
            return Err(MechanismError::NotInTokens(algorithm));
        }
    };
    let missing: Vec<&'static str> = needed
        .iter()
        .filter(|(m, _)| !offered.contains(m))
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(MechanismError::Missing { algorithm, missing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_without_the_mechanism_is_refused_naming_the_algorithm() {
        let rsa_only = [
            MechanismType::RSA_PKCS_KEY_PAIR_GEN,
            MechanismType::RSA_PKCS,
        ];
        assert_eq!(
            check_mechanisms(CaAlgorithm::EcdsaP256, &rsa_only),
            Err(MechanismError::Missing {
                algorithm: CaAlgorithm::EcdsaP256,
                missing: vec!["CKM_EC_KEY_PAIR_GEN", "CKM_ECDSA"]
            })
        );
        assert_eq!(check_mechanisms(CaAlgorithm::RsaSha256, &rsa_only), Ok(()));
        let no_sign = [MechanismType::ECC_KEY_PAIR_GEN];
        assert_eq!(
            check_mechanisms(CaAlgorithm::EcdsaP384, &no_sign),
            Err(MechanismError::Missing {
                algorithm: CaAlgorithm::EcdsaP384,
                missing: vec!["CKM_ECDSA"]
            })
        );
    }
}
