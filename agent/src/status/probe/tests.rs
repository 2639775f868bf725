//! App probes as Istio's status-server tests check them (`server_test.go`: TestNewServer,
//! TestAppProbe, TestHttpsAppProbe, TestGRPCAppProbe(WithIPV6), TestProbeHeader), ported as
//! tables. Every case drives a real status server with a kubelet-style HTTP/1.1 request
//! against a real app: HTTP/1.1 (and h2c) via hyper, HTTPS via rustls with a self-signed
//! rcgen certificate and each ALPN setting, a tonic `grpc.health.v1` server, IPv4 and [::1].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::http::{HeaderMap, StatusCode, Version};

use crate::config::probe::{parse_probers, parse_prometheus_annotations, parse_readiness_probe};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::config::NodeType;
use crate::status::{Inputs, Metrics, StatusServer};
use proto::lifecycle::{Readiness, Shutdown};

// ---------------------------------------------------------------------------------------------
// Parsing (TestNewServer, plus Go's case-insensitive decoding).

/// (case, ISTIO_KUBE_APP_PROBERS, None = accepted, Some(what the error says))
const PROBER_CASES: &[(&str, &str, Option<&str>)] = &[
    (
        "not JSON",
        "invalid-prober-json-encoding",
        Some("failed to decode"),
    ),
    ("a list", r#"["x"]"#, Some("failed to decode")),
    (
        "bad path",
        r#"{"abc": {"path": "/app-foo/health"}}"#,
        Some("invalid path"),
    ),
    (
        "bad probe name",
        r#"{"/app-health/x/healthz": {"tcpSocket": {"port": 1}}}"#,
        Some("invalid path"),
    ),
    (
        "container with a slash",
        r#"{"/app-health/a/b/livez": {"tcpSocket": {"port": 1}}}"#,
        Some("invalid path"),
    ),
    (
        "exec",
        r#"{"/app-health/hello-world/readyz": {"exec": {"command": [ "true" ]}}}"#,
        Some("invalid prober type"),
    ),
    (
        "tcp",
        r#"{"/app-health/hello-world/readyz": {"tcpSocket": {"port": 8888}}}"#,
        None,
    ),
    (
        "tcp and http",
        r#"{"/app-health/hello-world/readyz": {"tcpSocket": {"port": 8888}, "httpGet": {"path": "/", "port": 7777}}}"#,
        Some("must be one of type httpGet, tcpSocket or gRPC"),
    ),
    (
        "grpc and http",
        r#"{"/app-health/hello-world/readyz": {"grpc": {"port": 8888}, "httpGet": {"path": "/", "port": 7777}}}"#,
        Some("must be one of type httpGet, tcpSocket or gRPC"),
    ),
    (
        "named tcp port",
        r#"{"/app-health/hello-world/readyz": {"tcpSocket": {"port": "tcp"}}}"#,
        Some("must be int type"),
    ),
    (
        "named http port",
        r#"{"/app-health/hello-world/readyz": {"httpGet": {"path": "/hello/sunnyvale", "port": "container-port-dontknow"}}}"#,
        Some("must be int type"),
    ),
    (
        "string grpc port",
        r#"{"/app-health/x/readyz": {"grpc": {"port": "8080"}}}"#,
        Some("grpc.port"),
    ),
    (
        "two http",
        r#"{"/app-health/hello-world/readyz": {"httpGet": {"path": "/hello/sunnyvale", "port": 8080}}, "/app-health/business/livez": {"httpGet": {"path": "/business/live", "port": 9090}}}"#,
        None,
    ),
    (
        "other probe fields ignored",
        r#"{"/app-health/hello-world/readyz": {"httpGet": {"path": "/hello/sunnyvale", "port": 8080}, "initialDelaySeconds": 120,"timeoutSeconds": 10,"periodSeconds": 20}}"#,
        None,
    ),
    (
        "no path",
        r#"{"/app-health/business/livez": {"httpGet": {"port": 9090}}}"#,
        None,
    ),
    ("empty map", "{}", None),
    ("empty string", "", None),
    ("null map", "null", None),
    (
        "gRPC key",
        r#"{"/app-health/hello-world/readyz": {"gRPC": {"port": 8080}}}"#,
        None,
    ),
    (
        "null service",
        r#"{"/app-health/hello-world/readyz": {"gRPC": {"port": 8080, "service": null}}}"#,
        None,
    ),
    (
        "service",
        r#"{"/app-health/hello-world/readyz": {"gRPC": {"port": 8080, "service": "foo"}, "timeoutSeconds": 10}}"#,
        None,
    ),
    (
        "null prober",
        r#"{"/app-health/x/livez": null}"#,
        Some("a prober object"),
    ),
    (
        "string timeout",
        r#"{"/app-health/x/livez": {"tcpSocket": {"port": 1}, "timeoutSeconds": "1"}}"#,
        Some("timeoutSeconds"),
    ),
    (
        "fractional port",
        r#"{"/app-health/x/livez": {"tcpSocket": {"port": 80.0}}}"#,
        Some("tcpSocket.port"),
    ),
    (
        "port 0",
        r#"{"/app-health/x/livez": {"tcpSocket": {"port": 0}}}"#,
        Some("in 1-65535"),
    ),
    (
        "port 70000",
        r#"{"/app-health/x/livez": {"httpGet": {"port": 70000}}}"#,
        Some("in 1-65535"),
    ),
    (
        "negative timeout",
        r#"{"/app-health/x/livez": {"tcpSocket": {"port": 1}, "timeoutSeconds": -1}}"#,
        Some("non-negative"),
    ),
    (
        "string path",
        r#"{"/app-health/x/livez": {"httpGet": {"port": 1, "path": 5}}}"#,
        Some("httpGet.path"),
    ),
];

#[test]
fn probers_parse_as_istio_decodes_them() {
    for (case, json, want) in PROBER_CASES {
        match (parse_probers(json), want) {
            (Ok(_), None) => {}
            (Err(e), Some(w)) => {
                assert!(e.to_string().contains(w), "{case}: error {e} lacks {w:?}")
            }
            (got, want) => panic!("{case}: got {got:?}, want error {want:?}"),
        }
    }
}

#[test]
fn prober_fields_decode_as_go_decodes_them() {
    let p = parse_probers(
        r#"{"/app-health/a/livez": {"HTTPGET": {"PATH": "hello", "Port": 8080, "scheme": "https",
                "httpheaders": [{"Name": "X", "value": "1"}]}, "TimeoutSeconds": 2},
            "/app-health/a/readyz": {"httpGet": {"port": 8443, "scheme": "HTTPS"}},
            "/app-health/a/startupz": {"grpc": {"port": 9090, "service": null}},
            "/app-lifecycle/a/prestopz": {"tcpsocket": {"port": 7}}}"#,
    )
    .unwrap();
    assert_eq!(
        p["/app-health/a/livez"],
        AppProbe {
            action: ProbeAction::Http {
                path: "/hello".into(),
                port: 8080,
                host: String::new(),
                // Istio compares the scheme with "HTTPS" exactly.
                https: false,
                headers: vec![("X".into(), "1".into())],
            },
            timeout: Duration::from_secs(2),
        }
    );
    assert!(matches!(
        p["/app-health/a/readyz"].action,
        ProbeAction::Http { https: true, .. }
    ));
    assert_eq!(
        p["/app-health/a/startupz"].action,
        ProbeAction::Grpc {
            port: 9090,
            service: String::new()
        }
    );
    assert_eq!(p["/app-health/a/startupz"].timeout, Duration::ZERO);
    assert!(matches!(
        p["/app-lifecycle/a/prestopz"].action,
        ProbeAction::Tcp { port: 7, .. }
    ));
}

