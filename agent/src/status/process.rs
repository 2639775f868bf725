//! The process metrics Istio's Go agent exports from its runtime (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, ...), read from `/proc/self` at each scrape, and the
//! process's age for `istio_agent_startup_duration_seconds`.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What `/proc/self/stat` says about this process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    /// User plus system CPU time, in clock ticks.
    cpu_ticks: u64,
    /// Start time after boot, in clock ticks.
    start_ticks: u64,
    virtual_bytes: u64,
    rss_pages: u64,
}

/// Parses `/proc/self/stat` (fields after the parenthesised command name, which may hold
/// spaces).
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field n is f[n - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: num(14)? + num(15)?,
        start_ticks: num(22)?,
        virtual_bytes: num(23)?,
        rss_pages: num(24)?,
    })
}

fn ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
}

fn page_size() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE) {
        Ok(Some(p)) if p > 0 => p as u64,
        _ => 4096,
    }
}

/// Seconds since the epoch the system booted at (`/proc/stat` `btime`).
fn boot_time() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// How long this process has run (from `/proc`: the process's start and the system's uptime).
pub fn uptime() -> Option<Duration> {
    let stat = parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let up: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let started = stat.start_ticks as f64 / ticks_per_second();
    Some(Duration::from_secs_f64((up - started).max(0.0)))
}

/// The process collector (registered without the `istio_agent` prefix, as Go's).
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|t| parse_stat(&t))
        else {
            return Ok(());
        };
        let ticks = ticks_per_second();
        let cpu = ConstCounter::new(stat.cpu_ticks as f64 / ticks);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, f64); 2] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                (stat.rss_pages * page_size()) as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                stat.virtual_bytes as f64,
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let g = ConstGauge::new(fds.count() as i64);
            g.encode(encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                g.metric_type(),
            )?)?;
        }
        if let Ok((soft, _)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            let g = ConstGauge::new(soft as f64);
            g.encode(encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                g.metric_type(),
            )?)?;
        }
        if let Some(boot) = boot_time() {
            let g = ConstGauge::new(boot as f64 + stat.start_ticks as f64 / ticks);
            g.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_the_name() {
        let text = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 \
                    98765 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let s = parse_stat(text).expect("parses");
        assert_eq!(s.cpu_ticks, 300);
        assert_eq!(s.start_ticks, 98765);
        assert_eq!(s.virtual_bytes, 123456789);
        assert_eq!(s.rss_pages, 2048);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_process_metrics_encode() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(out.contains(name), "{name} missing: {out}");
        }
        let up = uptime().expect("uptime");
        assert!(up < Duration::from_secs(3600), "{up:?}");
    }
}
