//! Forwarding to the resolv.conf nameservers over the protocol the query came in on, with a
//! per-server timeout, the next server tried on failure, or all at once in parallel mode.
//!
//! UDP queries share a small pool of connected sockets per upstream ([`pool`]); answers are
//! matched to queries by id and question ([`matching`], [`pending`]). Cache-poisoning defences
//! (Kaminsky): every upstream query gets a fresh random id, each socket is replaced by one on a
//! new kernel-chosen ephemeral port after [`ROTATE_AFTER_QUERIES`] queries or [`ROTATE_AFTER`],
//! and an answer is accepted only from the upstream's address and port, with the id and
//! question of a query pending on that very socket; anything else is dropped and the real
//! answer still gets through.
//!
//! Plain UDP queries are relayed ([`Forwarder::relay_batch`], [`relay`]): no task, channel or
//! timer per query. The query's state waits in its socket's pending table; the socket's reader
//! ([`reader`]) handles the answer there (the next server after SERVFAIL/REFUSED, TCP after TC
//! ([`tcp`]), else the client's answer, sent with the other answers of its receive batch), and
//! a periodic sweep ([`sweep`]) times out queries past their server's deadline and moves them
//! on. Queries arriving together are sent upstream with one `sendmmsg` per server.

mod chan;
mod matching;
mod pool;
mod relay;
mod sweep;
mod tcp;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use rand::seq::SliceRandom;

use tokio::task::JoinSet;
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::packet::Transport;
pub(crate) use chan::Relay;
pub(crate) use matching::check_answer;
use matching::question_bytes;
use pool::UdpPool;
use tcp::exchange_tcp;

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

/// How long an upstream UDP socket (and so its source port) is used before it is replaced by a
/// fresh one on a new kernel-chosen ephemeral port: a cache-poisoning defence (Kaminsky), so an
/// off-path attacker has to guess a changing port as well as the random query id.
pub(crate) const ROTATE_AFTER_QUERIES: u32 = 256;
/// ... or after this long, whichever comes first.
pub(crate) const ROTATE_AFTER: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub(crate) struct Forwarder {
    pub upstreams: Vec<SocketAddr>,
    pub timeout: Duration,
    pub parallel: bool,
    pub udp_payload: u16,
    pool: Arc<UdpPool>,
}

/// An upstream answer as a forwarding caller wants it.
pub(crate) trait Answer: Sized + Send + 'static {
    /// `raw` already matched the query (source, id, QR, question).
    fn accept(server: SocketAddr, raw: Vec<u8>) -> Result<Self, ForwardError>;
    /// Whether to stop here rather than try the next server.
    fn usable(&self) -> bool;
}

impl Answer for Message {
    fn accept(server: SocketAddr, raw: Vec<u8>) -> Result<Self, ForwardError> {
        Message::from_vec(&raw).map_err(|e| ForwardError::Invalid {
            server,
            why: e.to_string(),
        })
    }
    fn usable(&self) -> bool {
        !matches!(
            self.metadata.response_code,
            ResponseCode::ServFail | ResponseCode::Refused
        )
    }
}

/// An upstream answer left in wire form (the wire path rewrites it for the client).
pub(crate) struct Raw(pub Vec<u8>);

impl Answer for Raw {
    fn accept(_server: SocketAddr, raw: Vec<u8>) -> Result<Self, ForwardError> {
        Ok(Raw(raw))
    }
    fn usable(&self) -> bool {
        Raw::usable_bytes(&self.0)
    }
}

