//! The DNS proxy under hostile traffic: 10,000 malformed UDP packets, then a bounded flood of
//! valid and invalid queries while a prober checks that valid queries are still answered.
//!
//! The proxy runs in this process (as in `dns.rs`) with a small name table and no upstream; all
//! traffic goes to 127.0.0.1. `DNS_FLOOD_SECONDS` sets the flood length (default 10; the
//! reliability soak uses 30).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dns_proxy::{Config, DnsProxy, Metrics, TableHandle};
use proto::istio::nds::{NameTable, name_table::NameInfo};
use tokio_util::sync::CancellationToken;

/// A proxy on 127.0.0.1:<free port> serving on its own runtime until dropped.
struct Proxy {
    addr: SocketAddr,
    table: TableHandle,
    metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<Result<(), dns_proxy::Error>>,
    shutdown: CancellationToken,
    rt: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start() -> Proxy {
        let dir = tempfile::tempdir().expect("tempdir");
        let resolv = dir.path().join("resolv.conf");
        std::fs::write(
            &resolv,
            "search ns1.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
        )
        .expect("write resolv.conf");
        let mut config = Config::from_resolv_conf(&resolv).expect("config");
        config.namespace = "ns1".into();
        config.domain = "ns1.svc.cluster.local".into();
        config.listen_addrs = vec!["127.0.0.1:0".parse().unwrap()];
        config.upstreams = Vec::new();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry));
        let proxy = rt
            .block_on(DnsProxy::bind(config, metrics.clone()))
            .expect("bind proxy");
        let addr = proxy.local_addrs()[0];
        let table = proxy.table();
        let shutdown = CancellationToken::new();
        let task = rt.spawn(proxy.run(shutdown.clone()));
        Proxy {
            addr,
            table,
            metrics,
            task,
            shutdown,
            rt: Some(rt),
            _dir: dir,
        }
    }

    fn running(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

fn table() -> NameTable {
    let mut nt = NameTable::default();
    nt.table.insert(
        "productpage.ns1.svc.cluster.local".into(),
        NameInfo {
            ips: vec!["198.18.1.1".into()],
            registry: "Kubernetes".into(),
            shortname: "productpage".into(),
            namespace: "ns1".into(),
            ..Default::default()
        },
    );
    for (name, ip) in [
        ("www.example.com", "198.18.1.3"),
        ("api.example.com", "198.18.1.4"),
    ] {
        nt.table.insert(
            name.into(),
            NameInfo {
                ips: vec![ip.into()],
                ..Default::default()
            },
        );
    }
    nt
}

/// xorshift64*: deterministic per seed, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

/// A standard query (RD set) for `name`, type `qtype`, class IN.
pub(crate) fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// One malformed packet of a kind chosen by `rng`.
fn malformed(rng: &mut Rng) -> Vec<u8> {
    let id = rng.next() as u16;
    match rng.below(8) {
        // Random bytes of a random length 0..600.
        0 => {
            let n = rng.below(600);
            rng.bytes(n)
        }
        // Truncated header.
        1 => {
            let n = rng.below(12);
            rng.bytes(n)
        }
        // A response (QR=1) sent to the server.
        2 => {
            let mut q = query(id, "productpage.ns1.svc.cluster.local", 1);
            q[2] |= 0x80;
            q
        }
        // Bogus counts: claims many records, carries one question or fewer.
        3 => {
            let mut q = query(id, "www.example.com", 1);
            for b in &mut q[4..12] {
                *b = rng.next() as u8;
            }
            let cut = 12 + rng.below(q.len() - 11);
            q.truncate(cut);
            q
        }
        // Compression loop: the question name points at itself, or two pointers at each other.
        4 => {
            let mut q = id.to_be_bytes().to_vec();
            q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
            if rng.below(2) == 0 {
                q.extend_from_slice(&[0xC0, 12]);
            } else {
                q.extend_from_slice(&[3, b'a', b'b', b'c', 0xC0, 18, 0xC0, 16]);
            }
            q.extend_from_slice(&[0, 1, 0, 1]);
            q
        }
        // A label running past the end, or a name over 255 bytes.
        5 => {
            let mut q = id.to_be_bytes().to_vec();
            q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
            if rng.below(2) == 0 {
                q.push(63);
                q.extend_from_slice(b"short");
            } else {
                for _ in 0..10 {
                    q.push(60);
                    q.extend_from_slice(&[b'x'; 60]);
                }
                q.extend_from_slice(&[0, 0, 1, 0, 1]);
            }
            q
        }
        // Reserved label type bits (0x40/0x80) and a pointer past the end.
        6 => {
            let mut q = id.to_be_bytes().to_vec();
            q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
            if rng.below(2) == 0 {
                q.extend_from_slice(&[0x41, b'a', 0]);
            } else {
                q.extend_from_slice(&[0xC3, 0xFF]);
            }
            q.extend_from_slice(&[0, 1, 0, 1]);
            q
        }
        // A well-formed header with random opcode/flags, random type/class and trailing junk.
        _ => {
            let mut q = query(id, "api.example.com", rng.next() as u16);
            q[2] = rng.next() as u8 & 0x7F;
            q[3] = rng.next() as u8;
            let n = q.len();
            q[n - 2] = rng.next() as u8;
            q[n - 1] = rng.next() as u8;
            let junk = rng.below(64);
            q.extend(rng.bytes(junk));
            q
        }
    }
}

/// The IPv4 addresses in the answer section of `resp`, a reply to query `id`; an error naming
/// what is wrong otherwise.
fn a_answers(resp: &[u8], id: u16) -> Result<Vec<[u8; 4]>, String> {
    if resp.len() < 12 {
        return Err(format!("{} bytes: shorter than a header", resp.len()));
    }
    if u16::from_be_bytes([resp[0], resp[1]]) != id {
        return Err("id mismatch".into());
    }
    if resp[2] & 0x80 == 0 {
        return Err("QR not set".into());
    }
    let rcode = resp[3] & 0x0F;
    if rcode != 0 {
        return Err(format!("rcode {rcode}"));
    }
    let qd = u16::from_be_bytes([resp[4], resp[5]]);
    let an = u16::from_be_bytes([resp[6], resp[7]]);
    let mut pos = 12;
    let skip_name = |mut pos: usize| -> Result<usize, String> {
        loop {
            let len = *resp.get(pos).ok_or("name past the end")? as usize;
            if len == 0 {
                return Ok(pos + 1);
            }
            if len & 0xC0 == 0xC0 {
                return Ok(pos + 2);
            }
            pos += 1 + len;
        }
    };
    for _ in 0..qd {
        pos = skip_name(pos)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        pos = skip_name(pos)?;
        let rr = resp.get(pos..pos + 10).ok_or("record past the end")?;
        let rtype = u16::from_be_bytes([rr[0], rr[1]]);
        let rdlen = u16::from_be_bytes([rr[8], rr[9]]) as usize;
        pos += 10;
        let rdata = resp.get(pos..pos + rdlen).ok_or("rdata past the end")?;
        if rtype == 1 && rdlen == 4 {
            out.push([rdata[0], rdata[1], rdata[2], rdata[3]]);
        }
        pos += rdlen;
    }
    Ok(out)
}

/// Asks `name`/A once with a `timeout`; the addresses answered and the time taken.
fn ask(
    proxy: SocketAddr,
    name: &str,
    id: u16,
    timeout: Duration,
) -> Result<(Vec<[u8; 4]>, Duration), String> {
    let sock = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let start = Instant::now();
    sock.send_to(&query(id, name, 1), proxy)
        .map_err(|e| format!("send: {e}"))?;
    let mut buf = [0u8; 1500];
    loop {
        let left = timeout
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())
            .ok_or("timed out")?;
        sock.set_read_timeout(Some(left))
            .map_err(|e| format!("timeout: {e}"))?;
        match sock.recv_from(&mut buf) {
            Ok((n, from)) if from == proxy => match a_answers(&buf[..n], id) {
                Err(e) if e == "id mismatch" => continue,
                other => return other.map(|a| (a, start.elapsed())),
            },
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err("timed out".into());
            }
            Err(e) => return Err(format!("recv: {e}")),
        }
    }
}

