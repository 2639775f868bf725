//! `Message` answers for the client: the response skeleton of a request, an upstream (or cached)
//! answer made the client's, header-only errors, and the encoding sized for the transport.

use hickory_proto::op::{Edns, Message, MessageType, Metadata, ResponseCode};

use super::truncate;
use crate::packet::{MAX_SIZE, OUR_UDP_PAYLOAD, Transport};

/// A response skeleton for `req`: id, opcode, RD/CD copied, RA set, question echoed, an OPT
/// record when the client sent one.
pub(crate) fn respond(req: &Message, rcode: ResponseCode) -> Message {
    let mut m = Message::new(req.metadata.id, MessageType::Response, req.metadata.op_code);
    m.metadata = Metadata::response_from_request(&req.metadata);
    m.metadata.recursion_available = true;
    m.metadata.response_code = rcode;
    m.queries = req.queries.clone();
    set_client_edns(&mut m, req);
    m
}

fn set_client_edns(m: &mut Message, req: &Message) {
    m.edns = req.edns.as_ref().map(|client| {
        let mut e = Edns::new();
        e.set_max_payload(OUR_UDP_PAYLOAD);
        e.set_dnssec_ok(client.flags().dnssec_ok);
        e
    });
}

/// An upstream (or cached) answer made ours: the client's id and question, our OPT record (or
/// none when the client sent none: the upstream's OPT is hop-by-hop).
pub(crate) fn upstream_to_client(mut resp: Message, req: &Message) -> Message {
    resp.metadata.id = req.metadata.id;
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    resp.metadata.checking_disabled = req.metadata.checking_disabled;
    resp.queries = req.queries.clone();
    resp.signature = None;
    set_client_edns(&mut resp, req);
    resp
}

/// `resp` encoded for the client of `req`: cut to its UDP size (TC set), or whole over TCP;
/// SERVFAIL without records when even the question does not fit.
pub(crate) fn encode(resp: &Message, req: &Message, transport: Transport) -> Option<Vec<u8>> {
    let limit = match transport {
        Transport::Udp => truncate::udp_limit(req),
        Transport::Tcp => MAX_SIZE,
    };
    truncate::encode(resp, limit).or_else(|| {
        let mut fail = resp.clone();
        fail.answers.clear();
        fail.authorities.clear();
        fail.additionals.clear();
        fail.metadata.response_code = ResponseCode::ServFail;
        truncate::encode(&fail, limit)
    })
}

/// A header-only answer to a request we could not (or will not) process: same id and opcode,
/// RD copied, QR set, no question.
pub(crate) fn error_header(request: &[u8], rcode: ResponseCode) -> Option<Vec<u8>> {
    if request.len() < 12 {
        return None;
    }
    let mut out = vec![0u8; 12];
    out[0] = request[0];
    out[1] = request[1];
    // QR=1, opcode copied, RD copied.
    out[2] = 0x80 | (request[2] & 0x78) | (request[2] & 0x01);
    out[3] = 0x80 | (u16::from(rcode) as u8 & 0x0f); // RA=1
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_header_keeps_id_and_rd() {
        let req = [0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xff];
        let out = error_header(&req, ResponseCode::FormErr).unwrap();
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.id, 0xabcd);
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        assert!(m.metadata.recursion_desired);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert!(error_header(&req[..5], ResponseCode::FormErr).is_none());
    }
}
