//! Fetching over HTTP(S): one capped GET to an address that passed the SSRF check (HTTPS
//! verified against the system's roots unless the host is in `WASM_INSECURE_REGISTRIES`), and Istio's
//! HTTP module fetch on top (retries on connection errors and retryable 5xx with exponential
//! backoff; a gzip or tar body is unpacked to the Wasm binary inside).

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};

use super::{Error, Options, is_wasm};

/// Addresses never fetched from: link-local (cloud metadata at 169.254.169.254, fe80::/10) and
/// the metadata services outside it (Alibaba's 100.100.100.200, AWS's fd00:ec2::254).
fn always_blocked(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.octets() == [100, 100, 100, 200],
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6 == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
        }
    }
}

fn in_cidr(ip: IpAddr, (net, bits): (IpAddr, u8)) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(bits.min(32)))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(bits.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The first resolved address of `host:port` that may be fetched from.
async fn resolve(opts: &Options, host: &str, port: u16) -> Result<SocketAddr, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("resolving {host}: {e}"))?
        .collect();
    let mut refused = None;
    for a in addrs {
        let ip = a.ip();
        if always_blocked(ip) {
            refused = Some(format!(
                "connection blocked: {ip} is link-local or a cloud metadata address"
            ));
            continue;
        }
        if let Some(c) = opts.blocked_cidrs.iter().find(|c| in_cidr(ip, **c)) {
            refused = Some(format!(
                "connection blocked: {ip} is in blocked CIDR range {}/{}",
                c.0, c.1
            ));
            continue;
        }
        return Ok(a);
    }
    Err(refused.unwrap_or_else(|| format!("{host} has no address")))
}

/// A TLS client for Wasm fetches: the system's roots, or no verification for a host in
/// `WASM_INSECURE_REGISTRIES`.
fn tls_config(insecure: bool) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    if insecure {
        return Ok(crate::status::probe::tls::insecure_client_config(vec![]));
    }
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err("no system root certificates to verify the server with".into());
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// A TLS handshake answered by a plain-HTTP server (the registry fallback's cue).
pub(super) const PLAIN_HTTP_ANSWER: &str = "the server answered the TLS handshake with plain HTTP";

/// One GET over HTTP or HTTPS: status, headers and body (at most `opts.max_binary_size`
/// bytes).
pub(super) async fn get(
    opts: &Options,
    url: &url::Url,
    accept: Option<&str>,
) -> Result<(http::StatusCode, http::HeaderMap, bytes::Bytes), String> {
    let https = match url.scheme() {
        "http" => false,
        "https" => true,
        other => return Err(format!("scheme {other} is not supported for Wasm fetches")),
    };
    let host = url.host_str().ok_or("URL without a host")?;
    let port = url.port_or_known_default().unwrap_or(80);
    let addr = resolve(opts, host, port).await?;
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path = format!("{path}?{q}");
    }
    let mut req = http::Request::builder().uri(path).header(
        http::header::HOST,
        match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        },
    );
    if let Some(a) = accept {
        req = req.header(http::header::ACCEPT, a);
    }
    let req = req
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = if https {
        let config = tls_config(opts.insecure(host, url.port()))?;
        let name = rustls_pki_types::ServerName::try_from(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        )
        .map_err(|e| format!("server name {host}: {e}"))?;
        let tls = async {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| {
                    if e.to_string().contains("InvalidContentType") {
                        PLAIN_HTTP_ANSWER.to_string()
                    } else {
                        format!("TLS handshake with {addr}: {e}")
                    }
                })
        };
        let stream = tokio::time::timeout(opts.http_timeout, tls)
            .await
            .map_err(|_| format!("connecting to {addr} timed out"))??;
        crate::http1::send_on(stream, req, &addr.to_string(), opts.http_timeout)
            .await
            .map_err(|e| e.to_string())?
    } else {
        crate::http1::send_to(
            &crate::http1::Target::Tcp(addr.to_string()),
            req,
            opts.http_timeout,
        )
        .await
        .map_err(|e| e.to_string())?
    };
    let (parts, body) = resp.into_parts();
    let cap = usize::try_from(opts.max_binary_size).unwrap_or(usize::MAX);
    let body = tokio::time::timeout(opts.http_timeout, Limited::new(body, cap).collect())
        .await
        .map_err(|_| format!("reading the body timed out after {:?}", opts.http_timeout))?
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                format!("body larger than {cap} bytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES)")
            } else {
                e.to_string()
            }
        })?
        .to_bytes();
    Ok((parts.status, parts.headers, body))
}

