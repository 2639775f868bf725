//! Request-path tests against a bound proxy on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::answer::fuzz::{fuzz_request, fuzz_upstream_answer};
use crate::packet::OUR_UDP_PAYLOAD;
use crate::table::tests::sample;

fn config(upstreams: Vec<SocketAddr>) -> Config {
    Config {
        listen_addrs: vec!["127.0.0.1:0".parse().unwrap()],
        upstreams,
        search_domains: vec!["ns1.svc.cluster.local".into()],
        forward_timeout: Duration::from_millis(300),
        forward_parallel: false,
        cache_enabled: true,
        cache_max_entries: 100,
        cache_max_bytes: 1 << 20,
        // Istio's behaviour unless a test turns them on.
        serve_stale: None,
        prefetch: false,
        access_log: false,
        namespace: "ns1".into(),
        domain: "ns1.svc.cluster.local".into(),
        respond_before_sync: false,
        max_in_flight: 16,
        max_tcp_connections: 4,
        tcp_idle_timeout: Duration::from_secs(2),
        tcp_write_timeout: Duration::from_secs(5),
        upstream_udp_payload: 1232,
        resolv_conf: "/dev/null".into(),
    }
}

struct Running {
    addr: SocketAddr,
    table: TableHandle,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

async fn start(config: Config) -> Running {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let proxy = DnsProxy::bind(config, metrics.clone()).await.expect("bind");
    let addr = proxy.local_addrs()[0];
    let table = proxy.table();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(proxy.run(shutdown.clone()));
    Running {
        addr,
        table,
        metrics,
        shutdown,
        task,
    }
}

fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Message {
    let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m
}

async fn udp_raw(addr: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(bytes, addr).await.unwrap();
    let mut buf = vec![0u8; 65535];
    match tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf)).await {
        Ok(Ok(n)) => Some(buf[..n].to_vec()),
        _ => None,
    }
}

async fn udp(addr: SocketAddr, q: &Message) -> (Message, usize) {
    let raw = udp_raw(addr, &q.to_vec().unwrap()).await.expect("answer");
    (Message::from_vec(&raw).expect("parse answer"), raw.len())
}

