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
//! retried after a pause (100 ms doubling to 1 s), leaving the pending connections queued in the
//! kernel: [`proto::listen`], which the agent's listeners share.

use std::io;
use std::net::SocketAddr;

use futures::Stream;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Backlog requested for every listener; Linux silently caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 65535;

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

pub use proto::listen::raise_open_file_limit;

/// Accepts connections from one listener.
pub struct Acceptor {
    listener: TcpListener,
    name: &'static str,
    backoff: proto::listen::AcceptBackoff,
}

impl Acceptor {
    pub fn new(listener: TcpListener, name: &'static str) -> Self {
        Acceptor {
            listener,
            name,
            backoff: proto::listen::AcceptBackoff::new(name),
        }
    }

    /// The next connection (TCP_NODELAY set). Never returns an error: see the module docs.
    pub async fn accept(&mut self) -> TcpStream {
        let (stream, _) = proto::listen::accept(&self.listener, &mut self.backoff).await;
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(listener = self.name, error = %e, "TCP_NODELAY");
        }
        stream
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
    fn the_kernel_cap_is_read() {
        if let Some(b) = effective_backlog() {
            assert!(b > 0 && b <= LISTEN_BACKLOG);
        }
    }
}
