//! PKCS#11 URIs (RFC 7512, the subset podca needs) and PIN sources.

use std::fmt;
use std::path::PathBuf;

use cryptoki::types::AuthPin;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use zeroize::Zeroizing;

use crate::backend::BackendError;

/// A PKCS#11 URI that names one key pair on one token.
///
/// Supported (RFC 7512):
/// `pkcs11:token=<label>[;object=<label>][;id=<%xx…>][;type=private][;manufacturer=…][;model=…][;serial=…]`
/// `[?module-path=<path>]`. `token` and at least one of `object` and `id` are required.
/// Values are percent-decoded. `pin-value` is refused (the PIN comes from a
/// [`PinSource`]); `pin-source` is refused too (use [`PinSource`] explicitly); other unknown
/// attributes are refused so that a typo never widens the match.
#[derive(Clone, PartialEq, Eq)]
pub struct Pkcs11Uri {
    /// `token`: the token label (required; slot ids are not stable, labels are).
    pub token: String,
    /// `object`: the key's CKA_LABEL.
    pub object: Option<String>,
    /// `id`: the key's CKA_ID.
    pub id: Option<Vec<u8>>,
    /// `manufacturer`: the token manufacturer, to disambiguate tokens.
    pub manufacturer: Option<String>,
    /// `model`: the token model.
    pub model: Option<String>,
    /// `serial`: the token serial number.
    pub serial: Option<String>,
    /// `module-path` query attribute: the PKCS#11 library to load.
    pub module_path: Option<PathBuf>,
}

/// Characters left unescaped when printing a URI value (RFC 7512 `pk11-pchar`, roughly).
const VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':')
    .remove(b'[')
    .remove(b']')
    .remove(b'@')
    .remove(b'!')
    .remove(b'$')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')')
    .remove(b'*')
    .remove(b'+')
    .remove(b',');
/// Query values may also hold `/` (module paths).
const QUERY_VALUE: &AsciiSet = &VALUE.remove(b'/');

fn invalid(msg: impl Into<String>) -> BackendError {
    BackendError::InvalidKey(format!("PKCS#11 URI: {}", msg.into()))
}

fn decode_text(name: &str, raw: &str) -> Result<String, BackendError> {
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| invalid(format!("attribute {name} is not valid UTF-8 once decoded")))
}

impl Pkcs11Uri {
    /// Parses `pkcs11:…`. Errors never echo attribute values (a mistyped URI may hold a PIN).
    pub fn parse(text: &str) -> Result<Self, BackendError> {
        let rest = text
            .trim()
            .strip_prefix("pkcs11:")
            .ok_or_else(|| invalid("must start with \"pkcs11:\""))?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let mut uri = Pkcs11Uri {
            token: String::new(),
            object: None,
            id: None,
            manufacturer: None,
            model: None,
            serial: None,
            module_path: None,
        };
        let mut token = None;
        for attr in path.split(';').filter(|a| !a.is_empty()) {
            let (name, value) = attr
                .split_once('=')
                .ok_or_else(|| invalid("every path attribute must be name=value"))?;
            let slot_taken = |taken: bool| {
                if taken {
                    Err(invalid(format!("attribute {name} given twice")))
                } else {
                    Ok(())
                }
            };
            match name {
                "token" => {
                    slot_taken(token.is_some())?;
                    token = Some(decode_text(name, value)?);
                }
                "object" => {
                    slot_taken(uri.object.is_some())?;
                    uri.object = Some(decode_text(name, value)?);
                }
                "id" => {
                    slot_taken(uri.id.is_some())?;
                    uri.id = Some(percent_decode_str(value).collect());
                }
                "manufacturer" => {
                    slot_taken(uri.manufacturer.is_some())?;
                    uri.manufacturer = Some(decode_text(name, value)?);
                }
                "model" => {
                    slot_taken(uri.model.is_some())?;
                    uri.model = Some(decode_text(name, value)?);
                }
                "serial" => {
                    slot_taken(uri.serial.is_some())?;
                    uri.serial = Some(decode_text(name, value)?);
                }
                "type" => {
                    let t = decode_text(name, value)?;
                    if t != "private" {
                        return Err(invalid(format!(
                            "type={t:?}: a CA key URI names the private key (type=private)"
                        )));
                    }
                }
                "pin-value" | "pin-source" => {
                    return Err(invalid(format!(
                        "{name} is not accepted; give the PIN as a file or an environment \
                         variable"
                    )));
                }
                other => {
                    return Err(invalid(format!(
                        "unsupported path attribute {:?} (supported: token, object, id, type, \
                         manufacturer, model, serial)",
                        other.chars().take(32).collect::<String>()
                    )));
                }
            }
        }
        for attr in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|a| !a.is_empty())
        {
            let (name, value) = attr
                .split_once('=')
                .ok_or_else(|| invalid("every query attribute must be name=value"))?;
            match name {
                "module-path" => {
                    if uri.module_path.is_some() {
                        return Err(invalid("attribute module-path given twice"));
                    }
                    uri.module_path = Some(PathBuf::from(decode_text(name, value)?));
                }
                "pin-value" | "pin-source" => {
                    return Err(invalid(format!(
                        "{name} is not accepted; give the PIN as a file or an environment \
                         variable"
                    )));
                }
                other => {
                    return Err(invalid(format!(
                        "unsupported query attribute {:?} (supported: module-path)",
                        other.chars().take(32).collect::<String>()
                    )));
                }
            }
        }
        uri.token = token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| invalid("the token attribute (token label) is required"))?;
        if uri.object.as_deref().is_none_or(str::is_empty)
            && uri.id.as_deref().is_none_or(<[u8]>::is_empty)
        {
            return Err(invalid("name the key with object=<label> and/or id=<%xx…>"));
        }
        Ok(uri)
    }
}

