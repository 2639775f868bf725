//! ADS load generator: N simulated proxies (SotW and Delta) that subscribe and ACK like Envoy,
//! against a real `istiod-lite serve` process. One WorkloadEntry changes; we measure the time from
//! the file write until each proxy has received and ACKed the EDS push (p50/p99/max, including
//! the debounce), and the server's memory per connected proxy (RSS delta / N).
//!
//! `cargo bench -p control-plane --bench ads_load` (env: ADS_LOAD_CLIENTS=2000,
//! ADS_LOAD_MODES=sotw,delta, ADS_LOAD_PACE=0 (at most that many proxies between connect and
//! initial sync at once; 0 = every proxy connects in one burst), PILOT_DEBOUNCE_AFTER passed
//! through, default 100ms).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use proto::type_url::{CLUSTER, ENDPOINT, LISTENER, ROUTE};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

#[path = "../tests/grpc/common.rs"]
mod common;
use common::{Istiod, node};

const EDS: &str = "outbound|80||api.example.com";

fn config(endpoint_ip: &str) -> String {
    let mut y = String::from(
        "kind: ServiceEntry\nmetadata: {name: api, namespace: web}\nspec: {hosts: [api.example.com], addresses: [198.18.10.1], ports: [{number: 80, name: http, protocol: HTTP}], resolution: STATIC, workloadSelector: {labels: {app: api}}}\n",
    );
    for i in 0..20 {
        let ip = if i == 0 {
            endpoint_ip.to_string()
        } else {
            format!("198.18.1.{i}")
        };
        y.push_str(&format!("---\nkind: WorkloadEntry\nmetadata: {{name: api-{i}, namespace: web}}\nspec: {{address: {ip}, labels: {{app: api}}}}\n"));
    }
    for s in 0..20 {
        y.push_str(&format!("---\nkind: ServiceEntry\nmetadata: {{name: svc-{s}, namespace: web}}\nspec: {{hosts: [svc-{s}.example.com], addresses: [198.18.20.{s}], ports: [{{number: 8080, name: http, protocol: HTTP}}], resolution: STATIC, endpoints: [{{address: 198.18.2.{s}}}]}}\n"));
    }
    y
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

struct Shared {
    synced: AtomicUsize,
    opened: AtomicUsize,
    changed_at: Mutex<Option<Instant>>,
    acks: Mutex<Vec<Duration>>,
}

async fn sotw_client(
    addr: SocketAddr,
    i: usize,
    shared: Arc<Shared>,
    permit: OwnedSemaphorePermit,
) {
    let mut permit = Some(permit);
    let Ok(mut client) = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await
    else {
        eprintln!("client {i}: connect failed");
        return;
    };
    let (tx, rx) = mpsc::channel(8);
    let req = |t: &str, names: &[&str], nonce: &str| DiscoveryRequest {
        node: Some(node(i)),
        type_url: t.into(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    };
    let _ = tx.send(req(CLUSTER, &[], "")).await;
    let Ok(resp) = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
    else {
        return;
    };
    shared.opened.fetch_add(1, Ordering::Relaxed);
    let mut stream = resp.into_inner();
    let mut synced = 0;
    loop {
        let r = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(_) => break,
        };
        let names: &[&str] = match r.type_url.as_str() {
            t if t == ENDPOINT => &[EDS],
            t if t == ROUTE => &["80"],
            _ => &[],
        };
        let _ = tx.send(req(&r.type_url, names, &r.nonce)).await;
        if synced < 4 {
            synced += 1;
            // Subscribe like Envoy: CDS, then EDS, LDS, RDS.
            let next = match r.type_url.as_str() {
                t if t == CLUSTER => Some(req(ENDPOINT, &[EDS], "")),
                t if t == ENDPOINT => Some(req(LISTENER, &[], "")),
                t if t == LISTENER => Some(req(ROUTE, &["80"], "")),
                _ => None,
            };
            if let Some(n) = next {
                let _ = tx.send(n).await;
            }
            if synced == 4 {
                permit.take();
                shared.synced.fetch_add(1, Ordering::Relaxed);
            }
        } else if r.type_url == ENDPOINT
            && let Some(t0) = *shared.changed_at.lock().await
        {
            shared.acks.lock().await.push(t0.elapsed());
        }
    }
}

async fn delta_client(
    addr: SocketAddr,
    i: usize,
    shared: Arc<Shared>,
    permit: OwnedSemaphorePermit,
) {
    let mut permit = Some(permit);
    let Ok(mut client) = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await
    else {
        eprintln!("client {i}: connect failed");
        return;
    };
    let (tx, rx) = mpsc::channel(8);
    let req = |t: &str, sub: &[&str], nonce: &str| DeltaDiscoveryRequest {
        node: Some(node(i)),
        type_url: t.into(),
        resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    };
    let _ = tx.send(req(CLUSTER, &[], "")).await;
    let Ok(resp) = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
    else {
        return;
    };
    shared.opened.fetch_add(1, Ordering::Relaxed);
    let mut stream = resp.into_inner();
    let mut synced = 0;
    loop {
        let r = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(_) => break,
        };
        let _ = tx.send(req(&r.type_url, &[], &r.nonce)).await;
        if synced < 4 {
            synced += 1;
            let next = match r.type_url.as_str() {
                t if t == CLUSTER => Some(req(ENDPOINT, &[EDS], "")),
                t if t == ENDPOINT => Some(req(LISTENER, &[], "")),
                t if t == LISTENER => Some(req(ROUTE, &["80"], "")),
                _ => None,
            };
            if let Some(n) = next {
                let _ = tx.send(n).await;
            }
            if synced == 4 {
                permit.take();
                shared.synced.fetch_add(1, Ordering::Relaxed);
            }
        } else if r.type_url == ENDPOINT
            && let Some(t0) = *shared.changed_at.lock().await
        {
            shared.acks.lock().await.push(t0.elapsed());
        }
    }
}

