//! The status server (`statusPort`, default 15020): `/healthz/ready`, merged
//! `/stats/prometheus`, app probes, `/quitquitquit`, `/drain`, `/debug/ndsz`,
//! `/debug/config_dump` (the agent's effective configuration, secrets redacted), and with
//! `--profiling` `/debug/pprof/` (the agent's CPU profile).

pub mod conn;
pub mod grpc_ready;
pub mod lockdown;
pub(crate) mod pprof;
pub mod probe;
pub mod process;
pub(crate) mod route;
pub mod stats;
fn json_response(body: String) -> http::Response<Body> {
    let mut r = full(200, body);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::NodeType;
use crate::envoy::admin::Admin;
use crate::envoy::readiness::EnvoyReadiness;
use probe::{AppProbers, Prober, PrometheusAnnotations};
use proto::lifecycle::{Readiness, Shutdown};
use route::Route;

/// Body type of every status response.
pub type Body = BoxBody<bytes::Bytes, std::io::Error>;

/// Returns the NDS table as JSON, or `None` before the first table.
pub type NdszFn = Arc<dyn Fn() -> Option<String> + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScrapeFailureLabels {
    r#type: &'static str,
}

/// Status-server metrics (Istio's `scrapes_total`, `scrape_failures_total{type}`).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    scrapes: Counter,
    scrape_failures: Family<ScrapeFailureLabels, Counter>,
    /// `startup_duration_seconds`: from the process's start to its first ready answer.
    startup: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        registry.register(
            "scrapes",
            "Total scrapes of the merged metrics",
            m.scrapes.clone(),
        );
        registry.register(
            "scrape_failures",
            "Failed parts of merged metrics scrapes, by type",
            m.scrape_failures.clone(),
        );
        registry.register(
            "startup_duration_seconds",
            "The time from the process starting to being marked ready.",
            m.startup.clone(),
        );
        m
    }
    /// The first ready answer records the process's age (as Istio's agent; later ones keep
    /// the first figure).
    fn started(&self) {
        if self.startup.get() == 0.0
            && let Some(up) = process::uptime()
        {
            self.startup.set(up.as_secs_f64().max(f64::MIN_POSITIVE));
        }
    }

    pub(crate) fn failure(&self, t: &'static str) {
        self.scrape_failures
            .get_or_create(&ScrapeFailureLabels { r#type: t })
            .inc();
    }
}

/// Everything the status server serves from.
pub struct Inputs {
    pub node_type: NodeType,
    /// Envoy's admin API; `None` with `DISABLE_ENVOY`.
    pub admin: Option<Admin>,
    /// Envoy's prometheus listener (15090) when its stats are merged.
    pub envoy_prometheus: Option<SocketAddr>,
    pub app_metrics: Option<PrometheusAnnotations>,
    pub metrics_localhost_only: bool,
    /// `--profiling`: `/debug/pprof/` is served.
    pub profiling: bool,
    pub probers: AppProbers,
    pub prober: Prober,
    pub registry: Arc<Registry>,
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub shutdown: Shutdown,
    pub ndsz: Option<NdszFn>,
    /// The effective configuration (`/debug/config_dump`), as JSON, secrets redacted.
    pub config_dump: String,
    /// Connection caps and timeouts ([`conn::Limits::default`] in the agent).
    pub limits: conn::Limits,
    /// `PROXY_LIFECYCLE_LOCKDOWN`: who may call `/quitquitquit` and `/drain`; `None` is
    /// Istio's rule (any loopback peer).
    pub lockdown: Option<lockdown::Lockdown>,
}

struct State {
    inputs: Inputs,
    /// Envoy's readiness, when the agent has an Envoy.
    envoy: Option<EnvoyReadiness>,
}

/// The bound status server: one listener, or one per address family (a dual-stack pod is
/// probed on its IPv4 and its IPv6 address).
pub struct StatusServer {
    listeners: Vec<TcpListener>,
    state: Arc<State>,
}

/// The `Content-Type` Istio's agent (Go's `net/http`) gives a body it did not type: sniffed
/// from its first 512 bytes as `http.DetectContentType` does for the bodies a status answer
/// carries (HTML, XML, binary, else plain text); none for an empty body.
fn sniffed(body: &[u8]) -> Option<&'static str> {
    if body.is_empty() {
        return None;
    }
    let head = &body[..body.len().min(512)];
    let start = head
        .iter()
        .position(|b| !matches!(b, b'\t' | b'\n' | b'\x0c' | b'\r' | b' '))
        .unwrap_or(head.len());
    let text = &head[start..];
    const HTML: &[&str] = &[
        "<!DOCTYPE HTML",
        "<HTML",
        "<HEAD",
        "<SCRIPT",
        "<IFRAME",
        "<H1",
        "<DIV",
        "<FONT",
        "<TABLE",
        "<A",
        "<STYLE",
        "<TITLE",
        "<B",
        "<BODY",
        "<BR",
        "<P",
        "<!--",
    ];
    let html = HTML.iter().any(|sig| {
        text.len() > sig.len()
            && text[..sig.len()].eq_ignore_ascii_case(sig.as_bytes())
            && matches!(text[sig.len()], b' ' | b'>')
    });
    if html {
        return Some("text/html; charset=utf-8");
    }
    if text.starts_with(b"<?xml") {
        return Some("text/xml; charset=utf-8");
    }
    let binary = head
        .iter()
        .any(|b| matches!(b, 0x00..=0x08 | 0x0b | 0x0e..=0x1a | 0x1c..=0x1f));
    Some(if binary {
        "application/octet-stream"
    } else {
        "text/plain; charset=utf-8"
    })
}