async fn tcp(addr: SocketAddr, q: &Message) -> Message {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let b = q.to_vec().unwrap();
    s.write_all(&(b.len() as u16).to_be_bytes()).await.unwrap();
    s.write_all(&b).await.unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.unwrap();
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

fn ips(m: &Message) -> Vec<String> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0.to_string()),
            RData::AAAA(a) => Some(a.0.to_string()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn servfail_until_synced_then_local_answers() {
    let p = start(config(vec![])).await;
    let (m, _) = udp(p.addr, &query("productpage.", RecordType::A, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    p.table.update(&sample());
    let (m, _) = udp(p.addr, &query("ProductPage.", RecordType::A, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.metadata.authoritative);
    assert_eq!(m.metadata.id, 0x1234);
    assert_eq!(ips(&m), vec!["10.0.0.1"]);
    assert_eq!(m.answers[0].ttl, 30);
    assert_eq!(
        m.queries[0].name().to_ascii(),
        "ProductPage.",
        "question echoed as sent"
    );
    assert!(m.edns.is_none(), "no OPT for a client without EDNS");
    // Known name, missing family: NOERROR, empty.
    let (m, _) = udp(p.addr, &query("productpage.", RecordType::AAAA, Some(1232))).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty());
    assert!(m.edns.is_some(), "OPT echoed for an EDNS client");
    assert!(p.metrics.requests.get() >= 3);
    p.shutdown.cancel();
    p.task.await.unwrap().unwrap();
}

/// A TCP client that sends queries without end and never reads its answers (its receive buffer
/// 4 KiB): its writes fail once the proxy has closed the connection; the instant they began
/// failing, after `started`.
async fn tcp_never_reading(addr: SocketAddr, q: &Message) -> tokio::task::JoinHandle<Duration> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let b = q.to_vec().unwrap();
    let mut framed = (b.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&b);
    let many = framed.repeat(64);
    let started = tokio::time::Instant::now();
    tokio::spawn(async move {
        while s.write_all(&many).await.is_ok() {}
        started.elapsed()
    })
}

fn many_answers_table() -> proto::istio::nds::NameTable {
    let mut nt = sample();
    let many: Vec<String> = (0..60).map(|i| format!("10.1.0.{i}")).collect();
    nt.table.insert(
        "many.example.com".into(),
        crate::table::tests::plain(&many.iter().map(String::as_str).collect::<Vec<_>>()),
    );
    nt
}

/// Clients that query over TCP and never read hold no slot past the write timeout, and while
/// they hold them a new client takes the slot of one of them.
#[tokio::test]
async fn tcp_clients_that_never_read_are_closed_and_make_room() {
    let mut c = config(vec![]);
    c.tcp_write_timeout = Duration::from_millis(500);
    c.tcp_idle_timeout = Duration::from_secs(30);
    let p = start(c).await;
    p.table.update(&many_answers_table());
    let q = query("many.example.com.", RecordType::A, None);
    let mut stalled = Vec::new();
    for _ in 0..4 {
        stalled.push(tcp_never_reading(p.addr, &q).await);
    }
    for writer in stalled {
        let failed_after = tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .expect("the proxy closed the connection within 5 s")
            .unwrap();
        assert!(failed_after < Duration::from_secs(5), "{failed_after:?}");
    }
    p.shutdown.cancel();

    // The slots full of clients not reading (within their write timeout): a new client is
    // answered, in the slot of the one stalled the longest.
    let mut c = config(vec![]);
    c.tcp_write_timeout = Duration::from_secs(30);
    c.tcp_idle_timeout = Duration::from_secs(30);
    let p = start(c).await;
    p.table.update(&many_answers_table());
    let mut stalled = Vec::new();
    for _ in 0..4 {
        stalled.push(tcp_never_reading(p.addr, &q).await);
    }
    // Every one of them stalled on its answers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..3 {
        let m = tokio::time::timeout(Duration::from_secs(2), tcp(p.addr, &q))
            .await
            .unwrap_or_else(|_| panic!("client {i} answered with the slots full"));
        assert_eq!(m.answers.len(), 60);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let closed = stalled.iter().filter(|w| w.is_finished()).count();
    assert!(closed >= 1, "a new client took a non-reader's slot");
    p.shutdown.cancel();
}

#[tokio::test]
async fn truncation_follows_client_size() {
    let p = start(config(vec![])).await;
    let mut nt = sample();
    let many: Vec<String> = (0..60).map(|i| format!("10.1.0.{i}")).collect();
    nt.table.insert(
        "many.example.com".into(),
        crate::table::tests::plain(&many.iter().map(String::as_str).collect::<Vec<_>>()),
    );
    p.table.update(&nt);
    let (m, len) = udp(p.addr, &query("many.example.com.", RecordType::A, None)).await;
    assert!(m.metadata.truncation && len <= 512 && !m.answers.is_empty() && m.answers.len() < 60);
    let (m, _) = udp(
        p.addr,
        &query("many.example.com.", RecordType::A, Some(4096)),
    )
    .await;
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 60);
    let m = tcp(p.addr, &query("many.example.com.", RecordType::A, None)).await;
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 60);
    // Shuffled: the order changes across answers.
    let mut orders = std::collections::HashSet::new();
    for _ in 0..5 {
        orders.insert(ips(&tcp(
            p.addr,
            &query("many.example.com.", RecordType::A, None),
        )
        .await));
    }
    assert!(orders.len() > 1);
    p.shutdown.cancel();
}

