//! Read-only netlink dumps of what a run needs to know about the namespace, without starting a
//! process: interface addresses, policy routing rules (`ip rule`), nf_tables tables and
//! chains (`nft list`); and the one address change every IPv6 run makes (`ip -6 addr replace
//! ::6/128 dev lo`). Writing nf_tables (the `--native-nftables` apply) is
//! `nft/kernel.rs`'s.
//!
//! Each dump is one request on a fresh socket; any failure (no nf_tables in the kernel, a
//! truncated message) yields `None` and the caller decides what "unknown" means.
// socket(2), send(2) and recv(2) on the netlink socket.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;

const RTM_GETRULE: u16 = 34;
const RTM_GETADDR: u16 = 22;
const RTM_NEWADDR: u16 = 20;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_CREATE: u16 = 0x400;
/// lo's interface index in every network namespace (the kernel's `LOOPBACK_IFINDEX`).
const LOOPBACK_IFINDEX: u32 = 1;
const IFADDRMSG: usize = 8;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const FIB_RULE_HDR: usize = 12;
const FRA_TABLE: u16 = 15;
const FRA_FWMARK: u16 = 10;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFGENMSG: usize = 4;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;

/// nf_tables families (`nfgen_family`).
pub const NFPROTO_INET: u8 = 1;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

/// One dumped object: the fixed header bytes after `nlmsghdr`, and its attributes.
struct Object {
    header: Vec<u8>,
    attrs: Vec<(u16, Vec<u8>)>,
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

/// Room for one answer: the kernel builds dump messages of at most 32 KiB for a reader.
pub(crate) const RECV_BUF: usize = 64 * 1024;

/// Receives one datagram into `buf` (its capacity is the limit) without zeroing the buffer
/// first, so only the pages the kernel writes are touched.
pub(crate) fn recv_into(fd: &OwnedFd, buf: &mut Vec<u8>, flags: i32) -> std::io::Result<usize> {
    buf.clear();
    // SAFETY: the spare capacity is `buf.capacity()` writable bytes and recv writes at most
    // that many.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.capacity(),
            flags,
        )
    };
    let n = usize::try_from(n).map_err(|_| std::io::Error::last_os_error())?;
    // SAFETY: recv initialised the first `n` bytes, and `n` is at most the capacity.
    unsafe { buf.set_len(n) };
    Ok(n)
}

/// Sends one dump request (`msg_type` with `payload` as its fixed header) and collects the
/// answers, whose fixed header is `header_len` bytes.
fn dump(protocol: i32, msg_type: u16, payload: &[u8], header_len: usize) -> Option<Vec<Object>> {
    // SAFETY: plain socket(2) call; the descriptor is owned right away.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if raw < 0 {
        return None;
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = NLMSG_HDR + payload.len();
    let mut req = Vec::with_capacity(len);
    req.extend_from_slice(&(len as u32).to_ne_bytes());
    req.extend_from_slice(&msg_type.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel assigns
    req.extend_from_slice(payload);
    // SAFETY: `req` is a valid buffer of `req.len()` bytes; the socket is unconnected, so the
    // default destination is the kernel.
    let sent = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent != req.len() as isize {
        return None;
    }
    let mut out = Vec::new();
    let mut buf = Vec::with_capacity(RECV_BUF);
    loop {
        if recv_into(&fd, &mut buf, 0).ok()? == 0 {
            return None;
        }
        let data = &buf[..];
        let mut at = 0;
        while at + NLMSG_HDR <= data.len() {
            let msg_len = u32_at(data, at)? as usize;
            let kind = u16_at(data, at + 4)?;
            if msg_len < NLMSG_HDR || at + msg_len > data.len() {
                return None;
            }
            match kind {
                NLMSG_DONE => return Some(out),
                NLMSG_ERROR => {
                    // An error code of 0 is an acknowledgement; anything else fails the dump.
                    let code = i32::from_ne_bytes(data.get(at + 16..at + 20)?.try_into().ok()?);
                    if code != 0 {
                        return None;
                    }
                }
                _ => {
                    let body = &data[at + NLMSG_HDR..at + msg_len];
                    let header = body.get(..header_len)?.to_vec();
                    out.push(Object {
                        header,
                        attrs: attributes(&body[align(header_len).min(body.len())..])?,
                    });
                }
            }
            at += align(msg_len);
        }
    }
}

fn attributes(mut b: &[u8]) -> Option<Vec<(u16, Vec<u8>)>> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16_at(b, 0)? as usize;
        let kind = u16_at(b, 2)? & 0x3fff; // without NLA_F_NESTED / NLA_F_NET_BYTEORDER
        if len < 4 || len > b.len() {
            return None;
        }
        out.push((kind, b[4..len].to_vec()));
        b = &b[align(len).min(b.len())..];
    }
    Some(out)
}

