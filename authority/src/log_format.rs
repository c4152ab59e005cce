//! Text log lines that a logged value cannot forge or colour.
//!
//! podca logs values a client chose: gRPC fields, a CSR's names, pod and service-account
//! names, error texts that quote them. tracing-subscriber's default text format writes a
//! message and every `%display` field as it is, so a value holding `\n` starts a line of the
//! attacker's wording (a fake `INFO … issued` record for a log reader or shipper), and one
//! holding `\x1b[` recolours or rewrites an operator's terminal (its own escaping covers only
//! some escape characters of the message, and no newline). [`EscapedFields`] formats the
//! fields of events and spans as the default format does, except that every control
//! character of a value, and the Unicode line separators and bidirectional overrides that
//! reorder what a terminal shows, is written as its Rust escape (`\n`, `\u{1b}`). Field names
//! come from podca's code and are written as they are. The JSON format needs none of this:
//! JSON strings escape control characters.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// The text format's fields, with control characters in values escaped (see the module docs).
/// Use with `tracing_subscriber::fmt().fmt_fields(EscapedFields)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = Visitor {
            writer,
            result: Ok(()),
            first: true,
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Visitor<'writer> {
    writer: Writer<'writer>,
    result: fmt::Result,
    first: bool,
}

impl Visitor<'_> {
    /// Writes `name=` (nothing for the message) and then `value`, escaped.
    fn field(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // `log` records bridged into tracing carry their metadata as fields; the format has
        // written it already.
        if name.starts_with("log.") {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        self.result = if name == "message" {
            self.writer.write_str(separator)
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{separator}{name}=")
        }
        .and_then(|()| {
            Escaping {
                inner: &mut self.writer,
            }
            .write_fmt(value)
        });
    }
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.field(field, format_args!("{value}"));
        } else {
            // Quoted, as the default format does: a string field is told from a number.
            self.field(field, format_args!("{value:?}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        match value.source() {
            None => self.field(field, format_args!("{value}")),
            Some(source) => self.field(field, format_args!("{value} ({})", Sources(source))),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, format_args!("{value:?}"));
    }
}

/// An error's source chain, `: `-separated.
struct Sources<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for Sources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut next = Some(self.0);
        let mut first = true;
        while let Some(error) = next {
            if !first {
                f.write_str(": ")?;
            }
            first = false;
            write!(f, "{error}")?;
            next = error.source();
        }
        Ok(())
    }
}