#[tokio::test]
async fn malformed_input_gets_formerr_or_is_dropped() {
    let p = start(config(vec![])).await;
    p.table.update(&sample());
    // Header claims a question that is not there.
    let raw = udp_raw(
        p.addr,
        &[0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xff],
    )
    .await
    .unwrap();
    let m = Message::from_vec(&raw).unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    assert_eq!(m.metadata.id, 0xabcd);
    // Too short, or a response: silence.
    assert!(udp_raw(p.addr, &[1, 2, 3]).await.is_none());
    let mut resp = query("productpage.", RecordType::A, None);
    resp.metadata.message_type = MessageType::Response;
    assert!(udp_raw(p.addr, &resp.to_vec().unwrap()).await.is_none());
    // EDNS version 1: BADVERS.
    let mut q = query("productpage.", RecordType::A, Some(1232));
    q.edns.as_mut().unwrap().set_version(1);
    let (m, _) = udp(p.addr, &q).await;
    // 16 is BADVERS in an answer carrying OPT (hickory names it BADSIG when decoding).
    assert_eq!(u16::from(m.metadata.response_code), 16);
    assert!(m.edns.is_some());
    // Two questions: FORMERR.
    let mut q = query("productpage.", RecordType::A, None);
    q.add_query(Query::query(Name::from_ascii("b.").unwrap(), RecordType::A));
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    assert!(m.queries.is_empty(), "the header alone, as Istio's: {m:?}");
    // An opcode other than QUERY (STATUS): NOTIMP, the header alone.
    let mut q = query("productpage.", RecordType::A, Some(1232));
    q.metadata.op_code = OpCode::Status;
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    assert_eq!(m.metadata.op_code, OpCode::Status);
    assert!(m.queries.is_empty() && m.edns.is_none(), "{m:?}");
    // No question (with EDNS): FORMERR, the header alone.
    let mut q = query("productpage.", RecordType::A, Some(1232));
    q.queries.clear();
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    assert!(m.queries.is_empty() && m.edns.is_none(), "{m:?}");
    // Still serving.
    let (m, _) = udp(p.addr, &query("productpage.", RecordType::A, None)).await;
    assert_eq!(ips(&m), vec!["10.0.0.1"]);
    p.shutdown.cancel();
}

/// A fake upstream answering every A question with 192.0.2.1 (TTL 60), counting queries.
/// An upstream answering A queries with `ttl`, silent while `answering` is false.
async fn switchable_upstream(
    ttl: u32,
) -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let (count, answering) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(true)),
    );
    let (c, on) = (count.clone(), answering.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, from)) = sock.recv_from(&mut buf).await {
            if !on.load(Ordering::SeqCst) {
                continue;
            }
            c.fetch_add(1, Ordering::SeqCst);
            let req = Message::from_vec(&buf[..n]).unwrap();
            let mut resp = req.clone();
            resp.metadata.message_type = MessageType::Response;
            let name = req.queries[0].name().clone();
            resp.add_answer(hickory_proto::rr::Record::from_rdata(
                name,
                ttl,
                RData::A(hickory_proto::rr::rdata::A("192.0.2.7".parse().unwrap())),
            ));
            let _ = sock.send_to(&resp.to_vec().unwrap(), from).await;
        }
    });
    (addr, count, answering)
}

/// RFC 8767: with every upstream silent, an expired answer is given with the stale TTL (after
/// one forward timed out; then at once, without asking upstream, for the stale TTL); once the
/// upstream answers again, fresh answers resume. Without serve-stale (Istio): SERVFAIL.
#[tokio::test]
async fn serve_stale_when_every_upstream_fails() {
    use std::sync::atomic::Ordering;
    let (up, count, answering) = switchable_upstream(1).await;
    let mut c = config(vec![up]);
    c.serve_stale = Some(crate::StalePolicy {
        max_stale: Duration::from_secs(3600),
        stale_ttl: Duration::from_secs(2),
        client_timer: crate::cache::DEFAULT_CLIENT_TIMER,
    });
    let p = start(c.clone()).await;
    p.table.update(&sample());
    let q = query("stale.test.", RecordType::A, None);
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    answering.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Expired; the upstream times out (300 ms): the stale answer, TTL 2 s.
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    assert_eq!(m.answers[0].ttl, 2);
    assert_eq!(p.metrics.stale_answers.get(), 1);
    // Within the stale TTL of that failure: answered at once, upstream not asked.
    let asked = p.metrics.upstream_requests.get();
    let t = std::time::Instant::now();
    let (m, _) = udp(p.addr, &q).await;
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    assert_eq!(p.metrics.upstream_requests.get(), asked);
    assert_eq!(p.metrics.stale_answers.get(), 2);
    // Over TCP (the Message path) too.
    let m = tcp(p.addr, &q).await;
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    // The upstream is back: after the stale TTL, a fresh answer (TTL 1) from it.
    answering.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let before = count.load(Ordering::SeqCst);
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(count.load(Ordering::SeqCst), before + 1);
    assert_eq!(m.answers[0].ttl, 1);
    p.shutdown.cancel();

    // Istio's behaviour (serve-stale off): SERVFAIL once the answer expired.
    c.serve_stale = None;
    let p = start(c).await;
    p.table.update(&sample());
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    answering.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    p.shutdown.cancel();
}

