//! UDP datagrams received and sent in batches (`recvmmsg`, `sendmmsg`): one system call for
//! every datagram queued on a socket instead of one each, plus the one that finds the queue
//! empty; and the answers for UDP clients, sent batched per listening socket by whichever part
//! completes them (a listener's loop, or an upstream socket's reader for relayed queries).
// recvmmsg(2), sendmmsg(2), mmap(2) and the C structs they fill.
#![allow(unsafe_code)]

use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use tokio::net::UdpSocket;

/// Datagrams per `recvmmsg` call.
pub(crate) const BATCH: usize = 32;
/// Largest datagram received in a batch; longer ones are reported as truncated.
pub(crate) const SLOT: usize = 65_535;

/// Anonymous memory mapped for the receive buffers: only the pages datagrams touch become
/// resident (a 2 MiB heap allocation might be zeroed, hence resident, by the allocator).
struct Pages {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `Pages` owns its mapping exclusively; access goes through `&`/`&mut` borrows of the
// owning `RecvBatch`.
unsafe impl Send for Pages {}

impl Pages {
    fn new(len: usize) -> io::Result<Pages> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Pages {
            ptr: ptr.cast(),
            len,
        })
    }

    fn slice(&self, start: usize, len: usize) -> &[u8] {
        assert!(start + len <= self.len);
        // SAFETY: in bounds (checked), mapped readable for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), len) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no borrows outlive `self`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Receive buffers for up to [`BATCH`] datagrams.
pub(crate) struct RecvBatch {
    bufs: Pages,
    addrs: Box<[libc::sockaddr_storage]>,
    lens: [usize; BATCH],
    truncated: [bool; BATCH],
}

impl RecvBatch {
    pub fn new() -> io::Result<RecvBatch> {
        Ok(RecvBatch {
            bufs: Pages::new(SLOT * BATCH)?,
            // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
            addrs: vec![
                unsafe { MaybeUninit::<libc::sockaddr_storage>::zeroed().assume_init() };
                BATCH
            ]
            .into_boxed_slice(),
            lens: [0; BATCH],
            truncated: [false; BATCH],
        })
    }

    /// Receives what is queued on the non-blocking socket `fd` (at least one datagram, or
    /// `WouldBlock`); returns how many.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        let base = self.bufs.ptr;
        let mut iovs: [libc::iovec; BATCH] = std::array::from_fn(|i| libc::iovec {
            // SAFETY: `i * SLOT` is within `bufs` (BATCH * SLOT bytes).
            iov_base: unsafe { base.add(i * SLOT) }.cast(),
            iov_len: SLOT,
        });
        // SAFETY: mmsghdr is plain old data; all zeroes is a valid value.
        let mut msgs: [libc::mmsghdr; BATCH] =
            unsafe { MaybeUninit::<[libc::mmsghdr; BATCH]>::zeroed().assume_init() };
        for (i, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_name = (&raw mut self.addrs[i]).cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as _;
            m.msg_hdr.msg_iov = &raw mut iovs[i];
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every pointer in `msgs` points into buffers that outlive the call, with the
        // lengths given.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                BATCH as _,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        for (i, m) in msgs[..n].iter().enumerate() {
            self.lens[i] = (m.msg_len as usize).min(SLOT);
            self.truncated[i] = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        }
        Ok(n)
    }

    /// Datagram `i` of the last [`RecvBatch::recv`]: its bytes, sender, and whether it was
    /// longer than [`SLOT`] (and cut).
    pub fn get(&self, i: usize) -> (&[u8], Option<SocketAddr>, bool) {
        (
            self.bufs.slice(i * SLOT, self.lens[i]),
            to_socket_addr(&self.addrs[i]),
            self.truncated[i],
        )
    }
}

fn to_socket_addr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for AF_INET; sockaddr_storage is large
            // and aligned enough for it.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn to_sockaddr(addr: &SocketAddr, ss: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin =
                unsafe { &mut *(ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as _;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>() as _
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &mut *(ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as _;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>() as _
        }
    }
}

/// Sends `out` (datagram, destination) pairs on the non-blocking socket `fd` with as few
/// `sendmmsg` calls as the kernel allows; returns how many were sent before the socket would
/// block or failed (the rest are dropped, as UDP may).
pub(crate) fn send_all(fd: RawFd, out: &[(Vec<u8>, SocketAddr)]) -> usize {
    let mut sent = 0;
    while sent < out.len() {
        let chunk = &out[sent..out.len().min(sent + BATCH)];
        // SAFETY: plain old data; all zeroes is valid.
        let mut addrs: [libc::sockaddr_storage; BATCH] =
            unsafe { MaybeUninit::<[libc::sockaddr_storage; BATCH]>::zeroed().assume_init() };
        let mut iovs: [libc::iovec; BATCH] = std::array::from_fn(|_| libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        });
        // SAFETY: plain old data; all zeroes is valid.
        let mut msgs: [libc::mmsghdr; BATCH] =
            unsafe { MaybeUninit::<[libc::mmsghdr; BATCH]>::zeroed().assume_init() };
        for (i, (bytes, to)) in chunk.iter().enumerate() {
            iovs[i].iov_base = bytes.as_ptr().cast_mut().cast();
            iovs[i].iov_len = bytes.len();
            msgs[i].msg_hdr.msg_namelen = to_sockaddr(to, &mut addrs[i]);
            msgs[i].msg_hdr.msg_name = (&raw mut addrs[i]).cast();
            msgs[i].msg_hdr.msg_iov = &raw mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: the pointers in `msgs` point into `chunk`, `addrs` and `iovs`, which outlive
        // the call; the kernel only reads the iovec buffers.
        let n =
            unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), chunk.len() as _, libc::MSG_DONTWAIT) };
        if n <= 0 {
            // Would block or failed: skip the datagram at fault and carry on with the rest.
            let err = io::Error::last_os_error();
            if n < 0 && err.kind() == io::ErrorKind::WouldBlock {
                return sent;
            }
            sent += 1;
            continue;
        }
        sent += n as usize;
    }
    sent
}

