//! The suite's world, the same for the recording and the test: a node namespace running
//! `istiod-lite` with the suite's `config.yaml` and `dnsmasq` with `upstream.conf` (the cluster
//! DNS at the node's address), and a pod namespace injected as Istio's webhook and kubelet
//! would (capture rules, token, root certificate, Envoy) whose resolv.conf names that upstream
//! with the pod's search list and `ndots:5`. The agent in the pod is ours or Istio's; queries go
//! to its DNS proxy on 127.0.0.1:15053 from inside the pod.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use harness::mesh::{self, Mesh, NAMESPACE, PROXY_UID, Pod};
use harness::{Child, assert_eventually, require_bin};

use super::Case;

/// How long one query waits for its answer: longer than both agents' forward timeout (5 s),
/// which the `closed.test` cases wait out.
const ANSWER_WAIT: Duration = Duration::from_secs(8);
/// The name polled until the NDS table is in: a host of the last ServiceEntries in config.yaml.
const SENTINEL: &str = "shared.example.com";

pub fn prerequisites() -> bool {
    mesh::prerequisites(&["dnsmasq"]) && require_bin("dig")
}

pub struct World {
    // Drop order: the pod (agent, Envoy) before the upstream and the node.
    pod: Pod,
    _dnsmasq: Child,
    _mesh: Mesh,
}

impl World {
    /// Starts the world with `agent` (Istio's `pilot-agent`) or, when `None`, ours; returns once
    /// its DNS proxy answers from the NDS table.
    pub fn start(data: &Path, agent: Option<&Path>) -> World {
        let config = std::fs::read_to_string(data.join("config.yaml")).expect("config.yaml");
        let mut mesh = Mesh::new(&config);
        mesh.start_istiod();
        let mut pod = mesh.pod("dnsdiff", "default");
        pod.ns.set_resolv_conf(&format!(
            "nameserver {}\nsearch {NAMESPACE}.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
            pod.node_ip
        ));
        let dnsmasq = upstream(&mesh, &pod.node_ip, &data.join("upstream.conf"));
        match agent {
            None => mesh.inject(&mut pod),
            Some(istio) => {
                // Istio's agent renders Envoy's bootstrap from its template at the path its
                // image has (relative to the working directory, as in the container): the
                // template of the release module in Go's module cache.
                let template = harness::istio_release::bootstrap_template()
                    .expect("Istio's release module (its bootstrap template)");
                let dst = pod
                    .dir
                    .join("var/lib/istio/envoy/envoy_bootstrap_tmpl.json");
                std::fs::create_dir_all(dst.parent().expect("parent")).expect("mkdir");
                std::fs::copy(&template, &dst)
                    .unwrap_or_else(|e| panic!("copy {}: {e}", template.display()));
                let bin = mesh.bin("istio-pilot-agent");
                std::fs::copy(istio, &bin).expect("copy Istio's pilot-agent");
                harness::netns::sh(Command::new("chmod").arg("0755").arg(&bin));
                mesh.inject_agent(&mut pod, &bin, (PROXY_UID, PROXY_UID), &[]);
            }
        }
        mesh.wait_ready(&pod, Duration::from_secs(90));
        let world = World {
            pod,
            _dnsmasq: dnsmasq,
            _mesh: mesh,
        };
        // The NDS table arrives after Envoy's first LDS request: wait for a table name.
        assert_eventually(Duration::from_secs(60), || {
            let out = world
                .pod
                .ns
                .cmd("dig")
                .args(["+short", "+time=1", "+tries=1", "-p", "15053", "@127.0.0.1"])
                .arg(SENTINEL)
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text.contains("198.19.43.1") {
                Ok(())
            } else {
                Err(format!("{SENTINEL} from the DNS proxy: {text:?}"))
            }
        });
        world
    }

    /// Sends every case's packet to the DNS proxy, one after another (UDP on one socket, TCP a
    /// connection each); returns each answer, `None` when none came within [`ANSWER_WAIT`].
    pub fn ask(&self, cases: &[Case]) -> Vec<Option<Vec<u8>>> {
        let queries: Vec<(bool, Vec<u8>)> =
            cases.iter().map(|c| (c.tcp, c.query.clone())).collect();
        let started = Instant::now();
        let answers = self.pod.ns.run(move || {
            let proxy: SocketAddr = "127.0.0.1:15053".parse().expect("addr");
            let udp = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
            udp.connect(proxy).expect("connect udp");
            udp.set_read_timeout(Some(ANSWER_WAIT)).expect("timeout");
            queries
                .iter()
                .map(|(tcp, q)| {
                    if *tcp {
                        ask_tcp(proxy, q)
                    } else {
                        ask_udp(&udp, q)
                    }
                })
                .collect::<Vec<_>>()
        });
        eprintln!(
            "{} queries answered in {:?} ({} without an answer)",
            answers.len(),
            started.elapsed(),
            answers.iter().filter(|a| a.is_none()).count()
        );
        answers
    }
}

/// dnsmasq at `ip:53` in the node namespace, with nothing but `conf`'s records.
fn upstream(mesh: &Mesh, ip: &str, conf: &Path) -> Child {
    let mut cmd = mesh.node.cmd("dnsmasq");
    cmd.args([
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        "--user=root",
        "--pid-file",
        "--log-facility=-",
    ])
    .arg(format!("--listen-address={ip}"))
    .arg(format!("--conf-file={}", conf.display()));
    let child = Child::spawn("upstream-dns", cmd);
    let node = &mesh.node;
    assert_eventually(Duration::from_secs(10), || {
        let out = node
            .cmd("dig")
            .args(["+short", "+time=1", "+tries=1", &format!("@{ip}")])
            .arg("up-1.upstream.test")
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.trim() == "198.18.100.1" {
            Ok(())
        } else {
            Err(format!("upstream dnsmasq: {text:?}"))
        }
    });
    child
}

fn ask_udp(udp: &UdpSocket, q: &[u8]) -> Option<Vec<u8>> {
    udp.send(q).expect("send udp");
    let mut buf = vec![0u8; 65_536];
    let deadline = Instant::now() + ANSWER_WAIT;
    loop {
        match udp.recv(&mut buf) {
            // A late answer to an earlier query (its id differs) is skipped.
            Ok(n) if n >= 2 && q.len() >= 2 && buf[..2] != q[..2] => {}
            Ok(n) => return Some(buf[..n].to_vec()),
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
    }
}

fn ask_tcp(proxy: SocketAddr, q: &[u8]) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&proxy, ANSWER_WAIT).ok()?;
    s.set_read_timeout(Some(ANSWER_WAIT)).ok()?;
    let len = u16::try_from(q.len()).expect("query under 64 KiB");
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(q);
    s.write_all(&framed).ok()?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut body).ok()?;
    Some(body)
}
