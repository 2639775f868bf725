//! The merged metrics compressed for a scraper that asks, as Istio's agent answers: gzip (its
//! status port's gzip handler) and, since Istio 1.30, zstd. An answer of at least [`MIN_SIZE`]
//! bytes goes out compressed, streamed frame by frame; a shorter one as it is.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

use super::super::Body;

/// Answers shorter than this are not worth compressing.
pub const MIN_SIZE: usize = 1024;

/// A content coding the merged metrics can be answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    Zstd,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Zstd => "zstd",
        }
    }
}

/// The coding for the scraper's `Accept-Encoding`: the one it gives the highest `q` (above
/// zero), gzip on a tie (what every scraper that names both has always been given);
/// `None`: uncompressed.
pub fn choose(headers: &http::HeaderMap) -> Option<Coding> {
    let mut best: Option<(f64, Coding)> = None;
    for coding in headers
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or_default();
        let Some(q) = parts
            .find_map(|p| p.strip_prefix("q="))
            .map_or(Some(1.0), |q| q.trim().parse::<f64>().ok())
        else {
            continue;
        };
        let coding = if name.eq_ignore_ascii_case("gzip") {
            Coding::Gzip
        } else if name.eq_ignore_ascii_case("zstd") {
            Coding::Zstd
        } else {
            continue;
        };
        let better = match best {
            None => true,
            Some((bq, bc)) => q > bq || (q == bq && coding == Coding::Gzip && bc != coding),
        };
        if q > 0.0 && better {
            best = Some((q, coding));
        }
    }
    best.map(|(_, c)| c)
}

/// One streaming encoder of either coding.
enum Encoder {
    Gzip(GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    fn new(coding: Coding) -> std::io::Result<Self> {
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(GzEncoder::new(Vec::new(), Compression::default())),
            Coding::Zstd => Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3)?),
        })
    }

    /// Compresses `data`; returns what is ready to send.
    fn push(&mut self, data: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Encoder::Gzip(e) => {
                e.write_all(data)?;
                Ok(std::mem::take(e.get_mut()))
            }
            Encoder::Zstd(e) => {
                e.write_all(data)?;
                Ok(std::mem::take(e.get_mut()))
            }
        }
    }

    fn finish(self) -> std::io::Result<Vec<u8>> {
        match self {
            Encoder::Gzip(e) => e.finish(),
            Encoder::Zstd(e) => e.finish(),
        }
    }
}

/// Input compressed in one go, on the blocking pool ([`super::off_thread`]): Envoy's text comes
/// in frames of a few KiB, and compressing each on a runtime thread would put the whole 10 MiB
/// there, a frame at a time.
const BATCH: usize = 128 << 10;

/// Compresses `data` with `encoder`, on the blocking pool when it is a batch's worth; gives
/// the encoder back with what is ready to send.
async fn push(mut encoder: Encoder, data: Vec<u8>) -> std::io::Result<(Encoder, Vec<u8>)> {
    if data.len() < BATCH {
        let out = encoder.push(&data)?;
        return Ok((encoder, out));
    }
    super::off_thread(move || {
        let out = encoder.push(&data);
        out.map(|out| (encoder, out))
    })
    .await
    .unwrap_or_else(|| Err(std::io::Error::other("the compressing job failed")))
}

/// `resp` in `coding` when its body reaches [`MIN_SIZE`] bytes (`Content-Encoding`,
/// `Vary: Accept-Encoding`), else as it was. The compressing task ends when the client's body
/// is dropped, or at `shutdown`.
pub async fn compress(
    resp: http::Response<Body>,
    coding: Coding,
    shutdown: tokio_util::sync::CancellationToken,
) -> http::Response<Body> {
    let (mut parts, mut body) = resp.into_parts();
    let (head, ended) = read_head(&mut body).await;
    if ended && head.len() < MIN_SIZE {
        let full = http_body_util::Full::new(bytes::Bytes::from(head))
            .map_err(|never: std::convert::Infallible| match never {})
            .boxed();
        return http::Response::from_parts(parts, full);
    }
    parts.headers.insert(
        http::header::CONTENT_ENCODING,
        http::HeaderValue::from_static(coding.name()),
    );
    parts.headers.insert(
        http::header::VARY,
        http::HeaderValue::from_static("Accept-Encoding"),
    );
    parts.headers.remove(http::header::CONTENT_LENGTH);

    let (tx, rx) = mpsc::channel::<Result<Frame<bytes::Bytes>, std::io::Error>>(4);
    let encode = encode(coding, head, ended, body, tx.clone());
    tokio::spawn(async move {
        tokio::select! {
            // The client is gone: the merged body (and Envoy's read) is dropped with this task.
            _ = tx.closed() => {}
            _ = shutdown.cancelled() => {}
            _ = encode => {}
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    http::Response::from_parts(parts, StreamBody::new(stream).boxed())
}

/// Reads `body` until [`MIN_SIZE`] bytes or its end; true when it ended.
async fn read_head(body: &mut Body) -> (Vec<u8>, bool) {
    let mut head = Vec::new();
    while head.len() < MIN_SIZE {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    head.extend_from_slice(&data);
                }
            }
            // A failed part was already counted where it failed; the answer ends here.
            Some(Err(_)) | None => return (head, true),
        }
    }
    (head, false)
}

