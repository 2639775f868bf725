//! Fetching over HTTP(S): one capped GET to an address that passed the SSRF check (HTTPS
//! verified against the system's roots unless the host is in `WASM_INSECURE_REGISTRIES`), and Istio's
//! HTTP module fetch on top (retries on connection errors and retryable 5xx with exponential
//! backoff; a gzip or tar body is unpacked to the Wasm binary inside).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};

use super::{Error, Options};

/// Why one GET gave no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum FetchError {
    #[error("scheme {scheme} is not supported for Wasm fetches")]
    Scheme { scheme: String },
    #[error("URL without a host")]
    NoHost,
    #[error("resolving {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("{host} has no address")]
    NoAddress { host: String },
    #[error(
        "connection blocked: {ip} is link-local, multicast, unspecified or a cloud metadata address"
    )]
    AlwaysBlocked { ip: IpAddr },
    #[error("connection blocked: {ip} is in blocked CIDR range {net}/{bits}")]
    BlockedCidr { ip: IpAddr, net: IpAddr, bits: u8 },
    #[error("no system root certificates to verify the server with")]
    NoRoots,
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    #[error(transparent)]
    Request(#[from] http::Error),
    #[error("server name {host}: {source}")]
    ServerName {
        host: String,
        source: rustls_pki_types::InvalidDnsNameError,
    },
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("connecting to {addr} timed out")]
    ConnectTimeout { addr: SocketAddr },
    /// A TLS handshake answered by a plain-HTTP server (the registry fallback's cue).
    #[error("the server answered the TLS handshake with plain HTTP")]
    PlainHttpAnswer,
    #[error("TLS handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Send(#[from] crate::http1::Error),
    #[error("reading the body timed out after {0:?}")]
    BodyTimeout(Duration),
    #[error("body larger than {0} bytes")]
    BodyTooLarge(usize),
    #[error(transparent)]
    Body(Box<dyn std::error::Error + Send + Sync>),
}

impl FetchError {
    /// Whether no retry can change the answer: the address is blocked or the scheme unknown.
    fn is_final(&self) -> bool {
        matches!(
            self,
            FetchError::AlwaysBlocked { .. }
                | FetchError::BlockedCidr { .. }
                | FetchError::Scheme { .. }
        )
    }
}

/// Addresses never fetched from, whatever `BLOCKED_CIDRS_IN_WASM_FETCH` says: link-local
/// unicast (cloud metadata at 169.254.169.254; fe80::/10), link-local multicast (224.0.0.0/24,
/// ff02::/16), the unspecified address, and the metadata services outside link-local (AWS's
/// IPv6 fd00:ec2::/32, Alibaba's 100.100.100.200). Istio's release-1.31 Wasm fetch has no
/// such filter; these are the ranges its registry bearer-realm check and its platform
/// metadata clients name, with multicast added.
const ALWAYS_BLOCKED: &[(IpAddr, u8)] = &[
    (IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)), 16),
    (IpAddr::V4(Ipv4Addr::new(224, 0, 0, 0)), 24),
    (IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)), 32),
    (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 32),
    (IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10),
    (IpAddr::V6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0)), 16),
    (
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0)),
        32,
    ),
    (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 128),
];

/// An address as the filter judges it: IPv4-mapped (`::ffff:a.b.c.d`) and IPv4-compatible
/// (`::a.b.c.d`, deprecated but still routed to the IPv4 address by some stacks) IPv6
/// addresses become their IPv4 address, so one IPv4 range covers both spellings. `::` and
/// `::1` stay IPv6.
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let bits = u128::from(v6);
            if bits >> 32 == 0 && bits > 1 {
                return IpAddr::V4(Ipv4Addr::from(u32::try_from(bits).unwrap_or(0)));
            }
            ip
        }
        IpAddr::V4(_) => ip,
    }
}

