//! Accepting gRPC C-core's `:authority` on the xDS socket.
//!
//! For a `unix:///path` target, C-core (grpcio, gRPC C++) sends the socket path, percent-encoded,
//! as `:authority` (`etc%2Fistio%2Fproxy%2FXDS`). That is no valid URI authority, and the HTTP/2
//! server resets such a stream (`malformed authority`) before any handler runs. Istio's agent
//! (Go's HTTP/2 server) accepts it, so proxyless gRPC clients work there.
//!
//! [`FixAuthority`] wraps each accepted connection and rewrites the client's header blocks on the
//! way in: every block is decoded ([`super::hpack`]) and re-encoded as literals without indexing
//! (so the server's dynamic table never depends on the client's), and an `:authority` that is not
//! a valid authority becomes `localhost` (what grpc-go sends for Unix sockets). Every other frame
//! passes through byte for byte; the server's writes are not touched.
//!
//! A block whose decoded header list passes [`hpack::MAX_HEADER_LIST`] (an HPACK bomb: one
//! dynamic-table entry referenced thousands of times) is decoded only up to the cap and goes on
//! as one field just over the server's own cap (the same size), so the server refuses that
//! stream as h2 does any oversized block: `431` and `RST_STREAM(REFUSED_STREAM)`. The
//! connection, and Envoy's other streams on it, go on.

use super::hpack;
use bytes::{Buf, BytesMut};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const FRAME_HEAD: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// `SETTINGS_MAX_FRAME_SIZE`'s default, which the server keeps: rewritten blocks are split into
/// frames no larger.
const MAX_FRAME: usize = 16_384;
/// Largest header block buffered (the server's own header list limit is smaller).
const MAX_BLOCK: usize = 1 << 20;
/// What an invalid `:authority` becomes.
const REPLACEMENT: &[u8] = b"localhost";

enum State {
    /// Client connection preface bytes still to pass.
    Preface(usize),
    /// At a frame boundary.
    Head,
    /// Payload bytes of a non-header frame still to pass.
    Pass(usize),
}

/// A header block being collected (HEADERS then CONTINUATION frames up to END_HEADERS).
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// A connection whose inbound header blocks are rewritten (see the module docs).
pub struct FixAuthority<S> {
    inner: S,
    raw: BytesMut,
    out: BytesMut,
    state: State,
    block: Option<Block>,
    decoder: hpack::Decoder,
    eof: bool,
    /// An oversized block was already logged on this connection.
    warned: bool,
}

impl<S> FixAuthority<S> {
    pub fn new(inner: S) -> Self {
        FixAuthority {
            inner,
            raw: BytesMut::new(),
            out: BytesMut::new(),
            state: State::Preface(PREFACE_LEN),
            block: None,
            decoder: hpack::Decoder::default(),
            eof: false,
            warned: false,
        }
    }

    /// Moves everything complete from `raw` to `out`.
    fn process(&mut self) -> io::Result<()> {
        loop {
            match self.state {
                State::Preface(n) | State::Pass(n) => {
                    let take = n.min(self.raw.len());
                    self.out.extend_from_slice(&self.raw.split_to(take));
                    let left = n - take;
                    self.state = match self.state {
                        _ if left == 0 => State::Head,
                        State::Preface(_) => State::Preface(left),
                        _ => State::Pass(left),
                    };
                    if left > 0 {
                        return Ok(());
                    }
                }
                State::Head => {
                    let Some(head) = self.raw.get(..FRAME_HEAD) else {
                        return Ok(());
                    };
                    let len = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let (kind, flags) = (head[3], head[4]);
                    let stream =
                        u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                    let is_block = kind == HEADERS
                        || (kind == CONTINUATION
                            && self.block.as_ref().is_some_and(|b| b.stream == stream));
                    if !is_block {
                        self.out.extend_from_slice(&self.raw.split_to(FRAME_HEAD));
                        self.state = State::Pass(len);
                        continue;
                    }
                    if len > MAX_BLOCK {
                        return Err(invalid("header frame larger than 1 MiB"));
                    }
                    if self.raw.len() < FRAME_HEAD + len {
                        return Ok(());
                    }
                    self.raw.advance(FRAME_HEAD);
                    let payload = self.raw.split_to(len);
                    self.collect(kind, flags, stream, &payload)?;
                }
            }
        }
    }

