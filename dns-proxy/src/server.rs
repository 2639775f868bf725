//! UDP and TCP listeners and the request path: parse, answer from the table or the cache, or
//! forward upstream; every answer sized for the client (TC when cut).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Record};
use rand::seq::SliceRandom;
use std::os::fd::AsRawFd;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::RecvBatch;
use crate::cache::{Cache, Key};
use crate::fast;
use crate::forward::{ClientReply, ForwardError, Forwarder, Raw, Relay, Transport};
use crate::message::{self, MAX_SIZE, OUR_UDP_PAYLOAD};
use crate::table::{Expansion, LookupTable, TableHandle};
use crate::wire;
use crate::{Config, Error, Metrics};

/// The DNS proxy: bound listeners plus the shared request path. Build with [`DnsProxy::bind`],
/// hand [`DnsProxy::table`] to the xDS proxy, then [`DnsProxy::run`] until shutdown.
pub struct DnsProxy {
    udp: Vec<Arc<UdpSocket>>,
    tcp: Vec<TcpListener>,
    addrs: Vec<SocketAddr>,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DnsProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsProxy")
            .field("addrs", &self.addrs)
            .finish()
    }
}

struct Inner {
    table: TableHandle,
    forwarder: Forwarder,
    cache: Option<Cache>,
    metrics: Arc<Metrics>,
    respond_before_sync: bool,
    forwards: Arc<Semaphore>,
    tcp_conns: Arc<Semaphore>,
    tcp_idle: Duration,
    /// Stops the forwarder's background readers when `run` ends.
    stop: CancellationToken,
}

impl DnsProxy {
    /// Binds UDP and TCP on every configured address (the same port on both; port 0 picks one
    /// free port used for every address).
    pub async fn bind(config: Config, metrics: Arc<Metrics>) -> Result<DnsProxy, Error> {
        let mut udp = Vec::new();
        let mut tcp = Vec::new();
        let mut addrs = Vec::new();
        let mut chosen_port: Option<u16> = None;
        for &addr in &config.listen_addrs {
            let mut attempts = 0;
            loop {
                let mut want = addr;
                if want.port() == 0
                    && let Some(p) = chosen_port
                {
                    want.set_port(p);
                }
                let bind_err = |protocol, source| Error::Bind {
                    protocol,
                    addr: want,
                    source: Arc::new(source),
                };
                let u = UdpSocket::bind(want)
                    .await
                    .map_err(|e| bind_err("UDP", e))?;
                let actual = u.local_addr().map_err(|e| bind_err("UDP", e))?;
                match TcpListener::bind(actual).await {
                    Ok(t) => {
                        if addr.port() == 0 {
                            chosen_port = Some(actual.port());
                        }
                        udp.push(Arc::new(u));
                        tcp.push(t);
                        addrs.push(actual);
                        break;
                    }
                    // A port picked for UDP may be taken for TCP: pick again.
                    Err(_) if want.port() != addr.port() || (addr.port() == 0 && attempts < 8) => {
                        attempts += 1;
                        if chosen_port.is_some() && attempts >= 8 {
                            return Err(bind_err(
                                "TCP",
                                std::io::Error::from(std::io::ErrorKind::AddrInUse),
                            ));
                        }
                    }
                    Err(e) => return Err(bind_err("TCP", e)),
                }
            }
        }
        tracing::info!(
            addrs = ?addrs,
            upstreams = ?config.upstreams,
            search = ?config.search_domains,
            timeout = ?config.forward_timeout,
            parallel = config.forward_parallel,
            cache = config.cache_enabled,
            "DNS proxy listening"
        );
        let expansion = Expansion {
            namespace: config.namespace.to_ascii_lowercase(),
            proxy_domain: config.proxy_domain(),
            search: config.search_domains.first().cloned(),
        };
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            table: TableHandle::new(expansion),
            forwarder: Forwarder::new(
                config.upstreams.clone(),
                config.forward_timeout,
                config.forward_parallel,
                config.upstream_udp_payload,
                stop.clone(),
            ),
            stop,
            cache: config
                .cache_enabled
                .then(|| Cache::new(config.cache_max_entries)),
            metrics,
            respond_before_sync: config.respond_before_sync,
            forwards: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            tcp_conns: Arc::new(Semaphore::new(config.max_tcp_connections.max(1))),
            tcp_idle: config.tcp_idle_timeout,
        });
        Ok(DnsProxy {
            udp,
            tcp,
            addrs,
            inner,
        })
    }

    /// The bound addresses (UDP and TCP share each).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.addrs.clone()
    }

    /// The name table handle (clone freely).
    pub fn table(&self) -> TableHandle {
        self.inner.table.clone()
    }

    /// Serves until `shutdown` is cancelled; in-flight forwards are abandoned on shutdown.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let tracker = TaskTracker::new();
        let mut loops = tokio::task::JoinSet::new();
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 4);
        for (sock, addr) in self.udp.iter().zip(&self.addrs) {
            for _ in 0..workers {
                loops.spawn(udp_loop(
                    sock.clone(),
                    *addr,
                    self.inner.clone(),
                    shutdown.clone(),
                    tracker.clone(),
                ));
            }
        }
        for (listener, addr) in self.tcp.into_iter().zip(&self.addrs) {
            loops.spawn(tcp_loop(
                listener,
                *addr,
                self.inner.clone(),
                shutdown.clone(),
                tracker.clone(),
            ));
        }
        let mut result = Ok(());
        while let Some(joined) = loops.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "DNS listener failed");
                    shutdown.cancel();
                    result = Err(e);
                }
                Err(e) => tracing::error!(error = %e, "DNS listener task panicked"),
            }
        }
        tracker.close();
        tracker.wait().await;
        self.inner.stop.cancel();
        result
    }
}

