//! One simulated proxy, kept cheap so that 10,000 of them do not dominate the machine: one TCP
//! connection, an HTTP/2 handshake with the `h2` crate (no tonic channel, no tower buffer task),
//! one gRPC stream. Responses are decoded only as far as `type_url` and `nonce`; the resources
//! are skipped by prost as unknown fields. The proxy subscribes like Envoy (CDS, then EDS, LDS,
//! RDS), ACKs every response, and sends its node only in the first request (Istio's bootstrap
//! sets `set_node_on_first_message_only`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use proto::type_url::{CLUSTER, ENDPOINT, LISTENER, ROUTE};
use tokio::net::TcpSocket;
use tokio::sync::OwnedSemaphorePermit;

use crate::common::node;

/// The cluster whose endpoints change.
pub const EDS: &str = "outbound|80||api.example.com";

/// SotW or Delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Sotw,
    Delta,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sotw => "sotw",
            Mode::Delta => "delta",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Mode::Sotw => {
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
            }
            Mode::Delta => {
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
            }
        }
    }
}

/// The two fields of `DiscoveryResponse` and `DeltaDiscoveryResponse` a proxy needs to ACK
/// (the same tags in both messages); everything else is skipped undecoded.
#[derive(Clone, PartialEq, prost::Message)]
struct ResponseHead {
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
}

/// What every proxy of one run reports into.
pub struct Shared {
    pub opened: AtomicUsize,
    pub synced: AtomicUsize,
    pub failed: AtomicUsize,
    /// Client tasks still running (the run waits for 0 before the next one).
    pub live: AtomicUsize,
    /// Set before the server is stopped: errors from then on are expected.
    pub closing: AtomicBool,
    /// Set just before the WorkloadEntry is rewritten: EDS ACKs from then on are timed.
    pub changed_at: OnceLock<Instant>,
    armed: AtomicBool,
    /// Per proxy: nanoseconds from `changed_at` to its EDS ACK, 0 = none yet.
    ack_nanos: Vec<AtomicU64>,
    pub acked: AtomicUsize,
}

impl Shared {
    pub fn new(n: usize) -> Shared {
        Shared {
            opened: AtomicUsize::new(0),
            synced: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            changed_at: OnceLock::new(),
            armed: AtomicBool::new(false),
            ack_nanos: (0..n).map(|_| AtomicU64::new(0)).collect(),
            acked: AtomicUsize::new(0),
        }
    }

    /// Starts timing EDS ACKs from now.
    pub fn arm(&self) {
        let _ = self.changed_at.set(Instant::now());
        self.armed.store(true, Ordering::SeqCst);
    }

    /// The ACK times recorded so far, sorted.
    pub fn ack_times(&self) -> Vec<std::time::Duration> {
        let mut v: Vec<_> = self
            .ack_nanos
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .filter(|n| *n > 0)
            .map(std::time::Duration::from_nanos)
            .collect();
        v.sort();
        v
    }

    fn record_ack(&self, i: usize) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        let Some(t0) = self.changed_at.get() else {
            return;
        };
        let nanos = (t0.elapsed().as_nanos() as u64).max(1);
        if self.ack_nanos[i]
            .compare_exchange(0, nanos, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.acked.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A length-prefixed gRPC message (uncompressed).
fn grpc_frame(msg: &impl Message) -> Bytes {
    let len = msg.encoded_len();
    let mut b = BytesMut::with_capacity(5 + len);
    b.extend_from_slice(&[0]);
    b.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode(&mut b).expect("BytesMut grows");
    b.freeze()
}

/// The next complete gRPC message in `buf`, if any.
fn next_message(buf: &mut BytesMut) -> Option<Bytes> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    buf.advance(5);
    Some(buf.split_to(len).freeze())
}

/// The request proxy `i` sends for `type_url`: a subscription (`nonce` empty) or an ACK.
fn request(mode: Mode, i: usize, first: bool, type_url: &str, nonce: &str) -> Bytes {
    let names: Vec<String> = match type_url {
        t if t == ENDPOINT => vec![EDS.into()],
        t if t == ROUTE => vec!["80".into()],
        _ => Vec::new(),
    };
    let node = first.then(|| node(i));
    match mode {
        Mode::Sotw => grpc_frame(&DiscoveryRequest {
            node,
            type_url: type_url.into(),
            resource_names: names,
            response_nonce: nonce.into(),
            ..Default::default()
        }),
        Mode::Delta => grpc_frame(&DeltaDiscoveryRequest {
            node,
            type_url: type_url.into(),
            // Delta subscribes once; ACKs carry no names.
            resource_names_subscribe: if nonce.is_empty() { names } else { Vec::new() },
            response_nonce: nonce.into(),
            ..Default::default()
        }),
    }
}

/// Runs proxy `i` until its stream ends; `permit` is released at its initial sync.
pub async fn run(
    addr: SocketAddr,
    mode: Mode,
    i: usize,
    shared: Arc<Shared>,
    permit: OwnedSemaphorePermit,
) {
    shared.live.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = proxy(addr, mode, i, &shared, permit).await
        && !shared.closing.load(Ordering::Relaxed)
        && shared.failed.fetch_add(1, Ordering::Relaxed) < 5
    {
        eprintln!("proxy {i}: {e}");
    }
    shared.live.fetch_sub(1, Ordering::Relaxed);
}

async fn proxy(
    addr: SocketAddr,
    mode: Mode,
    i: usize,
    shared: &Shared,
    permit: OwnedSemaphorePermit,
) -> Result<(), String> {
    let mut permit = Some(permit);
    let socket = TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    socket
        .bind(SocketAddr::new(crate::common::source(i), 0))
        .map_err(|e| format!("bind: {e}"))?;
    let tcp = socket
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (h2, conn) = h2::client::handshake(tcp)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::post(format!("http://{addr}{}", mode.path()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let mut h2 = h2.ready().await.map_err(|e| format!("ready: {e}"))?;
    let (response, mut send) = h2
        .send_request(req, false)
        .map_err(|e| format!("request: {e}"))?;
    let mut send_msg = |b: Bytes| send.send_data(b, false).map_err(|e| format!("send: {e}"));
    send_msg(request(mode, i, true, CLUSTER, ""))?;
    let response = response.await.map_err(|e| format!("response: {e}"))?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", response.status()));
    }
    shared.opened.fetch_add(1, Ordering::Relaxed);
    let mut body = response.into_body();
    let mut buf = BytesMut::new();
    let mut synced = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("stream: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while let Some(msg) = next_message(&mut buf) {
            let head = ResponseHead::decode(msg).map_err(|e| format!("decode: {e}"))?;
            send_msg(request(mode, i, false, &head.type_url, &head.nonce))?;
            if synced < 4 {
                synced += 1;
                let next = match head.type_url.as_str() {
                    t if t == CLUSTER => Some(ENDPOINT),
                    t if t == ENDPOINT => Some(LISTENER),
                    t if t == LISTENER => Some(ROUTE),
                    _ => None,
                };
                if let Some(t) = next {
                    send_msg(request(mode, i, false, t, ""))?;
                }
                if synced == 4 {
                    permit.take();
                    shared.synced.fetch_add(1, Ordering::Relaxed);
                }
            } else if head.type_url == ENDPOINT {
                shared.record_ack(i);
            }
        }
    }
    Ok(())
}
