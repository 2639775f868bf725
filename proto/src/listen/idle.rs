//! HTTP/2 connections that hold a slot without using it: a gRPC peer must open its first stream
//! within [`Limits::first_stream`] of connecting, and a connection left with no open stream for
//! [`Limits::idle`] is closed. A peer that connects and never sends the HTTP/2 preface, stops
//! after the handshake, or keeps answering the server's keepalive pings without a stream no
//! longer holds one of the socket's connection slots forever. A connection with an open stream is
//! never cut here: an SDS stream waits hours between two certificates (a dead peer is the
//! keepalive ping's business, where the server sends one).
//!
//! Two halves, meeting through the connection info tonic puts in every request's extensions:
//! - [`Watched`] wraps the accepted connection; once past its deadline its reads and writes fail
//!   (`TimedOut`), which ends hyper's connection (and frees the connection's [`super::Permit`]).
//!   On HTTP/2 in clear it first sends a GOAWAY (`NO_ERROR`, the last stream it took) and
//!   closes gracefully ([`goaway`]), as Go's and hyper's servers do on their idle timeouts, so a
//!   client racing its first request onto the connection sees a retryable refusal.
//!   Its [`Connected::ConnectInfo`] is the connection's [`Streams`] (the inner connection's info
//!   is not passed on: no server using this reads it).
//! - [`Counted`] wraps the gRPC service: each request is an open stream until its response body
//!   is dropped (the response ended, or the stream was reset). Under TLS (a `TlsStream` around a
//!   [`Watched`] connection) tonic's info is `TlsConnectInfo<Streams>`, which it reads as well.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use goaway::{Closing, Frames, goaway_frame};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::transport::server::{Connected, TlsConnectInfo};

/// How long an HTTP/2 connection may go without an open stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From the connection's accept to its first stream (the HTTP/2 handshake included).
    pub first_stream: Duration,
    /// From the end of its last stream to the next one.
    pub idle: Duration,
}

/// The pod's Unix sockets (SDS, credentials, XDS): Envoy and gRPC clients open their stream as
/// soon as they connect, so 10 s to the first one (the status port's header timeout); 60 s with
/// none open (its idle timeout) before the connection goes. Envoy reconnects when it needs one.
pub const UNIX_SOCKET_LIMITS: Limits = Limits {
    first_stream: Duration::from_secs(10),
    idle: Duration::from_secs(60),
};

#[derive(Debug)]
struct State {
    /// Streams open now.
    open: usize,
    /// The connection's accept, or the end of its last stream.
    since: Instant,
    /// No stream was opened yet.
    first: bool,
    /// The connection's task, woken when its last stream ends (its deadline comes back).
    waker: Option<Waker>,
}

/// The open streams of one connection, shared by its I/O ([`Watched`]) and its requests
/// ([`Counted`]).
#[derive(Debug, Clone)]
pub struct Streams(Arc<Mutex<State>>);

