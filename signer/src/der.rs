//! A minimal DER writer: tag, definite length, content. Just enough for leaf certificates
//! (`leaf.rs`), canonical SubjectPublicKeyInfos (`keys.rs`) and the PKCS#11 backend's
//! conversions (`backend/pkcs11/der.rs`). It writes what it is told and checks no ASN.1 schema,
//! so every structure built with it is tested against a parser.
//!
//! And [`read`], the one value at a time reader behind the stub CSR fast path (`keys.rs`);
//! everything else is parsed with x509-parser.

pub(crate) const BOOLEAN: u8 = 0x01;
pub(crate) const INTEGER: u8 = 0x02;
pub(crate) const BIT_STRING: u8 = 0x03;
pub(crate) const OCTET_STRING: u8 = 0x04;
pub(crate) const NULL: u8 = 0x05;
pub(crate) const OID: u8 = 0x06;
pub(crate) const UTC_TIME: u8 = 0x17;
pub(crate) const GENERALIZED_TIME: u8 = 0x18;
pub(crate) const SEQUENCE: u8 = 0x30;

/// `[n] IMPLICIT` of a primitive type (GeneralName's dNSName is `[2]`, URI `[6]`, and
/// AuthorityKeyIdentifier's keyIdentifier `[0]`).
pub(crate) const fn context_primitive(n: u8) -> u8 {
    0x80 | n
}

/// `[n] EXPLICIT` (TBSCertificate's version is `[0]`, its extensions `[3]`).
pub(crate) const fn context_constructed(n: u8) -> u8 {
    0xa0 | n
}

/// Appends DER length octets: short form below 128, else the minimal long form.
pub(crate) fn push_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
}

/// Appends one value whose content is already encoded.
pub(crate) fn push(out: &mut Vec<u8>, tag: u8, content: &[u8]) {
    out.push(tag);
    push_len(out, content.len());
    out.extend_from_slice(content);
}

/// Appends one value whose content `write` appends in place; the length is filled in after, so
/// nested structures need no intermediate buffers.
pub(crate) fn push_nested(out: &mut Vec<u8>, tag: u8, write: impl FnOnce(&mut Vec<u8>)) {
    push_nested_expecting(out, tag, 0, write);
}

/// Like [`push_nested`], with room left for the length octets of `expected` content bytes: when
/// the content's length takes as many octets (same form), nothing is moved. A wrong guess costs
/// one move of the content, never a wrong encoding.
pub(crate) fn push_nested_expecting(
    out: &mut Vec<u8>,
    tag: u8,
    expected: usize,
    write: impl FnOnce(&mut Vec<u8>),
) {
    out.push(tag);
    let len_at = out.len();
    let reserved = len_octets(expected);
    out.resize(len_at + reserved, 0);
    write(out);
    let len = out.len() - len_at - reserved;
    let needed = len_octets(len);
    if needed != reserved {
        out.splice(len_at..len_at + reserved, std::iter::repeat_n(0, needed));
    }
    let octets = &mut out[len_at..len_at + needed];
    if len < 0x80 {
        octets[0] = len as u8;
    } else {
        octets[0] = 0x80 | (needed - 1) as u8;
        let bytes = len.to_be_bytes();
        octets[1..].copy_from_slice(&bytes[bytes.len() - (needed - 1)..]);
    }
}

/// How many octets the DER length of `len` content bytes takes.
fn len_octets(len: usize) -> usize {
    if len < 0x80 {
        1
    } else {
        1 + (usize::BITS - len.leading_zeros()).div_ceil(8) as usize
    }
}

/// Appends a DER INTEGER holding the unsigned big-endian `magnitude`: leading zeros dropped, a
/// zero octet added when the top bit would make it negative.
pub(crate) fn push_unsigned(out: &mut Vec<u8>, magnitude: &[u8]) {
    let start = magnitude.iter().take_while(|b| **b == 0).count();
    let digits = &magnitude[start..];
    let pad = digits.first().is_none_or(|b| b & 0x80 != 0);
    out.push(INTEGER);
    push_len(out, digits.len() + usize::from(pad));
    if pad {
        out.push(0);
    }
    out.extend_from_slice(digits);
}

/// One DER value read from the front of `input`: its tag, its content, the whole encoding
/// (tag, length and content), and what follows it.
pub(crate) struct Read<'a> {
    pub tag: u8,
    pub content: &'a [u8],
    pub whole: &'a [u8],
    pub rest: &'a [u8],
}

