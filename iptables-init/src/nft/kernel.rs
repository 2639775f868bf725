//! Sending one encoded nf_tables transaction to the kernel over an `AF_NETLINK`
//! `NETLINK_NETFILTER` socket, and reading its verdict.
//!
//! The kernel processes a batch synchronously inside `send`: by the time it returns, every
//! error and the acknowledgement of the last change are queued on the socket. The batch is
//! committed only if no message failed; then the last change is acknowledged with code 0.

// socket(2), setsockopt(2), send(2) and recv(2) on the netlink socket.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NOT_SENT: &str = "nothing was applied";
/// What an error answering the batch begin message is about: the subsystem (not registered),
/// or the commit of the whole transaction.
pub const BATCH: &str = "the nftables transaction";
/// Batches up to this size fit the default socket send buffer.
const SMALL_BATCH: usize = 64 * 1024;

/// Why the kernel did not take the transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "the kernel has no nf_tables (module nf_tables not loaded?): {what} failed with {errno}; nothing was applied"
    )]
    NoNfTables { what: String, errno: String },
    #[error(
        "the kernel refused {what}: {errno}{hint}; nothing was applied (the transaction is atomic)"
    )]
    Refused {
        what: String,
        errno: String,
        hint: &'static str,
    },
    #[error("netlink {what} failed: {errno}; {outcome}")]
    Socket {
        what: &'static str,
        errno: String,
        outcome: &'static str,
    },
    #[error("the kernel did not acknowledge the nftables transaction; its outcome is unknown")]
    NoAck,
}

fn errno_text(code: i32) -> String {
    std::io::Error::from_raw_os_error(code).to_string()
}

