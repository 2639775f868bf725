//! Forwarding to the resolv.conf nameservers over the protocol the query came in on, with a
//! per-server timeout, the next server tried on failure, or all at once in parallel mode.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use rand::seq::SliceRandom;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;

/// Transport a query arrived on, and is forwarded over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

/// Why forwarding failed (every server failed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    #[error("no upstream nameservers configured")]
    NoUpstreams,
    #[error("upstream {server} timed out")]
    Timeout { server: SocketAddr },
    #[error("upstream {server}: {source}")]
    Io {
        server: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("upstream {server} sent an invalid answer: {why}")]
    Invalid { server: SocketAddr, why: String },
    #[error("cannot encode the upstream query: {0}")]
    Encode(String),
}

#[derive(Clone, Debug)]
pub(crate) struct Forwarder {
    pub upstreams: Vec<SocketAddr>,
    pub timeout: Duration,
    pub parallel: bool,
    pub udp_payload: u16,
    pool: Arc<UdpPool>,
}

impl Forwarder {
    /// A forwarder whose UDP sockets live until `stop` is cancelled.
    pub fn new(
        upstreams: Vec<SocketAddr>,
        timeout: Duration,
        parallel: bool,
        udp_payload: u16,
        stop: CancellationToken,
    ) -> Forwarder {
        Forwarder {
            upstreams,
            timeout,
            parallel,
            udp_payload,
            pool: Arc::new(UdpPool {
                chans: Mutex::new(HashMap::new()),
                stop,
            }),
        }
    }

    /// Sends `query` upstream and returns the first usable answer (its id is the query's).
    /// SERVFAIL/REFUSED answers make the next server be tried; the last such answer is
    /// returned when no server does better.
    pub async fn forward(
        &self,
        query: &Message,
        transport: Transport,
    ) -> Result<Message, ForwardError> {
        if self.upstreams.is_empty() {
            return Err(ForwardError::NoUpstreams);
        }
        let mut upstream = query.clone();
        let client_id = query.metadata.id;
        upstream.metadata.id = rand::random();
        if transport == Transport::Udp {
            // Advertise our buffer so upstream answers are not cut at 512 (istio#61371).
            let mut edns = upstream.edns.take().unwrap_or_default();
            if edns.max_payload() < self.udp_payload {
                edns.set_max_payload(self.udp_payload);
            }
            upstream.set_edns(edns);
        }
        let bytes = upstream
            .to_vec()
            .map_err(|e| ForwardError::Encode(e.to_string()))?;
        let mut result = if self.parallel {
            self.parallel(&bytes, &upstream, transport).await
        } else {
            self.sequential(&bytes, &upstream, transport).await
        };
        if let Ok(m) = &mut result {
            m.metadata.id = client_id;
        }
        result
    }

    async fn sequential(
        &self,
        bytes: &[u8],
        q: &Message,
        transport: Transport,
    ) -> Result<Message, ForwardError> {
        let mut order = self.upstreams.clone();
        order.shuffle(&mut rand::rng());
        let mut last = Err(ForwardError::NoUpstreams);
        for server in order {
            match exchange(&self.pool, server, bytes, q, transport, self.timeout).await {
                Ok(m) if usable(&m) => return Ok(m),
                Ok(m) => last = Ok(m),
                Err(e) => {
                    tracing::debug!(error = %e, "DNS upstream failed, trying next");
                    if last.is_err() {
                        last = Err(e);
                    }
                }
            }
        }
        last
    }

    async fn parallel(
        &self,
        bytes: &[u8],
        q: &Message,
        transport: Transport,
    ) -> Result<Message, ForwardError> {
        let mut set = JoinSet::new();
        for &server in &self.upstreams {
            let bytes = bytes.to_vec();
            let q = q.clone();
            let timeout = self.timeout;
            let pool = self.pool.clone();
            set.spawn(async move { exchange(&pool, server, &bytes, &q, transport, timeout).await });
        }
        let mut last = Err(ForwardError::NoUpstreams);
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(Ok(m)) if usable(&m) => return Ok(m),
                Ok(Ok(m)) => last = Ok(m),
                Ok(Err(e)) if last.is_err() => last = Err(e),
                _ => {}
            }
        }
        last
    }
}

fn usable(m: &Message) -> bool {
    !matches!(
        m.metadata.response_code,
        ResponseCode::ServFail | ResponseCode::Refused
    )
}

/// One exchange with one server; a truncated UDP answer is retried over TCP.
async fn exchange(
    pool: &UdpPool,
    server: SocketAddr,
    bytes: &[u8],
    q: &Message,
    transport: Transport,
    timeout: Duration,
) -> Result<Message, ForwardError> {
    let deadline = Instant::now() + timeout;
    let fut = async {
        match transport {
            Transport::Udp => {
                let m = pool.exchange(server, bytes, q).await?;
                if m.metadata.truncation {
                    exchange_tcp(server, bytes, q).await
                } else {
                    Ok(m)
                }
            }
            Transport::Tcp => exchange_tcp(server, bytes, q).await,
        }
    };
    timeout_at(deadline, fut)
        .await
        .unwrap_or(Err(ForwardError::Timeout { server }))
}

/// Sockets per upstream shared by all forwarded UDP queries: answers are matched to queries by
/// id and question. Saves a socket, a bind and an epoll registration per query.
const SOCKETS_PER_UPSTREAM: usize = 8;

