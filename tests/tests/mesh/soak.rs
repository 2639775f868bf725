//! Soak: two injected sidecars (pod in a box) carrying steady mTLS traffic for `SOAK_SECONDS`
//! (default 20, what CI runs) while the mesh is disturbed the whole time:
//!
//! - config pushes: a VirtualService on the traffic's own route and a ServiceEntry whose host
//!   changes are rewritten in istiod-lite's config directory every few seconds (RDS, CDS, EDS);
//! - certificate rotation: `SECRET_TTL=10s`, so both agents rotate every ~5 s;
//! - istiod-lite SIGKILLed and restarted once, in the middle.
//!
//! It asserts 0 failed requests, every proxy synced at the latest config again after the
//! restart and at the end, and that the agents' memory (VmRSS) and open file descriptors do not
//! grow between the first and the last quarter of the run. `--no-capture` prints `FIGURE` lines.
//! Long runs: `scripts/soak.sh 30m`.

use harness::assert_eventually;
use harness::envoy::cert_serials;
use harness::mesh::{
    HTTPBIN, HTTPBIN_VIP, Load, Mesh, NAMESPACE, Pod, istio_mutual_for, pod_in_a_box_config,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Soak length when `SOAK_SECONDS` is not set: short enough for CI.
const DEFAULT_SECONDS: u64 = 20;
/// Requested certificate lifetime: the agents rotate at half of it.
const SECRET_TTL_SECONDS: u64 = 10;
/// A config generation is written this often.
const PUSH_EVERY: Duration = Duration::from_secs(3);
/// Allowed memory growth (VmRSS and RssAnon: median of the last quarter over the median of the
/// first, after warm-up).
const RSS_GROWTH_BOUND_KIB: i64 = 4 * 1024;
/// Allowed growth of an agent's open file descriptors (last quarter's max over the first's).
const FD_GROWTH_BOUND: i64 = 8;
/// The TCP service: every connection is a new upstream connection, so a new mTLS handshake
/// with the certificates both Envoys hold at that moment.
const TCP_VIP: &str = "198.19.0.11";
const TCP_PORT: u16 = 81;

fn soak_seconds() -> u64 {
    match harness::prereq::setting("SOAK_SECONDS") {
        None => DEFAULT_SECONDS,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(s) if s >= 8 => s,
            _ => panic!("SOAK_SECONDS={v:?}: expected a whole number of seconds, at least 8"),
        },
    }
}

/// The base config (httpbin over HTTP, STRICT mTLS, ISTIO_MUTUAL) plus a TCP service on the
/// same workload (port 81 → the app's second port, 8081).
pub(crate) fn base_config(server_ip: &str) -> String {
    let host = format!("echo-tcp.{NAMESPACE}.svc.cluster.local");
    pod_in_a_box_config(server_ip)
        + &format!(
            r#"---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: echo-tcp, namespace: {NAMESPACE} }}
spec:
  hosts: [{host}]
  addresses: [{TCP_VIP}]
  ports: [{{ number: {TCP_PORT}, name: tcp, protocol: TCP, targetPort: 8081 }}]
  location: MESH_INTERNAL
  resolution: STATIC
  workloadSelector: {{ labels: {{ app: httpbin }} }}
"#
        )
        + &istio_mutual_for("echo-tcp", &host)
}

/// Generation `g` of the churned config: the VirtualService on the traffic's route (its
/// timeout changes: an RDS push) and a ServiceEntry whose host changes (CDS, EDS and RDS).
fn churn_config(g: u32) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{ name: httpbin, namespace: {NAMESPACE} }}
spec:
  hosts: [{HTTPBIN}]
  http:
  - route:
    - destination: {{ host: {HTTPBIN} }}
    timeout: {timeout}s
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: churn, namespace: {NAMESPACE} }}
spec:
  hosts: [{host}]
  ports: [{{ number: 80, name: http, protocol: HTTP }}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{{ address: 198.18.200.{ep} }}]
"#,
        timeout = 10 + g % 7,
        host = churn_host(g),
        ep = 1 + g % 200,
    )
}

fn churn_host(g: u32) -> String {
    format!("g{g}.churn.soak.example")
}

