//! Accepting connections the same way on every socket the agent and istiod-lite serve (the status
//! port, DNS over TCP, the SDS, credential and XDS sockets), whatever the peer does:
//!
//! - An accept that fails for lack of resources (out of file descriptors: `EMFILE`, `ENFILE`;
//!   out of memory) backs off, 100 ms doubling to 1 s, and is logged at most once a second; the
//!   pending connections wait in the kernel's queue. Retrying at once would spin a core while
//!   the descriptors stay taken. An error that concerns one connection only (the peer left
//!   before the accept) is skipped at once.
//! - [`ConnCaps`]: a cap on open connections, overall and per peer IP address. A connection over
//!   either is closed as soon as it is accepted (its peer sees EOF at once, not a hang), so one
//!   peer cannot take every descriptor or every slot.
//! - [`raise_open_file_limit`]: the soft `RLIMIT_NOFILE` raised to the hard limit at start, as
//!   Go's runtime does for istiod and Istio's agent.
//! - [`idle`]: an HTTP/2 connection that opens no stream in time, or keeps none open, is closed.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub mod activity;
pub mod idle;

/// First pause after an accept failed for lack of resources.
pub const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest pause between two accepts while resources stay exhausted.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A listening socket: TCP (the peer's IP is known) or Unix (a local peer, no IP).
pub trait Listener: Send + Sync + 'static {
    type Conn: Send + 'static;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Conn, Option<IpAddr>)>>;
}

impl Listener for tokio::net::TcpListener {
    type Conn = tokio::net::TcpStream;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Conn, Option<IpAddr>)>> {
        tokio::net::TcpListener::poll_accept(self, cx).map_ok(|(s, a)| (s, Some(canonical(a.ip()))))
    }
}

impl Listener for tokio::net::UnixListener {
    type Conn = tokio::net::UnixStream;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Conn, Option<IpAddr>)>> {
        tokio::net::UnixListener::poll_accept(self, cx).map_ok(|(s, _)| (s, None))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is, so a dual-stack peer is counted once.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// True for errors that concern one connection only (the peer gave up before we accepted it):
/// accept again at once.
pub fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::EPROTO)
}

/// The pause after failed accepts (see the module docs); one per accept loop.
#[derive(Debug)]
pub struct AcceptBackoff {
    name: &'static str,
    delay: Duration,
    last_warning: Option<Instant>,
    suppressed: u64,
}

impl AcceptBackoff {
    pub fn new(name: &'static str) -> Self {
        AcceptBackoff {
            name,
            delay: BACKOFF_START,
            last_warning: None,
            suppressed: 0,
        }
    }

    /// The pause before the next accept after `e` (zero for a connection error); the next
    /// resource error waits twice as long, up to [`BACKOFF_MAX`].
    pub fn pause(&mut self, e: &io::Error) -> Duration {
        if is_connection_error(e) {
            tracing::debug!(listener = self.name, error = %e, "connection gone before accept");
            return Duration::ZERO;
        }
        let pause = self.delay;
        self.delay = (self.delay * 2).min(BACKOFF_MAX);
        let now = Instant::now();
        if self
            .last_warning
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.suppressed += 1;
        } else {
            tracing::warn!(listener = self.name, error = %e, suppressed = self.suppressed,
                retry_in = ?pause,
                "accept failed; pending connections stay queued (out of file descriptors? \
                 raise the open-file limit)");
            self.last_warning = Some(now);
            self.suppressed = 0;
        }
        pause
    }

    /// A connection was accepted: the next failure starts the backoff afresh.
    pub fn reset(&mut self) {
        self.delay = BACKOFF_START;
    }
}

