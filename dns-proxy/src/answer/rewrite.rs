//! The byte rewrites of a plain query forwarded without parsing (see [`crate::packet::parse`]):
//! the client's bytes go upstream advertising our EDNS size, and the upstream's answer goes back
//! with the client's id, flags, question and OPT record, without building `Message`s. Anything
//! unusual (an answer to cut to the client's size, TSIG, extended rcodes, odd layouts) is left
//! to the `Message` path.

use crate::packet::{MIN_UDP_SIZE, OUR_UDP_PAYLOAD, Question, push_opt};

const TYPE_OPT: u16 = 41;
const TYPE_SIG: u16 = 24;
const TYPE_TSIG: u16 = 250;

fn count(msg: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([msg[at], msg[at + 1]])
}

fn set_count(msg: &mut [u8], at: usize, n: u16) {
    msg[at..at + 2].copy_from_slice(&n.to_be_bytes());
}

/// The query to send upstream for the plain request `req`: its bytes, advertising at least
/// `payload` (istio#61371).
pub(crate) fn upstream_query(req: &[u8], q: &Question, payload: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(req.len() + 11);
    out.extend_from_slice(req);
    match q.edns {
        Some(e) => {
            if e.payload < payload {
                out[e.opt_start + 3..e.opt_start + 5].copy_from_slice(&payload.to_be_bytes());
            }
        }
        None => {
            push_opt(&mut out, payload, false);
            set_count(&mut out, 10, 1);
        }
    }
    out
}

/// The answer to the plain request `req` with response code `rcode` and no records.
pub(crate) fn error_answer(req: &[u8], q: &Question, rcode: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(q.question_end + 11);
    out.extend_from_slice(&req[..2]);
    // QR, opcode 0, RD copied; RA, CD copied.
    out.push(0x80 | (req[2] & 0x01));
    out.push(0x80 | (req[3] & 0x10) | (rcode & 0x0f));
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(q.edns.is_some())]);
    out.extend_from_slice(&req[12..q.question_end]);
    if let Some(e) = q.edns {
        push_opt(&mut out, OUR_UDP_PAYLOAD, e.dnssec_ok);
    }
    out
}

/// Checks the (possibly compressed) name at `i` and returns the offset after it. Compression
/// pointers must point strictly backwards (so following them terminates) and the expanded name
/// must fit in 255 bytes.
fn check_name(msg: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    let mut end = None;
    let mut expanded = 0usize;
    loop {
        let len = *msg.get(i)?;
        match len & 0xc0 {
            0 => {
                if len == 0 {
                    return Some(end.unwrap_or(i + 1));
                }
                expanded += 1 + usize::from(len);
                if expanded > 255 {
                    return None;
                }
                i += 1 + usize::from(len);
                msg.get(i)?;
            }
            0xc0 => {
                let target = usize::from(u16::from_be_bytes([len & 0x3f, *msg.get(i + 1)?]));
                if target >= i {
                    return None;
                }
                end.get_or_insert(i + 2);
                i = target;
            }
            _ => return None,
        }
    }
}

