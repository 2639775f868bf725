//! A developer's local Envoy: no namespaces, no root. `istiod-lite` on 127.0.0.1 (port 0
//! listeners), `pilot-agent proxy --external-envoy` in a scratch directory holding the token and
//! root certificate at Istio's relative paths, `pilot-agent bootstrap` writing Envoy's bootstrap,
//! and Envoy started by hand with `envoy -c <that file>`.
//!
//! Every port the agent and the bootstrap would take on the host's loopback (status 15020, admin
//! 15000, Envoy's 15021 and 15090) moves to a free one through the agent's own config
//! (`PROXY_CONFIG` statusPort/proxyAdminPort, `ENVOY_STATUS_PORT`, `ENVOY_PROMETHEUS_PORT`), and
//! `ISTIO_META_INTERCEPTION_MODE=NONE` keeps istiod-lite's virtual listeners off 15001/15006, so
//! several can run beside each other. The DNS proxy stays off.

use crate::process::{Child, workspace_bin};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Uid the agent and Envoy run as when the caller is root.
pub const USER_UID: u32 = 1000;

/// Runs the agent and Envoy without privileges: as uid 1000 when the caller is root.
pub struct Unprivileged {
    bins: Option<PathBuf>,
    envoy: PathBuf,
}

impl Unprivileged {
    /// When root, copies the binaries into `scratch/bin` and hands `scratch` to uid 1000.
    pub fn new(scratch: &Path, envoy: &Path) -> Unprivileged {
        if !nix::unistd::geteuid().is_root() {
            return Unprivileged {
                bins: None,
                envoy: envoy.to_path_buf(),
            };
        }
        let bins = scratch.join("bin");
        std::fs::create_dir_all(&bins).expect("bin dir");
        std::fs::copy(workspace_bin("pilot-agent"), bins.join("pilot-agent")).expect("copy");
        std::fs::copy(envoy, bins.join("envoy")).expect("copy envoy");
        crate::netns::sh(
            Command::new("chown")
                .arg("-R")
                .arg(format!("{USER_UID}:{USER_UID}"))
                .arg(scratch),
        );
        Unprivileged {
            bins: Some(bins),
            envoy: envoy.to_path_buf(),
        }
    }

    /// A command running `name` (`pilot-agent` or `envoy`) as the unprivileged user.
    pub fn command(&self, name: &str) -> Command {
        match &self.bins {
            None if name == "envoy" => Command::new(&self.envoy),
            None => Command::new(workspace_bin(name)),
            Some(bins) => {
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={USER_UID}"))
                    .arg(format!("--regid={USER_UID}"))
                    .arg("--clear-groups")
                    .arg(bins.join(name));
                cmd
            }
        }
    }
}

/// A port nobody listens on right now (on all interfaces, since Envoy's 15021/15090 listeners
/// bind the wildcard address).
///
/// Taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768 and up by
/// default): a port from that range can be taken by any parallel test's outgoing connection
/// between this check and the bind of the process it is meant for (Envoy's admin port was, once:
/// `Address already in use`). Each process walks the range from its own offset, so parallel test
/// processes seldom try the same port at the same time.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (offset + n) % SPAN) as u16;
        let v6_free = match TcpListener::bind(("::", port)) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::AddrInUse,
        };
        if v6_free && TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// The address in `istiod-lite`'s `listening name=<name> addr=<ip:port>` line.
