//! Who owns the other end of a loopback TCP connection: one `SOCK_DIAG_BY_FAMILY` request
//! (inet_diag) on a `NETLINK_SOCK_DIAG` socket, looking the peer's socket up by its 4-tuple and
//! reading its `idiag_uid`.
//!
//! The kernel answers an exact lookup while the request is being sent, so the exchange never
//! waits on anything but the kernel (a receive timeout bounds it anyway). Only full sockets are
//! trusted: the kernel reports uid 0 for TIME_WAIT and request sockets, which would make any
//! peer that closed early look like root.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
/// `inet_diag_req_v2`: family, protocol, ext, pad, states, then the socket id.
const REQ_LEN: usize = 8 + SOCKID_LEN;
/// `inet_diag_sockid`: ports, two 16-byte addresses, interface, cookie.
const SOCKID_LEN: usize = 4 + 16 + 16 + 4 + 8;
/// `inet_diag_msg`'s `idiag_uid`: after family/state/timer/retrans, the id, and
/// expires/rqueue/wqueue.
const MSG_UID_OFFSET: usize = 4 + SOCKID_LEN + 12;
const IPPROTO_TCP: u8 = 6;
/// Every TCP state (`idiag_states` is a bit mask); the state of the answer is checked instead.
const ALL_STATES: u32 = u32::MAX;
/// TCP states whose diag answer carries no owner (uid 0): `TCP_TIME_WAIT`, `TCP_NEW_SYN_RECV`.
const OWNERLESS_STATES: [u8; 2] = [6, 12];

/// Why a peer's uid is not known.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sock_diag netlink socket: {0}")]
    Socket(nix::Error),
    #[error("sock_diag request for {peer}: {source}")]
    Io {
        peer: SocketAddr,
        source: nix::Error,
    },
    #[error("no socket {peer} -> {local} (the peer closed it?): {source}")]
    NotFound {
        peer: SocketAddr,
        local: SocketAddr,
        source: nix::Error,
    },
    #[error("the socket of {peer} is in TCP state {state}, which has no owner")]
    Ownerless { peer: SocketAddr, state: u8 },
    #[error("malformed sock_diag answer for {peer}: {reason}")]
    Malformed {
        peer: SocketAddr,
        reason: &'static str,
    },
    #[error("{peer} and {local} are of different address families")]
    Families { peer: SocketAddr, local: SocketAddr },
}

/// The uid owning the socket at `peer` connected to `local` (ours), in this network namespace.
pub fn peer_uid(peer: SocketAddr, local: SocketAddr) -> Result<u32, Error> {
    let req = request(peer, local)?;
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )
    .map_err(Error::Socket)?;
    let io = |source| Error::Io { peer, source };
    setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 500_000)).map_err(io)?;
    sendto(
        fd.as_raw_fd(),
        &req,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(io)?;
    let mut buf = vec![0u8; 8192];
    let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(io)?;
    parse_answer(&buf[..n], peer, local)
}

/// Maps a v4-mapped IPv6 address (a dual-stack listener's view of an IPv4 peer) to IPv4.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(proto::listen::canonical(a.ip()), a.port())
}

fn addr_bytes(ip: IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out = v6.octets(),
    }
    out
}

