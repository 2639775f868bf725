//! istiod-lite against a real Envoy 1.40: a file bootstrap points ADS (Delta in one test, SotW in
//! the other) straight at istiod-lite's plaintext gRPC port. The config directory holds
//! ServiceEntries + WorkloadEntries (and DestinationRule, VirtualService, PeerAuthentication
//! DISABLE, since this Envoy has no SDS). Edits reach Envoy within 2 s, an invalid edit is
//! rejected and Envoy keeps the old config, a config Envoy refuses is NACKed and tracked, and
//! `/debug/syncz` shows SYNCED.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use harness::local::LocalIstiod;
use harness::{Envoy, assert_eventually, envoy_bin, http_get, workspace_bin};
use serde_json::Value;

const NODE_ID: &str = "sidecar~127.0.0.1~client-1.default~default.svc.cluster.local";

fn bootstrap(api_type: &str, xds: SocketAddr) -> String {
    format!(
        r#"
node:
  id: "{NODE_ID}"
  cluster: client.default
  metadata: {{NAMESPACE: default, LABELS: {{app: client}}, INSTANCE_IPS: "127.0.0.1"}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}}}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    grpc_services: [{{envoy_grpc: {{cluster_name: xds-grpc}}}}]
  cds_config: {{ads: {{}}, resource_api_version: V3}}
  lds_config: {{ads: {{}}, resource_api_version: V3}}
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: xds-grpc
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: {ip}, port_value: {port}}}}}}}}}]}}]
"#,
        ip = xds.ip(),
        port = xds.port()
    )
}

/// The mesh config; `endpoints` are the httpbin WorkloadEntry addresses, `vs_uri` the
/// VirtualService's first URI match.
fn mesh_yaml(endpoints: &[&str], vs_uri: &str) -> String {
    let mut y = String::from(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: httpbin, namespace: default}
spec:
  hosts: [httpbin.example.com]
  addresses: [198.18.10.1]
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  resolution: STATIC
  workloadSelector: {labels: {app: httpbin}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: default}
spec:
  hosts: [db.example.com]
  addresses: [198.18.10.2]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: STATIC
  endpoints: [{address: 198.18.0.20}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: httpbin, namespace: default}
spec:
  host: httpbin.example.com
  trafficPolicy: {tls: {mode: DISABLE}}
  subsets: [{name: v1, labels: {version: v1}}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: DISABLE}}
"#,
    );
    y.push_str(&format!(
        r#"---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: httpbin, namespace: default}}
spec:
  hosts: [httpbin.example.com]
  http:
  - match: [{{uri: {vs_uri}}}]
    route: [{{destination: {{host: httpbin.example.com, subset: v1}}}}]
  - route: [{{destination: {{host: httpbin.example.com}}}}]
"#
    ));
    for (i, ep) in endpoints.iter().enumerate() {
        y.push_str(&format!(
            "---\napiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {{name: httpbin-{i}, namespace: default}}\nspec: {{address: {ep}, labels: {{app: httpbin, version: v1}}}}\n"
        ));
    }
    y
}

/// Writes atomically (rename) so the watcher never sees a half-written file.
fn write_config(dir: &Path, text: &str) {
    let tmp = dir.join(".mesh.yaml.tmp");
    std::fs::write(&tmp, text).expect("write config");
    std::fs::rename(&tmp, dir.join("mesh.yaml")).expect("rename config");
}

fn config_dump(envoy: &Envoy) -> Result<Value, String> {
    let (status, body) = envoy.admin_get("/config_dump?include_eds")?;
    if status != 200 {
        return Err(format!("config_dump {status}"));
    }
    serde_json::from_str(&body).map_err(|e| e.to_string())
}

fn dump_section<'a>(dump: &'a Value, type_suffix: &str) -> Option<&'a Value> {
    dump["configs"].as_array()?.iter().find(|c| {
        c["@type"]
            .as_str()
            .is_some_and(|t| t.ends_with(&format!(".{type_suffix}")))
    })
}

fn names(dump: &Value, type_suffix: &str, list: &str, path: &[&str]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Some(items) = dump_section(dump, type_suffix).and_then(|s| s[list].as_array()) {
        for item in items {
            let mut v = item;
            for p in path {
                v = &v[*p];
            }
            if let Some(s) = v.as_str() {
                out.insert(s.to_string());
            }
        }
    }
    out
}

