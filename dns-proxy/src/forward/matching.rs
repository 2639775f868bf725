//! Matching upstream answers to our queries: on the wire (QR set, question echoed) and as a
//! parsed `Message` (id, QR, question), and the question section of a query we encoded.

use std::net::SocketAddr;

use hickory_proto::op::{Message, MessageType};

use super::ForwardError;

/// Whether `answer` answers the query whose question section is `question`: QR set and the
/// question echoed (case-insensitively). Error answers may omit the question (FORMERR,
/// SERVFAIL, REFUSED: some servers do), but not NXDOMAIN, which says something about the
/// name and would be cached: without the question, anyone who guessed the id could forge it.
pub(super) fn answers(answer: &[u8], question: &[u8]) -> bool {
    if answer.len() < 12 || answer[2] & 0x80 == 0 {
        return false;
    }
    let qdcount = u16::from_be_bytes([answer[4], answer[5]]);
    if qdcount == 0 {
        return questionless_error(u16::from(answer[3] & 0x0f));
    }
    qdcount == 1
        && answer
            .get(12..12 + question.len())
            .is_some_and(|q| q.eq_ignore_ascii_case(question))
}

/// Response codes an answer may carry without echoing the question: errors about the query or
/// the server, not NOERROR or NXDOMAIN (3).
fn questionless_error(rcode: u16) -> bool {
    rcode != 0 && rcode != 3
}

/// The question section of a query we encoded (uncompressed name, type, class).
pub(super) fn question_bytes(msg: &[u8]) -> Option<&[u8]> {
    let mut i = 12;
    loop {
        let len = usize::from(*msg.get(i)?);
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 {
            return None;
        }
        i += 1 + len;
    }
    msg.get(12..i + 5)
}

/// Parses an upstream answer and checks it answers `q` (id, QR, question).
pub(crate) fn check_answer(
    server: SocketAddr,
    bytes: &[u8],
    q: &Message,
) -> Result<Message, ForwardError> {
    let invalid = |why: &str| ForwardError::Invalid {
        server,
        why: why.to_string(),
    };
    let m = Message::from_vec(bytes).map_err(|e| invalid(&e.to_string()))?;
    if m.metadata.id != q.metadata.id || m.metadata.message_type != MessageType::Response {
        return Err(invalid("id or QR mismatch"));
    }
    let same_question = match (m.queries.first(), q.queries.first()) {
        (Some(a), Some(b)) => {
            a.query_type() == b.query_type()
                && a.query_class() == b.query_class()
                && a.name() == b.name()
        }
        // Some servers omit the question in error answers (see `answers`).
        (None, _) => questionless_error(u16::from(m.metadata.response_code)),
        _ => false,
    };
    if !same_question {
        return Err(invalid("question mismatch"));
    }
    Ok(m)
}