pub fn listen_addr(child: &Child, name: &str) -> SocketAddr {
    let line = child.wait_for_line(&format!("listening name={name} "), Duration::from_secs(30));
    line.split("addr=")
        .nth(1)
        .and_then(|a| a.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

/// The ports moved off Istio's defaults.
pub struct Ports {
    pub status: u16,
    pub admin: u16,
    pub envoy_status: u16,
    pub envoy_prometheus: u16,
}

impl Ports {
    /// Free ports for everything.
    pub fn free() -> Ports {
        Ports {
            status: free_port(),
            admin: free_port(),
            envoy_status: free_port(),
            envoy_prometheus: free_port(),
        }
    }
}

/// Writes a file, creating its folder.
pub fn write_file(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, contents).expect("write");
}

/// The agent's environment: the same for `bootstrap` and `proxy`, no Kubernetes at all, and no
/// cloud platform (`CLOUD_PLATFORM=none`: on the host a test must not ask a real metadata
/// server; `agent::platform::tests` use stand-ins).
pub fn agent_env(cmd: &mut Command, discovery: SocketAddr, service_account: &str, ports: &Ports) {
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("CLOUD_PLATFORM", "none")
        .env("ISTIO_AGENT_EXTERNAL_ENVOY", "true")
        .env("POD_NAME", "local")
        .env("POD_NAMESPACE", "demo")
        .env("INSTANCE_IP", "127.0.0.1")
        .env("SERVICE_ACCOUNT", service_account)
        .env("ISTIOD_SAN", "istiod.istio-system.svc")
        // No capture on a developer's host: istiod-lite then sends the virtual listeners
        // without binding 15001/15006, which other Envoys on the host may hold.
        .env("ISTIO_META_INTERCEPTION_MODE", "NONE")
        .env(
            "PROXY_CONFIG",
            format!(
                r#"{{"discoveryAddress":"{discovery}","statusPort":{},"proxyAdminPort":{}}}"#,
                ports.status, ports.admin
            ),
        )
        .env("ENVOY_STATUS_PORT", ports.envoy_status.to_string())
        .env("ENVOY_PROMETHEUS_PORT", ports.envoy_prometheus.to_string())
        .env("RUST_LOG", "info");
}

/// Host of the ServiceEntry in [`httpbin_config`].
pub const HTTPBIN_HOST: &str = "httpbin.demo.svc.cluster.local";

/// istiod-lite's config for the local tests: one static ServiceEntry, [`HTTPBIN_HOST`] at
/// 198.19.0.10:80 with one endpoint (198.18.0.5:8080).
pub fn httpbin_config() -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: httpbin, namespace: demo }}
spec:
  hosts: [{HTTPBIN_HOST}]
  addresses: [198.19.0.10]
  ports: [{{ number: 80, name: http, protocol: HTTP, targetPort: 8080 }}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{{ address: 198.18.0.5 }}]
"#
    )
}