impl Streams {
    fn new() -> Self {
        Streams(Arc::new(Mutex::new(State {
            open: 0,
            since: Instant::now(),
            first: true,
            waker: None,
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A stream opened; it is closed when the guard drops.
    pub fn open(&self) -> StreamGuard {
        self.with(|s| {
            s.open += 1;
            s.first = false;
        });
        StreamGuard(self.clone())
    }

    /// Streams open now.
    pub fn open_now(&self) -> usize {
        self.with(|s| s.open)
    }

    /// When the connection goes if nothing changes (`None`: a stream is open); remembers
    /// `waker` to be woken when the last stream ends.
    fn deadline(&self, limits: &Limits, waker: &Waker) -> Option<(Instant, &'static str)> {
        self.with(|s| {
            if !s.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                s.waker = Some(waker.clone());
            }
            if s.open > 0 {
                None
            } else if s.first {
                Some((s.since + limits.first_stream, "no stream opened"))
            } else {
                Some((s.since + limits.idle, "idle with no open stream"))
            }
        })
    }
}

/// One open stream (see [`Streams::open`]).
#[derive(Debug)]
pub struct StreamGuard(Streams);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let waker = self.0.with(|s| {
            s.open = s.open.saturating_sub(1);
            s.since = Instant::now();
            if s.open == 0 { s.waker.take() } else { None }
        });
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A connection closed once it has gone too long without an open stream (see the module docs):
/// with a GOAWAY first ([`goaway`]) unless it carries TLS ([`Watched::encrypted`]).
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    streams: Streams,
    limits: Limits,
    timer: Pin<Box<Sleep>>,
    /// The peer's frames (for the last stream id) and ours (for where a GOAWAY may go); `None`
    /// when the bytes are not HTTP/2 frames (TLS records).
    frames: Option<Box<(Frames, Frames)>>,
    /// Past the deadline: how far the close is.
    closing: Option<Closing>,
}

impl<S> Watched<S> {
    /// Starts the connection's clock; HTTP/2 in clear (h2c, Unix sockets): closed with a
    /// GOAWAY.
    pub fn new(inner: S, limits: Limits) -> Self {
        let mut w = Watched::encrypted(inner, limits);
        w.frames = Some(Box::new((Frames::from_client(), Frames::from_server())));
        w
    }

    /// [`Watched::new`] for a connection whose HTTP/2 runs inside TLS above this wrapper: the
    /// frames are not visible here, so it is closed without a GOAWAY.
    pub fn encrypted(inner: S, limits: Limits) -> Self {
        let streams = Streams::new();
        let start = Instant::now() + limits.first_stream;
        Watched {
            inner,
            streams,
            limits,
            timer: Box::pin(tokio::time::sleep_until(start)),
            frames: None,
            closing: None,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// True while the connection is open; past its deadline starts the close.
    fn open(&mut self, cx: &mut Context<'_>) -> bool {
        if self.closing.is_some() {
            return false;
        }
        let Some((deadline, why)) = self.streams.deadline(&self.limits, cx.waker()) else {
            return true;
        };
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return true;
        }
        self.closing = Some(match &self.frames {
            Some(f) if f.1.at_boundary() => {
                tracing::debug!(
                    reason = why,
                    last_stream = f.0.last_headers,
                    "closing an HTTP/2 connection without streams: GOAWAY"
                );
                Closing::Goaway {
                    frame: goaway_frame(f.0.last_headers),
                    sent: 0,
                }
            }
            _ => {
                tracing::debug!(reason = why, "closing an HTTP/2 connection without streams");
                Closing::Closed
            }
        });
        false
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Watched<S> {
    /// Drives the close; Ready once closed.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.closing {
            Some(c) => c.poll(&mut self.inner, &mut self.timer, cx),
            None => Poll::Ready(()),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.open(cx) {
            // hyper waits here while the GOAWAY goes out and the peer's bytes are drained;
            // nothing more reaches it, so no stream past the GOAWAY's is taken.
            std::task::ready!(this.poll_close(cx));
            return Poll::Ready(Err(goaway::closed()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Some(f) = &mut this.frames {
            f.0.feed(&buf.filled()[before..]);
        }
        r
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Watched<S> {
    /// A write while closing: dropped (hyper's frames after the GOAWAY are not sent), failing
    /// once the close is done.
    fn write_while_closing(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<usize>> {
        match self.poll_close(cx) {
            Poll::Ready(()) => Poll::Ready(Err(goaway::closed())),
            Poll::Pending => Poll::Ready(Ok(len)),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.open(cx) {
            return this.write_while_closing(cx, buf.len());
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(f)) = (&r, &mut this.frames) {
            f.1.feed(&buf[..*n]);
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.open(cx) {
            let len = bufs.iter().map(|b| b.len()).sum();
            return this.write_while_closing(cx, len);
        }
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(f)) = (&r, &mut this.frames) {
            let mut left = *n;
            for b in bufs {
                let take = left.min(b.len());
                f.1.feed(&b[..take]);
                left -= take;
                if left == 0 {
                    break;
                }
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.open(cx) {
            return match this.poll_close(cx) {
                Poll::Ready(()) => Poll::Ready(Err(goaway::closed())),
                Poll::Pending => Poll::Ready(Ok(())),
            };
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S> Connected for Watched<S> {
    type ConnectInfo = Streams;

    fn connect_info(&self) -> Streams {
        self.streams.clone()
    }
}

/// A gRPC service whose requests count as open streams of their connection (see the module
/// docs); requests without a [`Watched`] connection pass uncounted.
#[derive(Debug, Clone)]
pub struct Counted<S>(S);

impl<S> Counted<S> {
    pub fn new(service: S) -> Self {
        Counted(service)
    }
}

impl<S: NamedService> NamedService for Counted<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> tonic::codegen::Service<http::Request<Body>> for Counted<S>
where
    S: tonic::codegen::Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let ext = request.extensions();
        let streams = ext.get::<Streams>().or_else(|| {
            ext.get::<TlsConnectInfo<Streams>>()
                .map(TlsConnectInfo::get_ref)
        });
        let guard = streams.map(Streams::open);
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(match guard {
                Some(guard) => response.map(|body| {
                    Body::new(GuardedBody {
                        inner: body,
                        _guard: guard,
                    })
                }),
                None => response,
            })
        })
    }
}

/// A response body holding its stream open until dropped.
struct GuardedBody {
    inner: Body,
    _guard: StreamGuard,
}

impl tonic::codegen::Body for GuardedBody {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pub mod goaway;
#[cfg(test)]
mod tests;
