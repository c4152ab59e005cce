//! One write per HTTP/2 answer on TLS connections: the HEADERS, DATA and trailers of a unary
//! answer leave as one TLS record in one `sendmsg`, not two.
//!
//! h2 keeps a DATA payload over its chain threshold (256 bytes with vectored I/O, 1 KiB without)
//! out of its own buffer, and before it buffers the next frame it flushes what it holds. A
//! certificate answer is 2–3 KiB of DATA, so each one went out as `writev(HEADERS + DATA)` and
//! then `writev(trailers)`: two TLS records, two trips through the kernel's TCP stack and two
//! wake-ups of the client for one answer (issue #12's benchmark, `strace` of `podca serve`). A
//! buffer that only sends at a flush ([`crate::coalesce`]) does not help: h2 flushes between
//! the two.
//!
//! [`Corked`] keeps what h2 writes and *defers the first flush* after new data: it answers that
//! flush at once and wakes the connection's task, so the data leaves at the next flush (h2
//! flushes again after the trailers, in the same pass) or, at the latest, when the task runs
//! again and polls the connection for reading, which it does on every pass. Nothing waits on a
//! timer: a deferred flush costs one extra pass of the connection's task. Shutdown sends what is
//! held first.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// What one connection holds at most before it writes: more than a usual unary answer (a P-256
/// certificate chain answer is 2–3 KiB). A write larger than this goes straight through, after
/// what is held.
pub const CORK_BYTES: usize = 8 * 1024;

/// A stream whose writes are held until the second flush, or the next read (module docs).
#[derive(Debug)]
pub struct Corked<S> {
    inner: S,
    /// Bytes written to us; `buf[sent..]` has not reached `inner` yet.
    buf: Vec<u8>,
    sent: usize,
    /// A flush was answered without flushing `inner`: the next flush or read owes it.
    owed: bool,
}

impl<S> Corked<S> {
    pub fn new(inner: S) -> Self {
        Corked {
            inner,
            buf: Vec::new(),
            sent: 0,
            owed: false,
        }
    }

    fn held(&self) -> usize {
        self.buf.len() - self.sent
    }
}

impl<S: AsyncWrite + Unpin> Corked<S> {
    /// Writes what is held to `inner` (without flushing it).
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            let n = std::task::ready!(
                Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.sent..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.buf.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Writes what is held and flushes `inner`: the flush that was owed.
    fn poll_send_and_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_send(cx))?;
        std::task::ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        self.owed = false;
        Poll::Ready(Ok(()))
    }
}

