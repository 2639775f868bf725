//! Forwarding to the resolv.conf nameservers over the protocol the query came in on, with a
//! per-server timeout, the next server tried on failure, or all at once in parallel mode.
//!
//! UDP queries share a small pool of connected sockets per upstream; answers are matched to
//! queries by id and question. Cache-poisoning defences (Kaminsky): every upstream query gets a
//! fresh random id, each socket is replaced by one on a new kernel-chosen ephemeral port after
//! [`ROTATE_AFTER_QUERIES`] queries or [`ROTATE_AFTER`], and an answer is accepted only from
//! the upstream's address and port, with the id and question of a query pending on that very
//! socket; anything else is dropped and the real answer still gets through.
//!
//! Plain UDP queries are relayed ([`Forwarder::relay_batch`]): no task, channel or timer per
//! query. The query's state waits in its socket's pending table; the socket's reader handles
//! the answer there (the next server after SERVFAIL/REFUSED, TCP after TC, else the client's
//! answer, sent with the other answers of its receive batch), and a periodic sweep times out
//! queries past their server's deadline and moves them on. Queries arriving together are sent
//! upstream with one `sendmmsg` per server.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use rand::seq::SliceRandom;
use std::os::fd::AsRawFd;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::batch::RecvBatch;

/// Transport a query arrived on, and is forwarded over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

/// Why forwarding failed (every server failed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    #[error("no upstream nameservers configured")]
    NoUpstreams,
    #[error("upstream {server} timed out")]
    Timeout { server: SocketAddr },
    #[error("upstream {server}: {source}")]
    Io {
        server: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("upstream {server} sent an invalid answer: {why}")]
    Invalid { server: SocketAddr, why: String },
    #[error("cannot encode the upstream query: {0}")]
    Encode(String),
}

/// How long an upstream UDP socket (and so its source port) is used before it is replaced by a
/// fresh one on a new kernel-chosen ephemeral port: a cache-poisoning defence (Kaminsky), so an
/// off-path attacker has to guess a changing port as well as the random query id.
pub(crate) const ROTATE_AFTER_QUERIES: u32 = 256;
/// ... or after this long, whichever comes first.
pub(crate) const ROTATE_AFTER: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub(crate) struct Forwarder {
    pub upstreams: Vec<SocketAddr>,
    pub timeout: Duration,
    pub parallel: bool,
    pub udp_payload: u16,
    pool: Arc<UdpPool>,
}

/// An upstream answer as a forwarding caller wants it.
pub(crate) trait Answer: Sized + Send + 'static {
    /// `raw` already matched the query (source, id, QR, question).
    fn accept(server: SocketAddr, raw: Vec<u8>) -> Result<Self, ForwardError>;
    /// Whether to stop here rather than try the next server.
    fn usable(&self) -> bool;
}

impl Answer for Message {
    fn accept(server: SocketAddr, raw: Vec<u8>) -> Result<Self, ForwardError> {
        Message::from_vec(&raw).map_err(|e| ForwardError::Invalid {
            server,
            why: e.to_string(),
        })
    }
    fn usable(&self) -> bool {
        !matches!(
            self.metadata.response_code,
            ResponseCode::ServFail | ResponseCode::Refused
        )
    }
}

/// An upstream answer left in wire form (the wire path rewrites it for the client).
pub(crate) struct Raw(pub Vec<u8>);

impl Answer for Raw {
    fn accept(_server: SocketAddr, raw: Vec<u8>) -> Result<Self, ForwardError> {
        Ok(Raw(raw))
    }
    fn usable(&self) -> bool {
        Raw::usable_bytes(&self.0)
    }
}

impl Raw {
    /// Not SERVFAIL (2) nor REFUSED (5).
    fn usable_bytes(answer: &[u8]) -> bool {
        !matches!(answer[3] & 0x0f, 2 | 5)
    }
}

impl Forwarder {
    /// A forwarder whose UDP sockets live until `stop` is cancelled.
    pub fn new(
        upstreams: Vec<SocketAddr>,
        timeout: Duration,
        parallel: bool,
        udp_payload: u16,
        stop: CancellationToken,
    ) -> Forwarder {
        let pool = UdpPool {
            upstreams: upstreams
                .iter()
                .map(|&server| {
                    let slots = (0..SOCKETS_PER_UPSTREAM)
                        .map(|_| Mutex::new(Slot::default()))
                        .collect();
                    (server, slots)
                })
                .collect(),
            stop,
            timeout,
            live: Mutex::new(Vec::new()),
            relays: AtomicUsize::new(0),
            rotate_queries: ROTATE_AFTER_QUERIES,
            rotate_after: ROTATE_AFTER,
            opened: AtomicU64::new(0),
            busy: Arc::new(AtomicBool::new(false)),
            wake_anchor: Arc::new(Notify::new()),
            anchor_started: AtomicBool::new(false),
        };
        Forwarder {
            upstreams,
            timeout,
            parallel,
            udp_payload,
            pool: Arc::new(pool),
        }
    }

    /// Replaces each upstream socket after `queries` queries or `age`, whichever comes first.
    #[cfg(test)]
    pub fn with_rotation(mut self, queries: u32, age: Duration) -> Forwarder {
        let pool = Arc::get_mut(&mut self.pool).expect("not shared yet");
        pool.rotate_queries = queries.max(1);
        pool.rotate_after = age;
        self
    }

    /// Sends `query` upstream and returns the first usable answer (its id is the query's).
    /// SERVFAIL/REFUSED answers make the next server be tried; the last such answer is
    /// returned when no server does better.
    pub async fn forward(
        &self,
        query: &Message,
        transport: Transport,
    ) -> Result<Message, ForwardError> {
        if self.upstreams.is_empty() {
            return Err(ForwardError::NoUpstreams);
        }
        let mut upstream = query.clone();
        let client_id = query.metadata.id;
        if transport == Transport::Udp {
            // Advertise our buffer so upstream answers are not cut at 512 (istio#61371).
            let mut edns = upstream.edns.take().unwrap_or_default();
            if edns.max_payload() < self.udp_payload {
                edns.set_max_payload(self.udp_payload);
            }
            upstream.set_edns(edns);
        }
        let bytes = upstream
            .to_vec()
            .map_err(|e| ForwardError::Encode(e.to_string()))?;
        let mut result: Result<Message, _> = self.forward_bytes(bytes, transport).await;
        if let Ok(m) = &mut result {
            m.metadata.id = client_id;
        }
        result
    }

