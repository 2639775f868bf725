//! The agent owns the xDS upstream (issue 16), with real Envoy and istiod-lite on loopback (the
//! local harness: no namespaces, no root):
//! - istiod-lite SIGKILLed and back after 5 s: Envoy is SYNCED again within a bound of its
//!   return, its ADS stream to the agent is never re-opened (`cluster.xds-grpc.upstream_rq_total`
//!   unchanged), and config pushed after the return reaches Envoy.
//! - istiod-lite SIGSTOPped: the stalled connection is replaced within two keepalive periods
//!   (`XDS_PROXY_KEEPALIVE_INTERVAL=1s`), `istio_agent_xds_upstream_reconnects_total` counts
//!   it as `stalled` (a killed one is `dead`); after SIGCONT Envoy is SYNCED again on the same
//!   ADS stream.

use harness::local::{
    HTTPBIN_HOST, LocalIstiod, Ports, Unprivileged, agent_env, httpbin_config, start_envoy,
    write_bootstrap, write_file,
};
use harness::{Child, assert_eventually, envoy_bin, http_get};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const SERVICE_ACCOUNT: &str = "reconnect-sa";

/// istiod-lite, the agent and Envoy, with Envoy SYNCED.
struct Sidecar {
    istiod: LocalIstiod,
    _agent: Child,
    _envoy: Child,
    admin: SocketAddr,
    status: SocketAddr,
    _scratch: tempfile::TempDir,
}

