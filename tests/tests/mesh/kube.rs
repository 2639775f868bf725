//! Pod in a box fed Kubernetes YAML: the config dir holds what `kubectl get
//! svc,endpointslices,pods -o yaml` writes (a `kind: List` file and a multi-document file)
//! instead of ServiceEntries. The client pod reaches the server by the Service's short names
//! through the agent's DNS proxy (answering from istiod-lite's NDS) and Envoy (auto mTLS from
//! the Pod's `security.istio.io/tlsMode` label, the server STRICT), a headless Service resolves to its pods'
//! addresses, and a bad document is reported while the rest of the directory loads.

use harness::assert_eventually;
use harness::mesh::{Mesh, NAMESPACE};
use std::time::Duration;

/// The Service's cluster IP (test range).
const CLUSTER_IP: &str = "198.19.0.20";
const SERVER_IP: &str = "198.18.2.2";
const SERVER2_IP: &str = "198.18.3.2";

/// `kubectl get svc,endpointslices -o yaml`: the Service `httpbin` and its EndpointSlice.
fn list_yaml() -> String {
    format!(
        r#"apiVersion: v1
kind: List
metadata: {{resourceVersion: ""}}
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: httpbin
    namespace: {NAMESPACE}
    labels: {{app: httpbin}}
    resourceVersion: "4242"
  spec:
    type: ClusterIP
    clusterIP: {CLUSTER_IP}
    clusterIPs: [{CLUSTER_IP}]
    ipFamilies: [IPv4]
    ipFamilyPolicy: SingleStack
    sessionAffinity: None
    selector: {{app: httpbin}}
    ports:
    - {{name: http, port: 80, protocol: TCP, targetPort: 8080}}
  status: {{loadBalancer: {{}}}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: httpbin-7xk2q
    namespace: {NAMESPACE}
    labels:
      kubernetes.io/service-name: httpbin
      endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
  addressType: IPv4
  endpoints:
  - addresses: [{SERVER_IP}]
    conditions: {{ready: true, serving: true, terminating: false}}
    nodeName: node
    targetRef: {{kind: Pod, name: server, namespace: {NAMESPACE}}}
  ports:
  - {{name: http, port: 8080, protocol: TCP}}
"#
    )
}

/// The pods, the namespace, a headless Service and STRICT mTLS (an Istio kind beside the
/// Kubernetes ones), several documents in one file.
fn pods_yaml() -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NAMESPACE}
  labels: {{istio-injection: enabled}}
---
apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: {NAMESPACE}
  labels: {{app: httpbin, version: v1, security.istio.io/tlsMode: istio}}
spec:
  serviceAccountName: httpbin
  containers:
  - name: app
    ports: [{{name: http, containerPort: 8080}}]
status:
  phase: Running
  podIP: {SERVER_IP}
  podIPs: [{{ip: {SERVER_IP}}}]
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: server2
  namespace: {NAMESPACE}
  labels: {{app: httpbin-headless}}
spec:
  serviceAccountName: httpbin
status:
  podIP: {SERVER2_IP}
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: {NAMESPACE}
  labels: {{app: sleep, security.istio.io/tlsMode: istio}}
spec: {{serviceAccountName: sleep}}
status: {{podIP: 198.18.1.2}}
---
apiVersion: v1
kind: Service
metadata: {{name: httpbin-headless, namespace: {NAMESPACE}}}
spec:
  clusterIP: None
  selector: {{app: httpbin-headless}}
  ports: [{{name: http, port: 8080}}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: {NAMESPACE}}}
spec: {{mtls: {{mode: STRICT}}}}
"#
    )
}

/// A file with a bad Service (port 0) between good documents.
fn bad_yaml() -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: fine, namespace: {NAMESPACE}}}
spec: {{clusterIP: 198.19.0.30, ports: [{{name: http, port: 80}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: broken, namespace: {NAMESPACE}}}
spec: {{clusterIP: 198.19.0.31, ports: [{{name: http, port: 0}}]}}
"#
    )
}

