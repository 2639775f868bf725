//! HTTP probes, sent as Istio's Go agent sends them: a fresh connection per request
//! (`Connection: close`), HTTPS without certificate verification offering `h2` and `http/1.1`
//! over ALPN (HTTP/2 when the app picks it), plain HTTP always HTTP/1.1 (no h2c), and
//! redirects followed the way the kubelet follows them: to the same host only, at most ten
//! requests in all.

use std::sync::{Arc, OnceLock};

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
) -> Result<(u16, bytes::Bytes), String> {
    let head = follow(prober, req);
    let resp = match deadline {
        Some(d) => tokio::time::timeout_at(d, head)
            .await
            .map_err(|_| "timed out awaiting headers".to_string())??,
        None => head.await?,
    };
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    let read = read_capped_prefix(resp.into_body(), cap, &mut body);
    match deadline {
        // What arrived before the deadline is kept.
        Some(d) => {
            let _ = tokio::time::timeout_at(d, read).await;
        }
        None => read.await,
    }
    Ok((status, bytes::Bytes::from(body)))
}

/// Reads at most `cap` bytes into `out`; a read error ends the body where it is.
async fn read_capped_prefix(mut body: Incoming, cap: usize, out: &mut Vec<u8>) {
    while out.len() < cap {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = (cap - out.len()).min(data.len());
                    out.extend_from_slice(&data[..take]);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
}

fn is_followed_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

async fn follow(prober: &Prober, req: Request) -> Result<http::Response<Incoming>, String> {
    let scheme = if req.https { "https" } else { "http" };
    let authority = super::join_host_port(&prober.destination.to_string(), req.port);
    let first = url::Url::parse(&format!("{scheme}://{authority}{}", req.path))
        .map_err(|e| format!("bad probe URL {scheme}://{authority}{}: {e}", req.path))?;
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
            .map_err(|_| "failed to parse Location header: not ASCII".to_string())?
            .to_string();
        let next = current
            .join(&location)
            .map_err(|e| format!("failed to parse Location header {location:?}: {e}"))?;
        // Somewhere else: the redirect itself is the answer (a success for the kubelet).
        if next.host_str() != first.host_str() {
            return Ok(resp);
        }
        if sent >= MAX_REQUESTS {
            return Err(format!("stopped after {MAX_REQUESTS} redirects"));
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
) -> Result<http::Response<Incoming>, String> {
    let https = match url.scheme() {
        "http" => false,
        "https" => true,
        other => return Err(format!("unsupported protocol scheme {other:?}")),
    };
    let port = url.port_or_known_default().unwrap_or(80);
    let stream = prober.connect(port).await.map_err(|e| e.to_string())?;
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let host = host.unwrap_or(authority).to_string();
    if https {
        let server_name = match url.host() {
            Some(url::Host::Domain(d)) => rustls_pki_types::ServerName::try_from(d.to_string())
                .map_err(|e| format!("TLS server name {d:?}: {e}"))?,
            Some(url::Host::Ipv4(ip)) => rustls_pki_types::ServerName::IpAddress(ip.into()),
            Some(url::Host::Ipv6(ip)) => rustls_pki_types::ServerName::IpAddress(ip.into()),
            None => return Err(format!("no host in {url}")),
        };
        let tls = tokio_rustls::TlsConnector::from(tls_config(req.offer_h2))
            .connect(server_name, stream)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = hyper_util::rt::TokioIo::new(tls);
        if h2 {
            send_h2(io, &host, &target, headers).await
        } else {
            send_h1(io, &host, &target, headers).await
        }
    } else {
        send_h1(
            hyper_util::rt::TokioIo::new(stream),
            &host,
            &target,
            headers,
        )
        .await
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

async fn send_h1<IO>(
    io: IO,
    host: &str,
    target: &str,
    headers: &HeaderMap,
) -> Result<http::Response<Incoming>, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::builder()
        .method(http::Method::GET)
        .uri(target)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| format!("bad probe request {target:?}: {e}"))?;
    let h = req.headers_mut();
    h.insert(
        header::HOST,
        HeaderValue::from_str(host).map_err(|e| format!("bad Host {host:?}: {e}"))?,
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
    if !closes {
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
    }
    sender.send_request(req).await.map_err(|e| e.to_string())
}

async fn send_h2<IO>(
    io: IO,
    host: &str,
    target: &str,
    headers: &HeaderMap,
) -> Result<http::Response<Incoming>, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(io)
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let uri = format!("https://{host}{target}");
    let mut req = http::Request::builder()
        .method(http::Method::GET)
        .uri(&uri)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| format!("bad probe request {uri:?}: {e}"))?;
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
    sender.send_request(req).await.map_err(|e| e.to_string())
}
