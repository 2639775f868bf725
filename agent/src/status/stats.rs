//! Merged metrics: the agent's own registry, then Envoy's 15090 text (streamed, capped), then
//! the application's targets (each capped, scraped in parallel). A failing part never fails the
//! response; it counts in `scrape_failures_total{type}`. The answer's format is the app's
//! (`format.rs`): an OpenMetrics app's `# EOF` ends the merged text, as in Istio's agent; a
//! scraper that accepts gzip or zstd gets it compressed (`compress.rs`).

mod compress;
mod format;

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;

use super::{Body, Inputs};

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

/// Opens `GET http://addr/path[?query]` asking for `accept`, and returns the response.
async fn get(
    addr: SocketAddr,
    path_and_query: &str,
    headers: &http::HeaderMap,
    accept: &str,
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
    // A scraper that names itself not: Istio's agent's client names itself (as for probes).
    if !headers.contains_key(http::header::USER_AGENT) {
        req.headers_mut().insert(
            http::header::USER_AGENT,
            http::HeaderValue::from_static("Go-http-client/1.1"),
        );
    }
    crate::http1::send(&addr.to_string(), req, timeout)
        .await
        .map_err(|e| e.to_string())
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

/// Builds the merged response; the body is streamed through a bounded channel.
pub async fn merged(inputs: &Inputs, req: http::Request<Incoming>) -> http::Response<Body> {
    inputs.metrics.scrapes.inc();
    let headers = req.headers().clone();
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let timeout = scrape_timeout(&headers);
    // Not for HEAD, as Istio's gzip handler (nginx once mishandled a gzipped HEAD answer).
    let head = req.method() == http::Method::HEAD;
    let coding = (!head).then(|| compress::choose(&headers)).flatten();

    let mut agent_text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut agent_text, &inputs.registry) {
        tracing::warn!(error = %e, "encoding agent metrics failed");
        inputs.metrics.failure("agent");
    }
    let agent = normalise(agent_text.into_bytes());

    let (tx, rx) = mpsc::channel::<Result<Frame<bytes::Bytes>, std::io::Error>>(4);
    let envoy = inputs.envoy_prometheus;
    let apps: Vec<(u16, String)> = inputs
        .app_metrics
        .as_ref()
        .map(|a| a.targets.clone())
        .unwrap_or_default();
    let metrics = inputs.metrics.clone();
    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let envoy_accept = format::allowed_content_types(accept.as_deref(), format::ENVOY_TYPES);
    let app_accept = format::allowed_content_types(accept.as_deref(), format::APP_TYPES);

    // The apps first, in parallel: their formats make the answer's `Content-Type`.
    let single = apps.len() == 1;
    let app_tasks: Vec<_> = apps
        .into_iter()
        .map(|(port, path)| {
            let (headers, accept) = (headers.clone(), app_accept.clone());
            tokio::spawn(async move {
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                let resp = get(addr, &path, &headers, &accept, timeout).await?;
                if resp.status() != http::StatusCode::OK {
                    return Err(format!("{addr}{path}: status {}", resp.status()));
                }
                let content_type = resp
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                match super::probe::read_capped(resp.into_body(), TARGET_CAP).await? {
                    Some(b) => Ok((content_type, b.to_vec())),
                    None => Err(format!("{addr}{path}: body larger than {TARGET_CAP} bytes")),
                }
            })
        })
        .collect();
    let mut app_bodies = Vec::new();
    for task in app_tasks {
        match task.await {
            Ok(Ok(answer)) => app_bodies.push(answer),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "scraping the application failed");
                metrics.failure("application");
            }
            Err(_) => metrics.failure("application"),
        }
    }
    let content_type = format::negotiate_many(app_bodies.iter().map(|(ct, _)| ct.as_deref()));
    // One target's answer goes out as it came; several lose their `# EOF`, and the merged
    // text gets one at its end when it is OpenMetrics.
    let app_text: Vec<u8> = if single {
        app_bodies.into_iter().flat_map(|(_, b)| b).collect()
    } else {
        let mut text = Vec::new();
        for (_, body) in &app_bodies {
            let body = format::strip_eof(body);
            text.extend_from_slice(body);
            if !body.is_empty() && !body.ends_with(b"\n") {
                text.push(b'\n');
            }
        }
        if content_type != format::TEXT {
            text.extend_from_slice(b"# EOF\n");
        }
        text
    };

    // A HEAD answer has no body: Envoy is not asked for one (the apps were, for the type).
    if head {
        let mut resp = http::Response::new(
            Empty::<bytes::Bytes>::new()
                .map_err(|never| match never {})
                .boxed(),
        );
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        return resp;
    }

    tokio::spawn(async move {
        if tx.send(Ok(Frame::data(agent.into()))).await.is_err() {
            return;
        }
        if let Some(addr) = envoy {
            match get(
                addr,
                &format!("/stats/prometheus{query}"),
                &headers,
                &envoy_accept,
                timeout,
            )
            .await
            {
                Ok(resp) => {
                    let mut body = resp.into_body();
                    let mut sent = 0usize;
                    // Only whole lines go out: the text after a frame's last newline waits
                    // for the next frame, and is dropped when the stream is cut (the cap, an
                    // error, a timeout): a partial line would fail the whole scrape.
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
                                    break;
                                }
                                partial.extend_from_slice(&data);
                                let Some(end) = partial.iter().rposition(|b| *b == b'\n') else {
                                    continue;
                                };
                                let lines = partial.split_to(end + 1).freeze();
                                if tx.send(Ok(Frame::data(lines))).await.is_err() {
                                    return;
                                }
                            }
                            Ok(None) => {
                                // The stream ended whole: its last line, with a newline.
                                if !partial.is_empty() {
                                    partial.extend_from_slice(b"\n");
                                    let last = partial.split().freeze();
                                    if tx.send(Ok(Frame::data(last))).await.is_err() {
                                        return;
                                    }
                                }
                                break;
                            }
                            Ok(Some(Err(e))) => {
                                tracing::debug!(error = %e, "envoy stats stream failed");
                                metrics.failure("envoy");
                                break;
                            }
                            Err(_) => {
                                metrics.failure("envoy");
                                break;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "scraping Envoy failed");
                    metrics.failure("envoy");
                }
            }
        }
        if !app_text.is_empty() {
            let _ = tx.send(Ok(Frame::data(app_text.into()))).await;
        }
    });

    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut resp = http::Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    match coding {
        Some(coding) => compress::compress(resp, coding).await,
        None => resp,
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
