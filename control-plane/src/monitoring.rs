//! The monitoring HTTP server: `/ready`, `/metrics`, `/debug/syncz`, `/debug/configz`.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
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
    /// Ready once every listener is serving.
    pub ready: watch::Receiver<bool>,
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
            if *inputs.ready.borrow() {
                reply(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not ready: listeners starting\n".into(),
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
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /ready, /metrics, /debug/syncz, /debug/configz\n".into(),
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
            let svc = hyper::service::service_fn(move |req| handle(inputs.clone(), req));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = cancel.cancelled() => {}
                r = conn => if let Err(e) = r { tracing::debug!(error = %e, "monitoring connection"); },
            }
        });
    }
}
