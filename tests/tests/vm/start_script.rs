//! istio-start.sh (`docs/vm/istio-start.sh`) reads what Istio's script reads: run against a
//! stand-in `pilot-agent` that records its arguments and environment, from a root directory
//! laid out as the package and the VM guide lay out `/`.

use harness::{repo_root, workspace_bin};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// A VM root: `bin/pilot-agent` records each call in `bin/calls` (and the agent's environment
/// in `bin/env`); `var/lib/istio/envoy/` holds the package's sidecar.env.
struct Root {
    dir: tempfile::TempDir,
}

/// What one run of the script did.
struct Run {
    ok: bool,
    stderr: String,
    /// The stand-in's argument lists, in order (`istio-iptables …`, `proxy …`).
    calls: Vec<String>,
    /// The agent's environment, when it was started.
    env: BTreeMap<String, String>,
}

impl Root {
    fn new() -> Root {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let stub = bin.join("pilot-agent");
        std::fs::write(
            &stub,
            "#!/bin/sh\nd=$(dirname \"$0\")\necho \"$*\" >>\"$d/calls\"\n\
             if [ \"$1\" = proxy ]; then env -0 >\"$d/env\"; fi\n",
        )
        .expect("stub");
        Command::new("chmod")
            .arg("0755")
            .arg(&stub)
            .status()
            .expect("chmod");
        let envoy = dir.path().join("var/lib/istio/envoy");
        std::fs::create_dir_all(&envoy).expect("mkdir");
        std::fs::copy(
            repo_root().join("docs/vm/sidecar.env"),
            envoy.join("sidecar.env"),
        )
        .expect("sidecar.env");
        Root { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn cluster_env(&self, text: &str) {
        let p = self.path().join("var/lib/istio/envoy/cluster.env");
        std::fs::write(&p, text).expect("cluster.env");
    }

    /// Runs the script from the root (as the unit runs it from `/`) as root, with `env` only.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let bin = self.path().join("bin");
        let _ = std::fs::remove_file(bin.join("calls"));
        let _ = std::fs::remove_file(bin.join("env"));
        let out = Command::new("bash")
            .arg(repo_root().join("docs/vm/istio-start.sh"))
            .args(args)
            .current_dir(self.path())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("ISTIO_BIN_BASE", &bin)
            .envs(env.iter().copied())
            .output()
            .expect("run istio-start.sh");
        let calls = std::fs::read_to_string(bin.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        let env = std::fs::read(bin.join("env"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.to_string()))
            })
            .collect();
        Run {
            ok: out.status.success(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            calls,
            env,
        }
    }
}

const AS_ROOT: (&str, &str) = ("EXEC_USER", "root");

/// `istiod-lite vm-bundle`'s cluster.env (as istioctl's) drives the agent and the capture.
#[test]
fn the_bundles_cluster_env_reaches_the_agent_and_the_capture_comes_first() {
    let ca = tempfile::tempdir().expect("tempdir");
    let out = tempfile::tempdir().expect("tempdir");
    let status = Command::new(workspace_bin("istiod-lite"))
        .arg("vm-bundle")
        .arg("--ca-dir")
        .arg(ca.path())
        .args(["--namespace", "vm-ns", "--service-account", "vm-sa"])
        .args(["--name", "vm", "--token-duration", "10m"])
        .args(["--discovery-address", "198.18.32.1:15012"])
        .arg("--output")
        .arg(out.path())
        .status()
        .expect("istiod-lite vm-bundle");
    assert!(status.success());
    let root = Root::new();
    let text = std::fs::read_to_string(out.path().join("cluster.env")).expect("cluster.env");
    root.cluster_env(&format!("{text}ISTIO_SVC_IP='198.18.32.2'\n"));
    let r = root.run(&[], &[AS_ROOT]);
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(
        r.calls,
        vec!["istio-iptables --cleanup-only", "istio-iptables", "proxy"]
    );
    let e = &r.env;
    assert_eq!(
        e["POD_NAMESPACE"], "vm-ns",
        "ISTIO_NAMESPACE, as Istio's script"
    );
    assert_eq!(e["SERVICE_ACCOUNT"], "vm-sa");
    assert_eq!(e["INSTANCE_IP"], "198.18.32.2", "ISTIO_SVC_IP");
    assert_eq!(e["CA_ADDR"], "istiod.istio-system.svc:15012");
    assert_eq!(e["PROV_CERT"], "./etc/certs");
    assert_eq!(e["OUTPUT_CERTS"], "./etc/certs");
    assert_eq!(e["ISTIO_META_DNS_CAPTURE"], "true");
    assert_eq!(e["ISTIO_INBOUND_PORTS"], "*", "istio-iptables reads it too");
    let labels: serde_json::Value =
        serde_json::from_str(&e["ISTIO_METAJSON_LABELS"]).expect("labels are JSON");
    assert_eq!(labels["app"], "vm");
    assert!(
        e["PROXY_CONFIG"].contains("serviceCluster: vm.vm-ns")
            && e["PROXY_CONFIG"].contains("controlPlaneAuthPolicy: MUTUAL_TLS"),
        "{}",
        e["PROXY_CONFIG"]
    );
    assert!(!e.contains_key("KUBERNETES_SERVICE_HOST"));
    assert!(!e["POD_NAME"].is_empty(), "the host name");
}

#[test]
fn agent_flags_and_the_istiod_address_settings() {
    let root = Root::new();
    root.cluster_env("ISTIO_AGENT_FLAGS='router --proxyLogLevel debug'\nISTIO_PILOT_PORT=15013\n");
    let r = root.run(&["run"], &[AS_ROOT]);
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(
        r.calls,
        vec!["proxy router --proxyLogLevel debug"],
        "run: no capture"
    );
    assert_eq!(r.env["CA_ADDR"], "istiod.istio-system.svc:15013");
    assert!(
        r.env["PROXY_CONFIG"].contains("discoveryAddress: istiod.istio-system.svc:15013"),
        "{}",
        r.env["PROXY_CONFIG"]
    );
    // PILOT_ADDRESS wins over ISTIO_PILOT_PORT, CA_ADDR over both (for the CA alone).
    root.cluster_env(
        "ISTIO_PILOT_PORT=15013\nPILOT_ADDRESS=cp.example:443\nISTIO_SYSTEM_NAMESPACE=other\n",
    );
    let r = root.run(&["run"], &[AS_ROOT]);
    assert_eq!(r.env["CA_ADDR"], "cp.example:443");
    assert!(r.env["PROXY_CONFIG"].contains("discoveryAddress: cp.example:443"));
    root.cluster_env("ISTIO_PILOT_PORT=15013\nCA_ADDR=ca.example:15012\nISTIO_CP_AUTH=NONE\n");
    let r = root.run(&["run"], &[AS_ROOT]);
    assert_eq!(r.env["CA_ADDR"], "ca.example:15012");
    assert!(r.env["PROXY_CONFIG"].contains("controlPlaneAuthPolicy: NONE"));
    // A PROXY_CONFIG of the operator's replaces the default.
    let r = root.run(
        &["run"],
        &[AS_ROOT, ("PROXY_CONFIG", "{\"concurrency\":1}")],
    );
    assert!(r.env["PROXY_CONFIG"].starts_with("{\"concurrency\":1}"));
}

#[test]
fn custom_ip_tables_installs_and_removes_no_capture() {
    let root = Root::new();
    root.cluster_env("ISTIO_CUSTOM_IP_TABLES=true\n");
    let r = root.run(&[], &[AS_ROOT]);
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(r.calls, vec!["proxy"]);
    let r = root.run(&["clean"], &[]);
    assert!(r.ok && r.calls.is_empty(), "{:?} {}", r.calls, r.stderr);
    // Without it, `clean` removes the capture; `init` installs it alone.
    root.cluster_env("");
    assert_eq!(
        root.run(&["clean"], &[]).calls,
        vec!["istio-iptables --cleanup-only"]
    );
    assert_eq!(
        root.run(&["init", "-m", "TPROXY"], &[]).calls,
        vec![
            "istio-iptables -m TPROXY --cleanup-only",
            "istio-iptables -m TPROXY"
        ]
    );
}

#[test]
fn tproxy_runs_the_agent_as_root() {
    let root = Root::new();
    let no_user = Command::new("id")
        .arg("istio-proxy")
        .output()
        .is_ok_and(|o| !o.status.success());
    if no_user {
        // Not TPROXY: the agent runs as istio-proxy, which this host does not have.
        let r = root.run(&[], &[]);
        assert!(
            !r.ok && r.stderr.contains("EXEC_USER=istio-proxy"),
            "{}",
            r.stderr
        );
    }
    root.cluster_env("ISTIO_INBOUND_INTERCEPTION_MODE=TPROXY\n");
    let r = root.run(&[], &[]);
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(r.calls.last().map(String::as_str), Some("proxy"));
}

/// What bash reads, Istio's script reads, and so does ours; anything else is an error naming
/// the file, the line and the key, before any capture is installed; `clean` still cleans.
#[test]
fn a_malformed_cluster_env_names_file_line_and_key() {
    let root = Root::new();
    root.cluster_env(
        "# istioctl's quoting\nA='x y'\nB='it'\\''s'\nexport C=\"q\"\nD='multi\nline'\n",
    );
    let r = root.run(&["run"], &[AS_ROOT]);
    assert!(r.ok, "tolerated as Istio tolerates it: {}", r.stderr);
    assert_eq!(r.env["B"], "it's");
    assert_eq!(r.env["D"], "multi\nline");

    for (text, line, key) in [
        ("A=1\nSERVICE_ACCOUNT='vm-sa\nC=3\n", 2, "SERVICE_ACCOUNT"),
        ("A=1\nB=2\nISTIO-META=3\n", 3, "ISTIO-META"),
        ("A=1\nB=(\n", 2, "B"),
    ] {
        root.cluster_env(text);
        let r = root.run(&[], &[AS_ROOT]);
        // The script names the file as it reads it, from `/` (the unit's working directory).
        let want = format!("./var/lib/istio/envoy/cluster.env line {line} ({key})");
        assert!(!r.ok && r.stderr.contains(&want), "{text:?}: {}", r.stderr);
        assert!(r.calls.is_empty(), "{text:?}: ran {:?}", r.calls);
        assert_eq!(
            root.run(&["clean"], &[]).calls,
            vec!["istio-iptables --cleanup-only"],
            "clean despite {text:?}"
        );
    }
}
