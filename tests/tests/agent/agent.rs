//! pilot-agent end to end: Istio's injection argv and env, in a network namespace, against
//! istiod-lite, with real Envoy: readiness on 15021, config through the xDS proxy, the SPIFFE
//! certificate through SDS, SIGTERM drain, app probes, merged metrics, istiod restarts.

use harness::mesh::{HTTPBIN, Mesh, NAMESPACE, Pod, httpbin_service};
use harness::{Child, assert_eventually, envoy_bin, require_bin};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const HOST: &str = HTTPBIN;

fn config(server_ip: &str) -> String {
    httpbin_service(server_ip)
}

fn prerequisites() -> bool {
    harness::mesh::prerequisites(&[])
}

/// Waits for readiness on 15021; on failure prints what the agent and Envoy say.
fn wait_ready(mesh: &Mesh, pod: &Pod, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        match mesh.probe(pod, 15021, "/healthz/ready") {
            Ok((200, _)) => return,
            other if Instant::now() >= deadline => {
                let status = pod.get("127.0.0.1:15020".parse().expect("addr"), "/healthz/ready");
                let init = pod.envoy_admin("/init_dump");
                let stats = pod.envoy_admin(
                    "/stats?usedonly&filter=(server.state|update_|sds|warming|init_fetch)",
                );
                eprintln!("Envoy init_dump: {init:?}");
                panic!(
                    "{} not ready on 15021: {other:?}\nagent 15020: {status:?}\nEnvoy stats: {stats:?}",
                    pod.name
                );
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[test]
fn injected_sidecar_becomes_ready_with_config_and_spiffe_cert() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("server", "httpbin");
    mesh.start_app(&mut pod, "0.0.0.0:8080", "httpbin-v1");
    inject_with(
        &mesh,
        &mut pod,
        &[
            ("ISTIO_META_DNS_CAPTURE", "true".to_string()),
            (
                "ISTIO_PROMETHEUS_ANNOTATIONS",
                r#"{"scrape":"true","port":"8080","path":"/metrics"}"#.to_string(),
            ),
        ],
    );
    // Ready through Envoy's 15021 listener, which routes to the agent: needs Envoy's config
    // (through the xDS proxy), its certificates (through SDS) and the DNS table (NDS).
    wait_ready(&mesh, &pod, Duration::from_secs(30));

    // Envoy's config came from istiod-lite through the xDS proxy.
    let (code, dump) = pod.envoy_admin("/config_dump").expect("config_dump");
    assert_eq!(code, 200);
    assert!(dump.contains(HOST), "config_dump lacks {HOST}");
    assert!(
        dump.contains("virtualInbound"),
        "config_dump lacks istiod-lite's listeners"
    );
    // The workload certificate came through SDS.
    let (code, certs) = pod.envoy_admin("/certs").expect("certs");
    assert_eq!(code, 200);
    assert!(
        certs.contains("spiffe://cluster.local/ns/demo/sa/httpbin"),
        "certs: {certs}"
    );
    // The NDS table reached the DNS proxy (loopback-only debug endpoint).
    let (code, ndsz) = pod
        .get("127.0.0.1:15020".parse().expect("addr"), "/debug/ndsz")
        .expect("ndsz");
    assert_eq!(code, 200);
    assert!(ndsz.contains(HOST), "ndsz: {ndsz}");
    // Merged metrics on the status port (what Prometheus scrapes, from the node): the agent's,
    // then Envoy's (through 15090), then the app's.
    let (code, metrics) = mesh
        .probe(&pod, 15020, "/stats/prometheus")
        .expect("metrics");
    assert_eq!(code, 200);
    let agent = metrics
        .find("istio_agent_xds_proxy_responses")
        .expect("agent metrics");
    let envoy = metrics.find("envoy_server_live").expect("Envoy metrics");
    let app = metrics.find("hello from httpbin-v1").expect("app metrics");
    assert!(agent < envoy && envoy < app, "order of merged metrics");
}

/// A pod whose working directory is nested past the 108-byte `sun_path` limit: the agent binds
/// its SDS and XDS sockets and Envoy reaches them by Istio's relative paths
/// (`./var/run/secrets/workload-spiffe-uds/socket`, `./etc/istio/proxy/XDS`), so the sidecar
/// gets its config and certificate as anywhere else.
#[test]
fn sidecar_in_a_working_directory_past_sun_path_becomes_ready() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("server", "httpbin");
    // The pod's files moved under a deep directory, traversable by the proxy user.
    let deep = pod
        .dir
        .with_file_name(format!("{}/{}", "d".repeat(60), "e".repeat(60)));
    std::fs::create_dir_all(deep.parent().expect("parent")).expect("deep dir");
    std::fs::rename(&pod.dir, &deep).expect("move the pod dir");
    pod.dir = deep;
    let sds = pod.dir.join("var/run/secrets/workload-spiffe-uds/socket");
    assert!(
        sds.as_os_str().len() > 108,
        "{} fits sun_path",
        sds.display()
    );
    mesh.start_app(&mut pod, "0.0.0.0:8080", "httpbin-v1");
    inject_with(&mesh, &mut pod, &[]);
    wait_ready(&mesh, &pod, Duration::from_secs(30));
    let (code, certs) = pod.envoy_admin("/certs").expect("certs");
    assert_eq!(code, 200);
    assert!(
        certs.contains("spiffe://cluster.local/ns/demo/sa/httpbin"),
        "certs: {certs}"
    );
    let (code, dump) = pod.envoy_admin("/config_dump").expect("config_dump");
    assert_eq!(code, 200);
    assert!(dump.contains(HOST), "config_dump lacks {HOST}");
    assert!(sds.exists(), "the SDS socket is where Istio puts it");
}

/// `COMPLIANCE_POLICY`: under each policy the agent's own connections to istiod-lite (CA and
/// xDS) complete their handshakes within the policy (TLS 1.2 ECDHE AES-GCM on P-256 for
/// fips-140-2, X25519MLKEM768 for pqc) and the sidecar becomes ready with its certificate.
#[test]
fn sidecar_becomes_ready_under_each_compliance_policy() {
    if !prerequisites() {
        return;
    }
    for policy in ["fips-140-2", "fips-140-3", "pqc"] {
        let mut mesh = Mesh::new(&config("198.18.1.2"));
        mesh.start_istiod();
        let mut pod = mesh.pod("server", "httpbin");
        mesh.start_app(&mut pod, "0.0.0.0:8080", "httpbin-v1");
        inject_with(
            &mesh,
            &mut pod,
            &[("COMPLIANCE_POLICY", policy.to_string())],
        );
        wait_ready(&mesh, &pod, Duration::from_secs(30));
        let (code, certs) = pod.envoy_admin("/certs").expect("certs");
        assert_eq!(code, 200, "{policy}");
        assert!(
            certs.contains("spiffe://cluster.local/ns/demo/sa/httpbin"),
            "{policy}: {certs}"
        );
    }
}

/// Istio's injection with `extra` env on top (see [`Mesh::inject_with`]).
fn inject_with(mesh: &Mesh, pod: &mut Pod, extra: &[(&str, String)]) {
    mesh.inject_with(pod, extra);
}

fn agent(pod: &mut Pod) -> &mut Child {
    pod.agent.as_mut().expect("agent started")
}

/// Waits until Envoy is up and connected to the agent's xDS proxy.
fn wait_envoy_connected(pod: &mut Pod) {
    agent(pod).wait_for_line("Envoy connected to the xDS proxy", Duration::from_secs(20));
    assert_eventually(Duration::from_secs(10), || {
        match pod.envoy_admin("/ready") {
            Ok((_, _)) => Ok(()),
            Err(e) => Err(e),
        }
    });
}

fn line_index(lines: &[String], needle: &str) -> usize {
    lines
        .iter()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("agent never logged {needle:?}"))
}

