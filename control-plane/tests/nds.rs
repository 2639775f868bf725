//! istiod-lite's NDS against Istio's own cases, then our DNS proxy answering from the table it
//! built: pilot/pkg/xds/nds_test.go (the name table a proxy gets from ServiceEntries, with
//! and without auto-allocation) and pkg/dns/client/dns_test.go (what a pod in `ns1` resolves),
//! with their inputs written as config (tests/data/kube/*.yaml).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use control_plane::{Config, MeshSettings, ProxyView, Snapshot, XdsType, generate, parse_file};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::RecordType::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use proto::istio::nds::NameTable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

fn snapshot(yaml: &str, mesh: MeshSettings) -> Snapshot {
    let config = Config::from_objects(parse_file("fixture.yaml", yaml).expect("valid fixture"));
    Snapshot::new(Arc::new(config), Arc::new(mesh), 1)
}

fn proxy(ns: &str, ip: &str, auto_allocate: bool) -> ProxyView {
    ProxyView {
        namespace: ns.into(),
        labels: Default::default(),
        ips: vec![ip.into()],
        dns_capture: true,
        dns_auto_allocate: auto_allocate,
        capture: true,
        grpc: false,
    }
}

fn nds(snap: &Snapshot, view: &ProxyView) -> NameTable {
    let res = generate(snap, view, XdsType::Nds);
    assert_eq!(res.len(), 1, "one NameTable");
    proto::unpack(&res[0].any).expect("a NameTable")
}

/// host → (ips, registry, namespace, shortname), for whole-table comparisons.
type Flat = BTreeMap<String, (Vec<String>, String, String, String)>;

fn flat(nt: &NameTable) -> Flat {
    nt.table
        .iter()
        .map(|(h, i)| {
            (
                h.clone(),
                (
                    i.ips.clone(),
                    i.registry.clone(),
                    i.namespace.clone(),
                    i.shortname.clone(),
                ),
            )
        })
        .collect()
}

fn entry(
    ips: &[&str],
    registry: &str,
    ns: &str,
    short: &str,
) -> (Vec<String>, String, String, String) {
    (
        ips.iter().map(|s| s.to_string()).collect(),
        registry.into(),
        ns.into(),
        short.into(),
    )
}

#[test]
fn istio_nds_cases() {
    let yaml = include_str!("data/kube/nds-se.yaml");
    // istiod's test turns the allocator controller off and checks the deterministic
    // allocation; the proxy asks for it with DNS_AUTO_ALLOCATE or gets none.
    let mesh = MeshSettings {
        ip_autoallocate: false,
        ..Default::default()
    };
    let snap = snapshot(yaml, mesh);
    let ext = |ips: &[&str]| entry(ips, "External", "", "");
    let cases: [(&str, bool, Flat); 2] = [
        (
            "auto allocate",
            true,
            Flat::from([
                ("random-1.host.example".into(), ext(&["240.240.116.21"])),
                ("random-2.host.example".into(), ext(&["9.9.9.9"])),
                ("random-3.host.example".into(), ext(&["240.240.81.100"])),
            ]),
        ),
        (
            "just capture",
            false,
            Flat::from([("random-2.host.example".into(), ext(&["9.9.9.9"]))]),
        ),
    ];
    for (name, auto, want) in cases {
        let got = flat(&nds(&snap, &proxy("default", "1.1.1.1", auto)));
        assert_eq!(got, want, "{name}");
    }
    // Without DNS capture the table is empty.
    let mut view = proxy("default", "1.1.1.1", true);
    view.dns_capture = false;
    assert!(nds(&snap, &view).table.is_empty());
}

