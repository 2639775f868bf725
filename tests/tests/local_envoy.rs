//! Local Envoy with a file bootstrap: no namespaces, no root. `istiod-lite` on 127.0.0.1 (port 0
//! listeners), `pilot-agent proxy --external-envoy` in a scratch directory holding the token and
//! root certificate at Istio's relative paths, `pilot-agent bootstrap` writes Envoy's bootstrap,
//! and the test starts Envoy itself with `envoy -c <file>`. Envoy must get its certificate over
//! the agent's SDS socket and its config over the agent's xDS proxy.
//!
//! Every port the agent and the bootstrap would take on the host's loopback (status 15020, admin
//! 15000, Envoy's 15021 and 15090) is moved to a free one through the agent's own config
//! (`PROXY_CONFIG` statusPort/proxyAdminPort, `ENVOY_STATUS_PORT`, `ENVOY_PROMETHEUS_PORT`), so
//! the test can run beside others. The DNS proxy stays off (no `ISTIO_META_DNS_CAPTURE`).

use harness::{Child, assert_eventually, envoy_bin, http_get, workspace_bin};
use serde_json::Value;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const HOST: &str = "httpbin.demo.svc.cluster.local";
const SERVICE_ACCOUNT: &str = "local-sa";

fn config_yaml() -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: httpbin, namespace: demo }}
spec:
  hosts: [{HOST}]
  addresses: [198.19.0.10]
  ports: [{{ number: 80, name: http, protocol: HTTP, targetPort: 8080 }}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{{ address: 198.18.0.5 }}]
"#
    )
}

/// Runs the agent and Envoy without privileges: as uid 1000 when the test itself is root.
struct Unprivileged {
    bins: Option<PathBuf>,
    envoy: PathBuf,
}

const USER_UID: u32 = 1000;

impl Unprivileged {
    fn new(scratch: &Path, envoy: &Path) -> Unprivileged {
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
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{USER_UID}:{USER_UID}"))
            .arg(scratch)
            .status()
            .expect("chown");
        assert!(status.success(), "chown {}", scratch.display());
        Unprivileged {
            bins: Some(bins),
            envoy: envoy.to_path_buf(),
        }
    }

