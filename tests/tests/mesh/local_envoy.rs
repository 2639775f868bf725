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

use harness::local::{
    HTTPBIN_HOST, LocalIstiod, Ports, Unprivileged, agent_env, httpbin_config, start_envoy,
    write_bootstrap,
};
use harness::{Child, assert_eventually, envoy_bin, http_get};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

const SERVICE_ACCOUNT: &str = "local-sa";

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

#[test]
fn external_envoy_gets_certificate_over_sds_and_config_over_the_xds_proxy() {
    let Some(envoy) = envoy_bin() else {
        return;
    };
    // Short path: Envoy's bootstrap names the sockets relative to this dir (UDS path limit).
    let scratch_dir = tempfile::Builder::new()
        .prefix("le-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch = scratch_dir.path().to_path_buf();
    // The control plane on loopback, every listener on port 0; token and root certificate at
    // Istio's relative paths in the scratch dir.
    let istiod = LocalIstiod::start(&httpbin_config());
    let (secure, monitoring) = (istiod.secure, istiod.monitoring);
    istiod.provision(&scratch, SERVICE_ACCOUNT);

    // No root needed: when the test runs as root (CI), the agent and Envoy run as an
    // unprivileged user from copies of their binaries inside the scratch dir.
    let user = Unprivileged::new(&scratch, &envoy);

    let ports = Ports::free();

    // `pilot-agent bootstrap` writes the file Envoy is started with.
    let bootstrap = write_bootstrap(&user, &scratch, secure, SERVICE_ACCOUNT, &ports);
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
    agent_env(&mut cmd, secure, SERVICE_ACCOUNT, &ports);
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
    let _envoy = start_envoy(&user, &bootstrap, &scratch);
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
        let want_cluster = format!("outbound|80||{HTTPBIN_HOST}");
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