/// What to do with one received packet.
pub(crate) enum Action {
    Reply(Vec<u8>),
    Forward(Box<Message>),
    /// A plain UDP query forwarded on the wire path.
    ForwardWire(Box<WireQuery>),
    Drop,
}

/// A plain UDP query to forward without parsing it into a `Message`.
pub(crate) struct WireQuery {
    req: Vec<u8>,
    q: fast::Question,
    /// Where the answer is cached (when the cache is on).
    key: Option<Key>,
}

impl Inner {
    /// The synchronous part of the request path: everything except the upstream exchange.
    fn handle(&self, bytes: &[u8], transport: Transport) -> Action {
        // Shorter than a header, or a response (reflection): drop silently.
        if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
            return Action::Drop;
        }
        self.metrics.requests.inc();
        let table = self.table.get();
        let plain = fast::parse(bytes);
        if let (Some(t), Some(q)) = (&table, &plain) {
            let mut out = Vec::new();
            if fast::answer_parsed(t, q, bytes, transport == Transport::Udp, &mut out) {
                return Action::Reply(out);
            }
        }
        if transport == Transport::Udp
            && let Some(q) = plain
            && let Some(action) = self.wire_forward(bytes, q, table.as_deref())
        {
            return action;
        }
        let req = match Message::from_vec(bytes) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "malformed DNS request");
                return reply(message::error_header(bytes, ResponseCode::FormErr));
            }
        };
        if req.metadata.op_code != OpCode::Query {
            return reply(encode(
                &respond(&req, ResponseCode::NotImp),
                &req,
                transport,
            ));
        }
        if req.edns.as_ref().is_some_and(|e| e.version() > 0) {
            return reply(encode(
                &respond(&req, ResponseCode::BADVERS),
                &req,
                transport,
            ));
        }
        match req.queries.len() {
            // Istio answers a question-less query with SERVFAIL.
            0 => {
                return reply(encode(
                    &respond(&req, ResponseCode::ServFail),
                    &req,
                    transport,
                ));
            }
            1 => {}
            _ => {
                return reply(encode(
                    &respond(&req, ResponseCode::FormErr),
                    &req,
                    transport,
                ));
            }
        }
        let Some(table) = table else {
            if self.respond_before_sync {
                return self.cached_or_forward(req, transport);
            }
            return reply(encode(
                &respond(&req, ResponseCode::ServFail),
                &req,
                transport,
            ));
        };
        if let Some(resp) = local_answer(&table, &req) {
            return reply(encode(&resp, &req, transport));
        }
        self.cached_or_forward(req, transport)
    }

    /// The wire path for a plain UDP query the table does not answer: a cached answer, or a
    /// forward. `None` leaves the query to the `Message` path.
    fn wire_forward(
        &self,
        bytes: &[u8],
        q: fast::Question,
        table: Option<&LookupTable>,
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
                if let Some(cached) = cache.get(&key, std::time::Instant::now()) {
                    self.metrics.cache_hits.inc();
                    let req = Message::from_vec(bytes).ok()?;
                    return Some(reply(encode(
                        &upstream_to_client(cached, &req),
                        &req,
                        Transport::Udp,
                    )));
                }
                Some(key)
            }
            None => None,
        };
        Some(Action::ForwardWire(Box::new(WireQuery {
            req: bytes.to_vec(),
            q,
            key,
        })))
    }

    /// [`Inner::complete`] for the wire path.
    async fn complete_wire(&self, w: &WireQuery) -> Option<Vec<u8>> {
        self.metrics.upstream_requests.inc();
        let start = tokio::time::Instant::now();
        let query = wire::upstream_query(&w.req, &w.q, self.forwarder.udp_payload);
        let result = self
            .forwarder
            .forward_bytes::<Raw>(query, Transport::Udp)
            .await;
        self.metrics
            .upstream_duration
            .observe(start.elapsed().as_secs_f64());
        match result {
            Ok(Raw(answer)) => self.wire_answer(w, answer),
            Err(e) => {
                self.metrics.upstream_failures.inc();
                tracing::debug!(error = %e, "DNS forward failed");
                Some(wire::error_answer(&w.req, &w.q, 2))
            }
        }
    }

    /// The client's answer from the upstream's `answer` to `w` (cached when the cache is on).
    fn wire_answer(&self, w: &WireQuery, answer: Vec<u8>) -> Option<Vec<u8>> {
        let mut parsed = None;
        if let (Some(cache), Some(key)) = (&self.cache, &w.key)
            && let Ok(m) = Message::from_vec(&answer)
        {
            cache.put(key.clone(), &m, std::time::Instant::now());
            parsed = Some(m);
        }
        let answer = match wire::to_client(answer, &w.req, &w.q) {
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

    fn cached_or_forward(&self, req: Message, transport: Transport) -> Action {
        if let Some(cache) = &self.cache
            && let Some(key) = Key::of(&req)
            && let Some(cached) = cache.get(&key, std::time::Instant::now())
        {
            self.metrics.cache_hits.inc();
            return reply(encode(&upstream_to_client(cached, &req), &req, transport));
        }
        Action::Forward(Box::new(req))
    }

    /// The asynchronous part: forward, cache, answer (SERVFAIL when every upstream failed).
    async fn complete(&self, req: &Message, transport: Transport) -> Option<Vec<u8>> {
        self.metrics.upstream_requests.inc();
        let start = tokio::time::Instant::now();
        let result = self.forwarder.forward(req, transport).await;
        self.metrics
            .upstream_duration
            .observe(start.elapsed().as_secs_f64());
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
                encode(&respond(req, ResponseCode::ServFail), req, transport)
            }
        }
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

/// A response skeleton for `req`: id, opcode, RD/CD copied, RA set, question echoed, an OPT
/// record when the client sent one.
fn respond(req: &Message, rcode: ResponseCode) -> Message {
    let mut m = Message::new(req.metadata.id, MessageType::Response, req.metadata.op_code);
    m.metadata = Metadata::response_from_request(&req.metadata);
    m.metadata.recursion_available = true;
    m.metadata.response_code = rcode;
    m.queries = req.queries.clone();
    set_client_edns(&mut m, req);
    m
}

fn set_client_edns(m: &mut Message, req: &Message) {
    m.edns = req.edns.as_ref().map(|client| {
        let mut e = Edns::new();
        e.set_max_payload(OUR_UDP_PAYLOAD);
        e.set_dnssec_ok(client.flags().dnssec_ok);
        e
    });
}

/// An upstream (or cached) answer made ours: the client's id and question, our OPT record (or
/// none when the client sent none: the upstream's OPT is hop-by-hop).
fn upstream_to_client(mut resp: Message, req: &Message) -> Message {
    resp.metadata.id = req.metadata.id;
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    resp.metadata.checking_disabled = req.metadata.checking_disabled;
    resp.queries = req.queries.clone();
    resp.signature = None;
    set_client_edns(&mut resp, req);
    resp
}

fn encode(resp: &Message, req: &Message, transport: Transport) -> Option<Vec<u8>> {
    let limit = match transport {
        Transport::Udp => message::udp_limit(req),
        Transport::Tcp => MAX_SIZE,
    };
    message::encode(resp, limit).or_else(|| {
        let mut fail = resp.clone();
        fail.answers.clear();
        fail.authorities.clear();
        fail.additionals.clear();
        fail.metadata.response_code = ResponseCode::ServFail;
        message::encode(&fail, limit)
    })
}

/// The table's answer for `req`, or `None` to forward it.
fn local_answer(table: &LookupTable, req: &Message) -> Option<Message> {
    let q = req.queries.first()?;
    if q.query_class() != DNSClass::IN {
        return None;
    }
    let lower = q.name().to_lowercase().to_ascii();
    let answer = table.lookup(q.name(), &lower, q.query_type())?;
    let mut resp = respond(req, ResponseCode::NoError);
    resp.metadata.authoritative = true;
    let mut addrs: Vec<Record> = answer.addrs;
    // Round robin: shuffled on every answer.
    if addrs.len() > 1 {
        addrs.shuffle(&mut rand::rng());
    }
    resp.answers = answer.cnames;
    resp.answers.extend(addrs);
    Some(resp)
}

async fn udp_loop(
    sock: Arc<UdpSocket>,
    addr: SocketAddr,
    inner: Arc<Inner>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), Error> {
    // One cancellation future for the whole loop, not one per packet.
    tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        r = udp_serve(sock, addr, inner, shutdown.clone(), tracker) => r,
    }
}

