//! VM onboarding: a `vm` namespace with no Kubernetes variables, onboarded from the files
//! `istiod-lite vm-bundle` writes (as `istioctl x workload entry configure` does) and started
//! through the systemd unit we ship (`docs/vm/istio.service`): cluster.env as its
//! `EnvironmentFile=`, istio-iptables as root from `ExecStartPre=`, pilot-agent as istio-proxy
//! from `ExecStart=`. An injected client pod reaches the VM's app through a WorkloadEntry and
//! ServiceEntry, over mTLS.

use harness::mesh::vm::{Unit, parse_env_file};
use harness::mesh::{Mesh, NAMESPACE, PROXY_UID};
use harness::{assert_eventually, repo_root, workspace_bin};
use std::process::Command;
use std::time::Duration;

const HOST: &str = "vm-app.demo.svc.cluster.local";
const VIP: &str = "198.19.0.20";

fn unit() -> Unit {
    let path = repo_root().join("docs/vm/istio.service");
    let text = std::fs::read_to_string(&path).expect("docs/vm/istio.service");
    Unit::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn config(vm_ip: &str) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: vm-app, namespace: {NAMESPACE} }}
spec:
  hosts: [{HOST}]
  addresses: [{VIP}]
  ports: [{{ number: 80, name: http, protocol: HTTP, targetPort: 8080 }}]
  location: MESH_INTERNAL
  resolution: STATIC
  workloadSelector: {{ labels: {{ app: vm }} }}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{ name: vm, namespace: {NAMESPACE} }}
spec:
  address: {vm_ip}
  labels: {{ app: vm }}
  serviceAccount: vm-sa
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{ name: default, namespace: {NAMESPACE} }}
spec:
  mtls: {{ mode: STRICT }}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{ name: vm-app, namespace: {NAMESPACE} }}
spec:
  host: {HOST}
  trafficPolicy: {{ tls: {{ mode: ISTIO_MUTUAL }} }}
"#
    )
}

