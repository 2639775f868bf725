//! Application probes (`ISTIO_KUBE_APP_PROBERS`) and the app-metrics scrape config
//! (`ISTIO_PROMETHEUS_ANNOTATIONS`): parsing, validation and execution. Probes are sent from
//! 127.0.0.6 (or ::6) so the iptables rules let them bypass Envoy.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use serde::Deserialize;

/// Probes by status-server path (`/app-health/<c>/readyz`, ...).
pub type AppProbers = BTreeMap<String, AppProbe>;

/// One rewritten probe.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AppProbe {
    pub action: ProbeAction,
    /// 0: no timeout (lifecycle hooks).
    pub timeout: Duration,
}

/// What the probe does.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum ProbeAction {
    Http {
        path: String,
        port: u16,
        host: String,
        https: bool,
        headers: Vec<(String, String)>,
    },
    Tcp {
        port: u16,
        host: String,
    },
    Grpc {
        port: u16,
        service: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawProber {
    http_get: Option<RawHttpGet>,
    tcp_socket: Option<RawTcp>,
    grpc: Option<RawGrpc>,
    #[serde(default)]
    timeout_seconds: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawHttpGet {
    #[serde(default)]
    path: String,
    port: serde_json::Value,
    #[serde(default)]
    host: String,
    #[serde(default)]
    scheme: String,
    #[serde(default)]
    http_headers: Vec<RawHeader>,
}

#[derive(Deserialize)]
struct RawHeader {
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
struct RawTcp {
    port: serde_json::Value,
    #[serde(default)]
    host: String,
}

#[derive(Deserialize)]
struct RawGrpc {
    port: serde_json::Value,
    #[serde(default)]
    service: Option<String>,
}

fn int_port(path: &str, v: &serde_json::Value) -> Result<u16, String> {
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{path}: port {v} must be an integer in 1-65535"))
}

fn valid_path(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    matches!(parts.as_slice(),
        ["", kind, container, probe]
            if matches!(*kind, "app-health" | "app-lifecycle")
                && !container.is_empty()
                && matches!(*probe, "livez" | "readyz" | "startupz" | "prestopz" | "poststartz"))
}

/// Parses `ISTIO_KUBE_APP_PROBERS`. Empty means no probes. The error says what was expected.
pub fn parse_probers(json: &str) -> Result<AppProbers, String> {
    if json.trim().is_empty() {
        return Ok(AppProbers::new());
    }
    let raw: BTreeMap<String, RawProber> =
        serde_json::from_str(json).map_err(|e| format!("a JSON map of path to prober ({e})"))?;
    let mut out = AppProbers::new();
    for (path, p) in raw {
        if !valid_path(&path) {
            return Err(format!(
                "paths of the form /app-health|app-lifecycle/<container>/livez|readyz|startupz|prestopz|poststartz, not {path}"
            ));
        }
        let probe = to_probe(&path, p)?;
        out.insert(path, probe);
    }
    Ok(out)
}

fn to_probe(path: &str, p: RawProber) -> Result<AppProbe, String> {
    let count = p.http_get.is_some() as u8 + p.tcp_socket.is_some() as u8 + p.grpc.is_some() as u8;
    if count != 1 {
        return Err(format!(
            "exactly one of httpGet, tcpSocket, grpc for {path}"
        ));
    }
    let timeout = Duration::from_secs(u64::try_from(p.timeout_seconds).unwrap_or(0));
    let action = if let Some(h) = p.http_get {
        ProbeAction::Http {
            path: if h.path.starts_with('/') {
                h.path
            } else {
                format!("/{}", h.path)
            },
            port: int_port(path, &h.port)?,
            host: h.host,
            https: h.scheme.eq_ignore_ascii_case("https"),
            headers: h
                .http_headers
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect(),
        }
    } else if let Some(t) = p.tcp_socket {
        ProbeAction::Tcp {
            port: int_port(path, &t.port)?,
            host: t.host,
        }
    } else if let Some(g) = p.grpc {
        ProbeAction::Grpc {
            port: int_port(path, &g.port)?,
            service: g.service.unwrap_or_default(),
        }
    } else {
        return Err(format!("a probe action for {path}"));
    };
    Ok(AppProbe { action, timeout })
}

/// `ProxyConfig.readinessProbe` (VMs): the probe plus its schedule.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReadinessProbe {
    pub probe: AppProbe,
    pub initial_delay: Duration,
    pub period: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSchedule {
    #[serde(default)]
    initial_delay_seconds: i64,
    #[serde(default)]
    period_seconds: i64,
    #[serde(default)]
    success_threshold: i64,
    #[serde(default)]
    failure_threshold: i64,
}

/// Parses `readinessProbe` with Istio's defaults (timeout 1 s, period 10 s, thresholds 1).
pub fn parse_readiness_probe(v: &serde_json::Value) -> Result<ReadinessProbe, String> {
    let raw: RawProber = serde_json::from_value(v.clone())
        .map_err(|e| format!("a probe with httpGet, tcpSocket or grpc ({e})"))?;
    let sched: RawSchedule =
        serde_json::from_value(v.clone()).map_err(|e| format!("integer probe timings ({e})"))?;
    let mut probe = to_probe("readinessProbe", raw)?;
    if probe.timeout.is_zero() {
        probe.timeout = Duration::from_secs(1);
    }
    let secs = |n: i64, default: u64| {
        Duration::from_secs(u64::try_from(n).ok().filter(|n| *n > 0).unwrap_or(default))
    };
    let count = |n: i64| u32::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1);
    Ok(ReadinessProbe {
        probe,
        initial_delay: Duration::from_secs(u64::try_from(sched.initial_delay_seconds).unwrap_or(0)),
        period: secs(sched.period_seconds, 10),
        success_threshold: count(sched.success_threshold),
        failure_threshold: count(sched.failure_threshold),
    })
}

/// Where app metrics are scraped from (`ISTIO_PROMETHEUS_ANNOTATIONS`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PrometheusAnnotations {
    /// `(port, path)` per target.
    pub targets: Vec<(u16, String)>,
}

#[derive(Deserialize)]
struct RawScrape {
    #[serde(default)]
    scrape: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    port: String,
    #[serde(default)]
    targets: Vec<RawTarget>,
}

#[derive(Deserialize)]
struct RawTarget {
    #[serde(default)]
    port: String,
    #[serde(default)]
    path: String,
}

/// Ports the sidecar owns; an app target may not use them.
pub const RESERVED_PORTS: [u16; 9] = [
    15000, 15001, 15004, 15006, 15008, 15020, 15021, 15053, 15090,
];

/// Parses `ISTIO_PROMETHEUS_ANNOTATIONS`; `Ok(None)` when scraping is off.
pub fn parse_prometheus_annotations(
    json: &str,
    status_port: u16,
) -> Result<Option<PrometheusAnnotations>, String> {
    let raw: RawScrape = serde_json::from_str(json)
        .map_err(|e| format!("JSON {{scrape,path,port,targets}} ({e})"))?;
    if raw.scrape == "false" {
        return Ok(None);
    }
    let port_of = |p: &str| -> Result<u16, String> {
        let port: u16 = p
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("target port {p:?} in 1-65535"))?;
        if port == status_port || RESERVED_PORTS.contains(&port) {
            return Err(format!("target port {port} not reserved by Istio"));
        }
        Ok(port)
    };
    let default_path = |p: String| {
        if p.is_empty() {
            "/metrics".to_string()
        } else {
            p
        }
    };
    let targets = if raw.targets.is_empty() {
        let port = if raw.port.is_empty() {
            "80".to_string()
        } else {
            raw.port
        };
        vec![(port_of(&port)?, default_path(raw.path))]
    } else {
        raw.targets
            .into_iter()
            .map(|t| Ok((port_of(&t.port)?, default_path(t.path))))
            .collect::<Result<_, String>>()?
    };
    Ok(Some(PrometheusAnnotations { targets }))
}

