//! The upstream ADS stream, read below tonic's decoder so that a large response reaches Envoy
//! while it is still arriving (cut-through) instead of after the proxy has it whole.
//!
//! Requests go out as gRPC messages (prost-encoded). Responses come in as HTTP/2 data frames,
//! which [`Framer`] cuts into [`Piece`]s:
//! - a response of up to `hold` bytes is held until complete and relayed whole
//!   ([`Piece::Whole`]), as is a longer one whose first resource is not for Envoy (NDS, which
//!   the proxy consumes, or a type it drops);
//! - a longer response for Envoy is relayed frame by frame once its first `hold` bytes name
//!   its resources' type ([`Piece::Part`], then [`Piece::Last`]). Its head (and, for Delta, its
//!   resources' names and versions) is read on the way by a [`Sieve`]; the proxy never holds
//!   more of it than those first bytes.
//!
//! The price of cut-through: if the upstream is lost in the middle of such a response, Envoy
//! has part of a message that can never be completed, so its stream must end (Istio's
//! behaviour on every loss). A response held whole never leaves Envoy a partial message.

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use prost::Message;
use tonic::Status;

use super::codec::{RawResponse, forwarded};
use super::sieve::{Sieve, first_resource_type};

/// Responses up to this size are held whole; longer ones for Envoy are relayed as they come.
pub(crate) const HOLD: usize = 64 * 1024;

/// The most a held response's buffer reserves before its bytes arrive (the rest grows as they
/// do), so that a bogus length does not allocate gigabytes.
const MAX_RESERVE: usize = 16 << 20;

/// A piece of the upstream's responses, in order.
#[derive(Debug)]
pub(crate) enum Piece {
    /// A whole response.
    Whole(RawResponse),
    /// Bytes of a response relayed as it arrives (the first is its 5-byte gRPC header).
    Part(Bytes),
    /// The last bytes of that response, and the response as the proxy reads it: its head and,
    /// for Delta, its resources' names and versions, without the resources themselves.
    Last(Bytes, RawResponse),
}

fn grpc_header(len: usize) -> Bytes {
    let mut h = BytesMut::with_capacity(5);
    h.put_u8(0);
    h.put_u32(len as u32);
    h.freeze()
}

enum State {
    /// Reading a 5-byte gRPC message header.
    Header { raw: [u8; 5], n: usize },
    /// Holding a response: all of it, or (`whole: false`) its first [`HOLD`] bytes until they
    /// tell whether it is for Envoy.
    Held {
        len: usize,
        buf: BytesMut,
        whole: bool,
    },
    /// Relaying a response as it arrives: `left` bytes to go.
    Relayed { left: usize, sieve: Sieve },
}

/// Cuts the upstream's data frames into [`Piece`]s.
pub(crate) struct Framer {
    hold: usize,
    /// The hold limit from the next response on ([`Responses::hold`]).
    next_hold: Option<usize>,
    delta: bool,
    state: State,
}

impl Framer {
    pub(crate) fn new(hold: usize, delta: bool) -> Self {
        Framer {
            hold,
            next_hold: None,
            delta,
            state: State::Header { raw: [0; 5], n: 0 },
        }
    }

    /// True between the first and the last [`Piece::Part`] of a response: Envoy holds part of
    /// a message.
    pub(crate) fn relaying(&self) -> bool {
        matches!(self.state, State::Relayed { .. })
    }

    /// True when the bytes so far end on a message boundary.
    pub(crate) fn at_boundary(&self) -> bool {
        matches!(self.state, State::Header { n: 0, .. })
    }

    /// Reads one data frame.
    pub(crate) fn push(
        &mut self,
        mut data: Bytes,
        out: &mut VecDeque<Piece>,
    ) -> Result<(), Status> {
        while !data.is_empty() {
            match &mut self.state {
                State::Header { raw, n } => {
                    let take = (5 - *n).min(data.len());
                    raw[*n..*n + take].copy_from_slice(&data[..take]);
                    data.advance(take);
                    *n += take;
                    if *n < 5 {
                        continue;
                    }
                    let raw = *raw;
                    self.header_done(raw, out)?;
                }
                State::Held { len, buf, whole } => {
                    let whole = *whole;
                    let goal = if whole { *len } else { self.hold };
                    let need = goal - buf.len();
                    if buf.is_empty() && data.len() >= need {
                        // All of it in this frame: shared, not copied.
                        let b = data.split_to(need);
                        if whole {
                            self.state = State::Header { raw: [0; 5], n: 0 };
                            out.push_back(Piece::Whole(raw_response(b)?));
                        } else {
                            self.decide(b, out)?;
                        }
                        continue;
                    }
                    if buf.capacity() == 0 {
                        buf.reserve(goal.min(MAX_RESERVE));
                    }
                    let take = need.min(data.len());
                    buf.extend_from_slice(&data[..take]);
                    data.advance(take);
                    if buf.len() == goal {
                        self.held_done(out)?;
                    }
                }
                State::Relayed { left, sieve } => {
                    let take = (*left).min(data.len());
                    let part = data.split_to(take);
                    sieve.feed(&part).map_err(sieve_error)?;
                    *left -= take;
                    if *left > 0 {
                        out.push_back(Piece::Part(part));
                        continue;
                    }
                    let State::Relayed { sieve, .. } =
                        std::mem::replace(&mut self.state, State::Header { raw: [0; 5], n: 0 })
                    else {
                        unreachable!("matched above")
                    };
                    let kept = sieve.finish().map_err(sieve_error)?;
                    out.push_back(Piece::Last(part, raw_response(Bytes::from(kept))?));
                }
            }
        }
        Ok(())
    }

