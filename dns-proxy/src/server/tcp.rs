//! The TCP listener loop: accepts connections into the client slots ([`slots`]: a full house
//! makes room by closing a connection that does not read its answers or sits idle), reads
//! length-prefixed queries until the connection idles out, and writes back what the answer
//! path gives, each answer within the write timeout (a client that queries and never reads
//! is closed).

mod slots;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(super) use slots::Slots;

use super::TcpLimits;
use crate::Error;
use crate::answer::AnswerPath;

/// Serves TCP connections on `listener` until `shutdown`.
pub(super) async fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    path: Arc<AnswerPath>,
    limits: TcpLimits,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), Error> {
    // EMFILE and friends back off (100 ms doubling to 1 s) instead of spinning or failing.
    let mut backoff = proto::listen::AcceptBackoff::new("dns-tcp");
    tracing::debug!(addr = %addr, "DNS TCP listener serving");
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            (stream, peer) = proto::listen::accept(&listener, &mut backoff) => (stream, peer),
        };
        let Some(slot) = limits.slots.admit() else {
            tracing::debug!(peer = ?peer, "every DNS TCP connection is answering, closing");
            drop(stream);
            continue;
        };
        let (path, shutdown) = (path.clone(), shutdown.clone());
        let timeouts = Timeouts {
            idle: limits.idle,
            write: limits.write,
        };
        tracker.spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = slot.evicted() => {
                    tracing::debug!(peer = ?peer, "DNS TCP connection closed for a new one");
                }
                r = connection(stream, &path, &slot, timeouts) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, peer = ?peer, "DNS TCP connection ended");
                    }
                }
            }
        });
    }
}

/// The bounds of one connection.
#[derive(Clone, Copy)]
struct Timeouts {
    /// Waiting for (the rest of) a query.
    idle: Duration,
    /// Writing one answer.
    write: Duration,
}

async fn connection(
    mut stream: TcpStream,
    path: &Arc<AnswerPath>,
    slot: &slots::Slot,
    timeouts: Timeouts,
) -> std::io::Result<()> {
    let peer = stream.peer_addr()?;
    stream.set_nodelay(true)?;
    let mut buf = Vec::new();
    loop {
        slot.reading();
        let mut len = [0u8; 2];
        match tokio::time::timeout(timeouts.idle, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        }
        buf.resize(usize::from(u16::from_be_bytes(len)), 0);
        match tokio::time::timeout(timeouts.idle, stream.read_exact(&mut buf)).await {
            Ok(r) => {
                r?;
            }
            Err(_) => return Ok(()),
        }
        slot.answering();
        if let Some(b) = path.tcp_query(&buf, peer).await {
            let Ok(n) = u16::try_from(b.len()) else {
                continue;
            };
            let mut framed = Vec::with_capacity(b.len() + 2);
            framed.extend_from_slice(&n.to_be_bytes());
            framed.extend_from_slice(&b);
            slot.writing();
            match tokio::time::timeout(timeouts.write, stream.write_all(&framed)).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the client read no answer within {:?}", timeouts.write),
                    ));
                }
            }
        }
    }
}
