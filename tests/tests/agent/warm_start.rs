//! Warm start (`XDS_PROXY_PREFETCH`, on by default), with real Envoy started by the agent
//! (`binaryPath`) against istiod-lite on loopback (the local harness: no namespaces). Envoy's
//! binary is a gate script that waits for a file before it execs Envoy, so a test holds Envoy
//! back while the agent's upstream stream is already open:
//! - before Envoy runs, istiod-lite has sent CDS and LDS to the agent's node; a ServiceEntry
//!   added then reaches Envoy (istiod-lite pushes it once Envoy's ACK of the prefetched CDS
//!   reaches it: it keeps one un-acked push per type; the agent's keeping the newest of
//!   several pushes is `agent`'s `xds_proxy::tests::warm`); istiod-lite sees one
//!   connection, SYNCED with Envoy's ACKs of its nonces, and the agent counts the responses it
//!   handed Envoy from what it held (`istio_agent_xds_proxy_prefetch_served_total`: CDS, EDS,
//!   LDS, RDS); in Delta (the default) and SotW (`ISTIO_DELTA_XDS=false`);
//! - `istiod-lite replay` of a recorded dump whose CDS upstream Envoy rejects: the prefetched
//!   CDS is NACKed, and istiod-lite's `/debug/syncz` shows Envoy's error;
//! - `XDS_PROXY_PREFETCH=false`: nothing reaches istiod-lite before Envoy runs.

use harness::local::{
    HTTPBIN_HOST, LocalIstiod, Ports, Unprivileged, agent_env, agent_sync_row, httpbin_config,
};
use harness::{Child, assert_eventually, envoy_bin, http_get, repo_root, workspace_bin};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub(crate) const SERVICE_ACCOUNT: &str = "warm-sa";

/// The agent with Envoy behind a gate.
pub(crate) struct Gated {
    pub(crate) agent: Child,
    scratch: tempfile::TempDir,
    pub(crate) envoy_admin: SocketAddr,
    status: SocketAddr,
}

impl Gated {
    /// Lets Envoy start.
    pub(crate) fn open(&self) {
        std::fs::write(self.scratch.path().join("gate"), "").expect("gate");
    }

    pub(crate) fn envoy_ready(&self) -> Result<(), String> {
        match http_get(self.envoy_admin, "/ready")? {
            (200, _) => Ok(()),
            other => Err(format!("Envoy /ready: {other:?}")),
        }
    }

    /// The agent's metric `name` (a counter without labels) from its merged `/stats/prometheus`.
    pub(crate) fn agent_counter(&self, name: &str) -> Result<f64, String> {
        let (_, body) = http_get(self.status, "/stats/prometheus")?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .ok_or_else(|| format!("no {name} in the agent's metrics"))
    }
}

