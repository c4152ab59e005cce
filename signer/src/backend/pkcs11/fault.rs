//! How PKCS#11 failures are classified and described, and the errors of connecting to a token.

use cryptoki::error::{Error as CkError, RvError};

use super::Pkcs11Uri;
use crate::backend::BackendError;

/// How a PKCS#11 failure should be handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fault {
    /// Retrying will not help (PIN, mechanism, key usage).
    Permanent,
    /// This session or handle is stale: reconnect and retry at once.
    Stale,
    /// The token or library is in trouble: reconnect later.
    Device,
}

pub(super) fn classify(e: &CkError) -> Fault {
    match e {
        CkError::Pkcs11(rv, _) => match rv {
            RvError::PinIncorrect
            | RvError::PinLocked
            | RvError::PinExpired
            | RvError::PinInvalid
            | RvError::PinLenRange
            | RvError::KeyFunctionNotPermitted
            | RvError::KeyTypeInconsistent
            | RvError::MechanismInvalid
            | RvError::MechanismParamInvalid => Fault::Permanent,
            RvError::SessionHandleInvalid
            | RvError::SessionClosed
            | RvError::ObjectHandleInvalid
            | RvError::KeyHandleInvalid
            | RvError::UserNotLoggedIn
            | RvError::OperationActive
            | RvError::CryptokiNotInitialized => Fault::Stale,
            _ => Fault::Device,
        },
        CkError::LibraryLoading(_) | CkError::NullFunctionPointer | CkError::MissingSymbol(_) => {
            Fault::Permanent
        }
        _ => Fault::Device,
    }
}

/// A short description: `C_Sign: CKR DeviceRemoved`. Never contains a PIN (cryptoki errors
/// carry none).
pub(super) fn describe(e: &CkError) -> String {
    match e {
        CkError::Pkcs11(rv, f) => format!("C_{f:?} returned {}", rv_name(*rv)),
        other => other.to_string(),
    }
}

fn rv_name(rv: RvError) -> String {
    // `PinIncorrect` → `CKR_PIN_INCORRECT`.
    let debug = format!("{rv:?}");
    let mut out = String::from("CKR_");
    for (i, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

pub(super) fn is_rv(e: &CkError, wanted: RvError) -> bool {
    matches!(e, CkError::Pkcs11(rv, _) if *rv == wanted)
}

#[derive(Debug)]
pub(super) enum ConnectError {
    /// No token with the URI's label (and manufacturer/model/serial) is present.
    NoToken { available: Vec<String> },
    /// A PKCS#11 call failed.
    Ck(&'static str, CkError),
    /// The token rejected the PIN.
    Pin(CkError),
    /// No private key, or several, match the URI.
    Key(String),
    /// The key found has another public key than the one this process started with.
    Replaced,
}

pub(super) struct ReconnectError {
    pub(super) error: ConnectError,
    pub(super) epoch: u64,
}

impl ReconnectError {
    pub(super) fn suggests_reinit(&self) -> bool {
        match &self.error {
            ConnectError::NoToken { .. } => true,
            ConnectError::Ck(_, e) => matches!(
                e,
                CkError::Pkcs11(
                    RvError::CryptokiNotInitialized
                        | RvError::GeneralError
                        | RvError::DeviceError
                        | RvError::DeviceRemoved
                        | RvError::TokenNotPresent
                        | RvError::TokenNotRecognized
                        | RvError::SlotIdInvalid,
                    _
                )
            ),
            _ => false,
        }
    }
}

impl ConnectError {
    fn pin_message(uri: &Pkcs11Uri, e: &CkError) -> String {
        let what = if is_rv(e, RvError::PinIncorrect) {
            "the user PIN is incorrect"
        } else if is_rv(e, RvError::PinLocked) {
            "the user PIN is locked"
        } else {
            "the token refused the user PIN"
        };
        format!(
            "{uri}: login to token {:?} failed: {what} ({})",
            uri.token,
            describe(e)
        )
    }

    /// The error at start-up: everything is permanent, so the process refuses to start.
    pub(super) fn startup(self, uri: &Pkcs11Uri) -> BackendError {
        let msg = match self {
            ConnectError::NoToken { available } => format!(
                "{uri}: no token labelled {:?} is present (tokens found: {})",
                uri.token,
                if available.is_empty() {
                    "none".to_owned()
                } else {
                    available.join(", ")
                }
            ),
            ConnectError::Ck(what, e) => format!("{uri}: {what}: {}", describe(&e)),
            ConnectError::Pin(e) => Self::pin_message(uri, &e),
            ConnectError::Key(m) => format!("{uri}: {m}"),
            ConnectError::Replaced => format!("{uri}: the key changed"),
        };
        BackendError::InvalidKey(msg)
    }

    /// The error while running: transient, except a rejected PIN and a replaced key.
    pub(super) fn running(self, uri: &Pkcs11Uri) -> BackendError {
        match self {
            ConnectError::Pin(e) => BackendError::InvalidKey(format!(
                "{}; not retrying, to avoid locking the PIN",
                Self::pin_message(uri, &e)
            )),
            ConnectError::Replaced => BackendError::InvalidKey(format!(
                "{uri}: the key now found under this URI has a different public key than the \
                 CA certificate's; refusing to sign with it"
            )),
            ConnectError::Ck(_, ref e) if classify(e) == Fault::Permanent => self.startup(uri),
            other => match other.startup(uri) {
                BackendError::InvalidKey(m) => BackendError::Unavailable(m),
                e => e,
            },
        }
    }
}

/// The message of an error without its `CA key backend unavailable:` prefix.
pub(super) fn inner_message(err: &BackendError) -> String {
    match err {
        BackendError::Unavailable(m) | BackendError::InvalidKey(m) => m.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use cryptoki::context::Function;

    use super::*;

    #[test]
    fn rv_names_are_pkcs11_constants() {
        assert_eq!(rv_name(RvError::PinIncorrect), "CKR_PIN_INCORRECT");
        assert_eq!(rv_name(RvError::DeviceRemoved), "CKR_DEVICE_REMOVED");
    }

    #[test]
    fn faults() {
        let f = |rv| classify(&CkError::Pkcs11(rv, Function::Sign));
        assert_eq!(f(RvError::DeviceRemoved), Fault::Device);
        assert_eq!(f(RvError::TokenNotPresent), Fault::Device);
        assert_eq!(f(RvError::DeviceError), Fault::Device);
        assert_eq!(f(RvError::SessionHandleInvalid), Fault::Stale);
        assert_eq!(f(RvError::PinIncorrect), Fault::Permanent);
    }
}
