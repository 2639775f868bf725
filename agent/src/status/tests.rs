//! The status server against a fake Envoy admin/prometheus endpoint and a fake app, all real
//! HTTP servers on 127.0.0.1:0.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::status::probe::{AppProbe, ProbeAction};
use proto::lifecycle::{DrainMode, Readiness, Shutdown};

mod pprof;

/// A fake HTTP server: path → (status, body); records request lines.
async fn fake_http(
    routes: HashMap<String, (u16, String)>,
) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    fake_http_shared(Arc::new(Mutex::new(routes))).await
}

/// [`fake_http`] whose routes the test can change while it serves.
async fn fake_http_shared(
    routes: Arc<Mutex<HashMap<String, (u16, String)>>>,
) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_w = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(answer(s, routes.clone(), seen_w.clone()));
        }
    });
    (addr, seen)
}

/// [`fake_http_shared`] on a Unix socket at `path` (Envoy's admin with lockdown).
fn fake_http_unix(
    path: &std::path::Path,
    routes: Arc<Mutex<HashMap<String, (u16, String)>>>,
) -> Arc<Mutex<Vec<String>>> {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_w = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(answer(s, routes.clone(), seen_w.clone()));
        }
    });
    seen
}

/// Answers one request of a fake server from `routes`.
async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    routes: Arc<Mutex<HashMap<String, (u16, String)>>>,
    seen: Arc<Mutex<Vec<String>>>,
) {
    let mut buf = vec![0u8; 8192];
    let n = s.read(&mut buf).await.unwrap_or(0);
    let req = String::from_utf8_lossy(&buf[..n]).to_string();
    let line = req.lines().next().unwrap_or("").to_string();
    seen.lock().unwrap().push(line.clone());
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let key = path.split('?').next().unwrap_or("").to_string();
    let (code, body) = routes
        .lock()
        .unwrap()
        .get(&key)
        .cloned()
        .unwrap_or((404, String::new()));
    let resp = format!(
        "HTTP/1.1 {code} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
}

async fn get(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    crate::client::send(
        method,
        &format!("http://{addr}{path}"),
        None,
        Duration::from_secs(10),
    )
    .await
    .unwrap()
}

struct Setup {
    addr: SocketAddr,
    /// Stops the server (the agent's components stopping, after Envoy has exited).
    stop: CancellationToken,
    shutdown: Shutdown,
    readiness: Readiness,
    envoy_seen: Arc<Mutex<Vec<String>>>,
    /// Envoy's admin answers, changeable while the server runs.
    admin_routes: Arc<Mutex<HashMap<String, (u16, String)>>>,
    /// Envoy's prometheus listener's answers, changeable while the server runs.
    prom_routes: Arc<Mutex<HashMap<String, (u16, String)>>>,
}

async fn setup(envoy_stats: &str, ready_stats: &str, app_port: Option<u16>) -> Setup {
    setup_with(envoy_stats, ready_stats, app_port, conn::Limits::default()).await
}

async fn setup_with(
    envoy_stats: &str,
    ready_stats: &str,
    app_port: Option<u16>,
    limits: conn::Limits,
) -> Setup {
    setup_locked(envoy_stats, ready_stats, app_port, limits, None, None, true).await
}

/// [`setup_with`] with `PROXY_LIFECYCLE_LOCKDOWN`'s parts: a lockdown rule, and Envoy's admin on
/// a Unix socket at `admin_socket`; and `--profiling`.
async fn setup_locked(
    envoy_stats: &str,
    ready_stats: &str,
    app_port: Option<u16>,
    limits: conn::Limits,
    lockdown: Option<lockdown::Lockdown>,
    admin_socket: Option<&std::path::Path>,
    profiling: bool,
) -> Setup {
    let mut routes = HashMap::new();
    routes.insert(
        "/stats/prometheus".to_string(),
        (200, "envoy_up 1\n".to_string()),
    );
    let prom_routes = Arc::new(Mutex::new(routes));
    let (prom, _) = fake_http_shared(prom_routes.clone()).await;
    // Envoy's admin answers every /stats query with both readiness parts.
    let mut routes = HashMap::new();
    routes.insert(
        "/stats".to_string(),
        (200, format!("{envoy_stats}{ready_stats}")),
    );
    routes.insert("/drain_listeners".to_string(), (200, "OK".to_string()));
    let admin_routes = Arc::new(Mutex::new(routes));
    let (admin, seen) = match admin_socket {
        Some(path) => (
            crate::http1::Target::Unix(path.to_path_buf()),
            fake_http_unix(path, admin_routes.clone()),
        ),
        None => {
            let (addr, seen) = fake_http_shared(admin_routes.clone()).await;
            (crate::http1::Target::Tcp(addr.to_string()), seen)
        }
    };

    // As `App::bind`: Go's process metrics at the root, the agent's under `istio_agent_`.
    let mut registry = Registry::default();
    registry.register_collector(Box::new(process::ProcessCollector));
    let metrics = Metrics::new(registry.sub_registry_with_prefix("istio_agent"));
    let readiness = Readiness::default();
    let shutdown = Shutdown::default();
    let mut probers = AppProbers::new();
    if let Some(port) = app_port {
        probers.insert(
            "/app-health/app/readyz".into(),
            AppProbe {
                action: ProbeAction::Http {
                    path: "/ready".into(),
                    port,
                    host: String::new(),
                    https: false,
                    headers: vec![],
                },
                timeout: Duration::from_secs(2),
            },
        );
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = StatusServer::new(
        vec![listener],
        Inputs {
            node_type: NodeType::Sidecar,
            admin: Some(Admin { addr: admin }),
            envoy_prometheus: Some(prom),
            app_metrics: app_port.map(|p| PrometheusAnnotations {
                targets: vec![(p, "/metrics".into())],
            }),
            metrics_localhost_only: false,
            profiling,
            probers,
            prober: Prober {
                destination: "127.0.0.1".parse().unwrap(),
                http2: true,
                keepalive: None,
            },
            registry: Arc::new(registry),
            metrics,
            readiness: readiness.clone(),
            shutdown: shutdown.clone(),
            ndsz: Some(Arc::new(|| Some(r#"{"a.b.":{}}"#.to_string()))),
            config_dump: r#"{"node_id":"sidecar~x"}"#.into(),
            limits,
            lockdown,
        },
    );
    let addr = server.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(server.run(stop.clone()));
    Setup {
        addr,
        stop,
        shutdown,
        readiness,
        envoy_seen: seen,
        admin_routes,
        prom_routes,
    }
}

const CONFIG_OK: &str =
    "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 2\n";
const LIVE: &str = "server.state: 0\nlistener_manager.workers_started: 1\n";

#[tokio::test]
async fn ready_when_envoy_has_config_and_is_live_and_guards_are_done() {
    let s = setup(CONFIG_OK, LIVE, None).await;
    let dns = s.readiness.register(
        "dns",
        "istio DNS capture is turned ON and DNS lookup table is not ready yet",
    );
    let (code, body) = get(s.addr, "GET", "/healthz/ready").await;
    assert_eq!(code, 503);
    assert!(body.contains("DNS lookup table is not ready"), "{body}");
    dns.ready();
    assert_eq!(get(s.addr, "GET", "/healthz/ready").await.0, 200);
    // Shutdown fails readiness at once, and the answer stays 503 while Envoy drains.
    s.shutdown.trigger();
    for _ in 0..3 {
        let (code, body) = get(s.addr, "GET", "/healthz/ready").await;
        assert_eq!(code, 503);
        assert!(body.contains("server is terminated"), "{body}");
    }
    // The rest of the port still answers during the drain.
    assert_eq!(get(s.addr, "GET", "/stats/prometheus").await.0, 200);
    // Once the agent's components stop, the listener closes.
    s.stop.cancel();
    let url = format!("http://{}/healthz/ready", s.addr);
    assert_eventually(|| async {
        crate::client::send("GET", &url, None, Duration::from_secs(1))
            .await
            .is_err()
    })
    .await;
}

#[tokio::test]
async fn not_ready_explains_what_is_pending() {
    let s = setup("cluster_manager.cds.update_success: 0\n", LIVE, None).await;
    let (code, body) = get(s.addr, "GET", "/healthz/ready").await;
    assert_eq!(code, 503);
    assert!(
        body.contains("config not received from XDS server"),
        "{body}"
    );
    let s = setup("cluster_manager.cds.update_rejected: 2\n", LIVE, None).await;
    let (_, body) = get(s.addr, "GET", "/healthz/ready").await;
    assert!(body.contains("rejected"), "{body}");
    let s = setup(CONFIG_OK, "server.state: 3\n", None).await;
    let (code, body) = get(s.addr, "GET", "/healthz/ready").await;
    assert_eq!(code, 503);
    assert!(body.contains("INITIALIZING"), "{body}");
    // No `server.state` in Envoy's answer, or workers not started: not ready (as Istio).
    let s = setup(CONFIG_OK, "listener_manager.workers_started: 1\n", None).await;
    let (code, body) = get(s.addr, "GET", "/healthz/ready").await;
    assert_eq!(code, 503);
    assert!(body.contains("server.state is not yet updated"), "{body}");
    let s = setup(CONFIG_OK, "server.state: 0\n", None).await;
    let (code, body) = get(s.addr, "GET", "/healthz/ready").await;
    assert_eq!(code, 503);
    assert!(body.contains("workers have not yet started"), "{body}");
}

/// The native sidecar's preStop hook calls `/drain`: like Istio's agent, it answers 200 and
/// the drain counts as done even when Envoy's admin call fails (a failed hook is only noise in
/// the pod's events; the shutdown that follows exits at once either way).
#[tokio::test]
async fn drain_answers_ok_when_envoys_admin_fails() {
    let s = setup(CONFIG_OK, LIVE, None).await;
    s.admin_routes
        .lock()
        .unwrap()
        .insert("/drain_listeners".into(), (503, "busy".into()));
    assert_eq!(get(s.addr, "POST", "/drain").await, (200, "OK".into()));
    assert_eq!(s.shutdown.mode(), DrainMode::Immediate);
}

#[tokio::test]
async fn quitquitquit_and_drain() {
    let s = setup(CONFIG_OK, LIVE, None).await;
    assert_eq!(get(s.addr, "GET", "/quitquitquit").await.0, 405);
    assert_eq!(get(s.addr, "POST", "/drain").await, (200, "OK".into()));
    assert!(
        s.envoy_seen
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("/drain_listeners?inboundonly&graceful&skip_exit"))
    );
    assert_eq!(s.shutdown.mode(), DrainMode::Immediate);
    assert!(!s.shutdown.is_shutting_down());
    assert_eq!(
        get(s.addr, "POST", "/quitquitquit").await,
        (200, "OK".into())
    );
    assert!(s.shutdown.is_shutting_down());
}

/// POSTs `path` with curl running as `uid` (the test runs as root).
async fn post_as(uid: u32, addr: SocketAddr, path: &str) -> (u16, String) {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("curl");
    cmd.uid(uid)
        .gid(uid)
        .args([
            "-sS",
            "--max-time",
            "5",
            "-X",
            "POST",
            "-w",
            "\n%{http_code}",
        ])
        .arg(format!("http://{addr}{path}"));
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.parse().unwrap_or(0), body.to_string())
}

/// With lockdown, `/quitquitquit` and `/drain` answer the proxy's own uid (here: ours, looked
/// up through sock_diag) and refuse any other with 403 and why; readiness and drain reach
/// Envoy's admin over its Unix socket.
#[tokio::test]
async fn lockdown_admits_the_proxys_uid_and_talks_to_admin_over_its_socket() {
    let me = nix::unistd::geteuid().as_raw();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("admin.sock");
    let ours = lockdown::Lockdown {
        proxy_uids: vec![me],
    };
    let s = setup_locked(
        CONFIG_OK,
        LIVE,
        None,
        conn::Limits::default(),
        Some(ours),
        Some(&sock),
        true,
    )
    .await;
    assert_eq!(get(s.addr, "GET", "/healthz/ready").await, (200, "".into()));
    assert_eq!(get(s.addr, "GET", "/quitquitquit").await.0, 405);
    assert_eq!(get(s.addr, "POST", "/drain").await, (200, "OK".into()));
    assert!(
        s.envoy_seen
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("POST /drain_listeners?inboundonly&graceful&skip_exit")),
        "{:?}",
        s.envoy_seen.lock().unwrap()
    );
    assert_eq!(
        get(s.addr, "POST", "/quitquitquit").await,
        (200, "OK".into())
    );
    assert!(s.shutdown.is_shutting_down());

    // Another uid: ours when we are not root, else a curl run as nobody (root is always
    // admitted).
    let caller = if me == 0 { 65534 } else { me };
    if me == 0
        && std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("curl not found: the refusal of another uid is left to the e2e test");
        return;
    }
    let theirs = lockdown::Lockdown {
        proxy_uids: vec![caller + 1],
    };
    let sock = dir.path().join("admin2.sock");
    let s = setup_locked(
        CONFIG_OK,
        LIVE,
        None,
        conn::Limits::default(),
        Some(theirs),
        Some(&sock),
        true,
    )
    .await;
    for path in ["/quitquitquit", "/drain"] {
        let (code, body) = if me == 0 {
            post_as(caller, s.addr, path).await
        } else {
            get(s.addr, "POST", path).await
        };
        assert_eq!(code, 403, "{path}: {body}");
        assert!(
            body.contains("PROXY_LIFECYCLE_LOCKDOWN") && body.contains(&format!("uid {caller}")),
            "{body}"
        );
    }
    assert!(!s.shutdown.is_shutting_down());
    assert!(
        s.envoy_seen
            .lock()
            .unwrap()
            .iter()
            .all(|l| !l.contains("drain"))
    );
    // Read-only endpoints stay open to every loopback peer.
    assert_eq!(get(s.addr, "GET", "/healthz/ready").await.0, 200);
}

#[tokio::test]
async fn merged_metrics_app_probes_and_ndsz() {
    let mut routes = HashMap::new();
    routes.insert(
        "/metrics".to_string(),
        (200, "app_requests_total 7\n# EOF\n".to_string()),
    );
    routes.insert("/ready".to_string(), (200, "app ready".to_string()));
    let (app, app_seen) = fake_http(routes).await;
    let s = setup(CONFIG_OK, LIVE, Some(app.port())).await;

    let (code, body) = get(s.addr, "GET", "/stats/prometheus").await;
    assert_eq!(code, 200);
    let agent = body
        .find("istio_agent_scrapes_total")
        .expect("agent metrics");
    let envoy = body.find("envoy_up 1").expect("envoy metrics");
    let app_pos = body.find("app_requests_total 7").expect("app metrics");
    assert!(agent < envoy && envoy < app_pos, "order: {body}");
    // One target's answer goes out as it came (as Istio's agent); untyped, it is text.
    assert!(body.ends_with("app_requests_total 7\n# EOF\n"), "{body}");
    assert!(!body[..app_pos].contains("# EOF"), "{body}");
    // Istio's process metrics (unprefixed) and its startup figure, set by the first ready answer.
    for name in [
        "process_cpu_seconds_total ",
        "process_open_fds ",
        "process_resident_memory_bytes ",
    ] {
        assert!(body.contains(name), "{name}: {body}");
    }
    assert!(
        body.contains("istio_agent_startup_duration_seconds 0.0"),
        "{body}"
    );
    assert_eq!(get(s.addr, "GET", "/healthz/ready").await.0, 200);
    let (_, body) = get(s.addr, "GET", "/stats/prometheus").await;
    let startup: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("istio_agent_startup_duration_seconds "))
        .expect("startup figure")
        .parse()
        .unwrap();
    assert!(startup > 0.0, "{body}");

    let (code, body) = get(s.addr, "GET", "/app-health/app/readyz").await;
    assert_eq!((code, body.as_str()), (200, "app ready"));
    assert!(
        app_seen
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("GET /ready"))
    );
    let (code, body) = get(s.addr, "GET", "/app-health/other/livez").await;
    assert_eq!(code, 400);
    assert!(body.contains("app prober config does not exists"));

    assert_eq!(
        get(s.addr, "GET", "/debug/ndsz").await,
        (200, r#"{"a.b.":{}}"#.into())
    );
    assert_eq!(
        get(s.addr, "GET", "/debug/config_dump").await,
        (200, r#"{"node_id":"sidecar~x"}"#.into())
    );
}

/// Connects to `addr` from `src` (any loopback address: 127.0.0.6 stands for a remote peer).
async fn connect_from(src: &str, addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{src}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.expect("connect")
}

/// One HTTP/1.1 request from `src`; the response's status code (0: closed without one).
async fn raw_request(src: &str, addr: SocketAddr, method: &str, path: &str) -> u16 {
    let mut s = connect_from(src, addr).await;
    let req = format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return 0;
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// True when the server closes `s` within `wait` (reads what it sends first).
async fn closed_within(s: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn lifecycle_and_debug_endpoints_refuse_the_inbound_passthrough_source() {
    let s = setup(CONFIG_OK, LIVE, None).await;
    for (method, path) in [
        ("POST", "/quitquitquit"),
        ("POST", "/drain"),
        ("GET", "/debug/config_dump"),
        ("GET", "/debug/ndsz"),
    ] {
        assert_eq!(
            raw_request("127.0.0.6", s.addr, method, path).await,
            403,
            "{path}"
        );
    }
    assert!(!s.shutdown.is_shutting_down());
    assert_eq!(s.shutdown.mode(), DrainMode::Graceful, "/drain refused");
    assert!(
        !s.envoy_seen
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("drain")),
        "Envoy was not drained"
    );
    assert_eq!(
        raw_request("127.0.0.6", s.addr, "GET", "/healthz/ready").await,
        200
    );
    assert_eq!(
        raw_request("127.0.0.1", s.addr, "GET", "/debug/ndsz").await,
        200
    );
    assert_eq!(
        raw_request("127.0.0.1", s.addr, "POST", "/quitquitquit").await,
        200
    );
    assert!(s.shutdown.is_shutting_down());
}

#[tokio::test]
async fn a_peer_holding_connections_is_capped_and_probes_still_answer() {
    let limits = conn::Limits {
        remote: proto::listen::Caps {
            total: 6,
            per_peer: 3,
        },
        ..conn::Limits::default()
    };
    let s = setup_with(CONFIG_OK, LIVE, None, limits).await;
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(connect_from("127.0.0.6", s.addr).await);
    }
    let mut closed = 0;
    for c in &mut held {
        // Refused ones are closed at once; the 3 admitted stay (10 s header timeout).
        if closed_within(c, Duration::from_millis(500)).await {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 17,
        "all but the peer's 3 closed (3 idle ones stay open)"
    );
    // Other peers (127.0.0.7, standing for the kubelet, counts as local here) get answers.
    assert_eq!(
        raw_request("127.0.0.7", s.addr, "GET", "/healthz/ready").await,
        200
    );
    assert_eq!(
        raw_request("127.0.0.1", s.addr, "GET", "/healthz/ready").await,
        200
    );
    // Once the peer lets go, it gets in again.
    held.clear();
    assert_eventually(|| async {
        raw_request("127.0.0.6", s.addr, "GET", "/healthz/ready").await == 200
    })
    .await;
}

#[tokio::test]
async fn peers_on_many_addresses_filling_the_remote_slots_do_not_keep_probes_out() {
    // On loopback the one remote address is 127.0.0.6 (every other one is the pod's own): with
    // the cap per peer above the total, it stands for peers on many addresses taking every
    // remote slot (unit cases with distinct addresses: `conn::tests`).
    let limits = conn::Limits {
        remote: proto::listen::Caps {
            total: 4,
            per_peer: 8,
        },
        ..conn::Limits::default()
    };
    let s = setup_with(CONFIG_OK, LIVE, None, limits).await;
    const REMOTE: &str = "127.0.0.6";
    let mut held = Vec::new();
    for _ in 0..4 {
        // Accepted in this order: the first is the oldest.
        held.push(connect_from(REMOTE, s.addr).await);
    }
    // A remote probe, twice: answered each time, by closing the idle connection held the
    // longest. (Before the second, the peers take the freed slot back.)
    for probe in 0..2 {
        if probe > 0 {
            held.push(connect_from(REMOTE, s.addr).await);
        }
        assert_eq!(
            raw_request(REMOTE, s.addr, "GET", "/healthz/ready").await,
            200,
            "probe {probe}"
        );
        assert!(
            closed_within(&mut held[probe], Duration::from_secs(5)).await,
            "probe {probe}: the oldest idle connection made room"
        );
    }
    for (i, c) in held.iter_mut().enumerate().skip(2) {
        assert!(
            !closed_within(c, Duration::from_millis(200)).await,
            "connection {i} is newer and stays"
        );
    }
}

/// An app metrics endpoint that accepts and never answers (with `head`, sends that and then
/// stalls); counts the connections it accepted and those its peer closed.
async fn stalled_app(
    head: Option<&'static str>,
) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, c) = (accepted.clone(), closed.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            let c = c.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                if let Some(head) = head {
                    let _ = s.write_all(head.as_bytes()).await;
                }
                // Until the agent closes its end.
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                c.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, accepted, closed)
}

