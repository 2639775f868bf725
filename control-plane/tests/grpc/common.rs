//! What the reconnect-burst tests and the ADS load bench (`benches/ads_load.rs`, which includes
//! this file with `#[path]`) share: a real `istiod-lite serve` process on loopback and the node
//! ids of the simulated proxies.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use proto::envoy::config::core::v3::Node;

/// A running `istiod-lite serve`, killed and reaped on drop.
pub struct Istiod {
    pub child: Child,
    /// Its plaintext gRPC (ADS) address.
    pub grpc: SocketAddr,
}

impl Istiod {
    /// Starts it on 127.0.0.1 with port 0 listeners, `config` and `ca` directories and
    /// `RUST_LOG=rust_log`, and waits for its gRPC address. Its WARN and ERROR lines (and its
    /// monitoring address) go to stderr.
    pub fn start(config: &Path, ca: &Path, rust_log: &str) -> Istiod {
        let mut child = Command::new(env!("CARGO_BIN_EXE_istiod-lite"))
            .arg("serve")
            .arg("--config-dir")
            .arg(config)
            .arg("--ca-dir")
            .arg(ca)
            .args([
                "--grpc-addr",
                "127.0.0.1:0",
                "--secure-grpc-addr",
                "127.0.0.1:0",
                "--monitoring-addr",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", rust_log)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn istiod-lite");
        let stderr = child.stderr.take().expect("stderr");
        // Owned before the wait, so a timeout still kills the process.
        let mut server = Istiod {
            child,
            grpc: ([127, 0, 0, 1], 0).into(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening name=grpc addr=").nth(1) {
                    let _ = tx.send(rest.trim().to_string());
                } else if line.contains("listening name=monitoring")
                    || line.contains("WARN")
                    || line.contains("ERROR")
                {
                    eprintln!("[istiod-lite] {line}");
                }
            }
        });
        server.grpc = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("istiod-lite printed its grpc address")
            .parse()
            .expect("address");
        server
    }
}

impl Drop for Istiod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Simulated proxy `i`'s node: a sidecar `pod-<i>.web` with its own 198.18.x.y address.
pub fn node(i: usize) -> Node {
    Node {
        id: format!(
            "sidecar~198.18.{}.{}~pod-{i}.web~web.svc.cluster.local",
            100 + i / 250,
            i % 250
        ),
        ..Default::default()
    }
}

/// Simulated proxy `i`'s source address: its own loopback address (127.10.x.y), as each pod has
/// its own IP, so istiod-lite's connection cap per peer address (1,024) applies to a fleet as
/// it does in a cluster.
pub fn source(i: usize) -> std::net::IpAddr {
    let i = u16::try_from(i).expect("at most 65,536 proxies");
    let [hi, lo] = i.to_be_bytes();
    std::net::Ipv4Addr::new(127, 10, hi, lo).into()
}