/// A valid A query is answered correctly (up to 3 tries of 1 s, for a backlog still draining);
/// the proxy task is running. Returns the failed tries before the answer.
fn assert_answers(p: &Proxy, when: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for i in 0..3u16 {
        match ask(
            p.addr,
            "productpage.ns1.svc.cluster.local",
            0x4242 + i,
            Duration::from_secs(1),
        ) {
            Ok((answers, _)) => {
                assert_eq!(answers, vec![[198, 18, 1, 1]], "{when}");
                assert!(p.running(), "{when}: the proxy task ended");
                return errors;
            }
            Err(e) => errors.push(e),
        }
    }
    panic!("{when}: valid A query not answered in 3 tries: {errors:?}");
}

#[test]
fn ten_thousand_malformed_packets_then_a_valid_query_is_answered() {
    let p = Proxy::start();
    p.table.update(&table());
    assert!(assert_answers(&p, "before").is_empty());

    let seed = seed();
    println!("malformed packets: seed {seed:#x}");
    const SENDERS: usize = 4;
    const PER_SENDER: usize = 2_500;
    let addr = p.addr;
    let threads: Vec<_> = (0..SENDERS)
        .map(|t| {
            std::thread::spawn(move || {
                let sock = UdpSocket::bind("127.0.0.1:0").expect("bind sender");
                let mut rng = Rng::new(seed.wrapping_add(t as u64 * 0x9E37_79B9));
                let mut sent = 0usize;
                for i in 0..PER_SENDER {
                    // Sent errors (ECONNREFUSED from an earlier ICMP) do not stop the run.
                    if sock.send_to(&malformed(&mut rng), addr).is_ok() {
                        sent += 1;
                    }
                    // Paced a little so most packets reach the proxy instead of overflowing its
                    // socket buffer.
                    if (i + 1).is_multiple_of(50) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                sent
            })
        })
        .collect();
    let sent: usize = threads.into_iter().map(|t| t.join().expect("sender")).sum();
    assert_eq!(sent, SENDERS * PER_SENDER, "every packet was sent");
    let after = assert_answers(&p, "after 10,000 malformed packets");
    assert!(
        after.is_empty(),
        "first try after the malformed packets: {after:?}"
    );
    println!(
        "FIGURE dns malformed: {sent} packets sent from {SENDERS} sockets; proxy counted {} \
         requests; valid A query answered after, proxy task running",
        p.metrics.requests.get()
    );
}

#[test]
fn flood_of_valid_and_invalid_queries_leaves_valid_queries_answered() {
    let seconds: u64 = harness::prereq::setting("DNS_FLOOD_SECONDS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let p = Proxy::start();
    p.table.update(&table());
    assert!(assert_answers(&p, "before").is_empty());

    let seed = seed();
    println!("flood: {seconds} s, seed {seed:#x}");
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    const FLOODERS: usize = 2;
    let addr = p.addr;
    let flooders: Vec<_> = (0..FLOODERS)
        .map(|t| {
            let stop = stop.clone();
            let sent = sent.clone();
            std::thread::spawn(move || {
                let sock = UdpSocket::bind("127.0.0.1:0").expect("bind flooder");
                sock.set_nonblocking(true).expect("nonblocking");
                let mut rng = Rng::new(seed.wrapping_add(t as u64 * 0x9E37_79B9));
                let names = [
                    "productpage.ns1.svc.cluster.local",
                    "productpage",
                    "www.example.com",
                    "missing.example.com",
                ];
                let mut n = 0u64;
                let mut drain = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    let pkt = if rng.below(2) == 0 {
                        query(rng.next() as u16, names[rng.below(names.len())], 1)
                    } else {
                        malformed(&mut rng)
                    };
                    match sock.send_to(&pkt, addr) {
                        Ok(_) => n += 1,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                        Err(_) => {}
                    }
                    // Replies are ignored; drained now and then so our buffer never matters.
                    if n.is_multiple_of(64) {
                        while sock.recv_from(&mut drain).is_ok() {}
                    }
                }
                sent.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();

    // The prober: one valid query every 100 ms, 1 s timeout each.
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut latencies = Vec::new();
    let mut total = 0u32;
    let mut failures: HashMap<String, u32> = HashMap::new();
    let mut tick = start;
    while tick < deadline {
        let now = Instant::now();
        if tick > now {
            std::thread::sleep(tick - now);
        }
        total += 1;
        match ask(
            p.addr,
            "productpage.ns1.svc.cluster.local",
            0x5000 ^ total as u16,
            Duration::from_secs(1),
        ) {
            Ok((answers, took)) if answers == vec![[198, 18, 1, 1]] => latencies.push(took),
            Ok((answers, _)) => *failures.entry(format!("wrong: {answers:?}")).or_default() += 1,
            Err(e) => *failures.entry(e).or_default() += 1,
        }
        tick += Duration::from_millis(100);
        // A probe that timed out pushed us late: skip the missed ticks instead of bursting.
        while tick + Duration::from_millis(100) < Instant::now() {
            tick += Duration::from_millis(100);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().expect("flooder");
    }
    let flood = start.elapsed();
    let sent = sent.load(Ordering::Relaxed);

    let after = assert_answers(&p, "after the flood");
    latencies.sort();
    let answered = latencies.len() as u32;
    let p50 = latencies
        .get(latencies.len() / 2)
        .copied()
        .unwrap_or_default();
    let max = latencies.last().copied().unwrap_or_default();
    println!(
        "FIGURE dns flood: {:.1} s, {FLOODERS} flooders sent {sent} packets ({:.0}/s), proxy \
         counted {} requests ({:.0}% of those sent); probe answered {answered}/{total}, latency p50 {:?} max {:?}; \
         failures {failures:?}; after the flood: {} failed tries before the answer",
        flood.as_secs_f64(),
        sent as f64 / flood.as_secs_f64(),
        p.metrics.requests.get(),
        p.metrics.requests.get() as f64 * 100.0 / sent.max(1) as f64,
        p50,
        max,
        after.len(),
    );
    assert!(sent > 0, "the flood sent nothing");
    assert!(total >= 5, "too few probes: {total}");
    // Flooders blasting without pause outpace the proxy on a 2-core machine (measured: 2
    // flooders offer ~300k packets/s, the proxy takes ~140k/s), so the kernel drops packets at
    // the proxy's full socket buffer, probes included: a probe's chance is about the proxy's
    // share of the offered load (measured 50-71% answered, answered ones in ~1 ms). The bound
    // keeps margin for a loaded CI machine; the proxy must never be starved outright.
    assert!(
        answered * 100 >= total * 20,
        "probe answered {answered}/{total} during the flood: {failures:?}"
    );
}
