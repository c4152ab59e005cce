//! A closed pipe ends a command quietly.
//!
//! `podca inspect … | head` closes podca's standard output once `head` has its lines. Rust
//! ignores SIGPIPE, so the next write fails with EPIPE: `print!` then panics ("failed printing
//! to stdout: Broken pipe") and a `writeln!` returns the error. Neither is a failure of podca:
//! the reader asked for no more. [`install`] makes such a panic exit 0 without a word (another
//! failed print, e.g. to a full disk, exits 1 with one line; any other panic keeps the default
//! report), and [`caused`] tells the command line's error handler that
//! an error came from a closed pipe, so that it too exits 0 quietly.

use std::error::Error;
use std::io;

/// Installs the panic hook described in the module docs; call once, first thing in `main`.
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = match info.payload_as_str() {
            Some(message) => message.to_owned(),
            // std's own panics format their message lazily: the hook's Display has it.
            None => info.to_string(),
        };
        match printing_failure(&message) {
            Some(Printing::ClosedPipe) => std::process::exit(0),
            Some(Printing::Failed) => {
                // A full disk, say: one line, no backtrace; it is not a bug of podca's.
                use std::io::Write as _;
                let _ = writeln!(io::stderr(), "podca: {message}");
                std::process::exit(1);
            }
            None => default(info),
        }
    }));
}

/// EPIPE on Linux and macOS, the systems podca runs on.
const EPIPE: i32 = 32;

/// A panic of std's `print!` family: its write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Printing {
    /// `failed printing to stdout: Broken pipe (os error 32)`: the reader has gone.
    ClosedPipe,
    /// Any other write error (a full disk).
    Failed,
}

fn printing_failure(message: &str) -> Option<Printing> {
    if !(message.starts_with("failed printing to stdout")
        || message.starts_with("failed printing to stderr"))
    {
        return None;
    }
    Some(
        if message.contains(&io::Error::from_raw_os_error(EPIPE).to_string()) {
            Printing::ClosedPipe
        } else {
            Printing::Failed
        },
    )
}

/// Whether an error, or one of its causes (outermost first), is a write to a closed pipe.
pub fn caused<'a>(mut chain: impl Iterator<Item = &'a (dyn Error + 'static)>) -> bool {
    chain.any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_print_to_a_closed_pipe_is_quiet_and_other_print_failures_are_one_line() {
        let epipe = io::Error::from_raw_os_error(EPIPE);
        for stream in ["stdout", "stderr"] {
            assert_eq!(
                printing_failure(&format!("failed printing to {stream}: {epipe}")),
                Some(Printing::ClosedPipe)
            );
        }
        // ENOSPC: a failure, said in one line.
        let full = io::Error::from_raw_os_error(28);
        assert_eq!(
            printing_failure(&format!("failed printing to stdout: {full}")),
            Some(Printing::Failed)
        );
        // Any other panic keeps the default report.
        assert_eq!(printing_failure("index out of bounds: Broken pipe"), None);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("writing the report")]
    struct Outer(#[source] io::Error);

    #[test]
    fn a_closed_pipe_among_the_causes_is_found() {
        fn chain<'a>(
            e: &'a (dyn Error + 'static),
        ) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
            std::iter::successors(Some(e), |e| (*e).source())
        }
        let closed = Outer(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(caused(chain(&closed)));
        let other = Outer(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(!caused(chain(&other)));
    }
}
