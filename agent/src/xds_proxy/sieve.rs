//! Reading a response while it streams by, for the responses the proxy relays before it has them
//! whole ([`super::upstream`]): the [`Sieve`] sees the message's bytes chunk by chunk and keeps
//! only the fields the proxy reads (the head; for Delta also the resources' names and versions
//! and the removed names), as a smaller protobuf message of the same type. Decoding that message
//! gives what decoding the whole response would have given, and fails where that would fail:
//! the resources themselves are skipped, never copied.
//!
//! [`first_resource_type`] reads the type URL of the first resource from a message's first
//! bytes, to tell whether a response is for Envoy before the rest of it has arrived.

use bytes::{Buf, BufMut};
use prost::Message;

/// Why a response could not be read (prost's decode of the whole message fails too).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed response at byte {at}: {what}")]
pub struct SieveError {
    at: u64,
    what: &'static str,
}

/// prost's recursion limit, which groups and nested messages count against.
const RECURSION_LIMIT: u32 = 100;

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// A varint read byte by byte (it may straddle two chunks).
#[derive(Default)]
struct Varint {
    raw: [u8; 10],
    n: usize,
}

impl Varint {
    /// Adds a byte; `Some(value)` once the varint is complete. Errors as prost's
    /// `decode_varint`: more than ten bytes, or a tenth byte over 1.
    fn push(&mut self, b: u8) -> Result<Option<u64>, &'static str> {
        if self.n == 9 && b > 1 {
            return Err("invalid varint");
        }
        self.raw[self.n] = b;
        self.n += 1;
        if b & 0x80 != 0 {
            return Ok(None);
        }
        let mut v = 0u64;
        for (i, byte) in self.raw[..self.n].iter().enumerate() {
            v |= u64::from(byte & 0x7f) << (7 * i);
        }
        Ok(Some(v))
    }

    fn bytes(&self) -> &[u8] {
        &self.raw[..self.n]
    }

    /// A whole, valid varint at the start of `buf`, and its value; `None` when `buf` ends
    /// first or the varint is invalid (the byte-by-byte path then reads it, or says why not).
    fn read(buf: &[u8]) -> Option<(Varint, u64)> {
        let mut rest = buf;
        let value = prost::encoding::decode_varint(&mut rest).ok()?;
        let n = buf.len() - rest.len();
        let mut v = Varint { raw: [0; 10], n };
        v.raw[..n].copy_from_slice(&buf[..n]);
        Some((v, value))
    }
}

/// What the sieve does with a field.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Copied to the kept message (key, length and value).
    Keep,
    /// Dropped.
    Skip,
    /// A Delta resource: its own fields are sieved in turn.
    Enter,
}

/// The fields the sieve keeps or enters (`None`: skipped): the head (`version_info` /
/// `system_version_info` 1, `type_url` 4, `nonce` 5), and for Delta `removed_resources` (6) and
/// each resource (2) with its `version` (1) and `name` (3).
fn sieved(delta: bool, in_resource: bool, field: u64) -> Option<Action> {
    match (delta, in_resource, field) {
        (_, false, 1 | 4 | 5) | (true, false, 6) | (true, true, 1 | 3) => Some(Action::Keep),
        (true, false, 2) => Some(Action::Enter),
        _ => None,
    }
}

/// One open level of the message.
enum Level {
    /// The response itself.
    Top,
    /// A Delta `Resource`: its kept fields, written to the response's once it ends.
    Resource { kept: Vec<u8> },
    /// A group being skipped, with its field number.
    Group(u32),
}

struct Frame {
    level: Level,
    /// The offset where the enclosing length-delimited message ends.
    end: u64,
}

/// Where the sieve is in the current field.
enum State {
    Key(Varint),
    Len {
        key: Varint,
        len: Varint,
        action: Action,
    },
    /// The value of a fixed-size or length-delimited field.
    Value {
        left: u64,
        keep: bool,
    },
    /// A varint value being skipped.
    SkipVarint(Varint),
}

