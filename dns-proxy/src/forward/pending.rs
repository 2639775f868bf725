//! The pending table of an upstream socket: the queries waiting on it for their answer, keyed
//! by the random id used on the wire, and the hand-over of an arriving answer to the query it
//! matches (id and question), to a waiting task or to a relayed query's state.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::matching::answers;
use super::pool::{Chan, UdpPool};
use super::relay::RelayState;
use super::{ForwardError, poisoned};

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
pub(super) fn dispatch(pool: &UdpPool, chan: &Chan, answer: &[u8], relayed: &mut Vec<Relayed>) {
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