#[test]
fn readiness_probe_defaults() {
    let p = parse_readiness_probe(&serde_json::json!({"httpGet": {"path": "/r", "port": 8080}}))
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
    // A VM's WorkloadGroup probe may be exec (istioctl copies it into mesh.yaml).
    let p = parse_readiness_probe(&serde_json::json!({"exec": {"command": ["true"]}})).unwrap();
    assert!(matches!(&p.probe.action, ProbeAction::Exec { command } if command == &["true"]));
    assert!(parse_readiness_probe(&serde_json::json!({"exec": {"command": []}})).is_err());
    assert!(
        parse_readiness_probe(
            &serde_json::json!({"exec": {"command": ["true"]}, "tcpSocket": {"port": 1}})
        )
        .is_err()
    );
}

#[tokio::test]
async fn exec_readiness_probe_is_healthy_when_the_command_exits_0() {
    let prober = Prober {
        destination: "127.0.0.1".parse().unwrap(),
        http2: true,
        keepalive: None,
    };
    let probe = |cmd: &str, timeout: u64| AppProbe {
        action: ProbeAction::Exec {
            command: vec!["sh".into(), "-c".into(), cmd.into()],
        },
        timeout: Duration::from_secs(timeout),
    };
    let none = HeaderMap::new();
    assert_eq!(prober.run(&probe("exit 0", 1), &none).await.status, 200);
    let failed = prober.run(&probe("echo broken; exit 3", 1), &none).await;
    assert_eq!(failed.status, 500);
    assert!(
        String::from_utf8_lossy(&failed.body).contains("broken"),
        "{failed:?}"
    );
    let slow = prober.run(&probe("sleep 5", 1), &none).await;
    assert_eq!(slow.status, 500);
    assert!(
        String::from_utf8_lossy(&slow.body).contains("timed out"),
        "{slow:?}"
    );
    let missing = AppProbe {
        action: ProbeAction::Exec {
            command: vec!["/nonexistent/probe".into()],
        },
        timeout: Duration::from_secs(1),
    };
    assert_eq!(prober.run(&missing, &none).await.status, 500);
}