fn attr(o: &Object, kind: u16) -> Option<&[u8]> {
    o.attrs
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| v.as_slice())
}

fn string(v: &[u8]) -> String {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// Whether a policy rule `fwmark <mark> lookup <table>` exists in IPv4 or IPv6 (`None`: the
/// rules could not be read).
pub fn fwmark_rule_present(mark: u32, table: u32) -> Option<bool> {
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let mut hdr = [0u8; FIB_RULE_HDR];
        hdr[0] = family;
        let rules = dump(libc::NETLINK_ROUTE, RTM_GETRULE, &hdr, FIB_RULE_HDR)?;
        let found = rules.iter().any(|r| {
            let fwmark = attr(r, FRA_FWMARK).and_then(|v| u32_at(v, 0));
            let t = attr(r, FRA_TABLE)
                .and_then(|v| u32_at(v, 0))
                .or_else(|| r.header.get(4).map(|&t| u32::from(t)));
            fwmark == Some(mark) && t == Some(table)
        });
        if found {
            return Some(true);
        }
    }
    Some(false)
}

/// Every interface address, in the kernel's dump order (IPv4, then IPv6, each by interface
/// index), as `getifaddrs` reports them (the local address of a point-to-point link), from one
/// address dump (`getifaddrs` also dumps every link). `None`: the addresses could not be read.
pub fn addresses() -> Option<Vec<std::net::IpAddr>> {
    let dumped = dump(
        libc::NETLINK_ROUTE,
        RTM_GETADDR,
        &[0u8; IFADDRMSG],
        IFADDRMSG,
    )?;
    Some(
        dumped
            .iter()
            .filter_map(|a| {
                let v = attr(a, IFA_LOCAL).or_else(|| attr(a, IFA_ADDRESS))?;
                match (i32::from(a.header[0]), v.len()) {
                    (libc::AF_INET, 4) => {
                        Some(std::net::IpAddr::from(<[u8; 4]>::try_from(v).ok()?))
                    }
                    (libc::AF_INET6, 16) => {
                        Some(std::net::IpAddr::from(<[u8; 16]>::try_from(v).ok()?))
                    }
                    _ => None,
                }
            })
            .collect(),
    )
}

/// The request `ip -6 addr replace <addr>/128 dev lo` sends: `RTM_NEWADDR` with create and
/// replace, universe scope, `IFA_LOCAL` and `IFA_ADDRESS` both the address.
fn loopback_v6_request(addr: std::net::Ipv6Addr) -> Vec<u8> {
    let mut attrs = Vec::with_capacity(40);
    for kind in [IFA_LOCAL, IFA_ADDRESS] {
        attrs.extend_from_slice(&20u16.to_ne_bytes());
        attrs.extend_from_slice(&kind.to_ne_bytes());
        attrs.extend_from_slice(&addr.octets());
    }
    let len = NLMSG_HDR + IFADDRMSG + attrs.len();
    let mut req = Vec::with_capacity(len);
    req.extend_from_slice(&(len as u32).to_ne_bytes());
    req.extend_from_slice(&RTM_NEWADDR.to_ne_bytes());
    req.extend_from_slice(
        &(NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE | NLM_F_CREATE).to_ne_bytes(),
    );
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // pid
    // ifaddrmsg: family, prefix length, flags, scope, interface index.
    req.extend_from_slice(&[libc::AF_INET6 as u8, 128, 0, 0]);
    req.extend_from_slice(&LOOPBACK_IFINDEX.to_ne_bytes());
    req.extend_from_slice(&attrs);
    req
}