#[test]
fn the_dns_test_mesh_gives_istios_table() {
    let snap = snapshot(
        include_str!("data/kube/dns-table.yaml"),
        MeshSettings::default(),
    );
    let got = flat(&nds(&snap, &proxy("ns1", "10.1.0.99", true)));
    let ext = |ips: &[&str]| entry(ips, "External", "", "");
    let want = Flat::from([
        ("www.google.com".into(), ext(&["1.1.1.1"])),
        (
            "productpage.ns1.svc.cluster.local".into(),
            entry(&["9.9.9.9"], "Kubernetes", "ns1", "productpage"),
        ),
        (
            "example.ns2.svc.cluster.local".into(),
            entry(&["10.10.10.10"], "Kubernetes", "ns2", "example"),
        ),
        (
            "db.ns1.svc.cluster.local".into(),
            entry(&["10.1.0.20"], "Kubernetes", "ns1", "db"),
        ),
        (
            "db-0.db.ns1.svc.cluster.local".into(),
            entry(&["10.1.0.20"], "Kubernetes", "ns1", "db-0.db"),
        ),
        (
            "ipv6.localhost".into(),
            ext(&["2001:db8:0:0:0:ff00:42:8329"]),
        ),
        (
            "dual.localhost".into(),
            ext(&["2.2.2.2", "2001:db8:0:0:0:ff00:42:8329"]),
        ),
        ("ipv4.localhost".into(), ext(&["2.2.2.2"])),
        ("*.b.wildcard".into(), ext(&["11.11.11.11"])),
        ("*.wildcard".into(), ext(&["10.10.10.10"])),
        ("*.svc.mesh.company.net".into(), ext(&["10.1.2.3"])),
        ("example.localhost.".into(), ext(&["3.3.3.3"])),
    ]);
    assert_eq!(got, want);
}

/// The upstream's answer: `www.bing.com.` is 1.1.1.1, every other name NXDOMAIN.
fn upstream_answer(raw: &[u8]) -> Option<Vec<u8>> {
    let req = Message::from_vec(raw).ok()?;
    let mut resp = req.clone();
    resp.metadata.message_type = MessageType::Response;
    let name = req.queries.first()?.name().clone();
    if name.to_ascii().eq_ignore_ascii_case("www.bing.com.") {
        resp.add_answer(Record::from_rdata(
            name,
            60,
            RData::A(hickory_proto::rr::rdata::A("1.1.1.1".parse().unwrap())),
        ));
    } else {
        resp.metadata.response_code = ResponseCode::NXDomain;
    }
    resp.to_vec().ok()
}

/// An upstream resolver on UDP and TCP (one port), answering [`upstream_answer`].
async fn upstream(stop: CancellationToken) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let tcp_stop = stop.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = tokio::select! {
                _ = tcp_stop.cancelled() => return,
                r = listener.accept() => r.unwrap(),
            };
            tokio::spawn(async move {
                let mut len = [0u8; 2];
                while s.read_exact(&mut len).await.is_ok() {
                    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
                    if s.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    let Some(out) = upstream_answer(&buf) else {
                        return;
                    };
                    let _ = s.write_all(&(out.len() as u16).to_be_bytes()).await;
                    let _ = s.write_all(&out).await;
                }
            });
        }
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, from) = tokio::select! {
                _ = stop.cancelled() => return,
                r = sock.recv_from(&mut buf) => r.unwrap(),
            };
            if let Some(out) = upstream_answer(&buf[..n]) {
                let _ = sock.send_to(&out, from).await;
            }
        }
    });
    addr
}

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m
}

async fn udp(addr: SocketAddr, q: &Message) -> Message {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&q.to_vec().unwrap(), addr).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_secs(5), sock.recv(&mut buf))
        .await
        .expect("an answer within 5s")
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

async fn tcp(addr: SocketAddr, q: &Message) -> Message {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let b = q.to_vec().unwrap();
    s.write_all(&(b.len() as u16).to_be_bytes()).await.unwrap();
    s.write_all(&b).await.unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.unwrap();
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

/// An answer as `owner TYPE data` lines.
fn records(m: &Message) -> Vec<String> {
    m.answers
        .iter()
        .map(|r| match &r.data {
            RData::A(a) => format!("{} A {}", r.name, a.0),
            RData::AAAA(a) => format!("{} AAAA {}", r.name, a.0),
            RData::CNAME(c) => format!("{} CNAME {}", r.name, c.0),
            other => format!("{} {other}", r.name),
        })
        .collect()
}

const NX: ResponseCode = ResponseCode::NXDomain;
const OK: ResponseCode = ResponseCode::NoError;

/// One of Istio's DNS cases: its name, the question, its type, the rcode and the answer's
/// records.
type DnsCase = (
    &'static str,
    &'static str,
    RecordType,
    ResponseCode,
    &'static [&'static str],
);

