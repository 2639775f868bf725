//! Listening sockets that survive a fleet reconnecting at once.
//!
//! `tokio::net::TcpListener::bind` listens with a backlog of 1024. When a whole fleet reconnects
//! (an istiod restart, a network blip) thousands of SYNs arrive within milliseconds; past 1024
//! pending connections Linux answers with SYN cookies and drops handshakes whose accept queue is
//! full. A cookie connection whose first segments were dropped is later answered with a reset
//! (the client already sent HTTP/2 data the listener cannot match to a cookie), so proxies saw
//! `ConnectionReset` instead of their first response. We listen with the largest backlog the
//! kernel allows (it caps the request at `net.core.somaxconn`, 4096 by default since Linux 5.4;
//! Go's net package, and so istiod, asks for somaxconn too).
//!
//! The accept loop never spins and never stops: connection-level errors are skipped, and
//! resource errors (out of file descriptors or memory) are logged at most once a second and
//! retried after a short pause, leaving the pending connections queued in the kernel.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Backlog requested for every listener; Linux silently caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 65535;
/// Pause after an accept error that is about the server's resources, not the connection.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Binds `addr` (SO_REUSEADDR, like tokio's `bind`) and listens with [`LISTEN_BACKLOG`].
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The backlog the kernel actually grants: `min(LISTEN_BACKLOG, net.core.somaxconn)`.
pub fn effective_backlog() -> Option<u32> {
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(somaxconn.min(LISTEN_BACKLOG))
}

/// Raises the soft open-file limit to the hard limit, as Go's runtime does for istiod: every
/// connected proxy holds a socket, and the usual soft limit (1024) would stop a fleet of a few
/// thousand at the accept loop. Returns the (soft, hard) limits now in force.
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
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// True for errors that concern one connection only (the peer gave up before we accepted it):
/// accept again at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(EPROTO)
}

/// Linux `EPROTO`: a protocol error on the pending connection.
const EPROTO: i32 = 71;

/// Accepts connections from one listener.
pub struct Acceptor {
    listener: TcpListener,
    name: &'static str,
    last_warning: Option<Instant>,
    suppressed: u64,
}

impl Acceptor {
    pub fn new(listener: TcpListener, name: &'static str) -> Self {
        Acceptor {
            listener,
            name,
            last_warning: None,
            suppressed: 0,
        }
    }

    /// The next connection (TCP_NODELAY set). Never returns an error: see the module docs.
    pub async fn accept(&mut self) -> TcpStream {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(listener = self.name, error = %e, "TCP_NODELAY");
                    }
                    return stream;
                }
                Err(e) if is_connection_error(&e) => {
                    tracing::debug!(listener = self.name, error = %e, "connection gone before accept");
                }
                Err(e) => {
                    self.warn(&e);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }

    fn warn(&mut self, e: &io::Error) {
        let now = Instant::now();
        if self
            .last_warning
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(listener = self.name, error = %e, suppressed = self.suppressed,
            "accept failed; pending connections stay queued, retrying (raise the open-file limit?)");
        self.last_warning = Some(now);
        self.suppressed = 0;
    }

    /// The connections as the stream tonic's `serve_with_incoming` takes.
    pub fn into_stream(self) -> impl Stream<Item = io::Result<TcpStream>> + Send + 'static {
        futures::stream::unfold(self, |mut acceptor| async move {
            let stream = acceptor.accept().await;
            Some((Ok(stream), acceptor))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn binds_with_a_backlog_and_accepts() {
        let listener = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut incoming = Box::pin(Acceptor::new(listener, "test").into_stream());
        let client = TcpStream::connect(addr).await.expect("connect");
        let server = incoming.next().await.expect("stream").expect("accepted");
        assert_eq!(
            server.peer_addr().expect("peer"),
            client.local_addr().expect("local")
        );
        assert!(server.nodelay().expect("nodelay"));
    }

    #[test]
    fn connection_errors_are_told_apart_from_resource_errors() {
        assert!(is_connection_error(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
        assert!(is_connection_error(&io::Error::from_raw_os_error(EPROTO)));
        // EMFILE: the server is out of file descriptors.
        assert!(!is_connection_error(&io::Error::from_raw_os_error(24)));
    }

    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        let (soft, hard) = raise_open_file_limit().expect("rlimit");
        assert_eq!(soft, hard);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct passed to it.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!((lim.rlim_cur, lim.rlim_max), (soft, hard), "in force");
    }

    #[test]
    fn the_kernel_cap_is_read() {
        if let Some(b) = effective_backlog() {
            assert!(b > 0 && b <= LISTEN_BACKLOG);
        }
    }
}