/// Keeps the proxy's fields of a `DiscoveryResponse` (`delta: false`: `version_info`,
/// `type_url`, `nonce`) or a `DeltaDiscoveryResponse` (also each resource's `version` and
/// `name`, and `removed_resources`) from a message fed in chunks.
pub(crate) struct Sieve {
    delta: bool,
    len: u64,
    pos: u64,
    stack: Vec<Frame>,
    state: State,
    out: Vec<u8>,
}

impl Sieve {
    /// A sieve for a message of `len` bytes.
    pub(crate) fn new(len: u64, delta: bool) -> Self {
        Sieve {
            delta,
            len,
            pos: 0,
            stack: vec![Frame {
                level: Level::Top,
                end: len,
            }],
            state: State::Key(Varint::default()),
            out: Vec::new(),
        }
    }

    fn err(&self, what: &'static str) -> SieveError {
        SieveError { at: self.pos, what }
    }

    fn in_resource(&self) -> bool {
        matches!(
            self.stack.last().map(|f| &f.level),
            Some(Level::Resource { .. })
        )
    }

    fn action(&self, field: u32, wire: u8) -> Result<Action, &'static str> {
        let Some(action) = sieved(self.delta, self.in_resource(), u64::from(field)) else {
            return Ok(Action::Skip);
        };
        // Every kept field is a string or a message: another wire type fails prost's decode.
        if wire != LEN {
            return Err("invalid wire type for a string or message field");
        }
        Ok(action)
    }

    /// The kept bytes of the innermost level that keeps any.
    fn kept(&mut self) -> &mut Vec<u8> {
        for f in self.stack.iter_mut().rev() {
            if let Level::Resource { kept } = &mut f.level {
                return kept;
            }
        }
        &mut self.out
    }

    /// Groups open above the innermost message, and that message's depth (prost counts both).
    fn depth(&self) -> u32 {
        let groups = self
            .stack
            .iter()
            .rev()
            .take_while(|f| matches!(f.level, Level::Group(_)))
            .count() as u32;
        let nested = u32::from(
            self.stack
                .iter()
                .any(|f| matches!(f.level, Level::Resource { .. })),
        );
        groups + nested
    }

    /// Closes the Delta resources that end at the current offset.
    fn close_levels(&mut self) {
        while let Some(f) = self.stack.last()
            && matches!(f.level, Level::Resource { .. })
            && f.end == self.pos
        {
            let Some(Frame {
                level: Level::Resource { kept },
                ..
            }) = self.stack.pop()
            else {
                unreachable!("checked above")
            };
            let out = self.kept();
            out.put_u8(0x12);
            prost::encoding::encode_varint(kept.len() as u64, out);
            out.extend_from_slice(&kept);
        }
    }

    fn end(&self) -> u64 {
        self.stack.last().map_or(self.len, |f| f.end)
    }

    /// A key is complete: decides what to do with its field.
    fn on_key(&mut self, key: Varint, value: u64) -> Result<(), &'static str> {
        if value > u64::from(u32::MAX) {
            return Err("invalid key value");
        }
        let wire = (value & 7) as u8;
        let field = (value >> 3) as u32;
        if wire > FIXED32 {
            return Err("invalid wire type value");
        }
        if field == 0 {
            return Err("invalid tag value: 0");
        }
        let in_group = matches!(self.stack.last().map(|f| &f.level), Some(Level::Group(_)));
        if wire == END_GROUP {
            match self.stack.last().map(|f| &f.level) {
                Some(Level::Group(open)) if *open == field => {
                    self.stack.pop();
                    self.state = State::Key(Varint::default());
                    self.close_levels();
                    return Ok(());
                }
                _ => return Err("unexpected end group tag"),
            }
        }
        if self.depth() >= RECURSION_LIMIT {
            return Err("recursion limit reached");
        }
        let action = if in_group {
            Action::Skip
        } else {
            self.action(field, wire)?
        };
        self.state = match wire {
            VARINT => State::SkipVarint(Varint::default()),
            FIXED64 => State::Value {
                left: 8,
                keep: false,
            },
            FIXED32 => State::Value {
                left: 4,
                keep: false,
            },
            START_GROUP => {
                let end = self.end();
                self.stack.push(Frame {
                    level: Level::Group(field),
                    end,
                });
                State::Key(Varint::default())
            }
            _ => State::Len {
                key,
                len: Varint::default(),
                action,
            },
        };
        if let State::Value { left, .. } = self.state
            && self.pos + left > self.end()
        {
            return Err("buffer underflow");
        }
        Ok(())
    }

    /// A length is complete: starts the field's value.
    fn on_len(
        &mut self,
        key: Varint,
        raw: Varint,
        len: u64,
        action: Action,
    ) -> Result<(), &'static str> {
        if len > self.end() - self.pos {
            return Err("buffer underflow");
        }
        match action {
            Action::Enter => {
                if self.depth() + 1 >= RECURSION_LIMIT {
                    return Err("recursion limit reached");
                }
                self.stack.push(Frame {
                    level: Level::Resource { kept: Vec::new() },
                    end: self.pos + len,
                });
                self.state = State::Key(Varint::default());
                self.close_levels();
            }
            Action::Keep => {
                let out = self.kept();
                out.extend_from_slice(key.bytes());
                out.extend_from_slice(raw.bytes());
                self.state = State::Value {
                    left: len,
                    keep: true,
                };
            }
            Action::Skip => {
                self.state = State::Value {
                    left: len,
                    keep: false,
                }
            }
        }
        if let State::Value { left: 0, .. } = self.state {
            self.state = State::Key(Varint::default());
            self.close_levels();
        }
        Ok(())
    }

    /// Passes over the length-delimited fields the sieve skips, as long as each lies wholly in
    /// `chunk` and in the current message (not in a group); returns the bytes passed over.
    /// Anything else (a kept field, another wire type, a field cut by the chunk's end, an
    /// invalid key) is left to the field-by-field path, which also reports errors.
    fn skip_run(&mut self, chunk: &[u8]) -> usize {
        let in_resource = match self.stack.last().map(|f| &f.level) {
            Some(Level::Top) => false,
            Some(Level::Resource { .. }) => true,
            _ => return 0,
        };
        let avail = chunk
            .len()
            .min(usize::try_from(self.end() - self.pos).unwrap_or(usize::MAX));
        let mut rest = &chunk[..avail];
        loop {
            let mut r = rest;
            let Ok(key) = prost::encoding::decode_varint(&mut r) else {
                break;
            };
            if key & 7 != u64::from(LEN) || key > u64::from(u32::MAX) || key >> 3 == 0 {
                break;
            }
            if sieved(self.delta, in_resource, key >> 3).is_some() {
                break;
            }
            let Ok(len) = prost::encoding::decode_varint(&mut r) else {
                break;
            };
            match usize::try_from(len) {
                Ok(len) if len <= r.len() => rest = &r[len..],
                _ => break,
            }
        }
        let used = avail - rest.len();
        self.pos += used as u64;
        if used > 0 {
            self.close_levels();
        }
        used
    }

    /// Reads the key and length of a length-delimited field at the start of `chunk`, if both
    /// are there whole; returns the bytes used.
    fn fast_field(&mut self, chunk: &[u8]) -> Result<Option<usize>, SieveError> {
        let avail = chunk
            .len()
            .min(usize::try_from(self.end() - self.pos).unwrap_or(usize::MAX));
        let window = &chunk[..avail];
        let Some((key, k)) = Varint::read(window) else {
            return Ok(None);
        };
        if k & 7 != u64::from(LEN) || k > u64::from(u32::MAX) || k >> 3 == 0 {
            return Ok(None);
        }
        let Some((len, l)) = Varint::read(&window[key.n..]) else {
            return Ok(None);
        };
        let used = key.n + len.n;
        let at = self.pos;
        let fail = |what| SieveError { at, what };
        self.pos += key.n as u64;
        self.on_key(key, k).map_err(fail)?;
        let State::Len { key, action, .. } =
            std::mem::replace(&mut self.state, State::Key(Varint::default()))
        else {
            unreachable!("a length-delimited key is followed by its length")
        };
        self.pos += len.n as u64;
        self.on_len(key, len, l, action).map_err(fail)?;
        Ok(Some(used))
    }

    /// Reads the next chunk of the message.
    pub(crate) fn feed(&mut self, mut chunk: &[u8]) -> Result<(), SieveError> {
        if self.pos + chunk.len() as u64 > self.len {
            return Err(self.err("more bytes than the message's length"));
        }
        while !chunk.is_empty() {
            if let State::Value { left, keep } = &mut self.state {
                let n = (*left).min(chunk.len() as u64) as usize;
                let keep = *keep;
                *left -= n as u64;
                let done = *left == 0;
                if keep {
                    self.kept().extend_from_slice(&chunk[..n]);
                }
                chunk.advance(n);
                self.pos += n as u64;
                if done {
                    self.state = State::Key(Varint::default());
                    self.close_levels();
                }
                continue;
            }
            if let State::Key(Varint { n: 0, .. }) = self.state {
                // Skipped fields wholly in this chunk: passed over at once (the resources).
                let skipped = self.skip_run(chunk);
                if skipped > 0 {
                    chunk.advance(skipped);
                    continue;
                }
                // A length-delimited field's key and length, both in this chunk: read at once.
                if let Some(used) = self.fast_field(chunk)? {
                    chunk.advance(used);
                    continue;
                }
            }
            // A key, a length or a skipped varint: byte by byte.
            if self.pos == self.end() {
                return Err(self.err("a field runs past the end of its message"));
            }
            let b = chunk[0];
            chunk.advance(1);
            self.pos += 1;
            let step = self.step(b);
            step.map_err(|what| SieveError {
                at: self.pos - 1,
                what,
            })?;
        }
        Ok(())
    }

    /// One byte of a key, a length or a skipped varint.
    fn step(&mut self, b: u8) -> Result<(), &'static str> {
        let state = std::mem::replace(&mut self.state, State::Key(Varint::default()));
        match state {
            State::Key(mut key) => match key.push(b) {
                Ok(Some(v)) => self.on_key(key, v),
                Ok(None) => {
                    self.state = State::Key(key);
                    Ok(())
                }
                Err(e) => Err(e),
            },
            State::Len {
                key,
                mut len,
                action,
            } => match len.push(b) {
                Ok(Some(v)) => self.on_len(key, len, v, action),
                Ok(None) => {
                    self.state = State::Len { key, len, action };
                    Ok(())
                }
                Err(e) => Err(e),
            },
            State::SkipVarint(mut v) => match v.push(b) {
                Ok(Some(_)) => {
                    self.close_levels();
                    Ok(())
                }
                Ok(None) => {
                    self.state = State::SkipVarint(v);
                    Ok(())
                }
                Err(e) => Err(e),
            },
            State::Value { .. } => unreachable!("handled above"),
        }
    }

    /// The kept message, once all `len` bytes were fed.
    pub(crate) fn finish(self) -> Result<Vec<u8>, SieveError> {
        let whole = self.pos == self.len
            && self.stack.len() == 1
            && matches!(&self.state, State::Key(k) if k.n == 0);
        if !whole {
            return Err(self.err("the message ends inside a field"));
        }
        Ok(self.out)
    }
}