/// Runs `pilot-agent bootstrap sidecar` in `scratch` with [`agent_env`]; returns the path of
/// the bootstrap it wrote (as it printed it).
pub fn write_bootstrap(
    user: &Unprivileged,
    scratch: &Path,
    discovery: SocketAddr,
    service_account: &str,
    ports: &Ports,
) -> PathBuf {
    let mut cmd = user.command("pilot-agent");
    cmd.args(["bootstrap", "sidecar"]).current_dir(scratch);
    agent_env(&mut cmd, discovery, service_account, ports);
    let out = cmd.output().expect("pilot-agent bootstrap");
    assert!(
        out.status.success(),
        "pilot-agent bootstrap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Starts Envoy with `-c bootstrap` from `scratch` (the bootstrap's socket paths are Istio's
/// relative ones), one worker, warnings only.
pub fn start_envoy(user: &Unprivileged, bootstrap: &Path, scratch: &Path) -> Child {
    let mut cmd = user.command("envoy");
    cmd.arg("-c")
        .arg(bootstrap)
        .args(["--disable-hot-restart", "--log-level", "warning"])
        .args(["--concurrency", "1", "--allow-unknown-static-fields"])
        .current_dir(scratch);
    Child::spawn("envoy", cmd)
}

/// istiod-lite on loopback with every listener on port 0, serving `config_yaml`.
pub struct LocalIstiod {
    pub child: Child,
    /// Plaintext gRPC (15010's role).
    pub grpc: SocketAddr,
    pub secure: SocketAddr,
    pub monitoring: SocketAddr,
    pub ca_dir: tempfile::TempDir,
    pub config_dir: tempfile::TempDir,
}

impl LocalIstiod {
    /// Starts it and waits for `/ready`.
    pub fn start(config_yaml: &str) -> LocalIstiod {
        let config_dir = tempfile::tempdir().expect("tempdir");
        let ca_dir = tempfile::tempdir().expect("tempdir");
        write_file(&config_dir.path().join("mesh.yaml"), config_yaml);
        let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let child = Self::spawn(config_dir.path(), ca_dir.path(), [any; 3]);
        let grpc = listen_addr(&child, "grpc");
        let secure = listen_addr(&child, "secure-grpc");
        let monitoring = listen_addr(&child, "monitoring");
        wait_ready(monitoring);
        LocalIstiod {
            child,
            grpc,
            secure,
            monitoring,
            ca_dir,
            config_dir,
        }
    }

    fn spawn(
        config_dir: &Path,
        ca_dir: &Path,
        [grpc, secure, monitoring]: [SocketAddr; 3],
    ) -> Child {
        let mut cmd = Command::new(workspace_bin("istiod-lite"));
        cmd.arg("serve")
            .arg("--config-dir")
            .arg(config_dir)
            .arg("--ca-dir")
            .arg(ca_dir)
            .arg("--grpc-addr")
            .arg(grpc.to_string())
            .arg("--secure-grpc-addr")
            .arg(secure.to_string())
            .arg("--monitoring-addr")
            .arg(monitoring.to_string())
            .env("RUST_LOG", "info");
        Child::spawn("istiod-lite", cmd)
    }

    /// Kills it (SIGKILL) and waits for the exit: its listeners are gone when this returns.
    pub fn kill(&mut self) {
        self.child.signal(nix::sys::signal::Signal::SIGKILL);
        assert!(
            self.child.wait_timeout(Duration::from_secs(10)).is_some(),
            "istiod-lite did not exit after SIGKILL"
        );
    }

    /// Starts it again with the same CA and config directories on the same addresses, and
    /// waits for `/ready`.
    pub fn restart(&mut self) {
        let addrs = [self.grpc, self.secure, self.monitoring];
        self.child = Self::spawn(self.config_dir.path(), self.ca_dir.path(), addrs);
        for name in ["grpc", "secure-grpc", "monitoring"] {
            listen_addr(&self.child, name);
        }
        wait_ready(self.monitoring);
    }

    /// A token for `demo/<service_account>` from `istiod-lite token` (`ttl` as a Go duration;
    /// `None` for its default).
    pub fn token(&self, service_account: &str, ttl: Option<&str>) -> String {
        token(self.ca_dir.path(), service_account, ttl)
    }

    /// Puts a token for `demo/<service_account>` and the CA root at Istio's relative paths
    /// under `scratch`.
    pub fn provision(&self, scratch: &Path, service_account: &str) {
        provision(self.ca_dir.path(), scratch, service_account);
    }
}

/// A token for `demo/<service_account>` from `istiod-lite token` against the CA folder
/// `ca_dir` (`ttl` as a Go duration; `None` for its default).
pub fn token(ca_dir: &Path, service_account: &str, ttl: Option<&str>) -> String {
    let mut cmd = Command::new(workspace_bin("istiod-lite"));
    cmd.arg("token").arg("--ca-dir").arg(ca_dir).args([
        "--namespace",
        "demo",
        "--service-account",
        service_account,
    ]);
    if let Some(ttl) = ttl {
        cmd.args(["--ttl", ttl]);
    }
    let out = cmd.output().expect("istiod-lite token");
    assert!(
        out.status.success(),
        "istiod-lite token failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Puts a token for `demo/<service_account>` and the root of the CA folder `ca_dir` at
/// Istio's relative paths under `scratch`.
pub fn provision(ca_dir: &Path, scratch: &Path, service_account: &str) {
    write_file(
        &scratch.join("var/run/secrets/tokens/istio-token"),
        &token(ca_dir, service_account, None),
    );
    write_file(
        &scratch.join("var/run/secrets/istio/root-cert.pem"),
        &std::fs::read_to_string(ca_dir.join("root-cert.pem")).expect("CA root"),
    );
}

/// The agent's row (its proxy in the `demo` namespace) in the `/debug/syncz` of the
/// istiod-lite monitored at `monitoring`; an error unless there is exactly one.
pub fn agent_sync_row(monitoring: SocketAddr) -> Result<serde_json::Value, String> {
    let (code, body) = crate::http_get(monitoring, "/debug/syncz")?;
    if code != 200 {
        return Err(format!("/debug/syncz {code}"));
    }
    let rows: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let ours: Vec<&serde_json::Value> = rows
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            r["proxy"]
                .as_str()
                .is_some_and(|p| p.contains("local.demo"))
        })
        .collect();
    match ours[..] {
        [row] => Ok(row.clone()),
        _ => Err(format!("want one connection of the agent's: {body}")),
    }
}

/// Waits (20 s at most) until the istiod-lite whose monitoring port is `monitoring` answers
/// `/ready` with 200.
pub fn wait_ready(monitoring: SocketAddr) {
    crate::assert_eventually(Duration::from_secs(20), || {
        match crate::http_get(monitoring, "/ready") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("/ready: {other:?}")),
        }
    });
}
