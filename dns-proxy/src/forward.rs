//! Forwarding to the resolv.conf nameservers over the protocol the query came in on, with a
//! per-server timeout, the next server tried on failure, or all at once in parallel mode.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use rand::seq::SliceRandom;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout_at};

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
}

impl Forwarder {
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
            match exchange(server, bytes, q, transport, self.timeout).await {
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
            set.spawn(async move { exchange(server, &bytes, &q, transport, timeout).await });
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
                let m = exchange_udp(server, bytes, q).await?;
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

async fn exchange_udp(
    server: SocketAddr,
    bytes: &[u8],
    q: &Message,
) -> Result<Message, ForwardError> {
    let io = |source| ForwardError::Io { server, source };
    let local: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(local).await.map_err(io)?;
    sock.connect(server).await.map_err(io)?;
    sock.send(bytes).await.map_err(io)?;
    let mut buf = vec![0u8; 65_535];
    loop {
        let n = sock.recv(&mut buf).await.map_err(io)?;
        // Anything that is not the answer to our question (spoofed, stale) is ignored.
        if let Ok(m) = check_answer(server, &buf[..n], q) {
            return Ok(m);
        }
    }
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
        Forwarder {
            upstreams,
            timeout: Duration::from_millis(300),
            parallel,
            udp_payload: 1232,
        }
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
