//! The ADS gRPC service, written out instead of generated, so that a stream costs little:
//!
//! - responses go out as the shared bytes of `xds::encoded` (a small per-stream head, then the
//!   resource entries every stream shares); tonic's generated service encodes each response
//!   into a per-stream buffer that grows to the largest response and keeps that size for the
//!   life of the stream;
//! - requests are decoded with a 1 KiB initial buffer (tonic's default: 8 KiB per stream);
//! - the channel from the stream's task to its response body carries small items.
//!
//! Routes `/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`
//! (SotW) and `.../DeltaAggregatedResources`; any other method answers `UNIMPLEMENTED`, as the
//! generated service does. Compressed requests are refused (no `grpc-encoding` is accepted, as
//! before).

use std::convert::Infallible;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::StreamExt;
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body, Frame as BodyFrame};
use prost::bytes::Bytes;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::sync::mpsc;
use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder, Streaming};
use tonic::server::NamedService;

use super::super::encoded::Frame;
use super::{AdsServer, Req, ReqStream};
use crate::ca::{Authenticator, Identity, peer_certs};

/// What a stream's task sends to its response body. Both variants are boxed: tokio's channel
/// allocates its slots 32 at a time whatever its capacity, so each stream holds 32 of these
/// (16 bytes each boxed; 64 with the frame inline, 2 KiB per stream).
pub(crate) enum Wire {
    /// One response.
    Message(Box<Frame>),
    /// The stream ends with this status.
    End(Box<Status>),
}

/// Responses a stream's task may queue before it waits for the connection (per stream).
const QUEUED_RESPONSES: usize = 16;
/// Initial request decode buffer: requests are small (names and nonces; the first carries the
/// node). The buffer grows for a larger one.
const DECODE_BUFFER: usize = 1024;

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The ADS service for a tonic server (see [`AdsServer::service`]).
#[derive(Clone)]
pub struct AdsService {
    ads: AdsServer,
    max_decoding_message_size: usize,
    /// The secure port's: every stream must carry a client certificate or a token (see
    /// [`AdsService::authenticated`]).
    authn: Option<Authenticator>,
}

impl AdsService {
    pub(super) fn new(ads: AdsServer, max_decoding_message_size: usize) -> AdsService {
        AdsService {
            ads,
            max_decoding_message_size,
            authn: None,
        }
    }

    /// Streams are refused `UNAUTHENTICATED` unless they carry a client certificate issued by
    /// this CA or a valid bearer token (istiod's check on 15012); the identity then has to match
    /// the proxy's node (namespace, service account) or the stream ends `PERMISSION_DENIED` at
    /// its first request.
    pub fn authenticated(mut self, authn: Authenticator) -> AdsService {
        self.authn = Some(authn);
        self
    }

    fn open<T, B>(
        &self,
        body: B,
        delta: bool,
        identity: Option<Identity>,
    ) -> http::Response<tonic::body::Body>
    where
        T: prost::Message + Default + Send + 'static,
        Req: From<T>,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<tonic::codegen::StdError> + Send + 'static,
    {
        let requests = Streaming::new_request(
            ProstDecoder::<T>(PhantomData),
            body,
            None,
            Some(self.max_decoding_message_size),
        );
        let requests: ReqStream = Box::pin(requests.map(|r| r.map(Req::from)));
        let (tx, rx) = mpsc::channel(QUEUED_RESPONSES);
        self.ads.spawn(tx, delta, requests, identity);
        let mut response = http::Response::new(tonic::body::Body::new(ResponseBody {
            rx,
            queued: None,
            done: false,
        }));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        response
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl<B> tonic::codegen::Service<http::Request<B>> for AdsService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let delta = match req.uri().path() {
            SOTW_PATH => false,
            DELTA_PATH => true,
            _ => return std::future::ready(Ok(Status::unimplemented("").into_http())),
        };
        let identity = match &self.authn {
            None => None,
            Some(authn) => {
                let certs = peer_certs(req.extensions());
                match authn.authenticate(req.headers(), certs.as_deref().map(|c| c.as_slice())) {
                    Ok(id) => Some(id),
                    Err(status) => {
                        tracing::warn!(error = %status.message(), "xDS stream refused: authentication");
                        return std::future::ready(Ok(status.into_http()));
                    }
                }
            }
        };
        let response = if delta {
            self.open::<DeltaDiscoveryRequest, B>(req.into_body(), true, identity)
        } else {
            self.open::<DiscoveryRequest, B>(req.into_body(), false, identity)
        };
        std::future::ready(Ok(response))
    }
}