/// A CIDR as the filter applies it: an IPv4-mapped or -compatible IPv6 range of /96 or
/// longer is the IPv4 range it spells, so a configured range blocks both families' spellings.
pub(super) fn canonical_cidr((net, bits): (IpAddr, u8)) -> (IpAddr, u8) {
    match (net, canonical(net)) {
        (IpAddr::V6(_), IpAddr::V4(v4)) if bits >= 96 => (IpAddr::V4(v4), bits - 96),
        _ => (net, bits),
    }
}

/// Whether `ip` is in `cidr`, spelled as given or as the IPv4 address both may stand for.
pub(super) fn in_cidr(ip: IpAddr, cidr: (IpAddr, u8)) -> bool {
    contains(ip, cidr) || contains(canonical(ip), canonical_cidr(cidr))
}

fn contains(ip: IpAddr, cidr: (IpAddr, u8)) -> bool {
    match (ip, cidr) {
        (IpAddr::V4(a), (IpAddr::V4(n), bits)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(bits.min(32)))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), (IpAddr::V6(n), bits)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(bits.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Why `ip` may not be fetched from, if it may not.
pub(super) fn blocked(opts: &Options, ip: IpAddr) -> Option<FetchError> {
    let ip = canonical(ip);
    if ALWAYS_BLOCKED.iter().any(|c| in_cidr(ip, *c)) {
        return Some(FetchError::AlwaysBlocked { ip });
    }
    opts.blocked_cidrs
        .iter()
        .find(|c| in_cidr(ip, **c))
        .map(|&(net, bits)| FetchError::BlockedCidr { ip, net, bits })
}

/// The first resolved address of `host:port` that may be fetched from: the address dialled,
/// so a name cannot resolve to one address for the check and another for the connection.
async fn resolve(opts: &Options, host: &str, port: u16) -> Result<SocketAddr, FetchError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| FetchError::Resolve {
            host: host.into(),
            source,
        })?
        .collect();
    let mut refused = None;
    for a in addrs {
        match blocked(opts, a.ip()) {
            Some(why) => refused = Some(why),
            None => return Ok(a),
        }
    }
    Err(refused.unwrap_or_else(|| FetchError::NoAddress { host: host.into() }))
}

/// A TLS client for Wasm fetches: the system's roots, or no verification for a host in
/// `WASM_INSECURE_REGISTRIES`.
fn tls_config(insecure: bool) -> Result<std::sync::Arc<rustls::ClientConfig>, FetchError> {
    if insecure {
        return Ok(crate::status::probe::tls::insecure_client_config(vec![]));
    }
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(FetchError::NoRoots);
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// One GET over HTTP or HTTPS: status, headers and body (at most `cap` bytes). Redirects are
/// not followed (a 3xx is the answer).
pub(super) async fn get(
    opts: &Options,
    url: &url::Url,
    accept: Option<&str>,
    cap: u64,
) -> Result<(http::StatusCode, http::HeaderMap, bytes::Bytes), FetchError> {
    let https = match url.scheme() {
        "http" => false,
        "https" => true,
        other => {
            return Err(FetchError::Scheme {
                scheme: other.into(),
            });
        }
    };
    let host = url.host_str().ok_or(FetchError::NoHost)?;
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
    let req = req.body(Empty::<bytes::Bytes>::new())?;
    let resp = if https {
        let stream = connect_tls(opts, url, host, addr).await?;
        crate::http1::send_on(stream, req, &addr.to_string(), opts.http_timeout).await?
    } else {
        crate::http1::send_to(
            &crate::http1::Target::Tcp(addr.to_string()),
            req,
            opts.http_timeout,
        )
        .await?
    };
    let (parts, body) = resp.into_parts();
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    let body = tokio::time::timeout(opts.http_timeout, Limited::new(body, cap).collect())
        .await
        .map_err(|_| FetchError::BodyTimeout(opts.http_timeout))?
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                FetchError::BodyTooLarge(cap)
            } else {
                FetchError::Body(e)
            }
        })?
        .to_bytes();
    Ok((parts.status, parts.headers, body))
}

