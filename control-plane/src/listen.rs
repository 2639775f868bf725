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
//!
//! Every connection counts against the caps of its port ([`GRPC_CAPS`] for the two gRPC ports
//! together, [`MONITORING_CAPS`]): overall and per peer IP address, one over either closed as
//! soon as it is accepted. So one peer (or a few) opening idle connections cannot take every
//! descriptor and lock the fleet out; the secure port's TLS handshake must also finish within
//! 10 s (the server's TLS handshake timeout), and a gRPC connection must open a stream
//! in time ([`GRPC_STREAM_LIMITS`]).

use std::io;
use std::net::SocketAddr;

use futures::Stream;
use proto::listen::{Capped, Caps, ConnCaps};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Backlog requested for every listener; Linux silently caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 65535;

/// Binds `addr` (SO_REUSEADDR, like tokio's `bind`) and listens with `LISTEN_BACKLOG` (65535).
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

/// The gRPC ports (plaintext and TLS together): 20,000 connections in all (a large mesh's
/// proxies, each holding one; fewer when the open-file limit is lower, see
/// `within_open_files`), 1,024 from one IP address (a node's pods each have their own
/// address; a remote cluster's proxies reaching istiod through one east-west gateway share its
/// address: raise `--max-connections-per-ip` there).
pub const GRPC_CAPS: Caps = Caps {
    total: 20_000,
    per_peer: 1_024,
};

/// How long a gRPC connection may go without a stream: its first within 10 s of the accept
/// (the TLS handshake included), and 5 minutes with none open (the agent's CA client keeps
/// its connection between two certificates, hours apart: it reconnects for the next; a
/// proxy's ADS stream stays open). See [`proto::listen::idle`].
pub const GRPC_STREAM_LIMITS: proto::listen::idle::Limits = proto::listen::idle::Limits {
    first_stream: std::time::Duration::from_secs(10),
    idle: std::time::Duration::from_secs(300),
};

/// The monitoring port: Prometheus and an operator's `curl`.
pub const MONITORING_CAPS: Caps = Caps {
    total: 256,
    per_peer: 64,
};

/// The monitoring port's connections (HTTP/1.1 from Prometheus and operators): a request's
/// headers within 10 s (they send them at once; istiod's monitoring server allows 30 s for the
/// whole request, `ReadTimeout`), 90 s idle between two requests (istiod's `IdleTimeout`,
/// Go's keep-alive default). See [`proto::listen::activity`].
pub const MONITORING_TIMEOUTS: proto::listen::activity::Timeouts =
    proto::listen::activity::Timeouts {
        header: std::time::Duration::from_secs(10),
        idle: std::time::Duration::from_secs(90),
    };

/// Descriptors kept for everything but the gRPC connections (the CA and config files, the
/// watcher, the monitoring port's 256).
pub const RESERVED_FDS: u64 = 512;

/// `caps` with its total lowered so the connections fit in the open-file limit `soft` beside
/// [`RESERVED_FDS`] (at least half the limit): past it, accepts fail with EMFILE and every
/// new proxy waits in the kernel's queue instead of being refused at once.
pub fn within_open_files(caps: Caps, soft: u64) -> Caps {
    let room = soft.saturating_sub(RESERVED_FDS).max(soft / 2);
    let total = usize::try_from(room).unwrap_or(usize::MAX).min(caps.total);
    Caps {
        total,
        per_peer: caps.per_peer.min(total),
    }
}

/// Accepts connections from one listener, within its caps.
pub struct Acceptor {
    listener: TcpListener,
    name: &'static str,
    backoff: proto::listen::AcceptBackoff,
    caps: ConnCaps,
}

impl Acceptor {
    pub fn new(listener: TcpListener, name: &'static str, caps: ConnCaps) -> Self {
        Acceptor {
            listener,
            name,
            backoff: proto::listen::AcceptBackoff::new(name),
            caps,
        }
    }

    /// The next connection within the caps (TCP_NODELAY set); those over them are closed on the
    /// way. Never returns an error: see the module docs.
    pub async fn accept(&mut self) -> Capped<TcpStream> {
        let (stream, _) =
            proto::listen::accept_capped(&self.listener, &mut self.backoff, &self.caps).await;
        if let Err(e) = stream.get_ref().set_nodelay(true) {
            tracing::debug!(listener = self.name, error = %e, "TCP_NODELAY");
        }
        stream
    }

    /// The connections as the stream tonic's `serve_with_incoming` takes.
    pub fn into_stream(self) -> impl Stream<Item = io::Result<Capped<TcpStream>>> + Send + 'static {
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
        let caps = ConnCaps::new(GRPC_CAPS);
        let mut incoming = Box::pin(Acceptor::new(listener, "test", caps).into_stream());
        let client = TcpStream::connect(addr).await.expect("connect");
        let server = incoming.next().await.expect("stream").expect("accepted");
        assert_eq!(
            server.get_ref().peer_addr().expect("peer"),
            client.local_addr().expect("local")
        );
        assert!(server.get_ref().nodelay().expect("nodelay"));
    }

    #[test]
    fn the_open_file_limit_lowers_the_total() {
        let caps = GRPC_CAPS;
        assert_eq!(
            within_open_files(caps, 1 << 20),
            caps,
            "a container's usual hard limit"
        );
        assert_eq!(within_open_files(caps, 8192).total, 8192 - 512);
        let low = within_open_files(caps, 1024);
        assert_eq!((low.total, low.per_peer), (512, 512));
        assert_eq!(within_open_files(caps, 100).total, 50);
    }

    #[test]
    fn the_kernel_cap_is_read() {
        if let Some(b) = effective_backlog() {
            assert!(b > 0 && b <= LISTEN_BACKLOG);
        }
    }
}