/// `ip -6 addr replace <addr>/128 dev lo`, without the process. `Err` carries the errno (or
/// `EIO` for an answer that could not be read).
pub fn replace_loopback_v6(addr: std::net::Ipv6Addr) -> Result<(), i32> {
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: plain socket(2) call; the descriptor is owned right away.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(errno());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let req = loopback_v6_request(addr);
    // SAFETY: `req` is a valid buffer of `req.len()` bytes; the kernel is the destination.
    let sent = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent != req.len() as isize {
        return Err(errno());
    }
    let mut buf = Vec::with_capacity(4096);
    recv_into(&fd, &mut buf, 0).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    // The answer is one NLMSG_ERROR: code 0 acknowledges, else minus the errno.
    match (u16_at(&buf, 4), buf.get(16..20)) {
        (Some(NLMSG_ERROR), Some(code)) => {
            let code = i32::from_ne_bytes(code.try_into().map_err(|_| libc::EIO)?);
            if code == 0 { Ok(()) } else { Err(-code) }
        }
        _ => Err(libc::EIO),
    }
}

fn nft_dump(msg: u16) -> Option<Vec<Object>> {
    // nfgenmsg: family unspecified (every family), version 0, resource id 0.
    dump(
        libc::NETLINK_NETFILTER,
        (NFNL_SUBSYS_NFTABLES << 8) | msg,
        &[0u8; NFGENMSG],
        NFGENMSG,
    )
}

/// Every nf_tables table as (family, name) (`None`: nf_tables could not be read).
pub fn nft_tables() -> Option<Vec<(u8, String)>> {
    Some(
        nft_dump(NFT_MSG_GETTABLE)?
            .iter()
            .filter_map(|t| Some((t.header[0], string(attr(t, NFTA_TABLE_NAME)?))))
            .collect(),
    )
}

/// Every nf_tables chain as (family, table, chain) (`None`: nf_tables could not be read).
pub fn nft_chains() -> Option<Vec<(u8, String, String)>> {
    Some(
        nft_dump(NFT_MSG_GETCHAIN)?
            .iter()
            .filter_map(|c| {
                Some((
                    c.header[0],
                    string(attr(c, NFTA_CHAIN_TABLE)?),
                    string(attr(c, NFTA_CHAIN_NAME)?),
                ))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_parsed_with_alignment() {
        // len 5 ("ab\0" + header) padded to 8, then a u32 attribute.
        let b = [7, 0, 1, 0, b'a', b'b', 0, 0, 8, 0, 3, 0, 1, 0, 0, 0];
        let a = attributes(&b).expect("attrs");
        assert_eq!(a[0], (1, b"ab\0".to_vec()));
        assert_eq!(a[1].0, 3);
        assert_eq!(string(&a[0].1), "ab");
        assert!(attributes(&[9, 0, 1, 0]).is_none(), "length past the end");
    }

    #[test]
    fn loopback_address_request_is_what_ip_sends() {
        // `strace ip -6 addr replace ::6/128 dev lo`: len 64, RTM_NEWADDR, flags 0x505,
        // ifaddrmsg {AF_INET6, 128, 0, universe, lo}, IFA_LOCAL ::6, IFA_ADDRESS ::6.
        let r = loopback_v6_request("::6".parse().expect("addr"));
        let mut six = [0u8; 16];
        six[15] = 6;
        let mut want = Vec::new();
        want.extend(64u32.to_ne_bytes());
        want.extend(20u16.to_ne_bytes());
        want.extend(0x505u16.to_ne_bytes());
        want.extend(1u32.to_ne_bytes());
        want.extend(0u32.to_ne_bytes());
        want.extend([10, 128, 0, 0]);
        want.extend(1u32.to_ne_bytes());
        for kind in [2u16, 1] {
            want.extend(20u16.to_ne_bytes());
            want.extend(kind.to_ne_bytes());
            want.extend(six);
        }
        assert_eq!(r, want);
    }

    #[test]
    fn dumps_answer_in_this_namespace() {
        // Reading needs no privilege for rules; nf_tables may be absent or need CAP_NET_ADMIN.
        assert!(fwmark_rule_present(0xdead_beef, 250).is_some());
        // The address dump lists what getifaddrs lists, in the same order.
        let ours = addresses().expect("address dump");
        let theirs: Vec<std::net::IpAddr> = nix::ifaddrs::getifaddrs()
            .expect("getifaddrs")
            .filter_map(|i| {
                let a = i.address?;
                a.as_sockaddr_in()
                    .map(|s| std::net::IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| std::net::IpAddr::V6(s.ip())))
            })
            .collect();
        let (mut v4, v6): (Vec<_>, Vec<_>) = theirs.into_iter().partition(|a| a.is_ipv4());
        v4.extend(v6);
        assert_eq!(ours, v4);
        if let Some(tables) = nft_tables() {
            assert!(tables.iter().all(|(_, n)| !n.is_empty()));
        }
    }
}
