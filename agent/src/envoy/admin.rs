//! A small HTTP/1.1 client for Envoy's admin API on localhost.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};

/// Envoy's admin endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Admin {
    pub addr: SocketAddr,
}

/// Percent-encodes a query value (Envoy's stats filters carry regex characters).
pub fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Admin {
    /// Sends `method path` and returns the status and body (capped at 16 MiB).
    pub async fn request(
        &self,
        method: http::Method,
        path_and_query: &str,
        timeout: Duration,
    ) -> Result<(u16, String), String> {
        tokio::time::timeout(timeout, self.request_inner(method, path_and_query))
            .await
            .map_err(|_| format!("{path_and_query}: timed out after {timeout:?}"))?
    }

    async fn request_inner(
        &self,
        method: http::Method,
        path_and_query: &str,
    ) -> Result<(u16, String), String> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect to Envoy admin {}: {e}", self.addr))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(http::header::HOST, self.addr.to_string())
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = http_body_util::Limited::new(resp.into_body(), 16 << 20)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// `GET /stats?usedonly&filter=<re>` parsed into `(name, value)` pairs.
    pub async fn stats(
        &self,
        filter: &str,
        timeout: Duration,
    ) -> Result<Vec<(String, String)>, String> {
        let path = format!("/stats?usedonly&filter={}", encode_query(filter));
        let (status, body) = self.request(http::Method::GET, &path, timeout).await?;
        if status != 200 {
            return Err(format!("{path}: HTTP {status}"));
        }
        Ok(parse_stats(&body))
    }
}

/// Parses Envoy's plain `/stats` text (`name: value` per line).
pub fn parse_stats(body: &str) -> Vec<(String, String)> {
    body.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}
