//! Entry point for the cache flood bench (`dns-proxy/benches/cache_flood.rs`): a client's query
//! and its upstream's answer given to a real [`AnswerPath`], built from a [`Config`] the way the
//! proxy builds it, where the proxy's sockets would give them, never touching the network.
//! UDP queries take the wire path ([`AnswerPath::wire_answer`], also where an answer retried
//! over TCP after TC lands), TCP ones the parsed path ([`AnswerPath::forward_answer`]); both
//! cache the answer as the proxy does.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;

use proto::istio::nds::NameTable;
use tokio_util::sync::CancellationToken;

use super::{Action, AnswerPath, Source};
use crate::forward::check_answer;
use crate::packet::Transport;
use crate::{Config, Metrics};

/// Why an answer pushed through the path gave the client nothing.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("the query was not forwarded (answered or dropped by the request path)")]
    NotForwarded,
    #[error("the upstream answer does not answer the query: {0}")]
    Mismatch(String),
    #[error("the answer path gave the client no answer")]
    NoAnswer,
}

/// A proxy's answer path with no sockets: upstream answers go in through [`Self::push`].
pub struct UpstreamAnswers {
    path: AnswerPath,
}

impl UpstreamAnswers {
    /// The answer path `config` asks for, with an empty name table pushed (every name is
    /// forwarded, as once istiod's first NDS push has arrived).
    pub fn new(config: &Config) -> UpstreamAnswers {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry));
        let path = AnswerPath::new(config, metrics, CancellationToken::new());
        path.table.update(&NameTable::default());
        UpstreamAnswers { path }
    }

    /// Gives the path the client's `query` (over TCP when `tcp`) and, where the proxy would
    /// forward it, `answer` as the upstream's answer; returns the client's answer.
    pub fn push(&self, query: &[u8], answer: Vec<u8>, tcp: bool) -> Result<Vec<u8>, PushError> {
        let from = Cell::new(Source::Upstream);
        let transport = if tcp { Transport::Tcp } else { Transport::Udp };
        match self.path.handle(query, transport) {
            Action::ForwardWire(w) => self
                .path
                .wire_answer(&w, answer, &from)
                .ok_or(PushError::NoAnswer),
            Action::Forward(req, _) => {
                let server: SocketAddr = ([127, 0, 0, 1], 53).into();
                let resp = check_answer(server, &answer, &req)
                    .map_err(|e| PushError::Mismatch(e.to_string()))?;
                self.path
                    .forward_answer(&req, transport, Ok(resp), &from)
                    .ok_or(PushError::NoAnswer)
            }
            Action::Reply(_) | Action::ReplyAndRefresh(..) | Action::Drop => {
                Err(PushError::NotForwarded)
            }
        }
    }

    /// Entries the cache holds now (0 with the cache off).
    pub fn cache_entries(&self) -> usize {
        self.path.cache.as_ref().map_or(0, |c| c.len())
    }

    /// Bytes the cache's entries cost now (wire size + name + per-entry overhead).
    pub fn cache_bytes(&self) -> usize {
        self.path.cache.as_ref().map_or(0, |c| c.bytes())
    }
}
