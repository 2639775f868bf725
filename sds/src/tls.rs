//! gRPC channels to Istio's CA and discovery server: one TLS policy for both, and one way to
//! fail over between several istiod addresses ([`failover`]).

pub mod client;
pub mod compliance;
pub mod failover;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::Error;
pub use compliance::Compliance;
use failover::{Failover, Target};

/// Where the server's root of trust comes from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum RootSource {
    /// The OS trust store (`CA_ROOT_CA=SYSTEM`).
    System,
    /// PEM bytes.
    Pem(Vec<u8>),
    /// A PEM file, read each time a channel is built.
    File(PathBuf),
}

impl RootSource {
    /// Human description for error messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            RootSource::System => "system roots".to_string(),
            RootSource::Pem(_) => "inline PEM".to_string(),
            RootSource::File(p) => p.display().to_string(),
        }
    }
}

/// HTTP/2 keepalive: ping interval and ping timeout (Istio: 30s / 10s).
pub const DEFAULT_KEEPALIVE: (Duration, Duration) =
    (Duration::from_secs(30), Duration::from_secs(10));

/// Everything needed to dial istiod (CA or xDS).
#[derive(Clone, Debug)]
pub struct ChannelInputs {
    /// `host:port`, or a full `http(s)://` URI.
    pub addr: String,
    /// No TLS at all (Istio's `:15010`).
    pub plaintext: bool,
    pub root: RootSource,
    /// TLS ServerName (SNI and the name the server certificate must carry).
    pub server_name: String,
    /// Client certificate chain and key, PEM.
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// HTTP/2 keepalive (interval, timeout); `None` disables pings.
    pub keepalive: Option<(Duration, Duration)>,
    /// The HTTP/2 receive windows, stream and connection (4 MiB by default).
    pub window: u32,
    /// `COMPLIANCE_POLICY`: the TLS versions, suites and groups the handshake may use.
    pub compliance: Compliance,
}

/// The HTTP/2 receive windows of istiod channels: a 10,000-cluster CDS (1.8 MB) arrives with
/// no flow-control stall and few WINDOW_UPDATEs (each a TLS record and a wakeup of istiod; with
/// 1 MiB windows they were a fifth of the xDS relay's CPU), and what istiod can push before the
/// agent reads stays bounded (grpc-go, as Istio's agent, grows its windows up to 16 MiB).
pub const DEFAULT_WINDOW: u32 = 4 << 20;

impl ChannelInputs {
    /// Inputs with Istio's defaults: TLS against `root`, ServerName `server_name`, keepalive on.
    pub fn new(
        addr: impl Into<String>,
        root: RootSource,
        server_name: impl Into<String>,
    ) -> ChannelInputs {
        ChannelInputs {
            addr: addr.into(),
            plaintext: false,
            root,
            server_name: server_name.into(),
            client_identity: None,
            keepalive: Some(DEFAULT_KEEPALIVE),
            window: DEFAULT_WINDOW,
            compliance: Compliance::None,
        }
    }
}

/// Builds a lazy (non-blocking) channel: TLS under the inputs' compliance policy with the given
/// root and ServerName, or plaintext; windows and keepalive as given.
pub fn grpc_channel(inputs: &ChannelInputs) -> Result<Channel, Error> {
    let scheme = if inputs.plaintext { "http" } else { "https" };
    let uri = if inputs.addr.contains("://") {
        inputs.addr.clone()
    } else {
        format!("{scheme}://{}", inputs.addr)
    };
    if inputs.plaintext {
        return Ok(endpoint(inputs, uri)?.connect_lazy());
    }
    let origin = parse_uri(inputs, &uri)?;
    let authority = origin
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_default();
    let ep = endpoint(inputs, format!("http://{authority}"))?.origin(origin);
    Ok(ep.connect_with_connector_lazy(tls_connector(inputs, &authority, None)?))
}

/// A lazy channel to one resolved target of `inputs` (its `:authority` stays the address as
/// configured; TLS checks `server_name` as for [`grpc_channel`]).
pub fn grpc_channel_to(inputs: &ChannelInputs, target: &Target) -> Result<Channel, Error> {
    if inputs.plaintext {
        return Ok(endpoint(inputs, target.dial_uri())?
            .origin(target.origin.clone())
            .connect_lazy());
    }
    let connector = tls_connector(inputs, &target.origin.to_string(), Some(target.addr))?;
    Ok(endpoint(inputs, format!("http://{}", target.addr))?
        .origin(target.origin.clone())
        .connect_with_connector_lazy(connector))
}

/// The TLS connector of `inputs` (dialing `addr`, else the channel's URI), its config built now:
/// a root file is read once per channel.
fn tls_connector(
    inputs: &ChannelInputs,
    authority: &str,
    addr: Option<SocketAddr>,
) -> Result<
    impl tower::Service<
        tonic::codegen::http::Uri,
        Response = client::Io,
        Error = std::io::Error,
        Future = impl Send,
    > + Send
    + Clone
    + 'static,
    Error,
> {
    let err = |reason: String| Error::Channel {
        addr: inputs.addr.clone(),
        reason,
    };
    let config = client::client_config(inputs)
        .map_err(|e| err(format!("TLS config (root {}): {e}", inputs.root.describe())))?;
    let name = client::server_name(inputs, authority).map_err(|e| err(e.to_string()))?;
    Ok(client::connector(Arc::new(config), name, addr))
}

fn parse_uri(inputs: &ChannelInputs, uri: &str) -> Result<tonic::codegen::http::Uri, Error> {
    uri.parse().map_err(|e| Error::Channel {
        addr: inputs.addr.clone(),
        reason: format!("invalid address: {e}"),
    })
}

