//! DNS packet facts every layer shares (a leaf: it uses no other module of the crate): the
//! transport a query came in on, the message size limits, our OPT record, and the plain query
//! read straight from the wire ([`parse`]) that the table answers and wire forwards start from.

use hickory_proto::rr::RecordType;

/// Smallest UDP answer size every client accepts (RFC 1035).
pub const MIN_UDP_SIZE: usize = 512;
/// Largest DNS message (TCP, or EDNS maximum).
pub const MAX_SIZE: usize = 65_535;
/// UDP payload size we advertise in our OPT records (DNS flag day 2020).
pub const OUR_UDP_PAYLOAD: u16 = 1232;

/// Transport a query arrived on, and is forwarded over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

/// Appends our OPT record: `payload`, no extended rcode, version 0, DO as given, no options.
pub(crate) fn push_opt(out: &mut Vec<u8>, payload: u16, dnssec_ok: bool) {
    out.extend_from_slice(&[0, 0, 41]);
    out.extend_from_slice(&payload.to_be_bytes());
    out.extend_from_slice(&[0, 0, if dnssec_ok { 0x80 } else { 0 }, 0, 0, 0]);
}

/// The client's OPT record in a plain query.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClientEdns {
    pub payload: u16,
    pub dnssec_ok: bool,
    /// Offset of the OPT record in the request.
    pub opt_start: usize,
}

/// A plain query: one question with a simple name, at most an OPT record besides.
pub(crate) struct Question {
    /// Lowercase name with trailing dot, as the table keys it.
    lower: [u8; 256],
    lower_len: usize,
    pub qtype: RecordType,
    pub qclass: u16,
    pub question_end: usize,
    pub edns: Option<ClientEdns>,
}

impl Question {
    pub fn lower_name(&self) -> &str {
        // Only ASCII letters, digits, '-', '_' and '.' are ever written (checked in `parse`).
        std::str::from_utf8(&self.lower[..self.lower_len]).unwrap_or("")
    }
}

/// Accepts only the plain shape: standard query, one question with a simple name (letters,
/// digits, `-`, `_`, `*`), no answer/authority records, at most one OPT (version 0), nothing
/// after it.
pub(crate) fn parse(req: &[u8]) -> Option<Question> {
    if req.len() < 17 || req[2] & 0xf8 != 0 || req[3] & 0x4f != 0 {
        return None;
    }
    let count = |i: usize| u16::from_be_bytes([req[i], req[i + 1]]);
    if count(4) != 1 || count(6) != 0 || count(8) != 0 || count(10) > 1 {
        return None;
    }
    let mut lower = [0u8; 256];
    let mut lower_len = 0;
    let mut i = 12;
    loop {
        let len = usize::from(*req.get(i)?);
        if len == 0 {
            i += 1;
            break;
        }
        if len > 63 || lower_len + len + 1 > 254 {
            return None;
        }
        let label = req.get(i + 1..i + 1 + len)?;
        for &b in label {
            if !(b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'*') {
                return None;
            }
            lower[lower_len] = b.to_ascii_lowercase();
            lower_len += 1;
        }
        lower[lower_len] = b'.';
        lower_len += 1;
        i += 1 + len;
    }
    if lower_len == 0 {
        return None;
    }
    let qtype = RecordType::from(u16::from_be_bytes([*req.get(i)?, *req.get(i + 1)?]));
    let qclass = u16::from_be_bytes([*req.get(i + 2)?, *req.get(i + 3)?]);
    // Meta classes (NONE, ANY) and OPT-like oddities take the full path.
    if qclass != 1 && !(2..=4).contains(&qclass) {
        return None;
    }
    let question_end = i + 4;
    let edns = if count(10) == 1 {
        let opt = req.get(question_end..question_end + 11)?;
        // Root owner, type OPT, version 0.
        if opt[0] != 0 || opt[1..3] != [0, 41] || opt[6] != 0 {
            return None;
        }
        let rdlen = usize::from(u16::from_be_bytes([opt[9], opt[10]]));
        if question_end + 11 + rdlen != req.len() {
            return None;
        }
        Some(ClientEdns {
            payload: u16::from_be_bytes([opt[3], opt[4]]),
            dnssec_ok: opt[7] & 0x80 != 0,
            opt_start: question_end,
        })
    } else {
        if question_end != req.len() {
            return None;
        }
        None
    };
    Some(Question {
        lower,
        lower_len,
        qtype,
        qclass,
        question_end,
        edns,
    })
}
