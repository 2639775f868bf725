//! Answers from the name table: written straight on the wire for the common case (one A/AAAA
//! question, optionally with a plain OPT record, for a name the table holds directly) without
//! building messages, and as a `Message` for everything else the table answers (CNAMEs,
//! wildcards, answers to cut to the client's size).

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use rand::RngExt;
use rand::seq::SliceRandom;

use super::respond::respond;
use crate::packet::{OUR_UDP_PAYLOAD, Question, push_opt};
use crate::table::{LOCAL_TTL, LookupTable};

/// Writes the table's answer to the plain request `req` (parsed into `q`) into `out`, sized
/// for the client (`udp`: its EDNS size, else 512; TCP: 65535). `false` when there is no plain
/// answer (CNAME, wildcard, too big, not A/AAAA, not IN): [`message`] takes it.
pub(crate) fn wire(
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
        push_opt(out, OUR_UDP_PAYLOAD, e.dnssec_ok);
    }
    true
}

/// The table's answer for `req`, or `None` to forward it.
pub(crate) fn message(table: &LookupTable, req: &Message) -> Option<Message> {
    let q = req.queries.first()?;
    if q.query_class() != DNSClass::IN {
        return None;
    }
    let lower = q.name().to_lowercase().to_ascii();
    let answer = table.lookup(q.name(), &lower, q.query_type())?;
    let mut resp = respond(req, ResponseCode::NoError);
    resp.metadata.authoritative = true;
    let mut addrs: Vec<Record> = answer.addrs;
    // Round robin: shuffled on every answer.
    if addrs.len() > 1 {
        addrs.shuffle(&mut rand::rng());
    }
    resp.answers = answer.cnames;
    resp.answers.extend(addrs);
    Some(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::{expansion, sample};
    use hickory_proto::op::{Edns, MessageType, OpCode, Query};
    use hickory_proto::rr::Name;

    /// [`wire`] on the raw request, parsed first.
    fn answer(table: &LookupTable, req: &[u8], udp: bool, out: &mut Vec<u8>) -> bool {
        match crate::packet::parse(req) {
            Some(q) => wire(table, &q, req, udp, out),
            None => false,
        }
    }

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