/// The unit has what Istio's VM unit and istio-start.sh have; systemd accepts it.
#[test]
fn systemd_unit_has_istio_vm_settings_and_verifies() {
    let u = unit();
    assert_eq!(u.get("Service", "Restart"), Some("always"));
    assert_eq!(u.get("Service", "RestartSec"), Some("10"));
    assert_eq!(u.get("Service", "TimeoutStopSec"), Some("30s"));
    assert_eq!(u.get("Service", "User"), Some("istio-proxy"));
    assert_eq!(u.get("Service", "WorkingDirectory"), Some("/"));
    assert_eq!(
        u.all("Service", "EnvironmentFile"),
        vec!["/var/lib/istio/envoy/cluster.env"]
    );
    assert_eq!(u.get("Install", "WantedBy"), Some("multi-user.target"));
    let env = u
        .environment("vm-host", |_| Ok(String::new()))
        .expect("unit environment");
    // istio-start.sh's defaults.
    assert_eq!(env["PROV_CERT"], "./etc/certs");
    assert_eq!(env["OUTPUT_CERTS"], "./etc/certs");
    assert_eq!(env["CA_ADDR"], "istiod.istio-system.svc:15012");
    assert_eq!(env["POD_NAME"], "vm-host");
    let pc: serde_json::Value = serde_json::from_str(&env["PROXY_CONFIG"]).expect("JSON");
    assert_eq!(pc["controlPlaneAuthPolicy"], "MUTUAL_TLS");
    // iptables cleanup then apply, as root; the agent as User=.
    let pre = u.exec("ExecStartPre", &env).expect("ExecStartPre");
    assert_eq!(pre.len(), 2);
    assert!(pre.iter().all(|e| e.privileged), "{pre:?}");
    assert_eq!(
        pre[0].argv,
        vec!["/usr/local/bin/istio-iptables", "--cleanup-only"]
    );
    assert_eq!(pre[1].argv, vec!["/usr/local/bin/istio-iptables"]);
    let start = u.exec("ExecStart", &env).expect("ExecStart");
    assert_eq!(start.len(), 1);
    assert!(!start[0].privileged);
    assert_eq!(
        start[0].argv,
        vec!["/usr/local/bin/pilot-agent", "proxy", "sidecar"]
    );
    let stop = u.exec("ExecStopPost", &env).expect("ExecStopPost");
    assert_eq!(
        stop[0].argv,
        vec!["/usr/local/bin/istio-iptables", "--cleanup-only"]
    );

    // systemd's own verdict, when systemd is installed, on a copy whose binaries exist here.
    if harness::prereq::find_bin("systemd-analyze").is_none() {
        eprintln!("systemd-analyze not installed: unit checked by its keys only");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let text =
        std::fs::read_to_string(repo_root().join("docs/vm/istio.service")).expect("unit file");
    let bin_dir = workspace_bin("pilot-agent")
        .parent()
        .expect("target dir")
        .display()
        .to_string();
    let copy = dir.path().join("istio.service");
    std::fs::write(&copy, text.replace("/usr/local/bin", &bin_dir)).expect("write copy");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .current_dir(dir.path())
        .output()
        .expect("systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}{stderr}",
        out.status
    );
}

/// The bundle's cluster.env, read with the unit's EnvironmentFile= rules, drives the agent and
/// istio-iptables; it overrides the unit's defaults.
#[test]
fn cluster_env_from_vm_bundle_reads_back_through_the_unit() {
    let ca = tempfile::tempdir().expect("tempdir");
    let out = tempfile::tempdir().expect("tempdir");
    let status = Command::new(workspace_bin("istiod-lite"))
        .arg("vm-bundle")
        .arg("--ca-dir")
        .arg(ca.path())
        .args(["--namespace", NAMESPACE, "--service-account", "vm-sa"])
        .args(["--name", "vm"])
        .args(["--discovery-address", "istiod.istio-system.svc:15012"])
        .arg("--output")
        .arg(out.path())
        .status()
        .expect("istiod-lite vm-bundle");
    assert!(status.success());
    let text = std::fs::read_to_string(out.path().join("cluster.env")).expect("cluster.env");
    let file = parse_env_file(&text).expect("cluster.env parses");
    let env = unit()
        .environment("vm-host", |p| {
            assert_eq!(p, "/var/lib/istio/envoy/cluster.env");
            Ok(text.clone())
        })
        .expect("unit environment");
    for (k, v) in &file {
        assert_eq!(&env[k], v, "{k}: cluster.env wins over the unit's default");
    }
    assert_eq!(env["SERVICE_ACCOUNT"], "vm-sa");
    assert_eq!(env["POD_NAMESPACE"], NAMESPACE);
    assert_eq!(env["ISTIO_META_DNS_CAPTURE"], "true");
    assert_eq!(env["ISTIO_INBOUND_PORTS"], "*");
    assert_eq!(env["ISTIO_SERVICE_CIDR"], "*");
    assert_eq!(env["ISTIO_LOCAL_EXCLUDE_PORTS"], "22,15090,15021,15020");
    assert_eq!(env["CA_ADDR"], "istiod.istio-system.svc:15012");
    let labels: serde_json::Value =
        serde_json::from_str(&env["ISTIO_METAJSON_LABELS"]).expect("labels are JSON");
    assert_eq!(labels["app"], "vm");
    let mesh = std::fs::read_to_string(out.path().join("mesh.yaml")).expect("mesh.yaml");
    assert!(
        mesh.contains("discoveryAddress: istiod.istio-system.svc:15012"),
        "{mesh}"
    );
    // No Kubernetes anywhere.
    assert!(env.keys().all(|k| !k.starts_with("KUBERNETES_")), "{env:?}");
}

fn prerequisites() -> bool {
    harness::mesh::prerequisites(&["hostname"])
}

#[test]
fn client_pod_reaches_the_vm_app_over_mtls_through_a_workload_entry() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.1.2"));
    mesh.start_istiod();
    let mut vm = mesh.pod("vm", "vm-sa");
    assert_eq!(vm.ip, "198.18.1.2");
    mesh.start_app(&mut vm, "0.0.0.0:8080", "vm");

    let bundle = mesh.vm_bundle(&vm, "vm");
    let u = unit();
    let started = mesh.start_vm(&mut vm, &bundle, &u);
    assert!(
        started.env.keys().all(|k| !k.starts_with("KUBERNETES_")),
        "no Kubernetes variables: {:?}",
        started.env
    );
    let mut client = mesh.pod("client", "sleep");
    mesh.inject(&mut client);
    mesh.wait_ready(&vm, Duration::from_secs(30));
    mesh.wait_ready(&client, Duration::from_secs(30));

    // The agent runs as istio-proxy (1337), as the unit's User= says.
    let pid = vm.agent.as_ref().expect("agent").id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line");
    assert!(
        uid_line.split_whitespace().nth(1) == Some(&PROXY_UID.to_string()),
        "agent not running as {PROXY_UID}: {uid_line}"
    );

    // The client's request: DNS from its agent, captured, mTLS to the VM's Envoy, captured
    // inbound on the VM (istio-iptables driven by cluster.env), delivered to the VM's app.
    let body = assert_eventually(Duration::from_secs(20), || {
        let (ok, out) = client.curl(&format!("http://{HOST}/"));
        if ok && out.contains("hello from vm") {
            Ok(out)
        } else {
            Err(out)
        }
    });
    assert!(body.contains("hello from vm"), "{body}");

    // The VM's Envoy holds the VM service account's SPIFFE certificate, over SDS; the client's
    // Envoy opened connections to the VM's WorkloadEntry endpoint.
    let (status, certs) = vm.envoy_admin("/certs").expect("VM /certs");
    assert_eq!(status, 200);
    let want = format!("spiffe://cluster.local/ns/{NAMESPACE}/sa/vm-sa");
    assert!(certs.contains(&want), "VM /certs lacks {want}: {certs}");
    let (_, clusters) = client.envoy_admin("/clusters").expect("client /clusters");
    let cx: u64 = clusters
        .lines()
        .filter(|l| l.starts_with(&format!("outbound|80||{HOST}::198.18.1.2:8080::cx_total::")))
        .filter_map(|l| l.rsplit("::").next()?.parse::<u64>().ok())
        .sum();
    assert!(cx > 0, "no connection to the VM endpoint: {clusters}");

    // OUTPUT_CERTS=./etc/certs (the unit's default, as istio-start.sh): the workload
    // certificate is also written next to the root, for apps on the VM.
    let chain = assert_eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(vm.dir.join("etc/certs/cert-chain.pem"))
            .map_err(|e| format!("etc/certs/cert-chain.pem: {e}"))
            .and_then(|c| {
                if c.contains("BEGIN CERTIFICATE") {
                    Ok(c)
                } else {
                    Err(format!("no PEM: {c:?}"))
                }
            })
    });
    assert!(!chain.is_empty());
    assert!(vm.dir.join("etc/certs/key.pem").is_file(), "key.pem");

    // cluster.env's ISTIO_META_DNS_CAPTURE drives both the VM's iptables and its agent's DNS.
    let answer = assert_eventually(Duration::from_secs(10), || {
        let a = vm.dig(HOST);
        if a.trim() == VIP {
            Ok(a)
        } else {
            Err(format!("VM dig {HOST}: {a:?}"))
        }
    });
    assert_eq!(answer.trim(), VIP);

    // STRICT: plaintext from a namespace without a sidecar does not reach the VM's app.
    let outsider = mesh.pod("outsider", "default");
    let (ok, out) = outsider.curl("http://198.18.1.2:8080/");
    assert!(
        !ok || !out.contains("hello from"),
        "plaintext request got through STRICT mTLS: {out}"
    );

    // `systemctl stop`: SIGTERM, the agent drains and exits 0 within TimeoutStopSec=, then
    // ExecStopPost= removes the capture rules.
    let nat = |vm: &harness::mesh::Pod| {
        let out = vm
            .ns
            .cmd("iptables-save")
            .args(["-t", "nat"])
            .output()
            .expect("iptables-save");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(nat(&vm).contains("ISTIO_REDIRECT"), "capture installed");
    let exit = mesh.stop_vm(&mut vm, &u, &started);
    assert!(
        exit.is_some_and(|s| s.success()),
        "agent did not exit 0 within TimeoutStopSec: {exit:?}"
    );
    let rules = nat(&vm);
    assert!(
        !rules.contains("ISTIO_"),
        "ExecStopPost left rules: {rules}"
    );
}