/// The error for `errno` returned to change `what` (`None`: the socket itself).
pub fn classify(what: Option<&str>, code: i32) -> Error {
    let errno = errno_text(code);
    match (what, code) {
        (None, libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT | libc::ENOENT) => Error::NoNfTables {
            what: "opening the nfnetlink socket".into(),
            errno,
        },
        // The batch begin names the nf_tables subsystem; EOPNOTSUPP there means the
        // subsystem is not registered (nf_tables not loaded and not loadable).
        (Some(BATCH), libc::EOPNOTSUPP) => Error::NoNfTables {
            what: "the nf_tables batch".into(),
            errno,
        },
        (Some(what), _) => Error::Refused {
            what: what.to_string(),
            hint: match code {
                libc::ENOENT | libc::EOPNOTSUPP if what.starts_with("add chain") => {
                    " (nftables chain type missing: is module nft_chain_nat loaded?)"
                }
                libc::ENOENT | libc::EOPNOTSUPP if what.starts_with("add rule") => {
                    " (an nftables expression is missing in the kernel: modules nft_redir, nft_tproxy, nft_ct, nft_meta?)"
                }
                libc::EPERM => " (needs CAP_NET_ADMIN in the pod's network namespace)",
                _ => "",
            },
            errno,
        },
        (None, _) => Error::Socket {
            what: "socket",
            errno,
            outcome: NOT_SENT,
        },
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Sends `batch` (begin ... end) and checks the answer. `changes` maps each change's sequence
/// number to what it does; `begin_seq` is the batch begin's.
pub fn commit(batch: &[u8], begin_seq: u32, changes: &[(u32, String)]) -> Result<(), Error> {
    // SAFETY: plain socket(2) call; the descriptor is owned right away.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if raw < 0 {
        return Err(classify(None, last_errno()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let one: libc::c_int = 1;
    // SAFETY: `one` outlives the call and its size is passed; errors echo only the header of
    // the failing message (NETLINK_CAP_ACK), which keeps the answers small.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            libc::NETLINK_CAP_ACK,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    if batch.len() > SMALL_BATCH {
        // A datagram larger than the send buffer is refused whole (EMSGSIZE): make room, as
        // root may beyond net.core.wmem_max (SO_SNDBUFFORCE), else as far as the limit allows.
        let size = libc::c_int::try_from(batch.len().saturating_mul(2)).unwrap_or(libc::c_int::MAX);
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
            // SAFETY: `size` outlives the call and its size is passed.
            let set = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&size as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if set == 0 {
                break;
            }
        }
    }
    // SAFETY: `batch` is a valid buffer of `batch.len()` bytes; the unconnected netlink socket
    // sends to the kernel.
    let sent = unsafe { libc::send(fd.as_raw_fd(), batch.as_ptr().cast(), batch.len(), 0) };
    if sent < 0 {
        // The kernel takes a datagram whole or not at all.
        return Err(Error::Socket {
            what: "send",
            errno: errno_text(last_errno()),
            outcome: NOT_SENT,
        });
    }
    let describe = |seq: u32| -> Option<&str> {
        if seq == begin_seq {
            return Some(BATCH);
        }
        changes
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, w)| w.as_str())
    };
    let last = changes.last().map(|(s, _)| *s);
    let mut acked = false;
    let mut first_error = None;
    let mut buf = Vec::with_capacity(crate::netlink::RECV_BUF);
    loop {
        match crate::netlink::recv_into(&fd, &mut buf, libc::MSG_DONTWAIT) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => {
                return Err(Error::Socket {
                    what: "recv",
                    errno: e.to_string(),
                    outcome: "the transaction's outcome is unknown",
                });
            }
        }
        for (seq, code) in errors(&buf) {
            if code == 0 {
                acked |= Some(seq) == last;
            } else if first_error.is_none() {
                first_error = Some(classify(
                    Some(describe(seq).unwrap_or("the nftables transaction")),
                    -code,
                ));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None if acked || last.is_none() => Ok(()),
        None => Err(Error::NoAck),
    }
}

/// The (sequence number of the message answered, error code) of each `NLMSG_ERROR` in `data`.
pub fn errors(data: &[u8]) -> Vec<(u32, i32)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + NLMSG_HDR <= data.len() {
        let len = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap_or_default()) as usize;
        let kind = u16::from_ne_bytes([data[at + 4], data[at + 5]]);
        if len < NLMSG_HDR || at + len > data.len() {
            break;
        }
        // nlmsgerr: error code, then the header of the message it answers (seq at +8).
        if kind == NLMSG_ERROR && len >= NLMSG_HDR + 4 + NLMSG_HDR {
            let body = &data[at + NLMSG_HDR..at + len];
            let code = i32::from_ne_bytes(body[0..4].try_into().unwrap_or_default());
            let seq = u32::from_ne_bytes(body[12..16].try_into().unwrap_or_default());
            out.push((seq, code));
        }
        at += (len + 3) & !3;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nf_tables_is_named() {
        for code in [libc::EPROTONOSUPPORT, libc::ENOENT, libc::EAFNOSUPPORT] {
            let e = classify(None, code).to_string();
            assert!(
                e.contains("the kernel has no nf_tables (module nf_tables not loaded?)")
                    && e.contains("nfnetlink socket"),
                "{e}"
            );
        }
        let e = classify(Some(BATCH), libc::EOPNOTSUPP).to_string();
        assert!(
            e.contains("no nf_tables") && e.contains("nothing was applied"),
            "{e}"
        );
    }

    #[test]
    fn a_refused_change_is_named_with_a_hint() {
        let e = classify(Some("add chain istio-proxy-nat prerouting"), libc::ENOENT).to_string();
        assert!(
            e.contains("refused add chain istio-proxy-nat prerouting")
                && e.contains("No such file or directory")
                && e.contains("nft_chain_nat"),
            "{e}"
        );
        let e = classify(Some("add rule t c redirect to :1"), libc::EPERM).to_string();
        assert!(e.contains("CAP_NET_ADMIN"), "{e}");
        assert!(matches!(classify(None, libc::EMFILE), Error::Socket { .. }));
    }

    #[test]
    fn error_messages_are_read_by_sequence() {
        let mut msg = Vec::new();
        let push = |msg: &mut Vec<u8>, seq: u32, code: i32| {
            msg.extend(36u32.to_ne_bytes());
            msg.extend(NLMSG_ERROR.to_ne_bytes());
            msg.extend(0u16.to_ne_bytes());
            msg.extend(seq.to_ne_bytes());
            msg.extend(0u32.to_ne_bytes());
            msg.extend(code.to_ne_bytes());
            // the answered header: len, type, flags, seq, pid
            msg.extend(16u32.to_ne_bytes());
            msg.extend(0x0a06u16.to_ne_bytes());
            msg.extend(0u16.to_ne_bytes());
            msg.extend(seq.to_ne_bytes());
            msg.extend(0u32.to_ne_bytes());
        };
        push(&mut msg, 5, -libc::ENOENT);
        push(&mut msg, 9, 0);
        assert_eq!(errors(&msg), vec![(5, -libc::ENOENT), (9, 0)]);
        assert!(errors(&msg[..20]).is_empty(), "truncated");
    }
}
