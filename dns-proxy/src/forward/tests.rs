//! Forwarding tests against fake upstreams on loopback.

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use hickory_proto::op::{MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

use super::pool::SOCKETS_PER_UPSTREAM;
use super::*;
use crate::datagrams::ClientReply;

fn query() -> Message {
    let mut m = Message::new(42, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(
        Name::from_ascii("a.example.com.").unwrap(),
        RecordType::A,
    ));
    m
}

/// A fake upstream on loopback: answers with `rcode` after `delay`, or never when `None`.
async fn fake(rcode: Option<ResponseCode>, delay: Duration) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                return;
            };
            let Some(rcode) = rcode else { continue };
            let req = Message::from_vec(&buf[..n]).unwrap();
            assert!(
                req.edns.as_ref().is_some_and(|e| e.max_payload() >= 1232),
                "EDNS advertised"
            );
            let mut resp = req.clone();
            resp.metadata.message_type = MessageType::Response;
            resp.metadata.response_code = rcode;
            tokio::time::sleep(delay).await;
            let _ = sock.send_to(&resp.to_vec().unwrap(), from).await;
        }
    });
    addr
}

fn fwd(upstreams: Vec<SocketAddr>, parallel: bool) -> Forwarder {
    Forwarder::new(
        upstreams,
        Duration::from_millis(300),
        parallel,
        1232,
        CancellationToken::new(),
    )
}

#[tokio::test]
async fn next_server_after_timeout_and_servfail() {
    let dead = fake(None, Duration::ZERO).await;
    let failing = fake(Some(ResponseCode::ServFail), Duration::ZERO).await;
    let good = fake(Some(ResponseCode::NXDomain), Duration::ZERO).await;
    for parallel in [false, true] {
        let f = fwd(vec![dead, failing, good], parallel);
        let m = f.forward(&query(), Transport::Udp).await.unwrap();
        assert_eq!(
            m.metadata.response_code,
            ResponseCode::NXDomain,
            "parallel={parallel}"
        );
        assert_eq!(m.metadata.id, 42);
    }
    let f = fwd(vec![dead, failing], false);
    let m = f.forward(&query(), Transport::Udp).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    let f = fwd(vec![dead], false);
    assert!(matches!(
        f.forward(&query(), Transport::Udp).await,
        Err(ForwardError::Timeout { .. })
    ));
    let f = fwd(vec![], false);
    assert!(matches!(
        f.forward(&query(), Transport::Udp).await,
        Err(ForwardError::NoUpstreams)
    ));
}

#[test]
fn rejects_foreign_answers() {
    let server: SocketAddr = "127.0.0.1:53".parse().unwrap();
    let q = query();
    let mut other = q.clone();
    other.metadata.message_type = MessageType::Response;
    other.metadata.id = 43;
    assert!(check_answer(server, &other.to_vec().unwrap(), &q).is_err());
    other.metadata.id = 42;
    assert!(check_answer(server, &other.to_vec().unwrap(), &q).is_ok());
    other.queries[0] = Query::query(Name::from_ascii("b.example.com.").unwrap(), RecordType::A);
    assert!(check_answer(server, &other.to_vec().unwrap(), &q).is_err());
    assert!(check_answer(server, &[1, 2, 3], &q).is_err());
}

/// An error answer may omit the question (some servers' SERVFAIL, REFUSED), but an NXDOMAIN
/// must echo it: it would be cached, and without the question anyone who guessed the id could
/// forge one. Both matchers (wire and parsed) say the same.
#[test]
fn only_error_answers_may_omit_the_question() {
    let server: SocketAddr = "127.0.0.1:53".parse().unwrap();
    let q = query();
    let question = question_bytes(&q.to_vec().unwrap()).unwrap().to_vec();
    for (rcode, accepted) in [
        (ResponseCode::ServFail, true),
        (ResponseCode::Refused, true),
        (ResponseCode::FormErr, true),
        (ResponseCode::NXDomain, false),
        (ResponseCode::NoError, false),
    ] {
        let mut a = q.clone();
        a.metadata.message_type = MessageType::Response;
        a.metadata.response_code = rcode;
        a.queries.clear();
        let wire = a.to_vec().unwrap();
        assert_eq!(
            check_answer(server, &wire, &q).is_ok(),
            accepted,
            "{rcode:?}"
        );
        assert_eq!(
            matching::answers(&wire, &question),
            accepted,
            "{rcode:?} on the wire"
        );
    }
}

/// An upstream answering A questions with 192.0.2.1, after `spoof` has had its go at the
/// proxy's socket; records the source port and id of every query.
async fn recording<F>(spoof: F) -> (SocketAddr, Arc<Mutex<Vec<(u16, u16)>>>)
where
    F: Fn(&Message) -> Vec<(bool, Message)> + Send + 'static,
{
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let other = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                return;
            };
            let req = Message::from_vec(&buf[..n]).unwrap();
            s.lock().unwrap().push((from.port(), req.metadata.id));
            // Spoofs first: (from the upstream's own port?, message).
            for (own_port, m) in spoof(&req) {
                let via = if own_port { &sock } else { &other };
                via.send_to(&m.to_vec().unwrap(), from).await.unwrap();
            }
            let _ = sock
                .send_to(&a_answer(&req, "192.0.2.1").to_vec().unwrap(), from)
                .await;
        }
    });
    (addr, seen)
}