/// A TLS connection to `addr` for `host`, verified unless `WASM_INSECURE_REGISTRIES` names
/// it; a server answering in plain HTTP is [`FetchError::PlainHttpAnswer`].
async fn connect_tls(
    opts: &Options,
    url: &url::Url,
    host: &str,
    addr: SocketAddr,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, FetchError> {
    let config = tls_config(opts.insecure(host, url.port()))?;
    let name = rustls_pki_types::ServerName::try_from(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
    )
    .map_err(|source| FetchError::ServerName {
        host: host.into(),
        source,
    })?;
    let tls = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| FetchError::Connect { addr, source })?;
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|source| {
                if source.to_string().contains("InvalidContentType") {
                    FetchError::PlainHttpAnswer
                } else {
                    FetchError::Handshake { addr, source }
                }
            })
    };
    tokio::time::timeout(opts.http_timeout, tls)
        .await
        .map_err(|_| FetchError::ConnectTimeout { addr })?
}

/// Istio's retryable codes: 5xx but 501, 505 and 511.
fn retryable(code: u16) -> bool {
    code >= 500 && !matches!(code, 501 | 505 | 511)
}

/// Fetches a module's body over HTTP (Istio's `HTTPFetcher`); unpacking is the cache's.
pub(super) async fn http(opts: &Options, url: &str) -> Result<bytes::Bytes, Error> {
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
        match get(opts, &parsed, None, opts.max_binary_size).await {
            Ok((status, _, body)) if status == http::StatusCode::OK => return Ok(body),
            Ok((status, _, _)) => {
                last = format!("status code {}", status.as_u16());
                if !retryable(status.as_u16()) {
                    return Err(fail(format!(
                        "failed after {attempt} attempts, last error: {last}"
                    )));
                }
            }
            Err(e) if e.is_final() => return Err(fail(e.to_string())),
            Err(e) => last = e.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_in_ipv6_is_judged_as_ipv4() {
        assert_eq!(
            canonical(ip("::ffff:169.254.169.254")),
            ip("169.254.169.254")
        );
        assert_eq!(canonical(ip("::169.254.169.254")), ip("169.254.169.254"));
        assert_eq!(canonical(ip("::1")), ip("::1"));
        assert_eq!(canonical(ip("::")), ip("::"));
        assert_eq!(canonical(ip("2001:db8::1")), ip("2001:db8::1"));
    }

    #[test]
    fn always_blocked_ranges() {
        let opts = Options::new("/nonexistent".into());
        for blocked_ip in [
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "::169.254.169.254",
            "169.254.0.1",
            "100.100.100.200",
            "224.0.0.251",
            "0.0.0.0",
            "fe80::1",
            "fd00:ec2::254",
            "fd00:ec2:1::1",
            "ff02::fb",
            "::",
        ] {
            assert!(blocked(&opts, ip(blocked_ip)).is_some(), "{blocked_ip}");
        }
        for allowed in [
            "127.0.0.1",
            "::1",
            "10.0.0.1",
            "fd00:ec3::1",
            "224.0.1.1",
            "ff05::1",
        ] {
            assert!(blocked(&opts, ip(allowed)).is_none(), "{allowed}");
        }
    }

    /// A configured CIDR blocks both families' spellings of its addresses.
    #[test]
    fn configured_ranges_apply_to_both_families() {
        let mut opts = Options::new("/nonexistent".into());
        opts.blocked_cidrs = vec![(ip("10.0.0.0"), 8), (ip("::ffff:192.168.0.0"), 112)];
        for b in [
            "10.1.2.3",
            "::ffff:10.1.2.3",
            "::10.1.2.3",
            "192.168.4.5",
            "::ffff:192.168.9.9",
        ] {
            assert!(blocked(&opts, ip(b)).is_some(), "{b}");
        }
        for a in ["11.0.0.1", "192.169.0.1", "2001:db8::10:0:0:1"] {
            assert!(blocked(&opts, ip(a)).is_none(), "{a}");
        }
        assert_eq!(
            canonical_cidr((ip("::ffff:192.168.0.0"), 112)),
            (ip("192.168.0.0"), 16)
        );
        assert_eq!(canonical_cidr((ip("fd00::"), 8)), (ip("fd00::"), 8));
    }
}