    /// A message's 5-byte gRPC header was read: checks its flag and starts holding the message.
    fn header_done(&mut self, raw: [u8; 5], out: &mut VecDeque<Piece>) -> Result<(), Status> {
        match raw[0] {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "istiod sent a compressed xDS response, though the proxy accepts none",
                ));
            }
            f => {
                return Err(Status::internal(format!(
                    "invalid gRPC message flag {f} in an xDS response"
                )));
            }
        }
        let len = u32::from_be_bytes([raw[1], raw[2], raw[3], raw[4]]) as usize;
        if let Some(hold) = self.next_hold.take() {
            self.hold = hold;
        }
        self.state = State::Held {
            len,
            buf: BytesMut::new(),
            whole: len <= self.hold,
        };
        if len == 0 {
            self.held_done(out)?;
        }
        Ok(())
    }

    /// A held buffer reached its goal.
    fn held_done(&mut self, out: &mut VecDeque<Piece>) -> Result<(), Status> {
        let State::Held { buf, whole, .. } = &mut self.state else {
            unreachable!("called in Held")
        };
        let bytes = std::mem::take(buf).freeze();
        if *whole {
            self.state = State::Header { raw: [0; 5], n: 0 };
            out.push_back(Piece::Whole(raw_response(bytes)?));
            return Ok(());
        }
        self.decide(bytes, out)
    }

    /// The first [`HOLD`] bytes of a long response are in: relay it as it comes if its first
    /// resource is for Envoy, else hold it whole.
    fn decide(&mut self, prefix: Bytes, out: &mut VecDeque<Piece>) -> Result<(), Status> {
        let State::Held { len, .. } = self.state else {
            unreachable!("called in Held")
        };
        // ECDS is held whole too: the proxy may rewrite its Wasm filters before Envoy sees it.
        let for_envoy = first_resource_type(&prefix, self.delta)
            .is_some_and(|t| forwarded(&t) && t != proto::type_url::ECDS);
        if !for_envoy {
            let mut buf = BytesMut::with_capacity(len.min(MAX_RESERVE));
            buf.extend_from_slice(&prefix);
            self.state = State::Held {
                len,
                buf,
                whole: true,
            };
            return Ok(());
        }
        let mut sieve = Sieve::new(len as u64, self.delta);
        sieve.feed(&prefix).map_err(sieve_error)?;
        out.push_back(Piece::Part(grpc_header(len)));
        out.push_back(Piece::Part(prefix));
        self.state = State::Relayed {
            left: len - self.hold,
            sieve,
        };
        Ok(())
    }
}

/// As tonic's prost codec: a malformed message is an INTERNAL status.
fn sieve_error(e: super::sieve::SieveError) -> Status {
    Status::internal(e.to_string())
}

fn raw_response(bytes: Bytes) -> Result<RawResponse, Status> {
    RawResponse::new(bytes).map_err(|e| Status::internal(e.to_string()))
}

/// The requests of one upstream stream.
pub(crate) type RequestStream<Req> = std::pin::Pin<Box<dyn futures::Stream<Item = Req> + Send>>;

/// The gRPC status for a response whose HTTP status is not 200 (gRPC's HTTP-to-gRPC mapping).
fn http_status(code: http::StatusCode) -> Status {
    let msg = format!("istiod answered the xDS stream with HTTP {code}");
    match code.as_u16() {
        400 => Status::internal(msg),
        401 => Status::unauthenticated(msg),
        403 => Status::permission_denied(msg),
        404 => Status::unimplemented(msg),
        429 | 502..=504 => Status::unavailable(msg),
        _ => Status::unknown(msg),
    }
}

/// One upstream ADS stream's responses.
pub(crate) struct Responses {
    body: tonic::body::Body,
    framer: Framer,
    pieces: VecDeque<Piece>,
    /// The stream's end (`None`: OK), once the body ended.
    end: Option<Option<Status>>,
}