    /// Sends the encoded query `bytes` (an uncompressed question; the id is replaced on the
    /// wire by a random one per upstream query) and returns the first usable answer, carrying
    /// the id `bytes` had.
    pub async fn forward_bytes<T: Answer>(
        &self,
        mut bytes: Vec<u8>,
        transport: Transport,
    ) -> Result<T, ForwardError> {
        if self.upstreams.is_empty() {
            return Err(ForwardError::NoUpstreams);
        }
        let qlen = question_bytes(&bytes)
            .ok_or_else(|| ForwardError::Encode("no question".into()))?
            .len();
        if self.parallel && self.upstreams.len() > 1 {
            return self.parallel(bytes, transport).await;
        }
        let mut last = Err(ForwardError::NoUpstreams);
        let mut order = [0usize; 8];
        let many;
        let order: &[usize] = if self.upstreams.len() <= order.len() {
            for (i, o) in order.iter_mut().enumerate() {
                *o = i;
            }
            let order = &mut order[..self.upstreams.len()];
            order.shuffle(&mut rand::rng());
            order
        } else {
            let mut v: Vec<usize> = (0..self.upstreams.len()).collect();
            v.shuffle(&mut rand::rng());
            many = v;
            &many
        };
        for &i in order {
            let server = self.upstreams[i];
            let r = exchange(
                &self.pool,
                server,
                &mut bytes,
                qlen,
                transport,
                self.timeout,
            )
            .await
            .and_then(|raw| T::accept(server, raw));
            match r {
                Ok(m) if m.usable() => return Ok(m),
                Ok(m) => last = Ok(m),
                Err(e) => {
                    tracing::debug!(error = %e, "DNS upstream failed, trying next");
                    if last.is_err() {
                        last = Err(e);
                    }
                }
            }
        }
        last
    }

    /// Whether [`Forwarder::relay`] can take UDP queries (sequential mode, few upstreams).
    pub fn can_relay(&self) -> bool {
        !(self.parallel && self.upstreams.len() > 1)
            && (1..=MAX_RELAY_UPSTREAMS).contains(&self.upstreams.len())
    }

    /// Forwards the UDP query `bytes` (as [`Forwarder::forward_bytes`]) without a task of its
    /// own: the answer is handled where it arrives, timeouts by the pool's sweep, and `ctx`
    /// makes the client's answer from the result. Returns that answer when the query is
    /// already finished (every send failed). Needs [`Forwarder::can_relay`].
    pub fn relay(&self, bytes: Vec<u8>, ctx: Box<dyn Relay>) -> Option<ClientReply> {
        let n = self.upstreams.len();
        let Some(qlen) = question_bytes(&bytes).map(<[u8]>::len) else {
            return ctx.finish(Err(ForwardError::Encode("no question".into())));
        };
        if !self.can_relay() {
            return ctx.finish(Err(ForwardError::NoUpstreams));
        }
        self.pool.touch();
        let mut order = [0u8; MAX_RELAY_UPSTREAMS];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i as u8;
        }
        order[..n].shuffle(&mut rand::rng());
        let st = Box::new(RelayState {
            id: [bytes[0], bytes[1]],
            query: bytes,
            qlen,
            order,
            len: n as u8,
            next: 0,
            last: None,
            ctx,
        });
        self.pool.advance(st, None)
    }

    /// [`Forwarder::relay`] for several queries at once: those going to the same server are
    /// sent with one system call. Returns the answers of queries already finished.
    pub fn relay_batch(&self, batch: &mut Vec<(Vec<u8>, Box<dyn Relay>)>) -> Vec<ClientReply> {
        let mut replies = Vec::new();
        if batch.len() == 1 {
            if let Some((bytes, ctx)) = batch.pop() {
                replies.extend(self.relay(bytes, ctx));
            }
            return replies;
        }
        let n = self.upstreams.len();
        let mut groups: [Vec<Box<RelayState>>; MAX_RELAY_UPSTREAMS] = Default::default();
        for (bytes, ctx) in batch.drain(..) {
            let Some(qlen) = question_bytes(&bytes).map(<[u8]>::len) else {
                replies.extend(ctx.finish(Err(ForwardError::Encode("no question".into()))));
                continue;
            };
            if !self.can_relay() {
                replies.extend(ctx.finish(Err(ForwardError::NoUpstreams)));
                continue;
            }
            let mut order = [0u8; MAX_RELAY_UPSTREAMS];
            for (i, o) in order.iter_mut().enumerate() {
                *o = i as u8;
            }
            order[..n].shuffle(&mut rand::rng());
            groups[usize::from(order[0])].push(Box::new(RelayState {
                id: [bytes[0], bytes[1]],
                query: bytes,
                qlen,
                order,
                len: n as u8,
                next: 1,
                last: None,
                ctx,
            }));
        }
        if groups.iter().all(Vec::is_empty) {
            return replies;
        }
        self.pool.touch();
        for (idx, group) in groups.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            for (st, e) in self.pool.send_relays(idx, group) {
                replies.extend(self.pool.advance(st, Some(Err(e))));
            }
        }
        replies
    }

    async fn parallel<T: Answer>(
        &self,
        bytes: Vec<u8>,
        transport: Transport,
    ) -> Result<T, ForwardError> {
        let qlen = question_bytes(&bytes).map_or(0, <[u8]>::len);
        let mut set = JoinSet::new();
        for &server in &self.upstreams {
            let mut bytes = bytes.clone();
            let timeout = self.timeout;
            let pool = self.pool.clone();
            set.spawn(async move {
                exchange(&pool, server, &mut bytes, qlen, transport, timeout)
                    .await
                    .and_then(|raw| T::accept(server, raw))
            });
        }
        let mut last = Err(ForwardError::NoUpstreams);
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(Ok(m)) if m.usable() => return Ok(m),
                Ok(Ok(m)) => last = Ok(m),
                Ok(Err(e)) if last.is_err() => last = Err(e),
                _ => {}
            }
        }
        last
    }
}

/// One exchange with one server; a truncated UDP answer is retried over TCP. `bytes` is the
/// query (its id is overwritten with the one used on the wire); the answer carries the id
/// `bytes` had on entry.
async fn exchange(
    pool: &Arc<UdpPool>,
    server: SocketAddr,
    bytes: &mut [u8],
    qlen: usize,
    transport: Transport,
    timeout: Duration,
) -> Result<Vec<u8>, ForwardError> {
    // `bytes` keeps its id: the pool writes its own for the wire and restores it.
    pool.touch();
    let deadline = Instant::now() + timeout;
    let id = [bytes[0], bytes[1]];
    let fut = async {
        let mut answer = match transport {
            Transport::Udp => {
                let a = pool.exchange(server, bytes, qlen).await?;
                if a[2] & 0x02 != 0 {
                    exchange_tcp(server, bytes, qlen).await?
                } else {
                    a
                }
            }
            Transport::Tcp => exchange_tcp(server, bytes, qlen).await?,
        };
        answer[..2].copy_from_slice(&id);
        Ok(answer)
    };
    timeout_at(deadline, fut)
        .await
        .unwrap_or(Err(ForwardError::Timeout { server }))
}

