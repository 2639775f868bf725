//! The reader of an upstream socket: receives answers in batches and hands each to the query
//! pending on that socket that it matches; relayed queries are moved on right there and their
//! client answers sent together.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use std::os::fd::AsRawFd;
use tokio::io::Interest;

use super::pending::{Waiter, dispatch};
use super::pool::{Chan, UdpPool};
use crate::datagrams::{RecvBatch, send_client_replies};

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
                            dispatch(&pool, &chan, answer, &mut relayed);
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
