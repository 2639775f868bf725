//! The UDP listener loop: receives queries in batches, runs each through the answer path, then
//! relays the batch's wire forwards upstream together and sends its answers with `sendmmsg`.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::Error;
use crate::answer::{AnswerPath, Outgoing, UdpListener};
use crate::datagrams::{self, RecvBatch};

/// Serves UDP queries on `sock` until `shutdown`.
pub(super) async fn serve(
    sock: Arc<UdpSocket>,
    addr: SocketAddr,
    path: Arc<AnswerPath>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), Error> {
    // One cancellation future for the whole loop, not one per packet.
    tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        r = receive(sock, addr, path, shutdown.clone(), tracker) => r,
    }
}

async fn receive(
    sock: Arc<UdpSocket>,
    addr: SocketAddr,
    path: Arc<AnswerPath>,
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
    let listener = UdpListener {
        sock: &sock,
        shutdown: &shutdown,
        tracker: &tracker,
    };
    loop {
        sock.readable().await.map_err(serve_err)?;
        let r = sock.try_io(Interest::READABLE, || {
            let n = batch.recv(fd)?;
            for i in 0..n {
                // Queries longer than a datagram buffer cannot be whole: dropped.
                if let (bytes, Some(src), false) = batch.get(i) {
                    path.udp_query(&listener, bytes, src, &mut out);
                }
            }
            // A short batch emptied the queue: wait for the next readiness edge rather than
            // pay a system call to learn it.
            if n < datagrams::BATCH {
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
        path.relay_queued(&mut out);
        if !out.replies.is_empty() {
            // `sendmmsg`, waiting for the socket only when it is full.
            datagrams::send_batch(&sock, &mut out.replies).await;
        }
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
