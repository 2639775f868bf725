//! The answer path, in one place: one query in, one answer out. The listeners (`server`) only
//! read datagrams and TCP frames and send what this module gives back.
//!
//! 1. [`AnswerPath::handle`], synchronous: packets shorter than a header and responses are
//!    dropped; a plain A/AAAA query for a table host is answered on the wire
//!    ([`local::wire`]); a plain UDP query the table does not answer is served from the cache
//!    or forwarded on the wire path ([`WireQuery`], no parse); anything else is parsed into a
//!    `Message`: FORMERR (also for no question or several), NOTIMP, BADVERS, SERVFAIL (no table yet) where due,
//!    else the table's answer ([`local::message`]), the cache's, or a forward.
//! 2. Forwards, bounded by the in-flight limit (SERVFAIL beyond it): over UDP
//!    ([`AnswerPath::udp_query`]) wire-path queries are relayed without a task of their own
//!    ([`crate::forward::Forwarder::relay_batch`]; [`WireRelay`] makes the client's answer where
//!    the upstream's arrives), else run in a task; over TCP ([`AnswerPath::tcp_query`]) the
//!    connection awaits them.
//! 3. The upstream's answer made the client's, and cached: rewritten on the wire
//!    ([`rewrite::to_client`]), else as a `Message` ([`respond::upstream_to_client`]), encoded to
//!    the client's size with TC when cut ([`respond::encode`]); SERVFAIL when every upstream
//!    failed.

pub(crate) mod bench;
pub(crate) mod fuzz;
mod local;
mod respond;
mod rewrite;
mod stale;
mod truncate;

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, OpCode, ResponseCode};
use tokio::net::UdpSocket;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cache::{Cache, Key, Lookup};
use crate::datagrams::ClientReply;
use crate::forward::{ForwardError, Forwarder, Raw, Relay};
use crate::packet::{self, Question, Transport};
use crate::table::{Expansion, LookupTable, TableHandle};
use crate::{Config, Metrics};
use respond::{encode, respond, upstream_to_client};

/// Everything the answer path needs: the table, the cache, the forwarder and the bound on
/// forwards in flight.
pub(crate) struct AnswerPath {
    pub table: TableHandle,
    pub forwarder: Forwarder,
    pub cache: Option<Cache>,
    pub metrics: Arc<Metrics>,
    /// Forward before the first table arrives (else SERVFAIL).
    pub respond_before_sync: bool,
    /// Forwards in flight.
    pub forwards: Arc<Semaphore>,
    /// When every upstream last failed (cleared by an answer): for the stale TTL after it,
    /// stale answers are given without asking upstream again (RFC 8767's failure recheck).
    pub upstream_failed_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// One log line per query ([`crate::Config::access_log`]).
    pub access_log: bool,
    /// The proxy's stop: ends the forwards that outlive their client's answer (a refresh after
    /// the client response timer).
    stop: CancellationToken,
}

/// Where a query's answer came from (the access log's `from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The NDS name table.
    Table,
    Cache,
    /// The cache past its TTL, every upstream having failed or being slower than the client
    /// response timer (RFC 8767).
    Stale,
    Upstream,
    /// Made here: an error (FORMERR, NOTIMP, SERVFAIL when every upstream failed, ...).
    Local,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Table => "table",
            Source::Cache => "cache",
            Source::Stale => "stale",
            Source::Upstream => "upstream",
            Source::Local => "local",
        }
    }
}

/// What to do with one received packet.
pub(crate) enum Action {
    Reply(Vec<u8>),
    /// A cached answer, and the query forwarded in the background to refresh it (prefetch).
    ReplyAndRefresh(Vec<u8>, Box<WireQuery>),
    /// A query to forward; `true`: a stale answer is kept for it (the client response timer
    /// applies).
    Forward(Box<Message>, bool),
    /// A plain UDP query forwarded on the wire path.
    ForwardWire(Box<WireQuery>),
    Drop,
}

/// A plain UDP query to forward without parsing it into a `Message`.
pub(crate) struct WireQuery {
    req: Vec<u8>,
    q: Question,
    /// Where the answer is cached (when the cache is on).
    key: Option<Key>,
    /// A stale answer is kept for it (the client response timer applies).
    stale: bool,
}