fn start(extra_env: &[(&str, &str)]) -> Option<Sidecar> {
    let envoy = envoy_bin()?;
    let scratch_dir = tempfile::Builder::new()
        .prefix("xr-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch: PathBuf = scratch_dir.path().to_path_buf();
    let istiod = LocalIstiod::start(&httpbin_config());
    istiod.provision(&scratch, SERVICE_ACCOUNT);
    let user = Unprivileged::new(&scratch, &envoy);
    let ports = Ports::free();
    let bootstrap = write_bootstrap(&user, &scratch, istiod.secure, SERVICE_ACCOUNT, &ports);
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(&scratch);
    agent_env(&mut cmd, istiod.secure, SERVICE_ACCOUNT, &ports);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let envoy = start_envoy(&user, &bootstrap, &scratch);
    let sidecar = Sidecar {
        istiod,
        _agent: agent,
        _envoy: envoy,
        admin: format!("127.0.0.1:{}", ports.admin).parse().expect("addr"),
        status: format!("127.0.0.1:{}", ports.status).parse().expect("addr"),
        _scratch: scratch_dir,
    };
    assert_eventually(Duration::from_secs(30), || sidecar.synced());
    assert_eventually(Duration::from_secs(30), || {
        sidecar.envoy_has_cluster(&format!("outbound|80||{HTTPBIN_HOST}"))
    });
    Some(sidecar)
}

/// The view of the istiod-lite monitored at `monitoring`: one connection of the agent's, with
/// CDS and LDS acked and nothing stale; returns its connection id.
pub(crate) fn synced(monitoring: SocketAddr) -> Result<String, String> {
    let row = harness::local::agent_sync_row(monitoring)?;
    let types = row["types"].as_object().ok_or("no types")?;
    for (ty, t) in types {
        match t["status"].as_str() {
            Some("SYNCED") | Some("NOT SENT") if !["CDS", "LDS"].contains(&ty.as_str()) => {}
            Some("SYNCED") => {}
            other => return Err(format!("{ty} is {other:?}: {t}")),
        }
    }
    Ok(row["connectionId"].as_str().unwrap_or_default().to_string())
}

/// Envoy's `cluster.xds-grpc.upstream_rq_total` (admin at `admin`): ADS streams Envoy opened
/// to the agent.
pub(crate) fn ads_streams(admin: SocketAddr) -> u64 {
    let (code, body) = http_get(admin, "/stats").expect("/stats");
    assert_eq!(code, 200, "{body}");
    body.lines()
        // Istio's stats tags print the cluster as `cluster.xds-grpc;.<stat>`.
        .find_map(|l| {
            l.strip_prefix("cluster.xds-grpc")?
                .trim_start_matches(';')
                .strip_prefix(".upstream_rq_total: ")
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            let xds: Vec<&str> = body.lines().filter(|l| l.contains("xds")).collect();
            panic!(
                "no upstream_rq_total in {} lines: {xds:?}",
                body.lines().count()
            )
        })
}

impl Sidecar {
    fn synced(&self) -> Result<String, String> {
        synced(self.istiod.monitoring)
    }

    fn ads_streams(&self) -> u64 {
        ads_streams(self.admin)
    }

    fn envoy_has_cluster(&self, name: &str) -> Result<(), String> {
        let (code, dump) = http_get(self.admin, "/config_dump?resource=dynamic_active_clusters")?;
        if code == 200 && dump.contains(name) {
            Ok(())
        } else {
            Err(format!("Envoy lacks cluster {name} ({code})"))
        }
    }

    /// The agent's `istio_agent_xds_upstream_reconnects_total`, all reasons.
    fn reconnects(&self) -> Result<u64, String> {
        self.reconnects_for("")
    }

    /// The same for one `reason` label (`""`: all).
    fn reconnects_for(&self, reason: &str) -> Result<u64, String> {
        let (code, body) = http_get(self.status, "/stats/prometheus")?;
        if code != 200 {
            return Err(format!("/stats/prometheus {code}"));
        }
        Ok(body
            .lines()
            .filter(|l| l.starts_with("istio_agent_xds_upstream_reconnects_total{"))
            .filter(|l| reason.is_empty() || l.contains(&format!("reason=\"{reason}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum())
    }

    /// A new ServiceEntry in istiod-lite's watched config dir; returns its cluster name.
    fn push_service(&self, host: &str, vip: &str) -> String {
        write_file(
            &self
                .istiod
                .config_dir
                .path()
                .join(format!("{}.yaml", host.replace('.', "-"))),
            &format!(
                r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: {name}, namespace: demo }}
spec:
  hosts: [{host}]
  addresses: [{vip}]
  ports: [{{ number: 80, name: http, protocol: HTTP }}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{{ address: 198.18.0.6 }}]
"#,
                name = host.replace('.', "-"),
            ),
        );
        format!("outbound|80||{host}")
    }
}

#[test]
fn istiod_restart_is_invisible_to_envoy() {
    let Some(mut sidecar) = start(&[]) else {
        return;
    };
    let streams = sidecar.ads_streams();
    sidecar.istiod.kill();
    std::thread::sleep(Duration::from_secs(5));
    let restart = Instant::now();
    sidecar.istiod.restart();
    let back = Instant::now();
    assert_eventually(Duration::from_secs(20), || sidecar.synced());
    let synced = back.elapsed();
    eprintln!(
        "FIGURE istiod_restart: istiod-lite took {:?} to be ready again; Envoy SYNCED {:?} after that ({:?} after the restart began)",
        back - restart,
        synced,
        restart.elapsed()
    );
    // Goal 1 s; the margin absorbs a loaded 2-core CI host.
    assert!(
        synced <= Duration::from_millis(2000),
        "Envoy SYNCED only {synced:?} after istiod-lite returned"
    );
    assert_eq!(
        sidecar.ads_streams(),
        streams,
        "Envoy re-opened its ADS stream to the agent"
    );
    assert!(sidecar.reconnects().expect("agent metrics") >= 1);
    // The lost connection's address refused the probe: a dead istiod, not a stalled one.
    assert_eventually(Duration::from_secs(5), || {
        match sidecar.reconnects_for("dead")? {
            0 => Err(format!(
                "no reconnect labelled dead: {:?}",
                http_get(sidecar.status, "/stats/prometheus").map(|(_, b)| b
                    .lines()
                    .filter(|l| l.contains("reconnects"))
                    .map(str::to_string)
                    .collect::<Vec<_>>())
            )),
            _ => Ok(()),
        }
    });

    let cluster = sidecar.push_service("after-restart.demo.example", "198.19.0.20");
    assert_eventually(Duration::from_secs(20), || {
        sidecar.envoy_has_cluster(&cluster)
    });
    assert_eq!(sidecar.ads_streams(), streams);
}

/// SIGCONTs istiod-lite when the test ends, even on failure.
struct Continue(i32);

impl Drop for Continue {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}

#[test]
fn stalled_istiod_is_replaced_within_two_keepalive_periods() {
    const KEEPALIVE: Duration = Duration::from_secs(1);
    let Some(sidecar) = start(&[("XDS_PROXY_KEEPALIVE_INTERVAL", "1s")]) else {
        return;
    };
    let streams = sidecar.ads_streams();
    let before = sidecar.reconnects().expect("agent metrics");
    let connection = sidecar.synced().expect("synced");
    let pid = sidecar.istiod.child.id() as i32;
    let resume = Continue(pid);
    let stopped = Instant::now();
    sidecar
        .istiod
        .child
        .signal(nix::sys::signal::Signal::SIGSTOP);
    assert_eventually(Duration::from_secs(10), || {
        let now = sidecar.reconnects()?;
        if now > before {
            Ok(())
        } else {
            Err(format!("reconnects still {now}"))
        }
    });
    let detected = stopped.elapsed();
    // The stopped istiod still accepts TCP: labelled stalled, not dead.
    assert!(
        sidecar.reconnects_for("stalled").expect("agent metrics") >= 1,
        "the stall was not labelled stalled"
    );
    eprintln!(
        "FIGURE stalled_istiod: detected and replaced after {detected:?} (keepalive interval {KEEPALIVE:?}, timeout half of it)"
    );
    // Interval + timeout is 1.5 periods; the last half period absorbs the metric poll's step
    // and a loaded host.
    assert!(
        detected <= 2 * KEEPALIVE,
        "the stall was detected only after {detected:?}"
    );
    drop(resume);
    let resumed = Instant::now();
    assert_eventually(Duration::from_secs(20), || match sidecar.synced()? {
        c if c == connection => Err(format!("still the stalled connection {c}")),
        _ => Ok(()),
    });
    eprintln!(
        "FIGURE stalled_istiod: SYNCED {:?} after SIGCONT",
        resumed.elapsed()
    );
    let cluster = sidecar.push_service("after-stall.demo.example", "198.19.0.21");
    assert_eventually(Duration::from_secs(20), || {
        sidecar.envoy_has_cluster(&cluster)
    });
    assert_eq!(
        sidecar.ads_streams(),
        streams,
        "Envoy re-opened its ADS stream to the agent"
    );
}
