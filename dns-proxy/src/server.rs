//! The DNS proxy's listeners: UDP and TCP bound on every configured address ([`DnsProxy::bind`])
//! and served until shutdown ([`DnsProxy::run`]); each query goes through the answer path
//! ([`crate::answer`]), the loops themselves live in [`udp`] and [`tcp`].

mod tcp;
mod udp;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::answer::AnswerPath;
use crate::table::TableHandle;
use crate::{Config, Error, Metrics};

/// The DNS proxy: bound listeners plus the shared request path. Build with [`DnsProxy::bind`],
/// hand [`DnsProxy::table`] to the xDS proxy, then [`DnsProxy::run`] until shutdown.
pub struct DnsProxy {
    udp: Vec<Arc<UdpSocket>>,
    tcp: Vec<TcpListener>,
    addrs: Vec<SocketAddr>,
    path: Arc<AnswerPath>,
    tcp_limits: TcpLimits,
    /// Stops the forwarder's background readers when `run` ends.
    stop: CancellationToken,
}

impl std::fmt::Debug for DnsProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsProxy")
            .field("addrs", &self.addrs)
            .finish()
    }
}

/// The bounds on TCP clients.
#[derive(Clone)]
struct TcpLimits {
    /// Connections open at once, and which one makes room for a new client.
    slots: Arc<tcp::Slots>,
    /// A connection idle this long is closed.
    idle: Duration,
    /// A connection whose client has not read an answer within this is closed.
    write: Duration,
}

impl DnsProxy {
    /// Binds UDP and TCP on every configured address (the same port on both; port 0 picks one
    /// free port used for every address).
    pub async fn bind(config: Config, metrics: Arc<Metrics>) -> Result<DnsProxy, Error> {
        let mut udp = Vec::new();
        let mut tcp = Vec::new();
        let mut addrs = Vec::new();
        let mut chosen_port: Option<u16> = None;
        for &addr in &config.listen_addrs {
            let mut attempts = 0;
            loop {
                let mut want = addr;
                if want.port() == 0
                    && let Some(p) = chosen_port
                {
                    want.set_port(p);
                }
                let bind_err = |protocol, source| Error::Bind {
                    protocol,
                    addr: want,
                    source: Arc::new(source),
                };
                let u = UdpSocket::bind(want)
                    .await
                    .map_err(|e| bind_err("UDP", e))?;
                let actual = u.local_addr().map_err(|e| bind_err("UDP", e))?;
                match TcpListener::bind(actual).await {
                    Ok(t) => {
                        if addr.port() == 0 {
                            chosen_port = Some(actual.port());
                        }
                        udp.push(Arc::new(u));
                        tcp.push(t);
                        addrs.push(actual);
                        break;
                    }
                    // A port picked for UDP may be taken for TCP: pick again.
                    Err(_) if want.port() != addr.port() || (addr.port() == 0 && attempts < 8) => {
                        attempts += 1;
                        if chosen_port.is_some() && attempts >= 8 {
                            return Err(bind_err(
                                "TCP",
                                std::io::Error::from(std::io::ErrorKind::AddrInUse),
                            ));
                        }
                    }
                    Err(e) => return Err(bind_err("TCP", e)),
                }
            }
        }
        tracing::info!(
            addrs = ?addrs,
            upstreams = ?config.upstreams,
            search = ?config.search_domains,
            timeout = ?config.forward_timeout,
            parallel = config.forward_parallel,
            cache = config.cache_enabled,
            "DNS proxy listening"
        );
        let stop = CancellationToken::new();
        let path = Arc::new(AnswerPath::new(&config, metrics, stop.clone()));
        let limits = TcpLimits {
            slots: Arc::new(tcp::Slots::new(config.max_tcp_connections)),
            idle: config.tcp_idle_timeout,
            write: config.tcp_write_timeout,
        };
        Ok(DnsProxy {
            udp,
            tcp,
            addrs,
            path,
            tcp_limits: limits,
            stop,
        })
    }

    /// The bound addresses (UDP and TCP share each).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.addrs.clone()
    }

    /// The name table handle (clone freely).
    pub fn table(&self) -> TableHandle {
        self.path.table.clone()
    }

    /// Serves until `shutdown` is cancelled; in-flight forwards are abandoned on shutdown. A
    /// listener that fails stops the proxy's other listeners (never the caller's token: what
    /// else stops is the caller's decision) and is the error returned.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let shutdown = shutdown.child_token();
        let tracker = TaskTracker::new();
        let mut loops = tokio::task::JoinSet::new();
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 4);
        for (sock, addr) in self.udp.iter().zip(&self.addrs) {
            for _ in 0..workers {
                loops.spawn(udp::serve(
                    sock.clone(),
                    *addr,
                    self.path.clone(),
                    shutdown.clone(),
                    tracker.clone(),
                ));
            }
        }
        for (listener, addr) in self.tcp.into_iter().zip(&self.addrs) {
            loops.spawn(tcp::serve(
                listener,
                *addr,
                self.path.clone(),
                self.tcp_limits.clone(),
                shutdown.clone(),
                tracker.clone(),
            ));
        }
        let mut result = Ok(());
        while let Some(joined) = loops.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "DNS listener failed");
                    shutdown.cancel();
                    result = Err(e);
                }
                Err(e) => tracing::error!(error = %e, "DNS listener task panicked"),
            }
        }
        tracker.close();
        tracker.wait().await;
        self.stop.cancel();
        result
    }
}

#[cfg(test)]
mod tests;
