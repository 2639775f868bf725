//! Pod in a box: the whole mesh without Kubernetes.
//!
//! A `node` namespace runs `istiod-lite`; each pod is a namespace joined to the node by a veth
//! pair (pod `198.18.<n>.2`, node `198.18.<n>.1`, the node routes between pods, nothing is
//! routed to the host). A sidecar pod is set up the way Istio's injection does it:
//! `istio-iptables` with the injection arguments plus `--redirect-dns` (the init container), then
//! `pilot-agent proxy sidecar ...` with the injection environment, as uid 1337, in a scratch
//! working directory holding the token and root certificate at Istio's relative paths.
//! Apps run as uid 1000. A VM ([`vm`]) is a namespace joined the same way, started through the
//! systemd unit in `docs/vm/istio.service` instead of the injection.

pub mod vm;

use crate::netns::{Netns, sh};
use crate::process::{Child, repo_root, workspace_bin};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The namespace every test workload lives in.
pub const NAMESPACE: &str = "demo";
/// Uid and gid the sidecar runs as (Istio's istio-proxy user).
pub const PROXY_UID: u32 = 1337;
/// Uid and gid apps run as.
pub const APP_UID: u32 = 1000;
/// Istio's injection arguments for the init container, plus DNS capture.
pub const INIT_ARGS: &[&str] = &[
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
    "--log_output_level=default:info",
    "--redirect-dns",
];
/// Istio's injection arguments for the proxy container.
pub fn proxy_args() -> Vec<String> {
    vec![
        "proxy".into(),
        "sidecar".into(),
        "--domain".into(),
        format!("{NAMESPACE}.svc.cluster.local"),
        "--proxyLogLevel=warning".into(),
        "--proxyComponentLogLevel=misc:error".into(),
        "--log_output_level=default:info".into(),
    ]
}

/// What a mesh test needs (root, Envoy, iptables, curl, dig, setpriv) plus `extra` programs.
/// Missing ones skip the test outside CI and fail it under `CI=true`.
pub fn prerequisites(extra: &[&str]) -> bool {
    crate::require_root()
        && crate::envoy_bin().is_some()
        && ["iptables", "curl", "dig", "setpriv"]
            .iter()
            .chain(extra)
            .all(|b| crate::require_bin(b))
}

/// The node: `istiod-lite` with its config and CA directories.
pub struct Mesh {
    pub node: Netns,
    pub istiod: Option<Child>,
    /// Working area readable by the proxy user: binaries, config dir, CA dir, pod dirs.
    pub root: tempfile::TempDir,
    pods: u8,
    monitoring: Option<SocketAddr>,
}

/// A pod: its namespace, address, scratch directory and processes.
pub struct Pod {
    pub name: String,
    pub service_account: String,
    pub ns: Netns,
    pub ip: String,
    pub node_ip: String,
    pub dir: PathBuf,
    pub agent: Option<Child>,
    pub apps: Vec<Child>,
}

/// Hands a tree to `uid` (a VM's files, as Istio's VM instructions `chown` them; never a
/// pod's: a kubelet does not).
fn chown_r(path: &Path, uid: u32) {
    sh(Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{uid}"))
        .arg(path));
}

impl Mesh {
    /// Creates the node namespace and the working area, and writes `config_yaml` as the
    /// control plane's config (`config/mesh.yaml`). Does not start `istiod-lite` yet.
    pub fn new(config_yaml: &str) -> Mesh {
        let node = Netns::new("node");
        sh(node.cmd("sysctl").args(["-qw", "net.ipv4.ip_forward=1"]));
        let root = tempfile::Builder::new()
            .prefix("mesh-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        sh(Command::new("chmod").arg("0755").arg(root.path()));
        let bin = root.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        // Copies, so the proxy user can run them wherever the checkout lives.
        for name in ["pilot-agent", "istio-iptables", "istiod-lite", "mesh-app"] {
            std::fs::copy(workspace_bin(name), bin.join(name)).expect("copy binary");
        }
        // The VM's start script, as the package installs it beside the binaries.
        std::fs::copy(
            repo_root().join("docs/vm/istio-start.sh"),
            bin.join("istio-start.sh"),
        )
        .expect("copy istio-start.sh");
        let envoy = crate::envoy_bin().expect("Envoy is required for the mesh");
        std::fs::copy(&envoy, bin.join("envoy")).expect("copy envoy");
        sh(Command::new("chmod").arg("-R").arg("0755").arg(&bin));
        std::fs::create_dir_all(root.path().join("config")).expect("config dir");
        std::fs::create_dir_all(root.path().join("ca")).expect("ca dir");
        let m = Mesh {
            node,
            istiod: None,
            root,
            pods: 0,
            monitoring: None,
        };
        m.write_config("mesh.yaml", config_yaml);
        m
    }

    /// Path of a binary in the mesh's `bin/`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.root.path().join("bin").join(name)
    }

