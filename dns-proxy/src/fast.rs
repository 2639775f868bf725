//! Wire-level fast path for the common case: one A/AAAA question (optionally with a plain OPT
//! record) for a name the table holds directly. Answers are written straight from the request
//! bytes without building messages; anything else (CNAME, wildcard, truncation, odd packets)
//! returns `false` and takes the full path in `server`.

use hickory_proto::rr::{RData, RecordType};
use rand::Rng;

use crate::message::OUR_UDP_PAYLOAD;
use crate::table::{LOCAL_TTL, LookupTable};

/// Writes the answer to `req` into `out` when the fast path applies. `limit` is the largest
/// answer the client accepts (UDP) or 65535 (TCP) before considering its EDNS size.
#[cfg(test)]
pub(crate) fn answer(table: &LookupTable, req: &[u8], udp: bool, out: &mut Vec<u8>) -> bool {
    match parse(req) {
        Some(q) => answer_parsed(table, &q, req, udp, out),
        None => false,
    }
}

/// [`answer`] for a request already parsed by [`parse`].
pub(crate) fn answer_parsed(
    table: &LookupTable,
    q: &Question,
    req: &[u8],
    udp: bool,
    out: &mut Vec<u8>,
) -> bool {
    if q.qclass != 1 || !matches!(q.qtype, RecordType::A | RecordType::AAAA) {
        return false;
    }
    let Some(records) = table.exact_addrs(q.lower_name(), q.qtype) else {
        return false;
    };
    let rdlen: usize = if q.qtype == RecordType::A { 4 } else { 16 };
    let record_len = 12 + rdlen;
    let opt_len = if q.edns.is_some() { 11 } else { 0 };
    let total = q.question_end + records.len() * record_len + opt_len;
    let limit = match (udp, q.edns) {
        (false, _) => 65_535,
        (true, Some(e)) => usize::from(e.payload.max(512)),
        (true, None) => 512,
    };
    if total > limit || records.len() > usize::from(u16::MAX) {
        return false;
    }
    out.clear();
    out.reserve(total);
    out.extend_from_slice(&req[..2]);
    // QR, opcode 0, AA, RD copied; RA, CD copied, NOERROR.
    out.push(0x84 | (req[2] & 0x01));
    out.push(0x80 | (req[3] & 0x10));
    out.extend_from_slice(&[0, 1]);
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&[0, u8::from(q.edns.is_some())]);
    out.extend_from_slice(&req[12..q.question_end]);
    let answers_start = out.len();
    for r in records {
        // Owner: a pointer to the question name (offset 12).
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&u16::from(q.qtype).to_be_bytes());
        out.extend_from_slice(&[0, 1]);
        out.extend_from_slice(&LOCAL_TTL.to_be_bytes());
        out.extend_from_slice(&(rdlen as u16).to_be_bytes());
        match &r.data {
            RData::A(a) => out.extend_from_slice(&a.0.octets()),
            RData::AAAA(a) => out.extend_from_slice(&a.0.octets()),
            _ => return false,
        }
    }
    // Round robin: shuffle the fixed-size records in place.
    let n = records.len();
    if n > 1 {
        let mut rng = rand::rng();
        for i in (1..n).rev() {
            let j = rng.random_range(0..=i);
            if i != j {
                let (a, b) = (
                    answers_start + j * record_len,
                    answers_start + i * record_len,
                );
                let (left, right) = out.split_at_mut(b);
                left[a..a + record_len].swap_with_slice(&mut right[..record_len]);
            }
        }
    }
    if let Some(e) = q.edns {
        out.extend_from_slice(&[0, 0, 41]);
        out.extend_from_slice(&OUR_UDP_PAYLOAD.to_be_bytes());
        out.extend_from_slice(&[0, 0, if e.dnssec_ok { 0x80 } else { 0 }, 0, 0, 0]);
    }
    true
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::{expansion, sample};
    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::Name;

    fn q(name: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
        let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            e.set_dnssec_ok(true);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn answers_plain_hosts_like_the_full_path() {
        let t = LookupTable::build(&sample(), &expansion());
        let mut out = Vec::new();
        assert!(answer(
            &t,
            &q(
                "Reviews.ns2.svc.cluster.local.",
                RecordType::AAAA,
                Some(1232)
            ),
            true,
            &mut out
        ));
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.id, 0x4242);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert!(
            m.metadata.authoritative
                && m.metadata.recursion_desired
                && m.metadata.recursion_available
        );
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].ttl, 30);
        assert_eq!(
            m.answers[0].name.to_ascii(),
            "Reviews.ns2.svc.cluster.local."
        );
        assert_eq!(m.answers[0].data.to_string(), "fd00::2");
        let e = m.edns.unwrap();
        assert_eq!(e.max_payload(), OUR_UDP_PAYLOAD);
        assert!(e.flags().dnssec_ok);
        // NODATA.
        assert!(answer(
            &t,
            &q("productpage.", RecordType::AAAA, None),
            true,
            &mut out
        ));
        let m = Message::from_vec(&out).unwrap();
        assert!(m.answers.is_empty() && m.edns.is_none());
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    }

    #[test]
    fn declines_everything_else() {
        let t = LookupTable::build(&sample(), &expansion());
        let mut out = Vec::new();
        for (name, qtype) in [
            ("www.example.com.ns1.svc.cluster.local.", RecordType::A), // CNAME
            ("x.wild.example.com.", RecordType::A),                    // wildcard
            ("unknown.test.", RecordType::A),                          // forward
            ("www.example.com.", RecordType::TXT),                     // forward
        ] {
            assert!(!answer(&t, &q(name, qtype, None), true, &mut out), "{name}");
        }
        let mut trailing = q("productpage.", RecordType::A, None);
        trailing.push(0);
        assert!(!answer(&t, &trailing, true, &mut out));
        let mut opcode = q("productpage.", RecordType::A, None);
        opcode[2] |= 0x28;
        assert!(!answer(&t, &opcode, true, &mut out));
    }

    #[test]
    fn declines_when_it_would_not_fit() {
        let mut nt = sample();
        let many: Vec<String> = (0..60).map(|i| format!("10.1.0.{i}")).collect();
        nt.table.insert(
            "many.example.com".into(),
            crate::table::tests::plain(&many.iter().map(String::as_str).collect::<Vec<_>>()),
        );
        let t = LookupTable::build(&nt, &expansion());
        let mut out = Vec::new();
        assert!(!answer(
            &t,
            &q("many.example.com.", RecordType::A, None),
            true,
            &mut out
        ));
        assert!(answer(
            &t,
            &q("many.example.com.", RecordType::A, None),
            false,
            &mut out
        ));
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.answers.len(), 60);
        let mut addrs: Vec<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
        let shuffled = addrs.clone();
        addrs.sort_by_key(|a| a.rsplit('.').next().unwrap().parse::<u8>().unwrap());
        assert_eq!(addrs, many);
        assert_ne!(
            shuffled, many,
            "shuffled (1 in 60! chance of a false failure)"
        );
        assert!(answer(
            &t,
            &q("many.example.com.", RecordType::A, Some(4096)),
            true,
            &mut out
        ));
    }
}
