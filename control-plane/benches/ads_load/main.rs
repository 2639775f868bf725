//! ADS scale bench: for each fleet size (1k, 2k, 5k, 10k) and each protocol (SotW, Delta), a
//! fresh `istiod-lite serve` process and that many simulated proxies (`client.rs`: one TCP +
//! HTTP/2 connection and one ADS stream each, loopback) that subscribe and ACK like Envoy. Per
//! run it measures:
//!
//! - connect + initial sync: from the first connect until every proxy has ACKed CDS, EDS, LDS
//!   and RDS (at most `ADS_LOAD_PACE` proxies between connect and initial sync at once);
//! - one WorkloadEntry changed: from the config file's write until each proxy has received and
//!   ACKed the EDS push (p50/p99/max; includes istiod-lite's debounce, `PILOT_DEBOUNCE_AFTER`,
//!   100 ms by default, passed through from the environment);
//! - istiod-lite's memory per proxy: its VmRSS (read from /proc, it is a separate process) once
//!   every proxy is synced and 500 ms have passed, minus its VmRSS before the first connect,
//!   divided by the proxies;
//! - CPU: istiod-lite's (utime+stime from /proc) and this process's, i.e. the client side's
//!   (getrusage), in each phase.
//!
//! It prints one line per run and a Markdown table, and writes the curve as a PNG
//! (`<target>/bench/ads_scale.png`).
//!
//! `cargo bench -p control-plane --bench ads_load`. Environment: `ADS_LOAD_CLIENTS`
//! (`1000,2000,5000,10000`), `ADS_LOAD_MODES` (`sotw,delta`), `ADS_LOAD_PACE` (`1000`; `0` = one
//! unpaced burst), `ADS_LOAD_CLIENT_THREADS` (`1`: the client runtime's worker threads),
//! `ADS_LOAD_PLOT` (PNG path).
//!
//! File descriptors: each proxy holds one socket here and one in istiod-lite (10,000 proxies:
//! ~20,000 in all), so the bench raises its soft `RLIMIT_NOFILE` to the hard limit (istiod-lite
//! does the same for itself at start); a hard limit below the largest fleet (plus slack) is
//! reported before the run.
// A bench binary: its knobs (ADS_LOAD_*) come from the environment; sysconf(3), getrusage(2)
// and the open-file rlimit measure and size the run.
#![allow(clippy::disallowed_methods, unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

mod client;
#[path = "../../tests/grpc/common.rs"]
mod common;
mod plot;

use client::{Mode, Shared};
use common::Istiod;

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