/// Sockets per upstream shared by all forwarded UDP queries: answers are matched to queries by
/// id and question. Saves a socket, a bind and an epoll registration per query.
const SOCKETS_PER_UPSTREAM: usize = 8;

struct Pending {
    /// The query's question section as sent; the answer must echo it.
    question: Box<[u8]>,
    waiter: Waiter,
}

/// Who gets a pending query's answer.
enum Waiter {
    /// A task awaiting it (with its own timeout).
    Task(oneshot::Sender<Vec<u8>>),
    /// A relayed query: handled where the answer arrives; timed out by the pool's sweep.
    Relay {
        state: Box<RelayState>,
        deadline: Instant,
    },
}

/// The end of a relayed query: turns the forwarding result into the client's answer.
pub(crate) trait Relay: Send + 'static {
    /// `result` is the first usable answer (carrying the query's own id), else the last
    /// unusable one, else the last error.
    fn finish(self: Box<Self>, result: Result<Vec<u8>, ForwardError>) -> Option<ClientReply>;
}

/// An answer for a UDP client, sent by whoever completes the query.
pub(crate) struct ClientReply {
    pub sock: Arc<UdpSocket>,
    pub bytes: Vec<u8>,
    pub to: SocketAddr,
}

/// A relayed UDP query between servers.
struct RelayState {
    /// The query as sent upstream (its first two bytes hold the id last used on the wire).
    query: Vec<u8>,
    /// The query's own id, put back into the answer.
    id: [u8; 2],
    qlen: usize,
    /// Servers (indices into the pool's upstreams) in the order tried, `next` the next one.
    order: [u8; MAX_RELAY_UPSTREAMS],
    len: u8,
    next: u8,
    last: Option<Result<Vec<u8>, ForwardError>>,
    ctx: Box<dyn Relay>,
}

/// Relayed queries support up to this many upstreams (resolv.conf allows 3).
const MAX_RELAY_UPSTREAMS: usize = 8;

/// One connected upstream socket: the kernel only delivers datagrams from the upstream's
/// address and port to it.
struct Chan {
    sock: UdpSocket,
    server: SocketAddr,
    pending: Mutex<HashMap<u16, Pending>>,
    /// Replaced in its slot: no new queries; the reader stops once the last pending one ends.
    retired: AtomicBool,
    /// Stops the reader (a child of the pool's stop token).
    stop: CancellationToken,
}

impl Chan {
    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        // Under the lock: a relay registering checks `stop` under it too.
        match self.pending.lock() {
            Ok(p) if !p.is_empty() => {}
            _ => self.stop.cancel(),
        }
    }
}

/// A pool position: its current socket and how much it has been used.
#[derive(Default)]
struct Slot {
    chan: Option<Arc<Chan>>,
    sent: u32,
    born: Option<Instant>,
}

/// An upstream's sockets.
type Slots = Box<[Mutex<Slot>]>;

pub(crate) struct UdpPool {
    upstreams: Box<[(SocketAddr, Slots)]>,
    stop: CancellationToken,
    /// Per-server timeout.
    timeout: Duration,
    /// Every socket opened whose reader may still run (the sweep looks for expired relays).
    live: Mutex<Vec<Weak<Chan>>>,
    /// Relayed queries pending.
    relays: AtomicUsize,
    rotate_queries: u32,
    rotate_after: Duration,
    /// Sockets opened so far.
    opened: AtomicU64,
    /// Timer anchor (see [`anchor`]): queries seen since its last tick, its wake-up, and
    /// whether it runs.
    busy: Arc<AtomicBool>,
    wake_anchor: Arc<Notify>,
    anchor_started: AtomicBool,
}

impl std::fmt::Debug for UdpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpPool").finish_non_exhaustive()
    }
}

/// Removes a pending query when its exchange ends (answer, timeout or cancellation).
struct PendingGuard<'a> {
    chan: &'a Chan,
    id: u16,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut p) = self.chan.pending.lock() {
            p.remove(&self.id);
            self.chan.removed(&p);
        }
    }
}

impl Chan {
    /// After a removal from `pending`: a retired socket with nothing pending closes.
    fn removed(&self, pending: &HashMap<u16, Pending>) {
        if pending.is_empty() && self.retired.load(Ordering::Acquire) {
            self.stop.cancel();
        }
    }
}

fn poisoned() -> ForwardError {
    ForwardError::Encode("poisoned lock".into())
}

impl UdpPool {
    /// Notes a query for the timer anchor, starting it on first use.
    fn touch(self: &Arc<Self>) {
        if !self.anchor_started.swap(true, Ordering::Relaxed) {
            let tick =
                (self.timeout / 10).clamp(Duration::from_millis(5), Duration::from_millis(100));
            tokio::spawn(anchor(Arc::downgrade(self), tick, self.stop.clone()));
        }
        if !self.busy.swap(true, Ordering::Relaxed) {
            self.wake_anchor.notify_one();
        }
    }

