//! `pilot-agent wait` and `pilot-agent request`: small HTTP clients against the local Envoy and
//! status ports.

use std::path::Path;
use std::time::{Duration, Instant};

use http_body_util::Full;

use crate::cli::{RequestArgs, WaitArgs};
use crate::http1::Target;

/// Why `wait` or `request` failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unsupported URL {0:?}: expected http://host:port/path")]
    Url(String),
    #[error("invalid method {0:?}")]
    Method(String),
    #[error(transparent)]
    Request(#[from] http::Error),
    #[error(transparent)]
    Fetch(#[from] crate::http1::Error),
    /// An answer other than the one `wait` waits for.
    #[error("HTTP status code {0}")]
    NotOk(u16),
    #[error("timeout waiting for Envoy proxy to become ready. Last error: {last}")]
    NotReady { last: Box<Error> },
    #[error("received unsuccessful status code {status}: {body}")]
    Status { status: u16, body: String },
}

/// Splits `http://host:port/path` into `(host:port, /path)`.
fn split_url(url: &str) -> Result<(String, String), Error> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::Url(url.to_string()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let authority = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.to_string()))
}

/// Sends one request; returns status and body.
pub async fn send(
    method: &str,
    url: &str,
    body: Option<String>,
    timeout: Duration,
) -> Result<(u16, String), Error> {
    let (authority, path) = split_url(url)?;
    send_to(
        &Target::Tcp(authority.clone()),
        &authority,
        method,
        &path,
        body,
        timeout,
    )
    .await
}

/// [`send`] to `target`, with `authority` as the `Host`.
async fn send_to(
    target: &Target,
    authority: &str,
    method: &str,
    path: &str,
    body: Option<String>,
    timeout: Duration,
) -> Result<(u16, String), Error> {
    let method = http::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
        .map_err(|_| Error::Method(method.to_string()))?;
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, authority)
        .body(Full::new(bytes::Bytes::from(body.unwrap_or_default())))?;
    let (status, body) = crate::http1::fetch_from(target, req, 64 << 20, timeout).await?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Polls `url` until it answers 200.
pub async fn wait(args: &WaitArgs) -> Result<(), Error> {
    let deadline = Instant::now() + args.timeout;
    loop {
        let last = match send("GET", &args.url, None, args.request_timeout).await {
            Ok((200, _)) => return Ok(()),
            Ok((status, _)) => Error::NotOk(status),
            Err(e) => e,
        };
        if Instant::now() + args.period > deadline {
            return Err(Error::NotReady {
                last: Box::new(last),
            });
        }
        tokio::time::sleep(args.period).await;
    }
}

/// Envoy's admin socket with `PROXY_LIFECYCLE_LOCKDOWN`, relative to the proxy container's
/// working directory (the default `configPath`, `./etc/istio/proxy`).
const LOCKDOWN_ADMIN_SOCKET: &str = "./etc/istio/proxy/admin.sock";

/// `pilot-agent request`: returns the body; fails above 399 except 404. Requests for Envoy's
/// admin port (15000) go to the admin socket when lockdown put it there.
pub async fn request(args: &RequestArgs) -> Result<String, Error> {
    request_in(args, Path::new(LOCKDOWN_ADMIN_SOCKET)).await
}

async fn request_in(args: &RequestArgs, admin_socket: &Path) -> Result<String, Error> {
    let authority = format!("localhost:{}", args.debug_port);
    let target = if args.debug_port == 15000 && admin_socket.exists() {
        Target::Unix(admin_socket.to_path_buf())
    } else {
        Target::Tcp(authority.clone())
    };
    let path = format!("/{}", args.path.trim_start_matches('/'));
    let (status, body) = send_to(
        &target,
        &authority,
        &args.method,
        &path,
        args.body.clone(),
        Duration::from_secs(60),
    )
    .await?;
    if status > 399 && status != 404 {
        return Err(Error::Status { status, body });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            split_url("http://localhost:15021/healthz/ready").unwrap(),
            ("localhost:15021".into(), "/healthz/ready".into())
        );
        assert_eq!(split_url("http://h").unwrap(), ("h:80".into(), "/".into()));
        assert!(split_url("https://h/").is_err());
    }

    #[tokio::test]
    async fn wait_times_out_with_last_error() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let err = wait(&WaitArgs {
            timeout: Duration::from_millis(300),
            request_timeout: Duration::from_millis(100),
            period: Duration::from_millis(50),
            url: format!("http://127.0.0.1:{port}/healthz/ready"),
        })
        .await
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("timeout waiting for Envoy proxy to become ready. Last error:"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn request_to_the_admin_port_uses_the_lockdown_socket_when_there() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("admin.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            let body = head.lines().next().unwrap_or("").to_string();
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(resp.as_bytes()).await.unwrap();
        });
        let args = |port| RequestArgs {
            debug_port: port,
            method: "GET".into(),
            path: "config_dump".into(),
            body: None,
        };
        assert_eq!(
            request_in(&args(15000), &sock).await.unwrap(),
            "GET /config_dump HTTP/1.1"
        );
        // Another port, or no socket: TCP as Istio (nothing listens on 15004 here).
        let e = request_in(&args(15004), &sock).await.unwrap_err();
        assert!(e.to_string().contains("localhost:15004"), "{e}");
    }
}
