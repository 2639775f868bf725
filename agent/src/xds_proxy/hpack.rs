//! Just enough HPACK (RFC 7541) for [`super::authority`]: a decoder for the client's header
//! blocks (static and dynamic tables, Huffman strings) and an encoder that writes every field as
//! a literal without indexing, so the server's dynamic table stays empty and the rewritten
//! stream never depends on the client's table.

use std::collections::VecDeque;

/// The default (and our maximum) dynamic table size: `SETTINGS_HEADER_TABLE_SIZE`'s default,
/// which the agent's HTTP/2 server never changes.
pub(super) const TABLE_SIZE: usize = 4096;

/// The largest decoded header list a block may carry (RFC 7540 section 6.5.2 counts each field
/// as name + value + 32 bytes): 16 KiB, the `SETTINGS_MAX_HEADER_LIST_SIZE` of hyper's (and so
/// tonic's) HTTP/2 server, which the xDS server behind the rewriter keeps. Envoy's own request
/// header limit (`max_request_headers_kb`) is 60 KiB; its gRPC requests to the agent carry
/// well under 1 KiB. Decoding stops collecting at the cap, so a block that references one 4 KiB
/// dynamic-table entry thousands of times (an HPACK bomb) costs no more than the cap.
pub(super) const MAX_HEADER_LIST: usize = 16 << 10;

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

/// A decoded header block.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Block {
    Fields(Vec<Field>),
    /// The decoded list passes [`MAX_HEADER_LIST`]: nothing past the cap was kept (the block was
    /// still read through, so the dynamic table stays in step with the client's).
    TooLarge,
}

/// A field's size in a header list (RFC 7540 section 6.5.2).
fn list_size(name: usize, value: usize) -> usize {
    name.saturating_add(value).saturating_add(32)
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

/// An encoded string: its bytes and whether they are Huffman-coded.
struct Encoded<'a> {
    raw: &'a [u8],
    huffman: bool,
}

impl Encoded<'_> {
    /// The fewest bytes it can decode to (Huffman codes are 5 to 30 bits long).
    fn min_len(&self) -> usize {
        if self.huffman {
            self.raw.len() * 8 / 30
        } else {
            self.raw.len()
        }
    }

    fn decode(&self) -> Result<Vec<u8>, Error> {
        if self.huffman {
            huffman_decode(self.raw)
        } else {
            Ok(self.raw.to_vec())
        }
    }
}

/// Reads a string's head and steps over its bytes (nothing is decoded yet).
fn string<'a>(src: &'a [u8], pos: &mut usize) -> Result<Encoded<'a>, Error> {
    let huffman = src.get(*pos).ok_or(Error::Truncated)? & 0x80 != 0;
    let len = integer(src, pos, 7)?;
    let end = pos.checked_add(len).ok_or(Error::Overflow)?;
    let raw = src.get(*pos..end).ok_or(Error::Truncated)?;
    *pos = end;
    Ok(Encoded { raw, huffman })
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
    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), Error> {
        match index {
            0 => Err(Error::BadIndex(0)),
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Ok((n.as_bytes(), v.as_bytes()))
            }
            _ => self
                .dynamic
                .get(index - 62)
                .map(|(n, v)| (n.as_slice(), v.as_slice()))
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

    /// Decodes one complete header block, keeping at most [`MAX_HEADER_LIST`] of fields.
    pub(super) fn decode(&mut self, src: &[u8]) -> Result<Block, Error> {
        self.decode_capped(src, MAX_HEADER_LIST)
    }

    fn decode_capped(&mut self, src: &[u8], cap: usize) -> Result<Block, Error> {
        let mut pos = 0;
        let mut list = List {
            fields: Vec::new(),
            size: Some(0),
            cap,
        };
        while let Some(&b) = src.get(pos) {
            if b & 0x80 != 0 {
                let (name, value) = self.get(integer(src, &mut pos, 7)?)?;
                if list.admit(name.len(), value.len()) {
                    list.fields.push(Field {
                        name: name.to_vec(),
                        value: value.to_vec(),
                        sensitive: false,
                    });
                }
            } else if b & 0xe0 == 0x20 {
                let size = integer(src, &mut pos, 5)?;
                if size > TABLE_SIZE {
                    return Err(Error::BadSizeUpdate(size));
                }
                self.max = size;
                self.evict();
            } else {
                self.literal(src, &mut pos, b, &mut list)?;
            }
        }
        Ok(match list.size {
            Some(_) => Block::Fields(list.fields),
            None => Block::TooLarge,
        })
    }

    /// A literal field whose first byte `b` is at `pos`: 01 with incremental indexing (6-bit
    /// index); 0001 never indexed, 0000 without indexing (both 4-bit).
    fn literal(
        &mut self,
        src: &[u8],
        pos: &mut usize,
        b: u8,
        list: &mut List,
    ) -> Result<(), Error> {
        let (indexing, prefix) = if b & 0x40 != 0 { (true, 6) } else { (false, 4) };
        let index = integer(src, pos, prefix)?;
        // A literal name (`Err`) or a table index (`Ok`), nothing copied yet.
        let name = if index == 0 {
            Err(string(src, pos)?)
        } else {
            Ok(index)
        };
        let value = string(src, pos)?;
        let name_min = match &name {
            Err(e) => e.min_len(),
            Ok(i) => self.get(*i)?.0.len(),
        };
        let kept = list
            .size
            .is_some_and(|s| s.saturating_add(list_size(name_min, value.min_len())) <= list.cap);
        // Strings are decoded only when the field can still be kept, or the table
        // needs them; an entry larger than the table empties it (RFC 7541 section
        // 4.4) whatever its bytes.
        let table_needs = indexing && list_size(name_min, value.min_len()) <= self.max;
        if !(kept || table_needs) {
            list.size = None;
            if indexing {
                self.dynamic.clear();
                self.size = 0;
            }
            return Ok(());
        }
        let name = match name {
            Ok(i) => self.get(i)?.0.to_vec(),
            Err(e) => e.decode()?,
        };
        let value = value.decode()?;
        if indexing {
            self.insert(name.clone(), value.clone());
        }
        if list.admit(name.len(), value.len()) {
            list.fields.push(Field {
                name,
                value,
                sensitive: b & 0xf0 == 0x10,
            });
        }
        Ok(())
    }
}

