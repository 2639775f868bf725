//! The merged metrics gzipped for a scraper that accepts gzip, as Istio's agent answers (its
//! status port's gzip handler): an answer of at least [`MIN_SIZE`] bytes goes out compressed,
//! streamed frame by frame; a shorter one as it is.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

use super::super::Body;

/// Answers shorter than this are not worth compressing.
pub const MIN_SIZE: usize = 1024;

/// True when `Accept-Encoding` lists `gzip` with a `q` above zero.
pub fn accepts_gzip(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let q = parts
                .find_map(|p| p.strip_prefix("q="))
                .map_or(Some(1.0), |q| q.trim().parse::<f64>().ok());
            name.eq_ignore_ascii_case("gzip") && q.is_some_and(|q| q > 0.0)
        })
}

/// `resp` gzipped when its body reaches [`MIN_SIZE`] bytes (`Content-Encoding: gzip`,
/// `Vary: Accept-Encoding`), else as it was.
pub async fn gzip(resp: http::Response<Body>) -> http::Response<Body> {
    let (mut parts, mut body) = resp.into_parts();
    let mut head = Vec::new();
    let mut ended = false;
    while head.len() < MIN_SIZE {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    head.extend_from_slice(&data);
                }
            }
            // A failed part was already counted where it failed; the answer ends here.
            Some(Err(_)) | None => {
                ended = true;
                break;
            }
        }
    }
    if ended && head.len() < MIN_SIZE {
        let full = http_body_util::Full::new(bytes::Bytes::from(head))
            .map_err(|never: std::convert::Infallible| match never {})
            .boxed();
        return http::Response::from_parts(parts, full);
    }
    parts.headers.insert(
        http::header::CONTENT_ENCODING,
        http::HeaderValue::from_static("gzip"),
    );
    parts.headers.insert(
        http::header::VARY,
        http::HeaderValue::from_static("Accept-Encoding"),
    );
    parts.headers.remove(http::header::CONTENT_LENGTH);

    let (tx, rx) = mpsc::channel::<Result<Frame<bytes::Bytes>, std::io::Error>>(4);
    tokio::spawn(async move {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        let mut chunk = head;
        loop {
            if let Err(e) = encoder.write_all(&chunk) {
                let _ = tx.send(Err(e)).await;
                return;
            }
            let out = std::mem::take(encoder.get_mut());
            if !out.is_empty() && tx.send(Ok(Frame::data(out.into()))).await.is_err() {
                return;
            }
            if ended {
                break;
            }
            match body.frame().await {
                Some(Ok(frame)) => {
                    chunk = frame.into_data().map(|d| d.to_vec()).unwrap_or_default()
                }
                Some(Err(_)) | None => {
                    ended = true;
                    chunk = Vec::new();
                }
            }
        }
        match encoder.finish() {
            Ok(rest) => {
                let _ = tx.send(Ok(Frame::data(rest.into()))).await;
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    http::Response::from_parts(parts, StreamBody::new(stream).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn headers(accept: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::ACCEPT_ENCODING, accept.parse().unwrap());
        h
    }

    #[test]
    fn gzip_is_accepted_unless_refused() {
        assert!(accepts_gzip(&headers("gzip")));
        assert!(accepts_gzip(&headers("deflate, GZIP;q=0.5")));
        assert!(!accepts_gzip(&headers("gzip;q=0")));
        assert!(!accepts_gzip(&headers("identity")));
        assert!(!accepts_gzip(&http::HeaderMap::new()));
    }

    async fn answer(body: Vec<u8>) -> (Option<String>, Vec<u8>) {
        let resp = http::Response::new(
            http_body_util::Full::new(bytes::Bytes::from(body))
                .map_err(|never: std::convert::Infallible| match never {})
                .boxed(),
        );
        let resp = gzip(resp).await;
        let encoding = resp
            .headers()
            .get(http::header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (encoding, bytes.to_vec())
    }

    #[tokio::test]
    async fn large_answers_are_compressed_small_ones_not() {
        let (enc, body) = answer(b"a 1\n".to_vec()).await;
        assert_eq!(enc, None);
        assert_eq!(body, b"a 1\n");

        let text: Vec<u8> = (0..500)
            .flat_map(|i| format!("metric_{i} {i}\n").into_bytes())
            .collect();
        let (enc, body) = answer(text.clone()).await;
        assert_eq!(enc.as_deref(), Some("gzip"));
        let mut inflated = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut inflated)
            .unwrap();
        assert_eq!(inflated, text);
        assert!(body.len() < text.len() / 2);
    }
}
