//! The local Kubernetes cluster of `scripts/cluster.sh` (a real kubelet, containerd and
//! Istio's own istiod), driven as a user drives a cluster: `kubectl` and `istioctl` against its
//! API server, inside the cluster's network namespace.
//!
//! The test command brings the cluster up before the `cluster` tests and down after them; a
//! test finds it through its state directory (`MESH_CLUSTER_DIR`, default
//! `/var/tmp/mesh-cluster`). Outside CI a missing cluster skips; under `CI=true` it fails.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::prereq;

mod token;
pub use token::Review;

/// The two proxy images every scenario runs with: ours, and Istio's Go agent as the control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agent {
    Ours,
    Istio,
}

impl Agent {
    /// The image name under the chart's hub (`scripts/cluster/images.sh`).
    pub fn image_name(self) -> &'static str {
        match self {
            Agent::Ours => "proxyv2",
            Agent::Istio => "proxyv2-istio",
        }
    }

    /// A short word for namespace names and messages.
    pub fn word(self) -> &'static str {
        match self {
            Agent::Ours => "ours",
            Agent::Istio => "istio",
        }
    }
}

/// A running cluster: paths of its kubeconfig and tools.
pub struct Cluster {
    state: PathBuf,
    hub: String,
    tag: String,
}

impl Cluster {
    /// The cluster `scripts/cluster.sh up` started, or `None` (after skipping or, under CI,
    /// panicking) when none runs.
    pub fn get() -> Option<Cluster> {
        if !prereq::require_root() {
            return None;
        }
        let state = prereq::setting("MESH_CLUSTER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp/mesh-cluster"));
        if !state.join("kubeconfig").is_file() || !state.join("bin/kubectl").is_file() {
            prereq::missing(
                &format!(
                    "a running local cluster (no kubeconfig in {})",
                    state.display()
                ),
                "scripts/cluster.sh up (the test command starts it before these tests)",
            );
            return None;
        }
        let value = crate::pinned;
        Some(Cluster {
            hub: value("IMAGE_HUB"),
            tag: value("IMAGE_TAG"),
            state,
        })
    }

    /// The OCI archive `scripts/cluster/images.sh` wrote for image `name` (what `up` imported).
    pub fn image_archive(&self, name: &str) -> PathBuf {
        self.state.join("images").join(format!("{name}.tar"))
    }

    /// The full image reference of `name` (`proxyv2`, `app`, ...).
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}:{}", self.hub, self.tag)
    }

    fn tool(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.state.join("bin").join(name));
        cmd.env("KUBECONFIG", self.state.join("kubeconfig"));
        cmd
    }

    /// A kubectl command against the cluster, not yet run.
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = self.tool("kubectl");
        cmd.args(args);
        cmd
    }

    /// Runs kubectl; stdout on success, stderr (with the command) as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        run(
            self.tool("kubectl").args(args),
            &format!("kubectl {}", args.join(" ")),
        )
    }

    /// Runs istioctl the same way.
    pub fn istioctl(&self, args: &[&str]) -> Result<String, String> {
        run(
            self.tool("istioctl").args(args),
            &format!("istioctl {}", args.join(" ")),
        )
    }

    /// `kubectl apply -f -` of a YAML document.
    pub fn apply(&self, yaml: &str) -> Result<String, String> {
        self.with_stdin(&["apply", "-f", "-"], yaml)
    }

    /// `kubectl create -f - -o json` of a document (a review's answer, say).
    pub fn create(&self, doc: &str) -> Result<String, String> {
        self.with_stdin(&["create", "-f", "-", "-o", "json"], doc)
    }

    fn with_stdin(&self, args: &[&str], yaml: &str) -> Result<String, String> {
        use std::io::Write;
        let what = format!("kubectl {}", args.join(" "));
        let mut child = self
            .tool("kubectl")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("kubectl: {e}"))?;
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(yaml.as_bytes())
            .map_err(|e| format!("{what}: writing the manifest: {e}"))?;
        let out = child
            .wait_with_output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// `kubectl get -o json` parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<serde_json::Value, String> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl(&all)?;
        serde_json::from_str(&out).map_err(|e| format!("kubectl get {args:?}: not JSON: {e}"))
    }

    /// Runs a command in a pod's container.
    pub fn exec(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        cmd: &[&str],
    ) -> Result<String, String> {
        let mut args = vec!["exec", "-n", ns, pod, "-c", container, "--"];
        args.extend_from_slice(cmd);
        self.kubectl(&args)
    }

    /// The names of the pods in `ns` matching a label selector.
    pub fn pods(&self, ns: &str, selector: &str) -> Result<Vec<String>, String> {
        let list = self.get_json(&["pods", "-n", ns, "-l", selector])?;
        Ok(list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                    .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Waits until the Deployments in `ns` are available (bounded by `timeout`).
    pub fn wait_available(&self, ns: &str, timeout: Duration) -> Result<String, String> {
        self.kubectl(&[
            "wait",
            "-n",
            ns,
            "--for=condition=Available",
            "deployment",
            "--all",
            &format!("--timeout={}s", timeout.as_secs()),
        ])
    }

    /// Sets one value of istiod's injection values (the `istio-sidecar-injector` ConfigMap,
    /// which istiod watches), e.g. `["pilot", "cni", "enabled"]` to `true`.
    pub fn set_injector_value(
        &self,
        path: &[&str],
        value: serde_json::Value,
    ) -> Result<(), String> {
        let cm = self.get_json(&["configmap", "-n", "istio-system", "istio-sidecar-injector"])?;
        let text = cm["data"]["values"]
            .as_str()
            .ok_or("the injector has no values")?;
        let mut values: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("injector values: {e}"))?;
        let (last, parents) = path.split_last().ok_or("an empty path")?;
        let mut at = &mut values;
        for key in parents {
            at = &mut at[*key];
        }
        at[*last] = value;
        let patch = serde_json::json!({"data": {"values": values.to_string()}});
        self.kubectl(&[
            "patch",
            "configmap",
            "-n",
            "istio-system",
            "istio-sidecar-injector",
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ])
        .map(|_| ())
    }

    /// Deletes a namespace without waiting for it to go.
    pub fn delete_namespace(&self, ns: &str) {
        let _ = self.kubectl(&[
            "delete",
            "namespace",
            ns,
            "--wait=false",
            "--ignore-not-found",
        ]);
    }

    /// A pod's log (one container), for messages when a test fails.
    pub fn logs(&self, ns: &str, pod: &str, container: &str) -> String {
        self.kubectl(&["logs", "-n", ns, pod, "-c", container, "--tail=40"])
            .unwrap_or_else(|e| e)
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{what}: exit {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}