/// An upstream that answers each UDP query `delay` after it came (`u64::MAX` ms: never, a
/// silent upstream that drops queries without an ICMP error); counts the answers it sent. Over
/// TCP, on the same port, it accepts and never answers.
async fn delayed_upstream(
    ttl: u32,
) -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let addr = sock.local_addr().unwrap();
    let (answered, delay_ms) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(0)));
    let (a, d) = (answered.clone(), delay_ms.clone());
    let tcp = TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = tcp.accept().await {
            held.push(s);
        }
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, from)) = sock.recv_from(&mut buf).await {
            let delay = d.load(Ordering::SeqCst);
            if delay == u64::MAX {
                continue;
            }
            let req = Message::from_vec(&buf[..n]).unwrap();
            let (sock, a) = (sock.clone(), a.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let mut resp = req.clone();
                resp.metadata.message_type = MessageType::Response;
                let name = req.queries[0].name().clone();
                resp.add_answer(hickory_proto::rr::Record::from_rdata(
                    name,
                    ttl,
                    RData::A(hickory_proto::rr::rdata::A("192.0.2.7".parse().unwrap())),
                ));
                let _ = sock.send_to(&resp.to_vec().unwrap(), from).await;
                a.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, answered, delay_ms)
}

/// One UDP query, its answer waited for up to 6 s (past Istio's forward timeout).
async fn udp_slow(addr: SocketAddr, q: &Message) -> Message {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&q.to_vec().unwrap(), addr).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_secs(6), sock.recv(&mut buf))
        .await
        .expect("an answer within 6 s")
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