/// Endpoint addresses Envoy holds for `cluster`.
fn endpoints(dump: &Value, cluster: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(list) = dump_section(dump, "EndpointsConfigDump")
        .and_then(|s| s["dynamic_endpoint_configs"].as_array())
    else {
        return out;
    };
    for e in list {
        let cfg = &e["endpoint_config"];
        if cfg["cluster_name"] != cluster {
            continue;
        }
        for loc in cfg["endpoints"].as_array().into_iter().flatten() {
            for lb in loc["lb_endpoints"].as_array().into_iter().flatten() {
                if let Some(a) = lb["endpoint"]["address"]["socket_address"]["address"].as_str() {
                    out.insert(a.to_string());
                }
            }
        }
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `/debug/syncz` row of our Envoy.
fn syncz(istiod: &LocalIstiod) -> Result<Value, String> {
    let (status, body) = http_get(istiod.monitoring, "/debug/syncz")?;
    if status != 200 {
        return Err(format!("syncz {status}"));
    }
    let rows: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    rows.as_array()
        .and_then(|r| r.iter().find(|row| row["proxy"] == NODE_ID))
        .cloned()
        .ok_or_else(|| format!("proxy not in syncz: {body}"))
}

fn all_synced(istiod: &LocalIstiod) -> Result<Value, String> {
    let row = syncz(istiod)?;
    for ty in ["CDS", "EDS", "LDS", "RDS"] {
        if row["types"][ty]["status"] != "SYNCED" {
            return Err(format!("{ty} not SYNCED: {row}"));
        }
    }
    Ok(row)
}

const HTTPBIN: &str = "outbound|80||httpbin.example.com";

#[expect(
    clippy::too_many_lines,
    reason = "one control-plane scenario told in order (initial config, an edit, an invalid edit, a NACK, ...); each step starts from the state the last one left"
)]
fn run(api_type: &str, stream: &str) {
    let Some(envoy_path) = envoy_bin() else {
        return;
    };
    let istiod = LocalIstiod::start(&mesh_yaml(&["198.18.0.5"], "{prefix: /v1}"));
    let cfg = &istiod.config_dir;
    let envoy = Envoy::start(&envoy_path, None, &bootstrap(api_type, istiod.grpc));
    envoy.wait_ready(Duration::from_secs(20));

    // Initial config: listeners, clusters, routes and endpoints.
    assert_eventually(Duration::from_secs(10), || {
        let d = config_dump(&envoy)?;
        let listeners = names(&d, "ListenersConfigDump", "dynamic_listeners", &["name"]);
        let clusters = names(
            &d,
            "ClustersConfigDump",
            "dynamic_active_clusters",
            &["cluster", "name"],
        );
        let routes = names(
            &d,
            "RoutesConfigDump",
            "dynamic_route_configs",
            &["route_config", "name"],
        );
        let want_clusters = set(&[
            HTTPBIN,
            "outbound|80|v1|httpbin.example.com",
            "outbound|5432||db.example.com",
            "PassthroughCluster",
            "BlackHoleCluster",
            "InboundPassthroughCluster",
        ]);
        if listeners != set(&["virtualInbound", "virtualOutbound"]) {
            return Err(format!("listeners {listeners:?}"));
        }
        if !want_clusters.is_subset(&clusters) {
            return Err(format!("clusters {clusters:?}"));
        }
        if routes != set(&["80"]) {
            return Err(format!("routes {routes:?}"));
        }
        if endpoints(&d, HTTPBIN) != set(&["198.18.0.5"]) {
            return Err(format!("endpoints {:?}", endpoints(&d, HTTPBIN)));
        }
        if endpoints(&d, "outbound|5432||db.example.com") != set(&["198.18.0.20"]) {
            return Err("db endpoints".into());
        }
        Ok(())
    });
    let row = assert_eventually(Duration::from_secs(5), || all_synced(&istiod));
    assert_eq!(row["stream"], stream);

    // Editing the file reaches Envoy within 2 s.
    write_config(
        cfg.path(),
        &mesh_yaml(&["198.18.0.6", "198.18.0.7"], "{prefix: /v1}"),
    );
    let start = Instant::now();
    assert_eventually(Duration::from_secs(2), || {
        let got = endpoints(&config_dump(&envoy)?, HTTPBIN);
        if got == set(&["198.18.0.6", "198.18.0.7"]) {
            Ok(())
        } else {
            Err(format!("endpoints {got:?}"))
        }
    });
    eprintln!("edit reached Envoy after {:?}", start.elapsed());
    assert_eventually(Duration::from_secs(5), || all_synced(&istiod));

    // An invalid edit is rejected (file, document, field in /debug/configz) and Envoy keeps
    // the old config.
    write_config(
        cfg.path(),
        &mesh_yaml(&["198.18.0.9"], "{prefix: /v1}").replace("number: 80,", "number: 99999,"),
    );
    let err = assert_eventually(Duration::from_secs(5), || {
        let (_, body) = http_get(istiod.monitoring, "/debug/configz")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        v["errors"]
            .as_array()
            .and_then(|e| e.first())
            .cloned()
            .ok_or_else(|| "no config error yet".to_string())
    });
    assert!(
        err["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("mesh.yaml")),
        "{err}"
    );
    assert_eq!(err["doc"], 0, "{err}");
    assert_eq!(err["field"], "spec.ports[0].number", "{err}");
    istiod
        .child
        .wait_for_line("config document rejected", Duration::from_secs(5));
    let d = config_dump(&envoy).expect("config_dump");
    assert_eq!(
        endpoints(&d, HTTPBIN),
        set(&["198.18.0.6", "198.18.0.7"]),
        "old config kept"
    );
    assert_eventually(Duration::from_secs(5), || all_synced(&istiod));

    // A config istiod-lite accepts but Envoy refuses (bad regex) is NACKed: tracked in syncz,
    // and Envoy keeps its last good routes.
    write_config(
        cfg.path(),
        &mesh_yaml(&["198.18.0.6", "198.18.0.7"], "{regex: \"[\"}"),
    );
    let row = assert_eventually(Duration::from_secs(5), || {
        let row = syncz(&istiod)?;
        if row["types"]["RDS"]["nack"].is_string() && row["types"]["RDS"]["status"] == "STALE" {
            Ok(row)
        } else {
            Err(format!("no RDS NACK yet: {row}"))
        }
    });
    eprintln!("NACK recorded: {}", row["types"]["RDS"]["nack"]);
    istiod
        .child
        .wait_for_line("proxy rejected push (NACK)", Duration::from_secs(5));
    let (_, routes) = envoy
        .admin_get("/config_dump?resource=dynamic_route_configs")
        .expect("routes");
    assert!(
        routes.contains("\"/v1\""),
        "Envoy keeps the last good route: {routes}"
    );

    // Fixing it syncs again.
    write_config(
        cfg.path(),
        &mesh_yaml(&["198.18.0.6", "198.18.0.7"], "{prefix: /v2}"),
    );
    assert_eventually(Duration::from_secs(5), || {
        all_synced(&istiod)?;
        let (_, routes) = envoy.admin_get("/config_dump?resource=dynamic_route_configs")?;
        if routes.contains("\"/v2\"") {
            Ok(())
        } else {
            Err("route /v2 not in Envoy yet".into())
        }
    });

    // Metrics count the pushes and the NACK.
    let (_, metrics) = http_get(istiod.monitoring, "/metrics").expect("metrics");
    assert!(
        metrics.contains("pilot_xds_pushes_total{type=\"EDS\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("pilot_total_xds_rejects_total{type=\"RDS\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("pilot_xds 1"), "{metrics}");
}

#[test]
fn envoy_delta_ads_follows_config_dir() {
    run("DELTA_GRPC", "delta");
}

#[test]
fn envoy_sotw_ads_follows_config_dir() {
    run("GRPC", "sotw");
}

#[test]
fn token_command_prints_a_jwt_for_the_service_account() {
    let ca = tempfile::tempdir().expect("tempdir");
    let out = Command::new(workspace_bin("istiod-lite"))
        .arg("token")
        .arg("--ca-dir")
        .arg(ca.path())
        .args([
            "--namespace",
            "ns1",
            "--service-account",
            "sa1",
            "--ttl",
            "1h",
        ])
        .output()
        .expect("run token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).expect("utf8");
    let parts: Vec<&str> = token.trim().split('.').collect();
    assert_eq!(parts.len(), 3, "JWT: {token}");
    assert!(ca.path().join("issuer-key.pem").is_file());
    // Flags also come from the environment.
    let out = Command::new(workspace_bin("istiod-lite"))
        .arg("token")
        .env("ISTIOD_LITE_CA_DIR", ca.path())
        .env("ISTIOD_LITE_NAMESPACE", "ns2")
        .env("ISTIOD_LITE_SERVICE_ACCOUNT", "sa2")
        .output()
        .expect("run token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn vm_bundle_writes_istioctl_files() {
    let ca = tempfile::tempdir().expect("tempdir");
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(workspace_bin("istiod-lite"))
        .arg("vm-bundle")
        .arg("--ca-dir")
        .arg(ca.path())
        .args([
            "--namespace",
            "vm",
            "--service-account",
            "vm-sa",
            "--name",
            "vm1",
        ])
        .args(["--discovery-address", "198.18.0.1:15012"])
        .arg("--output")
        .arg(out_dir.path())
        .output()
        .expect("run vm-bundle");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "cluster.env",
        "mesh.yaml",
        "hosts",
        "root-cert.pem",
        "istio-token",
    ] {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(out_dir.path().join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(meta.permissions().mode() & 0o777, 0o744, "{f}");
    }
    let root = std::fs::read_to_string(out_dir.path().join("root-cert.pem")).expect("root");
    assert_eq!(
        root,
        std::fs::read_to_string(ca.path().join("root-cert.pem")).expect("ca root")
    );
    let hosts = std::fs::read_to_string(out_dir.path().join("hosts")).expect("hosts");
    assert_eq!(hosts, "198.18.0.1 istiod.istio-system.svc\n");
    let env = std::fs::read_to_string(out_dir.path().join("cluster.env")).expect("env");
    assert!(env.contains("SERVICE_ACCOUNT='vm-sa'"), "{env}");
    assert!(env.contains("ISTIO_NAMESPACE='vm'"), "{env}");
}
