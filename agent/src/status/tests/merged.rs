//! The merged `/stats/prometheus`: format negotiation with the apps, several targets with
//! their cap and failure counter, and compressed answers.

use std::io::Read;

use http_body_util::{BodyExt, Empty};

use super::*;
use crate::status::stats::TARGET_CAP;

/// What Prometheus 3 sends when scraping (protobuf first, then OpenMetrics, then text).
const PROMETHEUS_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,\
    application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
    application/openmetrics-text;version=0.0.1;q=0.4,\
    text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,\
    text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
const OM_1: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An app's metrics endpoint: answers every request with `status`, `content_type` and `body`
/// and records the request heads.
async fn metrics_app(
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_w = seen.clone();
    let body = Arc::new(body);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (seen, body) = (seen_w.clone(), body.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).to_string());
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
            });
        }
    });
    (port, seen)
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Scrapes the merged metrics with `headers`; returns the answer's headers and body bytes.
async fn scrape(addr: SocketAddr, headers: &[(&str, &str)]) -> (http::HeaderMap, Vec<u8>) {
    let mut req = http::Request::builder()
        .uri("/stats/prometheus")
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Empty::<bytes::Bytes>::new()).unwrap();
    let resp = crate::http1::send(&addr.to_string(), req, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (headers, body.to_vec())
}

fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> &'a str {
    headers.get(name).map(|v| v.to_str().unwrap()).unwrap_or("")
}

