//! Application probes (`ISTIO_KUBE_APP_PROBERS`) and the app-metrics scrape config
//! (`ISTIO_PROMETHEUS_ANNOTATIONS`). The injector rewrites the app's probes to
//! `/app-health/<container>/livez|readyz|startupz` (and lifecycle hooks to
//! `/app-lifecycle/<container>/prestopz|poststartz`) on the status port; the status server runs
//! the original probe against the app and answers as Istio's agent does (see docs/probes.md).
//! Probes are sent from 127.0.0.6 (or ::6) so the iptables rules let them bypass Envoy.
//!
//! - what a probe is, and its parsing, are configuration ([`crate::config::probe`]).
//! - `http` (+ `tls`): HTTP/1.1, HTTPS with HTTP/2 by ALPN, redirects.
//! - `grpc`: `grpc.health.v1.Health/Check`.
//!
//! TCP probes are a connect, here.

mod grpc;
mod http;
pub use http::Connections;
pub(crate) mod tls;

/// Why a probe failed without an answer from the app: logged for the kubelet's probes, the
/// body of the 500 for the VM health probe.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("exec probe without a command")]
    NoCommand,
    #[error("exec probe {program:?}: timed out after {timeout:?}")]
    ExecTimeout { program: String, timeout: Duration },
    #[error("exec probe {program:?}: {source}")]
    Exec {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("http probe to port {port}: {source}")]
    Http {
        port: u16,
        #[source]
        source: http::Error,
    },
    #[error("tcp probe to port {port}: timed out")]
    TcpTimeout { port: u16 },
    #[error("tcp probe to port {port}: {source}")]
    Tcp {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("grpc probe to port {port}: {source}")]
    GrpcConnect {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("grpc probe to port {port}: timed out")]
    GrpcTimeout { port: u16 },
    #[error("grpc probe to port {port}: {source}")]
    Grpc {
        port: u16,
        #[source]
        source: grpc::Error,
    },
    #[error("grpc probe to port {port}: service {service:?} is not SERVING")]
    NotServing { port: u16, service: String },
}

/// Runs `command` (no shell), killed at `timeout` (1 s when unset, Istio's default): 200 when
/// it exits 0, else 500 with what it printed.
async fn exec(command: &[String], timeout: Duration) -> Result<ProbeResult, Error> {
    let timeout = if timeout.is_zero() {
        Duration::from_secs(1)
    } else {
        timeout
    };
    let (program, args) = command.split_first().ok_or(Error::NoCommand)?;
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(timeout, child)
        .await
        .map_err(|_| Error::ExecTimeout {
            program: program.clone(),
            timeout,
        })?
        .map_err(|source| Error::Exec {
            program: program.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(ProbeResult::ok());
    }
    let mut body = out.stdout;
    body.extend_from_slice(&out.stderr);
    body.truncate(BODY_CAP);
    Ok(ProbeResult {
        status: 500,
        body: bytes::Bytes::from(format!(
            "exec probe {program:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&body).trim()
        )),
    })
}

#[cfg(test)]
mod tests;

pub use crate::config::probe::{
    AppProbe, AppProbers, Destination, ProbeAction, PrometheusAnnotations, ReadinessProbe,
};

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ::http::{HeaderMap, HeaderValue, header};
use http_body_util::{BodyExt, Limited};

/// The outcome of one probe, as the status server answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeResult {
    pub status: u16,
    pub body: bytes::Bytes,
}

impl ProbeResult {
    fn ok() -> Self {
        ProbeResult {
            status: 200,
            body: bytes::Bytes::new(),
        }
    }
    /// A failure: 500 with no body, as Istio (the reason goes to the log).
    fn failed() -> Self {
        ProbeResult {
            status: 500,
            body: bytes::Bytes::new(),
        }
    }
}

/// The kubelet's request to the status port, as far as a probe needs it.
#[derive(Debug, Clone, Copy)]
pub struct KubeletRequest<'a> {
    /// Its headers; all but `Host`, `Content-Length`, `Transfer-Encoding` and `Trailer` are
    /// forwarded to an HTTP app.
    pub headers: &'a HeaderMap,
    /// Its `Host` (or HTTP/2 `:authority`); `None` when it sent none.
    pub host: Option<&'a str>,
    /// The port it reached: a `Host` naming this port is rewritten to the app's port.
    pub status_port: u16,
}

/// Runs probes against the application.
#[derive(Debug, Clone)]
pub struct Prober {
    /// Where the app is (INSTANCE_IP, or localhost with the legacy env).
    pub destination: Destination,
    /// Offer HTTP/2 to HTTPS apps (`ISTIO_ENABLE_HTTP2_PROBING`, default true).
    pub http2: bool,
    /// `ENABLE_PROBE_KEEPALIVE_CONNECTIONS` (default false: a new connection per HTTP probe,
    /// `Connection: close`, as the kubelet): the idle connections kept for reuse.
    pub keepalive: Option<Connections>,
}