    /// The control plane's config directory.
    pub fn config_dir(&self) -> PathBuf {
        self.root.path().join("config")
    }

    /// The CA directory (root material, token signing key).
    pub fn ca_dir(&self) -> PathBuf {
        self.root.path().join("ca")
    }

    /// Writes (atomically) a file in the config directory.
    pub fn write_config(&self, name: &str, yaml: &str) {
        let tmp = self.root.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, yaml).expect("write config");
        std::fs::rename(&tmp, self.config_dir().join(name)).expect("rename config");
    }

    /// Starts `istiod-lite` in the node namespace on all its addresses.
    pub fn start_istiod(&mut self) {
        self.start_istiod_with(&[]);
    }

    /// [`Mesh::start_istiod`] with extra arguments (e.g. `--san` names).
    pub fn start_istiod_with(&mut self, extra: &[String]) {
        let mut cmd = self.node.cmd(self.bin("istiod-lite"));
        cmd.arg("serve")
            .args(extra)
            .arg("--config-dir")
            .arg(self.config_dir())
            .arg("--ca-dir")
            .arg(self.ca_dir())
            .args(["--grpc-addr", "0.0.0.0:15010"])
            .args(["--secure-grpc-addr", "0.0.0.0:15012"])
            .args(["--monitoring-addr", "127.0.0.1:15014"])
            .env("RUST_LOG", "info");
        let child = Child::spawn("istiod-lite", cmd);
        let line = child.wait_for_line("listening name=monitoring", Duration::from_secs(30));
        let addr = line
            .split("addr=")
            .nth(1)
            .and_then(|a| a.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no monitoring address in {line:?}"));
        self.monitoring = Some(addr);
        self.istiod = Some(child);
        crate::assert_eventually(Duration::from_secs(20), || {
            match self.monitoring_get("/ready") {
                Ok((200, _)) => Ok(()),
                other => Err(format!("/ready: {other:?}")),
            }
        });
    }

    /// Stops `istiod-lite` (SIGKILL).
    pub fn stop_istiod(&mut self) {
        self.istiod = None;
    }

    /// GET on istiod-lite's monitoring port (inside the node namespace).
    pub fn monitoring_get(&self, path: &str) -> Result<(u16, String), String> {
        let addr = self.monitoring.ok_or("istiod-lite not started")?;
        let path = path.to_string();
        self.node.run(move || crate::http::http_get(addr, &path))
    }

    /// A token for `sa` in the demo namespace, signed by istiod-lite's issuer key.
    pub fn token(&self, sa: &str) -> String {
        sh(Command::new(self.bin("istiod-lite"))
            .arg("token")
            .arg("--ca-dir")
            .arg(self.ca_dir())
            .args(["--namespace", NAMESPACE, "--service-account", sa]))
        .trim()
        .to_string()
    }

    /// A pod's network: a namespace joined to the node by a veth pair, its default route via
    /// the node. Returns the namespace, the pod's IP and the node's IP on that link.
    pub fn pod_network(&mut self, name: &str) -> (Netns, String, String) {
        self.pods += 1;
        let n = self.pods;
        let ns = Netns::new(name);
        let (pod_ip, node_ip) = (format!("198.18.{n}.2"), format!("198.18.{n}.1"));
        crate::netns::veth(
            &self.node,
            &format!("{node_ip}/24"),
            &ns,
            &format!("{pod_ip}/24"),
        );
        sh(ns
            .cmd("ip")
            .args(["route", "add", "default", "via", &node_ip]));
        (ns, pod_ip, node_ip)
    }

    /// Creates a pod namespace joined to the node (no sidecar yet).
    pub fn pod(&mut self, name: &str, service_account: &str) -> Pod {
        let (ns, pod_ip, node_ip) = self.pod_network(name);
        // What a pod sees: cluster DNS at the node address, istiod's name in /etc/hosts.
        ns.set_resolv_conf(&format!(
            "nameserver {node_ip}\nsearch {NAMESPACE}.svc.cluster.local svc.cluster.local cluster.local\n"
        ));
        let etc = PathBuf::from("/etc/netns").join(ns.name());
        std::fs::write(
            etc.join("hosts"),
            format!("127.0.0.1 localhost\n{node_ip} istiod.istio-system.svc\n"),
        )
        .expect("write hosts");
        let dir = self.root.path().join(format!("pod-{name}"));
        std::fs::create_dir_all(dir.join("var/run/secrets/tokens")).expect("pod dir");
        std::fs::create_dir_all(dir.join("var/run/secrets/istio")).expect("pod dir");
        // The injection template's emptyDir volumes exist before the containers start, mode
        // 0777 as the kubelet makes them: istio-envoy, workload-socket, credential-socket,
        // istio-data.
        for empty_dir in [
            "etc/istio/proxy",
            "var/run/secrets/workload-spiffe-uds",
            "var/run/secrets/credential-uds",
            "var/lib/istio/data",
        ] {
            let d = dir.join(empty_dir);
            std::fs::create_dir_all(&d).expect("emptyDir");
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .expect("chmod emptyDir");
        }
        Pod {
            name: name.to_string(),
            service_account: service_account.to_string(),
            ns,
            ip: pod_ip,
            node_ip,
            dir,
            agent: None,
            apps: Vec::new(),
        }
    }

    /// Sets the pod up as Istio's injection does: init container, then the sidecar agent.
    pub fn inject(&self, pod: &mut Pod) {
        self.inject_with(pod, &[]);
    }

    /// [`Mesh::inject`] with `extra` environment on top of the injected one, the way a pod
    /// annotation or the webhook would add it.
    pub fn inject_with(&self, pod: &mut Pod, extra: &[(&str, String)]) {
        self.inject_as(pod, (PROXY_UID, PROXY_UID), extra);
    }

    /// [`Mesh::inject_with`] with the agent running as `(uid, gid)`: Istio's template runs it
    /// as 1337:1337, or as 0:1337 (`runAsUser: 0`, `runAsGroup: 1337`) for TPROXY or
    /// `NET_BIND_SERVICE` (DNS on `:53`); the capture rules exclude gid 1337 too.
    pub fn inject_as(&self, pod: &mut Pod, (uid, gid): (u32, u32), extra: &[(&str, String)]) {
        self.inject_agent(pod, &self.bin("pilot-agent"), (uid, gid), extra);
    }

    /// [`Mesh::inject_as`] with another `pilot-agent` binary (Istio's own, for the differential
    /// suites), run with the same environment.
    pub fn inject_agent(
        &self,
        pod: &mut Pod,
        agent: &Path,
        (uid, gid): (u32, u32),
        extra: &[(&str, String)],
    ) {
        let out = pod
            .ns
            .cmd(self.bin("istio-iptables"))
            .args(INIT_ARGS)
            .output()
            .expect("run istio-iptables");
        assert!(
            out.status.success(),
            "istio-iptables failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(
            pod.dir.join("var/run/secrets/tokens/istio-token"),
            self.token(&pod.service_account),
        )
        .expect("write token");
        std::fs::copy(
            self.ca_dir().join("root-cert.pem"),
            pod.dir.join("var/run/secrets/istio/root-cert.pem"),
        )
        .expect("copy root cert (is istiod-lite started?)");
        // As a kubelet leaves them: the pod's files root-owned, the token and root certificate
        // 0644, the emptyDirs 0777; nothing is handed to the proxy's uid.
        for f in [
            "var/run/secrets/tokens/istio-token",
            "var/run/secrets/istio/root-cert.pem",
        ] {
            std::fs::set_permissions(
                pod.dir.join(f),
                std::os::unix::fs::PermissionsExt::from_mode(0o644),
            )
            .expect("chmod");
        }
        let mut cmd = pod.ns.cmd_as(uid, gid, agent);
        cmd.args(proxy_args())
            .current_dir(&pod.dir)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("PILOT_CERT_PROVIDER", "istiod")
            .env("CA_ADDR", "istiod.istio-system.svc:15012")
            .env("POD_NAME", &pod.name)
            .env("POD_NAMESPACE", NAMESPACE)
            .env("INSTANCE_IP", &pod.ip)
            .env("SERVICE_ACCOUNT", &pod.service_account)
            .env("HOST_IP", &pod.node_ip)
            .env("ISTIO_CPU_LIMIT", "1")
            .env(
                "PROXY_CONFIG",
                format!(
                    r#"{{"binaryPath":"{}","discoveryAddress":"istiod.istio-system.svc:15012"}}"#,
                    self.bin("envoy").display()
                ),
            )
            .env(
                "ISTIO_META_POD_PORTS",
                r#"[{"name":"http","containerPort":8080}]"#,
            )
            .env("ISTIO_META_APP_CONTAINERS", "app")
            .env("ISTIO_META_CLUSTER_ID", "Kubernetes")
            .env("ISTIO_META_NODE_NAME", "node")
            .env("ISTIO_META_INTERCEPTION_MODE", "REDIRECT")
            .env("ISTIO_META_WORKLOAD_NAME", &pod.name)
            .env("ISTIO_META_MESH_ID", "cluster.local")
            .env("TRUST_DOMAIN", "cluster.local")
            .env("ISTIO_META_DNS_CAPTURE", "true")
            .env("RUST_LOG", "info");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        pod.agent = Some(Child::spawn(&format!("agent-{}", pod.name), cmd));
    }

    /// GET from the node (the kubelet's path to a pod: not captured, like a probe).
    pub fn probe(&self, pod: &Pod, port: u16, path: &str) -> Result<(u16, String), String> {
        let addr: SocketAddr = format!("{}:{port}", pod.ip).parse().expect("addr");
        let path = path.to_string();
        self.node.run(move || crate::http::http_get(addr, &path))
    }

    /// Waits until the sidecar reports ready on 15021 (`/healthz/ready`), probed from the node.
    pub fn wait_ready(&self, pod: &Pod, timeout: Duration) {
        crate::assert_eventually(timeout, || match self.probe(pod, 15021, "/healthz/ready") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{} /healthz/ready: {other:?}", pod.name)),
        });
    }

    /// Starts `mesh-app` in the pod as uid 1000, answering `hello from <name>`.
    pub fn start_app(&self, pod: &mut Pod, listen: &str, name: &str) {
        let mut cmd = pod.ns.cmd_as(APP_UID, APP_UID, self.bin("mesh-app"));
        cmd.arg(listen).arg(name);
        let app = Child::spawn(&format!("app-{name}"), cmd);
        app.wait_for_line("listening", Duration::from_secs(10));
        pod.apps.push(app);
    }
}

