//! One write per HTTP/2 flush on the Unix socket, so a unary answer (HEADERS, DATA, trailers)
//! reaches the client in one `sendto` rather than two.
//!
//! h2 keeps a DATA payload larger than its chain threshold out of its write buffer and, before
//! it buffers the next frame, flushes what it holds. With vectored I/O (what a `UnixStream`
//! reports) the threshold is 256 bytes, so every JWT-SVID answer (about 400 bytes of DATA) went
//! out as `writev(HEADERS + DATA)` and then `writev(trailers)`: two system calls and a second
//! pass of h2's connection task for each token (issue #17's benchmark, one `strace` of `podca
//! dev`). A stream that reports no vectored I/O gets h2's 1 KiB threshold, and payloads up to
//! that are copied into h2's buffer with the frames around them.
//!
//! Reporting no vectored I/O alone would make a larger DATA frame (an X.509-SVID, a certificate
//! chain) leave as two `write`s, header then payload. The buffer here takes both and sends them
//! in one when h2 flushes, which it does after every batch of frames; a write larger than the
//! buffer goes straight through once what is buffered has gone.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};
use tonic::transport::server::Connected;

/// The write buffer of each connection: larger than any usual unary answer (a P-256 chain is
/// 2–3 KiB), and small next to h2's own buffers.
pub const COALESCE_BYTES: usize = 8 * 1024;

/// A stream whose writes wait in a buffer until the next flush.
#[derive(Debug)]
pub struct Coalesced<S> {
    inner: BufWriter<S>,
}

impl<S: AsyncWrite> Coalesced<S> {
    pub fn new(stream: S) -> Self {
        Coalesced {
            inner: BufWriter::with_capacity(COALESCE_BYTES, stream),
        }
    }
}

impl<S: Connected + AsyncWrite> Connected for Coalesced<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.get_ref().connect_info()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Coalesced<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesced<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    /// No: this is what raises h2's chain threshold (see the module documentation). Writes of
    /// several slices still work, one slice at a time, into the buffer.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A writer that counts the writes that reach it.
    #[derive(Default)]
    struct Counting {
        writes: Vec<Vec<u8>>,
        flushes: usize,
    }

    impl AsyncWrite for Counting {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn writes_leave_together_at_the_flush() {
        let mut s = Coalesced::new(Counting::default());
        s.write_all(b"headers").await.unwrap();
        s.write_all(&[7u8; 2000]).await.unwrap();
        assert!(
            s.inner.get_ref().writes.is_empty(),
            "nothing before the flush"
        );
        s.flush().await.unwrap();
        let inner = s.inner.get_ref();
        assert_eq!(inner.writes.len(), 1);
        assert_eq!(inner.writes[0].len(), 2007);
        assert_eq!(&inner.writes[0][..7], b"headers");
        assert_eq!(inner.flushes, 1);
        assert!(!s.is_write_vectored());
    }

    #[tokio::test]
    async fn a_write_larger_than_the_buffer_goes_through_after_what_is_buffered() {
        let mut s = Coalesced::new(Counting::default());
        s.write_all(b"frame header").await.unwrap();
        let big = vec![1u8; COALESCE_BYTES + 1];
        s.write_all(&big).await.unwrap();
        let inner = s.inner.get_ref();
        assert_eq!(inner.writes.len(), 2);
        assert_eq!(inner.writes[0], b"frame header");
        assert_eq!(inner.writes[1], big);
    }

    #[tokio::test]
    async fn reads_and_shutdown_pass_through() {
        let (client, server) = tokio::io::duplex(64);
        let mut s = Coalesced::new(server);
        let mut client = client;
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        s.write_all(b"pong").await.unwrap();
        // Shutting down flushes what is buffered first.
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"pong");
    }
}