fn write_atomic(dir: &Path, text: &str) {
    let tmp = dir.join(".mesh.tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, dir.join("mesh.yaml")).expect("rename");
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn run(mode: &str, n: usize) {
    let cfg = tempfile::tempdir().expect("tempdir");
    let ca = tempfile::tempdir().expect("tempdir");
    write_atomic(cfg.path(), &config("198.18.1.0"));
    let server = Istiod::start(cfg.path(), ca.path(), "warn,istiod_lite=info");
    let addr = server.grpc;
    let pid = server.child.id();
    let rss0 = rss_kib(pid);
    let shared = Arc::new(Shared {
        synced: AtomicUsize::new(0),
        opened: AtomicUsize::new(0),
        changed_at: Mutex::new(None),
        acks: Mutex::new(Vec::new()),
    });
    let t_connect = Instant::now();
    // ADS_LOAD_PACE=N: like a fleet of Envoys starting, at most N proxies are between connect
    // and their initial sync at any time. 0 (default): one burst, as after an istiod restart.
    let pace = std::env::var("ADS_LOAD_PACE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|p| *p > 0)
        .unwrap_or(n.max(1));
    let gate = Arc::new(Semaphore::new(pace));
    for i in 0..n {
        let s = shared.clone();
        let permit = gate.clone().acquire_owned().await.expect("gate");
        if mode == "delta" {
            tokio::spawn(delta_client(addr, i, s, permit));
        } else {
            tokio::spawn(sotw_client(addr, i, s, permit));
        }
    }
    while shared.synced.load(Ordering::Relaxed) < n {
        if t_connect.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "only {} of {n} proxies synced within 60 s ({} streams opened); measuring those",
                shared.synced.load(Ordering::Relaxed),
                shared.opened.load(Ordering::Relaxed),
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let synced = shared.synced.load(Ordering::Relaxed);
    let connect_time = t_connect.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss1 = rss_kib(pid);

    *shared.changed_at.lock().await = Some(Instant::now());
    write_atomic(cfg.path(), &config("198.18.3.3"));
    let t0 = Instant::now();
    while shared.acks.lock().await.len() < synced {
        if t0.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut acks = shared.acks.lock().await.clone();
    acks.sort();
    println!(
        "ads_load mode={mode} proxies={n} pace={pace} synced={synced} connect+initial_sync={connect_time:?} acked={}/{synced} p50={:?} p99={:?} max={:?} rss_before={}KiB rss_connected={}KiB per_proxy={:.1}KiB",
        acks.len(),
        pct(&acks, 0.5),
        pct(&acks, 0.99),
        acks.last().copied().unwrap_or_default(),
        rss0,
        rss1,
        rss1.saturating_sub(rss0) as f64 / n as f64,
    );
    drop(server);
}

fn main() {
    // `cargo bench` passes `--bench`; with a filter argument for another bench, do nothing.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if !args.is_empty() && !args.iter().any(|a| "ads_load".contains(a.as_str())) {
        return;
    }
    let n: usize = std::env::var("ADS_LOAD_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let modes = std::env::var("ADS_LOAD_MODES").unwrap_or_else(|_| "sotw,delta".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for mode in modes.split(',') {
        rt.block_on(run(mode.trim(), n));
    }
}
