//! The TCP exchange with one upstream: queries that came in over TCP, and UDP answers that came
//! back truncated (TC), retried here.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::ForwardError;
use super::matching::answers;

pub(super) async fn exchange_tcp(
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
