//! Merged metrics: the agent's own registry, then Envoy's 15090 text (streamed, capped), then
//! the application's targets (each capped, scraped in parallel). A failing part never fails the
//! response; it counts in `scrape_failures_total{type}`. The answer's format is the app's
//! (`format.rs`): an OpenMetrics app's `# EOF` ends the merged text, as in Istio's agent; a
//! scraper that accepts gzip or zstd gets it compressed (`compress.rs`).
//!
//! A scrape is bounded whatever the peers do: every read (Envoy's, each app's, body included)
//! ends at a deadline (the scrape timeout: the apps' from the start, Envoy's after them, so a
//! stalled app does not take Envoy's share) and with the scrape itself (the client gone, its
//! connection evicted, shutdown); compressing and merging megabytes runs on the blocking pool, a few jobs
//! at a time ([`off_thread`]).

mod compress;
mod format;

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;
use tokio::time::Instant;

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

/// The longest a scrape runs, whatever its `X-Prometheus-Scrape-Timeout-Seconds` says.
pub const MAX_SCRAPE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a scrape may run: the scraper's `X-Prometheus-Scrape-Timeout-Seconds`, at most
/// [`MAX_SCRAPE_TIMEOUT`]; 10 s without one.
pub(super) fn scrape_timeout(headers: &http::HeaderMap) -> Duration {
    headers
        .get("x-prometheus-scrape-timeout-seconds")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 3600.0)
        .map(|s| Duration::from_secs_f64(s).min(MAX_SCRAPE_TIMEOUT))
        .unwrap_or(Duration::from_secs(10))
}

/// Blocking-pool jobs (compressing, merging) running at once for every scrape together.
const OFF_THREAD_JOBS: usize = 2;
static OFF_THREAD: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(OFF_THREAD_JOBS);

/// Runs `f` on the blocking pool, at most [`OFF_THREAD_JOBS`] at once: compressing or merging
/// megabytes holds a thread for tens of milliseconds, which must not be a runtime thread that
/// probes are answered on. `None`: the job panicked.
pub(super) async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let _permit = OFF_THREAD.acquire().await.ok()?;
    tokio::task::spawn_blocking(f).await.ok()
}

/// App answers merged on the blocking pool from this total size on.
const MERGE_OFF_THREAD: usize = 256 << 10;

/// One app target's metrics: its `Content-Type` and body, read whole by `deadline`.
async fn read_app(
    port: u16,
    path: &str,
    headers: &http::HeaderMap,
    accept: &str,
    deadline: Instant,
) -> Result<(Option<String>, Vec<u8>), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let read = async {
        let left = deadline.saturating_duration_since(Instant::now());
        let resp = get(addr, path, headers, accept, left).await?;
        if resp.status() != http::StatusCode::OK {
            return Err(format!("{addr}{path}: status {}", resp.status()));
        }
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        match super::probe::read_capped(resp.into_body(), TARGET_CAP)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(b) => Ok((content_type, b.to_vec())),
            None => Err(format!("{addr}{path}: body larger than {TARGET_CAP} bytes")),
        }
    };
    // The whole read, body included: an app that sends its head and then stalls is cut too.
    tokio::time::timeout_at(deadline, read)
        .await
        .map_err(|_| format!("{addr}{path}: no whole answer within the scrape timeout"))?
}

/// The apps' answers as one text: one target's as it came; several lose their `# EOF`, and the
/// merged text gets one at its end when it is OpenMetrics.
fn merge_apps(mut bodies: Vec<(Option<String>, Vec<u8>)>, content_type: &str) -> Vec<u8> {
    if bodies.len() == 1 {
        return bodies.pop().map(|(_, b)| b).unwrap_or_default();
    }
    let mut text = Vec::with_capacity(bodies.iter().map(|(_, b)| b.len() + 1).sum::<usize>() + 6);
    for (_, body) in &bodies {
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
}

/// Builds the merged response; the body is streamed through a bounded channel.
///
/// Every outbound read has a deadline ([`scrape_timeout`]: the apps' from the scrape's start,
/// Envoy's from the apps' end) and is cancelled with the scrape: the apps are read inside this
/// future (dropped when the client goes, or when the connection is evicted for a newer one),
/// Envoy's text is relayed by a task that ends when the client's body is dropped, at its
/// deadline, or at shutdown.
pub async fn merged(inputs: &Inputs, req: http::Request<Incoming>) -> http::Response<Body> {
    inputs.metrics.scrapes.inc();
    let headers = req.headers().clone();
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let timeout = scrape_timeout(&headers);
    let deadline = Instant::now() + timeout;
    // Not for HEAD, as Istio's gzip handler (nginx once mishandled a gzipped HEAD answer).
    let head = req.method() == http::Method::HEAD;
    let coding = (!head).then(|| compress::choose(&headers)).flatten();
    let agent = agent_text(inputs);

    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let envoy_accept = format::allowed_content_types(accept.as_deref(), format::ENVOY_TYPES);
    let app_accept = format::allowed_content_types(accept.as_deref(), format::APP_TYPES);
    // The apps first, in parallel: their formats make the answer's `Content-Type`.
    let (app_text, content_type) = scrape_apps(inputs, &headers, &app_accept, deadline).await;

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

    let (tx, rx) = mpsc::channel::<Result<Frame<bytes::Bytes>, std::io::Error>>(4);
    let relay = relay(RelayInputs {
        tx: tx.clone(),
        agent,
        envoy: inputs.envoy_prometheus,
        path: format!("/stats/prometheus{query}"),
        headers,
        accept: envoy_accept,
        // Its own deadline: an app that stalls to the end of its own does not take Envoy's.
        deadline: Instant::now() + timeout,
        app_text,
        metrics: inputs.metrics.clone(),
    });
    let shutdown = inputs.shutdown.token().clone();
    tokio::spawn(async move {
        tokio::select! {
            // The client is gone (its body dropped): Envoy's read goes with it.
            _ = tx.closed() => {}
            _ = shutdown.cancelled() => {}
            _ = relay => {}
        }
    });

    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut resp = http::Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    match coding {
        Some(coding) => compress::compress(resp, coding, inputs.shutdown.token().clone()).await,
        None => resp,
    }
}

/// The agent's own metrics as text.
fn agent_text(inputs: &Inputs) -> Vec<u8> {
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &inputs.registry) {
        tracing::warn!(error = %e, "encoding agent metrics failed");
        inputs.metrics.failure("agent");
    }
    normalise(text.into_bytes())
}

