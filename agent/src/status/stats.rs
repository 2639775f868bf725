//! Merged metrics: the agent's own registry, then Envoy's 15090 text (streamed, capped), then
//! the application's targets (each capped, scraped in parallel). A failing part never fails the
//! response; it counts in `scrape_failures_total{type}`. The targets are asked for what the
//! scraper accepts (`negotiate.rs`; the answer is OpenMetrics when the apps answered it) and
//! the answer is compressed when the scraper asks (`compress.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;

use super::{Body, Inputs};

mod compress;
mod negotiate;

/// Each scraped target is capped at this size.
pub const TARGET_CAP: usize = 10 << 20;

/// Strips OpenMetrics' `# EOF` and makes sure the text ends with a newline.
pub(super) fn normalise(mut text: Vec<u8>) -> Vec<u8> {
    if let Some(pos) = find_eof(&text) {
        text.truncate(pos);
    }
    if !text.is_empty() && text.last() != Some(&b'\n') {
        text.push(b'\n');
    }
    text
}

fn find_eof(text: &[u8]) -> Option<usize> {
    let needle = b"# EOF";
    let mut start = 0;
    while let Some(i) = text[start..]
        .windows(needle.len())
        .position(|w| w == needle)
    {
        let at = start + i;
        if at == 0 || text[at - 1] == b'\n' {
            return Some(at);
        }
        start = at + 1;
    }
    None
}

/// Opens `GET http://addr/path[?query]` asking for `accept`; anything but 200 is an error.
async fn get(
    addr: SocketAddr,
    path_and_query: &str,
    accept: &str,
    headers: &http::HeaderMap,
    timeout: Duration,
) -> Result<http::Response<Incoming>, String> {
    let mut req = http::Request::builder()
        .uri(path_and_query)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::ACCEPT, accept)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    for name in [
        http::header::USER_AGENT,
        http::HeaderName::from_static("x-prometheus-scrape-timeout-seconds"),
    ] {
        if let Some(v) = headers.get(&name) {
            req.headers_mut().insert(name, v.clone());
        }
    }
    let resp = crate::http1::send(&addr.to_string(), req, timeout)
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!(
            "{addr}{path_and_query}: status code {}",
            resp.status().as_u16()
        ));
    }
    Ok(resp)
}

pub(super) fn scrape_timeout(headers: &http::HeaderMap) -> Duration {
    headers
        .get("x-prometheus-scrape-timeout-seconds")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 3600.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(10))
}

/// One app target's answer: its body (capped, `# EOF` stripped) and `Content-Type`.
struct AppAnswer {
    body: Vec<u8>,
    content_type: Option<String>,
}

/// Scrapes one app target.
async fn scrape_app(
    port: u16,
    path: String,
    accept: String,
    headers: http::HeaderMap,
    timeout: Duration,
) -> Result<AppAnswer, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let resp = get(addr, &path, &accept, &headers, timeout).await?;
    let content_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let read = super::probe::read_capped(resp.into_body(), TARGET_CAP);
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(Some(b))) => Ok(AppAnswer {
            body: normalise(b.to_vec()),
            content_type,
        }),
        Ok(Ok(None)) => Err(format!("{addr}{path}: body larger than {TARGET_CAP} bytes")),
        Ok(Err(e)) => Err(format!("{addr}{path}: {e}")),
        Err(_) => Err(format!("{addr}{path}: timed out after {timeout:?}")),
    }
}

/// Where the merged body goes: the response's channel, through the compressor when the
/// scraper asked for one.
struct Out {
    tx: mpsc::Sender<Result<Frame<bytes::Bytes>, std::io::Error>>,
    encoder: Option<compress::Encoder>,
}

impl Out {
    /// Sends `data`; `false` when the scraper has gone (or compression failed).
    async fn send(&mut self, data: bytes::Bytes) -> bool {
        let data = match &mut self.encoder {
            None => data,
            Some(e) => match e.push(&data) {
                Ok(d) if d.is_empty() => return true,
                Ok(d) => d,
                Err(e) => {
                    let _ = self.tx.send(Err(e)).await;
                    return false;
                }
            },
        };
        self.tx.send(Ok(Frame::data(data))).await.is_ok()
    }

    async fn finish(self) {
        if let Some(e) = self.encoder {
            let last = e.finish();
            let _ = self.tx.send(last.map(Frame::data)).await;
        }
    }
}