#[test]
fn prometheus_annotations() {
    let a = parse_prometheus_annotations(r#"{"scrape":"true","port":"9000","path":"/m"}"#, 15020)
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

#[test]
fn host_port_split_and_join_as_go() {
    assert_eq!(split_host_port("a:1"), Some(("a", "1")));
    assert_eq!(split_host_port("[::1]:15020"), Some(("::1", "15020")));
    assert_eq!(split_host_port("test.com"), None);
    assert_eq!(split_host_port("::1"), None);
    assert_eq!(split_host_port("[::1]"), None);
    assert_eq!(join_host_port("::1", 80), "[::1]:80");
    assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
}

// ---------------------------------------------------------------------------------------------
// Real servers.

/// One request an app saw.
#[derive(Debug, Clone)]
struct Seen {
    version: Version,
    path: String,
    /// `Host`, or the HTTP/2 `:authority`.
    host: String,
    headers: HeaderMap,
    peer: IpAddr,
}

type Log = Arc<Mutex<Vec<Seen>>>;
type AppBody = BoxBody<Bytes, std::io::Error>;

fn body(b: impl Into<Bytes>) -> AppBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

fn reply(code: u16, location: Option<&str>, b: impl Into<Bytes>) -> ::http::Response<AppBody> {
    let mut r = ::http::Response::new(body(b));
    *r.status_mut() = StatusCode::from_u16(code).unwrap();
    if let Some(l) = location {
        r.headers_mut()
            .insert(::http::header::LOCATION, l.parse().unwrap());
    }
    r
}

const TEST_HOST: &str = "test.com:9999";

/// The routes of Istio's test app, plus a slow one, a stalled body and a large body.
async fn route(
    req: ::http::Request<hyper::body::Incoming>,
    peer: IpAddr,
    log: Log,
) -> ::http::Response<AppBody> {
    let host = req
        .headers()
        .get(::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let path = req.uri().path().to_string();
    log.lock().unwrap().push(Seen {
        version: req.version(),
        path: req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        host: host.clone(),
        headers: req.headers().clone(),
        peer,
    });
    let segments: Vec<&str> = path[1..].split('/').collect();
    match segments[0] {
        "header" => {
            let ok = host == TEST_HOST
                && req.headers().get("some-header").map(|v| v.as_bytes()) == Some(b"some-value");
            reply(if ok { 200 } else { 400 }, None, "")
        }
        "redirect" => reply(301, Some("/"), ""),
        "redirect-loop" => reply(301, Some("/redirect-loop"), ""),
        "remote-redirect" => reply(301, Some("http://example.com/foo"), ""),
        "status" => reply(segments[1].parse().unwrap(), Some("/"), ""),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            reply(200, None, "late")
        }
        "slow-body" => {
            let first = futures::stream::once(async {
                Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"partial")))
            });
            let stalled = futures::StreamExt::chain(first, futures::stream::pending());
            ::http::Response::new(BoxBody::new(StreamBody::new(stalled)))
        }
        "big" => reply(200, None, vec![b'x'; 20_000]),
        "" => reply(200, None, "welcome, it works"),
        "hello" if path == "/hello/sunnyvale" => reply(200, None, "welcome, it works"),
        _ => reply(200, None, ""),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Proto {
    /// HTTP/1.1 and h2c by prior knowledge (hyper's auto server).
    Auto,
    /// h2c only.
    H2cOnly,
}

struct App {
    addr: SocketAddr,
    log: Log,
}

impl App {
    fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
    fn last(&self) -> Seen {
        self.seen().last().cloned().expect("the app saw a request")
    }
}

async fn serve_conn<IO>(io: IO, proto: Proto, peer: IpAddr, log: Log)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let log = log.clone();
        async move { Ok::<_, std::convert::Infallible>(route(req, peer, log).await) }
    });
    let io = hyper_util::rt::TokioIo::new(io);
    let exec = hyper_util::rt::TokioExecutor::new();
    let _ = match proto {
        Proto::Auto => {
            hyper_util::server::conn::auto::Builder::new(exec)
                .serve_connection(io, svc)
                .await
        }
        Proto::H2cOnly => hyper::server::conn::http2::Builder::new(exec)
            .serve_connection(io, svc)
            .await
            .map_err(Into::into),
    };
}

async fn http_app(bind: &str, proto: Proto) -> App {
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Log::default();
    let l = log.clone();
    tokio::spawn(async move {
        while let Ok((s, peer)) = listener.accept().await {
            tokio::spawn(serve_conn(s, proto, peer.ip(), l.clone()));
        }
    });
    App { addr, log }
}

/// An HTTPS app with a self-signed certificate, offering `alpn` (none when empty).
async fn https_app(alpn: &[&str]) -> App {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["app.local".to_string()]).unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into()),
        )
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Log::default();
    let l = log.clone();
    tokio::spawn(async move {
        while let Ok((s, peer)) = listener.accept().await {
            let (acceptor, l) = (acceptor.clone(), l.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    serve_conn(tls, Proto::Auto, peer.ip(), l).await;
                }
            });
        }
    });
    App { addr, log }
}

/// A status server (no Envoy) with `probers`, probing `destination`.
async fn status_server(probers: &str, destination: &str) -> SocketAddr {
    status_server_with(probers, destination, true).await
}

/// [`status_server`], offering HTTP/2 to HTTPS apps or not (`ISTIO_ENABLE_HTTP2_PROBING`).
async fn status_server_with(probers: &str, destination: &str, http2: bool) -> SocketAddr {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = StatusServer::new(
        vec![listener],
        Inputs {
            node_type: NodeType::Sidecar,
            admin: None,
            envoy_prometheus: None,
            app_metrics: None,
            metrics_localhost_only: false,
            profiling: true,
            probers: parse_probers(probers).unwrap(),
            prober: Prober {
                destination: destination.parse().unwrap(),
                http2,
                keepalive: None,
            },
            registry: Arc::new(registry),
            metrics,
            readiness: Readiness::default(),
            shutdown: Shutdown::default(),
            ndsz: None,
            config_dump: "{}".into(),
            limits: crate::status::conn::Limits::default(),
            lockdown: None,
        },
    );
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(tokio_util::sync::CancellationToken::new()));
    addr
}

/// What the kubelet sends: `GET path HTTP/1.1`, `Host` (the pod IP and status port, or the
/// probe's own `Host` header), the probe's headers, `User-Agent: kube-probe/<v>` and
/// `Accept: */*` unless the probe sets them, `Connection: close`.
struct Kubelet<'a> {
    host: Option<&'a str>,
    headers: &'a [(&'a str, &'a str)],
    user_agent: Option<&'a str>,
}

const KUBELET: Kubelet<'static> = Kubelet {
    host: None,
    headers: &[],
    user_agent: Some("kube-probe/1.34"),
};

