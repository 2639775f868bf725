//! Istio's templates and modes beyond the plain sidecar, each driving the real binaries with the
//! arguments and environment Istio's template or tool gives them:
//!
//! - the waypoint template's `proxy waypoint ...` and the gateway template's `proxy router ...`
//!   arguments (real Envoy on loopback);
//! - `status.sidecar.istio.io/port: "0"` in the pod's annotations: no status server, the agent
//!   runs on;
//! - `traffic.sidecar.istio.io/excludeInterfaces`: that interface's addresses leave
//!   `INSTANCE_IPS` (pod in a box, a second interface in the pod);
//! - a dual-stack pod: the status port answers on both families;
//! - the agent as root serving DNS on `:53` (pod in a box): Envoy runs as 1337, gets its
//!   certificate over the SDS socket handed to it, and the agent answers on port 53.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use harness::local::{LocalIstiod, Ports, Unprivileged, agent_env, httpbin_config, start_envoy};
use harness::mesh::{Mesh, NAMESPACE, PROXY_UID, pod_in_a_box_config};
use harness::{Child, assert_eventually, envoy_bin, http_get, netns::sh};
use serde_json::Value;

const SA: &str = "tmpl-sa";

fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// The waypoint template's container arguments, with its values for a `demo` namespace.
fn waypoint_args(subcommand: &str) -> Vec<String> {
    [
        subcommand,
        "waypoint",
        "--domain",
        "demo.svc.cluster.local",
        "--serviceCluster",
        "waypoint.demo",
        "--proxyLogLevel",
        "warning",
        "--proxyComponentLogLevel",
        "misc:error",
        "--log_output_level",
        "default:info",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The waypoint template (`proxy waypoint --domain ... --serviceCluster ...` with
/// `ISTIO_META_*` as it sets them): the bootstrap is a waypoint's (node id `waypoint~`, Delta
/// ADS, the metadata-discovery extension upstream Envoy cannot load, which is all that it
/// rejects), and with that one extension removed real Envoy runs as the waypoint through the
/// agent: istiod-lite sees a `waypoint~` proxy with every type synced.
#[test]
fn waypoint_template_runs_the_waypoint_proxy_type() {
    let Some(envoy) = envoy_bin() else { return };
    let istiod = LocalIstiod::start(&httpbin_config());
    let dir = scratch("wp-");
    let s = dir.path();
    istiod.provision(s, SA);
    let user = Unprivileged::new(s, &envoy);
    let ports = Ports::free();
    let template_env = [
        ("ISTIO_META_SERVICE_ACCOUNT", SA),
        ("ISTIO_META_NODE_NAME", "node"),
        ("PILOT_CERT_PROVIDER", "istiod"),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"),
        ("ISTIO_META_WORKLOAD_NAME", "waypoint"),
        (
            "ISTIO_META_OWNER",
            "kubernetes://apis/apps/v1/namespaces/demo/deployments/waypoint",
        ),
        ("ISTIO_META_MESH_ID", "cluster.local"),
        ("TRUST_DOMAIN", "cluster.local"),
        ("ISTIO_CPU_LIMIT", "1"),
    ];

    let mut cmd = user.command("pilot-agent");
    cmd.args(waypoint_args("bootstrap")).current_dir(s);
    agent_env(&mut cmd, istiod.secure, SA, &ports);
    cmd.envs(template_env);
    let out = cmd.output().expect("pilot-agent bootstrap waypoint");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let mut b: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json");
    let id = b["node"]["id"].as_str().expect("node id").to_string();
    assert!(
        id.starts_with("waypoint~127.0.0.1~local.demo~demo.svc.cluster.local"),
        "{id}"
    );
    assert_eq!(b["node"]["cluster"], "waypoint.demo", "--serviceCluster");
    assert_eq!(
        b["dynamic_resources"]["ads_config"]["api_type"], "DELTA_GRPC",
        "waypoints always use Delta"
    );
    let extensions = b["bootstrap_extensions"].to_string();
    assert!(
        extensions.contains("metadata_discovery") || extensions.contains("BootstrapExtension"),
        "no metadata discovery extension: {extensions}"
    );
    // Upstream Envoy rejects exactly that Istio-only extension.
    let validate = user
        .command("envoy")
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "error",
            "-c",
        ])
        .arg(&file)
        .current_dir(s)
        .output()
        .expect("envoy validate");
    let log = String::from_utf8_lossy(&validate.stderr).into_owned()
        + &String::from_utf8_lossy(&validate.stdout);
    assert!(
        !validate.status.success() && log.contains("istio.workload.BootstrapExtension"),
        "{log}"
    );
    b.as_object_mut()
        .expect("object")
        .remove("bootstrap_extensions");
    let upstream_file = s.join("etc/istio/proxy/envoy-upstream.json");
    std::fs::write(&upstream_file, b.to_string()).expect("write");

    let mut cmd = user.command("pilot-agent");
    cmd.args(waypoint_args("proxy"))
        .arg("--external-envoy")
        .current_dir(s);
    agent_env(&mut cmd, istiod.secure, SA, &ports);
    cmd.envs(template_env);
    let agent = Child::spawn("waypoint-agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let _envoy = start_envoy(&user, &upstream_file, s);
    let syncz = synced(&istiod, "waypoint~", &id);
    assert_eq!(syncz["stream"], "delta");

    assert!(
        // Istio's line layout: the level is the second tab-separated column.
        agent
            .output()
            .iter()
            .all(|l| l.split('\t').nth(1) != Some("error")),
        "{:#?}",
        agent.output()
    );
}

/// The gateway template (`proxy router --domain ... --proxyLogLevel=... ...`): a `router~` node
/// whose bootstrap real Envoy loads as it is, certificate over SDS and every type synced through
/// the agent.
#[test]
fn gateway_template_runs_a_router() {
    let Some(envoy) = envoy_bin() else { return };
    let istiod = LocalIstiod::start(&httpbin_config());
    let dir = scratch("gw-");
    let s = dir.path();
    istiod.provision(s, SA);
    let user = Unprivileged::new(s, &envoy);
    let ports = Ports::free();
    let args = |sub: &str| -> Vec<String> {
        [
            sub,
            "router",
            "--domain",
            "demo.svc.cluster.local",
            "--proxyLogLevel=warning",
            "--proxyComponentLogLevel=misc:error",
            "--log_output_level=default:info",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    // A root flag before the subcommand, its value a separate argument (as cobra takes it).
    let mut cmd = user.command("pilot-agent");
    cmd.args(["--log_output_level", "default:info"])
        .args(args("bootstrap"))
        .current_dir(s);
    agent_env(&mut cmd, istiod.secure, SA, &ports);
    let out = cmd.output().expect("pilot-agent bootstrap router");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let b: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json");
    let id = b["node"]["id"].as_str().expect("node id").to_string();
    assert!(
        id.starts_with("router~127.0.0.1~local.demo~demo.svc.cluster.local"),
        "{id}"
    );

    let mut cmd = user.command("pilot-agent");
    cmd.args(args("proxy"))
        .arg("--external-envoy")
        .current_dir(s);
    agent_env(&mut cmd, istiod.secure, SA, &ports);
    let agent = Child::spawn("gateway-agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let _envoy = start_envoy(&user, &file, s);
    let admin: SocketAddr = format!("127.0.0.1:{}", ports.admin).parse().expect("addr");
    assert_eventually(Duration::from_secs(30), || {
        let (_, certs) = http_get(admin, "/certs")?;
        certs
            .contains(&format!("sa/{SA}"))
            .then_some(())
            .ok_or(format!("no certificate: {certs}"))
    });
    synced(&istiod, "router~", &id);
}

/// Waits until istiod-lite's `/debug/syncz` has the proxy `id` (whose id starts `prefix`) with
/// CDS, EDS, LDS and RDS synced (NDS is the agent's own, sent only with DNS on); returns the row.
fn synced(istiod: &LocalIstiod, prefix: &str, id: &str) -> Value {
    let row = assert_eventually(Duration::from_secs(30), || {
        let (code, body) = http_get(istiod.monitoring, "/debug/syncz")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{code}: {e}"))?;
        let row = v
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["proxy"].as_str().is_some_and(|p| p.starts_with(prefix)))
            .cloned()
            .ok_or_else(|| format!("no {prefix} proxy in {body}"))?;
        let types = row["types"].as_object().cloned().unwrap_or_default();
        let stale: Vec<_> = types
            .iter()
            .filter(|(k, t)| t["status"] != "SYNCED" && k.as_str() != "NDS")
            .map(|(k, t)| format!("{k}={}", t["status"]))
            .collect();
        if types.len() >= 4 && stale.is_empty() {
            Ok(row)
        } else {
            Err(format!("{prefix} not synced: {row}"))
        }
    });
    assert_eq!(row["proxy"].as_str(), Some(id));
    row
}

/// `status.sidecar.istio.io/port: "0"` in the downward-API annotations: the agent logs that
/// there is no status server, listens on no TCP port at all, and keeps serving Envoy its
/// certificate and config.
#[test]
fn status_port_zero_annotation_runs_without_a_status_server() {
    let Some(envoy) = envoy_bin() else { return };
    let istiod = LocalIstiod::start(&httpbin_config());
    let dir = scratch("sp0-");
    let s = dir.path();
    istiod.provision(s, SA);
    harness::local::write_file(
        &s.join("etc/istio/pod/annotations"),
        "status.sidecar.istio.io/port=\"0\"\n",
    );
    let user = Unprivileged::new(s, &envoy);
    let ports = Ports::free();
    let mut cmd = user.command("pilot-agent");
    cmd.args(["bootstrap", "sidecar"]).current_dir(s);
    agent_env(&mut cmd, istiod.secure, SA, &ports);
    let out = cmd.output().expect("bootstrap");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());

    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(s);
    agent_env(&mut cmd, istiod.secure, SA, &ports);
    let mut agent = Child::spawn("agent", cmd);
    agent.wait_for_line("no status server", Duration::from_secs(20));
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let _envoy = start_envoy(&user, &file, s);
    let admin: SocketAddr = format!("127.0.0.1:{}", ports.admin).parse().expect("addr");
    assert_eventually(Duration::from_secs(30), || {
        let (_, certs) = http_get(admin, "/certs")?;
        let (_, clusters) = http_get(admin, "/clusters")?;
        if certs.contains(&format!("sa/{SA}")) && clusters.contains("outbound|80||") {
            Ok(())
        } else {
            Err("no certificate or config yet".to_string())
        }
    });
    assert_eq!(tcp_listeners(agent.id()), 0, "the agent listens on TCP");
    assert!(
        http_get(
            format!("127.0.0.1:{}", ports.status).parse().expect("addr"),
            "/healthz/ready"
        )
        .is_err(),
        "something answers on the configured status port"
    );
    assert!(agent.try_wait().is_none(), "the agent exited");
}

/// TCP sockets in LISTEN state owned by `pid` (its fds against /proc/net/tcp{,6}).
fn tcp_listeners(pid: u32) -> usize {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    ["tcp", "tcp6"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
                .unwrap_or_default()
                .lines()
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.get(3) == Some(&"0A") && cols.get(9).is_some_and(|i| inodes.iter().any(|x| x == i))
        })
        .count()
}

fn mesh_prerequisites() -> bool {
    harness::mesh::prerequisites(&["ip"])
}

fn instance_ips(bootstrap: &Path) -> Vec<String> {
    let b: Value = serde_json::from_str(&std::fs::read_to_string(bootstrap).expect("bootstrap"))
        .expect("json");
    b["node"]["metadata"]["INSTANCE_IPS"]
        .as_str()
        .unwrap_or("")
        .split(',')
        .map(str::to_string)
        .collect()
}

/// `traffic.sidecar.istio.io/excludeInterfaces: net1` (the downward-API annotation the injector
/// keeps): a pod with a second interface `net1` (198.18.77.7, fd00::77:7) keeps its veth
/// address in `INSTANCE_IPS` and loses net1's; without the annotation net1's are there.
#[test]
fn exclude_interfaces_annotation_leaves_instance_ips() {
    if !mesh_prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&pod_in_a_box_config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("exclif", "sleep");
    // A second interface (a veth pair inside the pod: no dummy module on every kernel).
    sh(pod.ns.cmd("ip").args([
        "link", "add", "net1", "type", "veth", "peer", "name", "net1p",
    ]));
    sh(pod.ns.cmd("ip").args(["link", "set", "net1p", "up"]));
    sh(pod
        .ns
        .cmd("ip")
        .args(["addr", "add", "198.18.77.7/32", "dev", "net1"]));
    sh(pod
        .ns
        .cmd("ip")
        .args(["addr", "add", "fd00::77:7/128", "dev", "net1", "nodad"]));
    sh(pod.ns.cmd("ip").args(["link", "set", "net1", "up"]));
    let bootstrap = pod.dir.join("etc/istio/proxy/envoy-rev.json");

    // Without the annotation first: `pilot-agent bootstrap` in the pod's namespace.
    let out = pod
        .ns
        .cmd(mesh.bin("pilot-agent"))
        .args(["bootstrap", "sidecar"])
        .current_dir(&pod.dir)
        .env("INSTANCE_IP", &pod.ip)
        .env("POD_NAMESPACE", NAMESPACE)
        .output()
        .expect("bootstrap");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ips = instance_ips(&bootstrap);
    assert!(ips.contains(&"198.18.77.7".to_string()), "{ips:?}");
    std::fs::remove_file(&bootstrap).expect("rm");

    harness::local::write_file(
        &pod.dir.join("etc/istio/pod/annotations"),
        "traffic.sidecar.istio.io/excludeInterfaces=\"net1\"\n",
    );
    mesh.inject(&mut pod);
    mesh.wait_ready(&pod, Duration::from_secs(30));
    let ips = instance_ips(&bootstrap);
    assert_eq!(ips.first(), Some(&pod.ip), "{ips:?}");
    assert!(
        !ips.iter()
            .any(|ip| ip == "198.18.77.7" || ip == "fd00::77:7"),
        "net1's addresses are still in INSTANCE_IPS: {ips:?}"
    );
}

/// The agent as root with `DNS_PROXY_ADDR=localhost:53` (Istio's `AgentIsRoot`): Envoy runs as
/// 1337:1337, the SDS socket is handed to it (the pod gets ready over mTLS config), and the
/// agent answers DNS for mesh names on port 53.
#[test]
fn agent_as_root_with_dns_on_53_runs_envoy_as_1337() {
    if !mesh_prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&pod_in_a_box_config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("rootdns", "sleep");
    // Istio's template for NET_BIND_SERVICE: runAsUser 0, runAsGroup 1337.
    mesh.inject_as(
        &mut pod,
        (0, PROXY_UID),
        &[("DNS_PROXY_ADDR", "localhost:53".into())],
    );
    mesh.wait_ready(&pod, Duration::from_secs(30));
    let agent = pod.agent.as_ref().expect("agent").id();
    // `ip netns exec` and `setpriv` exec in place: the agent is this pid's descendant.
    let envoy = assert_eventually(Duration::from_secs(10), || {
        descendants(agent)
            .into_iter()
            .find(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "envoy")
            })
            .ok_or("no Envoy process under the agent".to_string())
    });
    let agent_pid = descendants(agent)
        .into_iter()
        .chain([agent])
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "pilot-agent")
        })
        .expect("pilot-agent");
    assert_eq!(ids(agent_pid), (0, PROXY_UID), "the agent runs as 0:1337");
    assert_eq!(ids(envoy), (PROXY_UID, PROXY_UID), "Envoy runs as 1337");
    let socket = pod.dir.join("var/run/secrets/workload-spiffe-uds/socket");
    let meta = std::fs::metadata(&socket).expect("SDS socket");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        PROXY_UID,
        "SDS socket not handed to Envoy"
    );
    // DNS on :53 (as 1337, which the capture rules leave alone), answered from NDS.
    let answer = assert_eventually(Duration::from_secs(10), || {
        let out = pod
            .ns
            .cmd_as(PROXY_UID, PROXY_UID, "dig")
            .args(["+short", "+time=2", "+tries=1", "@127.0.0.1", "-p", "53"])
            .arg(harness::mesh::HTTPBIN)
            .output()
            .map_err(|e| e.to_string())?;
        let a = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if a == harness::mesh::HTTPBIN_VIP {
            Ok(a)
        } else {
            Err(format!("dig @127.0.0.1:53: {a:?}"))
        }
    });
    assert_eq!(answer, harness::mesh::HTTPBIN_VIP);
}

