//! Checkpoints of the ledger's Merkle log: the C2SP `tlog-checkpoint` body (origin, tree size,
//! base64 root hash, one line each) signed as a C2SP `signed-note` with Ed25519 by a key that
//! signs nothing else ([`LogKey`]).
//!
//! A note's key ID is the first four bytes of `SHA-256(name || 0x0A || 0x01 || public key)`
//! (`0x01`: the Ed25519 signature type); a signature line is `— <name> <base64(key ID ||
//! signature)>`, and the signed message is the body with its final newline.

use std::io::Write;
use std::path::Path;

use aws_lc_rs::digest::{Context, SHA256};
use aws_lc_rs::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::merkle::Hash;

/// The Ed25519 signature type of C2SP signed-note.
const ED25519_TYPE: u8 = 0x01;

/// Why a checkpoint or its key could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoteError {
    #[error("log key {path}: {detail}")]
    Key { path: String, detail: String },
    #[error("not a checkpoint: {0}")]
    Malformed(String),
    #[error("the checkpoint is not signed by the log key {name} (key ID {key_id})")]
    NotSigned { name: String, key_id: String },
    #[error("the checkpoint's signature by {name} does not verify")]
    BadSignature { name: String },
    #[error("the checkpoint's origin is {found:?}, not this log's {want:?}")]
    WrongOrigin { found: String, want: String },
}

/// What a checkpoint says: the log's origin, its size and root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
}

impl Checkpoint {
    /// The tlog-checkpoint body: three lines, each ending in a newline.
    pub fn body(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            STANDARD.encode(self.root)
        )
    }

    /// Parses a body (the first three lines; extension lines after them are allowed).
    pub fn parse_body(body: &str) -> Result<Self, NoteError> {
        let mut lines = body.split('\n');
        let origin = lines.next().unwrap_or_default();
        if origin.is_empty() {
            return Err(NoteError::Malformed("no origin line".into()));
        }
        let size = lines.next().unwrap_or_default();
        let size_ok = !size.is_empty()
            && size.bytes().all(|b| b.is_ascii_digit())
            && (size == "0" || !size.starts_with('0'));
        let size: u64 =
            size.parse().ok().filter(|_| size_ok).ok_or_else(|| {
                NoteError::Malformed(format!("tree size {size:?} is not a number"))
            })?;
        let root_line = lines.next().unwrap_or_default();
        let root = STANDARD
            .decode(root_line)
            .ok()
            .and_then(|b| <Hash>::try_from(b.as_slice()).ok())
            .ok_or_else(|| {
                NoteError::Malformed(format!("root hash {root_line:?} is not 32 bytes of base64"))
            })?;
        Ok(Checkpoint {
            origin: origin.to_owned(),
            size,
            root,
        })
    }
}

/// The note key ID of `public_key` under `name`.
pub fn key_id(name: &str, public_key: &[u8]) -> [u8; 4] {
    let mut c = Context::new(&SHA256);
    c.update(name.as_bytes());
    c.update(b"\n");
    c.update(&[ED25519_TYPE]);
    c.update(public_key);
    let mut id = [0u8; 4];
    id.copy_from_slice(&c.finish().as_ref()[..4]);
    id
}

/// A key that verifies checkpoints: a name (the log's origin) and an Ed25519 public key. Its
/// text form is the note verifier key `<name>+<hex key ID>+<base64(0x01 || public key)>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogVerifier {
    pub name: String,
    pub public_key: [u8; 32],
}

impl LogVerifier {
    pub fn key_id(&self) -> [u8; 4] {
        key_id(&self.name, &self.public_key)
    }

    /// The verifier key string.
    pub fn to_text(&self) -> String {
        let mut typed = vec![ED25519_TYPE];
        typed.extend_from_slice(&self.public_key);
        format!(
            "{}+{}+{}",
            self.name,
            hex::encode(self.key_id()),
            STANDARD.encode(typed)
        )
    }

