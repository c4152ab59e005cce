//! A PEM decoder with the semantics of Go's `encoding/pem.Decode`: text
//! before, between and after blocks is skipped; a malformed block is skipped
//! and the search continues after its BEGIN line.

use base64::Engine as _;

/// One decoded PEM block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub typ: String,
    pub headers: Vec<(String, String)>,
    pub bytes: Vec<u8>,
}

const BEGIN: &[u8] = b"-----BEGIN ";
const NL_BEGIN: &[u8] = b"\n-----BEGIN ";
const END_OF_LINE: &[u8] = b"-----";

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Go `getLine`: the first line (without `\r\n`/`\n`, trailing spaces and tabs
/// trimmed) and the rest.
fn get_line(data: &[u8]) -> (&[u8], &[u8]) {
    let (mut line, rest) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    while let Some((&last, head)) = line.split_last() {
        if last == b' ' || last == b'\t' || last == b'\r' {
            line = head;
        } else {
            break;
        }
    }
    (line, rest)
}

fn trim(b: &[u8]) -> &[u8] {
    let is_ws = |c: &u8| matches!(c, b' ' | b'\t' | b'\r' | b'\n');
    let start = b.iter().position(|c| !is_ws(c)).unwrap_or(b.len());
    let end = b.iter().rposition(|c| !is_ws(c)).map_or(start, |i| i + 1);
    &b[start..end.max(start)]
}

/// Decode the next PEM block in `data`; returns the block and the remaining input.
pub fn decode(data: &[u8]) -> Option<(Block, &[u8])> {
    let mut rest = data;
    loop {
        if rest.starts_with(BEGIN) {
            rest = &rest[BEGIN.len()..];
        } else if let Some(i) = find(rest, NL_BEGIN) {
            rest = &rest[i + NL_BEGIN.len()..];
        } else {
            return None;
        }
        let (type_line, after_type) = get_line(rest);
        if !type_line.ends_with(END_OF_LINE) {
            continue;
        }
        let typ = &type_line[..type_line.len() - END_OF_LINE.len()];
        let mut body = after_type;
        let mut headers = Vec::new();
        let mut ok = true;
        loop {
            if body.is_empty() {
                ok = false;
                break;
            }
            let (line, next) = get_line(body);
            match line.iter().position(|&b| b == b':') {
                Some(i) => {
                    let k = String::from_utf8_lossy(trim(&line[..i])).into_owned();
                    let v = String::from_utf8_lossy(trim(&line[i + 1..])).into_owned();
                    headers.push((k, v));
                    body = next;
                }
                None => break,
            }
        }
        if !ok {
            continue;
        }
        let mut end_marker = b"-----END ".to_vec();
        end_marker.extend_from_slice(typ);
        end_marker.extend_from_slice(END_OF_LINE);
        let (end_index, trailer_index) = if headers.is_empty() && body.starts_with(&end_marker[..])
        {
            (0usize, end_marker.len())
        } else {
            let mut nl_marker = b"\n".to_vec();
            nl_marker.extend_from_slice(&end_marker);
            match find(body, &nl_marker) {
                Some(i) => (i, i + nl_marker.len()),
                None => continue,
            }
        };
        // The END line must end right after the marker (modulo spaces).
        let trailer = &body[trailer_index..];
        let (rest_of_line, after_end) = get_line(trailer);
        if !rest_of_line.is_empty() {
            continue;
        }
        let b64: Vec<u8> = body[..end_index]
            .iter()
            .copied()
            .filter(|c| !matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
            .collect();
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(&b64) else {
            continue;
        };
        return Some((
            Block {
                typ: String::from_utf8_lossy(typ).into_owned(),
                headers,
                bytes,
            },
            after_end,
        ));
    }
}

/// All blocks in order.
pub fn decode_all(data: &[u8]) -> Vec<Block> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some((b, r)) = decode(rest) {
        out.push(b);
        rest = r;
    }
    out
}

/// Encode DER as a PEM block with 64-column lines.
pub fn encode(typ: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = format!("-----BEGIN {typ}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(&String::from_utf8_lossy(chunk));
        s.push('\n');
    }
    s.push_str(&format!("-----END {typ}-----\n"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_text_and_reads_blocks() {
        let pem = format!(
            "hello\n{}junk\n{}",
            encode("CERTIFICATE", b"abc"),
            encode("X", b"d")
        );
        let blocks = decode_all(pem.as_bytes());
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].typ, "CERTIFICATE");
        assert_eq!(blocks[0].bytes, b"abc");
        assert_eq!(blocks[1].typ, "X");
    }

    #[test]
    fn headers_are_reported() {
        let pem = "-----BEGIN CERTIFICATE-----\nComment: hi\n\nYWJj\n-----END CERTIFICATE-----\n";
        let blocks = decode_all(pem.as_bytes());
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].headers.len(), 1);
    }

    #[test]
    fn no_blocks_in_text() {
        assert!(decode(b"not a certificate").is_none());
    }
}
