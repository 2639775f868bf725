//! Relay of a 10,000-cluster CDS through the agent's xDS proxy.
//!
//! A real `istiod-lite serve` reads 10,000 ServiceEntries (10,000 outbound clusters); a real
//! `pilot-agent proxy sidecar` (external Envoy: nothing launched) relays to it over TLS with its
//! token. A simulated Envoy opens a fresh ADS stream, asks for CDS and times the full response:
//! directly to istiod-lite over TLS (what Envoy would see without the agent), directly over
//! plaintext, and through the agent's `XDS` socket. Runs alternate between the paths; the
//! agent's peak RSS (VmHWM) is read before and after the pushes.
//!
//! Usually run by `agent/benches/cds-relay.sh` (builds the release binaries first). Env:
//! `CDS_RELAY_AGENT` (default `target/dist/pilot-agent`, the shipped build), `CDS_RELAY_ISTIOD`
//! (default `target/release/istiod-lite`), `CDS_RELAY_CLUSTERS` (10000), `CDS_RELAY_RUNS` (5),
//! `CDS_RELAY_BASELINE` (another pilot-agent build, e.g. the previous commit's: relayed and
//! measured in the same runs, and compared with the agent under test), `PEER_AGENT` (Istio's own
//! Go `pilot-agent`, run with `DISABLE_ENVOY=true`, which serves its `XDS` socket and starts no
//! Envoy: relayed in the same runs; the ratios of the added time and of the CPU per MB, ours over
//! Istio's, are printed against the issue's goals, ≤ 0.5 each).
// A bench binary: its knobs (CDS_RELAY_*, PEER_AGENT, ISTIO_GO_BIN ...) come from the environment.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prost::Message;
use proto::envoy::config::core::v3::Node;
use proto::envoy::service::discovery::v3::DiscoveryRequest;
use proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::type_url::CLUSTER;