    /// Parses a verifier key string.
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let bad = |why: &str| NoteError::Malformed(format!("verifier key {text:?}: {why}"));
        // A key name has no '+'; base64 may.
        let mut parts = text.trim().splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("want <name>+<key ID>+<key>"));
        };
        let key = STANDARD
            .decode(key)
            .map_err(|_| bad("the key is not base64"))?;
        let public_key: [u8; 32] = match key.split_first() {
            Some((&ED25519_TYPE, rest)) => rest
                .try_into()
                .map_err(|_| bad("an Ed25519 key is 32 bytes"))?,
            _ => return Err(bad("not an Ed25519 (type 0x01) key")),
        };
        let verifier = LogVerifier {
            name: name.to_owned(),
            public_key,
        };
        if hex::encode(verifier.key_id()) != id {
            return Err(bad("the key ID does not match the key"));
        }
        Ok(verifier)
    }

    /// The checkpoint `note` says, if its signature by this key verifies over its exact text.
    pub fn verify(&self, note: &str) -> Result<Checkpoint, NoteError> {
        let (body, signatures) = note
            .split_once("\n\n")
            .map(|(b, s)| (format!("{b}\n"), s))
            .ok_or_else(|| NoteError::Malformed("no blank line before the signatures".into()))?;
        let want_id = self.key_id();
        let mut found = false;
        for line in signatures.lines() {
            let Some(rest) = line.strip_prefix("— ") else {
                return Err(NoteError::Malformed(format!(
                    "signature line {line:?} does not start with an em dash"
                )));
            };
            let Some((name, sig)) = rest.split_once(' ') else {
                return Err(NoteError::Malformed(format!("signature line {line:?}")));
            };
            let Ok(sig) = STANDARD.decode(sig) else {
                return Err(NoteError::Malformed(format!(
                    "signature line {line:?}: not base64"
                )));
            };
            if name != self.name || sig.len() < 4 || sig[..4] != want_id {
                continue;
            }
            found = true;
            UnparsedPublicKey::new(&ED25519, &self.public_key)
                .verify(body.as_bytes(), &sig[4..])
                .map_err(|_| NoteError::BadSignature {
                    name: self.name.clone(),
                })?;
        }
        if !found {
            return Err(NoteError::NotSigned {
                name: self.name.clone(),
                key_id: hex::encode(want_id),
            });
        }
        let checkpoint = Checkpoint::parse_body(&body)?;
        if checkpoint.origin != self.name {
            return Err(NoteError::WrongOrigin {
                found: checkpoint.origin,
                want: self.name.clone(),
            });
        }
        Ok(checkpoint)
    }
}

/// The log's signing key: Ed25519, PKCS#8 in a PEM file of its own (0600) or a Secret, or held
/// in the CA's PKCS#11 token ([`LogKey::from_token`]). `Debug` never shows the key.
pub struct LogKey {
    signer: LogSigner,
    verifier: LogVerifier,
}

/// Where the private half is.
enum LogSigner {
    Memory(Ed25519KeyPair),
    /// An Ed25519 key that signs elsewhere (a PKCS#11 token): raw 64-byte signatures.
    Token(std::sync::Arc<dyn crate::backend::CaKey>),
}

impl std::fmt::Debug for LogKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogKey")
            .field("name", &self.verifier.name)
            .field("key_id", &hex::encode(self.verifier.key_id()))
            .finish_non_exhaustive()
    }
}