/// Sends the kubelet's request; returns the status and the body.
async fn kubelet_get(status: SocketAddr, path: &str, k: &Kubelet<'_>) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(status).await.unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\n");
    let host = k
        .host
        .map(str::to_string)
        .unwrap_or_else(|| status.to_string());
    req.push_str(&format!("Host: {host}\r\n"));
    for (n, v) in k.headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    if let Some(ua) = k.user_agent {
        req.push_str(&format!("User-Agent: {ua}\r\n"));
    }
    req.push_str("Accept: */*\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
        .await
        .expect("status server answers")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

fn http_probe(path: &str, port: u16, extra: &str) -> String {
    format!(r#"{{"httpGet":{{"path":"{path}","port":{port}{extra}}},"timeoutSeconds":2}}"#)
}

// ---------------------------------------------------------------------------------------------
// HTTP (TestAppProbe).

#[tokio::test]
async fn http_probes_answer_as_istio() {
    let app = http_app("127.0.0.1:0", Proto::Auto).await;
    let port = app.addr.port();
    let probe = |name: &str, path: &str| {
        format!(
            r#""/app-health/{name}/livez":{}"#,
            http_probe(path, port, "")
        )
    };
    let probers = format!(
        "{{{},{},{},{},{},{},{},{},{},{},\"/app-lifecycle/hook/prestopz\":{}}}",
        probe("sunnyvale", "/hello/sunnyvale"),
        probe("root", ""),
        probe("texas", "hello/texas"),
        probe("redirect", "redirect"),
        probe("redirect-loop", "redirect-loop"),
        probe("remote-redirect", "remote-redirect"),
        probe("slow", "/slow"),
        probe("slow-body", "/slow-body"),
        probe("big", "/big"),
        probe("query", "/hello/sunnyvale?x=1"),
        http_probe("hello/texas", port, ""),
    );
    let status = status_server(&probers, "127.0.0.1").await;
    for case in HTTP_CASES {
        check_http_case(&app, status, case).await;
    }
    body_cap_and_redirect_headers(&app, status).await;
    timeouts_answer_as_istio(status).await;
}

/// (case, status-server path, code, body, paths the app saw)
type HttpCase = (
    &'static str,
    &'static str,
    u16,
    Option<&'static str>,
    &'static [&'static str],
);
const HTTP_CASES: &[HttpCase] = &[
    (
        "not a probe path",
        "/bad-path-should-be-404",
        404,
        None,
        &[],
    ),
    (
        "unknown container",
        "/app-health/other/livez",
        400,
        Some("app prober config does not exists for /app-health/other/livez"),
        &[],
    ),
    (
        "path",
        "/app-health/sunnyvale/livez",
        200,
        Some("welcome, it works"),
        &["/hello/sunnyvale"],
    ),
    (
        "no path is /",
        "/app-health/root/livez",
        200,
        Some("welcome, it works"),
        &["/"],
    ),
    (
        "path without slash",
        "/app-health/texas/livez",
        200,
        Some(""),
        &["/hello/texas"],
    ),
    (
        "escaped path",
        "/app-health/te%78as/livez",
        200,
        Some(""),
        &["/hello/texas"],
    ),
    (
        "lifecycle hook",
        "/app-lifecycle/hook/prestopz",
        200,
        Some(""),
        &["/hello/texas"],
    ),
    (
        "query kept",
        "/app-health/query/livez?ignored=1",
        200,
        None,
        &["/hello/sunnyvale?x=1"],
    ),
    (
        "same-host redirect followed",
        "/app-health/redirect/livez",
        200,
        Some("welcome, it works"),
        &["/redirect", "/"],
    ),
    (
        "redirect loop: ten requests, then 500",
        "/app-health/redirect-loop/livez",
        500,
        Some(""),
        &["/redirect-loop"; 10],
    ),
    (
        "remote redirect not followed, 200",
        "/app-health/remote-redirect/livez",
        200,
        Some(""),
        &["/remote-redirect"],
    ),
    (
        "body capped at 10 KiB",
        "/app-health/big/livez",
        200,
        None,
        &["/big"],
    ),
];

async fn check_http_case(app: &App, status: SocketAddr, case: &HttpCase) {
    let (case, path, code, want_body, paths) = case;
    let before = app.seen().len();
    let (got, got_body) = kubelet_get(status, path, &KUBELET).await;
    assert_eq!(got, *code, "{case}");
    if let Some(b) = want_body {
        assert_eq!(got_body, *b, "{case}");
    }
    let seen: Vec<String> = app.seen()[before..]
        .iter()
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(seen, *paths, "{case}");
}

/// The body cap; a redirected request keeps the headers, adds Referer, and comes from
/// 127.0.0.6.
async fn body_cap_and_redirect_headers(app: &App, status: SocketAddr) {
    assert_eq!(
        kubelet_get(status, "/app-health/big/livez", &KUBELET)
            .await
            .1
            .len(),
        10 * 1024
    );
    kubelet_get(status, "/app-health/redirect/livez", &KUBELET).await;
    let last = app.last();
    assert_eq!(last.path, "/");
    assert_eq!(
        last.headers["referer"],
        format!("http://{}/redirect", app.addr)
    );
    assert_eq!(last.headers["user-agent"], "kube-probe/1.34");
    assert_eq!(last.peer.to_string(), "127.0.0.6");
}

/// No headers within timeoutSeconds is a 500; a body that stalls after the headers keeps the
/// app's status and what arrived.
async fn timeouts_answer_as_istio(status: SocketAddr) {
    let t = Instant::now();
    assert_eq!(
        kubelet_get(status, "/app-health/slow/livez", &KUBELET)
            .await
            .0,
        500
    );
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(
        kubelet_get(status, "/app-health/slow-body/livez", &KUBELET).await,
        (200, "partial".to_string())
    );
}

#[tokio::test]
async fn every_status_code_passes_through_and_redirects_are_200() {
    let app = http_app("127.0.0.1:0", Proto::Auto).await;
    let codes: Vec<u16> = (200..=511)
        .filter(|c| StatusCode::from_u16(*c).is_ok_and(|s| s.canonical_reason().is_some()))
        .collect();
    assert!(codes.len() > 50);
    let probers: Vec<String> = codes
        .iter()
        .map(|c| {
            format!(
                r#""/app-health/c{c}/livez":{}"#,
                http_probe(&format!("/status/{c}"), app.addr.port(), "")
            )
        })
        .collect();
    let status = status_server(&format!("{{{}}}", probers.join(",")), "127.0.0.1").await;
    for code in codes {
        let want = if (300..400).contains(&code) {
            200
        } else {
            code
        };
        let (got, _) = kubelet_get(status, &format!("/app-health/c{code}/livez"), &KUBELET).await;
        assert_eq!(got, want, "app answered {code}");
    }
}

// ---------------------------------------------------------------------------------------------
// Headers (TestProbeHeader, and the Host rewrite).

#[tokio::test]
async fn headers_reach_the_app_as_istio_forwards_them() {
    let app = http_app("127.0.0.1:0", Proto::Auto).await;
    let port = app.addr.port();
    let with_config = format!(
        r#","host":"198.18.0.9","httpHeaders":[{{"name":"Some-Header","value":"some-value-over"}},{{"name":"Host","value":"{TEST_HOST}"}}]"#
    );
    let probers = format!(
        r#"{{"/app-health/plain/livez":{},"/app-health/configured/livez":{},"/app-health/header/livez":{}}}"#,
        http_probe("/echo", port, ""),
        http_probe("/echo", port, &with_config),
        http_probe("/header", port, &with_config),
    );
    let status = status_server(&probers, "127.0.0.1").await;
    let status_host = status.to_string();
    let hosts = HeaderHosts {
        app: format!("127.0.0.1:{port}"),
        named_status: format!("pod.local:{}", status.port()),
        named_app: format!("pod.local:{port}"),
    };
    for c in header_cases(&hosts) {
        check_header_case(&app, status, &c).await;
    }
    assert_eq!(status_host, status.to_string());
    // TestAppProbe's header case: the kubelet sends the probe's Host and header.
    let k = Kubelet {
        host: Some(TEST_HOST),
        headers: &[("Some-Header", "some-value")],
        ..KUBELET
    };
    assert_eq!(
        kubelet_get(status, "/app-health/header/livez", &k).await.0,
        200
    );
    assert_eq!(
        kubelet_get(status, "/app-health/header/livez", &KUBELET)
            .await
            .0,
        400
    );
}

/// The Host values a header case names: the app's address, and a named host on the status port
/// and on the app's.
struct HeaderHosts {
    app: String,
    named_status: String,
    named_app: String,
}

struct HeaderCase<'a> {
    name: &'a str,
    path: &'a str,
    kubelet: Kubelet<'a>,
    /// Headers the app sees besides Host, User-Agent and Accept-Encoding.
    want: &'a [(&'a str, &'a str)],
    host: &'a str,
    user_agent: &'a str,
}

fn header_cases(hosts: &HeaderHosts) -> [HeaderCase<'_>; 8] {
    [
        HeaderCase {
            name: "only origin",
            path: "/app-health/plain/livez",
            kubelet: Kubelet {
                headers: &[("Some-Header", "some-value")],
                ..KUBELET
            },
            want: &[
                ("some-header", "some-value"),
                ("accept", "*/*"),
                ("connection", "close"),
            ],
            host: &hosts.app,
            user_agent: "kube-probe/1.34",
        },
        HeaderCase {
            name: "origin with two values",
            path: "/app-health/plain/livez",
            kubelet: Kubelet {
                headers: &[("Some-Header", "some-value"), ("Some-Header", "some-value")],
                ..KUBELET
            },
            want: &[
                ("some-header", "some-value"),
                ("some-header", "some-value"),
                ("accept", "*/*"),
                ("connection", "close"),
            ],
            host: &hosts.app,
            user_agent: "kube-probe/1.34",
        },
        HeaderCase {
            name: "configured headers are not sent by the agent",
            path: "/app-health/configured/livez",
            kubelet: KUBELET,
            want: &[("accept", "*/*"), ("connection", "close")],
            host: &hosts.app,
            user_agent: "kube-probe/1.34",
        },
        HeaderCase {
            name: "the kubelet's value wins over the configured one",
            path: "/app-health/configured/livez",
            kubelet: Kubelet {
                headers: &[("Some-Header", "some-value")],
                ..KUBELET
            },
            want: &[
                ("some-header", "some-value"),
                ("accept", "*/*"),
                ("connection", "close"),
            ],
            host: &hosts.app,
            user_agent: "kube-probe/1.34",
        },
        HeaderCase {
            name: "a Host on another port is kept",
            path: "/app-health/plain/livez",
            kubelet: Kubelet {
                host: Some(TEST_HOST),
                ..KUBELET
            },
            want: &[("accept", "*/*"), ("connection", "close")],
            host: TEST_HOST,
            user_agent: "kube-probe/1.34",
        },
        HeaderCase {
            name: "a Host without a port is kept",
            path: "/app-health/plain/livez",
            kubelet: Kubelet {
                host: Some("test.com"),
                ..KUBELET
            },
            want: &[("accept", "*/*"), ("connection", "close")],
            host: "test.com",
            user_agent: "kube-probe/1.34",
        },
        HeaderCase {
            name: "a named Host on the status port gets the app port",
            path: "/app-health/plain/livez",
            kubelet: Kubelet {
                host: Some(&hosts.named_status),
                ..KUBELET
            },
            want: &[("accept", "*/*"), ("connection", "close")],
            host: &hosts.named_app,
            user_agent: "kube-probe/1.34",
        },
        HeaderCase {
            name: "no User-Agent: Go's",
            path: "/app-health/plain/livez",
            kubelet: Kubelet {
                user_agent: None,
                ..KUBELET
            },
            want: &[("accept", "*/*"), ("connection", "close")],
            host: &hosts.app,
            user_agent: "Go-http-client/1.1",
        },
    ]
}

async fn check_header_case(app: &App, status: SocketAddr, c: &HeaderCase<'_>) {
    let (code, _) = kubelet_get(status, c.path, &c.kubelet).await;
    assert_eq!(code, 200, "{}", c.name);
    let seen = app.last();
    assert_eq!(seen.host, c.host, "{}: Host", c.name);
    assert_eq!(seen.headers["user-agent"], c.user_agent, "{}", c.name);
    let mut rest: Vec<(String, String)> = seen
        .headers
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "host" | "user-agent" | "accept-encoding"))
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    rest.sort();
    let mut want: Vec<(String, String)> = c
        .want
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    want.sort();
    assert_eq!(rest, want, "{}", c.name);
    assert_eq!(seen.peer.to_string(), "127.0.0.6", "{}", c.name);
    assert_eq!(seen.version, Version::HTTP_11, "{}", c.name);
}

