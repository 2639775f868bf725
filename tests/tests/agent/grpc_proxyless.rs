//! Proxyless gRPC, as Istio's `grpc-agent` injection template runs it: `pilot-agent proxy
//! sidecar` with `ISTIO_META_GENERATOR=grpc`, `DISABLE_ENVOY=true`, `OUTPUT_CERTS` and
//! `GRPC_XDS_BOOTSTRAP`, and readiness on the status port. The app is a real gRPC C-core client
//! (Python `grpcio`, installed by `scripts/setup.sh --test-tools` into `.tools/py-grpc`) dialing
//! `xds:///<host>:<port>` with the agent's bootstrap: it talks to the agent's xDS socket, which
//! relays to istiod-lite's gRPC generator (LDS API listener, RDS, CDS, EDS), and calls a real
//! grpcio server (the health service) found through EDS. With a DestinationRule `ISTIO_MUTUAL`
//! the client takes mTLS from CDS and its certificates from the agent's `OUTPUT_CERTS` files
//! through the bootstrap's `file_watcher` provider.
//!
//! No root, no namespaces: istiod-lite, the agent and both Python processes run on loopback with
//! every port moved to a free one.

use harness::local::{LocalIstiod, Ports, agent_env, free_port};
use harness::prereq::{py_grpc_dir, require_grpcio};
use harness::{Child, assert_eventually, http_get, workspace_bin};
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

fn python(script_args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(tests_dir().join("py/grpc_xds.py"))
        .args(script_args)
        .env("PYTHONPATH", py_grpc_dir())
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// One ServiceEntry: the gRPC service at a VIP, its one endpoint the test server on loopback
/// (running as the client's own identity in the mTLS case).
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
  endpoints: [{{ address: 127.0.0.1, serviceAccount: {SERVICE_ACCOUNT} }}]
"#
    )
}