#[test]
fn sigterm_drains_inbound_listeners_then_exits_zero() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("drain", "httpbin");
    inject_with(
        &mesh,
        &mut pod,
        &[(
            "PROXY_CONFIG",
            format!(
                r#"{{"binaryPath":"{}","discoveryAddress":"istiod.istio-system.svc:15012","terminationDrainDuration":"2s"}}"#,
                mesh.bin("envoy").display()
            ),
        )],
    );
    wait_envoy_connected(&mut pod);
    let started = Instant::now();
    agent(&mut pod).signal(nix::sys::signal::Signal::SIGTERM);
    // Readiness fails at once and stays failed (503) while Envoy drains; Envoy keeps running.
    assert_eventually(Duration::from_secs(2), || {
        match pod.get("127.0.0.1:15020".parse().expect("addr"), "/healthz/ready") {
            Ok((503, body)) if body.contains("server is terminated") => Ok(()),
            other => Err(format!("not yet 503 terminating: {other:?}")),
        }
    });
    let (code, _) = pod
        .envoy_admin("/ready")
        .expect("Envoy alive while draining");
    assert!(code == 200 || code == 503);
    let (code, body) = pod
        .get("127.0.0.1:15020".parse().expect("addr"), "/healthz/ready")
        .expect("the status port answers until the agent exits");
    assert_eq!(code, 503, "{body}");
    let status = agent(&mut pod)
        .wait_timeout(Duration::from_secs(15))
        .expect("agent exits after the drain");
    assert!(
        pod.get("127.0.0.1:15020".parse().expect("addr"), "/healthz/ready")
            .is_err(),
        "the status port closes with the agent"
    );
    let elapsed = started.elapsed();
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    assert!(
        elapsed >= Duration::from_millis(1900) && elapsed < Duration::from_secs(10),
        "drain took {elapsed:?} (terminationDrainDuration 2s)"
    );
    let lines = agent(&mut pod).output();
    let drained = line_index(&lines, "Envoy draining listeners");
    let stopped = line_index(&lines, "Envoy stopped");
    assert!(drained < stopped, "drain must come before stop");
    // envoy-rev.json is removed once Envoy is gone.
    assert!(!pod.dir.join("etc/istio/proxy/envoy-rev.json").exists());
}

