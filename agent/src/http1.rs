//! The one HTTP/1.1 client of the agent's local endpoints (Envoy's admin API, the app's
//! metrics, the ports `pilot-agent wait` and `request` talk to): one connection per request,
//! the whole exchange bounded by a timeout, errors typed.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};

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
    let path = req.uri().to_string();
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| Error::Connect {
                addr: addr.to_string(),
                source,
            })?;
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
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Error::Timeout {
            addr: addr.to_string(),
            path,
            timeout,
        })?
}

/// [`send`], then the whole body (at most `cap` bytes) within the same `timeout`.
pub async fn fetch<B>(
    addr: &str,
    req: http::Request<B>,
    cap: usize,
    timeout: Duration,
) -> Result<(u16, bytes::Bytes), Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().to_string();
    let whole = async {
        let resp = send(addr, req, timeout).await?;
        let status = resp.status().as_u16();
        let body = http_body_util::Limited::new(resp.into_body(), cap)
            .collect()
            .await
            .map_err(|e| Error::Body {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, whole)
        .await
        .map_err(|_| Error::Timeout {
            addr: addr.to_string(),
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
        let (status, body) = fetch(&addr, get("/a"), 64, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!((status, &body[..]), (200, &b"0123456789"[..]));
        let e = fetch(&addr, get("/slow"), 64, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("/slow"), "{e}");
        let e = fetch("127.0.0.1:1", get("/"), 64, Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Connect { .. }), "{e}");
    }
}