// ---------------------------------------------------------------------------------------------
// Plain HTTP is HTTP/1.1 (no h2c); HTTPS offers h2 (TestHttpsAppProbe).

#[tokio::test]
async fn plain_http_probes_speak_http1_only() {
    let both = http_app("127.0.0.1:0", Proto::Auto).await;
    let h2c = http_app("127.0.0.1:0", Proto::H2cOnly).await;
    let probers = format!(
        r#"{{"/app-health/both/livez":{},"/app-health/h2c/livez":{}}}"#,
        http_probe("/", both.addr.port(), ""),
        http_probe("/", h2c.addr.port(), "")
    );
    let status = status_server(&probers, "127.0.0.1").await;
    assert_eq!(
        kubelet_get(status, "/app-health/both/livez", &KUBELET)
            .await
            .0,
        200
    );
    assert_eq!(both.last().version, Version::HTTP_11);
    assert_eq!(
        kubelet_get(status, "/app-health/h2c/livez", &KUBELET)
            .await
            .0,
        500
    );
    assert!(h2c.seen().is_empty());
}

#[tokio::test]
async fn https_probes_skip_verification_and_negotiate_h2() {
    // (server ALPN, code, protocol the app saw)
    let cases: &[(&[&str], u16, Option<Version>)] = &[
        (&[], 200, Some(Version::HTTP_11)),
        (&["http/1.1"], 200, Some(Version::HTTP_11)),
        (&["h2"], 200, Some(Version::HTTP_2)),
        (&["h2", "http/1.1"], 200, Some(Version::HTTP_2)),
        (&["http/1.1", "h2"], 200, Some(Version::HTTP_11)),
        (&["foo"], 500, None),
    ];
    for (alpn, code, version) in cases {
        let app = https_app(alpn).await;
        let port = app.addr.port();
        let probers = format!(
            r#"{{"/app-health/hello-world/readyz":{},"/app-health/hello-world/livez":{{"httpGet":{{"port":{port},"scheme":"HTTPS"}}}}}}"#,
            http_probe("/hello/sunnyvale", port, r#","scheme":"HTTPS""#)
        );
        let status = status_server(&probers, "127.0.0.1").await;
        assert_eq!(
            kubelet_get(status, "/bad-path-should-be-disallowed", &KUBELET)
                .await
                .0,
            404
        );
        for path in [
            "/app-health/hello-world/readyz",
            "/app-health/hello-world/livez",
        ] {
            let (got, body) = kubelet_get(status, path, &KUBELET).await;
            assert_eq!(got, *code, "ALPN {alpn:?} {path}");
            if *code == 200 {
                assert_eq!(body, "welcome, it works", "ALPN {alpn:?} {path}");
            }
        }
        let seen = app.seen();
        assert_eq!(seen.last().map(|s| s.version), *version, "ALPN {alpn:?}");
        if let Some(s) = seen.last() {
            // The Host (:authority in HTTP/2) names the app's port.
            assert_eq!(s.host, format!("127.0.0.1:{port}"), "ALPN {alpn:?}");
            assert_eq!(s.headers["user-agent"], "kube-probe/1.34");
            assert!(!s.headers.contains_key("connection") || *version == Some(Version::HTTP_11));
        }
    }
}

/// `ISTIO_ENABLE_HTTP2_PROBING=false`: HTTPS probes offer no ALPN, so an app that prefers
/// HTTP/2 is probed over HTTP/1.1.
#[tokio::test]
async fn https_probes_without_http2_when_disabled() {
    let app = https_app(&["h2", "http/1.1"]).await;
    let port = app.addr.port();
    let probers = format!(
        r#"{{"/app-health/hello-world/readyz":{}}}"#,
        http_probe("/hello", port, r#","scheme":"HTTPS""#)
    );
    let status = status_server_with(&probers, "127.0.0.1", false).await;
    let (got, _) = kubelet_get(status, "/app-health/hello-world/readyz", &KUBELET).await;
    assert_eq!(got, 200);
    assert_eq!(app.seen().last().map(|s| s.version), Some(Version::HTTP_11));
}

// ---------------------------------------------------------------------------------------------
// gRPC (TestGRPCAppProbe, TestGRPCAppProbeWithIPV6).

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

const UNKNOWN: i32 = 0;
const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

/// A tonic `grpc.health.v1.Health` server: statuses by service name, unknown names
/// `NOT_FOUND` (as grpc-go's and grpcio's health servers); records each call's User-Agent.
#[derive(Clone)]
struct Health {
    statuses: Arc<HashMap<String, i32>>,
    agents: Arc<Mutex<Vec<String>>>,
}

impl tonic::server::NamedService for Health {
    const NAME: &'static str = "grpc.health.v1.Health";
}

struct CheckMethod(Arc<HashMap<String, i32>>);

impl tonic::server::UnaryService<HealthCheckRequest> for CheckMethod {
    type Response = HealthCheckResponse;
    type Future = std::future::Ready<Result<tonic::Response<HealthCheckResponse>, tonic::Status>>;
    fn call(&mut self, req: tonic::Request<HealthCheckRequest>) -> Self::Future {
        std::future::ready(match self.0.get(&req.get_ref().service) {
            Some(s) => Ok(tonic::Response::new(HealthCheckResponse { status: *s })),
            None => Err(tonic::Status::not_found("unknown service")),
        })
    }
}

impl tonic::codegen::Service<::http::Request<tonic::body::Body>> for Health {
    type Response = ::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: ::http::Request<tonic::body::Body>) -> Self::Future {
        let statuses = self.statuses.clone();
        if let Some(ua) = req
            .headers()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
        {
            self.agents.lock().unwrap().push(ua.to_string());
        }
        Box::pin(async move {
            if req.uri().path() != "/grpc.health.v1.Health/Check" {
                return Ok(tonic::Status::unimplemented("").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                HealthCheckResponse,
                HealthCheckRequest,
            >::default());
            Ok(grpc.unary(CheckMethod(statuses), req).await)
        })
    }
}

async fn grpc_app(bind: &str) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let health = Health {
        statuses: Arc::new(HashMap::from([
            (String::new(), SERVING),
            ("serving-svc".to_string(), SERVING),
            ("unknown-svc".to_string(), UNKNOWN),
            ("not-serving-svc".to_string(), NOT_SERVING),
        ])),
        agents: Arc::default(),
    };
    let agents = health.agents.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, agents)
}