#[test]
fn envoy_crash_makes_the_agent_exit_non_zero() {
    if !prerequisites() || !require_bin("pgrep") {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("crash", "httpbin");
    inject_with(&mesh, &mut pod, &[]);
    wait_envoy_connected(&mut pod);
    let agent_pid = agent(&mut pod).id();
    let out = Command::new("pgrep")
        .args(["-P", &agent_pid.to_string()])
        .output()
        .expect("pgrep");
    let envoy_pid: i32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("Envoy is a child of the agent");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(envoy_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill Envoy");
    let status = agent(&mut pod)
        .wait_timeout(Duration::from_secs(10))
        .expect("agent exits when Envoy dies");
    assert_eq!(status.code(), Some(128 + 9), "exit status {status:?}");
}

#[test]
fn app_probes_are_served_on_the_status_port() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("probe", "httpbin");
    mesh.start_app(&mut pod, "0.0.0.0:8080", "httpbin-v1");
    let probers = r#"{"/app-health/app/readyz":{"httpGet":{"path":"/","port":8080},"timeoutSeconds":2},
        "/app-health/app/livez":{"tcpSocket":{"port":8080}},
        "/app-health/app/startupz":{"tcpSocket":{"port":9999},"timeoutSeconds":1}}"#;
    inject_with(
        &mesh,
        &mut pod,
        &[("ISTIO_KUBE_APP_PROBERS", probers.to_string())],
    );
    // The kubelet's rewritten probes reach the app through the agent (source 127.0.0.6, so
    // iptables lets them past Envoy).
    let (code, body) = assert_eventually(Duration::from_secs(20), || {
        match mesh.probe(&pod, 15020, "/app-health/app/readyz") {
            Ok(r) if r.0 == 200 => Ok(r),
            other => Err(format!("readyz: {other:?}")),
        }
    });
    assert_eq!(code, 200);
    assert!(body.contains("httpbin-v1"), "{body}");
    assert_eq!(
        mesh.probe(&pod, 15020, "/app-health/app/livez")
            .map(|r| r.0),
        Ok(200)
    );
    assert_eq!(
        mesh.probe(&pod, 15020, "/app-health/app/startupz")
            .map(|r| r.0),
        Ok(500)
    );
    assert_eq!(
        mesh.probe(&pod, 15020, "/app-health/nope/readyz")
            .map(|r| r.0),
        Ok(400)
    );
    // Loopback-only endpoints refuse the node.
    assert_eq!(
        mesh.probe(&pod, 15020, "/quitquitquit").map(|r| r.0),
        Ok(403)
    );
}