impl fmt::Display for Pkcs11Uri {
    /// The canonical URI (no PIN: the URI never holds one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pkcs11:token={}",
            utf8_percent_encode(&self.token, VALUE)
        )?;
        for (name, value) in [
            ("manufacturer", &self.manufacturer),
            ("model", &self.model),
            ("serial", &self.serial),
            ("object", &self.object),
        ] {
            if let Some(v) = value {
                write!(f, ";{name}={}", utf8_percent_encode(v, VALUE))?;
            }
        }
        if let Some(id) = &self.id {
            f.write_str(";id=")?;
            for b in id {
                write!(f, "%{b:02X}")?;
            }
        }
        f.write_str(";type=private")?;
        if let Some(path) = &self.module_path {
            write!(
                f,
                "?module-path={}",
                utf8_percent_encode(&path.to_string_lossy(), QUERY_VALUE)
            )?;
        }
        Ok(())
    }
}

impl fmt::Debug for Pkcs11Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pkcs11Uri({self})")
    }
}

impl std::str::FromStr for Pkcs11Uri {
    type Err = BackendError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Where the user PIN comes from. Never a command-line value; never logged.
///
/// The PIN is the file's content or the variable's value with one trailing newline (`\n` or
/// `\r\n`) removed; an empty PIN is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinSource {
    /// A file holding the PIN (for example a mounted Kubernetes Secret).
    File(PathBuf),
    /// The name of an environment variable holding the PIN.
    ///
    /// The variable stays in podca's environment after it is read. Removing it needs
    /// `std::env::remove_var`, which is `unsafe` in edition 2024 (another thread may read the
    /// environment at the same time; the PKCS#11 module runs in this process and may), and the
    /// workspace forbids unsafe code. Removing it would not hide it either: the kernel shows
    /// the environment a process started with in `/proc/<pid>/environ`, to its own user and
    /// root, whatever the process unsets later. podca starts no child processes that could
    /// inherit it. Prefer [`PinSource::File`] (a mounted Secret), which the `hsm` overlay uses.
    Env(String),
}