async fn grpc_probes_on(bind: &str, destination: &str) {
    let (app, agents) = grpc_app(bind).await;
    // A port where a plain HTTP server (no gRPC health service) answers.
    let http = http_app(bind, Proto::Auto).await;
    let port = app.port();
    let probers = format!(
        r#"{{"/app-health/foo/livez":{{"grpc":{{"port":{port},"service":null}},"timeoutSeconds":1}},
            "/app-health/foo/readyz":{{"grpc":{{"port":{port},"service":"not-serving-svc"}},"timeoutSeconds":1}},
            "/app-health/bar/livez":{{"grpc":{{"port":{port},"service":"serving-svc"}},"timeoutSeconds":10}},
            "/app-health/bar/readyz":{{"grpc":{{"port":{port},"service":"unknown-svc"}},"timeoutSeconds":10}},
            "/app-health/baz/livez":{{"gRPC":{{"port":{port},"service":"no-such-svc"}},"timeoutSeconds":2}},
            "/app-health/http/livez":{{"grpc":{{"port":{}}},"timeoutSeconds":2}}}}"#,
        http.addr.port()
    );
    let status = status_server(&probers, destination).await;
    let cases = [
        ("bad path", "/bad-path-should-be-disallowed", 404),
        (
            "no service: the server's overall health",
            "/app-health/foo/livez",
            200,
        ),
        ("NOT_SERVING", "/app-health/foo/readyz", 500),
        ("SERVING", "/app-health/bar/livez", 200),
        ("UNKNOWN", "/app-health/bar/readyz", 500),
        ("unknown service (NOT_FOUND)", "/app-health/baz/livez", 500),
        ("not a gRPC server", "/app-health/http/livez", 500),
    ];
    for (case, path, code) in cases {
        let (got, body) = kubelet_get(status, path, &KUBELET).await;
        // Probe answers carry no body; the unknown path gets Go's `http.NotFound` words.
        let want = if code == 404 {
            "404 page not found\n"
        } else {
            ""
        };
        assert_eq!((got, body.as_str()), (code, want), "{destination} {case}");
    }
    // The kubelet's User-Agent, with grpc-go's after it.
    assert_eq!(
        agents.lock().unwrap().first().map(String::as_str),
        Some("kube-probe/1.34 grpc-go/1.82.1")
    );
}

