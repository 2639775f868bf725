//! A kubelet for the tests: runs a pod spec exactly as Istio's injector emits it (a `Pod`, or a
//! workload's template) with the kubelet's and the container runtime's semantics, against the
//! istiod-lite of a [`Mesh`] node. No API server and no scheduler: one node, the pods this
//! process starts, the Services the test gives istiod-lite.
//!
//! - [`spec`]: the Pod API subset honoured, parsed strictly (an unknown field is an error).
//! - [`volumes`]: emptyDir, configMap, downwardAPI, projected (service-account token), CSI
//!   (`csi.spiffe.io`), in the kubelet's layouts, owners and modes.
//! - [`container`]: a container as containerd + runc make it (namespaces, overlay root, mounts,
//!   read-only root, capabilities, `no_new_privs`, open-file limit, uid/gid).
//! - `container_spec`: the env, command, identity and mounts of each container.
//! - [`probe`]: probes and lifecycle handlers (httpGet, tcpSocket, exec); `prober`: the
//!   probe workers.
//! - [`pod`]: start order (init, native sidecars, apps), probes, termination order.
//!
//! The node: istiod-lite on the node namespace, reachable from pods at
//! `istiod.istio-system.svc` through the cluster DNS (dnsmasq at [`CLUSTER_DNS`] on the node),
//! as a Service name resolves in a cluster.

pub mod container;
mod container_spec;
pub mod pod;
pub mod probe;
mod prober;
pub mod spec;
pub mod volumes;

pub(crate) use volumes::utc_stamp;

use crate::mesh::Mesh;
use crate::process::{Child, repo_root};
use pod::{Node, Pod, Sandbox};
use spec::PodManifest;
use std::path::PathBuf;
use std::time::Duration;

/// The cluster DNS service address (kube-dns), on the node.
pub const CLUSTER_DNS: &str = "198.19.255.10";
/// istiod's Service address, on the node.
pub const ISTIOD_IP: &str = "198.19.255.1";

/// What the runner needs beyond the mesh's: dnsmasq (the cluster DNS), perl (the `job` spec's
/// app) and mount.
pub fn prerequisites() -> bool {
    crate::mesh::prerequisites(&["dnsmasq", "perl", "mount"])
}

/// Istio's injected specs (`../shared/conformance/istio-inject/`), when present; when absent,
/// says so (a failure under `CI=true`).
pub fn shared_specs_dir() -> Option<PathBuf> {
    crate::conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-inject")
}

/// A one-node cluster: a [`Mesh`] node with istiod-lite, the cluster DNS, and the kubelet.
pub struct Cluster {
    pub mesh: Mesh,
    dns: Option<Child>,
    spire: Option<(Child, PathBuf)>,
    /// Extra arguments for the test app of a container (by container name).
    pub app_extra_args: std::collections::BTreeMap<String, Vec<String>>,
    extra_hosts: Vec<(String, String)>,
    pods: u32,
}

impl Cluster {
    /// Starts istiod-lite with `config_yaml` and the cluster DNS.
    pub fn start(config_yaml: &str) -> Cluster {
        Cluster::start_with(config_yaml, &[])
    }

    /// [`Cluster::start`] with extra DNS names in istiod's serving certificate (as istiod's
    /// certificate carries the names of the Services in front of it).
    pub fn start_with(config_yaml: &str, sans: &[&str]) -> Cluster {
        let mut mesh = Mesh::new(config_yaml);
        std::fs::copy(crate::workspace_bin("pod-app"), mesh.bin("pod-app")).expect("copy pod-app");
        mesh.node.add_lo_addr(&format!("{ISTIOD_IP}/32"));
        mesh.node.add_lo_addr(&format!("{CLUSTER_DNS}/32"));
        let extra: Vec<String> = sans
            .iter()
            .flat_map(|s| ["--san".to_string(), s.to_string()])
            .collect();
        mesh.start_istiod_with(&extra);
        let mut c = Cluster {
            mesh,
            dns: None,
            spire: None,
            app_extra_args: Default::default(),
            extra_hosts: Vec::new(),
            pods: 0,
        };
        c.restart_dns();
        c
    }

