//! The monitoring HTTP server: `/ready`, `/metrics`, `/debug/syncz`, `/debug/configz` (the
//! proxies' configuration) and `/debug/config_dump` (istiod-lite's own, the settings tree).
//!
//! Bounded as the agent's status port: connection caps ([`crate::listen::MONITORING_CAPS`]), a
//! header timeout and an idle timeout per connection ([`MonitoringInputs::timeouts`]).

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use proto::lifecycle::Readiness;
use proto::listen::activity::{Activity, Timeouts, Watched};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ConfigStatus;
use crate::model::Snapshot;
use crate::xds::SyncTable;

/// What the monitoring server reads.
pub struct MonitoringInputs {
    pub registry: Arc<Registry>,
    pub sync: SyncTable,
    pub config_status: watch::Receiver<Arc<ConfigStatus>>,
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    /// Ready once every listener is serving, not ready once a component stopped.
    pub readiness: Readiness,
    /// The settings tree ([`crate::settings::Settings::dump`]).
    pub config_dump: serde_json::Value,
    /// Header and idle timeouts of each connection ([`crate::listen::MONITORING_TIMEOUTS`]).
    pub timeouts: Timeouts,
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

fn configz(inputs: &MonitoringInputs) -> String {
    let status = inputs.config_status.borrow().clone();
    let snap = inputs.snapshots.borrow().clone();
    let services: Vec<serde_json::Value> = snap
        .services
        .iter()
        .map(|s| {
            serde_json::json!({
                "host": s.host,
                "namespace": s.namespace,
                "vips": s.vips,
                "autoVip": s.auto_vip.map(|v| v.to_string()),
                "ports": s.ports.iter().map(|p| serde_json::json!({"number": p.number, "name": p.name, "protocol": p.protocol})).collect::<Vec<_>>(),
                "endpoints": s.endpoints.iter().map(|e| e.address.clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let body = serde_json::json!({
        "version": status.version,
        "objects": status.objects,
        "errors": status.errors,
        "config": &*snap.config,
        "services": services,
    });
    serde_json::to_string_pretty(&body).unwrap_or_default()
}

async fn handle(
    inputs: Arc<MonitoringInputs>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let resp = match req.uri().path() {
        "/ready" => {
            let not_ready = inputs.readiness.not_ready();
            if not_ready.is_empty() {
                reply(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: {}\n", not_ready.join("; ")),
                )
            }
        }
        "/metrics" => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, &inputs.registry) {
                Ok(()) => reply(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    out,
                ),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("encode: {e}\n"),
                ),
            }
        }
        "/debug/syncz" => reply(
            StatusCode::OK,
            "application/json",
            serde_json::to_string_pretty(&inputs.sync.rows()).unwrap_or_default(),
        ),
        "/debug/configz" => reply(StatusCode::OK, "application/json", configz(&inputs)),
        "/debug/config_dump" => reply(
            StatusCode::OK,
            "application/json",
            serde_json::to_string_pretty(&inputs.config_dump).unwrap_or_default(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /ready, /metrics, /debug/syncz, /debug/configz, /debug/config_dump\n"
                .into(),
        ),
    };
    Ok(resp)
}

/// Serves on `listener` until `cancel`.
pub async fn serve(listener: TcpListener, inputs: MonitoringInputs, cancel: CancellationToken) {
    let inputs = Arc::new(inputs);
    let caps = proto::listen::ConnCaps::new(crate::listen::MONITORING_CAPS);
    let mut acceptor = crate::listen::Acceptor::new(listener, "monitoring", caps);
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            s = acceptor.accept() => s,
        };
        let inputs = inputs.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            // A slowloris peer, or one holding an idle keep-alive connection, keeps no slot
            // past the timeouts; a request being answered is never cut.
            let activity = Activity::new();
            let timeouts = inputs.timeouts;
            let requests = activity.clone();
            let svc = hyper::service::service_fn(move |req| {
                let guard = requests.request();
                let inputs = inputs.clone();
                async move {
                    let resp = handle(inputs, req).await;
                    drop(guard);
                    resp
                }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let io = TokioIo::new(Watched::new(stream, activity.clone()));
            let conn = builder.serve_connection(io, svc);
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = activity.expired(&timeouts) => tracing::debug!("monitoring connection timed out"),
                r = conn => if let Err(e) = r { tracing::debug!(error = %e, "monitoring connection"); },
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::Instant;

    use super::*;
    use crate::config::{Config, Revision};
    use crate::model::MeshSettings;

    const TIMEOUTS: Timeouts = Timeouts {
        header: Duration::from_millis(600),
        idle: Duration::from_millis(1500),
    };

    async fn start(cancel: &CancellationToken) -> std::net::SocketAddr {
        let rev = Revision::new(Arc::new(Config::default()), 1);
        let snap = Arc::new(Snapshot::from_revision(
            &rev,
            Arc::new(MeshSettings::default()),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let inputs = MonitoringInputs {
            registry: Arc::new(Registry::default()),
            sync: SyncTable::default(),
            config_status: watch::channel(Arc::new(ConfigStatus::default())).1,
            snapshots: watch::channel(snap).1,
            readiness: Readiness::default(),
            config_dump: serde_json::json!({"tunables": {"push_throttle": 7}}),
            timeouts: TIMEOUTS,
        };
        tokio::spawn(serve(listener, inputs, cancel.clone()));
        addr
    }

    /// Reads until the server closes the connection; what it sent, and when it closed.
    async fn until_closed(c: &mut TcpStream) -> (String, Instant) {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await {
                Err(_) => panic!(
                    "not closed within 10 s; got {:?}",
                    String::from_utf8_lossy(&seen)
                ),
                Ok(Ok(0)) | Ok(Err(_)) => {
                    return (String::from_utf8_lossy(&seen).into(), Instant::now());
                }
                Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// The settings tree is served as the agent serves its own configuration.
    #[tokio::test]
    async fn config_dump_serves_the_settings_tree() {
        let cancel = CancellationToken::new();
        let addr = start(&cancel).await;
        let mut c = TcpStream::connect(addr).await.expect("connect");
        c.write_all(
            b"GET /debug/config_dump HTTP/1.1\r\nhost: istiod\r\nconnection: close\r\n\r\n",
        )
        .await
        .expect("write");
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_string(&mut answer))
            .await
            .expect("answer in time")
            .expect("read");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(v["tunables"]["push_throttle"], 7);
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_slowloris_peer_is_closed_after_the_header_timeout() {
        let cancel = CancellationToken::new();
        let addr = start(&cancel).await;
        let mut c = TcpStream::connect(addr).await.expect("connect");
        let start = Instant::now();
        c.write_all(b"GET /ready HTTP/1.1\r\n")
            .await
            .expect("write");
        // One header byte every 100 ms, never the end of the headers.
        let (mut rd, mut wr) = c.split();
        let trickle = async {
            for _ in 0..100 {
                if wr.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let closed = async {
            let mut seen = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut seen)).await;
            Instant::now()
        };
        let (_, closed) = tokio::join!(trickle, closed);
        let took = closed - start;
        assert!(
            took >= TIMEOUTS.header && took < TIMEOUTS.header * 2 + Duration::from_millis(500),
            "slowloris closed after {took:?}"
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed_and_a_busy_one_kept() {
        let cancel = CancellationToken::new();
        let addr = start(&cancel).await;
        let mut c = TcpStream::connect(addr).await.expect("connect");
        let request = b"GET /ready HTTP/1.1\r\nhost: istiod\r\n\r\n";
        // Requests closer together than the idle timeout keep the connection (past it in all).
        let first = Instant::now();
        let mut last = first;
        for _ in 0..3 {
            c.write_all(request).await.expect("write");
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
                .await
                .expect("answer in time")
                .expect("read");
            let answer = String::from_utf8_lossy(&buf[..n]);
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            last = Instant::now();
            tokio::time::sleep(TIMEOUTS.idle * 2 / 3).await;
        }
        assert!(
            first.elapsed() > TIMEOUTS.idle,
            "kept past one idle timeout while in use"
        );
        // Then idle: closed once the idle timeout has passed since the last response (which the
        // server sent a moment before this side read it).
        let (rest, closed) = until_closed(&mut c).await;
        assert!(rest.is_empty(), "nothing more was sent: {rest:?}");
        let took = closed - last;
        assert!(
            took >= TIMEOUTS.idle - Duration::from_millis(5)
                && took < TIMEOUTS.idle + TIMEOUTS.header,
            "idle connection closed {took:?} after its last response"
        );
        cancel.cancel();
    }
}
