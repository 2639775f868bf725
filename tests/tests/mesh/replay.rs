//! `istiod-lite replay` of the config dumps recorded from real Istio proxies
//! (`../shared/conformance/istio-configdumps/`), through `pilot-agent proxy --external-envoy`
//! to upstream Envoy 1.40 started by hand, as in `local_envoy`: no namespaces, no root, every
//! port moved to a free one, `INTERCEPTION_MODE=NONE` (replay then sends the listeners with
//! `bind_to_port: false`).
//!
//! For every dump with dynamic resources:
//! - as recorded, a dump that uses Istio-only extensions is NACKed by upstream Envoy, and the
//!   NACK is shown in istiod-lite's `/debug/syncz` (type URL, Envoy's error naming the resource)
//!   and in the agent's log;
//! - with `--strip-istio-extensions` nothing is NACKed; Envoy holds every replayed listener and
//!   cluster, the bootstrap clusters Istio's config relies on (`xds-grpc`, `sds-grpc`, `agent`,
//!   `prometheus_stats`) and, from the agent's SDS, the secrets the config names.
//!
//! Dumps without any dynamic resource (bootstrap-, secrets- or ECDS-only, static routes only)
//! are refused by `replay` with an error naming the file and its sections.

use harness::local::{Ports, Unprivileged, agent_env, listen_addr, write_bootstrap};
use harness::{Child, assert_eventually, envoy_bin, http_get, repo_root, workspace_bin};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const SERVICE_ACCOUNT: &str = "replay-sa";
const NODE_ID: &str = "sidecar~127.0.0.1~local.demo~demo.svc.cluster.local";
const LISTENER_URL: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const CLUSTER_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The bootstrap clusters Istio's dynamic config and bootstrap listeners rely on.
const BOOTSTRAP_CLUSTERS: [&str; 4] = ["xds-grpc", "sds-grpc", "agent", "prometheus_stats"];

fn corpus() -> PathBuf {
    repo_root().join("../shared/conformance/istio-configdumps")
}

/// What one dump is expected to do.
struct Case {
    file: &'static str,
    /// Type URLs upstream Envoy NACKs for Istio-only extensions when the dump is served as
    /// recorded.
    nacked: &'static [&'static str],
    /// What upstream Envoy still rejects after stripping, as (type URL, Envoy's error): defects
    /// of the excerpt (a cluster it lacks, a hand-edited cluster), not Istio extensions.
    stripped_nacks: &'static [(&'static str, &'static str)],
    /// The resources those errors name: every other one must be in Envoy.
    rejected: &'static [&'static str],
    /// SDS secrets the dump's dynamic config names.
    secrets: &'static [&'static str],
}