/// Accepts the next connection; never fails (see the module docs).
pub async fn accept<L: Listener>(
    listener: &L,
    backoff: &mut AcceptBackoff,
) -> (L::Conn, Option<IpAddr>) {
    loop {
        match std::future::poll_fn(|cx| listener.poll_accept(cx)).await {
            Ok(accepted) => {
                backoff.reset();
                return accepted;
            }
            Err(e) => {
                let pause = backoff.pause(&e);
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}

/// Connection caps of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Open connections in all.
    pub total: usize,
    /// Open connections from one peer IP address (Unix socket peers count in `total` only).
    pub per_peer: usize,
}

/// Caps for a Unix socket served to the pod's own processes (SDS, credentials, XDS): Envoy
/// holds one or two connections there, a proxyless gRPC app one; 128 leaves room for restarts
/// (a closing connection still counts) and stops a runaway client from taking every descriptor.
pub const UNIX_SOCKET_CAPS: Caps = Caps {
    total: 128,
    per_peer: 128,
};

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{0} connections open, the server's cap")]
    Total(usize),
    #[error("{0} connections open from this peer, the cap per peer")]
    Peer(usize),
}

/// Counts open connections against [`Caps`]; clones share the count.
#[derive(Debug, Clone)]
pub struct ConnCaps {
    caps: Caps,
    open: Arc<Mutex<Open>>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// One admitted connection; dropping it frees its slot.
#[derive(Debug)]
pub struct Permit {
    open: Arc<Mutex<Open>>,
    peer: Option<IpAddr>,
}

impl ConnCaps {
    pub fn new(caps: Caps) -> Self {
        ConnCaps {
            caps,
            open: Arc::default(),
        }
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Takes a slot for a connection from `peer`, or says which cap it would pass.
    pub fn admit(&self, peer: Option<IpAddr>) -> Result<Permit, Refused> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.total >= self.caps.total {
            return Err(Refused::Total(open.total));
        }
        if let Some(ip) = peer {
            let n = open.by_peer.entry(ip).or_insert(0);
            if *n >= self.caps.per_peer {
                return Err(Refused::Peer(*n));
            }
            *n += 1;
        }
        open.total += 1;
        Ok(Permit {
            open: self.open.clone(),
            peer,
        })
    }

    /// Takes a slot for a connection from `peer` within the cap per peer but past the overall
    /// cap: for a server that has just told another connection to go and makes room for this
    /// one before that one has closed (the caller bounds how far past the cap this goes).
    pub fn admit_replacing(&self, peer: Option<IpAddr>) -> Result<Permit, Refused> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ip) = peer {
            let n = open.by_peer.entry(ip).or_insert(0);
            if *n >= self.caps.per_peer {
                return Err(Refused::Peer(*n));
            }
            *n += 1;
        }
        open.total += 1;
        Ok(Permit {
            open: self.open.clone(),
            peer,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(ip) = self.peer
            && let std::collections::hash_map::Entry::Occupied(mut e) = open.by_peer.entry(ip)
        {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// An admitted connection: holds its [`Permit`] for as long as it lives.
#[derive(Debug)]
pub struct Capped<S> {
    inner: S,
    _permit: Permit,
}

impl<S> Capped<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Capped<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Capped<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
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

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Capped<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Accepts the next connection within `caps`, closing at once every one over them.
pub async fn accept_capped<L: Listener>(
    listener: &L,
    backoff: &mut AcceptBackoff,
    caps: &ConnCaps,
) -> (Capped<L::Conn>, Option<IpAddr>) {
    loop {
        let (conn, peer) = accept(listener, backoff).await;
        match caps.admit(peer) {
            Ok(permit) => {
                return (
                    Capped {
                        inner: conn,
                        _permit: permit,
                    },
                    peer,
                );
            }
            Err(why) => {
                tracing::debug!(listener = backoff.name, peer = ?peer, reason = %why,
                    "connection refused: over the cap");
                drop(conn);
            }
        }
    }
}

/// The capped connections of `listener` as the stream tonic's `serve_with_incoming` takes
/// (it never yields an error: tonic would retry one at once).
pub fn incoming<L: Listener>(
    listener: L,
    caps: ConnCaps,
    name: &'static str,
) -> impl futures::Stream<Item = io::Result<Capped<L::Conn>>> + Send + 'static {
    let state = (listener, AcceptBackoff::new(name), caps);
    futures::stream::unfold(state, |(listener, mut backoff, caps)| async move {
        let (conn, _) = accept_capped(&listener, &mut backoff, &caps).await;
        Some((Ok(conn), (listener, backoff, caps)))
    })
}

/// Raises the soft open-file limit to the hard limit, as Go's runtime does: every connection
/// holds a descriptor, and the usual soft limit (1024, what a kubelet's pod gets) is soon
/// reached. Returns the (soft, hard) limits now in force.
#[allow(unsafe_code)] // getrlimit(2), setrlimit(2)
pub fn raise_open_file_limit() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

#[cfg(test)]
mod tests;