/// A resource's type URL: `Any.type_url`.
#[derive(Clone, PartialEq, Message)]
struct AnyType {
    #[prost(string, tag = "1")]
    type_url: String,
}

/// A Delta `Resource`'s `resource`.
#[derive(Clone, PartialEq, Message)]
struct ResourceType {
    #[prost(message, optional, tag = "2")]
    resource: Option<AnyType>,
}

/// The type URL of the first resource of a response, if `prefix` (the response's first bytes)
/// holds that resource whole.
pub(crate) fn first_resource_type(mut prefix: &[u8], delta: bool) -> Option<String> {
    while prefix.has_remaining() {
        let (field, wire) = prost::encoding::decode_key(&mut prefix).ok()?;
        if wire != prost::encoding::WireType::LengthDelimited {
            // A varint or fixed field at the top of a response: skip it.
            let ctx = prost::encoding::DecodeContext::default();
            prost::encoding::skip_field(wire, field, &mut prefix, ctx).ok()?;
            continue;
        }
        let len = usize::try_from(prost::encoding::decode_varint(&mut prefix).ok()?).ok()?;
        if len > prefix.len() {
            return None;
        }
        let (value, rest) = prefix.split_at(len);
        if field == 2 {
            let type_url = if delta {
                ResourceType::decode(value).ok()?.resource?.type_url
            } else {
                AnyType::decode(value).ok()?.type_url
            };
            return Some(type_url);
        }
        prefix = rest;
    }
    None
}

