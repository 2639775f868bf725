//! Istio's CNI plugin (its `cni` chart's node agent, installed by `scripts/cluster.sh`): with
//! istiod's injector in CNI mode, pods get no `istio-init`; Istio's plugin applies the capture
//! rules when containerd sets up the pod's network, and the injected `istio-validation` init
//! container runs our `istio-iptables --run-validation` against them. The emulated kubelet
//! cannot do this (it has no CNI chain), so only a real node checks it.

use std::time::Duration;

use harness::assert_eventually_result;
use harness::cluster::{Agent, Cluster};

use crate::scenario::{self, Scenario};

/// Puts the injector back in istio-init mode when the test ends, however it ends.
struct CniMode<'a>(&'a Cluster);

impl Drop for CniMode<'_> {
    fn drop(&mut self) {
        let _ = self
            .0
            .set_injector_value(&["pilot", "cni", "enabled"], serde_json::json!(false));
    }
}

/// Waits until istiod injects in CNI mode (a server-side dry run of a pod shows
/// `istio-validation`).
fn wait_cni_injection(c: &Cluster, ns: &str) -> Result<(), String> {
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: probe, namespace: {ns}}}\n\
         spec: {{containers: [{{name: app, image: {}}}]}}\n",
        c.image("app")
    );
    assert_eventually_result(Duration::from_secs(60), || {
        let mut cmd = c.kubectl_command(&["create", "--dry-run=server", "-o", "json", "-f", "-"]);
        use std::io::Write;
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(pod.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.contains("\"istio-validation\"")
            .then_some(())
            .ok_or(format!(
                "not in CNI mode yet: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
    })
}

fn validation_ran(c: &Cluster, s: &Scenario) -> Result<(), String> {
    let pods = c.get_json(&["pods", "-n", s.ns()])?;
    for pod in pods["items"].as_array().into_iter().flatten() {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        let inits: Vec<&str> = pod["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
            .collect();
        if inits.contains(&"istio-init") || !inits.contains(&"istio-validation") {
            return Err(format!(
                "{name}: init containers {inits:?}, want istio-validation and no istio-init"
            ));
        }
        let status = pod["status"]["initContainerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == "istio-validation")
            .ok_or(format!("{name}: no istio-validation status"))?;
        if status["state"]["terminated"]["exitCode"] != 0 {
            return Err(format!("{name}: istio-validation did not exit 0: {status}"));
        }
    }
    Ok(())
}

#[test]
fn istio_cni_mode() {
    let Some(c) = Cluster::get() else { return };
    c.set_injector_value(&["pilot", "cni", "enabled"], serde_json::json!(true))
        .expect("the injector switched to CNI mode");
    let _restore = CniMode(&c);
    for agent in [Agent::Ours, Agent::Istio] {
        let ns = format!("mesh-cni-{}", agent.word());
        c.apply(&format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}, labels: {{istio-injection: enabled}}}}\n"))
            .expect("namespace");
        wait_cni_injection(&c, &ns).expect("istiod injects in CNI mode");
        let s = Scenario::deploy_in(&c, agent, ns.clone());
        let result = validation_ran(&c, &s)
            .and_then(|()| scenario::certificate(&s))
            .and_then(|()| scenario::http(&s))
            .and_then(|()| scenario::tcp(&s));
        if let Err(e) = result {
            s.dump_logs();
            panic!("CNI mode with {agent:?}: {e}");
        }
        eprintln!("cluster [{}] CNI mode: passed", agent.word());
        c.delete_namespace(&ns);
    }
}