/// RFC 8767's client response timer, with Istio's 5 s forward timeout: a cached name whose
/// upstream is silent (drops queries, no ICMP) gets its stale answer after the timer (1.8 s),
/// not the forward timeout; the query goes on, and a late answer refreshes the cache; once the
/// upstream is known down (a forward timed out), stale answers come at once.
#[tokio::test]
async fn stale_answer_within_the_client_timer() {
    use std::sync::atomic::Ordering;
    let (up, answered, delay_ms) = delayed_upstream(1).await;
    let mut c = config(vec![up]);
    c.forward_timeout = crate::DEFAULT_FORWARD_TIMEOUT;
    c.serve_stale = Some(crate::StalePolicy {
        stale_ttl: Duration::from_secs(3),
        ..crate::StalePolicy::default()
    });
    let p = start(c).await;
    p.table.update(&sample());
    let q = query("slow.test.", RecordType::A, None);
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    assert_eq!(m.answers[0].ttl, 1);

    // Slower than the timer: the stale answer at 1.8 s, then the late answer refreshes it.
    delay_ms.store(2500, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let t = std::time::Instant::now();
    let m = udp_slow(p.addr, &q).await;
    let waited = t.elapsed();
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    assert_eq!(m.answers[0].ttl, 3, "the stale TTL");
    assert!(
        waited >= Duration::from_millis(1700) && waited < Duration::from_secs(3),
        "stale answer after {waited:?}"
    );
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while answered.load(Ordering::SeqCst) < 2 {
        assert!(
            std::time::Instant::now() < until,
            "the upstream answered late"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let asked = p.metrics.upstream_requests.get();
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(
        m.answers[0].ttl, 1,
        "fresh from the cache: refreshed by the late answer"
    );
    assert_eq!(p.metrics.upstream_requests.get(), asked);

    // A silent upstream: the timer again (UDP and TCP), and no wait once it is known down.
    delay_ms.store(u64::MAX, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let t = std::time::Instant::now();
    let m = udp_slow(p.addr, &q).await;
    let silent = t.elapsed();
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    assert!(
        silent >= Duration::from_millis(1700) && silent < Duration::from_secs(3),
        "stale answer after {silent:?}"
    );
    let t = std::time::Instant::now();
    let m = tcp(p.addr, &q).await;
    let over_tcp = t.elapsed();
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    assert!(
        over_tcp >= Duration::from_millis(1700) && over_tcp < Duration::from_secs(3),
        "stale answer over TCP after {over_tcp:?}"
    );
    // The first silent forward times out 5 s after it began: the upstream is down.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let t = std::time::Instant::now();
    let (m, _) = udp(p.addr, &q).await;
    let known_down = t.elapsed();
    assert_eq!(ips(&m), vec!["192.0.2.7"]);
    assert!(known_down < Duration::from_millis(250), "{known_down:?}");
    eprintln!(
        "stale answer: upstream slower than the timer {waited:?}, silent {silent:?} (TCP \
         {over_tcp:?}), known down {known_down:?}"
    );
    p.shutdown.cancel();
}

/// Prefetch: a name asked for in the last tenth of its TTL is answered from the cache and
/// refreshed upstream in the background, so it never expires while in use.
#[tokio::test]
async fn prefetch_refreshes_a_name_before_it_expires() {
    use std::sync::atomic::Ordering;
    let (up, count, _answering) = switchable_upstream(10).await;
    let mut c = config(vec![up]);
    c.serve_stale = Some(crate::StalePolicy::default());
    c.prefetch = true;
    let p = start(c).await;
    p.table.update(&sample());
    let q = query("busy.test.", RecordType::A, None);
    udp(p.addr, &q).await;
    assert_eq!(count.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(9200)).await;
    let (m, _) = udp(p.addr, &q).await;
    assert_eq!(ips(&m), vec!["192.0.2.7"], "answered from the cache");
    assert!(m.answers[0].ttl <= 1);
    for _ in 0..50 {
        if count.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        count.load(Ordering::SeqCst),
        2,
        "refreshed in the background"
    );
    assert_eq!(p.metrics.prefetches.get(), 1);
    // The refreshed answer: a full TTL again, from the cache.
    let (m, _) = udp(p.addr, &q).await;
    assert!(m.answers[0].ttl >= 9, "{}", m.answers[0].ttl);
    assert_eq!(count.load(Ordering::SeqCst), 2);
    p.shutdown.cancel();
}

/// `DNS_PROXY_ACCESS_LOG`: one line per query, saying where its answer came from.
#[tokio::test]
async fn access_log_says_where_each_answer_came_from() {
    #[derive(Clone, Default)]
    struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }
    let buf = Buf::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(buf.clone())
        .with_ansi(false)
        .finish();
    // Global: the UDP listener's receive loops may run on other threads (each test is its own
    // process under nextest).
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let (up, _count, _stop) = fake_upstream().await;
    let mut c = config(vec![up]);
    c.access_log = true;
    let p = start(c).await;
    p.table.update(&sample());
    udp(p.addr, &query("productpage.", RecordType::A, None)).await;
    udp(p.addr, &query("external.test.", RecordType::A, None)).await;
    udp(p.addr, &query("external.test.", RecordType::A, None)).await;
    tcp(p.addr, &query("other.test.", RecordType::A, None)).await;
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("dns query")).collect();
    assert_eq!(lines.len(), 4, "{text}");
    for (line, name, from) in [
        (lines[0], "productpage.", "table"),
        (lines[1], "external.test.", "upstream"),
        (lines[2], "external.test.", "cache"),
        // Over TCP the (UDP-only) fake upstream refuses: SERVFAIL made here.
        (lines[3], "other.test.", "local"),
    ] {
        assert!(line.contains(&format!("name={name}")), "{line}");
        assert!(
            line.contains(&format!("from=\"{from}\"")) || line.contains(&format!("from={from}")),
            "{line}"
        );
        assert!(
            line.contains("qtype=A") && line.contains("client=127.0.0.1:"),
            "{line}"
        );
        assert!(line.contains("latency_us="), "{line}");
    }
    p.shutdown.cancel();
}

async fn fake_upstream() -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicUsize>,
    CancellationToken,
) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let (c, s) = (count.clone(), stop.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, from) = tokio::select! {
                _ = s.cancelled() => return,
                r = sock.recv_from(&mut buf) => r.unwrap(),
            };
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let req = Message::from_vec(&buf[..n]).unwrap();
            let mut resp = req.clone();
            resp.metadata.message_type = MessageType::Response;
            let name = req.queries[0].name().clone();
            resp.add_answer(hickory_proto::rr::Record::from_rdata(
                name,
                60,
                RData::A(hickory_proto::rr::rdata::A("192.0.2.1".parse().unwrap())),
            ));
            let _ = sock.send_to(&resp.to_vec().unwrap(), from).await;
        }
    });
    (addr, count, stop)
}

