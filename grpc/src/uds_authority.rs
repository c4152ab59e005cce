//! Interoperability shim for the Unix socket: accept gRPC clients that send a socket path as
//! the HTTP/2 `:authority`.
//!
//! grpcio (Python, e.g. the PyPI `spiffe` package), grpc-java and grpc-swift send `:authority`
//! values such as `/run/podca/workload.sock` or `%2Frun%2F…` on Unix-socket channels. The h2
//! server under tonic rejects any `:authority` that is not RFC 3986 `host[:port]` with
//! RST_STREAM(PROTOCOL_ERROR) (hyperium/h2#487, still open; hyperium/tonic#243), so such clients
//! could never reach a tonic Workload API. The fix here sits between the socket and h2: it
//! re-reads the client's HPACK header blocks, replaces an invalid `:authority` with `localhost`
//! (what grpc-go and Kubernetes use for Unix sockets), and re-encodes every block as literals
//! without indexing, so h2's HPACK decoder never holds dynamic-table state that could disagree
//! with the client's. Everything other than HEADERS/CONTINUATION frames passes through
//! untouched, and nothing is ever written back to the client by this layer.
//!
//! Most clients (grpc-go, tonic, the Rust `spiffe` crate) send a valid `:authority`, and send
//! the same one on every request of a connection. So the shim looks at the first header block
//! of a connection only: when its `:authority` is valid (or absent), that block and every byte
//! after it pass through verbatim, read straight into h2's buffer, and h2's HPACK state is the
//! client's own. Only a connection whose first block needs the fix is rewritten, block by
//! block, to its end. (A client that switched to an invalid `:authority` later on a connection
//! would get h2's RST_STREAM for that request, as without the shim.)
//!
//! The HPACK decoder is `loona-hpack`'s: the unmaintained `hpack` crate it replaces panicked on
//! malformed blocks such as the single byte `0x3f` (RUSTSEC-2023-0085). A block that does not
//! decode is handed to h2 as it came, and h2 ends the connection with COMPRESSION_ERROR.
//!
//! The shim decodes before h2 does, so it keeps h2's HPACK budgets itself (issue #40): its
//! dynamic table is h2's ([`HEADER_TABLE_SIZE`]; a client's size update above it is an error,
//! as in h2), and it never holds more of a decoded block than the server's header-list limit
//! ([`MAX_HEADER_LIST_BYTES`]). A compression bomb (one large table entry referenced thousands
//! of times by one-byte indexes) would otherwise make a few kilobytes decode, and be
//! re-encoded, into hundreds of megabytes. A block over the budget goes to h2 as it came,
//! which refuses it within its own limits.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use super::server::MAX_HEADER_LIST_BYTES;

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// h2's default SETTINGS_MAX_FRAME_SIZE, which tonic's server keeps: frames we write stay
/// below it.
const MAX_FRAME_PAYLOAD: usize = 16_384;
/// Header blocks larger than this are passed through as they are, undecoded (h2 refuses them
/// anyway): an encoded block is no larger than the header list it decodes to, give or take a
/// few bytes a field, and that is at most [`MAX_HEADER_LIST_BYTES`].
const MAX_HEADER_BLOCK: usize = 2 * MAX_HEADER_LIST_BYTES as usize;
/// SETTINGS_HEADER_TABLE_SIZE of tonic's h2 server: the protocol's default, which tonic does
/// not change (nor let us change). h2 refuses a size update above it; so does the shim.
const HEADER_TABLE_SIZE: usize = 4096;
/// What a header field costs in a header list (RFC 7541 §4.1, as h2 counts it).
const FIELD_OVERHEAD: usize = 32;
const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// A stream whose client-to-server HTTP/2 header blocks get a valid `:authority`.
pub struct AuthorityFix<S> {
    inner: S,
    decoder: loona_hpack::Decoder<'static>,
    /// Bytes read from the client, not yet processed.
    input: Vec<u8>,
    /// Processed bytes for h2.
    output: Vec<u8>,
    output_pos: usize,
    preface_left: usize,
    /// Bytes of a non-header frame still to pass through as they come.
    passthrough_left: usize,
    /// A header block waiting for its CONTINUATION frames.
    pending: Option<PendingBlock>,
    /// Decoding failed once: from then on, everything passes through unchanged and h2 answers.
    broken: bool,
    /// The first header block needed no fix: everything passes through unchanged.
    verbatim: bool,
    /// Some header block was re-encoded: h2's HPACK table is no longer the client's, so every
    /// later block must be re-encoded too.
    rewritten: bool,
}

