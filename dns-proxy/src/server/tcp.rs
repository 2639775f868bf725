//! The TCP listener loop: accepts connections up to the limit, reads length-prefixed queries
//! until the connection idles out, and writes back what the answer path gives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
        let Ok(permit) = limits.conns.clone().try_acquire_owned() else {
            tracing::debug!(peer = ?peer, "too many DNS TCP connections, closing");
            drop(stream);
            continue;
        };
        let (path, shutdown) = (path.clone(), shutdown.clone());
        let idle = limits.idle;
        tracker.spawn(async move {
            let _permit = permit;
            tokio::select! {
                _ = shutdown.cancelled() => {}
                r = connection(stream, &path, idle) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, peer = ?peer, "DNS TCP connection ended");
                    }
                }
            }
        });
    }
}

async fn connection(
    mut stream: TcpStream,
    path: &AnswerPath,
    idle: Duration,
) -> std::io::Result<()> {
    let peer = stream.peer_addr()?;
    stream.set_nodelay(true)?;
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(idle, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        }
        buf.resize(usize::from(u16::from_be_bytes(len)), 0);
        match tokio::time::timeout(idle, stream.read_exact(&mut buf)).await {
            Ok(r) => {
                r?;
            }
            Err(_) => return Ok(()),
        }
        if let Some(b) = path.tcp_query(&buf, peer).await {
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