    /// Starts a stand-in for SPIRE's node agent, whose Workload API socket the
    /// `csi.spiffe.io` CSI driver mounts into pods: a second pilot-agent (no Envoy) on the
    /// node, as uid 1337, serving SDS for `default/default` on `<dir>/socket`. SPIRE itself is
    /// not installable here; what the pod's agent sees is the same: a live SDS server on the
    /// socket it must leave alone.
    pub fn start_spire(&mut self) {
        let dir = self.mesh.root.path().join("spire");
        let token = (self.node().token)("default", "default", "istio-ca", 43200).expect("token");
        for (rel, data) in [
            ("var/run/secrets/tokens/istio-token", token),
            (
                "var/run/secrets/istio/root-cert.pem",
                std::fs::read_to_string(self.mesh.ca_dir().join("root-cert.pem")).expect("root"),
            ),
        ] {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, data).expect("write");
        }
        let hosts = PathBuf::from("/etc/netns").join(self.mesh.node.name());
        std::fs::create_dir_all(&hosts).expect("mkdir /etc/netns/<node>");
        std::fs::write(
            hosts.join("hosts"),
            format!("127.0.0.1 localhost\n{ISTIOD_IP} istiod.istio-system.svc\n"),
        )
        .expect("hosts");
        std::process::Command::new("chown")
            .arg("-R")
            .arg("1337:1337")
            .arg(&dir)
            .status()
            .expect("chown");
        let mut cmd = self
            .mesh
            .node
            .cmd_as(1337, 1337, self.mesh.bin("pilot-agent"));
        cmd.args(["proxy", "sidecar", "--external-envoy", "--domain", "default.svc.cluster.local"])
            .current_dir(&dir)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("PILOT_CERT_PROVIDER", "istiod")
            .env("CA_ADDR", "istiod.istio-system.svc:15012")
            .env("POD_NAME", "spire-agent-stand-in")
            .env("POD_NAMESPACE", "default")
            .env("SERVICE_ACCOUNT", "default")
            .env("INSTANCE_IP", ISTIOD_IP)
            .env("PROXY_CONFIG", r#"{"discoveryAddress":"istiod.istio-system.svc:15012","statusPort":15030,"proxyAdminPort":15031}"#)
            .env("RUST_LOG", "info");
        let child = Child::spawn("spire-stand-in", cmd);
        child.wait_for_line("agent listeners bound", Duration::from_secs(30));
        self.spire = Some((child, dir.join("var/run/secrets/workload-spiffe-uds")));
    }

    /// A Service `name.namespace` with a ClusterIP: its name in the cluster DNS, and the
    /// node's NAT from `cluster_ip:port` to `target` (as kube-proxy programs it).
    pub fn add_service(
        &mut self,
        name: &str,
        namespace: &str,
        cluster_ip: &str,
        port: u16,
        target: &str,
    ) {
        crate::netns::sh(self.mesh.node.cmd("iptables").args([
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            cluster_ip,
            "-p",
            "tcp",
            "--dport",
            &port.to_string(),
            "-j",
            "DNAT",
            "--to-destination",
            target,
        ]));
        self.add_dns(&format!("{name}.{namespace}.svc.cluster.local"), cluster_ip);
    }

    /// Adds a name to the cluster DNS (a Service's ClusterIP).
    pub fn add_dns(&mut self, name: &str, ip: &str) {
        self.extra_hosts.push((name.into(), ip.into()));
        self.restart_dns();
    }

    fn restart_dns(&mut self) {
        self.dns = None;
        let mut cmd = self.mesh.node.cmd("dnsmasq");
        cmd.args([
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
        ])
        .args(["--user=root", "--pid-file", "--log-facility=-"])
        .arg(format!("--listen-address={CLUSTER_DNS}"))
        .arg(format!("--address=/istiod.istio-system.svc/{ISTIOD_IP}"))
        .arg("--local=/cluster.local/");
        for (name, ip) in &self.extra_hosts {
            cmd.arg(format!("--host-record={name},{ip}"));
        }
        self.dns = Some(Child::spawn("kube-dns", cmd));
        let node = &self.mesh.node;
        crate::assert_eventually(Duration::from_secs(10), || {
            let out = node
                .cmd("dig")
                .args([
                    "+short",
                    "+time=1",
                    "+tries=1",
                    &format!("@{CLUSTER_DNS}"),
                    "istiod.istio-system.svc",
                ])
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text.trim() == ISTIOD_IP {
                Ok(())
            } else {
                Err(format!("kube-dns: {text:?}"))
            }
        });
    }