struct PendingBlock {
    stream_id: [u8; 4],
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
    /// The block's frames as they came (HEADERS and its CONTINUATIONs).
    raw: Vec<u8>,
}

impl<S> std::fmt::Debug for AuthorityFix<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFix").finish_non_exhaustive()
    }
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        AuthorityFix {
            inner,
            decoder,
            input: Vec::new(),
            output: Vec::new(),
            output_pos: 0,
            preface_left: PREFACE_LEN,
            passthrough_left: 0,
            pending: None,
            broken: false,
            verbatim: false,
            rewritten: false,
        }
    }

    /// Whether everything from here on passes through unchanged.
    fn passing_through(&self) -> bool {
        self.broken || self.verbatim
    }

    /// Moves every complete unit of `input` to `output`.
    fn process(&mut self) {
        loop {
            if self.passing_through() {
                self.output.append(&mut self.input);
                return;
            }
            if self.preface_left > 0 {
                let n = self.preface_left.min(self.input.len());
                self.output.extend(self.input.drain(..n));
                self.preface_left -= n;
                if self.preface_left > 0 {
                    return;
                }
                continue;
            }
            if self.passthrough_left > 0 {
                let n = self.passthrough_left.min(self.input.len());
                self.output.extend(self.input.drain(..n));
                self.passthrough_left -= n;
                if n == 0 {
                    return;
                }
                continue;
            }
            if self.input.len() < FRAME_HEADER_LEN {
                return;
            }
            let len = usize::from(self.input[0]) << 16
                | usize::from(self.input[1]) << 8
                | usize::from(self.input[2]);
            let frame_type = self.input[3];
            let is_header_frame = frame_type == TYPE_HEADERS || frame_type == TYPE_CONTINUATION;
            if !is_header_frame || len > MAX_HEADER_BLOCK {
                if is_header_frame {
                    self.broken = true;
                }
                self.output.extend(self.input.drain(..FRAME_HEADER_LEN));
                self.passthrough_left = len;
                continue;
            }
            if self.input.len() < FRAME_HEADER_LEN + len {
                return;
            }
            let frame: Vec<u8> = self.input.drain(..FRAME_HEADER_LEN + len).collect();
            self.header_frame(&frame);
        }
    }

    fn header_frame(&mut self, frame: &[u8]) {
        let frame_type = frame[3];
        let flags = frame[4];
        let mut stream_id = [0u8; 4];
        stream_id.copy_from_slice(&frame[5..9]);
        let payload = &frame[FRAME_HEADER_LEN..];
        if frame_type == TYPE_HEADERS {
            let Some((priority, fragment)) = split_headers_payload(flags, payload) else {
                self.fail(frame);
                return;
            };
            let pending = PendingBlock {
                stream_id,
                flags,
                priority,
                block: fragment.to_vec(),
                raw: frame.to_vec(),
            };
            if flags & FLAG_END_HEADERS != 0 {
                self.emit(pending, frame);
            } else {
                self.pending = Some(pending);
            }
        } else {
            let Some(mut pending) = self.pending.take() else {
                self.fail(frame);
                return;
            };
            pending.block.extend_from_slice(payload);
            pending.raw.extend_from_slice(frame);
            if pending.block.len() > MAX_HEADER_BLOCK {
                self.give_up(&pending.raw);
            } else if flags & FLAG_END_HEADERS != 0 {
                self.emit(pending, frame);
            } else {
                self.pending = Some(pending);
            }
        }
    }

    /// Gives up rewriting: h2 sees the raw bytes and answers with its own error.
    fn fail(&mut self, frame: &[u8]) {
        self.broken = true;
        self.output.extend_from_slice(frame);
    }

    /// A block too large for the server: h2 gets it as the client sent it (all its frames),
    /// and refuses it within its own limits.
    fn give_up(&mut self, raw: &[u8]) {
        self.broken = true;
        self.output.extend_from_slice(raw);
    }

    fn emit(&mut self, pending: PendingBlock, last_frame: &[u8]) {
        let mut headers = Vec::new();
        let mut list_bytes = 0usize;
        let decoded = self.decoder.decode_with_cb(&pending.block, |name, value| {
            // Counted for every field; kept only within the budget.
            list_bytes = list_bytes.saturating_add(name.len() + value.len() + FIELD_OVERHEAD);
            if list_bytes <= MAX_HEADER_LIST_BYTES as usize {
                headers.push((name.into_owned(), value.into_owned()));
            }
        });
        if decoded.is_err() {
            self.fail(last_frame);
            return;
        }
        if list_bytes > MAX_HEADER_LIST_BYTES as usize {
            self.give_up(&pending.raw);
            return;
        }
        let invalid = |name: &[u8], value: &[u8]| {
            name == b":authority" && http::uri::Authority::try_from(value).is_err()
        };
        if !self.rewritten && !headers.iter().any(|(n, v)| invalid(n, v)) {
            // h2 has seen no block but the client's own: hand this one over as it came, and
            // from now on everything.
            self.output.extend_from_slice(&pending.raw);
            self.verbatim = true;
            return;
        }
        self.rewritten = true;
        let mut block = Vec::with_capacity(pending.block.len() + 64);
        for (name, value) in &headers {
            let value: &[u8] = if invalid(name, value) {
                REPLACEMENT_AUTHORITY
            } else {
                value
            };
            // Literal header field without indexing, new name (RFC 7541 §6.2.2).
            block.push(0x00);
            encode_string(&mut block, name);
            encode_string(&mut block, value);
        }
        let mut first = true;
        let mut rest: &[u8] = &block;
        loop {
            let mut payload = Vec::new();
            let mut flags = 0;
            if first {
                flags |= pending.flags & FLAG_END_STREAM;
                if let Some(priority) = pending.priority {
                    flags |= FLAG_PRIORITY;
                    payload.extend_from_slice(&priority);
                }
            }
            let room = MAX_FRAME_PAYLOAD - payload.len();
            let take = room.min(rest.len());
            payload.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if rest.is_empty() {
                flags |= FLAG_END_HEADERS;
            }
            let frame_type = if first {
                TYPE_HEADERS
            } else {
                TYPE_CONTINUATION
            };
            let len = payload.len();
            // len ≤ MAX_FRAME_PAYLOAD < 2^24, so the three bytes hold it.
            self.output
                .extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
            self.output.push(frame_type);
            self.output.push(flags);
            self.output.extend_from_slice(&pending.stream_id);
            self.output.extend_from_slice(&payload);
            first = false;
            if rest.is_empty() {
                return;
            }
        }
    }
}