impl LogKey {
    /// Reads the key at `path`, or makes one there (mode 0600) if there is none. `name` is the
    /// log's origin: the checkpoints' first line and the key's name.
    pub fn load_or_generate(path: &Path, name: &str) -> Result<Self, NoteError> {
        let shown = path.display().to_string();
        let key_error = |detail: String| NoteError::Key {
            path: shown.clone(),
            detail,
        };
        check_key_name(name, &shown)?;
        let pem = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let text =
                    Self::generate_pem().map_err(|_| key_error("the system RNG failed".into()))?;
                write_private(path, &text).map_err(|e| key_error(e.to_string()))?;
                text
            }
            Err(e) => return Err(key_error(e.to_string())),
        };
        Self::from_pem(&pem, name, &shown)
    }

    /// A new key, as the PKCS#8 PEM text [`LogKey::from_pem`] reads.
    pub fn generate_pem() -> Result<Vec<u8>, NoteError> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| NoteError::Key {
            path: String::new(),
            detail: "the system RNG failed".into(),
        })?;
        Ok(pem::encode(&pem::Pem::new("PRIVATE KEY", doc.as_ref().to_vec())).into_bytes())
    }

    /// The key in `pem` (an Ed25519 PKCS#8 PEM block), named `name`; `source` names where it
    /// came from in errors (a file, a Secret's data key).
    pub fn from_pem(pem: &[u8], name: &str, source: &str) -> Result<Self, NoteError> {
        let key_error = |detail: String| NoteError::Key {
            path: source.to_owned(),
            detail,
        };
        check_key_name(name, source)?;
        let block = pem::parse(pem).map_err(|e| key_error(format!("not PEM: {e}")))?;
        if block.tag() != "PRIVATE KEY" {
            return Err(key_error(format!(
                "holds a {:?} block, not an Ed25519 PRIVATE KEY",
                block.tag()
            )));
        }
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(block.contents())
            .map_err(|e| key_error(format!("not an Ed25519 PKCS#8 key: {e}")))?;
        Self::from_pair(pair, name)
    }

    /// Reads the key at `path`; never makes one.
    pub fn load(path: &Path, name: &str) -> Result<Self, NoteError> {
        if !path.exists() {
            return Err(NoteError::Key {
                path: path.display().to_string(),
                detail: "no such file".into(),
            });
        }
        Self::load_or_generate(path, name)
    }

    /// An Ed25519 key that signs where it is held (the CA's PKCS#11 token), named `name`;
    /// `source` names it in errors.
    pub fn from_token(
        key: std::sync::Arc<dyn crate::backend::CaKey>,
        name: &str,
        source: &str,
    ) -> Result<Self, NoteError> {
        check_key_name(name, source)?;
        let key_error = |detail: String| NoteError::Key {
            path: source.to_owned(),
            detail,
        };
        if key.algorithm() != crate::backend::CaAlgorithm::Ed25519 {
            return Err(key_error(format!("a {} key, not Ed25519", key.algorithm())));
        }
        let public_key: [u8; 32] = key
            .public_key_raw()
            .try_into()
            .map_err(|_| key_error("an Ed25519 public key is 32 bytes".into()))?;
        Ok(LogKey {
            signer: LogSigner::Token(key),
            verifier: LogVerifier {
                name: name.to_owned(),
                public_key,
            },
        })
    }

    fn from_pair(pair: Ed25519KeyPair, name: &str) -> Result<Self, NoteError> {
        let public_key: [u8; 32] =
            pair.public_key()
                .as_ref()
                .try_into()
                .map_err(|_| NoteError::Key {
                    path: String::new(),
                    detail: "an Ed25519 public key is 32 bytes".into(),
                })?;
        Ok(LogKey {
            signer: LogSigner::Memory(pair),
            verifier: LogVerifier {
                name: name.to_owned(),
                public_key,
            },
        })
    }

    pub fn verifier(&self) -> &LogVerifier {
        &self.verifier
    }

    /// The signed note of a checkpoint of the tree of `size` with root `root`; fails only when
    /// a token-held key cannot sign now.
    pub fn sign(&self, size: u64, root: Hash) -> Result<String, NoteError> {
        let body = Checkpoint {
            origin: self.verifier.name.clone(),
            size,
            root,
        }
        .body();
        let mut sig = self.verifier.key_id().to_vec();
        match &self.signer {
            LogSigner::Memory(pair) => sig.extend_from_slice(pair.sign(body.as_bytes()).as_ref()),
            LogSigner::Token(key) => {
                let signed = key.sign(body.as_bytes()).map_err(|e| NoteError::Key {
                    path: self.verifier.name.clone(),
                    detail: format!("signing a checkpoint: {e}"),
                })?;
                if signed.len() != 64 {
                    return Err(NoteError::Key {
                        path: self.verifier.name.clone(),
                        detail: format!("the token returned a {}-byte signature", signed.len()),
                    });
                }
                sig.extend_from_slice(&signed);
            }
        }
        Ok(format!(
            "{body}\n— {} {}\n",
            self.verifier.name,
            STANDARD.encode(sig)
        ))
    }
}

/// Writes a new file readable by its owner only; refuses to replace one.
/// A key name is non-empty and has no space, `+` or newline (C2SP signed-note).
fn check_key_name(name: &str, source: &str) -> Result<(), NoteError> {
    if name.is_empty() || name.contains(['+', ' ', '\n']) {
        return Err(NoteError::Key {
            path: source.to_owned(),
            detail: format!("origin {name:?} is not a key name (non-empty, no spaces or '+')"),
        });
    }
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_checkpoint_verifies_and_a_changed_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.key");
        let key = LogKey::load_or_generate(&path, "podca.example/log").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // The same key comes back from the file.
        let again = LogKey::load_or_generate(&path, "podca.example/log").unwrap();
        assert_eq!(again.verifier(), key.verifier());
        let note = key.sign(7, [9; 32]).unwrap();
        let verifier = LogVerifier::parse(&key.verifier().to_text()).unwrap();
        let checkpoint = verifier.verify(&note).unwrap();
        assert_eq!(
            checkpoint,
            Checkpoint {
                origin: "podca.example/log".into(),
                size: 7,
                root: [9; 32]
            }
        );
        let changed = note.replacen("\n7\n", "\n8\n", 1);
        assert_eq!(
            verifier.verify(&changed),
            Err(NoteError::BadSignature {
                name: "podca.example/log".into()
            })
        );
        let other = LogKey::load_or_generate(&dir.path().join("other.key"), "podca.example/log")
            .unwrap()
            .sign(7, [9; 32])
            .unwrap();
        assert!(matches!(
            verifier.verify(&other),
            Err(NoteError::NotSigned { .. })
        ));
        assert!(!format!("{key:?}").contains("PRIVATE"));
    }
}
