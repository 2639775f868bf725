//! VM onboarding in the box: a `vm` namespace with no Kubernetes variables, onboarded from the
//! files `istiod-lite vm-bundle` writes (as `istioctl x workload entry configure` does) and
//! started through the unit and start script we ship (`docs/vm/`): istio-start.sh reads
//! cluster.env, installs the capture as root and runs pilot-agent as istio-proxy. An injected
//! client pod reaches the VM's app through a WorkloadEntry and ServiceEntry, over mTLS. The
//! unit, the script and the package on a VM with a real systemd are the `vm` test binary's.

use harness::mesh::vm::Unit;
use harness::mesh::{Mesh, NAMESPACE, PROXY_UID};
use harness::{assert_eventually, repo_root};
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
