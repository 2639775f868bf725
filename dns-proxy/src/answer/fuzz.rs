//! Entry points for the fuzz targets (`fuzz/fuzz_targets/dns_request.rs`, `dns_answer.rs`): the
//! request path and the upstream-answer path of a real [`AnswerPath`], never touching the network.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hickory_proto::op::Message;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::respond::{encode, upstream_to_client};
use super::{Action, AnswerPath, Source};
use crate::Metrics;
use crate::cache::{Cache, Key};
use crate::forward::Forwarder;
use crate::packet::Transport;
use crate::table::{Expansion, TableHandle};

fn answer_path(cache: Cache) -> AnswerPath {
    let mut registry = prometheus_client::registry::Registry::default();
    let table = TableHandle::new(Expansion {
        namespace: "ns1".into(),
        proxy_domain: "svc.cluster.local".into(),
        search: Some("ns1.svc.cluster.local".into()),
    });
    table.update(&crate::table::fuzz_table());
    AnswerPath {
        table,
        forwarder: Forwarder::new(
            vec![],
            Duration::from_millis(1),
            false,
            1232,
            CancellationToken::new(),
        ),
        cache: Some(cache),
        metrics: Arc::new(Metrics::new(&mut registry)),
        respond_before_sync: false,
        forwards: Arc::new(Semaphore::new(1)),
        upstream_failed_at: std::sync::Mutex::new(None),
        access_log: false,
        stop: CancellationToken::new(),
    }
}

/// Runs one packet through the request path (table loaded, both transports) and, when it would
/// be forwarded, runs it through the upstream-answer path with itself as the answer. Never
/// touches the network. For the fuzz target.
pub fn fuzz_request(data: &[u8]) {
    static PATH: OnceLock<AnswerPath> = OnceLock::new();
    let path = PATH.get_or_init(|| answer_path(Cache::new(64, 1 << 20)));
    for transport in [Transport::Udp, Transport::Tcp] {
        let action = path.handle(data, transport);
        if let Action::ForwardWire(w) = &action {
            let mut answer = data.to_vec();
            answer[2] |= 0x80;
            let _ = path.wire_answer(w, answer, &Cell::new(Source::Upstream));
        }
        if let Action::Forward(req, _) = action {
            // The same bytes, marked as a response, are the upstream's answer.
            let mut answer = data.to_vec();
            answer[2] |= 0x80;
            let server: SocketAddr = ([127, 0, 0, 1], 53).into();
            if let Ok(resp) = crate::forward::check_answer(server, &answer, &req) {
                if let (Some(cache), Some(key)) = (&path.cache, Key::of(&req)) {
                    cache.put(key, &resp, std::time::Instant::now());
                }
                let _ = encode(&upstream_to_client(resp, &req), &req, transport);
            }
        }
    }
}

/// The cache budget of [`fuzz_upstream_answer`]'s path: small, so a few large answers fill it.
pub const FUZZ_CACHE_BYTES: usize = 64 * 1024;
/// Its entry cap.
pub const FUZZ_CACHE_ENTRIES: usize = 32;

/// Record types the answer target asks for (chosen by the input's first byte).
const QTYPES: [u16; 8] = [1, 28, 5, 16, 15, 33, 12, 255];

/// Any upstream answer, large or truncated, through the path that parses and caches it: the
/// input picks a question (one of 16 names outside the table, a type, UDP or TCP, an EDNS size)
/// and the answer's header bits and counts; the rest of the input is the answer's records,
/// after a header and the question that match the query (so the parser gets past the match),
/// repeated up to 64 KiB when asked. UDP answers take the wire path (`wire_answer`: cache,
/// rewrite, cut to the client's size), TCP ones the parsed path (`check_answer`, cache,
/// encode). After each, the cache must be within its byte and entry budget.
pub fn fuzz_upstream_answer(data: &[u8]) {
    static PATH: OnceLock<AnswerPath> = OnceLock::new();
    let path = PATH.get_or_init(|| answer_path(Cache::new(FUZZ_CACHE_ENTRIES, FUZZ_CACHE_BYTES)));
    let [pick, flags, rcode, an, ns, ar, edns_hi, rest @ ..] = data else {
        return;
    };
    let qtype = QTYPES[usize::from(pick & 7)];
    let name = format!("up{}.example.org", (pick >> 3) & 15);
    let tcp = flags & 1 != 0;
    let transport = if tcp { Transport::Tcp } else { Transport::Udp };
    // The query as a stub resolver sends it, with EDNS (a buffer size of 512..=65535) when asked.
    let id = 0x4d2u16;
    let mut query = Vec::with_capacity(64);
    query.extend_from_slice(&id.to_be_bytes());
    query.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(flags & 2 != 0)]);
    for label in name.split('.') {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.push(0);
    query.extend_from_slice(&qtype.to_be_bytes());
    query.extend_from_slice(&[0, 1]);
    let question_end = query.len();
    if flags & 2 != 0 {
        let size = 512u16.max(u16::from(*edns_hi) << 8);
        query.extend_from_slice(&[0, 0, 41]);
        query.extend_from_slice(&size.to_be_bytes());
        query.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    }
    // The answer: header (QR, the input's TC/AA/RA bits and rcode, its counts), the question,
    // then the input's bytes as records (repeated to a large answer when asked).
    let mut answer = Vec::with_capacity(question_end + rest.len());
    answer.extend_from_slice(&id.to_be_bytes());
    answer.push(0x81 | (flags & 0x06));
    answer.push(0x80 | (rcode & 0x0f));
    answer.extend_from_slice(&[0, 1]);
    for count in [an, ns, ar] {
        answer.extend_from_slice(&u16::from(*count).to_be_bytes());
    }
    answer.extend_from_slice(&query[12..question_end]);
    if flags & 0x80 != 0 && !rest.is_empty() {
        while answer.len() + rest.len() <= 65535 {
            answer.extend_from_slice(rest);
        }
    } else {
        answer.extend_from_slice(rest);
    }
    if flags & 0x40 != 0 {
        // Truncated anywhere, as a lost or cut datagram would be.
        let cut = usize::from(*edns_hi) * answer.len() / 256;
        answer.truncate(cut.max(12));
    }
    match path.handle(&query, transport) {
        Action::ForwardWire(w) => {
            let _ = path.wire_answer(&w, answer, &Cell::new(Source::Upstream));
        }
        Action::Forward(req, _) => {
            let server: SocketAddr = ([127, 0, 0, 1], 53).into();
            if let Ok(resp) = crate::forward::check_answer(server, &answer, &req) {
                if let (Some(cache), Some(key)) = (&path.cache, Key::of(&req)) {
                    cache.put(key, &resp, std::time::Instant::now());
                }
                let _ = encode(&upstream_to_client(resp, &req), &req, transport);
            }
        }
        _ => {}
    }
    let cache = path.cache.as_ref().expect("the fuzz path caches");
    assert!(
        cache.bytes() <= FUZZ_CACHE_BYTES,
        "cache holds {} bytes, over its {FUZZ_CACHE_BYTES}-byte budget",
        cache.bytes()
    );
    assert!(
        cache.len() <= FUZZ_CACHE_ENTRIES,
        "cache holds {} entries",
        cache.len()
    );
    let _ = Message::from_vec(&query);
}