/// One request over HTTP (port 80, through the VirtualService) or plain TCP (a new mTLS
/// handshake upstream), from inside the client's namespace as root (captured like an app).
pub(crate) fn request(tcp: bool) -> Result<(), String> {
    let (addr, want): (SocketAddr, &str) = if tcp {
        (
            format!("{TCP_VIP}:{TCP_PORT}").parse().expect("addr"),
            "hello from echo-tcp",
        )
    } else {
        (
            format!("{HTTPBIN_VIP}:80").parse().expect("addr"),
            "hello from httpbin-v1",
        )
    };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {HTTPBIN}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write {addr}: {e}"))?;
    // Read the head, then Content-Length bytes: the app keeps the connection open, and over
    // plain TCP nothing closes it for us.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s
            .read(&mut chunk)
            .map_err(|e| format!("read {addr} after {} bytes: {e}", buf.len()))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(usize::MAX);
            if body.len() >= len {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&buf);
    if text.starts_with("HTTP/1.1 200") && text.contains(want) {
        Ok(())
    } else {
        Err(format!("{addr}: {text:?}"))
    }
}

/// Serial of the workload certificate Envoy holds (`/certs`), if exactly one.
pub(crate) fn envoy_serial(pod: &Pod) -> Option<String> {
    let id = format!(
        "spiffe://cluster.local/ns/{NAMESPACE}/sa/{}",
        pod.service_account
    );
    let serials = cert_serials(pod.envoy_admin("/certs").ok()?, &id).ok()?;
    let [one] = <[String; 1]>::try_from(serials).ok()?;
    Some(one)
}

/// Envoy's per-host counter `name` of its cluster `cluster` (`/clusters`: host statistics are
/// kept whatever the stats inclusion list).
fn envoy_host_stat(pod: &Pod, cluster: &str, name: &str) -> Option<u64> {
    let (_, body) = pod.envoy_admin("/clusters").ok()?;
    let (prefix, suffix) = (format!("{cluster}::"), format!("::{name}::"));
    body.lines()
        .filter(|l| l.starts_with(&prefix))
        .find_map(|l| l.split_once(&suffix).map(|(_, v)| v.trim().to_string()))?
        .parse()
        .ok()
}

/// VmRSS and RssAnon (heap and other private memory) of `pid`, in KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("RssAnon:")?))
}

