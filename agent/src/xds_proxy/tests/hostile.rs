//! A hostile client on the XDS socket: an HPACK bomb is refused on its stream (431 and
//! RST_STREAM, as h2 refuses any oversized header list), and the connection goes on serving.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::super::hpack;
use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const REFUSED_STREAM: u32 = 0x7;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len().to_be_bytes();
    let mut f = len[len.len() - 3..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A header block as HEADERS and CONTINUATION frames of at most 16 KiB.
fn header_frames(stream: u32, block: &[u8], end_stream: bool) -> Vec<u8> {
    let chunks: Vec<&[u8]> = block.chunks(16_384).collect();
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let mut flags = if i + 1 == chunks.len() {
            END_HEADERS
        } else {
            0
        };
        if i == 0 && end_stream {
            flags |= END_STREAM;
        }
        out.extend(frame(
            if i == 0 { HEADERS } else { CONTINUATION },
            flags,
            stream,
            c,
        ));
    }
    out
}

/// An HPACK integer with a 7-bit prefix (string lengths).
fn put_len(dst: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        dst.push(n as u8);
        return;
    }
    dst.push(127);
    n -= 127;
    while n >= 0x80 {
        dst.push((n & 0x7f) as u8 | 0x80);
        n >>= 7;
    }
    dst.push(n as u8);
}

/// A gRPC request's headers, then one ~4 KiB entry added to the dynamic table and referenced
/// 60,000 times: a 64 KB block that decodes to ~240 MiB.
fn bomb() -> Vec<u8> {
    let mut block = hpack::encode(&request_fields("/unknown.Service/Method"));
    block.push(0x40); // literal with incremental indexing, new name
    put_len(&mut block, 6);
    block.extend_from_slice(b"x-bomb");
    put_len(&mut block, hpack::TABLE_SIZE - 32 - 6);
    block.extend(std::iter::repeat_n(b'b', hpack::TABLE_SIZE - 32 - 6));
    block.extend(std::iter::repeat_n(0xbe, 60_000)); // index 62: that entry
    block
}

fn request_fields(path: &str) -> Vec<hpack::Field> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .into_iter()
    .map(|(n, v)| hpack::Field {
        name: n.as_bytes().to_vec(),
        value: v.as_bytes().to_vec(),
        sensitive: false,
    })
    .collect()
}

/// Reads the server's frames up to the first that `done` accepts; header blocks are decoded.
struct Client {
    conn: UnixStream,
    decoder: hpack::Decoder,
}

/// A frame from the server: (kind, flags, stream, payload or decoded header fields).
type Frame = (u8, u8, u32, Vec<u8>, Vec<hpack::Field>);

impl Client {
    async fn read_frame(&mut self) -> Frame {
        let mut head = [0u8; 9];
        self.conn.read_exact(&mut head).await.expect("frame head");
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        self.conn.read_exact(&mut payload).await.expect("frame");
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
        let mut fields = Vec::new();
        if head[3] == HEADERS {
            match self.decoder.decode(&payload).expect("server's HPACK") {
                hpack::Block::Fields(f) => fields = f,
                hpack::Block::TooLarge => panic!("server sent a huge header block"),
            }
        }
        if head[3] == SETTINGS && head[4] & 0x1 == 0 {
            self.conn
                .write_all(&frame(SETTINGS, 0x1, 0, &[]))
                .await
                .unwrap();
        }
        assert_ne!(
            head[3], GOAWAY,
            "the server closed the connection: {payload:?}"
        );
        (head[3], head[4], stream, payload, fields)
    }

    /// The frames on `stream` until it ends (END_STREAM or RST_STREAM).
    async fn stream_frames(&mut self, stream: u32) -> Vec<Frame> {
        let mut out = Vec::new();
        loop {
            let f = tokio::time::timeout(Duration::from_secs(10), self.read_frame())
                .await
                .expect("the server answers");
            if f.2 != stream {
                continue;
            }
            let end = f.0 == RST_STREAM || (f.0 == HEADERS && f.1 & END_STREAM != 0);
            out.push(f);
            if end {
                return out;
            }
        }
    }
}

fn header<'a>(f: &'a Frame, name: &str) -> Option<&'a [u8]> {
    f.4.iter()
        .find(|h| h.name == name.as_bytes())
        .map(|h| h.value.as_slice())
}

#[tokio::test]
async fn an_hpack_bomb_is_refused_on_its_stream_and_the_connection_serves_on() {
    let connect: Connect = Arc::new(|| {
        Box::pin(async {
            Err(ConnectError::Channel(sds::Error::Channel {
                addr: "istiod".into(),
                reason: "no upstream in this test".into(),
            }))
        })
    });
    let h = proxy(connect, false).await;
    let mut c = Client {
        conn: UnixStream::connect(&h.path).await.unwrap(),
        decoder: hpack::Decoder::default(),
    };
    let bomb = bomb();
    assert!(bomb.len() > 64_000, "{}", bomb.len());
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(header_frames(1, &bomb, true));
    c.conn.write_all(&out).await.unwrap();

    // h2 answers an oversized request 431 and ends the stream (then resets it, REFUSED_STREAM,
    // which `stream_frames` skips from now on).
    let refused = c.stream_frames(1).await;
    let status = refused.iter().find_map(|f| header(f, ":status"));
    assert_eq!(status, Some(&b"431"[..]), "{refused:?}");
    let end = refused.last().expect("frames");
    assert!(
        end.0 == RST_STREAM && end.3 == REFUSED_STREAM.to_be_bytes()
            || end.0 == HEADERS && end.1 & END_STREAM != 0,
        "{refused:?}"
    );

    // The same connection, and its HPACK state, still serve a normal request.
    let block = hpack::encode(&request_fields("/unknown.Service/Method"));
    c.conn
        .write_all(&header_frames(3, &block, true))
        .await
        .unwrap();
    let answered = c.stream_frames(3).await;
    let fields: Vec<_> = answered.iter().filter(|f| f.0 == HEADERS).collect();
    assert_eq!(header(fields[0], ":status"), Some(&b"200"[..]));
    let grpc_status = fields.iter().find_map(|f| header(f, "grpc-status"));
    assert_eq!(grpc_status, Some(&b"12"[..]), "UNIMPLEMENTED: {answered:?}");

    // A request that refers to the bomb's table entry once is within the limit.
    let mut block = hpack::encode(&request_fields("/unknown.Service/Method"));
    block.push(0xbe);
    c.conn
        .write_all(&header_frames(5, &block, true))
        .await
        .unwrap();
    let answered = c.stream_frames(5).await;
    assert_eq!(
        header(&answered[0], ":status"),
        Some(&b"200"[..]),
        "{answered:?}"
    );
}