fn full(status: u16, body: impl Into<bytes::Bytes>) -> http::Response<Body> {
    let body: bytes::Bytes = body.into();
    let content_type = sniffed(&body);
    let mut resp = http::Response::new(
        Full::new(body)
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *resp.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    if let Some(t) = content_type {
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(t),
        );
    }
    resp
}

impl StatusServer {
    pub fn new(listeners: Vec<TcpListener>, inputs: Inputs) -> Self {
        StatusServer {
            listeners,
            state: Arc::new(State {
                envoy: inputs.admin.clone().map(EnvoyReadiness::new),
                inputs,
            }),
        }
    }

    /// The first listener's address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self.listeners.first() {
            Some(l) => l.local_addr(),
            None => Err(std::io::Error::other("no status listener")),
        }
    }

    /// Every listener's address.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serves until `stop` is cancelled: after Envoy has exited, when the agent's components
    /// stop. From the start of shutdown (SIGTERM, SIGINT, `/quitquitquit`, a failed component)
    /// until then `/healthz/ready` answers 503 ("server is terminated"), so a probe during the
    /// drain gets a clear "not ready" rather than a refused connection.
    pub async fn run(self, stop: CancellationToken) {
        let mut tasks = tokio::task::JoinSet::new();
        let counts = conn::Counts::new(&self.state.inputs.limits);
        for listener in self.listeners {
            tasks.spawn(accept_loop(
                listener,
                self.state.clone(),
                counts.clone(),
                stop.clone(),
            ));
        }
        if tasks.is_empty() {
            // `statusPort: 0`: nothing to serve, but the server still ends with the agent.
            stop.cancelled().await;
        }
        while tasks.join_next().await.is_some() {}
        tracing::info!("status server stopped");
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    counts: conn::Counts,
    token: CancellationToken,
) {
    let mut backoff = proto::listen::AcceptBackoff::new("status");
    loop {
        let (stream, _) = tokio::select! {
            _ = token.cancelled() => break,
            a = proto::listen::accept(&listener, &mut backoff) => a,
        };
        let Ok(peer) = stream.peer_addr() else {
            continue;
        };
        let activity = conn::Activity::new();
        let admitted = match counts.admit(peer.ip(), &activity) {
            Ok(a) => a,
            Err(why) => {
                tracing::debug!(peer = %peer, reason = %why, "status connection refused");
                continue;
            }
        };
        let state = state.clone();
        let token = token.clone();
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        tokio::spawn(async move {
            let timeouts = state.inputs.limits.timeouts();
            let requests = activity.clone();
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let state = state.clone();
                let conn = Conn { peer, local };
                let mut guard = requests.request();
                // From inside the pod; not 127.0.0.6, where Envoy's inbound passthrough puts
                // remote peers.
                let route = route::route(
                    req.uri().path(),
                    req.method(),
                    conn::is_local(peer.ip()),
                    route::Rules {
                        metrics_localhost_only: state.inputs.metrics_localhost_only,
                        profiling: state.inputs.profiling,
                    },
                );
                if route == Route::Stats {
                    // A scrape may be cut to make room for a probe (`conn`).
                    guard.preemptible();
                }
                async move {
                    let resp = handle(state, conn, req, route).await;
                    drop(guard);
                    Ok::<_, Infallible>(resp)
                }
            });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let io = conn::Watched::new(stream, activity.clone());
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
            tokio::select! {
                _ = conn => {}
                _ = activity.expired(&timeouts) => {
                    tracing::debug!(peer = %peer, "status connection timed out");
                }
                _ = admitted.evicted() => {
                    tracing::debug!(peer = %peer, "idle status connection closed for a new one");
                }
                _ = token.cancelled() => {}
            }
        });
    }
}

/// The connection a request came on.
#[derive(Clone, Copy)]
struct Conn {
    peer: SocketAddr,
    /// The status address the client reached.
    local: SocketAddr,
}

/// With `PROXY_LIFECYCLE_LOCKDOWN`, the refusal of a lifecycle call (already routed: from
/// inside the pod, by `POST`) whose caller is not the proxy's uid or root.
fn lockdown_refusal(state: &State, conn: Conn, path: &str) -> Option<http::Response<Body>> {
    let lockdown = state.inputs.lockdown.as_ref()?;
    let refusal = lockdown.check(conn.peer, conn.local).err()?;
    tracing::warn!(peer = %conn.peer, path, reason = %refusal, "lifecycle call refused");
    Some(full(403, format!("{refusal}\n")))
}

