//! The one HTTP/1.1 client of the agent's local endpoints (Envoy's admin API, the app's
//! metrics, the ports `pilot-agent wait` and `request` talk to): one connection per request,
//! over TCP or a Unix socket (Envoy's admin with `PROXY_LIFECYCLE_LOCKDOWN`), the whole exchange
//! bounded by a timeout, errors typed.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use tokio::io::{AsyncRead, AsyncWrite};

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `host:port`.
    Tcp(String),
    /// A Unix stream socket's path.
    Unix(PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(a) => f.write_str(a),
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<&str> for Target {
    fn from(addr: &str) -> Self {
        Target::Tcp(addr.to_string())
    }
}

/// What went wrong with a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connect {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("HTTP/1.1 with {addr}: {source}")]
    Http { addr: String, source: hyper::Error },
    #[error("{addr}{path}: timed out after {timeout:?}")]
    Timeout {
        addr: String,
        path: String,
        timeout: Duration,
    },
    #[error("reading the response of {addr}: {reason}")]
    Body { addr: String, reason: String },
}

/// Sends `req` to `addr` (`host:port`) on a fresh connection; the response's body is left to
/// the caller (streamed). The connection, request and response head are bounded by `timeout`.
pub async fn send<B>(
    addr: &str,
    req: http::Request<B>,
    timeout: Duration,
) -> Result<http::Response<Incoming>, Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    send_to(&Target::from(addr), req, timeout).await
}

/// [`send`] to a TCP address or a Unix socket.
pub async fn send_to<B>(
    target: &Target,
    req: http::Request<B>,
    timeout: Duration,
) -> Result<http::Response<Incoming>, Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let addr = target.to_string();
    let path = req.uri().to_string();
    let exchange = async {
        let connect = |source| Error::Connect {
            addr: addr.clone(),
            source,
        };
        match target {
            Target::Tcp(a) => {
                let stream = tokio::net::TcpStream::connect(a).await.map_err(connect)?;
                exchange(stream, req, &addr).await
            }
            Target::Unix(p) => {
                let stream = proto::uds::connect(p).await.map_err(connect)?;
                exchange(stream, req, &addr).await
            }
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Error::Timeout {
            addr: addr.clone(),
            path,
            timeout,
        })?
}

/// [`send`] on a stream the caller connected (a TLS stream, say), within `timeout`.
pub async fn send_on<S, B>(
    stream: S,
    req: http::Request<B>,
    addr: &str,
    timeout: Duration,
) -> Result<http::Response<Incoming>, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().to_string();
    tokio::time::timeout(timeout, exchange(stream, req, addr))
        .await
        .map_err(|_| Error::Timeout {
            addr: addr.to_string(),
            path,
            timeout,
        })?
}

/// One request on a connected stream.
async fn exchange<S, B>(
    stream: S,
    req: http::Request<B>,
    addr: &str,
) -> Result<http::Response<Incoming>, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let http = |source| Error::Http {
        addr: addr.to_string(),
        source,
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(http)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(http)
}

/// [`send`] to a TCP address or a Unix socket, then the whole body (at most `cap` bytes) within
/// the same `timeout`.
pub async fn fetch_from<B>(
    target: &Target,
    req: http::Request<B>,
    cap: usize,
    timeout: Duration,
) -> Result<(u16, bytes::Bytes), Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let addr = target.to_string();
    let path = req.uri().to_string();
    let whole = async {
        let resp = send_to(target, req, timeout).await?;
        let status = resp.status().as_u16();
        let body = http_body_util::Limited::new(resp.into_body(), cap)
            .collect()
            .await
            .map_err(|e| Error::Body {
                addr: addr.clone(),
                reason: e.to_string(),
            })?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, whole)
        .await
        .map_err(|_| Error::Timeout {
            addr: addr.clone(),
            path,
            timeout,
        })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;

    fn get(path: &str) -> http::Request<Empty<bytes::Bytes>> {
        http::Request::builder()
            .uri(path)
            .header(http::header::HOST, "x")
            .body(Empty::new())
            .unwrap()
    }

    #[tokio::test]
    async fn fetches_caps_and_says_what_failed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            // First connection: 200 with 10 bytes. Second: accepted, never answered.
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789")
                .await
                .unwrap();
            let (_held, _) = listener.accept().await.unwrap();
            let (_held2, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
        });
        let (status, body) = fetch_from(
            &Target::from(addr.as_str()),
            get("/a"),
            64,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!((status, &body[..]), (200, &b"0123456789"[..]));
        let e = fetch_from(
            &Target::from(addr.as_str()),
            get("/slow"),
            64,
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("/slow"), "{e}");
        let e = fetch_from(
            &Target::from("127.0.0.1:1"),
            get("/"),
            64,
            Duration::from_secs(2),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, Error::Connect { .. }), "{e}");
    }

    #[tokio::test]
    async fn speaks_http1_over_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"GET /ready HTTP/1.1\r\n"));
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nLIVE")
                .await
                .unwrap();
        });
        let target = Target::Unix(path.clone());
        let (status, body) = fetch_from(&target, get("/ready"), 64, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!((status, &body[..]), (200, &b"LIVE"[..]));
        let e = fetch_from(
            &Target::Unix(dir.path().join("none")),
            get("/"),
            64,
            Duration::from_secs(2),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("unix:"), "{e}");
    }
}