    /// A fresh socket connected to `server` on a kernel-chosen (random) ephemeral port, with
    /// its reader running.
    fn open(self: &Arc<Self>, server: SocketAddr) -> Result<Arc<Chan>, ForwardError> {
        let io = |source| ForwardError::Io { server, source };
        let local: SocketAddr = if server.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let sock = std::net::UdpSocket::bind(local).map_err(io)?;
        sock.connect(server).map_err(io)?;
        sock.set_nonblocking(true).map_err(io)?;
        let chan = Arc::new(Chan {
            sock: UdpSocket::from_std(sock).map_err(io)?,
            server,
            pending: Mutex::new(HashMap::new()),
            retired: AtomicBool::new(false),
            stop: self.stop.child_token(),
        });
        tokio::spawn(read_answers(self.clone(), chan.clone()));
        self.opened.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut live) = self.live.lock() {
            live.retain(|c| c.strong_count() > 0);
            live.push(Arc::downgrade(&chan));
        }
        Ok(chan)
    }

    /// One of `slots`' sockets to `server`, replaced first when due for rotation.
    fn pick(
        self: &Arc<Self>,
        server: SocketAddr,
        slots: &Slots,
    ) -> Result<Arc<Chan>, ForwardError> {
        self.pick_for(server, slots, 1)
    }

    /// [`UdpPool::pick`] for `queries` queries.
    fn pick_for(
        self: &Arc<Self>,
        server: SocketAddr,
        slots: &Slots,
        queries: u32,
    ) -> Result<Arc<Chan>, ForwardError> {
        let mut slot = slots[rand::random_range(0..slots.len())]
            .lock()
            .map_err(|_| poisoned())?;
        let now = Instant::now();
        let stale = slot.sent >= self.rotate_queries
            || slot
                .born
                .is_none_or(|b| now.duration_since(b) >= self.rotate_after);
        let chan = match &slot.chan {
            Some(c) if !stale => c.clone(),
            _ => {
                let fresh = self.open(server)?;
                if let Some(old) = slot.chan.replace(fresh.clone()) {
                    old.retire();
                }
                slot.sent = 0;
                slot.born = Some(now);
                fresh
            }
        };
        slot.sent = slot.sent.saturating_add(queries);
        Ok(chan)
    }

    fn slots(&self, server: SocketAddr) -> Result<&Slots, ForwardError> {
        self.upstreams
            .iter()
            .find(|(s, _)| *s == server)
            .map(|(_, slots)| slots)
            .ok_or(ForwardError::NoUpstreams)
    }

    /// Registers a query pending on `chan` under a fresh random id, unique among the socket's
    /// pending ones; `waiter(id)` makes its waiter. Must be called with the socket just picked:
    /// a retired socket's reader sees every query it has to wait for.
    fn register<'c>(
        chan: &'c Chan,
        question: &[u8],
        waiter: impl FnOnce(u16) -> Waiter,
    ) -> Result<(std::sync::MutexGuard<'c, HashMap<u16, Pending>>, u16), ForwardError> {
        let mut pending = chan.pending.lock().map_err(|_| poisoned())?;
        if pending.len() > 30_000 {
            return Err(ForwardError::Io {
                server: chan.server,
                source: std::io::ErrorKind::WouldBlock.into(),
            });
        }
        let mut id: u16 = rand::random();
        while pending.contains_key(&id) {
            id = rand::random();
        }
        pending.insert(
            id,
            Pending {
                question: question.into(),
                waiter: waiter(id),
            },
        );
        Ok((pending, id))
    }

    /// Sends `bytes` (with a fresh random id on the wire; `bytes` is left as it was) on one of
    /// `server`'s sockets and waits for the matching answer (which carries the wire id).
    async fn exchange(
        self: &Arc<Self>,
        server: SocketAddr,
        bytes: &mut [u8],
        qlen: usize,
    ) -> Result<Vec<u8>, ForwardError> {
        let slots = self.slots(server)?;
        let question = bytes
            .get(12..12 + qlen)
            .ok_or_else(|| ForwardError::Encode("no question".into()))?;
        let (tx, rx) = oneshot::channel();
        let chan = self.pick(server, slots)?;
        let (pending, id) = Self::register(&chan, question, |_| Waiter::Task(tx))?;
        drop(pending);
        let _guard = PendingGuard { chan: &chan, id };
        let original = [bytes[0], bytes[1]];
        bytes[..2].copy_from_slice(&id.to_be_bytes());
        let sent = chan.sock.send(bytes).await;
        bytes[..2].copy_from_slice(&original);
        sent.map_err(|source| ForwardError::Io { server, source })?;
        rx.await.map_err(|_| ForwardError::Timeout { server })
    }

    /// Sends the relayed query to upstream `idx` on one of its sockets; on failure hands the
    /// query back.
    fn send_relay(
        self: &Arc<Self>,
        idx: usize,
        st: Box<RelayState>,
    ) -> Result<(), (Box<RelayState>, ForwardError)> {
        match self.send_relays(idx, vec![st]).pop() {
            Some(failed) => Err(failed),
            None => Ok(()),
        }
    }

    /// Sends relayed queries to upstream `idx` on one of its sockets with one `sendmmsg`;
    /// hands back those that could not be sent.
    #[expect(
        clippy::vec_box,
        reason = "the boxes move into the pending table as they are"
    )]
    fn send_relays(
        self: &Arc<Self>,
        idx: usize,
        mut states: Vec<Box<RelayState>>,
    ) -> Vec<(Box<RelayState>, ForwardError)> {
        let (server, slots) = &self.upstreams[idx];
        let server = *server;
        let fail = |states: Vec<Box<RelayState>>, e: &dyn Fn() -> ForwardError| {
            states.into_iter().map(|st| (st, e())).collect()
        };
        let count = u32::try_from(states.len()).unwrap_or(u32::MAX);
        let mut tries = 0;
        let chan = loop {
            let chan = match self.pick_for(server, slots, count) {
                Ok(c) => c,
                Err(e) => {
                    let why = e.to_string();
                    return fail(states, &|| ForwardError::Encode(why.clone()));
                }
            };
            // Retired and closed by another thread's rotation since the pick: pick again.
            if !chan.stop.is_cancelled() || tries == 3 {
                break chan;
            }
            tries += 1;
        };
        let Ok(mut pending) = chan.pending.lock() else {
            return fail(states, &poisoned);
        };
        // Closed (checked under the lock `retire` closes under): its reader is gone.
        if chan.stop.is_cancelled() {
            return fail(states, &|| ForwardError::Io {
                server,
                source: std::io::ErrorKind::NotConnected.into(),
            });
        }
        if pending.len() + states.len() > 30_001 {
            return fail(states, &|| ForwardError::Io {
                server,
                source: std::io::ErrorKind::WouldBlock.into(),
            });
        }
        let deadline = Instant::now() + self.timeout;
        let mut ids = Vec::with_capacity(states.len());
        let mut bufs = Vec::with_capacity(states.len());
        for mut st in states.drain(..) {
            let mut id: u16 = rand::random();
            while pending.contains_key(&id) {
                id = rand::random();
            }
            st.query[..2].copy_from_slice(&id.to_be_bytes());
            // The query's heap buffer does not move when the box moves into the map.
            bufs.push((st.query.as_ptr(), st.query.len()));
            let question: Box<[u8]> = st.query[12..12 + st.qlen].into();
            pending.insert(
                id,
                Pending {
                    question,
                    waiter: Waiter::Relay {
                        state: st,
                        deadline,
                    },
                },
            );
            ids.push(id);
        }
        // The buffers stay put: `pending` is locked and only read until the send returns.
        let sent = crate::batch::send_connected(chan.sock.as_raw_fd(), &bufs);
        let mut failed = Vec::new();
        for (id, err) in ids.into_iter().zip(sent) {
            match err {
                None => {
                    self.relays.fetch_add(1, Ordering::Relaxed);
                }
                Some(source) => {
                    if let Some(Pending {
                        waiter: Waiter::Relay { state, .. },
                        ..
                    }) = pending.remove(&id)
                    {
                        failed.push((state, ForwardError::Io { server, source }));
                    }
                }
            }
        }
        chan.removed(&pending);
        failed
    }

    /// Moves a relayed query on after `result` from its last server: finished (the client's
    /// answer is returned), or sent to the next server.
    fn advance(
        self: &Arc<Self>,
        mut st: Box<RelayState>,
        mut result: Option<Result<Vec<u8>, ForwardError>>,
    ) -> Option<ClientReply> {
        loop {
            match result.take() {
                Some(Ok(mut a)) => {
                    a[..2].copy_from_slice(&st.id);
                    if Raw::usable_bytes(&a) {
                        return st.ctx.finish(Ok(a));
                    }
                    st.last = Some(Ok(a));
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "DNS upstream failed, trying next");
                    if !matches!(st.last, Some(Ok(_))) {
                        st.last = Some(Err(e));
                    }
                }
                None => {}
            }
            if st.next >= st.len {
                let last = st.last.take().unwrap_or(Err(ForwardError::NoUpstreams));
                return st.ctx.finish(last);
            }
            let idx = usize::from(st.order[usize::from(st.next)]);
            st.next += 1;
            match self.send_relay(idx, st) {
                Ok(()) => return None,
                Err((back, e)) => {
                    st = back;
                    result = Some(Err(e));
                }
            }
        }
    }

    /// An answer to a relayed query sent to `server` arrived: truncated ones are retried over
    /// TCP (in a task, until `deadline`), the rest move the query on.
    fn answered(
        self: &Arc<Self>,
        server: SocketAddr,
        st: Box<RelayState>,
        answer: Vec<u8>,
        deadline: Instant,
    ) -> Option<ClientReply> {
        if answer[2] & 0x02 == 0 {
            return self.advance(st, Some(Ok(answer)));
        }
        let pool = self.clone();
        tokio::spawn(async move {
            let r = timeout_at(deadline, exchange_tcp(server, &st.query, st.qlen))
                .await
                .unwrap_or(Err(ForwardError::Timeout { server }));
            if let Some(reply) = pool.advance(st, Some(r)) {
                send_client_replies(vec![reply]).await;
            }
        });
        None
    }

    /// Times out relayed queries past their server's deadline (each moves on to its next
    /// server); returns the client answers of those that finished.
    fn sweep(self: &Arc<Self>, now: Instant) -> Vec<ClientReply> {
        let chans: Vec<Arc<Chan>> = match self.live.lock() {
            Ok(mut live) => {
                live.retain(|c| c.strong_count() > 0);
                live.iter().filter_map(Weak::upgrade).collect()
            }
            Err(_) => return Vec::new(),
        };
        let mut expired = Vec::new();
        for chan in &chans {
            let Ok(mut pending) = chan.pending.lock() else {
                continue;
            };
            let ids: Vec<u16> = pending
                .iter()
                .filter(
                    |(_, p)| matches!(p.waiter, Waiter::Relay { deadline, .. } if deadline <= now),
                )
                .map(|(&id, _)| id)
                .collect();
            for id in ids {
                if let Some(Pending {
                    waiter: Waiter::Relay { state, .. },
                    ..
                }) = pending.remove(&id)
                {
                    self.relays.fetch_sub(1, Ordering::Relaxed);
                    expired.push((chan.server, state));
                }
            }
            chan.removed(&pending);
        }
        expired
            .into_iter()
            .filter_map(|(server, st)| {
                self.advance(st, Some(Err(ForwardError::Timeout { server })))
            })
            .collect()
    }

    /// The live sockets to `server` (tests).
    #[cfg(test)]
    fn chans(&self, server: SocketAddr) -> Vec<std::sync::Weak<Chan>> {
        let Some((_, slots)) = self.upstreams.iter().find(|(s, _)| *s == server) else {
            return Vec::new();
        };
        slots
            .iter()
            .filter_map(|s| Some(Arc::downgrade(s.lock().ok()?.chan.as_ref()?)))
            .collect()
    }
}