/// Compresses `head` and the rest of `body` in batches onto `out`, then the encoder's end; an
/// error ends the answer with it.
async fn encode(
    coding: Coding,
    head: Vec<u8>,
    mut ended: bool,
    mut body: Body,
    out: mpsc::Sender<Result<Frame<bytes::Bytes>, std::io::Error>>,
) {
    let mut encoder = match Encoder::new(coding) {
        Ok(e) => e,
        Err(e) => {
            let _ = out.send(Err(e)).await;
            return;
        }
    };
    let mut pending = head;
    loop {
        // Gather a batch (or the rest) before compressing.
        while !ended && pending.len() < BATCH {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        pending.extend_from_slice(&data);
                    }
                }
                Some(Err(_)) | None => ended = true,
            }
        }
        let compressed = match push(encoder, std::mem::take(&mut pending)).await {
            Ok((next, c)) => {
                encoder = next;
                c
            }
            Err(e) => {
                let _ = out.send(Err(e)).await;
                return;
            }
        };
        if !compressed.is_empty() && out.send(Ok(Frame::data(compressed.into()))).await.is_err() {
            return;
        }
        if ended {
            break;
        }
    }
    match encoder.finish() {
        Ok(rest) => {
            let _ = out.send(Ok(Frame::data(rest.into()))).await;
        }
        Err(e) => {
            let _ = out.send(Err(e)).await;
        }
    }
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

    async fn answer(body: Vec<u8>, coding: Coding) -> (Option<String>, Vec<u8>) {
        let resp = http::Response::new(
            http_body_util::Full::new(bytes::Bytes::from(body))
                .map_err(|never: std::convert::Infallible| match never {})
                .boxed(),
        );
        let resp = compress(resp, coding, tokio_util::sync::CancellationToken::new()).await;
        let encoding = resp
            .headers()
            .get(http::header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (encoding, bytes.to_vec())
    }

    #[tokio::test]
    async fn large_answers_are_compressed_small_ones_not() {
        let (enc, body) = answer(b"a 1\n".to_vec(), Coding::Gzip).await;
        assert_eq!(enc, None);
        assert_eq!(body, b"a 1\n");

        let text: Vec<u8> = (0..500)
            .flat_map(|i| format!("metric_{i} {i}\n").into_bytes())
            .collect();
        let (enc, body) = answer(text.clone(), Coding::Gzip).await;
        assert_eq!(enc.as_deref(), Some("gzip"));
        let mut inflated = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut inflated)
            .unwrap();
        assert_eq!(inflated, text);
        assert!(body.len() < text.len() / 2);

        let (enc, body) = answer(text.clone(), Coding::Zstd).await;
        assert_eq!(enc.as_deref(), Some("zstd"));
        assert_eq!(zstd::stream::decode_all(&body[..]).unwrap(), text);
        assert!(body.len() < text.len() / 2);
    }

    #[test]
    fn the_coding_is_the_scrapers_first_choice() {
        let choose = |v: &str| choose(&headers(v));
        assert_eq!(choose("gzip"), Some(Coding::Gzip));
        assert_eq!(choose("zstd"), Some(Coding::Zstd));
        assert_eq!(choose("gzip;q=0.5, zstd"), Some(Coding::Zstd));
        assert_eq!(choose("zstd;q=0.5, GZIP"), Some(Coding::Gzip));
        assert_eq!(choose("zstd, gzip"), Some(Coding::Gzip), "a tie: gzip");
        assert_eq!(choose("zstd;q=0, gzip;q=0"), None);
        assert_eq!(choose("br, identity"), None);
        assert_eq!(choose("deflate, GZIP;q=0.5"), Some(Coding::Gzip));
        assert_eq!(choose("gzip;q=0"), None);
        assert_eq!(choose(""), None);
    }
}
