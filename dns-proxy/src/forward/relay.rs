//! Relayed UDP queries: forwarded without a task, channel or timer of their own. A query's
//! state ([`RelayState`]) waits in its socket's pending table; the socket's reader moves it on
//! when the answer arrives ([`UdpPool::answered`]: the next server after SERVFAIL/REFUSED, TCP
//! after TC, else the client's answer made by its [`Relay`] end), and the sweep when its
//! server's deadline passes. Queries going to the same server are sent with one `sendmmsg`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rand::seq::SliceRandom;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use tokio::time::{Instant, timeout_at};

use super::chan::{MAX_RELAY_UPSTREAMS, Pending, Relay, RelayState, Waiter};
use super::matching::question_bytes;
use super::pool::UdpPool;
use super::tcp::exchange_tcp;
use super::{ForwardError, Forwarder, Raw, poisoned};
use crate::datagrams::{ClientReply, send_client_replies};

impl Forwarder {
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
}

impl UdpPool {
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
        let sent = crate::datagrams::send_connected(chan.sock.as_raw_fd(), &bufs);
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
    pub(super) fn advance(
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
    pub(super) fn answered(
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
}