/// Where a UDP query's answer goes: the listening socket it came in on, and the tasks and
/// shutdown of its listener (answers in flight are dropped unsent at shutdown).
pub(crate) struct UdpListener<'a> {
    pub sock: &'a Arc<UdpSocket>,
    pub shutdown: &'a CancellationToken,
    pub tracker: &'a TaskTracker,
}

/// What a receive batch produced: answers to send, and queries to relay upstream (sent
/// together after the batch, [`AnswerPath::relay_queued`]).
#[derive(Default)]
pub(crate) struct Outgoing {
    pub replies: Vec<(Vec<u8>, SocketAddr)>,
    relays: Vec<(Vec<u8>, Box<dyn Relay>)>,
}

impl AnswerPath {
    /// The answer path `config` asks for: an empty name table until the first NDS push, the
    /// forwarder (stopped by `stop`), the cache when on, the bound on forwards in flight.
    pub fn new(config: &Config, metrics: Arc<Metrics>, stop: CancellationToken) -> AnswerPath {
        let expansion = Expansion {
            namespace: config.namespace.to_ascii_lowercase(),
            proxy_domain: config.proxy_domain(),
            search: config.search_domains.first().cloned(),
        };
        AnswerPath {
            table: TableHandle::new(expansion),
            forwarder: Forwarder::new(
                config.upstreams.clone(),
                config.forward_timeout,
                config.forward_parallel,
                config.upstream_udp_payload,
                stop.clone(),
            ),
            stop,
            cache: config.cache_enabled.then(|| {
                Cache::new(config.cache_max_entries, config.cache_max_bytes)
                    .serving_stale(config.serve_stale, config.prefetch)
            }),
            upstream_failed_at: std::sync::Mutex::new(None),
            access_log: config.access_log,
            metrics,
            respond_before_sync: config.respond_before_sync,
            forwards: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
        }
    }

    /// The synchronous part of the request path: everything except the upstream exchange.
    pub fn handle(&self, bytes: &[u8], transport: Transport) -> Action {
        self.handle_from(bytes, transport, &Cell::new(Source::Local))
    }

