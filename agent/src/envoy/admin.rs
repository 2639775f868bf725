//! A small HTTP/1.1 client for Envoy's admin API: on localhost TCP (Istio's), or on the Unix
//! socket in the proxy's directory with `PROXY_LIFECYCLE_LOCKDOWN`.

use std::time::Duration;

use http_body_util::Empty;

use crate::http1::Target;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Request(#[source] http::Error),
    /// The Unix socket refused the agent's uid.
    #[error(
        "Envoy admin: {0} (the socket is 0600, owned by Envoy's uid: an agent running as root \
         beside Envoy as 1337 needs CAP_DAC_OVERRIDE)"
    )]
    SocketPermission(#[source] crate::http1::Error),
    #[error("Envoy admin: {0}")]
    Fetch(#[source] crate::http1::Error),
    #[error("{path}: HTTP {status}")]
    Status { path: String, status: u16 },
}

/// Envoy's admin endpoint.
#[derive(Debug, Clone)]
pub struct Admin {
    pub addr: Target,
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
    ) -> Result<(u16, String), Error> {
        // A Unix socket has no authority; Envoy's admin ignores the host.
        let host = match &self.addr {
            Target::Tcp(a) => a.as_str(),
            Target::Unix(_) => "localhost",
        };
        let req = http::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(http::header::HOST, host)
            .body(Empty::<bytes::Bytes>::new())
            .map_err(Error::Request)?;
        let (status, body) = crate::http1::fetch_from(&self.addr, req, 16 << 20, timeout)
            .await
            .map_err(|e| match &e {
                crate::http1::Error::Connect { source, .. }
                    if matches!(self.addr, Target::Unix(_))
                        && source.kind() == std::io::ErrorKind::PermissionDenied =>
                {
                    Error::SocketPermission(e)
                }
                _ => Error::Fetch(e),
            })?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// `GET /stats?usedonly&filter=<re>` parsed into `(name, value)` pairs.
    pub async fn stats(
        &self,
        filter: &str,
        timeout: Duration,
    ) -> Result<Vec<(String, String)>, Error> {
        let path = format!("/stats?usedonly&filter={}", encode_query(filter));
        let (status, body) = self.request(http::Method::GET, &path, timeout).await?;
        if status != 200 {
            return Err(Error::Status { path, status });
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