/// The outcome of one probe, as the status server answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeResult {
    pub status: u16,
    pub body: bytes::Bytes,
}

/// Runs probes against the application.
#[derive(Debug, Clone)]
pub struct Prober {
    /// Where the app is (INSTANCE_IP, or localhost with the legacy env).
    pub destination: IpAddr,
}

const BODY_CAP: usize = 10 * 1024;

impl Prober {
    fn source(&self) -> IpAddr {
        match self.destination {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6)),
        }
    }

    async fn connect(&self, port: u16) -> std::io::Result<tokio::net::TcpStream> {
        let dest = SocketAddr::new(self.destination, port);
        let socket = match dest {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        // Bypass Envoy: iptables exempts 127.0.0.6. Fall back to an ephemeral source when the
        // address cannot be bound (e.g. IPv6 without ::6).
        if socket.bind(SocketAddr::new(self.source(), 0)).is_err() {
            tracing::debug!(source = %self.source(), "cannot bind probe source; using default");
        }
        socket.connect(dest).await
    }

    /// Runs `probe`, forwarding the kubelet's headers for HTTP probes.
    pub async fn run(&self, probe: &AppProbe, incoming: &http::HeaderMap) -> ProbeResult {
        let fut = self.run_inner(probe, incoming);
        if probe.timeout.is_zero() {
            return fut.await;
        }
        match tokio::time::timeout(probe.timeout, fut).await {
            Ok(r) => r,
            Err(_) => ProbeResult {
                status: 500,
                body: bytes::Bytes::from("probe timed out"),
            },
        }
    }

    async fn run_inner(&self, probe: &AppProbe, incoming: &http::HeaderMap) -> ProbeResult {
        let fail = |msg: String| ProbeResult {
            status: 500,
            body: bytes::Bytes::from(msg),
        };
        match &probe.action {
            ProbeAction::Tcp { port, .. } => match self.connect(*port).await {
                Ok(_) => ProbeResult {
                    status: 200,
                    body: bytes::Bytes::new(),
                },
                Err(e) => fail(format!("tcp probe to port {port} failed: {e}")),
            },
            ProbeAction::Http {
                path,
                port,
                host,
                https,
                headers,
            } => {
                match self
                    .http(*port, path, host, *https, headers, incoming)
                    .await
                {
                    Ok((status, body)) => ProbeResult {
                        status: if (300..400).contains(&status) {
                            200
                        } else {
                            status
                        },
                        body,
                    },
                    Err(e) => fail(format!("http probe to port {port} failed: {e}")),
                }
            }
            ProbeAction::Grpc { port, service } => match self.grpc(*port, service).await {
                Ok(true) => ProbeResult {
                    status: 200,
                    body: bytes::Bytes::new(),
                },
                Ok(false) => fail(format!("grpc service {service:?} is not SERVING")),
                Err(e) => fail(format!("grpc probe to port {port} failed: {e}")),
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn http(
        &self,
        port: u16,
        path: &str,
        host: &str,
        https: bool,
        headers: &[(String, String)],
        incoming: &http::HeaderMap,
    ) -> Result<(u16, bytes::Bytes), String> {
        let stream = self.connect(port).await.map_err(|e| e.to_string())?;
        let mut sender = if https {
            // Like the kubelet, HTTPS probes do not verify the app's certificate.
            let tls = tokio_rustls::TlsConnector::from(insecure_tls_config())
                .connect(tls_server_name(host, self.destination), stream)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            handshake(hyper_util::rt::TokioIo::new(tls)).await?
        } else {
            handshake(hyper_util::rt::TokioIo::new(stream)).await?
        };
        let authority_host = if host.is_empty() {
            match self.destination {
                IpAddr::V6(v6) => format!("[{v6}]"),
                IpAddr::V4(v4) => v4.to_string(),
            }
        } else {
            host.to_string()
        };
        let mut req = http::Request::builder()
            .method(http::Method::GET)
            .uri(path)
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        for (k, v) in incoming {
            if k != http::header::HOST && k != http::header::CONNECTION {
                req.headers_mut().append(k.clone(), v.clone());
            }
        }
        // The kubelet's Host with the status port replaced by the app port.
        let host_header = incoming
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(|h| {
                let name = h.rsplit_once(':').map(|(n, _)| n).unwrap_or(h);
                format!("{name}:{port}")
            })
            .unwrap_or_else(|| format!("{authority_host}:{port}"));
        if let Ok(v) = http::HeaderValue::from_str(&host_header) {
            req.headers_mut().insert(http::header::HOST, v);
        }
        if !req.headers().contains_key(http::header::USER_AGENT) {
            req.headers_mut().insert(
                http::header::USER_AGENT,
                http::HeaderValue::from_static("istio-probe/1.0"),
            );
        }
        for (k, v) in headers {
            if let (Ok(k), Ok(v)) = (
                http::HeaderName::from_bytes(k.as_bytes()),
                http::HeaderValue::from_str(v),
            ) {
                req.headers_mut().insert(k, v);
            }
        }
        req.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        // Keep at most the first 10 KiB of the body.
        let mut body = Vec::new();
        let mut incoming_body = resp.into_body();
        while body.len() < BODY_CAP {
            match incoming_body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let take = (BODY_CAP - body.len()).min(data.len());
                        body.extend_from_slice(&data[..take]);
                    }
                }
                Some(Err(e)) => return Err(e.to_string()),
                None => break,
            }
        }
        Ok((status, bytes::Bytes::from(body)))
    }

    async fn grpc(&self, port: u16, service: &str) -> Result<bool, String> {
        crate::status::grpc_health::check(
            self.connect(port).await.map_err(|e| e.to_string())?,
            service,
        )
        .await
    }
}