impl<S: Connected> Connected for Corked<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Corked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.owed || this.held() > 0 {
            // Pending: the peer is not taking data right now; `inner` wakes this task once it
            // can. Reading goes on meanwhile, so two peers that both write never wait on each
            // other.
            if let Poll::Ready(Err(e)) = this.poll_send_and_flush(cx) {
                return Poll::Ready(Err(e));
            }
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Corked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.held() + data.len() > CORK_BYTES {
            std::task::ready!(this.poll_send(cx))?;
            if data.len() > CORK_BYTES {
                this.owed = true;
                return Pin::new(&mut this.inner).poll_write(cx, data);
            }
        }
        if this.buf.capacity() == 0 {
            this.buf.reserve_exact(CORK_BYTES);
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if self.held() + total > CORK_BYTES {
            // Too much to hold together: one slice at a time, as `poll_write` takes them.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.poll_write(cx, first);
        }
        let this = &mut *self;
        if this.buf.capacity() == 0 {
            this.buf.reserve_exact(CORK_BYTES);
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.held() > 0 && !this.owed {
            // The first flush after new data: answered now, done at the next flush or when
            // the task, woken here, polls the connection again.
            this.owed = true;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        this.poll_send_and_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_send_and_flush(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A stream that records the writes and flushes that reach it; reads see nothing yet.
    #[derive(Default)]
    struct Recording {
        writes: Vec<Vec<u8>>,
        flushes: usize,
        /// Writes answer Pending while set (a peer that does not read).
        blocked: bool,
    }

    impl AsyncRead for Recording {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recording {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.blocked {
                return Poll::Pending;
            }
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

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn write(s: &mut Corked<Recording>, cx: &mut Context<'_>, data: &[u8]) -> usize {
        match Pin::new(s).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => n,
            other => panic!("{other:?}"),
        }
    }

    fn flush(s: &mut Corked<Recording>, cx: &mut Context<'_>) {
        assert!(matches!(Pin::new(s).poll_flush(cx), Poll::Ready(Ok(()))));
    }

    /// h2's pass for a unary answer: HEADERS + DATA, flush, trailers, flush.
    #[test]
    fn an_answer_leaves_in_one_write_at_the_second_flush() {
        let wakes = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut s = Corked::new(Recording::default());

        write(&mut s, &mut cx, b"HEADERS+DATA");
        flush(&mut s, &mut cx);
        assert!(s.inner.writes.is_empty(), "the first flush is deferred");
        assert_eq!(s.inner.flushes, 0);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "and wakes the task");

        write(&mut s, &mut cx, b"trailers");
        flush(&mut s, &mut cx);
        assert_eq!(s.inner.writes, vec![b"HEADERS+DATAtrailers".to_vec()]);
        assert_eq!(s.inner.flushes, 1);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);

        // Nothing new: a flush goes straight to the stream.
        flush(&mut s, &mut cx);
        assert_eq!(s.inner.writes.len(), 1);
        assert_eq!(s.inner.flushes, 2);
    }

    /// A lone deferred flush is done when the woken task polls for reading.
    #[test]
    fn the_next_read_sends_what_a_deferred_flush_left() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut s = Corked::new(Recording::default());
        write(&mut s, &mut cx, b"PING ack");
        flush(&mut s, &mut cx);
        assert!(s.inner.writes.is_empty());

        let mut space = [0u8; 16];
        let mut read = ReadBuf::new(&mut space);
        assert!(Pin::new(&mut s).poll_read(&mut cx, &mut read).is_pending());
        assert_eq!(s.inner.writes, vec![b"PING ack".to_vec()]);
        assert_eq!(s.inner.flushes, 1);
        assert!(!s.owed);
    }

    /// A peer that does not read holds the writes back, but not the reads; once it reads, the
    /// held bytes go in order.
    #[test]
    fn a_blocked_peer_does_not_stop_reading_and_nothing_is_lost() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut s = Corked::new(Recording {
            blocked: true,
            ..Recording::default()
        });
        write(&mut s, &mut cx, b"one");
        flush(&mut s, &mut cx);
        let mut space = [0u8; 16];
        let mut read = ReadBuf::new(&mut space);
        assert!(Pin::new(&mut s).poll_read(&mut cx, &mut read).is_pending());
        assert!(s.inner.writes.is_empty());

        // More than the cork holds must wait for the peer.
        let big = vec![7u8; CORK_BYTES];
        assert!(Pin::new(&mut s).poll_write(&mut cx, &big).is_pending());

        s.inner.blocked = false;
        write(&mut s, &mut cx, &big);
        flush(&mut s, &mut cx);
        assert_eq!(s.inner.writes[0], b"one");
        let all: Vec<u8> = s.inner.writes.concat();
        assert_eq!(all.len(), 3 + CORK_BYTES);
    }

    #[test]
    fn a_write_larger_than_the_cork_goes_through_after_what_is_held() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut s = Corked::new(Recording::default());
        write(&mut s, &mut cx, b"frame header");
        let big = vec![1u8; CORK_BYTES + 1];
        assert_eq!(write(&mut s, &mut cx, &big), big.len());
        assert_eq!(s.inner.writes, vec![b"frame header".to_vec(), big]);
        // The big write was not flushed yet: the next flush does it.
        flush(&mut s, &mut cx);
        assert_eq!(s.inner.flushes, 1);
    }

    #[test]
    fn vectored_writes_are_held_whole() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut s = Corked::new(Recording::default());
        let parts = [io::IoSlice::new(b"head"), io::IoSlice::new(b"payload")];
        assert!(matches!(
            Pin::new(&mut s).poll_write_vectored(&mut cx, &parts),
            Poll::Ready(Ok(11))
        ));
        flush(&mut s, &mut cx);
        flush(&mut s, &mut cx);
        assert_eq!(s.inner.writes, vec![b"headpayload".to_vec()]);
        assert!(s.is_write_vectored());
    }

    /// End to end over a pipe: what was written arrives, shutdown included.
    #[tokio::test]
    async fn reads_writes_and_shutdown_reach_the_peer() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let mut s = Corked::new(server);
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        s.write_all(b"pong").await.unwrap();
        s.flush().await.unwrap();
        s.write_all(b"!").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"pong!");
    }
}
