//! Coalesced writes to Envoy.
//!
//! The HTTP/2 server writes each DATA frame (16 KiB, Envoy's `SETTINGS_MAX_FRAME_SIZE`) and
//! flushes after each one, so a 1.8 MB push would cost Envoy over a hundred writes and wakeups.
//! [`Coalesce`] gathers what the server writes, and defers a flush once: it answers at once
//! and has the connection polled again, after the proxy's other ready tasks, which hand it
//! more frames. The bytes go out on the next flush with nothing new written since the
//! deferred one (the server flushes on every poll), when [`CAPACITY`] is reached, or on
//! shutdown. Nothing waits longer than one turn of the runtime.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes gathered into one write.
pub const CAPACITY: usize = 256 << 10;

/// A gathering buffer this large or smaller is kept for the next burst; a larger one is freed
/// once written.
const KEEP: usize = 16 << 10;

/// A connection whose writes are gathered (see the module docs).
pub struct Coalesce<S> {
    inner: S,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    written: usize,
    /// Bytes were gathered since the last deferred flush.
    fresh: bool,
}

impl<S> Coalesce<S> {
    pub fn new(inner: S) -> Coalesce<S> {
        Coalesce {
            inner,
            buf: Vec::new(),
            written: 0,
            fresh: false,
        }
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Writes out everything gathered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.written = 0;
        self.fresh = false;
        if self.buf.capacity() > KEEP {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Poll::Ready(Ok(()))
    }

    /// Room for `len` more bytes: writes out what is gathered first when they would not fit.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<()>> {
        if self.buf.len() + len > CAPACITY {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len = bufs.iter().map(|b| b.len()).sum::<usize>();
        ready!(this.poll_room(cx, len))?;
        if len >= CAPACITY {
            // Nothing gathered (`poll_room` wrote it out): this one goes as it is.
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        if this.buf.len() + len > KEEP && this.buf.capacity() < CAPACITY {
            // Past what a small buffer holds: room for a whole burst at once, so that it is not
            // copied again as it grows.
            this.buf.reserve_exact(CAPACITY.max(len) - this.buf.len());
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        this.fresh |= len > 0;
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.written == this.buf.len() {
            return Pin::new(&mut this.inner).poll_flush(cx);
        }
        if this.fresh {
            this.fresh = false;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Coalesce<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A writer that records each write; it takes at most `max` bytes a call and, with
    /// `stutter`, is not ready every other call.
    #[derive(Default)]
    struct Sink {
        writes: Vec<Vec<u8>>,
        max: usize,
        stutter: bool,
        not_ready_next: bool,
        flushes: usize,
        shut: bool,
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.not_ready_next {
                self.not_ready_next = false;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.not_ready_next = self.stutter;
            let n = buf
                .len()
                .min(if self.max == 0 { usize::MAX } else { self.max });
            self.writes.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct Harness {
        io: Coalesce<Sink>,
        wakes: Arc<Wakes>,
    }

    impl Harness {
        fn new(sink: Sink) -> Harness {
            Harness {
                io: Coalesce::new(sink),
                wakes: Arc::default(),
            }
        }

        fn poll<T>(
            &mut self,
            f: impl FnOnce(Pin<&mut Coalesce<Sink>>, &mut Context<'_>) -> Poll<T>,
        ) -> Poll<T> {
            let waker = self.wakes.clone().into();
            f(Pin::new(&mut self.io), &mut Context::from_waker(&waker))
        }

        fn write(&mut self, bytes: &[u8]) -> usize {
            match self.poll(|io, cx| io.poll_write(cx, bytes)) {
                Poll::Ready(Ok(n)) => n,
                other => panic!("write: {other:?}"),
            }
        }

        /// Polls `f` until it is ready (the sink is ready every other call at worst).
        fn ready(
            &mut self,
            mut f: impl FnMut(Pin<&mut Coalesce<Sink>>, &mut Context<'_>) -> Poll<io::Result<()>>,
        ) {
            for _ in 0..10_000 {
                if let Poll::Ready(r) = self.poll(&mut f) {
                    return r.unwrap();
                }
            }
            panic!("never ready");
        }

        fn flush(&mut self) {
            self.ready(|io, cx| io.poll_flush(cx));
        }

        fn wakes(&self) -> usize {
            self.wakes.0.load(Ordering::SeqCst)
        }

        fn sink(&self) -> &Sink {
            &self.io.inner
        }

        fn write_vectored(&mut self, bufs: &[&[u8]]) -> usize {
            let slices: Vec<io::IoSlice<'_>> = bufs.iter().map(|b| io::IoSlice::new(b)).collect();
            match self.poll(|io, cx| io.poll_write_vectored(cx, &slices)) {
                Poll::Ready(Ok(n)) => n,
                other => panic!("write_vectored: {other:?}"),
            }
        }
    }

    #[test]
    fn writes_between_flushes_go_out_as_one() {
        let mut h = Harness::new(Sink::default());
        assert_eq!(h.write(b"frame-1 "), 8);
        assert_eq!(h.write_vectored(&[b"head ".as_slice(), b"frame-2"]), 12);
        // The first flush is deferred: nothing written, the connection polled again.
        h.flush();
        assert!(h.sink().writes.is_empty());
        assert_eq!(h.wakes(), 1);
        // More frames on the next poll: deferred again.
        h.write(b" frame-3");
        h.flush();
        assert!(h.sink().writes.is_empty());
        assert_eq!(h.wakes(), 2);
        // Nothing new since: one write with everything, in order, and the inner flush.
        h.flush();
        assert_eq!(
            h.sink().writes,
            vec![b"frame-1 head frame-2 frame-3".to_vec()]
        );
        assert_eq!(h.sink().flushes, 1);
        assert_eq!(h.wakes(), 2);
        // With nothing gathered a flush goes straight through.
        h.flush();
        assert_eq!((h.sink().writes.len(), h.sink().flushes), (1, 2));
    }

    #[test]
    fn capacity_bounds_what_is_gathered() {
        let mut h = Harness::new(Sink::default());
        let a = vec![1u8; CAPACITY - 10];
        h.write(&a);
        assert!(h.sink().writes.is_empty());
        // 11 more would not fit: what is gathered goes out first.
        h.write(&[2u8; 11]);
        assert_eq!(h.sink().writes, vec![a]);
        // A write of CAPACITY or more goes as it is once the gathered bytes are out.
        let big = vec![3u8; CAPACITY];
        assert_eq!(h.write(&big), CAPACITY);
        assert_eq!(h.sink().writes[1..], [vec![2u8; 11], big]);
    }

    #[test]
    fn partial_and_not_ready_writes_lose_nothing() {
        let mut h = Harness::new(Sink {
            max: 1000,
            stutter: true,
            ..Sink::default()
        });
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for chunk in data.chunks(16_393) {
            h.write(chunk);
        }
        h.flush();
        h.flush();
        assert_eq!(h.sink().writes.concat(), data);
        assert!(h.sink().writes.iter().all(|w| w.len() <= 1000));
        // A large burst's buffer is given back once written.
        assert_eq!(h.io.buf.capacity(), 0);
    }

    #[test]
    fn shutdown_writes_out_what_is_gathered() {
        let mut h = Harness::new(Sink::default());
        h.write(b"goaway");
        h.ready(|io, cx| io.poll_shutdown(cx));
        assert_eq!(h.sink().writes, vec![b"goaway".to_vec()]);
        assert!(h.sink().shut);
    }

    #[tokio::test]
    async fn reads_pass_through() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut peer, io) = tokio::io::duplex(64);
        let mut io = Coalesce::new(io);
        peer.write_all(b"preface").await.unwrap();
        let mut got = [0u8; 7];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"preface");
        // And writes arrive after flushes (the second one writes).
        io.write_all(b"settings").await.unwrap();
        io.flush().await.unwrap();
        io.flush().await.unwrap();
        let mut got = [0u8; 8];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"settings");
    }
}