/// The netlink message: the peer's socket is the one whose source is `peer` and destination
/// `local`.
fn request(peer: SocketAddr, local: SocketAddr) -> Result<Vec<u8>, Error> {
    let (p, l) = (canonical(peer), canonical(local));
    let family = match (p.ip(), l.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
        _ => return Err(Error::Families { peer, local }),
    };
    let len = NLMSG_HDR + REQ_LEN;
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    b.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    b.extend_from_slice(&1u32.to_ne_bytes()); // seq
    b.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel
    b.extend_from_slice(&[family as u8, IPPROTO_TCP, 0, 0]);
    b.extend_from_slice(&ALL_STATES.to_ne_bytes());
    // Ports and addresses are in network order.
    b.extend_from_slice(&p.port().to_be_bytes());
    b.extend_from_slice(&l.port().to_be_bytes());
    b.extend_from_slice(&addr_bytes(p.ip()));
    b.extend_from_slice(&addr_bytes(l.ip()));
    b.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    // INET_DIAG_NOCOOKIE: match on the tuple alone.
    b.extend_from_slice(&u32::MAX.to_ne_bytes());
    b.extend_from_slice(&u32::MAX.to_ne_bytes());
    debug_assert_eq!(b.len(), len);
    Ok(b)
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

/// Reads the owner out of the kernel's answer: one `inet_diag_msg`, or an error message.
fn parse_answer(b: &[u8], peer: SocketAddr, local: SocketAddr) -> Result<u32, Error> {
    let malformed = |reason| Error::Malformed { peer, reason };
    let len = u32_at(b, 0).ok_or(malformed("short header"))? as usize;
    if len < NLMSG_HDR || len > b.len() {
        return Err(malformed("bad message length"));
    }
    let body = &b[NLMSG_HDR..len];
    match u16_at(b, 4).ok_or(malformed("short header"))? {
        NLMSG_ERROR => {
            let errno = u32_at(body, 0).ok_or(malformed("short error"))? as i32;
            let source = nix::Error::from_raw(-errno);
            if errno == 0 {
                return Err(malformed("acknowledgement instead of an answer"));
            }
            Err(Error::NotFound {
                peer,
                local,
                source,
            })
        }
        SOCK_DIAG_BY_FAMILY => {
            let state = *body.get(1).ok_or(malformed("short answer"))?;
            if OWNERLESS_STATES.contains(&state) {
                return Err(Error::Ownerless { peer, state });
            }
            u32_at(body, MSG_UID_OFFSET).ok_or(malformed("short answer"))
        }
        _ => Err(malformed("unexpected message type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn own_loopback_connection_is_owned_by_our_euid() {
        for ip in ["127.0.0.1", "[::1]"] {
            let Ok(listener) = std::net::TcpListener::bind(format!("{ip}:0")) else {
                continue; // no IPv6 on this host
            };
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, peer) = listener.accept().unwrap();
            assert_eq!(peer, client.local_addr().unwrap());
            let uid = peer_uid(peer, server.local_addr().unwrap()).unwrap();
            assert_eq!(uid, nix::unistd::geteuid().as_raw(), "{ip}");
        }
    }

    #[test]
    fn v4_mapped_peers_are_looked_up_as_ipv4() {
        let Ok(listener) = std::net::TcpListener::bind("[::]:0") else {
            return; // no IPv6 on this host
        };
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (server, peer) = listener.accept().unwrap();
        assert!(peer.is_ipv6(), "dual-stack listener sees {peer}");
        let uid = peer_uid(peer, server.local_addr().unwrap()).unwrap();
        assert_eq!(uid, nix::unistd::geteuid().as_raw());
        drop(client);
    }

    #[test]
    fn a_closed_peer_is_not_found_and_never_reads_as_root() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        // Nobody connected from this port.
        let e = peer_uid("127.0.0.1:1".parse().unwrap(), local).unwrap_err();
        assert!(matches!(e, Error::NotFound { .. }), "{e}");
        // A peer that closed first: its socket lingers in TIME_WAIT (owner reported as 0) or
        // is gone; either way there is no uid.
        let client = std::net::TcpStream::connect(local).unwrap();
        let (server, peer) = listener.accept().unwrap();
        drop(client);
        drop(server);
        std::thread::sleep(Duration::from_millis(50));
        match peer_uid(peer, local) {
            Err(Error::Ownerless { state: 6, .. } | Error::NotFound { .. }) => {}
            other => panic!("closed peer: {other:?}"),
        }
    }

    #[test]
    fn mixed_families_and_bad_answers_are_errors() {
        let e = request(
            "127.0.0.1:1".parse().unwrap(),
            "[2001:db8::1]:2".parse().unwrap(),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Families { .. }), "{e}");
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        for bad in [&[][..], &[200, 0, 0, 0][..], &[16, 0, 0, 0, 99, 0][..]] {
            assert!(parse_answer(bad, peer, peer).is_err());
        }
    }
}