/// Opens an ADS stream on `channel` (`path`: the method), with `headers` and `requests`.
pub(crate) async fn call<Req: Message + 'static>(
    mut channel: tonic::transport::Channel,
    path: &'static str,
    headers: http::HeaderMap,
    requests: RequestStream<Req>,
    delta: bool,
) -> Result<Responses, Status> {
    use tonic::codegen::Service;
    let frames = futures::StreamExt::map(requests, |req: Req| {
        let len = req.encoded_len();
        let mut buf = BytesMut::with_capacity(5 + len);
        buf.put_u8(0);
        buf.put_u32(len as u32);
        req.encode_raw(&mut buf);
        Ok::<_, Status>(hyper::body::Frame::data(buf.freeze()))
    });
    let mut request = http::Request::new(tonic::body::Body::new(http_body_util::StreamBody::new(
        frames,
    )));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static(path);
    *request.version_mut() = http::Version::HTTP_2;
    *request.headers_mut() = headers;
    let h = request.headers_mut();
    h.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| Status::unknown(format!("Service was not ready: {e}")))?;
    let response = channel
        .call(request)
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    if response.status() != http::StatusCode::OK {
        return Err(http_status(response.status()));
    }
    // A trailers-only answer: the stream ended before it began (OK: closed at once).
    let end = match Status::from_header_map(response.headers()) {
        Some(status) if status.code() != tonic::Code::Ok => return Err(status),
        Some(_) => Some(None),
        None => None,
    };
    Ok(Responses {
        body: response.into_body(),
        framer: Framer::new(HOLD, delta),
        pieces: VecDeque::new(),
        end,
    })
}

impl Responses {
    /// Responses from the next one on are held whole up to `hold` bytes (the warm stream's
    /// held responses, [`super::warm`]); longer ones for Envoy are relayed as they come.
    pub(crate) fn hold(&mut self, hold: usize) {
        self.framer.next_hold = Some(hold);
    }

    /// True when part of a response was relayed and the rest has not come yet.
    pub(crate) fn relaying(&self) -> bool {
        self.framer.relaying()
    }

    /// The next piece; `Ok(None)` when istiod ended the stream with OK.
    pub(crate) async fn next(&mut self) -> Result<Option<Piece>, Status> {
        loop {
            if let Some(p) = self.pieces.pop_front() {
                return Ok(Some(p));
            }
            if let Some(end) = self.end.take() {
                self.end = Some(None);
                return match end {
                    None => Ok(None),
                    Some(status) => Err(status),
                };
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.framer.push(data, &mut self.pieces)?,
                    Err(frame) => {
                        let status = frame
                            .trailers_ref()
                            .and_then(Status::from_header_map)
                            .unwrap_or_else(|| {
                                Status::unknown("istiod's xDS stream ended without a grpc-status")
                            });
                        self.end = Some(self.ended(status));
                    }
                },
                Some(Err(status)) => return Err(status),
                None => {
                    let status = Status::unknown("istiod's xDS stream ended without trailers");
                    self.end = Some(self.ended(status));
                }
            }
        }
    }

    /// How the stream ends: a status that is OK but cuts a message short is a lost stream
    /// (UNKNOWN), as a connection that drops.
    fn ended(&self, status: Status) -> Option<Status> {
        if status.code() != tonic::Code::Ok {
            return Some(status);
        }
        (!self.framer.at_boundary())
            .then(|| Status::unknown("istiod's xDS stream ended in the middle of a response"))
    }
}

/// Runs the [`Framer`] over `wire` (istiod's response bytes) in frames of `frame` bytes with a
/// hold limit of `hold`, and returns what Envoy would be sent (whole responses with their gRPC
/// header, relayed parts as they are) and whether the framer accepted everything.
#[cfg(feature = "fuzzing")]
pub fn relay_frames(wire: &[u8], delta: bool, hold: usize, frame: usize) -> (Vec<u8>, bool) {
    let mut framer = Framer::new(hold, delta);
    let mut out = VecDeque::new();
    let mut sent = Vec::new();
    let mut ok = true;
    for chunk in wire.chunks(frame.max(1)) {
        ok = framer.push(Bytes::copy_from_slice(chunk), &mut out).is_ok();
        for p in out.drain(..) {
            match p {
                Piece::Whole(r) => {
                    sent.extend_from_slice(&grpc_header(r.bytes().len()));
                    sent.extend_from_slice(r.bytes());
                }
                Piece::Part(b) | Piece::Last(b, _) => sent.extend_from_slice(&b),
            }
        }
        if !ok {
            break;
        }
    }
    (sent, ok)
}

#[cfg(test)]
mod tests;
