//! HTTP probes, sent as Istio's Go agent sends them: a fresh connection per request
//! (`Connection: close`; with `ENABLE_PROBE_KEEPALIVE_CONNECTIONS` an idle connection is kept
//! per scheme and address and reused, [`Connections`]), HTTPS without certificate verification offering `h2` and `http/1.1`
//! over ALPN (HTTP/2 when the app picks it), plain HTTP always HTTP/1.1 (no h2c), and
//! redirects followed the way the kubelet follows them: to the same host only, at most ten
//! requests in all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use http::{HeaderMap, HeaderValue, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::Prober;
use super::tls::insecure_client_config;

/// At most this many requests per probe (the first plus nine redirects), as Go's client.
const MAX_REQUESTS: usize = 10;

/// What Go's client sends when the caller gave no `User-Agent`.
const GO_USER_AGENT_H1: &str = "Go-http-client/1.1";
const GO_USER_AGENT_H2: &str = "Go-http-client/2.0";

/// Why an HTTP probe got no answer (Go's client's wording where it has one).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("timed out awaiting headers")]
    Timeout,
    #[error("bad probe URL {url}: {source}")]
    Url {
        url: String,
        #[source]
        source: url::ParseError,
    },
    #[error("failed to parse Location header: not ASCII")]
    LocationNotAscii,
    #[error("failed to parse Location header {location:?}: {source}")]
    Location {
        location: String,
        #[source]
        source: url::ParseError,
    },
    #[error("stopped after {MAX_REQUESTS} redirects")]
    TooManyRedirects,
    #[error("unsupported protocol scheme {0:?}")]
    Scheme(String),
    #[error("{0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS server name {name:?}: {source}")]
    ServerName {
        name: String,
        #[source]
        source: rustls_pki_types::InvalidDnsNameError,
    },
    #[error("no host in {0}")]
    NoHost(url::Url),
    #[error("TLS handshake: {0}")]
    Tls(#[source] std::io::Error),
    /// The HTTP/1.1 or HTTP/2 handshake.
    #[error("{0}")]
    Handshake(#[source] hyper::Error),
    #[error("{0}")]
    Send(#[source] hyper::Error),
    /// `target`: the request target (HTTP/1.1) or URI (HTTP/2).
    #[error("bad probe request {target:?}: {source}")]
    Request {
        target: String,
        #[source]
        source: http::Error,
    },
    #[error("bad Host {host:?}: {source}")]
    Host {
        host: String,
        #[source]
        source: header::InvalidHeaderValue,
    },
}

/// One probe request.
pub(super) struct Request {
    pub https: bool,
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
    /// Headers to send (no `Host`).
    pub headers: HeaderMap,
    /// The `Host` header; `None`: the URL's authority.
    pub host: Option<String>,
    /// Offer HTTP/2 over TLS (the app-probe client does; the VM health client does not).
    pub offer_h2: bool,
}

/// Sends `req` and follows redirects; returns the final response's status and body (read
/// until `deadline`, keeping at most `cap` bytes). A body cut short by the deadline keeps its
/// status, as Istio writes the status before it reads the body.
pub(super) async fn get(
    prober: &Prober,
    req: Request,
    deadline: Option<Instant>,
    cap: usize,
) -> Result<(u16, bytes::Bytes), Error> {
    let head = follow(prober, req);
    let resp = match deadline {
        Some(d) => tokio::time::timeout_at(d, head)
            .await
            .map_err(|_| Error::Timeout)??,
        None => head.await?,
    };
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    // With kept connections the rest of the body is read too (as Go's client drains it), so
    // the connection can serve the next probe; up to a bound, past which it is dropped.
    let drain = if prober.keepalive.is_some() {
        DRAIN_MAX
    } else {
        0
    };
    let read = read_capped_prefix(resp.into_body(), cap, drain, &mut body);
    match deadline {
        // What arrived before the deadline is kept.
        Some(d) => {
            let _ = tokio::time::timeout_at(d, read).await;
        }
        None => read.await,
    }
    Ok((status, bytes::Bytes::from(body)))
}

/// How much of a body past what is kept is read to keep its connection for the next probe.
const DRAIN_MAX: usize = 1 << 20;

/// Reads at most `cap` bytes into `out`, then discards up to `drain` more bytes until the end;
/// a read error ends the body where it is.
async fn read_capped_prefix(mut body: Incoming, cap: usize, drain: usize, out: &mut Vec<u8>) {
    let mut discarded = 0;
    while out.len() < cap || (drain > 0 && discarded <= drain) {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = cap.saturating_sub(out.len()).min(data.len());
                    out.extend_from_slice(&data[..take]);
                    discarded += data.len() - take;
                }
            }
            Some(Err(_)) | None => break,
        }
    }
}

