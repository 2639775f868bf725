//! The proxy's gRPC codecs. Responses (istiod → Envoy) are relayed as the bytes istiod sent:
//! only the three header fields the proxy reads are decoded (a 10,000-cluster CDS is never
//! decoded into structs nor re-encoded). Requests (Envoy → istiod) stay typed: they are small and
//! the proxy looks into them (first LDS request) and adds its own (NDS, health).

use std::marker::PhantomData;

use bytes::{BufMut, Bytes};
use prost::Message;
use tonic::Status;
use tonic::codec::{DecodeBuf, Decoder};

/// The fields of a `DiscoveryResponse` or `DeltaDiscoveryResponse` the proxy reads; their
/// numbers are the same in both messages (`version_info` / `system_version_info` 1, `type_url`
/// 4, `nonce` 5). Every other field (the resources) is skipped, not decoded.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Head {
    #[prost(string, tag = "1")]
    pub(crate) version_info: String,
    #[prost(string, tag = "4")]
    pub(crate) type_url: String,
    #[prost(string, tag = "5")]
    pub(crate) nonce: String,
}

/// A response as istiod sent it: its encoded bytes (relayed unchanged) and its [`Head`].
#[derive(Clone, Debug, PartialEq)]
pub struct RawResponse {
    pub(crate) head: Head,
    pub(crate) bytes: Bytes,
}

impl RawResponse {
    /// Reads the head of an encoded response; the bytes are kept as they are.
    pub fn new(bytes: Bytes) -> Result<Self, prost::DecodeError> {
        let head = Head::decode(&bytes[..])?;
        Ok(RawResponse { head, bytes })
    }

    /// The response's `type_url`.
    pub fn type_url(&self) -> &str {
        &self.head.type_url
    }

    /// The encoded response, exactly as received.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The whole response, decoded (for the few the proxy consumes itself).
    pub(crate) fn decode<M: Message + Default>(&self) -> Result<M, prost::DecodeError> {
        M::decode(&self.bytes[..])
    }
}

/// The header fields [`RawResponse::new`] read, for the fuzz target (it compares them with a
/// full prost decode of the same bytes).
#[cfg(feature = "fuzzing")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    pub version_info: String,
    pub type_url: String,
    pub nonce: String,
}

/// Runs the proxy's response decoding (as [`RawDecoder`] does) on `bytes`.
#[cfg(feature = "fuzzing")]
pub fn decode_response_head(bytes: &[u8]) -> Result<ResponseHead, prost::DecodeError> {
    let raw = RawResponse::new(Bytes::copy_from_slice(bytes))?;
    debug_assert_eq!(&raw.bytes()[..], bytes);
    Ok(ResponseHead {
        version_info: raw.head.version_info,
        type_url: raw.head.type_url,
        nonce: raw.head.nonce,
    })
}

/// As tonic's prost codec: a malformed message is an INTERNAL status.
fn decode_error(e: prost::DecodeError) -> Status {
    Status::internal(e.to_string())
}

/// Decodes a typed message with prost.
pub(crate) struct TypedDecoder<M>(PhantomData<M>);

impl<M: Message + Default> Decoder for TypedDecoder<M> {
    type Item = M;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<M>, Status> {
        M::decode(src).map(Some).map_err(decode_error)
    }
}

/// Decodes Envoy's requests (typed, with prost).
pub(crate) fn request_decoder<M: Message + Default + Send + 'static>() -> TypedDecoder<M> {
    TypedDecoder(PhantomData)
}

/// What the relay hands Envoy's stream: a whole response, or bytes of one relayed as it
/// arrives ([`super::upstream::Piece::Part`]s in order, gRPC header included).
#[derive(Debug)]
pub(crate) enum Down {
    Whole(RawResponse),
    Part(Vec<Bytes>),
}

