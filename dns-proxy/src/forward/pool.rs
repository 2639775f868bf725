//! The upstream socket pool: a few connected UDP sockets per upstream shared by every
//! forwarded query, each replaced by a fresh one on a new random port when due for rotation
//! (cache-poisoning defence), the exchange of one query awaited by a task, and each socket's
//! reader: it receives answers in batches and hands each to the query pending on that socket
//! that it matches; relayed queries are moved on right there and their client answers sent
//! together.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use std::os::fd::AsRawFd;

use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::chan::{Chan, PendingGuard, Waiter, dispatch};
use super::{ForwardError, ROTATE_AFTER, ROTATE_AFTER_QUERIES, poisoned};
use crate::datagrams::{RecvBatch, send_client_replies};

/// Sockets per upstream shared by all forwarded UDP queries: answers are matched to queries by
/// id and question. Saves a socket, a bind and an epoll registration per query.
pub(super) const SOCKETS_PER_UPSTREAM: usize = 8;

/// A pool position: its current socket and how much it has been used.
#[derive(Default)]
pub(super) struct Slot {
    chan: Option<Arc<Chan>>,
    sent: u32,
    born: Option<Instant>,
}

/// An upstream's sockets.
pub(super) type Slots = Box<[Mutex<Slot>]>;

/// The sockets of every upstream, and the state the timeout sweep and timer anchor share.
pub(super) struct UdpPool {
    pub(super) upstreams: Box<[(SocketAddr, Slots)]>,
    pub(super) stop: CancellationToken,
    /// Per-server timeout.
    pub(super) timeout: Duration,
    /// Every socket opened whose reader may still run (the sweep looks for expired relays).
    pub(super) live: Mutex<Vec<Weak<Chan>>>,
    /// Relayed queries pending.
    pub(super) relays: AtomicUsize,
    pub(super) rotate_queries: u32,
    pub(super) rotate_after: Duration,
    /// Sockets opened so far.
    pub(super) opened: AtomicU64,
    /// Timer anchor (see [`super::sweep`]): queries seen since its last tick, its wake-up, and
    /// whether it runs.
    pub(super) busy: Arc<AtomicBool>,
    pub(super) wake_anchor: Arc<Notify>,
    pub(super) anchor_started: AtomicBool,
}

impl std::fmt::Debug for UdpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpPool").finish_non_exhaustive()
    }
}

impl UdpPool {
    /// Sockets for `upstreams`, opened on first use; their readers stop with `stop`.
    pub(super) fn new(
        upstreams: &[SocketAddr],
        timeout: Duration,
        stop: CancellationToken,
    ) -> UdpPool {
        UdpPool {
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
    pub(super) fn pick_for(
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

    /// Sends `bytes` (with a fresh random id on the wire; `bytes` is left as it was) on one of
    /// `server`'s sockets and waits for the matching answer (which carries the wire id).
    pub(super) async fn exchange(
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
        let (pending, id) = chan.register(question, |_| Waiter::Task(tx))?;
        drop(pending);
        let _guard = PendingGuard { chan: &chan, id };
        let original = [bytes[0], bytes[1]];
        bytes[..2].copy_from_slice(&id.to_be_bytes());
        let sent = chan.sock.send(bytes).await;
        bytes[..2].copy_from_slice(&original);
        sent.map_err(|source| ForwardError::Io { server, source })?;
        rx.await.map_err(|_| ForwardError::Timeout { server })
    }

    /// The live sockets to `server` (tests).
    #[cfg(test)]
    pub(super) fn chans(&self, server: SocketAddr) -> Vec<Weak<Chan>> {
        let Some((_, slots)) = self.upstreams.iter().find(|(s, _)| *s == server) else {
            return Vec::new();
        };
        slots
            .iter()
            .filter_map(|s| Some(Arc::downgrade(s.lock().ok()?.chan.as_ref()?)))
            .collect()
    }
}

/// Dispatches answers arriving on a pool socket to the waiting queries; anything that does not
/// match a pending query's id and question is dropped.
pub(super) async fn read_answers(pool: Arc<UdpPool>, chan: Arc<Chan>) {
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
                            dispatch(&pool.relays, &chan, answer, &mut relayed);
                        }
                    }
                    // A short batch emptied the queue: wait for the next readiness edge
                    // rather than pay a system call to learn it.
                    match n < crate::datagrams::BATCH {
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
