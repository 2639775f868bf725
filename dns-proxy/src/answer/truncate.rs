//! Answers cut to the client's size: size-limited encoding of a `Message` that leaves out whole
//! records and sets the TC bit, and the size limit a UDP client asks for.

use hickory_proto::op::{Edns, HeaderCounts, Message, emit_message_parts};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};

use crate::packet::{MAX_SIZE, MIN_UDP_SIZE};

/// Encodes `msg` in at most `limit` bytes. Records that do not fit are left out (whole records,
/// answer section first) and the TC bit is set; the OPT record always fits.
pub fn encode(msg: &Message, limit: usize) -> Option<Vec<u8>> {
    let limit = limit.clamp(MIN_UDP_SIZE, MAX_SIZE);
    let opt = msg.edns.as_ref().map(|e| {
        let mut e: Edns = e.clone();
        e.set_rcode_high(msg.metadata.response_code.high());
        Record::from(&e)
    });
    let opt_bytes = match &opt {
        Some(r) => {
            let mut b = Vec::with_capacity(16);
            let mut enc = BinEncoder::new(&mut b);
            r.emit(&mut enc).ok()?;
            b
        }
        None => Vec::new(),
    };
    let mut buf = Vec::with_capacity(512);
    let mut enc = BinEncoder::new(&mut buf);
    enc.set_max_size(u16::try_from(limit - opt_bytes.len()).ok()?);
    let mut truncated = false;
    let mut answers_done = msg.answers.iter();
    // emit_message_parts sets TC itself when a section is cut.
    let header = emit_message_parts(
        &msg.metadata,
        &mut msg.queries.iter(),
        &mut answers_done,
        &mut msg.authorities.iter(),
        &mut msg.additionals.iter(),
        None,
        None,
        &mut enc,
    );
    let header = match header {
        Ok(h) => h,
        // The question itself does not fit: cannot happen above 512 bytes, answer SERVFAIL.
        Err(_) => return None,
    };
    truncated |= header.metadata.truncation;
    drop(enc);
    if truncated && !msg.metadata.truncation {
        return cut(msg, header.counts, limit);
    }
    if !opt_bytes.is_empty() {
        buf.extend_from_slice(&opt_bytes);
        let arcount = u16::from_be_bytes([buf[10], buf[11]]).saturating_add(1);
        buf[10..12].copy_from_slice(&arcount.to_be_bytes());
    }
    Some(buf)
}

/// A cut answer set: the answers that fit (`counts` of the first encoding, then as many more
/// as still fit compressed), the authority section only when every answer fits, and no
/// additional section (RFC 2181 9), with the TC bit.
fn cut(msg: &Message, counts: HeaderCounts, limit: usize) -> Option<Vec<u8>> {
    let mut m2 = Message::new(
        msg.metadata.id,
        msg.metadata.message_type,
        msg.metadata.op_code,
    );
    m2.metadata = msg.metadata;
    m2.metadata.truncation = true;
    m2.queries = msg.queries.clone();
    m2.answers = msg
        .answers
        .iter()
        .take(counts.answers as usize)
        .cloned()
        .collect();
    if counts.answers as usize == msg.answers.len() {
        m2.authorities = msg
            .authorities
            .iter()
            .take(counts.authorities as usize)
            .cloned()
            .collect();
    }
    m2.edns = msg.edns.clone();
    // The encoder's size check counts a record before its name is compressed, so it can
    // stop one or two answers short of the limit (a 512-byte answer of 16-byte A records
    // ended at 493 bytes): add answers while the compressed message still fits, as Istio's
    // miekg/dns `Truncate` does.
    let mut fitted = None;
    while m2.answers.len() < msg.answers.len() && m2.authorities.is_empty() {
        m2.answers.push(msg.answers[m2.answers.len()].clone());
        match m2.to_vec() {
            Ok(b) if b.len() <= limit => fitted = Some(b),
            _ => {
                m2.answers.pop();
                break;
            }
        }
    }
    match fitted {
        Some(b) => Some(b),
        None => encode(&m2, limit),
    }
}

/// Largest answer the client accepts over UDP: its EDNS payload size, else 512.
pub fn udp_limit(req: &Message) -> usize {
    match &req.edns {
        Some(e) => usize::from(e.max_payload()).clamp(MIN_UDP_SIZE, MAX_SIZE),
        None => MIN_UDP_SIZE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::OUR_UDP_PAYLOAD;
    use hickory_proto::op::{MessageType, OpCode, Query};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, RecordType};
    use std::net::Ipv4Addr;

    fn big_answer(n: u8, edns: bool) -> Message {
        let name = Name::from_ascii("many.example.com.").unwrap();
        let mut m = Message::new(7, MessageType::Response, OpCode::Query);
        m.add_query(Query::query(name.clone(), RecordType::A));
        for i in 0..n {
            m.add_answer(Record::from_rdata(
                name.clone(),
                30,
                RData::A(A(Ipv4Addr::new(10, 1, 0, i))),
            ));
        }
        if edns {
            let mut e = Edns::new();
            e.set_max_payload(OUR_UDP_PAYLOAD);
            m.set_edns(e);
        }
        m
    }

    #[test]
    fn truncates_whole_records_and_sets_tc() {
        let m = big_answer(60, false);
        let full = encode(&m, MAX_SIZE).unwrap();
        let back = Message::from_vec(&full).unwrap();
        assert_eq!(back.answers.len(), 60);
        assert!(!back.metadata.truncation);
        let cut = encode(&m, 512).unwrap();
        assert!(cut.len() <= 512);
        let back = Message::from_vec(&cut).unwrap();
        assert!(back.metadata.truncation);
        assert!(back.answers.len() < 60 && !back.answers.is_empty());
    }

    /// As many answers as fit: each compressed A record is 16 bytes after the header and
    /// question (the differential suite's `wide.ns-b.svc.cluster.local.` once got 28, not 29).
    #[test]
    fn packs_as_many_answers_as_fit() {
        for (name, want) in [
            ("many.example.com.", (512 - 12 - 18 - 4) / 16),
            ("wide.ns-b.svc.cluster.local.", (512 - 12 - 29 - 4) / 16),
        ] {
            let name = Name::from_ascii(name).unwrap();
            let mut m = big_answer(60, false);
            m.queries[0] = Query::query(name.clone(), RecordType::A);
            for a in &mut m.answers {
                a.name = name.clone();
            }
            let cut = encode(&m, 512).unwrap();
            let back = Message::from_vec(&cut).unwrap();
            assert!(back.metadata.truncation && cut.len() <= 512);
            assert_eq!(back.answers.len(), want, "{name}: {} bytes", cut.len());
        }
    }

    #[test]
    fn opt_record_always_fits() {
        let m = big_answer(60, true);
        let cut = encode(&m, 600).unwrap();
        assert!(cut.len() <= 600, "{}", cut.len());
        let back = Message::from_vec(&cut).unwrap();
        assert!(back.metadata.truncation);
        assert_eq!(back.edns.map(|e| e.max_payload()), Some(OUR_UDP_PAYLOAD));
        let full = Message::from_vec(&encode(&m, 4096).unwrap()).unwrap();
        assert_eq!(full.answers.len(), 60);
        assert!(full.edns.is_some() && !full.metadata.truncation);
    }
}