async fn udp_serve(
    sock: Arc<UdpSocket>,
    addr: SocketAddr,
    inner: Arc<Inner>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), Error> {
    let serve_err = |e: std::io::Error| Error::Serve {
        protocol: "UDP",
        addr,
        source: Arc::new(e),
    };
    let mut batch = RecvBatch::new().map_err(serve_err)?;
    let mut out = Outgoing::default();
    let fd = sock.as_raw_fd();
    loop {
        sock.readable().await.map_err(serve_err)?;
        let r = sock.try_io(Interest::READABLE, || {
            let n = batch.recv(fd)?;
            for i in 0..n {
                // Queries longer than a datagram buffer cannot be whole: dropped.
                if let (bytes, Some(src), false) = batch.get(i) {
                    packet(&sock, &inner, &shutdown, &tracker, bytes, src, &mut out);
                }
            }
            // A short batch emptied the queue: wait for the next readiness edge rather than
            // pay a system call to learn it.
            if n < crate::batch::BATCH {
                Err(std::io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        });
        match r {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || is_transient(&e) => {}
            Err(e) => return Err(serve_err(e)),
        }
        if !out.relays.is_empty() {
            for r in inner.forwarder.relay_batch(&mut out.relays) {
                out.replies.push((r.bytes, r.to));
            }
        }
        if !out.replies.is_empty() {
            send_replies(&sock, &mut out.replies).await;
        }
    }
}

/// Sends the batch's answers with `sendmmsg`, waiting for the socket only when it is full.
async fn send_replies(sock: &UdpSocket, replies: &mut Vec<(Vec<u8>, SocketAddr)>) {
    crate::forward::send_batch(sock, replies).await;
}

/// What a receive batch produced: answers to send, and queries to relay upstream (sent
/// together after the batch).
#[derive(Default)]
struct Outgoing {
    replies: Vec<(Vec<u8>, SocketAddr)>,
    relays: Vec<(Vec<u8>, Box<dyn Relay>)>,
}

/// One received UDP datagram: an answer now, a query to relay (both queued in `out`), or a
/// forward in its own task (parallel mode, the `Message` path).
fn packet(
    sock: &Arc<UdpSocket>,
    inner: &Arc<Inner>,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
    bytes: &[u8],
    src: SocketAddr,
    out: &mut Outgoing,
) {
    let Outgoing { replies, relays } = out;
    match inner.handle(bytes, Transport::Udp) {
        Action::Reply(b) => replies.push((b, src)),
        Action::Drop => {}
        Action::ForwardWire(w) => match inner.forwards.clone().try_acquire_owned() {
            Ok(permit) if inner.forwarder.can_relay() => {
                inner.metrics.upstream_requests.inc();
                let query = wire::upstream_query(&w.req, &w.q, inner.forwarder.udp_payload);
                let ctx = Box::new(WireRelay {
                    inner: inner.clone(),
                    w,
                    sock: sock.clone(),
                    src,
                    start: tokio::time::Instant::now(),
                    _permit: permit,
                });
                relays.push((query, ctx));
            }
            Ok(permit) => {
                let inner = inner.clone();
                spawn_answer(tracker, permit, sock, shutdown, src, async move {
                    inner.complete_wire(&w).await
                });
            }
            Err(_) => {
                inner.metrics.upstream_failures.inc();
                replies.push((wire::error_answer(&w.req, &w.q, 2), src));
            }
        },
        Action::Forward(req) => match inner.forwards.clone().try_acquire_owned() {
            Ok(permit) => {
                let inner = inner.clone();
                spawn_answer(tracker, permit, sock, shutdown, src, async move {
                    inner.complete(&req, Transport::Udp).await
                });
            }
            Err(_) => {
                if let Some(b) = inner.overloaded(&req, Transport::Udp) {
                    replies.push((b, src));
                }
            }
        },
    }
}

/// Runs `answer` in a task of its own (holding `permit`) and sends what it gives to `src`;
/// dropped unsent at shutdown.
fn spawn_answer(
    tracker: &TaskTracker,
    permit: OwnedSemaphorePermit,
    sock: &Arc<UdpSocket>,
    shutdown: &CancellationToken,
    src: SocketAddr,
    answer: impl std::future::Future<Output = Option<Vec<u8>>> + Send + 'static,
) {
    let (sock, shutdown) = (sock.clone(), shutdown.clone());
    tracker.spawn(async move {
        let _permit = permit;
        let answer = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = answer => a,
        };
        if let Some(b) = answer {
            let _ = sock.send_to(&b, src).await;
        }
    });
}

/// A wire-path query relayed upstream without a task of its own (see [`Forwarder::relay`]):
/// the client's answer is made and sent where the upstream's answer (or timeout) is handled.
struct WireRelay {
    inner: Arc<Inner>,
    w: Box<WireQuery>,
    sock: Arc<UdpSocket>,
    src: SocketAddr,
    start: tokio::time::Instant,
    /// Counts against the bound on queries in flight until the answer is made.
    _permit: OwnedSemaphorePermit,
}

impl Relay for WireRelay {
    fn finish(self: Box<Self>, result: Result<Vec<u8>, ForwardError>) -> Option<ClientReply> {
        let inner = &self.inner;
        inner
            .metrics
            .upstream_duration
            .observe(self.start.elapsed().as_secs_f64());
        let bytes = match result {
            Ok(answer) => inner.wire_answer(&self.w, answer)?,
            Err(e) => {
                inner.metrics.upstream_failures.inc();
                tracing::debug!(error = %e, "DNS forward failed");
                wire::error_answer(&self.w.req, &self.w.q, 2)
            }
        };
        Some(ClientReply {
            sock: self.sock.clone(),
            bytes,
            to: self.src,
        })
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionReset
            | Interrupted
            | WouldBlock
            | TimedOut
            | HostUnreachable
            | NetworkUnreachable
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
        || e.raw_os_error() == Some(libc::ENOMEM)
}

async fn tcp_loop(
    listener: TcpListener,
    addr: SocketAddr,
    inner: Arc<Inner>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), Error> {
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning or failing.
                    tracing::warn!(error = %e, addr = %addr, "DNS TCP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = inner.tcp_conns.clone().try_acquire_owned() else {
            tracing::debug!(peer = %peer, "too many DNS TCP connections, closing");
            drop(stream);
            continue;
        };
        let (inner, shutdown) = (inner.clone(), shutdown.clone());
        tracker.spawn(async move {
            let _permit = permit;
            tokio::select! {
                _ = shutdown.cancelled() => {}
                r = tcp_conn(stream, &inner) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, peer = %peer, "DNS TCP connection ended");
                    }
                }
            }
        });
    }
}