/// The gRPC response body towards Envoy: each whole [`RawResponse`] goes out as its 5-byte
/// gRPC message header and then its bytes as received from istiod (shared, not copied: tonic's
/// encoder would copy every message into its own buffer first), each part as it is, then the
/// trailers with the stream's status (`grpc-status: 0`, or the status the relay ended it with).
pub(crate) struct ResponseBody<S> {
    responses: S,
    /// Data still to send: a message whose header was just sent, or the rest of some parts.
    pending: std::collections::VecDeque<Bytes>,
    done: bool,
}

impl<S> ResponseBody<S> {
    pub(crate) fn new(responses: S) -> Self {
        ResponseBody {
            responses,
            pending: std::collections::VecDeque::new(),
            done: false,
        }
    }
}

/// A gRPC message header: not compressed, then the length (big endian).
fn message_header(len: usize) -> Result<Bytes, Status> {
    let len = u32::try_from(len).map_err(|_| {
        Status::resource_exhausted(format!("a {len}-byte response is over gRPC's 4 GiB"))
    })?;
    let mut header = bytes::BytesMut::with_capacity(5);
    header.put_u8(0);
    header.put_u32(len);
    Ok(header.freeze())
}

fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    map
}

impl<S> hyper::body::Body for ResponseBody<S>
where
    S: futures::Stream<Item = Result<Down, Status>> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Status>>> {
        use std::task::Poll;
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(hyper::body::Frame::data(bytes))));
            }
            if self.done {
                return Poll::Ready(None);
            }
            let status = match std::task::ready!(futures::Stream::poll_next(
                std::pin::Pin::new(&mut self.responses),
                cx
            )) {
                Some(Ok(Down::Part(parts))) => {
                    self.pending
                        .extend(parts.into_iter().filter(|p| !p.is_empty()));
                    continue;
                }
                Some(Ok(Down::Whole(resp))) => match message_header(resp.bytes.len()) {
                    Ok(header) => {
                        self.pending.push_back(header);
                        if !resp.bytes.is_empty() {
                            self.pending.push_back(resp.bytes);
                        }
                        continue;
                    }
                    Err(status) => status,
                },
                Some(Err(status)) => status,
                None => Status::ok(""),
            };
            self.done = true;
            return Poll::Ready(Some(Ok(hyper::body::Frame::trailers(trailers(&status)))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.pending.is_empty()
    }
}

/// Types relayed to Envoy; everything else from istiod is dropped (the relay decides per
/// message, the upstream reader per long response's first resource).
pub(crate) fn forwarded(type_url: &str) -> bool {
    type_url.starts_with("type.googleapis.com/envoy.")
        || type_url.starts_with("type.googleapis.com/istio.workload.")
}