/// Starts `pilot-agent proxy sidecar` against `discovery`, its Envoy (`binaryPath`) a script
/// that waits for `<scratch>/gate` and writes Envoy's output to `<scratch>/envoy.out` (recorded
/// configs access-log to `/dev/stdout`, which an unprivileged Envoy must be able to reopen).
pub(crate) fn start_gated(
    envoy: &Path,
    discovery: SocketAddr,
    provision: impl FnOnce(&Path),
    extra_env: &[(&str, &str)],
) -> Gated {
    use std::os::unix::fs::PermissionsExt;
    // Short path: the bootstrap names the sockets relative to it (UDS path limit).
    let scratch = tempfile::Builder::new()
        .prefix("ws-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let dir = scratch.path().to_path_buf();
    provision(&dir);
    let user = Unprivileged::new(&dir, envoy);
    let envoy: PathBuf = if nix::unistd::geteuid().is_root() {
        dir.join("bin/envoy")
    } else {
        envoy.to_path_buf()
    };
    let gate = dir.join("gate-envoy.sh");
    std::fs::write(
        &gate,
        format!(
            "#!/bin/sh\nwhile [ ! -e '{d}/gate' ]; do sleep 0.01; done\nexec '{e}' \"$@\" >>'{d}/envoy.out' 2>&1\n",
            d = dir.display(),
            e = envoy.display()
        ),
    )
    .expect("gate script");
    std::fs::set_permissions(&gate, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let ports = Ports::free();
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar"]).current_dir(&dir);
    agent_env(&mut cmd, discovery, SERVICE_ACCOUNT, &ports);
    cmd.env("ISTIO_AGENT_EXTERNAL_ENVOY", "false").env(
        "PROXY_CONFIG",
        format!(
            r#"{{"binaryPath":"{}","discoveryAddress":"{discovery}","statusPort":{},"proxyAdminPort":{},"terminationDrainDuration":"1s"}}"#,
            gate.display(),
            ports.status,
            ports.admin
        ),
    );
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    Gated {
        agent,
        scratch,
        envoy_admin: format!("127.0.0.1:{}", ports.admin).parse().expect("addr"),
        status: format!("127.0.0.1:{}", ports.status).parse().expect("addr"),
    }
}

/// Envoy behind its gate, the agent against an istiod-lite serving httpbin; `None` without
/// Envoy (outside CI).
fn gated_on_istiod_lite(extra_env: &[(&str, &str)]) -> Option<(LocalIstiod, Gated)> {
    let envoy = envoy_bin()?;
    let istiod = LocalIstiod::start(&httpbin_config());
    let g = start_gated(
        &envoy,
        istiod.secure,
        |d| istiod.provision(d, SERVICE_ACCOUNT),
        extra_env,
    );
    Some((istiod, g))
}

fn sent_nonce(row: &Value, ty: &str) -> Result<String, String> {
    row["types"][ty]["sentNonce"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("{ty} not sent yet: {row}"))
}

pub(crate) fn envoy_has_cluster(admin: SocketAddr, name: &str) -> Result<(), String> {
    let (_, body) = http_get(admin, "/clusters")?;
    if body.contains(name) {
        Ok(())
    } else {
        Err(format!("Envoy has no cluster {name} yet"))
    }
}

const LATE_HOST: &str = "late.demo.svc.cluster.local";

fn late_service() -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: late, namespace: demo }}
spec:
  hosts: [{LATE_HOST}]
  addresses: [198.19.0.11]
  ports: [{{ number: 80, name: http, protocol: HTTP, targetPort: 8080 }}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{{ address: 198.18.0.6 }}]
"#
    )
}

/// istiod-lite answers the agent before Envoy runs; a change pushed then is what Envoy gets;
/// one connection, SYNCED through Envoy's ACKs; Envoy's first responses came from the agent.
fn change_before_envoy_is_not_lost(extra_env: &[(&str, &str)]) {
    let Some((istiod, g)) = gated_on_istiod_lite(extra_env) else {
        return;
    };
    g.agent.wait_for_line(
        "opening the upstream xDS stream before Envoy connects",
        Duration::from_secs(20),
    );
    // Envoy is not running, yet istiod-lite has sent CDS and LDS to the agent's node.
    let first = assert_eventually(Duration::from_secs(20), || {
        let row = agent_sync_row(istiod.monitoring)?;
        sent_nonce(&row, "LDS")?;
        sent_nonce(&row, "CDS")
    });
    assert!(
        g.envoy_ready().is_err(),
        "Envoy must still be behind its gate"
    );
    // A change while Envoy is still behind its gate. istiod-lite has one un-acked push per
    // type: it pushes the change once Envoy's ACK of the prefetched CDS reaches it.
    let revisions = || {
        istiod
            .child
            .output()
            .iter()
            .filter(|l| l.contains("config changed: new revision"))
            .count()
    };
    let before = revisions();
    harness::local::write_file(&istiod.config_dir.path().join("late.yaml"), &late_service());
    assert_eventually(Duration::from_secs(20), || {
        if revisions() > before {
            Ok(())
        } else {
            Err("istiod-lite has not read the change yet".to_string())
        }
    });
    assert_eq!(
        sent_nonce(&agent_sync_row(istiod.monitoring).expect("syncz"), "CDS").as_deref(),
        Ok(first.as_str()),
        "istiod-lite holds the change until Envoy's ACK"
    );
    g.open();
    assert_eventually(Duration::from_secs(30), || g.envoy_ready());
    assert_eventually(Duration::from_secs(20), || {
        envoy_has_cluster(g.envoy_admin, &format!("outbound|80||{LATE_HOST}"))?;
        envoy_has_cluster(g.envoy_admin, &format!("outbound|80||{HTTPBIN_HOST}"))
    });
    g.agent.wait_for_line(
        "it takes over the prefetched upstream stream",
        Duration::from_secs(5),
    );
    // One connection, every type acknowledged by Envoy with istiod-lite's nonces.
    assert_eventually(Duration::from_secs(20), || {
        let row = agent_sync_row(istiod.monitoring)?;
        for ty in ["CDS", "EDS", "LDS", "RDS"] {
            let t = &row["types"][ty];
            if t["status"] != "SYNCED" || t["ackedNonce"] != t["sentNonce"] {
                return Err(format!("{ty} not synced: {row}"));
            }
        }
        Ok(())
    });
    let served = assert_eventually(Duration::from_secs(10), || {
        g.agent_counter("istio_agent_xds_proxy_prefetch_served_total")
    });
    // CDS, EDS (httpbin's and the late service's endpoints), LDS and RDS (port 80's routes).
    assert!(
        served >= 4.0,
        "CDS, EDS, LDS and RDS came from the agent's prefetch: {served}"
    );
    eprintln!("responses served from the prefetch: {served}");
}