async fn tcp_conn(mut stream: TcpStream, inner: &Inner) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(inner.tcp_idle, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        }
        buf.resize(usize::from(u16::from_be_bytes(len)), 0);
        match tokio::time::timeout(inner.tcp_idle, stream.read_exact(&mut buf)).await {
            Ok(r) => {
                r?;
            }
            Err(_) => return Ok(()),
        }
        let answer = match inner.handle(&buf, Transport::Tcp) {
            Action::Reply(b) => Some(b),
            // Only UDP queries take the wire path.
            Action::Drop | Action::ForwardWire(_) => None,
            Action::Forward(req) => match inner.forwards.clone().try_acquire_owned() {
                Ok(_permit) => inner.complete(&req, Transport::Tcp).await,
                Err(_) => inner.overloaded(&req, Transport::Tcp),
            },
        };
        if let Some(b) = answer {
            let Ok(n) = u16::try_from(b.len()) else {
                continue;
            };
            let mut framed = Vec::with_capacity(b.len() + 2);
            framed.extend_from_slice(&n.to_be_bytes());
            framed.extend_from_slice(&b);
            stream.write_all(&framed).await?;
        }
    }
}

/// Runs one packet through the request path (table loaded, both transports) and, when it would
/// be forwarded, runs it through the upstream-answer path with itself as the answer. Never
/// touches the network. For the fuzz target.
pub fn fuzz_request(data: &[u8]) {
    static INNER: OnceLock<Inner> = OnceLock::new();
    let inner = INNER.get_or_init(|| {
        let mut registry = prometheus_client::registry::Registry::default();
        let table = TableHandle::new(Expansion {
            namespace: "ns1".into(),
            proxy_domain: "svc.cluster.local".into(),
            search: Some("ns1.svc.cluster.local".into()),
        });
        table.update(&crate::table::fuzz_table());
        Inner {
            table,
            forwarder: Forwarder::new(
                vec![],
                Duration::from_millis(1),
                false,
                1232,
                CancellationToken::new(),
            ),
            stop: CancellationToken::new(),
            cache: Some(Cache::new(64)),
            metrics: Arc::new(Metrics::new(&mut registry)),
            respond_before_sync: false,
            forwards: Arc::new(Semaphore::new(1)),
            tcp_conns: Arc::new(Semaphore::new(1)),
            tcp_idle: Duration::from_millis(1),
        }
    });
    for transport in [Transport::Udp, Transport::Tcp] {
        let action = inner.handle(data, transport);
        if let Action::ForwardWire(w) = &action {
            let mut answer = data.to_vec();
            answer[2] |= 0x80;
            let _ = inner.wire_answer(w, answer);
        }
        if let Action::Forward(req) = action {
            // The same bytes, marked as a response, are the upstream's answer.
            let mut answer = data.to_vec();
            answer[2] |= 0x80;
            let server: SocketAddr = ([127, 0, 0, 1], 53).into();
            if let Ok(resp) = crate::forward::check_answer(server, &answer, &req) {
                if let (Some(cache), Some(key)) = (&inner.cache, Key::of(&req)) {
                    cache.put(key, &resp, std::time::Instant::now());
                }
                let _ = encode(&upstream_to_client(resp, &req), &req, transport);
            }
        }
    }
}

#[cfg(test)]
mod tests;