/// Keeps a timer armed earlier than any query's timeout while queries flow, so arming a query's
/// timeout never has to wake the runtime's driver: tokio does so (an eventfd write, then one
/// more epoll_wait) whenever a new timer is due before every armed one, which at light load is
/// every query. Also the sweep timing out relayed queries. Ticks every `tick` while there were
/// queries since the last tick or relays are pending, then waits for the next query: no
/// wake-ups when idle.
async fn anchor(pool: Weak<UdpPool>, tick: Duration, stop: CancellationToken) {
    let Some((busy, wake)) = pool
        .upgrade()
        .map(|p| (p.busy.clone(), p.wake_anchor.clone()))
    else {
        return;
    };
    let cancelled = stop.cancelled();
    tokio::pin!(cancelled);
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = &mut cancelled => return,
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = &mut cancelled => return,
            }
            let Some(pool) = pool.upgrade() else { return };
            let relays = pool.relays.load(Ordering::Relaxed) > 0;
            if relays {
                let replies = pool.sweep(Instant::now());
                drop(pool);
                send_client_replies(replies).await;
            }
            if !busy.swap(false, Ordering::Relaxed) && !relays {
                break;
            }
        }
    }
}

/// Sends client answers, batched per listening socket.
pub(crate) async fn send_client_replies(replies: Vec<ClientReply>) {
    let mut batch: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    let mut sock: Option<Arc<UdpSocket>> = None;
    for r in replies {
        if sock.as_ref().is_some_and(|s| !Arc::ptr_eq(s, &r.sock))
            && let Some(s) = sock.take()
        {
            send_batch(&s, &mut batch).await;
        }
        sock.get_or_insert(r.sock);
        batch.push((r.bytes, r.to));
    }
    if let Some(s) = sock {
        send_batch(&s, &mut batch).await;
    }
}

/// Sends `out` on `sock` with `sendmmsg`, waiting for the socket only when it is full.
pub(crate) async fn send_batch(sock: &UdpSocket, out: &mut Vec<(Vec<u8>, SocketAddr)>) {
    let sent = crate::batch::send_all(sock.as_raw_fd(), out);
    for (b, to) in &out[sent..] {
        let _ = sock.send_to(b, *to).await;
    }
    out.clear();
}

/// Whether `answer` answers the query whose question section is `question`: QR set and the
/// question echoed (case-insensitively); error answers may omit the question.
fn answers(answer: &[u8], question: &[u8]) -> bool {
    if answer.len() < 12 || answer[2] & 0x80 == 0 {
        return false;
    }
    let qdcount = u16::from_be_bytes([answer[4], answer[5]]);
    if qdcount == 0 {
        return answer[3] & 0x0f != 0;
    }
    qdcount == 1
        && answer
            .get(12..12 + question.len())
            .is_some_and(|q| q.eq_ignore_ascii_case(question))
}

