//! `pilot-agent wait` and `pilot-agent request`: small HTTP clients against the local Envoy and
//! status ports.

use std::time::{Duration, Instant};

use http_body_util::Full;

use crate::cli::{RequestArgs, WaitArgs};

/// Splits `http://host:port/path` into `(host:port, /path)`.
fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("unsupported URL {url:?}: expected http://host:port/path"))?;
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
) -> Result<(u16, String), String> {
    let (authority, path) = split_url(url)?;
    let method = http::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("invalid method {method:?}"))?;
    let req = http::Request::builder()
        .method(method)
        .uri(&path)
        .header(http::header::HOST, &authority)
        .body(Full::new(bytes::Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let (status, body) = crate::http1::fetch(&authority, req, 64 << 20, timeout)
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Polls `url` until it answers 200.
pub async fn wait(args: &WaitArgs) -> Result<(), String> {
    let deadline = Instant::now() + args.timeout;
    loop {
        let last = match send("GET", &args.url, None, args.request_timeout).await {
            Ok((200, _)) => return Ok(()),
            Ok((status, _)) => format!("HTTP status code {status}"),
            Err(e) => e,
        };
        if Instant::now() + args.period > deadline {
            return Err(format!(
                "timeout waiting for Envoy proxy to become ready. Last error: {last}"
            ));
        }
        tokio::time::sleep(args.period).await;
    }
}

/// `pilot-agent request`: returns the body; fails above 399 except 404.
pub async fn request(args: &RequestArgs) -> Result<String, String> {
    let url = format!(
        "http://localhost:{}/{}",
        args.debug_port,
        args.path.trim_start_matches('/')
    );
    let (status, body) = send(
        &args.method,
        &url,
        args.body.clone(),
        Duration::from_secs(60),
    )
    .await?;
    if status > 399 && status != 404 {
        return Err(format!(
            "received unsuccessful status code {status}: {body}"
        ));
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
            err.starts_with("timeout waiting for Envoy proxy to become ready. Last error:"),
            "{err}"
        );
    }
}
