//! Runs the DNS proxy standalone (for benchmarks and manual testing).
//!
//! `serve <hosts-file> <resolv.conf>`: loads `<ip> <name>...` lines (hosts-file format) as a
//! name table, reads Istio's variables (`DNS_PROXY_ADDR`, `DNS_FORWARD_TIMEOUT`,
//! `DNS_PROXY_CACHE`, ...) from the environment, prints `listening <addr>` and serves until
//! SIGINT/SIGTERM. `SERVE_RUNTIME=current` uses a single-threaded runtime.
//! `SERVE_UPSTREAMS=ip:port,...` replaces the resolv.conf nameservers.
//! Worker threads: `TOKIO_WORKER_THREADS` (tokio's own variable).

use std::collections::HashMap;
use std::sync::Arc;

use proto::istio::nds::{NameTable, name_table::NameInfo};

fn hosts_table(text: &str) -> NameTable {
    let mut nt = NameTable::default();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        let Some(ip) = words.next() else { continue };
        for name in words {
            let entry: &mut NameInfo = nt.table.entry(name.to_string()).or_default();
            entry.ips.push(ip.to_string());
        }
    }
    nt
}

#[allow(clippy::disallowed_methods)] // an example's main: SERVE_RUNTIME
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SERVE_RUNTIME=current: single-threaded runtime (for one-core benchmarks).
    let rt = if std::env::var("SERVE_RUNTIME").as_deref() == Ok("current") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    rt.block_on(serve())
}

#[allow(clippy::disallowed_methods)] // the example's entry point reads the environment once
async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(hosts), Some(resolv)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: serve <hosts-file> <resolv.conf>");
        std::process::exit(2);
    };
    let env: HashMap<String, String> = std::env::vars().collect();
    let mut config = dns_proxy::Config::from_resolv_conf(std::path::Path::new(resolv))?;
    // The benchmark's settings (the agent's config tree reads Istio's variables; this example
    // takes the two the benchmark sets).
    if let Some(addr) = env.get("DNS_PROXY_ADDR") {
        config.listen_addrs = dns_proxy::resolve_listen_addr(addr, &config.upstreams)?;
    }
    config.cache_enabled = env.get("DNS_PROXY_CACHE").map(String::as_str) != Some("false");
    // resolv.conf cannot name a port; benchmarks run upstreams on loopback ports.
    if let Some(list) = env.get("SERVE_UPSTREAMS") {
        config.upstreams = list.split(',').map(str::parse).collect::<Result<_, _>>()?;
    }
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(dns_proxy::Metrics::new(&mut registry));
    let proxy = dns_proxy::DnsProxy::bind(config, metrics).await?;
    proxy
        .table()
        .update(&hosts_table(&std::fs::read_to_string(hosts)?));
    for a in proxy.local_addrs() {
        println!("listening {a}");
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let s = shutdown.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        s.cancel();
    });
    proxy.run(shutdown).await?;
    Ok(())
}
