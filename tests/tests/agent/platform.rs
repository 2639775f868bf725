//! The cloud platform end to end: `pilot-agent` with `CLOUD_PLATFORM=aws` and
//! `CLOUD_PLATFORM_AWS_METADATA_HOST` pointing at a stand-in for AWS's instance metadata
//! service on loopback (IMDSv2: a token first, every read with it) writes Envoy's bootstrap with
//! AWS's locality and `PLATFORM_METADATA`: `pilot-agent bootstrap`, and `pilot-agent proxy`
//! (the bootstrap a stand-in Envoy is started with, written once the platform search the agent
//! started at its start has ended). No real metadata server is asked.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Child, local::free_port, workspace_bin};
use serde_json::{Value, json};

const TOKEN: &str = "e2e-imds-token";

/// A stand-in for AWS's IMDS on 127.0.0.1: the token on `PUT /latest/api/token` (with its TTL
/// header), the instance's placement and id on `GET /latest/meta-data/...` with that token,
/// 401 without it. Returns its address and the request lines it saw.
fn imds() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || serve(stream, &log));
        }
    });
    (addr, seen)
}

/// One connection: requests until the peer closes it.
fn serve(stream: TcpStream, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let request = head.first().cloned().unwrap_or_default();
        seen.lock().expect("lock").push(request.clone());
        let has = |h: &str| head.iter().any(|l| l.to_ascii_lowercase() == h);
        let (status, body) = match request.split_whitespace().take(2).collect::<Vec<_>>()[..] {
            ["PUT", "/latest/api/token"] if has("x-aws-ec2-metadata-token-ttl-seconds: 60") => {
                ("200 OK", TOKEN)
            }
            ["GET", path] if has(&format!("x-aws-ec2-metadata-token: {TOKEN}")) => {
                match path.strip_prefix("/latest/meta-data/").unwrap_or("") {
                    "placement/region" => ("200 OK", "eu-west-1"),
                    "placement/availability-zone" => ("200 OK", "eu-west-1a"),
                    "instance-id" => ("200 OK", "i-0e2e0e2e0e2e0e2e0"),
                    _ => ("404 Not Found", ""),
                }
            }
            ["GET", _] => ("401 Unauthorized", ""),
            _ => ("400 Bad Request", ""),
        };
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if reader.get_mut().write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// The agent's environment in `dir`: a pod without Kubernetes, AWS named, its IMDS at `imds`,
/// every port the agent takes moved to a free one, `binary_path` as Envoy.
fn agent_command(dir: &Path, imds: SocketAddr, binary_path: &Path) -> Command {
    let mut cmd = Command::new(workspace_bin("pilot-agent"));
    cmd.current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("POD_NAME", "p")
        .env("POD_NAMESPACE", "demo")
        .env("INSTANCE_IP", "127.0.0.1")
        .env("CA_ADDR", "127.0.0.1:1")
        .env("CLOUD_PLATFORM", "aws")
        .env("CLOUD_PLATFORM_AWS_METADATA_HOST", imds.to_string())
        .env(
            "PROXY_CONFIG",
            format!(
                r#"{{"discoveryAddress":"127.0.0.1:1","statusPort":{},"proxyAdminPort":{},"binaryPath":"{}"}}"#,
                free_port(),
                free_port(),
                binary_path.display()
            ),
        )
        .env("ENVOY_STATUS_PORT", free_port().to_string())
        .env("ENVOY_PROMETHEUS_PORT", free_port().to_string())
        .env("RUST_LOG", "info");
    cmd
}

/// What the bootstrap's node must say: AWS's region and zone, and Istio's three keys.
fn assert_aws_node(boot: &Value) {
    assert_eq!(
        boot["node"]["locality"],
        json!({"region": "eu-west-1", "zone": "eu-west-1a"}),
        "{}",
        boot["node"]
    );
    assert_eq!(
        boot["node"]["metadata"]["PLATFORM_METADATA"],
        json!({
            "aws_region": "eu-west-1",
            "aws_availability_zone": "eu-west-1a",
            "aws_instance_id": "i-0e2e0e2e0e2e0e2e0",
        })
    );
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn aws_platform_reaches_the_bootstrap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (imds, seen) = imds();
    // A stand-in Envoy: copies the bootstrap it is given, then exits 0 (the agent with it).
    let captured = dir.path().join("captured.json");
    let envoy = dir.path().join("envoy-stand-in");
    std::fs::write(
        &envoy,
        format!(
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = -c ] && cp \"$2\" {}; shift; done\nexit 0\n",
            captured.display()
        ),
    )
    .expect("stand-in");
    std::fs::set_permissions(&envoy, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");

    // `pilot-agent bootstrap`: discovers, then writes.
    let out = agent_command(dir.path(), imds, &envoy)
        .args(["bootstrap", "sidecar", "--output", "bootstrap.json"])
        .output()
        .expect("pilot-agent bootstrap");
    assert!(out.status.success(), "bootstrap: {out:?}");
    assert_aws_node(&read_json(&dir.path().join("bootstrap.json")));
    let requests = seen.lock().expect("lock").clone();
    assert_eq!(
        requests.first().map(String::as_str),
        Some("PUT /latest/api/token HTTP/1.1")
    );
    assert_eq!(requests.len(), 4, "a token and three reads: {requests:?}");

    // `pilot-agent proxy`: the bootstrap Envoy is started with.
    let mut agent = Child::spawn("agent", {
        let mut cmd = agent_command(dir.path(), imds, &envoy);
        cmd.args(["proxy", "sidecar"]);
        cmd
    });
    let status = agent
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the agent did not exit: {:?}", agent.output()));
    assert!(status.success(), "agent: {status:?} {:?}", agent.output());
    assert_aws_node(&read_json(&captured));
    // The gRPC bootstrap's node, written beside it, says the same.
    assert_aws_node(&read_json(
        &dir.path().join("etc/istio/proxy/grpc-bootstrap.json"),
    ));
}
