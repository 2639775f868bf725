//! An SDS server that is not ours: SPIRE's agent (or any SPIFFE Workload API / SDS server)
//! may already own the workload identity socket when the agent starts. Istio's agent then
//! leaves that socket alone and runs its own SDS server for file certificates only; a socket
//! file that nobody answers on is a leftover and is removed.
//!
//! The check is a real HTTP/2 exchange, as a gRPC dial is: connect, send the client preface
//! and an empty SETTINGS frame, and expect the server's SETTINGS frame (the first thing every
//! HTTP/2 server sends) within the timeout.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Duration;

use crate::Error;

/// How long Istio's agent waits for an existing socket to answer.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The client connection preface followed by an empty SETTINGS frame (RFC 9113 §3.4, §6.5).
const CLIENT_PREFACE: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
/// Frame type of SETTINGS.
const SETTINGS: u8 = 0x4;

/// What [`check_socket`] found at a socket path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketCheck {
    /// Nothing there.
    Absent,
    /// A server answered HTTP/2 on it: leave it alone.
    Healthy,
    /// A file was there but nothing answered (or not HTTP/2); it was removed.
    RemovedStale,
}

/// Checks whether a live HTTP/2 server listens on `path`. A file that does not answer within
/// `timeout` is removed; failing to remove it is the error.
///
/// As Istio's agent: symlinks are followed, and a regular file counts as no socket (it is left
/// where it is).
pub fn check_socket(path: &Path, timeout: Duration) -> Result<SocketCheck, Error> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(SocketCheck::Absent),
        Err(e) => {
            return Err(Error::Socket {
                path: path.display().to_string(),
                reason: format!("checking for an existing socket: {e}"),
            });
        }
    };
    if meta.is_file() {
        return Ok(SocketCheck::Absent);
    }
    if meta.file_type().is_socket() && answers_http2(path, timeout).is_ok() {
        return Ok(SocketCheck::Healthy);
    }
    std::fs::remove_file(path).map_err(|e| Error::Socket {
        path: path.display().to_string(),
        reason: format!("a socket file nobody answers on is there and could not be removed: {e}"),
    })?;
    Ok(SocketCheck::RemovedStale)
}

/// Connects and waits for the server's SETTINGS frame.
fn answers_http2(path: &Path, timeout: Duration) -> std::io::Result<()> {
    let mut s = proto::uds::connect_std(path)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(CLIENT_PREFACE)?;
    let mut header = [0u8; 9];
    s.read_exact(&mut header)?;
    let stream_id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    if header[3] == SETTINGS && stream_id == 0 {
        Ok(())
    } else {
        Err(std::io::Error::new(
            ErrorKind::InvalidData,
            "the first frame is not SETTINGS",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn absent_path_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let got = check_socket(&dir.path().join("socket"), CHECK_TIMEOUT).unwrap();
        assert_eq!(got, SocketCheck::Absent);
    }

    #[test]
    fn a_leftover_socket_file_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "binding leaves the file");
        let got = check_socket(&path, CHECK_TIMEOUT).unwrap();
        assert_eq!(got, SocketCheck::RemovedStale);
        assert!(!path.exists());
    }

    #[test]
    fn a_regular_file_is_no_socket_and_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        std::fs::write(&path, b"not a socket").unwrap();
        assert_eq!(
            check_socket(&path, CHECK_TIMEOUT).unwrap(),
            SocketCheck::Absent
        );
        assert!(path.exists());
    }

    #[test]
    fn a_listener_that_never_answers_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        // Accepted by the kernel's backlog, but nobody speaks HTTP/2.
        let _l = UnixListener::bind(&path).unwrap();
        let got = check_socket(&path, Duration::from_millis(200)).unwrap();
        assert_eq!(got, SocketCheck::RemovedStale);
    }

    #[tokio::test]
    async fn a_grpc_server_is_healthy_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let cfg = crate::Config::defaults(dir.path());
        let manager = crate::SecretManager::new(std::sync::Arc::new(cfg), test_metrics()).unwrap();
        let server = crate::SdsServer::bind(&path, manager).await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(server.run(stop.clone()));
        let p = path.clone();
        let got = tokio::task::spawn_blocking(move || check_socket(&p, CHECK_TIMEOUT))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, SocketCheck::Healthy);
        assert!(path.exists());
        // Through a symlink (a socket mounted elsewhere), as Istio's os.Stat follows it.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let got = tokio::task::spawn_blocking(move || check_socket(&link, CHECK_TIMEOUT))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, SocketCheck::Healthy);
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    fn test_metrics() -> std::sync::Arc<crate::Metrics> {
        let mut registry = prometheus_client::registry::Registry::default();
        std::sync::Arc::new(crate::Metrics::new(&mut registry))
    }
}
