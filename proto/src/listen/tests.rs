use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

/// A listener whose accepts fail with `error` `fails` times, then succeed.
struct Failing {
    error: fn() -> io::Error,
    fails: usize,
    calls: AtomicUsize,
}

impl Listener for Failing {
    type Conn = ();
    fn poll_accept(&self, _: &mut Context<'_>) -> Poll<io::Result<((), Option<IpAddr>)>> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(if n < self.fails {
            Err((self.error)())
        } else {
            Ok(((), None))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn out_of_descriptors_backs_off_instead_of_spinning() {
    for errno in [libc::EMFILE, libc::ENFILE] {
        let listener = Failing {
            error: match errno {
                libc::EMFILE => || io::Error::from_raw_os_error(libc::EMFILE),
                _ => || io::Error::from_raw_os_error(libc::ENFILE),
            },
            fails: 6,
            calls: AtomicUsize::new(0),
        };
        let start = tokio::time::Instant::now();
        accept(&listener, &mut AcceptBackoff::new("test")).await;
        // 100 + 200 + 400 + 800 + 1000 + 1000 ms between the seven accepts.
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(3500),
            "errno {errno}"
        );
        assert_eq!(listener.calls.load(Ordering::Relaxed), 7);
    }
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_left_is_skipped_at_once_and_success_resets_the_backoff() {
    let listener = Failing {
        error: || io::Error::from(io::ErrorKind::ConnectionAborted),
        fails: 3,
        calls: AtomicUsize::new(0),
    };
    let start = tokio::time::Instant::now();
    let mut backoff = AcceptBackoff::new("test");
    accept(&listener, &mut backoff).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        backoff.pause(&io::Error::from_raw_os_error(libc::EMFILE)),
        BACKOFF_START
    );
    assert_eq!(
        backoff.pause(&io::Error::from_raw_os_error(libc::EMFILE)),
        BACKOFF_START * 2
    );
    backoff.reset();
    assert_eq!(
        backoff.pause(&io::Error::from_raw_os_error(libc::ENOMEM)),
        BACKOFF_START
    );
}

#[test]
fn caps_count_connections_in_all_and_per_peer() {
    let caps = ConnCaps::new(Caps {
        total: 3,
        per_peer: 2,
    });
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let a1 = caps.admit(Some(a)).expect("first from a");
    let a2 = caps.admit(Some(a)).expect("second from a");
    assert_eq!(caps.admit(Some(a)).unwrap_err(), Refused::Peer(2));
    let b1 = caps.admit(Some(b)).expect("b has its own count");
    assert_eq!(caps.admit(None).unwrap_err(), Refused::Total(3));
    drop(a1);
    assert_eq!(caps.open(), 2);
    let _a3 = caps.admit(Some(a)).expect("a's slot is free again");
    drop((a2, b1));
    let _local = caps
        .admit(None)
        .expect("a Unix peer counts in the total only");
    assert_eq!(caps.open(), 2);
}

#[test]
fn mapped_addresses_count_as_the_ipv4_peer() {
    let caps = ConnCaps::new(Caps {
        total: 10,
        per_peer: 1,
    });
    let _p = caps
        .admit(Some(canonical("::ffff:10.0.0.1".parse().unwrap())))
        .unwrap();
    assert!(caps.admit(Some("10.0.0.1".parse().unwrap())).is_err());
}

async fn connect_from(src: &str, to: std::net::SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{src}:0").parse().unwrap()).unwrap();
    s.connect(to).await.expect("connect")
}

/// Reads until EOF (true) or until the server is seen to keep the connection (false).
async fn closed_by_server(c: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_millis(300), c.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn connections_over_a_cap_are_closed_at_once() {
    use futures::StreamExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let caps = ConnCaps::new(Caps {
        total: 2,
        per_peer: 1,
    });
    let mut conns = Box::pin(incoming(listener, caps.clone(), "test"));
    let mut first = connect_from("127.0.0.1", addr).await;
    let held = conns.next().await.unwrap().unwrap();
    let mut over_peer = connect_from("127.0.0.1", addr).await;
    let mut other = connect_from("127.0.0.2", addr).await;
    let held2 = conns.next().await.unwrap().unwrap();
    assert_eq!(
        held2.get_ref().peer_addr().unwrap(),
        other.local_addr().unwrap(),
        "the second peer got in"
    );
    assert!(closed_by_server(&mut over_peer).await, "over the peer cap");
    let mut over_total = connect_from("127.0.0.3", addr).await;
    let next = tokio::spawn(async move { (conns.next().await, conns) });
    assert!(closed_by_server(&mut over_total).await, "over the total");
    assert!(!closed_by_server(&mut first).await);
    assert!(!closed_by_server(&mut other).await);
    drop(held);
    let _again = connect_from("127.0.0.1", addr).await;
    let (again, _conns) = next.await.unwrap();
    let _admitted = again.unwrap().unwrap();
    assert_eq!(caps.open(), 2);
    drop(held2);
}

#[test]
#[allow(unsafe_code)] // getrlimit(2): the limit as the kernel has it
fn the_open_file_limit_is_raised_to_the_hard_limit() {
    let (soft, hard) = raise_open_file_limit().expect("rlimit");
    assert_eq!(soft, hard);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed to it.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert_eq!((lim.rlim_cur, lim.rlim_max), (soft, hard), "in force");
}