/// A recorded dump, JSON or (`authz.yaml`) YAML.
fn parse_dump(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("read dump");
    serde_json::from_str(&text)
        .or_else(|_| serde_yaml::from_str(&text).map_err(|e| e.to_string()))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Names in the sections `suffix` of a dump (recorded, or Envoy's `/config_dump`).
fn names(dump: &Value, suffix: &str, list: &str, path: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for section in dump["configs"].as_array().into_iter().flatten() {
        if !section["@type"]
            .as_str()
            .is_some_and(|t| t.ends_with(suffix))
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

fn dynamic_listeners(dump: &Value) -> Vec<String> {
    names(dump, "ListenersConfigDump", "dynamic_listeners", &["name"])
}

fn dynamic_clusters(dump: &Value) -> Vec<String> {
    let mut c = names(
        dump,
        "ClustersConfigDump",
        "dynamic_active_clusters",
        &["cluster", "name"],
    );
    c.extend(names(
        dump,
        "ClustersConfigDump",
        "dynamic_warming_clusters",
        &["cluster", "name"],
    ));
    c
}

/// istiod-lite replay on loopback, every listener on port 0.
struct Replay {
    child: Child,
    secure: SocketAddr,
    monitoring: SocketAddr,
    ca_dir: tempfile::TempDir,
}

fn replay_command(dump: &Path, strip: bool, ca_dir: &Path) -> Command {
    let mut cmd = Command::new(workspace_bin("istiod-lite"));
    cmd.arg("replay").arg("--config-dump").arg(dump);
    if strip {
        cmd.arg("--strip-istio-extensions");
    }
    cmd.arg("--ca-dir")
        .arg(ca_dir)
        .args(["--grpc-addr", "127.0.0.1:0"])
        .args(["--secure-grpc-addr", "127.0.0.1:0"])
        .args(["--monitoring-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    cmd
}

impl Replay {
    fn start(dump: &Path, strip: bool) -> Replay {
        let ca_dir = tempfile::tempdir().expect("tempdir");
        let child = Child::spawn("istiod-lite", replay_command(dump, strip, ca_dir.path()));
        let _grpc = listen_addr(&child, "grpc");
        let secure = listen_addr(&child, "secure-grpc");
        let monitoring = listen_addr(&child, "monitoring");
        harness::local::wait_ready(monitoring);
        Replay {
            child,
            secure,
            monitoring,
            ca_dir,
        }
    }

    /// Token and CA root at Istio's relative paths under `scratch`.
    fn provision(&self, scratch: &Path) {
        let out = Command::new(workspace_bin("istiod-lite"))
            .arg("token")
            .arg("--ca-dir")
            .arg(self.ca_dir.path())
            .args(["--namespace", "demo", "--service-account", SERVICE_ACCOUNT])
            .output()
            .expect("istiod-lite token");
        assert!(out.status.success(), "istiod-lite token failed");
        harness::local::write_file(
            &scratch.join("var/run/secrets/tokens/istio-token"),
            String::from_utf8_lossy(&out.stdout).trim(),
        );
        harness::local::write_file(
            &scratch.join("var/run/secrets/istio/root-cert.pem"),
            &std::fs::read_to_string(self.ca_dir.path().join("root-cert.pem")).expect("CA root"),
        );
    }

    /// The agent's row in `/debug/syncz`.
    fn sync_row(&self) -> Result<Value, String> {
        let (status, body) = http_get(self.monitoring, "/debug/syncz")?;
        if status != 200 {
            return Err(format!("/debug/syncz {status}"));
        }
        let rows: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        rows.as_array()
            .into_iter()
            .flatten()
            .find(|r| r["proxy"] == NODE_ID)
            .cloned()
            .ok_or_else(|| format!("no row for {NODE_ID}: {body}"))
    }
}

/// istiod-lite replay, the agent and Envoy, running.
struct Stack {
    replay: Replay,
    agent: Child,
    _envoy: Child,
    admin: SocketAddr,
    _scratch: tempfile::TempDir,
}

/// Envoy as [`harness::local::start_envoy`] starts it, but with its stdout in a file anyone may
/// write: recorded configs access-log to `/dev/stdout`, which Envoy reopens, and an
/// unprivileged Envoy (the test runs it as uid 1000 under root) may not reopen the root-owned
/// pipe the harness captures output with. In a pod, stdout is the container's and this does
/// not arise.
fn start_envoy_stdout_to_file(user: &Unprivileged, bootstrap: &Path, scratch: &Path) -> Child {
    use std::os::unix::fs::PermissionsExt;
    let out = scratch.join("envoy-stdout.log");
    std::fs::write(&out, "").expect("create envoy-stdout.log");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let envoy = user.command("envoy");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"out=$1; shift; exec "$@" >>"$out""#)
        .arg("sh")
        .arg(&out)
        .arg(envoy.get_program())
        .args(envoy.get_args())
        .arg("-c")
        .arg(bootstrap)
        .args(["--disable-hot-restart", "--log-level", "warning"])
        .args(["--concurrency", "1", "--allow-unknown-static-fields"])
        .current_dir(scratch);
    Child::spawn("envoy", cmd)
}

fn start_stack(envoy: &Path, dump: &Path, strip: bool) -> Stack {
    // Short path: Envoy's bootstrap names the sockets relative to this dir (UDS path limit).
    let scratch_dir = tempfile::Builder::new()
        .prefix("rp-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch = scratch_dir.path().to_path_buf();
    let replay = Replay::start(dump, strip);
    replay.provision(&scratch);
    let user = Unprivileged::new(&scratch, envoy);
    let ports = Ports::free();
    let bootstrap = write_bootstrap(&user, &scratch, replay.secure, SERVICE_ACCOUNT, &ports);
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(&scratch);
    agent_env(&mut cmd, replay.secure, SERVICE_ACCOUNT, &ports);
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let envoy = start_envoy_stdout_to_file(&user, &bootstrap, &scratch);
    let admin = format!("127.0.0.1:{}", ports.admin).parse().expect("addr");
    Stack {
        replay,
        agent,
        _envoy: envoy,
        admin,
        _scratch: scratch_dir,
    }
}

fn short(type_url: &str) -> &'static str {
    match type_url {
        LISTENER_URL => "LDS",
        CLUSTER_URL => "CDS",
        other => panic!("no short name for {other}"),
    }
}

/// A distinctive piece of Envoy's error (after `code 13: `), to find it in the agent's log.
fn nack_words(nack: &str) -> &str {
    let msg = nack.split_once(": ").map_or(nack, |(_, m)| m);
    &msg[..msg.len().min(40)]
}

/// Served as recorded: Envoy NACKs `case.nacked`, syncz and the agent's log say so.
fn nack_is_reported(envoy: &Path, case: &Case) {
    let dump = corpus().join(case.file);
    let stack = start_stack(envoy, &dump, false);
    for url in case.nacked {
        let ty = short(url);
        let row = assert_eventually(Duration::from_secs(30), || {
            let row = stack.replay.sync_row()?;
            if row["types"][ty]["nack"].is_string() {
                Ok(row)
            } else {
                Err(format!("{ty} not NACKed yet: {row}"))
            }
        });
        let t = &row["types"][ty];
        assert_eq!(t["typeUrl"], *url, "syncz names the type URL: {row}");
        assert_eq!(t["status"], "STALE", "a NACKed type is stale: {row}");
        assert!(t["nackNonce"].is_string(), "syncz names the push: {row}");
        let nack = t["nack"].as_str().unwrap_or_default();
        // Envoy's own words: no implementation of an Istio-only extension type (or of the
        // null-VM Wasm plugins compiled into Istio's build).
        assert!(
            nack.contains("Didn't find a registered implementation for")
                || nack.contains("Unable to create Wasm plugin"),
            "syncz shows Envoy's error detail: {nack}"
        );
        let line = stack.agent.wait_for_line(
            "Envoy rejected an xDS response (NACK)",
            Duration::from_secs(10),
        );
        let lines: Vec<String> = stack
            .agent
            .output()
            .into_iter()
            .filter(|l| l.contains("Envoy rejected an xDS response (NACK)"))
            .collect();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("type_url") && l.contains(url) && l.contains(nack_words(nack))),
            "the agent logs the NACK with its type URL and error: {line} / {lines:?}"
        );
    }
}

/// Envoy's error in a syncz type entry, without the `code <n>: ` prefix.
fn nack_message(t: &Value) -> Option<String> {
    let n = t["nack"].as_str()?;
    let msg = n.split_once(": ").map_or(n, |(_, m)| m);
    Some(msg.trim().to_string())
}

/// With `--strip-istio-extensions`: no NACK but the excerpt's own defects; Envoy holds
/// everything else the dump names.
fn stripped_is_accepted(envoy: &Path, case: &Case, recorded: &Value) {
    let dump = corpus().join(case.file);
    let stack = start_stack(envoy, &dump, true);
    let keep = |names: Vec<String>| -> Vec<String> {
        names
            .into_iter()
            .filter(|n| !case.rejected.contains(&n.as_str()))
            .collect()
    };
    let want_listeners = keep(dynamic_listeners(recorded));
    let want_clusters = keep(dynamic_clusters(recorded));
    let want_secrets: Vec<String> = case.secrets.iter().map(|s| s.to_string()).collect();
    let expect_nack = |url: &str| {
        case.stripped_nacks
            .iter()
            .find(|(u, _)| *u == url)
            .map(|(_, m)| m.to_string())
    };
    let envoy_dump = assert_eventually(Duration::from_secs(40), || {
        let row = stack.replay.sync_row()?;
        for url in [CLUSTER_URL, LISTENER_URL] {
            let t = &row["types"][short(url)];
            let done = match expect_nack(url) {
                None => t["status"] == "SYNCED",
                Some(_) => t["nack"].is_string(),
            };
            if !done {
                return Err(format!("{} not answered yet: {row}", short(url)));
            }
        }
        let (status, body) = http_get(stack.admin, "/config_dump")?;
        if status != 200 {
            return Err(format!("/config_dump {status}"));
        }
        let d: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let listeners = dynamic_listeners(&d);
        let clusters = dynamic_clusters(&d);
        let secrets = names(&d, "SecretsConfigDump", "dynamic_active_secrets", &["name"]);
        let missing = |want: &[String], have: &[String]| -> Vec<String> {
            want.iter().filter(|w| !have.contains(w)).cloned().collect()
        };
        let (ml, mc, ms) = (
            missing(&want_listeners, &listeners),
            missing(&want_clusters, &clusters),
            missing(&want_secrets, &secrets),
        );
        if ml.is_empty() && mc.is_empty() && ms.is_empty() {
            Ok(d)
        } else {
            Err(format!(
                "Envoy lacks listeners {ml:?}, clusters {mc:?}, secrets {ms:?}"
            ))
        }
    });
    let row = stack.replay.sync_row().expect("syncz");
    for (ty, t) in row["types"].as_object().expect("types") {
        let url = t["typeUrl"].as_str().unwrap_or_default();
        assert_eq!(
            nack_message(t),
            expect_nack(url),
            "{ty} after stripping: only the excerpt's own defects may be NACKed: {row}"
        );
    }
    let relayed: Vec<String> = stack
        .agent
        .output()
        .into_iter()
        .filter(|l| l.contains("Envoy rejected an xDS response"))
        .collect();
    assert_eq!(
        relayed.len(),
        case.stripped_nacks.len(),
        "the agent logs exactly the expected NACKs: {relayed:?}"
    );
    for l in &relayed {
        assert!(
            !l.contains("Didn't find a registered implementation")
                && !l.contains("Unable to create Wasm plugin"),
            "an Istio-only extension survived stripping: {l}"
        );
    }
    let statics = names(
        &envoy_dump,
        "ClustersConfigDump",
        "static_clusters",
        &["cluster", "name"],
    );
    for c in BOOTSTRAP_CLUSTERS {
        assert!(
            statics.iter().any(|s| s == c),
            "bootstrap cluster {c} missing: {statics:?}"
        );
    }
    if want_secrets.iter().any(|s| s == "default") {
        let want = format!("spiffe://cluster.local/ns/demo/sa/{SERVICE_ACCOUNT}");
        let (_, certs) = http_get(stack.admin, "/certs").expect("/certs");
        assert!(certs.contains(&want), "/certs lacks {want}: {certs}");
    }
    let removed = stack
        .replay
        .child
        .output()
        .iter()
        .filter(|l| l.contains("removed an Istio-only extension"))
        .count();
    assert_eq!(
        removed > 0,
        !case.nacked.is_empty(),
        "a removal is logged exactly for dumps with Istio-only extensions: {removed}"
    );
}

fn run(case: Case) {
    let Some(envoy) = envoy_bin() else {
        return;
    };
    let path = corpus().join(case.file);
    let recorded = parse_dump(&path);
    if !case.nacked.is_empty() {
        nack_is_reported(&envoy, &case);
    }
    stripped_is_accepted(&envoy, &case, &recorded);
}

/// `replay` refuses a dump without dynamic resources, naming the file and its sections.
fn refused(file: &str, sections: &str) {
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let dump = corpus().join(file);
    for strip in [false, true] {
        let out = replay_command(&dump, strip, ca_dir.path())
            .output()
            .expect("istiod-lite replay");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{file}: replay should refuse it: {err}"
        );
        assert!(
            err.contains(&dump.display().to_string())
                && err.contains("holds no dynamic listeners, clusters, routes or endpoints")
                && err.contains(&format!("(sections: {sections})")),
            "{file}: unclear error: {err}"
        );
    }
}

/// The waypoint and sidecar excerpts route `connect_terminate` to the `main_internal` cluster,
/// which they lack: upstream Envoy validates an inline route's clusters.
const NO_MAIN_INTERNAL: (&str, &str) = (
    LISTENER_URL,
    "Error adding/updating listener(s) connect_terminate: route: unknown cluster 'main_internal'",
);

#[test]
fn replay_sidecar_authz_yaml() {
    run(Case {
        file: "authz.yaml",
        nacked: &[LISTENER_URL],
        stripped_nacks: &[NO_MAIN_INTERNAL],
        rejected: &["connect_terminate"],
        secrets: &["default", "ROOTCA"],
    });
}

#[test]
fn replay_waypoint_proxyconfig() {
    run(Case {
        file: "proxyconfig.json",
        nacked: &[LISTENER_URL],
        stripped_nacks: &[],
        rejected: &[],
        secrets: &[],
    });
}

#[test]
fn replay_waypoint_compare() {
    run(Case {
        file: "compare.json",
        nacked: &[LISTENER_URL],
        stripped_nacks: &[NO_MAIN_INTERNAL],
        rejected: &["connect_terminate"],
        // Only the rejected connect_terminate names secrets.
        secrets: &[],
    });
}

#[test]
fn replay_waypoint_compare_diff() {
    // The "other side" of istioctl's diff test was edited by hand: its cluster is EDS without
    // an EDS config, which Envoy refuses whatever its build.
    run(Case {
        file: "compare-diff.json",
        nacked: &[LISTENER_URL],
        stripped_nacks: &[
            NO_MAIN_INTERNAL,
            (
                CLUSTER_URL,
                "Error adding/updating cluster(s) inbound-vip|9999|http|ratings.default.svc.cluster.local: cannot create an EDS cluster without an EDS config",
            ),
        ],
        rejected: &[
            "connect_terminate",
            "inbound-vip|9999|http|ratings.default.svc.cluster.local",
        ],
        secrets: &[],
    });
}

#[test]
fn replay_router_describe_http() {
    run(Case {
        file: "describe-http.json",
        nacked: &[CLUSTER_URL],
        stripped_nacks: &[],
        rejected: &[],
        secrets: &["default", "ROOTCA"],
    });
}

#[test]
fn replay_routes_and_endpoints_only() {
    // Routes or endpoints nothing in the dump refers to: served, never asked for, no NACK.
    for file in [
        "describe-tls.json",
        "writer-endpoints.json",
        "writer-routes-istio-gateway-http-route-prefix.json",
        "writer-routes-k8s-gateway-http-route-path-prefix.json",
    ] {
        run(Case {
            file,
            nacked: &[],
            stripped_nacks: &[],
            rejected: &[],
            secrets: &[],
        });
    }
}

#[test]
fn replay_refuses_dumps_without_dynamic_resources() {
    refused("writer-bootstrap.json", "BootstrapConfigDump");
    refused("writer-secrets-istio.json", "SecretsConfigDump");
    refused("writer-secrets-spire.json", "SecretsConfigDump");
    refused(
        "writer-ecds.json",
        "EcdsConfigDump, EcdsConfigDump, EcdsConfigDump",
    );
    refused("writer-routes-empty-gateway.json", "RoutesConfigDump");
}

/// Every dump in the folder is one of the cases above: a new dump needs its expectations.
#[test]
fn replay_covers_every_recorded_dump() {
    const COVERED: [&str; 14] = [
        "authz.yaml",
        "proxyconfig.json",
        "compare.json",
        "compare-diff.json",
        "describe-http.json",
        "describe-tls.json",
        "writer-endpoints.json",
        "writer-routes-istio-gateway-http-route-prefix.json",
        "writer-routes-k8s-gateway-http-route-path-prefix.json",
        "writer-bootstrap.json",
        "writer-secrets-istio.json",
        "writer-secrets-spire.json",
        "writer-ecds.json",
        "writer-routes-empty-gateway.json",
    ];
    let mut files: Vec<String> = std::fs::read_dir(corpus())
        .unwrap_or_else(|e| panic!("{}: {e}", corpus().display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f != "README.md")
        .collect();
    files.sort();
    let mut covered: Vec<String> = COVERED.iter().map(|s| s.to_string()).collect();
    covered.sort();
    assert_eq!(files, covered);
}
