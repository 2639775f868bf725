//! Warm start (`XDS_PROXY_PREFETCH`, on by default) against Istio's own istiod, our image only
//! (Istio's agent has no such thing), in a namespace of its own:
//! - a new pod's agent opens its upstream with the bootstrap's node before Envoy runs, Envoy's
//!   first stream takes it over, and istiod lists the pod once, SYNCED;
//! - an EnvoyFilter that makes the pod's inbound listener invalid for Envoy (a fault filter
//!   aborting with HTTP 999, which istiod accepts and Envoy's validation refuses) exists before
//!   the pod: the prefetched LDS is NACKed by Envoy and istiod logs the NACK with Envoy's error.

use std::time::Duration;

use harness::assert_eventually_result;
use harness::cluster::{Agent, Cluster};

const NS: &str = "mesh-warm";

fn workload(name: &str, cluster: &Cluster) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {NS}, labels: {{app: {name}}}}}
spec:
  selector: {{app: {name}}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {NS}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{sidecar.istio.io/proxyImage: "{proxy}"}}
    spec:
      containers:
      - name: app
        image: "{app}"
        imagePullPolicy: Never
        args: [--port, "8080"]
        ports: [{{containerPort: 8080}}]
        resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}
"#,
        proxy = cluster.image(Agent::Ours.image_name()),
        app = cluster.image("app"),
    )
}

/// An inbound HTTP filter Envoy refuses (abort status outside 200..600).
const BAD_FILTER: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: warm-nack, namespace: mesh-warm}
spec:
  workloadSelector: {labels: {app: warm-nack}}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_INBOUND
      listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.fault
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault
          abort: {http_status: 999, percentage: {numerator: 100}}
"#;

fn setup(cluster: &Cluster) {
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n  labels:\n    istio-injection: enabled\n"
        ))
        .expect("namespace");
}

/// A container's whole log (`Cluster::logs` keeps the last lines only), since `since`.
fn log(cluster: &Cluster, ns: &str, pod: &str, container: &str, since: &str) -> String {
    cluster
        .kubectl(&["logs", "-n", ns, pod, "-c", container, "--since", since])
        .unwrap_or_else(|e| e)
}

fn pod(cluster: &Cluster, app: &str) -> Result<String, String> {
    cluster
        .pods(NS, &format!("app={app}"))?
        .into_iter()
        .next()
        .ok_or_else(|| format!("no {app} pod yet"))
}

#[test]
fn envoy_takes_over_the_prefetched_stream() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    setup(&cluster);
    let _ = cluster.kubectl(&["delete", "deployment", "-n", NS, "warm-ok", "--wait"]);
    cluster
        .apply(&workload("warm-ok", &cluster))
        .expect("the workload applies");
    cluster
        .wait_available(NS, Duration::from_secs(300))
        .expect("the pod becomes available");
    let pod = pod(&cluster, "warm-ok").expect("the pod");
    let logs = log(&cluster, NS, &pod, "istio-proxy", "1h");
    for line in [
        "opening the upstream xDS stream before Envoy connects",
        "it takes over the prefetched upstream stream",
    ] {
        assert!(logs.contains(line), "the agent's log has {line:?}:\n{logs}");
    }
    let id = format!("{pod}.{NS}");
    assert_eventually_result(Duration::from_secs(60), || {
        let status = cluster.istioctl(&["proxy-status", "-v", "1", "-n", NS])?;
        let rows: Vec<&str> = status.lines().filter(|l| l.contains(&id)).collect();
        match rows[..] {
            [row] if row.matches("SYNCED").count() >= 4 => Ok(()),
            _ => Err(format!("want one SYNCED row for {id}:\n{status}")),
        }
    })
    .expect("istiod lists the pod once, SYNCED");
}

#[test]
fn a_nack_of_prefetched_config_reaches_istiod() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    setup(&cluster);
    let _ = cluster.kubectl(&["delete", "deployment", "-n", NS, "warm-nack", "--wait"]);
    cluster.apply(BAD_FILTER).expect("the EnvoyFilter applies");
    cluster
        .apply(&workload("warm-nack", &cluster))
        .expect("the workload applies");
    let pod = assert_eventually_result(Duration::from_secs(120), || {
        let pod = pod(&cluster, "warm-nack")?;
        let logs = log(&cluster, NS, &pod, "istio-proxy", "1h");
        (logs.contains("it takes over the prefetched upstream stream")
            && logs.contains("Envoy rejected an xDS response (NACK)"))
        .then_some(pod)
        .ok_or_else(|| format!("no NACK of prefetched config in the agent's log yet:\n{logs}"))
    })
    .expect("Envoy NACKs the prefetched listener");
    let istiod = cluster
        .pods("istio-system", "app=istiod")
        .expect("istiod")
        .into_iter()
        .next()
        .expect("an istiod pod");
    assert_eventually_result(Duration::from_secs(60), || {
        let logs = log(&cluster, "istio-system", &istiod, "discovery", "10m");
        nack_entries(&logs, &pod)
            .any(|entry| entry.contains("http_status: 999"))
            .then_some(())
            .ok_or_else(|| "istiod has not logged the NACK with Envoy's error yet".to_string())
    })
    .expect("istiod logs the NACK with Envoy's error");
    let _ = cluster.kubectl(&["delete", "-n", NS, "envoyfilter", "warm-nack"]);
}

/// istiod's `ACK ERROR` entries for a pod, each with the lines of Envoy's error that follow it
/// (the error detail is multi-line; the next entry starts with a timestamp).
fn nack_entries<'a>(logs: &'a str, pod: &'a str) -> impl Iterator<Item = String> + 'a {
    let lines: Vec<&str> = logs.lines().collect();
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains("ACK ERROR") && lines[i].contains(pod))
        .collect();
    starts.into_iter().map(move |i| {
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].starts_with("20"))
            .unwrap_or(lines.len());
        lines[i..end].join("\n")
    })
}