/// Istio's DNS cases for a pod in `ns1` (pkg/dns/client/dns_test.go), as its table lists them.
const ISTIO_DNS_CASES: &[DnsCase] = &[
    (
        "non k8s host in local cache",
        "www.google.com.",
        A,
        OK,
        &["www.google.com. A 1.1.1.1"],
    ),
    (
        "non k8s host with search namespace yields cname+A record",
        "www.google.com.ns1.svc.cluster.local.",
        A,
        OK,
        &[
            "www.google.com.ns1.svc.cluster.local. CNAME www.google.com.",
            "www.google.com. A 1.1.1.1",
        ],
    ),
    (
        "non k8s host not in local cache",
        "www.bing.com.",
        A,
        OK,
        &["www.bing.com. A 1.1.1.1"],
    ),
    (
        "k8s host - fqdn",
        "productpage.ns1.svc.cluster.local.",
        A,
        OK,
        &["productpage.ns1.svc.cluster.local. A 9.9.9.9"],
    ),
    (
        "k8s host, fqdn with search namespace[0] (not found)",
        "productpage.ns1.svc.cluster.local.ns1.svc.cluster.local.",
        A,
        NX,
        &[],
    ),
    (
        "k8s host - name.namespace",
        "productpage.ns1.",
        A,
        OK,
        &["productpage.ns1. A 9.9.9.9"],
    ),
    (
        "k8s host - shortname",
        "productpage.",
        A,
        OK,
        &["productpage. A 9.9.9.9"],
    ),
    (
        "k8s host (name.namespace) with search namespace yields cname+A record",
        "productpage.ns1.ns1.svc.cluster.local.",
        A,
        OK,
        &[
            "productpage.ns1.ns1.svc.cluster.local. CNAME productpage.ns1.",
            "productpage.ns1. A 9.9.9.9",
        ],
    ),
    (
        "AAAA query for IPv4 k8s host (name.namespace) with search namespace",
        "productpage.ns1.ns1.svc.cluster.local.",
        AAAA,
        OK,
        &[],
    ),
    (
        "k8s host - non local namespace - name.namespace",
        "example.ns2.",
        A,
        OK,
        &["example.ns2. A 10.10.10.10"],
    ),
    (
        "k8s host - non local namespace - fqdn",
        "example.ns2.svc.cluster.local.",
        A,
        OK,
        &["example.ns2.svc.cluster.local. A 10.10.10.10"],
    ),
    (
        "k8s host - non local namespace - name.namespace.svc",
        "example.ns2.svc.",
        A,
        OK,
        &["example.ns2.svc. A 10.10.10.10"],
    ),
    (
        "k8s host - non local namespace - shortname (NXDOMAIN)",
        "example.",
        A,
        NX,
        &[],
    ),
    (
        "TypeA query returns A records only",
        "dual.localhost.",
        A,
        OK,
        &["dual.localhost. A 2.2.2.2"],
    ),
    (
        "wild card returns A record correctly",
        "foo.wildcard.",
        A,
        OK,
        &["foo.wildcard. A 10.10.10.10"],
    ),
    (
        "specific wild card returns A record correctly",
        "a.b.wildcard.",
        A,
        OK,
        &["a.b.wildcard. A 11.11.11.11"],
    ),
    (
        "wild card with search namespace chained pointer correctly",
        "foo.wildcard.ns1.svc.cluster.local.",
        A,
        OK,
        &[
            "foo.wildcard.ns1.svc.cluster.local. CNAME *.wildcard.",
            "*.wildcard. A 10.10.10.10",
        ],
    ),
    (
        "wild card with domain returns A record correctly",
        "foo.svc.mesh.company.net.",
        A,
        OK,
        &["foo.svc.mesh.company.net. A 10.1.2.3"],
    ),
    (
        "wild card with namespace with domain returns A record correctly",
        "foo.foons.svc.mesh.company.net.",
        A,
        OK,
        &["foo.foons.svc.mesh.company.net. A 10.1.2.3"],
    ),
    (
        "wild card with search domain returns A record correctly",
        "foo.svc.mesh.company.net.ns1.svc.cluster.local.",
        A,
        OK,
        &[
            "foo.svc.mesh.company.net.ns1.svc.cluster.local. CNAME *.svc.mesh.company.net.",
            "*.svc.mesh.company.net. A 10.1.2.3",
        ],
    ),
    (
        "TypeAAAA query returns AAAA records only",
        "dual.localhost.",
        AAAA,
        OK,
        &["dual.localhost. AAAA 2001:db8::ff00:42:8329"],
    ),
    (
        "only AAAA records exist for typeA: empty",
        "ipv6.localhost.",
        A,
        OK,
        &[],
    ),
    (
        "only A records exist for typeAAAA: empty",
        "ipv4.localhost.",
        AAAA,
        OK,
        &[],
    ),
    (
        "hostname with a period",
        "example.localhost.",
        A,
        OK,
        &["example.localhost. A 3.3.3.3"],
    ),
    // Kubernetes names as a pod in ns1 sees them, and a headless Service's pods.
    (
        "own namespace name.namespace.svc",
        "productpage.ns1.svc.",
        A,
        OK,
        &["productpage.ns1.svc. A 9.9.9.9"],
    ),
    (
        "headless: ready pod addresses",
        "db.",
        A,
        OK,
        &["db. A 10.1.0.20"],
    ),
    (
        "headless: a pod's own name",
        "db-0.db.ns1.svc.cluster.local.",
        A,
        OK,
        &["db-0.db.ns1.svc.cluster.local. A 10.1.0.20"],
    ),
    (
        "headless: a pod's short name",
        "db-0.db.",
        A,
        OK,
        &["db-0.db. A 10.1.0.20"],
    ),
    (
        "headless: a not-ready pod has no name",
        "db-1.db.ns1.svc.cluster.local.",
        A,
        NX,
        &[],
    ),
];