fn is_followed_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

async fn follow(prober: &Prober, req: Request) -> Result<http::Response<Incoming>, Error> {
    let scheme = if req.https { "https" } else { "http" };
    let authority = super::join_host_port(&prober.destination.to_string(), req.port);
    let url = format!("{scheme}://{authority}{}", req.path);
    let first = url::Url::parse(&url).map_err(|source| Error::Url { url, source })?;
    let mut current = first.clone();
    let mut current_authority = authority.clone();
    let mut host = req.host.clone();
    let mut headers = req.headers.clone();
    let mut sent = 0;
    loop {
        sent += 1;
        let resp = send(
            prober,
            &req,
            &current,
            &current_authority,
            host.as_deref(),
            &headers,
        )
        .await?;
        let status = resp.status().as_u16();
        if !is_followed_redirect(status) {
            return Ok(resp);
        }
        // A redirect without Location is the answer itself.
        let Some(location) = resp.headers().get(header::LOCATION) else {
            return Ok(resp);
        };
        let location = location
            .to_str()
            .map_err(|_| Error::LocationNotAscii)?
            .to_string();
        let next = current.join(&location).map_err(|source| Error::Location {
            location: location.clone(),
            source,
        })?;
        // Somewhere else: the redirect itself is the answer (a success for the kubelet).
        if next.host_str() != first.host_str() {
            return Ok(resp);
        }
        if sent >= MAX_REQUESTS {
            return Err(Error::TooManyRedirects);
        }
        // The caller's Host survives a relative redirect only.
        let relative = url::Url::parse(&location).is_err();
        let custom_host = req.host.as_deref().filter(|h| *h != authority);
        host = custom_host.filter(|_| relative).map(str::to_string);
        // Each hop sends the first request's headers, plus the previous URL as Referer
        // (unless the caller set one, or the hop leaves HTTPS for HTTP).
        headers = req.headers.clone();
        let downgrade = current.scheme() == "https" && next.scheme() == "http";
        if !(headers.contains_key(header::REFERER) || downgrade)
            && let Ok(v) = HeaderValue::from_str(current.as_str())
        {
            headers.insert(header::REFERER, v);
        }
        current_authority = match (next.host_str(), next.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => String::new(),
        };
        current = next;
    }
}

/// Headers that describe one HTTP/1.1 connection and have no place in HTTP/2.
const CONNECTION_HEADERS: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

async fn send(
    prober: &Prober,
    req: &Request,
    url: &url::Url,
    authority: &str,
    host: Option<&str>,
    headers: &HeaderMap,
) -> Result<http::Response<Incoming>, Error> {
    let https = match url.scheme() {
        "http" => false,
        "https" => true,
        other => return Err(Error::Scheme(other.into())),
    };
    let port = url.port_or_known_default().unwrap_or(80);
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let host = host.unwrap_or(authority).to_string();
    let Some(pool) = &prober.keepalive else {
        let mut sender = open(prober, req, url, https, port).await?;
        return sender.send(&host, &target, headers, true).await;
    };
    let key = (https, port, url.host_str().unwrap_or_default().to_string());
    // An idle connection first; one the app closed meanwhile (or that fails before an answer)
    // is replaced by a new one, as Go's transport retries a request on a reused connection.
    if let Some(mut sender) = pool.take(&key)
        && sender.ready().await
        && let Ok(resp) = sender.send(&host, &target, headers, false).await
    {
        pool.put(key, sender);
        return Ok(resp);
    }
    let mut sender = open(prober, req, url, https, port).await?;
    let resp = sender.send(&host, &target, headers, false).await?;
    pool.put(key, sender);
    Ok(resp)
}

/// A new connection to `url`'s port, TLS when `https`, HTTP/2 when the app picks it by ALPN.
async fn open(
    prober: &Prober,
    req: &Request,
    url: &url::Url,
    https: bool,
    port: u16,
) -> Result<Sender, Error> {
    let stream = prober.connect(port).await.map_err(Error::Connect)?;
    if https {
        let server_name = match url.host() {
            Some(url::Host::Domain(d)) => rustls_pki_types::ServerName::try_from(d.to_string())
                .map_err(|source| Error::ServerName {
                    name: d.into(),
                    source,
                })?,
            Some(url::Host::Ipv4(ip)) => rustls_pki_types::ServerName::IpAddress(ip.into()),
            Some(url::Host::Ipv6(ip)) => rustls_pki_types::ServerName::IpAddress(ip.into()),
            None => return Err(Error::NoHost(url.clone())),
        };
        let tls = tokio_rustls::TlsConnector::from(tls_config(req.offer_h2))
            .connect(server_name, stream)
            .await
            .map_err(Error::Tls)?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = hyper_util::rt::TokioIo::new(tls);
        if h2 {
            handshake_h2(io).await
        } else {
            handshake_h1(io).await
        }
    } else {
        handshake_h1(hyper_util::rt::TokioIo::new(stream)).await
    }
}