fn a_answer(req: &Message, ip: &str) -> Message {
    let mut resp = req.clone();
    resp.metadata.message_type = MessageType::Response;
    resp.add_answer(hickory_proto::rr::Record::from_rdata(
        req.queries[0].name().clone(),
        60,
        hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A(ip.parse().unwrap())),
    ));
    resp
}

/// Spoofed answers to `req`: one with another id (6.6.6.2), one for another question
/// (6.6.6.3).
fn wrong_id_and_question(req: &Message) -> (Message, Message) {
    let mut wrong_id = a_answer(req, "6.6.6.2");
    wrong_id.metadata.id ^= 1;
    let mut wrong_question = a_answer(req, "6.6.6.3");
    wrong_question.queries[0] =
        Query::query(Name::from_ascii("b.example.com.").unwrap(), RecordType::A);
    (wrong_id, wrong_question)
}

fn ips(m: &Message) -> Vec<String> {
    m.answers.iter().map(|r| r.data.to_string()).collect()
}

#[tokio::test]
async fn spoofed_answers_are_ignored() {
    let (up, seen) = recording(|req| {
        let (wrong_id, wrong_question) = wrong_id_and_question(req);
        let mut not_a_response = a_answer(req, "6.6.6.4");
        not_a_response.metadata.message_type = MessageType::Query;
        let mut wrong_type = a_answer(req, "6.6.6.5");
        wrong_type.queries[0].set_query_type(RecordType::AAAA);
        vec![
            // Right id and question, from another port.
            (false, a_answer(req, "6.6.6.1")),
            (true, wrong_id),
            (true, wrong_question),
            (true, not_a_response),
            (true, wrong_type),
        ]
    })
    .await;
    let f = fwd(vec![up], false);
    for _ in 0..20 {
        let m = f.forward(&query(), Transport::Udp).await.unwrap();
        assert_eq!(ips(&m), vec!["192.0.2.1"]);
        assert_eq!(m.metadata.id, 42);
        // The wire path gets the same treatment.
        let bytes = query().to_vec().unwrap();
        let Raw(raw) = f.forward_bytes(bytes, Transport::Udp).await.unwrap();
        assert_eq!(u16::from_be_bytes([raw[0], raw[1]]), 42, "caller's id back");
        assert_eq!(ips(&Message::from_vec(&raw).unwrap()), vec!["192.0.2.1"]);
    }
    // Ids on the wire are random per upstream query, never the client's.
    let ids: std::collections::HashSet<u16> =
        seen.lock().unwrap().iter().map(|&(_, id)| id).collect();
    assert!(ids.len() >= 35, "{} distinct ids in 40 queries", ids.len());
}

