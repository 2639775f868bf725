//! `--run-validation`: proves the redirect works. A server listens on the outbound and inbound
//! capture ports on loopback; a client connects to `127.0.0.6:<probe port>` (`::6` on IPv6
//! hosts) as the proxy user; the redirect is proven when a connection arrives whose
//! `SO_ORIGINAL_DST` port is the probe port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::config::Config;

/// Exit status when validation fails (Istio's).
pub const VALIDATION_ERROR_CODE: i32 = 126;

/// Why validation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no validation listener could bind any of {0}")]
    NoListener(String),
    #[error(
        "validation timeout after {0:?}: no redirected connection to the probe port arrived; iptables rules are not in effect"
    )]
    Timeout(Duration),
}

/// The original destination of a redirected connection.
pub fn original_dst(stream: &TcpStream) -> Option<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    let fd = stream.as_fd();
    if stream.local_addr().ok()?.is_ipv4() {
        let sin = getsockopt(&fd, sockopt::OriginalDst).ok()?;
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
    } else {
        let sin6 = getsockopt(&fd, sockopt::Ip6tOriginalDst).ok()?;
        let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
        Some(SocketAddr::new(
            IpAddr::V6(ip),
            u16::from_be(sin6.sin6_port),
        ))
    }
}

/// Runs the probe. Blocks at most `cfg.probe_timeout`.
pub fn run(cfg: &Config) -> Result<(), Error> {
    let v6 = cfg.host_ip.is_some_and(|ip| ip.is_ipv6());
    let (listen_ip, probe_ip): (IpAddr, IpAddr) = if v6 {
        (
            Ipv6Addr::LOCALHOST.into(),
            "::6".parse().unwrap_or(Ipv6Addr::LOCALHOST).into(),
        )
    } else {
        (
            Ipv4Addr::LOCALHOST.into(),
            Ipv4Addr::new(127, 0, 0, 6).into(),
        )
    };
    let addrs = [cfg.proxy_port, cfg.inbound_capture_port].map(|p| SocketAddr::new(listen_ip, p));
    let listeners: Vec<TcpListener> = addrs
        .iter()
        .filter_map(|a| match TcpListener::bind(a) {
            Ok(l) => l.set_nonblocking(true).ok().map(|_| l),
            Err(e) => {
                tracing::error!(addr = %a, error = %e, "validation listener");
                None
            }
        })
        .collect();
    if listeners.is_empty() {
        return Err(Error::NoListener(format!("{addrs:?}")));
    }
    let done = Arc::new(AtomicBool::new(false));
    let probe = SocketAddr::new(probe_ip, cfg.iptables_probe_port);
    let uid = cfg.proxy_uids.first().and_then(|u| u.parse::<u32>().ok());
    let gid = cfg.proxy_gids.first().and_then(|g| g.parse::<u32>().ok());
    let client = {
        let done = done.clone();
        std::thread::spawn(move || client_loop(probe, uid, gid, &done))
    };
    let deadline = Instant::now() + cfg.probe_timeout;
    let result = loop {
        let mut found = false;
        for l in &listeners {
            while let Ok((stream, _)) = l.accept() {
                let dst = original_dst(&stream);
                tracing::info!(?dst, "validation connection");
                if dst.is_some_and(|d| d.port() == cfg.iptables_probe_port) {
                    found = true;
                }
            }
        }
        if found {
            tracing::info!("validation passed, iptables rules established");
            break Ok(());
        }
        if Instant::now() >= deadline {
            break Err(Error::Timeout(cfg.probe_timeout));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    done.store(true, Ordering::Relaxed);
    let _ = client.join();
    result
}

/// Connects to the probe address until told to stop. When running as root, the socket is
/// created with the proxy's fsuid/fsgid (this thread only) so the owner match treats it as the
/// proxy's traffic, as in Istio's validation container which runs as the proxy user.
fn client_loop(probe: SocketAddr, uid: Option<u32>, gid: Option<u32>, done: &AtomicBool) {
    if nix::unistd::geteuid().is_root() {
        if let Some(g) = gid {
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(g));
        }
        if let Some(u) = uid {
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u));
        }
    }
    while !done.load(Ordering::Relaxed) {
        if let Err(e) = connect_from_loopback(probe) {
            tracing::debug!(error = %e, %probe, "validation probe connect");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Connects to `dst` from the loopback address of its family (127.0.0.1 / ::1), never from the
/// probe address itself (whose traffic the rules deliberately leave alone).
fn connect_from_loopback(dst: SocketAddr) -> nix::Result<TcpStream> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, connect, socket,
    };
    match dst {
        SocketAddr::V4(d) => {
            let fd = socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC,
                None,
            )?;
            bind(
                fd.as_raw_fd(),
                &SockaddrIn::from(std::net::SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)),
            )?;
            connect(fd.as_raw_fd(), &SockaddrIn::from(d))?;
            Ok(TcpStream::from(fd))
        }
        SocketAddr::V6(d) => {
            let fd = socket(
                AddressFamily::Inet6,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC,
                None,
            )?;
            bind(
                fd.as_raw_fd(),
                &SockaddrIn6::from(std::net::SocketAddrV6::new(Ipv6Addr::LOCALHOST, 0, 0, 0)),
            )?;
            connect(fd.as_raw_fd(), &SockaddrIn6::from(d))?;
            Ok(TcpStream::from(fd))
        }
    }
}
