//! A million distinct large upstream answers through the proxy's answer path, with the cache
//! at its defaults (`DNS_PROXY_CACHE_MAX_BYTES` 16 MiB, 10,000 entries): the cache must stay
//! within its budget after every answer (exit 1 the moment it does not).
//!
//! `nice -n 19 cargo bench -p dns-proxy --bench cache_flood [-- N]` (N answers, default
//! 1,000,000). Every answer is a TXT answer to a name never asked before (`n<i>.flood.example`),
//! 300 s TTL, so nothing expires and every answer is a new entry: 1% ~64 KiB (what a UDP query
//! gets once its truncated answer is retried over TCP), 30% ~4 KiB (a full 4096-byte EDNS
//! datagram), the rest ~1 KiB. One query in ten comes over TCP (the parsed path); the rest
//! over UDP with EDNS 4096 (the wire path). Prints answers pushed, time, cache bytes and
//! entries at the end and the most seen, and the process's peak RSS (VmHWM) before and after.

use std::process::ExitCode;
use std::time::Instant;

use dns_proxy::bench::UpstreamAnswers;
use dns_proxy::{Config, ResolvConf};

/// One TXT string: 250 bytes, so a record is 263 bytes on the wire (name pointer, type,
/// class, TTL, length, the string's length byte).
const TXT_LEN: usize = 250;
const RECORD_LEN: usize = 2 + 2 + 2 + 4 + 2 + 1 + TXT_LEN;

/// Records in an answer of about `bytes` bytes.
fn records_for(bytes: usize) -> usize {
    bytes / RECORD_LEN
}

/// A stub resolver's query for `name` TXT: id `id`, RD, EDNS with a 4096-byte buffer when
/// `edns` (UDP clients).
fn query(id: u16, name: &str, edns: bool) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns)]);
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&[0, 16, 0, 1]);
    if edns {
        q.extend_from_slice(&[0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0]);
    }
    q
}

/// The upstream's answer to `query` (its question at 12..`question_end`): `records` TXT
/// records of [`TXT_LEN`] bytes each, TTL 300, their text made distinct by `seed`.
fn answer(query: &[u8], question_end: usize, records: usize, seed: usize) -> Vec<u8> {
    let mut a = Vec::with_capacity(question_end + records * RECORD_LEN);
    a.extend_from_slice(&query[..2]);
    a.extend_from_slice(&[0x81, 0x80, 0, 1]);
    a.extend_from_slice(&(records as u16).to_be_bytes());
    a.extend_from_slice(&[0, 0, 0, 0]);
    a.extend_from_slice(&query[12..question_end]);
    let mut text = [b'x'; TXT_LEN];
    let tag = format!("v=flood{seed}");
    text[..tag.len()].copy_from_slice(tag.as_bytes());
    for r in 0..records {
        a.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 0x01, 0x2c]);
        a.extend_from_slice(&((TXT_LEN + 1) as u16).to_be_bytes());
        a.push(TXT_LEN as u8);
        text[TXT_LEN - 1] = b'a' + (r % 26) as u8;
        a.extend_from_slice(&text);
    }
    a
}

/// The process's peak resident set (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; a bare number is the answer count.
    let total: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let config = Config::defaults(
        ResolvConf {
            nameservers: vec![([127, 0, 0, 1], 53).into()],
            search: vec![],
        },
        "/etc/resolv.conf".into(),
    );
    let (max_bytes, max_entries) = (config.cache_max_bytes, config.cache_max_entries);
    assert!(config.cache_enabled, "the cache is on by default");
    let path = UpstreamAnswers::new(&config);
    let rss_before = peak_rss_kib();
    println!(
        "cache budget: {max_bytes} bytes, {max_entries} entries; pushing {total} distinct answers"
    );
    let (mut most_bytes, mut most_entries, mut pushed_bytes) = (0usize, 0usize, 0usize);
    let mut sizes = [0usize; 3];
    let start = Instant::now();
    for i in 0..total {
        let (kind, records) = match i % 100 {
            0 => (2, records_for(65_000)),
            1..=30 => (1, records_for(4_000)),
            _ => (0, records_for(1_024)),
        };
        // Large answers come back over UDP (retried over TCP by the forwarder after TC).
        let tcp = kind != 2 && i % 10 == 5;
        let name = format!("n{i}.flood.example");
        let q = query(i as u16, &name, !tcp);
        let question_end = 12 + name.len() + 2 + 4;
        let a = answer(&q, question_end, records, i);
        pushed_bytes += a.len();
        sizes[kind] += 1;
        if let Err(e) = path.push(&q, a, tcp) {
            eprintln!("answer {i} ({name}): {e}");
            return ExitCode::FAILURE;
        }
        let (bytes, entries) = (path.cache_bytes(), path.cache_entries());
        most_bytes = most_bytes.max(bytes);
        most_entries = most_entries.max(entries);
        if bytes > max_bytes || entries > max_entries {
            eprintln!(
                "FAIL after answer {i}: cache holds {bytes} bytes in {entries} entries, over \
                 its budget ({max_bytes} bytes, {max_entries} entries)"
            );
            return ExitCode::FAILURE;
        }
    }
    let took = start.elapsed();
    let rss_after = peak_rss_kib();
    println!(
        "answers pushed: {total} ({} ~1 KiB, {} ~4 KiB, {} ~64 KiB; {:.2} GB of answers) in \
         {:.1} s ({:.0} answers/s)",
        sizes[0],
        sizes[1],
        sizes[2],
        pushed_bytes as f64 / 1e9,
        took.as_secs_f64(),
        total as f64 / took.as_secs_f64()
    );
    println!(
        "cache at the end: {} bytes, {} entries; most seen: {most_bytes} bytes ({:.1}% of the \
         budget), {most_entries} entries",
        path.cache_bytes(),
        path.cache_entries(),
        100.0 * most_bytes as f64 / max_bytes as f64
    );
    println!(
        "peak RSS (VmHWM): {:.1} MiB before, {:.1} MiB after",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
    if path.cache_entries() == 0 {
        eprintln!("FAIL: nothing was cached");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