impl Pod {
    /// GET from inside the pod's namespace as root. Root's traffic is captured like an app's
    /// except to 127.0.0.1, so use this for loopback endpoints (Envoy admin, agent status).
    pub fn get(&self, addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
        let path = path.to_string();
        self.ns.run(move || crate::http::http_get(addr, &path))
    }

    /// GET on Envoy's admin port (localhost:15000 in the pod).
    pub fn envoy_admin(&self, path: &str) -> Result<(u16, String), String> {
        self.get("127.0.0.1:15000".parse().expect("addr"), path)
    }

    /// Runs `curl` as the app user (uid 1000), so its traffic is captured like an app's.
    /// Returns curl's exit status success and its stdout+stderr.
    pub fn curl(&self, url: &str) -> (bool, String) {
        let out = self
            .ns
            .cmd_as(APP_UID, APP_UID, "curl")
            .args(["-sS", "--max-time", "5", url])
            .output()
            .expect("run curl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }

    /// Resolves `name` with `dig +search` as the app user (captured DNS), like an app's
    /// resolver: the resolv.conf search list applies.
    pub fn dig(&self, name: &str) -> String {
        let out = self
            .ns
            .cmd_as(APP_UID, APP_UID, "dig")
            .args(["+short", "+search", "+time=2", "+tries=1", name])
            .output()
            .expect("run dig");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Steady traffic from a pod across a disruption: one request after another on its own thread,
/// pausing between them, until [`Load::stop`] (or until dropped, without waiting).
pub struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(usize, Vec<String>)>>,
}

impl Load {
    /// GETs `url` from `pod` with `curl` as the app user (5 s timeout per request), pausing
    /// `pause` after each answer; a request succeeds when curl does and the body contains `want`.
    pub fn start(pod: &Pod, url: &str, want: &str, pause: Duration) -> Load {
        let (ns, url, want) = (pod.ns.name().to_string(), url.to_string(), want.to_string());
        Load::on(|stop| {
            std::thread::spawn(move || {
                repeat(&stop, pause, || {
                    let out = Command::new("ip")
                        .args(["netns", "exec", &ns, "setpriv"])
                        .arg(format!("--reuid={APP_UID}"))
                        .arg(format!("--regid={APP_UID}"))
                        .args(["--clear-groups", "curl", "-sS", "--max-time", "5", &url])
                        .output()
                        .expect("curl");
                    let body = String::from_utf8_lossy(&out.stdout).into_owned();
                    if out.status.success() && body.contains(&want) {
                        Ok(())
                    } else {
                        Err(body + &String::from_utf8_lossy(&out.stderr))
                    }
                })
            })
        })
    }

    /// Runs `request` from a thread inside `pod`'s namespace, as root (captured like an app's
    /// traffic except to 127.0.0.1), pausing `pause` after each; an `Err` is a failed request.
    pub fn run_in(
        pod: &Pod,
        pause: Duration,
        request: impl FnMut() -> Result<(), String> + Send + 'static,
    ) -> Load {
        Load::on(|stop| pod.ns.spawn(move || repeat(&stop, pause, request)))
    }

    /// A load on the thread `spawn` starts, given the stop flag.
    fn on(
        spawn: impl FnOnce(Arc<AtomicBool>) -> std::thread::JoinHandle<(usize, Vec<String>)>,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = Some(spawn(stop.clone()));
        Load { stop, thread }
    }

    /// Stops after the request under way; returns how many succeeded and the error of each one
    /// that failed.
    pub fn stop(mut self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("stopped once");
        thread.join().expect("load thread")
    }
}

impl Drop for Load {
    /// A test that panics with the load running stops it too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// [`Load`]'s loop: `request`, then `pause`, until `stop`.
fn repeat(
    stop: &AtomicBool,
    pause: Duration,
    mut request: impl FnMut() -> Result<(), String>,
) -> (usize, Vec<String>) {
    let (mut ok, mut failed) = (0usize, Vec::new());
    while !stop.load(Ordering::Relaxed) {
        match request() {
            Ok(()) => ok += 1,
            Err(e) => failed.push(e),
        }
        std::thread::sleep(pause);
    }
    (ok, failed)
}

/// The service the end-to-end tests and the demo call.
pub const HTTPBIN: &str = "httpbin.demo.svc.cluster.local";
/// Its virtual IP (from the test range).
pub const HTTPBIN_VIP: &str = "198.19.0.10";

/// ServiceEntry `httpbin` (VIP, port 80 → 8080, STATIC, selecting `app: httpbin`) and the
/// WorkloadEntry `httpbin-v1` (service account `httpbin`) at `server_ip`.
pub fn httpbin_service(server_ip: &str) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: httpbin, namespace: {NAMESPACE} }}
spec:
  hosts: [{HTTPBIN}]
  addresses: [{HTTPBIN_VIP}]
  ports: [{{ number: 80, name: http, protocol: HTTP, targetPort: 8080 }}]
  location: MESH_INTERNAL
  resolution: STATIC
  workloadSelector: {{ labels: {{ app: httpbin }} }}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{ name: httpbin-v1, namespace: {NAMESPACE} }}
spec:
  address: {server_ip}
  labels: {{ app: httpbin, version: v1 }}
  serviceAccount: httpbin
"#
    )
}

/// A namespace-wide PeerAuthentication STRICT, as a YAML document to append.
pub fn strict_mtls() -> String {
    format!(
        r#"---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{ name: default, namespace: {NAMESPACE} }}
spec:
  mtls: {{ mode: STRICT }}
"#
    )
}

/// A DestinationRule with ISTIO_MUTUAL for httpbin, as a YAML document to append.
pub fn istio_mutual() -> String {
    istio_mutual_for("httpbin", HTTPBIN)
}

/// A DestinationRule `name` with ISTIO_MUTUAL for `host`, as a YAML document to append.
pub fn istio_mutual_for(name: &str, host: &str) -> String {
    format!(
        r#"---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{ name: {name}, namespace: {NAMESPACE} }}
spec:
  host: {host}
  trafficPolicy: {{ tls: {{ mode: ISTIO_MUTUAL }} }}
"#
    )
}

/// The pod-in-a-box config: httpbin, STRICT mTLS, ISTIO_MUTUAL.
pub fn pod_in_a_box_config(server_ip: &str) -> String {
    httpbin_service(server_ip) + &strict_mtls() + &istio_mutual()
}
