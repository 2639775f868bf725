//! `PROXY_LIFECYCLE_LOCKDOWN` end to end, with real Envoy in an injected pod: the app (uid 1000)
//! can no longer stop the proxy or reach Envoy's admin, while readiness, merged metrics and
//! root's `/quitquitquit` still work; without it, Istio's behaviour (the app's POST stops it).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use harness::mesh::{APP_UID, Mesh, PROXY_UID, Pod, httpbin_service};

const STATUS: &str = "http://127.0.0.1:15020";

fn prerequisites() -> bool {
    harness::mesh::prerequisites(&[]) && harness::require_bin("curl")
}

/// POSTs `path` on the status port from inside the pod, as `uid` (0: root); returns the status
/// code and body.
fn post_as(pod: &Pod, uid: u32, path: &str) -> (u16, String) {
    let mut cmd: Command = if uid == 0 {
        pod.ns.cmd("curl")
    } else {
        pod.ns.cmd_as(uid, uid, "curl")
    };
    let out = cmd
        .args([
            "-sS",
            "--max-time",
            "5",
            "-X",
            "POST",
            "-w",
            "\n%{http_code}",
        ])
        .arg(format!("{STATUS}{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        code.trim().parse().unwrap_or(0),
        body.to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn start(mesh: &mut Mesh, name: &str, lockdown: bool) -> Pod {
    let mut pod = mesh.pod(name, "httpbin");
    mesh.inject_with(
        &mut pod,
        &[("PROXY_LIFECYCLE_LOCKDOWN", lockdown.to_string())],
    );
    mesh.wait_ready(&pod, Duration::from_secs(30));
    pod
}

fn agent(pod: &mut Pod) -> &mut harness::Child {
    pod.agent.as_mut().expect("agent started")
}

#[test]
fn lockdown_refuses_the_app_and_moves_envoys_admin_off_tcp() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&httpbin_service("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = start(&mut mesh, "locked", true);

    // The app's POSTs are refused, with the reason; the proxy keeps running and stays ready.
    for path in ["/quitquitquit", "/drain"] {
        let (code, body) = post_as(&pod, APP_UID, path);
        assert_eq!(code, 403, "{path}: {body}");
        assert!(
            body.contains("PROXY_LIFECYCLE_LOCKDOWN") && body.contains("uid 1000"),
            "{path}: {body}"
        );
    }
    assert!(agent(&mut pod).try_wait().is_none(), "the agent stopped");
    agent(&mut pod).wait_for_line("lifecycle call refused", Duration::from_secs(5));

    // Envoy's admin is not on TCP any more; it is the proxy's 0600 socket.
    let e = pod
        .envoy_admin("/ready")
        .expect_err("Envoy's admin answers on 15000");
    assert!(e.to_lowercase().contains("refused"), "{e}");
    let sock = pod.dir.join("etc/istio/proxy/admin.sock");
    let meta = std::fs::metadata(&sock).expect("admin socket");
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "{}",
        sock.display()
    );
    assert_eq!(meta.uid(), PROXY_UID);
    // The app cannot open it even when it can see the file.
    let out = pod
        .ns
        .cmd_as(APP_UID, APP_UID, "curl")
        .args(["-sS", "--max-time", "5", "--unix-socket"])
        .arg(&sock)
        .arg("http://localhost/ready")
        .output()
        .expect("curl");
    assert!(!out.status.success(), "uid 1000 reached the admin socket");

    // Readiness (Envoy's state read over the socket) and Envoy's stats in the merged metrics
    // (15090 -> prometheus_stats -> the socket) still work.
    mesh.wait_ready(&pod, Duration::from_secs(5));
    let (code, metrics) = mesh
        .probe(&pod, 15020, "/stats/prometheus")
        .expect("metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("envoy_server_live"), "no Envoy stats");
    assert!(metrics.contains("istio_agent_"), "no agent stats");

    // `kubectl exec -c istio-proxy -- pilot-agent request GET ...` (as the proxy user, in the
    // proxy's working directory) reaches Envoy's admin through the socket.
    let out = pod
        .ns
        .cmd_as(PROXY_UID, PROXY_UID, mesh.bin("pilot-agent"))
        .args(["request", "GET", "server_info"])
        .current_dir(&pod.dir)
        .output()
        .expect("pilot-agent request");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("\"state\": \"LIVE\""),
        "pilot-agent request: {out:?}"
    );

    // Root still stops it.
    let (code, body) = post_as(&pod, 0, "/quitquitquit");
    assert_eq!((code, body.as_str()), (200, "OK"));
    let status = agent(&mut pod)
        .wait_timeout(Duration::from_secs(15))
        .expect("agent exits after root's /quitquitquit");
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    assert!(!sock.exists(), "the admin socket is removed with Envoy");
}

#[test]
fn without_lockdown_the_app_may_stop_the_proxy_as_in_istio() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&httpbin_service("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = start(&mut mesh, "open", false);
    // Envoy's admin on TCP, as Istio's.
    assert_eq!(pod.envoy_admin("/ready").map(|r| r.0), Ok(200));
    assert!(!pod.dir.join("etc/istio/proxy/admin.sock").exists());
    // A Job's app ends its sidecar.
    let (code, body) = post_as(&pod, APP_UID, "/quitquitquit");
    assert_eq!((code, body.as_str()), (200, "OK"));
    let status = agent(&mut pod)
        .wait_timeout(Duration::from_secs(15))
        .expect("agent exits after the app's /quitquitquit");
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
}

/// The drain sequence reaches Envoy's admin over the socket: SIGTERM drains the listeners
/// (Envoy answers 200) and `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` reads the connection counts.
#[test]
fn lockdown_drain_talks_to_envoy_over_the_socket() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&httpbin_service("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("locked-drain", "httpbin");
    mesh.inject_with(
        &mut pod,
        &[
            ("PROXY_LIFECYCLE_LOCKDOWN", "true".to_string()),
            ("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "true".to_string()),
            ("MINIMUM_DRAIN_DURATION", "1s".to_string()),
        ],
    );
    mesh.wait_ready(&pod, Duration::from_secs(30));
    agent(&mut pod).signal(nix::sys::signal::Signal::SIGTERM);
    let status = agent(&mut pod)
        .wait_timeout(Duration::from_secs(20))
        .expect("agent exits after the drain");
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    let lines = agent(&mut pod).output();
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Envoy draining listeners") && l.contains("200")),
        "drain_listeners over the socket"
    );
    assert!(
        has("no active downstream connections left"),
        "connection counts over the socket"
    );
    assert!(!has("reading active connections failed"));
}
