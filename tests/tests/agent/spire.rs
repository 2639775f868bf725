//! Istio's SPIRE contract, driving the binaries as the injected sidecar is run when a SPIFFE
//! Workload API / SDS server (SPIRE's agent, through its CSI driver) already serves the
//! workload identity socket: `WORKLOAD_IDENTITY_SOCKET_FILE` names that socket, pilot-agent
//! leaves it alone, serves file certificates only on
//! `./var/run/secrets/credential-uds/files-socket`, and never calls the CA; Envoy's `sds-grpc`
//! takes `default` and `ROOTCA` from the external server. With no server on a non-default
//! socket, the agent refuses to start and says why.
//!
//! SPIRE itself is not installable here (no registry this machine reaches ships it), so the
//! external server is a second pilot-agent, in its own scratch directory and with its own
//! identity, whose SDS socket is linked in as the "SPIRE" socket: a real SDS server that is
//! not the agent under test, issuing certificates for a different service account.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use harness::local::{LocalIstiod, Ports, Unprivileged, agent_env, httpbin_config, start_envoy};
use harness::{Child, assert_eventually, envoy_bin, http_get};

const SPIRE_SA: &str = "spire-issued";
const AGENT_SA: &str = "own-sa";

fn scratch(prefix: &str) -> tempfile::TempDir {
    // Short paths: the bootstrap's socket paths are relative, Envoy's pipes limited to 108.
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// `pilot-agent bootstrap sidecar` with the agent's environment plus `extra`.
fn bootstrap(
    user: &Unprivileged,
    dir: &Path,
    discovery: SocketAddr,
    ports: &Ports,
    extra: &[(&str, &str)],
) -> Result<std::path::PathBuf, String> {
    let mut cmd = user.command("pilot-agent");
    cmd.args(["bootstrap", "sidecar"]).current_dir(dir);
    agent_env(&mut cmd, discovery, AGENT_SA, ports);
    cmd.envs(extra.iter().copied());
    let out = cmd.output().expect("pilot-agent bootstrap");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().into())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into())
    }
}