#[tokio::test]
async fn forwards_caches_and_strips_opt() {
    let (up, count, stop) = fake_upstream().await;
    let p = start(config(vec![up])).await;
    p.table.update(&sample());
    let (m, _) = udp(p.addr, &query("external.test.", RecordType::A, None)).await;
    assert_eq!(ips(&m), vec!["192.0.2.1"]);
    assert!(
        m.edns.is_none(),
        "upstream OPT not passed to a non-EDNS client"
    );
    assert_eq!(m.metadata.id, 0x1234);
    // Known host, other type: forwarded.
    let (m, _) = udp(p.addr, &query("www.example.com.", RecordType::TXT, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 2);
    stop.cancel();
    let (m, _) = udp(p.addr, &query("EXTERNAL.test.", RecordType::A, None)).await;
    assert_eq!(ips(&m), vec!["192.0.2.1"], "served from cache");
    assert!(m.answers[0].ttl <= 60);
    assert_eq!(p.metrics.cache_hits.get(), 1);
    assert_eq!(p.metrics.upstream_requests.get(), 2);
    // Uncached while the upstream is down: SERVFAIL after the timeout.
    let m = tcp(p.addr, &query("other.test.", RecordType::A, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(p.metrics.upstream_failures.get(), 1);
    p.shutdown.cancel();
}

#[tokio::test]
async fn respond_before_sync_forwards() {
    let (up, _count, _stop) = fake_upstream().await;
    let mut c = config(vec![up]);
    c.respond_before_sync = true;
    let p = start(c).await;
    let (m, _) = udp(p.addr, &query("external.test.", RecordType::A, None)).await;
    assert_eq!(ips(&m), vec!["192.0.2.1"]);
    p.shutdown.cancel();
}

#[tokio::test]
async fn overload_gets_servfail_not_a_crash() {
    // An upstream that never answers, and room for one forward at a time.
    let black_hole = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut c = config(vec![black_hole.local_addr().unwrap()]);
    c.max_in_flight = 1;
    c.forward_timeout = Duration::from_secs(2);
    let p = start(c).await;
    p.table.update(&sample());
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for i in 0..3u16 {
        let mut q = query("slow.test.", RecordType::A, None);
        q.metadata.id = i;
        sock.send_to(&q.to_vec().unwrap(), p.addr).await.unwrap();
    }
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(1), sock.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let m = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(m.metadata.id > 0, "an excess query was refused at once");
    // Local answers are unaffected.
    let (m, _) = udp(p.addr, &query("productpage.", RecordType::A, None)).await;
    assert_eq!(ips(&m), vec!["10.0.0.1"]);
    p.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(1), p.task)
        .await
        .expect("shutdown is prompt")
        .unwrap()
        .unwrap();
}

#[test]
fn fuzz_entry_point_survives_samples() {
    let q = query("svc.ns1.svc.cluster.local.", RecordType::A, Some(1232))
        .to_vec()
        .unwrap();
    fuzz_request(&q);
    let q = query("x.test.", RecordType::A, None).to_vec().unwrap();
    fuzz_request(&q);
    for i in 0..q.len() {
        fuzz_request(&q[..i]);
        let mut flipped = q.clone();
        flipped[i] ^= 0xff;
        fuzz_request(&flipped);
    }
}

/// The answer target's seeds: A records (a name pointer to the question, 4 bytes of data)
/// small, repeated to 64 KiB, truncated, over TCP and UDP; the entry point asserts the cache
/// stays within its budget after each.
#[test]
fn upstream_answer_entry_point_keeps_the_cache_in_budget() {
    let record = [0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 18, 0, 1];
    let mut seeds = Vec::new();
    for pick in 0..=255u8 {
        for flags in [0x00, 0x01, 0x02, 0x03, 0x80, 0x81, 0x82, 0xc2, 0x41] {
            let mut d = vec![pick, flags, 0, 200, 0, 0, pick];
            for _ in 0..(usize::from(pick) % 8 + 1) {
                d.extend_from_slice(&record);
            }
            seeds.push(d);
        }
    }
    for d in &seeds {
        fuzz_upstream_answer(d);
    }
    fuzz_upstream_answer(&[]);
    fuzz_upstream_answer(&[1, 2, 3]);
}

#[test]
fn random_packets_never_panic() {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let base = query("svc.ns1.svc.cluster.local.", RecordType::A, Some(1232))
        .to_vec()
        .unwrap();
    for _ in 0..20_000 {
        let mut p = base.clone();
        // Mutate a few bytes, sometimes truncate or extend with noise.
        for _ in 0..rng.random_range(1..6) {
            let i = rng.random_range(0..p.len());
            p[i] = rng.random();
        }
        if rng.random_bool(0.2) {
            p.truncate(rng.random_range(0..p.len()));
        }
        if rng.random_bool(0.2) {
            p.extend((0..rng.random_range(0..64)).map(|_| rng.random::<u8>()));
        }
        fuzz_request(&p);
    }
}

/// An upstream answering every question with `n` A records, echoing the query's OPT record.
async fn many_upstream(n: u8) -> (SocketAddr, CancellationToken) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (len, from) = tokio::select! {
                _ = s.cancelled() => return,
                r = sock.recv_from(&mut buf) => r.unwrap(),
            };
            let req = Message::from_vec(&buf[..len]).unwrap();
            let mut resp = req.clone();
            resp.metadata.message_type = MessageType::Response;
            resp.metadata.recursion_available = true;
            for i in 0..n {
                resp.add_answer(hickory_proto::rr::Record::from_rdata(
                    req.queries[0].name().clone(),
                    60,
                    RData::A(hickory_proto::rr::rdata::A([192, 0, 2, i].into())),
                ));
            }
            let _ = sock.send_to(&resp.to_vec().unwrap(), from).await;
        }
    });
    (addr, stop)
}