#[test]
fn istiod_outage_keeps_envoy_serving_then_reconnects_and_converges() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("outage", "httpbin");
    // Istio's behaviour: the agent ends Envoy's stream when istiod goes, and Envoy reconnects
    // (by default the agent reconnects itself: tests/tests/agent/xds_reconnect.rs).
    inject_with(
        &mesh,
        &mut pod,
        &[("XDS_PROXY_RECONNECT", "false".to_string())],
    );
    wait_ready(&mesh, &pod, Duration::from_secs(30));
    let connects = |pod: &mut Pod| {
        agent(pod)
            .output()
            .iter()
            .filter(|l| l.contains("Envoy connected to the xDS proxy"))
            .count()
    };
    let before = connects(&mut pod);

    // istiod-lite is down for 30 s: Envoy keeps its config and keeps serving.
    mesh.stop_istiod();
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(30) {
        assert_eq!(
            mesh.probe(&pod, 15021, "/healthz/ready").map(|r| r.0),
            Ok(200),
            "readiness during the outage"
        );
        let (_, dump) = pod.envoy_admin("/config_dump").expect("config_dump");
        assert!(
            dump.contains(HOST),
            "Envoy lost its config during the outage"
        );
        std::thread::sleep(Duration::from_secs(2));
    }

    // Back up, with a new service: Envoy reconnects through a fresh upstream and converges.
    mesh.write_config(
        "extra.yaml",
        &format!(
            r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: extra, namespace: {NAMESPACE} }}
spec:
  hosts: [extra.demo.svc.cluster.local]
  addresses: [198.19.0.11]
  ports: [{{ number: 80, name: http, protocol: HTTP }}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{{ address: 198.18.1.2 }}]
"#
        ),
    );
    mesh.start_istiod();
    assert_eventually(Duration::from_secs(60), || {
        let (_, dump) = pod.envoy_admin("/config_dump")?;
        if dump.contains("extra.demo.svc.cluster.local") {
            Ok(())
        } else {
            Err("Envoy has not received the new service".to_string())
        }
    });
    assert!(connects(&mut pod) > before, "Envoy did not reconnect");
    assert_eq!(
        mesh.probe(&pod, 15021, "/healthz/ready").map(|r| r.0),
        Ok(200)
    );
}

#[test]
fn drain_waits_for_open_connections_with_exit_on_zero_active_connections() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("conns", "httpbin");
    mesh.start_app(&mut pod, "0.0.0.0:8080", "httpbin-v1");
    inject_with(
        &mesh,
        &mut pod,
        &[
            ("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "true".to_string()),
            ("MINIMUM_DRAIN_DURATION", "1s".to_string()),
            // Short drains: a wait bounded by them (ours before, 1 s + max(1 s, 1 s)) would end
            // while the connection below is still open; Istio's is bounded only by the pod's
            // grace period.
            (
                "PROXY_CONFIG",
                format!(
                    r#"{{"binaryPath":"{}","discoveryAddress":"istiod.istio-system.svc:15012","drainDuration":"1s","terminationDrainDuration":"1s"}}"#,
                    mesh.bin("envoy").display()
                ),
            ),
        ],
    );
    wait_ready(&mesh, &pod, Duration::from_secs(30));
    // An open inbound connection (captured into Envoy's inbound listener), from the node.
    let addr: std::net::SocketAddr = format!("{}:8080", pod.ip).parse().expect("addr");
    let conn = mesh
        .node
        .run(move || {
            use std::io::Write;
            let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            // An unfinished request: past Envoy's listener filters, then held open.
            s.write_all(b"GET / HTTP/1.1\r\nHost: httpbin\r\n")?;
            Ok::<_, std::io::Error>(s)
        })
        .expect("connect to the pod");
    assert_eventually(Duration::from_secs(10), || {
        let (_, stats) = pod.envoy_admin("/stats?filter=15006.downstream_cx_active$")?;
        if stats.contains("downstream_cx_active: 1") {
            Ok(())
        } else {
            Err(format!("connection not active in Envoy: {stats}"))
        }
    });

    agent(&mut pod).signal(nix::sys::signal::Signal::SIGTERM);
    agent(&mut pod).wait_for_line("waiting for connections to close", Duration::from_secs(10));
    // Well past every drain setting (1 s each): still waiting for the open connection.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        agent(&mut pod).try_wait().is_none(),
        "the agent must wait while a connection is open, past the drain durations"
    );
    let closed = Instant::now();
    drop(conn);
    let status = agent(&mut pod)
        .wait_timeout(Duration::from_secs(15))
        .expect("agent exits once the connection is gone");
    assert_eq!(status.code(), Some(0));
    assert!(
        closed.elapsed() < Duration::from_secs(10),
        "exit took {:?}",
        closed.elapsed()
    );
    let lines = agent(&mut pod).output();
    assert!(
        line_index(&lines, "Envoy draining listeners")
            < line_index(&lines, "no active downstream connections left")
    );
}