    fn collect(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> io::Result<()> {
        if kind == HEADERS {
            let mut body = payload;
            if flags & PADDED != 0 {
                let pad = usize::from(*body.first().ok_or_else(|| invalid("empty padded"))?);
                body = body
                    .get(1..body.len().saturating_sub(pad))
                    .filter(|_| pad < payload.len())
                    .ok_or_else(|| invalid("padding longer than the HEADERS frame"))?;
            }
            let mut priority = None;
            if flags & PRIORITY != 0 {
                let p = body
                    .get(..5)
                    .ok_or_else(|| invalid("HEADERS priority truncated"))?;
                priority = Some([p[0], p[1], p[2], p[3], p[4]]);
                body = &body[5..];
            }
            self.block = Some(Block {
                stream,
                end_stream: flags & END_STREAM != 0,
                priority,
                fragment: body.to_vec(),
            });
        } else if let Some(block) = &mut self.block {
            block.fragment.extend_from_slice(payload);
        }
        let too_big = self
            .block
            .as_ref()
            .is_some_and(|b| b.fragment.len() > MAX_BLOCK);
        if too_big {
            return Err(invalid("header block larger than 1 MiB"));
        }
        if flags & END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.emit(block)?;
        }
        Ok(())
    }

    fn emit(&mut self, block: Block) -> io::Result<()> {
        let decoded = self
            .decoder
            .decode(&block.fragment)
            .map_err(|e| invalid(&e.to_string()))?;
        let mut fields = match decoded {
            hpack::Block::Fields(f) => f,
            hpack::Block::TooLarge => {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!(
                        stream = block.stream,
                        limit = hpack::MAX_HEADER_LIST,
                        "xDS client sent a header list over the limit (an HPACK bomb?); \
                         its stream is refused (431)"
                    );
                }
                vec![too_large_field()]
            }
        };
        for f in fields.iter_mut().filter(|f| f.name == b":authority") {
            if http::uri::Authority::try_from(f.value.as_slice()).is_err() {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(&f.value),
                    "xDS client sent an invalid :authority (gRPC C-core's Unix socket path); \
                     serving it as localhost"
                );
                f.value = REPLACEMENT.to_vec();
            }
        }
        let encoded = hpack::encode(&fields);
        let prefix = block.priority.map(|p| p.to_vec()).unwrap_or_default();
        let mut chunks = encoded.chunks(MAX_FRAME - prefix.len()).peekable();
        let mut first = true;
        loop {
            let chunk = chunks.next().unwrap_or_default();
            let last = chunks.peek().is_none();
            let mut flags = if last { END_HEADERS } else { 0 };
            let (kind, extra) = if first {
                if block.end_stream {
                    flags |= END_STREAM;
                }
                if block.priority.is_some() {
                    flags |= PRIORITY;
                }
                (HEADERS, prefix.as_slice())
            } else {
                (CONTINUATION, &[][..])
            };
            let len = (extra.len() + chunk.len()).to_be_bytes();
            self.out.extend_from_slice(&len[len.len() - 3..]);
            self.out.extend_from_slice(&[kind, flags]);
            self.out.extend_from_slice(&block.stream.to_be_bytes());
            self.out.extend_from_slice(extra);
            self.out.extend_from_slice(chunk);
            first = false;
            if last {
                return Ok(());
            }
        }
    }
}