impl Raw {
    /// Not SERVFAIL (2) nor REFUSED (5).
    fn usable_bytes(answer: &[u8]) -> bool {
        !matches!(answer[3] & 0x0f, 2 | 5)
    }
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
        let pool = UdpPool::new(&upstreams, timeout, stop);
        Forwarder {
            upstreams,
            timeout,
            parallel,
            udp_payload,
            pool: Arc::new(pool),
        }
    }

    /// Replaces each upstream socket after `queries` queries or `age`, whichever comes first.
    #[cfg(test)]
    pub fn with_rotation(mut self, queries: u32, age: Duration) -> Forwarder {
        let pool = Arc::get_mut(&mut self.pool).expect("not shared yet");
        pool.rotate_queries = queries.max(1);
        pool.rotate_after = age;
        self
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
        let mut result: Result<Message, _> = self.forward_bytes(bytes, transport).await;
        if let Ok(m) = &mut result {
            m.metadata.id = client_id;
        }
        result
    }

    /// Sends the encoded query `bytes` (an uncompressed question; the id is replaced on the
    /// wire by a random one per upstream query) and returns the first usable answer, carrying
    /// the id `bytes` had.
    pub async fn forward_bytes<T: Answer>(
        &self,
        mut bytes: Vec<u8>,
        transport: Transport,
    ) -> Result<T, ForwardError> {
        if self.upstreams.is_empty() {
            return Err(ForwardError::NoUpstreams);
        }
        let qlen = question_bytes(&bytes)
            .ok_or_else(|| ForwardError::Encode("no question".into()))?
            .len();
        if self.parallel && self.upstreams.len() > 1 {
            return self.parallel(bytes, transport).await;
        }
        let mut last = Err(ForwardError::NoUpstreams);
        let mut order = [0usize; 8];
        let many;
        let order: &[usize] = if self.upstreams.len() <= order.len() {
            for (i, o) in order.iter_mut().enumerate() {
                *o = i;
            }
            let order = &mut order[..self.upstreams.len()];
            order.shuffle(&mut rand::rng());
            order
        } else {
            let mut v: Vec<usize> = (0..self.upstreams.len()).collect();
            v.shuffle(&mut rand::rng());
            many = v;
            &many
        };
        for &i in order {
            let server = self.upstreams[i];
            let r = exchange(
                &self.pool,
                server,
                &mut bytes,
                qlen,
                transport,
                self.timeout,
            )
            .await
            .and_then(|raw| T::accept(server, raw));
            match r {
                Ok(m) if m.usable() => return Ok(m),
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

    async fn parallel<T: Answer>(
        &self,
        bytes: Vec<u8>,
        transport: Transport,
    ) -> Result<T, ForwardError> {
        let qlen = question_bytes(&bytes).map_or(0, <[u8]>::len);
        let mut set = JoinSet::new();
        for &server in &self.upstreams {
            let mut bytes = bytes.clone();
            let timeout = self.timeout;
            let pool = self.pool.clone();
            set.spawn(async move {
                exchange(&pool, server, &mut bytes, qlen, transport, timeout)
                    .await
                    .and_then(|raw| T::accept(server, raw))
            });
        }
        let mut last = Err(ForwardError::NoUpstreams);
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(Ok(m)) if m.usable() => return Ok(m),
                Ok(Ok(m)) => last = Ok(m),
                Ok(Err(e)) if last.is_err() => last = Err(e),
                _ => {}
            }
        }
        last
    }
}
/// One exchange with one server; a truncated UDP answer is retried over TCP. `bytes` is the
/// query (its id is overwritten with the one used on the wire); the answer carries the id
/// `bytes` had on entry.
async fn exchange(
    pool: &Arc<UdpPool>,
    server: SocketAddr,
    bytes: &mut [u8],
    qlen: usize,
    transport: Transport,
    timeout: Duration,
) -> Result<Vec<u8>, ForwardError> {
    // `bytes` keeps its id: the pool writes its own for the wire and restores it.
    pool.touch();
    let deadline = Instant::now() + timeout;
    let id = [bytes[0], bytes[1]];
    let fut = async {
        let mut answer = match transport {
            Transport::Udp => {
                let a = pool.exchange(server, bytes, qlen).await?;
                if a[2] & 0x02 != 0 {
                    exchange_tcp(server, bytes, qlen).await?
                } else {
                    a
                }
            }
            Transport::Tcp => exchange_tcp(server, bytes, qlen).await?,
        };
        answer[..2].copy_from_slice(&id);
        Ok(answer)
    };
    timeout_at(deadline, fut)
        .await
        .unwrap_or(Err(ForwardError::Timeout { server }))
}

fn poisoned() -> ForwardError {
    ForwardError::Encode("poisoned lock".into())
}

#[cfg(test)]
mod tests;