/// istiod-lite's CPU time (user + system) so far.
fn process_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Duration::ZERO;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// This process's CPU time (user + system), i.e. the simulated proxies'.
fn self_cpu() -> Duration {
    // SAFETY: getrusage writes only the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Raises the soft open-file limit to the hard limit; returns the limit now in force.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One (mode, fleet size) run.
struct Outcome {
    mode: Mode,
    n: usize,
    synced: usize,
    failed: usize,
    connect: Duration,
    connect_cpu: (Duration, Duration),
    acked: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
    push_cpu: (Duration, Duration),
    rss_before: u64,
    rss_synced: u64,
    rss_after: u64,
}

impl Outcome {
    fn per_proxy_kib(&self) -> f64 {
        self.rss_synced.saturating_sub(self.rss_before) as f64 / self.n.max(1) as f64
    }
}

async fn run(mode: Mode, n: usize, pace: usize) -> Outcome {
    let cfg = tempfile::tempdir().expect("tempdir");
    let ca = tempfile::tempdir().expect("tempdir");
    write_atomic(cfg.path(), &config("198.18.1.0"));
    let server = Istiod::start(cfg.path(), ca.path(), "warn,istiod_lite=info");
    let addr = server.grpc;
    let pid = server.child.id();
    // Let the first snapshot settle before the baseline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_before = status_kib(pid, "VmRSS:");
    let shared = Arc::new(Shared::new(n));
    let (cpu0_client, cpu0_server) = (self_cpu(), process_cpu(pid));
    let t_connect = Instant::now();
    let gate = Arc::new(Semaphore::new(pace.max(1)));
    for i in 0..n {
        let permit = gate.clone().acquire_owned().await.expect("gate");
        tokio::spawn(client::run(addr, mode, i, shared.clone(), permit));
    }
    while shared.synced.load(Ordering::Relaxed) + shared.failed.load(Ordering::Relaxed) < n {
        if t_connect.elapsed() > Duration::from_secs(120) {
            eprintln!(
                "only {} of {n} proxies synced within 120 s ({} streams opened, {} failed); measuring those",
                shared.synced.load(Ordering::Relaxed),
                shared.opened.load(Ordering::Relaxed),
                shared.failed.load(Ordering::Relaxed),
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let synced = shared.synced.load(Ordering::Relaxed);
    let connect = t_connect.elapsed();
    let connect_cpu = (self_cpu() - cpu0_client, process_cpu(pid) - cpu0_server);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_synced = status_kib(pid, "VmRSS:");

    let (cpu1_client, cpu1_server) = (self_cpu(), process_cpu(pid));
    shared.arm();
    write_atomic(cfg.path(), &config("198.18.3.3"));
    let t0 = Instant::now();
    while shared.acked.load(Ordering::Relaxed) < synced {
        if t0.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let push_cpu = (self_cpu() - cpu1_client, process_cpu(pid) - cpu1_server);
    let rss_after = status_kib(pid, "VmRSS:");
    let acks = shared.ack_times();
    let failed = shared.failed.load(Ordering::Relaxed);
    shared.closing.store(true, Ordering::SeqCst);
    drop(server);
    // Every client task ends on the closed connection; wait so the next run starts clean.
    let t_end = Instant::now();
    while shared.live.load(Ordering::Relaxed) > 0 && t_end.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Outcome {
        mode,
        n,
        synced,
        failed,
        connect,
        connect_cpu,
        acked: acks.len(),
        p50: pct(&acks, 0.5),
        p99: pct(&acks, 0.99),
        max: acks.last().copied().unwrap_or_default(),
        push_cpu,
        rss_before,
        rss_synced,
        rss_after,
    }
}

fn print_line(o: &Outcome, pace: usize) {
    println!(
        "ads_load mode={} proxies={} pace={pace} synced={} failed={} connect+initial_sync={:.0}ms (cpu client {:.2}s server {:.2}s) acked={}/{} p50={:.0}ms p99={:.0}ms max={:.0}ms (cpu client {:.2}s server {:.2}s) rss_before={}KiB rss_synced={}KiB rss_after_push={}KiB per_proxy={:.1}KiB",
        o.mode.name(),
        o.n,
        o.synced,
        o.failed,
        ms(o.connect),
        o.connect_cpu.0.as_secs_f64(),
        o.connect_cpu.1.as_secs_f64(),
        o.acked,
        o.synced,
        ms(o.p50),
        ms(o.p99),
        ms(o.max),
        o.push_cpu.0.as_secs_f64(),
        o.push_cpu.1.as_secs_f64(),
        o.rss_before,
        o.rss_synced,
        o.rss_after,
        o.per_proxy_kib(),
    );
}

fn print_table(outcomes: &[Outcome]) {
    println!();
    println!(
        "| mode | proxies | connect + initial sync | CPU client / istiod-lite | WorkloadEntry → all ACKed p50 / p99 / max | CPU client / istiod-lite | istiod-lite RSS per proxy |"
    );
    println!("|---|---|---|---|---|---|---|");
    for o in outcomes {
        let acked = if o.acked == o.n {
            String::new()
        } else {
            format!(" ({} of {} ACKed)", o.acked, o.n)
        };
        println!(
            "| {} | {} | {:.2} s | {:.2} / {:.2} s | {:.0} / {:.0} / {:.0} ms{acked} | {:.2} / {:.2} s | {:.1} KiB |",
            o.mode.name(),
            o.n,
            o.connect.as_secs_f64(),
            o.connect_cpu.0.as_secs_f64(),
            o.connect_cpu.1.as_secs_f64(),
            ms(o.p50),
            ms(o.p99),
            ms(o.max),
            o.push_cpu.0.as_secs_f64(),
            o.push_cpu.1.as_secs_f64(),
            o.per_proxy_kib(),
        );
    }
}

fn plot_path() -> PathBuf {
    if let Ok(p) = std::env::var("ADS_LOAD_PLOT") {
        return p.into();
    }
    // The bench runs as <target>/<profile>/deps/ads_load-<hash>.
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.parent()?.join("bench")))
        .unwrap_or_else(|| PathBuf::from("target/bench"))
        .join("ads_scale.png")
}

fn plot(outcomes: &[Outcome], path: &Path) -> Result<(), String> {
    use plotters::style::RGBColor;
    let color = |m: Mode| match m {
        Mode::Sotw => RGBColor(31, 119, 180),
        Mode::Delta => RGBColor(214, 39, 40),
    };
    let modes: Vec<Mode> = [Mode::Sotw, Mode::Delta]
        .into_iter()
        .filter(|m| outcomes.iter().any(|o| o.mode == *m))
        .collect();
    let series = |m: Mode, name: &str, dashed: bool, f: &dyn Fn(&Outcome) -> f64| plot::Series {
        name: format!("{} {name}", m.name()),
        points: outcomes
            .iter()
            .filter(|o| o.mode == m)
            .map(|o| (o.n as f64, f(o)))
            .collect(),
        color: color(m),
        dashed,
    };
    let latency = plot::Panel {
        title: "WorkloadEntry changed -> every proxy ACKed EDS".into(),
        y_desc: "ms (incl. 100 ms debounce)".into(),
        series: modes
            .iter()
            .flat_map(|m| {
                [
                    series(*m, "p99", false, &|o| ms(o.p99)),
                    series(*m, "p50", true, &|o| ms(o.p50)),
                ]
            })
            .collect(),
        goal: Some(("goal 2 s".into(), 2000.0)),
        legend: plotters::chart::SeriesLabelPosition::UpperLeft,
    };
    let memory = plot::Panel {
        title: "istiod-lite RSS per connected proxy".into(),
        y_desc: "KiB".into(),
        series: modes
            .iter()
            .map(|m| series(*m, "", false, &|o| o.per_proxy_kib()))
            .collect(),
        goal: Some(("goal 32 KiB".into(), 32.0)),
        legend: plotters::chart::SeriesLabelPosition::LowerRight,
    };
    let connect = plot::Panel {
        title: "connect + initial sync (CDS, EDS, LDS, RDS)".into(),
        y_desc: "ms".into(),
        series: modes
            .iter()
            .map(|m| series(*m, "", false, &|o| ms(o.connect)))
            .collect(),
        goal: None,
        legend: plotters::chart::SeriesLabelPosition::LowerRight,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    plot::draw(
        path,
        "istiod-lite ADS scale (loopback, one machine)",
        &[latency, memory, connect],
    )
}

fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    match std::env::var(var) {
        Err(_) => default,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("{var}={v:?} is not valid; using the default");
            default
        }),
    }
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
    let sizes: Vec<usize> = std::env::var("ADS_LOAD_CLIENTS")
        .unwrap_or_else(|_| "1000,2000,5000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let modes: Vec<Mode> = std::env::var("ADS_LOAD_MODES")
        .unwrap_or_else(|_| "sotw,delta".into())
        .split(',')
        .filter_map(|m| match m.trim() {
            "sotw" => Some(Mode::Sotw),
            "delta" => Some(Mode::Delta),
            other => {
                eprintln!("ADS_LOAD_MODES: unknown mode {other:?} (expected sotw or delta)");
                None
            }
        })
        .collect();
    // 0: one unpaced burst (every proxy of the fleet at once).
    let pace = env_or("ADS_LOAD_PACE", 1000usize);
    let threads = env_or("ADS_LOAD_CLIENT_THREADS", 1usize).max(1);
    let nofile = raise_nofile();
    let largest = sizes.iter().copied().max().unwrap_or(0) as u64;
    println!(
        "ads_load: RLIMIT_NOFILE {nofile} (raised to the hard limit; istiod-lite inherits it), client runtime {threads} thread(s), pace {}, CPUs {}",
        if pace == 0 {
            "unpaced".to_string()
        } else {
            pace.to_string()
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    if nofile < largest + 64 {
        eprintln!(
            "RLIMIT_NOFILE {nofile} is below {} proxies + slack: expect connect failures",
            largest
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime");
    let mut outcomes = Vec::new();
    for &n in &sizes {
        for &mode in &modes {
            let pace = if pace == 0 { n } else { pace.min(n) };
            let o = rt.block_on(run(mode, n, pace));
            print_line(&o, pace);
            outcomes.push(o);
        }
    }
    outcomes.sort_by_key(|o| (o.mode == Mode::Delta, o.n));
    print_table(&outcomes);
    let path = plot_path();
    match plot(&outcomes, &path) {
        Ok(()) => println!("\nplot: {}", path.display()),
        Err(e) => eprintln!("no plot written: {e}"),
    }
}
