//! The DNS proxy against real clients and servers: `dig` queries a proxy running in this process
//! with a name table loaded; a real `dnsmasq` on a loopback port is the upstream.

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dns_proxy::{Config, DnsProxy, Metrics, TableHandle};
use harness::{Child, assert_eventually, require_bin};
use proto::istio::nds::{NameTable, name_table::NameInfo};
use tokio_util::sync::CancellationToken;

/// A proxy on 127.0.0.1:<free port> serving on its own runtime until dropped.
struct Proxy {
    addr: SocketAddr,
    table: TableHandle,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    rt: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// `tune` adjusts the config the agent would build (Istio's defaults, namespace ns1).
    fn start(upstreams: &[SocketAddr], tune: impl FnOnce(&mut Config)) -> Proxy {
        let dir = tempfile::tempdir().expect("tempdir");
        let resolv = dir.path().join("resolv.conf");
        let mut text = String::from(
            "search ns1.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
        );
        for u in upstreams {
            text.push_str(&format!("nameserver {}\n", u.ip()));
        }
        std::fs::write(&resolv, text).expect("write resolv.conf");
        let mut config = Config::from_resolv_conf(&resolv).expect("config");
        config.namespace = "ns1".into();
        config.domain = "ns1.svc.cluster.local".into();
        config.listen_addrs = vec!["127.0.0.1:0".parse().unwrap()];
        // resolv.conf has no ports; the test upstreams listen on loopback ports.
        config.upstreams = upstreams.to_vec();
        tune(&mut config);
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
        rt.spawn(proxy.run(shutdown.clone()));
        Proxy {
            addr,
            table,
            metrics,
            shutdown,
            rt: Some(rt),
            _dir: dir,
        }
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

/// What dig printed, parsed.
#[derive(Debug)]
struct Dig {
    status: String,
    flags: Vec<String>,
    /// (owner, ttl, type, data)
    answers: Vec<(String, u32, String, String)>,
    edns: bool,
    raw: String,
}

impl Dig {
    fn data(&self, rtype: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .answers
            .iter()
            .filter(|a| a.2 == rtype)
            .map(|a| a.3.clone())
            .collect();
        v.sort();
        v
    }
    fn has_flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }
}

fn dig(addr: SocketAddr, args: &[&str]) -> Dig {
    let out = Command::new("dig")
        .arg(format!("@{}", addr.ip()))
        .args(["-p", &addr.port().to_string(), "+time=3", "+tries=1"])
        .args(args)
        .output()
        .expect("run dig");
    let raw = String::from_utf8_lossy(&out.stdout).to_string();
    let status = raw
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("NO ANSWER")
        .to_string();
    let flags = raw
        .split(";; flags: ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let mut answers = Vec::new();
    let mut in_answer = false;
    for line in raw.lines() {
        if line.starts_with(";; ANSWER SECTION") {
            in_answer = true;
            continue;
        }
        if in_answer {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 5 {
                in_answer = false;
                continue;
            }
            answers.push((
                parts[0].to_string(),
                parts[1].parse().unwrap_or(u32::MAX),
                parts[3].to_string(),
                parts[4..].join(" "),
            ));
        }
    }
    let edns = raw.contains("OPT PSEUDOSECTION");
    Dig {
        status,
        flags,
        answers,
        edns,
        raw,
    }
}

fn k8s(ips: &[&str], short: &str, ns: &str) -> NameInfo {
    NameInfo {
        ips: ips.iter().map(|s| s.to_string()).collect(),
        registry: "Kubernetes".into(),
        shortname: short.into(),
        namespace: ns.into(),
        ..Default::default()
    }
}

fn plain(ips: &[&str]) -> NameInfo {
    NameInfo {
        ips: ips.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn table() -> NameTable {
    let mut nt = NameTable::default();
    nt.table.insert(
        "productpage.ns1.svc.cluster.local".into(),
        k8s(&["198.18.1.1"], "productpage", "ns1"),
    );
    nt.table.insert(
        "reviews.ns2.svc.cluster.local".into(),
        k8s(&["198.18.1.2", "fd00::1:2"], "reviews", "ns2"),
    );
    nt.table
        .insert("www.example.com".into(), plain(&["198.18.1.3"]));
    nt.table
        .insert("*.wild.example.com".into(), plain(&["198.18.1.4"]));
    nt.table
        .insert("v6.example.com".into(), plain(&["fd00::1:5"]));
    let many: Vec<String> = (0..60).map(|i| format!("198.18.2.{i}")).collect();
    nt.table.insert(
        "many.example.com".into(),
        plain(&many.iter().map(String::as_str).collect::<Vec<_>>()),
    );
    nt
}

fn free_port() -> u16 {
    // A port free for UDP and TCP at the time of asking.
    loop {
        let u = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
        let port = u.local_addr().expect("addr").port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// dnsmasq on 127.0.0.1:<port> serving a few names, NXDOMAIN for the rest of upstream.test.
fn dnsmasq() -> (Child, SocketAddr) {
    dnsmasq_at(free_port(), 300)
}

/// [`dnsmasq`] on `port`, its answers' TTL `ttl`.
fn dnsmasq_at(port: u16, ttl: u32) -> (Child, SocketAddr) {
    let mut cmd = Command::new("dnsmasq");
    cmd.args([
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--conf-file=/dev/null",
        "--pid-file=",
        "--bind-interfaces",
        "--listen-address=127.0.0.1",
        "--user=root",
        "--local=/upstream.test/",
        "--log-facility=-",
        "--log-queries",
        "--host-record=web.upstream.test,198.18.3.1",
        "--host-record=api.upstream.test,198.18.3.2",
        "--txt-record=www.example.com,from-upstream",
    ]);
    cmd.arg(format!("--port={port}"));
    cmd.arg(format!("--local-ttl={ttl}"));
    let child = Child::spawn("dnsmasq", cmd);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    assert_eventually(Duration::from_secs(10), || {
        let d = dig(addr, &["web.upstream.test"]);
        (d.status == "NOERROR").then_some(()).ok_or(d.raw)
    });
    (child, addr)
}

fn prereqs() -> bool {
    require_bin("dig") && require_bin("dnsmasq")
}

#[test]
fn table_answers_a_aaaa_short_forms_cname_wildcard() {
    if !prereqs() {
        return;
    }
    let p = Proxy::start(&[], |_| {});
    // Before the first table: SERVFAIL.
    assert_eq!(
        dig(p.addr, &["productpage.ns1.svc.cluster.local"]).status,
        "SERVFAIL"
    );
    p.table.update(&table());
    assert!(p.table.is_synced());

    for name in [
        "productpage.ns1.svc.cluster.local",
        "productpage.ns1",
        "productpage",
        "productpage.ns1.svc",
        "PRODUCTPAGE.ns1.svc.cluster.local",
    ] {
        let d = dig(p.addr, &[name]);
        assert_eq!(d.status, "NOERROR", "{name}: {}", d.raw);
        assert!(d.has_flag("aa"), "{name}: authoritative: {}", d.raw);
        assert_eq!(d.data("A"), vec!["198.18.1.1"], "{name}: {}", d.raw);
        assert_eq!(d.answers[0].1, 30, "TTL 30: {}", d.raw);
    }
    // Other namespace: namespace forms only.
    assert_eq!(dig(p.addr, &["reviews.ns2"]).data("A"), vec!["198.18.1.2"]);
    assert_eq!(
        dig(p.addr, &["reviews.ns2", "AAAA"]).data("AAAA"),
        vec!["fd00::1:2"]
    );
    // A v4-only host asked for AAAA (and v6-only for A): NOERROR, no answer.
    for (name, qtype) in [("productpage", "AAAA"), ("v6.example.com", "A")] {
        let d = dig(p.addr, &[name, qtype]);
        assert_eq!(d.status, "NOERROR", "{}", d.raw);
        assert!(d.answers.is_empty(), "{}", d.raw);
    }
    // Search-domain expansion: CNAME to the host, then its address.
    let d = dig(p.addr, &["www.example.com.ns1.svc.cluster.local"]);
    assert_eq!(d.data("CNAME"), vec!["www.example.com."], "{}", d.raw);
    assert_eq!(d.data("A"), vec!["198.18.1.3"], "{}", d.raw);
    assert_eq!(d.answers[0].2, "CNAME", "CNAME first: {}", d.raw);
    // Wildcard: answered with the question as owner.
    let d = dig(p.addr, &["api.wild.example.com"]);
    assert_eq!(d.data("A"), vec!["198.18.1.4"], "{}", d.raw);
    assert_eq!(d.answers[0].0, "api.wild.example.com.");
    // TCP.
    let d = dig(p.addr, &["+tcp", "productpage"]);
    assert_eq!(d.data("A"), vec!["198.18.1.1"], "{}", d.raw);
    // The table is replaced atomically.
    let mut nt = NameTable::default();
    nt.table
        .insert("new.example.com".into(), plain(&["198.18.1.9"]));
    p.table.update(&nt);
    assert_eq!(
        dig(p.addr, &["new.example.com"]).data("A"),
        vec!["198.18.1.9"]
    );
    assert!(p.metrics.requests.get() >= 14);
}

#[test]
fn edns_sizes_and_truncation_with_60_addresses() {
    if !prereqs() {
        return;
    }
    let p = Proxy::start(&[], |_| {});
    p.table.update(&table());
    let all: Vec<String> = {
        let mut v: Vec<String> = (0..60).map(|i| format!("198.18.2.{i}")).collect();
        v.sort();
        v
    };
    // No EDNS: cut to 512 bytes with TC (+ignore keeps dig from retrying over TCP).
    let d = dig(p.addr, &["+noedns", "+ignore", "many.example.com"]);
    assert!(d.has_flag("tc"), "{}", d.raw);
    assert!(!d.edns, "no OPT for a non-EDNS client: {}", d.raw);
    assert!(!d.answers.is_empty() && d.answers.len() < 60, "{}", d.raw);
    // dig without +ignore retries over TCP and gets everything.
    let d = dig(p.addr, &["+noedns", "many.example.com"]);
    assert_eq!(d.data("A"), all, "{}", d.raw);
    // Small EDNS buffer: cut with TC, OPT kept.
    let d = dig(p.addr, &["+bufsize=700", "+ignore", "many.example.com"]);
    assert!(d.has_flag("tc") && d.edns, "{}", d.raw);
    assert!(d.answers.len() < 60);
    // Large EDNS buffer: everything over UDP.
    let d = dig(p.addr, &["+bufsize=4096", "+ignore", "many.example.com"]);
    assert!(!d.has_flag("tc"), "{}", d.raw);
    assert_eq!(d.data("A"), all);
    // TCP: everything.
    let d = dig(p.addr, &["+tcp", "+noedns", "many.example.com"]);
    assert!(!d.has_flag("tc"));
    assert_eq!(d.data("A"), all);
    // Shuffled.
    let orders: std::collections::HashSet<Vec<String>> = (0..4)
        .map(|_| {
            dig(p.addr, &["+tcp", "many.example.com"])
                .answers
                .iter()
                .map(|a| a.3.clone())
                .collect()
        })
        .collect();
    assert!(orders.len() > 1, "answers are shuffled");
}

#[test]
fn forwards_to_dnsmasq_and_passes_nxdomain_through() {
    if !prereqs() {
        return;
    }
    let (_dnsmasq, up) = dnsmasq();
    let p = Proxy::start(&[up], |c| c.cache_enabled = false);
    p.table.update(&table());
    for tcp in [false, true] {
        let proto = if tcp { "+tcp" } else { "+notcp" };
        let d = dig(p.addr, &[proto, "web.upstream.test"]);
        assert_eq!(d.status, "NOERROR", "{}", d.raw);
        assert_eq!(d.data("A"), vec!["198.18.3.1"], "{}", d.raw);
        let d = dig(p.addr, &[proto, "missing.upstream.test"]);
        assert_eq!(d.status, "NXDOMAIN", "{}", d.raw);
    }
    // A known host asked for another type goes upstream.
    let d = dig(p.addr, &["www.example.com", "TXT"]);
    assert_eq!(d.data("TXT"), vec!["\"from-upstream\""], "{}", d.raw);
    assert_eq!(p.metrics.upstream_requests.get(), 5);
    assert_eq!(p.metrics.upstream_failures.get(), 0);
}

#[test]
fn upstream_down_servfail_second_upstream_and_cache() {
    if !prereqs() {
        return;
    }
    let (dnsmasq, up) = dnsmasq();
    // A first upstream that never answers.
    let black_hole = UdpSocket::bind("127.0.0.1:0").expect("bind black hole");
    black_hole.set_nonblocking(true).expect("nonblocking");
    let dead = black_hole.local_addr().expect("addr");
    let p = Proxy::start(&[dead, up], |c| {
        c.forward_timeout = Duration::from_millis(400)
    });
    p.table.update(&table());

    // Servers are tried in shuffled order: keep asking until one query went to the dead one
    // first; every query is still answered, by dnsmasq.
    let mut buf = [0u8; 512];
    let mut hit_dead = false;
    for i in 0..20 {
        // Distinct NXDOMAIN names (no SOA: never cached) so every query goes upstream.
        let name = if i % 2 == 0 {
            "web.upstream.test"
        } else {
            "api.upstream.test"
        };
        let d = dig(p.addr, &["+notcp", "+ignore", &format!("n{i}.{name}")]);
        assert_eq!(d.status, "NXDOMAIN", "{}", d.raw);
        if black_hole.recv_from(&mut buf).is_ok() {
            hit_dead = true;
            break;
        }
    }
    assert!(hit_dead, "the dead upstream was never tried first");

    // Cached (positive) answer, then upstream gone: still answered from the cache.
    let d = dig(p.addr, &["web.upstream.test"]);
    assert_eq!(d.data("A"), vec!["198.18.3.1"]);
    drop(dnsmasq);
    let d = dig(p.addr, &["web.upstream.test"]);
    assert_eq!(
        d.data("A"),
        vec!["198.18.3.1"],
        "served from cache: {}",
        d.raw
    );
    assert!(d.answers[0].1 <= 300);
    assert!(p.metrics.cache_hits.get() >= 1);

    // Not cached and every upstream down: SERVFAIL after the per-server timeouts.
    let start = Instant::now();
    let d = dig(p.addr, &["api.upstream.test"]);
    assert_eq!(d.status, "SERVFAIL", "{}", d.raw);
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    assert!(p.metrics.upstream_failures.get() >= 1);
}

/// RFC 8767 against a real upstream: dnsmasq (TTL 1 s) killed, the expired name is still
/// answered, from the cache with the stale TTL (the first query after one forward timeout,
/// the next at once); dnsmasq back on its port, fresh answers (TTL 1 s) resume once the stale
/// TTL has passed.
#[test]
fn serve_stale_with_the_upstream_killed_and_back() {
    if !prereqs() {
        return;
    }
    let (dnsmasq, up) = dnsmasq_at(free_port(), 1);
    let p = Proxy::start(&[up], |c| {
        c.forward_timeout = Duration::from_millis(300);
        c.serve_stale = Some(dns_proxy::StalePolicy {
            max_stale: Duration::from_secs(3600),
            stale_ttl: Duration::from_secs(2),
            ..dns_proxy::StalePolicy::default()
        });
    });
    p.table.update(&table());
    let d = dig(p.addr, &["web.upstream.test"]);
    assert_eq!(d.data("A"), vec!["198.18.3.1"], "{}", d.raw);
    drop(dnsmasq);
    std::thread::sleep(Duration::from_millis(1200));
    let d = dig(p.addr, &["web.upstream.test"]);
    assert_eq!(d.status, "NOERROR", "{}", d.raw);
    assert_eq!(d.data("A"), vec!["198.18.3.1"], "{}", d.raw);
    assert_eq!(d.answers[0].1, 2, "the stale TTL: {}", d.raw);
    let asked = p.metrics.upstream_requests.get();
    let d = dig(p.addr, &["web.upstream.test"]);
    assert_eq!(d.data("A"), vec!["198.18.3.1"], "{}", d.raw);
    assert_eq!(
        p.metrics.upstream_requests.get(),
        asked,
        "answered without asking upstream"
    );
    assert_eq!(p.metrics.stale_answers.get(), 2);
    // The figure (printed, not asserted: timing belongs to benchmarks): a cached name's stale
    // answer, round trip from a client socket, with the upstream dead.
    let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut took = Vec::new();
    let mut buf = [0u8; 512];
    for id in 0..50u16 {
        let start = Instant::now();
        client
            .send_to(&crate::dns_flood::query(id, "web.upstream.test", 1), p.addr)
            .expect("send");
        let (n, _) = client.recv_from(&mut buf).expect("stale answer");
        took.push(start.elapsed());
        assert_eq!(&buf[..2], &id.to_be_bytes(), "answer to query {id}");
        assert_eq!(buf[3] & 0x0f, 0, "NOERROR");
        assert!(n > 12 && buf[7] >= 1, "with its answer");
    }
    took.sort();
    eprintln!(
        "FIGURE serve_stale: upstream dead, 50 stale answers: median {:?}, max {:?}",
        took[25], took[49]
    );
    assert_eq!(
        p.metrics.upstream_requests.get(),
        asked,
        "none of them asked upstream"
    );
    let _dnsmasq = dnsmasq_at(up.port(), 1);
    std::thread::sleep(Duration::from_millis(2100));
    assert_eventually(Duration::from_secs(5), || {
        let d = dig(p.addr, &["web.upstream.test"]);
        match d.answers.first() {
            Some(a) if a.1 <= 1 && d.data("A") == ["198.18.3.1"] => Ok(()),
            _ => Err(format!("not a fresh answer yet: {}", d.raw)),
        }
    });
}

/// In a pod namespace with `istio-iptables --redirect-dns`: an app (uid 1000) asking the
/// resolv.conf nameserver reaches the proxy and gets the table's answer; the proxy's own upstream
/// queries are not captured (they reach dnsmasq at the nameserver address instead of looping).
///
/// The proxy runs in this process on a thread that entered the namespace and switched, for
/// itself only (raw `setresgid`, not glibc's process-wide wrapper), to gid 1337: every socket it
/// creates carries the proxy group the capture rules exempt, as the agent's would.
#[test]
fn captured_in_a_pod_namespace_with_redirect_dns() {
    if !(harness::require_root() && prereqs()) {
        return;
    }
    let pod = harness::Netns::new("dns-pod");
    let peer = harness::Netns::new("dns-peer");
    harness::veth(&peer, "198.18.5.1/24", &pod, "198.18.5.2/24");
    pod.add_lo_addr("198.18.0.53/32");
    pod.set_resolv_conf("nameserver 198.18.0.53\nsearch ns1.svc.cluster.local svc.cluster.local\n");
    // The upstream, at the nameserver address, inside the pod namespace.
    let mut up = pod.cmd("dnsmasq");
    up.args([
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--conf-file=/dev/null",
        "--pid-file=",
        "--bind-interfaces",
        "--listen-address=198.18.0.53",
        "--port=53",
        "--user=root",
        "--local=/upstream.test/",
        "--host-record=web.upstream.test,198.18.3.1",
    ]);
    let _dnsmasq = Child::spawn("dnsmasq-pod", up);

    // The proxy: own thread, in the namespace, gid 1337.
    let (tx, rx) = std::sync::mpsc::channel();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let ns_path = std::path::PathBuf::from("/run/netns").join(pod.name());
    let resolv_dir = tempfile::tempdir().expect("tempdir");
    let resolv = resolv_dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 198.18.0.53\nsearch ns1.svc.cluster.local\n",
    )
    .expect("resolv.conf");
    let proxy_thread = std::thread::spawn(move || {
        let fd = std::fs::File::open(&ns_path).expect("open netns");
        nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        #[allow(unsafe_code)] // setresgid(2) for this thread only (libc's wrapper sets all threads)
        // SAFETY: a raw syscall changing only this thread's credentials; no memory involved.
        let rc = unsafe { libc::syscall(libc::SYS_setresgid, 1337, 1337, 1337) };
        assert_eq!(rc, 0, "setresgid: {}", std::io::Error::last_os_error());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut config = Config::from_resolv_conf(&resolv).expect("config");
            config.namespace = "ns1".into();
            config.domain = "ns1.svc.cluster.local".into();
            assert_eq!(
                config.upstreams,
                vec!["198.18.0.53:53".parse::<SocketAddr>().unwrap()]
            );
            let mut registry = prometheus_client::registry::Registry::default();
            let metrics = Arc::new(Metrics::new(&mut registry));
            let proxy = DnsProxy::bind(config, metrics)
                .await
                .expect("bind 127.0.0.1:15053");
            proxy.table().update(&table());
            tx.send(proxy.local_addrs()).expect("send addrs");
            proxy.run(stop).await.expect("run");
        });
    });
    let addrs = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("proxy bound");
    assert_eq!(
        addrs,
        vec!["127.0.0.1:15053".parse::<SocketAddr>().unwrap()]
    );

    let out = pod
        .cmd(harness::workspace_bin("istio-iptables"))
        .args([
            "-p", "15001", "-z", "15006", "-u", "1337", "-g", "1337", "-m", "REDIRECT",
        ])
        .args(["-i", "*", "-b", "*", "--redirect-dns"])
        .output()
        .expect("run istio-iptables");
    assert!(
        out.status.success(),
        "istio-iptables: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let app_dig = |args: &[&str]| {
        let out = pod
            .cmd_as(1000, 1000, "dig")
            .args(["@198.18.0.53", "+time=3", "+tries=1"])
            .args(args)
            .output()
            .expect("dig as uid 1000");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // Table answers for the app, over UDP and TCP: captured.
    for proto in ["+notcp", "+tcp"] {
        let out = app_dig(&[proto, "productpage.ns1.svc.cluster.local"]);
        assert!(
            out.contains("198.18.1.1") && out.contains("status: NOERROR"),
            "{proto}: {out}"
        );
        let out = app_dig(&[proto, "productpage"]);
        assert!(out.contains("198.18.1.1"), "{proto}: {out}");
    }
    // Forwarded: the proxy's upstream query leaves uncaptured and dnsmasq answers (polled:
    // dnsmasq may still be starting).
    assert_eventually(Duration::from_secs(15), || {
        let out = app_dig(&["web.upstream.test"]);
        (out.contains("198.18.3.1") && out.contains("status: NOERROR"))
            .then_some(())
            .ok_or(out)
    });
    let out = app_dig(&["gone.upstream.test"]);
    assert!(out.contains("status: NXDOMAIN"), "{out}");

    shutdown.cancel();
    proxy_thread.join().expect("proxy thread");
}