#[test]
fn an_external_sds_socket_is_used_and_the_agent_serves_files_only() {
    let Some(envoy) = envoy_bin() else { return };
    let istiod = LocalIstiod::start(&httpbin_config());

    // The stand-in for SPIRE's agent: its SDS socket serves `default` for spire-issued.
    let spire_dir = scratch("spire-");
    let spire = spire_dir.path();
    istiod.provision(spire, SPIRE_SA);
    let spire_user = Unprivileged::new(spire, &envoy);
    let spire_ports = Ports::free();
    let mut cmd = spire_user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(spire);
    agent_env(&mut cmd, istiod.secure, SPIRE_SA, &spire_ports);
    let spire_agent = Child::spawn("spire-stand-in", cmd);
    spire_agent.wait_for_line("agent listeners bound", Duration::from_secs(20));

    // The agent under test: the CSI driver's mount is a link to that socket.
    let dir = scratch("own-");
    let own = dir.path();
    istiod.provision(own, AGENT_SA);
    let uds = own.join("var/run/secrets/workload-spiffe-uds");
    std::fs::create_dir_all(&uds).expect("mkdir");
    std::os::unix::fs::symlink(
        spire.join("var/run/secrets/workload-spiffe-uds/socket"),
        uds.join("spire.sock"),
    )
    .expect("symlink");
    let user = Unprivileged::new(own, &envoy);
    let ports = Ports::free();
    let extra = [("WORKLOAD_IDENTITY_SOCKET_FILE", "spire.sock")];
    let file = bootstrap(&user, own, istiod.secure, &ports, &extra).expect("bootstrap");
    let text = std::fs::read_to_string(&file).expect("bootstrap");
    let b: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(b["node"]["metadata"]["file-credential"], "true");
    let clusters = b["static_resources"]["clusters"]
        .as_array()
        .expect("clusters");
    let pipe = |name: &str| {
        clusters.iter().find(|c| c["name"] == name).map(|c| {
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["pipe"]
                ["path"]
                .clone()
        })
    };
    assert_eq!(
        pipe("sds-grpc"),
        Some("./var/run/secrets/workload-spiffe-uds/spire.sock".into())
    );
    assert_eq!(
        pipe("sds-files-grpc"),
        Some("./var/run/secrets/credential-uds/files-socket".into())
    );

    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(own);
    agent_env(&mut cmd, istiod.secure, AGENT_SA, &ports);
    cmd.envs(extra);
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let files_socket = own.join("var/run/secrets/credential-uds/files-socket");
    assert!(files_socket.exists(), "no file-only SDS socket");
    assert_eq!(
        sds::check_socket(&files_socket, Duration::from_secs(1)).unwrap(),
        sds::SocketCheck::Healthy,
        "the file-only SDS server does not answer"
    );
    assert!(
        uds.join("spire.sock").exists(),
        "the agent removed the external socket"
    );

    let _envoy = start_envoy(&user, &file, own);
    let admin: SocketAddr = format!("127.0.0.1:{}", ports.admin).parse().expect("addr");
    let issued = format!("spiffe://cluster.local/ns/demo/sa/{SPIRE_SA}");
    let certs = assert_eventually(Duration::from_secs(30), || {
        let (status, certs) = http_get(admin, "/certs")?;
        if status == 200 && certs.contains(&issued) {
            Ok(certs)
        } else {
            Err(format!("/certs {status} lacks {issued}: {certs}"))
        }
    });
    assert!(
        !certs.contains(&format!("sa/{AGENT_SA}")),
        "Envoy holds a certificate the agent under test issued: {certs}"
    );
    // Config still flows through the agent's xDS proxy.
    assert_eventually(Duration::from_secs(30), || {
        let (_, clusters) = http_get(admin, "/clusters")?;
        if clusters.contains("outbound|80||httpbin.demo.svc.cluster.local") {
            Ok(())
        } else {
            Err("no httpbin cluster yet".to_string())
        }
    });
    // The agent under test never sent a CSR; the stand-in (same metric) did.
    assert!(
        csrs(spire_ports.status) >= 1.0,
        "the stand-in's CSR count is not visible"
    );
    assert_eq!(
        csrs(ports.status),
        0.0,
        "the agent under test called the CA"
    );
    assert!(
        agent
            .output()
            .iter()
            .any(|l| l.contains("external SDS server") && l.contains("spire.sock")),
        "no log line says the external socket is used: {:#?}",
        agent.output()
    );
}

/// CSRs an agent sent, from `istio_agent_num_outgoing_requests` on its status port.
fn csrs(status_port: u16) -> f64 {
    let status: SocketAddr = format!("127.0.0.1:{status_port}").parse().expect("addr");
    let (code, metrics) = http_get(status, "/stats/prometheus").expect("metrics");
    assert_eq!(code, 200);
    metrics
        .lines()
        .filter(|l| l.starts_with("istio_agent_num_outgoing_requests"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_non_default_socket_file_without_a_server_is_refused() {
    let Some(envoy) = envoy_bin() else { return };
    let dir = scratch("nosock-");
    let user = Unprivileged::new(dir.path(), &envoy);
    let ports = Ports::free();
    let discovery: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(dir.path());
    agent_env(&mut cmd, discovery, AGENT_SA, &ports);
    cmd.env("WORKLOAD_IDENTITY_SOCKET_FILE", "spire.sock");
    let mut agent = Child::spawn("agent", cmd);
    let code = agent
        .wait_timeout(Duration::from_secs(10))
        .expect("the agent kept running");
    assert!(!code.success(), "exit {code}");
    let log = agent.output().join("\n");
    assert!(
        log.contains("non-default SDS socket path")
            && log.contains("var/run/secrets/workload-spiffe-uds/spire.sock"),
        "{log}"
    );
}