struct Pending {
    /// The query's question section as sent; the answer must echo it.
    question: Box<[u8]>,
    tx: oneshot::Sender<Vec<u8>>,
}

struct Chan {
    sock: UdpSocket,
    pending: Mutex<HashMap<u16, Pending>>,
}

pub(crate) struct UdpPool {
    chans: Mutex<HashMap<SocketAddr, Arc<[Arc<Chan>]>>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for UdpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpPool").finish_non_exhaustive()
    }
}

/// Removes a pending query when its exchange ends (answer, timeout or cancellation).
struct PendingGuard<'a> {
    chan: &'a Chan,
    id: u16,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut p) = self.chan.pending.lock() {
            p.remove(&self.id);
        }
    }
}

impl UdpPool {
    async fn chans(&self, server: SocketAddr) -> Result<Arc<[Arc<Chan>]>, ForwardError> {
        if let Some(c) = self.chans.lock().ok().and_then(|m| m.get(&server).cloned()) {
            return Ok(c);
        }
        let io = |source| ForwardError::Io { server, source };
        let local: SocketAddr = if server.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let mut chans = Vec::with_capacity(SOCKETS_PER_UPSTREAM);
        for _ in 0..SOCKETS_PER_UPSTREAM {
            let sock = UdpSocket::bind(local).await.map_err(io)?;
            sock.connect(server).await.map_err(io)?;
            chans.push(Arc::new(Chan {
                sock,
                pending: Mutex::new(HashMap::new()),
            }));
        }
        let chans: Arc<[Arc<Chan>]> = chans.into();
        let mut map = self
            .chans
            .lock()
            .map_err(|_| ForwardError::Encode("poisoned".into()))?;
        if let Some(c) = map.get(&server) {
            // Another query created them first; ours are dropped.
            return Ok(c.clone());
        }
        for chan in chans.iter() {
            tokio::spawn(read_answers(chan.clone(), self.stop.clone()));
        }
        map.insert(server, chans.clone());
        Ok(chans)
    }

    async fn exchange(
        &self,
        server: SocketAddr,
        bytes: &[u8],
        q: &Message,
    ) -> Result<Message, ForwardError> {
        let chans = self.chans(server).await?;
        let chan = &chans[rand::random_range(0..chans.len())];
        let question =
            question_bytes(bytes).ok_or_else(|| ForwardError::Encode("no question".into()))?;
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut pending = chan
                .pending
                .lock()
                .map_err(|_| ForwardError::Encode("poisoned".into()))?;
            if pending.len() > 30_000 {
                return Err(ForwardError::Io {
                    server,
                    source: std::io::ErrorKind::WouldBlock.into(),
                });
            }
            let mut id: u16 = rand::random();
            while pending.contains_key(&id) {
                id = rand::random();
            }
            pending.insert(
                id,
                Pending {
                    question: question.into(),
                    tx,
                },
            );
            id
        };
        let _guard = PendingGuard { chan, id };
        let mut pkt = bytes.to_vec();
        pkt[..2].copy_from_slice(&id.to_be_bytes());
        chan.sock
            .send(&pkt)
            .await
            .map_err(|source| ForwardError::Io { server, source })?;
        let mut answer = rx.await.map_err(|_| ForwardError::Timeout { server })?;
        // Back to the id the caller knows.
        answer[..2].copy_from_slice(&q.metadata.id.to_be_bytes());
        check_answer(server, &answer, q)
    }
}

/// Dispatches answers arriving on a pool socket to the waiting queries.
async fn read_answers(chan: Arc<Chan>, stop: CancellationToken) {
    let mut buf = vec![0u8; 65_535];
    loop {
        let n = tokio::select! {
            _ = stop.cancelled() => return,
            r = chan.sock.recv(&mut buf) => match r {
                Ok(n) => n,
                // ICMP errors (upstream down) and the like: the queries time out.
                Err(_) => continue,
            },
        };
        if n < 12 {
            continue;
        }
        let id = u16::from_be_bytes([buf[0], buf[1]]);
        let Ok(mut pending) = chan.pending.lock() else {
            return;
        };
        let matches = pending.get(&id).is_some_and(|p| {
            buf.get(12..12 + p.question.len())
                .is_some_and(|q| q.eq_ignore_ascii_case(&p.question))
        });
        if matches && let Some(p) = pending.remove(&id) {
            let _ = p.tx.send(buf[..n].to_vec());
        }
    }
}

/// The question section of a query we encoded (uncompressed name, type, class).
fn question_bytes(msg: &[u8]) -> Option<&[u8]> {
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

async fn exchange_tcp(
    server: SocketAddr,
    bytes: &[u8],
    q: &Message,
) -> Result<Message, ForwardError> {
    let io = |source| ForwardError::Io { server, source };
    let mut stream = TcpStream::connect(server).await.map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let len =
        u16::try_from(bytes.len()).map_err(|_| ForwardError::Encode("query too large".into()))?;
    let mut framed = Vec::with_capacity(bytes.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(bytes);
    stream.write_all(&framed).await.map_err(io)?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await.map_err(io)?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await.map_err(io)?;
    check_answer(server, &buf, q)
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
        // Some servers omit the question in error answers.
        (None, _) => m.metadata.response_code != ResponseCode::NoError,
        _ => false,
    };
    if !same_question {
        return Err(invalid("question mismatch"));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};

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
}