    /// A cluster ready for `m`: the SPIRE stand-in when a volume uses `csi.spiffe.io`, and,
    /// when the pod's `proxy.istio.io/config` points the proxy at another discovery address, a
    /// Service of that name in front of istiod (whose certificate then carries the name).
    pub fn for_spec(config_yaml: &str, m: &PodManifest) -> Cluster {
        let discovery = m
            .metadata
            .annotations
            .get("proxy.istio.io/config")
            .and_then(|c| serde_yaml::from_str::<serde_yaml::Value>(c).ok())
            .and_then(|c| c.get("discoveryAddress")?.as_str().map(String::from))
            .and_then(|a| {
                let (host, port) = a.rsplit_once(':')?;
                Some((host.to_string(), port.parse::<u16>().ok()?))
            })
            .filter(|(h, _)| !h.starts_with("istiod."));
        let sans: Vec<&str> = discovery.iter().map(|(h, _)| h.as_str()).collect();
        let mut c = Cluster::start_with(config_yaml, &sans);
        if let Some((host, port)) = &discovery {
            let short = host.split('.').next().unwrap_or(host);
            c.add_service(
                short,
                m.namespace(),
                "198.19.1.1",
                *port,
                &format!("{ISTIOD_IP}:15012"),
            );
        }
        if m.spec
            .volumes
            .iter()
            .any(|v| v.csi.as_ref().is_some_and(|c| c.driver == "csi.spiffe.io"))
        {
            c.start_spire();
        }
        c
    }