async fn handle(
    state: Arc<State>,
    conn: Conn,
    req: http::Request<Incoming>,
    route: Route,
) -> http::Response<Body> {
    match route {
        Route::Ready => match ready(&state).await {
            Ok(()) => {
                state.inputs.metrics.started();
                full(200, "")
            }
            Err(pending) => {
                tracing::warn!(pending = %pending, "Envoy proxy is NOT ready");
                full(503, pending.to_string())
            }
        },
        Route::Stats => stats::merged(&state.inputs, req).await,
        Route::Quit => {
            if let Some(refused) = lockdown_refusal(&state, conn, "/quitquitquit") {
                return refused;
            }
            tracing::info!("/quitquitquit: shutting down without drain");
            state.inputs.shutdown.trigger_immediate();
            full(200, "OK")
        }
        Route::Drain => {
            if let Some(refused) = lockdown_refusal(&state, conn, "/drain") {
                return refused;
            }
            if let Some(admin) = &state.inputs.admin {
                let q = match state.inputs.node_type {
                    NodeType::Sidecar => "/drain_listeners?inboundonly&graceful&skip_exit",
                    NodeType::Router | NodeType::Waypoint => "/drain_listeners?graceful&skip_exit",
                };
                // As Istio's agent: the answer is 200 whatever Envoy said (the preStop hook
                // must not fail), and the drain counts as done.
                if let Err(e) = admin
                    .request(http::Method::POST, q, Duration::from_secs(5))
                    .await
                {
                    tracing::warn!(error = %e, "drain: Envoy's admin call failed");
                }
            }
            tracing::info!("/drain: listeners drained; the next shutdown exits at once");
            state.inputs.shutdown.skip_drain();
            full(200, "OK")
        }
        Route::Ndsz => match state.inputs.ndsz.as_ref().and_then(|f| f()) {
            Some(json) => json_response(json),
            None => full(404, "{}"),
        },
        Route::ConfigDump => json_response(state.inputs.config_dump.clone()),
        Route::Pprof(page) => pprof::serve(page, req.uri().query()).await,
        Route::PprofRedirect => redirect_to_pprof(req.uri().query()),
        Route::App(p) => {
            let Some(probe) = state.inputs.probers.get(&p) else {
                tracing::warn!(path = p, "app prober config does not exist");
                return full(400, format!("app prober config does not exists for {p}"));
            };
            let host = req
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .or_else(|| req.uri().authority().map(|a| a.as_str()));
            let kubelet = probe::KubeletRequest {
                headers: req.headers(),
                host,
                status_port: conn.local.port(),
            };
            let r = state.inputs.prober.run_app(probe, kubelet).await;
            full(r.status, r.body)
        }
        // Istio's agent's words (Go's `http.Error` and `http.NotFound`).
        Route::Refused(403) => full(403, "Only requests from localhost are allowed\n"),
        Route::Refused(405) => full(405, "Method Not Allowed\n"),
        Route::Refused(status) => full(status, ""),
        Route::NotFound => full(404, "404 page not found\n"),
    }
}

/// Go's mux's answer to `/debug/pprof`: a permanent redirect to the subtree, query kept.
#[cold]
fn redirect_to_pprof(query: Option<&str>) -> http::Response<Body> {
    let to = match query {
        Some(q) => format!("/debug/pprof/?{q}"),
        None => "/debug/pprof/".into(),
    };
    let mut r = full(301, "<a href=\"/debug/pprof/\">Moved Permanently</a>.\n\n");
    if let Ok(v) = http::HeaderValue::from_str(&to) {
        r.headers_mut().insert(http::header::LOCATION, v);
    }
    r
}

/// Why `/healthz/ready` answers 503 (its body is this text).
#[derive(Debug, thiserror::Error)]
enum NotReady {
    #[error("server is terminated: shutting down")]
    ShuttingDown,
    /// Envoy's readiness first, then the agent's pending and failed checks, joined by `; `.
    #[error("{}", pending_text(.envoy.as_ref(), .checks))]
    Pending {
        envoy: Option<crate::envoy::readiness::NotReady>,
        checks: Vec<String>,
    },
}

fn pending_text(envoy: Option<&crate::envoy::readiness::NotReady>, checks: &[String]) -> String {
    envoy
        .map(ToString::to_string)
        .into_iter()
        .chain(checks.iter().cloned())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs every readiness check; the error lists what is pending.
async fn ready(state: &State) -> Result<(), NotReady> {
    if state.inputs.shutdown.is_shutting_down() {
        return Err(NotReady::ShuttingDown);
    }
    let envoy = match &state.envoy {
        Some(envoy) => envoy.check().await.err(),
        None => None,
    };
    let checks = state.inputs.readiness.not_ready();
    if envoy.is_none() && checks.is_empty() {
        Ok(())
    } else {
        Err(NotReady::Pending { envoy, checks })
    }
}