/// Dispatches answers arriving on a pool socket to the waiting queries; anything that does not
/// match a pending query's id and question is dropped.
async fn read_answers(pool: Arc<UdpPool>, chan: Arc<Chan>) {
    thread_local! {
        /// One set of receive buffers per thread for every pool socket (sockets come and go
        /// with rotation).
        static BATCH: std::cell::RefCell<Option<RecvBatch>> = const { std::cell::RefCell::new(None) };
    }
    let stop = chan.stop.clone();
    let cancelled = stop.cancelled();
    tokio::pin!(cancelled);
    let fd = chan.sock.as_raw_fd();
    let mut relayed = Vec::new();
    let mut replies = Vec::new();
    'serve: loop {
        tokio::select! {
            biased;
            r = chan.sock.readable() => if r.is_err() {
                break;
            },
            _ = &mut cancelled => break,
        }
        // Drain what is queued, then wait for readiness again.
        loop {
            let done = BATCH.with_borrow_mut(|batch| {
                let batch = match batch {
                    Some(b) => b,
                    None => match RecvBatch::new() {
                        Ok(b) => batch.insert(b),
                        Err(e) => return Err(e),
                    },
                };
                let r = chan.sock.try_io(Interest::READABLE, || {
                    let n = batch.recv(fd)?;
                    for i in 0..n {
                        let (answer, from, truncated) = batch.get(i);
                        // The kernel only delivers the upstream's datagrams to a connected
                        // socket; checked again here.
                        let from_server = from.is_some_and(|f| {
                            f.ip() == chan.server.ip() && f.port() == chan.server.port()
                        });
                        if from_server && !truncated {
                            dispatch(&pool, &chan, answer, &mut relayed);
                        }
                    }
                    // A short batch emptied the queue: wait for the next readiness edge
                    // rather than pay a system call to learn it.
                    match n < crate::batch::BATCH {
                        true => Err(std::io::ErrorKind::WouldBlock.into()),
                        false => Ok(()),
                    }
                });
                // Other errors (ICMP from a down upstream): the queries time out.
                Ok(r.is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock))
            });
            for (st, answer, deadline) in relayed.drain(..) {
                replies.extend(pool.answered(chan.server, st, answer, deadline));
            }
            match done {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    // No receive buffers: this socket's queries time out.
                    tracing::warn!(error = %e, "DNS upstream reader cannot map its buffers");
                    break 'serve;
                }
            }
        }
        if !replies.is_empty() {
            send_client_replies(std::mem::take(&mut replies)).await;
        }
    }
    // Stopped: relayed queries still pending here are abandoned (they hold the request path).
    let abandoned = chan.pending.lock().map(|mut p| std::mem::take(&mut *p));
    if let Ok(p) = abandoned {
        let relays = p
            .values()
            .filter(|p| matches!(p.waiter, Waiter::Relay { .. }))
            .count();
        pool.relays.fetch_sub(relays, Ordering::Relaxed);
        drop(p);
    }
}

/// A relayed query answered: its state, the answer, and its server's deadline.
type Relayed = (Box<RelayState>, Vec<u8>, Instant);

/// Hands `answer` to the pending query it matches (id and question), if any; answers to relayed
/// queries go to `relayed`.
fn dispatch(pool: &UdpPool, chan: &Chan, answer: &[u8], relayed: &mut Vec<Relayed>) {
    if answer.len() < 12 {
        return;
    }
    let id = u16::from_be_bytes([answer[0], answer[1]]);
    let Ok(mut pending) = chan.pending.lock() else {
        return;
    };
    let matches = pending
        .get(&id)
        .is_some_and(|p| answers(answer, &p.question));
    if matches && let Some(p) = pending.remove(&id) {
        match p.waiter {
            Waiter::Task(tx) => {
                let _ = tx.send(answer.to_vec());
            }
            Waiter::Relay { state, deadline } => {
                pool.relays.fetch_sub(1, Ordering::Relaxed);
                chan.removed(&pending);
                relayed.push((state, answer.to_vec(), deadline));
            }
        }
    }
}

/// The question section of a query we encoded (uncompressed name, type, class).
fn question_bytes(msg: &[u8]) -> Option<&[u8]> {
    let mut i = 12;
    loop {
        let len = usize::from(*msg.get(i)?);
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 {
            return None;
        }
        i += 1 + len;
    }
    msg.get(12..i + 5)
}