    /// [`AnswerPath::handle`], saying in `from` where an answer came from.
    fn handle_from(&self, bytes: &[u8], transport: Transport, from: &Cell<Source>) -> Action {
        // Shorter than a header, or a response (reflection): drop silently.
        if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
            return Action::Drop;
        }
        self.metrics.requests.inc();
        let table = self.table.get();
        let plain = packet::parse(bytes);
        if let (Some(t), Some(q)) = (&table, &plain) {
            let mut out = Vec::new();
            if local::wire(t, q, bytes, transport == Transport::Udp, &mut out) {
                from.set(Source::Table);
                return Action::Reply(out);
            }
        }
        if transport == Transport::Udp
            && let Some(q) = plain
            && let Some(action) = self.wire_forward(bytes, q, table.as_deref(), from)
        {
            return action;
        }
        let req = match Message::from_vec(bytes) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "malformed DNS request");
                return reply(respond::error_header(bytes, ResponseCode::FormErr));
            }
        };
        if req.metadata.op_code != OpCode::Query {
            // The header alone, as Istio's DNS server (miekg/dns) answers an opcode it does not
            // implement.
            return reply(respond::error_header(bytes, ResponseCode::NotImp));
        }
        if req.edns.as_ref().is_some_and(|e| e.version() > 0) {
            return reply(encode(
                &respond(&req, ResponseCode::BADVERS),
                &req,
                transport,
            ));
        }
        if req.queries.len() != 1 {
            // No question, or more than one: FORMERR with the header alone, as Istio's DNS
            // server (miekg/dns) rejects a query whose QDCOUNT is not 1 before it is served.
            return reply(respond::error_header(bytes, ResponseCode::FormErr));
        }
        let Some(table) = table else {
            if self.respond_before_sync {
                return self.cached_or_forward(req, transport, from);
            }
            return reply(encode(
                &respond(&req, ResponseCode::ServFail),
                &req,
                transport,
            ));
        };
        if let Some(resp) = local::message(&table, &req) {
            from.set(Source::Table);
            return reply(encode(&resp, &req, transport));
        }
        self.cached_or_forward(req, transport, from)
    }

    /// The wire path for a plain UDP query the table does not answer: a cached answer, or a
    /// forward. `None` leaves the query to the `Message` path.
    fn wire_forward(
        &self,
        bytes: &[u8],
        q: Question,
        table: Option<&LookupTable>,
        from: &Cell<Source>,
    ) -> Option<Action> {
        let ours = match table {
            Some(t) => q.qclass == 1 && t.answers(q.lower_name(), q.qtype),
            // Before the first table: SERVFAIL unless respond-before-sync (Message path).
            None => !self.respond_before_sync,
        };
        if ours {
            return None;
        }
        let key = match &self.cache {
            Some(cache) => {
                let key = Key::from_wire(
                    q.lower_name(),
                    q.qtype,
                    q.qclass,
                    q.edns.is_some_and(|e| e.dnssec_ok),
                    bytes[3] & 0x10 != 0,
                );
                let now = std::time::Instant::now();
                match cache.lookup(&key, now) {
                    Lookup::Fresh { msg, prefetch } => {
                        self.metrics.cache_hits.inc();
                        from.set(Source::Cache);
                        let req = Message::from_vec(bytes).ok()?;
                        let answer = encode(&upstream_to_client(msg, &req), &req, Transport::Udp)?;
                        if prefetch {
                            let w = WireQuery {
                                req: bytes.to_vec(),
                                q,
                                key: Some(key),
                                stale: false,
                            };
                            return Some(Action::ReplyAndRefresh(answer, Box::new(w)));
                        }
                        return Some(Action::Reply(answer));
                    }
                    Lookup::Stale if self.upstream_down() => {
                        let req = Message::from_vec(bytes).ok()?;
                        return Some(reply(self.stale_answer(&key, &req, Transport::Udp, from)));
                    }
                    Lookup::Stale => (Some(key), true),
                    Lookup::Miss => (Some(key), false),
                }
            }
            None => (None, false),
        };
        let (key, stale) = key;
        Some(Action::ForwardWire(Box::new(WireQuery {
            req: bytes.to_vec(),
            q,
            key,
            stale,
        })))
    }

    fn cached_or_forward(&self, req: Message, transport: Transport, from: &Cell<Source>) -> Action {
        let mut stale = false;
        if let Some(cache) = &self.cache
            && let Some(key) = Key::of(&req)
        {
            match cache.lookup(&key, std::time::Instant::now()) {
                Lookup::Fresh { msg, .. } => {
                    self.metrics.cache_hits.inc();
                    from.set(Source::Cache);
                    return reply(encode(&upstream_to_client(msg, &req), &req, transport));
                }
                Lookup::Stale if self.upstream_down() => {
                    return reply(self.stale_answer(&key, &req, transport, from));
                }
                Lookup::Stale => stale = true,
                Lookup::Miss => {}
            }
        }
        Action::Forward(Box::new(req), stale)
    }

    /// One received UDP datagram from `src`: an answer now, a query to relay (both queued in
    /// `out`), or a forward in its own task (parallel mode, the `Message` path).
    pub fn udp_query(
        self: &Arc<Self>,
        listener: &UdpListener<'_>,
        bytes: &[u8],
        src: SocketAddr,
        out: &mut Outgoing,
    ) {
        let (from, start) = (Cell::new(Source::Local), tokio::time::Instant::now());
        match self.handle_from(bytes, Transport::Udp, &from) {
            Action::Reply(b) => {
                self.log(bytes, &b, src, from.get(), start);
                out.replies.push((b, src));
            }
            Action::ReplyAndRefresh(b, w) => {
                self.log(bytes, &b, src, from.get(), start);
                out.replies.push((b, src));
                self.queue_refresh(w, &mut out.relays);
            }
            Action::Drop => {}
            Action::ForwardWire(w) => self.forward_wire(listener, w, src, start, out),
            Action::Forward(req, stale) => match self.forwards.clone().try_acquire_owned() {
                Ok(permit) => {
                    let path = self.clone();
                    spawn_answer(listener, src, async move {
                        path.complete_or_stale(*req, stale, Transport::Udp, permit, src, start)
                            .await
                    });
                }
                Err(_) => {
                    if let Some(b) = self.overloaded(&req, Transport::Udp) {
                        out.replies.push((b, src));
                    }
                }
            },
        }
    }

    /// A cached answer's background refresh (prefetch), queued for relaying.
    fn queue_refresh(
        self: &Arc<Self>,
        w: Box<WireQuery>,
        relays: &mut Vec<(Vec<u8>, Box<dyn Relay>)>,
    ) {
        // Only when a forward slot is free and relaying is possible: a prefetch never
        // competes with a client's query.
        if self.forwarder.can_relay()
            && let Ok(permit) = self.forwards.clone().try_acquire_owned()
        {
            self.metrics.prefetches.inc();
            let query = rewrite::upstream_query(&w.req, &w.q, self.forwarder.udp_payload);
            relays.push((
                query,
                Box::new(Refresh {
                    path: self.clone(),
                    w,
                    _permit: permit,
                }),
            ));
        }
    }

    /// A plain UDP query forwarded on the wire path: relayed in the receive batch, or in a task
    /// of its own when a stale answer waits or relaying is not possible; SERVFAIL when every
    /// forward slot is taken.
    fn forward_wire(
        self: &Arc<Self>,
        listener: &UdpListener<'_>,
        w: Box<WireQuery>,
        src: SocketAddr,
        start: tokio::time::Instant,
        out: &mut Outgoing,
    ) {
        match self.forwards.clone().try_acquire_owned() {
            // The client response timer: in a task of its own (RFC 8767).
            Ok(permit) if w.stale => {
                let path = self.clone();
                spawn_answer(listener, src, async move {
                    path.wire_within_client_timer(*w, permit, src, start).await
                });
            }
            Ok(permit) if self.forwarder.can_relay() => {
                self.metrics.upstream_requests.inc();
                let query = rewrite::upstream_query(&w.req, &w.q, self.forwarder.udp_payload);
                let ctx = Box::new(WireRelay {
                    path: self.clone(),
                    w,
                    sock: listener.sock.clone(),
                    src,
                    start: tokio::time::Instant::now(),
                    _permit: permit,
                });
                out.relays.push((query, ctx));
            }
            Ok(permit) => {
                let path = self.clone();
                spawn_answer(listener, src, async move {
                    let _permit = permit;
                    path.complete_wire(&w, src, start).await
                });
            }
            Err(_) => {
                self.metrics.upstream_failures.inc();
                out.replies
                    .push((rewrite::error_answer(&w.req, &w.q, 2), src));
            }
        }
    }

    /// Sends the queries a receive batch queued for relaying upstream; the answers of those
    /// already finished (every send failed) join `out.replies`.
    pub fn relay_queued(&self, out: &mut Outgoing) {
        if !out.relays.is_empty() {
            for r in self.forwarder.relay_batch(&mut out.relays) {
                out.replies.push((r.bytes, r.to));
            }
        }
    }

    /// One query received over TCP: its answer, if any (forwards awaited here).
    pub async fn tcp_query(self: &Arc<Self>, bytes: &[u8], client: SocketAddr) -> Option<Vec<u8>> {
        let (from, start) = (Cell::new(Source::Local), tokio::time::Instant::now());
        let action = self.handle_from(bytes, Transport::Tcp, &from);
        match action {
            Action::Reply(b) | Action::ReplyAndRefresh(b, _) => {
                self.log(bytes, &b, client, from.get(), start);
                Some(b)
            }
            // Only UDP queries take the wire path.
            Action::Drop | Action::ForwardWire(_) => None,
            Action::Forward(req, stale) => match self.forwards.clone().try_acquire_owned() {
                Ok(permit) => {
                    self.complete_or_stale(*req, stale, Transport::Tcp, permit, client, start)
                        .await
                }
                Err(_) => self.overloaded(&req, Transport::Tcp),
            },
        }
    }

    /// [`AnswerPath::complete`] for the wire path.
    async fn complete_wire(
        &self,
        w: &WireQuery,
        client: SocketAddr,
        started: tokio::time::Instant,
    ) -> Option<Vec<u8>> {
        let result = self.upstream_wire(w).await;
        self.wire_result(w, result, client, started)
    }

    /// The upstream exchange of the wire query `w`, counted and timed.
    async fn upstream_wire(&self, w: &WireQuery) -> Result<Vec<u8>, ForwardError> {
        self.metrics.upstream_requests.inc();
        let start = tokio::time::Instant::now();
        let query = rewrite::upstream_query(&w.req, &w.q, self.forwarder.udp_payload);
        let result = self
            .forwarder
            .forward_bytes::<Raw>(query, Transport::Udp)
            .await;
        self.metrics
            .upstream_duration
            .observe(start.elapsed().as_secs_f64());
        result.map(|Raw(answer)| answer)
    }

    /// The client's answer to `w` from the upstream exchange's `result` (logged).
    fn wire_result(
        &self,
        w: &WireQuery,
        result: Result<Vec<u8>, ForwardError>,
        client: SocketAddr,
        started: tokio::time::Instant,
    ) -> Option<Vec<u8>> {
        let from = Cell::new(Source::Upstream);
        let answer = match result {
            Ok(answer) => self.wire_answer(w, answer, &from)?,
            Err(e) => {
                self.metrics.upstream_failures.inc();
                tracing::debug!(error = %e, "DNS forward failed");
                from.set(Source::Local);
                self.wire_failure(w, &from)
            }
        };
        self.log(&w.req, &answer, client, from.get(), started);
        Some(answer)
    }

    /// The client's answer from the upstream's `answer` to `w` (cached when the cache is on).
    fn wire_answer(&self, w: &WireQuery, answer: Vec<u8>, from: &Cell<Source>) -> Option<Vec<u8>> {
        if failed_upstream(&answer) {
            // The last upstream's SERVFAIL/REFUSED: a stale answer is better, when there is one.
            if let Some(stale) = self.wire_stale(w, from) {
                return Some(stale);
            }
        } else {
            self.upstream_result(false);
        }
        let mut parsed = None;
        if let (Some(cache), Some(key)) = (&self.cache, &w.key)
            && let Ok(m) = Message::from_vec(&answer)
        {
            cache.put(key.clone(), &m, std::time::Instant::now());
            parsed = Some(m);
        }
        let answer = match rewrite::to_client(answer, &w.req, &w.q) {
            Ok(b) => return Some(b),
            Err(answer) => answer,
        };
        // Cut to the client's size, or unusual: the Message path.
        let req = Message::from_vec(&w.req).ok()?;
        match parsed.map_or_else(|| Message::from_vec(&answer), Ok) {
            Ok(resp) => encode(&upstream_to_client(resp, &req), &req, Transport::Udp),
            Err(e) => {
                self.metrics.upstream_failures.inc();
                tracing::debug!(error = %e, "invalid DNS upstream answer");
                encode(&respond(&req, ResponseCode::ServFail), &req, Transport::Udp)
            }
        }
    }

    /// The asynchronous part: forward, cache, answer (SERVFAIL when every upstream failed).
    async fn complete(
        &self,
        req: &Message,
        transport: Transport,
        client: SocketAddr,
        started: tokio::time::Instant,
    ) -> Option<Vec<u8>> {
        let result = self.upstream_message(req, transport).await;
        self.message_result(req, transport, result, client, started)
    }

    /// The upstream exchange of `req`, counted and timed.
    async fn upstream_message(
        &self,
        req: &Message,
        transport: Transport,
    ) -> Result<Message, ForwardError> {
        self.metrics.upstream_requests.inc();
        let start = tokio::time::Instant::now();
        let result = self.forwarder.forward(req, transport).await;
        self.metrics
            .upstream_duration
            .observe(start.elapsed().as_secs_f64());
        result
    }

    /// The client's answer to `req` from the upstream exchange's `result` (logged).
    fn message_result(
        &self,
        req: &Message,
        transport: Transport,
        result: Result<Message, ForwardError>,
        client: SocketAddr,
        started: tokio::time::Instant,
    ) -> Option<Vec<u8>> {
        let from = Cell::new(Source::Upstream);
        let answer = self.forward_answer(req, transport, result, &from)?;
        if self.access_log {
            let query = req.to_vec().unwrap_or_default();
            self.log(&query, &answer, client, from.get(), started);
        }
        Some(answer)
    }

    /// The client's answer from forwarding `req` (cached; stale, or SERVFAIL, when every
    /// upstream failed).
    fn forward_answer(
        &self,
        req: &Message,
        transport: Transport,
        result: Result<Message, ForwardError>,
        from: &Cell<Source>,
    ) -> Option<Vec<u8>> {
        let failed = match &result {
            Ok(resp) => matches!(
                resp.metadata.response_code,
                ResponseCode::ServFail | ResponseCode::Refused
            ),
            Err(_) => true,
        };
        self.upstream_result(failed);
        if failed
            && let Some(key) = Key::of(req)
            && let Some(stale) = self.stale_answer(&key, req, transport, from)
        {
            return Some(stale);
        }
        match result {
            Ok(resp) => {
                if let (Some(cache), Some(key)) = (&self.cache, Key::of(req)) {
                    cache.put(key, &resp, std::time::Instant::now());
                }
                encode(&upstream_to_client(resp, req), req, transport)
            }
            Err(e) => {
                self.metrics.upstream_failures.inc();
                tracing::debug!(error = %e, "DNS forward failed");
                from.set(Source::Local);
                encode(&respond(req, ResponseCode::ServFail), req, transport)
            }
        }
    }

    /// One access-log line for a query (`DNS_PROXY_ACCESS_LOG`): its name and type, the
    /// answer's rcode, the client, where the answer came from, and how long it took.
    fn log(
        &self,
        query: &[u8],
        answer: &[u8],
        client: SocketAddr,
        from: Source,
        started: tokio::time::Instant,
    ) {
        if !self.access_log {
            return;
        }
        let (name, qtype) = match packet::parse(query) {
            Some(q) => (q.lower_name().to_string(), q.qtype.to_string()),
            None => ("-".to_string(), "-".to_string()),
        };
        let rcode = ResponseCode::from(0, answer.get(3).map_or(0, |b| b & 0x0f));
        tracing::info!(
            target: "dns_access",
            name = %name,
            qtype = %qtype,
            rcode = %rcode,
            client = %client,
            from = from.as_str(),
            latency_us = started.elapsed().as_micros() as u64,
            "dns query"
        );
    }

    /// SERVFAIL for a query refused because too many are in flight.
    fn overloaded(&self, req: &Message, transport: Transport) -> Option<Vec<u8>> {
        self.metrics.upstream_failures.inc();
        encode(&respond(req, ResponseCode::ServFail), req, transport)
    }
}

