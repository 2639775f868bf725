//! Just enough HPACK (RFC 7541) for [`super::authority`]: a decoder for the client's header
//! blocks (static and dynamic tables, Huffman strings) and an encoder that writes every field as
//! a literal without indexing, so the server's dynamic table stays empty and the rewritten
//! stream never depends on the client's table.

use std::collections::VecDeque;

/// The default (and our maximum) dynamic table size: `SETTINGS_HEADER_TABLE_SIZE`'s default,
/// which the agent's HTTP/2 server never changes.
pub(super) const TABLE_SIZE: usize = 4096;

/// Why a header block could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum Error {
    #[error("HPACK: header block ends inside a field")]
    Truncated,
    #[error("HPACK: integer overflows")]
    Overflow,
    #[error("HPACK: index {0} is not in the static or dynamic table")]
    BadIndex(usize),
    #[error("HPACK: dynamic table size update {0} exceeds {TABLE_SIZE}")]
    BadSizeUpdate(usize),
    #[error("HPACK: invalid Huffman string")]
    BadHuffman,
}

/// One decoded field; `sensitive` is the "never indexed" representation, kept when re-encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Field {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    pub sensitive: bool,
}

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// Huffman code lengths of symbols 0..=255 (RFC 7541 Appendix B); EOS (256) is 30 bits. The
/// code is canonical, so the lengths alone define it.
const CODE_LENGTHS: [u8; 256] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
];

/// The canonical code as decoding tables: for each length, the first code and where its
/// symbols start in `symbols` (sorted by length, then value).
struct Canonical {
    first: [u32; 31],
    count: [u32; 31],
    offset: [usize; 31],
    symbols: Vec<u16>,
}

fn canonical() -> &'static Canonical {
    static TABLE: std::sync::OnceLock<Canonical> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let len = |s: u16| CODE_LENGTHS.get(usize::from(s)).copied().unwrap_or(30);
        let mut symbols: Vec<u16> = (0..=256).collect();
        symbols.sort_by_key(|&s| (len(s), s));
        let mut t = Canonical {
            first: [0; 31],
            count: [0; 31],
            offset: [0; 31],
            symbols,
        };
        let (mut code, mut prev) = (0u32, 0u8);
        for (i, &s) in t.symbols.iter().enumerate() {
            let l = len(s);
            if i > 0 {
                code = (code + 1) << (l - prev);
            }
            if t.count[usize::from(l)] == 0 {
                t.first[usize::from(l)] = code;
                t.offset[usize::from(l)] = i;
            }
            t.count[usize::from(l)] += 1;
            prev = l;
        }
        t
    })
}

fn huffman_decode(src: &[u8]) -> Result<Vec<u8>, Error> {
    let t = canonical();
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let (mut code, mut len, mut all_ones) = (0u32, 0usize, true);
    for byte in src {
        for bit in (0..8).rev() {
            let b = u32::from((byte >> bit) & 1);
            code = (code << 1) | b;
            all_ones &= b == 1;
            len += 1;
            if len > 30 {
                return Err(Error::BadHuffman);
            }
            if t.count[len] > 0 && code >= t.first[len] && code - t.first[len] < t.count[len] {
                let sym = t.symbols[t.offset[len] + (code - t.first[len]) as usize];
                // EOS inside a string is an error (RFC 7541 section 5.2).
                let sym = u8::try_from(sym).map_err(|_| Error::BadHuffman)?;
                out.push(sym);
                (code, len, all_ones) = (0, 0, true);
            }
        }
    }
    // Padding: at most 7 bits, all ones (the EOS prefix).
    if len > 7 || !all_ones {
        return Err(Error::BadHuffman);
    }
    Ok(out)
}

/// Reads an integer with an `n`-bit prefix at `src[*pos]`.
fn integer(src: &[u8], pos: &mut usize, n: u32) -> Result<usize, Error> {
    let max = (1usize << n) - 1;
    let first = *src.get(*pos).ok_or(Error::Truncated)?;
    *pos += 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let b = *src.get(*pos).ok_or(Error::Truncated)?;
        *pos += 1;
        if shift > 28 {
            return Err(Error::Overflow);
        }
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

fn string(src: &[u8], pos: &mut usize) -> Result<Vec<u8>, Error> {
    let huffman = src.get(*pos).ok_or(Error::Truncated)? & 0x80 != 0;
    let len = integer(src, pos, 7)?;
    let end = pos.checked_add(len).ok_or(Error::Overflow)?;
    let raw = src.get(*pos..end).ok_or(Error::Truncated)?;
    *pos = end;
    if huffman {
        huffman_decode(raw)
    } else {
        Ok(raw.to_vec())
    }
}

/// The client's header compression state (one per connection).
pub(super) struct Decoder {
    /// Newest first.
    dynamic: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            dynamic: VecDeque::new(),
            size: 0,
            max: TABLE_SIZE,
        }
    }
}