/// Builds the merged response: the app targets are scraped (in parallel, with Envoy's answer
/// opened beside them) before the headers go out, since the answer's format is the apps';
/// then the body is streamed through a bounded channel: the agent's metrics, Envoy's, the
/// apps', and OpenMetrics' `# EOF` when that is the format.
pub async fn merged(inputs: &Inputs, req: http::Request<Incoming>) -> http::Response<Body> {
    inputs.metrics.scrapes.inc();
    let headers = req.headers().clone();
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let timeout = scrape_timeout(&headers);
    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let coding = compress::choose(
        headers
            .get(http::header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );

    let mut agent_text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut agent_text, &inputs.registry) {
        tracing::warn!(error = %e, "encoding agent metrics failed");
        inputs.metrics.failure("agent");
    }
    let agent = normalise(agent_text.into_bytes());

    let app_accept = negotiate::target_accept(accept, negotiate::APP_TYPES);
    let app_tasks: Vec<_> = inputs
        .app_metrics
        .as_ref()
        .map(|a| a.targets.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|(port, path)| {
            tokio::spawn(scrape_app(
                port,
                path,
                app_accept.clone(),
                headers.clone(),
                timeout,
            ))
        })
        .collect();
    let envoy_accept = negotiate::target_accept(accept, negotiate::ENVOY_TYPES);
    let envoy = async {
        match inputs.envoy_prometheus {
            Some(addr) => Some(
                get(
                    addr,
                    &format!("/stats/prometheus{query}"),
                    &envoy_accept,
                    &headers,
                    timeout,
                )
                .await,
            ),
            None => None,
        }
    };
    let apps = futures::future::join_all(app_tasks);
    let (envoy, apps) = tokio::join!(envoy, apps);

    let metrics = inputs.metrics.clone();
    let apps: Vec<AppAnswer> = apps
        .into_iter()
        .filter_map(|r| match r {
            Ok(Ok(a)) => Some(a),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "scraping the application failed");
                metrics.failure("application");
                None
            }
            Err(_) => {
                metrics.failure("application");
                None
            }
        })
        .collect();
    let format = negotiate::merged_format(apps.iter().map(|a| a.content_type.as_deref()));

    let (tx, rx) = mpsc::channel::<Result<Frame<bytes::Bytes>, std::io::Error>>(4);
    let encoder = match coding.map(compress::Encoder::new).transpose() {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %e, "starting the compressor failed; answering uncompressed");
            None
        }
    };
    let coding = encoder.as_ref().and(coding);
    let mut out = Out { tx, encoder };
    tokio::spawn(async move {
        if !out.send(agent.into()).await {
            return;
        }
        let open = match envoy {
            Some(Ok(resp)) => stream_envoy(resp.into_body(), &mut out, timeout, &metrics).await,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "scraping Envoy failed");
                metrics.failure("envoy");
                true
            }
            None => true,
        };
        if !open {
            return;
        }
        for app in apps {
            if !out.send(app.body.into()).await {
                return;
            }
        }
        if negotiate::is_openmetrics(format) && !out.send(EOF.into()).await {
            return;
        }
        out.finish().await;
    });

    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut resp = http::Response::new(StreamBody::new(stream).boxed());
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(format),
    );
    if let Some(c) = coding {
        h.insert(
            http::header::CONTENT_ENCODING,
            http::HeaderValue::from_static(c.name()),
        );
    }
    // The answer depends on the scraper's Accept-Encoding.
    h.insert(
        http::header::VARY,
        http::HeaderValue::from_static("Accept-Encoding"),
    );
    resp
}

/// OpenMetrics' terminator, written once after every part.
const EOF: &[u8] = b"# EOF\n";

/// Streams Envoy's text, whole lines only: the text after a frame's last newline waits for
/// the next frame, and is dropped when the stream is cut (the cap, an error, a timeout): a
/// partial line would fail the whole scrape. `false` when the scraper has gone.
async fn stream_envoy(
    mut body: Incoming,
    out: &mut Out,
    timeout: Duration,
    metrics: &super::Metrics,
) -> bool {
    let mut sent = 0usize;
    let mut partial = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout(timeout, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                sent += data.len();
                if sent > TARGET_CAP {
                    metrics.failure("envoy");
                    return true;
                }
                partial.extend_from_slice(&data);
                let Some(end) = partial.iter().rposition(|b| *b == b'\n') else {
                    continue;
                };
                let lines = partial.split_to(end + 1).freeze();
                if !out.send(lines).await {
                    return false;
                }
            }
            Ok(None) => {
                // The stream ended whole: its last line, with a newline.
                if !partial.is_empty() {
                    partial.extend_from_slice(b"\n");
                    return out.send(partial.split().freeze()).await;
                }
                return true;
            }
            Ok(Some(Err(e))) => {
                tracing::debug!(error = %e, "envoy stats stream failed");
                metrics.failure("envoy");
                return true;
            }
            Err(_) => {
                metrics.failure("envoy");
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eof_is_stripped_and_newline_added() {
        assert_eq!(normalise(b"a 1\n# EOF\n".to_vec()), b"a 1\n");
        assert_eq!(normalise(b"a 1".to_vec()), b"a 1\n");
        assert_eq!(
            normalise(b"x{l=\"# EOF\"} 1\n".to_vec()),
            b"x{l=\"# EOF\"} 1\n"
        );
        assert_eq!(normalise(Vec::new()), b"");
    }
}