/// Decodes one request message with prost, from a small initial buffer.
struct ProstDecoder<T>(PhantomData<T>);

impl<T: prost::Message + Default> Decoder for ProstDecoder<T> {
    type Item = T;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<T>, Status> {
        T::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(format!("cannot decode the ADS request: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(DECODE_BUFFER, 32 * 1024)
    }
}

/// A stream's response body: each response as two data frames (head, shared body), then the
/// trailers with the final status (`OK` when the stream's task ends without one).
struct ResponseBody {
    rx: mpsc::Receiver<Wire>,
    /// The body part of the response whose head was just yielded.
    queued: Option<Bytes>,
    done: bool,
}

fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", HeaderValue::from_static("13"));
    }
    map
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(body) = this.queued.take() {
            return Poll::Ready(Some(Ok(BodyFrame::data(body))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let end = match std::task::ready!(this.rx.poll_recv(cx)) {
            Some(Wire::Message(frame)) => {
                let frame = *frame;
                if !frame.body.is_empty() {
                    this.queued = Some(frame.body);
                }
                return Poll::Ready(Some(Ok(BodyFrame::data(frame.head))));
            }
            Some(Wire::End(status)) => *status,
            None => Status::ok(""),
        };
        this.done = true;
        this.rx.close();
        Poll::Ready(Some(Ok(BodyFrame::trailers(trailers(&end)))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.queued.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn frame(head: &'static [u8], body: &'static [u8]) -> Frame {
        Frame {
            head: Bytes::from_static(head),
            body: Bytes::from_static(body),
        }
    }

    #[tokio::test]
    async fn body_yields_head_then_shared_bytes_then_the_status() {
        let (tx, rx) = mpsc::channel(4);
        let mut body = ResponseBody {
            rx,
            queued: None,
            done: false,
        };
        tx.send(Wire::Message(Box::new(frame(b"h1", b"b1"))))
            .await
            .unwrap();
        tx.send(Wire::Message(Box::new(frame(b"h2", b""))))
            .await
            .unwrap();
        tx.send(Wire::End(Box::new(Status::invalid_argument("bad node"))))
            .await
            .unwrap();
        let mut data = Vec::new();
        let mut trailer = None;
        while let Some(f) = body.frame().await {
            let f = f.expect("frame");
            match f.into_data() {
                Ok(d) => data.push(d),
                Err(f) => trailer = f.into_trailers().ok(),
            }
        }
        assert_eq!(data, ["h1", "b1", "h2"], "an empty body part is not sent");
        let trailer = trailer.expect("trailers");
        assert_eq!(trailer["grpc-status"], "3");
        assert_eq!(
            trailer["grpc-message"], "bad%20node",
            "percent-encoded, as gRPC says"
        );
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn body_ends_ok_when_the_stream_task_ends() {
        let (tx, rx) = mpsc::channel(1);
        let mut body = ResponseBody {
            rx,
            queued: None,
            done: false,
        };
        drop(tx);
        let f = body.frame().await.expect("trailers").expect("frame");
        let t = f.into_trailers().expect("trailers");
        assert_eq!(t["grpc-status"], "0");
        assert!(body.frame().await.is_none());
    }
}