/// Reads one value, strictly: a low tag number (one tag octet) and a definite length in its
/// minimal form, the content all there. `None` for anything else, including the valid BER
/// that DER forbids; callers that need the reason use x509-parser.
pub(crate) fn read(input: &[u8]) -> Option<Read<'_>> {
    let (&tag, after_tag) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut after_len) = after_tag.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let octets = usize::from(first & 0x7f);
        // 0x80 is BER's indefinite length; more than 4 octets is no CSR's.
        if octets == 0 || octets > 4 || after_len.len() < octets || after_len[0] == 0 {
            return None;
        }
        let len = after_len[..octets]
            .iter()
            .fold(0usize, |len, b| len << 8 | usize::from(*b));
        if len < 0x80 {
            return None;
        }
        after_len = &after_len[octets..];
        len
    };
    if after_len.len() < len {
        return None;
    }
    let header = input.len() - after_len.len();
    Some(Read {
        tag,
        content: &after_len[..len],
        whole: &input[..header + len],
        rest: &after_len[len..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_takes_what_the_writer_wrote_and_refuses_non_der() {
        for len in [0usize, 1, 127, 128, 255, 256, 70_000] {
            let content = vec![0x5a; len];
            let mut out = vec![];
            push(&mut out, OCTET_STRING, &content);
            out.extend_from_slice(&[1, 2, 3]);
            let value = read(&out).unwrap();
            assert_eq!(value.tag, OCTET_STRING);
            assert_eq!(value.content, content.as_slice());
            assert_eq!(value.whole, &out[..out.len() - 3]);
            assert_eq!(value.rest, [1, 2, 3]);
        }
        for bad in [
            &[][..],
            &[0x04],
            // Indefinite length, a non-minimal short length, a leading zero length octet.
            &[0x30, 0x80, 0x00, 0x00],
            &[0x04, 0x81, 0x05, 1, 2, 3, 4, 5],
            &[0x04, 0x82, 0x00, 0x80],
            // A high tag number, and content shorter than its length.
            &[0x1f, 0x81, 0x01, 0x00],
            &[0x04, 0x03, 1, 2],
            &[0x04, 0x85, 1, 0, 0, 0, 0],
        ] {
            assert!(read(bad).is_none(), "{bad:02x?}");
        }
    }

    #[test]
    fn lengths_use_the_minimal_form() {
        let encoded = |len: usize| {
            let mut out = vec![];
            push_len(&mut out, len);
            out
        };
        assert_eq!(encoded(0), [0x00]);
        assert_eq!(encoded(127), [0x7f]);
        assert_eq!(encoded(128), [0x81, 0x80]);
        assert_eq!(encoded(255), [0x81, 0xff]);
        assert_eq!(encoded(256), [0x82, 0x01, 0x00]);
        assert_eq!(encoded(70_000), [0x83, 0x01, 0x11, 0x70]);
        for len in [
            0,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            70_000,
            1 << 24,
            usize::MAX,
        ] {
            assert_eq!(len_octets(len), encoded(len).len(), "{len}");
        }
    }

    #[test]
    fn nested_values_get_their_length_in_front() {
        for len in [0usize, 1, 127, 128, 255, 256, 1000, 70_000] {
            let content: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut expected = vec![0xaa];
            push(&mut expected, SEQUENCE, &content);
            let mut out = vec![0xaa];
            push_nested(&mut out, SEQUENCE, |o| o.extend_from_slice(&content));
            assert_eq!(out, expected, "content of {len} bytes");
        }
        // Every guess of the length, right or wrong, gives the same bytes.
        for len in [0usize, 1, 127, 128, 255, 256, 1000, 70_000] {
            let content: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut expected = vec![];
            push(&mut expected, SEQUENCE, &content);
            for guess in [0usize, 1, 127, 128, 255, 256, 1000, 65_535, 65_536, 70_000] {
                let mut out = vec![];
                push_nested_expecting(&mut out, SEQUENCE, guess, |o| o.extend_from_slice(&content));
                assert_eq!(out, expected, "content of {len} bytes, guessed {guess}");
            }
        }
        let mut out = vec![];
        push_nested(&mut out, SEQUENCE, |o| {
            push_nested(o, SEQUENCE, |o| push(o, NULL, &[]));
            push(o, BOOLEAN, &[0xff]);
        });
        assert_eq!(out, [0x30, 0x07, 0x30, 0x02, 0x05, 0x00, 0x01, 0x01, 0xff]);
    }

    #[test]
    fn unsigned_integers_are_minimal_and_positive() {
        let encoded = |magnitude: &[u8]| {
            let mut out = vec![];
            push_unsigned(&mut out, magnitude);
            out
        };
        assert_eq!(encoded(&[0, 0, 5]), [0x02, 0x01, 0x05]);
        assert_eq!(encoded(&[0x80]), [0x02, 0x02, 0x00, 0x80]);
        assert_eq!(encoded(&[0x7f, 0xff]), [0x02, 0x02, 0x7f, 0xff]);
        assert_eq!(encoded(&[]), [0x02, 0x01, 0x00]);
        assert_eq!(encoded(&[0, 0]), [0x02, 0x01, 0x00]);
    }
}
