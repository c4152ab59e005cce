//! Durations as the command line writes them: `15s`, `2m`, `500ms` or plain seconds.

use std::time::Duration;

/// A duration the command line cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration like 15s, 2m or 500ms")]
    NotADuration(String),
    #[error("{text:?}: unknown unit {unit:?} (use ms, s or m)")]
    UnknownUnit { text: String, unit: String },
}

/// `15s`, `2m`, `500ms` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| DurationError::NotADuration(text.to_owned()))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        _ => Err(DurationError::UnknownUnit {
            text: text.to_owned(),
            unit: unit.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(
            parse_duration("soon").map_err(|e| e.to_string()),
            Err("\"soon\" is not a duration like 15s, 2m or 500ms".into())
        );
        assert_eq!(
            parse_duration("5h").map_err(|e| e.to_string()),
            Err("\"5h\": unknown unit \"h\" (use ms, s or m)".into())
        );
    }
}