/// Sends the datagrams `out` on the connected non-blocking socket `fd` with as few `sendmmsg`
/// calls as the kernel allows; returns, per datagram, `None` when sent or the error it met.
pub(crate) fn send_connected(fd: RawFd, out: &[(*const u8, usize)]) -> Vec<Option<io::Error>> {
    let mut result: Vec<Option<io::Error>> = Vec::with_capacity(out.len());
    while result.len() < out.len() {
        let start = result.len();
        let chunk = &out[start..out.len().min(start + BATCH)];
        let mut iovs: [libc::iovec; BATCH] = std::array::from_fn(|_| libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        });
        // SAFETY: plain old data; all zeroes is valid.
        let mut msgs: [libc::mmsghdr; BATCH] =
            unsafe { MaybeUninit::<[libc::mmsghdr; BATCH]>::zeroed().assume_init() };
        for (i, &(ptr, len)) in chunk.iter().enumerate() {
            iovs[i].iov_base = ptr.cast_mut().cast();
            iovs[i].iov_len = len;
            msgs[i].msg_hdr.msg_iov = &raw mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: the caller's pointers are live buffers of the given lengths for the call;
        // `msgs` points into `iovs`, which outlives it; the kernel only reads the buffers.
        let n =
            unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), chunk.len() as _, libc::MSG_DONTWAIT) };
        if n <= 0 {
            // The first datagram of the chunk failed: note why, carry on with the rest.
            result.push(Some(if n < 0 {
                io::Error::last_os_error()
            } else {
                io::ErrorKind::WriteZero.into()
            }));
            continue;
        }
        result.extend((0..n).map(|_| None));
    }
    result
}

/// An answer for a UDP client, sent by whoever completes the query.
pub(crate) struct ClientReply {
    pub sock: Arc<UdpSocket>,
    pub bytes: Vec<u8>,
    pub to: SocketAddr,
}

/// Sends client answers, batched per listening socket.
pub(crate) async fn send_client_replies(replies: Vec<ClientReply>) {
    let mut batch: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    let mut sock: Option<Arc<UdpSocket>> = None;
    for r in replies {
        if sock.as_ref().is_some_and(|s| !Arc::ptr_eq(s, &r.sock))
            && let Some(s) = sock.take()
        {
            send_batch(&s, &mut batch).await;
        }
        sock.get_or_insert(r.sock);
        batch.push((r.bytes, r.to));
    }
    if let Some(s) = sock {
        send_batch(&s, &mut batch).await;
    }
}

/// Sends `out` on `sock` with `sendmmsg`, waiting for the socket only when it is full.
pub(crate) async fn send_batch(sock: &UdpSocket, out: &mut Vec<(Vec<u8>, SocketAddr)>) {
    let sent = send_all(sock.as_raw_fd(), out);
    for (b, to) in &out[sent..] {
        let _ = sock.send_to(b, *to).await;
    }
    out.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_v4_and_v6() {
        for local in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(rx) = std::net::UdpSocket::bind(local) else {
                continue; // no IPv6 here
            };
            rx.set_nonblocking(true).unwrap();
            let tx = std::net::UdpSocket::bind(local).unwrap();
            tx.set_nonblocking(true).unwrap();
            let to = rx.local_addr().unwrap();
            let out: Vec<(Vec<u8>, SocketAddr)> = (0..40u8)
                .map(|i| (vec![i; usize::from(i) + 1], to))
                .collect();
            assert_eq!(send_all(tx.as_raw_fd(), &out), 40);
            let mut batch = RecvBatch::new().unwrap();
            let mut got = Vec::new();
            loop {
                match batch.recv(rx.as_raw_fd()) {
                    Ok(n) => {
                        for i in 0..n {
                            let (bytes, from, truncated) = batch.get(i);
                            assert_eq!(from, Some(tx.local_addr().unwrap()));
                            got.push((bytes.to_vec(), truncated));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(got.len(), 40);
            for (i, (bytes, truncated)) in got.iter().enumerate() {
                assert_eq!(bytes, &vec![i as u8; i + 1]);
                assert!(!truncated);
            }
        }
    }
}