const NS: &str = "demo";
const SAN: &str = "istiod.istio-system.svc";
/// Envoy's default HTTP/2 receive windows (`Http2ProtocolOptions`: 256 MiB, stream and
/// connection), which Istio's bootstrap leaves as they are for `xds-grpc`: the simulated
/// Envoy reads with them on every path.
const ENVOY_WINDOW: u32 = 256 << 20;

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time the process has used (all threads, ns), from /proc/<pid>/task/*/schedstat.
fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

fn service_entries(n: usize) -> String {
    let mut y = String::with_capacity(n * 200);
    for i in 0..n {
        if i > 0 {
            y.push_str("---\n");
        }
        y.push_str(&format!(
            "kind: ServiceEntry\nmetadata: {{name: svc-{i}, namespace: {NS}}}\nspec: {{hosts: [svc-{i}.bench.example], ports: [{{number: 80, name: http, protocol: HTTP}}], resolution: DNS}}\n"
        ));
    }
    y
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what} not ready in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

type Client = AggregatedDiscoveryServiceClient<tonic::transport::Channel>;

async fn uds_client(path: PathBuf) -> Client {
    let channel = tonic::transport::Endpoint::from_static("http://xds")
        .initial_stream_window_size(ENVOY_WINDOW)
        .initial_connection_window_size(ENVOY_WINDOW)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .expect("connecting to the agent's XDS socket");
    AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX)
}

fn tcp_client(inputs: &sds::ChannelInputs) -> Client {
    let channel = sds::grpc_channel(inputs).expect("istiod-lite channel");
    AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX)
}

/// One fresh stream: CDS request → the full CDS response. Returns (elapsed, clusters, bytes).
async fn fetch_cds(client: Client, token: Option<&str>) -> (Duration, usize, usize) {
    let start = Instant::now();
    let mut client = client;
    let node = Node {
        id: format!("sidecar~127.0.0.1~bench.{NS}~{NS}.svc.cluster.local"),
        ..Default::default()
    };
    let req = DiscoveryRequest {
        node: Some(node),
        type_url: CLUSTER.into(),
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(req).await.unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let mut stream = client
        .stream_aggregated_resources(request)
        .await
        .expect("ADS stream")
        .into_inner();
    loop {
        let resp = stream
            .message()
            .await
            .expect("CDS response")
            .expect("stream open");
        if resp.type_url == CLUSTER {
            let elapsed = start.elapsed();
            drop(tx);
            return (elapsed, resp.resources.len(), resp.encoded_len());
        }
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[expect(
    clippy::too_many_lines,
    reason = "the benchmark's one program: the setup, the measured runs and the report, read top to bottom"
)]
fn main() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let bin = |var: &str, default: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join(default))
    };
    let agent_bin = bin("CDS_RELAY_AGENT", "target/dist/pilot-agent");
    let istiod_bin = bin("CDS_RELAY_ISTIOD", "target/release/istiod-lite");
    let clusters: usize = std::env::var("CDS_RELAY_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let runs: usize = std::env::var("CDS_RELAY_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();

    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    for d in [
        "ca",
        "config",
        "pod/var/run/secrets/tokens",
        "pod/var/run/secrets/istio",
    ] {
        std::fs::create_dir_all(w.join(d)).unwrap();
    }
    std::fs::write(w.join("config/services.yaml"), service_entries(clusters)).unwrap();
    let (grpc, secure, monitoring) = (free_port(), free_port(), free_port());
    let mut procs = Procs(Vec::new());
    procs.0.push(
        Command::new(&istiod_bin)
            .args(["serve", "--config-dir"])
            .arg(w.join("config"))
            .arg("--ca-dir")
            .arg(w.join("ca"))
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--secure-grpc-addr", &format!("127.0.0.1:{secure}")])
            .args(["--monitoring-addr", &format!("127.0.0.1:{monitoring}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting istiod-lite (build it: cargo build --release -p control-plane --bin istiod-lite)"),
    );
    wait_for("istiod-lite CA", || {
        w.join("ca/root-cert.pem").exists()
            && std::net::TcpStream::connect(("127.0.0.1", secure)).is_ok()
    });
    let token = Command::new(&istiod_bin)
        .args(["token", "--ca-dir"])
        .arg(w.join("ca"))
        .args(["--namespace", NS, "--service-account", "sa"])
        .output()
        .expect("istiod-lite token");
    assert!(token.status.success(), "istiod-lite token failed");
    let token = String::from_utf8(token.stdout).unwrap().trim().to_string();
    std::fs::write(w.join("pod/var/run/secrets/tokens/istio-token"), &token).unwrap();
    let root = std::fs::read(w.join("ca/root-cert.pem")).unwrap();
    std::fs::write(w.join("pod/var/run/secrets/istio/root-cert.pem"), &root).unwrap();

    let mut agents = vec![Agent::start(&agent_bin, w, "pod", secure, &mut procs)];
    if let Some(baseline) = std::env::var_os("CDS_RELAY_BASELINE") {
        for f in ["tokens/istio-token", "istio/root-cert.pem"] {
            let to = w.join("baseline/var/run/secrets").join(f);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(w.join("pod/var/run/secrets").join(f), to).unwrap();
        }
        agents.push(Agent::start(
            Path::new(&baseline),
            w,
            "baseline",
            secure,
            &mut procs,
        ));
    }

    if let Some(peer) = std::env::var_os("PEER_AGENT") {
        for f in ["tokens/istio-token", "istio/root-cert.pem"] {
            let to = w.join("peer/var/run/secrets").join(f);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(w.join("pod/var/run/secrets").join(f), to).unwrap();
        }
        agents.push(Agent::start(
            Path::new(&peer),
            w,
            "peer",
            secure,
            &mut procs,
        ));
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut tls = sds::ChannelInputs::new(
        format!("127.0.0.1:{secure}"),
        sds::RootSource::Pem(root),
        SAN,
    );
    tls.window = ENVOY_WINDOW;
    let mut plain =
        sds::ChannelInputs::new(format!("127.0.0.1:{grpc}"), sds::RootSource::System, "");
    plain.plaintext = true;
    plain.window = ENVOY_WINDOW;

    let (mut direct_tls, mut direct_plain) = (vec![], vec![]);
    let (mut n_direct, mut bytes) = (0, 0);
    for a in &mut agents {
        a.before = (status_kib(a.pid, "VmRSS:"), status_kib(a.pid, "VmHWM:"));
    }
    rt.block_on(async {
        // Warm-up: istiod-lite builds and caches the config on the first request.
        fetch_cds(tcp_client(&plain), None).await;
        for _ in 0..runs {
            let (d, n, b) = fetch_cds(tcp_client(&tls), Some(&token)).await;
            direct_tls.push(d);
            (n_direct, bytes) = (n, b);
            direct_plain.push(fetch_cds(tcp_client(&plain), None).await.0);
            for a in &mut agents {
                let cpu = cpu_ns(a.pid);
                let (d, n, _) = fetch_cds(uds_client(a.xds.clone()).await, None).await;
                a.cpu.push(Duration::from_nanos(cpu_ns(a.pid) - cpu));
                a.times.push(d);
                assert_eq!(n, n_direct, "{}: the agent relayed every cluster", a.name);
            }
        }
    });
    for a in &mut agents {
        a.after = (status_kib(a.pid, "VmRSS:"), status_kib(a.pid, "VmHWM:"));
    }
    // The agent trims its heap every 10 s while idle.
    std::thread::sleep(Duration::from_secs(11));
    let (t, p) = (median(&mut direct_tls), median(&mut direct_plain));
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "clusters={n_direct} cds_bytes={bytes} runs={runs}\n\
         direct_tls_ms={:.1} direct_plaintext_ms={:.1} (medians)",
        ms(t),
        ms(p),
    );
    let mut first = None;
    let mut added_and_cpu = Vec::new();
    for a in &mut agents {
        let via = median(&mut a.times);
        let vs_first = first
            .map(|f: Duration| {
                format!(
                    " {}/agent={:.2}",
                    a.name,
                    via.as_secs_f64() / f.as_secs_f64()
                )
            })
            .unwrap_or_default();
        first.get_or_insert(via);
        let cpu_ms = ms(median(&mut a.cpu));
        let mb = bytes as f64 / 1e6;
        added_and_cpu.push((a.name, ms(via) - ms(t), cpu_ms / mb));
        println!(
            "{name}: via_{name}_ms={:.1} relay_overhead_ms={:.1} via_{name}/direct_tls={:.2}{vs_first} \
             cpu_ms_per_relay={:.1}\n\
             {name}: rss_kib_before={} hwm_kib_before={} hwm_kib_after={} peak_delta_kib={} \
             rss_kib_after={} rss_kib_after_11s_idle={}",
            ms(via),
            ms(via) - ms(t),
            via.as_secs_f64() / t.as_secs_f64(),
            cpu_ms,
            a.before.0,
            a.before.1,
            a.after.1,
            a.after.1.saturating_sub(a.before.1),
            a.after.0,
            status_kib(a.pid, "VmRSS:"),
            name = a.name,
        );
    }
    let find = |n| {
        added_and_cpu
            .iter()
            .find(|(name, _, _)| *name == n)
            .copied()
    };
    if let (Some((_, ours_added, ours_cpu)), Some((_, peer_added, peer_cpu))) =
        (find("agent"), find("peer"))
    {
        println!(
            "ours/Istio's agent: added time {ours_added:.1} / {peer_added:.1} ms = {:.2} (goal ≤ 0.5), \
             CPU per MB {ours_cpu:.2} / {peer_cpu:.2} ms = {:.2} (goal ≤ 0.5)",
            ours_added / peer_added,
            ours_cpu / peer_cpu,
        );
    }
}

/// One pilot-agent under test: `agent` (CDS_RELAY_AGENT), `baseline` (CDS_RELAY_BASELINE) or
/// `peer` (PEER_AGENT, Istio's).
struct Agent {
    name: &'static str,
    pid: u32,
    xds: PathBuf,
    times: Vec<Duration>,
    /// CPU time during each relay.
    cpu: Vec<Duration>,
    /// (VmRSS, VmHWM) before and after the pushes.
    before: (u64, u64),
    after: (u64, u64),
}

impl Agent {
    /// Starts `bin` as a sidecar agent (external Envoy) in `<w>/<name>` (token and root cert in
    /// place), relaying to istiod-lite on `secure`.
    fn start(bin: &Path, w: &Path, dir: &'static str, secure: u16, procs: &mut Procs) -> Agent {
        let status_port = free_port();
        let mut cmd = Command::new(bin);
        cmd.env_clear();
        if dir == "peer" {
            // Istio's Go agent has no external-Envoy mode: it serves the XDS socket and starts
            // no Envoy with DISABLE_ENVOY (ours would then also drop its SDS server).
            cmd.env("DISABLE_ENVOY", "true");
        }
        let agent = cmd
            .args(["proxy", "sidecar"])
            .current_dir(w.join(dir))
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs([
                ("CLOUD_PLATFORM", "none"),
                ("POD_NAME", "bench"),
                ("POD_NAMESPACE", NS),
                ("SERVICE_ACCOUNT", "sa"),
                ("INSTANCE_IP", "127.0.0.1"),
                ("ISTIOD_SAN", SAN),
                ("ECC_SIGNATURE_ALGORITHM", "ECDSA"),
                ("ISTIO_AGENT_EXTERNAL_ENVOY", "true"),
                ("RUST_LOG", "warn"),
            ])
            .env(
                "PROXY_CONFIG",
                format!(
                    r#"{{"discoveryAddress":"127.0.0.1:{secure}","proxyAdminPort":{},"statusPort":{status_port}}}"#,
                    free_port()
                ),
            )
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} (build it: scripts/build-dist.sh): {e}", bin.display()));
        let pid = agent.id();
        procs.0.push(agent);
        let xds = w.join(dir).join("etc/istio/proxy/XDS");
        wait_for("the agent's XDS socket", || xds.exists());
        Agent {
            name: match dir {
                "pod" => "agent",
                "peer" => "peer",
                _ => "baseline",
            },
            pid,
            xds,
            times: vec![],
            cpu: vec![],
            before: (0, 0),
            after: (0, 0),
        }
    }
}