fn reply(bytes: Option<Vec<u8>>) -> Action {
    match bytes {
        Some(b) => Action::Reply(b),
        None => Action::Drop,
    }
}

/// Runs `answer` in a task of its own and sends what it gives to `src` on the listener's
/// socket; dropped unsent at shutdown.
fn spawn_answer(
    listener: &UdpListener<'_>,
    src: SocketAddr,
    answer: impl Future<Output = Option<Vec<u8>>> + Send + 'static,
) {
    let (sock, shutdown) = (listener.sock.clone(), listener.shutdown.clone());
    listener.tracker.spawn(async move {
        let answer = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = answer => a,
        };
        if let Some(b) = answer {
            let _ = sock.send_to(&b, src).await;
        }
    });
}

/// A wire-path query relayed upstream without a task of its own (see
/// [`Forwarder::relay_batch`]): the client's answer is made and sent where the upstream's
/// answer (or timeout) is handled.
struct WireRelay {
    path: Arc<AnswerPath>,
    w: Box<WireQuery>,
    sock: Arc<UdpSocket>,
    src: SocketAddr,
    start: tokio::time::Instant,
    /// Counts against the bound on queries in flight until the answer is made.
    _permit: OwnedSemaphorePermit,
}

impl Relay for WireRelay {
    fn finish(self: Box<Self>, result: Result<Vec<u8>, ForwardError>) -> Option<ClientReply> {
        let path = &self.path;
        path.metrics
            .upstream_duration
            .observe(self.start.elapsed().as_secs_f64());
        let from = Cell::new(Source::Upstream);
        let bytes = match result {
            Ok(answer) => path.wire_answer(&self.w, answer, &from)?,
            Err(e) => {
                path.metrics.upstream_failures.inc();
                tracing::debug!(error = %e, "DNS forward failed");
                from.set(Source::Local);
                path.wire_failure(&self.w, &from)
            }
        };
        path.log(&self.w.req, &bytes, self.src, from.get(), self.start);
        Some(ClientReply {
            sock: self.sock.clone(),
            bytes,
            to: self.src,
        })
    }
}

/// A prefetch: the query of a cached name near its expiry, relayed upstream; the answer only
/// refreshes the cache (the client was answered from it already).
struct Refresh {
    path: Arc<AnswerPath>,
    w: Box<WireQuery>,
    /// Counts against the bound on queries in flight.
    _permit: OwnedSemaphorePermit,
}

impl Relay for Refresh {
    fn finish(self: Box<Self>, result: Result<Vec<u8>, ForwardError>) -> Option<ClientReply> {
        self.path.refresh_wire(self.w.key.as_ref(), &result);
        None
    }
}

/// An upstream answer that is a server failure (SERVFAIL or REFUSED).
fn failed_upstream(answer: &[u8]) -> bool {
    answer.get(3).is_some_and(|b| matches!(b & 0x0f, 2 | 5))
}