/// A writer that escapes what [`must_escape`] names on the way through.
struct Escaping<'a, W: fmt::Write> {
    inner: &'a mut W,
}

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Most of a line (an audit record's JSON) has nothing to escape: skip ahead bytewise to
        // the first byte that can start a character `must_escape` names, and look at chars
        // only from there (decoding every char cost 0.6 % of a gRPC issuance's CPU).
        let Some(start) = s.bytes().position(may_start_escape) else {
            return self.inner.write_str(s);
        };
        self.inner.write_str(&s[..start])?;
        let mut rest = &s[start..];
        while let Some(at) = rest.find(must_escape) {
            self.inner.write_str(&rest[..at])?;
            // `find` returned the index of a char, so one starts there.
            let Some(c) = rest[at..].chars().next() else {
                break;
            };
            match c {
                '\n' | '\r' | '\t' => write!(self.inner, "{}", c.escape_debug())?,
                other => write!(self.inner, "{}", other.escape_unicode())?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.inner.write_str(rest)
    }
}

/// Characters a log line must not hold as they are: C0 and C1 controls and DEL (line breaks,
/// terminal escapes), the Unicode line and paragraph separators, and the bidirectional
/// embeddings, overrides and isolates (which make a terminal show text in another order).
fn must_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether `b` can be the first byte of a character [`must_escape`] names in UTF-8: C0
/// controls and DEL are single bytes, C1 controls start with 0xC2, and the separators and
/// bidirectional controls (U+2028–U+202E, U+2066–U+2069) with 0xE2. A continuation byte is
/// never one of these, so `position` lands on a char boundary.
fn may_start_escape(b: u8) -> bool {
    b < 0x20 || b == 0x7f || b == 0xc2 || b == 0xe2
}

/// A `--log` / `PODCA_LOG` value that tracing cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} (expected e.g. `info`, `warn` or `info,podca_grpc=debug`)")]
pub struct BadLogFilter(String);

/// A `--log` / `PODCA_LOG` value that tracing accepts: a typo (`podca=verbose`) is a usage
/// error at start, not a silent fall-back to `info` that hides the debug lines asked for.
pub fn log_filter(value: &str) -> Result<String, BadLogFilter> {
    tracing_subscriber::EnvFilter::try_new(value)
        .map(|_| value.to_owned())
        .map_err(|e| BadLogFilter(e.to_string()))
}

/// Colours (ANSI escapes) only for a person at a terminal: a log file, a pipe or a container
/// runtime's log gets plain lines that `grep` and log shippers read as written. `NO_COLOR`
/// (any non-empty value, <https://no-color.org>) turns them off at a terminal too.
pub fn colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_log_filter_tracing_cannot_read_is_refused() {
        for good in ["info", "warn", "info,podca_grpc=debug", "podca=trace"] {
            assert_eq!(log_filter(good).as_deref(), Ok(good));
        }
        for bad in ["podca=verbose", "info,podca_grpc=loud"] {
            let e = log_filter(bad).expect_err(bad);
            assert!(e.to_string().contains("expected e.g."), "{bad}: {e}");
        }
    }

    #[test]
    fn colours_only_at_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(
            colour(true, Some(std::ffi::OsString::new())),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None), "a file, a pipe or a container log");
        assert!(!colour(false, Some("1".into())));
    }

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buffer {
        fn text(&self) -> String {
            let bytes = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            String::from_utf8(bytes).unwrap_or_else(|e| panic!("log output is UTF-8: {e}"))
        }
    }

    /// What podca's text format (`src/cli.rs`) writes for `log`, without colours.
    fn logged(ansi: bool, log: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(ansi)
            .without_time()
            .with_writer(move || writer.clone())
            .fmt_fields(EscapedFields)
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        buffer.text()
    }

    #[derive(Debug, thiserror::Error)]
    #[error("bad CSR for {0}")]
    struct Refused(String, #[source] Cause);

    #[derive(Debug, thiserror::Error)]
    #[error("name {0} is not allowed")]
    struct Cause(String);

    /// The attack: a pod name, a CN and a gRPC field chosen to start a fake log line and to
    /// recolour the terminal, in every position a value reaches the text format.
    #[test]
    fn a_logged_value_cannot_start_a_line_or_colour_the_terminal() {
        let forged = "web\n2030-01-01T00:00:00Z  INFO podca: issued admin\x1b[31m\r\u{202e}";
        for ansi in [false, true] {
            let out = logged(ansi, || {
                let span = tracing::info_span!("request", pod = %forged, cn = forged);
                let _entered = span.enter();
                tracing::warn!(
                    display = %forged,
                    debug = ?forged,
                    plain = forged,
                    error = &Refused(forged.into(), Cause(forged.into())) as &(dyn std::error::Error + 'static),
                    "refused {forged}"
                );
            });
            assert_eq!(out.lines().count(), 1, "one event, one line:\n{out}");
            assert!(out.ends_with('\n'), "{out:?}");
            let line = out.trim_end_matches('\n');
            assert!(!line.contains(['\n', '\r', '\u{202e}']), "{line:?}");
            // With colours on, the format's own escapes remain; the value's red does not.
            assert!(!line.contains("\x1b[31m"), "{line:?}");
            assert!(ansi || !line.contains('\x1b'), "{line:?}");
            // Every position kept the value, escaped: the message, a `%display` field, a
            // string and a Debug field, an error and its source, the span's fields.
            let escaped =
                r"web\n2030-01-01T00:00:00Z  INFO podca: issued admin\u{1b}[31m\r\u{202e}";
            for needle in [
                format!("refused {escaped}"),
                format!("display={escaped}"),
                format!("pod={escaped}"),
                format!("bad CSR for {escaped} (name {escaped} is not allowed)"),
            ] {
                assert!(line.contains(&needle), "{needle:?} in {line:?}");
            }
            // Strings (and Debug) are quoted with Rust's escapes, as the default format does.
            assert!(line.contains(r#"plain="web\n2030"#), "{line:?}");
            assert!(line.contains(r#"cn="web\n2030"#), "{line:?}");
            assert!(line.contains(r#"debug="web\n2030"#), "{line:?}");
        }
    }

    /// Without [`EscapedFields`] the same event breaks the line: the test above can fail.
    #[test]
    fn the_default_format_would_let_the_value_through() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(cn = %"a\nb\x1b[31m", "refused");
        });
        let out = buffer.text();
        assert_eq!(out.lines().count(), 2, "{out:?}");
        assert!(out.contains('\x1b'), "{out:?}");
    }

    #[test]
    fn ordinary_values_are_written_as_before() {
        let out = logged(false, || {
            tracing::info!(serial = 7, ok = true, r#type = "leaf", signer = %"podca.dev/x", "issued é ✓");
        });
        assert!(
            out.trim_end()
                .ends_with(r#"issued é ✓ serial=7 ok=true type="leaf" signer=podca.dev/x"#),
            "{out:?}"
        );
    }

    #[test]
    fn the_byte_scan_stops_at_every_character_to_escape() {
        // Every char: the byte pre-scan never skips one that must be escaped.
        for c in (0..=u32::from(char::MAX)).filter_map(char::from_u32) {
            let mut utf8 = [0; 4];
            let first = c.encode_utf8(&mut utf8).as_bytes()[0];
            assert!(!must_escape(c) || may_start_escape(first), "{c:?}");
        }
        // Text around them is kept as is, a false alarm (✓ starts with 0xE2) too.
        let mut out = String::new();
        let mut w = Escaping { inner: &mut out };
        fmt::Write::write_str(&mut w, "plain ✓ é\u{2028}\u{85}a\u{1b}[31m\nend").unwrap();
        assert_eq!(out, "plain ✓ é\\u{2028}\\u{85}a\\u{1b}[31m\\nend");
    }
}