/// Reads every app target in parallel (each by the scrape's `deadline`) and merges their
/// answers; the content type is the one their formats negotiate.
async fn scrape_apps(
    inputs: &Inputs,
    headers: &http::HeaderMap,
    accept: &str,
    deadline: Instant,
) -> (Vec<u8>, &'static str) {
    let apps: &[(u16, String)] = inputs
        .app_metrics
        .as_ref()
        .map_or(&[], |a| a.targets.as_slice());
    let answers = futures::future::join_all(
        apps.iter()
            .map(|(port, path)| read_app(*port, path, headers, accept, deadline)),
    )
    .await;
    let mut app_bodies = Vec::new();
    for answer in answers {
        match answer {
            Ok(answer) => app_bodies.push(answer),
            Err(e) => {
                tracing::debug!(error = %e, "scraping the application failed");
                inputs.metrics.failure("application");
            }
        }
    }
    let content_type = format::negotiate_many(app_bodies.iter().map(|(ct, _)| ct.as_deref()));
    let app_text = if app_bodies.len() > 1
        && app_bodies.iter().map(|(_, b)| b.len()).sum::<usize>() >= MERGE_OFF_THREAD
    {
        off_thread(move || merge_apps(app_bodies, content_type))
            .await
            .unwrap_or_default()
    } else {
        merge_apps(app_bodies, content_type)
    };
    (app_text, content_type)
}

/// What the body's relay sends, in order.
struct RelayInputs {
    tx: mpsc::Sender<Result<Frame<bytes::Bytes>, std::io::Error>>,
    agent: Vec<u8>,
    /// Envoy's prometheus listener, when its stats are merged.
    envoy: Option<SocketAddr>,
    /// Envoy's path, with the scraper's query.
    path: String,
    headers: http::HeaderMap,
    accept: String,
    deadline: Instant,
    app_text: Vec<u8>,
    metrics: super::Metrics,
}

/// Sends the agent's text, Envoy's (streamed, whole lines only, capped, by the deadline), then
/// the apps'.
async fn relay(r: RelayInputs) {
    let RelayInputs {
        tx,
        agent,
        envoy,
        path,
        headers,
        accept,
        deadline,
        app_text,
        metrics,
    } = r;
    if tx.send(Ok(Frame::data(agent.into()))).await.is_err() {
        return;
    }
    if let Some(addr) = envoy {
        let left = deadline.saturating_duration_since(Instant::now());
        match get(addr, &path, &headers, &accept, left).await {
            Ok(resp) => {
                if !relay_lines(resp.into_body(), &tx, deadline, &metrics).await {
                    return;
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
}

/// Relays Envoy's text, whole lines only, until it ends, passes [`TARGET_CAP`] or the
/// deadline. False when the client is gone.
async fn relay_lines(
    mut body: Incoming,
    tx: &mpsc::Sender<Result<Frame<bytes::Bytes>, std::io::Error>>,
    deadline: Instant,
    metrics: &super::Metrics,
) -> bool {
    let mut sent = 0usize;
    // Only whole lines go out: the text after a frame's last newline waits for the
    // next frame, and is dropped when the stream is cut (the cap, an error, the
    // deadline): a partial line would fail the whole scrape.
    let mut partial = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
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
                if tx.send(Ok(Frame::data(lines))).await.is_err() {
                    return false;
                }
            }
            Ok(None) => {
                // The stream ended whole: its last line, with a newline.
                if !partial.is_empty() {
                    partial.extend_from_slice(b"\n");
                    let last = partial.split().freeze();
                    if tx.send(Ok(Frame::data(last))).await.is_err() {
                        return false;
                    }
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
