//! Proxyless gRPC, as Istio's `grpc-agent` injection template runs it: `pilot-agent proxy
//! sidecar` with `ISTIO_META_GENERATOR=grpc`, `DISABLE_ENVOY=true`, `OUTPUT_CERTS` and
//! `GRPC_XDS_BOOTSTRAP`, and readiness on the status port. The app is a real gRPC C-core client
//! (Python `grpcio`, installed by `scripts/setup.sh` into `.tools/py-grpc`) dialing
//! `xds:///<host>:<port>` with the agent's bootstrap: it talks to the agent's xDS socket, which
//! relays to istiod-lite's gRPC generator (LDS API listener, RDS, CDS, EDS), and calls a real
//! grpcio server (the health service) found through EDS.
//!
//! No root, no namespaces: istiod-lite, the agent and both Python processes run on loopback with
//! every port moved to a free one.

use harness::local::{LocalIstiod, Ports, agent_env, free_port};
use harness::{Child, assert_eventually, http_get, in_ci, workspace_bin};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const SERVICE_ACCOUNT: &str = "grpc-client";
const HOST: &str = "echo.demo.svc.cluster.local";
const PORT: u16 = 7070;
/// The health service name the test server (and only it) reports SERVING.
const HEALTH_NAME: &str = "proxyless-echo";

/// This crate's folder (`tests/`), as this test was built.
fn tests_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where `scripts/setup.sh` puts grpcio (`PY_GRPC_DIR` overrides).
fn py_grpc_dir() -> PathBuf {
    std::env::var_os("PY_GRPC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tests_dir().join("../.tools/py-grpc"))
}

fn python(script_args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(tests_dir().join("py/grpc_xds.py"))
        .args(script_args)
        .env("PYTHONPATH", py_grpc_dir())
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// True when python3 can import grpcio; otherwise skips (fails under `CI=true`).
fn require_grpcio() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import grpc, grpc_health.v1.health"])
        .env("PYTHONPATH", py_grpc_dir())
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let msg = format!(
            "missing prerequisite: python3 with grpcio in {} (run scripts/setup.sh, which \
             installs grpcio from PyPI there)",
            py_grpc_dir().display()
        );
        assert!(
            !in_ci(),
            "{msg}; CI=true, so this test fails instead of skipping"
        );
        eprintln!("SKIP: {msg}");
    }
    ok
}

/// One ServiceEntry: the gRPC service at a VIP, its one endpoint the test server on loopback.
fn mesh_config(server_port: u16) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: echo, namespace: demo }}
spec:
  hosts: [{HOST}]
  addresses: [198.19.0.20]
  ports: [{{ number: {PORT}, name: grpc, protocol: GRPC, targetPort: {server_port} }}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{{ address: 127.0.0.1 }}]
"#
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn grpc_xds_client_calls_a_server_through_the_agent_and_istiod_lite() {
    if !require_grpcio() {
        return;
    }
    // The app's gRPC server (plain text), on a free loopback port.
    let server_port = free_port();
    let server = Child::spawn(
        "grpc-server",
        python(&["server", &server_port.to_string(), HEALTH_NAME]),
    );
    server.wait_for_line("serving port=", Duration::from_secs(30));

    let istiod = LocalIstiod::start(&mesh_config(server_port));
    let scratch_dir = tempfile::Builder::new()
        .prefix("grpc-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch = scratch_dir.path();
    istiod.provision(scratch, SERVICE_ACCOUNT);

    // The grpc-agent template's environment.
    let certs = scratch.join("var/lib/istio/data");
    let bootstrap = scratch.join("etc/istio/proxy/grpc-bootstrap.json");
    let ports = Ports::free();
    let mut cmd = Command::new(workspace_bin("pilot-agent"));
    cmd.args(["proxy", "sidecar"]).current_dir(scratch);
    agent_env(&mut cmd, istiod.secure, SERVICE_ACCOUNT, &ports);
    cmd.env("ISTIO_META_GENERATOR", "grpc")
        .env("DISABLE_ENVOY", "true")
        .env("OUTPUT_CERTS", &certs)
        .env("GRPC_XDS_BOOTSTRAP", &bootstrap)
        // In a pod: the app container reads the certificates, so they are 0644 (Istio).
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1");
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));

    // Readiness on the status port waits for the bootstrap and the three certificate files.
    let status: SocketAddr = format!("127.0.0.1:{}", ports.status).parse().expect("addr");
    assert_eventually(Duration::from_secs(30), || {
        match http_get(status, "/healthz/ready") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("/healthz/ready: {other:?}")),
        }
    });
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&bootstrap).expect("bootstrap written"))
            .expect("bootstrap is JSON");
    assert_eq!(doc["node"]["metadata"]["GENERATOR"], "grpc");
    let provider = &doc["certificate_providers"]["default"];
    assert_eq!(provider["plugin_name"], "file_watcher");
    for (key, file) in [
        ("certificate_file", "cert-chain.pem"),
        ("private_key_file", "key.pem"),
        ("ca_certificate_file", "root-cert.pem"),
    ] {
        let path = certs.join(file);
        assert_eq!(provider["config"][key], path.display().to_string(), "{key}");
        assert_eq!(mode(&path), 0o644, "{file}: readable by the app container");
    }
    assert!(
        !agent.output().iter().any(|l| l.contains("starting Envoy")),
        "DISABLE_ENVOY: the agent must not start Envoy"
    );

    // The real gRPC xDS client: resolves through the agent's xDS socket and calls the server.
    let target = format!("xds:///{HOST}:{PORT}");
    let mut client = python(&["client", &target, HEALTH_NAME]);
    client.env("GRPC_XDS_BOOTSTRAP", &bootstrap);
    let mut client = Child::spawn("grpc-client", client);
    let exit = client.wait_timeout(Duration::from_secs(90));
    let out = client.output();
    assert!(
        exit.is_some_and(|s| s.success()),
        "the gRPC client failed ({exit:?}): {out:#?}"
    );
    assert!(
        out.iter().any(|l| l == "status=SERVING"),
        "the test server's health answer: {out:#?}"
    );
    // The agent accepted C-core's percent-encoded socket path as :authority (no stream reset).
    assert!(
        !out.iter().any(|l| l.contains("RST_STREAM")),
        "the xDS stream was reset: {out:#?}"
    );
}