/// One connection to the app, HTTP/1.1 or HTTP/2.
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>),
}

impl Sender {
    /// Waits until the connection takes another request; false when it is closed (the app
    /// closed it, or the previous answer's body was not read to its end).
    async fn ready(&mut self) -> bool {
        match self {
            Sender::H1(s) => s.ready().await.is_ok(),
            Sender::H2(s) => s.ready().await.is_ok(),
        }
    }

    /// Sends the probe's GET; over HTTP/1.1 with `Connection: close` when `close`.
    async fn send(
        &mut self,
        host: &str,
        target: &str,
        headers: &HeaderMap,
        close: bool,
    ) -> Result<http::Response<Incoming>, Error> {
        match self {
            Sender::H1(s) => {
                let req = request_h1(host, target, headers, close)?;
                s.send_request(req).await.map_err(Error::Send)
            }
            Sender::H2(s) => {
                let req = request_h2(host, target, headers)?;
                s.send_request(req).await.map_err(Error::Send)
            }
        }
    }
}

/// Idle probe connections kept for reuse (`ENABLE_PROBE_KEEPALIVE_CONNECTIONS`): at most one
/// per scheme, port and host, taken while a probe uses it. Cheap to clone.
#[derive(Clone, Default)]
pub struct Connections(Arc<Mutex<HashMap<PoolKey, Sender>>>);

/// HTTPS?, port, host.
type PoolKey = (bool, u16, String);

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connections")
    }
}

impl Connections {
    fn take(&self, key: &PoolKey) -> Option<Sender> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key)
    }

    fn put(&self, key: PoolKey, sender: Sender) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, sender);
    }
}

fn tls_config(offer_h2: bool) -> Arc<rustls::ClientConfig> {
    static WITH_H2: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    static NO_ALPN: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    if offer_h2 {
        WITH_H2
            .get_or_init(|| insecure_client_config(vec![b"h2".to_vec(), b"http/1.1".to_vec()]))
            .clone()
    } else {
        NO_ALPN
            .get_or_init(|| insecure_client_config(Vec::new()))
            .clone()
    }
}

async fn handshake_h1<IO>(io: IO) -> Result<Sender, Error>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(Error::Handshake)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Sender::H1(sender))
}

async fn handshake_h2<IO>(io: IO) -> Result<Sender, Error>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(io)
            .await
            .map_err(Error::Handshake)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Sender::H2(sender))
}

fn request_h1(
    host: &str,
    target: &str,
    headers: &HeaderMap,
    close: bool,
) -> Result<http::Request<Empty<bytes::Bytes>>, Error> {
    let mut req = http::Request::builder()
        .method(http::Method::GET)
        .uri(target)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|source| Error::Request {
            target: target.into(),
            source,
        })?;
    let h = req.headers_mut();
    h.insert(
        header::HOST,
        HeaderValue::from_str(host).map_err(|source| Error::Host {
            host: host.into(),
            source,
        })?,
    );
    for (k, v) in headers {
        h.append(k, v.clone());
    }
    if !h.contains_key(header::USER_AGENT) {
        h.insert(
            header::USER_AGENT,
            HeaderValue::from_static(GO_USER_AGENT_H1),
        );
    }
    let closes = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("close"));
    if close && !closes {
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(req)
}

fn request_h2(
    host: &str,
    target: &str,
    headers: &HeaderMap,
) -> Result<http::Request<Empty<bytes::Bytes>>, Error> {
    let uri = format!("https://{host}{target}");
    let mut req = http::Request::builder()
        .method(http::Method::GET)
        .uri(&uri)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|source| Error::Request {
            target: uri.clone(),
            source,
        })?;
    let h = req.headers_mut();
    for (k, v) in headers {
        if CONNECTION_HEADERS.contains(&k.as_str())
            || (k == header::TE && v.as_bytes() != b"trailers")
        {
            continue;
        }
        h.append(k, v.clone());
    }
    if !h.contains_key(header::USER_AGENT) {
        h.insert(
            header::USER_AGENT,
            HeaderValue::from_static(GO_USER_AGENT_H2),
        );
    }
    Ok(req)
}
