//! Rewritten app probes end to end, as a kubelet sees them: `pilot-agent proxy sidecar
//! --external-envoy` started with `ISTIO_KUBE_APP_PROBERS` exactly as Istio's injector writes
//! it (Go's `json.Marshal` of the pod's probes: sorted paths, `scheme` defaulted to `HTTP`,
//! `"service":null` for a gRPC probe without a service, named ports resolved to numbers), and
//! kubelet-style `GET /app-health/<container>/<probe>` requests to the status port: the Host
//! is the pod IP and status port, `User-Agent: kube-probe/<version>`, `Accept: */*`, the
//! probe's `httpHeaders`, `Connection: close`. The apps are a plain HTTP/1.1 server and a TCP
//! listener in this test, and a real gRPC health server (Python `grpcio`'s
//! `grpc_health.v1`, installed by `scripts/setup.sh --test-tools` into `.tools/py-grpc`).
//!
//! No root, no namespaces, no Envoy: everything on 127.0.0.1 (the pod IP), every port free.

use harness::local::{Ports, Unprivileged, agent_env, free_port};
use harness::prereq::{py_grpc_dir, require_grpcio};
use harness::{Child, assert_eventually};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The health service name the gRPC app reports SERVING.
const GRPC_SERVICE: &str = "probes-e2e";

/// This crate's folder (`tests/`), as this test was built.
fn tests_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One request the HTTP app saw: its head (request line and headers) and its peer.
#[derive(Debug, Clone)]
struct Seen {
    head: String,
    peer: SocketAddr,
}

impl Seen {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// A plain HTTP/1.1 app on 127.0.0.1: `/healthz` 200, `/moved` 302 to `/healthz`, anything
/// else 503. Records every request.
fn http_app() -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind app");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let peer = s.peer_addr().expect("peer");
            let mut reader = BufReader::new(s.try_clone().expect("clone"));
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
            log.lock().unwrap().push(Seen { head, peer });
            let answer = match path.as_str() {
                "/healthz" => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string(),
                "/moved" => {
                    "HTTP/1.1 302 Found\r\nLocation: /healthz\r\nContent-Length: 0\r\n\r\n".into()
                }
                _ => "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown".into(),
            };
            let _ = s.write_all(answer.as_bytes());
        }
    });
    (port, seen)
}