#[tokio::test]
async fn grpc_probes_check_health_as_istio() {
    grpc_probes_on("127.0.0.1:0", "127.0.0.1").await;
}

#[tokio::test]
async fn grpc_probes_over_ipv6() {
    grpc_probes_on("[::1]:0", "::1").await;
}

// ---------------------------------------------------------------------------------------------
// TCP and IPv6.

#[tokio::test]
async fn tcp_probes_connect_from_the_bypass_address() {
    for (bind, destination, source) in [
        ("127.0.0.1:0", "127.0.0.1", Some("127.0.0.6")),
        ("[::1]:0", "::1", None),
    ] {
        let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let closed = tokio::net::TcpListener::bind(bind).await.unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let probers = format!(
            r#"{{"/app-health/hello-world/readyz":{{"tcpSocket":{{"port":{port}}},"timeoutSeconds":1}},
                "/app-health/hello-world/livez":{{"tcpSocket":{{"port":{port}}}}},
                "/app-health/closed/livez":{{"tcpSocket":{{"port":{closed_port}}},"timeoutSeconds":1}}}}"#
        );
        let status = status_server(&probers, destination).await;
        for (path, code) in [
            ("/app-health/hello-world/readyz", 200),
            ("/app-health/hello-world/livez", 200),
            ("/app-health/closed/livez", 500),
        ] {
            assert_eq!(
                kubelet_get(status, path, &KUBELET).await,
                (code, String::new()),
                "{destination} {path}"
            );
        }
        let (_, peer) = listener.accept().await.unwrap();
        if let Some(source) = source {
            assert_eq!(peer.ip().to_string(), source);
        }
    }
}

#[tokio::test]
async fn http_probes_over_ipv6() {
    let app = http_app("[::1]:0", Proto::Auto).await;
    let port = app.addr.port();
    let status = status_server(
        &format!(
            r#"{{"/app-health/v6/livez":{}}}"#,
            http_probe("/hello/sunnyvale", port, "")
        ),
        "::1",
    )
    .await;
    let pod_host = format!("[::1]:{}", status.port());
    let k = Kubelet {
        host: Some(&pod_host),
        ..KUBELET
    };
    assert_eq!(
        kubelet_get(status, "/app-health/v6/livez", &k).await,
        (200, "welcome, it works".to_string())
    );
    // The pod's [v6]:status-port Host becomes [v6]:app-port.
    assert_eq!(app.last().host, format!("[::1]:{port}"));
}