    /// The node as the kubelet sees it.
    pub fn node(&self) -> Node {
        let ca = self.mesh.ca_dir();
        let bin = self.mesh.bin("istiod-lite");
        let template =
            repo_root().join("../shared/conformance/istio-bootstrap/envoy_bootstrap.json");
        Node {
            ns_name: self.mesh.node.name().to_string(),
            kubelet_bin: crate::workspace_bin("kubelet"),
            bin_dir: self.mesh.bin("x").parent().expect("bin").to_path_buf(),
            bootstrap_template: template.is_file().then_some(template),
            node_name: "node-1".into(),
            root_cert: std::fs::read_to_string(ca.join("root-cert.pem")).expect("istiod-lite root"),
            token: Box::new(move |ns, sa, aud, ttl| {
                let out = std::process::Command::new(&bin)
                    .arg("token")
                    .arg("--ca-dir")
                    .arg(&ca)
                    .args([
                        "--namespace",
                        ns,
                        "--service-account",
                        sa,
                        "--audience",
                        aud,
                    ])
                    .args(["--ttl", &format!("{ttl}s")])
                    .output()
                    .map_err(|e| format!("istiod-lite token: {e}"))?;
                if out.status.success() {
                    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
                } else {
                    Err(format!(
                        "istiod-lite token: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ))
                }
            }),
            cluster_dns: CLUSTER_DNS.into(),
            spire_dir: self.spire.as_ref().map(|(_, d)| d.clone()),
            app_extra_args: self.app_extra_args.clone(),
        }
    }

    /// Runs a pod: its sandbox on the node's network, then its containers in the kubelet's
    /// order (see [`Pod::start`]).
    pub fn run(&mut self, manifest: PodManifest) -> Result<Pod, String> {
        self.pods += 1;
        let hint = manifest.workload.clone();
        let (ns, ip, host_ip) = self.mesh.pod_network(&hint);
        let dir = self
            .mesh
            .root
            .path()
            .join("pods")
            .join(format!("{}-{}", hint, self.pods));
        let node = self.node();
        Pod::start(&node, manifest, Sandbox { ns, ip, host_ip }, dir)
    }

    /// Reads a spec file and runs it.
    pub fn run_file(&mut self, path: &std::path::Path) -> Result<Pod, String> {
        let yaml = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let m = PodManifest::parse(&yaml).map_err(|e| format!("{}: {e}", path.display()))?;
        self.run(m)
    }
}

/// The workload identity Istio's proxy in `pod` must hold.
pub fn spiffe_id(pod: &Pod) -> String {
    format!(
        "spiffe://cluster.local/ns/{}/sa/{}",
        pod.manifest.namespace(),
        pod.manifest.service_account()
    )
}

/// Checks that the pod's Istio proxy got its workload certificate: in Envoy (its admin's
/// `/certs`), or, for a proxyless pod (`OUTPUT_CERTS` and no Envoy), in the files the agent
/// writes for the app. A pod without Istio's proxy passes.
pub fn check_identity(pod: &Pod) -> Result<String, String> {
    let proxy = pod
        .manifest
        .all_containers()
        .find(|c| c.name == "istio-proxy");
    let Some(proxy) = proxy else {
        return Ok("no istio-proxy".into());
    };
    let env = |k: &str| {
        proxy
            .env
            .iter()
            .find(|e| e.name == k)
            .and_then(|e| e.value.clone())
    };
    let id = spiffe_id(pod);
    if env("DISABLE_ENVOY").as_deref() == Some("true") {
        let dir = env("OUTPUT_CERTS").unwrap_or_else(|| "/etc/certs".into());
        let (code, out) = pod.exec("istio-proxy", &["cat", &format!("{dir}/cert-chain.pem")])?;
        if code != 0 || !out.contains("BEGIN CERTIFICATE") {
            return Err(format!("no certificate in {dir}/cert-chain.pem: {out}"));
        }
        return Ok(format!("certificate written to {dir}"));
    }
    let addr: std::net::SocketAddr = "127.0.0.1:15000".parse().expect("addr");
    crate::assert_eventually_result(Duration::from_secs(20), || {
        let certs = pod
            .sandbox
            .ns
            .run(move || crate::http_get(addr, "/certs"))?;
        if certs.0 == 200 && certs.1.contains(&id) {
            Ok(format!("Envoy holds {id}"))
        } else {
            Err(format!("Envoy's /certs has no {id}: {certs:?}"))
        }
    })
}

/// Runs the spec at `path` to its end, as `kubelet run` does: ready (or, for a Job's pod, its
/// app containers completed with exit 0), the proxy's identity checked, healthy for `hold`,
/// then terminated; every container must exit within the grace period. Returns a summary.
pub fn run_to_end(
    cluster: &mut Cluster,
    path: &std::path::Path,
    hold: Duration,
) -> Result<String, String> {
    let mut pod = cluster.run_file(path)?;
    let job = pod
        .manifest
        .spec
        .restart_policy
        .as_deref()
        .is_some_and(|p| p != "Always");
    let mut summary = Vec::new();
    if job {
        let codes = pod.wait_apps_completed(Duration::from_secs(120))?;
        if let Some((name, code)) = codes.iter().find(|(_, c)| *c != 0) {
            return Err(format!("container {name:?} exited {code}"));
        }
        summary.push(format!("completed {codes:?}"));
    } else {
        let ready = pod.wait_ready(Duration::from_secs(120))?;
        summary.push(format!("ready after {:.2} s", ready.as_secs_f64()));
        summary.push(check_identity(&pod)?);
        pod.stay_healthy(hold)?;
        summary.push(format!("healthy for {:.0} s", hold.as_secs_f64()));
    }
    let ended = pod.terminate();
    if let Some(e) = ended.iter().find(|e| e.killed) {
        return Err(format!(
            "container {:?} was still running at the end of the grace period",
            e.name
        ));
    }
    let last = ended.iter().map(|e| e.after).max().unwrap_or_default();
    summary.push(format!(
        "terminated in {:.2} s ({})",
        last.as_secs_f64(),
        ended
            .iter()
            .map(|e| format!(
                "{}: exit {}",
                e.name,
                e.code.map_or("?".into(), |c| c.to_string())
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(summary.join("; "))
}
