//! Pod in a box: injected sidecars (istio-init + istio-proxy) against istiod-lite, with real
//! Envoy, real iptables and real traffic, in network namespaces.

use harness::assert_eventually;
use harness::mesh::{
    HTTPBIN, HTTPBIN_VIP as VIP, Mesh, NAMESPACE, httpbin_service, pod_in_a_box_config, strict_mtls,
};
use std::time::Duration;

const HOST: &str = HTTPBIN;

/// The service, its first workload and STRICT mTLS, without a DestinationRule.
fn base_config(server_ip: &str) -> String {
    httpbin_service(server_ip) + &strict_mtls()
}

fn prerequisites() -> bool {
    harness::mesh::prerequisites(&[])
}

#[test]
fn sidecars_carry_mtls_traffic_resolved_by_the_agent_dns() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&pod_in_a_box_config("198.18.2.2"));
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

fn two_versions_config(weight_v1: u32) -> String {
    let weight_v2 = 100 - weight_v1;
    base_config("198.18.2.2")
        + &format!(
            r#"---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{ name: httpbin-v2, namespace: {NAMESPACE} }}
spec:
  address: 198.18.3.2
  labels: {{ app: httpbin, version: v2 }}
  serviceAccount: httpbin
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{ name: httpbin-subsets, namespace: {NAMESPACE} }}
spec:
  host: {HOST}
  trafficPolicy: {{ tls: {{ mode: ISTIO_MUTUAL }} }}
  subsets:
  - {{ name: v1, labels: {{ version: v1 }} }}
  - {{ name: v2, labels: {{ version: v2 }} }}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{ name: httpbin, namespace: {NAMESPACE} }}
spec:
  hosts: [{HOST}]
  http:
  - route:
    - {{ destination: {{ host: {HOST}, subset: v1 }}, weight: {weight_v1} }}
    - {{ destination: {{ host: {HOST}, subset: v2 }}, weight: {weight_v2} }}
"#
        )
}

/// Sends `n` requests from the client app; returns how many reached v1 and v2, and failures.
fn spread(client: &harness::mesh::Pod, n: usize) -> (usize, usize, Vec<String>) {
    let (mut v1, mut v2, mut failed) = (0, 0, Vec::new());
    for _ in 0..n {
        let (ok, out) = client.curl(&format!("http://{HOST}/"));
        match (
            ok,
            out.contains("hello from httpbin-v1"),
            out.contains("hello from httpbin-v2"),
        ) {
            (true, true, _) => v1 += 1,
            (true, _, true) => v2 += 1,
            _ => failed.push(out),
        }
    }
    (v1, v2, failed)
}

#[test]
fn virtual_service_weights_move_traffic_and_control_plane_outage_costs_nothing() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&two_versions_config(100));
    mesh.start_istiod();
    let mut client = mesh.pod("client", "sleep");
    let mut v1 = mesh.pod("server-v1", "httpbin");
    let mut v2 = mesh.pod("server-v2", "httpbin");
    mesh.start_app(&mut v1, "0.0.0.0:8080", "httpbin-v1");
    mesh.start_app(&mut v2, "0.0.0.0:8080", "httpbin-v2");
    for pod in [&mut v1, &mut v2, &mut client] {
        mesh.inject(pod);
    }
    for pod in [&v1, &v2, &client] {
        mesh.wait_ready(pod, Duration::from_secs(30));
    }
    assert_eventually(Duration::from_secs(15), || match spread(&client, 5) {
        (5, 0, _) => Ok(()),
        other => Err(format!("expected all on v1: {other:?}")),
    });

    // Weight change: all traffic moves to v2, within 2 s of the file change.
    let changed = std::time::Instant::now();
    mesh.write_config("mesh.yaml", &two_versions_config(0));
    assert_eventually(Duration::from_secs(2), || match spread(&client, 3) {
        (0, 3, _) => Ok(()),
        other => Err(format!("expected all on v2: {other:?}")),
    });
    eprintln!("weight change took effect within {:?}", changed.elapsed());

    // Control plane down for 20 s under steady traffic: no request fails.
    let load = harness::mesh::Load::start(
        &client,
        &format!("http://{HOST}/"),
        "hello from httpbin-v2",
        Duration::from_millis(100),
    );
    std::thread::sleep(Duration::from_secs(1));
    mesh.stop_istiod();
    std::thread::sleep(Duration::from_secs(20));
    mesh.start_istiod();
    let ready = std::time::Instant::now();
    // Envoys reconnect through their agents and converge again. Envoy's own xDS retry backoff
    // drives the reconnect (jittered, doubling from 0.5 s up to its 30 s cap over the outage),
    // so after 20 s of refused connections the next try can be up to 30 s away.
    assert_eventually(Duration::from_secs(40), || {
        let (_, syncz) = mesh.monitoring_get("/debug/syncz")?;
        let connected = syncz.matches("sidecar~").count();
        if connected >= 3 && !syncz.contains("STALE") {
            Ok(())
        } else {
            Err(format!("not converged: {syncz}"))
        }
    });
    // The agent never retries on its own (as Istio's): Envoy's next try reconnects it.
    eprintln!(
        "FIGURE control_plane_outage: all 3 proxies reconnected and synced {} ms after istiod-lite was ready again",
        ready.elapsed().as_millis()
    );
    let (ok, failed) = load.stop();
    eprintln!("outage: {ok} requests succeeded, {} failed", failed.len());
    assert!(ok > 50, "too few requests during the outage: {ok}");
    assert!(
        failed.is_empty(),
        "requests failed during the outage: {failed:?}"
    );
}