#[test]
fn delta_change_before_envoy_is_not_lost() {
    change_before_envoy_is_not_lost(&[]);
}

#[test]
fn sotw_change_before_envoy_is_not_lost() {
    change_before_envoy_is_not_lost(&[("ISTIO_DELTA_XDS", "false")]);
}

#[test]
fn without_prefetch_istiod_sees_nothing_before_envoy() {
    let Some((istiod, g)) = gated_on_istiod_lite(&[("XDS_PROXY_PREFETCH", "false")]) else {
        return;
    };
    // The agent has written the bootstrap and run Envoy's binary (the gate): with prefetch
    // the upstream stream would be open by now.
    g.agent
        .wait_for_line("starting Envoy", Duration::from_secs(20));
    let early = harness::assert_eventually_result(Duration::from_secs(1), || {
        agent_sync_row(istiod.monitoring)
    });
    assert!(
        early.is_err(),
        "a connection of the agent's before Envoy: {early:?}"
    );
    g.open();
    assert_eventually(Duration::from_secs(30), || g.envoy_ready());
    assert_eventually(Duration::from_secs(20), || {
        agent_sync_row(istiod.monitoring)
    });
    let served = g
        .agent_counter("istio_agent_xds_proxy_prefetch_served_total")
        .unwrap_or(0.0);
    assert_eq!(served, 0.0);
}

/// A prefetched CDS Envoy rejects: Envoy's NACK, with its error, reaches the control plane.
#[test]
fn nack_of_prefetched_config_reaches_the_control_plane() {
    let Some(envoy) = envoy_bin() else { return };
    let dump = repo_root().join("../shared/conformance/istio-configdumps/describe-http.json");
    if !dump.exists() {
        assert!(!harness::in_ci(), "missing {} under CI", dump.display());
        eprintln!("skipping: no {}", dump.display());
        return;
    }
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(workspace_bin("istiod-lite"));
    cmd.arg("replay")
        .arg("--config-dump")
        .arg(&dump)
        .arg("--ca-dir")
        .arg(ca_dir.path())
        .args(["--grpc-addr", "127.0.0.1:0"])
        .args(["--secure-grpc-addr", "127.0.0.1:0"])
        .args(["--monitoring-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    let replay = Child::spawn("istiod-lite", cmd);
    let secure = harness::local::listen_addr(&replay, "secure-grpc");
    let monitoring = harness::local::listen_addr(&replay, "monitoring");
    harness::local::wait_ready(monitoring);
    let provision = |d: &Path| harness::local::provision(ca_dir.path(), d, SERVICE_ACCOUNT);
    let g = start_gated(&envoy, secure, provision, &[]);
    let sent = assert_eventually(Duration::from_secs(20), || {
        sent_nonce(&agent_sync_row(monitoring)?, "CDS")
    });
    g.open();
    let row = assert_eventually(Duration::from_secs(30), || {
        let row = agent_sync_row(monitoring)?;
        if row["types"]["CDS"]["nack"].is_string() {
            Ok(row)
        } else {
            Err(format!("CDS not NACKed yet: {row}"))
        }
    });
    let t = &row["types"]["CDS"];
    assert_eq!(
        t["nackNonce"], sent,
        "the NACK answers the prefetched push: {row}"
    );
    let nack = t["nack"].as_str().unwrap_or_default();
    assert!(
        nack.contains("Didn't find a registered implementation for"),
        "syncz shows Envoy's error detail: {nack}"
    );
    g.agent.wait_for_line(
        "Envoy rejected an xDS response (NACK)",
        Duration::from_secs(10),
    );
    let served = g
        .agent_counter("istio_agent_xds_proxy_prefetch_served_total")
        .unwrap_or(0.0);
    assert!(served >= 1.0, "CDS came from the prefetch: {served}");
}