/// What a response reads as: its head, and in Delta the resources' names and versions.
#[cfg(any(test, feature = "fuzzing"))]
type Read = (
    super::codec::Head,
    Option<super::subscriptions::DeltaResources>,
);

/// Where the sieve and prost disagree on a response.
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Disagreement {
    /// Both read it, differently (each reading as `Debug` shows it).
    #[error("prost read {prost}, the sieve {sieve}")]
    Read { prost: String, sieve: String },
    #[error("prost reads it, the sieve does not: {0}")]
    SieveRejects(#[source] SieveError),
    #[error("prost reads it, the sieve does not: kept bytes: {0}")]
    KeptBytes(#[source] prost::DecodeError),
    #[error("the sieve reads it, prost does not: {0}")]
    ProstRejects(#[source] prost::DecodeError),
}

/// Sieves `bytes` (a `DeltaDiscoveryResponse` when `delta`, else a `DiscoveryResponse`) fed in
/// the chunks that `cuts` (offsets, any order, out of range ones ignored) make, and compares the
/// result with prost's decode of the whole message: `Ok(true)` when both read it and agree,
/// `Ok(false)` when both reject it, `Err` (what differs) otherwise.
#[cfg(any(test, feature = "fuzzing"))]
pub fn check_against_prost(
    bytes: &[u8],
    delta: bool,
    cuts: &[usize],
) -> Result<bool, Disagreement> {
    use super::codec::Head;
    use super::subscriptions::DeltaResources;
    let mut cuts: Vec<usize> = cuts.iter().copied().filter(|&c| c <= bytes.len()).collect();
    cuts.push(bytes.len());
    cuts.sort_unstable();
    let mut sieve = Sieve::new(bytes.len() as u64, delta);
    let mut at = 0;
    let mut fed = Ok(());
    for c in cuts {
        fed = fed.and_then(|()| sieve.feed(&bytes[at..c]));
        at = c;
    }
    let kept = fed.and_then(|()| sieve.finish());
    let whole: Result<Read, _> = Head::decode(bytes).and_then(|h| {
        let resources = if delta {
            Some(DeltaResources::decode(bytes)?)
        } else {
            None
        };
        Ok((h, resources))
    });
    let sieved = kept.map_err(Disagreement::SieveRejects).and_then(|kept| {
        let h = Head::decode(&kept[..]).map_err(Disagreement::KeptBytes)?;
        let resources = if delta {
            Some(DeltaResources::decode(&kept[..]).map_err(Disagreement::KeptBytes)?)
        } else {
            None
        };
        Ok((h, resources))
    });
    match (whole, sieved) {
        (Ok(w), Ok(s)) if w == s => Ok(true),
        (Ok(w), Ok(s)) => Err(Disagreement::Read {
            prost: format!("{w:?}"),
            sieve: format!("{s:?}"),
        }),
        (Err(_), Err(_)) => Ok(false),
        (Ok(_), Err(e)) => Err(e),
        (Err(e), Ok(_)) => Err(Disagreement::ProstRejects(e)),
    }
}

#[cfg(test)]
mod tests;