/// Sends a scrape on a new connection from `src` and leaves it unread.
async fn start_scrape(src: &str, addr: SocketAddr, timeout_header: &str) -> tokio::net::TcpStream {
    let mut s = connect_from(src, addr).await;
    let req = format!(
        "GET /stats/prometheus HTTP/1.1\r\nhost: x\r\n{timeout_header}connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// Remote peers holding every remote slot with scrapes an app never answers (the scrapes
/// running, not idle) do not keep the kubelet out: a probe's connection takes the oldest
/// scrape's slot.
#[tokio::test]
async fn stalled_scrapes_filling_the_remote_slots_do_not_keep_probes_out() {
    let (app, accepted, _) = stalled_app(None).await;
    let limits = conn::Limits {
        remote: proto::listen::Caps {
            total: 4,
            per_peer: 8,
        },
        ..conn::Limits::default()
    };
    let s = setup_with(CONFIG_OK, LIVE, Some(app.port()), limits).await;
    const REMOTE: &str = "127.0.0.6";
    let mut scrapes = Vec::new();
    for _ in 0..4 {
        scrapes.push(start_scrape(REMOTE, s.addr, "").await);
    }
    assert_eventually(|| async { accepted.load(Ordering::SeqCst) == 4 }).await;
    for probe in 0..3 {
        assert_eq!(
            raw_request(REMOTE, s.addr, "GET", "/healthz/ready").await,
            200,
            "probe {probe} with every remote slot running a scrape"
        );
        // The peers take the slot back with another stalled scrape.
        scrapes.push(start_scrape(REMOTE, s.addr, "").await);
        assert_eventually(|| async { accepted.load(Ordering::SeqCst) == 5 + probe }).await;
    }
    for (i, c) in scrapes.iter_mut().enumerate().take(3) {
        assert!(
            closed_within(c, Duration::from_secs(5)).await,
            "scrape {i}, among the oldest, made room"
        );
    }
}

/// The figure for `docs/reliability.md`: the agent's default 1,024 remote slots all running a
/// scrape that an app never answers (127.0.0.6 standing for peers on many addresses), then 50
/// remote probes one after the other; prints `FIGURE`. Run with `--ignored --nocapture`.
#[tokio::test]
#[ignore = "a figure: 1,024 stalled scrapes"]
async fn figure_probes_with_every_remote_slot_scraping() {
    let (app, accepted, _) = stalled_app(None).await;
    let limits = conn::Limits {
        remote: proto::listen::Caps {
            total: 1024,
            per_peer: 4096,
        },
        ..conn::Limits::default()
    };
    let s = setup_with(CONFIG_OK, LIVE, Some(app.port()), limits).await;
    const REMOTE: &str = "127.0.0.6";
    let mut scrapes = Vec::new();
    for _ in 0..1024 {
        scrapes.push(
            start_scrape(
                REMOTE,
                s.addr,
                "x-prometheus-scrape-timeout-seconds: 60\r\n",
            )
            .await,
        );
    }
    assert_eventually(|| async { accepted.load(Ordering::SeqCst) == 1024 }).await;
    let mut times = Vec::new();
    let mut answered = 0;
    for _ in 0..50 {
        let t = tokio::time::Instant::now();
        if raw_request(REMOTE, s.addr, "GET", "/healthz/ready").await == 200 {
            answered += 1;
        }
        times.push(t.elapsed());
        // The peers take the slot back.
        scrapes.push(
            start_scrape(
                REMOTE,
                s.addr,
                "x-prometheus-scrape-timeout-seconds: 60\r\n",
            )
            .await,
        );
    }
    times.sort();
    eprintln!(
        "FIGURE probes_with_remote_slots_scraping answered={answered}/50 p50={:?} max={:?} app_connections={}",
        times[25],
        times[49],
        accepted.load(Ordering::SeqCst)
    );
    assert_eq!(answered, 50);
}

/// The figure for `docs/reliability.md`: 300 scrapes (60 s scrape timeout) of an app that
/// never answers, whose clients give up after 100 ms; the app's connections still open, and
/// the process's descriptors, 1 s and 30 s later. Prints `FIGURE`.
#[tokio::test]
#[ignore = "a figure: 30 s"]
async fn figure_scrapes_whose_clients_gave_up() {
    let (app, accepted, closed) = stalled_app(None).await;
    let s = setup(CONFIG_OK, LIVE, Some(app.port())).await;
    let fds = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let before = fds();
    for _ in 0..300 {
        let c = start_scrape(
            "127.0.0.1",
            s.addr,
            "x-prometheus-scrape-timeout-seconds: 60\r\n",
        )
        .await;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(c);
        });
    }
    assert_eventually(|| async { accepted.load(Ordering::SeqCst) == 300 }).await;
    for wait in [1, 29] {
        tokio::time::sleep(Duration::from_secs(wait)).await;
        let open = accepted.load(Ordering::SeqCst) - closed.load(Ordering::SeqCst);
        eprintln!(
            "FIGURE scrapes_whose_clients_gave_up after={}s app_connections_open={open} process_fds_over_start={}",
            if wait == 1 { 1 } else { 30 },
            fds().saturating_sub(before)
        );
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        closed.load(Ordering::SeqCst)
    );
}