/// `REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION`: probes dial the name `localhost`. The kubelet's
/// own `Host` still wins (port rewritten), as in Istio; a probe without one (the VM health
/// probe) sends `localhost:<port>`, the URL's host.
#[tokio::test]
async fn legacy_localhost_probes_name_localhost() {
    let app = http_app("127.0.0.1:0", Proto::Auto).await;
    let port = app.addr.port();
    let probers = format!(
        r#"{{"/app-health/web/livez":{},"/app-health/tcp/livez":{{"tcpSocket":{{"port":{port}}},"timeoutSeconds":2}}}}"#,
        http_probe("/hello/sunnyvale", port, "")
    );
    let status = status_server(&probers, "localhost").await;
    assert_eq!(
        kubelet_get(status, "/app-health/web/livez", &KUBELET).await,
        (200, "welcome, it works".to_string())
    );
    assert_eq!(app.last().host, format!("127.0.0.1:{port}"));
    assert_eq!(
        kubelet_get(status, "/app-health/tcp/livez", &KUBELET)
            .await
            .0,
        200
    );
    let prober = Prober {
        destination: Destination::Localhost,
        http2: true,
        keepalive: None,
    };
    let health = AppProbe {
        action: ProbeAction::Http {
            path: "/hello/sunnyvale".into(),
            port,
            host: String::new(),
            https: false,
            headers: vec![],
        },
        timeout: Duration::from_secs(2),
    };
    assert_eq!(prober.run(&health, &HeaderMap::new()).await.status, 200);
    assert_eq!(app.last().host, format!("localhost:{port}"));
}

/// The addresses of a name are tried in order: a refused one is passed over, and when all are
/// refused the error is the last one's.
#[tokio::test]
async fn probe_connects_to_the_first_address_that_accepts() {
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open_addr = open.local_addr().unwrap();
    let stream = connect_any([refused, open_addr]).await.unwrap();
    assert_eq!(stream.peer_addr().unwrap(), open_addr);
    let err = connect_any([open_addr, refused].into_iter().skip(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(connect_any([]).await.is_err());
}

// ---------------------------------------------------------------------------------------------
// The VM health probe (ProxyConfig.readinessProbe) sends its configured headers itself.

#[tokio::test]
async fn health_probe_sends_configured_headers() {
    let app = http_app("127.0.0.1:0", Proto::Auto).await;
    let probe = AppProbe {
        action: ProbeAction::Http {
            path: "/header".into(),
            port: app.addr.port(),
            host: String::new(),
            https: false,
            headers: vec![
                ("Some-Header".into(), "some-value".into()),
                ("Host".into(), TEST_HOST.into()),
            ],
        },
        timeout: Duration::from_secs(2),
    };
    let prober = Prober {
        destination: "127.0.0.1".parse().unwrap(),
        http2: true,
        keepalive: None,
    };
    let r = prober.run(&probe, &HeaderMap::new()).await;
    assert_eq!(r.status, 200);
    assert_eq!(app.last().headers["user-agent"], "istio-probe/1.0");
    let tcp = AppProbe {
        action: ProbeAction::Tcp {
            port: app.addr.port(),
            host: String::new(),
        },
        timeout: Duration::from_secs(1),
    };
    assert_eq!(prober.run(&tcp, &HeaderMap::new()).await.status, 200);
}

/// `ENABLE_PROBE_KEEPALIVE_CONNECTIONS`: off (Istio's default, as the kubelet), every HTTP probe
/// opens its own connection and asks the app to close it; on, the probes reuse one connection.
/// Counted by the connections the app accepts.
#[tokio::test]
async fn probe_keepalive_connections_reuse_one_connection() {
    async fn app() -> (SocketAddr, Arc<Mutex<(usize, Vec<String>)>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<(usize, Vec<String>)>> = Arc::default();
        let counts = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counts.lock().unwrap().0 += 1;
                let counts = counts.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: ::http::Request<_>| {
                        let connection = req
                            .headers()
                            .get("connection")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        counts.lock().unwrap().1.push(connection);
                        async {
                            // Past the 10 KiB a probe keeps: the rest is drained to reuse
                            // the connection.
                            Ok::<_, std::convert::Infallible>(::http::Response::new(Full::new(
                                Bytes::from(vec![b'x'; 20 * 1024]),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        (addr, seen)
    }
    for keepalive in [false, true] {
        let (addr, seen) = app().await;
        let probe = AppProbe {
            action: ProbeAction::Http {
                path: "/ready".into(),
                port: addr.port(),
                host: String::new(),
                https: false,
                headers: vec![],
            },
            timeout: Duration::from_secs(2),
        };
        let prober = Prober {
            destination: "127.0.0.1".parse().unwrap(),
            http2: true,
            keepalive: keepalive.then(Connections::default),
        };
        for _ in 0..3 {
            assert_eq!(prober.run(&probe, &HeaderMap::new()).await.status, 200);
        }
        let (accepted, connection) = seen.lock().unwrap().clone();
        assert_eq!(connection.len(), 3, "keepalive={keepalive}");
        if keepalive {
            assert_eq!(accepted, 1, "one connection, reused");
            assert!(connection.iter().all(|c| c.is_empty()), "{connection:?}");
        } else {
            assert_eq!(accepted, 3, "a connection per probe");
            assert!(connection.iter().all(|c| c == "close"), "{connection:?}");
        }
    }
}