#[tokio::test]
async fn upstream_sockets_rotate() {
    let (up, seen) = recording(|_| Vec::new()).await;
    // After 4 queries per socket: 200 queries over 8 sockets open 50 to 58 sockets.
    let f = fwd(vec![up], false).with_rotation(4, Duration::from_secs(3600));
    let first = {
        f.forward(&query(), Transport::Udp).await.unwrap();
        f.pool.chans(up)
    };
    assert_eq!(first.len(), 1);
    for _ in 1..200 {
        let m = f.forward(&query(), Transport::Udp).await.unwrap();
        assert_eq!(ips(&m), vec!["192.0.2.1"]);
    }
    let opened = f.pool.opened.load(Ordering::Relaxed);
    assert!((50..=58).contains(&opened), "{opened} sockets opened");
    let ports: std::collections::HashSet<u16> =
        seen.lock().unwrap().iter().map(|&(port, _)| port).collect();
    assert!(ports.len() > 40, "{} source ports", ports.len());
    // Retired sockets are closed once their queries are done.
    for _ in 0..100 {
        if first[0].upgrade().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(first[0].upgrade().is_none(), "first socket closed");
    assert!(f.pool.chans(up).len() <= SOCKETS_PER_UPSTREAM);

    // By age: a zero lifetime means a fresh socket (and port) for every query.
    let f = fwd(vec![up], false).with_rotation(u32::MAX, Duration::ZERO);
    for _ in 0..20 {
        f.forward(&query(), Transport::Udp).await.unwrap();
    }
    assert_eq!(f.pool.opened.load(Ordering::Relaxed), 20);
    // Without rotation due: at most one socket per slot.
    let f = fwd(vec![up], false);
    for _ in 0..50 {
        f.forward(&query(), Transport::Udp).await.unwrap();
    }
    assert!(f.pool.opened.load(Ordering::Relaxed) <= SOCKETS_PER_UPSTREAM as u64);
}

#[tokio::test]
async fn answer_for_a_retired_socket_still_arrives() {
    // Every query opens a new socket while the previous ones still wait for their answer.
    let (up, _) = recording(|_| Vec::new()).await;
    let f = Arc::new(fwd(vec![up], false).with_rotation(1, Duration::from_secs(3600)));
    let mut set = JoinSet::new();
    for _ in 0..50 {
        let f = f.clone();
        set.spawn(async move { f.forward(&query(), Transport::Udp).await });
    }
    while let Some(r) = set.join_next().await {
        assert_eq!(ips(&r.unwrap().unwrap()), vec!["192.0.2.1"]);
    }
}

/// A relay end handing the result to a channel.
struct ToChannel(oneshot::Sender<Result<Vec<u8>, ForwardError>>);

impl Relay for ToChannel {
    fn finish(self: Box<Self>, result: Result<Vec<u8>, ForwardError>) -> Option<ClientReply> {
        let _ = self.0.send(result);
        None
    }
}

async fn relay(f: &Forwarder, query: &Message) -> Result<Message, ForwardError> {
    let (tx, rx) = oneshot::channel();
    let mut q = query.clone();
    q.set_edns(hickory_proto::op::Edns::new());
    if let Some(e) = q.edns.as_mut() {
        e.set_max_payload(1232);
    }
    assert!(
        f.relay(q.to_vec().unwrap(), Box::new(ToChannel(tx)))
            .is_none()
    );
    let raw = rx.await.unwrap()?;
    Ok(Message::from_vec(&raw).unwrap())
}

#[tokio::test]
async fn relayed_queries_time_out_and_move_on() {
    let dead = fake(None, Duration::ZERO).await;
    let failing = fake(Some(ResponseCode::ServFail), Duration::ZERO).await;
    let good = fake(Some(ResponseCode::NXDomain), Duration::ZERO).await;
    assert!(!fwd(vec![dead, good], true).can_relay());
    assert!(fwd(vec![dead], true).can_relay());
    for _ in 0..3 {
        let f = fwd(vec![dead, failing, good], false);
        let m = relay(&f, &query()).await.unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(m.metadata.id, 42);
    }
    let f = fwd(vec![dead, failing], false);
    let m = relay(&f, &query()).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    let f = fwd(vec![dead], false);
    assert!(matches!(
        relay(&f, &query()).await,
        Err(ForwardError::Timeout { .. })
    ));
    assert_eq!(f.pool.relays.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn relayed_queries_ignore_spoofs_and_survive_rotation() {
    let (up, seen) = recording(|req| {
        let (wrong_id, wrong_question) = wrong_id_and_question(req);
        vec![
            (false, a_answer(req, "6.6.6.1")),
            (true, wrong_id),
            (true, wrong_question),
        ]
    })
    .await;
    // A new socket every 2 queries while earlier ones still wait for their answers. Nothing
    // here is about timeouts: a generous one keeps a loaded machine from failing the test.
    let f = Forwarder::new(
        vec![up],
        Duration::from_secs(10),
        false,
        1232,
        CancellationToken::new(),
    );
    let f = Arc::new(f.with_rotation(2, Duration::from_secs(3600)));
    let mut set = JoinSet::new();
    for _ in 0..40 {
        let f = f.clone();
        set.spawn(async move { relay(&f, &query()).await });
    }
    while let Some(r) = set.join_next().await {
        let m = r.unwrap().unwrap();
        assert_eq!(ips(&m), vec!["192.0.2.1"]);
        assert_eq!(m.metadata.id, 42);
    }
    let seen = seen.lock().unwrap();
    let ids: std::collections::HashSet<u16> = seen.iter().map(|&(_, id)| id).collect();
    assert!(ids.len() >= 35, "{} distinct ids in 40 queries", ids.len());
    let ports: std::collections::HashSet<u16> = seen.iter().map(|&(p, _)| p).collect();
    assert!(ports.len() >= 15, "{} source ports", ports.len());
    assert_eq!(f.pool.relays.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn truncated_relayed_answer_retried_over_tcp() {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let udp = UdpSocket::bind(addr).await.unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let mut resp = Message::from_vec(&buf[..n]).unwrap();
            resp.metadata.message_type = MessageType::Response;
            resp.metadata.truncation = true;
            let _ = udp.send_to(&resp.to_vec().unwrap(), from).await;
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            let mut len = [0u8; 2];
            s.read_exact(&mut len).await.unwrap();
            let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
            s.read_exact(&mut q).await.unwrap();
            let a = a_answer(&Message::from_vec(&q).unwrap(), "192.0.2.7")
                .to_vec()
                .unwrap();
            s.write_all(&(a.len() as u16).to_be_bytes()).await.unwrap();
            s.write_all(&a).await.unwrap();
        }
    });
    let f = fwd(vec![addr], false);
    let m = relay(&f, &query()).await.unwrap();
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    assert_eq!(m.metadata.id, 42);
    assert!(!m.metadata.truncation);
}
