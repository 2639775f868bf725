//! Istio's gRPC settings: the keepalive of every gRPC connection the agent makes (to istiod's
//! xDS and CA) or serves (the XDS socket), and the XDS socket server's limits.
//!
//! - `GRPC_KEEPALIVE_INTERVAL` (30s) and `GRPC_KEEPALIVE_TIMEOUT` (10s), Istio's
//!   `pkg/keepalive`: the HTTP/2 ping interval and how long a ping may go unanswered. As
//!   gRPC-Go applies them, a client interval under 10s is raised to 10s and a server interval
//!   under 1s to 1s.
//! - `ISTIO_GPRC_MAXSTREAMS` (100000) and `ISTIO_GPRC_MAXRECVMSGSIZE` (4 MiB), Istio's
//!   `pilot/pkg/features` (the misspelling is Istio's): concurrent streams per connection and
//!   the largest request accepted on the XDS socket. A stream cap of 0 is no cap, as in
//!   gRPC-Go.

use std::time::Duration;

use super::{Error, env::Env};

/// Istio's keepalive interval and timeout.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// gRPC-Go raises a client's keepalive interval below this to this (istiod's servers refuse
/// pings more frequent than half their own interval).
const CLIENT_MIN_INTERVAL: Duration = Duration::from_secs(10);
/// gRPC-Go raises a server's keepalive interval below this to this.
const SERVER_MIN_INTERVAL: Duration = Duration::from_secs(1);

/// `GRPC_KEEPALIVE_INTERVAL` and `GRPC_KEEPALIVE_TIMEOUT` as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
}

impl Keepalive {
    pub fn load(env: Env<'_>) -> Result<Keepalive, Error> {
        let min = Duration::from_millis(1);
        Ok(Keepalive {
            interval: env.duration("GRPC_KEEPALIVE_INTERVAL", DEFAULT_INTERVAL, min)?,
            timeout: env.duration("GRPC_KEEPALIVE_TIMEOUT", DEFAULT_TIMEOUT, min)?,
        })
    }

    /// (interval, timeout) on a connection the agent makes, as a gRPC-Go client uses them.
    pub fn client(&self) -> (Duration, Duration) {
        if self.interval < CLIENT_MIN_INTERVAL {
            tracing::warn!(
                interval = ?self.interval,
                "GRPC_KEEPALIVE_INTERVAL is below 10s: 10s is used on connections to istiod, as gRPC-Go does"
            );
        }
        (self.interval.max(CLIENT_MIN_INTERVAL), self.timeout)
    }

    /// (interval, timeout) on the XDS socket's server, as a gRPC-Go server uses them.
    pub fn server(&self) -> (Duration, Duration) {
        (self.interval.max(SERVER_MIN_INTERVAL), self.timeout)
    }
}

/// The XDS socket's gRPC server settings (Envoy's side of the xDS proxy), Istio's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct XdsServer {
    /// HTTP/2 keepalive (interval, timeout) towards Envoy: `GRPC_KEEPALIVE_*`.
    pub keepalive: (Duration, Duration),
    /// `ISTIO_GPRC_MAXSTREAMS`: concurrent HTTP/2 streams per connection (`None`: no cap).
    pub max_streams: Option<u32>,
    /// `ISTIO_GPRC_MAXRECVMSGSIZE`: the largest request accepted from Envoy, in bytes.
    pub max_recv_msg_size: usize,
}

impl Default for XdsServer {
    fn default() -> Self {
        XdsServer {
            keepalive: (DEFAULT_INTERVAL, DEFAULT_TIMEOUT),
            max_streams: Some(100_000),
            max_recv_msg_size: 4 << 20,
        }
    }
}

impl XdsServer {
    pub fn load(env: Env<'_>, keepalive: &Keepalive) -> Result<XdsServer, Error> {
        let d = XdsServer::default();
        let max_streams = env.u32("ISTIO_GPRC_MAXSTREAMS", d.max_streams.unwrap_or(0))?;
        let max_recv_msg_size = env.parse(
            "ISTIO_GPRC_MAXRECVMSGSIZE",
            d.max_recv_msg_size,
            "a number of bytes",
            |v| v.parse::<usize>().ok(),
        )?;
        Ok(XdsServer {
            keepalive: keepalive.server(),
            max_streams: (max_streams > 0).then_some(max_streams),
            max_recv_msg_size,
        })
    }
}
