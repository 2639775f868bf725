//! The metadata servers' client: one request on a fresh connection, HTTP (the metadata
//! servers) or HTTPS (Google's Compute API), bounded by the request's own timeout and by the
//! platform's deadline, whichever comes first, the connection by 2 s (Google's client's dial
//! timeout) within that; the body capped.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use tokio::time::Instant;

use super::Error;

/// Bigger answers are refused (Azure's instance document is a few KiB).
const MAX_BODY: usize = 1 << 20;
/// The bound on opening a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// An answer: status, headers and body.
pub(super) struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
}

impl Answer {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request.
pub(super) struct Request<'a> {
    pub method: http::Method,
    pub url: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    /// The request's own bound (connection, head and body).
    pub timeout: Duration,
}

impl<'a> Request<'a> {
    pub fn get(url: &'a str, headers: &'a [(&'a str, &'a str)], timeout: Duration) -> Self {
        Request {
            method: http::Method::GET,
            url,
            headers,
            timeout,
        }
    }
}

/// Sends `req`; any status is an answer.
pub(super) async fn send(req: &Request<'_>, deadline: Instant) -> Result<Answer, Error> {
    let failed = |reason: String, transient: bool| Error::Request {
        url: req.url.to_string(),
        reason,
        transient,
    };
    let fail = |reason: String| failed(reason, false);
    let client = |e: crate::http1::Error| {
        let transient = transient(&e);
        failed(e.to_string(), transient)
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(fail("no time left".into()));
    }
    let timeout = req.timeout.min(left);
    let url = url::Url::parse(req.url).map_err(|e| fail(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(fail(format!("scheme {} is not supported", url.scheme())));
    }
    let host = url.host_str().ok_or_else(|| fail("no host".into()))?;
    let port = url.port_or_known_default().unwrap_or(80);
    let addr = format!("{host}:{port}");
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let mut builder = http::Request::builder()
        .method(req.method.clone())
        .uri(path)
        .header(http::header::HOST, authority);
    for (k, v) in req.headers {
        builder = builder.header(*k, *v);
    }
    let request = builder
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| fail(e.to_string()))?;
    let exchange = async {
        let connect = tokio::time::timeout(
            CONNECT_TIMEOUT.min(timeout),
            tokio::net::TcpStream::connect(&addr),
        );
        let tcp = match connect.await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => {
                return Err(client(crate::http1::Error::Connect {
                    addr: addr.clone(),
                    source: e,
                }));
            }
            Err(_) => return Err(failed(format!("connect {addr}: timed out"), true)),
        };
        let resp = if url.scheme() == "https" {
            let stream = tls_connect(req.url, host, tcp).await?;
            crate::http1::send_on(stream, request, &addr, timeout).await
        } else {
            crate::http1::send_on(tcp, request, &addr, timeout).await
        }
        .map_err(client)?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| failed(e.to_string(), true))?
            .to_bytes();
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| failed(format!("timed out after {timeout:?}"), true))?
}

/// What Google's client retries: a timeout, a refused or reset connection, an answer cut short.
fn transient(e: &crate::http1::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        crate::http1::Error::Connect { source, .. } => matches!(
            source.kind(),
            ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset
        ),
        crate::http1::Error::Http { source, .. } => {
            source.is_incomplete_message() || source.is_timeout()
        }
        crate::http1::Error::Timeout { .. } | crate::http1::Error::Body { .. } => true,
    }
}

/// Sends `req`; an answer other than 200 is an error.
pub(super) async fn ok(req: &Request<'_>, deadline: Instant) -> Result<Answer, Error> {
    let answer = send(req, deadline).await?;
    if answer.status != 200 {
        return Err(Error::Status {
            url: req.url.to_string(),
            status: answer.status,
        });
    }
    Ok(answer)
}

/// TLS on `tcp` for `url`, the server verified for `host` against the system's roots.
async fn tls_connect(
    url: &str,
    host: &str,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Error> {
    let fail = |reason: String| Error::Request {
        url: url.to_string(),
        reason,
        transient: false,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(fail(
            "no system root certificates to verify the server with".into(),
        ));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
    )
    .map_err(|e| fail(format!("server name {host}: {e}")))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| fail(format!("TLS handshake with {host}: {e}")))
}