#[test]
fn pods_reach_kubernetes_services_by_short_name() {
    if !harness::mesh::prerequisites(&[]) {
        return;
    }
    let mut mesh = Mesh::new(&pods_yaml());
    mesh.write_config("services.yaml", &list_yaml());
    mesh.write_config("bad.yaml", &bad_yaml());
    mesh.start_istiod();

    // The bad document is named (file, document, field); the other files are in force.
    let (_, configz) = mesh
        .monitoring_get("/debug/configz")
        .expect("/debug/configz");
    let status: serde_json::Value = serde_json::from_str(&configz).expect("configz JSON");
    let errors = status["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{configz}");
    let e = &errors[0];
    assert!(
        e["file"].as_str().is_some_and(|f| f.ends_with("bad.yaml")),
        "{e}"
    );
    assert_eq!(e["doc"], 1, "{e}");
    assert_eq!(e["field"], "spec.ports[0].port", "{e}");
    assert!(
        e["reason"]
            .as_str()
            .is_some_and(|r| r.contains("0 is not a port")),
        "{e}"
    );
    let hosts: Vec<&str> = status["services"]
        .as_array()
        .expect("services")
        .iter()
        .filter_map(|s| s["host"].as_str())
        .collect();
    for want in [
        "httpbin.demo.svc.cluster.local",
        "httpbin-headless.demo.svc.cluster.local",
    ] {
        assert!(hosts.contains(&want), "{want} not loaded: {hosts:?}");
    }
    assert!(
        !hosts.contains(&"broken.demo.svc.cluster.local"),
        "{hosts:?}"
    );

    let mut client = mesh.pod("client", "sleep");
    let mut server = mesh.pod("server", "httpbin");
    let mut server2 = mesh.pod("server2", "httpbin");
    assert_eq!(
        (server.ip.as_str(), server2.ip.as_str()),
        (SERVER_IP, SERVER2_IP)
    );
    mesh.start_app(&mut server, "0.0.0.0:8080", "httpbin-v1");
    mesh.start_app(&mut server2, "0.0.0.0:8080", "headless-pod");
    mesh.inject(&mut server);
    mesh.inject(&mut client);
    mesh.wait_ready(&server, Duration::from_secs(30));
    mesh.wait_ready(&client, Duration::from_secs(30));

    // DNS as in a cluster: name, name.ns, name.ns.svc and the FQDN all give the cluster IP.
    for name in [
        "httpbin",
        "httpbin.demo",
        "httpbin.demo.svc",
        "httpbin.demo.svc.cluster.local",
    ] {
        assert_eventually(Duration::from_secs(10), || {
            let a = client.dig(name);
            if a.trim() == CLUSTER_IP {
                Ok(())
            } else {
                Err(format!("dig {name}: {a:?}"))
            }
        });
    }
    // The headless Service answers with its pod's address.
    let a = client.dig("httpbin-headless");
    assert_eq!(a.trim(), SERVER2_IP, "headless: the pod IP");

    // Requests by each name: the client's Envoy routes the Host to the Service's cluster and
    // its endpoint from the EndpointSlice, in mTLS to the server's sidecar.
    for url in [
        "http://httpbin/",
        "http://httpbin.demo/",
        "http://httpbin.demo.svc.cluster.local/",
    ] {
        let body = assert_eventually(Duration::from_secs(15), || {
            let (ok, out) = client.curl(url);
            if ok && out.contains("hello from httpbin-v1") {
                Ok(out)
            } else {
                Err(format!("{url}: {out}"))
            }
        });
        assert!(body.contains("hello from httpbin-v1"), "{body}");
    }
    let (_, clusters) = client.envoy_admin("/clusters").expect("/clusters");
    let prefix =
        format!("outbound|80||httpbin.demo.svc.cluster.local::{SERVER_IP}:8080::rq_total::");
    let rq: u64 = clusters
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit("::").next()?.parse::<u64>().ok())
        .sum();
    assert!(
        rq >= 3,
        "the client's Envoy did not send the requests through the Service's cluster: {clusters}"
    );
    // The server's inbound side came from the Service selecting its Pod.
    let (_, listeners) = server
        .envoy_admin("/config_dump?resource=dynamic_listeners")
        .expect("config_dump");
    assert!(
        listeners.contains("inbound|8080||"),
        "no inbound chain for the Service's target port: {listeners}"
    );
    // mTLS: the server's inbound is STRICT, so a plaintext request from outside the mesh is
    // refused while the client's went through.
    let outsider = mesh.pod("outsider", "default");
    let (ok, out) = outsider.curl(&format!("http://{SERVER_IP}:8080/"));
    assert!(
        !ok || !out.contains("hello from"),
        "plaintext request got through STRICT mTLS: {out}"
    );

    // The headless pod is reached at its own address by name (no sidecar there: plaintext).
    let (ok, out) = client.curl("http://httpbin-headless:8080/");
    assert!(ok && out.contains("hello from headless-pod"), "{out}");
}

