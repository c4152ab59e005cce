//! HTTP/2 header budgets on `podca dev`'s Workload API socket, tried as an attacker would
//! (issue #40): an HPACK compression bomb is refused without podca decoding it into memory,
//! and podca keeps serving the next client.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns panic on broken fixtures too

use std::time::Duration;

use podca_tests::process::DevProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// The frame size every HTTP/2 peer accepts before settings say otherwise.
const MAX_FRAME: usize = 16_384;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn integer(out: &mut Vec<u8>, mut value: usize, n: u32, flags: u8) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, s.len(), 7, 0);
    out.extend_from_slice(s);
}

/// A FetchX509SVID request whose `:authority` is the socket's path (as grpcio sends it, so
/// podca's shim decodes and re-encodes the block), then one 4 KB header put in the dynamic
/// table and `references` one-byte references to it: `references` × 4 KB once decoded.
fn bomb(references: usize) -> Vec<u8> {
    let mut block = vec![];
    for (name, value) in [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/SpiffeWorkloadAPI/FetchX509SVID"),
        (b":authority", b"/run/podca/workload.sock"),
        (b"content-type", b"application/grpc"),
        (b"workload.spiffe.io", b"true"),
    ] {
        block.push(0x00); // literal without indexing, new name
        string(&mut block, name);
        string(&mut block, value);
    }
    block.push(0x40); // literal with incremental indexing, new name
    string(&mut block, b"x-pad");
    string(&mut block, &[b'a'; 4000]);
    block.extend(std::iter::repeat_n(0x80 | 62, references)); // indexed: that entry
    block
}

/// The block as HEADERS and CONTINUATION frames on stream 1.
fn request(block: &[u8]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let mut flags = if i == 0 { END_STREAM } else { 0 };
        if i + 1 == chunks.len() {
            flags |= END_HEADERS;
        }
        out.extend(frame(kind, flags, 1, chunk));
    }
    out
}

/// How podca answered stream 1, read until the server closes or goes quiet.
async fn answer(stream: &mut UnixStream) -> Vec<String> {
    let mut bytes = vec![];
    let mut buf = vec![0u8; 65_536];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => bytes.extend_from_slice(&buf[..n]),
        }
    }
    let mut decoder = loona_hpack::Decoder::new();
    let mut seen = vec![];
    let mut rest = &bytes[..];
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        if rest.len() < 9 + len {
            break;
        }
        let (kind, id) = (
            rest[3],
            u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]),
        );
        let payload = &rest[9..9 + len];
        match kind {
            HEADERS if id == 1 => {
                for (name, value) in decoder.decode(payload).unwrap() {
                    if name == b":status" {
                        seen.push(format!("status {}", String::from_utf8_lossy(&value)));
                    }
                }
            }
            RST_STREAM if id == 1 => seen.push("RST_STREAM".into()),
            GOAWAY => seen.push("GOAWAY".into()),
            DATA if id == 1 => seen.push("DATA".into()),
            _ => {}
        }
        rest = &rest[9 + len..];
    }
    seen
}

/// The peak resident memory of `pid`, in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .map(|v| v.trim().parse().unwrap())
        .expect("VmHWM in /proc/<pid>/status");
    kib * 1024
}

/// The attack: HPACK compression bombs on the Workload API socket. One block of 31 KB (within
/// the block size podca decodes) and one of 64 KB (beyond it) expand to 108 MB and 240 MB.
/// podca's Unix-socket shim used to decode and re-encode them whole; now each is refused
/// (431 and RST_STREAM, or GOAWAY) without podca's memory growing, and the next client gets
/// its SVID.
#[tokio::test(flavor = "multi_thread")]
async fn an_hpack_bomb_on_the_dev_socket_is_refused_and_others_are_served() {
    let dev = DevProcess::start();
    let before = peak_memory(dev.pid());
    for references in [27_000, 60_000] {
        let block = bomb(references);
        let mut attacker = UnixStream::connect(&dev.socket).await.unwrap();
        // The server may close while the block is still being written.
        let _ = attacker.write_all(&request(&block)).await;
        let seen = answer(&mut attacker).await;
        assert!(
            seen.iter()
                .any(|s| s == "status 431" || s == "RST_STREAM" || s == "GOAWAY"),
            "a {} byte bomb: {seen:?}",
            block.len()
        );
        assert!(!seen.iter().any(|s| s == "DATA"), "{seen:?}");
    }
    let grown = peak_memory(dev.pid()).saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "podca dev's peak memory grew by {} MiB under the bombs",
        grown >> 20
    );

    let svid = spiffe::WorkloadApiClient::connect_to(&format!("unix://{}", dev.socket.display()))
        .await
        .unwrap()
        .fetch_x509_svid()
        .await
        .unwrap();
    assert!(!svid.cert_chain().is_empty());
    assert!(dev.stop().success());
}