#[tokio::test]
async fn istio_dns_cases_through_istiod_lite_nds_and_our_dns_proxy() {
    let snap = snapshot(
        include_str!("data/kube/dns-table.yaml"),
        MeshSettings::default(),
    );
    let table = nds(&snap, &proxy("ns1", "10.1.0.99", true));

    let stop = CancellationToken::new();
    let up = upstream(stop.clone()).await;
    let mut config = dns_proxy::Config::defaults(
        dns_proxy::ResolvConf {
            nameservers: vec![up],
            search: vec![
                "ns1.svc.cluster.local".into(),
                "svc.cluster.local".into(),
                "cluster.local".into(),
            ],
        },
        "/dev/null".into(),
    );
    config.listen_addrs = vec!["127.0.0.1:0".parse().unwrap()];
    config.namespace = "ns1".into();
    config.domain = "ns1.svc.cluster.local".into();
    config.cache_enabled = false;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(dns_proxy::Metrics::new(&mut registry));
    let dns = dns_proxy::DnsProxy::bind(config, metrics)
        .await
        .expect("bind");
    let addr = dns.local_addrs()[0];
    dns.table().update(&table);
    let task = tokio::spawn(dns.run(stop.clone()));

    let cases = ISTIO_DNS_CASES;
    for proto in ["udp", "tcp"] {
        for (name, host, qtype, rcode, want) in cases {
            let q = query(host, *qtype);
            let m = if proto == "udp" {
                udp(addr, &q).await
            } else {
                tcp(addr, &q).await
            };
            assert_eq!(
                m.metadata.response_code, *rcode,
                "{proto} {name}: {host} {qtype}"
            );
            assert_eq!(records(&m), *want, "{proto} {name}: {host} {qtype}");
        }
    }
    stop.cancel();
    let _ = task.await;
}
