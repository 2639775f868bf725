use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const LIMITS: Limits = Limits {
    first_stream: Duration::from_secs(10),
    idle: Duration::from_secs(60),
};

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_at_the_first_stream_deadline() {
    let (mut peer, conn) = tokio::io::duplex(1024);
    let mut conn = Watched::new(conn, LIMITS);
    let start = Instant::now();
    let err = conn.read(&mut [0; 16]).await.expect_err("closed");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    // A GOAWAY went out at the deadline; the peer, which never closed, had the grace to.
    assert_eq!(start.elapsed(), LIMITS.first_stream + goaway::CLOSE_GRACE);
    let mut seen = Vec::new();
    peer.read_to_end(&mut seen)
        .await
        .expect("the write side was shut");
    assert_eq!(seen, goaway_frame(0), "GOAWAY, NO_ERROR, no stream taken");
    // Writes fail as well from then on.
    assert!(conn.write_all(b"x").await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_peer_closing_after_the_goaway_ends_the_close_at_once() {
    let (mut peer, conn) = tokio::io::duplex(1024);
    let mut conn = Watched::new(conn, LIMITS);
    let start = Instant::now();
    let closer = async {
        let mut frame = [0u8; 17];
        peer.read_exact(&mut frame).await.expect("GOAWAY");
        drop(peer);
    };
    let mut buf = [0; 16];
    let (_, read) = tokio::join!(closer, conn.read(&mut buf));
    assert_eq!(read.expect_err("closed").kind(), io::ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), LIMITS.first_stream, "no grace needed");
}

#[tokio::test(start_paused = true)]
async fn the_goaway_names_the_last_stream_and_waits_for_a_frame_boundary() {
    let (mut peer, conn) = tokio::io::duplex(4096);
    let mut conn = Watched::new(conn, LIMITS);
    let streams = conn.connect_info();
    // The client's preface and its HEADERS on stream 3; the server's SETTINGS, then half of a
    // DATA frame when the stream ends.
    peer.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    peer.write_all(&[0, 0, 1, 1, 4, 0, 0, 0, 3, 0x82])
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = conn.read(&mut buf).await.unwrap();
    assert_eq!(n, 24 + 10);
    drop(streams.open());
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    conn.write_all(&[0, 0, 4, 0, 1, 0, 0, 0, 3, b'a'])
        .await
        .unwrap();
    // Mid-frame at the deadline: no GOAWAY can go, the connection is just closed.
    let start = Instant::now();
    let err = conn.read(&mut buf).await.expect_err("closed");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), LIMITS.idle, "closed at once");

    // At a boundary the GOAWAY names stream 3.
    let (mut peer, conn) = tokio::io::duplex(4096);
    let mut conn = Watched::new(conn, LIMITS);
    let streams = conn.connect_info();
    peer.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    peer.write_all(&[0, 0, 1, 1, 4, 0, 0, 0, 3, 0x82])
        .await
        .unwrap();
    let _ = conn.read(&mut buf).await.unwrap();
    drop(streams.open());
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut seen = [0u8; 9 + 17];
    let (read, _) = tokio::join!(peer.read_exact(&mut seen), conn.read(&mut buf));
    read.expect("SETTINGS then GOAWAY");
    assert_eq!(seen[9..], goaway_frame(3));
}

#[tokio::test(start_paused = true)]
async fn bytes_without_a_stream_do_not_keep_a_connection() {
    // A peer that sends its preface and pings (bytes, but no stream) goes all the same.
    let (mut peer, conn) = tokio::io::duplex(1024);
    let mut conn = Watched::new(conn, LIMITS);
    let start = Instant::now();
    let reader = async {
        let mut buf = [0; 16];
        loop {
            let _ = conn.read(&mut buf).await?;
        }
    };
    let writer = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if peer.write_all(b"PING").await.is_err() {
                return;
            }
        }
    };
    let res: io::Result<()> = tokio::select! {
        r = reader => r,
        () = writer => unreachable!("the peer writes until the connection closes"),
    };
    assert_eq!(res.expect_err("closed").kind(), io::ErrorKind::TimedOut);
    // The GOAWAY at the deadline, then the grace while the peer kept writing.
    assert_eq!(start.elapsed(), LIMITS.first_stream + goaway::CLOSE_GRACE);
}

#[tokio::test(start_paused = true)]
async fn an_open_stream_is_never_cut_then_the_idle_timeout_runs() {
    let (mut peer, conn) = tokio::io::duplex(1024);
    let mut conn = Watched::new(conn, LIMITS);
    let streams = conn.connect_info();
    let guard = streams.open();
    assert_eq!(streams.open_now(), 1);
    let mut buf = [0; 4];
    let waited = tokio::time::timeout(Duration::from_secs(3600), conn.read(&mut buf)).await;
    assert!(waited.is_err(), "no deadline while a stream is open");
    peer.write_all(b"data").await.expect("write");
    conn.read_exact(&mut buf).await.expect("still served");

    // The last stream ends: the idle timeout runs from then, and the pending read is woken
    // for it (no other I/O needed).
    let ended = Instant::now();
    let read = tokio::spawn(async move { conn.read(&mut [0; 4]).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(guard);
    let err = read.await.expect("task").expect_err("closed");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert_eq!(
        ended.elapsed(),
        Duration::from_secs(5) + LIMITS.idle + goaway::CLOSE_GRACE,
        "idle counted from the stream's end (then the GOAWAY's grace)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_stream_before_the_idle_deadline_keeps_the_connection() {
    let (_peer, conn) = tokio::io::duplex(1024);
    let mut conn = Watched::new(conn, LIMITS);
    let streams = conn.connect_info();
    drop(streams.open());
    tokio::time::sleep(LIMITS.idle - Duration::from_secs(1)).await;
    let _second = streams.open();
    let waited = tokio::time::timeout(Duration::from_secs(600), conn.read(&mut [0; 4])).await;
    assert!(waited.is_err(), "the second stream holds the connection");
}