/// Istio keeps at most 10 KiB of an app's probe answer.
const BODY_CAP: usize = 10 * 1024;

/// Headers the status server does not pass on: Go's server and client handle them themselves.
const NOT_FORWARDED: [header::HeaderName; 4] = [
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TRAILER,
];

/// What an HTTP app probe passes on from the kubelet's request to the app on `port`: its
/// headers but [`NOT_FORWARDED`], and its `Host` (a `Host` naming the status port is rewritten
/// to name `port`).
pub(crate) fn forwarded(kubelet: &KubeletRequest<'_>, port: u16) -> (HeaderMap, Option<String>) {
    let mut headers = HeaderMap::new();
    for (k, v) in kubelet.headers {
        if !NOT_FORWARDED.contains(k) {
            headers.append(k, v.clone());
        }
    }
    // One User-Agent goes out, the kubelet's first (a probe's `httpHeaders` may repeat it; Go's
    // client writes only the first value).
    if let Some(first) = headers.get(header::USER_AGENT).cloned() {
        headers.insert(header::USER_AGENT, first);
    }
    let host = kubelet
        .host
        .filter(|h| !h.is_empty())
        .map(|h| match split_host_port(h) {
            Some((name, p)) if p.parse::<u32>().ok() == Some(kubelet.status_port.into()) => {
                join_host_port(name, port)
            }
            _ => h.to_string(),
        });
    (headers, host)
}

/// Go's `net.SplitHostPort`: `host:port` or `[v6]:port`; `None` without a port.
pub(super) fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        Some((host, after.strip_prefix(':')?))
    } else {
        let (host, port) = s.rsplit_once(':')?;
        (!host.contains(':')).then_some((host, port))
    }
}

/// Go's `net.JoinHostPort`: brackets around a host with a colon.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The source address of probe connections to `dest`: iptables lets 127.0.0.6 (`::6`) bypass
/// Envoy.
fn source(dest: IpAddr) -> IpAddr {
    match dest {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6)),
    }
}