/// A header list being decoded.
struct List {
    fields: Vec<Field>,
    /// The list's size so far; `None` once past the cap (fields are no longer kept).
    size: Option<usize>,
    cap: usize,
}

impl List {
    /// Counts a field of `n` and `v` bytes; true when it is kept (the list stays within the cap).
    fn admit(&mut self, n: usize, v: usize) -> bool {
        match &mut self.size {
            Some(s) if s.saturating_add(list_size(n, v)) <= self.cap => {
                *s += list_size(n, v);
                true
            }
            _ => {
                self.size = None;
                false
            }
        }
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

    fn fields(b: Result<Block, Error>) -> Vec<Field> {
        match b.expect("decodes") {
            Block::Fields(f) => f,
            Block::TooLarge => panic!("over the cap"),
        }
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
            let first = fields(d.decode(&hex(blocks[0])));
            assert_eq!(
                pairs(&first),
                want(&[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    (":authority", "www.example.com"),
                ])
            );
            let second = fields(d.decode(&hex(blocks[1])));
            assert_eq!(second[3].value, b"www.example.com", "dynamic table entry");
            assert_eq!(second[4].value, b"no-cache");
            let third = fields(d.decode(&hex(blocks[2])));
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
        let list = vec![
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
        assert_eq!(fields(d.decode(&encode(&list))), list);
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

    /// A literal with incremental indexing: `name: value`, both plain strings.
    fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut b = vec![0x40];
        put_string(&mut b, name);
        put_string(&mut b, value);
        b
    }

    /// One ~4 KiB dynamic-table entry, then 60,000 one-byte references to it: ~240 MiB decoded.
    fn bomb() -> Vec<u8> {
        let mut block = indexed_literal(b"x-bomb", &[b'b'; TABLE_SIZE - 32 - 6]);
        block.extend(std::iter::repeat_n(0xbe, 60_000)); // index 62: the newest entry
        block
    }

    #[test]
    fn an_hpack_bomb_is_refused_at_the_cap_and_the_table_stays_in_step() {
        let mut d = Decoder::default();
        assert_eq!(d.decode(&bomb()), Ok(Block::TooLarge));
        // The entry the bomb added is still there for the next block, as on the client's side.
        let next = fields(d.decode(&[0x83, 0xbe]));
        assert_eq!(next[1].name, b"x-bomb");
        assert_eq!(next[1].value.len(), TABLE_SIZE - 38);
        // Four references fit in 16 KiB (4 × 4096 exactly), a fifth does not.
        assert!(matches!(d.decode(&[0xbe; 4]), Ok(Block::Fields(f)) if f.len() == 4));
        assert_eq!(d.decode(&[0xbe; 5]), Ok(Block::TooLarge));
    }

    #[test]
    fn past_the_cap_only_what_the_table_needs_is_decoded() {
        let mut d = Decoder::default();
        let mut block = vec![0x00];
        put_string(&mut block, b"x-big");
        put_string(&mut block, &vec![b'v'; 100_000]);
        // Past the cap: an indexed literal small enough for the table is still inserted ...
        block.extend(indexed_literal(b"x-kept", b"in the table"));
        assert_eq!(d.decode(&block), Ok(Block::TooLarge));
        assert_eq!(
            d.dynamic.front(),
            Some(&(b"x-kept".to_vec(), b"in the table".to_vec()))
        );
        // ... and one larger than the table empties it, as RFC 7541 section 4.4 says.
        let big = indexed_literal(b"x-huge", &vec![b'h'; 20_000]);
        assert_eq!(d.decode(&big), Ok(Block::TooLarge));
        assert!(d.dynamic.is_empty());
        assert_eq!(d.size, 0);
        // A header list exactly at the cap is kept.
        let mut d = Decoder::default();
        let exact = encode(&[Field {
            name: b"x".to_vec(),
            value: vec![b'v'; MAX_HEADER_LIST - 33],
            sensitive: false,
        }]);
        assert_eq!(fields(d.decode(&exact)).len(), 1);
    }
}
