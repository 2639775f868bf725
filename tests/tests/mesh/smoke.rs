//! Proves the harness: real Envoy in a fresh namespace, and TCP between two namespaces.

use harness::{Envoy, Netns, assert_eventually, envoy_bin, require_root, veth};
use std::io::{Read, Write};
use std::time::Duration;

const ENVOY_MIN: &str = r#"
node: { id: smoke, cluster: smoke }
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: 0 } }
"#;

#[test]
fn envoy_runs_in_a_namespace_and_serves_admin() {
    if !require_root() {
        return;
    }
    let Some(envoy) = envoy_bin() else { return };
    let ns = Netns::new("smoke-envoy");
    let e = Envoy::start(&envoy, Some(&ns), ENVOY_MIN);
    e.wait_ready(Duration::from_secs(20));
    let (status, body) = e.admin_get("/server_info").expect("server_info");
    assert_eq!(status, 200, "{body}");
    let info: serde_json::Value = serde_json::from_str(&body).expect("server_info is JSON");
    assert_eq!(info["state"], "LIVE", "{body}");
    assert!(
        info["version"].as_str().unwrap_or("").contains("1.40."),
        "unexpected Envoy version: {}",
        info["version"]
    );
    assert_eq!(info["command_line_options"]["service_node"], "");
    // The admin port is only reachable inside the namespace, not from the host.
    assert!(harness::http_get(e.admin(), "/server_info").is_err());
}

#[test]
fn tcp_passes_between_two_namespaces_over_veth() {
    if !require_root() {
        return;
    }
    let a = Netns::new("smoke-a");
    let b = Netns::new("smoke-b");
    veth(
        &a,
        "198.18.10.1/24,fd00:10::1/64",
        &b,
        "198.18.10.2/24,fd00:10::2/64",
    );
    for target in ["198.18.10.2:9000", "[fd00:10::2]:9000"] {
        let listener = b.run(move || std::net::TcpListener::bind(target).expect("bind in b"));
        let server = std::thread::spawn(move || {
            let (mut s, peer) = listener.accept().expect("accept");
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).expect("read");
            s.write_all(&buf).expect("echo");
            peer
        });
        let echoed = a.run(move || {
            let mut s = assert_eventually(Duration::from_secs(5), || {
                std::net::TcpStream::connect(target).map_err(|e| e.to_string())
            });
            s.write_all(b"hello").unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            buf
        });
        assert_eq!(&echoed, b"hello");
        let peer = server.join().unwrap();
        assert!(
            peer.ip().to_string() == "198.18.10.1" || peer.ip().to_string() == "fd00:10::1",
            "peer {peer}"
        );
    }
}