async fn handshake<IO>(
    io: IO,
) -> Result<hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Accepts any server certificate (app probes, like the kubelet's, do not verify).
#[derive(Debug)]
struct NoVerify(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn insecure_tls_config() -> std::sync::Arc<rustls::ClientConfig> {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| rustls::ClientConfig::builder())
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(NoVerify(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    std::sync::Arc::new(config)
}

fn tls_server_name(host: &str, destination: IpAddr) -> rustls_pki_types::ServerName<'static> {
    rustls_pki_types::ServerName::try_from(host.to_string())
        .unwrap_or(rustls_pki_types::ServerName::IpAddress(destination.into()))
}

/// Reads at most `cap` bytes of a body; `None` when it is larger.
pub async fn read_capped<B>(body: B, cap: usize) -> Result<Option<bytes::Bytes>, String>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, cap).collect().await {
        Ok(c) => Ok(Some(c.to_bytes())),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Ok(None)
        }
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probers_parse_and_validate() {
        let p = parse_probers(
            r#"{"/app-health/httpbin/livez":{"httpGet":{"path":"hello","port":8080},"timeoutSeconds":2},
                "/app-health/httpbin/readyz":{"tcpSocket":{"port":8081}},
                "/app-health/g/startupz":{"grpc":{"port":9090}}}"#,
        )
        .unwrap();
        assert_eq!(p.len(), 3);
        let live = &p["/app-health/httpbin/livez"];
        assert_eq!(live.timeout, Duration::from_secs(2));
        assert!(
            matches!(&live.action, ProbeAction::Http { path, port: 8080, .. } if path == "/hello")
        );
        for bad in [
            r#"{"/bad/x/livez":{"tcpSocket":{"port":1}}}"#,
            r#"{"/app-health/x/livez":{}}"#,
            r#"{"/app-health/x/livez":{"tcpSocket":{"port":"http"}}}"#,
            r#"{"/app-health/x/livez":{"tcpSocket":{"port":1},"grpc":{"port":1}}}"#,
            r#"["x"]"#,
        ] {
            assert!(parse_probers(bad).is_err(), "{bad}");
        }
        assert!(parse_probers("").unwrap().is_empty());
    }

    #[test]
    fn readiness_probe_defaults() {
        let p =
            parse_readiness_probe(&serde_json::json!({"httpGet": {"path": "/r", "port": 8080}}))
                .unwrap();
        assert_eq!(p.probe.timeout, Duration::from_secs(1));
        assert_eq!(p.period, Duration::from_secs(10));
        assert_eq!((p.success_threshold, p.failure_threshold), (1, 1));
        let p = parse_readiness_probe(&serde_json::json!({
            "tcpSocket": {"port": 22}, "periodSeconds": 3, "failureThreshold": 4, "initialDelaySeconds": 2
        }))
        .unwrap();
        assert_eq!(
            (p.period, p.failure_threshold, p.initial_delay),
            (Duration::from_secs(3), 4, Duration::from_secs(2))
        );
        assert!(
            parse_readiness_probe(&serde_json::json!({"exec": {"command": ["true"]}})).is_err()
        );
    }

    #[test]
    fn prometheus_annotations() {
        let a =
            parse_prometheus_annotations(r#"{"scrape":"true","port":"9000","path":"/m"}"#, 15020)
                .unwrap()
                .unwrap();
        assert_eq!(a.targets, vec![(9000, "/m".to_string())]);
        let a = parse_prometheus_annotations(r#"{"scrape":"true"}"#, 15020)
            .unwrap()
            .unwrap();
        assert_eq!(a.targets, vec![(80, "/metrics".to_string())]);
        assert_eq!(
            parse_prometheus_annotations(r#"{"scrape":"false"}"#, 15020).unwrap(),
            None
        );
        assert!(parse_prometheus_annotations(r#"{"port":"15090"}"#, 15020).is_err());
        assert!(parse_prometheus_annotations(r#"{"targets":[{"port":"0"}]}"#, 15020).is_err());
    }

    #[tokio::test]
    async fn tcp_and_http_probes_against_a_real_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, peer)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let code = if req.starts_with("GET /ok") {
                        "200 OK"
                    } else {
                        "503 Unavailable"
                    };
                    let body = format!("peer={}", peer.ip());
                    let resp = format!(
                        "HTTP/1.1 {code}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        let prober = Prober {
            destination: "127.0.0.1".parse().unwrap(),
        };
        let http = |path: &str| AppProbe {
            action: ProbeAction::Http {
                path: path.into(),
                port,
                host: String::new(),
                https: false,
                headers: vec![],
            },
            timeout: Duration::from_secs(2),
        };
        let r = prober.run(&http("/ok"), &http::HeaderMap::new()).await;
        assert_eq!(r.status, 200);
        assert_eq!(&r.body[..], b"peer=127.0.0.6");
        let r = prober.run(&http("/fail"), &http::HeaderMap::new()).await;
        assert_eq!(r.status, 503);
        let tcp = AppProbe {
            action: ProbeAction::Tcp {
                port,
                host: String::new(),
            },
            timeout: Duration::from_secs(1),
        };
        assert_eq!(prober.run(&tcp, &http::HeaderMap::new()).await.status, 200);
        // A closed port fails.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let tcp = AppProbe {
            action: ProbeAction::Tcp {
                port: closed_port,
                host: String::new(),
            },
            timeout: Duration::from_secs(1),
        };
        assert_eq!(prober.run(&tcp, &http::HeaderMap::new()).await.status, 500);
    }

    #[tokio::test]
    async fn https_probe_does_not_verify_the_app_certificate() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let cert = rcgen::generate_simple_self_signed(vec!["app.local".to_string()]).unwrap();
        let server_config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server_config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (s, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(s).await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = tls.read(&mut buf).await;
            let _ = tls
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\nsecure",
                )
                .await;
            let _ = tls.shutdown().await;
        });
        let prober = Prober {
            destination: "127.0.0.1".parse().unwrap(),
        };
        let probe = AppProbe {
            action: ProbeAction::Http {
                path: "/".into(),
                port,
                host: String::new(),
                https: true,
                headers: vec![],
            },
            timeout: Duration::from_secs(5),
        };
        let r = prober.run(&probe, &http::HeaderMap::new()).await;
        assert_eq!((r.status, &r.body[..]), (200, &b"secure"[..]));
    }
}