/// The one field an oversized block becomes: exactly the server's header list limit, which
/// its HTTP/2 layer refuses (h2 counts a list at the limit as over it).
fn too_large_field() -> hpack::Field {
    const NAME: &[u8] = b"x-istio-agent-header-list-too-large";
    hpack::Field {
        name: NAME.to_vec(),
        value: vec![b'x'; hpack::MAX_HEADER_LIST - NAME.len() - 32],
        sensitive: false,
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("xDS client's HTTP/2: {what}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for FixAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut tmp = [0u8; 8192];
            let mut read = ReadBuf::new(&mut tmp);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // A partial frame at EOF goes on as it is: the server reports it.
                this.eof = true;
                let rest = this.raw.split();
                this.out.extend_from_slice(&rest);
                continue;
            }
            this.raw.extend_from_slice(read.filled());
            this.process()?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FixAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for FixAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Fuzzing: a client's connection bytes through the rewriter in one go. Whatever they are, it
/// must not panic, and every header block the server then reads is ours: literals that decode
/// with an empty table, within [`hpack::MAX_HEADER_LIST`].
#[cfg(any(test, feature = "fuzzing"))]
pub fn fuzz_rewrite(input: &[u8]) {
    let mut conn = FixAuthority::new(());
    conn.raw.extend_from_slice(input);
    if conn.process().is_err() || conn.out.len() < PREFACE_LEN {
        return;
    }
    let mut rest = &conn.out[PREFACE_LEN..];
    let mut block = Vec::new();
    while let Some(head) = rest.get(..FRAME_HEAD) {
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        // A frame cut short at the end of the input passes as it is.
        let Some(payload) = rest.get(FRAME_HEAD..FRAME_HEAD + len) else {
            return;
        };
        if kind == HEADERS || (kind == CONTINUATION && !block.is_empty()) {
            let skip = if kind == HEADERS && flags & PRIORITY != 0 {
                5
            } else {
                0
            };
            block.extend_from_slice(&payload[skip..]);
            if flags & END_HEADERS != 0 {
                match hpack::Decoder::default().decode(&block) {
                    Ok(hpack::Block::Fields(_)) => {}
                    other => panic!("the server would read a block that decodes to {other:?}"),
                }
                block.clear();
            }
        }
        rest = &rest[FRAME_HEAD + len..];
    }
}

/// Wraps every accepted connection of `incoming`.
pub fn fix<S, E>(
    incoming: impl futures::Stream<Item = Result<S, E>>,
) -> impl futures::Stream<Item = Result<FixAuthority<S>, E>> {
    use futures::StreamExt;
    incoming.map(|conn| conn.map(FixAuthority::new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len().to_be_bytes();
        let mut f = len[len.len() - 3..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn field(name: &str, value: &str) -> hpack::Field {
        hpack::Field {
            name: name.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            sensitive: false,
        }
    }

    /// Feeds `input` through the adapter in `step`-byte writes; returns what the server reads.
    async fn rewrite(input: Vec<u8>, step: usize) -> io::Result<Vec<u8>> {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let writer = tokio::spawn(async move {
            for chunk in input.chunks(step) {
                client.write_all(chunk).await.expect("write");
            }
        });
        let mut fixed = FixAuthority::new(server);
        let mut out = Vec::new();
        let res = fixed.read_to_end(&mut out).await;
        writer.await.expect("writer");
        res.map(|_| out)
    }

    /// Splits the server's view into frames: (kind, flags, stream, payload).
    fn frames(mut b: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while b.len() >= FRAME_HEAD {
            let len = usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]);
            let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]);
            out.push((b[3], b[4], stream, b[9..9 + len].to_vec()));
            b = &b[9 + len..];
        }
        out
    }

    #[tokio::test]
    async fn c_core_authority_becomes_localhost_and_other_frames_pass() {
        // C-core's HEADERS: :authority (static name 1) with incremental indexing, so the second
        // request refers to it through the dynamic table (index 62).
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.push(0x41); // literal, incremental indexing, name = static 1 (:authority)
        let authority = b"tmp%2Fx%2Fetc%2Fistio%2Fproxy%2FXDS";
        block.push(authority.len() as u8);
        block.extend_from_slice(authority);
        let settings = frame(0x4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]);
        let data = frame(0x0, END_STREAM, 1, b"grpc message");
        let (first, rest) = block.split_at(4);
        let mut input = PREFACE.to_vec();
        input.extend(settings.clone());
        input.extend(frame(
            HEADERS,
            PADDED,
            1,
            &[[2].as_slice(), first, &[0, 0]].concat(),
        ));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, rest));
        input.extend(data.clone());
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &[0x83, 0xbe]));
        for step in [1, 7, 4096] {
            let out = rewrite(input.clone(), step).await.expect("rewrite");
            assert_eq!(&out[..24], PREFACE);
            let got = frames(&out[24..]);
            assert_eq!(got.len(), 4, "{got:?}");
            assert_eq!(got[0].3, settings[9..], "SETTINGS passes as it is");
            assert_eq!(got[2].3, data[9..], "DATA passes as it is");
            for (i, stream, flags) in [(1, 1, END_HEADERS), (3, 3, END_HEADERS | END_STREAM)] {
                let (kind, f, s, payload) = &got[i];
                assert_eq!((*kind, *f, *s), (HEADERS, flags, stream));
                let fields = decoded(payload);
                let want = if i == 1 {
                    vec![
                        field(":method", "POST"),
                        field(":scheme", "http"),
                        field(":authority", "localhost"),
                    ]
                } else {
                    vec![field(":method", "POST"), field(":authority", "localhost")]
                };
                assert_eq!(fields, want);
            }
        }
    }

    fn decoded(block: &[u8]) -> Vec<hpack::Field> {
        match hpack::Decoder::default().decode(block).expect("decode") {
            hpack::Block::Fields(f) => f,
            hpack::Block::TooLarge => panic!("over the cap"),
        }
    }

    #[tokio::test]
    async fn valid_authority_is_kept_and_big_lists_up_to_the_cap_pass() {
        let big = "v".repeat(16_000);
        let mut block = vec![0x83];
        block.extend(hpack::encode(&[
            field(":authority", "localhost:15010"),
            field("x-big", &big),
        ]));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let out = rewrite(input, 1000).await.expect("rewrite");
        let got = frames(&out[24..]);
        assert!(got.iter().all(|f| f.3.len() <= MAX_FRAME));
        assert_eq!(got.last().map(|f| f.1), Some(END_HEADERS));
        let joined: Vec<u8> = got.iter().flat_map(|f| f.3.clone()).collect();
        let fields = decoded(&joined);
        assert_eq!(fields[1], field(":authority", "localhost:15010"));
        assert_eq!(fields[2].value.len(), big.len());
    }

    #[tokio::test]
    async fn an_oversized_list_becomes_one_field_at_the_servers_limit() {
        let big = "v".repeat(3 * MAX_FRAME);
        let mut block = vec![0x83];
        block.extend(hpack::encode(&[field("x-big", &big)]));
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM | PRIORITY,
            1,
            &[[0, 0, 0, 0, 16].as_slice(), &block].concat(),
        ));
        let out = rewrite(input, 1000).await.expect("rewrite");
        let got = frames(&out[24..]);
        assert!(got.iter().all(|f| f.3.len() <= MAX_FRAME));
        assert_eq!(
            (got[0].0, got[0].1),
            (HEADERS, END_HEADERS | END_STREAM | PRIORITY)
        );
        let fields = decoded(&got[0].3[5..]);
        assert_eq!(fields, vec![too_large_field()]);
        let size: usize = fields
            .iter()
            .map(|f| f.name.len() + f.value.len() + 32)
            .sum();
        assert_eq!(
            size,
            hpack::MAX_HEADER_LIST,
            "h2 refuses a list at its limit"
        );
    }

    /// The fuzz target's invariant holds on its seeds (fuzz/corpus/xds_hpack).
    #[test]
    fn the_fuzz_seeds_hold_the_invariant() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/xds_hpack");
        let mut seeds = 0;
        for entry in std::fs::read_dir(dir).expect("seed corpus") {
            fuzz_rewrite(&std::fs::read(entry.expect("seed").path()).expect("read"));
            seeds += 1;
        }
        assert!(seeds >= 2);
    }

    #[tokio::test]
    async fn undecodable_block_is_an_error() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0xbf]));
        let err = rewrite(input, 64).await.expect_err("bad HPACK");
        assert!(err.to_string().contains("HPACK"), "{err}");
    }
}