/// `dig +short` for `name` of `qtype` as the app user in `pod` (captured DNS).
fn dig_type(pod: &harness::mesh::Pod, name: &str, qtype: &str) -> Vec<String> {
    let out = pod
        .ns
        .cmd_as(harness::mesh::APP_UID, harness::mesh::APP_UID, "dig")
        .args(["+short", "+time=2", "+tries=1", name, qtype])
        .output()
        .expect("run dig");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Istio's DNS proxy cases (pkg/dns/client/dns_test.go) answered in a pod: the mesh of
/// `control-plane/tests/data/kube/dns-table.yaml` with the test's own namespace `ns1` as the
/// pod's, through istiod-lite's NDS, the agent's NDS subscription and its DNS proxy. (The
/// cases that need an upstream resolver run in `control-plane/tests/nds.rs`: this box has none.)
#[test]
fn istio_dns_cases_resolve_in_a_pod_through_the_agent() {
    if !harness::mesh::prerequisites(&[]) {
        return;
    }
    let fixture = include_str!("../../../control-plane/tests/data/kube/dns-table.yaml");
    let mut mesh = Mesh::new(&fixture.replace("ns1", NAMESPACE));
    mesh.start_istiod();
    let mut client = mesh.pod("client", "sleep");
    mesh.inject(&mut client);
    mesh.wait_ready(&client, Duration::from_secs(30));

    let own = NAMESPACE;
    let search = format!("{own}.svc.cluster.local");
    let pp_ns = format!("productpage.{own}.");
    let cases: Vec<(String, &str, Vec<&str>)> = vec![
        ("www.google.com.".into(), "A", vec!["1.1.1.1"]),
        (
            format!("www.google.com.{search}."),
            "A",
            vec!["www.google.com.", "1.1.1.1"],
        ),
        (
            format!("productpage.{own}.svc.cluster.local."),
            "A",
            vec!["9.9.9.9"],
        ),
        (format!("productpage.{own}."), "A", vec!["9.9.9.9"]),
        ("productpage.".into(), "A", vec!["9.9.9.9"]),
        (format!("productpage.{own}.svc."), "A", vec!["9.9.9.9"]),
        (
            format!("productpage.{own}.{search}."),
            "A",
            vec![pp_ns.as_str(), "9.9.9.9"],
        ),
        (format!("productpage.{own}.{search}."), "AAAA", vec![]),
        ("example.ns2.".into(), "A", vec!["10.10.10.10"]),
        (
            "example.ns2.svc.cluster.local.".into(),
            "A",
            vec!["10.10.10.10"],
        ),
        ("example.ns2.svc.".into(), "A", vec!["10.10.10.10"]),
        ("dual.localhost.".into(), "A", vec!["2.2.2.2"]),
        (
            "dual.localhost.".into(),
            "AAAA",
            vec!["2001:db8::ff00:42:8329"],
        ),
        ("ipv6.localhost.".into(), "A", vec![]),
        ("ipv4.localhost.".into(), "AAAA", vec![]),
        ("foo.wildcard.".into(), "A", vec!["10.10.10.10"]),
        ("a.b.wildcard.".into(), "A", vec!["11.11.11.11"]),
        (
            format!("foo.wildcard.{search}."),
            "A",
            vec!["*.wildcard.", "10.10.10.10"],
        ),
        ("foo.svc.mesh.company.net.".into(), "A", vec!["10.1.2.3"]),
        (
            "foo.foons.svc.mesh.company.net.".into(),
            "A",
            vec!["10.1.2.3"],
        ),
        ("example.localhost.".into(), "A", vec!["3.3.3.3"]),
        // The headless Service: its ready pod, and the pod's own name.
        ("db.".into(), "A", vec!["10.1.0.20"]),
        (
            format!("db-0.db.{own}.svc.cluster.local."),
            "A",
            vec!["10.1.0.20"],
        ),
    ];
    // The first answer waits for the agent's first NDS push.
    assert_eventually(Duration::from_secs(10), || {
        match dig_type(&client, "www.google.com.", "A").as_slice() {
            [ip] if ip == "1.1.1.1" => Ok(()),
            other => Err(format!("www.google.com.: {other:?}")),
        }
    });
    let mut failed = Vec::new();
    for (name, qtype, want) in &cases {
        let got = dig_type(&client, name, qtype);
        if got != *want {
            failed.push(format!("{name} {qtype}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