/// Istio's retryable codes: 5xx but 501, 505 and 511.
fn retryable(code: u16) -> bool {
    code >= 500 && !matches!(code, 501 | 505 | 511)
}

/// Fetches a module over HTTP (Istio's `HTTPFetcher`).
pub(super) async fn http(opts: &Options, url: &str) -> Result<Vec<u8>, Error> {
    let fail = |reason: String| Error::Fetch {
        url: url.to_string(),
        reason,
    };
    let parsed = url::Url::parse(url).map_err(|e| Error::Url {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    let mut backoff = Duration::from_millis(500);
    let mut last = String::new();
    let attempts = opts.http_max_retries.max(1);
    for attempt in 1..=attempts {
        match get(opts, &parsed, None).await {
            Ok((status, _, body)) if status == http::StatusCode::OK => {
                return Ok(unbox(body.to_vec(), opts.max_binary_size));
            }
            Ok((status, _, _)) => {
                last = format!("status code {}", status.as_u16());
                if !retryable(status.as_u16()) {
                    return Err(fail(format!(
                        "failed after {attempt} attempts, last error: {last}"
                    )));
                }
            }
            Err(e) if e.starts_with("connection blocked") || e.contains("is not supported") => {
                return Err(fail(e));
            }
            Err(e) => last = e,
        }
        if attempt < attempts {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    }
    Err(fail(format!(
        "failed after {attempts} attempts, last error: {last}"
    )))
}

fn is_gzip(b: &[u8]) -> bool {
    b.len() > 2 && b.starts_with(&[0x1f, 0x8b])
}

fn is_tar(b: &[u8]) -> bool {
    b.len() > 262 && &b[257..262] == b"ustar"
}

/// Unpacks gzip and tar (first file) layers around a Wasm binary, as Istio's fetcher does;
/// anything else, or an unpacking that fails, is returned as it came.
pub(super) fn unbox(origin: Vec<u8>, cap: u64) -> Vec<u8> {
    let mut b = origin.clone();
    for _ in 0..8 {
        if is_wasm(&b) {
            return b;
        }
        let next = if is_gzip(&b) {
            gunzip(&b, cap)
        } else if is_tar(&b) {
            tar_file(&b, |_| true)
        } else {
            None
        };
        match next {
            Some(n) => b = n,
            None => return origin,
        }
    }
    origin
}

pub(super) fn gunzip(b: &[u8], cap: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .take(cap)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// The content of the first regular file in a tar archive that `wanted` accepts.
pub(super) fn tar_file(b: &[u8], wanted: impl Fn(&str) -> bool) -> Option<Vec<u8>> {
    let mut at = 0;
    while at + 512 <= b.len() {
        let h = &b[at..at + 512];
        if h.iter().all(|x| *x == 0) {
            return None;
        }
        let name_end = h[..100].iter().position(|x| *x == 0).unwrap_or(100);
        let mut name = String::from_utf8_lossy(&h[..name_end]).into_owned();
        if &h[257..262] == b"ustar" {
            let prefix_end = h[345..500].iter().position(|x| *x == 0).unwrap_or(155);
            if prefix_end > 0 {
                name = format!(
                    "{}/{name}",
                    String::from_utf8_lossy(&h[345..345 + prefix_end])
                );
            }
        }
        let size_text = String::from_utf8_lossy(&h[124..136]);
        let size =
            usize::from_str_radix(size_text.trim_matches(|c: char| c == '\0' || c == ' '), 8)
                .ok()?;
        let start = at + 512;
        let end = start.checked_add(size)?;
        if end > b.len() {
            return None;
        }
        let kind = h[156];
        if (kind == b'0' || kind == 0) && wanted(name.trim_start_matches("./")) {
            return Some(b[start..end].to_vec());
        }
        at = start + size.div_ceil(512) * 512;
    }
    None
}
