//! gRPC probes: one `grpc.health.v1.Health/Check` over HTTP/2 without TLS (as the kubelet and
//! Istio's agent: credentials are not supported), on an already-connected TCP stream (the
//! caller binds the probe's source address). Only `SERVING` passes; `NOT_SERVING`, `UNKNOWN`,
//! an unknown service (`NOT_FOUND`), or a server without the health service (`UNIMPLEMENTED`)
//! fail.

use http_body_util::{BodyExt, Full};

/// `HealthCheckRequest { string service = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `HealthCheckResponse { ServingStatus status = 1; }` (SERVING = 1)
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

const SERVING: i32 = 1;

/// What grpc-go (the client of Istio's agent, v1.82.1 when this was written) appends to the
/// caller's `User-Agent`, or sends alone.
pub(super) const GRPC_GO_USER_AGENT: &str = "grpc-go/1.82.1";

/// Why a health check got no status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Handshake(#[source] hyper::Error),
    #[error("{0}")]
    Request(#[source] http::Error),
    #[error("{0}")]
    Send(#[source] hyper::Error),
    #[error("HTTP status {0}")]
    Status(http::StatusCode),
    #[error("{0}")]
    Body(#[source] hyper::Error),
    /// A `grpc-status` other than 0 (OK), with its `grpc-message`.
    #[error("grpc-status {status} {message}")]
    Grpc { status: String, message: String },
    #[error("short gRPC response")]
    Short,
    #[error("truncated gRPC response")]
    Truncated,
    #[error("decode: {0}")]
    Decode(#[source] prost::DecodeError),
}

/// One health check.
pub(super) struct Check<'a> {
    /// `:authority`: the app's `host:port`, as grpc-go sends the dialed target.
    pub authority: &'a str,
    pub service: &'a str,
    pub user_agent: &'a str,
    /// Sent as `grpc-timeout` when set.
    pub timeout: Option<std::time::Duration>,
}

/// Returns whether the service is SERVING; `Err` for transport and gRPC errors.
pub(super) async fn check(stream: tokio::net::TcpStream, c: Check<'_>) -> Result<bool, Error> {
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .map_err(Error::Handshake)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let msg = prost::Message::encode_to_vec(&HealthCheckRequest {
        service: c.service.to_string(),
    });
    let mut frame = Vec::with_capacity(5 + msg.len());
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(0).to_be_bytes());
    frame.extend_from_slice(&msg);
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!(
            "http://{}/grpc.health.v1.Health/Check",
            c.authority
        ))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, c.user_agent);
    if let Some(t) = c.timeout {
        // grpc-timeout: at most 8 digits and a unit.
        req = req.header(
            "grpc-timeout",
            format!("{}m", t.as_millis().min(99_999_999)),
        );
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(frame)))
        .map_err(Error::Request)?;
    let resp = sender.send_request(req).await.map_err(Error::Send)?;
    if resp.status() != http::StatusCode::OK {
        return Err(Error::Status(resp.status()));
    }
    let grpc_status_header = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let collected = resp.into_body().collect().await.map_err(Error::Body)?;
    let grpc_status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(grpc_status_header);
    if grpc_status.as_deref() != Some("0") {
        let message = collected
            .trailers()
            .and_then(|t| t.get("grpc-message"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        return Err(Error::Grpc {
            status: grpc_status.unwrap_or_default(),
            message,
        });
    }
    let body = collected.to_bytes();
    if body.len() < 5 {
        return Err(Error::Short);
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let payload = body.get(5..5 + len).ok_or(Error::Truncated)?;
    let resp: HealthCheckResponse = prost::Message::decode(payload).map_err(Error::Decode)?;
    Ok(resp.status == SERVING)
}
