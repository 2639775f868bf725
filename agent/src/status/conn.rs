//! One status-port connection, bounded whatever the peer does.
//!
//! The status port is excluded from capture: anything on the pod network reaches it without
//! mTLS or policy. So (Istio's Go server has none of these):
//! - connection caps ([`Limits::remote`]): overall and per peer IP address for remote peers
//!   (127.0.0.6, Envoy's inbound passthrough source, counts as remote); local peers (the
//!   app, Envoy forwarding its 15021 readiness checks) have their own overall cap, so remote
//!   peers cannot lock them out;
//! - a request's headers must arrive within [`Limits::header_timeout`] (from the connection's
//!   start, or from its previous response once a byte of the next request has arrived);
//! - a keep-alive connection idle for [`Limits::idle_timeout`] between requests is closed; a
//!   response the peer does not read counts as idle.
//!
//! The watchdog checks at least every half header timeout, so a connection goes within 1.5×
//! its timeout. The kubelet and Prometheus speak HTTP/1.1; an HTTP/2 client's control frames
//! between requests (WINDOW_UPDATE, PING) count as a request begun, so its connection goes
//! after the header timeout rather than the idle one.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use proto::listen::{Caps, ConnCaps};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Envoy's inbound passthrough source address: a remote peer when 15020 is captured.
pub const INBOUND_PASSTHROUGH: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6));

/// The status server's bounds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections from remote peers: 1024 in all, 64 per peer IP (the kubelet probes a
    /// pod's containers from one node address, a few connections at a time; Prometheus
    /// scrapes over one).
    pub remote: Caps,
    /// Connections from the pod itself (loopback but 127.0.0.6): 1024.
    pub local_total: usize,
    /// 10 s: the kubelet and Prometheus send a request at once.
    pub header_timeout: Duration,
    /// 60 s between two requests on a keep-alive connection.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            remote: Caps {
                total: 1024,
                per_peer: 64,
            },
            local_total: 1024,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// True for a peer inside the pod: loopback, except Envoy's inbound passthrough source.
pub fn is_local(ip: IpAddr) -> bool {
    let ip = proto::listen::canonical(ip);
    ip.is_loopback() && ip != INBOUND_PASSTHROUGH
}

/// The counts every listener of one status server shares.
#[derive(Debug, Clone)]
pub struct Counts {
    remote: ConnCaps,
    local: ConnCaps,
}

impl Counts {
    pub fn new(limits: &Limits) -> Self {
        Counts {
            remote: ConnCaps::new(limits.remote),
            local: ConnCaps::new(Caps {
                total: limits.local_total,
                per_peer: limits.local_total,
            }),
        }
    }

    /// A slot for a connection from `ip`, or why there is none.
    pub fn admit(&self, ip: IpAddr) -> Result<proto::listen::Permit, proto::listen::Refused> {
        let ip = proto::listen::canonical(ip);
        if is_local(ip) {
            self.local.admit(None)
        } else {
            self.remote.admit(Some(ip))
        }
    }
}

#[derive(Debug)]
struct State {
    /// The connection's start or its last response.
    since: Instant,
    /// A byte arrived since `since`.
    read: bool,
    /// No request was complete yet.
    first: bool,
    /// Requests being handled.
    in_flight: usize,
}

/// What a connection did last, shared by its I/O, its requests and its watchdog.
#[derive(Debug, Clone)]
pub struct Activity(Arc<Mutex<State>>);

impl Activity {
    pub fn new() -> Self {
        Activity(Arc::new(Mutex::new(State {
            since: Instant::now(),
            read: false,
            first: true,
            in_flight: 0,
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A request's headers are in; the returned guard marks its end when dropped.
    pub fn request(&self) -> RequestGuard {
        self.with(|s| {
            s.in_flight += 1;
            s.first = false;
        });
        RequestGuard(self.clone())
    }

    /// When the connection is to be closed if nothing changes (`None`: a request is running).
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        self.with(|s| {
            if s.in_flight > 0 {
                None
            } else if s.read || s.first {
                Some(s.since + limits.header_timeout)
            } else {
                Some(s.since + limits.idle_timeout)
            }
        })
    }

    /// Returns once the connection is past its deadline.
    pub async fn expired(&self, limits: &Limits) {
        let step = (limits.header_timeout / 2).max(Duration::from_millis(1));
        loop {
            let now = Instant::now();
            match self.deadline(limits) {
                Some(d) if d <= now => return,
                Some(d) => tokio::time::sleep_until(d.min(now + step)).await,
                None => tokio::time::sleep(step).await,
            }
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

/// Ends a request (see [`Activity::request`]).
pub struct RequestGuard(Activity);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.with(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.since = Instant::now();
            s.read = false;
        });
    }
}

/// A connection whose reads are recorded in its [`Activity`].
pub struct Watched<S> {
    inner: S,
    activity: Activity,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Activity) -> Self {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.with(|s| s.read = true);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            ..Limits::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_gets_the_header_timeout() {
        let a = Activity::new();
        let start = Instant::now();
        a.expired(&limits()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn between_requests_idle_then_a_started_request_gets_the_header_timeout() {
        let a = Activity::new();
        drop(a.request());
        let start = Instant::now();
        a.expired(&limits()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(60), "idle");
        drop(a.request());
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
        a.with(|s| s.read = true);
        a.expired(&limits()).await;
        // The first byte came 2 s into the wait; the headers had 10 s from the last response.
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_request_is_never_cut() {
        let a = Activity::new();
        let guard = a.request();
        let expired = tokio::time::timeout(Duration::from_secs(600), a.expired(&limits())).await;
        assert!(expired.is_err(), "no deadline while a request runs");
        drop(guard);
        let start = Instant::now();
        a.expired(&limits()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }

    #[test]
    fn passthrough_source_counts_as_remote() {
        assert!(is_local("127.0.0.1".parse().unwrap()));
        assert!(is_local("::1".parse().unwrap()));
        assert!(is_local("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_local(INBOUND_PASSTHROUGH));
        assert!(!is_local("::ffff:127.0.0.6".parse().unwrap()));
        assert!(!is_local("10.1.2.3".parse().unwrap()));
        let counts = Counts::new(&Limits {
            remote: Caps {
                total: 10,
                per_peer: 1,
            },
            local_total: 2,
            ..Limits::default()
        });
        let _p = counts.admit(INBOUND_PASSTHROUGH).unwrap();
        assert!(counts.admit(INBOUND_PASSTHROUGH).is_err(), "per peer");
        let _l1 = counts.admit("127.0.0.1".parse().unwrap()).unwrap();
        let _l2 = counts.admit("127.0.0.1".parse().unwrap()).unwrap();
        assert!(counts.admit("::1".parse().unwrap()).is_err(), "local total");
        let _r = counts.admit("10.0.0.1".parse().unwrap()).unwrap();
    }
}
