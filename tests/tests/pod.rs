//! Pod in a box: injected sidecars (istio-init + istio-proxy) against istiod-lite, with real
//! Envoy, real iptables and real traffic, in network namespaces.

use harness::mesh::{Mesh, NAMESPACE};
use harness::{assert_eventually, envoy_bin, require_bin, require_root};
use std::time::Duration;

const HOST: &str = "httpbin.demo.svc.cluster.local";
const VIP: &str = "198.19.0.10";

fn config(server_ip: &str) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{ name: httpbin, namespace: {NAMESPACE} }}
spec:
  hosts: [{HOST}]
  addresses: [{VIP}]
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
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{ name: default, namespace: {NAMESPACE} }}
spec:
  mtls: {{ mode: STRICT }}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{ name: httpbin, namespace: {NAMESPACE} }}
spec:
  host: {HOST}
  trafficPolicy: {{ tls: {{ mode: ISTIO_MUTUAL }} }}
"#
    )
}

fn prerequisites() -> bool {
    require_root()
        && envoy_bin().is_some()
        && require_bin("iptables")
        && require_bin("curl")
        && require_bin("dig")
        && require_bin("setpriv")
}

#[test]
fn sidecars_carry_mtls_traffic_resolved_by_the_agent_dns() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&config("198.18.2.2"));
    mesh.start_istiod();
    let mut client = mesh.pod("client", "sleep");
    let mut server = mesh.pod("server", "httpbin");
    assert_eq!(server.ip, "198.18.2.2");
    mesh.start_app(&mut server, "0.0.0.0:8080", "httpbin-v1");
    mesh.inject(&mut server);
    mesh.inject(&mut client);
    mesh.wait_ready(&server, Duration::from_secs(30));
    mesh.wait_ready(&client, Duration::from_secs(30));

    // DNS: the app's query to the resolv.conf nameserver is captured and answered from NDS.
    let answer = assert_eventually(Duration::from_secs(10), || {
        let a = client.dig(HOST);
        if a.trim() == VIP {
            Ok(a)
        } else {
            Err(format!("dig {HOST}: {a:?}"))
        }
    });
    assert_eq!(answer.trim(), VIP);
    let short = client.dig("httpbin");
    assert_eq!(short.trim(), VIP, "short name through the search list");

    // The request: captured to 15001, mTLS between the Envoys, captured to 15006, to the app.
    let body = assert_eventually(Duration::from_secs(15), || {
        let (ok, out) = client.curl(&format!("http://{HOST}/"));
        if ok && out.contains("hello from httpbin-v1") {
            Ok(out)
        } else {
            Err(out)
        }
    });
    assert!(body.contains("hello from httpbin-v1"), "{body}");

    // Both Envoys hold SPIFFE certificates from the CA, delivered over SDS.
    for (pod, sa) in [(&client, "sleep"), (&server, "httpbin")] {
        let (status, certs) = pod.envoy_admin("/certs").expect("/certs");
        assert_eq!(status, 200);
        let want = format!("spiffe://cluster.local/ns/{NAMESPACE}/sa/{sa}");
        assert!(
            certs.contains(&want),
            "{} /certs lacks {want}: {certs}",
            pod.name
        );
    }
    // The request left the client's Envoy through the outbound cluster to the server pod's
    // endpoint (Istio's default stats inclusion list hides per-cluster TLS stats, so the
    // proof of mTLS is that the server's inbound accepts nothing else: see STRICT below).
    let (_, clusters) = client.envoy_admin("/clusters").expect("/clusters");
    let cx: u64 = clusters
        .lines()
        .filter(|l| {
            l.starts_with(
                "outbound|80||httpbin.demo.svc.cluster.local::198.18.2.2:8080::cx_total::",
            )
        })
        .filter_map(|l| l.rsplit("::").next()?.parse::<u64>().ok())
        .sum();
    assert!(
        cx > 0,
        "no connection from the client's Envoy to the server endpoint: {clusters}"
    );

    // STRICT: a plaintext request from a namespace without a sidecar is refused.
    let outsider = mesh.pod("outsider", "default");
    let (ok, out) = outsider.curl("http://198.18.2.2:8080/");
    assert!(
        !ok || !out.contains("hello from"),
        "plaintext request got through STRICT mTLS: {out}"
    );
}