/// The upstream's answer `ans` to the plain UDP request `req` (already matched on id, QR and
/// question) made the client's: its id, RD and CD bits and question spelling, the upstream's
/// OPT record replaced by ours (or removed when the client sent none). `Err` hands the answer
/// back when the wire path does not apply and the `Message` path must take it.
pub(crate) fn to_client(mut ans: Vec<u8>, req: &[u8], q: &Question) -> Result<Vec<u8>, Vec<u8>> {
    let qend = q.question_end;
    if ans.len() < qend
        || count(&ans, 4) != 1
        || !ans[12..qend].eq_ignore_ascii_case(&req[12..qend])
    {
        return Err(ans);
    }
    let additional_from = usize::from(count(&ans, 6)) + usize::from(count(&ans, 8));
    let total = additional_from + usize::from(count(&ans, 10));
    let mut i = qend;
    let mut opt = None;
    for n in 0..total {
        let start = i;
        let Some(after_name) = check_name(&ans, i) else {
            return Err(ans);
        };
        let Some(fixed) = ans.get(after_name..after_name + 10) else {
            return Err(ans);
        };
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let end = after_name + 10 + usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        if end > ans.len() {
            return Err(ans);
        }
        match rtype {
            TYPE_SIG | TYPE_TSIG if n >= additional_from => return Err(ans),
            TYPE_OPT => {
                // One OPT, in the additional section, root owner, no extended rcode.
                if n < additional_from || opt.is_some() || after_name != start + 1 || fixed[4] != 0
                {
                    return Err(ans);
                }
                opt = Some((start, end));
            }
            _ => {}
        }
        i = end;
    }
    if i != ans.len() {
        return Err(ans);
    }
    if let Some((start, end)) = opt {
        // Removing anything but the last record could break compression pointers.
        if end != ans.len() {
            return Err(ans);
        }
        ans.truncate(start);
        let ar = count(&ans, 10) - 1;
        set_count(&mut ans, 10, ar);
    }
    ans[..2].copy_from_slice(&req[..2]);
    ans[2] = (ans[2] & !0x01) | (req[2] & 0x01);
    ans[3] = (ans[3] & !0x10) | (req[3] & 0x10);
    ans[12..qend].copy_from_slice(&req[12..qend]);
    let limit = match q.edns {
        Some(e) => {
            push_opt(&mut ans, OUR_UDP_PAYLOAD, e.dnssec_ok);
            let ar = count(&ans, 10).saturating_add(1);
            set_count(&mut ans, 10, ar);
            usize::from(e.payload).max(MIN_UDP_SIZE)
        }
        None => MIN_UDP_SIZE,
    };
    if ans.len() > limit {
        return Err(ans);
    }
    Ok(ans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::parse;
    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
    use hickory_proto::rr::rdata::{A, CNAME};
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    use std::net::Ipv4Addr;

    fn request(name: &str, edns: Option<(u16, bool)>) -> Vec<u8> {
        let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.metadata.checking_disabled = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        if let Some((size, dnssec_ok)) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            e.set_dnssec_ok(dnssec_ok);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    /// An upstream answer to `upstream_query` bytes: `n` A records behind a CNAME, with the
    /// question in `spelling`, and the upstream's own OPT record.
    fn upstream_answer(upstream_query: &[u8], spelling: &str, n: u8) -> Vec<u8> {
        let q = Message::from_vec(upstream_query).unwrap();
        let mut m = Message::new(0xbeef, MessageType::Response, OpCode::Query);
        m.metadata.recursion_available = true;
        let name = Name::from_ascii(spelling).unwrap();
        m.add_query(Query::query(name.clone(), RecordType::A));
        let target = Name::from_ascii("target.example.net.").unwrap();
        m.add_answer(Record::from_rdata(
            name,
            60,
            RData::CNAME(CNAME(target.clone())),
        ));
        for i in 0..n {
            m.add_answer(Record::from_rdata(
                target.clone(),
                60,
                RData::A(A(Ipv4Addr::new(192, 0, 2, i))),
            ));
        }
        assert!(q.edns.is_some());
        let mut e = Edns::new();
        e.set_max_payload(4096);
        m.set_edns(e);
        m.to_vec().unwrap()
    }

    #[test]
    fn query_advertises_our_size() {
        for edns in [None, Some((512, true)), Some((4096, false))] {
            let req = request("a.example.com.", edns);
            let q = parse(&req).unwrap();
            let up = Message::from_vec(&upstream_query(&req, &q, 1232)).unwrap();
            let e = up.edns.expect("OPT sent upstream");
            let want = edns.map_or(1232, |(s, _)| s.max(1232));
            assert_eq!(e.max_payload(), want);
            assert_eq!(e.flags().dnssec_ok, edns.is_some_and(|(_, d)| d));
            assert_eq!(up.queries, Message::from_vec(&req).unwrap().queries);
        }
    }

    #[test]
    fn answer_made_the_clients() {
        for edns in [None, Some((1232, true))] {
            let req = request("WWW.Example.com.", edns);
            let q = parse(&req).unwrap();
            let up = upstream_query(&req, &q, 1232);
            let ans = upstream_answer(&up, "www.example.com.", 3);
            let out = to_client(ans, &req, &q).expect("wire path");
            let m = Message::from_vec(&out).unwrap();
            assert_eq!(m.metadata.id, 0x1234);
            assert!(m.metadata.recursion_desired && m.metadata.checking_disabled);
            assert!(m.metadata.recursion_available);
            assert_eq!(m.queries[0].name().to_ascii(), "WWW.Example.com.");
            assert_eq!(m.answers.len(), 4);
            assert_eq!(m.answers[3].data.to_string(), "192.0.2.2");
            match edns {
                None => assert!(m.edns.is_none(), "upstream OPT is hop-by-hop"),
                Some(_) => {
                    let e = m.edns.unwrap();
                    assert_eq!(e.max_payload(), OUR_UDP_PAYLOAD);
                    assert!(e.flags().dnssec_ok);
                }
            }
        }
    }

    #[test]
    fn declines_what_the_message_path_must_do() {
        let req = request("a.example.com.", None);
        let q = parse(&req).unwrap();
        let up = upstream_query(&req, &q, 1232);
        // Too big for a 512-byte client: cut by the Message path, with TC.
        assert!(to_client(upstream_answer(&up, "a.example.com.", 40), &req, &q).is_err());
        // Another question.
        assert!(to_client(upstream_answer(&up, "b.example.com.", 1), &req, &q).is_err());
        // Broken records, trailing bytes, forward pointers.
        let good = upstream_answer(&up, "a.example.com.", 1);
        assert!(to_client(good.clone(), &req, &q).is_ok());
        for cut in [good.len() - 1, good.len() - 12, q.question_end + 3] {
            assert!(to_client(good[..cut].to_vec(), &req, &q).is_err(), "{cut}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(to_client(trailing, &req, &q).is_err());
        let mut forward = good.clone();
        // The first answer's owner is a pointer to the question (0xc00c): point it at itself.
        let at = q.question_end;
        assert_eq!(&forward[at..at + 2], &[0xc0, 0x0c]);
        forward[at + 1] = at as u8;
        assert!(to_client(forward, &req, &q).is_err());
    }

    #[test]
    fn error_answer_echoes_the_question() {
        let req = request("a.example.com.", Some((1232, false)));
        let q = parse(&req).unwrap();
        let m = Message::from_vec(&error_answer(&req, &q, 2)).unwrap();
        assert_eq!(m.metadata.id, 0x1234);
        assert_eq!(
            m.metadata.response_code,
            hickory_proto::op::ResponseCode::ServFail
        );
        assert_eq!(m.queries, Message::from_vec(&req).unwrap().queries);
        assert!(m.edns.is_some());
    }
}
