//! A minimal `grpc.health.v1.Health/Check` client over an already-connected TCP stream (the probe
//! source address is bound by the caller).

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

/// Returns whether `service` is SERVING.
pub async fn check(stream: tokio::net::TcpStream, service: &str) -> Result<bool, String> {
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let msg = prost::Message::encode_to_vec(&HealthCheckRequest {
        service: service.to_string(),
    });
    let mut frame = Vec::with_capacity(5 + msg.len());
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(0).to_be_bytes());
    frame.extend_from_slice(&msg);
    let req = http::Request::builder()
        .method(http::Method::POST)
        .uri("http://localhost/grpc.health.v1.Health/Check")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, "istio-probe/1.0")
        .body(Full::new(bytes::Bytes::from(frame)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", resp.status()));
    }
    let grpc_status_header = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let grpc_status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(grpc_status_header);
    if grpc_status.as_deref() != Some("0") {
        return Err(format!("grpc-status {}", grpc_status.unwrap_or_default()));
    }
    let body = collected.to_bytes();
    if body.len() < 5 {
        return Err("short gRPC response".into());
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let payload = body.get(5..5 + len).ok_or("truncated gRPC response")?;
    let resp: HealthCheckResponse =
        prost::Message::decode(payload).map_err(|e| format!("decode: {e}"))?;
    Ok(resp.status == SERVING)
}