fn istio_mutual() -> String {
    format!(
        r#"---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{ name: echo, namespace: demo }}
spec:
  host: {HOST}
  trafficPolicy: {{ tls: {{ mode: ISTIO_MUTUAL }} }}
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

/// istiod-lite and the agent with the grpc-agent template's environment, ready.
pub(crate) struct Proxyless {
    pub(crate) istiod: LocalIstiod,
    pub(crate) agent: Child,
    _scratch: tempfile::TempDir,
    certs: PathBuf,
    pub(crate) bootstrap: PathBuf,
    /// The agent's status port (readiness, `/stats/prometheus`).
    pub(crate) status: SocketAddr,
}

fn start(config: &str) -> Proxyless {
    start_with(config, &[])
}

/// [`start`] with extra environment for the agent.
pub(crate) fn start_with(config: &str, extra_env: &[(&str, &str)]) -> Proxyless {
    let istiod = LocalIstiod::start(config);
    let scratch_dir = tempfile::Builder::new()
        .prefix("grpc-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch = scratch_dir.path();
    istiod.provision(scratch, SERVICE_ACCOUNT);

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
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .envs(extra_env.iter().copied());
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
    Proxyless {
        istiod,
        agent,
        _scratch: scratch_dir,
        certs,
        bootstrap,
        status,
    }
}

/// Runs the real gRPC xDS client against `xds:///HOST:PORT`; returns success and its output.
fn call(p: &Proxyless, extra: &[&str]) -> (bool, Vec<String>) {
    let target = format!("xds:///{HOST}:{PORT}");
    let mut args = vec!["client", target.as_str(), HEALTH_NAME];
    args.extend_from_slice(extra);
    let mut cmd = python(&args);
    cmd.env("GRPC_XDS_BOOTSTRAP", &p.bootstrap);
    let mut client = Child::spawn("grpc-client", cmd);
    let exit = client.wait_timeout(Duration::from_secs(90));
    (exit.is_some_and(|s| s.success()), client.output())
}

fn assert_served(ok: bool, out: &[String]) {
    assert!(ok, "the gRPC client failed: {out:#?}");
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

#[test]
fn grpc_xds_client_calls_a_server_through_the_agent_and_istiod_lite() {
    if !require_grpcio() {
        return;
    }
    let server_port = free_port();
    let pod = start(&mesh_config(server_port));
    // The app's gRPC server (plain text), on the free loopback port.
    let server = Child::spawn(
        "grpc-server",
        python(&["server", &server_port.to_string(), HEALTH_NAME]),
    );
    server.wait_for_line("serving port=", Duration::from_secs(30));
    let (ok, out) = call(&pod, &[]);
    assert_served(ok, &out);
}

#[test]
fn istio_mutual_reaches_the_grpc_client_through_the_file_watcher_provider() {
    if !require_grpcio() {
        return;
    }
    let server_port = free_port();
    let pod = start(&(mesh_config(server_port) + &istio_mutual()));
    // The server requires a client certificate from the mesh CA; it serves the workload
    // certificate the agent wrote (its SPIFFE id is the one CDS expects).
    let certs = pod.certs.display().to_string();
    let server = Child::spawn(
        "grpc-server",
        python(&["server", &server_port.to_string(), HEALTH_NAME, &certs]),
    );
    server.wait_for_line("serving port=", Duration::from_secs(30));
    // Security from xDS: CDS says ISTIO_MUTUAL, the certificates come from OUTPUT_CERTS.
    let (ok, out) = call(&pod, &["xds-creds"]);
    assert_served(ok, &out);
    // Plain text cannot reach the mTLS server: the answer above went over mTLS.
    let (ok, out) = call(&pod, &["8"]);
    assert!(!ok, "a plain-text client reached the mTLS server: {out:#?}");
}

fn strict_mtls() -> String {
    r#"---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: { name: default, namespace: demo }
spec: { mtls: { mode: STRICT } }
"#
    .to_string()
}

/// Starts the xDS-enabled server on `port` with the pod's bootstrap.
fn xds_server(p: &Proxyless, port: u16) -> Child {
    let mut cmd = python(&["xds-server", &port.to_string(), HEALTH_NAME]);
    cmd.env("GRPC_XDS_BOOTSTRAP", &p.bootstrap);
    let server = Child::spawn("grpc-xds-server", cmd);
    server.wait_for_line("serving port=", Duration::from_secs(30));
    server
}

/// A direct (non-xDS, plain-text) call to `127.0.0.1:port` within `deadline` seconds.
fn call_direct(port: u16, deadline: &str) -> (bool, Vec<String>) {
    let target = format!("127.0.0.1:{port}");
    let mut client = Child::spawn(
        "grpc-direct-client",
        python(&["client", &target, HEALTH_NAME, deadline]),
    );
    let exit = client.wait_timeout(Duration::from_secs(60));
    (exit.is_some_and(|s| s.success()), client.output())
}

/// An xDS-enabled gRPC server (grpcio, `xds=True`) in the pod asks istiod-lite, through the
/// agent, for `xds.istio.io/grpc/lds/inbound/0.0.0.0:<port>` and serves once it has it: plain
/// text by default. A second xDS server on a port no service targets gets no listener and
/// never serves (the control that the first one's listener came from xDS).
#[test]
fn xds_enabled_server_serves_on_the_listener_istiod_lite_sends() {
    if !require_grpcio() {
        return;
    }
    let (server_port, other_port) = (free_port(), free_port());
    let pod = start(&mesh_config(server_port));
    let _server = xds_server(&pod, server_port);
    let _other = xds_server(&pod, other_port);
    let (ok, out) = call(&pod, &[]);
    assert_served(ok, &out);
    let (ok, out) = call_direct(server_port, "20");
    assert_served(ok, &out);
    let (ok, out) = call_direct(other_port, "6");
    assert!(!ok, "an xDS server without a listener served: {out:#?}");
}

/// With PeerAuthentication STRICT the server's listener requires mTLS from the bootstrap's
/// certificate providers: the xDS client with xDS credentials (ISTIO_MUTUAL from CDS) is served,
/// a plain-text client is not.
#[test]
fn xds_enabled_server_takes_strict_mtls_from_its_listener() {
    if !require_grpcio() {
        return;
    }
    let server_port = free_port();
    let pod = start(&(mesh_config(server_port) + &istio_mutual() + &strict_mtls()));
    let _server = xds_server(&pod, server_port);
    let (ok, out) = call(&pod, &["xds-creds"]);
    assert_served(ok, &out);
    let (ok, out) = call_direct(server_port, "6");
    assert!(
        !ok,
        "a plain-text client reached the STRICT server: {out:#?}"
    );
}
