//! The agent's DNS proxy: answers mesh names from the NDS name table, forwards the rest.
//!
//! Behaviour follows Istio's agent DNS proxy (pkg/dns/client): the name table pushed over NDS is
//! expanded into short names, namespace forms and search-domain CNAMEs, A/AAAA questions for known
//! hosts are answered locally (TTL 30, NOERROR with an empty answer for the missing family) and
//! everything else is forwarded to the resolv.conf nameservers over the protocol the query came
//! in on. Beyond Istio: upstream answers are cached (TTL-honouring, bounded), the next server is
//! tried on timeout, EDNS is advertised upstream and answers are truncated to the client's size
//! with TC set, and concurrency is bounded. Plain UDP queries are forwarded at the wire level
//! (no parse and re-encode), with batched socket I/O; upstream sockets rotate to fresh random
//! ports and every upstream query gets a random id (cache-poisoning defence, see `forward`).
//!
//! Modules, top down: `server` binds the listeners and runs the UDP and TCP loops; `answer` is
//! the answer path (query in, table hit, cache or forward, answer out) with its parts
//! (`answer/local`: table answers, `answer/rewrite`: wire-path byte rewrites,
//! `answer/respond` and `answer/truncate`: `Message` answers sized for the client); `table`
//! (NDS name table), `cache` (upstream answers) and `forward` (upstream socket pool, pending
//! tables, relayed queries, timeout sweep, TCP fallback) below it; `packet` (transport, size
//! limits, plain-query parser) and `datagrams` (batched UDP I/O) are leaves every layer uses.
//!
//! ```no_run
//! # async fn demo() -> Result<(), dns_proxy::Error> {
//! use std::{path::Path, sync::Arc};
//! let mut registry = prometheus_client::registry::Registry::default();
//! let metrics = Arc::new(dns_proxy::Metrics::new(&mut registry));
//! let config = dns_proxy::Config::from_resolv_conf(Path::new("/etc/resolv.conf"))?;
//! let proxy = dns_proxy::DnsProxy::bind(config, metrics).await?;
//! let table = proxy.table(); // feed NDS pushes: table.update(&name_table)
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! proxy.run(shutdown).await
//! # }
//! ```

// unsafe only where a module allows it: recvmmsg/sendmmsg (datagrams.rs).
#![deny(unsafe_code)]

mod answer;
mod cache;
mod config;
mod datagrams;
mod forward;
mod metrics;
mod packet;
mod server;
mod table;

use std::path::PathBuf;
use std::sync::Arc;

pub use cache::StalePolicy;
pub use config::{
    Config, DEFAULT_CACHE_MAX_BYTES, DEFAULT_FORWARD_TIMEOUT, DEFAULT_PROXY_ADDR,
    ISTIO_RESOLV_CONF, ResolvConf, parse_resolv_conf, resolve_listen_addr,
};
pub use metrics::Metrics;
pub use server::DnsProxy;
pub use table::TableHandle;

/// Errors of the DNS proxy.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("cannot read resolv.conf {path:?}: {source}")]
    ResolvConf {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error(
        "cannot bind DNS {protocol} listener on {addr}: {source} (is another DNS proxy running?)"
    )]
    Bind {
        protocol: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("DNS {protocol} listener on {addr} failed: {source}")]
    Serve {
        protocol: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: Arc<std::io::Error>,
    },
}

/// Request-path entry points for the fuzz target; not part of the stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::answer::fuzz::{fuzz_request, fuzz_upstream_answer};
}

/// The answer path without sockets, for the cache flood bench; not part of the stable API.
#[doc(hidden)]
pub mod bench {
    pub use crate::answer::bench::{PushError, UpstreamAnswers};
}