/// The `Accept` header a fake saw in its last request.
fn accept_seen(seen: &Mutex<Vec<String>>) -> String {
    let seen = seen.lock().unwrap();
    let req = seen.last().expect("a request");
    req.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("accept")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn apps_answering_openmetrics_make_an_openmetrics_answer_with_one_eof() {
    let (a, a_seen) = metrics_app(
        200,
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        b"# TYPE a counter\na_total 1\n# EOF\n".to_vec(),
    )
    .await;
    let (b, _) = metrics_app(
        200,
        "application/openmetrics-text; version=1.0.0",
        b"b_total 2\n# EOF".to_vec(),
    )
    .await;
    let s = setup_locked(
        CONFIG_OK,
        LIVE,
        None,
        conn::Limits::default(),
        None,
        None,
        vec![(a, "/metrics".into()), (b, "/stats".into())],
    )
    .await;

    let (headers, body) = scrape(s.addr, &[("accept", PROMETHEUS_ACCEPT)]).await;
    let body = String::from_utf8(body).unwrap();
    assert_eq!(header(&headers, "content-type"), OM_1);
    // The app is asked for OpenMetrics, Envoy for text only.
    assert_eq!(
        accept_seen(&a_seen),
        "application/openmetrics-text; escaping=allow-utf-8; q=0.4; version=1.0.0,\
         application/openmetrics-text; q=0.3; version=0.0.1,\
         text/plain; escaping=allow-utf-8; q=0.2; version=1.0.0,\
         text/plain; q=0.1; version=0.0.4"
    );
    assert_eq!(
        accept_seen(&s.prom_seen),
        "text/plain; escaping=allow-utf-8; q=0.2; version=1.0.0,text/plain; q=0.1; version=0.0.4"
    );
    // Both apps, in target order after Envoy, and one terminator at the very end.
    let (env, pa, pb) = (
        body.find("envoy_up 1\n").expect("envoy"),
        body.find("a_total 1\n").expect("app a"),
        body.find("b_total 2\n").expect("app b"),
    );
    assert!(env < pa && pa < pb, "{body}");
    assert_eq!(body.matches("# EOF").count(), 1, "{body}");
    assert!(body.ends_with("b_total 2\n# EOF\n"), "{body}");

    // A scraper that asks for text only gets text, and so does the app's request.
    let (headers, body) = scrape(s.addr, &[("accept", "text/plain;version=0.0.4")]).await;
    assert_eq!(accept_seen(&a_seen), "text/plain; q=0.1; version=0.0.4");
    // (The fake answers OpenMetrics regardless: the answer follows what the app said.)
    assert_eq!(header(&headers, "content-type"), OM_1);
    assert!(String::from_utf8(body).unwrap().ends_with("# EOF\n"));
}

#[tokio::test]
async fn apps_disagreeing_on_the_format_make_a_text_answer_without_eof() {
    let (a, _) = metrics_app(
        200,
        "application/openmetrics-text; version=0.0.1",
        b"a_total 1\n# EOF\n".to_vec(),
    )
    .await;
    let (b, _) = metrics_app(200, "text/plain; version=0.0.4", b"b_total 2\n".to_vec()).await;
    let s = setup_locked(
        CONFIG_OK,
        LIVE,
        None,
        conn::Limits::default(),
        None,
        None,
        vec![(a, "/metrics".into()), (b, "/metrics".into())],
    )
    .await;
    let (headers, body) = scrape(s.addr, &[("accept", PROMETHEUS_ACCEPT)]).await;
    let body = String::from_utf8(body).unwrap();
    assert_eq!(header(&headers, "content-type"), TEXT);
    assert!(!body.contains("# EOF"), "{body}");
    assert!(
        body.contains("a_total 1\n") && body.contains("b_total 2\n"),
        "{body}"
    );
}

/// Several targets: each is capped at 10 MiB, a non-200 or unreachable target is dropped, and
/// every dropped target counts in `scrape_failures_total{type="application"}`.
#[tokio::test]
async fn each_target_is_capped_and_its_failures_counted() {
    let (good, _) = metrics_app(200, "text/plain", b"good_total 1\n".to_vec()).await;
    let mut big = Vec::with_capacity(TARGET_CAP + 64);
    while big.len() <= TARGET_CAP {
        big.extend_from_slice(b"big_total 1\n");
    }
    let (over, _) = metrics_app(200, "text/plain", big).await;
    let mut at_cap = b"at_cap_total 1\n".to_vec();
    at_cap.resize(TARGET_CAP - 1, b'#');
    at_cap.push(b'\n');
    let (exact, _) = metrics_app(200, "text/plain", at_cap).await;
    let (missing, _) = metrics_app(404, "text/plain", b"not_metrics 1\n".to_vec()).await;
    let closed = closed_port().await;
    let s = setup_locked(
        CONFIG_OK,
        LIVE,
        None,
        conn::Limits::default(),
        None,
        None,
        vec![
            (over, "/metrics".into()),
            (good, "/metrics".into()),
            (missing, "/metrics".into()),
            (closed, "/metrics".into()),
            (exact, "/metrics".into()),
        ],
    )
    .await;
    let (headers, body) = scrape(s.addr, &[]).await;
    let body = String::from_utf8(body).unwrap();
    assert_eq!(header(&headers, "content-type"), TEXT);
    assert!(body.contains("good_total 1\n"), "the good target");
    assert!(
        body.contains("at_cap_total 1\n"),
        "a body of exactly the cap"
    );
    assert!(
        !body.contains("big_total"),
        "the body over the cap is dropped"
    );
    assert!(!body.contains("not_metrics"), "a 404 answer is not metrics");
    let (_, body) = scrape(s.addr, &[]).await;
    let body = String::from_utf8(body).unwrap();
    assert!(
        body.contains("istio_agent_scrape_failures_total{type=\"application\"} 3\n"),
        "{}",
        body.lines()
            .filter(|l| l.contains("scrape_failures"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn the_answer_is_compressed_when_the_scraper_asks() {
    let (app, _) = metrics_app(200, "text/plain", b"app_total 1\n".to_vec()).await;
    let s = setup(CONFIG_OK, LIVE, Some(app)).await;

    let (headers, plain) = scrape(s.addr, &[]).await;
    assert_eq!(header(&headers, "content-encoding"), "");
    assert_eq!(header(&headers, "vary"), "Accept-Encoding");
    let plain = String::from_utf8(plain).unwrap();

    for (asked, coding) in [
        ("gzip", "gzip"),
        ("gzip, deflate, br, zstd", "zstd"),
        ("zstd;q=0.5, gzip", "gzip"),
        ("zstd", "zstd"),
    ] {
        let (headers, wire) = scrape(s.addr, &[("accept-encoding", asked)]).await;
        assert_eq!(header(&headers, "content-encoding"), coding, "{asked}");
        assert_eq!(header(&headers, "vary"), "Accept-Encoding");
        let mut text = Vec::new();
        match coding {
            "gzip" => {
                flate2::read::GzDecoder::new(&wire[..])
                    .read_to_end(&mut text)
                    .unwrap();
            }
            _ => text = zstd::stream::decode_all(&wire[..]).unwrap(),
        }
        let text = String::from_utf8(text).unwrap();
        assert!(wire.len() < text.len(), "{asked}: compressed");
        // The same parts as the plain answer (the agent's counters move between scrapes).
        for part in ["istio_agent_scrapes_total", "envoy_up 1\n", "app_total 1\n"] {
            assert!(
                plain.contains(part) && text.contains(part),
                "{asked}: {part}"
            );
        }
        assert!(text.ends_with("app_total 1\n"), "{asked}");
    }
    // Refused codings answer plain.
    let (headers, body) = scrape(s.addr, &[("accept-encoding", "gzip;q=0, br")]).await;
    assert_eq!(header(&headers, "content-encoding"), "");
    assert!(String::from_utf8(body).unwrap().contains("app_total 1\n"));
}