/// Connects (TCP, TLS, HTTP/2) to the first target of `failover` that answers within
/// `per_target` each, in the failover's order; a target that fails is marked so and the next
/// one is tried. Returns the channel and the target's address (mark it failed when the
/// connection is later lost). The error lists every attempt.
pub async fn connect_failover(
    inputs: &ChannelInputs,
    failover: &Failover,
    per_target: Duration,
) -> Result<(Channel, SocketAddr), Error> {
    let err = |reason: String| Error::Channel {
        addr: inputs.addr.clone(),
        reason,
    };
    let targets = failover.targets().await.map_err(|e| err(e.to_string()))?;
    let mut failures = Vec::new();
    for target in &targets {
        let connecting = async {
            if inputs.plaintext {
                endpoint(inputs, target.dial_uri())?
                    .origin(target.origin.clone())
                    .connect_with_connector(buffered_tcp(target.addr))
                    .await
                    .map_err(|e| err(error_chain(&e)))
            } else {
                let connector =
                    tls_connector(inputs, &target.origin.to_string(), Some(target.addr))?;
                endpoint(inputs, format!("http://{}", target.addr))?
                    .origin(target.origin.clone())
                    .connect_with_connector(connector)
                    .await
                    .map_err(|e| err(error_chain(&e)))
            }
        };
        let reason = match tokio::time::timeout(per_target, connecting).await {
            Ok(Ok(channel)) => {
                failover.succeeded(target.addr);
                if !failures.is_empty() || failover.is_list() {
                    tracing::info!(addr = %target.addr, address = %target.origin, "connected to istiod");
                }
                return Ok((channel, target.addr));
            }
            Ok(Err(Error::Channel { reason, .. })) => reason,
            Ok(Err(e)) => return Err(e),
            Err(_) => format!("no connection within {per_target:?}"),
        };
        tracing::debug!(addr = %target.addr, %reason, "cannot connect to an istiod address; trying the next");
        failover.failed(target.addr);
        failures.push(format!("{}: {reason}", target.addr));
    }
    Err(err(failures.join("; ")))
}

use client::READ_BUFFER;

/// A connector to `addr` (whatever URI the channel asks for: its `:authority` and TLS name come
/// from the endpoint), TCP_NODELAY, reads buffered ([`READ_BUFFER`]): plaintext channels.
fn buffered_tcp(
    addr: SocketAddr,
) -> impl tower::Service<
    tonic::codegen::http::Uri,
    Response = hyper_util::rt::TokioIo<tokio::io::BufReader<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Send
+ 'static {
    tower::service_fn(move |_| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Ok(hyper_util::rt::TokioIo::new(
            tokio::io::BufReader::with_capacity(READ_BUFFER, tcp),
        ))
    })
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The endpoint for `uri` with the windows and keepalive of `inputs` (TLS is the connector's).
fn endpoint(inputs: &ChannelInputs, uri: String) -> Result<Endpoint, Error> {
    let err = |reason: String| Error::Channel {
        addr: inputs.addr.clone(),
        reason,
    };
    let mut ep = Endpoint::from_shared(uri)
        .map_err(|e| err(format!("invalid address: {e}")))?
        .initial_stream_window_size(inputs.window)
        .initial_connection_window_size(inputs.window)
        .tcp_nodelay(true);
    if let Some((interval, timeout)) = inputs.keepalive {
        ep = ep
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(timeout);
    }
    Ok(ep)
}

/// Reads a bearer token, trimmed. `None` when the file is absent or empty.
pub fn read_token(path: &Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let t = s.trim();
    if t.is_empty() {
        None
    } else {
        Some(t.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_trimmed_and_optional() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t");
        assert_eq!(read_token(&p), None);
        std::fs::write(&p, " \n").expect("write");
        assert_eq!(read_token(&p), None);
        std::fs::write(&p, "abc.def\n").expect("write");
        assert_eq!(read_token(&p).as_deref(), Some("abc.def"));
    }

    #[tokio::test]
    async fn connect_failover_skips_dead_and_stalled_targets() {
        // TLS: a stopped server accepts TCP but never completes the handshake.
        let live = crate::testing::FakeCa::start();
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port");
        // Accepts TCP (the kernel's backlog) and never answers: a stopped istiod.
        let stalled = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let stalled_addr = stalled.local_addr().expect("addr");
        let list = format!("{dead},{stalled_addr},{}", live.ca_addr());
        let inputs = ChannelInputs::new(
            list.clone(),
            RootSource::Pem(live.tls_root_pem.clone().into_bytes()),
            "istiod.istio-system.svc",
        );
        let failover = Failover::new(&list, false).expect("list");
        let started = std::time::Instant::now();
        let (_channel, addr) = connect_failover(&inputs, &failover, Duration::from_millis(300))
            .await
            .expect("the live one");
        assert_eq!(addr.to_string(), live.ca_addr());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // The live one is tried first from now on.
        let first = failover.targets().await.expect("targets")[0].addr;
        assert_eq!(first, addr);
        // Nothing answers: the error names every attempt.
        let none = format!("{dead},{stalled_addr}");
        let e = connect_failover(
            &inputs,
            &Failover::new(&none, false).expect("list"),
            Duration::from_millis(100),
        )
        .await
        .expect_err("nothing answers");
        let e = e.to_string();
        assert!(
            e.contains(&dead.to_string()) && e.contains(&stalled_addr.to_string()),
            "{e}"
        );
        drop(stalled);
    }

    #[tokio::test]
    async fn missing_root_file_is_an_error_naming_it() {
        let inputs = ChannelInputs::new(
            "127.0.0.1:1",
            RootSource::File("/nonexistent/root.pem".into()),
            "x",
        );
        let e = grpc_channel(&inputs).expect_err("no root");
        assert!(e.to_string().contains("/nonexistent/root.pem"), "{e}");
    }
}