    fn command(&self, name: &str) -> Command {
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
fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// The address in `istiod-lite`'s `listening name=<name> addr=<ip:port>` line.
fn listen_addr(child: &Child, name: &str) -> SocketAddr {
    let line = child.wait_for_line(&format!("listening name={name} "), Duration::from_secs(30));
    line.split("addr=")
        .nth(1)
        .and_then(|a| a.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

struct Ports {
    status: u16,
    admin: u16,
    envoy_status: u16,
    envoy_prometheus: u16,
}

/// The agent's environment: the same for `bootstrap` and `proxy`, no Kubernetes at all.
fn agent_env(cmd: &mut Command, discovery: SocketAddr, ports: &Ports) {
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("ISTIO_AGENT_EXTERNAL_ENVOY", "true")
        .env("POD_NAME", "local")
        .env("POD_NAMESPACE", "demo")
        .env("INSTANCE_IP", "127.0.0.1")
        .env("SERVICE_ACCOUNT", SERVICE_ACCOUNT)
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

fn config_dump_names(dump: &Value, type_suffix: &str, list: &str, path: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for section in dump["configs"].as_array().into_iter().flatten() {
        if !section["@type"]
            .as_str()
            .is_some_and(|t| t.ends_with(type_suffix))
        {
            continue;
        }
        for item in section[list].as_array().into_iter().flatten() {
            let mut v = item;
            for p in path {
                v = &v[*p];
            }
            if let Some(s) = v.as_str() {
                out.push(s.to_string());
            }
        }
    }
    out
}

fn write_file(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, contents).expect("write");
}

#[test]
fn external_envoy_gets_certificate_over_sds_and_config_over_the_xds_proxy() {
    let Some(envoy) = envoy_bin() else {
        return;
    };
    let cfg = tempfile::tempdir().expect("tempdir");
    let ca = tempfile::tempdir().expect("tempdir");
    // Short path: Envoy's bootstrap names the sockets relative to this dir (UDS path limit).
    let scratch_dir = tempfile::Builder::new()
        .prefix("le-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch = scratch_dir.path().to_path_buf();
    write_file(&cfg.path().join("mesh.yaml"), &config_yaml());

    // The control plane on loopback, every listener on port 0.
    let mut cmd = Command::new(workspace_bin("istiod-lite"));
    cmd.arg("serve")
        .arg("--config-dir")
        .arg(cfg.path())
        .arg("--ca-dir")
        .arg(ca.path())
        .args(["--grpc-addr", "127.0.0.1:0"])
        .args(["--secure-grpc-addr", "127.0.0.1:0"])
        .args(["--monitoring-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    let istiod = Child::spawn("istiod-lite", cmd);
    let secure = listen_addr(&istiod, "secure-grpc");
    let monitoring = listen_addr(&istiod, "monitoring");
    assert_eventually(Duration::from_secs(20), || {
        match http_get(monitoring, "/ready") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("/ready: {other:?}")),
        }
    });

    // Token and root certificate at Istio's relative paths in the scratch dir.
    let token = Command::new(workspace_bin("istiod-lite"))
        .arg("token")
        .arg("--ca-dir")
        .arg(ca.path())
        .args(["--namespace", "demo", "--service-account", SERVICE_ACCOUNT])
        .output()
        .expect("istiod-lite token");
    assert!(token.status.success(), "istiod-lite token failed");
    write_file(
        &scratch.join("var/run/secrets/tokens/istio-token"),
        String::from_utf8_lossy(&token.stdout).trim(),
    );
    write_file(
        &scratch.join("var/run/secrets/istio/root-cert.pem"),
        &std::fs::read_to_string(ca.path().join("root-cert.pem")).expect("CA root"),
    );

    // No root needed: when the test runs as root (CI), the agent and Envoy run as an
    // unprivileged user from copies of their binaries inside the scratch dir.
    let user = Unprivileged::new(&scratch, &envoy);

    let ports = Ports {
        status: free_port(),
        admin: free_port(),
        envoy_status: free_port(),
        envoy_prometheus: free_port(),
    };

    // `pilot-agent bootstrap` writes the file Envoy is started with.
    let mut cmd = user.command("pilot-agent");
    cmd.args(["bootstrap", "sidecar"]).current_dir(&scratch);
    agent_env(&mut cmd, secure, &ports);
    let out = cmd.output().expect("pilot-agent bootstrap");
    assert!(
        out.status.success(),
        "pilot-agent bootstrap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bootstrap = PathBuf::from(&printed);
    assert_eq!(
        bootstrap,
        scratch.join("etc/istio/proxy/envoy-rev.json"),
        "bootstrap written at Istio's path"
    );
    let b: Value =
        serde_json::from_str(&std::fs::read_to_string(&bootstrap).expect("read bootstrap"))
            .expect("bootstrap is JSON");
    assert_eq!(
        b["admin"]["address"]["socket_address"]["port_value"], ports.admin,
        "proxyAdminPort from PROXY_CONFIG"
    );

    // The agent, without launching Envoy.
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(&scratch);
    agent_env(&mut cmd, secure, &ports);
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.id())).expect("status");
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .expect("Uid line")
        .to_string();
    assert_ne!(uid, "0", "the agent must not need root");
    assert!(
        !agent.output().iter().any(|l| l.contains("starting Envoy")),
        "the agent launched Envoy despite --external-envoy"
    );

    // The test starts Envoy itself, from the scratch dir (the bootstrap's socket paths are
    // Istio's relative ones).
    let mut cmd = user.command("envoy");
    cmd.arg("-c")
        .arg(&bootstrap)
        .args(["--disable-hot-restart", "--log-level", "warning"])
        .args(["--concurrency", "1", "--allow-unknown-static-fields"])
        .current_dir(&scratch);
    let _envoy = Child::spawn("envoy", cmd);
    let admin: SocketAddr = format!("127.0.0.1:{}", ports.admin).parse().expect("addr");

    // Certificate over SDS: the SPIFFE id of the token's service account.
    let want = format!("spiffe://cluster.local/ns/demo/sa/{SERVICE_ACCOUNT}");
    assert_eventually(Duration::from_secs(30), || {
        let (status, certs) = http_get(admin, "/certs")?;
        if status == 200 && certs.contains(&want) {
            Ok(())
        } else {
            Err(format!("/certs {status} lacks {want}: {certs}"))
        }
    });

    // Config over the xDS proxy: istiod-lite's listeners and clusters.
    assert_eventually(Duration::from_secs(30), || {
        let (status, body) = http_get(admin, "/config_dump")?;
        if status != 200 {
            return Err(format!("/config_dump {status}"));
        }
        let dump: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let listeners =
            config_dump_names(&dump, "ListenersConfigDump", "dynamic_listeners", &["name"]);
        let clusters = config_dump_names(
            &dump,
            "ClustersConfigDump",
            "dynamic_active_clusters",
            &["cluster", "name"],
        );
        let want_cluster = format!("outbound|80||{HOST}");
        // INTERCEPTION_MODE NONE: the virtual listeners do not take 15001/15006 on the host.
        let unbound = dump.to_string().matches(r#""bind_to_port":false"#).count();
        if unbound < 2 {
            return Err(format!(
                "virtual listeners should not bind: {unbound} unbound"
            ));
        }
        if listeners.iter().any(|l| l == "virtualOutbound")
            && listeners.iter().any(|l| l == "virtualInbound")
            && clusters.contains(&want_cluster)
        {
            Ok(())
        } else {
            Err(format!("listeners {listeners:?}, clusters {clusters:?}"))
        }
    });

    // Envoy's health listener reaches the agent's status server on the moved port.
    let ready: SocketAddr = format!("127.0.0.1:{}", ports.envoy_status)
        .parse()
        .expect("addr");
    assert_eventually(Duration::from_secs(20), || {
        match http_get(ready, "/healthz/ready") {
            Ok((200, _)) => Ok(()),
            other => Err(format!(
                "Envoy :{} /healthz/ready: {other:?}",
                ports.envoy_status
            )),
        }
    });

    // The connection istiod-lite sees is the agent's, with the node id the agent built.
    let (_, syncz) = http_get(monitoring, "/debug/syncz").expect("/debug/syncz");
    assert!(
        syncz.contains("sidecar~127.0.0.1~local.demo~demo.svc.cluster.local"),
        "{syncz}"
    );
}
