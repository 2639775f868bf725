//! One upstream socket and its pending table: the queries waiting on it for their answer,
//! keyed by the random id used on the wire, and the hand-over of an arriving answer to the query
//! it matches (id and question), to a waiting task or to a relayed query's state
//! ([`RelayState`], moved on by [`super::relay`]).
//!
//! The forwarder's parts depend on each other in one direction: `matching` ← `chan` ← `pool`
//! (the sockets, their readers) ← `relay`, `sweep`; `tcp` ← `relay`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::net::UdpSocket;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::matching::answers;
use super::{ForwardError, poisoned};
use crate::datagrams::ClientReply;

/// One connected upstream socket: the kernel only delivers datagrams from the upstream's
/// address and port to it.
pub(super) struct Chan {
    pub(super) sock: UdpSocket,
    pub(super) server: SocketAddr,
    pub(super) pending: Mutex<HashMap<u16, Pending>>,
    /// Replaced in its slot: no new queries; the reader stops once the last pending one ends.
    pub(super) retired: AtomicBool,
    /// Stops the reader (a child of the pool's stop token).
    pub(super) stop: CancellationToken,
}

impl Chan {
    pub(super) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        // Under the lock: a relay registering checks `stop` under it too.
        match self.pending.lock() {
            Ok(p) if !p.is_empty() => {}
            _ => self.stop.cancel(),
        }
    }
}

/// The end of a relayed query: turns the forwarding result into the client's answer.
pub(crate) trait Relay: Send + 'static {
    /// `result` is the first usable answer (carrying the query's own id), else the last
    /// unusable one, else the last error.
    fn finish(self: Box<Self>, result: Result<Vec<u8>, ForwardError>) -> Option<ClientReply>;
}

/// A relayed UDP query between servers.
pub(super) struct RelayState {
    /// The query as sent upstream (its first two bytes hold the id last used on the wire).
    pub(super) query: Vec<u8>,
    /// The query's own id, put back into the answer.
    pub(super) id: [u8; 2],
    pub(super) qlen: usize,
    /// Servers (indices into the pool's upstreams) in the order tried, `next` the next one.
    pub(super) order: [u8; MAX_RELAY_UPSTREAMS],
    pub(super) len: u8,
    pub(super) next: u8,
    pub(super) last: Option<Result<Vec<u8>, ForwardError>>,
    pub(super) ctx: Box<dyn Relay>,
}

/// Relayed queries support up to this many upstreams (resolv.conf allows 3).
pub(super) const MAX_RELAY_UPSTREAMS: usize = 8;

pub(super) struct Pending {
    /// The query's question section as sent; the answer must echo it.
    pub(super) question: Box<[u8]>,
    pub(super) waiter: Waiter,
}

/// Who gets a pending query's answer.
pub(super) enum Waiter {
    /// A task awaiting it (with its own timeout).
    Task(oneshot::Sender<Vec<u8>>),
    /// A relayed query: handled where the answer arrives; timed out by the pool's sweep.
    Relay {
        state: Box<RelayState>,
        deadline: Instant,
    },
}

/// Removes a pending query when its exchange ends (answer, timeout or cancellation).
pub(super) struct PendingGuard<'a> {
    pub(super) chan: &'a Chan,
    pub(super) id: u16,
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
    pub(super) fn removed(&self, pending: &HashMap<u16, Pending>) {
        if pending.is_empty() && self.retired.load(Ordering::Acquire) {
            self.stop.cancel();
        }
    }

    /// Registers a query pending on this socket under a fresh random id, unique among the socket's
    /// pending ones; `waiter(id)` makes its waiter. Must be called with the socket just picked:
    /// a retired socket's reader sees every query it has to wait for.
    pub(super) fn register(
        &self,
        question: &[u8],
        waiter: impl FnOnce(u16) -> Waiter,
    ) -> Result<(std::sync::MutexGuard<'_, HashMap<u16, Pending>>, u16), ForwardError> {
        let mut pending = self.pending.lock().map_err(|_| poisoned())?;
        if pending.len() > 30_000 {
            return Err(ForwardError::Io {
                server: self.server,
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
}

/// A relayed query answered: its state, the answer, and its server's deadline.
pub(super) type Relayed = (Box<RelayState>, Vec<u8>, Instant);

/// Hands `answer` to the pending query it matches (id and question), if any; answers to relayed
/// queries go to `relayed`.
pub(super) fn dispatch(
    relays: &AtomicUsize,
    chan: &Chan,
    answer: &[u8],
    relayed: &mut Vec<Relayed>,
) {
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
                relays.fetch_sub(1, Ordering::Relaxed);
                chan.removed(&pending);
                relayed.push((state, answer.to_vec(), deadline));
            }
        }
    }
}