/// Connects to `dest` from [`source`]; from an ephemeral source when that cannot be bound (e.g.
/// IPv6 without `::6`).
async fn connect_to(dest: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = match dest {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    let from = source(dest.ip());
    if socket.bind(SocketAddr::new(from, 0)).is_err() {
        tracing::debug!(source = %from, "cannot bind probe source; using default");
    }
    socket.connect(dest).await
}

/// Connects to the first of `addrs` that accepts, in order (Go's dialer over the addresses of
/// a name); the error is the last one's.
async fn connect_any(
    addrs: impl IntoIterator<Item = SocketAddr>,
) -> std::io::Result<tokio::net::TcpStream> {
    let mut last = None;
    for addr in addrs {
        match connect_to(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no address to connect to")))
}

impl Prober {
    async fn connect(&self, port: u16) -> std::io::Result<tokio::net::TcpStream> {
        match self.destination {
            Destination::Ip(ip) => connect_to(SocketAddr::new(ip, port)).await,
            Destination::Localhost => {
                let addrs = tokio::net::lookup_host(("localhost", port))
                    .await
                    .map_err(|e| std::io::Error::new(e.kind(), format!("localhost: {e}")))?;
                connect_any(addrs).await
            }
        }
    }

    fn deadline(timeout: Duration) -> Option<tokio::time::Instant> {
        (!timeout.is_zero()).then(|| tokio::time::Instant::now() + timeout)
    }

    /// Runs a rewritten app probe for the kubelet's request `kubelet` (`/app-health/...`).
    pub async fn run_app(&self, probe: &AppProbe, kubelet: KubeletRequest<'_>) -> ProbeResult {
        let deadline = Self::deadline(probe.timeout);
        let outcome = match &probe.action {
            ProbeAction::Http {
                path, port, https, ..
            } => {
                let (headers, host) = forwarded(&kubelet, *port);
                let req = http::Request {
                    https: *https,
                    port: *port,
                    path: path.clone(),
                    headers,
                    host,
                    offer_h2: self.http2,
                };
                self.http(req, deadline).await
            }
            ProbeAction::Tcp { port, .. } => self.tcp(*port, probe.timeout).await,
            ProbeAction::Exec { command } => exec(command, probe.timeout).await,
            ProbeAction::Grpc { port, service } => {
                let user_agent = match kubelet
                    .headers
                    .get(header::USER_AGENT)
                    .and_then(|v| v.to_str().ok())
                {
                    Some(ua) => format!("{ua} {}", grpc::GRPC_GO_USER_AGENT),
                    None => grpc::GRPC_GO_USER_AGENT.to_string(),
                };
                self.grpc(*port, service, &user_agent, probe.timeout).await
            }
        };
        outcome.unwrap_or_else(|e| {
            tracing::warn!(error = %e, action = ?probe.action, "app probe failed");
            ProbeResult::failed()
        })
    }

    /// Runs `probe` on its own (the VM health probe): HTTP probes send their configured
    /// headers (`Host` among them) and `User-Agent: istio-probe/1.0` unless configured, over
    /// HTTP/1.1 only, as Istio's health checker.
    pub async fn run(&self, probe: &AppProbe, extra: &HeaderMap) -> ProbeResult {
        let deadline = Self::deadline(probe.timeout);
        let outcome = match &probe.action {
            ProbeAction::Http {
                path,
                port,
                https,
                headers: configured,
                ..
            } => {
                let mut headers = extra.clone();
                let mut host = None;
                for (k, v) in configured {
                    let (Ok(k), Ok(v)) = (
                        header::HeaderName::from_bytes(k.as_bytes()),
                        HeaderValue::from_str(v),
                    ) else {
                        continue;
                    };
                    if k == header::HOST {
                        host.get_or_insert_with(|| v.to_str().unwrap_or_default().to_string());
                    } else {
                        headers.append(k, v);
                    }
                }
                if !headers.contains_key(header::USER_AGENT) {
                    headers.insert(
                        header::USER_AGENT,
                        HeaderValue::from_static("istio-probe/1.0"),
                    );
                }
                let req = http::Request {
                    https: *https,
                    port: *port,
                    path: path.clone(),
                    headers,
                    host,
                    offer_h2: false,
                };
                self.http(req, deadline).await
            }
            ProbeAction::Tcp { port, .. } => self.tcp(*port, probe.timeout).await,
            ProbeAction::Exec { command } => exec(command, probe.timeout).await,
            ProbeAction::Grpc { port, service } => {
                self.grpc(*port, service, grpc::GRPC_GO_USER_AGENT, probe.timeout)
                    .await
            }
        };
        outcome.unwrap_or_else(|e| ProbeResult {
            status: 500,
            body: bytes::Bytes::from(e.to_string()),
        })
    }

    async fn http(
        &self,
        req: http::Request,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<ProbeResult, Error> {
        let port = req.port;
        let (status, body) = http::get(self, req, deadline, BODY_CAP)
            .await
            .map_err(|source| Error::Http { port, source })?;
        // Redirects not followed (elsewhere, or without Location) are a success: the kubelet
        // would not follow them either.
        if (300..400).contains(&status) {
            return Ok(ProbeResult::ok());
        }
        Ok(ProbeResult { status, body })
    }

    async fn tcp(&self, port: u16, timeout: Duration) -> Result<ProbeResult, Error> {
        let connect = self.connect(port);
        let stream = if timeout.is_zero() {
            connect.await
        } else {
            tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| Error::TcpTimeout { port })?
        };
        stream.map_err(|source| Error::Tcp { port, source })?;
        Ok(ProbeResult::ok())
    }

    async fn grpc(
        &self,
        port: u16,
        service: &str,
        user_agent: &str,
        timeout: Duration,
    ) -> Result<ProbeResult, Error> {
        let authority = join_host_port(&self.destination.to_string(), port);
        let run = async {
            let stream = self
                .connect(port)
                .await
                .map_err(|source| Error::GrpcConnect { port, source })?;
            grpc::check(
                stream,
                grpc::Check {
                    authority: &authority,
                    service,
                    user_agent,
                    timeout: (!timeout.is_zero()).then_some(timeout),
                },
            )
            .await
            .map_err(|source| Error::Grpc { port, source })
        };
        let serving = if timeout.is_zero() {
            run.await
        } else {
            tokio::time::timeout(timeout, run)
                .await
                .map_err(|_| Error::GrpcTimeout { port })
                .and_then(|r| r)
        }?;
        if serving {
            Ok(ProbeResult::ok())
        } else {
            Err(Error::NotServing {
                port,
                service: service.into(),
            })
        }
    }
}

/// A body that could not be read to its end.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReadError(#[source] Box<dyn std::error::Error + Send + Sync>);

/// Reads at most `cap` bytes of a body; `None` when it is larger.
pub async fn read_capped<B>(body: B, cap: usize) -> Result<Option<bytes::Bytes>, ReadError>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, cap).collect().await {
        Ok(c) => Ok(Some(c.to_bytes())),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Ok(None)
        }
        Err(e) => Err(ReadError(e)),
    }
}
