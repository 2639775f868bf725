//! The TCP client slots: at most [`Slots::max`] connections, and when they are all taken a new
//! client takes the slot of one that is not being served, which is closed: the one whose
//! answer has waited the longest for the client to read it, else the one idle the longest
//! between queries (RFC 7766 §6.2.3: a server under pressure may close idle connections). A
//! connection whose query is being answered is never cut. So clients that query and never
//! read, or that hold silent connections, cannot keep new clients out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Connections told to go whose slots are already given to newcomers, at most: how far past
/// the cap the open connections may be while the evicted ones close.
pub(crate) const MAX_EVICTING: usize = 64;

/// What a connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Doing {
    /// Waiting for a query; since when.
    Reading(Instant),
    /// Answering a query (the answer path, forwards included).
    Answering,
    /// Writing an answer the client has not read yet; since when.
    Writing(Instant),
}

/// The slots every TCP listener of one proxy shares.
#[derive(Debug)]
pub(crate) struct Slots {
    max: usize,
    conns: Arc<Mutex<Conns>>,
}

#[derive(Debug, Default)]
struct Conns {
    next_id: u64,
    live: HashMap<u64, Live>,
    /// Evicted, not closed yet.
    evicting: usize,
}

#[derive(Debug)]
struct Live {
    doing: Doing,
    evict: CancellationToken,
}

/// One admitted connection: its slot (freed when dropped), what it is doing, and the signal to
/// go.
#[derive(Debug)]
pub(crate) struct Slot {
    id: u64,
    evict: CancellationToken,
    conns: Arc<Mutex<Conns>>,
}

fn lock(m: &Mutex<Conns>) -> std::sync::MutexGuard<'_, Conns> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Slots {
    pub fn new(max: usize) -> Slots {
        Slots {
            max: max.max(1),
            conns: Arc::default(),
        }
    }

    /// A slot for a new connection, making room when all are taken (see the module docs);
    /// `None`: every connection is answering a query, or [`MAX_EVICTING`] are still closing.
    pub fn admit(&self) -> Option<Slot> {
        let mut conns = lock(&self.conns);
        if conns.live.len() >= self.max + conns.evicting {
            if conns.evicting >= MAX_EVICTING {
                return None;
            }
            // Writing first (the client does not read), then reading; the longest first; of
            // two alike, the one accepted first.
            let victim = conns
                .live
                .iter()
                .filter(|(_, c)| !c.evict.is_cancelled())
                .filter_map(|(id, c)| match c.doing {
                    Doing::Writing(since) => Some(((0, since), *id)),
                    Doing::Reading(since) => Some(((1, since), *id)),
                    Doing::Answering => None,
                })
                .min()
                .map(|(_, id)| id)?;
            if let Some(c) = conns.live.get(&victim) {
                c.evict.cancel();
            }
            conns.evicting += 1;
        }
        let id = conns.next_id;
        conns.next_id += 1;
        let evict = CancellationToken::new();
        conns.live.insert(
            id,
            Live {
                doing: Doing::Reading(Instant::now()),
                evict: evict.clone(),
            },
        );
        Some(Slot {
            id,
            evict,
            conns: self.conns.clone(),
        })
    }

    /// Connections open now (evicted ones still closing included).
    #[cfg(test)]
    pub fn open(&self) -> usize {
        lock(&self.conns).live.len()
    }
}

impl Slot {
    fn set(&self, doing: Doing) {
        if let Some(c) = lock(&self.conns).live.get_mut(&self.id) {
            c.doing = doing;
        }
    }

    /// Waiting for the next query.
    pub fn reading(&self) {
        self.set(Doing::Reading(Instant::now()));
    }

    /// A query is being answered.
    pub fn answering(&self) {
        self.set(Doing::Answering);
    }

    /// Its answer is being written.
    pub fn writing(&self) {
        self.set(Doing::Writing(Instant::now()));
    }

    /// Completes when the connection is to close to make room for a new one.
    pub async fn evicted(&self) {
        self.evict.cancelled().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut conns = lock(&self.conns);
        conns.live.remove(&self.id);
        if self.evict.is_cancelled() {
            conns.evicting = conns.evicting.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_full_house_makes_room_from_writers_then_idle_readers_never_answerers() {
        let slots = Slots::new(3);
        let tick = || tokio::time::sleep(Duration::from_millis(10));
        let reader = slots.admit().unwrap();
        tick().await;
        let answering = slots.admit().unwrap();
        answering.answering();
        let writer = slots.admit().unwrap();
        tick().await;
        writer.writing();
        // The writer goes first, though the reader has waited longer.
        let fourth = slots.admit().unwrap();
        assert!(writer.evict.is_cancelled() && !reader.evict.is_cancelled());
        assert_eq!(slots.open(), 4, "the evicted one still closes");
        drop(writer);
        // Then the one idle the longest.
        let fifth = slots.admit().unwrap();
        assert!(reader.evict.is_cancelled() && !fourth.evict.is_cancelled());
        drop(reader);
        // Every one answering: refused.
        fourth.answering();
        fifth.answering();
        assert!(slots.admit().is_none());
        assert!(!answering.evict.is_cancelled());
        fifth.reading();
        assert!(slots.admit().is_some());
    }

    #[test]
    fn evictions_still_closing_are_bounded() {
        let slots = Slots::new(1);
        let mut held = vec![slots.admit().unwrap()];
        for _ in 0..MAX_EVICTING {
            held.push(slots.admit().unwrap());
        }
        assert!(slots.admit().is_none());
        held.remove(0);
        assert!(slots.admit().is_some(), "one closed: room again");
    }
}