/// A scraper that gives up takes the app's read with it: the app sees its connection closed at
/// once, not at the scrape's timeout (30 s here).
#[tokio::test]
async fn a_client_that_goes_away_cancels_the_app_read() {
    let (app, accepted, closed) = stalled_app(None).await;
    let s = setup(CONFIG_OK, LIVE, Some(app.port())).await;
    for src in ["127.0.0.1", "127.0.0.6"] {
        let (before, n) = (
            closed.load(Ordering::SeqCst),
            accepted.load(Ordering::SeqCst),
        );
        let scrape = start_scrape(src, s.addr, "x-prometheus-scrape-timeout-seconds: 30\r\n").await;
        assert_eventually(|| async { accepted.load(Ordering::SeqCst) > n }).await;
        drop(scrape);
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        while closed.load(Ordering::SeqCst) == before {
            assert!(
                tokio::time::Instant::now() < until,
                "{src}: the app's connection is still open 3 s after the client went"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An app that sends its head and then stalls its body is cut at the scrape's deadline; the
/// answer comes with the rest, and the failure is counted.
#[tokio::test]
async fn an_app_stalling_its_body_is_cut_at_the_scrape_deadline() {
    let (app, _, closed) = stalled_app(Some(
        "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\napp_partial 1\n",
    ))
    .await;
    let s = setup(CONFIG_OK, LIVE, Some(app.port())).await;
    let scrape = || async {
        let mut c = start_scrape(
            "127.0.0.1",
            s.addr,
            "x-prometheus-scrape-timeout-seconds: 0.5\r\n",
        )
        .await;
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
            .await
            .expect("answered within 5 s")
            .unwrap();
        String::from_utf8_lossy(&out).to_string()
    };
    let start = tokio::time::Instant::now();
    let body = scrape().await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("envoy_up 1"), "{body}");
    assert!(!body.contains("app_partial"), "{body}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eventually(|| async { closed.load(Ordering::SeqCst) == 1 }).await;
    let body = scrape().await;
    assert!(
        body.contains("istio_agent_scrape_failures_total{type=\"application\"} 1"),
        "{body}"
    );
}

/// Polls `f` every 20 ms for up to 10 s.
async fn assert_eventually<F, Fut>(f: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..500 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not met within 10 s");
}

#[tokio::test]
async fn slow_silent_and_idle_connections_are_closed() {
    let limits = conn::Limits {
        header_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(600),
        ..conn::Limits::default()
    };
    let s = setup_with(CONFIG_OK, LIVE, None, limits).await;
    // Slowloris: a request line that never ends.
    let mut slow = connect_from("127.0.0.7", s.addr).await;
    slow.write_all(b"GET /healthz/re").await.unwrap();
    // A connection that never sends a byte.
    let mut silent = connect_from("127.0.0.7", s.addr).await;
    // Keep-alive: two requests are served on one connection, then it idles out.
    let mut keep = connect_from("127.0.0.7", s.addr).await;
    let req = b"GET /healthz/ready HTTP/1.1\r\nhost: x\r\n\r\n";
    for _ in 0..2 {
        keep.write_all(req).await.unwrap();
        let mut buf = [0u8; 1024];
        let n = keep.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    }
    assert!(
        closed_within(&mut slow, Duration::from_secs(5)).await,
        "header timeout"
    );
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await,
        "no request"
    );
    assert!(
        closed_within(&mut keep, Duration::from_secs(5)).await,
        "idle timeout"
    );
}

/// Envoy's stats over the 10 MiB cap are cut at the last whole line (a partial line makes
/// Prometheus reject the whole scrape), and the failure is counted.
#[tokio::test]
async fn envoy_stats_over_the_cap_end_on_a_whole_line() {
    let s = setup(CONFIG_OK, LIVE, None).await;
    let mut big = String::with_capacity(stats::TARGET_CAP + (1 << 20));
    let mut i = 0u64;
    while big.len() <= stats::TARGET_CAP + 1000 {
        big.push_str(&format!(
            "envoy_cluster_upstream_rq_total{{cluster=\"c{i}\"}} {i}\n"
        ));
        i += 1;
    }
    s.prom_routes
        .lock()
        .unwrap()
        .insert("/stats/prometheus".into(), (200, big));
    let (code, body) = get(s.addr, "GET", "/stats/prometheus").await;
    assert_eq!(code, 200);
    assert!(body.ends_with('\n'));
    for line in body.lines().filter(|l| l.starts_with("envoy_cluster")) {
        let (name, value) = line.rsplit_once(' ').expect("name value");
        assert!(name.ends_with("\"}"), "cut line: {line:?}");
        value
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("cut value: {line:?}"));
    }
    assert!(
        body.len() <= stats::TARGET_CAP + (64 << 10),
        "{}",
        body.len()
    );
    let (_, body) = get(s.addr, "GET", "/stats/prometheus").await;
    assert!(
        body.contains("istio_agent_scrape_failures_total{type=\"envoy\"} 1"),
        "the cut is counted"
    );
}

#[test]
fn untyped_bodies_get_the_type_go_sniffs() {
    assert_eq!(sniffed(b""), None);
    assert_eq!(sniffed(b"ok\n"), Some("text/plain; charset=utf-8"));
    assert_eq!(
        sniffed(br#"{"status":"UP"}"#),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(
        sniffed(b"  <html><body>up</body></html>"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(
        sniffed(b"<?xml version=\"1.0\"?><up/>"),
        Some("text/xml; charset=utf-8")
    );
    assert_eq!(sniffed(b"\x00\x01binary"), Some("application/octet-stream"));
}