/// Priority bytes and the header-block fragment of a HEADERS payload.
fn split_headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut body = payload;
    let mut padding = 0;
    if flags & FLAG_PADDED != 0 {
        let (&pad, rest) = body.split_first()?;
        padding = usize::from(pad);
        body = rest;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        if body.len() < 5 {
            return None;
        }
        let mut p = [0u8; 5];
        p.copy_from_slice(&body[..5]);
        priority = Some(p);
        body = &body[5..];
    }
    if padding > body.len() {
        return None;
    }
    Some((priority, &body[..body.len() - padding]))
}

/// An HPACK string literal without Huffman coding.
fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    encode_integer(out, s.len(), 7, 0x00);
    out.extend_from_slice(s);
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn encode_integer(out: &mut Vec<u8>, mut value: usize, n: u32, first_byte_flags: u8) {
    let max = (1usize << n) - 1;
    if value < max {
        // value < 2^n ≤ 128 fits in a byte.
        out.push(first_byte_flags | value as u8);
        return;
    }
    out.push(first_byte_flags | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.passing_through()
                && this.output_pos == this.output.len()
                && this.input.is_empty()
            {
                // Nothing of ours left to hand over: h2 reads the socket directly.
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            if this.output_pos < this.output.len() {
                let n = buf.remaining().min(this.output.len() - this.output_pos);
                buf.put_slice(&this.output[this.output_pos..this.output_pos + n]);
                this.output_pos += n;
                if this.output_pos == this.output.len() {
                    this.output.clear();
                    this.output_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let filled = read.filled();
                    if filled.is_empty() {
                        // End of stream: hand over whatever is left, unprocessed.
                        this.output.append(&mut this.input);
                        if this.output.is_empty() {
                            return Poll::Ready(Ok(()));
                        }
                        continue;
                    }
                    this.input.extend_from_slice(filled);
                    this.process();
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            frame_type,
            flags,
        ];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn request_headers(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (
                b":path".to_vec(),
                b"/SpiffeWorkloadAPI/FetchX509SVID".to_vec(),
            ),
            (b":authority".to_vec(), authority.to_vec()),
            (b"workload.spiffe.io".to_vec(), b"true".to_vec()),
        ]
    }

    async fn through_shim(input: Vec<u8>) -> Vec<u8> {
        let mut shim = AuthorityFix::new(std::io::Cursor::new(input));
        let mut out = Vec::new();
        shim.read_to_end(&mut out).await.unwrap();
        out
    }

    /// Splits the shim's output back into (type, flags, payload) frames after the preface.
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
        assert_eq!(&bytes[..24], PREFACE);
        bytes = &bytes[24..];
        let mut out = vec![];
        while !bytes.is_empty() {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            out.push((bytes[3], bytes[4], bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    #[tokio::test]
    async fn socket_path_authority_becomes_localhost_across_requests() {
        // The client's encoder indexes headers, so the second request refers to the first
        // one's dynamic-table entries: the shim must follow the client's table.
        let mut encoder = loona_hpack::Encoder::new();
        let first = encoder.encode(
            request_headers(b"/run/podca/workload.sock")
                .iter()
                .map(|(n, v)| (n.as_slice(), v.as_slice())),
        );
        let second = encoder.encode(
            request_headers(b"/run/podca/workload.sock")
                .iter()
                .map(|(n, v)| (n.as_slice(), v.as_slice())),
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0")); // DATA
        // The second block split over HEADERS + CONTINUATION, with padding.
        let (a, b) = second.split_at(second.len() / 2);
        let mut padded = vec![3u8];
        padded.extend_from_slice(a);
        padded.extend_from_slice(&[0, 0, 0]);
        input.extend(frame(TYPE_HEADERS, FLAG_PADDED, 3, &padded));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, b));

        let out = frames(&through_shim(input).await);
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].0, 0x4);
        assert_eq!(out[2], (0x0, FLAG_END_STREAM, b"\0\0\0\0\0".to_vec()));
        let mut decoder = loona_hpack::Decoder::new();
        for index in [1, 3] {
            let (t, flags, payload) = &out[index];
            assert_eq!(*t, TYPE_HEADERS);
            assert_eq!(flags & FLAG_END_HEADERS, FLAG_END_HEADERS);
            let headers = decoder.decode(payload).unwrap();
            assert_eq!(headers, request_headers(b"localhost"));
        }
    }

    fn encode(encoder: &mut loona_hpack::Encoder<'_>, authority: &[u8]) -> Vec<u8> {
        encoder.encode(
            request_headers(authority)
                .iter()
                .map(|(n, v)| (n.as_slice(), v.as_slice())),
        )
    }

    #[tokio::test]
    async fn a_connection_whose_first_authority_is_valid_passes_through_verbatim() {
        let mut encoder = loona_hpack::Encoder::new();
        let first = encode(&mut encoder, b"localhost:8443");
        // Later blocks, indexed against the client's table, pass as they are, even one whose
        // authority h2 will refuse (a client does not change it on a connection).
        let second = encode(&mut encoder, b"localhost:8443");
        let third = encode(&mut encoder, b"/run/podca/workload.sock");
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        // The first block over HEADERS + CONTINUATION.
        let (a, b) = first.split_at(first.len() / 2);
        input.extend(frame(TYPE_HEADERS, FLAG_END_STREAM, 1, a));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b));
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &second));
        input.extend(frame(0x0, FLAG_END_STREAM, 3, b"\0\0\0\0\0")); // DATA
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 5, &third));
        assert_eq!(through_shim(input.clone()).await, input);
        // Read in small pieces (as a socket delivers them), the same.
        let mut shim = AuthorityFix::new(tokio_test_reader(input.clone(), 7));
        let mut out = Vec::new();
        shim.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, input);
    }

    /// A reader that returns at most `chunk` bytes per read.
    fn tokio_test_reader(data: Vec<u8>, chunk: usize) -> impl AsyncRead + Unpin {
        struct Chunked(std::io::Cursor<Vec<u8>>, usize);
        impl AsyncRead for Chunked {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                let n = self.1.min(buf.remaining());
                let mut piece = vec![0u8; n];
                let read = std::io::Read::read(&mut self.0, &mut piece)?;
                buf.put_slice(&piece[..read]);
                Poll::Ready(Ok(()))
            }
        }
        Chunked(std::io::Cursor::new(data), chunk)
    }

    #[tokio::test]
    async fn after_a_fixed_block_every_block_is_re_encoded() {
        // h2's table then differs from the client's: a later valid block, which indexes the
        // client's table, must not pass as it came.
        let mut encoder = loona_hpack::Encoder::new();
        let first = encode(&mut encoder, b"/run/podca/workload.sock");
        let second = encode(&mut encoder, b"localhost");
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &first,
        ));
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &second,
        ));
        let out = frames(&through_shim(input).await);
        assert_eq!(out.len(), 2);
        assert_ne!(out[1].2, second);
        // Literals only: a decoder with an empty table reads each block on its own.
        for (want, (_, flags, payload)) in [b"localhost", b"localhost"].iter().zip(&out) {
            assert_eq!(*flags, FLAG_END_HEADERS | FLAG_END_STREAM);
            let headers = loona_hpack::Decoder::new().decode(payload).unwrap();
            assert_eq!(headers, request_headers(*want));
        }
    }

    /// RUSTSEC-2023-0085: the `hpack` crate's decoder panicked on the one byte 0x3f (a dynamic
    /// table size update whose integer never ends). The shim must pass such a block to h2
    /// unchanged (h2 then answers COMPRESSION_ERROR) and keep working.
    #[tokio::test]
    async fn truncated_size_update_0x3f_passes_through() {
        assert!(matches!(
            loona_hpack::Decoder::new().decode(&[0x3f]),
            Err(loona_hpack::decoder::DecoderError::IntegerDecodingError(_))
        ));
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        let bad = frame(TYPE_HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, 1, &[0x3f]);
        input.extend(&bad);
        // Later frames pass through as they are once a block fails to decode.
        let ping = frame(0x6, 0, 0, &[0; 8]);
        input.extend(&ping);
        let out = through_shim(input).await;
        let mut want = PREFACE.to_vec();
        want.extend(frame(0x4, 0, 0, &[]));
        want.extend(bad);
        want.extend(ping);
        assert_eq!(out, want);
        // The same byte split across HEADERS + CONTINUATION.
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, 0, 1, &[]));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x3f]));
        let out = frames(&through_shim(input).await);
        assert_eq!(out.last().map(|f| f.2.clone()), Some(vec![0x3f]));
    }

    /// Request headers with a socket-path `:authority` (so the shim re-encodes the block),
    /// as literals that leave no trace in the table, and `extra` after them.
    fn block_to_rewrite(prefix: &[u8], extra: &[u8]) -> Vec<u8> {
        let mut block = prefix.to_vec();
        for (name, value) in request_headers(b"/run/podca/workload.sock") {
            block.push(0x00);
            encode_string(&mut block, &name);
            encode_string(&mut block, &value);
        }
        block.extend_from_slice(extra);
        block
    }

    /// The attack (issue #40): one 4 KB header in the dynamic table, then 12,000 one-byte
    /// references to it: a 16 KB block that decodes to 48 MB. The shim must not expand it (it
    /// used to decode and re-encode all of it); h2 gets the block as sent and refuses it.
    #[tokio::test]
    async fn a_compression_bomb_is_not_expanded() {
        let mut bomb = vec![0x40]; // literal with incremental indexing, new name
        encode_string(&mut bomb, b"x-pad");
        encode_string(&mut bomb, &[b'a'; 4000]);
        bomb.extend(std::iter::repeat_n(0x80 | 62, 12_000)); // indexed: the newest entry
        let block = block_to_rewrite(&[], &bomb);
        assert!(block.len() <= MAX_FRAME_PAYLOAD, "{}", block.len());
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
        let ping = frame(0x6, 0, 0, &[0; 8]);
        input.extend(&ping);
        assert_eq!(through_shim(input.clone()).await, input);
        // The same over HEADERS + CONTINUATION.
        let (a, b) = block.split_at(block.len() / 2);
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, 0, 1, a));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b));
        assert_eq!(through_shim(input.clone()).await, input);
        // An ordinary block is still fixed.
        let fits = block_to_rewrite(&[], &[]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &fits));
        assert_ne!(through_shim(input.clone()).await, input);
    }

    /// A dynamic table size update above h2's 4096 bytes (here 1 GiB, so that the shim's table
    /// would hold whatever the client indexes) is an error, as in h2: the block goes to h2 as
    /// it came, which ends the connection with COMPRESSION_ERROR.
    #[tokio::test]
    async fn a_table_size_above_h2s_is_refused() {
        let mut update = vec![];
        encode_integer(&mut update, 1 << 30, 5, 0x20);
        let block = block_to_rewrite(&update, &[]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
        assert_eq!(through_shim(input.clone()).await, input);
        // h2's own size is allowed.
        let mut update = vec![];
        encode_integer(&mut update, HEADER_TABLE_SIZE, 5, 0x20);
        let block = block_to_rewrite(&update, &[]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
        let out = frames(&through_shim(input).await);
        let headers = loona_hpack::Decoder::new().decode(&out[0].2).unwrap();
        assert_eq!(headers, request_headers(b"localhost"));
    }

    #[test]
    fn hpack_integers() {
        let mut out = vec![];
        encode_integer(&mut out, 1337, 5, 0);
        assert_eq!(out, [31, 154, 10]); // RFC 7541 C.1.2
        let mut out = vec![];
        encode_integer(&mut out, 10, 5, 0);
        assert_eq!(out, [10]);
    }
}