impl Decoder {
    fn get(&self, index: usize) -> Result<(Vec<u8>, Vec<u8>), Error> {
        match index {
            0 => Err(Error::BadIndex(0)),
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            }
            _ => self
                .dynamic
                .get(index - 62)
                .cloned()
                .ok_or(Error::BadIndex(index)),
        }
    }

    fn evict(&mut self) {
        while self.size > self.max {
            match self.dynamic.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        self.size += name.len() + value.len() + 32;
        self.dynamic.push_front((name, value));
        self.evict();
    }

    /// Decodes one complete header block.
    pub(super) fn decode(&mut self, src: &[u8]) -> Result<Vec<Field>, Error> {
        let mut pos = 0;
        let mut fields = Vec::new();
        while let Some(&b) = src.get(pos) {
            if b & 0x80 != 0 {
                let (name, value) = self.get(integer(src, &mut pos, 7)?)?;
                fields.push(Field {
                    name,
                    value,
                    sensitive: false,
                });
            } else if b & 0xe0 == 0x20 {
                let size = integer(src, &mut pos, 5)?;
                if size > TABLE_SIZE {
                    return Err(Error::BadSizeUpdate(size));
                }
                self.max = size;
                self.evict();
            } else {
                // 01: incremental indexing (6-bit index); 0001: never indexed; 0000: without
                // indexing (both 4-bit).
                let (indexing, prefix) = if b & 0x40 != 0 { (true, 6) } else { (false, 4) };
                let index = integer(src, &mut pos, prefix)?;
                let name = if index == 0 {
                    string(src, &mut pos)?
                } else {
                    self.get(index)?.0
                };
                let value = string(src, &mut pos)?;
                if indexing {
                    self.insert(name.clone(), value.clone());
                }
                fields.push(Field {
                    name,
                    value,
                    sensitive: b & 0xf0 == 0x10,
                });
            }
        }
        Ok(fields)
    }
}

fn put_integer(dst: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        dst.push(first | value as u8);
        return;
    }
    dst.push(first | max as u8);
    value -= max;
    while value >= 0x80 {
        dst.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    dst.push(value as u8);
}

fn put_string(dst: &mut Vec<u8>, s: &[u8]) {
    put_integer(dst, 0, 7, s.len());
    dst.extend_from_slice(s);
}

/// Encodes `fields` as literals without indexing (never indexed when sensitive), names and
/// values as plain strings.
pub(super) fn encode(fields: &[Field]) -> Vec<u8> {
    let mut dst = Vec::new();
    for f in fields {
        dst.push(if f.sensitive { 0x10 } else { 0x00 });
        put_string(&mut dst, &f.name);
        put_string(&mut dst, &f.value);
    }
    dst
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn pairs(fields: &[Field]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                )
            })
            .collect()
    }

    fn want(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// RFC 7541 C.3 (plain) and C.4 (Huffman): three requests on one connection.
    #[test]
    fn rfc_7541_request_examples() {
        for blocks in [
            [
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ],
            [
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ],
        ] {
            let mut d = Decoder::default();
            let first = d.decode(&hex(blocks[0])).expect("first");
            assert_eq!(
                pairs(&first),
                want(&[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    (":authority", "www.example.com"),
                ])
            );
            let second = d.decode(&hex(blocks[1])).expect("second");
            assert_eq!(second[3].value, b"www.example.com", "dynamic table entry");
            assert_eq!(second[4].value, b"no-cache");
            let third = d.decode(&hex(blocks[2])).expect("third");
            assert_eq!(
                pairs(&third),
                want(&[
                    (":method", "GET"),
                    (":scheme", "https"),
                    (":path", "/index.html"),
                    (":authority", "www.example.com"),
                    ("custom-key", "custom-value"),
                ])
            );
            assert_eq!(d.size, 164, "RFC's table size after the third request");
        }
    }

    #[test]
    fn encoded_fields_decode_back_and_leave_no_table_state() {
        let fields = vec![
            Field {
                name: b":authority".to_vec(),
                value: vec![b'a'; 300],
                sensitive: false,
            },
            Field {
                name: b"authorization".to_vec(),
                value: b"Bearer x".to_vec(),
                sensitive: true,
            },
        ];
        let mut d = Decoder::default();
        assert_eq!(d.decode(&encode(&fields)).expect("decode"), fields);
        assert!(d.dynamic.is_empty());
    }

    #[test]
    fn bad_blocks_are_errors_not_panics() {
        let mut d = Decoder::default();
        assert_eq!(d.decode(&[0xff]), Err(Error::Truncated));
        assert_eq!(d.decode(&[0xbf]), Err(Error::BadIndex(63)));
        assert_eq!(d.decode(&[0x80]), Err(Error::BadIndex(0)));
        assert_eq!(
            d.decode(&[0x3f, 0xe2, 0x1f]),
            Err(Error::BadSizeUpdate(4097))
        );
        assert_eq!(d.decode(&[0x00, 0x81, 0x00, 0x00]), Err(Error::BadHuffman));
        assert_eq!(
            d.decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(Error::Overflow)
        );
    }
}