/// Runs `pilot-agent bootstrap sidecar --output envoy-rev.json` in `dir` for pod `p` of
/// NAMESPACE at `instance_ip`, with nothing else of our environment but `env` (and no cloud
/// platform: it runs on the host, where no real metadata server may be asked); it must succeed.
fn write_bootstrap(dir: &Path, instance_ip: &str, env: &[(&str, &str)]) {
    let out = Command::new(harness::workspace_bin("pilot-agent"))
        .args(["bootstrap", "sidecar", "--output", "envoy-rev.json"])
        .current_dir(dir)
        .env_clear()
        .env("CLOUD_PLATFORM", "none")
        .env("POD_NAME", "p")
        .env("POD_NAMESPACE", NAMESPACE)
        .env("INSTANCE_IP", instance_ip)
        .envs(env.iter().copied())
        .output()
        .expect("pilot-agent bootstrap");
    assert!(out.status.success(), "bootstrap: {out:?}");
}

/// Runs `envoy --mode validate` on the `envoy-rev.json` that `write_bootstrap` left in `dir`.
fn envoy_validate(envoy: &Path, dir: &Path) -> std::process::Output {
    Command::new(envoy)
        .args(["--mode", "validate", "-c", "envoy-rev.json"])
        .current_dir(dir)
        .output()
        .expect("envoy --mode validate")
}