/// The kubelet's HTTP probe of the rewritten probe: `GET path` on the pod IP's status port,
/// with the probe's `httpHeaders`. Returns the status code and body.
fn kubelet_probe(status: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&status, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {status}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("User-Agent: kube-probe/1.34\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    (code, body.to_string())
}

/// What the kubelet concludes from a code: success is 200 <= code < 400.
fn kubelet_success(code: u16) -> bool {
    (200..400).contains(&code)
}

#[test]
fn kubelet_probes_reach_http_grpc_and_tcp_apps_through_the_status_port() {
    if !require_grpcio() {
        return;
    }
    let scratch_dir = tempfile::Builder::new()
        .prefix("pr-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch = scratch_dir.path().to_path_buf();

    // The apps: HTTP, TCP (one open port, one closed), gRPC health.
    let (http_port, seen) = http_app();
    let tcp = TcpListener::bind("127.0.0.1:0").expect("bind tcp app");
    let tcp_port = tcp.local_addr().expect("addr").port();
    let closed_port = free_port();
    let mut grpc_cmd = Command::new("python3");
    grpc_cmd
        .arg(tests_dir().join("py/grpc_xds.py"))
        .args(["server", "0", GRPC_SERVICE])
        .env("PYTHONPATH", py_grpc_dir())
        .env("PYTHONUNBUFFERED", "1");
    let grpc_app = Child::spawn("grpc-app", grpc_cmd);
    let line = grpc_app.wait_for_line("serving port=", Duration::from_secs(20));
    let grpc_port: u16 = line
        .split("port=")
        .nth(1)
        .and_then(|p| p.trim().parse().ok())
        .expect("gRPC app port");

    // The injector's ISTIO_KUBE_APP_PROBERS for a pod with containers `web` (readiness
    // httpGet with a header, liveness tcpSocket, startup httpGet that fails, a postStart hook
    // that is redirected) and `grpc` (readiness gRPC with a service, liveness without, startup
    // for a service the app does not know), and `db` (liveness on a closed port).
    let probers = format!(
        concat!(
            r#"{{"/app-health/db/livez":{{"tcpSocket":{{"port":{closed}}},"timeoutSeconds":1}},"#,
            r#""/app-health/grpc/livez":{{"grpc":{{"port":{grpc},"service":null}},"timeoutSeconds":1}},"#,
            r#""/app-health/grpc/readyz":{{"grpc":{{"port":{grpc},"service":"{svc}"}},"timeoutSeconds":1}},"#,
            r#""/app-health/grpc/startupz":{{"grpc":{{"port":{grpc},"service":"other"}},"timeoutSeconds":1}},"#,
            r#""/app-health/web/livez":{{"tcpSocket":{{"port":{tcp}}},"timeoutSeconds":1}},"#,
            r#""/app-health/web/readyz":{{"httpGet":{{"path":"/healthz","port":{http},"scheme":"HTTP","#,
            r#""httpHeaders":[{{"name":"X-Probe","value":"kubelet"}}]}},"timeoutSeconds":1}},"#,
            r#""/app-health/web/startupz":{{"httpGet":{{"path":"/starting","port":{http},"scheme":"HTTP"}},"timeoutSeconds":1}},"#,
            r#""/app-lifecycle/web/poststartz":{{"httpGet":{{"path":"/moved","port":{http},"scheme":"HTTP"}}}}}}"#,
        ),
        closed = closed_port,
        grpc = grpc_port,
        svc = GRPC_SERVICE,
        tcp = tcp_port,
        http = http_port,
    );

    // The agent as the sidecar template runs it, minus Envoy (started by nobody: the status
    // port serves app probes without it) and istiod (nothing here needs config).
    // No Envoy runs: the copy `Unprivileged` makes of one is a stand-in.
    let user = Unprivileged::new(&scratch, Path::new("/bin/true"));
    let ports = Ports::free();
    let discovery: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(&scratch);
    agent_env(&mut cmd, discovery, "probes-sa", &ports);
    cmd.env("ISTIO_KUBE_APP_PROBERS", &probers);
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let status: SocketAddr = format!("127.0.0.1:{}", ports.status).parse().expect("addr");

    // gRPC: Python's health server may still be starting; the kubelet retries too.
    assert_eventually(Duration::from_secs(20), || {
        match kubelet_probe(status, "/app-health/grpc/readyz", &[]) {
            (200, _) => Ok(()),
            other => Err(format!("grpc readyz: {other:?}")),
        }
    });

    // (probe path, the probe's httpHeaders the kubelet sends, code, kubelet's verdict)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u16, bool);
    let cases: &[Case] = &[
        (
            "/app-health/web/readyz",
            &[("X-Probe", "kubelet")],
            200,
            true,
        ),
        ("/app-health/web/startupz", &[], 503, false),
        ("/app-lifecycle/web/poststartz", &[], 200, true),
        ("/app-health/web/livez", &[], 200, true),
        ("/app-health/db/livez", &[], 500, false),
        ("/app-health/grpc/readyz", &[], 200, true),
        ("/app-health/grpc/livez", &[], 200, true),
        ("/app-health/grpc/startupz", &[], 500, false),
        ("/app-health/nobody/readyz", &[], 400, false),
    ];
    for (path, headers, code, success) in cases {
        let (got, body) = kubelet_probe(status, path, headers);
        assert_eq!(got, *code, "{path}: {body}");
        assert_eq!(kubelet_success(got), *success, "{path}");
    }

    // What the HTTP app saw of the readiness probe: its path, the Host naming its own port,
    // the kubelet's headers, from the bypass address 127.0.0.6.
    let log = seen.lock().unwrap().clone();
    let ready = log
        .iter()
        .find(|s| s.head.starts_with("GET /healthz "))
        .expect("the app saw the readiness probe");
    assert_eq!(ready.header("host"), Some(format!("127.0.0.1:{http_port}")));
    assert_eq!(ready.header("x-probe").as_deref(), Some("kubelet"));
    assert_eq!(
        ready.header("user-agent").as_deref(),
        Some("kube-probe/1.34")
    );
    assert_eq!(ready.header("accept").as_deref(), Some("*/*"));
    assert_eq!(ready.peer.ip().to_string(), "127.0.0.6");
    // The hook's redirect to /healthz was followed.
    let paths: Vec<&str> = log
        .iter()
        .filter_map(|s| s.head.split_whitespace().nth(1))
        .collect();
    assert!(
        paths.windows(2).any(|w| w == ["/moved", "/healthz"]),
        "{paths:?}"
    );
    drop(tcp);
}