#[tokio::test]
async fn wire_forwarding_sizes_answers_and_fails_cleanly() {
    let (up, stop) = many_upstream(60).await;
    let mut c = config(vec![up]);
    c.cache_enabled = false;
    let p = start(c).await;
    p.table.update(&sample());
    // Fits the client's EDNS size: passed through on the wire, with our OPT record.
    let (m, _) = udp(p.addr, &query("Big.Test.", RecordType::A, Some(4096))).await;
    assert_eq!(m.answers.len(), 60);
    assert!(!m.metadata.truncation);
    assert_eq!(m.queries[0].name().to_ascii(), "Big.Test.");
    assert_eq!(m.edns.map(|e| e.max_payload()), Some(OUR_UDP_PAYLOAD));
    assert_eq!(m.metadata.id, 0x1234);
    // Too big for a client without EDNS: cut to 512 bytes with TC, no OPT record.
    let (m, len) = udp(p.addr, &query("big.test.", RecordType::A, None)).await;
    assert!(len <= 512, "{len}");
    assert!(m.metadata.truncation && !m.answers.is_empty() && m.answers.len() < 60);
    assert!(m.edns.is_none());
    assert_eq!(p.metrics.upstream_requests.get(), 2);
    // Upstream gone: SERVFAIL echoing the question, after the timeout.
    stop.cancel();
    let (m, _) = udp(p.addr, &query("gone.test.", RecordType::AAAA, Some(1232))).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(m.queries[0].name().to_ascii(), "gone.test.");
    assert_eq!(m.queries[0].query_type(), RecordType::AAAA);
    assert!(m.metadata.recursion_desired && m.edns.is_some());
    assert_eq!(p.metrics.upstream_failures.get(), 1);
    p.shutdown.cancel();
}