async fn exchange_tcp(
    server: SocketAddr,
    bytes: &[u8],
    qlen: usize,
) -> Result<Vec<u8>, ForwardError> {
    let io = |source| ForwardError::Io { server, source };
    let mut stream = TcpStream::connect(server).await.map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let len =
        u16::try_from(bytes.len()).map_err(|_| ForwardError::Encode("query too large".into()))?;
    let mut framed = Vec::with_capacity(bytes.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(bytes);
    // A random id per upstream query here too.
    let id: [u8; 2] = rand::random();
    framed[2..4].copy_from_slice(&id);
    stream.write_all(&framed).await.map_err(io)?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await.map_err(io)?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await.map_err(io)?;
    if buf.len() < 12 || buf[..2] != id || !answers(&buf, &bytes[12..12 + qlen]) {
        return Err(ForwardError::Invalid {
            server,
            why: "id, QR or question mismatch".into(),
        });
    }
    Ok(buf)
}

/// Parses an upstream answer and checks it answers `q` (id, QR, question).
pub(crate) fn check_answer(
    server: SocketAddr,
    bytes: &[u8],
    q: &Message,
) -> Result<Message, ForwardError> {
    let invalid = |why: &str| ForwardError::Invalid {
        server,
        why: why.to_string(),
    };
    let m = Message::from_vec(bytes).map_err(|e| invalid(&e.to_string()))?;
    if m.metadata.id != q.metadata.id || m.metadata.message_type != MessageType::Response {
        return Err(invalid("id or QR mismatch"));
    }
    let same_question = match (m.queries.first(), q.queries.first()) {
        (Some(a), Some(b)) => {
            a.query_type() == b.query_type()
                && a.query_class() == b.query_class()
                && a.name() == b.name()
        }
        // Some servers omit the question in error answers.
        (None, _) => m.metadata.response_code != ResponseCode::NoError,
        _ => false,
    };
    if !same_question {
        return Err(invalid("question mismatch"));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};

    fn query() -> Message {
        let mut m = Message::new(42, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(
            Name::from_ascii("a.example.com.").unwrap(),
            RecordType::A,
        ));
        m
    }

    /// A fake upstream on loopback: answers with `rcode` after `delay`, or never when `None`.
    async fn fake(rcode: Option<ResponseCode>, delay: Duration) -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                    return;
                };
                let Some(rcode) = rcode else { continue };
                let req = Message::from_vec(&buf[..n]).unwrap();
                assert!(
                    req.edns.as_ref().is_some_and(|e| e.max_payload() >= 1232),
                    "EDNS advertised"
                );
                let mut resp = req.clone();
                resp.metadata.message_type = MessageType::Response;
                resp.metadata.response_code = rcode;
                tokio::time::sleep(delay).await;
                let _ = sock.send_to(&resp.to_vec().unwrap(), from).await;
            }
        });
        addr
    }

    fn fwd(upstreams: Vec<SocketAddr>, parallel: bool) -> Forwarder {
        Forwarder::new(
            upstreams,
            Duration::from_millis(300),
            parallel,
            1232,
            CancellationToken::new(),
        )
    }

    #[tokio::test]
    async fn next_server_after_timeout_and_servfail() {
        let dead = fake(None, Duration::ZERO).await;
        let failing = fake(Some(ResponseCode::ServFail), Duration::ZERO).await;
        let good = fake(Some(ResponseCode::NXDomain), Duration::ZERO).await;
        for parallel in [false, true] {
            let f = fwd(vec![dead, failing, good], parallel);
            let m = f.forward(&query(), Transport::Udp).await.unwrap();
            assert_eq!(
                m.metadata.response_code,
                ResponseCode::NXDomain,
                "parallel={parallel}"
            );
            assert_eq!(m.metadata.id, 42);
        }
        let f = fwd(vec![dead, failing], false);
        let m = f.forward(&query(), Transport::Udp).await.unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        let f = fwd(vec![dead], false);
        assert!(matches!(
            f.forward(&query(), Transport::Udp).await,
            Err(ForwardError::Timeout { .. })
        ));
        let f = fwd(vec![], false);
        assert!(matches!(
            f.forward(&query(), Transport::Udp).await,
            Err(ForwardError::NoUpstreams)
        ));
    }

    #[test]
    fn rejects_foreign_answers() {
        let server: SocketAddr = "127.0.0.1:53".parse().unwrap();
        let q = query();
        let mut other = q.clone();
        other.metadata.message_type = MessageType::Response;
        other.metadata.id = 43;
        assert!(check_answer(server, &other.to_vec().unwrap(), &q).is_err());
        other.metadata.id = 42;
        assert!(check_answer(server, &other.to_vec().unwrap(), &q).is_ok());
        other.queries[0] = Query::query(Name::from_ascii("b.example.com.").unwrap(), RecordType::A);
        assert!(check_answer(server, &other.to_vec().unwrap(), &q).is_err());
        assert!(check_answer(server, &[1, 2, 3], &q).is_err());
    }

    /// An upstream answering A questions with 192.0.2.1, after `spoof` has had its go at the
    /// proxy's socket; records the source port and id of every query.
    async fn recording<F>(spoof: F) -> (SocketAddr, Arc<Mutex<Vec<(u16, u16)>>>)
    where
        F: Fn(&Message) -> Vec<(bool, Message)> + Send + 'static,
    {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let other = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                    return;
                };
                let req = Message::from_vec(&buf[..n]).unwrap();
                s.lock().unwrap().push((from.port(), req.metadata.id));
                // Spoofs first: (from the upstream's own port?, message).
                for (own_port, m) in spoof(&req) {
                    let via = if own_port { &sock } else { &other };
                    via.send_to(&m.to_vec().unwrap(), from).await.unwrap();
                }
                let _ = sock
                    .send_to(&a_answer(&req, "192.0.2.1").to_vec().unwrap(), from)
                    .await;
            }
        });
        (addr, seen)
    }

    fn a_answer(req: &Message, ip: &str) -> Message {
        let mut resp = req.clone();
        resp.metadata.message_type = MessageType::Response;
        resp.add_answer(hickory_proto::rr::Record::from_rdata(
            req.queries[0].name().clone(),
            60,
            hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A(ip.parse().unwrap())),
        ));
        resp
    }

    /// Spoofed answers to `req`: one with another id (6.6.6.2), one for another question
    /// (6.6.6.3).
    fn wrong_id_and_question(req: &Message) -> (Message, Message) {
        let mut wrong_id = a_answer(req, "6.6.6.2");
        wrong_id.metadata.id ^= 1;
        let mut wrong_question = a_answer(req, "6.6.6.3");
        wrong_question.queries[0] =
            Query::query(Name::from_ascii("b.example.com.").unwrap(), RecordType::A);
        (wrong_id, wrong_question)
    }

    fn ips(m: &Message) -> Vec<String> {
        m.answers.iter().map(|r| r.data.to_string()).collect()
    }

    #[tokio::test]
    async fn spoofed_answers_are_ignored() {
        let (up, seen) = recording(|req| {
            let (wrong_id, wrong_question) = wrong_id_and_question(req);
            let mut not_a_response = a_answer(req, "6.6.6.4");
            not_a_response.metadata.message_type = MessageType::Query;
            let mut wrong_type = a_answer(req, "6.6.6.5");
            wrong_type.queries[0].set_query_type(RecordType::AAAA);
            vec![
                // Right id and question, from another port.
                (false, a_answer(req, "6.6.6.1")),
                (true, wrong_id),
                (true, wrong_question),
                (true, not_a_response),
                (true, wrong_type),
            ]
        })
        .await;
        let f = fwd(vec![up], false);
        for _ in 0..20 {
            let m = f.forward(&query(), Transport::Udp).await.unwrap();
            assert_eq!(ips(&m), vec!["192.0.2.1"]);
            assert_eq!(m.metadata.id, 42);
            // The wire path gets the same treatment.
            let bytes = query().to_vec().unwrap();
            let Raw(raw) = f.forward_bytes(bytes, Transport::Udp).await.unwrap();
            assert_eq!(u16::from_be_bytes([raw[0], raw[1]]), 42, "caller's id back");
            assert_eq!(ips(&Message::from_vec(&raw).unwrap()), vec!["192.0.2.1"]);
        }
        // Ids on the wire are random per upstream query, never the client's.
        let ids: std::collections::HashSet<u16> =
            seen.lock().unwrap().iter().map(|&(_, id)| id).collect();
        assert!(ids.len() >= 35, "{} distinct ids in 40 queries", ids.len());
    }

    #[tokio::test]
    async fn upstream_sockets_rotate() {
        let (up, seen) = recording(|_| Vec::new()).await;
        // After 4 queries per socket: 200 queries over 8 sockets open 50 to 58 sockets.
        let f = fwd(vec![up], false).with_rotation(4, Duration::from_secs(3600));
        let first = {
            f.forward(&query(), Transport::Udp).await.unwrap();
            f.pool.chans(up)
        };
        assert_eq!(first.len(), 1);
        for _ in 1..200 {
            let m = f.forward(&query(), Transport::Udp).await.unwrap();
            assert_eq!(ips(&m), vec!["192.0.2.1"]);
        }
        let opened = f.pool.opened.load(Ordering::Relaxed);
        assert!((50..=58).contains(&opened), "{opened} sockets opened");
        let ports: std::collections::HashSet<u16> =
            seen.lock().unwrap().iter().map(|&(port, _)| port).collect();
        assert!(ports.len() > 40, "{} source ports", ports.len());
        // Retired sockets are closed once their queries are done.
        for _ in 0..100 {
            if first[0].upgrade().is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(first[0].upgrade().is_none(), "first socket closed");
        assert!(f.pool.chans(up).len() <= SOCKETS_PER_UPSTREAM);

        // By age: a zero lifetime means a fresh socket (and port) for every query.
        let f = fwd(vec![up], false).with_rotation(u32::MAX, Duration::ZERO);
        for _ in 0..20 {
            f.forward(&query(), Transport::Udp).await.unwrap();
        }
        assert_eq!(f.pool.opened.load(Ordering::Relaxed), 20);
        // Without rotation due: at most one socket per slot.
        let f = fwd(vec![up], false);
        for _ in 0..50 {
            f.forward(&query(), Transport::Udp).await.unwrap();
        }
        assert!(f.pool.opened.load(Ordering::Relaxed) <= SOCKETS_PER_UPSTREAM as u64);
    }

    #[tokio::test]
    async fn answer_for_a_retired_socket_still_arrives() {
        // Every query opens a new socket while the previous ones still wait for their answer.
        let (up, _) = recording(|_| Vec::new()).await;
        let f = Arc::new(fwd(vec![up], false).with_rotation(1, Duration::from_secs(3600)));
        let mut set = JoinSet::new();
        for _ in 0..50 {
            let f = f.clone();
            set.spawn(async move { f.forward(&query(), Transport::Udp).await });
        }
        while let Some(r) = set.join_next().await {
            assert_eq!(ips(&r.unwrap().unwrap()), vec!["192.0.2.1"]);
        }
    }

    /// A relay end handing the result to a channel.
    struct ToChannel(oneshot::Sender<Result<Vec<u8>, ForwardError>>);

    impl Relay for ToChannel {
        fn finish(self: Box<Self>, result: Result<Vec<u8>, ForwardError>) -> Option<ClientReply> {
            let _ = self.0.send(result);
            None
        }
    }

    async fn relay(f: &Forwarder, query: &Message) -> Result<Message, ForwardError> {
        let (tx, rx) = oneshot::channel();
        let mut q = query.clone();
        q.set_edns(hickory_proto::op::Edns::new());
        if let Some(e) = q.edns.as_mut() {
            e.set_max_payload(1232);
        }
        assert!(
            f.relay(q.to_vec().unwrap(), Box::new(ToChannel(tx)))
                .is_none()
        );
        let raw = rx.await.unwrap()?;
        Ok(Message::from_vec(&raw).unwrap())
    }

    #[tokio::test]
    async fn relayed_queries_time_out_and_move_on() {
        let dead = fake(None, Duration::ZERO).await;
        let failing = fake(Some(ResponseCode::ServFail), Duration::ZERO).await;
        let good = fake(Some(ResponseCode::NXDomain), Duration::ZERO).await;
        assert!(!fwd(vec![dead, good], true).can_relay());
        assert!(fwd(vec![dead], true).can_relay());
        for _ in 0..3 {
            let f = fwd(vec![dead, failing, good], false);
            let m = relay(&f, &query()).await.unwrap();
            assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
            assert_eq!(m.metadata.id, 42);
        }
        let f = fwd(vec![dead, failing], false);
        let m = relay(&f, &query()).await.unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        let f = fwd(vec![dead], false);
        assert!(matches!(
            relay(&f, &query()).await,
            Err(ForwardError::Timeout { .. })
        ));
        assert_eq!(f.pool.relays.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn relayed_queries_ignore_spoofs_and_survive_rotation() {
        let (up, seen) = recording(|req| {
            let (wrong_id, wrong_question) = wrong_id_and_question(req);
            vec![
                (false, a_answer(req, "6.6.6.1")),
                (true, wrong_id),
                (true, wrong_question),
            ]
        })
        .await;
        // A new socket every 2 queries while earlier ones still wait for their answers.
        let f = Arc::new(fwd(vec![up], false).with_rotation(2, Duration::from_secs(3600)));
        let mut set = JoinSet::new();
        for _ in 0..40 {
            let f = f.clone();
            set.spawn(async move { relay(&f, &query()).await });
        }
        while let Some(r) = set.join_next().await {
            let m = r.unwrap().unwrap();
            assert_eq!(ips(&m), vec!["192.0.2.1"]);
            assert_eq!(m.metadata.id, 42);
        }
        let seen = seen.lock().unwrap();
        let ids: std::collections::HashSet<u16> = seen.iter().map(|&(_, id)| id).collect();
        assert!(ids.len() >= 35, "{} distinct ids in 40 queries", ids.len());
        let ports: std::collections::HashSet<u16> = seen.iter().map(|&(p, _)| p).collect();
        assert!(ports.len() >= 15, "{} source ports", ports.len());
        assert_eq!(f.pool.relays.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn truncated_relayed_answer_retried_over_tcp() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let udp = UdpSocket::bind(addr).await.unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                let mut resp = Message::from_vec(&buf[..n]).unwrap();
                resp.metadata.message_type = MessageType::Response;
                resp.metadata.truncation = true;
                let _ = udp.send_to(&resp.to_vec().unwrap(), from).await;
            }
        });
        tokio::spawn(async move {
            while let Ok((mut s, _)) = tcp.accept().await {
                let mut len = [0u8; 2];
                s.read_exact(&mut len).await.unwrap();
                let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
                s.read_exact(&mut q).await.unwrap();
                let a = a_answer(&Message::from_vec(&q).unwrap(), "192.0.2.7")
                    .to_vec()
                    .unwrap();
                s.write_all(&(a.len() as u16).to_be_bytes()).await.unwrap();
                s.write_all(&a).await.unwrap();
            }
        });
        let f = fwd(vec![addr], false);
        let m = relay(&f, &query()).await.unwrap();
        assert_eq!(ips(&m), vec!["192.0.2.7"]);
        assert_eq!(m.metadata.id, 42);
        assert!(!m.metadata.truncation);
    }
}
