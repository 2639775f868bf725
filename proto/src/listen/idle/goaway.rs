//! Closing an HTTP/2 connection the way a server means it: a GOAWAY frame (`NO_ERROR`, the last
//! stream the server took), the write side shut, then the peer's bytes read and dropped until
//! it closes too (or [`CLOSE_GRACE`] passes), so no reset destroys the GOAWAY in flight.
//! A client that raced a request onto the connection sees it refused as unprocessed (above the
//! last stream id): retryable on a new connection, where a bare close left it guessing.
//!
//! [`Watched`](super::Watched) sits below hyper, so it follows the frames both ways to know
//! where a GOAWAY may go: only between two of the server's frames, and naming the highest
//! stream the client opened (its HEADERS), which the server may have handled.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a closing connection waits for the peer to close after the GOAWAY.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const GOAWAY: u8 = 0x7;

/// Follows a byte stream of HTTP/2 frames (after an optional preface).
#[derive(Debug, Clone)]
pub(super) struct Frames {
    /// Preface bytes still to skip.
    preface: usize,
    header: [u8; FRAME_HEADER],
    header_len: usize,
    payload_left: usize,
    /// The highest stream id of a HEADERS frame seen.
    pub(super) last_headers: u32,
}

impl Frames {
    /// The client's bytes: the preface, then frames.
    pub(super) fn from_client() -> Self {
        Frames::with_preface(PREFACE_LEN)
    }

    /// The server's bytes: frames from the first byte.
    pub(super) fn from_server() -> Self {
        Frames::with_preface(0)
    }

    fn with_preface(preface: usize) -> Self {
        Frames {
            preface,
            header: [0; FRAME_HEADER],
            header_len: 0,
            payload_left: 0,
            last_headers: 0,
        }
    }

    /// Between two frames (no frame begun and not finished).
    pub(super) fn at_boundary(&self) -> bool {
        self.preface == 0 && self.header_len == 0 && self.payload_left == 0
    }

    pub(super) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                bytes = &bytes[n..];
            } else if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                bytes = &bytes[n..];
            } else {
                let n = (FRAME_HEADER - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
                self.header_len += n;
                bytes = &bytes[n..];
                if self.header_len == FRAME_HEADER {
                    let h = &self.header;
                    self.payload_left =
                        usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    if h[3] == HEADERS {
                        self.last_headers = self.last_headers.max(id);
                    }
                    self.header_len = 0;
                }
            }
        }
    }
}

/// GOAWAY with `NO_ERROR` naming `last_stream`.
pub(super) fn goaway_frame(last_stream: u32) -> [u8; 17] {
    let mut f = [0u8; 17];
    f[2] = 8;
    f[3] = GOAWAY;
    f[9..13].copy_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    f
}

/// Where a closing connection is.
#[derive(Debug)]
pub(super) enum Closing {
    /// The GOAWAY frame, `sent` bytes of it written.
    Goaway { frame: [u8; 17], sent: usize },
    /// Shutting the write side.
    Shutdown,
    /// Reading and dropping the peer's bytes until it closes or the grace ends.
    Draining,
    /// Done: reads and writes fail.
    Closed,
}

impl Closing {
    /// Drives the close on `io` as far as it goes now; `grace` fires the end of the drain
    /// (reset when the drain begins). Ready once closed.
    pub(super) fn poll<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        grace: &mut Pin<Box<tokio::time::Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        loop {
            match self {
                Closing::Goaway { frame, sent } => {
                    match Pin::new(&mut *io).poll_write(cx, &frame[*sent..]) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => *self = Closing::Closed,
                        Poll::Ready(Ok(n)) => {
                            *sent += n;
                            if *sent == frame.len() {
                                *self = Closing::Shutdown;
                            }
                        }
                    }
                }
                Closing::Shutdown => match Pin::new(&mut *io).poll_shutdown(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(_) => {
                        grace
                            .as_mut()
                            .reset(tokio::time::Instant::now() + CLOSE_GRACE);
                        *self = Closing::Draining;
                    }
                },
                Closing::Draining => {
                    let mut scratch = [0u8; 1024];
                    let mut buf = ReadBuf::new(&mut scratch);
                    match Pin::new(&mut *io).poll_read(cx, &mut buf) {
                        Poll::Ready(Ok(())) if !buf.filled().is_empty() => continue,
                        Poll::Ready(_) => *self = Closing::Closed,
                        Poll::Pending => {
                            if grace.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            *self = Closing::Closed;
                        }
                    }
                }
                Closing::Closed => return Poll::Ready(()),
            }
        }
    }
}

/// The error reads and writes of a closed connection return.
pub(super) fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "connection closed: no HTTP/2 stream open in time",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_followed_across_any_split() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS (empty), HEADERS stream 1 (3 bytes), DATA stream 1, HEADERS stream 5.
        bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&[0, 0, 3, 1, 4, 0, 0, 0, 1, 0x82, 0x86, 0x84]);
        bytes.extend_from_slice(&[0, 0, 2, 0, 1, 0, 0, 0, 1, b'h', b'i']);
        bytes.extend_from_slice(&[0, 0, 1, 1, 4, 0, 0, 0, 5, 0x82]);
        for split in 1..bytes.len() {
            let mut f = Frames::from_client();
            for chunk in bytes.chunks(split) {
                f.feed(chunk);
            }
            assert!(f.at_boundary(), "split {split}");
            assert_eq!(f.last_headers, 5, "split {split}");
        }
        let mut f = Frames::from_client();
        f.feed(&bytes[..bytes.len() - 1]);
        assert!(!f.at_boundary(), "inside the last frame");
    }

    #[test]
    fn goaway_is_no_error_with_the_last_stream() {
        assert_eq!(
            goaway_frame(7),
            [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0]
        );
    }
}