/// Open file descriptors of `pid`.
fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// A counter from the agent's merged metrics (status port), summed over matching series.
pub(crate) fn agent_counter(pod: &Pod, series: &str) -> Option<f64> {
    let (code, body) = pod
        .get(
            "127.0.0.1:15020".parse().expect("addr"),
            "/stats/prometheus",
        )
        .ok()?;
    if code != 200 {
        return None;
    }
    Some(
        body.lines()
            .filter(|l| !l.starts_with('#') && l.contains(series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// istiod-lite's snapshot version (`/debug/configz`).
pub(crate) fn istiod_version(mesh: &Mesh) -> Result<String, String> {
    let (code, body) = mesh.monitoring_get("/debug/configz")?;
    if code != 200 {
        return Err(format!("/debug/configz {code}"));
    }
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    v["version"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("no version in {body}"))
}

/// Ok when both proxies are connected to istiod-lite with every xDS type acked at `version`
/// (NDS too: DNS capture is on) and nothing stale.
pub(crate) fn synced_at(mesh: &Mesh, pods: &[&Pod], version: &str) -> Result<(), String> {
    let (code, body) = mesh.monitoring_get("/debug/syncz")?;
    if code != 200 {
        return Err(format!("/debug/syncz {code}"));
    }
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    for pod in pods {
        let tag = format!("~{}~{}.{NAMESPACE}~", pod.ip, pod.name);
        let mine: Vec<_> = rows
            .iter()
            .filter(|r| r["proxy"].as_str().is_some_and(|p| p.contains(&tag)))
            .collect();
        let [row] = mine.as_slice() else {
            return Err(format!("{}: {} connections: {body}", pod.name, mine.len()));
        };
        for ty in ["CDS", "EDS", "LDS", "RDS", "NDS"] {
            let t = &row["types"][ty];
            if t["status"] != "SYNCED" || t["ackedVersion"].as_str() != Some(version) {
                return Err(format!("{} {ty} not synced at {version}: {t}", pod.name));
            }
        }
    }
    Ok(())
}

/// Waits until the config directory's latest content is in force and both proxies acked it.
fn wait_synced(mesh: &Mesh, pods: &[&Pod], timeout: Duration) {
    assert_eventually(timeout, || synced_at(mesh, pods, &istiod_version(mesh)?));
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Duration,
    rss: [u64; 2],
    anon: [u64; 2],
    fds: [u64; 2],
    /// Rotations seen so far in each Envoy.
    rotations: [usize; 2],
}

/// Sets the stop flag when dropped, so a panic in the test body ends the sampler thread.
struct StopOnDrop<'a>(&'a AtomicBool);
impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Growth of agent `i`'s open descriptors: the last quarter's most over the first quarter's.
fn first_last_max(first: &[Sample], last: &[Sample], i: usize) -> i64 {
    let max = |s: &[Sample]| s.iter().map(|x| x.fds[i]).max().unwrap_or(0) as i64;
    max(last) - max(first)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a soak scenario told in the order it happens to one mesh: traffic, pushes, rotations and a control-plane restart, each checked against the state before it"
)]
fn soak_traffic_pushes_rotations_and_a_control_plane_restart() {
    if !harness::mesh::prerequisites(&[]) {
        return;
    }
    let seconds = soak_seconds();
    let soak = Duration::from_secs(seconds);
    let mut mesh = Mesh::new(&base_config("198.18.2.2"));
    mesh.write_config("churn.yaml", &churn_config(0));
    mesh.start_istiod();
    let mut client = mesh.pod("client", "sleep");
    let mut server = mesh.pod("server", "httpbin");
    assert_eq!(server.ip, "198.18.2.2");
    mesh.start_app(&mut server, "0.0.0.0:8080", "httpbin-v1");
    mesh.start_app(&mut server, "0.0.0.0:8081", "echo-tcp");
    let ttl = [("SECRET_TTL", format!("{SECRET_TTL_SECONDS}s"))];
    mesh.inject_with(&mut server, &ttl);
    mesh.inject_with(&mut client, &ttl);
    mesh.wait_ready(&server, Duration::from_secs(30));
    mesh.wait_ready(&client, Duration::from_secs(30));
    for tcp in [false, true] {
        assert_eventually(Duration::from_secs(20), || {
            client.ns.run(move || request(tcp))
        });
    }
    wait_synced(&mesh, &[&client, &server], Duration::from_secs(20));
    let pids = [
        client.agent.as_ref().expect("client agent").id(),
        server.agent.as_ref().expect("server agent").id(),
    ];
    let csr_series = "num_outgoing_requests_total{request_type=\"csr\"}";
    let csrs_before: Vec<f64> = [&client, &server]
        .iter()
        .map(|p| agent_counter(p, csr_series).unwrap_or(0.0))
        .collect();

    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let (traffic, samples, serials, restart, generations) = std::thread::scope(|scope| {
        let _stop_guard = StopOnDrop(&stop);
        // Steady traffic, HTTP and TCP side by side, each one request every ~100 ms; a failure
        // is stamped with the time since the start.
        let [http, tcp] = [false, true].map(|tcp| {
            Load::run_in(&client, Duration::from_millis(100), move || {
                request(tcp).map_err(|e| format!("{:.1}s: {e}", start.elapsed().as_secs_f64()))
            })
        });
        // Agents' memory and descriptors, and the serial each Envoy serves, every 250 ms.
        let sampler = scope.spawn(|| {
            let (mut samples, mut serials) = (Vec::new(), [Vec::<String>::new(), Vec::new()]);
            while !stop.load(Ordering::Relaxed) {
                let at = start.elapsed();
                for (i, pod) in [&client, &server].into_iter().enumerate() {
                    if let Some(s) = envoy_serial(pod)
                        && serials[i].last() != Some(&s)
                    {
                        serials[i].push(s);
                    }
                }
                if let ([Some(r0), Some(r1)], [Some(f0), Some(f1)]) =
                    (pids.map(rss_kib), pids.map(fd_count))
                {
                    samples.push(Sample {
                        at,
                        rss: [r0.0, r1.0],
                        anon: [r0.1, r1.1],
                        fds: [f0, f1],
                        rotations: [0, 1].map(|i| serials[i].len().saturating_sub(1)),
                    });
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            (samples, serials)
        });

        // Config pushes every PUSH_EVERY; istiod-lite SIGKILLed and restarted at half time.
        let mut generation = 0u32;
        let mut restart = None;
        while start.elapsed() < soak {
            let next = start + PUSH_EVERY * (generation + 1);
            if restart.is_none() && start.elapsed() >= soak / 2 {
                let killed = Instant::now();
                mesh.stop_istiod();
                std::thread::sleep(Duration::from_secs(1));
                mesh.start_istiod();
                let ready = Instant::now();
                let version = istiod_version(&mesh).expect("version after restart");
                while let Err(e) = synced_at(&mesh, &[&client, &server], &version) {
                    // The agents reconnect on their own (jittered backoff capped at 1 s);
                    // Envoy's ADS streams stay open.
                    if ready.elapsed() > Duration::from_secs(35) {
                        panic!("proxies not synced 35 s after the restart: {e}");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                restart = Some((ready - killed, ready.elapsed()));
                continue;
            }
            if Instant::now() >= next {
                generation += 1;
                mesh.write_config("churn.yaml", &churn_config(generation));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The last generation reached both Envoys.
        wait_synced(&mesh, &[&client, &server], Duration::from_secs(20));
        stop.store(true, Ordering::Relaxed);
        let ((http_ok, mut failed), (tcp_ok, tcp_failed)) = (http.stop(), tcp.stop());
        failed.extend(tcp_failed);
        let traffic = ([http_ok, tcp_ok], failed);
        let (samples, serials) = sampler.join().expect("sampler");
        (traffic, samples, serials, restart, generation)
    });
    let elapsed = start.elapsed();
    let ((ok, failed), (killed_to_ready, reconnect)) =
        (traffic, restart.expect("istiod-lite was restarted"));
    let requests = ok[0] + ok[1] + failed.len();
    for pod in [&client, &server] {
        let (code, dump) = pod
            .envoy_admin("/config_dump?resource=dynamic_active_clusters")
            .expect("config_dump");
        assert_eq!(code, 200);
        assert!(
            dump.contains(&churn_host(generations)),
            "{} lacks the last generation's cluster",
            pod.name
        );
    }
    let csrs: Vec<f64> = [&client, &server]
        .iter()
        .zip(&csrs_before)
        .map(|(p, b)| agent_counter(p, csr_series).unwrap_or(0.0) - b)
        .collect();
    // Envoy's connections to its agent: SDS (rotations are pushed on the one stream) and xDS.
    let conns: Vec<[Option<u64>; 2]> = [&client, &server]
        .iter()
        .map(|p| ["sds-grpc", "xds-grpc"].map(|c| envoy_host_stat(p, c, "cx_total")))
        .collect();
    for (i, pod) in [&mut client, &mut server].into_iter().enumerate() {
        assert!(
            pod.agent.as_mut().expect("agent").try_wait().is_none(),
            "{} agent exited",
            ["client", "server"][i]
        );
    }

    // Figures.
    eprintln!(
        "FIGURE soak: {:.1} s (SOAK_SECONDS={seconds}), {requests} requests ({} HTTP, {} TCP = new mTLS handshakes), {} failed",
        elapsed.as_secs_f64(),
        ok[0],
        ok[1],
        failed.len()
    );
    let rotations: Vec<usize> = serials.iter().map(|s| s.len().saturating_sub(1)).collect();
    eprintln!(
        "FIGURE soak: {generations} config generations pushed; certificate rotations seen in Envoy /certs: client {}, server {} (SECRET_TTL={SECRET_TTL_SECONDS}s); CSRs sent: client {}, server {}",
        rotations[0], rotations[1], csrs[0], csrs[1]
    );
    eprintln!(
        "FIGURE soak: istiod-lite SIGKILLed, restarted and ready in {} ms; both proxies reconnected and synced (every type acked at its version) {} ms after it was ready",
        killed_to_ready.as_millis(),
        reconnect.as_millis()
    );
    // Leak check on the samples after warm-up: startup memory is trimmed (the agent hands freed
    // heap and its startup code pages back ~2 s in) and the first rotation allocates what every
    // later one reuses. Quarters of what remains.
    let warm = samples
        .iter()
        .position(|s| s.rotations.iter().all(|&r| r >= 1))
        .expect("no sample after both agents' first rotation");
    let steady = &samples[warm..];
    eprintln!(
        "FIGURE soak: Envoy connections to the agent (cx_total): client SDS {:?} xDS {:?}, server SDS {:?} xDS {:?}",
        conns[0][0], conns[0][1], conns[1][0], conns[1][1]
    );
    let n = steady.len();
    assert!(n >= 8, "too few samples after warm-up: {n}");
    let (first, last) = (&steady[..n / 4], &steady[n - n / 4..]);
    let mut problems = Vec::new();
    for (i, name) in ["client", "server"].into_iter().enumerate() {
        let med = |s: &[Sample], f: fn(&Sample) -> [u64; 2]| {
            median(s.iter().map(|x| f(x)[i]).collect()) as i64
        };
        let max = |f: fn(&Sample) -> [u64; 2]| steady.iter().map(|x| f(x)[i]).max().unwrap_or(0);
        let rss_growth = med(last, |x| x.rss) - med(first, |x| x.rss);
        let anon_growth = med(last, |x| x.anon) - med(first, |x| x.anon);
        let fd_growth = first_last_max(first, last, i);
        eprintln!(
            "FIGURE soak: {name} agent VmRSS first {} KiB, last {} KiB, max {} KiB, growth {rss_growth} KiB (RssAnon first {} KiB, last {} KiB, growth {anon_growth} KiB); fds first {}, last {}, max {}, growth {fd_growth}; {n} samples from {:.1} s (after the first rotation; at start: VmRSS {} KiB, {} fds)",
            steady[0].rss[i],
            steady[n - 1].rss[i],
            max(|x| x.rss),
            steady[0].anon[i],
            steady[n - 1].anon[i],
            steady[0].fds[i],
            steady[n - 1].fds[i],
            max(|x| x.fds),
            steady[0].at.as_secs_f64(),
            samples[0].rss[i],
            samples[0].fds[i],
        );
        let trace: Vec<String> = samples
            .iter()
            .step_by((samples.len() / 16).max(1))
            .map(|s| {
                format!(
                    "{:.0}s:{}/{}/{}",
                    s.at.as_secs_f64(),
                    s.rss[i],
                    s.anon[i],
                    s.fds[i]
                )
            })
            .collect();
        eprintln!(
            "soak: {name} agent samples (VmRSS/RssAnon KiB/fds): {}",
            trace.join(" ")
        );
        if rss_growth >= RSS_GROWTH_BOUND_KIB || anon_growth >= RSS_GROWTH_BOUND_KIB {
            problems.push(format!(
                "{name} agent memory grew: VmRSS {rss_growth} KiB, RssAnon {anon_growth} KiB"
            ));
        }
        if fd_growth >= FD_GROWTH_BOUND {
            problems.push(format!("{name} agent fds grew by {fd_growth}"));
        }
    }

    assert!(failed.is_empty(), "failed requests: {failed:#?}");
    assert!(
        requests as u64 >= seconds * 5,
        "too few requests: {requests} in {seconds} s"
    );
    // Rotation at half of the lifetime: at least one per pod per TTL over the soak.
    let want_rotations = (seconds / SECRET_TTL_SECONDS).max(1) as usize;
    for (i, r) in rotations.iter().enumerate() {
        assert!(
            *r >= want_rotations,
            "{} Envoy: {r} rotations seen, want ≥ {want_rotations}: {:?}",
            ["client", "server"][i],
            serials[i]
        );
    }
    for (i, c) in conns.iter().enumerate() {
        if c[0] != Some(1) {
            problems.push(format!(
                "{} Envoy's SDS connection to the agent was re-established: cx_total {:?}",
                ["client", "server"][i],
                c[0]
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:?}");
}