/// Real uid and gid of a process.
fn ids(pid: u32) -> (u32, u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| -> u32 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("id")
    };
    (field("Uid:"), field("Gid:"))
}

/// Every descendant of `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for task in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                out.push(c);
                todo.push(c);
            }
        }
    }
    out
}

/// The interface in `ns` that holds `ip`.
fn dev_with(ns: &harness::Netns, ip: &str) -> String {
    let out = sh(ns.cmd("ip").args(["-o", "addr", "show"]));
    out.lines()
        .find(|l| l.contains(&format!(" {ip}/")))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(|d| d.split('@').next().unwrap_or(d).to_string())
        .unwrap_or_else(|| panic!("no interface with {ip}: {out}"))
}

/// A dual-stack pod (IPv4 and IPv6 on its interface): the kubelet probes the status port on
/// either family, and both answer `/healthz/ready` with 200 once the sidecar is ready.
#[test]
fn dual_stack_pod_answers_status_on_both_families() {
    if !mesh_prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&pod_in_a_box_config("198.18.1.2"));
    mesh.start_istiod();
    let mut pod = mesh.pod("dual", "sleep");
    let (pod_v6, node_v6) = ("fd00::18:1:2", "fd00::18:1:1");
    let pod_dev = dev_with(&pod.ns, &pod.ip);
    let node_dev = dev_with(&mesh.node, &pod.node_ip);
    sh(pod.ns.cmd("ip").args([
        "addr",
        "add",
        &format!("{pod_v6}/112"),
        "dev",
        &pod_dev,
        "nodad",
    ]));
    sh(mesh.node.cmd("ip").args([
        "addr",
        "add",
        &format!("{node_v6}/112"),
        "dev",
        &node_dev,
        "nodad",
    ]));
    mesh.inject(&mut pod);
    mesh.wait_ready(&pod, Duration::from_secs(30));
    for addr in [format!("{}:15020", pod.ip), format!("[{pod_v6}]:15020")] {
        let a: SocketAddr = addr.parse().expect("addr");
        assert_eventually(Duration::from_secs(10), || {
            match mesh.node.run(move || http_get(a, "/healthz/ready")) {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{a}: {other:?}")),
            }
        });
    }
}