#[cfg(test)]
mod tests {
    use proto::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource,
    };
    use proto::envoy_types_crate::pb::google::protobuf::Any;
    use proto::type_url;

    use super::*;

    #[test]
    fn sotw_head_is_read_and_bytes_kept_verbatim() {
        let resp = DiscoveryResponse {
            version_info: "v7".into(),
            type_url: type_url::CLUSTER.into(),
            nonce: "n7".into(),
            // Nested fields with the head's numbers are not the head's.
            resources: vec![Any {
                type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
                value: DiscoveryResponse {
                    type_url: "inner, not the head".into(),
                    nonce: "inner".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            }],
            canary: true,
            ..Default::default()
        };
        let mut wire = resp.encode_to_vec();
        // A field this build does not know (tag 99, length-delimited) survives the relay,
        // though a decode and re-encode would drop it.
        wire.extend_from_slice(&[0x9a, 0x06, 0x03, b'a', b'b', b'c']);
        let raw = RawResponse::new(Bytes::from(wire.clone())).unwrap();
        assert_eq!(raw.type_url(), type_url::CLUSTER);
        assert_eq!(raw.head.version_info, "v7");
        assert_eq!(raw.head.nonce, "n7");
        assert_eq!(raw.bytes()[..], wire[..]);
        assert_eq!(raw.decode::<DiscoveryResponse>().unwrap(), resp);
    }

    #[test]
    fn delta_head_uses_the_same_field_numbers() {
        let resp = DeltaDiscoveryResponse {
            system_version_info: "sys1".into(),
            type_url: type_url::LISTENER.into(),
            nonce: "d1".into(),
            removed_resources: vec!["gone".into()],
            resources: vec![Resource {
                name: "l1".into(),
                version: "r1".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let raw = RawResponse::new(Bytes::from(resp.encode_to_vec())).unwrap();
        assert_eq!(
            (
                raw.head.version_info.as_str(),
                raw.type_url(),
                raw.head.nonce.as_str()
            ),
            ("sys1", type_url::LISTENER, "d1")
        );
        assert_eq!(raw.decode::<DeltaDiscoveryResponse>().unwrap(), resp);
    }

    #[test]
    fn malformed_responses_are_errors() {
        // Truncated: a length-delimited field longer than the message.
        assert!(RawResponse::new(Bytes::from_static(&[0x12, 0x10, 1, 2])).is_err());
        // A type_url that is not UTF-8.
        assert!(RawResponse::new(Bytes::from_static(&[0x22, 0x02, 0xff, 0xfe])).is_err());
        // A head field with the wrong wire type (varint for type_url).
        assert!(RawResponse::new(Bytes::from_static(&[0x20, 0x01])).is_err());
        assert_eq!(
            decode_error(RawResponse::new(Bytes::from_static(&[0x20, 0x01])).unwrap_err()).code(),
            tonic::Code::Internal
        );
    }

    /// What the body hands the HTTP/2 server for `downs`: data frames, then the trailers'
    /// grpc-status.
    fn body_frames(downs: Vec<Result<Down, Status>>) -> (Vec<Bytes>, String) {
        use http_body_util::BodyExt;
        let mut body = ResponseBody::new(futures::stream::iter(downs));
        let mut data = Vec::new();
        futures::executor::block_on(async {
            while let Some(frame) = body.frame().await {
                match frame.unwrap().into_data() {
                    Ok(d) => data.push(d),
                    Err(f) => {
                        let status = f.trailers_ref().unwrap()["grpc-status"].to_str().unwrap();
                        assert!(hyper::body::Body::is_end_stream(&body));
                        return (data, status.to_string());
                    }
                }
            }
            panic!("the body ended without trailers");
        })
    }

    #[test]
    fn body_sends_headers_whole_messages_and_parts_in_order() {
        let whole = |b: &'static [u8]| RawResponse::new(Bytes::from_static(b)).unwrap();
        // An empty message (all fields default) is a 0-length gRPC message: header only.
        let (data, status) = body_frames(vec![
            Ok(Down::Whole(whole(b""))),
            Ok(Down::Part(vec![
                Bytes::from_static(&[0, 0, 0, 0, 4]),
                Bytes::new(),
                Bytes::from_static(b"\x22\x02"),
            ])),
            Ok(Down::Part(vec![])),
            Ok(Down::Part(vec![Bytes::from_static(b"ab")])),
            Ok(Down::Whole(whole(b"\x22\x01x"))),
        ]);
        let expect: Vec<&[u8]> = vec![
            &[0, 0, 0, 0, 0],
            &[0, 0, 0, 0, 4],
            b"\x22\x02",
            b"ab",
            &[0, 0, 0, 0, 3],
            b"\x22\x01x",
        ];
        assert_eq!(data, expect);
        assert_eq!(status, "0");
        // The relay's status ends the stream after what was sent before it.
        let (data, status) = body_frames(vec![
            Ok(Down::Part(vec![Bytes::from_static(b"cut")])),
            Err(Status::unavailable("gone")),
        ]);
        assert_eq!(data, vec![Bytes::from_static(b"cut")]);
        assert_eq!(status, (tonic::Code::Unavailable as i32).to_string());
    }
}