#[test]
fn generated_bootstrap_validates_in_real_envoy() {
    let Some(envoy) = envoy_bin() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for delta in ["true", "false"] {
        write_bootstrap(
            dir.path(),
            "198.18.0.2",
            &[
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
                ("ISTIO_METAJSON_LABELS", r#"{"app":"web"}"#),
                ("ISTIO_DELTA_XDS", delta),
            ],
        );
        let out = envoy_validate(&envoy, dir.path());
        assert!(
            out.status.success(),
            "Envoy rejects the bootstrap: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A user bootstrap template in Istio's Go-template style (`ISTIO_BOOTSTRAP`; if/else, range,
/// toJSON, nested `.config`, embedded `.meta_json_str`/`.runtime_flags`/`.pilot_grpc_address`)
/// renders into a bootstrap real Envoy accepts, with and without the optional blocks.
#[test]
fn istio_style_template_validates_in_real_envoy() {
    let Some(envoy) = envoy_bin() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("tmpl.json"),
        include_str!("../../../agent/testdata/istio_style_bootstrap_tmpl.json"),
    )
    .expect("write template");
    let pod = dir.path().join("etc/istio/pod");
    std::fs::create_dir_all(&pod).expect("pod dir");
    for (labels, extra) in [
        ("", ("ISTIO_DELTA_XDS", "false")),
        (
            "topology.istio.io/locality=\"r1.z1.s1\"\n",
            ("ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", "true"),
        ),
    ] {
        std::fs::write(pod.join("labels"), labels).expect("labels");
        write_bootstrap(
            dir.path(),
            "198.18.0.2",
            &[
                ("ISTIO_BOOTSTRAP", "tmpl.json"),
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
                ("ISTIO_METAJSON_LABELS", r#"{"app":"web"}"#),
                extra,
            ],
        );
        let text = std::fs::read_to_string(dir.path().join("envoy-rev.json")).expect("read");
        let v: serde_json::Value = serde_json::from_str(&text).expect("rendered JSON");
        assert_eq!(v["node"]["metadata"]["LABELS"]["app"], "web");
        let out = envoy_validate(&envoy, dir.path());
        assert!(
            out.status.success(),
            "Envoy rejects the rendered template ({extra:?}): {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// ProxyConfig's `proxyStatsMatcher` lands in the bootstrap's `stats_matcher` and real Envoy
/// runs with it (`--mode validate` does not compile the regexps; a real start does) and keeps the
/// stats it names: `runtime.*`, outside Istio's required list, is kept; `filesystem.*` is not.
#[test]
fn proxy_stats_matcher_is_honoured_by_real_envoy() {
    let Some(envoy) = envoy_bin() else {
        return;
    };
    use harness::local::free_port;
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = free_port();
    let proxy_config = format!(
        r#"{{"proxyAdminPort":{admin},"proxyStatsMatcher":{{"inclusionPrefixes":["runtime.","http.{{pod_ip}}_"],"inclusionSuffixes":["upstream_rq_timeout"],"inclusionRegexps":[".*outlier_detection.*","cluster\\.outbound\\|[0-9]+\\|.*"]}}}}"#
    );
    write_bootstrap(
        dir.path(),
        "127.0.0.1",
        &[
            ("ENVOY_STATUS_PORT", &free_port().to_string()),
            ("ENVOY_PROMETHEUS_PORT", &free_port().to_string()),
            ("PROXY_CONFIG", &proxy_config),
        ],
    );
    let text = std::fs::read_to_string(dir.path().join("envoy-rev.json")).expect("bootstrap");
    let bootstrap: serde_json::Value = serde_json::from_str(&text).expect("bootstrap JSON");
    let patterns = bootstrap["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
        .as_array()
        .expect("inclusion patterns")
        .clone();
    for wanted in [
        serde_json::json!({"prefix": "runtime."}),
        serde_json::json!({"prefix": "http.127.0.0.1_"}),
        serde_json::json!({"suffix": "upstream_rq_timeout"}),
        serde_json::json!({"safe_regex": {"regex": ".*outlier_detection.*"}}),
        serde_json::json!({"safe_regex": {"regex": r"cluster\.outbound\|[0-9]+\|.*"}}),
    ] {
        assert!(
            patterns.contains(&wanted),
            "{wanted} missing from {patterns:?}"
        );
    }

    let mut cmd = Command::new(&envoy);
    cmd.args([
        "-c",
        "envoy-rev.json",
        "--base-id-path",
        "base-id",
        "--use-dynamic-base-id",
    ])
    .current_dir(dir.path());
    let mut run = Child::spawn("envoy", cmd);
    let admin_addr: std::net::SocketAddr = ([127, 0, 0, 1], admin).into();
    let stats = assert_eventually(Duration::from_secs(10), || {
        if let Some(status) = run.try_wait() {
            return Err(format!("Envoy exited {status}: {:?}", run.output()));
        }
        match harness::http_get(admin_addr, "/stats") {
            Ok((200, body)) => Ok(body),
            other => Err(format!("admin /stats: {other:?}")),
        }
    });
    assert!(stats.contains("runtime.load_success"), "{stats}");
    assert!(stats.contains("server.live"), "{stats}");
    assert!(!stats.contains("filesystem."), "{stats}");
}

/// `ENVOY_MEMORY_OVERLOAD` (opt-in, not in Istio): real Envoy takes the heap bound the agent
/// works out from the container's limit (here `GOMEMLIMIT`, as Istio's template sets it, unless
/// the test's cgroup has a limit of its own) and runs its fixed-heap monitor and both actions.
#[test]
fn memory_overload_bounds_envoys_heap() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("heap", "httpbin");
    inject_with(
        &mesh,
        &mut pod,
        &[
            ("ENVOY_MEMORY_OVERLOAD", "true".to_string()),
            ("GOMEMLIMIT", "1073741824".to_string()),
        ],
    );
    wait_ready(&mesh, &pod, Duration::from_secs(30));
    assert_eventually(Duration::from_secs(10), || {
        let (_, stats) = pod.envoy_admin("/stats?filter=overload")?;
        for want in [
            "overload.envoy.resource_monitors.fixed_heap.pressure",
            "overload.envoy.overload_actions.shrink_heap.active: 0",
            "overload.envoy.overload_actions.stop_accepting_connections.active: 0",
        ] {
            if !stats.contains(want) {
                return Err(format!("{want} missing from Envoy's stats: {stats}"));
            }
        }
        Ok(())
    });
}