impl PinSource {
    /// Reads the PIN. Errors name the source, never the value.
    pub(crate) fn read(&self) -> Result<AuthPin, BackendError> {
        let raw: Zeroizing<String> = match self {
            PinSource::File(path) => {
                let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| BackendError::Io {
                    path: path.display().to_string(),
                    detail: format!("reading the PKCS#11 PIN file: {}", e.kind()),
                })?);
                Zeroizing::new(String::from_utf8(bytes.to_vec()).map_err(|_| {
                    BackendError::InvalidKey(format!(
                        "PKCS#11 PIN file {} is not UTF-8",
                        path.display()
                    ))
                })?)
            }
            PinSource::Env(name) => Zeroizing::new(std::env::var(name).map_err(|_| {
                BackendError::InvalidKey(format!(
                    "PKCS#11 PIN environment variable {name} is not set or not UTF-8"
                ))
            })?),
        };
        let pin = raw
            .strip_suffix("\r\n")
            .or_else(|| raw.strip_suffix('\n'))
            .unwrap_or(&raw);
        if pin.is_empty() {
            return Err(BackendError::InvalidKey(format!(
                "PKCS#11 PIN from {self} is empty"
            )));
        }
        Ok(AuthPin::from(pin))
    }
}

impl fmt::Display for PinSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PinSource::File(p) => write!(f, "file {}", p.display()),
            PinSource::Env(n) => write!(f, "environment variable {n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_canonically() {
        let uri = Pkcs11Uri::parse(
            "pkcs11:token=podca%20ca;object=root;id=%01%AB;type=private?module-path=/usr/lib/softhsm/libsofthsm2.so",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(uri.token, "podca ca");
        assert_eq!(uri.object.as_deref(), Some("root"));
        assert_eq!(uri.id.as_deref(), Some(&[0x01, 0xab][..]));
        assert_eq!(
            uri.module_path.as_deref(),
            Some(std::path::Path::new("/usr/lib/softhsm/libsofthsm2.so"))
        );
        let printed = uri.to_string();
        assert_eq!(
            printed,
            "pkcs11:token=podca%20ca;object=root;id=%01%AB;type=private?module-path=/usr/lib/softhsm/libsofthsm2.so"
        );
        assert_eq!(Pkcs11Uri::parse(&printed), Ok(uri));
    }

    #[test]
    fn refuses_pins_unknown_attributes_and_missing_parts() {
        let cases = [
            ("pkcs11:token=t;object=k;pin-value=s3cr3tpin", "pin-value"),
            ("pkcs11:token=t;object=k?pin-value=s3cr3tpin", "pin-value"),
            ("pkcs11:token=t;object=k?pin-source=file:/x", "pin-source"),
            ("pkcs11:token=t;objekt=k", "unsupported path attribute"),
            ("pkcs11:object=k", "token"),
            ("pkcs11:token=t", "object=<label>"),
            ("pkcs11:token=t;object=k;type=public", "type=private"),
            ("pkcs11:token=t;token=u;object=k", "twice"),
            ("token=t;object=k", "pkcs11:"),
        ];
        for (text, needle) in cases {
            let err = Pkcs11Uri::parse(text).expect_err(text).to_string();
            assert!(err.contains(needle), "{text}: {err}");
            assert!(!err.contains("s3cr3tpin"), "error echoes a PIN: {err}");
        }
    }

    #[test]
    fn pin_from_file_strips_one_newline_and_never_prints() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("pin");
        std::fs::write(&path, "12 34\n").unwrap_or_else(|e| panic!("{e}"));
        let pin = PinSource::File(path.clone())
            .read()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(secrecy::ExposeSecret::expose_secret(&pin), "12 34");
        assert!(!format!("{pin:?}").contains("12 34"));
        std::fs::write(&path, "\n").unwrap_or_else(|e| panic!("{e}"));
        let empty = PinSource::File(path).read();
        assert!(
            matches!(&empty, Err(BackendError::InvalidKey(m)) if m.ends_with(" is empty")),
            "{empty:?}"
        );
        let missing = PinSource::Env("PODCA_TEST_SURELY_UNSET_PIN_VAR".into()).read();
        assert!(
            matches!(missing, Err(BackendError::InvalidKey(m)) if m.contains("PODCA_TEST_SURELY_UNSET_PIN_VAR"))
        );
    }
}
